"""Benchmark the simulator on a large cluster: cost follows the devices a plan uses.

Usage::

    python benchmarks/scale.py [--machines 512] [--gpus-per-machine 8] [--plan-gpus 16] [--model resnet50]
                               [--batch-per-gpu 32] [--repeats 5] [--repeats-all 1] [--skip-all]
                               [--calibration default]

The cluster is ``--machines`` DGX-H100-like machines (the ``h100-2x8`` preset's layout, scaled: an
NVSwitch per machine at 450 GB/s per GPU, one 400 Gb/s InfiniBand NIC per GPU into one fabric
switch). Cases:

* the cluster and data parallelism of ``--model`` on its first ``--plan-gpus`` GPUs;
* the cluster and data parallelism of ``--model`` on every GPU (skipped with ``--skip-all``).

The model's batch is ``--batch-per-gpu`` times the plan's GPUs (so that every GPU gets samples). Each
run is a fresh Python process that has imported the simulator, read the model's graph from JSON
and simulated it once on a 2 x 8 cluster of the same GPUs (loading numba's compiled kernels from
its cache, a fixed cost of every new process, reported under the table as ``kernel load``). ``wall
s`` and ``cpu s`` (this process's CPU time) run from building the large topology to the end of
``simulate`` (topology, routes, plan, simulation); ``peak RSS MiB`` is the process's peak resident
memory (everything: the interpreter, numpy, numba); ``routes from`` the source devices whose routes
were built. Figures are medians over ``--repeats`` (``--repeats-all`` for the full cluster)
processes. ``--same-process`` runs each case in this process instead (tests; memory is then this
process's peak so far). A tiny run: ``--machines 4 --gpus-per-machine 2 --plan-gpus 2 --model lenet
--batch-per-gpu 2 --repeats 1 --same-process``. ``--calibration`` picks the simulator's GPU model
(``default``; ``roofline`` for the tables measured before the shipped fit, or a calibration file).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl.cli.common import CALIBRATION_HELP, calibration, calibration_spec
from placement_rl.graph import OpGraph
from placement_rl.plan import data_parallel
from placement_rl.sim import CostModel, simulate
from placement_rl.sim.network import network
from placement_rl.topology import DeviceTopology, gbit_to_bytes_per_s
from placement_rl.topology.builder import TopologyBuilder


def h100_cluster(machines: int, gpus_per_machine: int) -> DeviceTopology:
    """``machines`` x ``gpus_per_machine`` H100-SXM5-80GB laid out as the ``h100-2x8`` preset."""
    b = TopologyBuilder()
    ib = b.switch("ib-switch")
    for _ in range(machines):
        machine, gpus = b.machine("H100-SXM5-80GB", gpus_per_machine)
        b.star(b.switch(f"{machine}/nvswitch"), gpus, 450e9, "nvswitch")
        b.star(ib, gpus, gbit_to_bytes_per_s(400), "infiniband")
    return b.build(f"h100-{machines}x{gpus_per_machine}")


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: Linux's ``VmHWM``; ``ru_maxrss`` without ``/proc``
    (on Linux it would also count the parent's memory at the fork that started this process)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(
    graph_json: str, machines: int, gpus_per_machine: int, plan_gpus: int, gpu_model: str = "default"
) -> dict[str, Any]:
    """Build the cluster, data parallelism of the graph on its first ``plan_gpus`` GPUs, simulate under
    the ``--calibration`` ``gpu_model``."""
    graph = OpGraph.from_json(graph_json)
    cost = CostModel(calibration=calibration(gpu_model))
    small = h100_cluster(2, gpus_per_machine)
    start = time.perf_counter()
    simulate(graph, small, data_parallel(graph, small), cost)  # loads the compiled kernels
    warm = time.perf_counter()
    cpu = time.process_time()
    topology = h100_cluster(machines, gpus_per_machine)
    plan = data_parallel(graph, topology, [d.name for d in topology.devices[:plan_gpus]])
    result = simulate(graph, topology, plan, cost)
    end = time.perf_counter()
    return {
        "load_s": warm - start,
        "wall_s": end - warm,
        "cpu_s": time.process_time() - cpu,
        "peak_rss_mib": peak_rss_mib(),
        "tasks": result.num_tasks,
        "iteration_ms": result.makespan_s * 1e3,
        "sources": network(topology).sources_built,
    }


def _measure(args: argparse.Namespace, graph_json: str, plan_gpus: int, repeats: int) -> list[dict[str, Any]]:
    runs = []
    for _ in range(repeats):
        if args.same_process:
            runs.append(run_case(graph_json, args.machines, args.gpus_per_machine, plan_gpus, args.calibration))
            continue
        child = [sys.executable, __file__, "--child", graph_json, "--machines", str(args.machines)]
        child += ["--gpus-per-machine", str(args.gpus_per_machine), "--plan-gpus", str(plan_gpus)]
        child += ["--calibration", args.calibration]
        done = subprocess.run(child, check=True, capture_output=True, text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=512)
    parser.add_argument("--gpus-per-machine", type=int, default=8)
    parser.add_argument("--plan-gpus", type=int, default=16)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-per-gpu", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repeats-all", type=int, default=1)
    parser.add_argument("--skip-all", action="store_true", help="skip data parallelism on every GPU")
    parser.add_argument("--same-process", action="store_true", help="run the cases in this process (tests)")
    parser.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    parser.add_argument("--child", metavar="GRAPH_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_case(args.child, args.machines, args.gpus_per_machine, args.plan_gpus, args.calibration)))
        return
    from placement_rl import zoo  # torch: only the parent traces the model

    total = args.machines * args.gpus_per_machine
    cases = [(f"data parallel on {args.plan_gpus} GPUs", args.plan_gpus, args.repeats)]
    if not args.skip_all:
        cases.append((f"data parallel on all {total:,} GPUs", total, args.repeats_all))
    loads = []
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for label, plan_gpus, repeats in cases:
            graph_json = str(Path(folder) / f"graph{plan_gpus}.json")
            zoo.load(args.model, batch_size=args.batch_per_gpu * plan_gpus).to_json(graph_json)
            runs = _measure(args, graph_json, plan_gpus, repeats)
            loads += [r["load_s"] for r in runs]

            def median(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r[key] for r in runs)

            rows.append(
                f"| {args.model} {label}, batch {args.batch_per_gpu * plan_gpus:,} | {runs[0]['tasks']:,} "
                f"| {runs[0]['sources']:,} | {median('wall_s'):.2f} | {median('cpu_s'):.2f} "
                f"| {median('peak_rss_mib'):,.0f} | {runs[0]['iteration_ms']:.3g} | {repeats} |"
            )
    command = " ".join(["python benchmarks/scale.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"`{command}` (cluster: {args.machines} x {args.gpus_per_machine} H100, {total:,} GPUs)\n")
    print("| case | tasks | routes from | wall s | cpu s | peak RSS MiB | ms/iter | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    print(
        f"\nkernel load (each process's first simulation, 2 x {args.gpus_per_machine}): median "
        f"{statistics.median(loads):.2f} s"
    )


if __name__ == "__main__":
    main()
