"""The simulator against measured GPU iterations: median and worst error per cost model.

Usage::

    python benchmarks/calibration.py [--data benchmarks/data/h200] [--refit] [--cross-validate] [--json OUT]

For every measured iteration in ``--data`` (``iterations*.jsonl``: eager PyTorch at the zoo batch
and at the per-GPU batches of 2-, 4- and 8-way data parallelism, in fp32 and bf16 autocast; and
the CUDA-graph replays), the single-device plan is simulated by the simulator itself under three
cost models: ``roofline`` (the papers' flat efficiency per op type, no host), ``calibrated`` (the
shipped calibration, :data:`placement_rl.sim.calibration.DEFAULT_CALIBRATION`, no profile) and
``profiled`` (the calibration with the folder's ``profile_*.json`` of the same precision). Errors
are ``|simulated / measured - 1|``, median and worst per (cost model, precision, execution mode,
batch group).

``--refit`` fits a calibration to the folder first (``placement-rl calibrate``, about two minutes) and
uses it instead of the shipped one. ``--cross-validate`` also fits once per model with that model's
iterations left out (its profile entries too) and reports the left-out model's errors: how the
procedure does on a model it has not seen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl import calibrate, zoo
from placement_rl.paths import output_file
from placement_rl.sim.calibration import DEFAULT_CALIBRATION

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "h200"


def _print(table: list[dict[str, object]], title: str) -> None:
    print(f"\n{title}")
    print(f"{'cost model':<11} {'precision':<13} {'execution':<12} {'batch':<7} {'rows':>4} {'median':>7} {'worst':>7}")
    for r in table:
        print(
            f"{r['cost_model']!s:<11} {r['precision']!s:<13} {r['execution_mode']!s:<12} {r['batch']!s:<7} "
            f"{r['rows']!s:>4} {float(r['median_error']):>7.1%} {float(r['worst_error']):>7.1%}"  # type: ignore[arg-type]
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="measurements folder (default benchmarks/data/h200)")
    parser.add_argument("--refit", action="store_true", help="fit a calibration to --data first")
    parser.add_argument("--cross-validate", action="store_true", help="leave-one-model-out fits")
    parser.add_argument("--json", default=None, help="also write every comparison and the tables here")
    args = parser.parse_args(argv)
    try:
        if args.json:
            output_file(args.json, "--json")  # before minutes of work, not after them
        calibrate.check_folder(args.data)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    try:
        data = calibrate.build_dataset(
            args.data, profile_models=zoo.names(), progress=lambda line: print(line, file=sys.stderr, flush=True)
        )
    except (ValueError, FileNotFoundError) as exc:  # a malformed folder: the error names the file and line
        parser.error(str(exc))
    cal = DEFAULT_CALIBRATION
    if args.refit:
        cal, figures = calibrate.fit(data, progress=True)
        print(f"refitted: {figures}", file=sys.stderr)
    comparisons = calibrate.compare(data, cal, ("roofline", "calibrated", "profiled"), progress=True)
    table = calibrate.error_table(comparisons)
    print(
        f"{len(data.measurements)} measured iterations on {data.device.device_type} ({args.data}); "
        f"calibration {cal.name!r}{' (refitted)' if args.refit else ' (shipped)'}"
    )
    _print(table, "simulated single-device iteration vs measured")
    report: dict[str, object] = {
        "calibration": cal.name,
        "errors": table,
        "rows": [
            {
                "model": c.measurement.model,
                "batch": c.measurement.batch,
                "precision": c.measurement.precision,
                "execution_mode": c.measurement.execution_mode,
                "cost_model": c.cost_model,
                "measured_ms": c.measurement.iteration_s * 1e3,
                "simulated_ms": c.simulated_s * 1e3,
            }
            for c in comparisons
        ],
    }
    if args.cross_validate:
        held: list[calibrate.Comparison] = []
        models = sorted({m.model for m in data.measurements})
        for model in models:
            fit_data = calibrate.subset(data, exclude=model)
            left_cal, _ = calibrate.fit(fit_data, name=f"without-{model}", progress=True)
            held += calibrate.compare(calibrate.subset(data, only=model), left_cal, ("calibrated",))
            print(f"  fitted without {model}", file=sys.stderr, flush=True)
        cv = calibrate.error_table(held)
        _print(cv, "leave-one-model-out: each model simulated with a calibration fitted without it")
        per_model = {
            model: statistics.median(abs(c.error) for c in held if c.measurement.model == model) for model in models
        }
        print("median error per left-out model: " + ", ".join(f"{m} {e:.0%}" for m, e in per_model.items()))
        report["cross_validation"] = cv
    print(f"\n(wall {time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
