"""Configuration of ``placement_rl/Placement-v0``."""

from __future__ import annotations

from dataclasses import dataclass

from placement_rl.config import choice, integer, option
from placement_rl.errors import SchemaError
from placement_rl.search.tag import COMPLETIONS, DEFAULT_MAX_SUBSETS, DEVICE_GROUPINGS, OPTION_SETS

from ..base import MAX_ACTIONS, MAX_EDGES, MAX_NODES, EnvConfig

#: The values of :attr:`PlacementConfig.mode` and :attr:`PlacementConfig.action_space`.
MODES: tuple[str, ...] = ("sequential", "one_shot")
#: The values of :attr:`PlacementConfig.memory_mask`.
MEMORY_MASKS: tuple[str, ...] = ("auto", "hard", "none")
ACTION_SPACES: tuple[str, ...] = ("device", "tag")
#: The most groups ``k`` of the one-shot partition (:attr:`PlacementConfig.one_shot_groups`).
MAX_ONE_SHOT_GROUPS = 1_024
#: The most device groups and device-group subsets of the TAG action space.
MAX_DEVICE_GROUPS, MAX_SUBSETS = 256, 4_096
#: Edge columns per node row with ``action_space="tag"`` when ``max_edges`` is unset: the zoo's densest
#: op-group graphs, the recurrent models', have up to 15 tensors per group (gnmt in 6 groups: 90,
#: rnntc: 89; gnmt in 20: 276), above the 8 per row of the other modes; TAG's GNN skips padded edges.
TAG_EDGES_PER_NODE = 16


@dataclass(frozen=True)
class PlacementConfig(EnvConfig):
    """Placement-v0 options (plus those of :class:`~placement_rl.envs.base.EnvConfig`).

    Attributes:
        mode: ``sequential`` (TAG: one step per op group) or ``one_shot`` (Trinity / Hierarchical:
            one step assigns every op to a group and every group to a device).
        action_space: ``device`` (a device per group) or ``tag`` (a subset of device groups x a TAG
            replication option per group, :mod:`placement_rl.search.tag`); sequential mode only
            (``tag`` with ``one_shot`` is refused).
        device_grouping: ``tag``: TAG's device groups are the topology's ``machine`` s or its
            ``gpu_type`` s.
        max_edges: edge columns of the observation (:class:`~placement_rl.envs.base.EnvConfig`); unset:
            ``8 * max_nodes``, or ``16 * max_nodes`` with ``action_space="tag"`` (:data:`TAG_EDGES_PER_NODE`:
            room for the zoo's densest op-group graphs).
        max_device_groups: ``tag``: device-group rows of the observation (at most
            :data:`MAX_DEVICE_GROUPS`); an instance with more is refused at reset.
        tag_completion: ``tag``: how a partial plan is completed for its score, the observation and
            the ``dense`` reward (:data:`placement_rl.search.tag.COMPLETIONS`): ``best`` of TAG's rule,
            data parallelism over the device groups decided so far and a list-scheduling rollout, or TAG's
            rule alone (``tag``: undecided groups take the first decision's strategy).
        tag_options: ``tag``: the replication options of the action space, a named set of
            :data:`placement_rl.search.tag.OPTION_SETS`: ``tag`` (TAG's four, the default:
            ``all_reduce``, ``parameter_server``, ``duplicate``, ``model_parallel``) or ``extended``
            (those and ``tensor_parallel``, ``pipeline``, ``fsdp``, the tree search's default:
            actions that fit where the data-parallel plan does not). It sets the action count
            (:attr:`num_tag_options` per subset) and the columns of the observation's
            ``node_option``, so a policy trained with one set plans only with that set.
        max_subsets: ``tag``: device-group subsets in the action space (capped by the rule of
            :func:`placement_rl.search.tag.device_subsets`; at least the instance's device groups);
            the action space is ``Discrete(max_subsets * O)`` with ``O`` the options of
            ``tag_options`` (4 or 7). At most :data:`MAX_SUBSETS`.
        one_shot_ops: one-shot mode: graphs with more ops are METIS-coarsened to this many op
            groups first (smaller graphs use their raw ops); also the observation's node rows. At
            most :data:`~placement_rl.envs.base.MAX_NODES`.
        one_shot_groups: one-shot mode: the number of groups ``k`` ops are partitioned into; at
            most :data:`MAX_ONE_SHOT_GROUPS`. The one-shot action mask has ``max_nodes * k + k *
            max_devices`` entries, at most :data:`~placement_rl.envs.base.MAX_ACTIONS`.
        memory_mask: ``hard``: a device whose remaining memory (by the env's estimate) cannot hold
            the group being placed is masked; ``none``: nothing is masked by memory (the final plan
            may run out of memory; Trinity's MDPE reward penalizes it softly); ``auto``: ``hard`` in
            sequential mode, ``none`` in one-shot mode (the paper's Trinity). In one-shot mode the
            hard mask depends on the sampled partition and on the devices of the groups before, so
            the observation gets ``node_memory_gib`` (each op slot's need) and the policy applies
            the mask while it decodes groups ``0 .. k-1`` in order
            (:func:`placement_rl.envs.placement.env.one_shot_memory_mask`); ``step`` refuses a
            placement it forbids as an invalid action. The sequential mode always masks by memory
            (``none`` is refused there).
    """

    mode: str = option("sequential", rule=choice(MODES))
    action_space: str = option("device", rule=choice(ACTION_SPACES))
    one_shot_ops: int = option(512, rule=integer(low=1, high=MAX_NODES))
    one_shot_groups: int = option(16, rule=integer(low=1, high=MAX_ONE_SHOT_GROUPS))
    device_grouping: str = option("machine", rule=choice(DEVICE_GROUPINGS))
    max_device_groups: int = option(16, rule=integer(low=1, high=MAX_DEVICE_GROUPS))
    max_subsets: int = option(DEFAULT_MAX_SUBSETS, rule=integer(low=1, high=MAX_SUBSETS))
    tag_completion: str = option("best", rule=choice(COMPLETIONS))
    tag_options: str = option("tag", rule=choice(tuple(OPTION_SETS)))
    memory_mask: str = option("auto", rule=choice(MEMORY_MASKS))

    def validate(self, where: str) -> None:
        """Rules that tie fields together: ``tag`` is sequential only; the one-shot mask's size."""
        if self.mode == "one_shot" and self.action_space != "device":
            raise SchemaError(
                f"{where}: action_space = {self.action_space!r} with mode = 'one_shot'; the TAG action space is "
                f"for mode = 'sequential' (one-shot actions are a group per op and a device per group)"
            )
        if self.mode == "sequential" and self.memory_mask == "none":
            raise SchemaError(
                f"{where}: memory_mask = 'none' with mode = 'sequential'; the sequential mode always masks "
                f"actions by memory (expected 'auto' or 'hard', or mode = 'one_shot')"
            )
        if self.num_actions > MAX_ACTIONS:
            n, k, d = self.nodes, self.one_shot_groups, self.max_devices
            raise SchemaError(
                f"{where}: the one-shot action mask would have max_nodes * one_shot_groups + one_shot_groups * "
                f"max_devices = {n} * {k} + {k} * {d} = {self.num_actions} entries; at most {MAX_ACTIONS} "
                f"(lower one_shot_ops / max_nodes, one_shot_groups or max_devices)"
            )

    @property
    def num_actions(self) -> int:
        """Entries of the action mask: one per action (sequential) or per slot and choice (one-shot)."""
        if self.mode == "one_shot":
            return self.nodes * self.one_shot_groups + self.one_shot_groups * self.max_devices
        return self.max_subsets * self.num_tag_options if self.action_space == "tag" else self.max_devices

    @property
    def tag_option_names(self) -> tuple[str, ...]:
        """The replication options of ``tag_options``, in action order (``a = s * O + o``)."""
        return OPTION_SETS[self.tag_options]

    @property
    def num_tag_options(self) -> int:
        """``O``: the options per device-group subset of the TAG action space."""
        return len(self.tag_option_names)

    @property
    def hard_memory_mask(self) -> bool:
        """Whether devices are masked by memory (always in sequential mode; one-shot: ``memory_mask="hard"``)."""
        return self.memory_mask == "hard" or (self.memory_mask == "auto" and self.mode == "sequential")

    @property
    def nodes(self) -> int:
        if self.max_nodes:
            return self.max_nodes
        return self.one_shot_ops if self.mode == "one_shot" else self.max_groups

    @property
    def groups_per_instance(self) -> int:
        """How many op groups an instance is coarsened to."""
        return self.one_shot_ops if self.mode == "one_shot" else self.max_groups

    @property
    def edges(self) -> int:
        """Edge columns of the observation: ``max_edges``, else 8 per node row, or
        :data:`TAG_EDGES_PER_NODE` with ``action_space="tag"`` (at most :data:`MAX_EDGES`)."""
        if self.max_edges:
            return self.max_edges
        return min((TAG_EDGES_PER_NODE if self.action_space == "tag" else 8) * self.nodes, MAX_EDGES)
