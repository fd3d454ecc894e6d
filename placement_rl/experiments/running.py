"""Running one cell: the method resolved and measured, its row (:func:`cell_row`) and its outcome."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from placement_rl.experiments.cells import Cell, Instance, Prepared
from placement_rl.experiments.spec import MethodEntry
from placement_rl.io import finite_or_none
from placement_rl.methods import Method, MethodResult, compare_methods, get_method
from placement_rl.plan import Plan
from placement_rl.sim import CostModel
from placement_rl.sim.limits import SimulationTooLarge

# ------------------------------------------------------------------------------------ running cells
#: ``resolve(entry, model_label) -> Method``: the method a cell runs (learned ones are resolved at the edge).
MethodResolver = Callable[[MethodEntry, str], Method]


def resolve_registered(entry: MethodEntry, model: str) -> Method:
    """The default :data:`MethodResolver`: registered methods only."""
    if entry.kind != "registered":
        raise ValueError(
            f"method {entry.name!r} ({entry.kind}) needs the Ray edge's resolver (placement_rl.rl.compare)"
        )
    return get_method(entry.method)


def measure_cell(
    instance: Instance,
    cell: Cell,
    entry: MethodEntry,
    cost_model: CostModel | None = None,
    *,
    resolve: MethodResolver = resolve_registered,
    extra_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> MethodResult:
    """Run one cell: its method on its instance through :func:`compare_methods`, named by its label."""
    method = dataclasses.replace(resolve(entry, instance.source), name=entry.name)
    options = {**entry.options, **(extra_options or {})}
    if cell.seed is not None:
        options["seed"] = cell.seed
    [result] = compare_methods(
        instance.graph,
        instance.topology,
        [method],
        cost_model=cost_model,
        options={entry.name: options} if options else None,
        progress=progress,
    )
    return result


@dataclass(frozen=True)
class Measured:
    """A cell run in this process: its row and the full :class:`MethodResult` (plan and simulation)."""

    cell: Cell
    row: dict[str, Any]
    result: MethodResult


def measure_cells(
    prepared: Prepared,
    *,
    resolve: MethodResolver = resolve_registered,
    extra_options: Callable[[MethodEntry], Mapping[str, Any]] | None = None,
    progress: bool = False,
    on_result: Callable[[Measured], None] | None = None,
    on_refused: Callable[[dict[str, Any]], None] | None = None,
) -> list[Measured]:
    """Run every cell one after the other in this process and keep the full results (``plan`` and
    ``evaluate``: the same cells and rows as ``compare``, no output folder). Errors propagate, except
    with ``on_refused`` a simulation too large for this machine's memory
    (:class:`~placement_rl.sim.limits.SimulationTooLarge`): the cell is left out of the results and its
    row (``status: error``, the note ``refused: <why>``, :func:`refused_note`) goes to ``on_refused``,
    and the other cells still run.

    Args:
        prepared: the experiment, checked.
        resolve: the methods of cells.
        extra_options: per method entry, runtime options (e.g. MCMC's ``task_map``).
        progress: let the methods show their progress bars.
        on_result: called with each cell as soon as it is done.
        on_refused: called with the row of each cell whose method refused the instance as too large.
    """
    out = []
    for cell in prepared.cells:
        entry, inst = prepared.entry(cell.method), prepared.instance(cell.instance)
        if entry.kind == "unavailable":
            continue
        extra = extra_options(entry) if extra_options is not None else None
        try:
            result = measure_cell(
                inst, cell, entry, prepared.cost_model, resolve=resolve, extra_options=extra, progress=progress
            )
        except SimulationTooLarge as exc:
            if on_refused is None:
                raise
            name = prepared.experiment.name
            on_refused(cell_row(cell, inst, None, experiment=name, status="error", note=refused_note(exc)))
            continue
        row = cell_row(cell, inst, result, experiment=prepared.experiment.name, note=held_out_note(entry, inst))
        measured = Measured(cell, row, result)
        out.append(measured)
        if on_result is not None:
            on_result(measured)
    return out


def refused_note(exc: SimulationTooLarge) -> str:
    """The note of a cell whose method refused its instance: ``refused: simulating ... needs about ...``."""
    return f"refused: {exc}"


def plan_file_name(cell: Cell) -> str:
    """Where a cell's plan goes inside the output folder (one safe path component per part)."""
    from placement_rl.paths import safe_name

    seed = "" if cell.seed is None else f"-seed{cell.seed}"
    return f"plans/{safe_name(cell.instance)}/{safe_name(cell.method)}{seed}.json"


def cell_row(
    cell: Cell,
    instance: Instance,
    result: MethodResult | None,
    *,
    experiment: str = "",
    status: str = "ok",
    note: str = "",
    plan_file: str | None = None,
) -> dict[str, Any]:
    """The one row format of ``compare``, ``plan`` and ``evaluate``: the cell, then
    :meth:`MethodResult.row` (``None`` fields for cells that did not run)."""
    head = {
        "cell": cell.key,
        "experiment": experiment,
        "instance": instance.id,
        "model": instance.model,
        "graph": instance.graph.name,
        "topology": instance.topology.name,
        "batch_size": instance.graph.batch_size,
        "devices": instance.topology.num_devices,
        "method": cell.method,
        "seed": cell.seed,
        "status": status,
        "note": note,
    }
    body: dict[str, Any]
    if result is not None:
        body = {k: v for k, v in result.row().items() if k not in ("instance", "method")}
        body["dp_makespan_s"] = result.dp_makespan_s
        body["anytime"] = [list(p) for p in result.anytime]  # an infinite best cost (nothing fits yet): null
        if result.note:
            head["note"] = f"{note}; {result.note}" if note else result.note
    else:
        body = dict.fromkeys(ROW_FIELDS)
        body["anytime"] = []
    return finite_or_none({**head, **body, "plan_file": plan_file, "digest": cell.digest})


#: The fields :meth:`MethodResult.row` contributes (``None`` in rows of cells that did not run).
ROW_FIELDS = (
    "makespan_s",
    "samples_per_s",
    "speedup_over_dp",
    "speedup_over",
    "lower_bound_s",
    "headroom_captured",
    "max_peak_memory_bytes",
    "peak_memory_bytes",
    "memory_capacity_bytes",
    "memory_over_bytes",
    "comm_bytes",
    "busiest_link_bytes",
    "oom",
    "oom_devices",
    "devices_used",
    "search_s",
    "dp_makespan_s",
)


@dataclass(frozen=True)
class CellOutcome:
    """What a cell task sends back: its row and its plan (``None`` on error)."""

    row: dict[str, Any]
    plan: Plan | None


def execute_cell(
    instance: Instance,
    cell: Cell,
    entry: MethodEntry,
    cost_model: CostModel | None,
    experiment: str,
    resolve: MethodResolver = resolve_registered,
    extra_options: Mapping[str, Any] | None = None,
) -> CellOutcome:
    """One cell as a task (module level, so Ray can ship it): errors become ``status: error`` rows."""
    note = held_out_note(entry, instance)
    try:
        result = measure_cell(instance, cell, entry, cost_model, resolve=resolve, extra_options=extra_options)
    except Exception as exc:  # a failed cell must not take the others down; its row says why
        first = str(exc).splitlines()[0] if str(exc) else ""
        note = refused_note(exc) if isinstance(exc, SimulationTooLarge) else f"{type(exc).__name__}: {first}"
        return CellOutcome(cell_row(cell, instance, None, experiment=experiment, status="error", note=note), None)
    row = cell_row(cell, instance, result, experiment=experiment, note=note, plan_file=plan_file_name(cell))
    return CellOutcome(row, result.plan)


def held_out_note(entry: MethodEntry, instance: Instance) -> str:
    """``held out`` for a learned method's instance whose model its training did not see."""
    return "held out from training" if instance.source in entry.held_out_for(instance.source) else ""


class CellRunner(Protocol):
    """``runner(fn, args) -> iterator of (index, fn(*args[index]))`` in the order the calls finish.

    A call that died outside ``fn`` (a crashed worker) comes back as its exception, and its cell's
    row says so. The driver consumes results as they arrive and may stop early (Ctrl-C): a runner
    that holds remote work cancels it when its iterator is closed.
    """

    def __call__(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]: ...


def serial_cells(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
    """The default :class:`CellRunner`: one cell after the other, in this process."""
    for k, a in enumerate(args):
        yield k, fn(*a)
