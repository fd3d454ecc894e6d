"""Measure the forward and backward time of every op of zoo models: build a :class:`ProfileTable`.

What is measured: for each zoo model, every op that the importer (:mod:`placement_rl.graph.importer`) puts in
the model's :class:`~placement_rl.graph.OpGraph` and that does work, i.e. every op except inputs,
constants and views (``view``, ``reshape``, ``flatten``, ...). That covers the leaf ``torch.nn`` layers
(convolution, linear, normalization, pooling, LSTM cells, embedding, activations, dropout, losses ...),
the tensor functions (``matmul``, ``bmm``, ``softmax``, ``add``, ``mul``, ``cat``, ...) and the tensor
methods. Each op is measured alone, on the real input values it receives in the model, and recorded
under the key the simulator looks up: ``(device_type, op_type, output_shape, param_bytes)``, with the
op type, first output shape and parameter bytes computed exactly as the importer does (tied weights
count under the first op that reads them).

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
3. At each node to profile (whose key was not measured before), with the node's captured inputs:

   * **forward** = the median over ``repeats`` runs of the module / function / method applied to
     them, autograd recording on (as in training);
   * **backward** = the median over ``repeats`` runs of forward followed by
     ``torch.autograd.grad(outputs, inputs)`` (gradient of ones w.r.t. every floating-point input that
     requires a gradient and every parameter), minus the forward median, clamped at 0. Ops none of
     whose outputs requires a gradient have a backward time of 0.

   ``WARMUP_RUNS`` untimed runs of each precede the timed ones; on CUDA the device is synchronized
   before starting and before stopping every timer (``time.perf_counter`` wall clock).
4. With ``batch_splits=(1, k, ...)`` the whole model is run again at batch ``batch_size // k``, so every
   op is also measured at the shapes of its ``k``-way data-parallel (sample) partitions.

Identical keys are measured once per call, within and across models and batch sizes, in the order
models and splits (ascending ``k``) are given: the first measurement wins. Note that ops whose output
has no batch axis (the scalar mean loss) have one key for every batch size, so it holds the time at
the first (largest) batch.

>>> from placement_rl.profiling import profile_models
>>> table = profile_models(["lenet"], batch_size=8, repeats=2, progress=False)
>>> table.to_json("lenet_cpu.json")                                # doctest: +SKIP
"""

from __future__ import annotations

import math
import operator
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_leaves, tree_map

from placement_rl import zoo
from placement_rl.graph import Shape
from placement_rl.graph.importer import op_type_of
from placement_rl.ops import INPUT_OPS, VIEW_OPS
from placement_rl.progress import Progress
from placement_rl.sim.cost import ProfileEntry, ProfileTable

#: Untimed runs of forward and of forward + backward before the timed repeats of each op.
WARMUP_RUNS = 2

#: Op types that are never measured: graph inputs, constants and views (no work).
UNMEASURED_OPS = INPUT_OPS | VIEW_OPS

#: The table key without the device type: ``(op_type, output_shape, param_bytes)``.
OpKey = tuple[str, Shape, int]


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
        repeats: timed runs per op (of forward, and of forward + backward) after warm-up; the median
            is recorded.
        max_ops_per_model: measure only the first this many ops (in execution order, before
            deduplication) of each model, at every batch size; ``None`` for all.
        progress: show a ``tqdm`` progress bar over the graph nodes run.
        options: per-model zoo options, e.g. ``{"rnnlm": {"steps": 2}}``.

    Returns:
        The table; its ``device`` describes the hardware and PyTorch build measured.

    Raises:
        UnknownNameError: for an unknown model name or model option.
        ValueError: for an empty model list, options for a model not listed, a batch size below 1,
            a batch split that is not a positive divisor of a model's batch size, ``repeats`` or
            ``max_ops_per_model`` below 1, or a device that is not the CPU or an available CUDA GPU.
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
    torch_device = _resolve_device(device)
    label = device_type if device_type is not None else _default_device_type(torch_device)

    # Validate every model's arguments before measuring anything.
    plans = [_plan(name, batch_size, batch_splits, options.get(name, {})) for name in models]
    bar = Progress(0, "profiling", "node", enabled=progress, leave=False)  # its total grows per model
    measured: dict[OpKey, ProfileEntry] = {}
    try:
        for p in plans:
            with torch.device(torch_device):
                module = p.model.build(**p.options)
            module.train()
            gm = fx.symbolic_trace(module)
            nodes_per_pass = sum(1 for n in gm.graph.nodes if n.op != "output")
            bar.grow(len(p.batch_sizes) * nodes_per_pass)
            for batch in p.batch_sizes:
                bar.describe(f"{p.name} batch {batch}")
                inputs = _random_inputs(gm, p.model.example_inputs(batch, **p.options), torch_device)
                runner = _ProfilingInterpreter(gm, measured, torch_device, repeats, max_ops_per_model, bar)
                runner.profile(inputs)
                bar.advance(nodes_per_pass - runner.nodes_run)
            del module, gm
    finally:
        bar.close()
    entries = {(label, op_type, shape, param_bytes): e for (op_type, shape, param_bytes), e in measured.items()}
    return ProfileTable(entries, _describe_hardware(torch_device, label))


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


# ------------------------------------------------------------------ the interpreter


class _StopProfiling(Exception):
    """Raised inside the interpreter once ``max_ops_per_model`` ops were seen."""


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

    def op_key(self, node: fx.Node, value: Any, env: Mapping[fx.Node, Any]) -> OpKey | None:
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
    """Runs the traced model node by node and times each op not measured yet (see the module docstring)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        measured: dict[OpKey, ProfileEntry],
        device: torch.device,
        repeats: int,
        max_ops: int | None,
        bar: Progress,
    ) -> None:
        super().__init__(gm)
        self.measured = measured
        self.device = device
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
            if key not in self.measured:
                self.measured[key] = self._measure(n)
        self.nodes_run += 1
        self.bar.advance(1, entries=len(self.measured))
        return _detach(result)

    def _measure(self, n: fx.Node) -> ProfileEntry:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        call = self._callable(n, args, kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if n.op == "call_module":
            tensors += list(self.fetch_attr(str(n.target)).parameters())
        grad_inputs = _unique([t for t in tensors if t.requires_grad])
        try:
            return _time_op(call, grad_inputs, self.repeats, self.device)
        except Exception as exc:  # e.g. an in-place op on a leaf that requires grad
            warnings.warn(
                f"profile_models: could not time node {n.format_node()} ({exc}); recorded 0 s",
                RuntimeWarning,
                stacklevel=2,
            )
            return ProfileEntry(0.0, 0.0)

    def _callable(self, n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
        if n.op == "call_module":
            module = self.fetch_attr(str(n.target))
            return lambda: module(*args, **kwargs)
        if n.op == "call_method":
            obj, *rest = args
            method = str(n.target)
            return lambda: getattr(obj, method)(*rest, **kwargs)
        target = n.target
        assert callable(target), n.format_node()
        return lambda: target(*args, **kwargs)


# ------------------------------------------------------------------ timing


def _time_op(
    call: Callable[[], Any], grad_inputs: Sequence[torch.Tensor], repeats: int, device: torch.device
) -> ProfileEntry:
    """Median forward seconds and median (forward + backward) - forward seconds of ``call``."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    outputs = _grad_outputs(call())
    grad_outputs = [torch.ones_like(o) for o in outputs]
    differentiable = bool(outputs) and bool(grad_inputs)

    def forward() -> None:
        call()

    def forward_backward() -> None:
        outs = _grad_outputs(call())
        torch.autograd.grad(outs, list(grad_inputs), grad_outputs=grad_outputs, allow_unused=True)

    forward_s = _median_seconds(forward, repeats, sync)
    if not differentiable:
        return ProfileEntry(forward_s, 0.0)
    both_s = _median_seconds(forward_backward, repeats, sync)
    return ProfileEntry(forward_s, max(0.0, both_s - forward_s))


def _median_seconds(fn: Callable[[], None], repeats: int, sync: Callable[[], None] | None) -> float:
    for _ in range(WARMUP_RUNS):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return median if math.isfinite(median) and median >= 0 else 0.0


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


__all__ = ["profile_models", "UNMEASURED_OPS", "WARMUP_RUNS"]
