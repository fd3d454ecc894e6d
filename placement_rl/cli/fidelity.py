"""``fidelity``: execute plans on one-thread CPU workers (on this machine, or on an emulated cluster) and
compare the measured iteration times with the simulator's, profiled and with the measured link
(:func:`placement_rl.execute.fidelity.run_fidelity`). The emulated cluster needs root, ``ip`` and ``tc``.

With ``--cluster gpu``: measure this machine's first CUDA GPU instead (plain PyTorch iterations in fp32 and
bf16-mixed at the zoo batch and the per-GPU batches of 2-8-way data parallelism, profiles, the executor on the
single-device plan over NCCL) and compare the simulated single-device plan with them
(:func:`placement_rl.execute.gpu_fidelity.run_gpu_fidelity`; the defaults are budgeted for under 10 minutes)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from placement_rl.cli.common import (
    int_list,
    json_parser,
    name_list,
    non_negative_int,
    positive_int,
    precision,
    print_json,
    print_table,
)

#: Where ``--cluster gpu`` writes without ``--out``.
GPU_OUT = "out/fidelity-gpu"


def cmd_fidelity(args: argparse.Namespace) -> None:
    if args.cluster == "gpu":
        _gpu(args)
        return
    from placement_rl.execute.fidelity import parse_cluster, run_fidelity, select_cases

    for flag, value in (
        ("--models", args.models),
        ("--device-type", args.device_type),
        ("--precisions", args.precisions),
        ("--splits", args.splits),
        ("--profile-repeats", args.profile_repeats),
    ):
        if value is not None:
            raise ValueError(f"{flag} applies to --cluster gpu, not {args.cluster!r} (which runs --cases)")
    try:
        parse_cluster(args.cluster)  # a bad spec is an error before anything runs
    except ValueError as exc:
        if "expected 'local'" not in str(exc):
            raise
        raise ValueError(f"{exc}; or 'gpu' (this machine's CUDA GPU)") from None
    if args.out is None and (args.resume or args.overwrite):
        raise ValueError(f"{'--resume' if args.resume else '--overwrite'} applies to an --out folder; none is given")
    cases = select_cases(args.cases)
    report = run_fidelity(
        cases,
        cluster=args.cluster,
        workers=args.workers,
        iterations=5 if args.iterations is None else args.iterations,
        warmup=1 if args.warmup is None else args.warmup,
        out_dir=args.out,
        resume=args.resume,
        overwrite=args.overwrite,
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


def _gpu(args: argparse.Namespace) -> None:
    from placement_rl.execute.fidelity import check_out_dir
    from placement_rl.execute.gpu_fidelity import (
        DEFAULT_GPU_MODELS,
        DEFAULT_PRECISIONS,
        DEFAULT_SPLITS,
        run_gpu_fidelity,
    )

    for flag, value in (("--cases", args.cases), ("--workers", args.workers), ("--resume", args.resume or None)):
        if value is not None:
            raise ValueError(f"{flag} applies to --cluster local and emulated clusters; --cluster gpu takes --models")
    out = args.out or GPU_OUT
    check_out_dir(out, overwrite=args.overwrite)  # before anything is measured
    report = run_gpu_fidelity(
        args.models or DEFAULT_GPU_MODELS,
        out_dir=out,
        device_type=args.device_type,
        precisions=args.precisions or DEFAULT_PRECISIONS,
        splits=args.splits or DEFAULT_SPLITS,
        iterations=10 if args.iterations is None else args.iterations,
        warmup=3 if args.warmup is None else args.warmup,
        profile_repeats=5 if args.profile_repeats is None else args.profile_repeats,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.json:
        print_json(report.summary())
        return
    for line in report.lines():
        print(line)
    print(f"\nfiles in {out}/: table.md, summary.json, iterations*.jsonl, executor_single_device.jsonl, ...")


def _precisions(text: str) -> list[str]:
    return [precision(p) for p in name_list(text)]


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "fidelity",
        parents=[json_parser()],
        help="execute plans on CPU workers (or measure a GPU) and compare the measured times with the simulator's",
        description=__doc__,
    )
    p.add_argument(
        "--cluster",
        default="local",
        help="local, emulated:MxG@NIC_GBIT, or gpu (this machine's first CUDA GPU) (default local)",
    )
    p.add_argument("--workers", type=positive_int, default=None, help="local workers (default 2)")
    p.add_argument("--cases", type=name_list, default=None, help="comma-separated model/plan cases (default: all)")
    p.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        help="measured iterations per case (default 5); with --cluster gpu per plain measurement at the zoo batch "
        "and of the executor (default 10; half at the shard batches)",
    )
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help="unmeasured iterations first (default 1; with --cluster gpu 3, at most 2 at the shard batches)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for results.jsonl, link.json, topology.json, profile.json (default: none written); with "
        f"--cluster gpu for table.md, summary.json, iterations.jsonl, ... (default {GPU_OUT})",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the measured cases of --out's results.jsonl (same --cluster) and run the others",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the files of an earlier run in --out (without it, or --resume, a folder with files is refused)",
    )
    gpu = p.add_argument_group("--cluster gpu")
    gpu.add_argument(
        "--models",
        type=name_list,
        default=None,
        help="comma-separated zoo models (default: those of benchmarks/data/h200)",
    )
    gpu.add_argument(
        "--device-type",
        default=None,
        help="the GPU's device type in the device catalogue (default: matched from its name)",
    )
    gpu.add_argument(
        "--precisions", type=_precisions, default=None, help="comma-separated precisions (default fp32,bf16-mixed)"
    )
    gpu.add_argument("--splits", type=int_list, default=None, help="batch splits measured (default 1,2,4,8)")
    gpu.add_argument("--profile-repeats", type=positive_int, default=None, help="timed runs per op (default 5)")
    p.set_defaults(func=cmd_fidelity)
