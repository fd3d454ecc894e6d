"""Op profiling: entries for every costed op of a zoo graph, at the full batch and its partitions, under
their op names and their shape keys; the profile format (schema 2, schema 1 still read); precisions;
the CUDA timing loop, on a simulated GPU."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_leaves

from placement_rl import profiling
from placement_rl.cli import main
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.plan import single_device
from placement_rl.profiling import profile_models
from placement_rl.sim import simulate
from placement_rl.sim.cost import CostModel, ProfileEntry, ProfileTable
from placement_rl.sim.result import TASK_KINDS
from placement_rl.topology import Device, DeviceTopology

SHARED_FP32 = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200" / "profile_fp32.json"


@pytest.fixture(scope="module")
def lenet_table() -> Iterator[ProfileTable]:
    """LeNet at batch 8 and its 2-way partitions (batch 4), profiled once for the module.

    Single-threaded: on small shared VMs, waking the second intra-op thread can stall an op for
    milliseconds, far longer than LeNet's ops take. The tests check what was recorded (which keys,
    finite non-negative times), never how measured times compare: those depend on the machine's load.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield profile_models(["lenet"], batch_size=8, batch_splits=(1, 2), repeats=2, progress=False)
    finally:
        torch.set_num_threads(threads)


def _costed(graph: OpGraph) -> list[Any]:
    return [op for op in graph.ops if op.forward_flops > 0]


def _shape_keys(graph: OpGraph) -> set[tuple[Any, ...]]:
    return {("CPU", op.op_type, tuple(op.output_shapes[0]), op.param_bytes, None) for op in _costed(graph)}


def _named_keys(graph: OpGraph) -> set[tuple[Any, ...]]:
    return {("CPU", op.op_type, tuple(op.output_shapes[0]), op.param_bytes, op.name) for op in _costed(graph)}


def test_entries_cover_the_batch_and_its_partitions(
    lenet_table: ProfileTable, zoo_graph: Callable[..., OpGraph]
) -> None:
    assert lenet_table.device.startswith("CPU")
    assert (lenet_table.precision, lenet_table.timing) == ("fp32", "wall")
    full, half = zoo_graph("lenet", batch_size=8), zoo_graph("lenet", batch_size=4)
    full_conv, half_conv = (next(op for op in g.ops if op.op_type == "conv2d") for g in (full, half))
    assert full_conv.output_shapes[0] == (8, 6, 28, 28) and half_conv.output_shapes[0] == (4, 6, 28, 28)
    # Exactly one name-less entry per distinct costed (op type, shape, parameter bytes) of either batch
    # size, and one per op name at each: the partitions' shapes are measured, not scaled from the full
    # batch, and nothing else is recorded.
    assert set(lenet_table.entries) == _shape_keys(full) | _shape_keys(half) | _named_keys(full) | _named_keys(half)
    batched = {key for key in _shape_keys(full) if key[2][:1] == (8,)}
    assert len(batched) == 11  # every op but the scalar loss carries the batch axis
    for device_type, op_type, shape, param_bytes, _ in batched:
        assert lenet_table.lookup(device_type, op_type, (4, *shape[1:]), param_bytes) is not None
    for entry in lenet_table.entries.values():
        for seconds in (entry.forward_s, entry.backward_s):
            assert math.isfinite(seconds) and seconds >= 0
        assert entry.host_forward_s is None and entry.host_backward_s is None  # the CPU measures no host time
    conv = lenet_table.lookup("CPU", "conv2d", full_conv.output_shapes[0], full_conv.param_bytes)
    assert conv is not None and conv.forward_s > 0


def test_every_costed_op_finds_its_own_entry(lenet_table: ProfileTable, zoo_graph: Callable[..., OpGraph]) -> None:
    for batch_size in (8, 4):
        costed = _costed(zoo_graph("lenet", batch_size=batch_size))
        assert costed
        for op in costed:
            key = ("CPU", op.op_type, op.output_shapes[0], op.param_bytes)
            named = lenet_table.entries[(*key, op.name)]
            assert lenet_table.lookup(*key, op_name=op.name) is named
            # The shape key's fallback is the first op measured with it (no two LeNet ops share one).
            assert lenet_table.lookup(*key) == named == lenet_table.lookup(*key, op_name="not_an_op")


def test_the_profiled_partitions_time_each_micro_batch_under_its_op_name(
    lenet_table: ProfileTable, zoo_graph: Callable[..., OpGraph]
) -> None:
    """Two micro-batches of batch 8 on one device: every op's forward takes its measured batch-4 time
    (the 2-way split's named entry) in each micro-batch; the scalar loss, one shape at every batch,
    half its batch-8 time. No op falls back to the analytic model."""
    graph, half = zoo_graph("lenet", batch_size=8), zoo_graph("lenet", batch_size=4)
    cpu = DeviceTopology("cpu", [Device("cpu0", "CPU", "host", 1e11, 2**33, 1e10)], [])
    cost = CostModel(profile=lenet_table, execution_mode="cuda_graphs")  # no host lane: GPU times alone
    result = simulate(graph, cpu, single_device(graph, cpu).with_schedule(2), cost)
    assert cost.analytic_ops == {}
    forward = result.tasks.kind == TASK_KINDS.index("forward")
    for op in _costed(half):
        entry = lenet_table.entries["CPU", op.op_type, op.output_shapes[0], op.param_bytes, op.name]
        expected = entry.forward_s / 2 if op.output_shapes[0] == () else entry.forward_s
        mine = forward & (result.tasks.op == graph.index(op.name))
        assert (result.tasks.end_s - result.tasks.start_s)[mine].tolist() == pytest.approx([expected] * 2), op.name


def test_table_round_trips_through_json(lenet_table: ProfileTable, tmp_path: Path) -> None:
    path = tmp_path / "lenet_profile.json"
    lenet_table.to_json(path)
    assert ProfileTable.from_json(path) == lenet_table


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(UnknownNameError, match="unknown model 'lenet9000'"):
        profile_models(["lenet9000"], progress=False)
    with pytest.raises(ValueError, match="batch split 3 does not divide the batch size 8"):
        profile_models(["lenet"], batch_size=8, batch_splits=(1, 3), progress=False)
    with pytest.raises(UnknownNameError, match="option of model 'lenet' 'colour'"):
        profile_models(["lenet"], batch_size=8, options={"lenet": {"colour": "red"}}, progress=False)


def test_bad_precisions_are_rejected(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="unknown precision 'bf8'; expected one of: bf16-mixed, fp16-mixed"):
        profile_models(["lenet"], batch_size=2, progress=False, precision="bf8")
    with pytest.raises(ValueError, match="precision 'tf32' on cpu: TF32 is a math mode of CUDA tensor cores"):
        profile_models(["lenet"], batch_size=2, progress=False, precision="tf32")
    argv = ["profile", "--out", str(tmp_path / "p.json"), "--models", "lenet", "--precision", "fp8"]
    assert main(argv) == 2
    assert "unknown precision 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_functions_methods_and_tied_weights_match_the_importer(zoo_graph: Callable[..., OpGraph]) -> None:
    """BERT: explicit matmuls, softmax and adds, buffers, and a decoder tied to the word embedding."""
    options = {"num_layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab_size": 100}
    table = profile_models(["bert_small"], batch_size=2, repeats=1, progress=False, options={"bert_small": options})
    graph = zoo_graph("bert_small", batch_size=2, **options)
    costed = _costed(graph)
    assert {"matmul", "softmax", "add", "layer_norm", "gelu", "cross_entropy"} <= {op.op_type for op in costed}
    for op in costed:
        key = ("CPU", op.op_type, op.output_shapes[0], op.param_bytes)
        assert table.lookup(*key) is not None, op.name
        assert (*key, op.name) in table.entries, op.name
    decoder = next(op for op in graph.ops if op.param_key == "decoder")
    assert decoder.param_bytes == 100 * 4  # the tied weight counts under the word embedding: bias only


def test_max_ops_per_model_stops_early() -> None:
    table = profile_models(["lenet"], batch_size=2, repeats=1, max_ops_per_model=2, progress=False)
    assert sorted((op_type, name) for _, op_type, _, _, name in table.entries if name) == [
        ("conv2d", "features_0"),
        ("relu", "features_1"),
    ]
    assert sorted(op_type for _, op_type, _, _, name in table.entries if name is None) == ["conv2d", "relu"]


def test_op_names_tell_apart_ops_of_one_shape_key(
    monkeypatch: pytest.MonkeyPatch, zoo_graph: Callable[..., OpGraph]
) -> None:
    """ResNet-50: the stride-2 3x3 convolution opening layer2 and the stride-1 ones after it share a shape
    key (output shape and parameter bytes) but not their work: each gets its own measurement, while
    ops with the same signature (module hyperparameters, parameter and input shapes) share one.
    A counting stand-in for the timer numbers the measurements, so nothing here depends on the clock."""
    count = itertools.count(1)

    def numbered(self: Any, call: Any, grad_inputs: Any, repeats: int) -> tuple[ProfileEntry, bool]:
        return ProfileEntry(float(next(count)), 0.0), True

    monkeypatch.setattr(profiling._WallTimer, "time_op", numbered)
    options = {"image_size": 32, "num_classes": 10}
    table = profile_models(["resnet50"], batch_size=2, repeats=1, progress=False, options={"resnet50": options})
    graph = zoo_graph("resnet50", batch_size=2, **options)
    ops = {op.name: op for op in graph.ops}
    first, second, third = (ops[f"features_layer2_{i}_residual_1_conv"] for i in range(3))
    key = ("CPU", "conv2d", first.output_shapes[0], first.param_bytes)
    assert all((op.op_type, op.output_shapes[0], op.param_bytes) == key[1:] for op in (second, third))
    stride2, stride1 = table.lookup(*key, op_name=first.name), table.lookup(*key, op_name=second.name)
    assert stride2 is not None and stride1 is not None and stride2 != stride1
    assert table.lookup(*key, op_name=third.name) == stride1  # the same conv on the same input: one measurement
    assert table.lookup(*key) == stride2  # the name-less fallback is the first op measured
    assert table.lookup(*key, op_name="not_an_op") == stride2
    named = {k[4]: e for k, e in table.entries.items() if k[4] is not None}
    assert set(named) == {op.name for op in _costed(graph)}
    measurements = next(count) - 1
    assert len({e.forward_s for e in named.values()}) == measurements < len(named) // 2


def test_bf16_mixed_runs_every_op_under_autocast_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    dtypes: set[torch.dtype] = set()
    timed = profiling._WallTimer.time_op

    def spy(self: Any, call: Any, grad_inputs: Any, repeats: int) -> tuple[ProfileEntry, bool]:
        dtypes.update(t.dtype for t in tree_leaves(call()) if isinstance(t, torch.Tensor))
        return timed(self, call, grad_inputs, repeats)

    monkeypatch.setattr(profiling._WallTimer, "time_op", spy)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    table = profile_models(["lenet"], batch_size=2, repeats=1, progress=False, precision="bf16-mixed")
    assert (table.precision, table.timing) == ("bf16-mixed", "wall")
    assert torch.bfloat16 in dtypes  # the convolutions and linear layers ran in bf16
    assert all(math.isfinite(e.forward_s) and e.forward_s >= 0 for e in table.entries.values())
    # Autocast and TF32 are as they were.
    assert not torch.is_autocast_enabled("cpu")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == tf32
    with pytest.raises(ValueError, match="measured in precision 'bf16-mixed', but the run uses precision 'fp32'"):
        table.check_precision("fp32", "--profile bf16.json")
    table.check_precision("bf16-mixed", "--profile bf16.json")


def test_cli_records_the_precision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lenet_bf16.json"
    argv = ["profile", "--out", str(out), "--models", "lenet", "--batch-size", "2", "--repeats", "1"]
    assert main([*argv, "--precision", "bf16-mixed", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["precision"], report["timing"]) == ("bf16-mixed", "wall")
    document = json.loads(out.read_text())
    assert (document["schema_version"], document["precision"], document["timing"]) == (2, "bf16-mixed", "wall")
    assert ProfileTable.from_json(out).precision == "bf16-mixed"


# ------------------------------------------------------------------ the format


def _schema_1() -> dict[str, Any]:
    return {
        "format": "placement_rl.profile",
        "schema_version": 1,
        "device": "V100 box",
        "entries": [
            {"device_type": "V100", "op_type": "conv2d", "output_shape": [8, 4], "param_bytes": 64,
             "forward_s": 1e-3, "backward_s": 3e-3},
            {"device_type": "V100", "op_type": "relu", "output_shape": [8, 4], "param_bytes": 0,
             "forward_s": 1e-4, "backward_s": 2e-4},
        ],
    }  # fmt: skip


def test_schema_1_files_load_as_before(tmp_path: Path) -> None:
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_schema_1()), encoding="utf-8")
    table = ProfileTable.from_json(path)
    assert (table.device, table.precision, table.timing) == ("V100 box", "", "synchronized")
    assert table == ProfileTable(
        {
            ("V100", "conv2d", (8, 4), 64): ProfileEntry(1e-3, 3e-3),
            ("V100", "relu", (8, 4), 0): ProfileEntry(1e-4, 2e-4),
        },
        device="V100 box",
    )
    assert set(table.entries) == {("V100", "conv2d", (8, 4), 64, None), ("V100", "relu", (8, 4), 0, None)}
    assert table.lookup("V100", "conv2d", [8, 4], 64) == ProfileEntry(1e-3, 3e-3, None, None)
    assert table.lookup("V100", "conv2d", (8, 4), 64, op_name="conv1") == ProfileEntry(1e-3, 3e-3)
    assert table.lookup("V100", "conv2d", (8, 4), 65) is None and table.lookup("T4", "relu", (8, 4), 0) is None
    table.check_precision("bf16-mixed")  # unknown precision: nothing to check
    # Written back as schema 2, it reads the same.
    assert table.to_dict()["schema_version"] == 2
    assert ProfileTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table
    # Schema 1 has none of schema 2's keys.
    bad = _schema_1()
    bad["entries"][0]["op_name"] = "conv1"
    with pytest.raises(SchemaError, match=r"profile.entries\[0\]: unknown key\(s\) \['op_name'\]"):
        ProfileTable.from_dict(bad)
    with pytest.raises(SchemaError, match=r"profile: unknown key\(s\) \['precision'\]"):
        ProfileTable.from_dict({**_schema_1(), "precision": "fp32"})


def test_the_measured_h200_profile_loads_as_schema_1() -> None:
    document = json.loads(SHARED_FP32.read_text())
    assert document["schema_version"] == 1
    table = ProfileTable.from_json(SHARED_FP32)
    assert len(table) == len(document["entries"]) and table.device_types() == ("H200",)
    assert (table.precision, table.timing) == ("", "synchronized")
    row = document["entries"][0]
    key = (row["device_type"], row["op_type"], tuple(row["output_shape"]), row["param_bytes"])
    expected = ProfileEntry(row["forward_s"], row["backward_s"])
    assert table.lookup(*key) == expected == table.lookup(*key, op_name="features_0")
    assert all(name is None for *_, name in table.entries)


def _two_convs() -> ProfileTable:
    key = ("H200", "conv2d", (8, 64, 56, 56), 147456)
    return ProfileTable(
        {
            (*key, None): ProfileEntry(4e-5, 9e-5, 1.2e-5, 2.1e-5),
            (*key, "conv_3x3"): ProfileEntry(4e-5, 9e-5, 1.2e-5, 2.1e-5),
            (*key, "conv_1x1"): ProfileEntry(1e-5, 2e-5, 1.1e-5, None),
        },
        device="H200 box",
        precision="bf16-mixed",
        timing="cuda_events",
    )


def test_schema_2_round_trips_names_host_times_precision_and_timing(tmp_path: Path) -> None:
    table = _two_convs()
    table.to_json(tmp_path / "p.json")
    document = json.loads((tmp_path / "p.json").read_text())
    assert (document["schema_version"], document["precision"], document["timing"]) == (2, "bf16-mixed", "cuda_events")
    assert [e.get("op_name") for e in document["entries"]] == [None, "conv_1x1", "conv_3x3"]  # name-less first
    assert "op_name" not in document["entries"][0] and "host_backward_s" not in document["entries"][1]
    assert ProfileTable.from_json(tmp_path / "p.json") == table
    key = ("H200", "conv2d", (8, 64, 56, 56), 147456)
    assert table.lookup(*key, op_name="conv_1x1") == ProfileEntry(1e-5, 2e-5, 1.1e-5, None)  # its own entry wins
    assert table.lookup(*key, "conv_3x3") == ProfileEntry(4e-5, 9e-5, 1.2e-5, 2.1e-5)
    assert table.lookup(*key) == table.lookup(*key, op_name="conv_5x5") == ProfileEntry(4e-5, 9e-5, 1.2e-5, 2.1e-5)
    assert ProfileTable({(*key, "only_named"): ProfileEntry(1.0, 1.0)}).lookup(*key) is None
    # Nulls read as absent.
    document["entries"][1].update(op_name=None, host_forward_s=None)
    document["entries"].pop(0)
    reread = ProfileTable.from_dict(document)
    assert reread.lookup(*key, op_name="conv_9x9") == ProfileEntry(1e-5, 2e-5)
    with pytest.raises(ValueError, match="given twice"):
        ProfileTable({key: ProfileEntry(1.0, 1.0), (*key, None): ProfileEntry(2.0, 2.0)})
    with pytest.raises(ValueError, match="precision 'bf16'; expected one of"):
        ProfileTable({}, precision="bf16")
    with pytest.raises(ValueError, match="timing 'events'; expected one of"):
        ProfileTable({}, timing="events")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"precision": "bf16"}, r"profile.precision = 'bf16'; expected one of \['fp32', 'tf32', 'bf16-mixed'"),
        ({"timing": "events"}, r"profile.timing = 'events'; expected one of \['cuda_events', 'synchronized', 'wall'\]"),
        ({"precision": 16}, r"profile.precision: expected a string, got 16"),
        ({"entries": [{"host_forward_s": -1.0}]}, r"profile.entries\[0\].host_forward_s = -1.0; expected finite"),
        ({"entries": [{"host_backward_s": "fast"}]}, r"profile.entries\[0\].host_backward_s: expected a number"),
        ({"entries": [{"op_name": ""}]}, r"profile.entries\[0\].op_name = ''; expected a graph op's name"),
        ({"entries": [{"op_name": 3}]}, r"profile.entries\[0\].op_name = 3; expected a graph op's name"),
        ({"entries": [{"forward_s": -1.0}]}, r"profile.entries\[0\]: times must be finite and non-negative"),
        ({"entries": [{"host_s": 1.0}]}, r"profile.entries\[0\]: unknown key\(s\) \['host_s'\]"),
        ({"schema_version": 3}, r"unsupported placement_rl.profile schema_version 3; this version reads \[1, 2\]"),
    ],
)
def test_bad_schema_2_fields_are_named(change: dict[str, Any], message: str) -> None:
    document = _two_convs().to_dict()
    for field, value in change.items():
        if field == "entries":
            document["entries"][0].update(value[0])
        else:
            document[field] = value
    with pytest.raises(SchemaError, match=message):
        ProfileTable.from_dict(document)


def test_a_repeated_schema_2_key_is_an_error() -> None:
    document = _two_convs().to_dict()
    document["entries"].append(dict(document["entries"][1]))
    with pytest.raises(SchemaError, match=r"profile.entries\[3\]: the same key as profile.entries\[1\]"):
        ProfileTable.from_dict(document)


# ------------------------------------------------------------------ the CUDA timing loop, simulated


class _FakeGpu:
    """One in-order CUDA stream and the host clock, in simulated seconds: kernels start when both the
    stream is free and the host has issued them; events complete when the stream reaches them."""

    CYCLES_PER_S = 1e9

    def __init__(self) -> None:
        self.host_s = 0.0
        self.free_at_s = 0.0  # when the stream finishes the work issued so far

    def launch(self, host_s: float, gpu_s: float) -> float:
        self.host_s += host_s
        start = max(self.free_at_s, self.host_s)
        self.free_at_s = start + gpu_s
        return start

    def synchronize(self, device: Any = None) -> None:
        self.host_s = max(self.host_s, self.free_at_s)

    def sleep(self, cycles: int) -> None:
        self.launch(0.0, cycles / self.CYCLES_PER_S)

    def event_class(self) -> type:
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at_s: float | None = None

            def record(self) -> None:
                self.at_s = gpu.launch(0.0, 0.0)

            def query(self) -> bool:
                assert self.at_s is not None
                return self.at_s <= gpu.host_s

            def synchronize(self) -> None:
                assert self.at_s is not None
                gpu.host_s = max(gpu.host_s, self.at_s)

            def elapsed_time(self, end: Event) -> float:
                assert self.at_s is not None and end.at_s is not None
                return (end.at_s - self.at_s) * 1e3

        return Event


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> _FakeGpu:
    gpu = _FakeGpu()
    monkeypatch.setattr(torch.cuda, "Event", gpu.event_class())
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep)
    monkeypatch.setattr(profiling, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: gpu.host_s)}))
    return gpu


def test_cuda_timing_separates_gpu_and_host_time(fake_gpu: _FakeGpu) -> None:
    """An op of 2 us host and 5 us GPU forward, 3 us host and 7 us GPU backward: the spin hides the host,
    the events see the kernels back to back."""

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            fake_gpu.launch(2e-6, 5e-6)
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            fake_gpu.launch(3e-6, 7e-6)
            return grad * 2

    timer = profiling._CudaTimer(torch.device("cpu"))  # CPU tensors, simulated stream
    assert timer.spin_cycles_per_s == pytest.approx(_FakeGpu.CYCLES_PER_S)
    x = torch.ones(3, requires_grad=True)
    entry, hidden = timer.time_op(lambda: Op.apply(x), [x], repeats=4)
    assert hidden and timer.timing == "cuda_events"
    assert entry.forward_s == pytest.approx(5e-6) and entry.backward_s == pytest.approx(7e-6)
    assert entry.host_forward_s == pytest.approx(2e-6) and entry.host_backward_s == pytest.approx(3e-6)
    # Without the spin the events also see the GPU wait for the host: the first issue (2 us of 22), and
    # for an op the host issues slower than the GPU runs it, every issue (10 us per 1 us kernel).
    assert profiling._timed_loop(lambda: Op.apply(x), 4, 0)[:2] == (pytest.approx(5.5e-6), pytest.approx(2e-6))
    slow = lambda: fake_gpu.launch(10e-6, 1e-6)  # noqa: E731
    assert profiling._timed_loop(slow, 4, 0)[0] == pytest.approx(10.25e-6)
    assert timer._time(slow, 4) == (pytest.approx(1e-6), pytest.approx(10e-6), True)


def test_cuda_timing_lengthens_a_short_spin_and_gives_up_on_a_synchronizing_op(fake_gpu: _FakeGpu) -> None:
    timer = profiling._CudaTimer(torch.device("cpu"))
    calls = itertools.count()

    def slower_when_timed() -> None:  # the estimate (3rd call) is cheap, the timed calls are not
        fake_gpu.launch(1e-6 if next(calls) < 3 else 1e-3, 4e-6)

    assert timer._time(slower_when_timed, 4) == (pytest.approx(4e-6), pytest.approx(1e-3), True)

    def synchronizing() -> None:
        fake_gpu.launch(1e-6, 4e-6)
        fake_gpu.synchronize()  # e.g. .item()

    gpu_s, host_s, hidden = timer._time(synchronizing, 4)
    assert not hidden and gpu_s >= 4e-6 and host_s == pytest.approx(5e-6)
