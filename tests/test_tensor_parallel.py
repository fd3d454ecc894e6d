"""Tensor parallelism as Megatron-LM does it: column-parallel then row-parallel layers, heads split by
head, one all-reduce of partial sums per block and direction."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan, single_device
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import TASK_KINDS
from placement_rl.sim.simulator import simulate
from placement_rl.topology import load_preset

T = 4
HIDDEN, HEADS, SEQ, BATCH, LAYERS = 256, 8, 64, 4, 2


@pytest.fixture(scope="module")
def gpt(zoo_graph) -> OpGraph:  # type: ignore[no-untyped-def]
    return zoo_graph(
        "gpt", batch_size=BATCH, num_layers=LAYERS, hidden=HIDDEN, heads=HEADS, seq_len=SEQ, vocab_size=512
    )


def _head_dim(graph: OpGraph, name: str) -> str | None:
    """The dimension of a view between the qkv projection and the output projection that is the heads
    axis (or the hidden axis, heads times head size, of the last reshape)."""
    op = graph.op(name)
    for d in op.parallel_dims:
        if d.kind == "attribute" and d.size in (HEADS, HIDDEN) and d.axis >= 1:
            if d.size == HEADS or (op.op_type == "reshape" and len(op.output_shapes[0]) == 3):
                return d.name
    return None


def megatron_tp(graph: OpGraph, devices: list[str]) -> Plan:
    """Megatron's tensor parallelism over ``devices`` by hand: every other op replicated."""
    configs: dict[str, OpConfig] = {}
    inside = False  # between a column-parallel projection and its row-parallel partner
    for op in graph.ops:
        name, t = op.name, len(devices)
        if op.op_type == "linear" and name.endswith(("qkv", "fc")):
            configs[name], inside = OpConfig.make(devices, {"channel": t}), True
        elif op.op_type == "linear" and name.endswith(("proj", "out")):
            configs[name], inside = OpConfig.make(devices, {"in_channel": t}), False
        elif inside and op.op_type == "attention":
            configs[name] = OpConfig.make(devices, {"heads": t})
        elif inside and op.op_type == "gelu":
            configs[name] = OpConfig.make(devices, {"channel": t})
        elif inside and (dim := _head_dim(graph, name)) is not None:
            configs[name] = OpConfig.make(devices, {dim: t})
        else:
            configs[name] = OpConfig.make(devices, sync="duplicate")
    return Plan(graph.name, configs, name="megatron-tp")


def test_megatron_blocks_need_no_transfer_only_one_all_reduce_per_block_and_direction(gpt: OpGraph) -> None:
    topo = load_preset("h100-2x8")
    devices = [d.name for d in topo.devices][:T]
    result = simulate(gpt, topo, megatron_tp(gpt, devices))
    kinds = result.tasks.kind
    assert not np.isin(kinds, [TASK_KINDS.index("transfer"), TASK_KINDS.index("gradient_transfer")]).any()
    partial = kinds == TASK_KINDS.index("partial_all_reduce")
    # attention and MLP, forward (row-parallel output) and backward (column-parallel input gradient)
    assert partial.sum() == LAYERS * 2 * 2
    # each sums one (batch, seq, hidden) activation; a ring over T devices moves 2 (T - 1) of it
    activation = BATCH * SEQ * HIDDEN * 4
    assert result.tasks.num_bytes[partial] == pytest.approx(2 * (T - 1) * activation)
    names = {result.op_names[o] for o in result.tasks.op[partial]}
    assert names == {f"blocks_{k}_{p}" for k in range(LAYERS) for p in ("attention_proj", "mlp_out",
                                                                          "attention_qkv", "mlp_fc")}  # fmt: skip


def test_tensor_parallel_layers_divide_the_block_compute(gpt: OpGraph) -> None:
    topo = load_preset("h100-2x8")
    devices = [d.name for d in topo.devices][:T]
    flat = CostModel(calibration=None)  # the roofline: time proportional to the work, no kernel floor
    tp = simulate(gpt, topo, megatron_tp(gpt, devices), flat)
    one = simulate(gpt, topo, single_device(gpt, topo, devices[0]), flat)
    linear = [i for i, op in enumerate(gpt.ops) if op.op_type in ("linear", "attention") and op.name != "lm_head"]

    def seconds(result, device: int) -> float:  # type: ignore[no-untyped-def]
        compute = np.isin(result.tasks.kind, [TASK_KINDS.index("forward"), TASK_KINDS.index("backward")])
        pick = compute & np.isin(result.tasks.op, linear) & (result.tasks.lane == device)
        return float((result.tasks.end_s[pick] - result.tasks.start_s[pick]).sum())

    # each of the T devices does a T-th of every block's products and of attention
    assert seconds(tp, 0) == pytest.approx(seconds(one, 0) / T, rel=1e-9)
    assert tp.peak_memory_bytes[0] < one.peak_memory_bytes[0]


def test_a_row_parallel_layer_reads_only_its_slice_of_the_input_features(gpt: OpGraph) -> None:
    proj = gpt.op("blocks_0_attention_proj")
    (features,) = [d for d in proj.parallel_dims if d.name == "in_channel"]
    assert features.reduction and features.kind == "parameter" and features.size == HIDDEN
    (heads,) = [d for d in gpt.ops if d.op_type == "attention"][0].parallel_dims[1:]
    assert heads.name == "heads" and heads.size == HEADS
    # the view between the heads and the projection follows the heads axis
    into_reshape = [t for t in gpt.tensors if t.dst == "reshape_1"]
    assert into_reshape and into_reshape[0].dst_axes[:3] == (0, 1, 2)


def test_duplicate_replicas_of_batch_slices_all_reduce_once_per_replica() -> None:
    """Megatron's LayerNorm under data and tensor parallelism: identical on the tensor-parallel ranks of
    a slice, all-reduced over the data-parallel ranks: one all-reduce per tensor-parallel rank."""
    from placement_rl.graph import Op, ParallelDim

    norm = Op("norm", "layer_norm", ((8, 16),), forward_flops=1e6, backward_flops=2e6, param_bytes=2**20,
              param_key="norm", parallel_dims=(ParallelDim("sample", "sample", 0, 8),))  # fmt: skip
    g = OpGraph("one", [norm], [])
    topo = load_preset("h100-2x8")
    names = [d.name for d in topo.devices][:4]
    # two batch slices (data parallel), two replicas each (tensor-parallel ranks): devices d * 2 + r
    plan = Plan("one", {"norm": OpConfig.make(names, {"sample": 2}, "duplicate")})
    result = simulate(g, topo, plan, CostModel(calibration=None, bucket_bytes=0))
    ar = result.tasks.kind == TASK_KINDS.index("all_reduce")
    assert ar.sum() == 2  # ranks (0, 2) and (1, 3)
    # a ring over two devices moves 2 (n - 1) = 2 times the gradient
    assert result.tasks.num_bytes[ar] == pytest.approx([2 * 2**20] * 2)
