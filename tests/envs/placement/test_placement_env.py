"""placement_rl/Placement-v0: bad input, action masks, action decoding, the greedy agent."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from env_cases import GIB, allowed, small

from placement_rl import simulate
from placement_rl.envs import GreedyAgent, PlacementEnv, RandomAgent, run_episode
from placement_rl.envs.observation import (
    COL_COMPUTE_MS,
    COL_CURRENT,
    COL_DECIDED,
    DEV_COL_MEMORY_GIB,
    DEV_COL_MEMORY_USED_GIB,
)
from placement_rl.plan import TAG_OPTIONS, OpConfig, Plan
from placement_rl.search.tag import TAG_EXTENDED_OPTIONS
from placement_rl.topology import load_preset

ID = "placement_rl/Placement-v0"


def make(generator: dict[str, Any] | None = None, **config: Any) -> gym.Env[Any, Any]:
    return gym.make(ID, config={"generator": generator or small(), "max_groups": 8, **config})


# --------------------------------------------------------------------------- bad config
def test_unknown_config_key_lists_valid_keys() -> None:
    with pytest.raises(ValueError, match=r"PlacementConfig: unknown key\(s\) \['maxgroups'\]; expected some of") as err:
        make(maxgroups=8)
    valid = ("generator", "reward", "max_groups", "max_nodes", "max_devices", "mode", "action_space", "one_shot_groups")
    for key in valid:
        assert f"'{key}'" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("mode", "batch", r"mode = 'batch'; expected one of \['sequential', 'one_shot'\]"),
        ("action_space", "machine", r"action_space = 'machine'; expected one of \['device', 'tag'\]"),
        ("max_groups", 0, r"max_groups = 0; expected an integer >= 1"),
        ("max_groups", 8.0, r"max_groups = 8.0; expected an integer >= 1"),
        ("max_devices", True, r"max_devices = True; expected an integer >= 1"),
        ("max_nodes", -2, r"max_nodes = -2; expected an integer >= 1 and <= 16384 or null"),
        ("max_edges", float("inf"), r"max_edges = inf; expected an integer >= 1 and <= 131072 or null"),
        ("one_shot_groups", 0, r"one_shot_groups = 0; expected an integer >= 1"),
        ("one_shot_ops", 0, r"one_shot_ops = 0; expected an integer >= 1"),
        ("node2vec_dim", -1, r"node2vec_dim = -1; expected an integer >= 0"),
        # The maxima are capped before anything is allocated (10**9 devices would be 30 GiB of features).
        ("max_devices", 10**9, r"max_devices = 1000000000; expected an integer >= 1 and <= 1024"),
        ("max_groups", 16385, r"max_groups = 16385; expected an integer >= 1 and <= 16384"),
        ("max_nodes", 2**63, r"max_nodes = 9223372036854775808; expected an integer >= 1 and <= 16384 or null"),
        ("max_edges", 10**12, r"max_edges = 1000000000000; expected an integer >= 1 and <= 131072 or null"),
        ("one_shot_ops", 10**9, r"one_shot_ops = 1000000000; expected an integer >= 1 and <= 16384"),
        ("one_shot_groups", 10**7, r"one_shot_groups = 10000000; expected an integer >= 1 and <= 1024"),
        ("node2vec_dim", 10**6, r"node2vec_dim = 1000000; expected an integer >= 0 and <= 128"),
        ("invalid_action", "ignore", r"invalid_action = 'ignore'; expected one of \['end', 'raise'\]"),
        ("tag_options", "all", r"tag_options = 'all'; expected one of \['tag', 'extended'\]"),
        ("tag_options", ["all_reduce"], r"tag_options = \['all_reduce'\]; expected one of \['tag', 'extended'\]"),
        ("cost_model", "fast", r"cost_model = 'fast'; expected a CostModel object, a mapping of its options"),
    ],
)
def test_bad_config_values(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match=f"PlacementConfig: {expected}"):
        make(**{key: value})


def test_cost_model_options_as_a_mapping() -> None:
    # An env config written in YAML names the cost model's options; the env builds the model.
    env = make(cost_model={"execution_mode": "cuda_graphs", "optimizer": "sgd"})
    assert env.unwrapped.cost.execution_mode == "cuda_graphs" and env.unwrapped.cost.optimizer == "sgd"
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"execution mode 'lazy'; expected one of: cuda_graphs, eager"):
        make(cost_model={"execution_mode": "lazy"}).reset(seed=0)
    with pytest.raises(ValueError, match=r"env config cost_model.*calibration = 'h100'; expected default, roofline"):
        make(cost_model={"calibration": "h100"}).reset(seed=0)


def test_one_shot_limits_that_tie_fields() -> None:
    big = {"mode": "one_shot", "one_shot_ops": 16384, "one_shot_groups": 1024}
    expected = (
        r"the one-shot action mask would have max_nodes \* one_shot_groups \+ one_shot_groups \* max_devices = "
        r"16384 \* 1024 \+ 1024 \* 64 = 16842752 entries; at most 4194304"
    )
    with pytest.raises(ValueError, match=expected):
        make(**big)
    with pytest.raises(ValueError, match=r"action_space = 'tag' with mode = 'one_shot'; the TAG action space is for"):
        make(mode="one_shot", action_space="tag")


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        ({"max_nodes": 4}, "op groups"),
        ({"max_edges": 3}, "edges"),
        ({"max_devices": 2}, "devices"),
    ],
)
def test_instance_over_the_maxima(overrides: dict[str, Any], what: str) -> None:
    fits = make().unwrapped
    fits.reset(seed=0)
    inst = fits.data.instance
    counts = {"op groups": inst.groups.num_ops, "edges": len(inst.groups.tensors), "devices": inst.topology.num_devices}
    have = counts[what]
    limit = next(iter(overrides.values()))
    assert have > limit
    env = make(**overrides)  # the config is valid; the instance only arrives at reset
    with pytest.raises(ValueError, match=rf"has {have} {what}; the env config allows at most {limit}"):
        env.reset(seed=0)


def test_one_shot_graph_over_max_nodes() -> None:
    env = make(mode="one_shot", max_nodes=10)  # lenet has 15 ops
    with pytest.raises(ValueError, match=r"'lenet' on 'trinity' has 15 op groups; the env config allows at most 10"):
        env.reset(seed=0)


# --------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize("action_space", ["device", "tag"])
def test_actions_outside_the_space(action_space: str) -> None:
    env = make(action_space=action_space)
    obs, _ = env.reset(seed=0)
    n = env.action_space.n
    # Never truncated, wrapped or read as a bool: floats, bools, huge and negative ints are refused.
    for bad in (
        n,
        -1,
        1.5,
        "0",
        [0],
        True,
        np.float64(1.0),
        np.array(1.0),
        10**30,
        -(2**64),
        None,
        np.uint64(2**64 - 1),
    ):
        expected = rf"action {re.escape(repr(bad))} is outside the action space Discrete\({n}\)"
        with pytest.raises(ValueError, match=expected):
            env.step(bad)
    obs2, *_ = env.step(allowed(obs)[0])  # rejected actions left the episode intact
    assert obs2["node_features"][:, COL_DECIDED].sum() == 1


def test_masked_device_action_raises_and_keeps_state() -> None:
    env = make(invalid_action="raise")
    obs, _ = env.reset(seed=0)
    assert allowed(obs) == [0, 1, 2, 3]  # trinity: 4 devices, tiny lenet fits everywhere
    for padded in (4, 17, 63):
        expected = (
            rf"action {padded} is masked for group \d+: action {padded} names device {padded}; topology 'trinity' "
            rf"has devices 0\.\.3; allowed actions: \[0, 1, 2, 3\]"
        )
        with pytest.raises(ValueError, match=expected):
            env.step(padded)
        with pytest.raises(ValueError, match=rf"action {padded} names device {padded}; topology 'trinity'"):
            env.unwrapped.evaluate_action(padded)  # previews simulate only real devices
    with pytest.raises(ValueError, match=r"action -1 is outside the action space"):
        env.unwrapped.evaluate_action(-1)  # never a negative index from the end
    after = env.step(2)
    fresh = make()
    fresh.reset(seed=0)
    expected = fresh.step(2)
    assert after[4]["partial_makespan_s"] == expected[4]["partial_makespan_s"]
    assert all(np.array_equal(after[0][k], expected[0][k]) for k in expected[0])


def test_masked_tag_action_raises() -> None:
    env = make(action_space="tag", invalid_action="raise")
    obs, _ = env.reset(seed=0)
    assert allowed(obs) == [0, 1, 2, 3]  # trinity is one machine: machine 0 x 4 options
    expected = r"action 5 is masked for group \d+: action 5 names device-group subset 1 \(option 'parameter_server'\)"
    with pytest.raises(ValueError, match=expected):
        env.step(5)


@pytest.mark.parametrize("config", [{}, {"action_space": "tag"}, {"mode": "one_shot"}])
def test_masked_action_ends_the_episode(config: dict[str, Any]) -> None:
    """The default (``invalid_action="end"``): a masked action is not applied, the episode ends with
    the reward's invalid-action reward, and the last observation is the state the action answered."""
    for reward, expected in (("speedup", -1.0), ("dense", -1.0), ("mdpe", -float(np.log(0.5 * 11)))):
        env = make(reward=reward, **config)
        obs, _ = env.reset(seed=0)
        if config.get("mode") == "one_shot":
            action = np.zeros(env.action_space.shape, np.int64)
            action[-1] = 7  # the last group on device 7; trinity has 4
            why = r"action places group 15 on device index 7; topology 'trinity' has devices 0\.\.3"
        else:
            action, why = env.action_space.n - 1, r"action \d+ is masked for group \d+: action \d+ names"
        last, r, terminated, truncated, info = env.step(action)
        assert (r, terminated, truncated) == (pytest.approx(expected), True, False)
        assert info["invalid_action"] is True and re.search(why, info["invalid_action_reason"])
        assert "plan" not in info and info["instance"] == "lenet@trinity"
        assert obs_equal(last, obs)  # nothing was applied
        with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended"):
            env.step(action)


def obs_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_step_before_reset_and_after_the_end() -> None:
    for config in ({}, {"action_space": "tag"}, {"mode": "one_shot"}):
        one_shot = config.get("mode") == "one_shot"
        env = make(**config).unwrapped
        with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended; call reset\(\) first"):
            env.step(0)
        result = run_episode(env, RandomAgent(0), seed=0)
        assert result["steps"] == (1 if one_shot else env.data.instance.groups.num_ops)
        with pytest.raises(RuntimeError, match=r"step\(\) after the episode ended; call reset\(\) first"):
            env.step(np.zeros(env.action_space.shape, np.int64) if one_shot else 0)
        with pytest.raises(RuntimeError, match="evaluate_action needs a running sequential episode"):
            env.evaluate_action(0)
        env.reset(seed=1)  # reset starts a new episode
        if one_shot:
            with pytest.raises(RuntimeError, match="evaluate_action needs a running sequential episode"):
                env.evaluate_action(0)
        else:
            assert env.evaluate_action(0) > 0


def one_shot_env(**config: Any) -> tuple[PlacementEnv, int, int, dict[str, np.ndarray]]:
    """One-shot lenet (15 ops) on trinity, 4 groups, 8 device slots: (env, node rows, ops, reset obs)."""
    env = make(mode="one_shot", max_devices=8, one_shot_groups=4, **config).unwrapped
    obs, _ = env.reset(seed=0)
    return env, env.config.nodes, env.data.instance.groups.num_ops, obs


def test_one_shot_padded_device_raises() -> None:
    env, nodes, _, _ = one_shot_env(invalid_action="raise")
    action = np.zeros(nodes + 4, np.int64)
    action[nodes + 2] = 6  # group 2 on device 6; trinity has 4
    expected = r"action places group 2 on device index 6; topology 'trinity' has devices 0\.\.3"
    with pytest.raises(ValueError, match=expected):
        env.step(action)
    action[nodes + 2] = 3
    _, _, terminated, _, info = env.step(action)  # the same action on a real device is fine
    assert terminated and info["groups_used"] == 1


def test_one_shot_padded_op_slot_raises() -> None:
    env, nodes, ops, _ = one_shot_env(max_nodes=20, invalid_action="raise")
    assert ops == 15 < nodes == 20
    action = np.zeros(nodes + 4, np.int64)
    action[17] = 1
    expected = r"assigns padded op slot 17 \(the graph has 15 ops, slots 0\.\.14\) to group 1; the action mask allows"
    with pytest.raises(ValueError, match=expected):
        env.step(action)
    with pytest.raises(ValueError, match=rf"shape \({nodes + 3},\); expected integers of shape \({nodes + 4},\)"):
        env.step(np.zeros(nodes + 3, np.int64))  # wrong length
    with pytest.raises(ValueError, match=r"action entry 0 = 4; expected 0..3"):
        env.step(np.full(nodes + 4, 4, np.int64))  # group index 4 of 4 groups
    with pytest.raises(ValueError, match=r"action entry 0 = 18446744073709551615; expected 0..3"):
        env.step(np.full(nodes + 4, 2**64 - 1, np.uint64))  # compared as integers, never wrapped to -1
    with pytest.raises(ValueError, match=r"dtype float64"):
        env.step(np.zeros(nodes + 4, np.float64))  # floats are not silently truncated
    with pytest.raises(ValueError, match=r"action array\(\[False, .* of dtype bool"):
        env.step(np.zeros(nodes + 4, bool))
    with pytest.raises(ValueError, match=r"action \[\[0, 1\], \[2\]\] is not an array of integers of shape \(24,\)"):
        env.step([[0, 1], [2]])  # ragged


def test_one_shot_action_decoding() -> None:
    env, nodes, ops, _ = one_shot_env()
    action = np.zeros(nodes + 4, np.int64)
    action[:ops] = np.arange(ops) % 2  # ops alternate between groups 0 and 1
    action[nodes:] = [3, 1, 0, 0]  # group 0 on device 3, group 1 on device 1
    _, _, _, _, info = env.step(action)
    devices = [d.name for d in env.data.instance.topology.devices]
    graph = env.data.instance.graph
    assert info["groups_used"] == 2
    assert {op.name: info["plan"][op.name].devices for op in graph.ops} == {
        op.name: (devices[3] if i % 2 == 0 else devices[1],) for i, op in enumerate(graph.ops)
    }


# ----------------------------------------------------------------------------- masks
def test_padded_devices_always_masked() -> None:
    gen = {"kind": "random", "models": ["lenet", "alexnet"], "batch_size": 32}
    for action_space, per_device in (("device", 1), ("tag", len(TAG_OPTIONS))):
        env = make(gen, action_space=action_space)
        sizes = set()
        for seed in range(4):
            agent = RandomAgent(seed)
            obs, _ = env.reset(seed=seed)
            topo = env.unwrapped.data.instance.topology
            real = topo.num_devices if action_space == "device" else len(env.unwrapped.tag_problem().subsets) * 4
            sizes.add(real)
            done = False
            while not done:
                mask = obs["action_mask"]
                assert mask.shape == (64 * per_device,)  # max_devices and max_subsets are both 64
                assert not mask[real:].any(), (action_space, topo.name, np.flatnonzero(mask[real:]) + real)
                assert mask[:real].any()
                obs, _, done, _, _ = env.step(agent.act(env, obs))
        assert len(sizes) > 1  # several topology sizes were seen


def test_one_shot_mask_layout() -> None:
    env, nodes, ops, obs = one_shot_env(max_nodes=20)
    assert ops == 15
    mask = obs["action_mask"]
    ops_part, device_part = mask[: nodes * 4].reshape(nodes, 4), mask[nodes * 4 :].reshape(4, 8)
    assert ops_part[:ops].all()  # real ops: any group
    assert (ops_part[ops:] == [1, 0, 0, 0]).all()  # padded op slots: group 0 only
    assert device_part[:, :4].all() and not device_part[:, 4:].any()  # real devices only


@pytest.fixture(scope="module")
def vgg19_small_gpu0(shrunk_topology: Callable[..., str]) -> dict[str, Any]:
    """vgg19 (zoo batch 96) on trinity whose gpu0 has 256 MiB instead of 11 GiB."""
    topology = shrunk_topology("trinity-small-gpu0", [GIB // 4] + [11 * GIB] * 3)
    return {"kind": "fixed", "model": "vgg19", "topology": topology}


def test_group_that_does_not_fit_is_masked(vgg19_small_gpu0: dict[str, Any]) -> None:
    env = make(vgg19_small_gpu0, max_devices=8, invalid_action="raise")
    obs, _ = env.reset(seed=0)
    assert obs["device_features"][:4, DEV_COL_MEMORY_GIB].tolist() == [0.25, 11, 11, 11]
    # The first group (the most compute: vgg19's early convolutions, GiBs of activations at batch 96)
    # does not fit in 256 MiB: gpu0 is masked, the other real devices are not, padding never is.
    assert obs["action_mask"].tolist() == [0, 1, 1, 1, 0, 0, 0, 0]
    expected = r"action 0 is masked for group \d+: the group does not fit in memory there by the env's estimate"
    with pytest.raises(ValueError, match=expected):
        env.step(0)
    obs, *_ = env.step(1)
    used = obs["device_features"][:4, DEV_COL_MEMORY_USED_GIB]  # the group's estimate, now on gpu1
    assert used[1] > 0.25 and used[0] == used[2] == used[3] == 0


def test_when_nothing_fits_every_real_device_is_allowed(shrunk_topology: Callable[..., str]) -> None:
    """Documented behaviour: if no device can take the group, the mask allows every real device
    (never padding), the episode goes on, and the final plan is reported out of memory."""
    tiny = {"kind": "fixed", "model": "vgg19", "topology": shrunk_topology("trinity-256mib", [GIB // 4] * 4)}
    env = make(tiny, max_devices=8, reward="speedup")
    obs, _ = env.reset(seed=0)
    assert obs["action_mask"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    obs, *_ = env.step(2)
    assert obs["device_features"][2, DEV_COL_MEMORY_USED_GIB] > 0.25  # the group did not fit on gpu2
    done, steps = False, 1
    while not done:
        assert obs["action_mask"][:4].any() and not obs["action_mask"][4:].any()
        obs, reward, done, _, info = env.step(allowed(obs)[0])
        steps += 1
    assert steps == env.unwrapped.data.instance.groups.num_ops
    assert info["oom"] is True and reward == -1.0
    assert simulate(env.unwrapped.data.instance.graph, env.unwrapped.data.instance.topology, info["plan"]).oom


# ------------------------------------------------------------------------ sequential MDP
def test_groups_decided_once_in_descending_compute() -> None:
    env = make(small("alexnet"))
    obs, _ = env.reset(seed=0)
    G = env.unwrapped.data.instance.groups.num_ops
    order, done = [], False
    while not done:
        current = np.flatnonzero(obs["node_features"][:, COL_CURRENT])
        assert current.size == 1
        order.append(int(current[0]))
        assert obs["node_features"][:, COL_DECIDED].sum() == len(order) - 1
        obs, _, done, _, _ = env.step(allowed(obs)[0])
    assert sorted(order) == list(range(G))
    compute = obs["node_features"][order, COL_COMPUTE_MS]
    assert (np.diff(compute) <= 0).all()
    assert obs["node_features"][:G, COL_DECIDED].all() and not obs["node_features"][:, COL_CURRENT].any()


def test_device_actions_become_the_plan() -> None:
    env = make(small("alexnet"))
    obs, _ = env.reset(seed=0)
    inst = env.unwrapped.data.instance
    names = [d.name for d in inst.topology.devices]
    chosen, done = {}, False
    agent = RandomAgent(4)
    while not done:
        g = int(np.flatnonzero(obs["node_features"][:, COL_CURRENT])[0])
        action = agent.act(env, obs)
        chosen[inst.groups.ops[g].name] = OpConfig.make(names[action])
        obs, _, done, _, info = env.step(action)
    coarse = Plan(inst.groups.name, chosen)
    assert info["plan"].configs == coarse.expand(inst.groups, inst.graph).configs
    # the last partial makespan is the decided group plan, simulated on the group graph
    partial = simulate(inst.groups, inst.topology, coarse)
    assert info["partial_makespan_s"] == pytest.approx(partial.makespan_s, rel=1e-12)


@pytest.mark.parametrize("machine", [0, 1, 6])
@pytest.mark.parametrize("option", TAG_OPTIONS)
def test_tag_action_decoding(machine: int, option: str) -> None:
    """Action ``machine * 4 + option`` for every group: each op runs on that machine's GPUs."""
    env = make(small("alexnet", "tag-testbed"), action_space="tag")
    obs, _ = env.reset(seed=0)
    action = machine * len(TAG_OPTIONS) + TAG_OPTIONS.index(option)
    gpus = [d.name for d in load_preset("tag-testbed").machines()[f"m{machine}"]]
    done = False
    while not done:
        assert obs["action_mask"][action]
        obs, _, done, _, info = env.step(action)
    configs = info["plan"].configs.values()
    if option == "model_parallel":
        assert {c.devices for c in configs} == {(g,) for g in gpus}  # ops spread over the GPUs
    else:
        assert {c.devices for c in configs} == {tuple(gpus)}
        assert {c.sync for c in configs} == {"duplicate" if option == "duplicate" else option}


#: 2 machines x 1 GPU: 3 device-group subsets ({m0}, {m1}, both); lenet's 8 groups fit everywhere.
TWO_MACHINES = small("lenet", "random:126")


def test_tag_options_size_the_action_space_and_the_observation() -> None:
    """``tag_options``: the default keeps TAG's 4 options per subset; ``extended`` has 7, in the
    action space, the action mask and ``node_option``, and its observations stay in the space."""
    default = make(TWO_MACHINES, action_space="tag").unwrapped
    obs, _ = default.reset(seed=0)
    assert default.config.tag_options == "tag" and default.tag_problem().options == TAG_OPTIONS
    assert default.action_space == gym.spaces.Discrete(64 * 4)
    assert obs["node_option"].shape == (8, 4) and obs["action_mask"].shape == (64 * 4,)
    env = make(TWO_MACHINES, action_space="tag", tag_options="extended").unwrapped
    assert env.action_space == gym.spaces.Discrete(64 * 7)
    assert env.observation_space["node_option"].shape == (8, 7)
    assert env.observation_space["action_mask"].shape == (64 * 7,)
    obs, _ = env.reset(seed=0)
    problem = env.tag_problem()
    assert problem.options == TAG_EXTENDED_OPTIONS and problem.num_actions == 3 * 7
    assert env.observation_space.contains(obs)
    assert obs["action_mask"][:21].all() and not obs["action_mask"][21:].any()  # tiny lenet fits everywhere
    assert (obs["node_option"][:8, 0] == 1).all() and obs["node_option"].sum() == 8  # data parallelism
    agent, done = RandomAgent(0), False
    while not done:
        obs, _, done, _, info = env.step(agent.act(env, obs))
        assert env.observation_space.contains(obs)
    assert info["invalid_action"] is False and np.isfinite(info["makespan_s"])


@pytest.mark.parametrize("option", ["pipeline", "tensor_parallel", "fsdp"])
def test_extended_tag_actions_become_valid_plans(option: str) -> None:
    """Every group on both machines with an extended option: the env's plan validates on the original
    graph and is the option's (pipeline stages, a parameter split, ZeRO-3)."""
    env = make(TWO_MACHINES, action_space="tag", tag_options="extended").unwrapped
    obs, _ = env.reset(seed=0)
    problem = env.tag_problem()
    action = problem.action(problem.subsets.index((0, 1)), option)
    assert action == 2 * 7 + TAG_EXTENDED_OPTIONS.index(option)
    done = False
    while not done:
        assert obs["action_mask"][action]
        obs, _, done, _, info = env.step(action)
    column = TAG_EXTENDED_OPTIONS.index(option)
    assert (obs["node_option"][:8, column] == 1).all() and obs["node_option"].sum() == 8
    plan, inst = info["plan"], env.data.instance
    plan.validate(inst.graph, inst.topology)
    assert info["invalid_action"] is False and not info["oom"]
    assert info["makespan_s"] == pytest.approx(simulate(inst.graph, inst.topology, plan).makespan_s, rel=1e-9)
    configs = plan.configs.values()
    gpus = [d.name for d in inst.topology.devices]
    if option == "pipeline":  # one stage per machine, micro-batches
        assert plan.micro_batches > 1 and {c.devices for c in configs} == {(g,) for g in gpus}
    elif option == "tensor_parallel":  # ops with parameters split along a parameter dimension
        assert any(dim != "sample" for c in configs for dim, _ in c.degrees)
    else:
        assert {c.zero for c in configs} == {0, 3} and {c.devices for c in configs} == {tuple(gpus)}


def test_masked_extended_tag_action_names_its_option() -> None:
    env = make(TWO_MACHINES, action_space="tag", tag_options="extended", invalid_action="raise")
    env.reset(seed=0)
    expected = r"action 25 is masked for group \d+: action 25 names device-group subset 3 \(option 'tensor_parallel'\)"
    with pytest.raises(ValueError, match=expected):
        env.step(25)  # subset 3 of 3, option 4


@pytest.mark.parametrize("action_space", ["device", "tag"])
def test_evaluate_action_predicts_the_step(action_space: str) -> None:
    env = make(small("alexnet", "tag-testbed"), action_space=action_space)
    obs, _ = env.reset(seed=0)
    agent, done = RandomAgent(2), False
    while not done:
        action = agent.act(env, obs)
        predicted = env.unwrapped.evaluate_action(action)
        assert [env.unwrapped.evaluate_action(a) for a in allowed(obs)[:3]]  # previews leave no trace
        obs, _, done, _, info = env.step(action)
        assert predicted == info["partial_makespan_s"]


@pytest.mark.parametrize(("action_space", "margin"), [("device", 0.05), ("tag", 0.5)])
def test_greedy_beats_random(action_space: str, margin: float) -> None:
    """alexnet (batch 32) on trinity: greedy 1.21x (device) / 1.97x (tag) over data parallelism,
    random 1.11x / 0.57x on average over 5 seeds."""
    env = make(small("alexnet"), action_space=action_space)
    greedy = run_episode(env, GreedyAgent(), seed=0)
    assert run_episode(env, GreedyAgent(), seed=0)["speedup"] == greedy["speedup"]  # deterministic
    random_mean = float(np.mean([run_episode(env, RandomAgent(s), seed=s)["speedup"] for s in range(5)]))
    assert greedy["speedup"] >= random_mean + margin, (greedy["speedup"], random_mean)


def test_greedy_subsets_restrict_the_tag_lookahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GreedyAgent(subsets=n)`` previews the allowed actions on the first ``n`` device-group subsets
    only; with every subset it is the plain greedy agent; the device action space ignores it."""
    env = make(small("alexnet"), action_space="tag")
    obs, _ = env.reset(seed=0)
    inner = env.unwrapped
    problem = inner.tag_problem()
    previewed: list[int] = []
    preview = inner.evaluate_action

    def recorded(action: int) -> float:
        previewed.append(action)
        return float(preview(action))

    monkeypatch.setattr(inner, "evaluate_action", recorded)
    action = GreedyAgent(subsets=2).act(env, obs)
    assert previewed == [a for a in allowed(obs) if a < 2 * problem.num_options] and action in previewed
    # "ranked": on the 7 machines of tag-testbed, each alone, all 7, the fastest 2..6 (2 K - 1 subsets)
    ranked_env = make(small("alexnet", "tag-testbed"), action_space="tag")
    ranked_obs, _ = ranked_env.reset(seed=0)
    ranked_problem = ranked_env.unwrapped.tag_problem()
    K = sum(len(s) == 1 for s in ranked_problem.subsets)
    assert K == 7 and [len(s) for s in ranked_problem.subsets[: 2 * K - 1]] == [1] * K + [K] + list(range(2, K))
    ranked_previews: list[int] = []
    ranked_preview = ranked_env.unwrapped.evaluate_action

    def ranked_recorded(action: int) -> float:
        ranked_previews.append(action)
        return float(ranked_preview(action))

    monkeypatch.setattr(ranked_env.unwrapped, "evaluate_action", ranked_recorded)
    GreedyAgent(subsets="ranked").act(ranked_env, ranked_obs)
    assert ranked_previews == [a for a in allowed(ranked_obs) if a < (2 * K - 1) * ranked_problem.num_options]
    monkeypatch.undo()
    every = GreedyAgent(subsets=len(problem.subsets))
    assert run_episode(env, every, seed=0)["makespan_s"] == run_episode(env, GreedyAgent(), seed=0)["makespan_s"]
    device = make(small("alexnet"))
    restricted = run_episode(device, GreedyAgent(subsets=1), seed=0)
    assert restricted["makespan_s"] == run_episode(device, GreedyAgent(), seed=0)["makespan_s"]
    with pytest.raises(ValueError, match="subsets = 0; expected at least 1"):
        GreedyAgent(subsets=0)
    with pytest.raises(ValueError, match="subsets = 'fastest'; expected a positive count, 'ranked' or None"):
        GreedyAgent(subsets="fastest")  # type: ignore[arg-type]
