"""Check the simulator's network models against an emulated cluster.

Usage (root, iproute2; about 80 s per topology)::

    python benchmarks/network.py [--topologies 2x2,3x2@200,4x1] [--repeats 5] [--message-mib 4]

Each topology (``MxG@NIC``: M machines x G GPUs on a PCIe switch each, a NIC of NIC Gb/s per machine,
see :func:`placement_rl.emulate.switched_cluster`) is built on this machine as network namespaces,
bridges and shaped veths, scaled so that its slowest link runs at 100 Mbit/s; one gloo process per
device times every pattern of :mod:`placement_rl.emulate.patterns` (the median of ``--repeats`` runs
after a warm-up; a run in which a worker started more than 20 ms late is run again), and the
simulator runs the same patterns on the same scaled topology under every network model it offers.
Prints one Markdown table (measured and simulated milliseconds, each model's error
``simulated / measured - 1``), then per model the median and worst absolute error and whether the
``flow`` model meets the goal: median at most 10%, worst at most 25%, over at least 12 patterns, and
a lower median than the other models. A tiny run: ``--topologies 2x1 --patterns
p2p_inter --repeats 1 --warmup 0 --message-mib 0.25``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl.emulate import Sizes, emulate, resolve_emulation_topology, summary_lines, table_rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", default="2x2,3x2@200,4x1")
    parser.add_argument("--patterns", default=None, help="comma-separated pattern names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--message-mib", type=float, default=4.0)
    parser.add_argument("--compute-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    sizes = Sizes(message_bytes=int(args.message_mib * 2**20) // 256 * 256, compute_s=args.compute_ms / 1e3)
    patterns = args.patterns.split(",") if args.patterns else None

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    reports = []
    for spec in args.topologies.split(","):
        topology = resolve_emulation_topology(spec)
        reports.append(emulate(topology, patterns, sizes=sizes, repeats=args.repeats, warmup=args.warmup, log=log))
    results = [r for report in reports for r in report.results]
    command = " ".join(["python benchmarks/network.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"`{command}`\n")
    headers, rows = table_rows(results)
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    for line in summary_lines(results):
        print(f"- {line}")
    for report in reports:
        lay = report.layout
        print(
            f"- {lay.topology.name}: scale 1/{1 / lay.scale:,.0f}, links "
            f"{min(s.rate_bit_per_s for s in lay.links) / 1e6:g}-{max(s.rate_bit_per_s for s in lay.links) / 1e6:g} "
            f"Mbit/s, latency {'shaped' if report.latency_shaped else 'not shaped (no netem)'}, "
            f"workers {'at real-time priority' if report.realtime else 'at normal priority'}, latest start "
            f"{report.max_late_s * 1e3:.1f} ms, {sum(r.redone for r in report.results)} runs redone after a late "
            f"start, {report.wall_s:.0f} s"
        )


if __name__ == "__main__":
    main()
