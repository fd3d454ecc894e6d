"""TensorOpt configurations and additive FT costs (placement_rl.search.ft.costs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import Plan, data_parallel
from placement_rl.search.ft.configs import mesh_shapes, op_configs
from placement_rl.search.ft.costs import CostGraph, build_cost_graph
from placement_rl.sim.cost import CostModel
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link, load_preset
from placement_rl.topology.core import MAX_BANDWIDTH_BYTES_PER_S

# Efficiency 1 and (almost) infinite memory bandwidth: an op of F FLOPs takes F / 1e12 seconds (hand-computed
# under the papers' flat roofline, hence calibration=None).
EXACT = CostModel(efficiency={}, default_efficiency=1.0, optimizer="adam", calibration=None)
LINK_BW = 10e9
LINK_LAT = 1e-6
RING_LAT = 2 * LINK_LAT  # every device-to-device route crosses two links of the star


def _star(n: int = 4) -> DeviceTopology:
    """``n`` identical 1 TFLOP/s devices, each joined to one switch at 10 GB/s, 1 us per link; memory as fast
    as a topology may say (its time is negligible next to compute)."""
    devices = [Device(f"g{i}", "test-gpu", "m0", 1e12, 2**34, MAX_BANDWIDTH_BYTES_PER_S) for i in range(n)]
    links = [Link(f"g{i}", "sw", LINK_BW, LINK_LAT, "pcie") for i in range(n)]
    return DeviceTopology(f"star{n}", devices, links, ["sw"])


def _linear(name: str, param_bytes: int = 0, key: str | None = None, batch: int = 8, width: int = 16) -> Op:
    return Op(
        name,
        "linear",
        ((batch, width),),
        forward_flops=4e9,
        backward_flops=8e9,
        param_bytes=param_bytes,
        param_key=key or (name if param_bytes else None),
        bytes_written=batch * width * 4,
        parallel_dims=(ParallelDim("sample", "sample", 0, batch), ParallelDim("channel", "parameter", 1, width)),
    )


def _relu(name: str, batch: int = 8, width: int = 16) -> Op:
    return Op(
        name,
        "relu",
        ((batch, width),),
        forward_flops=1e6,
        backward_flops=1e6,
        bytes_written=batch * width * 4,
        parallel_dims=(ParallelDim("sample", "sample", 0, batch), ParallelDim("channel", "attribute", 1, width)),
    )


def _input(name: str, batch: int = 8, width: int = 16) -> Op:
    return Op(name, "input", ((batch, width),), parallel_dims=(ParallelDim("sample", "sample", 0, batch),))


def _index(configs: list, degrees: dict[str, int], devices: tuple[str, ...] | None = None) -> int:
    return next(
        s for s, c in enumerate(configs) if c.degree_map == degrees and (devices is None or c.devices == devices)
    )


def _strategy_cost(cg: CostGraph, configs: list[int], option: int = 0) -> tuple[float, float]:
    """FT's additive (memory, time) of a strategy with one reuse option on every edge."""
    memory = sum(float(cg.node_memory_bytes[v][s]) for v, s in enumerate(configs))
    time = sum(float(cg.node_time_s[v][s]) for v, s in enumerate(configs))
    for e, (u, v) in enumerate(cg.edges):
        memory += float(cg.edge_memory_bytes[e][configs[u], configs[v], option])
        time += float(cg.edge_time_s[e][configs[u], configs[v], option])
    return memory, time


# ------------------------------------------------------------------------------------ configurations
def test_mesh_shapes() -> None:
    assert mesh_shapes(16) == [(16,), (2, 8), (4, 4), (8, 2)]
    assert mesh_shapes(1) == [(1,)]
    assert mesh_shapes(7) == [(7,)]
    with pytest.raises(ValueError, match="positive integer"):
        mesh_shapes(0)


def test_op_configs_of_lenet_are_distinct_complete_and_simulate(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = load_preset("flexflow-p100")
    names = [d.name for d in topo.devices[:4]]
    per_op = [op_configs(op, names) for op in graph.ops]
    for op, configs in zip(graph.ops, per_op, strict=True):
        assert len(set(configs)) == len(configs), op.name
        assert all(sorted(c.devices) == sorted(names) and c.sync == "all_reduce" for c in configs), op.name
        assert configs[0].degree_map == {} and configs[0].devices == tuple(names)  # full replication first
        assert configs[1].degree_map == {"sample": 4} and configs[1].devices == tuple(names)  # then data parallel
    assert len(per_op[graph.index("features_0")]) > 10  # conv: sample, channel, height, width on 1-D and 2x2 meshes
    # The data-parallel plan's configurations are in the sets, and any mix of them simulates.
    dp = data_parallel(graph, topo, names)
    assert all(dp[op.name] in configs for op, configs in zip(graph.ops, per_op, strict=True))
    rng = np.random.default_rng(0)
    plan = Plan(
        graph.name,
        {op.name: configs[int(rng.integers(len(configs)))] for op, configs in zip(graph.ops, per_op, strict=True)},
    )
    plan.validate(graph, topo)
    result = simulate(graph, topo, plan)
    assert math.isfinite(result.makespan_s) and result.makespan_s > 0


def test_device_order_follows_the_mesh() -> None:
    op = _linear("fc", param_bytes=64)
    names = ["a", "b", "c", "d"]  # mesh (2, 2): device (i, j) is names[2 * i + j]
    configs = op_configs(op, names)
    assert op_configs(op, names, max_configs=2) == configs[:2]
    # (replicate, sample): device (i, j) computes sample partition j, replica i -> task 2 j + i.
    assert _index(configs, {"sample": 2}, ("a", "c", "b", "d")) >= 0
    # (sample, replicate): sample partition i, replica j.
    assert _index(configs, {"sample": 2}, ("a", "b", "c", "d")) >= 0
    # (channel, sample): partition index sample-major (op.parallel_dims order) = 2 j + i.
    assert _index(configs, {"sample": 2, "channel": 2}, ("a", "c", "b", "d")) >= 0
    assert _index(configs, {"sample": 2, "channel": 2}, ("a", "b", "c", "d")) >= 0
    # 1-D and 2-D meshes splitting the same dimension everywhere are one configuration.
    assert sum(c.degree_map == {"sample": 4} for c in configs) == 1
    assert len(op_configs(op, ["a"])) == 1


# -------------------------------------------------------------------------------------------- nodes
def test_node_costs_by_hand() -> None:
    param_bytes = 4 * 10**6
    graph = OpGraph("fc", [_linear("fc", param_bytes), _linear("head")], [Tensor("fc", "head", (8, 16), 512)])
    cg, configs = build_cost_graph(graph, _star(4), cost_model=EXACT)
    dp, split, repl = _index(configs[0], {"sample": 4}), _index(configs[0], {"channel": 4}), 0
    compute_s = (4e9 + 8e9) / 4 / 1e12
    ring_all_reduce_s = 2 * (4 - 1) * (RING_LAT + param_bytes / 4 / LINK_BW)
    assert cg.node_time_s[0][dp] == pytest.approx(compute_s + ring_all_reduce_s)
    assert cg.node_time_s[0][split] == pytest.approx(compute_s)  # each device holds its own shard: no sync
    assert cg.node_time_s[0][repl] == pytest.approx(4 * compute_s + ring_all_reduce_s)
    state = EXACT.state_bytes_per_param_byte  # weights, gradients and two Adam moments
    assert cg.node_memory_bytes[0][dp] == pytest.approx(param_bytes * state + 512 / 4)
    assert cg.node_memory_bytes[0][split] == pytest.approx(param_bytes / 4 * state + 512 / 4)
    # The graph output keeps its output in node memory.
    assert cg.node_memory_bytes[1][0] == pytest.approx(512 + 512)


def test_shared_parameters_are_split_over_the_ops_that_share_them() -> None:
    ops = [_linear("step0", 10**6, key="cell"), _linear("step1", 10**6, key="cell")]
    cg, configs = build_cost_graph(
        OpGraph("rnn", ops, [Tensor("step0", "step1", (8, 16), 512)]), _star(4), cost_model=EXACT
    )
    single, _ = build_cost_graph(OpGraph("one", [_linear("step0", 10**6, key="cell")], []), _star(4), cost_model=EXACT)
    dp = _index(configs[0], {"sample": 4})
    compute_s = 12e9 / 4 / 1e12
    sync_s = single.node_time_s[0][dp] - compute_s
    assert sync_s > 0
    # each step carries half of the one synchronization and half of the one parameter state
    assert cg.node_time_s[0][dp] == pytest.approx(compute_s + sync_s / 2)
    assert cg.node_time_s[1][dp] == pytest.approx(compute_s + sync_s / 2)
    state = 10**6 * EXACT.state_bytes_per_param_byte
    assert cg.node_memory_bytes[0][dp] == pytest.approx(512 / 4 + state / 2)
    assert cg.node_memory_bytes[1][dp] == pytest.approx(512 / 4 + 512 / 4 + state / 2)  # + its (graph) output
    # a parameter split over all 4 devices needs no synchronization: only the replicated step pays
    split = _index(configs[1], {"channel": 4})
    assert cg.node_time_s[1][split] < cg.node_time_s[1][dp]


# -------------------------------------------------------------------------------------------- edges
def _pair(num_bytes: int = 4 * 2**20, producer_params: int = 64) -> tuple[CostGraph, list]:
    ops = [_linear("a", producer_params), _linear("b", 64)]
    return build_cost_graph(OpGraph("pair", ops, [Tensor("a", "b", (8, 16), num_bytes)]), _star(4), cost_model=EXACT)


def test_identical_splits_cost_nothing(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    num_bytes = 4 * 2**20
    graph = OpGraph("fc-relu", [_linear("fc", 64), _relu("relu")], [Tensor("fc", "relu", (8, 16), num_bytes)])
    cg, configs = build_cost_graph(graph, _star(4), cost_model=EXACT)
    for degrees in ({"sample": 4}, {}, {"channel": 4}, {"sample": 2, "channel": 2}):
        for su, c in enumerate(configs[0]):
            if c.degree_map == degrees:
                sv = _index(configs[1], degrees, c.devices)
                assert cg.edge_time_s[0][su, sv].tolist() == [0.0, math.inf, math.inf]
                assert cg.edge_memory_bytes[0][su, sv].tolist() == [num_bytes / c.num_partitions, math.inf, math.inf]
    # LeNet: a convolution split by output channel feeds a ReLU split by channel without moving data.
    graph = zoo_graph("lenet")
    cg, configs = build_cost_graph(graph, load_preset("flexflow-p100"), 4)
    u, v = graph.index("features_0"), graph.index("features_1")
    e = cg.edges.index((u, v))
    su = _index(configs[u], {"channel": 2})
    sv = _index(configs[v], {"channel": 2}, configs[u][su].devices)
    assert cg.edge_time_s[e][su, sv, 0] == 0.0


def test_data_parallel_to_replicated_costs_an_all_gather() -> None:
    num_bytes = 4 * 2**20
    cg, configs = _pair(num_bytes)
    dp, repl = _index(configs[0], {"sample": 4}), _index(configs[1], {})
    all_gather_s = (4 - 1) * (RING_LAT + num_bytes / 4 / LINK_BW)
    time_s, memory = cg.edge_time_s[0][dp, repl], cg.edge_memory_bytes[0][dp, repl]
    # Backward: every replica holds the whole gradient, the producer slices its part for free.
    assert time_s.tolist() == pytest.approx([all_gather_s, 2 * all_gather_s, all_gather_s])
    assert memory.tolist() == pytest.approx([num_bytes / 4 + num_bytes, num_bytes / 4, num_bytes])
    # Reuse options: keeping both copies needs the most memory and the least time.
    assert memory[0] > memory[1] and memory[0] > memory[2]
    assert time_s[0] <= time_s[1] and time_s[0] <= time_s[2]
    # A consumer split by output channel reads the whole input; its input gradient is partial and is
    # reduce-scattered back to the producer's batch split.
    split = _index(configs[1], {"channel": 4})
    assert cg.edge_time_s[0][dp, split, 0] == pytest.approx(2 * all_gather_s)
    # ... unless the producer needs no gradient (no parameters up to it).
    cg_input, configs_input = build_cost_graph(
        OpGraph("in", [_input("x"), _linear("b", 64)], [Tensor("x", "b", (8, 16), num_bytes)]),
        _star(4),
        cost_model=EXACT,
    )
    dp_in = _index(configs_input[0], {"sample": 4})
    assert cg_input.edge_time_s[0][dp_in, _index(configs_input[1], {"channel": 4}), 0] == pytest.approx(all_gather_s)


def test_point_to_point_rescheduling_prices_the_simulators_direct_transfers() -> None:
    num_bytes = 4 * 2**20
    ops = [_linear("a", 64), _linear("b", 64)]
    graph = OpGraph("pair", ops, [Tensor("a", "b", (8, 16), num_bytes)])
    cg, configs = build_cost_graph(graph, _star(4), cost_model=EXACT, rescheduling="point_to_point")
    dp, repl = _index(configs[0], {"sample": 4}), _index(configs[1], {})
    # Every device fetches the 3 quarters it lacks: 3/4 of the tensor on its link, 3 route latencies.
    direct_s = 0.75 * num_bytes / LINK_BW + 3 * RING_LAT
    assert cg.edge_time_s[0][dp, repl, 0] == pytest.approx(direct_s)  # backward: a free local slice
    assert cg.edge_time_s[0][dp, dp].tolist()[0] == 0.0
    with pytest.raises(ValueError, match="rescheduling 'nccl'"):
        build_cost_graph(graph, _star(4), rescheduling="nccl")


def test_parallel_tensors_merge_option_wise() -> None:
    # An LSTM-like cell with two outputs (h, c) both read by the next one: one merged edge.
    cell = Op(
        "a",
        "lstm_cell",
        ((8, 16), (8, 16)),
        forward_flops=1e6,
        param_bytes=64,
        param_key="a",
        parallel_dims=_linear("a").parallel_dims,
    )
    ops = [cell, _linear("b", 64)]
    one = build_cost_graph(OpGraph("one", ops, [Tensor("a", "b", (8, 16), 1000)]), _star(4), cost_model=EXACT)[0]
    both = [Tensor("a", "b", (8, 16), 1000), Tensor("a", "b", (8, 16), 1000, src_output=1)]
    two = build_cost_graph(OpGraph("two", ops, both), _star(4), cost_model=EXACT)[0]
    assert two.edges == one.edges == ((0, 1),)
    finite = np.isfinite(one.edge_time_s[0])
    assert np.array_equal(np.isfinite(two.edge_time_s[0]), finite) and not finite.all()
    assert np.allclose(two.edge_time_s[0][finite], 2 * one.edge_time_s[0][finite])
    assert np.allclose(two.edge_memory_bytes[0][finite], 2 * one.edge_memory_bytes[0][finite])
    # Two reads of the *same* output share its buffer: the producer's copy is charged half to each.
    shared = build_cost_graph(OpGraph("shared", ops, [both[0], both[0]]), _star(4), cost_model=EXACT)[0]
    producer_copy = one.edge_memory_bytes[0][..., 1]  # option 1 keeps only the producer's copy
    assert np.allclose(shared.edge_memory_bytes[0][..., 1][finite[..., 1]], producer_copy[finite[..., 1]])


def test_incompatible_meshes_fall_back_to_point_to_point() -> None:
    # 6 devices: meshes (2, 3) and (3, 2) have no common refinement.
    ops = [_linear("a", 64, batch=12, width=6), _linear("b", 64, batch=12, width=6)]
    cg, configs = build_cost_graph(OpGraph("six", ops, [Tensor("a", "b", (12, 6), 6000)]), _star(6), cost_model=EXACT)
    assert np.isfinite(cg.edge_time_s[0][..., 0]).all() and (cg.edge_time_s[0][..., 0] >= 0).all()
    assert np.isfinite(cg.edge_memory_bytes[0][..., 0]).all()
    shapes = {(c.degree_map.get("sample", 1), c.degree_map.get("channel", 1)) for c in configs[0]}
    assert {(2, 3), (3, 2), (6, 1), (1, 6)} <= shapes


# -------------------------------------------------------------------------------------- whole graph
def test_cost_graph_shapes_and_additive_data_parallel_estimate(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = load_preset("flexflow-p100")
    cg, configs = build_cost_graph(graph, topo, 4)
    assert cg.num_configs.tolist() == [len(c) for c in configs]
    assert len(cg.edges) == len(graph.tensors) and all(u < v for u, v in cg.edges)
    for e, (u, v) in enumerate(cg.edges):
        assert cg.edge_time_s[e].shape == cg.edge_memory_bytes[e].shape == (len(configs[u]), len(configs[v]), 3)
        assert np.isfinite(cg.edge_time_s[e][..., 0]).all()
        assert np.array_equal(np.isinf(cg.edge_time_s[e]), np.isinf(cg.edge_memory_bytes[e]))
    dp_plan = data_parallel(graph, topo, [d.name for d in topo.devices[:4]])
    dp = [configs[v].index(dp_plan[op.name]) for v, op in enumerate(graph.ops)]
    _, additive_s = _strategy_cost(cg, dp)
    simulated_s = simulate(graph, topo, dp_plan).makespan_s
    ratio = additive_s / simulated_s
    print(f"lenet, data parallel on 4 x flexflow-p100: additive {additive_s:.3e} s, simulated {simulated_s:.3e} s")
    assert 1 / 3 < ratio < 3


def test_bad_devices_raise() -> None:
    graph = OpGraph("one", [_linear("fc", 64)], [])
    topo = _star(4)
    with pytest.raises(ValueError, match="nope"):
        build_cost_graph(graph, topo, ["g0", "nope"])
    with pytest.raises(ValueError, match="0 devices"):
        build_cost_graph(graph, topo, [])
    for count in (0, 5):
        with pytest.raises(ValueError, match="device count"):
            build_cost_graph(graph, topo, count)
    with pytest.raises(ValueError, match="more than once"):
        build_cost_graph(graph, topo, ["g0", "g0"])
    with pytest.raises(ValueError, match="0 devices"):
        op_configs(graph.ops[0], [])
    with pytest.raises(ValueError, match="max_configs"):
        op_configs(graph.ops[0], ["g0", "g1"], max_configs=0)
    with pytest.raises(ValueError, match="mesh"):
        op_configs(graph.ops[0], ["g0", "g1"], meshes=[(3,)])
