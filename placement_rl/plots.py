"""Plots (PNG): FT's cost frontier (TensorOpt Fig. 6) and profiling curve (Fig. 8), and the learning
curve of a training run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

GIB = 2**30


def pyplot() -> Any:
    """matplotlib.pyplot with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, title: str = "") -> Path:
    """Title the figure (if given), lay it out, write it as PNG at 110 dpi and close it."""
    if title and len(fig.axes) > 1:
        fig.suptitle(title)
    elif title:
        fig.axes[0].set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def memory_unit(largest_bytes: float) -> tuple[float, str]:
    """(bytes per unit, unit) that shows ``largest_bytes`` with a few digits: GiB, MiB or KiB."""
    for scale, unit in ((GIB, "GiB"), (2**20, "MiB")):
        if largest_bytes >= scale:
            return float(scale), unit
    return 1024.0, "KiB"


def format_bytes(num_bytes: float) -> str:
    """``12.50 GiB``, ``3.20 MiB`` or ``512 B``: binary units, the largest that keeps the number >= 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def frontier_png(
    estimate: Sequence[tuple[float, float]],
    path: str | Path,
    *,
    simulated: Sequence[tuple[float, float]] = (),
    baselines: Mapping[str, tuple[float, float]] | None = None,
    memory_limit_bytes: float | None = None,
    title: str = "",
) -> Path:
    """The cost frontier: memory per device (GiB) against time per iteration (ms).

    Args:
        estimate: FT's (memory_bytes, time_s) points, sorted by memory (drawn as a step line).
        simulated: the same plans re-evaluated by the simulator (peak memory, makespan).
        baselines: name -> simulated (peak memory bytes, makespan s), e.g. data parallel, expert, MCMC.
        memory_limit_bytes: a vertical line at the device memory.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    data_bytes = [m for m, _ in (*estimate, *simulated, *(baselines or {}).values())]
    scale, unit = memory_unit(max(data_bytes, default=GIB))
    mem = [m / scale for m, _ in estimate]
    time = [t * 1e3 for _, t in estimate]
    ax.step(mem, time, where="post", color="tab:blue", label="FT frontier (estimate)")
    ax.scatter(mem, time, color="tab:blue", s=10)
    if simulated:
        ax.scatter(
            [m / scale for m, _ in simulated],
            [t * 1e3 for _, t in simulated],
            marker="x",
            color="tab:cyan",
            s=18,
            label="frontier plans, simulated",
        )
    markers = iter(["o", "s", "^", "D", "v", "P"])
    for name, (m, t) in (baselines or {}).items():
        ax.scatter([m / scale], [t * 1e3], marker=next(markers, "o"), s=50, label=f"{name} (simulated)", zorder=3)
    if memory_limit_bytes is not None:
        top = max(data_bytes, default=0.0)
        if memory_limit_bytes <= 1.5 * top:  # on the chart without squeezing the data into a corner
            ax.axvline(memory_limit_bytes / scale, color="gray", linestyle="--", linewidth=1, label="device memory")
        else:
            ax.annotate(
                f"device memory {memory_limit_bytes / GIB:.0f} GiB (off the chart)",
                xy=(0.98, 0.97),
                xycoords="axes fraction",
                ha="right",
                va="top",
                fontsize=8,
                color="gray",
            )
    ax.set_xlabel(f"memory per device ({unit})")
    ax.set_ylabel("time per iteration (ms)")
    times = [t for _, t in (*estimate, *simulated, *(baselines or {}).values()) if t > 0]
    if times and max(times) > 10 * min(times):  # a log axis only where the times span a decade
        ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return save_png(fig, path, title)


def profiling_png(rows: Sequence[tuple[int, float | None]], path: str | Path, title: str = "") -> Path:
    """Best time per iteration (ms) against the number of GPUs (None: nothing fits)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    fits = [(n, t) for n, t in rows if t is not None]
    ax.plot([n for n, _ in fits], [t * 1e3 for _, t in fits], marker="o", color="tab:blue", label="FT mini-time")
    oom = [n for n, t in rows if t is None]
    if oom:
        ax.scatter(
            oom,
            [min((t for _, t in fits), default=1.0) * 1e3] * len(oom),
            marker="x",
            color="tab:red",
            label="no strategy fits",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks([n for n, _ in rows], [str(n) for n, _ in rows])
    ax.set_xlabel("number of GPUs")
    ax.set_ylabel("best time per iteration (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path, title)


def learning_curve_png(rows: Sequence[Mapping[str, float]], path: str | Path, title: str = "") -> Path:
    """Mean episode return and mean / best speedup over data parallelism per training iteration."""
    plt = pyplot()
    steps = [r["env_steps"] for r in rows]
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_r.plot(steps, [r["episode_return_mean"] for r in rows], color="tab:blue")
    ax_r.set_xlabel("sampled plans")
    ax_r.set_ylabel("mean episode return")
    ax_r.grid(alpha=0.3)
    ax_s.plot(steps, [r["speedup_mean"] for r in rows], label="mean", color="tab:green")
    best = [r["best_speedup"] for r in rows]
    if any(math.isfinite(b) for b in best):
        ax_s.plot(steps, best, label="best in iteration", color="tab:orange", alpha=0.7)
    ax_s.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="data parallel")
    ax_s.set_xlabel("sampled plans")
    ax_s.set_ylabel("speedup over data parallel")
    ax_s.legend(loc="best", fontsize=8)
    ax_s.grid(alpha=0.3)
    return save_png(fig, path, title)
