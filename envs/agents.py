"""Reference agents for the environments: uniform random and greedy one-step lookahead.

They set the floor any learned policy must clear (docs/results/environments.md, ``benchmarks/envs.py agents``).

* :class:`RandomAgent`: a uniformly random allowed action (one-shot: a random group per op and a
  random real device per group).
* :class:`GreedyAgent`: puts the current group where the simulated partial plan is fastest
  (``env.unwrapped.evaluate_action`` for every allowed action; ties go to the lowest index). With
  the TAG action space, ``GreedyAgent(subsets=n)`` looks ahead over the actions on the first ``n``
  device-group subsets only (each device group alone, all of them together and the fastest-``j``
  prefixes come first: :func:`placement_rl.search.tag.device_subsets`), ``n * num_options``
  previews a step instead of up to ``max_subsets * num_options``; ``subsets="ranked"`` takes
  exactly those structured subsets of the instance (``2 K - 1`` for ``K`` device groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np


@dataclass
class RandomAgent:
    """Uniform over the allowed actions; its randomness comes from ``seed`` only."""

    seed: int = 0
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def act(self, env: gym.Env[Any, Any], obs: dict[str, np.ndarray]) -> Any:
        space = env.action_space
        mask = obs["action_mask"]
        if isinstance(space, gym.spaces.MultiDiscrete):
            action = np.empty(space.nvec.shape[0], np.int64)
            offset = 0
            for i, n in enumerate(space.nvec.tolist()):
                allowed = np.flatnonzero(mask[offset : offset + n])
                action[i] = allowed[self.rng.integers(allowed.size)]
                offset += n
            return action
        allowed = np.flatnonzero(mask)
        return int(allowed[self.rng.integers(allowed.size)])


@dataclass
class GreedyAgent:
    """One-step lookahead on the simulated partial plan (sequential placement and sharding).

    Args:
        subsets: with the TAG action space (``action_space="tag"``), preview only the allowed
            actions on the first ``subsets`` device-group subsets, in the action space's order
            (:func:`placement_rl.search.tag.device_subsets`: every device group alone, all of them
            together, the ``j`` fastest for ``j = 2 .. K - 1``, then the rest), or every allowed
            action when none of those is allowed. ``"ranked"``: exactly those structured subsets,
            ``2 K - 1`` for the instance's ``K`` device groups (``1`` for one group). None (the
            default): every allowed action. Other action spaces ignore it.

    Raises:
        ValueError: for ``subsets`` below 1 or a string other than ``"ranked"``.
    """

    subsets: int | Literal["ranked"] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.subsets, str):
            if self.subsets != "ranked":
                raise ValueError(f"subsets = {self.subsets!r}; expected a positive count, 'ranked' or None")
        elif self.subsets is not None and (isinstance(self.subsets, bool) or self.subsets < 1):
            raise ValueError(f"subsets = {self.subsets!r}; expected at least 1, 'ranked' or None (every subset)")

    def subset_count(self, subsets: Sequence[tuple[int, ...]]) -> int:
        """How many of the action space's ``subsets`` (device-group index tuples, in its order) to preview."""
        if self.subsets == "ranked":
            K = sum(len(s) == 1 for s in subsets)  # the singletons: one per device group
            return 2 * K - 1
        return len(subsets) if self.subsets is None else self.subsets

    def act(self, env: gym.Env[Any, Any], obs: dict[str, np.ndarray]) -> int:
        allowed = np.flatnonzero(obs["action_mask"]).tolist()
        inner = env.unwrapped
        if self.subsets is not None and getattr(getattr(inner, "config", None), "action_space", None) == "tag":
            problem = inner.tag_problem()  # type: ignore[attr-defined]
            limit = self.subset_count(problem.subsets) * problem.num_options
            allowed = [a for a in allowed if a < limit] or allowed  # action a: subset a // num_options
        times = [inner.evaluate_action(a) for a in allowed]  # type: ignore[attr-defined]
        return int(allowed[int(np.argmin(times))])


def run_episode(env: gym.Env[Any, Any], agent: Any, seed: int | None = None) -> dict[str, Any]:
    """Play one episode; returns ``{"reward": total, "steps": n, **final info}``."""
    obs, _ = env.reset(seed=seed)
    total, steps, done, info = 0.0, 0, False, {}
    while not done:
        obs, reward, terminated, truncated, info = env.step(agent.act(env, obs))
        total += float(reward)
        steps += 1
        done = terminated or truncated
    return {"reward": total, "steps": steps, **info}
