"""YAML configs: the shipped files parse; every kind of bad input names the value and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from placement_rl.cli import main
from placement_rl.errors import SchemaError
from placement_rl.rl.config import load_sweep_config, load_train_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, doc: object, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def test_shipped_configs_parse() -> None:
    cfg = load_train_config(ROOT / "tune_configs" / "trinity_ppo.yaml")
    assert cfg.env["mode"] == "one_shot" and cfg.env["reward"] == "mdpe"
    assert (cfg.model.c, cfg.model.temperature, cfg.model.dropout) == (5.0, 10.0, 0.3)
    assert cfg.ppo.grad_clip == 1.0 and cfg.model.logit_noise == 0.1 and cfg.model.noise_steps == 500
    assert dict(cfg.env["reward_options"]) == {
        "alpha": 0.5,
        "beta": 0.3,
        "gamma": 0.2,
        "c_hat_gb": 8.0,
        "m_hat_gib": 8.0,
    }
    sweep = load_sweep_config(ROOT / "tune_configs" / "trinity_sweep.yaml")
    assert set(sweep.search) == {
        "ppo.lr",
        "ppo.clip_param",
        "ppo.entropy_coeff",
        "env.one_shot_groups",
        "env.reward_options.alpha",
        "env.reward_options.beta",
    }
    assert sweep.base.run.iterations == 15  # the override applied to the base file


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"nmae": "x"},
            r"unknown key\(s\) \['nmae'\]; expected some of \['agent', 'env', 'model', 'name', 'ppo', 'run'\]",
        ),
        ({"ppo": {"learning_rate": 0.1}}, r"ppo: unknown key\(s\) \['learning_rate'\]; expected some of \["),
        ({"run": {"iterations": 0}}, r"run: iterations = 0; expected an integer >= 1"),
        ({"ppo": {"lr": "fast"}}, r"ppo: lr = 'fast'; expected a finite number > 0"),
        ({"ppo": {"lr": float("nan")}}, r"ppo: lr = nan; expected a finite number > 0"),
        ({"ppo": {"train_batch_size": 8, "minibatch_size": 16}}, r"minibatch_size = 16; expected <= train_batch_size"),
        ({"model": {"hidden_partition": [64]}}, r"hidden_partition = \(64,\); expected two positive integer sizes"),
        ({"env": {"mode": "sequential"}}, r"env.mode = 'sequential'; the trinity agent needs 'one_shot'"),
        ({"agent": "alphazero"}, r"unknown agent 'alphazero'; expected one of: ppo_tag, tag, trinity"),
        ({"env": {"max_device": 8}}, r"unknown key\(s\) \['max_device'\]; expected some of"),
        ({"env": {"generator": {"kind": "fixed", "model": "resnet9000"}}}, r"unknown model 'resnet9000'"),
        ({"env": {"reward": "latency"}}, r"unknown reward 'latency'; expected one of: dense, mdpe, speedup"),
        ({"env": [1, 2]}, r"env: expected a mapping"),
    ],
)
def test_train_config_errors(tmp_path: Path, doc: dict, message: str) -> None:
    with pytest.raises((SchemaError, ValueError), match=message):
        load_train_config(write(tmp_path, doc))


def test_empty_and_misdirected_files(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"empty.yaml: the file is empty; expected a mapping"):
        load_train_config(write(tmp_path, "", "empty.yaml"))
    with pytest.raises(SchemaError, match=r"hidden_partition = 5; expected two positive integer sizes"):
        load_train_config(write(tmp_path, {"model": {"hidden_partition": 5}}))
    sweep = {"base": "/etc/passwd", "search": {"ppo.lr": {"choice": [0.1]}}}
    with pytest.raises(SchemaError, match=r"base = '/etc/passwd'; expected a training YAML file"):
        load_sweep_config(write(tmp_path, sweep, "sweep.yaml"))


def test_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "ppo: {lr: 0.1\nrun: [", "broken.yaml")
    with pytest.raises(SchemaError, match=r"broken.yaml: malformed YAML"):
        load_train_config(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_train_config(tmp_path / "missing.yaml")


def test_cli_reports_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(write(tmp_path, {"ppo": {"clip": 0.2}}))]) == 2
    assert "error: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        (
            {"base": "base.yaml", "search": {"ppo.momentum": {"choice": [1]}}},
            r"unknown key 'ppo.momentum'; searchable keys",
        ),
        ({"base": "base.yaml", "search": {"ppo.lr": {"normal": [0, 1]}}}, r"unknown kind 'normal'; expected one of"),
        ({"base": "base.yaml", "search": {"ppo.lr": {"uniform": [0.1]}}}, r"expected \[low, high\]"),
        ({"base": "base.yaml", "search": {"ppo.lr": {"loguniform": [-1, 1]}}}, r"expected 0 < low for a log-uniform"),
        (
            {"base": "base.yaml", "search": {"env.one_shot_groups": {"randint": [5, 1]}}},
            r"expected low < high, got \[5, 1\]",
        ),
        ({"base": "base.yaml", "search": {"ppo.lr": {"uniform": [0.1, ".nan"]}}}, r"'.nan' is not a finite number"),
        ({"base": "base.yaml", "search": {}}, r"search: expected a non-empty mapping"),
        ({"search": {"ppo.lr": {"choice": [0.1]}}}, r"missing 'base'"),
        ({"base": "base.yaml", "search": {"ppo.lr": {"choice": [0.1]}}, "trials": 3}, r"unknown key\(s\) \['trials'\]"),
        (
            {"base": "base.yaml", "search": {"ppo.lr": {"choice": [0.1]}}, "mode": "best"},
            r"mode = 'best'; expected one of \['max', 'min'\]",
        ),
        (
            {"base": "base.yaml", "overrides": {"ppo": {"lr": -1}}, "search": {"ppo.clip_param": {"choice": [0.1]}}},
            r"ppo: lr = -1; expected a finite number > 0",
        ),
    ],
)
def test_sweep_config_errors(tmp_path: Path, sweep: dict, message: str) -> None:
    write(tmp_path, {"name": "b"}, "base.yaml")
    with pytest.raises(SchemaError, match=message):
        load_sweep_config(write(tmp_path, sweep, "sweep.yaml"))


def test_sweep_settings_change_options_search_and_the_training_config() -> None:
    path = ROOT / "tune_configs" / "trinity_sweep.yaml"
    sweep = load_sweep_config(
        path, ["num_samples=1", "run.iterations=2", "search.ppo.lr={grid: [0.001]}", "metric=best_speedup"]
    )
    assert sweep.options.num_samples == 1 and sweep.options.metric == "best_speedup"
    assert sweep.base.run.iterations == 2  # joins the file's overrides, wins over them
    assert sweep.search["ppo.lr"] == ("grid", (0.001,))
    assert "ppo.clip_param" in sweep.search  # the file's other domains stay
    with pytest.raises(SchemaError, match=r"--set 'iterations'; expected KEY=VALUE"):
        load_sweep_config(path, ["iterations"])
    with pytest.raises(SchemaError, match=r"with --set run\.no_such_key=1"):
        load_sweep_config(path, ["run.no_such_key=1"])
    with pytest.raises(SchemaError, match=r"num_samples"):
        load_sweep_config(path, ["num_samples=0"])


def test_the_best_trial_is_the_best_at_any_iteration() -> None:
    from types import SimpleNamespace

    import pandas as pd

    from placement_rl.rl.train import _best_trial

    def trial(history: list[float]) -> SimpleNamespace:
        return SimpleNamespace(
            metrics={"episode_return_mean": history[-1]},
            metrics_dataframe=pd.DataFrame({"episode_return_mean": history}),
        )

    peaked, steady = trial([0.1, 0.9, 0.2]), trial([0.3, 0.4, 0.5])
    assert _best_trial([steady, peaked], "episode_return_mean", "max") is peaked  # not the last value's 0.5
    assert _best_trial([steady, peaked], "episode_return_mean", "min") is peaked  # 0.1
    no_history = SimpleNamespace(metrics={"episode_return_mean": 0.6}, metrics_dataframe=None)
    assert _best_trial([steady, no_history], "episode_return_mean", "max") is no_history


def test_every_agent_has_a_smoke_config_and_a_smoke_sweep_ships() -> None:
    agents = {}
    for name in ("ppo_tag_smoke", "tag_smoke", "trinity_smoke"):
        cfg = load_train_config(ROOT / "tune_configs" / f"{name}.yaml")
        assert cfg.run.iterations <= 4 and cfg.run.num_env_runners == 0, name
        assert cfg.env["generator"]["model"] == "lenet", name
        agents[cfg.agent] = name
    assert set(agents) == {"ppo_tag", "tag", "trinity"}
    sweep = load_sweep_config(ROOT / "tune_configs" / "smoke_sweep.yaml")
    assert sweep.base.run.iterations <= 4 and sweep.options.cpus_per_trial == 1
