"""Configuration of ``placement_rl/Sharding-v0``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placement_rl.config import choice, integer, option, sequence_of
from placement_rl.search.space import ALL_KINDS

from ..base import MAX_DEVICES, EnvConfig

#: The most configurations per group (:attr:`ShardingConfig.max_configs`, the action count).
MAX_CONFIGS = 65_536


@dataclass(frozen=True)
class ShardingConfig(EnvConfig):
    """Sharding-v0 options (plus those of :class:`~placement_rl.envs.base.EnvConfig`).

    Attributes:
        max_configs: the action count: each group's SOAP configuration set is capped to this many
            (contiguous device views first, then the rest in the set's order); at most :data:`MAX_CONFIGS`.
        dim_kinds: the dimension kinds a configuration may split, a list of ``sample``, ``attribute``
            and ``parameter`` (an empty list: device views only, no split).
        max_partitions: the most partitions one group may have (default: the device count); at
            most :data:`~placement_rl.envs.base.MAX_DEVICES`.
    """

    max_configs: int = option(256, rule=integer(low=1, high=MAX_CONFIGS))
    dim_kinds: Sequence[str] = option(ALL_KINDS, rule=sequence_of(choice(ALL_KINDS)))
    max_partitions: int | None = option(None, rule=integer(low=1, high=MAX_DEVICES, null=True))

    @property
    def num_actions(self) -> int:
        """Entries of the action mask: one per configuration index."""
        return self.max_configs

    @property
    def groups_per_instance(self) -> int:
        return self.max_groups
