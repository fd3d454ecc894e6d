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
* :func:`megatron`: Megatron-LM's tensor, pipeline and data parallelism, the tensor-parallel regions
  found from the graph (:func:`tensor_parallel_regions`), with full or selective recomputation.
* :func:`tag_strategy` / :func:`tag_group_config`: TAG's placement and replication options on op groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from placement_rl.errors import UnknownNameError
from placement_rl.graph import Op, OpGraph, ParallelDim
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
    zero_eligible,
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
    if isinstance(devices, (str, bytes)):  # list("m0/gpu0") would be its letters
        raise ValueError(f"devices = {devices!r}; expected a list of device names (one device: [{devices!r}])")
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
    cuts: Sequence[int] | None = None,
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
        cuts: where the chunks start instead of the balanced cut: the index (in graph order) of the
            first op of every chunk but the first, ``chunks - 1`` increasing indices in ``(0, num_ops)``.

    Returns:
        A plan named ``pipeline`` whose metadata holds the ``groups`` and each chunk's op count
        (``chunk_ops``, in graph order); it passes :meth:`Plan.validate`.

    Raises:
        ValueError: naming the value: a stage count below 1 or above what the devices allow, more
            chunks than ops, an unknown, repeated or shared device, an unknown schedule, micro-batches
            that are not a positive integer or do not divide an op's batch, virtual stages without
            ``interleaved`` or with a single device group.
    """
    _check_schedule(graph, schedule, micro_batches, virtual_stages)
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
    if cuts is None:
        bounds = _nonempty_cuts(_balanced_stages(work, speed), num_chunks)
    else:
        bounds = [0, *(int(c) for c in cuts), graph.num_ops]
        if len(bounds) != num_chunks + 1 or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(
                f"cuts = {list(cuts)}; expected {num_chunks - 1} increasing op indices in (0, {graph.num_ops})"
            )
    configs: dict[str, OpConfig] = {}
    for k in range(num_chunks):
        group = groups[k % len(groups)]
        for op in graph.ops[bounds[k] : bounds[k + 1]]:
            configs[op.name] = _stage_config(op, group, micro_batches)
    plan = Plan(
        graph.name,
        configs,
        name="pipeline",
        metadata={
            "groups": [list(g) for g in groups],
            "chunk_ops": [bounds[k + 1] - bounds[k] for k in range(num_chunks)],
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
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage {stage!r}; expected one of {list(ZERO_STAGES)}")
    configs: dict[str, OpConfig] = {}
    for name, cfg in plan.configs.items():
        op = graph.op(name)
        configs[name] = cfg.replace(zero=int(stage)) if zero_eligible(op, cfg) else cfg
    return dataclasses.replace(plan, configs=configs, metadata={**plan.metadata, "zero": int(stage)})


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
    wanted = None if op_types is None else _op_types(graph, "op_types", op_types, "None for every op")
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


# ------------------------------------------------------------------------------------ Megatron-LM
#: ``recompute`` of :func:`megatron`: none, Megatron-LM's full (per-layer) or selective recomputation,
#: or the op types to recompute.
MegatronRecompute = Literal["full", "selective"] | Collection[str] | None
#: The named recomputation policies of :func:`megatron`.
MEGATRON_RECOMPUTE: tuple[str, ...] = ("full", "selective")


@dataclass(frozen=True)
class TensorParallelRegion:
    """One region of Megatron-LM's tensor parallelism (Shoeybi et al. 2019, sec. 3): column-parallel
    layers, the ops their split output flows through, and the row-parallel layers whose partial sums end it.

    Attributes:
        splits: ``(op name, parallel dimension name)`` for every op of the region, in graph order: the
            dimension split ``degree`` ways (``channel`` for a column-parallel layer, ``in_channel``
            for a row-parallel one, ``heads`` for attention, ``dim<a>`` for a view, an element-wise
            op's own name of the dimension on that axis, e.g. a GELU's ``channel``).
        column: the column-parallel layers (split along their output features), in graph order.
        row: the row-parallel layers (split along their input features), in graph order.
    """

    splits: tuple[tuple[str, str], ...]
    column: tuple[str, ...]
    row: tuple[str, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)


def _edge_axes(graph: OpGraph, e: int) -> tuple[int, ...] | None:
    """For each axis of tensor ``e``'s consumer's output, the tensor axis it follows (-1: none);
    ``None`` when the layouts are unrelated. The simulator's rule (``SimContext._build_edges``): a
    tensor's ``dst_axes`` when the importer recorded them, else the same axes when the ranks and
    plain sample axes agree."""
    t = graph.tensors[e]
    src, dst = graph.op(t.src), graph.op(t.dst)
    if t.src_output and len(src.output_shapes[t.src_output]) != len(src.output_shapes[0]):
        return None  # an output whose box the producer's split does not describe
    if t.dst_axes:
        return t.dst_axes
    rank = len(t.shape)
    if rank == len(dst.output_shapes[0]) and src.plain_sample_axis == dst.plain_sample_axis >= 0:
        return tuple(range(rank))
    return None


def _split_dim(op: Op, axis: int, degree: int) -> ParallelDim | None:
    """``op``'s non-reduction, non-sample parallel dimension on output ``axis`` that ``degree`` divides."""
    return next(
        (
            d
            for d in op.parallel_dims
            if d.axis == axis and not d.reduction and d.kind != "sample" and d.size % degree == 0
        ),
        None,
    )


def _column_dim(op: Op, degree: int) -> ParallelDim | None:
    """The output-feature dimension of a linear layer with parameters (a column-parallel candidate),
    when ``degree`` divides it."""
    if _row_dim(op, 1) is None:  # a linear layer: parameters and input features to split
        return None
    last = len(op.output_shapes[0]) - 1
    return next(
        (
            d
            for d in op.parallel_dims
            if d.kind == "parameter" and not d.reduction and d.axis == last and d.size % degree == 0
        ),
        None,
    )


def _row_dim(op: Op, degree: int) -> ParallelDim | None:
    """The input-feature (reduction) dimension of a linear layer with parameters (a row-parallel candidate)."""
    kind = OP_KINDS.get(op.op_type)
    if kind is None or kind.family != "matmul" or (op.param_bytes <= 0 and op.param_key is None):
        return None
    return next((d for d in op.parallel_dims if d.kind == "parameter" and d.reduction and d.size % degree == 0), None)


class _Regions:
    """One pass of the region search (:func:`tensor_parallel_regions`) with some candidates barred."""

    def __init__(self, graph: OpGraph, degree: int, barred: set[int]) -> None:
        self.graph = graph
        self.degree = degree
        self.axis: dict[int, int] = {}  # op -> the output axis it splits (ops whose output is split)
        self.dim: dict[int, str] = {}  # op -> the dimension it splits (every op of a region)
        self.column: set[int] = set()
        self.row: set[int] = set()
        self.parent: dict[int, int] = {}  # union-find over the regions' column-parallel starts
        self.root_of: dict[int, int] = {}
        self.failed: set[int] = set()
        for j, op in enumerate(graph.ops):
            self._visit(j, op, barred)
        for i in self.axis:  # a region ends in row-parallel layers, not in an output nobody reads
            if not graph.successors[i]:
                self.failed.add(self.find(self.root_of[i]))

    def find(self, r: int) -> int:
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def _visit(self, j: int, op: Op, barred: set[int]) -> None:
        g = self.graph
        ins = g.in_tensors[j]
        split_in = [e for e in ins if g.index(g.tensors[e].src) in self.axis]
        if not split_in:
            col = _column_dim(op, self.degree)
            if col is not None and j not in barred:
                self.axis[j], self.dim[j] = col.axis, col.name
                self.column.add(j)
                self.parent[j] = self.root_of[j] = j
            return
        roots = {self.find(self.root_of[g.index(g.tensors[e].src)]) for e in split_in}
        root = min(roots)
        for r in roots:
            self.parent[r] = root
        accepted = self._accept(j, op, ins, split_in)
        if accepted is None:
            self.failed.add(root)
            return
        self.root_of[j] = root
        out_axis, name = accepted
        self.dim[j] = name
        if out_axis < 0:
            self.row.add(j)
        else:
            self.axis[j] = out_axis

    def _accept(self, j: int, op: Op, ins: tuple[int, ...], split_in: list[int]) -> tuple[int, str] | None:
        """How op ``j`` continues the split of its inputs: ``(output axis, dimension)``, ``(-1, dimension)``
        for a row-parallel layer that ends the region, ``None`` when it cannot (the region fails)."""
        g = self.graph
        src_axis = {e: self.axis[g.index(g.tensors[e].src)] for e in split_in}
        row = _row_dim(op, self.degree)
        if row is not None:
            # reading the split on the input features of its first input: Megatron's row-parallel layer
            if split_in == [ins[0]] and src_axis[ins[0]] == row.axis == len(g.tensors[ins[0]].shape) - 1:
                return -1, row.name
            return None
        kind = OP_KINDS.get(op.op_type)
        if kind is None or not op.output_shapes:
            return None
        rank = len(op.output_shapes[0])
        out_axes = set()
        for e in split_in:
            amap = _edge_axes(g, e)
            if amap is None:
                return None
            found = [a for a, s in enumerate(amap) if s == src_axis[e]]
            if len(found) != 1:
                return None
            out_axes.add(found[0])
        if len(out_axes) != 1:
            return None
        (out_axis,) = out_axes
        if kind.family == "attention":
            # heads are independent: q, k and v all split along their heads (the third axis from the end)
            if op.param_bytes > 0 or len(ins) < 3 or out_axis != rank - 3 or any(e not in split_in for e in ins[:3]):
                return None
        elif kind.family in ("elementwise", "activation"):
            if kind.reduces or any(len(g.tensors[e].shape) != rank for e in split_in):
                return None
        elif kind.family not in ("view", "copy"):
            return None
        dim = _split_dim(op, out_axis, self.degree)
        if dim is None:
            return None
        for e in ins:  # an input carrying the axis must be split alike (broadcast tables are read whole)
            if e not in split_in:
                amap = _edge_axes(g, e)
                if amap is not None and out_axis < len(amap) and amap[out_axis] >= 0:
                    return None
        return out_axis, dim.name

    def regions(self) -> list[TensorParallelRegion]:
        members: dict[int, list[int]] = {}
        for j in self.dim:
            members.setdefault(self.find(self.root_of[j]), []).append(j)
        ops = self.graph.ops
        found = []
        for root in sorted(members):
            idx = sorted(members[root])
            found.append(
                TensorParallelRegion(
                    splits=tuple((ops[j].name, self.dim[j]) for j in idx),
                    column=tuple(ops[j].name for j in idx if j in self.column),
                    row=tuple(ops[j].name for j in idx if j in self.row),
                )
            )
        return found


def tensor_parallel_regions(graph: OpGraph, degree: int) -> list[TensorParallelRegion]:
    """Megatron-LM's tensor-parallel regions of any graph, found from the ops' parallel dimensions
    and the tensors' axis maps (no op names).

    Every linear layer with parameters is tried as column-parallel (split ``degree`` ways along its
    output features), and its split is followed forward: a view or copy maps the split axis through
    the axes its input edge records (:attr:`~placement_rl.graph.Tensor.dst_axes`) and needs a parallel
    dimension there; an attention op needs q, k and v all split along their heads (the third axis from
    the end) and splits its ``heads``; an element-wise op or activation keeps the axis where it has a
    dimension and every input carrying the axis is split alike (inputs without it, such as broadcast
    rotary tables, are read whole); a linear layer reading the split along its input features is
    row-parallel (its ``in_channel``) and ends the region. Regions meeting at an op merge (Llama's
    q, k and v projections at attention; the SwiGLU's gate and up projections at their product). A
    region reaching anything else (a norm, a loss, a linear layer reading another axis, an op whose
    other input is not split alike, an output nobody reads) fails: its column-parallel layers are
    barred and the search runs again until no region fails, so a failed region's ops stay unsplit.

    Args:
        graph: the graph.
        degree: the tensor-parallel degree every split dimension must be divisible by.

    Returns:
        The regions, in graph order of their first op.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"degree = {degree!r}; expected a positive integer")
    barred: set[int] = set()
    while True:
        found = _Regions(graph, degree, barred)
        if not found.failed:
            return found.regions()
        barred |= {j for j in found.column if found.find(found.root_of[j]) in found.failed}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_schedule(graph: OpGraph, schedule: str, micro_batches: int, virtual_stages: int) -> None:
    """A known schedule, and micro-batches and virtual stages that are integers in range."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}; expected one of {list(SCHEDULES)}")
    for key, value, top in (
        ("micro_batches", micro_batches, MAX_MICRO_BATCHES),
        ("virtual_stages", virtual_stages, graph.num_ops),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{key} = {value!r}; expected an integer from 1 to {top:,}")


def _check_megatron(
    graph: OpGraph,
    topology: DeviceTopology,
    tp: int,
    pp: int,
    dp: int,
    micro_batches: int,
    schedule: str,
    virtual_stages: int,
    zero_stage: int,
    devices: Sequence[str] | None,
) -> list[str]:
    """The checked arguments of :func:`megatron`; returns its devices."""
    for key, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} = {value!r}; expected a positive integer")
    _check_schedule(graph, schedule, micro_batches, virtual_stages)
    if virtual_stages > 1 and (schedule != "interleaved" or pp < 2):
        raise ValueError(
            f"virtual_stages = {virtual_stages} with schedule {schedule!r} and pp = {pp}; virtual stages need "
            "schedule 'interleaved' and pp >= 2"
        )
    if isinstance(zero_stage, bool) or not isinstance(zero_stage, (int, np.integer)) or zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage = {zero_stage!r}; expected one of {list(ZERO_STAGES)}")
    need = tp * pp * dp
    if devices is None:
        names = [d.name for d in topology.devices]
        if need > len(names):
            raise ValueError(
                f"tp * pp * dp = {tp} * {pp} * {dp} = {need} devices; topology {topology.name!r} has "
                f"{len(names)}; expected a product of at most {len(names)}"
            )
        names = names[:need]
    else:
        names = _device_names(topology, devices)
        repeated = sorted(n for n, count in Counter(names).items() if count > 1)
        if repeated:
            raise ValueError(f"devices name {repeated} more than once; expected each device once")
        if need != len(names):
            raise ValueError(
                f"tp * pp * dp = {tp} * {pp} * {dp} = {need}, but {len(names)} device(s) are given; expected the "
                f"product to equal the device count"
            )
    per_machine = max(len(group) for group in topology.machines().values())
    if tp > per_machine:
        raise ValueError(
            f"tp = {tp} exceeds the {per_machine} GPUs per machine of topology {topology.name!r}; tensor "
            f"parallelism stays inside a machine: expected tp <= {per_machine}"
        )
    for k in range(0, need, tp):
        group = names[k : k + tp]
        machines = sorted({topology.device(n).machine for n in group})
        if len(machines) > 1:
            raise ValueError(
                f"tp = {tp}: the tensor-parallel group {group} spans machines {machines}; expected tp devices "
                "of one machine side by side (give devices in machine order, or a smaller tp)"
            )
    batch = graph.batch_size
    if batch is not None and batch % (micro_batches * dp):
        raise ValueError(
            f"micro_batches * dp = {micro_batches} * {dp} = {micro_batches * dp} does not divide the batch of "
            f"{batch}; expected a divisor (each data-parallel replica takes an equal share of every micro-batch)"
        )
    return names


def light_cuts(graph: OpGraph, chunks: int, shares: Sequence[float] | None = None) -> list[int]:
    """Where ``chunks`` pipeline chunks of equal forward+backward FLOPs (or FLOPs in proportion to
    ``shares``, ``(chunks,)`` positive, e.g. the stages' FLOP/s) start, each cut moved (within a
    quarter of the smallest chunk's work) to where the fewest tensors cross: ``[0, c_1, ...,
    num_ops]``; pass ``[1:-1]`` to :func:`pipeline`'s ``cuts``. Raises ``ValueError`` for more
    chunks than ops or bad shares."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= graph.num_ops:
        raise ValueError(f"chunks = {chunks!r}; expected 1 to {graph.num_ops} (the ops of {graph.name!r})")
    if shares is not None:
        weights = np.asarray(shares, dtype=np.float64)
        if weights.shape != (chunks,) or not (np.isfinite(weights).all() and (weights > 0).all()):
            raise ValueError(f"shares = {list(shares)!r}; expected {chunks} finite numbers > 0, one per chunk")
    return _megatron_cuts(graph, (), chunks, shares)


def _megatron_cuts(
    graph: OpGraph, regions: Sequence[TensorParallelRegion], chunks: int, shares: Sequence[float] | None = None
) -> list[int]:
    """Cut positions ``0 = c_0 < ... < c_K = num_ops`` of ``K = chunks`` chunks balanced by
    forward+backward FLOPs (in proportion to ``shares`` when given), cutting only outside
    tensor-parallel regions; near each balanced target (within a quarter of the smallest chunk's
    share of the work), where the fewest tensors cross (the residual stream between layers rather
    than a block's inside)."""
    n = graph.num_ops
    if chunks == 1:
        return [0, n]
    inside = np.zeros(n + 1, np.int64)  # cut c (ops < c | ops >= c) lies inside a region
    for region in regions:
        idx = [graph.index(name) for name in region.ops]
        inside[min(idx) + 1 : max(idx) + 1] = 1
    last_use: dict[tuple[str, int], int] = {}
    for t in graph.tensors:
        key = (t.src, t.src_output)
        last_use[key] = max(last_use.get(key, -1), graph.index(t.dst))
    crossing = np.zeros(n + 2, np.int64)  # tensors live across cut c
    for (src, _), last in last_use.items():
        crossing[graph.index(src) + 1] += 1
        crossing[last + 1] -= 1
    crossing = np.cumsum(crossing)[: n + 1]
    allowed = [c for c in range(1, n) if not inside[c]]
    if len(allowed) < chunks - 1:
        raise ValueError(
            f"{chunks} pipeline chunks of graph {graph.name!r}: only {len(allowed)} cut(s) lie outside its "
            f"tensor-parallel regions; expected pp * virtual_stages <= {len(allowed) + 1}"
        )
    work = graph.arrays.forward_flops + graph.arrays.backward_flops
    cum = np.concatenate(([0.0], np.cumsum(work)))
    total = float(cum[-1])
    weights = np.ones(chunks) if shares is None else np.asarray(shares, dtype=np.float64)
    bounds = np.cumsum(weights) / weights.sum() * total
    slack = total * float(weights.min() / weights.sum()) / 4  # how far a cut may move to cross fewer tensors
    cuts = [0]
    start = 0  # the first allowed cut the next cut may use
    for k in range(1, chunks):
        target = total * k / chunks if shares is None else float(bounds[k - 1])
        stop = len(allowed) - (chunks - 1 - k)  # leave one allowed cut to every later cut
        off = {q: abs(float(cum[allowed[q]]) - target) for q in range(start, stop)}
        near = min(off.values()) + slack
        best = min((q for q in off if off[q] <= near), key=lambda q: (int(crossing[allowed[q]]), off[q], q))
        cuts.append(allowed[best])
        start = best + 1
    cuts.append(n)
    return cuts


def _task_devices(
    op: Op, degrees: Mapping[str, int], group: Sequence[str], dp: int, tp: int, tp_dim: str | None
) -> list[str]:
    """The device of each task of ``op`` under ``degrees`` on a stage's ``group`` (DP replica ``d``, TP
    rank ``r`` on ``group[d * tp + r]``): partitions row-major over ``op.parallel_dims``, replicas
    taking the unsplit one of the two (or both: DP-major)."""
    split = [(d.name, degrees[d.name]) for d in op.parallel_dims if degrees.get(d.name, 1) > 1]
    sample = op.sample_dim.name if op.sample_dim is not None else None
    partitions = math.prod(deg for _, deg in split)
    replicas = len(group) // partitions
    out = []
    for task in range(len(group)):
        part, rep = divmod(task, replicas)
        index = dict(zip([n for n, _ in split], np.unravel_index(part, [deg for _, deg in split]), strict=True))
        tp_split = tp_dim is not None and tp_dim in index
        d_rep, r_rep = divmod(rep, 1 if tp_split else tp)  # the replica's DP and TP positions
        d = int(index[sample]) if sample in index else d_rep
        r = int(index[tp_dim]) if tp_dim is not None and tp_split else r_rep
        out.append(group[d * tp + r])
    return out


def _residual_adds(graph: OpGraph) -> set[int]:
    """The residual stream's adds: ``add`` ops that branch (their output read twice: the block and the
    skip) or read a branching tensor (the skip connection)."""
    found = set()
    for j, op in enumerate(graph.ops):
        if op.op_type != "add":
            continue
        if len(graph.successors[j]) > 1 or any(len(graph.successors[i]) > 1 for i in graph.predecessors[j]):
            found.add(j)
    return found


def _selective_ops(graph: OpGraph) -> set[int]:
    """Attention ops and the views and copies around them (Korthikanti et al.'s selective recomputation)."""
    shaping = ("view", "copy")
    found: set[int] = set()
    for j, op in enumerate(graph.ops):
        kind = OP_KINDS.get(op.op_type)
        if kind is None or kind.family != "attention":
            continue
        found.add(j)
        for neighbours in (graph.predecessors, graph.successors):
            frontier = list(neighbours[j])
            while frontier:
                i = frontier.pop()
                k = OP_KINDS.get(graph.ops[i].op_type)
                if i not in found and k is not None and k.family in shaping:
                    found.add(i)
                    frontier.extend(neighbours[i])
    return found


def _recompute_ops(graph: OpGraph, recompute: MegatronRecompute, chunk_of: np.ndarray) -> tuple[set[int], Any]:
    """The ops :func:`megatron` recomputes, and the policy's label for the plan's metadata."""
    if recompute is None:
        return set(), None
    if isinstance(recompute, str):
        if recompute == "selective":
            return _selective_ops(graph), "selective"
        if recompute != "full":
            raise ValueError(
                f"recompute = {recompute!r}; expected None, one of {list(MEGATRON_RECOMPUTE)}, or a collection of "
                f"op types (one op type: [{recompute!r}])"
            )
        keep = _residual_adds(graph)
        for t in graph.tensors:  # outputs that cross a stage boundary are kept (sent, not recomputed)
            i, j = graph.index(t.src), graph.index(t.dst)
            if chunk_of[i] != chunk_of[j]:
                keep.add(i)
        inputs = {j for j, op in enumerate(graph.ops) if not graph.predecessors[j]}
        return set(range(graph.num_ops)) - keep - inputs, "full"
    wanted = _op_types(graph, "recompute", recompute, f"None or one of {list(MEGATRON_RECOMPUTE)}", single=False)
    return {j for j, op in enumerate(graph.ops) if op.op_type in wanted}, sorted(wanted)


def _op_types(graph: OpGraph, key: str, value: object, otherwise: str, *, single: bool = True) -> frozenset[str]:
    """The op types of a ``recompute`` argument: one type (a string, with ``single``) or a collection of
    types, each in the taxonomy (:data:`~placement_rl.ops.OP_KINDS`) or the graph.

    Raises:
        ValueError: naming ``key`` and the value: a value of another type (a number, a mapping, bytes),
            an item that is not a string, an empty collection, or an unknown op type.
    """
    expected = ("an op type or " if single else "") + f"a collection of op type names, or {otherwise}"
    if isinstance(value, str) and single:
        items: tuple[object, ...] = (value,)
    elif isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Collection):
        raise ValueError(f"{key} = {value!r}; expected {expected}")
    else:
        items = tuple(value)
    bad = [item for item in items if not isinstance(item, str)]
    if bad:
        raise ValueError(f"{key} = {value!r}: {bad[0]!r} is not an op type name; expected {expected}")
    wanted = frozenset(str(item) for item in items)
    if not wanted:
        raise ValueError(f"{key} is empty; expected at least one op type, or {otherwise}")
    known = set(OP_KINDS) | {op.op_type for op in graph.ops}
    for op_type in sorted(wanted):
        if op_type not in known:
            raise UnknownNameError("op type (recompute)", op_type, known)
    return wanted


def megatron(
    graph: OpGraph,
    topology: DeviceTopology,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    micro_batches: int = 1,
    schedule: Schedule = "1f1b",
    virtual_stages: int = 1,
    recompute: MegatronRecompute = None,
    zero_stage: int = 0,
    devices: Sequence[str] | None = None,
) -> Plan:
    """Megatron-LM's 3D parallelism (Narayanan et al. 2021): tensor, pipeline and data parallelism.

    * **Tensor parallelism** (Shoeybi et al. 2019): the regions of :func:`tensor_parallel_regions`
      split ``tp`` ways on each stage's tensor-parallel group: column-parallel layers along their
      output features, attention along its heads, the views between along the matching axis, row-
      parallel layers along their input features (their partial sums all-reduced forward, the column-
      parallel layers' input gradients backward, as the simulator's ``partial_all_reduce``). Every
      other op runs replicated on the group (``tp`` replicas).
    * **Data parallelism**: with ``dp > 1`` every op is also split along its sample dimension ``dp``
      ways and gradients are all-reduced over the data-parallel ranks. The ops replicated on the
      tensor-parallel ranks have sync ``duplicate`` (the ranks compute the same gradients; the batch
      slices' gradients are all-reduced once per rank, and a column-parallel layer's input gradient
      is all-reduced over the ranks, as Megatron-LM does).
    * **Pipeline parallelism**: the ops in graph order cut into ``pp`` stages balanced by forward+
      backward FLOPs, cutting outside tensor-parallel regions, where the fewest tensors cross (between
      layers); with ``schedule="interleaved"`` and ``virtual_stages = v``, ``pp * v`` chunks, chunk ``c``
      on stage group ``c % pp``.

    Devices are ranked as Megatron-LM ranks them: tensor-parallel fastest (inside one machine), then
    data-parallel, then pipeline: stage ``s`` runs on ``devices[s*dp*tp : (s+1)*dp*tp]`` and in a stage
    DP replica ``d``'s TP rank ``r`` is device ``d*tp + r``, so a layer's tensor-parallel traffic stays in
    its machine and a stage sends no activations between its own devices.

    Args:
        graph: a transformer graph from the importer (linear layers with ``in_channel``, attention with
            ``heads``, views with their axis maps); any graph works with ``tp = 1``.
        topology: the cluster.
        tp: tensor-parallel degree (at most the GPUs of a machine).
        pp: pipeline stages.
        dp: data-parallel replicas.
        micro_batches: micro-batches per iteration; ``micro_batches * dp`` must divide the batch.
        schedule: ``gpipe``, ``1f1b`` or ``interleaved``.
        virtual_stages: chunks per stage group (``interleaved`` with ``pp >= 2`` only when above 1).
        recompute: ``None``; ``"full"``: every op but the residual adds and the outputs sent to another
            stage (Megatron-LM's per-layer checkpointing: layer inputs kept, the rest recomputed);
            ``"selective"``: attention and the views around it (Korthikanti et al. 2022); or a
            collection of op types.
        zero_stage: ZeRO over the data-parallel replicas of each parameter shard (:func:`zero`; 1 is
            Megatron-LM's distributed optimizer); 0: none.
        devices: ``tp * pp * dp`` devices in rank order (default: the topology's first ``tp * pp * dp``).

    Returns:
        A plan named ``megatron`` that passes :meth:`Plan.validate`, its metadata holding ``tp``,
        ``pp``, ``dp``, ``tp_ops`` (ops split ``tp`` ways), ``tp_regions``, ``column_parallel`` and
        ``row_parallel`` (layer counts), ``micro_batches``, ``schedule``, ``virtual_stages``,
        ``recompute``, ``zero``, ``chunk_ops`` (ops per chunk in graph order) and ``devices``.

    Raises:
        ValueError: naming the value and what is allowed: a degree below 1; ``tp * pp * dp`` other
            than the devices given or above the topology's; ``tp`` above a machine's GPUs or a
            tensor-parallel group across machines; an unknown ZeRO stage; ``tp > 1`` splitting no
            region (it must divide the heads and features: the message lists the degrees that do);
            ``micro_batches * dp`` not dividing the batch; more chunks than cuts outside the
            regions; an unknown schedule or
            recomputation, virtual stages without ``interleaved``.
    """
    names = _check_megatron(graph, topology, tp, pp, dp, micro_batches, schedule, virtual_stages, zero_stage, devices)
    regions = tensor_parallel_regions(graph, tp) if tp > 1 else []
    if tp > 1 and not regions:
        per_machine = max(len(group) for group in topology.machines().values())
        splitting = [d for d in _divisors(per_machine)[1:] if tensor_parallel_regions(graph, d)]
        raise ValueError(
            f"tp = {tp} splits no tensor-parallel region of graph {graph.name!r}: no linear layer's features, "
            f"attention heads and views between divide by {tp}; expected tp = 1"
            + (f" or one of {splitting}" if splitting else " (no degree up to a machine's GPUs splits one)")
        )
    split_of = {graph.index(name): dim for region in regions for name, dim in region.splits}
    chunks = pp * virtual_stages
    cuts = _megatron_cuts(graph, regions, chunks)
    chunk_of = np.zeros(graph.num_ops, np.int64)
    for k in range(chunks):
        chunk_of[cuts[k] : cuts[k + 1]] = k
    recomputed, label = _recompute_ops(graph, recompute, chunk_of)
    stage_size = dp * tp
    groups = [names[s * stage_size : (s + 1) * stage_size] for s in range(pp)]
    configs: dict[str, OpConfig] = {}
    for j, op in enumerate(graph.ops):
        group = groups[int(chunk_of[j]) % pp]
        tp_dim = split_of.get(j)
        degrees: dict[str, int] = {tp_dim: tp} if tp_dim is not None else {}
        sample = op.sample_dim
        if dp > 1 and sample is not None and sample.size % (dp * micro_batches) == 0:
            degrees[sample.name] = dp
        # replicated on the tensor-parallel ranks: identical there, its batch slices all-reduced over
        # data parallelism (an op without a batch slice all-reduces over the whole stage)
        sliced = sample is not None and sample.name in degrees
        sync: SyncMode = "duplicate" if tp_dim is None and (dp == 1 or (tp > 1 and sliced)) else "all_reduce"
        configs[op.name] = OpConfig.make(
            _task_devices(op, degrees, group, dp, tp, tp_dim), degrees, sync, recompute=j in recomputed
        )
    plan = Plan(
        graph.name,
        configs,
        name="megatron",
        metadata={
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "tp_ops": len(split_of),
            "tp_regions": len(regions),
            "column_parallel": sum(len(r.column) for r in regions),
            "row_parallel": sum(len(r.row) for r in regions),
            "micro_batches": micro_batches,
            "schedule": schedule,
            "virtual_stages": virtual_stages,
            "recompute": label,
            "zero": zero_stage,
            "chunk_ops": [cuts[k + 1] - cuts[k] for k in range(chunks)],
            "devices": names,
        },
        micro_batches=micro_batches,
        schedule=schedule,
        virtual_stages=virtual_stages,
    )
    if zero_stage:
        plan = zero(graph, plan, zero_stage)
    plan.validate(graph, topology)
    return plan
