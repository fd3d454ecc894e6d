"""``placement_rl/Sharding-v0``: choose each op group's SOAP parallel configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from placement_rl.plan import OpConfig, Plan
from placement_rl.search.space import SearchSpace

from ..base import InstanceData, PlanEnv, bytes_on_devices
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

    Observation Space:
        The padded ``Dict`` of :mod:`placement_rl.envs.observation`. ``action_mask``: 1 for indices
        inside the current group's set whose devices keep their memory by the env's estimate
        (parameters, gradients and optimizer state of the decided groups plus their forward
        activations). **When nothing fits**, every configuration of the set is allowed; the final
        plan is then reported as out-of-memory.

    Rewards:
        ``speedup``, ``mdpe`` or ``dense`` (:mod:`placement_rl.envs.reward`).

    Starting State:
        A new instance, every group data parallel; the runtime features show that plan.

    Episode End:
        Terminates after the last group. The last ``info`` carries ``makespan_s``,
        ``dp_makespan_s``, ``speedup``, ``oom``, ``result``, ``plan`` (on the original graph) and
        ``instance``.

    Arguments:
        config: a mapping of :class:`~placement_rl.envs.sharding.types.ShardingConfig` fields;
            keyword arguments override it. Unknown keys raise ``ValueError``.

    Snapshots:
        ``snapshot()`` / ``restore(snapshot)`` save and restore the running episode for tree search
        (see :class:`~placement_rl.envs.base.PlanEnv`): the step, decided groups, per-group configs
        and memory estimates are copied; the instance and its configuration sets are shared. A
        snapshot restores only into an env of this class with an equal config.

    Version History:
        * v0: initial version.
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

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        self._check_action(action)
        action = int(action)
        mask = self._last_mask  # the mask of the observation the action answers
        if not mask[action]:
            raise ValueError(
                f"action {action} is masked for group {self._t} (outside its {len(self.configs(self._t))} "
                f"configurations or over memory); allowed actions: {np.flatnonzero(mask).tolist()}"
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
        info: dict[str, Any] = {"partial_makespan_s": self._partial_s}
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
        (the state does not change)."""
        if self._done or self.data is None:
            raise RuntimeError("evaluate_action needs a running episode")
        return self._preview(self._t, self.configs(self._t)[action])

    def configs(self, index: int) -> list[OpConfig]:
        """The action set of group ``index`` (capped to ``max_configs``; contiguous views first)."""
        data = self.data
        assert data is not None
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
