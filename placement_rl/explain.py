"""A plan in words: which devices it uses, its pipeline (stages, schedule, micro-batches), how each op
family is split, replicated and synchronized, ZeRO, recomputation and uneven batch splits, memory per
device, and where the iteration's time goes next to data parallelism's.

``placement-rl plan`` prints :func:`explain_plan` under its table. The critical path of a simulation
is split into compute, data transfers, gradient synchronization and the host issuing kernels;
comparing that split with data parallelism's says why a plan is faster or slower (e.g. "DP spends
63% of its critical path synchronizing gradients; this plan 12%").

When no method's plan fits in memory, :func:`explain_no_fit` says so instead: the plan that needs the
least memory, how far each of its devices is over, and what would fit (how many devices of the
cluster's largest type a training step needs when split without replication, a lower precision where
it needs less memory, splitting the model, sharding it with the memory-saving methods).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.ops import op_kind
from placement_rl.plan import OpConfig, Plan, pipeline_stages
from placement_rl.plots import format_bytes
from placement_rl.sim.result import TASK_KINDS, SimResult
from placement_rl.topology import DeviceTopology

if TYPE_CHECKING:
    from placement_rl.methods import MethodResult
    from placement_rl.sim import CostModel

#: The methods that save memory (tensor / pipeline parallelism, ZeRO, recomputation) :func:`explain_no_fit`
#: suggests where the rows lack them.
MEMORY_METHODS: tuple[str, ...] = ("megatron", "zero")

#: Critical-path task kinds by what the time is spent on.
_SPENT_ON = {
    "forward": "compute",
    "backward": "compute",
    "transfer": "data transfers",
    "gradient_transfer": "data transfers",
    "all_reduce": "gradient synchronization",
    "ps_push": "gradient synchronization",
    "ps_pull": "gradient synchronization",
    "sfb_broadcast": "gradient synchronization",
    "sfb_gradient": "gradient synchronization",
    "host": "the host issuing kernels",
    "partial_all_reduce": "tensor-parallel all-reduces",
}
_GIB = float(2**30)


def time_breakdown(result: SimResult) -> dict[str, float]:
    """Seconds of the critical path spent on compute, data transfers, gradient synchronization and issuing
    kernels, and on tensor-parallel all-reduces where the critical path has any."""
    t = result.tasks
    out: dict[str, float] = dict.fromkeys(
        ("compute", "data transfers", "gradient synchronization", "the host issuing kernels"), 0.0
    )
    ids = result.critical_tasks
    if ids.size:
        spent = t.end_s[ids] - t.start_s[ids]
        for kind, seconds in zip(t.kind[ids].tolist(), spent.tolist(), strict=True):
            key = _SPENT_ON[TASK_KINDS[kind]]
            out[key] = out.get(key, 0.0) + seconds
    return out


def _device_ranges(names: Sequence[str]) -> str:
    """``m0/gpu0-3, m1/gpu0`` for a list of device names (grouped per machine prefix)."""
    by_prefix: dict[str, list[str]] = defaultdict(list)
    for name in names:
        prefix, _, last = name.rpartition("/")
        by_prefix[prefix].append(last)
    parts = []
    for prefix, lasts in by_prefix.items():
        digits = [x.rstrip("0123456789") for x in lasts]
        if len(lasts) > 1 and len(set(digits)) == 1 and all(x[len(digits[0]) :].isdigit() for x in lasts):
            numbers = sorted(int(x[len(digits[0]) :]) for x in lasts)
            if numbers == list(range(numbers[0], numbers[-1] + 1)):
                parts.append(
                    f"{prefix}/{digits[0]}{numbers[0]}-{numbers[-1]}"
                    if prefix
                    else f"{digits[0]}{numbers[0]}-{numbers[-1]}"
                )
                continue
        parts.extend(f"{prefix}/{x}" if prefix else x for x in lasts)
    return ", ".join(parts)


def _dim_label(name: str, kind: str) -> str:
    if kind == "sample":
        return "batch"
    return f"{name} (parameters)" if kind == "parameter" else name


def _describe_config(cfg: OpConfig, graph: OpGraph, op_name: str) -> str:
    """One configuration in words: ``split along the batch over 4 devices, gradients all-reduced``."""
    op = graph.op(op_name)
    kinds = {d.name: d.kind for d in op.parallel_dims}
    n = len(set(cfg.devices))
    splits = [f"{_dim_label(name, kinds.get(name, ''))} / {degree}" for name, degree in cfg.degrees]
    if not splits and n == 1:
        where = "on one device"
    elif not splits:
        where = f"replicated on {n} devices"
    else:
        where = "split " + ", ".join(splits) + f" over {n} device{'s' if n > 1 else ''}"
        if cfg.replicas > 1:
            where += f", each part on {cfg.replicas} replicas"
    if op.param_bytes and n > 1:
        sync = {
            "all_reduce": "gradients all-reduced",
            "all_reduce_per_tensor": "gradients all-reduced tensor by tensor",
            "sfb": "sufficient factors broadcast, gradients rebuilt on every replica"
            + (f" (also recomputing {', '.join(cfg.sfb_duplicate)})" if cfg.sfb_duplicate else ""),
            "parameter_server": f"gradients through a parameter server on {cfg.ps_device or cfg.devices[0]}",
            "duplicate": "duplicated: no gradient exchange"
            if cfg.num_partitions <= 1 or cfg.replicas <= 1
            else "identical on the replicas, gradients all-reduced over the parts",
        }[cfg.sync]
        if all(kinds.get(name) == "parameter" for name, _ in cfg.degrees) and cfg.replicas == 1 and cfg.degrees:
            sync = "parameters split: nothing to synchronize"
        where += f"; {sync}"
    return where


#: Schedules in words (:data:`placement_rl.plan.SCHEDULES`).
_SCHEDULE_WORDS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}
#: How many op types a recomputation line names before it counts the rest.
_MAX_TYPES_NAMED = 4


def _plural(count: int, noun: str) -> str:
    """``1 op``, ``2 ops``, ``1 micro-batch``, ``16 micro-batches``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}es" if noun.endswith("ch") else f"{count} {noun}s"


def _count_range(counts: Sequence[int], noun: str, each: bool = True) -> str:
    """``20 ops each`` (``20 ops`` without ``each``), ``12 to 25 ops`` for a list of per-item counts."""
    lo, hi = min(counts), max(counts)
    if lo == hi:
        return _plural(lo, noun) + (" each" if each and len(counts) > 1 else "")
    return f"{lo} to {_plural(hi, noun)}"


#: Splits that make an op tensor-parallel (Megatron-LM's column- and row-parallel layers, heads).
_TENSOR_PARALLEL_DIMS = ("in_channel", "heads")


def _describe_layout(graph: OpGraph, topology: DeviceTopology, plan: Plan) -> str:
    """The 3D layout in words when the plan splits layers along input features or heads:
    ``8-way tensor parallel inside each machine (160 layers), 8-way data parallel, 4 pipeline stages``."""
    tp: Counter[int] = Counter()
    inside = True
    for op in graph.ops:
        cfg = plan[op.name]
        degrees = cfg.degree_map
        split = [d.name for d in op.parallel_dims if degrees.get(d.name, 1) > 1]  # partitions row-major
        for dim in _TENSOR_PARALLEL_DIMS:
            if dim in split:
                tp[degrees[dim]] += 1
                step = math.prod(degrees[k] for k in split[split.index(dim) + 1 :]) * cfg.replicas
                group = cfg.devices[: degrees[dim] * step : step]
                inside = inside and len({topology.device(d).machine for d in group}) == 1
    if not tp:
        return ""
    degree, layers = tp.most_common(1)[0]
    parts = [f"{degree}-way tensor parallel {'inside each machine' if inside else 'across machines'} ({layers} ops)"]
    dp = Counter(plan[op.name].degree_map.get(op.sample_dim.name, 1) for op in graph.ops if op.sample_dim is not None)
    if dp and dp.most_common(1)[0][0] > 1:
        parts.append(f"{dp.most_common(1)[0][0]}-way data parallel")
    stages = len({s.devices for s in pipeline_stages(graph, plan)})
    parts.append(f"{stages} pipeline stages" if stages > 1 else "no pipeline")
    return ", ".join(parts)


def _describe_pipeline(graph: OpGraph, plan: Plan) -> str:
    """The pipeline in words: ``4 pipeline stages of 20 ops each (1F1B with 16 micro-batches)``."""
    stages = pipeline_stages(graph, plan)
    micro = _plural(plan.micro_batches, "micro-batch")
    how = f"{_SCHEDULE_WORDS.get(plan.schedule, plan.schedule)} with "
    if plan.schedule == "interleaved":
        how += f"{_plural(plan.virtual_stages, 'virtual stage')} per device group, {micro}"
    else:
        how += micro
    sizes = [len(s.ops) for s in stages]
    if len(stages) == 1:
        return f"one stage of {_plural(sizes[0], 'op')}, no pipeline: {micro} per iteration (gradient accumulation)"
    groups = len(dict.fromkeys(s.devices for s in stages))
    on = f" on {groups} device groups" if groups != len(stages) else ""
    return f"{len(stages)} pipeline stages of {_count_range(sizes, 'op')}{on} ({how})"


def _describe_memory_savers(graph: OpGraph, topology: DeviceTopology, plan: Plan) -> list[str]:
    """ZeRO, recomputation and uneven batch splits in words, one line each where the plan uses them:
    ``ZeRO-1 over 8 replicas on 120 ops``, ``recomputing 40 ops (attention, linear)``, ``uneven batch
    split on 12 ops (weights 0.6/0.4 over m0/gpu0-1)``."""
    lines: list[str] = []
    zero: dict[int, list[int]] = defaultdict(list)  # stage -> replicas of each op's parameter shards
    recomputed: Counter[str] = Counter()
    weighted: Counter[tuple[tuple[str, ...], tuple[float, ...]]] = Counter()
    order = {d.name: i for i, d in enumerate(topology.devices)}
    for op in graph.ops:
        cfg = plan[op.name]
        if cfg.zero:
            kinds = {d.name: d.kind for d in op.parallel_dims}
            shards = math.prod(degree for name, degree in cfg.degrees if kinds.get(name) == "parameter")
            zero[cfg.zero].append(len(cfg.devices) // shards)
        if cfg.recompute:
            recomputed[op.op_type] += 1
        if cfg.weights:
            pairs = sorted(cfg.weights, key=lambda dw: (order.get(dw[0], len(order)), dw[0]))
            weighted[tuple(d for d, _ in pairs), tuple(w for _, w in pairs)] += 1
    if zero:
        parts = []
        for stage, replicas in sorted(zero.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            label = f"ZeRO-{stage}" + (" (FSDP)" if stage == 3 else "")
            parts.append(
                f"{label} over {_count_range(replicas, 'replica', each=False)} on {_plural(len(replicas), 'op')}"
            )
        lines.append(", ".join(parts))
    if recomputed:
        total = sum(recomputed.values())
        named = [t for t, _ in sorted(recomputed.items(), key=lambda kv: (-kv[1], kv[0]))]
        types = ", ".join(named[:_MAX_TYPES_NAMED])
        if len(named) > _MAX_TYPES_NAMED:
            types += f" and {len(named) - _MAX_TYPES_NAMED} more types"
        how_many = f"all {total} ops" if total == graph.num_ops and total > 1 else _plural(total, "op")
        lines.append(f"recomputing {how_many} ({types})")
    if weighted:
        total = sum(weighted.values())
        ((devices, weights), count), *_ = weighted.most_common()
        shares = "/".join(f"{w:.3g}" for w in weights)
        more = f", and {total - count} otherwise" if count < total else ""
        lines.append(
            f"uneven batch split on {_plural(total, 'op')} (weights {shares} over {_device_ranges(devices)}{more})"
        )
    return lines


def explain_plan(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    result: SimResult,
    reference: SimResult | None = None,
    reference_name: str = "data parallelism",
) -> list[str]:
    """The plan in words, one line per statement (see the module docstring).

    Args:
        graph: the graph the plan is for.
        topology: the cluster.
        plan: the plan.
        result: its simulation.
        reference: the simulation to compare with (data parallelism), if any.
        reference_name: how to call the reference.
    """
    lines: list[str] = []
    used = plan.devices_used()
    idle = [d.name for d in topology.devices if d.name not in set(used)]
    types = Counter(topology.device(d).device_type for d in used)
    kinds = ", ".join(f"{n} x {t}" for t, n in types.most_common())
    lines.append(f"uses {len(used)} of {topology.num_devices} devices ({kinds}): {_device_ranges(used)}")
    if idle:
        lines.append(f"leaves {len(idle)} idle: {_device_ranges(idle)}")
    layout = _describe_layout(graph, topology, plan)
    if layout:
        lines.append(layout)
    if plan.micro_batches != 1 or plan.schedule != "1f1b" or plan.virtual_stages != 1:
        lines.append(_describe_pipeline(graph, plan))
    # How each op family is placed: the most common configuration shape per family.
    families: dict[str, Counter[str]] = defaultdict(Counter)
    for op in graph.ops:
        families[op_kind(op.op_type).family][_describe_config(plan[op.name], graph, op.name)] += 1
    for family, shapes in sorted(families.items(), key=lambda kv: -sum(kv[1].values())):
        ops = sum(shapes.values())
        (shape, count), *others = shapes.most_common()
        more = f" (and {ops - count} otherwise)" if others else ""
        lines.append(f"{family} ({ops} op{'s' if ops > 1 else ''}): {shape}{more}")
    lines.extend(_describe_memory_savers(graph, topology, plan))
    peak = result.peak_memory_bytes
    if peak.size:
        busy = [i for i, name in enumerate(result.device_names) if name in set(used)]
        hi = max(busy, key=lambda i: peak[i]) if busy else int(np.argmax(peak))
        cap = result.memory_capacity_bytes[hi]
        fits = "does not fit" if result.oom else "fits"
        lines.append(
            f"memory: {fits}; peak {format_bytes(peak[hi])} of {format_bytes(cap)} on {result.device_names[hi]}"
            + (f" (out of memory on {', '.join(result.oom_devices)})" if result.oom else "")
        )
    mine = time_breakdown(result)
    total = max(sum(mine.values()), 1e-30)
    split = ", ".join(f"{k} {v / total:.0%}" for k, v in mine.items())
    lines.append(f"critical path of {result.makespan_s * 1e3:.2f} ms: {split}")
    if reference is not None and reference.makespan_s > 0:
        theirs = time_breakdown(reference)
        ref_total = max(sum(theirs.values()), 1e-30)
        ratio = reference.makespan_s / result.makespan_s if result.makespan_s > 0 else float("inf")
        verdict = "faster than" if ratio > 1.0005 else "slower than" if ratio < 0.9995 else "as fast as"
        main = max(theirs, key=lambda k: theirs[k] / ref_total - mine.get(k, 0.0) / total)
        share = mine.get(main, 0.0) / total
        lines.append(
            f"{ratio:.2f}x {verdict} {reference_name} ({reference.makespan_s * 1e3:.2f} ms): {reference_name} spends "
            f"{theirs[main] / ref_total:.0%} of its critical path on {main}, this plan {share:.0%}"
        )
    return lines


#: Lower precisions to suggest, in order, when a plan does not fit (mixed precision halves activations).
_LOWER_PRECISIONS = ("bf16-mixed", "fp16-mixed")


def _step_bytes(graph: OpGraph, topology: DeviceTopology, cost_model: CostModel | None) -> float:
    """The memory of a whole training step on one device (parameters, gradients, optimizer state and
    the activations' peak): the single-device plan's peak."""
    from placement_rl.plan import single_device
    from placement_rl.sim import simulate

    result = simulate(graph, topology, single_device(graph, topology), cost_model, validate=False)
    return float(result.peak_memory_bytes.max()) if result.peak_memory_bytes.size else 0.0


def explain_no_fit(
    graph: OpGraph,
    topology: DeviceTopology,
    results: Sequence[MethodResult],
    cost_model: CostModel | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Why nothing fits, for an instance where no method's plan fits in memory.

    Args:
        graph: the graph.
        topology: the cluster.
        results: every method's row (none fits).
        cost_model: the cost model the rows were simulated with.

    Returns:
        The lines to print, and the same as a JSON-ready object: ``least_memory`` (the method whose plan
        is least over memory, ``memory_over_bytes``, and per out-of-memory device its ``peak_bytes`` and
        ``capacity_bytes``), ``step_bytes`` (a training step on one device), and ``suggestions``, each
        with a ``kind`` (``more_devices``, ``split``, ``precision``, ``shard``) and a ``text``; ``shard``
        lists the memory-saving ``methods`` (:data:`MEMORY_METHODS`) the rows do not include.
    """
    from placement_rl.methods import least_memory

    least = least_memory(results)
    r = least.result
    over_devices = {
        name: {"peak_bytes": int(peak), "capacity_bytes": int(cap)}
        for name, peak, cap in zip(r.device_names, r.peak_memory_bytes, r.memory_capacity_bytes, strict=True)
        if peak > cap
    }
    worst = max(over_devices, key=lambda d: over_devices[d]["peak_bytes"] - over_devices[d]["capacity_bytes"])
    peak, cap = (format_bytes(over_devices[worst][k]) for k in ("peak_bytes", "capacity_bytes"))
    lines = [
        f"no method found a plan that fits in memory ({len(results)} plans); the least-memory plan is "
        f"{least.method}, {format_bytes(least.memory_over_bytes)} over on {worst} (peak {peak} of {cap}; "
        f"{len(over_devices)} of {topology.num_devices} devices over)"
    ]
    step_bytes = _step_bytes(graph, topology, cost_model)
    largest = max(topology.devices, key=lambda d: d.memory_bytes)
    needed = math.ceil(step_bytes / largest.memory_bytes) if largest.memory_bytes > 0 else 0
    same_type = sum(d.device_type == largest.device_type for d in topology.devices)
    suggestions: list[dict[str, Any]] = []
    if needed > same_type:
        suggestions.append(
            {
                "kind": "more_devices",
                "device_type": largest.device_type,
                "devices_needed": needed,
                "devices_of_type": same_type,
                "text": f"more devices: a training step needs {format_bytes(step_bytes)}, so at least {needed} "
                f"{largest.device_type} ({format_bytes(largest.memory_bytes)} each) with the model split "
                f"without replication; the cluster has {same_type}",
            }
        )
    total_bytes = float(sum(d.memory_bytes for d in topology.devices))
    suggestions.append(
        {
            "kind": "split",
            "text": "split the model instead of replicating it: layerwise stages, or ops placed on different "
            "devices (model parallelism) and split along their parameters (mcmc, ft and exhaustive search these)"
            + (
                f"; the cluster's {format_bytes(total_bytes)} hold the {format_bytes(step_bytes)} of a "
                "training step, but no plan found spreads it evenly enough"
                if total_bytes >= step_bytes
                else ""
            ),
        }
    )
    current = cost_model.precision if cost_model is not None else "fp32"
    if current not in _LOWER_PRECISIONS:
        from placement_rl.sim import CostModel as _CostModel

        base = cost_model if cost_model is not None else _CostModel()
        for precision in _LOWER_PRECISIONS:
            try:
                lower = _step_bytes(graph, topology, dataclasses.replace(base, precision=precision, profile=None))
            except ValueError:  # a device without that precision's peak, or a profile of another precision
                continue
            if lower < step_bytes:
                suggestions.append(
                    {
                        "kind": "precision",
                        "precision": precision,
                        "step_bytes": lower,
                        "text": f"a lower precision: {precision} (--precision {precision}) needs "
                        f"{format_bytes(lower)} per training step instead of {format_bytes(step_bytes)}",
                    }
                )
            break
    untried = [name for name in MEMORY_METHODS if name not in {row.method for row in results}]
    suggestions.append(
        {
            "kind": "shard",
            "methods": untried,
            "text": "shard the model and trade compute for memory: tensor and pipeline parallelism with "
            "micro-batches, sharded data parallelism (ZeRO, FSDP) and activation recomputation"
            + (f" (--methods {','.join(untried)})" if untried else "")
            + "; placement_rl.plan.megatron, zero, fsdp, recompute and pipeline build such plans by hand",
        }
    )
    lines.append("what would fit:")
    lines.extend(f"  - {s['text']}" for s in suggestions)
    document = {
        "least_memory": {
            "method": least.method,
            "memory_over_bytes": least.memory_over_bytes,
            "devices_over": over_devices,
        },
        "step_bytes": step_bytes,
        "suggestions": suggestions,
    }
    return lines, document
