"""TensorOpt's Frontier-Tracking (FT): the cost frontier of per-device memory vs per-iteration time.

``frontier(graph, topology)`` returns every Pareto-optimal strategy of TensorOpt's search space
(seed 000, sec. 2-4): each op gets a device mesh over the devices in use and a tensor map
(:func:`placement_rl.search.ft.configs.op_configs`), each re-scheduled tensor a reuse option, and
the costs are TensorOpt's additive estimates (:mod:`placement_rl.search.ft.costs`, with the layout
changes priced in :mod:`placement_rl.search.ft.rescheduling`). The frontier algorithm
(eliminations, Linear DP, unrolling) is :mod:`placement_rl.search.ft.frontier`.

Every point carries a shared :class:`~placement_rl.plan.Plan`, so it can be re-evaluated by the
simulator (``simulate(graph, topology, point.plan)``); FT's own numbers are its additive estimate.

Beyond TensorOpt (opt-in, :func:`run_ft`'s ``zero`` and ``recompute``): a ZeRO stage for every
configuration that replicates parameters (stages 1-2 lower memory at no time, so a setting suffices),
and a recomputed twin of every configuration (memory lower, time higher; twice the configurations
per op). Micro-batches and pipeline schedules are not in FT's space: its costs are sums over ops,
and a pipeline's time (the bubble, the overlap of stages) is not a sum of per-op terms.

Modes (sec. 4.1):

* :func:`mini_time`: the fastest point whose memory fits the device memory (or a given limit);
* :func:`mini_parallelism`: the fewest devices whose frontier has a point that fits;
* :func:`profiling`: the best time that fits for each device count of a range.

:func:`simulated_best` re-evaluates the frontier with the simulator and keeps its fastest plan that
fits; :func:`best_over_device_counts` does so over the frontiers of several device sets, and
:func:`pick_over_device_counts` also says when no plan fits on any set, giving the plan whose
worst device is least over its memory instead (the ``ft`` method uses it: there every method is
judged by the simulator).

**Device sets** (:mod:`.devices`). A device count ``n`` means the ``n`` fastest devices, ranked by
peak FLOP/s and then by machine and name, never by the order the topology lists them in.
:func:`pick_over_device_counts` runs FT on each of :func:`~.devices.candidate_device_sets`: the
``n`` fastest devices for each count, the best whole machines and the devices of each type where
no faster set of as many devices exists (at most :data:`~.devices.MAX_DEVICE_SETS` sets), so its
answer is the same however the cluster is listed. One FT run takes at most
:data:`~.devices.FT_MAX_DEVICES` (512) devices: its cost graph grows as the square of the device
count, so :func:`run_ft` refuses more, and the default counts stop there (on a 3,072-GPU cluster FT
searches the fastest 1, 2, 4, ..., 512 devices).

**A mesh per stage** (opt-in, :func:`run_ft`'s ``stage_meshes``; the ``ft`` method's option of the
same name). TensorOpt runs every op on one mesh over the whole set. With ``stage_meshes = m`` every
op may also run on the devices of one of the set's ``m`` best machines, so that, for example, the
convolutions run data parallel on every GPU and the large fully-connected layers on one machine.
Time stays FT's additive sum; memory becomes an upper bound (:mod:`.costs`, "A mesh per stage").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.search.ft.configs import resolve_devices
from placement_rl.search.ft.costs import CostGraph, build_cost_graph
from placement_rl.search.ft.devices import (
    FT_MAX_DEVICES,
    MAX_DEVICE_SETS,
    DeviceSet,
    candidate_device_sets,
    check_device_count,
    default_device_counts,
    machine_meshes,
)
from placement_rl.search.ft.frontier import Elimination, MapChunks, frontier_of
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import DeviceTopology

REUSE_OPTIONS: tuple[str, ...] = ("keep_both", "keep_before", "keep_after")

#: default relative time resolution of the frontier (0 = exact; see ``frontier_of``).
DEFAULT_TOLERANCE = 0.01


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal strategy.

    Attributes:
        memory_bytes: FT's estimate of the peak memory per device.
        time_s: FT's estimate of the per-iteration time.
        plan: the strategy as a shared plan (one configuration per op).
        reuse: ``"src->dst"`` -> reuse option (``keep_both``, ``keep_before``, ``keep_after``) for
            every op pair whose tensor is re-scheduled.
        num_devices: the devices in use.
    """

    memory_bytes: float
    time_s: float
    plan: Plan
    reuse: dict[str, str]
    num_devices: int


@dataclass(frozen=True)
class FTResult:
    """A frontier with how it was found.

    Attributes:
        points: the frontier, sorted by memory (ascending; time descending).
        stats: the eliminations performed (``stats.exact``: no heuristic elimination).
        search_s: wall-clock seconds of the FT run (building costs included).
        cost_graph_s: of which building the configurations and cost tables.
        configs_per_op: (n,) configurations per op.
        method: ``ldp`` or ``elimination``.
    """

    points: list[FrontierPoint]
    stats: Elimination
    search_s: float
    cost_graph_s: float
    configs_per_op: np.ndarray
    method: str

    def fastest_within(self, memory_limit_bytes: float) -> FrontierPoint | None:
        """The fastest point whose memory is at most ``memory_limit_bytes`` (None if none fits)."""
        fits = [p for p in self.points if p.memory_bytes <= memory_limit_bytes]
        return fits[-1] if fits else None


def run_ft(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    *,
    method: str = "ldp",
    cost_model: CostModel | None = None,
    max_configs: int | None = None,
    map_chunks: MapChunks | None = None,
    progress: Callable[[int, int], None] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    rescheduling: str = "collectives",
    zero: int = 0,
    recompute: bool = False,
    stage_meshes: int = 0,
    max_devices: int = FT_MAX_DEVICES,
) -> FTResult:
    """Run FT and unroll every frontier point into a plan.

    Args:
        graph: the op graph.
        topology: the cluster.
        devices: the devices in use: names (in mesh order), a count (the ``n`` fastest devices, in
            mesh order, whatever order the topology lists them in: :mod:`.devices`) or None (all, in
            mesh order).
        method: ``ldp`` (FT-LDP) or ``elimination`` (FT-Elimination).
        cost_model: the shared cost model (default :class:`CostModel`).
        max_configs: cap on configurations per op (see :func:`~placement_rl.search.ft.configs.op_configs`).
        map_chunks: a :class:`placement_rl.parallel.TaskMap` for independent chunks of work (serial by
            default; :class:`placement_rl.rl.parallel.RayMap` runs them as Ray tasks).
        progress: called with (steps done, total): first with the tensors whose layout changes are priced
            (building the cost graph), then as the eliminations proceed (ops).
        tolerance: relative time resolution of every frontier reduce. 0 gives the exact frontier
            (TensorOpt's algorithm as published). The default 0.01 keeps a point only when it is at
            least 1% faster than a point with less memory. Without it, graphs with many parallel
            paths (unrolled RNNs) grow thousands of points per configuration pair.
        rescheduling: ``collectives`` (TensorOpt) or ``point_to_point`` (the simulator's data
            movement), see :func:`~placement_rl.search.ft.costs.build_cost_graph`.
        zero: ZeRO stage (0-3) of every configuration that replicates parameters (0: TensorOpt's
            space); stages 1 and 2 lower memory at no time, so they are a setting, not a choice.
        recompute: also offer every configuration with activation recomputation (memory lower,
            time higher; twice the configurations per op, about four times FT's work).
        stage_meshes: a mesh per stage: also offer every op the configurations over the devices
            of each of the best ``stage_meshes`` machines of the set (:func:`~.devices.machine_meshes`;
            none when the set is one machine), so that layers can run on different machines. 0:
            TensorOpt's space (one mesh over the whole set). ``m`` meshes multiply the configurations
            per op by up to ``1 + m`` and FT's work by about its square.
        max_devices: the most devices FT takes (default :data:`~.devices.FT_MAX_DEVICES`; its cost graph
            grows as the square of the device count).

    Raises:
        ValueError: for more than ``max_devices`` devices (before any work), and as
            :func:`~placement_rl.search.ft.costs.build_cost_graph` and ``frontier_of`` do.
    """
    start = time.perf_counter()
    names = resolve_devices(topology, devices, cost_model)
    check_device_count(len(names), topology, max_devices)
    costs, configs = build_cost_graph(
        graph,
        topology,
        names,
        cost_model=cost_model,
        max_configs=max_configs,
        rescheduling=rescheduling,
        zero=zero,
        recompute=recompute,
        stage_meshes=machine_meshes(topology, names, stage_meshes, cost_model) if stage_meshes else (),
        progress=progress,
    )
    built = time.perf_counter()
    result = frontier_of(
        costs.num_configs,
        costs.node_memory_bytes,
        costs.node_time_s,
        costs.edges,
        costs.edge_memory_bytes,
        costs.edge_time_s,
        method=method,
        map_chunks=map_chunks,
        progress=progress,
        tolerance=tolerance,
    )
    n_devices = len(names)
    points = []
    for p in range(len(result.memory_bytes)):
        chosen, options = result.unroll(p)
        points.append(
            FrontierPoint(
                float(result.memory_bytes[p]),
                float(result.time_s[p]),
                _plan(graph, configs, chosen, method, p),
                _reuse(graph, costs, chosen, options),
                n_devices,
            )
        )
    return FTResult(
        points, result.stats, time.perf_counter() - start, built - start, np.asarray(costs.num_configs), method
    )


def frontier(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    **kwargs: object,
) -> list[FrontierPoint]:
    """The cost frontier: Pareto-optimal (memory per device, time per iteration) points, sorted by memory.

    Keyword arguments as in :func:`run_ft`.
    """
    return run_ft(graph, topology, devices, **kwargs).points  # type: ignore[arg-type]


def _plan(graph: OpGraph, configs: list[list[OpConfig]], chosen: np.ndarray, method: str, point: int) -> Plan:
    return Plan(
        graph.name,
        {op.name: configs[i][int(chosen[i])] for i, op in enumerate(graph.ops)},
        name="ft",
        metadata={"method": f"FT-{method.upper() if method == 'ldp' else 'Elimination'}", "frontier_point": point},
    )


def _reuse(graph: OpGraph, costs: CostGraph, chosen: np.ndarray, options: np.ndarray) -> dict[str, str]:
    """Reuse option per tensor that the chosen configurations re-schedule (a tensor whose two ends
    agree has one copy and no choice: only option 0 is finite for that pair)."""
    out = {}
    for e, (u, v) in enumerate(costs.edges):
        if np.isfinite(costs.edge_time_s[e][chosen[u], chosen[v], 1:]).any():
            out[f"{graph.ops[u].name}->{graph.ops[v].name}"] = REUSE_OPTIONS[int(options[e])]
    return out


# ------------------------------------------------------------------------------------------ modes
def device_memory_bytes(
    topology: DeviceTopology, devices: Sequence[str] | int | None = None, cost_model: CostModel | None = None
) -> float:
    """The smallest device memory among the devices in use (a count ``n``: the ``n`` fastest, ranked
    with ``cost_model``'s compute dtype)."""
    used = resolve_devices(topology, devices, cost_model)
    return float(min(topology.device(d).memory_bytes for d in used))


def mini_time(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    memory_limit_bytes: float | None = None,
    **kwargs: object,
) -> tuple[FrontierPoint | None, FTResult]:
    """Mini-time mode: the fastest frontier point within the memory limit (default: device memory).

    Returns (the point, or None when no strategy fits; the whole FT result).
    """
    result = run_ft(graph, topology, devices, **kwargs)  # type: ignore[arg-type]
    cost_model = kwargs.get("cost_model")
    limit = (
        device_memory_bytes(topology, devices, cost_model)  # type: ignore[arg-type]
        if memory_limit_bytes is None
        else memory_limit_bytes
    )
    return result.fastest_within(limit), result


def simulated_best(
    result: FTResult, graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None = None
) -> tuple[FrontierPoint, SimResult] | None:
    """The frontier point the simulator finds fastest among those it says fit in memory.

    FT ranks plans by its additive estimate. The simulator overlaps computation with communication
    and moves re-scheduled tensors point to point, so the two can disagree on which plan is faster.
    This re-evaluates every frontier point and keeps the simulator's choice (None if none fits).
    """
    ctx = SimContext(graph, topology, cost_model)
    best: tuple[FrontierPoint, SimResult] | None = None
    for point in result.points:
        sim = ctx.simulate(point.plan)
        if not sim.oom and (best is None or sim.makespan_s < best[1].makespan_s):
            best = (point, sim)
    return best


@dataclass(frozen=True)
class FTPick:
    """FT's answer judged by the simulator, over the frontiers of several device sets.

    Attributes:
        num_devices: the device count of the chosen point's frontier.
        point: the chosen frontier point.
        result: its simulation.
        fits: whether it fits in memory. When no point of any frontier fits, the point is the one whose
            worst device is least over its memory (then the fastest), not a plan that can run.
        device_counts: the device counts asked for (the sets' rule 1, :mod:`.devices`).
        points: the frontier points simulated, all sets together.
        devices: the chosen point's device set, in mesh order.
        device_set: its label (:attr:`~.devices.DeviceSet.label`).
        device_sets: the labels of every set searched, in search order.
    """

    num_devices: int
    point: FrontierPoint
    result: SimResult
    fits: bool
    device_counts: tuple[int, ...]
    points: int
    devices: tuple[str, ...] = ()
    device_set: str = ""
    device_sets: tuple[str, ...] = ()


def _over_bytes(sim: SimResult) -> float:
    """How far the worst device is over its memory (negative: the headroom of the tightest device)."""
    if not sim.peak_memory_bytes.size:
        return 0.0
    return float(np.max(sim.peak_memory_bytes.astype(float) - sim.memory_capacity_bytes.astype(float)))


def pick_over_device_counts(
    graph: OpGraph,
    topology: DeviceTopology,
    device_counts: Sequence[int] | None = None,
    cost_model: CostModel | None = None,
    *,
    device_sets: Sequence[DeviceSet] | None = None,
    max_device_sets: int = MAX_DEVICE_SETS,
    describe: Callable[[str], None] | None = None,
    **kwargs: object,
) -> FTPick:
    """Profiling mode judged by the simulator: FT on each candidate device set, every frontier point
    simulated once; the fastest point that fits, else the point that is least over memory
    (:attr:`FTPick.fits` says which).

    Args:
        graph: the op graph.
        topology: the cluster.
        device_counts: the counts of the candidate sets (default 1, 2, 4, ..., all, up to
            :data:`~.devices.FT_MAX_DEVICES`: on a larger cluster FT searches its fastest devices only).
        cost_model: the shared cost model (default :class:`CostModel`); it also ranks the devices.
        device_sets: the sets to search (default :func:`~.devices.candidate_device_sets` of the
            counts: the ``n`` fastest devices, the best whole machines, each device type; the same
            sets in the same order whatever order the topology lists its devices in).
        max_device_sets: the most default sets (each is one FT run).
        describe: called with ``"FT <set label>"`` before each set's FT run (a progress bar's label:
            ``progress`` restarts for each set).
        kwargs: keyword arguments of :func:`run_ft` (``progress``, ``max_configs``, ...).
    """
    counts = (
        list(device_counts)
        if device_counts is not None
        else default_device_counts(topology.num_devices, FT_MAX_DEVICES)
    )
    sets = (
        list(device_sets)
        if device_sets is not None
        else candidate_device_sets(topology, counts, cost_model, max_device_sets)
    )
    if not sets:
        raise ValueError("device_sets is empty; expected at least one device set")
    ctx = SimContext(graph, topology, cost_model)
    fastest: tuple[DeviceSet, FrontierPoint, SimResult] | None = None
    least: tuple[tuple[float, float], DeviceSet, FrontierPoint, SimResult] | None = None
    simulated = 0
    for device_set in sets:
        if describe is not None:
            describe(f"FT {device_set.label}")
        result = run_ft(graph, topology, list(device_set.devices), cost_model=cost_model, **kwargs)  # type: ignore[arg-type]
        for point in result.points:
            sim = ctx.simulate(point.plan)
            simulated += 1
            if not sim.oom:
                if fastest is None or sim.makespan_s < fastest[2].makespan_s:
                    fastest = (device_set, point, sim)
            elif fastest is None:
                rank = (_over_bytes(sim), sim.makespan_s)
                if least is None or rank < least[0]:
                    least = (rank, device_set, point, sim)
    labels = tuple(d.label for d in sets)
    if fastest is not None:
        chosen, point, sim = fastest
        fits = True
    elif least is not None:
        _, chosen, point, sim = least
        fits = False
    else:
        raise ValueError(
            f"FT found no plan of {graph.name!r} on {topology.name!r} on the device sets {', '.join(labels)}"
        )
    return FTPick(chosen.num_devices, point, sim, fits, tuple(counts), simulated, chosen.devices, chosen.label, labels)


def best_over_device_counts(
    graph: OpGraph,
    topology: DeviceTopology,
    device_counts: Sequence[int] | None = None,
    cost_model: CostModel | None = None,
    **kwargs: object,
) -> tuple[int, FrontierPoint, SimResult] | None:
    """Profiling mode judged by the simulator: FT on each candidate device set (the ``n`` fastest
    devices for each count 1, 2, 4, ..., all; the best whole machines; each device type), then the
    plan the simulator finds fastest among every set's frontier.

    On a heterogeneous cluster a subset (one fast machine) can beat all of them: on inception_v3 x
    tag-testbed, the 4 V100s give 3.31x data parallelism where all 16 GPUs give 0.95x.

    Returns (device count, point, its simulation), or None when nothing fits on any set
    (:func:`pick_over_device_counts` then gives the least-memory point; keyword arguments as there).
    """
    pick = pick_over_device_counts(graph, topology, device_counts, cost_model, **kwargs)  # type: ignore[arg-type]
    return (pick.num_devices, pick.point, pick.result) if pick.fits else None


def profiling(
    graph: OpGraph,
    topology: DeviceTopology,
    device_counts: Sequence[int] | None = None,
    memory_limit_bytes: float | None = None,
    *,
    stop_at_first_fit: bool = False,
    **kwargs: object,
) -> list[tuple[int, FrontierPoint | None, FTResult]]:
    """Profiling mode: for each device count (default 1, 2, 4, ... and the total, ascending, up to
    :data:`~.devices.FT_MAX_DEVICES`), the fastest point that fits (None when none does) and the FT
    result. Count ``n`` runs on the ``n`` fastest devices (:func:`~.devices.fastest_devices`).

    With ``stop_at_first_fit`` the counts stop at the first that has a fitting point (the last row
    is then mini-parallelism's answer). Keyword arguments go to :func:`run_ft`.
    """
    counts = (
        list(device_counts)
        if device_counts is not None
        else default_device_counts(topology.num_devices, FT_MAX_DEVICES)
    )
    out = []
    for n in sorted(counts):
        point, result = mini_time(graph, topology, n, memory_limit_bytes, **kwargs)
        out.append((n, point, result))
        if stop_at_first_fit and point is not None:
            break
    return out


def mini_parallelism(
    graph: OpGraph,
    topology: DeviceTopology,
    device_counts: Sequence[int] | None = None,
    memory_limit_bytes: float | None = None,
    **kwargs: object,
) -> tuple[int, FrontierPoint, FTResult] | None:
    """Mini-parallelism mode: the fewest devices (from ``device_counts``) with a strategy that fits.

    Returns (device count, the fastest fitting point at that count, its FT result), or None.
    """
    rows = profiling(graph, topology, device_counts, memory_limit_bytes, stop_at_first_fit=True, **kwargs)
    n, point, result = rows[-1]
    return (n, point, result) if point is not None else None
