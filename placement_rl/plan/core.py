"""Parallelization plans: for every op (or op group) a parallel configuration.

A configuration (:class:`OpConfig`) follows FlexFlow's SOAP space (sec. 4) extended with TAG's
replication options (sec. 4.1):

* ``degrees`` partition the op's output along its parallel dimensions (sample / attribute /
  parameter) into ``P = prod(degrees)`` equal partitions, numbered row-major in the order of
  ``op.parallel_dims``. A degree over a *reduction* dimension (a mean loss over the batch) makes
  each partition produce a partial result; the partials are summed.
* ``devices`` lists one device per task. ``len(devices)`` must be a multiple ``R * P`` of the
  partition count: task ``t`` computes partition ``t // R`` and is replica ``t % R`` of it. ``R > 1``
  duplicates work (TAG's "duplicate": every device of a group computes the same thing on the same
  inputs, broadcast to it).
* ``sync`` says how gradients of replicated parameters are combined. Parameters are split along
  ``parameter`` dimensions and replicated along every other dimension and across replicas; the
  tasks holding the same shard synchronize with ``all_reduce`` (in gradient buckets, as PyTorch
  DDP: :mod:`placement_rl.sim.simulator`), ``all_reduce_per_tensor`` (an all-reduce of this op's
  gradient alone, as FlexFlow's and TAG's DP-NCCL), through a
  ``parameter_server`` (``ps_device``, default the first task's device) or not at all,
  ``duplicate``: the replicas of each partition compute identical gradients and keep them (with
  sample or attribute splits, the slices' gradients are all-reduced once per replica index, as
  Megatron-LM all-reduces a LayerNorm's gradient over data-parallel ranks and duplicates it over
  tensor-parallel ranks), or by ``sfb`` (TAG sec. 4.2.3, sufficient factor
  broadcasting): every replica broadcasts the *sufficient factors* of its share of the batch (for a
  linear layer its input activation and output gradient) to the other replicas, and each replica
  rebuilds the whole gradient locally. ``sfb`` needs an op with its own parameters split along its
  sample dimension only, one task per device; ``sfb_duplicate`` names further training-graph nodes
  (``forward:<op>``, ``backward:<op>``, see :mod:`placement_rl.sim.sfb`) that every replica
  recomputes for the whole batch, so that their inputs are broadcast instead
  (:func:`placement_rl.search.sfb.apply_sfb` chooses them).

This expresses Trinity's single-device group placement (``devices=("m0/gpu1",)``), data parallelism
(``{"sample": n}`` over ``n`` devices), FlexFlow's SOAP configurations, and TAG's four options
(all-reduce, parameter server, duplicate, and model parallelism inside a device group: per-op
single-device configurations, see :func:`tag_strategy`).

**Schema version 2** adds what large models are trained with:

* per plan, ``micro_batches`` per iteration (gradient accumulation) and a pipeline ``schedule`` by
  name (:data:`SCHEDULES`): ``gpipe`` (all forwards, then all backwards), ``1f1b`` (PipeDream-Flush:
  warm-up forwards, then one forward and one backward in turn) and ``interleaved`` (Megatron-LM's
  interleaved 1F1B, ``virtual_stages`` stages per device group). The stages are the plan's device
  sets in topological order (:func:`pipeline_stages`);
* per op, ``recompute`` (the output is dropped after forward and computed again before backward),
  ``zero`` (sharded data parallelism over the replicas of each parameter shard: 1 shards the
  optimizer state, 2 also the gradients, 3 also the parameters, gathered before forward and again
  before backward; FSDP is stage 3) and ``weights`` (an uneven batch split: each device's share of
  the samples, so that a degree need not divide the batch).

Version 1 files load unchanged (every new field at its default).

Plans on a coarse graph (:func:`placement_rl.graph.coarsen.coarsen`) expand to the original ops with
:meth:`Plan.expand`. The JSON schema (``format: placement_rl.plan``) is in ``docs/formats.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, OpGraph
from placement_rl.io import check_header, check_keys, read_json, write_json
from placement_rl.topology import DeviceTopology

SyncMode = Literal["all_reduce", "all_reduce_per_tensor", "parameter_server", "duplicate", "sfb"]
SYNC_MODES: tuple[str, ...] = ("all_reduce", "all_reduce_per_tensor", "parameter_server", "duplicate", "sfb")
#: The node kinds ``OpConfig.sfb_duplicate`` may name: ``forward:<op>`` and ``backward:<op>``.
SFB_NODE_KINDS: tuple[str, ...] = ("forward", "backward")
TagOption = Literal["all_reduce", "parameter_server", "duplicate", "model_parallel"]
TAG_OPTIONS: tuple[str, ...] = ("all_reduce", "parameter_server", "duplicate", "model_parallel")

PLAN_FORMAT = "placement_rl.plan"
PLAN_SCHEMA_VERSION = 2
#: The plan schema versions :meth:`Plan.from_dict` reads.
PLAN_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)

Schedule = Literal["gpipe", "1f1b", "interleaved"]
#: Pipeline schedules by name (see the module docstring).
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
#: ZeRO stages: 0 plain data parallelism, 1 optimizer state, 2 + gradients, 3 + parameters (FSDP).
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
#: The most micro-batches per iteration a plan may ask for.
MAX_MICRO_BATCHES = 65_536
#: How far a plan's ``weights`` may sum from 1.
WEIGHT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class OpConfig:
    """The parallel configuration of one op (see the module docstring for the semantics).

    Attributes:
        devices: one device name per task, partition-major (task ``t``: partition ``t // R``,
            replica ``t % R``).
        degrees: ``(dim name, degree)`` pairs for the dimensions split more than once; dimensions not
            listed have degree 1. Built from a mapping by :meth:`make`.
        sync: how replicated parameter gradients are combined.
        ps_device: the parameter server's device when ``sync == "parameter_server"`` (default: the
            first task's device).
        sfb_duplicate: with ``sync == "sfb"``, the training-graph nodes (``forward:<op>``,
            ``backward:<op>``) every replica also recomputes for the whole batch, besides the weight
            gradient; empty: only the weight gradient (the factors are the op's own input and output
            gradient).
        recompute: drop the output after forward and compute it again before backward (activation
            recomputation: the op's forward time is spent twice, its output is not held in between).
        zero: the ZeRO stage (:data:`ZERO_STAGES`) of the replicas of each parameter shard: 1 shards
            the optimizer state over them, 2 the gradients too (reduce-scatter), 3 the parameters
            too (all-gathered before forward and before backward; FSDP).
        weights: ``(device, weight)`` pairs, one per device of the op, for an uneven sample split:
            a device's weight is its share of the batch (the devices computing one sample slice
            add up); weights sum to 1. Empty: equal shares.
    """

    devices: tuple[str, ...]
    degrees: tuple[tuple[str, int], ...] = ()
    sync: SyncMode = "all_reduce"
    ps_device: str | None = None
    sfb_duplicate: tuple[str, ...] = ()
    recompute: bool = False
    zero: int = 0
    weights: tuple[tuple[str, float], ...] = ()

    @classmethod
    def make(
        cls,
        devices: Sequence[str] | str,
        degrees: Mapping[str, int] | None = None,
        sync: SyncMode = "all_reduce",
        ps_device: str | None = None,
        sfb_duplicate: Sequence[str] = (),
        *,
        recompute: bool = False,
        zero: int = 0,
        weights: Mapping[str, float] | None = None,
    ) -> OpConfig:
        """Build a config from a device list (or one device), a ``{dim name: degree}`` mapping and
        an optional ``{device: weight}`` mapping."""
        devs = (devices,) if isinstance(devices, str) else tuple(devices)
        degs = tuple(sorted((k, int(v)) for k, v in (degrees or {}).items() if v != 1))
        wts = tuple((k, float(v)) for k, v in (weights or {}).items())
        return cls(devs, degs, sync, ps_device, tuple(sfb_duplicate), recompute, zero, wts)

    def replace(self, **changes: Any) -> OpConfig:
        """A copy with some fields changed (``weights`` as a mapping or pairs)."""
        if "weights" in changes and isinstance(changes["weights"], Mapping):
            changes["weights"] = tuple((k, float(v)) for k, v in changes["weights"].items())
        return dataclasses.replace(self, **changes)

    @property
    def weight_map(self) -> dict[str, float]:
        return dict(self.weights)

    @property
    def degree_map(self) -> dict[str, int]:
        return dict(self.degrees)

    @property
    def num_partitions(self) -> int:
        return math.prod(d for _, d in self.degrees)

    @property
    def replicas(self) -> int:
        return len(self.devices) // max(self.num_partitions, 1)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"devices": list(self.devices)}
        if self.degrees:
            d["degrees"] = dict(self.degrees)
        if self.sync != "all_reduce":
            d["sync"] = self.sync
        if self.ps_device is not None:
            d["ps_device"] = self.ps_device
        if self.sfb_duplicate:
            d["sfb_duplicate"] = list(self.sfb_duplicate)
        if self.recompute:
            d["recompute"] = True
        if self.zero:
            d["zero"] = self.zero
        if self.weights:
            d["weights"] = dict(self.weights)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str, version: int = PLAN_SCHEMA_VERSION) -> OpConfig:
        v2 = {"recompute", "zero", "weights"} if version >= 2 else set()
        check_keys(d, where, {"devices"}, {"degrees", "sync", "ps_device", "sfb_duplicate", *v2})
        devices = d["devices"]
        if not isinstance(devices, list) or not all(isinstance(x, str) for x in devices):
            raise SchemaError(f"{where}.devices: expected a list of device names, got {devices!r}")
        degrees = d.get("degrees", {})
        if not isinstance(degrees, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in degrees.values()
        ):
            raise SchemaError(f"{where}.degrees: expected an object of integer degrees, got {degrees!r}")
        ps = d.get("ps_device")
        if ps is not None and not isinstance(ps, str):
            raise SchemaError(f"{where}.ps_device: expected a device name or null, got {ps!r}")
        sync = d.get("sync", "all_reduce")
        if sync not in SYNC_MODES:
            raise SchemaError(f"{where}.sync: unknown sync mode {sync!r}; expected one of {list(SYNC_MODES)}")
        dup = d.get("sfb_duplicate", [])
        if not isinstance(dup, list) or not all(isinstance(x, str) for x in dup):
            raise SchemaError(f"{where}.sfb_duplicate: expected a list of node names, got {dup!r}")
        recompute = d.get("recompute", False)
        if not isinstance(recompute, bool):
            raise SchemaError(f"{where}.recompute: expected true or false, got {recompute!r}")
        zero = d.get("zero", 0)
        if isinstance(zero, bool) or zero not in ZERO_STAGES:
            raise SchemaError(f"{where}.zero: ZeRO stage {zero!r}; expected one of {list(ZERO_STAGES)}")
        weights = d.get("weights", {})
        if not isinstance(weights, dict) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights.values()
        ):
            raise SchemaError(f"{where}.weights: expected an object of device name -> number, got {weights!r}")
        return cls.make(devices, degrees, sync, ps, dup, recompute=recompute, zero=zero, weights=weights)


@dataclass(frozen=True)
class Plan:
    """A parallel configuration for every op of one graph.

    Attributes:
        graph_name: the name of the graph the plan was made for.
        configs: op name -> :class:`OpConfig`, one entry per op.
        name: a label (``"data_parallel"``, ``"mcmc"``, ...).
        metadata: free-form JSON-serializable notes (how the plan was found).
        micro_batches: micro-batches per iteration (gradient accumulation); each op's sample
            dimension is split into this many equal parts, run one after another.
        schedule: the pipeline schedule (:data:`SCHEDULES`) that orders each device's micro-batch
            tasks.
        virtual_stages: stages per device group under the ``interleaved`` schedule (1 otherwise).
    """

    graph_name: str
    configs: Mapping[str, OpConfig]
    name: str = "plan"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    micro_batches: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1

    @property
    def pipelined(self) -> bool:
        """Whether the plan runs several micro-batches per iteration."""
        return self.micro_batches > 1

    def with_schedule(
        self, micro_batches: int | None = None, schedule: Schedule | None = None, virtual_stages: int | None = None
    ) -> Plan:
        """A copy with the pipeline fields changed (``None``: kept)."""
        return dataclasses.replace(
            self,
            micro_batches=self.micro_batches if micro_batches is None else micro_batches,
            schedule=self.schedule if schedule is None else schedule,
            virtual_stages=self.virtual_stages if virtual_stages is None else virtual_stages,
        )

    def with_configs(self, configs: Mapping[str, OpConfig], name: str | None = None) -> Plan:
        """A copy with other configurations (same pipeline fields)."""
        return dataclasses.replace(self, configs=configs, name=self.name if name is None else name)

    def __getitem__(self, op_name: str) -> OpConfig:
        try:
            return self.configs[op_name]
        except KeyError:
            raise UnknownNameError(f"op of plan {self.name!r}", op_name, self.configs) from None

    def devices_used(self) -> list[str]:
        """The distinct devices any task runs on, in first-use order."""
        return list(dict.fromkeys(d for cfg in self.configs.values() for d in cfg.devices))

    # ------------------------------------------------------------ validation
    def validate(self, graph: OpGraph, topology: DeviceTopology) -> None:
        """Check the plan against a graph and a topology.

        Raises:
            ValueError: naming the op and the bad value: a missing or unknown op, an unknown device,
                an unknown parallel dimension, a degree that is < 1 or does not divide the
                dimension, a device count that is not a multiple of the partition count, a
                ``duplicate`` sync with sample/attribute splits, a misplaced ``ps_device``, or an ``sfb``
                sync on an op without its own parameters, with a split other than along the sample
                dimension, with several tasks on a device, or duplicating a node whose op is not
                configured alike; a ZeRO stage on an op whose parameters are not replicated or not
                all-reduced; weights that do not sum to 1, miss or name a device the op does not
                use; an unknown schedule, micro-batches that do not divide an op's batch, or virtual
                stages the plan's stages do not match.
        """
        missing = [op.name for op in graph.ops if op.name not in self.configs]
        if missing:
            raise ValueError(
                f"plan {self.name!r} has no configuration for {len(missing)} op(s) of graph {graph.name!r}, "
                f"e.g. {missing[:5]}; expected one per op"
            )
        valid_devices = {d.name for d in topology.devices}
        for op_name, cfg in self.configs.items():
            if op_name not in graph:
                raise UnknownNameError(
                    f"op (plan {self.name!r}, graph {graph.name!r})", op_name, [o.name for o in graph.ops]
                )
            _validate_config(graph.op(op_name), cfg, valid_devices)
            if cfg.sync == "sfb":
                _validate_sfb(graph, self, op_name, cfg)
        self.validate_schedule(graph)

    def validate_schedule(self, graph: OpGraph) -> None:
        """Check the pipeline fields against the graph (see :meth:`validate`)."""
        where = f"plan {self.name!r}"
        if self.schedule not in SCHEDULES:
            raise ValueError(f"{where}: unknown schedule {self.schedule!r}; expected one of {list(SCHEDULES)}")
        m = self.micro_batches
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_MICRO_BATCHES:
            raise ValueError(f"{where}: micro_batches = {m!r}; expected an integer from 1 to {MAX_MICRO_BATCHES:,}")
        v = self.virtual_stages
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: virtual_stages = {v!r}; expected a positive integer")
        if v > 1 and self.schedule != "interleaved":
            raise ValueError(
                f"{where}: virtual_stages = {v} with schedule {self.schedule!r}; virtual stages need 'interleaved'"
            )
        if m > 1:
            for op in graph.ops:
                dim = op.sample_dim
                if dim is not None and dim.size % m:
                    raise ValueError(
                        f"{where}: {m} micro-batches do not divide op {op.name!r}'s sample dimension of size "
                        f"{dim.size}; expected a divisor of the batch"
                    )
                cfg = self.configs[op.name]
                shares = sample_shares(op, cfg)
                if dim is not None and shares and min(shares) * (dim.size // m) < 1:
                    raise ValueError(
                        f"{where}: op {op.name!r}'s weights give a slice of less than one sample of a micro-batch "
                        f"of {dim.size // m}; expected larger weights or fewer micro-batches"
                    )
                if dim is not None and not cfg.weights:
                    degree = cfg.degree_map.get(dim.name, 1)
                    if (dim.size // m) % degree:
                        raise ValueError(
                            f"{where}: op {op.name!r} splits its sample dimension {degree} ways, which does not "
                            f"divide a micro-batch of {dim.size // m}; give weights for an uneven split or "
                            "choose fewer micro-batches"
                        )
        if self.schedule == "interleaved":
            stages = pipeline_stages(graph, self)
            groups = list(dict.fromkeys(s.devices for s in stages))
            counts = [sum(s.devices == g for s in stages) for g in groups]
            if any(c != v for c in counts):
                raise ValueError(
                    f"{where}: schedule 'interleaved' with virtual_stages = {v}, but the plan's {len(stages)} "
                    f"stage(s) give its {len(groups)} device group(s) {sorted(set(counts))} stage(s) each; "
                    f"expected {v} stages per group ({v * len(groups)} in all)"
                )
            off = [i for i, stage in enumerate(stages) if stage.devices != groups[i % len(groups)]]
            if off:
                raise ValueError(
                    f"{where}: schedule 'interleaved' deals model chunks to the {len(groups)} device group(s) in "
                    f"turn (chunk k on group k mod {len(groups)}); stage {off[0]} runs on "
                    f"{list(stages[off[0]].devices)}, expected {list(groups[off[0] % len(groups)])}"
                )
            if m % len(groups):
                raise ValueError(
                    f"{where}: schedule 'interleaved' needs micro_batches to be a multiple of the {len(groups)} "
                    f"pipeline group(s); got {m}"
                )

    # -------------------------------------------------------------- expansion
    def expand(self, coarse: OpGraph, fine: OpGraph, overrides: Mapping[str, OpConfig] | None = None) -> Plan:
        """Expand a plan on a coarse graph of op groups into a plan on the original ops.

        Each member op inherits its group's configuration: a sample degree ``d`` carries over to
        members whose sample dimension (output or reduction) ``d`` divides; other members run as
        replicas on all of the group's devices (same sync mode). ``overrides`` replace the
        configuration of individual original ops (TAG's model-parallel option).

        Raises:
            ValueError: if ``coarse`` is not a grouping of ``fine`` or the plan is not for ``coarse``.
        """
        if coarse.metadata.get("coarsened_from") != fine.name:
            raise ValueError(
                f"graph {coarse.name!r} is not a coarsening of {fine.name!r} "
                f"(it was coarsened from {coarse.metadata.get('coarsened_from')!r})"
            )
        configs: dict[str, OpConfig] = {}
        for group in coarse.ops:
            cfg = self[group.name]
            for member in group.members:
                configs[member] = member_config(fine.op(member), cfg)
        for member, cfg in (overrides or {}).items():
            fine.op(member)
            configs[member] = cfg
        return Plan(
            fine.name,
            configs,
            name=self.name,
            metadata={**self.metadata, "expanded_from": coarse.name},
            micro_batches=self.micro_batches,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "schema_version": PLAN_SCHEMA_VERSION,
            "name": self.name,
            "graph": self.graph_name,
            "metadata": dict(self.metadata),
        }
        if self.micro_batches != 1 or self.schedule != "1f1b" or self.virtual_stages != 1:
            d["pipeline"] = {
                "micro_batches": self.micro_batches,
                "schedule": self.schedule,
                "virtual_stages": self.virtual_stages,
            }
        d["configs"] = {op: cfg.to_dict() for op, cfg in self.configs.items()}
        return d

    @classmethod
    def from_dict(cls, document: Any) -> Plan:
        check_header(document, PLAN_FORMAT, PLAN_SCHEMA_VERSIONS)
        version = document["schema_version"]
        optional = {"name", "metadata", *(("pipeline",) if version >= 2 else ())}
        check_keys(document, "plan", {"format", "schema_version", "graph", "configs"}, optional)
        pipeline = document.get("pipeline", {})
        check_keys(pipeline, "plan.pipeline", set(), {"micro_batches", "schedule", "virtual_stages"})
        micro_batches = pipeline.get("micro_batches", 1)
        virtual_stages = pipeline.get("virtual_stages", 1)
        for key, value in (("micro_batches", micro_batches), ("virtual_stages", virtual_stages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SchemaError(f"plan.pipeline.{key} = {value!r}; expected a positive integer")
        schedule = pipeline.get("schedule", "1f1b")
        if schedule not in SCHEDULES:
            raise SchemaError(
                f"plan.pipeline.schedule: unknown schedule {schedule!r}; expected one of {list(SCHEDULES)}"
            )
        configs = document["configs"]
        if not isinstance(configs, dict):
            raise SchemaError(f"plan.configs: expected an object of op name -> config, got {type(configs).__name__}")
        metadata = document.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SchemaError(f"plan.metadata: expected an object, got {type(metadata).__name__}")
        return cls(
            graph_name=str(document["graph"]),
            configs={op: OpConfig.from_dict(cfg, f"plan.configs[{op!r}]", version) for op, cfg in configs.items()},
            name=str(document.get("name", "plan")),
            metadata=metadata,
            micro_batches=micro_batches,
            schedule=schedule,
            virtual_stages=virtual_stages,
        )

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Plan:
        return cls.from_dict(read_json(path))


def member_config(op: Op, group_cfg: OpConfig) -> OpConfig:
    """The configuration a member op inherits from its group's (:meth:`Plan.expand`): the group's
    sample degree ``d`` when ``d`` divides the op's sample dimension, else replicas on all of the
    group's devices; same devices, sync mode and parameter server."""
    sample = group_cfg.degree_map.get("sample", 1)
    dim = op.sample_dim
    split = sample > 1 and dim is not None and dim.size % sample == 0
    # a group's sfb carries over to members it can hold for (own parameters, batch split)
    sync = group_cfg.sync if group_cfg.sync != "sfb" or (split and op.param_bytes > 0) else "all_reduce"
    zero = group_cfg.zero if op.param_bytes > 0 and sync in ("all_reduce", "all_reduce_per_tensor") else 0
    if split and dim is not None:
        return OpConfig.make(
            group_cfg.devices,
            {dim.name: sample},
            sync,
            group_cfg.ps_device,
            recompute=group_cfg.recompute,
            zero=zero,
            weights=group_cfg.weight_map,
        )
    return OpConfig.make(group_cfg.devices, {}, sync, group_cfg.ps_device, recompute=group_cfg.recompute, zero=zero)


def _validate_config(op: Op, cfg: OpConfig, valid_devices: set[str]) -> None:
    where = f"op {op.name!r}"
    if not cfg.devices:
        raise ValueError(f"{where}: configuration lists no device; expected at least one")
    for dev in (*cfg.devices, *((cfg.ps_device,) if cfg.ps_device else ())):
        if dev not in valid_devices:
            raise UnknownNameError(f"device (in the configuration of {where})", dev, valid_devices)
    if cfg.sync not in SYNC_MODES:
        raise ValueError(f"{where}: sync mode {cfg.sync!r}; expected one of {list(SYNC_MODES)}")
    if cfg.sfb_duplicate and cfg.sync != "sfb":
        raise ValueError(
            f"{where}: sfb_duplicate {list(cfg.sfb_duplicate)} given with sync {cfg.sync!r}; it needs 'sfb'"
        )
    if cfg.ps_device is not None and cfg.sync != "parameter_server":
        raise ValueError(
            f"{where}: ps_device {cfg.ps_device!r} given with sync {cfg.sync!r}; it needs 'parameter_server'"
        )
    dims = {d.name: d for d in op.parallel_dims}
    for name, degree in cfg.degrees:
        if name not in dims:
            raise UnknownNameError(f"parallel dimension of {where}", name, dims)
        if degree < 1:
            raise ValueError(f"{where}: degree {degree} for dimension {name!r}; expected a positive integer")
        uneven = bool(cfg.weights) and dims[name].kind == "sample"
        if dims[name].size % degree and not uneven:
            raise ValueError(
                f"{where}: degree {degree} does not divide dimension {name!r} of size {dims[name].size}"
                + ("; give weights for an uneven split" if dims[name].kind == "sample" else "")
            )
        if uneven and degree > dims[name].size:
            raise ValueError(f"{where}: degree {degree} exceeds dimension {name!r} of size {dims[name].size}")
    if len(cfg.devices) % cfg.num_partitions:
        raise ValueError(
            f"{where}: {len(cfg.devices)} device(s) for {cfg.num_partitions} partitions; expected a multiple "
            f"(degrees {cfg.degree_map})"
        )
    if not isinstance(cfg.recompute, bool):
        raise ValueError(f"{where}: recompute = {cfg.recompute!r}; expected true or false")
    if isinstance(cfg.zero, bool) or cfg.zero not in ZERO_STAGES:
        raise ValueError(f"{where}: ZeRO stage {cfg.zero!r}; expected one of {list(ZERO_STAGES)}")
    if cfg.zero:
        holders = zero_holders(op, cfg)
        if op.param_bytes <= 0:
            raise ValueError(f"{where}: ZeRO stage {cfg.zero} on an op without parameters; ZeRO shards parameter state")
        if cfg.sync not in ("all_reduce", "all_reduce_per_tensor", "duplicate"):
            raise ValueError(
                f"{where}: ZeRO stage {cfg.zero} with sync {cfg.sync!r}; ZeRO shards all-reduced replicas "
                "(sync 'all_reduce', 'all_reduce_per_tensor', or 'duplicate' over batch slices)"
            )
        if holders < 2:
            raise ValueError(
                f"{where}: ZeRO stage {cfg.zero} on parameters that are not replicated ({len(cfg.devices)} task(s), "
                f"degrees {cfg.degree_map}, sync {cfg.sync!r}); ZeRO needs each shard all-reduced over at least 2 "
                "devices"
            )
    if cfg.weights:
        _validate_weights(op, cfg, where)


def zero_holders(op: Op, cfg: OpConfig) -> int:
    """How many devices all-reduce each parameter shard of ``op`` under ``cfg`` (ZeRO divides its
    state among them): every holder of the shard under ``all_reduce``; under ``duplicate`` the
    batch (or other) slices of one replica index; 0 when the shard is not all-reduced."""
    kinds = {d.name: d.kind for d in op.parallel_dims}
    shards = math.prod(deg for name, deg in cfg.degrees if kinds.get(name) == "parameter")
    if cfg.sync in ("all_reduce", "all_reduce_per_tensor"):
        return len(cfg.devices) // shards
    if cfg.sync == "duplicate":
        slices = cfg.num_partitions // shards
        return slices if slices > 1 else 0
    return 0


def zero_eligible(op: Op, cfg: OpConfig) -> bool:
    """Whether ``cfg`` can shard ``op``'s parameter state (a ZeRO stage above 0 is valid): parameters,
    each shard all-reduced over at least two devices (:func:`zero_holders`)."""
    return op.param_bytes > 0 and zero_holders(op, cfg) >= 2


def _validate_weights(op: Op, cfg: OpConfig, where: str) -> None:
    """Weights: one positive finite weight per device of the op, summing to 1, with a sample split."""
    weights = cfg.weight_map
    if len(weights) != len(cfg.weights):
        raise ValueError(f"{where}: weights name a device twice: {[d for d, _ in cfg.weights]}")
    devices = list(dict.fromkeys(cfg.devices))
    stray = [d for d in weights if d not in devices]
    if stray:
        raise ValueError(f"{where}: weights name device(s) {stray} the op does not use; expected weights for {devices}")
    missing = [d for d in devices if d not in weights]
    if missing:
        raise ValueError(f"{where}: weights miss device(s) {missing}; expected one weight per device of {devices}")
    bad = {d: w for d, w in weights.items() if not (math.isfinite(w) and w > 0)}
    if bad:
        raise ValueError(f"{where}: weights {bad}; expected positive finite numbers")
    total = math.fsum(weights.values())
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"{where}: weights sum to {total:.9g}; expected 1 (each device's share of the batch)")
    dim = op.sample_dim
    degree = cfg.degree_map.get(dim.name, 1) if dim is not None else 1
    if dim is None or degree < 2:
        raise ValueError(
            f"{where}: weights {weights} without a sample split (degrees {cfg.degree_map}); weights set the share "
            "of each slice of the batch, so the op needs a sample degree of at least 2"
        )
    if len(devices) != len(cfg.devices):
        raise ValueError(f"{where}: weights with several tasks on one device {list(cfg.devices)}; expected one each")
    shares = sample_shares(op, cfg)
    if shares is not None and min(shares) * dim.size < 1:
        raise ValueError(
            f"{where}: weights {weights} give a slice of less than one sample of {dim.size}; expected larger weights"
        )


def sample_shares(op: Op, cfg: OpConfig) -> list[float] | None:
    """Each sample slice's share of the batch under ``cfg``'s weights (``None``: equal shares).

    The devices whose tasks compute a slice add their weights (every other split and every
    replica of the slice has its own device).
    """
    dim = op.sample_dim
    if not cfg.weights or dim is None:
        return None
    degree = cfg.degree_map.get(dim.name, 1)
    split = [(d.name, cfg.degree_map[d.name]) for d in op.parallel_dims if cfg.degree_map.get(d.name, 1) > 1]
    names = [n for n, _ in split]
    if dim.name not in names:
        return None
    k = names.index(dim.name)
    after = math.prod(deg for _, deg in split[k + 1 :])
    R = len(cfg.devices) // max(cfg.num_partitions, 1)
    weights = cfg.weight_map
    shares = [0.0] * degree
    for t, device in enumerate(cfg.devices):
        shares[(t // R // after) % degree] += weights.get(device, 0.0)
    return shares


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of a plan: a run of consecutive ops (topological order) on one device set.

    Attributes:
        devices: the stage's devices, sorted by name.
        ops: indices of the stage's ops in the graph.
    """

    devices: tuple[str, ...]
    ops: tuple[int, ...]


def pipeline_stages(graph: OpGraph, plan: Plan) -> list[Stage]:
    """The plan's stages: maximal runs of consecutive ops (graph order) on the same device set; an
    op on a subset of the current run's devices stays in the run."""
    stages: list[tuple[frozenset[str], list[int]]] = []
    for i, op in enumerate(graph.ops):
        devices = frozenset(plan[op.name].devices)
        if stages and devices <= stages[-1][0]:
            stages[-1][1].append(i)
        else:
            stages.append((devices, [i]))
    return [Stage(tuple(sorted(devs)), tuple(ops)) for devs, ops in stages]


def _validate_sfb(graph: OpGraph, plan: Plan, op_name: str, cfg: OpConfig) -> None:
    """``sfb``: own parameters, a sample split only, one task per device, duplicated nodes configured alike."""
    op = graph.op(op_name)
    where = f"op {op_name!r}"
    if op.param_bytes <= 0:
        raise ValueError(f"{where}: sync 'sfb' on an op without parameters; sfb synchronizes a parameter gradient")
    if op.param_key is not None and sum(o.param_key == op.param_key for o in graph.ops) > 1:
        raise ValueError(
            f"{where}: sync 'sfb' on parameters shared with other ops (param_key {op.param_key!r}); "
            "sfb needs an op with its own parameters"
        )
    kinds = {d.name: d.kind for d in op.parallel_dims}
    bad = [name for name, degree in cfg.degrees if degree > 1 and kinds.get(name) != "sample"]
    if bad:
        raise ValueError(
            f"{where}: sync 'sfb' with degrees {cfg.degree_map}; sfb needs a split along the sample dimension "
            f"only ({bad[0]!r} is not one)"
        )
    if cfg.replicas != 1 or len(set(cfg.devices)) != len(cfg.devices):
        raise ValueError(
            f"{where}: sync 'sfb' over devices {list(cfg.devices)} with {cfg.num_partitions} partition(s); sfb "
            "needs one batch share per device (one task per device)"
        )
    for node in cfg.sfb_duplicate:
        kind, _, other = node.partition(":")
        if kind not in SFB_NODE_KINDS or other not in graph:
            raise ValueError(
                f"{where}: sfb_duplicate node {node!r}; expected 'forward:<op>' or 'backward:<op>' naming an op "
                f"of graph {graph.name!r}"
            )
        theirs = plan[other]
        if theirs.devices != cfg.devices or theirs.num_partitions != cfg.num_partitions:
            raise ValueError(
                f"{where}: sfb_duplicate node {node!r}: op {other!r} runs on {list(theirs.devices)} with "
                f"{theirs.num_partitions} partition(s), op {op_name!r} on {list(cfg.devices)}; a duplicated node "
                "must be configured like the op"
            )
