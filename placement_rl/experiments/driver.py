"""The driver (:func:`run_experiment`): cells through a runner, rows appended to ``results.jsonl`` as
they finish, resume over damaged rows.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.errors import SchemaError
from placement_rl.experiments.cells import Prepared
from placement_rl.experiments.reports import summarize, write_outputs
from placement_rl.experiments.running import (
    CellOutcome,
    CellRunner,
    MethodResolver,
    cell_row,
    execute_cell,
    resolve_registered,
    serial_cells,
)
from placement_rl.experiments.spec import EXPERIMENT_FILE, FINISHED, RESULTS, _short
from placement_rl.io import dumps_json, loads_json, write_json
from placement_rl.plan import Plan


# ------------------------------------------------------------------------------------- the driver
@dataclass(frozen=True)
class Report:
    """What :func:`run_experiment` did.

    Attributes:
        out_dir: the output folder.
        rows: the latest row of every cell of the experiment that has one, in cell order.
        summary: the per-method summary (:func:`summarize`).
        ran: cells computed by this call.
        skipped: cells already finished (``resume``).
        failed: rows of cells that failed (``status: error``).
        files: the outputs written.
        interrupted: whether the run stopped early (Ctrl-C).
    """

    out_dir: Path
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    ran: int
    skipped: int
    failed: list[dict[str, Any]]
    files: list[Path]
    interrupted: bool = False


def _is_number(value: Any, *, low: float = -math.inf, null: bool = False) -> bool:
    if value is None:
        return null
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


#: What every row holds, by key: (test, what is expected).
_ROW_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "cell": (lambda v: isinstance(v, str) and bool(v), "a cell id"),
    "instance": (lambda v: isinstance(v, str), "a string"),
    "method": (lambda v: isinstance(v, str), "a string"),
    "seed": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "an integer or null"),
    "status": (lambda v: v in ("ok", "unavailable", "error"), "ok, unavailable or error"),
    "note": (lambda v: isinstance(v, str), "a string"),
    "digest": (lambda v: isinstance(v, str), "a string"),
}
#: What the row of a cell that ran (``status: ok``) holds besides, by key.
_OK_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "makespan_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "speedup_over_dp": (lambda v: _is_number(v, low=0, null=True), "a number >= 0 or null"),
    "speedup_over": (
        lambda v: isinstance(v, dict) and all(_is_number(x, null=True) and (x is None or x > 0) for x in v.values()),
        "an object of speedups > 0",
    ),
    "lower_bound_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "headroom_captured": (lambda v: _is_number(v, null=True), "a number or null"),
    "max_peak_memory_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "comm_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "busiest_link_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "oom": (lambda v: isinstance(v, bool), "true or false"),
    "search_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    # null where data parallelism (the reference) was too large to simulate (placement_rl.sim.limits)
    "dp_makespan_s": (lambda v: _is_number(v, low=0, null=True), "a number >= 0 or null"),
    "anytime": (
        lambda v: (
            isinstance(v, list)
            and all(isinstance(p, list) and len(p) == 2 and _is_number(p[0]) and _is_number(p[1], null=True) for p in v)
        ),
        "a list of [seconds, cost] pairs",
    ),
    "plan_file": (lambda v: v is None or isinstance(v, str), "a path or null"),
}


def row_problem(row: Any) -> str | None:
    """What is wrong with a ``results.jsonl`` row (``None``: nothing): it must be an object with the
    keys of :func:`cell_row`, of the right types, as every table and the summary read them."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    checks = {**_ROW_KEYS, **(_OK_KEYS if row.get("status") == "ok" else {})}
    missing = [k for k in checks if k not in row]
    if missing:
        return f"missing key(s) {missing}"
    for key, (test, expected) in checks.items():
        if not test(row[key]):
            return f"{key} = {_short(row[key], 80)}; expected {expected}"
    return None


def read_rows(path: Path, damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """The good rows of a ``results.jsonl``, in file order.

    A damaged line (cut short by a crash while it was written, not JSON, not a row object, a key
    missing or of the wrong type: :func:`row_problem`) is skipped, its cell counts as not run, and a
    message naming the file, the line and what was expected goes to ``damaged``. The file itself is
    never changed here.
    """
    if not path.exists():
        return []
    if not path.is_file():
        raise SchemaError(f"{path} is not a file; expected the results.jsonl of an earlier run")
    rows: list[dict[str, Any]] = []
    lines = path.read_bytes().split(b"\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{k + 1}"
        try:
            row = loads_json(line.decode("utf-8"), where)
        except SchemaError as exc:
            torn = " (a write cut short?)" if k == len(lines) - 1 else ""
            problem = str(exc).removeprefix(f"{where}: ") + torn
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        else:
            found = row_problem(row)
            if found is None:
                rows.append(row)
                continue
            problem = found
        if damaged is not None:
            damaged.append(f"{where}: skipped a damaged row: {problem}; expected one row object per line")
    return rows


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row as a JSON line and flush it to disk (what ``resume`` relies on). A file whose last
    line was cut short gets a line break first, so the new row stands on a line of its own."""
    line = (dumps_json(row, indent=None) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


#: The most damaged-row warnings ``run_experiment`` prints one by one.
MAX_DAMAGED_WARNINGS = 10


def run_experiment(
    prepared: Prepared,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    runner: CellRunner = serial_cells,
    resolve: MethodResolver = resolve_registered,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Report:
    """Run the cells that are not finished yet and write every output (see the module docstring).

    Args:
        prepared: the experiment, checked (:func:`prepare`).
        out_dir: the output folder.
        resume: skip the cells ``results.jsonl`` already has (same digest); without it an existing
            ``results.jsonl`` is an error, so that no result is overwritten.
        runner: runs the cells (:class:`CellRunner`; :func:`serial_cells` by default).
        resolve: the methods of cells (learned ones need the edge's resolver).
        progress: one progress bar over the cells.
        on_row: called with each new row.

    Returns:
        The report; on Ctrl-C the outputs are written for the finished cells and ``KeyboardInterrupt``
        propagates.
    """
    from placement_rl.paths import output_folder
    from placement_rl.progress import Progress

    exp = prepared.experiment
    out = output_folder(out_dir, "--out")
    log = out / RESULTS
    if log.exists() and log.stat().st_size > 0 and not resume:
        raise ValueError(f"{log} exists: pass --resume to finish that run, or choose another --out folder")
    damaged: list[str] = []
    previous = read_rows(log, damaged) if resume else []  # before anything is written
    write_json(out / EXPERIMENT_FILE, exp.to_dict())
    _write_graphs(out, prepared)
    for message in damaged[:MAX_DAMAGED_WARNINGS]:
        print(f"warning: {message}", file=sys.stderr, flush=True)
    if len(damaged) > MAX_DAMAGED_WARNINGS:
        print(f"warning: {len(damaged) - MAX_DAMAGED_WARNINGS} more damaged rows in {log}", file=sys.stderr)
    if damaged:
        print(
            f"warning: {log} is left as it is; the cells of its damaged rows run again unless another line has them",
            file=sys.stderr,
            flush=True,
        )
    wanted = {c.key: c for c in prepared.cells}
    latest: dict[str, dict[str, Any]] = {}
    for row in previous:
        cell = wanted.get(row["cell"])
        if cell is not None and row.get("digest") == cell.digest:
            latest[row["cell"]] = row
    done = {k for k, r in latest.items() if r.get("status") in FINISHED}
    todo = [c for c in prepared.cells if c.key not in done]
    ran = 0
    interrupted = False

    def record(row: dict[str, Any], plan: Plan | None) -> None:
        nonlocal ran
        if plan is not None and row.get("plan_file"):
            plan.to_json(out / row["plan_file"])
        append_row(log, row)
        latest[row["cell"]] = row
        ran += 1
        if on_row is not None:
            on_row(row)

    bar = Progress(len(prepared.cells), f"compare {exp.name}", "cell", enabled=progress)
    bar.update_to(len(done))
    tasks, cells = [], []
    for cell in todo:
        entry, inst = prepared.entry(cell.method), prepared.instance(cell.instance)
        if entry.kind == "unavailable":
            record(cell_row(cell, inst, None, experiment=exp.name, status="unavailable", note=entry.note), None)
            bar.advance()
            continue
        tasks.append((inst, cell, entry, prepared.cost_model, exp.name, resolve))
        cells.append((cell, inst))
    results = runner(execute_cell, tasks)
    try:
        for k, outcome in results:
            if isinstance(outcome, BaseException):  # the task died outside the cell (a crashed worker)
                cell, inst = cells[k]
                note = f"{type(outcome).__name__}: {str(outcome).splitlines()[0] if str(outcome) else ''}"
                outcome = CellOutcome(cell_row(cell, inst, None, experiment=exp.name, status="error", note=note), None)
            record(outcome.row, outcome.plan)
            bar.advance(last=f"{outcome.row['method']} on {outcome.row['instance']}")
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        close = getattr(results, "close", None)
        if callable(close):
            close()
        bar.close()
        rows = [latest[c.key] for c in prepared.cells if c.key in latest]
        files = write_outputs(out, exp, rows)
        if interrupted:
            print(
                f"interrupted: {sum(r['status'] in FINISHED for r in rows)} of {len(prepared.cells)} cells "
                f"finished, kept in {log}; run again with --resume to finish",
                flush=True,
            )
    failed = [r for r in rows if r["status"] == "error"]
    return Report(out, rows, summarize(rows), ran, len(done), failed, [log, *files], interrupted)


def _write_graphs(out: Path, prepared: Prepared) -> None:
    """The graph of every instance whose plans ``simulate --model`` could not rebuild from a zoo name
    and a batch size (coarsened graphs, model options), as ``graphs/<graph name>.json``."""
    seen: set[str] = set()
    models = {m.name: m for m in prepared.experiment.models}
    for inst in prepared.instances:
        entry = models[inst.model]
        if (entry.coarsen or entry.options) and inst.graph.name not in seen:
            from placement_rl.paths import safe_name

            seen.add(inst.graph.name)
            path = out / "graphs" / f"{safe_name(inst.model)}-b{inst.graph.batch_size}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            inst.graph.to_json(path)
