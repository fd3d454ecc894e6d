"""Benchmark FlexFlow's MCMC search: full vs delta simulation (FlexFlow Table 5) and found speedups.

Usage::

    python benchmarks/search.py delta [--proposals 300]     # Table 5: per-proposal time, full vs delta
    python benchmarks/search.py speedup [--budget 20s]      # found plan vs data parallel / expert (+ tag-testbed)
    python benchmarks/search.py goal [--proposals 100000]   # 100k proposals, inception_v3, 16 GPUs
    python benchmarks/search.py headroom [--budget 10s]     # DP-to-bound headroom captured, flexflow vs new proposals
    python benchmarks/search.py exact [--proposals 6000]    # exhaustive optimum reached, seeds 0-9
    python benchmarks/search.py hand [--budget 20s]         # MCMC from data parallelism vs a hand-built plan
    python benchmarks/search.py reach [--proposals 200]     # what a late proposal re-times, and could skip

``--models`` (delta, speedup) and ``--gpus`` (delta) narrow the tables; a tiny run:
``delta --models lenet --gpus 4 --proposals 5``, ``speedup --models lenet --budget 5`` (proposals).
``--network`` picks the simulator's network model (``flow``, the default, ``circuit``, ``pairwise``),
``--bucket-bytes`` its gradient bucket (default 25 MiB; 0 all-reduces each tensor alone) and
``--calibration`` its GPU model (``default``, ``roofline`` for the tables measured before the shipped
fit, or a calibration file); ``exact`` ranks plans by the search's own cost and takes none of them.

``speedup`` prints beside data parallelism (bucketed, the reference; ``OOM`` marks a plan that does
not fit, whose speedup ratios compare against a plan that cannot run) the papers' per-tensor data
parallelism and the compute lower bound ``1 / sum_d (1 / T_d)``, ``T_d`` the whole iteration's
compute on one device of ``d``'s type (:func:`placement_rl.methods.compute_lower_bound_s`; on one
device type, that compute divided by the device count).

Batch sizes follow FlexFlow (sec. 8): 64 samples per GPU (AlexNet 256). Device counts 4, 8 and 16
are the first GPUs of flexflow-p100 (1, 2 and 4 nodes); 32 and 64 those of flexflow-k80. ``delta``
runs the same MCMC three times with a proposal budget: once evaluating proposals by full simulation and
once by delta simulation, and once by delta simulation that cuts off each proposal's schedule
as soon as its makespan is certainly above the cost at which the Metropolis test rejects it; all
three make the same decisions (the costs are identical), so the ratio of wall times is the speedup
of the search loop. Everything runs on one core (NUMBA_NUM_THREADS=1).

``headroom`` runs MCMC twice per instance (FlexFlow's 6 models on flexflow-p100 and flexflow-k80 at
16 GPUs and on tag-testbed, 64 samples per GPU), with FlexFlow's proposals and with the new ones
(``--proposals mixed``, ``--adaptive``, ``--tempering``), and prints the share of the headroom each
captured: ``(DP - found) / (DP - bound)``, DP the bucketed data parallelism. ``exact`` compares both
with the exhaustive optimum on the coarsened LeNet and RNNLM on 4 P100s (the test suite's exact
instances) over seeds 0-9.

``reach`` runs the ``goal`` chain for ``--warm`` proposals (default 8,000; its stopping rule may end it
sooner), then draws ``--proposals`` FlexFlow proposals against the plan it found, each cut off at the
chain's rejection limit and also scheduled in full (:meth:`DeltaSimulator.reach`), accepting as the
chain would, and prints medians and quartiles: the tasks delta simulation keeps and re-times, how
many of the re-timed ones start exactly as before, how much of the schedule is the current one
shifted, and how far above the limit the cut-off proposals end.

``hand`` runs MCMC from data parallelism alone (no other start candidate) on two instances where a
hand-built plan is much faster than data parallelism, once per ``--proposals-kind`` (comma-separated,
default ``flexflow,mixed,coordinated,adaptive``), and prints found / hand (1.00: the hand plan's
makespan reached): (a) AlexNet, 128 samples per GPU, on 8 single-V100 machines over 10 Gb/s Ethernet,
the hand plan its convolutions data parallel and its classifier (flatten onwards) on one GPU;
(b) ResNet-50, 32 samples per GPU, on a machine of 4 NVLink V100s and 4 single-K80 machines over
10 Gb/s, the hand plan data parallelism on the 4 V100s.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np

from placement_rl import zoo
from placement_rl.cli.common import CALIBRATION_HELP, calibration, calibration_spec
from placement_rl.graph import OpGraph
from placement_rl.methods import compute_lower_bound_s
from placement_rl.plan import Plan, data_parallel, data_parallel_per_tensor, expert
from placement_rl.search import mcmc
from placement_rl.search.mcmc import EXTENDED_CANDIDATES, INITIAL_CANDIDATES, rejection_limit
from placement_rl.search.proposals import Proposer
from placement_rl.search.space import SearchSpace
from placement_rl.sim import CostModel, SimContext
from placement_rl.sim.delta import DeltaSimulator
from placement_rl.sim.network import NETWORK_MODELS
from placement_rl.sim.simulator import simulate
from placement_rl.topology import DeviceTopology, load_preset

MODELS = ("alexnet", "resnet101", "inception_v3", "rnntc", "rnnlm", "gnmt")
COUNTS = ((4, "flexflow-p100"), (8, "flexflow-p100"), (16, "flexflow-p100"), (32, "flexflow-k80"), (64, "flexflow-k80"))


#: ``delta`` table columns: (delta simulation, cutoff) of each MCMC run; all three make the same decisions.
VARIANTS = {"full": (False, False), "delta": (True, False), "cutoff": (True, True)}


def _batch(model: str, gpus: int) -> int:
    return (256 if model == "alexnet" else 64) * gpus


def delta_table(
    proposals: int, models: Sequence[str] = MODELS, counts: Sequence[int] | None = None, cost: CostModel | None = None
) -> None:
    print(
        "| model | GPUs | tasks (DP) | full ms/proposal | delta ms/proposal | delta + cutoff ms/proposal "
        "| delta vs full | delta + cutoff vs full |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        for gpus, preset in COUNTS:
            if counts is not None and gpus not in counts:
                continue
            graph = zoo.load(model, batch_size=_batch(model, gpus))
            topo = load_preset(preset)
            devices = [d.name for d in topo.devices[:gpus]]
            tasks = simulate(graph, topo, data_parallel(graph, topo, devices), cost).num_tasks
            times = {}
            for variant, (delta, cutoff) in VARIANTS.items():
                start = time.perf_counter()
                found = mcmc(
                    graph,
                    topo,
                    budget=proposals,
                    initial=("data_parallel",),
                    seed=0,
                    delta=delta,
                    cutoff=cutoff,
                    devices=devices,
                    cost_model=cost,
                )
                times[variant] = (time.perf_counter() - start) / found.proposals
            full, delta_s, cut_s = times["full"], times["delta"], times["cutoff"]
            print(
                f"| {model} | {gpus} | {tasks:,} | {full * 1e3:.2f} | {delta_s * 1e3:.2f} | {cut_s * 1e3:.2f} | "
                f"{full / delta_s:.1f}x | {full / cut_s:.1f}x |",
                flush=True,
            )


def _ms(result: Any) -> str:
    """A plan's ms per iteration, marked ``OOM`` when it does not fit in memory."""
    return f"{result.makespan_s * 1e3:.1f}" + (" OOM" if result.oom else "")


def speedup_table(
    budget: str, models: Sequence[str] = MODELS, cost: CostModel | None = None, proposals: str = "flexflow"
) -> None:
    print(f"MCMC: proposals {proposals}; budget {budget} per search, seed 0, one chain")
    print(
        f"| model | cluster | DP ms | DP per tensor ms | bound ms | expert ms | MCMC ms ({budget}) | vs DP "
        f"| vs expert | proposals | MCMC + subset-DP start ms | vs DP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset in ("flexflow-p100", "flexflow-k80", "tag-testbed"):
        topo = load_preset(preset)
        for model in models:
            graph = zoo.load(model, batch_size=_batch(model, topo.num_devices))
            dp_result = simulate(graph, topo, data_parallel(graph, topo), cost)
            per_tensor = simulate(graph, topo, data_parallel_per_tensor(graph, topo), cost)
            bound = compute_lower_bound_s(SimContext(graph, topo, cost))
            ex_result = simulate(graph, topo, expert(graph, topo), cost)
            options = {"budget": budget, "seed": 0, "cost_model": cost, "proposals": proposals}
            found = mcmc(graph, topo, initial=INITIAL_CANDIDATES, **options)  # type: ignore[arg-type]  # FlexFlow's
            extended = mcmc(graph, topo, initial=EXTENDED_CANDIDATES, **options)  # type: ignore[arg-type]
            dp, ex = dp_result.makespan_s, ex_result.makespan_s
            ms, xs = found.result.makespan_s, extended.result.makespan_s
            cells = [_ms(r) for r in (dp_result, per_tensor)] + [f"{bound * 1e3:.1f}", _ms(ex_result)]
            print(
                f"| {model} | {preset} | {' | '.join(cells)} | {_ms(found.result)} | {dp / ms:.2f}x | "
                f"{ex / ms:.2f}x | {found.proposals:,} | {_ms(extended.result)} | {dp / xs:.2f}x |",
                flush=True,
            )


def goal(proposals: int, cost: CostModel | None = None) -> None:
    graph = zoo.load("inception_v3", batch_size=_batch("inception_v3", 16))
    topo = load_preset("flexflow-p100")
    start = time.perf_counter()
    found = mcmc(graph, topo, budget=proposals, seed=0, initial=("data_parallel",), cost_model=cost)
    elapsed = time.perf_counter() - start
    rate = found.proposals / elapsed
    print(
        f"inception_v3 x flexflow-p100 (16 GPUs): {found.proposals:,} proposals in {elapsed:.1f} s "
        f"({rate:,.0f}/s); projected for {proposals:,}: {proposals / rate:.0f} s"
    )


def reach_table(warm: int, proposals: int, cost: CostModel | None = None) -> None:
    """What delta simulation re-times on inception_v3 x 16 GPUs late in a chain, and what it could skip."""
    graph = zoo.load("inception_v3", batch_size=_batch("inception_v3", 16))
    topo = load_preset("flexflow-p100")
    found = mcmc(graph, topo, budget=warm, seed=0, initial=("data_parallel",), cost_model=cost)
    sim = DeltaSimulator.for_plan(SimContext(graph, topo, cost), found.plan)
    proposer = Proposer(graph, topo, SearchSpace(graph, topo), "flexflow")
    rng = np.random.default_rng(1)
    # the chain's Metropolis scale: MCMC's default beta over its starting (data-parallel) cost
    scale = inspect.signature(mcmc).parameters["beta"].default / found.initial_costs_s["data_parallel"]
    rows: list[tuple[float, ...]] = []
    margins: list[float] = []
    cuts = 0
    while len(rows) < proposals:
        _, drawn = proposer.draw(sim.configs, rng)
        changes = {i: c for i, c in drawn.items() if c != sim.configs[i]}  # type: ignore[union-attr]
        if not changes:
            continue
        limit = rejection_limit(sim.cost, float(rng.random()), scale)
        bounded = sim.propose_many(changes, limit)
        sim.reject()
        reach = sim.reach(changes)
        if bounded == math.inf:
            cuts += 1
            margins.append(reach.makespan_s / limit)
        rows.append(
            (
                reach.tasks,
                reach.kept / reach.tasks,
                reach.timed / reach.tasks,
                reach.new / max(reach.timed, 1),
                reach.unchanged / max(reach.timed, 1),
                (reach.timed - reach.new - reach.shifted_tail) / max(reach.timed - reach.new, 1),
            )
        )
        if bounded <= limit:  # accepted (the Metropolis test with this draw): the chain moves on
            sim.propose_many(changes)
            sim.accept()
    table = np.array(rows)
    print(
        f"inception_v3 x flexflow-p100 (16 GPUs), after {found.proposals:,} proposals from data parallelism; "
        f"{proposals:,} FlexFlow proposals (median [quartiles])"
    )
    print("| figure | value |")
    print("|---|---|")

    def cell(x: np.ndarray, percent: bool = True) -> str:
        q1, q2, q3 = np.percentile(x, [25, 50, 75])
        return f"{q2:.0%} [{q1:.0%}, {q3:.0%}]" if percent else f"{q2:,.0f} [{q1:,.0f}, {q3:,.0f}]"

    figures = [
        ("tasks", cell(table[:, 0], False)),
        ("kept by delta simulation (ready before the change can matter)", cell(table[:, 1])),
        ("timed again", cell(table[:, 2])),
        ("of those, new (the changed ops' tasks, their transfers and synchronization)", cell(table[:, 3])),
        ("of those, starting exactly as before (what re-timing only the reached tasks would skip)", cell(table[:, 4])),
        ("of the others, before the tail that is the current schedule shifted", cell(table[:, 5])),
        ("cut off above the rejection limit", f"{cuts / proposals:.0%}"),
    ]
    for figure, value in figures:
        print(f"| {figure} | {value} |")
    if margins:
        print(f"| cut-off proposals' makespan / rejection limit | {cell(np.array(margins) - 1.0)} over |")


def _new_options(args: argparse.Namespace) -> dict[str, object]:
    return {"proposals": args.proposals_kind or "mixed", "adaptive": args.adaptive, "tempering": args.tempering}


def _label(options: dict[str, object]) -> str:
    parts = [str(options["proposals"])]
    if options["adaptive"] is not None:
        parts.append(f"adaptive {options['adaptive']}")
    if options["tempering"] != 1:
        parts.append(f"tempering {options['tempering']}")
    return ", ".join(parts)


def headroom_table(
    budget: str,
    new: dict[str, object],
    models: Sequence[str] = MODELS,
    presets: Sequence[str] = ("flexflow-p100", "flexflow-k80", "tag-testbed"),
    cost: CostModel | None = None,
    seed: int = 0,
) -> None:
    print(f"MCMC-new: proposals {_label(new)}; budget {budget} per search, seed 0, one chain, 16 GPUs")
    print(
        "| model | cluster | DP ms | bound ms | DP / bound | MCMC-flexflow ms | flexflow captured | MCMC-new ms "
        "| new captured | proposals (flexflow / new) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset in presets:
        topo = load_preset(preset)
        devices = [d.name for d in topo.devices[:16]]
        for model in models:
            graph = zoo.load(model, batch_size=_batch(model, len(devices)))
            dp = simulate(graph, topo, data_parallel(graph, topo, devices), cost).makespan_s
            bound = compute_lower_bound_s(SimContext(graph, topo, cost), devices)
            old = mcmc(graph, topo, budget=budget, seed=seed, cost_model=cost, devices=devices)
            found = mcmc(graph, topo, budget=budget, seed=seed, cost_model=cost, devices=devices, **new)  # type: ignore[arg-type]
            cells = []
            for r in (old, found):
                ms = r.result.makespan_s
                share = (dp - ms) / (dp - bound) if dp - bound > 1e-12 else float("nan")
                cells.append(f"{ms * 1e3:.1f} | {share:.0%}")
            print(
                f"| {model} | {preset} | {dp * 1e3:.1f} | {bound * 1e3:.1f} | {dp / bound:.2f}x | {cells[0]} | "
                f"{cells[1]} | {old.proposals:,} / {found.proposals:,} |",
                flush=True,
            )


def exact_table(proposals: int, new: dict[str, object], seeds: Sequence[int] = tuple(range(10))) -> None:
    from placement_rl.graph.coarsen import coarsen
    from placement_rl.search import SearchSpace, exhaustive

    topo = load_preset("flexflow-p100")
    devices = [d.name for d in topo.devices[:4]]
    print(f"| instance | optimum ms | mode | exact (of {len(seeds)}) | worst miss | misses |")
    print("|---|---|---|---|---|---|")
    for model, options in (("lenet", {}), ("rnnlm", {"steps": 2})):
        graph = coarsen(zoo.load(model, **options), 4)
        optimum = exhaustive(graph, topo, SearchSpace(graph, topo, devices=devices)).cost_s
        for label, kw in (("flexflow", {}), (_label(new), new)):
            gaps = []
            for seed in seeds:
                found = mcmc(graph, topo, budget=proposals, seed=seed, devices=devices, **kw)  # type: ignore[arg-type]
                gaps.append(found.cost_s / optimum - 1)
            hits = sum(g <= 1e-12 for g in gaps)
            misses = ", ".join(f"seed {s}: +{g:.2%}" for s, g in zip(seeds, gaps, strict=True) if g > 1e-12) or "-"
            print(
                f"| {model} (4 groups, 4 P100) | {optimum * 1e3:.3f} | {label} | {hits}/{len(seeds)} | "
                f"{max(gaps):+.3%} | {misses} |",
                flush=True,
            )


def hand_instances() -> list[tuple[str, OpGraph, DeviceTopology, Plan]]:
    """``hand``'s instances: ``(label, graph, topology, hand-built plan)`` (see the module docstring)."""
    from placement_rl.plan import OpConfig, subset_data_parallel
    from placement_rl.topology.builder import TopologyBuilder, Uplink, switched_machine
    from placement_rl.topology.devices import gbit_to_bytes_per_s

    b = TopologyBuilder()
    eth: Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    for _ in range(8):
        switched_machine(b, "V100-SXM2-16GB", 1, eth)
    slow_links = b.build("8x1-V100-10g")
    cnn = zoo.load("alexnet", batch_size=128 * 8)
    head = next(i for i, op in enumerate(cnn.ops) if op.op_type == "flatten")
    dp = data_parallel(cnn, slow_links)
    one = OpConfig.make(slow_links.devices[0].name)
    fc = Plan(cnn.name, {op.name: one if i >= head else dp[op.name] for i, op in enumerate(cnn.ops)}, name="hand")

    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    switched_machine(b, "V100-SXM2-16GB", 4, eth, nvlink_bytes_per_s=25e9)
    for _ in range(4):
        switched_machine(b, "K80", 1, eth)
    mixed = b.build("4xV100+4xK80-10g")
    resnet = zoo.load("resnet50", batch_size=32 * mixed.num_devices)
    fast = subset_data_parallel(resnet, mixed)
    return [
        ("(a) alexnet, 8x1 V100, 10 Gb/s", cnn, slow_links, fc),
        ("(b) resnet50, 4 V100 + 4 K80, 10 Gb/s", resnet, mixed, fast),
    ]


def hand_table(budget: str, kinds: Sequence[str], restart: int | None = None, cost: CostModel | None = None) -> None:
    """MCMC from data parallelism alone vs the hand-built plans of :func:`hand_instances`."""
    print(
        f"MCMC from data parallelism alone, budget {budget}, seed 0, one chain"
        + (f", restart {restart}" if restart else "")
    )
    print("| instance | DP ms | hand ms | DP / hand | proposals | found ms | found / hand | proposals made |")
    print("|---|---|---|---|---|---|---|---|")
    for label, graph, topo, hand in hand_instances():
        dp = simulate(graph, topo, data_parallel(graph, topo), cost).makespan_s
        ms = simulate(graph, topo, hand, cost).makespan_s
        for kind in kinds:
            extra: dict[str, Any] = {"restart": restart} if restart else {}  # (searches before restart= ran too)
            found = mcmc(
                graph, topo, budget=budget, seed=0, initial=("data_parallel",), proposals=kind, cost_model=cost, **extra
            )
            got = found.result.makespan_s
            print(
                f"| {label} | {dp * 1e3:.1f} | {ms * 1e3:.1f} | {dp / ms:.2f}x | {kind} | {got * 1e3:.1f} | "
                f"{got / ms:.2f} | {found.proposals:,} |",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["delta", "speedup", "goal", "headroom", "exact", "hand", "reach"])
    parser.add_argument("--proposals", type=int, default=None)
    parser.add_argument("--budget", default="20s", help="speedup: MCMC budget, seconds ('20s') or proposals")
    parser.add_argument("--models", default=",".join(MODELS), help="delta, speedup: comma-separated zoo models")
    parser.add_argument(
        "--gpus", default=",".join(str(g) for g, _ in COUNTS), help="delta: comma-separated device counts"
    )
    parser.add_argument("--network", default="flow", choices=list(NETWORK_MODELS), help="the network model")
    parser.add_argument("--bucket-bytes", type=int, default=25 * 2**20, help="gradient bucket, bytes (0: per tensor)")
    parser.add_argument("--presets", default="flexflow-p100,flexflow-k80,tag-testbed", help="headroom: clusters")
    parser.add_argument(
        "--proposals-kind",
        default=None,
        help="headroom, exact: the new mode's proposals (mixed); speedup: MCMC's (flexflow); hand: comma-separated",
    )
    parser.add_argument("--adaptive", type=float, default=None, help="headroom, exact: adaptive target rate")
    parser.add_argument("--tempering", type=int, default=1, help="headroom, exact: tempering replicas")
    parser.add_argument("--restart", type=int, default=None, help="hand: restart from the best after N idle proposals")
    parser.add_argument("--seeds", type=int, default=10, help="exact: seeds 0..N-1")
    parser.add_argument("--warm", type=int, default=8000, help="reach: MCMC proposals before the measured ones")
    parser.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    args = parser.parse_args(argv)
    models = args.models.split(",")
    gpu_model = calibration(args.calibration)
    cost = CostModel(network=args.network, bucket_bytes=args.bucket_bytes, calibration=gpu_model)
    if args.what == "delta":
        delta_table(args.proposals or 300, models, [int(g) for g in args.gpus.split(",")], cost)
    elif args.what == "speedup":
        speedup_table(args.budget, models, cost, args.proposals_kind or "flexflow")
    elif args.what == "headroom":
        headroom_table(args.budget, _new_options(args), models, args.presets.split(","), cost)
    elif args.what == "hand":
        hand_table(
            args.budget, (args.proposals_kind or "flexflow,mixed,coordinated,adaptive").split(","), args.restart, cost
        )
    elif args.what == "reach":
        reach_table(args.warm, args.proposals or 200, cost)
    elif args.what == "exact":
        exact_table(args.proposals or 6000, _new_options(args), tuple(range(args.seeds)))
    else:
        goal(args.proposals or 100_000, cost)


if __name__ == "__main__":
    main()
