"""TAG results: tree-search throughput, TAG Table 7 (iterations to beat data parallelism on unseen
topologies, GNN prior vs uniform prior) and TAG Table 8 (speedups after a fixed search budget).

    python benchmarks/tag.py throughput [--checkpoint CKPT] [--model inception_v3] [--topology tag-testbed]
    python benchmarks/tag.py rank [--plans 40] [--model inception_v3] [--topology tag-testbed]
    python benchmarks/tag.py table7 --checkpoint CKPT [--topologies 20] [--max-iterations 200]
    python benchmarks/tag.py table8 --checkpoint CKPT [--holdout MODEL=CKPT ...] [--budget 30s]
    python benchmarks/tag.py completion [--model alexnet] [--machines 8] [--gbit 10] [--budget 20s]

``throughput`` times MCTS iterations (one leaf per iteration, its partial plan completed in up to
three ways by the env's default completion rule and simulated on the op graph) on one
thread: the uniform prior, and the GNN prior of ``--checkpoint`` (an untrained default-size GNN
when none is given), each on a cold problem (nothing compiled or cached) and again warm (the ops'
compiled configurations kept, every leaf simulated again).

``rank`` draws random partial decision lists (random depth, random allowed actions), completes
them by TAG's rule and compares three scores with the final simulation of the plan on the
original ops: the leaf score the search and the env use (the op graph), and the earlier
group-graph simulation (each op group one op; model parallelism on the group's first GPU). It
prints the Spearman rank correlation of each with the final makespans.

``table7`` runs, per model and unseen test-split topology, MCTS with the uniform prior and with
the checkpoint's GNN prior until a leaf beats (bucketed) data parallelism and fits, at most
``--max-iterations`` iterations; it prints TAG's mean iteration counts (a search that never beat
data parallelism counts as the cap, and the beaten share is printed beside).

``completion`` builds a CNN instance where a hand plan is far better than data parallelism
(``--machines`` single-GPU machines over ``--gbit`` Gbit/s Ethernet; the hand plan: the layers
up to the classifier data parallel, the classifier from ``flatten`` on on one GPU, built from
``data_parallel`` and ``single_device``) and runs the tree search from data parallelism with the
uniform prior for ``--budget`` under TAG's completion rule with TAG's four options (the search
before the best-of-completions rule), under the best-of-completions rule with TAG's four options,
and with the default (best-of-completions, extended options); it prints each found makespan over
the hand plan's.

``table8`` plans each model on tag-testbed and tag-cloud with per-tensor and bucketed data
parallelism, the greedy agent (one-step lookahead over TAG's actions), MCTS with the uniform prior,
TAG (the GNN prior) and MCMC, the searches at the same wall-clock budget, and the held-out
checkpoints given with ``--holdout`` (policies trained without that model). Speedups are over
per-tensor data parallelism (TAG's DP-NCCL) and over bucketed data parallelism.

Every command takes ``--calibration`` (``default``, ``roofline`` for the tables measured before the
shipped fit, or a calibration file): the GPU model plans are simulated under. ``rank`` and
``completion`` default to ``default``. ``throughput``, ``table7`` and ``table8`` search in the
checkpoint's env and, without the option, simulate under the cost model it was trained with; with
it, that cost model takes the given calibration (its other settings kept), and ``table8``'s per-tensor
data parallelism and MCMC are simulated under the same model (without it, under the default model).
The GNN then reads features simulated under a model it may not have been trained under.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from placement_rl import zoo
from placement_rl.cli.common import (
    CALIBRATION_HELP,
    calibrated_cost_model,
    calibration_spec,
    policy_with_calibration,
)
from placement_rl.graph import OpGraph
from placement_rl.search import Budget
from placement_rl.search.mcts import MCTSConfig, mcts_search
from placement_rl.search.tag import TagProblem
from placement_rl.topology import DeviceTopology, resolve_topology, topology_seeds

TABLE7_MODELS = ("inception_v3", "resnet101", "vgg19", "transformer", "bert_small")
#: TAG Table 7: MCTS iterations to beat data parallelism, uniform prior / GNN prior.
TAG_TABLE7 = {
    "inception_v3": (66.0, 9.5),
    "resnet101": (73.4, 4.6),
    "vgg19": (56.6, 17.7),
    "transformer": (145.0, 121.8),
    "bert_small": (97.8, 7.9),
}
#: TAG Table 8: speedup over per-tensor DP-NCCL (trained on all models / model held out), percent.
TAG_TABLE8 = {
    ("inception_v3", "tag-testbed"): (456.1, 456.1),
    ("resnet101", "tag-testbed"): (7.7, 7.1),
    ("vgg19", "tag-testbed"): (286.2, 213.6),
    ("transformer", "tag-testbed"): (80.3, 80.3),
    ("bert_small", "tag-testbed"): (298.4, 279.6),
    ("inception_v3", "tag-cloud"): (117.7, 117.7),
    ("resnet101", "tag-cloud"): (12.2, 10.4),
    ("vgg19", "tag-cloud"): (43.6, 43.6),
    ("transformer", "tag-cloud"): (15.0, 13.4),
    ("bert_small", "tag-cloud"): (84.5, 84.5),
}


class Searcher:
    """A TAG problem on one instance, with the uniform prior and (optionally) a policy's prior.

    The problem comes from the policy's env (its group count and device grouping), so both priors
    search exactly the same space.
    """

    def __init__(self, graph: OpGraph, topology: DeviceTopology, policy: Any | None, env_options: dict[str, Any]):
        import gymnasium as gym

        import placement_rl.envs  # noqa: F401  (registers the env ids)
        from placement_rl.rl.policy import policy_env

        if policy is not None:
            self.env = policy_env(policy, graph, topology).unwrapped
        else:
            from placement_rl.rl.policy import GivenInstance as _GivenInstance

            config = {"mode": "sequential", "action_space": "tag", **env_options}
            self.env = gym.make(
                "placement_rl/Placement-v0", config={**config, "generator": _GivenInstance(graph, topology)}
            ).unwrapped
        self.env.reset(seed=0)
        self.problem: TagProblem = self.env.tag_problem()
        self.policy = policy

    def prior(self) -> Any:
        from placement_rl.rl.tag import prior_fn

        assert self.policy is not None
        return prior_fn(self.policy.module, self.env, self.problem.num_actions)


#: ``--calibration``'s help where a checkpoint's env simulates (``None``: as it was trained).
CHECKPOINT_CALIBRATION_HELP = (
    f"{CALIBRATION_HELP}; default: the cost model of the checkpoint's env; given, that cost model takes this "
    "calibration (its other settings kept)"
)


def _load(checkpoint: str | None, gpu_model: str | None = None) -> Any:
    """The policy of ``checkpoint`` (``None``: none), its env simulating under the ``--calibration``
    ``gpu_model`` (``None``: as trained)."""
    if checkpoint is None:
        return None
    from placement_rl.rl.policy import load_policy

    return policy_with_calibration(load_policy(checkpoint), gpu_model)


def _untrained_policy() -> Any:
    """An untrained default-size TAG policy (for throughput without a checkpoint)."""
    from placement_rl.rl.agents import get_agent
    from placement_rl.rl.config import TrainConfig
    from placement_rl.rl.policy import Policy

    cfg = TrainConfig.from_dict({"agent": "tag", "env": {"generator": {"kind": "fixed"}}})
    agent = get_agent("tag")
    module = agent.build_module(cfg)
    module.eval()
    return Policy(agent, cfg, module, checkpoint=None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ throughput
def throughput(
    model: str, topology: str, iterations: int, checkpoint: str | None, gpu_model: str | None = None
) -> None:
    import torch

    torch.set_num_threads(1)
    graph = zoo.load(model)
    topo = resolve_topology(topology)
    policy = policy_with_calibration(_load(checkpoint) or _untrained_policy(), gpu_model)
    print(f"MCTS iterations per second on one thread, {model} x {topology}, {iterations} iterations per run")
    print("| prior | groups | actions | cold it/s | warm it/s | simulations (cold) |")
    print("|---|---|---|---|---|---|")
    for label in ("uniform", "GNN"):
        searcher = Searcher(graph, topo, policy, {})
        prior = searcher.prior() if label == "GNN" else None
        rates = []
        sims = 0
        for run in range(2):
            searcher.problem.clear_evaluations()
            start = time.perf_counter()
            found = mcts_search(searcher.problem, iterations=iterations, prior=prior)
            rates.append(iterations / (time.perf_counter() - start))
            if run == 0:
                sims = found.simulations
        p = searcher.problem
        print(f"| {label} | {p.num_groups} | {p.num_actions} | {rates[0]:.1f} | {rates[1]:.1f} | {sims} |", flush=True)


# ------------------------------------------------------------------------------------------ rank
def rank(model: str, topology: str, plans: int, seed: int = 0, gpu_model: str = "default") -> None:
    from scipy.stats import spearmanr

    from placement_rl.plan import Plan
    from placement_rl.sim import simulate

    graph = zoo.load(model)
    topo = resolve_topology(topology)
    cost = calibrated_cost_model(gpu_model)
    p = TagProblem.for_graph(graph, topo, cost, options="tag", completion="tag")
    rng = np.random.default_rng(seed)
    final, leaf, group = [], [], []
    for _ in range(plans):
        decisions: list[int] = []
        for _ in range(int(rng.integers(1, p.num_groups + 1))):
            decisions.append(int(rng.choice(np.flatnonzero(p.action_mask(decisions)))))
        choices = p.complete(decisions)
        final.append(simulate(graph, topo, p.plan(decisions), cost).makespan_s)
        leaf.append(p.evaluate(decisions).makespan_s)
        coarse = Plan(p.groups.name, {op.name: p.group_config(g, choices[g]) for g, op in enumerate(p.groups.ops)})
        group.append(simulate(p.groups, topo, coarse, cost).makespan_s)
    rho_leaf = float(spearmanr(final, leaf).statistic)
    rho_group = float(spearmanr(final, group).statistic)
    ratio = np.median(np.array(final) / np.array(group))
    print(f"{plans} random partial plans of {model} x {topology} ({p.num_groups} groups), completed by TAG's rule")
    print("| partial-plan score | Spearman with the final simulation | median final / score |")
    print("|---|---|---|")
    print(f"| op graph (TagProblem.evaluate, the env and the search) | {rho_leaf:.3f} | 1.00 |")
    print(f"| group graph (one op per group) | {rho_group:.3f} | {ratio:.2f} |")


# ------------------------------------------------------------------------------------- table 7
def table7(
    checkpoint: str, models: Sequence[str], topologies: int, max_iterations: int, gpu_model: str | None = None
) -> None:
    import torch

    torch.set_num_threads(1)
    policy = _load(checkpoint, gpu_model)
    seeds = topology_seeds("test", topologies)
    print(
        f"TAG Table 7: MCTS iterations until a plan beats data parallelism (bucketed) and fits, on {topologies} "
        f"unseen test topologies (cap {max_iterations}; a search that never beats it counts as the cap)"
    )
    print(
        "| model | uniform prior: mean | beaten | GNN prior: mean | beaten | GNN / uniform | "
        "TAG uniform | TAG GNN | TAG ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in models:
        graph = zoo.load(model)
        counts: dict[str, list[int | None]] = {"uniform": [], "gnn": []}
        for seed in seeds:
            searcher = Searcher(graph, resolve_topology(f"random:{seed}"), policy, {})
            for label, prior in (("uniform", None), ("gnn", searcher.prior())):
                found = mcts_search(searcher.problem, iterations=max_iterations, prior=prior, until_beats_dp=True)
                counts[label].append(found.first_beat_dp)
            print(f"  {model} random:{seed}: uniform {counts['uniform'][-1]}, gnn {counts['gnn'][-1]}", flush=True)

        def mean(values: list[int | None]) -> float:
            return statistics.fmean(max_iterations if v is None else v for v in values)

        def beaten(values: list[int | None]) -> str:
            return f"{sum(v is not None for v in values)}/{len(values)}"

        u, g = mean(counts["uniform"]), mean(counts["gnn"])
        tu, tg = TAG_TABLE7[model]
        print(
            f"| {model} | {u:.1f} | {beaten(counts['uniform'])} | {g:.1f} | {beaten(counts['gnn'])} | "
            f"{g / u:.2f}x | {tu} | {tg} | {tg / tu:.2f}x |",
            flush=True,
        )


# ------------------------------------------------------------------------------------- table 8
def _greedy(searcher: Searcher) -> tuple[Any, float]:
    """The greedy agent: each group takes the action whose completed plan simulates fastest."""
    p = searcher.problem
    start = time.perf_counter()
    decisions: list[int] = []
    for _ in range(p.num_groups):
        allowed = np.flatnonzero(p.action_mask(decisions)).tolist()
        times = [p.evaluate([*decisions, a]) for a in allowed]
        best = min(range(len(allowed)), key=lambda i: (times[i].oom, times[i].makespan_s))
        decisions.append(int(allowed[best]))
    return p.evaluate(decisions), time.perf_counter() - start


def table8(
    checkpoint: str,
    holdouts: dict[str, str],
    models: Sequence[str],
    topologies: Sequence[str],
    budget: str,
    gpu_model: str | None = None,
) -> None:
    import torch

    from placement_rl.methods import Problem, get_method
    from placement_rl.plan import data_parallel_per_tensor
    from placement_rl.sim import SimContext

    torch.set_num_threads(1)
    seconds = Budget.parse(budget).seconds
    if seconds is None:
        raise SystemExit(f"--budget {budget!r}: give seconds ('30s'), the searches get equal wall-clock time")
    policy = _load(checkpoint, gpu_model)
    print(
        f"TAG Table 8: speedup over per-tensor data parallelism (DP-NCCL) and over bucketed data parallelism; "
        f"searches {budget} each"
    )
    print("| model | cluster | method | ms | vs DP-NCCL | vs bucketed DP | OOM | search s | TAG (all / held out) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for topo_name in topologies:
        topo = resolve_topology(topo_name)
        for model in models:
            graph = zoo.load(model)
            searcher = Searcher(graph, topo, policy, {})
            p = searcher.problem
            # the search's own model under --calibration; without it, the default model (as before the option)
            ctx = SimContext(graph, topo, searcher.env.cost if gpu_model is not None else None)
            per_tensor_s = ctx.simulate(data_parallel_per_tensor(graph, topo), validate=False).makespan_s
            paper = TAG_TABLE8.get((model, topo_name))
            paper_text = f"{paper[0]:.1f}% / {paper[1]:.1f}%" if paper else "-"
            rows: list[tuple[str, float, bool, float]] = [("DP-NCCL (per tensor)", per_tensor_s, False, 0.0)]
            dp = p.baseline  # data parallelism itself (the root's completion may already beat it)
            rows.append(("data parallel (bucketed)", dp.makespan_s, dp.oom, 0.0))
            greedy, greedy_s = _greedy(searcher)
            rows.append(("greedy agent", greedy.makespan_s, greedy.oom, greedy_s))
            uniform = mcts_search(p, time_s=seconds, config=MCTSConfig())
            rows.append(("MCTS, uniform prior", uniform.evaluation.makespan_s, uniform.evaluation.oom, seconds))
            tag = mcts_search(p, time_s=seconds, prior=searcher.prior())
            rows.append(("TAG (GNN prior)", tag.evaluation.makespan_s, tag.evaluation.oom, seconds))
            if model in holdouts:
                held = Searcher(graph, topo, _load(holdouts[model], gpu_model), {})
                found = mcts_search(held.problem, time_s=seconds, prior=held.prior())
                rows.append(("TAG, model held out", found.evaluation.makespan_s, found.evaluation.oom, seconds))
            problem = Problem(graph, topo, ctx, {"budget": budget, "chains": 1})
            start = time.perf_counter()
            mcmc = get_method("mcmc").run(problem)
            mcmc_s = time.perf_counter() - start
            plan = mcmc.plan if hasattr(mcmc, "plan") else mcmc
            result = ctx.simulate(plan, validate=False)  # type: ignore[arg-type]
            rows.append(("MCMC", result.makespan_s, result.oom, mcmc_s))
            for label, ms, oom, search_s in rows:
                print(
                    f"| {model} | {topo_name} | {label} | {ms * 1e3:,.2f} | {per_tensor_s / ms:.2f}x | "
                    f"{dp.makespan_s / ms:.2f}x | {'yes' if oom else 'no'} | {search_s:.1f} | "
                    f"{paper_text if label.startswith('TAG') else ''} |",
                    flush=True,
                )


# ------------------------------------------------------------------------------------ completion
def cnn_instance(model: str, machines: int, gbit: float) -> tuple[OpGraph, DeviceTopology, Any]:
    """``model`` on ``machines`` single-GPU machines over ``gbit`` Gbit/s Ethernet, and its hand plan:
    data parallel up to the classifier, the classifier (from ``flatten`` on) on the first GPU."""
    from placement_rl.plan import Plan, data_parallel, single_device
    from placement_rl.topology.builder import TopologyBuilder, switched_machine
    from placement_rl.topology.devices import gbit_to_bytes_per_s

    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(gbit), "ethernet")
    for _ in range(machines):
        switched_machine(b, "V100-SXM2-16GB", 1, eth)  # type: ignore[arg-type]
    topo = b.build(f"{machines}x1-{gbit:g}gbit")
    graph = zoo.load(model)
    dp, one = data_parallel(graph, topo), single_device(graph, topo, topo.devices[0].name)
    start = next(i for i, op in enumerate(graph.ops) if op.op_type in ("flatten", "linear"))
    configs = {op.name: (one if i >= start else dp)[op.name] for i, op in enumerate(graph.ops)}
    return graph, topo, Plan(graph.name, configs, name="hand")


def completion(model: str, machines: int, gbit: float, budget: str, gpu_model: str = "default") -> None:
    from placement_rl.sim import simulate

    graph, topo, hand = cnn_instance(model, machines, gbit)
    cost = calibrated_cost_model(gpu_model)
    hand_s = simulate(graph, topo, hand, cost).makespan_s
    seconds = Budget.parse(budget)
    print(
        f"{model} x {topo.name}: tree search from data parallelism, uniform prior, {budget}; hand plan "
        f"{hand_s * 1e3:.1f} ms"
    )
    print("| completion | options | found ms | found / hand | data parallel / found | iterations | simulations |")
    print("|---|---|---|---|---|---|---|")
    for rule, options in (("tag", "tag"), ("best", "tag"), ("best", "extended")):
        p = TagProblem.for_graph(graph, topo, cost, options=options, completion=rule)
        found = mcts_search(p, iterations=seconds.proposals, time_s=seconds.seconds)
        ms = found.evaluation.makespan_s
        print(
            f"| {rule} | {options} | {ms * 1e3:.1f} | {ms / hand_s:.3f} | {p.baseline.makespan_s / ms:.2f}x | "
            f"{found.iterations} | {found.simulations} |",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput", help="MCTS iterations per second, uniform and GNN prior")
    t.add_argument("--checkpoint", help="a TAG checkpoint folder (default: an untrained default-size GNN)")
    t.add_argument("--model", default="inception_v3")
    t.add_argument("--topology", default="tag-testbed")
    t.add_argument("--iterations", type=int, default=200)
    t.add_argument("--calibration", type=calibration_spec, default=None, help=CHECKPOINT_CALIBRATION_HELP)
    r = sub.add_parser("rank", help="partial-plan scores against the final simulation (Spearman)")
    r.add_argument("--plans", type=int, default=40)
    r.add_argument("--model", default="inception_v3")
    r.add_argument("--topology", default="tag-testbed")
    r.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    s7 = sub.add_parser("table7", help="iterations to beat data parallelism on unseen topologies")
    s7.add_argument("--checkpoint", required=True)
    s7.add_argument("--models", default=",".join(TABLE7_MODELS))
    s7.add_argument("--topologies", type=int, default=20)
    s7.add_argument("--max-iterations", type=int, default=200)
    s7.add_argument("--calibration", type=calibration_spec, default=None, help=CHECKPOINT_CALIBRATION_HELP)
    s8 = sub.add_parser("table8", help="speedups on tag-testbed and tag-cloud at a fixed search budget")
    s8.add_argument("--checkpoint", required=True)
    s8.add_argument("--holdout", action="append", default=[], metavar="MODEL=CKPT")
    s8.add_argument("--models", default=",".join(TABLE7_MODELS))
    s8.add_argument("--topologies", default="tag-testbed,tag-cloud")
    s8.add_argument("--budget", default="30s")
    s8.add_argument("--calibration", type=calibration_spec, default=None, help=CHECKPOINT_CALIBRATION_HELP)
    c = sub.add_parser("completion", help="the tree search under TAG's rule and the best-of-completions rule")
    c.add_argument("--model", default="alexnet")
    c.add_argument("--machines", type=int, default=8)
    c.add_argument("--gbit", type=float, default=10.0)
    c.add_argument("--budget", default="20s")
    c.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    args = parser.parse_args(argv)
    if args.command == "throughput":
        throughput(args.model, args.topology, args.iterations, args.checkpoint, args.calibration)
    elif args.command == "rank":
        rank(args.model, args.topology, args.plans, gpu_model=args.calibration)
    elif args.command == "completion":
        completion(args.model, args.machines, args.gbit, args.budget, args.calibration)
    elif args.command == "table7":
        table7(args.checkpoint, args.models.split(","), args.topologies, args.max_iterations, args.calibration)
    else:
        holdouts = dict(item.split("=", 1) for item in args.holdout)
        table8(
            args.checkpoint, holdouts, args.models.split(","), args.topologies.split(","), args.budget, args.calibration
        )


if __name__ == "__main__":
    main()
