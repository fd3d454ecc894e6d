"""Every placement method under one name, and the one comparison of methods on an instance.

A *method* turns a problem (a graph, a topology, a simulation context) into a :class:`Plan`:

============================  ======================================================================
name                          what it is
============================  ======================================================================
``data_parallel``             every op split along its batch over all devices, gradients all-reduced
                              in buckets as PyTorch DDP (the reference)
``data_parallel_per_tensor``  the same, each gradient all-reduced alone (the papers' DP-NCCL)
``single_device``             everything on the fastest device
``expert``                    FlexFlow's expert strategies (Krizhevsky 2014; Wu et al. 2016 for RNNs)
``layerwise``                 contiguous stages balanced by compute
``subset_data_parallel``      the fastest data parallelism over one machine, one device type, or all
``mcmc``                      FlexFlow's MCMC with delta simulation (:func:`placement_rl.search.mcmc`)
``mcts``                      TAG's tree search with a uniform prior (pure MCTS, :mod:`placement_rl.search.mcts`)
``ft``                        TensorOpt's FT over its device sets, the simulator's pick
``exhaustive``                branch and bound over the whole SOAP space (small spaces only)
``megatron``                  Megatron-LM's tensor, pipeline and data parallelism (distributed
                              optimizer, recomputation where needed), degrees chosen by simulating
                              the candidates (:func:`placement_rl.plan.megatron`)
``zero``                      data parallelism with ZeRO-1, or ZeRO-3 (FSDP) when ZeRO-1 does not fit
============================  ======================================================================

Learned agents join as :class:`Method` objects built at the Ray edge
(:func:`placement_rl.rl.policy.policy_method`); new methods register by name with
:func:`register_method`, and :func:`compare_methods`, the CLI and the benchmarks look them up.

:func:`compare_methods` runs the methods on one instance, judges every plan with the same
simulation, and returns one :class:`MethodResult` row per method: ``placement-rl plan``,
``placement-rl evaluate``, ``placement-rl compare`` (:mod:`placement_rl.experiments`) and the
benchmarks all print these rows. Every row carries the instance's compute lower bound
(:func:`compute_lower_bound_s`) and the share of the data-parallel-to-bound headroom the plan
captured (:attr:`MethodResult.headroom_captured`).

A method may check its options (and whether it can run on an instance) before any work starts
(:attr:`Method.check`), and a search may return :class:`Found` to report its anytime trace.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.io import finite_or_none
from placement_rl.plan import (
    Plan,
    data_parallel,
    data_parallel_per_tensor,
    expert,
    layerwise,
    megatron,
    single_device,
    subset_data_parallel,
    tensor_parallel_regions,
    zero,
)
from placement_rl.sim import CostModel, SimContext, SimResult
from placement_rl.sim.limits import SimulationTooLarge
from placement_rl.sim.replicas import simulate_replica
from placement_rl.topology import Device, DeviceTopology

_BASELINE_BUILDERS: dict[str, Callable[[OpGraph, DeviceTopology], Plan]] = {
    "data_parallel": data_parallel,
    "data_parallel_per_tensor": data_parallel_per_tensor,
    "single_device": single_device,
    "expert": expert,
    "layerwise": layerwise,
}
#: The baseline strategies, by their one name (CLI aliases such as ``dp`` live only in the parser).
BASELINES: tuple[str, ...] = tuple(_BASELINE_BUILDERS)
#: The data-parallel references every row's speedups are taken against, where registered: bucketed
#: data parallelism (the simulator's default) and the papers' per-tensor DP-NCCL.
DP_REFERENCES: tuple[str, ...] = ("data_parallel", "data_parallel_per_tensor")


def _compute_type(device: Device) -> tuple[object, ...]:
    """What a device's compute time depends on: its type name and its compute figures (two devices
    of one catalogue type built with other peaks count as two types)."""
    return (device.device_type, device.peak_flops, device.memory_bandwidth_bytes_per_s, device.peak_flops_by_dtype)


def compute_lower_bound_s(
    context: SimContext,
    devices: Sequence[str] | None = None,
    *,
    single_device_results: Mapping[str, SimResult] | None = None,
) -> float:
    """The instance's heterogeneity-aware compute lower bound ``1 / sum_d (1 / T_type(d))``.

    ``T_type(d)`` is the simulated compute (busy) time of the whole graph on one device of ``d``'s
    type: the plan of :func:`~placement_rl.plan.single_device` on the first listed device of each
    distinct type, simulated once per type. It is the iteration time if every device computed all
    the time on a perfectly divisible workload and nothing else cost anything. On a homogeneous
    cluster it is ``T / n``, computed as exactly that (the earlier bound: total single-device compute
    over the device count); on a mixed one each device counts at its own speed, not the fastest's.

    Args:
        context: the simulation context of ``(graph, topology, cost model)``.
        devices: the devices the plans may use (default: all of the topology's, in order).
        single_device_results: simulations already made of :func:`single_device` on a device, by
            device name (e.g. the fastest device's, which :func:`compare_methods` runs anyway);
            reused for that device's type instead of simulating again.

    Returns:
        The bound in seconds, ``>= 0`` (``0`` for a graph without compute).
    """
    topology = context.topology
    names = [d.name for d in topology.devices] if devices is None else list(devices)
    if not names:
        raise ValueError("compute_lower_bound_s: no devices; expected at least one device name")
    known = dict(single_device_results or {})
    busy_s: dict[tuple[object, ...], float] = {}  # compute type -> T_type
    count: dict[tuple[object, ...], int] = {}
    for name in names:
        key = _compute_type(topology.device(name))
        count[key] = count.get(key, 0) + 1
    for name, result in known.items():
        busy_s.setdefault(_compute_type(topology.device(name)), float(result.busy_s.sum()))
    for name in names:
        key = _compute_type(topology.device(name))
        if key not in busy_s:
            result = context.simulate(single_device(context.graph, topology, name), validate=False)
            busy_s[key] = float(result.busy_s.sum())
    if any(t <= 0 for t in busy_s.values()):
        return 0.0
    # 1 / sum_d (1 / T_d) written as T_ref / sum_d (T_ref / T_d), T_ref the fastest type's time: on one
    # type the sum is the device count exactly, so the bound is exactly T / n
    t_ref = min(busy_s[k] for k in count)
    return t_ref / sum(n * (t_ref / busy_s[k]) for k, n in count.items())


def baseline_plan(name: str, graph: OpGraph, topology: DeviceTopology) -> Plan:
    """The plan of the baseline called ``name`` (one of :data:`BASELINES`)."""
    if name not in _BASELINE_BUILDERS:
        raise UnknownNameError("baseline", name, BASELINES)
    return _BASELINE_BUILDERS[name](graph, topology)


@dataclass(frozen=True)
class Problem:
    """What a method is given.

    Attributes:
        graph: the op graph.
        topology: the cluster.
        context: the simulation context of ``(graph, topology, cost model)``, shared by all methods.
        options: this method's options (e.g. ``{"budget": "10s"}`` for ``mcmc``).
        progress: whether the method may show a progress bar.
    """

    graph: OpGraph
    topology: DeviceTopology
    context: SimContext
    options: Mapping[str, Any] = field(default_factory=dict)
    progress: bool = False

    @property
    def cost_model(self) -> CostModel:
        return self.context.cost


@dataclass(frozen=True)
class Found:
    """A plan with its search's anytime trace (what a method may return instead of a bare plan).

    Attributes:
        plan: the plan found.
        anytime: ``(seconds since the search began, best cost so far in seconds)`` at each improvement
            and at the end; the cost is the makespan, penalized for plans that do not fit (``inf``
            while nothing fits; rows write it as ``null``).
        note: what the row should say about the plan (e.g. that no plan of the search fits in memory
            and this is the one that needs the least).
    """

    plan: Plan
    anytime: tuple[tuple[float, float], ...] = ()
    note: str = ""


#: ``check(options, graph, topology)``: raise ``ValueError`` naming the bad value; called once with
#: ``graph = topology = None`` (the options alone) and once per instance, before any work starts.
MethodCheck = Callable[[Mapping[str, Any], OpGraph | None, DeviceTopology | None], None]


@dataclass(frozen=True)
class Method:
    """A named way to make a plan: ``run(problem) -> Plan`` (or :class:`Found`).

    Attributes:
        name: how rows and the CLI call it.
        run: the method.
        description: one line for listings.
        options: the option names ``run`` reads from ``problem.options`` (others are an error).
        check: validates options and instances before any work starts (:data:`MethodCheck`).
        search: whether the method chooses among plans that include data parallelism over all devices
            (every method but the fixed baselines of :data:`BASELINES` and ``zero``), or a function
            ``(options, topology) -> bool`` saying so for the options it is given (``megatron`` with a
            tensor or pipeline degree pinned above 1 has no data-parallel plan). Where that plan fits
            and nothing the method found is faster, :func:`compare_methods` keeps data parallelism's
            plan as the method's result and the row's note says so: a search never returns a plan
            slower than data parallelism where data parallelism fits and is in its space.
    """

    name: str
    run: Callable[[Problem], Plan | Found]
    description: str = ""
    options: tuple[str, ...] = ()
    check: MethodCheck | None = None
    search: bool | Callable[[Mapping[str, Any], DeviceTopology], bool] = True

    def searches_data_parallel(self, options: Mapping[str, Any], topology: DeviceTopology) -> bool:
        """Whether data parallelism over all of ``topology``'s devices is among the plans this method
        chooses from, given its ``options`` (:attr:`search`)."""
        return self.search(options, topology) if callable(self.search) else self.search

    @property
    def seeded(self) -> bool:
        """Whether the method takes a seed (comparisons run it once per seed, others once)."""
        return "seed" in self.options


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Make ``method`` known by its name (replacing a method of the same name)."""
    _METHODS[method.name] = method
    return method


def method_names() -> list[str]:
    """The registered method names, in registration order."""
    return list(_METHODS)


def get_method(name: str) -> Method:
    """The method called ``name``; :class:`UnknownNameError` listing the valid names otherwise."""
    if name not in _METHODS:
        raise UnknownNameError("method", name, _METHODS)
    return _METHODS[name]


@dataclass(frozen=True)
class MethodResult:
    """One method's plan on one instance, judged by the simulator.

    Attributes:
        instance: ``"<graph>@<topology>"``.
        method: the method's name.
        plan: the plan it made.
        result: the plan's simulation.
        search_s: wall-clock seconds the method took to make the plan (its simulation excluded).
        dp_makespan_s: data parallelism's makespan on the same instance (the reference; ``nan`` where it is
            too large to simulate on this machine, :mod:`placement_rl.sim.limits`).
        batch_size: the graph's global batch size.
        lower_bound_s: the instance's compute lower bound (:func:`compute_lower_bound_s`).
        reference_makespans_s: makespan of each registered data-parallel reference
            (:data:`DP_REFERENCES`) on the same instance.
        anytime: the search's trace (:attr:`Found.anytime`); empty for methods that report none.
        note: the method's remark on its plan (:attr:`Found.note`), empty for most.
    """

    instance: str
    method: str
    plan: Plan
    result: SimResult
    search_s: float
    dp_makespan_s: float
    batch_size: int = 1
    lower_bound_s: float = 0.0
    reference_makespans_s: Mapping[str, float] = field(default_factory=dict)
    anytime: tuple[tuple[float, float], ...] = ()
    note: str = ""

    @property
    def makespan_s(self) -> float:
        return self.result.makespan_s

    @property
    def speedup_over_dp(self) -> float:
        """Data parallelism's makespan over this plan's (> 1: faster than data parallelism)."""
        return self.dp_makespan_s / self.result.makespan_s if self.result.makespan_s > 0 else float("inf")

    @property
    def speedups(self) -> dict[str, float]:
        """Speedup over each data-parallel reference (> 1: faster), by reference name."""
        refs = {"data_parallel": self.dp_makespan_s, **self.reference_makespans_s}
        m = self.result.makespan_s
        return {name: (ref / m if m > 0 else math.inf) for name, ref in refs.items()}

    @property
    def headroom_captured(self) -> float | None:
        """The share of the headroom between data parallelism and the compute lower bound that this
        plan captured: ``(dp - makespan) / (dp - bound)``; 1 reaches the bound, 0 is data
        parallelism, negative is slower than it. ``None`` when data parallelism is at the bound."""
        headroom = self.dp_makespan_s - self.lower_bound_s
        if not headroom > 0:
            return None
        return (self.dp_makespan_s - self.result.makespan_s) / headroom

    @property
    def oom(self) -> bool:
        return self.result.oom

    @property
    def max_peak_memory_bytes(self) -> int:
        peak = self.result.peak_memory_bytes
        return int(peak.max()) if peak.size else 0

    @property
    def memory_over_bytes(self) -> int:
        """How far the plan's worst device is over its memory: ``max(peak - capacity)`` over the
        devices, 0 when the plan fits."""
        return memory_over_bytes(self.result)

    @property
    def busiest_link_bytes(self) -> float:
        """Bytes on the busiest link (Trinity's "peak communication")."""
        links = self.result.link_bytes
        return float(links.max()) if links.size else 0.0

    @property
    def devices_used(self) -> int:
        return int((self.result.busy_s > 0).sum())

    def row(self) -> dict[str, Any]:
        """The JSON-friendly row every command prints (``--json``) and writes."""
        r = self.result
        row = {
            "instance": self.instance,
            "method": self.method,
            "makespan_s": r.makespan_s,
            "samples_per_s": r.samples_per_s(self.batch_size),
            "speedup_over_dp": self.speedup_over_dp,
            "speedup_over": self.speedups,
            "lower_bound_s": self.lower_bound_s,
            "headroom_captured": self.headroom_captured,
            "max_peak_memory_bytes": self.max_peak_memory_bytes,
            "peak_memory_bytes": {d: int(m) for d, m in zip(r.device_names, r.peak_memory_bytes, strict=True)},
            "memory_capacity_bytes": {d: int(m) for d, m in zip(r.device_names, r.memory_capacity_bytes, strict=True)},
            "memory_over_bytes": self.memory_over_bytes,
            "comm_bytes": r.comm_bytes,
            "busiest_link_bytes": self.busiest_link_bytes,
            "oom": r.oom,
            "oom_devices": list(r.oom_devices),
            "devices_used": self.devices_used,
            "search_s": self.search_s,
        }
        return finite_or_none(row)


def memory_over_bytes(result: SimResult) -> int:
    """``max(peak - capacity)`` over the devices of a simulation, 0 when it fits (no device over)."""
    if not result.peak_memory_bytes.size:
        return 0
    over = result.peak_memory_bytes.astype(float) - result.memory_capacity_bytes.astype(float)
    return max(int(over.max()), 0)


def least_memory(results: Sequence[MethodResult]) -> MethodResult:
    """The plan whose worst device is least over its memory (:attr:`MethodResult.memory_over_bytes`;
    ties: the fastest): the one to show when no plan fits."""
    if not results:
        raise ValueError("least_memory: no results; expected at least one method's row")
    return min(results, key=lambda r: (r.memory_over_bytes, r.max_peak_memory_bytes, r.makespan_s))


def best_result(results: Sequence[MethodResult]) -> MethodResult:
    """The fastest plan that fits in memory; when none fits, the one that needs the least memory
    (:func:`least_memory`), whose row says it is out of memory (check ``.oom``)."""
    if not results:
        raise ValueError("best_result: no results; expected at least one method's row")
    fitting = [r for r in results if not r.oom]
    if not fitting:
        return least_memory(results)
    return min(fitting, key=lambda r: r.makespan_s)


class _References(NamedTuple):
    """What every row of an instance is judged against (:func:`_references`)."""

    context: SimContext
    dp_plan: Plan
    dp: SimResult | None  # None: too large to simulate here (placement_rl.sim.limits); rows say nan
    lower_bound_s: float
    references: dict[str, float]
    dp_simulation_s: float = math.inf  # wall-clock seconds of data parallelism's simulation


#: The last instance's :class:`_References`, with the ``(graph, topology, cost model)`` objects they
#: are of: ``plan`` and ``compare`` run one method per call on the same instance, and on a large model
#: these simulations take seconds each.
_LAST_REFERENCES: list[tuple[tuple[Any, ...], _References]] = []


def _references(graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None) -> _References:
    """The simulation context and reference figures of an instance, made once per ``(graph, topology,
    cost model)`` objects in a row: data parallelism's plan and simulation, the compute bound and the
    other data-parallel references."""
    key = (graph, topology, cost_model)
    if _LAST_REFERENCES and all(a is b for a, b in zip(_LAST_REFERENCES[0][0], key, strict=True)):
        return _LAST_REFERENCES[0][1]
    ctx = SimContext(graph, topology, cost_model)
    # Compile the simulator's kernels outside the timed methods (the single-device run also gives the bound).
    single_plan = single_device(graph, topology)
    single = ctx.simulate(single_plan, validate=False)
    dp_plan = data_parallel(graph, topology)
    lower_bound_s = compute_lower_bound_s(ctx, single_device_results={single_plan.metadata["device"]: single})
    references: dict[str, float] = {}
    dp_simulation_s = math.inf
    try:  # a cluster too large to simulate data parallelism on leaves the rows without it (they still run)
        start = time.perf_counter()
        dp: SimResult | None = ctx.simulate(dp_plan, validate=False)
        dp_simulation_s = time.perf_counter() - start
        for name in DP_REFERENCES[1:]:
            if name in _METHODS:
                plan = _as_found(_METHODS[name].run(Problem(graph, topology, ctx))).plan
                references[name] = ctx.simulate(plan).makespan_s
    except SimulationTooLarge:
        dp = None
    made = _References(ctx, dp_plan, dp, lower_bound_s, references, dp_simulation_s)
    _LAST_REFERENCES[:] = [(key, made)]
    return made


def compare_methods(
    graph: OpGraph,
    topology: DeviceTopology,
    methods: Sequence[str | Method],
    *,
    cost_model: CostModel | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = False,
    on_result: Callable[[MethodResult], None] | None = None,
) -> list[MethodResult]:
    """Run ``methods`` on ``graph`` x ``topology`` and judge every plan with one simulation context.

    Args:
        graph: the op graph.
        topology: the cluster.
        methods: method names (:func:`method_names`) or :class:`Method` objects, in output order.
        cost_model: the simulator's cost model (default: :data:`placement_rl.sim.DEFAULT_COST_MODEL`).
        options: per method name, its options (``{"mcmc": {"budget": "10s", "chains": 2}}``).
        progress: let the methods show progress bars.
        on_result: called with each row as soon as it is ready (progress lines).

    Returns:
        One row per method, in the order given; ``speedup_over_dp`` is against data parallelism
        on all devices, simulated whether or not ``data_parallel`` is among ``methods``; every row
        has the instance's compute lower bound and the registered data-parallel references.

    Raises:
        UnknownNameError: for an unknown method name, or an option a method does not take.
    """
    resolved = [m if isinstance(m, Method) else get_method(m) for m in methods]
    options = dict(options or {})
    names = {m.name for m in resolved}
    for name, opts in options.items():
        if name not in names:
            raise UnknownNameError("method in options", name, names)
        method = next(m for m in resolved if m.name == name)
        for key in opts:
            if key not in method.options:
                raise UnknownNameError(f"option of method {name!r}", key, method.options)
    ctx, dp_plan, dp, lower_bound_s, references, _ = _references(graph, topology, cost_model)
    instance = f"{graph.name}@{topology.name}"
    rows: list[MethodResult] = []
    for method in resolved:
        problem = Problem(graph, topology, ctx, options.get(method.name, {}), progress)
        start = time.perf_counter()
        found = _as_found(method.run(problem))
        elapsed = time.perf_counter() - start
        result = ctx.simulate(found.plan)
        if (
            dp is not None
            and not dp.oom
            and (result.oom or result.makespan_s > dp.makespan_s)
            and method.searches_data_parallel(problem.options, topology)
        ):
            found, result = _kept_data_parallel(found, result, dp_plan, dp)
        row = MethodResult(
            instance,
            method.name,
            found.plan,
            result,
            elapsed,
            dp.makespan_s if dp is not None else math.nan,
            graph.batch_size or 1,
            lower_bound_s,
            references,
            found.anytime,
            found.note,
        )
        rows.append(row)
        if on_result is not None:
            on_result(row)
    return rows


def _as_found(out: Plan | Found) -> Found:
    return out if isinstance(out, Found) else Found(out)


def _kept_data_parallel(found: Found, result: SimResult, dp_plan: Plan, dp: SimResult) -> tuple[Found, SimResult]:
    """A search's result replaced by data parallelism's (which fits and is faster), the note saying so."""
    own = "does not fit in memory" if result.oom else f"{result.makespan_s * 1e3:,.1f} ms/iter"
    said = (
        f"nothing it found beat data parallelism ({dp.makespan_s * 1e3:,.1f} ms/iter; its best plan {own}), "
        "so it keeps data parallelism's plan"
    )
    note = f"{found.note}; {said}" if found.note else said
    plan = dataclasses.replace(dp_plan, metadata={**dp_plan.metadata, "kept_data_parallel": True})
    return Found(plan, found.anytime, note), dp


# ------------------------------------------------------------------------------ built-in methods
def _baseline(name: str, build: Callable[[OpGraph, DeviceTopology], Plan], description: str) -> Method:
    return Method(name, lambda p: build(p.graph, p.topology), description, search=False)


def _mcmc(problem: Problem) -> Found:
    from placement_rl.search import mcmc

    opts = {"budget": "10s", "chains": 1, "seed": 0, "proposals": DEFAULT_PROPOSALS, **problem.options}
    found = mcmc(problem.graph, problem.topology, cost_model=problem.cost_model, progress=problem.progress, **opts)
    given = [c.name for c in opts.get("initial", ()) if isinstance(c, Plan)]
    note = f"started from {', '.join(given)}'s plan too" if given else ""
    return Found(found.plan, anytime_trace(found.best_costs_s, found.elapsed_s, found.times_s), note)


def anytime_trace(best_costs_s: Any, elapsed_s: float, times_s: Any = None) -> tuple[tuple[float, float], ...]:
    """``(seconds, best cost)`` at each improvement of a per-proposal best-cost trace, and at the end.

    Args:
        best_costs_s: ``(n,)`` best cost after each proposal.
        elapsed_s: the search's wall-clock time.
        times_s: ``(n,)`` seconds since the search began after each proposal, when recorded; without
            them proposal ``k`` is placed at ``elapsed_s * (k + 1) / n`` (a steady proposal rate).
    """
    n = len(best_costs_s)
    if n == 0:
        return ()
    timed = times_s is not None and len(times_s) == n
    points: list[tuple[float, float]] = []
    for k, cost in enumerate(best_costs_s):
        if not points or cost < points[-1][1]:
            at = min(float(times_s[k]), elapsed_s) if timed else elapsed_s * (k + 1) / n
            points.append((at, float(cost)))
    if points[-1][0] < elapsed_s:
        points.append((elapsed_s, points[-1][1]))
    return tuple(points)


#: The most MCMC chains, and tempering replicas per chain, one method entry may ask for.
MAX_CHAINS, MAX_TEMPERING = 1024, 64


def check_budget(value: Any, key: str = "budget", *, seconds_only: bool = False) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value`` is a search budget (:class:`placement_rl.search.Budget`:
    seconds such as ``'30s'`` or, unless ``seconds_only``, a number of proposals; both bounded there)."""
    from placement_rl.search import Budget

    try:
        budget = value if isinstance(value, Budget) else Budget.parse(value)
    except ValueError as exc:
        detail = str(exc).split(": ", 1)[-1]
        raise ValueError(f"{key} = {value!r}; {detail}") from None
    if seconds_only and budget.seconds is None:
        raise ValueError(f"{key} = {value!r}; expected a duration such as '30s' or '2m'")


def _check_int(options: Mapping[str, Any], key: str, default: int, high: int, what: str = "") -> None:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{key} = {value!r}; expected an integer >= 1 and <= {high}{what}")


def _check_mcmc(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:
    from placement_rl.search.mcmc import EXTENDED_CANDIDATES, check_restart

    if "budget" in options:
        check_budget(options["budget"])
    _check_int(options, "chains", 1, MAX_CHAINS)
    beta = options.get("beta", 50.0)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta = {beta!r}; expected a finite number > 0")
    if "proposals" in options:
        from placement_rl.search.proposals import parse_proposals

        parse_proposals(options["proposals"])
    adaptive = options.get("adaptive")
    if adaptive is not None and (
        isinstance(adaptive, bool) or not isinstance(adaptive, (int, float)) or not 0 < adaptive < 1
    ):
        raise ValueError(f"adaptive = {adaptive!r}; expected a target acceptance rate in (0, 1) or null")
    _check_int(options, "tempering", 1, MAX_TEMPERING, " (replicas per chain)")
    check_restart(options.get("restart"))
    ratio = options.get("beta_ratio", 3.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"beta_ratio = {ratio!r}; expected a finite number > 1")
    initial = options.get("initial", list(EXTENDED_CANDIDATES))
    if (
        not isinstance(initial, (list, tuple))
        or not initial
        or not all(isinstance(c, str) and c in EXTENDED_CANDIDATES for c in initial)
    ):
        raise ValueError(f"initial = {initial!r}; expected a non-empty list of {list(EXTENDED_CANDIDATES)}")


def _ft(problem: Problem) -> Found:
    """FT on its candidate device sets (the fastest 1, 2, 4, ... and all devices, the best whole
    machines, each device type); the frontier plan the simulator finds fastest and fitting.
    When no frontier plan fits on any set, the one whose worst device is least over its
    memory, marked so (its plan's ``metadata["fits"]`` is false and the row's note says it)."""
    from placement_rl.progress import Progress
    from placement_rl.search.ft import pick_over_device_counts

    max_configs = int(problem.options.get("max_configs", 8))
    counts = problem.options.get("device_counts")
    with Progress(problem.graph.num_ops, "FT", "op", enabled=problem.progress, leave=False) as bar:
        pick = pick_over_device_counts(
            problem.graph,
            problem.topology,
            counts,
            cost_model=problem.cost_model,
            max_configs=max_configs,
            stage_meshes=int(problem.options.get("stage_meshes", 0)),
            progress=bar.steps(),
            describe=bar.describe,  # one phase per device set: "FT 8 devices (H100 x8; machine m0)"
        )
    if pick.fits:
        return Found(pick.point.plan)
    from placement_rl.plots import format_bytes

    over = format_bytes(memory_over_bytes(pick.result))
    plan = dataclasses.replace(pick.point.plan, metadata={**pick.point.plan.metadata, "fits": False})
    counts_text = ", ".join(str(n) for n in pick.device_counts)
    note = (
        f"none of FT's {pick.points} plans (on {counts_text} devices) fits in memory; this is the one that "
        f"needs the least ({pick.num_devices} devices, {over} over on its fullest device)"
    )
    return Found(plan, note=note)


for _name, _description in (
    ("data_parallel", "every op split along its batch over all devices, gradients in buckets"),
    ("data_parallel_per_tensor", "data parallelism with every gradient all-reduced alone (DP-NCCL)"),
    ("single_device", "every op on the fastest device"),
    ("expert", "FlexFlow's expert strategies"),
    ("layerwise", "contiguous stages balanced by compute"),
):
    register_method(_baseline(_name, _BASELINE_BUILDERS[_name], _description))
register_method(
    Method(
        "subset_data_parallel",
        lambda p: subset_data_parallel(p.graph, p.topology, cost_model=p.cost_model),
        "the fastest data parallelism over one machine, one device type or all devices",
    )
)
register_method(
    Method(
        "mcmc",
        _mcmc,
        "FlexFlow's MCMC search with delta simulation",
        (
            "budget",
            "chains",
            "seed",
            "beta",
            "initial",
            "task_map",
            "delta",
            "proposals",
            "adaptive",
            "tempering",
            "beta_ratio",
            "restart",
        ),  # fmt: skip
        _check_mcmc,
    )
)


MCTS_OPTIONS = (
    "budget",
    "max_groups",
    "device_grouping",
    "max_subsets",
    "c_puct",
    "leaf_batch",
    "reference",
    "options",
    "completion",
)
#: The largest ``max_groups``, ``max_subsets`` and ``leaf_batch`` an MCTS entry may ask for.
MCTS_LIMITS = {"max_groups": 100_000, "max_subsets": 100_000, "leaf_batch": 4096}


def _mcts(problem: Problem) -> Found:
    """TAG's MCTS with the uniform prior over TAG's space (op groups x device-group subsets x
    options); the best leaf seen. The learned prior joins as the ``tag`` agent."""
    from placement_rl.progress import step_progress
    from placement_rl.search import Budget
    from placement_rl.search.mcts import MCTSConfig, mcts_search
    from placement_rl.search.tag import TagProblem

    opts = dict(problem.options)
    budget = Budget.parse(opts.pop("budget", "10s"))
    config = MCTSConfig(c_puct=opts.pop("c_puct", None), leaf_batch=int(opts.pop("leaf_batch", 8)))
    tag = TagProblem.for_graph(problem.graph, problem.topology, problem.cost_model, **opts)
    total = budget.proposals or 0
    with step_progress(total, "MCTS", problem.progress and total > 0) as report:
        found = mcts_search(tag, iterations=budget.proposals, time_s=budget.seconds, config=config, progress=report)
    return Found(tag.plan(found.decisions, name="mcts"), mcts_trace(tag.baseline.makespan_s, found))


def mcts_trace(baseline_s: float, found: Any) -> tuple[tuple[float, float], ...]:
    """The :attr:`Found.anytime` of a tree search (:class:`placement_rl.search.mcts.SearchResult`): its
    ``(seconds, iteration, best speedup)`` trace as ``(seconds, best makespan)``, the makespan being
    ``baseline_s / speedup`` (infinite while no plan fits), and a last point at the end of the search."""
    anytime = [(t, baseline_s / s if s > 0 else math.inf) for t, _, s in found.anytime]
    anytime.append((found.elapsed_s, anytime[-1][1]))
    return tuple(anytime)


def _check_mcts(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:
    from placement_rl.search.tag import COMPLETIONS, DEVICE_GROUPINGS, REFERENCES, option_set

    if "budget" in options:
        check_budget(options["budget"])
    for key, high in MCTS_LIMITS.items():
        _check_int(options, key, 1, high)
    c = options.get("c_puct")
    if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0):
        raise ValueError(f"c_puct = {c!r}; expected a finite number > 0 (or null for TAG's sqrt(children / 10))")
    if options.get("device_grouping", "machine") not in DEVICE_GROUPINGS:
        raise ValueError(f"device_grouping = {options['device_grouping']!r}; expected one of {list(DEVICE_GROUPINGS)}")
    if options.get("reference", "data_parallel") not in REFERENCES:
        raise ValueError(f"reference = {options['reference']!r}; expected one of {list(REFERENCES)}")
    if options.get("completion", "best") not in COMPLETIONS:
        raise ValueError(f"completion = {options['completion']!r}; expected one of {list(COMPLETIONS)}")
    if "options" in options:
        option_set(options["options"])  # a named set or a list of option names


register_method(
    Method(
        "mcts",
        _mcts,
        "TAG's Monte-Carlo tree search with a uniform prior (op groups on device-group subsets x options)",
        MCTS_OPTIONS,
        _check_mcts,
    )
)


def _check_ft(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:
    max_configs = options.get("max_configs", 8)
    if isinstance(max_configs, bool) or not isinstance(max_configs, int) or max_configs < 1:
        raise ValueError(f"max_configs = {max_configs!r}; expected an integer >= 1")
    stage_meshes = options.get("stage_meshes", 0)
    if isinstance(stage_meshes, bool) or not isinstance(stage_meshes, int) or stage_meshes < 0:
        raise ValueError(f"stage_meshes = {stage_meshes!r}; expected a machine count >= 0 (0: one mesh per device set)")
    counts = options.get("device_counts")
    if counts is None:
        return
    if not isinstance(counts, (list, tuple)) or not counts:
        raise ValueError(f"device_counts = {counts!r}; expected a non-empty list of device counts")
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"device_counts = {counts!r}: {n!r} is not a device count (an integer >= 1)")
        if topology is not None and n > topology.num_devices:
            raise ValueError(f"device_counts = {counts!r}: {topology.name!r} has only {topology.num_devices} devices")


#: The most plans ``exhaustive`` enumerates unless its ``max_plans`` option says otherwise.
EXHAUSTIVE_MAX_PLANS = 1_000_000


def _exhaustive_space(options: Mapping[str, Any], graph: OpGraph, topology: DeviceTopology) -> Any:
    from placement_rl.search import SearchSpace

    count = options.get("devices")
    devices = None if count is None else [d.name for d in topology.devices[:count]]
    return SearchSpace(graph, topology, devices=devices)


def _check_exhaustive(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:

    limit = options.get("max_plans", EXHAUSTIVE_MAX_PLANS)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 1:
        raise ValueError(f"max_plans = {limit!r}; expected a number >= 1")
    if "time_limit" in options:
        limit_s = options["time_limit"]
        if not isinstance(limit_s, str):
            raise ValueError(f"time_limit = {limit_s!r}; expected a duration such as '30s' or '2m'")
        check_budget(limit_s, "time_limit", seconds_only=True)
    count = options.get("devices")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"devices = {count!r}; expected a device count (an integer >= 1): the first N devices")
    if graph is None or topology is None:
        return
    if count is not None and count > topology.num_devices:
        raise ValueError(f"devices = {count}: {topology.name!r} has only {topology.num_devices} devices")
    space = _exhaustive_space(options, graph, topology)
    log10_plans = sum(math.log10(space.size(i)) for i in range(graph.num_ops))
    if log10_plans > math.log10(limit):
        raise ValueError(
            f"exhaustive search of {graph.name!r} ({graph.num_ops} ops) on {topology.name!r}: the space has "
            f"10^{log10_plans:.1f} plans, more than max_plans = {limit:g}; expected a small instance (a coarsened "
            "graph, fewer devices with 'devices: N') or a search method such as mcmc"
        )


def _exhaustive(problem: Problem) -> Plan:
    from placement_rl.search import Budget, exhaustive

    limit = problem.options.get("time_limit")
    found = exhaustive(
        problem.graph,
        problem.topology,
        _exhaustive_space(problem.options, problem.graph, problem.topology),
        cost_model=problem.cost_model,
        time_limit_s=Budget.parse(limit).seconds if limit is not None else None,
    )
    return found.plan


register_method(
    Method(
        "ft",
        _ft,
        "TensorOpt's FT, the simulator's pick over device sets",
        ("max_configs", "device_counts", "stage_meshes"),
        _check_ft,
        lambda options, topology: topology.num_devices in (options.get("device_counts") or [topology.num_devices]),
    )
)
register_method(
    Method(
        "exhaustive",
        _exhaustive,
        "branch and bound over the whole SOAP space (refused when the space is too large)",
        ("max_plans", "time_limit", "devices"),
        _check_exhaustive,
        lambda options, topology: options.get("devices") in (None, topology.num_devices),
    )
)


# ------------------------------------------------------------------------- Megatron-LM and ZeRO
#: The options of ``megatron``: degrees to pin (others are searched) and the most ``(tp, pp, dp)`` tried.
MEGATRON_OPTIONS = ("tp", "pp", "dp", "max_candidates")
#: How many ``(tp, pp, dp)`` candidates ``megatron`` simulates unless ``max_candidates`` says otherwise.
MEGATRON_MAX_CANDIDATES = 12
#: Micro-batches per pipeline stage ``megatron`` aims for (fewer leave a larger pipeline bubble).
MICRO_BATCHES_PER_STAGE = 4
#: How many times more micro-batches ``megatron`` tries when a candidate does not fit with recomputation.
MICRO_BATCH_STEP = 4
#: The most micro-batches ``megatron`` tries that way (each is simulated: the time grows with the count).
MEGATRON_MAX_MICRO_BATCHES = 32


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batch_size(graph: OpGraph) -> int:
    if graph.batch_size is not None:
        return graph.batch_size
    return next((op.sample_dim.size for op in graph.ops if op.sample_dim is not None), 1)


def megatron_candidates(
    graph: OpGraph, topology: DeviceTopology, options: Mapping[str, Any] | None = None
) -> list[dict[str, int]]:
    """The ``(tp, pp, dp, micro_batches)`` the ``megatron`` method tries on an instance, most likely first.

    Every candidate uses all devices (``tp * pp * dp`` of them): ``tp`` a divisor of the GPUs of the
    smallest machine that splits some tensor-parallel region (or 1), ``pp`` a divisor of the rest, ``dp``
    what remains and divides the batch. Micro-batches: 1 without a pipeline; with ``pp`` stages the
    fewest that divide a replica's share of the batch and give each stage at least
    :data:`MICRO_BATCHES_PER_STAGE` (or as many as the share allows). Ordered by ``pp`` (a pipeline's
    bubble and its activations in flight cost most), then ``tp``; ``options`` may pin ``tp``, ``pp`` or
    ``dp`` and cap the count (``max_candidates``).
    """
    options = dict(options or {})
    machines = topology.machines().values()
    per_machine = min(len(m) for m in machines) if machines else 1
    total = topology.num_devices
    batch = _batch_size(graph)
    found: list[dict[str, int]] = []
    for tp in _divisors(per_machine):
        if options.get("tp", tp) != tp or total % tp or (tp > 1 and not tensor_parallel_regions(graph, tp)):
            continue
        for pp in _divisors(total // tp):
            dp = total // (tp * pp)
            if options.get("pp", pp) != pp or options.get("dp", dp) != dp or batch % dp:
                continue
            share = batch // dp
            micro = 1
            if pp > 1:
                enough = [m for m in _divisors(share) if m >= MICRO_BATCHES_PER_STAGE * pp]
                micro = enough[0] if enough else share
            found.append({"tp": tp, "pp": pp, "dp": dp, "micro_batches": micro})
    found.sort(key=lambda c: (c["pp"], c["tp"]))
    return found[: int(options.get("max_candidates", MEGATRON_MAX_CANDIDATES))]


def _pick(tried: Sequence[tuple[Plan, SimResult]]) -> tuple[Plan, SimResult, bool]:
    """The fastest plan that fits, else the one least over memory; whether it fits."""
    fitting = [(p, r) for p, r in tried if not r.oom]
    if fitting:
        plan, result = min(fitting, key=lambda pr: pr[1].makespan_s)
        return plan, result, True
    plan, result = min(tried, key=lambda pr: (memory_over_bytes(pr[1]), pr[1].makespan_s))
    return plan, result, False


def _unfit(plan: Plan, result: SimResult, what: str) -> Found:
    """A plan that does not fit, marked so (``metadata["fits"]`` false) with the row's note."""
    from placement_rl.plots import format_bytes

    marked = dataclasses.replace(plan, metadata={**plan.metadata, "fits": False})
    note = (
        f"{what} fits in memory; this is the one that needs the least ({format_bytes(memory_over_bytes(result))} over)"
    )
    return Found(marked, note=note)


def _attempts(candidate: Mapping[str, int], batch: int) -> list[tuple[int, str | None, int]]:
    """``(micro_batches, recompute, zero stage)`` to try for one candidate, in turn until one fits: its
    micro-batches with the distributed optimizer (ZeRO-1 over the data-parallel replicas, where there are
    any), with ZeRO-3 (parameters sharded too), with full recomputation, then with at least
    :data:`MICRO_BATCH_STEP` times as many micro-batches (smaller ones hold fewer activations; at most
    :data:`MEGATRON_MAX_MICRO_BATCHES`)."""
    m = candidate["micro_batches"]
    sharded = 1 if candidate["dp"] > 1 else 0
    attempts: list[tuple[int, str | None, int]] = [(m, None, sharded)]
    if sharded:
        attempts.append((m, None, 3))
    attempts.append((m, "full", sharded))
    share = batch // candidate["dp"]
    more = [d for d in _divisors(share) if MICRO_BATCH_STEP * m <= d <= MEGATRON_MAX_MICRO_BATCHES]
    if more:
        attempts.append((more[0], "full", sharded))
    return attempts


def _megatron(problem: Problem) -> Plan | Found:
    """Megatron-LM's 3D parallelism with the degrees the simulator finds fastest: every candidate of
    :func:`megatron_candidates`, with its distributed optimizer (ZeRO-1 over the data-parallel replicas)
    where ``dp > 1``; where one does not fit, with ZeRO-3, with full recomputation, then with more
    micro-batches (:func:`_attempts`). The fastest plan that fits, else the one least over memory."""
    graph, topology = problem.graph, problem.topology
    candidates = megatron_candidates(graph, topology, problem.options)
    if not candidates:
        raise ValueError(
            f"megatron: no (tp, pp, dp) of {graph.name!r} on {topology.name!r} uses all {topology.num_devices} devices "
            f"with dp dividing the batch of {_batch_size(graph)} (options {dict(problem.options)}); expected other "
            "options, or another method"
        )
    tried: list[tuple[Plan, SimResult]] = []
    too_large: SimulationTooLarge | None = None
    for candidate in candidates:
        for micro_batches, recompute, zero_stage in _attempts(candidate, _batch_size(graph)):
            try:
                plan = megatron(
                    graph,
                    topology,
                    tp=candidate["tp"],
                    pp=candidate["pp"],
                    dp=candidate["dp"],
                    micro_batches=micro_batches,
                    recompute=recompute,
                    zero_stage=zero_stage,
                )
            except ValueError:  # e.g. more stages than cuts between layers
                break
            # one data-parallel replica, exactly as fast as the whole plan (placement_rl.sim.replicas)
            try:
                result = simulate_replica(graph, topology, plan, candidate["dp"], problem.context.cost)
            except SimulationTooLarge as exc:  # too large to simulate here: the next candidate may not be
                too_large = exc
                break
            tried.append((plan, result))
            if not result.oom:
                break
    if not tried and too_large is not None:
        raise too_large
    if not tried:
        raise ValueError(
            f"megatron: none of the {len(candidates)} candidate(s) {candidates} makes a plan of {graph.name!r}; "
            "expected fewer pipeline stages than layers"
        )
    plan, result, fits = _pick(tried)
    plan = dataclasses.replace(plan, metadata={**plan.metadata, "candidates": len(tried)})
    if fits:
        return plan
    return _unfit(plan, result, f"none of megatron's {len(tried)} plans")


def _check_megatron(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:
    for key in ("tp", "pp", "dp"):
        if key in options:
            _check_int(options, key, 1, 1 << 20)
    _check_int(options, "max_candidates", MEGATRON_MAX_CANDIDATES, 10_000)
    if graph is not None and topology is not None and not megatron_candidates(graph, topology, options):
        pinned = {k: options[k] for k in ("tp", "pp", "dp") if k in options}
        raise ValueError(
            f"megatron on {graph.name!r} x {topology.name!r}: no candidate with {pinned or 'any degrees'}: tp must "
            f"divide a machine's GPUs and split a layer, tp * pp * dp = {topology.num_devices} and dp divide the "
            f"batch of {_batch_size(graph)}"
        )


def _zero(problem: Problem) -> Plan | Found:
    """Data parallelism over all devices with ZeRO-1 (optimizer state sharded); ZeRO-3 (FSDP) when
    ZeRO-1 does not fit."""
    base = data_parallel(problem.graph, problem.topology)
    tried: list[tuple[Plan, SimResult]] = []
    for stage in (1, 3):
        plan = dataclasses.replace(zero(problem.graph, base, stage), name="zero")
        result = problem.context.simulate(plan, validate=False)
        if not result.oom:
            return plan
        tried.append((plan, result))
    plan, result, _ = _pick(tried)
    return _unfit(plan, result, "neither ZeRO-1 nor ZeRO-3 data parallelism")


register_method(
    Method(
        "megatron",
        _megatron,
        "Megatron-LM's tensor, pipeline and data parallelism, the simulator's pick of the degrees",
        MEGATRON_OPTIONS,
        _check_megatron,
        lambda options, _: options.get("tp", 1) == 1 and options.get("pp", 1) == 1,
    )
)
register_method(Method("zero", _zero, "data parallelism with ZeRO-1 (ZeRO-3 where ZeRO-1 does not fit)", search=False))


# ------------------------------------------------------------------------------ the default methods
#: The methods ``plan`` runs when none are named (and :func:`default_methods` picks from): the fixed
#: baselines, the constructors that fit what data parallelism cannot (a subset of devices, ZeRO,
#: Megatron-LM's tensor, pipeline and data parallelism), TensorOpt's FT, and the two searches that find
#: the best plans on the planted suite, the tree search and MCMC with its coordinated moves.
DEFAULT_METHODS: tuple[str, ...] = (
    "data_parallel",
    "single_device",
    "expert",
    "layerwise",
    "subset_data_parallel",
    "zero",
    "megatron",
    "ft",
    "mcts",
    "mcmc",
)
#: MCMC's proposal mix by default: FlexFlow's one-op move and the coordinated moves (whole parameter
#: groups, blocks, pipeline stages, device subsets); ``flexflow`` is FlexFlow's own mix alone.
DEFAULT_PROPOSALS = "coordinated"
#: The methods whose cost grows with the simulation's (a search makes thousands; FT and FlexFlow's
#: expert plan build per-op strategies over every device): run by default only where the simulation of
#: data parallelism has at most :data:`SEARCH_TASKS` tasks.
SIMULATION_BOUND: tuple[str, ...] = ("expert", "ft", "mcts", "mcmc")
#: The most tasks data parallelism's simulation may have for :data:`SIMULATION_BOUND` to run by default
#: (inception_v3 on 16 GPUs: 20,292; Llama-3-8B on 8: 41,410; Llama-2-70B on 64: 821,810). A count, not a
#: time, so that the same instance gets the same methods on every machine.
SEARCH_TASKS = 200_000
#: A search's default budget: this many simulations' time of data parallelism on the instance ...
AUTO_BUDGET_SIMULATIONS = 500
#: ... within these bounds, in seconds.
AUTO_BUDGET_BOUNDS_S = (10.0, 30.0)
#: How the default methods and budgets are chosen, in words (``plan --help`` and the docs).
DEFAULTS_RULE = (
    f"the default budget of each search (mcts, mcmc) is {AUTO_BUDGET_SIMULATIONS} simulations' time of data "
    f"parallelism on the instance, between {AUTO_BUDGET_BOUNDS_S[0]:g} and {AUTO_BUDGET_BOUNDS_S[1]:g} s; where "
    f"that simulation has over {SEARCH_TASKS:,} tasks (models of tens of billions of parameters on tens of "
    f"GPUs), {', '.join(SIMULATION_BOUND)} are left out unless named"
)


@dataclass(frozen=True)
class Defaults:
    """The default methods for one instance (:func:`default_methods`).

    Attributes:
        methods: the methods to run, in :data:`DEFAULT_METHODS`' order.
        budget_s: each search's budget in seconds.
        simulation_s: the wall-clock seconds of one simulation of data parallelism on the instance.
        skipped: the default methods left out, each with the reason in words.
    """

    methods: tuple[str, ...]
    budget_s: float
    simulation_s: float
    skipped: Mapping[str, str] = field(default_factory=dict)

    @property
    def budget(self) -> str:
        """:attr:`budget_s` as a budget string (``"12s"``)."""
        return f"{self.budget_s:g}s"


def auto_budget_s(simulation_s: float) -> float:
    """A search's default budget for an instance whose data-parallel simulation takes ``simulation_s``:
    :data:`AUTO_BUDGET_SIMULATIONS` simulations' time within :data:`AUTO_BUDGET_BOUNDS_S`, whole seconds."""
    low, high = AUTO_BUDGET_BOUNDS_S
    if not math.isfinite(simulation_s):
        return high
    return float(min(high, max(low, math.ceil(AUTO_BUDGET_SIMULATIONS * simulation_s))))


def default_methods(graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None = None) -> Defaults:
    """The methods ``plan`` runs on an instance when none are named, and each search's budget.

    The rule is :data:`DEFAULTS_RULE`: the methods by the task count of data parallelism's simulation
    (the same on every machine), the budget by its wall-clock time (the first simulation of data
    parallelism on the instance's context, after the kernels compiled). Made with the same ``(graph,
    topology, cost model)`` objects, the simulation context is the one :func:`compare_methods` then
    judges the methods with.
    """
    refs = _references(graph, topology, cost_model)
    skipped: dict[str, str] = {}
    if refs.dp is None:  # data parallelism over every device is over the simulator's memory bound here
        why = (
            f"data parallelism over the {topology.num_devices:,} devices is too large to simulate here, so a "
            "search could not make progress; name it in --methods to run it"
        )
        skipped = dict.fromkeys(SIMULATION_BOUND, why)
    elif refs.dp.num_tasks > SEARCH_TASKS:
        why = (
            f"data parallelism's simulation has {refs.dp.num_tasks:,} tasks here (over {SEARCH_TASKS:,}) and takes "
            f"{refs.dp_simulation_s:.2f} s, too slow for it to finish in the default budget; name it in --methods "
            "to run it"
        )
        skipped = dict.fromkeys(SIMULATION_BOUND, why)
    if "mcts" not in skipped:
        from placement_rl.search.tag import DEFAULT_MAX_SUBSETS, device_groups

        groups = len(device_groups(topology))
        if groups + (groups > 1) > DEFAULT_MAX_SUBSETS:
            skipped["mcts"] = (
                f"TAG's action space holds {DEFAULT_MAX_SUBSETS} device-group subsets and {topology.name!r} has "
                f"{groups:,} machines (each alone and all together must be actions); an experiment entry with "
                f"max_subsets of at least {groups + 1:,} runs it"
            )
    methods = tuple(m for m in DEFAULT_METHODS if m not in skipped)
    return Defaults(methods, auto_budget_s(refs.dp_simulation_s), refs.dp_simulation_s, skipped)


def mcmc_starts(rows: Sequence[MethodResult]) -> list[str | Plan]:
    """MCMC's initial candidates after the methods of ``rows`` ran (as ``plan`` runs MCMC last): its
    default ones and, when the fastest plan that fits came from another method, that plan too, so that
    MCMC refines the best plan found so far."""
    from placement_rl.search.mcmc import EXTENDED_CANDIDATES

    starts: list[str | Plan] = list(EXTENDED_CANDIDATES)
    fitting = [r for r in rows if not r.oom]
    if fitting:
        best = min(fitting, key=lambda r: r.makespan_s)
        if best.method not in EXTENDED_CANDIDATES and not best.plan.metadata.get("kept_data_parallel"):
            starts.append(best.plan)
    return starts
