"""Placement-v0's hard memory mask in one-shot mode (``memory_mask="hard"``): lenet (batch 32, 16 op
slots, 2.75 MiB in all by the env's estimate) on the trinity preset with gpu0 at 0.5 MiB and gpu1 at
1 MiB, so single ops fit or not depending on the groups placed before them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from placement_rl.envs.observation import DEV_COL_MEMORY_GIB, GIB
from placement_rl.envs.placement.env import one_shot_memory_mask

ID = "placement_rl/Placement-v0"
MIB = 2**20
K = 4  # one_shot_groups


@pytest.fixture(scope="module")
def lenet_small_gpus(shrunk_topology: Callable[..., str]) -> dict[str, Any]:
    topology = shrunk_topology("trinity-half-mib", [MIB // 2, MIB, 11 * GIB, 11 * GIB])
    return {"kind": "fixed", "model": "lenet", "batch_size": 32, "topology": topology}


def make(generator: dict[str, Any], **config: Any) -> gym.Env[Any, Any]:
    options = {"mode": "one_shot", "one_shot_ops": 16, "one_shot_groups": K, "max_devices": 4}
    return gym.make(ID, config={"generator": generator, **options, **config})


def action(assign: np.ndarray, placement: list[int]) -> np.ndarray:
    """The one-shot action: ``assign`` for the real op slots, group 0 for the padded ones, then ``placement``."""
    slots = np.zeros(16, np.int64)
    slots[: len(assign)] = assign
    return np.concatenate([slots, np.asarray(placement)]).astype(np.int64)


def test_observation_carries_each_slots_memory_need(lenet_small_gpus: dict[str, Any]) -> None:
    env = make(lenet_small_gpus, memory_mask="hard")
    obs, _ = env.reset(seed=0)
    N = env.unwrapped.data.instance.groups.num_ops
    need = obs["node_memory_gib"]
    assert need.shape == (16,) and need.dtype == np.float32
    np.testing.assert_allclose(need[:N], env.unwrapped._single_need() / GIB, rtol=1e-6)
    assert not need[N:].any()
    # The paper's Trinity (the default) has no such field and no memory mask.
    assert "node_memory_gib" not in make(lenet_small_gpus).reset(seed=0)[0]


def test_hard_mask_masks_exactly_the_devices_that_cannot_hold_the_group(lenet_small_gpus: dict[str, Any]) -> None:
    env = make(lenet_small_gpus, memory_mask="hard", invalid_action="raise")
    obs, _ = env.reset(seed=0)
    N = env.unwrapped.data.instance.groups.num_ops
    need = obs["node_memory_gib"][:N].astype(np.float64)
    capacity = obs["device_features"][:4, DEV_COL_MEMORY_GIB].astype(np.float64)
    assert capacity.tolist() == [0.5 / 1024, 1 / 1024, 11, 11]
    big, second = np.argsort(-need)[:2]  # 0.73 and 0.56 MiB: over gpu0's 0.5 MiB, each under gpu1's 1 MiB
    assert 0.5 * MIB < need[second] * GIB <= need[big] * GIB < MIB < (need[big] + need[second]) * GIB
    assign = np.full(N, 3, np.int64)  # everything else in group 3
    assign[big], assign[second] = 0, 1  # group 2 stays empty
    mask = one_shot_memory_mask(need, assign, np.array([1, 1, 0, 2]), capacity)
    # Group 0 fits everywhere but gpu0; group 1 no longer fits on gpu1 (group 0 is there), nor on
    # gpu0; the empty group 2 fits everywhere (even on the overfull gpu1); group 3 (about 1.5 MiB)
    # only on the 11 GiB GPUs.
    assert mask.tolist() == [
        [False, True, True, True],
        [False, False, True, True],
        [True, True, True, True],
        [False, False, True, True],
    ]
    # By definition: a device is allowed iff what it already holds plus the group fits in it.
    used = np.zeros(4)
    for j, device in enumerate([1, 1, 0, 2]):
        group_need = need[assign == j].sum()
        np.testing.assert_array_equal(mask[j], (used + group_need <= capacity) | (group_need == 0))
        used[device] += group_need
    # step refuses the masked placement (group 1 on gpu1 after group 0) and accepts an allowed one.
    with pytest.raises(ValueError, match=r"group 1 \(0\.001 GiB .*\) on device 1, .*memory_mask='hard'.*\[2, 3\]"):
        env.step(action(assign, [1, 1, 0, 2]))
    _, _, done, _, info = env.step(action(assign, [1, 2, 0, 3]))
    assert done and not info["invalid_action"] and not info["oom"]
    # Without the hard mask the same over-memory placement is a valid action (the paper's Trinity).
    plain = make(lenet_small_gpus, invalid_action="raise")
    plain.reset(seed=0)
    _, _, done, _, info = plain.step(action(assign, [1, 1, 0, 2]))
    assert done and not info["invalid_action"]


def test_when_no_device_holds_the_group_every_real_device_is_allowed(
    shrunk_topology: Callable[..., str],
) -> None:
    topology = shrunk_topology("trinity-quarter-mib", [MIB // 4] * 4)
    env = make({"kind": "fixed", "model": "lenet", "batch_size": 32, "topology": topology}, memory_mask="hard")
    obs, _ = env.reset(seed=0)
    N = env.unwrapped.data.instance.groups.num_ops
    assign = np.zeros(N, np.int64)  # all 2.75 MiB in group 0: no device holds it
    need, capacity = obs["node_memory_gib"][:N], obs["device_features"][:4, DEV_COL_MEMORY_GIB]
    assert one_shot_memory_mask(need, assign, np.array([2, 0, 0, 0]), capacity)[0].all()
    _, reward, done, _, info = env.step(action(assign, [2, 0, 0, 0]))
    assert done and not info["invalid_action"] and info["oom"]


def test_sequential_mode_refuses_memory_mask_none(lenet_small_gpus: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"memory_mask = 'none' with mode = 'sequential'.*expected 'auto' or 'hard'"):
        gym.make(ID, config={"generator": lenet_small_gpus, "memory_mask": "none"})
    with pytest.raises(ValueError, match=r"memory_mask"):
        make(lenet_small_gpus, memory_mask="soft")
