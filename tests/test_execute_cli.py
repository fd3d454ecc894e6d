"""``placement-rl execute`` and the Ray Train launcher: real runs of lenet at batch 8 on two workers,
bad input refused before any worker starts, and failed or killed workers reported by rank."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from placement_rl.cli import main
from placement_rl.emulate.cluster import switched_cluster
from placement_rl.execute import ExecutionError, ModelSource, RunOptions, execute, lower, reference_step, run_local
from placement_rl.execute.runtime import Event, IterationResult, WorkerResult
from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.plan import constructors as pc
from placement_rl.rl.execute import _worker_message, check_resources, ray_train_launcher, read_results, write_results

TINY = ["--model", "lenet", "--batch-size", "8", "--iterations", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def lenet() -> tuple[ModelSource, OpGraph]:
    source = ModelSource("lenet", 8)
    return source, source.graph()


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a worker was started")


@pytest.fixture
def no_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the local launcher would start a worker."""
    monkeypatch.setattr("placement_rl.execute.run_local", _refuse)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one ``error:`` line of a command that must fail with status 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def _spawned_workers() -> list[psutil.Process]:
    """This process's ``multiprocessing`` spawn children (the local launcher's workers)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            out.append(child)
    return out


# ------------------------------------------------------------------------------ real runs
def test_execute_local_writes_the_report_and_both_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measured, simulated = tmp_path / "measured.json", tmp_path / "simulated.json"
    argv = ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--json"]
    assert main([*argv, "--trace", str(measured), "--sim-trace", str(simulated)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "lenet" and report["plan"] == "data_parallel" and report["topology"] == "1x2@25"
    assert report["devices"] == ["m0/gpu0", "m0/gpu1"]
    assert report["iterations"] == 1 and report["warmup"] == 0 and len(report["iteration_ms"]) == 1
    assert report["measured_ms"] > 0 and report["simulated_ms"] > 0 and report["replayed_ms"] > 0
    assert report["sent_bytes"] == report["simulated_sent_bytes"] and report["sent_bytes"][0] > 0
    assert any("uses 2 of 2 devices" in line for line in report["explanation"])
    # CPU workers timed against simulated T4s: the report says so and what to pass instead
    (note,) = report["notes"]
    assert "CPUs (gloo)" in note and "T4" in note and "--profile cpu-profile.json" in note
    lanes = {}
    for path in (measured, simulated):
        doc = json.loads(path.read_text())
        names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
        assert {"m0/gpu0", "m0/gpu1"} <= names
        spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        assert {"forward", "backward"} <= {e["cat"] for e in spans}
        assert all(e["dur"] >= 0 for e in spans)
        lanes[path.name] = names
    assert lanes["measured.json"] == lanes["simulated.json"]  # the measured trace has the simulated lanes


@pytest.mark.slow
def test_execute_runs_micro_batches_under_zero_from_a_plan_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lenet: tuple[ModelSource, OpGraph]
) -> None:
    """A schema-2 plan file (2 micro-batches, 1F1B, ZeRO-2) through the command: the single-device loss,
    the simulator's bytes, and a measured trace whose ZeRO buckets are timed."""
    source, graph = lenet
    plan = pc.zero(graph, pc.data_parallel(graph, switched_cluster(1, 2)).with_schedule(2, "1f1b"), stage=2)
    path, measured = tmp_path / "zero2.json", tmp_path / "measured.json"
    plan.to_json(path)
    argv = ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--plan", str(path), "--json"]
    assert main([*argv, "--trace", str(measured)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["loss"] == pytest.approx(reference_step(source)[0], rel=1e-4)
    assert report["sent_bytes"] == report["simulated_sent_bytes"] and report["sent_bytes"][0] > 0
    assert report["replayed_ms"] > 0
    assert any("2 micro-batches" in line for line in report["explanation"])
    assert any("ZeRO-2" in line for line in report["explanation"])
    spans = [e for e in json.loads(measured.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert {"forward", "backward", "all_reduce"} <= {e["cat"] for e in spans}
    assert all(e["dur"] >= 0 for e in spans)


def test_ray_train_launcher_matches_the_single_device_step(ray_local: Any, lenet: tuple[ModelSource, OpGraph]) -> None:
    source, graph = lenet
    topology = switched_cluster(1, 2)
    options = RunOptions(iterations=1, warmup=0)
    report = execute(source, topology, pc.data_parallel(graph, topology), graph=graph, options=options,
                     launcher=ray_train_launcher())  # fmt: skip
    loss, parameters = reference_step(source, seed=options.seed, lr=options.lr)
    assert report.loss == pytest.approx(loss, rel=1e-5)
    assert [r.rank for r in report.results] == [0, 1]
    assert report.sent_bytes() == report.program.sent_bytes().astype(int).tolist()
    for r in report.results:  # data parallelism: every worker holds every parameter, updated alike
        assert set(r.parameters) == set(parameters)
        for name, value in parameters.items():
            np.testing.assert_allclose(r.parameters[name], value.numpy(), rtol=1e-4, atol=1e-6)


def test_ray_train_worker_failures_are_named_by_rank() -> None:
    class WorkerGroupError(Exception):  # the shape of Ray Train v2's error: failures by rank
        worker_failures = {1: ValueError("model 'x:y': cannot import module 'x'"), 0: RuntimeError("boom")}

    message = _worker_message(WorkerGroupError("2 workers failed"))
    assert message.startswith("worker 0: RuntimeError: boom; worker 1: ValueError: model 'x:y'")


def test_a_killed_local_worker_fails_the_run_and_leaves_no_process(lenet: tuple[ModelSource, OpGraph]) -> None:
    source, graph = lenet
    topology = switched_cluster(1, 2)
    program = lower(graph, topology, pc.data_parallel(graph, topology))
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            run_local(program, graph, source, RunOptions(iterations=1, warmup=0), timeout_s=120.0)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60.0
    workers: list[psutil.Process] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = _spawned_workers()
        time.sleep(0.05)
    assert len(workers) == 2, "the two workers did not start"
    rank1 = max(workers, key=lambda p: (p.create_time(), p.pid))  # started second
    rank1.kill()
    thread.join(timeout=60.0)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert isinstance(error, ExecutionError), error
    assert "worker 1 (m0/gpu1) died with exit code -9" in str(error)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
    assert _spawned_workers() == []


# ------------------------------------------------------------------ bad input, before any worker
def test_a_plan_for_another_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lenet: tuple[ModelSource, OpGraph], no_workers: None
) -> None:
    _, graph = lenet
    doc = pc.data_parallel(graph, switched_cluster(1, 2)).to_dict()
    path = tmp_path / "alexnet_plan.json"
    path.write_text(json.dumps({**doc, "graph": "alexnet"}))
    err = _error(capsys, ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--plan", str(path)])
    assert str(path) in err and "'alexnet'" in err and "'lenet'" in err


def test_a_plan_for_another_topology_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lenet: tuple[ModelSource, OpGraph], no_workers: None
) -> None:
    _, graph = lenet
    path = tmp_path / "plan_2x2.json"
    pc.data_parallel(graph, switched_cluster(2, 2)).to_json(path)
    err = _error(capsys, ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--plan", str(path)])
    assert "'m1/gpu0'" in err and "m0/gpu0" in err


def test_an_attribute_split_is_not_executable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lenet: tuple[ModelSource, OpGraph], no_workers: None
) -> None:
    _, graph = lenet
    topology = switched_cluster(1, 2)
    plan = pc.data_parallel(graph, topology)
    split = OpConfig.make([d.name for d in topology.devices], {"height": 2})
    path = tmp_path / "height.json"
    Plan(graph.name, {**plan.configs, "features_0": split}, name="height").to_json(path)
    err = _error(capsys, ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--plan", str(path)])
    assert "'features_0'" in err and "attribute dimension 'height'" in err


def test_a_factory_that_does_not_import_is_refused(capsys: pytest.CaptureFixture[str], no_workers: None) -> None:
    err = _error(capsys, ["execute", "--model", "no_such_package.models:build", "--topology", "1x2"])
    assert "'no_such_package.models:build'" in err and "cannot import module 'no_such_package.models'" in err


@pytest.mark.parametrize("model", ["hf:GPT2LMHeadModel", "lenet.json"])
def test_models_without_code_are_refused(capsys: pytest.CaptureFixture[str], model: str, no_workers: None) -> None:
    err = _error(capsys, ["execute", "--model", model, "--topology", "1x2"])
    assert repr(model) in err and "package.module:factory" in err


def test_more_workers_than_ray_cpus_is_refused(
    ray_local: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.train.torch

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", _refuse)
    err = _error(capsys, ["execute", *TINY, "--topology", "2x2", "--launcher", "ray"])
    assert "4 workers x 1 thread(s) need 4 CPUs; the Ray cluster has 2" in err


def test_device_notes_only_when_the_simulated_devices_are_not_the_workers() -> None:
    from placement_rl.cli.execute import device_notes

    gpus = switched_cluster(1, 2)
    assert device_notes(gpus, "nccl", None, "lenet") == []  # GPU workers: the topology's own devices
    assert device_notes(gpus, "gloo", "cpu.json", "lenet") == []  # a profile of the workers given
    (note,) = device_notes(gpus, "gloo", None, "lenet")
    assert "--device-type T4 --models lenet" in note


def test_check_resources_counts_threads_and_gpus() -> None:
    check_resources(2, RunOptions(threads=1), {"CPU": 2.0})
    with pytest.raises(ValueError, match=r"2 workers x 2 thread\(s\) need 4 CPUs; the Ray cluster has 3"):
        check_resources(2, RunOptions(threads=2), {"CPU": 3.0})
    with pytest.raises(ValueError, match=r"2 workers under backend 'nccl' need a GPU each; the Ray cluster has 1"):
        check_resources(2, RunOptions(backend="nccl"), {"CPU": 8.0, "GPU": 1.0})


def test_worker_results_round_trip_through_the_checkpoint_files(tmp_path: Path) -> None:
    events = [Event("compute_forward", 3, 0.25, 0.5), Event("send", 0, 0.5, 0.5)]
    results = [
        WorkerResult(
            rank,
            f"m0/gpu{rank}",
            [IterationResult(0.125 * (rank + 1), 2.5, events, 1024 * rank)],
            {"head.0.weight#0/2": np.arange(6, dtype=np.float32).reshape(2, 3) + rank, "head.0.bias": np.ones(3)},
        )
        for rank in (1, 0)
    ]
    write_results(results, tmp_path)
    back = read_results(tmp_path)
    assert [r.rank for r in back] == [0, 1]
    for got, want in zip(back, sorted(results, key=lambda r: r.rank), strict=True):
        assert (got.device, got.iterations) == (want.device, want.iterations)
        assert set(got.parameters) == set(want.parameters)
        for name, value in want.parameters.items():
            assert got.parameters[name].dtype == value.dtype
            np.testing.assert_array_equal(got.parameters[name], value)


def test_a_storage_path_without_ray_is_refused(capsys: pytest.CaptureFixture[str], no_workers: None) -> None:
    argv = ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--storage-path", "runs"]
    err = _error(capsys, argv)
    assert "--storage-path 'runs' applies to --launcher ray, not 'local'" in err


def _small_memory_topology(path: Path, memory_bytes: int) -> Path:
    doc = switched_cluster(1, 2).to_dict()
    for device in doc["devices"]:
        device["memory_bytes"] = memory_bytes
    path.write_text(json.dumps(doc))
    return path


def test_a_plan_that_does_not_fit_is_refused_before_any_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_workers: None
) -> None:
    topology = _small_memory_topology(tmp_path / "tiny_gpus.json", 2**20)  # 1 MiB devices; lenet needs more
    err = _error(capsys, ["execute", *TINY, "--topology", str(topology), "--launcher", "local"])
    assert "does not fit in memory" in err and "'m0/gpu0' (T4) peaks at" in err and "of its 0.000977 GiB" in err
    assert "1,048,576 bytes" in err and "CPU workers emulate the topology's devices" in err


def test_check_memory_names_the_device_its_peak_and_its_capacity(
    tmp_path: Path, lenet: tuple[ModelSource, OpGraph]
) -> None:
    from placement_rl.execute import check_memory
    from placement_rl.topology import DeviceTopology

    source, graph = lenet
    topology = DeviceTopology.from_json(_small_memory_topology(tmp_path / "t.json", 2**20))
    with pytest.raises(ValueError, match=r"'m0/gpu0' \(T4\) peaks at .* GiB \([\d,]+ bytes\) of its") as info:
        execute(source, topology, pc.data_parallel(graph, topology), graph=graph, launcher=_refuse)
    assert "'m0/gpu1'" in str(info.value)
    fits = switched_cluster(1, 2)
    check_memory(lower(graph, fits, pc.data_parallel(graph, fits)), fits)  # 16 GiB T4s: fits


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        ("100000x100000", "switched cluster 100000x100000: 10,000,000,000 devices; expected at most 100,000"),
        ("1x65", "the plan runs on 65 devices: local workers are one process per device on this machine, at most 64"),
    ],
)
def test_oversized_topologies_are_refused_at_once(
    capsys: pytest.CaptureFixture[str], topology: str, message: str, no_workers: None
) -> None:
    argv = ["execute", "--model", "lenet", "--batch-size", "130", "--topology", topology, "--launcher", "local"]
    assert message in _error(capsys, argv)


def test_emulate_refuses_oversized_topologies_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, ["emulate", "--topology", "100000x100000", "--dry-run"])
    assert "10,000,000,000 devices; expected at most 100,000" in err
    err = _error(capsys, ["emulate", "--topology", "1x17", "--dry-run"])
    assert "has 17 devices; the emulator runs one process per device on this machine and takes at most 16" in err


def test_process_launcher_refuses_more_workers_than_the_limit() -> None:
    from placement_rl.execute.local import MAX_LOCAL_WORKERS
    from placement_rl.execute.processes import ProcessLauncher

    launcher = ProcessLauncher(_refuse)
    with pytest.raises(ValueError, match=f"at most {MAX_LOCAL_WORKERS}"):
        launcher.ping_pong(MAX_LOCAL_WORKERS + 1, 1, [4096])


def test_master_addr_applies_to_the_ray_launcher(capsys: pytest.CaptureFixture[str], no_workers: None) -> None:
    argv = ["execute", *TINY, "--topology", "1x2", "--launcher", "local", "--master-addr", "10.0.0.1"]
    assert "--master-addr '10.0.0.1' applies to --launcher ray, not 'local'" in _error(capsys, argv)
