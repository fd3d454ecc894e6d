"""TAG's search space (seed 001, sec. 4.1-4.2): op groups onto device-group subsets with a
replication option, scored on the original op graph.

A :class:`TagProblem` is one model (its op graph and METIS op groups) on one cluster. Its devices
are split into **device groups**, sets of GPUs TAG treats as one unit: the topology's machines
(``device_grouping="machine"``, the paper's default) or its GPU types (``"gpu_type"``, what the
paper's physical testbed runs used). A decision for an op group is an **action** ``a = s * 4 + o``:
a non-empty subset ``s`` of device groups (a row of TAG's placement matrix P) and one of the
replication options ``o`` of :data:`placement_rl.plan.TAG_OPTIONS`:

* ``all_reduce``: the group's sample dimension split over every GPU of the subset, gradients
  all-reduced (in buckets);
* ``parameter_server``: the same split with a parameter server, chosen round-robin over the
  subset's GPUs in decision order;
* ``duplicate``: every GPU of the subset runs the whole group, no gradient is exchanged;
* ``model_parallel``: the group's ops split again with METIS over the subset's GPUs, each op on one.

**Subsets.** With ``K`` device groups there are ``2**K - 1`` subsets; the space keeps at most
``max_subsets`` of them by one rule (:func:`device_subsets`): every single group first (subset
``k`` is group ``k``, so action ``k * 4 + o`` is "group k, option o"), then all groups together
(data parallelism's placement), then the ``j`` fastest groups for ``j = 2 .. K - 1`` (by total
peak FLOP/s: the other data-parallel choices), then the remaining subsets by size and in
lexicographic order until the cap. With the default cap of 64 every subset of up to 6 groups is kept.

**Decisions and the completion rule.** Groups are decided in descending compute time
(:attr:`TagProblem.order`). A partial list of decisions is completed by TAG's rule: every undecided
group takes the subset and option of the first decided group (the most expensive); with no
decision the plan is data parallelism over every GPU.

**Scores.** :meth:`TagProblem.evaluate` simulates the completed plan on the original op graph,
exactly as :func:`placement_rl.simulate` would (the same compiled ops, task graph and schedule),
so a leaf's score ranks plans as the final simulation does. Per-member compiled ops are cached per
(group, subset, option, server) and whole evaluations per completed plan, so a tree search pays
only for plans it has not seen. Nothing here deep-copies anything.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.plan import (
    TAG_OPTIONS,
    OpConfig,
    Plan,
    data_parallel,
    data_parallel_per_tensor,
    layerwise,
    member_config,
    tag_group_config,
)
from placement_rl.sim.cost import CostModel
from placement_rl.sim.delta import runtime_feedback
from placement_rl.sim.simulator import DEFAULT_COST_MODEL, EdgeArrays, OpArrays, SimContext, _CompiledOp
from placement_rl.topology import DeviceTopology

#: The data-parallel references speedups are taken against: bucketed (PyTorch DDP) or per tensor
#: (the papers' DP-NCCL, TAG's baseline).
REFERENCES: dict[str, Callable[[OpGraph, DeviceTopology], Plan]] = {
    "data_parallel": data_parallel,
    "data_parallel_per_tensor": data_parallel_per_tensor,
}
#: How devices are grouped into TAG's device groups.
DEVICE_GROUPINGS: tuple[str, ...] = ("machine", "gpu_type")
#: Default cap on the device-group subsets of the action space.
DEFAULT_MAX_SUBSETS = 64
NUM_OPTIONS = len(TAG_OPTIONS)
_EVAL_CACHE = 4096


@dataclass(frozen=True)
class DeviceGroup:
    """A set of GPUs TAG decides for as one unit.

    Attributes:
        name: the machine name, or the GPU type.
        devices: its device names, in topology order.
    """

    name: str
    devices: tuple[str, ...]


def device_groups(topology: DeviceTopology, grouping: str = "machine") -> tuple[DeviceGroup, ...]:
    """The device groups of ``topology``: its machines, or its GPU types, in order of first appearance.

    Raises:
        ValueError: for an unknown ``grouping``.
    """
    if grouping not in DEVICE_GROUPINGS:
        raise ValueError(f"device grouping {grouping!r}; expected one of {list(DEVICE_GROUPINGS)}")
    by: dict[str, list[str]] = {}
    for d in topology.devices:
        by.setdefault(d.machine if grouping == "machine" else d.device_type, []).append(d.name)
    return tuple(DeviceGroup(name, tuple(devs)) for name, devs in by.items())


def device_subsets(
    groups: Sequence[DeviceGroup], topology: DeviceTopology, max_subsets: int = DEFAULT_MAX_SUBSETS
) -> tuple[tuple[int, ...], ...]:
    """The device-group subsets of the action space, by the rule of the module docstring.

    Returns:
        Tuples of group indices (each sorted): the ``K`` singletons first, then all groups, then
        the fastest-``j`` prefixes, then the rest by size and lexicographic order, at most
        ``max_subsets`` in all.

    Raises:
        ValueError: if ``max_subsets`` is smaller than ``K`` (+ 1 for all groups when ``K > 1``).
    """
    K = len(groups)
    least = K + (K > 1)
    if max_subsets < least:
        raise ValueError(
            f"max_subsets = {max_subsets}, but {topology.name!r} has {K} device groups; every single group "
            f"and all of them together must be actions (raise max_subsets to at least {least})"
        )
    flops = [sum(topology.device(n).peak_flops for n in g.devices) for g in groups]
    ranked = sorted(range(K), key=lambda k: (-flops[k], k))
    chosen: dict[tuple[int, ...], None] = {(k,): None for k in range(K)}
    chosen.setdefault(tuple(range(K)), None)
    for j in range(2, K):
        chosen.setdefault(tuple(sorted(ranked[:j])), None)
    for size in range(2, K + 1):
        if len(chosen) >= max_subsets:
            break
        for combo in itertools.combinations(range(K), size):
            if len(chosen) >= max_subsets:
                break
            chosen.setdefault(combo, None)
    return tuple(list(chosen)[:max_subsets])


def group_compute_s(groups: OpGraph, fine: OpGraph, topology: DeviceTopology, cost: CostModel) -> np.ndarray:
    """(G,) forward + backward seconds of each group on the topology's fastest device."""
    dev = max(topology.devices, key=lambda d: (d.peak_flops, d.memory_bytes))

    def op_s(op_name: str) -> float:
        op = fine.op(op_name)
        fwd, bwd = cost.task_times_s(
            op,
            1.0,
            op.output_shapes[0],
            op.param_bytes,
            dev.device_type,
            dev.peak_flops,
            dev.memory_bandwidth_bytes_per_s,
        )
        return fwd + bwd

    return np.array([sum(op_s(m) for m in (g.members or (g.name,))) for g in groups.ops])


def leaf_value(speedup: float, oom: bool) -> float:
    """The value of a completed plan for the tree search (TAG's public code): ``-1`` when it does not
    fit, else ``r = speedup - 1``, with ``r`` replaced by its fourth root above 1 (so a few very fast
    plans do not swamp the averages)."""
    if oom or not np.isfinite(speedup):
        return -1.0
    r = speedup - 1.0
    return float(r**0.25) if r > 1.0 else float(r)


@dataclass(frozen=True, eq=False)
class TagEval:
    """The simulation of one completed plan (shapes: ``G`` op groups, ``D`` devices).

    Attributes:
        makespan_s: the iteration time.
        oom: whether a device's simulated peak memory exceeds its capacity.
        speedup: data parallelism's makespan over this one.
        value: :func:`leaf_value` against the search baseline (data parallelism, or model
            parallelism when data parallelism does not fit).
        group_finish_s: (G,) when each group's last forward task ends.
        group_idle_s: (G,) the longest wait of a member's output before its first transfer starts.
        device_busy_s: (D,) compute seconds per device.
        peak_memory_bytes: (D,) simulated peak memory per device.
    """

    makespan_s: float
    oom: bool
    speedup: float
    value: float
    group_finish_s: np.ndarray
    group_idle_s: np.ndarray
    device_busy_s: np.ndarray
    peak_memory_bytes: np.ndarray


#: One group's completed choice: (subset index, option index, parameter-server turn).
Choice = tuple[int, int, int]


class TagProblem:
    """One model on one cluster in TAG's search space (see the module docstring).

    Args:
        graph: the model's op graph (plans are simulated on it).
        groups: its op groups (:func:`placement_rl.graph.coarsen.coarsen` of ``graph``), or
            ``graph`` itself when it is small.
        topology: the cluster.
        cost: the simulator's cost model (default: the simulator's).
        device_grouping: ``machine`` or ``gpu_type``.
        max_subsets: the cap on device-group subsets.
        fine_ctx: a :class:`SimContext` of ``graph`` to share (built when None).
        group_ctx: a :class:`SimContext` of ``groups`` to share (the memory estimates; built on first use).
        seed: METIS seed of the model-parallel splits.
        reference: the data parallelism speedups and leaf values are taken against
            (:data:`REFERENCES`: bucketed, or per tensor as TAG's DP-NCCL).

    Attributes:
        device_groups: the ``K`` device groups.
        subsets: the ``S`` subsets (tuples of device-group indices).
        num_actions: ``S * 4``.
        order: (G,) group indices in decision order (descending compute time).
        compute_s: (G,) each group's forward + backward seconds on the fastest device.
        baseline: the reference data parallelism's simulation on ``graph`` (of every speedup).
        baseline_s: the search baseline's makespan (data parallelism, or the layer-wise model-
            parallel plan when data parallelism does not fit).
    """

    def __init__(
        self,
        graph: OpGraph,
        groups: OpGraph,
        topology: DeviceTopology,
        cost: CostModel | None = None,
        *,
        device_grouping: str = "machine",
        max_subsets: int = DEFAULT_MAX_SUBSETS,
        fine_ctx: SimContext | None = None,
        group_ctx: SimContext | None = None,
        seed: int = 0,
        reference: str = "data_parallel",
    ) -> None:
        if reference not in REFERENCES:
            raise ValueError(f"reference {reference!r}; expected one of {list(REFERENCES)}")
        self.reference = reference
        self.graph, self.groups, self.topology = graph, groups, topology
        self.cost = cost or DEFAULT_COST_MODEL
        self.device_grouping = device_grouping
        self.device_groups = device_groups(topology, device_grouping)
        self.subsets = device_subsets(self.device_groups, topology, max_subsets)
        self.num_actions = len(self.subsets) * NUM_OPTIONS
        self.seed = seed
        self.ctx = fine_ctx or SimContext(graph, topology, self.cost)
        self._group_ctx = group_ctx
        self.compute_s = group_compute_s(groups, graph, topology, self.cost)
        self.order = np.argsort(-self.compute_s, kind="stable")
        self._op_index = {op.name: i for i, op in enumerate(graph.ops)}
        self._members: list[np.ndarray] = [
            np.array([self._op_index[m] for m in (g.members or (g.name,))], np.int64) for g in groups.ops
        ]
        self._device_index = {d.name: i for i, d in enumerate(topology.devices)}
        self._subset_devices: list[tuple[str, ...]] = [
            tuple(n for n in (d.name for d in topology.devices) if any(n in self.device_groups[k].devices for k in s))
            for s in self.subsets
        ]
        self._member_ops: dict[tuple[int, int, int, int], list[_CompiledOp]] = {}
        self._evals: OrderedDict[tuple[Choice, ...], TagEval] = OrderedDict()
        self._need: dict[tuple[int, int], np.ndarray] = {}
        self.capacity_bytes = np.array([d.memory_bytes for d in topology.devices], dtype=np.float64)
        self.baseline = self.ctx.simulate(REFERENCES[reference](graph, topology), validate=False)
        self.baseline_s = self.baseline.makespan_s
        if self.baseline.oom:
            self.baseline_s = self.ctx.simulate(layerwise(graph, topology), validate=False).makespan_s
        self.evaluations = 0  # simulations run (cache misses)

    @classmethod
    def for_graph(
        cls,
        graph: OpGraph,
        topology: DeviceTopology,
        cost: CostModel | None = None,
        *,
        max_groups: int = 60,
        balance_factor: float = 2.0,
        seed: int = 0,
        **options: object,
    ) -> TagProblem:
        """The problem of ``graph`` coarsened by METIS into at most ``max_groups`` op groups (TAG: 60,
        balance 2; the graph itself when it has no more ops); ``options`` as the constructor's."""
        from placement_rl.graph.coarsen import coarsen

        groups = (
            graph
            if graph.num_ops <= max_groups
            else coarsen(graph, max_groups, balance_factor=balance_factor, seed=seed)
        )
        return cls(graph, groups, topology, cost, seed=seed, **options)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- actions
    @property
    def num_groups(self) -> int:
        return self.groups.num_ops

    def action(self, subset: int, option: str | int) -> int:
        """The action index of ``subset`` (an index into :attr:`subsets`) with ``option``."""
        o = TAG_OPTIONS.index(option) if isinstance(option, str) else int(option)
        return subset * NUM_OPTIONS + o

    def describe(self, action: int) -> str:
        """``action`` in words: ``"m0+m1 all_reduce (6 GPUs)"``."""
        s, o = divmod(int(action), NUM_OPTIONS)
        names = "+".join(self.device_groups[k].name for k in self.subsets[s])
        return f"{names} {TAG_OPTIONS[o]} ({len(self._subset_devices[s])} GPUs)"

    def subset_devices(self, subset: int) -> tuple[str, ...]:
        """The device names of subset ``subset``, in topology order."""
        return self._subset_devices[subset]

    def check_actions(self, decisions: Sequence[int]) -> tuple[int, ...]:
        """``decisions`` as a tuple of ints, checked (one per decided group, each a valid action).

        Raises:
            ValueError: for too many decisions or an action outside ``0 .. num_actions - 1``.
        """
        out = tuple(int(a) for a in decisions)
        if len(out) > self.num_groups:
            raise ValueError(f"{len(out)} decisions for {self.num_groups} op groups")
        for k, a in enumerate(out):
            if not 0 <= a < self.num_actions:
                raise ValueError(f"decision {k} = {a}; expected an action 0..{self.num_actions - 1}")
        return out

    # -------------------------------------------------------------- completion
    def complete(self, decisions: Sequence[int]) -> tuple[Choice, ...]:
        """Every group's (subset, option, server turn), in group index order, by TAG's rule."""
        G = self.num_groups
        if not decisions:  # data parallelism: all device groups (always kept, see device_subsets)
            return ((self.subsets.index(tuple(range(len(self.device_groups)))), 0, 0),) * G
        out: list[Choice | None] = [None] * G
        turns: dict[int, int] = {}
        for k, a in enumerate(decisions):
            s, o = divmod(int(a), NUM_OPTIONS)
            turn = 0
            if TAG_OPTIONS[o] == "parameter_server":
                turn = turns.get(s, 0)
                turns[s] = turn + 1
            out[int(self.order[k])] = (s, o, turn)
        s0, o0 = divmod(int(decisions[0]), NUM_OPTIONS)
        return tuple(c if c is not None else (s0, o0, 0) for c in out)

    def group_config(self, g: int, choice: Choice) -> OpConfig:
        """Group ``g``'s configuration on the group graph (``model_parallel``: its first GPU; the
        split is per member op, see :meth:`member_configs`)."""
        s, o, turn = choice
        return tag_group_config(self.groups.ops[g], self._subset_devices[s], TAG_OPTIONS[o], turn)

    def member_configs(self, g: int, choice: Choice) -> list[OpConfig]:
        """The configurations of group ``g``'s member ops (in :attr:`groups` member order)."""
        s, o, _ = choice
        devs = self._subset_devices[s]
        members = [self.graph.ops[i] for i in self._members[g]]
        if TAG_OPTIONS[o] == "model_parallel":
            parts = self._model_parallel_parts(g, len(devs))
            return [OpConfig.make(devs[p]) for p in parts]
        cfg = self.group_config(g, choice)
        return [member_config(op, cfg) for op in members]

    def _model_parallel_parts(self, g: int, nparts: int) -> list[int]:
        from placement_rl.graph.coarsen import metis_parts

        members = self._members[g]
        if nparts <= 1:
            return [0] * len(members)
        sub = self.graph.subgraph([self.graph.ops[i].name for i in members])
        parts = metis_parts(sub, nparts, seed=self.seed)
        order = {op.name: p for op, p in zip(sub.ops, parts, strict=True)}
        return [int(order[self.graph.ops[i].name]) for i in members]

    def _compiled_members(self, g: int, choice: Choice) -> list[_CompiledOp]:
        key = (g, *choice)
        found = self._member_ops.get(key)
        if found is None:
            found = [
                self.ctx.compile_uncached(int(i), cfg)
                for i, cfg in zip(self._members[g], self.member_configs(g, choice), strict=True)
            ]
            self._member_ops[key] = found
        return found

    # -------------------------------------------------------------- evaluation
    def evaluate(self, decisions: Sequence[int]) -> TagEval:
        """The completed plan of ``decisions`` simulated on the original op graph (cached).

        ``decisions[k]`` is the action of group ``order[k]``; the rest follow TAG's rule.
        """
        return self.evaluate_completed(self.complete(self.check_actions(decisions)))

    def evaluate_completed(self, choices: tuple[Choice, ...]) -> TagEval:
        """:meth:`evaluate` of an already completed plan (one choice per group, group order)."""
        found = self._evals.get(choices)
        if found is not None:
            self._evals.move_to_end(choices)
            return found
        ctx = self.ctx
        ops: list[_CompiledOp | None] = [None] * self.graph.num_ops
        for g, choice in enumerate(choices):
            for i, c in zip(self._members[g].tolist(), self._compiled_members(g, choice), strict=True):
                ops[i] = c
        compiled: list[_CompiledOp] = ops  # type: ignore[assignment]
        arrays = ctx.with_shared(OpArrays.from_ops(compiled), compiled)
        tasks = ctx.assemble(arrays, EdgeArrays.from_flat(*ctx.transfers(compiled)))
        start, end, *_ = ctx.schedule(tasks)
        peak = ctx.peak_memory(arrays, tasks, start, end)
        makespan, fwd_end, idle, busy = runtime_feedback(ctx, tasks, start, end)
        oom = bool((peak > self.capacity_bytes).any())
        speedup = self.baseline.makespan_s / makespan if makespan > 0 else float("inf")
        value = leaf_value(self.baseline_s / makespan if makespan > 0 else float("inf"), oom)
        G = self.num_groups
        finish = np.array([fwd_end[m].max() for m in self._members])
        idle_g = np.array([idle[m].max() for m in self._members])
        result = TagEval(makespan, oom, speedup, value, finish[:G], idle_g[:G], busy, peak.astype(np.float64))
        self.evaluations += 1
        self._evals[choices] = result
        while len(self._evals) > _EVAL_CACHE:
            self._evals.popitem(last=False)
        return result

    def clear_evaluations(self) -> None:
        """Forget the cached leaf evaluations (the compiled ops stay): a later search simulates every
        plan again, as on a warm instance it has not searched (benchmarks)."""
        self._evals.clear()

    def plan(self, decisions: Sequence[int], name: str = "tag") -> Plan:
        """The completed plan of ``decisions`` on the original op graph."""
        decisions = self.check_actions(decisions)
        choices = self.complete(decisions)
        configs: dict[str, OpConfig] = {}
        for g, choice in enumerate(choices):
            for i, cfg in zip(self._members[g].tolist(), self.member_configs(g, choice), strict=True):
                configs[self.graph.ops[i].name] = cfg
        described = {self.groups.ops[int(self.order[k])].name: self.describe(a) for k, a in enumerate(decisions)}
        return Plan(
            self.graph.name,
            configs,
            name=name,
            metadata={"device_grouping": self.device_grouping, "decisions": described},
        )

    # ------------------------------------------------------------------ memory
    def need(self, g: int, action: int) -> np.ndarray:
        """(D,) bytes group ``g`` puts on each device under ``action``: the static state
        (parameters, gradients, optimizer state) plus forward activations of the group compiled as
        one op, all live at once; under ``model_parallel`` its one-GPU need spread evenly over the
        subset's GPUs (the memory estimate that masks actions; the simulation decides OOM)."""
        key = (g, int(action))
        found = self._need.get(key)
        if found is None:
            s, o = divmod(int(action), NUM_OPTIONS)
            devs = self._subset_devices[s]
            if TAG_OPTIONS[o] == "model_parallel":
                found = np.zeros(self.topology.num_devices)
                found[[self._device_index[n] for n in devs]] = self._group_bytes(g, OpConfig.make(devs[0])).sum() / len(
                    devs
                )
            else:
                found = self._group_bytes(g, self.group_config(g, (s, o, 0)))
            self._need[key] = found
        return found

    def _group_bytes(self, g: int, cfg: OpConfig) -> np.ndarray:
        """(D,) static plus activation bytes of group ``g`` compiled as one op under ``cfg``."""
        if self._group_ctx is None:
            self._group_ctx = SimContext(self.groups, self.topology, self.cost)
        c = self._group_ctx.compile_uncached(g, cfg)
        D = self.topology.num_devices
        found = np.bincount(c.devices, weights=c.activation_bytes, minlength=D)
        if c.static_devices.size:
            found = found + np.bincount(c.static_devices, weights=c.static_bytes, minlength=D)
        return found.astype(np.float64)

    def used(self, decisions: Sequence[int]) -> np.ndarray:
        """(D,) the memory estimate of the decided groups."""
        total = np.zeros(self.topology.num_devices)
        for k, a in enumerate(decisions):
            total += self.need(int(self.order[k]), int(a))
        return total

    def action_mask(self, decisions: Sequence[int], used: np.ndarray | None = None) -> np.ndarray:
        """(num_actions,) int8: 1 where the next group fits by the memory estimate; when nothing
        fits, every action (the plan then reports out-of-memory). All zeros when every group is decided."""
        mask = np.zeros(self.num_actions, np.int8)
        k = len(decisions)
        if k >= self.num_groups:
            return mask
        g = int(self.order[k])
        base = self.used(decisions) if used is None else used
        for a in range(self.num_actions):
            mask[a] = bool((base + self.need(g, a) <= self.capacity_bytes).all())
        if not mask.any():
            mask[:] = 1
        return mask
