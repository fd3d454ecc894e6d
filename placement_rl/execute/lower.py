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
``all_reduce`` every device of the bucket      all-reduce of the bucket's flattened gradients (ZeRO:
                                               reduce-scatter, then all-gather of the updated shards)
``push``       worker and server               gradient to the parameter server
``pull``       server and worker               updated parameters back
=============  ==============================  ============================================

Regions are boxes of element index ranges of the full (unpartitioned) tensor. What this module
produces is plain data (no torch), so the lowering is tested against the simulator without running
anything.

**Micro-batches** (``plan.micro_batches = m > 1``). The simulator times such a plan on its
micro-batch graph (:mod:`placement_rl.sim.pipeline`: every op copied ``m`` times as ``<op>@mb<k>``,
each copy computing micro-batch ``k``, the copies sharing their op's parameters), each device's
compute tasks in the schedule's order (GPipe, 1F1B, interleaved). The lowering compiles and
schedules that same task graph (:func:`task_graph`), so each worker's program runs its forward and
backward tasks in the schedule's order, and every gradient is synchronized once, after the last
micro-batch's backward. A task names its lowered op (``op``, a copy) and the fx node it runs
(``node``, the original op) on its ``micro_batch``: an input op reads rows ``[k b, (k + 1) b)`` of the
batch (``b`` the micro-batch size), every other op runs on the regions it receives. Gradients of the
shared parameters accumulate over the micro-batches; a mean loss (:data:`MEAN_REDUCTIONS`) of a
micro-batch starts backward with ``1 / m`` of the seed (and counts ``1 / m`` of the iteration's loss),
so the micro-batches' contributions add up to the mean over the whole batch.

**ZeRO** (``OpConfig.zero``, stages 1 and 2). A ZeRO shard's replicas synchronize in the same
gradient bucket, one simulated task: the worker reduce-scatters the ZeRO members' flattened
gradients (holder ``i`` of the group, in rank order, receives the sum of chunk ``i``), updates its
own chunk of the parameters (the only optimizer state a holder keeps), and all-gathers the updated
chunks. Stage 2 also releases the full gradients as soon as they are handed to the reduce-scatter;
stage 1 keeps them to the end of the iteration. Stage 3 is refused (:func:`lower` says why).

**Bytes.** :meth:`Program.sent_bytes` counts, per member of a bucket, the bucket's gradient bytes
``S``: the payload an all-reduce takes from each member. The simulator counts ``2 (n - 1) S`` for the
bucket's task (a ring all-reduce: ``2 (n - 1) / n S`` on the wire from each of ``n`` members), for
plain and ZeRO buckets alike, because a ring reduce-scatter and a ring all-gather each put
``(n - 1) / n S`` on the wire per member: together what one all-reduce does. The executor counts a
ZeRO member's payload the same way: in the reduce-scatter, the ``S - S_i`` bytes of its gradient
that other holders own, in the all-gather its own updated chunk, ``S_i`` bytes: ``S`` in all.

**Uneven splits** (``OpConfig.weights``). A partition's sample interval comes from the cumulative
shares, as the simulator's (:meth:`~placement_rl.sim.simulator.SimContext.compile`). Workers compute
whole samples: every boundary of a weighted op's slices must fall on a whole sample of each tensor
it splits (``round(share * samples)`` is then exact, and the simulator's fractional bytes are the
bytes of whole rows); other weights are refused, naming the op.

**Recomputation** (``OpConfig.recompute``). The task's forward runs without recording autograd;
its backward runs the forward again (same inputs, same random state) and then backward, as the
simulator's backward task, which spends the forward's time again.
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
from placement_rl.sim import pipeline as _pipeline
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import (
    EdgeArrays,
    OpArrays,
    SimContext,
    _CompiledOp,
    _fold_micro_batches,
    _Tasks,
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
    """One input tensor (graph edge) of a forward task: the region it reads and its pieces.

    ``src_op`` is the producer's lowered op (a micro-batch copy under micro-batches), ``src_node``
    the fx node it runs (the original op).
    """

    edge: int
    src_op: str
    src_output: int
    box: Box
    pieces: tuple[InputPiece, ...]
    src_node: str


@dataclass(frozen=True)
class TaskSpec:
    """One forward task and its backward (the same partition of one op on one device).

    Attributes:
        op: the lowered op's name (``<op>@mb<k>`` under micro-batches); ``op_index`` its index in the
            lowered graph.
        node: the fx node it runs: the original op's name.
        task: local task index (partition ``task // replicas``, replica ``task % replicas``).
        rank: the worker that runs it.
        output_boxes: per output, the region of the full output this task produces (a reduction
            split produces partial sums of the full output: its box is the full tensor).
        inputs: one per input edge, in the graph's edge order.
        param_shard: which parameter shard it reads (row block of the weight), of ``param_shards``.
        partial_weight: the factor a mean over a split batch is multiplied by (1 when unsplit).
        seed_gradient: the gradient its output 0 starts backward with (the loss: ``1 / replicas`` on
            every replica, so that duplicated losses count once, and ``1 / m`` of that for a mean
            loss over one of ``m`` micro-batches); 0 for every other op.
        sample_range: the fraction of the (micro-)batch its partition reads (``(0, 1)`` unless
            sample-split).
        micro_batch: the micro-batch it computes (0 without micro-batches).
        recompute: its forward keeps no autograd graph; backward runs the forward again first.
    """

    op: str
    node: str
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
    micro_batch: int = 0
    recompute: bool = False


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
    """A parameter shard: the owner op (the first op using the parameters, an fx node name; under
    micro-batches the original op, whose parameters every copy shares) and the shard index."""

    owner: str
    shard: int
    shards: int


@dataclass(frozen=True)
class BucketSpec:
    """One all-reduce: the shards' gradients, flattened in this order, summed over ``ranks``;
    ``num_bytes`` is the bucket's gradient bytes (each member contributes them). ``zero`` is each
    member's ZeRO stage: members with a stage are reduce-scattered, updated in chunks and
    all-gathered instead (module docstring), the others all-reduced."""

    bucket: int
    ranks: tuple[int, ...]
    members: tuple[ShardRef, ...]
    num_bytes: float
    zero: tuple[int, ...] = ()

    @property
    def sharded(self) -> tuple[ShardRef, ...]:
        """The members synchronized under ZeRO."""
        return tuple(m for m, z in zip(self.members, self.zero or (0,) * len(self.members), strict=True) if z)

    @property
    def plain(self) -> tuple[ShardRef, ...]:
        """The members all-reduced."""
        return tuple(m for m, z in zip(self.members, self.zero or (0,) * len(self.members), strict=True) if not z)


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
    zero: int = 0  # ZeRO stage of its replicas (0 when it has fewer than two holders)


@dataclass
class Program:
    """Everything the workers of one plan need, as plain data (see the module docstring).

    Attributes:
        devices: the topology devices the plan uses; worker ``rank`` runs ``devices[rank]``.
        tasks: ``(op name, local task) -> TaskSpec``.
        comms: by comm id; buckets by bucket id; ps by sync id.
        instructions: per rank, in simulated start order.
        holdings: per rank, the parameter shards it holds.
        loss_op: the op (fx node) whose output is the training loss.
        simulated: the simulation of the plan (same cost model): what
            :func:`~placement_rl.sim.simulator.simulate` returns, its task table the lowered task
            graph's, task for task (``tasks.op`` the original ops', ``tasks.micro_batch`` the copies').
        micro_batches: the plan's micro-batches per iteration.
        node_of: lowered op name -> the fx node (original op) it runs.
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
    micro_batches: int = 1
    node_of: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def sent_bytes(self) -> np.ndarray:
        """``(world_size,)`` payload bytes each worker sends under the simulator's accounting:
        transfers and gradient transfers, pushes and pulls, and for each all-reduce the bucket's
        bytes once per member (the payload it contributes; under ZeRO the shards of its gradient
        the others own plus its own updated shard, the same bytes: module docstring)."""
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


#: How far from a whole sample an uneven split's boundary may fall (in samples): float rounding only.
WHOLE_SAMPLE_TOLERANCE = 1e-6


def _check_whole(
    op: str, weights: dict[str, float], lo: np.ndarray, hi: np.ndarray, shape: Sequence[int], what: str
) -> None:
    """Refuse an uneven split whose region ``[lo, hi)`` (fractions per axis) of a tensor of ``shape``
    does not fall on whole elements: workers compute whole samples, and the simulator's bytes for
    the region are the bytes of whole rows only then."""
    for a, n in enumerate(shape):
        for x in (float(lo[a]) * n, float(hi[a]) * n):
            if abs(x - round(x)) > WHOLE_SAMPLE_TOLERANCE:
                raise NotExecutableError(
                    f"op {op!r}: weights {weights} cut {what} (shape {tuple(shape)}) at {x:.6g} of its {n} rows on "
                    f"axis {a}; the executor computes whole samples, so every boundary (cumulative weight x rows) "
                    f"must be a whole number: expected cumulative weights in multiples of 1/{n}"
                )


@dataclass
class TaskGraph:
    """A plan's task graph, compiled and assembled as the simulator does it (:func:`task_graph`).

    Attributes:
        ctx: the context it was compiled in: the graph's, or under micro-batches its micro-batch
            graph's (:meth:`~placement_rl.sim.simulator.SimContext.micro_batch_context`).
        graph, plan: what was compiled: the plan's graph and the plan, or under micro-batches the
            micro-batch graph and the plan on it (every copy its op's configuration).
        original: the plan's own graph.
        micro_batches: the plan's micro-batches per iteration.
        ops: the compiled configurations, in ``graph``'s op order.
        arrays, edges: their per-op and per-edge arrays (shared parameters' synchronization included).
        tasks: the task graph; each device's compute tasks in program order (under micro-batches,
            the schedule's).
    """

    ctx: SimContext
    graph: OpGraph
    plan: Plan
    original: OpGraph
    micro_batches: int
    ops: list[_CompiledOp]
    arrays: OpArrays
    edges: EdgeArrays
    tasks: _Tasks

    def result(
        self,
        start: np.ndarray,
        end: np.ndarray,
        critical: np.ndarray,
        direction_busy_s: np.ndarray,
        timeline: Sequence[np.ndarray],
    ) -> SimResult:
        """The simulator's result of a schedule of :attr:`tasks` (what
        :meth:`~placement_rl.sim.simulator.SimContext.schedule` returns, ``ready`` left out), told of the
        original ops under micro-batches: what :func:`~placement_rl.sim.simulator.simulate` returns."""
        result = self.ctx._result(self.arrays, self.tasks, start, end, critical, direction_busy_s, timeline)
        if self.micro_batches > 1:
            return _fold_micro_batches(result, self.original, self.micro_batches)
        return result


def task_graph(graph: OpGraph, topology: DeviceTopology, plan: Plan, cost_model: CostModel | None = None) -> TaskGraph:
    """Compile and assemble ``plan``'s task graph as :func:`~placement_rl.sim.simulator.simulate` does:
    on the graph, or for several micro-batches on the micro-batch graph, each device's compute tasks
    in the schedule's order. The plan is not validated here.

    Raises:
        ScheduleDeadlock: a schedule whose order makes a device wait for itself.
    """
    ctx = SimContext(graph, topology, cost_model or CostModel())
    m = plan.micro_batches
    lowered, lowered_plan = graph, plan
    if m > 1:
        ctx = ctx.micro_batch_context(m)
        lowered = ctx.graph
        lowered_plan = _pipeline.micro_batch_plan(plan, graph, lowered)
    ops = [ctx.compile(i, lowered_plan[op.name]) for i, op in enumerate(lowered.ops)]
    arrays = ctx.with_shared(OpArrays.from_ops(ops), ops)
    edges = EdgeArrays.from_flat(*ctx.transfers(ops))
    if m > 1:
        ctx.schedule_plan = (graph, plan)  # each device's compute tasks in the schedule's order
    try:
        tasks = ctx.assemble(arrays, edges)
    finally:
        ctx.schedule_plan = None
    return TaskGraph(ctx, lowered, lowered_plan, graph, m, ops, arrays, edges, tasks)


def lower(graph: OpGraph, topology: DeviceTopology, plan: Plan, cost_model: CostModel | None = None) -> Program:
    """Compile, check and schedule ``plan`` into a :class:`Program` (module docstring).

    The cost model must count fp32 (the executor trains in fp32); it sets the simulated order.

    Raises:
        ValueError: a plan for another graph or an invalid plan (``Plan.validate``'s errors), or a
            schedule that deadlocks (:class:`~placement_rl.sim.pipeline.ScheduleDeadlock`).
        NotExecutableError: a configuration the executor has no implementation for, naming the op.
    """
    cost = cost_model or CostModel()
    if cost.precision != "fp32":
        raise NotExecutableError(f"the executor trains in fp32; cost model precision {cost.precision!r}")
    if plan.graph_name != graph.name:
        raise ValueError(f"plan {plan.name!r} was made for graph {plan.graph_name!r}, not {graph.name!r}")
    plan.validate(graph, topology)
    built = task_graph(graph, topology, plan, cost)
    ctx, ops, arrays, edges, tasks = built.ctx, built.ops, built.arrays, built.edges, built.tasks
    lowered, lowered_plan = built.graph, built.plan  # the micro-batch graph and its plan, or graph and plan
    _check_executable(lowered, lowered_plan, ops, ctx)
    loss_op = _loss_op(graph)
    loss_share = _micro_batch_share(graph, plan, loss_op)
    start, end, _, crit, busy, *timeline = ctx.schedule(tasks, record=True)
    simulated = built.result(start, end, crit, busy, timeline)

    m = plan.micro_batches
    names = [op.name for op in lowered.ops]
    node_of = {name: graph.ops[i // m].name for i, name in enumerate(names)}
    used = plan.devices_used()
    dev_index = {d.name: i for i, d in enumerate(topology.devices)}
    rank_of = {dev_index[d]: r for r, d in enumerate(used)}
    F, C = tasks.F, tasks.C
    task_ptr = tasks.task_ptr

    # ---- transfers: walk every edge as the kernel does, checking the simulator's pairs
    comms: list[CommSpec] = []
    inputs: dict[tuple[int, int], list[InputSpec]] = {}
    for e, t in enumerate(lowered.tensors):
        i, j = int(ctx.e_src[e]), int(ctx.e_dst[e])
        prod, cons = ops[i], ops[j]
        rank = int(ctx.e_rank[e])
        prod_box = bool(ctx.e_prod_box[e])
        axis = int(ctx.op_sample_axis[i]) if prod_box else -1
        box_lo, box_hi = np.zeros(_kernels.MAX_RANK), np.ones(_kernels.MAX_RANK)
        com_k = int(edges.com_ptr[e])
        p_i = len(prod.devices) // prod.replicas
        prod_uneven = bool(lowered_plan[names[i]].weights)
        cons_uneven = bool(lowered_plan[names[j]].weights)
        for q in range(len(cons.devices)):
            _kernels.consumer_region(  # the region the simulator's transfer kernel computes
                q // cons.replicas,
                rank,
                ctx.e_map[e],
                axis,
                cons.need_lo,
                cons.need_hi,
                cons.samp_lo,
                cons.samp_hi,
                box_lo,
                box_hi,
            )
            if cons_uneven:
                _check_whole(
                    node_of[names[j]],
                    lowered_plan[names[j]].weight_map,
                    box_lo,
                    box_hi,
                    t.shape,
                    f"its input from {node_of[t.src]!r}",
                )
            need = _box(box_lo, box_hi, t.shape)
            pieces: list[InputPiece] = []
            for p in range(p_i):
                if prod_box and prod_uneven:
                    where = f"its output {t.src_output}"
                    weights = lowered_plan[t.src].weight_map
                    _check_whole(node_of[t.src], weights, prod.prod_lo[p], prod.prod_hi[p], t.shape, where)
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
            inputs.setdefault((j, q), []).append(InputSpec(e, t.src, t.src_output, need, tuple(pieces), node_of[t.src]))
    comms.sort(key=lambda c: c.comm)
    if [c.comm for c in comms] != list(range(C)):
        raise AssertionError("lowering found a different number of transfers than the simulator")

    # ---- compute tasks
    task_specs: dict[tuple[str, int], TaskSpec] = {}
    for j, op in enumerate(lowered.ops):
        compiled = ops[j]
        cfg = lowered_plan[op.name]
        degrees = cfg.degree_map
        node = node_of[op.name]
        for q in range(len(compiled.devices)):
            part = q // compiled.replicas
            weight = 1.0  # a mean over a split batch: each partition's mean weighted by its share
            for dim in op.parallel_dims:
                deg = degrees.get(dim.name, 1)
                if dim.reduction and deg > 1 and op.op_type in MEAN_REDUCTIONS:
                    uneven = dim.kind == "sample" and cfg.weights
                    weight *= float(compiled.samp_hi[part] - compiled.samp_lo[part]) if uneven else 1.0 / deg
            boxes = []
            for k, shape in enumerate(op.output_shapes):
                same = k == 0 or len(shape) == len(op.output_shapes[0])
                if same and cfg.weights:
                    part_lo, part_hi = compiled.prod_lo[part], compiled.prod_hi[part]
                    _check_whole(node, cfg.weight_map, part_lo, part_hi, shape, f"its output {k}")
                boxes.append(_box(compiled.prod_lo[part], compiled.prod_hi[part], shape) if same else _full(shape))
            task_specs[(op.name, q)] = TaskSpec(
                op=op.name,
                node=node,
                op_index=j,
                task=q,
                rank=rank_of[int(compiled.devices[q])],
                partition=part,
                replica=q % compiled.replicas,
                output_boxes=tuple(boxes),
                inputs=tuple(inputs.get((j, q), [])),
                param_shard=int(compiled.task_shard[q]),
                param_shards=compiled.shards,
                partial_weight=weight,
                seed_gradient=loss_share / compiled.replicas if node == loss_op else 0.0,
                sample_range=(float(compiled.samp_lo[part]), float(compiled.samp_hi[part])),
                micro_batch=j % m,
                recompute=cfg.recompute,
            )

    # ---- synchronization: holdings, buckets, parameter-server tasks
    holdings: list[list[Holding]] = [[] for _ in used]
    shard_groups: dict[int, list[tuple[int, ...]]] = {}
    for owner in range(len(lowered.ops)):
        key = ctx._op_key[owner]
        if key is None or ctx._owner[key] != owner or lowered.ops[owner].param_bytes <= 0:
            continue
        users = ctx._key_ops[key]
        first = ops[owner]
        members: list[dict[int, None]] = [{} for _ in range(first.shards)]
        for u in users:
            for d, sh in zip(ops[u].devices.tolist(), ops[u].task_shard.tolist(), strict=True):
                members[sh][d] = None
        groups = [tuple(m) for m in members]
        shard_groups[owner] = groups
        cfg = lowered_plan[names[owner]]
        server = int(first.ps_device)
        for k, group in enumerate(groups):
            ref = ShardRef(node_of[names[owner]], k, first.shards)
            holders = tuple(rank_of[d] for d in group)
            ps_rank = rank_of.get(server, -1) if cfg.sync == "parameter_server" else -1
            if cfg.sync == "parameter_server" and server not in group and len(group) > 1:
                raise NotExecutableError(
                    f"op {node_of[names[owner]]!r}: parameter server {cfg.ps_device!r} runs none of the op's tasks; "
                    "the executor keeps the server's copy on a worker that holds the parameters"
                )
            zero = cfg.zero if len(group) > 1 else 0
            for r in holders:
                holdings[r].append(Holding(ref, cfg.sync, holders, ps_rank, zero))

    buckets: list[BucketSpec] = []
    group_list = list(ctx._groups)
    first_sync = 2 * F + 2 * C
    for b in range(tasks.bucket_pos.shape[0]):
        lo, hi = int(tasks.bucket_member_ptr[b]), int(tasks.bucket_member_ptr[b + 1])
        refs = []
        stages = []
        for owner, local in zip(
            tasks.bucket_members[lo:hi].tolist(), tasks.bucket_member_local[lo:hi].tolist(), strict=True
        ):
            synced = [k for k, g in enumerate(shard_groups[owner]) if len(g) >= 2]
            refs.append(ShardRef(node_of[names[owner]], synced[local], ops[owner].shards))
            stages.append(lowered_plan[names[owner]].zero)
        group = group_list[int(tasks.bucket_group[b])]
        task_id = first_sync + int(tasks.bucket_pos[b])
        moved = float(tasks.num_bytes[task_id])  # the simulator's 2 (n - 1) x the bucket's gradient bytes
        payload = moved / (2 * (len(group) - 1))
        buckets.append(BucketSpec(b, tuple(rank_of[d] for d in group), tuple(refs), payload, tuple(stages)))

    ps: list[PsSpec] = []
    ps_task: list[int] = []
    sync_ptr = arrays.ptr["sync"]
    D = ctx.num_devices
    for owner in range(len(lowered.ops)):
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
                        ShardRef(node_of[names[owner]], k, ops[owner].shards),
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

    op_of_task = np.repeat(np.arange(len(lowered.ops)), np.diff(task_ptr))
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
        micro_batches=m,
        node_of=node_of,
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


def _micro_batch_share(graph: OpGraph, plan: Plan, loss: str) -> float:
    """The share of the iteration's loss one micro-batch's loss is: ``1 / m`` for a mean over the
    batch (:data:`MEAN_REDUCTIONS`), 1 for a sum; 1 without micro-batches.

    Raises:
        NotExecutableError: under micro-batches, a loss that does not reduce over the batch, or an
            op before it that does (each micro-batch would reduce over its own samples only).
    """
    m = plan.micro_batches
    if m == 1:
        return 1.0
    share = 1.0
    for op in graph.ops:
        dim = op.sample_dim
        if op.name == loss:
            if dim is None or not dim.reduction or (op.op_type not in MEAN_REDUCTIONS and op.split != "sum"):
                raise NotExecutableError(
                    f"plan {plan.name!r}: {m} micro-batches, but the loss {loss!r} ({op.op_type}) is neither a mean "
                    "nor a sum over the batch; the executor adds micro-batches' losses up as one of those"
                )
            share = 1.0 / m if op.op_type in MEAN_REDUCTIONS else 1.0
        elif dim is not None and dim.reduction:
            raise NotExecutableError(
                f"plan {plan.name!r}: {m} micro-batches, but op {op.name!r} ({op.op_type}) reduces over the batch "
                f"(sample dimension {dim.name!r}) before the loss: each micro-batch would reduce over its own "
                "samples, which one big batch does not; expected micro_batches = 1 for this model"
            )
    return share


def _check_executable(graph: OpGraph, plan: Plan, ops: Sequence[_CompiledOp], ctx: SimContext) -> None:
    """Refuse configurations with no implementation, naming the op and the configuration."""
    for j, op in enumerate(graph.ops):
        cfg = plan[op.name]
        if cfg.zero >= 3:
            raise NotExecutableError(
                f"op {op.name!r} ({op.op_type}): ZeRO stage {cfg.zero} (parameters sharded, all-gathered before "
                "every forward and backward); the simulator counts those all-gathers in the gradient bucket, with "
                "no task before each forward and backward, so the executor cannot run its task graph task for "
                "task; expected ZeRO stage 1 or 2 (or simulate the plan)"
            )
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
