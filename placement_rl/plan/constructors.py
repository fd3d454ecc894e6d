"""Plan constructors: the baseline strategies and TAG's strategy, as :class:`~placement_rl.plan.Plan` objects.

* :func:`single_device`: every op on one device.
* :func:`data_parallel`: every op split along its sample dimension, gradients all-reduced in buckets.
* :func:`data_parallel_per_tensor`: the same, each gradient all-reduced on its own (the papers' DP-NCCL).
* :func:`expert`: FlexFlow's expert strategies (Krizhevsky's "one weird trick"; Wu et al. for RNNs).
* :func:`layerwise`: contiguous stages balanced by compute.
* :func:`pipeline`: pipeline parallelism: contiguous stages balanced by compute, each on a group of
  devices (data parallel inside the group), with micro-batches, a schedule (GPipe, 1F1B) and
  Megatron-LM's interleaving (``virtual_stages`` chunks per device group).
* :func:`zero` / :func:`fsdp`: a plan's all-reduced, replicated parameters sharded with ZeRO (stage 1:
  optimizer state, 2: + gradients, 3: + parameters, i.e. FSDP).
* :func:`recompute`: activation recomputation on every op, or on the ops of some types.
* :func:`tag_strategy` / :func:`tag_group_config`: TAG's placement and replication options on op groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from placement_rl.errors import UnknownNameError
from placement_rl.graph import Op, OpGraph
from placement_rl.ops import DENSE_OPS, OP_KINDS, RECURRENT_OPS
from placement_rl.plan.core import (
    MAX_MICRO_BATCHES,
    SCHEDULES,
    TAG_OPTIONS,
    ZERO_STAGES,
    OpConfig,
    Plan,
    Schedule,
    SyncMode,
    TagOption,
)
from placement_rl.topology import DeviceTopology

if TYPE_CHECKING:
    from placement_rl.sim import CostModel


def device_groups(topology: DeviceTopology, devices: Sequence[str]) -> list[tuple[str, ...]]:
    """The named groups of ``devices``: all of them, then each machine's, then each device type's
    (first appearance order, without repeats)."""
    groups: dict[tuple[str, ...], None] = {tuple(devices): None}
    for key in ("machine", "device_type"):
        by: dict[str, list[str]] = {}
        for name in devices:
            by.setdefault(getattr(topology.device(name), key), []).append(name)
        groups.update(dict.fromkeys(tuple(g) for g in by.values()))
    return list(groups)


def _device_names(topology: DeviceTopology, devices: Sequence[str] | None) -> list[str]:
    names = [d.name for d in topology.devices] if devices is None else list(devices)
    for name in names:
        topology.device(name)
    if not names:
        raise ValueError("expected at least one device")
    return names


def _largest_divisor(size: int, limit: int) -> int:
    return max(d for d in range(1, min(size, limit) + 1) if size % d == 0)


def _split_config(op: Op, dim_kind_or_name: str, devices: Sequence[str], sync: SyncMode = "all_reduce") -> OpConfig:
    """Split ``op`` along one dimension over the first ``d`` devices, ``d`` the largest degree that
    divides the dimension; ops without that dimension run replicated on all ``devices``."""
    dim = next((d for d in op.parallel_dims if dim_kind_or_name in (d.kind, d.name)), None)
    if dim is None:
        return OpConfig.make(devices, {}, sync)
    degree = _largest_divisor(dim.size, len(devices))
    return OpConfig.make(devices[:degree], {dim.name: degree}, sync)


def single_device(graph: OpGraph, topology: DeviceTopology, device: str | None = None) -> Plan:
    """Every op on one device (default: the fastest, ties broken by memory then name)."""
    if device is None:
        device = max(topology.devices, key=lambda d: (d.peak_flops, d.memory_bytes, [-ord(c) for c in d.name])).name
    topology.device(device)
    cfg = OpConfig.make(device)
    return Plan(graph.name, {op.name: cfg for op in graph.ops}, name="single_device", metadata={"device": device})


def data_parallel(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | None = None,
    sync: SyncMode = "all_reduce",
) -> Plan:
    """Data parallelism: every op split along its sample dimension over ``devices`` (default: all).

    An op whose batch extent the device count does not divide uses the largest degree that does
    (on the first devices); ops with no sample dimension (parameters, constants) are replicated on
    every device. Parameters are synchronized with ``sync``: by default all-reduced in gradient
    buckets, as PyTorch DDP (``CostModel.bucket_bytes``).
    """
    names = _device_names(topology, devices)
    configs = {op.name: _split_config(op, "sample", names, sync) for op in graph.ops}
    return Plan(graph.name, configs, name="data_parallel", metadata={"devices": names, "sync": sync})


def data_parallel_per_tensor(graph: OpGraph, topology: DeviceTopology, devices: Sequence[str] | None = None) -> Plan:
    """:func:`data_parallel` with every parameter tensor all-reduced on its own as soon as its
    gradient exists: the data parallelism of FlexFlow's and TAG's papers (DP-NCCL without buckets).

    A plan-level choice (sync mode ``all_reduce_per_tensor``), so the plan file says it and any cost
    model simulates it; ``CostModel(bucket_bytes=0)`` does the same for every plan.
    """
    plan = data_parallel(graph, topology, devices, sync="all_reduce_per_tensor")
    return Plan(graph.name, dict(plan.configs), name="data_parallel_per_tensor", metadata=dict(plan.metadata))


def expert(graph: OpGraph, topology: DeviceTopology, devices: Sequence[str] | None = None) -> Plan:
    """The expert-designed strategies FlexFlow compares against (sec. 8.1).

    * Recurrent models (any LSTM/GRU/RNN op), after Wu et al. (2016): data parallelism across
      machines, and inside each machine the ops of recurrent layer ``l`` (and the ops that follow
      it up to the next layer) on GPU ``l mod G`` of that machine.
    * Every other model, Krizhevsky's "one weird trick" (2014): data parallelism for every op
      except the densely-connected layers (:data:`placement_rl.ops.DENSE_OPS`: ``linear``), which are
      split along their output channels (parameter dimension) over all devices.
    """
    names = _device_names(topology, devices)
    if any(op.op_type in RECURRENT_OPS for op in graph.ops):
        return _expert_recurrent(graph, topology, names)
    configs = {
        op.name: _split_config(op, "parameter" if op.op_type in DENSE_OPS else "sample", names) for op in graph.ops
    }
    return Plan(graph.name, configs, name="expert", metadata={"devices": names, "rule": "krizhevsky-2014"})


def _expert_recurrent(graph: OpGraph, topology: DeviceTopology, names: list[str]) -> Plan:
    by_machine: dict[str, list[str]] = {}
    for name in names:
        by_machine.setdefault(topology.device(name).machine, []).append(name)
    machines = list(by_machine.values())
    per_machine = min(len(m) for m in machines)
    layer_of_key: dict[str, int] = {}
    depth = [0] * graph.num_ops
    for i, op in enumerate(graph.ops):
        inherited = max((depth[p] for p in graph.predecessors[i]), default=0)
        if op.op_type in RECURRENT_OPS and op.param_key is not None:
            inherited = layer_of_key.setdefault(op.param_key, len(layer_of_key))
        depth[i] = inherited
    configs = {}
    for i, op in enumerate(graph.ops):
        gpu = depth[i] % per_machine
        devs = [m[gpu] for m in machines]
        configs[op.name] = _split_config(op, "sample", devs)
    return Plan(
        graph.name, configs, name="expert", metadata={"devices": names, "rule": "wu-2016", "layers": len(layer_of_key)}
    )


def layerwise(graph: OpGraph, topology: DeviceTopology, devices: Sequence[str] | None = None) -> Plan:
    """Contiguous stages: ops in topological order cut into one stage per device.

    Stage boundaries balance compute time: device ``k`` receives the ops whose cumulative
    forward+backward FLOPs fall in its share, shares proportional to the devices' peak FLOP/s.
    Memory is not considered (the simulator reports OOM).
    """
    names = _device_names(topology, devices)
    work = graph.arrays.forward_flops + graph.arrays.backward_flops
    speed = np.array([topology.device(n).peak_flops for n in names])
    stage = _balanced_stages(work, speed)
    configs = {op.name: OpConfig.make(names[int(stage[i])]) for i, op in enumerate(graph.ops)}
    return Plan(graph.name, configs, name="layerwise", metadata={"devices": names})


def _balanced_stages(work: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """The stage of each op when ops in order are cut into ``len(speed)`` contiguous stages, stage ``k``
    taking the ops whose cumulative-work midpoint falls in its share, shares proportional to ``speed``.

    Args:
        work: ``(num_ops,)`` FLOPs per op, in topological order.
        speed: ``(num_stages,)`` FLOP/s of each stage's devices.

    Returns:
        ``(num_ops,)`` non-decreasing stage indices in ``[0, num_stages)``; a stage may be empty.
    """
    bounds = np.cumsum(speed) / speed.sum() * work.sum()
    midpoints = np.cumsum(work) - work / 2.0
    return np.minimum(np.searchsorted(bounds, midpoints, side="left"), len(speed) - 1)


def _nonempty_cuts(stage: np.ndarray, num_stages: int) -> list[int]:
    """Cut positions ``c_0 = 0 < c_1 < ... < c_K = num_ops`` (stage ``k``: ops ``c_k .. c_{k+1} - 1``)
    from the non-decreasing assignment ``stage`` (``(num_ops,)``), moved so that no stage is empty:
    each cut at least one op after the previous one, and early enough to leave one op to every later
    stage. Needs ``num_ops >= num_stages``."""
    n = len(stage)
    cuts = [0]
    for k in range(1, num_stages):
        first = int(np.searchsorted(stage, k, side="left"))  # the first op the balance gives stage >= k
        cuts.append(min(max(first, cuts[-1] + 1), n - num_stages + k))
    cuts.append(n)
    return cuts


def _stage_groups(
    topology: DeviceTopology,
    stages: int | Sequence[Sequence[str] | str] | None,
    devices: Sequence[str] | None,
    data_parallel: int,
) -> list[tuple[str, ...]]:
    """The device group of each pipeline stage (see :func:`pipeline`), checked."""
    if isinstance(data_parallel, bool) or not isinstance(data_parallel, int) or data_parallel < 1:
        raise ValueError(f"data_parallel = {data_parallel!r}; expected a positive integer (devices per stage)")
    if isinstance(stages, bool):
        raise ValueError(f"stages = {stages!r}; expected a stage count or one list of device names per stage")
    if stages is None or isinstance(stages, (int, np.integer)):
        names = _device_names(topology, devices)
        repeated = sorted(n for n, count in Counter(names).items() if count > 1)
        if repeated:
            raise ValueError(f"devices name {repeated} more than once; expected each device once")
        if stages is None:
            if len(names) % data_parallel:
                raise ValueError(
                    f"data_parallel = {data_parallel} does not divide the {len(names)} devices; expected a divisor, "
                    "or give stages"
                )
            stages = len(names) // data_parallel
        stages = int(stages)
        if stages < 1:
            raise ValueError(f"stages = {stages}; expected at least 1")
        if stages * data_parallel > len(names):
            raise ValueError(
                f"stages = {stages} of data_parallel = {data_parallel} device(s) need {stages * data_parallel} "
                f"devices; only {len(names)} are given; expected stages * data_parallel <= {len(names)}"
            )
        return [tuple(names[k * data_parallel : (k + 1) * data_parallel]) for k in range(stages)]
    if devices is not None:
        raise ValueError(f"devices = {list(devices)!r} given with explicit stage device lists; give one or the other")
    if isinstance(stages, str) or not isinstance(stages, Sequence) or not stages:
        raise ValueError(f"stages = {stages!r}; expected a stage count or a non-empty list of device lists per stage")
    groups = [(s,) if isinstance(s, str) else tuple(s) for s in stages]
    seen: dict[str, int] = {}
    for k, group in enumerate(groups):
        if not group:
            raise ValueError(f"stage {k} lists no device; expected at least one device per stage")
        for name in group:
            if not isinstance(name, str):
                raise ValueError(f"stage {k} lists {name!r}; expected device names")
            topology.device(name)
            if name in seen:
                raise ValueError(
                    f"device {name!r} is in stage {seen[name]} and stage {k}; expected disjoint device groups "
                    "(a device runs several stages only through virtual_stages)"
                )
            seen[name] = k
        if data_parallel != 1 and len(group) != data_parallel:
            raise ValueError(
                f"data_parallel = {data_parallel} but stage {k} lists {len(group)} device(s) {list(group)}; with "
                "explicit stages each list's length is its data-parallel degree (leave data_parallel at 1)"
            )
    return groups


def _stage_config(op: Op, group: tuple[str, ...], micro_batches: int) -> OpConfig:
    """An op of a stage on ``group``: split along its sample dimension over the whole group when the
    group size divides a micro-batch, else replicated on every device of the group (the stage's
    device set stays the group's, so :func:`~placement_rl.plan.core.pipeline_stages` finds it)."""
    if len(group) == 1:
        return OpConfig.make(group)
    dim = op.sample_dim
    if dim is not None and dim.size % (micro_batches * len(group)) == 0:
        return OpConfig.make(group, {dim.name: len(group)})
    return OpConfig.make(group)


def pipeline(
    graph: OpGraph,
    topology: DeviceTopology,
    stages: int | Sequence[Sequence[str] | str] | None = None,
    *,
    micro_batches: int = 1,
    schedule: Schedule = "1f1b",
    virtual_stages: int = 1,
    devices: Sequence[str] | None = None,
    data_parallel: int = 1,
) -> Plan:
    """Pipeline parallelism: ops in topological order cut into contiguous stages, each stage on a
    group of devices, an iteration's batch run as ``micro_batches`` micro-batches under ``schedule``.

    Device groups: with a stage count, ``devices`` (default: all of the topology's, in order) are
    dealt into ``stages`` consecutive groups of ``data_parallel`` devices (the first
    ``stages * data_parallel`` devices; in the presets' machine-major order a group stays inside a
    machine where it fits, so the gradient all-reduce is local and only activations cross machines,
    as in Megatron-LM's rank order); default ``stages``: ``len(devices) / data_parallel``. With one
    list of device names per stage (a name alone: a one-device stage), the groups are those lists
    (disjoint; each list's length is that stage's data-parallel degree).

    Inside a group, an op is split along its sample dimension over all of the group's devices when
    the group size divides a micro-batch (``sample size / micro_batches``), else replicated on every
    device of the group; gradients are all-reduced over the group.

    Balance: the cut follows :func:`layerwise` (forward+backward FLOPs, shares proportional to the
    groups' summed peak FLOP/s), moved where needed so that no stage is empty. With
    ``schedule="interleaved"`` and ``virtual_stages = v``, the ops are cut into ``stages * v`` chunks and
    chunk ``k`` goes to group ``k % stages`` (Megatron-LM's interleaved schedule).

    Args:
        graph: the graph.
        topology: the cluster.
        stages: the number of device groups, or one list of device names per group.
        micro_batches: micro-batches per iteration; must divide every op's sample dimension.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved`` (:data:`~placement_rl.plan.core.SCHEDULES`).
        virtual_stages: chunks per device group (``interleaved`` only when above 1).
        devices: the devices to deal into groups (with a stage count only).
        data_parallel: devices per group (with a stage count; with lists, 1 or every list's length).

    Returns:
        A plan named ``pipeline`` whose metadata holds the ``groups`` and each chunk's op count
        (``chunk_ops``, in graph order); it passes :meth:`Plan.validate`.

    Raises:
        ValueError: naming the value: a stage count below 1 or above what the devices allow, more
            chunks than ops, an unknown, repeated or shared device, an unknown schedule, micro-batches
            that are not a positive integer or do not divide an op's batch, virtual stages without
            ``interleaved`` or with a single device group.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}; expected one of {list(SCHEDULES)}")
    for key, value, top in (
        ("micro_batches", micro_batches, MAX_MICRO_BATCHES),
        ("virtual_stages", virtual_stages, graph.num_ops),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{key} = {value!r}; expected an integer from 1 to {top:,}")
    if virtual_stages > 1 and schedule != "interleaved":
        raise ValueError(
            f"virtual_stages = {virtual_stages} with schedule {schedule!r}; virtual stages need schedule 'interleaved'"
        )
    groups = _stage_groups(topology, stages, devices, data_parallel)
    if virtual_stages > 1 and len(groups) < 2:
        raise ValueError(
            f"virtual_stages = {virtual_stages} on {len(groups)} device group; interleaving needs at least 2 groups"
        )
    num_chunks = len(groups) * virtual_stages
    if num_chunks > graph.num_ops:
        raise ValueError(
            f"{len(groups)} stage(s) x {virtual_stages} virtual stage(s) = {num_chunks} chunks for the "
            f"{graph.num_ops} ops of graph {graph.name!r}; expected at most one chunk per op"
        )
    work = graph.arrays.forward_flops + graph.arrays.backward_flops
    group_speed = [sum(topology.device(d).peak_flops for d in group) for group in groups]
    speed = np.array([group_speed[k % len(groups)] for k in range(num_chunks)], dtype=float)
    cuts = _nonempty_cuts(_balanced_stages(work, speed), num_chunks)
    configs: dict[str, OpConfig] = {}
    for k in range(num_chunks):
        group = groups[k % len(groups)]
        for op in graph.ops[cuts[k] : cuts[k + 1]]:
            configs[op.name] = _stage_config(op, group, micro_batches)
    plan = Plan(
        graph.name,
        configs,
        name="pipeline",
        metadata={
            "groups": [list(g) for g in groups],
            "chunk_ops": [cuts[k + 1] - cuts[k] for k in range(num_chunks)],
        },
        micro_batches=micro_batches,
        schedule=schedule,
        virtual_stages=virtual_stages,
    )
    plan.validate(graph, topology)
    return plan


def zero(graph: OpGraph, plan: Plan, stage: int = 1) -> Plan:
    """``plan`` with ZeRO ``stage`` on every op that can take it: an op with parameters, sync
    ``all_reduce`` or ``all_reduce_per_tensor``, and each parameter shard on at least 2 devices
    (replicas along the sample or attribute dimensions, or replicas of the task). Other ops keep
    their configuration (``stage = 0`` turns ZeRO off on the same ops).

    Args:
        graph: the graph the plan is for (it says which ops have parameters).
        plan: the plan.
        stage: 0 (plain data parallelism), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters: FSDP).

    Returns:
        The plan, same name and pipeline fields, ``metadata["zero"] = stage``.

    Raises:
        ValueError: for a stage outside :data:`~placement_rl.plan.core.ZERO_STAGES`, or an op of the
            plan that is not in ``graph``.
    """
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage {stage!r}; expected one of {list(ZERO_STAGES)}")
    configs: dict[str, OpConfig] = {}
    for name, cfg in plan.configs.items():
        op = graph.op(name)
        configs[name] = cfg.replace(zero=int(stage)) if _zero_eligible(op, cfg) else cfg
    return dataclasses.replace(plan, configs=configs, metadata={**plan.metadata, "zero": int(stage)})


def _zero_eligible(op: Op, cfg: OpConfig) -> bool:
    """Whether ``cfg`` can shard ``op``'s parameter state: parameters, all-reduced, each shard on >= 2 devices."""
    if op.param_bytes <= 0 or cfg.sync not in ("all_reduce", "all_reduce_per_tensor"):
        return False
    kinds = {d.name: d.kind for d in op.parallel_dims}
    shards = math.prod(degree for dim, degree in cfg.degrees if kinds.get(dim) == "parameter")
    return len(cfg.devices) // shards >= 2


def fsdp(graph: OpGraph, plan: Plan) -> Plan:
    """``plan`` with ZeRO stage 3 (fully sharded data parallelism) where it applies: :func:`zero` with ``stage=3``."""
    return zero(graph, plan, stage=3)


def recompute(graph: OpGraph, plan: Plan, op_types: Collection[str] | str | None = None) -> Plan:
    """``plan`` with activation recomputation on every op, or on the ops of ``op_types`` only (e.g.
    ``{"attention"}``: Megatron-LM's selective recomputation). Other ops keep their configuration.

    Args:
        graph: the graph the plan is for.
        plan: the plan.
        op_types: op types (:data:`placement_rl.ops.OP_KINDS`, or any type of the graph) to recompute;
            a string is one type; ``None``: every op. A type the graph does not use changes nothing.

    Returns:
        The plan, same name and pipeline fields, with ``metadata["recompute"]``: the sorted op types, or ``"all"``.

    Raises:
        ValueError: for an op type that is neither in the taxonomy nor in the graph, an empty
            ``op_types``, or an op of the plan that is not in ``graph``.
    """
    wanted: frozenset[str] | None = None
    if op_types is not None:
        wanted = frozenset((op_types,) if isinstance(op_types, str) else op_types)
        if not wanted:
            raise ValueError("op_types is empty; expected at least one op type, or None for every op")
        known = set(OP_KINDS) | {op.op_type for op in graph.ops}
        for op_type in sorted(wanted):
            if op_type not in known:
                raise UnknownNameError("op type (recompute)", op_type, known)
    configs: dict[str, OpConfig] = {}
    for name, cfg in plan.configs.items():
        op = graph.op(name)
        configs[name] = cfg.replace(recompute=True) if wanted is None or op.op_type in wanted else cfg
    label: str | list[str] = "all" if wanted is None else sorted(wanted)
    return dataclasses.replace(plan, configs=configs, metadata={**plan.metadata, "recompute": label})


def tag_strategy(
    coarse: OpGraph,
    fine: OpGraph,
    topology: DeviceTopology,
    decisions: Mapping[str, tuple[str, TagOption]],
    seed: int = 0,
) -> Plan:
    """TAG's strategy (placement P and replication plan O, sec. 4.1) as a plan on the original ops.

    Args:
        coarse: the op-group graph (:func:`placement_rl.graph.coarsen.coarsen` of ``fine``).
        fine: the original graph.
        topology: the cluster; a device group is a machine.
        decisions: group name -> ``(machine, option)``, option one of ``all_reduce``,
            ``parameter_server`` (servers chosen round-robin inside the machine), ``duplicate`` or
            ``model_parallel`` (the group's ops split over the machine's devices with METIS, each op
            on one device).
        seed: METIS seed for the model-parallel split.

    Raises:
        ValueError: for a missing group, an unknown machine or an unknown option.
    """
    from placement_rl.graph.coarsen import metis_parts

    machines = {m: [d.name for d in devs] for m, devs in topology.machines().items()}
    ps_turn = dict.fromkeys(machines, 0)
    configs: dict[str, OpConfig] = {}
    overrides: dict[str, OpConfig] = {}
    for group in coarse.ops:
        if group.name not in decisions:
            raise ValueError(f"tag_strategy: no decision for group {group.name!r}; expected one per group")
        machine, option = decisions[group.name]
        if machine not in machines:
            raise UnknownNameError("machine", machine, machines)
        devs = machines[machine]
        configs[group.name] = tag_group_config(group, devs, option, ps_turn[machine])
        ps_turn[machine] += option == "parameter_server"
        if option == "model_parallel":
            sub = fine.subgraph(group.members)
            parts = metis_parts(sub, len(devs), seed=seed) if len(devs) > 1 else [0] * sub.num_ops
            overrides.update({op.name: OpConfig.make(devs[p]) for op, p in zip(sub.ops, parts, strict=True)})
    return Plan(coarse.name, configs, name="tag").expand(coarse, fine, overrides)


def tag_group_config(group: Op, devices: Sequence[str], option: str, ps_index: int = 0) -> OpConfig:
    """The configuration of one op group under a TAG replication option on a device group.

    ``all_reduce`` / ``parameter_server``: the group's sample dimension split over the devices
    (server ``devices[ps_index % n]``); ``duplicate``: every device runs the whole group and no
    gradient is exchanged; ``model_parallel``: the group's ops are spread over the devices by
    :func:`tag_strategy`; as one config on the group itself it is ``devices[0]``.

    Raises:
        ValueError: for an unknown option.
    """
    if option in ("all_reduce", "parameter_server"):
        cfg = _split_config(group, "sample", devices, option)  # type: ignore[arg-type]
        if option == "parameter_server":
            cfg = OpConfig.make(cfg.devices, cfg.degree_map, "parameter_server", devices[ps_index % len(devices)])
        return cfg
    if option == "duplicate":
        return OpConfig.make(devices, {}, "duplicate")
    if option == "model_parallel":
        return OpConfig.make(devices[0])
    raise ValueError(f"TAG option {option!r} for group {group.name!r}; expected one of {list(TAG_OPTIONS)}")


def subset_data_parallel(
    graph: OpGraph, topology: DeviceTopology, devices: Sequence[str] | None = None, cost_model: CostModel | None = None
) -> Plan:
    """The fastest data-parallel plan over one device group: all ``devices`` (default: every device),
    those of one machine, or those of one device type (ties: fewer devices).

    The one constructor that simulates: the candidates are judged by the shared simulator, a plan
    that does not fit costing its makespan times ``1 + 10 (1 + overflow)`` (the searches' OOM cost).
    On heterogeneous clusters, dropping slow devices or slow links is a move no single-op change makes.
    ``cost_model`` is the judge's (default: :class:`~placement_rl.sim.CostModel`'s defaults).
    """
    from placement_rl.sim import oom_cost, simulate

    groups = device_groups(topology, _device_names(topology, devices))
    plans = [data_parallel(graph, topology, list(g)) for g in groups]
    results = [simulate(graph, topology, p, cost_model) for p in plans]
    costs = [oom_cost(r.makespan_s, r.peak_memory_bytes, r.memory_capacity_bytes, 10.0) for r in results]
    best = min(range(len(plans)), key=lambda k: (costs[k], len(plans[k].devices_used())))
    return Plan(graph.name, dict(plans[best].configs), name="subset_data_parallel", metadata=plans[best].metadata)
