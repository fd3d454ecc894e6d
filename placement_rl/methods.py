"""Every placement method under one name, and the one comparison of methods on an instance.

A *method* turns a problem (a graph, a topology, a simulation context) into a :class:`Plan`:

========================  ========================================================================
name                      what it is
========================  ========================================================================
``data_parallel``         every op split along its batch over all devices (the reference)
``single_device``         everything on the fastest device
``expert``                FlexFlow's expert strategies (Krizhevsky 2014; Wu et al. 2016 for RNNs)
``layerwise``             contiguous stages balanced by compute
``subset_data_parallel``  the fastest data parallelism over one machine, one device type, or all
``mcmc``                  FlexFlow's MCMC with delta simulation (:func:`placement_rl.search.mcmc`)
``ft``                    TensorOpt's FT over 1, 2, 4, ... devices, the simulator's pick
========================  ========================================================================

Learned agents join as :class:`Method` objects built at the Ray edge
(:func:`placement_rl.rl.agents.policy_method`); new methods register by name with
:func:`register_method`, and :func:`compare_methods`, the CLI and the benchmarks look them up.

:func:`compare_methods` runs the methods on one instance, judges every plan with the same
simulation, and returns one :class:`MethodResult` row per method: ``placement-rl plan``,
``placement-rl evaluate`` and the benchmarks all print these rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.plan import Plan, data_parallel, expert, layerwise, single_device, subset_data_parallel
from placement_rl.sim import CostModel, SimContext, SimResult
from placement_rl.topology import DeviceTopology

_BASELINE_BUILDERS: dict[str, Callable[[OpGraph, DeviceTopology], Plan]] = {
    "data_parallel": data_parallel,
    "single_device": single_device,
    "expert": expert,
    "layerwise": layerwise,
}
#: The baseline strategies, by their one name (CLI aliases such as ``dp`` live only in the parser).
BASELINES: tuple[str, ...] = tuple(_BASELINE_BUILDERS)


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
class Method:
    """A named way to make a plan: ``run(problem) -> Plan``.

    Attributes:
        name: how rows and the CLI call it.
        run: the method.
        description: one line for listings.
        options: the option names ``run`` reads from ``problem.options`` (others are an error).
    """

    name: str
    run: Callable[[Problem], Plan]
    description: str = ""
    options: tuple[str, ...] = ()


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
        dp_makespan_s: data parallelism's makespan on the same instance (the reference).
        batch_size: the graph's global batch size.
    """

    instance: str
    method: str
    plan: Plan
    result: SimResult
    search_s: float
    dp_makespan_s: float
    batch_size: int = 1

    @property
    def makespan_s(self) -> float:
        return self.result.makespan_s

    @property
    def speedup_over_dp(self) -> float:
        """Data parallelism's makespan over this plan's (> 1: faster than data parallelism)."""
        return self.dp_makespan_s / self.result.makespan_s if self.result.makespan_s > 0 else float("inf")

    @property
    def oom(self) -> bool:
        return self.result.oom

    @property
    def max_peak_memory_bytes(self) -> int:
        peak = self.result.peak_memory_bytes
        return int(peak.max()) if peak.size else 0

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
        return {
            "instance": self.instance,
            "method": self.method,
            "makespan_s": r.makespan_s,
            "samples_per_s": r.samples_per_s(self.batch_size),
            "speedup_over_dp": self.speedup_over_dp,
            "max_peak_memory_bytes": self.max_peak_memory_bytes,
            "peak_memory_bytes": {d: int(m) for d, m in zip(r.device_names, r.peak_memory_bytes, strict=True)},
            "comm_bytes": r.comm_bytes,
            "busiest_link_bytes": self.busiest_link_bytes,
            "oom": r.oom,
            "oom_devices": list(r.oom_devices),
            "devices_used": self.devices_used,
            "search_s": self.search_s,
        }


def best_result(results: Sequence[MethodResult]) -> MethodResult:
    """The fastest plan that fits in memory (the fastest of all when none fits)."""
    if not results:
        raise ValueError("best_result: no results; expected at least one method's row")
    fitting = [r for r in results if not r.oom]
    return min(fitting or results, key=lambda r: r.makespan_s)


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
        on all devices, simulated whether or not ``data_parallel`` is among ``methods``.

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
    ctx = SimContext(graph, topology, cost_model)
    # Compile the simulator's kernels outside the timed methods.
    ctx.simulate(single_device(graph, topology), validate=False)
    dp = ctx.simulate(data_parallel(graph, topology), validate=False)
    instance = f"{graph.name}@{topology.name}"
    rows: list[MethodResult] = []
    for method in resolved:
        problem = Problem(graph, topology, ctx, options.get(method.name, {}), progress)
        start = time.perf_counter()
        plan = method.run(problem)
        elapsed = time.perf_counter() - start
        row = MethodResult(
            instance, method.name, plan, ctx.simulate(plan), elapsed, dp.makespan_s, graph.batch_size or 1
        )
        rows.append(row)
        if on_result is not None:
            on_result(row)
    return rows


# ------------------------------------------------------------------------------ built-in methods
def _baseline(name: str, build: Callable[[OpGraph, DeviceTopology], Plan], description: str) -> Method:
    return Method(name, lambda p: build(p.graph, p.topology), description)


def _mcmc(problem: Problem) -> Plan:
    from placement_rl.search import mcmc

    opts = {"budget": "10s", "chains": 1, "seed": 0, **problem.options}
    found = mcmc(problem.graph, problem.topology, cost_model=problem.cost_model, progress=problem.progress, **opts)
    return found.plan


def _ft(problem: Problem) -> Plan:
    """FT for 1, 2, 4, ... and all devices; the frontier plan the simulator finds fastest and fitting
    (else FT's least-memory point over all devices, which the row then reports as out of memory)."""
    from placement_rl.progress import step_progress
    from placement_rl.search.ft import best_over_device_counts, run_ft

    max_configs = int(problem.options.get("max_configs", 8))
    with step_progress(problem.graph.num_ops, "FT", problem.progress) as report:
        found = best_over_device_counts(
            problem.graph, problem.topology, cost_model=problem.cost_model, max_configs=max_configs, progress=report
        )
    if found is not None:
        return found[1].plan
    return (
        run_ft(problem.graph, problem.topology, cost_model=problem.cost_model, max_configs=max_configs).points[0].plan
    )


for _name, _description in (
    ("data_parallel", "every op split along its batch over all devices"),
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
        ("budget", "chains", "seed", "beta", "initial", "task_map", "delta"),
    )
)
register_method(Method("ft", _ft, "TensorOpt's FT, the simulator's pick over device counts", ("max_configs",)))
