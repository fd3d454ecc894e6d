"""Fixtures of the RL tests: one short training run of the tiny config (tests/conftest.py) shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_run(ray_local: Any, tiny_yaml: Path) -> Path:
    """A finished 4-iteration training run of the tiny config (run folder)."""
    from placement_rl.rl.config import load_train_config
    from placement_rl.rl.train import train

    cfg = load_train_config(tiny_yaml)
    return train(cfg, progress=None)
