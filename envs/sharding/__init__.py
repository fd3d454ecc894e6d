"""``placement_rl/Sharding-v0``."""

from .env import ShardingEnv
from .types import ShardingConfig

__all__ = ["ShardingConfig", "ShardingEnv"]
