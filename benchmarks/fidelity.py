"""Simulator fidelity: plans executed on CPU workers against the simulator's prediction.

Usage (a few minutes; the emulated cluster needs root, ``ip`` and ``tc``)::

    python benchmarks/fidelity.py --cluster local [--iterations 5] [--out fidelity-local]
    python benchmarks/fidelity.py --cluster emulated:2x1@1

Profiles the ops of every model with one thread, fits the link between two workers to a ping-pong
(loopback, or the shaped veths of the emulated cluster), builds a topology of CPU devices joined by the
measured link, then executes each case (model x plan, the defaults) on one-thread gloo workers
and simulates it with the profiled cost model (see :mod:`placement_rl.execute.fidelity`). Each case's row
is appended to ``OUT/results.jsonl`` as soon as it is measured. Prints one Markdown table (measured,
simulated and replayed milliseconds, the errors ``simulated / measured - 1``), the Spearman rank correlation
over the cases and the median and worst absolute error; then whether they meet the goal (median <= 10%,
worst <= 30%, Spearman >= 0.9), which is reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl.execute.fidelity import run_fidelity, select_cases

GOAL = {"median": 0.10, "worst": 0.30, "spearman": 0.9}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="local", help="local or emulated:MxG@NIC (default local)")
    parser.add_argument("--workers", type=int, default=None, help="local workers (default 2)")
    parser.add_argument("--iterations", type=int, default=5, help="measured iterations per case (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured iterations first (default 1)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (model/plan) of the defaults")
    parser.add_argument("--out", default=None, help="folder of results.jsonl etc. (default fidelity-<cluster>)")
    args = parser.parse_args(argv)
    try:
        cases = select_cases(args.cases.split(",") if args.cases else None)
    except ValueError as exc:
        parser.error(str(exc))
    out = args.out or "fidelity-" + args.cluster.replace(":", "-").replace("@", "-")
    report = run_fidelity(
        cases,
        cluster=args.cluster,
        workers=args.workers,
        iterations=args.iterations,
        warmup=args.warmup,
        out_dir=out,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print("\n".join(report.lines()))
    s = report.summary()
    met = (
        s["median_abs_error"] is not None
        and s["median_abs_error"] <= GOAL["median"]
        and s["worst_abs_error"] <= GOAL["worst"]
        and s["spearman"] is not None
        and s["spearman"] >= GOAL["spearman"]
    )
    print(
        f"goal (median |error| <= {GOAL['median']:.0%}, worst <= {GOAL['worst']:.0%}, Spearman >= "
        f"{GOAL['spearman']}): {'met' if met else 'missed'}; rows in {out}/results.jsonl"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
