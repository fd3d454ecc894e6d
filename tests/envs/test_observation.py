"""The observation's feature columns: names, their column constants, and what the static columns hold."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from env_cases import small

from placement_rl.envs import observation as ob
from placement_rl.ops import OBSERVATION_FAMILIES, OP_KINDS, observation_family
from placement_rl.sim.simulator import DEFAULT_COST_MODEL

SMALL = small("alexnet")


def test_layout_is_pinned() -> None:
    """Trained policies read these columns: the layout only ever grows at the end of a group."""
    assert ob.NODE_FEATURES == (
        "compute_ms",
        "param_mib",
        "output_mib",
        *(f"type_{f}" for f in ob.OP_FAMILIES),
        "decided",
        "current",
        "finish_ms",
        "idle_ms",
    )
    assert ob.OP_FAMILIES[-1] == "other" and len(set(ob.OP_FAMILIES)) == len(ob.OP_FAMILIES) == 13
    assert ob.DEVICE_FEATURES == ("peak_tflops", "memory_gib", "memory_used_gib", "idle_fraction")
    assert (ob.NODE_DIM, ob.DEVICE_DIM) == (3 + len(ob.OP_FAMILIES) + 4, 4)


def test_column_constants_name_their_columns() -> None:
    assert list(ob.NODE_COL) == list(ob.NODE_FEATURES) and sorted(ob.NODE_COL.values()) == list(range(ob.NODE_DIM))
    assert list(ob.DEVICE_COL) == list(ob.DEVICE_FEATURES)
    for constant, name in [
        (ob.COL_COMPUTE_MS, "compute_ms"),
        (ob.COL_PARAM_MIB, "param_mib"),
        (ob.COL_OUTPUT_MIB, "output_mib"),
        (ob.COL_DECIDED, "decided"),
        (ob.COL_CURRENT, "current"),
        (ob.COL_FINISH_MS, "finish_ms"),
        (ob.COL_IDLE_MS, "idle_ms"),
    ]:
        assert ob.NODE_FEATURES[constant] == name
    for constant, name in [
        (ob.DEV_COL_PEAK_TFLOPS, "peak_tflops"),
        (ob.DEV_COL_MEMORY_GIB, "memory_gib"),
        (ob.DEV_COL_MEMORY_USED_GIB, "memory_used_gib"),
        (ob.DEV_COL_IDLE_FRACTION, "idle_fraction"),
    ]:
        assert ob.DEVICE_FEATURES[constant] == name
    assert ob.NODE_FEATURES[ob.COLS_OP_TYPE] == tuple(f"type_{f}" for f in ob.OP_FAMILIES)


@pytest.mark.parametrize("mode", ["sequential", "one_shot"])
def test_static_columns_hold_what_their_names_say(mode: str) -> None:
    env = gym.make("placement_rl/Placement-v0", config={"generator": SMALL, "max_groups": 8, "mode": mode})
    obs, _ = env.reset(seed=0)
    inst = env.unwrapped.data.instance
    groups, fine, topology = inst.groups, inst.graph, inst.topology
    G, D = groups.num_ops, topology.num_devices
    node, dev = obs["node_features"], obs["device_features"]
    compute_ms = ob.group_compute_s(groups, fine, topology, DEFAULT_COST_MODEL) * 1e3
    np.testing.assert_allclose(node[:G, ob.COL_COMPUTE_MS], compute_ms, rtol=1e-6)
    np.testing.assert_allclose(node[:G, ob.COL_PARAM_MIB], [g.param_bytes / ob.MIB for g in groups.ops], rtol=1e-6)
    np.testing.assert_allclose(node[:G, ob.COL_OUTPUT_MIB], [g.output_bytes / ob.MIB for g in groups.ops], rtol=1e-6)
    histogram = node[:G, ob.COLS_OP_TYPE]
    np.testing.assert_allclose(histogram.sum(axis=1), 1.0, rtol=1e-6)
    for i, g in enumerate(groups.ops):  # the histogram counts the group's member ops by family
        members = g.members or (g.name,)
        counts = np.bincount([ob.op_family(fine.op(m).op_type) for m in members], minlength=len(ob.OP_FAMILIES))
        np.testing.assert_allclose(histogram[i], counts / len(members), rtol=1e-6)
    assert not node[G:].any() and not dev[D:].any()
    np.testing.assert_allclose(dev[:D, ob.DEV_COL_PEAK_TFLOPS], [d.peak_flops / 1e12 for d in topology.devices])
    np.testing.assert_allclose(dev[:D, ob.DEV_COL_MEMORY_GIB], [d.memory_bytes / ob.GIB for d in topology.devices])
    assert (dev[:D, ob.DEV_COL_IDLE_FRACTION] >= 0).all() and (dev[:D, ob.DEV_COL_IDLE_FRACTION] <= 1).all()
    if mode == "sequential":  # the runtime columns: the first group to decide is the most expensive
        current = int(np.flatnonzero(node[:, ob.COL_CURRENT])[0])
        assert node[current, ob.COL_COMPUTE_MS] == node[:G, ob.COL_COMPUTE_MS].max()
        assert (node[:G, ob.COL_FINISH_MS] > 0).all() and not node[:, ob.COL_DECIDED].any()


def test_op_family_reads_the_op_taxonomy() -> None:
    assert ob.OP_FAMILIES is OBSERVATION_FAMILIES
    for op_type in OP_KINDS:
        assert ob.OP_FAMILIES[ob.op_family(op_type)] == observation_family(op_type), op_type
    assert ob.OP_FAMILIES[ob.op_family("conv2d")] == "conv"
    assert ob.OP_FAMILIES[ob.op_family("no_such_op")] == "other"
