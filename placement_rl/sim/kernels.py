"""Numba kernels of the simulator: task-graph construction and list scheduling.

These are the simulator's inner loops (FlexFlow sec. 5.1-5.2); :mod:`placement_rl.sim.simulator` prepares
their flat arrays and turns the results into a :class:`~placement_rl.sim.result.SimResult`. Each kernel
is deterministic and allocation-light; ``cache=True`` keeps compiled code between processes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_RANK = 8


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
def _edge(  # type: ignore[no-untyped-def]
    i_dev,
    i_replicas,
    i_prod_lo,
    i_prod_hi,
    j_dev,
    j_replicas,
    j_need_lo,
    j_need_hi,
    j_samp_lo,
    j_samp_hi,
    rank,
    same_layout,
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
    Writes only when ``fill``; returns the counts ``(kd, kc)`` after this edge."""
    box_lo = np.zeros(MAX_RANK)
    box_hi = np.ones(MAX_RANK)
    full_lo = np.zeros(MAX_RANK)
    full_hi = np.ones(MAX_RANK)
    p_i = i_dev.shape[0] // i_replicas
    axis = sample_axis if prod_box else -1
    for q in range(j_dev.shape[0]):
        _consumer_box(
            q // j_replicas, rank, same_layout, axis, j_need_lo, j_need_hi, j_samp_lo, j_samp_hi, box_lo, box_hi
        )
        for p in range(p_i):
            if prod_box:
                frac = _overlap(i_prod_lo[p], i_prod_hi[p], box_lo, box_hi, rank)
            else:
                frac = _overlap(full_lo, full_hi, box_lo, box_hi, rank)
            if frac <= 0.0:
                continue
            src = _pick_replica(p * i_replicas, i_replicas, i_dev, j_dev[q], q)
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
def build_transfers(  # type: ignore[no-untyped-def]
    e_src,
    e_dst,
    e_bytes,
    e_rank,
    e_same,
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
                task_dev[op_task_ptr[j] : op_task_ptr[j + 1]],
                op_replicas[j],
                need_lo[op_part_ptr[j] : op_part_ptr[j + 1]],
                need_hi[op_part_ptr[j] : op_part_ptr[j + 1]],
                samp_lo[op_part_ptr[j] : op_part_ptr[j + 1]],
                samp_hi[op_part_ptr[j] : op_part_ptr[j + 1]],
                e_rank[e],
                e_same[e],
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
    j_dev,
    j_replicas,
    j_need_lo,
    j_need_hi,
    j_samp_lo,
    j_samp_hi,
    rank,
    same_layout,
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
        j_dev,
        j_replicas,
        j_need_lo,
        j_need_hi,
        j_samp_lo,
        j_samp_hi,
        rank,
        same_layout,
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
        j_dev,
        j_replicas,
        j_need_lo,
        j_need_hi,
        j_samp_lo,
        j_samp_hi,
        rank,
        same_layout,
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
def schedule(duration, res_ptr, res, succ_ptr, succ, indegree, num_resources):  # type: ignore[no-untyped-def]
    """FlexFlow's simulation (sec. 5.2): a global queue ordered by ready time, FIFO per resource.

    A task is ready when all its predecessors have ended; it starts when it is ready and all of its
    resources (a device, or every link direction a transfer crosses) are free, in the order tasks
    became ready (ties by task id). Returns ``(start, end, critical_pred)`` where ``critical_pred[t]``
    is the task whose end fixed ``t``'s start (a predecessor or the resource's previous task), -1
    for none.
    """
    n = duration.shape[0]
    none = np.zeros(n, np.bool_)
    zeros = np.zeros(n)
    start, end, _, crit = schedule_from(
        duration, res_ptr, res, succ_ptr, succ, indegree, num_resources, none, zeros, zeros, zeros
    )
    return start, end, crit


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
    """:func:`schedule`, resumed after a known prefix (delta simulation).

    ``prefix[t]`` marks tasks whose times are already known (``prefix_*``): every task that becomes
    ready before some time ``t0`` and whose predecessors and resources are unchanged. They are
    replayed (resources end busy at their last end, successors are credited), then the queue runs
    on for the others exactly as a full run would, because a full run pops every prefix task first.
    Returns ``(start, end, ready, critical_pred)``; ``critical_pred`` is -1 for prefix tasks.
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
    size = 0
    done = 0
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
    for t in range(n):
        if not prefix[t] and pending[t] == 0:
            size = _heap_push(heap_t, heap_id, size, ready[t], t)
    while size > 0:
        r = heap_t[0]
        t = heap_id[0]
        size = _heap_pop(heap_t, heap_id, size)
        s = r
        blocker = last_pred[t]
        for k in range(res_ptr[t], res_ptr[t + 1]):
            x = res[k]
            if res_free[x] > s:
                s = res_free[x]
                blocker = res_last[x]
        start[t] = s
        f = s + duration[t]
        end[t] = f
        ready[t] = r
        crit[t] = blocker
        for k in range(res_ptr[t], res_ptr[t + 1]):
            res_free[res[k]] = f
            res_last[res[k]] = t
        for k in range(succ_ptr[t], succ_ptr[t + 1]):
            v = succ[k]
            if f > ready[v] or last_pred[v] < 0:
                ready[v] = max(ready[v], f)
                last_pred[v] = t
            pending[v] -= 1
            if pending[v] == 0:
                size = _heap_push(heap_t, heap_id, size, ready[v], v)
        done += 1
    if done != n:
        raise ValueError("the task graph has a cycle")
    return start, end, ready, crit


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
