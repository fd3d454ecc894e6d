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

**Tensor parallelism** (Megatron-LM). A split along a linear layer's input features (``in_channel``,
a reduction dimension of kind ``parameter``: the row-parallel layer) yields partial outputs; the
partials of one sum group reach consumers on the group's devices through one all-reduce over those
devices (a ``partial_all_reduce`` task: Megatron's ``g``), not as transfers. A layer split along its
output features (the column-parallel layer) that reads its whole input from a replica on its own
device yields partial input gradients, summed by one backward all-reduce (Megatron's ``f``). A
view's output axes follow its input's through the tensor's ``dst_axes``, so attention split by head
flows through the reshapes and transposes around it without moving data.

**Micro-batches** (``plan.micro_batches > 1``) are simulated on the micro-batch graph, every op
copied once per micro-batch, each device's tasks in the order of the plan's pipeline schedule
(:mod:`placement_rl.sim.pipeline`); gradients synchronize once, after the last micro-batch. An op
with ``recompute`` spends its forward time again in its backward task and does not hold its output
in between. ZeRO (``zero``) divides the optimizer state (stage 1), the gradients (2) and the
parameters (3) among the holders of each shard; stage 3's parameter all-gathers add their bytes to
the gradient all-reduce. An uneven sample split (``weights``) gives each partition its share of
the batch, of the work and of the activations.

**Synchronization.** Parameters are split along parameter dimensions and replicated along the
others. Each shard held by several devices is synchronized by all-reduce, by parameter-server push
and pull transfers, or not at all for ``duplicate``. Ops sharing a ``param_key`` (an unrolled LSTM
layer) synchronize once, after all of their backward tasks, over every device that runs any of
them (per shard when they split the parameters alike), with the first op's sync mode.

**Gradient buckets** (PyTorch DDP, Horovod). All-reduced gradients are grouped per device group
(the devices holding the shard, in order: one communicator) into buckets of about
``CostModel.bucket_bytes`` (25 MiB, DDP's default): a group's shards are taken in backward order
(descending op index; shared parameters at their first op) and a bucket is closed as soon as it
holds at least ``bucket_bytes`` (so one large tensor is a bucket of its own). Each bucket is one
all-reduce task that starts once every backward task feeding it has ended, overlapping the rest of
backward. ``bucket_bytes=0`` all-reduces every tensor on its own (the papers' DP-NCCL).

**Scheduling.** Computation and communication overlap (A1-A4). A global queue ordered by ready time
takes tasks in turn; a compute task runs FIFO on its device. Under a calibrated cost model (the
default) each device runs its compute tasks in program order, as one CUDA stream does: its forward
tasks in op order, then its backward tasks in reverse op order, each after the previous one (the
flat roofline, ``CostModel(calibration=None)``, keeps FlexFlow's list scheduling: FIFO in the order
tasks become ready).

**Host lanes** (``execution_mode="eager"``, the default). Each device has a host lane, the process
driving it, with one ``host`` task per compute task, in the same program order: it takes the
cost model's host time to issue the task (:meth:`~placement_rl.sim.cost.CostModel.host_times_s`),
and the task's GPU work starts no earlier than its issue ends. The host runs ahead of its GPU
(launches are asynchronous) and waits only for what it receives from another device (a receive
blocks until the data is there) and, implicitly, the end of the iteration. So small ops are bound
by the host, as they are in eager PyTorch on a fast GPU. Under ``cuda_graphs`` there are no host
tasks (a captured iteration is issued at near-zero host cost). Host tasks are ids
``[host_base, host_base + 2F)`` after the synchronization block; their lanes are ``"<device> host"``.

How communication is timed is the cost model's network model (:mod:`placement_rl.sim.network`):

* ``flow`` (default): each transfer is a flow along its route and starts when ready; the flows in
  flight share each link direction max-min fairly, rates recomputed whenever one starts or ends; it
  ends its route's latency after its last byte leaves. An all-reduce is the phases of flows of the
  algorithm :meth:`~placement_rl.sim.network.Network.all_reduce` picks (ring, parallel rings,
  hierarchical).
* ``circuit``: a transfer holds every link direction of its route for ``latency + bytes /
  bottleneck``, FIFO per direction; a ring all-reduce holds every direction of its ring for
  ``2 (n - 1) (latency + (S / n) / bandwidth)``, bandwidth shared where its hops share a link.
* ``pairwise``: as ``circuit``, but a transfer holds only its device pair's own connection, and an
  all-reduce the pairs of its ring's hops, at their routes' bottleneck bandwidths.

**Link accounting.** Every communication task puts bytes on link directions: a transfer its bytes
on each direction of its route, a ring all-reduce ``2 (n - 1) / n`` of the message on each
direction of each hop. ``SimResult`` reports bytes, busy time and utilization per direction, and
each direction's rate over time: under ``flow`` the rates the flows were given, otherwise each
task's bytes spread evenly over its duration. No direction carries more than its capacity times
the makespan under ``flow`` and ``circuit``; ``pairwise`` assumes dedicated connections, so a
physical direction shared by several pairs may be over-subscribed.

**Memory.** Per device: parameters, gradients and optimizer state of every shard it holds (per
parameter element under the cost model's precision, :mod:`placement_rl.sim.cost`); each
forward task's output from its start until its backward task ends; received activations and
gradients until the backward task that uses them ends; a backward workspace the size of the
task's output while it runs. The peak is the maximum over time (events swept in time order, frees
first on ties). A device whose peak exceeds its memory is reported in ``oom_devices`` (the
simulation itself always completes).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl.graph import Op, OpGraph
from placement_rl.plan.core import OpConfig, Plan, pipeline_stages, sample_shares, zero_holders
from placement_rl.sim import kernels as _kernels
from placement_rl.sim import limits as _limits
from placement_rl.sim import network as _network
from placement_rl.sim import pipeline as _pipeline
from placement_rl.sim import sfb as _sfb
from placement_rl.sim.cost import CostModel
from placement_rl.sim.result import TASK_KINDS, LinkRates, SimResult, TaskTable
from placement_rl.topology import DeviceTopology

MAX_RANK = _kernels.MAX_RANK
_RECENT_ALL_REDUCES = 4  # flow_all_reduce results kept per group table
TIMELINE_PER_SLOT = 2  # the recorded link timeline's first capacity guess, per flow and direction it crosses
(
    _FORWARD,
    _BACKWARD,
    _TRANSFER,
    _GRAD_TRANSFER,
    _ALL_REDUCE,
    _PS_PUSH,
    _PS_PULL,
    _SFB_BROADCAST,
    _SFB_GRADIENT,
    _HOST,
    _PARTIAL_ALL_REDUCE,
) = range(len(TASK_KINDS))

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
    backward_s: np.ndarray  # (T,) (with the optimizer step of the parameters the task holds, for their owner)
    activation_bytes: np.ndarray  # (T,) output bytes each task holds until its backward ends
    host_forward_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) host seconds to issue
    host_backward_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,)
    recompute: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # (T,) output recomputed
    # tensor parallelism: the tasks whose partial outputs (a split of input features) sum together
    # share a ``sum_group``, those whose partial input gradients (a split of output features) sum
    # together a ``grad_group`` (local ids, -1: none); ``in_fraction`` is the share of its input a task reads
    sum_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (T,)
    grad_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (T,)
    in_fraction: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,)
    out_fraction: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) share of the output it produces
    duplicated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # (T,) its op's sync is duplicate
    static_devices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    static_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Parameter-server and SFB synchronization tasks (owners of parameters only), as a template with
    # local ids; an ``sfb_gradient`` task computes on device ``sync_pair // D`` for ``sync_seconds``.
    sync_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (S,) push, pull, sfb
    sync_pair: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (S,) flat device pair
    sync_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (S,)
    sync_after_backward: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # (S,)
    sync_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (S,) compute (``sfb_gradient``)
    sync_dep_u: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # push -> pull, local ids
    sync_dep_v: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # All-reduced shards (owners only), bucketed across ops at assembly: (A,) each.
    ar_group: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # SimContext group id
    ar_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # gradient bytes
    ar_shard: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # position among the op's syncs
    ar_alone: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # ``all_reduce_per_tensor``
    # Parameter shards (for ops sharing parameters with others): shard of each task, shard count.
    task_shard: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (T,)
    shards: int = 1
    sync_mode: str = "all_reduce"
    zero: int = 0  # ZeRO stage of the replicas of each shard
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
class _Flows:
    """Communication as phases of flows (see :func:`placement_rl.sim.kernels.schedule_flows`).

    Shapes: T tasks, P phases, Fl flows. Task ``t``'s phases are ``phase_ptr[t] : phase_ptr[t + 1]``,
    phase ``p``'s flows ``phase_flow_ptr[p] : phase_flow_ptr[p + 1]``, flow ``f``'s link directions
    ``dirs[dir_ptr[f] : dir_ptr[f + 1]]``. Under ``flow`` the kernel schedules them; under the other
    models they only say which bytes cross which direction (one phase per task).
    """

    phase_ptr: np.ndarray  # (T + 1,)
    phase_latency: np.ndarray  # (P,)
    phase_flow_ptr: np.ndarray  # (P + 1,)
    num_bytes: np.ndarray  # (Fl,)
    cap: np.ndarray  # (Fl,) bytes/s, inf for none
    dir_ptr: np.ndarray  # (Fl + 1,)
    dirs: np.ndarray
    task: np.ndarray  # (Fl,) the task of each flow


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
    lane: np.ndarray  # (T,) device, or resource of the first link direction a communication task uses
    flows: _Flows
    scheduled_flows: bool  # the kernel schedules ``flows`` (the ``flow`` model)
    # The synchronization block (ids from 2F + 2C): parameter-server tasks and buckets, merged by op.
    ps_pos: np.ndarray  # (S_ps,) position of each parameter-server task (OpArrays order) in the block
    bucket_pos: np.ndarray  # (B,) position of each bucket in the block
    bucket_group: np.ndarray  # (B,) its group id
    bucket_ordinal: np.ndarray  # (B,) its index among its group's buckets
    bucket_member_ptr: np.ndarray  # (B + 1,) each bucket's shards in ``bucket_members``
    bucket_members: np.ndarray  # the owner op of each bucket's shards
    bucket_member_local: np.ndarray  # each of those shards' position among its owner's all-reduced shards
    host_base: int  # the first host task's id (host tasks, in eager execution: [host_base, host_base + 2F))
    chain_prev: np.ndarray  # (2F,) the compute task before each on its device in program order, -1 for the first


@functools.lru_cache(maxsize=4096)
def _timed_copy(op: Op, m: int) -> Op:
    """``op``'s micro-batch copy (for timing; named like the op)."""
    return _pipeline.scaled_op(op, m, op.name)


@dataclass(frozen=True)
class Symmetry:
    """What a context simulating one replica and one tensor-parallel rank of a larger plan knows
    (:mod:`placement_rl.sim.replicas`). Shapes: N ops of the context's graph.

    Attributes:
        peers: device index -> the same position in the other data-parallel replicas, which every
            gradient all-reduce also spans.
        tp_peers: device index -> the other ranks of its tensor-parallel group, which every partial
            sum's all-reduce also spans.
        cost_graph: the whole plan's graph; each task is timed as that op's task (with ``cost_micro``
            micro-batches, op ``i``'s copies ``i m + k`` as its micro-batch copy).
        cost_scale: (N,) how many of the context's tasks one whole-plan op's task splits into: the
            context's op computes ``1 / cost_scale`` of the whole op.
        partial_sum: ops whose outputs are partial sums over the tensor-parallel ranks (row-parallel).
        partial_grad: ops whose input gradients are (column-parallel).
        tp_split: ops split over the tensor-parallel ranks (each rank holds its own shard).
    """

    peers: Mapping[int, tuple[int, ...]]
    tp_peers: Mapping[int, tuple[int, ...]]
    cost_graph: OpGraph
    cost_scale: tuple[float, ...]
    partial_sum: frozenset[int] = frozenset()
    partial_grad: frozenset[int] = frozenset()
    tp_split: frozenset[int] = frozenset()
    cost_micro: int = 1

    def micro_batches(self, m: int) -> Symmetry:
        """The same for the micro-batch graph of ``m`` micro-batches (op ``i``'s copies ``i m + k``)."""
        return Symmetry(
            self.peers,
            self.tp_peers,
            self.cost_graph,
            tuple(c for c in self.cost_scale for _ in range(m)),
            frozenset(i * m + k for i in self.partial_sum for k in range(m)),
            frozenset(i * m + k for i in self.partial_grad for k in range(m)),
            frozenset(i * m + k for i in self.tp_split for k in range(m)),
            self.cost_micro * m,
        )

    def timed_op(self, index: int) -> Op:
        """The whole plan's op (or its micro-batch copy) that task of op ``index`` is timed as."""
        m = self.cost_micro
        op = self.cost_graph.ops[index // m]
        return op if m == 1 else _timed_copy(op, m)


@dataclass
class _Partials:
    """All-reduces of partial sums (:meth:`SimContext._partial_reductions`). K all-reduces."""

    groups: np.ndarray  # (K,) device group ids
    num_bytes: np.ndarray  # (K,) the summed tensor's bytes
    op: np.ndarray  # (K,) the op whose partials (forward) or partial gradients (backward) are summed
    pred: np.ndarray  # task ids that each precede all-reduce pred_of[k]
    pred_of: np.ndarray
    succ: np.ndarray  # task ids that each follow all-reduce succ_of[k]
    succ_of: np.ndarray


@dataclass
class _Buckets:
    """The all-reduce buckets of one plan (:meth:`SimContext._buckets`). B buckets."""

    group: np.ndarray  # (B,) group id
    num_bytes: np.ndarray  # (B,) gradient bytes
    ordinal: np.ndarray  # (B,) index among its group's buckets (backward order)
    op: np.ndarray  # (B,) owner op of its last shard (the lowest op index)
    local: np.ndarray  # (B,) that shard's position among its op's synchronizations
    member_count: np.ndarray  # (B,) shards
    member_owner: np.ndarray  # (sum of member_count,) owner op of each shard, bucket by bucket
    member_local: np.ndarray  # (sum of member_count,) its position among the owner's all-reduced shards


def _take_ragged(ptr: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments ``order`` of a CSR pointer: the new pointer and the element indices, in order."""
    lengths = np.diff(ptr)[order]
    return np.concatenate(([0], np.cumsum(lengths))).astype(np.int64), np.repeat(ptr[:-1][order], lengths) + _ranges(
        lengths
    )


def _chain_ptrs(ptrs: Sequence[np.ndarray]) -> np.ndarray:
    """CSR pointers of consecutive segment lists joined: each list's pointer shifted by the ones before."""
    parts = [ptrs[0]]
    offset = int(ptrs[0][-1])
    for ptr in ptrs[1:]:
        parts.append(ptr[1:] + offset)
        offset += int(ptr[-1])
    return np.concatenate(parts)


def _concat_flows(parts: Sequence[_Flows]) -> _Flows:
    """The tasks of each of ``parts`` in turn (pointers and task ids shifted); each array is copied once."""
    tasks = np.cumsum([0] + [fl.phase_ptr.shape[0] - 1 for fl in parts[:-1]])
    return _Flows(
        _chain_ptrs([fl.phase_ptr for fl in parts]),
        np.concatenate([fl.phase_latency for fl in parts]),
        _chain_ptrs([fl.phase_flow_ptr for fl in parts]),
        np.concatenate([fl.num_bytes for fl in parts]),
        np.concatenate([fl.cap for fl in parts]),
        _chain_ptrs([fl.dir_ptr for fl in parts]),
        np.concatenate([fl.dirs for fl in parts]),
        np.concatenate([fl.task + int(k) for fl, k in zip(parts, tasks, strict=True)]),
    )


def _take_flows(fl: _Flows, order: np.ndarray) -> _Flows:
    """The flows of tasks ``order`` (task ``k`` of the result is task ``order[k]``)."""
    phase_ptr, phases = _take_ragged(fl.phase_ptr, order)
    flow_ptr, flows = _take_ragged(fl.phase_flow_ptr, phases)
    dir_ptr, dirs = _take_ragged(fl.dir_ptr, flows)
    return _Flows(
        phase_ptr,
        fl.phase_latency[phases],
        flow_ptr,
        fl.num_bytes[flows],
        fl.cap[flows],
        dir_ptr,
        fl.dirs[dirs],
        np.repeat(np.arange(len(order)), _per_task(phase_ptr, flow_ptr)),
    )


def _per_task(phase_ptr: np.ndarray, flow_ptr: np.ndarray) -> np.ndarray:
    """Flows per task, from the task -> phase and phase -> flow pointers."""
    M = phase_ptr.shape[0] - 1
    phases_per_task = np.diff(phase_ptr)
    return np.bincount(np.repeat(np.arange(M), phases_per_task), weights=np.diff(flow_ptr), minlength=M).astype(
        np.int64
    )


@dataclass
class _Comm:
    """Communication tasks under the network model. M tasks; ``flows.task`` are local ids ``[0, M)``."""

    duration: np.ndarray  # (M,) fixed-time models; 0 under ``flow``
    res_ptr: np.ndarray  # (M + 1,)
    res: np.ndarray  # resources held (fixed-time models)
    num_bytes: np.ndarray  # (M,) the task's bytes (``TaskTable.num_bytes``)
    lane: np.ndarray  # (M,) the resource of its first link direction
    flows: _Flows

    @staticmethod
    def concat(*parts: _Comm) -> _Comm:
        """The tasks of each of ``parts`` in turn (one copy of each array, however many parts)."""
        return _Comm(
            np.concatenate([c.duration for c in parts]),
            _chain_ptrs([c.res_ptr for c in parts]),
            np.concatenate([c.res for c in parts]),
            np.concatenate([c.num_bytes for c in parts]),
            np.concatenate([c.lane for c in parts]),
            _concat_flows([c.flows for c in parts]),
        )

    def split(self, k: int) -> tuple[_Comm, _Comm]:
        """Tasks ``[0, k)`` and ``[k, M)`` (the second's pointers and flow tasks rebased): slices, no gathers."""
        fl = self.flows
        p = int(fl.phase_ptr[k])
        f = int(fl.phase_flow_ptr[p])
        d = int(fl.dir_ptr[f])
        r = int(self.res_ptr[k])
        head = _Comm(
            self.duration[:k],
            self.res_ptr[: k + 1],
            self.res[:r],
            self.num_bytes[:k],
            self.lane[:k],
            _Flows(
                fl.phase_ptr[: k + 1],
                fl.phase_latency[:p],
                fl.phase_flow_ptr[: p + 1],
                fl.num_bytes[:f],
                fl.cap[:f],
                fl.dir_ptr[: f + 1],
                fl.dirs[:d],
                fl.task[:f],
            ),
        )
        tail = _Comm(
            self.duration[k:],
            self.res_ptr[k:] - r,
            self.res[r:],
            self.num_bytes[k:],
            self.lane[k:],
            _Flows(
                fl.phase_ptr[k:] - p,
                fl.phase_latency[p:],
                fl.phase_flow_ptr[p:] - f,
                fl.num_bytes[f:],
                fl.cap[f:],
                fl.dir_ptr[f:] - d,
                fl.dirs[d:],
                fl.task[f:] - k,
            ),
        )
        return head, tail

    def take(self, order: np.ndarray) -> _Comm:
        """Tasks ``order`` of this one, in that order."""
        res_ptr, res = _take_ragged(self.res_ptr, order)
        return _Comm(
            self.duration[order],
            res_ptr,
            self.res[res],
            self.num_bytes[order],
            self.lane[order],
            _take_flows(self.flows, order),
        )


@dataclass
class _Ring:
    """One ring per group under a fixed-time model: bandwidth, latency, bottleneck kind, resources held."""

    bandwidth: np.ndarray  # (G,)
    latency: np.ndarray  # (G,)
    kind: list[str]
    res_ptr: np.ndarray  # (G + 1,)
    res: np.ndarray


class _GroupTables:
    """Per-group all-reduce tables of a :class:`SimContext` (groups by id), for vectorized assembly."""

    def __init__(self, ctx: SimContext, groups: list[tuple[int, ...]]) -> None:
        self.count = len(groups)
        self._ctx = ctx
        self._groups = groups
        self.size = np.array([len(g) for g in groups], dtype=np.int64)
        net, D = ctx.network, ctx.num_devices
        # the ring in the group's order, hop by hop (its bytes per direction under every model)
        hops = [[(g[k], g[(k + 1) % len(g)]) for k in range(len(g))] for g in groups]
        every = np.array([a * D + b for hs in hops for a, b in hs], dtype=np.int64)
        crosses = net.lengths(every) > 0 if every.size else np.zeros(0, np.bool_)
        owner = np.repeat(np.arange(len(hops)), [len(hs) for hs in hops])
        self._hop_ptr = np.concatenate(([0], np.cumsum(np.bincount(owner[crosses], minlength=len(hops))))).astype(
            np.int64
        )
        self._hop_pair = every[crosses]
        self._fixed: dict[str, _Ring] = {}
        self._candidates: tuple[np.ndarray, ...] | None = None
        # the last few flow_all_reduce results by their arguments: a search's proposals mostly keep the
        # current plan's buckets, so the same buckets come back proposal after proposal
        self._recent: dict[tuple[bytes, bytes], _Comm] = {}

    def ring_flows(self, groups: np.ndarray, num_bytes: np.ndarray) -> _Flows:
        """One phase per bucket: each hop of its group's ring carries ``2 (n - 1) / n`` of the message."""
        net = self._ctx.network
        B = groups.shape[0]
        hop_ptr, hops = _take_ragged(self._hop_ptr, groups)
        per = np.diff(hop_ptr)
        pairs = self._hop_pair[hops]
        dirs, lengths = net.gather(pairs)
        n = self.size[groups]
        fraction = 2.0 * (n - 1) / n
        phase_ptr = np.concatenate(([0], np.cumsum(per > 0))).astype(np.int64)
        return _Flows(
            phase_ptr,
            np.zeros(int(phase_ptr[-1])),
            np.concatenate(([0], np.cumsum(per[per > 0]))).astype(np.int64),
            np.repeat(fraction * num_bytes, per),
            np.full(pairs.shape[0], np.inf),
            np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
            dirs,
            np.repeat(np.arange(B), per),
        )

    def fixed(self, holds: str) -> _Ring:
        """The ring of every group under ``circuit`` (``"route"``) or ``pairwise`` (``"pair"``)."""
        found = self._fixed.get(holds)
        if found is not None:
            return found
        ctx = self._ctx
        net, D = ctx.network, ctx.num_devices
        bw, lat, kinds, res = [], [], [], []
        for k, group in enumerate(self._groups):
            if holds == "route":
                ring = net.rings((group,))
                bw.append(ring.bandwidth_bytes_per_s)
                lat.append(ring.latency_s)
                kinds.append(ring.kind)
                res.append(ring.dirs + D)
                continue
            pairs = self._hop_pair[self._hop_ptr[k] : self._hop_ptr[k + 1]]
            slowest = int(pairs[np.argmin(net.bandwidths(pairs))]) if pairs.size else -1
            bw.append(float(net.bandwidths([slowest])[0]) if pairs.size else np.inf)
            lat.append(float(net.latencies(pairs).max()) if pairs.size else 0.0)
            kinds.append(net.kind(slowest) if pairs.size else "")
            res.append(ctx._pair_res_base + pairs)
        found = self._fixed[holds] = _Ring(
            np.array(bw, dtype=np.float64),
            np.array(lat, dtype=np.float64),
            kinds,
            np.concatenate(([0], np.cumsum([len(r) for r in res]))).astype(np.int64),
            np.concatenate(res).astype(np.int64) if res else np.zeros(0, np.int64),
        )
        return found

    def _candidate_tables(self) -> tuple[np.ndarray, ...]:
        """Every group's all-reduce algorithms (:meth:`Network.all_reduce_algorithms`) as flat tables."""
        if self._candidates is None:
            net = self._ctx.network
            algos = [net.all_reduce_algorithms(g) for g in self._groups]
            flat = [c for a in algos for c in a]
            phases = np.cumsum([0] + [c.phase_latency_s.shape[0] for c in flat])
            flows = np.cumsum([0] + [c.flow_fraction.shape[0] for c in flat])
            dirs = np.cumsum([0] + [c.flow_dirs.shape[0] for c in flat])

            def cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
                return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)

            self._candidates = (
                np.concatenate(([0], np.cumsum([len(a) for a in algos]))).astype(np.int64),
                np.array([c.latency_s for c in flat], dtype=np.float64),
                np.array([c.seconds_per_byte for c in flat], dtype=np.float64),
                phases.astype(np.int64),
                cat([c.phase_latency_s for c in flat], np.float64),
                np.concatenate([[0]] + [c.phase_ptr[1:] + flows[k] for k, c in enumerate(flat)]).astype(np.int64),
                cat([c.flow_fraction for c in flat], np.float64),
                np.concatenate([[0]] + [c.flow_ptr[1:] + dirs[k] for k, c in enumerate(flat)]).astype(np.int64),
                cat([c.flow_dirs for c in flat], np.int64),
            )
        return self._candidates

    def flow_all_reduce(self, groups: np.ndarray, num_bytes: np.ndarray, moved: np.ndarray) -> _Comm:
        """Buckets under ``flow``: each the phases of flows of the algorithm fastest alone for its size.

        The result is a function of the arguments (``moved`` follows from the other two); the last few
        are kept and returned again, so their arrays are shared and must not be written.
        """
        key = (groups.astype(np.int64).tobytes(), num_bytes.astype(np.float64).tobytes())
        found = self._recent.get(key)
        if found is None:
            found = self._flow_all_reduce(groups, num_bytes, moved)
            if len(self._recent) >= _RECENT_ALL_REDUCES:
                del self._recent[next(iter(self._recent))]
            self._recent[key] = found
        return found

    def _flow_all_reduce(self, groups: np.ndarray, num_bytes: np.ndarray, moved: np.ndarray) -> _Comm:
        B = groups.shape[0]
        cand_ptr, cand_lat, cand_spb, cand_phase_ptr, phase_lat, phase_flow_ptr, fraction, dir_ptr, dirs = (
            self._candidate_tables()
        )
        counts = np.diff(cand_ptr)[groups]
        cands = np.repeat(cand_ptr[groups], counts) + _ranges(counts)
        time = cand_lat[cands] + np.repeat(num_bytes, counts) * cand_spb[cands]
        owner = np.repeat(np.arange(B), counts)
        # the first fastest candidate of each bucket: sort by (bucket, time), stable
        best = np.lexsort((time, owner))[np.concatenate(([0], np.cumsum(counts)[:-1]))] if B else np.zeros(0, np.int64)
        chosen = cands[best]
        phase_ptr, phases = _take_ragged(cand_phase_ptr, chosen)
        flow_ptr, flows = _take_ragged(phase_flow_ptr, phases)
        new_dir_ptr, dir_idx = _take_ragged(dir_ptr, flows)
        per_task = _per_task(phase_ptr, flow_ptr)
        flow_bytes = fraction[flows] * np.repeat(num_bytes, per_task)
        cap = np.full(flows.shape[0], np.inf)
        if self._ctx.cost.comm_table is not None and B:  # a measured all-reduce curve caps every flow of it
            kinds = self.fixed("route").kind
            measured = np.array(
                [
                    self._ctx.cost.effective_bandwidth(f"all_reduce/{kinds[g]}", np.inf, b)
                    for g, b in zip(groups.tolist(), num_bytes.tolist(), strict=True)
                ]
            )
            cap = np.repeat(measured, per_task)
        fl = _Flows(
            phase_ptr,
            phase_lat[phases],
            flow_ptr,
            flow_bytes,
            cap,
            new_dir_ptr,
            dirs[dir_idx],
            np.repeat(np.arange(B), per_task),
        )
        lane = self._ctx.num_devices + fl.dirs[fl.dir_ptr[flow_ptr[phase_ptr[:-1]]]] if B else np.zeros(0, np.int64)
        # a group's buckets run one at a time, in the order they become ready (NCCL's stream per communicator)
        communicator = self._ctx.num_resources + groups
        return _Comm(np.zeros(B), np.arange(B + 1, dtype=np.int64), communicator, moved, lane, fl)


def _splice(arr: np.ndarray, ptr: np.ndarray, i: int, piece: np.ndarray) -> np.ndarray:
    """``arr`` with the slice ``ptr[i]:ptr[i+1]`` replaced by ``piece``."""
    return np.concatenate((arr[: ptr[i]], piece, arr[ptr[i + 1] :]))


def _reptr(ptr: np.ndarray, i: int, length: int) -> np.ndarray:
    """Segment pointers after segment ``i`` takes ``length`` entries."""
    out = ptr.copy()
    out[i + 1 :] += length - (ptr[i + 1] - ptr[i])
    return out


_OP_FIELDS = {  # per-op arrays concatenated in op order, grouped by the pointer that splits them
    "task": (
        "devices",
        "forward_s",
        "backward_s",
        "activation_bytes",
        "host_forward_s",
        "host_backward_s",
        "recompute",
        "sum_group",
        "grad_group",
        "in_fraction",
        "out_fraction",
        "duplicated",
    ),
    "static": ("static_devices", "static_bytes"),
    "sync": ("sync_kind", "sync_pair", "sync_bytes", "sync_after_backward", "sync_seconds"),
    "pull": ("sync_dep_u", "sync_dep_v"),
    "allreduce": ("ar_group", "ar_bytes", "ar_shard", "ar_alone"),
}


_ALL_OP_FIELDS: tuple[str, ...] = tuple(f for fields in _OP_FIELDS.values() for f in fields)
_get_op_fields = operator.attrgetter(*_ALL_OP_FIELDS)


@dataclass
class OpArrays:
    """The compiled configurations of all ops, concatenated in op order (``ptr[group]`` splits them).

    Delta simulation replaces one op's slices (:meth:`replace`) instead of re-concatenating all ops.
    """

    ptr: dict[str, np.ndarray]
    data: dict[str, np.ndarray]

    @classmethod
    def from_ops(cls, ops: Sequence[_CompiledOp]) -> OpArrays:
        rows = list(map(_get_op_fields, ops))  # one tuple of field arrays per op (C speed, no getattr loop)
        columns = dict(zip(_ALL_OP_FIELDS, zip(*rows, strict=True), strict=True)) if rows else {}
        if not rows:
            return cls({g: np.zeros(1, np.int64) for g in _OP_FIELDS}, {f: np.zeros(0) for f in _ALL_OP_FIELDS})
        ptr: dict[str, np.ndarray] = {}
        for group, fields in _OP_FIELDS.items():
            lengths = np.fromiter((a.shape[0] for a in columns[fields[0]]), np.int64, len(ops))
            ptr[group] = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        return cls(ptr, {f: np.concatenate(column) for f, column in columns.items()})

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

    def __init__(
        self,
        graph: OpGraph,
        topology: DeviceTopology,
        cost_model: CostModel | None = None,
        symmetry: Symmetry | None = None,
    ) -> None:
        self.graph = graph
        # one replica and one tensor-parallel rank of a larger plan (:mod:`placement_rl.sim.replicas`)
        self.symmetry = symmetry
        self.peers: dict[int, tuple[int, ...]] = dict(symmetry.peers) if symmetry else {}
        self.replica_count = 1 + (len(next(iter(self.peers.values()))) if self.peers else 0)
        self.topology = topology
        self.cost = cost_model or DEFAULT_COST_MODEL
        devices = topology.devices
        self.num_devices = D = len(devices)
        self._device_index = {d.name: i for i, d in enumerate(devices)}
        # (D,) the first device of the same kind (type, peaks, memory): a task's times depend on that alone
        kinds: dict[tuple[object, ...], int] = {}
        self._device_kind = [
            kinds.setdefault(
                (d.device_type, d.peak_flops, d.memory_bytes, d.memory_bandwidth_bytes_per_s, d.peak_flops_by_dtype), i
            )
            for i, d in enumerate(devices)
        ]
        self.num_links = len(topology.links)
        self.num_resources = D + 2 * self.num_links
        self._lanes = tuple(d.name for d in devices) + tuple(
            name for link in topology.links for name in (f"link {link.a} -> {link.b}", f"link {link.b} -> {link.a}")
        )
        self._capacity = np.array([d.memory_bytes for d in devices], dtype=np.float64)
        self.model = _network.network_model(self.cost.network)
        if self.model.holds == "pair" and D > _network.PAIR_MODEL_MAX_DEVICES:
            raise ValueError(
                f"network model {self.model.name!r} keeps a connection per device pair: topology "
                f"{topology.name!r} has {D:,} devices ({D * D:,} pairs); it supports up to "
                f"{_network.PAIR_MODEL_MAX_DEVICES:,} devices (use 'flow' or 'circuit', whose cost follows the "
                f"devices a plan uses)"
            )
        self.network = _network.network(topology)
        # the simulator's resources are devices, then link directions (direction d is resource D + d),
        # then under ``pairwise`` one dedicated connection per ordered device pair (pair p: D + 2L + p)
        self._pair_res_base = self.num_resources
        if self.model.holds == "pair":
            self.num_resources += D * D
        # Each device runs its compute tasks in program order (one CUDA stream), except under the flat
        # roofline (no calibration), which keeps the papers' list scheduling (FIFO in ready order).
        self.stream_order = self.cost.calibration is not None or self.cost.host_lane
        # then, in ``eager`` execution, one host lane per device (device d's host is resource _host_res_base + d)
        self.host_lane = self.cost.host_lane
        self._host_res_base = self.num_resources
        if self.host_lane:
            self.num_resources += D
            self._lanes += tuple(f"{d.name} host" for d in devices)
        self._groups: dict[tuple[int, ...], int] = {}
        self._group_tables: _GroupTables | None = None
        # per group id: devices and the most flows per device of its all-reduce algorithms (size estimates)
        self._group_size: list[int] = []
        self._group_rings: list[int] = []
        self._group_shape_arrays = (np.zeros(0, np.int64), np.zeros(0, np.int64))
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
        # a context of the micro-batch graph (:mod:`placement_rl.sim.pipeline`) knows its count and
        # its parent's graph, whose plans' schedules order its tasks
        self.micro_batches = int(graph.metadata.get("micro_batches", 1)) if "micro_batches_of" in graph.metadata else 1
        self.schedule_plan: tuple[OpGraph, Plan] | None = None
        # a micro-batch context: its parent's ops (op i m + k is op i's copy), which profiles time them as
        self.parent_ops: Sequence[Op] | None = None
        self._micro: dict[int, SimContext] = {}
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
        self.e_map = np.full((len(g.tensors), MAX_RANK), -1, np.int64)
        for e, t in enumerate(g.tensors):
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
            # the tensor axis each axis of the consumer's output follows (-2 first: unrelated layouts)
            if box and t.dst_axes:
                self.e_map[e, : len(t.dst_axes)] = t.dst_axes
            elif same[-1]:
                self.e_map[e, :rank] = np.arange(rank)
            else:
                self.e_map[e, 0] = -2
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

    def _batch_op(self, index: int) -> tuple[Op | None, int]:
        """For op ``index`` of a micro-batch graph, the whole-batch op its tasks are profiled as (the whole
        plan's under a symmetry) and the micro-batch count; ``(None, 1)`` elsewhere
        (:meth:`~placement_rl.sim.cost.CostModel.profile_entry`)."""
        if self.symmetry is not None:
            m = self.symmetry.cost_micro
            return (self.symmetry.cost_graph.ops[index // m], m) if m > 1 else (None, 1)
        if self.parent_ops is not None and self.micro_batches > 1:
            return self.parent_ops[index // self.micro_batches], self.micro_batches
        return None, 1

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
        shares = sample_shares(op, cfg)  # an uneven sample split: each slice's share of the batch
        share_of = np.full(P, 1.0)  # (P,) each partition's sample share times its sample degree
        sample_index = np.zeros(P, np.int64)
        for k, (dim, deg) in enumerate(split):
            lo, hi = idx[:, k] / deg, (idx[:, k] + 1) / deg
            if dim.kind == "sample":
                sample_index = idx[:, k]
                if shares is not None:
                    bounds = np.concatenate(([0.0], np.cumsum(shares)))
                    bounds[-1] = 1.0
                    lo, hi = bounds[idx[:, k]], bounds[idx[:, k] + 1]
                    share_of = (hi - lo) * deg
                samp_lo, samp_hi = lo, hi
            if not dim.reduction:
                prod_lo[:, dim.axis], prod_hi[:, dim.axis] = lo, hi
                out_shape[dim.axis] //= deg
                if dim.kind != "parameter":
                    need_lo[:, dim.axis], need_hi[:, dim.axis] = lo, hi
            elif dim.kind == "parameter":  # input features (row-parallel): its slice of the input
                need_lo[:, dim.axis], need_hi[:, dim.axis] = lo, hi
            if dim.kind == "parameter":
                shard = shard * deg + idx[:, k]
                shards *= deg
        task_param_bytes = op.param_bytes // shards
        key = self._op_key[index]
        owner = key is not None and self._owner[key] == index
        times: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        T = len(devices)
        R0 = max(T // P, 1)
        # ZeRO: each holder of a shard updates its 1 / holders of it (the other replicas' too)
        holders = zero_holders(op, cfg)
        if self.peers:
            holders = max(holders, 1) * self.replica_count
        symmetry = self.symmetry
        if symmetry is not None and symmetry.tp_peers and cfg.sync != "duplicate" and index not in symmetry.tp_split:
            holders *= 1 + len(next(iter(symmetry.tp_peers.values())))  # replicated over the ranks too
        update_fraction = 1.0 / shards / (holders if cfg.zero else 1)
        sample_dim = op.sample_dim
        batch_op, micro = self._batch_op(index)
        fwd, bwd, host_fwd, host_bwd = np.empty(T), np.empty(T), np.empty(T), np.empty(T)
        device_kind = self._device_kind
        for t, dev in enumerate(devices.tolist()):
            part = t // R0
            slice_key = (device_kind[dev], int(sample_index[part]) if shares is not None else 0)
            if slice_key not in times:
                d = self.topology.devices[dev]
                shape = tuple(out_shape)
                if shares is not None and sample_dim is not None and not sample_dim.reduction:
                    shape = tuple(
                        max(1, round(share_of[part] * n)) if a == sample_dim.axis else n for a, n in enumerate(shape)
                    )
                timed = self.symmetry.timed_op(index) if self.symmetry else op
                # a symmetric rank's task is the whole plan's task: its share of the whole op
                scale = self.symmetry.cost_scale[index] if self.symmetry else 1.0
                fraction = float(share_of[part]) / P / scale
                f, b = self.cost.device_task_times_s(
                    timed, fraction, shape, task_param_bytes, d, batch_op=batch_op, micro_batches=micro
                )
                hf, hb = self.cost.host_times_s(
                    timed,
                    shape,
                    task_param_bytes,
                    d.device_type,
                    fraction=fraction,
                    batch_op=batch_op,
                    micro_batches=micro,
                )
                if cfg.recompute:  # the forward runs again before backward
                    b, hb = b + f, hb + hf
                if owner:  # the optimizer step of the parameter shard this task holds
                    update_gpu, update_host = self.cost.update_times_s(
                        op, update_fraction, d.memory_bandwidth_bytes_per_s
                    )
                    b, hb = b + update_gpu, hb + update_host
                times[slice_key] = (f, b, hf, hb)
            fwd[t], bwd[t], host_fwd[t], host_bwd[t] = times[slice_key]
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
            self.cost.activation_bytes(op.bytes_written, op.dtype_bytes) / P * share_of[np.arange(T) // R0],
            host_fwd,
            host_bwd,
            np.full(T, cfg.recompute, np.bool_),
        )
        compiled.task_shard = shard[np.arange(len(devices)) // R]
        partial = _partial_groups(split, idx, R, samp_hi - samp_lo)
        compiled.sum_group, compiled.grad_group, compiled.in_fraction, compiled.out_fraction = partial
        if self.symmetry is not None:  # a rank of a tensor-parallel layer whose other ranks are symmetric
            if index in self.symmetry.partial_sum:
                compiled.sum_group = np.zeros(len(devices), np.int64)
            if index in self.symmetry.partial_grad:
                compiled.grad_group = np.zeros(len(devices), np.int64)
        compiled.duplicated = np.full(len(devices), cfg.sync == "duplicate", np.bool_)
        compiled.shards = shards
        compiled.sync_mode = cfg.sync
        compiled.zero = cfg.zero
        compiled.ps_device = self._device_index[cfg.ps_device] if cfg.ps_device else int(devices[0])
        if cfg.sync == "sfb" and key is not None and self._owner[key] == index and op.param_bytes > 0:
            self._set_sync(compiled, self._sfb_template(op, cfg, compiled))
        elif key is not None and self._owner[key] == index and op.param_bytes > 0:
            groups, mode = _holder_groups(
                devices, compiled.task_shard, shards, R, cfg.sync, max(P // shards, 2 if self.peers else 1)
            )
            groups = self.with_replicas(
                groups, spans_ranks=mode != "duplicate" and cfg.sync != "duplicate", index=index
            )
            self._set_sync(
                compiled,
                self._sync_template(groups, self.cost.gradient_bytes(op) / shards, mode, compiled.ps_device, cfg.zero),
            )
        return compiled

    def _sfb_template(self, op: Op, cfg: OpConfig, compiled: _CompiledOp) -> dict[str, np.ndarray]:
        """Static memory and SFB tasks (local ids) of an op with sync ``sfb`` (:mod:`placement_rl.sim.sfb`).

        Each of the ``n`` replicas (one per device, ``1 / n`` of the batch each) sends its share of the
        cut (the sufficient factors) to every other replica once its backward is done: ``n (n - 1)``
        ``sfb_broadcast`` tasks. Each replica then rebuilds the whole gradient: one ``sfb_gradient``
        task on its device, after the broadcasts it receives, computing the other ``n - 1`` shares of
        the weight gradient and of the duplicated nodes (its own share was computed in backward).
        """
        devices = compiled.devices.tolist()
        template = self._sync_template([tuple(devices)], self.cost.gradient_bytes(op), "duplicate", -1)
        n, D = len(devices), self.num_devices
        if n < 2:
            return template
        factor_bytes = float(sum(self.e_bytes[e] for _, e in _sfb.sfb_cut(self.graph, op.name, cfg.sfb_duplicate)))
        factor_bytes /= compiled.partitions
        nodes = [_sfb.node_name(_sfb.WEIGHT_GRADIENT, op.name), *cfg.sfb_duplicate]
        kind: list[int] = []
        pairs: list[int] = []
        seconds: list[float] = []
        dep_u: list[int] = []
        dep_v: list[int] = []
        into: dict[int, list[int]] = {r: [] for r in range(n)}
        for s, src in enumerate(devices):
            for r, dst in enumerate(devices):
                if r != s:
                    into[r].append(len(kind))
                    kind.append(_SFB_BROADCAST)
                    pairs.append(src * D + dst)
                    seconds.append(0.0)
        for r, dev in enumerate(devices):
            device = self.topology.devices[dev]
            own = sum(_sfb.node_seconds(self.cost, self.graph, node, n, device) for node in nodes)
            dep_u.extend(into[r])
            dep_v.extend([len(kind)] * len(into[r]))
            kind.append(_SFB_GRADIENT)
            pairs.append(dev * D + dev)
            seconds.append((n - 1) * own)
        broadcast = np.array(kind) == _SFB_BROADCAST
        template.update(
            sync_kind=np.array(kind, dtype=np.int64),
            sync_pair=np.array(pairs, dtype=np.int64),
            sync_bytes=np.where(broadcast, factor_bytes, 0.0),
            sync_after_backward=np.ones(len(kind), np.bool_),
            sync_seconds=np.array(seconds, dtype=np.float64),
            sync_dep_u=np.array(dep_u, dtype=np.int64),
            sync_dep_v=np.array(dep_v, dtype=np.int64),
        )
        return template

    def _sync_template(
        self, groups: Sequence[tuple[int, ...]], shard_bytes: float, mode: str, ps: int, zero: int = 0
    ) -> dict[str, np.ndarray]:
        """Static memory and synchronization tasks (local ids) for parameter shards held by ``groups``.

        ``shard_bytes`` is one shard's gradient bytes; its whole state is ``state_bytes_per_gradient_byte`` times that.
        ``sfb`` here (parameters shared by several ops, which validation refuses) falls back to ``all_reduce``.
        Under ZeRO stage ``zero`` each holder of a group keeps its ``1 / n`` of the sharded state
        (:meth:`~placement_rl.sim.cost.CostModel.zero_state_bytes_per_gradient_byte`); stage 3 also
        all-gathers the parameters before every forward and backward of each micro-batch, which moves
        as many bytes as all-reducing them once per micro-batch: those bytes join the group's
        gradient all-reduce.
        """
        D = self.num_devices
        static_dev: list[int] = []
        kind: list[int] = []
        pairs: list[int] = []
        after_backward: list[bool] = []
        dep_u: list[int] = []
        dep_v: list[int] = []
        ar_group: list[int] = []
        static_bytes: list[float] = []
        gathered = self.micro_batches * self.cost.weight_per_gradient_byte if zero >= 3 else 0.0
        for group in groups:
            static_dev.extend(group)
            per_byte = self.cost.zero_state_bytes_per_gradient_byte(zero if len(group) > 1 else 0, len(group))
            static_bytes.extend([shard_bytes * per_byte] * len(group))
            if len(group) < 2 or mode == "duplicate":
                continue
            if mode in ("all_reduce", "all_reduce_per_tensor", "sfb"):  # bucketed when the task graph is assembled
                ar_group.append(self.group_id(group))
                continue
            workers = [d for d in group if d != ps]
            pushes: list[int] = []
            for direction in (_PS_PUSH, _PS_PULL):  # push gradients; pull parameters once all pushes are in
                for w in workers:
                    if direction == _PS_PULL:
                        dep_u.extend(pushes)
                        dep_v.extend([len(kind)] * len(pushes))
                    else:
                        pushes.append(len(kind))
                    kind.append(direction)
                    pairs.append(w * D + ps if direction == _PS_PUSH else ps * D + w)
                    after_backward.append(direction == _PS_PUSH)
        return {
            "static_devices": np.array(static_dev, dtype=np.int64),
            "static_bytes": np.array(static_bytes, dtype=np.float64),
            "sync_kind": np.array(kind, dtype=np.int64),
            "sync_pair": np.array(pairs, dtype=np.int64),
            "sync_bytes": np.full(len(kind), shard_bytes),
            "sync_after_backward": np.array(after_backward, dtype=np.bool_),
            "sync_seconds": np.zeros(len(kind)),
            "sync_dep_u": np.array(dep_u, dtype=np.int64),
            "sync_dep_v": np.array(dep_v, dtype=np.int64),
            "ar_group": np.array(ar_group, dtype=np.int64),
            "ar_bytes": np.full(len(ar_group), shard_bytes * (1.0 + gathered)),
            "ar_shard": np.arange(len(ar_group), dtype=np.int64),
            "ar_alone": np.full(len(ar_group), mode == "all_reduce_per_tensor"),
        }

    def _with_ranks(self, devs: list[int]) -> list[int]:
        """A tensor-parallel group of simulated devices with their symmetric ranks, rank by rank."""
        if self.symmetry is None or not self.symmetry.tp_peers:
            return devs
        ranks = self.symmetry.tp_peers
        n = 1 + len(next(iter(ranks.values())))
        return [d if k == 0 else ranks[d][k - 1] for d in devs for k in range(n)]

    def with_replicas(
        self, groups: list[tuple[int, ...]], *, spans_ranks: bool = False, index: int = -1
    ) -> list[tuple[int, ...]]:
        """Synchronization groups of simulated devices, as the whole plan has them: each spanning the
        same devices of every data-parallel replica (:meth:`with_peers`); for an op replicated on the
        tensor-parallel ranks and all-reduced (``spans_ranks``), spanning the ranks too, else (a rank's
        own shard, or ``duplicate`` replicas) repeated for every other rank, whose synchronization
        shares the network with the simulated rank's."""
        ranks = self.symmetry.tp_peers if self.symmetry is not None else {}
        if ranks:
            n = 1 + len(next(iter(ranks.values())))
            split = self.symmetry is not None and index in self.symmetry.tp_split
            if spans_ranks and not split:
                groups = [tuple(d if k == 0 else ranks[d][k - 1] for d in g for k in range(n)) for g in groups]
            else:
                groups = [tuple(d if k == 0 else ranks[d][k - 1] for d in g) for k in range(n) for g in groups]
        return [self.with_peers(g) for g in groups]

    def with_peers(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """``group`` with the same devices of every other replica, replica by replica (ring order as
        the whole plan would have it); ``group`` itself without replicas."""
        if not self.peers:
            return group
        return tuple(d if k == 0 else self.peers[d][k - 1] for k in range(self.replica_count) for d in group)

    def group_id(self, group: tuple[int, ...]) -> int:
        """The id of a device group (topology indices in ring order), one communicator of all-reduces."""
        found = self._groups.get(group)
        if found is None:
            found = self._groups[group] = len(self._groups)
        return found

    def group_tables(self) -> _GroupTables:
        """Per-group tables for the all-reduces of every group seen so far (rebuilt when one is added)."""
        tables = self._group_tables
        if tables is None or tables.count != len(self._groups):
            tables = self._group_tables = _GroupTables(self, list(self._groups))
        return tables

    # ------------------------------------------------------------ size bound
    def _group_shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(G,)`` devices of each group and ``(G,)`` the most flows per device any of its all-reduce
        algorithms has (:meth:`~placement_rl.sim.network.Network.all_reduce_algorithms`: a ring 1, ``k``
        rings ``k`` up to the fewest devices of a machine, hierarchical at most 3), extended as groups come."""
        if len(self._group_size) < len(self._groups):
            machine = self.network.device_machine
            for group in list(self._groups)[len(self._group_size) :]:
                per = np.bincount(machine[list(group)]) if group else np.zeros(0, np.int64)
                per = per[per > 0]
                rings = 1 if per.shape[0] < 2 else max(int(per.min()), 3 if int(per.max()) >= 2 else 1)
                self._group_size.append(len(group))
                self._group_rings.append(rings)
            self._group_shape_arrays = (np.array(self._group_size, np.int64), np.array(self._group_rings, np.int64))
        return self._group_shape_arrays

    def _bucket_flows(self, ops: OpArrays) -> tuple[int, int, int]:
        """The buckets of ``ops``, and the flows and the link directions they cross of the all-reduce
        algorithm each takes under ``flow`` (:meth:`_GroupTables.flow_all_reduce`'s choice, counted
        without building the flows)."""
        bk = self._buckets(ops)
        B = bk.group.shape[0]
        if B == 0:
            return 0, 0, 0
        cand_ptr, cand_lat, cand_spb, cand_phase_ptr, _, phase_flow_ptr, _, dir_ptr, _ = (
            self.group_tables()._candidate_tables()
        )
        counts = np.diff(cand_ptr)[bk.group]
        cands = np.repeat(cand_ptr[bk.group], counts) + _ranges(counts)
        time = cand_lat[cands] + np.repeat(bk.num_bytes, counts) * cand_spb[cands]
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        chosen = cands[np.lexsort((time, np.repeat(np.arange(B), counts)))[first]]  # each bucket's first fastest
        flow_start, flow_end = phase_flow_ptr[cand_phase_ptr[:-1]], phase_flow_ptr[cand_phase_ptr[1:]]
        directions = dir_ptr[flow_end] - dir_ptr[flow_start]
        return B, int((flow_end - flow_start)[chosen].sum()), int(directions[chosen].sum())

    def _degrees(self) -> tuple[np.ndarray, np.ndarray]:
        """``(N,)`` float64 tensors out of and into each op (cached)."""
        found: tuple[np.ndarray, np.ndarray] | None = getattr(self, "_op_degrees", None)
        if found is None:
            N = len(self.graph.ops)
            found = self._op_degrees = (
                np.bincount(self.e_src, minlength=N).astype(np.float64),
                np.bincount(self.e_dst, minlength=N).astype(np.float64),
            )
        return found

    def size_estimate(
        self, ops: OpArrays, num_transfers: int = 0, *, exact_all_reduces: bool = False
    ) -> _limits.SizeEstimate:
        """What assembling and scheduling ``ops`` with ``num_transfers`` transfers (each with its gradient
        transfer) will need, computed from per-op counts before any task array exists
        (:mod:`placement_rl.sim.limits`). Buckets are bounded by their groups' bytes: every bucket but a
        group's last holds at least ``bucket_bytes``, and each has as many flows as its group's largest
        all-reduce algorithm; ``exact_all_reduces`` (the ``flow`` model) makes the buckets and picks each
        one's algorithm instead, as assembly will (building the groups' routes and algorithms, which the
        simulation needs anyway). Tensor-parallel partial sums are bounded by their groups."""
        F = int(ops.ptr["task"][-1])
        C = int(num_transfers)
        S_ps = int(ops.ptr["sync"][-1])
        group = ops.data["ar_group"]
        buckets = flows = 0
        bucket_dirs: int | None = None
        if group.shape[0] and exact_all_reduces and self.model.shares_links:
            buckets, flows, bucket_dirs = self._bucket_flows(ops)
        elif group.shape[0]:
            size, rings = self._group_shapes()
            G = size.shape[0]
            alone = ops.data["ar_alone"].astype(np.bool_)
            per_group = np.bincount(group[alone], minlength=G).astype(np.float64)
            together = group[~alone]
            if self.cost.bucket_bytes > 0:
                counts = np.bincount(together, minlength=G)
                total = np.bincount(together, weights=ops.data["ar_bytes"][~alone], minlength=G)
                per_group += np.minimum(counts, np.where(counts > 0, np.floor(total / self.cost.bucket_bytes) + 1, 0))
            else:
                per_group += np.bincount(together, minlength=G)
            buckets = int(per_group.sum())
            flows = int((per_group * size * (rings if self.model.shares_links else 1)).sum())
        # tensor-parallel partial sums: at most one all-reduce per sum group of a producer and edge out of it
        # (forward), per gradient group of a consumer and edge into it (backward), each over its group's tasks
        partials = partial_flows = 0
        sums, grads = ops.data["sum_group"], ops.data["grad_group"]
        if sums.shape[0] and (int(sums.max()) >= 0 or int(grads.max()) >= 0):
            task_ptr = ops.ptr["task"]
            n_tasks = np.diff(task_ptr)
            full = np.flatnonzero(n_tasks > 0)
            sum_groups, grad_groups = np.zeros(n_tasks.shape[0]), np.zeros(n_tasks.shape[0])
            sum_groups[full] = np.maximum.reduceat(sums, task_ptr[full]) + 1
            grad_groups[full] = np.maximum.reduceat(grads, task_ptr[full]) + 1
            out_degree, in_degree = self._degrees()
            partials = int(sum_groups @ out_degree + grad_groups @ in_degree)
            partial_flows = int(((sum_groups > 0) * n_tasks) @ out_degree + ((grad_groups > 0) * n_tasks) @ in_degree)
            if self.symmetry is not None and self.symmetry.tp_peers:  # each group spans the other ranks too
                partial_flows *= 1 + len(next(iter(self.symmetry.tp_peers.values())))
        tasks = 2 * F + 2 * C + S_ps + buckets + partials + (2 * F if self.host_lane else 0)
        flows += partial_flows
        devices = ops.data["devices"]
        if self.peers:  # a symmetric rank's all-reduces span its peers' devices too
            devices = np.concatenate([devices, np.array([p for ps in self.peers.values() for p in ps], np.int64)])
        others = partial_flows + 2 * C + S_ps  # their routes' directions: about DIRECTIONS_PER_FLOW each
        directions = None if bucket_dirs is None else bucket_dirs + others * _limits.DIRECTIONS_PER_FLOW
        return _limits.SizeEstimate(tasks, flows + 2 * C + S_ps, self.network.unbuilt_route_bytes(devices), directions)

    def check_plan_size(self, plan: Plan) -> None:
        """:meth:`check_size` from the plan alone, before any op is compiled: its compute and host tasks
        (ops x devices x micro-batches), a lower bound of the task graph."""
        m = plan.micro_batches
        F = m * sum(len(plan[op.name].devices) for op in self.graph.ops)
        tasks = 2 * F + (2 * F if self.host_lane else 0)

        def what() -> str:
            used = len({d for op in self.graph.ops for d in plan[op.name].devices})
            micro = f" in {m} micro-batches" if m > 1 else ""
            where = f"{used:,} of {self.topology.name}'s {self.num_devices:,} devices"
            return f"plan {plan.name!r} of {self.graph.name}{micro} on {where}"

        _limits.check_size(_limits.SizeEstimate(tasks, 0), what, at_least=True)

    def check_size(self, ops: OpArrays, num_transfers: int = 0) -> None:
        """Raise :class:`~placement_rl.sim.limits.SimulationTooLarge` (a ``ValueError``) when simulating
        ``ops`` would need more memory than :func:`~placement_rl.sim.limits.memory_bound_bytes` allows."""
        # a quick upper bound first (a search checks every proposal): each shard its own bucket over the
        # largest group, routes from every device not built yet
        F, S_ps, A = (int(ops.ptr[k][-1]) for k in ("task", "sync", "allreduce"))
        C = int(num_transfers)
        size, rings = self._group_shapes()
        widest = int((size * rings).max()) if size.shape[0] else 0
        out_degree, in_degree = self._degrees()
        fan = int(max(out_degree.max(initial=0), in_degree.max(initial=0)))  # partial sums: per task and edge
        upper = _limits.SizeEstimate(
            4 * F + 2 * C + S_ps + A + 2 * F * fan,
            A * widest + 2 * C + S_ps + 2 * F * fan,
            (self.num_devices - self.network.sources_built) * self.num_devices * _network.ROUTE_BYTES_PER_PAIR,
        )
        threshold = _limits.check_above_bytes()
        if upper.num_bytes <= threshold:
            return
        estimate = self.size_estimate(ops, num_transfers)
        if A and self.model.shares_links and estimate.num_bytes > threshold:
            if estimate.num_bytes > _limits.memory_bound_bytes()[0]:  # the buckets' own algorithms, exactly
                estimate = self.size_estimate(ops, num_transfers, exact_all_reduces=True)

        def what() -> str:
            used = int(np.count_nonzero(np.bincount(ops.data["devices"], minlength=self.num_devices)))
            graph = self.graph.metadata.get("micro_batches_of", self.graph.name)
            micro = f" in {self.micro_batches} micro-batches" if self.micro_batches > 1 else ""
            where = f"{used:,} of {self.topology.name}'s {self.num_devices:,} devices"
            if self.symmetry is not None:  # one replica's rank 0 simulated for the whole plan (sim.replicas)
                ranks = 1 + len(next(iter(self.symmetry.tp_peers.values()), ()))
                alike = f"{self.replica_count:,} alike replicas" + (f" of {ranks} alike ranks" if ranks > 1 else "")
                return f"a plan of {graph}{micro} as one of its {alike} ({where})"
            return f"a plan of {graph}{micro} on {where}"

        _limits.check_size(estimate, what)

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
            first.zero,
            tuple((ops[u].devices.tobytes(), ops[u].task_shard.tobytes()) for u in users),
        )
        found = self._shared_cache.get(signature)
        if found is not None:
            return found
        shards = first.shards if same else 1
        # "duplicate" over replicas of sample slices: one group per (shard, replica) (see _holder_groups)
        per_replica = first.sync_mode == "duplicate" and same and (first.partitions > first.shards or bool(self.peers))
        slots = shards * (first.replicas if per_replica else 1)
        members: list[dict[int, None]] = [{} for _ in range(slots)]
        for u in users:
            R = ops[u].replicas
            for t, (d, sh) in enumerate(zip(ops[u].devices.tolist(), ops[u].task_shard.tolist(), strict=True)):
                slot = (sh if same else 0) * (R if per_replica else 1) + (t % R if per_replica else 0)
                members[min(slot, slots - 1)][d] = None
        op = self.graph.ops[owner]
        template = self._sync_template(
            self.with_replicas([tuple(m) for m in members], spans_ranks=first.sync_mode != "duplicate", index=owner),
            self.cost.gradient_bytes(op) / shards,
            "all_reduce" if per_replica else first.sync_mode,
            first.ps_device,
            first.zero,
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
                owner, self.shared_template(owner, ops), ("static", "sync", "pull", "allreduce")
            )
        return arrays

    # ------------------------------------------------------------ simulation
    def simulate(self, plan: Plan, *, validate: bool = True) -> SimResult:
        """Simulate one training iteration of ``plan`` (see the module docstring)."""
        g = self.graph
        if validate:
            plan.validate(g, self.topology)
        self.check_plan_size(plan)
        if plan.micro_batches > 1:
            return self.simulate_micro_batches(plan)
        ops = [self.compile(i, plan[op.name]) for i, op in enumerate(g.ops)]
        return self.run(ops)

    def micro_batch_context(self, micro_batches: int) -> SimContext:
        """The context of this graph's micro-batch graph for ``micro_batches`` (cached, the last four)."""
        found = self._micro.get(micro_batches)
        if found is None:
            symmetry = self.symmetry.micro_batches(micro_batches) if self.symmetry else None
            found = SimContext(
                _pipeline.micro_batch_graph(self.graph, micro_batches), self.topology, self.cost, symmetry
            )
            found.parent_ops = self.graph.ops
            if len(self._micro) >= 4:
                self._micro.pop(next(iter(self._micro)))
            self._micro[micro_batches] = found
        return found

    def simulate_micro_batches(self, plan: Plan) -> SimResult:
        """Simulate a plan with several micro-batches on the micro-batch graph, in its schedule's order
        (:mod:`placement_rl.sim.pipeline`); the result speaks of the original ops."""
        m = plan.micro_batches
        sub = self.micro_batch_context(m)
        # an op's copies for micro-batches 1 .. m - 1 compile alike (copy 0 owns the parameters)
        ops: list[_CompiledOp] = []
        for i, op in enumerate(self.graph.ops):
            cfg = plan[op.name]
            ops.append(sub.compile(i * m, cfg))
            if m > 1:
                ops.extend([sub.compile(i * m + 1, cfg)] * (m - 1))
        sub.schedule_plan = (self.graph, plan)
        try:
            result = sub.run(ops)
        finally:
            sub.schedule_plan = None
        return _fold_micro_batches(result, self.graph, m)

    def run(self, ops: Sequence[_CompiledOp]) -> SimResult:
        """Simulate compiled op configurations (one per op, graph order) into a full :class:`SimResult`."""
        with _kernels.compile_notice():
            arrays = self.with_shared(OpArrays.from_ops(ops), ops)
            self.check_size(arrays)  # before the transfers: the compute, host and synchronization tasks
            tasks = self.assemble(arrays, EdgeArrays.from_flat(*self.transfers(ops)))
            start, end, _, crit, busy, *timeline = self.schedule(tasks, record=True)
            return self._result(arrays, tasks, start, end, crit, busy, timeline)

    def schedule(
        self,
        tasks: _Tasks,
        prefix: np.ndarray | None = None,
        ready: np.ndarray | None = None,
        start: np.ndarray | None = None,
        end: np.ndarray | None = None,
        record: bool = False,
    ) -> tuple[np.ndarray, ...]:
        """Run the scheduler (:func:`~placement_rl.sim.kernels.schedule_flows`) on an assembled task graph.

        ``prefix`` and the known ``ready``/``start``/``end`` resume it (delta simulation).
        ``record`` keeps each link direction's rate over time. Returns ``(start, end, ready,
        critical_pred, direction_busy_s, timeline_time_s, timeline_direction, timeline_rate)``.
        """
        return self.schedule_within(tasks, math.inf, prefix, ready, start, end, record)[:8]

    def schedule_within(
        self,
        tasks: _Tasks,
        limit_s: float,
        prefix: np.ndarray | None = None,
        ready: np.ndarray | None = None,
        start: np.ndarray | None = None,
        end: np.ndarray | None = None,
        record: bool = False,
    ) -> tuple[Any, ...]:
        """:meth:`schedule`, cut off as soon as the makespan is certainly above ``limit_s``.

        Returns :meth:`schedule`'s tuple plus ``cut`` (bool): when True, the makespan exceeds
        ``limit_s`` (by :func:`~placement_rl.sim.kernels.rest_bounds`) and the times are incomplete.
        """
        T = tasks.duration.shape[0]
        if prefix is None:
            prefix = np.zeros(T, np.bool_)
            ready = start = end = np.zeros(T)
        fl = tasks.flows
        if tasks.scheduled_flows:
            pp, pl, pf, fb, fc, fd, fds = (
                fl.phase_ptr,
                fl.phase_latency,
                fl.phase_flow_ptr,
                fl.num_bytes,
                fl.cap,
                fl.dir_ptr,
                fl.dirs,
            )
        else:
            pp, pl, pf, fb, fc, fd, fds, _ = _kernels.no_flows(T)
        rest = shortest = np.zeros(0)
        if limit_s < math.inf:
            rest, shortest = _kernels.rest_bounds(
                tasks.duration, tasks.succ_ptr, tasks.succ, tasks.indegree, pp, pl, pf, fb, fc, fd, fds,
                self.network.capacity,
            )  # fmt: skip
        args = (
            tasks.duration,
            tasks.res_ptr,
            tasks.res,
            tasks.succ_ptr,
            tasks.succ,
            tasks.indegree,
            self.num_resources + (len(self._groups) if tasks.scheduled_flows else 0),
            pp,
            pl,
            pf,
            fb,
            fc,
            fd,
            fds,
            self.network.capacity,
            prefix,
            ready,
            start,
            end,
            record,
            limit_s,
            rest,
            shortest,
        )
        # The kernel keeps a timeline of a fixed capacity and counts its entries: a first guess (two
        # entries per flow and direction it crosses, about what a data-parallel plan records), and a
        # second run with the exact count when the guess was short.
        capacity = TIMELINE_PER_SLOT * int(fds.shape[0]) + 64 if record else 0
        *out, entries = _kernels.schedule_flows(*args, capacity)
        if entries > capacity:
            *out, _ = _kernels.schedule_flows(*args, entries)
        return tuple(out)

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
            self.e_map,
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
            np.concatenate([c.sum_group for c in ops]),
        )

    def edge_transfers(self, e: int, producer: _CompiledOp, consumer: _CompiledOp) -> tuple[np.ndarray, ...]:
        """The transfer segment of edge ``e`` alone (delta simulation)."""
        i = int(self.e_src[e])
        return _kernels.edge_transfers(
            producer.devices,
            producer.replicas,
            producer.prod_lo,
            producer.prod_hi,
            producer.sum_group,
            consumer.devices,
            consumer.replicas,
            consumer.need_lo,
            consumer.need_hi,
            consumer.samp_lo,
            consumer.samp_hi,
            self.e_rank[e],
            self.e_map[e],
            self.e_prod_box[e],
            self.op_sample_axis[i],
            self.e_bytes[e],
        )

    def assemble(self, ops: OpArrays, edges: EdgeArrays) -> _Tasks:
        """The task graph: compute tasks, transfers (from per-edge local segments) and synchronization.

        Task ids: forward ``[0, F)``, backward ``[F, 2F)``, transfers ``[2F, 2F + C)``, gradient
        transfers ``[2F + C, 2F + 2C)``, then the synchronization block: parameter-server pushes and
        pulls and all-reduce buckets, ordered by op (a bucket at its last shard's op).

        Raises:
            SimulationTooLarge: (a ``ValueError``) before allocating a task graph that would need more
                memory than the simulator's bound (:mod:`placement_rl.sim.limits`).
        """
        self.check_size(ops, int(edges.com_ptr[-1]))
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
        fwd_ids = 2 * F + np.arange(C)
        bwd_ids = fwd_ids + C
        first_sync = 2 * F + 2 * C
        # The synchronization block: parameter-server tasks per op, and buckets, merged by (op, position).
        ps_sizes = np.diff(ops.ptr["sync"])
        S_ps = int(ops.ptr["sync"][-1])
        ps_owner = np.repeat(np.arange(N), ps_sizes)
        ps_local = np.arange(S_ps) - np.repeat(ops.ptr["sync"][:-1], ps_sizes)
        bk = self._buckets(ops)
        B = bk.group.shape[0]
        S = S_ps + B
        order = np.lexsort((np.concatenate([ps_local, bk.local]), np.concatenate([ps_owner, bk.op])))
        block_pos = np.empty(S, np.int64)
        block_pos[order] = np.arange(S)
        ps_pos, bucket_pos = block_pos[:S_ps], block_pos[S_ps:]
        # Each push and bucket waits for every backward task of every op sharing its parameters.
        after = data["sync_after_backward"]
        waiting = first_sync + np.concatenate([ps_pos[after], np.repeat(bucket_pos, bk.member_count)])
        waiting_owner = np.concatenate([ps_owner[after], bk.member_owner])
        user_ops, counts = _ragged_gather(
            self._users_ptr[waiting_owner], np.diff(self._users_ptr)[waiting_owner], self._users
        )
        sync_u = np.repeat(F + task_ptr[user_ops], n_tasks[user_ops]) + _ranges(n_tasks[user_ops])
        sync_v = np.repeat(np.repeat(waiting, counts), n_tasks[user_ops])
        pull_owner = np.repeat(np.arange(N), np.diff(ops.ptr["pull"]))
        base = ops.ptr["sync"][pull_owner]
        pull_u = first_sync + ps_pos[data["sync_dep_u"] + base]
        pull_v = first_sync + ps_pos[data["sync_dep_v"] + base]
        arange_f = np.arange(F)
        # Program order: each device runs its forward tasks in op order, then its backward tasks in
        # reverse op order, one after the other (one CUDA stream); in eager execution its host lane
        # issues them in that order, each task's GPU work after its issue, and a receive blocks the
        # host until the data is there.
        keys = None
        if self.schedule_plan is not None:  # micro-batches: each device in its schedule's order
            parent, plan = self.schedule_plan
            keys = _pipeline.program_keys(parent, plan, self._device_index, task_dev, op_of_task)
        chain_u, chain_v = _program_order(task_dev, F if self.stream_order or keys is not None else 0, keys)
        # partial sums of tensor-parallel layers: all-reduces after the sync block
        tp = self._partial_reductions(ops, edges, task_ptr, task_dev, F)
        K = tp.groups.shape[0]
        first_tp = first_sync + S
        T_plain = first_sync + S + K
        if self.host_lane:
            host_u = [chain_u + T_plain, T_plain + np.arange(2 * F), fwd_ids, bwd_ids]
            host_v = [chain_v + T_plain, np.arange(2 * F), T_plain + c_dst, T_plain + F + c_src]
        else:
            host_u = host_v = []
        tp_u = [tp.pred, first_tp + tp.succ_of]
        tp_v = [first_tp + tp.pred_of, tp.succ]
        u = np.concatenate(
            [arange_f, dep_u, F + dep_v, c_src, fwd_ids, F + c_dst, bwd_ids, sync_u, pull_u, chain_u, *tp_u, *host_u]
        )
        v = np.concatenate(
            [
                F + arange_f,
                dep_v,
                F + dep_u,
                fwd_ids,
                c_dst,
                bwd_ids,
                F + c_src,
                sync_v,
                pull_v,
                chain_v,
                *tp_v,
                *host_v,
            ]
        )
        H = 2 * F if self.host_lane else 0
        T = T_plain + H
        succ_ptr, succ, indegree = _kernels.csr(u.astype(np.int64, copy=False), v.astype(np.int64, copy=False), T)
        if keys is not None:
            self._check_order(succ_ptr, succ, indegree, task_dev, op_of_task, F)
        chain_prev = np.full(2 * F, -1, np.int64)
        chain_prev[chain_v] = chain_u
        # Communication: point-to-point tasks (transfers, gradient transfers, pushes, pulls and SFB
        # broadcasts), buckets; then the synchronization block's compute tasks (``sfb_gradient``).
        local = np.flatnonzero(data["sync_kind"] == _SFB_GRADIENT)
        sent = np.flatnonzero(data["sync_kind"] != _SFB_GRADIENT)
        pairs = np.concatenate(
            (task_dev[c_src] * D + task_dev[c_dst], task_dev[c_dst] * D + task_dev[c_src], data["sync_pair"][sent])
        )
        comm_bytes = np.concatenate((edges.com_b, edges.com_b, data["sync_bytes"][sent]))
        p2p = self._p2p(pairs, comm_bytes)
        coll = self._collectives(bk.group, bk.num_bytes)
        computed = self._sync_compute(data["sync_pair"][local] // D, data["sync_seconds"][local])
        # tasks after the compute tasks, in id order: the transfers and gradient transfers as _p2p made
        # them (the first 2C of its tasks, sliced), then the block's tasks gathered from the rest of p2p
        # (pushes, pulls, broadcasts), the buckets and the SFB compute tasks, then the partial sums
        transfers, block_p2p = p2p.split(2 * C)
        ps_source = np.empty(S_ps, np.int64)
        ps_source[sent] = np.arange(sent.shape[0])
        ps_source[local] = sent.shape[0] + B + np.arange(local.shape[0])
        source = np.empty(S, np.int64)
        source[ps_pos] = ps_source
        source[bucket_pos] = sent.shape[0] + np.arange(B)
        block = _Comm.concat(block_p2p, coll, computed).take(source)
        comm = _Comm.concat(transfers, block, self._collectives(tp.groups, tp.num_bytes))
        sync_kind = np.empty(S, np.int64)
        sync_kind[ps_pos] = data["sync_kind"]
        sync_kind[bucket_pos] = _ALL_REDUCE
        sync_op = np.empty(S, np.int64)
        sync_op[ps_pos] = ps_owner
        sync_op[bucket_pos] = bk.op
        kind = np.concatenate(
            [
                np.full(F, _FORWARD),
                np.full(F, _BACKWARD),
                np.full(C, _TRANSFER),
                np.full(C, _GRAD_TRANSFER),
                sync_kind,
                np.full(K, _PARTIAL_ALL_REDUCE),
                np.full(H, _HOST),
            ]
        ).astype(np.int8)
        host_op = op_of_task if H else op_of_task[:0]
        task_op = np.concatenate(
            [op_of_task, op_of_task, op_of_task[c_dst], op_of_task[c_dst], sync_op, tp.op, host_op, host_op]
        ).astype(np.int32)
        res_len = np.concatenate([np.ones(2 * F, np.int64), np.diff(comm.res_ptr), np.ones(H, np.int64)])
        flows = comm.flows
        host_dev = task_dev if H else task_dev[:0]
        host_lane = self.num_devices + 2 * self.num_links + host_dev
        return _Tasks(
            np.concatenate(
                [data["forward_s"], data["backward_s"], comm.duration]
                + ([data["host_forward_s"], data["host_backward_s"]] if H else [])
            ),
            np.concatenate(
                [task_dev, task_dev, comm.res, self._host_res_base + host_dev, self._host_res_base + host_dev]
            ).astype(np.int64),
            np.concatenate(([0], np.cumsum(res_len))),
            succ_ptr,
            succ,
            indegree,
            kind,
            task_op,
            np.concatenate([np.zeros(2 * F), comm.num_bytes, np.zeros(H)]),
            task_dev,
            task_ptr,
            F,
            C,
            c_src,
            c_dst,
            np.concatenate([task_dev, task_dev, comm.lane, host_lane, host_lane]),
            _Flows(
                np.concatenate([np.zeros(2 * F, np.int64), flows.phase_ptr, np.full(H, flows.phase_ptr[-1], np.int64)]),
                flows.phase_latency,
                flows.phase_flow_ptr,
                flows.num_bytes,
                flows.cap,
                flows.dir_ptr,
                flows.dirs,
                flows.task + 2 * F,
            ),
            self.model.shares_links,
            ps_pos,
            bucket_pos,
            bk.group,
            bk.ordinal,
            np.concatenate(([0], np.cumsum(bk.member_count))).astype(np.int64),
            bk.member_owner,
            bk.member_local,
            T_plain,
            chain_prev,
        )

    def _check_order(
        self,
        succ_ptr: np.ndarray,
        succ: np.ndarray,
        indegree: np.ndarray,
        task_dev: np.ndarray,
        op_of_task: np.ndarray,
        F: int,
    ) -> None:
        """Raise :class:`~placement_rl.sim.pipeline.ScheduleDeadlock` when the schedule's order has a cycle."""
        stuck = np.flatnonzero(_kernels.unordered(succ_ptr, succ, indegree)[: 2 * F])
        if stuck.size == 0:
            return
        assert self.schedule_plan is not None
        parent, plan = self.schedule_plan
        t = int(stuck[0])
        m = self.micro_batches
        op = int(op_of_task[t % F])
        device = self.topology.devices[int(task_dev[t % F])].name
        stages = pipeline_stages(parent, plan)
        raise _pipeline.ScheduleDeadlock(
            f"plan {plan.name!r}: schedule {plan.schedule!r} with {m} micro-batches orders the tasks so that a "
            f"device waits for itself (e.g. {device} at the {'backward' if t >= F else 'forward'} of op "
            f"{parent.ops[op // m].name!r}, micro-batch {op % m}): its {len(stages)} stage(s) do not form a "
            "pipeline of device groups in topological order; use schedule 'gpipe', which runs any plan"
        )

    def _partial_reductions(
        self, ops: OpArrays, edges: EdgeArrays, task_ptr: np.ndarray, task_dev: np.ndarray, F: int
    ) -> _Partials:
        """The all-reduces of partial sums (tensor parallelism, Megatron-LM's ``f`` and ``g``).

        Forward: a producer split along its input features (a row-parallel layer) yields partial
        outputs; the partials of one sum group on devices that also run a consumer task are summed
        by one all-reduce over those devices (the kernel sends them no transfer), after every such
        partial's forward task and before those consumers' forward tasks.

        Backward: a consumer split along its output features (a column-parallel layer) that reads
        its whole input from a replica of the producer on its own device (no transfer) yields
        partial input gradients. Where the producer's replicas are ``duplicate`` (each must hold the
        whole gradient, as Megatron-LM's replicated LayerNorm on every tensor-parallel rank), they
        are summed by one all-reduce;
        the consumer tasks of one gradient group doing so sum them by one all-reduce over their
        devices, after their backward tasks and before the backward tasks of the replicas they read.
        Otherwise each replica goes on with its partial gradient, and the all-reduce of the
        replicas' parameter gradients sums them (the executor runs it so).
        """
        data = ops.data
        e_src, e_dst = self.e_src, self.e_dst
        sg, gg = data["sum_group"], data["grad_group"]
        N = task_ptr.shape[0] - 1
        has_sum = np.zeros(N, np.bool_)
        has_grad = np.zeros(N, np.bool_)
        full = np.flatnonzero(task_ptr[1:] > task_ptr[:-1])
        if full.size:
            has_sum[full] = np.maximum.reduceat(sg, task_ptr[full]) >= 0
            has_grad[full] = np.maximum.reduceat(gg, task_ptr[full]) >= 0
        groups: list[int] = []
        nbytes: list[float] = []
        owner: list[int] = []
        pred: list[int] = []
        pred_of: list[int] = []
        succ: list[int] = []
        succ_of: list[int] = []
        # a consumer's partial input gradients are summed only where its producer's replicas are duplicates
        dup_first = np.zeros(N, np.bool_)
        dup_first[full] = data["duplicated"][task_ptr[full]]
        for e in np.flatnonzero(has_sum[e_src] | (has_grad[e_dst] & dup_first[e_src])).tolist():
            i, j = int(e_src[e]), int(e_dst[e])
            pi, pj = int(task_ptr[i]), int(task_ptr[j])
            p_dev, c_dev = task_dev[pi : int(task_ptr[i + 1])], task_dev[pj : int(task_ptr[j + 1])]
            if has_sum[i]:
                consumers = set(c_dev.tolist())
                p_sum = sg[pi : pi + p_dev.shape[0]]
                for g in np.unique(p_sum[p_sum >= 0]).tolist():
                    members = [t for t in np.flatnonzero(p_sum == g).tolist() if int(p_dev[t]) in consumers]
                    devs = self._with_ranks(list(dict.fromkeys(int(p_dev[t]) for t in members)))
                    if len(devs) < 2:
                        continue
                    k = len(groups)
                    groups.append(self.group_id(tuple(devs)))
                    nbytes.append(float(self.e_bytes[e] * data["out_fraction"][pi + members[0]]))
                    owner.append(i)
                    pred.extend(pi + t for t in members)
                    pred_of.extend([k] * len(members))
                    readers = [q for q in range(c_dev.shape[0]) if int(c_dev[q]) in devs]
                    succ.extend(pj + q for q in readers)
                    succ_of.extend([k] * len(readers))
            if has_grad[j] and data["duplicated"][pi]:
                d0, d1 = int(edges.dep_ptr[e]), int(edges.dep_ptr[e + 1])
                local_p, local_q = edges.dep_p[d0:d1], edges.dep_q[d0:d1]
                # only consumer tasks that read everything from a local replica (no transfer)
                fed = edges.com_q[int(edges.com_ptr[e]) : int(edges.com_ptr[e + 1])]
                alone = ~np.isin(local_q, fed)
                local_p, local_q = local_p[alone], local_q[alone]
                c_grad = gg[pj : pj + c_dev.shape[0]]
                for h in np.unique(c_grad[local_q][c_grad[local_q] >= 0]).tolist():
                    pick = np.flatnonzero(c_grad[local_q] == h)
                    devs = self._with_ranks(list(dict.fromkeys(int(c_dev[q]) for q in local_q[pick].tolist())))
                    if len(devs) < 2:
                        continue
                    k = len(groups)
                    groups.append(self.group_id(tuple(devs)))
                    nbytes.append(float(self.e_bytes[e] * data["in_fraction"][pj + int(local_q[pick[0]])]))
                    owner.append(j)
                    pred.extend(F + pj + q for q in dict.fromkeys(local_q[pick].tolist()))
                    pred_of.extend([k] * len(dict.fromkeys(local_q[pick].tolist())))
                    succ.extend(F + pi + p for p in dict.fromkeys(local_p[pick].tolist()))
                    succ_of.extend([k] * len(dict.fromkeys(local_p[pick].tolist())))
        as_int = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
        return _Partials(as_int(groups), np.array(nbytes), as_int(owner), as_int(pred), as_int(pred_of),
                         as_int(succ), as_int(succ_of))  # fmt: skip

    def _buckets(self, ops: OpArrays) -> _Buckets:
        """The all-reduce buckets of every group (module docstring): shards in backward order, each
        bucket closed once it holds at least ``bucket_bytes``."""
        data = ops.data
        sizes = np.diff(ops.ptr["allreduce"])
        A = int(ops.ptr["allreduce"][-1])
        owner = np.repeat(np.arange(sizes.shape[0]), sizes)
        group, nbytes, local = data["ar_group"], data["ar_bytes"], data["ar_shard"]
        if self.cost.bucket_bytes == 0 or A == 0 or data["ar_alone"].all():  # one bucket per shard, in op order
            ordinal = np.zeros(A, np.int64)
            if A:
                by_group = np.lexsort((-owner, group))
                starts = np.flatnonzero(np.r_[True, group[by_group][1:] != group[by_group][:-1]])
                counts = np.diff(np.r_[starts, A])
                ordinal[by_group] = np.arange(A) - np.repeat(starts, counts)
            return _Buckets(group, nbytes, ordinal, owner, local, np.ones(A, np.int64), owner, local)
        by_group = np.lexsort((local, -owner, group))  # each group's shards in backward order
        first, total, ordinal = _kernels.fill_buckets(
            group[by_group], nbytes[by_group], data["ar_alone"][by_group], float(self.cost.bucket_bytes)
        )
        counts = np.diff(np.r_[first, A])
        last = by_group[first + counts - 1]  # the shard that completes the bucket: the lowest op
        return _Buckets(
            group[by_group[first]], total, ordinal, owner[last], local[last], counts, owner[by_group], local[by_group]
        )

    @staticmethod
    def _sync_compute(devices: np.ndarray, seconds: np.ndarray) -> _Comm:
        """Compute tasks of the synchronization block (``sfb_gradient``): ``seconds[k]`` on device ``devices[k]``."""
        K = devices.shape[0]
        # no flows: the kernel's empty flow arrays (its last one is a per-direction table; ours, per flow, is ids)
        pp, pl, pf, fb, fc, fd, fds, _ = _kernels.no_flows(K)
        flows = _Flows(pp, pl, pf, fb, fc, fd, fds, np.zeros(0, np.int64))
        return _Comm(
            seconds.astype(np.float64),
            np.arange(K + 1, dtype=np.int64),
            devices.astype(np.int64),
            np.zeros(K),
            devices.astype(np.int64),
            flows,
        )

    def _p2p(self, pairs: np.ndarray, num_bytes: np.ndarray) -> _Comm:
        """Point-to-point tasks under the network model: ``num_bytes[k]`` along the route of ``pairs[k]``."""
        net = self.network
        D = self.num_devices
        M = pairs.shape[0]
        moving = np.flatnonzero(num_bytes > 0)
        dirs, dir_ptr, latency, first = net.transfer_routes(pairs, moving)
        cap = np.full(moving.shape[0], np.inf)
        if self.model.shares_links and self.cost.comm_table is not None:
            cap = self._transfer_bandwidths(pairs[moving], num_bytes[moving])
        flows = _Flows(
            np.concatenate(([0], np.cumsum(num_bytes > 0))).astype(np.int64),
            latency,
            np.arange(moving.shape[0] + 1, dtype=np.int64),
            num_bytes[moving],
            cap,
            dir_ptr,
            dirs,
            moving,
        )
        lane = D + first
        if self.model.shares_links:
            return _Comm(np.zeros(M), np.zeros(M + 1, np.int64), np.zeros(0, np.int64), num_bytes, lane, flows)
        duration = self._transfer_times(pairs, num_bytes)
        if self.model.holds == "pair":
            res_len = np.ones(M, np.int64)
            res = self._pair_res_base + pairs
        else:
            res, res_len = net.gather(pairs)
            res = res + D
        return _Comm(duration, np.concatenate(([0], np.cumsum(res_len))), res, num_bytes, lane, flows)

    def _collectives(self, groups: np.ndarray, num_bytes: np.ndarray) -> _Comm:
        """One all-reduce task per bucket of ``num_bytes`` over group ``groups[k]`` (network model)."""
        B = groups.shape[0]
        tables = self.group_tables()
        n = tables.size[groups]
        moved = 2.0 * (n - 1) * num_bytes
        if self.model.shares_links:
            return tables.flow_all_reduce(groups, num_bytes, moved)
        ring = tables.fixed(self.model.holds)
        bw = ring.bandwidth[groups]
        if self.cost.comm_table is not None and B:  # comm tables are small and opt-in; clarity over speed here
            bw = np.array(
                [
                    self.cost.effective_bandwidth(f"all_reduce/{ring.kind[g]}", b, s)
                    for g, b, s in zip(groups.tolist(), bw.tolist(), num_bytes.tolist(), strict=True)
                ]
            )
        duration = np.where(num_bytes > 0, 2.0 * (n - 1) * (ring.latency[groups] + num_bytes / n / bw), 0.0)
        res, res_len = _ragged_gather(ring.res_ptr[groups], np.diff(ring.res_ptr)[groups], ring.res)
        flows = tables.ring_flows(groups, num_bytes)
        res_ptr = np.concatenate(([0], np.cumsum(res_len))).astype(np.int64)
        if self.model.holds == "route":
            lane = res[res_ptr[:-1]] if B else np.zeros(0, np.int64)
        else:
            lane = self.num_devices + flows.dirs[flows.dir_ptr[flows.phase_flow_ptr[flows.phase_ptr[:-1]]]]
        return _Comm(duration, res_ptr, res, moved, lane, flows)

    def _transfer_times(self, pairs: np.ndarray, num_bytes: np.ndarray) -> np.ndarray:
        net = self.network
        bw = net.bandwidths(pairs)
        if self.cost.comm_table is not None and pairs.size:
            bw = self._transfer_bandwidths(pairs, num_bytes)
        return np.where(num_bytes > 0, net.latencies(pairs) + num_bytes / bw, 0.0)

    def _transfer_bandwidths(self, pairs: np.ndarray, num_bytes: np.ndarray) -> np.ndarray:
        """The comm table's bandwidth for each transfer (the route's bottleneck where it has none)."""
        net = self.network
        kinds = net.kind_ids(pairs)
        bw = net.bandwidths(pairs)
        for k, name in enumerate(net.kind_names):
            for i in np.nonzero(kinds == k)[0]:  # comm tables are small and opt-in; clarity over speed here
                bw[i] = self.cost.effective_bandwidth(f"p2p/{name}", bw[i], num_bytes[i])
        return bw

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
        again = ops.data["recompute"]
        if again.any():  # a recomputed output lives while its forward runs, then again during backward
            ev_to = ev_to.copy()
            ev_to[:F][again] = end[:F][again]
            redo = np.flatnonzero(again)
            ev_dev = np.concatenate([ev_dev, task_dev[redo]])
            ev_from = np.concatenate([ev_from, start[F + redo]])
            ev_to = np.concatenate([ev_to, end[F + redo]])
            ev_bytes = np.concatenate([ev_bytes, act[redo]])
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

    def _result(
        self,
        ops: OpArrays,
        tasks: _Tasks,
        start: np.ndarray,
        end: np.ndarray,
        crit: np.ndarray,
        direction_busy: np.ndarray,
        timeline: Sequence[np.ndarray],
    ) -> SimResult:
        D = self.num_devices
        F = tasks.F
        task_dev, task_ptr = tasks.task_dev, tasks.task_ptr
        table = TaskTable(tasks.kind, tasks.op, tasks.lane.astype(np.int32), start, end, tasks.num_bytes, self._lanes)
        makespan = float(end.max()) if end.size else 0.0
        duration = end - start
        busy = np.bincount(task_dev, weights=duration[:F], minlength=D) + np.bincount(
            task_dev, weights=duration[F : 2 * F], minlength=D
        )
        rebuilt = np.flatnonzero(tasks.kind == _SFB_GRADIENT)
        if rebuilt.size:  # SFB's gradient rebuilding computes on its device too
            busy = busy + np.bincount(tasks.lane[rebuilt], weights=duration[rebuilt], minlength=D)
        peak = self.peak_memory(ops, tasks, start, end)
        oom_mask = peak > self._capacity
        # Links: the bytes each flow puts on each direction; busy time and rates over time from the
        # scheduler (flows) or from each task's bytes spread over its duration (fixed-time models).
        fl = tasks.flows
        L = self.num_links
        lengths = np.diff(fl.dir_ptr)
        flow_bytes = np.repeat(fl.num_bytes, lengths)
        direction_bytes = np.bincount(fl.dirs, weights=flow_bytes, minlength=2 * L).astype(np.float64)
        if not tasks.scheduled_flows:
            owner = np.repeat(fl.task, lengths)
            direction_busy, *timeline = _kernels.interval_rates(fl.dirs, start[owner], end[owner], flow_bytes, 2 * L)
        rates = LinkRates(*timeline)
        link_bytes = direction_bytes.reshape(L, 2).sum(axis=1) if L else np.zeros(0)
        link_busy = direction_busy.reshape(L, 2).max(axis=1) if L else np.zeros(0)
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
            comm_time_s=float(duration[2 * F : tasks.host_base].sum()),
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
            network=self.model.name,
            link_direction_names=self.network.direction_names,
            link_direction_bytes=direction_bytes,
            link_direction_busy_s=direction_busy,
            link_direction_capacity_bytes_per_s=self.network.capacity,
            link_direction_rates=rates,
        )


def _holder_groups(
    devices: np.ndarray, task_shard: np.ndarray, shards: int, replicas: int, sync: str, slices: int
) -> tuple[list[tuple[int, ...]], str]:
    """The device groups that synchronize each parameter shard, and how.

    Normally every device holding a shard is in its group. Under ``duplicate`` with the batch (or
    another non-parameter dimension) split into ``slices > 1`` slices, the replicas of one slice
    compute identical gradients (Megatron-LM's tensor-parallel ranks hold identical LayerNorm
    gradients) and the slices' gradients are all-reduced per replica: one group per (shard, replica).
    """
    if sync == "duplicate" and slices > 1:
        groups = [
            tuple(
                dict.fromkeys(
                    int(d)
                    for t, (d, sh) in enumerate(zip(devices, task_shard, strict=True))
                    if sh == k and t % replicas == r
                )
            )
            for k in range(shards)
            for r in range(replicas)
        ]
        return groups, "all_reduce"
    groups = [
        tuple(dict.fromkeys(int(d) for d, sh in zip(devices, task_shard, strict=True) if sh == k))
        for k in range(shards)
    ]
    return groups, sync


def _partial_groups(
    split: Sequence[tuple[Any, int]], idx: np.ndarray, replicas: int, sample_share: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per task (T = P R): its ``sum_group``, ``grad_group``, ``in_fraction`` and ``out_fraction``
    (see :class:`_CompiledOp`).

    ``split``: the split dimensions and degrees; ``idx`` (P, len(split)) each partition's coordinates;
    ``sample_share`` (P,) each partition's share of the batch.
    """
    P = idx.shape[0]
    degrees = [deg for _, deg in split]
    rows = np.arange(P * replicas) // replicas
    replica = np.arange(P * replicas) % replicas

    def group(zeroed: list[int]) -> np.ndarray:
        if not zeroed:
            return np.full(P * replicas, -1, np.int64)
        coords = idx.copy()
        coords[:, zeroed] = 0
        flat = np.ravel_multi_index(tuple(coords.T), degrees) if degrees else np.zeros(P, np.int64)
        return (flat[rows] * replicas + replica).astype(np.int64)

    sums = [k for k, (d, _) in enumerate(split) if d.reduction and d.kind == "parameter"]
    grads = [k for k, (d, _) in enumerate(split) if not d.reduction and d.kind == "parameter"]
    fraction = sample_share.copy()
    out = sample_share.copy()
    for d, deg in split:
        if d.kind == "attribute" or (d.reduction and d.kind == "parameter"):
            fraction = fraction / deg
        if not d.reduction and d.kind != "sample":
            out = out / deg
    return group(sums), group(grads), fraction[rows], out[rows]


def _program_order(task_dev: np.ndarray, F: int, keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive pairs ``(u, v)`` of compute tasks on one device in program order.

    Program order on a device: its forward tasks by ascending id (op order), then its backward tasks
    (``F + i``) by descending id; or, given ``keys`` ((2F,) one per compute task, forward then
    backward), its tasks by ascending key (a pipeline schedule). Shapes: ``task_dev`` (F,) device
    of each forward task; returns two (2F - devices used,) arrays of task ids.
    """
    if F == 0:  # no tasks (or no stream order): no pairs
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if keys is not None:
        dev2 = np.concatenate([task_dev, task_dev])
        seq = np.lexsort((keys, dev2))
        same = dev2[seq[1:]] == dev2[seq[:-1]]
        return seq[:-1][same].astype(np.int64), seq[1:][same].astype(np.int64)
    return _kernels.program_order(task_dev.astype(np.int64), int(task_dev.max()) + 1)


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


def _fold_micro_batches(result: SimResult, graph: OpGraph, m: int) -> SimResult:
    """A result on the micro-batch graph, told of the original ops: each op's times span its
    micro-batches' copies, and every task names its original op and its micro-batch."""
    n = graph.num_ops
    tasks = result.tasks
    copy = tasks.op.astype(np.int64)
    micro = np.where(np.isin(tasks.kind, _PER_MICRO_BATCH), copy % m, -1).astype(np.int32)
    table = dataclasses.replace(tasks, op=(copy // m).astype(np.int32), micro_batch=micro)
    return dataclasses.replace(
        result,
        op_names=tuple(op.name for op in graph.ops),
        op_start_s=result.op_start_s.reshape(n, m).min(axis=1),
        op_forward_end_s=result.op_forward_end_s.reshape(n, m).max(axis=1),
        op_backward_start_s=result.op_backward_start_s.reshape(n, m).min(axis=1),
        op_end_s=result.op_end_s.reshape(n, m).max(axis=1),
        tasks=table,
        micro_batches=m,
    )


#: Task kinds that belong to one micro-batch (the others synchronize once per iteration).
_PER_MICRO_BATCH = np.array([_FORWARD, _BACKWARD, _TRANSFER, _GRAD_TRANSFER, _HOST])

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
