"""Gymnasium environments for placement and sharding, backed by the shared simulator.

* ``placement_rl/Placement-v0`` (:class:`PlacementEnv`): TAG's sequential placement of op groups
  (a device, or a machine x replication option, per group) and Trinity's one-shot partition +
  placement.
* ``placement_rl/Sharding-v0`` (:class:`ShardingEnv`): a SOAP parallel configuration per op group.

Importing this package registers both ids with Gymnasium (:mod:`.registry`).
"""

from .agents import GreedyAgent, RandomAgent, run_episode
from .base import EnvConfig, EnvSnapshot, PlanEnv
from .generator import (
    FixedGenerator,
    Instance,
    MixGenerator,
    PlantedGenerator,
    RandomGenerator,
    make_generator,
    make_instance,
)
from .placement import PlacementConfig, PlacementEnv
from .registry import ENV_IDS, register_envs, register_rllib_envs
from .reward import REWARDS, DenseReward, MDPEReward, Outcome, Reward, SpeedupReward, make_reward
from .sharding import ShardingConfig, ShardingEnv

register_envs()

__all__ = [
    "ENV_IDS",
    "REWARDS",
    "DenseReward",
    "GreedyAgent",
    "RandomAgent",
    "run_episode",
    "EnvConfig",
    "EnvSnapshot",
    "FixedGenerator",
    "Instance",
    "MDPEReward",
    "Outcome",
    "PlacementConfig",
    "MixGenerator",
    "PlacementEnv",
    "PlanEnv",
    "PlantedGenerator",
    "RandomGenerator",
    "Reward",
    "ShardingConfig",
    "ShardingEnv",
    "SpeedupReward",
    "make_generator",
    "make_instance",
    "make_reward",
    "register_envs",
    "register_rllib_envs",
]
