"""Benchmark the simulator: simulated tasks per second and memory of one simulation.

Usage::

    python benchmarks/simulator.py [--repeats 20] [--model inception_v3] [--groups 60] [--network flow]

Cases: a full simulation of inception_v3 (317 ops, not coarsened) data-parallel on 16 GPUs
(tensoropt and flexflow-p100 presets), and 60-group plans of inception_v3 on tag-testbed (random
single-device placements of the groups, as Trinity/TAG agents produce, and data parallelism of the
groups). Each figure is the median over ``--repeats`` simulations after a warm-up (numba compiles
once per machine and caches), on one core (``NUMBA_NUM_THREADS=1``; the kernels are sequential).
``tasks/s`` counts every simulated task (compute, transfers, synchronization) over the whole
``SimContext.simulate`` call: plan compilation, task-graph construction, scheduling, memory sweep and
result assembly. ``memory`` is the peak of Python/numpy allocations during one simulation
(tracemalloc) plus the bytes of the arrays the numba kernels return. ``--model`` and ``--groups``
replace inception_v3 and its 60 groups (a tiny run: ``--repeats 1 --model lenet --groups 4``);
``--network`` picks the network model (``flow``, the default, ``circuit`` or ``pairwise``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
from collections.abc import Sequence

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from placement_rl import zoo
from placement_rl.graph.coarsen import coarsen
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.sim import CostModel
from placement_rl.sim.network import NETWORK_MODELS
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import load_preset


def _measure(ctx: SimContext, plan: Plan, repeats: int) -> tuple[int, float, float, float]:
    result = ctx.simulate(plan, validate=False)  # warm-up: compile op configurations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ctx.simulate(plan, validate=False)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    result = ctx.simulate(plan, validate=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t = result.tasks
    kernel_bytes = sum(a.nbytes for a in (t.kind, t.op, t.lane, t.start_s, t.end_s, t.num_bytes))
    median = statistics.median(times)
    return result.num_tasks, median, result.num_tasks / median, (peak + kernel_bytes) / 2**20


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--model", default="inception_v3", help="the zoo model")
    parser.add_argument("--groups", type=int, default=60, help="op groups of the coarsened cases")
    parser.add_argument("--network", default="flow", choices=list(NETWORK_MODELS), help="the network model")
    args = parser.parse_args(argv)
    cost = CostModel(network=args.network)
    model = args.model
    graph = zoo.load(model)
    coarse = coarsen(graph, args.groups)
    rng = np.random.default_rng(0)
    print("| case | tasks | median ms | tasks/s | memory MiB |")
    print("|---|---|---|---|---|")
    for preset in ("tensoropt", "flexflow-p100"):
        topo = load_preset(preset)
        row = _measure(SimContext(graph, topo, cost), data_parallel(graph, topo), args.repeats)
        print(
            f"| {model} data parallel, {preset} ({topo.num_devices} GPUs) | {row[0]:,} | {row[1] * 1e3:.2f} | "
            f"{row[2]:,.0f} | {row[3]:.1f} |"
        )
    testbed = load_preset("tag-testbed")
    ctx = SimContext(coarse, testbed, cost)
    names = [d.name for d in testbed.devices]
    placements = [
        Plan(coarse.name, {g.name: OpConfig.make(names[int(rng.integers(len(names)))]) for g in coarse.ops})
        for _ in range(args.repeats)
    ]
    for p in placements[:1]:
        ctx.simulate(p, validate=False)
    times, tasks = [], []
    for p in placements:
        start = time.perf_counter()
        tasks.append(ctx.simulate(p, validate=False).num_tasks)
        times.append(time.perf_counter() - start)
    groups = f"{model} {coarse.num_ops} groups"
    print(
        f"| {groups}, random single-device placements, tag-testbed | {int(np.median(tasks)):,} | "
        f"{statistics.median(times) * 1e3:.2f} | {sum(tasks) / sum(times):,.0f} | - |"
    )
    row = _measure(ctx, data_parallel(coarse, testbed), args.repeats)
    print(f"| {groups}, data parallel, tag-testbed | {row[0]:,} | {row[1] * 1e3:.2f} | {row[2]:,.0f} | {row[3]:.1f} |")


if __name__ == "__main__":
    main()
