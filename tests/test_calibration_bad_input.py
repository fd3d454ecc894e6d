"""Bad input to the calibrated GPU model: calibration files, ``calibrate --data`` rows, the fit's options and the
benchmark scripts' arguments. Each gives one ``error:`` line naming the value and what is allowed (status 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from scripts import load_script

from placement_rl import calibrate
from placement_rl.cli import main
from placement_rl.errors import SchemaError
from placement_rl.graph.ir import Op, OpGraph
from placement_rl.sim import CostModel
from placement_rl.sim.calibration import DEFAULT_CALIBRATION, MEMORY_FAMILIES, Calibration, Curve
from placement_rl.topology import DeviceTopology
from placement_rl.topology.devices import DEVICE_TYPES

TOPOLOGY = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200" / "topology_h200x1.json"
ROW = {"model": "lenet", "mode": "default", "batch": 8, "iteration_ms": 1.5}


def _document(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The shipped calibration's document with the field at ``path`` set to ``value``."""
    document = json.loads(json.dumps(DEFAULT_CALIBRATION.to_dict()))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one stderr line of ``placement-rl argv``, which must exit with status 2 and print nothing else."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and not captured.out
    return lines[0]


# ------------------------------------------------------------------------------------ calibration files
WRONG_TYPES = [
    (("compute",), [1, 2], r"calibration\.compute: expected an object of compute class -> curve, got \[1, 2\]"),
    (("compute",), 3, r"calibration\.compute: expected an object .* got 3"),
    (("memory_by_family",), 5, r"calibration\.memory_by_family: expected an object of op family -> curve, got 5"),
    (("host_s",), [], r"calibration\.host_s: expected an object of host group"),
    (("serial",), [1], r"calibration\.serial: expected an object of compute class -> share in \[0, 1\], got \[1\]"),
    (("serial",), "ab", r"calibration\.serial: expected an object .* got 'ab'"),
    (("serial", "conv/simt"), "x", r"calibration\.serial\['conv/simt'\]: expected a number, got 'x'"),
    (("notes",), [1], r"calibration\.notes: expected an object, got \[1\]"),
    (("notes", "sync_overhead_s"), 3, r"calibration\.notes\['sync_overhead_s'\]: expected a pair of numbers"),
    (("name",), 5, r"calibration\.name: expected a string, got 5"),
    (("source",), ["x"], r"calibration\.source: expected a string"),
    (("kernel_s", 0), "a", r"calibration\.kernel_s\[0\]: expected a number, got 'a'"),
    (("kernel_s",), {"a": 1}, r"calibration\.kernel_s: expected a pair of numbers \(seconds\), got \{'a': 1\}"),
    (("host_s", "layer"), "ab", r"calibration\.host_s\['layer'\]: expected a pair of numbers \(seconds\)"),
    (("memory",), {"peak": 1}, r"calibration\.memory: expected \[peak fraction, half seconds"),
    (("memory", 1), "1e-6", r"calibration\.memory\[1\]: expected a number, got '1e-6'"),
    (("memory", 0), True, r"calibration\.memory\[0\]: expected a number, got True"),
    (("autocast_host_s",), None, r"calibration\.autocast_host_s: expected a number, got None"),
    (("update_bytes_per_element",), 12, r"calibration\.update_bytes_per_element: expected a pair of numbers \(bytes\)"),
]


@pytest.mark.parametrize(("path", "value", "message"), WRONG_TYPES, ids=[str(c[0]) for c in WRONG_TYPES])
def test_a_field_of_the_wrong_json_type_names_its_path(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Calibration.from_dict(_document(path, value))


OUT_OF_RANGE = [
    # a fraction 0 (once read as "the forward's"), negative, above 1, or so small that op times overflow
    (("memory", 2), 0, r"calibration\.memory\[2\]: backward_fraction = 0\.0; expected a fraction of the peak in "),
    (("compute", "matmul/tensor", 0), -0.5, r"\['matmul/tensor'\]\[0\]: peak_fraction = -0\.5"),
    (("default_compute", 0), 1.5, r"calibration\.default_compute\[0\]: peak_fraction = 1\.5; .*in \[0\.001, 1\]"),
    (("memory",), [1e-300, 1e-6, 0.5], r"calibration\.memory\[0\]: peak_fraction = 1e-300"),
    # a ramp, a kernel floor or a host time of more than a second: op times of 1e300 s, infinite sums
    (("memory",), [0.5, 1e300, 0.5], r"calibration\.memory\[1\]: half_s = 1e\+300; expected seconds in \[0, 1\]"),
    (("kernel_s",), [1e308, 1e308], r"calibration\.kernel_s\[0\] = 1e\+308; expected seconds in \[0, 1\]"),
    (("host_s", "view"), [1e-5, -1e-6], r"calibration\.host_s\['view'\]\[1\] = -1e-06; expected seconds in \[0, 1\]"),
    (("autocast_host_s",), 5, r"calibration\.autocast_host_s = 5\.0; expected seconds in \[0, 1\]"),
    (("notes", "sync_overhead_mixed_s"), [1e-5, 7], r"sync_overhead_mixed_s'\]\[1\] = 7\.0; expected seconds"),
    (
        ("update_bytes_per_element",),
        [12, 5000],
        r"update_bytes_per_element\[1\] = 5000\.0; expected bytes in \[0, 1024\]",
    ),
    (("serial", "conv/simt"), 1.5, r"calibration\.serial\['conv/simt'\] = 1\.5; expected a share in \[0, 1\]"),
    (("serial", "conv/simt"), -0.1, r"calibration\.serial\['conv/simt'\] = -0\.1; expected a share in \[0, 1\]"),
]


@pytest.mark.parametrize(("path", "value", "message"), OUT_OF_RANGE, ids=[str(c[:2]) for c in OUT_OF_RANGE])
def test_a_figure_outside_its_physical_range_is_refused(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Calibration.from_dict(_document(path, value))


def test_unknown_op_families_and_classes_name_the_allowed_ones() -> None:
    with pytest.raises(SchemaError, match=r"memory_by_family: unknown op families \['bogus'\]; expected some of") as e:
        Calibration.from_dict(_document(("memory_by_family", "bogus"), [0.5, 1e-6, 0.5]))
    assert str(list(MEMORY_FAMILIES)) in str(e.value) and "'input'" not in str(e.value)
    with pytest.raises(SchemaError, match=r"calibration\.serial: unknown classes \['conv'\]; expected some of"):
        Calibration.from_dict(_document(("serial", "conv"), 0.5))
    with pytest.raises(ValueError, match=r"Calibration\.memory_by_family: unknown op families \['bogus'\]"):
        Calibration(
            "x", {}, Curve(0.5, 1e-6), Curve(0.5, 1e-6), {"bogus": Curve(0.5, 1e-6)}, (0.0, 0.0),
            dict.fromkeys(("layer", "pointwise", "view", "update"), (0.0, 0.0)),
        )  # fmt: skip


def test_curves_and_calibrations_in_range_still_read() -> None:
    assert Curve(0.5, 1e-6).backward_fraction == 0.5  # the backward fraction defaults to the forward's
    assert Curve(0.001, 1.0, 1.0, 0.0).as_list() == [0.001, 1.0, 1.0, 0.0]  # the bounds themselves
    with pytest.raises(ValueError, match=r"Curve\.backward_fraction = 0\.0; expected a fraction"):
        Curve(0.5, 1e-6, 0.0)
    document = _document(("memory_by_family", "reduction"), [0.5, 1e-6])
    document["notes"]["fit"] = {"anything": [1, "free-form"]}  # notes other than the sync overheads are free
    parsed = Calibration.from_dict(document)
    assert parsed.memory_curve("reduction") == Curve(0.5, 1e-6) and parsed.notes["fit"] == {
        "anything": [1, "free-form"]
    }
    assert Calibration.from_dict(json.loads(json.dumps(DEFAULT_CALIBRATION.to_dict()))) == DEFAULT_CALIBRATION


def test_a_bad_calibration_file_is_one_error_line_naming_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tmp_path / "tiny.json"  # a one-op graph: no zoo import
    OpGraph("tiny", [Op("fc", "linear", ((8, 8),), forward_flops=1e6, backward_flops=2e6)], [], 8).to_json(graph)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_document(("memory",), [1e-300, 1e300, 1e-300])))
    argv = ["simulate", "--model", str(graph), "--topology", "trinity", "--plan", "dp", "--calibration", str(bad)]
    line = _error_line(capsys, argv)
    assert (
        line
        == f"error: {bad}: calibration.memory[0]: peak_fraction = 1e-300; expected a fraction of the peak in [0.001, 1]"
    )
    bad.write_text(json.dumps(_document(("compute",), [1, 2])))
    assert _error_line(capsys, argv) == (
        f"error: {bad}: calibration.compute: expected an object of compute class -> curve, got [1, 2]"
    )
    bad.write_text("{")  # the file is named once
    assert _error_line(capsys, argv).startswith(f"error: {bad}: malformed JSON at line 1")


def test_a_non_finite_op_time_names_the_op_and_the_calibration() -> None:
    spec = DEVICE_TYPES["H200"]
    op = Op("huge_fc", "linear", ((8, 8),), forward_flops=math.inf, backward_flops=2.0)
    with pytest.raises(ValueError, match=r"calibration 'h200-eager': op 'huge_fc' takes inf s \(forward: inf FLOPs"):
        CostModel().task_times_s(op, 1.0, (8, 8), 0, "H200", spec.peak_flops, spec.memory_bandwidth_bytes_per_s, "fp32")
    with pytest.raises(ValueError, match=r"calibration 'h200-eager': a matmul op takes inf s \(backward"):
        DEFAULT_CALIBRATION.gpu_seconds(1e300, 0.0, "matmul/tensor", 1e-10, 1e12, True, "matmul")


# ------------------------------------------------------------------------------------ calibrate --data
def _folder(tmp_path: Path, *lines: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / TOPOLOGY.name).write_text(TOPOLOGY.read_text())
    (tmp_path / "iterations.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path


BAD_ROWS = [
    ("[1, 2]", r"iterations\.jsonl:2: expected a JSON object \(one measured iteration: .*\), got a JSON list"),
    ("3", r"iterations\.jsonl:2: expected a JSON object .*, got a JSON number"),
    ('"row"', r"iterations\.jsonl:2: expected a JSON object .*, got a JSON string"),
    (json.dumps({"mode": "default", "batch": 8, "iteration_ms": 1}), r":2: no 'model'; expected the name of"),
    (json.dumps({**ROW, "model": 3}), r":2: model = 3; expected the name of the measured model \(a string\)"),
    (json.dumps({**ROW, "mode": ["default"]}), r":2 \(model 'lenet'\): mode = \['default'\]; expected a string"),
    (json.dumps({**ROW, "batch": 8.5}), r":2 \(model 'lenet'\): batch = 8\.5; expected a whole number of samples >= 1"),
    (json.dumps({**ROW, "batch": 0}), r":2 \(model 'lenet'\): batch = 0; expected a whole number"),
    (json.dumps({**ROW, "batch": "8"}), r":2 \(model 'lenet'\): batch = '8'; expected a whole number"),
    (
        '{"model": "lenet", "mode": "default", "batch": 8, "iteration_ms": NaN}',
        r":2 \(model 'lenet'\): iteration_ms = nan;",
    ),
    (
        '{"model": "lenet", "mode": "default", "batch": 8, "iteration_ms": 1e999}',
        r"iteration_ms = inf; expected a finite",
    ),
    (json.dumps({**ROW, "iteration_ms": 0}), r"iteration_ms = 0; expected a finite time of at least 0\.001 ms"),
    (json.dumps({**ROW, "iteration_ms": -2.0}), r"iteration_ms = -2\.0; expected a finite time of at least 0\.001 ms"),
    (json.dumps({**ROW, "iteration_ms": 1e-297}), r"iteration_ms = 1e-297; expected a finite time of at least"),
    (json.dumps({k: v for k, v in ROW.items() if k != "iteration_ms"}), r":2 \(model 'lenet'\): no 'iteration_ms'"),
]


@pytest.mark.parametrize(("line", "message"), BAD_ROWS, ids=[str(i) for i in range(len(BAD_ROWS))])
def test_a_bad_row_names_the_file_line_model_and_field(tmp_path: Path, line: str, message: str) -> None:
    folder = _folder(tmp_path, json.dumps(ROW), line)
    with pytest.raises(SchemaError, match=message):
        calibrate.load_measurements(folder)


def test_rows_not_fitted_are_skipped_and_a_whole_batch_reads(tmp_path: Path) -> None:
    nan_loss = '{"model": "lenet", "mode": "default", "batch": 8, "iteration_ms": 2.0, "loss": NaN}'
    other = [json.dumps({**ROW, "mode": "tf32"}), json.dumps({"model": "lenet", "error": "OOM"}), nan_loss]
    folder = _folder(tmp_path, json.dumps({**ROW, "batch": 8.0}), *other)
    rows = calibrate.load_measurements(folder)
    assert [(m.model, m.batch, m.iteration_s, m.source) for m in rows] == [
        ("lenet", 8, 1.5e-3, "iterations.jsonl:1"),
        ("lenet", 8, 2e-3, "iterations.jsonl:4"),
    ]


def test_more_rows_than_the_bound_are_refused_with_the_count(tmp_path: Path) -> None:
    folder = _folder(tmp_path, *[json.dumps(ROW)] * (calibrate.MAX_MEASUREMENTS + 1))
    with pytest.raises(SchemaError, match=r"1,001 measured iterations to fit; expected at most 1,000"):
        calibrate.load_measurements(folder)
    assert len(calibrate.load_measurements(folder, max_measurements=None)) == 1001
    (folder / "iterations.jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "model": "alexnet"}) + "\n")
    assert len(calibrate.load_measurements(folder, ["alexnet"], max_measurements=1)) == 1  # counted after --models


def test_the_calibrate_command_reports_bad_data_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path / "data", json.dumps(ROW), "[1, 2]")
    line = _error_line(capsys, ["calibrate", "--data", str(folder), "--profile-models", "none"])
    assert line == (
        f"error: {folder / 'iterations.jsonl'}:2: expected a JSON object (one measured iteration: model, mode, "
        "batch, iteration_ms), got a JSON list"
    )
    missing = tmp_path / "nowhere"
    assert _error_line(capsys, ["calibrate", "--data", str(missing)]) == (
        f"error: no such folder: '{missing}'; expected a folder of measurements (iterations*.jsonl, topology_*.json)"
    )
    (folder / "iterations.jsonl").write_text(json.dumps({**ROW, "model": "bogus"}) + "\n")
    line = _error_line(capsys, ["calibrate", "--data", str(folder), "--profile-models", "none"])
    assert line.startswith(
        f"error: {folder / 'iterations.jsonl'}:1: unknown model 'bogus'; expected a zoo model: alexnet"
    )


@pytest.mark.parametrize("weight", ["nan", "inf", "-1", "abc"])
def test_a_bad_profile_weight_is_refused(weight: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--data", "x", f"--profile-weight={weight}"]) == 2
    assert f"argument --profile-weight: '{weight}'; expected a finite number >= 0" in capsys.readouterr().err


def test_the_fit_refuses_bad_weights_and_times_naming_them() -> None:
    topology = DeviceTopology.from_json(TOPOLOGY)
    data = calibrate.Dataset(topology.devices[0], topology)
    for kwargs, message in (
        ({"profile_weight": math.nan}, r"profile_weight = nan; expected a finite weight >= 0"),
        ({"prior_weight": -1.0}, r"prior_weight = -1\.0; expected a finite weight >= 0"),
        ({"max_evaluations": 0}, r"max_evaluations = 0; expected a whole number >= 1"),
        ({}, r"no measured iterations to fit"),
    ):
        with pytest.raises(ValueError, match=message):
            calibrate.fit(data, **kwargs)
    data.measurements.append(calibrate.Measurement("lenet", 8, "fp32", "eager", 1e-300, "iterations.jsonl:7"))
    with pytest.raises(ValueError, match=r"iterations\.jsonl:7 \(model 'lenet'\): iteration_s = 1e-300; expected"):
        calibrate.fit(data)


# ------------------------------------------------------------------------------------ benchmark scripts
def _script_error(capsys: pytest.CaptureFixture[str], script: str, argv: list[str]) -> str:
    """The ``error:`` line of ``benchmarks/<script>.py argv``, which must exit with status 2 without a traceback."""
    module = load_script(f"benchmarks/{script}.py")
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_megatron_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.json"
    assert _script_error(capsys, "megatron", ["--calibration", str(missing)]).endswith(
        f"argument --calibration: no such file: '{missing}'"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("[1,")
    assert f"argument --calibration: {broken}: malformed JSON" in _script_error(
        capsys, "megatron", ["--calibration", str(broken)]
    )
    line = _script_error(capsys, "megatron", ["--calibration", str(TOPOLOGY)])
    assert line.endswith(f"{TOPOLOGY}: expected a document with format 'placement_rl.calibration', got format "
                         "'placement_rl.topology'")  # fmt: skip
    assert _script_error(capsys, "megatron", ["--rows", "abc"]).endswith(
        "--rows: 'abc'; expected comma-separated sizes in billions of parameters, of "
        "[1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0]"
    )
    assert "--max-tasks 0; expected a positive number" in _script_error(capsys, "megatron", ["--max-tasks", "0"])


def test_megatron_takes_the_word_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script("benchmarks/megatron.py")
    seen: list[Any] = []
    monkeypatch.setattr(module, "run_row", lambda row, *args: seen.append(args[-1]) or {"skipped": "x"})
    for spec, expected in (("default", DEFAULT_CALIBRATION), ("roofline", None)):
        seen.clear()
        assert module.main(["--rows", "1.7", "--json", "--calibration", spec]) == 0
        assert [cost.calibration for cost in seen] == [expected]
    capsys.readouterr()


def test_calibration_benchmark_data_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert _script_error(capsys, "calibration", ["--data", str(missing)]).endswith(
        f"no such folder: '{missing}'; expected a folder of measurements (iterations*.jsonl, topology_*.json)"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no topology_*.json" in _script_error(capsys, "calibration", ["--data", str(empty)])
    folder = _folder(tmp_path / "rows", json.dumps({**ROW, "batch": 2.5}))
    assert _script_error(capsys, "calibration", ["--data", str(folder)]).endswith(
        f"{folder / 'iterations.jsonl'}:1 (model 'lenet'): batch = 2.5; expected a whole number of samples >= 1"
    )


def test_ft_calibration_is_checked_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script_error(capsys, "ft", ["estimate", "--calibration", "bogus"]).endswith(
        "argument --calibration: calibration = 'bogus'; expected default, roofline or a calibration .json path"
    )
