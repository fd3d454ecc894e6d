"""Numba kernels of the simulator: task-graph construction and list scheduling.

These are the simulator's inner loops (FlexFlow sec. 5.1-5.2); :mod:`placement_rl.simulator` prepares
their flat arrays and turns the results into a :class:`~placement_rl.sim_result.SimResult`. Each kernel
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
def build_transfers(
    e_src, e_dst, e_bytes, e_rank, e_same_layout, e_prod_box,
    op_task_ptr, op_part_ptr, op_replicas, op_sample_axis,
    task_dev, prod_lo, prod_hi, need_lo, need_hi, samp_lo, samp_hi,
    num_fwd_tasks,
):  # type: ignore[no-untyped-def]  # fmt: skip
    """Data movement between every producer partition and every consumer task that reads from it.

    Returns ``(dep_u, dep_v, c_src_task, c_dst_task, c_bytes)``: dependency edges between compute
    tasks on one device (forward and the mirrored backward edge), and one transfer per
    (producer partition, consumer task) pair on different devices. Task ids: forward task ``t`` is
    ``t``, backward task ``t`` is ``num_fwd_tasks + t``.
    """
    n_edges = e_src.shape[0]
    box_lo = np.empty(MAX_RANK)
    box_hi = np.empty(MAX_RANK)
    full_lo = np.zeros(MAX_RANK)
    full_hi = np.ones(MAX_RANK)
    # Pass 1: count.
    n_deps = 0
    n_comm = 0
    for e in range(n_edges):
        i = e_src[e]
        j = e_dst[e]
        r_i = op_replicas[i]
        p_i = (op_task_ptr[i + 1] - op_task_ptr[i]) // r_i
        r_j = op_replicas[j]
        for q in range(op_task_ptr[j], op_task_ptr[j + 1]):
            jp = op_part_ptr[j] + (q - op_task_ptr[j]) // r_j
            _consumer_box(jp, e_rank[e], e_same_layout[e], op_sample_axis[i] if e_prod_box[e] else -1,
                          need_lo, need_hi, samp_lo, samp_hi, box_lo, box_hi)  # fmt: skip
            for p in range(p_i):
                ip = op_part_ptr[i] + p
                if e_prod_box[e]:
                    frac = _overlap(prod_lo[ip], prod_hi[ip], box_lo, box_hi, e_rank[e])
                else:
                    frac = _overlap(full_lo, full_hi, box_lo, box_hi, e_rank[e])
                if frac <= 0.0:
                    continue
                src = _pick_replica(op_task_ptr[i] + p * r_i, r_i, task_dev, task_dev[q], q)
                if task_dev[src] == task_dev[q]:
                    n_deps += 2
                else:
                    n_comm += 1
    dep_u = np.empty(n_deps, np.int64)
    dep_v = np.empty(n_deps, np.int64)
    c_src = np.empty(n_comm, np.int64)
    c_dst = np.empty(n_comm, np.int64)
    c_bytes = np.empty(n_comm, np.float64)
    # Pass 2: fill.
    k = 0
    m = 0
    for e in range(n_edges):
        i = e_src[e]
        j = e_dst[e]
        r_i = op_replicas[i]
        p_i = (op_task_ptr[i + 1] - op_task_ptr[i]) // r_i
        r_j = op_replicas[j]
        for q in range(op_task_ptr[j], op_task_ptr[j + 1]):
            jp = op_part_ptr[j] + (q - op_task_ptr[j]) // r_j
            _consumer_box(jp, e_rank[e], e_same_layout[e], op_sample_axis[i] if e_prod_box[e] else -1,
                          need_lo, need_hi, samp_lo, samp_hi, box_lo, box_hi)  # fmt: skip
            for p in range(p_i):
                ip = op_part_ptr[i] + p
                if e_prod_box[e]:
                    frac = _overlap(prod_lo[ip], prod_hi[ip], box_lo, box_hi, e_rank[e])
                else:
                    frac = _overlap(full_lo, full_hi, box_lo, box_hi, e_rank[e])
                if frac <= 0.0:
                    continue
                src = _pick_replica(op_task_ptr[i] + p * r_i, r_i, task_dev, task_dev[q], q)
                if task_dev[src] == task_dev[q]:
                    dep_u[k] = src
                    dep_v[k] = q
                    dep_u[k + 1] = num_fwd_tasks + q
                    dep_v[k + 1] = num_fwd_tasks + src
                    k += 2
                else:
                    c_src[m] = src
                    c_dst[m] = q
                    c_bytes[m] = frac * e_bytes[e]
                    m += 1
    return dep_u, dep_v, c_src, c_dst, c_bytes


@njit(cache=True)
def _pick_replica(first, replicas, task_dev, device, consumer):  # type: ignore[no-untyped-def]
    """The producer replica on the consumer's device if there is one, else one chosen round-robin."""
    for r in range(replicas):
        if task_dev[first + r] == device:
            return first + r
    return first + consumer % replicas


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
    for t in range(n):
        if pending[t] == 0:
            size = _heap_push(heap_t, heap_id, size, 0.0, t)
    done = 0
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
    return start, end, crit


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
