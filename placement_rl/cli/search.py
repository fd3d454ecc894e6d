"""``placement-rl search mcmc`` (FlexFlow's MCMC) and ``placement-rl frontier`` (TensorOpt's FT and its modes)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from placement_rl.cli.common import (
    PROPOSALS_HELP,
    budget,
    byte_size,
    chain_map,
    cost_model,
    cost_parser,
    finite_float,
    gib,
    instance_parser,
    int_list,
    json_parser,
    load_instance,
    ms,
    name_list,
    non_negative_int,
    optional_budget,
    path,
    positive_int,
    print_json,
    print_table,
    proposal_kinds,
)
from placement_rl.paths import output_file, output_folder, safe_name
from placement_rl.plots import format_bytes

#: ``--tempering`` / ``--chains``' bounds: :data:`placement_rl.methods.MAX_TEMPERING` and ``MAX_CHAINS``, as
#: the method's options are bounded (kept in step by a test; not imported, so ``--help`` stays fast).
MAX_TEMPERING = 64
MAX_CHAINS = 1024


def at_most(high: int, what: str) -> Any:
    """A ``type=`` converter: an integer from 1 to ``high`` (``what`` it counts, for the message)."""

    def convert(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from 1 to {high:,} ({what})")
        return value

    return convert


def interrupted_plan_path(graph: Any, topology: Any) -> Path:
    """Where ``search mcmc`` without ``--out`` writes the best plan when Ctrl-C stops it."""
    return Path("out") / safe_name(f"mcmc-{graph.name}-{topology.name}") / "best_plan.json"


def _proposals(count: int) -> str:
    return f"{count:,} proposal{'' if count == 1 else 's'}"


def cmd_search(args: argparse.Namespace) -> int | None:
    """``search mcmc``; Ctrl-C stops the search, writes the best plan so far and returns status 130."""
    from placement_rl.methods import baseline_plan
    from placement_rl.search import mcmc
    from placement_rl.sim import simulate

    graph, topology = load_instance(args)
    if args.out:
        output_file(args.out)  # before the search, not after it
    costs = cost_model(args, topology, graph)
    task_map = chain_map(args.chains, args.budget)
    if not args.json:
        stop = (
            "Ctrl-C stops it and keeps the best plan so far"
            if task_map is None
            else "chains run as Ray tasks; Ctrl-C stops them and keeps the best plan they reported"
        )
        print(
            f"searching {graph.name} x {topology.name} for {args.budget.describe()} per chain ({stop})",
            file=sys.stderr,
            flush=True,
        )
    found = mcmc(
        graph,
        topology,
        budget=args.budget,
        chains=args.chains,
        seed=args.seed,
        beta=args.beta,
        initial=args.initial,
        cost_model=costs,
        delta=not args.full_simulation,
        progress=not args.json,
        task_map=task_map,
        proposals=args.proposals,
        adaptive=args.adaptive,
        tempering=args.tempering,
        restart=args.restart,
        interruptible=True,
    )
    out = args.out
    if found.interrupted and not out:
        out = str(interrupted_plan_path(graph, topology))
        try:
            output_file(out, "the default output file")
        except ValueError as exc:
            lost = f"interrupted after {_proposals(found.proposals)}; the best plan so far is lost: {exc}"
            print(lost, file=sys.stderr)
            return 130
    dp = simulate(graph, topology, baseline_plan("data_parallel", graph, topology), costs)
    if out:
        found.plan.to_json(out)
    summary = {
        "model": graph.name,
        "topology": topology.name,
        **found.summary(),
        "data_parallel_makespan_s": dp.makespan_s,
        "speedup_over_dp": dp.makespan_s / found.result.makespan_s,
        "out": out,
    }
    status = None
    if found.interrupted:
        print(
            f"interrupted after {_proposals(found.proposals)}; best plan so far written to {out}",
            file=sys.stderr,
            flush=True,
        )
        status = 130
    if args.json:
        print_json(summary)
        return status
    r = found.result
    print(
        f"mcmc on {graph.name} x {topology.name}: {r.makespan_s * 1e3:.3f} ms/iter "
        f"({summary['speedup_over_dp']:.2f}x over data parallel at {dp.makespan_s * 1e3:.3f} ms)"
    )
    oom = ", ".join(r.oom_devices) if r.oom else "no"
    peak_gib = r.peak_memory_bytes.max() / 2**30
    print(f"  peak memory {peak_gib:.2f} GiB, OOM: {oom}, communication {r.comm_bytes / 1e9:.3f} GB")
    if found.chains == 1:
        spent = f"{found.search_s:.1f} s of search (+{max(0.0, found.elapsed_s - found.search_s):.1f} s preparing)"
    else:
        spent = f"{found.search_s:.1f} chain-seconds of search ({found.elapsed_s:.1f} s in all)"
    print(
        f"  {found.proposals:,} proposals in {spent}, {found.proposals_per_s:,.0f}/s, over {found.chains} "
        f"chain(s), acceptance {found.acceptance_rate:.1%}"
    )
    print("  initial candidates: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in found.initial_costs_s.items()))
    if out:
        print(f"  wrote {out}")
    return status


def _ft_options(args: argparse.Namespace, graph: Any, costs: Any) -> dict[str, Any]:
    """Keyword arguments of :func:`placement_rl.search.ft.run_ft` from the command line."""
    options: dict[str, Any] = {
        "method": args.method,
        "cost_model": costs,
        "max_configs": args.max_configs or None,
        "tolerance": args.tolerance,
        "rescheduling": args.rescheduling,
    }
    if args.ray:
        from placement_rl.rl.parallel import RayMap

        options["map_chunks"] = RayMap()
    return options


def cmd_frontier(args: argparse.Namespace) -> None:
    from placement_rl.io import write_json
    from placement_rl.methods import baseline_plan
    from placement_rl.plots import frontier_png, memory_unit, profiling_png
    from placement_rl.progress import step_progress
    from placement_rl.search import mcmc
    from placement_rl.search.ft import (
        FT_MAX_DEVICES,
        default_device_counts,
        device_memory_bytes,
        profiling,
        run_ft,
    )
    from placement_rl.sim import SimContext

    graph, topology = load_instance(args)
    costs = cost_model(args, topology)
    if args.devices is not None and args.devices > topology.num_devices:
        raise ValueError(f"--devices {args.devices}; topology {topology.name!r} has 1..{topology.num_devices} devices")
    # FT's cost graph grows as the square of the devices (placement_rl.search.ft.devices): refuse before any work
    used = args.devices or topology.num_devices
    if args.mode not in ("profiling", "mini-parallelism") and used > FT_MAX_DEVICES:
        given = f"--devices {args.devices}" if args.devices else f"all {used:,} devices of {topology.name!r}"
        raise ValueError(
            f"{given}: FT's cost graph grows as the square of the device count (it prices every layout change "
            f"over every pair of devices), {(used / FT_MAX_DEVICES) ** 2:,.0f}x the work of {FT_MAX_DEVICES:,} "
            f"devices here; frontier runs on at most {FT_MAX_DEVICES:,} devices: pass --devices {FT_MAX_DEVICES} "
            "(the fastest) or fewer"
        )
    too_many = [n for n in args.device_counts or [] if n > FT_MAX_DEVICES]
    if too_many:
        raise ValueError(
            f"--device-counts {too_many}: FT runs on at most {FT_MAX_DEVICES:,} devices (its cost graph grows as "
            f"the square of the device count); expected counts from 1 to {FT_MAX_DEVICES:,}"
        )
    out_dir = output_folder(args.out_dir or Path("out") / safe_name(f"frontier-{graph.name}-{topology.name}"))
    ctx = SimContext(graph, topology, costs)
    options = _ft_options(args, graph, costs)
    desc = f"FT-{args.method} {graph.name}"

    if args.mode in ("profiling", "mini-parallelism"):
        bad = [n for n in args.device_counts or [] if n > topology.num_devices]
        if bad:
            raise ValueError(f"--device-counts {bad}; topology {topology.name!r} has 1..{topology.num_devices} devices")
        found = []
        if not args.device_counts and topology.num_devices > FT_MAX_DEVICES and not args.json:
            print(
                f"FT runs on at most {FT_MAX_DEVICES:,} devices: counts up to {FT_MAX_DEVICES:,} of "
                f"{topology.name!r}'s {topology.num_devices:,} (--device-counts to choose)",
                file=sys.stderr,
            )
        for n in sorted(args.device_counts or default_device_counts(topology.num_devices, FT_MAX_DEVICES)):
            # One count at a time, so that each progress bar names its device count.
            with step_progress(graph.num_ops, f"{desc} x {n}", not args.json) as report:
                found += profiling(graph, topology, [n], args.memory_limit, progress=report, **options)
            if args.mode == "mini-parallelism" and found[-1][1] is not None:
                break
        rows = []
        for n, point, result in found:
            cap = device_memory_bytes(topology, n, costs) if args.memory_limit is None else args.memory_limit
            sim = ctx.simulate(point.plan) if point is not None else None
            rows.append(
                {
                    "devices": n,
                    "memory_limit_bytes": cap,
                    "frontier_points": len(result.points),
                    "search_s": result.search_s,
                    "exact": result.stats.exact,
                    "time_s": point.time_s if point else None,
                    "memory_bytes": point.memory_bytes if point else None,
                    "simulated_makespan_s": sim.makespan_s if sim else None,
                    "simulated_peak_memory_bytes": float(sim.peak_memory_bytes.max()) if sim else None,
                    "plan": point.plan.to_dict() if point else None,
                }
            )
        document = {
            "format": "placement_rl.ft_profile",
            "schema_version": 1,
            "model": graph.name,
            "topology": topology.name,
            "mode": args.mode,
            "method": args.method,
            "rows": rows,
        }
        write_json(out_dir / f"{args.mode}.json", document)
        png = None
        if args.mode == "profiling":
            png = profiling_png(
                [(r["devices"], r["time_s"]) for r in rows],
                out_dir / "profiling.png",
                title=f"FT profiling: {graph.name} on {topology.name}",
            )
        if args.json:
            print_json({**document, "files": [str(out_dir / f"{args.mode}.json")] + ([str(png)] if png else [])})
            return
        print(f"FT-{args.method} {args.mode} for {graph.name} on {topology.name}")
        print_table(
            ["GPUs", "FT time ms", "FT memory GiB", "simulated ms", "simulated GiB", "points", "search s"],
            [
                [
                    r["devices"],
                    ms(r["time_s"]),
                    gib(r["memory_bytes"]),
                    ms(r["simulated_makespan_s"]),
                    gib(r["simulated_peak_memory_bytes"]),
                    r["frontier_points"],
                    f"{r['search_s']:.2f}",
                ]
                for r in rows
            ],
        )
        if args.mode == "mini-parallelism":
            fit = rows[-1] if rows and rows[-1]["time_s"] is not None else None
            print(f"  fewest GPUs that fit: {fit['devices'] if fit else 'none (every count is out of memory)'}")
        print(f"  wrote {out_dir / f'{args.mode}.json'}" + (f" and {png}" if png else ""))
        return

    with step_progress(graph.num_ops, f"{desc} x {args.devices or topology.num_devices}", not args.json) as report:
        result = run_ft(graph, topology, args.devices, progress=report, **options)
    cap = device_memory_bytes(topology, args.devices, costs) if args.memory_limit is None else args.memory_limit
    best = result.fastest_within(cap)
    points = []
    for p in result.points:
        sim = ctx.simulate(p.plan)
        points.append(
            {
                "memory_bytes": p.memory_bytes,
                "time_s": p.time_s,
                "simulated_makespan_s": sim.makespan_s,
                "simulated_peak_memory_bytes": float(sim.peak_memory_bytes.max()),
                "simulated_oom": sim.oom,
                "fits": p.memory_bytes <= cap,
                "plan": p.plan.to_dict(),
                "reuse": p.reuse,
            }
        )
    baselines = {}
    for label, name in (("data parallel", "data_parallel"), ("expert", "expert")):
        r = ctx.simulate(baseline_plan(name, graph, topology))
        baselines[label] = (float(r.peak_memory_bytes.max()), r.makespan_s)
    if args.mcmc_budget is not None:
        found_mcmc = mcmc(graph, topology, budget=args.mcmc_budget, cost_model=costs, progress=not args.json)
        baselines["MCMC"] = (float(found_mcmc.result.peak_memory_bytes.max()), found_mcmc.result.makespan_s)
    s = result.stats
    document = {
        "format": "placement_rl.frontier",
        "schema_version": 1,
        "model": graph.name,
        "topology": topology.name,
        "method": args.method,
        "devices": result.points[0].num_devices if result.points else None,
        "memory_limit_bytes": cap,
        "exact": s.exact,
        "search_s": result.search_s,
        "eliminations": {
            "node": s.node,
            "edge": s.edge,
            "branch": s.branch,
            "heuristic": s.heuristic,
            "ldp_steps": s.ldp_steps,
        },
        "baselines": {
            k: {"simulated_peak_memory_bytes": m, "simulated_makespan_s": t} for k, (m, t) in baselines.items()
        },
        "points": points,
    }
    write_json(out_dir / "frontier.json", document)
    png = frontier_png(
        [(p.memory_bytes, p.time_s) for p in result.points],
        out_dir / "frontier.png",
        simulated=[(q["simulated_peak_memory_bytes"], q["simulated_makespan_s"]) for q in points],
        baselines=baselines,
        memory_limit_bytes=cap,
        title=f"FT-{args.method}: {graph.name} on {topology.name}",
    )
    if best is not None:
        best.plan.to_json(out_dir / "mini_time_plan.json")
    if args.json:
        print_json(
            {k: v for k, v in document.items() if k != "points"}
            | {
                "frontier": [{k: v for k, v in q.items() if k != "plan"} for q in points],
                "files": [str(out_dir / "frontier.json"), str(png)],
            }
        )
        return
    exactness = "exact" if s.exact else f"{s.heuristic} heuristic eliminations"
    print(
        f"FT-{args.method} frontier for {graph.name} on {topology.name} ({document['devices']} GPUs): "
        f"{len(points)} points in {result.search_s:.2f} s ({exactness}; "
        f"node {s.node}, edge {s.edge}, branch {s.branch}, LDP steps {s.ldp_steps})"
    )
    dp_s = baselines["data parallel"][1]
    fitting = [q for q in points if not q["simulated_oom"]]
    if fitting:
        top = min(fitting, key=lambda q: q["simulated_makespan_s"])
        print(
            f"  the simulator's best point: {top['simulated_makespan_s'] * 1e3:.2f} ms, "
            f"{dp_s / top['simulated_makespan_s']:.2f}x data parallelism ({dp_s * 1e3:.2f} ms), "
            f"peak {format_bytes(top['simulated_peak_memory_bytes'])} per device"
        )
    else:
        print("  the simulator finds no frontier point that fits in memory")
    scale, unit = memory_unit(max((q["memory_bytes"] for q in points), default=2**30))
    print_table(
        [f"memory {unit}", "time ms", "simulated ms", f"simulated {unit}", "fits"],
        [
            [
                f"{q['memory_bytes'] / scale:.2f}",
                ms(q["time_s"]),
                ms(q["simulated_makespan_s"]),
                f"{q['simulated_peak_memory_bytes'] / scale:.2f}",
                "yes" if q["fits"] else "no",
            ]
            for q in points
        ],
    )
    for label, (m, t) in baselines.items():
        print(f"  {label}: {t * 1e3:.2f} ms, {format_bytes(m)} (simulated)")
    if best is None:
        print(f"  mini-time: no strategy fits in {cap / 2**30:.2f} GiB per device (out of memory)")
    else:
        print(
            f"  mini-time under {cap / 2**30:.2f} GiB: {best.time_s * 1e3:.2f} ms (FT estimate); "
            f"wrote {out_dir / 'mini_time_plan.json'}"
        )
    print(f"  wrote {out_dir / 'frontier.json'} and {png}")


def add_commands(sub: Any) -> None:
    """Add this module's commands to the ``placement-rl`` sub-parsers."""
    js, cost = json_parser(), cost_parser()
    p = sub.add_parser(
        "search",
        parents=[instance_parser(), cost, js],
        help="search for a plan: 'search mcmc' (FlexFlow's MCMC with delta simulation); Ctrl-C stops it, writes the "
        "best plan so far (to --out, else out/mcmc-MODEL-TOPOLOGY/best_plan.json) and exits with status 130",
    )
    p.add_argument("algorithm", choices=["mcmc"], help="the search algorithm")
    p.add_argument(
        "--budget",
        type=budget,
        default="30s",
        help="per chain: seconds ('30s', '2m', '1.5h'; at most 30 days) or proposals ('100000'; at most a billion)",
    )
    p.add_argument(
        "--chains",
        type=at_most(MAX_CHAINS, "chains"),
        default=1,
        help=f"independent chains, at most {MAX_CHAINS:,}; more than one run as Ray tasks (Ctrl-C keeps the best "
        "plan they reported, at most about a second old)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beta", type=finite_float, default=50.0, help="scale-free inverse temperature")
    p.add_argument("--full-simulation", action="store_true", help="evaluate proposals by full simulation (slower)")
    p.add_argument(
        "--proposals",
        type=proposal_kinds,
        default="coordinated",
        help=PROPOSALS_HELP,
    )
    p.add_argument(
        "--restart",
        type=positive_int,
        default=None,
        help="return every replica to the best plan after this many proposals without progress (default: never)",
    )
    p.add_argument(
        "--adaptive",
        type=float,
        default=None,
        help="adapt the temperature toward this rate of accepted worse proposals (e.g. 0.1; default: fixed beta)",
    )
    p.add_argument(
        "--tempering",
        type=at_most(MAX_TEMPERING, "parallel-tempering replicas per chain"),
        default=1,
        help=f"parallel-tempering replicas per chain, 1 to {MAX_TEMPERING} (default 1: none)",
    )
    p.add_argument(
        "--initial",
        type=name_list,
        default="data_parallel,expert,random,subset_data_parallel",
        help="initial candidates (default all four, as plan): data_parallel, expert, random (FlexFlow's three) "
        "and subset_data_parallel",
    )
    p.add_argument("--out", type=path, default=None, help="write the best plan (JSON) here")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser(
        "frontier",
        parents=[instance_parser("transformer", "tensoropt"), cost, js],
        help="TensorOpt's FT: the memory vs time cost frontier and its modes",
    )
    p.add_argument(
        "--mode",
        default="frontier",
        choices=["frontier", "mini-time", "mini-parallelism", "profiling"],
        help="frontier (all points; mini-time marked), mini-time, mini-parallelism or profiling",
    )
    p.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        help="devices in use: the N fastest (default all; FT takes at most 512)",
    )
    p.add_argument(
        "--device-counts",
        type=int_list,
        default=None,
        help="profiling / mini-parallelism: comma-separated counts (default 1,2,4,.. up to all or 512)",
    )
    p.add_argument(
        "--memory-limit",
        type=byte_size,
        default=None,
        help="per-device memory limit, GiB or with a unit (default: device memory)",
    )
    p.add_argument("--method", default="ldp", choices=["ldp", "elimination"], help="FT-LDP (default) or FT-Elimination")
    p.add_argument(
        "--max-configs",
        type=non_negative_int,
        default=16,
        help="configurations per op (default 16, replication and data parallelism always kept; 0 = all)",
    )
    p.add_argument(
        "--tolerance",
        type=finite_float,
        default=0.01,
        help="relative time resolution of the frontier (default 0.01; 0 = exact, slow on large graphs)",
    )
    p.add_argument(
        "--rescheduling",
        default="collectives",
        choices=["collectives", "point_to_point"],
        help="price layout changes as collectives (TensorOpt, default) or point to point (the simulator)",
    )
    p.add_argument(
        "--mcmc-budget",
        type=optional_budget,
        default="5s",
        help="MCMC baseline budget for the frontier plot ('none' to skip)",
    )
    p.add_argument("--ray", action="store_true", help="split large frontier products over Ray tasks")
    p.add_argument("--out-dir", type=path, default=None, help="where frontier.json, the PNG and the mini-time plan go")
    p.set_defaults(func=cmd_frontier)
