"""Conformance of every registered environment id in every mode.

For each (id, mode): Gymnasium's env checker, seeded determinism, pickling mid-episode,
observations inside the observation space, and the final makespan equal to an independent
``placement_rl.simulate`` of the reported plan.

Instances are small (lenet / alexnet / rnnlm at batch 32, 8 op groups, on the 4-GPU ``trinity``
preset) except one default-size case (inception_v3 x tag-testbed, 60 groups x 16 GPUs).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from env_cases import GIB, PLACEMENT, SHARDING, small
from gymnasium.utils.env_checker import (
    check_env,
    check_reset_options,
    check_reset_return_type,
    check_reset_seed_determinism,
)
from gymnasium.utils.passive_env_checker import env_reset_passive_checker, env_step_passive_checker

from placement_rl import simulate
from placement_rl.envs import ENV_IDS, RandomAgent
from placement_rl.envs.placement import types as placement_types
from placement_rl.topology import random_topology

#: Every (id, mode) the suite covers; test_modes_cover_every_id_and_mode keeps it complete.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "placement-device": (PLACEMENT, {"mode": "sequential", "action_space": "device"}),
    "placement-tag": (PLACEMENT, {"mode": "sequential", "action_space": "tag"}),
    "placement-one_shot": (PLACEMENT, {"mode": "one_shot"}),
    "sharding": (SHARDING, {}),
}


def make(mode: str, generator: dict[str, Any] | None = None, **overrides: Any) -> gym.Env[Any, Any]:
    """``gymnasium.make`` of a mode on a small instance (8 groups; room for rnnlm's edges)."""
    env_id, extra = MODES[mode]
    config = {"generator": generator or small(), "max_groups": 8, "max_edges": 512, **extra, **overrides}
    return gym.make(env_id, config=config)


def play(env: gym.Env[Any, Any], agent: RandomAgent, seed: int | None) -> dict[str, Any]:
    """One episode; every observation, action, reward and info."""
    obs, info = env.reset(seed=seed)
    trace: dict[str, Any] = {"obs": [obs], "actions": [], "rewards": [], "infos": [info]}
    done = False
    while not done:
        action = agent.act(env, obs)
        obs, reward, terminated, truncated, info = env.step(action)
        assert truncated is False
        trace["obs"].append(obs)
        trace["actions"].append(np.asarray(action).tolist())
        trace["rewards"].append(reward)
        trace["infos"].append(info)
        done = terminated
    return trace


def obs_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Keys whose arrays differ in value, dtype or shape (exact comparison)."""
    assert a.keys() == b.keys()
    return [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not np.array_equal(a[k], b[k])]


def outside_space(space: gym.spaces.Dict, obs: dict[str, np.ndarray]) -> list[str]:
    """Keys of ``obs`` outside their subspace (plus missing / extra keys)."""
    bad = sorted(set(space.spaces) ^ set(obs))
    return bad + [k for k, sub in space.spaces.items() if k in obs and not sub.contains(obs[k])]


def test_modes_cover_every_id_and_mode() -> None:
    assert {env_id for env_id, _ in MODES.values()} == set(ENV_IDS)
    placement = {(c.get("mode"), c.get("action_space", "device")) for i, c in MODES.values() if i == PLACEMENT}
    modes, spaces = placement_types.MODES, placement_types.ACTION_SPACES
    expected = {("sequential", s) for s in spaces} | {(m, "device") for m in modes if m != "sequential"}
    assert placement == expected
    for env_id in ENV_IDS:
        assert env_id in gym.registry


# ------------------------------------------------------------------------------ env checker
#: Configs whose action space holds only legal actions: the checker steps with
#: ``action_space.sample()``, which knows nothing of the action mask, while a masked or padded
#: action must raise (tests/envs/placement, tests/envs/sharding). So the maxima are set to the
#: instance: 4 devices of trinity; for the TAG space a topology of 2 machines x 1 GPU (random:126),
#: so every machine x option action is real; lenet's 15 ops as the one-shot node rows; 4
#: configurations per group (each of lenet's groups has at least 4 on trinity). Tiny lenet fits
#: everywhere, so nothing is masked by memory either (asserted below).
TIGHT: dict[str, dict[str, Any]] = {
    "placement-device": {"generator": small(), "max_groups": 8, "max_devices": 4},
    "placement-tag": {"generator": small(topology="random:126"), "max_groups": 8, "max_devices": 2},
    "placement-one_shot": {"generator": small(), "max_nodes": 15, "max_devices": 4, "one_shot_groups": 4},
    "sharding": {"generator": small(), "max_groups": 8, "max_configs": 4},
}


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_check_env_passes(mode: str) -> None:
    topo = random_topology(126)
    assert [len(d) for d in topo.machines().values()] == [1, 1]
    env_id, extra = MODES[mode]
    env = gym.make(env_id, config={**TIGHT[mode], **extra})
    # Precondition of the checker: every action of the space is legal at every step.
    trace = play(env, RandomAgent(0), seed=0)
    masks = [o["action_mask"] for o in trace["obs"][:-1]]
    assert all(m.all() for m in masks), [np.flatnonzero(m == 0).tolist() for m in masks]
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_checker_parts_on_padded_spaces(mode: str) -> None:
    """The parts of check_env that do not sample actions, on the default (padded) maxima, and a
    checked step with an allowed action."""
    env = make(mode).unwrapped
    check_reset_return_type(env)
    check_reset_seed_determinism(env)
    check_reset_options(env)
    env_reset_passive_checker(env, seed=0)
    obs, _ = env.reset(seed=0)
    env_step_passive_checker(env, RandomAgent(0).act(env, obs))


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("model", ["lenet", "alexnet"])
@pytest.mark.parametrize("mode", list(MODES))
def test_same_seed_same_rollout(mode: str, model: str) -> None:
    envs = [make(mode, small(model)), make(mode, small(model))]
    traces = []
    for env in envs:
        agent = RandomAgent(7)
        traces.append([play(env, agent, seed=3), play(env, agent, seed=None)])  # 2nd episode: unseeded reset
    for first, second in zip(*traces, strict=True):
        assert first["actions"] == second["actions"]
        assert first["rewards"] == second["rewards"]
        assert len(first["obs"]) == len(second["obs"])
        for step, (a, b) in enumerate(zip(first["obs"], second["obs"], strict=True)):
            assert obs_differences(a, b) == [], f"step {step}"
        fa, fb = first["infos"][-1], second["infos"][-1]
        assert fa["makespan_s"] == fb["makespan_s"] and fa["oom"] == fb["oom"] and fa["plan"] == fb["plan"]
        partial = [[i.get("partial_makespan_s") for i in t["infos"]] for t in (first, second)]
        assert partial[0] == partial[1]


@pytest.mark.parametrize("mode", list(MODES))
def test_different_agent_seeds_differ(mode: str) -> None:
    """The determinism test above is not vacuous: other seeds give other rollouts."""
    env = make(mode, small("alexnet"))
    a, b = play(env, RandomAgent(1), seed=0), play(env, RandomAgent(2), seed=0)
    assert a["actions"] != b["actions"]
    assert a["infos"][-1]["makespan_s"] != b["infos"][-1]["makespan_s"]


# -------------------------------------------------------------------------------- pickling
@pytest.mark.parametrize("model", ["lenet", "alexnet"])
@pytest.mark.parametrize("mode", list(MODES))
def test_pickle_mid_episode(mode: str, model: str) -> None:
    env = make(mode, small(model))
    agent = RandomAgent(11)
    obs, _ = env.reset(seed=5)
    steps_before = 0 if mode == "placement-one_shot" else 3  # one-shot episodes have one step
    for _ in range(steps_before):
        obs, _, terminated, _, _ = env.step(agent.act(env, obs))
        assert not terminated
    clone = pickle.loads(pickle.dumps(env))
    clone_agent = pickle.loads(pickle.dumps(agent))
    assert clone.unwrapped is not env.unwrapped
    clone_obs = obs
    done, steps = False, 0
    while not done:
        action = agent.act(env, obs)
        assert np.array_equal(np.asarray(clone_agent.act(clone, clone_obs)), np.asarray(action))
        obs, reward, terminated, _, info = env.step(action)  # interleaved: shared state would show
        clone_obs, clone_reward, clone_terminated, _, clone_info = clone.step(action)
        assert obs_differences(obs, clone_obs) == [], f"step {steps}"
        assert (reward, terminated) == (clone_reward, clone_terminated)
        assert info.get("partial_makespan_s") == clone_info.get("partial_makespan_s")
        done, steps = terminated, steps + 1
    assert steps >= 1
    assert info["makespan_s"] == clone_info["makespan_s"]
    assert info["plan"] == clone_info["plan"]
    # The random state travels too: the next (unseeded) episode is the same.
    again, clone_again = play(env, agent, seed=None), play(clone, clone_agent, seed=None)
    assert again["actions"] == clone_again["actions"] and again["rewards"] == clone_again["rewards"]


def test_pickle_before_reset_and_random_generator_state() -> None:
    """An env pickled before any reset, and one with a random generator pickled between episodes,
    draw the same instances as the original."""
    generator = {"kind": "random", "models": ["lenet", "alexnet"], "batch_size": 32}
    env = make("placement-device", generator)
    clone = pickle.loads(pickle.dumps(env))
    env.reset(seed=1)
    clone.reset(seed=1)
    first = env.unwrapped.data.instance.name
    assert clone.unwrapped.data.instance.name == first
    clone = pickle.loads(pickle.dumps(env))  # between episodes
    names, clone_names = [], []
    for _ in range(4):
        names.append(play(env, RandomAgent(0), seed=None)["infos"][0]["instance"])
        clone_names.append(play(clone, RandomAgent(0), seed=None)["infos"][0]["instance"])
    assert names == clone_names
    assert len({first, *names}) > 1  # the draws do vary


# ------------------------------------------------------------------------ observation space
SPACE_CASES = [
    *[(mode, small(model)) for mode in MODES for model in ("lenet", "alexnet", "rnnlm")],
    *[(mode, {"kind": "random", "models": ["lenet", "alexnet"], "batch_size": 32}) for mode in MODES],
]


@pytest.mark.parametrize(
    ("mode", "generator"), SPACE_CASES, ids=lambda v: v if isinstance(v, str) else v.get("model", "random")
)
def test_observations_stay_in_space(mode: str, generator: dict[str, Any]) -> None:
    env = make(mode, generator)
    space = env.observation_space
    assert space == env.unwrapped.observation_space
    failures = []
    for seed in range(3):
        trace = play(env, RandomAgent(seed), seed=seed)
        for step, obs in enumerate(trace["obs"]):
            bad = outside_space(space, obs)
            if bad:
                failures.append((seed, step, bad))
    assert failures == [], f"(episode, step, keys outside observation_space): {failures}"


# ------------------------------------------------------------------------- final makespan
FINAL_CASES = [
    *[(mode, "small") for mode in MODES],
    *[(mode, "inception_v3@tag-testbed") for mode in MODES],
    ("placement-device", "oom"),
    ("sharding", "oom"),
]


@pytest.mark.parametrize(("mode", "case"), FINAL_CASES)
def test_final_makespan_is_the_simulated_plan(mode: str, case: str, shrunk_topology: Callable[..., str]) -> None:
    if case == "small":
        env = make(mode, small("alexnet"))
    elif case == "oom":  # vgg19 (batch 96) on 4 devices of 1 GiB: no plan fits
        env = make(mode, {"kind": "fixed", "model": "vgg19", "topology": shrunk_topology("trinity-1gib", [GIB] * 4)})
    else:  # default settings: 60 groups (one-shot: the 317 raw ops), 16 GPUs, zoo batch
        env_id, extra = MODES[mode]
        generator = {"kind": "fixed", "model": "inception_v3", "topology": "tag-testbed"}
        env = gym.make(env_id, config={"generator": generator, **extra})
    info = play(env, RandomAgent(0), seed=0)["infos"][-1]
    instance = env.unwrapped.data.instance
    assert info["instance"] == instance.name
    if case == "inception_v3@tag-testbed":
        assert instance.name == case and instance.graph.num_ops == 317
    result = simulate(instance.graph, instance.topology, info["plan"])
    assert result.makespan_s == info["makespan_s"]
    assert result.oom == info["oom"]
    assert info["oom"] is (case == "oom")
    dp = env.unwrapped.data.baseline
    assert info["dp_makespan_s"] == dp.makespan_s
    assert info["speedup"] == dp.makespan_s / result.makespan_s
    assert info["result"]["makespan_s"] == result.makespan_s
