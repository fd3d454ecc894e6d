"""Simulator fidelity, measured: plans executed on CPU workers against the simulator's prediction.

:func:`run_fidelity` puts the simulator in the workers' conditions and then compares:

1. **Ops**: every model is profiled on this machine with one thread
   (:func:`~placement_rl.profiling.profile_models`, device type :data:`CPU_DEVICE_TYPE`) at its full batch
   and at the batch of a ``W``-way sample split, the shapes the plans run.
2. **Links**: two workers bounce messages of several sizes (:meth:`ProcessLauncher.ping_pong`: over
   loopback, or through the shaped veths of the emulated cluster) and :func:`fit_link` fits
   ``one_way_s = latency_s + bytes / bandwidth``; every worker all-reduces messages of the same sizes
   and :func:`all_reduce_table` turns their times into the cost model's comm table.
3. **Topology** (:func:`cpu_cluster`): ``W`` CPU devices (this machine's memory; the peak FLOP/s and
   memory bandwidth of a one-thread measurement, used only for ops without a profile entry) on machine
   switches joined by links of the measured bandwidth and latency.
4. **Cases**: each ``(model, plan)`` is lowered with the profiled cost model (its simulation is the
   prediction), executed (:func:`placement_rl.execute.execute`, ``threads=1``) by ``nsworker`` processes
   and replayed with the measured compute times (what the replay still gets wrong is the network and
   overlap model's). Each row is appended to ``results.jsonl`` as soon as it is measured.

Clusters (``cluster`` argument): ``local`` (processes on this machine, loopback) or ``emulated:MxG@NIC``
(``M`` machines of ``G`` workers in network namespaces, each machine's NIC shaped to ``NIC`` Gbit/s and
its internal links to :data:`INTRA_PER_NIC` times that; needs root, ``ip`` and ``tc``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from placement_rl.emulate.cluster import MAX_DEVICES
from placement_rl.execute import ExecutionReport, RunOptions, execute
from placement_rl.execute.local import check_local_workers
from placement_rl.execute.lower import lower
from placement_rl.execute.processes import ProcessLauncher, local_spawner
from placement_rl.execute.report import measured_compute_s
from placement_rl.execute.runtime import ModelSource
from placement_rl.graph import OpGraph
from placement_rl.plan import constructors
from placement_rl.profiling import UNMEASURED_OPS, profile_models
from placement_rl.sim.cost import CommTable, CostModel, ProfileEntry, ProfileTable
from placement_rl.topology import DeviceTopology, Link
from placement_rl.topology.core import Device

#: The device type of the CPU workers (the profile's label and the topology's devices').
CPU_DEVICE_TYPE = "CPU"

#: Emulated clusters: bandwidth of a device's link to its machine switch per NIC bandwidth.
INTRA_PER_NIC = 8.0

#: Message sizes of the link measurement (bytes).
PING_SIZES: tuple[int, ...] = (4 * 2**10, 64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)

#: Plan constructors of :mod:`placement_rl.plan.constructors` a case may name.
PLANS: tuple[str, ...] = ("single_device", "data_parallel", "data_parallel_per_tensor", "layerwise", "expert")

#: The keys of every row of ``results.jsonl``.
ROW_KEYS: tuple[str, ...] = (
    "cluster",
    "case",
    "model",
    "batch_size",
    "plan",
    "workers",  # the devices the plan uses
    "status",
    "measured_ms",
    "simulated_ms",
    "profile_only_ms",  # simulated with the profile alone (no executor overheads, see Overheads)
    "replayed_ms",
    "error",
    "replay_error",
    "iteration_ms",
    "measured_compute_ms",
    "simulated_compute_ms",
    "overhead_ms",  # per rank, the median time outside its compute spans
    "sent_bytes",
    "simulated_sent_bytes",
    "tasks_ms",  # [[task, measured ms, simulated ms], ...]: the TOP_TASKS compute tasks that differ most
    "wall_s",
)

#: How many compute tasks a row lists (those whose measured and simulated times differ most).
TOP_TASKS = 6


@dataclass(frozen=True)
class FidelityCase:
    """One model at one batch size under one plan constructor.

    Attributes:
        model: zoo model name.
        batch_size: global batch (divisible by the number of workers).
        plan: a name of :data:`PLANS`.
        options: zoo architecture options.
    """

    model: str
    batch_size: int
    plan: str
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ValueError(f"case {self.model}: plan {self.plan!r}; expected one of {list(PLANS)}")

    @property
    def source(self) -> ModelSource:
        return ModelSource(self.model, self.batch_size, self.options)

    @property
    def name(self) -> str:
        return f"{self.model}/{self.plan}"


_RNNLM = (("steps", 4), ("hidden", 128), ("num_layers", 2), ("vocab_size", 1000))
_RNNTC = (("steps", 4), ("hidden", 256), ("num_layers", 2), ("vocab_size", 1000))
_BASIC = ("single_device", "data_parallel", "layerwise", "expert")

#: The default cases: 12 plans over 3 small models (a few minutes in all). The zoo's attention models
#: (transformer, llama) do not execute yet: a ``reshape`` reads a size from an op the graph does not give it.
DEFAULT_CASES: tuple[FidelityCase, ...] = (
    *(FidelityCase("lenet", 64, p) for p in _BASIC),
    *(FidelityCase("rnnlm", 16, p, _RNNLM) for p in _BASIC),
    *(FidelityCase("rnntc", 16, p, _RNNTC) for p in _BASIC),
)


# ------------------------------------------------------------------------------------------ the link
@dataclass(frozen=True)
class LinkFit:
    """A link fitted to one-way message times: ``one_way_s = latency_s + bytes / bandwidth_bytes_per_s``.

    Attributes:
        latency_s: the fit's intercept (>= 0).
        bandwidth_bytes_per_s: the inverse of its slope.
        samples: ``(bytes, one-way seconds)`` measured.
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    samples: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_s": self.latency_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "samples": [list(s) for s in self.samples],
        }


def select_cases(names: Sequence[str] | None) -> list[FidelityCase]:
    """The default cases named ``model/plan`` in ``names`` (all of them for ``None`` or empty).

    Raises:
        ValueError: naming the unknown cases and listing the defaults.
    """
    cases = list(DEFAULT_CASES)
    if not names:
        return cases
    unknown = sorted(set(names) - {c.name for c in cases})
    if unknown:
        raise ValueError(f"unknown cases {unknown}; expected some of {[c.name for c in cases]}")
    return [c for c in cases if c.name in names]


def fit_link(samples: Sequence[tuple[float, float]]) -> LinkFit:
    """Fit ``latency + bytes / bandwidth`` to the per-size medians of ``samples``: the bandwidth is the
    least-squares slope over the larger half of the sizes (at least two; one more size, then every size,
    when a noisy measurement makes that slope not positive), the latency what remains of the
    smallest message's time. Small and middle-sized messages would bias the slope: a shaped link lets a
    burst of its token bucket through at once (:func:`placement_rl.emulate.cluster.shaping_commands`).

    Raises:
        ValueError: for fewer than two sizes, or times that do not grow with the size.
    """
    by_size: dict[float, list[float]] = {}
    for size, t in samples:
        by_size.setdefault(size, []).append(t)
    if len(by_size) < 2:
        raise ValueError(f"fit_link: need messages of at least two sizes, got {sorted(by_size)}")
    sizes = np.array(sorted(by_size))
    times = np.array([statistics.median(by_size[s]) for s in sizes])
    slope = 0.0
    for large in (max(2, len(sizes) // 2), len(sizes) // 2 + 1, len(sizes)):  # widened when noise bends it
        slope, _ = np.polyfit(sizes[-large:], times[-large:], 1)
        if slope > 0:
            break
    if not slope > 0:
        raise ValueError(f"fit_link: message times do not grow with size ({dict(zip(sizes, times, strict=True))})")
    latency = max(0.0, float(times[0] - sizes[0] * slope))
    return LinkFit(latency, float(1.0 / slope), tuple((float(s), float(t)) for s, t in samples))


def _medians(samples: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    by_size: dict[float, list[float]] = {}
    for size, t in samples:
        by_size.setdefault(size, []).append(t)
    return [(size, statistics.median(ts)) for size, ts in sorted(by_size.items())]


def all_reduce_table(samples: Sequence[tuple[float, float]], workers: int, latency_s: float, kind: str) -> CommTable:
    """The comm table of measured all-reduces: ``all_reduce/<kind>`` bandwidths such that the simulator's
    ring, ``2 (n - 1) (latency + S / n / bandwidth)``, takes the measured median time at each size (gloo's
    all-reduce has a fixed cost of about a millisecond on this machine that the link's latency does not
    explain)."""
    n = workers
    curve = []
    for size, t in _medians(samples):
        per_step = t / (2 * (n - 1)) - latency_s
        curve.append((size, (size / n) / max(per_step, 1e-7)))  # at least 0.1 us per ring step
    return CommTable({f"all_reduce/{kind}": curve})


# -------------------------------------------------------------------------------------- the devices
def measure_cpu(threads: int = 1, repeats: int = 5) -> tuple[float, float]:
    """``(peak_flops, memory_bandwidth_bytes_per_s)`` of this CPU with ``threads`` threads: a 512 x 512 matmul
    and a 64 MiB copy (best of ``repeats``)."""
    import torch

    with _threads(threads):
        a = torch.randn(512, 512)
        src, dst = torch.empty(16 * 2**20), torch.empty(16 * 2**20)
        mm, cp = math.inf, math.inf
        for _ in range(repeats + 1):
            t = time.perf_counter()
            torch.mm(a, a)
            mm = min(mm, time.perf_counter() - t)
            t = time.perf_counter()
            dst.copy_(src)
            cp = min(cp, time.perf_counter() - t)
    return 2 * 512**3 / mm, 2 * src.numel() * 4 / cp


def memory_bytes() -> int:
    """This machine's physical memory."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_cluster(
    machines: int,
    per_machine: int,
    *,
    intra_bytes_per_s: float,
    intra_latency_s: float = 0.0,
    nic_bytes_per_s: float | None = None,
    nic_latency_s: float = 0.0,
    peak_flops: float = 50e9,
    memory_bandwidth_bytes_per_s: float = 10e9,
    name: str = "cpu",
) -> DeviceTopology:
    """``machines`` x ``per_machine`` CPU workers in the emulator's shape.

    Device ``m<i>/cpu<j>`` joins its machine's switch ``m<i>/switch`` by a link of ``intra_bytes_per_s``;
    with more than one machine each switch joins ``core`` by a NIC of ``nic_bytes_per_s``. A route between
    machines crosses two device links and two NICs, within one machine two device links.
    """
    if machines < 1 or per_machine < 1:
        raise ValueError(f"cpu cluster {machines}x{per_machine}: expected at least one machine and one worker")
    if machines > 1 and nic_bytes_per_s is None:
        raise ValueError("cpu cluster: several machines need nic_bytes_per_s")
    devices, links, switches = [], [], []
    for m in range(machines):
        switch = f"m{m}/switch"
        switches.append(switch)
        for j in range(per_machine):
            device = Device(
                f"m{m}/cpu{j}", CPU_DEVICE_TYPE, f"m{m}", peak_flops, memory_bytes(), memory_bandwidth_bytes_per_s
            )
            devices.append(device)
            links.append(Link(device.name, switch, intra_bytes_per_s, intra_latency_s, "pcie"))
        if machines > 1:
            assert nic_bytes_per_s is not None
            links.append(Link(switch, "core", nic_bytes_per_s, nic_latency_s, "ethernet"))
    if machines > 1:
        switches.append("core")
    return DeviceTopology(name, devices, links, switches)


def parse_cluster(spec: str) -> tuple[str, int, int, float]:
    """``local`` or ``emulated:MxG@NIC`` -> ``(kind, machines, per_machine, nic_gbit)`` (``local``: 0, 0, 0).

    Raises:
        ValueError: naming the expected forms, or more than the emulator's
            :data:`~placement_rl.emulate.cluster.MAX_DEVICES` workers.
    """
    if spec == "local":
        return "local", 0, 0, 0.0
    kind, _, shape = spec.partition(":")
    head, _, nic = shape.partition("@")
    machines, x, gpus = head.partition("x")
    try:
        if kind != "emulated" or not x:
            raise ValueError
        m, g, gbit = int(machines), int(gpus), float(nic) if nic else 1.0
        if m < 1 or g < 1 or not 0 < gbit < math.inf:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"cluster {spec!r}: expected 'local' or 'emulated:MxG@NIC' (M machines of G workers, NIC Gbit/s, "
            "e.g. emulated:2x1@1)"
        ) from None
    if m * g > MAX_DEVICES:
        raise ValueError(
            f"cluster {spec!r}: {m * g:,} workers; the emulator runs one process per device on this machine and "
            f"takes at most {MAX_DEVICES}"
        )
    return "emulated", m, g, gbit


# ------------------------------------------------------------------------------------- the profile
@contextlib.contextmanager
def realtime(priority: int) -> Iterator[bool]:
    """Run the calling thread at ``SCHED_RR`` ``priority`` while open (0: leave it); yields whether it does.
    The profile then sees what the workers see (they run at the same priority)."""
    if priority <= 0:
        yield False
        return
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
    except (OSError, AttributeError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, before[0], before[1])


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def profile_cases(cases: Sequence[FidelityCase], workers: int, repeats: int = 5) -> ProfileTable:
    """Every distinct model of ``cases`` profiled with one thread at its batch and its ``workers``-way
    sample split (where that divides it), under :data:`CPU_DEVICE_TYPE`; the first measurement of a key wins."""
    entries: dict[Any, ProfileEntry] = {}
    device = ""
    seen: set[tuple[str, int, tuple[tuple[str, Any], ...]]] = set()
    with _threads(1):
        for case in cases:
            key = (case.model, case.batch_size, case.options)
            if key in seen:
                continue
            seen.add(key)
            splits = (1, workers) if workers > 1 and case.batch_size % workers == 0 else (1,)
            table = profile_models(
                [case.model],
                batch_size=case.batch_size,
                batch_splits=splits,
                device="cpu",
                device_type=CPU_DEVICE_TYPE,
                repeats=repeats,
                progress=False,
                options={case.model: dict(case.options)} if case.options else None,
            )
            device = table.device
            for k, v in table.entries.items():
                entries.setdefault(k, v)
    return ProfileTable(entries, device, timing="wall")


# ----------------------------------------------------------------------------------- the overheads
@dataclass(frozen=True)
class Overheads:
    """What the executor spends per compute task beyond the op's own time (seconds): calling the op's fx
    node on its own autograd island, assembling its inputs, handing its gradients on, the bookkeeping.
    A profile measures the op alone (:mod:`placement_rl.profiling`), so :func:`with_overheads` adds these.

    Attributes:
        forward_s: per forward task of an op the profile measures (one with work).
        backward_s: per backward task of such an op.
        view_forward_s: per forward task of an op no profile measures (inputs and views), its whole time.
        view_backward_s: per backward task of such an op.
    """

    forward_s: float
    backward_s: float
    view_forward_s: float = 0.0
    view_backward_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


#: The calibration run of :func:`calibrate_overheads`: a tiny batch, so the executor's own costs dominate.
CALIBRATION = FidelityCase("lenet", 8, "single_device")


def calibrate_overheads(
    launcher: ProcessLauncher,
    topology: DeviceTopology,
    *,
    iterations: int = 5,
    profile_repeats: int = 5,
    realtime_priority: int = 10,
) -> Overheads:
    """Measure :class:`Overheads` on :data:`CALIBRATION` (profiled, then executed on one worker of ``topology``).

    Ops no profile measures (inputs, views): the median measured forward and backward task. Ops it
    measures: the median over their tasks of the measured minus the profiled time, plus half of what an
    iteration spends outside compute tasks (assembling inputs and gradients, the update), per such task.
    """
    case = CALIBRATION
    with realtime(realtime_priority):
        profile = profile_cases([case], 1, profile_repeats)
    cost_model = CostModel(profile=profile, calibration=None)  # CPU workers: measured op times, no host lane
    graph = case.source.graph()
    plan = constructors.single_device(graph, topology)
    options = RunOptions(iterations=iterations, warmup=1, threads=1)
    report = execute(
        case.source,
        topology,
        plan,
        graph=graph,
        options=options,
        cost_model=cost_model,
        launcher=launcher.bind(topology, plan, cost_model),
    )
    fwd, bwd = measured_compute_s(report.program, report.results, options.warmup)
    table = report.program.simulated.tasks
    F = len(fwd)
    simulated = (table.end_s - table.start_s)[: 2 * F]
    op_type = {op.name: op.op_type for op in graph.ops}
    node_of = report.program.node_of
    unmeasured = np.array([op_type[node_of.get(op, op)] in UNMEASURED_OPS for op, _ in report.program.task_order])
    (rank,) = [r for r in report.results if any(it.events for it in r.iterations)][:1]
    outside = statistics.median(
        it.time_s - sum(e.end_s - e.start_s for e in it.events if e.kind.startswith("compute_"))
        for it in rank.iterations[options.warmup :]
    )
    measured = ~unmeasured
    per_task = outside / (2 * max(1, int(measured.sum())))
    return Overheads(
        max(0.0, float(np.median((fwd - simulated[:F])[measured])) + per_task),
        max(0.0, float(np.median((bwd - simulated[F:])[measured])) + per_task),
        float(np.median(fwd[unmeasured])) if unmeasured.any() else 0.0,
        float(np.median(bwd[unmeasured])) if unmeasured.any() else 0.0,
    )


def with_overheads(
    profile: ProfileTable, graphs: Sequence[OpGraph], workers: int, overheads: Overheads
) -> ProfileTable:
    """``profile`` with the overheads of measured ops added to every entry, and entries of the view
    overheads for the ops of ``graphs`` no profile measures (inputs and views, which the executor runs
    too), at their full output shape and its ``workers``-way sample split."""
    f, b = overheads.forward_s, overheads.backward_s
    entries = {k: ProfileEntry(e.forward_s + f, e.backward_s + b) for k, e in profile.entries.items()}
    view = ProfileEntry(overheads.view_forward_s, overheads.view_backward_s)
    for graph in graphs:
        for op in graph.ops:
            if op.op_type not in UNMEASURED_OPS or not op.output_shapes:
                continue
            shape = tuple(op.output_shapes[0])
            shapes = {shape}
            if shape and workers > 1 and shape[0] % workers == 0:
                shapes.add((shape[0] // workers, *shape[1:]))
            for s in shapes:
                entries.setdefault((CPU_DEVICE_TYPE, op.op_type, s, op.param_bytes), view)
    return ProfileTable(entries, profile.device, profile.precision, profile.timing)


# ----------------------------------------------------------------------------------------- the run
@dataclass
class FidelityReport:
    """What :func:`run_fidelity` measured.

    Attributes:
        cluster: the cluster spec.
        workers: the number of workers.
        link: the fitted link (between ranks 0 and ``workers - 1``).
        topology: the topology simulated.
        overheads: the executor's per-task overheads added to the profile.
        rows: one per case (the rows of ``results.jsonl``).
        out_dir: where the files went.
    """

    cluster: str
    workers: int
    link: LinkFit
    topology: DeviceTopology
    overheads: Overheads = Overheads(0.0, 0.0)
    rows: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None

    def summary(self) -> dict[str, Any]:
        """Spearman rank correlation of simulated and measured times over the measured cases, median and
        worst ``|simulated / measured - 1|``, and the same for the replay (``replay_`` keys) and the
        simulation with the profile alone (``profile_only_`` keys); ``None`` where undefined."""
        ok = [r for r in self.rows if r["status"] == "ok"]
        out: dict[str, Any] = {"cases": len(self.rows), "measured": len(ok)}
        for key, label in (("simulated_ms", ""), ("replayed_ms", "replay_"), ("profile_only_ms", "profile_only_")):
            errors = [abs(r[key] / r["measured_ms"] - 1) for r in ok]
            worst = int(np.argmax(errors)) if errors else None
            out[f"{label}median_abs_error"] = statistics.median(errors) if errors else None
            out[f"{label}worst_abs_error"] = max(errors) if errors else None
            out[f"{label}worst_case"] = ok[worst]["case"] if worst is not None else None
            out[f"{label}spearman"] = _spearman([r[key] for r in ok], [r["measured_ms"] for r in ok])
        return out

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Headers and cells: one row per case, milliseconds and signed errors."""
        headers = [
            "case",
            "batch",
            "measured ms",
            "simulated ms",
            "profile-only ms",
            "replayed ms",
            "error",
            "replay error",
            "status",
        ]
        cells = []
        for r in self.rows:
            if r["status"] != "ok":
                cells.append([r["case"], str(r["batch_size"]), *["-"] * 6, r["status"][:60]])
                continue
            cells.append(
                [
                    r["case"],
                    str(r["batch_size"]),
                    f"{r['measured_ms']:.2f}",
                    f"{r['simulated_ms']:.2f}",
                    f"{r['profile_only_ms']:.2f}",
                    f"{r['replayed_ms']:.2f}",
                    f"{r['error']:+.1%}",
                    f"{r['replay_error']:+.1%}",
                    "ok",
                ]
            )
        return headers, cells

    def lines(self) -> list[str]:
        """The table (Markdown) and the summary, ready to print."""
        headers, cells = self.table()
        out = [
            f"cluster {self.cluster}: {self.workers} workers; link {self.link.bandwidth_bytes_per_s / 1e6:,.1f} MB/s, "
            f"latency {self.link.latency_s * 1e6:,.0f} us; executor overheads per task "
            f"{self.overheads.forward_s * 1e6:,.0f} us forward, {self.overheads.backward_s * 1e6:,.0f} us backward",
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(c) + " |" for c in cells),
        ]
        s = self.summary()

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.1%}"

        def num(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        out.append(
            f"simulated vs measured over {s['measured']} of {s['cases']} cases: Spearman {num(s['spearman'])}, "
            f"median |error| {pct(s['median_abs_error'])}, worst {pct(s['worst_abs_error'])} ({s['worst_case']})"
        )
        for label, what in (("profile_only_", "profile only"), ("replay_", "replayed")):
            out.append(
                f"{what} vs measured: Spearman {num(s[label + 'spearman'])}, median |error| "
                f"{pct(s[label + 'median_abs_error'])}, worst {pct(s[label + 'worst_abs_error'])} "
                f"({s[label + 'worst_case']})"
            )
        return out


def _spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) < 2:
        return None
    from scipy.stats import spearmanr

    value = float(spearmanr(a, b).statistic)
    return None if math.isnan(value) else value


def case_row(
    cluster: str, case: FidelityCase, report: ExecutionReport, profile_only_s: float, wall_s: float
) -> dict[str, Any]:
    """The ``results.jsonl`` row of one executed case (keys :data:`ROW_KEYS`); ``profile_only_s`` is the plan
    simulated with the profile alone."""
    d = report.to_dict()
    warm = report.options.warmup
    overhead = []  # per rank, the median time outside its compute spans (waits, assembly, update)
    for r in report.results:
        spans = [
            it.time_s - sum(e.end_s - e.start_s for e in it.events if e.kind.startswith("compute_"))
            for it in r.iterations[warm:]
        ]
        overhead.append(statistics.median(spans) * 1e3)
    measured = report.measured_s
    fwd, bwd = measured_compute_s(report.program, report.results, warm)
    table = report.program.simulated.tasks
    F = len(fwd)
    simulated = (table.end_s - table.start_s)[: 2 * F]
    diffs = []
    for t in range(2 * F):
        op, part = report.program.task_order[t % F]
        got = float(fwd[t] if t < F else bwd[t - F])
        diffs.append((abs(got - simulated[t]), f"{op}#{part}:{'fwd' if t < F else 'bwd'}", got, float(simulated[t])))
    diffs.sort(reverse=True)
    tasks = [[name, got * 1e3, sim * 1e3] for _, name, got, sim in diffs[:TOP_TASKS]]
    return {
        "cluster": cluster,
        "case": case.name,
        "model": case.model,
        "batch_size": case.batch_size,
        "plan": case.plan,
        "workers": len(report.program.devices),
        "status": "ok",
        "measured_ms": d["measured_ms"],
        "simulated_ms": d["simulated_ms"],
        "profile_only_ms": profile_only_s * 1e3,
        "replayed_ms": d["replayed_ms"],
        "error": d["error"],
        "replay_error": (report.replayed_s - measured) / measured,
        "iteration_ms": d["iteration_ms"],
        "measured_compute_ms": d["measured_compute_ms"],
        "simulated_compute_ms": d["simulated_compute_ms"],
        "overhead_ms": overhead,
        "sent_bytes": d["sent_bytes"],
        "simulated_sent_bytes": d["simulated_sent_bytes"],
        "tasks_ms": tasks,
        "wall_s": wall_s,
    }


def failed_row(cluster: str, case: FidelityCase, workers: int, exc: BaseException, wall_s: float) -> dict[str, Any]:
    """The row of a case that could not be planned or run: ``status`` is the error, the figures ``None``."""
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(
        cluster=cluster,
        case=case.name,
        model=case.model,
        batch_size=case.batch_size,
        plan=case.plan,
        workers=workers,
        status=f"{type(exc).__name__}: {exc}".splitlines()[0],
        wall_s=wall_s,
    )
    return row


def check_out_dir(
    out_dir: str | os.PathLike[str], *, cluster: str | None = None, resume: bool = False, overwrite: bool = False
) -> list[dict[str, Any]]:
    """Check that writing into ``out_dir`` loses nothing; with ``resume``, the rows of its ``results.jsonl``
    kept (those measured, ``status`` ``ok``, on ``cluster``).

    A folder that does not exist or is empty is fine. One with files of an earlier run is refused unless
    ``overwrite`` (its results are replaced) or ``resume`` (its measured cases are kept and not run again).

    Raises:
        ValueError: naming the folder and its files and the flags, or a ``results.jsonl`` line that is not a
            row, or rows of another cluster with ``resume``; both flags at once.
    """
    if resume and overwrite:
        raise ValueError("--resume and --overwrite: expected one of them (keep the earlier rows, or replace them)")
    from placement_rl.paths import output_folder

    folder = Path(out_dir)
    missing = [] if folder.exists() else [folder, *(p for p in folder.parents if not p.exists())]
    output_folder(folder, "--out")  # a file, a dangling link, an unwritable place: refused here
    for created in missing:  # checked by creating it; nothing is left behind before the run
        created.rmdir()
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not entries or overwrite:
        return []
    if not resume:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ValueError(
            f"--out {str(folder)!r} holds an earlier run's files ({shown}); expected a new or empty folder, "
            "--resume to keep its measured cases and run the others, or --overwrite to replace them"
        )
    log = folder / "results.jsonl"
    rows: list[dict[str, Any]] = []
    if log.is_file():
        for number, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or not {"case", "batch_size", "status", "cluster"} <= set(row):
                raise ValueError(f"--resume: {log} line {number} is not a results row; expected the file a run wrote")
            if cluster is not None and row["cluster"] != cluster:
                raise ValueError(
                    f"--resume: {log} holds rows of cluster {row['cluster']!r}, not {cluster!r}; expected the same "
                    "--cluster, or another --out folder"
                )
            if row["status"] == "ok":
                rows.append(row)
    return rows


def run_fidelity(
    cases: Sequence[FidelityCase] = DEFAULT_CASES,
    *,
    cluster: str = "local",
    workers: int | None = None,
    iterations: int = 5,
    warmup: int = 1,
    out_dir: str | os.PathLike[str] | None = None,
    profile_repeats: int = 5,
    ping_repeats: int = 5,
    cost_model: CostModel | None = None,
    realtime_priority: int = 10,
    calibrate: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> FidelityReport:
    """Profile, measure the link, then execute and simulate every case (module docstring).

    Args:
        cases: the cases, run in order.
        cluster: ``local`` or ``emulated:MxG@NIC`` (:func:`parse_cluster`).
        workers: number of workers for ``local`` (default 2); an emulated cluster has ``M * G``.
        iterations: measured iterations per case (their median is the measured time), after ``warmup``.
        out_dir: where ``results.jsonl`` (one row per case, appended as each is measured), ``link.json``,
            ``topology.json`` and ``profile.json`` go (default: none written). A folder with an earlier
            run's files is refused unless ``resume`` or ``overwrite`` (:func:`check_out_dir`).
        profile_repeats: timed runs per op of the profile.
        ping_repeats: timed messages per size of the link measurement.
        cost_model: the other cost model settings (network model, buckets); its profile is replaced.
        realtime_priority: ``SCHED_RR`` priority of the profiling thread and of every worker (0: none), so
            that other work on the machine delays neither (needs root; silently not applied otherwise).
        calibrate: measure the executor's per-task :class:`Overheads` (:func:`calibrate_overheads`) and add
            them to the profile; else the profile alone.
        resume: keep the measured rows of ``out_dir/results.jsonl`` (same cluster) and run only the other
            cases; the link, profile and overheads are measured again (their files describe this run).
        overwrite: replace the results of an earlier run in ``out_dir``.
        log: receives progress lines.

    Raises:
        ValueError: a bad cluster spec, more workers than :data:`~placement_rl.execute.local.MAX_LOCAL_WORKERS`
            (or the emulator's :data:`~placement_rl.emulate.cluster.MAX_DEVICES`), an ``out_dir`` with an
            earlier run's files, or a batch a sample split cannot divide; before anything is measured.
        EmulatorError: the emulated cluster cannot be built here (not root, no ``ip``/``tc``).
    """
    say = log or (lambda _line: None)
    kind, machines, per_machine, nic_gbit = parse_cluster(cluster)
    if kind == "local":
        machines, per_machine = 1, workers or 2
    elif workers is not None and workers != machines * per_machine:
        raise ValueError(f"cluster {cluster!r} has {machines * per_machine} workers; workers = {workers} disagrees")
    world = machines * per_machine
    if world < 2:
        raise ValueError(f"cluster {cluster!r}: {world} worker; the link measurement needs at least 2")
    check_local_workers(world)
    folder = Path(out_dir) if out_dir is not None else None
    kept: list[dict[str, Any]] = []
    if folder is not None:
        kept = check_out_dir(folder, cluster=cluster, resume=resume, overwrite=overwrite)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "results.jsonl.tmp"
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        tmp.replace(folder / "results.jsonl")
    done = {(row["case"], row["batch_size"]) for row in kept}
    if done:
        say(f"resuming: {len(done)} case(s) measured in {folder}, kept")
    options = RunOptions(iterations=iterations, warmup=warmup, threads=1)

    say(f"profiling {len({(c.model, c.batch_size, c.options) for c in cases})} model(s) with one thread")
    started = time.perf_counter()
    with realtime(realtime_priority):
        profile = profile_cases(cases, world, profile_repeats)
        peak, bandwidth = measure_cpu()
    say(f"profiled {len(profile)} op shapes in {time.perf_counter() - started:.0f} s; CPU {peak / 1e9:.1f} GFLOP/s")
    # CPU workers run each op synchronously: its measured wall time holds its dispatch, so no host lane
    # and no GPU calibration (the flat model with the profile), unless the caller gives a cost model.
    base = dataclasses.replace(cost_model or CostModel(calibration=None), profile=profile)

    with _cluster(kind, machines, per_machine, nic_gbit, realtime_priority) as launcher:
        samples = launcher.ping_pong(world, world - 1, PING_SIZES, repeats=ping_repeats)
        link = fit_link(samples)
        say(f"link: {link.bandwidth_bytes_per_s / 1e6:,.1f} MB/s, latency {link.latency_s * 1e6:,.0f} us")
        # one measured route: split its latency over its links (4 between machines, 2 within one)
        if machines > 1:
            topology = cpu_cluster(
                machines,
                per_machine,
                intra_bytes_per_s=link.bandwidth_bytes_per_s * INTRA_PER_NIC,
                intra_latency_s=link.latency_s / 4,
                nic_bytes_per_s=link.bandwidth_bytes_per_s,
                nic_latency_s=link.latency_s / 4,
                peak_flops=peak,
                memory_bandwidth_bytes_per_s=bandwidth,
                name=cluster,
            )
        else:
            topology = cpu_cluster(
                1,
                per_machine,
                intra_bytes_per_s=link.bandwidth_bytes_per_s,
                intra_latency_s=link.latency_s / 2,
                peak_flops=peak,
                memory_bandwidth_bytes_per_s=bandwidth,
                name=cluster,
            )
        reduces = launcher.all_reduce_times(world, PING_SIZES, repeats=ping_repeats)
        kind = "ethernet" if machines > 1 else "pcie"
        comm = all_reduce_table(reduces, world, link.latency_s, kind)
        base = dataclasses.replace(base, comm_table=comm)
        say(
            "all-reduce over every worker: "
            + ", ".join(f"{size / 2**10:,.0f} KiB {t * 1e3:.2f} ms" for size, t in _medians(reduces))
        )
        graphs: dict[tuple[str, int, tuple[tuple[str, Any], ...]], OpGraph] = {}
        for case in cases:
            key = (case.model, case.batch_size, case.options)
            if key not in graphs:
                graphs[key] = case.source.graph()
        overheads = Overheads(0.0, 0.0)
        if calibrate:
            overheads = calibrate_overheads(
                launcher, topology, profile_repeats=profile_repeats, realtime_priority=realtime_priority
            )
            say(
                f"executor overheads per task: forward {overheads.forward_s * 1e6:,.0f} us, backward "
                f"{overheads.backward_s * 1e6:,.0f} us; views {overheads.view_forward_s * 1e6:,.0f} us, "
                f"{overheads.view_backward_s * 1e6:,.0f} us"
            )
        calibrated = dataclasses.replace(base, profile=with_overheads(profile, list(graphs.values()), world, overheads))
        report = FidelityReport(cluster, world, link, topology, overheads, rows=list(kept), out_dir=folder)
        if folder is not None:
            (folder / "link.json").write_text(json.dumps(link.to_dict(), indent=1))
            (folder / "comm_table.json").write_text(json.dumps(comm.to_dict(), indent=1))
            (folder / "overheads.json").write_text(json.dumps(overheads.to_dict(), indent=1))
            topology.to_json(folder / "topology.json")
            profile.to_json(folder / "profile.json")
        for case in cases:
            if (case.name, case.batch_size) in done:
                continue
            t0 = time.perf_counter()
            try:
                graph = graphs[(case.model, case.batch_size, case.options)]
                plan = getattr(constructors, case.plan)(graph, topology)
                profile_only = lower(graph, topology, plan, base).simulated.makespan_s
                executed = execute(
                    case.source,
                    topology,
                    plan,
                    graph=graph,
                    options=options,
                    cost_model=calibrated,
                    launcher=launcher.bind(topology, plan, calibrated),
                )
                row = case_row(cluster, case, executed, profile_only, time.perf_counter() - t0)
                say(
                    f"{case.name}: measured {row['measured_ms']:.2f} ms, simulated {row['simulated_ms']:.2f} ms "
                    f"({row['error']:+.1%}), replayed {row['replayed_ms']:.2f} ms ({row['replay_error']:+.1%})"
                )
            except (ValueError, RuntimeError) as exc:  # NotExecutableError, ExecutionError, a bad plan
                row = failed_row(cluster, case, world, exc, time.perf_counter() - t0)
                say(f"{case.name}: {row['status']}")
            report.rows.append(row)
            if folder is not None:
                with open(folder / "results.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
    return report


@contextlib.contextmanager
def _cluster(kind: str, machines: int, per_machine: int, nic_gbit: float, priority: int) -> Iterator[ProcessLauncher]:
    """A launcher on this machine, or on an emulated cluster built for the block and removed after it."""
    if kind == "local":
        yield ProcessLauncher(local_spawner, "127.0.0.1", realtime_priority=priority)
        return
    from placement_rl.emulate.cluster import DEVICE_IFNAME, EmulatedCluster, device_address, layout

    nic = nic_gbit * 1e9 / 8
    nominal = cpu_cluster(machines, per_machine, intra_bytes_per_s=nic * INTRA_PER_NIC, nic_bytes_per_s=nic)
    mbit = nic_gbit * 1e3
    lay = layout(nominal, bottleneck_mbit=mbit, min_mbit=min(mbit, 50.0), max_mbit=mbit * INTRA_PER_NIC)
    with EmulatedCluster(lay) as emulated:
        yield ProcessLauncher(emulated.spawn, device_address(0), DEVICE_IFNAME, port=29600, realtime_priority=priority)
