"""Exact optimum of small instances: depth-first branch and bound over a :class:`SearchSpace`.

FlexFlow (sec. 8.3) found the global optima of LeNet and a 2-step RNNLM on 4 devices with a
depth-first search pruned by A*, to check that MCMC reaches them. This is the same idea over the
same configuration sets MCMC samples from:

* ops are decided in topological order; at each level the configurations are tried cheapest first
  (by their summed task time), so good incumbents come early;
* a partial plan is pruned when a lower bound of every completion is at least the incumbent's
  makespan. The bound holds for any schedule the simulator can produce: a device runs its tasks
  one at a time, so the makespan is at least (a) the busiest device's compute time of the decided
  ops, and (b) the total compute time of the decided ops plus the least each undecided op can add,
  spread over all devices;
* leaves are simulated in full; plans that do not fit are costed like MCMC does.

The incumbent starts from the given plan (e.g. MCMC's result) or data parallelism.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.search.space import SearchSpace
from placement_rl.sim.cost import CostModel
from placement_rl.sim.delta import oom_cost
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import DeviceTopology


@dataclass(frozen=True)
class ExhaustiveResult:
    """The optimum (when ``complete``) and the search statistics."""

    plan: Plan
    result: SimResult
    cost_s: float
    complete: bool
    leaves: int
    nodes: int
    pruned: int
    elapsed_s: float
    space_size: float


def exhaustive(
    graph: OpGraph,
    topology: DeviceTopology,
    space: SearchSpace | None = None,
    *,
    incumbent: Plan | None = None,
    cost_model: CostModel | None = None,
    oom_penalty: float = 10.0,
    time_limit_s: float | None = None,
) -> ExhaustiveResult:
    """The plan of least cost in ``space`` (see the module docstring).

    Args:
        graph: the op graph (small: the space grows as the product of the per-op set sizes).
        topology: the cluster.
        space: configuration sets (default: all SOAP configurations on every device).
        incumbent: a starting best plan; need not lie in ``space``.
        cost_model: the simulator's cost model.
        oom_penalty: cost multiplier of plans that do not fit (as in MCMC).
        time_limit_s: stop early (``complete=False``) after this long.

    Returns:
        The best plan found; ``complete`` says whether the whole space was covered.
    """
    space = space or SearchSpace(graph, topology)
    ctx = SimContext(graph, topology, cost_model)
    n = graph.num_ops
    D = space.num_devices
    options = []
    for i in range(n):
        configs = [(cfg, ctx.compile_uncached(i, cfg)) for cfg in space.configs(i)]
        configs.sort(key=lambda c: float(c[1].forward_s.sum() + c[1].backward_s.sum()))
        options.append(configs)
    work = [[float(c.forward_s.sum() + c.backward_s.sum()) for _, c in opts] for opts in options]
    # least work the ops after position k can still add
    rest = np.concatenate((np.cumsum([min(w) for w in work][::-1])[::-1], [0.0]))

    start_plan = incumbent or data_parallel(graph, topology, space.devices)
    start_result = ctx.simulate(start_plan)
    best_cost = oom_cost(
        start_result.makespan_s, start_result.peak_memory_bytes, start_result.memory_capacity_bytes, oom_penalty
    )
    best_cfgs = [start_plan[op.name] for op in graph.ops]
    capacity = ctx._capacity.astype(np.int64)
    stats = {"leaves": 0, "nodes": 0, "pruned": 0}
    began = time.perf_counter()
    chosen: list[OpConfig] = [None] * n  # type: ignore[list-item]
    compiled: list = [None] * n
    busy = np.zeros(topology.num_devices)  # compute seconds of the decided ops, per device
    timed_out = False

    def visit(k: int, total: float) -> None:
        nonlocal best_cost, best_cfgs, timed_out
        if timed_out:
            return
        if time_limit_s is not None and time.perf_counter() - began > time_limit_s:
            timed_out = True
            return
        stats["nodes"] += 1
        if k == n:
            stats["leaves"] += 1
            result = ctx.run(compiled)
            cost = oom_cost(result.makespan_s, result.peak_memory_bytes.astype(np.int64), capacity, oom_penalty)
            if cost < best_cost:
                best_cost, best_cfgs = cost, list(chosen)
            return
        for (cfg, comp), w in zip(options[k], work[k], strict=True):
            per_task = comp.forward_s + comp.backward_s
            np.add.at(busy, comp.devices, per_task)
            bound = max(float(busy.max()), (total + w + rest[k + 1]) / D)
            if bound < best_cost:
                chosen[k], compiled[k] = cfg, comp
                visit(k + 1, total + w)
            else:
                stats["pruned"] += 1
            np.subtract.at(busy, comp.devices, per_task)

    visit(0, 0.0)
    plan = Plan(graph.name, {op.name: c for op, c in zip(graph.ops, best_cfgs, strict=True)}, name="exhaustive")
    result = ctx.simulate(plan)
    return ExhaustiveResult(
        plan=plan,
        result=result,
        cost_s=best_cost,
        complete=not timed_out,
        leaves=stats["leaves"],
        nodes=stats["nodes"],
        pruned=stats["pruned"],
        elapsed_s=time.perf_counter() - began,
        space_size=math.prod(len(o) for o in options),
    )
