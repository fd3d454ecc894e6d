"""``placement_rl/Placement-v0``."""

from .env import PlacementEnv
from .types import PlacementConfig

__all__ = ["PlacementConfig", "PlacementEnv"]
