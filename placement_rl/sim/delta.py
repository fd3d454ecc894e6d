"""Delta simulation (FlexFlow sec. 5.3): re-simulate a plan after one op's configuration changes.

A full simulation compiles every op's configuration, computes the data movement of every tensor,
builds the synchronization tasks, schedules and sweeps memory, then assembles a complete
:class:`~placement_rl.sim.result.SimResult`. After a one-op change almost all of that is unchanged.
:class:`DeltaSimulator` keeps, for the current plan, every op's compiled arrays and every tensor's
transfer segment (in task indices local to the two ops, so segments survive renumbering). A
proposal recompiles only the changed op and recomputes only the segments of its input and output
tensors; the task graph is then re-assembled from the kept pieces (array concatenation) and
re-scheduled, and only the figures the search needs (makespan and per-device peak memory) are
computed.

The result is exact, not an approximation: the re-assembled task graph is identical to the one a
full simulation builds (same tasks, same ids, same dependencies), so the schedule, makespan and
peak memory are bit-for-bit those of :func:`placement_rl.simulate`; a property test checks this over
thousands of random proposals under every network model. :meth:`DeltaSimulator.result` gives the
full ``SimResult`` of the current plan when it is needed.

**Where the schedule resumes.** ``t0`` is the earliest moment the change can matter (the earliest
ready time of a task the change removes, a bound on when the tasks it adds can become ready); every
unchanged task that became ready before it keeps its times. A changed op's gradients may move other
ops' shards between all-reduce buckets: a bucket is kept only when its device group's shards did
not change. Under the ``flow`` model a transfer in flight at ``t0`` would be slowed by the new
flows, and its remaining bytes are not kept, so the schedule resumes at the latest moment at or
before ``t0`` when no flow task is in flight (every flow task that became ready before it has
ended).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from placement_rl.plan.core import OpConfig, Plan
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import EdgeArrays, OpArrays, SimContext, _CompiledOp, _Tasks


def oom_cost(makespan_s: float, peak_memory_bytes: np.ndarray, capacity_bytes: np.ndarray, oom_penalty: float) -> float:
    """Search cost: the makespan, times ``1 + oom_penalty * (1 + overflow)`` when a device overflows.

    ``overflow`` is the largest ``(peak - capacity) / capacity`` over devices. Shapes: ``(D,)`` int64.
    """
    if not (peak_memory_bytes > capacity_bytes).any():
        return makespan_s
    overflow = float(np.max((peak_memory_bytes - capacity_bytes) / capacity_bytes))
    return makespan_s * (1.0 + oom_penalty * (1.0 + overflow))


class DeltaSimulator:
    """Evaluate one-op changes of a plan incrementally (see the module docstring).

    Args:
        ctx: the simulation context of the graph, topology and cost model.
        configs: one configuration per op, in graph order (the current plan).
        oom_penalty: see :func:`oom_cost`.
        cached: compile proposals through the context's cache (for callers such as the envs that
            revisit the same configurations; searches leave it off so the cache does not churn).

    Attributes:
        configs: the current plan's configurations (updated by :meth:`accept`).
        cost: the current plan's cost.
        proposed_makespan_s: the makespan of the last proposal (without the OOM penalty).
    """

    def __init__(
        self, ctx: SimContext, configs: Sequence[OpConfig], oom_penalty: float = 10.0, cached: bool = False
    ) -> None:
        self.ctx = ctx
        self._compile = ctx.compile if cached else ctx.compile_uncached
        self.oom_penalty = oom_penalty
        self.configs = list(configs)
        self.compiled: list[_CompiledOp] = [ctx.compile(i, c) for i, c in enumerate(self.configs)]
        self.ops = ctx.with_shared(OpArrays.from_ops(self.compiled), self.compiled)
        self.edges = EdgeArrays.from_flat(*ctx.transfers(self.compiled))
        self._edges_of: list[list[int]] = [[] for _ in range(ctx.graph.num_ops)]
        for e, (i, j) in enumerate(zip(ctx.e_src.tolist(), ctx.e_dst.tolist(), strict=True)):
            self._edges_of[i].append(e)
            self._edges_of[j].append(e)
        self._capacity = ctx._capacity.astype(np.int64)
        tasks = ctx.assemble(self.ops, self.edges)
        none = np.zeros(tasks.duration.shape[0], np.bool_)
        evaluated = self._evaluate(self.ops, tasks, none, none, none, none)
        assert evaluated is not None
        self.cost, self._times = evaluated
        self._tasks = tasks
        self._pending: tuple[Any, ...] | None = None
        self._quiet: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._owner_end: np.ndarray | None = None

    def propose(self, index: int, cfg: OpConfig, limit_s: float = math.inf) -> float:
        """Cost of the current plan with op ``index`` set to ``cfg``; follow with :meth:`accept` or :meth:`reject`.

        With a finite ``limit_s`` the simulation stops as soon as the makespan is certainly above it
        (a lower bound from the tasks already timed, :func:`~placement_rl.sim.kernels.rest_bounds`),
        and the cost is then ``inf``: a search that would reject any cost above ``limit_s`` makes the
        same decision without the rest of the schedule. Such a proposal can only be rejected.
        """
        return self.propose_many({index: cfg}, limit_s)

    def propose_many(self, changes: Mapping[int, OpConfig], limit_s: float = math.inf) -> float:
        """Cost of the current plan with every op ``i`` of ``changes`` set to ``changes[i]`` (several ops at
        once, as exact as :meth:`propose`, cut off above ``limit_s`` as it is); follow with
        :meth:`accept` or :meth:`reject`."""
        if not changes:
            raise ValueError("propose_many({}): expected at least one changed op")
        ctx = self.ctx
        n = ctx.graph.num_ops
        indices = sorted(changes)
        bad = [i for i in indices if not 0 <= i < n]
        if bad:
            raise ValueError(f"op indices {bad}; expected 0 <= index < {n}")
        compiled = {i: self._compile(i, changes[i]) for i in indices}
        ops = self.ops
        for i in indices:
            ops = ops.replace(i, compiled[i])
        owners = list(dict.fromkeys(o for o in map(ctx.shared_owner, indices) if o is not None))
        if owners:  # shared parameters: an owner's synchronization depends on every user
            trial = list(self.compiled)
            for i in indices:
                trial[i] = compiled[i]
            ops = ctx.with_shared(ops, trial, owners)
        edges = self.edges
        changed = sorted({e for i in indices for e in self._edges_of[i]})
        for e in changed:
            i, j = int(ctx.e_src[e]), int(ctx.e_dst[e])
            producer = compiled[i] if i in compiled else self.compiled[i]
            consumer = compiled[j] if j in compiled else self.compiled[j]
            edges = edges.replace(e, *ctx.edge_transfers(e, producer, consumer))
        tasks = ctx.assemble(ops, edges)
        prefix, ready, start, end = self._prefix(indices, changed, ops, edges, owners, tasks)
        evaluated = self._evaluate(ops, tasks, prefix, ready, start, end, limit_s)
        if evaluated is None:
            self._pending = None
            self.proposed_makespan_s = math.inf
            return math.inf
        cost, times = evaluated
        self._pending = ({i: changes[i] for i in indices}, compiled, ops, edges, times, tasks)
        self.proposed_makespan_s = float(times[2].max()) if times[2].size else 0.0
        return cost

    def _prefix(
        self,
        indices: list[int],
        changed: list[int],
        ops: OpArrays,
        edges: EdgeArrays,
        owners: list[int],
        tasks: _Tasks,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tasks of the new task graph whose times the current schedule already gives.

        ``t0`` is the earliest moment the change can matter: the earliest ready time of a removed
        task, the earliest end of a producer outside the changed ops of a changed op (its new tasks
        wait for one; 0 when a changed op has no producer), and for each new bucket the latest end
        of an unchanged backward task it waits for. Every unchanged task that became ready before
        ``t0`` keeps its times (see ``schedule_flows``); under ``flow``, ``t0`` first moves back to
        when no flow task was in flight.
        """
        ready, start, end = self._times
        old_ops, old_edges, old_tasks = self.ops, self.edges, self._tasks
        Fo, Co = int(old_ops.ptr["task"][-1]), int(old_edges.com_ptr[-1])
        Fn, Cn = int(ops.ptr["task"][-1]), int(edges.com_ptr[-1])
        task_src = _remap(old_ops.ptr["task"], ops.ptr["task"], indices)
        com_src = _remap(old_edges.com_ptr, edges.com_ptr, changed)
        sync_changed = list(dict.fromkeys([*indices, *owners]))
        old_block, new_block = 2 * Fo + 2 * Co, 2 * Fn + 2 * Cn
        # The synchronization block: parameter-server tasks of unchanged ops, buckets of unchanged groups.
        block_old = np.full(tasks.host_base - new_block, -1, np.int64)
        ps_src = _remap(old_ops.ptr["sync"], ops.ptr["sync"], sync_changed)
        kept = ps_src >= 0
        block_old[tasks.ps_pos[kept]] = old_block + old_tasks.ps_pos[ps_src[kept]]
        ar_old, ar_new = old_ops.ptr["allreduce"], ops.ptr["allreduce"]
        touched = np.unique(
            np.concatenate(
                [old_ops.data["ar_group"][ar_old[k] : ar_old[k + 1]] for k in sync_changed]
                + [ops.data["ar_group"][ar_new[k] : ar_new[k + 1]] for k in sync_changed]
            )
        )
        new_changed = np.isin(tasks.bucket_group, touched)
        old_changed = np.isin(old_tasks.bucket_group, touched)
        width = int(max(tasks.bucket_ordinal.max(initial=0), old_tasks.bucket_ordinal.max(initial=0))) + 1
        old_key = old_tasks.bucket_group * width + old_tasks.bucket_ordinal
        new_key = tasks.bucket_group * width + tasks.bucket_ordinal
        sorter = np.argsort(old_key)
        same = np.flatnonzero(~new_changed)
        match = sorter[np.searchsorted(old_key[sorter], new_key[same])] if same.size else same
        block_old[tasks.bucket_pos[same]] = old_block + old_tasks.bucket_pos[match]
        compute_old = np.concatenate(
            [np.where(task_src >= 0, task_src, -1), np.where(task_src >= 0, Fo + task_src, -1)]
        )
        host = tasks.host_base < tasks.duration.shape[0]  # eager: host tasks follow, one per compute task
        old_id = np.concatenate(
            [
                compute_old,
                np.where(com_src >= 0, 2 * Fo + com_src, -1),
                np.where(com_src >= 0, 2 * Fo + Co + com_src, -1),
                block_old,
                np.where(compute_old >= 0, old_tasks.host_base + compute_old, -1) if host else compute_old[:0],
            ]
        )
        removed = []
        for index in indices:
            a, b = old_ops.ptr["task"][index], old_ops.ptr["task"][index + 1]
            removed += [ready[a:b], ready[Fo + a : Fo + b]]
            if host:
                hb = old_tasks.host_base
                removed += [ready[hb + a : hb + b], ready[hb + Fo + a : hb + Fo + b]]
        for e in changed:
            c0, c1 = old_edges.com_ptr[e], old_edges.com_ptr[e + 1]
            removed += [ready[2 * Fo + c0 : 2 * Fo + c1], ready[2 * Fo + Co + c0 : 2 * Fo + Co + c1]]
        for k in sync_changed:
            s0, s1 = old_ops.ptr["sync"][k], old_ops.ptr["sync"][k + 1]
            removed.append(ready[old_block + old_tasks.ps_pos[s0:s1]])
        removed.append(ready[old_block + old_tasks.bucket_pos[old_changed]])
        t0 = min((float(r.min()) for r in removed if r.size), default=np.inf)
        # A changed op's new tasks wait for its producers; a chain of changed ops starts at one whose
        # producers are all unchanged (or that has none).
        in_changes = set(indices)
        producers: set[int] = set()
        for index in indices:
            mine = [int(self.ctx.e_src[e]) for e in self._edges_of[index] if int(self.ctx.e_dst[e]) == index]
            if not mine:
                t0 = 0.0
            producers.update(p for p in mine if p not in in_changes)
        for p in sorted(producers):
            p0, p1 = old_ops.ptr["task"][p], old_ops.ptr["task"][p + 1]
            if p1 > p0:
                t0 = min(t0, float(end[p0:p1].min()))
        # A new compute task (and its host task) runs after the task before it on its device in program
        # order: no earlier than that task's end where it is unchanged (a chain of new tasks from the first).
        fresh = np.flatnonzero(compute_old < 0)
        before = tasks.chain_prev[fresh]
        if host and (before < 0).any():  # issued first on its device: its host may start at once
            t0 = 0.0
        kept = compute_old[before[before >= 0]]
        kept = kept[kept >= 0]
        if kept.size:
            t0 = min(t0, float(end[kept].min()))
            if host:
                t0 = min(t0, float(end[old_tasks.host_base + kept].min()))
        if new_changed.any():
            t0 = min(t0, self._new_bucket_bound(tasks, np.flatnonzero(new_changed), sync_changed))
        if tasks.scheduled_flows:
            t0 = self._quiet_before(t0)
        known = old_id >= 0
        safe = np.where(known, old_id, 0)
        prefix = known & (ready[safe] < t0)
        assert prefix.shape[0] == tasks.duration.shape[0]
        return prefix, ready[safe], start[safe], end[safe]

    def _new_bucket_bound(self, tasks: _Tasks, buckets: np.ndarray, sync_changed: list[int]) -> float:
        """A moment no new bucket becomes ready before: a bucket waits for the backward tasks of its
        shards' users, so it is ready no earlier than the last of them that the change leaves alone."""
        if self._owner_end is None:
            ctx = self.ctx
            _, _, end = self._times
            ptr = self.ops.ptr["task"]
            F = int(ptr[-1])
            has = np.diff(ptr) > 0
            op_end = np.zeros(ptr.shape[0] - 1)
            if F:
                op_end[has] = np.maximum.reduceat(end[F : 2 * F], ptr[:-1][has])
            users = op_end[ctx._users] if ctx._users.size else np.zeros(0)
            count = np.diff(ctx._users_ptr)
            owner_end = np.full(count.shape[0], -np.inf)
            nonempty = count > 0
            if users.size:
                owner_end[nonempty] = np.maximum.reduceat(users, ctx._users_ptr[:-1][nonempty])
            self._owner_end = owner_end
        bound = np.inf
        owners = tasks.bucket_members
        for b in buckets.tolist():
            members = owners[tasks.bucket_member_ptr[b] : tasks.bucket_member_ptr[b + 1]]
            members = members[~np.isin(members, sync_changed)]
            if members.size:
                bound = min(bound, float(self._owner_end[members].max()))
        return bound

    def _quiet_before(self, t0: float) -> float:
        """The latest moment at or before ``t0`` when no flow task of the current schedule is in flight."""
        if self._quiet is None:
            ready, _, end = self._times
            fl = self._tasks.flows
            ids = np.flatnonzero(np.diff(fl.phase_ptr) > 0)
            order = np.argsort(ready[ids], kind="stable")
            r, e = ready[ids][order], end[ids][order]
            latest = np.maximum.accumulate(e) if e.size else e
            # position j can resume: no task ready before r[j] is still running at r[j]
            starts = np.flatnonzero(np.r_[True, r[1:] > r[:-1]]) if r.size else np.zeros(0, np.int64)
            valid = starts[(starts == 0) | (latest[np.maximum(starts - 1, 0)] <= r[starts])]
            self._quiet = (r, latest, valid)
        r, latest, valid = self._quiet
        k = int(np.searchsorted(r, t0, side="left"))  # flow tasks ready before t0
        if k == 0 or latest[k - 1] <= t0:
            return t0
        j = valid[np.searchsorted(valid, k, side="left") - 1]
        return float(r[j])

    def accept(self) -> None:
        """Make the last proposal the current plan."""
        if self._pending is None:
            raise RuntimeError("accept() without a pending proposal")
        changes, compiled, self.ops, self.edges, self._times, self._tasks = self._pending
        for index, cfg in changes.items():
            self.configs[index], self.compiled[index] = cfg, compiled[index]
        self._pending = None
        self._quiet = self._owner_end = None

    def reject(self) -> None:
        """Drop the last proposal."""
        self._pending = None

    def set(self, index: int, cfg: OpConfig) -> float:
        """Change op ``index`` to ``cfg`` for good (propose and accept); returns the new cost."""
        cost = self.propose(index, cfg)
        self.accept()
        self.cost = cost
        return cost

    def feedback(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Runtime feedback of the current plan (TAG's and Trinity's per-op features).

        Returns:
            ``(makespan_s, op_forward_end_s (N,), op_output_idle_s (N,), device_busy_s (D,))``:
            when each op's last forward task ends; how long its output then waits before the
            first outgoing transfer starts (0 when it sends nothing); and the compute seconds per
            device.
        """
        _, start, end = self._times
        return runtime_feedback(self.ctx, self._tasks, start, end)

    def plan(self, name: str = "plan") -> Plan:
        """The current plan."""
        return Plan(
            self.ctx.graph.name, {op.name: c for op, c in zip(self.ctx.graph.ops, self.configs, strict=True)}, name=name
        )

    def result(self) -> SimResult:
        """The full simulation of the current plan."""
        return self.ctx.run(self.compiled)

    def _evaluate(
        self,
        ops: OpArrays,
        tasks: Any,
        prefix: np.ndarray,
        ready: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        limit_s: float = math.inf,
    ) -> tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """The cost and ``(ready, start, end)`` of the task graph; None when cut off above ``limit_s``."""
        ctx = self.ctx
        start, end, ready, *_, cut = ctx.schedule_within(tasks, limit_s, prefix, ready, start, end)
        if cut:
            return None
        makespan = float(end.max()) if end.size else 0.0
        peak = ctx.peak_memory(ops, tasks, start, end, only_over=True).astype(np.int64)
        return oom_cost(makespan, peak, self._capacity, self.oom_penalty), (ready, start, end)


def runtime_feedback(
    ctx: SimContext, tasks: _Tasks, start: np.ndarray, end: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Runtime feedback of a scheduled task graph: see :meth:`DeltaSimulator.feedback`.

    Args:
        ctx: the context that assembled ``tasks``.
        tasks: the assembled task graph.
        start, end: (T,) the schedule's task start and end times, s.
    """
    F, C, N = tasks.F, tasks.C, ctx.graph.num_ops
    task_op = tasks.op[:F]
    fwd_end = np.zeros(N)
    np.maximum.at(fwd_end, task_op, end[:F])
    first_send = np.full(N, np.inf)
    if C:
        np.minimum.at(first_send, task_op[tasks.c_src], start[2 * F : 2 * F + C])
    idle = np.where(np.isfinite(first_send), np.maximum(first_send - fwd_end, 0.0), 0.0)
    duration = end - start
    busy = np.bincount(tasks.task_dev, weights=duration[:F] + duration[F : 2 * F], minlength=ctx.num_devices)
    makespan = float(end.max()) if end.size else 0.0
    return makespan, fwd_end, idle, busy


def _remap(old_ptr: np.ndarray, new_ptr: np.ndarray, changed: Sequence[int]) -> np.ndarray:
    """For each position of a new segmented layout, its position in the old layout (-1 in changed segments)."""
    lengths = np.diff(new_ptr)
    src = np.arange(int(new_ptr[-1])) - np.repeat(new_ptr[:-1] - old_ptr[:-1], lengths)
    for k in changed:
        src[new_ptr[k] : new_ptr[k + 1]] = -1
    return src
