"""benchmarks/collectives.py: the simulator's all-reduce times in nccl-tests' format. On ``trinity`` (four
GPUs on one PCIe switch, 12 GB/s and 5 us per link) the ring's time is known by hand; bandwidths follow
nccl-tests' definitions; bus bandwidth stays within the links the topology states; bad input is one
``error:`` line."""

from __future__ import annotations

import functools
import json
from types import ModuleType
from typing import Any

import pytest
from scripts import load_script

from placement_rl.sim.cost import CostModel
from placement_rl.topology import load_preset

PCIE_BYTES_PER_S, PCIE_LATENCY_S = 12e9, 5e-6  # trinity's links (checked below against the preset)
SWEEP = ["--topology", "trinity", "--min-bytes", "1K", "--max-bytes", "1G", "--factor", "32"]
SIZES = [2**10, 2**15, 2**20, 2**25, 2**30]
KEYS = "op topology devices network type size_bytes count_elements time_us algbw_gbps busbw_gbps".split()


@functools.cache
def _bench() -> ModuleType:
    return load_script("benchmarks/collectives.py")


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    _bench().main(argv)
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def _json_rows(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _out(capsys, [*argv, "--json"]).splitlines()]


def _ring_time_us(num_bytes: int, n: int) -> float:
    """A ring all-reduce over ``n`` of trinity's GPUs: each hop GPU -> switch -> GPU, sharing no link direction."""
    return (2 * (n - 1) / n * num_bytes / PCIE_BYTES_PER_S + 2 * (n - 1) * 2 * PCIE_LATENCY_S) * 1e6


def test_trinity_states_the_links_the_hand_formula_uses() -> None:
    topology = load_preset("trinity")
    assert topology.num_devices == 4 and len(topology.machines()) == 1
    assert {(link.bandwidth_bytes_per_s, link.latency_s) for link in topology.links} == {
        (PCIE_BYTES_PER_S, PCIE_LATENCY_S)
    }
    assert _bench().DEFAULT_NETWORK == CostModel().network == "flow"


@pytest.mark.parametrize("network", ["flow", "circuit", "pairwise"])
@pytest.mark.parametrize("devices", [2, 4])
def test_table_times_are_the_ring_all_reduce(capsys: pytest.CaptureFixture[str], network: str, devices: int) -> None:
    bench = _bench()
    out = _out(capsys, [*SWEEP, "--devices", str(devices), "--network", network])
    lines = out.splitlines()
    header = next(k for k, line in enumerate(lines) if "size" in line and "busbw" in line)
    assert lines[header].split() == ["#", "size", "count", "type", "time", "algbw", "busbw"]
    assert lines[header + 1].split() == ["#", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"]
    assert f"over {devices} devices of trinity" in lines[0] and f"network model {network}" in lines[0]
    rows = [line.split() for line in lines[header + 2 :] if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == SIZES
    assert [int(r[1]) for r in rows] == [s // 4 for s in SIZES] and {r[2] for r in rows} == {"float"}
    times = [float(r[3]) for r in rows]
    assert times == sorted(times) and len(set(times)) == len(times)  # grows with every size
    for row, size in zip(rows, SIZES, strict=True):
        expected_us = _ring_time_us(size, devices)
        assert row[3] == bench.float_str(expected_us, 7).strip()
        algbw = size / (expected_us * 1e-6) / 1e9
        assert row[4:] == [
            bench.float_str(algbw, 6).strip(),
            bench.float_str(algbw * 2 * (devices - 1) / devices, 6).strip(),
        ]
    assert lines[-1].startswith("# Avg bus bandwidth    : ")


def test_json_rows_follow_nccl_tests_bandwidths_and_match_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    rows = _json_rows(capsys, SWEEP)
    assert [r["size_bytes"] for r in rows] == SIZES
    for r in rows:
        assert set(r) == set(KEYS)
        assert (r["op"], r["topology"], r["devices"], r["network"], r["type"]) == (
            "all_reduce",
            "trinity",
            4,
            "flow",
            "float",
        )
        assert r["count_elements"] * 4 == r["size_bytes"]
        assert r["time_us"] == pytest.approx(_ring_time_us(r["size_bytes"], 4), rel=1e-12)
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] / 1e6) / 1e9, rel=1e-12)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 3 / 4, rel=1e-12)
    table = [line for line in _out(capsys, SWEEP).splitlines() if not line.startswith("#")]
    as_rows = [
        bench.Row(r["size_bytes"], r["count_elements"], r["time_us"], r["algbw_gbps"], r["busbw_gbps"]) for r in rows
    ]
    assert table == bench.table_lines(as_rows)[2:]


def test_busbw_at_the_largest_size_is_within_the_link_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    # one PCIe switch: every GPU's one link bounds it, and a 1 GiB ring comes within 1% of it
    pcie = min(link.bandwidth_bytes_per_s for link in load_preset("trinity").links) / 1e9
    last = _json_rows(capsys, SWEEP)[-1]
    assert 0.99 * pcie <= last["busbw_gbps"] <= pcie
    # one DGX H100: each GPU's NVSwitch link
    topology = load_preset("dgx-h100-x2")
    gpu_links = [link for link in topology.links if link.a == "m0/gpu0" or link.b == "m0/gpu0"]
    nvswitch = max(link.bandwidth_bytes_per_s for link in gpu_links if link.kind == "nvswitch") / 1e9
    one = ["--topology", "dgx-h100-x2", "--min-bytes", "8G", "--max-bytes", "8G"]
    last = _json_rows(capsys, [*one, "--machines", "1"])[-1]
    assert last["devices"] == 8 and 0.99 * nvswitch <= last["busbw_gbps"] <= nvswitch
    # two DGX H100s: each machine's eight NICs together (one InfiniBand link per GPU) bound it
    devices = {d.name for d in topology.devices if d.machine == "m0"}
    nics = [link for link in topology.links if link.kind == "infiniband" and ({link.a, link.b} & devices)]
    assert len(nics) == 8
    nic_sum = sum(link.bandwidth_bytes_per_s for link in nics) / 1e9
    last = _json_rows(capsys, one)[-1]
    assert last["devices"] == 16 and 0.95 * nic_sum <= last["busbw_gbps"] <= nic_sum < nvswitch


BAD = {
    "unknown topology": (["--topology", "nope"], "--topology nope: unknown topology 'nope'; expected one of:"),
    "missing file": (["--topology", "/nonexistent/x.json"], "--topology /nonexistent/x.json: "),
    "too many devices": (["--topology", "trinity", "--devices", "5"], "--devices 5: topology 'trinity' has 4 devices"),
    "one device": (
        ["--topology", "trinity", "--devices", "1"],
        "--devices 1: topology 'trinity' has 4 devices; expected",
    ),
    "too many machines": (["--topology", "trinity", "--machines", "2"], "--machines 2: topology 'trinity' has 1 mach"),
    "no device": (["--topology", "trinity", "--devices", "0"], "--devices 0: topology 'trinity' has 4 devices"),
    "devices and machines": (["--devices", "2", "--machines", "1"], "argument --machines: not allowed with argument"),
    "min over max": (["--min-bytes", "1M", "--max-bytes", "1K"], "--min-bytes 1048576 is more than --max-bytes 1024"),
    "factor 1": (["--factor", "1"], "argument --factor: '1': expected an integer >= 2"),
    "factor 0.5": (["--factor", "0.5"], "argument --factor: '0.5': expected an integer >= 2"),
    "size not a number": (["--max-bytes", "lots"], "argument --max-bytes: 'lots' is not a byte count"),
    "unknown suffix": (["--min-bytes", "8Q"], "argument --min-bytes: '8Q' is not a byte count"),
    "over 1 TiB": (["--max-bytes", "2T"], "argument --max-bytes: '2T' is 2199023255552 bytes; expected at most 1T"),
    "under one element": (["--min-bytes", "2"], "--min-bytes 2: expected at least 4 (one float element)"),
    "unknown op": (["--op", "reduce"], "argument --op: invalid choice: 'reduce'"),
    "unknown network": (["--network", "fluid"], "argument --network: invalid choice: 'fluid'"),
    "broadcast": (["--op", "broadcast"], "--op broadcast: the simulator has no broadcast collective"),
    "all_gather": (["--op", "all_gather"], "each all-gather half an all-reduce); only all_reduce is timed"),
    "reduce_scatter": (["--op", "reduce_scatter"], "--op reduce_scatter: the simulator has no reduce-scatter"),
    "all_to_all": (["--op", "all_to_all"], "point-to-point transfer tasks"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_error_line(capsys: pytest.CaptureFixture[str], case: str) -> None:
    argv, message = BAD[case]
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""
