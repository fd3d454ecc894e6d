"""The computation-graph IR shared by the simulator, the searches and the agents.

An :class:`OpGraph` is a DAG of operators (:class:`Op`) joined by tensors (:class:`Tensor`). It
describes the forward pass of one training step (model plus loss); backward costs are carried on
each op (``backward_flops``) because backward tasks mirror the forward graph.

Each op records, after FlexFlow (Table 2), the dimensions of its output along which it can be
partitioned, each tagged ``sample`` (the batch), ``attribute`` (height, width, sequence length:
splitting needs halo exchange or nothing) or ``parameter`` (output channels / features: splitting
partitions the weights). It also records TAG's splittability class (sec. 4.1, graph analyzer):
``concat`` (splitting the batch yields outputs that concatenate), ``sum`` (partial results add up,
e.g. a mean loss) or ``none``.

Ops that share parameters (an unrolled LSTM layer calls one cell 40 times) carry the same
``param_key``: the parameters exist once and are synchronized once. :attr:`OpGraph.param_bytes`
counts each key once.

Coarse graphs (:func:`placement_rl.graph.coarsen.coarsen`) are ``OpGraph`` objects too: each op is a group
whose ``members`` lists the original op names.

The JSON schema (``format: placement_rl.graph``, ``schema_version: 1``) is in ``docs/formats.md``.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.io import as_float, as_int, as_list, as_str, check_header, check_keys, read_json, write_json

DimKind = Literal["sample", "attribute", "parameter"]
SplitClass = Literal["concat", "sum", "none"]

DIM_KINDS: tuple[str, ...] = ("sample", "attribute", "parameter")
SPLIT_CLASSES: tuple[str, ...] = ("concat", "sum", "none")

GRAPH_FORMAT = "placement_rl.graph"
GRAPH_SCHEMA_VERSION = 2
#: The graph schema versions :meth:`OpGraph.from_dict` reads (2 adds a tensor's ``dst_axes``).
GRAPH_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)

Shape = tuple[int, ...]

#: Bounds of an op's quantities (a graph beyond them is refused with the op and the value): FLOPs per pass
#: of one op (the largest zoo op, a 70B model's batched matmul, is under 1e16) and bytes of one tensor,
#: one op's parameters, reads or writes (1e15 bytes: a petabyte). Within them every simulated time and
#: size stays a finite float.
MAX_OP_FLOPS = 1e18
MAX_TENSOR_BYTES = 10**15
#: Bytes per element of an op's outputs: 1 (int8, bool) to 16 (complex128).
MAX_DTYPE_BYTES = 16


@dataclass(frozen=True)
class ParallelDim:
    """One partitionable dimension of an op's (first) output.

    Attributes:
        name: a readable label, e.g. ``"sample"``, ``"channel"``, ``"height"``, ``"length"``.
        kind: ``sample``, ``attribute`` or ``parameter`` (FlexFlow's SOAP, Table 2).
        axis: index of the dimension in ``op.output_shapes[0]``; for a reduction dimension, in the
            op's first input.
        size: extent of that dimension; a partition degree must divide it.
        reduction: ``True`` when the op reduces this dimension away (a mean loss over the batch):
            each partition then yields a partial output of the full shape and the partials are
            summed (TAG's "sum" class). ``False`` for ordinary output dimensions, whose partitions
            concatenate.
    """

    name: str
    kind: DimKind
    axis: int
    size: int
    reduction: bool = False


@dataclass(frozen=True)
class Op:
    """One operator of the forward graph.

    Attributes:
        name: unique within the graph.
        op_type: operator family, e.g. ``"conv2d"``, ``"linear"``, ``"lstm_cell"``, ``"relu"``, ``"group"``.
        output_shapes: one shape per output tensor (most ops have one).
        dtype_bytes: bytes per element of the outputs (4 for fp32).
        forward_flops: floating-point operations of the forward pass (a multiply-add counts 2).
        backward_flops: floating-point operations of the backward pass (input and weight gradients).
        param_bytes: bytes of the parameters this op reads; shared with ops of the same ``param_key``.
        param_key: identity of the parameters (a module path); ``None`` when the op has none.
        bytes_read: bytes read by the forward pass (inputs plus parameters), for roofline timing.
        bytes_written: bytes written by the forward pass (outputs).
        parallel_dims: the partitionable output dimensions (SOAP).
        split: TAG's splittability class, ``concat``, ``sum`` or ``none``.
        members: for an op group of a coarse graph, the names of the original ops; else empty.
    """

    name: str
    op_type: str
    output_shapes: tuple[Shape, ...]
    dtype_bytes: int = 4
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    param_bytes: int = 0
    param_key: str | None = None
    bytes_read: int = 0
    bytes_written: int = 0
    parallel_dims: tuple[ParallelDim, ...] = ()
    split: SplitClass = "concat"
    members: tuple[str, ...] = ()

    @property
    def output_bytes(self) -> int:
        """Bytes of all outputs (the activations this op produces)."""
        return sum(math.prod(s) for s in self.output_shapes) * self.dtype_bytes

    def parallel_dim(self, name: str) -> ParallelDim:
        """The parallel dimension called ``name``; ``UnknownNameError`` if there is none."""
        for dim in self.parallel_dims:
            if dim.name == name:
                return dim
        raise UnknownNameError(f"parallel dimension of op {self.name!r}", name, [d.name for d in self.parallel_dims])

    @property
    def sample_dim(self) -> ParallelDim | None:
        """The sample (batch) dimension, if the op has one."""
        return next((d for d in self.parallel_dims if d.kind == "sample"), None)

    @property
    def plain_sample_axis(self) -> int:
        """Axis of the sample dimension in the first output, or -1 when there is none or it is a reduction.

        The simulator and FT's layouts both use it: two ops with the same plain sample axis read each
        other's batch slices directly.
        """
        dim = self.sample_dim
        return dim.axis if dim is not None and not dim.reduction else -1


@dataclass(frozen=True)
class Tensor:
    """A tensor flowing from output ``src_output`` of op ``src`` into op ``dst``.

    Attributes:
        src: producer op name.
        dst: consumer op name.
        shape: the tensor's shape.
        num_bytes: its size in bytes.
        src_output: which output of ``src`` it is (0 for single-output ops).
        dst_axes: for each axis of ``dst``'s first output, the axis of this tensor it follows (-1:
            none), when the importer knows it (a transpose permutes axes, a reshape groups them);
            empty: the same layout when the ranks and sample axes agree. A split of ``dst``'s output
            along axis ``a`` reads the same fraction of this tensor along axis ``dst_axes[a]``.
    """

    src: str
    dst: str
    shape: Shape
    num_bytes: int
    src_output: int = 0
    dst_axes: tuple[int, ...] = ()


@dataclass(frozen=True)
class GraphArrays:
    """Dense numpy views of a graph for vectorized consumers (simulator, METIS, features).

    Shapes: ``N`` ops, ``E`` tensors; ops are in topological order (the graph's ``ops`` order).

    Attributes:
        forward_flops: ``(N,)`` float64.
        backward_flops: ``(N,)`` float64.
        param_bytes: ``(N,)`` int64 (shared parameters counted on each op that uses them).
        output_bytes: ``(N,)`` int64.
        edge_src: ``(E,)`` int64 producer indices.
        edge_dst: ``(E,)`` int64 consumer indices.
        edge_bytes: ``(E,)`` int64.
    """

    forward_flops: np.ndarray
    backward_flops: np.ndarray
    param_bytes: np.ndarray
    output_bytes: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray


class OpGraph:
    """A validated, immutable DAG of ops and tensors.

    Ops are stored in a topological order (the given order if it is one, else a stable Kahn order),
    so ``graph.ops[i]`` never consumes the output of ``graph.ops[j]`` for ``j > i``.

    Args:
        name: a label, e.g. the zoo model name.
        ops: the operators; names must be unique.
        tensors: the edges; every endpoint must name an op, ``src_output`` must exist.
        batch_size: the global batch size the shapes were traced with, if known.
        metadata: free-form JSON-serializable notes (source, import options, ...).

    Raises:
        ValueError: naming the offending op or edge when names repeat, an edge references a
            missing op or output, a quantity is not a number within its bounds (FLOPs at most
            :data:`MAX_OP_FLOPS`, bytes at most :data:`MAX_TENSOR_BYTES`, ``dtype_bytes`` from 1 to
            :data:`MAX_DTYPE_BYTES`), ``batch_size`` is not a positive integer, or the graph has a cycle.
    """

    def __init__(
        self,
        name: str,
        ops: Sequence[Op],
        tensors: Sequence[Tensor],
        batch_size: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"graph {name!r}: batch_size = {batch_size!r}; expected a positive integer (or none)")
        self.name = name
        self.batch_size = batch_size
        self.metadata: dict[str, Any] = dict(metadata or {})
        by_name: dict[str, Op] = {}
        for op in ops:
            _validate_op(op)
            if op.name in by_name:
                raise ValueError(f"duplicate op name {op.name!r}: op names must be unique")
            by_name[op.name] = op
        for t in tensors:
            _validate_tensor(t, by_name)
        order = _topological_order([op.name for op in ops], tensors)
        self.ops: tuple[Op, ...] = tuple(by_name[n] for n in order)
        self.tensors: tuple[Tensor, ...] = tuple(tensors)
        self._index = {op.name: i for i, op in enumerate(self.ops)}

    @classmethod
    def derived(
        cls,
        name: str,
        ops: Sequence[Op],
        tensors: Sequence[Tensor],
        batch_size: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> OpGraph:
        """A graph the library derives from a validated one (micro-batch copies, a replica's share),
        its ops already unique and in topological order: built without checking them again (a
        million-op micro-batch graph would spend most of its construction there)."""
        graph = cls.__new__(cls)
        graph.name = name
        graph.batch_size = batch_size
        graph.metadata = dict(metadata or {})
        graph.ops = tuple(ops)
        graph.tensors = tuple(tensors)
        graph._index = {op.name: i for i, op in enumerate(graph.ops)}
        return graph

    # ----------------------------------------------------------------- lookups
    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def op(self, name: str) -> Op:
        """The op called ``name``; ``UnknownNameError`` listing valid names otherwise."""
        try:
            return self.ops[self._index[name]]
        except KeyError:
            raise UnknownNameError(f"op of graph {self.name!r}", name, self._index) from None

    def index(self, name: str) -> int:
        """Topological index of op ``name``."""
        self.op(name)
        return self._index[name]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """For each op index, the sorted indices of ops it consumes from."""
        preds: list[set[int]] = [set() for _ in self.ops]
        for t in self.tensors:
            preds[self._index[t.dst]].add(self._index[t.src])
        return tuple(tuple(sorted(p)) for p in preds)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """For each op index, the sorted indices of ops consuming its outputs."""
        succs: list[set[int]] = [set() for _ in self.ops]
        for t in self.tensors:
            succs[self._index[t.src]].add(self._index[t.dst])
        return tuple(tuple(sorted(s)) for s in succs)

    @cached_property
    def in_tensors(self) -> tuple[tuple[int, ...], ...]:
        """For each op index, the indices (into ``tensors``) of the tensors it reads, in tensor order."""
        ins: list[list[int]] = [[] for _ in self.ops]
        for e, t in enumerate(self.tensors):
            ins[self._index[t.dst]].append(e)
        return tuple(tuple(x) for x in ins)

    @cached_property
    def out_tensors(self) -> tuple[tuple[int, ...], ...]:
        """For each op index, the indices (into ``tensors``) of the tensors it produces, in tensor order."""
        outs: list[list[int]] = [[] for _ in self.ops]
        for e, t in enumerate(self.tensors):
            outs[self._index[t.src]].append(e)
        return tuple(tuple(x) for x in outs)

    @cached_property
    def arrays(self) -> GraphArrays:
        """Dense numpy views (see :class:`GraphArrays`)."""
        return GraphArrays(
            forward_flops=np.array([op.forward_flops for op in self.ops], dtype=np.float64),
            backward_flops=np.array([op.backward_flops for op in self.ops], dtype=np.float64),
            param_bytes=np.array([op.param_bytes for op in self.ops], dtype=np.int64),
            output_bytes=np.array([op.output_bytes for op in self.ops], dtype=np.int64),
            edge_src=np.array([self._index[t.src] for t in self.tensors], dtype=np.int64),
            edge_dst=np.array([self._index[t.dst] for t in self.tensors], dtype=np.int64),
            edge_bytes=np.array([t.num_bytes for t in self.tensors], dtype=np.int64),
        )

    def subgraph(self, names: Iterable[str], name: str | None = None) -> OpGraph:
        """The induced subgraph on ops ``names`` (tensors with both ends inside)."""
        keep = set(names)
        for n in keep:
            self.op(n)
        return OpGraph(
            name or f"{self.name}/sub",
            [op for op in self.ops if op.name in keep],
            [t for t in self.tensors if t.src in keep and t.dst in keep],
            batch_size=self.batch_size,
        )

    # ------------------------------------------------------------- aggregates
    @property
    def param_bytes(self) -> int:
        """Total parameter bytes, counting shared parameters (same ``param_key``) once."""
        seen: dict[str, int] = {}
        total = 0
        for op in self.ops:
            if op.param_key is None:
                total += op.param_bytes
            else:
                seen[op.param_key] = op.param_bytes
        return total + sum(seen.values())

    @property
    def forward_flops(self) -> float:
        return float(sum(op.forward_flops for op in self.ops))

    @property
    def backward_flops(self) -> float:
        return float(sum(op.backward_flops for op in self.ops))

    def op_type_counts(self) -> dict[str, int]:
        """How many ops of each type, most frequent first."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.op_type] = counts.get(op.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> str:
        """A few human-readable lines: size, parameters, FLOPs, the most common op types."""
        types = ", ".join(f"{k} x{v}" for k, v in list(self.op_type_counts().items())[:8])
        return "\n".join(
            [
                f"graph {self.name}: {self.num_ops} ops, {len(self.tensors)} tensors, batch size {self.batch_size}",
                f"  parameters: {self.param_bytes / 2**20:,.1f} MiB",
                f"  forward: {self.forward_flops / 1e9:,.2f} GFLOP, backward: {self.backward_flops / 1e9:,.2f} GFLOP",
                f"  activations: {sum(op.output_bytes for op in self.ops) / 2**20:,.1f} MiB",
                f"  op types: {types}",
            ]
        )

    # --------------------------------------------------------------- equality
    def _key(self) -> tuple[Any, ...]:
        return (self.name, self.batch_size, self.ops, self.tensors, _freeze(self.metadata))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpGraph) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.name, self.num_ops, len(self.tensors)))

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, ops={self.num_ops}, tensors={len(self.tensors)})"

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``docs/formats.md``, format ``placement_rl.graph`` v1)."""
        return {
            "format": GRAPH_FORMAT,
            "schema_version": GRAPH_SCHEMA_VERSION,
            "name": self.name,
            "batch_size": self.batch_size,
            "metadata": self.metadata,
            "ops": [_op_to_dict(op) for op in self.ops],
            "tensors": [
                {
                    "src": t.src,
                    "dst": t.dst,
                    "src_output": t.src_output,
                    "shape": list(t.shape),
                    "num_bytes": t.num_bytes,
                    **({"dst_axes": list(t.dst_axes)} if t.dst_axes else {}),
                }
                for t in self.tensors
            ],
        }

    @classmethod
    def from_dict(cls, document: Any) -> OpGraph:
        """Rebuild a graph from :meth:`to_dict` output, validating the schema and the graph."""
        check_header(document, GRAPH_FORMAT, GRAPH_SCHEMA_VERSIONS)
        tensor_keys = {"src_output", "dst_axes"} if document["schema_version"] >= 2 else {"src_output"}
        check_keys(
            document, "graph", {"format", "schema_version", "name", "ops", "tensors"}, {"batch_size", "metadata"}
        )
        ops = [_op_from_dict(d, f"graph.ops[{i}]") for i, d in enumerate(as_list(document["ops"], "graph.ops"))]
        tensors = []
        for i, d in enumerate(as_list(document["tensors"], "graph.tensors")):
            where = f"graph.tensors[{i}]"
            check_keys(d, where, {"src", "dst", "shape", "num_bytes"}, tensor_keys)
            dst_axes = as_list(d.get("dst_axes", []), f"{where}.dst_axes")
            num_bytes = as_int(d["num_bytes"], f"{where}.num_bytes")
            _check_quantity(num_bytes, f"{where}.num_bytes", MAX_TENSOR_BYTES, integer=True)
            shape = _shape(d["shape"], f"{where}.shape")
            _check_shape(shape, 1, f"{where}.shape")
            tensors.append(
                Tensor(
                    src=as_str(d["src"], f"{where}.src"),
                    dst=as_str(d["dst"], f"{where}.dst"),
                    shape=shape,
                    num_bytes=num_bytes,
                    src_output=as_int(d.get("src_output", 0), f"{where}.src_output"),
                    dst_axes=tuple(as_int(a, f"{where}.dst_axes[{k}]") for k, a in enumerate(dst_axes)),
                )
            )
        metadata = document.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SchemaError(f"graph.metadata: expected an object, got {type(metadata).__name__}")
        batch = document.get("batch_size")
        if batch is not None and as_int(batch, "graph.batch_size") < 1:
            raise SchemaError(f"graph.batch_size = {batch!r}; expected a positive integer (or null)")
        return cls(
            as_str(document["name"], "graph.name"),
            ops,
            tensors,
            batch_size=None if batch is None else as_int(batch, "graph.batch_size"),
            metadata=metadata,
        )

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> OpGraph:
        """Read a graph JSON file; every error names the file (and the key, as :meth:`from_dict`'s do).

        Raises:
            SchemaError: a bad document or graph, its message prefixed with ``path``.
        """
        document = read_json(path)
        try:
            return cls.from_dict(document)
        except ValueError as exc:
            raise SchemaError(f"{path}: {exc}") from None


# ---------------------------------------------------------------- validation
def _validate_op(op: Op) -> None:
    where = f"op {op.name!r}"
    if not op.name:
        raise ValueError("op with an empty name: every op needs a unique non-empty name")
    if not op.output_shapes:
        raise ValueError(f"{where}: has no output shape; expected at least one")
    if not _is_int(op.dtype_bytes) or not 1 <= op.dtype_bytes <= MAX_DTYPE_BYTES:
        raise ValueError(f"{where}: dtype_bytes = {op.dtype_bytes!r}; expected an integer from 1 to {MAX_DTYPE_BYTES}")
    for shape in op.output_shapes:
        _check_shape(shape, op.dtype_bytes, f"{where}: output shape")
    for attr in ("forward_flops", "backward_flops"):
        _check_quantity(getattr(op, attr), f"{where}: {attr}", MAX_OP_FLOPS, integer=False)
    for attr in ("param_bytes", "bytes_read", "bytes_written"):
        _check_quantity(getattr(op, attr), f"{where}: {attr}", MAX_TENSOR_BYTES, integer=True)
    if op.split not in SPLIT_CLASSES:
        raise ValueError(f"{where}: split class {op.split!r}; expected one of {list(SPLIT_CLASSES)}")
    names = set()
    for dim in op.parallel_dims:
        if dim.kind not in DIM_KINDS:
            raise ValueError(
                f"{where}: parallel dim {dim.name!r} has kind {dim.kind!r}; expected one of {list(DIM_KINDS)}"
            )
        if dim.size <= 0:
            raise ValueError(f"{where}: parallel dim {dim.name!r} has size {dim.size}; expected a positive extent")
        if dim.reduction:
            if dim.axis < 0:
                raise ValueError(f"{where}: reduction dim {dim.name!r} has negative axis {dim.axis}")
        elif not 0 <= dim.axis < len(op.output_shapes[0]):
            raise ValueError(
                f"{where}: parallel dim {dim.name!r} axis {dim.axis} outside output shape {op.output_shapes[0]}"
            )
        elif dim.size != op.output_shapes[0][dim.axis]:
            raise ValueError(
                f"{where}: parallel dim {dim.name!r} size {dim.size} != output extent {op.output_shapes[0][dim.axis]}"
            )
        if dim.name in names:
            raise ValueError(f"{where}: duplicate parallel dim name {dim.name!r}")
        names.add(dim.name)


def _validate_tensor(t: Tensor, ops: dict[str, Op]) -> None:
    where = f"tensor {t.src!r} -> {t.dst!r}"
    for end in (t.src, t.dst):
        if end not in ops:
            raise ValueError(f"{where}: references op {end!r}, which is not in the graph")
    if t.src == t.dst:
        raise ValueError(f"{where}: a self-loop makes the graph cyclic")
    _check_quantity(t.num_bytes, f"{where}: num_bytes", MAX_TENSOR_BYTES, integer=True)
    _check_shape(t.shape, 1, f"{where}: shape")
    if not 0 <= t.src_output < len(ops[t.src].output_shapes):
        raise ValueError(
            f"{where}: src_output {t.src_output} but op {t.src!r} has {len(ops[t.src].output_shapes)} output(s)"
        )
    if t.dst_axes:
        rank = len(ops[t.dst].output_shapes[0])
        if len(t.dst_axes) != rank or any(not -1 <= a < len(t.shape) for a in t.dst_axes):
            raise ValueError(
                f"{where}: dst_axes {list(t.dst_axes)}; expected one entry per axis of {t.dst!r}'s output (rank "
                f"{rank}), each an axis of the tensor (0 to {len(t.shape) - 1}) or -1"
            )


class CycleError(ValueError):
    """The graph is not a DAG. ``nodes``: the indices left on or behind a cycle, ascending."""

    def __init__(self, message: str, nodes: Sequence[int]) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)


def topological_order(num_nodes: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """Kahn's algorithm over nodes ``0 .. num_nodes - 1``, stable: among ready nodes the smallest
    index goes first, so an order that already is topological is kept. Repeated edges count once.

    The one topological sort of the project (ops of a graph, op groups, FT's cost graphs).

    Raises:
        CycleError: listing the nodes that could not be ordered.
    """
    succs: list[set[int]] = [set() for _ in range(num_nodes)]
    indegree = [0] * num_nodes
    for s, d in edges:
        if d not in succs[s]:
            succs[s].add(d)
            indegree[d] += 1
    ready = [i for i, deg in enumerate(indegree) if deg == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succs[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != num_nodes:
        stuck = [i for i, deg in enumerate(indegree) if deg > 0]
        raise CycleError(f"{len(stuck)} node(s) lie on or behind a cycle", stuck)
    return order


def _topological_order(names: list[str], tensors: Iterable[Tensor]) -> list[str]:
    """The ops' names in stable topological order (:func:`topological_order`).

    Raises:
        ValueError: naming ops on a cycle when the graph is not a DAG.
    """
    position = {n: i for i, n in enumerate(names)}
    try:
        order = topological_order(len(names), ((position[t.src], position[t.dst]) for t in tensors))
    except CycleError as exc:
        stuck = sorted(names[i] for i in exc.nodes)
        shown = ", ".join(repr(n) for n in stuck[:10]) + (" ..." if len(stuck) > 10 else "")
        raise ValueError(f"the graph has a cycle through op(s) {shown}; expected a DAG") from None
    return [names[i] for i in order]


# ---------------------------------------------------------------- JSON helpers
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_quantity(value: Any, where: str, maximum: float, integer: bool) -> None:
    """``value`` must be a number (an integer if ``integer``) from 0 to ``maximum``; compared without
    converting to float, so an integer of 400 digits is refused, not an ``OverflowError``."""
    kind = "an integer" if integer else "a number"
    ok = _is_int(value) or (not integer and isinstance(value, float) and math.isfinite(value))
    if not ok or not 0 <= value <= maximum:
        raise ValueError(f"{where} = {_short(value)}; expected {kind} from 0 to {maximum:.0e}")


def _check_shape(shape: Any, dtype_bytes: int, where: str) -> None:
    """Every extent a non-negative integer and the whole at most :data:`MAX_TENSOR_BYTES` bytes."""
    if not all(_is_int(d) and d >= 0 for d in shape):
        raise ValueError(
            f"{where} {_short(list(shape))} has a negative dimension or one not an integer; expected "
            "non-negative integer extents"
        )
    if math.prod(shape) * dtype_bytes > MAX_TENSOR_BYTES:
        raise ValueError(
            f"{where} {_short(list(shape))}: {_short(math.prod(shape) * dtype_bytes)} bytes; expected at most "
            f"{MAX_TENSOR_BYTES:.0e} bytes per tensor"
        )


def _short(value: Any) -> str:
    """``repr(value)``, an integer of many digits shortened (``1000...000 (401 digits)``)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:24]}...{text[-12:]} ({len(text)} characters)"


def _op_to_dict(op: Op) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": op.name,
        "op_type": op.op_type,
        "output_shapes": [list(s) for s in op.output_shapes],
        "dtype_bytes": op.dtype_bytes,
        "forward_flops": op.forward_flops,
        "backward_flops": op.backward_flops,
        "param_bytes": op.param_bytes,
        "param_key": op.param_key,
        "bytes_read": op.bytes_read,
        "bytes_written": op.bytes_written,
        "parallel_dims": [_dim_to_dict(p) for p in op.parallel_dims],
        "split": op.split,
    }
    if op.members:
        d["members"] = list(op.members)
    return d


def _dim_to_dict(dim: ParallelDim) -> dict[str, Any]:
    d: dict[str, Any] = {"name": dim.name, "kind": dim.kind, "axis": dim.axis, "size": dim.size}
    if dim.reduction:
        d["reduction"] = True
    return d


_OP_REQUIRED = {"name", "op_type", "output_shapes"}
_OP_OPTIONAL = {
    "dtype_bytes",
    "forward_flops",
    "backward_flops",
    "param_bytes",
    "param_key",
    "bytes_read",
    "bytes_written",
    "parallel_dims",
    "split",
    "members",
}


def _op_from_dict(d: Any, where: str) -> Op:
    check_keys(d, where, _OP_REQUIRED, _OP_OPTIONAL)
    dims = []
    for j, p in enumerate(as_list(d.get("parallel_dims", []), f"{where}.parallel_dims")):
        w = f"{where}.parallel_dims[{j}]"
        check_keys(p, w, {"name", "kind", "axis", "size"}, {"reduction"})
        reduction = p.get("reduction", False)
        if not isinstance(reduction, bool):
            raise SchemaError(f"{w}.reduction: expected true or false, got {reduction!r}")
        dims.append(
            ParallelDim(
                as_str(p["name"], f"{w}.name"),
                p["kind"],
                as_int(p["axis"], f"{w}.axis"),
                as_int(p["size"], f"{w}.size"),
                reduction,
            )
        )
    key = d.get("param_key")
    for name, default, maximum in (
        ("forward_flops", 0.0, MAX_OP_FLOPS),
        ("backward_flops", 0.0, MAX_OP_FLOPS),
        ("param_bytes", 0, MAX_TENSOR_BYTES),
        ("bytes_read", 0, MAX_TENSOR_BYTES),
        ("bytes_written", 0, MAX_TENSOR_BYTES),
    ):
        value = d.get(name, default)
        (as_float if maximum == MAX_OP_FLOPS else as_int)(value, f"{where}.{name}")  # the type, named
        _check_quantity(value, f"{where}.{name}", maximum, integer=maximum != MAX_OP_FLOPS)
    dtype_bytes = as_int(d.get("dtype_bytes", 4), f"{where}.dtype_bytes")
    if not 1 <= dtype_bytes <= MAX_DTYPE_BYTES:
        raise SchemaError(
            f"{where}.dtype_bytes = {_short(dtype_bytes)}; expected an integer from 1 to {MAX_DTYPE_BYTES}"
        )
    for k, s in enumerate(as_list(d["output_shapes"], f"{where}.output_shapes")):
        _check_shape(_shape(s, f"{where}.output_shapes[{k}]"), dtype_bytes, f"{where}.output_shapes[{k}]")
    return Op(
        name=as_str(d["name"], f"{where}.name"),
        op_type=as_str(d["op_type"], f"{where}.op_type"),
        output_shapes=tuple(
            _shape(s, f"{where}.output_shapes") for s in as_list(d["output_shapes"], f"{where}.output_shapes")
        ),
        dtype_bytes=as_int(d.get("dtype_bytes", 4), f"{where}.dtype_bytes"),
        forward_flops=as_float(d.get("forward_flops", 0.0), f"{where}.forward_flops"),
        backward_flops=as_float(d.get("backward_flops", 0.0), f"{where}.backward_flops"),
        param_bytes=as_int(d.get("param_bytes", 0), f"{where}.param_bytes"),
        param_key=None if key is None else as_str(key, f"{where}.param_key"),
        bytes_read=as_int(d.get("bytes_read", 0), f"{where}.bytes_read"),
        bytes_written=as_int(d.get("bytes_written", 0), f"{where}.bytes_written"),
        parallel_dims=tuple(dims),
        split=d.get("split", "concat"),
        members=tuple(as_str(m, f"{where}.members") for m in as_list(d.get("members", []), f"{where}.members")),
    )


def _shape(value: Any, where: str) -> Shape:
    return tuple(as_int(v, where) for v in as_list(value, where))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
