"""The shared execution simulator: one deterministic ``simulate(graph, topology, plan) -> SimResult``.

It follows FlexFlow's simulator (sec. 5.1-5.2) with TAG's memory accounting (sec. 4.3.2):

**Task graph.** Every op with configuration ``c`` becomes ``len(c.devices)`` forward tasks and as
many backward tasks (partition ``t // R``, replica ``t % R``). For each tensor of the graph and each
consumer task, the simulator computes which producer partitions hold the region the consumer reads:
regions are per-axis boxes (fractions of each axis), a producer partition covers its slice of the
output, and a consumer reads the slice of its input that its sample and attribute splits select
(parameter splits read the whole input; halos of spatial splits are ignored). A sample (or
attribute) split in the producer that the consumer does not share moves bytes; a split along a
reduction dimension yields full-size partial results, each of which is sent. When a producer
partition is replicated, the replica on the consumer's device is used if there is one. Same-device
pairs become dependencies; the others become transfer tasks on the route between the two devices,
and mirrored gradient transfers for backward. Backward task ``t`` follows forward task ``t`` and the
backward tasks of the consumers it fed.

**Synchronization.** Parameters are split along parameter dimensions and replicated along the
others. For each shard held by several devices: ring all-reduce (one collective task occupying
every link direction of the ring), or parameter-server push and pull transfers, or nothing for
``duplicate``. Ops sharing a ``param_key`` (an unrolled LSTM layer) synchronize once, after all of
their backward tasks, over every device that runs any of them (per shard when they split the
parameters alike), with the first op's sync mode.

**Scheduling.** Links are resources like devices, one per direction, so computation and
communication overlap (A1-A4). A global queue ordered by ready time assigns tasks to their
resources FIFO; a transfer holds every link direction of its route (alpha-beta time with the route's
bottleneck bandwidth), so transfers that share a NIC or a switch port contend. Routes, link directions
and ring bandwidths come from :mod:`placement_rl.sim.network`, shared with FT's cost tables.

**Memory.** Per device: parameters, gradients and optimizer state of every shard it holds (per
parameter element under the cost model's precision, :mod:`placement_rl.sim.cost`); each
forward task's output from its start until its backward task ends; received activations and
gradients until the backward task that uses them ends; a backward workspace the size of the
task's output while it runs. The peak is the maximum over time (events swept in time order, frees
first on ties). A device whose peak exceeds its memory is reported in ``oom_devices`` (the
simulation itself always completes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl.graph import Op, OpGraph
from placement_rl.plan.core import OpConfig, Plan
from placement_rl.sim import kernels as _kernels
from placement_rl.sim import network as _network
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import TASK_KINDS, SimResult, TaskTable
from placement_rl.topology import DeviceTopology

MAX_RANK = _kernels.MAX_RANK
_FORWARD, _BACKWARD, _TRANSFER, _GRAD_TRANSFER, _ALL_REDUCE, _PS_PUSH, _PS_PULL = range(len(TASK_KINDS))

DEFAULT_COST_MODEL = CostModel()


@dataclass
class _CompiledOp:
    """One op under one configuration, as the arrays the kernels read. Shapes: T tasks, P partitions,
    S synchronization tasks."""

    devices: np.ndarray  # (T,) int64 device indices
    partitions: int
    replicas: int
    prod_lo: np.ndarray  # (P, MAX_RANK) region of the output each partition produces
    prod_hi: np.ndarray
    need_lo: np.ndarray  # (P, MAX_RANK) region of a same-layout input each partition reads
    need_hi: np.ndarray
    samp_lo: np.ndarray  # (P,) sample interval each partition reads
    samp_hi: np.ndarray
    forward_s: np.ndarray  # (T,)
    backward_s: np.ndarray  # (T,)
    activation_bytes: np.ndarray  # (T,) output bytes each task holds until its backward ends
    static_devices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    static_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Gradient synchronization tasks (owners of parameters only), as a template with local ids.
    sync_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (S,)
    sync_duration: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (S,)
    sync_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (S,)
    sync_res: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # resources, flat
    sync_res_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (S,)
    sync_after_backward: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # (S,)
    sync_dep_u: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # push -> pull, local ids
    sync_dep_v: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Parameter shards (for ops sharing parameters with others): shard of each task, shard count.
    task_shard: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (T,)
    shards: int = 1
    sync_mode: str = "all_reduce"
    ps_device: int = -1


@dataclass
class Segments:
    """Per-edge transfer segments (local task indices), the unit delta simulation rebuilds."""

    dep_p: list[np.ndarray]
    dep_q: list[np.ndarray]
    com_p: list[np.ndarray]
    com_q: list[np.ndarray]
    com_b: list[np.ndarray]


@dataclass
class _Tasks:
    """The assembled task graph of one plan (see :meth:`SimContext.assemble`). T tasks."""

    duration: np.ndarray
    res: np.ndarray
    res_ptr: np.ndarray
    succ_ptr: np.ndarray
    succ: np.ndarray
    indegree: np.ndarray
    kind: np.ndarray
    op: np.ndarray
    num_bytes: np.ndarray
    task_dev: np.ndarray
    task_ptr: np.ndarray
    F: int
    C: int
    c_src: np.ndarray
    c_dst: np.ndarray


def _splice(arr: np.ndarray, ptr: np.ndarray, i: int, piece: np.ndarray) -> np.ndarray:
    """``arr`` with the slice ``ptr[i]:ptr[i+1]`` replaced by ``piece``."""
    return np.concatenate((arr[: ptr[i]], piece, arr[ptr[i + 1] :]))


def _reptr(ptr: np.ndarray, i: int, length: int) -> np.ndarray:
    """Segment pointers after segment ``i`` takes ``length`` entries."""
    out = ptr.copy()
    out[i + 1 :] += length - (ptr[i + 1] - ptr[i])
    return out


_OP_FIELDS = {  # per-op arrays concatenated in op order, grouped by the pointer that splits them
    "task": ("devices", "forward_s", "backward_s", "activation_bytes"),
    "static": ("static_devices", "static_bytes"),
    "sync": ("sync_kind", "sync_duration", "sync_bytes", "sync_after_backward", "sync_res_len"),
    "sync_res": ("sync_res",),
    "pull": ("sync_dep_u", "sync_dep_v"),
}


@dataclass
class OpArrays:
    """The compiled configurations of all ops, concatenated in op order (``ptr[group]`` splits them).

    Delta simulation replaces one op's slices (:meth:`replace`) instead of re-concatenating all ops.
    """

    ptr: dict[str, np.ndarray]
    data: dict[str, np.ndarray]

    @classmethod
    def from_ops(cls, ops: Sequence[_CompiledOp]) -> OpArrays:
        ptr: dict[str, np.ndarray] = {}
        data: dict[str, np.ndarray] = {}
        for group, fields in _OP_FIELDS.items():
            ptr[group] = np.concatenate(([0], np.cumsum([getattr(c, fields[0]).shape[0] for c in ops]))).astype(
                np.int64
            )
            for f in fields:
                data[f] = np.concatenate([getattr(c, f) for c in ops])
        return cls(ptr, data)

    def replace(self, i: int, c: _CompiledOp) -> OpArrays:
        """Op ``i``'s slices replaced by those of ``c``."""
        return self.replace_groups(i, {f: getattr(c, f) for fields in _OP_FIELDS.values() for f in fields}, _OP_FIELDS)

    def replace_groups(self, i: int, values: Mapping[str, np.ndarray], groups: Iterable[str]) -> OpArrays:
        """Op ``i``'s slices of the fields of ``groups`` replaced by ``values``."""
        ptr, data = dict(self.ptr), dict(self.data)
        for group in groups:
            fields = _OP_FIELDS[group]
            old = self.ptr[group]
            for f in fields:
                data[f] = _splice(self.data[f], old, i, values[f])
            ptr[group] = _reptr(old, i, values[fields[0]].shape[0])
        return OpArrays(ptr, data)


@dataclass
class EdgeArrays:
    """Transfer segments of all edges (local task indices), concatenated in edge order."""

    dep_ptr: np.ndarray
    com_ptr: np.ndarray
    dep_p: np.ndarray
    dep_q: np.ndarray
    com_p: np.ndarray
    com_q: np.ndarray
    com_b: np.ndarray

    @classmethod
    def from_flat(cls, dep_p, dep_q, com_p, com_q, com_b, n_dep, n_com) -> EdgeArrays:  # type: ignore[no-untyped-def]
        dep_ptr = np.concatenate(([0], np.cumsum(n_dep))).astype(np.int64)
        com_ptr = np.concatenate(([0], np.cumsum(n_com))).astype(np.int64)
        return cls(dep_ptr, com_ptr, dep_p, dep_q, com_p, com_q, com_b)

    def replace(self, e: int, dep_p, dep_q, com_p, com_q, com_b) -> EdgeArrays:  # type: ignore[no-untyped-def]
        return EdgeArrays(
            _reptr(self.dep_ptr, e, dep_p.shape[0]),
            _reptr(self.com_ptr, e, com_p.shape[0]),
            _splice(self.dep_p, self.dep_ptr, e, dep_p),
            _splice(self.dep_q, self.dep_ptr, e, dep_q),
            _splice(self.com_p, self.com_ptr, e, com_p),
            _splice(self.com_q, self.com_ptr, e, com_q),
            _splice(self.com_b, self.com_ptr, e, com_b),
        )


class SimContext:
    """Everything about a (graph, topology, cost model) triple that does not depend on the plan.

    Build it once and call :meth:`simulate` for many plans: routes, per-edge layouts and compiled
    op configurations are cached (searches re-simulate plans that differ in one op).
    """

    def __init__(self, graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None = None) -> None:
        self.graph = graph
        self.topology = topology
        self.cost = cost_model or DEFAULT_COST_MODEL
        devices = topology.devices
        self.num_devices = D = len(devices)
        self._device_index = {d.name: i for i, d in enumerate(devices)}
        self.num_links = len(topology.links)
        self.num_resources = D + 2 * self.num_links
        self._lanes = tuple(d.name for d in devices) + tuple(
            name for link in topology.links for name in (f"link {link.a} -> {link.b}", f"link {link.b} -> {link.a}")
        )
        self._capacity = np.array([d.memory_bytes for d in devices], dtype=np.float64)
        self.network = _network.network(topology)
        # the simulator's resources are devices then link directions: direction d is resource D + d
        self._route_res = self.network.route_dirs + D
        self._build_edges()
        self._owner: dict[str, int] = {}
        self._key_ops: dict[str, list[int]] = {}
        for i, op in enumerate(graph.ops):
            key = op.param_key or (f"\0{op.name}" if op.param_bytes else None)
            if key is not None:
                self._owner.setdefault(key, i)
                self._key_ops.setdefault(key, []).append(i)
        self._op_key = [op.param_key or (f"\0{op.name}" if op.param_bytes else None) for op in graph.ops]
        users: list[list[int]] = [
            self._key_ops[k] if k is not None and self._owner[k] == i else [] for i, k in enumerate(self._op_key)
        ]
        self._users_ptr = np.concatenate(([0], np.cumsum([len(u) for u in users]))).astype(np.int64)
        self._users = np.array([j for u in users for j in u], dtype=np.int64)
        self._compiled: dict[tuple[int, OpConfig], _CompiledOp] = {}
        self._shared_owners = sorted({self._owner[k] for k, users in self._key_ops.items() if len(users) > 1})
        self._shared_cache: dict[Any, dict[str, np.ndarray]] = {}

    # ----------------------------------------------------------- static parts
    def _build_edges(self) -> None:
        g = self.graph
        arr = g.arrays
        self.e_src = arr.edge_src
        self.e_dst = arr.edge_dst
        # in the cost model's precision (the graph records the traced dtype)
        self.e_bytes = np.array([self.cost.tensor_bytes(t.num_bytes, t.shape) for t in g.tensors], dtype=np.float64)
        ranks, same, prod_box = [], [], []
        for t in g.tensors:
            src, dst = g.op(t.src), g.op(t.dst)
            rank = len(t.shape)
            if rank > MAX_RANK:
                raise ValueError(
                    f"tensor {t.src!r} -> {t.dst!r} has rank {rank}; the simulator supports up to {MAX_RANK}"
                )
            ranks.append(rank)
            box = t.src_output == 0 or len(src.output_shapes[t.src_output]) == len(src.output_shapes[0])
            prod_box.append(box)
            s_src, s_dst = src.plain_sample_axis, dst.plain_sample_axis
            same.append(box and rank == len(dst.output_shapes[0]) and s_src == s_dst and s_dst >= 0)
        self.e_rank = np.array(ranks, dtype=np.int64)
        self.e_same = np.array(same, dtype=np.bool_)
        self.e_prod_box = np.array(prod_box, dtype=np.bool_)
        self.op_sample_axis = np.array([op.plain_sample_axis for op in g.ops], dtype=np.int64)

    # ---------------------------------------------------------- compilation
    #: compiled configurations kept; searches visit many more, so the cache is cleared when full.
    CACHE_SIZE = 20_000

    def compile(self, index: int, cfg: OpConfig) -> _CompiledOp:
        """The arrays for op ``index`` under ``cfg`` (cached)."""
        key = (index, cfg)
        found = self._compiled.get(key)
        if found is None:
            if len(self._compiled) >= self.CACHE_SIZE:
                self._compiled.clear()
            found = self._compiled[key] = self._compile(self.graph.ops[index], index, cfg)
        return found

    def compile_uncached(self, index: int, cfg: OpConfig) -> _CompiledOp:
        """Like :meth:`compile` without touching the cache (for searches)."""
        return self._compile(self.graph.ops[index], index, cfg)

    def _compile(self, op: Op, index: int, cfg: OpConfig) -> _CompiledOp:
        try:
            devices = np.array([self._device_index[d] for d in cfg.devices], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(
                f"op {op.name!r}: device {exc.args[0]!r} is not in topology {self.topology.name!r}"
            ) from None
        degrees = cfg.degree_map
        split = [(d, degrees[d.name]) for d in op.parallel_dims if degrees.get(d.name, 1) > 1]
        P = math.prod(deg for _, deg in split)
        R = len(devices) // P
        idx = (
            np.array(np.unravel_index(np.arange(P), [deg for _, deg in split])).T
            if split
            else np.zeros((1, 0), np.int64)
        )
        prod_lo, prod_hi = np.zeros((P, MAX_RANK)), np.ones((P, MAX_RANK))
        need_lo, need_hi = np.zeros((P, MAX_RANK)), np.ones((P, MAX_RANK))
        samp_lo, samp_hi = np.zeros(P), np.ones(P)
        shard = np.zeros(P, np.int64)
        shards = 1
        out_shape = list(op.output_shapes[0])
        for k, (dim, deg) in enumerate(split):
            lo, hi = idx[:, k] / deg, (idx[:, k] + 1) / deg
            if dim.kind == "sample":
                samp_lo, samp_hi = lo, hi
            if not dim.reduction:
                prod_lo[:, dim.axis], prod_hi[:, dim.axis] = lo, hi
                out_shape[dim.axis] //= deg
                if dim.kind != "parameter":
                    need_lo[:, dim.axis], need_hi[:, dim.axis] = lo, hi
            if dim.kind == "parameter":
                shard = shard * deg + idx[:, k]
                shards *= deg
        fraction = 1.0 / P
        task_param_bytes = op.param_bytes // shards
        times: dict[int, tuple[float, float]] = {}
        fwd, bwd = np.empty(len(devices)), np.empty(len(devices))
        for t, dev in enumerate(devices.tolist()):
            if dev not in times:
                d = self.topology.devices[dev]
                times[dev] = self.cost.task_times_s(
                    op,
                    fraction,
                    tuple(out_shape),
                    task_param_bytes,
                    d.device_type,
                    self.cost.peak_flops(d),
                    d.memory_bandwidth_bytes_per_s,
                )
            fwd[t], bwd[t] = times[dev]
        compiled = _CompiledOp(
            devices,
            P,
            R,
            prod_lo,
            prod_hi,
            need_lo,
            need_hi,
            samp_lo,
            samp_hi,
            fwd,
            bwd,
            np.full(len(devices), self.cost.activation_bytes(op.bytes_written, op.dtype_bytes) / P),
        )
        compiled.task_shard = shard[np.arange(len(devices)) // R]
        compiled.shards = shards
        compiled.sync_mode = cfg.sync
        compiled.ps_device = self._device_index[cfg.ps_device] if cfg.ps_device else int(devices[0])
        key = self._op_key[index]
        if key is not None and self._owner[key] == index and op.param_bytes > 0:
            groups = [
                tuple(dict.fromkeys(int(d) for d, sh in zip(devices, compiled.task_shard, strict=True) if sh == k))
                for k in range(shards)
            ]
            self._set_sync(
                compiled,
                self._sync_template(groups, self.cost.gradient_bytes(op) / shards, cfg.sync, compiled.ps_device),
            )
        return compiled

    def _sync_template(
        self, groups: Sequence[tuple[int, ...]], shard_bytes: float, mode: str, ps: int
    ) -> dict[str, np.ndarray]:
        """Static memory and synchronization tasks (local ids) for parameter shards held by ``groups``.

        ``shard_bytes`` is one shard's gradient bytes; its whole state is ``state_bytes_per_gradient_byte`` times that.
        """
        D = self.num_devices
        net = self.network
        static_dev: list[int] = []
        kind: list[int] = []
        duration: list[float] = []
        nbytes: list[float] = []
        res: list[np.ndarray] = []
        after_backward: list[bool] = []
        dep_u: list[int] = []
        dep_v: list[int] = []
        for group in groups:
            static_dev.extend(group)
            if len(group) < 2 or mode == "duplicate":
                continue
            if mode == "all_reduce":
                ring = net.rings((group,))
                kind.append(_ALL_REDUCE)
                duration.append(
                    self.cost.all_reduce_time_s(
                        shard_bytes, len(group), ring.bandwidth_bytes_per_s, ring.latency_s, ring.kind
                    )
                )
                nbytes.append(2.0 * (len(group) - 1) * shard_bytes)
                res.append(ring.dirs + D)
                after_backward.append(True)
                continue
            workers = [d for d in group if d != ps]
            pushes: list[int] = []
            for direction in (_PS_PUSH, _PS_PULL):  # push gradients; pull parameters once all pushes are in
                for w in workers:
                    pair = w * D + ps if direction == _PS_PUSH else ps * D + w
                    if direction == _PS_PULL:
                        dep_u.extend(pushes)
                        dep_v.extend([len(kind)] * len(pushes))
                    else:
                        pushes.append(len(kind))
                    kind.append(direction)
                    duration.append(
                        self.cost.transfer_time_s(
                            shard_bytes, net.route_bw[pair], net.route_lat[pair], net.route_kind[pair]
                        )
                    )
                    nbytes.append(shard_bytes)
                    res.append(self._route_res[net.route_ptr[pair] : net.route_ptr[pair + 1]])
                    after_backward.append(direction == _PS_PUSH)
        return {
            "static_devices": np.array(static_dev, dtype=np.int64),
            "static_bytes": np.full(len(static_dev), shard_bytes * self.cost.state_bytes_per_gradient_byte),
            "sync_kind": np.array(kind, dtype=np.int64),
            "sync_duration": np.array(duration, dtype=np.float64),
            "sync_bytes": np.array(nbytes, dtype=np.float64),
            "sync_res": np.concatenate(res).astype(np.int64) if res else np.zeros(0, np.int64),
            "sync_res_len": np.array([len(r) for r in res], dtype=np.int64),
            "sync_after_backward": np.array(after_backward, dtype=np.bool_),
            "sync_dep_u": np.array(dep_u, dtype=np.int64),
            "sync_dep_v": np.array(dep_v, dtype=np.int64),
        }

    @staticmethod
    def _set_sync(c: _CompiledOp, template: dict[str, np.ndarray]) -> None:
        for name, value in template.items():
            setattr(c, name, value)

    def shared_owner(self, index: int) -> int | None:
        """The owner op of ``index``'s parameters when several ops share them (else ``None``)."""
        key = self._op_key[index]
        if key is None or len(self._key_ops[key]) < 2:
            return None
        return self._owner[key]

    def shared_template(self, owner: int, ops: Sequence[_CompiledOp]) -> dict[str, np.ndarray]:
        """Synchronization of parameters shared by several ops (an unrolled layer), from all their tasks.

        Every device running a task of any op with the key holds a replica of that task's shard, and
        the replicas of a shard synchronize together with the owner's (first op's) sync mode. When
        the ops split the parameters differently, the parameters are treated as unsplit, held by
        every device any of them uses. Cached by the users' configurations.
        """
        key = self._op_key[owner]
        assert key is not None, f"op {owner} owns no parameters"
        users = self._key_ops[key]
        first = ops[owner]
        same = all(ops[u].shards == first.shards for u in users)
        signature = (
            owner,
            same,
            first.sync_mode,
            first.ps_device,
            tuple((ops[u].devices.tobytes(), ops[u].task_shard.tobytes()) for u in users),
        )
        found = self._shared_cache.get(signature)
        if found is not None:
            return found
        shards = first.shards if same else 1
        members: list[dict[int, None]] = [{} for _ in range(shards)]
        for u in users:
            for d, sh in zip(ops[u].devices.tolist(), ops[u].task_shard.tolist(), strict=True):
                members[sh if same else 0][d] = None
        op = self.graph.ops[owner]
        template = self._sync_template(
            [tuple(m) for m in members], self.cost.gradient_bytes(op) / shards, first.sync_mode, first.ps_device
        )
        if len(self._shared_cache) >= self.CACHE_SIZE:
            self._shared_cache.clear()
        self._shared_cache[signature] = template
        return template

    def with_shared(
        self, arrays: OpArrays, ops: Sequence[_CompiledOp], owners: Sequence[int] | None = None
    ) -> OpArrays:
        """``arrays`` with the owners' synchronization replaced by :meth:`shared_template` (default: all owners)."""
        for owner in self._shared_owners if owners is None else owners:
            arrays = arrays.replace_groups(
                owner, self.shared_template(owner, ops), ("static", "sync", "sync_res", "pull")
            )
        return arrays

    # ------------------------------------------------------------ simulation
    def simulate(self, plan: Plan, *, validate: bool = True) -> SimResult:
        """Simulate one training iteration of ``plan`` (see the module docstring)."""
        g = self.graph
        if validate:
            plan.validate(g, self.topology)
        ops = [self.compile(i, plan[op.name]) for i, op in enumerate(g.ops)]
        return self.run(ops)

    def run(self, ops: Sequence[_CompiledOp]) -> SimResult:
        """Simulate compiled op configurations (one per op, graph order) into a full :class:`SimResult`."""
        arrays = self.with_shared(OpArrays.from_ops(ops), ops)
        tasks = self.assemble(arrays, EdgeArrays.from_flat(*self.transfers(ops)))
        start, end, crit = _kernels.schedule(
            tasks.duration, tasks.res_ptr, tasks.res, tasks.succ_ptr, tasks.succ, tasks.indegree, self.num_resources
        )
        return self._result(arrays, tasks, start, end, crit)

    def transfers(self, ops: Sequence[_CompiledOp]) -> tuple[np.ndarray, ...]:
        """Flat transfer arrays of all edges plus per-edge counts (see ``_kernels.build_transfers``)."""
        n_tasks = np.array([len(c.devices) for c in ops], dtype=np.int64)
        task_ptr = np.concatenate(([0], np.cumsum(n_tasks)))
        part_ptr = np.concatenate(([0], np.cumsum([c.partitions for c in ops])))
        return _kernels.build_transfers(
            self.e_src,
            self.e_dst,
            self.e_bytes,
            self.e_rank,
            self.e_same,
            self.e_prod_box,
            task_ptr,
            part_ptr,
            np.array([c.replicas for c in ops], dtype=np.int64),
            self.op_sample_axis,
            np.concatenate([c.devices for c in ops]),
            np.concatenate([c.prod_lo for c in ops]),
            np.concatenate([c.prod_hi for c in ops]),
            np.concatenate([c.need_lo for c in ops]),
            np.concatenate([c.need_hi for c in ops]),
            np.concatenate([c.samp_lo for c in ops]),
            np.concatenate([c.samp_hi for c in ops]),
        )

    def edge_transfers(self, e: int, producer: _CompiledOp, consumer: _CompiledOp) -> tuple[np.ndarray, ...]:
        """The transfer segment of edge ``e`` alone (delta simulation)."""
        i = int(self.e_src[e])
        return _kernels.edge_transfers(
            producer.devices,
            producer.replicas,
            producer.prod_lo,
            producer.prod_hi,
            consumer.devices,
            consumer.replicas,
            consumer.need_lo,
            consumer.need_hi,
            consumer.samp_lo,
            consumer.samp_hi,
            self.e_rank[e],
            self.e_same[e],
            self.e_prod_box[e],
            self.op_sample_axis[i],
            self.e_bytes[e],
        )

    def assemble(self, ops: OpArrays, edges: EdgeArrays) -> _Tasks:
        """The task graph: compute tasks, transfers (from per-edge local segments) and synchronization.

        Task ids: forward ``[0, F)``, backward ``[F, 2F)``, transfers ``[2F, 2F + C)``, gradient
        transfers ``[2F + C, 2F + 2C)``, synchronization after, in op order.
        """
        D = self.num_devices
        data = ops.data
        task_ptr = ops.ptr["task"]
        n_tasks = np.diff(task_ptr)
        N = n_tasks.shape[0]
        F = int(task_ptr[-1])
        task_dev = data["devices"]
        n_dep, n_com = np.diff(edges.dep_ptr), np.diff(edges.com_ptr)
        dep_u = np.repeat(task_ptr[self.e_src], n_dep) + edges.dep_p
        dep_v = np.repeat(task_ptr[self.e_dst], n_dep) + edges.dep_q
        c_src = np.repeat(task_ptr[self.e_src], n_com) + edges.com_p
        c_dst = np.repeat(task_ptr[self.e_dst], n_com) + edges.com_q
        C = c_src.shape[0]
        op_of_task = np.repeat(np.arange(N), n_tasks)
        pairs = np.concatenate((task_dev[c_src] * D + task_dev[c_dst], task_dev[c_dst] * D + task_dev[c_src]))
        comm_bytes = np.concatenate((edges.com_b, edges.com_b))
        fwd_ids = 2 * F + np.arange(C)
        bwd_ids = fwd_ids + C
        # Synchronization templates, shifted to global ids.
        first_sync = 2 * F + 2 * C
        sizes = np.diff(ops.ptr["sync"])
        S = int(ops.ptr["sync"][-1])
        owner_of = np.repeat(np.arange(N), sizes)
        sync_ids = first_sync + np.arange(S)
        after = data["sync_after_backward"]
        waiting, waiting_owner = sync_ids[after], owner_of[after]
        # Each such task waits for every backward task of every op sharing the owner's parameters.
        user_ops, counts = _ragged_gather(
            self._users_ptr[waiting_owner], np.diff(self._users_ptr)[waiting_owner], self._users
        )
        sync_u = np.repeat(F + task_ptr[user_ops], n_tasks[user_ops]) + _ranges(n_tasks[user_ops])
        sync_v = np.repeat(np.repeat(waiting, counts), n_tasks[user_ops])
        pull_owner = np.repeat(np.arange(N), np.diff(ops.ptr["pull"]))
        base = first_sync + ops.ptr["sync"][pull_owner]
        pull_u, pull_v = data["sync_dep_u"] + base, data["sync_dep_v"] + base
        arange_f = np.arange(F)
        u = np.concatenate([arange_f, dep_u, F + dep_v, c_src, fwd_ids, F + c_dst, bwd_ids, sync_u, pull_u])
        v = np.concatenate([F + arange_f, dep_v, F + dep_u, fwd_ids, c_dst, bwd_ids, F + c_src, sync_v, pull_v])
        T = first_sync + S
        succ_ptr, succ, indegree = _kernels.csr(u.astype(np.int64), v.astype(np.int64), T)
        duration = np.concatenate(
            [data["forward_s"], data["backward_s"], self._transfer_times(pairs, comm_bytes), data["sync_duration"]]
        )
        kind = np.concatenate(
            [
                np.full(F, _FORWARD),
                np.full(F, _BACKWARD),
                np.full(C, _TRANSFER),
                np.full(C, _GRAD_TRANSFER),
                data["sync_kind"],
            ]
        ).astype(np.int8)
        task_op = np.concatenate([op_of_task, op_of_task, op_of_task[c_dst], op_of_task[c_dst], owner_of]).astype(
            np.int32
        )
        num_bytes = np.concatenate([np.zeros(2 * F), comm_bytes, data["sync_bytes"]])
        net = self.network
        comm_res, comm_len = _ragged_gather(net.route_ptr[pairs], net.route_len[pairs], self._route_res)
        res = np.concatenate([task_dev, task_dev, comm_res, data["sync_res"]]).astype(np.int64)
        res_len = np.concatenate([np.ones(2 * F, np.int64), comm_len, data["sync_res_len"]])
        res_ptr = np.concatenate(([0], np.cumsum(res_len)))
        return _Tasks(
            duration,
            res,
            res_ptr,
            succ_ptr,
            succ,
            indegree,
            kind,
            task_op,
            num_bytes,
            task_dev,
            task_ptr,
            F,
            C,
            c_src,
            c_dst,
        )

    def _transfer_times(self, pairs: np.ndarray, num_bytes: np.ndarray) -> np.ndarray:
        net = self.network
        bw = net.route_bw[pairs]
        table = self.cost.comm_table
        if table is not None and pairs.size:
            kinds = net.route_kind_id[pairs]
            bw = bw.copy()
            for k, name in enumerate(net.kind_names):
                for i in np.nonzero(kinds == k)[0]:  # comm tables are small and opt-in; clarity over speed here
                    bw[i] = self.cost.effective_bandwidth(f"p2p/{name}", bw[i], num_bytes[i])
        return np.where(num_bytes > 0, net.route_lat[pairs] + num_bytes / bw, 0.0)

    def peak_memory(
        self, ops: OpArrays, tasks: _Tasks, start: np.ndarray, end: np.ndarray, only_over: bool = False
    ) -> np.ndarray:
        """(D,) peak bytes per device: static state plus activation and buffer lifetimes.

        With ``only_over``, devices whose static state plus *every* allocation fits in memory (so
        the peak cannot exceed it) are not swept and report that upper bound instead: enough to
        decide out-of-memory exactly, and much cheaper (searches use it).
        """
        D = self.num_devices
        F, C = tasks.F, tasks.C
        c_src, c_dst, task_dev = tasks.c_src, tasks.c_dst, tasks.task_dev
        static = np.bincount(ops.data["static_devices"], ops.data["static_bytes"], minlength=D)
        act = ops.data["activation_bytes"]
        comm = tasks.num_bytes[2 * F : 2 * F + 2 * C]
        ev_dev = np.concatenate([task_dev, task_dev, task_dev[c_dst], task_dev[c_src]])
        ev_from = start[: 2 * F + 2 * C]
        ev_to = np.concatenate([end[F : 2 * F], end[F : 2 * F], end[F + c_dst], end[F + c_src]])
        ev_bytes = np.concatenate([act, act, comm])
        if only_over:
            bound = static + np.bincount(ev_dev, weights=ev_bytes, minlength=D)
            over = bound > self._capacity
            if not over.any():
                return bound
            keep = over[ev_dev]
            ev_dev, ev_from, ev_to, ev_bytes = ev_dev[keep], ev_from[keep], ev_to[keep], ev_bytes[keep]
            swept = static + _peak_levels(
                np.concatenate([ev_dev, ev_dev]),
                np.concatenate([ev_from, ev_to]),
                np.concatenate([ev_bytes, -ev_bytes]),
                D,
            )
            return np.where(over, swept, bound)
        device = np.concatenate([ev_dev, ev_dev])
        time = np.concatenate([ev_from, ev_to])
        delta = np.concatenate([ev_bytes, -ev_bytes])
        return static + _peak_levels(device, time, delta, D)

    def _result(self, ops: OpArrays, tasks: _Tasks, start: np.ndarray, end: np.ndarray, crit: np.ndarray) -> SimResult:
        D = self.num_devices
        F = tasks.F
        task_dev, task_ptr, res, res_ptr = tasks.task_dev, tasks.task_ptr, tasks.res, tasks.res_ptr
        T = tasks.duration.shape[0]
        lane = res[res_ptr[:-1]] if T else np.zeros(0, np.int64)
        res_len = np.diff(res_ptr)
        if T and (res_len == 0).any():
            lane = np.where(res_len > 0, lane, 0)
        table = TaskTable(tasks.kind, tasks.op, lane.astype(np.int32), start, end, tasks.num_bytes, self._lanes)
        makespan = float(end.max()) if end.size else 0.0
        duration = end - start
        busy = np.bincount(task_dev, weights=duration[:F], minlength=D) + np.bincount(
            task_dev, weights=duration[F : 2 * F], minlength=D
        )
        peak = self.peak_memory(ops, tasks, start, end)
        oom_mask = peak > self._capacity
        # Links: bytes and busy time per direction, folded to links.
        comm_ids = np.arange(2 * F, T)
        lens = res_len[comm_ids]
        link_res = res[np.repeat(res_ptr[comm_ids], lens) + _ranges(lens)] if comm_ids.size else np.zeros(0, np.int64)
        per_res_bytes = np.bincount(
            link_res, weights=np.repeat(tasks.num_bytes[comm_ids], lens), minlength=self.num_resources
        )
        per_res_busy = np.bincount(link_res, weights=np.repeat(duration[comm_ids], lens), minlength=self.num_resources)
        L = self.num_links
        link_bytes = per_res_bytes[D:].reshape(L, 2).sum(axis=1) if L else np.zeros(0)
        link_busy = per_res_busy[D:].reshape(L, 2).max(axis=1) if L else np.zeros(0)
        n = task_ptr.shape[0] - 1
        has = task_ptr[1:] > task_ptr[:-1]
        starts = task_ptr[:-1].clip(max=max(F - 1, 0))
        op_start = np.where(has, np.minimum.reduceat(start[:F], starts), 0.0) if F else np.zeros(n)
        op_fend = np.where(has, np.maximum.reduceat(end[:F], starts), 0.0) if F else np.zeros(n)
        op_bstart = np.where(has, np.minimum.reduceat(start[F : 2 * F], starts), 0.0) if F else np.zeros(n)
        op_end = np.where(has, np.maximum.reduceat(end[F : 2 * F], starts), 0.0) if F else np.zeros(n)
        return SimResult(
            makespan_s=makespan,
            device_names=tuple(d.name for d in self.topology.devices),
            busy_s=busy,
            idle_s=makespan - busy,
            peak_memory_bytes=peak.astype(np.int64),
            memory_capacity_bytes=self._capacity.astype(np.int64),
            oom=bool(oom_mask.any()),
            oom_devices=tuple(self.topology.devices[d].name for d in np.nonzero(oom_mask)[0]),
            comm_bytes=float(tasks.num_bytes[2 * F :].sum()),
            comm_time_s=float(duration[2 * F :].sum()),
            link_names=tuple(f"{link.a} <-> {link.b}" for link in self.topology.links),
            link_bytes=link_bytes,
            link_busy_s=link_busy,
            op_names=tuple(op.name for op in self.graph.ops),
            op_start_s=op_start,
            op_forward_end_s=op_fend,
            op_backward_start_s=op_bstart,
            op_end_s=op_end,
            critical_tasks=_kernels.critical_chain(crit, end),
            tasks=table,
        )


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(n) for n in lengths])`` without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total) - offsets


def _ragged_gather(starts: np.ndarray, lengths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``concatenate([values[s:s+n] for s, n in zip(starts, lengths)])`` and the lengths."""
    if starts.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx = np.repeat(starts, lengths) + _ranges(lengths)
    return values[idx], lengths


def _peak_levels(device: np.ndarray, time: np.ndarray, delta: np.ndarray, num_devices: int) -> np.ndarray:
    """Per device, the maximum running sum of ``delta`` in time order (frees before allocations on ties)."""
    if device.size == 0:
        return np.zeros(num_devices)
    return _kernels.sweep(np.argsort(time, kind="stable"), time, device, delta, num_devices)


_CONTEXTS: list[SimContext] = []  # the last few; each holds its graph and topology alive, so identity is safe


def context(graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None = None) -> SimContext:
    """A cached :class:`SimContext` for these exact objects (the last four are kept)."""
    cost = cost_model or DEFAULT_COST_MODEL
    for ctx in _CONTEXTS:
        if ctx.graph is graph and ctx.topology is topology and ctx.cost is cost:
            return ctx
    ctx = SimContext(graph, topology, cost)
    _CONTEXTS.append(ctx)
    del _CONTEXTS[:-4]
    return ctx


def simulate(
    graph: OpGraph, topology: DeviceTopology, plan: Plan, cost_model: CostModel | None = None, *, validate: bool = True
) -> SimResult:
    """Simulate one training iteration of ``plan`` for ``graph`` on ``topology``.

    Args:
        graph: the op graph (or a coarse graph of op groups, with a plan for the groups).
        topology: the cluster.
        plan: one configuration per op of ``graph``.
        cost_model: compute/communication/memory costs (default :data:`DEFAULT_COST_MODEL`).
        validate: check the plan first (searches that build valid plans may skip it).

    Returns:
        The :class:`SimResult`; a plan that does not fit reports ``oom=True`` instead of raising.

    Raises:
        ValueError: if the plan does not match the graph and topology (see :meth:`Plan.validate`).
    """
    return context(graph, topology, cost_model).simulate(plan, validate=validate)
