"""Outputs of an experiment: the CSV and Markdown tables, the per-instance summary, the no-fit report
(:func:`write_outputs`).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from placement_rl.experiments.plots import MAX_ANYTIME_FILES, _per_instance, anytime_png, anytime_pngs, speedup_png
from placement_rl.experiments.spec import (
    ANYTIME_DIR,
    ANYTIME_PNG,
    CSV_FILE,
    MARKDOWN,
    SPEEDUP_PNG,
    SUMMARY_CSV,
    SUMMARY_MD,
    Experiment,
    _write_text,
)
from placement_rl.methods import DP_REFERENCES


# -------------------------------------------------------------------------------------- outputs
def reference_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The data-parallel references the rows have speedups over, in :data:`DP_REFERENCES` order."""
    found = {name for r in rows for name in (r.get("speedup_over") or {})}
    return [n for n in DP_REFERENCES if n in found] + sorted(found - set(DP_REFERENCES))


def csv_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    refs = reference_names(rows)
    return [
        "instance",
        "model",
        "topology",
        "batch_size",
        "devices",
        "method",
        "seed",
        "status",
        "makespan_s",
        "samples_per_s",
        *[f"speedup_over_{n}" for n in refs],
        "lower_bound_s",
        "headroom_captured",
        "max_peak_memory_bytes",
        "memory_over_bytes",
        "oom",
        "comm_bytes",
        "busiest_link_bytes",
        "devices_used",
        "search_s",
        "plan_file",
        "note",
    ]


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """``results.csv``: one line per row, speedups flattened to ``speedup_over_<reference>``."""
    columns = csv_columns(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        flat = {**r, **{f"speedup_over_{n}": v for n, v in (r.get("speedup_over") or {}).items()}}
        writer.writerow({k: ("" if flat.get(k) is None else flat.get(k)) for k in columns})
    return buffer.getvalue()


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (milliseconds, speedups, GiB, GB, seconds)."""
    refs = reference_names(rows)
    labels = {"data_parallel": "vs DP", "data_parallel_per_tensor": "vs DP per-tensor"}
    head = ["instance", "method", "seed", "ms/iter", *[labels.get(n, f"vs {n}") for n in refs]]
    head += ["bound ms", "headroom", "peak GiB", "busiest link GB", "comm GB", "OOM", "search s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["instance"], r["method"], _fmt(r["seed"], "d"), f"{r['status']}: {r['note']}"]
            cells += [""] * (len(head) - len(cells))
        else:
            speedups = r.get("speedup_over") or {}
            cells = [
                r["instance"],
                r["method"],
                _fmt(r["seed"], "d"),
                f"{r['makespan_s'] * 1e3:,.2f}",
                *[_fmt(speedups.get(n), ".2f", "x") for n in refs],
                f"{r['lower_bound_s'] * 1e3:,.2f}",
                _fmt(r["headroom_captured"], ".0%"),
                f"{r['max_peak_memory_bytes'] / 2**30:.2f}",
                f"{r['busiest_link_bytes'] / 1e9:.2f}",
                f"{r['comm_bytes'] / 1e9:.2f}",
                "yes" if r["oom"] else "no",
                f"{r['search_s']:.1f}",
            ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per method: cells, instances, the geometric-mean speedup over each data-parallel reference
    (over instances where its plan fits; a seeded method counts its median seed), wins (instances
    where its fitting plan is the fastest, ties shared), OOM count (cells), median headroom captured
    and median search seconds."""
    by_instance = _per_instance(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    refs = reference_names(rows)
    wins = dict.fromkeys(methods, 0)
    for per_method in by_instance.values():
        fitting = {m: r["makespan_s"] for m, r in per_method.items() if not r["oom"]}
        if fitting:
            best = min(fitting.values())
            for m, makespan in fitting.items():
                if makespan <= best * (1 + 1e-9):
                    wins[m] += 1
    summary = []
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        medians = [per[m] for per in by_instance.values() if m in per]
        fits = [r for r in medians if not r["oom"]]
        entry: dict[str, Any] = {
            "method": m,
            "cells": len(mine),
            "ok": sum(r["status"] == "ok" for r in mine),
            "unavailable": sum(r["status"] == "unavailable" for r in mine),
            "errors": sum(r["status"] == "error" for r in mine),
            "instances": len(medians),
            "instances_fit": len(fits),
        }
        for n in refs:
            values = [r["speedup_over"][n] for r in fits if n in (r.get("speedup_over") or {})]
            entry[f"geomean_speedup_over_{n}"] = (
                math.exp(statistics.fmean(math.log(v) for v in values)) if values else None
            )
        headrooms = [r["headroom_captured"] for r in fits if r["headroom_captured"] is not None]
        entry["wins"] = wins[m]
        entry["oom_cells"] = sum(bool(r["oom"]) for r in mine if r["status"] == "ok")
        entry["median_headroom_captured"] = statistics.median(headrooms) if headrooms else None
        searches = [r["search_s"] for r in mine if r["status"] == "ok"]
        entry["median_search_s"] = statistics.median(searches) if searches else None
        summary.append(entry)
    return summary


def no_fit(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The instances where no method found a plan that fits in memory, each with the plan that needs
    the least: ``instance``, ``method`` (and ``seed``), ``memory_over_bytes`` (how far its fullest
    device is over), that ``device`` with its ``peak_bytes`` and ``capacity_bytes`` (``None`` in rows
    of earlier versions, which lack the capacities), and ``plans`` (the rows that ran)."""
    out = []
    for inst, group in _group(r for r in rows if r["status"] == "ok").items():
        if any(not r["oom"] for r in group):
            continue
        best = min(group, key=lambda r: (_over(r)[0], r["max_peak_memory_bytes"], r["makespan_s"]))
        over, device, peak, capacity = _over(best)
        out.append(
            {
                "instance": inst,
                "method": best["method"],
                "seed": best["seed"],
                "memory_over_bytes": over,
                "device": device,
                "peak_bytes": peak,
                "capacity_bytes": capacity,
                "plans": len(group),
            }
        )
    return out


def _group(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["instance"], []).append(r)
    return groups


def _over(row: Mapping[str, Any]) -> tuple[float, str | None, float | None, float | None]:
    """(bytes over memory on the fullest device, that device, its peak, its capacity) of a row."""
    peaks = row.get("peak_memory_bytes") or {}
    capacities = row.get("memory_capacity_bytes") or {}
    shared = [d for d in peaks if isinstance(capacities.get(d), (int, float)) and isinstance(peaks[d], (int, float))]
    if not shared:
        return float(row.get("memory_over_bytes") or 0), None, None, None
    device = max(shared, key=lambda d: peaks[d] - capacities[d])
    return max(peaks[device] - capacities[device], 0), device, peaks[device], capacities[device]


def no_fit_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per instance where no plan fits in memory (:func:`no_fit`)."""
    from placement_rl.plots import format_bytes

    lines = []
    for n in no_fit(rows):
        seed = "" if n["seed"] is None else f" (seed {n['seed']})"
        where = (
            f" on {n['device']} (peak {format_bytes(n['peak_bytes'])} of {format_bytes(n['capacity_bytes'])})"
            if n["device"] is not None
            else ""
        )
        lines.append(
            f"{n['instance']}: no method found a plan that fits in memory ({n['plans']} plans); the least-memory "
            f"plan is {n['method']}{seed}, {format_bytes(n['memory_over_bytes'])} over{where}; "
            "`placement-rl plan` on this instance suggests what would fit"
        )
    return lines


def summary_markdown(summary: Sequence[Mapping[str, Any]]) -> str:
    """The per-method summary as a Markdown table."""
    refs = [k[len("geomean_speedup_over_") :] for k in (summary[0] if summary else {}) if k.startswith("geomean_")]
    labels = {"data_parallel": "geomean vs DP", "data_parallel_per_tensor": "geomean vs DP per-tensor"}
    head = ["method", "instances (fit)", *[labels.get(n, f"geomean vs {n}") for n in refs]]
    head += ["wins", "OOM cells", "median headroom", "median search s", "not run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        not_run = []
        if s["unavailable"]:
            not_run.append(f"{s['unavailable']} unavailable")
        if s["errors"]:
            not_run.append(f"{s['errors']} errors")
        cells = [
            s["method"],
            f"{s['instances']} ({s['instances_fit']})",
            *[_fmt(s[f"geomean_speedup_over_{n}"], ".2f", "x") for n in refs],
            s["wins"],
            s["oom_cells"],
            _fmt(s["median_headroom_captured"], ".0%"),
            _fmt(s["median_search_s"], ".1f"),
            ", ".join(not_run) or "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, experiment: Experiment, rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """Write ``results.csv``, ``results.md``, ``summary.csv``, ``summary.md`` and the PNGs from ``rows``."""
    summary = summarize(rows)
    files = [out / CSV_FILE, out / MARKDOWN, out / SUMMARY_CSV, out / SUMMARY_MD]
    _write_text(files[0], csv_text(rows))
    title = f"# {experiment.name}\n\n" + (f"{experiment.description.strip()}\n\n" if experiment.description else "")
    unfit = "".join(f"\n- {line}\n" for line in no_fit_lines(rows))
    _write_text(files[1], title + markdown_table(rows) + "\n" + summary_markdown(summary) + unfit)
    buffer = io.StringIO()
    if summary:
        writer = csv.DictWriter(buffer, list(summary[0]), lineterminator="\n")
        writer.writeheader()
        for s in summary:
            writer.writerow({k: ("" if v is None else v) for k, v in s.items()})
    _write_text(files[2], buffer.getvalue())
    _write_text(files[3], summary_markdown(summary) + unfit)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        files.append(speedup_png(ok, out / SPEEDUP_PNG, title=f"{experiment.name}: speedup over data parallelism"))
        files.append(anytime_png(ok, out / ANYTIME_PNG, title=f"{experiment.name}: best makespan vs search time"))
        per_instance = list(dict.fromkeys(r["instance"] for r in ok))[:MAX_ANYTIME_FILES]
        files.extend(
            anytime_pngs([r for r in ok if r["instance"] in per_instance], out / ANYTIME_DIR, f"{experiment.name}: ")
        )
    return files
