"""Small instances and helpers shared by the environment tests (importable as ``env_cases``: pytest puts
this folder on ``sys.path`` for its conftest.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

GIB = 2**30
PLACEMENT, SHARDING = "placement_rl/Placement-v0", "placement_rl/Sharding-v0"


def small(model: str = "lenet", topology: str = "trinity") -> dict[str, Any]:
    """A fixed-instance generator config: ``model`` at batch 32 on ``topology``."""
    return {"kind": "fixed", "model": model, "topology": topology, "batch_size": 32}


def allowed(obs: dict[str, np.ndarray]) -> list[int]:
    """The actions the observation's mask allows."""
    return np.flatnonzero(obs["action_mask"]).tolist()
