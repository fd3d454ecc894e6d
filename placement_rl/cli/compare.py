"""``placement-rl compare EXPERIMENT.yaml``: every method side by side on a set of instances."""

from __future__ import annotations

import argparse
from typing import Any

from placement_rl.cli.common import json_parser, path, positive_int, print_json


def cmd_compare(args: argparse.Namespace) -> None:
    from placement_rl.experiments import no_fit, no_fit_lines, serial_cells, summary_markdown
    from placement_rl.rl.compare import compare

    try:
        report = compare(
            args.experiment,
            args.out,
            overrides=args.set,
            resume=args.resume,
            runner=serial_cells if args.serial else None,
            concurrency=args.concurrency,
            progress=not args.json,
        )
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # the finished cells are kept; the driver said how to resume
    if args.json:
        print_json(
            {
                "out": str(report.out_dir),
                "ran": report.ran,
                "skipped": report.skipped,
                "summary": report.summary,
                "no_fit": no_fit(report.rows),
                "rows": report.rows,
                "files": [str(f) for f in report.files],
            }
        )
    else:
        print(f"{len(report.rows)} cells ({report.ran} run now, {report.skipped} already finished) in {report.out_dir}")
        print(summary_markdown(report.summary), end="")
        for line in no_fit_lines(report.rows):
            print(line)
        for f in report.files:
            print(f"  wrote {f}")
    if report.failed:
        first = report.failed[0]
        raise ValueError(
            f"{len(report.failed)} of {len(report.rows)} cells failed (first: {first['method']} on "
            f"{first['instance']}: {first['note']}); their rows in {report.out_dir / 'results.jsonl'} say why; "
            "run again with --resume to retry them"
        )


def add_commands(sub: Any) -> None:
    """Add ``compare`` to the ``placement-rl`` sub-parsers."""
    p = sub.add_parser(
        "compare",
        parents=[json_parser()],
        help="run every method of an experiment file on its instances (Ray tasks); tables, plots, plans",
    )
    p.add_argument("experiment", help="experiment YAML, e.g. benchmarks/experiments/flexflow_fig6.yaml")
    p.add_argument("--out", type=path, default=None, help="output folder (default out/compare-<name>)")
    p.add_argument("--resume", action="store_true", help="keep the finished cells of the output folder; run the others")
    p.add_argument(
        "--concurrency", type=positive_int, default=None, help="cells at once (default: the Ray cluster's CPUs)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the file's settings for this run (repeatable): a top-level key (topologies=[test:5], seeds=1) "
        "or methods.NAME.OPTION (methods.mcmc.budget=10s)",
    )
    p.add_argument("--serial", action="store_true", help="run the cells one by one in this process (no Ray)")
    p.set_defaults(func=cmd_compare)


__all__ = ["add_commands", "cmd_compare"]
