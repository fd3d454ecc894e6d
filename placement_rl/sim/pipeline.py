"""Micro-batches and pipeline schedules: a plan with ``micro_batches = m`` simulated as ``m`` copies.

A plan that runs ``m`` micro-batches per iteration (gradient accumulation, pipelines) is simulated
on the *micro-batch graph* (:func:`micro_batch_graph`): every op becomes ``m`` copies, copy ``k``
computing micro-batch ``k`` (its sample dimension, FLOPs and activation bytes divided by ``m``),
the copies of one op sharing its parameters (one ``param_key``), so that the simulator's shared
parameter rule synchronizes each gradient once per iteration, after the backward tasks of every
micro-batch. Every copy takes its op's configuration (:func:`micro_batch_plan`).

Each device runs its compute tasks in the order the plan's schedule names
(:func:`schedule_slots`), not first-in first-out: a device's tasks are grouped in *slots*, one per
(forward or backward, micro-batch, model chunk), and the slots follow the schedule; inside a slot,
forward tasks run in op order and backward tasks in reverse op order. The stages are the plan's
device sets in topological order (:func:`placement_rl.plan.core.pipeline_stages`); device group
``g`` is the ``g``-th distinct device set, its rank in the pipeline.

* ``gpipe``: every forward slot (micro-batch order), then every backward slot.
* ``1f1b`` (PipeDream-Flush, Megatron-LM's default): the device of rank ``r`` in a pipeline of
  ``p`` groups runs ``min(p - r - 1, m)`` warm-up forwards, then one forward and one backward in
  turn, then the remaining backwards. Activations are held for at most ``p - r`` micro-batches.
* ``interleaved`` (Megatron-LM's interleaved 1F1B): each device group holds ``v`` model chunks
  (``virtual_stages``); the ``k``-th forward runs chunk ``(k // p) % v`` of micro-batch
  ``(k // (p v)) p + k % p``, with ``(p - r - 1) 2 + (v - 1) p`` warm-up forwards (all of them when
  ``m == p``), as Megatron-LM's ``forward_backward_pipelining_with_interleaving``.

Activations are held from a forward task's start to its backward's end, so the memory each schedule
needs follows from the order (the memory model and the out-of-memory check need nothing else). An
order whose waits form a cycle (a device group that would wait for itself: a plan whose stages do not
form a pipeline under a 1F1B schedule) raises :class:`ScheduleDeadlock`; ``gpipe`` never does.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan.core import Plan, pipeline_stages


class ScheduleDeadlock(ValueError):
    """A plan's schedule orders tasks so that some device waits for itself."""


#: The separator between an op's name and its micro-batch in the micro-batch graph.
MICRO_BATCH_SEPARATOR = "@mb"


def copy_name(op_name: str, k: int) -> str:
    """The name of micro-batch ``k``'s copy of ``op_name``."""
    return f"{op_name}{MICRO_BATCH_SEPARATOR}{k}"


def scaled_op(op: Op, m: int, name: str) -> Op:
    """``op`` on ``1 / m`` of the batch, called ``name``: its sample dimension, FLOPs and activation
    bytes ``1 / m``, its parameters the same (under their own key, shared by every such copy)."""
    key = op.param_key or (op.name if op.param_bytes else None)
    dim = op.sample_dim
    if dim is None:
        return dataclasses.replace(op, name=name, param_key=key)
    shapes = op.output_shapes
    if not dim.reduction:
        first = shapes[0][dim.axis]
        shapes = tuple(
            tuple(n // m if a == dim.axis else n for a, n in enumerate(s))
            if len(s) > dim.axis and s[dim.axis] == first
            else s
            for s in shapes
        )
    dims = tuple(
        ParallelDim(d.name, d.kind, d.axis, d.size // m, d.reduction) if d is dim else d for d in op.parallel_dims
    )
    read_params = min(op.param_bytes, op.bytes_read)
    return dataclasses.replace(
        op,
        name=name,
        output_shapes=shapes,
        forward_flops=op.forward_flops / m,
        backward_flops=op.backward_flops / m,
        bytes_read=read_params + (op.bytes_read - read_params) // m,
        bytes_written=op.bytes_written // m if not dim.reduction else op.bytes_written,
        parallel_dims=dims,
        param_key=key,
    )


def scaled_tensor(t: Tensor, producer: Op, m: int, src: str, dst: str) -> Tensor:
    """Tensor ``t`` between ``src`` and ``dst`` on ``1 / m`` of the batch: its batch axis (the
    producer's) and bytes ``1 / m`` when it carries the batch."""
    axis = producer.plain_sample_axis
    shape, num_bytes = t.shape, t.num_bytes
    dim = producer.sample_dim
    if axis >= 0 and dim is not None and len(shape) > axis and shape[axis] == dim.size:
        shape = tuple(n // m if a == axis else n for a, n in enumerate(shape))
        num_bytes //= m
    return Tensor(src, dst, shape, num_bytes, t.src_output, t.dst_axes)


def check_batch_divides(graph: OpGraph, m: int, what: str) -> None:
    """Raise ``ValueError`` naming the op when ``m`` (``what``: "micro-batches", ...) does not divide
    an op's sample dimension."""
    for op in graph.ops:
        dim = op.sample_dim
        if dim is not None and dim.size % m:
            raise ValueError(
                f"{m} {what} do not divide op {op.name!r}'s sample dimension of size {dim.size}; "
                "expected a divisor of the batch"
            )


def micro_batch_graph(graph: OpGraph, m: int) -> OpGraph:
    """The graph of one iteration of ``m`` micro-batches: op ``i``'s copy ``k`` is op ``i m + k``.

    Raises:
        ValueError: when ``m`` does not divide an op's sample dimension.
    """
    check_batch_divides(graph, m, "micro-batches")
    by_name = {op.name: op for op in graph.ops}
    ops: list[Op] = []
    for op in graph.ops:  # copy k of op i is op i m + k: op-major order is topological
        first = scaled_op(op, m, copy_name(op.name, 0))
        ops.extend([first, *(dataclasses.replace(first, name=copy_name(op.name, k)) for k in range(1, m))])
    tensors: list[Tensor] = []
    for t in graph.tensors:
        edge = scaled_tensor(t, by_name[t.src], m, copy_name(t.src, 0), copy_name(t.dst, 0))
        tensors.extend(
            [
                edge,
                *(dataclasses.replace(edge, src=copy_name(t.src, k), dst=copy_name(t.dst, k)) for k in range(1, m)),
            ]
        )
    batch = graph.batch_size // m if graph.batch_size is not None and graph.batch_size % m == 0 else None
    metadata = {**graph.metadata, "micro_batches": m, "micro_batches_of": graph.name}
    return OpGraph.derived(f"{graph.name}{MICRO_BATCH_SEPARATOR}{m}", ops, tensors, batch_size=batch, metadata=metadata)


def micro_batch_plan(plan: Plan, graph: OpGraph, unrolled: OpGraph) -> Plan:
    """``plan`` on the micro-batch graph: every copy takes its op's configuration."""
    m = plan.micro_batches
    configs = {copy_name(op.name, k): plan[op.name] for op in graph.ops for k in range(m)}
    return Plan(unrolled.name, configs, name=plan.name, metadata=plan.metadata)


def schedule_slots(schedule: str, rank: int, groups: int, m: int, v: int) -> list[tuple[int, int, int]]:
    """The slots of the device of pipeline rank ``rank`` in their order: ``(backward, micro-batch, chunk)``.

    ``groups`` is the pipeline depth ``p`` (device groups), ``m`` the micro-batches and ``v`` the
    model chunks per device group (virtual stages; 1 but for ``interleaved``).
    """
    p = max(groups, 1)
    if schedule == "gpipe":
        forwards = [(0, mb, c) for c in range(v) for mb in range(m)]
        return forwards + [(1, mb, c) for c in reversed(range(v)) for mb in range(m)]
    total = m * v
    if schedule == "1f1b" or v == 1:

        def fwd(k: int) -> tuple[int, int, int]:
            return 0, k, 0

        def bwd(k: int) -> tuple[int, int, int]:
            return 1, k, 0

        warmup = min(p - rank - 1, total)
    else:  # interleaved

        def fwd(k: int) -> tuple[int, int, int]:
            return 0, (k // (p * v)) * p + k % p, (k // p) % v

        def bwd(k: int) -> tuple[int, int, int]:
            return 1, (k // (p * v)) * p + k % p, v - 1 - (k // p) % v

        warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    slots = [fwd(k) for k in range(warmup)]
    for i in range(total - warmup):
        slots += [fwd(warmup + i), bwd(i)]
    slots += [bwd(k) for k in range(total - warmup, total)]
    return slots


def program_keys(
    graph: OpGraph, plan: Plan, device_index: dict[str, int], task_dev: np.ndarray, task_op: np.ndarray
) -> np.ndarray:
    """The order key of every compute task of the micro-batch graph: ``(2F,)`` int64, forward tasks
    then backward tasks; a device runs its tasks by ascending key.

    ``task_dev``, ``task_op``: ``(F,)`` device index and micro-batch-graph op index of each forward
    task (op ``i m + k`` is op ``i``'s copy for micro-batch ``k``).
    """
    m, v = plan.micro_batches, plan.virtual_stages
    n = graph.num_ops
    stages = pipeline_stages(graph, plan)
    groups = list(dict.fromkeys(s.devices for s in stages))
    group_of = {g: i for i, g in enumerate(groups)}
    op_stage = np.empty(n, np.int64)
    for s, stage in enumerate(stages):
        op_stage[list(stage.ops)] = s
    num_devices = len(device_index)
    # per device: its rank (group of its first stage) and each stage's chunk on it
    rank = np.zeros(num_devices, np.int64)
    chunk = np.zeros((num_devices, len(stages)), np.int64)
    seen: dict[int, int] = {}
    for s, stage in enumerate(stages):
        for name in stage.devices:
            d = device_index[name]
            if d not in seen:
                seen[d] = 0
                rank[d] = group_of[stage.devices]
            if plan.schedule == "interleaved":
                chunk[d, s] = min(seen[d], v - 1)
            seen[d] += 1
    chunks = v if plan.schedule == "interleaved" else 1
    # slot position per (rank, backward, micro-batch, chunk)
    position = np.zeros((max(len(groups), 1), 2, m, chunks), np.int64)
    for g in range(len(groups)):
        for pos, (b, k, c) in enumerate(schedule_slots(plan.schedule, g, len(groups), m, chunks)):
            position[g, b, k, c] = pos
    op = task_op // m
    micro = task_op % m
    chunk_of = chunk[task_dev, op_stage[op]]
    rank_of = rank[task_dev]
    forward = position[rank_of, 0, micro, chunk_of] * (n + 1) + op
    backward = position[rank_of, 1, micro, chunk_of] * (n + 1) + (n - op)
    return np.concatenate([forward, backward]).astype(np.int64)
