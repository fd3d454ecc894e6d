"""Plans: constructors, validation errors, expansion from op groups, TAG's options, JSON."""

from __future__ import annotations

import pytest

from placement_rl import plan as plans
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.graph.coarsen import coarsen
from placement_rl.methods import BASELINES, baseline_plan
from placement_rl.plan import OpConfig, Plan
from placement_rl.topology import load_preset


@pytest.fixture(scope="module")
def testbed():  # type: ignore[no-untyped-def]
    return load_preset("tag-testbed")


def _tiny() -> OpGraph:
    conv = Op(
        "conv",
        "conv2d",
        ((8, 6, 4, 4),),
        param_bytes=100,
        param_key="conv",
        parallel_dims=(ParallelDim("sample", "sample", 0, 8), ParallelDim("channel", "parameter", 1, 6)),
    )
    fc = Op(
        "fc",
        "linear",
        ((8, 10),),
        param_bytes=400,
        param_key="fc",
        parallel_dims=(ParallelDim("sample", "sample", 0, 8), ParallelDim("channel", "parameter", 1, 10)),
    )
    return OpGraph("tiny", [conv, fc], [Tensor("conv", "fc", (8, 6, 4, 4), 3072)])


@pytest.mark.parametrize("model", ["inception_v3", "gnmt", "transformer"])
@pytest.mark.parametrize("kind", BASELINES)
def test_constructors_give_valid_plans(model: str, kind: str, zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph(model)
    p = baseline_plan(kind, graph, testbed)
    assert p.name == kind
    p.validate(graph, testbed)
    assert set(p.configs) == {op.name for op in graph.ops}


def test_data_parallel_splits_the_batch_over_every_device(zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")  # batch 96 on 16 GPUs: 6 samples each
    p = plans.data_parallel(graph, testbed)
    conv = next(op for op in graph.ops if op.op_type == "conv2d")
    assert p[conv.name].degree_map == {"sample": 16} and len(p[conv.name].devices) == 16
    assert p[graph.ops[-1].name].degree_map == {"sample": 16}  # the loss: partial sums per device


def test_expert_rules(zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    vgg = zoo_graph("vgg19")
    p = plans.expert(vgg, testbed)
    fc = next(op for op in vgg.ops if op.op_type == "linear")
    conv = next(op for op in vgg.ops if op.op_type == "conv2d")
    assert p[fc.name].degree_map == {"channel": 16}  # 4096 features over 16 GPUs
    assert p[conv.name].degree_map == {"sample": 16}
    gnmt = zoo_graph("gnmt")
    p = plans.expert(gnmt, testbed)
    assert p.metadata["rule"] == "wu-2016" and p.metadata["layers"] == 4
    layer_devices = {p[op.name].devices for op in gnmt.ops if op.op_type == "lstm_cell"}
    assert len(layer_devices) == 2  # 7 machines, 2 GPUs each at least: layers alternate GPU 0 / GPU 1


def test_layerwise_balances_by_device_speed(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("resnet101")
    topo = load_preset("tensoropt")
    p = plans.layerwise(graph, topo)
    work: dict[str, float] = {}
    for op in graph.ops:
        (dev,) = p[op.name].devices
        work[dev] = work.get(dev, 0.0) + op.forward_flops + op.backward_flops
    assert len(work) == 16
    # Stages are contiguous in topological order and no stage is far above the average.
    stages = [p[op.name].devices[0] for op in graph.ops]
    assert [d for i, d in enumerate(stages) if i == 0 or d != stages[i - 1]] == list(dict.fromkeys(stages))
    assert max(work.values()) < 3 * sum(work.values()) / 16


@pytest.mark.parametrize(
    ("cfg", "error", "message"),
    [
        (OpConfig.make("m9/gpu0"), UnknownNameError, "unknown device .*'m9/gpu0'; expected one of: m0/gpu0"),
        (
            OpConfig.make(["m0/gpu0"] * 3, {"sample": 3}),
            ValueError,
            "degree 3 does not divide dimension 'sample' of size 8",
        ),
        (OpConfig.make(["m0/gpu0"] * 4, {"height": 4}), UnknownNameError, "unknown parallel dimension .*'height'"),
        (OpConfig.make(["m0/gpu0"] * 3, {"sample": 2}), ValueError, "3 device\\(s\\) for 2 partitions"),
        (OpConfig.make(["m0/gpu0"], {}, "all_reduce", "m0/gpu1"), ValueError, "needs 'parameter_server'"),
        (OpConfig.make(["m0/gpu0"], {"sample": 0}), ValueError, "degree 0 for dimension 'sample'"),
        (OpConfig.make([]), ValueError, "lists no device"),
    ],
)
def test_bad_configs_are_rejected(cfg: OpConfig, error: type, message: str, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = _tiny()
    p = Plan("tiny", {"conv": cfg, "fc": OpConfig.make("m0/gpu0")})
    with pytest.raises(error, match=message):
        p.validate(graph, testbed)


def test_missing_and_unknown_ops(testbed) -> None:  # type: ignore[no-untyped-def]
    graph = _tiny()
    with pytest.raises(ValueError, match="no configuration for 1 op"):
        Plan("tiny", {"conv": OpConfig.make("m0/gpu0")}).validate(graph, testbed)
    extra = {"conv": OpConfig.make("m0/gpu0"), "fc": OpConfig.make("m0/gpu0"), "ghost": OpConfig.make("m0/gpu0")}
    with pytest.raises(UnknownNameError, match="'ghost'"):
        Plan("tiny", extra).validate(graph, testbed)


def test_json_round_trip(tmp_path, zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    for kind in BASELINES:
        p = baseline_plan(kind, graph, testbed)
        path = tmp_path / f"{kind}.json"
        p.to_json(path)
        back = Plan.from_json(path)
        assert back == p
    ps = Plan(
        "tiny",
        {
            "conv": OpConfig.make(["m0/gpu0", "m0/gpu1"], {"sample": 2}, "parameter_server", "m0/gpu1"),
            "fc": OpConfig.make(["m0/gpu0", "m0/gpu1"], {}, "duplicate"),
        },
    )
    ps.to_json(tmp_path / "ps.json")
    assert Plan.from_json(tmp_path / "ps.json") == ps


def test_bad_plan_documents(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = Plan("tiny", {"conv": OpConfig.make("m0/gpu0"), "fc": OpConfig.make("m0/gpu0")}).to_dict()
    with pytest.raises(SchemaError, match=r"unknown key\(s\) \['replicas'\]"):
        Plan.from_dict({**doc, "configs": {"conv": {"devices": ["m0/gpu0"], "replicas": 2}}})
    with pytest.raises(SchemaError, match="devices: expected a list of device names"):
        Plan.from_dict({**doc, "configs": {"conv": {"devices": "m0/gpu0"}}})
    with pytest.raises(SchemaError, match="degrees: expected an object of integer degrees"):
        Plan.from_dict({**doc, "configs": {"conv": {"devices": ["m0/gpu0"], "degrees": {"sample": 1.5}}}})
    (tmp_path / "p.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(SchemaError, match="malformed JSON"):
        Plan.from_json(tmp_path / "p.json")


def test_coarse_plan_expands_to_every_original_op(zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    coarse = coarsen(graph, 60)
    machines = list(testbed.machines())
    # Trinity-style: each group on one device.
    devices = [d.name for d in testbed.devices]
    single = Plan(coarse.name, {g.name: OpConfig.make(devices[i % 16]) for i, g in enumerate(coarse.ops)})
    single.validate(coarse, testbed)
    fine = single.expand(coarse, graph)
    fine.validate(graph, testbed)
    for group in coarse.ops:
        assert {fine[m].devices for m in group.members} == {single[group.name].devices}
    # Data parallel on the groups expands to data parallel on the ops that have a batch axis.
    dp = plans.data_parallel(coarse, testbed).expand(coarse, graph)
    dp.validate(graph, testbed)
    conv = next(op for op in graph.ops if op.op_type == "conv2d")
    assert dp[conv.name].degree_map == {"sample": 16}
    with pytest.raises(ValueError, match="not a coarsening of 'gnmt'"):
        single.expand(coarse, zoo_graph("gnmt"))
    assert machines  # the preset has machines


def test_tag_strategy_expresses_all_four_options(zoo_graph, testbed) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    coarse = coarsen(graph, 8)
    options = ["all_reduce", "parameter_server", "duplicate", "model_parallel"] * 2
    decisions = {g.name: ("m0", options[i]) for i, g in enumerate(coarse.ops)}
    p = plans.tag_strategy(coarse, graph, testbed, decisions)
    p.validate(graph, testbed)
    m0 = tuple(d.name for d in testbed.machines()["m0"])
    for group, option in zip(coarse.ops, options, strict=True):
        cfgs = [p[m] for m in group.members]
        if option == "model_parallel":
            assert all(len(c.devices) == 1 for c in cfgs)
            assert len({c.devices for c in cfgs}) > 1  # METIS spread the group's ops over the machine
        elif option == "duplicate":
            assert all(c.devices == m0 and c.sync == "duplicate" and c.num_partitions == 1 for c in cfgs)
        else:
            split = [c for c in cfgs if c.num_partitions > 1]
            assert split and all(c.sync == option and c.degree_map == {"sample": 4} for c in split)
    servers = [p[g.members[0]].ps_device for g, o in zip(coarse.ops, options, strict=True) if o == "parameter_server"]
    assert servers == [m0[0], m0[1]]  # round-robin inside the device group
    with pytest.raises(UnknownNameError, match="unknown machine 'm42'"):
        plans.tag_strategy(coarse, graph, testbed, {**decisions, coarse.ops[0].name: ("m42", "duplicate")})
