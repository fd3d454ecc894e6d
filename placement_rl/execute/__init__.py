"""Run plans for real and measure them against the simulator.

* :mod:`.lower`: a plan -> per-device instruction lists, with the simulator's own compilation
  (:func:`lower`, :class:`Program`); plain data, no torch.
* :mod:`.runtime`: one worker: the model built from its string, its ops run as fx nodes on their
  partitions, point-to-point and collective communication with ``torch.distributed``.
* :mod:`.local`: the workers as local processes (:func:`run_local`); the Ray Train launcher is
  :mod:`placement_rl.rl.execute`.
* :mod:`.report`: measured traces and the replay with measured compute times.

:func:`execute` is the library call behind ``placement-rl execute``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.execute.local import (
    MAX_ITERATIONS,
    MAX_LOCAL_WORKERS,
    MAX_WARMUP,
    ExecutionError,
    RunOptions,
    available_backends,
    check_backend,
    check_local_workers,
    run_local,
)
from placement_rl.execute.lower import NotExecutableError, Program, lower
from placement_rl.execute.report import iteration_times_s, measured_compute_s, measured_result, replay
from placement_rl.execute.runtime import ModelSource, WorkerResult, reference_step
from placement_rl.graph import OpGraph
from placement_rl.plan.core import Plan
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import SimResult
from placement_rl.topology import DeviceTopology

#: Runs a program's workers and returns their results by rank: :func:`run_local`, or Ray Train's.
Launcher = Callable[[Program, OpGraph, ModelSource, RunOptions], list[WorkerResult]]


@dataclass
class ExecutionReport:
    """An executed plan: what was measured and what the simulator says.

    Attributes:
        program: the lowered plan (its ``simulated`` result is the cost model's prediction).
        results: every worker's measurements, by rank.
        options: how it ran.
        iteration_s: per measured iteration (warm-up excluded), the slowest worker's time.
        replayed: the plan simulated with the measured compute times.
    """

    graph: OpGraph
    plan: Plan
    program: Program
    results: list[WorkerResult]
    options: RunOptions
    iteration_s: list[float]
    replayed: SimResult

    @property
    def measured_s(self) -> float:
        """Median iteration time over the measured iterations."""
        return float(np.median(self.iteration_s))

    @property
    def simulated_s(self) -> float:
        return self.program.simulated.makespan_s

    @property
    def replayed_s(self) -> float:
        return self.replayed.makespan_s

    @property
    def loss(self) -> float:
        """The training loss of the first iteration (summed over the workers' loss partitions)."""
        return float(sum(r.iterations[0].loss for r in self.results))

    def sent_bytes(self) -> list[int]:
        """Bytes each worker sent in the first iteration."""
        return [r.iterations[0].sent_bytes for r in self.results]

    def measured(self) -> SimResult:
        """The last iteration as a result with the simulated lanes (for :func:`write_chrome_trace`)."""
        return measured_result(self.program, self.results)

    def to_dict(self) -> dict[str, Any]:
        fwd, bwd = measured_compute_s(self.program, self.results, self.options.warmup)
        return {
            "model": self.graph.name,
            "plan": self.plan.name,
            "devices": list(self.program.devices),
            "backend": self.options.backend,
            "iterations": self.options.iterations,
            "warmup": self.options.warmup,
            "measured_ms": self.measured_s * 1e3,
            "iteration_ms": [t * 1e3 for t in self.iteration_s],
            "simulated_ms": self.simulated_s * 1e3,
            "replayed_ms": self.replayed_s * 1e3,
            "error": (self.simulated_s - self.measured_s) / self.measured_s if self.measured_s > 0 else None,
            "loss": self.loss,
            "sent_bytes": self.sent_bytes(),
            "simulated_sent_bytes": self.program.sent_bytes().tolist(),
            "measured_compute_ms": float((fwd.sum() + bwd.sum()) * 1e3),
            "simulated_compute_ms": float(
                sum((self.program.simulated.tasks.end_s - self.program.simulated.tasks.start_s)[: 2 * len(fwd)]) * 1e3
            ),
        }


def execute(
    source: ModelSource,
    topology: DeviceTopology,
    plan: Plan,
    *,
    graph: OpGraph | None = None,
    options: RunOptions | None = None,
    cost_model: CostModel | None = None,
    launcher: Launcher | None = None,
) -> ExecutionReport:
    """Run ``plan`` for real: lower it, run its workers, and compare with the simulator.

    Everything that can be checked is checked before a worker starts (the backend against this
    machine's torch, the plan against the graph and topology, executable configurations, the number
    of local workers, and the simulated peak memory of every device against the topology's:
    :func:`check_memory`).

    Args:
        source: the model (zoo name or ``package.module:factory``), traced with fx.
        topology: the devices the plan names (their costs set the simulated prediction).
        plan: a plan for ``source``'s graph.
        graph: the traced graph when the caller has it (default: traced here).
        options: iterations, warm-up, backend, seed, learning rate, threads.
        cost_model: the simulator's cost model (fp32; a profile table for measured op costs).
        launcher: runs the workers (default :func:`run_local`).

    Raises:
        ValueError, NotExecutableError: a backend this machine's torch lacks (:func:`check_backend`; for
            the local launcher also NCCL without a GPU), a bad plan, one that does not fit in memory, or more than
            :data:`~placement_rl.execute.local.MAX_LOCAL_WORKERS` devices for the local launcher, before any
            worker starts.
        ExecutionError: a worker failed or died.
    """
    options = options or RunOptions()
    check_backend(options.backend, local=launcher is None)
    graph = graph or source.graph()
    if launcher is None:
        check_local_workers(len(plan.devices_used()))  # before lowering a plan on thousands of devices
    program = lower(graph, topology, plan, cost_model)
    check_memory(program, topology)
    results = (launcher or run_local)(program, graph, source, options)
    return report_results(graph, topology, plan, program, results, options, cost_model)


def check_memory(program: Program, topology: DeviceTopology) -> None:
    """Refuse a plan whose simulated peak memory exceeds a device's memory in ``topology``.

    The simulator's memory model (parameters, gradients, optimizer state, the activations live at the
    peak: :attr:`SimResult.peak_memory_bytes`) against :attr:`Device.memory_bytes`. Workers on CPUs
    emulate the topology's devices: the capacity checked is the simulated device's, not this machine's.

    Raises:
        ValueError: naming every device that does not fit, its simulated peak and its capacity.
    """
    simulated = program.simulated
    if not simulated.oom:
        return
    peaks = dict(zip(simulated.device_names, simulated.peak_memory_bytes.tolist(), strict=True))
    over = [
        f"{name!r} ({topology.device(name).device_type}) peaks at {_gib(peaks[name])} of its "
        f"{_gib(topology.device(name).memory_bytes)}"
        for name in simulated.oom_devices
    ]
    raise ValueError(
        f"plan {program.plan_name!r} does not fit in memory (simulated, before any worker starts): "
        + "; ".join(over)
        + "; CPU workers emulate the topology's devices, so their capacity is what is checked, not this "
        "machine's; expected a plan that fits (a smaller --batch-size, or more devices)"
    )


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:,.3g} GiB ({int(num_bytes):,} bytes)"


def report_results(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    program: Program,
    results: list[WorkerResult],
    options: RunOptions,
    cost_model: CostModel | None = None,
) -> ExecutionReport:
    """The report of ``program``'s workers' ``results`` (what :func:`execute` returns once they ran;
    for callers that run several programs at once, :func:`placement_rl.execute.local.run_local_jobs`)."""
    times = iteration_times_s(results)[options.warmup :]
    fwd, bwd = measured_compute_s(program, results, options.warmup)
    replayed = replay(graph, topology, plan, fwd, bwd, cost_model)
    return ExecutionReport(graph, plan, program, results, options, times, replayed)


__all__ = [
    "MAX_ITERATIONS",
    "MAX_LOCAL_WORKERS",
    "MAX_WARMUP",
    "ExecutionError",
    "ExecutionReport",
    "Launcher",
    "ModelSource",
    "NotExecutableError",
    "Program",
    "RunOptions",
    "WorkerResult",
    "available_backends",
    "check_backend",
    "check_memory",
    "execute",
    "lower",
    "measured_result",
    "reference_step",
    "replay",
    "report_results",
    "run_local",
]
