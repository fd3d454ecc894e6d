"""Measure the forward and backward time of every op of zoo models: build a :class:`ProfileTable`.

What is measured: for each zoo model, every op that the importer (:mod:`placement_rl.graph.importer`) puts in
the model's :class:`~placement_rl.graph.OpGraph` and that does work, i.e. every op except inputs,
constants and views (``view``, ``reshape``, ``flatten``, ...). That covers the leaf ``torch.nn`` layers
(convolution, linear, normalization, pooling, LSTM cells, embedding, activations, dropout, losses ...),
the tensor functions (``matmul``, ``bmm``, ``softmax``, ``add``, ``mul``, ``cat``, ...) and the tensor
methods. Each op is measured alone, on the real input values it receives in the model, and recorded
twice: under its own name, ``(device_type, op_type, output_shape, param_bytes, op_name)`` with
``op_name`` the importer's name for the node (:attr:`placement_rl.graph.Op.name`, the fx node name),
and under the name-less shape key ``(device_type, op_type, output_shape, param_bytes, None)`` that any op
of that key falls back to (:meth:`ProfileTable.lookup`); the op type, first output shape and parameter
bytes are computed exactly as the importer does (tied weights count under the first op that reads them).
Names matter because ops of one shape key can differ in work: a 1x1 and a 3x3 convolution with the same
output shape and parameter bytes.

Each entry holds four times: ``forward_s`` and ``backward_s``, the device's seconds for the op's forward
and backward, and ``host_forward_s`` and ``host_backward_s``, the seconds the host thread spends issuing
them (what an asynchronous training iteration cannot overlap when kernels are short).

How:

1. The model is built for real on the target device (``zoo.spec(name).build(**options)`` under
   ``with torch.device(device):``), put in training mode and traced with ``torch.fx.symbolic_trace``.
2. A ``torch.fx.Interpreter`` runs it on random inputs of the example inputs' shapes and dtypes:
   floating-point inputs are ``randn``; integer inputs (token ids) are uniform in
   ``[0, num_embeddings)`` of the ``nn.Embedding`` layers that read them (or of the smallest embedding
   of the model, or 0 without one); the target, the last input, is zeros (a valid class everywhere).
   Every node runs with autograd enabled on detached (leaf) copies of its inputs, so each intermediate
   value requires a gradient exactly when it would in a training step, without the whole model's
   autograd graph (and all its activations) being kept alive.
3. Precision (``precision``, a name of :data:`placement_rl.sim.cost.PRECISIONS`, recorded as the table's
   ``precision``): ``fp32`` keeps torch's defaults; ``tf32`` turns on
   ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (CUDA only: on the
   CPU it would measure fp32, so it is refused there); ``bf16-mixed`` and ``fp16-mixed`` turn TF32 on and
   run the whole model (every op, so each op receives the low-precision values it gets in training)
   under ``torch.autocast(device_type, dtype=bfloat16 / float16)``, with autocast's weight-cast cache
   off so each op's forward includes casting its weights, as the first use in a training step does.
   Backward runs with autocast off, as ``loss.backward()`` after an autocast region does. A precision
   the device cannot run (bf16 on a GPU without it, an autocast dtype this PyTorch lacks) is an error.
4. At each node to profile, with the node's captured inputs, unless a node with the same *signature*
   was measured before in this call (then its entry is reused): the signature is the op (module type
   and its hyperparameters, i.e. its attributes of plain values; function; or method name), its
   parameters' and buffers' shapes and dtypes, and every argument (tensors by shape, strides, dtype,
   device and whether they require a gradient; other values by value). Ops whose arguments are not
   plain values are always measured.

   **On CUDA** (``timing = "cuda_events"``), for the forward (``call()``, autograd recording on, as in
   training) and the backward (``torch.autograd.grad(outputs, inputs, grad_outputs=ones,
   retain_graph=True)`` on one forward's graph, re-run: the backward alone; inputs are every
   floating-point input that requires a gradient and every parameter), after ``WARMUP_RUNS`` untimed
   runs each:

   * the GPU is first kept busy by a spin kernel (``torch.cuda._sleep``, its cycles per second
     calibrated once) long enough for the host to issue all ``repeats`` runs before the GPU reaches
     them: ``MIN_BUSY_S`` plus twice the host's time to issue ``repeats`` runs, estimated from one run
     on an idle GPU (at most ``MAX_BUSY_S``);
   * then ``repeats`` runs are issued back to back between two ``torch.cuda.Event(enable_timing=True)``
     records, with no synchronize inside: **GPU time** = elapsed / ``repeats``; the kernels run back to
     back, as in a training step where the host is ahead;
   * the same loop is timed on the host with ``time.perf_counter``: **host time** = issuing time /
     ``repeats``, never blocked on the GPU (the queue is far from full and the GPU is busy). For the
     backward it is less the host time of one ``autograd.grad`` call through a view (no kernel): the
     fixed cost of starting a backward, which a training step pays once, not per op (clamped at 0);
   * if the start event had already passed when the host finished issuing (the spin was too short:
     the GPU may have waited for the host), the loop is run again with a 4x longer spin, up to
     ``BUSY_TRIES`` tries in all; an op that still cannot be hidden (it synchronizes, e.g. ``.item()``)
     is timed without the spin, its GPU time then an upper bound and its host time including the
     waits, and a warning names it. ``repeats`` runs of an op must fit in the launch queue (about a
     thousand kernels) for the host never to block; the default 5 does.

   **On the CPU** (``timing = "wall"``): forward = the median over ``repeats`` wall-clock runs of the
   call; backward = the median over ``repeats`` runs of forward followed by ``torch.autograd.grad``,
   minus the forward median, clamped at 0 (``WARMUP_RUNS`` untimed runs of each first). The host
   times are not measured (``None``): on the CPU the host is the device.

   Ops none of whose outputs requires a gradient, or with no input that does, have a backward of 0.
5. With ``batch_splits=(1, k, ...)`` the whole model is run again at batch ``batch_size // k``, so every
   op is also measured at the shapes of its ``k``-way data-parallel (sample) partitions.

The first measurement of a key wins, within and across models and batch sizes, in the order models
and splits (ascending ``k``) are given: a shape key's name-less entry is the first op measured with it,
and an op name is per model, so two models with an op of one name and shape key keep the first's.
Note that ops whose output has no batch axis (the scalar mean loss) have one key for every batch size,
so it holds the time at the first (largest) batch.

>>> from placement_rl.profiling import profile_models
>>> table = profile_models(["lenet"], batch_size=8, repeats=2, progress=False)
>>> table.to_json("lenet_cpu.json")                                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
import operator
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_leaves, tree_map

from placement_rl import zoo
from placement_rl.errors import UnknownNameError
from placement_rl.graph import Shape
from placement_rl.graph.importer import op_type_of, symbolic_trace
from placement_rl.ops import INPUT_OPS, VIEW_OPS
from placement_rl.progress import Progress
from placement_rl.sim.cost import PRECISIONS, ProfileEntry, ProfileTable

#: Untimed runs of forward and of backward (CPU: forward + backward) before the timed repeats of each op.
WARMUP_RUNS = 2

#: CUDA: tries of the spin that keeps the GPU busy while the host issues an op's runs (each 4x longer).
BUSY_TRIES = 3

#: CUDA: the shortest spin (seconds) before a timed loop; also the margin above twice the host's estimate.
MIN_BUSY_S = 1e-3

#: CUDA: the longest spin (seconds); an op whose runs take the host longer to issue is timed without one.
MAX_BUSY_S = 2.0

#: Op types that are never measured: graph inputs, constants and views (no work).
UNMEASURED_OPS = INPUT_OPS | VIEW_OPS

#: The autocast dtype of each mixed precision; other precisions run without autocast.
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}

#: The table key without the device type: ``(op_type, output_shape, param_bytes, op_name)``, ``op_name``
#: ``None`` for the shape key's name-less entry.
OpKey = tuple[str, Shape, int, str | None]


def profile_models(
    models: Sequence[str],
    *,
    batch_size: int | None = None,
    batch_splits: Sequence[int] = (1,),
    device: str = "cpu",
    device_type: str | None = None,
    repeats: int = 5,
    max_ops_per_model: int | None = None,
    progress: bool = True,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    precision: str = "fp32",
) -> ProfileTable:
    """Measure the forward and backward time of every op of the given zoo models.

    See the module docstring for what is measured and how.

    Args:
        models: zoo model names (``zoo.names()``).
        batch_size: global batch size of every model; default each model's paper batch size
            (``zoo.spec(name).default_batch_size``).
        batch_splits: each ``k`` also measures every op at batch ``batch_size // k``, the shapes of its
            ``k``-way data-parallel partitions; ``k`` must divide the batch size. ``1`` is the whole
            batch; it is not implied, so ``(2,)`` measures only the half-batch shapes.
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:1"``).
        device_type: the entries' device type label, which must equal the topology's ``device_type``
            for the simulator to use them (e.g. ``"V100-SXM2-32GB"``); default ``"CPU"`` on the CPU and
            ``torch.cuda.get_device_name()`` on CUDA.
        repeats: timed runs per op (of forward, and of backward) after warm-up; CUDA: runs back to back
            per timed loop; CPU: runs whose median is recorded.
        max_ops_per_model: measure only the first this many ops (in execution order, before
            deduplication) of each model, at every batch size; ``None`` for all.
        progress: show a ``tqdm`` progress bar over the graph nodes run.
        options: per-model zoo options, e.g. ``{"rnnlm": {"steps": 2}}``.
        precision: the training precision to measure in, a name of
            :data:`placement_rl.sim.cost.PRECISIONS` (``fp32``, ``tf32``, ``bf16-mixed``,
            ``fp16-mixed``); recorded as the table's ``precision``.

    Returns:
        The table; its ``device`` describes the hardware and PyTorch build measured, its ``precision``
        the precision and its ``timing`` ``"cuda_events"`` on CUDA, ``"wall"`` on the CPU.

    Raises:
        UnknownNameError: for an unknown model name, model option or precision.
        ValueError: for an empty model list, options for a model not listed, a batch size below 1,
            a batch split that is not a positive divisor of a model's batch size, ``repeats`` or
            ``max_ops_per_model`` below 1, a device that is not the CPU or an available CUDA GPU, or a
            precision the device cannot run.
    """
    if isinstance(models, str):
        models = [models]
    if not models:
        raise ValueError("profile_models: models is empty; expected zoo model names")
    options = dict(options or {})
    for name in options:
        if name not in models:
            raise ValueError(f"profile_models: options given for model {name!r}, not in models {list(models)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"profile_models: repeats = {repeats!r}; expected a positive integer")
    if max_ops_per_model is not None and (not isinstance(max_ops_per_model, int) or max_ops_per_model < 1):
        raise ValueError(f"profile_models: max_ops_per_model = {max_ops_per_model!r}; expected a positive int or None")
    if precision not in PRECISIONS:
        raise UnknownNameError("precision", precision, PRECISIONS)
    torch_device = _resolve_device(device)
    _check_precision(precision, torch_device)
    label = device_type if device_type is not None else _default_device_type(torch_device)

    # Validate every model's arguments before measuring anything.
    plans = [_plan(name, batch_size, batch_splits, options.get(name, {})) for name in models]
    bar = Progress(0, "profiling", "node", enabled=progress, leave=False)  # its total grows per model
    measured: dict[OpKey, ProfileEntry] = {}
    by_signature: dict[Hashable, ProfileEntry] = {}
    try:
        with _on_device(torch_device), _precision_mode(precision, torch_device):
            timer: _Timer = _CudaTimer(torch_device) if torch_device.type == "cuda" else _WallTimer(torch_device)
            for p in plans:
                with torch.device(torch_device):
                    module = p.model.build(**p.options)
                module.train()
                gm = symbolic_trace(module)  # the importer's leaves: op names match the graph's
                nodes_per_pass = sum(1 for n in gm.graph.nodes if n.op != "output")
                bar.grow(len(p.batch_sizes) * nodes_per_pass)
                for batch in p.batch_sizes:
                    bar.describe(f"{p.name} batch {batch}")
                    inputs = _random_inputs(gm, p.model.example_inputs(batch, **p.options), torch_device)
                    runner = _ProfilingInterpreter(gm, measured, by_signature, timer, repeats, max_ops_per_model, bar)
                    runner.profile(inputs)
                    bar.advance(nodes_per_pass - runner.nodes_run)
                del module, gm
    finally:
        bar.close()
    entries = {(label, *key): e for key, e in measured.items()}
    return ProfileTable(entries, _describe_hardware(torch_device, label), precision, timer.timing)


# ------------------------------------------------------------------ arguments


@dataclass(frozen=True)
class _ModelPlan:
    """One model to profile, its options validated and its batch sizes, full batch first."""

    name: str
    model: zoo.ZooModel
    options: dict[str, Any]
    batch_sizes: tuple[int, ...]


def _plan(name: str, batch_size: int | None, batch_splits: Sequence[int], options: Mapping[str, Any]) -> _ModelPlan:
    """Validate one model's name, options, batch size and splits (same rules and errors as ``zoo.load``)."""
    model, batch = zoo.check(name, batch_size, dict(options))
    if not batch_splits:
        raise ValueError("profile_models: batch_splits is empty; expected split counts such as (1,) or (1, 2)")
    sizes: list[int] = []
    for k in sorted(set(batch_splits)):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"profile_models: batch split {k!r}; expected a positive integer")
        if batch % k:
            raise ValueError(
                f"profile_models: batch split {k} does not divide the batch size {batch} of model {name!r}"
            )
        sizes.append(batch // k)
    return _ModelPlan(name, model, dict(options), tuple(sizes))


def _resolve_device(device: str) -> torch.device:
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"profile_models: device {device!r} is not a torch device; expected 'cpu' or 'cuda[:i]'"
        ) from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"profile_models: device {device!r} requested but CUDA is not available")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.index >= torch.cuda.device_count():
            raise ValueError(f"profile_models: device {device!r}; only {torch.cuda.device_count()} CUDA device(s)")
    elif resolved.type != "cpu":
        raise ValueError(f"profile_models: device {device!r}; expected 'cpu' or 'cuda[:i]'")
    return resolved


def _default_device_type(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def _describe_hardware(device: torch.device, label: str) -> str:
    if device.type == "cuda":
        return f"{label}: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    cpu = platform.processor() or platform.machine()
    return f"{label}: {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _random_inputs(gm: fx.GraphModule, examples: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Random tensors shaped like ``examples`` (see the module docstring for the value ranges)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    modules = dict(gm.named_modules())
    embeddings = [m for m in modules.values() if isinstance(m, nn.Embedding)]
    inputs: list[torch.Tensor] = []
    for i, x in enumerate(examples):
        shape, dtype = tuple(x.shape), x.dtype
        if dtype.is_floating_point or dtype.is_complex:
            inputs.append(torch.randn(shape, dtype=dtype, device=device))
            continue
        high = 0
        if i != len(examples) - 1:  # the last input is the target: zeros
            readers = [
                modules[str(u.target)].num_embeddings
                for u in (placeholders[i].users if i < len(placeholders) else ())
                if u.op == "call_module" and isinstance(modules.get(str(u.target)), nn.Embedding)
            ]
            bounds = readers or [m.num_embeddings for m in embeddings]
            high = min(bounds) if bounds else 0
        if dtype == torch.bool or high <= 1:
            inputs.append(torch.zeros(shape, dtype=dtype, device=device))
        else:
            inputs.append(torch.randint(0, high, shape, dtype=dtype, device=device))
    return inputs


# ------------------------------------------------------------------ precision


def _check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision that ``device`` cannot run (see the module docstring)."""
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(
            f"profile_models: precision 'tf32' on {device}: TF32 is a math mode of CUDA tensor cores, so on the "
            "CPU it would measure fp32; profile the CPU in 'fp32', 'bf16-mixed' or 'fp16-mixed'"
        )
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return
    if device.type == "cuda":
        with torch.cuda.device(device):
            if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
                raise ValueError(
                    f"profile_models: precision {precision!r} on {device} ({torch.cuda.get_device_name(device)}): "
                    "this GPU does not support bfloat16; use 'fp16-mixed', 'tf32' or 'fp32'"
                )
    reason = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(device.type, dtype=dtype):
                supported = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == dtype
        except (RuntimeError, ValueError) as exc:
            supported, reason = False, str(exc)
    if not supported:
        reason = reason or "; ".join(str(w.message) for w in caught) or "autocast stayed off"
        raise ValueError(
            f"profile_models: precision {precision!r} cannot run on {device}: torch {torch.__version__} has no "
            f"torch.autocast({device.type!r}, dtype={dtype}) ({reason})"
        )


@contextlib.contextmanager
def _precision_mode(precision: str, device: torch.device) -> Iterator[None]:
    """TF32 on for every precision but ``fp32`` (torch's defaults), autocast for the mixed ones; restored after."""
    if precision == "fp32":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        dtype = AUTOCAST_DTYPES.get(precision)
        if dtype is None:
            yield
        else:  # no weight-cast cache: each op's forward casts its weights, as its first use in a step does
            with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
                yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``device`` current for CUDA streams, events and ``torch.cuda._sleep``."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class _AutocastOff:
    """Autocast off inside, for a backward (training runs it after the autocast region); cheaper to enter
    than ``torch.autocast(enabled=False)``, which matters inside the CPU's timed loop."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.active = torch.is_autocast_enabled(device_type)

    def __enter__(self) -> None:
        if self.active:
            torch.set_autocast_enabled(self.device_type, False)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.set_autocast_enabled(self.device_type, True)


# ------------------------------------------------------------------ the interpreter


class _StopProfiling(Exception):
    """Raised inside the interpreter once ``max_ops_per_model`` ops were seen."""


#: ``(op_type, output_shape, param_bytes)`` of a node, as the importer computes them.
ShapeKey = tuple[str, Shape, int]


@dataclass
class _ImporterView:
    """Mirrors the importer's bookkeeping, so op keys here equal those of ``from_torch``."""

    gm: fx.GraphModule
    modules: dict[str, nn.Module] = field(init=False)
    aliases: set[fx.Node] = field(default_factory=set)  # nodes that are ops or select an op's output
    key_bytes: dict[str, int] = field(default_factory=dict)
    owned_params: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.modules = dict(self.gm.named_modules())

    def op_key(self, node: fx.Node, value: Any, env: Mapping[fx.Node, Any]) -> ShapeKey | None:
        """The node's ``(op_type, output_shape, param_bytes)``, or ``None`` when it is no op of the graph.

        Must be called for every node, in execution order (parameter ownership depends on it).
        """
        if node.op == "output":
            return None
        if (
            node.op == "call_function"
            and node.target is operator.getitem
            and isinstance(node.args[0], fx.Node)
            and isinstance(env.get(node.args[0]), (tuple, list))
            and isinstance(node.args[1], int)
            and node.args[0] in self.aliases
        ):
            self.aliases.add(node)  # selecting one output of a multi-output op is not an op
            return None
        if node.op == "get_attr" and isinstance(value, nn.Parameter):
            return None
        flat = _flat_tensors(value)
        if not flat:
            return None
        self.aliases.add(node)
        op_type, module = self._op_type(node)
        return op_type, tuple(int(d) for d in flat[0].shape), self._param_bytes(node, module)

    def _op_type(self, node: fx.Node) -> tuple[str, nn.Module | None]:
        return op_type_of(node, self.modules)

    def _param_bytes(self, node: fx.Node, module: nn.Module | None) -> int:
        """``sum(p.numel() * p.element_size())`` of the op's parameters, as the importer counts them.

        Every call of one module has the same bytes; a tensor shared by two modules (tied weights)
        counts only for the first.
        """
        if module is not None:
            params, key = list(module.parameters()), str(node.target)
        else:  # a function reading parameters directly: F.linear(x, self.weight)
            attrs = sorted(
                (
                    (str(n.target), self.gm.get_parameter(str(n.target)))
                    for n in node.all_input_nodes
                    if n.op == "get_attr" and _is_parameter(self.gm, str(n.target))
                ),
                key=lambda attr: attr[0],
            )
            params, key = [p for _, p in attrs], "+".join(t for t, _ in attrs)
        if not params:
            return 0
        if key not in self.key_bytes:
            total = 0
            for p in params:
                if id(p) not in self.owned_params:
                    self.owned_params.add(id(p))
                    total += p.numel() * p.element_size()
            self.key_bytes[key] = total
        return self.key_bytes[key]


class _ProfilingInterpreter(fx.Interpreter):
    """Runs the traced model node by node and times each op not measured yet (see the module docstring).

    ``measured`` (the entries by key, op name or ``None``) and ``by_signature`` (entries by op signature)
    are shared by every model and batch size of one :func:`profile_models` call.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        measured: dict[OpKey, ProfileEntry],
        by_signature: dict[Hashable, ProfileEntry],
        timer: _Timer,
        repeats: int,
        max_ops: int | None,
        bar: Progress,
    ) -> None:
        super().__init__(gm)
        self.measured = measured
        self.by_signature = by_signature
        self.timer = timer
        self.repeats = repeats
        self.max_ops = max_ops
        self.bar = bar
        self.view = _ImporterView(gm)
        self.ops_seen = 0
        self.nodes_run = 0

    def profile(self, inputs: Sequence[torch.Tensor]) -> None:
        """Run the model on ``inputs``, measuring every new op (up to ``max_ops``)."""
        try:
            with torch.enable_grad():
                self.run(*inputs)
        except _StopProfiling:
            pass

    def run_node(self, n: fx.Node) -> Any:
        if self.max_ops is not None and self.ops_seen >= self.max_ops:
            raise _StopProfiling
        try:
            result = super().run_node(n)
        except Exception as exc:
            raise RuntimeError(f"profile_models: running node {n.format_node()} failed: {exc}") from exc
        key = self.view.op_key(n, result, self.env)
        if key is not None and key[0] not in UNMEASURED_OPS:
            self.ops_seen += 1
            op_type, shape, param_bytes = key
            if (op_type, shape, param_bytes, n.name) not in self.measured:  # else: the first measurement wins
                entry = self._measure(n)
                self.measured[op_type, shape, param_bytes, n.name] = entry
                self.measured.setdefault((op_type, shape, param_bytes, None), entry)
        self.nodes_run += 1
        self.bar.advance(1, entries=len(self.measured))
        return _detach(result)

    def _measure(self, n: fx.Node) -> ProfileEntry:
        """The node's entry: one measured before for its signature, else a new measurement."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.fetch_attr(str(n.target)) if n.op == "call_module" else None
        signature = _signature(n, module, args, kwargs)
        if signature is not None and signature in self.by_signature:
            return self.by_signature[signature]
        call = _callable(n, module, args, kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if module is not None:
            tensors += list(module.parameters())
        grad_inputs = _unique([t for t in tensors if t.requires_grad])
        try:
            entry, hidden = self.timer.time_op(call, grad_inputs, self.repeats)
        except Exception as exc:  # e.g. an in-place op on a leaf that requires grad
            warnings.warn(
                f"profile_models: could not time node {n.format_node()} ({exc}); recorded 0 s",
                RuntimeWarning,
                stacklevel=2,
            )
            host = 0.0 if self.timer.measures_host else None
            entry, hidden = ProfileEntry(0.0, 0.0, host, host), True
        if not hidden:
            warnings.warn(
                f"profile_models: node {n.format_node()} could not be issued ahead of the GPU (does it "
                "synchronize?): timed without the spin, its GPU time is an upper bound and its host time "
                "includes waiting for the GPU",
                RuntimeWarning,
                stacklevel=2,
            )
        if signature is not None:
            self.by_signature[signature] = entry
        return entry


def _callable(n: fx.Node, module: nn.Module | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    if module is not None:
        return lambda: module(*args, **kwargs)
    if n.op == "call_method":
        obj, *rest = args
        method = str(n.target)
        return lambda: getattr(obj, method)(*rest, **kwargs)
    target = n.target
    assert callable(target), n.format_node()
    return lambda: target(*args, **kwargs)


# ------------------------------------------------------------------ signatures


class _NoSignature(Exception):
    """A value that is not plain data: the op is measured, never looked up by signature."""


#: Values compared by value in a signature.
_PLAIN = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), torch.dtype, torch.device, torch.layout)

#: ``nn.Module`` bookkeeping left out of a module's signature (parameters and buffers enter by shape).
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})


def _signature(n: fx.Node, module: nn.Module | None, args: Any, kwargs: Any) -> Hashable | None:
    """What determines an op's time (module docstring, step 4), hashable; ``None`` when not plain data."""
    try:
        if module is not None:
            op: Hashable = ("module", _module_signature(module))
        elif n.op == "call_method":
            op = ("method", str(n.target))
        else:
            try:
                hash(n.target)
            except TypeError:
                raise _NoSignature from None
            op = ("function", n.target)
        return op, _value_signature(args), _value_signature(kwargs)
    except _NoSignature:
        return None


def _module_signature(module: nn.Module) -> Hashable:
    """The module's type, plain attributes (its hyperparameters), parameter and buffer shapes, children's."""
    attrs = []
    for name, value in sorted(vars(module).items()):
        if name in _MODULE_INTERNALS:
            continue
        if name.startswith("_") and isinstance(value, (dict, set)):
            if value:  # hooks change what a call does
                raise _NoSignature
            continue
        attrs.append((name, _value_signature(value)))
    params = tuple((name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in module.named_parameters())
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in module.named_buffers())
    children = tuple((name, _module_signature(child)) for name, child in module.named_children())
    return type(module), tuple(attrs), params, buffers, children


def _value_signature(value: Any) -> Hashable:
    """A tensor by its shape, strides, dtype, device and ``requires_grad``; plain values by value."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise _NoSignature
        return "tensor", tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad
    if isinstance(value, _PLAIN):
        return type(value).__name__, value
    if isinstance(value, slice):
        return "slice", _value_signature(value.start), _value_signature(value.stop), _value_signature(value.step)
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_value_signature(v) for v in value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return "dict", tuple((k, _value_signature(v)) for k, v in value.items())
    raise _NoSignature


# ------------------------------------------------------------------ timing


class _Timer:
    """Times one op's forward and backward (module docstring, step 4)."""

    #: :attr:`ProfileTable.timing` of the entries.
    timing: str = ""
    #: Whether the entries have host times.
    measures_host: bool = False

    def time_op(
        self, call: Callable[[], Any], grad_inputs: Sequence[torch.Tensor], repeats: int
    ) -> tuple[ProfileEntry, bool]:
        """The op's entry, and whether every timed loop ran as intended (CUDA: the GPU kept busy)."""
        raise NotImplementedError


class _WallTimer(_Timer):
    """The CPU: medians of wall-clock runs; no host times."""

    timing = "wall"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def time_op(
        self, call: Callable[[], Any], grad_inputs: Sequence[torch.Tensor], repeats: int
    ) -> tuple[ProfileEntry, bool]:
        outputs = _grad_outputs(call())
        grad_outputs = [torch.ones_like(o) for o in outputs]
        inputs = list(grad_inputs)
        autocast_off = _AutocastOff(self.device.type)

        def forward() -> None:
            call()

        def forward_backward() -> None:
            outs = _grad_outputs(call())
            with autocast_off:
                torch.autograd.grad(outs, inputs, grad_outputs=grad_outputs, allow_unused=True)

        forward_s = _median_seconds(forward, repeats)
        if not outputs or not inputs:
            return ProfileEntry(forward_s, 0.0), True
        both_s = _median_seconds(forward_backward, repeats)
        return ProfileEntry(forward_s, max(0.0, both_s - forward_s)), True


def _median_seconds(fn: Callable[[], None], repeats: int) -> float:
    for _ in range(WARMUP_RUNS):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return median if math.isfinite(median) and median >= 0 else 0.0


class _CudaTimer(_Timer):
    """CUDA: GPU time from events around back-to-back runs, host time from the same loop (module docstring).

    Must be used with its device current (``torch.cuda.device``).
    """

    timing = "cuda_events"
    measures_host = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.spin_cycles_per_s = _spin_cycles_per_s()
        self._grad_call_s: float | None = None

    def time_op(
        self, call: Callable[[], Any], grad_inputs: Sequence[torch.Tensor], repeats: int
    ) -> tuple[ProfileEntry, bool]:
        forward_s, host_forward_s, hidden = self._time(call, repeats)
        outputs = _grad_outputs(call())  # one forward's graph, after the last forward: the backward loop re-runs it
        inputs = list(grad_inputs)
        if not outputs or not inputs:
            return ProfileEntry(forward_s, 0.0, host_forward_s, 0.0), hidden
        grad_outputs = [torch.ones_like(o) for o in outputs]

        def backward() -> None:
            torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, allow_unused=True, retain_graph=True)

        with _AutocastOff(self.device.type):
            backward_s, host_backward_s, backward_hidden = self._time(backward, repeats)
        host_backward_s = max(0.0, host_backward_s - self.grad_call_s())
        return ProfileEntry(forward_s, backward_s, host_forward_s, host_backward_s), hidden and backward_hidden

    def grad_call_s(self) -> float:
        """Host seconds of one ``autograd.grad`` call through a view (no kernel), measured once."""
        if self._grad_call_s is None:
            x = torch.zeros(1, device=self.device, requires_grad=True)
            y = x.view(1)
            ones = torch.ones_like(y)
            _, self._grad_call_s, _ = self._time(lambda: torch.autograd.grad([y], [x], [ones], retain_graph=True), 50)
        return self._grad_call_s

    def _time(self, fn: Callable[[], Any], repeats: int) -> tuple[float, float, bool]:
        """GPU and host seconds per call of ``fn`` run ``repeats`` times back to back behind a spin, and
        whether the host issued every run before the GPU finished the spin (else timed without it)."""
        for _ in range(WARMUP_RUNS):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()  # on an idle GPU: the host's time to issue one run
        busy_s = MIN_BUSY_S + 2 * repeats * (time.perf_counter() - start)
        for _ in range(BUSY_TRIES):
            gpu_s, host_s, hidden = _timed_loop(fn, repeats, int(min(busy_s, MAX_BUSY_S) * self.spin_cycles_per_s))
            if hidden:
                return gpu_s, host_s, True
            busy_s *= 4
        gpu_s, host_s, _ = _timed_loop(fn, repeats, 0)
        return gpu_s, host_s, False


def _timed_loop(fn: Callable[[], Any], repeats: int, spin_cycles: int) -> tuple[float, float, bool]:
    """``fn`` run ``repeats`` times between two CUDA events after a spin of ``spin_cycles`` GPU cycles:
    GPU and host seconds per run, and whether the start event was still pending when the host had
    issued every run (the GPU then ran them back to back, never waiting for the host)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if spin_cycles > 0:
        torch.cuda._sleep(spin_cycles)
    start.record()
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    host_s = time.perf_counter() - began
    hidden = spin_cycles > 0 and not start.query()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats, host_s / repeats, hidden


def _spin_cycles_per_s() -> float:
    """GPU cycles per second of ``torch.cuda._sleep`` on the current device (the last of three runs, warm)."""
    cycles, rate = 2_000_000, 1e9
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = cycles / max(start.elapsed_time(end) / 1e3, 1e-9)
    return rate


def _grad_outputs(value: Any) -> list[torch.Tensor]:
    """The tensors of an op's output that require a gradient."""
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad]


# ------------------------------------------------------------------ helpers


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors of a value, recursing into tuples and lists only (as the importer does)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


def _detach(value: Any) -> Any:
    """Cut the autograd graph after one node: leaves that require a gradient iff the value did."""

    def cut(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or isinstance(t, nn.Parameter):
            return t
        leaf = t.detach()
        return leaf.requires_grad_(True) if t.requires_grad else leaf

    # Only rebuild containers that hold tensors (tree_map would turn a torch.Size into a tuple).
    has_tensor = any(isinstance(t, torch.Tensor) for t in tree_leaves(value))
    return tree_map(cut, value) if has_tensor else value


def _unique(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


__all__ = [
    "AUTOCAST_DTYPES",
    "BUSY_TRIES",
    "MAX_BUSY_S",
    "MIN_BUSY_S",
    "UNMEASURED_OPS",
    "WARMUP_RUNS",
    "profile_models",
]
