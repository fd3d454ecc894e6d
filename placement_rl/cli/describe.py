"""Commands that describe inputs: ``models``, ``topologies``, ``show-graph``, ``show-topology``, and
``profile`` (measured op times)."""

from __future__ import annotations

import argparse
from typing import Any

from placement_rl.cli.common import (
    finite_float,
    json_parser,
    load_graph,
    name_list,
    non_negative_int,
    path,
    positive_int,
    precision,
    print_json,
    print_table,
)
from placement_rl.paths import output_file
from placement_rl.progress import Progress


def _graph_stats(graph: Any) -> dict[str, Any]:
    return {
        "ops": graph.num_ops,
        "param_bytes": graph.param_bytes,
        "forward_flops": graph.forward_flops,
        "backward_flops": graph.backward_flops,
    }


def cmd_models(args: argparse.Namespace) -> None:
    from placement_rl import zoo

    rows = [zoo.spec(n) for n in zoo.names()]
    stats = {}
    if args.stats:  # importing every model takes a while: a bar over the models
        with Progress(len(rows), "importing the zoo", "model", enabled=not args.json, leave=False) as bar:
            for m in rows:
                bar.describe(f"importing {m.name}")
                stats[m.name] = _graph_stats(zoo.load(m.name))
                bar.advance()
    if args.json:
        print_json(
            [
                {
                    "name": m.name,
                    "default_batch_size": m.default_batch_size,
                    "source": m.source,
                    "description": m.description,
                    "options": m.options,
                    **stats.get(m.name, {}),
                }
                for m in rows
            ]
        )
        return
    if args.stats:
        print_table(
            ["model", "batch", "ops", "params MiB", "fwd GFLOP", "bwd GFLOP", "source"],
            [
                [
                    m.name,
                    m.default_batch_size,
                    stats[m.name]["ops"],
                    f"{stats[m.name]['param_bytes'] / 2**20:,.1f}",
                    f"{stats[m.name]['forward_flops'] / 1e9:,.1f}",
                    f"{stats[m.name]['backward_flops'] / 1e9:,.1f}",
                    m.source,
                ]
                for m in rows
            ],
        )
        return
    print_table(
        ["model", "batch", "source", "description"],
        [[m.name, m.default_batch_size, m.source, m.description] for m in rows],
    )


def cmd_topologies(args: argparse.Namespace) -> None:
    from placement_rl.topology import load_preset, preset_names
    from placement_rl.topology.presets import PRESET_INFO, machines_by_type

    rows = []
    for name in preset_names():
        t = load_preset(name)
        interconnect, source = PRESET_INFO[name]
        rows.append(
            {
                "name": name,
                "machines": len(t.machines()),
                "devices": t.num_devices,
                "machines_x_gpus": machines_by_type(t),
                "device_types": sorted({d.device_type for d in t.devices}),
                "interconnect": interconnect,
                "source": source,
            }
        )
    if args.json:
        print_json(rows)
        return
    print_table(
        ["topology", "machines x GPUs", "interconnect (per direction)", "source"],
        [[r["name"], r["machines_x_gpus"], r["interconnect"], r["source"]] for r in rows],
    )


#: ``import --timeout``'s default and largest value, seconds (:data:`placement_rl.models.IMPORT_TIMEOUT_S` and
#: ``MAX_TIMEOUT_S``; not imported from there, which would load torch for every command's --help).
IMPORT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 30 * 86400.0


def timeout_seconds(text: str) -> float:
    """``--timeout``: a number of seconds up to 30 days, 0 for no limit."""
    value = finite_float(text)
    if not 0 <= value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a number of seconds from 0 (no limit) to {MAX_TIMEOUT_S:g} (30 days)"
        )
    return value


def cmd_import(args: argparse.Namespace) -> None:
    """``import MODEL --out graph.json``: trace a model once and save its graph for every other command."""
    from placement_rl.models import load_model

    output_file(args.out)  # checked before the (possibly long) trace
    graph = load_model(args.model, args.batch_size, args.seq_len, timeout_s=args.timeout or None)
    graph.to_json(args.out)
    if args.json:
        print_json({"graph": graph.name, "ops": graph.num_ops, "out": str(args.out)})
        return
    print(graph.summary())
    print(f"  wrote {args.out}; use it with --model {args.out}")


def cmd_show_graph(args: argparse.Namespace) -> None:
    if args.out:
        output_file(args.out)
    graph = load_graph(args.model, args.batch_size, args.seq_len)
    if args.coarsen:
        from placement_rl.graph.coarsen import coarsen

        graph = coarsen(graph, args.coarsen)
    if args.out:
        graph.to_json(args.out)
    if args.json:
        print_json(graph.to_dict())
        return
    print(graph.summary())
    if args.out:
        print(f"  wrote {args.out}")
    if args.ops:
        print_table(
            ["op", "type", "output", "fwd GFLOP", "params MiB", "parallel dims", "split"],
            [
                [
                    op.name,
                    op.op_type,
                    "x".join(map(str, op.output_shapes[0])) or "scalar",
                    f"{op.forward_flops / 1e9:.3f}",
                    f"{op.param_bytes / 2**20:.2f}",
                    ",".join(f"{d.name}:{d.kind[0]}{'(red)' if d.reduction else ''}" for d in op.parallel_dims),
                    op.split,
                ]
                for op in graph.ops
            ],
        )


def cmd_show_topology(args: argparse.Namespace) -> None:
    from placement_rl.topology import resolve_topology

    if args.out:
        output_file(args.out)
    topology = resolve_topology(args.topology)
    if args.out:
        topology.to_json(args.out)
    if args.json:
        print_json(topology.to_dict())
        return
    print(topology.summary())


def cmd_profile(args: argparse.Namespace) -> None:
    from placement_rl import zoo
    from placement_rl.profiling import profile_models

    output_file(args.out)  # before measuring, not after
    models = args.models or zoo.names()
    table = profile_models(
        models,
        batch_size=args.batch_size,
        batch_splits=args.splits,
        device=args.device,
        device_type=args.device_type,
        repeats=args.repeats,
        progress=not args.json,
        precision=args.precision,
    )
    table.to_json(args.out)
    device_types = list(table.device_types())
    if args.json:
        report = {"out": args.out, "entries": len(table), "device_types": device_types, "models": models}
        print_json({**report, "precision": table.precision, "timing": table.timing})
        return
    print(
        f"profiled {len(table)} entries (op shapes and op names) of {len(models)} model(s) on {args.device} "
        f"({', '.join(device_types)}) in {table.precision}, timing {table.timing}"
    )
    print(f"  wrote {args.out}; use it with --profile {args.out}")


def add_commands(sub: Any) -> None:
    """Add this module's commands to the ``placement-rl`` sub-parsers."""
    js = json_parser()
    p = sub.add_parser("models", parents=[js], help="list the model zoo")
    p.add_argument("--stats", action="store_true", help="import every model and show ops, parameters and FLOPs")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("topologies", parents=[js], help="list the preset device topologies")
    p.set_defaults(func=cmd_topologies)

    p = sub.add_parser("show-graph", parents=[js], help="import a zoo model (or read a graph JSON) and describe it")
    p.add_argument(
        "model",
        help="zoo model name (see 'placement-rl models'), a graph .json file, hf:ClassName[:key=value,...], "
        "hf:config.json or package.module:factory",
    )
    p.add_argument("--batch-size", type=positive_int, default=None, help="global batch size (default: the paper's)")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sample of an hf: model (default 512)")
    p.add_argument(
        "--coarsen", type=non_negative_int, default=0, metavar="N", help="group the ops into at most N groups (METIS)"
    )
    p.add_argument("--ops", action="store_true", help="also list every op")
    p.add_argument("--out", type=path, default=None, help="write the graph as JSON to this path")
    p.set_defaults(func=cmd_show_graph)

    p = sub.add_parser(
        "import", parents=[js], help="trace a model (package.module:factory, hf:..., a zoo name) into a graph JSON"
    )
    p.add_argument(
        "model",
        help="package.module:factory (factory() returns the module and its example inputs), "
        "hf:ClassName[:key=value,...], hf:config.json or a zoo model name",
    )
    p.add_argument("--out", type=path, required=True, help="where to write the graph (JSON); then --model OUT anywhere")
    p.add_argument("--batch-size", type=positive_int, default=None, help="global batch size (default: the model's)")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sample of an hf: model (default 512)")
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=IMPORT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"the most seconds building and tracing the model may take, a factory that never returns "
        f"included (default {IMPORT_TIMEOUT_S:g}; 0 for no limit)",
    )
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("show-topology", parents=[js], help="describe a device topology")
    p.add_argument("topology", help="preset name (see 'placement-rl topologies'), 'random:SEED' or a .json file")
    p.add_argument("--out", type=path, default=None, help="write the topology as JSON to this path")
    p.set_defaults(func=cmd_show_topology)

    p = sub.add_parser(
        "profile", parents=[js], help="measure the zoo's op times on this machine's device into a profile table"
    )
    p.add_argument("--out", type=path, required=True, help="where to write the table (JSON)")
    p.add_argument("--models", type=name_list, default=None, help="comma-separated zoo models (default: the whole zoo)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: each model's)")
    p.add_argument(
        "--splits",
        type=lambda text: [positive_int(k) for k in text.split(",")],
        default=[1],
        help="also profile at batch/k for these k (data-parallel shapes), e.g. 1,2,4",
    )
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N")
    p.add_argument("--device-type", default=None, help="label for the entries (default: CPU or the CUDA device name)")
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed runs per op: on CUDA run back to back and averaged, on the CPU the median is kept",
    )
    p.add_argument(
        "--precision",
        type=precision,
        default="fp32",
        help="precision to measure in: fp32 (default: torch's defaults), tf32 (CUDA only), bf16-mixed or "
        "fp16-mixed (every op under torch.autocast, TF32 on); recorded in the table",
    )
    p.set_defaults(func=cmd_profile)
