"""TensorOpt's FT: running time (mirrors Table 3) and estimate vs simulator (mirrors Table 2).

    python benchmarks/ft.py time [--models rnnlm,transformer,wideresnet] [--max-configs 16] [--timeout 300]
    python benchmarks/ft.py estimate [--models ...] [--max-configs 16] [--network flow] [--bucket-bytes 26214400]
    python benchmarks/ft.py devices [--instances alexnet:mixed-10g,vgg16:tag-cloud,alexnet:8x1-10g] [--stage-meshes 1]

``time`` runs FT-LDP and FT-Elimination for each model on the tensoropt preset (16 GPUs), each in its
own process with a wall-clock limit. It prints the FT time (cost tables included), the number of
configurations per op, the frontier size, the eliminations, and the time spent on the final path
(Linear DP vs eliminating it down to two nodes), which is where the two methods differ.

``estimate`` compares FT's additive estimate with the simulator for data parallelism, FT's
mini-time plan and the simulator's pick of the frontier (:func:`~placement_rl.search.ft.simulated_best`),
with re-scheduling priced as collectives (TensorOpt) and as point-to-point transfers (the
simulator's model). FT's additive estimate assumes what the ``circuit`` network model with one
all-reduce per tensor simulates (``--network circuit --bucket-bytes 0``); under the default ``flow``
model with DDP's 25 MiB buckets the error also shows what FT's cost model leaves out.

``devices`` runs FT (the ``ft`` method's pick, :func:`~placement_rl.search.ft.pick_over_device_counts`)
on mixed clusters listed as built and with their device list reversed (the fast machine last): with
the old rule (the first 1, 2, 4, ..., all devices as listed), with the device sets of
:mod:`placement_rl.search.ft.devices` (the same answer however the cluster is listed) and with a mesh
per stage (``--stage-meshes``). ``mixed-10g`` is one machine of 4 V100-SXM2-32GB (NVLink) and three
of 4 K80 on 10 Gbit/s Ethernet, ``8x1-10g`` eight machines of one V100-SXM2-16GB on 10 Gbit/s
Ethernet; other names are presets.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time

import numpy as np


def _one(model: str, method: str, max_configs: int | None, tolerance: float) -> dict[str, object]:
    from placement_rl import zoo
    from placement_rl.search.ft import run_ft
    from placement_rl.topology import load_preset

    graph = zoo.load(model)
    topology = load_preset("tensoropt")
    run_ft(zoo.load("lenet"), topology, 2, max_configs=2)  # compile the numba kernel outside the timing
    start = time.perf_counter()
    result = run_ft(graph, topology, method=method, max_configs=max_configs, tolerance=tolerance)
    s = result.stats
    return {
        "model": model,
        "method": method,
        "ops": graph.num_ops,
        "seconds": time.perf_counter() - start,
        "cost_graph_s": result.cost_graph_s,
        "K_median": float(np.median(result.configs_per_op)),
        "K_max": int(result.configs_per_op.max()),
        "points": len(result.points),
        "node": s.node,
        "edge": s.edge,
        "branch": s.branch,
        "heuristic": s.heuristic,
        "ldp_steps": s.ldp_steps,
        "to_path_s": s.to_path_s,
        "path_s": s.path_s,
        "path_length": s.path_length,
    }


def time_table(models: list[str], max_configs: int | None, timeout_s: float, tolerance: float) -> None:
    paper = {"rnnlm": (0.28, 1.78), "rnntc": (0.28, 1.78), "transformer": (201, 3030), "wideresnet": (1292, 19666)}
    print(
        f"FT on tensoropt (16 GPUs), max {max_configs or 'all'} configurations per op, tolerance {tolerance}, "
        f"limit {timeout_s:.0f} s per run"
    )
    print(
        "| model | ops | K median / max | FT-LDP s | FT-Elimination s | Elim / LDP | path nodes "
        "| on the path: LDP / Elim s | points | heuristic elims | paper LDP / Elim s (48 cores) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        rows = {}
        for method in ("ldp", "elimination"):
            cmd = [sys.executable, __file__, "_one", model, method, str(max_configs or 0), str(tolerance)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
                rows[method] = json.loads(done.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                rows[method] = None
        ldp, elim = rows["ldp"], rows["elimination"]
        ref = ldp or elim
        ldp_s = f"{ldp['seconds']:.2f}" if ldp else f"> {timeout_s:.0f}"
        elim_s = f"{elim['seconds']:.2f}" if elim else f"> {timeout_s:.0f}"
        ratio = f"{elim['seconds'] / ldp['seconds']:.1f}x" if ldp and elim else "-"
        p = paper.get(model, ("-", "-"))
        k = f"{ref['K_median']:.0f} / {ref['K_max']}" if ref else "-"
        path = f"{ldp['path_s']:.2f} / {elim['path_s']:.2f}" if ldp and elim else "-"
        print(
            f"| {model} | {ref['ops'] if ref else '-'} | {k} | {ldp_s} | {elim_s} | {ratio} | "
            f"{ldp['path_length'] if ldp else '-'} | {path} | "
            f"{ldp['points'] if ldp else '-'} | {ldp['heuristic'] if ldp else '-'} | {p[0]} / {p[1]} |",
            flush=True,
        )


def estimate_table(
    models: list[str],
    max_configs: int | None,
    tolerance: float,
    network: str = "flow",
    bucket_bytes: int = 25 * 2**20,
    calibration: str = "default",
) -> None:
    from placement_rl import zoo
    from placement_rl.experiments import calibration_named
    from placement_rl.plan import data_parallel
    from placement_rl.search.ft import device_memory_bytes, run_ft, simulated_best
    from placement_rl.search.ft.costs import build_cost_graph
    from placement_rl.sim import CostModel, simulate
    from placement_rl.topology import load_preset

    topology = load_preset("tensoropt")
    gpu_model = calibration_named(calibration, "--calibration")
    cost = CostModel(network=network, bucket_bytes=bucket_bytes, calibration=gpu_model)
    ft_cost = CostModel(calibration=gpu_model)  # FT's op times from the same GPU model
    print(f"simulator: network {network}, gradient buckets {bucket_bytes:,} bytes, calibration {calibration}")
    print(
        "| model | plan | FT estimate ms | simulated ms | error | vs DP (simulated) "
        "| FT memory GiB | simulated peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        graph = zoo.load(model)
        costs, configs = build_cost_graph(graph, topology, max_configs=max_configs, cost_model=ft_cost)
        dp_plan = data_parallel(graph, topology)
        dp_index = [
            next((s for s, c in enumerate(cs) if c == dp_plan.configs[op.name]), 0)
            for op, cs in zip(graph.ops, configs, strict=True)
        ]
        dp_time = sum(costs.node_time_s[v][s] for v, s in enumerate(dp_index)) + sum(
            costs.edge_time_s[e][dp_index[u], dp_index[v]][
                np.isfinite(costs.edge_time_s[e][dp_index[u], dp_index[v]])
            ].min()
            for e, (u, v) in enumerate(costs.edges)
        )
        dp_mem = sum(costs.node_memory_bytes[v][s] for v, s in enumerate(dp_index)) + sum(
            costs.edge_memory_bytes[e][dp_index[u], dp_index[v], 0] for e, (u, v) in enumerate(costs.edges)
        )
        dp = simulate(graph, topology, dp_plan, cost)
        rows = [("data parallel", dp_time, dp_mem, dp)]
        for mode in ("collectives", "point_to_point"):
            result = run_ft(
                graph, topology, max_configs=max_configs, tolerance=tolerance, rescheduling=mode, cost_model=ft_cost
            )
            best = result.fastest_within(device_memory_bytes(topology))
            label = "collectives" if mode == "collectives" else "point to point"
            if best is not None:
                rows.append(
                    (
                        f"FT mini-time ({label})",
                        best.time_s,
                        best.memory_bytes,
                        simulate(graph, topology, best.plan, cost),
                    )
                )
            else:
                least = result.points[0]
                rows.append(
                    (
                        f"FT least memory ({label}; none fits)",
                        least.time_s,
                        least.memory_bytes,
                        simulate(graph, topology, least.plan, cost),
                    )
                )
            picked = simulated_best(result, graph, topology, cost_model=cost)
            if picked is not None:
                rows.append(
                    (f"simulator's pick of the frontier ({label})", picked[0].time_s, picked[0].memory_bytes, picked[1])
                )
        for name, est_s, est_b, sim in rows:
            err = (est_s - sim.makespan_s) / sim.makespan_s
            speedup = dp.makespan_s / sim.makespan_s
            print(
                f"| {model} | {name} | {est_s * 1e3:,.1f} | {sim.makespan_s * 1e3:,.1f} | {err:+.0%} "
                f"| {speedup:.2f}x | {est_b / 2**30:.2f} | {sim.peak_memory_bytes.max() / 2**30:.2f} |",
                flush=True,
            )


def mixed_10g() -> object:
    """One machine of 4 V100-SXM2-32GB (NVLink) and three of 4 K80, every machine on 10 Gbit/s Ethernet."""
    from placement_rl.topology.builder import TopologyBuilder, switched_machine
    from placement_rl.topology.devices import gbit_to_bytes_per_s

    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    switched_machine(b, "V100-SXM2-32GB", 4, eth, nvlink_bytes_per_s=25e9)  # type: ignore[arg-type]
    for _ in range(3):
        switched_machine(b, "K80", 4, eth)  # type: ignore[arg-type]
    return b.build("mixed-10g")


def single_gpu_10g(n: int = 8) -> object:
    """``n`` machines of one V100-SXM2-16GB each on 10 Gbit/s Ethernet."""
    from placement_rl.topology.builder import TopologyBuilder, switched_machine
    from placement_rl.topology.devices import gbit_to_bytes_per_s

    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    for _ in range(n):
        switched_machine(b, "V100-SXM2-16GB", 1, eth)  # type: ignore[arg-type]
    return b.build(f"{n}x1-10g")


def devices_table(instances: list[str], max_configs: int | None, stage_meshes: int) -> None:
    """FT's pick per listing of each cluster: the first-n rule, device sets, a mesh per stage."""
    from placement_rl import simulate, zoo
    from placement_rl.plan.constructors import data_parallel
    from placement_rl.search.ft import pick_over_device_counts
    from placement_rl.search.ft.devices import DeviceRanking, DeviceSet, default_device_counts
    from placement_rl.topology import DeviceTopology, load_preset

    print(f"FT's pick (max {max_configs} configurations per op); ms per iteration, simulated")
    print()
    header = ["model", "cluster", "listing", "DP ms", "first n ms", "first n set", "device sets ms", "device set"]
    if stage_meshes:
        header += [f"stage meshes {stage_meshes} ms", "stage meshes set"]
    header += ["sets", "FT s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for instance in instances:
        model, _, cluster = instance.partition(":")
        graph = zoo.load(model)
        built = {"mixed-10g": mixed_10g, "8x1-10g": single_gpu_10g}.get(
            cluster, functools.partial(load_preset, cluster)
        )()
        assert isinstance(built, DeviceTopology)
        listings = (
            ("as built", built),
            ("reversed", DeviceTopology(built.name, tuple(reversed(built.devices)), built.links, built.switches)),
        )
        for listing, topology in listings:
            names = [d.name for d in topology.devices]
            rank = DeviceRanking(topology)
            first = [
                DeviceSet(tuple(names[:n]), "first", f"first {rank.label(names[:n])}")
                for n in default_device_counts(len(names))
            ]
            old = pick_over_device_counts(graph, topology, max_configs=max_configs, device_sets=first)
            start = time.perf_counter()
            new = pick_over_device_counts(graph, topology, max_configs=max_configs)
            seconds = time.perf_counter() - start
            dp = simulate(graph, topology, data_parallel(graph, topology)).makespan_s
            row = [model, cluster, listing, f"{dp * 1e3:,.1f}", f"{old.result.makespan_s * 1e3:,.1f}"]
            row += [old.device_set, f"{new.result.makespan_s * 1e3:,.1f}", new.device_set]
            if stage_meshes:
                staged = pick_over_device_counts(graph, topology, max_configs=max_configs, stage_meshes=stage_meshes)
                row += [f"{staged.result.makespan_s * 1e3:,.1f}", staged.device_set]
            row += [str(len(new.device_sets)), f"{seconds:.1f}"]
            print("| " + " | ".join(row) + " |", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_one"]:
        _, model, method, mc, tol = argv
        print(json.dumps(_one(model, method, int(mc) or None, float(tol))))
        return
    from placement_rl.cli.common import calibration_spec

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["time", "estimate", "devices"])
    parser.add_argument("--models", default="rnnlm,transformer,wideresnet")
    parser.add_argument("--max-configs", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=300.0, help="time: seconds per FT run")
    parser.add_argument("--network", default="flow", help="estimate: the simulator's network model")
    parser.add_argument(
        "--bucket-bytes", type=int, default=25 * 2**20, help="estimate: gradient bucket (0: per tensor)"
    )
    parser.add_argument(
        "--calibration",
        type=calibration_spec,
        default="default",
        help="estimate: the GPU model of FT and the simulator: default (calibrated, host lanes), roofline or a "
        "calibration .json (placement-rl calibrate --out FILE)",
    )
    parser.add_argument(
        "--instances", default="alexnet:mixed-10g,vgg16:tag-cloud,alexnet:8x1-10g", help="devices: model:cluster pairs"
    )
    parser.add_argument("--stage-meshes", type=int, default=1, help="devices: machines offered as stage meshes")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if args.what == "devices":
        devices_table(args.instances.split(","), args.max_configs or None, args.stage_meshes)
    elif args.what == "time":
        time_table(models, args.max_configs, args.timeout, args.tolerance)
    else:
        estimate_table(models, args.max_configs, args.tolerance, args.network, args.bucket_bytes, args.calibration)


if __name__ == "__main__":
    main()
