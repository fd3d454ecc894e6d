"""from_torch: FLOP formulas checked by hand, shapes, sample dims, parameters, warnings."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.graph import importer

# These tests check the fx front end's hand formulas; tests/test_importer_export.py checks export's.
from_torch = functools.partial(importer.from_torch, tracer="fx")


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_linear_flops_by_hand() -> None:
    # y = x W^T + b with x (32, 100), W (50, 100): 2*32*100*50 multiply-adds + 32*50 bias adds.
    g = from_torch(nn.Linear(100, 50), (_meta(32, 100),))
    (lin,) = [op for op in g.ops if op.op_type == "linear"]
    assert lin.forward_flops == 2 * 32 * 100 * 50 + 32 * 50 == 321_600
    assert lin.backward_flops == 2 * lin.forward_flops
    assert lin.param_bytes == (100 * 50 + 50) * 4
    assert lin.output_shapes == ((32, 50),)
    assert [(d.name, d.kind, d.axis, d.reduction) for d in lin.parallel_dims] == [
        ("sample", "sample", 0, False),
        ("channel", "parameter", 1, False),
        ("in_channel", "parameter", 1, True),  # the input features: row-parallel, partial sums
    ]


def test_conv2d_flops_by_hand() -> None:
    # 3->16 channels, 3x3 kernel, padding 1, on 8 images of 32x32: output (8, 16, 32, 32).
    conv = nn.Conv2d(3, 16, kernel_size=3, padding=1)
    g = from_torch(conv, (_meta(8, 3, 32, 32),))
    (op,) = [op for op in g.ops if op.op_type == "conv2d"]
    out_numel = 8 * 16 * 32 * 32
    assert op.forward_flops == 2 * out_numel * 3 * 9 + out_numel == 7_208_960
    assert {d.name: d.kind for d in op.parallel_dims} == {
        "sample": "sample",
        "channel": "parameter",
        "height": "attribute",
        "width": "attribute",
    }
    grouped = from_torch(nn.Conv2d(16, 16, 3, groups=4, bias=False), (_meta(2, 16, 10, 10),))
    (gop,) = [op for op in grouped.ops if op.op_type == "conv2d"]
    assert gop.forward_flops == 2 * (2 * 16 * 8 * 8) * 4 * 9


def test_lstm_step_flops_by_hand() -> None:
    # N=2, I=3, H=4: gate matmuls 2*N*4H*(I+H) = 448, two bias adds 2*N*4H = 64,
    # gate activations 4*N*H = 32, c' = f*c + i*g 3*N*H = 24, h' = o*tanh(c') 2*N*H = 16.
    g = from_torch(nn.LSTMCell(3, 4), (_meta(2, 3),))
    (cell,) = [op for op in g.ops if op.op_type == "lstm_cell"]
    assert cell.forward_flops == 448 + 64 + 32 + 24 + 16 == 584
    assert cell.output_shapes == ((2, 4), (2, 4))
    full = from_torch(nn.LSTM(3, 4, num_layers=2, batch_first=True), (_meta(2, 5, 3),))
    (lstm,) = [op for op in full.ops if op.op_type == "lstm"]
    second_layer = 2 * 2 * 16 * (4 + 4) + 17 * 2 * 4
    assert lstm.forward_flops == 5 * (584 + second_layer)


def test_attention_flops_by_hand() -> None:
    class Sdpa(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(q, k, v)

    # B=2, H=3, L=5, S=7, E=4: scores 2*3*5*7 = 210; q k^T and p v 2*210*4 each; softmax 5*210.
    g = from_torch(Sdpa(), (_meta(2, 3, 5, 4), _meta(2, 3, 7, 4), _meta(2, 3, 7, 4)))
    (att,) = [op for op in g.ops if op.op_type == "attention"]
    assert att.forward_flops == 1680 + 1680 + 1050
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    g = from_torch(mha, (_meta(3, 5, 8), _meta(3, 5, 8), _meta(3, 5, 8)))
    (op,) = [op for op in g.ops if op.op_type == "multihead_attention"]
    # 4 projections of 15 tokens: 4*2*8*8*15 = 7680; scores 3*2*5*5 = 150: 4*150*4 + 5*150 = 3150.
    assert op.forward_flops == 7680 + 3150
    assert op.param_bytes == sum(p.numel() for p in mha.parameters()) * 4


class _Unrolled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.cell = nn.LSTMCell(8, 16)
        self.out = nn.Linear(16, 50)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        h = x.new_zeros(x.shape[0], 16)
        c = torch.zeros_like(h)
        for t in range(3):
            h, c = self.cell(x[:, t], (h, c))
        return self.loss(self.out(h), target)


def test_unrolled_cell_shares_parameters_and_multi_output_edges() -> None:
    m = _Unrolled()
    g = from_torch(m, (_meta(6, 3, dtype=torch.long), _meta(6, dtype=torch.long)), name="unrolled")
    cells = [op for op in g.ops if op.op_type == "lstm_cell"]
    assert len(cells) == 3 and {c.param_key for c in cells} == {"cell"}
    assert g.param_bytes == sum(p.numel() * 4 for p in m.parameters())
    # Both the hidden (output 0) and the cell state (output 1) flow from step 0 to step 1.
    outs = sorted(t.src_output for t in g.tensors if t.src == cells[0].name and t.dst == cells[1].name)
    assert outs == [0, 1]
    # Tensors created from shapes (new_zeros) do not depend on the data they take the shape from.
    fills = [op.name for op in g.ops if op.op_type == "fill"]
    assert fills and not [t for t in g.tensors if t.dst in fills and t.src == "emb"]
    # The mean loss reduces the batch away: TAG's "sum" class.
    loss = g.ops[-1]
    assert loss.op_type == "cross_entropy" and loss.split == "sum"
    assert loss.parallel_dims[0].reduction and loss.parallel_dims[0].size == 6
    assert g.batch_size == 6


def test_sample_dimension_found_through_reshapes() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b = x.shape[0]
            return self.proj(x).reshape(b * 5, 7).t()  # batch folded into, then moved to, axis 1

    g = from_torch(Flat(), (_meta(7, 5, 8),))
    t = g.ops[-1]
    assert t.output_shapes == ((7, 35),)
    assert t.sample_dim is not None and t.sample_dim.axis == 1  # batch and features both 7: shape alone can't tell


def test_unknown_ops_warn_once_with_conservative_cost() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(torch.erf(x), dim=1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = from_torch(Odd(), (_meta(4, 10),))
    messages = [str(w.message) for w in caught if "no FLOP formula" in str(w.message)]
    assert len(messages) == 1 and "cumsum" in messages[0] and "erf" in messages[0]
    assert all(op.forward_flops == 8 * 40 for op in g.ops if op.op_type in ("cumsum", "erf"))


def test_real_module_is_not_modified() -> None:
    lin = nn.Linear(4, 3)
    before = lin.weight.detach().clone()
    g = from_torch(lin, (torch.randn(5, 4),))
    assert lin.weight.device.type == "cpu" and torch.equal(lin.weight, before)
    assert g.param_bytes == (4 * 3 + 3) * 4


def test_untraceable_module_gives_a_clear_error() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(ValueError, match="could not trace DataDependent"):
        from_torch(DataDependent(), (_meta(2, 2),))
    with pytest.raises(ValueError, match="example_inputs is empty"):
        from_torch(nn.Linear(2, 2), ())


def test_attention_with_one_tensor_for_query_key_and_value() -> None:
    # sdpa(x, x, x) and attn(x, x, x) read one tensor three times: the formulas take the call's arguments.
    class SelfSdpa(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(x, x, x)

    g = from_torch(SelfSdpa(), (_meta(2, 3, 5, 4),))
    (op,) = [op for op in g.ops if op.op_type == "attention"]
    scores = 2 * 3 * 5 * 5
    assert op.forward_flops == 2 * scores * 4 + 2 * scores * 4 + 5 * scores

    class SelfMha(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x)[0]

    g = from_torch(SelfMha(), (_meta(3, 5, 8),))
    (mha,) = [op for op in g.ops if op.op_type == "multihead_attention"]
    assert mha.forward_flops > 0


def test_identical_layers_are_propagated_once_with_the_same_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shape propagation runs a built-in layer once per (configuration, input shapes), so a deep stack of
    identical blocks costs one block; the graph is the same as running every layer."""
    import placement_rl.graph.importer as importer

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
            self.no_bias = nn.Linear(16, 16, bias=False)  # same shapes in, another configuration
            self.pools = nn.ModuleList([nn.MaxPool1d(2), nn.MaxPool1d(4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            x = self.no_bias(x)
            return self.pools[1](self.pools[0](x.unsqueeze(1))).sum()

    calls: list[int] = []
    forward = nn.Linear.forward

    def counted(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        calls.append(self.in_features)
        return forward(self, x)

    monkeypatch.setattr(nn.Linear, "forward", counted)
    cached = importer.from_torch(Stack(), (torch.empty(4, 16),), tracer="fx", check_backward=False)
    once = len(calls)
    monkeypatch.setattr(importer, "_layer_call_key", lambda *args: None)
    calls.clear()
    every = importer.from_torch(Stack(), (torch.empty(4, 16),), tracer="fx", check_backward=False)
    # per propagation pass: three runs (the first layer, whose input needs no gradient; the second, whose
    # input does, standing for the other seven; the bias-free one) against all nine layers
    assert len(calls) * 3 == once * 9
    assert cached.to_dict() == every.to_dict()
    assert [op.output_shapes for op in cached.ops if op.op_type == "max_pool1d"] == [((4, 1, 8),), ((4, 1, 2),)]
