"""What the placement and sharding environments share: config parsing, instances, the partial-plan
simulation, the observation and the end of an episode.

The envs are thin: every figure comes from the shared simulator. Per episode:

* the partial plan lives on the instance's op-group graph and is simulated after every step by
  :class:`~placement_rl.sim.delta.DeltaSimulator` (one group changes per step, so only its
  tasks are rebuilt): its makespan and per-group times feed the observation and the dense reward;
* the final plan is expanded to the model's original ops and simulated by
  :func:`placement_rl.simulate`; that ``SimResult`` is the episode's outcome (``info``), so the
  env's final makespan is exactly ``simulate(graph, topology, info["plan"])``.

A tree search branches from a state with :meth:`PlanEnv.snapshot` and :meth:`PlanEnv.restore`
(:class:`EnvSnapshot`): a snapshot copies only the small per-episode state and shares the instance.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import gymnasium as gym
import numpy as np

from placement_rl.config import Rule, choice, integer, option, parse
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.sim.cost import CostModel
from placement_rl.sim.delta import DeltaSimulator
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import DEFAULT_COST_MODEL, SimContext

from .generator import Instance, InstanceGenerator, make_generator
from .observation import (
    COL_CURRENT,
    COL_DECIDED,
    COL_FINISH_MS,
    COL_IDLE_MS,
    DEV_COL_IDLE_FRACTION,
    DEV_COL_MEMORY_USED_GIB,
    GIB,
    Layout,
    static_arrays,
)
from .reward import Outcome, Reward, make_reward

#: Instances whose derived data (simulation contexts, baselines, static arrays) an env keeps by default.
_CACHE_INSTANCES = 16
#: The most instances an env may be configured to keep (``instance_cache``).
MAX_INSTANCE_CACHE = 1_024

# Upper limits of the configured maxima. Each bounds an array that the observation or the action
# mask allocates (and copies every step), so a typo such as ``max_devices: 1000000000`` fails
# with a clear error naming the key instead of trying to allocate tens of GiB.
#: Node rows of the observation (``max_groups``, ``max_nodes``, ``one_shot_ops``).
MAX_NODES = 16_384
#: Edge columns of the observation (``max_edges``; the default ``8 * max_nodes`` stays within it).
MAX_EDGES = 8 * MAX_NODES
#: Device rows of the observation (``max_devices``; ``device_bandwidth`` is ``max_devices`` squared).
MAX_DEVICES = 1_024
#: Columns of the Node2vec ``node_structure`` field (``node2vec_dim``).
MAX_STRUCTURE_DIM = 128
#: Entries of the action mask (one-shot: ``max_nodes * one_shot_groups + one_shot_groups * max_devices``).
MAX_ACTIONS = 1 << 22

#: The values of :attr:`EnvConfig.invalid_action`.
INVALID_ACTIONS: tuple[str, ...] = ("end", "raise")

_COST_MODEL = Rule(
    lambda v: v is None or isinstance(v, CostModel | Mapping),
    "a CostModel object, a mapping of its options (as an experiment's cost section) or null",
)


def _cost_model(value: CostModel | Mapping[str, Any] | None) -> CostModel:
    """The env's cost model: the given one, one built from a mapping of options, or the default."""
    if value is None:
        return DEFAULT_COST_MODEL
    if isinstance(value, CostModel):
        return value
    from placement_rl.experiments import build_cost_model

    return build_cost_model(value, "env config cost_model")


def brief(value: Any, limit: int = 120) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (error messages name the value, not a
    megabyte of it)."""
    text = re.sub(r"\s*\n\s*", " ", repr(value))  # numpy arrays print on several lines
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def allowed_actions(mask: np.ndarray, limit: int = 32) -> str:
    """The allowed actions of ``mask`` as a list for an error message (the first ``limit`` of them)."""
    allowed = np.flatnonzero(mask).tolist()
    if len(allowed) <= limit:
        return str(allowed)
    return f"[{', '.join(map(str, allowed[:limit]))}, ...] ({len(allowed)} in all)"


@dataclass(frozen=True)
class EnvConfig:
    """Options every env takes (subclasses add theirs). Built and checked by :meth:`parse` from a mapping.

    Attributes:
        generator: the instances: ``{"kind": "fixed", "model": ..., "topology": ...}``,
            ``{"kind": "random", ...}`` (see :mod:`placement_rl.envs.generator`) or a generator object.
        reward: ``speedup``, ``mdpe`` or ``dense`` (see :mod:`placement_rl.envs.reward`) or a Reward.
        reward_options: keyword options of the reward (``{"alpha": 0.5}``).
        max_groups: METIS op groups per instance (TAG: 60); smaller graphs use their ops. At most
            :data:`MAX_NODES`.
        max_nodes: node rows of the observation (default: ``max_groups``); at most :data:`MAX_NODES`.
        max_edges: edge columns of the observation (default: ``8 * max_nodes``; ``16 * max_nodes`` with
            Placement-v0's TAG action space); at most :data:`MAX_EDGES`.
        max_devices: device rows of the observation (random topologies have at most 48 GPUs); at
            most :data:`MAX_DEVICES`.
        cost_model: the simulator's cost model (default: :data:`placement_rl.sim.simulator.DEFAULT_COST_MODEL`),
            or its options as a mapping, e.g. ``{"execution_mode": "cuda_graphs", "precision": "bf16-mixed"}``
            (the keys of an experiment's ``cost`` section, :func:`placement_rl.experiments.build_cost_model`).
        node2vec_dim: if positive, the observation gets ``node_structure``: a Node2vec embedding
            of each group in the group graph (Trinity's structure feature), computed once per
            instance; at most :data:`MAX_STRUCTURE_DIM`.
        invalid_action: what ``step`` does with an action inside the action space that the
            action mask forbids (a padded slot, or over memory): ``"end"`` ends the episode with
            the reward's invalid-action reward and ``info["invalid_action"] = True``; ``"raise"``
            raises ``ValueError`` and leaves the episode as it was.
        instance_cache: how many instances' derived data (simulation contexts, data-parallel
            baselines, static arrays, TAG's compiled ops) the env keeps, least recently used
            first out; a training pool larger than this rebuilds an instance on most resets (a
            few seconds each). At most :data:`MAX_INSTANCE_CACHE`.
    """

    generator: Any = None  # checked by make_generator when the env is built
    reward: Any = "speedup"  # checked, with reward_options, by make_reward when the env is built
    reward_options: Mapping[str, Any] = field(default_factory=dict)
    max_groups: int = option(60, rule=integer(low=1, high=MAX_NODES))
    max_nodes: int | None = option(None, rule=integer(low=1, high=MAX_NODES, null=True))
    max_edges: int | None = option(None, rule=integer(low=1, high=MAX_EDGES, null=True))
    max_devices: int = option(64, rule=integer(low=1, high=MAX_DEVICES))
    cost_model: CostModel | Mapping[str, Any] | None = option(None, rule=_COST_MODEL)
    node2vec_dim: int = option(0, rule=integer(low=0, high=MAX_STRUCTURE_DIM))
    invalid_action: str = option("end", rule=choice(INVALID_ACTIONS))
    instance_cache: int = option(_CACHE_INSTANCES, rule=integer(low=1, high=MAX_INSTANCE_CACHE))

    @classmethod
    def parse(cls, config: Mapping[str, Any] | None, **overrides: Any) -> Self:
        """``config`` (plus keyword overrides) as a checked record (:func:`placement_rl.config.parse`).

        Raises:
            SchemaError: (a ``ValueError``) for an unknown key, listing the valid ones, or a value
                its field's rule refuses, naming the key and what was expected.
        """
        return parse(cls, config, None, **overrides)

    @property
    def nodes(self) -> int:
        return self.max_nodes or self.max_groups

    @property
    def groups_per_instance(self) -> int:
        """How many op groups an instance is coarsened to."""
        return self.max_groups

    @property
    def edges(self) -> int:
        return self.max_edges or 8 * self.nodes


@dataclass
class InstanceData:
    """Everything an env derives from one instance, computed once and reused by later episodes."""

    instance: Instance
    group_ctx: SimContext
    fine_ctx: SimContext
    static: dict[str, np.ndarray]
    baseline: SimResult  # data parallel on the original graph
    baseline_configs: list[OpConfig]  # data parallel on the group graph
    baseline_partial: tuple[float, np.ndarray, np.ndarray, np.ndarray]  # its feedback
    extra: dict[str, Any] = field(default_factory=dict)  # per-env caches (memory estimates, ...)


@dataclass(frozen=True, eq=False)
class EnvSnapshot:
    """The state of a :class:`PlanEnv` episode at one moment (:meth:`PlanEnv.snapshot`).

    A snapshot copies only the per-episode mutable state, a few arrays of length ``num_groups``,
    ``num_devices`` or ``num_actions`` and small lists and dicts; it shares, never copies, the
    immutable instance data: the graphs, topology, simulation contexts, static observation arrays
    and baselines (:attr:`data`) and the delta simulator's arrays. Restoring one never changes it,
    so a tree search restores the same snapshot as often as it likes.

    Attributes:
        env_class: the class of the env it came from.
        config: that env's config; it restores only into an env of the same class with an equal
            config (the shared ``data`` was built for that config's layout and cost model).
        data: the episode's instance data, shared with the env (and its ``InstanceData`` cache).
        state: attribute name -> private copy of the env's per-episode attributes
            (:attr:`PlanEnv.EPISODE_STATE`): step counter, decided flags, per-group configs, memory
            estimates, partial makespan, last action mask, done flag, ...
        delta: a fork of the partial plan's delta simulator (its arrays shared: the simulator never
            changes them in place), or None when the env would rebuild it lazily.
        np_random_state: the env's random generator's ``bit_generator.state`` (None before its first use).
        np_random_seed: the env's ``_np_random_seed``.
    """

    env_class: type[PlanEnv]
    config: EnvConfig
    data: InstanceData
    state: Mapping[str, Any]
    delta: DeltaSimulator | None
    np_random_state: Mapping[str, Any] | None
    np_random_seed: int | None

    def __repr__(self) -> str:
        step = self.state.get("_t", "?")
        return f"EnvSnapshot({self.env_class.__name__}, instance={self.data.instance.name!r}, step={step})"


def _own(value: Any) -> Any:
    """A private copy of one per-episode attribute: containers copied one level deep.

    Their elements (op configs, device names, TAG rules, counters) are immutable, so one level is exact.
    """
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value  # int, float, bool, str, tuple, None


def _fork(sim: DeltaSimulator | None) -> DeltaSimulator | None:
    """An independent copy of a delta simulator that shares its arrays.

    :class:`DeltaSimulator` replaces its arrays (``ops``, ``edges``, the task graph and the
    schedule) by new ones on every accepted change and never writes into them, so only its two
    per-op lists need copying; a fork behaves exactly like the original.
    """
    if sim is None:
        return None
    fork = copy.copy(sim)
    fork.configs = list(sim.configs)
    fork.compiled = list(sim.compiled)
    fork._pending = None
    return fork


class PlanEnv(gym.Env[dict[str, np.ndarray], Any]):
    """Base class of :class:`~placement_rl.envs.placement.PlacementEnv` and
    :class:`~placement_rl.envs.sharding.ShardingEnv` (see their docstrings for the contract).

    Snapshots:
        :meth:`snapshot` returns an :class:`EnvSnapshot` of the running episode and
        :meth:`restore` puts the env back in that state, so a tree search can branch from a state
        many times: after ``restore(s)``, the same actions give the same observations, rewards,
        infos and final plan as they did after ``s`` was taken. A snapshot shares the immutable
        instance data (graphs, topology, simulation contexts, static arrays) and copies only the
        per-episode state (:attr:`EPISODE_STATE`, the delta simulator's per-op lists and the state of
        the random generator). It restores into the env it came from or into any env of the same class
        built with an equal config (``ValueError`` otherwise), and it carries its instance: after
        ``reset()`` drew another instance, restoring brings the snapshot's episode back whole.
        Wrappers' state (``TimeLimit`` counters, ...) and a custom generator object's own state
        are not part of it.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    config_class: type[EnvConfig] = EnvConfig
    #: The per-episode attributes a snapshot copies (subclasses add theirs). Every other attribute
    #: is fixed at construction, shared instance data, or the delta simulator (forked separately).
    EPISODE_STATE: ClassVar[tuple[str, ...]] = ("_configs", "_partial_s", "_done", "_last_mask")

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.config = self.config_class.parse(config, **kwargs)
        self.generator: InstanceGenerator = make_generator(self.config.generator)
        self.reward_fn: Reward = make_reward(self.config.reward, self.config.reward_options)
        self.cost = _cost_model(self.config.cost_model)
        self.layout = Layout(
            self.config.nodes,
            self.config.edges,
            self.config.max_devices,
            self._num_actions(),
            self.config.node2vec_dim,
            **self._extra_layout(),
        )
        self.observation_space = self.layout.space()
        self.action_space = self._make_action_space()
        self._cache: OrderedDict[str, InstanceData] = OrderedDict()
        self.data: InstanceData | None = None
        self._delta: DeltaSimulator | None = None
        self._configs: list[OpConfig] = []
        self._partial_s = float("nan")
        self._done = True
        self._last_mask = np.zeros(0, np.int8)

    # ------------------------------------------------------------ subclasses
    def _num_actions(self) -> int:
        raise NotImplementedError

    def _make_action_space(self) -> gym.Space[Any]:
        raise NotImplementedError

    def _extra_layout(self) -> dict[str, int]:
        """Extra :class:`Layout` maxima of the subclass's observation (TAG's device groups)."""
        return {}

    def _action_mask(self) -> np.ndarray:
        raise NotImplementedError

    def _state_observation(self) -> dict[str, np.ndarray]:
        """The observation of the current state (what the last observation showed)."""
        raise NotImplementedError

    # --------------------------------------------------------------- helpers
    def _instance_data(self, instance: Instance) -> InstanceData:
        key = f"{instance.name}/{instance.groups.num_ops}"
        found = self._cache.get(key)
        if found is not None and found.instance is instance:
            self._cache.move_to_end(key)
            return found
        group_ctx = SimContext(instance.groups, instance.topology, self.cost)
        fine_ctx = (
            group_ctx if instance.groups is instance.graph else SimContext(instance.graph, instance.topology, self.cost)
        )
        static = static_arrays(instance.groups, instance.graph, instance.topology, self.cost, self.layout)
        baseline = fine_ctx.simulate(data_parallel(instance.graph, instance.topology), validate=False)
        dp_groups = data_parallel(instance.groups, instance.topology)
        configs = [dp_groups[op.name] for op in instance.groups.ops]
        partial = DeltaSimulator(group_ctx, configs, cached=True).feedback()
        data = InstanceData(instance, group_ctx, fine_ctx, static, baseline, configs, partial)
        self._cache[key] = data
        while len(self._cache) > self.config.instance_cache:
            self._cache.popitem(last=False)
        return data

    def _begin_episode(self, seed: int | None) -> InstanceData:
        try:
            gym.Env.reset(self, seed=seed)
        except gym.error.Error as exc:  # Gymnasium's type for a bad seed; the env API raises ValueError
            raise ValueError(f"reset(seed={brief(seed)}): {exc}") from None
        instance = self.generator.sample(self.np_random, self.config.groups_per_instance)
        self.data = data = self._instance_data(instance)
        self._delta = None
        self._configs = list(data.baseline_configs)
        self._partial_s = data.baseline_partial[0]
        self._done = False
        return data

    def _simulator(self) -> DeltaSimulator:
        """The partial plan's delta simulator (rebuilt after unpickling or a full change)."""
        if self._delta is None:
            assert self.data is not None
            self._delta = DeltaSimulator(self.data.group_ctx, self._configs, cached=True)
        return self._delta

    def _set_group(self, index: int, cfg: OpConfig) -> None:
        self._configs[index] = cfg
        if self._delta is not None:
            self._delta.set(index, cfg)

    def _preview(self, index: int, cfg: OpConfig) -> float:
        """The partial plan's simulated makespan if group ``index`` took ``cfg`` (state unchanged)."""
        sim = self._simulator()
        sim.propose(index, cfg)
        sim.reject()
        return sim.proposed_makespan_s

    def _preview_all(self, configs: Sequence[OpConfig]) -> float:
        """The simulated makespan of a whole group-graph plan (state unchanged)."""
        assert self.data is not None
        return DeltaSimulator(self.data.group_ctx, configs, cached=True).feedback()[0]

    def _set_all(self, configs: Sequence[OpConfig]) -> None:
        self._configs = list(configs)
        self._delta = None

    def _feedback(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        return self._simulator().feedback()

    def _observation(
        self,
        feedback: tuple[float, np.ndarray, np.ndarray, np.ndarray],
        decided: np.ndarray,
        current: int,
        memory_used_bytes: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """The observation of a state; ``action_mask`` given: that mask, and the env's last mask stays
        (an observation of another state than the episode's, :meth:`PlacementEnv.observe`)."""
        assert self.data is not None
        static = self.data.static
        makespan_s, finish_s, idle_s, busy_s = feedback
        G, D = finish_s.shape[0], busy_s.shape[0]
        obs = {k: v.copy() for k, v in static.items()}
        node = obs["node_features"]
        node[:G, COL_DECIDED] = decided
        if 0 <= current < G:
            node[current, COL_CURRENT] = 1.0
        node[:G, COL_FINISH_MS] = finish_s * 1e3
        node[:G, COL_IDLE_MS] = idle_s * 1e3
        dev = obs["device_features"]
        dev[:D, DEV_COL_MEMORY_USED_GIB] = memory_used_bytes / GIB
        idle_fraction = np.clip(1.0 - busy_s / makespan_s, 0.0, 1.0) if makespan_s > 0 else 1.0
        dev[:D, DEV_COL_IDLE_FRACTION] = idle_fraction
        if action_mask is None:
            obs["action_mask"] = self._last_mask = self._action_mask()
        else:
            obs["action_mask"] = action_mask
        return obs

    def _as_action(self, action: Any) -> Any:
        """``action`` checked against the action space: an ``int`` (``Discrete``) or an int64 array
        (``MultiDiscrete``).

        Raises:
            RuntimeError: before ``reset()`` or after the episode ended.
            ValueError: for anything outside the action space (wrong type, dtype or shape, floats,
                bools, out-of-range or huge integers), naming the value. Floats are never truncated.
        """
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        space = self.action_space
        if isinstance(space, gym.spaces.MultiDiscrete):
            try:
                arr = np.asarray(action)
            except (ValueError, TypeError) as exc:  # ragged nested lists, objects numpy cannot read
                raise ValueError(
                    f"action {brief(action)} is not an array of integers of shape {space.shape}: {exc}"
                ) from None
            if not np.issubdtype(arr.dtype, np.integer) or arr.shape != space.shape:
                raise ValueError(
                    f"action {brief(action)} of dtype {arr.dtype} and shape {arr.shape}; expected integers of shape "
                    f"{space.shape} (MultiDiscrete: {space.shape[0]} entries)"
                )
            # Compare as Python ints: uint64 entries above 2**63 must not wrap when cast to int64.
            for i, (value, n) in enumerate(zip(arr.tolist(), space.nvec.tolist(), strict=True)):
                if not 0 <= value < n:
                    raise ValueError(f"action entry {i} = {value}; expected 0..{n - 1} (action {brief(action)})")
            return arr.astype(np.int64)
        assert isinstance(space, gym.spaces.Discrete)
        n = int(space.n)
        is_int = isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_))
        if isinstance(action, np.ndarray) and action.shape == () and np.issubdtype(action.dtype, np.integer):
            is_int, action = True, action.item()
        if not is_int:
            raise ValueError(
                f"action {brief(action)} is outside the action space {space}: expected an integer 0..{n - 1}, "
                f"got {type(action).__name__}"
            )
        value = int(action)  # Python ints: no overflow for huge values
        if not 0 <= value < n:
            raise ValueError(f"action {brief(action)} is outside the action space {space}: expected 0..{n - 1}")
        return value

    def _invalid(self, reason: str) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """The step of an action inside the action space that the mask forbids.

        With ``invalid_action="raise"``, ``ValueError(reason)`` and the episode goes on unchanged.
        With ``"end"``, the action is not applied and the episode terminates in the state the
        action answered (its observation, :meth:`_state_observation`), with the reward's
        :meth:`~placement_rl.envs.reward.Reward.invalid_action_reward` and ``info["invalid_action"]``.
        """
        if self.config.invalid_action == "raise":
            raise ValueError(reason)
        assert self.data is not None
        obs = self._state_observation()
        self._done = True
        info = {
            "instance": self.data.instance.name,
            "partial_makespan_s": self._partial_s,
            "invalid_action": True,
            "invalid_action_reason": reason,
        }
        return obs, float(self.reward_fn.invalid_action_reward()), True, False, info

    def _finish(self, plan: Plan, previous_partial_s: float) -> tuple[float, dict[str, Any]]:
        """Simulate the final plan on the original graph; the reward and ``info`` of the last step."""
        assert self.data is not None
        data = self.data
        result = data.fine_ctx.simulate(plan, validate=False)
        self._done = True
        reward = self.reward_fn(
            Outcome(previous_partial_s, self._partial_s, self._partial_baseline_s(), result, data.baseline)
        )
        speedup = data.baseline.makespan_s / result.makespan_s if result.makespan_s > 0 else float("inf")
        info = {
            "instance": data.instance.name,
            "makespan_s": result.makespan_s,
            "dp_makespan_s": data.baseline.makespan_s,
            "speedup": speedup,
            "oom": result.oom,
            "result": result.summary(),
            "plan": plan,
        }
        return reward, info

    def _partial_baseline_s(self) -> float:
        """The makespan partial plans are compared with: data parallelism as partial plans are simulated."""
        assert self.data is not None
        return self.data.baseline_partial[0]

    def _step_reward(self, previous_partial_s: float) -> float:
        assert self.data is not None
        return self.reward_fn(
            Outcome(previous_partial_s, self._partial_s, self._partial_baseline_s(), None, self.data.baseline)
        )

    # ------------------------------------------------------------ snapshots
    def snapshot(self) -> EnvSnapshot:
        """The state of the running episode, to :meth:`restore` later (see the class docstring).

        Raises:
            RuntimeError: before the first ``reset()``.
        """
        if self.data is None:
            raise RuntimeError("snapshot() before reset(); there is no episode to snapshot")
        return EnvSnapshot(
            env_class=type(self),
            config=self.config,
            data=self.data,
            state={name: _own(getattr(self, name)) for name in self.EPISODE_STATE},
            delta=_fork(self._delta),
            np_random_state=None if self._np_random is None else self._np_random.bit_generator.state,
            np_random_seed=self._np_random_seed,
        )

    def restore(self, snapshot: EnvSnapshot) -> None:
        """Put the env back in the state of ``snapshot`` (which stays unchanged, to restore again).

        Raises:
            ValueError: if ``snapshot`` is not an :class:`EnvSnapshot`, or came from an env of another
                class or with another config.
        """
        if not isinstance(snapshot, EnvSnapshot):
            raise ValueError(f"restore({brief(snapshot)}): expected an EnvSnapshot from snapshot()")
        if snapshot.env_class is not type(self) or (
            snapshot.config is not self.config and snapshot.config != self.config
        ):
            raise ValueError(
                f"snapshot of a {snapshot.env_class.__name__} with config {snapshot.config!r} cannot be restored "
                f"into this {type(self).__name__} with config {self.config!r}; a snapshot restores only into the "
                f"env it came from or one of the same class built with an equal config"
            )
        self.data = snapshot.data
        for name, value in snapshot.state.items():
            setattr(self, name, _own(value))
        self._delta = _fork(snapshot.delta)
        state = snapshot.np_random_state
        if state is None:
            self._np_random = None
        else:
            if self._np_random is None or type(self._np_random.bit_generator).__name__ != state["bit_generator"]:
                self._np_random = np.random.Generator(getattr(np.random, state["bit_generator"])())
            self._np_random.bit_generator.state = state  # copies the values: the snapshot keeps its dict
        self._np_random_seed = snapshot.np_random_seed

    # ------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # rebuilt on demand; contexts are large
        state["_delta"] = None  # rebuilt from _configs on the next step
        data = state.get("data")
        if data is not None:  # keep the instance and its baselines, drop the heavy contexts
            state["data"] = None
            state["_instance"] = data.instance
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        instance = state.pop("_instance", None)
        self.__dict__.update(state)
        if instance is not None:
            self.data = self._instance_data(instance)


def bytes_on_devices(data: InstanceData, index: int, cfg: OpConfig) -> np.ndarray:
    """(D,) static state plus forward activations of group ``index`` under ``cfg``, per device."""
    compiled = data.group_ctx.compile(index, cfg)
    D = data.instance.topology.num_devices
    need = np.bincount(compiled.devices, weights=compiled.activation_bytes, minlength=D)
    if compiled.static_devices.size:
        need += np.bincount(compiled.static_devices, weights=compiled.static_bytes, minlength=D)
    return need
