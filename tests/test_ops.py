"""The op taxonomy (placement_rl.ops) against its producers (the importer's tables) and its readers."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from placement_rl import ops
from placement_rl.graph import OpGraph, importer
from placement_rl.graph.importer import einsum_flops
from placement_rl.ops import OBSERVATION_FAMILIES, OP_KINDS, OpKind, observation_family, op_kind

# The fx front end's op types and formulas (the export front end: tests/test_importer_export.py).
from_torch = functools.partial(importer.from_torch, tracer="fx")

#: Types the importer names itself rather than through its torch-API tables (placeholders, buffers).
_SELF_MADE_TYPES = {"input", "constant"}


def _emitted_types() -> set[str]:
    return {
        *importer._FUNCTION_TYPES.values(),
        *importer._METHOD_TYPES.values(),
        *importer._MODULE_TYPES.values(),
        *_SELF_MADE_TYPES,
    }


def _torch_flops(fn, *shapes: tuple[int, ...]) -> int:
    """FLOPs torch's own counter attributes to ``fn`` on random CPU tensors of ``shapes``."""
    args = [torch.randn(*s) for s in shapes]
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


# --------------------------------------------------------------- the table
@pytest.mark.parametrize("op_type", sorted(_emitted_types()))
def test_every_type_the_importer_emits_has_an_entry(op_type: str) -> None:
    assert op_type in OP_KINDS, f"the importer emits {op_type!r}, which placement_rl.ops does not know"
    kind = op_kind(op_type)
    assert kind.family != "other"
    assert observation_family(op_type) in OBSERVATION_FAMILIES
    assert observation_family(op_type) != "other"


def test_the_importer_names_placeholders_and_buffers_as_the_self_made_types() -> None:
    class WithBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("offset", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.offset

    g = from_torch(WithBuffer(), (torch.zeros(2, 3),))
    assert {op.op_type for op in g.ops} == {"input", "constant", "add"}
    assert {"input", "constant"} <= _SELF_MADE_TYPES


def test_observation_families_keep_the_policy_input_layout() -> None:
    # NODE_DIM of trained policies depends on this exact tuple: order and count.
    assert OBSERVATION_FAMILIES == (
        "conv",
        "matmul",
        "recurrent",
        "attention",
        "norm",
        "activation",
        "pool",
        "elementwise",
        "shape",
        "embedding",
        "loss",
        "input",
        "other",
    )
    from placement_rl.envs import observation

    assert observation.OP_FAMILIES == OBSERVATION_FAMILIES


def test_types_the_observation_knew_keep_their_family() -> None:
    # The observation's table before the taxonomy: trained policies saw these op types so.
    legacy = {
        "conv": "conv1d conv2d conv3d conv_transpose2d",
        "matmul": "linear matmul bmm addmm baddbmm",
        "recurrent": "lstm_cell gru_cell rnn_cell lstm gru rnn",
        "attention": "multihead_attention",
        "norm": "batch_norm layer_norm group_norm",
        "activation": "relu gelu tanh sigmoid softmax log_softmax dropout",
        "pool": "max_pool2d avg_pool2d adaptive_avg_pool2d",
        "elementwise": "add mul sub div",
        "shape": "transpose reshape view slice cat unsqueeze squeeze flatten stack permute",
        "embedding": "embedding",
        "loss": "cross_entropy mse_loss nll_loss",
        "input": "input constant fill",
    }
    for family, names in legacy.items():
        for op_type in names.split():
            assert observation_family(op_type) == family, op_type


def test_types_that_were_other_now_have_a_family() -> None:
    expected = {
        "attention": "attention",
        "silu": "activation",
        "relu6": "activation",
        "leaky_relu": "activation",
        "hardtanh": "activation",
        "elu": "activation",
        "max_pool1d": "pool",
        "adaptive_max_pool2d": "pool",
        "adaptive_avg_pool1d": "pool",
        "instance_norm": "norm",
        "local_response_norm": "norm",
        "rms_norm": "norm",
        "l1_loss": "loss",
        "bce_loss": "loss",
        "contiguous": "shape",
        "split": "shape",
        "chunk": "shape",
        "clone": "shape",
        "pad": "shape",
        "to": "shape",
        "expand": "shape",
        "identity": "shape",
        "einsum": "matmul",
        "neg": "elementwise",
        "rsqrt": "elementwise",
        "masked_fill": "elementwise",
        "where": "elementwise",
        "clamp": "elementwise",
        "mean": "elementwise",
        "sum": "elementwise",
    }
    assert {t: observation_family(t) for t in expected} == expected


def test_unknown_types_are_other_and_only_they() -> None:
    assert op_kind("cumsum") is ops.UNKNOWN
    assert observation_family("cumsum") == "other"
    assert ops.UNKNOWN.flop_rule == "unknown"
    assert all(k.observation_family != "other" for k in OP_KINDS.values())


def test_derived_sets_equal_the_tables_they_replace() -> None:
    assert ops.RECURRENT_OPS == {"lstm_cell", "gru_cell", "rnn_cell", "lstm", "gru", "rnn"}
    assert ops.DENSE_OPS == {"linear"}
    assert ops.VIEW_OPS == {
        "view",
        "reshape",
        "flatten",
        "permute",
        "transpose",
        "unsqueeze",
        "squeeze",
        "expand",
        "identity",
    }
    assert ops.INPUT_OPS == {"input", "constant"}
    reductions = {
        "mean",
        "sum",
        "max",
        "vector_norm",
        "histogram",
        *"cross_entropy nll_loss mse_loss l1_loss bce_loss".split(),
    }
    assert ops.REDUCTION_OPS == reductions
    from placement_rl.profiling import UNMEASURED_OPS

    assert UNMEASURED_OPS == ops.INPUT_OPS | ops.VIEW_OPS


def test_backward_factors_follow_the_families() -> None:
    for op_type, kind in OP_KINDS.items():
        if kind.family in ("conv", "matmul", "recurrent", "attention"):
            assert kind.backward_factor == 2.0, op_type
        elif kind.family in ("input", "view"):
            assert kind.backward_factor == 0.0, op_type
        elif kind.family == "norm":  # local response norm has always been counted 1x
            assert kind.backward_factor == (1.0 if op_type == "local_response_norm" else 2.0), op_type
        else:
            assert kind.backward_factor == 1.0, op_type
        assert kind.moves_bytes == (kind.family != "view"), op_type


def test_default_efficiency_comes_from_the_table_unchanged() -> None:
    from placement_rl.sim.cost import DEFAULT_EFFICIENCY, CostModel

    assert DEFAULT_EFFICIENCY == {
        "conv1d": 0.55,
        "conv2d": 0.55,
        "conv3d": 0.5,
        "conv_transpose2d": 0.5,
        "linear": 0.7,
        "matmul": 0.7,
        "bmm": 0.65,
        "attention": 0.5,
        "multihead_attention": 0.55,
        "lstm_cell": 0.45,
        "gru_cell": 0.45,
        "rnn_cell": 0.45,
        "lstm": 0.5,
        "gru": 0.5,
        "rnn": 0.5,
    }
    cost = CostModel()
    assert cost.op_efficiency("rms_norm") == cost.default_efficiency


def test_docstring_table_is_the_table() -> None:
    assert ops.__doc__ is not None and ops.taxonomy_table() in ops.__doc__


def test_op_kind_rejects_inconsistent_records() -> None:
    with pytest.raises(ValueError, match="observation_family"):
        OpKind("norm", "normalization", "per_output_element", 5.0)
    with pytest.raises(ValueError, match="'other' together"):
        OpKind("norm", "other", "per_output_element", 5.0)
    with pytest.raises(ValueError, match="flops_per_element"):
        OpKind("elementwise", "elementwise", "per_output_element")
    with pytest.raises(ValueError, match="efficiency"):
        OpKind("matmul", "matmul", "matmul", efficiency=1.5)


# ----------------------------------------------------------------- einsum
@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("bsd,hd->bsh", [(2, 7, 8), (3, 8)]),
        ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 6)]),  # ellipses broadcast: (2, 3) with (3,)
        ("b i j, b j k -> b i k", [(2, 3, 4), (1, 4, 5)]),  # spaces; batch extent 1 broadcast to 2
    ],
)
def test_einsum_flops_match_torchs_counter(equation: str, shapes: list[tuple[int, ...]]) -> None:
    expected = _torch_flops(lambda *xs: torch.einsum(equation, *xs), *shapes)
    assert einsum_flops(equation, shapes) == expected


def test_einsum_flops_of_one_operand_and_of_three() -> None:
    assert einsum_flops("ij->ji", [(3, 4)]) == 12
    assert einsum_flops("ii->", [(5, 5)]) == 25
    assert einsum_flops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == 2 * 2 * 3 * 4 * 5
    with pytest.raises(ValueError, match="subscript"):
        einsum_flops("ijk,kl->il", [(2, 3), (3, 4)])


def test_importer_reads_both_einsum_calling_conventions() -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(6, 5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.einsum("bsd,ed->bse", x, self.weight)  # a parameter operand: not among the op's inputs
            return torch.einsum(y, [0, 1, 2], y, [0, 3, 2], [0, 1, 3])  # sublist form, one tensor twice

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="from_torch: no FLOP formula")
        g = from_torch(Both(), (torch.zeros(2, 4, 5),))
    first, second = (op for op in g.ops if op.op_type == "einsum")
    assert first.forward_flops == 2 * 2 * 4 * 5 * 6 and first.param_bytes == 6 * 5 * 4
    assert second.forward_flops == 2 * 2 * 4 * 6 * 4
    assert second.backward_flops == 2 * second.forward_flops


# ------------------------------------------------------ a held-out module
class _ModernBlock(nn.Module):
    """A pre-norm transformer block as recent LLMs write it; none of it is in the zoo."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.head_mix = nn.Parameter(torch.empty(heads, heads))
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dim)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.act = nn.SiLU()
        self.gelu = nn.GELU()
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = torch.einsum("bhsd,hg->bgsd", a, self.head_mix)  # talking-heads mixing
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        x = x + self.down(self.act(self.up(h)) * self.gelu(self.gate(h)) + F.silu(self.gate(h)))
        return torch.einsum("bsd,btd->bst", x, x)


def _import_block(batch: int = 2, seq: int = 8, dim: int = 32) -> OpGraph:
    with torch.device("meta"):
        block = _ModernBlock(dim)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="from_torch: no FLOP formula")
        return from_torch(block, (torch.empty(batch, seq, dim, device="meta"),))


def test_held_out_block_has_no_other_ops_and_no_flop_warning() -> None:
    g = _import_block()
    types = {op.op_type for op in g.ops}
    assert {"rms_norm", "attention", "silu", "gelu", "einsum", "chunk"} <= types
    assert {t: observation_family(t) for t in types if observation_family(t) == "other"} == {}
    for op in g.ops:
        kind = op_kind(op.op_type)
        assert op.backward_flops == kind.backward_factor * op.forward_flops, op.name
        if not kind.moves_bytes:
            assert op.bytes_read == op.bytes_written == 0, op.name


def test_held_out_block_flops_are_exact() -> None:
    batch, seq, dim, heads = 2, 8, 32, 4
    g = _import_block(batch, seq, dim)
    mix, scores = (op for op in g.ops if op.op_type == "einsum")
    head_dim = dim // heads
    assert mix.forward_flops == _torch_flops(
        lambda a, m: torch.einsum("bhsd,hg->bgsd", a, m), (batch, heads, seq, head_dim), (heads, heads)
    )
    assert scores.forward_flops == 2 * batch * seq * seq * dim
    assert scores.forward_flops == _torch_flops(lambda x: torch.einsum("bsd,btd->bst", x, x), (batch, seq, dim))
    norms = [op for op in g.ops if op.op_type == "rms_norm"]
    assert [op.forward_flops for op in norms] == [4.0 * batch * seq * dim] * 2
    assert all(op.backward_flops == 2 * op.forward_flops and op.param_bytes == dim * 4 for op in norms)
    silu = [op for op in g.ops if op.op_type == "silu"]
    assert [op.forward_flops for op in silu] == [5.0 * batch * seq * 2 * dim] * 2
    (attention,) = (op for op in g.ops if op.op_type == "attention")
    score_elems = batch * heads * seq * seq
    assert attention.forward_flops == 4.0 * score_elems * head_dim + 5.0 * score_elems


def test_held_out_block_parallel_dims() -> None:
    g = _import_block()
    by_type = {op.op_type: op for op in g.ops}
    # RMS norm normalizes the last axis, as layer norm does: the sequence axis splits, the model axis not.
    assert [(d.name, d.kind) for d in by_type["rms_norm"].parallel_dims] == [
        ("sample", "sample"),
        ("dim1", "attribute"),
    ]
    # Every output axis of a product is a free index; no parameter is claimed split.
    scores = [op for op in g.ops if op.op_type == "einsum"][-1]
    assert [(d.name, d.kind, d.axis) for d in scores.parallel_dims] == [
        ("sample", "sample", 0),
        ("dim1", "attribute", 1),
        ("channel", "attribute", 2),
    ]


# --------------------------------------------- formulas the taxonomy routes
def test_transposed_convolution_counts_output_channels() -> None:
    conv = nn.ConvTranspose2d(3, 8, 3, stride=2, bias=False)
    g = from_torch(conv, (torch.zeros(2, 3, 5, 5),))
    (op,) = (o for o in g.ops if o.op_type == "conv_transpose2d")
    assert op.forward_flops == _torch_flops(conv, (2, 3, 5, 5)) == 2 * (2 * 3 * 5 * 5) * 8 * 9


def test_functional_conv1d_and_addmm_have_formulas() -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = nn.Parameter(torch.zeros(6, 4, 3))
            self.weight = nn.Parameter(torch.zeros(6 * 8, 5))
            self.bias = nn.Parameter(torch.zeros(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.conv1d(x, self.kernel)  # (B, 6, 8)
            return torch.addmm(self.bias, y.flatten(1), self.weight)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="from_torch: no FLOP formula")
        g = from_torch(Functional(), (torch.zeros(2, 4, 10),))
    by_type = {op.op_type: op for op in g.ops}
    assert by_type["conv1d"].forward_flops == _torch_flops(lambda x, w: F.conv1d(x, w), (2, 4, 10), (6, 4, 3))
    assert by_type["addmm"].forward_flops == 2 * 2 * 48 * 5 + 2 * 5
    assert math.isclose(by_type["addmm"].backward_flops, 2 * by_type["addmm"].forward_flops)
