"""The TAG agent on RLlib: self-play lowers the prior's cross-entropy, the trainer's outputs, the CLI
commands, checkpoint restore and the plan ``act`` returns (lenet on tag-testbed, 3 device groups)."""

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
from placement_rl.rl.config import TrainConfig, load_sweep_config, load_train_config

ROOT = Path(__file__).resolve().parents[2]

#: lenet at batch 32 on tag-testbed grouped by GPU type: 6 op groups, 3 device groups, 7 subsets (28 actions).
TINY_TAG: dict[str, Any] = {
    "name": "tiny-tag",
    "agent": "tag",
    "env": {
        "generator": {"kind": "fixed", "model": "lenet", "topology": "tag-testbed", "batch_size": 32},
        "max_groups": 6,
        "device_grouping": "gpu_type",
        "max_device_groups": 4,
        "max_subsets": 8,
        "max_devices": 16,
    },
    "model": {"hidden": 32, "layers": 2},
    "mcts": {"iterations_per_move": 16, "min_visits": 4, "eval_iterations": 32, "warm_start_iterations": 1},
    "training": {"lr": 0.01, "episodes_per_runner": 2, "num_epochs": 8, "minibatch_size": 16},
    "run": {"iterations": 4, "num_env_runners": 0, "checkpoint_every": 2, "seed": 0},
}


def _rows(run: Path) -> list[dict[str, float]]:
    with open(run / "progress.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def tag_run(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-iteration run of :data:`TINY_TAG` through ``placement-rl train``."""
    folder = tmp_path_factory.mktemp("tag")
    path = folder / "tiny_tag.yaml"
    path.write_text(yaml.safe_dump({**TINY_TAG, "run": {**TINY_TAG["run"], "output_dir": str(folder / "unused")}}))
    assert main(["train", str(path), "--out-dir", str(folder / "run")]) == 0
    return folder / "run"


def test_self_play_lowers_the_cross_entropy(tag_run: Path) -> None:
    rows = _rows(tag_run)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert {"speedup_mean", "best_speedup", "oom_fraction", "episode_return_mean", "cross_entropy"} <= set(rows[0])
    assert all(r["env_steps"] > 0 and r["speedup_mean"] > 0 for r in rows)
    ce = [r["cross_entropy"] for r in rows]
    assert np.isfinite(ce).all()
    # The targets of one small instance are learnt: seed 0 gave 3.1 -> 1.8 (uniform over 28 actions: 3.3).
    assert ce[-1] < ce[0] - 0.3, ce


def test_training_writes_checkpoints_curve_and_config(tag_run: Path) -> None:
    for name in ("checkpoint_000002", "checkpoint_000004", "checkpoint_final"):
        assert (tag_run / name / "rllib_checkpoint.json").is_file(), name
        assert (tag_run / name / "policy.npz").is_file(), name
    assert (tag_run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = TrainConfig.from_dict(json.loads((tag_run / "train_config.json").read_text()))
    assert saved.agent == "tag" and saved.env["action_space"] == "tag" and saved.mcts.min_visits == 4


def test_restored_policy_gives_the_same_prior_and_act_plans(ray_local: Any, tmp_path: Path) -> None:
    from placement_rl.policies.tag import prior_probs
    from placement_rl.rl.agents import CONFIG_FILE
    from placement_rl.rl.policy import load_policy
    from placement_rl.rl.tag import act, algorithm_config
    from placement_rl.rl.train import save_checkpoint
    from placement_rl.sim import simulate

    doc = {**TINY_TAG, "training": {**TINY_TAG["training"], "value_loss_coeff": 0.5}}
    cfg = TrainConfig.from_dict(doc)
    algo = algorithm_config(cfg).build_algo()
    try:
        result = algo.train()  # warm start: the uniform prior searches; the value head trains too
        learner = result["learners"]["default_policy"]
        assert np.isfinite(learner["cross_entropy"]) and np.isfinite(learner["value_loss"])
        env = gym.make("placement_rl/Placement-v0", config=dict(cfg.env))
        env.reset(seed=0)
        observations = [env.unwrapped.observe(()), env.unwrapped.observe((0,))]
        before = prior_probs(algo.get_module(), observations)
        save_checkpoint(algo, cfg, tmp_path / "checkpoint")
    finally:
        algo.stop()
    (tmp_path / CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))
    policy = load_policy(tmp_path / "checkpoint")
    assert policy.agent.name == "tag" and policy.config == cfg
    np.testing.assert_array_equal(prior_probs(policy.module, observations), before)

    info = act(policy.module, env)
    assert info["mcts_iterations"] == cfg.mcts.eval_iterations and info["search_s"] > 0
    instance = env.unwrapped.data.instance
    simulated = simulate(instance.graph, instance.topology, info["plan"])
    assert simulated.makespan_s == pytest.approx(info["makespan_s"])


def test_evaluate_and_plan_commands(tag_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = str(tag_run / "checkpoint_final")
    assert (
        main(["evaluate", "--checkpoint", checkpoint, "--topologies", "tag-testbed", "--mcmc-budget", "none", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    methods = {r["method"]: r for r in out["rows"]}
    assert {"tag", "data_parallel"} <= set(methods)
    tag = methods["tag"]
    assert tag["speedup_over_dp"] == pytest.approx(methods["data_parallel"]["makespan_s"] / tag["makespan_s"])
    assert out["instances"] == 1

    args = ["plan", "--model", "lenet", "--batch-size", "32", "--topology", "tag-testbed", "--methods", "dp"]
    assert main([*args, "--checkpoint", checkpoint, "--out-dir", str(tmp_path), "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["methods"]}
    assert set(rows) == {"data_parallel", "tag"} and rows["tag"]["makespan_s"] > 0
    assert (tmp_path / "best_plan.json").is_file()


def test_shipped_tag_configs_parse() -> None:
    cfg = load_train_config(ROOT / "tune_configs" / "tag_mcts.yaml")
    assert cfg.agent == "tag" and cfg.env["generator"]["kind"] == "random" and cfg.mcts.moves_fraction == 0.25
    extended = load_train_config(ROOT / "tune_configs" / "tag_extended.yaml")
    assert extended.env["tag_options"] == "extended" and "rnnlm" in extended.env["generator"]["models"]
    sweep = load_sweep_config(ROOT / "tune_configs" / "tag_sweep.yaml")
    assert sweep.base.agent == "tag" and set(sweep.search) >= {"training.lr", "mcts.iterations_per_move"}


#: lenet on 2 machines x 1 GPU, 4 op groups: a small TAG env for building and planning without Ray.
TWO_MACHINES = {
    "generator": {"kind": "fixed", "model": "lenet", "topology": "random:126", "batch_size": 32},
    "max_groups": 4,
    "max_subsets": 4,
    "max_devices": 2,
    "max_device_groups": 2,
}


@pytest.mark.parametrize("agent", ["tag", "ppo_tag"])
def test_agents_plan_with_the_extended_options(agent: str) -> None:
    """``env.tag_options: extended``: the agent's module is built for 7 options per subset from the
    env's spaces and ``act`` plans with them (lenet on 2 machines x 1 GPU: 3 subsets, 21 actions)."""
    from placement_rl.rl.agents import get_agent
    from placement_rl.search.tag import TAG_EXTENDED_OPTIONS

    spec = get_agent(agent)
    env_config = {**TWO_MACHINES, "tag_options": "extended"}
    sections = {"model": {"hidden": 8, "heads": 2, "layers": 1}}
    if agent == "tag":
        sections["mcts"] = {"eval_iterations": 4, "leaf_batch": 2}
    cfg = TrainConfig.from_dict({"agent": agent, "env": env_config, **sections})
    module = spec.build_module(cfg)
    assert module.gnn.num_options == len(TAG_EXTENDED_OPTIONS) == 7
    env = gym.make("placement_rl/Placement-v0", config=dict(cfg.env))
    assert env.action_space == gym.spaces.Discrete(4 * 7)
    info = spec.act(module, env)
    problem = env.unwrapped.tag_problem()
    assert problem.options == TAG_EXTENDED_OPTIONS and info["invalid_action"] is False
    instance = env.unwrapped.data.instance
    info["plan"].validate(instance.graph, instance.topology)
    assert np.isfinite(info["makespan_s"]) and info["makespan_s"] > 0


def test_the_data_parallel_fallback_is_all_reduce_in_either_option_set() -> None:
    from placement_rl.rl.tag import _data_parallel

    for options, width in (("tag", 4), ("extended", 7)):
        env = gym.make(
            "placement_rl/Placement-v0",
            config={
                "generator": {"kind": "fixed", "model": "lenet", "topology": "random:126", "batch_size": 32},
                "max_groups": 4,
                "action_space": "tag",
                "tag_options": options,
            },
        )
        env.reset(seed=0)
        problem = env.unwrapped.tag_problem()
        assert _data_parallel(problem) == (2 * width,) * problem.num_groups  # subset 2 = both machines, all_reduce
        assert problem.complete(()) == problem.complete(_data_parallel(problem))


def test_ppo_tag_partial_plans_keep_the_best_plan_its_episode_scored() -> None:
    """``act.partial_plans``: every prefix of the greedy episode was completed and simulated by the
    env; the result is the best of those (replayed), never worse than the episode's final plan.
    slow_links_fc-like lenet: an untrained policy's final plan is far from the root's completion."""
    from placement_rl.rl.agents import get_agent
    from placement_rl.rl.ppo_tag import ActSection, rollout
    from placement_rl.sim import simulate

    spec = get_agent("ppo_tag")
    env_config = dict(TWO_MACHINES)
    cfg = TrainConfig.from_dict(
        {"agent": "ppo_tag", "env": env_config, "model": {"hidden": 8, "heads": 2, "layers": 1}}
    )
    module = spec.build_module(cfg)
    env = gym.make("placement_rl/Placement-v0", config=dict(cfg.env))
    _, greedy = rollout(module, env)
    module.ppo_tag_act = ActSection(partial_plans=False)
    final_only = spec.act(module, env)
    assert final_only["makespan_s"] == greedy["makespan_s"] and final_only["from_partial_plan"] is False
    module.ppo_tag_act = ActSection(partial_plans=True)
    info = spec.act(module, env)
    base = env.unwrapped
    prefixes = [greedy["actions"][:j] for j in range(len(greedy["actions"]))]
    best = min([base.evaluate(p) for p in prefixes], key=lambda e: (bool(e.oom), e.makespan_s))
    expected = min((bool(best.oom), best.makespan_s), (bool(greedy["oom"]), greedy["makespan_s"]))
    assert (bool(info["oom"]), info["makespan_s"]) == pytest.approx(expected)
    assert info["from_partial_plan"] == (
        (bool(best.oom), best.makespan_s) < (bool(greedy["oom"]), greedy["makespan_s"])
    )
    instance = base.data.instance
    assert simulate(instance.graph, instance.topology, info["plan"]).makespan_s == pytest.approx(info["makespan_s"])
    with pytest.raises(ValueError, match="partial_plans"):
        TrainConfig.from_dict({"agent": "ppo_tag", "env": env_config, "act": {"partial_plans": "yes"}})


def test_a_sweep_may_vary_the_tag_options(tmp_path: Path) -> None:
    sweep = {
        "base": str(ROOT / "tune_configs" / "tag_mcts.yaml"),
        "search": {"env.tag_options": {"choice": ["tag", "extended"]}},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert set(load_sweep_config(path).search) == {"env.tag_options"}
