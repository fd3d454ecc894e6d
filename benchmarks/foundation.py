"""Benchmark the foundation: zoo import time and METIS coarsening time.

Usage::

    python benchmarks/foundation.py [--repeats 5] [--models bert_large,inception_v3] [--coarsen-from all] [--groups 60]

Prints a Markdown table (median over ``--repeats`` runs, after one warm-up run that is reported
separately as the cold time; the cold time includes torch.fx's one-time start-up). ``--models`` are
the imported models; the largest graph of ``--coarsen-from`` (``all``: the whole zoo) is coarsened
into ``--groups`` groups. A tiny run: ``--repeats 1 --models lenet --coarsen-from lenet --groups 4``.
Goals: importing bert_large and inception_v3 under 10 s each; coarsening the largest zoo
graph into 60 groups under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

from placement_rl import zoo
from placement_rl.graph.coarsen import coarsen


def _time(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(cold seconds, median warm seconds)."""
    start = time.perf_counter()
    fn()
    cold = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="bert_large,inception_v3", help="comma-separated models to import")
    parser.add_argument("--coarsen-from", default="all", help="comma-separated models whose largest is coarsened")
    parser.add_argument("--groups", type=int, default=60, help="groups of the coarsening")
    args = parser.parse_args(argv)

    print("| what | ops | cold (s) | median (s) | goal |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        cold, median = _time(partial(zoo.load, name), args.repeats)
        print(f"| import {name} | {zoo.load(name).num_ops} | {cold:.2f} | {median:.2f} | < 10 s |")
    names = zoo.names() if args.coarsen_from == "all" else args.coarsen_from.split(",")
    largest = max((zoo.load(name) for name in names), key=lambda g: g.num_ops)
    cold, median = _time(lambda: coarsen(largest, args.groups), args.repeats)
    print(f"| coarsen {largest.name} to {args.groups} groups | {largest.num_ops} | {cold:.3f} | {median:.3f} | < 1 s |")


if __name__ == "__main__":
    main()
