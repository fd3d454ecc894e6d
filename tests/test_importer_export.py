"""The torch.export front end: module-level ops from ATen nodes, FLOPs from torch's flop registry."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from placement_rl import zoo
from placement_rl.graph import OpGraph
from placement_rl.graph.aten import ExportError, from_export
from placement_rl.graph.importer import from_torch


def measured_flops(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[int, int]:
    """``FlopCounterMode``'s forward and backward totals (parameters need gradients, inputs do not)."""
    for p in module.parameters():
        p.requires_grad_(True)
    with FlopCounterMode(display=False) as forward:
        out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    return forward.get_total_flops(), backward.get_total_flops()


def flops(graph: OpGraph) -> tuple[float, float]:
    return sum(op.forward_flops for op in graph.ops), sum(op.backward_flops for op in graph.ops)


class Mixed(nn.Module):
    """The formulas the fx importer had wrong or crashed on: einsum, addmm, ConvTranspose2d, sdpa(x, x, x),
    nn.MultiheadAttention(x, x, x)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 8, kernel_size=3, stride=2)
        self.w = nn.Parameter(torch.empty(8, 16))
        self.b = nn.Parameter(torch.empty(16))
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.up(images)  # (B, 8, 11, 11)
        x = x.flatten(2).transpose(1, 2)  # (B, 121, 8)
        x = torch.einsum("bsc,cd->bsd", x, self.w)  # (B, 121, 16)
        x = torch.addmm(self.b, x.reshape(-1, 16), torch.eye(16, device=x.device)).reshape(x.shape)
        heads = x.reshape(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)
        x = x + F.scaled_dot_product_attention(heads, heads, heads).transpose(1, 2).reshape(x.shape)
        return self.mha(x, x, x)[0]


def test_flops_equal_flop_counter_forward_and_backward() -> None:
    with torch.device("meta"):
        module = Mixed()
    images = torch.empty(2, 4, 5, 5, device="meta")
    graph = from_export(module, (images,))
    fwd, bwd = measured_flops(module, (images,))
    assert flops(graph) == (fwd, bwd)
    types = {op.op_type for op in graph.ops}
    assert {"conv_transpose2d", "einsum", "addmm", "attention", "multihead_attention"} <= types
    (mha,) = [op for op in graph.ops if op.op_type == "multihead_attention"]
    assert mha.param_bytes == (3 * 16 * 16 + 3 * 16 + 16 * 16 + 16) * 4
    assert graph.metadata["source"] == "torch.export" and graph.metadata["unknown_aten_ops"] == []


def test_sample_axes_follow_the_batch_through_reshapes() -> None:
    class Folded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x).reshape(-1, 5)  # (B * S, 5)

    graph = from_export(Folded(), (torch.empty(3, 7, 8),))
    by_type = {op.op_type: op for op in graph.ops}
    assert by_type["linear"].output_shapes == ((3, 7, 5),)
    assert by_type["reshape"].output_shapes == ((21, 5),)
    assert [d.axis for d in by_type["reshape"].parallel_dims if d.kind == "sample"] == [0]
    assert [d.name for d in by_type["linear"].parallel_dims] == ["sample", "length", "channel", "in_channel"]


def test_zoo_model_same_ops_and_parameters_as_fx() -> None:
    module, inputs = zoo.build_module("lenet", batch_size=4)
    fx_graph = zoo.load("lenet", batch_size=4)
    graph = from_export(module, inputs)
    assert [op.op_type for op in graph.ops] == [op.op_type for op in fx_graph.ops]
    assert graph.param_bytes == fx_graph.param_bytes
    assert flops(graph) == measured_flops(*zoo.build_module("lenet", batch_size=4))


def test_export_failure_names_the_line_and_the_fallback() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x  # control flow on data: neither export nor fx traces it

    with pytest.raises(ExportError, match=r"could not trace Branchy.*test_importer_export.py:\d+") as info:
        from_torch(Branchy(), (torch.zeros(2, 2),), tracer="export")
    assert "fx fallback was not tried" in str(info.value)
    with pytest.raises(ValueError, match="fx fallback was tried and failed too"):
        from_torch(Branchy(), (torch.zeros(2, 2),))


def test_bad_tracer_name() -> None:
    with pytest.raises(ValueError, match="tracer = 'jit'"):
        from_torch(nn.Linear(2, 2), (torch.zeros(1, 2),), tracer="jit")


def test_transformer_encoder_as_the_top_level_module() -> None:
    # fx could not trace nn.TransformerEncoder itself; export opens it into its layers.
    with torch.device("meta"):
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), num_layers=2)
    x = torch.empty(2, 8, 32, device="meta")
    graph = from_torch(encoder, (x,))
    assert graph.metadata["source"] == "torch.export"
    assert sum(op.op_type == "multihead_attention" for op in graph.ops) == 2
    assert flops(graph) == measured_flops(encoder, (x,))


def test_unrolled_cell_has_the_ops_fx_sees() -> None:
    class Unrolled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.LSTMCell(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = c = x.new_zeros(x.shape[0], 4)
            for t in range(3):
                h, c = self.cell(x[:, t], (h, c))  # x[:, t]: one slice op, as under fx
            return h

    x = torch.empty(2, 3, 3, device="meta")
    graph = from_export(Unrolled(), (x,))
    fx_graph = from_torch(Unrolled(), (x,), tracer="fx")
    assert sorted(op.op_type for op in graph.ops) == sorted(op.op_type for op in fx_graph.ops)
    cells = [op for op in graph.ops if op.op_type == "lstm_cell"]
    assert len(cells) == 3 and {op.param_key for op in cells} == {"cell"}
    # every call of the layer carries its parameters under one key; the graph counts them once
    assert {op.param_bytes for op in cells} == {(4 * 4 * (3 + 4) + 2 * 4 * 4) * 4} == {graph.param_bytes}


#: Fewer unrolled steps and layers than the defaults: the same op types, a tenth of the tracing.
_SHRUNK = {"steps": 3, "num_layers": 2}


@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_imports_through_export(name: str) -> None:
    # Same parameters and ops as the fx importer the zoo uses, but for the constant ops: export makes
    # one per buffer a tensor function reads, fx one per access.
    options = {k: min(v, zoo.spec(name).options[k]) for k, v in _SHRUNK.items() if k in zoo.spec(name).options}
    module, inputs = zoo.build_module(name, batch_size=2, **options)
    graph = from_export(module, inputs)
    fx_graph = zoo.load(name, batch_size=2, **options)
    assert graph.param_bytes == fx_graph.param_bytes
    types = sorted(op.op_type for op in graph.ops if op.op_type != "constant")
    assert types == sorted(op.op_type for op in fx_graph.ops if op.op_type != "constant")
