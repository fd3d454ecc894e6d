"""Evaluate a trained policy on (unseen) topologies and models next to the baselines.

One :func:`placement_rl.methods.compare_methods` per instance: the policy (a method named after its
agent), data parallelism, the expert strategy and, optionally, MCMC at a fixed budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from placement_rl.methods import MethodResult, compare_methods
from placement_rl.rl.agents import load_policy, policy_method


def training_models(env: dict[str, Any]) -> list[str]:
    """The zoo models a training config's generator drew from."""
    gen = env.get("generator") or {}
    if not isinstance(gen, dict):
        return ["inception_v3"]
    if gen.get("model"):
        return [gen["model"]]
    return list(gen.get("models", ["inception_v3"]))


def evaluate(
    checkpoint: str,
    topologies: Sequence[str],
    models: Sequence[str] | None = None,
    *,
    mcmc_budget: Any = "2s",
    progress: Callable[[str], None] | None = None,
) -> list[MethodResult]:
    """Run the policy deterministically on every (model, topology) and the baselines beside it.

    Args:
        checkpoint: a ``checkpoint_*`` folder of a training run (only its safe policy export is read).
        topologies: topology specs (presets, ``random:SEED``, files).
        models: zoo models (default: the training config's generator model(s)).
        mcmc_budget: MCMC's budget per instance (``None`` skips MCMC).
        progress: called with one line per instance.

    Returns:
        Rows for the policy (named after its agent), ``data_parallel``, ``expert`` and ``mcmc`` per instance.
    """
    from placement_rl import zoo
    from placement_rl.topology import resolve_topology

    policy = load_policy(checkpoint)
    method = policy_method(policy)
    if models is None:
        models = training_models(dict(policy.config.env))
    methods: list[Any] = [method, "data_parallel", "expert"]
    options = {}
    if mcmc_budget is not None:
        methods.append("mcmc")
        options["mcmc"] = {"budget": mcmc_budget, "seed": 0}
    rows: list[MethodResult] = []
    for model in models:
        graph = zoo.load(model)
        for spec in topologies:
            found = compare_methods(graph, resolve_topology(spec), methods, options=options)
            rows.extend(found)
            if progress is not None:
                mine = found[0]
                progress(
                    f"{mine.instance}: {mine.method} {mine.makespan_s * 1e3:.1f} ms, "
                    f"{mine.speedup_over_dp:.2f}x over data parallel"
                )
    return rows
