"""Identical data-parallel replicas simulated once.

A plan whose ops split the batch ``dp`` ways the same way (every op's sample degree a multiple of
``dp``, its tasks replica-major: the first ``1 / dp`` of each op's tasks are replica 0's, the next
replica 1's, ... as :func:`placement_rl.plan.megatron` lays them out) trains ``dp`` copies of one
smaller plan, which meet only in the gradient all-reduces. :func:`simulate_replica` simulates one
copy, replica 0, on its share of the batch, with every gradient all-reduce spanning the same
devices of every replica (the simulator's ``peers``), as the whole plan's do, and reports the
whole plan: the other replicas' devices take replica 0's busy time and memory.

This is exact when the replicas do not share a link with each other except in those all-reduces
(each replica on its own machines and network ports, as on a rail-optimized DGX cluster, where
replica ``d``'s GPU ``r`` reaches the others' GPU ``r`` through its own NIC), and when no
replica's other traffic overlaps the all-reduces on their links (Megatron-LM all-reduces after the
pipeline's flush). ``tests/test_replicas.py`` compares it with the whole simulation. It divides the
tasks to simulate by ``dp``: Megatron-LM's 39B-parameter plan on 512 GPUs is 1.1 million tasks
instead of 36 million.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from placement_rl.graph import Op, OpGraph, Tensor
from placement_rl.plan.core import OpConfig, Plan
from placement_rl.sim.cost import CostModel
from placement_rl.sim.pipeline import check_batch_divides, scaled_op, scaled_tensor
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import DEFAULT_COST_MODEL, SimContext, Symmetry
from placement_rl.topology import DeviceTopology


def replica_graph(graph: OpGraph, dp: int) -> OpGraph:
    """One replica's graph: every op's sample dimension, FLOPs and activations ``1 / dp``.

    Raises:
        ValueError: when ``dp`` does not divide an op's sample dimension.
    """
    check_batch_divides(graph, dp, "data-parallel replicas")
    by_name = {op.name: op for op in graph.ops}
    ops = [scaled_op(op, dp, op.name) for op in graph.ops]
    tensors = [scaled_tensor(t, by_name[t.src], dp, t.src, t.dst) for t in graph.tensors]
    batch = graph.batch_size // dp if graph.batch_size is not None and graph.batch_size % dp == 0 else None
    return OpGraph(graph.name, ops, tensors, batch_size=batch, metadata={**graph.metadata, "replica_of": dp})


def _first_share(
    devices: tuple[str, ...], n: int, twins: dict[str, tuple[str, ...]], where: str, what: str
) -> tuple[str, ...]:
    """The first ``1 / n`` of an op's tasks' devices (copy 0's), recording each one's twins in the
    other ``n - 1`` copies (the tasks ``1 / n`` further on each) into ``twins``.

    Raises:
        ValueError: when a device's twins differ from those an earlier op gave it.
    """
    share = len(devices) // n
    mine = devices[:share]
    for t, device in enumerate(mine):
        theirs = tuple(devices[t + k * share] for k in range(1, n))
        if twins.setdefault(device, theirs) != theirs:
            raise ValueError(
                f"{where}: device {device!r}'s {what} are {list(theirs)} here but {list(twins[device])} for an "
                "earlier op; expected the same layout in every op"
            )
    return mine


def replica_plan(graph: OpGraph, plan: Plan, dp: int) -> tuple[Plan, dict[str, tuple[str, ...]]]:
    """Replica 0's plan and each of its devices' peers (the same position in replicas 1 .. dp - 1).

    Raises:
        ValueError: naming the op, when the plan is not ``dp`` alike replicas: an op whose sample
            degree ``dp`` does not divide, whose tasks do not split into ``dp`` replicas, a weighted
            split, a synchronization other than all-reduce or duplicate, or devices whose peers
            differ between ops.
    """
    configs: dict[str, OpConfig] = {}
    peers: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:
        cfg = plan[op.name]
        where = f"op {op.name!r}"
        degrees = cfg.degree_map
        sample = op.sample_dim
        degree = degrees.get(sample.name, 1) if sample is not None else 1
        if cfg.weights or cfg.sync not in ("all_reduce", "all_reduce_per_tensor", "duplicate"):
            raise ValueError(f"{where}: {cfg.sync!r} sync or weights; replicas are simulated for all-reduced plans")
        if len(cfg.devices) % dp or (sample is not None and degree % dp):
            raise ValueError(
                f"{where}: {len(cfg.devices)} task(s) with sample degree {degree} do not split into {dp} replicas "
                "(each replica computes its share of the batch)"
            )
        if (
            degree > 1
            and sample is not None
            and next(d.name for d in op.parallel_dims if degrees.get(d.name, 1) > 1) != sample.name
        ):
            raise ValueError(f"{where}: its batch is not its outermost split; replicas are not its first tasks")
        mine = _first_share(cfg.devices, dp, peers, where, "replicas")
        if sample is not None:
            degrees[sample.name] = degree // dp
        configs[op.name] = cfg.replace(devices=mine, degrees=tuple(sorted((k, v) for k, v in degrees.items() if v > 1)))
    others = {p for theirs in peers.values() for p in theirs}
    both = sorted(set(peers) & others)
    if both:
        raise ValueError(
            f"device {both[0]!r} is in replica 0 for some ops and in another replica for others; expected the "
            "same layout in every op"
        )
    return dataclasses.replace(plan, configs=configs), peers


def _tensor_parallel_dim(op: Op, cfg: OpConfig, tp: int) -> str | None:
    """The dimension ``op`` splits ``tp`` ways besides the batch (None: replicated on the ranks)."""
    sample = op.sample_dim.name if op.sample_dim is not None else None
    split = [name for name, degree in cfg.degrees if degree > 1 and name != sample]
    if not split:
        return None
    if len(split) != 1 or cfg.degree_map[split[0]] != tp:
        raise ValueError(
            f"op {op.name!r}: degrees {cfg.degree_map}; expected one split of {tp} tensor-parallel ranks besides "
            "the batch (or none)"
        )
    return split[0]


def _rank_op(op: Op, dim_name: str, tp: int) -> Op:
    """One tensor-parallel rank's part of ``op``: ``1 / tp`` of the dimension, its work and, for a
    parameter dimension, its parameters; a reduction dimension keeps the (partial) output whole."""
    dim = op.parallel_dim(dim_name)
    shapes = op.output_shapes
    if not dim.reduction:
        full = shapes[0][dim.axis]
        shapes = tuple(
            tuple(n // tp if a == dim.axis else n for a, n in enumerate(s))
            if len(s) > dim.axis and s[dim.axis] == full
            else s
            for s in shapes
        )
    dims = tuple(dataclasses.replace(d, size=d.size // tp) if d.name == dim_name else d for d in op.parallel_dims)
    params = op.param_bytes // tp if dim.kind == "parameter" else op.param_bytes
    return dataclasses.replace(
        op,
        output_shapes=shapes,
        forward_flops=op.forward_flops / tp,
        backward_flops=op.backward_flops / tp,
        param_bytes=params,
        bytes_read=op.bytes_read // tp,
        bytes_written=op.bytes_written // tp,  # as the whole plan's simulation divides a partial output
        parallel_dims=dims,
    )


def rank_plan(graph: OpGraph, plan: Plan, tp: int) -> tuple[OpGraph, Plan, dict[str, tuple[str, ...]], dict[str, str]]:
    """Tensor-parallel rank 0 of every group: its graph (each split op ``1 / tp`` of itself), its plan,
    each of its devices' other ranks, and each split op's split dimension.

    Raises:
        ValueError: naming the op, when the ranks are not alike: an op split other than ``tp`` ways
            besides the batch, whose tasks do not split into ``tp`` ranks, or devices whose ranks differ.
    """
    by_name = {op.name: op for op in graph.ops}
    configs: dict[str, OpConfig] = {}
    ranks: dict[str, tuple[str, ...]] = {}
    split_of: dict[str, str] = {}
    ops = []
    for op in graph.ops:
        cfg = plan[op.name]
        dim = _tensor_parallel_dim(op, cfg, tp)
        if len(cfg.devices) % tp:
            raise ValueError(f"op {op.name!r}: {len(cfg.devices)} task(s) do not split into {tp} tensor-parallel ranks")
        mine = _first_share(cfg.devices, tp, ranks, f"op {op.name!r}", "tensor-parallel ranks")
        if dim is None:
            configs[op.name] = cfg.replace(devices=mine)
            ops.append(op)
            continue
        split_of[op.name] = dim
        degrees = tuple((k, v) for k, v in cfg.degrees if k != dim)
        configs[op.name] = cfg.replace(devices=mine, degrees=degrees)
        ops.append(_rank_op(op, dim, tp))
    tensors = []
    for tensor in graph.tensors:
        shape, num_bytes = tensor.shape, tensor.num_bytes
        dim_name = split_of.get(tensor.src)
        if dim_name is not None:
            pdim = by_name[tensor.src].parallel_dim(dim_name)
            full = by_name[tensor.src].output_shapes[0][pdim.axis] if not pdim.reduction else None
            if full is not None and len(shape) > pdim.axis and shape[pdim.axis] == full:
                shape = tuple(n // tp if a == pdim.axis else n for a, n in enumerate(shape))
                num_bytes //= tp
        tensors.append(Tensor(tensor.src, tensor.dst, shape, num_bytes, tensor.src_output, tensor.dst_axes))
    small = OpGraph(graph.name, ops, tensors, batch_size=graph.batch_size, metadata=graph.metadata)
    return small, dataclasses.replace(plan, configs=configs), ranks, split_of


def simulate_replica(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    dp: int,
    cost_model: CostModel | None = None,
    *,
    tp: int = 1,
) -> SimResult:
    """Simulate ``plan`` of ``dp`` identical data-parallel replicas by simulating replica 0, and with
    ``tp > 1`` only tensor-parallel rank 0 of each group (see the module docstring); the result covers
    every device of the plan.

    Raises:
        ValueError: when the plan is not ``dp`` alike replicas of ``tp`` alike ranks (:func:`replica_plan`,
            :func:`rank_plan`) or is invalid.
    """
    plan.validate(graph, topology)
    if dp == 1 and tp == 1:
        return SimContext(graph, topology, cost_model).simulate(plan, validate=False)
    small, mine = graph, plan
    peers: dict[str, tuple[str, ...]] = {}
    if dp > 1:
        small = replica_graph(graph, dp)
        mine, peers = replica_plan(graph, plan, dp)
    ranks: dict[str, tuple[str, ...]] = {}
    split_of: dict[str, str] = {}
    if tp > 1:
        small, mine, ranks, split_of = rank_plan(small, mine, tp)
    index = {d.name: i for i, d in enumerate(topology.devices)}
    scale = []
    for op in graph.ops:
        factor = dp if op.sample_dim is not None else 1
        scale.append(float(factor * (tp if op.name in split_of else 1)))
    kinds = {name: graph.op(name).parallel_dim(dim) for name, dim in split_of.items()}
    symmetry = Symmetry(
        {index[d]: tuple(index[p] for p in ps) for d, ps in peers.items()},
        {index[d]: tuple(index[p] for p in ps) for d, ps in ranks.items()},
        graph,
        tuple(scale),
        frozenset(graph.index(n) for n, d in kinds.items() if d.reduction and d.kind == "parameter"),
        frozenset(graph.index(n) for n, d in kinds.items() if not d.reduction and d.kind == "parameter"),
        frozenset(graph.index(n) for n in split_of),
    )
    ctx = SimContext(small, topology, cost_model or DEFAULT_COST_MODEL, symmetry)
    result = ctx.simulate(mine, validate=False)  # the whole plan was validated; ZeRO counts all replicas
    busy = result.busy_s.copy()
    peak = result.peak_memory_bytes.copy()
    simulated = ranks if tp > 1 else {d: () for d in peers}
    for device, others in simulated.items():  # every rank and every replica as rank 0 of replica 0
        for rank in (device, *others):
            for twin in (rank, *peers.get(rank, ())):
                busy[index[twin]] = busy[index[device]]
                peak[index[twin]] = peak[index[device]]
    over = peak > result.memory_capacity_bytes
    return dataclasses.replace(
        result,
        busy_s=busy,
        idle_s=result.makespan_s - busy,
        peak_memory_bytes=peak,
        oom=bool(over.any()),
        oom_devices=tuple(topology.devices[i].name for i in np.flatnonzero(over)),
    )
