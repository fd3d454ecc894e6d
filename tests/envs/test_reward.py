"""Rewards: the formulas by hand, in the envs, and make_reward's errors."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from env_cases import GIB, small

from placement_rl import simulate
from placement_rl.envs import REWARDS, DenseReward, MDPEReward, Outcome, RandomAgent, SpeedupReward, make_reward
from placement_rl.errors import UnknownNameError
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.sim.result import SimResult
from placement_rl.topology import load_preset

SMALL = small("alexnet")


@pytest.fixture(scope="module")
def sims(zoo_graph) -> tuple[SimResult, SimResult]:  # type: ignore[no-untyped-def]
    """(data parallel, all on one device) simulations of alexnet on trinity: real SimResults to edit."""
    graph, topo = zoo_graph("alexnet", batch_size=32), load_preset("trinity")
    dp = simulate(graph, topo, data_parallel(graph, topo))
    single = simulate(graph, topo, Plan(graph.name, {op.name: OpConfig.make(topo.devices[0].name) for op in graph.ops}))
    assert not dp.oom and not single.oom and dp.makespan_s != single.makespan_s
    return dp, single


def mdpe_by_hand(
    final: SimResult,
    baseline: SimResult,
    alpha: float = 0.5,
    beta: float = 0.3,
    gamma: float = 0.2,
    c_hat_gb: float = 8.0,
    m_hat_gib: float = 8.0,
    penalty: float = 10.0,
) -> float:
    """Trinity eq. 8 as the reward module's docstring states it, written out independently."""
    f = final.makespan_s / baseline.makespan_s
    peak, cap = final.peak_memory_bytes.astype(float), final.memory_capacity_bytes.astype(float)
    if any(p > c for p, c in zip(peak, cap, strict=True)):
        f *= 1 + penalty * (1 + max((p - c) / c for p, c in zip(peak, cap, strict=True)))
    q_comm = max(0.0, max(final.link_bytes) / 1e9 / c_hat_gb - 1)
    q_mem = max(0.0, max(peak) / 2**30 / m_hat_gib - 1)
    return -math.log(alpha * f + beta * q_comm + gamma * q_mem)


def outcome(
    final: SimResult | None, baseline: SimResult, previous: float = 2.0, partial: float = 1.5, base_partial: float = 4.0
) -> Outcome:
    return Outcome(previous, partial, base_partial, final, baseline)


# ------------------------------------------------------------------------------ speedup
def test_speedup_reward(sims: tuple[SimResult, SimResult]) -> None:
    dp, single = sims
    reward = SpeedupReward()
    assert reward(outcome(None, dp)) == 0.0
    assert reward(outcome(single, dp)) == dp.makespan_s / single.makespan_s
    oom = dataclasses.replace(single, oom=True)
    assert reward(outcome(oom, dp)) == -1.0
    assert make_reward("speedup", {"oom_reward": -5.0})(outcome(oom, dp)) == -5.0


# --------------------------------------------------------------------------------- mdpe
def test_mdpe_matches_the_formula(sims: tuple[SimResult, SimResult]) -> None:
    dp, single = sims
    reward = MDPEReward()
    assert reward(outcome(None, dp)) == 0.0
    # Small job: no communication or memory term, so the reward is -log(alpha * T / T_dp).
    assert single.link_bytes.max() / 1e9 < 8 and single.peak_memory_bytes.max() / GIB < 8
    assert reward(outcome(single, dp)) == pytest.approx(-math.log(0.5 * single.makespan_s / dp.makespan_s), abs=1e-12)
    D, L = single.peak_memory_bytes.size, single.link_bytes.size
    busy_link = np.zeros(L)
    busy_link[-1] = 20e9  # 20 GB on one link: q_comm = 20 / 8 - 1 = 1.5
    big_peak = np.full(D, 2 * GIB, dtype=single.peak_memory_bytes.dtype)
    big_peak[1] = 10 * GIB  # 10 GiB peak, under 11 GiB: q_mem = 10 / 8 - 1 = 0.25, no OOM
    over = big_peak.copy()
    over[2] = 22 * GIB  # 22 GiB on an 11 GiB device: overflow 1, f *= 1 + 10 * 2
    cases = {
        "comm": dataclasses.replace(single, link_bytes=busy_link),
        "mem": dataclasses.replace(single, peak_memory_bytes=big_peak),
        "oom": dataclasses.replace(single, peak_memory_bytes=over, link_bytes=busy_link, oom=True),
    }
    expected_terms = {
        "comm": (single.makespan_s / dp.makespan_s, 1.5, 0.0),
        "mem": (single.makespan_s / dp.makespan_s, 0.0, 0.25),
        "oom": (single.makespan_s / dp.makespan_s * 21, 1.5, 22 / 8 - 1),
    }
    for name, final in cases.items():
        assert reward.terms(final, dp) == pytest.approx(expected_terms[name], rel=1e-12), name
        f, qc, qm = expected_terms[name]
        assert reward(outcome(final, dp)) == pytest.approx(-math.log(0.5 * f + 0.3 * qc + 0.2 * qm), rel=1e-12), name
        assert reward(outcome(final, dp)) == pytest.approx(mdpe_by_hand(final, dp), rel=1e-12), name
    options = {"alpha": 0.7, "beta": 0.1, "gamma": 0.4, "c_hat_gb": 4.0, "m_hat_gib": 2.0, "oom_penalty": 3.0}
    custom = make_reward("mdpe", options)
    for name, final in cases.items():
        expected = mdpe_by_hand(final, dp, 0.7, 0.1, 0.4, 4.0, 2.0, 3.0)
        assert custom(outcome(final, dp)) == pytest.approx(expected, rel=1e-12), name


# --------------------------------------------------------------------------------- dense
def test_dense_reward_unit(sims: tuple[SimResult, SimResult]) -> None:
    dp, single = sims
    reward = DenseReward()
    assert reward(outcome(None, dp, previous=2.0, partial=1.5, base_partial=4.0)) == (2.0 - 1.5) / 4.0
    assert reward(outcome(single, dp, previous=2.0, partial=2.5, base_partial=4.0)) == (2.0 - 2.5) / 4.0
    oom = dataclasses.replace(single, oom=True)
    assert reward(outcome(oom, dp, previous=2.0, partial=1.0, base_partial=4.0)) == (2.0 - 1.0) / 4.0 - 1.0
    # one-shot: no partial plans; the whole change at once, on the original graph
    assert reward(outcome(single, dp, previous=math.nan, partial=math.nan)) == 1.0 - single.makespan_s / dp.makespan_s
    assert reward(outcome(oom, dp, previous=math.nan, partial=math.nan)) == -single.makespan_s / dp.makespan_s


# ---------------------------------------------------------------------- invalid actions
def test_invalid_action_rewards() -> None:
    """What a masked action earns (the episode ends there): the reward of a plan that does not fit."""
    assert SpeedupReward().invalid_action_reward() == -1.0
    assert DenseReward().invalid_action_reward() == -1.0
    assert make_reward("speedup", {"invalid_reward": -5.0}).invalid_action_reward() == -5.0
    assert make_reward("dense", {"invalid_reward": -2.0}).invalid_action_reward() == -2.0
    # mdpe: as fast as data parallelism (f = 1) but over memory by a hair: alpha * (1 + oom_penalty)
    assert MDPEReward().invalid_action_reward() == pytest.approx(-math.log(0.5 * 11), rel=1e-12)
    assert MDPEReward(alpha=0.2, oom_penalty=4.0).invalid_action_reward() == pytest.approx(0.0, abs=1e-12)


def test_invalid_reward_of_every_reward_is_finite_at_the_option_limits() -> None:
    for options in ({"alpha": 1e-6, "oom_penalty": 0}, {"alpha": 1e6, "oom_penalty": 1e6}):
        assert math.isfinite(make_reward("mdpe", options).invalid_action_reward())


# ------------------------------------------------------------------------- in the envs
def make(env_id: str, reward: str, generator: dict[str, Any] | None = None, **extra: Any) -> gym.Env[Any, Any]:
    return gym.make(env_id, config={"generator": generator or SMALL, "max_groups": 8, "reward": reward, **extra})


def run(env: gym.Env[Any, Any], seed: int) -> tuple[list[float], dict[str, Any], dict[str, Any]]:
    """(rewards, reset info, last info) of one random episode."""
    agent = RandomAgent(seed)
    obs, first = env.reset(seed=seed)
    rewards, done, info = [], False, {}
    while not done:
        obs, reward, done, _, info = env.step(agent.act(env, obs))
        rewards.append(reward)
    return rewards, first, info


CASES = [
    ("placement_rl/Placement-v0", {"action_space": "device"}),
    ("placement_rl/Placement-v0", {"action_space": "tag"}),
    ("placement_rl/Sharding-v0", {}),
]


@pytest.fixture(scope="module")
def oom_generator(shrunk_topology: Callable[..., str]) -> dict[str, Any]:
    """vgg19 (zoo batch 96) on 4 GPUs of 1 GiB: every plan runs out of memory."""
    return {"kind": "fixed", "model": "vgg19", "topology": shrunk_topology("trinity-1gib", [GIB] * 4)}


@pytest.mark.parametrize("oom", [False, True], ids=["fits", "oom"])
@pytest.mark.parametrize(("env_id", "extra"), CASES, ids=["device", "tag", "sharding"])
def test_speedup_in_env(env_id: str, extra: dict[str, Any], oom: bool, oom_generator: dict[str, Any]) -> None:
    env = make(env_id, "speedup", oom_generator if oom else None, **extra)
    rewards, _, info = run(env, seed=0)
    assert rewards[:-1] == [0.0] * (len(rewards) - 1)
    assert info["oom"] is oom
    inst = env.unwrapped.data.instance
    dp = simulate(inst.graph, inst.topology, data_parallel(inst.graph, inst.topology))
    final = simulate(inst.graph, inst.topology, info["plan"])
    assert info["dp_makespan_s"] == dp.makespan_s
    assert rewards[-1] == (-1.0 if oom else dp.makespan_s / final.makespan_s)


@pytest.mark.parametrize("oom", [False, True], ids=["fits", "oom"])
@pytest.mark.parametrize(
    ("env_id", "extra"),
    [*CASES, ("placement_rl/Placement-v0", {"mode": "one_shot"})],
    ids=["device", "tag", "sharding", "one_shot"],
)
def test_mdpe_in_env(env_id: str, extra: dict[str, Any], oom: bool, oom_generator: dict[str, Any]) -> None:
    env = make(env_id, "mdpe", oom_generator if oom else None, **extra)
    rewards, _, info = run(env, seed=1)
    assert rewards[:-1] == [0.0] * (len(rewards) - 1)
    assert info["oom"] is oom
    inst = env.unwrapped.data.instance
    dp = simulate(inst.graph, inst.topology, data_parallel(inst.graph, inst.topology))
    final = simulate(inst.graph, inst.topology, info["plan"])
    assert rewards[-1] == pytest.approx(mdpe_by_hand(final, dp), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("oom", [False, True], ids=["fits", "oom"])
@pytest.mark.parametrize(("env_id", "extra"), CASES, ids=["device", "tag", "sharding"])
def test_dense_rewards_sum_to_the_partial_drop(
    env_id: str, extra: dict[str, Any], oom: bool, oom_generator: dict[str, Any]
) -> None:
    env = make(env_id, "dense", oom_generator if oom else None, **extra)
    for seed in range(2):
        rewards, first, info = run(env, seed)
        data = env.unwrapped.data
        groups, topo = data.instance.groups, data.instance.topology
        if extra.get("action_space") == "tag":
            # TAG's partial plans are simulated on the original ops: the baseline is DP there.
            baseline_partial = simulate(data.instance.graph, topo, data_parallel(data.instance.graph, topo)).makespan_s
        else:
            # The baseline is data parallelism on the group graph, simulated independently.
            baseline_partial = data.baseline_partial[0]
            dp_groups = simulate(groups, topo, data_parallel(groups, topo))
            assert baseline_partial == pytest.approx(dp_groups.makespan_s, rel=1e-12)
        assert first["partial_makespan_s"] == baseline_partial
        assert len(rewards) == groups.num_ops > 1
        final_partial = info["partial_makespan_s"]
        expected = (baseline_partial - final_partial) / baseline_partial - (1.0 if info["oom"] else 0.0)
        assert info["oom"] is oom
        assert abs(sum(rewards) - expected) <= 1e-9
        assert any(r != 0.0 for r in rewards[:-1])  # dense: feedback before the last step


def test_dense_one_shot(oom_generator: dict[str, Any]) -> None:
    for generator, oom in ((None, False), (oom_generator, True)):
        env = make("placement_rl/Placement-v0", "dense", generator, mode="one_shot")
        rewards, _, info = run(env, seed=2)
        assert len(rewards) == 1 and info["oom"] is oom
        assert rewards[0] == pytest.approx(1.0 - info["makespan_s"] / info["dp_makespan_s"] - oom, rel=1e-12)


# ------------------------------------------------------------------------------ errors
def test_make_reward_names_and_objects() -> None:
    assert set(REWARDS) == {"speedup", "mdpe", "dense"}
    for name, cls in REWARDS.items():
        assert type(make_reward(name)) is cls and cls.name == name
    obj = MDPEReward(alpha=0.9)
    assert make_reward(obj) is obj


def test_make_reward_unknown_name_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'latency'; expected one of: dense, mdpe, speedup") as err:
        make_reward("latency")
    assert isinstance(err.value, UnknownNameError)


def test_make_reward_unknown_option_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"reward 'mdpe': unknown key\(s\) \['delta'\]; expected some of") as err:
        make_reward("mdpe", {"alpha": 0.4, "delta": 1.0})
    for valid in ("alpha", "beta", "gamma", "c_hat_gb", "m_hat_gib", "oom_penalty"):
        assert valid in str(err.value)
    speedup_error = (
        r"reward 'speedup': unknown key\(s\) \['alpha'\]; expected some of \['invalid_reward', 'oom_reward'\]"
    )
    with pytest.raises(ValueError, match=speedup_error):
        make_reward("speedup", {"alpha": 0.5})


def test_make_reward_bad_values() -> None:
    with pytest.raises(ValueError, match=r"reward_options \{'oom_reward': 0.0\} given with a Reward object"):
        make_reward(SpeedupReward(), {"oom_reward": 0.0})
    with pytest.raises(ValueError, match=r"reward 'mdpe': alpha = -1; expected a finite number >= 1e-06 and <= 1e\+06"):
        make_reward("mdpe", {"alpha": -1})
    with pytest.raises(ValueError, match=r"reward 'mdpe': c_hat_gb = 0; expected a finite number >= 1e-06"):
        make_reward("mdpe", {"c_hat_gb": 0})
    # Bounded so that the reward stays finite: alpha * f never underflows to 0 nor overflows.
    with pytest.raises(ValueError, match=r"reward 'mdpe': alpha = 5e-324; expected a finite number >= 1e-06"):
        make_reward("mdpe", {"alpha": 5e-324})
    with pytest.raises(ValueError, match=r"reward 'mdpe': oom_penalty = 1e\+300; expected a finite number >= 0 and"):
        make_reward("mdpe", {"oom_penalty": 1e300})
    with pytest.raises(
        ValueError, match=r"reward 'speedup': oom_reward = -10000000.0; expected a finite number >= -1e\+06"
    ):
        make_reward("speedup", {"oom_reward": -1e7})
    with pytest.raises(ValueError, match=r"unknown reward \['speedup'\]; expected one of: dense, mdpe, speedup"):
        make_reward(["speedup"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reward 'mdpe': gamma = -0.1; expected a finite number >= 0"):
        make_reward("mdpe", {"gamma": -0.1})
    with pytest.raises(ValueError, match=r"reward 'dense': oom_reward = '-1'; expected a finite number"):
        make_reward("dense", {"oom_reward": "-1"})
    with pytest.raises(ValueError, match=r"reward 'mdpe': expected a mapping, got list"):
        make_reward("mdpe", [("alpha", 0.4)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reward 'mdpe': alpha = -2; expected a finite number >= 1e-06"):
        MDPEReward(alpha=-2)  # built directly: checked too
    assert make_reward("mdpe", {"beta": 0, "gamma": 0, "oom_penalty": 0}).beta == 0  # >= 0 may be 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    ("name", "option"),
    [
        *((name, option) for name in ("speedup", "dense") for option in ("oom_reward", "invalid_reward")),
        *(("mdpe", f.name) for f in dataclasses.fields(MDPEReward)),
    ],
)
def test_make_reward_refuses_nan_and_inf(name: str, option: str, bad: float) -> None:
    with pytest.raises(ValueError, match=rf"reward '{name}': {option} = {bad!r}; expected a finite number"):
        make_reward(name, {option: bad})


def test_env_config_refuses_nan_reward_option() -> None:
    config = {"generator": SMALL, "reward": "mdpe", "reward_options": {"alpha": float("nan")}}
    with pytest.raises(ValueError, match=r"reward 'mdpe': alpha = nan; expected a finite number >= 1e-06"):
        gym.make("placement_rl/Placement-v0", config=config)


def test_env_config_reward_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'fast'; expected one of: dense, mdpe, speedup"):
        gym.make("placement_rl/Placement-v0", config={"generator": SMALL, "reward": "fast"})
    dense_error = r"reward 'dense': unknown key\(s\) \['alpha'\]; expected some of \['invalid_reward', 'oom_reward'\]"
    with pytest.raises(ValueError, match=dense_error):
        gym.make(
            "placement_rl/Sharding-v0", config={"generator": SMALL, "reward": "dense", "reward_options": {"alpha": 1}}
        )
