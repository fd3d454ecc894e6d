"""The simulator's time for a collective over a topology's devices, in the format of NVIDIA's nccl-tests.

Usage::

    python benchmarks/collectives.py [--topology dgx-h100-x2] [--op all_reduce] [--devices N | --machines M]
        [--min-bytes 8] [--max-bytes 8G] [--factor 2] [--network flow|circuit|pairwise] [--json]

Like ``all_reduce_perf -b 8 -e 8G -f 2``: for each message size from ``--min-bytes`` to ``--max-bytes``,
multiplying by ``--factor`` (suffixes K, M, G, T: powers of 1024), one row of ``size (B)``, ``count
(elements)`` (fp32 elements, so ``size`` is rounded down to a multiple of 4 as nccl-tests does), ``type``,
``time (us)``, ``algbw (GB/s)`` and ``busbw (GB/s)``. As in nccl-tests (doc/PERFORMANCE.md),
``algbw = size / time`` and ``busbw = algbw * 2 (n - 1) / n`` for an all-reduce over ``n`` devices, GB
being 1e9 bytes. ``--json`` prints one JSON object per row instead (full precision, nothing else).

**Where the time comes from.** Each row simulates (:func:`placement_rl.sim.simulate`) a plan whose only
cost is the collective: one op holding an fp32 parameter of ``size`` bytes, data parallel over the
chosen devices (in topology order), under ``CostModel(network=...)`` with every other setting at its
default, and reads the duration (``end_s - start_s``) of its one ``all_reduce`` task from
``SimResult.tasks``. A parameter tensor is a gradient bucket of its own however large, so that task
all-reduces exactly ``size`` bytes, and it is alone on the network: this is the time the simulator
charges an all-reduce of that size over those devices inside a real simulation when nothing else
shares its links (under ``flow``: the least-time algorithm of
:meth:`~placement_rl.sim.network.Network.all_reduce`, ring, parallel rings or hierarchical; under
``circuit`` and ``pairwise``: the ring in device order). Tensor-parallel partial sums
(``partial_all_reduce`` tasks) are priced by the same code.

**Only all-reduce.** The simulator has no other collective today; ``--op all_gather``,
``reduce_scatter``, ``all_to_all`` and ``broadcast`` are refused with what it models instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from placement_rl.graph import Op, OpGraph, ParallelDim
from placement_rl.plan import OpConfig, Plan
from placement_rl.sim import simulate
from placement_rl.sim.cost import CostModel
from placement_rl.sim.network import NETWORK_MODELS
from placement_rl.sim.result import TASK_KINDS
from placement_rl.topology import DeviceTopology, resolve_topology

#: The simulator's default network model (``CostModel``'s ``network`` field).
DEFAULT_NETWORK: str = CostModel.network
#: Bytes of one element: the parameter is fp32, nccl-tests' default type ``float``.
ELEMENT_BYTES = 4
ELEMENT_TYPE = "float"
#: The largest message accepted (1 TiB): far past any real bucket, and still an exact float.
MAX_BYTES = 2**40
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

#: What the simulator does for each collective it does not model as one (why ``--op`` refuses it).
NOT_MODELLED: dict[str, str] = {
    "all_gather": (
        "the simulator has no all-gather task: it prices ZeRO-3's parameter all-gathers (one before forward, "
        "one before backward) as one more all-reduce of the weights per micro-batch, added to the gradient "
        "all-reduce (each all-gather half an all-reduce)"
    ),
    "reduce_scatter": (
        "the simulator has no reduce-scatter task: gradients are all-reduced whole under every ZeRO stage "
        "(ZeRO-2 divides only their memory), and the hierarchical all-reduce's reduce-scatter is a phase "
        "inside one all_reduce task"
    ),
    "all_to_all": (
        "the simulator has no all-to-all collective: a resharding between splits is n (n - 1) point-to-point "
        "transfer tasks, each priced by the network model like any transfer"
    ),
    "broadcast": (
        "the simulator has no broadcast collective: SFB's broadcasts are point-to-point sfb_broadcast "
        "transfers from each replica to every other, and the hierarchical all-reduce's broadcast is a phase "
        "inside one all_reduce task"
    ),
}


def bus_factor(n: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor over ``n`` ranks, ``2 (n - 1) / n`` (doc/PERFORMANCE.md)."""
    return 2.0 * (n - 1) / n


class Row(NamedTuple):
    """One message size's result.

    Attributes:
        size_bytes: the message, a multiple of :data:`ELEMENT_BYTES`.
        count_elements: ``size_bytes / ELEMENT_BYTES``.
        time_us: the simulated duration of the collective.
        algbw_gbps: ``size_bytes / time_s / 1e9``.
        busbw_gbps: ``algbw_gbps`` times :func:`bus_factor`.
    """

    size_bytes: int
    count_elements: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def parse_bytes(text: str) -> int:
    """A byte count as nccl-tests' ``-b``/``-e`` take it: a number with an optional K, M, G or T suffix.

    Raises:
        argparse.ArgumentTypeError: naming ``text`` and the accepted forms.
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)[bB]?\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte count; expected a number with an optional K, M, G or T suffix, e.g. 8, 64K, 8G"
        )
    value = float(found.group(1)) * _UNITS[found.group(2).upper()]
    if value > MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is {value:.0f} bytes; expected at most 1T ({MAX_BYTES} bytes)")
    return int(value)


def parse_factor(text: str) -> int:
    """nccl-tests' ``-f``: an integer multiplication factor between sizes, at least 2."""
    try:
        factor = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 2 (the factor between sizes)") from None
    if factor < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 2 (the factor between sizes)")
    return factor


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """The message sizes of the sweep, each rounded down to whole elements (nccl-tests' loop)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size // ELEMENT_BYTES * ELEMENT_BYTES)
        size *= factor
    return out


def all_reduce_time_s(topology: DeviceTopology, devices: Sequence[int], num_bytes: int, network: str) -> float:
    """The simulator's time for an all-reduce of ``num_bytes`` over ``devices`` (topology indices, ring order).

    Simulates one op holding an fp32 parameter of ``num_bytes``, data parallel over ``devices`` (module
    docstring), and returns the duration of its ``all_reduce`` task.

    Raises:
        ValueError: from the simulator, e.g. a network model that refuses the topology.
    """
    n = len(devices)
    names = [topology.devices[d].name for d in devices]
    op = Op(
        "collective",
        "linear",
        ((n, 1),),
        param_bytes=num_bytes,
        bytes_written=n * ELEMENT_BYTES,
        parallel_dims=(ParallelDim("sample", "sample", 0, n),),
    )
    plan = Plan("collective", {op.name: OpConfig.make(names, {"sample": n})})
    result = simulate(OpGraph("collective", [op], []), topology, plan, CostModel(network=network))
    tasks = result.tasks
    found = np.flatnonzero(tasks.kind == TASK_KINDS.index("all_reduce"))
    if found.shape[0] != 1 or tasks.num_bytes[found[0]] != 2.0 * (n - 1) * num_bytes:
        raise RuntimeError(
            f"expected one all_reduce task of {num_bytes} bytes over {n} devices, got "
            f"{found.shape[0]} tasks moving {tasks.num_bytes[found].tolist()} bytes"
        )
    return float(tasks.end_s[found[0]] - tasks.start_s[found[0]])


def measure(topology: DeviceTopology, devices: Sequence[int], message_sizes: Sequence[int], network: str) -> list[Row]:
    """One all-reduce :class:`Row` per message size (a size of 0 bytes moves nothing and is skipped)."""
    rows = []
    for size in message_sizes:
        if size <= 0:
            continue
        time_s = all_reduce_time_s(topology, devices, size, network)
        algbw = size / time_s / 1e9
        rows.append(Row(size, size // ELEMENT_BYTES, time_s * 1e6, algbw, algbw * bus_factor(len(devices))))
    return rows


def float_str(value: float, width: int) -> str:
    """``value`` in ``width`` characters with as many decimals as fit (2, 1 or 0), as nccl-tests prints."""
    digits = len(str(int(value))) if value >= 1 else 0
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    if digits < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def table_lines(rows: Sequence[Row]) -> list[str]:
    """The column headers and one line per row, in nccl-tests' layout."""
    lines = [
        f"#{'size':>11s}  {'count':>12s}  {'type':>8s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s}",
        f"#{'(B)':>11s}  {'(elements)':>12s}  {'':>8s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}",
    ]
    for r in rows:
        lines.append(
            f"{r.size_bytes:12d}  {r.count_elements:12d}  {ELEMENT_TYPE:>8s}  {float_str(r.time_us, 7)}  "
            f"{float_str(r.algbw_gbps, 6)}  {float_str(r.busbw_gbps, 6)}"
        )
    return lines


def _devices(parser: argparse.ArgumentParser, topology: DeviceTopology, args: argparse.Namespace) -> list[int]:
    """The chosen devices' topology indices (``parser.error`` for a count the topology cannot give)."""
    total = topology.num_devices
    if args.machines is not None:
        machines = list(topology.machines().values())
        if not 1 <= args.machines <= len(machines):
            parser.error(
                f"--machines {args.machines}: topology {topology.name!r} has {len(machines)} machines; "
                f"expected 1 to {len(machines)}"
            )
        chosen = [topology.device_index(d.name) for m in machines[: args.machines] for d in m]
        if len(chosen) < 2:
            parser.error(
                f"--machines {args.machines}: the first {args.machines} machine(s) of {topology.name!r} hold "
                f"{len(chosen)} device; a collective needs at least 2"
            )
        return chosen
    if total < 2:
        parser.error(f"--topology {args.topology}: {topology.name!r} has {total} device; a collective needs at least 2")
    if args.devices is None:
        return list(range(total))
    if not 2 <= args.devices <= total:
        parser.error(f"--devices {args.devices}: topology {topology.name!r} has {total} devices; expected 2 to {total}")
    return list(range(args.devices))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="dgx-h100-x2", help="preset name, random:SEED or a topology .json")
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", *NOT_MODELLED])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--devices", type=int, default=None, help="the first N devices (default: all)")
    which.add_argument("--machines", type=int, default=None, help="every device of the first M machines")
    parser.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest message (nccl-tests' -b)")
    parser.add_argument("--max-bytes", type=parse_bytes, default=8 * 2**30, help="largest message (-e)")
    parser.add_argument("--factor", type=parse_factor, default=2, help="factor between sizes (-f)")
    parser.add_argument("--network", choices=sorted(NETWORK_MODELS), default=DEFAULT_NETWORK)
    parser.add_argument("--json", action="store_true", help="one JSON object per row, nothing else")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sweep; ``argv`` defaults to the command line (tests pass their own)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.op != "all_reduce":
        parser.error(f"--op {args.op}: {NOT_MODELLED[args.op]}; only all_reduce is timed")
    if args.min_bytes < ELEMENT_BYTES:
        parser.error(f"--min-bytes {args.min_bytes}: expected at least {ELEMENT_BYTES} (one {ELEMENT_TYPE} element)")
    if args.min_bytes > args.max_bytes:
        parser.error(f"--min-bytes {args.min_bytes} is more than --max-bytes {args.max_bytes}; expected min <= max")
    try:
        topology = resolve_topology(args.topology)
    except (ValueError, OSError) as exc:
        parser.error(f"--topology {args.topology}: {' '.join(str(exc).split())}")
    devices = _devices(parser, topology, args)
    try:
        rows = measure(topology, devices, sizes(args.min_bytes, args.max_bytes, args.factor), args.network)
    except ValueError as exc:
        parser.error(f"--network {args.network}: {' '.join(str(exc).split())}")
    n = len(devices)
    if args.json:
        for r in rows:
            record = {"op": args.op, "topology": topology.name, "devices": n, "network": args.network}
            record.update(type=ELEMENT_TYPE, **r._asdict())
            print(json.dumps(record))
        return
    names = [topology.devices[d].name for d in devices]
    machines = len({topology.devices[d].machine for d in devices})
    print(
        f"# {args.op} simulated over {n} devices of {topology.name} on {machines} machine(s), "
        f"network model {args.network}"
    )
    print(
        f"# minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.factor}(factor); "
        f"busbw = algbw * {2 * (n - 1)}/{n}"
    )
    print(f"# Using devices {names[0]} .. {names[-1]}")
    print("#")
    for line in table_lines(rows):
        print(line)
    average = sum(r.busbw_gbps for r in rows) / len(rows) if rows else math.nan
    print(f"# Avg bus bandwidth    : {average:g}")


if __name__ == "__main__":
    main()
