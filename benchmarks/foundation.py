"""Benchmark the foundation: zoo import time and METIS coarsening time.

Usage::

    python benchmarks/foundation.py [--repeats 5]

Prints a Markdown table (median over ``--repeats`` runs, after one warm-up run that is reported
separately as the cold time; the cold time includes torch.fx's one-time start-up).
Goals (issue 2): importing bert_large and inception_v3 under 10 s each; coarsening the largest zoo
graph into 60 groups under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print("| what | ops | cold (s) | median (s) | goal |")
    print("|---|---|---|---|---|")
    for name in ("bert_large", "inception_v3"):
        cold, median = _time(lambda: zoo.load(name), args.repeats)
        print(f"| import {name} | {zoo.load(name).num_ops} | {cold:.2f} | {median:.2f} | < 10 s |")
    graphs = {name: zoo.load(name) for name in zoo.names()}
    largest = max(graphs.values(), key=lambda g: g.num_ops)
    cold, median = _time(lambda: coarsen(largest, 60), args.repeats)
    print(f"| coarsen {largest.name} to 60 groups | {largest.num_ops} | {cold:.3f} | {median:.3f} | < 1 s |")


if __name__ == "__main__":
    main()
