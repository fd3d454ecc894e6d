"""Benchmark FlexFlow's MCMC search: full vs delta simulation (FlexFlow Table 5) and found speedups.

Usage::

    python benchmarks/search.py delta [--proposals 300]     # Table 5: per-proposal time, full vs delta
    python benchmarks/search.py speedup [--budget 20s]      # found plan vs data parallel / expert (+ tag-testbed)
    python benchmarks/search.py goal [--proposals 100000]   # 100k proposals, inception_v3, 16 GPUs

``--models`` (delta, speedup) and ``--gpus`` (delta) narrow the tables; a tiny run:
``delta --models lenet --gpus 4 --proposals 5``, ``speedup --models lenet --budget 5`` (proposals).
``--network`` picks the simulator's network model (``flow``, the default, ``circuit``, ``pairwise``)
and ``--bucket-bytes`` its gradient bucket (default 25 MiB; 0 all-reduces each tensor alone).

``speedup`` prints beside data parallelism (bucketed, the reference) the papers' per-tensor data
parallelism and the compute lower bound: the whole iteration's compute on the fastest device
divided by the device count (no plan is faster on this cluster).

Batch sizes follow FlexFlow (sec. 8): 64 samples per GPU (AlexNet 256). Device counts 4, 8 and 16
are the first GPUs of flexflow-p100 (1, 2 and 4 nodes); 32 and 64 those of flexflow-k80. ``delta``
runs the same MCMC three times with a proposal budget: once evaluating proposals by full simulation and
once by delta simulation, and once by delta simulation that cuts off each proposal's schedule
as soon as its makespan is certainly above the cost at which the Metropolis test rejects it; all
three make the same decisions (the costs are identical), so the ratio of wall times is the speedup
of the search loop. Everything runs on one core (NUMBA_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

from placement_rl import zoo
from placement_rl.plan import data_parallel, data_parallel_per_tensor, expert, single_device
from placement_rl.search import mcmc
from placement_rl.search.mcmc import EXTENDED_CANDIDATES, INITIAL_CANDIDATES
from placement_rl.sim import CostModel
from placement_rl.sim.network import NETWORK_MODELS
from placement_rl.sim.simulator import simulate
from placement_rl.topology import load_preset

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


def speedup_table(budget: str, models: Sequence[str] = MODELS, cost: CostModel | None = None) -> None:
    print(
        f"| model | cluster | DP ms | DP per tensor ms | bound ms | expert ms | MCMC ms ({budget}) | vs DP "
        f"| vs expert | proposals | MCMC + subset-DP start ms | vs DP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset in ("flexflow-p100", "flexflow-k80", "tag-testbed"):
        topo = load_preset(preset)
        for model in models:
            graph = zoo.load(model, batch_size=_batch(model, topo.num_devices))
            dp = simulate(graph, topo, data_parallel(graph, topo), cost).makespan_s
            per_tensor = simulate(graph, topo, data_parallel_per_tensor(graph, topo), cost).makespan_s
            bound = simulate(graph, topo, single_device(graph, topo), cost).busy_s.sum() / topo.num_devices
            ex = simulate(graph, topo, expert(graph, topo), cost).makespan_s
            found = mcmc(graph, topo, budget=budget, seed=0, initial=INITIAL_CANDIDATES, cost_model=cost)  # FlexFlow's
            extended = mcmc(graph, topo, budget=budget, seed=0, initial=EXTENDED_CANDIDATES, cost_model=cost)
            ms, xs = found.result.makespan_s, extended.result.makespan_s
            print(
                f"| {model} | {preset} | {dp * 1e3:.1f} | {per_tensor * 1e3:.1f} | {bound * 1e3:.1f} | "
                f"{ex * 1e3:.1f} | {ms * 1e3:.1f} | {dp / ms:.2f}x | {ex / ms:.2f}x | {found.proposals:,} | "
                f"{xs * 1e3:.1f} | {dp / xs:.2f}x |",
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


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["delta", "speedup", "goal"])
    parser.add_argument("--proposals", type=int, default=None)
    parser.add_argument("--budget", default="20s", help="speedup: MCMC budget, seconds ('20s') or proposals")
    parser.add_argument("--models", default=",".join(MODELS), help="delta, speedup: comma-separated zoo models")
    parser.add_argument(
        "--gpus", default=",".join(str(g) for g, _ in COUNTS), help="delta: comma-separated device counts"
    )
    parser.add_argument("--network", default="flow", choices=list(NETWORK_MODELS), help="the network model")
    parser.add_argument("--bucket-bytes", type=int, default=25 * 2**20, help="gradient bucket, bytes (0: per tensor)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    cost = CostModel(network=args.network, bucket_bytes=args.bucket_bytes)
    if args.what == "delta":
        delta_table(args.proposals or 300, models, [int(g) for g in args.gpus.split(",")], cost)
    elif args.what == "speedup":
        speedup_table(args.budget, models, cost)
    else:
        goal(args.proposals or 100_000, cost)


if __name__ == "__main__":
    main()
