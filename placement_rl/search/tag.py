"""TAG's search space (seed 001, sec. 4.1-4.2): op groups onto device-group subsets with a
replication option, scored on the original op graph.

A :class:`TagProblem` is one model (its op graph and METIS op groups) on one cluster. Its devices
are split into **device groups**, sets of GPUs of one type TAG treats as one unit: the topology's
machines (``device_grouping="machine"``, the paper's default; a machine holding several GPU types
is one group per type, named ``machine/type``, so a slow GPU can be left out of a fast machine)
or its GPU types (``"gpu_type"``, what the paper's physical testbed runs used). A decision for an
op group is an **action** ``a = s * num_options + o``: a non-empty subset ``s`` of device groups
(a row of TAG's placement matrix P) and one of the problem's options ``o``. TAG's four
(:data:`placement_rl.plan.TAG_OPTIONS`, ``options="tag"``: the paper's space, and the env's and the
GNN prior's by default) are

* ``all_reduce``: the group's sample dimension split over every GPU of the subset, gradients
  all-reduced (in buckets);
* ``parameter_server``: the same split with a parameter server, chosen round-robin over the
  subset's GPUs in decision order;
* ``duplicate``: every GPU of the subset runs the whole group, no gradient is exchanged;
* ``model_parallel``: the group's ops split again with METIS over the subset's GPUs, each op on one;

and ``options="extended"`` (:data:`TAG_EXTENDED_OPTIONS`, the default) adds what the plan format
has for models whose data-parallel plan does not fit:

* ``tensor_parallel``: the group's ops split along a parameter dimension over the subset's ``n``
  GPUs: ops of a Megatron-LM region (:func:`placement_rl.plan.tensor_parallel_regions` of degree
  ``n``: column-parallel ``channel``, row-parallel ``in_channel``, attention ``heads`` and the ops
  between) along the region's dimension; other ops with parameters along their output-feature
  parameter dimension (else their reduction one, e.g. ``in_channel``) over the largest degree ``<=
  n`` that divides it; ops without parameters data parallel over the subset;
* ``pipeline``: the group joins the pipeline over the subset's device groups: the ops of every
  group deciding ``pipeline`` on the same subset, in graph order, are cut into one contiguous stage
  per device group (forward + backward FLOPs in proportion to the groups' peak FLOP/s, each cut
  moved to where the fewest tensors cross, between layers: :func:`placement_rl.plan.light_cuts`;
  a stage is data parallel over its machine's GPUs), and the plan runs micro-batches (1F1B): the
  fewest that divide the batch and number at least four times the stages (Megatron-LM's rule),
  else the most below that, those that split evenly over every stage's GPUs first, as far as the
  other groups' splits allow;
* ``fsdp``: ``all_reduce`` with ZeRO stage 3 (parameters, gradients and optimizer state sharded
  over the subset's GPUs) on every op that can take it (:func:`placement_rl.plan.zero`).

**Subsets.** With ``K`` device groups there are ``2**K - 1`` subsets; the space keeps at most
``max_subsets`` of them by one rule (:func:`device_subsets`): every single group first (subset
``k`` is group ``k``, so action ``k * num_options + o`` is "group k, option o"), then all groups
together (data parallelism's placement), then the ``j`` fastest groups for ``j = 2 .. K - 1`` (by
total peak FLOP/s: the other data-parallel choices), then the remaining subsets by size and in
lexicographic order until the cap. With the default cap of 64 every subset of up to 6 groups is kept.

**Decisions and the completion rule.** Groups are decided in descending compute time
(:attr:`TagProblem.order`). A partial list of decisions is scored by completing it: every
undecided group gets an action, and the completed plan is simulated. TAG's rule
(``completion="tag"``) completes in one way: every undecided group takes the action of the first
decided group (the most expensive); with no decision the plan is data parallelism over every GPU.
That rule hides good decisions: on a CNN whose fully-connected layers should sit on one GPU, the
conv groups come first in the order, so every partial plan along the good path completes to data
parallelism (scores exactly as it) until the last conv group is decided, and a worse first move
("everything on one machine") outscores it. The default ``completion="best"`` scores a partial
plan by the best (:func:`better`: fitting first, then faster) of three completions
(:meth:`TagProblem.completions`):

* ``tag``: TAG's rule, as above;
* ``subset_data_parallel``: the undecided groups data parallel (``all_reduce``) over the union of
  the decided groups' device groups (the smallest kept subset holding it; every GPU when nothing is
  decided): the decisions so far say which machines are worth using;
* ``rollout``: one list-scheduling pass, no simulation until the end (HEFT-like: each group
  placed where it ends first). Groups are taken when their producers are placed, the one whose
  inputs are ready first. Each undecided group takes, of the candidate actions that fit by the
  memory estimate (:meth:`TagProblem.need`), the one with the lowest estimated end plus
  synchronization. The candidates: data parallelism over the union, or inside one of its device
  groups, or as one of its producers; for a group with parameters shared with no other group,
  also the parameter split (``tensor_parallel``) over the union. The estimate keeps when each
  device group is free: a group starts when its device groups are free and its inputs have
  arrived (a producer's output, the share held outside the two subsets' common GPUs, over the
  slowest link between them), and computes for its forward + backward seconds split evenly over
  the subset's GPUs (the slowest one sets the pace). Its synchronization: a ring all-reduce of its
  parameters over the subset when data parallel; for a parameter shared by several groups (an
  LSTM layer's steps, one ``param_key``), over the union of every device group running it, so the
  steps of a layer stay together; under ``tensor_parallel`` its inputs and outputs are gathered
  over the subset instead. Parameter-heavy layers over slow links thus leave the network, slow
  GPUs are left out, an embedding table is split, and the layers of a recurrent model spread
  over the machines as a wavefront.

Each completion is a full decision list, simulated once (cached per completed plan); the partial
plan's :class:`TagEval` is the best one's, and its ``decisions`` the full list that reproduces it
exactly (:meth:`TagProblem.plan`, :meth:`TagProblem.completion`). The score is therefore never
worse than either of the two uniform rules, at most three simulations per new partial plan.

**Scores.** :meth:`TagProblem.evaluate` simulates the completed plan on the original op graph,
exactly as :func:`placement_rl.simulate` would (the same compiled ops, task graph and schedule),
so a leaf's score ranks plans as the final simulation does. Per-member compiled ops are cached per
(group, subset, option, server) and whole evaluations per completed plan and per partial plan, so
a tree search pays only for plans it has not seen (a plan with a ``pipeline`` group runs
micro-batches and is simulated as a whole, :meth:`placement_rl.sim.simulator.SimContext.simulate`).
Nothing here deep-copies anything.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import Op, OpGraph, ParallelDim
from placement_rl.plan import (
    TAG_OPTIONS,
    OpConfig,
    Plan,
    data_parallel,
    data_parallel_per_tensor,
    layerwise,
    member_config,
    tag_group_config,
    tensor_parallel_regions,
    zero_holders,
)
from placement_rl.plan.constructors import _stage_config, light_cuts
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
#: TAG's four options plus parameter (tensor) split, pipeline stages and ZeRO-3 (see the module docstring).
TAG_EXTENDED_OPTIONS: tuple[str, ...] = (*TAG_OPTIONS, "tensor_parallel", "pipeline", "fsdp")
#: Named option sets (``options=`` of :class:`TagProblem`).
OPTION_SETS: dict[str, tuple[str, ...]] = {"tag": TAG_OPTIONS, "extended": TAG_EXTENDED_OPTIONS}
#: How partial plans are completed (``completion=`` of :class:`TagProblem`; the module docstring).
COMPLETIONS: tuple[str, ...] = ("best", "tag")
#: Options of TAG's space (the env's action space is ``max_subsets * NUM_OPTIONS`` with its default ``tag_options``).
NUM_OPTIONS = len(TAG_OPTIONS)
_EVAL_CACHE = 4096
#: Options whose members are each placed on one device or split by their own rule (memory estimate:
#: the one-GPU need spread evenly over the subset).
_SPREAD_OPTIONS = frozenset({"model_parallel", "tensor_parallel", "pipeline"})


def option_set(options: str | Sequence[str]) -> tuple[str, ...]:
    """The option names of ``options``: a named set (:data:`OPTION_SETS`) or a list of names.

    Raises:
        ValueError: for an unknown set or option, a repeated option, or a list without
            ``all_reduce`` (data parallelism, the search's start).
    """
    if isinstance(options, str):
        if options not in OPTION_SETS:
            raise ValueError(f"options = {options!r}; expected one of {list(OPTION_SETS)} or a list of options")
        return OPTION_SETS[options]
    if not isinstance(options, (list, tuple)):
        raise ValueError(f"options = {options!r}; expected one of {list(OPTION_SETS)} or a list of options")
    names = tuple(options)
    unknown = [o for o in names if o not in TAG_EXTENDED_OPTIONS]
    if unknown or not names:
        raise ValueError(
            f"options = {list(names)!r}: unknown option(s) {unknown}; expected names from {list(TAG_EXTENDED_OPTIONS)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"options = {list(names)!r} name an option twice; expected each once")
    if "all_reduce" not in names:
        raise ValueError(f"options = {list(names)!r} lack 'all_reduce'; data parallelism is the search's start")
    return names


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
    """The device groups of ``topology``, in order of first appearance: its machines (a machine with
    several GPU types split into one group per type, named ``machine/type``), or its GPU types.

    Raises:
        ValueError: for an unknown ``grouping``.
    """
    if grouping not in DEVICE_GROUPINGS:
        raise ValueError(f"device grouping {grouping!r}; expected one of {list(DEVICE_GROUPINGS)}")
    if grouping == "gpu_type":
        keys = [d.device_type for d in topology.devices]
    else:
        types: dict[str, set[str]] = {}
        for d in topology.devices:
            types.setdefault(d.machine, set()).add(d.device_type)
        keys = [d.machine if len(types[d.machine]) == 1 else f"{d.machine}/{d.device_type}" for d in topology.devices]
    by: dict[str, list[str]] = {}
    for key, d in zip(keys, topology.devices, strict=True):
        by.setdefault(key, []).append(d.name)
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
        group_idle_s: (G,) the longest wait of a member's output before its first transfer starts
            (zeros for a plan with micro-batches).
        device_busy_s: (D,) compute seconds per device.
        peak_memory_bytes: (D,) simulated peak memory per device.
        decisions: the completed plan as a full decision list (one action per group, decision
            order): :meth:`TagProblem.plan` of it is this plan.
    """

    makespan_s: float
    oom: bool
    speedup: float
    value: float
    group_finish_s: np.ndarray
    group_idle_s: np.ndarray
    device_busy_s: np.ndarray
    peak_memory_bytes: np.ndarray
    decisions: tuple[int, ...] = ()


def better(a: TagEval, b: TagEval) -> bool:
    """Whether ``a`` is a better plan than ``b``: fits where ``b`` does not, else faster."""
    if a.oom != b.oom:
        return not a.oom
    return a.makespan_s < b.makespan_s


@dataclass
class _RolloutState:
    """The rollout's bookkeeping: when each device group is free (``(K,)`` seconds), when each op group
    ends (``(G,)`` seconds), which subset first took each shared parameter (``param_key``) and the
    memory estimate of the groups placed so far (``(D,)`` bytes, :meth:`TagProblem.need`)."""

    free_s: np.ndarray
    end_s: np.ndarray
    key_subset: dict[str, int]
    used_bytes: np.ndarray


#: One group's completed choice: (subset index, option index, parameter-server turn).
Choice = tuple[int, int, int]


def _ring_s(num_bytes: float, n: int, bandwidth: float) -> float:
    """Seconds of a ring all-reduce of ``num_bytes`` over ``n`` GPUs whose slowest link carries
    ``bandwidth`` bytes/s (0 for one GPU)."""
    return 2.0 * (n - 1) / n * num_bytes / bandwidth if n > 1 else 0.0


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _largest_divisor(size: int, limit: int) -> int:
    return max(d for d in range(1, max(min(size, limit), 1) + 1) if size % d == 0)


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
        options: the replication options: ``"extended"`` (:data:`TAG_EXTENDED_OPTIONS`), ``"tag"``
            (TAG's four) or a list of option names (with ``all_reduce``).
        completion: how partial plans are completed (:data:`COMPLETIONS`): ``"best"`` of three
            completions or TAG's rule ``"tag"`` (the module docstring).

    Attributes:
        device_groups: the ``K`` device groups.
        subsets: the ``S`` subsets (tuples of device-group indices).
        options: the option names, in action order.
        num_options: ``len(options)``.
        num_actions: ``S * num_options``.
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
        options: str | Sequence[str] = "extended",
        completion: str = "best",
    ) -> None:
        if reference not in REFERENCES:
            raise ValueError(f"reference {reference!r}; expected one of {list(REFERENCES)}")
        if completion not in COMPLETIONS:
            raise ValueError(f"completion = {completion!r}; expected one of {list(COMPLETIONS)}")
        self.reference = reference
        self.completion_rule = completion
        self.options = option_set(options)
        self.num_options = len(self.options)
        self.graph, self.groups, self.topology = graph, groups, topology
        self.cost = cost or DEFAULT_COST_MODEL
        self.device_grouping = device_grouping
        self.device_groups = device_groups(topology, device_grouping)
        self.subsets = device_subsets(self.device_groups, topology, max_subsets)
        self.num_actions = len(self.subsets) * self.num_options
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
        self._partial: OrderedDict[tuple[int, ...], TagEval] = OrderedDict()
        self._need: dict[tuple[int, int], np.ndarray] = {}
        self._tp_splits: dict[int, dict[int, str]] = {}
        self._union: dict[frozenset[int], int] = {}
        self._gpipe: set[tuple[Choice, ...]] = set()  # pipelined plans 1F1B cannot order
        self._batch_divisors: list[int] | None = None
        self._cuts: OrderedDict[tuple[int, tuple[int, ...]], list[int]] = OrderedDict()
        self._subset_stats: dict[int, tuple[float, float, int]] = {}
        self.capacity_bytes = np.array([d.memory_bytes for d in topology.devices], dtype=np.float64)
        index = {op.name: i for i, op in enumerate(groups.ops)}
        self._edge_bytes: dict[tuple[int, int], float] = {}  # bytes from group to group (the rollout's estimate)
        for t in groups.tensors:
            key = (index[t.src], index[t.dst])
            self._edge_bytes[key] = self._edge_bytes.get(key, 0.0) + t.num_bytes
        self._producers = [tuple(dict.fromkeys(p)) for p in groups.predecessors]  # distinct, in order
        self._consumers = [tuple(dict.fromkeys(c)) for c in groups.successors]
        self._io_bytes = np.zeros(groups.num_ops)  # bytes in and out of each group
        for (src, dst), num_bytes in self._edge_bytes.items():
            self._io_bytes[src] += num_bytes
            self._io_bytes[dst] += num_bytes
        self._pair_link: dict[tuple[int, int], tuple[float, float]] = {}
        shared: dict[str, int] = {}
        for op in graph.ops:
            if op.param_key is not None and op.param_bytes > 0:
                shared[op.param_key] = shared.get(op.param_key, 0) + 1
        self._group_keys: list[list[tuple[str, float]]] = []  # each group's parameters shared with other ops
        self._own_bytes = np.zeros(groups.num_ops)  # and its parameter bytes shared with none
        for g, m in enumerate(self._members):
            keys: dict[str, float] = {}
            for i in m.tolist():
                op = graph.ops[i]
                if op.param_key is not None and shared.get(op.param_key, 0) > 1:
                    keys[op.param_key] = max(keys.get(op.param_key, 0.0), float(op.param_bytes))
                else:
                    self._own_bytes[g] += op.param_bytes
            self._group_keys.append(sorted(keys.items()))
        self._all_groups = self.subsets.index(tuple(range(len(self.device_groups))))
        self._all_reduce = self.options.index("all_reduce")
        self._server = self.options.index("parameter_server") if "parameter_server" in self.options else -1
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
        o = self.options.index(option) if isinstance(option, str) else int(option)
        return subset * self.num_options + o

    def describe(self, action: int) -> str:
        """``action`` in words: ``"m0+m1 all_reduce (6 GPUs)"``."""
        s, o = divmod(int(action), self.num_options)
        names = "+".join(self.device_groups[k].name for k in self.subsets[s])
        return f"{names} {self.options[o]} ({len(self._subset_devices[s])} GPUs)"

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
    def completions(self, decisions: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """The candidate completions of ``decisions`` by name (``tag``, and with ``completion="best"``
        also ``subset_data_parallel`` and ``rollout``; ``decided`` when every group is decided), each a
        full decision list (decision order). See the module docstring."""
        return self._completions(self.check_actions(decisions))

    def _completions(self, decisions: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        G, k = self.num_groups, len(decisions)
        if k == G:
            return {"decided": decisions}
        rest = G - k
        dp_all = self._all_groups * self.num_options + self._all_reduce
        first = decisions[0] if decisions else dp_all
        out = {"tag": (*decisions, *([first] * rest))}
        if self.completion_rule == "best":
            union = self._union_subset(decisions)
            out["subset_data_parallel"] = (*decisions, *([union * self.num_options + self._all_reduce] * rest))
            out["rollout"] = self._rollout(decisions, union)
        return out

    def completion(self, decisions: Sequence[int]) -> tuple[int, ...]:
        """The full decision list that scores ``decisions`` (the best of :meth:`completions`)."""
        decisions = self.check_actions(decisions)
        candidates = self._completions(decisions)
        if len(candidates) == 1:
            return next(iter(candidates.values()))
        return self.evaluate(decisions).decisions

    def complete(self, decisions: Sequence[int]) -> tuple[Choice, ...]:
        """Every group's (subset, option, server turn), in group index order, of :meth:`completion`."""
        return self._choices(self.completion(decisions))

    def _choices(self, full: Sequence[int]) -> tuple[Choice, ...]:
        """The choices of a full decision list (servers round-robin per subset in decision order)."""
        out: list[Choice] = [(0, 0, 0)] * self.num_groups
        turns: dict[int, int] = {}
        for k, a in enumerate(full):
            s, o = divmod(int(a), self.num_options)
            turn = 0
            if o == self._server:
                turn = turns.get(s, 0)
                turns[s] = turn + 1
            out[int(self.order[k])] = (s, o, turn)
        return tuple(out)

    def _full(self, choices: Sequence[Choice]) -> tuple[int, ...]:
        """The full decision list of ``choices`` (the inverse of :meth:`_choices`)."""
        return tuple(choices[int(g)][0] * self.num_options + choices[int(g)][1] for g in self.order)

    def _union_subset(self, decisions: Sequence[int]) -> int:
        """The smallest kept subset holding every device group the decisions use (all groups when none)."""
        return self._union_subset_of(frozenset(k for a in decisions for k in self.subsets[int(a) // self.num_options]))

    def _stats(self, subset: int) -> tuple[float, float, int]:
        """(even-split speed: GPUs x the slowest GPU's peak FLOP/s over the fastest device's, slowest
        link in B/s, GPUs) of a subset."""
        found = self._subset_stats.get(subset)
        if found is None:
            ids = [self._device_index[n] for n in self._subset_devices[subset]]
            peak = max(d.peak_flops for d in self.topology.devices)
            speed = len(ids) * min(self.topology.devices[i].peak_flops for i in ids) / peak
            bw = self.topology.bandwidth_matrix()[np.ix_(ids, ids)]
            off = bw[~np.eye(len(ids), dtype=bool)]
            found = (speed, float(off.min()) if off.size else math.inf, len(ids))
            self._subset_stats[subset] = found
        return found

    def _link_s(self, num_bytes: float, a: int, b: int) -> float:
        """Seconds to move a tensor of ``num_bytes`` split evenly over subset ``a``'s GPUs to the same
        split over ``b``'s: the share held by GPUs outside the two subsets' intersection, over the
        slowest link of their union (0 when equal)."""
        if a == b or num_bytes <= 0:
            return 0.0
        key = (a, b) if a < b else (b, a)
        found = self._pair_link.get(key)
        if found is None:
            devs_a, devs_b = set(self._subset_devices[a]), set(self._subset_devices[b])
            moved = 1.0 - len(devs_a & devs_b) / len(devs_a | devs_b)
            bw = self._stats(self._pair_union(a, b))[1]
            found = (moved, bw)
            self._pair_link[key] = found
        moved, bw = found
        return moved * num_bytes / bw if math.isfinite(bw) else 0.0

    def _pair_union(self, a: int, b: int) -> int:
        """The smallest kept subset holding the device groups of subsets ``a`` and ``b``."""
        return self._union_subset_of(frozenset(self.subsets[a]) | frozenset(self.subsets[b]))

    def _union_subset_of(self, used: frozenset[int]) -> int:
        """The smallest kept subset holding the device groups ``used`` (all groups when empty)."""
        found = self._union.get(used)
        if found is None:
            if not used:
                found = self._all_groups
            else:
                holding = [i for i, s in enumerate(self.subsets) if used <= set(s)]
                found = min(holding, key=lambda i: (len(self.subsets[i]), i))
            self._union[used] = found
        return found

    def _rollout(self, decisions: tuple[int, ...], union: int) -> tuple[int, ...]:
        """The ``rollout`` completion (module docstring): one list-scheduling pass, no simulation.
        Groups are taken when their producers are placed, the one whose inputs are ready first
        (ties in graph order); each undecided group takes, of the candidate actions that fit by the
        memory estimate (:meth:`need`; all when none does), the one that ends it first by an
        estimate (:meth:`_estimate`); decided groups only occupy their device groups."""
        no, ar = self.num_options, self._all_reduce
        tp = self.options.index("tensor_parallel") if "tensor_parallel" in self.options else -1
        decided = {int(self.order[k]): int(a) for k, a in enumerate(decisions)}
        members = self.subsets[union]
        singles = [self.subsets.index((k,)) for k in members]
        dp = union * no + ar
        assigned: dict[int, int] = {}
        state = _RolloutState(
            np.zeros(len(self.device_groups)), np.zeros(self.num_groups), {}, np.zeros(self.topology.num_devices)
        )
        waiting = np.array([len(p) for p in self._producers])
        ready = [(0.0, g) for g in range(self.num_groups) if waiting[g] == 0]
        heapq.heapify(ready)
        while ready:
            _, g = heapq.heappop(ready)
            if g in decided:
                candidates = [decided[g]]
            else:  # data parallel over the union or one of its device groups, or as a producer
                producers = [assigned[p] for p in self._producers[g] if p in assigned]
                candidates = list(dict.fromkeys([dp, *(k * no + ar for k in singles if k != union), *producers]))
                if tp >= 0 and len(self._subset_devices[union]) > 1 and self._own_bytes[g] > 0:
                    if not self._group_keys[g]:
                        candidates.append(union * no + tp)
                fits = [a for a in candidates if (state.used_bytes + self.need(g, a) <= self.capacity_bytes).all()]
                candidates = fits or candidates
            costs = [self._estimate(g, a, state, assigned) for a in candidates]
            best = int(np.argmin([c[0] for c in costs]))
            assigned[g] = candidates[best]
            self._occupy(g, candidates[best], costs[best][1], state)
            state.used_bytes += self.need(g, candidates[best])
            for c in self._consumers[g]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    inputs = max(float(state.end_s[p]) for p in self._producers[c])
                    heapq.heappush(ready, (inputs, c))
        return tuple(assigned[int(g)] for g in self.order)

    def _estimate(self, g: int, action: int, state: _RolloutState, assigned: dict[int, int]) -> tuple[float, float]:
        """The rollout's (cost, end) of group ``g`` under ``action``: it starts when its subset's device
        groups are free and its inputs have arrived (a producer's output crosses the slowest link
        between their subsets when they differ), computes for its forward + backward seconds split
        evenly over the subset's GPUs; the cost adds the synchronization its parameters then need: a
        ring all-reduce over the subset when data parallel (a parameter shared with other groups, a
        ``param_key``, by the first group that takes it), and over the union with the device groups
        already holding a shared parameter when this subset adds to them. Split along a parameter
        dimension (``tensor_parallel``), its input and output tensors are gathered over the subset,
        forward and backward, before it ends."""
        s, o = divmod(action, self.num_options)
        speed, bw, n = self._stats(s)
        begin = max((state.free_s[k] for k in self.subsets[s]), default=0.0)
        for p in self._producers[g]:
            a = assigned.get(p)
            if a is not None:
                arrive = state.end_s[p] + self._link_s(self._edge_bytes.get((p, g), 0.0), a // self.num_options, s)
                begin = max(begin, arrive)
        end = begin + float(self.compute_s[g]) / speed
        sync = 0.0
        replicated = self.options[o] in ("all_reduce", "parameter_server", "fsdp")
        if replicated:
            sync += _ring_s(self._own_bytes[g], n, bw)
        elif self.options[o] == "tensor_parallel" and (self._own_bytes[g] > 0 or self._group_keys[g]):
            end += _ring_s(self._io_bytes[g], n, bw)  # activations gathered, forward and backward
        for key, key_bytes in self._group_keys[g]:
            holder = state.key_subset.get(key, s)
            if holder != s:  # every device group holding the key synchronizes it
                both = self._pair_union(holder, s)
                if both != holder:
                    _, kbw, kn = self._stats(both)
                    sync += _ring_s(key_bytes, kn, kbw)
            elif key not in state.key_subset and replicated:
                sync += _ring_s(key_bytes, n, bw)
        return end + sync, end

    def _occupy(self, g: int, action: int, end_s: float, state: _RolloutState) -> None:
        s = action // self.num_options
        for k in self.subsets[s]:
            state.free_s[k] = end_s
        state.end_s[g] = end_s
        for key, _ in self._group_keys[g]:
            state.key_subset.setdefault(key, s)

    # ----------------------------------------------------------------- configs
    def group_config(self, g: int, choice: Choice) -> OpConfig:
        """Group ``g``'s configuration on the group graph (``model_parallel``, ``tensor_parallel`` and
        ``pipeline``: its first GPU; their splits are per member op, see :meth:`member_configs`)."""
        s, o, turn = choice
        devs = self._subset_devices[s]
        option = self.options[o]
        group = self.groups.ops[g]
        if option in _SPREAD_OPTIONS:
            return OpConfig.make(devs[0])
        if option == "fsdp":
            cfg = tag_group_config(group, devs, "all_reduce")
            return cfg.replace(zero=3) if group.param_bytes > 0 and zero_holders(group, cfg) >= 2 else cfg
        return tag_group_config(group, devs, option, turn)

    def member_configs(self, g: int, choice: Choice) -> list[OpConfig]:
        """The configurations of group ``g``'s member ops (in :attr:`groups` member order); a
        ``pipeline`` choice as a pipeline of this group alone (in a plan its stages depend on the
        other groups on the same pipeline: :meth:`plan`)."""
        s, o, _ = choice
        devs = self._subset_devices[s]
        option = self.options[o]
        members = [self.graph.ops[i] for i in self._members[g]]
        if option == "model_parallel":
            parts = self._model_parallel_parts(g, len(devs))
            return [OpConfig.make(devs[p]) for p in parts]
        if option == "tensor_parallel":
            return self._tensor_parallel_configs(g, devs)
        if option == "pipeline":
            configs: list[OpConfig | None] = [None] * self.graph.num_ops
            self._pipeline_configs({s: self._members[g].tolist()}, configs)
            return [c for c in (configs[i] for i in self._members[g].tolist()) if c is not None]  # every member set
        cfg = self.group_config(g, choice)
        if option == "fsdp":
            base = cfg.replace(zero=0)
            out = []
            for op in members:
                member = member_config(op, base)
                eligible = op.param_bytes > 0 and len(devs) > 1 and zero_holders(op, member) >= 2
                out.append(member.replace(zero=3) if eligible else member)
            return out
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

    def _tensor_parallel_configs(self, g: int, devs: tuple[str, ...]) -> list[OpConfig]:
        """``tensor_parallel`` of group ``g`` over ``devs`` (module docstring)."""
        n = len(devs)
        splits = self._regions(n) if n > 1 else {}
        dp = tag_group_config(self.groups.ops[g], devs, "all_reduce")
        out = []
        for i in self._members[g].tolist():
            op = self.graph.ops[i]
            dim = splits.get(i)
            if dim is not None:
                out.append(OpConfig.make(devs, {dim: n}))
                continue
            pdim = _parameter_dim(op)
            degree = _largest_divisor(pdim.size, n) if pdim is not None else 1
            if pdim is not None and degree > 1:
                out.append(OpConfig.make(devs[:degree], {pdim.name: degree}))
            else:
                out.append(member_config(op, dp))
        return out

    def _regions(self, degree: int) -> dict[int, str]:
        """Op index -> split dimension of the Megatron-LM regions of ``degree`` (cached)."""
        found = self._tp_splits.get(degree)
        if found is None:
            found = {
                self._op_index[name]: dim
                for region in tensor_parallel_regions(self.graph, degree)
                for name, dim in region.splits
            }
            self._tp_splits[degree] = found
        return found

    def _pipeline_configs(self, pipelines: dict[int, list[int]], configs: list[OpConfig | None]) -> int:
        """Fill ``configs`` for the ops of each pipeline (subset -> op indices) and return the
        micro-batches (module docstring); ``configs`` holds every other op's configuration."""
        stages: list[tuple[tuple[str, ...], list[int]]] = []
        most, widest = 1, 1
        for s, ops in pipelines.items():
            ops = sorted(ops)
            groups = [self.device_groups[k].devices for k in self.subsets[s]]
            S = min(len(groups), len(ops))
            groups = groups[:S]
            speed = [sum(self.topology.device(n).peak_flops for n in devs) for devs in groups]
            cuts = self._stage_cuts(s, tuple(ops), speed)
            stages += [(groups[k], ops[cuts[k] : cuts[k + 1]]) for k in range(S)]
            most, widest = max(most, S), max(widest, *(len(devs) for devs in groups))
        for m in self._micro_batch_candidates(most, widest):
            for devs, ops in stages:
                for i in ops:
                    configs[i] = _stage_config(self.graph.ops[i], devs, m)
            if m == 1 or self._schedule_valid(configs, m):
                return m
        return 1  # pragma: no cover (m = 1 is always a candidate)

    def _stage_cuts(self, subset: int, ops: tuple[int, ...], speed: list[float]) -> list[int]:
        """Cut positions (into ``ops``) of the pipeline over ``subset``'s device groups (cached)."""
        key = (subset, ops)
        found = self._cuts.get(key)
        if found is None:
            S = len(speed)
            if S == 1:
                found = [0, len(ops)]
            elif len(ops) == self.graph.num_ops:
                found = light_cuts(self.graph, S, speed)
            else:
                found = light_cuts(self.graph.subgraph([self.graph.ops[i].name for i in ops]), S, speed)
            self._cuts[key] = found
            while len(self._cuts) > _EVAL_CACHE:
                self._cuts.popitem(last=False)
        return found

    def _micro_batch_candidates(self, stages: int, widest: int = 1) -> list[int]:
        """Micro-batch counts to try for ``stages`` stages of at most ``widest`` GPUs: divisors of
        every sample dimension, the fewest at least ``4 * stages`` first, then fewer ones, down to 1;
        those whose micro-batch splits evenly over ``widest`` GPUs before the others."""
        if stages <= 1:
            return [1]
        if self._batch_divisors is None:
            sizes = [op.sample_dim.size for op in self.graph.ops if op.sample_dim is not None]
            self._batch_divisors = _divisors(math.gcd(*sizes)) if sizes else [1]
        divisors = self._batch_divisors
        batch = divisors[-1]
        ordered = [d for d in divisors if d >= 4 * stages] + [d for d in reversed(divisors) if d < 4 * stages]
        even = [d for d in ordered if (batch // d) % widest == 0]
        return even + [d for d in ordered if d not in even]

    def _schedule_valid(self, configs: Sequence[OpConfig | None], m: int) -> bool:
        plan = Plan(
            self.graph.name, {op.name: c for op, c in zip(self.graph.ops, configs, strict=True) if c}, micro_batches=m
        )
        try:
            plan.validate_schedule(self.graph)
        except ValueError:
            return False
        return True

    def _configs(self, choices: Sequence[Choice]) -> tuple[list[OpConfig], int]:
        """Every original op's configuration (graph order) under ``choices``, and the micro-batches."""
        configs: list[OpConfig | None] = [None] * self.graph.num_ops
        pipelines: dict[int, list[int]] = {}
        for g, choice in enumerate(choices):
            if self.options[choice[1]] == "pipeline":
                pipelines.setdefault(choice[0], []).extend(self._members[g].tolist())
                continue
            for i, cfg in zip(self._members[g].tolist(), self.member_configs(g, choice), strict=True):
                configs[i] = cfg
        m = self._pipeline_configs(pipelines, configs) if pipelines else 1
        return configs, m  # type: ignore[return-value]

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
        """The partial plan of ``decisions`` completed and simulated on the original op graph (cached):
        the best of :meth:`completions` (fitting first, then faster).

        ``decisions[k]`` is the action of group ``order[k]``; the result's ``decisions`` is the full list.
        """
        decisions = self.check_actions(decisions)
        found = self._partial.get(decisions)
        if found is not None:
            self._partial.move_to_end(decisions)
            return found
        best: TagEval | None = None
        for full in self._completions(decisions).values():
            e = self.evaluate_completed(self._choices(full))
            if best is None or better(e, best):
                best = e
        assert best is not None
        self._partial[decisions] = best
        while len(self._partial) > _EVAL_CACHE:
            self._partial.popitem(last=False)
        return best

    def evaluate_completed(self, choices: tuple[Choice, ...]) -> TagEval:
        """The simulation of an already completed plan (one choice per group, group order; cached)."""
        found = self._evals.get(choices)
        if found is not None:
            self._evals.move_to_end(choices)
            return found
        if any(self.options[o] == "pipeline" for _, o, _ in choices):
            result = self._evaluate_plan(choices)
        else:
            result = self._evaluate_fast(choices)
        self.evaluations += 1
        self._evals[choices] = result
        while len(self._evals) > _EVAL_CACHE:
            self._evals.popitem(last=False)
        return result

    def _eval(
        self,
        makespan: float,
        oom: bool,
        finish: np.ndarray,
        idle: np.ndarray,
        busy: np.ndarray,
        peak: np.ndarray,
        choices: Sequence[Choice],
    ) -> TagEval:
        speedup = self.baseline.makespan_s / makespan if makespan > 0 else float("inf")
        value = leaf_value(self.baseline_s / makespan if makespan > 0 else float("inf"), oom)
        return TagEval(makespan, oom, speedup, value, finish, idle, busy, peak.astype(np.float64), self._full(choices))

    def _evaluate_fast(self, choices: tuple[Choice, ...]) -> TagEval:
        """A plan without micro-batches: per-member compiled ops (cached) assembled and scheduled."""
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
        finish = np.array([fwd_end[m].max() for m in self._members])
        idle_g = np.array([idle[m].max() for m in self._members])
        return self._eval(makespan, oom, finish, idle_g, busy, peak, choices)

    def _evaluate_plan(self, choices: tuple[Choice, ...]) -> TagEval:
        """A plan with a pipeline: simulated whole (micro-batches), as :func:`placement_rl.simulate`,
        under 1F1B, or GPipe where the plan's stages do not form one pipeline (other groups on other
        devices between them), which 1F1B cannot order."""
        from placement_rl.sim.pipeline import ScheduleDeadlock

        plan = self._plan(choices, "tag")
        try:
            result = self.ctx.simulate(plan, validate=False)
        except ScheduleDeadlock:
            self._gpipe.add(choices)
            result = self.ctx.simulate(plan.with_schedule(schedule="gpipe"), validate=False)
        finish = np.array([result.op_forward_end_s[m].max() for m in self._members])
        return self._eval(
            result.makespan_s,
            bool(result.oom),
            finish,
            np.zeros(self.num_groups),
            np.asarray(result.busy_s, np.float64),
            np.asarray(result.peak_memory_bytes),
            choices,
        )

    def clear_evaluations(self) -> None:
        """Forget the cached leaf evaluations (the compiled ops stay): a later search simulates every
        plan again, as on a warm instance it has not searched (benchmarks)."""
        self._evals.clear()
        self._partial.clear()
        self._gpipe.clear()

    def _plan(self, choices: Sequence[Choice], name: str, metadata: dict[str, object] | None = None) -> Plan:
        configs, m = self._configs(choices)
        return Plan(
            self.graph.name,
            {op.name: cfg for op, cfg in zip(self.graph.ops, configs, strict=True)},
            name=name,
            metadata=metadata or {},
            micro_batches=m,
            schedule="gpipe" if tuple(choices) in self._gpipe else "1f1b",
        )

    def plan(self, decisions: Sequence[int], name: str = "tag") -> Plan:
        """The completed plan of ``decisions`` (:meth:`completion`) on the original op graph."""
        decisions = self.check_actions(decisions)
        full = self.completion(decisions)
        described = {self.groups.ops[int(self.order[k])].name: self.describe(a) for k, a in enumerate(full)}
        metadata: dict[str, object] = {
            "device_grouping": self.device_grouping,
            "decisions": described,
            "decided": len(decisions),
        }
        choices = self._choices(full)
        if any(self.options[o] == "pipeline" for _, o, _ in choices):
            self.evaluate_completed(choices)  # it says whether 1F1B can order the pipeline
        return self._plan(choices, name, metadata)

    # ------------------------------------------------------------------ memory
    def need(self, g: int, action: int) -> np.ndarray:
        """(D,) bytes group ``g`` puts on each device under ``action``: the static state
        (parameters, gradients, optimizer state) plus forward activations of the group compiled as
        one op, all live at once; under ``model_parallel``, ``tensor_parallel`` and ``pipeline`` its
        one-GPU need spread evenly over the subset's GPUs (the memory estimate that masks actions;
        the simulation decides OOM)."""
        key = (g, int(action))
        found = self._need.get(key)
        if found is None:
            s, o = divmod(int(action), self.num_options)
            devs = self._subset_devices[s]
            if self.options[o] in _SPREAD_OPTIONS:
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


def _parameter_dim(op: Op) -> ParallelDim | None:
    """The parameter dimension ``tensor_parallel`` splits an op along outside Megatron regions: its
    output-feature one, else a reduction one (``in_channel``); None without parameters."""
    if op.param_bytes <= 0:
        return None
    dims = [d for d in op.parallel_dims if d.kind == "parameter"]
    return next((d for d in dims if not d.reduction), None) or next(iter(dims), None)
