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

**How much a change reaches.** :meth:`DeltaSimulator.reach` schedules a proposal in full and compares
each task with the current schedule (:class:`Reach`): how many tasks the resumed schedule keeps,
how many it times again, and how many of those a simulator that re-timed only the tasks the change
reaches could have skipped (late in an MCMC chain on inception_v3, 2%: a change moves nearly every
task after it).

**Micro-batches.** A plan with ``m > 1`` micro-batches (:meth:`DeltaSimulator.for_plan`) is simulated
on the micro-batch graph, as :func:`placement_rl.simulate` does: a change of op ``i`` is the change of
its ``m`` copies, and the task graph takes the proposed plan's schedule order. The schedule follows
the plan's stages, which a moved op can change, so unchanged tasks may change places on their
device; the schedule then resumes no later than the first of them. A new micro-batch count, schedule
or virtual-stage count rebuilds (:meth:`DeltaSimulator.propose_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.plan.core import OpConfig, Plan, Schedule
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


@dataclass(frozen=True)
class Reach:
    """How much of the current schedule one proposal changes (:meth:`DeltaSimulator.reach`).

    Attributes:
        tasks: the proposal's tasks.
        kept: the tasks delta simulation keeps (they become ready before the change can matter).
        new: of the tasks it schedules again (:attr:`timed`), those without a counterpart in the
            current task graph (the changed ops' tasks, the transfers of their tensors, the
            synchronization their gradients join).
        unchanged: of ``timed``, the ones that start exactly when they start now: all a simulator that
            re-timed only the tasks the change reaches could skip beyond ``kept``.
        shifted_tail: of the ``timed - new`` others, the latest-starting ones that start as now,
            moved by the makespan's change (within a part in 10^9): a simulator that stopped once it
            reached that shifted copy (not exact: its rounding differs) would still time the rest.
        makespan_s: the proposal's makespan.
        makespan_change_s: the proposal's makespan minus the current one.
    """

    tasks: int
    kept: int
    new: int
    unchanged: int
    shifted_tail: int
    makespan_s: float
    makespan_change_s: float

    @property
    def timed(self) -> int:
        """The tasks delta simulation schedules again: ``tasks - kept``."""
        return self.tasks - self.kept


class DeltaSimulator:
    """Evaluate one-op changes of a plan incrementally (see the module docstring).

    A plan with several micro-batches (:meth:`for_plan`, or ``micro_batches > 1``) is simulated on
    the micro-batch graph (:meth:`SimContext.micro_batch_context`): op ``i``'s change is the change
    of its ``m`` copies (ops ``i m .. i m + m - 1`` there), and each proposal's task graph takes the
    program order of the proposed plan's schedule (its stages follow the devices the ops run on, so
    a moved op may reorder unchanged tasks: the schedule then resumes no later than the first task
    whose predecessor on its device changed). Indices, :attr:`configs` and :meth:`plan` always speak
    of the original ops. A plan-level change (micro-batches, schedule, virtual stages, or a whole
    other plan) is :meth:`propose_plan`, which rebuilds.

    Args:
        ctx: the simulation context of the graph, topology and cost model.
        configs: one configuration per op, in graph order (the current plan).
        oom_penalty: see :func:`oom_cost`.
        cached: compile proposals through the context's cache (for callers such as the envs that
            revisit the same configurations; searches leave it off so the cache does not churn).
        micro_batches, schedule, virtual_stages: the plan's pipeline fields
            (:class:`~placement_rl.plan.core.Plan`); the schedule orders the tasks only with more than
            one micro-batch.

    Attributes:
        configs: the current plan's configurations (updated by :meth:`accept`).
        cost: the current plan's cost.
        proposed_makespan_s: the makespan of the last proposal (without the OOM penalty).
        micro_batches, schedule, virtual_stages: the current plan's pipeline fields.

    Raises:
        ValueError: micro-batches that do not divide an op's batch, or a configuration count other
            than the graph's op count;
            :class:`~placement_rl.sim.pipeline.ScheduleDeadlock` (a ``ValueError``) when the
            schedule's order waits for itself (as :func:`~placement_rl.simulate` does; also from a
            proposal, which then leaves nothing pending).
    """

    def __init__(
        self,
        ctx: SimContext,
        configs: Sequence[OpConfig],
        oom_penalty: float = 10.0,
        cached: bool = False,
        *,
        micro_batches: int = 1,
        schedule: Schedule = "1f1b",
        virtual_stages: int = 1,
    ) -> None:
        self.ctx = ctx
        self.oom_penalty = oom_penalty
        self.micro_batches, self.schedule, self.virtual_stages = micro_batches, schedule, virtual_stages
        self.configs = list(configs)
        n = ctx.graph.num_ops
        if len(self.configs) != n:
            raise ValueError(f"{len(self.configs)} configurations for the {n} ops of graph {ctx.graph.name!r}")
        m = micro_batches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"micro_batches = {m!r}; expected a positive integer")
        # the context simulated: the graph's own, or its micro-batch graph's (op i's copy k is op i m + k)
        sim = ctx.micro_batch_context(m) if m > 1 else ctx
        self._sim = sim
        self._cached = cached
        self._compile = sim.compile if cached else sim.compile_uncached
        self.compiled: list[_CompiledOp] = [sim.compile(k, self.configs[k // m]) for k in range(n * m)]
        self.ops = sim.with_shared(OpArrays.from_ops(self.compiled), self.compiled)
        self.edges = EdgeArrays.from_flat(*sim.transfers(self.compiled))
        self._edges_of: list[list[int]] = [[] for _ in range(sim.graph.num_ops)]
        for e, (i, j) in enumerate(zip(sim.e_src.tolist(), sim.e_dst.tolist(), strict=True)):
            self._edges_of[i].append(e)
            self._edges_of[j].append(e)
        self._capacity = sim._capacity.astype(np.int64)
        tasks = self._assemble(self.ops, self.edges, self.configs)
        none = np.zeros(tasks.duration.shape[0], np.bool_)
        evaluated = self._evaluate(self.ops, tasks, none, none, none, none)
        assert evaluated is not None
        self.cost, self._times = evaluated
        self.proposed_makespan_s = float(self._times[2].max()) if self._times[2].size else 0.0
        self._tasks = tasks
        self._pending: tuple[Any, ...] | DeltaSimulator | None = None
        self._quiet: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._owner_end: np.ndarray | None = None

    @classmethod
    def for_plan(cls, ctx: SimContext, plan: Plan, oom_penalty: float = 10.0, cached: bool = False) -> DeltaSimulator:
        """A delta simulator of ``plan`` (on ``ctx.graph``) with its pipeline fields (see the class docstring)."""
        return cls(
            ctx,
            [plan[op.name] for op in ctx.graph.ops],
            oom_penalty,
            cached,
            micro_batches=plan.micro_batches,
            schedule=plan.schedule,
            virtual_stages=plan.virtual_stages,
        )

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
        self._pending = None
        proposed, compiled, ops, edges, configs, tasks, (prefix, ready, start, end, _) = self._build(changes)
        evaluated = self._evaluate(ops, tasks, prefix, ready, start, end, limit_s)
        if evaluated is None:
            self.proposed_makespan_s = math.inf
            return math.inf
        cost, times = evaluated
        self._pending = (proposed, compiled, ops, edges, times, tasks, cost)
        self.proposed_makespan_s = float(times[2].max()) if times[2].size else 0.0
        return cost

    def reach(self, changes: Mapping[int, OpConfig]) -> Reach:
        """How much of the current schedule a proposal leaves alone: what delta simulation keeps, and what a
        simulator that re-timed only the tasks a change reaches could keep (:class:`Reach`). Nothing
        is left pending; the current plan is unchanged.

        The proposal is scheduled in full (no cut-off) and each of its tasks compared with the same
        task of the current schedule.
        """
        self._pending = None
        _, _, ops, _, _, tasks, (prefix, ready, start, end, old_id) = self._build(changes)
        evaluated = self._evaluate(ops, tasks, prefix, ready, start, end)
        assert evaluated is not None
        new_start = evaluated[1][1]
        _, old_start, old_end = self._times
        old_makespan = float(old_end.max()) if old_end.size else 0.0
        new_makespan = float(evaluated[1][2].max()) if evaluated[1][2].size else 0.0
        shift = new_makespan - old_makespan
        known = old_id >= 0
        before = np.where(known, old_start[np.maximum(old_id, 0)], np.nan)
        timed = ~prefix
        same = timed & known & (new_start == before)
        # shifted: the task starts as in the current schedule, moved by the makespan's change
        shifted = timed & known & (np.abs(new_start - before - shift) <= 1e-9 * max(new_makespan, 1e-30))
        again = np.flatnonzero(timed & known)
        tail = shifted[again[np.argsort(new_start[again], kind="stable")]][::-1]
        after = int(np.argmin(tail)) if not tail.all() else int(tail.shape[0])
        return Reach(
            tasks=int(prefix.shape[0]),
            kept=int(prefix.sum()),
            new=int((~known).sum()),
            unchanged=int(same.sum()),
            shifted_tail=after,
            makespan_s=new_makespan,
            makespan_change_s=shift,
        )

    def _build(
        self, changes: Mapping[int, OpConfig]
    ) -> tuple[
        dict[int, OpConfig],
        dict[int, _CompiledOp],
        OpArrays,
        EdgeArrays,
        list[OpConfig],
        _Tasks,
        tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    ]:
        """The task graph of the current plan with ``changes``, and the tasks whose times it keeps
        (:meth:`_prefix`)."""
        if not changes:
            raise ValueError("changes = {}: expected at least one changed op")
        n = self.ctx.graph.num_ops
        bad = [i for i in sorted(changes) if not 0 <= i < n]
        if bad:
            raise ValueError(f"op indices {bad}; expected 0 <= index < {n}")
        m = self.micro_batches
        proposed = {i: changes[i] for i in sorted(changes)}
        configs = list(self.configs)
        for i, cfg in proposed.items():
            configs[i] = cfg
        # the simulated ops: each original op's m copies
        indices = [i * m + k for i in proposed for k in range(m)]
        sim = self._sim
        compiled = {c: self._compile(c, proposed[c // m]) for c in indices}
        ops = self.ops
        for c in indices:
            ops = ops.replace(c, compiled[c])
        owners = list(dict.fromkeys(o for o in map(sim.shared_owner, indices) if o is not None))
        if owners:  # shared parameters: an owner's synchronization depends on every user
            trial = list(self.compiled)
            for c in indices:
                trial[c] = compiled[c]
            ops = sim.with_shared(ops, trial, owners)
        edges = self.edges
        changed = sorted({e for c in indices for e in self._edges_of[c]})
        for e in changed:
            i, j = int(sim.e_src[e]), int(sim.e_dst[e])
            producer = compiled[i] if i in compiled else self.compiled[i]
            consumer = compiled[j] if j in compiled else self.compiled[j]
            edges = edges.replace(e, *sim.edge_transfers(e, producer, consumer))
        tasks = self._assemble(ops, edges, configs)
        return proposed, compiled, ops, edges, configs, tasks, self._prefix(indices, changed, ops, edges, owners, tasks)

    def propose_plan(self, plan: Plan, limit_s: float = math.inf) -> float:
        """Cost of another plan of the same graph (any micro-batches, schedule, virtual stages and
        configurations), by a rebuild: a new micro-batch count changes every task. Follow with
        :meth:`accept` (the plan becomes the current one) or :meth:`reject`. ``limit_s`` is accepted
        for symmetry with :meth:`propose_many`; the cost is always exact.

        Raises:
            ValueError: as the constructor (micro-batches that do not divide an op's batch, a
                :class:`~placement_rl.sim.pipeline.ScheduleDeadlock`); nothing is then pending.
        """
        del limit_s  # the rebuild evaluates the whole plan
        self._pending = None
        rebuilt = DeltaSimulator.for_plan(self.ctx, plan, self.oom_penalty, self._cached)
        self._pending = rebuilt
        self.proposed_makespan_s = rebuilt.proposed_makespan_s
        return rebuilt.cost

    def _assemble(self, ops: OpArrays, edges: EdgeArrays, configs: Sequence[OpConfig]) -> _Tasks:
        """The task graph of ``configs``; with micro-batches, in the schedule's program order."""
        sim = self._sim
        if self.micro_batches == 1:
            return sim.assemble(ops, edges)
        graph = self.ctx.graph
        plan = Plan(
            graph.name,
            {op.name: c for op, c in zip(graph.ops, configs, strict=True)},
            micro_batches=self.micro_batches,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
        )
        sim.schedule_plan = (graph, plan)
        try:
            return sim.assemble(ops, edges)
        finally:
            sim.schedule_plan = None

    def _prefix(
        self,
        indices: list[int],
        changed: list[int],
        ops: OpArrays,
        edges: EdgeArrays,
        owners: list[int],
        tasks: _Tasks,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tasks of the new task graph whose times the current schedule already gives: ``(prefix,
        ready, start, end, old_id)``, (T,) each, the times those of the current schedule (where
        ``prefix``), ``old_id`` each task's id in the current task graph (-1: a new task).

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
        # The partial-sum all-reduces of tensor-parallel layers (after the synchronization block) are
        # rebuilt every time: the old ones count as removed, the new ones bound t0 by their inputs.
        old_partials = old_block + old_tasks.ps_pos.shape[0] + old_tasks.bucket_pos.shape[0]
        removed.append(ready[old_partials : old_tasks.host_base])
        t0 = min((float(r.min()) for r in removed if r.size), default=np.inf)
        new_partials = np.arange(new_block + tasks.ps_pos.shape[0] + tasks.bucket_pos.shape[0], tasks.host_base)
        if new_partials.size:
            t0 = min(t0, self._partials_bound(tasks, new_partials, old_id))
        # A changed op's new tasks wait for its producers; a chain of changed ops starts at one whose
        # producers are all unchanged (or that has none).
        in_changes = set(indices)
        producers: set[int] = set()
        for index in indices:
            mine = [int(self._sim.e_src[e]) for e in self._edges_of[index] if int(self._sim.e_dst[e]) == index]
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
        t0 = min(t0, self._chain_bound(compute_old, tasks))
        if tasks.scheduled_flows:
            t0 = self._quiet_before(t0)
        known = old_id >= 0
        safe = np.where(known, old_id, 0)
        prefix = known & (ready[safe] < t0)
        assert prefix.shape[0] == tasks.duration.shape[0]
        return prefix, ready[safe], start[safe], end[safe], old_id

    def _partials_bound(self, tasks: _Tasks, partials: np.ndarray, old_id: np.ndarray) -> float:
        """A moment no new partial-sum all-reduce becomes ready before: each waits for compute tasks
        (partial forwards, or backwards), so it is ready no earlier than the last of them when all are
        unchanged (a new one among them becomes ready after ``t0``).

        Args:
            tasks: the proposal's task graph.
            partials: (K,) the ids of its partial-sum all-reduces.
            old_id: (T,) each task's id in the current task graph (-1: new).
        """
        _, _, end = self._times
        T = tasks.duration.shape[0]
        is_partial = np.zeros(T, np.bool_)
        is_partial[partials] = True
        at = np.flatnonzero(is_partial[tasks.succ])
        src = np.searchsorted(tasks.succ_ptr, at, side="right") - 1
        dst = tasks.succ[at]
        old = old_id[src]
        fresh = np.zeros(T, np.bool_)
        np.logical_or.at(fresh, dst, old < 0)
        latest = np.full(T, -np.inf)
        np.maximum.at(latest, dst, np.where(old >= 0, end[np.maximum(old, 0)], -np.inf))
        bounded = partials[~fresh[partials]]
        return float(latest[bounded].min()) if bounded.size else math.inf

    def _chain_bound(self, compute_old: np.ndarray, tasks: _Tasks) -> float:
        """A moment no unchanged compute task whose predecessor on its device changed becomes ready before,
        in either schedule.

        An unchanged task's place in its device's program order can change: the task before it may
        be removed, or (a pipeline schedule follows the plan's stages, which a moved op changes)
        another unchanged task. For each unchanged task ``x`` whose previous task on its device is
        not the same unchanged task as before: its old ready time (so it is not kept), and the old
        end of its new previous task when that one is unchanged (so ``x`` cannot become ready before
        ``t0``: that task keeps its times or becomes ready after ``t0``); a new previous task is
        bounded by :meth:`_prefix` already; a task now first on its device gives 0. Under eager
        execution the same holds for the host tasks, whose order follows.

        Args:
            compute_old: (2F,) each new compute task's id in the current task graph (-1: new).
            tasks: the proposal's task graph.
        """
        old_tasks = self._tasks
        if not old_tasks.chain_prev.size or not tasks.chain_prev.size:
            return math.inf
        ready, _, end = self._times
        kept = np.flatnonzero(compute_old >= 0)
        x = compute_old[kept]
        prev = tasks.chain_prev[kept]
        # the new previous task by its old id: -1 none, -2 a new task
        prev_old_id = np.where(prev < 0, -1, np.where(compute_old[prev] >= 0, compute_old[prev], -2))
        moved = prev_old_id != old_tasks.chain_prev[x]
        if not moved.any():
            return math.inf
        before = prev_old_id[moved]
        if (before == -1).any():  # now first on its device: only its data dependencies hold it
            return 0.0
        x, before = x[moved], before[before >= 0]
        bound = min(float(ready[x].min()), float(end[before].min()) if before.size else math.inf)
        if old_tasks.host_base < old_tasks.duration.shape[0]:
            hb = old_tasks.host_base
            bound = min(bound, float(ready[hb + x].min()), float(end[hb + before].min()) if before.size else math.inf)
        return bound

    def _new_bucket_bound(self, tasks: _Tasks, buckets: np.ndarray, sync_changed: list[int]) -> float:
        """A moment no new bucket becomes ready before: a bucket waits for the backward tasks of its
        shards' users, so it is ready no earlier than the last of them that the change leaves alone."""
        if self._owner_end is None:
            ctx = self._sim
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
        pending = self._pending
        if pending is None:
            raise RuntimeError("accept() without a pending proposal")
        if isinstance(pending, DeltaSimulator):  # a rebuilt plan (propose_plan): its state becomes ours
            vars(self).update(vars(pending))
            self._pending = None
            return
        changes, compiled, self.ops, self.edges, self._times, self._tasks, self.cost = pending
        for index, cfg in changes.items():
            self.configs[index] = cfg
        for c, op in compiled.items():
            self.compiled[c] = op
        self._pending = None
        self._quiet = self._owner_end = None

    def reject(self) -> None:
        """Drop the last proposal."""
        self._pending = None

    def set(self, index: int, cfg: OpConfig) -> float:
        """Change op ``index`` to ``cfg`` for good (propose and accept); returns the new cost."""
        cost = self.propose(index, cfg)
        self.accept()
        return cost

    def feedback(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Runtime feedback of the current plan (TAG's and Trinity's per-op features).

        Returns:
            ``(makespan_s, op_forward_end_s (N,), op_output_idle_s (N,), device_busy_s (D,))``:
            when each op's last forward task ends; how long its output then waits before the
            first outgoing transfer starts (0 when it sends nothing); and the compute seconds per
            device. With micro-batches, per original op: the last forward end and the longest wait
            over its copies.
        """
        _, start, end = self._times
        makespan, fwd_end, idle, busy = runtime_feedback(self._sim, self._tasks, start, end)
        m = self.micro_batches
        if m > 1:
            n = self.ctx.graph.num_ops
            fwd_end, idle = fwd_end.reshape(n, m).max(axis=1), idle.reshape(n, m).max(axis=1)
        return makespan, fwd_end, idle, busy

    def plan(self, name: str = "plan") -> Plan:
        """The current plan (with its pipeline fields)."""
        graph = self.ctx.graph
        return Plan(
            graph.name,
            {op.name: c for op, c in zip(graph.ops, self.configs, strict=True)},
            name=name,
            micro_batches=self.micro_batches,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
        )

    def result(self) -> SimResult:
        """The full simulation of the current plan (told of the original ops)."""
        if self.micro_batches > 1:
            return self.ctx.simulate(self.plan(), validate=False)
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
        ctx = self._sim
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
