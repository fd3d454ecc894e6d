"""Evaluate a trained policy on (unseen) topologies and models next to the baselines.

A thin view of ``compare`` (:mod:`placement_rl.experiments`): one experiment of the policy (a method
named after its agent), data parallelism, the expert strategy and, optionally, MCMC at a fixed
budget, over models x topologies; its cells run one after the other in this process and give the
same rows as ``placement-rl compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from placement_rl.experiments import Measured, measure_cells, parse_experiment, prepare
from placement_rl.methods import MethodResult
from placement_rl.sim import CostModel


def evaluate_cells(
    checkpoint: str,
    topologies: Sequence[str],
    models: Sequence[str] | None = None,
    *,
    mcmc_budget: Any = "2s",
    env: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    cost_model: CostModel | None = None,
) -> list[Measured]:
    """Run the policy deterministically on every (model, topology) and the baselines beside it.

    Args:
        checkpoint: a ``checkpoint_*`` folder of a training run (only its safe policy export is read).
        topologies: topology specs (presets, ``random:SEED``, ``test:N``, files).
        models: zoo models (default: the training config's generator model(s)).
        mcmc_budget: MCMC's budget per instance (``None`` skips MCMC).
        env: env options the policy plans with other than its training's (``{"max_groups": 60}``;
            :func:`placement_rl.rl.policy.with_env` lists those that may change).
        progress: called with one line per instance.
        cost_model: the model every plan is simulated under (default: the simulator's); the policy
            plans in its env as trained.

    Returns:
        The cells (rows in ``compare``'s format, with their results): the policy (named after its
        agent), ``data_parallel``, ``expert`` and ``mcmc``, per instance.
    """
    from placement_rl.rl.agents import agent_names
    from placement_rl.rl.compare import check_learned, checkpoint_agent, resolve_method

    agent, trained_on = checkpoint_agent(checkpoint)
    learned: dict[str, Any] = {"method": agent, "checkpoint": str(checkpoint)}
    if env:
        learned["env"] = dict(env)
    methods: list[Any] = [learned, "data_parallel", "expert"]
    if mcmc_budget is not None:
        methods.append({"method": "mcmc", "budget": mcmc_budget})
    document = {
        "models": list(models or trained_on),
        "topologies": list(topologies),
        "methods": methods,
        "seeds": [0],
    }
    experiment = parse_experiment(document, "evaluate", agents=agent_names(), name="evaluate")
    prepared = prepare(experiment, "evaluate", cost_model=cost_model)
    check_learned(prepared, "evaluate")

    def report(measured: Measured) -> None:
        if progress is not None and measured.row["method"] == agent:
            r = measured.result
            progress(
                f"{measured.row['instance']}: {r.method} {r.makespan_s * 1e3:.1f} ms, "
                f"{r.speedup_over_dp:.2f}x over data parallel"
            )

    return measure_cells(prepared, resolve=resolve_method, on_result=report)


def evaluate(
    checkpoint: str,
    topologies: Sequence[str],
    models: Sequence[str] | None = None,
    *,
    mcmc_budget: Any = "2s",
    env: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    cost_model: CostModel | None = None,
) -> list[MethodResult]:
    """:func:`evaluate_cells`' results (plans and simulations), in cell order."""
    cells = evaluate_cells(
        checkpoint, topologies, models, mcmc_budget=mcmc_budget, env=env, progress=progress, cost_model=cost_model
    )
    return [m.result for m in cells]
