"""The op taxonomy: one table saying what every op type the importer emits *is*.

Everything that asks a question about an op type reads :data:`OP_KINDS` (through :func:`op_kind`):
the importer (which FLOP formula, backward factor, bytes moved, SOAP parallel dimensions), the cost
model (:data:`~placement_rl.sim.cost.DEFAULT_EFFICIENCY`), the plan constructors (which ops are
recurrent or densely connected), the profiler (which ops are never timed) and the observation (the
op-type histogram over :data:`OBSERVATION_FAMILIES`). The importer's torch-API -> op-type tables
(``_FUNCTION_TYPES``, ``_METHOD_TYPES``, ``_MODULE_TYPES``) say which torch call is which op type;
every type they can emit has an entry here (``tests/test_ops.py`` checks it). Importing this module
imports no torch.

Columns: ``family`` (what the op is), ``forward FLOPs`` (the rule the importer dispatches on; ``k x
out`` is ``k`` FLOPs per output element, ``k x in`` per element of the first input; the formulas
behind ``conv``, ``linear``, ``sdpa``, ... are in :mod:`placement_rl.graph.importer`), ``bwd`` (backward
FLOPs as a multiple of forward), ``bytes`` (``no`` for views: they re-describe memory and move
nothing), ``SOAP dims`` (:attr:`OpKind.parallel_rule`; ``+sum``: the op may reduce the sample axis
away, TAG's ``sum`` split class) and ``obs`` (the observation family).

=========== ============== ==== ===== ============ =========== ======================================================
family      forward FLOPs  bwd  bytes SOAP dims    obs         op types
=========== ============== ==== ===== ============ =========== ======================================================
conv        conv           2    yes   conv         conv        conv1d, conv2d, conv3d, conv_transpose2d
matmul      linear         2    yes   linear       matmul      linear
matmul      2 out K        2    yes   matmul       matmul      bmm, matmul
matmul      2 out K + out  2    yes   matmul       matmul      addmm, baddbmm
matmul      einsum         2    yes   contraction  matmul      einsum
attention   sdpa           2    yes   sample       attention   attention
attention   mha            2    yes   sample       attention   multihead_attention
recurrent   cell           2    yes   rnn_cell     recurrent   gru_cell, lstm_cell, rnn_cell
recurrent   cell x steps   2    yes   sample       recurrent   gru, lstm, rnn
norm        5 x out        2    yes   channel      norm        batch_norm
norm        5 x out        2    yes   rows         norm        layer_norm
norm        4 x out        2    yes   rows         norm        rms_norm
norm        5 x out        2    yes   sample       norm        group_norm, instance_norm
norm        5 x out        1    yes   sample       norm        local_response_norm
activation  1 x out        1    yes   elementwise  activation  relu
activation  2 x out        1    yes   elementwise  activation  hardtanh, leaky_relu, relu6
activation  3 x out        1    yes   elementwise  activation  elu, softplus
activation  4 x out        1    yes   elementwise  activation  log_sigmoid, sigmoid
activation  5 x out        1    yes   elementwise  activation  silu, tanh
activation  8 x out        1    yes   elementwise  activation  gelu
activation  5 x in         1    yes   rows         activation  log_softmax, softmax
pool        out x kernel   1    yes   pool         pool        avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d,
                                                               max_pool2d, max_pool3d
pool        in             1    yes   pool         pool        adaptive_avg_pool1d, adaptive_avg_pool2d,
                                                               adaptive_avg_pool3d, adaptive_max_pool1d,
                                                               adaptive_max_pool2d, adaptive_max_pool3d
elementwise 1 x out        1    yes   elementwise  elementwise abs, add, compare, div, exp, log, masked_fill, mul,
                                                               neg, pow, round, scale, sign, sqrt, sub, where
elementwise 2 x out        1    yes   elementwise  elementwise clamp, rsqrt
elementwise 2 x out        1    yes   elementwise  activation  dropout
reduction   1 x in         1    yes   sample+sum   elementwise max, mean, sum
reduction   2 x in         1    yes   sample+sum   elementwise vector_norm
loss        5 x in         1    yes   sample+sum   loss        bce_loss, cross_entropy, l1_loss, mse_loss, nll_loss
view        0              0    no    sample       shape       expand, flatten, identity, permute, reshape, squeeze,
                                                               transpose, unsqueeze, view
copy        0              1    yes   sample       shape       cat, chunk, clone, contiguous, pad, slice, split,
                                                               stack, to
copy        0              1    yes   sample       input       fill
embedding   0              1    yes   linear       embedding   embedding
embedding   0              1    yes   sample       embedding   rotary_embedding
routing     1 x in         1    yes   sample       embedding   topk
routing     0              1    yes   sample       embedding   gather, one_hot, scatter
routing     1 x in         1    yes   sample+sum   embedding   histogram
matmul      2 out K        2    yes   contraction  matmul      grouped_mm
input       0              0    yes   sample       input       constant, input
=========== ============== ==== ===== ============ =========== ======================================================

Default efficiency (fraction of peak FLOP/s; types not listed use ``CostModel.default_efficiency``):
attention 0.5, bmm 0.65, conv1d 0.55, conv2d 0.55, conv3d 0.5, conv_transpose2d 0.5, gru 0.5,
gru_cell 0.45, linear 0.7, lstm 0.5, lstm_cell 0.45, matmul 0.7, multihead_attention 0.55, rnn 0.5,
rnn_cell 0.45.

Two columns keep today's choices on purpose. ``obs``: the observation's families and their order fix
the policy's input (``NODE_DIM``), so ``dropout`` stays an ``activation`` and ``fill`` an ``input``
there, as trained policies saw them. ``bwd`` of ``local_response_norm`` is 1 (the other norms: 2),
as the importer has always counted it. An op type not in the table is :data:`UNKNOWN`: the importer
charges it a conservative 8 FLOPs per element and warns once per import (one ``UserWarning`` naming
every such type with its op count and share of the graph's forward FLOPs, also recorded as the
graph's ``metadata["unknown_ops"]``); its observation family is ``other``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

#: What an op is; :attr:`OpKind.family`.
Family = Literal[
    "conv",
    "matmul",
    "recurrent",
    "attention",
    "norm",
    "activation",
    "pool",
    "elementwise",
    "reduction",
    "loss",
    "view",
    "copy",
    "embedding",
    "routing",
    "input",
    "other",
]

#: Which forward-FLOP formula the importer applies; :attr:`OpKind.flop_rule`.
FlopRule = Literal[
    "none",  # 0 FLOPs (inputs, views, copies, embedding lookups)
    "conv",  # 2 * out_numel * (C_in / groups) * prod(kernel) (+ bias); needs the module or the weight
    "linear",  # 2 * rows * in * out (+ bias)
    "matmul",  # 2 * out_numel * K, K the first input's last extent
    "addmm",  # 2 * out_numel * K + out_numel (the added input), K from the first matrix operand
    "einsum",  # 2 * prod(extent of each distinct index) over 2+ operands; one operand: its numel
    "attention",  # F.scaled_dot_product_attention
    "multihead_attention",  # nn.MultiheadAttention: projections plus attention; needs the module
    "rnn_cell",  # one LSTM / GRU / RNN step; needs the module
    "rnn",  # a whole nn.LSTM / GRU / RNN; needs the module
    "per_output_element",  # flops_per_element * out_numel
    "per_input_element",  # flops_per_element * in_numel
    "pool",  # out_numel * prod(kernel)
    "adaptive_pool",  # in_numel
    "unknown",  # 8 per element of the largest input or output, and a warning
]

#: Which SOAP dimensions (FlexFlow Table 2) the importer offers beside the sample one;
#: :attr:`OpKind.parallel_rule`.
ParallelRule = Literal[
    "sample",  # the sample dimension only
    "conv",  # channel (parameter) on axis 1; length, or height / width / depth (attributes)
    "pool",  # length, or height / width / depth (attributes)
    "channel",  # channel (parameter) on axis 1
    "linear",  # leading axes (attributes), the last axis as channel (parameter)
    "matmul",  # as "linear" when the op reads a parameter, else as "contraction"
    "contraction",  # leading axes and the last axis (channel), all attributes: no parameter is split
    "rnn_cell",  # hidden (parameter) on axis 1
    "rows",  # every axis but the last (normalized or soft-maxed) one, attributes
    "elementwise",  # channel / height / width by rank, attributes
]

#: The observation's op families, in the order of the node features' type histogram. Their order
#: and count fix ``NODE_DIM``, the shape trained policies read: append-only, never reorder.
OBSERVATION_FAMILIES: tuple[str, ...] = (
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

_PER_ELEMENT_RULES = ("per_output_element", "per_input_element")


@dataclass(frozen=True)
class OpKind:
    """What one op type is: its family and every rule the importer, cost model and observation apply.

    Attributes:
        family: what the op is (see :data:`Family`).
        observation_family: its bucket in :data:`OBSERVATION_FAMILIES` (``other`` only for
            :data:`UNKNOWN`).
        flop_rule: the forward-FLOP formula (see :data:`FlopRule`).
        flops_per_element: ``k`` of the per-element rules; 0 for every other rule.
        backward_factor: backward FLOPs as a multiple of forward FLOPs (2 for matmul-like ops and
            normalization: the input and the weight gradient each cost about one forward).
        moves_bytes: ``False`` for views, which re-describe memory: no bytes read or written.
        parallel_rule: which SOAP dimensions the op offers (see :data:`ParallelRule`).
        reduces: the output may lose the input's sample axis (a mean loss); its partitions then
            produce partial sums (TAG's ``sum`` split class).
        efficiency: default fraction of peak FLOP/s the op reaches (fp32, large shapes), ``None`` to
            use the cost model's ``default_efficiency``.
    """

    family: Family
    observation_family: str
    flop_rule: FlopRule
    flops_per_element: float = 0.0
    backward_factor: float = 1.0
    moves_bytes: bool = True
    parallel_rule: ParallelRule = "sample"
    reduces: bool = False
    efficiency: float | None = None

    def __post_init__(self) -> None:
        if self.family not in get_args(Family):
            raise ValueError(f"OpKind.family = {self.family!r}; expected one of {list(get_args(Family))}")
        if self.observation_family not in OBSERVATION_FAMILIES:
            raise ValueError(
                f"OpKind.observation_family = {self.observation_family!r}; expected one of {OBSERVATION_FAMILIES}"
            )
        if (self.family == "other") != (self.observation_family == "other"):
            raise ValueError("OpKind: family and observation_family are 'other' together or not at all")
        if self.flop_rule not in get_args(FlopRule):
            raise ValueError(f"OpKind.flop_rule = {self.flop_rule!r}; expected one of {list(get_args(FlopRule))}")
        if self.parallel_rule not in get_args(ParallelRule):
            raise ValueError(
                f"OpKind.parallel_rule = {self.parallel_rule!r}; expected one of {list(get_args(ParallelRule))}"
            )
        if (self.flops_per_element > 0) != (self.flop_rule in _PER_ELEMENT_RULES):
            raise ValueError(
                f"OpKind: flops_per_element = {self.flops_per_element} with flop_rule {self.flop_rule!r}; "
                f"expected a positive value exactly for {_PER_ELEMENT_RULES}"
            )
        if self.backward_factor < 0:
            raise ValueError(f"OpKind.backward_factor = {self.backward_factor}; expected >= 0")
        if self.efficiency is not None and not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"OpKind.efficiency = {self.efficiency}; expected a fraction in (0, 1] or None")


# Builders for the table's recurring shapes of entry; each names the defaults that differ by family.
def _matmul_like(family: Family, obs: str, rule: FlopRule, parallel: ParallelRule, eff: float | None) -> OpKind:
    return OpKind(family, obs, rule, backward_factor=2.0, parallel_rule=parallel, efficiency=eff)


def _pointwise(k: float, family: Family = "elementwise", obs: str = "elementwise") -> OpKind:
    return OpKind(family, obs, "per_output_element", k, parallel_rule="elementwise")


def _norm(k: float, parallel: ParallelRule, backward_factor: float = 2.0) -> OpKind:
    return OpKind("norm", "norm", "per_output_element", k, backward_factor=backward_factor, parallel_rule=parallel)


def _pool(rule: FlopRule) -> OpKind:
    return OpKind("pool", "pool", rule, parallel_rule="pool")


def _loss() -> OpKind:
    return OpKind("loss", "loss", "per_input_element", 5.0, reduces=True)


_VIEW = OpKind("view", "shape", "none", backward_factor=0.0, moves_bytes=False)
_COPY = OpKind("copy", "shape", "none")

_KINDS: dict[str, OpKind] = {
    # convolution
    "conv1d": _matmul_like("conv", "conv", "conv", "conv", 0.55),
    "conv2d": _matmul_like("conv", "conv", "conv", "conv", 0.55),
    "conv3d": _matmul_like("conv", "conv", "conv", "conv", 0.5),
    "conv_transpose2d": _matmul_like("conv", "conv", "conv", "conv", 0.5),
    # dense and batched matrix products
    "linear": _matmul_like("matmul", "matmul", "linear", "linear", 0.7),
    "matmul": _matmul_like("matmul", "matmul", "matmul", "matmul", 0.7),
    "bmm": _matmul_like("matmul", "matmul", "matmul", "matmul", 0.65),
    # addmm is a linear layer written out, baddbmm its batched form. These three have no efficiency
    # of their own yet (the cost model's default): giving them linear's / bmm's would change no zoo
    # model but is a cost-model decision, not a naming one.
    "addmm": _matmul_like("matmul", "matmul", "addmm", "matmul", None),
    "baddbmm": _matmul_like("matmul", "matmul", "addmm", "matmul", None),
    "einsum": _matmul_like("matmul", "matmul", "einsum", "contraction", None),
    # attention (``attention`` is F.scaled_dot_product_attention)
    "attention": _matmul_like("attention", "attention", "attention", "sample", 0.5),
    "multihead_attention": _matmul_like("attention", "attention", "multihead_attention", "sample", 0.55),
    # recurrent
    "lstm_cell": _matmul_like("recurrent", "recurrent", "rnn_cell", "rnn_cell", 0.45),
    "gru_cell": _matmul_like("recurrent", "recurrent", "rnn_cell", "rnn_cell", 0.45),
    "rnn_cell": _matmul_like("recurrent", "recurrent", "rnn_cell", "rnn_cell", 0.45),
    "lstm": _matmul_like("recurrent", "recurrent", "rnn", "sample", 0.5),
    "gru": _matmul_like("recurrent", "recurrent", "rnn", "sample", 0.5),
    "rnn": _matmul_like("recurrent", "recurrent", "rnn", "sample", 0.5),
    # normalization
    "batch_norm": _norm(5.0, "channel"),
    "layer_norm": _norm(5.0, "rows"),
    # RMSNorm skips layer norm's mean subtraction: square, mean, scale by the rsqrt, scale by the weight.
    "rms_norm": _norm(4.0, "rows"),
    "group_norm": _norm(5.0, "sample"),
    "instance_norm": _norm(5.0, "sample"),
    "local_response_norm": _norm(5.0, "sample", backward_factor=1.0),
    # activations
    "relu": _pointwise(1, "activation", "activation"),
    "relu6": _pointwise(2, "activation", "activation"),
    "leaky_relu": _pointwise(2, "activation", "activation"),
    "hardtanh": _pointwise(2, "activation", "activation"),
    "elu": _pointwise(3, "activation", "activation"),
    "sigmoid": _pointwise(4, "activation", "activation"),
    "tanh": _pointwise(5, "activation", "activation"),
    "silu": _pointwise(5, "activation", "activation"),
    "gelu": _pointwise(8, "activation", "activation"),
    # softplus log(1 + exp(x)): exp, add, log; log-sigmoid -log(1 + exp(-x)) one negation more
    "softplus": _pointwise(3, "activation", "activation"),
    "log_sigmoid": _pointwise(4, "activation", "activation"),
    "softmax": OpKind("activation", "activation", "per_input_element", 5.0, parallel_rule="rows"),
    "log_softmax": OpKind("activation", "activation", "per_input_element", 5.0, parallel_rule="rows"),
    # pooling
    "max_pool1d": _pool("pool"),
    "max_pool2d": _pool("pool"),
    "max_pool3d": _pool("pool"),
    "avg_pool1d": _pool("pool"),
    "avg_pool2d": _pool("pool"),
    "avg_pool3d": _pool("pool"),
    "adaptive_avg_pool1d": _pool("adaptive_pool"),
    "adaptive_avg_pool2d": _pool("adaptive_pool"),
    "adaptive_avg_pool3d": _pool("adaptive_pool"),
    "adaptive_max_pool1d": _pool("adaptive_pool"),
    "adaptive_max_pool2d": _pool("adaptive_pool"),
    "adaptive_max_pool3d": _pool("adaptive_pool"),
    # element-wise arithmetic
    "add": _pointwise(1),
    "sub": _pointwise(1),
    "mul": _pointwise(1),
    "div": _pointwise(1),
    "neg": _pointwise(1),
    "abs": _pointwise(1),
    "sqrt": _pointwise(1),
    "rsqrt": _pointwise(2),
    "pow": _pointwise(1),
    "exp": _pointwise(1),
    "log": _pointwise(1),
    "masked_fill": _pointwise(1),
    "where": _pointwise(1),
    "compare": _pointwise(1),
    "clamp": _pointwise(2),
    "scale": _pointwise(1),
    "sign": _pointwise(1),
    # ceil, floor, round, trunc: one rounding instruction per element
    "round": _pointwise(1),
    # Dropout is element-wise arithmetic (mask, scale), but trained policies saw it as an activation.
    "dropout": _pointwise(2, obs="activation"),
    # reductions and losses
    "mean": OpKind("reduction", "elementwise", "per_input_element", 1.0, reduces=True),
    "sum": OpKind("reduction", "elementwise", "per_input_element", 1.0, reduces=True),
    "max": OpKind("reduction", "elementwise", "per_input_element", 1.0, reduces=True),
    # a p-norm over some axes (torch.linalg.vector_norm, Tensor.norm): |x|^p and a sum per element
    "vector_norm": OpKind("reduction", "elementwise", "per_input_element", 2.0, reduces=True),
    "cross_entropy": _loss(),
    "nll_loss": _loss(),
    "mse_loss": _loss(),
    "l1_loss": _loss(),
    "bce_loss": _loss(),
    # views: no FLOPs, no bytes
    "view": _VIEW,
    "reshape": _VIEW,
    "flatten": _VIEW,
    "permute": _VIEW,
    "transpose": _VIEW,
    "unsqueeze": _VIEW,
    "squeeze": _VIEW,
    "expand": _VIEW,
    "identity": _VIEW,
    # copies: bytes, no FLOPs
    "cat": _COPY,
    "stack": _COPY,
    "slice": _COPY,
    "contiguous": _COPY,
    "split": _COPY,
    "chunk": _COPY,
    "clone": _COPY,
    "pad": _COPY,
    "to": _COPY,
    # zeros_like / new_full write a tensor from its shape alone; trained policies saw them as inputs.
    "fill": OpKind("copy", "input", "none"),
    "embedding": OpKind("embedding", "embedding", "none", parallel_rule="linear"),
    # rotary position tables (cos / sin of positions times frequencies): a positional embedding
    "rotary_embedding": OpKind("embedding", "embedding", "none"),
    # mixture-of-experts routing: choosing experts and moving token rows to and from them. The
    # observation has no family of its own for them (it would change the policies' input width):
    # they are row lookups like an embedding's, and are counted there.
    "topk": OpKind("routing", "embedding", "per_input_element", 1.0),
    "one_hot": OpKind("routing", "embedding", "none"),
    "gather": OpKind("routing", "embedding", "none"),
    "scatter": OpKind("routing", "embedding", "none"),
    "histogram": OpKind("routing", "embedding", "per_input_element", 1.0, reduces=True),
    # the experts' grouped matrix product: 2 * rows * K * N (its formula is in placement_rl.graph.aten)
    "grouped_mm": _matmul_like("matmul", "matmul", "matmul", "contraction", None),
    # graph inputs and non-parameter attributes (buffers): they write their output, nothing else
    "input": OpKind("input", "input", "none", backward_factor=0.0),
    "constant": OpKind("input", "input", "none", backward_factor=0.0),
}

#: Op type -> :class:`OpKind`, for every op type the importer emits (read-only).
OP_KINDS: Mapping[str, OpKind] = types.MappingProxyType(_KINDS)

#: The kind of an op type missing from :data:`OP_KINDS` (a torch call the importer has no name for).
UNKNOWN = OpKind("other", "other", "unknown")


def op_kind(op_type: str) -> OpKind:
    """The :class:`OpKind` of ``op_type``; :data:`UNKNOWN` for a type not in :data:`OP_KINDS`."""
    return OP_KINDS.get(op_type, UNKNOWN)


def observation_family(op_type: str) -> str:
    """``op_type``'s family in :data:`OBSERVATION_FAMILIES`; ``"other"`` only for types not in the table."""
    return op_kind(op_type).observation_family


def op_types_where(predicate: Callable[[OpKind], bool]) -> frozenset[str]:
    """The op types whose kind satisfies ``predicate``, e.g. ``op_types_where(lambda k: k.reduces)``."""
    return frozenset(t for t, k in OP_KINDS.items() if predicate(k))


#: Recurrent layers and cells (LSTM, GRU, tanh RNN).
RECURRENT_OPS = op_types_where(lambda k: k.family == "recurrent")
#: Densely-connected layers ``y = x W^T + b`` whose weight is always a parameter (Krizhevsky's
#: model-parallel layers in FlexFlow's expert strategy).
DENSE_OPS = op_types_where(lambda k: k.flop_rule == "linear")
#: Views: they re-describe memory, moving no bytes and computing nothing.
VIEW_OPS = op_types_where(lambda k: not k.moves_bytes)
#: Graph inputs and constants: no kernel runs for them.
INPUT_OPS = op_types_where(lambda k: k.family == "input")
#: Ops whose output may lose the sample axis (TAG's ``sum`` split class).
REDUCTION_OPS = op_types_where(lambda k: k.reduces)


_RULE_LABELS: dict[str, str] = {
    "none": "0",
    "conv": "conv",
    "linear": "linear",
    "matmul": "2 out K",
    "addmm": "2 out K + out",
    "einsum": "einsum",
    "attention": "sdpa",
    "multihead_attention": "mha",
    "rnn_cell": "cell",
    "rnn": "cell x steps",
    "pool": "out x kernel",
    "adaptive_pool": "in",
    "unknown": "8 x max numel",
}


def taxonomy_table(types_width: int = 54) -> str:
    """The taxonomy as the reStructuredText table of this module's docstring, rows in table order.

    Op types sharing every column but the efficiency share a row; the efficiencies follow the table.
    """

    def flops(k: OpKind) -> str:
        if k.flop_rule in _PER_ELEMENT_RULES:
            return f"{k.flops_per_element:g} x {'out' if k.flop_rule == 'per_output_element' else 'in'}"
        return _RULE_LABELS[k.flop_rule]

    rows: dict[tuple[str, ...], list[str]] = {}
    for op_type, k in OP_KINDS.items():
        key: tuple[str, ...] = (
            k.family,
            flops(k),
            f"{k.backward_factor:g}",
            "yes" if k.moves_bytes else "no",
            k.parallel_rule + ("+sum" if k.reduces else ""),
            k.observation_family,
        )
        rows.setdefault(key, []).append(op_type)
    widths = (11, 14, 4, 5, 12, 11, types_width)
    rule = " ".join("=" * w for w in widths)
    header = ("family", "forward FLOPs", "bwd", "bytes", "SOAP dims", "obs", "op types")
    lines = [rule, _table_line(header, widths), rule]
    for key, names in rows.items():
        wrapped = _wrap(", ".join(sorted(names)), types_width)
        lines.append(_table_line((*key, wrapped[0]), widths))
        lines.extend(_table_line((*([""] * len(key)), more), widths) for more in wrapped[1:])
    lines.append(rule)
    lines.append("")
    lines.append("Default efficiency (fraction of peak FLOP/s; types not listed use ``CostModel.default_efficiency``):")
    efficiency = ", ".join(f"{t} {k.efficiency:g}" for t, k in sorted(OP_KINDS.items()) if k.efficiency is not None)
    lines.extend(_wrap(efficiency + ".", 100))
    return "\n".join(lines)


def _table_line(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    return " ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _wrap(text: str, width: int) -> list[str]:
    """Break a comma-separated list after commas so no line is wider than ``width``."""
    lines = [""]
    for word in text.split(" "):
        candidate = f"{lines[-1]} {word}".strip()
        if len(candidate) > width and lines[-1]:
            lines.append(word)
        else:
            lines[-1] = candidate
    return lines


__all__ = [
    "DENSE_OPS",
    "INPUT_OPS",
    "OBSERVATION_FAMILIES",
    "OP_KINDS",
    "RECURRENT_OPS",
    "REDUCTION_OPS",
    "UNKNOWN",
    "VIEW_OPS",
    "FlopRule",
    "Family",
    "OpKind",
    "ParallelRule",
    "observation_family",
    "op_kind",
    "op_types_where",
    "taxonomy_table",
]
