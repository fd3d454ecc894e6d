"""Time the patterns on an emulated cluster and simulate them under every network model.

:func:`emulate` builds the cluster (:class:`~placement_rl.emulate.cluster.EmulatedCluster`), starts one
worker per device (:mod:`placement_rl.emulate.worker`), collects the measured times, removes every
namespace and process it made, and simulates each pattern on the emulated topology
(:meth:`Layout.emulated_topology`) under each network model the simulator offers
(:func:`~placement_rl.emulate.patterns.network_models`). :func:`summarize` and :func:`table_rows` turn
reports into the comparison the command and the benchmark print.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.emulate.cluster import (
    DEFAULT_BOTTLENECK_MBIT,
    DEFAULT_MAX_MBIT,
    DEFAULT_MIN_MBIT,
    DEVICE_IFNAME,
    EmulatedCluster,
    EmulatorError,
    Layout,
    device_address,
    find_tools,
    layout,
)
from placement_rl.emulate.patterns import Pattern, Sizes, network_models, patterns_for, simulate_pattern
from placement_rl.topology import DeviceTopology

WORKER = Path(__file__).with_name("worker.py")
MASTER_PORT = 29500


@dataclass(frozen=True)
class PatternResult:
    """One pattern on one topology: measured and simulated seconds.

    Attributes:
        topology: the topology's name (as given, not scaled).
        pattern: the pattern's name.
        description: what the pattern does.
        measured_s: the median of ``runs_s``.
        runs_s: each timed run (after the warm-up), seconds.
        simulated_s: network model -> simulated seconds, for the models the simulator offers.
        redone: runs measured again because some worker started late (the machine stalled).
    """

    topology: str
    pattern: str
    description: str
    measured_s: float
    runs_s: tuple[float, ...]
    simulated_s: Mapping[str, float]
    redone: int = 0

    def error(self, model: str) -> float | None:
        """Relative error of ``model``: ``simulated / measured - 1``; ``None`` when not simulated."""
        simulated = self.simulated_s.get(model)
        return None if simulated is None else simulated / self.measured_s - 1.0


@dataclass(frozen=True)
class EmulationReport:
    """Everything one :func:`emulate` call measured and simulated.

    Attributes:
        layout: the topology, its machines and its scale.
        prefix: the names of the run's namespaces started with this (all removed when it returned).
        emulated_topology: the topology the emulation realizes (bandwidths scaled; see ``latency_shaped``).
        latency_shaped: whether link latencies were shaped (``netem``); else the emulated topology has none.
        results: one row per pattern, in catalogue order.
        models: the network models simulated.
        max_late_s: the latest any rank woke up for a run that counts (start synchronization quality).
        realtime: whether every worker ran at real-time priority.
        wall_s: seconds the emulation took (building, start-up, runs, cleanup).
    """

    layout: Layout
    prefix: str
    emulated_topology: DeviceTopology
    latency_shaped: bool
    results: tuple[PatternResult, ...]
    models: tuple[str, ...]
    max_late_s: float
    realtime: bool
    wall_s: float


def emulate(
    topology: DeviceTopology,
    patterns: Sequence[str] | None = None,
    *,
    sizes: Sizes | None = None,
    repeats: int = 3,
    warmup: int = 1,
    bottleneck_mbit: float = DEFAULT_BOTTLENECK_MBIT,
    min_mbit: float = DEFAULT_MIN_MBIT,
    max_mbit: float = DEFAULT_MAX_MBIT,
    timeout_s: float = 1800.0,
    start_margin_s: float = 0.05,
    max_late_s: float = 0.02,
    realtime_priority: int = 10,
    log: Callable[[str], None] | None = None,
    fail: tuple[int, str] | None = None,
) -> EmulationReport:
    """Measure ``patterns`` on an emulated ``topology`` and simulate them (module docstring).

    Args:
        topology: a cluster of the emulator's shape (:func:`~placement_rl.emulate.cluster.layout`).
        patterns: names from :func:`~placement_rl.emulate.patterns.pattern_names` (default: all that apply).
        sizes: message and compute sizes of the patterns.
        repeats: timed runs per pattern (the median is reported).
        warmup: untimed runs per pattern first.
        bottleneck_mbit: rate of the slowest link (see :func:`~placement_rl.emulate.cluster.layout`).
        min_mbit: slowest rate a link may be shaped to.
        max_mbit: fastest rate a link may be shaped to.
        timeout_s: give up (and clean up) after this long; also gloo's timeout.
        start_margin_s: how far ahead of the synchronized clock each run starts.
        max_late_s: a run in which some worker woke up later than this after the start is run again.
        realtime_priority: ``SCHED_RR`` priority of the workers' threads (0: leave them as they are),
            so that other work on the machine does not delay their wake-ups.
        log: receives progress lines.
        fail: ``(rank, pattern)``: that worker raises before that pattern (tests the cleanup).

    Raises:
        EmulatorError: the topology cannot be emulated, ``ip``/``tc`` are missing or not permitted, no
            pattern applies, or a worker failed or timed out (its log's tail in the message). Nothing
            the run created is left behind, whatever the outcome.
        UnknownNameError: for an unknown pattern name.
    """
    started = time.perf_counter()
    say = log or (lambda _line: None)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats = {repeats}, warmup = {warmup}: expected repeats >= 1 and warmup >= 0")
    lay = layout(topology, bottleneck_mbit=bottleneck_mbit, min_mbit=min_mbit, max_mbit=max_mbit)
    chosen = patterns_for(topology, sizes, patterns)
    if not chosen:
        raise EmulatorError(f"no pattern of {list(patterns or [])} applies to topology {topology.name!r}")
    if fail is not None and fail[1] not in {p.name for p in chosen}:
        raise ValueError(f"fail pattern {fail[1]!r} is not among the patterns run")
    tools = find_tools()
    models = network_models()
    say(lay.describe())
    with EmulatedCluster(lay, tools) as cluster:
        say(f"built {len(cluster.device_namespaces) + 1} namespaces ({cluster.prefix}*); netem: {cluster.netem}")
        emulated = lay.emulated_topology(cluster.netem)
        estimate = sum(simulate_pattern(p, emulated) for p in chosen) * (warmup + repeats)
        say(f"running {len(chosen)} patterns x {warmup + repeats} runs (about {estimate:.0f} s of traffic)")
        settings = {
            "warmup": warmup,
            "repeats": repeats,
            "start_margin_s": start_margin_s,
            "max_late_s": max_late_s,
            "timeout_s": timeout_s,
            "realtime_priority": realtime_priority,
            "fail": None if fail is None else {"rank": fail[0], "pattern": fail[1]},
        }
        ranks = _run_workers(cluster, chosen, settings, say)
    results = []
    for p, pattern in enumerate(chosen):
        entries = [r["patterns"][p] for r in ranks]
        assert all(entry["name"] == pattern.name for entry in entries)
        times = [max(entry["runs"][k]["end_s"] for entry in entries) for k in range(repeats)]
        simulated = {m: simulate_pattern(pattern, emulated, m) for m in models}
        median = statistics.median(times)
        results.append(
            PatternResult(
                topology.name, pattern.name, pattern.description, median, tuple(times), simulated, entries[0]["redone"]
            )
        )
    late = max(run["late_s"] for r in ranks for entry in r["patterns"] for run in entry["runs"])
    return EmulationReport(
        lay,
        cluster.prefix,
        emulated,
        cluster.netem,
        tuple(results),
        models,
        late,
        all(r["realtime"] for r in ranks),
        time.perf_counter() - started,
    )


def _run_workers(
    cluster: EmulatedCluster, patterns: Sequence[Pattern], settings: Mapping[str, Any], say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Start one worker per device with ``settings`` (see :mod:`placement_rl.emulate.worker`), wait for
    them, and return what each wrote, in rank order."""
    topology = cluster.layout.topology
    rank = {d.name: k for k, d in enumerate(topology.devices)}
    folder = Path(tempfile.mkdtemp(prefix="placement-rl-emulate-"))
    logs = []
    try:
        spec = {
            "world_size": topology.num_devices,
            "master_addr": device_address(0),
            "master_port": MASTER_PORT,
            "ifname": DEVICE_IFNAME,
            "out_dir": str(folder),
            **settings,
            "patterns": [p.worker_spec(rank) for p in patterns],
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        processes = []
        for k in range(topology.num_devices):
            log = open(folder / f"rank{k}.log", "wb")  # closed below, after the process ends
            logs.append(log)
            argv = [sys.executable, str(WORKER), str(folder / "spec.json"), str(k), str(os.getpid())]
            processes.append(cluster.spawn(k, argv, env, log, log))
        say(f"started {len(processes)} gloo workers")
        deadline = time.monotonic() + settings["timeout_s"]
        while True:
            codes = [p.poll() for p in processes]
            failed = [k for k, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                # The others follow within moments (a peer's closed connection fails their collective),
                # and which one the poll saw first is a race: wait briefly and name every failed worker.
                settle = time.monotonic() + FAILURE_SETTLE_S
                while any(c is None for c in codes) and time.monotonic() < settle:
                    time.sleep(0.05)
                    codes = [p.poll() for p in processes]
                failed = [k for k, c in enumerate(codes) if c not in (None, 0)]
                raise EmulatorError(
                    "\n".join(
                        f"worker {k} ({topology.devices[k].name}) exited with status {codes[k]}:\n"
                        + _tail(folder / f"rank{k}.log")
                        for k in failed
                    )
                )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise EmulatorError(f"the workers did not finish within {settings['timeout_s']:g} s")
            time.sleep(0.2)
        return [json.loads((folder / f"rank{k}.json").read_text()) for k in range(topology.num_devices)]
    finally:
        for log in logs:
            log.close()
        shutil.rmtree(folder, ignore_errors=True)


#: Seconds the other workers are given to exit once one has failed, so that the error names every failed one.
FAILURE_SETTLE_S = 2.0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ----------------------------------------------------------------------------------------- reporting
@dataclass(frozen=True)
class ModelSummary:
    """How one network model did over a set of patterns (errors are relative, ``simulated / measured - 1``).

    Attributes:
        model: the network model.
        patterns: how many patterns it was compared on.
        median_abs_error: median of the absolute errors.
        mean_abs_error: mean of the absolute errors.
        worst_abs_error: the largest absolute error.
        worst_pattern: ``topology/pattern`` of that error.
    """

    model: str
    patterns: int
    median_abs_error: float
    mean_abs_error: float
    worst_abs_error: float
    worst_pattern: str


def _models(results: Sequence[PatternResult]) -> list[str]:
    """The network models any of ``results`` was simulated under, in first-seen order."""
    return list(dict.fromkeys(m for r in results for m in r.simulated_s))


def summarize(results: Sequence[PatternResult]) -> list[ModelSummary]:
    """One :class:`ModelSummary` per network model the results were simulated under (none for no results)."""
    out = []
    for model in _models(results):
        errors = [(abs(e), f"{r.topology}/{r.pattern}") for r in results if (e := r.error(model)) is not None]
        worst = max(errors)
        values = [e for e, _ in errors]
        out.append(
            ModelSummary(model, len(errors), statistics.median(values), statistics.fmean(values), worst[0], worst[1])
        )
    return out


#: Simulated times further apart than this (relative) tell two network models apart.
DISAGREEMENT = 0.02


def disagreeing(
    results: Sequence[PatternResult], a: str, b: str, tolerance: float = DISAGREEMENT
) -> list[PatternResult]:
    """The results whose times under models ``a`` and ``b`` differ by more than ``tolerance`` (relative):
    the patterns that tell the two apart. On the others both predict the same time."""
    out = []
    for r in results:
        if a in r.simulated_s and b in r.simulated_s:
            low, high = sorted((r.simulated_s[a], r.simulated_s[b]))
            if high > (1 + tolerance) * low:
                out.append(r)
    return out


def table_rows(results: Sequence[PatternResult]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison: milliseconds measured and simulated under each network model,
    then each model's error as a signed percentage (``simulated / measured - 1``)."""
    models = _models(results)
    headers = ["topology", "pattern", "measured ms", *(f"{m} ms" for m in models), *(f"{m} err" for m in models)]
    rows = []
    for r in results:
        cells = [r.topology, r.pattern, f"{r.measured_s * 1e3:,.1f}"]
        cells += [f"{r.simulated_s[m] * 1e3:,.1f}" if m in r.simulated_s else "-" for m in models]
        cells += [f"{e:+.1%}" if (e := r.error(m)) is not None else "-" for m in models]
        rows.append(cells)
    return headers, rows


#: The goal for the ``flow`` model: median and worst absolute error, and the fewest patterns.
GOAL = (0.10, 0.25, 12)


def summary_lines(results: Sequence[PatternResult]) -> list[str]:
    """Per model: median, mean and worst absolute error over all patterns; per other model, ``flow``
    against it on the patterns where the two disagree (:func:`disagreeing`); then whether ``flow`` meets
    :data:`GOAL`: median and worst error over all patterns within the bounds, over enough patterns, and
    a lower median error than each other model on the patterns that tell the two apart (over all
    patterns the medians say little: most patterns give every model the same time)."""
    lines = []
    summaries = summarize(results)
    for s in summaries:
        lines.append(
            f"{s.model}: median |error| {s.median_abs_error:.1%}, mean {s.mean_abs_error:.1%}, worst "
            f"{s.worst_abs_error:.1%} ({s.worst_pattern}) over {s.patterns} patterns"
        )
    flow = next((s for s in summaries if s.model == "flow"), None)
    if flow is None:
        lines.append("goal: not evaluated; this simulator has no `flow` network model (CostModel has no `network`)")
        return lines
    lower = []
    for other in (s.model for s in summaries if s.model != "flow"):
        apart = disagreeing(results, "flow", other)
        if not apart:
            lines.append(f"flow and {other} predict the same time for every pattern")
            lower.append(False)
            continue
        pair = {s.model: s for s in summarize(apart)}
        lines.append(
            f"flow vs {other} on the {len(apart)} patterns where they disagree (by more than {DISAGREEMENT:.0%}): "
            f"median |error| {pair['flow'].median_abs_error:.1%} vs {pair[other].median_abs_error:.1%}"
        )
        lower.append(pair["flow"].median_abs_error < pair[other].median_abs_error)
    median, worst, count = GOAL
    met = flow.median_abs_error <= median and flow.worst_abs_error <= worst and flow.patterns >= count and all(lower)
    lines.append(
        f"goal (flow: median |error| <= {median:.0%} and worst <= {worst:.0%} over >= {count} patterns, and lower "
        f"than each other model where they disagree): {'met' if met else 'missed'}"
    )
    return lines


def report_json(report: EmulationReport) -> dict[str, Any]:
    """A report as JSON-ready data."""
    lay = report.layout
    return {
        "topology": lay.topology.name,
        "scale": lay.scale,
        "latency_shaped": report.latency_shaped,
        "links": [
            {
                "a": s.link.a,
                "b": s.link.b,
                "bandwidth_bytes_per_s": s.link.bandwidth_bytes_per_s,
                "rate_bit_per_s": s.rate_bit_per_s,
            }
            for s in lay.links
        ],
        "models": list(report.models),
        "max_late_s": report.max_late_s,
        "realtime": report.realtime,
        "wall_s": report.wall_s,
        "results": [
            {
                "pattern": r.pattern,
                "description": r.description,
                "measured_s": r.measured_s,
                "runs_s": list(r.runs_s),
                "redone": r.redone,
                "simulated_s": dict(r.simulated_s),
                "error": {m: r.error(m) for m in r.simulated_s},
            }
            for r in report.results
        ],
    }
