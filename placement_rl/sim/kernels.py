"""Numba kernels of the simulator: task-graph construction and list scheduling.

These are the simulator's inner loops (FlexFlow sec. 5.1-5.2); :mod:`placement_rl.sim.simulator` prepares
their flat arrays and turns the results into a :class:`~placement_rl.sim.result.SimResult`. Each kernel
is deterministic and allocation-light; ``cache=True`` keeps compiled code between processes.

Compiling them takes a minute or more on a small machine, once after installing or upgrading: the
first simulation in a process whose kernels have no cache says so on stderr (:func:`compile_notice`)
and how long it took.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np
from numba import njit

MAX_RANK = 8
_NOTICE_GIVEN = False


def cold_kernels() -> list[str]:
    """This module's kernels with nothing in their on-disk cache (absent or stale): compiled on first call."""
    cold: list[str] = []
    for name, fn in sorted(globals().items()):
        cache: Any = getattr(fn, "_cache", None)
        if cache is None or not hasattr(fn, "py_func"):
            continue
        try:
            cached = bool(cache._cache_file._load_index())
        except Exception:  # an unreadable cache is a cold one
            cached = False
        if not cached:
            cold.append(name)
    return cold


@contextmanager
def compile_notice(stream: TextIO | None = None, after_s: float = 1.0) -> Iterator[None]:
    """Around the first simulation of a process: if kernels are compiling, say so, then how long it took.

    The notice is printed only if some kernel had no cache and the work is still running after
    ``after_s`` seconds (a kernel this simulation never calls stays uncached, harmlessly). Later
    calls in the process print nothing.
    """
    global _NOTICE_GIVEN
    if _NOTICE_GIVEN:
        yield
        return
    _NOTICE_GIVEN = True
    cold = cold_kernels()
    if not cold:
        yield
        return
    out = stream if stream is not None else sys.stderr
    said = threading.Event()

    def say() -> None:
        said.set()
        print(
            "compiling the simulator's kernels (once after installing or upgrading, a minute or two on a "
            "small machine; cached for every later run) ...",
            file=out,
            flush=True,
        )

    started = time.perf_counter()
    timer = threading.Timer(after_s, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if said.is_set():
            print(f"compiled the simulator's kernels in {time.perf_counter() - started:.0f} s", file=out, flush=True)


@njit(cache=True)
def _overlap(prod_lo, prod_hi, need_lo, need_hi, rank):  # type: ignore[no-untyped-def]
    """Fraction of the whole tensor inside both boxes (boxes are per-axis [lo, hi) fractions)."""
    volume = 1.0
    for a in range(rank):
        lo = max(prod_lo[a], need_lo[a])
        hi = min(prod_hi[a], need_hi[a])
        if hi <= lo:
            return 0.0
        volume *= hi - lo
    return volume


@njit(cache=True)
def _consumer_box(j_part, e_rank, same_layout, prod_sample_axis, need_lo, need_hi, samp_lo, samp_hi, out_lo, out_hi):  # type: ignore[no-untyped-def]
    """The region of the input tensor that consumer partition ``j_part`` reads (into out_lo/out_hi)."""
    for a in range(e_rank):
        out_lo[a] = 0.0
        out_hi[a] = 1.0
    if same_layout:
        for a in range(e_rank):
            out_lo[a] = need_lo[j_part, a]
            out_hi[a] = need_hi[j_part, a]
    elif prod_sample_axis >= 0:
        out_lo[prod_sample_axis] = samp_lo[j_part]
        out_hi[prod_sample_axis] = samp_hi[j_part]


@njit(cache=True)
def consumer_region(j_part, e_rank, amap, prod_sample_axis, need_lo, need_hi, samp_lo, samp_hi, out_lo, out_hi):  # type: ignore[no-untyped-def]
    """The region of the input tensor that consumer partition ``j_part`` reads (into out_lo/out_hi).

    ``amap`` (MAX_RANK,): for each axis of the consumer's output, the tensor axis it follows (-1:
    none); ``amap[0] == -2`` when the layouts are unrelated: then only the sample slice is read.
    """
    for a in range(e_rank):
        out_lo[a] = 0.0
        out_hi[a] = 1.0
    if amap[0] != -2:
        for a in range(MAX_RANK):
            t = amap[a]
            if t >= 0:
                out_lo[t] = need_lo[j_part, a]
                out_hi[t] = need_hi[j_part, a]
    elif prod_sample_axis >= 0:
        out_lo[prod_sample_axis] = samp_lo[j_part]
        out_hi[prod_sample_axis] = samp_hi[j_part]


@njit(cache=True)
def _edge(  # type: ignore[no-untyped-def]
    i_dev,
    i_replicas,
    i_prod_lo,
    i_prod_hi,
    i_sum,
    j_dev,
    j_replicas,
    j_need_lo,
    j_need_hi,
    j_samp_lo,
    j_samp_hi,
    rank,
    amap,
    prod_box,
    sample_axis,
    nbytes,
    fill,
    dep_p,
    dep_q,
    com_p,
    com_q,
    com_b,
    kd,
    kc,
):
    """Transfers of one tensor: for each consumer task, each producer partition whose output overlaps
    what it reads. Same-device pairs are dependencies ``(dep_p, dep_q)``; the others transfers
    ``(com_p, com_q, com_b)``. Indices are local task indices of the producer and consumer ops.
    Writes only when ``fill``; returns the counts ``(kd, kc)`` after this edge.

    Partial sums (``i_sum[p] >= 0``: a split of the producer's input features) reach a consumer on a
    device of the partial's sum group by the group's all-reduce (:func:`partial_reductions`), not by
    a transfer, when the consumer also has a task on the partial's device (to pass its gradient back).
    """
    box_lo = np.zeros(MAX_RANK)
    box_hi = np.ones(MAX_RANK)
    full_lo = np.zeros(MAX_RANK)
    full_hi = np.ones(MAX_RANK)
    p_i = i_dev.shape[0] // i_replicas
    axis = sample_axis if prod_box else -1
    for q in range(j_dev.shape[0]):
        consumer_region(q // j_replicas, rank, amap, axis, j_need_lo, j_need_hi, j_samp_lo, j_samp_hi, box_lo, box_hi)
        for p in range(p_i):
            if prod_box:
                frac = _overlap(i_prod_lo[p], i_prod_hi[p], box_lo, box_hi, rank)
            else:
                frac = _overlap(full_lo, full_hi, box_lo, box_hi, rank)
            if frac <= 0.0:
                continue
            src = _pick_replica(p * i_replicas, i_replicas, i_dev, j_dev[q], q)
            if i_sum[src] >= 0 and i_dev[src] != j_dev[q] and _reduced(i_sum, i_dev, src, j_dev):
                if _in_group(i_sum, i_dev, src, j_dev[q]):
                    continue
            if i_dev[src] == j_dev[q]:
                if fill:
                    dep_p[kd] = src
                    dep_q[kd] = q
                kd += 1
            else:
                if fill:
                    com_p[kc] = src
                    com_q[kc] = q
                    com_b[kc] = frac * nbytes
                kc += 1
    return kd, kc


@njit(cache=True)
def _in_group(i_sum, i_dev, src, device):  # type: ignore[no-untyped-def]
    """Whether a task of ``src``'s sum group runs on ``device``."""
    for t in range(i_dev.shape[0]):
        if i_sum[t] == i_sum[src] and i_dev[t] == device:
            return True
    return False


@njit(cache=True)
def _reduced(i_sum, i_dev, src, j_dev):  # type: ignore[no-untyped-def]
    """Whether a consumer task runs on ``src``'s device (so ``src``'s partial joins an all-reduce)."""
    for q in range(j_dev.shape[0]):
        if j_dev[q] == i_dev[src]:
            return True
    return False


@njit(cache=True)
def build_transfers(  # type: ignore[no-untyped-def]
    e_src,
    e_dst,
    e_bytes,
    e_rank,
    e_map,
    e_prod_box,
    op_task_ptr,
    op_part_ptr,
    op_replicas,
    op_sample_axis,
    task_dev,
    prod_lo,
    prod_hi,
    need_lo,
    need_hi,
    samp_lo,
    samp_hi,
    sum_group,
):
    """:func:`_edge` for every tensor of the graph, in edge order.

    Returns ``(dep_p, dep_q, com_p, com_q, com_b, n_dep, n_com)``: local task indices, bytes, and the
    per-edge counts ``(E,)`` that split the flat arrays into per-edge segments.
    """
    n_edges = e_src.shape[0]
    n_dep = np.zeros(n_edges, np.int64)
    n_com = np.zeros(n_edges, np.int64)
    empty_i = np.zeros(0, np.int64)
    empty_f = np.zeros(0)
    kd = 0
    kc = 0
    for fill in (False, True):
        if fill:
            dep_p = np.empty(kd, np.int64)
            dep_q = np.empty(kd, np.int64)
            com_p = np.empty(kc, np.int64)
            com_q = np.empty(kc, np.int64)
            com_b = np.empty(kc)
        else:
            dep_p = dep_q = com_p = com_q = empty_i
            com_b = empty_f
        kd = 0
        kc = 0
        for e in range(n_edges):
            i = e_src[e]
            j = e_dst[e]
            kd0, kc0 = kd, kc
            kd, kc = _edge(
                task_dev[op_task_ptr[i] : op_task_ptr[i + 1]],
                op_replicas[i],
                prod_lo[op_part_ptr[i] : op_part_ptr[i + 1]],
                prod_hi[op_part_ptr[i] : op_part_ptr[i + 1]],
                sum_group[op_task_ptr[i] : op_task_ptr[i + 1]],
                task_dev[op_task_ptr[j] : op_task_ptr[j + 1]],
                op_replicas[j],
                need_lo[op_part_ptr[j] : op_part_ptr[j + 1]],
                need_hi[op_part_ptr[j] : op_part_ptr[j + 1]],
                samp_lo[op_part_ptr[j] : op_part_ptr[j + 1]],
                samp_hi[op_part_ptr[j] : op_part_ptr[j + 1]],
                e_rank[e],
                e_map[e],
                e_prod_box[e],
                op_sample_axis[i],
                e_bytes[e],
                fill,
                dep_p,
                dep_q,
                com_p,
                com_q,
                com_b,
                kd,
                kc,
            )
            n_dep[e] = kd - kd0
            n_com[e] = kc - kc0
    return dep_p, dep_q, com_p, com_q, com_b, n_dep, n_com


@njit(cache=True)
def edge_transfers(  # type: ignore[no-untyped-def]
    i_dev,
    i_replicas,
    i_prod_lo,
    i_prod_hi,
    i_sum,
    j_dev,
    j_replicas,
    j_need_lo,
    j_need_hi,
    j_samp_lo,
    j_samp_hi,
    rank,
    amap,
    prod_box,
    sample_axis,
    nbytes,
):
    """:func:`_edge` for one tensor (delta simulation), returning ``(dep_p, dep_q, com_p, com_q, com_b)``."""
    empty_i = np.zeros(0, np.int64)
    kd, kc = _edge(
        i_dev,
        i_replicas,
        i_prod_lo,
        i_prod_hi,
        i_sum,
        j_dev,
        j_replicas,
        j_need_lo,
        j_need_hi,
        j_samp_lo,
        j_samp_hi,
        rank,
        amap,
        prod_box,
        sample_axis,
        nbytes,
        False,
        empty_i,
        empty_i,
        empty_i,
        empty_i,
        np.zeros(0),
        0,
        0,
    )
    dep_p = np.empty(kd, np.int64)
    dep_q = np.empty(kd, np.int64)
    com_p = np.empty(kc, np.int64)
    com_q = np.empty(kc, np.int64)
    com_b = np.empty(kc)
    _edge(
        i_dev,
        i_replicas,
        i_prod_lo,
        i_prod_hi,
        i_sum,
        j_dev,
        j_replicas,
        j_need_lo,
        j_need_hi,
        j_samp_lo,
        j_samp_hi,
        rank,
        amap,
        prod_box,
        sample_axis,
        nbytes,
        True,
        dep_p,
        dep_q,
        com_p,
        com_q,
        com_b,
        0,
        0,
    )
    return dep_p, dep_q, com_p, com_q, com_b


@njit(cache=True)
def _pick_replica(first, replicas, task_dev, device, consumer):  # type: ignore[no-untyped-def]
    """The producer replica on the consumer's device if there is one, else one chosen round-robin."""
    for r in range(replicas):
        if task_dev[first + r] == device:
            return first + r
    return first + consumer % replicas


@njit(cache=True)
def program_order(task_dev, num_devices):  # type: ignore[no-untyped-def]
    """Consecutive pairs ``(u, v)`` of compute tasks on one device in program order (counting sort).

    ``task_dev`` (F,) the device of each forward task ``i`` (its backward task is ``F + i``). A
    device runs its forward tasks by ascending id, then its backward tasks by descending id.
    Returns two (2F - devices used,) int64 arrays, device by device.
    """
    F = task_dev.shape[0]
    count = np.zeros(num_devices + 1, np.int64)
    for i in range(F):
        count[task_dev[i] + 1] += 1
    for d in range(num_devices):
        count[d + 1] += count[d]
    fill = count[:-1].copy()
    forward = np.empty(F, np.int64)  # forward ids, device by device, ascending
    for i in range(F):
        forward[fill[task_dev[i]]] = i
        fill[task_dev[i]] += 1
    used = 0
    for d in range(num_devices):
        if count[d + 1] > count[d]:
            used += 1
    u = np.empty(2 * F - used, np.int64)
    v = np.empty(2 * F - used, np.int64)
    k = 0
    for d in range(num_devices):
        lo, hi = count[d], count[d + 1]
        if hi == lo:
            continue
        prev = forward[lo]
        for j in range(lo + 1, hi):
            u[k], v[k] = prev, forward[j]
            prev = forward[j]
            k += 1
        for j in range(hi - 1, lo - 1, -1):
            u[k], v[k] = prev, F + forward[j]
            prev = F + forward[j]
            k += 1
    return u, v


@njit(cache=True)
def csr(u, v, n):  # type: ignore[no-untyped-def]
    """Successor lists of ``n`` nodes from edges ``u -> v`` (counting sort): ``(ptr, succ, indegree)``."""
    ptr = np.zeros(n + 1, np.int64)
    indegree = np.zeros(n, np.int64)
    for k in range(u.shape[0]):
        ptr[u[k] + 1] += 1
        indegree[v[k]] += 1
    for t in range(n):
        ptr[t + 1] += ptr[t]
    fill = ptr[:-1].copy()
    succ = np.empty(u.shape[0], np.int64)
    for k in range(u.shape[0]):
        succ[fill[u[k]]] = v[k]
        fill[u[k]] += 1
    return ptr, succ, indegree


@njit(cache=True)
def unordered(succ_ptr, succ, indegree):  # type: ignore[no-untyped-def]
    """The nodes Kahn's algorithm cannot order (on or behind a cycle): ``(n,)`` bool."""
    n = indegree.shape[0]
    pending = indegree.copy()
    stack = np.empty(n, np.int64)
    top = 0
    for t in range(n):
        if pending[t] == 0:
            stack[top] = t
            top += 1
    while top > 0:
        top -= 1
        t = stack[top]
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            w = succ[k]
            pending[w] -= 1
            if pending[w] == 0:
                stack[top] = w
                top += 1
    return pending > 0


@njit(cache=True)
def schedule(duration, res_ptr, res, succ_ptr, succ, indegree, num_resources):  # type: ignore[no-untyped-def]
    """FlexFlow's simulation (sec. 5.2) of fixed-time tasks: :func:`schedule_flows` without flows.

    Returns ``(start, end, critical_pred)``.
    """
    n = duration.shape[0]
    none = np.zeros(n, np.bool_)
    zeros = np.zeros(n)
    pp, pl, pf, fb, fc, fd, fds, cap = no_flows(n)
    out = schedule_flows(
        duration,
        res_ptr,
        res,
        succ_ptr,
        succ,
        indegree,
        num_resources,
        pp,
        pl,
        pf,
        fb,
        fc,
        fd,
        fds,
        cap,
        none,
        zeros,
        zeros,
        zeros,
        False,
        np.inf,
        np.zeros(0),
        np.zeros(0),
    )
    return out[0], out[1], out[3]


@njit(cache=True)
def no_flows(n):  # type: ignore[no-untyped-def]
    """The flow arrays of :func:`schedule_flows` for ``n`` tasks none of which is a flow task."""
    return (
        np.zeros(n + 1, np.int64),
        np.zeros(0),
        np.zeros(1, np.int64),
        np.zeros(0),
        np.zeros(0),
        np.zeros(1, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0),
    )


@njit(cache=True)
def schedule_flows(  # type: ignore[no-untyped-def]
    duration,
    res_ptr,
    res,
    succ_ptr,
    succ,
    indegree,
    num_resources,
    phase_ptr,
    phase_latency,
    phase_flow_ptr,
    flow_bytes,
    flow_cap,
    flow_dir_ptr,
    flow_dirs,
    dir_capacity,
    prefix,
    prefix_ready,
    prefix_start,
    prefix_end,
    record,
    limit,
    rest,
    shortest,
    timeline_capacity=0,
):
    """FlexFlow's simulation (sec. 5.2) with flow tasks that share link directions max-min fairly.

    **Fixed tasks** (compute tasks; every task under the ``circuit`` and ``pairwise`` models) hold
    resources: a task is ready when all its predecessors have ended; it starts when it is ready and
    all of its resources are free, in the order tasks became ready (ties by task id), and runs for
    ``duration``.

    **Flow tasks** (``phase_ptr[t + 1] > phase_ptr[t]``: transfers and collectives under ``flow``)
    start when ready; one with a resource (its first; a collective's communicator) waits until the
    flow tasks that hold it, in the order they became ready, have ended. Task ``t``'s phases ``p``
    run one after the other; phase ``p`` starts its flows ``phase_flow_ptr[p] : phase_flow_ptr[p + 1]``
    at once, each carrying
    ``flow_bytes[f]`` over the link directions ``flow_dirs[flow_dir_ptr[f] : flow_dir_ptr[f + 1]]``
    (at most ``flow_cap[f]`` bytes/s). The flows in flight share each direction max-min fairly
    (capacity ``dir_capacity``); rates are recomputed whenever a flow starts or ends. When a
    phase's flows have all drained, the next phase starts ``phase_latency[p]`` later; the task ends
    that long after its last phase drains. Every phase has at least one flow.

    Rates are recomputed incrementally. Flows in flight that share a direction, directly or through
    other flows, form a component, and max-min rates in one component do not depend on the others.
    Each direction keeps a list of the flows in flight that cross it; at a recompute, the
    components reached from the directions of the flows that started or ended since the last one
    (:func:`_reshare`) get fresh rates, each component by itself, and every other flow keeps its
    rate. The rates are those of a recompute of all flows at once, to the bit (progressive filling
    visits each component's directions in the same order), and so are the times: each event still
    takes every flow's bytes left forward and each recompute its finish time, a few operations per
    flow in flight. For the cut-off, a direction's bytes left are brought up to date only when it
    is checked or its flows' rates change (its total rate ``dir_sum``, from ``dir_stamp`` on).

    Time advances event by event: the earliest of the next ready task and the next flow to drain
    (drains first on ties). A fixed task is timed when it is taken from the queue, as in
    FlexFlow's list scheduling.

    **Resuming** (delta simulation): ``prefix[t]`` marks tasks whose times are already known
    (``prefix_*``): every task that becomes ready before some time ``t0`` and whose predecessors
    and resources are unchanged, where no flow task that became ready before ``t0`` ends after it.
    They are replayed (resources end busy at their last end, successors are credited); the run then
    goes on exactly as a full run would from ``t0``, where no flow is in flight.

    **Cutting off** (searches): with a finite ``limit`` and ``rest``, ``shortest`` (T,) from
    :func:`rest_bounds`, the run stops as soon as the makespan is certainly above ``limit``, and
    the returned times are incomplete (``cut`` is True). Two lower bounds on the makespan are kept:
    a task that becomes ready or starts at ``x`` gives ``x + rest[t]`` (its longest chain), and a
    resource gives the end of its latest task plus the shortest durations of the tasks it has not
    started yet (a device runs its tasks one at a time, a communicator its flow tasks); and under
    flows, a link direction gives the current time plus the bytes it has yet to carry over its
    capacity.

    Returns:
        ``(start, end, ready, critical_pred, dir_busy, timeline_time, timeline_dir, timeline_rate, cut,
        timeline_entries)``: ``critical_pred[t]`` is the task whose end fixed ``t``'s start (a
        predecessor or the resource's previous task), -1 for none and for prefix tasks; ``dir_busy``
        ``(2L,)`` the seconds each direction carried a flow; with ``record``, the timeline of each
        direction's rate (bytes/s from ``timeline_time`` on, until its next entry), else empty: its
        first ``timeline_capacity`` entries, and ``timeline_entries`` counts them all (a caller whose
        capacity was short runs again with that count; the schedule does not depend on it).
    """
    n = duration.shape[0]
    start = np.zeros(n)
    end = np.zeros(n)
    ready = np.zeros(n)
    last_pred = np.full(n, -1, np.int64)
    crit = np.full(n, -1, np.int64)
    pending = indegree.copy()
    res_free = np.zeros(num_resources)
    res_last = np.full(num_resources, -1, np.int64)
    heap_t = np.empty(n, np.float64)
    heap_id = np.empty(n, np.int64)
    # tasks that become ready (or a flow task's next phase), queued for the heap at the top of the loop
    new_t = np.empty(n)
    new_id = np.empty(n, np.int64)
    nnew = 0
    size = 0
    done = 0
    # flows
    nfl = flow_bytes.shape[0]
    nd = dir_capacity.shape[0]
    flow_task = np.empty(nfl, np.int64)
    for t in range(n):
        for p in range(phase_ptr[t], phase_ptr[t + 1]):
            for f in range(phase_flow_ptr[p], phase_flow_ptr[p + 1]):
                flow_task[f] = t
    capped = False
    for f in range(nfl):
        if flow_cap[f] < np.inf:
            capped = True
    phase_of = np.full(n, -1, np.int64)
    # a flow task's resource (a communicator) runs its flow tasks one at a time, FIFO
    holder = np.full(num_resources, -1, np.int64)
    queue_head = np.full(num_resources, -1, np.int64)
    queue_tail = np.full(num_resources, -1, np.int64)
    queue_next = np.full(n, -1, np.int64)
    granted = np.zeros(n, np.bool_)
    left = np.zeros(n, np.int64)
    act = np.empty(nfl, np.int64)
    completed = np.empty(nfl, np.int64)
    nact = 0
    remaining = np.zeros(nfl)
    rate = np.zeros(nfl)
    finish = np.zeros(nfl)
    frozen = np.zeros(nfl, np.bool_)
    dir_n = np.zeros(nd, np.int64)
    dir_rem = np.zeros(nd)
    touched = np.empty(nd, np.int64)
    dir_head, slot_next, slot_prev, slot_flow, seeds, seeded, lone = _flow_lists(nd, nfl, flow_dirs.shape[0])
    nseed = 0
    nlone = 0
    dir_seen, flow_seen, flow_comp, comp_at, comp_fill, queue, sub = _reshare_scratch(nd, nfl)
    epoch = 0
    dir_active = np.zeros(nd, np.int64)
    dir_since = np.zeros(nd)
    dir_busy = np.zeros(nd)
    dir_rate = np.zeros(nd)
    dir_sum = np.zeros(nd)  # the rates of the flows in flight on each direction, from dir_stamp on
    dir_stamp = np.zeros(nd)
    # the timeline in arrays of a fixed capacity, counted past it (arrays that grew, reassigned in the
    # loop, would cost numba two atomic reference-count operations per array and iteration)
    tl_size = 0
    tl_cap = timeline_capacity if record else 0
    tl_time = np.empty(tl_cap)
    tl_dir = np.empty(tl_cap, np.int64)
    tl_rate = np.empty(tl_cap)
    no_time = np.zeros(0)
    no_dir = np.zeros(0, np.int64)
    no_rate = np.zeros(0)
    bounded = limit < np.inf and rest.shape[0] == n
    load = np.zeros(num_resources)
    if bounded:
        for t in range(n):
            if prefix[t] or res_ptr[t + 1] == res_ptr[t]:
                continue
            if phase_ptr[t + 1] > phase_ptr[t]:
                load[res[res_ptr[t]]] += shortest[t]
            else:
                for k in range(res_ptr[t], res_ptr[t + 1]):
                    load[res[k]] += duration[t]
        for x in range(num_resources):
            load[x] *= 1.0 - 1e-9
    # bytes each link direction has yet to carry (the flows of tasks not in the prefix)
    dir_left = np.zeros(nd)
    if bounded:
        for t in range(n):
            if prefix[t]:
                continue
            for p in range(phase_ptr[t], phase_ptr[t + 1]):
                for f in range(phase_flow_ptr[p], phase_flow_ptr[p + 1]):
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        dir_left[flow_dirs[j]] += flow_bytes[f]
        for d in range(nd):
            dir_left[d] *= 1.0 - 1e-9
    for t in range(n):
        if not prefix[t]:
            continue
        start[t] = prefix_start[t]
        end[t] = prefix_end[t]
        ready[t] = prefix_ready[t]
        for k in range(res_ptr[t], res_ptr[t + 1]):
            if end[t] >= res_free[res[k]]:
                res_free[res[k]] = end[t]
                res_last[res[k]] = t
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ[k]
            if end[t] > ready[v] or last_pred[v] < 0:
                ready[v] = max(ready[v], end[t])
                last_pred[v] = t
            pending[v] -= 1
        done += 1
    if bounded:
        for x in range(num_resources):
            if res_free[x] + load[x] > limit:
                return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
    for t in range(n):
        if not prefix[t] and pending[t] == 0:
            if bounded and ready[t] + rest[t] > limit:
                return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
            new_t[nnew], new_id[nnew] = ready[t], t
            nnew += 1
    now = 0.0
    next_finish = np.inf
    dirty = False
    while True:
        # The heap is inline, not helper calls: numba increments and decrements (atomically) the reference
        # count of every array passed to a helper that writes it, once per call, which cost more than the
        # heap itself (its comparison, _less, takes scalars only: no reference counts). The heap orders by
        # (time, id), so the order entries join it does not matter.
        for q in range(nnew):
            k = size
            heap_t[k], heap_id[k] = new_t[q], new_id[q]
            size += 1
            while k > 0:
                up = (k - 1) >> 1
                if _less(heap_t[k], heap_id[k], heap_t[up], heap_id[up]):
                    heap_t[k], heap_t[up] = heap_t[up], heap_t[k]
                    heap_id[k], heap_id[up] = heap_id[up], heap_id[k]
                    k = up
                else:
                    break
        nnew = 0
        head = heap_t[0] if size > 0 else np.inf
        # Rates are stale only for the future: tasks ready now are taken first, then rates recomputed once.
        if dirty and not head <= now:
            # fresh rates for the components the flows that started or ended since the last recompute touch
            epoch += 1
            nsub, nq = _reshare(
                act, nact, seeds, nseed, seeded, lone, nlone, epoch, dir_head, slot_next, slot_flow,
                flow_dir_ptr, flow_dirs, flow_cap, capped, dir_capacity, rate, frozen, dir_n, dir_rem,
                touched, dir_seen, flow_seen, flow_comp, comp_at, comp_fill, queue, sub,
            )  # fmt: skip
            nseed = 0
            nlone = 0
            next_finish = np.inf
            for k in range(nact):
                f = act[k]
                finish[f] = now + remaining[f] / rate[f]
                if finish[f] < next_finish:
                    next_finish = finish[f]
            if bounded or record:
                # the total rates of the directions reached (summed in flight order, as over all flows)
                for i in range(nq):
                    d = queue[i]
                    if bounded:
                        dir_left[d] -= dir_sum[d] * (now - dir_stamp[d])
                        dir_stamp[d] = now
                    dir_sum[d] = 0.0
                for k in range(nsub):  # a direction's flows: in one component, in flight order
                    f = sub[k]
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        dir_sum[flow_dirs[j]] += rate[f]
            if record:  # the directions of the recomputed flows, in order of first appearance
                for k in range(nact):
                    f = act[k]
                    if flow_seen[f] != epoch:
                        continue
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        d = flow_dirs[j]
                        if dir_seen[d] != epoch:
                            continue
                        dir_seen[d] = -epoch
                        if dir_sum[d] != dir_rate[d]:
                            dir_rate[d] = dir_sum[d]
                            if tl_size < tl_cap:
                                tl_time[tl_size], tl_dir[tl_size], tl_rate[tl_size] = now, d, dir_sum[d]
                            tl_size += 1
            dirty = False
        if nact > 0 and next_finish <= head:
            t_event = next_finish
            step = t_event - now
            now = t_event
            kept = 0
            ncompleted = 0
            next_finish = np.inf  # recomputed (dirty) before time moves on
            for k in range(nact):
                f = act[k]
                if finish[f] <= t_event:
                    completed[ncompleted] = f
                    ncompleted += 1
                else:
                    remaining[f] -= rate[f] * step
                    act[kept] = f
                    kept += 1
            nact = kept
            if bounded:
                for c in range(ncompleted):
                    f = completed[c]
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        d = flow_dirs[j]
                        dir_left[d] -= dir_sum[d] * (now - dir_stamp[d])
                        dir_stamp[d] = now
                for c in range(ncompleted):  # the directions whose load just changed (any subset is a valid check)
                    f = completed[c]
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        d = flow_dirs[j]
                        if now + dir_left[d] / dir_capacity[d] > limit:
                            return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
            dirty = True
            for c in range(ncompleted):
                f = completed[c]
                for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):  # _unlink, inline
                    d = flow_dirs[j]
                    before, after = slot_prev[j], slot_next[j]
                    if before >= 0:
                        slot_next[before] = after
                    else:
                        dir_head[d] = after
                    if after >= 0:
                        slot_prev[after] = before
                    if not seeded[d]:
                        seeded[d] = True
                        seeds[nseed] = d
                        nseed += 1
                for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                    d = flow_dirs[j]
                    dir_active[d] -= 1
                    if dir_active[d] == 0:
                        dir_busy[d] += now - dir_since[d]
                        if record and dir_rate[d] != 0.0:
                            dir_rate[d] = 0.0
                            if tl_size < tl_cap:
                                tl_time[tl_size], tl_dir[tl_size], tl_rate[tl_size] = now, d, 0.0
                            tl_size += 1
                t = flow_task[f]
                left[t] -= 1
                if left[t] > 0:
                    continue
                p = phase_of[t]
                if p + 1 < phase_ptr[t + 1]:
                    phase_of[t] = p + 1
                    new_t[nnew], new_id[nnew] = now + phase_latency[p], t
                    nnew += 1
                    continue
                fin = now + phase_latency[p]
                end[t] = fin
                if res_ptr[t + 1] > res_ptr[t]:  # hand the communicator to the next task waiting for it
                    x = res[res_ptr[t]]
                    nxt = queue_head[x]
                    holder[x] = nxt
                    if nxt >= 0:
                        queue_head[x] = queue_next[nxt]
                        granted[nxt] = True
                        crit[nxt] = t
                        new_t[nnew], new_id[nnew] = fin, nxt
                        nnew += 1
                for k in range(succ_ptr[t], succ_ptr[t + 1]):
                    v = succ[k]
                    if fin > ready[v] or last_pred[v] < 0:
                        ready[v] = max(ready[v], fin)
                        last_pred[v] = t
                    pending[v] -= 1
                    if pending[v] == 0:
                        if bounded and ready[v] + rest[v] > limit:
                            return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
                        new_t[nnew], new_id[nnew] = ready[v], v
                        nnew += 1
                done += 1
            continue
        if size == 0:
            break
        r = heap_t[0]
        t = heap_id[0]
        size -= 1
        heap_t[0], heap_id[0] = heap_t[size], heap_id[size]
        k = 0
        while 2 * k + 1 < size:
            child = 2 * k + 1
            right = child + 1
            if right < size and _less(heap_t[right], heap_id[right], heap_t[child], heap_id[child]):
                child = right
            if _less(heap_t[child], heap_id[child], heap_t[k], heap_id[k]):
                heap_t[k], heap_t[child] = heap_t[child], heap_t[k]
                heap_id[k], heap_id[child] = heap_id[child], heap_id[k]
                k = child
            else:
                break
        if phase_ptr[t + 1] > phase_ptr[t]:
            if phase_of[t] < 0:
                if granted[t]:
                    granted[t] = False
                else:
                    ready[t] = r
                    crit[t] = last_pred[t]
                    if res_ptr[t + 1] > res_ptr[t]:
                        x = res[res_ptr[t]]
                        if holder[x] >= 0:  # wait for the communicator
                            if queue_head[x] < 0:
                                queue_head[x] = t
                            else:
                                queue_next[queue_tail[x]] = t
                            queue_tail[x] = t
                            queue_next[t] = -1
                            continue
                        holder[x] = t
                if bounded:
                    if r + rest[t] > limit:
                        return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
                    if res_ptr[t + 1] > res_ptr[t]:
                        x = res[res_ptr[t]]
                        load[x] -= shortest[t] * (1.0 - 1e-9)
                        if r + shortest[t] + load[x] > limit:
                            return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
                phase_of[t] = phase_ptr[t]
                start[t] = r
            if r > now:
                step = r - now
                for k in range(nact):
                    f = act[k]
                    remaining[f] -= rate[f] * step
                now = r
            if bounded:
                p = phase_of[t]
                for f in range(phase_flow_ptr[p], phase_flow_ptr[p + 1]):
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        d = flow_dirs[j]
                        dir_left[d] -= dir_sum[d] * (now - dir_stamp[d])
                        dir_stamp[d] = now
                        if now + dir_left[d] / dir_capacity[d] > limit:
                            return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
            p = phase_of[t]
            for f in range(phase_flow_ptr[p], phase_flow_ptr[p + 1]):
                act[nact] = f
                nact += 1
                remaining[f] = flow_bytes[f]
                if flow_dir_ptr[f + 1] == flow_dir_ptr[f]:
                    lone[nlone] = f
                    nlone += 1
                for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):  # _link, inline
                    d = flow_dirs[j]
                    h = dir_head[d]
                    slot_next[j], slot_prev[j], slot_flow[j] = h, -1, f
                    if h >= 0:
                        slot_prev[h] = j
                    dir_head[d] = j
                    if not seeded[d]:
                        seeded[d] = True
                        seeds[nseed] = d
                        nseed += 1
                for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                    d = flow_dirs[j]
                    if dir_active[d] == 0:
                        dir_since[d] = now
                    dir_active[d] += 1
            left[t] = phase_flow_ptr[p + 1] - phase_flow_ptr[p]
            dirty = True
            continue
        s = r
        blocker = last_pred[t]
        for k in range(res_ptr[t], res_ptr[t + 1]):
            x = res[k]
            if res_free[x] > s:
                s = res_free[x]
                blocker = res_last[x]
        fin = s + duration[t]
        if bounded:
            if s + rest[t] > limit:
                return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
            for k in range(res_ptr[t], res_ptr[t + 1]):
                x = res[k]
                load[x] -= duration[t] * (1.0 - 1e-9)
                if fin + load[x] > limit:
                    return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
        start[t] = s
        end[t] = fin
        ready[t] = r
        crit[t] = blocker
        for k in range(res_ptr[t], res_ptr[t + 1]):
            res_free[res[k]] = fin
            res_last[res[k]] = t
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ[k]
            if fin > ready[v] or last_pred[v] < 0:
                ready[v] = max(ready[v], fin)
                last_pred[v] = t
            pending[v] -= 1
            if pending[v] == 0:
                if bounded and ready[v] + rest[v] > limit:
                    return start, end, ready, crit, dir_busy, no_time, no_dir, no_rate, True, 0
                new_t[nnew], new_id[nnew] = ready[v], v
                nnew += 1
        done += 1
    if done != n:
        raise ValueError("the task graph has a cycle")
    kept = min(tl_size, tl_cap)
    return start, end, ready, crit, dir_busy, tl_time[:kept], tl_dir[:kept], tl_rate[:kept], False, tl_size


@njit(cache=True)
def rest_bounds(  # type: ignore[no-untyped-def]
    duration,
    succ_ptr,
    succ,
    indegree,
    phase_ptr,
    phase_latency,
    phase_flow_ptr,
    flow_bytes,
    flow_cap,
    flow_dir_ptr,
    flow_dirs,
    dir_capacity,
):
    """``(rest, shortest)``, (T,) each: a lower bound on ``makespan - start[t]`` for every schedule
    :func:`schedule_flows` makes, and each task's shortest duration.

    A task lasts at least its shortest duration: a fixed task its ``duration``; a flow task the sum
    over its phases of the phase latency plus its slowest flow alone on its narrowest direction
    (or at its cap). After it, the makespan is at least the longest chain of such durations through
    its successors (waiting for resources and sharing links only add to it). Rounded down by one
    part in 10^9 so that floating-point rounding never makes the bound exceed a real schedule.
    """
    n = duration.shape[0]
    shortest = duration.copy()
    for t in range(n):
        if phase_ptr[t + 1] > phase_ptr[t]:
            total = 0.0
            for p in range(phase_ptr[t], phase_ptr[t + 1]):
                slowest = 0.0
                for f in range(phase_flow_ptr[p], phase_flow_ptr[p + 1]):
                    r = flow_cap[f]
                    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        c = dir_capacity[flow_dirs[j]]
                        if c < r:
                            r = c
                    if r < np.inf:
                        x = flow_bytes[f] / r
                        if x > slowest:
                            slowest = x
                total += phase_latency[p] + slowest
            shortest[t] = total
    # Kahn's order forwards, then the longest chains backwards.
    order = np.empty(n, np.int64)
    pending = indegree.copy()
    head = 0
    tail = 0
    for t in range(n):
        if pending[t] == 0:
            order[tail] = t
            tail += 1
    while head < tail:
        t = order[head]
        head += 1
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ[k]
            pending[v] -= 1
            if pending[v] == 0:
                order[tail] = v
                tail += 1
    if tail != n:
        raise ValueError("the task graph has a cycle")
    rest = np.zeros(n)
    for i in range(n - 1, -1, -1):
        t = order[i]
        after = 0.0
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            if rest[succ[k]] > after:
                after = rest[succ[k]]
        rest[t] = shortest[t] + after
    for t in range(n):
        rest[t] *= 1.0 - 1e-9
    return rest, shortest


@njit(cache=True)
def schedule_from(  # type: ignore[no-untyped-def]
    duration,
    res_ptr,
    res,
    succ_ptr,
    succ,
    indegree,
    num_resources,
    prefix,
    prefix_ready,
    prefix_start,
    prefix_end,
):
    """:func:`schedule`, resumed after a known prefix (:func:`schedule_flows` without flows).

    Returns ``(start, end, ready, critical_pred)``; ``critical_pred`` is -1 for prefix tasks.
    """
    pp, pl, pf, fb, fc, fd, fds, cap = no_flows(duration.shape[0])
    out = schedule_flows(
        duration,
        res_ptr,
        res,
        succ_ptr,
        succ,
        indegree,
        num_resources,
        pp,
        pl,
        pf,
        fb,
        fc,
        fd,
        fds,
        cap,
        prefix,
        prefix_ready,
        prefix_start,
        prefix_end,
        False,
        np.inf,
        np.zeros(0),
        np.zeros(0),
    )
    return out[0], out[1], out[2], out[3]


@njit(cache=True)
def route_arrays(slots, moving, start, length, dirs, latency):  # type: ignore[no-untyped-def]
    """The flows of point-to-point transfers along their routes, in one pass over the route table.

    ``slots`` (P,) each transfer's route slot; ``moving`` (M,) the transfers that carry bytes;
    ``start``, ``length``, ``dirs``, ``latency``: the route table (a slot's directions are
    ``dirs[start[s] : start[s] + length[s]]``). Returns ``(flow_dirs (sum of lengths,), dir_ptr (M + 1,),
    latency_s (M,), first_dir (P,))``: the moving transfers' directions concatenated, their offsets
    and route latencies, and every transfer's first direction (-1 for a route that crosses no link).
    """
    P = slots.shape[0]
    M = moving.shape[0]
    first = np.empty(P, np.int64)
    for k in range(P):
        s = slots[k]
        first[k] = dirs[start[s]] if length[s] > 0 else -1
    ptr = np.empty(M + 1, np.int64)
    ptr[0] = 0
    lat = np.empty(M)
    for i in range(M):
        s = slots[moving[i]]
        ptr[i + 1] = ptr[i] + length[s]
        lat[i] = latency[s]
    out = np.empty(ptr[M], np.int64)
    for i in range(M):
        s = slots[moving[i]]
        b = start[s]
        o = ptr[i]
        for k in range(length[s]):
            out[o + k] = dirs[b + k]
    return out, ptr, lat, first


@njit(cache=True)
def drain(flow_bytes, flow_dir_ptr, flow_dirs, dir_capacity):  # type: ignore[no-untyped-def]
    """Time for flows that all start at 0 to drain under max-min sharing (rates recomputed as they end).

    ``flow_bytes`` (F,); flow ``f`` crosses ``flow_dirs[flow_dir_ptr[f] : flow_dir_ptr[f + 1]]``,
    ``dir_capacity`` (2L,) bytes/s. When flows end, only the components they leave (:func:`_reshare`)
    get new rates; the others' rates are unchanged (to the bit), so the result is that of recomputing
    every flow's rate each time.
    """
    nfl = flow_bytes.shape[0]
    nd = dir_capacity.shape[0]
    act = np.empty(nfl, np.int64)
    nact = 0
    dir_head, slot_next, slot_prev, slot_flow, seeds, seeded, lone = _flow_lists(nd, nfl, flow_dirs.shape[0])
    nseed = 0
    nlone = 0
    for f in range(nfl):
        if flow_bytes[f] > 0:
            act[nact] = f
            nact += 1
            nseed = _link(f, flow_dir_ptr, flow_dirs, dir_head, slot_next, slot_prev, slot_flow, seeds, nseed, seeded)
            if flow_dir_ptr[f + 1] == flow_dir_ptr[f]:
                lone[nlone] = f
                nlone += 1
    remaining = flow_bytes.copy()
    rate = np.zeros(nfl)
    frozen = np.zeros(nfl, np.bool_)
    dir_n = np.zeros(nd, np.int64)
    dir_rem = np.zeros(nd)
    touched = np.empty(nd, np.int64)
    caps = np.full(nfl, np.inf)
    dir_seen, flow_seen, flow_comp, comp_at, comp_fill, queue, sub = _reshare_scratch(nd, nfl)
    epoch = 0
    now = 0.0
    while nact > 0:
        epoch += 1
        _reshare(
            act, nact, seeds, nseed, seeded, lone, nlone, epoch, dir_head, slot_next, slot_flow, flow_dir_ptr,
            flow_dirs, caps, False, dir_capacity, rate, frozen, dir_n, dir_rem, touched, dir_seen, flow_seen,
            flow_comp, comp_at, comp_fill, queue, sub,
        )  # fmt: skip
        nseed = 0
        nlone = 0
        step = np.inf
        for k in range(nact):
            f = act[k]
            if remaining[f] / rate[f] < step:
                step = remaining[f] / rate[f]
        now += step
        kept = 0
        for k in range(nact):
            f = act[k]
            if remaining[f] / rate[f] > step:
                remaining[f] -= rate[f] * step
                act[kept] = f
                kept += 1
            else:
                nseed = _unlink(f, flow_dir_ptr, flow_dirs, dir_head, slot_next, slot_prev, seeds, nseed, seeded)
        nact = kept
    return now


@njit(cache=True)
def _reshare_scratch(nd, nfl):  # type: ignore[no-untyped-def]
    """:func:`_reshare`'s scratch for ``nd`` directions and ``nfl`` flows: ``(dir_seen, flow_seen,
    flow_comp, comp_at, comp_fill, queue, sub)``; the ``*_seen`` stamps start at 0 (epochs from 1)."""
    dir_seen = np.zeros(nd, np.int64)
    flow_seen = np.zeros(nfl, np.int64)
    flow_comp = np.empty(nfl, np.int64)
    comp_at = np.empty(nd + nfl + 1, np.int64)
    comp_fill = np.empty(nd + nfl + 1, np.int64)
    queue = np.empty(max(nd, 1), np.int64)
    sub = np.empty(max(nfl, 1), np.int64)
    return dir_seen, flow_seen, flow_comp, comp_at, comp_fill, queue, sub


@njit(cache=True)
def _flow_lists(nd, nfl, nslots):  # type: ignore[no-untyped-def]
    """Empty per-direction lists of the flows in flight, for :func:`_link`, :func:`_unlink` and :func:`_reshare`.

    Returns ``(dir_head, slot_next, slot_prev, slot_flow, seeds, seeded, lone)``: ``dir_head`` (nd,)
    the first slot of each direction's linked list (-1: none), the slot arrays (nslots,) (slot ``j``
    is ``flow_dirs[j]`` of its flow), ``seeds`` (nd,) and ``seeded`` (nd,) the directions whose flows
    changed since the last recompute, ``lone`` (nfl,) the changed flows that cross no direction.
    """
    nslot = max(nslots, 1)
    dir_head = np.full(nd, -1, np.int64)
    slot_next = np.empty(nslot, np.int64)
    slot_prev = np.empty(nslot, np.int64)
    slot_flow = np.empty(nslot, np.int64)
    seeds = np.empty(nd, np.int64)
    seeded = np.zeros(nd, np.bool_)
    lone = np.empty(max(nfl, 1), np.int64)
    return dir_head, slot_next, slot_prev, slot_flow, seeds, seeded, lone


@njit(cache=True)
def _link(f, flow_dir_ptr, flow_dirs, dir_head, slot_next, slot_prev, slot_flow, seeds, nseed, seeded):  # type: ignore[no-untyped-def]
    """Put flow ``f`` in flight: its slots ``j`` (``flow_dirs[j]``, ``j`` in its range) at the head of
    each direction's list (``dir_head`` (2L,), ``slot_next``/``slot_prev``/``slot_flow`` (len(flow_dirs),),
    -1 ends a list); its directions join ``seeds[:nseed]`` (once each, ``seeded`` (2L,)). Returns ``nseed``."""
    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
        d = flow_dirs[j]
        h = dir_head[d]
        slot_next[j] = h
        slot_prev[j] = -1
        if h >= 0:
            slot_prev[h] = j
        dir_head[d] = j
        slot_flow[j] = f
        nseed = _seed(d, seeds, nseed, seeded)
    return nseed


@njit(cache=True)
def _unlink(f, flow_dir_ptr, flow_dirs, dir_head, slot_next, slot_prev, seeds, nseed, seeded):  # type: ignore[no-untyped-def]
    """Take flow ``f`` out of its directions' lists (see :func:`_link`); they join the seeds. Returns ``nseed``."""
    for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
        d = flow_dirs[j]
        prev = slot_prev[j]
        nxt = slot_next[j]
        if prev >= 0:
            slot_next[prev] = nxt
        else:
            dir_head[d] = nxt
        if nxt >= 0:
            slot_prev[nxt] = prev
        nseed = _seed(d, seeds, nseed, seeded)
    return nseed


@njit(cache=True)
def _seed(d, seeds, nseed, seeded):  # type: ignore[no-untyped-def]
    """Direction ``d`` joins ``seeds[:nseed]`` unless it is there already (``seeded``). Returns ``nseed``."""
    if not seeded[d]:
        seeded[d] = True
        seeds[nseed] = d
        nseed += 1
    return nseed


@njit(cache=True)
def _reshare(  # type: ignore[no-untyped-def]
    act,
    nact,
    seeds,
    nseed,
    seeded,
    lone,
    nlone,
    epoch,
    dir_head,
    slot_next,
    slot_flow,
    flow_dir_ptr,
    flow_dirs,
    flow_cap,
    capped,
    dir_capacity,
    rate,
    frozen,
    dir_n,
    dir_rem,
    touched,
    dir_seen,
    flow_seen,
    flow_comp,
    comp_at,
    comp_fill,
    queue,
    sub,
):
    """Max-min fair rates anew for the components of the flows in flight that the directions
    ``seeds[:nseed]`` reach, and for the flows ``lone[:nlone]`` that cross no direction.

    A component: flows in flight ``act[:nact]`` linked through shared directions, each direction's
    flows in flight in its list of :func:`_link` (``dir_head`` (2L,), ``slot_next``/``slot_flow``
    (len(flow_dirs),)). Breadth first from each seed, over direction -> its flows -> their
    directions, marks each direction reached (``dir_seen[d] = epoch``, listed in ``queue[:nq]``)
    and each flow (``flow_seen[f] = epoch``, its component in ``flow_comp``, (F,) both); no other
    flow's rate changes. Each component's flows, in ``act`` order, go to ``sub`` (components one
    after the other, ``sub[:nsub]``; ``comp_at``, ``comp_fill`` (2L + F + 1,) scratch).

    Each component then gets its max-min fair rates by progressive filling: the direction with the
    smallest fair share (remaining capacity over unfrozen flows) fixes its unfrozen flows at that
    share, until every flow is fixed; a flow cap below every share (read when ``capped`` or when no
    direction is left) fixes that flow at its cap. Filling the components one by one gives the
    rates of filling all flows at once, to the bit: a component's shares change only when its own
    directions are picked, and in ``act`` order its directions come up in the order a fill of all
    flows visits them (equal shares go to the same direction first).

    Clears ``seeded``; of the scratch, ``dir_n`` (2L,) must be 0 and comes back 0 (``dir_rem``,
    ``touched`` (2L,) and ``frozen`` (F,) are set afresh); ``epoch`` must exceed every earlier
    call's (``dir_seen``, ``flow_seen`` start at 0).
    Returns ``(nsub, nq)``.
    """
    ncomp = 0
    nq = 0
    for i in range(nseed):
        s = seeds[i]
        seeded[s] = False
        if dir_seen[s] == epoch:
            continue
        dir_seen[s] = epoch
        head = nq
        queue[nq] = s
        nq += 1
        found = 0
        while head < nq:
            d = queue[head]
            head += 1
            j = dir_head[d]
            while j >= 0:
                f = slot_flow[j]
                if flow_seen[f] != epoch:
                    flow_seen[f] = epoch
                    flow_comp[f] = ncomp
                    found += 1
                    for jj in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        e = flow_dirs[jj]
                        if dir_seen[e] != epoch:
                            dir_seen[e] = epoch
                            queue[nq] = e
                            nq += 1
                j = slot_next[j]
        if found > 0:
            comp_fill[ncomp] = found
            ncomp += 1
    for i in range(nlone):
        f = lone[i]
        flow_seen[f] = epoch
        flow_comp[f] = ncomp
        comp_fill[ncomp] = 1
        ncomp += 1
    pos = 0
    for c in range(ncomp):
        comp_at[c] = pos
        pos += comp_fill[c]
        comp_fill[c] = comp_at[c]
    comp_at[ncomp] = pos
    for k in range(nact):
        f = act[k]
        if flow_seen[f] == epoch:
            c = flow_comp[f]
            sub[comp_fill[c]] = f
            comp_fill[c] += 1
    for c in range(ncomp):
        lo = comp_at[c]
        hi = comp_at[c + 1]
        nt = 0
        for k in range(lo, hi):
            f = sub[k]
            frozen[f] = False
            for j in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                d = flow_dirs[j]
                if dir_n[d] == 0:
                    touched[nt] = d
                    nt += 1
                    dir_rem[d] = dir_capacity[d]
                dir_n[d] += 1
        left = hi - lo
        while left > 0:
            share = np.inf
            bottleneck = -1
            for i in range(nt):
                d = touched[i]
                if dir_n[d] > 0:
                    x = dir_rem[d] / dir_n[d]
                    if x < share:
                        share = x
                        bottleneck = d
            cap_flow = -1
            if capped or bottleneck < 0:
                for k in range(lo, hi):
                    f = sub[k]
                    if not frozen[f] and (flow_cap[f] < share or (bottleneck < 0 and cap_flow < 0)):
                        share = flow_cap[f]
                        cap_flow = f
            if cap_flow >= 0:
                rate[cap_flow] = share  # _freeze, inline (see the heap in schedule_flows)
                frozen[cap_flow] = True
                for jj in range(flow_dir_ptr[cap_flow], flow_dir_ptr[cap_flow + 1]):
                    dir_rem[flow_dirs[jj]] -= share
                    dir_n[flow_dirs[jj]] -= 1
                left -= 1
                continue
            j = dir_head[bottleneck]
            while j >= 0:
                f = slot_flow[j]
                if not frozen[f]:
                    rate[f] = share
                    frozen[f] = True
                    for jj in range(flow_dir_ptr[f], flow_dir_ptr[f + 1]):
                        dir_rem[flow_dirs[jj]] -= share
                        dir_n[flow_dirs[jj]] -= 1
                    left -= 1
                j = slot_next[j]
        for i in range(nt):
            dir_n[touched[i]] = 0
    return pos, nq


@njit(cache=True)
def _less(ta, ia, tb, ib):  # type: ignore[no-untyped-def]
    return ta < tb or (ta == tb and ia < ib)


@njit(cache=True)
def _heap_push(heap_t, heap_id, size, t, i):  # type: ignore[no-untyped-def]
    k = size
    heap_t[k] = t
    heap_id[k] = i
    while k > 0:
        parent = (k - 1) >> 1
        if _less(heap_t[k], heap_id[k], heap_t[parent], heap_id[parent]):
            heap_t[k], heap_t[parent] = heap_t[parent], heap_t[k]
            heap_id[k], heap_id[parent] = heap_id[parent], heap_id[k]
            k = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _heap_pop(heap_t, heap_id, size):  # type: ignore[no-untyped-def]
    size -= 1
    heap_t[0] = heap_t[size]
    heap_id[0] = heap_id[size]
    k = 0
    while True:
        left = 2 * k + 1
        if left >= size:
            break
        child = left
        right = left + 1
        if right < size and _less(heap_t[right], heap_id[right], heap_t[left], heap_id[left]):
            child = right
        if _less(heap_t[child], heap_id[child], heap_t[k], heap_id[k]):
            heap_t[k], heap_t[child] = heap_t[child], heap_t[k]
            heap_id[k], heap_id[child] = heap_id[child], heap_id[k]
            k = child
        else:
            break
    return size


@njit(cache=True)
def critical_chain(critical_pred, end):  # type: ignore[no-untyped-def]
    """Task ids of the critical path, first to last, ending at the task that ends last."""
    if end.shape[0] == 0:
        return np.zeros(0, np.int64)
    t = np.argmax(end)
    length = 0
    k = t
    while k >= 0:
        length += 1
        k = critical_pred[k]
    chain = np.empty(length, np.int64)
    k = t
    for i in range(length - 1, -1, -1):
        chain[i] = k
        k = critical_pred[k]
    return chain


@njit(cache=True)
def sweep(order, time, device, delta, num_devices):  # type: ignore[no-untyped-def]
    """Peak running sum of ``delta`` per device in time order, frees before allocations on ties.

    ``order`` sorts ``time`` (any order among equal times).

    Events at one moment count together: a device's level after all of them is its candidate
    peak (frees first means the level only rises within a tie). Each device's levels are summed
    on their own, so the result for a device does not depend on the other devices' events.
    Shapes: ``time``, ``device``, ``delta`` ``(E,)``; returns ``(num_devices,)``.
    """
    level = np.zeros(num_devices)
    peak = np.zeros(num_devices)
    touched = np.empty(num_devices, np.int64)
    mark = np.zeros(num_devices, np.bool_)
    n = order.shape[0]
    k = 0
    while k < n:
        t = time[order[k]]
        count = 0
        while k < n and time[order[k]] == t:
            e = order[k]
            d = device[e]
            level[d] += delta[e]
            if not mark[d]:
                mark[d] = True
                touched[count] = d
                count += 1
            k += 1
        for i in range(count):
            d = touched[i]
            mark[d] = False
            if level[d] > peak[d]:
                peak[d] = level[d]
    return peak


@njit(cache=True)
def fill_buckets(group, nbytes, alone, cap):  # type: ignore[no-untyped-def]
    """Gradient buckets: shards sorted by group (each group's in backward order) fill buckets in turn;
    a bucket closes once it holds at least ``cap`` bytes, and at the end of its group. A shard marked
    ``alone`` (``all_reduce_per_tensor``) is a bucket of its own.

    Returns ``(first, total, ordinal)``: per bucket, its first shard (index into the sorted shards),
    its bytes, and its index among its group's buckets. Shapes: ``(A,)`` in, ``(B,)`` out.
    """
    n = group.shape[0]
    first = np.empty(n, np.int64)
    total = np.empty(n)
    ordinal = np.empty(n, np.int64)
    count = 0
    k = 0
    is_open = False
    for i in range(n):
        if i > 0 and group[i] != group[i - 1]:
            is_open = False
            k = 0
        if alone[i]:
            is_open = False
        if not is_open:
            first[count] = i
            total[count] = 0.0
            ordinal[count] = k
            k += 1
            count += 1
            is_open = True
        total[count - 1] += nbytes[i]
        if total[count - 1] >= cap or alone[i]:
            is_open = False
    return first[:count], total[:count], ordinal[:count]


@njit(cache=True)
def interval_rates(dirs, t0, t1, nbytes, num_dirs):  # type: ignore[no-untyped-def]
    """Busy time and rate over time per link direction of fixed-time transfers.

    Record ``k`` puts ``nbytes[k]`` on direction ``dirs[k]`` evenly over ``[t0[k], t1[k]]``. Returns
    ``(busy, timeline_time, timeline_dir, timeline_rate)`` as :func:`schedule_flows` does: ``busy``
    ``(num_dirs,)`` the length of the union of each direction's intervals.
    """
    n = dirs.shape[0]
    ev_dir = np.empty(2 * n, np.int64)
    ev_time = np.empty(2 * n)
    ev_rate = np.empty(2 * n)
    ev_count = np.empty(2 * n, np.int64)
    m = 0
    for k in range(n):
        if t1[k] > t0[k]:
            r = nbytes[k] / (t1[k] - t0[k])
            ev_dir[m] = dirs[k]
            ev_time[m] = t0[k]
            ev_rate[m] = r
            ev_count[m] = 1
            ev_dir[m + 1] = dirs[k]
            ev_time[m + 1] = t1[k]
            ev_rate[m + 1] = -r
            ev_count[m + 1] = -1
            m += 2
    # sort by (direction, time): time first, then a stable sort by direction
    order = np.argsort(ev_time[:m], kind="mergesort")
    order = order[np.argsort(ev_dir[:m][order], kind="mergesort")]
    busy = np.zeros(num_dirs)
    tl_size = 0  # at most one entry per event
    tl_time = np.empty(m)
    tl_dir = np.empty(m, np.int64)
    tl_rate = np.empty(m)
    i = 0
    while i < m:
        d = ev_dir[order[i]]
        rate = 0.0
        active = 0
        last_t = 0.0
        last_rate = 0.0
        while i < m and ev_dir[order[i]] == d:
            t = ev_time[order[i]]
            if active > 0:
                busy[d] += t - last_t
            while i < m and ev_dir[order[i]] == d and ev_time[order[i]] == t:
                rate += ev_rate[order[i]]
                active += ev_count[order[i]]
                i += 1
            if active == 0:
                rate = 0.0
            if rate != last_rate:
                tl_time[tl_size], tl_dir[tl_size], tl_rate[tl_size] = t, d, rate
                tl_size += 1
                last_rate = rate
            last_t = t
    return busy, tl_time[:tl_size], tl_dir[:tl_size], tl_rate[:tl_size]


# ------------------------------------------------------------------------------------------ routing
@njit(cache=True)
def _label_less(a, b, e_lat, e_hops, e_node, e_parent, rank):  # type: ignore[no-untyped-def]
    """Whether entry ``a``'s label (latency, hops, node-name ranks from the source) is below ``b``'s."""
    if e_lat[a] != e_lat[b]:
        return e_lat[a] < e_lat[b]
    if e_hops[a] != e_hops[b]:
        return e_hops[a] < e_hops[b]
    # equal depths: walk both chains up together; the difference nearest the source decides
    less = False
    x, y = a, b
    while x != y:
        ra, rb = rank[e_node[x]], rank[e_node[y]]
        if ra != rb:
            less = ra < rb
        x, y = e_parent[x], e_parent[y]
    return less


@njit(cache=True)
def _entry_push(heap, size, e, e_lat, e_hops, e_node, e_parent, rank):  # type: ignore[no-untyped-def]
    k = size
    heap[k] = e
    while k > 0:
        parent = (k - 1) >> 1
        if _label_less(heap[k], heap[parent], e_lat, e_hops, e_node, e_parent, rank):
            heap[k], heap[parent] = heap[parent], heap[k]
            k = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _entry_pop(heap, size, e_lat, e_hops, e_node, e_parent, rank):  # type: ignore[no-untyped-def]
    size -= 1
    heap[0] = heap[size]
    k = 0
    while True:
        left = 2 * k + 1
        if left >= size:
            break
        child = left
        right = left + 1
        if right < size and _label_less(heap[right], heap[left], e_lat, e_hops, e_node, e_parent, rank):
            child = right
        if _label_less(heap[child], heap[k], e_lat, e_hops, e_node, e_parent, rank):
            heap[k], heap[child] = heap[child], heap[k]
            k = child
        else:
            break
    return size


@njit(cache=True)
def _widest(s, adj_ptr, adj_node, adj_bw):  # type: ignore[no-untyped-def]
    """Maximum bottleneck bandwidth from node ``s`` to every node (0: unreachable, ``inf``: ``s``)."""
    n = adj_ptr.shape[0] - 1
    best = np.zeros(n)
    best[s] = np.inf
    heap_w = np.empty(adj_node.shape[0] + 1)
    heap_v = np.empty(adj_node.shape[0] + 1, np.int64)
    size = _heap_push(heap_w, heap_v, 0, -np.inf, s)
    while size:
        w, u = -heap_w[0], heap_v[0]
        size = _heap_pop(heap_w, heap_v, size)
        if w < best[u]:
            continue
        for j in range(adj_ptr[u], adj_ptr[u + 1]):
            v = adj_node[j]
            width = min(w, adj_bw[j])
            if width > best[v]:
                best[v] = width
                size = _heap_push(heap_w, heap_v, size, -width, v)
    return best


@njit(cache=True)
def routes_from(s, num_devices, adj_ptr, adj_node, adj_link, adj_bw, adj_lat, rank, link_a, link_bw):  # type: ignore[no-untyped-def]
    """The routes from device ``s`` to every device, by the topology's routing rule.

    The rule of :meth:`placement_rl.topology.DeviceTopology.route` (its ``_labels_from``), compiled:
    the widest-path bandwidth ``W(t)`` of every node first; then, for each distinct ``W`` among the
    devices, a Dijkstra on (latency, hops, node-name ranks along the path) restricted to links of
    bandwidth >= ``W`` settles the devices with that ``W``. Labels are compared exactly as the Python
    tuples are, so the routes are the same (a test compares them on every preset).

    Args:
        s: the source device (node index; devices are nodes ``0 .. D-1``).
        num_devices: ``D``.
        adj_ptr: ``(N + 1,)`` int64 CSR offsets of each node's neighbours, in the topology's order.
        adj_node, adj_link, adj_bw, adj_lat: ``(2L,)`` neighbour node, link index, bandwidth (bytes/s)
            and latency (s) of each adjacency.
        rank: ``(N,)`` int64 position of each node's name in name order.
        link_a: ``(L,)`` int64 node index of each link's ``a`` end.
        link_bw: ``(L,)`` float64 bandwidth of each link.

    Returns:
        ``(bw, lat, length, dirs, bottleneck)``: ``(D,)`` route bandwidth in bytes/s (``inf`` to
        ``s``), latency in seconds, number of links; the link directions of all routes concatenated
        in destination order, each in path order (direction ``2k`` crosses link ``k`` from its ``a``
        end, ``2k + 1`` from its ``b`` end); ``(D,)`` the first narrowest link of each route (-1 to ``s``).
    """
    n_nodes = adj_ptr.shape[0] - 1
    D = num_devices
    W = _widest(s, adj_ptr, adj_node, adj_bw)
    bw = np.full(D, np.inf)
    lat = np.zeros(D)
    length = np.zeros(D, np.int64)
    bottleneck = np.full(D, -1, np.int64)
    start = np.zeros(D, np.int64)
    tmp = np.empty(max(4 * D, 16), np.int64)
    used = 0
    # the distinct widths of the devices other than s
    widths = np.unique(W[:D])
    cap = adj_node.shape[0] + 1
    e_node = np.empty(cap, np.int64)
    e_parent = np.empty(cap, np.int64)
    e_link = np.empty(cap, np.int64)
    e_lat = np.empty(cap)
    e_hops = np.empty(cap, np.int64)
    heap = np.empty(cap, np.int64)
    best = np.empty(n_nodes, np.int64)
    settled = np.zeros(n_nodes, np.bool_)
    for w in widths:
        if w == np.inf or w <= 0:
            continue
        remaining = 0
        for t in range(D):
            if t != s and W[t] == w:
                remaining += 1
        best[:] = -1
        settled[:] = False
        e_node[0], e_parent[0], e_link[0], e_lat[0], e_hops[0] = s, -1, -1, 0.0, 0
        count = 1
        best[s] = 0
        size = _entry_push(heap, 0, 0, e_lat, e_hops, e_node, e_parent, rank)
        while size and remaining:
            e = heap[0]
            size = _entry_pop(heap, size, e_lat, e_hops, e_node, e_parent, rank)
            u = e_node[e]
            if settled[u]:
                continue
            settled[u] = True
            if u < D and u != s and W[u] == w:
                remaining -= 1
                hops = e_hops[e]
                if used + hops > tmp.shape[0]:
                    grown = np.empty(max(2 * tmp.shape[0], used + hops), np.int64)
                    grown[:used] = tmp[:used]
                    tmp = grown
                start[u] = used
                length[u] = hops
                bw[u] = w
                lat[u] = e_lat[e]
                x = e
                narrow = -1
                for i in range(hops - 1, -1, -1):
                    p = e_parent[x]
                    k = e_link[x]
                    tmp[used + i] = 2 * k + (0 if link_a[k] == e_node[p] else 1)
                    if narrow < 0 or link_bw[k] <= link_bw[narrow]:  # walking backwards: <= keeps the first
                        narrow = k
                    x = p
                bottleneck[u] = narrow
                used += hops
            for j in range(adj_ptr[u], adj_ptr[u + 1]):
                v = adj_node[j]
                if adj_bw[j] < w or settled[v]:
                    continue
                c = count
                e_node[c], e_parent[c], e_link[c] = v, e, adj_link[j]
                e_lat[c] = e_lat[e] + adj_lat[j]
                e_hops[c] = e_hops[e] + 1
                if best[v] < 0 or _label_less(c, best[v], e_lat, e_hops, e_node, e_parent, rank):
                    best[v] = c
                    count += 1
                    size = _entry_push(heap, size, c, e_lat, e_hops, e_node, e_parent, rank)
    dirs = np.empty(used, np.int64)
    pos = 0
    for t in range(D):
        dirs[pos : pos + length[t]] = tmp[start[t] : start[t] + length[t]]
        pos += length[t]
    return bw, lat, length, dirs, bottleneck
