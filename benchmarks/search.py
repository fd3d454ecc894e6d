"""Benchmark FlexFlow's MCMC search: full vs delta simulation (FlexFlow Table 5) and found speedups.

Usage::

    python benchmarks/search.py delta [--proposals 300]     # Table 5: per-proposal time, full vs delta
    python benchmarks/search.py speedup [--budget 20s]      # found plan vs data parallel / expert (+ tag-testbed)
    python benchmarks/search.py goal [--proposals 100000]   # 100k proposals, inception_v3, 16 GPUs

``--models`` (delta, speedup) and ``--gpus`` (delta) narrow the tables; a tiny run:
``delta --models lenet --gpus 4 --proposals 5``, ``speedup --models lenet --budget 5`` (proposals).

Batch sizes follow FlexFlow (sec. 8): 64 samples per GPU (AlexNet 256). Device counts 4, 8 and 16
are the first GPUs of flexflow-p100 (1, 2 and 4 nodes); 32 and 64 those of flexflow-k80. ``delta``
runs the same MCMC twice with a proposal budget, once evaluating proposals by full simulation and
once by delta simulation; both make the same decisions (the costs are identical), so the ratio of
wall times is the speedup of the search loop. Everything runs on one core (NUMBA_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

from placement_rl import zoo
from placement_rl.plan import data_parallel, expert
from placement_rl.search import mcmc
from placement_rl.search.mcmc import EXTENDED_CANDIDATES, INITIAL_CANDIDATES
from placement_rl.sim.simulator import simulate
from placement_rl.topology import load_preset

MODELS = ("alexnet", "resnet101", "inception_v3", "rnntc", "rnnlm", "gnmt")
COUNTS = ((4, "flexflow-p100"), (8, "flexflow-p100"), (16, "flexflow-p100"), (32, "flexflow-k80"), (64, "flexflow-k80"))


def _batch(model: str, gpus: int) -> int:
    return (256 if model == "alexnet" else 64) * gpus


def delta_table(proposals: int, models: Sequence[str] = MODELS, counts: Sequence[int] | None = None) -> None:
    print("| model | GPUs | tasks (DP) | full ms/proposal | delta ms/proposal | speedup |")
    print("|---|---|---|---|---|---|")
    for model in models:
        for gpus, preset in COUNTS:
            if counts is not None and gpus not in counts:
                continue
            graph = zoo.load(model, batch_size=_batch(model, gpus))
            topo = load_preset(preset)
            devices = [d.name for d in topo.devices[:gpus]]
            tasks = simulate(graph, topo, data_parallel(graph, topo, devices)).num_tasks
            times = {}
            for delta in (False, True):
                start = time.perf_counter()
                found = mcmc(
                    graph, topo, budget=proposals, initial=("data_parallel",), seed=0, delta=delta, devices=devices
                )
                times[delta] = (time.perf_counter() - start) / found.proposals
            print(
                f"| {model} | {gpus} | {tasks:,} | {times[False] * 1e3:.2f} | {times[True] * 1e3:.2f} | "
                f"{times[False] / times[True]:.1f}x |",
                flush=True,
            )


def speedup_table(budget: str, models: Sequence[str] = MODELS) -> None:
    print(
        f"| model | cluster | DP ms | expert ms | MCMC ms ({budget}) | vs DP | vs expert | proposals "
        f"| MCMC + subset-DP start ms | vs DP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset in ("flexflow-p100", "flexflow-k80", "tag-testbed"):
        topo = load_preset(preset)
        for model in models:
            graph = zoo.load(model, batch_size=_batch(model, topo.num_devices))
            dp = simulate(graph, topo, data_parallel(graph, topo)).makespan_s
            ex = simulate(graph, topo, expert(graph, topo)).makespan_s
            found = mcmc(graph, topo, budget=budget, seed=0, initial=INITIAL_CANDIDATES)  # FlexFlow's
            extended = mcmc(graph, topo, budget=budget, seed=0, initial=EXTENDED_CANDIDATES)
            ms, xs = found.result.makespan_s, extended.result.makespan_s
            print(
                f"| {model} | {preset} | {dp * 1e3:.1f} | {ex * 1e3:.1f} | {ms * 1e3:.1f} | {dp / ms:.2f}x | "
                f"{ex / ms:.2f}x | {found.proposals:,} | {xs * 1e3:.1f} | {dp / xs:.2f}x |",
                flush=True,
            )


def goal(proposals: int) -> None:
    graph = zoo.load("inception_v3", batch_size=_batch("inception_v3", 16))
    topo = load_preset("flexflow-p100")
    start = time.perf_counter()
    found = mcmc(graph, topo, budget=proposals, seed=0, initial=("data_parallel",))
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
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if args.what == "delta":
        delta_table(args.proposals or 300, models, [int(g) for g in args.gpus.split(",")])
    elif args.what == "speedup":
        speedup_table(args.budget, models)
    else:
        goal(args.proposals or 100_000)


if __name__ == "__main__":
    main()
