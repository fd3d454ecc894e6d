"""The ``ppo_tag`` agent: RLlib PPO on ``Placement-v0``'s sequential TAG action space.

Trinity's one-shot action (a device per group of whole ops) cannot express the plans that beat
data parallelism on the presets: those mix replication with placement. This agent acts in the
action space TAG's tree search uses (``mode: sequential``, ``action_space: tag``): one step per op
group, in descending compute time, choosing a subset of device groups (machines) and a replication
option: TAG's four (all-reduce, parameter server, duplicate, model parallel), or with the env's
``tag_options: extended`` also tensor parallel, pipeline and FSDP (ZeRO-3). Undecided groups
are completed by the env's ``tag_completion`` (default: the best of TAG's rule, data parallelism
over the decided device groups and a list-scheduling rollout, :mod:`placement_rl.search.tag`), so every
prefix is a complete plan and the ``dense`` reward pays each step the drop of that plan's simulated
makespan, relative to data parallelism (the episode starts from data parallelism, so its return is
``1 - 1 / speedup``, minus 1 when the final plan runs out of memory).

Planning on an instance larger than the training config's padding (more op-group edges, devices
or device groups) raises those sizes for the instance (:func:`placement_rl.rl.policy.policy_env`):
the GNN's weights do not depend on them.

The policy is TAG's heterogeneous GNN (:class:`placement_rl.policies.tag.TagRLModule`) with its
value head: the same RLModule conventions as Trinity's (new API stack, value API), the env's
action mask applied as a ``-1e9`` logit, RLlib's categorical distribution over the masked logits.
Training is plain RLlib PPO (clipped objective, GAE); there is no tree search, in training or in
planning. :func:`act` decodes greedily (the most likely allowed action at each step); with
``act.samples > 0`` it also rolls out that many sampled episodes (seeded) and keeps the best plan
by the env's simulation, preferring plans that fit in memory. With ``act.partial_plans`` the
candidates are every plan the episodes scored, not only their final ones: each step's partial plan
was completed and simulated by the env (the root's completion included), and the best of those,
replayed as a full decision list, is the result.

Importing this module registers the agent ``ppo_tag`` (:mod:`placement_rl.rl.agents`). Its YAML
sections are ``model`` (:class:`placement_rl.rl.tag.ModelSection`, the GNN's sizes), ``ppo``
(:class:`PPOSection`) and ``act`` (:class:`ActSection`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.config import choice, integer, number, option
from placement_rl.rl.agents import PADDED_SIZES, Agent, register_agent
from placement_rl.rl.config import TrainConfig
from placement_rl.rl.tag import ENV_ID, ENV_OPTIONS, ModelSection, replay
from placement_rl.rl.trinity import PPOSection as TrinityPPOSection


@dataclass(frozen=True)
class PPOSection(TrinityPPOSection):
    """RLlib PPO's training options (Trinity's keys; an env step is one op group's decision)."""

    lr: float = option(3e-4, rule=number(0, low_open=True))
    """Adam learning rate."""
    entropy_coeff: float = option(0.01, rule=number(0))
    """Entropy bonus (keeps the first decisions, which set TAG's rule for the rest, exploring)."""
    train_batch_size: int = option(400, rule=integer(1))
    """Env steps (op-group decisions) per training iteration."""
    minibatch_size: int = option(100, rule=integer(1))
    """SGD minibatch size (env steps)."""
    vf_clip_param: float = option(10.0, rule=number(0, low_open=True))
    """Clip of the value loss (returns are within a few units)."""
    gamma: float = option(1.0, rule=number(0, 1))
    """Discount (1: the return is the whole plan's improvement over data parallelism)."""
    lambda_: float = option(0.95, rule=number(0, 1))
    """GAE lambda (YAML key ``lambda_``)."""


@dataclass(frozen=True)
class ActSection:
    """How :func:`act` plans with the trained policy (``evaluate``, ``plan --checkpoint``)."""

    samples: int = option(0, rule=integer(0, 10_000))
    """Sampled episodes beside the greedy one; the best plan by simulation is kept (0: greedy only)."""
    seed: int = option(0, rule=integer(0))
    """Seed of the sampled episodes."""
    partial_plans: bool = option(False, rule=choice((False, True)))
    """Also consider the completed plans the episodes scored on the way (every prefix's completion,
    free: the env simulated them); the best one is replayed as the result (false: final plans only)."""


def algorithm_config(cfg: TrainConfig) -> Any:
    """The RLlib ``PPOConfig`` of a training config (new API stack, :class:`TagRLModule` with a value head)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from placement_rl.policies.tag import TagRLModule
    from placement_rl.rl.trinity import ppo_algorithm_config

    spec = RLModuleSpec(module_class=TagRLModule, model_config=cfg.model.model_config(True))
    ppo: PPOSection = cfg.ppo
    return ppo_algorithm_config(cfg, spec, smoothing_episodes=max(1, ppo.train_batch_size // 10))


def build_module(cfg: TrainConfig) -> Any:
    """The :class:`TagRLModule` of ``cfg`` (value head on) with fresh weights; its spaces are the
    configured env's. The module carries ``cfg.act`` as ``ppo_tag_act`` (what :func:`act` does)."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    import placement_rl.envs  # noqa: F401  (registers the ids)
    from placement_rl.policies.tag import TagRLModule

    env = gym.make(ENV_ID, config={**dict(cfg.env), **ENV_OPTIONS})
    spec = RLModuleSpec(
        module_class=TagRLModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config=cfg.model.model_config(True),
    )
    module = spec.build()
    module.ppo_tag_act = cfg.act
    return module


def _logits(module: Any, obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """(A,) masked logits of one observation (eval mode, no gradients)."""
    import torch

    from placement_rl.policies.tag import OBS_KEYS

    batch = {k: torch.as_tensor(np.asarray(obs[k])).unsqueeze(0) for k in OBS_KEYS}
    with torch.no_grad():
        logits, _ = module.gnn.logits_and_readout(batch)
    out: np.ndarray = logits[0].numpy().astype(np.float64)
    return out


def rollout(
    module: Any, env: Any, seed: int = 0, rng: np.random.Generator | None = None
) -> tuple[float, dict[str, Any]]:
    """One episode of ``module`` in ``env`` (reset with ``seed``): the most likely allowed action at
    every step, or, with ``rng``, actions sampled from the policy. Returns the return and the last
    info (with ``actions``, the episode's actions in order)."""
    obs, _ = env.reset(seed=seed)
    total, info = 0.0, {}
    actions: list[int] = []
    while True:
        logits = _logits(module, obs)
        if rng is None:
            action = int(np.argmax(logits))
        else:
            p = np.exp(logits - logits.max())
            action = int(rng.choice(len(p), p=p / p.sum()))
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        if terminated or truncated:
            return total, {**info, "actions": tuple(actions)}


def act(module: Any, env: Any, seed: int = 0) -> dict[str, Any]:
    """Plan with the policy on the instance of ``env``: the greedy episode and, with ``act.samples``
    (the module's :class:`ActSection`), that many sampled ones; the best final plan (fitting plans
    first, then the lowest simulated makespan) is the result. With ``act.partial_plans`` every
    prefix's completed plan is a candidate too (the best is replayed through the env).

    Returns:
        The chosen episode's final info (``plan``, ``makespan_s``, ``speedup``, ``oom``, ...) with
        ``reward`` (its return), ``search_s`` (all episodes' wall time), ``episodes`` and
        ``from_partial_plan`` (whether the plan is a prefix's completion, not an episode's end).
    """
    options: ActSection = getattr(module, "ppo_tag_act", None) or ActSection()
    was_training = module.training
    module.eval()
    start = time.perf_counter()
    try:
        best_key: tuple[bool, float] | None = None
        best: dict[str, Any] = {}
        rng = np.random.default_rng(options.seed)
        prefixes: set[tuple[int, ...]] = set()
        for k in range(1 + options.samples):
            total, info = rollout(module, env, seed=seed, rng=None if k == 0 else rng)
            key = (bool(info.get("oom", True)), float(info.get("makespan_s", np.inf)))
            if best_key is None or key < best_key:
                best_key, best = key, {**info, "reward": total, "from_partial_plan": False}
            actions = info["actions"]
            prefixes.update(actions[:j] for j in range(len(actions)))
        if options.partial_plans:
            base = env.unwrapped
            scored = [base.evaluate(p) for p in sorted(prefixes, key=lambda p: (len(p), p))]
            top = min(scored, key=lambda e: (bool(e.oom), float(e.makespan_s)))
            assert best_key is not None
            if (bool(top.oom), float(top.makespan_s)) < best_key:
                total, info = replay(env, top.decisions, seed)
                best = {**info, "reward": total, "from_partial_plan": True}
    finally:
        module.train(was_training)
    return {**best, "search_s": time.perf_counter() - start, "episodes": 1 + options.samples}


PPO_TAG = register_agent(
    Agent(
        name="ppo_tag",
        description="PPO with TAG's GNN on the sequential TAG action space (device-group subset x replication option)",
        env_id=ENV_ID,
        env_options=ENV_OPTIONS,
        sections={"model": ModelSection, "ppo": PPOSection, "act": ActSection},
        algorithm=algorithm_config,
        build_module=build_module,
        act=act,
        searchable_env=frozenset({"max_groups", "reward", "tag_options"}),
        learner_metrics=("policy_loss", "vf_loss", "entropy"),
        # TagRLModule's weights do not depend on the padding: plan on instances larger than the training ones
        padded_env=frozenset(PADDED_SIZES),
    )
)
