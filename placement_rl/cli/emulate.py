"""``emulate``: time communication patterns on an emulated cluster (network namespaces, bridges and
shaped veths on this machine, one gloo process per device) and compare them with the simulator's
network models. Needs root, ``ip`` and ``tc``; ``--cleanup`` removes what a crashed run left."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from placement_rl.cli.common import (
    json_parser,
    name_list,
    non_negative_int,
    positive_float,
    positive_int,
    print_json,
    print_table,
)


def cmd_emulate(args: argparse.Namespace) -> None:
    from placement_rl.emulate import (
        Sizes,
        cleanup_leftovers,
        emulate,
        layout,
        patterns_for,
        report_json,
        resolve_emulation_topology,
        simulate_pattern,
        summary_lines,
        table_rows,
    )

    if args.cleanup is not None:
        deleted, kept = cleanup_leftovers(args.cleanup)
        print(f"removed {len(deleted)} namespace(s) of crashed runs" + (f": {', '.join(deleted)}" if deleted else ""))
        if kept:
            print(f"kept {len(kept)} namespace(s) of runs still going: {', '.join(kept)}")
        return
    sizes = Sizes(message_bytes=int(args.message_mib * 2**20) // 256 * 256, compute_s=args.compute_ms / 1e3)
    rates = {"bottleneck_mbit": args.bottleneck_mbit, "min_mbit": args.min_mbit, "max_mbit": args.max_mbit}
    topologies = [resolve_emulation_topology(spec) for spec in args.topology]
    if args.dry_run:
        for topology in topologies:
            lay = layout(topology, **rates)
            print(lay.describe())
            emulated = lay.emulated_topology(latency_shaped=False)
            for pattern in patterns_for(topology, sizes, args.patterns):
                print(f"  {pattern.name}: {simulate_pattern(pattern, emulated) * 1e3:,.1f} ms  {pattern.description}")
        return

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    reports: list[Any] = []
    try:
        for topology in topologies:
            reports.append(
                emulate(
                    topology, args.patterns, sizes=sizes, repeats=args.repeats, warmup=args.warmup, log=log, **rates
                )
            )
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP: emulate has removed what it made
        print(f"error: interrupted ({exc or 'Ctrl-C'}); the emulated cluster was removed", file=sys.stderr)
        raise SystemExit(130) from None
    results = [r for report in reports for r in report.results]
    if args.json:
        print_json([report_json(report) for report in reports])
        return
    headers, rows = table_rows(results)
    print_table(headers, rows)
    print()
    for line in summary_lines(results):
        print(line)


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "emulate",
        parents=[json_parser()],
        help="time communication patterns on an emulated cluster and compare with the network models",
        description=__doc__,
    )
    p.add_argument(
        "--topology",
        type=name_list,
        default=["2x2"],
        help="comma-separated topologies: MxG[@NIC_GBIT] (M machines x G GPUs on PCIe, one NIC each, default "
        "25 Gb/s), a preset, random:SEED or a topology .json (default 2x2)",
    )
    p.add_argument("--patterns", type=name_list, default=None, help="comma-separated pattern names (default: all)")
    p.add_argument("--message-mib", type=positive_float, default=4.0, help="point-to-point message size (default 4)")
    p.add_argument("--compute-ms", type=positive_float, default=100.0, help="a forward step's compute (default 100)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs per pattern (default 3)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs per pattern first (default 1)")
    p.add_argument(
        "--bottleneck-mbit", type=positive_float, default=100.0, help="the slowest link's rate (default 100)"
    )
    p.add_argument("--min-mbit", type=positive_float, default=50.0, help="the slowest rate a link may get (default 50)")
    p.add_argument(
        "--max-mbit", type=positive_float, default=800.0, help="the fastest rate a link may get (default 800)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the scale, the links and the simulated patterns only")
    p.add_argument(
        "--cleanup",
        nargs="?",
        const="prlemu-",
        default=None,
        metavar="PREFIX",
        help="remove the namespaces and processes crashed runs left (those named PREFIX*, default prlemu-) and exit",
    )
    p.set_defaults(func=cmd_emulate)
