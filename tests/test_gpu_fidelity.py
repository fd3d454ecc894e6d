"""The executor's GPU clock, the plain iteration and ``placement-rl fidelity --cluster gpu``, on the CPU.

No GPU here: the CUDA clock runs with fake events (on the CPU, and inside a real worker), the GPU's name is
matched against catalogue entries, the CUDA branch of the device resolution sees a faked ``torch.cuda``,
and the whole pipeline runs on the CPU through the same code (``device="cpu"``) with lenet at batch 8.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from placement_rl.execute import ModelSource, lower
from placement_rl.execute.fidelity import cpu_cluster
from placement_rl.execute.gpu_fidelity import (
    NoGpuError,
    batches_of,
    match_device_type,
    resolve_device,
    run_gpu_fidelity,
)
from placement_rl.execute.plain import MODES, math_mode, measure_plain_iterations
from placement_rl.execute.runtime import CudaClock, Event, WallClock, Worker
from placement_rl.plan import constructors
from placement_rl.topology.devices import DEVICE_TYPES, GIB, DeviceSpec

H200_DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200"


class ScriptedEvent:
    """A timing event whose record() takes the next time of a script (seconds)."""

    script: list[float] = []

    def record(self) -> None:
        self.t = ScriptedEvent.script.pop(0)

    def elapsed_time(self, other: ScriptedEvent) -> float:
        return (other.t - self.t) * 1e3


class HostEvent:
    """A timing event on the host clock: a CUDA event on a device that runs everything at once."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, other: HostEvent) -> float:
        return (other.t - self.t) * 1e3


def test_cuda_clock_resolves_stamps_after_the_iteration() -> None:
    clock = CudaClock(ScriptedEvent)
    ScriptedEvent.script = [10.0, 10.5, 10.75, 11.0]  # origin, then three stamps
    clock.start()
    a, b, c = clock.now(), clock.now(), clock.now()
    assert (a, b, c) == (0.0, 1.0, 2.0)  # stamps, no times yet
    events = clock.resolve([Event("compute_forward", 3, a, b), Event("send", 1, b, c)])
    assert events == [Event("compute_forward", 3, 0.5, 0.75), Event("send", 1, 0.75, 1.0)]
    # the next iteration reuses the events, and its times are relative to its own start
    ScriptedEvent.script = [20.0, 20.25, 21.0]
    clock.start()
    a, b = clock.now(), clock.now()
    assert clock.resolve([Event("compute_backward", 0, a, b)]) == [Event("compute_backward", 0, 0.25, 1.0)]
    assert len(clock._stamps) == 3


def test_a_worker_timed_by_the_cuda_clock_gives_the_wall_clocks_events() -> None:
    source = ModelSource("lenet", 4)
    graph = source.graph()
    topology = cpu_cluster(1, 1, intra_bytes_per_s=1e9)
    program = lower(graph, topology, constructors.single_device(graph, topology))
    assert not program.groups  # one worker: no torch.distributed call
    runs = {}
    for name, clock in (("wall", WallClock()), ("cuda", CudaClock(HostEvent))):
        worker = Worker(program, graph, source, 0, torch.device("cpu"), clock=clock)
        runs[name] = worker.run(2, barrier=lambda: None)
    wall, cuda = runs["wall"], runs["cuda"]
    assert cuda.iterations[0].loss == pytest.approx(wall.iterations[0].loss)
    for w_it, c_it in zip(wall.iterations, cuda.iterations, strict=True):
        assert [(e.kind, e.ref) for e in c_it.events] == [(e.kind, e.ref) for e in w_it.events]
        computes = [e for e in c_it.events if e.kind.startswith("compute_")]
        assert computes and all(0.0 <= e.start_s <= e.end_s <= c_it.time_s for e in c_it.events)
        starts = [e.start_s for e in computes]
        assert starts == sorted(starts)  # seconds since the iteration's start, in issue order
    assert len(cuda.iterations[0].events) == len(cuda.iterations[1].events)


def test_match_device_type_by_model_form_factor_and_memory() -> None:
    catalogue = {
        "H200": DeviceSpec(67e12, 141 * 10**9, 4.8e12),
        "H100-SXM5-80GB": DeviceSpec(67e12, 80 * GIB, 3.35e12),
        "A100-SXM4-40GB": DeviceSpec(19.5e12, 40 * GIB, 1.555e12),
        "A100-SXM4-80GB": DeviceSpec(19.5e12, 80 * GIB, 2.039e12),
        "L4": DeviceSpec(30.3e12, 24 * GIB, 300e9),
        "L40S": DeviceSpec(91.6e12, 48 * GIB, 864e9),
        "V100-SXM2-16GB": DeviceSpec(15.7e12, 16 * GIB, 900e9),
        "V100-SXM2-32GB": DeviceSpec(15.7e12, 32 * GIB, 900e9),
    }
    cases = {
        ("NVIDIA H200", 150_754_820_096): "H200",
        ("NVIDIA H100 80GB HBM3", 85_045_460_992): "H100-SXM5-80GB",
        ("NVIDIA A100-SXM4-80GB", 85_899_345_920): "A100-SXM4-80GB",
        ("NVIDIA A100-SXM4-40GB", 42_505_273_344): "A100-SXM4-40GB",
        ("NVIDIA A100 80GB PCIe", 85_899_345_920): "A100-SXM4-80GB",  # the closest the catalogue has
        ("NVIDIA L4", 23_580_639_232): "L4",
        ("NVIDIA L40S", 48_305_799_168): "L40S",
        ("Tesla V100-SXM2-32GB", 34_089_730_048): "V100-SXM2-32GB",
    }
    for (name, memory), expected in cases.items():
        assert match_device_type(name, memory, catalogue) == expected, name
    assert match_device_type("NVIDIA GeForce RTX 4090", 24 * GIB, catalogue) is None
    if "H200" in DEVICE_TYPES:  # the label of benchmarks/data/h200, an alias of the H200 SXM
        assert match_device_type("NVIDIA H200", 150_754_820_096) == "H200"


def test_the_cuda_device_is_resolved_from_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: SimpleNamespace(total_memory=79 * GIB))
    measured = resolve_device("cuda")
    assert (measured.torch_device, measured.device_type, measured.count) == ("cuda:0", "H100-SXM5-80GB", 2)
    (device,) = measured.topology.devices
    assert device.memory_bytes == 79 * GIB  # the GPU's own memory, the catalogue's peaks
    assert device.peak_flops_for("bf16") == pytest.approx(989.4e12)
    assert measured.topology.name == "h100-sxm5-80gbx1"
    assert resolve_device("cuda", "V100-SXM2-32GB").device_type == "V100-SXM2-32GB"
    with pytest.raises(ValueError, match="--device-type: unknown device type 'nope'"):
        resolve_device("cuda", "nope")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA GeForce RTX 4090")
    with pytest.raises(ValueError, match="matches no device type of the catalogue.*--device-type"):
        resolve_device("cuda")


def test_no_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGpuError, match="there is none.*--cluster local"):
        resolve_device("cuda")


def test_batches_of_keeps_the_splits_that_divide() -> None:
    assert batches_of(96, (1, 2, 4, 8)) == [96, 48, 24, 12]
    assert batches_of(6, (8, 1, 2, 4)) == [6, 3]


def test_math_mode_sets_tf32_and_restores_the_flags() -> None:
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    with math_mode("fp32"):
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, True)  # torch's defaults
    with math_mode("bf16-mixed"):
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
    assert (matmul.allow_tf32, cudnn.allow_tf32) == before
    with pytest.raises(ValueError, match="precision 'bf16'"):
        with math_mode("bf16"):
            pass


def test_plain_iterations_have_the_h200_datas_keys() -> None:
    rows = measure_plain_iterations("lenet", [8, 4], ["fp32", "bf16-mixed"], iterations=2, warmup=1)
    assert [(r.batch, r.precision) for r in rows] == [(8, "fp32"), (8, "bf16-mixed"), (4, "fp32"), (4, "bf16-mixed")]
    for r in rows:
        assert 0 < r.forward_ms <= r.fwd_bwd_ms <= r.iteration_ms and r.min_iteration_ms <= r.iteration_ms
        assert r.params == 61706 and r.peak_mem_bytes == 0 and r.loss > 0
    d = rows[1].to_dict()
    assert d["mode"] == MODES["bf16-mixed"] == "bf16"
    reference = H200_DATA / "iterations.jsonl"  # benchmarks/data/h200, in the repository
    assert set(json.loads(reference.read_text().splitlines()[0])) <= set(d)


def test_the_profile_gets_the_precision_when_profile_models_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import placement_rl.profiling as profiling
    from placement_rl.execute.gpu_fidelity import _profile_precision, profile_precision_mode

    def with_precision(models: Any, *, precision: str = "fp32", **kwargs: Any) -> None: ...

    def without(models: Any, **kwargs: Any) -> None: ...

    monkeypatch.setattr(profiling, "profile_models", with_precision)
    with _profile_precision("bf16-mixed", "cpu") as extra:
        assert extra == {"precision": "bf16-mixed"} and not torch.is_autocast_enabled("cpu")
    assert profile_precision_mode() == "profile_models(precision=...)"
    monkeypatch.setattr(profiling, "profile_models", without)
    with _profile_precision("bf16-mixed", "cpu") as extra:
        assert extra == {} and torch.is_autocast_enabled("cpu")  # the precision's autocast around the call
    assert not torch.is_autocast_enabled("cpu")


def test_cli_without_a_gpu_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from placement_rl.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["fidelity", "--cluster", "gpu", "--out", str(tmp_path / "gpu")]) == 2
    err = capsys.readouterr().err
    assert "error: --cluster gpu measures this machine's CUDA GPUs, and there is none" in err
    assert "--cluster local" in err
    assert not (tmp_path / "gpu").exists()


def test_cli_keeps_each_clusters_options_apart(capsys: pytest.CaptureFixture[str]) -> None:
    from placement_rl.cli import main

    assert main(["fidelity", "--cluster", "gpu", "--cases", "lenet/single_device"]) == 2
    assert "--cases applies to --cluster local and emulated clusters" in capsys.readouterr().err
    assert main(["fidelity", "--models", "lenet"]) == 2
    assert "--models applies to --cluster gpu" in capsys.readouterr().err
    assert main(["fidelity", "--cluster", "gpu", "--precisions", "fp33"]) == 2
    assert "unknown precision 'fp33'" in capsys.readouterr().err
    assert main(["fidelity", "--cluster", "remote"]) == 2
    assert "or 'gpu'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_gpu_pipeline_runs_on_the_cpu(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_gpu_fidelity(
        ["lenet"],
        out_dir=tmp_path,
        splits=(1, 2),
        iterations=1,
        warmup=1,
        profile_repeats=1,
        batch_size=8,
        log=lines.append,
        device="cpu",  # the same code path as on a GPU, with gloo and a CPU device
    )
    assert lines[-1].startswith("[5/5] simulated lenet") and not report.failures
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "iterations.jsonl",
        "iterations_shard_batches.jsonl",
        "executor_single_device.jsonl",
        "simulated.jsonl",
        "profile_fp32.json",
        "profile_bf16-mixed.json",
        "summary.json",
        "table.md",
        "topology_cpux1.json",
    }

    def jsonl(name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]

    full, shards = jsonl("iterations.jsonl"), jsonl("iterations_shard_batches.jsonl")
    assert [(r["batch"], r["mode"]) for r in full] == [(8, "default"), (8, "bf16")]
    assert [(r["batch"], r["mode"]) for r in shards] == [(4, "default"), (4, "bf16")]
    (executed,) = jsonl("executor_single_device.jsonl")
    assert executed["status"] == "ok" and executed["backend"] == "gloo" and executed["batch"] == 8
    assert executed["measured_ms"] > 0 and executed["replayed_ms"] > 0 and executed["profiled_ms"] > 0
    assert executed["overhead"] == pytest.approx(executed["measured_ms"] / full[0]["iteration_ms"])
    reference = H200_DATA / "executor_single_device.jsonl"  # the H200 data's keys, and more
    assert set(json.loads(reference.read_text().splitlines()[0])) - {"explanation"} <= set(executed)
    simulated = jsonl("simulated.jsonl")
    assert [(r["batch"], r["precision"], r["zoo_batch"]) for r in simulated] == [
        (8, "fp32", True),
        (8, "bf16-mixed", True),
        (4, "fp32", False),
        (4, "bf16-mixed", False),
    ]
    for r in simulated:
        assert r["analytic_ms"] > 0 and r["profiled_ms"] > 0
        assert r["profiled_error"] == pytest.approx(r["profiled_ms"] / r["measured_ms"] - 1)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device"]["device_type"] == "CPU" and summary["executor"]["ran"] == 1
    assert summary["errors"]["bf16-mixed"]["shard_batches"]["profiled"]["count"] == 1
    table = (tmp_path / "table.md").read_text()
    assert table.splitlines()[2].startswith("| model | batch | fp32 ms | fp32 analytic ms | fp32 profiled ms |")
    assert "| lenet | 8 |" in table and "| lenet | 4 |" in table and "executor / plain fp32 iteration" in table
    profile = json.loads((tmp_path / "profile_fp32.json").read_text())
    assert profile["format"] == "placement_rl.profile" and profile["entries"]
    topology = json.loads((tmp_path / "topology_cpux1.json").read_text())
    assert [d["name"] for d in topology["devices"]] == ["m0/cpu0"]
