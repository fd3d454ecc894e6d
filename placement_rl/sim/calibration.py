"""The calibrated GPU cost model: efficiency curves by op size, a kernel floor, and the host that issues kernels.

The flat roofline (a fixed fraction of peak per op type) predicts a single-GPU training iteration
on an H200 4-50x too fast in mixed precision: small kernels do not reach peak, and in eager PyTorch
the host (the Python process driving the GPU) spends tens of microseconds issuing every op, so
small ops are bound by the host, not by FLOPs or bytes. A :class:`Calibration` holds what it takes
to predict both, fitted once to measurements (:mod:`placement_rl.calibrate` documents and runs the
fit) and carried to other GPUs through their datasheet peaks and bandwidths: every figure below is
either a fraction of a peak, a size, or a time that does not depend on the GPU's speed.

**GPU time** of a task doing ``x`` FLOPs and moving ``b`` bytes (backward: twice the forward's
bytes) on a device with peak ``P`` (FLOP/s, in the op's compute dtype) and bandwidth ``B``::

    kernel_s[direction] + max(compute, memory) + serial[c] * min(compute, memory)
    compute = (x / P + half_s[c][direction]) / fraction[c][direction]
    memory  = (b / B + half_s[f][direction]) / bandwidth_fraction[f][direction]

that is, an efficiency that grows with the op's size, ``fraction * x / (x + P * half_s)`` (half of
the best fraction at ``half_s`` seconds of peak work: a kernel's ramp, the same time on any GPU),
per compute class ``c = "<family>/<core>"``: the op's
family (``conv``, ``matmul``, ``attention``, ``recurrent``; other families have only the memory
term) and the cores that run it (``simt``: fp32 CUDA cores; ``tensor``: tensor cores, tf32, bf16
and fp16); and a bandwidth efficiency per op family ``f`` (normalization reads its input twice,
pooling windows overlap). ``serial[c]`` (in [0, 1]) is how much of the shorter of the two terms
a compute class does not hide behind the longer one, so its efficiency also falls with its
arithmetic intensity (FLOPs per byte): 0 is the roofline's perfect overlap, 1 runs them one after
the other. Forward and backward have their own fractions (a weight gradient is a
different kernel from the forward's) and their own ramps (the fit gives compute classes a backward
ramp of their own; memory curves share one). ``kernel_s`` is the least time any kernel of the task takes.

**Host time** of a task: ``host_s[group][direction]`` seconds to issue it, by op group
(:data:`HOST_GROUPS`: ``layer`` for ops that are modules or library calls with weights or large
kernels, ``pointwise`` for element-wise, activation, copy and reduction ops, ``view`` for views,
which launch no kernel but still cost the host a dispatch), plus ``autocast_host_s`` per op whose
inputs autocast converts (the compute families) under mixed precision.

**Optimizer update** (charged to the backward task of the op owning the parameters): the GPU
reads and writes the fp32 weights and reads the gradient and every optimizer moment
(``update_bytes_per_element``), at the memory term's bandwidth, and the host issues it in
``host_s["update"]`` seconds per parameter tensor.

Under mixed precision autocast also casts every weight a compute op reads to the low-precision
dtype in forward (4 bytes read, 2 written per element) and the weight gradient back in backward:
that traffic is added to the op's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from placement_rl.errors import SchemaError
from placement_rl.io import as_float, as_str, check_header, check_keys
from placement_rl.ops import Family, op_kind

CALIBRATION_FORMAT = "placement_rl.calibration"

#: Op families timed by a compute-efficiency curve (the others only by bytes moved).
COMPUTE_FAMILIES: tuple[str, ...] = ("conv", "matmul", "attention", "recurrent")
#: Which cores run an op: fp32 CUDA cores or tensor cores (tf32, bf16, fp16).
CORES: tuple[str, ...] = ("simt", "tensor")
#: Compute classes, ``"<family>/<core>"``: the keys of :attr:`Calibration.compute`.
COMPUTE_CLASSES: tuple[str, ...] = tuple(f"{f}/{c}" for f in COMPUTE_FAMILIES for c in CORES)
#: Host groups: the keys of :attr:`Calibration.host_s` (``update``: per parameter tensor of the optimizer step).
HOST_GROUPS: tuple[str, ...] = ("layer", "pointwise", "view", "update")
#: Op families that may have a bandwidth curve of their own (the keys of :attr:`Calibration.memory_by_family`):
#: every family but ``input`` (graph inputs and constants run no kernel).
MEMORY_FAMILIES: tuple[str, ...] = tuple(f for f in get_args(Family) if f != "input")
#: Keys of :attr:`Calibration.notes` the cost model reads: ``(forward, backward)`` seconds of a synchronized
#: profile's round trip (:meth:`placement_rl.sim.cost.CostModel._profiled`); other notes are free-form.
SYNC_NOTES: tuple[str, ...] = ("sync_overhead_s", "sync_overhead_mixed_s")

# Physical bounds of a calibration's figures (docs/formats.md, "Calibration"). Every measured figure lies well
# inside them (fractions 0.17-0.99, times 0.1-200 us); beyond them op times are no model of a GPU, and a tiny
# fraction or a huge time overflows them to infinity.
#: The least fraction of a peak (FLOP/s or bandwidth) a curve may reach: 0.1%.
MIN_FRACTION = 1e-3
#: The most seconds a ramp, a kernel floor, a host dispatch or a synchronization overhead may take.
MAX_SECONDS = 1.0
#: The most bytes the optimizer step may move per parameter element (its base and per optimizer moment).
MAX_UPDATE_BYTES_PER_ELEMENT = 1024.0

_LAYER_FAMILIES = frozenset({*COMPUTE_FAMILIES, "norm", "pool", "embedding", "loss", "routing"})


def host_group(op_type: str) -> str | None:
    """The :data:`HOST_GROUPS` entry of an op type; ``None`` for graph inputs and constants (nothing is issued)."""
    family = op_kind(op_type).family
    if family == "input":
        return None
    if family == "view":
        return "view"
    return "layer" if family in _LAYER_FAMILIES else "pointwise"


def compute_class(op_type: str, dtype: str) -> str | None:
    """The :data:`COMPUTE_CLASSES` entry of an op type computing in ``dtype``; ``None`` for memory-bound ops."""
    family = op_kind(op_type).family
    if family not in COMPUTE_FAMILIES:
        return None
    return f"{family}/{'simt' if dtype == 'fp32' else 'tensor'}"


@dataclass(frozen=True)
class Curve:
    """Efficiency growing with size: ``fraction * size / (size + peak * half_s)``, backward with its own figures.

    A task of ``size`` FLOPs (or bytes) at ``peak`` FLOP/s (or bytes/s) takes
    ``(size / peak + half_s) / fraction``: the ramp of a kernel (filling the GPU, its tail) costs
    ``half_s`` seconds of peak work whatever the GPU, so a faster GPU needs a larger op to reach the
    same fraction of its peak. Backward work (an op's input and weight gradients: two or more
    kernels, the weight gradient reducing over the batch) takes
    ``(size / peak + backward_half_s) / backward_fraction``: its own best fraction and its own ramp,
    so that small backward ops can be slow without making a very large one slow too.

    Attributes:
        peak_fraction: the fraction of the peak a very large forward op reaches, in
            [:data:`MIN_FRACTION`, 1].
        half_s: seconds of peak work at which half of the best fraction is reached, in [0, :data:`MAX_SECONDS`].
        backward_fraction: the same as ``peak_fraction`` for backward work; default (NaN) ``peak_fraction``.
        backward_half_s: the same as ``half_s`` for backward work; default (NaN) ``half_s``.
    """

    peak_fraction: float
    half_s: float
    backward_fraction: float = math.nan
    backward_half_s: float = math.nan

    def __post_init__(self) -> None:
        if math.isnan(self.backward_fraction):
            object.__setattr__(self, "backward_fraction", self.peak_fraction)
        if math.isnan(self.backward_half_s):
            object.__setattr__(self, "backward_half_s", self.half_s)
        for name in ("peak_fraction", "backward_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_FRACTION <= value <= 1.0:
                raise ValueError(f"Curve.{name} = {value!r}; expected a fraction of the peak in [{MIN_FRACTION:g}, 1]")
        for name in ("half_s", "backward_half_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= MAX_SECONDS:
                raise ValueError(f"Curve.{name} = {value!r}; expected seconds in [0, {MAX_SECONDS:g}]")

    def seconds(self, size: float, peak_per_s: float, backward: bool = False) -> float:
        """Time to process ``size`` units at ``peak_per_s`` under this curve (0 for no work)."""
        if size <= 0:
            return 0.0
        if backward:
            return (size / peak_per_s + self.backward_half_s) / self.backward_fraction
        return (size / peak_per_s + self.half_s) / self.peak_fraction

    def as_list(self) -> list[float]:
        """``[peak_fraction, half_s, backward_fraction]``, and ``backward_half_s`` where it differs from ``half_s``."""
        figures = [self.peak_fraction, self.half_s, self.backward_fraction]
        return figures if self.backward_half_s == self.half_s else [*figures, self.backward_half_s]


@dataclass(frozen=True)
class Calibration:
    """Fitted figures of the calibrated cost model (see the module docstring for the formulas).

    Attributes:
        name: what was fitted, e.g. ``"h200-eager"``.
        compute: compute class (:data:`COMPUTE_CLASSES`) -> its :class:`Curve` over FLOPs; a class
            missing here uses ``default_compute``.
        default_compute: the curve of compute classes without one.
        memory: the bandwidth :class:`Curve`, over bytes, of ops whose family has none in ``memory_by_family``.
        memory_by_family: op family (:data:`MEMORY_FAMILIES`) -> its bandwidth :class:`Curve`
            (normalization reads its input more than once, a pooling window overlaps, ...).
        kernel_s: ``(forward, backward)`` GPU seconds every task with work takes at least.
        host_s: host group (:data:`HOST_GROUPS`) -> ``(forward, backward)`` seconds the host takes to
            issue one op (``update``: ``(per parameter tensor, unused)``).
        autocast_host_s: extra host seconds per compute op under mixed precision (autocast's casts).
        serial: compute class -> the share in [0, 1] of the shorter of its compute and memory terms
            that is added to the longer (0 for classes missing here).
        update_bytes_per_element: bytes the optimizer step moves per parameter element, by number
            of optimizer moments: ``base + per_moment * moments``.
        source: where the figures come from (data and procedure).
        notes: free-form figures of the fit; :data:`SYNC_NOTES`, when present, are ``(forward, backward)`` seconds.

    Every time (``kernel_s``, ``host_s``, ``autocast_host_s``, the curves' ramps, the sync notes) lies in
    [0, :data:`MAX_SECONDS`], every fraction in [:data:`MIN_FRACTION`, 1] and ``update_bytes_per_element``
    in [0, :data:`MAX_UPDATE_BYTES_PER_ELEMENT`], so that every op time is finite; a ``ValueError`` names
    the figure otherwise.
    """

    name: str
    compute: Mapping[str, Curve]
    default_compute: Curve
    memory: Curve
    memory_by_family: Mapping[str, Curve]
    kernel_s: tuple[float, float]
    host_s: Mapping[str, tuple[float, float]]
    autocast_host_s: float = 0.0
    update_bytes_per_element: tuple[float, float] = (12.0, 8.0)
    source: str = ""
    notes: Mapping[str, Any] = field(default_factory=dict)
    serial: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"Calibration.name = {self.name!r}; expected a string")
        unknown = sorted(set(self.compute) - set(COMPUTE_CLASSES))
        if unknown:
            raise ValueError(
                f"Calibration.compute: unknown classes {unknown}; expected some of {list(COMPUTE_CLASSES)}"
            )
        unknown = sorted(set(self.memory_by_family) - set(MEMORY_FAMILIES))
        if unknown:
            raise ValueError(
                f"Calibration.memory_by_family: unknown op families {unknown}; expected some of {list(MEMORY_FAMILIES)}"
            )
        missing = sorted(set(HOST_GROUPS) - set(self.host_s))
        if missing or set(self.host_s) - set(HOST_GROUPS):
            raise ValueError(
                f"Calibration.host_s has groups {sorted(self.host_s)}; expected exactly {list(HOST_GROUPS)}"
            )
        bad = {k: v for k, v in self.serial.items() if k not in COMPUTE_CLASSES or not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"Calibration.serial = {bad}; expected compute classes -> shares in [0, 1]")
        for label, values, upper, unit in (
            ("kernel_s", self.kernel_s, MAX_SECONDS, "seconds"),
            *((f"host_s[{g!r}]", v, MAX_SECONDS, "seconds") for g, v in self.host_s.items()),
            ("autocast_host_s", (self.autocast_host_s,), MAX_SECONDS, "seconds"),
            ("update_bytes_per_element", self.update_bytes_per_element, MAX_UPDATE_BYTES_PER_ELEMENT, "bytes"),
            *((f"notes[{k!r}]", self.notes[k], MAX_SECONDS, "seconds") for k in SYNC_NOTES if k in self.notes),
        ):
            count = 1 if label == "autocast_host_s" else 2
            if not _numbers_in(values, upper, count):
                raise ValueError(f"Calibration.{label} = {values!r}; expected {_range_text(upper, unit, count)}")

    def curve(self, compute_class_name: str) -> Curve:
        """The curve of a compute class (``default_compute`` when the calibration has none for it)."""
        return self.compute.get(compute_class_name, self.default_compute)

    def memory_curve(self, family: str) -> Curve:
        """The bandwidth curve of an op family (``memory`` when the calibration has none for it)."""
        return self.memory_by_family.get(family, self.memory)

    def gpu_seconds(
        self,
        flops: float,
        num_bytes: float,
        compute_class_name: str | None,
        peak_flops: float,
        bandwidth_bytes_per_s: float,
        backward: bool,
        family: str = "",
        op_name: str = "",
    ) -> float:
        """GPU seconds of one task: the kernel floor plus the larger of the compute and memory terms (0 for no work).

        Raises:
            ValueError: when the time is not finite (an op's FLOPs or bytes beyond any GPU), naming the op
                (``op_name``, else its ``family``) and the calibration.
        """
        if flops <= 0 and num_bytes <= 0:
            return 0.0
        memory = self.memory_curve(family).seconds(num_bytes, bandwidth_bytes_per_s, backward)
        compute = self.curve(compute_class_name).seconds(flops, peak_flops, backward) if compute_class_name else 0.0
        overlap = self.serial.get(compute_class_name, 0.0) if compute_class_name else 0.0
        seconds = self.kernel_s[1 if backward else 0] + max(compute, memory) + overlap * min(compute, memory)
        if not math.isfinite(seconds):
            what = f"op {op_name!r}" if op_name else f"a {family or compute_class_name or 'memory'} op"
            raise ValueError(
                f"calibration {self.name!r}: {what} takes {seconds} s ({'backward' if backward else 'forward'}: "
                f"{flops:g} FLOPs, {num_bytes:g} bytes at {peak_flops:g} FLOP/s and {bandwidth_bytes_per_s:g} "
                "bytes/s); expected a finite time: check the calibration's curves and the op's FLOPs and bytes"
            )
        return seconds

    def host_seconds(self, op_type: str, mixed_precision: bool) -> tuple[float, float]:
        """``(forward, backward)`` host seconds to issue one op of ``op_type`` (0 for inputs and constants)."""
        group = host_group(op_type)
        if group is None:
            return 0.0, 0.0
        fwd, bwd = self.host_s[group]
        if mixed_precision and op_kind(op_type).family in COMPUTE_FAMILIES:
            fwd += self.autocast_host_s
        backward = op_kind(op_type).backward_factor > 0 or group == "view"
        return fwd, (bwd if backward else 0.0)

    def update_seconds(
        self, param_elements: float, tensors: int, moments: float, bandwidth_bytes_per_s: float
    ) -> tuple[float, float]:
        """``(gpu, host)`` seconds of the optimizer step over ``param_elements`` in ``tensors`` tensors."""
        if param_elements <= 0:
            return 0.0, 0.0
        base, per_moment = self.update_bytes_per_element
        gpu = self.kernel_s[0] + self.memory.seconds(
            param_elements * (base + per_moment * moments), bandwidth_bytes_per_s
        )
        return gpu, tensors * self.host_s["update"][0]

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "schema_version": 1,
            "name": self.name,
            "source": self.source,
            "compute": {k: c.as_list() for k, c in sorted(self.compute.items())},
            "default_compute": self.default_compute.as_list(),
            "memory": self.memory.as_list(),
            "memory_by_family": {k: c.as_list() for k, c in sorted(self.memory_by_family.items())},
            "kernel_s": list(self.kernel_s),
            "host_s": {g: list(v) for g, v in self.host_s.items()},
            "autocast_host_s": self.autocast_host_s,
            "update_bytes_per_element": list(self.update_bytes_per_element),
            "serial": dict(sorted(self.serial.items())),
            "notes": dict(self.notes),
        }

    @classmethod
    def from_dict(cls, document: Any) -> Calibration:
        """Parse a ``placement_rl.calibration`` document, checking every field's JSON type and range.

        Raises:
            SchemaError: naming the field's path (``calibration.compute['matmul/tensor'][0]``), the value
                and what was expected.
        """
        check_header(document, CALIBRATION_FORMAT, (1,))
        required = {
            "format", "schema_version", "name", "compute", "default_compute", "memory", "kernel_s", "host_s",
        }  # fmt: skip
        optional = {"source", "autocast_host_s", "update_bytes_per_element", "notes", "memory_by_family", "serial"}
        check_keys(document, "calibration", required, optional)

        def number(value: Any, where: str, upper: float, unit: str) -> float:
            figure = as_float(value, f"calibration.{where}")
            if not 0.0 <= figure <= upper:
                what = "a share" if unit == "share" else unit
                raise SchemaError(f"calibration.{where} = {figure!r}; expected {what} in [0, {upper:g}]")
            return figure

        def pair(value: Any, where: str, upper: float = MAX_SECONDS, unit: str = "seconds") -> tuple[float, float]:
            if not isinstance(value, list | tuple) or len(value) != 2:
                raise SchemaError(f"calibration.{where}: expected a pair of numbers ({unit}), got {_short(value)}")
            return number(value[0], f"{where}[0]", upper, unit), number(value[1], f"{where}[1]", upper, unit)

        def curve(value: Any, where: str) -> Curve:
            if not isinstance(value, list | tuple) or len(value) not in (2, 3, 4):
                raise SchemaError(
                    f"calibration.{where}: expected [peak fraction, half seconds(, backward fraction"
                    f"(, backward half seconds))], got {_short(value)}"
                )
            numbers = [as_float(v, f"calibration.{where}[{i}]") for i, v in enumerate(value)]
            for i, figure in enumerate(numbers):
                fraction = i % 2 == 0
                if fraction and not MIN_FRACTION <= figure <= 1.0:
                    raise SchemaError(
                        f"calibration.{where}[{i}]: {_CURVE_FIGURES[i]} = {figure!r}; expected a fraction of the peak "
                        f"in [{MIN_FRACTION:g}, 1]"
                    )
                if not fraction and not 0.0 <= figure <= MAX_SECONDS:
                    raise SchemaError(
                        f"calibration.{where}[{i}]: {_CURVE_FIGURES[i]} = {figure!r}; expected seconds in "
                        f"[0, {MAX_SECONDS:g}]"
                    )
            return Curve(*numbers)

        def table(key: str, keys: tuple[str, ...], noun: str, what: str) -> dict[str, Any]:
            value = document.get(key, {})
            if not isinstance(value, dict):
                raise SchemaError(f"calibration.{key}: expected an object of {what}, got {_short(value)}")
            unknown = sorted(set(value) - set(keys))
            if unknown:
                raise SchemaError(f"calibration.{key}: unknown {noun} {unknown}; expected some of {list(keys)}")
            return value

        compute = table("compute", COMPUTE_CLASSES, "classes", "compute class -> curve")
        by_family = table("memory_by_family", MEMORY_FAMILIES, "op families", "op family -> curve")
        host = table("host_s", HOST_GROUPS, "groups", "host group -> [forward_s, backward_s]")
        missing = [g for g in HOST_GROUPS if g not in host]
        if missing:
            raise SchemaError(f"calibration.host_s: missing group(s) {missing}; expected exactly {list(HOST_GROUPS)}")
        serial = table("serial", COMPUTE_CLASSES, "classes", "compute class -> share in [0, 1]")
        notes = document.get("notes", {})
        if not isinstance(notes, dict):
            raise SchemaError(f"calibration.notes: expected an object, got {_short(notes)}")
        notes = {k: list(pair(v, f"notes[{k!r}]")) if k in SYNC_NOTES else v for k, v in notes.items()}
        source = document.get("source", "")
        try:
            return cls(
                name=as_str(document["name"], "calibration.name"),
                compute={k: curve(v, f"compute[{k!r}]") for k, v in compute.items()},
                default_compute=curve(document["default_compute"], "default_compute"),
                memory=curve(document["memory"], "memory"),
                memory_by_family={k: curve(v, f"memory_by_family[{k!r}]") for k, v in by_family.items()},
                kernel_s=pair(document["kernel_s"], "kernel_s"),
                host_s={k: pair(v, f"host_s[{k!r}]") for k, v in host.items()},
                autocast_host_s=number(document.get("autocast_host_s", 0.0), "autocast_host_s", MAX_SECONDS, "seconds"),
                update_bytes_per_element=pair(
                    document.get("update_bytes_per_element", [12.0, 8.0]),
                    "update_bytes_per_element",
                    MAX_UPDATE_BYTES_PER_ELEMENT,
                    "bytes",
                ),
                source=as_str(source, "calibration.source"),
                serial={k: number(v, f"serial[{k!r}]", 1.0, "share") for k, v in serial.items()},
                notes=notes,
            )
        except ValueError as exc:  # every field is checked on the way: a safety net naming the document
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"calibration: {exc}") from None


#: What each figure of a curve's list is (:meth:`Calibration.from_dict`'s errors).
_CURVE_FIGURES = ("peak_fraction", "half_s", "backward_fraction", "backward_half_s")


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a whole document given where a number belongs)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _range_text(upper: float, unit: str, count: int = 1) -> str:
    """What ``count`` bounded figures may be, for error messages."""
    return f"{'a pair of ' if count == 2 else ''}{unit} in [0, {upper:g}]"


def _numbers_in(values: Any, upper: float, length: int) -> bool:
    """Whether ``values`` is a sequence of ``length`` real numbers (not bools) in [0, ``upper``]."""
    if not isinstance(values, (list, tuple)) or len(values) != length:
        return False
    return all(not isinstance(v, bool) and isinstance(v, (int, float)) and 0.0 <= v <= upper for v in values)


#: The calibration every :class:`~placement_rl.sim.cost.CostModel` uses by default: fitted to one
#: NVIDIA H200 (eager PyTorch 2.11, CUDA 13) by ``placement-rl calibrate --data benchmarks/data/h200``
#: (:mod:`placement_rl.calibrate`), figures rounded to 4 digits. ``benchmarks/calibration.py`` measures it.
DEFAULT_CALIBRATION = Calibration.from_dict(
    {
        "format": "placement_rl.calibration",
        "schema_version": 1,
        "name": "h200-eager",
        "source": (
            "one NVIDIA H200 (PyTorch 2.11, CUDA 13): 101 measured iterations of 9 zoo models (eager fp32, "
            "fp32 without TF32 and bf16 autocast, zoo batch and 2-8-way data-parallel shards, CUDA-graph "
            "replays) and 5,444 op "
            "times of the project's profiler; fitted by placement-rl calibrate --data benchmarks/data/h200"
        ),
        "compute": {
            "attention/simt": [0.6273, 0.0001928, 0.3682],
            "attention/tensor": [0.513, 5.977e-06, 0.6171],
            "conv/simt": [0.7818, 0.0002344, 0.8527],
            "conv/tensor": [0.4592, 1.535e-05, 0.2733],
            "matmul/simt": [0.7261, 2.422e-05, 0.7992],
            "matmul/tensor": [0.6331, 8.345e-06, 0.2579],
            "recurrent/simt": [0.8502, 3.443e-05, 0.2405],
            "recurrent/tensor": [0.6311, 2.297e-06, 0.6468],
        },
        "default_compute": [0.6796, 1.628e-05, 0.6796],
        "memory": [0.8828, 3.464e-07, 0.6285],
        "memory_by_family": {
            "activation": [0.8834, 1.648e-07, 0.9934],
            "copy": [0.7516, 1.362e-07, 0.7408],
            "elementwise": [0.8236, 1.984e-07, 0.9883],
            "embedding": [0.9677, 6.789e-07, 0.3249],
            "loss": [0.8783, 2.242e-05, 0.3828],
            "norm": [0.1685, 4.81e-06, 0.2147],
            "pool": [0.2006, 1.914e-06, 0.1715],
        },
        "kernel_s": [1.251e-07, 1.852e-07],
        "host_s": {
            "layer": [5.958e-05, 8.353e-06],
            "pointwise": [1.003e-05, 6.813e-06],
            "view": [1.089e-05, 1.022e-05],
            "update": [9.101e-06, 0.0],
        },
        "autocast_host_s": 0.0001189,
        "update_bytes_per_element": [12.0, 8.0],
        "serial": {
            "attention/simt": 0.1941,
            "attention/tensor": 0.208,
            "conv/simt": 0.1778,
            "conv/tensor": 0.9647,
            "matmul/simt": 0.8377,
            "matmul/tensor": 0.1226,
            "recurrent/simt": 0.1974,
            "recurrent/tensor": 0.09827,
        },
        "notes": {"sync_overhead_s": [1.677e-05, 8.049e-05], "sync_overhead_mixed_s": [1.951e-05, 0.0001039]},
    }
)
