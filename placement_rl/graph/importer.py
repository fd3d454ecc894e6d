"""Import a ``torch.nn.Module`` into an :class:`~placement_rl.graph.OpGraph`.

:func:`from_torch` traces with ``torch.export`` by default (:mod:`placement_rl.graph.aten`: ATen
nodes grouped back into module-level ops, FLOPs from ``torch.utils.flop_counter``) and falls back to
``torch.fx`` when export fails; ``tracer="fx"`` asks for fx, which the model zoo uses (faster on
its models, and the docs' zoo figures). The rest of this docstring describes the fx front end.

With fx the module is traced with ``torch.fx.symbolic_trace`` (leaf layers become one op each: the
``torch.nn`` layers of ``_MODULE_TYPES`` such as ``Conv2d``, ``Linear`` or ``LSTMCell``, found by
``isinstance`` so that a subclass with a forward of its own is one too, and the classes registered with
:func:`placement_rl.graph.register_leaf`) and shapes are propagated under ``FakeTensorMode``, so
no activation is ever computed and, when the module was built under ``torch.device("meta")``, no
weight is ever allocated: BERT-Large imports in about a second.

Shapes are propagated twice, with batch ``B`` and ``B + 1``: the output axes whose extent changes
are the **sample** dimensions. This finds the batch axis even after reshapes that fold the batch
into another axis (``(B * S, V)`` logits), where a "dimension equal to B" rule would guess. An op that
reads a tensor carrying the batch but outputs none (indexing a constant number of rows) is refused with
a ``ValueError`` naming it, unless it reduces the batch away: a reduction or a loss, or a product that
contracts it (``x.T @ x``), whose partitions are partial sums (TAG's ``sum`` class).

Before tracing, :func:`from_torch` runs one training step on meta tensors (:func:`check_training_step`)
and refuses a module whose backward pass would fail.

What each op type is (its family, which formula below, its backward factor, whether it moves bytes,
its parallel dimensions, its observation family) is the taxonomy :mod:`placement_rl.ops`; this module
maps torch calls to op types and computes the formulas.

FLOP formulas (forward; a multiply-add counts as 2 FLOPs):

===================  ==========================================================================
rule                 forward FLOPs
===================  ==========================================================================
conv (1/2/3-d)       ``2 * out_numel * (C_in / groups) * prod(kernel)`` (+ ``out_numel`` bias);
                     transposed: ``2 * in_numel * (C_out / groups) * prod(kernel)`` (+ bias)
linear               ``2 * rows * in * out`` (+ ``rows * out`` bias), ``rows = out_numel / out``
matmul / bmm         ``2 * out_numel * K`` (``K`` = the contracted extent)
addmm / baddbmm      ``2 * out_numel * K + out_numel`` (the product, then the added input)
einsum               two or more operands: ``2 * prod(extent of every distinct index)`` (``...``
                     stands for the broadcast leading axes); one operand: its element count
attention            ``F.scaled_dot_product_attention``: ``4 * B * H * L * S * E + 5 * B * H * L * S``
                     (``q k^T`` and ``p v`` matmuls, softmax); ``nn.MultiheadAttention`` adds the
                     four ``E x E`` projections, ``2 * E * E`` per projected token each
LSTM cell            ``8 N H (I + H) + 17 N H``: the two gate matmuls, two bias adds (8NH),
                     gate activations (4NH), ``c' = f c + i g`` (3NH), ``h' = o tanh(c')`` (2NH)
GRU cell             ``6 N H (I + H) + 16 N H``; RNN (tanh) cell ``2 N H (I + H) + 3 N H``
LSTM / GRU / RNN     the cell cost times steps, layers and directions
normalization        ``5 * numel`` (batch, layer, group, instance norm); RMS norm ``4 * numel``
pooling              ``out_numel * prod(kernel)``; adaptive pooling ``in_numel``
softmax / losses     ``5 * numel`` of the input
element-wise         ``numel * k``, ``k`` from a table (1 for add/relu, 4 sigmoid, 8 gelu, ...)
embedding, views,    0 FLOPs; copies (cat, stack, slicing, contiguous) count bytes moved only
copies
===================  ==========================================================================

Backward FLOPs: matmul-like ops (conv, linear, matmul, recurrent cells, attention) ``2x`` forward
(the input gradient and the weight gradient each cost one forward); normalization ``2x``; every other
op ``1x`` forward; inputs, parameters and views ``0`` (:attr:`placement_rl.ops.OpKind.backward_factor`).

Ops with no formula get a conservative (high) estimate of ``8`` FLOPs per element of their largest
input or output, and one ``UserWarning`` per import lists them, each with its op count and share of the
graph's forward FLOPs; ``metadata["unknown_ops"]`` keeps the list.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from placement_rl.graph.ir import Op, OpGraph, ParallelDim, Shape, SplitClass, Tensor
from placement_rl.graph.leaves import leaf_op_type
from placement_rl.graph.tracing import MODULE_TYPES as _MODULE_TYPES
from placement_rl.graph.tracing import (
    cache_off,
    check_training_step,
    parallel_dims,
    quiet_fake_tensor_log,
    report_unknown_ops,
)
from placement_rl.ops import OpKind, op_kind

_FUNCTION_TYPES: dict[Any, str] = {
    operator.add: "add",
    operator.iadd: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    operator.imul: "mul",
    torch.mul: "mul",
    operator.truediv: "div",
    torch.div: "div",
    operator.neg: "neg",
    operator.matmul: "matmul",
    torch.matmul: "matmul",
    torch.bmm: "bmm",
    torch.mm: "matmul",
    torch.addmm: "addmm",
    torch.baddbmm: "baddbmm",
    torch.einsum: "einsum",
    torch.relu: "relu",
    F.relu: "relu",
    F.gelu: "gelu",
    torch.tanh: "tanh",
    F.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    F.silu: "silu",
    F.relu6: "relu6",
    F.leaky_relu: "leaky_relu",
    F.hardtanh: "hardtanh",
    F.elu: "elu",
    F.softplus: "softplus",
    F.logsigmoid: "log_sigmoid",
    torch.sign: "sign",
    torch.ceil: "round",
    torch.floor: "round",
    torch.round: "round",
    torch.trunc: "round",
    torch.linalg.vector_norm: "vector_norm",
    torch.norm: "vector_norm",
    torch.exp: "exp",
    torch.log: "log",
    torch.abs: "abs",
    torch.neg: "neg",
    torch.pow: "pow",
    torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt",
    torch.softmax: "softmax",
    F.softmax: "softmax",
    F.log_softmax: "log_softmax",
    torch.log_softmax: "log_softmax",
    F.dropout: "dropout",
    F.linear: "linear",
    F.conv1d: "conv1d",
    F.conv2d: "conv2d",
    F.conv3d: "conv3d",
    F.conv_transpose2d: "conv_transpose2d",
    F.embedding: "embedding",
    F.batch_norm: "batch_norm",
    F.layer_norm: "layer_norm",
    F.rms_norm: "rms_norm",
    F.group_norm: "group_norm",
    F.instance_norm: "instance_norm",
    F.cross_entropy: "cross_entropy",
    F.nll_loss: "nll_loss",
    F.mse_loss: "mse_loss",
    F.l1_loss: "l1_loss",
    F.binary_cross_entropy_with_logits: "bce_loss",
    torch.cat: "cat",
    torch.stack: "stack",
    torch.flatten: "flatten",
    torch.reshape: "reshape",
    torch.transpose: "transpose",
    torch.permute: "permute",
    torch.unsqueeze: "unsqueeze",
    torch.squeeze: "squeeze",
    torch.mean: "mean",
    torch.sum: "sum",
    torch.zeros_like: "fill",
    torch.ones_like: "fill",
    torch.split: "split",
    torch.chunk: "chunk",
    operator.getitem: "slice",
    torch.where: "where",
    torch.clamp: "clamp",
    F.max_pool1d: "max_pool1d",
    F.max_pool2d: "max_pool2d",
    F.max_pool3d: "max_pool3d",
    F.avg_pool1d: "avg_pool1d",
    F.avg_pool2d: "avg_pool2d",
    F.avg_pool3d: "avg_pool3d",
    F.adaptive_avg_pool1d: "adaptive_avg_pool1d",
    F.adaptive_avg_pool2d: "adaptive_avg_pool2d",
    F.adaptive_avg_pool3d: "adaptive_avg_pool3d",
    F.adaptive_max_pool1d: "adaptive_max_pool1d",
    F.adaptive_max_pool2d: "adaptive_max_pool2d",
    F.adaptive_max_pool3d: "adaptive_max_pool3d",
    F.pad: "pad",
    torch.masked_fill: "masked_fill",
    F.scaled_dot_product_attention: "attention",
}

_METHOD_TYPES: dict[str, str] = {
    "view": "view",
    "reshape": "reshape",
    "flatten": "flatten",
    "permute": "permute",
    "transpose": "transpose",
    "unsqueeze": "unsqueeze",
    "squeeze": "squeeze",
    "expand": "expand",
    "contiguous": "contiguous",
    "softmax": "softmax",
    "log_softmax": "log_softmax",
    "mean": "mean",
    "sum": "sum",
    "add": "add",
    "mul": "mul",
    "div": "div",
    "sub": "sub",
    "add_": "add",
    "mul_": "mul",
    "div_": "div",
    "sub_": "sub",
    "relu_": "relu",
    "sigmoid_": "sigmoid",
    "tanh_": "tanh",
    "exp_": "exp",
    "clamp_": "clamp",
    "masked_fill_": "masked_fill",
    "fill_": "fill",
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "exp": "exp",
    "new_zeros": "fill",
    "new_ones": "fill",
    "new_full": "fill",
    "zero_": "fill",
    "masked_fill": "masked_fill",
    "split": "split",
    "chunk": "chunk",
    "clone": "clone",
    "to": "to",
    "float": "to",
    "type_as": "to",
    "matmul": "matmul",
    "bmm": "bmm",
    "addmm": "addmm",
    "baddbmm": "baddbmm",
    "pow": "pow",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "abs": "abs",
    "neg": "neg",
    "log": "log",
    "clamp": "clamp",
    "sign": "sign",
    "ceil": "round",
    "floor": "round",
    "round": "round",
    "trunc": "round",
    "norm": "vector_norm",
    "detach": "identity",
    "detach_": "identity",
    "copy_": "clone",
    "new_empty": "fill",
    "new_tensor": "fill",
    "scatter": "scatter",
    "scatter_": "scatter",
    "scatter_add": "scatter",
    "scatter_add_": "scatter",
    "t": "transpose",
    "expand_as": "expand",
    "view_as": "view",
}


@dataclass(frozen=True)
class _TensorInfo:
    shape: Shape
    dtype_bytes: int


def from_torch(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    name: str | None = None,
    batch_size: int | None = None,
    metadata: dict[str, Any] | None = None,
    tracer: str = "auto",
    check_backward: bool = True,
) -> OpGraph:
    """Trace ``module`` into an :class:`OpGraph` of its forward pass.

    ``tracer`` picks the front end: ``"export"`` (:func:`placement_rl.graph.aten.from_export`:
    ``torch.export``, FLOPs from ``torch.utils.flop_counter``), ``"fx"`` (``torch.fx.symbolic_trace``
    and this module's formulas) or ``"auto"`` (the default): export, and fx only when export fails.
    fx is kept where it is better: it traces the zoo's models 5-10x faster and its figures are the
    ones the docs report (docs/concepts/graph.md), so :func:`placement_rl.zoo.load` asks for it; its FLOPs also count
    bias additions and element-wise arithmetic, which ``FlopCounterMode`` does not (0.05-2.3% more on
    the zoo).

    Both front ends refuse a graph that loses the batch: an op that reads a tensor carrying the batch
    but outputs none (other than a reduction such as a loss, or a product that contracts it) raises
    a ``ValueError`` naming it, since data parallelism would replicate it and everything after it.

    Args:
        module: any ``torch.nn.Module`` that ``torch.export`` or ``torch.fx.symbolic_trace`` can trace.
            Build it under ``torch.device("meta")`` to avoid allocating weights; real modules work
            too and are never run on data (export puts them in ``eval()`` mode).
        example_inputs: the positional inputs of ``forward``; dimension 0 of every input is the sample
            (batch) dimension. Only shapes and dtypes are used.
        name: the graph's name (default: the module's class name).
        batch_size: recorded on the graph (default: dimension 0 of the first input).
        metadata: extra JSON-serializable notes stored on the graph.
        tracer: ``"auto"``, ``"export"`` or ``"fx"`` (above).
        check_backward: first run one training step (forward, then backward from the sum of the
            floating-point outputs) on fake tensors, :func:`check_training_step`: no weight is
            allocated and nothing is computed. A module whose backward would fail (an in-place op
            on a tensor its backward needs) is refused; ``metadata["backward_check"]`` records
            ``"passed"`` or why the check was skipped.

    Key/value caching is turned off while the module is checked and traced (a Hugging Face model built
    with its default ``use_cache=True`` returns a ``DynamicCache``, which ``torch.export`` cannot
    return): :func:`placement_rl.graph.tracing.cache_off` sets ``config.use_cache = False`` for the
    import and gives the module its value back; ``metadata["use_cache"]`` says so.

    Returns:
        The graph, ops in execution order, with FLOPs, bytes and parallel dimensions filled in.

    Raises:
        ValueError: when the module cannot be traced or shapes cannot be propagated; the message
            names the failing node (export: the op and the source line, and whether fx was tried);
            when an op loses the batch; when the training step fails (the error and the op).
    """
    if tracer not in ("auto", "export", "fx"):
        raise ValueError(f"from_torch: tracer = {tracer!r}; expected 'auto', 'export' or 'fx'")
    with cache_off(module) as cache_note:
        note = check_training_step(module, example_inputs) if check_backward else None
        meta = dict(metadata or {}) if cache_note is None else {"use_cache": cache_note, **(metadata or {})}
        graph = _trace(module, example_inputs, name=name, batch_size=batch_size, metadata=meta, tracer=tracer)
    if note is not None:
        graph.metadata.setdefault("backward_check", note)
    return graph


def _trace(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    name: str | None,
    batch_size: int | None,
    metadata: dict[str, Any] | None,
    tracer: str,
) -> OpGraph:
    """:func:`from_torch` without the training-step check."""
    if tracer != "fx":
        from placement_rl.graph.aten import ExportError, from_export

        try:
            return from_export(
                module, example_inputs, name=name, batch_size=batch_size, metadata=metadata, check_backward=False
            )
        except ExportError as exc:
            if tracer == "export":
                raise ExportError(f"{exc} (the fx fallback was not tried: tracer='export')") from exc
            try:
                graph = _from_fx(module, example_inputs, name=name, batch_size=batch_size, metadata=metadata)
            except ValueError as fx_exc:
                # fx's shape propagation errors run over several lines ("While executing ..."): the first
                fx_line = str(fx_exc).strip().splitlines()[0] if str(fx_exc).strip() else type(fx_exc).__name__
                raise ExportError(f"{exc}; the fx fallback was tried and failed too: {fx_line}") from exc
            graph.metadata["export_error"] = str(exc)
            return graph
    return _from_fx(module, example_inputs, name=name, batch_size=batch_size, metadata=metadata)


class _LeafTracer(fx.Tracer):
    """``torch.fx``'s tracer, with every leaf layer (:mod:`placement_rl.graph.leaves`) kept whole.

    The default tracer keeps only classes defined in ``torch.nn``: a subclass of ``nn.Linear`` with a
    forward of its own would be traced through, its weight read by a transpose.
    """

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return leaf_op_type(m, _MODULE_TYPES) is not None or super().is_leaf_module(m, module_qualified_name)


def symbolic_trace(module: nn.Module) -> fx.GraphModule:
    """``torch.fx.symbolic_trace(module)`` with the importer's leaf layers kept as one call each."""
    tracer = _LeafTracer()
    graph = tracer.trace(module)
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def _from_fx(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    name: str | None = None,
    batch_size: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> OpGraph:
    """:func:`from_torch` through ``torch.fx.symbolic_trace`` (this module's FLOP formulas)."""
    if not example_inputs:
        raise ValueError("from_torch: example_inputs is empty; expected the positional inputs of forward()")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise ValueError(f"from_torch: example_inputs[{i}] must be a tensor whose dim 0 is the batch, got {x!r}")
    leaf = leaf_op_type(module, _MODULE_TYPES)
    try:
        gm = _leaf_root(module, leaf, len(example_inputs)) if leaf is not None else symbolic_trace(module)
    except Exception as exc:  # fx raises many types (TraceError, TypeError, ...)
        raise ValueError(f"from_torch: torch.fx could not trace {type(module).__name__}: {exc}") from exc
    batch = int(example_inputs[0].shape[0])
    values = _propagate(gm, example_inputs, 0)
    values_plus = _propagate(gm, example_inputs, 1)
    builder = _Builder(gm, values, values_plus)
    ops, tensors = builder.build()
    if builder.lost:
        node, op_type = builder.lost[0]
        raise ValueError(
            f"from_torch: op {node.name!r} ({op_type}, {node.format_node()}) reads a tensor that carries the batch "
            f"but none of its outputs does: the batch dimension is lost there ({len(builder.lost)} such op(s)); "
            "a graph without it would replicate what follows on every data-parallel device. Keep the batch in "
            "that op's output (index with x.shape[0], not a constant), or reduce it away with a reduction "
            "(sum, mean, a loss)"
        )
    meta: dict[str, Any] = {"source": "torch.fx", "module": type(module).__name__}
    meta["unknown_ops"] = report_unknown_ops("from_torch", ops, builder.unknown)
    meta.update(metadata or {})
    return OpGraph(name or type(module).__name__, ops, tensors, batch_size=batch_size or batch, metadata=meta)


def _leaf_root(module: nn.Module, name: str, num_inputs: int) -> fx.GraphModule:
    """A one-op graph calling ``module``: tracing a leaf layer itself would inline its internals."""
    root = nn.Module()
    root.add_module(name, module)
    graph = fx.Graph()
    inputs = tuple(graph.placeholder(f"input_{i}") for i in range(num_inputs))
    graph.output(graph.call_module(name, inputs))
    return fx.GraphModule(root, graph)


def _propagate(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], extra_batch: int) -> dict[fx.Node, Any]:
    """Run ``gm`` under FakeTensorMode with the batch grown by ``extra_batch``; shapes per node."""
    recorded: dict[fx.Node, Any] = {}
    # Outputs of built-in leaf layers by (layer, inputs): the repeated layers of a deep model (a GPT's
    # 96 identical blocks) run once under fake tensors, not once each.
    outputs: dict[Hashable, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            try:
                result = self._run_cached(n) if n.op == "call_module" else super().run_node(n)
            except Exception as exc:
                raise ValueError(f"from_torch: shape propagation failed at node {n.format_node()}: {exc}") from exc
            recorded[n] = _describe(result)
            return result

        def _run_cached(self, n: fx.Node) -> Any:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            key = _layer_call_key(self.module.get_submodule(str(n.target)), args, kwargs)
            if key is not None and key in outputs:
                return _fresh(outputs[key])
            result = self.call_module(n.target, args, kwargs)
            if key is not None:
                shapes = _tensor_specs(result)
                if shapes is not None:
                    outputs[key] = shapes
            return result

    # Inputs live where the weights live (meta for zoo models), whatever device the examples are on.
    weight: torch.Tensor | None = next(iter(gm.parameters()), None)
    if weight is None:
        weight = next(iter(gm.buffers()), None)
    with quiet_fake_tensor_log(), FakeTensorMode(allow_non_fake_inputs=True):
        inputs = [
            torch.empty(
                (x.shape[0] + extra_batch, *x.shape[1:]),
                dtype=x.dtype,
                device=weight.device if weight is not None else x.device,
            )
            for x in example_inputs
        ]
        _Recorder(gm).run(*inputs)
    return recorded


def _layer_call_key(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> Hashable | None:
    """What a built-in leaf layer's output shapes depend on: its type, configuration, mode, parameter and
    buffer shapes, and its inputs' shapes; ``None`` (never cached) for other modules or non-tensor inputs."""
    if type(module) not in _MODULE_TYPES:
        return None
    specs = _tensor_specs((tuple(args), tuple(sorted(kwargs.items()))))
    if specs is None:
        return None
    state = tuple((k, tuple(v.shape), v.dtype, v.requires_grad) for k, v in module.state_dict(keep_vars=True).items())
    return (type(module), module.extra_repr(), module.training, state, specs)


def _tensor_specs(value: Any) -> Any:
    """``value`` with every tensor replaced by ``(shape, stride, dtype, device, requires_grad)``; ``None``
    when it holds anything but tensors, ``None``, numbers, strings and tuples or lists of them."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, str(value.device), value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    if isinstance(value, (tuple, list)):
        items = [_tensor_specs(v) for v in value]
        return None if any(i is None for i in items) else (type(value).__name__, tuple(items))
    return None


def _fresh(spec: Any) -> Any:
    """New (fake, under the active mode) tensors of the shapes ``spec`` describes (:func:`_tensor_specs`)."""
    kind = spec[0]
    if kind == "tensor":
        _, shape, stride, dtype, device, grad = spec
        return torch.empty_strided(shape, stride, dtype=dtype, device=device).requires_grad_(grad)
    if kind == "value":
        return spec[1]
    items = [_fresh(v) for v in spec[1]]
    return tuple(items) if kind == "tuple" else items


def _describe(value: Any) -> Any:
    """Tensors become ``_TensorInfo``; tuples/lists recurse; everything else is ``None``."""
    if isinstance(value, torch.Tensor):
        return _TensorInfo(tuple(int(d) for d in value.shape), value.element_size())
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    return None


def _flat_tensors(value: Any) -> list[_TensorInfo]:
    if isinstance(value, _TensorInfo):
        return [value]
    if isinstance(value, tuple):
        return [t for v in value for t in _flat_tensors(v)]
    return []


class _Builder:
    """Turns fx nodes plus their propagated shapes into ops and tensors."""

    def __init__(self, gm: fx.GraphModule, values: dict[fx.Node, Any], values_plus: dict[fx.Node, Any]) -> None:
        self.gm = gm
        self.values = values
        self.values_plus = values_plus
        self.modules = dict(gm.named_modules())
        self.unknown: set[str] = set()
        # node -> (op name, output index) for each flat tensor output; getitem on tuples aliases into it.
        self.alias: dict[fx.Node, tuple[str, int]] = {}
        self.outputs: dict[str, list[_TensorInfo]] = {}
        self.sample_axes: dict[str, list[int | None]] = {}
        self.owned_params: set[int] = set()
        self.key_bytes: dict[str, int] = {}
        #: ops that read a tensor carrying the batch but output none: (node, op type)
        self.lost: list[tuple[fx.Node, str]] = []
        #: view op name -> for each output axis, the axis of its first input it follows (-1: none)
        self.dst_axes: dict[str, tuple[int, ...]] = {}

    def build(self) -> tuple[list[Op], list[Tensor]]:
        ops: list[Op] = []
        tensors: list[Tensor] = []
        for node in self.gm.graph.nodes:
            if node.op == "output":
                continue
            value = self.values.get(node)
            if (
                node.op == "call_function"
                and node.target is operator.getitem
                and isinstance(self.values.get(node.args[0]), tuple)
                and isinstance(node.args[1], int)
                and node.args[0] in self.alias
            ):
                # Selecting one output of a multi-output op is not an op.
                src, _ = self.alias[node.args[0]]
                self.alias[node] = (src, self._tuple_offset(node.args[0], node.args[1]))
                continue
            if node.op == "get_attr" and isinstance(self._attr(node), nn.Parameter):
                continue  # parameters are folded into the ops that read them (see _params)
            flat = _flat_tensors(value)
            if not flat:
                continue  # Python values (shapes, ints): not part of the dataflow graph.
            inputs = self._input_tensors(node)
            op = self._make_op(node, flat, inputs)
            if op.op_type == "fill":
                inputs = []  # new_zeros / zeros_like read only the shape of their argument, not its data
            ops.append(op)
            self.alias[node] = (op.name, 0)
            self.outputs[op.name] = flat
            seen: set[tuple[str, int]] = set()
            for k, (src, idx, info) in enumerate(inputs):
                if (src, idx) in seen:
                    continue
                seen.add((src, idx))
                nbytes = math.prod(info.shape) * info.dtype_bytes
                axes = self.dst_axes.get(op.name, ()) if k == 0 else ()
                tensors.append(
                    Tensor(src=src, dst=op.name, shape=info.shape, num_bytes=nbytes, src_output=idx, dst_axes=axes)
                )
        return ops, tensors

    def _tuple_offset(self, node: fx.Node, index: int) -> int:
        """Flat output index of element ``index`` of a tuple-valued node (nested tuples flattened)."""
        parts = self.values[node]
        base = self.alias[node][1]
        return base + sum(len(_flat_tensors(p)) for p in parts[:index])

    def _input_tensors(self, node: fx.Node) -> list[tuple[str, int, _TensorInfo]]:
        found: list[tuple[str, int, _TensorInfo]] = []
        for inp in node.all_input_nodes:
            if inp not in self.alias:
                continue
            src, idx = self.alias[inp]
            count = len(_flat_tensors(self.values[inp]))
            for k in range(count):
                found.append((src, idx + k, self.outputs[src][idx + k]))
        return found

    # ------------------------------------------------------------------ ops
    def _op_type(self, node: fx.Node) -> tuple[str, nn.Module | None]:
        return op_type_of(node, self.modules)

    def _make_op(self, node: fx.Node, flat: list[_TensorInfo], inputs: list[tuple[str, int, _TensorInfo]]) -> Op:
        op_type, module = self._op_type(node)
        kind = op_kind(op_type)
        if op_type == "fill":
            inputs = []
        out = flat[0]
        in_infos = [info for _, _, info in inputs]
        param_bytes, param_key = self._params(node, module)
        fwd = self._forward_flops(node, op_type, kind, module, flat, in_infos)
        bwd = kind.backward_factor * fwd
        out_bytes = sum(math.prod(t.shape) * t.dtype_bytes for t in flat)
        in_bytes = sum(math.prod(t.shape) * t.dtype_bytes for t in in_infos)
        if kind.moves_bytes:
            read, written = in_bytes + param_bytes, out_bytes
        else:
            read, written = 0, 0
        sample_axes = self._sample_axes(node, flat)
        self.sample_axes[node.name] = sample_axes
        dims, split = self._parallel_dims(kind, out, sample_axes[0], inputs, param_bytes > 0)
        if kind.family in ("view", "copy") and inputs and op_type in _AXIS_MAPPED:
            axes = view_axes(node, op_type, out.shape, inputs[0][2].shape)
            if axes is not None:
                self.dst_axes[node.name] = axes
                dims = dims + _mapped_dims(dims, out.shape, axes)
        batch = any(d.kind == "sample" for d in dims)
        if not batch and all(a is None for a in sample_axes) and self._batched_input(inputs) is not None:
            self.lost.append((node, op_type))
        return Op(
            name=node.name,
            op_type=op_type,
            output_shapes=tuple(t.shape for t in flat),
            dtype_bytes=out.dtype_bytes,
            forward_flops=float(fwd),
            backward_flops=float(bwd),
            param_bytes=int(param_bytes),
            param_key=param_key,
            bytes_read=int(read),
            bytes_written=int(written),
            parallel_dims=dims,
            split=split,
        )

    def _params(self, node: fx.Node, module: nn.Module | None) -> tuple[int, str | None]:
        """Parameter bytes of this op and their identity (``param_key``, the module or attribute path).

        Every call of one module (an unrolled LSTM layer) gets the same key and byte count. A
        parameter tensor shared by two modules (tied weights) is counted under the first key only.
        """
        if module is not None:
            params, key = list(module.parameters()), str(node.target)
        else:  # a function reading parameters directly (F.linear(x, self.weight)): fold them in
            attrs = sorted(
                (str(n.target), self._attr(n))
                for n in node.all_input_nodes
                if n.op == "get_attr" and isinstance(self._attr(n), nn.Parameter)
            )
            params, key = [p for _, p in attrs], "+".join(t for t, _ in attrs)
        if not params:
            return 0, None
        if key not in self.key_bytes:
            self.key_bytes[key] = self._own(params)
        return self.key_bytes[key], key

    def _arg_shape(self, arg: Any) -> Shape:
        """Shape of a node argument that is a parameter attribute or a tensor-valued node."""
        if arg.op == "get_attr":
            return tuple(self._attr(arg).shape)
        return self.values[arg].shape

    def _call_shape(self, node: fx.Node, index: int, keyword: str) -> Shape:
        """Shape of a call's tensor argument ``index`` (or keyword ``keyword``)."""
        arg = _arg_or_kwarg(node, index, keyword)
        if not isinstance(arg, fx.Node):
            raise ValueError(f"from_torch: {node.format_node()}: argument {keyword!r} is not a tensor")
        return self._arg_shape(arg)

    def _attr(self, node: fx.Node) -> Any:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return obj

    def _own(self, params: Sequence[torch.Tensor]) -> int:
        total = 0
        for p in params:
            if id(p) not in self.owned_params:
                self.owned_params.add(id(p))
                total += p.numel() * p.element_size()
        return total

    def _sample_axes(self, node: fx.Node, flat: list[_TensorInfo]) -> list[int | None]:
        """Per flat output, the first axis whose extent grew with the batch (``None`` if none did)."""
        plus = _flat_tensors(self.values_plus.get(node))
        axes: list[int | None] = []
        for i, t in enumerate(flat):
            other = plus[i].shape if i < len(plus) else t.shape
            changed = (
                [a for a, (x, y) in enumerate(zip(t.shape, other, strict=True)) if x != y]
                if len(other) == len(t.shape)
                else []
            )
            axes.append(changed[0] if changed else None)
        return axes

    def _forward_flops(
        self,
        node: fx.Node,
        op_type: str,
        kind: OpKind,
        module: nn.Module | None,
        flat: list[_TensorInfo],
        ins: list[_TensorInfo],
    ) -> float:
        """Forward FLOPs of one op by its kind's rule (formulas in the module docstring).

        Rules that need the layer (a recurrent cell's sizes) fall back to the conservative estimate,
        with a warning, when a function or an unknown module stands in for it.
        """
        out = flat[0]
        out_numel = math.prod(out.shape)
        in_numel = math.prod(ins[0].shape) if ins else out_numel
        rule = kind.flop_rule
        if rule == "none":
            return 0.0
        if rule == "per_output_element":
            return kind.flops_per_element * out_numel
        if rule == "per_input_element":
            return kind.flops_per_element * in_numel
        if rule == "conv":
            if isinstance(module, nn.modules.conv._ConvNd):
                if module.transposed:
                    return conv_transpose_flops(
                        in_numel,
                        out_numel,
                        module.out_channels,
                        module.groups,
                        module.kernel_size,
                        module.bias is not None,
                    )
                return conv_flops(
                    out.shape, module.in_channels, module.groups, module.kernel_size, module.bias is not None
                )
            if module is None and len(node.args) > 1:
                # F.conv*d(x, weight (C_out, C_in / groups, *kernel), bias);
                # F.conv_transpose*d(x, weight (C_in, C_out / groups, *kernel), bias).
                weight = self._arg_shape(node.args[1])
                bias = len(node.args) > 2 and node.args[2] is not None or node.kwargs.get("bias") is not None
                macs = (in_numel if op_type.startswith("conv_transpose") else out_numel) * math.prod(weight[1:])
                return 2.0 * macs + (out_numel if bias else 0)
        elif rule == "linear":
            if isinstance(module, nn.Linear):
                return linear_flops(out.shape, module.in_features, module.out_features, module.bias is not None)
            # F.linear(x, weight, bias): the weight is (out, in) whether a parameter or a tensor input.
            bias = len(node.args) > 2 and node.args[2] is not None or node.kwargs.get("bias") is not None
            return linear_flops(out.shape, ins[0].shape[-1], out.shape[-1], bias)
        elif rule == "matmul":
            contracted = ins[0].shape[-1] if ins else 1
            return 2.0 * out_numel * contracted
        elif rule == "addmm":
            # addmm(input, mat1 (n, m), mat2 (m, p)); mat1 may be a parameter, absent from ``ins``.
            if len(node.args) > 1:
                return 2.0 * out_numel * self._arg_shape(node.args[1])[-1] + out_numel
        elif rule == "einsum":
            parsed = self._einsum_operands(node)
            if parsed is not None:
                try:
                    return einsum_flops(*parsed)
                except ValueError:
                    pass  # an equation this parser misreads: the conservative estimate, and the warning
        elif rule == "attention":  # q (..., L, E), k (..., S, E), v (..., S, Ev)
            # From the call's arguments: ``ins`` lists a tensor once, so sdpa(x, x, x) has one input.
            q, k = self._call_shape(node, 0, "query"), self._call_shape(node, 1, "key")
            scores = math.prod(q[:-1]) * k[-2]
            return 2.0 * scores * q[-1] + 2.0 * scores * out.shape[-1] + 5.0 * scores
        elif rule == "multihead_attention":
            if isinstance(module, nn.MultiheadAttention):
                return _mha_flops(module, self._call_shape(node, 0, "query"), self._call_shape(node, 1, "key"))
        elif rule == "rnn_cell":
            if isinstance(module, nn.RNNCellBase):
                return rnn_cell_flops(
                    op_type.removesuffix("_cell"), ins[0].shape[0], module.input_size, module.hidden_size
                )
        elif rule == "rnn":
            if isinstance(module, nn.RNNBase):
                return _rnn_flops(op_type, module, ins[0].shape)
        elif rule == "pool":
            kernel: Any = module.kernel_size if module is not None else _arg_or_kwarg(node, 1, "kernel_size")
            if kernel is not None:
                return float(out_numel * _kernel_elems(kernel, spatial_dims=len(out.shape) - 2))
        elif rule == "adaptive_pool":
            return float(in_numel)
        self.unknown.add(op_type)
        return 8.0 * max([out_numel, *(math.prod(t.shape) for t in ins)])

    def _einsum_operands(self, node: fx.Node) -> tuple[str, list[Shape]] | None:
        """``torch.einsum``'s equation and operand shapes, from either calling convention.

        ``einsum("ij,jk->ik", a, b)`` (or ``einsum(eq, [a, b])``) and the sublist form
        ``einsum(a, [0, 1], b, [1, 2], [0, 2])``, whose integer indices become letters. Shapes come
        from the arguments themselves, not from the op's deduplicated input tensors, so
        ``einsum("ij,ij->", x, x)`` sees two operands. ``None`` when an argument is not understood.
        """
        args: list[Any] = list(node.args)
        try:
            if args and isinstance(args[0], str):
                operands = args[1:]
                if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
                    operands = list(operands[0])
                return args[0], [self._arg_shape(a) for a in operands]
            letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

            def subscript(sublist: Sequence[Any]) -> str:
                return "".join("..." if i is Ellipsis else letters[i] for i in sublist)

            pairs = args[: len(args) - len(args) % 2]
            shapes = [self._arg_shape(a) for a in pairs[0::2]]
            inputs = ",".join(subscript(sub) for sub in pairs[1::2])
            output = subscript(args[-1]) if len(args) % 2 else None
            return inputs + ("" if output is None else f"->{output}"), shapes
        except (AttributeError, IndexError, KeyError, TypeError):
            return None

    def _parallel_dims(
        self,
        kind: OpKind,
        out: _TensorInfo,
        sample_axis: int | None,
        inputs: list[tuple[str, int, _TensorInfo]],
        has_params: bool,
    ) -> tuple[tuple[ParallelDim, ...], SplitClass]:
        """SOAP dimensions (FlexFlow Table 2) and TAG's split class for one op (:func:`parallel_dims`)."""
        reduce_axis = self._batched_input(inputs) if sample_axis is None else None
        in_shape = inputs[0][2].shape if inputs else None
        return parallel_dims(kind, out.shape, sample_axis, reduce_axis, has_params, in_shape)

    def _batched_input(self, inputs: list[tuple[str, int, _TensorInfo]]) -> tuple[int, int] | None:
        """``(sample axis, extent)`` of the first input that carries the batch, ``None`` if none does."""
        for src, idx, info in inputs:
            axes = self.sample_axes.get(src, [])
            axis = axes[idx] if idx < len(axes) else None
            if axis is not None:
                return axis, info.shape[axis]
        return None


def op_type_of(node: fx.Node, modules: dict[str, nn.Module]) -> tuple[str, nn.Module | None]:
    """The op type the importer gives an fx node (and its leaf module, for ``call_module`` nodes)."""
    if node.op == "placeholder":
        return "input", None
    if node.op == "get_attr":
        return "constant", None
    if node.op == "call_module":
        module = modules[str(node.target)]
        return leaf_op_type(module, _MODULE_TYPES) or type(module).__name__.lower(), module
    if node.op == "call_method":
        return _METHOD_TYPES.get(str(node.target), str(node.target)), None
    target = node.target
    if target is builtins.getattr and len(node.args) > 1 and node.args[1] in _TENSOR_ATTRS:
        return _TENSOR_ATTRS[node.args[1]], None  # x.T, x.mT: a view
    return _FUNCTION_TYPES.get(target, getattr(target, "__name__", str(target))), None


#: Tensor attributes that are tensors (``x.T``), read through ``getattr`` in an fx graph.
_TENSOR_ATTRS: dict[Any, str] = {
    "T": "transpose",
    "mT": "transpose",
    "H": "transpose",
    "mH": "transpose",
    "data": "identity",
}


#: View and copy op types whose output axes the importer maps to their input's (:func:`view_axes`).
_AXIS_MAPPED = frozenset(
    {"reshape", "view", "flatten", "squeeze", "unsqueeze", "transpose", "permute", "chunk", "split", "slice", "cat"}
)


def view_axes(node: fx.Node, op_type: str, out_shape: Shape, in_shape: Shape) -> tuple[int, ...] | None:
    """For each axis of a view's (first) output, the axis of its input it follows, -1 for none.

    A transpose or permute moves axes (read from the call's arguments); a reshape groups
    consecutive axes whose extents multiply alike, and the first axis of an output group follows
    the first axis of its input group (a contiguous split of one is a contiguous split of the
    other); a chunk or split keeps every axis but the one it cuts. ``None`` when unknown.
    """
    rank = len(in_shape)
    if op_type in ("transpose", "permute"):
        perm = _permutation(node, op_type, rank)
        if perm is None or len(out_shape) != rank or any(out_shape[a] != in_shape[p] for a, p in enumerate(perm)):
            return None
        return tuple(perm)
    if op_type in ("chunk", "split", "slice", "cat"):
        if len(out_shape) != rank:
            return None
        return tuple(a if out_shape[a] == in_shape[a] else -1 for a in range(rank))
    return _grouped_axes(tuple(out_shape), tuple(in_shape))


def _permutation(node: fx.Node, op_type: str, rank: int) -> list[int] | None:
    """The input axis of each output axis of a transpose or permute call, from its arguments."""
    args = list(node.args[1:]) if node.op in ("call_method", "call_function") else []
    if node.op == "call_function" and node.target is builtins.getattr:  # x.T / x.mT
        perm = list(range(rank))
        if node.args[1] in ("mT", "mH") and rank >= 2:
            perm[-2], perm[-1] = perm[-1], perm[-2]
            return perm
        return perm[::-1]
    if op_type == "transpose":
        if not args:  # x.t()
            return [1, 0] if rank == 2 else None
        pair = [a for a in args[:2] if isinstance(a, int)]
        if len(pair) < 2:
            return None
        d0, d1 = (a % rank for a in pair)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    dims = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    ints = [a for a in dims if isinstance(a, int)]
    if len(dims) != rank or len(ints) != rank:
        return None
    perm = [a % rank for a in ints]
    return perm if sorted(perm) == list(range(rank)) else None


def _grouped_axes(out_shape: Shape, in_shape: Shape) -> tuple[int, ...] | None:
    """A reshape's axis map: consecutive axes grouped where the running products of the extents meet."""
    axes = [-1] * len(out_shape)
    i = o = 0
    while i < len(in_shape) or o < len(out_shape):
        # skip extents of 1 (squeeze / unsqueeze): they carry nothing to split
        if o < len(out_shape) and out_shape[o] == 1:
            o += 1
            continue
        if i < len(in_shape) and in_shape[i] == 1:
            i += 1
            continue
        if i >= len(in_shape) or o >= len(out_shape):
            return None
        first_in, first_out = i, o
        p_in, p_out = in_shape[i], out_shape[o]
        i, o = i + 1, o + 1
        while p_in != p_out:
            if p_in < p_out:
                if i >= len(in_shape):
                    return None
                p_in *= in_shape[i]
                i += 1
            else:
                if o >= len(out_shape):
                    return None
                p_out *= out_shape[o]
                o += 1
        axes[first_out] = first_in
    return tuple(axes)


def _mapped_dims(dims: tuple[ParallelDim, ...], shape: Shape, axes: tuple[int, ...]) -> tuple[ParallelDim, ...]:
    """Attribute dimensions for a view's output axes that follow an input axis (besides its sample axis)."""
    taken = {d.axis for d in dims}
    return tuple(
        ParallelDim(f"dim{a}", "attribute", a, shape[a])
        for a, src in enumerate(axes)
        if src >= 0 and a not in taken and shape[a] > 1
    )


# ----------------------------------------------------------------- formulas
def conv_flops(
    out_shape: Sequence[int], in_channels: int, groups: int, kernel: Sequence[int] | int, bias: bool
) -> float:
    """Forward FLOPs of a convolution: ``2 * out_numel * (C_in / groups) * prod(kernel)`` (+ bias)."""
    out_numel = math.prod(out_shape)
    flops = 2.0 * out_numel * (in_channels // groups) * _kernel_elems(kernel)
    return flops + (out_numel if bias else 0)


def conv_transpose_flops(
    in_numel: int, out_numel: int, out_channels: int, groups: int, kernel: Sequence[int] | int, bias: bool
) -> float:
    """Forward FLOPs of a transposed convolution: every input element meets ``C_out / groups`` kernels.

    ``2 * in_numel * (C_out / groups) * prod(kernel)`` (+ ``out_numel`` for a bias).
    """
    flops = 2.0 * in_numel * (out_channels // groups) * _kernel_elems(kernel)
    return flops + (out_numel if bias else 0)


def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> float:
    """Forward FLOPs of ``torch.einsum(equation, *operands)`` from the operands' shapes.

    Two or more operands: ``2 * prod(extent of every distinct index)``, a multiply-add for every
    combination of index values (``"ij,jk->ik"`` is ``2 * i * j * k``, as for ``mm``). One operand
    (a transpose, trace or sum): its element count. ``...`` stands for the operands' leading axes,
    broadcast against each other as torch does. An index of extent 1 in one operand and ``n`` in
    another counts ``n``.

    Raises:
        ValueError: when the equation and the shapes disagree (a subscript's length is not its
            operand's rank).
    """
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    if len(inputs) != len(shapes):
        raise ValueError(f"einsum {equation!r}: {len(inputs)} subscripts for {len(shapes)} operands")
    if len(shapes) == 1:
        return float(math.prod(shapes[0]))
    extent: dict[str, int] = {}
    for subscript, shape in zip(inputs, shapes, strict=True):
        head, ellipsis, tail = subscript.partition("...")
        explicit = len(head) + len(tail)
        if (len(shape) < explicit) if ellipsis else (len(shape) != explicit):
            raise ValueError(f"einsum {equation!r}: subscript {subscript!r} for an operand of shape {tuple(shape)}")
        # Ellipsis axes are named by their distance from the ellipsis' end, which broadcasting aligns.
        ellipsis_axes = len(shape) - explicit
        labels = [*head, *(f"...{ellipsis_axes - i}" for i in range(ellipsis_axes)), *tail]
        for label, size in zip(labels, shape, strict=True):
            extent[label] = max(extent.get(label, 1), int(size))
    return 2.0 * math.prod(extent.values())


def linear_flops(out_shape: Sequence[int], in_features: int, out_features: int, bias: bool) -> float:
    """Forward FLOPs of ``y = x W^T + b``: ``2 * rows * in * out`` (+ ``rows * out``)."""
    rows = math.prod(out_shape) // out_features
    return 2.0 * rows * in_features * out_features + (rows * out_features if bias else 0)


_CELL_GATES = {"lstm": (4, 17), "gru": (3, 16), "rnn": (1, 3)}


def rnn_cell_flops(kind: str, batch: int, input_size: int, hidden_size: int) -> float:
    """Forward FLOPs of one step of an LSTM / GRU / tanh-RNN cell (formulas in the module docstring)."""
    gates, elementwise = _CELL_GATES[kind]
    return 2.0 * batch * gates * hidden_size * (input_size + hidden_size) + elementwise * batch * hidden_size


def _rnn_flops(kind: str, module: nn.RNNBase, in_shape: Sequence[int]) -> float:
    batch, steps = (in_shape[0], in_shape[1]) if module.batch_first else (in_shape[1], in_shape[0])
    dirs = 2 if module.bidirectional else 1
    total = 0.0
    for layer in range(module.num_layers):
        inp = module.input_size if layer == 0 else module.hidden_size * dirs
        total += dirs * steps * rnn_cell_flops(kind, batch, inp, module.hidden_size)
    return total


def _mha_flops(module: nn.MultiheadAttention, q_shape: Sequence[int], kv_shape: Sequence[int]) -> float:
    """``nn.MultiheadAttention``: q/k/v/out projections plus scaled dot-product attention."""
    e = module.embed_dim
    seq_axis = 1 if module.batch_first else 0
    batch = q_shape[1 - seq_axis]
    q_len, kv_len = q_shape[seq_axis], kv_shape[seq_axis]
    projections = 2.0 * e * e * (2 * batch * q_len + 2 * batch * kv_len)  # q and out over L, k and v over S
    scores = batch * module.num_heads * q_len * kv_len
    head_dim = e // module.num_heads
    return projections + 4.0 * scores * head_dim + 5.0 * scores


def _arg_or_kwarg(node: fx.Node, index: int, name: str) -> Any:
    """Argument ``index`` of a call, or its keyword ``name`` when it was passed by keyword (else ``None``)."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def _kernel_elems(kernel: Sequence[int] | int, spatial_dims: int = 2) -> int:
    """Elements of a kernel given as a tuple or as one int repeated over ``spatial_dims`` axes."""
    if isinstance(kernel, (tuple, list)):
        return math.prod(kernel)
    return int(kernel) ** spatial_dims  # type: ignore[arg-type]  # an int-like scalar (int, numpy int)


__all__ = [
    "from_torch",
    "op_type_of",
    "conv_flops",
    "conv_transpose_flops",
    "einsum_flops",
    "linear_flops",
    "rnn_cell_flops",
]
