"""The ppo_tag agent (PPO with TAG's GNN on the sequential TAG action space) and Trinity's one-shot hard
memory mask: training runs and writes its outputs, a checkpoint restores the same policy, ``act``
keeps the best of its episodes, evaluation and ``plan --checkpoint`` go through the registry, and
Trinity's module decodes only placements the env's hard mask allows."""

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
from placement_rl.rl.config import TrainConfig, load_train_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tune_configs" / "ppo_tag_smoke.yaml"


def _rows(run: Path) -> list[dict[str, float]]:
    with open(run / "progress.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def ppo_tag_run(smoke_dir: Path) -> Path:
    """A finished 4-iteration run of the shipped smoke config: the agents page's smoke command, as written."""
    return smoke_dir / "out" / "ppo-tag-smoke"


def test_training_runs_and_writes_its_outputs(ppo_tag_run: Path) -> None:
    rows = _rows(ppo_tag_run)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["env_steps"] for r in rows] == [120, 240, 360, 480]  # 20 episodes of 6 decisions each
    for key in ("policy_loss", "vf_loss", "entropy", "episode_return_mean", "speedup_mean"):
        assert all(np.isfinite(r[key]) for r in rows), key
    # The entropy is at most that of the uniform policy over the 28 actions of the first state.
    assert all(0 < r["entropy"] <= np.log(28) + 1e-3 for r in rows)
    for name in ("checkpoint_000002", "checkpoint_000004", "checkpoint_final"):
        assert (ppo_tag_run / name / "policy.npz").is_file(), name
    saved = TrainConfig.from_dict(json.loads((ppo_tag_run / "train_config.json").read_text()))
    assert saved.agent == "ppo_tag" and saved.env["mode"] == "sequential" and saved.env["action_space"] == "tag"
    assert saved.act.samples == 4


def test_restored_policy_gives_the_same_actions_and_act_keeps_the_best_plan(ray_local: Any, tmp_path: Path) -> None:
    from placement_rl.policies.tag import prior_probs
    from placement_rl.rl.agents import CONFIG_FILE
    from placement_rl.rl.policy import load_policy
    from placement_rl.rl.ppo_tag import ActSection, act, algorithm_config, rollout
    from placement_rl.rl.train import save_checkpoint
    from placement_rl.sim import simulate

    cfg = load_train_config(SMOKE)
    algo = algorithm_config(cfg).build_algo()
    try:
        algo.train()
        env = gym.make("placement_rl/Placement-v0", config=dict(cfg.env))
        env.reset(seed=0)
        observations = [env.unwrapped.observe(()), env.unwrapped.observe((0,)), env.unwrapped.observe((4, 0))]
        before = prior_probs(algo.get_module(), observations)
        save_checkpoint(algo, cfg, tmp_path / "checkpoint")
    finally:
        algo.stop()
    (tmp_path / CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))
    policy = load_policy(tmp_path / "checkpoint")
    assert policy.agent.name == "ppo_tag" and policy.config == cfg
    after = prior_probs(policy.module, observations)
    np.testing.assert_array_equal(after, before)
    assert (after[:, observations[0]["action_mask"] == 0] == 0).all()  # masked actions get no probability

    _, greedy = rollout(policy.module, env)
    info = act(policy.module, env)  # the greedy episode and 4 sampled ones (the smoke config's act)
    assert info["episodes"] == 5 and info["search_s"] > 0
    assert (info["oom"], info["makespan_s"]) <= (greedy["oom"], greedy["makespan_s"])
    instance = env.unwrapped.data.instance
    assert simulate(instance.graph, instance.topology, info["plan"]).makespan_s == pytest.approx(info["makespan_s"])
    policy.module.ppo_tag_act = ActSection(samples=0)
    assert act(policy.module, env)["makespan_s"] == greedy["makespan_s"]  # greedy only: deterministic


def test_evaluate_and_plan_through_the_registry(
    ppo_tag_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = str(ppo_tag_run / "checkpoint_final")
    args = ["evaluate", "--checkpoint", checkpoint, "--topologies", "tag-testbed", "--mcmc-budget", "none", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    methods = {r["method"]: r for r in out["rows"]}
    assert {"ppo_tag", "data_parallel"} <= set(methods)
    policy = methods["ppo_tag"]
    assert policy["speedup_over_dp"] == pytest.approx(methods["data_parallel"]["makespan_s"] / policy["makespan_s"])
    assert out["instances"] == 1

    args = ["plan", "--model", "lenet", "--batch-size", "32", "--topology", "tag-testbed", "--methods", "dp"]
    assert main([*args, "--checkpoint", checkpoint, "--out-dir", str(tmp_path), "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["methods"]}
    assert set(rows) == {"data_parallel", "ppo_tag"} and rows["ppo_tag"]["makespan_s"] > 0
    assert (tmp_path / "best_plan.json").is_file()


def test_a_policy_plans_at_a_finer_grouping_than_it_trained_at(
    ppo_tag_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from placement_rl import zoo
    from placement_rl.rl.policy import PLANNING_ENV_KEYS, load_policy, policy_env, with_env
    from placement_rl.topology.presets import load_preset

    policy = load_policy(ppo_tag_run / "checkpoint_final")
    assert policy.config.env["max_groups"] == 6
    finer = with_env(policy, {"max_groups": 9})
    assert finer.config.env["max_groups"] == 9 and policy.config.env["max_groups"] == 6  # a copy
    graph, topology = zoo.load("lenet"), load_preset("tag-testbed")  # evaluate's instance below
    coarse_env, fine_env = policy_env(policy, graph, topology), policy_env(finer, graph, topology)
    coarse = policy.agent.act(policy.module, coarse_env)
    fine = finer.agent.act(finer.module, fine_env)
    # one decision per op group: the finer env cut lenet into more groups, and the same weights planned them
    assert len(coarse["actions"]) == 6 < len(fine["actions"]) <= 9
    assert fine["makespan_s"] > 0 and fine["plan"] is not None

    with pytest.raises(ValueError, match=r"\['tag_options'\] cannot change.*max_groups"):
        with_env(policy, {"tag_options": "extended"})
    with pytest.raises(ValueError, match="max_groups"):
        with_env(policy, {"max_groups": 0})
    assert "reward" not in PLANNING_ENV_KEYS

    checkpoint = str(ppo_tag_run / "checkpoint_final")
    args = ["evaluate", "--checkpoint", checkpoint, "--topologies", "tag-testbed", "--mcmc-budget", "none"]
    assert main([*args, "--env", "max_groups=9", "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["ppo_tag"]["makespan_s"] == pytest.approx(fine["makespan_s"])
    assert main([*args, "--env", "reward=sparse"]) == 2
    assert "['reward'] cannot change" in capsys.readouterr().err


def test_shipped_ppo_tag_config_parses() -> None:
    extended = load_train_config(ROOT / "tune_configs" / "ppo_tag_extended.yaml")
    assert extended.env["tag_options"] == "extended" and extended.act.partial_plans is True
    cfg = load_train_config(ROOT / "tune_configs" / "ppo_tag.yaml")
    assert cfg.agent == "ppo_tag" and cfg.env["generator"]["topology_split"] == "train"
    assert len(cfg.env["generator"]["models"]) >= 3 and cfg.env["action_space"] == "tag"


def test_trinity_decodes_only_placements_the_hard_memory_mask_allows(tmp_path: Path) -> None:
    """lenet's 16 op slots (2.75 MiB by the env's estimate) on 4 GPUs of 1 MiB: with the hard mask
    no sampled plan puts a group on a device that cannot hold it (by the env's rule); without it
    most do."""
    import torch
    from ray.rllib.core import Columns
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from placement_rl.envs.observation import DEV_COL_MEMORY_GIB
    from placement_rl.envs.placement.env import one_shot_memory_mask
    from placement_rl.io import write_json
    from placement_rl.policies.trinity import TrinityRLModule
    from placement_rl.topology import load_preset

    document = load_preset("trinity").to_dict()
    document["name"] = "trinity-1mib"
    for device in document["devices"]:
        device["memory_bytes"] = 2**20
    write_json(tmp_path / "trinity-1mib.json", document)
    generator = {"kind": "fixed", "model": "lenet", "batch_size": 32, "topology": str(tmp_path / "trinity-1mib.json")}
    options = {"mode": "one_shot", "one_shot_ops": 16, "one_shot_groups": 8, "max_devices": 4, "generator": generator}
    hard_env = gym.make("placement_rl/Placement-v0", config={**options, "memory_mask": "hard"})
    hard_obs, _ = hard_env.reset(seed=0)
    N = hard_env.unwrapped.data.instance.groups.num_ops
    need = hard_obs["node_memory_gib"][:N]
    capacity = hard_obs["device_features"][:4, DEV_COL_MEMORY_GIB]
    violations = {}
    for memory_mask in ("hard", "auto"):
        env = gym.make("placement_rl/Placement-v0", config={**options, "memory_mask": memory_mask})
        obs, _ = env.reset(seed=0)
        torch.manual_seed(0)
        module = RLModuleSpec(
            module_class=TrinityRLModule,
            observation_space=env.observation_space,
            action_space=env.action_space,
            model_config={"dropout": 0.0, "noise_steps": 0},  # so the training pass computes the same logits
        ).build()
        batch = {Columns.OBS: {k: torch.as_tensor(v).unsqueeze(0).repeat(32, *[1] * v.ndim) for k, v in obs.items()}}
        with torch.no_grad():
            out = module.forward_exploration(batch)
            actions = out[Columns.ACTIONS]
            # Teacher forcing (the training pass) rebuilds the same masks: the same log-probabilities.
            train = module.forward_train({**batch, Columns.ACTIONS: actions})
        dist = module.action_dist_cls.from_logits(train[Columns.ACTION_DIST_INPUTS])
        np.testing.assert_allclose(dist.logp(actions).numpy(), out[Columns.ACTION_LOGP].numpy(), rtol=1e-5, atol=1e-5)
        violations[memory_mask] = 0
        for a in actions.numpy().astype(np.int64):
            assign, placement = a[:N], a[16:]
            allowed = one_shot_memory_mask(need, assign, placement, capacity)
            violations[memory_mask] += int(not allowed[np.arange(8), placement].all())
            env.reset(seed=0)
            assert not env.step(a)[4]["invalid_action"]  # the hard env accepts every decoded plan
    # Without the mask most sampled plans put a group where it does not fit; with it, none.
    assert violations["hard"] == 0 and violations["auto"] > 16, violations


def test_trinity_config_accepts_the_hard_memory_mask(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "tune_configs" / "trinity_ppo.yaml").read_text())
    doc["env"]["memory_mask"] = "hard"
    cfg = TrainConfig.from_dict(doc)
    assert cfg.agent == "trinity" and cfg.env["memory_mask"] == "hard"
