"""FT's additive cost graph: node and edge costs of TensorOpt's configurations, the input of FT.

TensorOpt (sec. 2.1) gives every op ``v`` a set of ``K_v`` parallel configurations and every edge a
cost that depends on the configurations of its two ends; a strategy's memory and time are *sums*
(Eq. 1-3). :func:`build_cost_graph` computes those costs as a :class:`CostGraph`, from the
configurations of :mod:`.configs` and the re-scheduling times of :mod:`.rescheduling` (where tensor
layouts are defined).

**Edge layouts.** For a tensor ``u -> v`` of ``B`` bytes (rules mirrored from the simulator's
``SimContext._build_edges`` / ``kernels._consumer_box``):

* producer layout: a mesh dimension splitting a non-reduction dimension splits the tensor at
  ``dim.axis``; one splitting a reduction dimension yields partial sums ``P``; others ``R``;
* consumer layout (forward): when the tensor's rank equals the consumer's output rank and both ops
  have the same plain sample axis, the consumer's sample and attribute splits select the slice at
  ``dim.axis``; otherwise, if the producer has a plain sample axis ``s``, the consumer's sample split
  selects the slice at ``s``; every other split (parameter splits, reductions) reads the whole axis;
* gradient (backward): the consumer's input gradient has the consumer layout, except that its
  splits that do not slice the input (parameter splits, ...) hold *partial* gradients; the producer
  needs its output gradient in its own layout with ``P`` replaced by ``R``. Ops none of whose
  ancestors (themselves included) have parameters need no gradient: their ``r_b`` is 0.

**Node costs** of op ``v`` under configuration ``c`` with ``P`` partitions (Eq. 1)::

    time_s   = max_{device d} sum(cost.task_times_s(op, 1 / P, task_output_shape, param_bytes // shards, d))
             + cost.all_reduce_time_s(gradient_bytes / shards, f_sync, beta, alpha, kind) / k
    memory   = param_state_bytes / shards / k
             + bytes_written / P                            (temporary / backward workspace)
             + output_bytes / P_out                         (only for ops without consumers)

**Memory options** (beyond TensorOpt, opt-in). ``zero = z``: every configuration that replicates an
op's parameter shards (``f_sync >= 2``) takes ZeRO stage ``z``: its state term becomes
``shard_bytes * cost.zero_state_bytes_per_gradient_byte(z, f_sync) * share``, and stage 3 also
all-gathers the weights, which the simulator charges as all-reducing ``1 + weight_per_gradient_byte``
times the gradient bytes (stages 1 and 2 move what the all-reduce moves, so they only lower memory: a
single setting, not a choice, is then optimal). ``recompute``: every configuration ``s`` gets a twin
``s + K_v`` with activation recomputation: the forward runs again before backward (time
``max_d sum(forward, backward) + forward`` per device type) and the op's activation is not held
(memory without its ``bytes_written / P`` term); the twin's edges cost what ``s``'s do (the
re-scheduled copies are kept either way), so every edge table is tiled to ``(2 K_u, 2 K_v, 3)`` and
FT's work grows about fourfold (Linear DP) to eightfold (eliminations).

with every byte count in the cost model's precision, as in the simulator (:mod:`placement_rl.sim.cost`:
activations scale by element size; ``gradient_bytes`` and ``param_state_bytes`` are counted per
parameter element, ``cost.gradient_bytes(op)`` and ``cost.param_state_bytes(op)``) and compute at the
peak of the precision's compute dtype (``cost.peak_flops(d)``).

``shards`` is the product of the parameter-kind degrees; ``f_sync = n / shards`` devices hold each
shard. ``k`` ops share a ``param_key`` (an unrolled RNN: one parameter set, stored and synchronized
once, as in the simulator). Each of them carries ``1/k`` of the state and of the synchronization
under its *own* configuration: the sum is exact when the ``k`` ops agree, and when they do not
(where the simulator synchronizes the whole set over every device that runs any of them) it
still charges the replicated ones. Charging only the first op would let a strategy split that
op's parameters, pay no synchronization, and run the other ``k - 1`` steps data parallel.
``P_out`` is the product of the non-reduction degrees.

**Edge costs** (Eq. 2, with TensorOpt's tensor reuse, sec. 4.2). With ``r_f`` = path(producer ->
consumer layout), ``r_b`` = path(consumer gradient -> producer gradient layout), ``r_rebuild`` =
path(consumer layout -> producer gradient layout), ``before`` / ``after`` = per-device bytes of the
producer / consumer layouts, three options ``r``::

    r = 0 keep both copies     memory = before / k + after   time = r_f + r_b
    r = 1 keep the before copy memory = before / k           time = 2 r_f + r_b        (rebuild "after")
    r = 2 keep the after copy  memory = after                time = r_f + r_rebuild + r_b

When the forward layouts are equal there is one copy and no forward re-scheduling: option 0 is
``(before / k, r_b)`` (``r_b`` is non-zero when the consumer's gradient is partial, e.g. Megatron's
column-parallel input) and options 1 and 2 are ``inf`` in both arrays. ``k`` is the number of
consumers of the producer's output: its one buffer is charged ``1 / k`` to each of their edges
(exact when all of them keep it). Parallel tensors between the same pair of ops are merged into
one edge by adding their arrays option-wise (option ``r`` of the merged edge uses option ``r`` on
every tensor; ``inf`` stays ``inf``).

**A mesh per stage** (beyond TensorOpt, opt-in: ``stage_meshes``). Every op may also take the
configurations over further meshes, subsets of the devices (``run_ft``'s ``stage_meshes`` offers
the devices of each of the best machines), so that layers run on different machines. Configurations
are mesh-major (those over all devices first, as without stage meshes) and each mesh's node costs
are the formulas above over its devices. An edge between two configurations on the same mesh costs
as above; between two meshes no collective spans both, so every layout change is the direct
redistribution (:class:`~placement_rl.search.ft.rescheduling._CrossComm`) and the two copies are
always distinct (options 1 and 2 apply). Time stays a sum: ops on different meshes are charged one
after another, as FT charges every op (branches on different meshes do not overlap in the sum).
Memory stays a sum of per-device terms, which is no longer the peak of one device: a device only
holds the ops on its meshes, so the sum is an upper bound (at most the number of meshes times too
high). A per-device memory would make the frontier a set of vectors (one entry per mesh), not of
(memory, time) pairs. The frontier's fastest points are unaffected (they are kept whatever their
memory) and the simulator judges what fits (``simulated_best``).

Everything here is additive by construction: a strategy (a config ``s_v`` per op and an option
``r_e`` per edge) costs ``sum_v node[v][s_v] + sum_e edge[e][s_u, s_v, r_e]`` in memory and time.
The simulator overlaps computation and communication; these sums do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import OpGraph, ParallelDim
from placement_rl.plan import OpConfig
from placement_rl.plan.core import ZERO_STAGES, zero_holders
from placement_rl.search.ft.configs import _Candidate, _dims_key, _op_candidates, _to_config, resolve_devices
from placement_rl.search.ft.rescheduling import _P, _R, _canon, _Comm, _CrossComm, _split_degree
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology

_NUM_OPTIONS = 3  # tensor-reuse options: keep both, keep before, keep after


@dataclass(frozen=True)
class CostGraph:
    """FT's additive cost graph (TensorOpt sec. 2.1, Eq. 1-3). Node ``v`` has ``K_v`` configurations.

    Arrays are read-only and may be shared between edges with identical costs.

    Attributes:
        num_configs: ``(n,)`` int64, ``K_v`` per op (graph op order).
        node_memory_bytes: ``n`` float64 arrays of shape ``(K_v,)``: per-device memory of op ``v``
            under config ``s`` (parameter state shard + temporary tensors).
        node_time_s: ``n`` float64 arrays ``(K_v,)``: compute (forward + backward) + gradient
            synchronization time.
        edges: ``(u, v)`` op-index pairs, one per graph tensor after merging parallel tensors between
            the same pair of ops (costs summed option-wise), ``u`` before ``v`` in topological order,
            in order of first appearance in ``graph.tensors``.
        edge_memory_bytes: float64 arrays of shape ``(K_u, K_v, 3)``: per-device memory of the kept
            copies under tensor-reuse option 0 (keep both), 1 (keep the producer's copy) or 2 (keep
            the consumer's copy).
        edge_time_s: same shape: re-scheduling time (forward and backward, including reconstruction
            when a copy is not kept). ``inf`` in both arrays for an option that does not apply.
    """

    num_configs: np.ndarray
    node_memory_bytes: list[np.ndarray]
    node_time_s: list[np.ndarray]
    edges: tuple[tuple[int, int], ...]
    edge_memory_bytes: list[np.ndarray]
    edge_time_s: list[np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.num_configs)
        if not (len(self.node_memory_bytes) == len(self.node_time_s) == n):
            raise ValueError(
                f"CostGraph: {n} ops but {len(self.node_memory_bytes)} / {len(self.node_time_s)} node arrays"
            )
        if not (len(self.edge_memory_bytes) == len(self.edge_time_s) == len(self.edges)):
            raise ValueError(f"CostGraph: {len(self.edges)} edges but {len(self.edge_memory_bytes)} edge arrays")
        for v, k in enumerate(self.num_configs):
            if self.node_memory_bytes[v].shape != (k,) or self.node_time_s[v].shape != (k,):
                raise ValueError(f"CostGraph: node {v} arrays do not have shape ({k},)")
        for e, (u, v) in enumerate(self.edges):
            shape = (self.num_configs[u], self.num_configs[v], _NUM_OPTIONS)
            if self.edge_memory_bytes[e].shape != shape or self.edge_time_s[e].shape != shape:
                raise ValueError(f"CostGraph: edge {e} ({u}, {v}) arrays do not have shape {shape}")


def build_cost_graph(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    *,
    cost_model: CostModel | None = None,
    max_configs: int | None = None,
    rescheduling: str = "collectives",
    zero: int = 0,
    recompute: bool = False,
    stage_meshes: Sequence[Sequence[str]] = (),
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CostGraph, list[list[OpConfig]]]:
    """TensorOpt's per-op configurations and additive node and edge costs (module docstring).

    Args:
        graph: the op graph.
        topology: the cluster.
        devices: device names (mesh order), an int ``n`` for the ``n`` fastest devices (in mesh
            order, whatever order ``topology.devices`` lists them in; :mod:`.devices`), or ``None``
            for all of them (in mesh order).
        cost_model: compute/communication/memory costs (default ``CostModel()``, the simulator's).
        max_configs: cap on configurations per op (:func:`op_configs`).
        rescheduling: ``collectives`` (TensorOpt: the shortest path over single collectives, with
            the point-to-point redistribution as a fallback) or ``point_to_point`` (every layout
            change is the direct redistribution, which is how the shared simulator moves tensors
            between differently split ops; FT's estimate then agrees with ``simulate`` better).
        zero: the ZeRO stage (0-3) of every configuration whose parameter shards are replicated
            (module docstring, "Memory options"); 0: none, TensorOpt's space.
        recompute: also every configuration with activation recomputation (``K_v`` doubles: config
            ``s + K_v`` is config ``s`` recomputed).
        stage_meshes: further device sets, each a subset of ``devices`` in mesh order (a mesh per
            stage, module docstring): every op also gets the configurations over each of them (up to
            ``max_configs`` per mesh), after those over all of ``devices``.
        progress: called with (tensors priced, tensors) as the edge costs are built (without stage meshes).

    Returns:
        ``(cost_graph, configs)`` with ``configs[v][s]`` the OpConfig of op ``v``'s config ``s``: a
        plan of ``{op.name: configs[v][s_v]}`` is valid for :func:`placement_rl.simulate`.

    Raises:
        ValueError: for an unknown or repeated device name, a device count outside
            ``1..len(topology.devices)``, ``max_configs < 1``, a ZeRO stage outside 0-3 or a stage
            mesh that is empty, repeats a device or has a device outside ``devices``.
    """
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ValueError(f"zero = {zero!r}; expected a ZeRO stage among {list(ZERO_STAGES)}")
    cost = cost_model or CostModel()
    names = resolve_devices(topology, devices, cost)
    n = len(names)
    comm = _Comm(topology, names, cost, rescheduling)
    cands = [_op_candidates(op, n, None, max_configs) for op in graph.ops]
    if stage_meshes:
        meshes = _check_stage_meshes(stage_meshes, names)
        comms = [comm, *(_Comm(topology, m, cost, rescheduling) for m in meshes)]
        per_mesh = [cands, *([_op_candidates(op, len(m), None, max_configs) for op in graph.ops] for m in meshes)]
        configs = [
            [_to_config(c, m) for m, cs in zip([names, *meshes], per_mesh, strict=True) for c in cs[i]]
            for i in range(len(graph.ops))
        ]
    else:
        configs = [[_to_config(c, names) for c in cs] for cs in cands]
    if zero:
        configs = [
            [c.replace(zero=zero) if op.param_bytes > 0 and zero_holders(op, c) >= 2 else c for c in cs]
            for op, cs in zip(graph.ops, configs, strict=True)
        ]

    if stage_meshes:
        node_memory, node_time, recomputed, edges, edge_memory, edge_time = _mesh_costs(
            graph, topology, cost, comms, per_mesh, zero
        )
    else:
        node_memory, node_time, recomputed = _node_costs(graph, topology, names, cost, comm, cands, zero)
        edges, edge_memory, edge_time = _edge_costs(graph, comm, cands, cost, progress=progress)
    if recompute:  # twins: config s + K_v is config s recomputed; edges cost the same
        configs = [cs + [c.replace(recompute=True) for c in cs] for cs in configs]
        node_memory = [_frozen(np.concatenate([m, r[0]])) for m, r in zip(node_memory, recomputed, strict=True)]
        node_time = [_frozen(np.concatenate([t, r[1]])) for t, r in zip(node_time, recomputed, strict=True)]
        tiled: dict[int, np.ndarray] = {}
        edge_memory = [tiled.setdefault(id(a), _frozen(np.tile(a, (2, 2, 1)))) for a in edge_memory]
        edge_time = [tiled.setdefault(id(a), _frozen(np.tile(a, (2, 2, 1)))) for a in edge_time]
    cost_graph = CostGraph(
        num_configs=np.array([len(cs) for cs in configs], dtype=np.int64),
        node_memory_bytes=node_memory,
        node_time_s=node_time,
        edges=edges,
        edge_memory_bytes=edge_memory,
        edge_time_s=edge_time,
    )
    return cost_graph, configs


def _check_stage_meshes(stage_meshes: Sequence[Sequence[str]], names: Sequence[str]) -> list[list[str]]:
    """The stage meshes as name lists, each a non-empty subset of ``names`` without repeats, none equal
    to ``names`` itself (those configurations are there already) and none twice."""
    within = set(names)
    out: list[list[str]] = []
    seen = {tuple(names)}
    for mesh in stage_meshes:
        devices = [mesh] if isinstance(mesh, str) else list(mesh)
        if not devices or len(set(devices)) != len(devices) or not set(devices) <= within:
            raise ValueError(
                f"stage mesh {devices!r}: expected distinct devices among the {len(names)} in use ({', '.join(names)})"
            )
        if tuple(devices) not in seen:
            seen.add(tuple(devices))
            out.append(devices)
    return out


def _mesh_costs(
    graph: OpGraph,
    topology: DeviceTopology,
    cost: CostModel,
    comms: Sequence[_Comm],
    per_mesh: Sequence[Sequence[Sequence[_Candidate]]],
    zero: int,
) -> tuple[
    list[np.ndarray],
    list[np.ndarray],
    list[tuple[np.ndarray, np.ndarray]],
    tuple[tuple[int, int], ...],
    list[np.ndarray],
    list[np.ndarray],
]:
    """Node and edge arrays when every op has configurations over several meshes (mesh-major blocks):
    node costs per mesh, edge blocks within a mesh as usual, between meshes direct redistributions."""
    nodes = [
        _node_costs(graph, topology, c.names, cost, c, cands, zero) for c, cands in zip(comms, per_mesh, strict=True)
    ]
    node_memory = [_frozen(np.concatenate([m[0][i] for m in nodes])) for i in range(len(graph.ops))]
    node_time = [_frozen(np.concatenate([m[1][i] for m in nodes])) for i in range(len(graph.ops))]
    recomputed = [
        (np.concatenate([m[2][i][0] for m in nodes]), np.concatenate([m[2][i][1] for m in nodes]))
        for i in range(len(graph.ops))
    ]
    blocks = [
        [
            _edge_costs(graph, a, cands_a, cost, None if a is b else (b, cands_b))
            for b, cands_b in zip(comms, per_mesh, strict=True)
        ]
        for a, cands_a in zip(comms, per_mesh, strict=True)
    ]
    edges = blocks[0][0][0]

    def joined(k: int, e: int) -> np.ndarray:  # (K_u, K_v, 3): producer mesh a's rows, consumer mesh b's columns
        return _frozen(np.concatenate([np.concatenate([block[k][e] for block in row], axis=1) for row in blocks]))

    edge_memory = [joined(1, e) for e in range(len(edges))]
    edge_time = [joined(2, e) for e in range(len(edges))]
    return node_memory, node_time, recomputed, edges, edge_memory, edge_time


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _node_costs(
    graph: OpGraph,
    topology: DeviceTopology,
    names: Sequence[str],
    cost: CostModel,
    comm: _Comm,
    cands: Sequence[Sequence[_Candidate]],
    zero: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """Node memory and time per configuration, and the same with recomputation (module docstring)."""
    specs = sorted(
        {
            (d.device_type, cost.peak_flops(d), d.memory_bandwidth_bytes_per_s)
            for d in (topology.device(x) for x in names)
        }
    )
    # ops sharing a param_key (an unrolled RNN) share one parameter set: each carries 1/k of its
    # state and synchronization under its own configuration, so the sum is exact when all k agree
    sharers: dict[str, int] = {}
    for op in graph.ops:
        if op.param_bytes > 0:
            key = op.param_key or f"\0{op.name}"
            sharers[key] = sharers.get(key, 0) + 1
    has_consumer = [bool(s) for s in graph.successors]
    memory, time, recomputed = [], [], []
    for i, op in enumerate(graph.ops):
        share = 1.0 / sharers[op.param_key or f"\0{op.name}"] if op.param_bytes > 0 else 0.0
        mem = np.empty(len(cands[i]))
        tim = np.empty(len(cands[i]))
        mem_r = np.empty(len(cands[i]))
        tim_r = np.empty(len(cands[i]))
        for s, c in enumerate(cands[i]):
            degree = [1] * len(op.parallel_dims)
            for m, k in zip(c.mesh, c.assign, strict=True):
                if k >= 0:
                    degree[k] *= m
            partitions = math.prod(degree)
            shards = math.prod(g for g, d in zip(degree, op.parallel_dims, strict=True) if d.kind == "parameter")
            out_parts = math.prod(g for g, d in zip(degree, op.parallel_dims, strict=True) if not d.reduction)
            out_shape = list(op.output_shapes[0])
            for g, d in zip(degree, op.parallel_dims, strict=True):
                if not d.reduction:
                    out_shape[d.axis] //= g
            times = [
                cost.task_times_s(op, 1.0 / partitions, tuple(out_shape), op.param_bytes // shards, *spec)
                for spec in specs
            ]
            compute = max(f + b for f, b in times)
            sync = 0.0
            activation = cost.activation_bytes(op.bytes_written, op.dtype_bytes) / partitions
            memory_bytes = activation
            if not has_consumer[i]:
                memory_bytes += cost.activation_bytes(op.output_bytes, op.dtype_bytes) / out_parts
            if share:
                shard_bytes = cost.gradient_bytes(op) / shards
                holders = len(names) // shards
                replicas = tuple(
                    (stride, size)
                    for stride, size, k in c.factors()
                    if k < 0 or op.parallel_dims[k].kind != "parameter"
                )
                stage = zero if replicas and holders >= 2 else 0
                per_byte = cost.zero_state_bytes_per_gradient_byte(stage, holders) if stage else None
                memory_bytes += (
                    shard_bytes * (cost.state_bytes_per_gradient_byte if per_byte is None else per_byte) * share
                )
                if replicas:
                    bw, lat, kind = comm.group(replicas)
                    moved = shard_bytes * (1.0 + (cost.weight_per_gradient_byte if stage >= 3 else 0.0))
                    sync = cost.all_reduce_time_s(moved, holders, bw, lat, kind) * share
            mem[s] = memory_bytes
            tim[s] = compute + sync
            mem_r[s] = memory_bytes - activation
            tim_r[s] = max(2 * f + b for f, b in times) + sync
        memory.append(_frozen(mem))
        time.append(_frozen(tim))
        recomputed.append((mem_r, tim_r))
    return memory, time, recomputed


def _producer_label(dims: tuple[ParallelDim, ...], box: bool) -> Callable[[int], int]:
    """Label of a mesh factor splitting ``dims[k]`` (``k = -1``: replicating) in the producer's output."""

    def label(k: int) -> int:
        if k < 0 or not box:
            return _R
        return _P if dims[k].reduction else dims[k].axis

    return label


def _consumer_label(dims: tuple[ParallelDim, ...], mode: tuple[str, int]) -> Callable[[int], int]:
    """Label of a mesh factor splitting ``dims[k]`` in the input the consumer reads (forward)."""

    def label(k: int) -> int:
        if k < 0:
            return _R
        d = dims[k]
        if mode[0] == "same" and not d.reduction and d.kind != "parameter":
            return d.axis
        if mode[0] == "sample" and d.kind == "sample":
            return mode[1]
        return _R

    return label


def _producer_gradient_label(label: Callable[[int], int]) -> Callable[[int], int]:
    """How a producer takes its output's gradient: as its forward ``label``, except that a mesh
    dimension whose forward output is a partial sum takes the gradient replicated."""

    def gradient(k: int) -> int:
        return _R if label(k) == _P else label(k)

    return gradient


def _consumer_gradient_label(label: Callable[[int], int]) -> Callable[[int], int]:
    """How a consumer sends its input's gradient back: a replicating mesh dimension (``k < 0``) sends
    it replicated, one that splits the input sends it split alike, and one that splits something
    else (the input is read whole) sends partial sums."""

    def gradient(k: int) -> int:
        if k < 0:
            return _R
        return label(k) if label(k) >= 0 else _P

    return gradient


def _layout_ids(comm: _Comm, cands: Sequence[_Candidate], label: Callable[[int], int]) -> np.ndarray:
    """(K,) layout ids of a tensor under each candidate, ``label(dim index or -1)`` giving each factor's label."""
    return np.array(
        [comm.layout_id(_canon([(size, label(k)) for _, size, k in c.factors()])) for c in cands], dtype=np.int64
    )


def _edge_costs(
    graph: OpGraph,
    comm: _Comm,
    cands: Sequence[Sequence[_Candidate]],
    cost: CostModel,
    consumer: tuple[_Comm, Sequence[Sequence[_Candidate]]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[tuple[tuple[int, int], ...], list[np.ndarray], list[np.ndarray]]:
    """Edge arrays of every tensor, producers under ``cands`` over ``comm``'s mesh and consumers under
    the same (``consumer`` None) or under ``consumer = (its comm, its cands)``, another mesh: then every
    layout change is a direct redistribution between the meshes (:class:`_CrossComm`). ``progress`` is
    called with (tensors priced, tensors) after each tensor."""
    cons_comm, cons_cands = consumer if consumer is not None else (comm, cands)
    cross = (_CrossComm(comm, cons_comm), _CrossComm(cons_comm, comm)) if consumer is not None else None
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    needs_grad = [False] * len(ops)
    for i, op in enumerate(ops):
        needs_grad[i] = op.param_bytes > 0 or any(needs_grad[p] for p in graph.predecessors[i])
    readers: dict[tuple[str, int], int] = {}
    for t in graph.tensors:
        readers[t.src, t.src_output] = readers.get((t.src, t.src_output), 0) + 1

    layout_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
    edge_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
    merged: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}
    for priced, t in enumerate(graph.tensors, 1):
        u, v = index[t.src], index[t.dst]
        src, dst = ops[u], ops[v]
        box = t.src_output == 0 or len(src.output_shapes[t.src_output]) == len(src.output_shapes[0])
        s_src, s_dst = src.plain_sample_axis, dst.plain_sample_axis
        if box and len(t.shape) == len(dst.output_shapes[0]) and s_src == s_dst and s_dst >= 0:
            mode: tuple[str, int] = ("same", -1)
        elif box and s_src >= 0:
            mode = ("sample", s_src)
        else:
            mode = ("whole", -1)

        pkey = ("producer", _dims_key(src), len(cands[u]), box)
        if pkey not in layout_cache:
            fwd = _producer_label(src.parallel_dims, box)
            layout_cache[pkey] = (
                _layout_ids(comm, cands[u], fwd),
                _layout_ids(comm, cands[u], _producer_gradient_label(fwd)),
            )
        ckey = ("consumer", _dims_key(dst), len(cons_cands[v]), mode)
        if ckey not in layout_cache:
            need = _consumer_label(dst.parallel_dims, mode)
            layout_cache[ckey] = (
                _layout_ids(cons_comm, cons_cands[v], need),
                _layout_ids(cons_comm, cons_cands[v], _consumer_gradient_label(need)),
            )
        share = readers[t.src, t.src_output]
        sig = comm.sig_id(cost.tensor_bytes(t.num_bytes, t.shape), t.shape)
        key = (pkey, ckey, sig, needs_grad[u], share)
        if key not in edge_cache:
            if cross is None:
                edge_cache[key] = _edge_arrays(
                    comm, *layout_cache[pkey], *layout_cache[ckey], sig, needs_grad[u], share
                )
            else:
                edge_cache[key] = _cross_edge_arrays(
                    *cross, *layout_cache[pkey], *layout_cache[ckey], comm.signature(sig)[0], needs_grad[u], share
                )
        merged.setdefault((u, v), []).append(edge_cache[key])
        if progress is not None:
            progress(priced, len(graph.tensors))

    edges = tuple(merged)
    memory, time = [], []
    for pair in edges:
        parts = merged[pair]
        mem, tim = parts[0]
        if len(parts) > 1:  # parallel tensors: option r of the edge is option r of every tensor
            mem = np.sum([p[0] for p in parts], axis=0)
            tim = np.sum([p[1] for p in parts], axis=0)
            mem.setflags(write=False)
            tim.setflags(write=False)
        memory.append(mem)
        time.append(tim)
    return edges, memory, time


def _edge_arrays(
    comm: _Comm,
    prod_fwd: np.ndarray,
    prod_grad: np.ndarray,
    cons_fwd: np.ndarray,
    cons_grad: np.ndarray,
    sig: int,
    needs_grad: bool,
    share: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(K_u, K_v, 3) memory and time of one tensor (module docstring, "Edge costs")."""
    num_bytes = comm.signature(sig)[0]

    def table(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Path times between the unique layouts of ``rows`` and ``cols``, gathered to (len(rows), len(cols))."""
        ur, ri = np.unique(rows, return_inverse=True)
        uc, ci = np.unique(cols, return_inverse=True)
        small = np.array([[comm.path_time_s(int(a), int(b), sig) for b in uc] for a in ur]).reshape(len(ur), len(uc))
        return small[ri.reshape(-1)[:, None], ci.reshape(-1)[None, :]]

    def per_device(ids: np.ndarray) -> np.ndarray:
        return np.array([num_bytes / _split_degree(comm.layouts[i]) for i in ids.tolist()])

    r_f = table(prod_fwd, cons_fwd)
    r_b = table(cons_grad, prod_grad).T if needs_grad else np.zeros_like(r_f)
    rebuild = table(cons_fwd, prod_grad).T
    before = (per_device(prod_fwd) / share)[:, None]
    after = per_device(cons_fwd)[None, :]
    equal = prod_fwd[:, None] == cons_fwd[None, :]
    shape = r_f.shape
    memory = np.empty((*shape, _NUM_OPTIONS))
    time = np.empty((*shape, _NUM_OPTIONS))
    memory[..., 0] = np.where(equal, before, before + after)
    memory[..., 1] = np.where(equal, math.inf, np.broadcast_to(before, shape))
    memory[..., 2] = np.where(equal, math.inf, np.broadcast_to(after, shape))
    time[..., 0] = r_f + r_b
    time[..., 1] = np.where(equal, math.inf, 2 * r_f + r_b)
    time[..., 2] = np.where(equal, math.inf, r_f + rebuild + r_b)
    memory.setflags(write=False)
    time.setflags(write=False)
    return memory, time


def _cross_edge_arrays(
    forward: _CrossComm,
    backward: _CrossComm,
    prod_fwd: np.ndarray,
    prod_grad: np.ndarray,
    cons_fwd: np.ndarray,
    cons_grad: np.ndarray,
    num_bytes: float,
    needs_grad: bool,
    share: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_edge_arrays` for a producer and a consumer on different meshes: layouts are never equal
    (the consumer's copy lives on other devices), every change is a direct redistribution."""

    def table(rows: np.ndarray, cols: np.ndarray, comm: _CrossComm) -> np.ndarray:
        ur, ri = np.unique(rows, return_inverse=True)
        uc, ci = np.unique(cols, return_inverse=True)
        small = np.array([[comm.path_time_s(int(a), int(b), num_bytes) for b in uc] for a in ur]).reshape(
            len(ur), len(uc)
        )
        return small[ri.reshape(-1)[:, None], ci.reshape(-1)[None, :]]

    def per_device(ids: np.ndarray, comm: _Comm) -> np.ndarray:
        return np.array([num_bytes / _split_degree(comm.layouts[i]) for i in ids.tolist()])

    r_f = table(prod_fwd, cons_fwd, forward)
    r_b = table(cons_grad, prod_grad, backward).T if needs_grad else np.zeros_like(r_f)
    rebuild = table(cons_fwd, prod_grad, backward).T
    before = (per_device(prod_fwd, forward.src) / share)[:, None]
    after = per_device(cons_fwd, forward.dst)[None, :]
    shape = r_f.shape
    memory = np.empty((*shape, _NUM_OPTIONS))
    time = np.empty((*shape, _NUM_OPTIONS))
    memory[..., 0] = before + after
    memory[..., 1] = np.broadcast_to(before, shape)
    memory[..., 2] = np.broadcast_to(after, shape)
    time[..., 0] = r_f + r_b
    time[..., 1] = 2 * r_f + r_b
    time[..., 2] = r_f + rebuild + r_b
    memory.setflags(write=False)
    time.setflags(write=False)
    return memory, time


__all__ = ["CostGraph", "build_cost_graph"]
