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
  ``duplicate``, which is only valid when every replica computes identical gradients, i.e. when no
  sample or attribute degree exceeds 1, or by ``sfb`` (TAG sec. 4.2.3, sufficient factor
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

Plans on a coarse graph (:func:`placement_rl.graph.coarsen.coarsen`) expand to the original ops with
:meth:`Plan.expand`. The JSON schema (``format: placement_rl.plan``) is in ``docs/formats.md``.
"""

from __future__ import annotations

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
PLAN_SCHEMA_VERSION = 1


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
    """

    devices: tuple[str, ...]
    degrees: tuple[tuple[str, int], ...] = ()
    sync: SyncMode = "all_reduce"
    ps_device: str | None = None
    sfb_duplicate: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        devices: Sequence[str] | str,
        degrees: Mapping[str, int] | None = None,
        sync: SyncMode = "all_reduce",
        ps_device: str | None = None,
        sfb_duplicate: Sequence[str] = (),
    ) -> OpConfig:
        """Build a config from a device list (or one device) and a ``{dim name: degree}`` mapping."""
        devs = (devices,) if isinstance(devices, str) else tuple(devices)
        degs = tuple(sorted((k, int(v)) for k, v in (degrees or {}).items() if v != 1))
        return cls(devs, degs, sync, ps_device, tuple(sfb_duplicate))

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
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> OpConfig:
        check_keys(d, where, {"devices"}, {"degrees", "sync", "ps_device", "sfb_duplicate"})
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
        return cls.make(devices, degrees, sync, ps, dup)


@dataclass(frozen=True)
class Plan:
    """A parallel configuration for every op of one graph.

    Attributes:
        graph_name: the name of the graph the plan was made for.
        configs: op name -> :class:`OpConfig`, one entry per op.
        name: a label (``"data_parallel"``, ``"mcmc"``, ...).
        metadata: free-form JSON-serializable notes (how the plan was found).
    """

    graph_name: str
    configs: Mapping[str, OpConfig]
    name: str = "plan"
    metadata: Mapping[str, Any] = field(default_factory=dict)

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
                configured alike.
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
        return Plan(fine.name, configs, name=self.name, metadata={**self.metadata, "expanded_from": coarse.name})

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "schema_version": PLAN_SCHEMA_VERSION,
            "name": self.name,
            "graph": self.graph_name,
            "metadata": dict(self.metadata),
            "configs": {op: cfg.to_dict() for op, cfg in self.configs.items()},
        }

    @classmethod
    def from_dict(cls, document: Any) -> Plan:
        check_header(document, PLAN_FORMAT, (PLAN_SCHEMA_VERSION,))
        check_keys(document, "plan", {"format", "schema_version", "graph", "configs"}, {"name", "metadata"})
        configs = document["configs"]
        if not isinstance(configs, dict):
            raise SchemaError(f"plan.configs: expected an object of op name -> config, got {type(configs).__name__}")
        metadata = document.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SchemaError(f"plan.metadata: expected an object, got {type(metadata).__name__}")
        return cls(
            graph_name=str(document["graph"]),
            configs={op: OpConfig.from_dict(cfg, f"plan.configs[{op!r}]") for op, cfg in configs.items()},
            name=str(document.get("name", "plan")),
            metadata=metadata,
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
    if split and dim is not None:
        return OpConfig.make(group_cfg.devices, {dim.name: sample}, sync, group_cfg.ps_device)
    return OpConfig.make(group_cfg.devices, {}, sync, group_cfg.ps_device)


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
        if dims[name].size % degree:
            raise ValueError(f"{where}: degree {degree} does not divide dimension {name!r} of size {dims[name].size}")
        if cfg.sync == "duplicate" and degree > 1 and dims[name].kind != "parameter":
            raise ValueError(
                f"{where}: sync 'duplicate' with {name!r} degree {degree}: replicas would compute different "
                "gradients; duplicate allows only parameter-dimension splits"
            )
    if len(cfg.devices) % cfg.num_partitions:
        raise ValueError(
            f"{where}: {len(cfg.devices)} device(s) for {cfg.num_partitions} partitions; expected a multiple "
            f"(degrees {cfg.degree_map})"
        )


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
