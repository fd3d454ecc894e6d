"""``execute``: run a plan for real (one worker process per device of the plan, ``torch.distributed``
over gloo or NCCL) and compare the measured iteration with the simulator's prediction.

The workers run as Ray Train workers (``--launcher ray``, the default: the local Ray, or the cluster
of ``RAY_ADDRESS`` inside ``ray job submit``) or as local processes (``--launcher local``). The plan
is lowered and checked (its simulated peak memory against the topology's devices too), and the
cluster's resources counted, before any worker starts. The workers' sockets listen on loopback only
unless ``--master-addr`` names another address."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from placement_rl.cli.common import (
    cost_model,
    cost_parser,
    json_parser,
    non_negative_int,
    plan_for,
    positive_float,
    positive_int,
    print_json,
    print_table,
)
from placement_rl.paths import output_file

#: ``--iterations`` / ``--warmup``'s bounds: :data:`placement_rl.execute.local.MAX_ITERATIONS` and
#: ``MAX_WARMUP`` (kept in step by a test; not imported, so ``--help`` does not import torch).
MAX_ITERATIONS = 10_000
MAX_WARMUP = 10_000


def bounded_count(low: int, high: int) -> Callable[[str], int]:
    """A ``type=`` converter: an integer from ``low`` to ``high``."""

    def convert(text: str) -> int:
        expected = f"expected an integer from {low} to {high:,}"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {expected}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: {expected}")
        return value

    return convert


def model_source(spec: str, batch_size: int | None) -> Any:
    """The :class:`~placement_rl.execute.ModelSource` of ``--model``: a zoo name or ``package.module:factory``.

    Raises:
        ValueError: for a graph file or an ``hf:`` model (the executor needs the model's code), naming it.
    """
    from placement_rl.execute import ModelSource

    if spec.endswith(".json") or spec.startswith("hf:"):
        raise ValueError(
            f"model {spec!r}: the executor builds and trains the model itself; expected a zoo name (see "
            "'placement-rl models') or package.module:factory"
        )
    return ModelSource(spec, batch_size)


def cmd_execute(args: argparse.Namespace) -> None:
    from placement_rl.emulate.cluster import resolve_emulation_topology
    from placement_rl.execute import ExecutionError, RunOptions, execute
    from placement_rl.execute.local import check_backend
    from placement_rl.execute.rendezvous import LOOPBACK
    from placement_rl.execute.runtime import DEFAULT_LR
    from placement_rl.explain import explain_plan
    from placement_rl.sim.trace import write_chrome_trace

    try:  # before the model is traced: a worker would fail with a traceback when it joins the group
        check_backend(args.backend, local=args.launcher == "local")
    except ValueError as exc:
        raise ValueError(f"--backend {args.backend}: {exc}") from None
    for path, flag in ((args.trace, "--trace"), (args.sim_trace, "--sim-trace")):
        if path is not None:
            output_file(path, flag)  # before the run, not after it
    source = model_source(args.model, args.batch_size)
    topology = resolve_emulation_topology(args.topology)
    graph = source.graph()
    cost = cost_model(args, topology)
    plan = plan_for(args.plan, graph, topology)
    options = RunOptions(
        iterations=args.iterations,
        warmup=args.warmup,
        backend=args.backend,
        seed=args.seed,
        lr=DEFAULT_LR if args.lr is None else args.lr,
        threads=args.threads,
    )
    launcher = None
    if args.launcher == "ray":
        from placement_rl.rl.execute import ray_train_launcher

        # joins or starts Ray (ensure_ray) once the plan is lowered and checked
        launcher = ray_train_launcher(args.storage_path, master_addr=args.master_addr or LOOPBACK)
    else:
        for flag, value in (("--storage-path", args.storage_path), ("--master-addr", args.master_addr)):
            if value is not None:
                raise ValueError(f"{flag} {value!r} applies to --launcher ray, not {args.launcher!r}")
    try:
        report = execute(source, topology, plan, graph=graph, options=options, cost_model=cost, launcher=launcher)
    except ExecutionError as exc:  # not bad input: the run itself failed
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    title = f"{graph.name} / {plan.name} on {topology.name}"
    if args.trace is not None:
        write_chrome_trace(report.measured(), args.trace, title=f"measured: {title}")
    if args.sim_trace is not None:
        write_chrome_trace(report.program.simulated, args.sim_trace, title=f"simulated: {title}")
    words = explain_plan(graph, topology, plan, report.program.simulated)
    notes = device_notes(topology, options.backend, args.profile, graph.name)
    if args.json:
        print_json({**report.to_dict(), "topology": topology.name, "explanation": words, "notes": notes})
        return
    print(f"{title}, {args.launcher} launcher, backend {options.backend}:")
    for line in words:
        print(f"  {line}")
    print()
    d = report.to_dict()
    error = d["error"]
    print_table(
        ["measured ms", "simulated ms", "replayed ms", "simulated vs measured", "loss"],
        [
            [
                f"{d['measured_ms']:,.2f}",
                f"{d['simulated_ms']:,.2f}",
                f"{d['replayed_ms']:,.2f}",
                "-" if error is None else f"{error:+.0%}",
                f"{d['loss']:.6g}",
            ]
        ],
    )
    print()
    print_table(
        ["rank", "device", "median ms", "sent bytes", "simulated sent bytes"],
        [
            [
                r.rank,
                r.device,
                f"{r.median_iteration_s * 1e3:,.2f}",
                f"{sent:,}",
                f"{int(sim):,}",
            ]
            for r, sent, sim in zip(report.results, d["sent_bytes"], d["simulated_sent_bytes"], strict=True)
        ],
    )
    print()
    print(
        f"measured: median of {options.iterations} iteration(s) after {options.warmup} warm-up; replayed: the plan "
        "simulated with the measured compute times (what still differs is the network and overlap model's)"
    )
    for note in notes:
        print(f"note: {note}")
    for path, what in ((args.trace, "measured"), (args.sim_trace, "simulated")):
        if path is not None:
            print(f"wrote the {what} Chrome trace to {path}")


def device_notes(topology: Any, backend: str, profile: str | None, model: str) -> list[str]:
    """What the reader must know when the devices simulated are not the devices the workers ran on.

    Workers on gloo run on this machine's CPUs; a topology of GPUs then makes the simulated column
    a prediction for those GPUs, not for the workers.
    """
    if backend != "gloo" or profile is not None:
        return []
    types = sorted({d.device_type for d in topology.devices if d.device_type.upper() != "CPU"})
    if not types:
        return []
    names = ", ".join(types)
    return [
        f"the workers ran on this machine's CPUs (gloo), but the simulated column times the topology's "
        f"{names} devices, so 'simulated vs measured' compares two different machines. The replayed column "
        "(the plan simulated with the compute times measured on the workers) is the like-for-like figure. To "
        f"simulate these CPUs instead, profile them and pass the profile: placement-rl profile --device cpu "
        f"--device-type {types[0]} --models {model} --splits 1,2,4 --out cpu-profile.json, then --profile "
        "cpu-profile.json (it times the ops, not the executor's own per-op overhead)."
    ]


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "execute",
        parents=[json_parser(), cost_parser()],
        help="run a plan for real on worker processes and compare the measurement with the simulator",
        description=__doc__,
    )
    p.add_argument("--model", required=True, help="zoo model (see 'placement-rl models') or package.module:factory")
    p.add_argument(
        "--topology",
        required=True,
        help="MxG[@NIC_GBIT] (M machines x G devices, one NIC each, default 25 Gb/s), a preset, random:SEED or a "
        "topology .json; its devices are what the plan names, one worker each",
    )
    p.add_argument(
        "--plan",
        default="data_parallel",
        help="a plan .json for the model, or a baseline: data_parallel (dp), single_device (single), expert, "
        "layerwise (default data_parallel)",
    )
    p.add_argument("--batch-size", type=positive_int, default=None, help="global batch size (default: the model's)")
    p.add_argument(
        "--iterations",
        type=bounded_count(1, MAX_ITERATIONS),
        default=3,
        help=f"measured iterations, 1 to {MAX_ITERATIONS:,} (default 3)",
    )
    p.add_argument(
        "--warmup",
        type=bounded_count(0, MAX_WARMUP),
        default=1,
        help=f"unmeasured iterations first, 0 to {MAX_WARMUP:,} (default 1)",
    )
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="torch.distributed backend: gloo on CPUs (default) or nccl, one GPU per worker (refused before "
        "anything runs when this machine's torch has no NCCL)",
    )
    p.add_argument(
        "--launcher",
        choices=("ray", "local"),
        default="ray",
        help="ray: Ray Train workers on the local Ray or the RAY_ADDRESS cluster (default); local: processes here",
    )
    p.add_argument(
        "--storage-path",
        default=None,
        help="where Ray Train keeps the run and rank 0's results (default: a temporary folder here, removed "
        "afterwards); on a Ray cluster of several machines a folder they all share, or an s3:// URI",
    )
    p.add_argument(
        "--master-addr",
        default=None,
        help="with --launcher ray: the address rank 0's rendezvous listens on (default 127.0.0.1, every worker on "
        "rank 0's machine); on a Ray cluster of several machines an address of rank 0's machine the others reach, "
        "or 'node' for the address Ray knows it by",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the weights and the batch (default 0)")
    p.add_argument("--lr", type=positive_float, default=None, help="SGD learning rate (default 0.01)")
    p.add_argument("--threads", type=positive_int, default=1, help="compute threads (and CPUs) per worker (default 1)")
    p.add_argument("--trace", default=None, help="write the measured iteration as a Chrome trace (JSON)")
    p.add_argument("--sim-trace", default=None, help="write the simulated iteration as a Chrome trace (JSON)")
    p.set_defaults(func=cmd_execute)
