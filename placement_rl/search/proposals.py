"""MCMC proposal kinds beyond FlexFlow's "one random op, one random configuration".

A proposal is a mapping ``{op index: new configuration}`` of one or more ops (evaluated at once by
:meth:`~placement_rl.sim.delta.DeltaSimulator.propose_many`). The kinds:

``flexflow``
    FlexFlow's: a uniformly random op gets a configuration drawn from its SOAP set
    (:meth:`~placement_rl.search.space.SearchSpace.random_config`). Alone (``proposals="flexflow"``,
    the default) it draws from the random generator exactly as the search always did, so a seed and
    a proposal budget give the same plan as before.
``neighbour``
    A random op takes the configuration of a random graph neighbour (producer or consumer): the same
    devices, degrees and sync mode where they are valid for it, else the nearest valid one (the same
    devices and partition count split along its own dimensions, preferring its sample dimension;
    else the largest partition count that fits, on the first of those devices).
``group``
    A connected group of 2 to ``max_group`` ops, grown breadth-first from a random op (or, half of
    the time, every op sharing a random op's parameters: an unrolled recurrent layer), moves
    together to one device group: half of the time all devices, one machine's or one device type's
    devices, else a machine view of a random size (``start + stride * k``, one device included).
    The ops are split along the batch over it (data parallel) or, a quarter of the time, along a
    parameter dimension (model parallel).
``sync``
    A random op with parameters (with every op sharing them) keeps its devices and degrees and
    changes only its gradient synchronization: ``all_reduce`` (bucketed), ``all_reduce_per_tensor``,
    ``parameter_server`` (on one of its devices) or, where its replicas compute identical gradients,
    ``duplicate``.
``replicas``
    A random op keeps its degrees and changes only its replica count ``R`` (each partition computed
    by ``R`` devices): existing replicas are kept in order, new ones go to the devices it does not
    use yet, in device order.

``micro_batches``
    The plan runs another number of micro-batches per iteration (gradient accumulation; a pipeline
    when the ops are on several device groups): a divisor of the batch, at most ``max_micro_batches``,
    that every op's sample dimension and configuration allow (:func:`micro_batch_options`). A
    plan-level proposal (:class:`PipelineFields`), evaluated by a rebuild
    (:meth:`~placement_rl.sim.delta.DeltaSimulator.propose_plan`).
``schedule``
    With several micro-batches, another pipeline schedule: ``gpipe`` or ``1f1b``, or ``interleaved``
    when the plan's stages deal model chunks to its device groups in turn
    (:func:`schedule_options`). A 1F1B order that waits for itself
    (:class:`~placement_rl.sim.pipeline.ScheduleDeadlock`) is rejected by the chain.
``recompute``
    Activation recomputation toggled: on a random op, or (half of the time) on every op of a random
    op's pipeline stage (:func:`~placement_rl.plan.core.pipeline_stages`; the whole plan when it is
    data parallel).
``zero``
    Another ZeRO stage (0-3) where it is valid (an op with parameters, all-reduced, each shard on at
    least two devices): for a random such op and the ops sharing its parameters, or (half of the
    time) for every such op of its stage.

Coordinated moves (several ops at once, for plans no one-op move reaches downhill; each closes its
ops under parameter sharing, so ops synchronizing one gradient never end up on different devices by it):

``param_group``
    Every op sharing a random op's parameters (``param_key``: an unrolled recurrent layer's steps;
    one op where nothing is shared) gets one new configuration: half of the time a configuration of
    the first op's SOAP set carried to the others (:func:`transfer_config`), else a target device set
    and strategy as ``block``'s.
``block``
    A connected range of ops in graph (topological) order, a layer range (a prefix or a suffix of
    the graph half of the time), goes to one device set (:meth:`Proposer.target`: all devices, one
    machine's or one device type's, a machine view or one device) with one strategy: split along the
    batch (data parallel), a fifth of the time on one device of it, some of the time split along a
    parameter dimension.
``stage_shift``
    Where the plan is pipelined (two or more stages, :func:`~placement_rl.plan.core.pipeline_stages`),
    1 to ``max_group`` ops at a random stage boundary move to the neighbouring stage: its last ops
    to the next stage or its first ops to the previous one, taking the configuration of that stage's
    op nearest the boundary that spans its devices (made valid for them, :func:`transfer_config`).
    Nothing where the plan has one stage.
``device_subset``
    A machine or a device type is dropped from, or added to, the devices of every op (half of the
    time) or of a ``block``'s ops: each op keeps its strategy (a batch split, a parameter split)
    over its devices without (with) that group (:func:`resplit`); an op on one dropped device moves
    to one of the block's remaining devices, an op on one device spreads over the added ones (a batch
    split). Dropping the slow GPUs from data parallelism is one such move.
``restage``
    The whole plan becomes a pipeline (:func:`~placement_rl.plan.constructors.pipeline`): ops cut into
    contiguous stages of equal compute, each cut moved to where the fewest tensors cross
    (:func:`~placement_rl.plan.constructors.light_cuts`: between layers), one stage per machine of a
    random subset of two or more of the search's machines (in listing order; half of the time all of
    them), data parallel inside a machine, a random micro-batch count from the stage count to
    :data:`RESTAGE_DEPTH` times it that the batch allows (not capped by ``max_micro_batches``; else the
    largest up to the stage count), 1F1B; half of the time with ZeRO-1 on every op that can take it. A
    plan-level proposal (a :class:`~placement_rl.plan.Plan`), evaluated by a rebuild. Nothing with
    fewer than two machines.

The other kinds keep an op's ``recompute`` and, where still valid, its ``zero`` stage, and under
several micro-batches propose only configurations the micro-batches allow (a sample degree that
divides a micro-batch; under ``interleaved``, stages that still fit it).

``proposals`` names one kind, a mix (:data:`MIXES`: ``"mixed"``, FlexFlow's proposal 40% of the time,
``neighbour`` and ``group`` 12% each, ``sync`` and ``replicas`` 8% each, ``micro_batches`` 6%,
``recompute`` and ``zero`` 5% each and ``schedule`` 4%; ``"soap"``, FlexFlow's half of the time,
``neighbour`` and ``group`` in the rest; ``"memory"``, the ``mixed`` moves with the memory moves
(``micro_batches``, ``recompute``, ``zero``) twice as often; ``"coordinated"``, every kind, the
coordinated moves 40% of the time; ``"adaptive"``, ``coordinated``'s kinds with weights that follow
what improves the chain, and by how much (:data:`ADAPTIVE_MIXES`, :meth:`Proposer.feedback`)), or maps kinds
to weights. Without the
kinds of :data:`OUTSIDE_SPACE` the proposals stay inside the SOAP search space (a ``neighbour`` or
``group`` configuration outside it is left out of the proposal), so the plans found compare with
:func:`~placement_rl.search.exhaustive`'s optimum over that space; the others leave it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from placement_rl.graph import Op, OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.plan.constructors import device_groups
from placement_rl.plan.core import ZERO_STAGES, Schedule, pipeline_stages, sample_shares, zero_eligible
from placement_rl.search.space import SearchSpace
from placement_rl.topology import DeviceTopology

PROPOSAL_KINDS: tuple[str, ...] = (
    "flexflow",
    "neighbour",
    "group",
    "sync",
    "replicas",
    "micro_batches",
    "schedule",
    "recompute",
    "zero",
    "param_group",
    "block",
    "stage_shift",
    "device_subset",
    "restage",
)
#: The coordinated kinds: moves of several ops at once to one device set or strategy.
COORDINATED_KINDS: tuple[str, ...] = ("param_group", "block", "stage_shift", "device_subset")
#: Named mixes of proposal kinds (weights, normalized when drawn).
MIXES: dict[str, dict[str, float]] = {
    "mixed": {
        "flexflow": 0.4,
        "neighbour": 0.12,
        "group": 0.12,
        "sync": 0.08,
        "replicas": 0.08,
        "micro_batches": 0.06,
        "schedule": 0.04,
        "recompute": 0.05,
        "zero": 0.05,
    },
    "soap": {"flexflow": 0.5, "neighbour": 0.25, "group": 0.25},
    "memory": {
        "flexflow": 0.3,
        "neighbour": 0.1,
        "group": 0.1,
        "sync": 0.05,
        "replicas": 0.05,
        "micro_batches": 0.12,
        "schedule": 0.08,
        "recompute": 0.1,
        "zero": 0.1,
    },
    "coordinated": {
        "flexflow": 0.25,
        "neighbour": 0.08,
        "group": 0.08,
        "sync": 0.05,
        "replicas": 0.03,
        "micro_batches": 0.04,
        "schedule": 0.02,
        "recompute": 0.025,
        "zero": 0.025,
        "param_group": 0.1,
        "block": 0.12,
        "stage_shift": 0.08,
        "device_subset": 0.1,
        "restage": 0.03,
    },
}
MIXES["adaptive"] = dict(MIXES["coordinated"])
#: Mixes whose weights adapt during the search (:meth:`Proposer.feedback`), starting from their weights.
ADAPTIVE_MIXES: tuple[str, ...] = ("adaptive",)
#: The adaptive mix: each kind's score is a running mean of how much its proposals improved the chain's
#: cost (accepted and lower; an improvement of ADAPT_GAIN, relative, or more counts 1, a smaller one in
#: proportion, none 0), updated at each of its proposals by ADAPT_SMOOTHING of the difference...
ADAPT_GAIN = 0.01
ADAPT_SMOOTHING = 0.05
#: ...starting here (optimistic: every kind is tried before its score falls to its own rate)...
ADAPT_START_SCORE = 0.5
#: ...and a kind's weight is ``FLOOR * its start weight + (1 - FLOOR) * its start weight x score,
#: normalized``: no kind falls below this share of its start weight.
ADAPT_FLOOR = 0.25
#: Kinds whose plans leave FlexFlow's SOAP space (a sync mode other than ``all_reduce``, replicas,
#: micro-batches and schedules, recomputation, ZeRO).
OUTSIDE_SPACE: tuple[str, ...] = ("sync", "replicas", "micro_batches", "schedule", "recompute", "zero", "restage")
#: Plan-level kinds: they propose :class:`PipelineFields` (or, ``restage``, a whole :class:`Plan`), not
#: op configurations.
PLAN_KINDS: tuple[str, ...] = ("micro_batches", "schedule", "restage")
#: Sync modes a ``sync`` proposal chooses from (``sfb`` is :func:`placement_rl.search.sfb.apply_sfb`'s).
SYNC_CHOICES: tuple[str, ...] = ("all_reduce", "all_reduce_per_tensor", "parameter_server", "duplicate")
#: Schedules a ``schedule`` proposal chooses from (``interleaved`` only where the stages fit it).
SCHEDULE_CHOICES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
#: The most micro-batches a ``micro_batches`` proposal asks for by default (the micro-batch graph
#: has ``m`` copies of every op, so a proposal's simulation costs about ``m`` times more).
MAX_PROPOSED_MICRO_BATCHES = 16
#: A ``restage`` proposal runs between ``stages`` and ``RESTAGE_DEPTH * stages`` micro-batches.
RESTAGE_DEPTH = 4

Changes = dict[int, OpConfig]


@dataclass(frozen=True)
class PipelineFields:
    """A plan's pipeline fields (:class:`~placement_rl.plan.Plan`): what a plan-level proposal changes."""

    micro_batches: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1

    @classmethod
    def of(cls, plan: Plan) -> PipelineFields:
        return cls(plan.micro_batches, plan.schedule, plan.virtual_stages)


Proposal = Changes | PipelineFields | Plan


def parse_proposals(value: str | Mapping[str, float]) -> dict[str, float]:
    """Proposal weights from a kind, a mix name or a ``{kind: weight}`` mapping (normalized to sum 1).

    A mix (:data:`MIXES`) or a mapping may also weigh other mixes by name: a mix stands for its own
    normalized weights times its weight (``{"soap": 1, "block": 1}``: half FlexFlow's SOAP mix, half
    ``block``), expanded until only kinds remain.

    Raises:
        ValueError: an unknown kind or mix, a mix that names itself (directly or through other mixes:
            the message names the cycle), or weights that are negative, not finite or all zero.
    """
    names = [*PROPOSAL_KINDS, *MIXES]
    if isinstance(value, str):
        if value in MIXES:
            weights = _expand_mix(value, (value,))
        elif value in PROPOSAL_KINDS:
            weights = {value: 1.0}
        else:
            raise ValueError(f"proposals = {value!r}; expected one of {names} or a {{kind: weight}} mapping")
    elif isinstance(value, Mapping):
        unknown = [k for k in value if k not in PROPOSAL_KINDS and k not in MIXES]
        if unknown:
            raise ValueError(
                f"proposal kinds {unknown}; expected kinds among {list(PROPOSAL_KINDS)} (or mixes among {list(MIXES)})"
            )
        weights = _weigh(value, (), "proposal weight")
    else:
        raise ValueError(f"proposals = {value!r}; expected one of {names} or a {{kind: weight}} mapping")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"proposals = {value!r}; expected at least one kind with a weight > 0")
    return {k: w / total for k, w in weights.items() if w > 0}


def _expand_mix(name: str, path: tuple[str, ...]) -> dict[str, float]:
    """The weights of mix ``name`` over kinds only, normalized (``path``: the mixes being expanded, ``name`` last)."""
    mix = MIXES[name]
    if not isinstance(mix, Mapping):
        raise ValueError(f"proposal mix {name!r} = {mix!r}; expected a {{kind or mix: weight}} mapping")
    unknown = [k for k in mix if k not in PROPOSAL_KINDS and k not in MIXES]
    if unknown:
        raise ValueError(
            f"proposal mix {name!r} names {unknown}; expected kinds among {list(PROPOSAL_KINDS)} or mixes among "
            f"{list(MIXES)}"
        )
    weights = _weigh(mix, path, f"proposal mix {name!r}: weight")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"proposal mix {name!r} = {dict(mix)!r}; expected at least one kind with a weight > 0")
    return {k: w / total for k, w in weights.items()}


def _weigh(mix: Mapping[str, float], path: tuple[str, ...], what: str) -> dict[str, float]:
    """``mix``'s weights over kinds: its kinds as they are, its mixes expanded (refusing a cycle through ``path``)."""
    weights: dict[str, float] = {}
    for k, w in mix.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"{what} {k} = {w!r}; expected a finite number >= 0")
        if k in MIXES:
            if k in path:
                cycle = " -> ".join((*path[path.index(k) :], k))
                raise ValueError(
                    f"proposal mix {k!r} names itself ({cycle}); expected mixes defined by kinds and other mixes "
                    "without a cycle"
                )
            if w > 0:
                for kind, share in _expand_mix(k, (*path, k)).items():
                    weights[kind] = weights.get(kind, 0.0) + float(w) * share
        else:
            weights[k] = weights.get(k, 0.0) + float(w)
    return weights


class Proposer:
    """Draws proposals of the configured kinds for one chain.

    Args:
        graph: the op graph.
        topology: the cluster.
        space: the chain's SOAP search space (its devices bound every proposal).
        proposals: a kind, a mix name or ``{kind: weight}`` (see :func:`parse_proposals`).
        max_group: the largest group a ``group`` proposal moves.
        max_micro_batches: the most micro-batches a ``micro_batches`` proposal asks for.
    """

    def __init__(
        self,
        graph: OpGraph,
        topology: DeviceTopology,
        space: SearchSpace,
        proposals: str | Mapping[str, float] = "flexflow",
        max_group: int = 8,
        max_micro_batches: int = MAX_PROPOSED_MICRO_BATCHES,
    ) -> None:
        if max_group < 2:
            raise ValueError(f"max_group = {max_group}; expected at least 2")
        if isinstance(max_micro_batches, bool) or not isinstance(max_micro_batches, int) or max_micro_batches < 1:
            raise ValueError(f"max_micro_batches = {max_micro_batches!r}; expected a positive integer")
        self.graph, self.topology, self.space = graph, topology, space
        self.weights = parse_proposals(proposals)
        self.kinds = list(self.weights)
        self._p = np.array([self.weights[k] for k in self.kinds])
        #: whether the mix adapts to what improves the chain (an :data:`ADAPTIVE_MIXES` name)
        self.adaptive = isinstance(proposals, str) and proposals in ADAPTIVE_MIXES
        self._prior = self._p.copy()
        self._score = np.full(len(self.kinds), ADAPT_START_SCORE)
        self._index = {k: j for j, k in enumerate(self.kinds)}
        self.max_group = max_group
        self.max_micro_batches = max_micro_batches
        self.n = graph.num_ops
        preds, succs = graph.predecessors, graph.successors
        self.neighbours: list[tuple[int, ...]] = [tuple(dict.fromkeys((*preds[i], *succs[i]))) for i in range(self.n)]
        self.with_params = [i for i, op in enumerate(graph.ops) if op.param_bytes > 0]
        by_key: dict[str, list[int]] = {}
        for i, op in enumerate(graph.ops):
            if op.param_key is not None:
                by_key.setdefault(op.param_key, []).append(i)
        #: per op, the ops sharing its parameters (itself included; itself alone without parameters)
        self.shared: list[tuple[int, ...]] = [
            tuple(by_key[op.param_key]) if op.param_key is not None else (i,) for i, op in enumerate(graph.ops)
        ]
        devices = list(space.devices)
        #: the named device groups a ``group`` proposal moves ops to half of the time (all, per machine, per type)
        self.device_groups: list[tuple[str, ...]] = device_groups(topology, devices)
        #: the parameter groups a ``param_group`` proposal moves (ops sharing a ``param_key``; an op with
        #: its own parameters alone)
        self.param_groups: list[tuple[int, ...]] = list(
            dict.fromkeys(self.shared[i] for i, op in enumerate(graph.ops) if op.param_bytes > 0 or op.param_key)
        )
        #: the groups a ``device_subset`` proposal drops or adds: per machine, then per device type
        self.subset_axes: list[list[tuple[str, ...]]] = []
        for key in ("machine", "device_type"):
            by: dict[str, list[str]] = {}
            for name in devices:
                by.setdefault(getattr(topology.device(name), key), []).append(name)
            self.subset_axes.append([tuple(g) for g in by.values()])
        self._position = {d: k for k, d in enumerate(devices)}
        self.counts = dict.fromkeys(self.kinds, 0)
        #: whether every proposal stays in the search space (no kind of :data:`OUTSIDE_SPACE`)
        self.in_space = not any(k in OUTSIDE_SPACE for k in self.kinds)
        #: the micro-batch counts the batch allows (every op's sample dimension), up to the cap
        sizes = [op.sample_dim.size for op in graph.ops if op.sample_dim is not None]
        batch = math.gcd(*sizes) if sizes else 1
        #: every micro-batch count the batch allows (``restage`` picks from these, beyond the cap)
        self.all_micro_batch_counts = [m for m in range(1, batch + 1) if batch % m == 0]
        self.micro_batch_counts = [m for m in self.all_micro_batch_counts if m <= max_micro_batches]
        self._light_cuts: dict[int, list[int]] = {}  # restage's cuts per stage count (they depend on nothing else)

    def draw(
        self, configs: Sequence[OpConfig], rng: np.random.Generator, pipeline: PipelineFields | None = None
    ) -> tuple[str, Proposal]:
        """One proposal against the current plan: ``(kind, {op index: config})``, or ``(kind,
        PipelineFields)`` for the plan-level kinds (:data:`PLAN_KINDS`).

        ``pipeline`` is the current plan's pipeline fields (default: one micro-batch). The changes
        may equal the current configurations (a no-op the chain skips); a configuration the
        micro-batches or the schedule do not allow is left out. With only ``flexflow`` and one
        micro-batch no extra random number is drawn.
        """
        pipeline = pipeline or PipelineFields()
        kind = self.kinds[0] if len(self.kinds) == 1 else self.kinds[int(rng.choice(len(self.kinds), p=self._p))]
        self.counts[kind] += 1
        if kind == "micro_batches":
            return kind, self.micro_batches(configs, pipeline, rng)
        if kind == "schedule":
            return kind, self.schedule(configs, pipeline, rng)
        if kind == "restage":
            return kind, self.restage(rng) or {}
        if kind == "flexflow":
            i = int(rng.integers(self.n))
            changes = {i: self.space.random_config(i, rng)}
        elif kind in ("neighbour", "group", *COORDINATED_KINDS):
            if kind == "neighbour":
                changes = self.neighbour(configs, rng)
            elif kind == "group":
                changes = self.group(rng)
            elif kind == "param_group":
                changes = self.param_group(rng)
            elif kind == "block":
                changes = self.block(rng)
            elif kind == "stage_shift":
                changes = self.stage_shift(configs, rng)
            else:
                changes = self.device_subset(configs, rng)
            if self.in_space:
                changes = {i: c for i, c in changes.items() if self.space.contains(i, c)}
        elif kind == "sync":
            changes = self.sync(configs, rng)
        elif kind == "replicas":
            changes = self.replicas(configs, rng)
        elif kind == "recompute":
            changes = self.recompute(configs, rng)
        else:
            changes = self.zero(configs, rng)
        if kind not in ("recompute", "zero"):  # placement moves keep the op's memory options
            changes = {i: keep_memory_options(self.graph.ops[i], configs[i], c) for i, c in changes.items()}
        return kind, self.allowed(configs, changes, pipeline)

    @property
    def mix(self) -> dict[str, float]:
        """The current weight of each kind (the start weights unless the mix adapts)."""
        return {k: float(w) for k, w in zip(self.kinds, self._p, strict=True)}

    def feedback(self, kind: str, gain: float) -> None:
        """Tell an adaptive mix how much a proposal of ``kind`` improved the chain's cost: ``gain`` is
        ``(cost before - cost after) / cost before`` when it was accepted and lower, else 0 (also for a
        proposal that changed nothing). The kind's score moves :data:`ADAPT_SMOOTHING` of the way toward
        ``min(1, gain / ADAPT_GAIN)`` (an improvement of 1% or more counts fully), and the weights become
        ``ADAPT_FLOOR * start + (1 - ADAPT_FLOOR) * start x score`` (normalized). No-op for a fixed mix."""
        if not self.adaptive:
            return
        j = self._index[kind]
        self._score[j] += ADAPT_SMOOTHING * (min(1.0, max(gain, 0.0) / ADAPT_GAIN) - self._score[j])
        earned = self._prior * self._score
        total = float(earned.sum())
        share = earned / total if total > 0 else self._prior
        self._p = ADAPT_FLOOR * self._prior + (1 - ADAPT_FLOOR) * share
        self._p /= self._p.sum()

    def allowed(self, configs: Sequence[OpConfig], changes: Changes, pipeline: PipelineFields) -> Changes:
        """``changes`` without the configurations the plan's micro-batches do not allow; none at all when
        the changed plan's stages no longer fit an ``interleaved`` schedule."""
        m = pipeline.micro_batches
        if m > 1:
            changes = {i: c for i, c in changes.items() if fits_micro_batches(self.graph.ops[i], c, m)}
        if pipeline.schedule == "interleaved" and changes:
            trial = [changes.get(i, c) for i, c in enumerate(configs)]
            if not interleaved_fits(self.graph, trial, pipeline.virtual_stages, m):
                return {}
        return changes

    # ---------------------------------------------------------------- kinds
    def neighbour(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """A random op takes a random neighbour's configuration (made valid for it)."""
        i = int(rng.integers(self.n))
        near = self.neighbours[i]
        if not near:
            return {}
        j = near[int(rng.integers(len(near)))]
        return {i: transfer_config(self.graph.ops[i], configs[j], self.space.degree_options(i))}

    def group(self, rng: np.random.Generator) -> Changes:
        """A connected group of ops (BFS-grown, or every op sharing a random op's parameters half of the
        time) moved to one device group: data parallel, or split along a parameter dimension (model
        parallel) over it, or onto one device."""
        seed = int(rng.integers(self.n))
        shared = self.shared[seed]
        if len(shared) > 1 and rng.random() < 0.5:
            members: Sequence[int] = shared
        else:
            members = connected_group(self.neighbours, seed, int(rng.integers(2, self.max_group + 1)), rng)
        if rng.random() < 0.5:
            target = self.device_groups[int(rng.integers(len(self.device_groups)))]
        else:  # a machine view of a random size (FlexFlow's start + stride * k)
            views = self.space.views(int(rng.integers(1, self.space.num_devices + 1)))
            target = views[int(rng.integers(len(views)))]
        kind = "parameter" if len(target) > 1 and rng.random() < 0.25 else "sample"
        return {i: split_config(self.graph.ops[i], target, kind) for i in members}

    def sync(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """A random op with parameters changes only its sync mode."""
        if not self.with_params:
            return {}
        i = self.with_params[int(rng.integers(len(self.with_params)))]
        cfg = configs[i]
        options = [s for s in sync_options(self.graph.ops[i], cfg) if s != cfg.sync or s == "parameter_server"]
        if not options:
            return {}
        mode = options[int(rng.integers(len(options)))]
        ps = None
        if mode == "parameter_server":
            devices = list(dict.fromkeys(cfg.devices))
            ps = devices[int(rng.integers(len(devices)))]
        # ops sharing parameters synchronize them once, with the first user's mode: change them together
        changes: Changes = {}
        for j in self.shared[i]:
            c = configs[j]
            if mode == "duplicate" and "duplicate" not in sync_options(self.graph.ops[j], c):
                continue
            changes[j] = OpConfig(c.devices, c.degrees, mode, ps if ps in c.devices else None)  # type: ignore[arg-type]
        return changes

    def replicas(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """A random op changes only its replica count."""
        i = int(rng.integers(self.n))
        cfg = configs[i]
        P = max(cfg.num_partitions, 1)
        options = [r for r in range(1, self.space.num_devices // P + 1) if r != cfg.replicas]
        if not options:
            return {}
        return {i: with_replicas(cfg, options[int(rng.integers(len(options)))], self.space.devices)}

    def micro_batches(
        self, configs: Sequence[OpConfig], pipeline: PipelineFields, rng: np.random.Generator
    ) -> PipelineFields:
        """Another micro-batch count the batch and every op's configuration allow (the same fields when none)."""
        options = [
            m for m in micro_batch_options(self.graph, configs, self.micro_batch_counts) if m != pipeline.micro_batches
        ]
        if pipeline.schedule == "interleaved":  # its micro-batches: a multiple of the device groups
            options = [m for m in options if interleaved_fits(self.graph, configs, pipeline.virtual_stages, m)]
        if not options:
            return pipeline
        m = options[int(rng.integers(len(options)))]
        return PipelineFields(m, pipeline.schedule, pipeline.virtual_stages)

    def schedule(
        self, configs: Sequence[OpConfig], pipeline: PipelineFields, rng: np.random.Generator
    ) -> PipelineFields:
        """With several micro-batches, another schedule (:func:`schedule_options`; the same fields when none)."""
        if pipeline.micro_batches < 2:
            return pipeline
        current = (pipeline.schedule, pipeline.virtual_stages)
        options = [o for o in schedule_options(self.graph, configs, pipeline.micro_batches) if o != current]
        if not options:
            return pipeline
        schedule, virtual = options[int(rng.integers(len(options)))]
        return PipelineFields(pipeline.micro_batches, schedule, virtual)  # type: ignore[arg-type]

    def recompute(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """Recomputation toggled on a random op, or half of the time on every op of its stage."""
        i = int(rng.integers(self.n))
        on = not configs[i].recompute
        members: Sequence[int] = (i,)
        if rng.random() < 0.5:
            members = stage_of(self.graph, configs, i)
        return {j: configs[j].replace(recompute=on) for j in members}

    def zero(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """Another ZeRO stage for a random op that can take one (with the ops sharing its parameters), or
        half of the time for every such op of its stage."""
        eligible = [i for i in self.with_params if zero_eligible(self.graph.ops[i], configs[i])]
        if not eligible:
            return {}
        i = eligible[int(rng.integers(len(eligible)))]
        stages = [z for z in ZERO_STAGES if z != configs[i].zero]
        stage = stages[int(rng.integers(len(stages)))]
        members: Sequence[int] = self.shared[i]
        if rng.random() < 0.5:
            members = stage_of(self.graph, configs, i)
        return {
            j: configs[j].replace(zero=stage)
            for j in members
            if self.graph.ops[j].param_bytes > 0 and zero_eligible(self.graph.ops[j], configs[j])
        }

    def restage(self, rng: np.random.Generator) -> Plan | None:
        """The whole plan as a pipeline over a random subset of machines (``None`` with fewer than two)."""
        from placement_rl.plan.constructors import light_cuts, pipeline, zero

        machines = self.subset_axes[0]
        if len(machines) < 2:
            return None
        if rng.random() < 0.5:
            chosen = machines
        else:
            k = int(rng.integers(2, len(machines) + 1))
            picked = sorted(rng.choice(len(machines), size=k, replace=False).tolist())
            chosen = [machines[j] for j in picked]
        stages = len(chosen)
        # between the stage count and four times it (the bubble, (stages - 1) / (m + stages - 1), at most
        # about a fifth): Megatron-LM's rule of thumb; the most the batch allows when it allows none
        deep = [m for m in self.all_micro_batch_counts if stages <= m <= RESTAGE_DEPTH * stages]
        m = deep[int(rng.integers(len(deep)))] if deep else max(c for c in self.all_micro_batch_counts if c <= stages)
        try:
            if stages not in self._light_cuts:
                self._light_cuts[stages] = light_cuts(self.graph, stages)[1:-1]
            cuts = self._light_cuts[stages]
            plan = pipeline(self.graph, self.topology, [list(g) for g in chosen], micro_batches=m, cuts=cuts)
        except ValueError:  # more stages than ops, or a batch or a cut these stages cannot take
            return None
        return zero(self.graph, plan, 1) if rng.random() < 0.5 else plan

    # ---------------------------------------------------------------- coordinated kinds
    def closed(self, members: Sequence[int]) -> list[int]:
        """``members`` with every op sharing parameters with one of them (graph order)."""
        return sorted({j for i in members for j in self.shared[i]})

    def target(self, rng: np.random.Generator) -> tuple[tuple[str, ...], str]:
        """A device set and a strategy for a coordinated move: ``(devices, kind)``, ``kind`` ``"sample"``
        (a batch split, data parallel) or ``"parameter"`` (a parameter split). The devices: half of the
        time a named group (all devices, one machine's, one device type's), else a machine view of a
        random size; a fifth of the time one device of it (``kind`` then does not matter)."""
        if rng.random() < 0.5:
            devices = self.device_groups[int(rng.integers(len(self.device_groups)))]
        else:
            views = self.space.views(int(rng.integers(1, self.space.num_devices + 1)))
            devices = views[int(rng.integers(len(views)))]
        u = rng.random()
        if u < 0.2:
            return (devices[int(rng.integers(len(devices)))],), "sample"
        return devices, "parameter" if len(devices) > 1 and u > 0.85 else "sample"

    def span(self, rng: np.random.Generator) -> list[int]:
        """A range of consecutive ops in graph (topological) order: a prefix or a suffix of the graph a
        quarter of the time each, else any range; closed under parameter sharing (:meth:`closed`)."""
        n, u = self.n, rng.random()
        if u < 0.25:
            lo, hi = 0, int(rng.integers(1, n + 1))
        elif u < 0.5:
            lo, hi = int(rng.integers(n)), n
        else:
            lo = int(rng.integers(n))
            hi = int(rng.integers(lo + 1, n + 1))
        return self.closed(range(lo, hi))

    def param_group(self, rng: np.random.Generator) -> Changes:
        """Every op sharing a random op's parameters gets one new configuration."""
        if not self.param_groups:
            return {}
        members = self.param_groups[int(rng.integers(len(self.param_groups)))]
        ops = self.graph.ops
        if rng.random() < 0.5:
            first = members[0]
            cfg = self.space.random_config(first, rng)
            return {i: transfer_config(ops[i], cfg, self.space.degree_options(i)) for i in members}
        devices, kind = self.target(rng)
        return {i: split_config(ops[i], devices, kind) for i in members}

    def block(self, rng: np.random.Generator) -> Changes:
        """A layer range (:meth:`span`) to one device set and strategy (:meth:`target`)."""
        members = self.span(rng)
        devices, kind = self.target(rng)
        return {i: split_config(self.graph.ops[i], devices, kind) for i in members}

    def stage_shift(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """Ops at a random stage boundary move to the neighbouring stage (nothing with one stage)."""
        stages = _stages(self.graph, configs)
        if len(stages) < 2:
            return {}
        k = int(rng.integers(len(stages) - 1))
        (_, left), (_, right) = stages[k], stages[k + 1]
        forward = rng.random() < 0.5  # the left stage's last ops join the right stage, or the reverse
        source, dest = (left, right) if forward else (right, left)
        count = int(rng.integers(1, min(self.max_group, len(source)) + 1))
        moved = source[-count:] if forward else source[:count]
        # the destination's op nearest the boundary that runs on all of its devices
        spread = max(len(set(configs[j].devices)) for j in dest)
        near = [j for j in dest if len(set(configs[j].devices)) == spread]
        model = configs[near[0] if forward else near[-1]]
        ops = self.graph.ops
        return {i: transfer_config(ops[i], model, self.space.degree_options(i)) for i in self.closed(moved)}

    def device_subset(self, configs: Sequence[OpConfig], rng: np.random.Generator) -> Changes:
        """A machine or a device type dropped from (or added to) every op's or a block's devices."""
        members = list(range(self.n)) if rng.random() < 0.5 else self.span(rng)
        axes = [a for a in self.subset_axes if len(a) > 1]
        if not axes:
            return {}
        groups = axes[int(rng.integers(len(axes)))]
        used = {d for i in members for d in configs[i].devices}
        drops = [g for g in groups if used & set(g) and used - set(g)]
        adds = [g for g in groups if set(g) - used]
        if not drops and not adds:
            return {}
        drop = bool(drops) and (not adds or rng.random() < 0.5)
        options = drops if drop else adds
        group = set(options[int(rng.integers(len(options)))])
        rest = used - group
        changes: Changes = {}
        for i in members:
            cfg = configs[i]
            own = set(cfg.devices)
            devices = (own - group or rest) if drop else own | group
            if devices != own:
                ordered = sorted(devices, key=lambda d: self._position.get(d, len(self._position)))
                if drop and len(own) == 1:  # an op on one dropped device: to one of the devices left
                    ordered = ordered[:1]
                changes[i] = resplit(self.graph.ops[i], cfg, ordered)
        return changes


# ------------------------------------------------------------------------------ pure helpers
def resplit(op: Op, cfg: OpConfig, devices: Sequence[str]) -> OpConfig:
    """``cfg``'s strategy over other ``devices``: split along the parameter dimension when ``cfg`` splits
    ``op`` only along parameter dimensions, else along the batch (:func:`split_config`: replicated
    where ``op`` has no such dimension; one device alone); its sync mode kept where valid."""
    kinds = {d.name: d.kind for d in op.parallel_dims}
    split = {kinds.get(name) for name, k in cfg.degrees if k > 1}
    kind = "parameter" if split and "sample" not in split and "parameter" in split else "sample"
    new = split_config(op, devices, kind)
    return _with_valid_sync(op, OpConfig(new.devices, new.degrees, cfg.sync, cfg.ps_device))


def connected_group(neighbours: Sequence[Sequence[int]], seed: int, size: int, rng: np.random.Generator) -> list[int]:
    """Up to ``size`` ops connected to ``seed``, grown breadth-first with each frontier shuffled."""
    members = {seed: None}
    frontier = [seed]
    while frontier and len(members) < size:
        nxt: list[int] = []
        for i in frontier:
            near = [j for j in neighbours[i] if j not in members]
            for k in rng.permutation(len(near)).tolist():
                if len(members) >= size:
                    break
                members[near[k]] = None
                nxt.append(near[k])
        frontier = nxt
    return list(members)


def split_config(op: Op, devices: Sequence[str], kind: str = "sample") -> OpConfig:
    """Split over ``devices`` along the op's first dimension of ``kind`` (``"sample"``: data parallel;
    ``"parameter"``: model parallel), the largest degree dividing it that fits, on the first devices;
    replicated on all of them when the op has no such dimension; one device alone."""
    dim = next((d for d in op.parallel_dims if d.kind == kind and d.size > 1), None)
    if len(devices) == 1 or dim is None:
        return OpConfig.make(devices)
    degree = max(k for k in range(1, len(devices) + 1) if dim.size % k == 0)
    return OpConfig.make(devices[:degree], {dim.name: degree})


def transfer_config(op: Op, cfg: OpConfig, degree_options: Sequence[Mapping[str, int]]) -> OpConfig:
    """``cfg`` (another op's configuration) made valid for ``op``.

    A replicated configuration (one partition on several devices) becomes a batch split over its
    devices when ``op`` has a sample dimension. Otherwise kept as it is when ``op`` has every split
    dimension and each degree divides it; otherwise the same devices with the partition count split
    along ``op``'s own dimensions (``degree_options``, a sample split first), else the largest
    partition count that fits on the first of the devices.
    The sync mode carries over where valid (``sfb`` and invalid ``duplicate`` become ``all_reduce``).
    """
    dims = {d.name: d for d in op.parallel_dims}
    if cfg.num_partitions == 1 and len(cfg.devices) > 1 and op.sample_dim is not None:
        # a replicated op (a parameter under data parallelism): its neighbour's share is a batch split
        return split_config(op, list(dict.fromkeys(cfg.devices)))
    if all(name in dims and dims[name].size % k == 0 for name, k in cfg.degrees):
        return _with_valid_sync(op, OpConfig(cfg.devices, cfg.degrees, cfg.sync, cfg.ps_device))
    P = cfg.num_partitions
    sample = op.sample_dim

    def rank(d: Mapping[str, int]) -> tuple[int, int, int]:
        prod = math.prod(d.values())
        return (prod <= P and P % prod == 0, prod, sample is not None and sample.name in d)

    best = max(degree_options, key=rank) if degree_options else {}
    prod = math.prod(best.values())
    devices = cfg.devices if len(cfg.devices) % prod == 0 else cfg.devices[:prod]
    return _with_valid_sync(op, OpConfig.make(devices, best, cfg.sync, cfg.ps_device))


def sync_options(op: Op, cfg: OpConfig) -> list[str]:
    """The sync modes valid for ``op`` with ``cfg``'s devices and degrees (``sfb`` left out)."""
    kinds = {d.name: d.kind for d in op.parallel_dims}
    modes = ["all_reduce", "all_reduce_per_tensor", "parameter_server"]
    if all(kinds.get(name) == "parameter" or k == 1 for name, k in cfg.degrees):
        modes.append("duplicate")
    return modes


def with_replicas(cfg: OpConfig, replicas: int, devices: Sequence[str]) -> OpConfig:
    """``cfg`` with ``replicas`` devices per partition (task ``t``: partition ``t // R``, replica ``t % R``).

    Each partition keeps its first ``min(R, replicas)`` devices; new replicas take devices of
    ``devices`` that ``cfg`` does not use, in order (then reuse the least-used ones).
    """
    if replicas < 1:
        raise ValueError(f"replicas = {replicas}; expected at least 1")
    P, R = max(cfg.num_partitions, 1), cfg.replicas
    parts = [list(cfg.devices[p * R : (p + 1) * R]) for p in range(P)]
    used = {d: 0 for d in devices}
    for d in cfg.devices:
        used[d] = used.get(d, 0) + 1
    spare = [d for d in devices if used[d] == 0]
    out: list[str] = []
    for part in parts:
        keep = part[:replicas]
        while len(keep) < replicas:
            if spare:
                d = spare.pop(0)
            else:
                d = min((x for x in devices if x not in keep), key=lambda x: used[x])
            used[d] = used.get(d, 0) + 1
            keep.append(d)
        out += keep
    sync = cfg.sync if cfg.sync != "sfb" else "all_reduce"
    ps = cfg.ps_device if sync == "parameter_server" else None
    return OpConfig(tuple(out), cfg.degrees, sync, ps)


def keep_memory_options(op: Op, old: OpConfig, new: OpConfig) -> OpConfig:
    """``new`` with ``old``'s recomputation and, where ``new`` can take it, its ZeRO stage."""
    if not old.recompute and not old.zero:
        return new
    zero = old.zero if zero_eligible(op, new) else 0
    if (new.recompute, new.zero) == (old.recompute, zero):
        return new
    return new.replace(recompute=old.recompute, zero=zero)


def fits_micro_batches(op: Op, cfg: OpConfig, micro_batches: int) -> bool:
    """Whether ``micro_batches`` micro-batches allow ``cfg`` for ``op`` (:meth:`Plan.validate_schedule`):
    they divide its sample dimension, and its sample degree divides a micro-batch (with weights:
    every slice keeps at least one sample of a micro-batch)."""
    dim = op.sample_dim
    if dim is None or micro_batches == 1:
        return True
    if dim.size % micro_batches:
        return False
    size = dim.size // micro_batches
    if cfg.weights:
        shares = sample_shares(op, cfg)
        return shares is None or min(shares) * size >= 1
    return size % cfg.degree_map.get(dim.name, 1) == 0


def micro_batch_options(graph: OpGraph, configs: Sequence[OpConfig], counts: Sequence[int]) -> list[int]:
    """The micro-batch counts of ``counts`` that every op's sample dimension and configuration allow."""
    return [m for m in counts if all(fits_micro_batches(op, c, m) for op, c in zip(graph.ops, configs, strict=True))]


def _stages(graph: OpGraph, configs: Sequence[OpConfig]) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    plan = Plan(graph.name, {op.name: c for op, c in zip(graph.ops, configs, strict=True)})
    return [(s.devices, s.ops) for s in pipeline_stages(graph, plan)]


def stage_of(graph: OpGraph, configs: Sequence[OpConfig], index: int) -> tuple[int, ...]:
    """The ops of op ``index``'s pipeline stage (:func:`~placement_rl.plan.core.pipeline_stages`)."""
    return next(ops for _, ops in _stages(graph, configs) if index in ops)


def interleaved_fits(graph: OpGraph, configs: Sequence[OpConfig], virtual_stages: int, micro_batches: int) -> bool:
    """Whether the plan's stages fit the ``interleaved`` schedule with ``virtual_stages`` chunks per device
    group (:meth:`Plan.validate_schedule`): at least two groups, each with that many stages, dealt to
    the groups in turn, and micro-batches a multiple of the group count."""
    stages = [devices for devices, _ in _stages(graph, configs)]
    groups = list(dict.fromkeys(stages))
    return (
        virtual_stages >= 2
        and len(groups) >= 2
        and len(stages) == virtual_stages * len(groups)
        and all(s == groups[k % len(groups)] for k, s in enumerate(stages))
        and micro_batches % len(groups) == 0
    )


def schedule_options(graph: OpGraph, configs: Sequence[OpConfig], micro_batches: int) -> list[tuple[str, int]]:
    """``(schedule, virtual stages)`` pairs the plan may run: ``gpipe`` and ``1f1b`` always (a 1F1B order
    may still wait for itself; the simulator says so), ``interleaved`` where its stages fit it."""
    options: list[tuple[str, int]] = [("gpipe", 1), ("1f1b", 1)]
    stages = [devices for devices, _ in _stages(graph, configs)]
    groups = len(dict.fromkeys(stages))
    if groups >= 2 and len(stages) % groups == 0:
        v = len(stages) // groups
        if v >= 2 and interleaved_fits(graph, configs, v, micro_batches):
            options.append(("interleaved", v))
    return options


def _with_valid_sync(op: Op, cfg: OpConfig) -> OpConfig:
    sync = cfg.sync
    if sync == "sfb" or (sync == "duplicate" and "duplicate" not in sync_options(op, cfg)):
        sync = "all_reduce"
    ps = cfg.ps_device if sync == "parameter_server" and cfg.ps_device in cfg.devices else None
    return OpConfig(cfg.devices, cfg.degrees, sync, ps)
