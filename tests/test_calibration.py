"""The calibrated GPU model: its file format, the host lane it drives, and the fit that produces it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from placement_rl import calibrate
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.plan import constructors, data_parallel
from placement_rl.sim import TASK_KINDS, CostModel, simulate
from placement_rl.sim.calibration import DEFAULT_CALIBRATION, Calibration, Curve
from placement_rl.sim.cost import ProfileEntry, ProfileTable
from placement_rl.topology import Device, DeviceTopology, load_preset
from placement_rl.topology.devices import DEVICE_TYPES

HOST = TASK_KINDS.index("host")


def _h200() -> DeviceTopology:
    spec = DEVICE_TYPES["H200"]
    device = Device(
        "m0/gpu0",
        "H200",
        "m0",
        spec.peak_flops,
        spec.memory_bytes,
        spec.memory_bandwidth_bytes_per_s,
        spec.peak_flops_by_dtype,
    )
    return DeviceTopology("h200x1", [device], [])


def test_a_calibration_round_trips_and_bad_files_name_the_field() -> None:
    document = DEFAULT_CALIBRATION.to_dict()
    assert Calibration.from_dict(json.loads(json.dumps(document))) == DEFAULT_CALIBRATION
    bad = json.loads(json.dumps(document))
    bad["memory"] = [1.5, 1e-6]
    with pytest.raises(SchemaError, match=r"calibration\.memory.*peak_fraction = 1\.5"):
        Calibration.from_dict(bad)
    bad = json.loads(json.dumps(document))
    del bad["host_s"]["view"]
    with pytest.raises(SchemaError, match="host_s.*expected exactly"):
        Calibration.from_dict(bad)
    bad = json.loads(json.dumps(document))
    bad["compute"]["convolution/tensor"] = [0.5, 1e-6]
    with pytest.raises(SchemaError, match="unknown classes"):
        Calibration.from_dict(bad)
    bad = json.loads(json.dumps(document))
    bad["kernel_s"] = [1e-6]
    with pytest.raises(SchemaError, match=r"kernel_s: expected a pair"):
        Calibration.from_dict(bad)


def test_efficiency_grows_with_size() -> None:
    curve = Curve(0.8, 1e-5)
    peak = 1e15
    small, large = 1e9, 1e13
    eff = [x / peak / curve.seconds(x, peak) for x in (small, large)]
    assert eff[0] < eff[1] < 0.8
    assert curve.seconds(large, peak) == pytest.approx((large / peak + 1e-5) / 0.8)
    assert curve.seconds(0.0, peak) == 0.0


def test_backward_work_has_its_own_ramp_and_old_three_figure_curves_keep_one() -> None:
    # A backward ramp ten times the forward's: small backward ops are slow, a very large one
    # reaches the backward fraction all the same.
    curve = Curve(0.6, 1e-5, 0.5, 1e-4)
    peak = 1e15
    assert curve.seconds(1e9, peak, backward=True) == pytest.approx((1e-6 + 1e-4) / 0.5)
    assert curve.seconds(1e9, peak) == pytest.approx((1e-6 + 1e-5) / 0.6)
    huge = 1e16
    assert huge / peak / curve.seconds(huge, peak, backward=True) == pytest.approx(0.5, rel=1e-2)
    assert curve.as_list() == [0.6, 1e-5, 0.5, 1e-4]
    assert Curve(0.6, 1e-5, 0.5).as_list() == [0.6, 1e-5, 0.5]  # a shared ramp is written as before
    document = DEFAULT_CALIBRATION.to_dict()
    document["compute"]["matmul/tensor"] = [0.6, 1e-5, 0.5, 1e-4]
    parsed = Calibration.from_dict(json.loads(json.dumps(document)))
    assert parsed.compute["matmul/tensor"] == curve
    document["compute"]["matmul/tensor"] = [0.6, 1e-5, 0.5, -1.0]
    with pytest.raises(SchemaError, match=r"matmul/tensor.*backward_half_s = -1\.0"):
        Calibration.from_dict(document)
    document["compute"]["matmul/tensor"] = [0.6, 1e-5, 0.5, 1e-4, 1.0]
    with pytest.raises(SchemaError, match=r"backward half seconds"):
        Calibration.from_dict(document)


def test_bad_cost_model_options_name_the_value() -> None:
    with pytest.raises(UnknownNameError, match="execution mode 'graphs'.*cuda_graphs, eager"):
        CostModel(execution_mode="graphs")
    with pytest.raises(ValueError, match="expected a placement_rl.sim.calibration.Calibration or None"):
        CostModel(calibration="h200")  # type: ignore[arg-type]
    table = ProfileTable({("H200", "linear", (8, 8), 256): ProfileEntry(1e-5, 2e-5)}, precision="bf16-mixed")
    with pytest.raises(ValueError, match="measured in precision 'bf16-mixed'.*uses precision 'fp32'"):
        CostModel(profile=table)


def test_the_host_lane_issues_every_op_and_bounds_small_models(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet", batch_size=2)
    topology = _h200()
    plan = constructors.single_device(graph, topology)
    eager = simulate(graph, topology, plan, CostModel(optimizer="sgd"))
    graphs = simulate(graph, topology, plan, CostModel(optimizer="sgd", execution_mode="cuda_graphs"))
    kinds = eager.tasks.kind
    host = kinds == HOST
    assert host.sum() == 2 * graph.num_ops  # one per forward and backward task
    assert not (graphs.tasks.kind == HOST).any()
    issued = float((eager.tasks.end_s - eager.tasks.start_s)[host].sum())
    # a tiny model at batch 2 is bound by the host: the iteration is at least its issuing time
    assert eager.makespan_s >= issued > graphs.makespan_s
    lanes = set(eager.tasks.lane[host].tolist())
    assert [eager.tasks.lanes[i] for i in lanes] == ["m0/gpu0 host"]
    # a GPU task never starts before its host task ends (the host runs ahead, never behind)
    F = graph.num_ops
    gpu = np.flatnonzero((kinds == 0) | (kinds == 1))
    start = eager.tasks.start_s
    host_ids = np.flatnonzero(host)
    assert np.all(start[gpu] >= eager.tasks.end_s[host_ids][: 2 * F] - 1e-15)


def test_program_order_on_a_device_and_a_receive_blocks_the_host(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet", batch_size=2)
    topology = load_preset("h100-2x8")
    result = simulate(graph, topology, constructors.layerwise(graph, topology), CostModel())
    t = result.tasks
    for device in {int(x) for x in t.lane[t.kind == 0]}:
        on = np.flatnonzero(((t.kind == 0) | (t.kind == 1)) & (t.lane == device))
        on = on[np.argsort(t.start_s[on], kind="stable")]
        forward = on[t.kind[on] == 0]
        backward = on[t.kind[on] == 1]
        assert np.all(np.diff(t.op[forward]) >= 0)  # forward in op order
        assert np.all(np.diff(t.op[backward]) <= 0)  # backward in reverse op order
        assert t.start_s[backward].min(initial=math.inf) >= t.end_s[forward].max(initial=0.0)
    transfers = np.flatnonzero(t.kind == TASK_KINDS.index("transfer"))
    assert transfers.size
    hosts = np.flatnonzero(t.kind == HOST)
    for c in transfers.tolist():  # the consumer's host task (same op, forward) waits for the data
        consumer_hosts = hosts[(t.op[hosts] == t.op[c]) & (t.start_s[hosts] >= t.end_s[c] - 1e-15)]
        assert consumer_hosts.size


def test_the_fit_models_the_simulator_exactly(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    topology = _h200()
    device = topology.devices[0]
    for model, batch in (("lenet", 8), ("rnnlm", 4)):
        graph = zoo_graph(model, batch_size=batch, **({"steps": 4} if model == "rnnlm" else {}))
        plan = constructors.single_device(graph, topology)
        for precision in ("fp32", "bf16-mixed"):
            for mode in ("eager", "cuda_graphs"):
                cost = CostModel(precision=precision, optimizer="sgd", execution_mode=mode)
                simulated = simulate(graph, topology, plan, cost).makespan_s
                modelled = calibrate.iteration_seconds(
                    DEFAULT_CALIBRATION, calibrate.graph_tasks(graph, device, cost), mode
                )
                assert modelled == pytest.approx(simulated, rel=1e-9), (model, precision, mode)


def _folder(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    topology = _h200()
    topology.to_json(tmp_path / "topology_h200x1.json")
    (tmp_path / "iterations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_fit_recovers_a_known_calibration(tmp_path: Path, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    # "Measurements" simulated with a known calibration: the fit, started from its generic figures,
    # must get much closer to them than the start is.
    truth = Calibration(
        name="truth",
        compute={"conv/tensor": Curve(0.5, 2e-5, 0.4), "matmul/simt": Curve(0.7, 1e-5, 0.6)},
        default_compute=Curve(0.6, 5e-6),
        memory=Curve(0.7, 2e-6),
        memory_by_family={},
        kernel_s=(2e-6, 3e-6),
        host_s={"layer": (40e-6, 10e-6), "pointwise": (10e-6, 5e-6), "view": (5e-6, 2e-6), "update": (8e-6, 0.0)},
        autocast_host_s=0.0,
    )
    topology = _h200()
    rows = []
    for batch in (64, 16, 4, 1):
        graph = zoo_graph("lenet", batch_size=batch)
        cost = CostModel(optimizer="sgd", calibration=truth)
        ms = simulate(graph, topology, constructors.single_device(graph, topology), cost).makespan_s * 1e3
        rows.append({"model": "lenet", "mode": "default", "batch": batch, "iteration_ms": ms})
    folder = _folder(tmp_path, rows)
    data = calibrate.build_dataset(folder, graph_loader=lambda m, b: zoo_graph(m, batch_size=b))
    start = calibrate._unpack(
        calibrate._start(["conv/tensor", "matmul/simt"], []), ["conv/tensor", "matmul/simt"], [], "s"
    )[0]
    start_error = max(
        abs(calibrate.iteration_seconds(start, t, "eager") / m.iteration_s - 1)
        for t, m in zip(data.tasks, data.measurements, strict=True)
    )
    fitted, figures = calibrate.fit(data, prior_weight=0.0)
    assert figures["iterations"] == 4
    assert figures["worst_error"] < 0.02 < start_error
    comparisons = calibrate.compare(data, fitted, ("calibrated",))
    assert max(abs(c.error) for c in comparisons) == pytest.approx(figures["worst_error"], rel=1e-6)


def test_bad_measurement_files_name_the_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path, [])
    (folder / "iterations.jsonl").write_text('{"model": "lenet", "mode": "default", "batch": 8}\nnot json\n')
    with pytest.raises(SchemaError, match=r"iterations\.jsonl:1 \(model 'lenet'\): no 'iteration_ms'; expected a"):
        calibrate.load_measurements(folder)
    (folder / "iterations.jsonl").write_text(
        '{"model": "lenet", "mode": "default", "batch": 8, "iteration_ms": 1}\n{\n'
    )
    with pytest.raises(SchemaError, match=r"iterations\.jsonl:2: not JSON"):
        calibrate.load_measurements(folder)
    (folder / "iterations.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no rows of modes \['bf16', .*\] in iterations\.jsonl"):
        calibrate.load_measurements(folder)


def test_the_default_model_is_slower_than_the_roofline_for_small_ops_on_a_fast_gpu(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    # On an H200 the roofline predicts bert-sized iterations many times too fast in bf16; the
    # calibrated model, with its host lane, is bound by issuing kernels at small batches.
    graph = zoo_graph("lenet", batch_size=1)
    topology = load_preset("h100-2x8")
    plan = data_parallel(graph, topology)
    roofline = simulate(graph, topology, plan, CostModel(precision="bf16-mixed", calibration=None))
    calibrated = simulate(graph, topology, plan, CostModel(precision="bf16-mixed"))
    assert calibrated.makespan_s > 10 * roofline.makespan_s


def test_tf32_off_measurements_time_convolutions_on_cuda_cores(tmp_path: Path, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    rows = [{"model": "lenet", "mode": mode, "batch": 8, "iteration_ms": 1.0} for mode in ("default", "fp32", "tf32")]
    folder = _folder(tmp_path, rows)
    data = calibrate.build_dataset(folder, graph_loader=lambda m, b: zoo_graph(m, batch_size=b))
    assert [m.group for m in data.measurements] == ["fp32", "fp32 no-TF32"]  # tf32 mode: not a precision here
    classes = [{calibrate.COMPUTE_CLASSES[c] for c in t.compute_class if c >= 0} for t in data.tasks]
    assert "conv/tensor" in classes[0] and "conv/simt" not in classes[0]  # torch's default: cuDNN in TF32
    assert "conv/simt" in classes[1] and "conv/tensor" not in classes[1]


def test_leaving_a_model_out_drops_its_iterations_and_its_profiled_ops(tmp_path: Path, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    rows = [{"model": m, "mode": "default", "batch": 8, "iteration_ms": 1.0} for m in ("lenet", "alexnet")]
    folder = _folder(tmp_path, rows)
    lenet, alexnet = zoo_graph("lenet", batch_size=8), zoo_graph("alexnet", batch_size=8)
    conv = next(op for op in lenet.ops if op.op_type == "conv2d")
    linear = next(op for op in alexnet.ops if op.op_type == "linear")
    entries = {
        ("H200", op.op_type, tuple(op.output_shapes[0]), op.param_bytes): ProfileEntry(1e-4, 2e-4)
        for op in (conv, linear)
    }
    ProfileTable(entries, precision="fp32").to_json(folder / "profile_fp32.json")
    data = calibrate.build_dataset(folder, graph_loader=lambda m, b: zoo_graph(m, batch_size=b))
    assert data.profile_seconds.shape[0] == 4  # forward and backward of both ops
    without = calibrate.subset(data, exclude="lenet")
    assert [m.model for m in without.measurements] == ["alexnet"] and len(without.tasks) == 1
    assert without.profile_seconds.shape[0] == 2 and all("lenet" not in o for o in without.profile_models)
    only = calibrate.subset(data, only="lenet")
    assert [m.model for m in only.measurements] == ["lenet"] and only.profile_seconds.shape[0] == 2
    assert only.profile is not None and only.profile.flops.shape[0] == 2


@pytest.mark.slow
def test_the_shipped_calibration_carries_to_a_gpu_it_was_not_fitted_to() -> None:
    """The H200 fit, simulated against the 72 eager iterations measured on an H100 (benchmarks/data/h100):
    every (precision, batch group) within 20% median and 60% worst, where the roofline is 43-92% median."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100"
    data = calibrate.build_dataset(folder, with_profiles=False)
    assert data.device.device_type == "H100-SXM5-80GB" and len(data.measurements) == 72
    table = calibrate.error_table(calibrate.compare(data, DEFAULT_CALIBRATION, ("roofline", "calibrated")))
    calibrated = [row for row in table if row["cost_model"] == "calibrated"]
    roofline = {(r["precision"], r["batch"]): r for r in table if r["cost_model"] == "roofline"}
    assert len(calibrated) == 4
    for row in calibrated:
        assert row["median_error"] < 0.20 and row["worst_error"] < 0.60, row
        assert row["median_error"] < roofline[(row["precision"], row["batch"])]["median_error"] / 3, row
