"""The device catalogue's datasheet entries (A100, H200, L4, L40S, B200) and the DGX cluster presets
(``dgx-a100-xN``, ``dgx-h100-xN``: rail-optimized fat trees of 1 to 512 nodes)."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.plan import data_parallel
from placement_rl.sim import simulate
from placement_rl.sim.network import max_min_rates, network
from placement_rl.sim.result import TASK_KINDS
from placement_rl.topology import (
    DEVICE_TYPE_ALIASES,
    DEVICE_TYPES,
    DGX_MAX_NODES,
    DGX_SYSTEMS,
    GIB,
    DeviceTopology,
    dgx_cluster,
    load_preset,
    make_device,
    preset_names,
    resolve_topology,
)
from placement_rl.topology.presets import PRESET_INFO

T = 1e12
H200_TOPOLOGY = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200" / "topology_h200x1.json"

# name -> (fp32, tf32, bf16, fp16 in TFLOP/s, memory GiB, memory GB/s, NVLink): the datasheets' dense figures
NEW_DEVICES: dict[str, tuple[float, float, float, float, int, float, bool]] = {
    "A100-SXM4-40GB": (19.5, 156, 312, 312, 40, 1555, True),
    "A100-SXM4-80GB": (19.5, 156, 312, 312, 80, 2039, True),
    "A100-PCIE-40GB": (19.5, 156, 312, 312, 40, 1555, False),
    "A100-PCIE-80GB": (19.5, 156, 312, 312, 80, 1935, False),
    "H200-SXM-141GB": (67, 494.7, 989.4, 989.4, 141, 4800, True),
    "H200": (67, 494.7, 989.4, 989.4, 141, 4800, True),
    "L4": (30.3, 60, 121, 121, 24, 300, False),
    "L40S": (91.6, 183, 362.05, 362.05, 48, 864, False),
    "B200": (75, 1100, 2250, 2250, 180, 7700, True),
}

# family -> (device type, NVSwitch bytes/s per direction, NIC bytes/s, nodes per leaf)
DGX = {
    "dgx-a100": ("A100-SXM4-80GB", 300e9, 200e9 / 8, 20),
    "dgx-h100": ("H100-SXM5-80GB", 450e9, 400e9 / 8, 32),
}


# ------------------------------------------------------------------------------------ catalogue
@pytest.mark.parametrize("name", list(NEW_DEVICES))
def test_new_devices_carry_their_datasheet_figures(name: str) -> None:
    fp32, tf32, bf16, fp16, memory_gib, memory_gb_per_s, nvlink = NEW_DEVICES[name]
    spec = DEVICE_TYPES[name]
    assert spec.peak_flops == pytest.approx(fp32 * T, rel=1e-12)
    assert dict(spec.peak_flops_by_dtype) == pytest.approx({"tf32": tf32 * T, "bf16": bf16 * T, "fp16": fp16 * T})
    assert spec.memory_bytes == memory_gib * GIB
    assert spec.memory_bandwidth_bytes_per_s == pytest.approx(memory_gb_per_s * 1e9, rel=1e-12)
    assert spec.nvlink is nvlink and spec.source == "vendor datasheet"
    device = make_device("m0/gpu0", name, "m0")
    assert device.device_type == name
    for dtype, tflops in (("fp32", fp32), ("tf32", tf32), ("bf16", bf16), ("fp16", fp16)):
        assert device.peak_flops_for(dtype) == pytest.approx(tflops * T, rel=1e-12)
    # a single-device topology of it is valid and round-trips through JSON
    topo = DeviceTopology("one", [device], [])
    assert DeviceTopology.from_dict(topo.to_dict()) == topo


def test_the_catalogue_documents_every_device_and_its_source() -> None:
    source = Path(__file__).resolve().parents[1] / "placement_rl" / "topology" / "devices.py"
    comment = "\n".join(line for line in source.read_text().splitlines() if line.startswith("#:"))
    for model in ("A100", "H200", "L4 ", "L40S", "B200", "H100", "V100", "T4", "P100"):
        assert f"* {model}" in comment, model
    for figure in ("1,935", "2,039", "1,555", "4.8 TB/s", "7.7 TB/s", "864 GB/s", "300 GB/s", "362.05", "494.7"):
        assert figure in comment, figure


def test_the_h200_label_of_the_measured_data_resolves() -> None:
    assert DEVICE_TYPE_ALIASES == {"H200": "H200-SXM-141GB"}
    assert DEVICE_TYPES["H200"] == DEVICE_TYPES["H200-SXM-141GB"]
    device = make_device("m0/gpu0", "H200", "m0")
    assert device.device_type == "H200"  # the label profiles and topologies of benchmarks/data/h200 use
    canonical = make_device("m0/gpu0", "H200-SXM-141GB", "m0")
    assert (device.peak_flops, device.peak_flops_by_dtype, device.memory_bandwidth_bytes_per_s) == (
        canonical.peak_flops,
        canonical.peak_flops_by_dtype,
        canonical.memory_bandwidth_bytes_per_s,
    )
    # the measured machine's topology (benchmarks/data/h200, in the repository): the same datasheet peaks
    (measured,) = DeviceTopology.from_json(H200_TOPOLOGY).devices
    spec = DEVICE_TYPES[measured.device_type]
    assert measured.device_type == "H200"
    assert (measured.peak_flops, measured.memory_bandwidth_bytes_per_s) == pytest.approx(
        (spec.peak_flops, spec.memory_bandwidth_bytes_per_s)
    )
    assert dict(measured.peak_flops_by_dtype) == pytest.approx(dict(spec.peak_flops_by_dtype))
    document = json.loads(H200_TOPOLOGY.read_text())
    assert document["devices"][0]["memory_bytes"] <= spec.memory_bytes  # 140.4 GiB usable of 141


# -------------------------------------------------------------------------------- DGX presets
@pytest.mark.parametrize(
    ("family", "nodes"),
    [("dgx-a100", 1), ("dgx-a100", 2), ("dgx-a100", 21), ("dgx-h100", 1), ("dgx-h100", 3), ("dgx-h100", 33)],
)
def test_dgx_presets_have_the_size_in_their_name(family: str, nodes: int) -> None:
    device_type, _, _, per_leaf = DGX[family]
    name = f"{family}-x{nodes}"
    topo = resolve_topology(name)
    assert topo is load_preset(name) and topo.name == name
    assert topo.num_devices == 8 * nodes and len(topo.machines()) == nodes
    assert Counter(d.device_type for d in topo.devices) == {device_type: 8 * nodes}
    units = math.ceil(nodes / per_leaf)
    leaves = {f"su{s}/leaf{r}" for s in range(units) for r in range(8)}
    assert set(topo.switches) == {"spine", *leaves, *(f"m{i}/nvswitch" for i in range(nodes))}
    assert len(topo.links) == 16 * nodes + len(leaves)  # linear in the nodes


@pytest.mark.parametrize("family", list(DGX))
def test_dgx_nvswitch_and_nic_bandwidths(family: str) -> None:
    _, nvswitch, nic, per_leaf = DGX[family]
    topo = load_preset(f"{family}-x{per_leaf + 1}")  # two scalable units, the second with one node
    kinds: dict[str, Counter[str]] = {d.name: Counter() for d in topo.devices}
    for link in topo.links:
        if link.a in kinds:
            kinds[link.a][link.kind] += 1
        if link.kind == "nvswitch":
            assert link.bandwidth_bytes_per_s == nvswitch and link.b.endswith("/nvswitch")
        elif link.a in kinds:  # a GPU's own NIC into its rail's leaf
            machine, gpu = link.a.split("/")
            unit = int(machine[1:]) // per_leaf
            assert (link.kind, link.b, link.bandwidth_bytes_per_s) == ("infiniband", f"su{unit}/leaf{gpu[3:]}", nic)
        else:  # a leaf's uplink: as much as its downlinks carry (full bisection)
            assert (link.kind, link.b, link.bandwidth_bytes_per_s) == ("infiniband", "spine", per_leaf * nic)
    assert all(counts == {"nvswitch": 1, "infiniband": 1} for counts in kinds.values())
    assert topo.route("m0/gpu0", "m0/gpu5").bandwidth_bytes_per_s == nvswitch
    assert "NVSwitch" in PRESET_INFO[f"{family}-x2"][0] and "any size" in PRESET_INFO[f"{family}-x2"][0]


def test_fat_tree_routes_every_pair_and_crosses_the_spine_between_units() -> None:
    topo = load_preset("dgx-a100-x21")  # 20 nodes under su0's leaves, m20 under su1's
    _, nvswitch, nic, _ = DGX["dgx-a100"]
    bandwidth = topo.bandwidth_matrix()
    machine = np.array([int(d.machine[1:]) for d in topo.devices])
    same = machine[:, None] == machine[None, :]
    off = ~np.eye(topo.num_devices, dtype=bool)
    assert np.all(bandwidth[same & off] == nvswitch)
    assert np.all(bandwidth[~same] == nic)  # every pair of nodes at the full NIC rate
    assert np.all(np.isfinite(topo.latency_matrix()[off]))
    across = topo.route("m0/gpu0", "m20/gpu0")
    assert across.path == ("m0/gpu0", "su0/leaf0", "spine", "su1/leaf0", "m20/gpu0")
    assert "spine" in topo.route("m3/gpu2", "m20/gpu6").path
    assert topo.route("m0/gpu0", "m19/gpu0").path == ("m0/gpu0", "su0/leaf0", "m19/gpu0")  # one rail, one leaf
    other_rail = topo.route("m0/gpu0", "m19/gpu3").path  # forwarded over an NVSwitch to the right rail
    assert "spine" not in other_rail and any(node.endswith("/nvswitch") for node in other_rail)


def test_the_fat_tree_has_full_bisection_bandwidth() -> None:
    # every GPU of the first scalable unit sends to a GPU of the second on another rail at once
    topo = load_preset("dgx-h100-x64")
    net = network(topo)
    index = {d.name: i for i, d in enumerate(topo.devices)}
    flows = [
        net.route_dirs_of(index[f"m{n}/gpu{r}"], index[f"m{32 + (n + 5) % 32}/gpu{(r + 3) % 8}"]).tolist()
        for n in range(32)
        for r in range(8)
    ]
    rates = max_min_rates(flows, net.capacity)
    np.testing.assert_allclose(rates, DGX["dgx-h100"][2], rtol=1e-12)


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("dgx-h100-x0", "'dgx-h100-x0': 0 nodes is out of range"),
        ("dgx-h100-x513", "'dgx-h100-x513': 513 nodes is out of range"),
        ("dgx-a100-x1.5", "'dgx-a100-x1.5': node count '1.5' is not an integer"),
        ("dgx-a100-x", "'dgx-a100-x': node count '' is not an integer"),
        ("dgx-h100-x-4", "'dgx-h100-x-4': node count '-4' is not an integer"),
        ("dgx-h100-xfour", "'dgx-h100-xfour': node count 'four' is not an integer"),
    ],
)
def test_bad_dgx_sizes_name_the_value_and_the_range(spec: str, pattern: str) -> None:
    for resolve in (resolve_topology, load_preset):
        with pytest.raises(ValueError, match=pattern) as info:
            resolve(spec)
        assert f"N an integer from 1 to {DGX_MAX_NODES}" in str(info.value)
        assert not isinstance(info.value, UnknownNameError)


def test_dgx_cluster_checks_its_arguments() -> None:
    assert dgx_cluster("dgx-h100", 3) == load_preset("dgx-h100-x3")
    for nodes in (0, 513, 2.0, True):
        with pytest.raises(ValueError, match=f"of {nodes!r} nodes: expected an integer number of nodes from 1 to 512"):
            dgx_cluster("dgx-h100", nodes)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match="unknown DGX family 'dgx-z100'"):
        dgx_cluster("dgx-z100", 2)
    with pytest.raises(UnknownNameError, match=r"dgx-h100-xN \(N = 1\.\.512\)"):
        resolve_topology("dgx-h100")  # no size: an unknown name, whose message shows the sized form


def test_dgx_presets_are_listed_and_documented() -> None:
    names = preset_names()
    assert {"dgx-a100-x2", "dgx-h100-x2"} <= set(names) and set(DGX_SYSTEMS) == set(DGX)
    for family, (device_type, nvswitch, nic, per_leaf) in DGX.items():
        system = DGX_SYSTEMS[family]
        assert (system.device_type, system.nvswitch_bytes_per_s, system.nodes_per_leaf) == (
            device_type,
            nvswitch,
            per_leaf,
        )
        assert system.nic_gbit_per_s * 1e9 / 8 == nic
    page = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "topology.md").read_text()
    assert "| dgx-h100-x2 |" in page and "dgx-h100-x384" in page
    assert resolve_topology("dgx-h100-x384").num_devices == 3072  # a 3,072-GPU cluster is one argument


def test_a_4096_gpu_cluster_builds_in_linear_time_and_routes_lazily() -> None:
    start = time.perf_counter()
    topo = dgx_cluster("dgx-h100", DGX_MAX_NODES)  # not the cached preset: the build itself
    assert time.perf_counter() - start < 5.0  # about 0.1 s; nothing quadratic in the devices
    assert topo.num_devices == 4096 and len(topo.links) == 16 * 512 + 8 * 16
    net = network(topo)
    net.route_dirs_of(0, 4095)
    assert net.sources_built == 1  # routes are built per source device, when asked for


# ---------------------------------------------------------------------------------- simulation
@pytest.mark.parametrize("name", ["dgx-a100-x2", "dgx-h100-x2"])
def test_data_parallel_simulates_on_two_dgx_nodes(name: str, zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("lenet")
    topo = load_preset(name)
    result = simulate(graph, topo, data_parallel(graph, topo))
    assert math.isfinite(result.makespan_s) and result.makespan_s > 0
    tasks = result.tasks
    used = {int(lane) for lane in tasks.lane[tasks.kind == TASK_KINDS.index("forward")]}
    assert used == set(range(16))  # every GPU of both nodes computes
    assert np.any(tasks.kind == TASK_KINDS.index("all_reduce"))


def test_a_small_plan_on_the_largest_cluster_builds_only_its_routes(zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("lenet")
    topo = load_preset(f"dgx-h100-x{DGX_MAX_NODES}")
    devices = [d.name for d in topo.devices[:8]] + [d.name for d in topo.devices[-8:]]  # first and last node
    result = simulate(graph, topo, data_parallel(graph, topo, devices))
    assert math.isfinite(result.makespan_s) and result.makespan_s > 0
    assert network(topo).sources_built <= 16
