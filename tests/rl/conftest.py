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


#: The page whose "Smoke runs" block the smoke tests run as written.
AGENTS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "agents.md"


def smoke_commands() -> list[str]:
    """The ``placement-rl ...`` lines of the agents page's "Smoke runs" block, comments cut, in order."""
    text = AGENTS_PAGE.read_text(encoding="utf-8")
    section = text.split("## Smoke runs", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.startswith("placement-rl ")]


@pytest.fixture(scope="session")
def smoke_dir(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the smoke block's ``train`` lines ran as written (``out/...`` lies in it; the
    shipped ``tune_configs/`` is linked in): the other lines run there too."""
    import contextlib
    import shlex

    from placement_rl.cli import main

    root = Path(__file__).resolve().parents[2]
    folder = tmp_path_factory.mktemp("smoke")
    (folder / "tune_configs").symlink_to(root / "tune_configs")
    with contextlib.chdir(folder):
        for command in smoke_commands():
            if command.startswith("placement-rl train "):
                assert main(shlex.split(command)[1:]) == 0, command
    return folder
