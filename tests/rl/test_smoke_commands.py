"""The agents page's smoke runs, as written: every agent's smoke training, its checkpoint evaluated on
unseen test topologies, a plan with it and the smoke sweep (the training runs in the ``smoke_dir``
fixture, which the ppo_tag tests share)."""

from __future__ import annotations

import contextlib
import json
import shlex
from pathlib import Path

import pytest
import yaml
from conftest import smoke_commands

from placement_rl.cli import main


def test_the_block_has_a_smoke_run_for_every_agent() -> None:
    commands = smoke_commands()
    trained = [shlex.split(c)[2] for c in commands if c.startswith("placement-rl train ")]
    agents = {yaml.safe_load(Path(__file__).resolve().parents[2].joinpath(p).read_text()).get("agent", "trinity")
              for p in trained}  # fmt: skip
    assert agents == {"trinity", "tag", "ppo_tag"}
    evaluated = [c for c in commands if c.startswith("placement-rl evaluate ")]
    assert len(evaluated) == len(trained) and all("--topologies test" in c for c in evaluated)
    assert any(c.startswith("placement-rl tune ") for c in commands)


def test_every_smoke_line_runs_as_written(smoke_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ran = []
    with contextlib.chdir(smoke_dir):
        for command in smoke_commands():
            if command.startswith("placement-rl train "):
                continue  # ran in the fixture
            capsys.readouterr()
            assert main(shlex.split(command)[1:]) in (0, None), command
            ran.append((command, capsys.readouterr().out))
    evaluations = [out for command, out in ran if " evaluate " in f" {command}"]
    assert len(evaluations) == 3 and all("beats data parallel" in out for out in evaluations), evaluations
    sweep = smoke_dir / "out" / "smoke-sweep"
    assert (sweep / "results.csv").is_file() and (sweep / "best_config.yaml").is_file()
    best = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert best["ppo"]["lr"] in (0.001, 0.003) and best["run"]["num_env_runners"] == 0
    plan = json.loads((smoke_dir / "out" / "plan-lenet-tag-testbed" / "best_plan.json").read_text())
    assert plan["graph"] == "lenet"
