"""Configuration of ``placement_rl/Placement-v0``."""

from __future__ import annotations

from dataclasses import dataclass

from placement_rl.config import choice, integer, option

from ..base import EnvConfig

#: The values of :attr:`PlacementConfig.mode` and :attr:`PlacementConfig.action_space`.
MODES: tuple[str, ...] = ("sequential", "one_shot")
ACTION_SPACES: tuple[str, ...] = ("device", "tag")


@dataclass(frozen=True)
class PlacementConfig(EnvConfig):
    """Placement-v0 options (plus those of :class:`~placement_rl.envs.base.EnvConfig`).

    Attributes:
        mode: ``sequential`` (TAG: one step per op group) or ``one_shot`` (Trinity / Hierarchical:
            one step assigns every op to a group and every group to a device).
        action_space: ``device`` (a device per group) or ``tag`` (a machine x TAG replication option
            per group); sequential mode only.
        one_shot_ops: one-shot mode: graphs with more ops are METIS-coarsened to this many op
            groups first (smaller graphs use their raw ops); also the observation's node rows.
        one_shot_groups: one-shot mode: the number of groups ``k`` ops are partitioned into.
    """

    mode: str = option("sequential", rule=choice(MODES))
    action_space: str = option("device", rule=choice(ACTION_SPACES))
    one_shot_ops: int = option(512, rule=integer(low=1))
    one_shot_groups: int = option(16, rule=integer(low=1))

    @property
    def nodes(self) -> int:
        if self.max_nodes:
            return self.max_nodes
        return self.one_shot_ops if self.mode == "one_shot" else self.max_groups

    @property
    def groups_per_instance(self) -> int:
        """How many op groups an instance is coarsened to."""
        return self.one_shot_ops if self.mode == "one_shot" else self.max_groups
