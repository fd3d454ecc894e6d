"""Tests for placement_rl.topology: presets, routing, JSON, validation, random topologies, specs."""

from __future__ import annotations

import cProfile
import itertools
import json
import math
import pstats
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.topology import (
    DEVICE_TYPES,
    GIB,
    TEST_SEEDS,
    TRAIN_SEEDS,
    Device,
    DeviceTopology,
    Link,
    Route,
    load_preset,
    make_device,
    preset_names,
    random_topology,
    resolve_topology,
    topology_seeds,
)

# name -> (devices, machines, device type counts)
PRESETS = {
    "flexflow-p100": (16, 4, {"P100-SXM2-16GB": 16}),
    "flexflow-k80": (64, 16, {"K80": 64}),
    "tag-testbed": (16, 7, {"V100-SXM2-32GB": 4, "GTX-1080Ti": 8, "P100-PCIE-12GB": 4}),
    "tag-cloud": (32, 6, {"V100-SXM2-16GB": 16, "T4": 16}),
    "tensoropt": (16, 2, {"V100-SXM2-16GB": 16}),
    "trinity": (4, 1, {"P100-PCIE-12GB": 4}),
    "h100-2x8": (16, 2, {"H100-SXM5-80GB": 16}),
    "dgx-a100-x2": (16, 2, {"A100-SXM4-80GB": 16}),
    "dgx-h100-x2": (16, 2, {"H100-SXM5-80GB": 16}),
}


def gpu(name: str, machine: str = "m0") -> Device:
    return make_device(name, "V100-SXM2-16GB", machine)


def link(a: str, b: str, bandwidth: float, latency: float = 1e-6) -> Link:
    return Link(a, b, bandwidth, latency, "pcie")


def two_gpus(**link_fields: object) -> tuple[list[Device], list[Link]]:
    fields = {"a": "g0", "b": "g1", "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-6, "kind": "pcie"}
    fields.update(link_fields)
    return [gpu("g0"), gpu("g1")], [Link(**fields)]  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ catalogue
def test_device_catalogue_figures() -> None:
    assert DEVICE_TYPES["V100-SXM2-32GB"].memory_bytes == 32 * 2**30
    assert DEVICE_TYPES["V100-SXM2-16GB"].peak_flops == 15.7e12
    assert DEVICE_TYPES["K80"].peak_flops == 4.37e12
    assert DEVICE_TYPES["GTX-1080Ti"].memory_bytes == 11 * 2**30
    assert DEVICE_TYPES["H100-SXM5-80GB"].memory_bandwidth_bytes_per_s == 3.35e12
    assert DEVICE_TYPES["P100-PCIE-12GB"].memory_bandwidth_bytes_per_s == 549e9
    assert all(spec.source == "vendor datasheet" for spec in DEVICE_TYPES.values())
    with pytest.raises(UnknownNameError, match="A100"):
        make_device("x", "A100", "m0")


# -------------------------------------------------------------------------------------- presets
def test_preset_names_in_documented_order() -> None:
    assert preset_names() == list(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_shape(name: str) -> None:
    num_devices, num_machines, types = PRESETS[name]
    topo = load_preset(name)
    assert topo.name == name
    assert topo.num_devices == num_devices
    assert len(topo.machines()) == num_machines
    assert Counter(d.device_type for d in topo.devices) == types
    for i, d in enumerate(topo.devices):
        machine, local = d.name.split("/")
        assert machine == d.machine and local.startswith("gpu")
        assert topo.device_index(d.name) == i and topo.device(d.name) is d
        spec = DEVICE_TYPES[d.device_type]
        assert (d.peak_flops, d.memory_bandwidth_bytes_per_s) == (spec.peak_flops, spec.memory_bandwidth_bytes_per_s)
        assert d.memory_bytes == (11 * GIB if name == "trinity" else spec.memory_bytes)
    assert set(topo.switches).isdisjoint(d.name for d in topo.devices)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matrices(name: str) -> None:
    topo = load_preset(name)
    bw, lat = topo.bandwidth_matrix(), topo.latency_matrix()
    n = topo.num_devices
    assert bw.shape == lat.shape == (n, n) and bw.dtype == lat.dtype == np.float64
    assert np.all(np.isinf(np.diag(bw))) and np.all(np.diag(lat) == 0)
    off = ~np.eye(n, dtype=bool)
    assert np.all(np.isfinite(bw[off])) and np.all(bw[off] > 0) and np.all(lat[off] > 0)
    np.testing.assert_array_equal(bw, bw.T)
    np.testing.assert_allclose(lat, lat.T, rtol=1e-12)
    with pytest.raises(ValueError):
        bw[0, 1] = 1.0  # cached matrices are read-only


def test_tensoropt_routes_by_hand() -> None:
    topo = load_preset("tensoropt")
    local = topo.route("m0/gpu0", "m0/gpu5")
    assert local.path == ("m0/gpu0", "m0/gpu5")
    assert local.bandwidth_bytes_per_s == 25e9 and local.latency_s == 2e-6
    assert [topo.links[i].kind for i in local.links] == ["nvlink"]

    cross = topo.route("m0/gpu1", "m1/gpu2")
    assert cross.path == ("m0/gpu1", "m0/pcie", "ib-switch", "m1/pcie", "m1/gpu2")
    assert [topo.links[i].kind for i in cross.links] == ["pcie", "infiniband", "infiniband", "pcie"]
    # PCIe 12e9 B/s is narrower than 100 Gb/s EDR = 12.5e9 B/s
    assert cross.bandwidth_bytes_per_s == 12e9
    assert cross.latency_s == pytest.approx(5e-6 + 5e-6 + 5e-6 + 5e-6, rel=1e-12)
    assert cross.transfer_time_s(1e9) == pytest.approx(20e-6 + 1e9 / 12e9, rel=1e-12)
    assert topo.bandwidth_matrix()[topo.device_index("m0/gpu1"), topo.device_index("m1/gpu2")] == 12e9


def test_route_links_follow_the_path() -> None:
    topo = load_preset("flexflow-k80")
    route = topo.route("m0/gpu0", "m3/gpu3")
    assert route.path == ("m0/gpu0", "m0/pcie0", "m0/host", "ib-switch", "m3/host", "m3/pcie1", "m3/gpu3")
    assert len(route.links) == len(route.path) - 1
    for (a, b), i in zip(itertools.pairwise(route.path), route.links, strict=True):
        assert {topo.links[i].a, topo.links[i].b} == {a, b}
    assert route.bandwidth_bytes_per_s == 7e9  # 56 Gb/s FDR
    assert route.latency_s == pytest.approx(6 * 5e-6, rel=1e-12)
    same_switch = topo.route("m0/gpu0", "m0/gpu1")
    assert same_switch.path == ("m0/gpu0", "m0/pcie0", "m0/gpu1") and same_switch.bandwidth_bytes_per_s == 12e9
    other_switch = topo.route("m0/gpu0", "m0/gpu2")
    assert other_switch.path == ("m0/gpu0", "m0/pcie0", "m0/host", "m0/pcie1", "m0/gpu2")


def test_preset_link_figures() -> None:
    p100 = load_preset("flexflow-p100")
    assert p100.route("m1/gpu0", "m1/gpu3").bandwidth_bytes_per_s == 20e9
    assert p100.route("m0/gpu0", "m2/gpu0").path[1:-1] == ("m0/nic", "ib-switch", "m2/nic")
    assert p100.route("m0/nic", "ib-switch").bandwidth_bytes_per_s == 12.5e9
    h100 = load_preset("h100-2x8")
    inside = h100.route("m0/gpu0", "m0/gpu7")
    assert inside.path == ("m0/gpu0", "m0/nvswitch", "m0/gpu7") and inside.bandwidth_bytes_per_s == 450e9
    across = h100.route("m0/gpu0", "m1/gpu7")
    assert across.path == ("m0/gpu0", "ib-switch", "m1/gpu7") and across.bandwidth_bytes_per_s == 50e9
    cloud = load_preset("tag-cloud")
    assert cloud.route("m0/gpu0", "m0/gpu7").bandwidth_bytes_per_s == 25e9
    assert cloud.route("m0/gpu0", "m2/gpu0").bandwidth_bytes_per_s == 1.25e9  # 10 Gb/s
    testbed = load_preset("tag-testbed")
    assert testbed.route("m1/gpu0", "m5/gpu1").bandwidth_bytes_per_s == 12e9
    assert testbed.route("m1/gpu0", "m1/gpu1").path == ("m1/gpu0", "m1/pcie", "m1/gpu1")
    assert load_preset("trinity").route("m0/gpu0", "m0/gpu3").path == ("m0/gpu0", "m0/pcie", "m0/gpu3")


# -------------------------------------------------------------------------------------- routing
def test_widest_path_is_not_the_shortest() -> None:
    links = [link("a", "b", 1e9), link("a", "s", 10e9), link("s", "b", 10e9)]
    topo = DeviceTopology("tri", [gpu("a"), gpu("b")], links, ["s"])
    route = topo.route("a", "b")
    assert route.path == ("a", "s", "b")
    assert route.bandwidth_bytes_per_s == 10e9 and route.latency_s == pytest.approx(2e-6)
    assert topo.bandwidth_matrix()[0, 1] == 10e9


def test_wider_but_slower_prefix_loses_after_narrow_link() -> None:
    # u is reached wide & slow via x or narrower & fast via y; the u-b link (1e9) is the bottleneck
    # either way, so the lower latency (via y) must win. A single Dijkstra on the combined label
    # (bandwidth, latency, ...) settles u via x and wrongly answers a-x-u-b.
    links = [
        link("a", "x", 10e9, 9e-6),
        link("x", "u", 10e9),
        link("a", "y", 5e9),
        link("y", "u", 5e9),
        link("u", "b", 1e9),
    ]
    topo = DeviceTopology("t", [gpu("a"), gpu("b")], links, ["x", "y", "u"])
    route = topo.route("a", "b")
    assert route.path == ("a", "y", "u", "b") and route.links == (2, 3, 4)
    assert route.bandwidth_bytes_per_s == 1e9 and route.latency_s == pytest.approx(3e-6)
    assert topo.route("a", "u").path == ("a", "x", "u")  # to u itself the wide path wins


def test_tie_breaks_latency_hops_then_names() -> None:
    devices = [gpu("a"), gpu("b")]
    # equal bandwidth and latency: fewer hops beats a lexicographically smaller longer path
    links = [link("a", "z", 1e9, 2e-6), link("a", "c", 1e9), link("c", "z", 1e9)]
    hops = DeviceTopology("h", [gpu("a"), gpu("z")], links, ["c"])
    assert hops.route("a", "z").path == ("a", "z")
    # equal bandwidth: lower latency beats fewer hops
    lat = DeviceTopology("l", devices, [link("a", "b", 1e9, 3e-6), link("a", "s", 1e9), link("s", "b", 1e9)], ["s"])
    assert lat.route("a", "b").path == ("a", "s", "b")
    # all equal: lexicographically smaller path, regardless of declaration order
    links = [link("a", "z", 1e9), link("z", "b", 1e9), link("a", "c", 1e9), link("c", "b", 1e9)]
    names = DeviceTopology("n", devices, links, ["z", "c"])
    assert names.route("a", "b").path == ("a", "c", "b")
    assert names.route("b", "a").path == ("b", "c", "a")


def test_route_to_self_and_unknown_nodes() -> None:
    topo = load_preset("tensoropt")
    route = topo.route("m0/gpu0", "m0/gpu0")
    assert route == Route("m0/gpu0", "m0/gpu0", ("m0/gpu0",), (), math.inf, 0.0)
    assert route.transfer_time_s(1e12) == 0.0
    assert topo.route("ib-switch", "m1/pcie").path == ("ib-switch", "m1/pcie")
    with pytest.raises(UnknownNameError, match="m9/gpu0"):
        topo.route("m0/gpu0", "m9/gpu0")
    with pytest.raises(UnknownNameError, match="'ib-switch'") as info:
        topo.device("ib-switch")  # a switch is not a device
    assert info.value.kind == "device" and "m0/gpu0" in info.value.valid


def _calls(fn: Callable[[], object]) -> int:
    """Python and builtin function calls made by ``fn()``: a measure of work that ignores machine load."""
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    return pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]


def test_routing_is_fast_for_64_devices() -> None:
    fresh = DeviceTopology.from_dict(load_preset("flexflow-k80").to_dict())  # bypass the preset cache
    # One widest-path search per source device: ~74k calls for 64 devices and 112 links, where a
    # search per device pair would take millions. Counted, not timed, so a loaded machine cannot fail it.
    assert _calls(fresh.bandwidth_matrix) < 200_000
    matrix = fresh.bandwidth_matrix()
    assert _calls(fresh.bandwidth_matrix) < 10  # cached
    assert fresh.bandwidth_matrix() is matrix and matrix.shape == (64, 64)


def test_machines_and_summary() -> None:
    topo = load_preset("tag-testbed")
    machines = topo.machines()
    assert list(machines) == [f"m{i}" for i in range(7)]
    assert [d.name for d in machines["m0"]] == [f"m0/gpu{j}" for j in range(4)]
    text = topo.summary()
    for needle in (
        "tag-testbed",
        "16 devices",
        "m6: 2 x P100-PCIE-12GB",
        "V100-SXM2-32GB: 15.7 TFLOP/s",
        "nvlink links: 6 at 25 GB/s",
        "ethernet links: 7 at 12.5 GB/s",
    ):
        assert needle in text


def test_topology_is_immutable_and_hashable() -> None:
    topo = load_preset("trinity")
    with pytest.raises(AttributeError):
        topo.devices = ()  # type: ignore[misc]
    copy = DeviceTopology(topo.name, list(topo.devices), list(topo.links), list(topo.switches))
    assert copy == topo and hash(copy) == hash(topo) and len({copy, topo}) == 1
    assert DeviceTopology("other", topo.devices, topo.links, topo.switches) != topo
    slower = [Link(e.a, e.b, e.bandwidth_bytes_per_s / 2, e.latency_s, e.kind) for e in topo.links]
    assert DeviceTopology(topo.name, topo.devices, slower, topo.switches) != topo


# ----------------------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("spec", [*PRESETS, "random:0", "random:1", "random:42", "random:1000003"])
def test_json_round_trip_is_lossless(spec: str, tmp_path: Path) -> None:
    topo = resolve_topology(spec)
    path = tmp_path / "topo.json"
    topo.to_json(path)
    back = DeviceTopology.from_json(path)
    assert back == topo and back.to_dict() == topo.to_dict()
    assert [e.bandwidth_bytes_per_s for e in back.links] == [e.bandwidth_bytes_per_s for e in topo.links]
    assert json.loads(path.read_text())["format"] == "placement_rl.topology"
    np.testing.assert_array_equal(back.bandwidth_matrix(), topo.bandwidth_matrix())


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("devices", "links", "switches", "pattern"),
    [
        (*two_gpus(bandwidth_bytes_per_s=0.0), (), r"bandwidth_bytes_per_s = 0\.0; expected a finite number > 0"),
        (*two_gpus(bandwidth_bytes_per_s=math.nan), (), r"bandwidth_bytes_per_s = nan"),
        (*two_gpus(latency_s=-1e-6), (), r"'g0' <-> 'g1'.*latency_s = -1e-06; expected a finite number >= 0"),
        (*two_gpus(b="ghost"), (), r"endpoint 'ghost' is not a device or switch"),
        (*two_gpus(b="g0"), (), r"joins 'g0' to itself"),
        (*two_gpus(kind="carrier-pigeon"), (), r"kind 'carrier-pigeon'"),
        ([gpu("g0"), gpu("g0")], [], (), r"duplicate node name 'g0'"),
        (*two_gpus(), ("g1",), r"duplicate node name 'g1'"),
        ([gpu("g0"), gpu("g1"), gpu("lonely")], [link("g0", "g1", 1e9)], (), r"disconnected: devices \['lonely'\]"),
        ([], [], (), r"no device"),
        ([Device("g0", "x", "m0", 1e12, 0, 1e9)], [], (), r"'g0': memory_bytes = 0"),
        ([Device("g0", "x", "m0", 0.0, 1, 1e9)], [], (), r"'g0': peak_flops = 0\.0"),
        ([Device("g0", "x", "m0", 1e12, 1, -1.0)], [], (), r"'g0': memory_bandwidth_bytes_per_s = -1\.0"),
    ],
)
def test_invalid_topologies_name_the_problem(
    devices: list[Device], links: list[Link], switches: tuple[str, ...], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        DeviceTopology("bad", devices, links, switches)


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="topology preset 'dgx-9000'") as info:
        load_preset("dgx-9000")
    assert info.value.valid == sorted([*PRESETS, "dgx-a100-xN (N = 1..512)", "dgx-h100-xN (N = 1..512)"])
    assert all(name in str(info.value) for name in PRESETS)


def _mutated(edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    """The trinity preset's document after ``edit``."""
    document = load_preset("trinity").to_dict()
    edit(document)
    return document


@pytest.mark.parametrize(
    ("document", "pattern"),
    [
        (_mutated(lambda d: d.update(colour="red")), r"unknown key\(s\) \['colour'\]; valid keys are .*'devices'"),
        (
            _mutated(lambda d: d["devices"][1].update(vram=1)),
            r"topology\.devices\[1\]: unknown key\(s\) \['vram'\].*memory_bytes",
        ),
        (_mutated(lambda d: d["links"][0].pop("kind")), r"topology\.links\[0\]: missing key\(s\) \['kind'\]"),
        (
            _mutated(lambda d: d.update(format="placement_rl.graph")),
            r"format 'placement_rl\.topology', got format 'placement_rl\.graph'",
        ),
        (_mutated(lambda d: d.update(schema_version=2)), r"schema_version 2"),
        (
            _mutated(lambda d: d["devices"][0].update(memory_bytes=1.5)),
            r"topology\.devices\[0\]\.memory_bytes: expected an integer",
        ),
        (
            _mutated(lambda d: d["links"][2].update(bandwidth_bytes_per_s="fast")),
            r"topology\.links\[2\]\.bandwidth_bytes_per_s: expected a number",
        ),
        (_mutated(lambda d: d["links"][0].update(kind="wifi")), r"topology\.links\[0\]\.kind: 'wifi'"),
        (_mutated(lambda d: d.update(switches="m0/pcie")), r"topology\.switches: expected a list"),
        ([1, 2], r"expected a JSON object"),
    ],
)
def test_bad_documents_raise_schema_error(document: Any, pattern: str) -> None:
    with pytest.raises(SchemaError, match=pattern):
        DeviceTopology.from_dict(document)


def test_bad_values_in_document_raise_value_error() -> None:
    document = _mutated(lambda d: d["links"][0].update(bandwidth_bytes_per_s=0))
    with pytest.raises(
        ValueError, match=r"topology\.links\[0\]\.bandwidth_bytes_per_s = 0; expected a finite number > 0"
    ):
        DeviceTopology.from_dict(document)


def test_malformed_json_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"format": "placement_rl.topology",\n "name": }')
    with pytest.raises(SchemaError, match=r"broken\.json: malformed JSON at line 2"):
        DeviceTopology.from_json(path)


# ----------------------------------------------------------------------------- random topologies
def test_random_topology_is_deterministic_and_seed_dependent() -> None:
    assert random_topology(7) == random_topology(7)
    assert random_topology(7).name == "random-7"
    docs = {json.dumps({**random_topology(s).to_dict(), "name": ""}) for s in range(20)}
    assert len(docs) == 20


def test_random_topology_uses_only_its_own_rng() -> None:
    np.random.seed(0)
    state = np.random.get_state()[1].copy()
    first = random_topology(11)
    np.random.seed(123)
    assert random_topology(11) == first
    np.random.seed(0)
    random_topology(11)
    np.testing.assert_array_equal(np.random.get_state()[1], state)


def test_random_topologies_follow_tag_distribution() -> None:
    machine_counts, gpu_counts, types = Counter(), Counter(), Counter()
    for seed in range(200):
        topo = random_topology(seed)
        machines = topo.machines()
        machine_counts[len(machines)] += 1
        for devices in machines.values():
            gpu_counts[len(devices)] += 1
            assert len({d.device_type for d in devices}) == 1
            types[devices[0].device_type] += 1
        assert set(topo.switches) == {"net-switch", *(f"{m}/switch" for m in machines)}
        for e in topo.links:
            if e.kind == "ethernet":
                assert e.b == "net-switch" and 20e9 / 8 <= e.bandwidth_bytes_per_s <= 50e9 / 8
                assert e.latency_s == 25e-6
            else:
                assert e.b.endswith("/switch") and 64e9 / 8 <= e.bandwidth_bytes_per_s <= 160e9 / 8
                # NVLink only between GPUs that have NVLink ports (SXM modules), never between PCIe cards
                has_nvlink = DEVICE_TYPES[topo.device(e.a).device_type].nvlink
                assert e.kind == ("nvlink" if has_nvlink and e.bandwidth_bytes_per_s >= 100e9 / 8 else "pcie")
    assert set(machine_counts) == set(range(1, 7))
    assert set(gpu_counts) == set(range(1, 9))
    assert set(types) == {"V100-SXM2-32GB", "GTX-1080Ti", "P100-PCIE-12GB"}


def test_summary_counts_in_words() -> None:
    single = next(random_topology(s) for s in range(100) if len(random_topology(s).machines()) == 1)
    assert " on 1 machine, " in single.summary().splitlines()[0]
    assert " on 4 machines, 5 switches, " in load_preset("flexflow-p100").summary().splitlines()[0]


@pytest.mark.parametrize("seed", [-1, 1.0, "3", True, None])
def test_random_topology_rejects_bad_seeds(seed: Any) -> None:
    with pytest.raises(ValueError, match="seed"):
        random_topology(seed)


def test_seed_splits() -> None:
    assert TRAIN_SEEDS == range(0, 1_000_000) and TEST_SEEDS == range(1_000_000, 2_000_000)
    assert set(TRAIN_SEEDS).isdisjoint(TEST_SEEDS)
    assert topology_seeds("train", 5) == [0, 1, 2, 3, 4]
    assert topology_seeds("test", 3, start=10) == [1_000_010, 1_000_011, 1_000_012]
    assert all(s in TEST_SEEDS for s in topology_seeds("test", 100))
    assert topology_seeds("train", 0) == []
    with pytest.raises(UnknownNameError, match="'valid'"):
        topology_seeds("valid", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="leaves the train range"):
        topology_seeds("train", 2, start=999_999)
    with pytest.raises(ValueError, match="count = -1"):
        topology_seeds("test", -1)


# ------------------------------------------------------------------------------------ resolving
def test_resolve_topology(tmp_path: Path) -> None:
    assert resolve_topology("tag-cloud") == load_preset("tag-cloud")
    assert resolve_topology("random:7") == random_topology(7)
    path = tmp_path / "custom.json"
    random_topology(3).to_json(path)
    assert resolve_topology(str(path)) == random_topology(3)
    with pytest.raises(UnknownNameError, match=r"unknown topology 'tag-clod'.*random:SEED.*tensoropt"):
        resolve_topology("tag-clod")
    for bad in ("random:", "random:x", "random:-2", "random:1.5"):
        with pytest.raises(ValueError, match=r"random:SEED"):
            resolve_topology(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        resolve_topology(str(tmp_path / "missing.json"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["links"][0].update(bandwidth_bytes_per_s=10**30),
            r"topology\.links\[0\]\.bandwidth_bytes_per_s = 10{30}; expected a finite number > 0, from 1 to 1e\+15",
        ),
        (
            lambda d: d["links"][0].update(bandwidth_bytes_per_s=1e-300),
            r"topology\.links\[0\]\.bandwidth_bytes_per_s = 1e-300",
        ),
        (
            lambda d: d["links"][0].update(latency_s=1e30),
            r"topology\.links\[0\]\.latency_s = 1e\+30; expected a finite number >= 0, at most 3600",
        ),
        (
            lambda d: d["devices"][0].update(memory_bytes=10**30),
            r"topology\.devices\[0\]: device 'm0/gpu0': memory_bytes = 10{30}; "
            r"expected a positive integer of at most 1e\+15",
        ),
        (lambda d: d["devices"][0].update(memory_bytes=10**400), r"memory_bytes = 1000.*\(401 digits\)"),
        (
            lambda d: d["devices"][1].update(peak_flops=1e30),
            r"topology\.devices\[1\]: device 'm0/gpu1': peak_flops = 1e\+30; "
            r"expected a finite number > 0, from 1 to 1e\+18",
        ),
        (
            lambda d: d["devices"][0].update(memory_bandwidth_bytes_per_s=10**20),
            r"memory_bandwidth_bytes_per_s = 1e\+20",
        ),
        (
            lambda d: d["devices"][0].update(peak_flops_by_dtype={"bf16": 1e300}),
            r"peak_flops_by_dtype\['bf16'\] = 1e\+300",
        ),
        (lambda d: d.update(devices=[]), r"has no device; expected at least one"),
        (lambda d: d["links"][0].update(b=d["links"][0]["a"]), r"joins 'm0/gpu0' to itself"),
        (lambda d: d["links"][0].update(b="nowhere"), r"endpoint 'nowhere' is not a device or switch"),
        (lambda d: d["devices"][0].update(memory_bytes=True), r"memory_bytes: expected an integer, got True"),
    ],
)
def test_topology_files_out_of_bounds_are_refused_naming_file_key_and_value(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = _mutated(mutate)
    file = tmp_path / "topology.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match=message) as info:
        DeviceTopology.from_json(file)
    assert str(info.value).startswith(f"{file}: ")


def test_topologies_are_bounded_in_size() -> None:
    from placement_rl.emulate.cluster import resolve_emulation_topology
    from placement_rl.topology import MAX_TOPOLOGY_DEVICES

    assert MAX_TOPOLOGY_DEVICES == 100_000
    with pytest.raises(ValueError, match=r"100000x100000: 10,000,000,000 devices; expected at most 100,000"):
        resolve_emulation_topology("100000x100000")
    with pytest.raises(ValueError, match=r"expected a finite positive rate"):
        resolve_emulation_topology("2x2@1e400")
    devices = [Device(f"g{i}", "T4", "m0", 1e12, 2**30, 1e11) for i in range(MAX_TOPOLOGY_DEVICES + 1)]
    with pytest.raises(ValueError, match=r"has 100,001 devices; expected at most 100,000"):
        DeviceTopology("big", devices, [])
