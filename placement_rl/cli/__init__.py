"""The ``placement-rl`` command line.

Every sub-command prints a human-readable table by default and JSON with ``--json``. Bad input (an
unknown model, topology or option, a malformed file) prints one ``error:`` line naming the bad value
and what was expected, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _cmd_models(args: argparse.Namespace) -> None:
    from placement_rl import zoo

    rows = [zoo.spec(n) for n in zoo.names()]
    stats = {m.name: _graph_stats(zoo.load(m.name)) for m in rows} if args.stats else {}
    if args.json:
        _print_json(
            [
                {
                    "name": m.name,
                    "default_batch_size": m.default_batch_size,
                    "source": m.source,
                    "description": m.description,
                    "options": m.options,
                    **stats.get(m.name, {}),
                }
                for m in rows
            ]
        )
        return
    if args.stats:
        _print_table(
            ["model", "batch", "ops", "params MiB", "fwd GFLOP", "bwd GFLOP", "source"],
            [
                [
                    m.name,
                    m.default_batch_size,
                    stats[m.name]["ops"],
                    f"{stats[m.name]['param_bytes'] / 2**20:,.1f}",
                    f"{stats[m.name]['forward_flops'] / 1e9:,.1f}",
                    f"{stats[m.name]['backward_flops'] / 1e9:,.1f}",
                    m.source,
                ]
                for m in rows
            ],
        )
        return
    _print_table(
        ["model", "batch", "source", "description"],
        [[m.name, m.default_batch_size, m.source, m.description] for m in rows],
    )


def _graph_stats(graph: Any) -> dict[str, Any]:
    return {
        "ops": graph.num_ops,
        "param_bytes": graph.param_bytes,
        "forward_flops": graph.forward_flops,
        "backward_flops": graph.backward_flops,
    }


def _cmd_topologies(args: argparse.Namespace) -> None:
    from placement_rl.topology import load_preset, preset_names

    topologies = [load_preset(n) for n in preset_names()]
    if args.json:
        _print_json(
            [
                {
                    "name": t.name,
                    "devices": t.num_devices,
                    "machines": len(t.machines()),
                    "device_types": sorted({d.device_type for d in t.devices}),
                }
                for t in topologies
            ]
        )
        return
    _print_table(
        ["topology", "machines", "devices", "device types"],
        [
            [t.name, len(t.machines()), t.num_devices, ", ".join(sorted({d.device_type for d in t.devices}))]
            for t in topologies
        ],
    )


def load_graph(spec: str, batch_size: int | None = None) -> Any:
    """A zoo model name or a path to a graph JSON file."""
    from placement_rl import zoo
    from placement_rl.graph import OpGraph

    if spec.endswith(".json") or Path(spec).is_file():
        if batch_size is not None:
            raise ValueError("--batch-size applies to zoo models, not to graph files")
        return OpGraph.from_json(spec)
    return zoo.load(spec, batch_size=batch_size)


def _cmd_show_graph(args: argparse.Namespace) -> None:
    graph = load_graph(args.model, args.batch_size)
    if args.coarsen:
        from placement_rl.graph.coarsen import coarsen

        graph = coarsen(graph, args.coarsen)
    if args.out:
        graph.to_json(args.out)
    if args.json:
        _print_json(graph.to_dict())
        return
    print(graph.summary())
    if args.out:
        print(f"  wrote {args.out}")
    if args.ops:
        _print_table(
            ["op", "type", "output", "fwd GFLOP", "params MiB", "parallel dims", "split"],
            [
                [
                    op.name,
                    op.op_type,
                    "x".join(map(str, op.output_shapes[0])) or "scalar",
                    f"{op.forward_flops / 1e9:.3f}",
                    f"{op.param_bytes / 2**20:.2f}",
                    ",".join(f"{d.name}:{d.kind[0]}{'(red)' if d.reduction else ''}" for d in op.parallel_dims),
                    op.split,
                ]
                for op in graph.ops
            ],
        )


def _cmd_show_topology(args: argparse.Namespace) -> None:
    from placement_rl.topology import resolve_topology

    topology = resolve_topology(args.topology)
    if args.out:
        topology.to_json(args.out)
    if args.json:
        _print_json(topology.to_dict())
        return
    print(topology.summary())


def _cost_model(args: argparse.Namespace) -> Any:
    from placement_rl.sim.cost import CommTable, CostModel, ProfileTable

    return CostModel(
        optimizer=args.optimizer,
        profile=ProfileTable.from_json(args.profile) if args.profile else None,
        comm_table=CommTable.from_json(args.comm_table) if args.comm_table else None,
    )


def _plan_for(name: str, graph: Any, topology: Any) -> Any:
    """A named constructor (``single``, ``dp``, ``expert``, ``layerwise``) or a plan JSON file."""
    from placement_rl.errors import UnknownNameError
    from placement_rl.plan import Plan, constructors

    builders = constructors()
    if name in builders:
        return builders[name](graph, topology)
    if name.endswith(".json") or Path(name).is_file():
        plan = Plan.from_json(name)
        if plan.graph_name != graph.name:
            raise ValueError(f"plan {name!r} was made for graph {plan.graph_name!r}, not {graph.name!r}")
        return plan
    raise UnknownNameError("plan", name, [*builders, "FILE.json"])


def _result_row(method: str, result: Any, batch: int, dp_makespan_s: float | None, search_s: float) -> dict[str, Any]:
    return {
        "method": method,
        "makespan_s": result.makespan_s,
        "samples_per_s": result.samples_per_s(batch),
        "speedup_over_dp": (dp_makespan_s / result.makespan_s) if dp_makespan_s and result.makespan_s else None,
        "max_peak_memory_bytes": int(result.peak_memory_bytes.max()),
        "peak_memory_bytes": {d: int(m) for d, m in zip(result.device_names, result.peak_memory_bytes)},
        "comm_bytes": result.comm_bytes,
        "oom": result.oom,
        "oom_devices": list(result.oom_devices),
        "devices_used": int((result.busy_s > 0).sum()),
        "search_s": search_s,
    }


def _write_outputs(out_dir: Path, stem: str, plan: Any, result: Any, title: str) -> list[Path]:
    from placement_rl.sim.trace import gantt_png, write_chrome_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.gantt.png", out_dir / f"{stem}.trace.json"]
    plan.to_json(paths[0])
    gantt_png(result, paths[1], title=title)
    write_chrome_trace(result, paths[2], title=title)
    return paths


def _policy_plan(checkpoint: str, model: str, topology: str, batch_size: int | None) -> Any:
    """The plan a trained policy makes for a zoo model on a topology (greedy decoding)."""
    import gymnasium as gym

    from placement_rl.rl.trinity import load_policy, policy_plan

    module, cfg = load_policy(checkpoint)
    env_config = {k: v for k, v in cfg.env.items() if k != "generator"}
    generator = {"kind": "fixed", "model": model, "topology": topology, "batch_size": batch_size}
    env = gym.make("placement_rl/Placement-v0", config={**env_config, "generator": generator})
    return policy_plan(module, env)["plan"]


def _ft_plan(graph: Any, topology: Any, cost_model: Any, max_configs: int, progress: bool) -> Any:
    """FT for 1, 2, 4, ... and all devices; the frontier plan the simulator finds fastest and fitting
    (else FT's least-memory point over all devices, which the table then reports as OOM)."""
    from placement_rl.progress import step_progress
    from placement_rl.search.ft import best_over_device_counts, run_ft

    with step_progress(graph.num_ops, "FT", progress) as report:
        found = best_over_device_counts(
            graph, topology, cost_model=cost_model, max_configs=max_configs, progress=report
        )
        if found is not None:
            return found[1].plan
        return run_ft(graph, topology, cost_model=cost_model, max_configs=max_configs).points[0].plan


def _cmd_plan(args: argparse.Namespace) -> None:
    import time

    from placement_rl.plan import constructors
    from placement_rl.sim.simulator import SimContext
    from placement_rl.topology import resolve_topology

    graph = load_graph(args.model, args.batch_size)
    topology = resolve_topology(args.topology)
    ctx = SimContext(graph, topology, _cost_model(args))
    rows, results = [], {}
    methods = args.methods.split(",") if args.methods else [*constructors(), "mcmc", "ft"]
    if args.checkpoint:
        methods.append("policy")
    ctx.simulate(constructors()["single"](graph, topology))  # compile the kernels outside the timed methods
    for method in ["dp", *[m for m in methods if m != "dp"]]:
        start = time.perf_counter()
        if method == "mcmc":
            from placement_rl.search import mcmc
            from placement_rl.search.mcmc import EXTENDED_CANDIDATES

            found = mcmc(
                graph,
                topology,
                budget=args.mcmc_budget,
                chains=args.chains,
                seed=args.seed,
                initial=EXTENDED_CANDIDATES,
                cost_model=ctx.cost,
                progress=not args.json,
            )
            plan, result = found.plan, found.result
        elif method == "policy":
            plan = _policy_plan(args.checkpoint, args.model, args.topology, args.batch_size)
            result = ctx.simulate(plan)
        elif method == "ft":
            plan = _ft_plan(graph, topology, ctx.cost, args.ft_max_configs, progress=not args.json)
            result = ctx.simulate(plan)
        else:
            plan = _plan_for(method, graph, topology)
            result = ctx.simulate(plan)
        elapsed = time.perf_counter() - start
        results[method] = (plan, result)
        rows.append(_result_row(method, result, graph.batch_size or 1, results["dp"][1].makespan_s, elapsed))
    if "dp" not in methods:
        rows = [r for r in rows if r["method"] != "dp"] or rows
    fitting = [r for r in rows if not r["oom"]]
    best = min(fitting or rows, key=lambda r: r["makespan_s"])
    out_dir = Path(args.out_dir or f"out/plan-{graph.name}-{topology.name}")
    plan, result = results[best["method"]]
    title = f"{graph.name} on {topology.name}: {best['method']} ({result.makespan_s * 1e3:.1f} ms/iter)"
    paths = _write_outputs(out_dir, "best_plan", plan, result, title)
    if args.json:
        _print_json(
            {
                "model": graph.name,
                "topology": topology.name,
                "best": best["method"],
                "methods": rows,
                "files": [str(p) for p in paths],
            }
        )
        return
    print(
        f"{graph.name} (batch {graph.batch_size}, {graph.num_ops} ops) on {topology.name} ({topology.num_devices} GPUs)"
    )
    _print_table(
        ["method", "ms/iter", "samples/s", "vs DP", "peak mem GiB", "comm GB", "GPUs", "OOM", "search s"],
        [
            [
                r["method"],
                f"{r['makespan_s'] * 1e3:,.2f}",
                f"{r['samples_per_s']:,.0f}",
                f"{r['speedup_over_dp']:.2f}x" if r["speedup_over_dp"] else "-",
                f"{r['max_peak_memory_bytes'] / 2**30:.2f}",
                f"{r['comm_bytes'] / 1e9:.3f}",
                r["devices_used"],
                ",".join(r["oom_devices"]) if r["oom"] else "no",
                f"{r['search_s']:.2f}",
            ]
            for r in rows
        ],
    )
    print(f"best (fits in memory, lowest makespan): {best['method']}")
    for p in paths:
        print(f"  wrote {p}")


def _cmd_simulate(args: argparse.Namespace) -> None:
    from placement_rl.sim.simulator import simulate
    from placement_rl.topology import resolve_topology

    graph = load_graph(args.model, args.batch_size)
    topology = resolve_topology(args.topology)
    plan = _plan_for(args.plan, graph, topology)
    result = simulate(graph, topology, plan, _cost_model(args))
    title = f"{graph.name} on {topology.name}: {plan.name} ({result.makespan_s * 1e3:.1f} ms/iter)"
    if args.trace:
        from placement_rl.sim.trace import write_chrome_trace

        write_chrome_trace(result, args.trace, title=title)
    if args.gantt:
        from placement_rl.sim.trace import gantt_png

        gantt_png(result, args.gantt, title=title)
    summary = {
        "model": graph.name,
        "topology": topology.name,
        "plan": plan.name,
        **result.summary(),
        "samples_per_s": result.samples_per_s(graph.batch_size or 1),
    }
    if args.json:
        _print_json(summary)
        return
    print(title)
    print(
        f"  samples/s {summary['samples_per_s']:,.1f}; {result.num_tasks:,} tasks; OOM: "
        f"{', '.join(result.oom_devices) if result.oom else 'no'}"
    )
    print(f"  communication {result.comm_bytes / 1e9:.3f} GB in {result.comm_time_s * 1e3:.2f} ms of transfers")
    _print_table(
        ["device", "busy ms", "idle ms", "peak GiB", "memory GiB"],
        [
            [d, f"{b * 1e3:.2f}", f"{i * 1e3:.2f}", f"{p / 2**30:.2f}", f"{c / 2**30:.0f}"]
            for d, b, i, p, c in zip(
                result.device_names,
                result.busy_s,
                result.idle_s,
                result.peak_memory_bytes,
                result.memory_capacity_bytes,
            )
        ],
    )
    for path in (args.trace, args.gantt):
        if path:
            print(f"  wrote {path}")


def _cmd_profile(args: argparse.Namespace) -> None:
    from placement_rl import zoo
    from placement_rl.profiling import profile_models

    models = args.models.split(",") if args.models else zoo.names()
    splits = [int(k) for k in args.splits.split(",")]
    table = profile_models(
        models,
        batch_size=args.batch_size,
        batch_splits=splits,
        device=args.device,
        device_type=args.device_type,
        repeats=args.repeats,
        progress=not args.json,
    )
    table.to_json(args.out)
    device_types = sorted({key[0] for key in table.entries})
    if args.json:
        _print_json({"out": args.out, "entries": len(table), "device_types": device_types, "models": models})
        return
    print(f"profiled {len(table)} op shapes of {len(models)} model(s) on {args.device} ({', '.join(device_types)})")
    print(f"  wrote {args.out}; use it with --profile {args.out}")


def _cmd_search(args: argparse.Namespace) -> None:
    from placement_rl.plan import data_parallel
    from placement_rl.search import mcmc
    from placement_rl.sim.simulator import simulate
    from placement_rl.topology import resolve_topology

    graph = load_graph(args.model, args.batch_size)
    topology = resolve_topology(args.topology)
    cost_model = _cost_model(args)
    found = mcmc(
        graph,
        topology,
        budget=args.budget,
        chains=args.chains,
        seed=args.seed,
        beta=args.beta,
        initial=args.initial.split(","),
        cost_model=cost_model,
        delta=not args.full_simulation,
        progress=not args.json,
    )
    dp = simulate(graph, topology, data_parallel(graph, topology), cost_model)
    if args.out:
        found.plan.to_json(args.out)
    summary = {
        "model": graph.name,
        "topology": topology.name,
        **found.summary(),
        "data_parallel_makespan_s": dp.makespan_s,
        "speedup_over_dp": dp.makespan_s / found.result.makespan_s,
        "out": args.out,
    }
    if args.json:
        _print_json(summary)
        return
    r = found.result
    print(
        f"mcmc on {graph.name} x {topology.name}: {r.makespan_s * 1e3:.3f} ms/iter "
        f"({summary['speedup_over_dp']:.2f}x over data parallel at {dp.makespan_s * 1e3:.3f} ms)"
    )
    print(
        f"  peak memory {r.peak_memory_bytes.max() / 2**30:.2f} GiB, OOM: {', '.join(r.oom_devices) if r.oom else 'no'}, "
        f"communication {r.comm_bytes / 1e9:.3f} GB"
    )
    print(
        f"  {found.proposals:,} proposals in {found.elapsed_s:.1f} s ({found.proposals_per_s:,.0f}/s) over "
        f"{found.chains} chain(s), acceptance {found.acceptance_rate:.1%}"
    )
    print("  initial candidates: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in found.initial_costs_s.items()))
    if args.out:
        print(f"  wrote {args.out}")


def _memory_limit(text: str | None) -> float | None:
    """``--memory-limit``: GiB as a number (``16``) or with a unit (``16GiB``, ``512MiB``)."""
    if text is None:
        return None
    units = {"gib": 2**30, "mib": 2**20, "gb": 1e9, "mb": 1e6}
    lowered = text.strip().lower()
    scale = next((v for k, v in units.items() if lowered.endswith(k)), None)
    number = lowered[: -len(next(k for k in units if lowered.endswith(k)))] if scale else lowered
    try:
        value = float(number) * (scale or 2**30)
    except ValueError:
        raise ValueError(
            f"--memory-limit {text!r}; expected GiB as a number or with a unit, e.g. 16, 16GiB, 512MiB"
        ) from None
    if value <= 0:
        raise ValueError(f"--memory-limit {text!r}; expected a positive amount")
    return value


def _ft_run(args: argparse.Namespace, graph: Any, topology: Any, devices: int | None, cost_model: Any) -> Any:
    from placement_rl.progress import step_progress
    from placement_rl.search.ft import run_ft

    if args.ray:
        from placement_rl.rl.parallel import ft_frontier

        return ft_frontier(
            graph,
            topology,
            devices,
            method=args.method,
            cost_model=cost_model,
            max_configs=args.max_configs,
            progress=not args.json,
            tolerance=args.tolerance,
            rescheduling=args.rescheduling,
        )
    desc = f"FT-{args.method} {graph.name} x {devices or topology.num_devices}"
    with step_progress(graph.num_ops, desc, not args.json) as report:
        return run_ft(
            graph,
            topology,
            devices,
            method=args.method,
            cost_model=cost_model,
            max_configs=args.max_configs,
            progress=report,
            tolerance=args.tolerance,
            rescheduling=args.rescheduling,
        )


def _cmd_frontier(args: argparse.Namespace) -> None:
    from placement_rl.io import write_json
    from placement_rl.plan import data_parallel, expert
    from placement_rl.plots import frontier_png, profiling_png
    from placement_rl.search.ft import default_device_counts, device_memory_bytes
    from placement_rl.sim.simulator import SimContext
    from placement_rl.topology import resolve_topology

    graph = load_graph(args.model, args.batch_size)
    topology = resolve_topology(args.topology)
    cost_model = _cost_model(args)
    limit = _memory_limit(args.memory_limit)
    if args.max_configs < 0:
        raise ValueError(f"--max-configs {args.max_configs}; expected a positive count, or 0 for all")
    args.max_configs = args.max_configs or None
    out_dir = Path(args.out_dir or f"out/frontier-{graph.name}-{topology.name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = SimContext(graph, topology, cost_model)
    if args.devices is not None and not 1 <= args.devices <= topology.num_devices:
        raise ValueError(f"--devices {args.devices}; topology {topology.name!r} has 1..{topology.num_devices} devices")
    if args.mode == "profiling" or args.mode == "mini-parallelism":
        counts = (
            [int(x) for x in args.device_counts.split(",")]
            if args.device_counts
            else default_device_counts(topology.num_devices)
        )
        bad = [n for n in counts if not 1 <= n <= topology.num_devices]
        if bad:
            raise ValueError(f"--device-counts {bad}; topology {topology.name!r} has 1..{topology.num_devices} devices")
        rows = []
        for n in sorted(counts):
            result = _ft_run(args, graph, topology, n, cost_model)
            cap = device_memory_bytes(topology, n) if limit is None else limit
            point = result.fastest_within(cap)
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
            if args.mode == "mini-parallelism" and point is not None:
                break
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
            _print_json({**document, "files": [str(out_dir / f"{args.mode}.json")] + ([str(png)] if png else [])})
            return
        print(f"FT-{args.method} {args.mode} for {graph.name} on {topology.name}")
        _print_table(
            ["GPUs", "FT time ms", "FT memory GiB", "simulated ms", "simulated GiB", "points", "search s"],
            [
                [
                    r["devices"],
                    _ms(r["time_s"]),
                    _gib(r["memory_bytes"]),
                    _ms(r["simulated_makespan_s"]),
                    _gib(r["simulated_peak_memory_bytes"]),
                    r["frontier_points"],
                    f"{r['search_s']:.2f}",
                ]
                for r in rows
            ],
        )
        if args.mode == "mini-parallelism":
            found = next((r for r in rows if r["time_s"] is not None), None)
            print(f"  fewest GPUs that fit: {found['devices'] if found else 'none (every count is out of memory)'}")
        print(f"  wrote {out_dir / f'{args.mode}.json'}" + (f" and {png}" if png else ""))
        return

    result = _ft_run(args, graph, topology, args.devices, cost_model)
    cap = device_memory_bytes(topology, args.devices) if limit is None else limit
    best = result.fastest_within(cap)
    points = []
    for k, p in enumerate(result.points):
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
    for name, make in (("data parallel", data_parallel), ("expert", expert)):
        r = ctx.simulate(make(graph, topology))
        baselines[name] = (float(r.peak_memory_bytes.max()), r.makespan_s)
    if args.mcmc_budget not in ("0", "none"):
        from placement_rl.search import mcmc

        found = mcmc(graph, topology, budget=args.mcmc_budget, cost_model=cost_model, progress=not args.json)
        baselines["MCMC"] = (float(found.result.peak_memory_bytes.max()), found.result.makespan_s)
    document = {
        "format": "placement_rl.frontier",
        "schema_version": 1,
        "model": graph.name,
        "topology": topology.name,
        "method": args.method,
        "devices": result.points[0].num_devices if result.points else None,
        "memory_limit_bytes": cap,
        "exact": result.stats.exact,
        "search_s": result.search_s,
        "eliminations": {
            "node": result.stats.node,
            "edge": result.stats.edge,
            "branch": result.stats.branch,
            "heuristic": result.stats.heuristic,
            "ldp_steps": result.stats.ldp_steps,
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
        _print_json(
            {k: v for k, v in document.items() if k != "points"}
            | {
                "frontier": [{k: v for k, v in q.items() if k != "plan"} for q in points],
                "files": [str(out_dir / "frontier.json"), str(png)],
            }
        )
        return
    s = result.stats
    print(
        f"FT-{args.method} frontier for {graph.name} on {topology.name} ({document['devices']} GPUs): "
        f"{len(points)} points in {result.search_s:.2f} s ({'exact' if s.exact else f'{s.heuristic} heuristic eliminations'}; "
        f"node {s.node}, edge {s.edge}, branch {s.branch}, LDP steps {s.ldp_steps})"
    )
    _print_table(
        ["memory GiB", "time ms", "simulated ms", "simulated GiB", "fits"],
        [
            [
                _gib(q["memory_bytes"]),
                _ms(q["time_s"]),
                _ms(q["simulated_makespan_s"]),
                _gib(q["simulated_peak_memory_bytes"]),
                "yes" if q["fits"] else "no",
            ]
            for q in points
        ],
    )
    for name, (m, t) in baselines.items():
        print(f"  {name}: {t * 1e3:.2f} ms, {m / 2**30:.2f} GiB (simulated)")
    if best is None:
        print(f"  mini-time: no strategy fits in {cap / 2**30:.2f} GiB per device (out of memory)")
    else:
        print(
            f"  mini-time under {cap / 2**30:.2f} GiB: {best.time_s * 1e3:.2f} ms (FT estimate); "
            f"wrote {out_dir / 'mini_time_plan.json'}"
        )
    print(f"  wrote {out_dir / 'frontier.json'} and {png}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.2f}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def _cmd_train(args: argparse.Namespace) -> None:
    from placement_rl.rl.config import load_train_config
    from placement_rl.rl.trinity import train

    cfg = load_train_config(args.config)
    if args.iterations is not None:
        import dataclasses

        if args.iterations < 1:
            raise ValueError(f"--iterations {args.iterations}; expected at least 1")
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, iterations=args.iterations))
    run_dir = train(cfg, out_dir=args.out_dir)
    print(f"wrote {run_dir} (checkpoint_final/, progress.csv, tb/, learning_curve.png)")


def _cmd_tune(args: argparse.Namespace) -> None:
    from placement_rl.rl.config import load_sweep_config
    from placement_rl.rl.trinity import sweep

    out = sweep(load_sweep_config(args.config))
    print(f"wrote {out / 'results.csv'} and {out / 'best_config.yaml'}")


def _topology_list(spec: str) -> list[str]:
    from placement_rl.topology import topology_seeds

    if spec in ("test", "train"):
        return [f"random:{s}" for s in topology_seeds(spec, 10)]  # type: ignore[arg-type]
    if spec.startswith(("test:", "train:")):
        split, _, count = spec.partition(":")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--topologies {spec!r}: expected '{split}:COUNT' with a positive COUNT")
        return [f"random:{s}" for s in topology_seeds(split, int(count))]  # type: ignore[arg-type]
    return spec.split(",")


def _cmd_evaluate(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from placement_rl.rl.evaluate import evaluate

    models = args.models.split(",") if args.models else None
    budget = None if args.mcmc_budget in ("0", "none") else args.mcmc_budget
    rows = evaluate(
        args.checkpoint,
        _topology_list(args.topologies),
        models,
        mcmc_budget=budget,
        progress=None if args.json else lambda line: print(line, file=sys.stderr),
    )
    instances = sorted({r.instance for r in rows})
    wins = sum(
        1 for i in instances for p in rows if p.instance == i and p.method == "policy" and not p.oom and p.speedup > 1.0
    )
    if args.json:
        _print_json({"rows": [asdict(r) for r in rows], "instances": len(instances), "policy_beats_dp": wins})
        return
    _print_table(
        ["instance", "method", "ms/iter", "vs DP", "peak mem GiB", "comm GB", "OOM", "search s"],
        [
            [
                r.instance,
                r.method,
                f"{r.makespan_s * 1e3:,.2f}",
                f"{r.speedup:.2f}x",
                f"{r.peak_memory_bytes / 2**30:.2f}",
                f"{r.comm_bytes / 1e9:.3f}",
                "yes" if r.oom else "no",
                f"{r.search_s:.2f}",
            ]
            for r in rows
        ],
    )
    print(f"policy beats data parallel on {wins}/{len(instances)} instances (MCMC budget {budget or 'off'})")


def _add_cost_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the paper's)")
    p.add_argument("--optimizer", default="adam", help="optimizer whose state counts in memory (default adam)")
    p.add_argument("--profile", default=None, help="profiled op times (placement-rl profile --out FILE)")
    p.add_argument("--comm-table", default=None, help="profiled bandwidth table (JSON, see docs/formats.md)")
    p.add_argument("--json", action="store_true", help="print JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="placement-rl",
        description="Place and shard deep-learning training graphs on GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--stats", action="store_true", help="import every model and show ops, parameters and FLOPs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("topologies", help="list the preset device topologies")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_topologies)

    p = sub.add_parser("show-graph", help="import a zoo model (or read a graph JSON) and describe it")
    p.add_argument("model", help="zoo model name (see 'placement-rl models') or a graph .json file")
    p.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the paper's)")
    p.add_argument("--coarsen", type=int, default=0, metavar="N", help="group the ops into at most N groups (METIS)")
    p.add_argument("--ops", action="store_true", help="also list every op")
    p.add_argument("--out", default=None, help="write the graph as JSON to this path")
    p.add_argument("--json", action="store_true", help="print the graph document as JSON")
    p.set_defaults(func=_cmd_show_graph)

    p = sub.add_parser("plan", help="run every placement method on a model and topology; keep the best plan")
    p.add_argument("--model", default="inception_v3", help="zoo model or graph .json (default inception_v3)")
    p.add_argument("--topology", default="tag-testbed", help="preset, random:SEED or .json (default tag-testbed)")
    p.add_argument("--methods", default=None, help="comma-separated subset of: single,dp,expert,layerwise,mcmc,ft")
    p.add_argument("--ft-max-configs", type=int, default=8, help="FT: configurations per op (default 8)")
    p.add_argument("--mcmc-budget", default="10s", help="MCMC budget per chain: seconds ('10s') or proposals")
    p.add_argument("--chains", type=int, default=1, help="MCMC chains; more than one run as Ray tasks")
    p.add_argument("--seed", type=int, default=0, help="MCMC seed")
    p.add_argument("--out-dir", default=None, help="where the best plan, its Gantt PNG and trace go")
    p.add_argument("--checkpoint", default=None, help="also run a trained Trinity policy (a checkpoint_* folder)")
    _add_cost_arguments(p)
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("search", help="search for a plan: 'search mcmc' (FlexFlow's MCMC with delta simulation)")
    p.add_argument("algorithm", choices=["mcmc"], help="the search algorithm")
    p.add_argument("--model", required=True, help="zoo model or graph .json")
    p.add_argument("--topology", required=True, help="preset, random:SEED or .json")
    p.add_argument("--budget", default="30s", help="per chain: seconds ('30s', '2m') or proposals ('100000')")
    p.add_argument("--chains", type=int, default=1, help="independent chains; more than one run as Ray tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--beta", type=float, default=50.0, help="scale-free inverse temperature")
    p.add_argument("--full-simulation", action="store_true", help="evaluate proposals by full simulation (slower)")
    p.add_argument(
        "--initial",
        default="data_parallel,expert,random",
        help="initial candidates: data_parallel, expert, random (FlexFlow's) and subset_data_parallel",
    )
    p.add_argument("--out", default=None, help="write the best plan (JSON) here")
    _add_cost_arguments(p)
    p.set_defaults(func=_cmd_search)

    p = sub.add_parser("frontier", help="TensorOpt's FT: the memory vs time cost frontier and its modes")
    p.add_argument("--model", default="transformer", help="zoo model or graph .json (default transformer)")
    p.add_argument("--topology", default="tensoropt", help="preset, random:SEED or .json (default tensoropt)")
    p.add_argument(
        "--mode",
        default="frontier",
        choices=["frontier", "mini-time", "mini-parallelism", "profiling"],
        help="frontier (all points; mini-time marked), mini-time, mini-parallelism or profiling",
    )
    p.add_argument("--devices", type=int, default=None, help="devices in use: the first N (default all)")
    p.add_argument(
        "--device-counts", default=None, help="profiling / mini-parallelism: comma-separated counts (default 1,2,4,..)"
    )
    p.add_argument(
        "--memory-limit", default=None, help="per-device memory limit, GiB or with a unit (default: device memory)"
    )
    p.add_argument("--method", default="ldp", choices=["ldp", "elimination"], help="FT-LDP (default) or FT-Elimination")
    p.add_argument(
        "--max-configs",
        type=int,
        default=16,
        help="configurations per op (default 16, replication and data parallelism always kept; 0 = all)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.01,
        help="relative time resolution of the frontier (default 0.01; 0 = exact, slow on large graphs)",
    )
    p.add_argument(
        "--rescheduling",
        default="collectives",
        choices=["collectives", "point_to_point"],
        help="price layout changes as collectives (TensorOpt, default) or point to point (the simulator)",
    )
    p.add_argument("--mcmc-budget", default="5s", help="MCMC baseline budget for the frontier plot ('none' to skip)")
    p.add_argument("--ray", action="store_true", help="split large frontier products over Ray tasks")
    p.add_argument("--out-dir", default=None, help="where frontier.json, the PNG and the mini-time plan go")
    _add_cost_arguments(p)
    p.set_defaults(func=_cmd_frontier)

    p = sub.add_parser("simulate", help="simulate one plan and report time, memory and communication")
    p.add_argument("--model", required=True, help="zoo model or graph .json")
    p.add_argument("--topology", required=True, help="preset, random:SEED or .json")
    p.add_argument("--plan", required=True, help="single, dp, expert, layerwise or a plan .json")
    p.add_argument("--trace", default=None, help="write a Chrome trace (open in Perfetto) to this path")
    p.add_argument("--gantt", default=None, help="write a Gantt chart PNG to this path")
    _add_cost_arguments(p)
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("profile", help="measure the zoo's op times on this machine's device into a profile table")
    p.add_argument("--out", required=True, help="where to write the table (JSON)")
    p.add_argument("--models", default=None, help="comma-separated zoo models (default: the whole zoo)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default: each model's)")
    p.add_argument(
        "--splits", default="1", help="also profile at batch/k for these k (data-parallel shapes), e.g. 1,2,4"
    )
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N")
    p.add_argument("--device-type", default=None, help="label for the entries (default: CPU or the CUDA device name)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per op; the median is kept")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("train", help="train Trinity (PPO on RLlib) from a YAML config")
    p.add_argument("config", help="training YAML, e.g. tune_configs/trinity_ppo.yaml")
    p.add_argument("--iterations", type=int, default=None, help="override run.iterations")
    p.add_argument("--out-dir", default=None, help="override run.output_dir")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("tune", help="sweep Trinity's hyperparameters with Ray Tune from a YAML config")
    p.add_argument("config", help="sweep YAML, e.g. tune_configs/trinity_sweep.yaml")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("evaluate", help="run a trained policy on (unseen) topologies and models next to the baselines")
    p.add_argument("--checkpoint", required=True, help="a checkpoint_* folder of a training run")
    p.add_argument(
        "--topologies",
        default="test",
        help="'test' / 'train' (10 random topologies of that split), 'test:N', or comma-separated specs",
    )
    p.add_argument("--models", default=None, help="comma-separated zoo models (default: the training model)")
    p.add_argument("--mcmc-budget", default="2s", help="MCMC budget per instance ('2s', proposals, or 'none')")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser("show-topology", help="describe a device topology")
    p.add_argument("topology", help="preset name (see 'placement-rl topologies'), 'random:SEED' or a .json file")
    p.add_argument("--out", default=None, help="write the topology as JSON to this path")
    p.add_argument("--json", action="store_true", help="print the topology document as JSON")
    p.set_defaults(func=_cmd_show_topology)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``placement-rl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except (ValueError, FileNotFoundError) as exc:  # UnknownNameError and SchemaError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `placement-rl ... | head`
        return 0
    return 0


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    raise SystemExit(main())
