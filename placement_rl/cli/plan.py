"""``placement-rl plan`` (every method side by side, the best plan written out) and ``placement-rl
simulate`` (one plan, in detail)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from placement_rl.cli.common import (
    AUTO,
    PROPOSALS_HELP,
    budget_or_auto,
    chain_map,
    check_profile,
    cost_model,
    cost_parser,
    instance_parser,
    json_parser,
    load_instance,
    method_list,
    method_rows_table,
    name_list,
    path,
    plan_for,
    positive_int,
    print_json,
    print_table,
    proposal_kinds,
    schedule_name,
    starting,
    write_plan_outputs,
    zero_stage,
)
from placement_rl.explain import explain_no_fit, explain_plan
from placement_rl.methods import DEFAULT_METHODS, DEFAULT_PROPOSALS, DEFAULTS_RULE
from placement_rl.paths import output_file, output_folder, safe_name


def plan_experiment(
    args: argparse.Namespace, methods: Sequence[str] | None = None, budgets: Mapping[str, Any] | None = None
) -> Any:
    """``plan``'s flags as a one-instance experiment (the same cells and rows as ``compare``): ``methods``
    (default ``--methods``, else every default method) with ``budgets``, each search's budget by method
    name (default: ``--mcmc-budget`` and ``--mcts-budget``; ``auto`` stands as 10 s until the instance is
    known, :func:`cmd_plan`)."""
    from placement_rl.experiments import parse_experiment
    from placement_rl.methods import DEFAULT_METHODS

    given = {"mcmc": args.mcmc_budget, "mcts": args.mcts_budget, **(budgets or {})}
    budget_of = {name: "10s" if value == AUTO else value for name, value in given.items()}
    entries: list[Any] = []
    for name in methods or args.methods or DEFAULT_METHODS:
        if name == "mcmc":
            entries.append(
                {"method": "mcmc", "budget": budget_of["mcmc"], "chains": args.chains, "proposals": args.mcmc_proposals}
            )
        elif name == "mcts":
            entries.append({"method": "mcts", "budget": budget_of["mcts"]})
        elif name == "ft":
            entries.append({"method": "ft", "max_configs": args.ft_max_configs})
        else:
            entries.append(name)
    agents: list[str] = []
    if args.checkpoint:
        from placement_rl.rl.agents import agent_names
        from placement_rl.rl.compare import checkpoint_agent

        agent, _ = checkpoint_agent(args.checkpoint)
        entries.append({"method": agent, "checkpoint": args.checkpoint})
        agents = agent_names()
    model: dict[str, Any] = {"model": args.model}
    if args.batch_size is not None:
        model["batch_size"] = args.batch_size
    if getattr(args, "seq_len", None) is not None:
        model["options"] = {"seq_len": args.seq_len}
    document = {"models": [model], "topologies": [args.topology], "methods": entries, "seeds": [args.seed]}
    return parse_experiment(document, "plan", agents=agents, name="plan")


def _with_defaults(args: argparse.Namespace, prepared: Any) -> tuple[Any, dict[str, str]]:
    """``prepared`` with the default methods of its instance (unless ``--methods`` names them) and the
    ``auto`` budgets made seconds (:func:`placement_rl.methods.default_methods`); and the default methods
    left out, each with why."""
    from placement_rl.experiments import with_methods
    from placement_rl.methods import default_methods

    auto = [name for name, value in (("mcmc", args.mcmc_budget), ("mcts", args.mcts_budget)) if value == AUTO]
    if args.methods and not any(name in args.methods for name in auto):
        return prepared, {}
    instance = prepared.instances[0]
    defaults = default_methods(instance.graph, instance.topology, prepared.cost_model)
    methods = args.methods or defaults.methods
    budgets = dict.fromkeys(auto, defaults.budget)
    skipped = {} if args.methods else dict(defaults.skipped)
    return with_methods(prepared, plan_experiment(args, methods, budgets), "plan"), skipped


def cmd_plan(args: argparse.Namespace) -> None:
    starting(args, f"planning {args.model} on {args.topology}")
    from placement_rl.experiments import measure_cells, prepare, resolve_registered
    from placement_rl.methods import best_result, mcmc_starts

    prepared = prepare(plan_experiment(args), "plan", cost_model=cost_model(args))
    prepared, skipped = _with_defaults(args, prepared)
    instance = prepared.instances[0]
    graph, topology = instance.graph, instance.topology
    if args.profile:
        check_profile(prepared.cost_model.profile, topology, args.profile)  # before any method runs
    if not args.json:
        budgets = [f"{e.name} {e.options['budget']}" for e in prepared.experiment.methods if "budget" in e.options]
        if budgets:
            print(f"search budgets: {', '.join(budgets)}", file=sys.stderr)
    default_dir = Path("out") / safe_name(f"plan-{graph.name}-{topology.name}")
    out_dir = output_folder(args.out_dir or default_dir)  # checked before any method runs
    resolve: Any = resolve_registered
    if args.checkpoint:
        from placement_rl.rl.compare import check_learned, resolve_method

        check_learned(prepared, "plan")
        resolve = resolve_method

    found: list[Any] = []  # the rows so far: MCMC also starts from the best plan of the methods before it

    def runtime_options(entry: Any) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if entry.method == "mcmc" and args.chains > 1:
            options["task_map"] = chain_map(args.chains, entry.options["budget"])
        if entry.method == "mcmc" and "initial" not in entry.options:
            options["initial"] = mcmc_starts(found)
        return options

    refused: list[dict[str, Any]] = []  # rows of methods whose simulation is too large here (placement_rl.sim.limits)
    measured = measure_cells(
        prepared,
        resolve=resolve,
        extra_options=runtime_options,
        progress=not args.json,
        on_refused=refused.append,
        on_result=lambda m: found.append(m.result),
    )
    if refused and not measured:
        raise ValueError(
            f"every method refused {graph.name} on {topology.name}: "
            + "; ".join(f"{r['method']}: {r['note']}" for r in refused)
        )
    rows = [m.result for m in measured]
    best = best_result(rows)  # when nothing fits: the plan that needs the least memory
    fits = not best.oom
    stem = "best_plan" if fits else "least_memory_plan"
    verdict = "" if fits else ", does not fit in memory"
    title = f"{graph.name} on {topology.name}: {best.method} ({best.makespan_s * 1e3:.1f} ms/iter{verdict})"
    paths = write_plan_outputs(out_dir, stem, best.plan, best.result, title)
    dp = next((r.result for r in rows if r.method == "data_parallel"), None)
    if dp is None:
        from placement_rl.methods import baseline_plan
        from placement_rl.sim import simulate
        from placement_rl.sim.limits import SimulationTooLarge

        try:
            dp = simulate(graph, topology, baseline_plan("data_parallel", graph, topology), prepared.cost_model)
        except SimulationTooLarge:  # too large to simulate here: the words go without the comparison
            dp = None
    words = explain_plan(graph, topology, best.plan, best.result, dp)
    no_fit_words: list[str] = []
    no_fit: dict[str, Any] | None = None
    if not fits:
        no_fit_words, no_fit = explain_no_fit(graph, topology, rows, prepared.cost_model)
    if args.json:
        print_json(
            {
                "model": graph.name,
                "topology": topology.name,
                "fits": fits,
                "best": best.method if fits else None,
                "least_memory": None if fits else best.method,
                "no_fit": no_fit,
                "methods": [m.row for m in measured] + refused,
                "left_out": skipped,
                "explanation": words,
                "files": [str(p) for p in paths],
            }
        )
        return
    print(
        f"{graph.name} (batch {graph.batch_size}, {graph.num_ops} ops) on {topology.name} ({topology.num_devices} GPUs)"
    )
    method_rows_table(rows)
    for r in rows:
        if r.note and (fits or not r.oom):  # when nothing fits, one summary below says so for every method
            print(f"{r.method}: {r.note}")
    for refusal in refused:
        print(f"{refusal['method']}: {refusal['note']}")
    for name, why in skipped.items():
        print(f"{name}: left out: {why}")
    if fits:
        print(f"best (fits in memory, lowest makespan): {best.method}")
    else:
        for line in no_fit_words:
            print(line)
        print(f"the least-memory plan ({best.method}):")
    for line in words:
        print(f"  {line}")
    for p in paths:
        print(f"  wrote {p}")


def _with_large_model_options(args: argparse.Namespace, graph: Any, plan: Any) -> Any:
    """``plan`` with ``--micro-batches``, ``--schedule``, ``--virtual-stages``, ``--recompute`` and
    ``--zero`` applied (each only when given)."""
    from placement_rl.plan import recompute, zero

    if args.micro_batches is not None or args.schedule is not None or args.virtual_stages is not None:
        plan = plan.with_schedule(args.micro_batches, args.schedule, args.virtual_stages)
    if args.recompute:
        plan = recompute(graph, plan, None if args.recompute == ["all"] else args.recompute)
    if args.zero:
        plan = zero(graph, plan, args.zero)
    return plan


def cmd_simulate(args: argparse.Namespace) -> None:
    from placement_rl.sim import simulate

    graph, topology = load_instance(args)
    for out_path, flag in ((args.trace, "--trace"), (args.gantt, "--gantt")):
        if out_path:
            output_file(out_path, flag)
    plan = _with_large_model_options(args, graph, plan_for(args.plan, graph, topology))
    result = simulate(graph, topology, plan, cost_model(args, topology, graph))
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
        print_json(summary)
        return
    print(title)
    print(
        f"  samples/s {summary['samples_per_s']:,.1f}; {result.num_tasks:,} tasks; OOM: "
        f"{', '.join(result.oom_devices) if result.oom else 'no'}"
    )
    print(f"  communication {result.comm_bytes / 1e9:.3f} GB in {result.comm_time_s * 1e3:.2f} ms of transfers")
    print_table(
        ["device", "busy ms", "idle ms", "peak GiB", "memory GiB"],
        [
            [d, f"{b * 1e3:.2f}", f"{i * 1e3:.2f}", f"{p / 2**30:.2f}", f"{c / 2**30:.0f}"]
            for d, b, i, p, c in zip(
                result.device_names,
                result.busy_s,
                result.idle_s,
                result.peak_memory_bytes,
                result.memory_capacity_bytes,
                strict=True,
            )
        ],
    )
    for out_path in (args.trace, args.gantt):
        if out_path:
            print(f"  wrote {out_path}")


def add_commands(sub: Any) -> None:
    """Add this module's commands to the ``placement-rl`` sub-parsers."""
    js, cost = json_parser(), cost_parser()
    p = sub.add_parser(
        "plan",
        parents=[instance_parser("inception_v3", "tag-testbed"), cost, js],
        help="run every placement method on a model and topology; keep the best plan",
    )
    p.add_argument(
        "--methods",
        type=method_list,
        default=None,
        help=f"comma-separated methods (default: {','.join(DEFAULT_METHODS)}; {DEFAULTS_RULE}; dp and single are "
        "short for the first two)",
    )
    p.add_argument("--ft-max-configs", type=positive_int, default=8, help="FT: configurations per op (default 8)")
    p.add_argument(
        "--mcmc-budget",
        type=budget_or_auto,
        default=AUTO,
        help="MCMC budget per chain: seconds ('10s'), proposals, or auto (the default, scaled to the instance)",
    )
    p.add_argument(
        "--mcts-budget",
        type=budget_or_auto,
        default=AUTO,
        help="tree search budget: seconds ('10s'), iterations, or auto (the default, scaled to the instance)",
    )
    p.add_argument("--chains", type=positive_int, default=1, help="MCMC chains; more than one run as Ray tasks")
    p.add_argument(
        "--mcmc-proposals",
        type=proposal_kinds,
        default=DEFAULT_PROPOSALS,
        help=PROPOSALS_HELP,
    )
    p.add_argument("--seed", type=int, default=0, help="MCMC seed")
    p.add_argument("--out-dir", type=path, default=None, help="where the best plan, its Gantt PNG and trace go")
    p.add_argument(
        "--checkpoint",
        type=path,
        default=None,
        help="also run a trained policy (a checkpoint_* folder of a training run; only its safe policy export is read)",
    )
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "simulate",
        parents=[instance_parser(), cost, js],
        help="simulate one plan and report time, memory and communication",
    )
    p.add_argument(
        "--plan", required=True, help="data_parallel (dp), single_device (single), expert, layerwise or a plan .json"
    )
    p.add_argument("--trace", type=path, default=None, help="write a Chrome trace (open in Perfetto) to this path")
    p.add_argument("--gantt", type=path, default=None, help="write a Gantt chart PNG to this path")
    p.add_argument(
        "--micro-batches",
        type=positive_int,
        default=None,
        help="run the plan with this many micro-batches per iteration (gradient accumulation, pipelines)",
    )
    p.add_argument("--schedule", type=schedule_name, default=None, help="pipeline schedule: gpipe, 1f1b or interleaved")
    p.add_argument("--virtual-stages", type=positive_int, default=None, help="stages per device group (interleaved)")
    p.add_argument(
        "--recompute",
        type=name_list,
        default=None,
        help="recompute activations: all, or comma-separated op types (e.g. attention,linear)",
    )
    p.add_argument("--zero", type=zero_stage, default=0, help="ZeRO stage on the replicated parameters (1-3)")
    p.set_defaults(func=cmd_simulate)
