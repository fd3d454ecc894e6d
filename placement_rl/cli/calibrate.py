"""``placement-rl calibrate``: fit the analytic GPU model to measurements of one GPU (:mod:`placement_rl.calibrate`)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from placement_rl.cli.common import json_parser, name_list, path, print_json, print_table
from placement_rl.paths import output_file


def cmd_calibrate(args: argparse.Namespace) -> None:
    from placement_rl import calibrate

    if args.out:
        output_file(args.out)  # before the fit, not after it

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    # every row is checked before any work, and before anything is said (a bad row is the one line printed)
    rows = calibrate.load_measurements(args.data, args.models)
    calibrate.check_zoo_models(args.data, rows)
    calibrate.load_topology(args.data)
    say(f"read {len(rows)} measured iterations from {args.data}; building the measured models' graphs")
    data = calibrate.build_dataset(
        args.data, models=args.models, profile_models=profile_models(args.profile_models), progress=say
    )
    say(
        f"fitting to {len(data.measurements)} measured iterations and {data.profile_seconds.shape[0]} profiled op "
        f"times on {data.device.device_type}"
    )
    cal, figures = calibrate.fit(
        data,
        profile_weight=args.profile_weight,
        name=args.name,
        backward_ramp=args.backward_ramp,
        progress=not args.json,
    )
    say(f"simulating the {len(data.measurements)} measured iterations under each cost model")
    if args.out:
        calibrate.write_calibration(args.out, cal)
    comparisons = calibrate.compare(data, cal, ("roofline", "calibrated", "profiled"), progress=not args.json)
    table = calibrate.error_table(comparisons)
    if args.json:
        print_json({"out": args.out, "fit": figures, "errors": table, "calibration": cal.to_dict()})
        return
    print(
        f"fitted {len(figures['classes'])} compute classes and the host to {figures['iterations']} iterations "
        f"({figures['evaluations']} evaluations)"
    )
    rows: list[list[Any]] = [
        [
            r["cost_model"],
            r["precision"],
            r["execution_mode"],
            r["batch"],
            r["rows"],
            f"{r['median_error']:.0%}",
            f"{r['worst_error']:.0%}",
        ]
        for r in table
    ]
    print_table(["cost model", "precision", "execution", "batch", "rows", "median error", "worst error"], rows)
    if args.out:
        print(f"  wrote {args.out}; use it with --calibration {args.out}")


def weight(text: str) -> float:
    """A fit weight: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}; expected a finite number >= 0")
    return value


def profile_models(spec: str) -> list[str]:
    """``zoo`` (every zoo model), ``none`` or a comma-separated list of zoo models."""
    from placement_rl import zoo

    if spec == "zoo":
        return zoo.names()
    if spec == "none":
        return []
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        raise ValueError(f"--profile-models: unknown zoo models {unknown}; expected zoo, none or some of {zoo.names()}")
    return names


def add_commands(sub: Any) -> None:
    """Add this module's commands to the ``placement-rl`` sub-parsers."""
    from placement_rl.calibrate import MAX_MEASUREMENTS, MIN_ITERATION_S

    p = sub.add_parser(
        "calibrate",
        parents=[json_parser()],
        help="fit the analytic GPU model (efficiency curves, kernel floor, host) to measured iterations",
        description="Fit the analytic GPU model to measured iterations of one GPU. Shows its progress on stderr "
        f"(not with --json). Takes at most {MAX_MEASUREMENTS:,} measured iterations (rows of iterations*.jsonl "
        "of the fitted modes) and refuses more, naming the count: each evaluation of the fit simulates every one.",
    )
    p.add_argument(
        "--data",
        type=path,
        required=True,
        help="a folder of measurements: iterations*.jsonl, profile_*.json, topology_*.json (as written by "
        f"'placement-rl fidelity --cluster gpu'); at most {MAX_MEASUREMENTS:,} rows, each a JSON object with "
        f"model, mode, a whole batch >= 1 and a finite iteration_ms >= {MIN_ITERATION_S * 1e3:g}",
    )
    p.add_argument(
        "--out", type=path, default=None, help="write the calibration (JSON); then --calibration OUT anywhere"
    )
    p.add_argument("--models", type=name_list, default=None, help="fit only these models' iterations")
    p.add_argument("--name", default="fitted", help="the calibration's name (default 'fitted')")
    p.add_argument(
        "--profile-weight",
        type=weight,
        default=0.1,
        help="weight of each profiled op time against a whole iteration's (default 0.1; 0 ignores profiles)",
    )
    p.add_argument(
        "--backward-ramp",
        action="store_true",
        help="fit backward work a ramp of its own per compute class (default: one ramp for both directions)",
    )
    p.add_argument(
        "--profile-models",
        default="zoo",
        help="zoo models whose ops the profiles may name, built to read them: zoo (default, every zoo model; "
        "about a minute more), none, or a comma-separated list",
    )
    p.set_defaults(func=cmd_calibrate)
