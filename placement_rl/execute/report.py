"""What an executed plan measured, next to what the simulator predicted.

* :func:`measured_result`: one measured iteration as a :class:`~placement_rl.sim.result.SimResult`
  whose task table has the simulated task graph's tasks, kinds and lanes with measured start and
  end times, so :func:`placement_rl.sim.trace.write_chrome_trace` writes a measured trace with the
  simulated trace's lanes (open both in Perfetto side by side).
* :func:`measured_compute_s`: each compute task's median measured duration.
* :func:`replay`: the plan simulated again with the measured compute times in place of the cost
  model's, so what still differs from the measurement is the network and overlap model's alone.

How measured times are taken (:mod:`placement_rl.execute.runtime`): each worker's clock starts after
a barrier at the start of the iteration; on the CPU it is the host's wall clock, on CUDA the GPU's
(CUDA events on the worker's stream), so compute spans are the GPU's work, not the kernel launches. A
compute task spans its op's forward or backward call (not the assembly of its inputs).
Communication is non-blocking: a transfer starts when the sender posts it and ends when the
receiver's wait for it returns; an all-reduce starts at the first member's post and ends at the last
member's wait (a ZeRO bucket's at the last wait for its all-gather); a push or pull ends when its
receiver waits for it. Waits happen where the data is
needed, so these ends are upper bounds of when the bytes arrived.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import numpy as np

from placement_rl.execute.lower import Program, task_graph
from placement_rl.execute.runtime import Event, WorkerResult
from placement_rl.graph import OpGraph
from placement_rl.plan.core import Plan
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import LinkRates, SimResult, TaskTable
from placement_rl.topology import DeviceTopology


def iteration_times_s(results: Sequence[WorkerResult]) -> list[float]:
    """Per iteration, the slowest worker's time (every worker starts the iteration after a barrier)."""
    count = min(len(r.iterations) for r in results)
    return [max(r.iterations[i].time_s for r in results) for i in range(count)]


def measured_compute_s(program: Program, results: Sequence[WorkerResult], skip: int = 0) -> tuple[np.ndarray, ...]:
    """``(forward_s, backward_s)``: ``(F,)`` each, the median measured duration of every forward and
    backward task over the iterations after the first ``skip``."""
    F = len(program.task_order)
    samples: list[list[list[float]]] = [[[] for _ in range(F)], [[] for _ in range(F)]]
    for r in results:
        for it in r.iterations[skip:]:
            for ev in it.events:
                if ev.kind == "compute_forward":
                    samples[0][ev.ref].append(ev.end_s - ev.start_s)
                elif ev.kind == "compute_backward":
                    samples[1][ev.ref].append(ev.end_s - ev.start_s)
    return tuple(np.array([statistics.median(s) if s else 0.0 for s in side]) for side in samples)


def measured_result(program: Program, results: Sequence[WorkerResult], iteration: int = -1) -> SimResult:
    """Iteration ``iteration`` (default the last) as a :class:`SimResult` with the simulated task
    table's tasks and lanes and measured times (module docstring)."""
    sim = program.simulated
    table = sim.tasks
    T = len(table)
    F = len(program.task_order)
    C = len(program.comms)
    start = np.full(T, np.nan)
    end = np.full(T, np.nan)
    events: list[tuple[int, Event]] = [(r.rank, ev) for r in results for ev in r.iterations[iteration].events]

    def widen(task: int, begin: float, finish: float) -> None:
        start[task] = begin if np.isnan(start[task]) else min(start[task], begin)
        end[task] = finish if np.isnan(end[task]) else max(end[task], finish)

    bucket_task = {b.bucket: -1 for b in program.buckets}
    ps_task: dict[int, int] = {}
    for rank_list in program.instructions:
        for ins in rank_list:
            if ins.kind == "all_reduce":
                bucket_task[ins.ref] = ins.sim_task
            elif ins.kind in ("push", "pull"):
                ps_task[ins.ref] = ins.sim_task
    for _, ev in events:
        kind = ev.kind
        if kind == "compute_forward":
            widen(ev.ref, ev.start_s, ev.end_s)
        elif kind == "compute_backward":
            widen(F + ev.ref, ev.start_s, ev.end_s)
        elif kind in ("send", "send_done", "recv_done"):
            widen(2 * F + ev.ref, ev.start_s, ev.end_s if kind != "send" else ev.start_s)
        elif kind in ("grad_send", "grad_send_done", "grad_recv_done"):
            widen(2 * F + C + ev.ref, ev.start_s, ev.end_s if kind != "grad_send" else ev.start_s)
        elif kind in ("all_reduce_done", "reduce_scatter_done", "all_gather_done"):
            widen(bucket_task[ev.ref], ev.start_s, ev.end_s)
        elif kind in ("push", "push_done", "pull", "pull_done"):
            widen(ps_task[ev.ref], ev.start_s, ev.end_s if kind.endswith("_done") else ev.start_s)
    missing = np.isnan(start)
    start[missing] = 0.0
    end[missing] = 0.0
    measured_table = TaskTable(
        table.kind, table.op, table.lane, start, end, table.num_bytes, table.lanes, table.micro_batch
    )
    makespan = max(r.iterations[iteration].time_s for r in results)
    return dataclasses.replace(
        sim,
        makespan_s=float(makespan),
        tasks=measured_table,
        critical_tasks=np.zeros(0, np.int64),
        link_direction_rates=LinkRates(),
        comm_time_s=float((end - start)[2 * F :].sum()),
    )


def replay(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    cost_model: CostModel | None = None,
) -> SimResult:
    """Simulate ``plan`` with each compute task's duration replaced by the measured one.

    Args:
        forward_s, backward_s: ``(F,)`` seconds per forward and backward task, in the simulator's
            task order (:attr:`Program.task_order`; under micro-batches, the micro-batch graph's).
    """
    built = task_graph(graph, topology, plan, cost_model)
    tasks = built.tasks
    F = tasks.F
    if forward_s.shape != (F,) or backward_s.shape != (F,):
        raise ValueError(
            f"replay: expected ({F},) forward and backward times, got {forward_s.shape}, {backward_s.shape}"
        )
    tasks.duration = tasks.duration.copy()
    tasks.duration[:F] = forward_s
    tasks.duration[F : 2 * F] = backward_s
    start, end, _, crit, busy, *timeline = built.ctx.schedule(tasks, record=True)
    return built.result(start, end, crit, busy, timeline)
