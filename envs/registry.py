"""The one registry: Gymnasium ids and RLlib env names of every environment.

``import placement_rl.envs`` registers the Gymnasium ids, so ``gymnasium.make("placement_rl/Placement-v0",
config={...})`` works. RLlib resolves env names in its workers: call :func:`register_rllib_envs`
in the driver before building an algorithm (it imports Ray, so the core never does).
Bump an id's version when its behaviour changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

#: id -> "module:Class" of every environment.
ENV_IDS: dict[str, str] = {
    "placement_rl/Placement-v0": "placement_rl.envs.placement.env:PlacementEnv",
    "placement_rl/Sharding-v0": "placement_rl.envs.sharding.env:ShardingEnv",
}


def register_envs() -> None:
    """Register every id with Gymnasium (idempotent)."""
    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def env_creator(env_id: str) -> Callable[[Any], gym.Env[Any, Any]]:
    """A ``config -> env`` function for ``env_id`` (what RLlib's ``register_env`` takes)."""
    if env_id not in ENV_IDS:
        from placement_rl.errors import UnknownNameError

        raise UnknownNameError("environment", env_id, ENV_IDS)
    module, cls = ENV_IDS[env_id].split(":")

    def create(config: Any) -> gym.Env[Any, Any]:
        import importlib

        return getattr(importlib.import_module(module), cls)(dict(config or {}))  # type: ignore[no-any-return]

    return create


def register_rllib_envs() -> None:
    """Register every id with RLlib (``ray.tune.registry.register_env``) under the same names."""
    from ray.tune.registry import register_env

    for env_id in ENV_IDS:
        register_env(env_id, env_creator(env_id))
