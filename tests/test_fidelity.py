"""Simulator fidelity (:mod:`placement_rl.execute.fidelity`): the link fit, the CPU topology, the report, the
worker's JSON, and one tiny run of real workers on this machine (marked slow)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from placement_rl.execute.fidelity import (
    CPU_DEVICE_TYPE,
    ROW_KEYS,
    FidelityCase,
    FidelityReport,
    LinkFit,
    cpu_cluster,
    fit_link,
    parse_cluster,
    run_fidelity,
)
from placement_rl.execute.nsworker import cost_model_from_dict, cost_model_to_dict, result_from_dict, result_to_dict
from placement_rl.execute.runtime import Event, IterationResult, WorkerResult
from placement_rl.sim.cost import CostModel, ProfileEntry, ProfileTable


def test_fit_link_recovers_latency_and_bandwidth() -> None:
    sizes = [4096.0, 65536.0, 2**20, 4 * 2**20]
    samples = [(s, 50e-6 + s / 1e9) for s in sizes for _ in range(3)]
    fit = fit_link(samples)
    assert fit.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-6)
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_link([(4096.0, 1e-4)])
    with pytest.raises(ValueError, match="do not grow"):
        fit_link([(4096.0, 2e-3), (2**20, 1e-3)])
    # one noisy large size (1 MiB slower than 4 MiB, as seen on a loaded machine) still fits
    noisy = [(4096.0, 1.8e-4), (65536.0, 1.1e-4), (262144.0, 3.7e-4), (2.0**20, 3.2e-3), (4.0 * 2**20, 2.8e-3)]
    assert fit_link(noisy).bandwidth_bytes_per_s > 0


def test_parse_cluster() -> None:
    assert parse_cluster("local") == ("local", 0, 0, 0.0)
    assert parse_cluster("emulated:2x1@1") == ("emulated", 2, 1, 1.0)
    assert parse_cluster("emulated:2x2@0.5") == ("emulated", 2, 2, 0.5)
    for bad in ("remote", "emulated:2", "emulated:0x1@1", "emulated:2x1@-1", "emulated:axb"):
        with pytest.raises(ValueError, match="expected 'local' or 'emulated:MxG@NIC'"):
            parse_cluster(bad)


def test_cpu_cluster_routes_through_the_nics() -> None:
    topo = cpu_cluster(2, 2, intra_bytes_per_s=8e8, intra_latency_s=1e-5, nic_bytes_per_s=1e8, nic_latency_s=2e-5)
    assert [d.name for d in topo.devices] == ["m0/cpu0", "m0/cpu1", "m1/cpu0", "m1/cpu1"]
    assert {d.device_type for d in topo.devices} == {CPU_DEVICE_TYPE}
    assert topo.devices[0].memory_bytes > 0
    between = topo.route("m0/cpu0", "m1/cpu0")
    within = topo.route("m0/cpu0", "m0/cpu1")
    assert between.bandwidth_bytes_per_s == pytest.approx(1e8)
    assert between.latency_s == pytest.approx(2 * 1e-5 + 2 * 2e-5)
    assert within.bandwidth_bytes_per_s == pytest.approx(8e8)
    with pytest.raises(ValueError, match="nic_bytes_per_s"):
        cpu_cluster(2, 1, intra_bytes_per_s=1e9)


def test_report_summary_and_table() -> None:
    topo = cpu_cluster(1, 2, intra_bytes_per_s=1e9)
    report = FidelityReport("local", 2, LinkFit(1e-4, 1e9), topo)
    for k, (measured, simulated) in enumerate([(10.0, 11.0), (20.0, 18.0), (40.0, 44.0)]):
        row = dict.fromkeys(ROW_KEYS)
        row.update(
            case=f"m/p{k}",
            batch_size=8,
            status="ok",
            measured_ms=measured,
            simulated_ms=simulated,
            profile_only_ms=simulated / 2,
            replayed_ms=measured,
            error=simulated / measured - 1,
            replay_error=0.0,
        )
        report.rows.append(row)
    failed = dict.fromkeys(ROW_KEYS)
    failed.update(case="m/bad", batch_size=8, status="NotExecutableError: attribute split")
    report.rows.append(failed)
    s = report.summary()
    assert s["cases"] == 4 and s["measured"] == 3
    assert s["spearman"] == pytest.approx(1.0)
    assert s["median_abs_error"] == pytest.approx(0.1)
    assert s["worst_abs_error"] == pytest.approx(0.1)
    assert s["replay_median_abs_error"] == 0.0
    assert s["profile_only_median_abs_error"] == pytest.approx(0.5, abs=0.06)
    text = "\n".join(report.lines())
    assert "| m/p0 | 8 | 10.00 | 11.00 | 5.50 | 10.00 | +10.0% | +0.0% | ok |" in text
    assert "NotExecutableError" in text and "Spearman 1.000" in text


def test_with_overheads_adds_to_every_entry_and_covers_views() -> None:
    from placement_rl.execute.fidelity import Overheads, with_overheads
    from placement_rl.execute.runtime import ModelSource

    graph = ModelSource("lenet", 8).graph()
    profile = ProfileTable({(CPU_DEVICE_TYPE, "relu", (8, 120), 0): ProfileEntry(1e-5, 2e-5)})
    table = with_overheads(profile, [graph], 2, Overheads(1e-4, 3e-4, 1e-5, 2e-6))
    assert table.lookup(CPU_DEVICE_TYPE, "relu", (8, 120), 0) == ProfileEntry(1e-5 + 1e-4, 2e-5 + 3e-4)
    flatten = next(op for op in graph.ops if op.op_type == "flatten")
    for shape in (flatten.output_shapes[0], (4, *flatten.output_shapes[0][1:])):
        assert table.lookup(CPU_DEVICE_TYPE, "flatten", shape, 0) == ProfileEntry(1e-5, 2e-6)


def test_worker_json_round_trips() -> None:
    result = WorkerResult(
        1, "m0/cpu1", [IterationResult(0.5, 2.25, [Event("compute_forward", 3, 0.1, 0.2)], 1024)], {"w": np.ones(2)}
    )
    back = result_from_dict(json.loads(json.dumps(result_to_dict(result))))
    assert back.rank == 1 and back.device == "m0/cpu1" and back.parameters == {}
    assert back.iterations == result.iterations
    profile = ProfileTable({("CPU", "linear", (8, 4), 64): ProfileEntry(1e-4, 2e-4)}, "cpu")
    model = CostModel(profile=profile, bucket_bytes=0, network="circuit")
    again = cost_model_from_dict(json.loads(json.dumps(cost_model_to_dict(model))))
    assert again == model


def test_fidelity_runs_cases_on_local_workers(tmp_path: Path) -> None:
    cases = [FidelityCase("lenet", 8, "single_device"), FidelityCase("lenet", 8, "data_parallel")]
    report = run_fidelity(cases, cluster="local", iterations=1, out_dir=tmp_path, profile_repeats=1, ping_repeats=3)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == ["lenet/single_device", "lenet/data_parallel"]
    for row, workers in zip(rows, (1, 2), strict=True):  # the devices the plan uses
        assert set(row) == set(ROW_KEYS)
        assert row["status"] == "ok" and row["cluster"] == "local" and row["workers"] == workers
        assert row["measured_ms"] > 0 and row["simulated_ms"] > 0 and row["replayed_ms"] > 0
        assert row["simulated_ms"] >= row["profile_only_ms"] > 0  # plus the executor's overheads
        assert len(row["iteration_ms"]) == 1 and len(row["overhead_ms"]) == workers
    assert rows[1]["sent_bytes"][0] > 0  # data parallel all-reduces its gradients
    assert report.rows == rows
    assert report.link.bandwidth_bytes_per_s > 0
    for name in ("link.json", "overheads.json", "topology.json", "profile.json", "comm_table.json"):
        assert (tmp_path / name).is_file()
    curves = json.loads((tmp_path / "comm_table.json").read_text())["curves"]
    assert len(curves["all_reduce/pcie"]) == 5  # gloo's all-reduce measured at every message size
    text = "\n".join(report.lines())
    assert "| lenet/data_parallel | 8 |" in text and "Spearman" in text


def _netns_reason() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    for program in ("ip", "tc"):
        if shutil.which(program) is None:
            return f"{program!r} is not installed"
    if os.geteuid() != 0:
        return "needs root"
    return None


@pytest.mark.skipif(_netns_reason() is not None, reason=f"no emulated cluster here: {_netns_reason()}")
def test_fidelity_on_an_emulated_cluster(tmp_path: Path) -> None:
    report = run_fidelity(
        [FidelityCase("lenet", 8, "layerwise")],
        cluster="emulated:2x1@1",
        iterations=1,
        out_dir=tmp_path,
        profile_repeats=1,
        ping_repeats=1,
        calibrate=False,  # the local test covers the calibration
    )
    (row,) = report.rows
    assert row["status"] == "ok" and row["measured_ms"] > 0
    # the shaped link: about 1 Gbit/s, not loopback's rate
    assert 0.3e9 / 8 < report.link.bandwidth_bytes_per_s < 1.5e9 / 8


def test_cli_refuses_bad_clusters_and_cases(capsys: pytest.CaptureFixture[str]) -> None:
    from placement_rl.cli import main

    assert main(["fidelity", "--cluster", "emulated:2"]) == 2
    assert "expected 'local' or 'emulated:MxG@NIC'" in capsys.readouterr().err
    assert main(["fidelity", "--cases", "lenet/nope"]) == 2
    assert "unknown cases ['lenet/nope']" in capsys.readouterr().err


def _measured(*args: object, **kwargs: object) -> object:
    raise AssertionError("something was measured")


def _row(case: str, status: str = "ok", cluster: str = "local") -> dict[str, object]:
    return {**dict.fromkeys(ROW_KEYS), "cluster": cluster, "case": case, "batch_size": 64, "status": status}


def test_an_earlier_run_in_out_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from placement_rl.cli import main

    monkeypatch.setattr("placement_rl.execute.fidelity.profile_cases", _measured)
    monkeypatch.setattr("placement_rl.execute.gpu_fidelity.run_gpu_fidelity", _measured)
    earlier = "".join(json.dumps(_row(c)) + "\n" for c in ("lenet/single_device", "lenet/data_parallel"))
    (tmp_path / "results.jsonl").write_text(earlier)
    for argv in (["--cases", "lenet/single_device"], ["--cluster", "gpu"]):
        assert main(["fidelity", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"--out {str(tmp_path)!r} holds an earlier run's files (results.jsonl)" in err
        assert "--resume" in err and "--overwrite" in err
    assert (tmp_path / "results.jsonl").read_text() == earlier  # nothing lost
    assert main(["fidelity", "--out", str(tmp_path), "--resume", "--overwrite"]) == 2
    assert "expected one of them" in capsys.readouterr().err
    assert main(["fidelity", "--cluster", "gpu", "--out", str(tmp_path), "--resume"]) == 2
    assert "--resume applies to --cluster local and emulated clusters" in capsys.readouterr().err


def test_check_out_dir_keeps_the_measured_rows_of_the_same_cluster(tmp_path: Path) -> None:
    from placement_rl.execute.fidelity import check_out_dir

    assert check_out_dir(tmp_path / "new") == [] and check_out_dir(tmp_path) == []  # new or empty: fine
    rows = [_row("lenet/single_device"), _row("lenet/expert", status="NotExecutableError: no")]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_out_dir(tmp_path, cluster="local", overwrite=True) == []
    assert check_out_dir(tmp_path, cluster="local", resume=True) == rows[:1]  # the failed case runs again
    with pytest.raises(ValueError, match=r"holds rows of cluster 'local', not 'emulated:2x1@1'"):
        check_out_dir(tmp_path, cluster="emulated:2x1@1", resume=True)
    (tmp_path / "results.jsonl").write_text("not a row\n")
    with pytest.raises(ValueError, match=r"results.jsonl line 1 is not a results row"):
        check_out_dir(tmp_path, resume=True)


def test_resume_runs_only_the_cases_not_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept rows stay in ``results.jsonl`` and the report; only the other case is executed (the
    measurements are stood in for: this checks the bookkeeping, not the workers)."""
    import placement_rl.execute.fidelity as fidelity
    from placement_rl.execute.fidelity import Overheads, select_cases

    ran: list[str] = []

    class Launcher:
        def ping_pong(self, *args: object, **kwargs: object) -> list[tuple[float, float]]:
            return [(4096.0, 1e-4), (2.0**20, 1e-3)]

        def all_reduce_times(self, *args: object, **kwargs: object) -> list[tuple[float, float]]:
            return [(4096.0, 2e-4), (2.0**20, 2e-3)]

        def bind(self, *args: object) -> None:
            return None

    def fake_execute(source: object, topology: object, plan: object, **kwargs: object) -> object:
        ran.append(getattr(plan, "name", "?"))
        raise RuntimeError("stood in")

    import contextlib

    monkeypatch.setattr(fidelity, "profile_cases", lambda *a, **k: ProfileTable({}, "cpu"))
    monkeypatch.setattr(fidelity, "measure_cpu", lambda: (1e10, 1e10))
    monkeypatch.setattr(fidelity, "_cluster", lambda *a: contextlib.nullcontext(Launcher()))
    monkeypatch.setattr(fidelity, "execute", fake_execute)
    kept = _row("lenet/single_device")
    (tmp_path / "results.jsonl").write_text(json.dumps(kept) + "\n")
    cases = select_cases(["lenet/single_device", "lenet/data_parallel"])
    report = run_fidelity(cases, out_dir=tmp_path, resume=True, calibrate=False, iterations=1)
    assert len(ran) == 1  # lenet/data_parallel only
    assert [r["case"] for r in report.rows] == ["lenet/single_device", "lenet/data_parallel"]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines[0] == kept and lines[1]["case"] == "lenet/data_parallel"
    assert report.overheads == Overheads(0.0, 0.0)
