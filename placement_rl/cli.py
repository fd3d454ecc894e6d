"""The ``placement-rl`` command line.

Every sub-command prints a human-readable table by default and JSON with ``--json``. Bad input (an
unknown model, topology or option, a malformed file) prints one ``error:`` line naming the bad value
and what was expected, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _cmd_models(args: argparse.Namespace) -> None:
    from placement_rl import zoo

    rows = [zoo.spec(n) for n in zoo.names()]
    stats = {m.name: _graph_stats(zoo.load(m.name)) for m in rows} if args.stats else {}
    if args.json:
        _print_json(
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
        _print_table(
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
    _print_table(
        ["model", "batch", "source", "description"],
        [[m.name, m.default_batch_size, m.source, m.description] for m in rows],
    )


def _graph_stats(graph: Any) -> dict[str, Any]:
    return {
        "ops": graph.num_ops,
        "param_bytes": graph.param_bytes,
        "forward_flops": graph.forward_flops,
        "backward_flops": graph.backward_flops,
    }


def _cmd_topologies(args: argparse.Namespace) -> None:
    from placement_rl.topology import load_preset, preset_names

    topologies = [load_preset(n) for n in preset_names()]
    if args.json:
        _print_json(
            [
                {
                    "name": t.name,
                    "devices": t.num_devices,
                    "machines": len(t.machines()),
                    "device_types": sorted({d.device_type for d in t.devices}),
                }
                for t in topologies
            ]
        )
        return
    _print_table(
        ["topology", "machines", "devices", "device types"],
        [[t.name, len(t.machines()), t.num_devices, ", ".join(sorted({d.device_type for d in t.devices}))] for t in topologies],
    )


def load_graph(spec: str, batch_size: int | None = None) -> Any:
    """A zoo model name or a path to a graph JSON file."""
    from placement_rl import zoo
    from placement_rl.graph import OpGraph

    if spec.endswith(".json") or Path(spec).is_file():
        if batch_size is not None:
            raise ValueError("--batch-size applies to zoo models, not to graph files")
        return OpGraph.from_json(spec)
    return zoo.load(spec, batch_size=batch_size)


def _cmd_show_graph(args: argparse.Namespace) -> None:
    graph = load_graph(args.model, args.batch_size)
    if args.coarsen:
        from placement_rl.coarsen import coarsen

        graph = coarsen(graph, args.coarsen)
    if args.out:
        graph.to_json(args.out)
    if args.json:
        _print_json(graph.to_dict())
        return
    print(graph.summary())
    if args.out:
        print(f"  wrote {args.out}")
    if args.ops:
        _print_table(
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


def _cmd_show_topology(args: argparse.Namespace) -> None:
    from placement_rl.topology import resolve_topology

    topology = resolve_topology(args.topology)
    if args.out:
        topology.to_json(args.out)
    if args.json:
        _print_json(topology.to_dict())
        return
    print(topology.summary())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="placement-rl",
        description="Place and shard deep-learning training graphs on GPU clusters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--stats", action="store_true", help="import every model and show ops, parameters and FLOPs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("topologies", help="list the preset device topologies")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_topologies)

    p = sub.add_parser("show-graph", help="import a zoo model (or read a graph JSON) and describe it")
    p.add_argument("model", help="zoo model name (see 'placement-rl models') or a graph .json file")
    p.add_argument("--batch-size", type=int, default=None, help="global batch size (default: the paper's)")
    p.add_argument("--coarsen", type=int, default=0, metavar="N", help="group the ops into at most N groups (METIS)")
    p.add_argument("--ops", action="store_true", help="also list every op")
    p.add_argument("--out", default=None, help="write the graph as JSON to this path")
    p.add_argument("--json", action="store_true", help="print the graph document as JSON")
    p.set_defaults(func=_cmd_show_graph)

    p = sub.add_parser("show-topology", help="describe a device topology")
    p.add_argument("topology", help="preset name (see 'placement-rl topologies'), 'random:SEED' or a .json file")
    p.add_argument("--out", default=None, help="write the topology as JSON to this path")
    p.add_argument("--json", action="store_true", help="print the topology document as JSON")
    p.set_defaults(func=_cmd_show_topology)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``placement-rl`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except (ValueError, FileNotFoundError) as exc:  # UnknownNameError and SchemaError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `placement-rl ... | head`
        return 0
    return 0


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    raise SystemExit(main())
