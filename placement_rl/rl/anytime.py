"""Anytime curves: the best plan found against wall-clock seconds, for every kind of method on one instance.

Three kinds of method meet here, each given the same wall-clock budget on the same instance:

* a search (``mcmc``, ``mcts``: TAG's tree search with the uniform prior) reports its own trace
  (:attr:`placement_rl.methods.Found.anytime`);
* a learning agent (PPO: ``trinity``, or any registered agent whose episodes end with a plan)
  is trained on the instance alone and keeps the best plan it sampled, Trinity's setting
  (:func:`training_method`, :func:`placement_rl.rl.train.train_on_instance`);
* a trained TAG checkpoint guides the same tree search with its GNN prior (:func:`prior_search_method`).

:func:`anytime_benchmark` runs them through :func:`~placement_rl.methods.compare_methods` (one
simulation context judges every plan), draws one PNG per instance
(:func:`placement_rl.experiments.anytime_pngs`) and writes the curves as JSON and CSV;
``benchmarks/anytime.py`` is its command line.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placement_rl.errors import SchemaError
from placement_rl.graph import OpGraph
from placement_rl.methods import Found, Method, MethodResult, Problem, compare_methods, get_method, mcts_trace
from placement_rl.rl.config import TrainConfig
from placement_rl.sim import CostModel
from placement_rl.topology import DeviceTopology

if TYPE_CHECKING:
    from placement_rl.rl.policy import Policy

#: Files :func:`anytime_benchmark` writes besides the PNGs.
CURVES_JSON, CURVES_CSV = "anytime.json", "anytime.csv"
#: How the benchmark's rows and legends name the registered searches.
LABELS: Mapping[str, str] = {"mcmc": "MCMC", "mcts": "TAG, uniform prior (mcts)"}


def _check_budget(options: Mapping[str, Any], graph: OpGraph | None, topology: DeviceTopology | None) -> None:
    from placement_rl.search import Budget

    if "budget" in options:
        try:
            Budget.parse(options["budget"])
        except ValueError as exc:
            raise ValueError(f"budget = {options['budget']!r}; {str(exc).split(': ', 1)[-1]}") from None
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed = {seed!r}; expected an integer >= 0")


def training_method(cfg: TrainConfig, name: str | None = None, progress: Callable[[str], None] | None = None) -> Method:
    """A :class:`~placement_rl.methods.Method` that trains ``cfg``'s agent on the instance it is given
    and returns the best plan sampled, with its anytime trace.

    Options: ``budget`` (``"60s"``: wall-clock, the last iteration finishing past it; ``5``: training
    iterations; default ``"60s"``) and ``seed`` (``run.seed``; default the config's).

    Args:
        cfg: the training config (its generator is replaced by each instance).
        name: the method's name (default ``ppo:<agent>``).
        progress: called with one line per training iteration.
    """
    from placement_rl.rl.train import train_on_instance

    def run(problem: Problem) -> Found:
        opts = problem.options
        run_cfg = cfg
        if "seed" in opts:
            run_cfg = cfg.replace(run=dataclasses.replace(cfg.run, seed=int(opts["seed"])))
        out = train_on_instance(
            run_cfg,
            problem.graph,
            problem.topology,
            opts.get("budget", "60s"),
            cost_model=problem.cost_model,
            progress=progress,
        )
        return Found(out.plan, out.anytime)

    agent = cfg.agent_spec
    return Method(
        name or f"ppo:{agent.name}",
        run,
        f"{agent.description}, trained on the instance; the best plan sampled",
        ("budget", "seed"),
        _check_budget,
    )


def prior_search_method(checkpoint: Policy | str | Path, name: str = "tag") -> Method:
    """A :class:`~placement_rl.methods.Method`: TAG's tree search guided by a trained ``tag`` checkpoint's
    GNN prior, for a ``budget`` (``"30s"`` or leaf evaluations;
    default ``"10s"``), returning the best plan and its anytime trace. The search's space is the
    checkpoint's env (its op-group count and device grouping, and the cost model its leaves are
    simulated under). ``checkpoint`` may be a policy already loaded (e.g. with its env changed).

    Raises:
        SchemaError: when the checkpoint holds another agent's policy.
    """
    from placement_rl.rl.policy import Policy, load_policy, policy_env
    from placement_rl.rl.tag import MCTSSection, base_env, prior_fn

    policy = checkpoint if isinstance(checkpoint, Policy) else load_policy(checkpoint)
    checkpoint = policy.checkpoint if isinstance(checkpoint, Policy) else checkpoint
    if policy.agent.name != "tag":
        raise SchemaError(
            f"checkpoint {str(checkpoint)!r} holds a {policy.agent.name!r} policy; the prior-guided search needs "
            "a 'tag' checkpoint (a GNN prior over TAG's actions)"
        )

    def run(problem: Problem) -> Found:
        from placement_rl.search import Budget
        from placement_rl.search.mcts import mcts_search

        budget = Budget.parse(problem.options.get("budget", "10s"))
        env = base_env(policy_env(policy, problem.graph, problem.topology))
        env.reset(seed=0)
        tag = env.tag_problem()
        mcts: MCTSSection = getattr(policy.module, "tag_mcts", None) or MCTSSection()
        found = mcts_search(
            tag,
            iterations=budget.proposals,
            time_s=budget.seconds,
            prior=prior_fn(policy.module, env, tag.num_actions),
            config=mcts.search_config(),
        )
        return Found(tag.plan(found.decisions, name=name), mcts_trace(tag.baseline.makespan_s, found))

    return Method(
        name,
        run,
        f"TAG's tree search guided by the GNN prior of {checkpoint}",
        ("budget",),
        _check_budget,
    )


# ------------------------------------------------------------------------------------ the benchmark
def first_below(trace: Sequence[Sequence[float]], level_s: float) -> float | None:
    """The first time (s) at which a ``(seconds, best cost)`` trace is below ``level_s``; ``None`` if never."""
    return next((float(t) for t, c in trace if c < level_s), None)


def curve_row(result: MethodResult) -> dict[str, Any]:
    """One method's curve on one instance as data (what the JSON holds and the PNG draws):
    :meth:`MethodResult.row` plus ``dp_makespan_s``, ``anytime`` (``[seconds, best cost s]`` pairs; a
    method without a trace gets one point, ``[search_s, makespan_s]``) and ``first_beat_dp_s``."""
    trace = [[float(t), float(c)] for t, c in result.anytime] or [[result.search_s, result.makespan_s]]
    return {
        **result.row(),
        "dp_makespan_s": result.dp_makespan_s,
        "anytime": trace,
        "first_beat_dp_s": first_below(trace, result.dp_makespan_s),
    }


def table_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The results as a Markdown table: instance, method, best ms, speedup over data parallelism,
    time to first beat data parallelism (``-``: never), seconds run, whether the plan fits."""
    lines = [
        "| instance | method | best ms | vs DP | first beats DP at s | ran s | fits |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        beat = r["first_beat_dp_s"]
        lines.append(
            f"| {r['instance']} | {r['method']} | {r['makespan_s'] * 1e3:,.2f} | {r['speedup_over_dp']:.2f}x | "
            f"{'-' if beat is None else f'{beat:.1f}'} | {r['search_s']:.1f} | {'no' if r['oom'] else 'yes'} |"
        )
    return "\n".join(lines) + "\n"


def write_curves(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """``anytime.json`` (every row with its curve) and ``anytime.csv`` (one line per curve point:
    instance, method, seconds, best makespan ms)."""
    from placement_rl.io import write_json

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CURVES_JSON, {"rows": [dict(r) for r in rows]})
    with open(out / CURVES_CSV, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["instance", "method", "seconds", "best_makespan_ms"])
        for r in rows:
            for t, c in r["anytime"]:
                writer.writerow([r["instance"], r["method"], f"{t:.4f}", f"{c * 1e3:.6g}" if math.isfinite(c) else ""])
    return [out / CURVES_JSON, out / CURVES_CSV]


def anytime_benchmark(
    instances: Sequence[tuple[OpGraph, DeviceTopology]],
    budget: str,
    out: str | Path,
    *,
    ppo: TrainConfig | None,
    tag_checkpoint: Policy | str | Path | None = None,
    searches: Sequence[str] = ("mcmc", "mcts"),
    seed: int = 0,
    progress: Callable[[str], None] | None = print,
    cost_model: CostModel | None = None,
) -> list[dict[str, Any]]:
    """Every method on every instance with the same wall-clock ``budget``; one PNG per instance.

    Methods, in this order: the registered ``searches`` (``mcmc``, ``mcts``), PPO trained on the
    instance (``ppo``; ``None``: none), and the GNN-prior search of ``tag_checkpoint`` (when given).

    Args:
        instances: (graph, topology) pairs.
        budget: wall-clock seconds for every method (``"120s"``).
        out: the output folder: ``<instance>.png``, ``anytime.json``, ``anytime.csv``, ``results.md``.
        ppo: the training config of the PPO curve.
        tag_checkpoint: a ``tag`` checkpoint folder (or its loaded policy) for the GNN-prior curve.
        searches: registered search methods to run (each takes ``budget``).
        seed: the seed of every seeded method.
        progress: called with progress lines (``None``: silent).
        cost_model: the model that judges every plan, the searches' and PPO's traces included (default:
            the simulator's); PPO's env and the GNN-prior search's env simulate under their configs' own.

    Returns:
        One :func:`curve_row` per (instance, method).
    """
    from placement_rl.experiments import anytime_pngs
    from placement_rl.search import Budget

    if Budget.parse(budget).seconds is None:
        raise ValueError(f"budget = {budget!r}; expected wall-clock seconds ('120s', '2m'), the same for every method")
    folder = Path(out)
    say = progress or (lambda line: None)
    methods: list[Method] = [dataclasses.replace(get_method(n), name=LABELS.get(n, n)) for n in searches]
    if ppo is not None:
        methods.append(training_method(ppo, name=f"PPO ({ppo.agent})", progress=say))
    if tag_checkpoint is not None:
        methods.append(prior_search_method(tag_checkpoint, name="TAG, GNN prior"))
    options: dict[str, dict[str, Any]] = {}
    for method in methods:
        options[method.name] = {"budget": budget, **({"seed": seed} if method.seeded else {})}
        if method.check is not None:
            method.check(options[method.name], None, None)
    rows: list[dict[str, Any]] = []
    for graph, topology in instances:
        say(f"{graph.name}@{topology.name}: {', '.join(m.name for m in methods)}, {budget} each")

        def done(result: MethodResult) -> None:
            row = curve_row(result)
            rows.append(row)
            beat = row["first_beat_dp_s"]
            say(
                f"  {result.method}: best {result.makespan_s * 1e3:,.2f} ms ({result.speedup_over_dp:.2f}x DP), "
                f"first beats DP at {'never' if beat is None else f'{beat:.1f} s'}, ran {result.search_s:.1f} s"
            )

        compare_methods(graph, topology, methods, cost_model=cost_model, options=options, on_result=done)
        write_curves(rows, folder)  # after every instance: a crash keeps the finished curves
    pngs = anytime_pngs(rows, folder, title="best plan found vs seconds: ")
    (folder / "results.md").write_text(table_markdown(rows))
    say(f"wrote {len(pngs)} PNGs, {CURVES_JSON}, {CURVES_CSV} and results.md to {folder}")
    return rows
