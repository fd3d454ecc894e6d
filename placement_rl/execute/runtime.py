"""One worker of an executed plan: real training iterations of its share of a :class:`Program`.

A worker is one process of a ``torch.distributed`` group (gloo on CPU, NCCL on GPUs), rank ``r``
running ``program.devices[r]``. It builds the model on the meta device, materializes only the
parameters of the ops it runs (:func:`materialize`: every leaf module is initialized from its own
seed, so all workers and the single-device reference hold the same initial weights), and runs its
instruction list (:mod:`placement_rl.execute.lower`) once per iteration:

* ``forward``: the op's inputs are assembled from their pieces (each piece a region of a producer's
  output, local or received) into a leaf tensor that requires a gradient, and the op's fx node runs
  on them. Each task is its own autograd island, so backward tasks run in any order the plan gives.
  Input ops take their region of the batch; parameter splits run the layer on its weight rows
  (linear, convolution) or columns (embedding); a mean over a split batch is weighted by its share.
* ``backward``: ``torch.autograd.backward`` of the task's outputs with the gradients its consumers
  sent (the loss: its seed); the input leaves' gradients are cut into the pieces' regions and
  handed to the local producers or posted back.
* ``send`` / ``recv`` / ``grad_send`` / ``grad_recv``: non-blocking point-to-point operations, waited
  for where their data is needed and at the end of the iteration.
* ``all_reduce``: the bucket's gradients flattened into one tensor, summed asynchronously over the
  bucket's process group, unflattened at the end of the iteration. The bucket's ZeRO members
  (stages 1 and 2) are reduce-scattered instead: at the end of the iteration each holder updates its
  chunk of their flattened parameters with its chunk of the summed gradients, and the chunks are
  all-gathered (stage 2 drops the full gradients once they are handed to the reduce-scatter).
* ``push`` / ``pull``: gradients to the parameter server's rank, which sums them into its own,
  updates and sends the parameters back.

Then every shard is updated with SGD (``p -= lr * grad``); ``duplicate`` replicas scale their
gradient by the replica count (each received ``1 / R`` of the loss's seed). Batch norm over a split
batch normalizes each partition with its own statistics, as DistributedDataParallel does (and so
over each micro-batch).

Under micro-batches a task is one micro-batch's copy of an op (:attr:`TaskSpec.micro_batch`): it
runs the op's fx node (:attr:`TaskSpec.node`) with the op's parameters, so their gradients
accumulate over the micro-batches until the synchronization after the last one; an input op reads
its micro-batch's rows of the batch. A task with ``recompute`` runs its forward without autograd and
runs it again (same inputs, same random state) at the start of its backward.

Every instruction is timed, and so are the waits for communication: the compute times feed the
replay, the rest the measured trace. On the CPU the clock is the host's (:class:`WallClock`: an op's
call returns when its work is done). On CUDA a call returns once its kernels are launched, so the
times are the GPU's (:class:`CudaClock`): a CUDA event recorded on the current stream at every
timestamp, resolved after the iteration's final synchronize into seconds since an event recorded at
its start, with no synchronize in between. The iteration's own time is the host's wall clock between
a synchronize at its start and one at its end, on both.
"""

from __future__ import annotations

import operator
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn
from torch.utils._pytree import tree_map

from placement_rl.execute.lower import Box, BucketSpec, InputSpec, NotExecutableError, Program, ShardRef, TaskSpec
from placement_rl.graph import OpGraph
from placement_rl.graph.importer import from_torch
from placement_rl.profiling import _flat_tensors as _flat
from placement_rl.sim.pipeline import copy_name, micro_batch_graph

#: Default learning rate of the SGD step each iteration ends with.
DEFAULT_LR = 0.01

# ZeRO's collectives on one flat tensor each: torch 2.13 renamed them (the old names warn)
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# ------------------------------------------------------------------ the model


@dataclass(frozen=True)
class ModelSource:
    """Where a worker builds the model from: a zoo name or ``package.module:factory``.

    Attributes:
        spec: the model string.
        batch_size: global batch size (default: the model's).
        options: zoo architecture options (``num_layers=2``); none for factories.
    """

    spec: str
    batch_size: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """The module on the meta device and its example inputs (shapes and dtypes)."""
        if ":" in self.spec:
            if self.options:
                raise ValueError(f"model {self.spec!r}: options {dict(self.options)} apply to zoo models only")
            from placement_rl.models import build_factory

            return build_factory(self.spec, self.batch_size)
        from placement_rl import zoo

        return zoo.build_module(self.spec, self.batch_size, **dict(self.options))

    def graph(self) -> OpGraph:
        """The op graph the executor runs: the module traced with ``torch.fx`` (one op per fx node)."""
        module, inputs = self.build()
        meta = {"model_spec": self.spec, "options": dict(self.options)}
        name = self.spec
        return from_torch(module, inputs, name=name, batch_size=self.batch_size, metadata=meta, tracer="fx")


def trace(module: nn.Module) -> fx.GraphModule:
    """The fx graph of ``module`` exactly as the importer traces it (same node names)."""
    from placement_rl.graph.importer import symbolic_trace

    return symbolic_trace(module)  # the importer's leaves, so op names match the graph's


def materialize(
    module: nn.Module,
    source: ModelSource,
    seed: int,
    device: torch.device,
    paths: set[str] | None = None,
) -> None:
    """Give the modules at ``paths`` (all when ``None``) real, deterministic weights on ``device``.

    A leaf module with ``reset_parameters`` is re-initialized under ``torch.manual_seed(seed +
    crc32(path))``; any other module's tensors are copied from a full build of the model on the CPU
    under ``torch.manual_seed(seed)`` (built only when needed). Either way the weights depend on the
    seed and the path alone.
    """
    full: dict[str, nn.Module] | None = None
    for path, m in module.named_modules():
        own = list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
        if not own or (paths is not None and path not in paths):
            continue
        if not any(t.is_meta for _, t in own):
            m.to(device)
            continue
        m.to_empty(device=device, recurse=False)
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            torch.manual_seed(seed + zlib.crc32(path.encode()))
            with torch.no_grad():
                reset()
            continue
        if full is None:
            torch.manual_seed(seed)
            with torch.device("cpu"):
                built, _ = _build_real(source)
            full = dict(built.named_modules())
        with torch.no_grad():
            for name, _ in own:  # the tensors to_empty just made
                getattr(m, name).copy_(getattr(full[path], name))


def _build_real(source: ModelSource) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if ":" in source.spec:
        from placement_rl.models import build_factory

        return build_factory(source.spec, source.batch_size, device="cpu")
    from placement_rl import zoo

    record, _ = zoo.check(source.spec, source.batch_size, dict(source.options))
    return record.build(**dict(source.options)), ()


def make_batch(gm: fx.GraphModule, examples: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """The training batch: random values of the example inputs' shapes (the profiler's rules), on CPU."""
    from placement_rl.profiling import _random_inputs

    torch.manual_seed(seed)
    return _random_inputs(gm, examples, torch.device("cpu"))


def reference_step(source: ModelSource, seed: int = 0, lr: float = DEFAULT_LR) -> tuple[float, dict[str, torch.Tensor]]:
    """One single-device training step (plain ``loss.backward()`` and SGD): the loss and the updated
    parameters by name. The executor's results are checked against it."""
    module, examples = source.build()
    gm = trace(module)
    materialize(module, source, seed, torch.device("cpu"))
    module.train()
    batch = make_batch(gm, examples, seed + 1)
    loss = module(*batch)
    loss.backward()
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    return float(loss.detach()), {n: p.detach().clone() for n, p in module.named_parameters()}


# ------------------------------------------------------------------ the worker


@dataclass
class Event:
    """One timed step of an iteration (seconds since the iteration's start on this worker)."""

    kind: str
    ref: int
    start_s: float
    end_s: float


class WallClock:
    """The host's clock: :meth:`now` is the seconds since :meth:`start` (``time.perf_counter``)."""

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def resolve(self, events: list[Event]) -> list[Event]:
        """The events as they are: their times are already seconds."""
        return events


class CudaClock:
    """A GPU's clock: :meth:`now` records a CUDA event on the current stream and returns its index, a
    stamp that is no time yet; once the stream is synchronized, :meth:`resolve` turns each event's
    stamps into the seconds between the event :meth:`start` recorded and theirs. The GPU runs a stream's
    work in order, so a span between two stamps is when the GPU ran what was issued between them.

    Args:
        make_event: a new timing event (default ``torch.cuda.Event(enable_timing=True)``); anything
            with ``record()`` and ``elapsed_time(other) -> milliseconds`` (tests pass a fake one).
    """

    def __init__(self, make_event: Callable[[], Any] | None = None) -> None:
        self._make = make_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._origin = self._make()
        self._stamps: list[Any] = []  # reused from iteration to iteration
        self._used = 0

    def start(self) -> None:
        self._used = 0
        self._origin.record()

    def now(self) -> float:
        if self._used == len(self._stamps):
            self._stamps.append(self._make())
        self._stamps[self._used].record()
        self._used += 1
        return float(self._used - 1)

    def resolve(self, events: list[Event]) -> list[Event]:
        """``events`` with their stamps as seconds since :meth:`start` (call after a synchronize)."""
        seconds = [self._origin.elapsed_time(e) / 1e3 for e in self._stamps[: self._used]]
        return [Event(e.kind, e.ref, seconds[int(e.start_s)], seconds[int(e.end_s)]) for e in events]


#: What times an iteration's events: :class:`WallClock` on the CPU, :class:`CudaClock` on CUDA.
Clock = WallClock | CudaClock


@dataclass
class IterationResult:
    """What one worker measured in one iteration."""

    time_s: float
    loss: float
    events: list[Event]
    sent_bytes: int


@dataclass
class WorkerResult:
    """A worker's whole run: per iteration results, and its parameter shards after the last one, by
    the model's parameter name (``features.0.weight``; a shard ``k`` of ``S`` ends in ``#k/S``: rows of
    linear and convolution weights and biases, columns of embedding weights)."""

    rank: int
    device: str
    iterations: list[IterationResult]
    parameters: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def median_iteration_s(self) -> float:
        return statistics.median(it.time_s for it in self.iterations)


def _slices(region: Box, origin: Box) -> tuple[slice, ...]:
    """Index of ``region`` inside a tensor that holds ``origin`` (both boxes of the full tensor)."""
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(region, origin, strict=True))


def _shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


class Worker:
    """Runs rank ``rank``'s instructions of ``program`` (module docstring). ``torch.distributed`` must
    be initialized with ``program.world_size`` processes."""

    def __init__(
        self,
        program: Program,
        graph: OpGraph,
        source: ModelSource,
        rank: int,
        device: torch.device,
        seed: int = 0,
        lr: float = DEFAULT_LR,
        clock: Clock | None = None,
    ) -> None:
        self.program = program
        self.graph = graph
        self.rank = rank
        self.device = device
        self.lr = lr
        self.clock: Clock = clock or (CudaClock() if device.type == "cuda" else WallClock())
        module, examples = source.build()
        self.gm = trace(module)
        self.nodes = {n.name: n for n in self.gm.graph.nodes}
        missing = [op.name for op in graph.ops if op.name not in self.nodes]
        if missing:
            raise NotExecutableError(f"ops {missing[:5]} of graph {graph.name!r} are no node of the traced model")
        self.modules = dict(self.gm.named_modules())
        self.ops = {op.name: op for op in graph.ops}
        self.node_of = program.node_of or {op.name: op.name for op in graph.ops}  # lowered op -> fx node
        lowered = micro_batch_graph(graph, program.micro_batches) if program.micro_batches > 1 else graph
        self.shapes = {op.name: op.output_shapes for op in lowered.ops}  # of the lowered ops (micro-batches)
        self.my_tasks = [s for s in program.tasks.values() if s.rank == rank]
        self.owner = _owners(graph)
        self.needs_grad = _needs_gradient(graph)
        self.dtypes = self._output_dtypes(examples)
        materialize(self.gm, source, seed, device, self._paths())
        self.gm.train()
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.input_index = {n.name: i for i, n in enumerate(placeholders)}
        self.batch = [x.to(device) for x in make_batch(self.gm, examples, seed + 1)]
        self.held = self._hold_parameters()
        self.groups = {ranks: dist.new_group(list(ranks)) for ranks in program.groups}
        self.specs_by_ref = {i: program.tasks[key] for i, key in enumerate(program.task_order)}

    # ---------------------------------------------------------------- setup
    def _paths(self) -> set[str]:
        """Module paths whose tensors this worker's ops read."""
        paths: set[str] = set()
        for spec in self.my_tasks:
            node = self.nodes[spec.node]
            if node.op == "call_module":
                paths.update(
                    p for p, _ in self.gm.get_submodule(str(node.target)).named_modules(prefix=str(node.target))
                )
            for n in (node, *node.all_input_nodes):
                if n.op == "get_attr":
                    paths.add(str(n.target).rpartition(".")[0])
        for h in self.program.holdings[self.rank]:  # a parameter server may hold shards of ops it does not run
            node = self.nodes[h.shard.owner]
            if node.op == "call_module":
                paths.add(str(node.target))
        return paths

    def _param_items(self, owner: str) -> list[tuple[str, torch.Tensor]]:
        """The parameters of op ``owner`` (its module's, or the attributes a function reads), by name."""
        node = self.nodes[owner]
        if node.op == "call_module":
            return list(self.gm.get_submodule(str(node.target)).named_parameters())
        return [
            (str(n.target), self.gm.get_parameter(str(n.target)))
            for n in node.all_input_nodes
            if n.op == "get_attr" and _is_parameter(self.gm, str(n.target))
        ]

    def _param_path(self, owner: str) -> str:
        """The prefix that makes :meth:`_param_items` names the model's parameter names."""
        node = self.nodes[owner]
        return f"{node.target}." if node.op == "call_module" else ""

    def _hold_parameters(self) -> dict[tuple[str, int], dict[str, torch.Tensor]]:
        """Each held shard's tensors: the module's own parameters when unsplit, else leaf slices."""
        held: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        for h in self.program.holdings[self.rank]:
            items = self._param_items(h.shard.owner)
            if h.shard.shards == 1:
                held[(h.shard.owner, 0)] = dict(items)
                continue
            op_type = self.ops[h.shard.owner].op_type
            held[(h.shard.owner, h.shard.shard)] = {
                name: _shard(p, op_type, name, h.shard).detach().clone().requires_grad_(True) for name, p in items
            }
        return held

    def _output_dtypes(self, examples: Sequence[torch.Tensor]) -> dict[str, list[torch.dtype]]:
        """Each node's output dtypes, from one pass on the meta device (before any weight exists)."""
        dtypes: dict[str, list[torch.dtype]] = {}

        class _Recorder(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                result = super().run_node(n)
                dtypes[n.name] = [t.dtype for t in _flat(result)]
                return result

        _Recorder(self.gm).run(*[torch.empty(x.shape, dtype=x.dtype, device="meta") for x in examples])
        return dtypes

    # ------------------------------------------------------------ iteration
    def run(self, iterations: int, barrier: Callable[[], None] | None = None) -> WorkerResult:
        """Run ``iterations`` training iterations; each starts after a barrier of all workers."""
        results = []
        for _ in range(iterations):
            (barrier or dist.barrier)()
            results.append(self.iteration())
        params: dict[str, np.ndarray] = {}
        for h in self.program.holdings[self.rank]:
            path = self._param_path(h.shard.owner)
            suffix = f"#{h.shard.shard}/{h.shard.shards}" if h.shard.shards > 1 else ""
            for name, t in self.held[_hkey(h.shard)].items():
                params[f"{path}{name}{suffix}"] = t.detach().cpu().numpy().copy()
        return WorkerResult(self.rank, self.program.devices[self.rank], results, params)

    def iteration(self) -> IterationResult:
        """One training iteration: every instruction in order, the waits, the SGD update."""
        self._sync()
        t0 = time.perf_counter()
        self.clock.start()
        self.events: list[Event] = []
        self.outputs: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.leaves: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.grads: dict[tuple[str, int], list[torch.Tensor | None]] = {}
        self.pending_recv: dict[int, tuple[Any, torch.Tensor, float]] = {}
        self.pending_grad: dict[tuple[str, int], list[tuple[int, Any, torch.Tensor, float]]] = {}
        self.grad_out: dict[int, torch.Tensor] = {}
        self.handles: list[tuple[Any, str, int, float, torch.Tensor | None]] = []
        self.buckets: list[tuple[Any, int, torch.Tensor, float]] = []
        self.ps_recv: dict[int, tuple[Any, torch.Tensor, float]] = {}
        self.scattered: list[tuple[Any, int, torch.Tensor, torch.Tensor, tuple[ShardRef, ...], float]] = []
        self.rng: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.pulled: set[tuple[str, int]] = set()
        self.sent = 0
        self.losses: list[tuple[torch.Tensor, float]] = []  # read after the final synchronize
        for ins in self.program.instructions[self.rank]:
            begin = self._now()
            getattr(self, f"_do_{ins.kind}")(ins.ref)
            self.events.append(Event(ins.kind, ins.ref, begin, self._now()))
        self._finish()
        self._sync()
        time_s = time.perf_counter() - t0
        loss = sum((float(value) * weight for value, weight in self.losses), 0.0)
        return IterationResult(time_s, loss, self.clock.resolve(self.events), self.sent)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _now(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------- forward
    def _do_forward(self, ref: int) -> None:
        spec = self.specs_by_ref[ref]
        key = (spec.op, spec.task)
        leaves = [self._assemble(spec, inp) for inp in spec.inputs]
        begin = self._now()
        if spec.recompute:  # no autograd graph now: backward runs the forward again, in this random state
            self.rng[key] = self._rng_state()
            with torch.no_grad():
                outs = self._compute(spec, leaves)
        else:
            with torch.enable_grad():
                outs = self._compute(spec, leaves)
        for k, (o, box) in enumerate(zip(outs, spec.output_boxes, strict=False)):
            if tuple(o.shape) != _shape(box):
                raise RuntimeError(
                    f"op {spec.op!r} task {spec.task}: output {k} has shape {tuple(o.shape)}, the plan's partition "
                    f"expects {_shape(box)}"
                )
        self.outputs[key] = outs
        self.leaves[key] = leaves
        if spec.seed_gradient:
            self.losses.append((outs[0].detach(), spec.seed_gradient))  # no host sync mid-iteration
        self.events.append(Event("compute_forward", ref, begin, self._now()))

    def _compute(self, spec: TaskSpec, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        """The task's outputs from its input leaves (under the caller's grad mode)."""
        node = self.nodes[spec.node]
        op = self.ops[spec.node]
        if op.op_type == "input":
            data = self._micro_batch(self.batch[self.input_index[node.name]], spec)
            out: Any = data[_slices(spec.output_boxes[0], _zero(spec))]
        elif op.op_type == "fill":
            out = self._fill(node, spec)
        elif node.op == "get_attr":
            out = self._micro_batch(self._attr(str(node.target)), spec)[_slices(spec.output_boxes[0], _zero(spec))]
        else:
            out = self._call(node, spec, leaves)
        outs = _flat(out)
        if spec.partial_weight != 1.0:
            outs = [o * spec.partial_weight for o in outs]
        return outs

    def _micro_batch(self, data: torch.Tensor, spec: TaskSpec) -> torch.Tensor:
        """The rows of ``data`` (an op's whole-batch output) that the task's micro-batch reads: along
        the op's sample axis, where the micro-batch graph cut it, block ``spec.micro_batch``."""
        if self.program.micro_batches == 1:
            return data
        axis = self.ops[spec.node].plain_sample_axis
        size = self.shapes[spec.op][0][axis] if axis >= 0 else 0
        if axis < 0 or data.dim() <= axis or size == data.shape[axis]:
            return data
        return data.narrow(axis, spec.micro_batch * size, size)

    def _rng_state(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _recompute(self, spec: TaskSpec, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        """The forward again, with autograd, in the random state it first ran in (dropout alike)."""
        cpu, cuda = self.rng.pop((spec.op, spec.task))
        with torch.random.fork_rng(devices=[self.device] if cuda is not None else []):
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, self.device)
            with torch.enable_grad():
                return self._compute(spec, leaves)

    def _assemble(self, spec: TaskSpec, inp: InputSpec) -> torch.Tensor:
        """The input region ``inp.box`` from its pieces, as a leaf (requires a gradient when floating)."""
        if len(inp.pieces) == 1 and inp.pieces[0].box == inp.box:
            value = self._piece(inp, inp.pieces[0])
        else:
            first = self._piece(inp, inp.pieces[0])
            value = torch.zeros(_shape(inp.box), dtype=first.dtype, device=self.device)
            for piece in inp.pieces:
                data = first if piece is inp.pieces[0] else self._piece(inp, piece)
                value[_slices(piece.box, inp.box)] += data
        leaf = value.detach()
        if leaf.is_floating_point() and self.needs_grad[inp.src_node]:
            leaf.requires_grad_(True)
        return leaf

    def _piece(self, inp: InputSpec, piece: Any) -> torch.Tensor:
        if piece.comm < 0:
            producer = self.program.tasks[(inp.src_op, piece.producer_task)]
            out = self.outputs[(inp.src_op, piece.producer_task)][inp.src_output]
            return out[_slices(piece.box, producer.output_boxes[inp.src_output])]
        work, buf, posted = self.pending_recv.pop(piece.comm)
        work.wait()
        self.events.append(Event("recv_done", piece.comm, posted, self._now()))
        return buf

    def _fill(self, node: fx.Node, spec: TaskSpec) -> torch.Tensor:
        shape = _shape(spec.output_boxes[0])
        dtype = self.dtypes[node.name][0]
        target = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
        if "ones" in target:
            return torch.ones(shape, dtype=dtype, device=self.device)
        if "full" in target:
            value = node.args[2] if len(node.args) > 2 else node.kwargs.get("fill_value", 0)
            return torch.full(shape, float(value), dtype=dtype, device=self.device)  # type: ignore[arg-type]
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _call(self, node: fx.Node, spec: TaskSpec, leaves: list[torch.Tensor]) -> Any:
        """Run ``node`` with its op inputs bound to the assembled regions (Python values recomputed)."""
        env = self._bind(spec, leaves)

        def lookup(n: fx.Node) -> Any:
            if n in env:
                return env[n]
            if n.op == "get_attr":
                env[n] = self._attr(str(n.target))
                return env[n]
            if n.name in self.ops:  # read for its shape only (``x.shape[0]``): a meta tensor of that shape
                env[n] = self._shape_only(n.name, spec)
                return env[n]
            env[n] = _run(self.gm, n, fx.node.map_arg((n.args, n.kwargs), lookup))
            return env[n]

        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lookup)
        if _in_place(self.gm, node):  # never write into a leaf: give the op copies of its inputs
            args, kwargs = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
        if spec.param_shards > 1:
            return self._call_shard(node, spec, args, kwargs)
        return _run(self.gm, node, (args, kwargs))

    def _shape_only(self, name: str, spec: TaskSpec) -> Any:
        """Op ``name``'s output as this task would see it, on the meta device: its batch axis cut to the
        task's share of its (micro-)batch. Only its shape can be read; using its values is an error."""
        op = self.ops[name]
        axis = op.plain_sample_axis
        values = []
        lowered = copy_name(name, spec.micro_batch) if self.program.micro_batches > 1 else name
        for shape, dtype in zip(self.shapes[lowered], self.dtypes[name], strict=True):
            dims = list(shape)
            if axis >= 0 and axis < len(dims):
                lo, hi = spec.sample_range
                dims[axis] = round(hi * dims[axis]) - round(lo * dims[axis])
            values.append(torch.empty(dims, dtype=dtype, device="meta"))
        return values[0] if len(values) == 1 else tuple(values)

    def _attr(self, target: str) -> Any:
        obj: Any = self.gm
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def _bind(self, spec: TaskSpec, leaves: list[torch.Tensor]) -> dict[fx.Node, Any]:
        """fx env entries for the op nodes (and output-selecting getitems) this task reads."""
        by_output: dict[tuple[str, int], torch.Tensor] = {
            (inp.src_node, inp.src_output): leaf for inp, leaf in zip(spec.inputs, leaves, strict=True)
        }
        env: dict[fx.Node, Any] = {}
        node = self.nodes[spec.node]
        for n in node.all_input_nodes:
            self._bind_node(n, by_output, env)
        return env

    def _bind_node(self, n: fx.Node, by_output: dict[tuple[str, int], torch.Tensor], env: dict[fx.Node, Any]) -> None:
        if n.name in self.ops:
            count = len(self.dtypes[n.name])
            values = [by_output.get((n.name, k)) for k in range(count)]
            if count == 1:
                if values[0] is not None:
                    env[n] = values[0]
            else:
                env[n] = tuple(values)
            return
        if (
            n.op == "call_function"
            and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node)
            and n.args[0].name in self.ops
            and isinstance(n.args[1], int)
            and len(self.dtypes[n.args[0].name]) > 1
        ):
            found = by_output.get((n.args[0].name, n.args[1]))
            if found is not None:
                env[n] = found
            return
        for m in n.all_input_nodes:
            self._bind_node(m, by_output, env)

    def _call_shard(self, node: fx.Node, spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A linear, convolution or embedding on its parameter shard (the task's weight rows/columns)."""
        owner = self.owner[spec.node]
        tensors = self.held[(owner, spec.param_shard)]
        module = self.gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        weight, bias = tensors["weight"], tensors.get("bias")
        if isinstance(module, nn.Linear):
            return F.linear(args[0], weight, bias)
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return module._conv_forward(args[0], weight, bias)
        if isinstance(module, nn.Embedding):
            return F.embedding(
                args[0], weight, module.padding_idx, module.max_norm, module.norm_type, module.scale_grad_by_freq
            )
        raise NotExecutableError(f"op {spec.op!r}: no sharded implementation for {node.format_node()}")

    # ------------------------------------------------------------ backward
    def _do_backward(self, ref: int) -> None:
        spec = self.specs_by_ref[ref]
        key = (spec.op, spec.task)
        outs = self.outputs[key]
        grads: list[torch.Tensor | None] = list(self.grads.get(key, [None] * len(outs)))
        for comm, work, buf, posted in self.pending_grad.pop(key, []):
            work.wait()
            self.events.append(Event("grad_recv_done", comm, posted, self._now()))
            cm = self.program.comms[comm]
            region = _slices(cm.box, spec.output_boxes[cm.src_output])
            grads[cm.src_output] = _add_region(grads[cm.src_output], outs[cm.src_output], region, buf)
        if spec.seed_gradient:
            grads[0] = torch.full_like(outs[0], spec.seed_gradient)
        begin = self._now()
        if spec.recompute:  # inside the backward's span, as the simulator's backward task spends it
            outs = self._recompute(spec, self.leaves[key])
            self.events.append(Event("recompute", ref, begin, self._now()))
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.events.append(Event("compute_backward", ref, begin, self._now()))
        for inp, leaf in zip(spec.inputs, self.leaves[key], strict=True):
            if not leaf.requires_grad:  # no gradient flows back (zeros keep each gradient transfer matched)
                continue
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            for piece in inp.pieces:
                part = g[_slices(piece.box, inp.box)]
                if piece.comm >= 0:
                    self.grad_out[piece.comm] = part.contiguous()
                    continue
                producer = self.program.tasks[(inp.src_op, piece.producer_task)]
                pkey = (inp.src_op, piece.producer_task)
                pouts = self.outputs[pkey]
                pgrads = self.grads.setdefault(pkey, [None] * len(pouts))
                region = _slices(piece.box, producer.output_boxes[inp.src_output])
                pgrads[inp.src_output] = _add_region(pgrads[inp.src_output], pouts[inp.src_output], region, part)
        del self.leaves[key]

    # ------------------------------------------------------- point to point
    def _do_send(self, ref: int) -> None:
        cm = self.program.comms[ref]
        producer = self.program.tasks[(cm.src_op, cm.src_task)]
        out = self.outputs[(cm.src_op, cm.src_task)][cm.src_output]
        data = out.detach()[_slices(cm.box, producer.output_boxes[cm.src_output])].contiguous()
        self._isend(data, cm.dst_rank, 2 * ref, "send", ref)

    def _do_recv(self, ref: int) -> None:
        cm = self.program.comms[ref]
        buf = torch.empty(_shape(cm.box), dtype=self.dtypes[self.node_of[cm.src_op]][cm.src_output], device=self.device)
        self.pending_recv[ref] = (dist.irecv(buf, cm.src_rank, tag=2 * ref), buf, self._now())

    def _do_grad_send(self, ref: int) -> None:
        cm = self.program.comms[ref]
        data = self.grad_out.pop(ref, None)
        if data is None:  # an integer input (token ids) has no gradient: zeros keep the pair matched
            dtype = self.dtypes[self.node_of[cm.src_op]][cm.src_output]
            data = torch.zeros(_shape(cm.box), dtype=dtype, device=self.device)
        self._isend(data, cm.src_rank, 2 * ref + 1, "grad_send", ref)

    def _do_grad_recv(self, ref: int) -> None:
        cm = self.program.comms[ref]
        buf = torch.empty(_shape(cm.box), dtype=self.dtypes[self.node_of[cm.src_op]][cm.src_output], device=self.device)
        work = dist.irecv(buf, cm.dst_rank, tag=2 * ref + 1)
        self.pending_grad.setdefault((cm.src_op, cm.src_task), []).append((ref, work, buf, self._now()))

    def _isend(self, data: torch.Tensor, dst: int, tag: int, kind: str, ref: int) -> None:
        self.sent += data.numel() * data.element_size()
        self.handles.append((dist.isend(data, dst, tag=tag), kind, ref, self._now(), data))

    # ------------------------------------------------------ synchronization
    def _shard_grads(self, ref: ShardRef) -> list[torch.Tensor]:
        tensors = self.held[(ref.owner, ref.shard if ref.shards > 1 else 0)]
        out = []
        for t in tensors.values():
            if t.grad is None:
                t.grad = torch.zeros_like(t)
            out.append(t.grad)
        return out

    def _do_all_reduce(self, ref: int) -> None:
        bucket = self.program.buckets[ref]
        if bucket.plain:
            grads = [g for member in bucket.plain for g in self._shard_grads(member)]
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.sent += flat.numel() * flat.element_size()
            work = dist.all_reduce(flat, group=self.groups[bucket.ranks], async_op=True)
            self.buckets.append((work, ref, flat, self._now()))
        if bucket.sharded:
            self._reduce_scatter(bucket)

    def _reduce_scatter(self, bucket: BucketSpec) -> None:
        """ZeRO: post the reduce-scatter of the bucket's ZeRO members' flattened gradients (zero-padded
        to equal chunks); this worker receives the sum of its chunk. Payload: the gradient bytes
        outside its own chunk (its own chunk's bytes go out in the all-gather, :meth:`_all_gather`)."""
        members = bucket.sharded
        flat = torch.cat([g.reshape(-1) for member in members for g in self._shard_grads(member)])
        n = len(bucket.ranks)
        own = sorted(bucket.ranks).index(self.rank)  # a group's ranks are numbered in ascending order
        lo, hi, chunk = _chunk(flat.numel(), n, own)
        padded = torch.cat([flat, flat.new_zeros(chunk * n - flat.numel())]) if chunk * n > flat.numel() else flat
        out = torch.empty(chunk, dtype=flat.dtype, device=self.device)
        self.sent += (flat.numel() - (hi - lo)) * flat.element_size()
        work = _reduce_scatter(out, padded, group=self.groups[bucket.ranks], async_op=True)
        self.scattered.append((work, bucket.bucket, out, padded, members, self._now()))
        stages = dict(zip(bucket.members, bucket.zero, strict=True))
        for member in members:  # ZeRO-2: the full gradients are not kept, only the summed chunk
            if stages[member] >= 2:
                for t in self.held[_hkey(member)].values():
                    t.grad = None

    def _all_gather(self) -> None:
        """ZeRO: each holder updates its chunk of its buckets' flattened parameters with the summed
        gradient chunk it received, and the updated chunks are all-gathered into every holder's
        parameters. Payload: its own chunk's bytes."""
        gathers = []
        for work, ref, out, _, members, posted in self.scattered:
            work.wait()
            self.events.append(Event("reduce_scatter_done", ref, posted, self._now()))
            bucket = self.program.buckets[ref]
            params = [t for member in members for t in self.held[_hkey(member)].values()]
            flat = torch.cat([t.detach().reshape(-1) for t in params])
            n = len(bucket.ranks)
            lo, hi, chunk = _chunk(flat.numel(), n, sorted(bucket.ranks).index(self.rank))
            mine = torch.zeros(chunk, dtype=flat.dtype, device=self.device)
            mine[: hi - lo] = torch.add(flat[lo:hi], out[: hi - lo], alpha=-self.lr)  # SGD on its chunk
            gathered = torch.empty(chunk * n, dtype=flat.dtype, device=self.device)
            self.sent += (hi - lo) * flat.element_size()
            begin = self._now()
            handle = _all_gather(gathered, mine, group=self.groups[bucket.ranks], async_op=True)
            gathers.append((handle, ref, gathered, params, flat.numel(), begin))
        for handle, ref, gathered, params, numel, begin in gathers:
            handle.wait()
            self.events.append(Event("all_gather_done", ref, begin, self._now()))
            _unflatten_set(gathered[:numel], params)

    def _ps_tag(self, ref: int) -> int:
        return 2 * len(self.program.comms) + ref

    def _do_push(self, ref: int) -> None:
        sp = self.program.ps[ref]
        if self.rank == sp.worker_rank:
            flat = torch.cat([g.reshape(-1) for g in self._shard_grads(sp.shard)])
            self._isend(flat, sp.server_rank, self._ps_tag(ref), "push", ref)
        else:
            numel = sum(t.numel() for t in self.held[_hkey(sp.shard)].values())
            buf = torch.empty(numel, device=self.device)
            self.ps_recv[ref] = (dist.irecv(buf, sp.worker_rank, tag=self._ps_tag(ref)), buf, self._now())

    def _do_pull(self, ref: int) -> None:
        sp = self.program.ps[ref]
        tensors = self.held[_hkey(sp.shard)]
        if self.rank == sp.server_rank:
            if _hkey(sp.shard) not in self.pulled:  # the first pull: sum every push in, update
                self.pulled.add(_hkey(sp.shard))
                grads = self._shard_grads(sp.shard)
                for other in self.program.ps:
                    if other.kind == "push" and other.shard == sp.shard and other.server_rank == self.rank:
                        work, buf, posted = self.ps_recv.pop(other.sync)
                        work.wait()
                        self.events.append(Event("push_done", other.sync, posted, self._now()))
                        _unflatten_add(buf, grads)
                self._update(tensors.values(), 1.0)
            flat = torch.cat([t.detach().reshape(-1) for t in tensors.values()])
            self._isend(flat, sp.worker_rank, self._ps_tag(ref), "pull", ref)
        else:
            numel = sum(t.numel() for t in tensors.values())
            buf = torch.empty(numel, device=self.device)
            self.ps_recv[ref] = (dist.irecv(buf, sp.server_rank, tag=self._ps_tag(ref)), buf, self._now())

    def _finish(self) -> None:
        """Wait for everything posted, unflatten the buckets, apply the updates, reset gradients."""
        for work, kind, ref, posted, _ in self.handles:
            work.wait()
            self.events.append(Event(f"{kind}_done", ref, posted, self._now()))
        for work, ref, flat, posted in self.buckets:
            work.wait()
            self.events.append(Event("all_reduce_done", ref, posted, self._now()))
            grads = [g for member in self.program.buckets[ref].plain for g in self._shard_grads(member)]
            _unflatten_set(flat, grads)
        self._all_gather()
        for ref, (work, buf, posted) in list(self.ps_recv.items()):  # the pulled parameters
            work.wait()
            self.events.append(Event("pull_done", ref, posted, self._now()))
            sp = self.program.ps[ref]
            with torch.no_grad():
                _unflatten_set(buf, list(self.held[_hkey(sp.shard)].values()))
        begin = self._now()
        for h in self.program.holdings[self.rank]:
            if h.mode == "parameter_server" and len(h.holders) > 1:
                continue  # updated by the server, pulled above
            if h.zero and len(h.holders) > 1:
                continue  # ZeRO: updated in chunks and all-gathered above
            scale = float(len(h.holders)) if h.mode == "duplicate" else 1.0
            self._update(self.held[_hkey(h.shard)].values(), scale)
        for tensors in self.held.values():
            for t in tensors.values():
                t.grad = None
        self.events.append(Event("update", 0, begin, self._now()))

    def _update(self, tensors: Any, scale: float) -> None:
        with torch.no_grad():
            for t in tensors:
                if t.grad is not None:
                    t.add_(t.grad, alpha=-self.lr * scale)


# ------------------------------------------------------------------ helpers


def _hkey(ref: ShardRef) -> tuple[str, int]:
    return (ref.owner, ref.shard if ref.shards > 1 else 0)


def _chunk(numel: int, n: int, index: int) -> tuple[int, int, int]:
    """``(lo, hi, chunk)``: holder ``index`` of ``n`` owns elements ``[lo, hi)`` of a flattened bucket of
    ``numel`` elements cut into ``n`` chunks of ``chunk = ceil(numel / n)`` (the last ones short or empty)."""
    chunk = -(-numel // n)
    lo = min(index * chunk, numel)
    return lo, min(lo + chunk, numel), chunk


def _zero(spec: TaskSpec) -> Box:
    return tuple((0, 0) for _ in spec.output_boxes[0])


def _run(gm: fx.GraphModule, node: fx.Node, bound: Any) -> Any:
    args, kwargs = bound
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_method":
        obj, *rest = args
        return getattr(obj, str(node.target))(*rest, **kwargs)
    if node.op == "call_function":
        assert callable(node.target)
        return node.target(*args, **kwargs)
    raise NotExecutableError(f"cannot run fx node {node.format_node()}")


_IN_PLACE_FUNCTIONS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)


def _in_place(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` writes into an input: a module built with ``inplace=True``, a method ending in
    ``_`` (``add_``), an augmented assignment (``x += y``), or ``inplace=True`` passed to a function."""
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).startswith("_")
    return node.target in _IN_PLACE_FUNCTIONS or node.kwargs.get("inplace") is True


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


def _needs_gradient(graph: OpGraph) -> dict[str, bool]:
    """op name -> whether its output depends on a parameter (only then does training need its gradient;
    the batch and what is computed from it alone need none)."""
    needs = {op.name: op.param_bytes > 0 or op.param_key is not None for op in graph.ops}
    predecessors = graph.predecessors
    for i, op in enumerate(graph.ops):  # topological order: every producer first
        needs[op.name] = needs[op.name] or any(needs[graph.ops[j].name] for j in predecessors[i])
    return needs


def _owners(graph: OpGraph) -> dict[str, str]:
    """op name -> the first op sharing its parameters (itself when none share them)."""
    first: dict[str, str] = {}
    out: dict[str, str] = {}
    for op in graph.ops:
        key = op.param_key or op.name
        out[op.name] = first.setdefault(key, op.name)
    return out


def _shard(p: torch.Tensor, op_type: str, name: str, ref: ShardRef) -> torch.Tensor:
    """Shard ``ref.shard`` of parameter ``p``: weight rows (bias entries) of linear and convolution,
    weight columns of embedding."""
    dim = 1 if op_type == "embedding" else 0
    size = p.shape[dim] // ref.shards
    return p.narrow(dim, ref.shard * size, size)


def _add_region(
    current: torch.Tensor | None, like: torch.Tensor, region: tuple[slice, ...], value: torch.Tensor
) -> torch.Tensor:
    """``current`` (zeros shaped like ``like`` when ``None``) with ``value`` added at ``region``."""
    if current is None:
        if value.shape == like.shape:  # the whole tensor: no copy (the sender keeps no reference)
            return value
        current = torch.zeros_like(like)
    elif current is value or current._base is not None:  # never add into a tensor shared with another
        current = current.clone()
    current[region] += value
    return current


def _unflatten_add(flat: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    offset = 0
    for g in grads:
        g += flat[offset : offset + g.numel()].view_as(g)
        offset += g.numel()


def _unflatten_set(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        with torch.no_grad():
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
