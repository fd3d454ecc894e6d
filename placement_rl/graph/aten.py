"""Import a module through ``torch.export``: ATen nodes grouped back into module-level ops.

``torch.export.export`` (non-strict) traces code that ``torch.fx.symbolic_trace`` cannot (Hugging Face
transformers' data-dependent control flow, ``*args`` signatures, cache objects) into a graph of ATen
operators whose nodes carry their shapes (fake tensors) and the module call that issued them
(``nn_module_stack``). This module turns that graph into the same :class:`~placement_rl.graph.OpGraph`
the fx importer builds:

* **one op per leaf-module call**: every ATen node issued inside a call of a known layer
  (``nn.Linear``, ``nn.LayerNorm``, ``nn.LSTM``, ... found by ``isinstance``, so Falcon's
  ``FalconLinear(nn.Linear)`` is one; the classes registered with
  :func:`placement_rl.graph.register_leaf`; and the childless custom layers of :data:`CUSTOM_LEAVES`,
  such as GPT-2's ``Conv1D`` or an ``RMSNorm``) belongs to that call's op; its parameters are the op's
  parameters;
* **one op per tensor function** outside such layers (a ``matmul``, ``add``, ``softmax``, ``view``),
  typed by :data:`ATEN_TYPES` (an ATen name missing there keeps its own name and is family ``other``);
* buffers and constants a tensor function reads are one ``constant`` op each (a layer's own buffers,
  such as batch norm statistics, are its state); a slice that keeps its whole input (``x[:, t]``
  exports as a full slice, then a select) is no op: its readers read its source, as fx sees one
  indexing call;
* **shapes** from export's fake tensors. The batch is exported as a dynamic dimension (``Dim.AUTO``
  on dimension 0 of every tensor input), so an output axis whose extent is an expression of the
  batch symbol is a **sample** dimension: the batch axis is found even when it is folded into
  another one (``(B * S, V)`` logits). Export makes the batch a constant when the code turns it into a
  Python int (``len(x)``, as CLIP's loss does): then the module is exported again at ``B + 1`` and the
  axes whose extent changed are the sample dimensions, or, when the two graphs differ, the import is
  refused naming the source line. A batch of 1 is exported as 2 (export specializes sizes 0 and 1) and
  the symbolic sizes are evaluated at 1. An op that drops the batch without reducing it is refused.

FLOPs come from torch's own registry, ``torch.utils.flop_counter``: each ATen node is run once on
``meta`` tensors of its shapes under ``FlopCounterMode`` (results cached per signature), which
counts the formulas torch registers for ``mm``, ``addmm``, ``bmm``, ``baddbmm``, convolutions and
the attention kernels. **Backward** FLOPs: the node's outputs are differentiated on meta tensors
under ``FlopCounterMode``, with the inputs that need a gradient (parameters, and activations
derived from them) marked ``requires_grad``, so backward counts the registry's backward ops (an
``mm``'s two gradient products, ``convolution_backward``, the attention backward kernels) and skips
the input gradient of the first layer, as autograd does. Forward and backward therefore equal
``FlopCounterMode`` over the same model. One exception: the grouped matrix product of
mixture-of-experts layers (``_grouped_mm``, transformers' ``grouped_mm_fallback``), which the
registry has no formula for, counts ``2 * M * K * N`` for ``a (M, K)`` times ``b (E, K, N)``, and as
much again backward for each operand that needs a gradient (what an eager loop of per-expert ``mm``
calls counts, since every row meets exactly one expert's matrix).

**Fallback** for ATen nodes the registry has no formula for (element-wise arithmetic, activations,
normalization, softmax, reductions, copies): ``FlopCounterMode`` counts them as 0 and so does this
importer; the simulator's roofline still charges them their bytes read and written, which is what
bounds them on a GPU. A node whose op type is not in the taxonomy at all (family ``other``) is charged
a conservative 8 FLOPs per element of its largest input or output, as in the fx importer, and one
``UserWarning`` per import names every such ATen op with its count and share of the forward FLOPs. The
graph's metadata records ``flop_fallback_ops`` (op types counted 0 by the registry), ``unknown_ops``
(the warning's rows) and ``unknown_aten_ops`` (their names).
"""

from __future__ import annotations

import math
import operator
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from placement_rl.graph.ir import Op, OpGraph, ParallelDim, Shape, Tensor
from placement_rl.graph.leaves import leaf_op_type
from placement_rl.graph.tracing import (
    MODULE_TYPES,
    cache_off,
    check_training_step,
    parallel_dims,
    quiet_fake_tensor_log,
    report_unknown_ops,
)
from placement_rl.ops import OP_KINDS, VIEW_OPS, OpKind, op_kind

#: ATen overload-packet name -> op type of the taxonomy (:mod:`placement_rl.ops`).
ATEN_TYPES: dict[str, str] = {
    # products
    "linear": "linear",
    "matmul": "matmul",
    "mm": "matmul",
    "bmm": "bmm",
    "addmm": "addmm",
    "baddbmm": "baddbmm",
    "einsum": "einsum",
    "bilinear": "einsum",
    "scaled_dot_product_attention": "attention",
    "conv1d": "conv1d",
    "conv2d": "conv2d",
    "conv3d": "conv3d",
    "convolution": "conv2d",
    "conv_transpose1d": "conv_transpose2d",
    "conv_transpose2d": "conv_transpose2d",
    "conv_transpose3d": "conv_transpose2d",
    # normalization
    "layer_norm": "layer_norm",
    "rms_norm": "rms_norm",
    "batch_norm": "batch_norm",
    "group_norm": "group_norm",
    "instance_norm": "instance_norm",
    # activations
    "relu": "relu",
    "relu_": "relu",
    "gelu": "gelu",
    "silu": "silu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "hardtanh": "hardtanh",
    "leaky_relu": "leaky_relu",
    "elu": "elu",
    "softplus": "softplus",
    "log_sigmoid": "log_sigmoid",
    "log_sigmoid_forward": "log_sigmoid",
    "softmax": "softmax",
    "_softmax": "softmax",
    "log_softmax": "log_softmax",
    "_log_softmax": "log_softmax",
    "dropout": "dropout",
    "native_dropout": "dropout",
    # element-wise arithmetic and comparisons
    "add": "add",
    "add_": "add",
    "sub": "sub",
    "rsub": "sub",
    "mul": "mul",
    "mul_": "mul",
    "div": "div",
    "div_": "div",
    "neg": "neg",
    "abs": "abs",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "pow": "pow",
    "exp": "exp",
    "log": "log",
    "sin": "exp",
    "cos": "exp",
    "reciprocal": "div",
    "sign": "sign",
    "sgn": "sign",
    "ceil": "round",
    "floor": "round",
    "round": "round",
    "trunc": "round",
    "floor_divide": "div",
    "remainder": "div",
    "fmod": "div",
    "masked_fill": "masked_fill",
    "masked_fill_": "masked_fill",
    "where": "where",
    "clamp": "clamp",
    "clamp_min": "clamp",
    "clamp_max": "clamp",
    "eq": "compare",
    "ne": "compare",
    "lt": "compare",
    "le": "compare",
    "gt": "compare",
    "ge": "compare",
    "__and__": "compare",
    "__or__": "compare",
    "bitwise_and": "compare",
    "bitwise_or": "compare",
    "bitwise_not": "compare",
    "bitwise_xor": "compare",
    "logical_and": "compare",
    "logical_or": "compare",
    "isinf": "compare",
    "isnan": "compare",
    "logical_not": "compare",
    "diff": "sub",
    "cumsum": "sum",
    "mean": "mean",
    "sum": "sum",
    "amax": "max",
    "max": "max",
    "argmax": "max",
    "min": "max",
    "amin": "max",
    "argmin": "max",
    "maximum": "clamp",
    "minimum": "clamp",
    "logsumexp": "sum",
    "var": "mean",
    "std": "mean",
    "cumprod": "sum",
    "prod": "sum",
    "all": "sum",
    "any": "sum",
    "linalg_vector_norm": "vector_norm",
    "norm": "vector_norm",
    "frobenius_norm": "vector_norm",
    # pooling
    "max_pool1d": "max_pool1d",
    "max_pool2d": "max_pool2d",
    "max_pool3d": "max_pool3d",
    "avg_pool1d": "avg_pool1d",
    "avg_pool2d": "avg_pool2d",
    "avg_pool3d": "avg_pool3d",
    "adaptive_avg_pool1d": "adaptive_avg_pool1d",
    "adaptive_avg_pool2d": "adaptive_avg_pool2d",
    "adaptive_avg_pool3d": "adaptive_avg_pool3d",
    "adaptive_max_pool1d": "adaptive_max_pool1d",
    "adaptive_max_pool2d": "adaptive_max_pool2d",
    # losses
    "cross_entropy_loss": "cross_entropy",
    "nll_loss": "nll_loss",
    "nll_loss_nd": "nll_loss",
    "mse_loss": "mse_loss",
    "l1_loss": "l1_loss",
    "binary_cross_entropy_with_logits": "bce_loss",
    # embedding
    "embedding": "embedding",
    # mixture-of-experts routing: selecting experts and moving tokens to and from them
    "topk": "topk",
    "sort": "topk",
    "one_hot": "one_hot",
    "index_select": "gather",
    "gather": "gather",
    "index": "gather",
    "nonzero": "gather",
    "scatter": "scatter",
    "scatter_add": "scatter",
    "scatter_": "scatter",
    "scatter_add_": "scatter",
    "scatter_reduce": "scatter",
    "scatter_reduce_": "scatter",
    "index_add": "scatter",
    "index_add_": "scatter",
    "index_put": "scatter",
    "index_put_": "scatter",
    "index_copy": "scatter",
    "bincount": "histogram",
    "_grouped_mm": "grouped_mm",
    "grouped_mm_fallback": "grouped_mm",
    "grouped_mm": "grouped_mm",
    "histc": "histogram",
    # views
    "view": "view",
    "_unsafe_view": "view",
    "reshape": "reshape",
    "flatten": "flatten",
    "unflatten": "reshape",
    "permute": "permute",
    "transpose": "transpose",
    "t": "transpose",
    "numpy_T": "transpose",
    "mT": "transpose",
    "adjoint": "transpose",
    "unsqueeze": "unsqueeze",
    "squeeze": "squeeze",
    "expand": "expand",
    "expand_as": "expand",
    "view_as": "view",
    "alias": "identity",
    "detach": "identity",
    "detach_": "identity",
    "lift_fresh_copy": "identity",
    # copies
    "cat": "cat",
    "concat": "cat",
    "stack": "stack",
    "slice": "slice",
    "select": "slice",
    "narrow": "slice",
    "split": "split",
    "split_with_sizes": "split",
    "unbind": "split",
    "chunk": "chunk",
    "contiguous": "contiguous",
    "clone": "clone",
    "copy_": "clone",
    "copy": "clone",
    "_to_copy": "to",
    "to": "to",
    "type_as": "to",
    "repeat": "clone",
    "repeat_interleave": "clone",
    "pad": "pad",
    "constant_pad_nd": "pad",
    "flip": "clone",
    "roll": "clone",
    "triu": "masked_fill",
    "tril": "masked_fill",
    # tensors made from a shape alone
    "zeros": "fill",
    "ones": "fill",
    "full": "fill",
    "empty": "fill",
    "arange": "fill",
    "zeros_like": "fill",
    "ones_like": "fill",
    "full_like": "fill",
    "empty_like": "fill",
    "new_zeros": "fill",
    "new_ones": "fill",
    "new_full": "fill",
    "new_empty": "fill",
    "scalar_tensor": "fill",
    "eye": "fill",
    "linspace": "fill",
    "randn": "fill",
    "rand": "fill",
    "fill_": "fill",
    "zero_": "fill",
}

#: Childless layers that are not ``torch.nn`` classes but one op each, matched on the class name
#: (pattern -> op type): GPT-2's ``Conv1D`` is a linear layer, the RMS norms of Llama-style models
#: (``T5LayerNorm`` is one), Hugging Face's activation modules and rotary-embedding tables.
CUSTOM_LEAVES: tuple[tuple[str, str], ...] = (
    (r"^Conv1D$", "linear"),
    (r"RMSNorm$|^T5LayerNorm$", "rms_norm"),
    (r"LayerNorm$", "layer_norm"),
    (r"GELU|Gelu", "gelu"),
    (r"SiLU|Swish", "silu"),
    (r"RotaryEmbedding$", "rotary_embedding"),
)

# ATen calls that are bookkeeping, not dataflow.
_SKIP = {"_assert_tensor_metadata", "sym_size", "sym_numel", "sym_stride", "_assert_async", "_assert_scalar"}


@dataclass(frozen=True)
class _Info:
    """One tensor value: its concrete shape, strides and dtype, and which axes follow the batch."""

    shape: Shape
    stride: tuple[int, ...]
    dtype: torch.dtype
    batch_axes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class _Group:
    """The ATen nodes of one op: a leaf-module call or a single tensor function."""

    name: str
    op_type: str
    nodes: list[fx.Node] = field(default_factory=list)
    module_path: str | None = None


class ExportError(ValueError):
    """``torch.export`` could not trace the module; the message names the op and the source line."""


def export_module(
    module: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> torch.export.ExportedProgram:
    """``torch.export.export(module, args, kwargs, strict=False)`` with dimension 0 of every tensor dynamic.

    Raises:
        ExportError: naming the failing op and the user source line from the exception's traceback.
    """
    kwargs = dict(kwargs or {})

    def dynamic(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return {0: torch.export.Dim.AUTO}
        return None

    shapes = {"args": tuple(dynamic(a) for a in args), **{k: dynamic(v) for k, v in kwargs.items()}}
    signature_names = _forward_arg_names(module, len(args))
    dynamic_shapes: Any = {**dict(zip(signature_names, shapes["args"], strict=False))}
    dynamic_shapes.update({k: v for k, v in shapes.items() if k != "args"})
    if len(signature_names) < len(args):  # *args: positional specs as a tuple
        dynamic_shapes = None
    module.eval()  # dropout and batch norm statistics: the graph of a training step is the same ops
    try:
        with quiet_fake_tensor_log():  # the ExportError says it once
            return torch.export.export(module, tuple(args), kwargs, strict=False, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        cache = _CACHE_OUTPUT.search(str(exc))
        if cache is not None:
            raise ExportError(
                f"torch.export could not trace {type(module).__name__}: its forward returns a key/value cache "
                f"({cache.group(1)}), which torch.export cannot return and a training step does not keep; expected "
                "a module whose outputs are tensors: turn caching off (config.use_cache = False, or pass "
                "use_cache=False to forward)"
            ) from exc
        raise ExportError(f"torch.export could not trace {type(module).__name__}: {_describe_failure(exc)}") from exc


#: torch.export's error for a cache object (transformers' ``DynamicCache``) among a module's outputs.
_CACHE_OUTPUT = re.compile(r"Found <class '([\w.]*Cache\w*)'> in output")


def _forward_arg_names(module: nn.Module, count: int) -> list[str]:
    import inspect

    params = [
        p
        for p in inspect.signature(module.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return [p.name for p in params[:count]]


def _describe_failure(exc: BaseException) -> str:
    """The exception's first line plus the innermost user-code frame (file:line and the source)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename}:{f.lineno}: {(f.line or '').strip()})"
    return f"{type(exc).__name__}: {first}{where}"


def from_export(
    module: nn.Module,
    example_inputs: Sequence[Any] = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    batch_size: int | None = None,
    metadata: dict[str, Any] | None = None,
    leaf_types: Mapping[type[nn.Module], str] | None = None,
    check_backward: bool = True,
) -> OpGraph:
    """Trace ``module`` with ``torch.export`` into an :class:`OpGraph` of its forward pass.

    The batch: dimension 0 of every tensor input is exported as a dynamic dimension, and the output
    axes whose extent is an expression of it are the sample dimensions. When export makes it a
    constant instead (the model calls ``len(x)`` or ``int(x.shape[0])``, or the batch is 1), the
    module is exported a second time at batch ``B + 1`` and the axes whose extent changed are the
    sample dimensions; ``metadata["batch_specialized"]`` names the source line. When the two graphs
    differ, or an op drops the batch axis without reducing it, the import is refused.

    Args:
        module: any module ``torch.export.export(..., strict=False)`` can trace; build it under
            ``torch.device("meta")`` so no weight is allocated. It is put in ``eval()`` mode.
        example_inputs: positional inputs of ``forward``; dimension 0 of every tensor is the batch.
        example_kwargs: keyword inputs of ``forward`` (tensors with the batch first, or plain values).
        name: the graph's name (default: the module's class name).
        batch_size: recorded on the graph (default: dimension 0 of the first tensor input).
        metadata: extra JSON-serializable notes stored on the graph.
        leaf_types: ``torch.nn`` layer class -> op type of the layers that are one op each (default the
            fx importer's table; a subclass of a listed class is a leaf too, and so is a class
            registered with :func:`placement_rl.graph.register_leaf`).
        check_backward: first run one forward and backward pass of the module on meta tensors
            (:func:`placement_rl.graph.tracing.check_training_step`: nothing allocated) and refuse a
            module whose training step fails; ``metadata["backward_check"]`` records the outcome.

    Key/value caching is turned off while the module is checked and exported
    (:func:`placement_rl.graph.tracing.cache_off`: a Hugging Face model built with its default
    ``use_cache=True`` would return a ``DynamicCache``); ``metadata["use_cache"]`` says so when it was on.

    Returns:
        The graph, ops in execution order, FLOPs from ``torch.utils.flop_counter``.

    Raises:
        ExportError: (a ``ValueError``) when export fails: the op and the source line are named; also
            when export made the batch a constant and a second export cannot recover it, or an op
            loses the batch axis (the op and the source line are named).
        ValueError: for inputs without a batch dimension; for a module whose backward pass fails.
    """

    tensors = [x for x in (*example_inputs, *(example_kwargs or {}).values()) if isinstance(x, torch.Tensor)]
    if not tensors:
        raise ValueError("from_export: no tensor among the example inputs; expected the inputs of forward()")
    for x in tensors:
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(
                f"from_export: an example input has shape {tuple(x.shape)}; expected a batch dimension of 1 or more"
            )
    batch = int(tensors[0].shape[0])
    if leaf_types is None:
        leaf_types = MODULE_TYPES
    # Inputs live where the weights live (meta for models built on it), as under fx; values are never read.
    weight: torch.Tensor | None = next(iter(module.parameters()), None)
    if weight is None:
        weight = next(iter(module.buffers()), None)

    def placed(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and weight is not None and x.device != weight.device:
            return torch.zeros(x.shape, dtype=x.dtype, device=weight.device)
        return x

    example_inputs = [placed(x) for x in example_inputs]
    example_kwargs = {k: placed(v) for k, v in (example_kwargs or {}).items()}
    # torch.export specializes a dimension of size 0 or 1: a batch of 1 is exported as 2, and the
    # graph's sizes are its symbolic sizes evaluated at 1.
    export_batch = max(batch, 2)
    export_args = [_grown(x, batch, export_batch) for x in example_inputs]
    export_kwargs = {k: _grown(v, batch, export_batch) for k, v in example_kwargs.items()}
    plus_vals: dict[fx.Node, Any] | None = None
    with cache_off(module, example_kwargs) as cache_note:
        backward_note = check_training_step(module, example_inputs, example_kwargs) if check_backward else None
        program = export_module(module, export_args, export_kwargs)
        specialized = _specialized_batch(program)
        if specialized is not None:
            if export_batch != batch:
                raise ExportError(
                    f"from_export: {specialized}; at batch {batch} a second export cannot recover the sample "
                    "dimensions (torch.export specializes sizes 0 and 1): import at batch 2 or more"
                )
            plus_vals = _export_at_next_batch(module, export_args, export_kwargs, program, specialized)
    builder = _ExportBuilder(program, module, leaf_types, batch, plus_vals, export_batch)
    ops, edges = builder.build()
    if builder.lost:
        node, group = builder.lost[0]
        raise ExportError(
            f"from_export: op {group.name!r} ({group.op_type}) reads a tensor that carries the batch but "
            f"none of its outputs does{_source_of(node)}: the batch dimension is lost there "
            f"({len(builder.lost)} such op(s)); a graph without it would replicate what follows on every "
            "data-parallel device. Keep the batch in that op's output (index with x.shape[0], not a "
            "constant), or reduce it away with a reduction (sum, mean, a loss)"
        )
    meta: dict[str, Any] = {
        "source": "torch.export",
        "module": type(module).__name__,
        "flop_fallback_ops": sorted(builder.fallback_types),
        "unknown_aten_ops": sorted(builder.unknown),
    }
    if specialized is not None:
        meta["batch_specialized"] = f"{specialized}; sample dimensions from a second export at batch {batch + 1}"
    if backward_note is not None:
        meta["backward_check"] = backward_note
    if cache_note is not None:
        meta["use_cache"] = cache_note
    meta["unknown_ops"] = report_unknown_ops("from_export", ops, builder.unknown)
    meta.update(metadata or {})
    return OpGraph(name or type(module).__name__, ops, edges, batch_size=batch_size or batch, metadata=meta)


def _specialized_batch(program: torch.export.ExportedProgram) -> str | None:
    """Where export made the batch a constant: ``None`` when dimension 0 of every tensor input is symbolic.

    Dimension 0 of every tensor input was exported as ``Dim.AUTO``; export specializes it to its
    example value when the code turns it into a Python int (``len(x)``, ``int(x.shape[0])``, a
    ``range`` over it), or when the example batch is 0 or 1. The description names the input and,
    when the shape environment recorded it, the source line that did it.
    """
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            continue
        size = val.shape[0]
        if isinstance(size, torch.SymInt) and size.node.expr.free_symbols:
            continue
        what = f"torch.export made the batch dimension of input {node.name!r} the constant {int(size)}"
        if isinstance(size, torch.SymInt):
            raw = getattr(size.node, "_expr", None)
            slocs = getattr(size.node.shape_env, "replacements_slocs", {})
            sloc = slocs.get(raw) if raw is not None else None
            frame = getattr(sloc, "framework_loc", None)
            if isinstance(frame, traceback.FrameSummary):
                return f"{what} at {frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
            if sloc is not None:
                return f"{what} at {sloc}"
        else:
            what = f"torch.export kept the batch dimension of input {node.name!r} static"
        return what
    return None


def _export_at_next_batch(
    module: nn.Module,
    example_inputs: Sequence[Any],
    example_kwargs: Mapping[str, Any],
    program: torch.export.ExportedProgram,
    specialized: str,
) -> dict[fx.Node, Any]:
    """The values (fake tensors) of ``program``'s nodes when exported at batch ``B + 1``, node for node.

    Raises:
        ExportError: when the second export fails or its graph is not the first one's, node for node
            (the batch then decides control flow, and no one graph describes every batch).
    """

    batch = next(int(x.shape[0]) for x in (*example_inputs, *example_kwargs.values()) if isinstance(x, torch.Tensor))
    try:
        plus = export_module(
            module,
            [_grown(x, batch, batch + 1) for x in example_inputs],
            {k: _grown(v, batch, batch + 1) for k, v in example_kwargs.items()},
        )
    except ExportError as exc:
        raise ExportError(f"from_export: {specialized}, and exporting at batch {batch + 1} failed: {exc}") from exc
    nodes, plus_nodes = list(program.graph.nodes), list(plus.graph.nodes)
    same = len(nodes) == len(plus_nodes) and all(
        a.op == b.op and a.target == b.target for a, b in zip(nodes, plus_nodes, strict=True)
    )
    if not same:
        raise ExportError(
            f"from_export: {specialized}, and the graph exported at batch {batch + 1} differs from the one at "
            f"batch {batch}, so the sample dimensions cannot be recovered. Keep the batch symbolic on that line "
            "(x.shape[0] instead of len(x) or int(...)), or import with tracer='fx'"
        )
    return {a: b.meta.get("val") for a, b in zip(nodes, plus_nodes, strict=True)}


def _grown(x: Any, batch: int, new_batch: int) -> Any:
    """A tensor of ``batch`` samples grown to ``new_batch`` with copies of its first (the values stay valid)."""
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch and new_batch > batch:
        return torch.cat([x, x[:1].expand(new_batch - batch, *x.shape[1:])])
    return x


def _source_of(node: fx.Node) -> str:
    """`` at file:line: code`` of the innermost frame of ``node``'s stack trace (empty when it has none)."""
    trace = str(node.meta.get("stack_trace") or "")
    found = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', trace)
    if not found:
        return ""
    filename, line, code = found[-1]
    return f" (at {filename}:{line}: {code.strip()})"


class _ExportBuilder:
    """Groups an exported program's ATen nodes into ops and counts their FLOPs with the registry."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        module: nn.Module,
        leaf_types: Mapping[type[nn.Module], str],
        batch: int,
        plus_vals: Mapping[fx.Node, Any] | None = None,
        export_batch: int | None = None,
    ) -> None:
        self.program = program
        self.export_batch = batch if export_batch is None else export_batch
        self.graph = program.graph
        self.modules = dict(module.named_modules())
        self.leaf_types = leaf_types
        self.batch = batch
        sig = program.graph_signature
        self.param_of: dict[str, str] = dict(sig.inputs_to_parameters)
        self.buffer_of: dict[str, str] = dict(sig.inputs_to_buffers)
        self.user_inputs = set(sig.user_inputs)
        self.state = program.state_dict
        self.constants = program.constants
        self.batch_symbols = self._batch_symbols()
        self.info: dict[fx.Node, Any] = {}
        self.requires_grad: dict[fx.Node, bool] = {}
        self.unknown: set[str] = set()
        self.fallback_types: set[str] = set()
        self.flop_cache: dict[Any, tuple[float, float]] = {}
        # batch specialized by export: a node's sample axes are those whose extent differs at batch B + 1
        self.plus_vals = plus_vals
        self.plus_int = _ExportBuilder._int_at(batch + 1)
        #: ops that read a tensor carrying the batch but output none: (first node, group)
        self.lost: list[tuple[fx.Node, _Group]] = []

    # ------------------------------------------------------------------ shapes
    def _batch_symbols(self) -> set[Any]:
        symbols: set[Any] = set()
        for node in self.graph.nodes:
            if node.op == "placeholder" and node.name in self.user_inputs:
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor) and val.dim() > 0 and isinstance(val.shape[0], torch.SymInt):
                    symbols |= set(val.shape[0].node.expr.free_symbols)
        return symbols

    def _int(self, value: Any) -> int:
        """A concrete size: the batch symbols evaluated at the batch, the other symbols at their hints."""
        if isinstance(value, torch.SymInt) and self.export_batch != self.batch:
            expr = value.node.expr
            if expr.free_symbols & self.batch_symbols:
                # export may have run at another batch (2 for a batch of 1): substitute the batch itself
                env = value.node.shape_env
                known = getattr(env, "backed_var_to_val", None) or env.var_to_val
                values = {
                    s: self.batch if s in self.batch_symbols else known.get(s, self.batch) for s in expr.free_symbols
                }
                return int(expr.subs(values))
        return _ExportBuilder._int_at(self.batch)(value)

    @staticmethod
    def _int_at(batch: int) -> Callable[[Any], int]:
        def concrete(value: Any) -> int:
            if isinstance(value, torch.SymInt):
                hint = value.node.hint
                if hint is not None:
                    return int(hint)
                expr = value.node.expr
                return int(expr.subs({s: batch for s in expr.free_symbols}))
            return int(value)

        return concrete

    def _describe(self, val: Any, plus: Any = None) -> Any:
        """``val`` as :class:`_Info` (tuples recurse); ``plus`` is the value at batch ``B + 1``, if exported."""
        if isinstance(val, torch.Tensor):
            shape = tuple(self._int(d) for d in val.shape)
            stride = tuple(self._int(s) for s in val.stride())
            if self.plus_vals is not None:
                other = tuple(self.plus_int(d) for d in plus.shape) if isinstance(plus, torch.Tensor) else ()
                axes = tuple(i for i, (a, b) in enumerate(zip(shape, other, strict=False)) if a != b)
                if len(other) != len(shape):
                    axes = ()
            else:
                axes = tuple(
                    i
                    for i, d in enumerate(val.shape)
                    if isinstance(d, torch.SymInt) and d.node.expr.free_symbols & self.batch_symbols
                )
            return _Info(shape, stride, val.dtype, axes)
        if isinstance(val, (tuple, list)):
            others = list(plus) if isinstance(plus, (tuple, list)) and len(plus) == len(val) else [None] * len(val)
            return tuple(self._describe(v, o) for v, o in zip(val, others, strict=True))
        return None

    # ------------------------------------------------------------------ grouping
    def _leaf(self, node: fx.Node) -> tuple[str, str, str] | None:
        """``(call key, module path, op type)`` of the outermost leaf layer that issued ``node``."""
        stack = node.meta.get("nn_module_stack") or {}
        for key, entry in stack.items():
            path = entry[0] if isinstance(entry, tuple) else str(entry)
            mod = self.modules.get(path)
            if mod is None:
                continue
            op_type = leaf_op_type(mod, self.leaf_types)
            if op_type is None and not any(True for _ in mod.children()):
                cls = type(mod).__name__
                op_type = next((t for pattern, t in CUSTOM_LEAVES if re.search(pattern, cls)), None)
            if op_type is not None:
                return key, path, op_type
        return None

    def _groups(self) -> list[_Group]:
        groups: list[_Group] = []
        by_call: dict[tuple[str, int], _Group] = {}
        calls: dict[str, int] = {}
        last_key: str | None = None
        names: set[str] = set()

        def unique(base: str) -> str:
            candidate, k = base, 1
            while candidate in names:
                candidate = f"{base}_{k}"
                k += 1
            names.add(candidate)
            return candidate

        for node in self.graph.nodes:
            if node.op != "call_function":
                last_key = None
                continue
            if _aten_name(node.target) in _SKIP:
                continue
            leaf = self._leaf(node)
            if leaf is None:
                last_key = None
                if node.target is operator.getitem and node.args[0] in self._group_of:
                    self._group_of[node] = self._group_of[node.args[0]]
                    self._group_of[node].nodes.append(node)
                    continue
                source = node.args[0] if node.args else None
                if (
                    _aten_name(node.target) == "slice"
                    and isinstance(source, fx.Node)
                    and isinstance(self.info.get(node), _Info)
                    and isinstance(self.info.get(source), _Info)
                    and self.info[node].shape == self.info[source].shape
                ):
                    # ``x[:, t]`` exports as a full slice of axis 0, then a select: the full slice is
                    # no op (fx sees one indexing call), its readers read its source.
                    self._transparent[node] = source
                    continue
                group = _Group(unique(node.name), _aten_type(node.target))
                groups.append(group)
                group.nodes.append(node)
                self._group_of[node] = group
                continue
            key, path, op_type = leaf
            if key != last_key:  # a new call of this layer (an unrolled LSTM calls one layer many times)
                calls[key] = calls.get(key, -1) + 1
            last_key = key
            call = (key, calls[key])
            if call not in by_call:
                base = path.replace(".", "_") or type(self.modules[path]).__name__.lower()
                by_call[call] = _Group(unique(base), op_type, module_path=path)
                groups.append(by_call[call])
            by_call[call].nodes.append(node)
            self._group_of[node] = by_call[call]
        return groups

    # ------------------------------------------------------------------ build
    def build(self) -> tuple[list[Op], list[Tensor]]:
        self._group_of: dict[fx.Node, _Group] = {}
        self._transparent: dict[fx.Node, fx.Node] = {}
        for node in self.graph.nodes:
            plus = self.plus_vals.get(node) if self.plus_vals is not None else None
            self.info[node] = self._describe(node.meta.get("val"), plus)
            if node.op == "placeholder":
                self.requires_grad[node] = node.name in self.param_of
            elif node.op == "call_function":
                floating = any(t.dtype.is_floating_point for t in _flat(self.info[node]))
                self.requires_grad[node] = floating and any(
                    self.requires_grad.get(a, False) for a in node.all_input_nodes
                )
        groups = self._groups()
        ops: list[Op] = []
        edges: list[Tensor] = []
        # node -> (op name, flat output index of its first tensor) for nodes visible outside their op
        where: dict[fx.Node, tuple[str, int]] = {}
        outputs_of: dict[str, list[_Info]] = {}
        sample_of: dict[str, list[int | None]] = {}
        used_outside = self._used_outside()
        input_names: dict[fx.Node, str] = {}
        key_bytes: dict[str, int] = {}
        owned: set[str] = set()
        # graph inputs (user inputs that carry tensors) are ops of type "input", as in the fx importer
        for node in self.graph.nodes:
            if node.op == "placeholder" and node.name in self.user_inputs and isinstance(self.info[node], _Info):
                info = self.info[node]
                ops.append(self._op(node.name, "input", [info], [], 0.0, 0.0, 0, None, False))
                where[node] = (node.name, 0)
                outputs_of[node.name] = [info]
                sample_of[node.name] = [info.batch_axes[0] if info.batch_axes else None]
                input_names[node] = node.name
        for group in groups:
            members = set(group.nodes)
            # Buffers and constants read by a tensor function: a "constant" op at first use. A layer's
            # own buffers (batch norm statistics) are its state, like its parameters, as under fx.
            for n in group.nodes if group.module_path is None else ():
                for a in n.all_input_nodes:
                    if a.op == "placeholder" and a not in where and isinstance(self.info[a], _Info):
                        if a.name in self.param_of or a.name in self.user_inputs:
                            continue
                        info = self.info[a]
                        ops.append(self._op(a.name, "constant", [info], [], 0.0, 0.0, 0, None, True))
                        where[a] = (a.name, 0)
                        outputs_of[a.name] = [info]
                        sample_of[a.name] = [None]
            outs: list[fx.Node] = []
            for n in group.nodes:
                if n.target is operator.getitem and n.args[0] in members:
                    continue  # its producer's outputs cover it
                if group.module_path is None or n in used_outside:
                    if _flat(self.info[n]):
                        outs.append(n)
            flat_out: list[_Info] = []
            for n in outs:
                where[n] = (group.name, len(flat_out))
                flat_out.extend(_flat(self.info[n]))
            for n in group.nodes:  # getitem of a multi-output node in the group: an alias into it
                producer, index = (n.args[0], n.args[1]) if n.target is operator.getitem else (None, None)
                if isinstance(producer, fx.Node) and producer in where and isinstance(index, int):
                    src, base = where[producer]
                    parts = self.info[producer]
                    if isinstance(parts, tuple):
                        offset = base + sum(len(_flat(p)) for p in parts[:index])
                        where[n] = (src, offset)
            if not flat_out:
                continue
            # inputs: tensors produced outside this op and read by it, each (producer, index) once
            ins: list[tuple[str, int, _Info]] = []
            seen: set[tuple[str, int]] = set()
            params: dict[str, torch.Tensor] = {}
            for n in group.nodes:
                for a in map(self._resolve, n.all_input_nodes):
                    if a in members:
                        continue
                    if a.op == "placeholder" and a.name in self.param_of:
                        fqn = self.param_of[a.name]
                        params[fqn] = self.state[fqn]
                        continue
                    if a not in where:
                        continue  # a value of no tensor (a shape, a scalar)
                    src, idx = where[a]
                    for k, info in enumerate(_flat(self.info[a])):
                        if (src, idx + k) not in seen:
                            seen.add((src, idx + k))
                            ins.append((src, idx + k, info))
            op_type = group.op_type
            kind = op_kind(op_type)
            if op_type not in OP_KINDS:
                self.unknown.add(op_type)
            fwd, bwd = self._flops(group, kind, flat_out, [i for _, _, i in ins])
            param_key: str | None = None
            param_bytes = 0
            if params:
                param_key = group.module_path or "+".join(sorted(params))
                if param_key not in key_bytes:
                    total = 0
                    for fqn, p in params.items():
                        if fqn not in owned:
                            owned.add(fqn)
                            total += p.numel() * p.element_size()
                    key_bytes[param_key] = total
                param_bytes = key_bytes[param_key]
            if op_type == "fill":
                ins = []
            samples = [t.batch_axes[0] if t.batch_axes else None for t in flat_out]
            sample_of[group.name] = samples
            # the first input that carries the batch: the axis a reduction (a loss) may reduce away
            reduce_axis: tuple[int, int] | None = None
            for src, idx, info in ins:
                axes = sample_of.get(src, [])
                axis = axes[idx] if idx < len(axes) else None
                if axis is not None:
                    reduce_axis = (axis, info.shape[axis])
                    break
            in_shape = ins[0][2].shape if ins else None
            dims, split = parallel_dims(kind, flat_out[0].shape, samples[0], reduce_axis, param_bytes > 0, in_shape)
            if reduce_axis is not None and all(a is None for a in samples) and not dims and op_type != "fill":
                self.lost.append((group.nodes[0], group))
            in_bytes = sum(i.nbytes for _, _, i in ins)
            out_bytes = sum(t.nbytes for t in flat_out)
            read, written = (in_bytes + param_bytes, out_bytes) if kind.moves_bytes else (0, 0)
            ops.append(
                Op(
                    name=group.name,
                    op_type=op_type,
                    output_shapes=tuple(t.shape for t in flat_out),
                    dtype_bytes=flat_out[0].dtype.itemsize,
                    forward_flops=float(fwd),
                    backward_flops=float(bwd),
                    param_bytes=int(param_bytes),
                    param_key=param_key,
                    bytes_read=int(read),
                    bytes_written=int(written),
                    parallel_dims=dims,
                    split=split,
                )
            )
            outputs_of[group.name] = flat_out
            for src, idx, info in ins:
                edges.append(Tensor(src=src, dst=group.name, shape=info.shape, num_bytes=info.nbytes, src_output=idx))
        return ops, edges

    def _op(
        self,
        name: str,
        op_type: str,
        flat: list[_Info],
        ins: list[_Info],
        fwd: float,
        bwd: float,
        param_bytes: int,
        param_key: str | None,
        moves: bool,
    ) -> Op:
        sample = flat[0].batch_axes[0] if flat[0].batch_axes else None
        dims = (ParallelDim("sample", "sample", sample, flat[0].shape[sample]),) if sample is not None else ()
        return Op(
            name=name,
            op_type=op_type,
            output_shapes=tuple(t.shape for t in flat),
            dtype_bytes=flat[0].dtype.itemsize,
            forward_flops=fwd,
            backward_flops=bwd,
            param_bytes=param_bytes,
            param_key=param_key,
            bytes_read=0,
            bytes_written=sum(t.nbytes for t in flat),
            parallel_dims=dims,
            split="concat" if dims else "none",
        )

    def _resolve(self, node: fx.Node) -> fx.Node:
        """The node whose value ``node`` passes on unchanged (itself unless it is a full slice)."""
        while node in self._transparent:
            node = self._transparent[node]
        return node

    def _used_outside(self) -> set[fx.Node]:
        """Nodes read by a node of another op (or by the graph's output)."""
        used: set[fx.Node] = set()
        for node in self.graph.nodes:
            if node.op not in ("call_function", "output"):
                continue
            if node in self._transparent:
                continue
            mine = self._group_of.get(node)
            for a in map(self._resolve, node.all_input_nodes):
                if a.op != "call_function":
                    continue
                if mine is None or self._group_of.get(a) is not mine:
                    used.add(a)
                    # reading one output of a multi-output node makes the producer visible too
                    if a.target is operator.getitem and isinstance(a.args[0], fx.Node):
                        used.add(a.args[0])
        return used

    # ------------------------------------------------------------------ FLOPs
    def _flops(self, group: _Group, kind: OpKind, flat_out: list[_Info], ins: list[_Info]) -> tuple[float, float]:
        fwd = bwd = 0.0
        for n in group.nodes:
            if n.target is operator.getitem:
                continue
            f, b = self._node_flops(n)
            fwd += f
            bwd += b
        if fwd == 0.0 and kind.family == "other":
            largest = max([math.prod(t.shape) for t in (*flat_out, *ins)])
            return 8.0 * largest, 8.0 * largest * kind.backward_factor
        if fwd == 0.0 and kind.flop_rule not in ("none",):
            self.fallback_types.add(group.op_type)
        return fwd, bwd

    def _grouped_mm_flops(self, node: fx.Node) -> tuple[float, float]:
        shapes = _grouped_mm_shapes(self, node)
        if shapes is None:
            return 0.0, 0.0
        a, b = shapes
        flops = 2.0 * math.prod(a.shape[:-1]) * a.shape[-1] * b.shape[-1]
        needs = [self.requires_grad.get(x, False) for x in node.args[:2] if isinstance(x, fx.Node)]
        return flops, flops * sum(needs)

    def _node_flops(self, node: fx.Node) -> tuple[float, float]:
        """Forward and backward FLOPs of one ATen node from ``FlopCounterMode``, run on meta tensors."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or _aten_type(target) in _NO_COMPUTE:
            return 0.0, 0.0  # Python calls in the graph (``_set_grad_enabled``) are not run
        name = _aten_name(target)
        if name in _GROUPED_MM:
            return self._grouped_mm_flops(node)
        grads: list[torch.Tensor] = []

        def concrete(a: Any) -> Any:
            if isinstance(a, fx.Node):
                info = self.info.get(a)
                if isinstance(info, _Info):
                    t = torch.empty_strided(info.shape, info.stride, dtype=info.dtype, device="meta")
                    if self.requires_grad.get(a, False) and info.dtype.is_floating_point:
                        t.requires_grad_(True)
                        grads.append(t)
                    return t
                if isinstance(info, tuple):
                    return [concrete_info(i) for i in info]
                val = a.meta.get("val")
                return self._int(val) if isinstance(val, torch.SymInt) else val
            if isinstance(a, (list, tuple)):
                return type(a)(concrete(x) for x in a)
            if isinstance(a, torch.SymInt):
                return self._int(a)
            return a

        def concrete_info(info: Any) -> Any:
            if isinstance(info, _Info):
                return torch.empty_strided(info.shape, info.stride, dtype=info.dtype, device="meta")
            return info

        key = (target, _signature(node.args, self), _signature(tuple(node.kwargs.items()), self))
        if key in self.flop_cache:
            return self.flop_cache[key]
        try:
            args = concrete(node.args)
            kwargs = {k: concrete(v) for k, v in node.kwargs.items()}
            with torch.enable_grad(), FlopCounterMode(display=False) as counter:
                out = _call(target, args, kwargs)
            fwd = float(counter.get_total_flops())
            bwd = 0.0
            outs = [o for o in _flat_values(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if fwd > 0 and outs and grads:
                with torch.enable_grad(), FlopCounterMode(display=False) as counter:
                    torch.autograd.grad(outs, grads, [torch.ones_like(o) for o in outs], allow_unused=True)
                bwd = float(counter.get_total_flops())
        except Exception:  # an op that does not run on meta tensors: counted by the fallback
            fwd, bwd = 0.0, 0.0
        self.flop_cache[key] = (fwd, bwd)
        return fwd, bwd


#: Grouped matrix products of mixture-of-experts layers, which the registry has no formula for:
#: ``a (M, K)`` rows, split into groups by ``offsets``, times ``b (E, K, N)``: ``2 * M * K * N``
#: forward; backward ``2 * M * K * N`` for each of ``a`` and ``b`` that needs a gradient.
_GROUPED_MM = {"_grouped_mm", "grouped_mm_fallback", "grouped_mm"}

_NO_COMPUTE = VIEW_OPS | {
    "cat",
    "stack",
    "slice",
    "split",
    "chunk",
    "contiguous",
    "clone",
    "to",
    "pad",
    "fill",
    "compare",
    "embedding",
    "gather",
    "scatter",
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "where",
    "masked_fill",
}


def _grouped_mm_shapes(builder: _ExportBuilder, node: fx.Node) -> tuple[_Info, _Info] | None:
    tensors = [builder.info.get(a) for a in node.args[:2] if isinstance(a, fx.Node)]
    if len(tensors) == 2 and all(isinstance(t, _Info) for t in tensors):
        return tensors[0], tensors[1]  # type: ignore[return-value]
    return None


def _call(target: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    return target(*args, **kwargs)


def _signature(value: Any, builder: _ExportBuilder) -> Any:
    """A hashable description of node arguments: tensors by shape, stride, dtype and grad flag."""
    if isinstance(value, fx.Node):
        info = builder.info.get(value)
        if isinstance(info, _Info):
            return ("T", info.shape, info.stride, str(info.dtype), builder.requires_grad.get(value, False))
        val = value.meta.get("val")
        return ("V", builder._int(val) if isinstance(val, torch.SymInt) else repr(val))
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v, builder) for v in value)
    if isinstance(value, torch.SymInt):
        return builder._int(value)
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return repr(value)


def _flat(value: Any) -> list[_Info]:
    if isinstance(value, _Info):
        return [value]
    if isinstance(value, tuple):
        return [t for v in value for t in _flat(v)]
    return []


def _flat_values(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat_values(v)]
    return [value]


def _aten_name(target: Any) -> str:
    """``aten.linear.default`` -> ``linear``; a Python function -> its ``__name__``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target._opname)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name.split("::")[-1])
    return str(getattr(target, "__name__", target))


def _aten_type(target: Any) -> str:
    """The taxonomy's op type of an ATen call (its own name when :data:`ATEN_TYPES` has none)."""
    name = _aten_name(target)
    return ATEN_TYPES.get(name, name)


__all__ = ["ATEN_TYPES", "CUSTOM_LEAVES", "ExportError", "export_module", "from_export"]
