"""Plan schema version 2: micro-batches and pipeline schedules, ZeRO, recomputation, uneven batch
splits; their JSON, their validation errors, and the pipeline / zero / fsdp / recompute constructors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from placement_rl import plan as plans
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, pipeline_stages
from placement_rl.topology import DeviceTopology, load_preset

GPU = [f"m0/gpu{i}" for i in range(4)]


@pytest.fixture(scope="module")
def trinity() -> DeviceTopology:
    return load_preset("trinity")  # one machine, m0/gpu0-3


@pytest.fixture(scope="module")
def h100() -> DeviceTopology:
    return load_preset("h100-2x8")  # two machines of 8 GPUs, m0/gpu0-7 then m1/gpu0-7


@pytest.fixture
def gpt(zoo_graph: Callable[..., OpGraph]) -> OpGraph:
    """A 4-layer GPT at batch 8 (71 ops; the flattened logits and the loss have a sample dimension of 256)."""
    return zoo_graph("gpt", batch_size=8, num_layers=4, hidden=64, heads=4, seq_len=32, vocab_size=256)


def _sample(size: int = 8) -> ParallelDim:
    return ParallelDim("sample", "sample", 0, size)


def _tiny() -> OpGraph:
    """x -> conv (parameters) -> relu (none) -> fc (parameters), batch 8."""
    x = Op("x", "input", ((8, 3, 4, 4),), parallel_dims=(_sample(),))
    conv = Op(
        "conv",
        "conv2d",
        ((8, 6, 4, 4),),
        forward_flops=1e6,
        backward_flops=2e6,
        param_bytes=100,
        param_key="conv",
        parallel_dims=(_sample(), ParallelDim("channel", "parameter", 1, 6)),
    )
    relu = Op(
        "relu",
        "relu",
        ((8, 6, 4, 4),),
        forward_flops=1e3,
        parallel_dims=(_sample(), ParallelDim("channel", "attribute", 1, 6)),
    )
    fc = Op(
        "fc",
        "linear",
        ((8, 10),),
        forward_flops=1e6,
        backward_flops=2e6,
        param_bytes=400,
        param_key="fc",
        parallel_dims=(_sample(), ParallelDim("channel", "parameter", 1, 10)),
    )
    tensors = [
        Tensor("x", "conv", (8, 3, 4, 4), 1536),
        Tensor("conv", "relu", (8, 6, 4, 4), 3072),
        Tensor("relu", "fc", (8, 6, 4, 4), 3072),
    ]
    return OpGraph("tiny", [x, conv, relu, fc], tensors, batch_size=8)


def _tiny_plan(**configs: OpConfig) -> Plan:
    """Data parallelism over m0/gpu0-1 on the tiny graph, some ops' configurations replaced."""
    dp = OpConfig.make(GPU[:2], {"sample": 2})
    return Plan("tiny", {name: configs.get(name, dp) for name in ("x", "conv", "relu", "fc")})


# ----------------------------------------------------------------------------------------- JSON


def test_a_v2_plan_round_trips_with_every_new_field(tmp_path, trinity) -> None:  # type: ignore[no-untyped-def]
    graph = _tiny()
    plan = _tiny_plan(
        conv=OpConfig.make(GPU[:2], {"sample": 2}, zero=3, recompute=True),
        relu=OpConfig.make(GPU[:2], {"sample": 2}, recompute=True),
        fc=OpConfig.make(GPU[:2], {"sample": 2}, "all_reduce_per_tensor", zero=1, weights={GPU[0]: 0.75, GPU[1]: 0.25}),
    ).with_schedule(micro_batches=2, schedule="gpipe")
    plan.validate(graph, trinity)
    document = plan.to_dict()
    assert document["schema_version"] == 2
    assert document["pipeline"] == {"micro_batches": 2, "schedule": "gpipe", "virtual_stages": 1}
    assert document["configs"]["conv"] == {"devices": GPU[:2], "degrees": {"sample": 2}, "recompute": True, "zero": 3}
    assert document["configs"]["fc"]["weights"] == {GPU[0]: 0.75, GPU[1]: 0.25}
    assert "recompute" not in document["configs"]["x"] and "zero" not in document["configs"]["x"]
    path = tmp_path / "plan.json"
    plan.to_json(path)
    back = Plan.from_json(path)
    assert back == plan
    assert back["fc"].weight_map == {GPU[0]: 0.75, GPU[1]: 0.25} and back["fc"].zero == 1
    assert (back.micro_batches, back.schedule, back.virtual_stages) == (2, "gpipe", 1)


def test_a_default_plan_writes_no_v2_keys() -> None:
    document = _tiny_plan().to_dict()
    assert "pipeline" not in document
    assert all(set(cfg) == {"devices", "degrees"} for cfg in document["configs"].values())


def _v1_document() -> dict[str, Any]:
    return {
        "format": "placement_rl.plan",
        "schema_version": 1,
        "name": "old",
        "graph": "tiny",
        "metadata": {},
        "configs": {
            "x": {"devices": GPU[:2], "degrees": {"sample": 2}},
            "conv": {"devices": GPU[:2], "degrees": {"sample": 2}, "sync": "parameter_server", "ps_device": GPU[1]},
            "relu": {"devices": GPU[:2], "degrees": {"sample": 2}},
            "fc": {"devices": GPU[:2], "sync": "duplicate"},
        },
    }


def test_a_v1_document_loads_with_every_new_field_at_its_default(trinity) -> None:  # type: ignore[no-untyped-def]
    plan = Plan.from_dict(_v1_document())
    plan.validate(_tiny(), trinity)
    assert (plan.micro_batches, plan.schedule, plan.virtual_stages) == (1, "1f1b", 1)
    assert all(not c.recompute and c.zero == 0 and c.weights == () for c in plan.configs.values())
    assert plan["conv"] == OpConfig.make(GPU[:2], {"sample": 2}, "parameter_server", GPU[1])
    assert plan.to_dict()["schema_version"] == 2  # written as the current version


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        (None, "pipeline", {"micro_batches": 2}),
        ("conv", "recompute", True),
        ("conv", "zero", 1),
        ("relu", "weights", {GPU[0]: 0.5, GPU[1]: 0.5}),
    ],
)
def test_a_v1_document_using_a_v2_key_is_refused(where: str | None, key: str, value: object) -> None:
    document = _v1_document()
    (document if where is None else document["configs"][where])[key] = value
    with pytest.raises(SchemaError, match=rf"unknown key\(s\) \['{key}'\]"):
        Plan.from_dict(document)
    document["schema_version"] = 2
    assert Plan.from_dict(document).to_dict()["schema_version"] == 2


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ({"schedule": "zigzag"}, "unknown schedule 'zigzag'; expected one of \\['gpipe', '1f1b', 'interleaved'\\]"),
        ({"micro_batches": 0}, "micro_batches = 0; expected a positive integer"),
        ({"micro_batches": True}, "micro_batches = True; expected a positive integer"),
        ({"virtual_stages": 1.5}, "virtual_stages = 1.5; expected a positive integer"),
        ({"stages": 4}, r"plan.pipeline: unknown key\(s\) \['stages'\]"),
    ],
)
def test_bad_pipeline_objects_are_refused(pipeline: dict[str, object], message: str) -> None:
    document = {**_v1_document(), "schema_version": 2, "pipeline": pipeline}
    with pytest.raises(SchemaError, match=message):
        Plan.from_dict(document)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"zero": 4}, r"zero: ZeRO stage 4; expected one of \[0, 1, 2, 3\]"),
        ({"zero": True}, "zero: ZeRO stage True"),
        ({"recompute": "yes"}, "recompute: expected true or false, got 'yes'"),
        ({"weights": [0.5, 0.5]}, "weights: expected an object of device name -> number"),
        ({"weights": {GPU[0]: "half"}}, "weights: expected an object of device name -> number"),
    ],
)
def test_bad_v2_op_keys_are_refused(config: dict[str, object], message: str) -> None:
    document = {**_v1_document(), "schema_version": 2}
    document["configs"]["conv"] = {"devices": GPU[:2], "degrees": {"sample": 2}, **config}
    with pytest.raises(SchemaError, match=message):
        Plan.from_dict(document)


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": "zigzag"}, r"unknown schedule 'zigzag'; expected one of \['gpipe', '1f1b', 'interleaved'\]"),
        ({"micro_batches": 0}, "micro_batches = 0; expected an integer from 1 to 65,536"),
        ({"micro_batches": True}, "micro_batches = True; expected an integer from 1"),
        ({"micro_batches": 3}, "3 micro-batches do not divide op 'x''s sample dimension of size 8"),
        ({"micro_batches": 8}, "op 'x' splits its sample dimension 2 ways, which does not divide a micro-batch of 1"),
        ({"virtual_stages": 0}, "virtual_stages = 0; expected a positive integer"),
        ({"virtual_stages": 2}, "virtual_stages = 2 with schedule '1f1b'; virtual stages need 'interleaved'"),
    ],
)
def test_bad_pipeline_fields_are_refused(changes: dict[str, Any], message: str, trinity) -> None:  # type: ignore[no-untyped-def]
    plan = _tiny_plan().with_schedule(**changes)
    with pytest.raises(ValueError, match=message):
        plan.validate(_tiny(), trinity)


def test_interleaved_stages_must_match_virtual_stages(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    two = plans.pipeline(gpt, trinity, 2, micro_batches=2)  # 2 stages on 2 groups: one stage per group
    with pytest.raises(ValueError, match=r"virtual_stages = 2, but the plan's 2 stage\(s\) give its 2 device group"):
        two.with_schedule(schedule="interleaved", virtual_stages=2).validate(gpt, trinity)
    two.with_schedule(schedule="interleaved").validate(gpt, trinity)  # one virtual stage per group matches
    four = plans.pipeline(gpt, trinity, 2, micro_batches=2, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ValueError, match=r"virtual_stages = 3, but the plan's 4 stage\(s\) .* \[2\] stage\(s\) each"):
        four.with_schedule(virtual_stages=3).validate(gpt, trinity)
    with pytest.raises(ValueError, match=r"multiple of the 2 pipeline group\(s\); got 1"):
        four.with_schedule(micro_batches=1).validate(gpt, trinity)


@pytest.mark.parametrize(
    ("op", "config", "message"),
    [
        ("relu", OpConfig.make(GPU[:2], {"sample": 2}, zero=1), "op 'relu': ZeRO stage 1 on an op without parameters"),
        ("conv", OpConfig.make(GPU[0], zero=2), r"ZeRO stage 2 on parameters that are not replicated \(1 task"),
        (
            "fc",
            OpConfig.make(GPU[:2], {"channel": 2}, zero=1),
            r"not replicated \(2 task\(s\), degrees .*\); ZeRO needs each shard all-reduced over at least 2 devices",
        ),
        (
            "conv",
            OpConfig.make(GPU[:2], {"sample": 2}, "parameter_server", zero=1),
            "ZeRO stage 1 with sync 'parameter_server'",
        ),
        ("conv", OpConfig.make(GPU[:2], {}, "duplicate", zero=3), "ZeRO stage 3 on parameters that are not replicated"),
        ("conv", OpConfig.make(GPU[:2], {}, "parameter_server", zero=1), "ZeRO stage 1 with sync 'parameter_server'"),
        ("conv", OpConfig.make(GPU[:2], {"sample": 2}, zero=4), r"ZeRO stage 4; expected one of \[0, 1, 2, 3\]"),
    ],
)
def test_bad_zero_is_refused(op: str, config: OpConfig, message: str, trinity) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        _tiny_plan(**{op: config}).validate(_tiny(), trinity)


def test_zero_on_replicated_parameters_is_accepted(trinity) -> None:  # type: ignore[no-untyped-def]
    # a channel split over 2 with 2 replicas of each shard, and a sample split: each shard held twice
    _tiny_plan(
        fc=OpConfig.make(GPU, {"channel": 2}, zero=3), conv=OpConfig.make(GPU[:2], {"sample": 2}, zero=1)
    ).validate(_tiny(), trinity)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            OpConfig.make(GPU[:2], {"sample": 2}, weights={GPU[0]: 0.6, GPU[1]: 0.3}),
            r"weights sum to 0.9; expected 1",
        ),
        (
            OpConfig.make(GPU[:2], {"sample": 2}, weights={GPU[0]: 0.5, GPU[1]: 0.25, GPU[2]: 0.25}),
            r"weights name device\(s\) \['m0/gpu2'\] the op does not use; expected weights for \['m0/gpu0', "
            r"'m0/gpu1'\]",
        ),
        (
            OpConfig.make(GPU[:2], {"sample": 2}, weights={GPU[0]: 1.0}),
            r"weights miss device\(s\) \['m0/gpu1'\]",
        ),
        (
            OpConfig.make(GPU[:2], {"sample": 2}, weights={GPU[0]: 1.5, GPU[1]: -0.5}),
            r"weights \{'m0/gpu1': -0.5\}; expected positive finite numbers",
        ),
        (
            OpConfig.make(GPU[:2], {}, weights={GPU[0]: 0.5, GPU[1]: 0.5}),
            r"weights .* without a sample split \(degrees \{\}\)",
        ),
        (
            OpConfig.make(GPU[:2], {"channel": 2}, weights={GPU[0]: 0.5, GPU[1]: 0.5}),
            r"without a sample split \(degrees \{'channel': 2\}\)",
        ),
        (
            OpConfig.make(GPU[:2], {"sample": 2}, weights={GPU[0]: 0.95, GPU[1]: 0.05}),
            r"give a slice of less than one sample of 8",
        ),
    ],
)
def test_bad_weights_are_refused(config: OpConfig, message: str, trinity) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        _tiny_plan(conv=config).validate(_tiny(), trinity)


def test_weights_allow_a_degree_that_does_not_divide_the_batch(trinity) -> None:  # type: ignore[no-untyped-def]
    graph = _tiny()
    uneven = OpConfig.make(GPU[:3], {"sample": 3}, weights={GPU[0]: 0.5, GPU[1]: 0.25, GPU[2]: 0.25})
    _tiny_plan(conv=uneven).validate(graph, trinity)
    assert plans.sample_shares(graph.op("conv"), uneven) == [0.5, 0.25, 0.25]
    with pytest.raises(ValueError, match="degree 3 does not divide dimension 'sample' of size 8; give weights"):
        _tiny_plan(conv=OpConfig.make(GPU[:3], {"sample": 3})).validate(graph, trinity)


# ---------------------------------------------------------------------------------- constructors


def _stage_devices(graph: OpGraph, plan: Plan) -> list[tuple[str, ...]]:
    return [s.devices for s in pipeline_stages(graph, plan)]


def _check_contiguous(graph: OpGraph, plan: Plan) -> None:
    """Every op in exactly one stage, the stages in graph order, covering all ops."""
    stages = pipeline_stages(graph, plan)
    assert [i for s in stages for i in s.ops] == list(range(graph.num_ops))
    assert set(plan.configs) == {op.name for op in graph.ops}


def test_pipeline_gives_one_balanced_stage_per_device_by_default(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    plan = plans.pipeline(gpt, trinity, micro_batches=4)
    plan.validate(gpt, trinity)
    assert (plan.name, plan.micro_batches, plan.schedule, plan.virtual_stages) == ("pipeline", 4, "1f1b", 1)
    assert _stage_devices(gpt, plan) == [(d,) for d in GPU]
    _check_contiguous(gpt, plan)
    assert sum(plan.metadata["chunk_ops"]) == gpt.num_ops and plan.metadata["groups"] == [[d] for d in GPU]
    work = gpt.arrays.forward_flops + gpt.arrays.backward_flops
    per_stage = [float(work[list(s.ops)].sum()) for s in pipeline_stages(gpt, plan)]
    assert max(per_stage) < 1.5 * sum(per_stage) / 4  # 4 blocks over 4 stages: close to a quarter each
    assert plans.pipeline(gpt, trinity, 2).devices_used() == GPU[:2]  # a stage count uses the first devices


def test_pipeline_stages_are_data_parallel_groups(gpt, h100) -> None:  # type: ignore[no-untyped-def]
    plan = plans.pipeline(gpt, h100, 4, data_parallel=4, micro_batches=2)
    names = [d.name for d in h100.devices]
    groups = [tuple(names[4 * k : 4 * k + 4]) for k in range(4)]
    assert _stage_devices(gpt, plan) == groups
    _check_contiguous(gpt, plan)
    qkv, position = plan["blocks_0_attention_qkv"], plan["position_embedding"]
    assert qkv.degree_map == {"sample": 4} and qkv.devices == groups[0]  # a micro-batch of 4 over 4 devices
    assert position.degree_map == {} and position.devices == groups[0]  # no batch axis: replicated on the group
    # 4 micro-batches of 2 samples do not split 4 ways: replicated; the flattened logits (256) still split
    four = plans.pipeline(gpt, h100, 4, data_parallel=4, micro_batches=4)
    four.validate(gpt, h100)
    assert four["blocks_0_attention_qkv"].degree_map == {} and len(four["blocks_0_attention_qkv"].devices) == 4
    assert four["cross_entropy"].degree_map == {"sample": 4}
    default = plans.pipeline(gpt, h100, data_parallel=8)  # default stage count: 16 devices / 8
    assert _stage_devices(gpt, default) == [tuple(names[:8]), tuple(names[8:])]  # one machine per stage


def test_pipeline_with_explicit_device_lists(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    plan = plans.pipeline(gpt, trinity, [["m0/gpu3"], ["m0/gpu1", "m0/gpu2"]], micro_batches=2)
    assert _stage_devices(gpt, plan) == [("m0/gpu3",), ("m0/gpu1", "m0/gpu2")]
    assert plan["cross_entropy"].degree_map == {"sample": 2}
    _check_contiguous(gpt, plan)
    strings = plans.pipeline(gpt, trinity, ["m0/gpu2", "m0/gpu0"])  # a name alone: a one-device stage
    assert _stage_devices(gpt, strings) == [("m0/gpu2",), ("m0/gpu0",)]


def test_interleaving_deals_chunks_round_robin(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    plan = plans.pipeline(gpt, trinity, 2, micro_batches=2, schedule="interleaved", virtual_stages=2)
    plan.validate(gpt, trinity)
    assert _stage_devices(gpt, plan) == [("m0/gpu0",), ("m0/gpu1",), ("m0/gpu0",), ("m0/gpu1",)]
    _check_contiguous(gpt, plan)
    twelve = plans.pipeline(gpt, trinity, 4, micro_batches=4, schedule="interleaved", virtual_stages=3)
    stages = pipeline_stages(gpt, twelve)
    assert [s.devices for s in stages] == [(GPU[k % 4],) for k in range(12)]  # chunk k on group k % 4
    assert [len(s.ops) for s in stages] == twelve.metadata["chunk_ops"]


def _chain(flops: list[float]) -> OpGraph:
    ops = [Op(f"op{i}", "relu", ((8, 4),), forward_flops=f, parallel_dims=(_sample(),)) for i, f in enumerate(flops)]
    tensors = [Tensor(f"op{i}", f"op{i + 1}", (8, 4), 128) for i in range(len(flops) - 1)]
    return OpGraph("chain", ops, tensors, batch_size=8)


def test_pipeline_leaves_no_stage_empty(trinity) -> None:  # type: ignore[no-untyped-def]
    graph = _chain([1.0, 1.0, 1e9, 1.0, 1.0, 1.0])  # the balance alone would give op2 most of the stages
    plan = plans.pipeline(graph, trinity, 4)
    assert plan.metadata["chunk_ops"] == [2, 1, 1, 2]
    assert _stage_devices(graph, plan) == [(d,) for d in GPU]
    exact = plans.pipeline(_chain([1.0] * 4), trinity, 4)  # as many stages as ops: one op each
    assert exact.metadata["chunk_ops"] == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"stages": 0}, ValueError, "stages = 0; expected at least 1"),
        ({"stages": True}, ValueError, "stages = True"),
        ({"stages": 5}, ValueError, r"stages = 5 of data_parallel = 1 device\(s\) need 5 devices; only 4"),
        ({"stages": 2, "data_parallel": 3}, ValueError, "need 6 devices; only 4"),
        ({"data_parallel": 3}, ValueError, "data_parallel = 3 does not divide the 4 devices"),
        ({"data_parallel": 0}, ValueError, "data_parallel = 0; expected a positive integer"),
        ({"stages": 2, "devices": ["m0/gpu0", "m9/gpu0"]}, UnknownNameError, "unknown device 'm9/gpu0'"),
        ({"stages": 2, "devices": ["m0/gpu0", "m0/gpu0"]}, ValueError, r"devices name \['m0/gpu0'\] more than once"),
        ({"stages": [["m0/gpu0"], ["m9/gpu1"]]}, UnknownNameError, "unknown device 'm9/gpu1'"),
        ({"stages": [["m0/gpu0", "m0/gpu1"], ["m0/gpu1"]]}, ValueError, "'m0/gpu1' is in stage 0 and stage 1"),
        ({"stages": [["m0/gpu0"], []]}, ValueError, "stage 1 lists no device"),
        ({"stages": []}, ValueError, "stages = \\[\\]; expected a stage count or a non-empty list"),
        ({"stages": [["m0/gpu0"]], "devices": ["m0/gpu0"]}, ValueError, "given with explicit stage device lists"),
        ({"stages": [["m0/gpu0"], ["m0/gpu1"]], "data_parallel": 2}, ValueError, "but stage 0 lists 1 device"),
        ({"schedule": "zigzag"}, ValueError, r"schedule 'zigzag'; expected one of \['gpipe', '1f1b', 'interleaved'\]"),
        ({"micro_batches": 0}, ValueError, "micro_batches = 0; expected an integer from 1"),
        ({"stages": 2, "cuts": [0]}, ValueError, r"cuts = \[0\]; expected 1 increasing op indices in \(0, "),
        ({"stages": 3, "cuts": [5]}, ValueError, r"cuts = \[5\]; expected 2 increasing op indices"),
        ({"micro_batches": 3}, ValueError, "3 micro-batches do not divide op 'tokens''s sample dimension of size 8"),
        ({"virtual_stages": 2}, ValueError, "virtual_stages = 2 with schedule '1f1b'; virtual stages need"),
        (
            {"stages": 1, "schedule": "interleaved", "virtual_stages": 2},
            ValueError,
            "virtual_stages = 2 on 1 device group; interleaving needs at least 2 groups",
        ),
        (
            {"stages": 2, "schedule": "interleaved", "virtual_stages": 2, "micro_batches": 1},
            ValueError,
            r"multiple of the 2 pipeline group\(s\); got 1",
        ),
    ],
)
def test_pipeline_refuses_bad_input(kwargs: dict[str, Any], error: type, message: str, gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=message):
        plans.pipeline(gpt, trinity, **kwargs)


def test_pipeline_cut_where_the_fewest_tensors_cross(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    cuts = plans.light_cuts(gpt, 4)
    assert cuts[0] == 0 and cuts[-1] == gpt.num_ops and cuts == sorted(set(cuts))
    plan = plans.pipeline(gpt, trinity, micro_batches=4, cuts=cuts[1:-1])
    plan.validate(gpt, trinity)
    assert plan.metadata["chunk_ops"] == [b - a for a, b in zip(cuts, cuts[1:], strict=False)]

    # a cut crosses no more tensors than the balanced cut of the same stages
    def crossing(c: int) -> int:
        return sum(1 for t in gpt.tensors if gpt.index(t.src) < c <= gpt.index(t.dst))

    balanced = np.cumsum([0, *plans.pipeline(gpt, trinity, micro_batches=4).metadata["chunk_ops"]])
    assert sum(crossing(c) for c in cuts[1:-1]) <= sum(crossing(int(c)) for c in balanced[1:-1])
    with pytest.raises(ValueError, match="chunks = 0; expected 1 to"):
        plans.light_cuts(gpt, 0)
    # shares in proportion to the stages' speed: a stage three times as fast takes about 3/4 of the work
    work = np.concatenate(([0.0], np.cumsum(gpt.arrays.forward_flops + gpt.arrays.backward_flops)))
    fast_first = plans.light_cuts(gpt, 2, shares=[3.0, 1.0])
    assert fast_first[0] == 0 and fast_first[-1] == gpt.num_ops
    assert 0.5 < work[fast_first[1]] / work[-1] < 0.95
    assert plans.light_cuts(gpt, 4, shares=[1.0] * 4) == cuts
    with pytest.raises(ValueError, match=r"shares = \[1.0, 0.0\]; expected 2 finite numbers > 0"):
        plans.light_cuts(gpt, 2, shares=[1.0, 0.0])


def test_pipeline_refuses_more_chunks_than_ops(trinity) -> None:  # type: ignore[no-untyped-def]
    graph = _chain([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="4 chunks for the 3 ops of graph 'chain'"):
        plans.pipeline(graph, trinity, 4)
    with pytest.raises(ValueError, match=r"2 stage\(s\) x 2 virtual stage\(s\) = 4 chunks for the 3 ops"):
        plans.pipeline(graph, trinity, 2, schedule="interleaved", virtual_stages=2, micro_batches=2)


def test_zero_shards_replicated_all_reduced_parameters_only(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    configs = dict(plans.data_parallel(gpt, trinity).configs)
    configs["blocks_0_mlp_fc"] = OpConfig.make(GPU[:2], {"channel": 2})  # one device per shard
    configs["blocks_1_mlp_fc"] = OpConfig.make(GPU, {"sample": 4}, "parameter_server")
    configs["blocks_2_mlp_fc"] = OpConfig.make(GPU, {"channel": 2})  # two replicas per shard
    base = Plan(gpt.name, configs, name="mixed", micro_batches=2)
    one = plans.zero(gpt, base)
    one.validate(gpt, trinity)
    assert (one.name, one.micro_batches, one.metadata["zero"]) == ("mixed", 2, 1)
    sharded = {name for name, cfg in one.configs.items() if cfg.zero == 1}
    assert {"token_embedding", "position_embedding", "blocks_0_attention_qkv", "blocks_2_mlp_fc"} <= sharded
    assert not sharded & {"blocks_0_mlp_fc", "blocks_1_mlp_fc", "lm_head", "add", "tokens"}
    assert sharded == {op.name for op in gpt.ops if op.param_bytes > 0} - {"blocks_0_mlp_fc", "blocks_1_mlp_fc"}
    assert all(one[n] == base[n] for n in base.configs if n not in sharded)  # the others untouched
    assert all(one[n].replace(zero=0) == base[n] for n in sharded)  # only the stage changed
    three = plans.fsdp(gpt, base)
    assert {name for name, cfg in three.configs.items() if cfg.zero == 3} == sharded
    assert plans.zero(gpt, three, stage=0) == dataclasses.replace(base, metadata={"zero": 0})


def test_zero_needs_replicas(gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    stages = plans.pipeline(gpt, trinity, micro_batches=2)  # one device per stage: nothing to shard
    assert all(cfg.zero == 0 for cfg in plans.fsdp(gpt, stages).configs.values())
    grouped = plans.fsdp(gpt, plans.pipeline(gpt, trinity, 2, data_parallel=2, micro_batches=2))
    grouped.validate(gpt, trinity)
    assert {n for n, c in grouped.configs.items() if c.zero == 3} == {o.name for o in gpt.ops if o.param_bytes > 0}


@pytest.mark.parametrize("stage", [4, -1, True, 1.5, "1"])
def test_zero_refuses_a_bad_stage(stage: object, gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=rf"ZeRO stage {stage!r}; expected one of \[0, 1, 2, 3\]"):
        plans.zero(gpt, plans.data_parallel(gpt, trinity), stage)  # type: ignore[arg-type]


def test_recompute_every_op_or_some_types(tmp_path, gpt, trinity) -> None:  # type: ignore[no-untyped-def]
    base = plans.pipeline(gpt, trinity, 2, data_parallel=2, micro_batches=2)
    everything = plans.recompute(gpt, base)
    assert all(cfg.recompute for cfg in everything.configs.values()) and everything.metadata["recompute"] == "all"
    attention = plans.recompute(gpt, base, {"attention"})
    chosen = {name for name, cfg in attention.configs.items() if cfg.recompute}
    assert chosen == {op.name for op in gpt.ops if op.op_type == "attention"} and len(chosen) == 4
    assert plans.recompute(gpt, base, "attention") == attention  # a string is one type
    assert all(attention[n].replace(recompute=False) == base[n] for n in base.configs)
    assert plans.recompute(gpt, base, ["conv2d"]).configs == base.configs  # a type the graph lacks: no change
    combined = plans.zero(gpt, plans.recompute(gpt, base, {"attention", "linear"}), 2)
    combined.validate(gpt, trinity)
    combined.to_json(tmp_path / "p.json")
    assert Plan.from_json(tmp_path / "p.json") == combined
    with pytest.raises(UnknownNameError, match="unknown op type \\(recompute\\) 'attn'"):
        plans.recompute(gpt, base, {"attn"})
    with pytest.raises(ValueError, match="op_types is empty"):
        plans.recompute(gpt, base, set())
