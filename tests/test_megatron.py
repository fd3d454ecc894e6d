"""Megatron-LM's 3D parallelism: tensor-parallel regions found from the graph alone, the device layout
(TP fastest inside a machine, then DP, then PP), stages cut between layers, recomputation policies, the
refusals, and the ``megatron`` / ``zero`` methods.

Small GPT and Llama zoo graphs on two machines of four H100s (``h100-2x4``: the ``h100-2x8`` preset's
build with four GPUs per machine).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from placement_rl.graph import OpGraph, ParallelDim
from placement_rl.methods import compare_methods, get_method, megatron_candidates
from placement_rl.plan import (
    Plan,
    data_parallel,
    megatron,
    pipeline_stages,
    single_device,
    tensor_parallel_regions,
    zero,
)
from placement_rl.sim import SimResult, simulate
from placement_rl.sim.result import TASK_KINDS
from placement_rl.topology import DeviceTopology
from placement_rl.topology.builder import TopologyBuilder
from placement_rl.topology.presets import gbit_to_bytes_per_s

GPT = {"batch_size": 8, "num_layers": 4, "hidden": 256, "heads": 8, "seq_len": 64, "vocab_size": 512}
LLAMA = {**GPT, "kv_heads": 4, "intermediate": 512}
LAYERS = 4


@pytest.fixture(scope="module")
def cluster() -> DeviceTopology:
    """2 machines x 4 H100-SXM5-80GB: NVSwitch inside a machine, a 400 Gb/s NIC per GPU between them."""
    b = TopologyBuilder()
    ib = b.switch("ib-switch")
    for _ in range(2):
        machine, gpus = b.machine("H100-SXM5-80GB", 4)
        b.star(b.switch(f"{machine}/nvswitch"), gpus, 450e9, "nvswitch")
        b.star(ib, gpus, gbit_to_bytes_per_s(400), "infiniband")
    return b.build("h100-2x4")


@pytest.fixture(scope="module")
def gpt(zoo_graph: Callable[..., OpGraph]) -> OpGraph:
    return zoo_graph("gpt", **GPT)


@pytest.fixture(scope="module")
def llama(zoo_graph: Callable[..., OpGraph]) -> OpGraph:
    return zoo_graph("llama", **LLAMA)


def _kinds(result: SimResult) -> Counter[str]:
    return Counter(TASK_KINDS[k] for k in result.tasks.kind.tolist())


def _split_counts(graph: OpGraph, plan: Plan, tp: int) -> Counter[str]:
    """How many ops split ``tp`` ways, by the dimension (``channel``, ``in_channel``, ``heads``, ``dim<a>``)."""
    counts: Counter[str] = Counter()
    for op in graph.ops:
        counts.update(name for name, degree in plan[op.name].degrees if degree == tp and name != "sample")
    return counts


def _linears(graph: OpGraph) -> set[str]:
    return {op.name for op in graph.ops if op.op_type == "linear" and op.param_bytes > 0}


def _with_copy_axes(graph: OpGraph) -> OpGraph:
    """``graph`` with its slices and concatenations given attribute dimensions on the axes they keep
    whole (as the importer gives a chunk): what Llama's rotate-half needs for its heads to be split."""
    ops = []
    for i, op in enumerate(graph.ops):
        if op.op_type in ("slice", "cat") and graph.in_tensors[i]:
            shape = graph.tensors[graph.in_tensors[i][0]].shape
            out = op.output_shapes[0]
            taken = {d.axis for d in op.parallel_dims}
            if len(shape) == len(out):
                extra = tuple(
                    ParallelDim(f"dim{a}", "attribute", a, n)
                    for a, n in enumerate(out)
                    if a not in taken and n == shape[a] and n > 1
                )
                op = dataclasses.replace(op, parallel_dims=op.parallel_dims + extra)
        ops.append(op)
    return OpGraph(graph.name, ops, graph.tensors, graph.batch_size, graph.metadata)


# ---------------------------------------------------------------------------------------------- regions
def test_gpt_regions_are_each_blocks_attention_and_mlp(gpt: OpGraph) -> None:
    regions = tensor_parallel_regions(gpt, 4)
    assert len(regions) == 2 * LAYERS
    # every linear layer with its own parameters is in a region (the tied LM head feeds the loss: not)
    assert {n for r in regions for n in (*r.column, *r.row)} == _linears(gpt)
    attention = [r for r in regions if any(dim == "heads" for _, dim in r.splits)]
    mlp = [r for r in regions if r not in attention]
    assert len(attention) == len(mlp) == LAYERS
    for region in regions:
        assert len(region.column) == len(region.row) == 1
        assert dict(region.splits)[region.column[0]] == "channel"
        assert dict(region.splits)[region.row[0]] == "in_channel"
    for region in attention:  # qkv, reshape, transpose, chunk, attention, transpose, reshape, proj
        types = [gpt.op(name).op_type for name in region.ops]
        assert types == ["linear", "reshape", "transpose", "chunk", "attention", "transpose", "reshape", "linear"]
    assert all([gpt.op(n).op_type for n in r.ops] == ["linear", "gelu", "linear"] for r in mlp)
    assert tensor_parallel_regions(gpt, 3) == []  # 3 divides no head count nor width


def test_llama_swiglu_regions(llama: OpGraph) -> None:
    """The SwiGLU: gate and up column-parallel, their silu and product split, down row-parallel."""
    regions = [r for r in tensor_parallel_regions(llama, 4) if len(r.column) == 2]
    assert len(regions) == LAYERS
    for region in regions:
        assert Counter(llama.op(n).op_type for n in region.ops) == {"linear": 3, "silu": 1, "mul": 1}
        assert len(region.row) == 1 and llama.op(region.row[0]).output_shapes[0][-1] == LLAMA["hidden"]


def test_llama_attention_regions_through_rotary_embedding(llama: OpGraph, cluster: DeviceTopology) -> None:
    """With its slices and concatenations splittable along the heads, Llama's attention is one region:
    q, k, v column-parallel through the views and the rotary ops (the cos / sin tables read whole),
    grouped-query attention on its heads, o_proj row-parallel; no transfers at tp=4, dp=2."""
    graph = _with_copy_axes(llama)
    regions = tensor_parallel_regions(graph, 4)
    assert len(regions) == 2 * LAYERS
    assert {n for r in regions for n in (*r.column, *r.row)} == _linears(graph) - {"lm_head"}
    attention = [r for r in regions if len(r.column) == 3]
    assert len(attention) == LAYERS
    for region in attention:
        types = Counter(graph.op(n).op_type for n in region.ops)
        assert types["attention"] == 1 and types["neg"] == 2 and types["cat"] == 2 and types["linear"] == 4
    # 8 heads over 4 key/value heads: tp = 8 splits the queries but not the keys: only the MLPs remain
    assert all(len(r.column) == 2 for r in tensor_parallel_regions(graph, 8))
    plan = megatron(graph, cluster, tp=4, dp=2)
    kinds = _kinds(simulate(graph, cluster, plan))
    assert kinds["transfer"] == 0 and kinds["partial_all_reduce"] > 0


def test_llama_attention_regions_on_the_imported_graph(llama: OpGraph) -> None:
    assert {n for r in tensor_parallel_regions(llama, 4) for n in (*r.column, *r.row)} == _linears(llama) - {"lm_head"}


# ------------------------------------------------------------------------------------- plans and layout
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_tp4_dp2_has_no_transfers(model: str, request: pytest.FixtureRequest, cluster: DeviceTopology) -> None:
    graph: OpGraph = request.getfixturevalue(model)
    plan = megatron(graph, cluster, tp=4, dp=2)
    plan.validate(graph, cluster)
    assert plan.name == "megatron" and plan.metadata["tp"] == 4 and plan.metadata["dp"] == 2
    counts = _split_counts(graph, plan, 4)
    assert plan.metadata["tp_ops"] == sum(counts.values())
    if model == "gpt":  # qkv, fc and gelu on channel; proj and out on in_channel; attention on heads
        assert counts["channel"] == 3 * LAYERS and counts["in_channel"] == 2 * LAYERS and counts["heads"] == LAYERS
    else:  # o_proj and down on in_channel, grouped-query attention on its heads
        assert counts["in_channel"] == 2 * LAYERS and counts["heads"] == LAYERS
        assert counts["channel"] >= 7 * LAYERS  # q, k, v, gate, up, the silu and the product at least
    kinds = _kinds(simulate(graph, cluster, plan))
    assert kinds["transfer"] == 0 and kinds["gradient_transfer"] == 0
    assert kinds["partial_all_reduce"] > 0 and kinds["all_reduce"] > 0


def test_device_layout_is_tp_fastest_then_dp_then_pp(gpt: OpGraph, cluster: DeviceTopology) -> None:
    names = [d.name for d in cluster.devices]
    plan = megatron(gpt, cluster, tp=2, dp=2, pp=2, micro_batches=4)
    stages = pipeline_stages(gpt, plan)
    assert [list(s.devices) for s in stages] == [sorted(names[:4]), sorted(names[4:])]
    qkv = next(op.name for op in gpt.ops if op.op_type == "linear")
    cfg = plan[qkv]  # partition (sample d, channel r) is task 2d + r, on device d * tp + r of the stage
    assert cfg.degree_map == {"sample": 2, "channel": 2} and list(cfg.devices) == names[:4]
    norm = gpt.ops[gpt.index(qkv) - 1]  # replicated on the TP group: partition d, replica r on d * tp + r
    assert plan[norm.name].degree_map == {"sample": 2} and list(plan[norm.name].devices) == names[:4]
    # the norm is replicated on the tensor-parallel ranks (duplicate), its batch slices all-reduced
    assert plan[norm.name].sync == "duplicate" and plan[qkv].sync == "all_reduce"
    tp_only = megatron(gpt, cluster, tp=4)
    assert tp_only.metadata["devices"] == names[:4]
    assert tp_only[norm.name].sync == "duplicate" and tp_only[norm.name].degrees == ()


def test_stages_are_cut_between_layers(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=2, pp=4, micro_batches=8)
    stages = pipeline_stages(gpt, plan)
    assert len(stages) == 4 and sum(plan.metadata["chunk_ops"]) == gpt.num_ops
    for stage in stages[1:]:  # each stage begins with a layer: its first op is the layer's norm
        assert gpt.ops[stage.ops[0]].op_type == "layer_norm"
    stage_of = {gpt.ops[i].name: k for k, stage in enumerate(stages) for i in stage.ops}
    for region in tensor_parallel_regions(gpt, 2):
        assert len({stage_of[name] for name in region.ops}) == 1
    work = gpt.arrays.forward_flops + gpt.arrays.backward_flops
    shares = np.array([work[list(s.ops)].sum() for s in stages]) / work.sum()
    assert shares.max() < 0.4  # balanced: 4 layers and the LM head over 4 stages


def test_interleaved_deals_chunks_to_stage_groups(gpt: OpGraph, cluster: DeviceTopology) -> None:
    names = [d.name for d in cluster.devices]
    plan = megatron(gpt, cluster, tp=2, dp=2, pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    plan.validate(gpt, cluster)
    stages = pipeline_stages(gpt, plan)
    assert len(stages) == 4 and len(plan.metadata["chunk_ops"]) == 4
    assert [list(s.devices) for s in stages] == [sorted(names[:4]), sorted(names[4:])] * 2
    result = simulate(gpt, cluster, plan)
    assert result.makespan_s > 0 and not result.oom


def test_pipelined_stages_send_only_between_stages(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=2, dp=2, pp=2, micro_batches=4)
    stage_of = {gpt.ops[i].name: k for k, stage in enumerate(pipeline_stages(gpt, plan)) for i in stage.ops}
    result = simulate(gpt, cluster, plan)
    transfer = TASK_KINDS.index("transfer")
    senders = {result.op_names[i] for i in result.tasks.op[result.tasks.kind == transfer].tolist()}
    boundary = {t.src for t in gpt.tensors if stage_of[t.src] != stage_of[t.dst]}
    boundary |= {t.dst for t in gpt.tensors if stage_of[t.src] != stage_of[t.dst]}
    assert senders <= boundary


@pytest.mark.slow
def test_tensor_parallelism_beats_one_device(zoo_graph: Callable[..., OpGraph], cluster: DeviceTopology) -> None:
    """A GPT wide enough for its matrix products to dominate: tp=4 inside one machine runs faster than
    one GPU, and tp=4 x dp=2 faster still."""
    graph = zoo_graph("gpt", batch_size=8, num_layers=2, hidden=1024, heads=16, seq_len=512, vocab_size=1024)
    one = simulate(graph, cluster, single_device(graph, cluster)).makespan_s
    tp4 = simulate(graph, cluster, megatron(graph, cluster, tp=4)).makespan_s
    tp4_dp2 = simulate(graph, cluster, megatron(graph, cluster, tp=4, dp=2)).makespan_s
    assert tp4 < 0.6 * one and tp4_dp2 < tp4
    assert simulate(graph, cluster, data_parallel(graph, cluster)).makespan_s < one


# -------------------------------------------------------------------------------------- recomputation
def test_full_recomputation_keeps_layer_inputs(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=2, dp=2, pp=2, micro_batches=4, recompute="full")
    kept = {op.name for op in gpt.ops if not plan[op.name].recompute}
    adds = {op.name for op in gpt.ops if op.op_type == "add"}  # the embeddings' sum and the residual adds
    inputs = {op.name for i, op in enumerate(gpt.ops) if not gpt.predecessors[i]}
    stage_of = {gpt.ops[i].name: k for k, stage in enumerate(pipeline_stages(gpt, plan)) for i in stage.ops}
    sent = {t.src for t in gpt.tensors if stage_of[t.src] != stage_of[t.dst]}
    assert sent <= adds | inputs and kept == adds | inputs
    assert plan.metadata["recompute"] == "full"
    without = simulate(gpt, cluster, megatron(gpt, cluster, tp=2, dp=2, pp=2, micro_batches=4))
    assert simulate(gpt, cluster, plan).peak_memory_bytes.max() < without.peak_memory_bytes.max()


def test_selective_and_typed_recomputation(gpt: OpGraph, cluster: DeviceTopology) -> None:
    selective = megatron(gpt, cluster, tp=2, recompute="selective")
    on = Counter(op.op_type for op in gpt.ops if selective[op.name].recompute)
    assert on == {"attention": LAYERS, "reshape": 2 * LAYERS, "transpose": 2 * LAYERS, "chunk": LAYERS}
    typed = megatron(gpt, cluster, tp=2, recompute={"attention", "gelu"})
    assert {op.op_type for op in gpt.ops if typed[op.name].recompute} == {"attention", "gelu"}
    assert typed.metadata["recompute"] == ["attention", "gelu"]


def test_distributed_optimizer_shards_over_data_parallel_replicas(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=2, dp=4, zero_stage=1)
    with_params = {op.name for op in gpt.ops if op.param_bytes > 0}
    assert {op.name for op in gpt.ops if plan[op.name].zero == 1} == with_params
    assert plan.metadata["zero"] == 1
    plain = megatron(gpt, cluster, tp=2, dp=4)
    assert simulate(gpt, cluster, plan).peak_memory_bytes.max() < simulate(gpt, cluster, plain).peak_memory_bytes.max()
    # without data parallelism no shard has replicas to share its optimizer state with
    assert not any(cfg.zero for cfg in megatron(gpt, cluster, tp=4, zero_stage=1).configs.values())


# -------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 0}, "tp = 0; expected a positive integer"),
        ({"pp": -1}, "pp = -1; expected a positive integer"),
        ({"dp": True}, "dp = True; expected a positive integer"),
        ({"tp": 2, "pp": 2, "dp": 4}, "= 16 devices; topology 'h100-2x4' has 8; expected a product of at most 8"),
        ({"tp": 2, "devices": ["m0/gpu0"]}, "but 1 device(s) are given; expected the product to equal"),
        ({"tp": 8}, "tp = 8 exceeds the 4 GPUs per machine of topology 'h100-2x4'"),
        ({"tp": 2, "devices": ["m0/gpu3", "m1/gpu0"]}, "spans machines ['m0', 'm1']"),
        ({"tp": 3}, "tp = 3 splits no tensor-parallel region of graph 'gpt': "),
        ({"tp": 2, "micro_batches": 3}, "micro_batches * dp = 3 * 1 = 3 does not divide the batch of 8"),
        ({"pp": 2, "virtual_stages": 2}, "virtual stages need schedule 'interleaved' and pp >= 2"),
        ({"schedule": "zigzag"}, "schedule 'zigzag'; expected one of"),
        ({"recompute": "some"}, "recompute = 'some'; expected None, one of ['full', 'selective']"),
        ({"recompute": ["nope"]}, "unknown op type (recompute) 'nope'"),
        ({"zero_stage": 4}, "zero_stage = 4; expected one of [0, 1, 2, 3]"),
    ],
)
def test_bad_arguments_are_refused(
    gpt: OpGraph, cluster: DeviceTopology, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        megatron(gpt, cluster, **kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_a_degree_splitting_nothing_names_those_that_do(gpt: OpGraph, cluster: DeviceTopology) -> None:
    with pytest.raises(ValueError, match=r"expected tp = 1 or one of \[2, 4\]"):
        megatron(gpt, cluster, tp=3)


# ---------------------------------------------------------------------------------------------- methods
@pytest.mark.slow
def test_megatron_method_picks_a_fitting_plan(gpt: OpGraph, cluster: DeviceTopology) -> None:
    candidates = megatron_candidates(gpt, cluster)
    assert candidates and all(c["tp"] * c["pp"] * c["dp"] == 8 for c in candidates)
    assert all(c["tp"] in (1, 2, 4) and 8 % c["dp"] == 0 for c in candidates)
    assert all(c["micro_batches"] >= min(4 * c["pp"], 8 // c["dp"]) for c in candidates if c["pp"] > 1)
    assert [c["pp"] for c in candidates] == sorted(c["pp"] for c in candidates)
    rows = compare_methods(gpt, cluster, ["megatron", "zero"])
    megatron_row, zero_row = rows
    assert not megatron_row.oom and not zero_row.oom and megatron_row.note == ""
    meta = megatron_row.plan.metadata
    assert meta["candidates"] >= len(candidates) and meta["tp"] * meta["pp"] * meta["dp"] == 8
    megatron_row.plan.validate(gpt, cluster)
    tried = []
    for c in candidates:
        plan = megatron(gpt, cluster, tp=c["tp"], pp=c["pp"], dp=c["dp"], micro_batches=c["micro_batches"])
        tried.append(simulate(gpt, cluster, zero(gpt, plan, 1) if c["dp"] > 1 else plan).makespan_s)
    assert megatron_row.makespan_s == pytest.approx(min(tried))
    assert meta["zero"] == (1 if meta["dp"] > 1 else 0)
    assert zero_row.plan.name == "zero" and zero_row.plan.metadata["zero"] == 1
    assert {op.name for op in gpt.ops if zero_row.plan[op.name].zero == 1} == {
        op.name for op in gpt.ops if op.param_bytes > 0
    }


def test_megatron_method_options(gpt: OpGraph, cluster: DeviceTopology) -> None:
    [row] = compare_methods(gpt, cluster, ["megatron"], options={"megatron": {"tp": 4, "pp": 1}})
    assert (row.plan.metadata["tp"], row.plan.metadata["pp"], row.plan.metadata["dp"]) == (4, 1, 2)
    check = get_method("megatron").check
    assert check is not None
    with pytest.raises(ValueError, match="max_candidates = 0"):
        check({"max_candidates": 0}, None, None)
    with pytest.raises(ValueError, match="no candidate with {'tp': 3}"):
        check({"tp": 3}, gpt, cluster)
