"""Views of a simulated training iteration: a Chrome trace (Perfetto, chrome://tracing) and a Gantt PNG.

Both read a :class:`~placement_rl.sim.result.SimResult` and its :class:`~placement_rl.sim.result.TaskTable`.
Times in the result are seconds; the Chrome trace uses microseconds (the format's unit) and the Gantt
chart milliseconds.

Matplotlib is imported lazily, only by the PNG functions, and draws through ``FigureCanvasAgg`` on a
bare :class:`matplotlib.figure.Figure`, so no ``pyplot`` global state or backend selection is touched.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from placement_rl.sim.result import COMPUTE_KINDS, TASK_KINDS, SimResult

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["chrome_trace", "write_chrome_trace", "gantt_png"]

_US_PER_S = 1e6
_MS_PER_S = 1e3
#: Devices up to which idle ones get an empty Gantt row (beyond, only busy or OOM devices are drawn).
MAX_IDLE_ROWS = 64
#: Height of the critical-path strip as a share of a Gantt bar (drawn along the bar's top).
_CRITICAL_STRIP = 0.22
_GIB = float(1 << 30)

#: Colour per task kind (index into :data:`TASK_KINDS`), from matplotlib's ``tab10``.
_KIND_COLOURS: tuple[str, ...] = (
    "#1f77b4",  # forward: blue
    "#ff7f0e",  # backward: orange
    "#2ca02c",  # transfer: green
    "#d62728",  # gradient_transfer: red
    "#9467bd",  # all_reduce: purple
    "#8c564b",  # ps_push: brown
    "#e377c2",  # ps_pull: pink
    "#bcbd22",  # sfb_broadcast: olive
    "#17becf",  # sfb_gradient: cyan
    "#7f7f7f",  # host: grey
    "#aec7e8",  # partial_all_reduce: light blue
)


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def _num_devices(result: SimResult) -> int:
    """Number of leading lanes that are devices (``TaskTable.lanes`` lists devices first)."""
    return min(len(result.device_names), len(result.tasks.lanes))


def _oom_device_indices(result: SimResult) -> set[int]:
    """Indices of the devices that do not fit: named in ``oom_devices`` or with peak above capacity."""
    names = set(result.oom_devices)
    peak = np.asarray(result.peak_memory_bytes, dtype=np.float64)
    cap = np.asarray(result.memory_capacity_bytes, dtype=np.float64)
    out: set[int] = set()
    for d, name in enumerate(result.device_names):
        over = d < peak.size and d < cap.size and bool(peak[d] > cap[d])
        if name in names or over:
            out.add(d)
    return out


def _critical_mask(result: SimResult) -> np.ndarray:
    """``(T,)`` bool: which tasks are on the critical path (``SimResult.critical_tasks``).

    Task ids outside ``[0, T)`` are ignored.
    """
    mask = np.zeros(len(result.tasks), dtype=bool)
    ids = np.asarray(result.critical_tasks, dtype=np.int64).reshape(-1)
    ids = ids[(ids >= 0) & (ids < mask.size)]
    mask[ids] = True
    return mask


def _op_label(result: SimResult, op: int) -> str:
    """The op's name, or ``op<i>`` when the index is outside ``op_names``."""
    return result.op_names[op] if 0 <= op < len(result.op_names) else f"op{op}"


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


class _Direction(NamedTuple):
    """A link direction that carried bytes, with its figures (``SimResult.link_direction_*``)."""

    lane: int  # index into ``TaskTable.lanes``
    direction: int  # index into ``SimResult.link_direction_names``
    num_bytes: float
    busy_s: float
    capacity_bytes_per_s: float
    utilization: float


def _directions(result: SimResult) -> list[_Direction]:
    """The link directions that carried bytes, in lane order (empty for results without link figures)."""
    num_devices = _num_devices(result)
    names = result.link_direction_names
    if not names or num_devices + len(names) > len(result.tasks.lanes):
        return []
    utilization = result.link_direction_utilization
    return [
        _Direction(
            num_devices + d,
            d,
            float(result.link_direction_bytes[d]),
            float(result.link_direction_busy_s[d]),
            float(result.link_direction_capacity_bytes_per_s[d]),
            float(utilization[d]),
        )
        for d in np.flatnonzero(result.link_direction_bytes > 0).tolist()
    ]


def _utilization_steps(result: SimResult, direction: _Direction) -> tuple[np.ndarray, np.ndarray]:
    """``(time_s, fraction of capacity)`` steps of one direction, starting at 0 and ending at the makespan."""
    times, rates = result.link_direction_rates.of(direction.direction)
    keep = np.isfinite(times) & np.isfinite(rates)
    times, rates = times[keep], rates[keep]
    fraction = rates / direction.capacity_bytes_per_s if direction.capacity_bytes_per_s > 0 else rates * 0.0
    end = result.makespan_s if math.isfinite(result.makespan_s) else (float(times[-1]) if times.size else 0.0)
    return np.concatenate(([0.0], times, [end])), np.concatenate(([0.0], fraction, [0.0]))


def _rows_of_lanes(
    lanes: np.ndarray, starts: np.ndarray, ends: np.ndarray, first_free_tid: int
) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """A thread per task such that tasks on one thread never overlap (flows share link directions).

    Each lane's tasks, by start, take the lane's first row that is free by then. Row 0 is the lane
    itself (``tid`` = lane); further rows get new thread ids from ``first_free_tid`` on.

    Returns:
        ``(tid (T,), [(lane, row, tid), ...])``: each task's thread and the extra rows.
    """
    tid = lanes.astype(np.int64).copy()
    extra: list[tuple[int, int, int]] = []
    for lane in np.unique(lanes).tolist():
        idx = np.flatnonzero(lanes == lane)
        idx = idx[np.lexsort((ends[idx], starts[idx]))]
        row_end: list[float] = []
        row_tid: list[int] = []
        for k in idx.tolist():
            row = next((r for r, free_at in enumerate(row_end) if free_at <= starts[k]), len(row_end))
            if row == len(row_end):
                row_end.append(-math.inf)
                row_tid.append(lane if row == 0 else first_free_tid + len(extra))
                if row:
                    extra.append((lane, row, row_tid[-1]))
            row_end[row] = float(ends[k])
            tid[k] = row_tid[row]
    return tid, extra


# --------------------------------------------------------------------------------------------------
# Chrome trace
# --------------------------------------------------------------------------------------------------


def _processes(result: SimResult) -> tuple[list[tuple[int, str]], list[int]]:
    """Process ids and names, and the pid of every lane.

    Devices named ``"<machine>/<device>"`` are grouped into one process per machine (in order of first
    appearance); other devices share a ``"devices"`` process; link lanes go to a ``"network"`` process.

    Returns:
        ``([(pid, name), ...], lane_pid)`` where ``lane_pid[i]`` is the pid of lane ``i``.
    """
    lanes = result.tasks.lanes
    num_devices = _num_devices(result)
    pids: dict[str, int] = {}
    lane_pid: list[int] = []
    for i, lane in enumerate(lanes):
        if i < num_devices:
            group = lane.split("/", 1)[0] if "/" in lane else "devices"
        else:
            group = "network"
        if group not in pids:
            pids[group] = len(pids) + 1
        lane_pid.append(pids[group])
    if "network" in pids:  # keep the network process last whatever the lane order
        net = pids.pop("network")
        others = sorted(pids.items(), key=lambda kv: kv[1])
        renumber = {old: new for new, (_, old) in enumerate(others, start=1)}
        renumber[net] = len(others) + 1
        pids = {name: renumber[old] for name, old in others}
        pids["network"] = renumber[net]
        lane_pid = [renumber[p] for p in lane_pid]
    return sorted(((pid, name) for name, pid in pids.items())), lane_pid


def chrome_trace(result: SimResult, *, title: str = "placement-rl") -> dict[str, Any]:
    """A Chrome Trace Event Format document of one simulated training iteration.

    The document opens in Perfetto (ui.perfetto.dev) and ``chrome://tracing``. Layout:

    * one process per machine when device names look like ``"m0/gpu1"`` (else one ``"devices"``
      process) and one ``"network"`` process for the link directions;
    * one thread per lane, ``tid`` = lane index, ordered by lane index through ``thread_sort_index``;
      a communication task is on the lane of the first link direction it uses, and where such
      tasks overlap (flows sharing a link) the later ones go to extra threads ``"<lane> #2"``, ...;
    * one counter track per link direction that carried bytes (``"ph": "C"``, named after the
      lane, ``args.utilization`` the fraction of its capacity in use from ``ts`` on), and its bytes,
      busy time and utilization over the iteration in ``metadata["link_directions"]``;
    * one complete event (``"ph": "X"``) per task with positive, finite duration: ``ts``/``dur`` in
      microseconds, ``name`` ``"<op> [<kind>]"``, ``cat`` the kind, and ``args`` with ``kind``, ``op``,
      ``start_s``, ``end_s``, ``critical`` (bool: on the critical path) and, for communication tasks,
      ``bytes``.

    Zero-duration tasks are left out and tasks with non-finite times dropped; both are counted in
    ``metadata``. The document contains no NaN or infinity (non-finite summary figures become ``null``),
    so it survives ``json.dumps(..., allow_nan=False)``.

    Args:
        result: the simulation result.
        title: a name stored in ``metadata["title"]``.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``.
    """
    head, chunks, tail, metadata = _trace_parts(result, title)
    events = [*head, *(event for chunk in chunks for event in chunk), *tail]
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}


#: Task events built and written at a time by :func:`write_chrome_trace` (a plan over thousands of GPUs
#: has millions of tasks: their events are never all in memory at once).
TRACE_CHUNK_TASKS = 65_536


def _trace_parts(
    result: SimResult, title: str
) -> tuple[list[dict[str, Any]], Iterator[list[dict[str, Any]]], list[dict[str, Any]], dict[str, Any]]:
    """:func:`chrome_trace`'s document in parts: the process and thread events, the task events in
    chunks of :data:`TRACE_CHUNK_TASKS` (built as they are taken), the link counters, and the metadata."""
    tasks = result.tasks
    lanes = tasks.lanes
    num_devices = _num_devices(result)
    processes, lane_pid = _processes(result)

    events: list[dict[str, Any]] = []
    for pid, name in processes:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for i, lane in enumerate(lanes):
        pid = lane_pid[i]
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": lane}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": i, "args": {"sort_index": i}})

    start_s = np.asarray(tasks.start_s, dtype=np.float64)
    end_s = np.asarray(tasks.end_s, dtype=np.float64)
    finite = np.isfinite(start_s) & np.isfinite(end_s)
    dur_s = np.where(finite, end_s - start_s, 0.0)
    positive = finite & (dur_s > 0)
    lane_ok = (tasks.lane >= 0) & (tasks.lane < len(lanes))
    keep = np.flatnonzero(positive & lane_ok)
    critical = _critical_mask(result)
    compute = set(COMPUTE_KINDS)

    # threads: compute tasks on their device's lane; overlapping communication on extra rows of its lane
    tids = tasks.lane[keep].astype(np.int64)
    comm = np.flatnonzero(~np.isin(tasks.kind[keep], list(compute)) & (tids >= num_devices))
    rows, extra = _rows_of_lanes(tids[comm], start_s[keep][comm], end_s[keep][comm], len(lanes))
    tids[comm] = rows
    for home, row, tid in extra:
        pid = lane_pid[home]
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"{lanes[home]} #{row + 1}"}}
        )
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    micro = tasks.micro_batch[keep] if tasks.micro_batch.size else np.full(keep.size, -1, dtype=np.int64)
    all_bytes = np.asarray(tasks.num_bytes, dtype=np.float64)

    def task_chunks() -> Iterator[list[dict[str, Any]]]:
        for lo in range(0, keep.size, TRACE_CHUNK_TASKS):
            part = slice(lo, lo + TRACE_CHUNK_TASKS)
            idx = keep[part]
            sizes = all_bytes[idx]
            columns = (
                tasks.kind[idx].tolist(),
                tasks.op[idx].tolist(),
                tasks.lane[idx].tolist(),
                tids[part].tolist(),
                start_s[idx].tolist(),
                end_s[idx].tolist(),
                np.where(np.isfinite(sizes), sizes, 0.0).tolist(),
                critical[idx].tolist(),
                micro[part].tolist(),
            )
            chunk: list[dict[str, Any]] = []
            for k, op, lane, tid, s, e, b, c, mb in zip(*columns, strict=True):
                kind = TASK_KINDS[k] if 0 <= k < len(TASK_KINDS) else f"kind{k}"
                op_name = _op_label(result, op)
                args: dict[str, Any] = {"kind": kind, "op": op_name, "start_s": s, "end_s": e, "critical": c}
                if k not in compute:
                    args["bytes"] = b
                if mb >= 0:
                    args["micro_batch"] = mb
                chunk.append(
                    {
                        "ph": "X",
                        "name": f"{op_name} [{kind}]" if mb < 0 else f"{op_name} mb{mb} [{kind}]",
                        "cat": kind,
                        "pid": lane_pid[lane],
                        "tid": tid,
                        "ts": s * _US_PER_S,
                        "dur": (e - s) * _US_PER_S,
                        "args": args,
                    }
                )
            yield chunk

    counters: list[dict[str, Any]] = []

    directions = _directions(result)
    for direction in directions:
        for t, u in zip(*_utilization_steps(result, direction), strict=True):
            counters.append(
                {
                    "ph": "C",
                    "name": lanes[direction.lane],
                    "pid": lane_pid[direction.lane],
                    "tid": direction.lane,
                    "ts": float(t) * _US_PER_S,
                    "args": {"utilization": float(u)},
                }
            )

    oom = _oom_device_indices(result)
    peak = np.asarray(result.peak_memory_bytes, dtype=np.float64)
    cap = np.asarray(result.memory_capacity_bytes, dtype=np.float64)
    metadata: dict[str, Any] = {
        "title": title,
        "makespan_s": _finite_or_none(result.makespan_s),
        "num_tasks": len(tasks),
        "num_events": int(keep.size),
        "num_zero_duration_tasks": int(np.count_nonzero(finite & (dur_s == 0))),
        "num_nonfinite_tasks": int(np.count_nonzero(~finite)),
        "num_negative_duration_tasks": int(np.count_nonzero(finite & (dur_s < 0))),
        "num_critical_tasks": int(np.count_nonzero(critical)),
        "critical_path_length": int(np.asarray(result.critical_tasks).reshape(-1).shape[0]),
        "oom": bool(result.oom),
        "oom_devices": [result.device_names[d] for d in sorted(oom)],
        "comm_bytes": _finite_or_none(result.comm_bytes),
        "comm_time_s": _finite_or_none(result.comm_time_s),
        "devices": [
            {
                "name": name,
                "peak_memory_bytes": _finite_or_none(peak[d]) if d < peak.size else None,
                "memory_capacity_bytes": _finite_or_none(cap[d]) if d < cap.size else None,
                "oom": d in oom,
            }
            for d, name in enumerate(result.device_names)
        ],
        "lanes": list(lanes),
        "num_device_lanes": num_devices,
        "network": result.network,
        "link_directions": [
            {
                "name": lanes[d.lane],
                "bytes": _finite_or_none(d.num_bytes),
                "busy_s": _finite_or_none(d.busy_s),
                "capacity_bytes_per_s": _finite_or_none(d.capacity_bytes_per_s),
                "utilization": _finite_or_none(d.utilization),
            }
            for d in directions
        ],
    }
    return events, task_chunks(), counters, metadata


def write_chrome_trace(result: SimResult, path: str | os.PathLike[str], *, title: str = "placement-rl") -> None:
    """Write :func:`chrome_trace` as compact JSON to ``path``, creating parent directories.

    Args:
        result: the simulation result.
        path: output file, conventionally ``*.json``.
        title: a name stored in the document's metadata.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head, chunks, tail, metadata = _trace_parts(result, title)

    def dumps(value: Any) -> str:  # the C encoder on a whole chunk (json.dump streams through Python, ~3x slower)
        return json.dumps(value, allow_nan=False, separators=(",", ":"))

    with path.open("w", encoding="utf-8") as out:  # the same document as chrome_trace, a chunk of tasks at a time
        out.write('{"traceEvents":[')
        written = 0
        for part in itertools.chain([head], chunks, [tail]):  # the chunks one by one, never all at once
            if part:
                out.write(("," if written else "") + dumps(part)[1:-1])
                written += len(part)
        out.write(f'],"displayTimeUnit":"ms","metadata":{dumps(metadata)}}}')


# --------------------------------------------------------------------------------------------------
# Gantt chart
# --------------------------------------------------------------------------------------------------


class _LaneLabel(NamedTuple):
    """How one Gantt row is labelled.

    Attributes:
        lane: index into ``TaskTable.lanes``.
        text: the left tick label: the lane name, with ``" (OOM)"`` appended for a device that does not fit.
        memory_text: the right-hand label: ``"<peak> / <capacity> GiB"`` for devices; for a link
            direction that carried bytes, ``"<utilization>% of <capacity> GB/s"``; else ``""``.
        oom: whether the lane is a device whose peak memory exceeds its capacity.
    """

    lane: int
    text: str
    memory_text: str
    oom: bool


def _drawable(result: SimResult) -> np.ndarray:
    """``(T,)`` bool: tasks with finite times, non-negative duration and a valid lane."""
    tasks = result.tasks
    start_s = np.asarray(tasks.start_s, dtype=np.float64)
    end_s = np.asarray(tasks.end_s, dtype=np.float64)
    return (
        np.isfinite(start_s)
        & np.isfinite(end_s)
        & (end_s >= start_s)
        & (tasks.lane >= 0)
        & (tasks.lane < len(tasks.lanes))
    )


def _lane_labels(result: SimResult, lanes: list[int] | None = None) -> list[_LaneLabel]:
    """The Gantt row labels, top row first.

    Args:
        result: the simulation result.
        lanes: lane indices to label; by default, in lane order (devices first, then links), every
            device (an idle one as an empty row labelled ``(idle)``, up to :data:`MAX_IDLE_ROWS`
            devices in all; beyond that only devices with a drawable task or OOM), and every link
            direction with a drawable task of positive duration or that carried bytes (links that
            only carry zero-duration tasks would be empty rows).

    Returns:
        One :class:`_LaneLabel` per row.
    """
    tasks = result.tasks
    num_devices = _num_devices(result)
    oom = _oom_device_indices(result)
    if lanes is None:
        drawable = _drawable(result)
        positive = drawable & (tasks.end_s > tasks.start_s)
        used = set(np.unique(tasks.lane[drawable & (tasks.lane < num_devices)]).tolist())
        used |= set(np.unique(tasks.lane[positive]).tolist())
        used |= {d for d in oom if d < num_devices}
        if num_devices <= MAX_IDLE_ROWS:
            used |= set(range(num_devices))
        used |= {d.lane for d in _directions(result)}
        lanes = sorted(used)
    by_lane = {d.lane: d for d in _directions(result)}
    peak = np.asarray(result.peak_memory_bytes, dtype=np.float64)
    cap = np.asarray(result.memory_capacity_bytes, dtype=np.float64)
    labels: list[_LaneLabel] = []
    for lane in lanes:
        name = tasks.lanes[lane]
        if lane < num_devices:
            is_oom = lane in oom
            peak_gib = peak[lane] / _GIB if lane < peak.size else float("nan")
            cap_gib = cap[lane] / _GIB if lane < cap.size else float("nan")
            memory = f"{peak_gib:.2f} / {cap_gib:.2f} GiB" + (" OOM" if is_oom else "")
            idle = not bool(np.any(tasks.lane == lane))
            text = f"{name} (OOM)" if is_oom else f"{name} (idle)" if idle else name
            labels.append(_LaneLabel(lane, text, memory, is_oom))
        elif lane in by_lane:
            d = by_lane[lane]
            labels.append(
                _LaneLabel(lane, name, f"{d.utilization:.0%} of {d.capacity_bytes_per_s / 1e9:g} GB/s", False)
            )
        else:
            labels.append(_LaneLabel(lane, name, "", False))
    return labels


def _gantt_figure(result: SimResult, *, title: str = "", max_tasks: int = 200_000, dpi: int = 110) -> Figure:
    """Draw the Gantt chart on a new bare :class:`~matplotlib.figure.Figure` (see :func:`gantt_png`).

    The figure has an Agg canvas attached. Its first axes holds the bars; the left y tick labels are the
    :func:`_lane_labels` texts (red for OOM devices) and a secondary right axis shows peak memory.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tasks = result.tasks
    drawable = _drawable(result)
    start_s = np.asarray(tasks.start_s, dtype=np.float64)
    end_s = np.asarray(tasks.end_s, dtype=np.float64)
    labels = _lane_labels(result)  # rows: see _lane_labels; kept even if all their tasks are truncated away
    row_of_lane = {lab.lane: r for r, lab in enumerate(labels)}
    idx = np.flatnonzero(drawable)
    idx = idx[np.isin(tasks.lane[idx], np.fromiter(row_of_lane, dtype=np.int64, count=len(row_of_lane)))]
    num_drawable = int(idx.size)
    truncated = max_tasks >= 0 and num_drawable > max_tasks
    if truncated:
        dur = end_s[idx] - start_s[idx]
        if max_tasks == 0:
            idx = idx[:0]
        else:
            idx = np.sort(idx[np.argpartition(-dur, max_tasks - 1)[:max_tasks]])
    critical = _critical_mask(result)

    num_rows = max(len(labels), 1)
    height_in = min(40.0, max(3.0, 1.6 + 0.3 * num_rows))
    width_in = 14.0
    row_pt = (height_in - 1.6) * 72.0 / num_rows
    font_pt = float(np.clip(row_pt * 0.6, 2.0, 9.0))

    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)

    bar_height = 0.8
    lane_sel = tasks.lane[idx]
    kind_sel = tasks.kind[idx]
    start_ms = start_s[idx] * _MS_PER_S
    width_ms = (end_s[idx] - start_s[idx]) * _MS_PER_S
    crit_sel = critical[idx]
    kinds_present: set[int] = set()
    order = np.lexsort((kind_sel, lane_sel))  # group by lane, then kind
    lane_sorted, kind_sorted = lane_sel[order], kind_sel[order]
    bounds = np.flatnonzero(np.diff(lane_sorted) | np.diff(kind_sorted)) + 1
    for group in np.split(order, bounds) if order.size else []:
        lane, k = int(lane_sel[group[0]]), int(kind_sel[group[0]])
        y = row_of_lane[lane] - bar_height / 2
        colour = _KIND_COLOURS[k] if 0 <= k < len(_KIND_COLOURS) else "#7f7f7f"
        if np.any(width_ms[group] > 0):  # zero-width bars are invisible: keep them out of the legend
            kinds_present.add(k)
        ax.broken_barh(
            np.column_stack((start_ms[group], width_ms[group])),  # type: ignore[arg-type]  # (N, 2) is accepted
            (y, bar_height),
            facecolors=colour,
            edgecolors="none",
            linewidth=0,
        )
    if crit_sel.any():  # a black strip along the top of each critical bar: the bar's colour stays visible
        crit_idx = np.flatnonzero(crit_sel)
        crit_lanes = lane_sel[crit_idx]
        for lane in np.unique(crit_lanes).tolist():
            sel = crit_idx[crit_lanes == lane]
            ax.broken_barh(
                np.column_stack((start_ms[sel], width_ms[sel])),  # type: ignore[arg-type]  # (N, 2) is accepted
                (row_of_lane[lane] - bar_height / 2, bar_height * _CRITICAL_STRIP),
                facecolors="black",
                edgecolors="none",
                linewidth=0,
            )

    handles: list[Any] = [
        Patch(
            facecolor=_KIND_COLOURS[k] if 0 <= k < len(_KIND_COLOURS) else "#7f7f7f",
            label=TASK_KINDS[k] if 0 <= k < len(TASK_KINDS) else f"kind{k}",
        )
        for k in sorted(kinds_present)
    ]
    if crit_sel.any():
        handles.append(Patch(facecolor="black", label="critical path (black strip)"))
    # each link direction's utilization over time, as a grey area rising from the row's bottom
    drawn = False
    for direction in _directions(result):
        row = row_of_lane.get(direction.lane)
        if row is None:
            continue
        times, fraction = _utilization_steps(result, direction)
        bottom = row + bar_height / 2
        ax.fill_between(
            times * _MS_PER_S,
            bottom,
            bottom - bar_height * np.clip(fraction, 0.0, 1.0),
            step="post",
            facecolor="#7f7f7f",
            alpha=0.45,
            linewidth=0,
        )
        drawn = True
    if drawn:
        handles.append(Patch(facecolor="#7f7f7f", alpha=0.45, label="link utilization"))

    makespan_ms = result.makespan_s * _MS_PER_S
    x_max_ms = float(np.max(end_s[drawable])) * _MS_PER_S if num_drawable else 0.0
    if math.isfinite(makespan_ms):
        ax.axvline(makespan_ms, color="black", linestyle="--", linewidth=1.0)
        handles.append(Line2D([], [], color="black", linestyle="--", label=f"makespan {makespan_ms:.3f} ms"))
        x_max_ms = max(x_max_ms, makespan_ms)
    ax.set_xlim(0.0, x_max_ms * 1.02 if x_max_ms > 0 else 1.0)
    ax.set_ylim(num_rows - 0.5, -0.5)  # first lane at the top
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5, alpha=0.7)
    ax.set_axisbelow(True)

    rows = list(range(len(labels)))
    ax.set_yticks(rows, [lab.text for lab in labels], fontsize=font_pt)
    for tick, lab in zip(ax.get_yticklabels(), labels, strict=True):
        if lab.oom:
            tick.set_color("red")
            tick.set_fontweight("bold")
    if any(lab.memory_text for lab in labels):
        right = ax.secondary_yaxis("right")
        right.set_yticks(rows, [lab.memory_text for lab in labels], fontsize=font_pt)
        for tick, lab in zip(right.get_yticklabels(), labels, strict=True):
            if lab.oom:
                tick.set_color("red")
        right.set_ylabel("peak / capacity memory")
    if not labels:
        ax.text(0.5, 0.5, "no tasks", transform=ax.transAxes, ha="center", va="center")

    heading = title or f"{len(tasks)} tasks on {len(labels)} lanes"
    if truncated:
        heading += f" (showing the {int(idx.size)} longest of {num_drawable} tasks)"
    if result.oom:
        heading += " - OOM"
    ax.set_title(heading)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    return fig


def gantt_png(
    result: SimResult,
    path: str | os.PathLike[str],
    *,
    title: str = "",
    max_tasks: int = 200_000,
    dpi: int = 110,
) -> None:
    """Write a Gantt chart of the iteration as a PNG.

    One row per device and per link direction that carried anything (top to bottom), bars coloured
    by task kind with a legend, the x axis in milliseconds, the makespan as a dashed vertical line and
    critical-path tasks marked by a black strip along their top (the bar's colour stays visible);
    idle devices as empty rows labelled ``(idle)``. Device rows show peak / capacity memory in GiB on the right;
    OOM devices are marked ``(OOM)`` and red in the y tick labels. The figure grows 0.3 in per row, up to
    40 in, with the font shrinking when rows get thin.

    Args:
        result: the simulation result.
        path: output PNG file; parent directories are created.
        title: the chart title; by default the task and lane counts.
        max_tasks: draw at most this many tasks, the longest ones; the title says when some were left out.
        dpi: resolution in dots per inch.
    """
    fig = _gantt_figure(result, title=title, max_tasks=max_tasks, dpi=dpi)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
