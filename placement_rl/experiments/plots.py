"""The PNGs of an experiment: speedups per instance and anytime curves."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The most instances the PNGs draw one by one (bars, anytime panels); more become a heat map / the first ones.
MAX_BAR_INSTANCES, MAX_ANYTIME_PANELS = 24, 12
#: The most instances that get their own anytime PNG (the first ones; a file takes ~0.3 s to draw).
MAX_ANYTIME_FILES = 48


def _per_instance(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """instance -> method -> the median-makespan row over its seeds (ok rows only)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["instance"], r["method"]), []).append(r)
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for (inst, method), group in groups.items():
        ordered = sorted(group, key=lambda r: r["makespan_s"])
        out.setdefault(inst, {})[method] = ordered[(len(ordered) - 1) // 2]
    return out


def speedup_png(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Speedup over data parallelism per instance and method: grouped bars (hatched: does not fit),
    or a heat map for many instances. A seeded method shows its median seed."""
    import numpy as np

    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    by_instance = _per_instance(rows)
    instances = list(by_instance)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    values = np.full((len(instances), len(methods)), np.nan)
    oom = np.zeros_like(values, dtype=bool)
    for i, inst in enumerate(instances):
        for j, m in enumerate(methods):
            r = by_instance[inst].get(m)
            if r is not None:
                values[i, j], oom[i, j] = r["speedup_over_dp"], r["oom"]
    if len(instances) <= MAX_BAR_INSTANCES:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(instances) * max(1, len(methods)) / 3 + 2), 4.5))
        width = 0.8 / max(len(methods), 1)
        x = np.arange(len(instances))
        for j, m in enumerate(methods):
            bars = ax.bar(x + (j - (len(methods) - 1) / 2) * width, np.nan_to_num(values[:, j]), width, label=m)
            for bar, bad in zip(bars, oom[:, j], strict=True):
                if bad:
                    bar.set_hatch("//")
                    bar.set_alpha(0.5)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(
            x, instances, rotation=30 if len(instances) > 3 else 0, ha="right" if len(instances) > 3 else "center"
        )
        ax.set_ylabel("speedup over data parallelism (x)")
        ax.legend(fontsize="small", ncols=min(len(methods), 4))
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(methods) + 2), max(4.0, 0.2 * len(instances) + 1.5)))
        logv = np.log2(np.where(values > 0, values, np.nan))
        limit = float(np.nanmax(np.abs(logv))) if np.isfinite(logv).any() else 1.0
        image = ax.imshow(logv, aspect="auto", cmap="RdBu", vmin=-limit, vmax=limit)
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set_yticks(range(len(instances)), instances, fontsize="x-small")
        bar = fig.colorbar(image, ax=ax)
        bar.set_label("log2 speedup over data parallelism")
    return save_png(fig, path, title)


def anytime_png(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Best-found makespan against search time per method, one panel per instance (the first
    :data:`MAX_ANYTIME_PANELS`): a search's trace as a step line per seed, a method without a trace
    as a point at (search seconds, makespan); dashed: data parallelism, dotted: the compute bound."""
    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    instances = list(dict.fromkeys(r["instance"] for r in rows))[:MAX_ANYTIME_PANELS]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = {m: f"C{k % 10}" for k, m in enumerate(methods)}
    cols = min(len(instances), 3)
    nrows = math.ceil(len(instances) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), squeeze=False)
    for ax, inst in zip(axes.flat, instances, strict=False):
        draw_anytime(ax, [r for r in rows if r["instance"] == inst], colors)
        ax.set_title(inst, fontsize="small")
    for ax in list(axes.flat)[len(instances) :]:
        ax.set_visible(False)
    return save_png(fig, path, title)


def draw_anytime(
    ax: Any,
    rows: Sequence[Mapping[str, Any]],
    colors: Mapping[str, str] | None = None,
    ylim_ms: tuple[float, float] | None = None,
) -> None:
    """One instance's anytime chart on ``ax`` (see :func:`anytime_png`); x is logarithmic, since the
    searches improve fastest early, and so is y where the makespans span more than a decade. ``rows``
    are :func:`cell_row` dicts (``anytime``, ``search_s``, ``makespan_s``, ``oom``, ``dp_makespan_s``,
    ``lower_bound_s``). ``ylim_ms``: a linear y range (a zoom) instead."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = colors or {m: f"C{k % 10}" for k, m in enumerate(methods)}
    labelled: set[str] = set()
    for r in rows:
        label = None if r["method"] in labelled else r["method"]
        labelled.add(r["method"])
        trace = [(t, c) for t, c in r.get("anytime") or [] if c is not None and math.isfinite(c)]
        if trace:
            xs = [max(t, 1e-3) for t, _ in trace]
            ys = [c * 1e3 for _, c in trace]
            ax.step(xs, ys, where="post", color=colors[r["method"]], label=label, alpha=0.8)
        else:
            ax.plot(
                [max(r["search_s"], 1e-3)],
                [r["makespan_s"] * 1e3],
                marker="x" if r["oom"] else "o",
                linestyle="none",
                color=colors[r["method"]],
                label=label,
            )
    ax.axhline(rows[0]["dp_makespan_s"] * 1e3, color="black", linestyle="--", linewidth=0.8, label="data parallel")
    ax.axhline(rows[0]["lower_bound_s"] * 1e3, color="grey", linestyle=":", linewidth=0.8, label="compute bound")
    ax.set_xscale("log")
    shown = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y) and y > 0]
    if ylim_ms is not None:
        ax.set_ylim(*ylim_ms)
    elif shown and max(shown) > 10 * min(shown):  # a log axis only where the makespans span a decade
        ax.set_yscale("log")
    ax.set_xlabel("search s")
    ax.set_ylabel("best makespan ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small")


def anytime_pngs(rows: Sequence[Mapping[str, Any]], folder: Path, title: str = "") -> list[Path]:
    """One anytime PNG per instance (:func:`draw_anytime`), ``folder/<instance>.png``; the colours of the
    methods are the same in every file. ``title`` is prefixed to each instance's name. Where a curve
    ends above 1.5x data parallelism (a learner far from the searches), a second panel zooms in on the
    plans near data parallelism."""
    from placement_rl.paths import safe_name
    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = {m: f"C{k % 10}" for k, m in enumerate(methods)}
    files = []
    for inst in dict.fromkeys(r["instance"] for r in rows):
        mine = [r for r in rows if r["instance"] == inst]
        dp_ms = mine[0]["dp_makespan_s"] * 1e3
        zoom = any(r["makespan_s"] * 1e3 > 1.5 * dp_ms for r in mine)
        if not zoom:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            draw_anytime(ax, mine, colors)
            files.append(save_png(fig, folder / f"{safe_name(inst)}.png", f"{title}{inst}"))
            continue
        fig, (ax, near) = plt.subplots(1, 2, figsize=(11.5, 4.2))
        draw_anytime(ax, mine, colors)
        best_ms = min(min(r["makespan_s"] * 1e3 for r in mine), dp_ms)
        draw_anytime(near, mine, colors, ylim_ms=(best_ms - 0.03 * dp_ms, 1.03 * dp_ms))
        ax.set_title("all methods", fontsize="small")
        near.set_title("near data parallelism (linear)", fontsize="small")
        near.get_legend().remove()
        files.append(save_png(fig, folder / f"{safe_name(inst)}.png", f"{title}{inst}"))
    return files
