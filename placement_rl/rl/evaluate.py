"""Evaluate a trained policy on (unseen) topologies and models next to the baselines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from placement_rl.rl.trinity import load_policy, policy_plan


@dataclass(frozen=True)
class MethodResult:
    """One method's plan on one instance."""

    instance: str
    method: str
    makespan_s: float
    speedup: float
    peak_memory_bytes: int
    comm_bytes: float
    oom: bool
    search_s: float


def evaluate(
    checkpoint: str,
    topologies: Sequence[str],
    models: Sequence[str] | None = None,
    *,
    mcmc_budget: str | int | None = "2s",
    progress: Callable[[str], None] | None = None,
) -> list[MethodResult]:
    """Run the policy deterministically on every (model, topology) and the baselines beside it.

    Args:
        checkpoint: a ``checkpoint_*`` folder of a training run.
        topologies: topology specs (presets, ``random:SEED``, files).
        models: zoo models (default: the training config's generator model(s)).
        mcmc_budget: MCMC's budget per instance (``None`` skips MCMC).

    Returns:
        Rows for ``policy``, ``dp``, ``expert`` and ``mcmc`` per instance.
    """
    import time

    import gymnasium as gym

    from placement_rl import simulate
    from placement_rl.plan import expert
    from placement_rl.search import mcmc

    module, cfg = load_policy(checkpoint)
    if models is None:
        gen = cfg.env.get("generator") or {}
        models = (
            [gen["model"]] if isinstance(gen, dict) and gen.get("model") else list(gen.get("models", ["inception_v3"]))
        )
    rows: list[MethodResult] = []
    base_env = {k: v for k, v in cfg.env.items() if k != "generator"}
    for model in models:
        for topo in topologies:
            env = gym.make(
                "placement_rl/Placement-v0",
                config={**base_env, "generator": {"kind": "fixed", "model": model, "topology": topo}},
            )
            info = policy_plan(module, env)
            inst = env.unwrapped.data.instance  # type: ignore[attr-defined]
            name = inst.name
            dp = env.unwrapped.data.baseline  # type: ignore[attr-defined]

            def row(method: str, result: Any, search_s: float, name: str = name, dp: Any = dp) -> MethodResult:
                return MethodResult(
                    name,
                    method,
                    result.makespan_s,
                    dp.makespan_s / result.makespan_s,
                    int(result.peak_memory_bytes.max()),
                    result.comm_bytes,
                    result.oom,
                    search_s,
                )

            policy_result = simulate(inst.graph, inst.topology, info["plan"], validate=False)
            rows.append(row("policy", policy_result, info["search_s"]))
            rows.append(row("dp", dp, 0.0))
            start = time.perf_counter()
            ex = simulate(inst.graph, inst.topology, expert(inst.graph, inst.topology))
            rows.append(row("expert", ex, time.perf_counter() - start))
            if mcmc_budget is not None:
                start = time.perf_counter()
                found = mcmc(inst.graph, inst.topology, budget=mcmc_budget, seed=0, progress=False)
                rows.append(row("mcmc", found.result, time.perf_counter() - start))
            if progress is not None:
                progress(
                    f"{name}: policy {policy_result.makespan_s * 1e3:.1f} ms, "
                    f"{dp.makespan_s / policy_result.makespan_s:.2f}x over data parallel"
                )
    return rows
