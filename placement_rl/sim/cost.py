"""The cost model: how long a task computes, how long bytes take to move, what memory a plan needs.

Pluggable: :func:`placement_rl.simulate` takes a :class:`CostModel`; every field has a documented
default and both override tables load from JSON.

**Compute** (FlexFlow assumption A1, task time is predictable). A task computing a fraction ``f``
of an op (``f = 1 / partitions``) on device ``d`` takes, unless a profile entry overrides it::

    max(f * flops / (peak_flops(d) * efficiency(op_type)), f * bytes / memory_bandwidth(d)) + launch_overhead_s

with ``bytes = bytes_read + bytes_written`` converted to the precision (below; backward: twice the
forward bytes) and ``peak_flops(d)`` the device's peak in the precision's compute dtype
(:meth:`CostModel.peak_flops`). ``efficiency`` is the fraction of peak an op type reaches
(:data:`DEFAULT_EFFICIENCY`, typical cuDNN/cuBLAS fp32 figures, applied at every dtype's peak).
A :class:`ProfileTable` (``placement-rl profile --out table.json``) overrides the estimate
(:meth:`CostModel.profile_entry`): an entry for the task's exact output shape wins; else an entry for
the whole op scaled by ``f``. A task of a micro-batch copy (``m`` micro-batches: the op at batch
``B / m``) is looked up under the whole-batch op's name: its exact shape, else the copy's shape scaled
by ``f``, else the whole-batch op's entry scaled by ``f / m``. Ops whose sample dimension is a
reduction (the scalar loss: one shape at every batch) take their entry as the whole batch's and scale
it. Ops a profile does not time are listed in :attr:`CostModel.analytic_ops`.

**Communication** (A2): a transfer of ``s`` bytes along a route alone takes ``latency_s + s / bandwidth``
(alpha-beta, bandwidth = the route's bottleneck). How transfers in flight share links is the
network model (``network``: ``flow``, the default, ``circuit`` or ``pairwise``; see
:mod:`placement_rl.sim.network`), and all-reduced gradients are bucketed (``bucket_bytes``, 25 MiB as
PyTorch DDP; 0 all-reduces each tensor alone). The formulas below are the ``circuit`` and
``pairwise`` models' and FT's estimates. Collectives over ``n`` devices holding ``s`` bytes:

* ring all-reduce: ``2 (n - 1)`` steps of ``s / n`` bytes between ring neighbours:
  ``2 (n - 1) * (latency + (s / n) / bandwidth)`` with ``bandwidth`` the slowest ring hop after
  dividing each hop's bandwidth by the number of ring hops that share one of its links;
* parameter server: every worker pushes ``s`` bytes to the server, then pulls ``s`` back (simulated
  as point-to-point transfers, so the server's links are the bottleneck they really are);
* broadcast (``s`` from one to ``n - 1``, pipelined ring): ``(n - 1) * latency + s / bandwidth``;
* all-gather and reduce-scatter (ring): ``(n - 1) * (latency + (s / n) / bandwidth)``.

A :class:`CommTable` (TensorOpt sec. 4.2: bandwidth profiled per device group and message size
``2**i``, interpolated) overrides the link bandwidth for the message size at hand.

**Memory** per device: parameters, their gradients and the optimizer state for every parameter
shard the device holds, plus activations kept for backward (simulated lifetimes).

**Precision** (:data:`PRECISIONS`, chosen by name: ``CostModel(precision="bf16-mixed")``). The graph
records what was traced (:attr:`Op.dtype_bytes`, parameter bytes, tensor bytes, usually fp32); the
cost model converts to the training precision:

* an activation (an op's outputs, a tensor moved between devices, a backward workspace) of ``b``
  traced bytes with ``e`` bytes per element takes ``b * activation_bytes / e``. Traced elements of 2
  or 4 bytes are floating point; others (int64 indices, bool masks) keep their size. An op's outputs
  are taken to share its first output's element size;
* parameters are counted per element: ``param_bytes / e`` elements (``e`` the op's element size,
  4 when that is not a float size), each holding ``weight + gradient + master_weight +
  moments(optimizer) * optimizer_state_bytes`` bytes (:attr:`CostModel.state_bytes_per_param_element`).
  Mixed-precision Adam: 2 + 2 + 4 + 2 * 4 = 16; fp32 Adam: 4 + 4 + 0 + 2 * 4 = 16. Gradient
  synchronization moves ``gradient`` bytes per element;
* compute runs at the peak of the precision's compute dtype (``bf16`` for ``bf16-mixed``); a
  device without that peak (:attr:`placement_rl.topology.Device.peak_flops_by_dtype`) is an error.

Under the default ``fp32`` every figure of an fp32-traced graph is the traced one.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, Shape
from placement_rl.io import as_float, as_int, as_list, as_str, check_header, check_keys, read_json, write_json
from placement_rl.ops import INPUT_OPS, OP_KINDS, VIEW_OPS, op_kind
from placement_rl.sim.calibration import DEFAULT_CALIBRATION, Calibration, compute_class
from placement_rl.topology.core import COMPUTE_DTYPES, Device

#: Fraction of peak FLOP/s reached per op type (fp32, large shapes), from the op taxonomy
#: (:attr:`placement_rl.ops.OpKind.efficiency`); other types use ``default_efficiency``.
DEFAULT_EFFICIENCY: dict[str, float] = {t: k.efficiency for t, k in OP_KINDS.items() if k.efficiency is not None}

#: How the host drives the GPUs (:attr:`CostModel.execution_mode`): ``eager`` issues every op's kernels
#: from Python in program order; ``cuda_graphs`` replays a captured iteration at near-zero host cost.
EXECUTION_MODES: tuple[str, ...] = ("eager", "cuda_graphs")

#: A ``synchronized`` profile's op time is trusted as GPU time (less the round trip ``r``) when it is at
#: least this many round trips; shorter ones are timed by the analytic model (:meth:`CostModel._profiled`).
SYNCHRONIZED_TRUST = 2.0
#: ... and kept within this factor of the analytic time either way.
SYNCHRONIZED_CLAMP = 1.5

#: Op types that do no work (graph inputs, constants, views): never profiled, never reported as unprofiled.
NO_WORK_OPS = INPUT_OPS | VIEW_OPS

#: Optimizer state elements per parameter element (Adam keeps two moments).
OPTIMIZER_STATE_FACTOR: dict[str, float] = {"sgd": 0.0, "momentum": 1.0, "adagrad": 1.0, "rmsprop": 1.0, "adam": 2.0}


@dataclass(frozen=True)
class Precision:
    """How training stores and computes numbers: bytes per element of each kind, and the compute dtype.

    Attributes:
        activation_bytes: per floating-point activation element (op outputs, transfers, workspaces).
        weight_bytes: per parameter element, the weights forward and backward read.
        gradient_bytes: per parameter element, the gradients (what gradient synchronization moves).
        master_weight_bytes: per parameter element, the copy the optimizer updates (0: none).
        optimizer_state_bytes: per parameter element and optimizer moment (Adam keeps two).
        compute_dtype: the dtype matrix math runs in, one of
            :data:`placement_rl.topology.COMPUTE_DTYPES`; its device peak times compute.
    """

    activation_bytes: int
    weight_bytes: int
    gradient_bytes: int
    master_weight_bytes: int
    optimizer_state_bytes: int
    compute_dtype: str


#: Training precisions by name. ``fp32``: everything fp32 (the default, the papers' setting).
#: ``tf32``: fp32 storage, TF32 tensor-core matmuls (Ampere and later). ``bf16-mixed`` and
#: ``fp16-mixed``: mixed precision (Micikevicius et al. 2018; ZeRO's 2 + 2 + 12 bytes per parameter):
#: low-precision weights, gradients and activations, fp32 master weights and optimizer state.
PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(4, 4, 4, 0, 4, "fp32"),
    "tf32": Precision(4, 4, 4, 0, 4, "tf32"),
    "bf16-mixed": Precision(2, 2, 2, 4, 4, "bf16"),
    "fp16-mixed": Precision(2, 2, 2, 4, 4, "fp16"),
}
assert all(p.compute_dtype in COMPUTE_DTYPES for p in PRECISIONS.values())

#: Traced element sizes taken to be floating point (fp32; fp16 or bf16); others keep their size.
_FLOAT_ELEMENT_BYTES = (2, 4)

PROFILE_FORMAT = "placement_rl.profile"
COMM_FORMAT = "placement_rl.comm_table"

#: The profile schema versions this version reads; it writes the last.
PROFILE_SCHEMA_VERSIONS = (1, 2)

#: How a profile's times were taken (:attr:`ProfileTable.timing`): ``cuda_events`` (each op run back to
#: back between two CUDA events while the GPU is kept ahead of the host; :mod:`placement_rl.profiling`),
#: ``synchronized`` (the device synchronized around every timed run, which charges each op a host round
#: trip; schema-1 files), ``wall`` (wall clock on the CPU).
PROFILE_TIMINGS = ("cuda_events", "synchronized", "wall")

#: A profile entry's key: ``(device_type, op_type, output_shape, param_bytes, op_name)``, ``op_name``
#: ``None`` for the name-less entry of a shape key.
ProfileKey = tuple[str, str, Shape, int, str | None]


@dataclass(frozen=True)
class ProfileEntry:
    """Measured time of one op shape on one device type (seconds).

    Attributes:
        forward_s: device (GPU) seconds of the op's forward.
        backward_s: device seconds of its backward.
        host_forward_s: seconds the host thread spends issuing the forward; ``None`` when not measured
            (schema-1 files, CPU profiles).
        host_backward_s: the same for the backward.
    """

    forward_s: float
    backward_s: float
    host_forward_s: float | None = None
    host_backward_s: float | None = None


@dataclass(frozen=True)
class ProfileTable:
    """Measured op times: ``(device_type, op_type, output_shape, param_bytes, op_name) -> ProfileEntry``.

    ``output_shape`` is the shape of the measured task's first output and ``param_bytes`` its
    parameter bytes. ``op_name`` is the graph op measured (:attr:`placement_rl.graph.Op.name`), or
    ``None`` for the shape key's name-less entry, which every op of that key falls back to (the
    profiler records there the first op it measured with the key). Names tell apart ops that share a
    shape key but not their work, e.g. a 1x1 and a 3x3 convolution of one output shape and parameter
    bytes; see :meth:`lookup`.

    ``entries`` may be given with 4-tuple keys ``(device_type, op_type, output_shape, param_bytes)``
    too, the name-less entries of tables made before op names; they are stored with ``op_name``
    ``None``, shapes as tuples of ints.

    Attributes:
        entries: the measured times by key (after construction always 5-tuple keys).
        device: free text describing the hardware and software measured.
        precision: the name in :data:`PRECISIONS` the ops ran in; ``""`` when unknown (schema-1 files).
        timing: how the times were taken, one of :data:`PROFILE_TIMINGS`.

    Raises:
        ValueError: for an unknown precision or timing, a key that is not a 4- or 5-tuple, or one key
            given both as a 4-tuple and with ``op_name`` ``None``.
    """

    entries: Mapping[tuple[Any, ...], ProfileEntry] = field(default_factory=dict)
    device: str = ""
    precision: str = ""
    timing: str = "synchronized"

    def __post_init__(self) -> None:
        if self.precision and self.precision not in PRECISIONS:
            raise ValueError(
                f"ProfileTable: precision {self.precision!r}; expected one of {list(PRECISIONS)} or '' (unknown)"
            )
        if self.timing not in PROFILE_TIMINGS:
            raise ValueError(f"ProfileTable: timing {self.timing!r}; expected one of {list(PROFILE_TIMINGS)}")
        entries: dict[ProfileKey, ProfileEntry] = {}
        for key, entry in self.entries.items():
            if not isinstance(key, tuple) or len(key) not in (4, 5):
                raise ValueError(
                    f"ProfileTable: entry key {key!r}; expected (device_type, op_type, output_shape, param_bytes"
                    "[, op_name])"
                )
            device_type, op_type, shape, param_bytes, *rest = key
            normal = (device_type, op_type, tuple(int(d) for d in shape), int(param_bytes), rest[0] if rest else None)
            if normal in entries:
                raise ValueError(f"ProfileTable: entry key {normal!r} given twice (with and without op_name None)")
            entries[normal] = entry
        object.__setattr__(self, "entries", entries)

    def lookup(
        self, device_type: str, op_type: str, output_shape: Sequence[int], param_bytes: int, op_name: str | None = None
    ) -> ProfileEntry | None:
        """The entry of op ``op_name`` at this shape key if there is one, else the key's name-less entry.

        Args:
            device_type: the device type measured (a topology's ``device_type``).
            op_type: the op's type.
            output_shape: the task's first output shape.
            param_bytes: the task's parameter bytes.
            op_name: the graph op's name (:attr:`placement_rl.graph.Op.name`); ``None`` looks up the
                name-less entry only (schema-1 tables have no other).

        Returns:
            The entry, or ``None`` when the table has neither.
        """
        shape = tuple(output_shape)
        if op_name is not None:
            named = self.entries.get((device_type, op_type, shape, int(param_bytes), op_name))
            if named is not None:
                return named
        return self.entries.get((device_type, op_type, shape, int(param_bytes), None))

    def missing_ops(self, ops: Iterable[Op], device_types: Iterable[str]) -> list[Op]:
        """The ops that do work (not inputs, constants or views) with no entry for their whole batch on one
        of ``device_types``.

        The cost model times such an op by the analytic model in every plan but where the table has its
        task's exact shape (:meth:`CostModel.profile_entry`); every other op is timed from the table at
        every partitioning and micro-batch count.

        Args:
            ops: graph ops (:attr:`placement_rl.graph.OpGraph.ops`).
            device_types: the device types the ops may run on (a topology's).

        Returns:
            The ops without an entry, in the given order.
        """
        types = sorted(set(device_types))
        return [
            op
            for op in ops
            if op.op_type not in NO_WORK_OPS
            and any(self.lookup(t, op.op_type, op.output_shapes[0], op.param_bytes, op.name) is None for t in types)
        ]

    def __len__(self) -> int:
        return len(self.entries)

    def device_types(self) -> tuple[str, ...]:
        """The device types the table has entries for, sorted."""
        return tuple(sorted({device_type for device_type, *_ in self.entries}))

    def check_matches(self, device_types: Iterable[str], source: str = "profile", target: str = "the topology") -> int:
        """How many entries are for one of ``device_types`` (a topology's); none is an error.

        A table measured on other GPUs would be silently ignored by every lookup.

        Args:
            device_types: the device types the table will be looked up for.
            source: the table's name in the error (e.g. ``"--profile table.json"``).
            target: what ``device_types`` belong to, in the error (e.g. ``"topology 'h100-2x8'"``).

        Raises:
            ValueError: naming the table's device types and ``device_types`` when no entry matches.
        """
        wanted = set(device_types)
        matched = sum(1 for device_type, *_ in self.entries if device_type in wanted)
        if matched == 0:
            raise ValueError(
                f"{source}: none of its {len(self.entries)} entries is for a device type of {target}; the "
                f"profile has {list(self.device_types())}, {target} has {sorted(wanted)} (profile on those "
                f"GPUs, or leave the profile out to use the roofline estimate)"
            )
        return matched

    def check_precision(self, precision: str, source: str = "profile") -> None:
        """Refuse to time a run in ``precision`` with ops measured in another precision.

        A table of unknown precision (``""``, schema-1 files) passes: it cannot be checked.

        Args:
            precision: the run's precision, a name in :data:`PRECISIONS`.
            source: the table's name in the error (e.g. ``"--profile table.json"``).

        Raises:
            ValueError: naming the table's precision and the run's when they differ.
        """
        if self.precision and precision != self.precision:
            raise ValueError(
                f"{source}: its ops were measured in precision {self.precision!r}, but the run uses precision "
                f"{precision!r} (profile with `placement-rl profile --precision {precision}`, or run in "
                f"{self.precision!r})"
            )

    def to_dict(self) -> dict[str, Any]:
        """The table as a schema-2 document (``docs/formats.md``)."""
        rows: list[dict[str, Any]] = []
        for (dt, ot, shape, pb, name), e in sorted(self.entries.items(), key=_profile_order):
            row: dict[str, Any] = {"device_type": dt, "op_type": ot, "output_shape": list(shape), "param_bytes": pb}
            if name is not None:
                row["op_name"] = name
            row["forward_s"], row["backward_s"] = e.forward_s, e.backward_s
            if e.host_forward_s is not None:
                row["host_forward_s"] = e.host_forward_s
            if e.host_backward_s is not None:
                row["host_backward_s"] = e.host_backward_s
            rows.append(row)
        return {
            "format": PROFILE_FORMAT,
            "schema_version": PROFILE_SCHEMA_VERSIONS[-1],
            "device": self.device,
            "precision": self.precision,
            "timing": self.timing,
            "entries": rows,
        }

    @classmethod
    def from_dict(cls, document: Any) -> ProfileTable:
        """Read a schema-1 or schema-2 document (``docs/formats.md``), validating every field.

        Schema 1 has no precision (``""``), timing ``"synchronized"``, no op names and no host times.

        Raises:
            SchemaError: naming the entry index, the field and what was expected.
        """
        check_header(document, PROFILE_FORMAT, PROFILE_SCHEMA_VERSIONS)
        version = document["schema_version"]
        required = {"device_type", "op_type", "output_shape", "param_bytes", "forward_s", "backward_s"}
        if version == 1:
            check_keys(document, "profile", {"format", "schema_version", "entries"}, {"device"})
            optional: frozenset[str] = frozenset()
        else:
            check_keys(document, "profile", {"format", "schema_version", "entries"}, {"device", "precision", "timing"})
            optional = frozenset({"op_name", "host_forward_s", "host_backward_s"})
        precision = as_str(document.get("precision", ""), "profile.precision")
        if precision and precision not in PRECISIONS:
            raise SchemaError(f"profile.precision = {precision!r}; expected one of {list(PRECISIONS)} or '' (unknown)")
        timing = as_str(document.get("timing", "synchronized"), "profile.timing")
        if timing not in PROFILE_TIMINGS:
            raise SchemaError(f"profile.timing = {timing!r}; expected one of {list(PROFILE_TIMINGS)}")
        entries: dict[tuple[Any, ...], ProfileEntry] = {}
        first_index: dict[tuple[Any, ...], int] = {}
        for i, e in enumerate(as_list(document["entries"], "profile.entries")):
            where = f"profile.entries[{i}]"
            check_keys(e, where, required, optional)
            shape = tuple(as_list(e["output_shape"], f"{where}.output_shape"))
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise SchemaError(f"{where}.output_shape: expected non-negative integers, got {list(shape)}")
            times = [as_float(e[k], f"{where}.{k}") for k in ("forward_s", "backward_s")]
            if any(t < 0 or not math.isfinite(t) for t in times):
                raise SchemaError(f"{where}: times must be finite and non-negative, got {times}")
            host = [_optional_seconds(e.get(k), f"{where}.{k}") for k in ("host_forward_s", "host_backward_s")]
            param_bytes = as_int(e["param_bytes"], f"{where}.param_bytes")
            if param_bytes < 0:
                raise SchemaError(f"{where}.param_bytes = {param_bytes}; expected bytes >= 0")
            op_name = e.get("op_name")
            if op_name is not None and (not isinstance(op_name, str) or not op_name):
                raise SchemaError(f"{where}.op_name = {op_name!r}; expected a graph op's name (a non-empty string)")
            key = (
                as_str(e["device_type"], f"{where}.device_type"),
                as_str(e["op_type"], f"{where}.op_type"),
                shape,
                param_bytes,
                op_name,
            )
            if version > 1 and key in first_index:
                raise SchemaError(f"{where}: the same key as profile.entries[{first_index[key]}] ({key})")
            first_index.setdefault(key, i)
            entries[key] = ProfileEntry(times[0], times[1], host[0], host[1])
        return cls(entries, str(document.get("device", "")), precision, timing)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ProfileTable:
        return cls.from_dict(read_json(path))


def _profile_order(item: tuple[ProfileKey, ProfileEntry]) -> tuple[Any, ...]:
    """Sort key of a table's entries: by shape key, the name-less entry first, then by op name."""
    (device_type, op_type, shape, param_bytes, name), _ = item
    return device_type, op_type, shape, param_bytes, name is not None, name or ""


def _optional_seconds(value: Any, where: str) -> float | None:
    """``None`` for a missing or null value, else finite non-negative seconds (or a ``SchemaError``)."""
    if value is None:
        return None
    seconds = as_float(value, where)
    if seconds < 0 or not math.isfinite(seconds):
        raise SchemaError(f"{where} = {value!r}; expected finite, non-negative seconds or null")
    return seconds


@dataclass(frozen=True)
class CommTable:
    """Profiled bandwidth per device group and message size (TensorOpt sec. 4.2).

    ``curves[group]`` is a list of ``(message_bytes, bandwidth_bytes_per_s)`` sorted by size, usually
    at sizes ``2**i``. Groups name the kind of transfer: ``"p2p/<link kind>"`` for a point-to-point
    transfer whose bottleneck link has that kind (``p2p/nvlink``, ``p2p/infiniband``, ...) and
    ``"all_reduce/<link kind>"`` for ring all-reduces. Between sizes the bandwidth is interpolated
    linearly in ``log2(size)``; outside the range the nearest measurement is used.
    """

    curves: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)

    def bandwidth(self, group: str, message_bytes: float) -> float | None:
        """Interpolated bandwidth in bytes/s, or ``None`` when the group was not profiled."""
        curve = self.curves.get(group)
        if not curve:
            return None
        sizes = [s for s, _ in curve]
        if message_bytes <= sizes[0]:
            return curve[0][1]
        if message_bytes >= sizes[-1]:
            return curve[-1][1]
        k = bisect.bisect_right(sizes, message_bytes)
        (s0, b0), (s1, b1) = curve[k - 1], curve[k]
        w = (math.log2(message_bytes) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return b0 + w * (b1 - b0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": COMM_FORMAT,
            "schema_version": 1,
            "curves": {g: [[s, b] for s, b in curve] for g, curve in sorted(self.curves.items())},
        }

    @classmethod
    def from_dict(cls, document: Any) -> CommTable:
        check_header(document, COMM_FORMAT, (1,))
        check_keys(document, "comm_table", {"format", "schema_version", "curves"})
        curves: dict[str, list[tuple[float, float]]] = {}
        raw = document["curves"]
        if not isinstance(raw, dict):
            raise SchemaError(f"comm_table.curves: expected an object of group -> [[bytes, bytes/s], ...], got {raw!r}")
        for group, points in raw.items():
            where = f"comm_table.curves[{group!r}]"
            parsed = []
            for j, p in enumerate(as_list(points, where)):
                pair = as_list(p, f"{where}[{j}]")
                if len(pair) != 2:
                    raise SchemaError(f"{where}[{j}]: expected [message_bytes, bandwidth_bytes_per_s], got {pair}")
                size, bw = as_float(pair[0], f"{where}[{j}][0]"), as_float(pair[1], f"{where}[{j}][1]")
                if size <= 0 or bw <= 0:
                    raise SchemaError(f"{where}[{j}]: size and bandwidth must be positive, got {pair}")
                parsed.append((size, bw))
            if not parsed:
                raise SchemaError(f"{where}: expected at least one measurement")
            curves[group] = sorted(parsed)
        return cls(curves)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> CommTable:
        return cls.from_dict(read_json(path))


@dataclass(frozen=True)
class CostModel:
    """Compute, communication and memory costs (see the module docstring for the formulas).

    Attributes:
        efficiency: op type -> fraction of peak FLOP/s; missing types use ``default_efficiency``.
        default_efficiency: for op types not in ``efficiency``.
        launch_overhead_s: fixed time added to every compute task with work (A4: 0 by default).
        optimizer: key of :data:`OPTIMIZER_STATE_FACTOR` (``adam`` as in TAG's experiments).
        precision: key of :data:`PRECISIONS`: bytes per element of activations, weights, gradients,
            master weights and optimizer state, and the compute dtype (``fp32`` by default).
        profile: measured op times overriding the roofline estimate.
        comm_table: measured bandwidths overriding the link bandwidth (under ``flow``: capping each
            transfer's rate, and each flow of an all-reduce at its ``all_reduce/<kind>`` curve, so that a
            ring alone takes ``2 (n - 1) (latency + S / n / bandwidth)`` as under ``circuit``).
        network: how transfers share links, a name of :data:`placement_rl.sim.network.NETWORK_MODELS`:
            ``flow`` (max-min fair flows, the default), ``circuit`` (a transfer holds its whole route)
            or ``pairwise`` (a dedicated connection per device pair, FlexFlow's A2).
        bucket_bytes: gradient bucket size for all-reduce (DDP's 25 MiB); 0 all-reduces every
            parameter tensor on its own (the papers' DP-NCCL).
        execution_mode: how the host drives the GPUs, a name of :data:`EXECUTION_MODES`: ``eager``
            (the default: each device's host lane issues every op's kernels in program order,
            :attr:`host_lane`) or ``cuda_graphs`` (a captured iteration replayed at near-zero host cost).
        calibration: the calibrated GPU model (:mod:`placement_rl.sim.calibration`: efficiency curves
            by op size, a kernel floor, host dispatch times and the optimizer step), by default
            :data:`DEFAULT_CALIBRATION` (fitted to an H200, carried to other GPUs by their datasheet
            peaks); ``None`` is the flat roofline of the papers (``efficiency`` per op type, no host,
            no optimizer step).
        analytic_ops: with a profile, the ops whose GPU times the analytic model gave because the
            profile has no entry for them (:meth:`profile_entry`), by op name (a micro-batch copy under
            its whole-batch op's name) -> op type, in the order first met; ops that do no work
            (:data:`NO_WORK_OPS`) are left out. Filled as tasks are timed (by every simulation with this
            cost model, cumulatively; clear it between runs to tell them apart), never compared or
            copied by ``dataclasses.replace``.
    """

    efficiency: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    default_efficiency: float = 0.5
    launch_overhead_s: float = 0.0
    optimizer: str = "adam"
    precision: str = "fp32"
    profile: ProfileTable | None = None
    comm_table: CommTable | None = None
    network: str = "flow"
    bucket_bytes: int = 25 * 2**20
    execution_mode: str = "eager"
    calibration: Calibration | None = field(default_factory=lambda: DEFAULT_CALIBRATION)
    analytic_ops: dict[str, str] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        from placement_rl.sim.network import network_model

        network_model(self.network)  # an unknown name raises, listing the valid ones
        if self.execution_mode not in EXECUTION_MODES:
            raise UnknownNameError("execution mode", self.execution_mode, EXECUTION_MODES)
        if self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise ValueError(
                f"calibration = {self.calibration!r}; expected a placement_rl.sim.calibration.Calibration or None "
                "(None: the flat roofline)"
            )
        if self.profile is not None:
            self.profile.check_precision(self.precision, "profile")
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 0:
            raise ValueError(
                f"bucket_bytes = {self.bucket_bytes!r}; expected an integer number of bytes >= 0 "
                "(0: one all-reduce per tensor)"
            )
        if self.optimizer not in OPTIMIZER_STATE_FACTOR:
            raise UnknownNameError("optimizer", self.optimizer, OPTIMIZER_STATE_FACTOR)
        if self.precision not in PRECISIONS:
            raise UnknownNameError("precision", self.precision, PRECISIONS)
        for name, value in (*self.efficiency.items(), ("default_efficiency", self.default_efficiency)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"efficiency of {name!r} = {value}; expected a fraction in (0, 1]")
        if self.launch_overhead_s < 0:
            raise ValueError(f"launch_overhead_s = {self.launch_overhead_s}; expected >= 0")

    @property
    def precision_spec(self) -> Precision:
        """The :class:`Precision` record named by :attr:`precision`."""
        return PRECISIONS[self.precision]

    @property
    def state_bytes_per_param_element(self) -> float:
        """Bytes held per parameter element: weights, gradients, master weights and optimizer state."""
        p = self.precision_spec
        moments = OPTIMIZER_STATE_FACTOR[self.optimizer]
        return p.weight_bytes + p.gradient_bytes + p.master_weight_bytes + moments * p.optimizer_state_bytes

    @property
    def state_bytes_per_param_byte(self) -> float:
        """Bytes held per traced byte of an fp32 parameter (4-byte elements, as the zoo traces them)."""
        return self.state_bytes_per_param_element / 4.0

    @property
    def state_bytes_per_gradient_byte(self) -> float:
        """Parameter state per byte of gradient synchronized: a shard's state is its gradient bytes times this."""
        return self.state_bytes_per_param_element / self.precision_spec.gradient_bytes

    def zero_state_bytes_per_gradient_byte(self, zero: int, holders: int) -> float:
        """:attr:`state_bytes_per_gradient_byte` for one of ``holders`` replicas under ZeRO stage ``zero``.

        Stage 1 divides the master weights and optimizer state among the holders, stage 2 the
        gradients too, stage 3 the weights too (0: nothing is divided).
        """
        p = self.precision_spec
        n = max(holders, 1)
        optimizer = p.master_weight_bytes + OPTIMIZER_STATE_FACTOR[self.optimizer] * p.optimizer_state_bytes
        per_element = (
            p.weight_bytes / (n if zero >= 3 else 1)
            + p.gradient_bytes / (n if zero >= 2 else 1)
            + optimizer / (n if zero >= 1 else 1)
        )
        return per_element / p.gradient_bytes

    @property
    def weight_per_gradient_byte(self) -> float:
        """Bytes of weights per byte of gradient (what ZeRO-3's all-gathers move per gradient byte)."""
        p = self.precision_spec
        return p.weight_bytes / p.gradient_bytes

    def activation_bytes(self, num_bytes: float, element_bytes: float) -> float:
        """Bytes of an activation traced as ``num_bytes`` with ``element_bytes`` per element, in this precision.

        Floating-point elements (2 or 4 bytes traced) take the precision's ``activation_bytes``;
        other sizes (int64 indices, bool masks) are kept.
        """
        target = self.precision_spec.activation_bytes
        if element_bytes not in _FLOAT_ELEMENT_BYTES or element_bytes == target:
            return float(num_bytes)
        return num_bytes * target / element_bytes

    def tensor_bytes(self, num_bytes: float, shape: Shape) -> float:
        """Bytes of a graph tensor (``num_bytes`` traced, of ``shape``) in this precision."""
        elements = math.prod(shape)
        return self.activation_bytes(num_bytes, num_bytes / elements) if elements else float(num_bytes)

    def param_elements(self, op: Op) -> float:
        """Parameter elements of ``op``: its traced parameter bytes over its element size (4 if not a float size)."""
        element = op.dtype_bytes if op.dtype_bytes in _FLOAT_ELEMENT_BYTES else 4
        return op.param_bytes / element

    def param_state_bytes(self, op: Op) -> float:
        """Bytes of ``op``'s whole parameter state: weights, gradients, master weights, optimizer state."""
        return self.param_elements(op) * self.state_bytes_per_param_element

    def gradient_bytes(self, op: Op) -> float:
        """Bytes of ``op``'s whole gradient, what synchronizing its parameters moves."""
        return self.param_elements(op) * self.precision_spec.gradient_bytes

    def peak_flops(self, device: Device) -> float:
        """The device's peak FLOP/s in the precision's compute dtype.

        Raises:
            ValueError: if the device has no peak for that dtype, naming the dtypes it has and the
                precisions that would run on it.
        """
        dtype = self.precision_spec.compute_dtype
        found = device.peak_flops_for(dtype)
        if found is None:
            has = ["fp32", *(d for d, _ in device.peak_flops_by_dtype)]
            usable = [name for name, p in PRECISIONS.items() if p.compute_dtype in has]
            raise ValueError(
                f"precision {self.precision!r} computes in {dtype}, but device {device.name!r} "
                f"({device.device_type}) has no {dtype} peak FLOP/s (it has: {', '.join(has)}); choose "
                f"one of the precisions {usable}, or give the device peak_flops_by_dtype[{dtype!r}]"
            )
        return found

    def op_efficiency(self, op_type: str) -> float:
        return self.efficiency.get(op_type, self.default_efficiency)

    @functools.cached_property
    def host_lane(self) -> bool:
        """Whether each device gets a host lane: ``eager`` with a calibration (or with a profile's host times).

        Computed once: every compiled task asks.
        """
        if self.execution_mode != "eager":
            return False
        return self.calibration is not None or (
            self.profile is not None and any(e.host_forward_s is not None for e in self.profile.entries.values())
        )

    @property
    def mixed_precision(self) -> bool:
        """Whether the precision stores activations in fewer bytes than fp32 (autocast's casts)."""
        return self.precision_spec.activation_bytes < 4

    def op_compute_dtype(self, op_type: str, device: Device) -> str:
        """The dtype ``op_type`` computes in on ``device`` under this precision.

        Under ``fp32`` with a calibration, convolutions compute in TF32 on devices that have it:
        PyTorch's default (``torch.backends.cudnn.allow_tf32`` is on, ``torch.backends.cuda.matmul.allow_tf32``
        off), which is what ``fp32`` training measures on such GPUs.
        """
        dtype = self.precision_spec.compute_dtype
        if (
            dtype == "fp32"
            and self.calibration is not None
            and op_kind(op_type).family == "conv"
            and device.peak_flops_for("tf32") is not None
        ):
            return "tf32"
        return dtype

    def device_task_times_s(
        self,
        op: Op,
        fraction: float,
        task_output_shape: Shape,
        task_param_bytes: int,
        device: Device,
        *,
        batch_op: Op | None = None,
        micro_batches: int = 1,
    ) -> tuple[float, float]:
        """:meth:`task_times_s` on ``device`` (its type, peak in the op's compute dtype and bandwidth)."""
        dtype = self.op_compute_dtype(op.op_type, device)
        peak = self.peak_flops(device) if dtype == self.precision_spec.compute_dtype else device.peak_flops_for(dtype)
        assert peak is not None
        return self.task_times_s(
            op,
            fraction,
            task_output_shape,
            task_param_bytes,
            device.device_type,
            peak,
            device.memory_bandwidth_bytes_per_s,
            compute_dtype=dtype,
            batch_op=batch_op,
            micro_batches=micro_batches,
        )

    def host_times_s(
        self,
        op: Op,
        task_output_shape: Shape,
        task_param_bytes: int,
        device_type: str,
        *,
        fraction: float = 1.0,
        batch_op: Op | None = None,
        micro_batches: int = 1,
    ) -> tuple[float, float]:
        """(forward, backward) host seconds to issue one task of ``op`` (0 without a host lane).

        The profile entry that times the task (:meth:`profile_entry`, the same as its GPU times'), if it
        has measured host times, wins, unscaled: issuing an op's kernels takes the host as long at any
        batch. Else the calibration's per-group dispatch times. The arguments are :meth:`task_times_s`'s.
        """
        if not self.host_lane:
            return 0.0, 0.0
        found = self.profile_entry(
            op,
            fraction,
            task_output_shape,
            task_param_bytes,
            device_type,
            batch_op=batch_op,
            micro_batches=micro_batches,
        )
        if found is not None and found[0].host_forward_s is not None:
            return found[0].host_forward_s, found[0].host_backward_s or 0.0
        if self.calibration is None:
            return 0.0, 0.0
        return self.calibration.host_seconds(op.op_type, self.mixed_precision)

    def profile_entry(
        self,
        op: Op,
        fraction: float,
        task_output_shape: Shape,
        task_param_bytes: int,
        device_type: str,
        *,
        batch_op: Op | None = None,
        micro_batches: int = 1,
    ) -> tuple[ProfileEntry, float] | None:
        """The profile entry that times one task of ``op``, and the factor its GPU times scale by.

        Looked up under the name of ``batch_op`` (else ``op``) on ``device_type``, the first found of:

        1. the task's exact output shape and parameter bytes, unscaled (left out for an op whose sample
           dimension is a reduction, e.g. the scalar loss: its shape is the same at every batch, so an
           entry there is taken as the whole batch's, as the profiler records it);
        2. ``op``'s whole output shape and parameter bytes, scaled by ``fraction`` (left out when ``op``
           has the shape of ``batch_op``);
        3. with ``batch_op``: its whole output shape and parameter bytes, scaled by ``fraction / m``
           (``fraction`` alone when the op has no sample dimension: each micro-batch then runs all of it).

        So a profile measured at the whole batch times every partition and every micro-batch of an
        op by linear scaling, and a measured partition or micro-batch shape wins over the scaling.

        Args:
            op: the op the task computes a part of: a graph op, or a micro-batch copy
                (:func:`placement_rl.sim.pipeline.scaled_op`: the op at batch ``B / micro_batches``).
            fraction: the share of ``op`` the task computes.
            task_output_shape: the task's first output shape.
            task_param_bytes: the parameter bytes the task holds.
            device_type: the task's device type.
            batch_op: for a micro-batch copy, the whole-batch op it was copied from; else ``None``.
            micro_batches: ``m``, how many micro-batch copies ``batch_op`` has (1 without ``batch_op``).

        Returns:
            ``(entry, scale)``, or ``None`` without a profile or when it has none of the three.

        Raises:
            ValueError: for ``micro_batches`` below 1, or above 1 without ``batch_op``.
        """
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches = {micro_batches!r}; expected a positive integer")
        if micro_batches > 1 and batch_op is None:
            raise ValueError(f"op {op.name!r}: micro_batches = {micro_batches} needs the whole-batch op (batch_op)")
        profile = self.profile
        if profile is None:
            return None
        name = (batch_op or op).name
        dim = op.sample_dim
        shape = tuple(op.output_shapes[0])
        if dim is None or not dim.reduction:
            exact = profile.lookup(device_type, op.op_type, task_output_shape, task_param_bytes, name)
            if exact is not None:
                return exact, 1.0
        if batch_op is None or shape != tuple(batch_op.output_shapes[0]) or op.param_bytes != batch_op.param_bytes:
            whole = profile.lookup(device_type, op.op_type, shape, op.param_bytes, name)
            if whole is not None:
                return whole, fraction
        if batch_op is not None:
            entry = profile.lookup(
                device_type, batch_op.op_type, batch_op.output_shapes[0], batch_op.param_bytes, batch_op.name
            )
            if entry is not None:
                return entry, fraction / micro_batches if batch_op.sample_dim is not None else fraction
        return None

    def update_times_s(self, op: Op, param_fraction: float, bandwidth_bytes_per_s: float) -> tuple[float, float]:
        """(GPU, host) seconds of the optimizer step over ``param_fraction`` of ``op``'s parameters.

        Both are 0 without a calibration; the host's is 0 without a host lane.
        """
        if self.calibration is None or op.param_bytes <= 0:
            return 0.0, 0.0
        gpu, host = self.calibration.update_seconds(
            self.param_elements(op) * param_fraction, 1, OPTIMIZER_STATE_FACTOR[self.optimizer], bandwidth_bytes_per_s
        )
        return gpu, (host if self.host_lane else 0.0)

    def task_times_s(
        self,
        op: Op,
        fraction: float,
        task_output_shape: Shape,
        task_param_bytes: int,
        device_type: str,
        peak_flops: float,
        memory_bandwidth_bytes_per_s: float,
        compute_dtype: str | None = None,
        *,
        batch_op: Op | None = None,
        micro_batches: int = 1,
    ) -> tuple[float, float]:
        """(forward, backward) GPU seconds of one task computing ``fraction`` of ``op`` on one device.

        ``compute_dtype`` is the dtype ``peak_flops`` is for (default: the precision's), which picks
        the calibration's curve (:meth:`op_compute_dtype`). With a profile, the entry of
        :meth:`profile_entry` times the task (``batch_op`` and ``micro_batches``: for a micro-batch
        copy ``op``, the whole-batch op and the count); without one the analytic model does, and the op
        is recorded in :attr:`analytic_ops`.
        """
        measured: tuple[float, float] | None = None
        if self.profile is not None:
            found = self.profile_entry(
                op,
                fraction,
                task_output_shape,
                task_param_bytes,
                device_type,
                batch_op=batch_op,
                micro_batches=micro_batches,
            )
            if found is not None:
                entry, scale = found
                measured = (entry.forward_s * scale, entry.backward_s * scale)
            elif op.op_type not in NO_WORK_OPS:
                self.analytic_ops.setdefault((batch_op or op).name, op.op_type)
        if measured is not None and (self.calibration is None or self._trusted_profile()):
            return measured
        analytic = self._analytic_times_s(
            op, fraction, peak_flops, memory_bandwidth_bytes_per_s, compute_dtype or self.precision_spec.compute_dtype
        )
        if measured is None:
            return analytic
        return self._profiled(measured, analytic)

    def calibrated_work(self, op: Op, compute_dtype: str) -> tuple[str | None, float]:
        """The calibrated model's view of a whole op: its compute class and the bytes its forward moves.

        The bytes are the op's activation traffic in this precision plus, under mixed precision,
        autocast's cast of every weight a compute op reads (4 bytes read, 2 written per element);
        backward moves twice as much. :mod:`placement_rl.calibrate` fits with the same figures.
        """
        cls = compute_class(op.op_type, compute_dtype)
        traffic = self.activation_bytes(op.bytes_read + op.bytes_written, op.dtype_bytes)
        if cls is not None and self.mixed_precision and op.param_bytes:
            traffic += 6.0 * self.param_elements(op)
        return cls, traffic

    def _analytic_times_s(
        self, op: Op, fraction: float, peak_flops: float, bandwidth_bytes_per_s: float, compute_dtype: str
    ) -> tuple[float, float]:
        """(forward, backward) GPU seconds of the calibrated model, or of the flat roofline without one."""
        traffic = self.activation_bytes(op.bytes_read + op.bytes_written, op.dtype_bytes) * fraction
        if self.calibration is not None:
            cal = self.calibration
            family = op_kind(op.op_type).family
            if family == "input":  # graph inputs and constants are there already: no kernel
                return 0.0, 0.0
            cls, traffic = self.calibrated_work(op, compute_dtype)
            traffic *= fraction
            bw = bandwidth_bytes_per_s
            fwd = cal.gpu_seconds(op.forward_flops * fraction, traffic, cls, peak_flops, bw, False, family, op.name)
            bwd = cal.gpu_seconds(
                op.backward_flops * fraction, 2.0 * traffic, cls, peak_flops, bw, True, family, op.name
            )
            return fwd, (bwd if op.backward_flops > 0 or op_kind(op.op_type).backward_factor > 0 else 0.0)
        rate = peak_flops * self.op_efficiency(op.op_type)
        fwd = max(op.forward_flops * fraction / rate, traffic / bandwidth_bytes_per_s)
        bwd = max(op.backward_flops * fraction / rate, 2.0 * traffic / bandwidth_bytes_per_s)
        overhead = self.launch_overhead_s
        return (fwd + overhead if fwd > 0 else 0.0), (bwd + overhead if bwd > 0 else 0.0)

    def _trusted_profile(self) -> bool:
        """Whether the profile's times are GPU times as they stand (not taken with a synchronize around each op)."""
        return self.profile is None or self.profile.timing != "synchronized"

    def _profiled(self, measured: tuple[float, float], analytic: tuple[float, float]) -> tuple[float, float]:
        """GPU seconds from a ``synchronized`` profile's times (forward, backward), per direction.

        The old profiler synchronized around every timed op, so each time holds the round trip ``r``
        of the synchronization (the calibration's notes ``sync_overhead_s`` and, under mixed
        precision, ``sync_overhead_mixed_s``, fitted with it) and, for an op whose kernels are short,
        the host's time to issue them rather than the GPU's. A time of at least
        :data:`SYNCHRONIZED_TRUST` ``x r`` gives ``time - r``, a shorter one the analytic time; either
        way the result stays within :data:`SYNCHRONIZED_CLAMP` of the analytic time (measured on the
        H200 data: trusting such a profile further makes the RNNs' iterations 2-7x too slow).
        """
        cal = self.calibration
        assert cal is not None
        overhead = cal.notes.get("sync_overhead_mixed_s" if self.mixed_precision else "sync_overhead_s")
        if not overhead:
            return measured
        out = []
        for time_s, r, fallback in zip(measured, overhead, analytic, strict=True):
            r = float(r)
            gpu = time_s - r if time_s >= SYNCHRONIZED_TRUST * r else fallback
            out.append(min(max(gpu, fallback / SYNCHRONIZED_CLAMP), fallback * SYNCHRONIZED_CLAMP))
        return out[0], (out[1] if measured[1] > 0 else 0.0)

    def effective_bandwidth(self, group: str, bandwidth_bytes_per_s: float, message_bytes: float) -> float:
        """The link bandwidth, or the comm table's measurement for ``group`` at this message size."""
        if self.comm_table is not None:
            measured = self.comm_table.bandwidth(group, message_bytes)
            if measured is not None:
                return measured
        return bandwidth_bytes_per_s

    def transfer_time_s(
        self, num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float, link_kind: str
    ) -> float:
        """Point-to-point: ``latency + bytes / bandwidth`` (0 for no bytes)."""
        if num_bytes <= 0:
            return 0.0
        return latency_s + num_bytes / self.effective_bandwidth(f"p2p/{link_kind}", bandwidth_bytes_per_s, num_bytes)

    def all_reduce_time_s(
        self, num_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float, link_kind: str
    ) -> float:
        """Ring all-reduce of ``num_bytes`` over ``n`` devices (slowest hop ``bandwidth``, ``latency``)."""
        if n <= 1 or num_bytes <= 0:
            return 0.0
        bw = self.effective_bandwidth(f"all_reduce/{link_kind}", bandwidth_bytes_per_s, num_bytes)
        return 2.0 * (n - 1) * (latency_s + num_bytes / n / bw)

    def broadcast_time_s(self, num_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
        """Pipelined ring broadcast of ``num_bytes`` from one device to ``n - 1`` others."""
        if n <= 1 or num_bytes <= 0:
            return 0.0
        return (n - 1) * latency_s + num_bytes / bandwidth_bytes_per_s

    def all_gather_time_s(self, num_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
        """Ring all-gather (or reduce-scatter) of a ``num_bytes`` tensor over ``n`` devices."""
        if n <= 1 or num_bytes <= 0:
            return 0.0
        return (n - 1) * (latency_s + num_bytes / n / bandwidth_bytes_per_s)

    reduce_scatter_time_s = all_gather_time_s
