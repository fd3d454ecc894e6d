"""Fixtures of the RL tests: a tiny Trinity config and one short training run shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

TINY: dict[str, Any] = {
    "name": "tiny",
    "env": {
        "generator": {"kind": "fixed", "model": "lenet", "topology": "trinity", "batch_size": 32},
        "one_shot_ops": 16,
        "one_shot_groups": 4,
        "max_devices": 4,
        "node2vec_dim": 8,
        "reward": "speedup",
    },
    "ppo": {"train_batch_size": 32, "minibatch_size": 16, "num_epochs": 2, "lr": 0.003},
    "run": {"iterations": 4, "num_env_runners": 0, "checkpoint_every": 2, "seed": 0},
}


@pytest.fixture(scope="session")
def tiny() -> dict[str, Any]:
    """The tiny training config (a dict, as in YAML)."""
    return TINY


@pytest.fixture(scope="session")
def tiny_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny training config as a YAML file (its output folder inside the session's temp dir)."""
    folder = tmp_path_factory.mktemp("tiny")
    doc = {**TINY, "run": {**TINY["run"], "output_dir": str(folder / "run")}}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def tiny_run(ray_local: Any, tiny_yaml: Path) -> Path:
    """A finished 4-iteration training run of the tiny config (run folder)."""
    from placement_rl.rl.config import load_train_config
    from placement_rl.rl.train import train

    cfg = load_train_config(tiny_yaml)
    return train(cfg, progress=None)
