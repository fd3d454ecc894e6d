"""A sweep whose domain holds a value no trial can run is refused before any trial starts: every value of
a ``choice`` / ``grid`` and both ends of a range go through the field's own validation, naming the field
and the value (:func:`placement_rl.rl.config.check_search_values`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from placement_rl.cli import main
from placement_rl.errors import SchemaError
from placement_rl.rl.config import domain_candidates, load_sweep_config


def sweep_file(tmp_path: Path, search: dict[str, Any], overrides: dict[str, Any] | None = None) -> Path:
    """A sweep over the default trinity training config (with ``overrides``) with ``search``."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"name": "b"}))
    path = tmp_path / "sweep.yaml"
    doc = {"base": "base.yaml", "overrides": overrides or {}, "search": search, "num_samples": 1}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("search", "message"),
    [
        (
            {"ppo.clip_param": {"choice": [0.1, "bogus"]}},
            "search.ppo.clip_param.choice: value: 'bogus' is not a valid ppo.clip_param, so no trial could run "
            "with it (trial.ppo: clip_param = 'bogus'; expected a finite number > 0)",
        ),
        (
            {"ppo.lr": {"uniform": [-0.1, 0.1]}},
            "search.ppo.lr.uniform: low end: -0.1 is not a valid ppo.lr, so no trial could run with it (trial.ppo: "
            "lr = -0.1; expected a finite number > 0)",
        ),
        (
            {"ppo.lr": {"uniform": [-1, -0.5]}},
            "search.ppo.lr.uniform: low end: -1.0 is not a valid ppo.lr",
        ),
        (
            {"ppo.gamma": {"uniform": [0.5, 1.5]}},
            "search.ppo.gamma.uniform: high end: 1.5 is not a valid ppo.gamma",
        ),
        (
            {"ppo.entropy_coeff": {"grid": [0.0, -0.01]}},
            "search.ppo.entropy_coeff.grid: value: -0.01 is not a valid ppo.entropy_coeff",
        ),
        (
            {"env.one_shot_groups": {"randint": [1, 5000]}},
            "search.env.one_shot_groups.randint: largest value (high - 1; randint excludes high): 4999 is not a valid "
            "env.one_shot_groups",
        ),
        (
            {"env.one_shot_groups": {"uniform": [4, 16]}},
            "uniform samples floats: for an integer field, expected randint or choice",
        ),
    ],
)
def test_a_value_no_trial_can_run_is_refused_naming_the_field(
    tmp_path: Path, search: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError) as error:
        load_sweep_config(sweep_file(tmp_path, search))
    assert message in str(error.value)


def test_env_options_are_checked_by_the_env_and_its_reward(tmp_path: Path) -> None:
    search = {"env.reward_options.alpha": {"choice": [0.5, "high"]}}
    with pytest.raises(SchemaError, match=r"alpha.choice: value: 'high' is not a valid env.reward_options.alpha"):
        load_sweep_config(sweep_file(tmp_path, search, {"env": {"reward": "mdpe"}}))
    # the default reward (speedup) has no alpha: no value of the domain can run
    with pytest.raises(
        SchemaError, match=r"value: 0.5 is not a valid .*reward 'speedup': unknown key\(s\) \['alpha'\]"
    ):
        load_sweep_config(sweep_file(tmp_path, search))


def test_a_value_valid_beside_another_searched_value_is_kept(tmp_path: Path) -> None:
    """A minibatch of 128 runs beside a batch of 256: refused only when no searched batch is large enough."""
    batch = {"ppo.train_batch_size": {"choice": [64, 256]}}
    sweep = load_sweep_config(sweep_file(tmp_path, {**batch, "ppo.minibatch_size": {"choice": [32, 128]}}))
    assert sweep.search["ppo.minibatch_size"] == ("choice", (32, 128))
    with pytest.raises(
        SchemaError, match=r"value: 512 is not a valid ppo.minibatch_size.*expected <= train_batch_size"
    ):
        load_sweep_config(sweep_file(tmp_path, {**batch, "ppo.minibatch_size": {"choice": [32, 512]}}))


def test_the_shipped_sweeps_pass(repo_root: Path) -> None:
    for path in sorted((repo_root / "tune_configs").glob("*sweep*.yaml")):
        assert load_sweep_config(path).search


def test_domain_candidates_stand_for_every_sample() -> None:
    assert domain_candidates("choice", [1, "x"]) == [("value", 1), ("value", "x")]
    assert domain_candidates("uniform", [1, 2]) == [("low end", 1.0), ("high end", 2.0)]
    assert domain_candidates("randint", [1, 5]) == [
        ("low end", 1),
        ("largest value (high - 1; randint excludes high)", 4),
    ]


def test_tune_refuses_a_bad_choice_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, ``tune`` sampled the valid value only and exited 0; now one error line, status 2, no Ray."""
    path = sweep_file(tmp_path, {"ppo.clip_param": {"choice": ["tag", "bogus"]}})
    assert main(["tune", str(path), "--set", "num_samples=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path} with --set num_samples=1.search.ppo.clip_param.choice:")
    assert "value: 'tag' is not a valid ppo.clip_param" in err[0]
    assert not (tmp_path / "out").exists()
