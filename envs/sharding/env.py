"""``placement_rl/Sharding-v0``: choose each op group's SOAP parallel configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from placement_rl.plan import OpConfig, Plan
from placement_rl.search.space import SearchSpace

from ..base import InstanceData, PlanEnv, allowed_actions, brief, bytes_on_devices
from .types import ShardingConfig


class ShardingEnv(PlanEnv):
    """Choose, group by group, how each op group is split and where its partitions run.

    Description:
        The instance (graph and cluster from the configured generator) is coarsened into at most
        ``max_groups`` op groups. One step per group, in topological order, picks one of the group's
        SOAP configurations (:class:`placement_rl.search.space.SearchSpace`: degrees per parallel
        dimension on a FlexFlow device view; the MCMC baseline searches the same sets). Undecided
        groups keep data parallelism, so the partial plan is always complete and simulated after
        every step (by delta simulation of the one changed group).

    Action Space:
        ``Discrete(max_configs)``: the index of a configuration in the current group's set,
        capped at ``max_configs`` (contiguous device views first). ``env.unwrapped.configs(i)``
        lists group ``i``'s configurations in action order; the current group is ``info["group"]``.

        Every action of the space is a valid input to ``step`` (what ``action_space.sample()``
        draws included); one the action mask forbids ends the episode (see Episode End). Anything
        else (floats, bools, strings, None, huge or negative integers, arrays) raises
        ``ValueError`` naming it.

    Observation Space:
        The padded ``Dict`` of :mod:`placement_rl.envs.observation`. ``action_mask``: 1 for indices
        inside the current group's set whose devices keep their memory by the env's estimate
        (parameters, gradients and optimizer state of the decided groups plus their forward
        activations). **When nothing fits**, every configuration of the set is allowed; the final
        plan is then reported as out-of-memory.

    Rewards:
        ``speedup``, ``mdpe`` or ``dense`` (:mod:`placement_rl.envs.reward`). An invalid action
        (see Episode End) gets the reward's invalid-action reward: -1 for ``speedup`` and
        ``dense``, ``-log(alpha * (1 + oom_penalty))`` for ``mdpe``.

    Starting State:
        A new instance, every group data parallel; the runtime features show that plan.

    Episode End:
        Terminates after the last group; never truncates. The last ``info`` carries
        ``makespan_s``, ``dp_makespan_s``, ``speedup``, ``oom``, ``result``, ``plan`` (on the
        original graph) and ``instance``. Every step's ``info`` has ``partial_makespan_s`` and
        ``invalid_action`` (False).

        **Invalid actions.** An action inside the action space that the action mask forbids (an
        index past the group's configurations, or a configuration over memory) is not applied.
        With ``invalid_action="end"`` (the default) it terminates the episode with the
        invalid-action reward; the observation is that of the state the action answered, and
        ``info`` has ``invalid_action: True``, ``invalid_action_reason``, ``instance`` and
        ``partial_makespan_s``, but no plan. With ``invalid_action="raise"`` it raises
        ``ValueError`` with that reason and the episode goes on unchanged.

    Arguments:
        config: a mapping of :class:`~placement_rl.envs.sharding.types.ShardingConfig` fields;
            keyword arguments override it. Unknown keys, values of the wrong type, NaN and values
            outside a field's documented range (``max_configs`` at most 65536, ``max_partitions``
            and ``max_devices`` at most 1024, ``max_nodes`` 16384, ``max_edges`` 131072) raise
            ``ValueError`` naming the key and the value, before anything is allocated.

    Snapshots:
        ``snapshot()`` / ``restore(snapshot)`` save and restore the running episode for tree search
        (see :class:`~placement_rl.envs.base.PlanEnv`): the step, decided groups, per-group configs
        and memory estimates are copied; the instance and its configuration sets are shared. A
        snapshot restores only into an env of this class with an equal config.

    Version History:
        * v0: initial version. Revised in place, without a new id because every sequence of
          allowed actions behaves as before: an action inside the action space that the mask
          forbids ends the episode with the invalid-action reward (it raised ``ValueError``; the
          ``invalid_action="raise"`` option keeps that); ``info`` gained ``invalid_action``; the
          configured maxima are capped; ``dim_kinds`` is checked when the env is built (it was
          at ``reset``); ``reset`` raises ``ValueError`` for a bad seed.
    """

    config_class = ShardingConfig
    config: ShardingConfig
    EPISODE_STATE = (*PlanEnv.EPISODE_STATE, "_t", "_decided", "_used")

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._t = 0
        self._decided = np.zeros(0)
        self._used = np.zeros(0)

    def _num_actions(self) -> int:
        return self.config.max_configs

    def _make_action_space(self) -> gym.Space[Any]:
        return gym.spaces.Discrete(self.config.max_configs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        data = self._begin_episode(seed)
        self._t = 0
        self._decided = np.zeros(data.instance.groups.num_ops)
        self._used = np.zeros(data.instance.topology.num_devices)
        obs = self._observation(data.baseline_partial, self._decided, 0, self._used)
        return obs, {"instance": data.instance.name, "partial_makespan_s": self._partial_s, "group": 0}

    def _state_observation(self) -> dict[str, np.ndarray]:
        assert self.data is not None
        # Before the first decision the partial plan is data parallelism, whose feedback is cached.
        feedback = self._feedback() if self._t > 0 else self.data.baseline_partial
        return self._observation(feedback, self._decided, self._t, self._used)

    def _padding_reason(self, action: int) -> str | None:
        """Why ``action`` (inside the action space) names no configuration of the current group; None if it does."""
        n = len(self.configs(self._t))
        if action < n:
            return None
        return f"action {action} names configuration {action}; group {self._t} has {n} configurations (0..{n - 1})"

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        action = self._as_action(action)
        mask = self._last_mask  # the mask of the observation the action answers
        if not mask[action]:
            why = self._padding_reason(action) or "its devices would exceed their memory by the env's estimate"
            return self._invalid(
                f"action {action} is masked for group {self._t}: {why}; allowed actions: {allowed_actions(mask)}"
            )
        data = self.data
        assert data is not None
        g = self._t
        self._set_group(g, self.configs(g)[action])
        self._used += self._needs(g)[action]
        self._decided[g] = 1.0
        self._t += 1
        previous = self._partial_s
        feedback = self._feedback()
        self._partial_s = feedback[0]
        info: dict[str, Any] = {"partial_makespan_s": self._partial_s, "invalid_action": False}
        groups = data.instance.groups
        terminated = self._t == groups.num_ops
        if terminated:
            plan = Plan(
                groups.name, {op.name: c for op, c in zip(groups.ops, self._configs, strict=True)}, name="sharding"
            )
            if groups is not data.instance.graph:
                plan = plan.expand(groups, data.instance.graph)
            reward, final = self._finish(plan, previous)
            info.update(final)
        else:
            reward = self._step_reward(previous)
            info["group"] = self._t
        current = self._t if not terminated else -1
        return self._observation(feedback, self._decided, current, self._used), reward, terminated, False, info

    def evaluate_action(self, action: int) -> float:
        """Simulated makespan (s) of the partial plan if the current group took configuration ``action``
        (the state does not change).

        Raises:
            RuntimeError: outside a running episode.
            ValueError: for an action outside the action space or past the group's configurations.
        """
        if self._done or self.data is None:
            raise RuntimeError("evaluate_action needs a running episode")
        action = self._as_action(action)
        padded = self._padding_reason(action)
        if padded:
            raise ValueError(padded)
        return self._preview(self._t, self.configs(self._t)[action])

    def configs(self, index: int) -> list[OpConfig]:
        """The action set of group ``index`` (capped to ``max_configs``; contiguous views first).

        Raises:
            RuntimeError: before the first ``reset()``.
            ValueError: if ``index`` is not the index of a group of the instance.
        """
        data = self.data
        if data is None:
            raise RuntimeError("configs() before reset(); there is no instance yet")
        G = data.instance.groups.num_ops
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < G:
            raise ValueError(f"group index {brief(index)}; expected an integer 0..{G - 1}")
        index = int(index)
        sets = data.extra.setdefault("configs", {})
        found = sets.get(index)
        if found is None:
            space = data.extra.get("space")
            if space is None:
                space = data.extra["space"] = SearchSpace(
                    data.instance.groups,
                    data.instance.topology,
                    max_partitions=self.config.max_partitions,
                    dim_kinds=tuple(self.config.dim_kinds),
                )
            every = list(space.configs(index))
            contiguous = [c for c in every if _is_contiguous(c, data)]
            rest = [c for c in every if not _is_contiguous(c, data)]
            found = sets[index] = (contiguous + rest)[: self.config.max_configs]
        return found  # type: ignore[no-any-return]

    def _needs(self, index: int) -> np.ndarray:
        """(n, D) memory estimate per configuration of group ``index`` and device."""
        data = self.data
        assert data is not None
        cache = data.extra.setdefault("needs", {})
        found = cache.get(index)
        if found is None:
            found = cache[index] = np.array([bytes_on_devices(data, index, c) for c in self.configs(index)])
        return found  # type: ignore[no-any-return]

    def _action_mask(self) -> np.ndarray:
        mask = np.zeros(self.config.max_configs, np.int8)
        data = self.data
        if data is None or self._t >= data.instance.groups.num_ops:
            return mask
        needs = self._needs(self._t)
        capacity = np.array([d.memory_bytes for d in data.instance.topology.devices], dtype=np.float64)
        fits = ((self._used + needs) <= capacity).all(axis=1)
        mask[: needs.shape[0]] = fits if fits.any() else 1
        return mask


def _is_contiguous(cfg: OpConfig, data: InstanceData) -> bool:
    index = [data.instance.topology.device_index(d) for d in cfg.devices]
    return all(b - a == 1 for a, b in zip(index, index[1:], strict=False))
