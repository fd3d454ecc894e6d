"""Sufficient factor broadcasting (TAG sec. 4.2.3): the plan's ``sfb`` sync, the simulator's tasks,
the SFB program on hand-built graphs, and delta simulation with ``sfb`` configurations."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.errors import SchemaError
from placement_rl.execute.lower import NotExecutableError, lower
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, data_parallel_per_tensor
from placement_rl.search import SearchSpace
from placement_rl.search.mcmc import plan_cost
from placement_rl.search.sfb import apply_sfb, sfb_decisions, solve_sfb
from placement_rl.sim import CostModel, DeltaSimulator
from placement_rl.sim.result import TASK_KINDS
from placement_rl.sim.sfb import node_inputs, sfb_cut
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import Device, DeviceTopology, Link

B, IN, OUT, SMALL = 4, 4096, 4096, 16
F32 = 4
# Efficiency 1, no launch overhead: an op of F FLOPs takes F / 1e12 s (memory bandwidth 1e15 B/s); hand-computed
# under the papers' flat roofline, hence calibration=None (no host lane, no optimizer step).
EXACT = CostModel(efficiency={}, default_efficiency=1.0, bucket_bytes=0, calibration=None)


def _dims(batch: int = B) -> tuple[ParallelDim, ...]:
    return (ParallelDim("sample", "sample", 0, batch),)


def _op(name: str, op_type: str, width: int, flops: float = 0.0, param_bytes: int = 0) -> Op:
    return Op(
        name,
        op_type,
        ((B, width),),
        forward_flops=flops,
        backward_flops=2 * flops,
        param_bytes=param_bytes,
        bytes_written=B * width * F32,
        parallel_dims=_dims(),
    )


def _t(src: str, dst: str, width: int) -> Tensor:
    return Tensor(src, dst, (B, width), B * width * F32)


def _pair(bandwidth_bytes_per_s: float) -> DeviceTopology:
    devices = [Device(f"g{k}", "test-gpu", f"m{k}", 1e12, 2**34, 1e15) for k in range(2)]
    return DeviceTopology("pair", devices, [Link("g0", "g1", bandwidth_bytes_per_s, 1e-6, "ethernet")])


def _linear_graph() -> OpGraph:
    """x (input, B x IN) -> fc (linear IN -> OUT, 64 MiB of weights) -> loss."""
    ops = [
        _op("x", "input", IN),
        _op("fc", "linear", OUT, 2.0 * B * IN * OUT, IN * OUT * F32),
        _op("loss", "relu", OUT, B * OUT),
    ]
    return OpGraph("linear", ops, [_t("x", "fc", IN), _t("fc", "loss", OUT)])


def _expand_graph() -> OpGraph:
    """x (input, B x SMALL) -> up (cheap, SMALL -> IN) -> fc (linear IN -> OUT) -> loss."""
    ops = [
        _op("x", "input", SMALL),
        _op("up", "relu", IN, B * IN),
        _op("fc", "linear", OUT, 2.0 * B * IN * OUT, IN * OUT * F32),
        _op("loss", "relu", OUT, B * OUT),
    ]
    return OpGraph("expand", ops, [_t("x", "up", SMALL), _t("up", "fc", IN), _t("fc", "loss", OUT)])


def _dp(graph: OpGraph, topo: DeviceTopology, **syncs: OpConfig) -> Plan:
    plan = data_parallel_per_tensor(graph, topo)
    return Plan(graph.name, {**plan.configs, **syncs}, name="dp")


def _sfb(**kw: object) -> OpConfig:
    return OpConfig.make(["g0", "g1"], {"sample": 2}, "sfb", **kw)  # type: ignore[arg-type]


def test_training_graph_nodes_and_the_cut() -> None:
    g = _expand_graph()
    assert node_inputs(g, "weight_gradient:fc") == [("backward:loss", 2), ("forward:up", 1)]
    assert node_inputs(g, "backward:up") == [("backward:fc", 1), ("forward:x", 0)]
    assert sfb_cut(g, "fc") == [("backward:loss", 2), ("forward:up", 1)]
    assert sfb_cut(g, "fc", ["forward:up"]) == [("backward:loss", 2), ("forward:x", 0)]
    with pytest.raises(ValueError, match="'sideways:fc'"):
        node_inputs(g, "sideways:fc")


def test_sfb_broadcasts_the_factors_and_beats_all_reduce_on_a_slow_link() -> None:
    g, topo = _linear_graph(), _pair(1e9)
    ar = simulate(g, topo, _dp(g, topo), EXACT)
    sfb = simulate(g, topo, _dp(g, topo, fc=_sfb()), EXACT)
    factor_bytes = (B // 2) * (IN + OUT) * F32  # one replica's x and output gradient
    kinds = [TASK_KINDS[k] for k in sfb.tasks.kind]
    assert kinds.count("sfb_broadcast") == 2 and kinds.count("sfb_gradient") == 2 and "all_reduce" not in kinds
    assert sfb.comm_bytes == 2 * factor_bytes == B * (IN + OUT) * F32
    assert ar.comm_bytes == 2 * IN * OUT * F32  # ring all-reduce over 2: 2 (n - 1) x the gradient
    # the rebuilt gradient: the other replica's share of x^T grad_y, B/2 * IN * OUT * 2 FLOPs at 1e12 FLOP/s
    rebuild_s = (B // 2) * IN * OUT * 2 / 1e12
    rebuilt = np.asarray(sfb.tasks.kind) == TASK_KINDS.index("sfb_gradient")
    ends = np.asarray(sfb.tasks.end_s)[rebuilt] - np.asarray(sfb.tasks.start_s)[rebuilt]
    assert ends == pytest.approx([rebuild_s, rebuild_s])
    assert sfb.busy_s == pytest.approx(ar.busy_s + rebuild_s)
    assert sfb.makespan_s < ar.makespan_s / 10
    # every network model agrees on the bytes
    for network in ("circuit", "pairwise"):
        cost = CostModel(efficiency={}, default_efficiency=1.0, network=network)
        assert simulate(g, topo, _dp(g, topo, fc=_sfb()), cost).comm_bytes == sfb.comm_bytes


def test_the_program_picks_the_hand_computed_cut() -> None:
    # D = 2 over 1 GB/s: the program weighs D (D - 1) = 2 broadcasts of each cut tensor (one replica's
    # share, B/2 rows) against 2 (D - 1) / D = 1 all-reduce of the 64 MiB gradient:
    #   cut A (duplicate weight_gradient:fc): broadcast up's output (2 x IN x 4 = 32 KiB) and the
    #       output gradient (2 x OUT x 4 = 32 KiB): 2 x 64 KiB / 1e9 = 131 us, + rebuilding 33.6 us;
    #   cut B (also duplicate forward:up): broadcast x (2 x SMALL x 4 = 128 B) instead of up's output:
    #       2 x 32.9 KiB / 1e9 = 65.8 us, + 33.6 us + up's other half (8 ns);
    #   all-reduce: 64 MiB / 1e9 = 67.1 ms. So cut B, saving 67.1 ms - 99.4 us.
    # backward:loss (radius 1) would cut the loss's input (same size as its gradient): no gain.
    g, topo = _expand_graph(), _pair(1e9)
    plan = _dp(g, topo)
    choice = solve_sfb(g, topo, plan, "fc", EXACT)
    assert choice.uses_sfb and choice.duplicated == ("forward:up",)
    assert choice.factor_bytes == (B // 2) * (SMALL + OUT) * F32
    assert choice.broadcast_bytes == 2 * choice.factor_bytes
    assert choice.gradient_bytes == IN * OUT * F32 and choice.sync_bytes == 2 * IN * OUT * F32
    assert choice.candidates >= 2 and "Optimal" in choice.status
    rebuild_s = (B // 2) * IN * OUT * 2 / 1e12
    up_s = (B // 2) * IN / 1e12
    expected = 2 * choice.factor_bytes / 1e9 + rebuild_s + up_s - IN * OUT * F32 / 1e9
    assert choice.objective_s == pytest.approx(expected, rel=1e-6, abs=1e-8)
    # radius 0: only the weight gradient can be duplicated: cut A
    assert solve_sfb(g, topo, plan, "fc", EXACT, radius=0).duplicated == ()
    # the simulator broadcasts exactly the chosen cut
    applied = apply_sfb(g, topo, plan, EXACT)
    assert applied["fc"] == _sfb(sfb_duplicate=("forward:up",)) and applied.metadata["sfb_ops"] == ["fc"]
    assert simulate(g, topo, applied, EXACT).comm_bytes == choice.broadcast_bytes


def test_sfb_does_not_pay_on_a_fast_link_with_a_large_batch() -> None:
    # 1e15 B/s: the gradient's all-reduce is nearly free, rebuilding the gradient is not.
    g, topo = _linear_graph(), _pair(1e15)
    (choice,) = sfb_decisions(g, topo, _dp(g, topo), EXACT)
    assert not choice.uses_sfb and choice.duplicated == () and choice.objective_s >= 0
    assert apply_sfb(g, topo, _dp(g, topo), EXACT)["fc"].sync == "all_reduce_per_tensor"
    # an sfb op where sfb no longer pays goes back to all-reduce
    assert apply_sfb(g, topo, _dp(g, topo, fc=_sfb()), EXACT)["fc"].sync == "all_reduce"


def test_sfb_plan_json_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g, topo = _expand_graph(), _pair(1e9)
    plan = _dp(g, topo, fc=_sfb(sfb_duplicate=("forward:up",)))
    plan.to_json(tmp_path / "plan.json")
    back = Plan.from_json(tmp_path / "plan.json")
    assert back == plan and back["fc"].sync == "sfb" and back["fc"].sfb_duplicate == ("forward:up",)
    assert plan["fc"].to_dict() == {
        "devices": ["g0", "g1"],
        "degrees": {"sample": 2},
        "sync": "sfb",
        "sfb_duplicate": ["forward:up"],
    }
    back.validate(g, topo)


@pytest.mark.parametrize(
    ("op", "cfg", "match"),
    [
        ("up", _sfb(), "without parameters"),
        ("fc", OpConfig.make(["g0", "g1"], {}, "sfb"), "one task per device"),
        ("fc", OpConfig.make(["g0", "g0"], {"sample": 2}, "sfb"), "one task per device"),
        ("fc", OpConfig.make(["g0", "g1"], {"sample": 2}, sfb_duplicate=("forward:up",)), "it needs 'sfb'"),
        ("fc", _sfb(sfb_duplicate=("forward:nowhere",)), "'forward:nowhere'"),
        ("fc", _sfb(sfb_duplicate=("weight_gradient:up",)), "'weight_gradient:up'"),
    ],
)
def test_bad_sfb_configurations_are_refused(op: str, cfg: OpConfig, match: str) -> None:
    g, topo = _expand_graph(), _pair(1e9)
    with pytest.raises(ValueError, match=match):
        _dp(g, topo, **{op: cfg}).validate(g, topo)


def test_bad_sfb_inputs_name_the_value() -> None:
    g, topo = _expand_graph(), _pair(1e9)
    # a duplicated node whose op is configured differently
    plan = _dp(g, topo, fc=_sfb(sfb_duplicate=("forward:up",)), up=OpConfig.make("g0"))
    with pytest.raises(ValueError, match="op 'up' runs on"):
        plan.validate(g, topo)
    # a parameter split
    wide = Op(
        "fc", "linear", ((B, OUT),), param_bytes=64, parallel_dims=(*_dims(), ParallelDim("out", "parameter", 1, OUT))
    )
    g2 = OpGraph("w", [_op("x", "input", IN), wide], [_t("x", "fc", IN)])
    with pytest.raises(ValueError, match="sample dimension only"):
        Plan("w", {"x": OpConfig.make("g0"), "fc": OpConfig.make(["g0", "g1"], {"out": 2}, "sfb")}).validate(g2, topo)
    with pytest.raises(SchemaError, match="'gossip'"):
        OpConfig.from_dict({"devices": ["g0"], "sync": "gossip"}, "cfg")
    with pytest.raises(SchemaError, match="sfb_duplicate"):
        OpConfig.from_dict({"devices": ["g0"], "sync": "sfb", "sfb_duplicate": "forward:up"}, "cfg")
    with pytest.raises(ValueError, match="op 'up': no replicated gradient"):
        solve_sfb(g, topo, _dp(g, topo), "up")
    with pytest.raises(ValueError, match="radius -1"):
        solve_sfb(g, topo, _dp(g, topo), "fc", radius=-1)
    with pytest.raises(NotExecutableError, match="op 'fc'.*sfb"):
        lower(g, topo, _dp(g, topo, fc=_sfb()))


@pytest.mark.parametrize("network", ["flow", "circuit", "pairwise"])
def test_delta_simulation_with_sfb_equals_full_simulation(network: str, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    devices = [Device(f"m{k}/gpu0", "test-gpu", f"m{k}", 1e12, 2**34, 1e12) for k in range(4)]
    links = [Link(d.name, "sw", 1e9 * (k + 1), 1e-5, "ethernet") for k, d in enumerate(devices)]
    topo = DeviceTopology("star4", devices, links, ["sw"])
    cost = CostModel(network=network, bucket_bytes=2**16)
    space = SearchSpace(graph, topo)
    start = data_parallel_per_tensor(graph, topo)
    params = [i for i, op in enumerate(graph.ops) if op.param_bytes > 0]
    delta = DeltaSimulator(SimContext(graph, topo, cost), [start[op.name] for op in graph.ops])
    rng = np.random.default_rng(3)
    for step in range(30):
        i = int(rng.choice(params)) if step % 2 == 0 else int(rng.integers(graph.num_ops))
        op = graph.ops[i]
        if step % 2 == 0 and op.sample_dim is not None:
            n = int(rng.choice([2, 4]))
            names = [d.name for d in rng.permutation(devices)[:n]]  # type: ignore[attr-defined]
            cfg = OpConfig.make(names, {op.sample_dim.name: n}, "sfb")
        else:
            cfg = space.random_config(i, rng)
        proposed = delta.propose(i, cfg)
        plan = Plan(graph.name, {**delta.plan().configs, op.name: cfg})
        assert proposed == plan_cost(simulate(graph, topo, plan, cost), 10.0)
        delta.accept() if rng.random() < 0.6 else delta.reject()
    assert any(c.sync == "sfb" for c in delta.configs)
    assert delta.result().makespan_s == simulate(graph, topo, delta.plan(), cost).makespan_s
