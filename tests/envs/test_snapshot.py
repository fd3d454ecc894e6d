"""``snapshot()`` / ``restore()``: replaying the same actions from a restored state gives the same
episode, branching does not disturb it, and a snapshot shares the instance instead of copying it.

Instances are tiny (lenet at batch 32 on the 4-GPU ``trinity`` preset, at most 8 op groups).
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from env_cases import PLACEMENT, SHARDING, small

from placement_rl.envs import EnvSnapshot, GreedyAgent, PlanEnv, RandomAgent
from placement_rl.envs.base import InstanceData
from placement_rl.graph import OpGraph
from placement_rl.sim.simulator import SimContext

SMALL = small("lenet")

#: name -> (id, config overrides, steps played before the snapshot).
CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    "placement-device": (PLACEMENT, {"mode": "sequential", "action_space": "device"}, 3),
    "placement-tag": (PLACEMENT, {"mode": "sequential", "action_space": "tag"}, 3),
    "placement-one_shot": (PLACEMENT, {"mode": "one_shot"}, 0),
    "sharding": (SHARDING, {"max_configs": 32}, 3),
}

Step = tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]


def make(case: str, generator: dict[str, Any] | None = None, **overrides: Any) -> PlanEnv:
    env_id, extra, _ = CASES[case]
    env = gym.make(env_id, config={"generator": generator or SMALL, "max_groups": 8, **extra, **overrides})
    return env.unwrapped  # type: ignore[return-value]


def play(
    env: PlanEnv, obs: dict[str, np.ndarray], agent: Any, steps: int | None = None
) -> tuple[list[Any], list[Step]]:
    """Play from the current state (whose observation is ``obs``) for ``steps`` steps or to the end."""
    actions: list[Any] = []
    trace: list[Step] = []
    done = False
    while not done and (steps is None or len(actions) < steps):
        action = agent.act(env, obs)
        step = env.step(action)
        actions.append(action)
        trace.append(step)
        obs = step[0]
        done = step[2] or step[3]
    return actions, trace


def replay(env: PlanEnv, actions: list[Any]) -> list[Step]:
    return [env.step(a) for a in actions]


def assert_same(expected: list[Step], got: list[Step]) -> None:
    """Every observation field, reward, flag and info entry identical (the plan by ``to_dict()``)."""
    assert len(got) == len(expected)
    for (obs_a, reward_a, term_a, trunc_a, info_a), (obs_b, reward_b, term_b, trunc_b, info_b) in zip(
        expected, got, strict=True
    ):
        assert obs_a.keys() == obs_b.keys()
        for key in obs_a:
            np.testing.assert_array_equal(obs_b[key], obs_a[key], err_msg=key)
            assert obs_b[key].dtype == obs_a[key].dtype
        assert (reward_b, term_b, trunc_b) == (reward_a, term_a, trunc_a)
        assert info_a.keys() == info_b.keys()
        for key in info_a:
            if key == "plan":
                assert info_b[key].to_dict() == info_a[key].to_dict()
            else:
                assert info_b[key] == info_a[key], key


def final_plan(trace: list[Step]) -> dict[str, Any]:
    return trace[-1][4]["plan"].to_dict()  # type: ignore[no-any-return]


# ------------------------------------------------------------------- replay and branch
@pytest.mark.parametrize("case", list(CASES))
def test_restore_replays_the_same_episode(case: str) -> None:
    env = make(case)
    obs, _ = env.reset(seed=0)
    _, before = play(env, obs, RandomAgent(1), steps=CASES[case][2])
    obs = before[-1][0] if before else obs
    snap = env.snapshot()
    actions, first = play(env, obs, RandomAgent(2))
    assert first[-1][2] and "plan" in first[-1][4]
    env.restore(snap)
    assert_same(first, replay(env, actions))
    # Branch: other actions to the end, then the first line again from the same snapshot.
    env.restore(snap)
    other_actions, other = play(env, obs, RandomAgent(7))
    assert [np.asarray(a).tolist() for a in other_actions] != [np.asarray(a).tolist() for a in actions]
    assert final_plan(other) != final_plan(first)
    env.restore(snap)
    assert_same(first, replay(env, actions))


@pytest.mark.parametrize("case", ["placement-device", "placement-tag", "sharding"])
def test_branch_with_lookahead_then_replay(case: str) -> None:
    """The greedy agent's previews (``evaluate_action``) run on the restored delta simulator."""
    env = make(case)
    obs, _ = env.reset(seed=3)
    start = env.snapshot()  # right after reset: no delta simulator yet
    actions, first = play(env, obs, RandomAgent(4), steps=2)
    middle = env.snapshot()
    more, rest = play(env, first[-1][0], RandomAgent(5))
    for snap, line, trace in ((middle, more, rest), (start, actions + more, first + rest)):
        env.restore(snap)
        play(env, trace[0][0], GreedyAgent())  # a different branch, with previews
        env.restore(snap)
        assert_same(trace, replay(env, line))


def test_restore_after_the_end_and_into_a_finished_episode() -> None:
    env = make("placement-device")
    obs, _ = env.reset(seed=0)
    actions, first = play(env, obs, RandomAgent(0))
    done = env.snapshot()
    env.restore(done)
    with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended"):
        env.step(0)
    env.reset(seed=0)
    play(env, obs, RandomAgent(0), steps=2)
    mid = env.snapshot()
    env.restore(done)  # a finished episode ...
    env.restore(mid)  # ... then back into the middle of one
    assert_same(first[2:], replay(env, actions[2:]))


@pytest.mark.parametrize("case", list(CASES))
def test_restore_after_an_invalid_action_ended_the_episode(case: str) -> None:
    """A masked action ends the episode (``invalid_action="end"``) without touching its state: from a
    snapshot taken before it, the episode goes on as if it had never been taken."""
    env = make(case)
    obs, _ = env.reset(seed=2)
    _, before = play(env, obs, RandomAgent(1), steps=CASES[case][2])
    obs = before[-1][0] if before else obs
    snap = env.snapshot()
    actions, first = play(env, obs, RandomAgent(6))
    env.restore(snap)
    if case == "placement-one_shot":
        masked = np.zeros(env.action_space.shape, np.int64)
        masked[-1] = env.config.max_devices - 1  # the last group on a padded device slot
    else:
        masked = int(np.flatnonzero(obs["action_mask"] == 0)[-1])
    last, reward, terminated, _, info = env.step(masked)
    assert terminated and info["invalid_action"] and reward == -1.0
    env.restore(snap)
    assert_same(first, replay(env, actions))


# ---------------------------------------------------------------------- other envs
def test_restore_into_another_env_with_the_same_config() -> None:
    env, twin = make("placement-tag"), make("placement-tag")
    obs, _ = env.reset(seed=0)
    _, before = play(env, obs, RandomAgent(1), steps=2)
    snap = env.snapshot()
    actions, first = play(env, before[-1][0], RandomAgent(2))
    twin.restore(snap)  # never reset: the snapshot brings the instance and the random generator
    assert_same(first, replay(twin, actions))
    assert twin.np_random.bit_generator.state == env.np_random.bit_generator.state


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (("placement-device", {}), ("placement-device", {"max_devices": 8})),
        (("placement-device", {}), ("placement-tag", {})),
        (("placement-device", {}), ("placement-device", {"reward": "dense"})),
        (("placement-device", {}), ("sharding", {})),
    ],
)
def test_restore_of_another_config_is_refused(
    source: tuple[str, dict[str, Any]], target: tuple[str, dict[str, Any]]
) -> None:
    env = make(source[0], **source[1])
    env.reset(seed=0)
    snap = env.snapshot()
    other = make(target[0], **target[1])
    obs, _ = other.reset(seed=0)
    data, delta = other.data, other._delta
    with pytest.raises(ValueError, match=r"snapshot of a PlacementEnv with config .* cannot be restored into this"):
        other.restore(snap)
    assert other.data is data and other._delta is delta  # the refused restore left the env alone
    play(other, obs, RandomAgent(0))


def test_snapshot_before_reset() -> None:
    with pytest.raises(RuntimeError, match=r"snapshot\(\) before reset\(\)"):
        make("sharding").snapshot()


def test_snapshot_carries_its_instance_and_random_generator() -> None:
    generator = {"kind": "random", "models": ["lenet"], "num_topologies": 50, "batch_size": 32}
    env = make("placement-device", generator, max_devices=48)
    obs, info = env.reset(seed=0)
    snap = env.snapshot()
    actions, first = play(env, obs, RandomAgent(0))
    _, next_info = env.reset()  # the env's generator draws the next instance
    seed = 1
    while env.data is not None and env.data.instance is snap.data.instance:
        env.reset(seed=seed)
        seed += 1
    env.restore(snap)
    assert env.data is snap.data
    assert_same(first, replay(env, actions))
    _, again = env.reset()  # the generator's state came back too: the same next instance
    assert again["instance"] == next_info["instance"]


# ------------------------------------------------------------------------- sharing
def _walk(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in (*value.keys(), *value.values()) for x in _walk(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _walk(v)]
    return [value]


@pytest.mark.parametrize("case", list(CASES))
def test_snapshot_shares_the_instance(case: str) -> None:
    env = make(case)
    obs, _ = env.reset(seed=0)
    play(env, obs, RandomAgent(0), steps=max(CASES[case][2], 1) if case != "placement-one_shot" else 0)
    if env._delta is None:
        env._simulator()
    snap = env.snapshot()
    assert isinstance(snap, EnvSnapshot) and "lenet" in repr(snap)
    data = env.data
    assert data is not None
    # The instance data is the env's own object, not a copy ...
    assert snap.data is data and snap.data.instance.graph is data.instance.graph
    assert snap.data.static is data.static and snap.data.group_ctx is data.group_ctx
    # ... and the copied state holds no graph, context or instance data, only small arrays.
    G, D = data.instance.groups.num_ops, data.instance.topology.num_devices
    for leaf in _walk(dict(snap.state)):
        assert not isinstance(leaf, (OpGraph, SimContext, InstanceData))
        if isinstance(leaf, np.ndarray):
            assert leaf.size <= max(G, D, env.layout.num_actions)
            assert not any(leaf is arr for arr in data.static.values())
    # The delta simulator is forked: its context and arrays shared, its per-op lists copied.
    assert snap.delta is not None and env._delta is not None and snap.delta is not env._delta
    assert snap.delta.ctx is data.group_ctx and snap.delta.ops is env._delta.ops
    assert snap.delta.configs == env._delta.configs and snap.delta.configs is not env._delta.configs
    # Its arrays are much smaller than the static observation arrays it shares.
    copied = sum(leaf.nbytes for leaf in _walk(dict(snap.state)) if isinstance(leaf, np.ndarray))
    assert copied < sum(arr.nbytes for arr in data.static.values()) / 2


def test_every_attribute_is_episode_state_or_fixed() -> None:
    """A new per-episode attribute must join ``EPISODE_STATE`` (or this list, if it is fixed)."""
    fixed = {
        "config",
        "generator",
        "reward_fn",
        "cost",
        "layout",
        "observation_space",
        "action_space",
        "_cache",
        "data",
        "_delta",
        "_np_random",
        "_np_random_seed",
        "spec",
        "render_mode",
        "_TimeLimit__elapsed_steps",
    }
    for case in CASES:
        env = make(case)
        obs, _ = env.reset(seed=0)
        play(env, obs, RandomAgent(0), steps=1)
        unknown = set(vars(env)) - fixed - set(type(env).EPISODE_STATE)
        assert not unknown, f"{case}: classify {sorted(unknown)} as episode state or fixed"
        assert len(set(type(env).EPISODE_STATE)) == len(type(env).EPISODE_STATE)


def test_restored_env_pickles_and_plays_on() -> None:
    env = make("sharding")
    obs, _ = env.reset(seed=0)
    _, before = play(env, obs, RandomAgent(0), steps=2)
    snap = env.snapshot()
    actions, first = play(env, before[-1][0], RandomAgent(1))
    env.restore(snap)
    clone = pickle.loads(pickle.dumps(env))  # the delta simulator is rebuilt from the configs
    assert_same(first, replay(clone, actions))
    assert_same(first, replay(env, actions))
