"""``fidelity``: execute plans on one-thread CPU workers (on this machine, or on an emulated cluster) and
compare the measured iteration times with the simulator's, profiled and with the measured link
(:func:`placement_rl.execute.fidelity.run_fidelity`). The emulated cluster needs root, ``ip`` and ``tc``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from placement_rl.cli.common import json_parser, name_list, non_negative_int, positive_int, print_json, print_table


def cmd_fidelity(args: argparse.Namespace) -> None:
    from placement_rl.execute.fidelity import parse_cluster, run_fidelity, select_cases

    parse_cluster(args.cluster)  # a bad spec is an error before anything runs
    cases = select_cases(args.cases)
    report = run_fidelity(
        cases,
        cluster=args.cluster,
        workers=args.workers,
        iterations=args.iterations,
        warmup=args.warmup,
        out_dir=args.out,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.json:
        print_json({"summary": report.summary(), "link": report.link.to_dict(), "rows": report.rows})
        return
    headers, rows = report.table()
    print_table(headers, rows)
    print()
    for line in report.lines()[len(rows) + 3 :]:
        print(line)


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "fidelity",
        parents=[json_parser()],
        help="execute plans on CPU workers and compare the measured times with the simulator's",
        description=__doc__,
    )
    p.add_argument("--cluster", default="local", help="local or emulated:MxG@NIC_GBIT (default local)")
    p.add_argument("--workers", type=positive_int, default=None, help="local workers (default 2)")
    p.add_argument("--cases", type=name_list, default=None, help="comma-separated model/plan cases (default: all)")
    p.add_argument("--iterations", type=positive_int, default=5, help="measured iterations per case (default 5)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="unmeasured iterations first (default 1)")
    p.add_argument("--out", default=None, help="folder for results.jsonl, link.json, topology.json, profile.json")
    p.set_defaults(func=cmd_fidelity)
