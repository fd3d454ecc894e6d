"""Device peaks per compute dtype: the catalogue's datasheet figures, every preset's devices, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.topology import (
    COMPUTE_DTYPES,
    DEVICE_TYPES,
    RANDOM_DEVICE_TYPES,
    Device,
    DeviceTopology,
    Link,
    load_preset,
    preset_names,
    random_topology,
)


def _pair(peaks: tuple[tuple[str, float], ...] = ()) -> DeviceTopology:
    devices = [Device(name, "test-gpu", "m0", 1e12, 2**34, 1e12, peaks) for name in ("g0", "g1")]
    return DeviceTopology("pair", devices, [Link("g0", "g1", 1e9, 0.0, "pcie")])


# ----------------------------------------------------------------------------- the catalogue
def test_catalogue_peaks_per_dtype() -> None:
    peaks = {name: dict(spec.peak_flops_by_dtype) for name, spec in DEVICE_TYPES.items()}
    assert peaks["H100-SXM5-80GB"] == {"tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}
    assert peaks["V100-SXM2-16GB"] == peaks["V100-SXM2-32GB"] == {"fp16": 125e12}
    assert peaks["T4"] == {"fp16": 65e12}
    for p100 in ("P100-SXM2-16GB", "P100-PCIE-12GB"):  # no tensor cores: half precision at 2x fp32
        assert peaks[p100]["fp16"] == pytest.approx(2 * DEVICE_TYPES[p100].peak_flops, rel=0.01)
    for slow in ("GTX-1080Ti", "K80"):  # no fast fp16: the fp32 units do the math
        assert peaks[slow] == {"fp16": DEVICE_TYPES[slow].peak_flops}
    # bf16 only from Ampere on (the catalogue's A100, L4, L40S, H100, H200 and B200 entries)
    assert [name for name, p in peaks.items() if "bf16" in p] == [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "A100-PCIE-40GB",
        "A100-PCIE-80GB",
        "L4",
        "L40S",
        "H100-SXM5-80GB",
        "H200-SXM-141GB",
        "H200",
        "B200",
    ]


def test_every_preset_and_random_device_has_an_fp16_peak() -> None:
    topologies = [load_preset(name) for name in preset_names()] + [random_topology(seed) for seed in range(20)]
    for topology in topologies:
        for d in topology.devices:
            assert d.peak_flops_by_dtype == DEVICE_TYPES[d.device_type].peak_flops_by_dtype
            assert d.peak_flops_for("fp16") is not None and d.peak_flops_for("fp32") == d.peak_flops
    assert set(RANDOM_DEVICE_TYPES) <= set(DEVICE_TYPES)


# ------------------------------------------------------------------------------------- JSON
def test_json_round_trip_of_the_dtype_peaks(tmp_path: Path) -> None:
    for name in preset_names():
        topology = load_preset(name)
        assert DeviceTopology.from_dict(json.loads(json.dumps(topology.to_dict()))) == topology
    h100 = load_preset("h100-2x8")
    h100.to_json(tmp_path / "h100.json")
    document = json.loads((tmp_path / "h100.json").read_text())
    assert document["devices"][0]["peak_flops_by_dtype"] == {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12}
    assert DeviceTopology.from_json(tmp_path / "h100.json") == h100


def test_a_file_without_dtype_peaks_loads_as_fp32_only() -> None:
    document = _pair().to_dict()
    assert "peak_flops_by_dtype" not in document["devices"][0]  # the field is written only when set
    loaded = DeviceTopology.from_dict(document)
    assert loaded.devices[0].peak_flops_by_dtype == () and loaded.devices[0].peak_flops_for("bf16") is None


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ({"fp8": 1e15}, ValueError, r"has 'fp8'; expected dtypes among \['tf32', 'bf16', 'fp16'\]"),
        ({"fp32": 1e12}, ValueError, "fp32 is peak_flops"),
        ({"bf16": -1.0}, ValueError, r"peak_flops_by_dtype\['bf16'\] = -1.0; expected a finite number > 0"),
        ({"bf16": "fast"}, SchemaError, r"topology.devices\[0\].peak_flops_by_dtype.bf16"),
        ([1e15], SchemaError, "expected an object of dtype -> FLOP/s"),
    ],
)
def test_bad_dtype_peaks_are_rejected(value: object, error: type[Exception], match: str) -> None:
    document = _pair().to_dict()
    document["devices"][0]["peak_flops_by_dtype"] = value
    with pytest.raises(error, match=match):
        DeviceTopology.from_dict(document)


def test_unknown_compute_dtype_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="unknown compute dtype 'fp8'; expected one of: bf16, fp16, fp32, tf32"):
        _pair().devices[0].peak_flops_for("fp8")


def test_peak_flops_for_each_dtype() -> None:
    device = _pair((("bf16", 4e12), ("fp16", 2e12))).devices[0]
    assert [device.peak_flops_for(dtype) for dtype in COMPUTE_DTYPES] == [1e12, None, 4e12, 2e12]
    summary = load_preset("h100-2x8").summary()
    assert "H100-SXM5-80GB: 67 TFLOP/s fp32, 494.7 tf32, 989.4 bf16, 989.4 fp16, 80 GiB" in summary


def test_peaks_must_be_sorted_distinct_pairs() -> None:
    with pytest.raises(ValueError, match="must be sorted and distinct"):
        _pair((("fp16", 2e12), ("bf16", 4e12)))
    with pytest.raises(ValueError, match="expected sorted \\(dtype, FLOP/s\\) pairs"):
        _pair({"bf16": 4e12})  # type: ignore[arg-type]
