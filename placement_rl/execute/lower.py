"""Lower a plan into per-device instruction lists with the simulator's own compilation.

The executor runs exactly the task graph the simulator times (:mod:`placement_rl.sim.simulator`):
the same partitions and replicas per op, the same producer replica chosen for every consumer task,
the same transfers (each a region of one tensor, between two devices), the same gradient buckets
and parameter-server pushes and pulls. :func:`lower` compiles the plan with a
:class:`~placement_rl.sim.simulator.SimContext`, schedules it, and turns every simulated task into
instructions of the devices it involves, each device's list in simulated start order (ties by task
id), so that every device meets every collective and every point-to-point pair in the same order
and the run cannot deadlock:

=============  ==============================  ============================================
instruction    devices                         what the worker does
=============  ==============================  ============================================
``forward``    the task's device               assemble the inputs, run the op's partition
``backward``   the task's device               backward of that partition's autograd island
``send``       producer's device               post the activation region (isend)
``recv``       consumer's device               post the receive of it (irecv)
``grad_send``  consumer's device               post the activation gradient region
``grad_recv``  producer's device               post its receive
``all_reduce`` every device of the bucket      all-reduce of the bucket's flattened gradients
``push``       worker and server               gradient to the parameter server
``pull``       server and worker               updated parameters back
=============  ==============================  ============================================

Regions are boxes of element index ranges of the full (unpartitioned) tensor. What this module
produces is plain data (no torch), so the lowering is tested against the simulator without running
anything.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.plan.core import Plan
from placement_rl.sim import kernels as _kernels
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import (
    EdgeArrays,
    OpArrays,
    SimContext,
    _CompiledOp,
)
from placement_rl.topology import DeviceTopology

Box = tuple[tuple[int, int], ...]  # per axis [lo, hi) element indices of the full tensor

INSTRUCTION_KINDS: tuple[str, ...] = (
    "forward",
    "backward",
    "send",
    "recv",
    "grad_send",
    "grad_recv",
    "all_reduce",
    "push",
    "pull",
)

#: Losses whose partial results over a sample split are means: each partition's mean is weighted by
#: its share of the batch so that the partials sum to the mean over the whole batch.
MEAN_REDUCTIONS = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "bce_loss", "mean")

#: Op families whose parameter dimension the executor can split (the weight's output rows).
PARAMETER_SPLIT_OPS = ("linear", "conv1d", "conv2d", "conv3d", "embedding")


class NotExecutableError(ValueError):
    """A plan the executor cannot run (raised before any worker starts); names the op and the reason."""


@dataclass(frozen=True)
class InputPiece:
    """One piece of one input of a forward task: a region of the producer's output.

    Attributes:
        producer_task: the producer op's local task index.
        comm: the communication id when the piece crosses devices, else ``-1`` (same device).
        box: the region, element ranges of the full tensor.
    """

    producer_task: int
    comm: int
    box: Box


@dataclass(frozen=True)
class InputSpec:
    """One input tensor (graph edge) of a forward task: the region it reads and its pieces."""

    edge: int
    src_op: str
    src_output: int
    box: Box
    pieces: tuple[InputPiece, ...]


@dataclass(frozen=True)
class TaskSpec:
    """One forward task and its backward (the same partition of one op on one device).

    Attributes:
        op: the op's name; ``op_index`` its index in the graph.
        task: local task index (partition ``task // replicas``, replica ``task % replicas``).
        rank: the worker that runs it.
        output_boxes: per output, the region of the full output this task produces (a reduction
            split produces partial sums of the full output: its box is the full tensor).
        inputs: one per input edge, in the graph's edge order.
        param_shard: which parameter shard it reads (row block of the weight), of ``param_shards``.
        partial_weight: the factor a mean over a split batch is multiplied by (1 when unsplit).
        seed_gradient: the gradient its output 0 starts backward with (the loss: ``1 / replicas`` on
            every replica, so that duplicated losses count once); 0 for every other op.
        sample_range: the fraction of the batch its partition reads (``(0, 1)`` unless sample-split).
    """

    op: str
    op_index: int
    task: int
    rank: int
    partition: int
    replica: int
    output_boxes: tuple[Box, ...]
    inputs: tuple[InputSpec, ...]
    param_shard: int
    param_shards: int
    partial_weight: float
    seed_gradient: float
    sample_range: tuple[float, float] = (0.0, 1.0)  # the batch fraction [lo, hi) its partition reads


@dataclass(frozen=True)
class CommSpec:
    """One simulated transfer (and its mirrored gradient transfer).

    Attributes:
        comm: its id (the simulator's transfer index: task ``2F + comm``, gradient ``2F + C + comm``).
        src_rank, dst_rank: producer's and consumer's workers.
        src_op, src_task, src_output: the producer task and which of its outputs.
        dst_op, dst_task: the consumer task.
        box: the region sent (the gradient of the same region goes back).
        num_bytes: the simulator's bytes for it.
    """

    comm: int
    src_rank: int
    dst_rank: int
    src_op: str
    src_task: int
    src_output: int
    dst_op: str
    dst_task: int
    box: Box
    num_bytes: float


@dataclass(frozen=True)
class ShardRef:
    """A parameter shard: the owner op (the first op using the parameters) and the shard index."""

    owner: str
    shard: int
    shards: int


@dataclass(frozen=True)
class BucketSpec:
    """One all-reduce: the shards' gradients, flattened in this order, summed over ``ranks``;
    ``num_bytes`` is the bucket's gradient bytes (each member contributes them)."""

    bucket: int
    ranks: tuple[int, ...]
    members: tuple[ShardRef, ...]
    num_bytes: float


@dataclass(frozen=True)
class PsSpec:
    """A parameter-server push (gradient, worker -> server) or pull (parameters, server -> worker)."""

    sync: int
    kind: str  # "push" or "pull"
    shard: ShardRef
    worker_rank: int
    server_rank: int
    num_bytes: float


@dataclass(frozen=True)
class Instruction:
    """One step of a worker's program: ``kind`` and the id of the task, comm, bucket or sync it is."""

    kind: str
    ref: int
    sim_task: int
    sim_start_s: float
    sim_end_s: float


@dataclass(frozen=True)
class Holding:
    """A parameter shard one worker holds and how it is synchronized."""

    shard: ShardRef
    mode: str  # all_reduce, all_reduce_per_tensor, parameter_server, duplicate (sfb is refused)
    holders: tuple[int, ...]  # ranks holding it, in the simulator's group order
    server_rank: int  # parameter server's rank, or -1


@dataclass
class Program:
    """Everything the workers of one plan need, as plain data (see the module docstring).

    Attributes:
        devices: the topology devices the plan uses; worker ``rank`` runs ``devices[rank]``.
        tasks: ``(op name, local task) -> TaskSpec``.
        comms: by comm id; buckets by bucket id; ps by sync id.
        instructions: per rank, in simulated start order.
        holdings: per rank, the parameter shards it holds.
        loss_op: the op whose output is the training loss.
        simulated: the simulation of the plan (same cost model).
    """

    graph_name: str
    plan_name: str
    devices: tuple[str, ...]
    tasks: dict[tuple[str, int], TaskSpec]
    comms: list[CommSpec]
    buckets: list[BucketSpec]
    ps: list[PsSpec]
    instructions: list[list[Instruction]]
    holdings: list[list[Holding]]
    loss_op: str
    simulated: SimResult
    task_order: list[tuple[str, int]] = field(default_factory=list)  # forward task id -> (op, local task)
    groups: list[tuple[int, ...]] = field(default_factory=list)  # distinct all-reduce rank groups

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def sent_bytes(self) -> np.ndarray:
        """``(world_size,)`` payload bytes each worker sends under the simulator's accounting:
        transfers and gradient transfers, pushes and pulls, and for each all-reduce the bucket's
        bytes once per member (the payload it contributes)."""
        out = np.zeros(self.world_size)
        for c in self.comms:
            out[c.src_rank] += c.num_bytes
            out[c.dst_rank] += c.num_bytes
        for p in self.ps:
            out[p.worker_rank if p.kind == "push" else p.server_rank] += p.num_bytes
        for b in self.buckets:
            for r in b.ranks:
                out[r] += b.num_bytes
        return out


def _box(lo: np.ndarray, hi: np.ndarray, shape: Sequence[int]) -> Box:
    return tuple((round(float(lo[a]) * n), round(float(hi[a]) * n)) for a, n in enumerate(shape))


def _intersect(a: Box, b: Box) -> Box:
    return tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))


def _full(shape: Sequence[int]) -> Box:
    return tuple((0, int(n)) for n in shape)


def lower(graph: OpGraph, topology: DeviceTopology, plan: Plan, cost_model: CostModel | None = None) -> Program:
    """Compile, check and schedule ``plan`` into a :class:`Program` (module docstring).

    The cost model must count fp32 (the executor trains in fp32); it sets the simulated order.

    Raises:
        ValueError: a plan for another graph or an invalid plan (``Plan.validate``'s errors).
        NotExecutableError: a configuration the executor has no implementation for, naming the op.
    """
    cost = cost_model or CostModel()
    if cost.precision != "fp32":
        raise NotExecutableError(f"the executor trains in fp32; cost model precision {cost.precision!r}")
    if plan.graph_name != graph.name:
        raise ValueError(f"plan {plan.name!r} was made for graph {plan.graph_name!r}, not {graph.name!r}")
    plan.validate(graph, topology)
    ctx = SimContext(graph, topology, cost)
    ops = [ctx.compile(i, plan[op.name]) for i, op in enumerate(graph.ops)]
    _check_executable(graph, plan, ops, ctx)
    arrays = ctx.with_shared(OpArrays.from_ops(ops), ops)
    edges = EdgeArrays.from_flat(*ctx.transfers(ops))
    tasks = ctx.assemble(arrays, edges)
    start, end, _, crit, busy, *timeline = ctx.schedule(tasks, record=True)
    simulated = ctx._result(arrays, tasks, start, end, crit, busy, timeline)

    used = plan.devices_used()
    dev_index = {d.name: i for i, d in enumerate(topology.devices)}
    rank_of = {dev_index[d]: r for r, d in enumerate(used)}
    F, C = tasks.F, tasks.C
    task_ptr = tasks.task_ptr
    names = [op.name for op in graph.ops]

    # ---- transfers: walk every edge as the kernel does, checking the simulator's pairs
    comms: list[CommSpec] = []
    inputs: dict[tuple[int, int], list[InputSpec]] = {}
    for e, t in enumerate(graph.tensors):
        i, j = int(ctx.e_src[e]), int(ctx.e_dst[e])
        prod, cons = ops[i], ops[j]
        rank = int(ctx.e_rank[e])
        prod_box = bool(ctx.e_prod_box[e])
        axis = int(ctx.op_sample_axis[i]) if prod_box else -1
        box_lo, box_hi = np.zeros(_kernels.MAX_RANK), np.ones(_kernels.MAX_RANK)
        com_k = int(edges.com_ptr[e])
        p_i = len(prod.devices) // prod.replicas
        for q in range(len(cons.devices)):
            _kernels._consumer_box(
                q // cons.replicas,
                rank,
                bool(ctx.e_same[e]),
                axis,
                cons.need_lo,
                cons.need_hi,
                cons.samp_lo,
                cons.samp_hi,
                box_lo,
                box_hi,
            )
            need = _box(box_lo, box_hi, t.shape)
            pieces: list[InputPiece] = []
            for p in range(p_i):
                have = _box(prod.prod_lo[p], prod.prod_hi[p], t.shape) if prod_box else _full(t.shape)
                region = _intersect(have, need)
                if any(hi <= lo for lo, hi in region):
                    continue
                src = int(_kernels._pick_replica(p * prod.replicas, prod.replicas, prod.devices, cons.devices[q], q))
                if prod.devices[src] == cons.devices[q]:
                    pieces.append(InputPiece(src, -1, region))
                    continue
                c = com_k
                com_k += 1
                if (int(edges.com_p[c]), int(edges.com_q[c])) != (src, q):
                    raise AssertionError(f"lowering disagrees with the simulator on edge {t.src}->{t.dst}")
                comms.append(
                    CommSpec(
                        c,
                        rank_of[int(prod.devices[src])],
                        rank_of[int(cons.devices[q])],
                        t.src,
                        src,
                        t.src_output,
                        t.dst,
                        q,
                        region,
                        float(edges.com_b[c]),
                    )
                )
                pieces.append(InputPiece(src, c, region))
            inputs.setdefault((j, q), []).append(InputSpec(e, t.src, t.src_output, need, tuple(pieces)))
    comms.sort(key=lambda c: c.comm)
    if [c.comm for c in comms] != list(range(C)):
        raise AssertionError("lowering found a different number of transfers than the simulator")

    # ---- compute tasks
    loss_op = _loss_op(graph)
    task_specs: dict[tuple[str, int], TaskSpec] = {}
    for j, op in enumerate(graph.ops):
        compiled = ops[j]
        cfg = plan[op.name]
        degrees = cfg.degree_map
        weight = 1.0
        for dim in op.parallel_dims:
            if dim.reduction and degrees.get(dim.name, 1) > 1 and op.op_type in MEAN_REDUCTIONS:
                weight /= degrees[dim.name]
        for q in range(len(compiled.devices)):
            part = q // compiled.replicas
            boxes = []
            for k, shape in enumerate(op.output_shapes):
                same = k == 0 or len(shape) == len(op.output_shapes[0])
                boxes.append(_box(compiled.prod_lo[part], compiled.prod_hi[part], shape) if same else _full(shape))
            task_specs[(op.name, q)] = TaskSpec(
                op.name,
                j,
                q,
                rank_of[int(compiled.devices[q])],
                part,
                q % compiled.replicas,
                tuple(boxes),
                tuple(inputs.get((j, q), [])),
                int(compiled.task_shard[q]),
                compiled.shards,
                weight,
                1.0 / compiled.replicas if op.name == loss_op else 0.0,
                (float(compiled.samp_lo[part]), float(compiled.samp_hi[part])),
            )

    # ---- synchronization: holdings, buckets, parameter-server tasks
    holdings: list[list[Holding]] = [[] for _ in used]
    shard_groups: dict[int, list[tuple[int, ...]]] = {}
    for owner in range(len(graph.ops)):
        key = ctx._op_key[owner]
        if key is None or ctx._owner[key] != owner or graph.ops[owner].param_bytes <= 0:
            continue
        users = ctx._key_ops[key]
        first = ops[owner]
        members: list[dict[int, None]] = [{} for _ in range(first.shards)]
        for u in users:
            for d, sh in zip(ops[u].devices.tolist(), ops[u].task_shard.tolist(), strict=True):
                members[sh][d] = None
        groups = [tuple(m) for m in members]
        shard_groups[owner] = groups
        cfg = plan[names[owner]]
        server = int(first.ps_device)
        for k, group in enumerate(groups):
            ref = ShardRef(names[owner], k, first.shards)
            holders = tuple(rank_of[d] for d in group)
            ps_rank = rank_of.get(server, -1) if cfg.sync == "parameter_server" else -1
            if cfg.sync == "parameter_server" and server not in group and len(group) > 1:
                raise NotExecutableError(
                    f"op {names[owner]!r}: parameter server {cfg.ps_device!r} runs none of the op's tasks; the "
                    "executor keeps the server's copy on a worker that holds the parameters"
                )
            for r in holders:
                holdings[r].append(Holding(ref, cfg.sync, holders, ps_rank))

    buckets: list[BucketSpec] = []
    group_list = list(ctx._groups)
    first_sync = 2 * F + 2 * C
    for b in range(tasks.bucket_pos.shape[0]):
        lo, hi = int(tasks.bucket_member_ptr[b]), int(tasks.bucket_member_ptr[b + 1])
        refs = []
        for owner, local in zip(
            tasks.bucket_members[lo:hi].tolist(), tasks.bucket_member_local[lo:hi].tolist(), strict=True
        ):
            synced = [k for k, g in enumerate(shard_groups[owner]) if len(g) >= 2]
            refs.append(ShardRef(names[owner], synced[local], ops[owner].shards))
        group = group_list[int(tasks.bucket_group[b])]
        task_id = first_sync + int(tasks.bucket_pos[b])
        moved = float(tasks.num_bytes[task_id])  # the simulator's 2 (n - 1) x the bucket's gradient bytes
        payload = moved / (2 * (len(group) - 1))
        buckets.append(BucketSpec(b, tuple(rank_of[d] for d in group), tuple(refs), payload))

    ps: list[PsSpec] = []
    ps_task: list[int] = []
    sync_ptr = arrays.ptr["sync"]
    D = ctx.num_devices
    for owner in range(len(graph.ops)):
        lo, hi = int(sync_ptr[owner]), int(sync_ptr[owner + 1])
        if lo == hi:
            continue
        groups = [g for g in shard_groups[owner] if len(g) >= 2]
        per_shard = [2 * (len(g) - 1) for g in groups]
        synced = [k for k, g in enumerate(shard_groups[owner]) if len(g) >= 2]
        local = 0
        for k, count in zip(synced, per_shard, strict=True):
            for s in range(lo + local, lo + local + count):
                kind = "push" if int(arrays.data["sync_kind"][s]) == 5 else "pull"
                pair = int(arrays.data["sync_pair"][s])
                a, z = pair // D, pair % D
                worker, server = (a, z) if kind == "push" else (z, a)
                ps.append(
                    PsSpec(
                        len(ps),
                        kind,
                        ShardRef(names[owner], k, ops[owner].shards),
                        rank_of[worker],
                        rank_of[server],
                        float(arrays.data["sync_bytes"][s]),
                    )
                )
                ps_task.append(first_sync + int(tasks.ps_pos[s]))
            local += count

    # ---- instruction lists in simulated start order
    per_rank: list[list[tuple[float, int, Instruction]]] = [[] for _ in used]

    position = _global_order(tasks.succ_ptr, tasks.succ, tasks.indegree, start)

    def add(rank: int, kind: str, ref: int, task: int) -> None:
        per_rank[rank].append(
            (float(position[task]), task, Instruction(kind, ref, task, float(start[task]), float(end[task])))
        )

    op_of_task = np.repeat(np.arange(len(graph.ops)), np.diff(task_ptr))
    for f in range(F):
        j = int(op_of_task[f])
        owner_rank = task_specs[(names[j], f - int(task_ptr[j]))].rank
        add(owner_rank, "forward", f, f)
        add(owner_rank, "backward", f, F + f)
    for cm in comms:
        add(cm.src_rank, "send", cm.comm, 2 * F + cm.comm)
        add(cm.dst_rank, "recv", cm.comm, 2 * F + cm.comm)
        add(cm.dst_rank, "grad_send", cm.comm, 2 * F + C + cm.comm)
        add(cm.src_rank, "grad_recv", cm.comm, 2 * F + C + cm.comm)
    for bk in buckets:
        for r in bk.ranks:
            add(r, "all_reduce", bk.bucket, first_sync + int(tasks.bucket_pos[bk.bucket]))
    for sp, task in zip(ps, ps_task, strict=True):
        add(sp.worker_rank, sp.kind, sp.sync, task)
        add(sp.server_rank, sp.kind, sp.sync, task)
    instructions = [[ins for _, _, ins in sorted(lst, key=lambda x: (x[0], x[1]))] for lst in per_rank]

    rank_groups = sorted({bk.ranks for bk in buckets})
    return Program(
        graph_name=graph.name,
        plan_name=plan.name,
        devices=tuple(used),
        tasks=task_specs,
        comms=comms,
        buckets=buckets,
        ps=ps,
        instructions=instructions,
        holdings=holdings,
        loss_op=loss_op,
        simulated=simulated,
        task_order=[(names[int(op_of_task[f])], f - int(task_ptr[int(op_of_task[f])])) for f in range(F)],
        groups=rank_groups,
    )


def _global_order(succ_ptr: np.ndarray, succ: np.ndarray, indegree: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each task's position in one order of all tasks that follows the simulated start times and never
    puts a task before one it depends on (tasks of zero duration start together with their
    successors, so start times alone would not say which comes first)."""
    remaining = indegree.copy()
    ready = [(float(start[t]), t) for t in np.flatnonzero(remaining == 0).tolist()]
    heapq.heapify(ready)
    position = np.empty(start.shape[0], np.int64)
    k = 0
    while ready:
        _, t = heapq.heappop(ready)
        position[t] = k
        k += 1
        for v in succ[succ_ptr[t] : succ_ptr[t + 1]].tolist():
            remaining[v] -= 1
            if remaining[v] == 0:
                heapq.heappush(ready, (float(start[v]), v))
    if k != start.shape[0]:
        raise AssertionError("the simulated task graph has a cycle")
    return position


def _loss_op(graph: OpGraph) -> str:
    """The op whose output is the loss: the last op, which no other op reads."""
    consumed = {t.src for t in graph.tensors}
    sinks = [op.name for op in graph.ops if op.name not in consumed]
    last = graph.ops[-1].name
    if last not in sinks:
        raise NotExecutableError(f"graph {graph.name!r}: its last op {last!r} is read by other ops; expected the loss")
    if math.prod(graph.ops[-1].output_shapes[0]) != 1:
        raise NotExecutableError(
            f"graph {graph.name!r}: its last op {last!r} has output shape {graph.ops[-1].output_shapes[0]}; "
            "expected the scalar training loss"
        )
    return last


def _check_executable(graph: OpGraph, plan: Plan, ops: Sequence[_CompiledOp], ctx: SimContext) -> None:
    """Refuse configurations with no implementation, naming the op and the configuration."""
    for j, op in enumerate(graph.ops):
        cfg = plan[op.name]
        if cfg.sync == "sfb":
            raise NotExecutableError(
                f"op {op.name!r} ({op.op_type}): sync 'sfb' (sufficient factor broadcasting); the executor "
                "synchronizes gradients by all-reduce or parameter server only (simulate the plan instead, or "
                "give the op sync 'all_reduce')"
            )
        degrees = cfg.degree_map
        for dim in op.parallel_dims:
            deg = degrees.get(dim.name, 1)
            if deg <= 1:
                continue
            if dim.kind == "attribute":
                raise NotExecutableError(
                    f"op {op.name!r} ({op.op_type}): degree {deg} on attribute dimension {dim.name!r}; the executor "
                    "has no halo exchange, it splits only the sample and parameter dimensions"
                )
            if dim.kind == "parameter" and op.op_type not in PARAMETER_SPLIT_OPS:
                raise NotExecutableError(
                    f"op {op.name!r} ({op.op_type}): degree {deg} on parameter dimension {dim.name!r}; the executor "
                    f"splits the parameters of {', '.join(PARAMETER_SPLIT_OPS)} only"
                )
            if dim.reduction and op.op_type not in MEAN_REDUCTIONS and op.split != "sum":
                raise NotExecutableError(
                    f"op {op.name!r} ({op.op_type}): degree {deg} on reduction dimension {dim.name!r}, whose partial "
                    "results the executor cannot combine"
                )
        c = ops[j]
        if c.partitions > 1 and any(len(s) != len(op.output_shapes[0]) for s in op.output_shapes):
            raise NotExecutableError(
                f"op {op.name!r} ({op.op_type}): {c.partitions} partitions of an op whose outputs differ in rank"
            )
        owner = ctx.shared_owner(j)
        if owner is not None and ops[owner].shards != c.shards:
            raise NotExecutableError(
                f"op {op.name!r}: splits its shared parameters ({op.param_key}) {c.shards}-way, op "
                f"{graph.ops[owner].name!r} {ops[owner].shards}-way; the executor needs the same split"
            )
        if cfg.sync == "duplicate" and c.replicas > 1 and op.param_bytes > 0:
            _check_duplicate(graph, plan, op.name)


def _check_duplicate(graph: OpGraph, plan: Plan, name: str) -> None:
    """``duplicate`` replicas apply the gradient they receive: each must receive the whole of it.

    That holds when every op downstream runs on the same devices with one partition (a duplicated
    tail of the model): then replica ``r`` feeds and is fed by the replicas on its own device.
    """
    devices = plan[name].devices
    successors = graph.successors
    seen: set[str] = set()
    stack = [graph.index(name)]
    while stack:
        current = stack.pop()
        for k in successors[current]:
            dst = graph.ops[k].name
            if dst in seen:
                continue
            seen.add(dst)
            cfg = plan[dst]
            if tuple(cfg.devices) != tuple(devices) or cfg.num_partitions != 1:
                raise NotExecutableError(
                    f"op {name!r}: sync 'duplicate' over {list(devices)} but its consumer {dst!r} runs on "
                    f"{list(cfg.devices)} with {cfg.num_partitions} partition(s); duplicated replicas train "
                    "alike only when everything after them is duplicated on the same devices"
                )
            stack.append(k)
