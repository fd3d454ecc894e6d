"""Plots of training runs (PNG)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path


def learning_curve_png(rows: Sequence[Mapping[str, float]], path: str | Path, title: str = "") -> Path:
    """Mean episode return and mean / best speedup over data parallelism per training iteration."""
    from placement_rl.plots import pyplot, save_png

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
