"""``placement_rl/Placement-v0``: place op groups on devices (TAG's sequential MDP, Trinity's one-shot)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from placement_rl.plan import OpConfig, Plan
from placement_rl.search.tag import TagEval, TagProblem

from ..base import InstanceData, PlanEnv, allowed_actions, bytes_on_devices
from ..generator import Instance
from ..observation import COL_COMPUTE_MS, DEV_COL_MEMORY_GIB, GIB, tag_dynamic_arrays, tag_static_arrays
from .types import PlacementConfig


def one_shot_memory_mask(
    need_gib: np.ndarray, assign: np.ndarray, placement: np.ndarray, capacity_gib: np.ndarray
) -> np.ndarray:
    """The hard memory mask of a one-shot action, group by group (``memory_mask="hard"``).

    Groups are placed in order ``0 .. k-1``. Group ``j`` needs the summed ``need_gib`` of the op
    slots ``assign`` puts in it; a device is allowed for it when the groups placed on it before
    (by ``placement``) plus group ``j`` fit in its capacity; when no device fits, every device is
    allowed (the plan then reports out-of-memory, as in sequential mode). A group that needs
    nothing (empty, or of ops without memory) fits anywhere. The figures are the observation's
    float32 GiB summed in float64, the same sums Trinity's policy makes while it decodes, so the env
    and the policy agree.

    Args:
        need_gib: (N,) GiB each real op slot needs on one device (``node_memory_gib[:N]``).
        assign: (N,) the group of each real op slot, in ``0 .. k-1``.
        placement: (k,) the device of each group, in ``0 .. D-1``.
        capacity_gib: (D,) memory of each real device, GiB (``device_features[:D, memory_gib]``).

    Returns:
        (k, D) bool: the devices group ``j`` may take, given the devices of groups ``0 .. j-1``.
    """
    k, D = len(placement), len(capacity_gib)
    need = np.bincount(np.asarray(assign, np.int64), weights=np.asarray(need_gib, np.float64), minlength=k)[:k]
    capacity = np.asarray(capacity_gib, np.float64)
    used = np.zeros(D)
    mask = np.zeros((k, D), bool)
    for j in range(k):
        fits = (used + need[j] <= capacity) | (need[j] <= 0.0)
        mask[j] = fits if fits.any() else True
        used[int(placement[j])] += need[j]
    return mask


class PlacementEnv(PlanEnv):
    """Decide where each op group of a training job runs.

    Description:
        An instance is a model's op graph and a cluster (drawn by the configured generator). The
        graph is coarsened with METIS into at most ``max_groups`` op groups (``one_shot_ops`` in
        one-shot mode). Every figure comes from the shared simulator; see
        :mod:`placement_rl.envs.base` for which graph each simulation uses.

        ``mode="sequential"`` (TAG sec. 4.1): one step per group, groups in descending compute time.
        Undecided groups follow TAG's rule, the strategy of the most expensive decided group, which
        is always the first one decided; before any decision the partial plan is data parallelism.
        With ``action_space="tag"`` a partial plan is completed by ``tag_completion``: by default the
        best of TAG's rule, data parallelism over the decided device groups and a one-pass rollout
        (:mod:`placement_rl.search.tag`); ``tag_completion: tag`` keeps TAG's rule alone.
        ``mode="one_shot"`` (Trinity / Hierarchical Planner): a single step assigns every op to one
        of ``one_shot_groups`` groups and every group to a device.

    Action Space:
        * sequential, ``action_space="device"``: ``Discrete(max_devices)``, the device of the current
          group (the whole group on it).
        * sequential, ``action_space="tag"``: ``Discrete(max_subsets * O)``, ``subset * O + option``:
          the current group on a non-empty subset of TAG's device groups (machines, or GPU types
          with ``device_grouping="gpu_type"``) with one of the ``O`` options of ``tag_options``:
          ``tag`` (the default, ``O = 4``) has ``all_reduce``, ``parameter_server``, ``duplicate``,
          ``model_parallel``; ``extended`` (``O = 7``) adds ``tensor_parallel``, ``pipeline`` and
          ``fsdp`` (:data:`placement_rl.search.tag.OPTION_SETS`). Subsets ``0 .. K-1`` are the
          single device groups, so ``k * O + option`` is "device group k"; the rest follow the
          rule of :func:`placement_rl.search.tag.device_subsets`. Model parallelism splits the
          group over the subset's GPUs in partial plans too. :meth:`tag_problem` is the
          instance's :class:`~placement_rl.search.tag.TagProblem`.
        * one-shot: ``MultiDiscrete([k] * max_nodes + [max_devices] * k)``: the group of every op
          slot, then the device of every group.

        Every action of the space is a valid input to ``step`` (what ``action_space.sample()``
        draws included); one the action mask forbids ends the episode (see Episode End). Anything
        else (floats, bools, strings, None, huge or negative integers, wrong shapes or dtypes)
        raises ``ValueError`` naming it; floats are never truncated.

    Observation Space:
        The padded ``Dict`` of :mod:`placement_rl.envs.observation` (node = op group), with TAG's
        Table 1 fields (device groups, subsets, options, progress) under ``action_space="tag"``.
        In one-shot
        mode the node rows are the ops to partition. ``action_mask`` has one entry per action
        (sequential) or the concatenated per-slot masks (one-shot: op slots past the graph allow
        only group 0; group slots allow the real devices). In one-shot mode with
        ``memory_mask="hard"`` the observation also has ``node_memory_gib`` (each op slot's need on
        one device): the memory mask then depends on the partition and on the earlier groups'
        devices, so the policy applies it while it decodes and ``step`` refuses a placement it
        forbids (:func:`one_shot_memory_mask`). Masking by memory (sequential): an
        action is masked when a device it uses would exceed its memory by the env's estimate (the
        parameters, gradients and optimizer state of the decided groups plus their forward
        activations, all assumed live at once). **When nothing fits**, every action on a real
        device is allowed and the episode goes on; the final plan is then simulated as usual and
        reported as out-of-memory (``info["oom"]``, and the ``speedup`` reward gives -1).

    Rewards:
        The named reward of the config (``speedup``, ``mdpe``, ``dense``): see
        :mod:`placement_rl.envs.reward`. An invalid action (see Episode End) gets the reward's
        invalid-action reward: -1 for ``speedup`` and ``dense`` (the reward of a plan that does not
        fit), ``-log(alpha * (1 + oom_penalty))`` for ``mdpe``.

    Starting State:
        A new instance from the generator (drawn with ``self.np_random``), nothing decided; the
        runtime features show the data-parallel plan.

    Episode End:
        Terminates after the last group (sequential) or the one step (one-shot); never truncates.
        The last step's ``info`` has ``makespan_s``, ``dp_makespan_s``, ``speedup``, ``oom``,
        ``result`` (:meth:`SimResult.summary`), ``plan`` (the final :class:`Plan` on the original
        graph) and ``instance``. Every step's ``info`` has ``partial_makespan_s`` and
        ``invalid_action`` (False).

        **Invalid actions.** An action inside the action space that the action mask forbids (a
        padded device, machine or op slot, a group on a padded device, or a group over memory) is
        not applied. With ``invalid_action="end"`` (the default) it terminates the episode with the
        invalid-action reward; the observation is that of the state the action answered, and
        ``info`` has ``invalid_action: True``, ``invalid_action_reason`` (what was masked and
        why), ``instance`` and ``partial_makespan_s``, but no plan. With ``invalid_action="raise"``
        it raises ``ValueError`` with that reason and the episode goes on unchanged.

    Arguments:
        config: a mapping of :class:`~placement_rl.envs.placement.types.PlacementConfig` fields
            (RLlib's ``env_config``); keyword arguments override it. Unknown keys, values of the
            wrong type, NaN and values outside a field's documented range (the maxima are capped:
            ``max_nodes`` and ``one_shot_ops`` at 16384, ``max_edges`` at 131072, ``max_devices`` at
            1024, ``one_shot_groups`` at 1024, the one-shot action mask at 2**22 entries) raise
            ``ValueError`` naming the key and the value, before anything is allocated.

    Snapshots:
        ``snapshot()`` / ``restore(snapshot)`` save and restore the running episode for tree search
        (see :class:`~placement_rl.envs.base.PlanEnv`): the step, decided groups, per-group configs,
        memory estimates, TAG rule, decisions and parameter-server turns are copied; the instance
        is shared. A snapshot restores only into an env of this class with an equal config.

    Version History:
        * v0: initial version. Revised in place, without a new id because every sequence of
          allowed actions behaves as before: an action inside the action space that the mask
          forbids ends the episode with the invalid-action reward (it raised ``ValueError``; the
          ``invalid_action="raise"`` option keeps that); ``info`` gained ``invalid_action``; the
          configured maxima are capped; ``action_space="tag"`` with ``mode="one_shot"`` (where it
          was ignored) is refused; ``reset`` raises ``ValueError`` for a bad seed; the
          ``memory_mask`` option (default ``auto``: as before) adds the one-shot hard memory mask;
          the ``tag_options`` option (default ``tag``: as before) adds the extended TAG options.
    """

    config_class = PlacementConfig
    config: PlacementConfig
    EPISODE_STATE = (*PlanEnv.EPISODE_STATE, "_t", "_order", "_decided", "_used", "_rule", "_actions")

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._t = 0
        self._order = np.zeros(0, np.int64)
        self._decided = np.zeros(0)
        self._used = np.zeros(0)
        self._rule: tuple[Any, ...] | None = None
        self._actions: tuple[int, ...] = ()  # tag: the actions taken, in decision order

    # ----------------------------------------------------------------- spaces
    def _num_actions(self) -> int:
        return self.config.num_actions

    def _extra_layout(self) -> dict[str, int]:
        if self.config.mode == "one_shot" and self.config.hard_memory_mask:
            return {"node_memory": True}
        if self.config.action_space != "tag":
            return {}
        return {
            "max_device_groups": self.config.max_device_groups,
            "max_subsets": self.config.max_subsets,
            "num_options": self.config.num_tag_options,
        }

    def _instance_data(self, instance: Instance) -> InstanceData:
        data = super()._instance_data(instance)
        if self.config.action_space == "tag" and "tag" not in data.extra:
            problem = TagProblem(
                instance.graph,
                instance.groups,
                instance.topology,
                self.cost,
                device_grouping=self.config.device_grouping,
                max_subsets=self.config.max_subsets,
                options=self.config.tag_options,
                completion=self.config.tag_completion,
                fine_ctx=data.fine_ctx,
                group_ctx=data.group_ctx,
            )
            data.static.update(tag_static_arrays(problem, self.layout))
            data.extra["tag"] = problem
        if self.layout.node_memory and "node_memory_gib" not in data.static:
            need = np.zeros(self.layout.max_nodes, np.float32)
            need[: instance.groups.num_ops] = self._single_need(data) / GIB
            data.static["node_memory_gib"] = need
        return data

    def _partial_baseline_s(self) -> float:
        # TAG's partial plans are simulated on the original ops, like data parallelism's baseline.
        if self.config.action_space == "tag":
            assert self.data is not None
            return self.data.baseline.makespan_s
        return super()._partial_baseline_s()

    def tag_problem(self) -> TagProblem:
        """The running instance's TAG search space and evaluator (``action_space="tag"``).

        Raises:
            RuntimeError: before ``reset()`` or with another action space.
        """
        if self.config.action_space != "tag" or self.data is None:
            raise RuntimeError("tag_problem() needs action_space='tag' and a reset() episode")
        problem: TagProblem = self.data.extra["tag"]
        return problem

    def evaluate(self, decisions: Any) -> TagEval:
        """The completed plan of ``decisions`` (actions in decision order; undecided groups by TAG's
        rule) simulated on the original op graph, without changing the episode: the pure path a
        tree search uses instead of copying the env. ``action_space="tag"`` only.

        Raises:
            RuntimeError: before ``reset()`` or with another action space.
            ValueError: for too many decisions or an action outside the action space.
        """
        problem = self.tag_problem()
        return problem.evaluate(self._check_tag_actions(problem, decisions))

    def observe(self, decisions: Any) -> dict[str, np.ndarray]:
        """The observation the env would show after ``decisions`` (from the episode's start), without
        changing the episode. ``action_space="tag"`` only (a tree search asks its prior with it).

        Raises:
            RuntimeError: before ``reset()`` or with another action space.
            ValueError: for too many decisions or an action outside the action space.
        """
        problem = self.tag_problem()
        decisions = self._check_tag_actions(problem, decisions)
        return self._tag_observation(problem, decisions, problem.evaluate(decisions), set_mask=False)

    def _check_tag_actions(self, problem: TagProblem, decisions: Any) -> tuple[int, ...]:
        out = []
        for k, a in enumerate(decisions):
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
                raise ValueError(f"decision {k} = {a!r}; expected an integer action")
            if not 0 <= int(a) < problem.num_actions:
                raise ValueError(
                    f"decision {k} = {int(a)}; the instance has {len(problem.subsets)} device-group subsets, "
                    f"actions 0..{problem.num_actions - 1}"
                )
            out.append(int(a))
        return problem.check_actions(out)

    def _tag_observation(
        self, problem: TagProblem, decisions: tuple[int, ...], evaluation: TagEval, *, set_mask: bool = True
    ) -> dict[str, np.ndarray]:
        G = problem.num_groups
        decided = np.zeros(G)
        decided[problem.order[: len(decisions)]] = 1.0
        current = int(problem.order[len(decisions)]) if len(decisions) < G else -1
        used = problem.used(decisions)
        feedback = (evaluation.makespan_s, evaluation.group_finish_s, evaluation.group_idle_s, evaluation.device_busy_s)
        mask = None
        if not set_mask:  # another state than the episode's: its own mask, the episode's stays
            mask = np.zeros(self.layout.num_actions, np.int8)
            mask[: problem.num_actions] = problem.action_mask(decisions, used)
        obs = self._observation(feedback, decided, current, used, mask)
        tag_dynamic_arrays(obs, problem, decisions, evaluation, self.layout)
        return obs

    def _make_action_space(self) -> gym.Space[Any]:
        cfg = self.config
        if cfg.mode == "one_shot":
            k = cfg.one_shot_groups
            return gym.spaces.MultiDiscrete([k] * cfg.nodes + [cfg.max_devices] * k)
        return gym.spaces.Discrete(self._num_actions())

    # ------------------------------------------------------------------ episode
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        data = self._begin_episode(seed)
        G = data.instance.groups.num_ops
        self._t = 0
        self._order = np.argsort(-data.static["node_features"][:G, COL_COMPUTE_MS], kind="stable")
        self._decided = np.zeros(G)
        self._used = np.zeros(data.instance.topology.num_devices)
        self._rule = None
        self._actions = ()
        if self.config.action_space == "tag":
            problem = self.tag_problem()
            evaluation = problem.evaluate(())
            # The episode starts from data parallelism (the dense reward's returns add up to 1 - 1 / speedup),
            # even where the empty plan's best completion is already faster.
            self._partial_s = self._partial_baseline_s()
            return self._tag_observation(problem, (), evaluation), {
                "instance": data.instance.name,
                "partial_makespan_s": self._partial_s,
            }
        obs = self._observation(data.baseline_partial, self._decided, self._current(), self._used)
        return obs, {"instance": data.instance.name, "partial_makespan_s": self._partial_s}

    def _current(self) -> int:
        if self.config.mode == "one_shot" or self._t >= len(self._order):
            return -1
        return int(self._order[self._t])

    def _state_observation(self) -> dict[str, np.ndarray]:
        assert self.data is not None
        if self.config.action_space == "tag":
            problem = self.tag_problem()
            return self._tag_observation(problem, self._actions, problem.evaluate(self._actions))
        # Before the first decision the partial plan is data parallelism, whose feedback is cached.
        feedback = self._feedback() if self.config.mode == "sequential" and self._t > 0 else self.data.baseline_partial
        return self._observation(feedback, self._decided, self._current(), self._used)

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        action = self._as_action(action)
        if self.config.mode == "one_shot":
            return self._step_one_shot(action)
        mask = self._last_mask  # the mask of the observation the action answers
        if not mask[action]:
            why = self._padding_reason(action) or "the group does not fit in memory there by the env's estimate"
            return self._invalid(
                f"action {action} is masked for group {self._current()}: {why}; allowed actions: "
                f"{allowed_actions(mask)}"
            )
        data = self.data
        assert data is not None
        if self.config.action_space == "tag":
            return self._step_tag(action)
        groups, topology = data.instance.groups, data.instance.topology
        g = self._current()
        device = topology.devices[action].name
        cfg = OpConfig.make(device)
        rule: tuple[Any, ...] = ("device", device)
        if self._rule is None:  # the first (most expensive) group sets the rule for the undecided
            self._rule = rule
            self._set_all([self._rule_config(i) if i != g else cfg for i in range(groups.num_ops)])
        else:
            self._set_group(g, cfg)
        self._used += self._need(g, action)
        self._decided[g] = 1.0
        self._t += 1
        previous = self._partial_s
        feedback = self._feedback()
        self._partial_s = feedback[0]
        info: dict[str, Any] = {"partial_makespan_s": self._partial_s, "invalid_action": False}
        terminated = self._t == groups.num_ops
        if terminated:
            reward, final = self._finish(self._final_plan(), previous)
            info.update(final)
        else:
            reward = self._step_reward(previous)
        return self._observation(feedback, self._decided, self._current(), self._used), reward, terminated, False, info

    def _step_tag(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        problem = self.tag_problem()
        g = self._current()
        self._actions = (*self._actions, action)
        self._used = problem.used(self._actions)
        self._decided[g] = 1.0
        self._t += 1
        previous = self._partial_s
        evaluation = problem.evaluate(self._actions)
        self._partial_s = evaluation.makespan_s
        info: dict[str, Any] = {"partial_makespan_s": self._partial_s, "invalid_action": False}
        terminated = self._t == problem.num_groups
        if terminated:
            reward, final = self._finish(problem.plan(self._actions, name="placement"), previous)
            info.update(final)
        else:
            reward = self._step_reward(previous)
        return self._tag_observation(problem, self._actions, evaluation), reward, terminated, False, info

    def _step_one_shot(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        data = self.data
        assert data is not None
        cfg = self.config
        groups, topology = data.instance.groups, data.instance.topology
        N, D = groups.num_ops, topology.num_devices
        assign, placement = action[: cfg.nodes], action[cfg.nodes :]
        bad = np.flatnonzero(placement >= D)
        if bad.size:
            return self._invalid(
                f"action places group {int(bad[0])} on device index {int(placement[bad[0]])}; topology "
                f"{topology.name!r} has devices 0..{D - 1} (the action mask allows only those)"
            )
        padded = np.flatnonzero(assign[N:] != 0)
        if padded.size:
            slot = N + int(padded[0])
            return self._invalid(
                f"action assigns padded op slot {slot} (the graph has {N} ops, slots 0..{N - 1}) to group "
                f"{int(assign[slot])}; the action mask allows only group 0 for padded op slots (>= {N})"
            )
        if self.layout.node_memory:
            static = data.static
            allowed = one_shot_memory_mask(
                static["node_memory_gib"][:N], assign[:N], placement, static["device_features"][:D, DEV_COL_MEMORY_GIB]
            )
            over = np.flatnonzero(~allowed[np.arange(len(placement)), placement])
            if over.size:
                j = int(over[0])
                need_gib = float(static["node_memory_gib"][:N][assign[:N] == j].astype(np.float64).sum())
                return self._invalid(
                    f"action places group {j} ({need_gib:.3f} GiB by the env's estimate) on device "
                    f"{int(placement[j])}, whose remaining memory cannot hold it after groups 0..{j - 1} "
                    f"(memory_mask='hard'); devices that fit: {np.flatnonzero(allowed[j]).tolist()}"
                )
        names = [d.name for d in topology.devices]
        configs = {op.name: OpConfig.make(names[int(placement[assign[i]])]) for i, op in enumerate(groups.ops)}
        plan = Plan(groups.name, configs, name="placement")
        if groups is not data.instance.graph:
            plan = plan.expand(groups, data.instance.graph)
        self._decided = np.ones(N)
        self._used = np.bincount(placement[assign[:N]], weights=self._single_need(), minlength=D)[:D]
        self._partial_s = float("nan")
        reward, info = self._finish(plan, float("nan"))
        info["invalid_action"] = False
        info["groups_used"] = int(np.unique(assign[:N]).size)
        return self._observation(data.baseline_partial, self._decided, -1, self._used), reward, True, False, info

    def evaluate_action(self, action: int) -> float:
        """Simulated makespan (s) of the partial plan if the current group took ``action``.

        The state does not change (the greedy reference agent calls this for every allowed action).
        Sequential mode only. Any real device (or machine) may be previewed, masked by memory or not.

        Raises:
            RuntimeError: outside a running sequential episode.
            ValueError: for an action outside the action space or one naming a padded device or
                machine slot.
        """
        if self.config.mode != "sequential" or self._done or self.data is None:
            raise RuntimeError("evaluate_action needs a running sequential episode")
        action = self._as_action(action)
        padded = self._padding_reason(action)
        if padded:
            raise ValueError(padded)
        if self.config.action_space == "tag":
            return self.tag_problem().evaluate((*self._actions, action)).makespan_s
        g = self._current()
        groups = self.data.instance.groups
        cfg = OpConfig.make(self.data.instance.topology.devices[action].name)
        if self._rule is None:
            saved = self._rule
            self._rule = ("device", cfg.devices[0])
            configs = [self._rule_config(i) if i != g else cfg for i in range(groups.num_ops)]
            self._rule = saved
            return self._preview_all(configs)
        return self._preview(g, cfg)

    # ---------------------------------------------------------------- helpers
    def _padding_reason(self, action: int) -> str | None:
        """Why ``action`` (inside the action space) names no device or machine of the instance; None if it does."""
        assert self.data is not None
        topology = self.data.instance.topology
        if self.config.action_space == "device":
            D = topology.num_devices
            if action < D:
                return None
            return f"action {action} names device {action}; topology {topology.name!r} has devices 0..{D - 1}"
        problem = self.tag_problem()
        S = len(problem.subsets)
        subset, option = divmod(action, problem.num_options)
        if subset < S:
            return None
        return (
            f"action {action} names device-group subset {subset} (option {problem.options[option]!r}); topology "
            f"{topology.name!r} has {len(problem.device_groups)} device groups (by {problem.device_grouping}) and "
            f"subsets 0..{S - 1}"
        )

    def _rule_config(self, index: int) -> OpConfig:
        assert self._rule is not None
        return OpConfig.make(self._rule[1])

    def _final_plan(self) -> Plan:
        assert self.data is not None
        inst = self.data.instance
        plan = Plan(
            inst.groups.name,
            {op.name: c for op, c in zip(inst.groups.ops, self._configs, strict=True)},
            name="placement",
        )
        return plan if inst.groups is inst.graph else plan.expand(inst.groups, inst.graph)

    def _single_need(self, data: InstanceData | None = None) -> np.ndarray:
        """(G,) bytes a group needs on one device (state of its parameters plus its activations);
        ``data``: that instance's (default: the running episode's)."""
        data = data or self.data
        assert data is not None
        found = data.extra.get("single_need")
        if found is None:
            device = data.instance.topology.devices[0].name
            found = np.array(
                [bytes_on_devices(data, i, OpConfig.make(device)).sum() for i in range(data.instance.groups.num_ops)]
            )
            data.extra["single_need"] = found
        return found

    def _need(self, index: int, action: int) -> np.ndarray:
        """(D,) bytes group ``index`` adds to each device when placed whole on device ``action``."""
        assert self.data is not None
        need = np.zeros(self.data.instance.topology.num_devices)
        need[action] = self._single_need()[index]
        return need

    def _action_mask(self) -> np.ndarray:
        data = self.data
        mask = np.zeros(self.layout.num_actions, np.int8)
        if data is None:
            return mask
        topology = data.instance.topology
        D = topology.num_devices
        cfg = self.config
        if cfg.mode == "one_shot":
            k, n = cfg.one_shot_groups, cfg.nodes
            ops = np.zeros((n, k), np.int8)
            ops[: data.instance.groups.num_ops] = 1
            ops[data.instance.groups.num_ops :, 0] = 1
            devices = np.zeros((k, cfg.max_devices), np.int8)
            devices[:, :D] = 1
            return np.concatenate([ops.ravel(), devices.ravel()])
        g = self._current()
        capacity = np.array([d.memory_bytes for d in topology.devices], dtype=np.float64)
        if cfg.action_space == "tag":
            problem = self.tag_problem()
            if g < 0:
                mask[: problem.num_actions] = 1
            else:
                mask[: problem.num_actions] = problem.action_mask(self._actions, self._used)
            return mask
        valid = np.arange(D)
        if g < 0:
            mask[valid] = 1
            return mask
        mask[:D] = self._used + self._single_need()[g] <= capacity
        if not mask.any():  # nothing fits: allow every real action; the final plan reports OOM
            mask[valid] = 1
        return mask
