"""What both importers share: module types traced as one op, the SOAP dimensions rule, the training
check, key/value caching turned off (:func:`cache_off`) and the report of op types without a formula.

:mod:`placement_rl.graph.importer` (``torch.fx``) and :mod:`placement_rl.graph.aten`
(``torch.export``) both import from here; neither imports the other's internals.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from placement_rl.graph.ir import Op, ParallelDim, Shape, SplitClass
from placement_rl.ops import OpKind

#: Module classes traced as one op (a leaf of the trace), by op type.
MODULE_TYPES: dict[type[nn.Module], str] = {
    nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d",
    nn.Conv3d: "conv3d",
    nn.ConvTranspose2d: "conv_transpose2d",
    nn.Linear: "linear",
    nn.BatchNorm1d: "batch_norm",
    nn.BatchNorm2d: "batch_norm",
    nn.BatchNorm3d: "batch_norm",
    nn.LayerNorm: "layer_norm",
    nn.GroupNorm: "group_norm",
    nn.InstanceNorm1d: "instance_norm",
    nn.InstanceNorm2d: "instance_norm",
    nn.InstanceNorm3d: "instance_norm",
    nn.LocalResponseNorm: "local_response_norm",
    nn.RMSNorm: "rms_norm",
    nn.Embedding: "embedding",
    nn.LSTMCell: "lstm_cell",
    nn.GRUCell: "gru_cell",
    nn.RNNCell: "rnn_cell",
    nn.LSTM: "lstm",
    nn.GRU: "gru",
    nn.RNN: "rnn",
    nn.MaxPool1d: "max_pool1d",
    nn.MaxPool2d: "max_pool2d",
    nn.MaxPool3d: "max_pool3d",
    nn.AvgPool1d: "avg_pool1d",
    nn.AvgPool2d: "avg_pool2d",
    nn.AvgPool3d: "avg_pool3d",
    nn.AdaptiveAvgPool1d: "adaptive_avg_pool1d",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d",
    nn.AdaptiveAvgPool3d: "adaptive_avg_pool3d",
    nn.AdaptiveMaxPool1d: "adaptive_max_pool1d",
    nn.AdaptiveMaxPool2d: "adaptive_max_pool2d",
    nn.AdaptiveMaxPool3d: "adaptive_max_pool3d",
    nn.ReLU: "relu",
    nn.ReLU6: "relu6",
    nn.GELU: "gelu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
    nn.ELU: "elu",
    nn.LeakyReLU: "leaky_relu",
    nn.Softplus: "softplus",
    nn.LogSigmoid: "log_sigmoid",
    nn.Hardtanh: "hardtanh",
    nn.Dropout: "dropout",
    nn.Dropout1d: "dropout",
    nn.Dropout2d: "dropout",
    nn.Dropout3d: "dropout",
    nn.Softmax: "softmax",
    nn.LogSoftmax: "log_softmax",
    nn.CrossEntropyLoss: "cross_entropy",
    nn.NLLLoss: "nll_loss",
    nn.MSELoss: "mse_loss",
    nn.L1Loss: "l1_loss",
    nn.BCEWithLogitsLoss: "bce_loss",
    nn.Identity: "identity",
    nn.Flatten: "flatten",
    nn.MultiheadAttention: "multihead_attention",
}


def report_unknown_ops(front: str, ops: Sequence[Op], unknown: set[str]) -> list[dict[str, Any]]:
    """Warn once about the op types an import has no taxonomy row (or no formula) for, and list them.

    Args:
        front: the function named in the warning (``"from_torch"``, ``"from_export"``).
        ops: the graph's ops.
        unknown: the op types to report.

    Returns:
        One JSON-ready row per type, sorted by FLOP share: ``{"op_type", "count", "forward_flops",
        "flop_share"}`` (``flop_share``: its ops' share of the graph's forward FLOPs, in [0, 1]).
    """
    if not unknown:
        return []
    total = sum(op.forward_flops for op in ops)
    rows: list[dict[str, Any]] = []
    for op_type in unknown:
        flops = sum(op.forward_flops for op in ops if op.op_type == op_type)
        count = sum(op.op_type == op_type for op in ops)
        rows.append(
            {
                "op_type": op_type,
                "count": count,
                "forward_flops": flops,
                "flop_share": flops / total if total > 0 else 0.0,
            }
        )
    rows.sort(key=lambda r: (-r["flop_share"], r["op_type"]))
    listing = ", ".join(f"{r['op_type']} (x{r['count']}, {100 * r['flop_share']:.3g}% of forward FLOPs)" for r in rows)
    warnings.warn(
        f"{front}: no FLOP formula for op type(s) {listing}: no row in the op taxonomy (placement_rl.ops), "
        "or one whose formula lacks what it needs; family 'other' (no parallel dimension but the batch), "
        "charged 8 FLOPs per element of the largest input or output where nothing counted them",
        UserWarning,
        stacklevel=_caller_outside_the_importer(),
    )
    return rows


def _caller_outside_the_importer() -> int:
    """``warnings.warn``'s ``stacklevel`` of the first caller outside ``placement_rl.graph`` (the user's line)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)  # the function that warns
    level = 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame = frame.f_back
        level += 1
    return level


@contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Silence ``FakeTensorMode``'s log of every meta kernel that fails (a traceback on stderr each) for the
    block: the importers report such a failure once, in their error."""
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, fake_log.disabled = fake_log.disabled, True
    try:
        yield
    finally:
        fake_log.disabled = was_disabled


@contextmanager
def cache_off(module: nn.Module, example_kwargs: Mapping[str, Any] | None = None) -> Iterator[str | None]:
    """Turn key/value caching off in the configs of ``module`` and its submodules for the block.

    A Hugging Face model built with its default ``use_cache=True`` returns a ``DynamicCache`` object,
    which ``torch.export`` cannot return and a training step does not keep: every ``config`` attribute of
    the module tree (and its nested configs, ``text_config``, ...) whose ``use_cache`` is ``True`` gets
    ``False`` inside the block and its value back afterwards, so the caller's module is unchanged.
    Nothing is changed when ``example_kwargs`` passes ``use_cache`` itself.

    Yields:
        A note naming what was turned off (for the graph's ``metadata["use_cache"]``), or ``None``
        when nothing was.
    """
    changed: list[tuple[Any, str]] = []
    if example_kwargs is None or "use_cache" not in example_kwargs:
        seen: set[int] = set()
        for path, sub in module.named_modules():
            stack = [(f"{path + '.' if path else ''}config", getattr(sub, "config", None))]
            while stack:
                where, config = stack.pop()
                if config is None or id(config) in seen or not hasattr(config, "use_cache"):
                    continue
                seen.add(id(config))
                if getattr(config, "use_cache", None) is True:
                    changed.append((config, where))
                for name in getattr(type(config), "sub_configs", None) or {}:
                    stack.append((f"{where}.{name}", getattr(config, name, None)))
    try:
        for config, _ in changed:
            config.use_cache = False
        yield (
            f"turned off for the import: {', '.join(f'{w}.use_cache' for _, w in changed)} was True (a training "
            "step keeps no key/value cache, and torch.export cannot return one); the module's config is unchanged"
            if changed
            else None
        )
    finally:
        for config, _ in changed:
            config.use_cache = True


def check_training_step(
    module: nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None = None
) -> str:
    """Run one forward and backward pass of ``module`` on meta tensors; refuse it if training would fail.

    The parameters, buffers and inputs are ``meta`` tensors of their shapes, dtypes and strides
    (tensors the forward pass creates without naming a device are meta too): nothing is allocated or
    computed, a model with real weights is not copied, and the module is not modified
    (``torch.func.functional_call``; it runs in training mode and gets its mode back). Autograd
    records the pass as it would on a GPU, version counters included, so an in-place op on a tensor
    that a backward needs fails here as it would in training. Backward starts from the sum of the
    floating-point tensors of the output (a loss, or a tuple, list, dict or ``ModelOutput`` of
    tensors) and asks for the gradients of the parameters (of the floating-point inputs when no
    parameter needs one) without storing them (``torch.autograd.grad``).

    Args:
        module: the module to check.
        example_inputs: positional inputs of ``forward`` (only shapes and dtypes are read).
        example_kwargs: keyword inputs of ``forward``.

    Returns:
        ``"passed"``, or ``"skipped: <why>"`` when the pass cannot run on meta tensors at all (an op
        without a meta kernel, ``.item()``, control flow on values) or nothing needs a gradient.

    Raises:
        ValueError: naming the error and, where autograd's anomaly mode finds it, the forward source
            line of the op whose backward failed, when the forward pass fails only with autograd on
            (an in-place op on a leaf that requires grad) or the backward pass fails (an in-place op
            on a tensor its backward needs).
    """
    note = _training_step(module, example_inputs, example_kwargs or {}, fake=False)
    if note.startswith("skipped: the forward pass"):
        # Code that reads values (``.item()``, Hugging Face's mask preparation) fails on meta tensors but
        # takes its tracing path on fake ones: slower (Python dispatch), so only as the second try.
        note = _training_step(module, example_inputs, example_kwargs or {}, fake=True)
    return note


def _training_step(
    module: nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any], *, fake: bool
) -> str:
    """:func:`check_training_step` on meta tensors, or with ``fake`` on fake tensors of the meta device."""
    if fake:
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            UnsupportedOperatorException,
        )
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

        unsupported: tuple[type[BaseException], ...] = (
            DataDependentOutputException,
            DynamicOutputShapeException,
            UnsupportedOperatorException,
            GuardOnDataDependentSymNode,
            NotImplementedError,
        )
        # FakeTensorMode logs the traceback of every meta kernel that fails: the check reports it once
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        was_disabled, fake_log.disabled = fake_log.disabled, True
        try:
            with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
                return _run_training_step(module, example_inputs, example_kwargs, "fake", unsupported)
        finally:
            fake_log.disabled = was_disabled
    return _run_training_step(module, example_inputs, example_kwargs, "meta", (NotImplementedError,))


def _run_training_step(
    module: nn.Module,
    example_inputs: Sequence[Any],
    example_kwargs: Mapping[str, Any],
    what: str,
    unsupported: tuple[type[BaseException], ...],
) -> str:
    label = type(module).__name__

    def meta(t: torch.Tensor, grad: bool) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta", requires_grad=grad)

    params = {n: meta(p, p.requires_grad and p.is_floating_point()) for n, p in module.named_parameters()}
    state: dict[str, torch.Tensor] = {**params, **{n: meta(b, False) for n, b in module.named_buffers()}}
    wanted = [p for p in params.values() if p.requires_grad]
    grad_inputs = not wanted  # no trainable parameter: differentiate with respect to the inputs

    def meta_input(x: Any) -> Any:
        return meta(x, grad_inputs and x.is_floating_point()) if isinstance(x, torch.Tensor) else x

    args = tuple(meta_input(x) for x in example_inputs)
    kwargs = {k: meta_input(v) for k, v in example_kwargs.items()}
    if grad_inputs:
        wanted = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not wanted:
        return "skipped: no parameter or input needs a gradient"

    def forward() -> Any:
        # tensors the forward pass makes without naming a device are meta tensors too
        with torch.device("meta"):
            return torch.func.functional_call(module, state, args, kwargs, strict=False)

    was_training = module.training
    module.train()
    try:
        try:
            with torch.enable_grad():
                out = forward()
        except Exception as exc:
            try:
                with torch.no_grad():
                    forward()
            except Exception:
                return f"skipped: the forward pass does not run on {what} tensors ({_first_line(exc)})"
            raise ValueError(
                f"the training step of {label} fails in its forward pass once autograd records it: "
                f"{_first_line(exc)}{_user_frame(exc)}"
            ) from exc
        outputs = [t for t in _tensor_leaves(out) if t.requires_grad and t.is_floating_point()]
        if not outputs:
            return "skipped: no floating-point output depends on a parameter"
        try:
            torch.autograd.grad([t.sum() for t in outputs], wanted, allow_unused=True)
        except unsupported as exc:  # a backward kernel without a meta implementation
            return f"skipped: the backward pass does not run on {what} tensors ({_first_line(exc)})"
        except Exception as exc:
            raise ValueError(
                f"the training step of {label} fails in its backward pass: {_first_line(exc)}"
                f"{_anomaly_source(forward, wanted)}"
            ) from exc
    finally:
        module.train(was_training)
    return "passed"


def forward_error(
    module: nn.Module, example_inputs: Sequence[Any], example_kwargs: Mapping[str, Any] | None = None
) -> str | None:
    """Why ``module``'s forward refuses these inputs, ``None`` when it takes them (or cannot tell).

    The forward pass runs once without autograd on meta tensors of the parameters' and inputs' shapes,
    then, where that fails, on fake tensors (code that reads values takes its tracing path there), so
    nothing is allocated or computed. An error that only says the pass cannot run on such tensors (an
    op without a meta kernel, a data-dependent shape) is not the inputs' fault: ``None``.

    Returns:
        ``"Type: first line (at file:line: code)"`` of the error the forward pass raises on fake tensors,
        e.g. ``"RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 8x4)"``, or ``None``.
    """
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

    unsupported = (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
        GuardOnDataDependentSymNode,
        NotImplementedError,
    )

    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    state = {n: meta(t) for n, t in (*module.named_parameters(), *module.named_buffers())}
    args = tuple(meta(x) for x in example_inputs)
    kwargs = {k: meta(v) for k, v in (example_kwargs or {}).items()}

    def forward() -> None:
        with torch.no_grad(), torch.device("meta"):
            torch.func.functional_call(module, state, args, kwargs, strict=False)

    try:
        forward()
        return None
    except Exception:
        pass
    try:
        with quiet_fake_tensor_log(), FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
            forward()
    except unsupported:
        return None
    except Exception as exc:
        return f"{_first_line(exc)}{_user_frame(exc)}"
    return None


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of an output: a tensor, or tuples, lists and dicts (``ModelOutput``) of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensor_leaves(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensor_leaves(v)]
    return []


def _first_line(exc: BaseException) -> str:
    """``Type: first line`` of an exception's message, without torch's anomaly-mode hint."""
    text = str(exc).strip()
    line = text.splitlines()[0].split(" Hint: enable anomaly detection")[0] if text else ""
    return f"{type(exc).__name__}: {line}".rstrip(": ")


def _user_frame(exc: BaseException) -> str:
    """`` (at file:line: code)`` of the innermost frame of ``exc``'s traceback outside torch."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename]
    if not frames or frames[-1].filename == __file__:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno}: {(f.line or '').strip()})"


def _anomaly_source(forward: Callable[[], Any], wanted: list[torch.Tensor]) -> str:
    """The forward source line of the op whose backward fails, found by rerunning under anomaly mode."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=False), torch.enable_grad():
                out = forward()
                outputs = [t for t in _tensor_leaves(out) if t.requires_grad and t.is_floating_point()]
                torch.autograd.grad([t.sum() for t in outputs], wanted, allow_unused=True)
        except Exception:
            pass
    for w in caught:
        text = str(w.message)
        if "Traceback of forward call" not in text:
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', text)
        user = [f for f in frames if "/torch/" not in f[0]]
        if user:
            filename, line, code = user[-1]
            op = re.search(r"Error detected in (\w+)", text)
            where = f" of {op.group(1)}" if op else ""
            return f" (the backward{where} of the op at {filename}:{line}: {code.strip()})"
    return ""


def parallel_dims(
    kind: OpKind,
    shape: Shape,
    sample_axis: int | None,
    reduce_axis: tuple[int, int] | None,
    has_params: bool,
    in_shape: Shape | None = None,
) -> tuple[tuple[ParallelDim, ...], SplitClass]:
    """SOAP dimensions (FlexFlow Table 2) and TAG's split class for one op, by its kind's rule.

    Besides FlexFlow's output dimensions, a product with parameters (a linear layer) has its input
    features as a *reduction* dimension ``in_channel`` of kind ``parameter`` (Megatron-LM's
    row-parallel layer: each partition reads its slice of the input features and of the weight's
    columns, and the partial outputs are summed), and an attention op its heads (``heads``, the
    third axis from the end: heads are independent).

    Args:
        kind: the op's kind.
        shape: its first output's shape.
        sample_axis: the output axis that follows the batch, ``None`` when none does.
        reduce_axis: ``(axis, extent)`` of the sample axis of the first input that has one, for ops
            that may reduce it (reductions, and products, which contract it).
        has_params: whether the op reads parameters (a ``matmul`` then splits like a linear layer).
        in_shape: its first input's shape (for the input features of a linear layer).
    """
    if sample_axis is None:
        # A reduction over the batch (a mean loss), or a product contracting it (x^T x): partitions
        # produce partial sums (TAG "sum").
        if (kind.reduces or kind.family == "matmul") and reduce_axis is not None:
            axis, extent = reduce_axis
            return (ParallelDim("sample", "sample", axis, extent, reduction=True),), "sum"
        return (), "none"
    dims = [ParallelDim("sample", "sample", sample_axis, shape[sample_axis])]
    rest = [a for a in range(len(shape)) if a != sample_axis]

    def add(name: str, kind: str, axis: int) -> None:
        if 0 <= axis < len(shape) and axis != sample_axis and shape[axis] > 1:
            dims.append(ParallelDim(name, kind, axis, shape[axis]))  # type: ignore[arg-type]

    spatial = ("length",) if len(shape) == 3 else ("height", "width", "depth")
    rule = kind.parallel_rule
    if rule == "matmul":  # x @ W reads a parameter like a linear layer; q @ k^T does not
        rule = "linear" if has_params else "contraction"
    if rule == "conv":
        add("channel", "parameter", 1)
        for name, axis in zip(spatial, range(2, len(shape)), strict=False):
            add(name, "attribute", axis)
    elif rule == "pool":
        for name, axis in zip(spatial, range(2, len(shape)), strict=False):
            add(name, "attribute", axis)
    elif rule == "channel":
        add("channel", "parameter", 1)
    elif rule == "linear":
        for axis in rest[:-1]:
            add("length" if axis == rest[0] else f"dim{axis}", "attribute", axis)
        add("channel", "parameter", len(shape) - 1)
        if kind.family == "matmul" and in_shape is not None and len(in_shape) == len(shape) and in_shape[-1] > 1:
            dims.append(ParallelDim("in_channel", "parameter", len(in_shape) - 1, in_shape[-1], reduction=True))
    elif rule == "sample" and kind.flop_rule == "attention" and len(shape) >= 3:
        add("heads", "attribute", len(shape) - 3)
    elif rule == "rnn_cell":
        add("hidden", "parameter", 1)
    elif rule in ("rows", "contraction"):
        # Everything but the normalized / contracted last axis can be split.
        for axis in rest[:-1]:
            add(f"dim{axis}", "attribute", axis)
        if rule == "contraction":  # every output axis of a product is a free index
            add("channel", "attribute", len(shape) - 1)
    elif rule == "elementwise":
        names = {4: ("channel", "height", "width"), 3: ("length", "channel"), 2: ("channel",)}.get(len(shape), ())
        for name, axis in zip(names, rest, strict=False):
            add(name, "attribute", axis)
    return tuple(dims), "concat"
