"""Fit the calibrated GPU cost model (:mod:`placement_rl.sim.calibration`) to measurements of one GPU.

**Data** (a folder laid out as ``benchmarks/data/h200/``; ``placement-rl fidelity --cluster gpu``
writes the same files on any GPU machine):

* ``iterations.jsonl`` and ``iterations_shard_batches.jsonl``: whole training iterations of zoo
  models in eager PyTorch (forward, backward, plain SGD step), one JSON line per (model, mode,
  batch) with ``iteration_ms``. Modes used: ``default`` (torch's default math: the ``fp32``
  precision), ``fp32`` (TF32 off everywhere: ``fp32`` on the device without its TF32 peak, so that
  convolutions are timed on CUDA cores, as on GPUs before Ampere) and ``bf16`` (autocast bf16:
  ``bf16-mixed``); other modes are skipped.
* ``iterations_cuda_graphs.jsonl`` (optional): the same step captured in a CUDA graph and replayed
  (``bf16_cuda_graph``): GPU time with no host cost (execution mode ``cuda_graphs``).
* ``profile_*.json`` (optional): ``placement-rl profile`` tables (their ``precision``; schema-1
  files say nothing, so a file name containing ``bf16`` is ``bf16-mixed`` and others ``fp32``).
* ``topology_*.json``: the one-GPU topology (its device's datasheet peaks and bandwidth).

Every row is checked before any work (:func:`load_measurements`): a JSON object with ``model`` (a
zoo model), ``mode``, a whole ``batch`` >= 1 and a finite ``iteration_ms`` of at least
:data:`MIN_ITERATION_S` (1 us: no measured iteration is shorter); a bad row is a ``SchemaError``
naming the file, the line, the model and the field. A fit takes at most :data:`MAX_MEASUREMENTS`
rows (every evaluation of the fit simulates each of them) and refuses more, naming the count.

**Model of the measurement.** A single-device plan is simulated as the simulator does it (program
order on one stream, the host lane issuing each task, :mod:`placement_rl.sim.simulator`), which on
one device reduces to: the host issues task ``i`` by ``I_i = h_1 + ... + h_i`` and the GPU ends it at
``E_i = max(E_{i-1}, I_i) + g_i``; the iteration takes ``E_n``. ``g`` and ``h`` are the calibration's
GPU and host times of each task (the optimizer step charged to its owner's backward task). A
profile entry measured with a synchronize around it is modelled as ``sync_overhead + g`` (one
overhead for forward, one for backward, fitted with the rest and kept in the calibration's notes,
so that a synchronized profile can be corrected when it is used).

**Procedure** (:func:`fit`): one least-squares fit of all the calibration's figures at once, in
log space: the residuals are ``log(predicted / measured)`` of every iteration (weight 1), every
CUDA-graph iteration (weight 1) and every profile entry's forward and backward time (weight
``profile_weight``, 0.1 by default, so the ~5,000 per-op times steer the per-class curves without
outvoting the ~90 whole iterations), plus a weak pull (``prior_weight``, 0.05 per figure in
logit or log units) towards a generic start (60% of peak and a 5 us ramp per compute class, 80% of
bandwidth and a 1 us ramp per memory curve, 20 us of host per op), so that a figure the data
does not decide (a class no measured op is bound by) stays generic instead of drifting. Fractions
are fitted through a logistic and times through their logarithm (so they stay in range).
Nothing is fitted per model or per row: the same figures serve every op of every model, and
models measured on the same GPU but not given to the fit check that it generalizes
(``benchmarks/calibration.py --cross-validate`` leaves each measured model out in turn).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np

from placement_rl.errors import SchemaError
from placement_rl.graph import OpGraph
from placement_rl.io import read_user_text
from placement_rl.ops import Family, op_kind
from placement_rl.sim.calibration import (
    COMPUTE_CLASSES,
    HOST_GROUPS,
    MAX_SECONDS,
    MIN_FRACTION,
    Calibration,
    Curve,
    host_group,
)
from placement_rl.sim.cost import CostModel, ProfileTable
from placement_rl.topology import Device, DeviceTopology

#: Op families, indexing ``_Tasks.family``.
FAMILIES: tuple[str, ...] = get_args(Family)

#: The batch splits profiles are taken at (``placement-rl profile --splits 1,2,4,8``).
PROFILE_SPLITS: tuple[int, ...] = (1, 2, 4, 8)

#: Measurement modes of the data -> the cost model's precision.
MODE_PRECISIONS: dict[str, str] = {
    "default": "fp32",
    "fp32": "fp32",
    "bf16": "bf16-mixed",
    "bf16_cuda_graph": "bf16-mixed",
}
#: The files of measured iterations a data folder may hold (module docstring).
MEASUREMENT_FILES: tuple[str, ...] = (
    "iterations.jsonl",
    "iterations_shard_batches.jsonl",
    "iterations_cuda_graphs.jsonl",
)
#: The shortest iteration a row may report: 1 us (a GPU kernel alone takes a few): shorter is no measurement.
MIN_ITERATION_S = 1e-6
#: The most measured iterations one fit takes (10x the H200 data's 101): every evaluation of the fit (it
#: makes thousands) simulates each of them, and each distinct (model, batch) is a graph built and kept.
MAX_MEASUREMENTS = 1000
#: Modes measured with TF32 off everywhere: convolutions on CUDA cores, as on a GPU without TF32 (the
#: device is taken without its TF32 peak, so the ``conv/simt`` curve is what times them).
NO_TF32_MODES = frozenset({"fp32"})


@dataclass(frozen=True)
class Measurement:
    """One measured iteration: ``model`` at ``batch`` in ``precision``, taking ``iteration_s``."""

    model: str
    batch: int
    precision: str
    execution_mode: str
    iteration_s: float
    source: str
    tf32: bool = True  # False: measured with TF32 off (convolutions on CUDA cores)

    @property
    def group(self) -> str:
        """The precision as error tables name it (``fp32 no-TF32`` for TF32-off measurements)."""
        return self.precision if self.tf32 else f"{self.precision} no-TF32"


@dataclass
class _Tasks:
    """One single-device iteration as tasks in program order (the fit's view of the simulator). K tasks."""

    flops: np.ndarray  # (K,)
    num_bytes: np.ndarray  # (K,)
    compute_class: np.ndarray  # (K,) index into COMPUTE_CLASSES, -1 for memory-bound tasks
    family: np.ndarray  # (K,) index into FAMILIES (the op's family: its memory curve)
    backward: np.ndarray  # (K,) bool
    has_work: np.ndarray  # (K,) bool: a kernel runs
    host_group: np.ndarray  # (K,) index into HOST_GROUPS, -1 for none
    autocast: np.ndarray  # (K,) bool: autocast casts its inputs
    update_elements: np.ndarray  # (K,) parameter elements the optimizer step updates with this task
    update_tensors: np.ndarray  # (K,)
    peak_flops: np.ndarray  # (K,)
    bandwidth: float


@dataclass
class Dataset:
    """Everything a fit reads: measurements with their task lists, profile entries with their features."""

    device: Device
    topology: DeviceTopology
    measurements: list[Measurement] = field(default_factory=list)
    tasks: list[_Tasks] = field(default_factory=list)
    profile: _Tasks | None = None  # one task per profile time (forward and backward of each entry)
    profile_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    profile_mixed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))  # measured under autocast
    profile_sources: list[str] = field(default_factory=list)
    profile_models: list[frozenset[str]] = field(default_factory=list)  # models having each profiled op
    graphs: dict[tuple[str, int], OpGraph] = field(default_factory=dict)  # (model, batch) -> graph
    profiles: dict[str, ProfileTable] = field(default_factory=dict)  # precision -> the folder's profile


def load_measurements(
    folder: str | os.PathLike[str],
    models: Iterable[str] | None = None,
    max_measurements: int | None = MAX_MEASUREMENTS,
) -> list[Measurement]:
    """The measured iterations in ``folder`` (see the module docstring), optionally only of ``models``.

    Every row is checked before any is used: a JSON object with a ``model`` name, a ``mode`` (rows of
    other modes and rows with an ``error`` are skipped), a whole ``batch`` >= 1 and a finite
    ``iteration_ms`` of at least :data:`MIN_ITERATION_S`.

    Raises:
        FileNotFoundError: when ``folder`` does not exist or holds no row of a fitted mode.
        SchemaError: naming the file, the line, the row's model and the field of a bad row, or the folder
            when it has more than ``max_measurements`` rows to fit (``None``: no bound).
    """
    folder = check_folder(folder)
    wanted = set(models) if models is not None else None
    found: list[Measurement] = []
    for name in MEASUREMENT_FILES:
        path = folder / name
        if not path.exists():
            continue
        text = read_user_text(path, "JSON Lines")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            m = _measurement(line, f"{path}:{n}", f"{name}:{n}")
            if m is not None and (wanted is None or m.model in wanted):
                found.append(m)
    if not found:
        raise FileNotFoundError(
            f"{str(folder)!r}: no rows of modes {sorted(MODE_PRECISIONS)} in {', '.join(MEASUREMENT_FILES)}"
            + (f" of models {sorted(wanted)}" if wanted is not None else "")
        )
    if max_measurements is not None and len(found) > max_measurements:
        raise SchemaError(
            f"{str(folder)!r}: {len(found):,} measured iterations to fit; expected at most {max_measurements:,} "
            "(every evaluation of the fit simulates each one): fit fewer rows or fewer models"
        )
    return found


def check_zoo_models(folder: str | os.PathLike[str], measurements: Sequence[Measurement]) -> None:
    """Refuse a measurement of a model the zoo does not have, naming its row (before any graph is built)."""
    from placement_rl import zoo

    known = set(zoo.names())
    for m in measurements:
        if m.model not in known:
            names = ", ".join(sorted(known))
            raise SchemaError(f"{Path(folder) / m.source}: unknown model {m.model!r}; expected a zoo model: {names}")


def check_folder(folder: str | os.PathLike[str]) -> Path:
    """``folder`` as a :class:`~pathlib.Path`, if it is a folder (a ``FileNotFoundError`` or ``SchemaError`` if not)."""
    path = Path(folder)
    if not path.exists():
        raise FileNotFoundError(
            f"no such folder: {str(path)!r}; expected a folder of measurements (iterations*.jsonl, topology_*.json)"
        )
    if not path.is_dir():
        raise SchemaError(
            f"{str(path)!r} is a file; expected a folder of measurements (iterations*.jsonl, topology_*.json)"
        )
    return path


def _measurement(line: str, where: str, source: str) -> Measurement | None:
    """One row of an ``iterations*.jsonl`` file (``where``: ``path:line``), or ``None`` for a row not fitted."""
    try:  # NaN and Infinity parse (a diverged loss is written so): the fields fitted are checked below
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{where}: not JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an integer too long to convert, nesting too deep
        raise SchemaError(f"{where}: not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise SchemaError(
            f"{where}: expected a JSON object (one measured iteration: model, mode, batch, iteration_ms), "
            f"got a JSON {_json_type(row)}"
        )
    if "error" in row:  # a measurement that failed (out of memory, ...): nothing to fit
        return None
    model = row.get("model")
    if not isinstance(model, str) or not model:
        got = "no 'model'" if "model" not in row else f"model = {model!r}"
        raise SchemaError(f"{where}: {got}; expected the name of the measured model (a string)")
    mode = row.get("mode")
    if not isinstance(mode, str):
        got = "no 'mode'" if "mode" not in row else f"mode = {mode!r}"
        raise SchemaError(f"{where} (model {model!r}): {got}; expected a string such as {sorted(MODE_PRECISIONS)}")
    if mode not in MODE_PRECISIONS:  # another measurement mode (tf32, compiled, ...): not fitted
        return None
    batch = row.get("batch")
    if isinstance(batch, float) and batch.is_integer():
        batch = int(batch)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        got = "no 'batch'" if "batch" not in row else f"batch = {batch!r}"
        raise SchemaError(f"{where} (model {model!r}): {got}; expected a whole number of samples >= 1")
    ms = row.get("iteration_ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms / 1e3 < MIN_ITERATION_S:
        got = "no 'iteration_ms'" if "iteration_ms" not in row else f"iteration_ms = {ms!r}"
        raise SchemaError(
            f"{where} (model {model!r}): {got}; expected a finite time of at least {MIN_ITERATION_S * 1e3:g} ms"
        )
    return Measurement(
        model,
        batch,
        MODE_PRECISIONS[mode],
        "cuda_graphs" if mode.endswith("cuda_graph") else "eager",
        float(ms) / 1e3,
        source,
        tf32=mode not in NO_TF32_MODES,
    )


def _json_type(value: Any) -> str:
    """The JSON type name of a parsed value."""
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def without_tf32(topology: DeviceTopology) -> DeviceTopology:
    """``topology`` with its devices' TF32 peaks removed (TF32 off: fp32 math on CUDA cores)."""
    devices = [
        dataclasses.replace(d, peak_flops_by_dtype=tuple((k, v) for k, v in d.peak_flops_by_dtype if k != "tf32"))
        for d in topology.devices
    ]
    return DeviceTopology(topology.name, devices, topology.links, topology.switches)


def load_topology(folder: str | os.PathLike[str]) -> DeviceTopology:
    """The one-device topology (``topology_*.json``) the data in ``folder`` was measured on."""
    tops = sorted(check_folder(folder).glob("topology_*.json"))
    if not tops:
        raise FileNotFoundError(f"{folder}: no topology_*.json (the one-GPU topology the data was measured on)")
    topology = DeviceTopology.from_json(tops[0])
    if len(topology.devices) != 1:
        raise ValueError(f"{tops[0]}: expected a one-device topology, got {len(topology.devices)} devices")
    return topology


def profile_precision(table: ProfileTable, path: Path) -> str:
    """A profile's precision: its own field, else from the file name (schema-1 files)."""
    recorded = getattr(table, "precision", "")
    if recorded:
        return str(recorded)
    return "bf16-mixed" if "bf16" in path.name else "fp32"


def graph_tasks(graph: OpGraph, device: Device, cost: CostModel) -> _Tasks:
    """``graph`` on one device as the simulator orders it: forward ops in order, then backward in reverse."""
    ops = graph.ops
    rows: list[tuple[Any, ...]] = []
    owners: dict[str, int] = {}
    for i, op in enumerate(ops):
        key = op.param_key or (f"\0{op.name}" if op.param_bytes else None)
        if key is not None:
            owners.setdefault(key, i)
    for backward in (False, True):
        for i in reversed(range(len(ops))) if backward else range(len(ops)):
            op = ops[i]
            rows.append(_task_row(op, backward, device, cost, owners.get(op.param_key or f"\0{op.name}") == i))
    return _stack(rows, device.memory_bandwidth_bytes_per_s)


def _task_row(op: Any, backward: bool, device: Device, cost: CostModel, owner: bool) -> tuple[Any, ...]:
    kind = op_kind(op.op_type)
    dtype = cost.op_compute_dtype(op.op_type, device)
    cls, traffic = cost.calibrated_work(op, dtype)
    autocast = cls is not None and cost.mixed_precision
    group = host_group(op.op_type)
    work = kind.family != "input" and (backward is False or op.backward_flops > 0 or kind.backward_factor > 0)
    has_host = group is not None and (not backward or kind.backward_factor > 0 or group == "view")
    peak = device.peak_flops_for(dtype)
    assert peak is not None, f"{device.device_type} has no {dtype} peak"
    flops = op.backward_flops if backward else op.forward_flops
    num_bytes = (2.0 if backward else 1.0) * traffic
    return (
        flops if work else 0.0,
        num_bytes if work else 0.0,
        COMPUTE_CLASSES.index(cls) if cls is not None else -1,
        FAMILIES.index(kind.family),
        backward,
        work and (flops > 0 or num_bytes > 0),
        HOST_GROUPS.index(group) if has_host and group is not None else -1,
        autocast and not backward,
        cost.param_elements(op) if backward and owner and op.param_bytes else 0.0,
        1 if backward and owner and op.param_bytes else 0,
        peak,
    )


def _stack(rows: Sequence[tuple[Any, ...]], bandwidth: float) -> _Tasks:
    cols = list(zip(*rows, strict=True)) if rows else [()] * 11
    return _Tasks(
        np.array(cols[0], np.float64),
        np.array(cols[1], np.float64),
        np.array(cols[2], np.int64),
        np.array(cols[3], np.int64),
        np.array(cols[4], np.bool_),
        np.array(cols[5], np.bool_),
        np.array(cols[6], np.int64),
        np.array(cols[7], np.bool_),
        np.array(cols[8], np.float64),
        np.array(cols[9], np.int64),
        np.array(cols[10], np.float64),
        bandwidth,
    )


def gpu_seconds(cal: Calibration, t: _Tasks) -> np.ndarray:
    """(K,) GPU seconds of each task under ``cal`` (:meth:`Calibration.gpu_seconds`, vectorized), with the update."""
    b = t.backward.astype(np.int64)
    curves = [cal.curve(c) for c in COMPUTE_CLASSES]
    fraction = np.array([[c.peak_fraction, c.backward_fraction] for c in curves])
    half = np.array([[c.half_s, c.backward_half_s] for c in curves])
    cls = np.maximum(t.compute_class, 0)
    compute = np.where(
        (t.compute_class >= 0) & (t.flops > 0), (t.flops / t.peak_flops + half[cls, b]) / fraction[cls, b], 0.0
    )
    mem = [cal.memory_curve(f) for f in FAMILIES]
    m_fraction = np.array([[c.peak_fraction, c.backward_fraction] for c in mem])
    m_half = np.array([[c.half_s, c.backward_half_s] for c in mem])
    memory = np.where(t.num_bytes > 0, (t.num_bytes / t.bandwidth + m_half[t.family, b]) / m_fraction[t.family, b], 0.0)
    floor = np.where(t.backward, cal.kernel_s[1], cal.kernel_s[0])
    serial = np.array([cal.serial.get(c, 0.0) for c in COMPUTE_CLASSES])
    both = np.maximum(compute, memory) + np.where(t.compute_class >= 0, serial[cls], 0.0) * np.minimum(compute, memory)
    g = np.where(t.has_work, floor + both, 0.0)
    base, _ = cal.update_bytes_per_element
    update = np.where(
        t.update_elements > 0,
        cal.kernel_s[0] + (t.update_elements * base / t.bandwidth + cal.memory.half_s) / cal.memory.peak_fraction,
        0.0,
    )
    return g + update


def host_seconds(cal: Calibration, t: _Tasks) -> np.ndarray:
    """(K,) host seconds to issue each task (eager execution)."""
    table = np.array([cal.host_s[g] for g in HOST_GROUPS])
    grp = np.maximum(t.host_group, 0)
    h = np.where(t.host_group >= 0, table[grp, t.backward.astype(np.int64)], 0.0)
    h = h + np.where(t.autocast, cal.autocast_host_s, 0.0)
    return h + t.update_tensors * cal.host_s["update"][0]


def iteration_seconds(cal: Calibration, t: _Tasks, execution_mode: str) -> float:
    """The simulated single-device iteration: ``E_n`` with ``E_i = max(E_{i-1}, I_i) + g_i`` (module docstring)."""
    g = gpu_seconds(cal, t)
    if execution_mode != "eager":
        return float(g.sum())
    issued = np.cumsum(host_seconds(cal, t))
    done = np.cumsum(g)
    before = np.concatenate(([0.0], done[:-1]))
    return float(done[-1] + max(0.0, float(np.max(issued - before)))) if g.size else 0.0


# ------------------------------------------------------------------------------------ the fit
_HOST_KEYS: tuple[tuple[str, int], ...] = tuple((g, d) for g in HOST_GROUPS for d in (0, 1) if (g, d) != ("update", 1))


def _unpack(
    x: np.ndarray, classes: Sequence[str], families: Sequence[str], name: str, backward_ramp: bool = False
) -> tuple[Calibration, tuple[float, float, float, float]]:
    # Figures are kept within the calibration's physical bounds (MIN_FRACTION, MAX_SECONDS), so that every
    # calibration the fit writes reads back; the fitted figures lie far inside them.
    k = 0

    def frac(least: float = MIN_FRACTION) -> float:
        nonlocal k
        k += 1
        return max(float(1.0 / (1.0 + math.exp(-min(max(x[k - 1], -30.0), 30.0)))), least)

    def pos() -> float:
        nonlocal k
        k += 1
        return min(float(math.exp(min(max(x[k - 1], -60.0), 10.0))), MAX_SECONDS)

    def compute_curve() -> Curve:
        fraction, half, backward = frac(), pos(), frac()
        return Curve(fraction, half, backward, pos() if backward_ramp else half)

    compute = {c: compute_curve() for c in classes}
    serial = {c: frac(0.0) for c in classes}
    memory = Curve(frac(), pos(), frac())
    by_family = {f: Curve(frac(), pos(), frac()) for f in families}
    kernel = (pos(), pos())
    host: dict[str, list[float]] = {g: [0.0, 0.0] for g in HOST_GROUPS}
    for g, d in _HOST_KEYS:
        host[g][d] = pos()
    autocast = pos()
    sync = (pos(), pos(), pos(), pos())
    matmul = [compute[c] for c in classes if c.startswith("matmul/")] or list(compute.values())
    default = Curve(
        float(np.mean([c.peak_fraction for c in matmul])),
        float(np.mean([c.half_s for c in matmul])),
        float(np.mean([c.backward_fraction for c in matmul])),
        float(np.mean([c.backward_half_s for c in matmul])),
    )
    cal = Calibration(
        name=name,
        compute=compute,
        default_compute=default,
        memory=memory,
        memory_by_family=by_family,
        kernel_s=kernel,
        host_s={g: (v[0], v[1]) for g, v in host.items()},
        autocast_host_s=autocast,
        notes={"sync_overhead_s": list(sync[:2]), "sync_overhead_mixed_s": list(sync[2:])},
        serial=serial,
    )
    return cal, sync


def _start(classes: Sequence[str], families: Sequence[str], backward_ramp: bool = False) -> np.ndarray:
    logit, mem = math.log(0.6 / 0.4), math.log(0.8 / 0.2)
    ramp = (math.log(5e-6),) if backward_ramp else ()
    x = [v for _ in classes for v in (logit, math.log(5e-6), logit, *ramp)]
    x += [math.log(0.2 / 0.8)] * len(classes)  # serial: a fifth of the shorter of compute and memory
    x += [v for _ in range(1 + len(families)) for v in (mem, math.log(1e-6), mem)]
    x += [math.log(3e-6), math.log(6e-6)]
    x += [math.log(20e-6)] * len(_HOST_KEYS) + [math.log(5e-6)]
    x += [math.log(15e-6), math.log(60e-6), math.log(15e-6), math.log(60e-6)]
    return np.array(x)


def build_dataset(
    folder: str | os.PathLike[str],
    models: Iterable[str] | None = None,
    graph_loader: Callable[[str, int], OpGraph] | None = None,
    with_profiles: bool = True,
    profile_models: Iterable[str] = (),
    progress: Callable[[str], None] | None = None,
    max_measurements: int | None = MAX_MEASUREMENTS,
) -> Dataset:
    """Read ``folder`` and turn every measurement and profile entry into task features.

    Args:
        folder: the data (module docstring).
        models: only these models' iterations (default: all the data has).
        graph_loader: ``(model, batch) -> OpGraph`` (default: the zoo).
        with_profiles: also read ``profile_*.json``.
        profile_models: more zoo models whose ops the profiles may hold (built at their zoo batch over
            1, 2, 4 and 8, the profiler's splits), to name profile entries no measured model has
            (schema-1 profiles do not say which model an op is from); their iterations, if measured
            elsewhere, are not read. Left-out cross-validation drops an op's entries only when the
            left-out model has that op.
        progress: called with a line per graph built.
        max_measurements: the most measured iterations accepted (:func:`load_measurements`; ``None``: no bound).
    """
    from placement_rl import zoo

    load = graph_loader or (lambda m, b: zoo.load(m, batch_size=b))
    topology = load_topology(folder)
    device = topology.devices[0]
    data = Dataset(device, topology)
    graphs = data.graphs

    def graph(model: str, batch: int) -> OpGraph:
        if (model, batch) not in graphs:
            if progress:
                progress(f"building {model} at batch {batch}")
            graphs[(model, batch)] = load(model, batch)
        return graphs[(model, batch)]

    measurements = load_measurements(folder, models, max_measurements)
    if graph_loader is None:
        check_zoo_models(folder, measurements)
    for m in measurements:
        cost = CostModel(precision=m.precision, optimizer="sgd")
        data.measurements.append(m)
        measured_on = device if m.tf32 else without_tf32(topology).devices[0]
        try:
            measured_graph = graph(m.model, m.batch)
        except ValueError as exc:  # an unknown model, a batch the model cannot take
            raise SchemaError(f"{Path(folder) / m.source} (model {m.model!r}, batch {m.batch}): {exc}") from None
        data.tasks.append(graph_tasks(measured_graph, measured_on, cost))
    if with_profiles:
        for model in profile_models:
            full = zoo.spec(model).default_batch_size
            for k in PROFILE_SPLITS:
                if full // k >= 1:
                    graph(model, full // k)
        rows: list[tuple[Any, ...]] = []
        seconds: list[float] = []
        mixed: list[bool] = []
        for path in sorted(Path(folder).glob("profile_*.json")):
            table = ProfileTable.from_json(path)
            precision = profile_precision(table, path)
            data.profiles.setdefault(precision, table)
            cost = CostModel(precision=precision, optimizer="sgd")
            ops, owners = _profile_ops(graphs)
            for key, entry in table.entries.items():
                shape_key = (key[1], tuple(key[2]), int(key[3]))
                op = ops.get(shape_key)
                if op is None:
                    continue
                for backward, measured in ((False, entry.forward_s), (True, entry.backward_s)):
                    row = _task_row(op, backward, device, cost, False)
                    if measured > 0 and row[5]:
                        rows.append(row)
                        seconds.append(measured)
                        mixed.append(cost.mixed_precision)
                        data.profile_sources.append(path.name)
                        data.profile_models.append(owners[shape_key])
        if rows:
            data.profile = _stack(rows, device.memory_bandwidth_bytes_per_s)
            data.profile_seconds = np.array(seconds)
            data.profile_mixed = np.array(mixed, np.bool_)
    return data


def _profile_ops(
    graphs: dict[tuple[str, int], OpGraph],
) -> tuple[dict[tuple[str, Any, int], Any], dict[tuple[str, Any, int], frozenset[str]]]:
    """Ops of the built graphs by the profile's shape key ``(op_type, output_shape, param_bytes)``, and
    the models having an op of each key."""
    ops: dict[tuple[str, Any, int], Any] = {}
    owners: dict[tuple[str, Any, int], set[str]] = {}
    for (model, _), g in graphs.items():
        for op in g.ops:
            key = (op.op_type, tuple(op.output_shapes[0]), int(op.param_bytes))
            ops.setdefault(key, op)
            owners.setdefault(key, set()).add(model)
    return ops, {k: frozenset(v) for k, v in owners.items()}


def subset(data: Dataset, *, exclude: str | None = None, only: str | None = None) -> Dataset:
    """``data`` without one model (its iterations and every profiled op it has), or with only one model's."""
    keep = [
        i
        for i, m in enumerate(data.measurements)
        if (exclude is None or m.model != exclude) and (only is None or m.model == only)
    ]
    out = Dataset(
        data.device,
        data.topology,
        [data.measurements[i] for i in keep],
        [data.tasks[i] for i in keep],
        graphs=data.graphs,
        profiles=data.profiles,
    )
    if data.profile is not None:
        rows = np.array([exclude is None or exclude not in owners for owners in data.profile_models], np.bool_)
        if only is not None:
            rows &= np.array([only in owners for owners in data.profile_models], np.bool_)
        p = data.profile
        out.profile = dataclasses.replace(
            p, **{f.name: getattr(p, f.name)[rows] for f in dataclasses.fields(p) if f.name != "bandwidth"}
        )
        out.profile_seconds = data.profile_seconds[rows]
        out.profile_mixed = data.profile_mixed[rows]
        out.profile_sources = [s for s, r in zip(data.profile_sources, rows, strict=True) if r]
        out.profile_models = [s for s, r in zip(data.profile_models, rows, strict=True) if r]
    return out


def fit(
    data: Dataset,
    profile_weight: float = 0.1,
    name: str = "fitted",
    max_evaluations: int = 4000,
    prior_weight: float = 0.05,
    backward_ramp: bool = False,
    progress: bool = False,
) -> tuple[Calibration, dict[str, Any]]:
    """Fit a :class:`Calibration` to ``data`` (module docstring). Returns it and the fit's figures.

    ``backward_ramp`` also fits each compute class a backward ramp of its own
    (:attr:`~placement_rl.sim.calibration.Curve.backward_half_s`; default: one ramp for both
    directions, as the shipped calibration was fitted). ``progress`` shows a bar on stderr counting
    the evaluations of the residuals (each simulates every measured iteration) with the current cost.

    Raises:
        ValueError: for a weight that is not a finite number >= 0, ``max_evaluations`` < 1, no
            measurement, or a measured time that is not finite and at least :data:`MIN_ITERATION_S`
            (naming its row).
    """
    for label, w in (("profile_weight", profile_weight), ("prior_weight", prior_weight)):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"{label} = {w!r}; expected a finite weight >= 0")
    if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int) or max_evaluations < 1:
        raise ValueError(f"max_evaluations = {max_evaluations!r}; expected a whole number >= 1")
    if not data.measurements:
        raise ValueError("no measured iterations to fit; expected at least one")
    for m in data.measurements:
        if not (math.isfinite(m.iteration_s) and m.iteration_s >= MIN_ITERATION_S):
            raise ValueError(
                f"{m.source} (model {m.model!r}): iteration_s = {m.iteration_s!r}; expected a finite time of at "
                f"least {MIN_ITERATION_S:g} s"
            )
    bad = np.flatnonzero(~(np.isfinite(data.profile_seconds) & (data.profile_seconds > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{data.profile_sources[i] if i < len(data.profile_sources) else 'profile'}: op time "
            f"{float(data.profile_seconds[i])!r} s; expected a finite time > 0"
        )
    from scipy.optimize import least_squares

    from placement_rl.progress import Progress

    classes = [
        c
        for c in COMPUTE_CLASSES
        if any((t.compute_class == COMPUTE_CLASSES.index(c)).any() for t in data.tasks)
        or (data.profile is not None and (data.profile.compute_class == COMPUTE_CLASSES.index(c)).any())
    ]
    used = [t.family[t.compute_class < 0] for t in data.tasks]
    if data.profile is not None:
        used.append(data.profile.family[data.profile.compute_class < 0])
    present = set(np.concatenate(used).tolist()) if used else set()
    families = [f for i, f in enumerate(FAMILIES) if i in present and f not in ("input", "view")]
    measured = np.array([m.iteration_s for m in data.measurements])
    x0 = _start(classes, families, backward_ramp)
    modes = [m.execution_mode for m in data.measurements]
    weight = math.sqrt(profile_weight)

    bar = Progress(None, f"fitting {len(measured)} iterations", "evaluation", enabled=progress, leave=False)

    def residuals(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", divide="ignore"):
            r = _residuals(x)
        bar.advance(1, cost=f"{0.5 * float(r @ r):.4g}")
        return r

    def _residuals(x: np.ndarray) -> np.ndarray:
        cal, sync = _unpack(x, classes, families, name, backward_ramp)
        pred = np.array([iteration_seconds(cal, t, mode) for t, mode in zip(data.tasks, modes, strict=True)])
        parts = [np.log(pred / measured)]
        if data.profile is not None and weight > 0:
            g = gpu_seconds(cal, data.profile)
            mixed = data.profile_mixed
            g = g + np.where(
                data.profile.backward, np.where(mixed, sync[3], sync[1]), np.where(mixed, sync[2], sync[0])
            )
            r = np.log(g / data.profile_seconds)  # robust (soft L1 at 0.2): an odd op time is not fitted at all cost
            parts.append(weight * np.sign(r) * 0.2 * np.sqrt(2.0 * (np.sqrt(1.0 + (r / 0.2) ** 2) - 1.0)))
        parts.append(prior_weight * (x - x0))  # a weak pull to the generic start: figures no data decides stay sane
        return np.concatenate(parts)

    with bar:
        result = least_squares(
            residuals, x0, method="trf", max_nfev=max_evaluations, x_scale="jac", ftol=1e-10, xtol=1e-10
        )
    cal, _ = _unpack(result.x, classes, families, name, backward_ramp)
    errors = [
        abs(iteration_seconds(cal, t, mode) / m - 1.0) for t, mode, m in zip(data.tasks, modes, measured, strict=True)
    ]
    figures = {
        "iterations": len(measured),
        "profile_times": int(data.profile_seconds.shape[0]),
        "median_error": float(np.median(errors)),
        "worst_error": float(np.max(errors)),
        "evaluations": int(result.nfev),
        "classes": classes,
    }
    return cal, figures


def write_calibration(path: str | os.PathLike[str], cal: Calibration) -> None:
    """Write ``cal`` as a ``placement_rl.calibration`` JSON file."""
    from placement_rl.io import write_json

    write_json(path, cal.to_dict())


def read_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a ``placement_rl.calibration`` JSON file (errors name the file and the field)."""
    from placement_rl.io import read_json

    document = read_json(path)  # its errors name the file already
    try:
        return Calibration.from_dict(document)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None


# ------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class Comparison:
    """One measured iteration against its simulation (the simulator itself, single-device plan)."""

    measurement: Measurement
    cost_model: str  # "roofline", "calibrated" or "profiled"
    simulated_s: float

    @property
    def error(self) -> float:
        """Relative error ``simulated / measured - 1``."""
        return self.simulated_s / self.measurement.iteration_s - 1.0


def compare(
    data: Dataset, calibration: Calibration, cost_models: Sequence[str] = ("calibrated",), progress: bool = False
) -> list[Comparison]:
    """Simulate every measurement's single-device plan under each named cost model.

    ``roofline``: the flat efficiency table, no host; ``calibrated``: ``calibration``; ``profiled``:
    ``calibration`` with the folder's profile of the measurement's precision (a synchronized
    profile's round trip removed, :meth:`CostModel._profiled`). The execution mode is the
    measurement's (``cuda_graphs`` for captured iterations). ``progress`` shows a bar over the
    measurements on stderr.
    """
    from placement_rl.progress import Progress

    out: list[Comparison] = []
    strict = without_tf32(data.topology)
    with Progress(len(data.measurements), "simulating", "iteration", enabled=progress, leave=False) as bar:
        for m in data.measurements:
            out += _compare_one(data, m, data.topology if m.tf32 else strict, calibration, cost_models)
            bar.advance()
    return out


def _compare_one(
    data: Dataset, m: Measurement, topology: DeviceTopology, calibration: Calibration, cost_models: Sequence[str]
) -> list[Comparison]:
    """One measurement simulated under each of ``cost_models`` (:func:`compare`)."""
    from placement_rl.plan import constructors
    from placement_rl.sim.simulator import simulate

    graph = data.graphs[(m.model, m.batch)]
    plan = constructors.single_device(graph, topology)
    out: list[Comparison] = []
    for name in cost_models:
        if name == "profiled" and (m.precision not in data.profiles or not m.tf32):
            continue
        cost = CostModel(
            precision=m.precision,
            optimizer="sgd",
            execution_mode=m.execution_mode,
            calibration=None if name == "roofline" else calibration,
            profile=data.profiles[m.precision] if name == "profiled" else None,
        )
        out.append(Comparison(m, name, simulate(graph, topology, plan, cost).makespan_s))
    return out


def error_table(comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """Median and worst absolute error per (cost model, precision, execution mode, batch group).

    The batch group is ``full`` for the zoo batch and ``shards`` for the per-GPU batches of 2-8-way
    data parallelism (a batch below the largest measured for that model).
    """
    full: dict[str, int] = {}
    for c in comparisons:
        full[c.measurement.model] = max(full.get(c.measurement.model, 0), c.measurement.batch)
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for c in comparisons:
        m = c.measurement
        batch = "full" if m.batch == full[m.model] else "shards"
        groups.setdefault((c.cost_model, m.group, m.execution_mode, batch), []).append(abs(c.error))
    return [
        {
            "cost_model": k[0],
            "precision": k[1],
            "execution_mode": k[2],
            "batch": k[3],
            "rows": len(v),
            "median_error": float(np.median(v)),
            "worst_error": float(np.max(v)),
        }
        for k, v in sorted(groups.items())
    ]
