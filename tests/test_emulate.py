"""The emulated cluster: topology checks and scaling, the patterns as simulations, and end-to-end runs
that build namespaces, time real traffic and leave nothing behind (on success, failure and signals).

The end-to-end tests need root, ``ip`` and ``tc`` and network namespaces; elsewhere they are skipped
with the reason. They start one gloo process per device (each imports torch), so they are ``slow``.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from placement_rl.cli import main
from placement_rl.emulate import (
    EMULATOR_PREFIX,
    EmulatorError,
    Message,
    Pattern,
    PatternResult,
    Sizes,
    Step,
    cleanup_leftovers,
    disagreeing,
    emulate,
    find_tools,
    layout,
    network_models,
    pattern_names,
    patterns_for,
    simulate_pattern,
    summarize,
    summary_lines,
    switched_cluster,
    table_rows,
)
from placement_rl.emulate.cluster import FRAME_OVERHEAD, shaping_commands
from placement_rl.emulate.patterns import PARKED_BACKWARD_S, simulation_inputs
from placement_rl.emulate.run import WORKER
from placement_rl.topology import load_preset


# ------------------------------------------------------------------------------------------ layout
def test_layout_scales_the_slowest_link_to_the_bottleneck_rate() -> None:
    lay = layout(switched_cluster(2, 2, nic_gbit=25))
    assert lay.scale == pytest.approx(100e6 / 25e9)  # the 25 Gb/s NICs become 100 Mbit/s
    assert [m.devices for m in lay.machines] == [("m0/gpu0", "m0/gpu1"), ("m1/gpu0", "m1/gpu1")]
    assert lay.core == "eth-switch" and all(m.uplink is not None for m in lay.machines)
    rates = sorted({round(s.rate_bit_per_s / 1e6, 3) for s in lay.links})
    assert rates == [100.0, 384.0]  # PCIe 3.0 x16 (96 Gbit/s) times the same scale
    emulated = lay.emulated_topology(latency_shaped=False)
    assert [link.bandwidth_bytes_per_s for link in emulated.links] == [s.rate_bit_per_s / 8 for s in lay.links]
    assert all(link.latency_s == 0 for link in emulated.links)
    assert "scale 1/250" in lay.describe()
    # Links faster than the others would allow: the fastest goes to max_mbit and the rest follow.
    assert layout(switched_cluster(2, 2, nic_gbit=25), bottleneck_mbit=400).scale == pytest.approx(800e6 / 96e9)


def test_layout_refuses_what_it_cannot_shape_naming_the_link() -> None:
    with pytest.raises(EmulatorError, match=r"link 0 \('m0/gpu0' <-> 'm0/pcie', pcie, 96 Gbit/s\) is 96\.0x faster"):
        layout(switched_cluster(2, 2, nic_gbit=1))
    with pytest.raises(EmulatorError, match=r"link 0 \('m0/gpu0' <-> 'm0/gpu1', nvlink.*joins two devices"):
        layout(load_preset("flexflow-p100"))
    with pytest.raises(EmulatorError, match="has 20 devices"):
        layout(switched_cluster(5, 4))
    with pytest.raises(EmulatorError, match="expected 0 < min <= bottleneck <= max"):
        layout(switched_cluster(2, 1), bottleneck_mbit=10)
    assert layout(load_preset("trinity")).core is None  # one PCIe machine, no NIC: fine


def test_shaping_counts_frames_and_puts_short_packets_first() -> None:
    lay = layout(switched_cluster(2, 1))
    plain = shaping_commands("ns", "eth0", lay.links[1], netem=False)
    text = [" ".join(cmd) for cmd in plain]
    assert text[0] == "-n ns qdisc add dev eth0 root handle 1: htb default 20"
    assert f"rate {100e6 * FRAME_OVERHEAD:.0f}bit" in text[1]
    assert any("u32 match u16 0x0000 0xff80 at 2 flowid 1:10" in t for t in text)
    assert not any("netem" in t for t in text)
    delayed = " ".join(" ".join(cmd) for cmd in shaping_commands("ns", "eth0", lay.links[1], netem=True))
    assert f"netem delay {round(lay.links[1].latency_s * 1e6)}us" in delayed


# ---------------------------------------------------------------------------------------- patterns
def test_patterns_simulate_to_known_times() -> None:
    topology = layout(switched_cluster(2, 2)).emulated_topology(latency_shaped=False)
    patterns = {p.name: p for p in patterns_for(topology)}
    assert list(patterns) == pattern_names()  # a 2 x 2 cluster has every pattern
    nic = 100e6 / 8  # bytes/s of the emulated NIC
    message = Sizes().message_bytes
    assert simulate_pattern(patterns["p2p_inter"], topology) == pytest.approx(message / nic)
    # today's model: a transfer holds its whole route, so two transfers through one NIC take turns
    assert simulate_pattern(patterns["nic_shared"], topology, "circuit") == pytest.approx(2 * message / nic)
    for pattern in patterns.values():
        assert 0 < simulate_pattern(pattern, topology) < PARKED_BACKWARD_S / 10, pattern.name


def test_a_pattern_is_one_op_per_step_and_one_tensor_per_message() -> None:
    topology = switched_cluster(2, 1)
    pattern = Pattern(
        "chain",
        "compute, send, compute",
        (Step("a", "m0/gpu0", 0.5), Step("b", "m0/gpu0"), Step("c", "m1/gpu0", 0.25)),
        (Message("a", "c", 1024),),
    )
    graph, plan, profile = simulation_inputs(pattern, topology)
    assert [op.name for op in graph.ops] == ["a", "b", "c"]
    assert {(t.src, t.dst, t.num_bytes) for t in graph.tensors} == {("a", "c", 1024), ("a", "b", 0)}  # b after a
    assert plan["c"].devices == ("m1/gpu0",) and len(profile) == 3
    route = topology.route("m0/gpu0", "m1/gpu0")
    assert simulate_pattern(pattern, topology) == pytest.approx(0.5 + route.transfer_time_s(1024) + 0.25)
    assert pattern.worker_spec({"m0/gpu0": 0, "m1/gpu0": 1})["messages"] == [{"src": 0, "dst": 2, "num_bytes": 1024}]
    with pytest.raises(ValueError, match="goes backwards"):
        Pattern("bad", "", pattern.steps, (Message("c", "a", 8),)).check(topology)
    with pytest.raises(ValueError, match="positive multiple of 4 bytes"):
        Pattern("bad", "", pattern.steps, (Message("a", "c", 6),)).check(topology)


def test_the_summary_judges_flow_against_each_model_where_they_disagree() -> None:
    def row(name: str, measured: float, **simulated: float) -> PatternResult:
        return PatternResult("t", name, "", measured, (measured,), simulated)

    results = [row(f"same{i}", 1.0, flow=1.01, circuit=1.01, pairwise=1.01) for i in range(11)]
    results += [
        row("shared", 2.0, flow=2.1, circuit=2.1, pairwise=1.0),  # pairwise ignores the sharing
        row("mixed", 1.0, flow=1.04, circuit=1.3, pairwise=1.04),  # circuit holds the whole route
    ]
    assert disagreeing(results, "flow", "circuit") == [results[-1]]
    assert disagreeing(results, "flow", "pairwise") == [results[-2]]
    lines = summary_lines(results)
    assert lines[0] == "flow: median |error| 1.0%, mean 1.5%, worst 5.0% (t/shared) over 13 patterns"
    assert (
        "flow vs circuit on the 1 patterns where they disagree (by more than 2%): median |error| 4.0% vs 30.0%" in lines
    )
    assert lines[-1].endswith(": met")
    assert summary_lines(results[2:])[-1].endswith(": missed")  # 11 patterns: too few
    assert summary_lines([row("x", 1.0, circuit=1.1)])[-1].startswith("goal: not evaluated")


# ------------------------------------------------------------------------------- missing programs
def test_a_missing_tc_is_named_before_anything_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ip = shutil.which("ip")
    if ip is not None:
        (tmp_path / "ip").symlink_to(ip)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulatorError, match="needs 'tc'" if ip else "needs 'ip'"):
        find_tools()
    with pytest.raises(EmulatorError, match="needs 'tc'" if ip else "needs 'ip'"):
        emulate(switched_cluster(2, 1), ["p2p_inter"])


def test_cli_errors_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulate", "--topology", "2x2@1"]) == 2
    assert "link 0 ('m0/gpu0' <-> 'm0/pcie', pcie, 96 Gbit/s) is 96.0x faster" in capsys.readouterr().err
    assert main(["emulate", "--topology", "2x2", "--patterns", "nope"]) == 2
    assert "unknown pattern 'nope'" in capsys.readouterr().err
    assert main(["emulate", "--topology", "3x2@200", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "scale 1/960" in out and "all_to_all" in out


# ------------------------------------------------------------------------------ the real network
def _netns_unavailable() -> str | None:
    """Why this machine cannot build namespaces, or None when it can (probed with one of our own)."""
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    for program in ("ip", "tc"):
        if shutil.which(program) is None:
            return f"{program!r} (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"{EMULATOR_PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_REASON = _netns_unavailable()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=f"no emulated cluster here: {_REASON}")


def _system_state(pid: int | None = None) -> tuple[list[str], list[str]]:
    """The network namespaces (less those of emulator runs of other processes than ``pid``, default this
    one: a run elsewhere on the machine may come and go) and every link of the namespace the tests run in."""
    mine = f"{EMULATOR_PREFIX}{pid or os.getpid()}-"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.splitlines()
    names = sorted(ns for ns in listed if not ns.startswith(EMULATOR_PREFIX) or ns.startswith(mine))
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return names, sorted(line.split(":")[1].strip() for line in links.splitlines())


def _our_workers() -> list[int]:
    """Live children of this process running the emulator's worker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        if ppid == os.getpid() and str(WORKER) in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@needs_netns
def test_two_patterns_end_to_end_leave_nothing_behind() -> None:
    before = _system_state()
    report = emulate(
        switched_cluster(2, 1),
        ["p2p_inter", "ring_gloo"],
        sizes=Sizes(message_bytes=512 * 1024, compute_s=0.01),
        repeats=2,
        warmup=1,
    )
    assert _system_state() == before and not _our_workers()
    assert not any(ns.startswith(report.prefix) for ns in _system_state()[0])
    assert [r.pattern for r in report.results] == ["p2p_inter", "ring_gloo"]
    assert report.models == network_models() and report.layout.scale == pytest.approx(100e6 / 25e9)
    for r in report.results:
        assert r.topology == "2x1@25" and len(r.runs_s) == 2 and r.measured_s > 0
        assert all(t > 0 for t in r.runs_s)
        assert set(r.simulated_s) == set(report.models) and all(t > 0 for t in r.simulated_s.values())
        for model in report.models:
            error = r.error(model)
            assert error is not None and math.isfinite(error)
    # 512 KiB at 100 Mbit/s is 42 ms; a run that took 10 times that measured something other than the link
    p2p = report.results[0]
    assert 0.2 < p2p.measured_s / p2p.simulated_s["circuit"] < 5
    headers, rows = table_rows(report.results)
    assert headers[:3] == ["topology", "pattern", "measured ms"] and len(rows) == 2
    assert [s.model for s in summarize(report.results)] == list(report.models)


@pytest.mark.slow
@needs_netns
def test_a_worker_that_raises_mid_run_leaves_nothing_behind() -> None:
    before = _system_state()
    with pytest.raises(EmulatorError, match=r"(?s)worker 1 \(m1/gpu0\) exited .*injected failure on rank 1"):
        emulate(
            switched_cluster(2, 1),
            ["p2p_inter", "p2p_duplex"],
            sizes=Sizes(message_bytes=64 * 1024),
            repeats=1,
            warmup=0,
            fail=(1, "p2p_duplex"),  # after p2p_inter ran: rank 0 waits in a collective when rank 1 dies
        )
    assert _system_state() == before and not _our_workers()


@pytest.mark.slow
@needs_netns
def test_an_interrupt_while_workers_start_leaves_nothing_behind() -> None:
    before = _system_state()

    def interrupt_once_started(line: str) -> None:
        if line.startswith("started"):
            raise KeyboardInterrupt  # as Ctrl-C would, while every worker is importing torch

    with pytest.raises(KeyboardInterrupt):
        emulate(switched_cluster(2, 1), ["p2p_inter"], log=interrupt_once_started)
    assert _system_state() == before and not _our_workers()


@pytest.mark.slow
@needs_netns
def test_sigterm_to_the_command_leaves_nothing_behind() -> None:
    command = [sys.executable, "-m", "placement_rl.cli", "emulate", "--topology", "2x1", "--patterns", "p2p_inter"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    before = _system_state(process.pid)
    deadline = time.monotonic() + 120
    while _system_state(process.pid) == before:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command built no namespace in 120 s"
        time.sleep(0.1)
    time.sleep(1.0)  # building, or its workers are starting
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted" in err, err
    assert _system_state(process.pid) == before


@needs_netns
def test_a_failure_while_building_names_the_command_and_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _system_state()

    def broken(namespace: str, ifname: str, shaped: object, netem: bool) -> list[list[str]]:
        return [["-n", namespace, "qdisc", "add", "dev", ifname, "root", "no-such-qdisc"]]

    monkeypatch.setattr("placement_rl.emulate.cluster.shaping_commands", broken)
    with pytest.raises(EmulatorError, match=r"shaping m0/gpu0 <-> m0/pcie .*no-such-qdisc.* failed"):
        emulate(switched_cluster(2, 1), ["p2p_inter"])
    assert _system_state() == before


@needs_netns
def test_cleanup_removes_leftovers_of_dead_runs_only() -> None:
    dead = f"{EMULATOR_PREFIX}999999999-dead-fab"  # beyond any pid: a crashed run's namespace
    alive = f"{EMULATOR_PREFIX}{os.getpid()}-live-fab"  # this process's: a run still going
    for name in (dead, alive):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert cleanup_leftovers(f"{EMULATOR_PREFIX}999999999-") == ([dead], [])
        assert cleanup_leftovers(f"{EMULATOR_PREFIX}{os.getpid()}-") == ([], [alive])
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert dead not in namespaces and alive in namespaces
        with pytest.raises(EmulatorError, match="expected one starting with 'prlemu-'"):
            cleanup_leftovers("test-")
    finally:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.slow
@needs_netns
def test_the_benchmark_prints_the_comparison(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scripts import load_script

    module = load_script("benchmarks/network.py")
    argv = "--topologies 2x1 --patterns p2p_inter --repeats 1 --warmup 0 --message-mib 0.25".split()
    module.main(argv)
    out = capsys.readouterr().out
    assert out.startswith("`python benchmarks/network.py --topologies 2x1")
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header, _, row = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    cells = dict(zip(header, row, strict=True))
    assert cells["topology"] == "2x1@25" and cells["pattern"] == "p2p_inter" and float(cells["measured ms"]) > 0
    for model in network_models():
        assert float(cells[f"{model} ms"]) > 0 and cells[f"{model} err"].endswith("%")
    assert "2x1@25: scale 1/250" in out


def test_a_signal_swallowed_by_a_finalizer_still_interrupts() -> None:
    """SIGTERM handled inside a ``__del__`` (numba's finalizers run at any time) raises where Python drops
    the exception; the run must still end interrupted, not with status 0."""
    import os
    import signal

    from placement_rl.emulate.cluster import _Interrupted, _signals_interrupt

    class Finalizer:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs here, inside __del__
                pass

    with pytest.raises(_Interrupted, match="SIGTERM"), _signals_interrupt():
        Finalizer()  # dropped at once
