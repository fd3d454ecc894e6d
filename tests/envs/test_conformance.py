"""Conformance of every registered environment id in every mode.

For each (id, mode): Gymnasium's env checker over 20 seeds of sampled actions (on padded action
spaces, where most samples are masked, and on each registered id's default config), both
``invalid_action`` modes (a masked action ends the episode, or raises and changes nothing),
seeded determinism, pickling mid-episode, observations inside the observation space (200 random
episodes, some ended by a masked action), and the final makespan equal to an independent
``placement_rl.simulate`` of the reported plan.

Instances are small (lenet / alexnet / rnnlm at batch 32, 8 op groups, on the 4-GPU ``trinity``
preset or small random topologies) except the default-size cases (inception_v3 x tag-testbed, 60
groups x 16 GPUs).
"""

from __future__ import annotations

import pickle
import re
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
#: Seeds of the checker's sampled actions (``check_env`` steps with ``action_space.sample()``,
#: which knows nothing of the action mask: padded and masked actions come up all the time).
CHECKER_SEEDS = range(20)


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("env_id", list(ENV_IDS))
def test_check_env_on_registered_defaults(env_id: str) -> None:
    """Every registered id with its default config (inception_v3 x tag-testbed, padded maxima):
    whatever the checker samples is a valid input to ``step``."""
    env = gym.make(env_id)
    for seed in CHECKER_SEEDS:
        env.unwrapped.action_space.seed(seed)
        check_env(env.unwrapped, skip_render_check=True)
    # The samples did hit masked actions (the default maxima pad 16 GPUs to 64 device slots).
    env.unwrapped.action_space.seed(0)
    outcomes = set()
    for _ in range(20):
        env.reset(seed=0)
        outcomes.add(env.step(env.unwrapped.action_space.sample())[4]["invalid_action"])
    assert outcomes == {True, False}


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_check_env_on_padded_spaces(mode: str) -> None:
    """Every mode on small instances with padded maxima (4 of 64 devices, 8 groups of 60 rows, ...)."""
    env = make(mode).unwrapped
    for seed in CHECKER_SEEDS:
        env.action_space.seed(seed)
        check_env(env, skip_render_check=True)


#: Configs whose action space holds only legal actions, for ``invalid_action="raise"`` (where a
#: masked action raises, so the checker's samples must all be legal): the maxima are set to the
#: instance: 4 devices of trinity; for the TAG space a topology of 2 machines x 1 GPU (random:126),
#: whose 3 device-group subsets x 4 options are every action; lenet's 15 ops as the one-shot node rows; 4
#: configurations per group (each of lenet's groups has at least 4 on trinity). Tiny lenet fits
#: everywhere, so nothing is masked by memory either (asserted below).
TIGHT: dict[str, dict[str, Any]] = {
    "placement-device": {"generator": small(), "max_groups": 8, "max_devices": 4},
    "placement-tag": {"generator": small(topology="random:126"), "max_groups": 8, "max_devices": 2, "max_subsets": 3},
    "placement-one_shot": {"generator": small(), "max_nodes": 15, "max_devices": 4, "one_shot_groups": 4},
    "sharding": {"generator": small(), "max_groups": 8, "max_configs": 4},
}


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_check_env_raise_mode_on_tight_spaces(mode: str) -> None:
    topo = random_topology(126)
    assert [len(d) for d in topo.machines().values()] == [1, 1]
    env_id, extra = MODES[mode]
    env = gym.make(env_id, config={**TIGHT[mode], **extra, "invalid_action": "raise"})
    # Precondition of the checker: every action of the space is legal at every step.
    trace = play(env, RandomAgent(0), seed=0)
    masks = [o["action_mask"] for o in trace["obs"][:-1]]
    assert all(m.all() for m in masks), [np.flatnonzero(m == 0).tolist() for m in masks]
    for seed in CHECKER_SEEDS:
        env.unwrapped.action_space.seed(seed)
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


# ------------------------------------------------------------------------- invalid actions
def masked_action(env: gym.Env[Any, Any], obs: dict[str, np.ndarray], rng: np.random.Generator) -> Any:
    """An action inside the action space that ``obs``'s mask forbids (sequential: a masked index;
    one-shot: an allowed action with one entry changed to a masked choice), or None if there is none."""
    space, mask = env.action_space, obs["action_mask"]
    if isinstance(space, gym.spaces.Discrete):
        masked = np.flatnonzero(mask == 0)
        return None if masked.size == 0 else int(rng.choice(masked))
    action = RandomAgent(int(rng.integers(1 << 30))).act(env, obs)
    offsets = np.concatenate([[0], np.cumsum(space.nvec)])
    slots = [i for i in range(len(space.nvec)) if not mask[offsets[i] : offsets[i + 1]].all()]
    if not slots:
        return None
    i = int(rng.choice(slots))
    action[i] = int(rng.choice(np.flatnonzero(mask[offsets[i] : offsets[i + 1]] == 0)))
    return action


@pytest.mark.parametrize("mode", list(MODES))
def test_masked_action_in_end_mode_ends_the_episode(mode: str) -> None:
    """The default: the action is not applied; the episode terminates in the state it answered,
    with the reward's invalid-action reward and ``info["invalid_action"]``; the env then resets."""
    env = make(mode, small("alexnet"))
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    if mode != "placement-one_shot":  # mid-episode
        for _ in range(2):
            obs, *_ = env.step(RandomAgent(0).act(env, obs))
    action = masked_action(env, obs, rng)
    assert action is not None
    last, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (-1.0, True, False)  # speedup: the OOM reward
    reason = info["invalid_action_reason"]
    assert info["invalid_action"] is True
    if mode == "placement-one_shot":
        assert re.match(r"action (places group \d+ on device index \d+|assigns padded op slot \d+)", reason), reason
    else:
        assert reason.startswith(f"action {action} is masked for group "), reason
    assert obs_differences(last, obs) == [] and outside_space(env.observation_space, last) == []
    with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended"):
        env.step(action)
    again = play(env, RandomAgent(3), seed=1)  # a new episode is whole
    assert again["infos"][-1]["invalid_action"] is False and "plan" in again["infos"][-1]


@pytest.mark.parametrize("mode", list(MODES))
def test_masked_action_in_raise_mode_raises_and_changes_nothing(mode: str) -> None:
    env, fresh = make(mode, small("alexnet"), invalid_action="raise"), make(mode, small("alexnet"))
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=0)
    fresh.reset(seed=0)
    action = masked_action(env, obs, rng)
    with pytest.raises(ValueError, match=r"is masked for group|device index|padded op slot"):
        env.step(action)
    allowed = RandomAgent(5).act(env, obs)
    a, b = env.step(allowed), fresh.step(allowed)
    assert obs_differences(a[0], b[0]) == [] and a[1:4] == b[1:4]
    assert a[4].get("partial_makespan_s") == b[4].get("partial_makespan_s")


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


#: The random-episode sweep: tiny instances (lenet and alexnet at batch 32 on trinity, on two
#: random topologies, and drawn by the random generator) under drawn settings.
SWEEP_GENERATORS: list[dict[str, Any]] = [
    small("lenet"),
    small("alexnet"),
    small("lenet", "random:3"),
    small("alexnet", "random:17"),
    {"kind": "random", "models": ["lenet", "alexnet"], "batch_size": 32, "num_topologies": 20},
]
SWEEP_CONFIGS_PER_MODE, SWEEP_EPISODES_PER_CONFIG = 10, 5  # 4 modes x 10 x 5 = 200 episodes


def sweep_config(mode: str, index: int, rng: np.random.Generator) -> dict[str, Any]:
    """Drawn settings: group count, reward, Node2vec features; the mode's own sizes in turn."""
    overrides: dict[str, Any] = {
        "max_groups": int(rng.integers(1, 9)),
        "reward": str(rng.choice(["speedup", "mdpe", "dense"])),
        "node2vec_dim": int(rng.choice([0, 4])),
    }
    if mode == "placement-one_shot":
        overrides |= {"one_shot_groups": int(rng.integers(1, 9)), "max_devices": int(rng.choice([48, 64]))}
    elif mode == "sharding":
        overrides["max_configs"] = [4, 16, 256][index % 3]  # 4: often no padding; 256: always some
    return overrides


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize("mode", list(MODES))
def test_random_episodes_stay_in_space(mode: str) -> None:
    """50 random episodes per mode (200 in all) with valid actions never leave the observation
    space; in more than half of them a masked action is taken at a drawn step instead (where the
    state has one) and ends the episode, and that last observation is checked too."""
    rng = np.random.default_rng(list(MODES).index(mode))
    failures, episodes, invalid_ends = [], 0, 0
    for c in range(SWEEP_CONFIGS_PER_MODE):
        generator = SWEEP_GENERATORS[c % len(SWEEP_GENERATORS)]
        overrides = sweep_config(mode, c, rng)
        env = make(mode, generator, **overrides)
        space = env.observation_space
        for e in range(SWEEP_EPISODES_PER_CONFIG):
            seed = int(rng.integers(1 << 31))
            agent = RandomAgent(seed)
            obs, _ = env.reset(seed=seed)
            steps = env.unwrapped.data.instance.groups.num_ops if mode != "placement-one_shot" else 1
            end_on = int(rng.integers(steps)) if e % 2 == 0 else -1  # the step that takes a masked action
            step, done = 0, False
            while not done:
                if outside_space(space, obs):
                    failures.append((c, e, step, outside_space(space, obs), overrides))
                action = masked_action(env, obs, rng) if step == end_on else None
                obs, reward, done, truncated, info = env.step(agent.act(env, obs) if action is None else action)
                assert np.isfinite(reward) and truncated is False
                assert info["invalid_action"] is (action is not None) and (done or action is None)
                invalid_ends += action is not None
                step += 1
            if outside_space(space, obs):
                failures.append((c, e, "last", outside_space(space, obs), overrides))
            episodes += 1
    assert failures == [], f"(config, episode, step, keys outside observation_space, settings): {failures}"
    assert episodes == SWEEP_CONFIGS_PER_MODE * SWEEP_EPISODES_PER_CONFIG
    assert invalid_ends >= 5, invalid_ends  # masked actions came up (some states have none to take)


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
