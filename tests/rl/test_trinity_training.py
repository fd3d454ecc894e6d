"""Trinity on RLlib: training improves on a random policy, checkpoints restore, the CLI commands work."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

import placement_rl.envs  # noqa: F401
from placement_rl.cli import main
from placement_rl.envs import RandomAgent, run_episode
from placement_rl.rl.config import TrainConfig, load_train_config


def _rows(run: Path) -> list[dict[str, float]]:
    with open(run / "progress.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def test_training_beats_a_random_policy(tiny_run: Path, tiny: dict[str, Any]) -> None:
    env = gym.make("placement_rl/Placement-v0", config={**tiny["env"], "mode": "one_shot"})
    random_mean = float(np.mean([run_episode(env, RandomAgent(s), seed=s)["reward"] for s in range(64)]))
    rows = _rows(tiny_run)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["env_steps"] == 4 * tiny["ppo"]["train_batch_size"]
    # Observed with seed 0: random ~1.5, the trained policy's last batch ~8 (speedup reward on lenet x trinity).
    assert rows[-1]["episode_return_mean"] > random_mean + 2.0, (rows[-1], random_mean)
    assert rows[-1]["episode_return_mean"] > rows[0]["episode_return_mean"]


def test_training_writes_checkpoints_metrics_and_plot(tiny_run: Path) -> None:
    for name in ("checkpoint_000002", "checkpoint_000004", "checkpoint_final"):
        assert (tiny_run / name / "rllib_checkpoint.json").is_file(), name
    assert (tiny_run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = list((tiny_run / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    saved = json.loads((tiny_run / "train_config.json").read_text())
    assert TrainConfig.from_dict(saved).env["one_shot_groups"] == 4


def test_checkpoint_restores_the_same_actions(ray_local: Any, tiny_yaml: Path, tmp_path: Path) -> None:
    import torch
    from ray.rllib.core import Columns

    from placement_rl.rl.agents import CONFIG_FILE
    from placement_rl.rl.policy import load_policy
    from placement_rl.rl.train import save_checkpoint
    from placement_rl.rl.trinity import algorithm_config

    cfg = load_train_config(tiny_yaml)
    algo = algorithm_config(cfg).build_algo()
    try:
        algo.train()
        before_module = algo.get_module()
        env = gym.make("placement_rl/Placement-v0", config={**cfg.env, "mode": "one_shot"})
        obs, _ = env.reset(seed=0)
        batch = {Columns.OBS: {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}}
        before_module.eval()
        with torch.no_grad():
            before = before_module.forward_inference(batch)[Columns.ACTIONS]
        save_checkpoint(algo, cfg, tmp_path / "checkpoint")
    finally:
        algo.stop()
    (tmp_path / CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))
    policy = load_policy(tmp_path / "checkpoint")
    assert policy.config == cfg and policy.agent.name == "trinity"  # the checkpoint finds its agent by name
    with torch.no_grad():
        after = policy.module.forward_inference(batch)[Columns.ACTIONS]
    assert torch.equal(before, after)


def test_evaluate_command(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_run / "checkpoint_final"),
            "--topologies",
            "trinity",
            "--mcmc-budget",
            "300",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    methods = {r["method"]: r for r in out["rows"]}
    assert set(methods) == {"trinity", "data_parallel", "expert", "mcmc"}
    assert methods["data_parallel"]["speedup_over_dp"] == pytest.approx(1.0)
    policy = methods["trinity"]
    assert policy["speedup_over_dp"] == pytest.approx(methods["data_parallel"]["makespan_s"] / policy["makespan_s"])
    tolerance = out["win_tolerance"]
    assert tolerance == pytest.approx(0.01)
    beats = int(policy["speedup_over_dp"] > 1 + tolerance and not policy["oom"])
    ties = int(abs(policy["speedup_over_dp"] - 1) <= tolerance and not policy["oom"])
    assert out["instances"] == 1 and out["policy_beats_dp"] == beats and out["policy_ties_dp"] == ties


def test_evaluate_rejects_too_many_devices(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_run / "checkpoint_final"),
            "--topologies",
            "tag-testbed",
            "--mcmc-budget",
            "none",
        ]
    )
    assert code == 2
    assert "16 devices; the env config allows at most 4" in capsys.readouterr().err


def test_plan_includes_the_policy(tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--model",
            "lenet",
            "--batch-size",
            "32",
            "--topology",
            "trinity",
            "--methods",
            "dp",
            "--checkpoint",
            str(tiny_run / "checkpoint_final"),
            "--out-dir",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in out["methods"]}
    assert set(rows) == {"data_parallel", "trinity"}  # the policy's row is named after its agent
    assert rows["trinity"]["makespan_s"] > 0 and (tmp_path / "best_plan.json").is_file()


def test_tune_command(ray_local: Any, tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = yaml.safe_load(tiny_yaml.read_text())
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = {
        "base": "base.yaml",
        "overrides": {"run": {"iterations": 3}, "ppo": {"num_epochs": 1}},
        "search": {"ppo.lr": {"grid": [0.001, 0.003]}},
        "num_samples": 2,
        "metric": "episode_return_mean",
        "cpus_per_trial": 1,
        "output_dir": str(tmp_path / "sweep"),
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    # --set makes a shipped sweep smaller without editing it: one sample of one iteration
    assert main(["tune", str(tmp_path / "sweep.yaml"), "--set", "num_samples=1", "--set", "run.iterations=1"]) == 0
    with open(tmp_path / "sweep" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(float(r["config/ppo.lr"]) for r in rows) == [0.001, 0.003]
    assert all(r["error"] == "" and np.isfinite(float(r["episode_return_mean"])) for r in rows)
    best = yaml.safe_load((tmp_path / "sweep" / "best_config.yaml").read_text())
    cfg = TrainConfig.from_dict(best)
    assert cfg.ppo.lr in (0.001, 0.003) and cfg.run.iterations == 1
    assert cfg.run.num_env_runners == 0  # what the trials ran with (cpus_per_trial 1: no env runner)
    assert cfg.run.output_dir == str((tmp_path / "sweep" / "best").resolve())  # its own folder, not the base run's


class _Payload:
    """Pickled, it runs ``touch(path)`` when unpickled: what a crafted checkpoint would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.touch, (self.path,))


def test_a_crafted_checkpoint_runs_no_code(tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RLlib's pickles are never read to load a policy; a pickle in place of the weights, an object
    array inside them, or an export of the earlier pickled format is refused."""
    import pickle
    import shutil

    import torch

    sentinel = tmp_path / "pwned"
    crafted = tmp_path / "run"
    shutil.copytree(tiny_run / "checkpoint_final", crafted / "checkpoint_final")
    shutil.copy(tiny_run / "train_config.json", crafted / "train_config.json")
    for path in (crafted / "checkpoint_final").rglob("*.pkl"):  # every RLlib pickle becomes a payload
        path.write_bytes(pickle.dumps(_Payload(sentinel)))
    weights = crafted / "checkpoint_final" / "policy.npz"
    argv = ["evaluate", "--checkpoint", str(crafted / "checkpoint_final"), "--topologies", "trinity"]
    for payload in (
        lambda: torch.save({"weight": _Payload(sentinel)}, weights),  # a pickle named as the export
        lambda: np.savez(weights, weight=np.array([_Payload(sentinel)], dtype=object)),  # an object array
    ):
        payload()
        assert main([*argv, "--mcmc-budget", "none"]) == 2
        assert "not a state dict" in capsys.readouterr().err
    weights.unlink()
    assert main([*argv, "--mcmc-budget", "none"]) == 2
    assert "has no policy export" in capsys.readouterr().err
    torch.save({"weight": _Payload(sentinel)}, crafted / "checkpoint_final" / "policy.pt")  # the earlier format
    assert main([*argv, "--mcmc-budget", "none"]) == 2
    assert "no longer read" in capsys.readouterr().err
    assert not sentinel.exists()  # no payload ran
