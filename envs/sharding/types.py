"""Configuration of ``placement_rl/Sharding-v0``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placement_rl.config import integer, option
from placement_rl.search.space import ALL_KINDS

from ..base import EnvConfig


@dataclass(frozen=True)
class ShardingConfig(EnvConfig):
    """Sharding-v0 options (plus those of :class:`~placement_rl.envs.base.EnvConfig`).

    Attributes:
        max_configs: the action count: each group's SOAP configuration set is capped to this many
            (contiguous device views first, then the rest in the set's order).
        dim_kinds: the dimension kinds a configuration may split (``sample``, ``attribute``, ``parameter``).
        max_partitions: the most partitions one group may have (default: the device count).
    """

    max_configs: int = option(256, rule=integer(low=1))
    dim_kinds: Sequence[str] = ALL_KINDS  # checked by the SearchSpace at reset (it names the valid kinds)
    max_partitions: int | None = option(None, rule=integer(low=1, null=True))

    @property
    def groups_per_instance(self) -> int:
        return self.max_groups
