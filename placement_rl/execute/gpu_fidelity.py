"""Simulator fidelity on one GPU: the library call behind ``placement-rl fidelity --cluster gpu``.

:func:`run_gpu_fidelity` measures the first CUDA GPU of this machine (another one:
``CUDA_VISIBLE_DEVICES``) and puts the simulator next to it, model by model:

1. **Plain iterations** (:mod:`placement_rl.execute.plain`): the zoo model's plain PyTorch training
   step in every precision (default ``fp32``, torch's default math, and ``bf16-mixed``), at the zoo
   batch (``iterations.jsonl``) and at the per-GPU batches of 2-, 4- and 8-way data parallelism
   (``iterations_shard_batches.jsonl``).
2. **Profiles** (:func:`placement_rl.profiling.profile_models`): every op in every precision at the
   same batches (``profile_<precision>.json``).
3. **The executor** (:func:`placement_rl.execute.execute` machinery) on the single-device plan at the
   zoo batch, NCCL on CUDA, fp32: measured, simulated, replayed with its measured (GPU) compute times,
   and its overhead, the ratio of its iteration to the plain fp32 iteration
   (``executor_single_device.jsonl``).
4. **Simulations** of the single-device plan at every batch and precision, with the analytic cost
   model (roofline) and with the profiled one, against the plain iterations (``simulated.jsonl``).

It also writes the one-GPU topology (``topology_<name>.json``: the device catalogue's figures for the
GPU's device type, the GPU's own memory size), the errors (``summary.json``) and the table
(``table.md``). The files are shaped like those of ``benchmarks/data/h200``.

Everything runs on the CPU as well (``device="cpu"``: gloo workers, a CPU device of the measured
peak), which is how the tests run the whole pipeline; the command line measures GPUs only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement_rl.execute import ExecutionError, NotExecutableError, RunOptions, report_results
from placement_rl.execute.local import run_local_jobs
from placement_rl.execute.lower import Program, lower
from placement_rl.execute.plain import MODES, autocast, math_mode, measure_plain_iterations
from placement_rl.execute.runtime import ModelSource, WorkerResult
from placement_rl.graph import OpGraph
from placement_rl.paths import safe_name
from placement_rl.plan import constructors
from placement_rl.plan.core import Plan
from placement_rl.sim.cost import CostModel, ProfileEntry, ProfileTable
from placement_rl.topology import DeviceTopology
from placement_rl.topology.core import Device
from placement_rl.topology.devices import DEVICE_TYPES, DeviceSpec, make_device

#: The models measured by default: those ``benchmarks/data/h200`` covers.
DEFAULT_GPU_MODELS: tuple[str, ...] = (
    "alexnet",
    "vgg19",
    "resnet50",
    "inception_v3",
    "transformer",
    "bert_large",
    "gnmt",
    "rnnlm",
    "llama",
)

#: The precisions measured by default: torch's default math and bf16 autocast.
DEFAULT_PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed")

#: The default batch splits: the zoo batch and the per-GPU batches of 2-, 4- and 8-way data parallelism.
DEFAULT_SPLITS: tuple[int, ...] = (1, 2, 4, 8)

#: The format name of ``summary.json``.
SUMMARY_FORMAT = "placement_rl.gpu_fidelity"


class NoGpuError(ValueError):
    """``--cluster gpu`` on a machine without a usable CUDA GPU; the message says what to run instead."""


# ------------------------------------------------------------------------------------------ the device
def match_device_type(
    gpu_name: str, memory_bytes: int, catalogue: Mapping[str, DeviceSpec] = DEVICE_TYPES
) -> str | None:
    """The catalogue's device type of the GPU ``torch.cuda.get_device_name`` calls ``gpu_name``.

    Candidates are the device types whose model, the first dash-separated part of the name (``H100`` of
    ``H100-SXM5-80GB``), is a word of ``gpu_name`` (``NVIDIA H100 80GB HBM3``). Between several, the
    one with the most name parts among those words (``SXM2``, ``32GB``), then the one whose memory is
    closest to ``memory_bytes``.

    Returns:
        The device type, or ``None`` when no device type's model is named.
    """
    words = {w.upper() for w in re.split(r"[\s\-_/]+", gpu_name) if w}
    candidates = [k for k in catalogue if k.split("-")[0].upper() in words]
    if not candidates:
        return None

    def rank(key: str) -> tuple[int, int, str]:
        parts = sum(1 for part in key.split("-") if part.upper() in words)
        return (-parts, abs(catalogue[key].memory_bytes - memory_bytes), key)

    return min(candidates, key=rank)


@dataclass(frozen=True)
class MeasuredDevice:
    """The device measured and the one-device topology it is simulated on.

    Attributes:
        torch_device: ``cuda:0`` or ``cpu``.
        name: what the hardware calls itself (``NVIDIA H200``).
        device_type: the catalogue's name (the profile's and the topology's label).
        count: CUDA GPUs found (one is measured).
        topology: one device, ``m0/gpu0`` (``m0/cpu0`` on the CPU).
    """

    torch_device: str
    name: str
    device_type: str
    count: int
    topology: DeviceTopology

    @property
    def cuda(self) -> bool:
        return self.torch_device.startswith("cuda")

    def to_dict(self) -> dict[str, Any]:
        import torch

        return {
            "torch_device": self.torch_device,
            "name": self.name,
            "device_type": self.device_type,
            "count": self.count,
            "memory_bytes": self.topology.devices[0].memory_bytes,
            "topology": self.topology.name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }


def no_gpu_message() -> str:
    """Why ``--cluster gpu`` cannot run here, and what to run instead."""
    import torch

    build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return (
        f"--cluster gpu measures this machine's CUDA GPUs, and there is none (torch {torch.__version__}, "
        f"{build}: torch.cuda.is_available() is False). Run it on a machine with an NVIDIA GPU and a CUDA "
        "build of PyTorch; here, 'placement-rl fidelity' (CPU workers, --cluster local) compares the executor "
        "with the simulator, and 'placement-rl profile' profiles ops on the CPU"
    )


def resolve_device(device: str = "cuda", device_type: str | None = None) -> MeasuredDevice:
    """The device to measure and its one-device topology.

    On CUDA: GPU 0; its device type is ``device_type`` (a catalogue name) or matched from its name
    (:func:`match_device_type`); the topology has the catalogue's peaks and bandwidth and the GPU's own
    memory. On the CPU (tests): device type ``CPU`` with the peak FLOP/s and memory bandwidth measured
    with one thread, the same peak for every compute dtype (no faster units assumed).

    Raises:
        NoGpuError: ``device`` is CUDA and there is no usable GPU.
        ValueError: a device type that is not in the catalogue, or a GPU that matches none (naming
            them and ``--device-type``).
    """
    import torch

    from placement_rl.errors import UnknownNameError

    if device == "cpu":
        from placement_rl.execute.fidelity import CPU_DEVICE_TYPE, measure_cpu, memory_bytes

        peak, bandwidth = measure_cpu()
        dtypes = tuple((d, peak) for d in ("bf16", "fp16", "tf32"))
        cpu = Device("m0/cpu0", CPU_DEVICE_TYPE, "m0", peak, memory_bytes(), bandwidth, dtypes)
        return MeasuredDevice("cpu", "CPU", CPU_DEVICE_TYPE, 0, DeviceTopology("cpux1", [cpu], []))
    if not device.startswith("cuda"):
        raise ValueError(f"device {device!r}: expected 'cuda' or 'cpu'")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise NoGpuError(no_gpu_message())
    index = 0
    name = torch.cuda.get_device_name(index)
    memory = int(torch.cuda.get_device_properties(index).total_memory)
    label = device_type or match_device_type(name, memory)
    if label is None:
        raise ValueError(
            f"GPU {name!r} matches no device type of the catalogue ({', '.join(DEVICE_TYPES)}); pass "
            "--device-type NAME with the closest one (its peaks and memory bandwidth are simulated)"
        )
    try:
        gpu = make_device("m0/gpu0", label, "m0", memory_bytes=memory)
    except UnknownNameError as exc:
        raise ValueError(f"--device-type: {exc}") from None
    topology = DeviceTopology(f"{safe_name(label.lower())}x1", [gpu], [])
    return MeasuredDevice(f"cuda:{index}", name, label, torch.cuda.device_count(), topology)


# ------------------------------------------------------------------------------------------ the report
@dataclass
class GpuFidelityReport:
    """What :func:`run_gpu_fidelity` measured and simulated.

    Attributes:
        device: the device and its topology.
        models: the models, in order.
        precisions: the precisions, in order.
        zoo_batches: each model's zoo batch (the others measured are its shard batches).
        plain: ``iterations.jsonl`` and ``iterations_shard_batches.jsonl`` lines, in order (a failed
            measurement: ``model``, ``mode``, ``precision``, ``batch``, ``error``).
        executor: ``executor_single_device.jsonl`` lines, ``status`` ``ok`` (a failed run: ``model``, ``plan``,
            ``batch`` and the error as ``status``).
        simulated: ``simulated.jsonl`` lines: per model, batch and precision, the plain iteration and the
            single-device plan simulated analytically and with the profile (milliseconds, errors
            ``simulated / measured - 1``).
        profiles: the profiles by precision.
        failures: one line per step that failed (the run goes on).
        settings: the counts the run used.
        wall_s: the run's wall-clock time.
    """

    device: MeasuredDevice
    models: list[str]
    precisions: list[str]
    zoo_batches: dict[str, int] = field(default_factory=dict)
    plain: list[dict[str, Any]] = field(default_factory=list)
    executor: list[dict[str, Any]] = field(default_factory=list)
    simulated: list[dict[str, Any]] = field(default_factory=list)
    profiles: dict[str, ProfileTable] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def plain_ms(self, model: str, precision: str, batch: int) -> float | None:
        """The plain iteration's median, or ``None`` when it was not measured."""
        for row in self.plain:
            if (row["model"], row["precision"], row["batch"]) == (model, precision, batch) and "error" not in row:
                return float(row["iteration_ms"])
        return None

    def summary(self) -> dict[str, Any]:
        """``summary.json``: per precision, at the zoo batch and at the shard batches, the median and worst
        ``|simulated / measured - 1|`` of the analytic and the profiled simulation; the executor's overhead
        over the plain iteration and its own simulated and replayed errors; the failures."""
        errors: dict[str, Any] = {}
        for precision in self.precisions:
            per: dict[str, Any] = {}
            for where, full in (("zoo_batch", True), ("shard_batches", False)):
                rows = [r for r in self.simulated if r["precision"] == precision and r["zoo_batch"] == full]
                per[where] = {cost: _errors(rows, f"{cost}_error") for cost in ("analytic", "profiled")}
            errors[precision] = per
        ran = [r for r in self.executor if r["status"] == "ok"]
        overheads = [r["overhead"] for r in ran if r.get("overhead") is not None]
        executor = {
            "models": len(self.executor),
            "ran": len(ran),
            "overhead_median": statistics.median(overheads) if overheads else None,
            "overhead_min": min(overheads) if overheads else None,
            "overhead_max": max(overheads) if overheads else None,
            "simulated": _errors(ran, "error"),
            "replayed": _errors(ran, "replay_error"),
        }
        return {
            "format": SUMMARY_FORMAT,
            "schema_version": 1,
            "device": self.device.to_dict(),
            "models": self.models,
            "precisions": self.precisions,
            **self.settings,
            "errors": errors,
            "executor": executor,
            "failures": self.failures,
            "wall_s": self.wall_s,
        }

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Headers and cells: per model and batch, the plain iterations, the simulations (with their
        errors) and, at the zoo batch, the executor and its overhead over the plain fp32 iteration."""
        headers = ["model", "batch"]
        for p in self.precisions:
            headers += [f"{p} ms", f"{p} analytic ms", f"{p} profiled ms"]
        headers += ["executor ms", "executor / plain"]
        sims = {(r["model"], r["batch"], r["precision"]): r for r in self.simulated}
        executed = {r["model"]: r for r in self.executor}
        cells = []
        for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in [*self.plain, *self.simulated]):
            row = [model, str(batch)]
            for p in self.precisions:
                sim = sims.get((model, batch, p), {})
                row += [_ms(self.plain_ms(model, p, batch))]
                row += [_with_error(sim.get(f"{c}_ms"), sim.get(f"{c}_error")) for c in ("analytic", "profiled")]
            run = executed.get(model, {})
            if batch == self.zoo_batches.get(model) and run:
                if run["status"] != "ok":
                    row += [run["status"][:40], "-"]
                else:
                    overhead = run.get("overhead")
                    row += [_ms(run["measured_ms"]), "-" if overhead is None else f"{overhead:.2f}x"]
            else:
                row += ["-", "-"]
            cells.append(row)
        return headers, cells

    def lines(self) -> list[str]:
        """``table.md``: a heading line, the Markdown table and the summary in words."""
        d = self.device
        s = self.summary()
        headers, cells = self.table()
        out = [
            f"{d.name} ({d.device_type}, topology {d.topology.name}); plain iterations, simulations of the "
            f"single-device plan (analytic and profiled; error = simulated / measured - 1) and the executor",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(c) + " |" for c in cells),
            "",
        ]
        for p, per in s["errors"].items():
            for where, label in (("zoo_batch", "zoo batch"), ("shard_batches", "shard batches")):
                parts = []
                for cost in ("analytic", "profiled"):
                    e = per[where][cost]
                    if e["count"]:
                        parts.append(
                            f"{cost} median |error| {e['median_abs_error']:.0%} (worst {e['worst_abs_error']:.0%}, "
                            f"{e['worst_model']})"
                        )
                if parts:
                    out.append(f"- {p}, {label}: " + "; ".join(parts))
        ex = s["executor"]
        if ex["overhead_median"] is not None:
            out.append(
                f"- executor / plain fp32 iteration: median {ex['overhead_median']:.2f}x ({ex['overhead_min']:.2f}x "
                f"to {ex['overhead_max']:.2f}x) over {ex['ran']} of {ex['models']} models"
            )
        for label, key in (("simulated", "simulated"), ("replayed", "replayed")):
            e = ex[key]
            if e["count"]:
                out.append(
                    f"- executor, {label} vs measured: median |error| {e['median_abs_error']:.0%} "
                    f"(worst {e['worst_abs_error']:.0%}, {e['worst_model']})"
                )
        out += [f"- failed: {f}" for f in s["failures"]]
        out.append(f"- {s['wall_s']:.0f} s in all")
        return out


def _errors(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    values = [(abs(r[key]), r["model"]) for r in rows if r.get(key) is not None]
    if not values:
        return {"count": 0, "median_abs_error": None, "worst_abs_error": None, "worst_model": None}
    worst = max(values)
    return {
        "count": len(values),
        "median_abs_error": statistics.median(v for v, _ in values),
        "worst_abs_error": worst[0],
        "worst_model": worst[1],
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _with_error(value: float | None, error: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f} ({error:+.0%})" if error is not None else f"{value:,.2f}"


# ------------------------------------------------------------------------------------------- the steps
def batches_of(batch: int, splits: Sequence[int]) -> list[int]:
    """``batch // k`` for every split ``k`` that divides ``batch`` (ascending ``k``: the zoo batch first)."""
    return [batch // k for k in sorted(set(splits)) if batch % k == 0]


@contextlib.contextmanager
def _profile_precision(precision: str, device: str) -> Iterator[dict[str, Any]]:
    """The keyword that asks :func:`profile_models` for ``precision``, when it takes one; else the
    precision's math and autocast around the whole call (as ``benchmarks/data/h200/profile_bf16.py`` did)."""
    import torch

    from placement_rl.profiling import profile_models

    if "precision" in inspect.signature(profile_models).parameters:
        yield {"precision": precision}
        return
    with math_mode(precision), autocast(precision, torch.device(device)):
        yield {}


def profile_precision_mode() -> str:
    """How the profiles are taken in each precision (recorded in ``summary.json``)."""
    from placement_rl.profiling import profile_models

    if "precision" in inspect.signature(profile_models).parameters:
        return "profile_models(precision=...)"
    return "profile_models under the precision's autocast and TF32 settings"


def profile_all(
    models: Sequence[str],
    precision: str,
    measured: MeasuredDevice,
    *,
    splits: Sequence[int],
    batch_size: int | None,
    repeats: int,
    options: Mapping[str, Mapping[str, Any]],
    failures: list[str],
    log: Callable[[str], None] = lambda _line: None,
) -> ProfileTable:
    """Every model profiled in ``precision`` at its batch and the splits that divide it, one model at a
    time (a model that fails is a line of ``failures``); the first measurement of a key wins."""
    from placement_rl import zoo
    from placement_rl.profiling import profile_models

    tables: list[ProfileTable] = []
    for model in models:
        batch = zoo.check(model, batch_size, dict(options.get(model, {})))[1]
        ks = [k for k in sorted(set(splits)) if batch % k == 0]
        log(f"  profiling {model} in {precision} at batches {[batch // k for k in ks]}")
        try:
            with _profile_precision(precision, measured.torch_device) as extra:
                tables.append(
                    profile_models(
                        [model],
                        batch_size=batch,
                        batch_splits=ks,
                        device=measured.torch_device,
                        device_type=measured.device_type,
                        repeats=repeats,
                        progress=False,
                        options={model: dict(options[model])} if model in options else None,
                        **extra,
                    )
                )
        except (RuntimeError, ValueError) as exc:  # an out-of-memory error among them
            failures.append(f"profile {model} {precision}: {_first_line(exc)}")
            _free(measured)
    entries: dict[Any, ProfileEntry] = {}
    for table in tables:
        for key, entry in table.entries.items():
            entries.setdefault(key, entry)
    if not tables:
        return ProfileTable({}, measured.device_type)
    return dataclasses.replace(tables[0], entries=entries)


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` while open (``None``: left alone)."""
    if count is None:
        yield
        return
    from placement_rl.execute.fidelity import _threads as threads

    with threads(count):
        yield


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _free(measured: MeasuredDevice) -> None:
    if measured.cuda:
        import torch

        torch.cuda.empty_cache()


def _cost_model(precision: str, profile: ProfileTable | None = None) -> CostModel:
    """The cost model of the comparison: plain SGD (no optimizer state), ``precision``, ``profile``."""
    return CostModel(optimizer="sgd", precision=precision, profile=profile)


def run_executor(
    graphs: Mapping[str, OpGraph],
    sources: Mapping[str, ModelSource],
    measured: MeasuredDevice,
    options: RunOptions,
    failures: list[str],
) -> dict[str, tuple[Plan, Program, list[WorkerResult]] | str]:
    """Each model's single-device plan lowered (analytic fp32 cost model) and run, all on one start-up of
    the worker (each model alone when that fails, so that the failure is the model's): model ->
    ``(plan, program, results)`` or the error's line."""
    topology = measured.topology
    jobs: dict[str, tuple[Plan, Program]] = {}
    out: dict[str, tuple[Plan, Program, list[WorkerResult]] | str] = {}
    for model, graph in graphs.items():
        try:
            plan = constructors.single_device(graph, topology)
            jobs[model] = (plan, lower(graph, topology, plan, _cost_model("fp32")))
        except (ValueError, NotExecutableError) as exc:
            out[model] = _first_line(exc)
            failures.append(f"executor {model}: {out[model]}")
    names = list(jobs)
    try:
        batch = run_local_jobs([(jobs[m][1], graphs[m], sources[m]) for m in names], options) if names else []
        results: dict[str, list[WorkerResult] | str] = dict(zip(names, batch, strict=True))
    except ExecutionError:  # run each alone, to tell which failed
        results = {}
        for m in names:
            try:
                results[m] = run_local_jobs([(jobs[m][1], graphs[m], sources[m])], options)[0]
            except ExecutionError as exc:
                results[m] = _first_line(exc)
    for m in names:
        got = results[m]
        if isinstance(got, str):
            failures.append(f"executor {m}: {got}")
            out[m] = got
        else:
            out[m] = (jobs[m][0], jobs[m][1], got)
    return {m: out[m] for m in graphs}


def measure_plain(
    report: GpuFidelityReport,
    model: str,
    batches: Sequence[int],
    iterations: int,
    warmup: int,
    options: Mapping[str, Any] | None,
) -> None:
    """The plain iterations of ``model`` at ``batches`` in every precision, appended to ``report.plain``
    (a failure, out of memory or a model that does not build, as error lines and a line of ``failures``)."""
    measured = report.device
    try:
        rows = measure_plain_iterations(
            model,
            batches,
            report.precisions,
            device=measured.torch_device,
            iterations=iterations,
            warmup=warmup,
            options=options,
        )
        report.plain += [r.to_dict() for r in rows]
    except (RuntimeError, ValueError) as exc:
        error = _first_line(exc)
        report.plain += [
            {"model": model, "mode": MODES[p], "precision": p, "batch": b, "error": error}
            for b in batches
            for p in report.precisions
        ]
        report.failures.append(f"plain {model} batches {list(batches)}: {error}")
    _free(measured)


def executor_row(
    report: GpuFidelityReport,
    graph: OpGraph,
    plan: Plan,
    program: Program,
    results: list[WorkerResult],
    options: RunOptions,
) -> dict[str, Any]:
    """One line of ``executor_single_device.jsonl``: :meth:`ExecutionReport.to_dict` with the topology, the
    batch, the replay's error, the plain fp32 iteration at the batch and the overhead over it (the ratio)."""
    executed = report_results(graph, report.device.topology, plan, program, results, options, _cost_model("fp32"))
    row = executed.to_dict()
    model = row["model"]
    batch = report.zoo_batches[model]
    plain = report.plain_ms(model, "fp32", batch)
    measured = executed.measured_s
    row.update(
        status="ok",
        topology=report.device.topology.name,
        batch=batch,
        replay_error=(executed.replayed_s - measured) / measured if measured > 0 else None,
        plain_iteration_ms=plain,
        overhead=row["measured_ms"] / plain if plain else None,
    )
    return row


# ------------------------------------------------------------------------------------------- the run
def run_gpu_fidelity(
    models: Sequence[str] = DEFAULT_GPU_MODELS,
    *,
    out_dir: str | Path | None = None,
    device_type: str | None = None,
    precisions: Sequence[str] = DEFAULT_PRECISIONS,
    splits: Sequence[int] = DEFAULT_SPLITS,
    iterations: int = 10,
    warmup: int = 3,
    profile_repeats: int = 5,
    batch_size: int | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    log: Callable[[str], None] | None = None,
    device: str = "cuda",
) -> GpuFidelityReport:
    """Measure one GPU and simulate what was measured (module docstring); the defaults are budgeted
    for under 10 minutes on an H100 or H200 (estimated from benchmarks/data/h200, not yet timed).

    Args:
        models: zoo model names.
        out_dir: where the files go (created; none written for ``None``).
        device_type: the GPU's catalogue name (default: matched from its name).
        precisions: keys of :data:`placement_rl.execute.plain.MODES`; ``fp32`` is needed for the
            executor's overhead.
        splits: batch splits; each that divides a model's batch is measured (1: the zoo batch).
        iterations: measured steps of each plain measurement at the zoo batch and of the executor, after
            ``warmup`` unmeasured ones; at the shard batches half as many, after at most 2.
        profile_repeats: timed runs per op of the profiles.
        batch_size: every model's zoo batch (default each model's own).
        options: per-model zoo options.
        log: receives progress lines.
        device: ``cuda`` (the GPU) or ``cpu`` (the same pipeline on the CPU, for tests).

    Raises:
        NoGpuError: no CUDA GPU (``device="cuda"``).
        ValueError, UnknownNameError: bad models, options, precisions, splits or device type, before
            anything is measured.
    """

    from placement_rl import zoo

    started = time.perf_counter()
    say = log or (lambda _line: None)
    opts = {m: dict(o) for m, o in (options or {}).items()}
    if not models:
        raise ValueError("models is empty; expected zoo model names")
    for name in opts:
        if name not in models:
            raise ValueError(f"options given for model {name!r}, not in models {list(models)}")
    zoo_batch = {m: zoo.check(m, batch_size, opts.get(m, {}))[1] for m in models}
    for p in precisions:
        if p not in MODES:
            raise ValueError(f"precision {p!r}; expected some of {list(MODES)}")
    if not precisions:
        raise ValueError("precisions is empty; expected some of " + ", ".join(MODES))
    if not splits or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in splits):
        raise ValueError(f"splits = {list(splits)!r}; expected positive integers such as 1,2,4,8")
    measured = resolve_device(device, device_type)
    folder = Path(out_dir) if out_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        measured.topology.to_json(folder / f"topology_{measured.topology.name}.json")
    report = GpuFidelityReport(measured, list(models), list(precisions), dict(zoo_batch))
    report.settings = {
        "splits": sorted(set(splits)),
        "iterations": iterations,
        "warmup": warmup,
        "shard_iterations": max(1, iterations // 2),
        "shard_warmup": min(warmup, 2),
        "profile_repeats": profile_repeats,
        "executor_backend": "nccl" if measured.cuda else "gloo",
        "profile_precision": profile_precision_mode(),
        "execution_mode": getattr(_cost_model("fp32"), "execution_mode", None),  # of the simulations
    }
    steps = 2 * len(models) + len(precisions) + 1
    done = 0

    def step(text: str) -> None:  # a progress line; the files so far (an interrupted run keeps them)
        nonlocal done
        done += 1
        report.wall_s = time.perf_counter() - started
        say(f"[{done}/{steps}] {text} ({report.wall_s:.0f} s)")
        if folder is not None:
            write_outputs(report, folder)

    with _threads(1 if not measured.cuda else None):  # on the CPU, one thread as the executor's workers
        say(
            f"measuring {measured.name} as {measured.device_type} ({measured.torch_device}); "
            f"{len(models)} models, precisions {', '.join(precisions)}, batch splits {report.settings['splits']}"
        )
        # 1. plain iterations: the zoo batch, then the shard batches (fewer steps)
        for model in models:
            full, *shards = batches_of(zoo_batch[model], splits)
            measure_plain(report, model, [full], iterations, warmup, opts.get(model))
            if shards:
                measure_plain(report, model, shards, max(1, iterations // 2), min(warmup, 2), opts.get(model))
            got = ", ".join(
                f"{r['batch']} {r['mode']} {r['iteration_ms']:.1f} ms"
                for r in report.plain
                if r["model"] == model and "error" not in r
            )
            step(f"plain {model}: {got or 'failed'}")
        # 2. profiles
        for precision in precisions:
            table = profile_all(
                models,
                precision,
                measured,
                splits=splits,
                batch_size=batch_size,
                repeats=profile_repeats,
                options=opts,
                failures=report.failures,
                log=say,
            )
            report.profiles[precision] = table
            step(f"profiled {len(table)} op shapes in {precision}")
        # 3. the executor, on the graphs simulated at the zoo batch
        sources = {m: ModelSource(m, zoo_batch[m], tuple(sorted(opts.get(m, {}).items()))) for m in models}
        graphs: dict[tuple[str, int], OpGraph] = {}
        for m in models:
            try:
                graphs[(m, zoo_batch[m])] = sources[m].graph()
            except (RuntimeError, ValueError) as exc:
                report.failures.append(f"graph {m}: {_first_line(exc)}")
        _free(measured)
        run_options = RunOptions(iterations=iterations, warmup=warmup, backend="nccl" if measured.cuda else "gloo")
        executable = {m: graphs[(m, zoo_batch[m])] for m in models if (m, zoo_batch[m]) in graphs}
        say(f"  running the executor on {len(executable)} single-device plans ({run_options.backend})")
        for m, value in run_executor(executable, sources, measured, run_options, report.failures).items():
            if isinstance(value, str):
                report.executor.append({"model": m, "plan": "single_device", "batch": zoo_batch[m], "status": value})
            else:
                plan, program, results = value
                report.executor.append(executor_row(report, executable[m], plan, program, results, run_options))
        step(f"executor: {sum(r['status'] == 'ok' for r in report.executor)} of {len(models)} models ran")
        # 4. simulations
        for model in models:
            for b in batches_of(zoo_batch[model], splits):
                try:
                    graph = graphs.get((model, b)) or ModelSource(model, b, sources[model].options).graph()
                except (RuntimeError, ValueError) as exc:
                    report.failures.append(f"graph {model} batch {b}: {_first_line(exc)}")
                    continue
                plan = constructors.single_device(graph, measured.topology)
                report.simulated += [simulate_row(report, graph, plan, model, b, p) for p in precisions]
            for row in report.executor:  # the executor's plan simulated with the fp32 profile, next to its analytic one
                if row["model"] == model and row["status"] == "ok":
                    sims = [
                        s
                        for s in report.simulated
                        if (s["model"], s["batch"], s["precision"]) == (model, row["batch"], "fp32")
                    ]
                    row["profiled_ms"] = sims[0]["profiled_ms"] if sims else None
            step(f"simulated {model}")
    return report


def simulate_row(
    report: GpuFidelityReport, graph: OpGraph, plan: Plan, model: str, batch: int, precision: str
) -> dict[str, Any]:
    """One line of ``simulated.jsonl``: ``plan`` simulated analytically and with the ``precision`` profile,
    against the plain iteration measured at ``batch`` in ``precision``."""
    from placement_rl.sim import simulate

    measured = report.plain_ms(model, precision, batch)
    row: dict[str, Any] = {
        "model": model,
        "batch": batch,
        "zoo_batch": batch == report.zoo_batches[model],
        "precision": precision,
        "mode": MODES[precision],
        "measured_ms": measured,
    }
    profile = report.profiles.get(precision)
    for cost, table in (("analytic", None), ("profiled", profile if profile is not None and len(profile) else None)):
        if cost == "profiled" and table is None:
            row.update({f"{cost}_ms": None, f"{cost}_error": None})
            continue
        try:
            result = simulate(graph, report.device.topology, plan, _cost_model(precision, table))
        except ValueError as exc:  # a precision the device has no peak for
            row.update({f"{cost}_ms": None, f"{cost}_error": None, f"{cost}_status": _first_line(exc)})
            continue
        simulated = result.makespan_s * 1e3
        row[f"{cost}_ms"] = simulated
        row[f"{cost}_error"] = simulated / measured - 1 if measured else None
        if result.oom:
            row[f"{cost}_status"] = "does not fit in the device's memory"
    return row


def write_outputs(report: GpuFidelityReport, folder: Path) -> list[Path]:
    """Every file of the run into ``folder`` (module docstring); the paths written."""
    full = [r for r in report.plain if r["batch"] == report.zoo_batches[r["model"]]]
    shards = [r for r in report.plain if r["batch"] != report.zoo_batches[r["model"]]]
    written = []

    def jsonl(name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        path = folder / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        written.append(path)

    jsonl("iterations.jsonl", full)
    jsonl("iterations_shard_batches.jsonl", shards)
    jsonl("executor_single_device.jsonl", report.executor)
    jsonl("simulated.jsonl", report.simulated)
    for precision, table in report.profiles.items():
        path = folder / f"profile_{precision}.json"
        table.to_json(path)
        written.append(path)
    path = folder / "summary.json"
    path.write_text(json.dumps(report.summary(), indent=1) + "\n")
    written.append(path)
    path = folder / "table.md"
    path.write_text("\n".join(report.lines()) + "\n")
    written.append(path)
    return written
