"""Routes and rings of placement_rl.sim.network on hand-built topologies with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim
from placement_rl.plan import OpConfig, Plan
from placement_rl.search.ft.rescheduling import _Comm
from placement_rl.sim.cost import CostModel
from placement_rl.sim.network import Network, network
from placement_rl.sim.result import TASK_KINDS
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import Device, DeviceTopology, Link

NVLINK_BW, PCIE_BW, IB_BW = 50e9, 10e9, 5e9
NVLINK_LAT, PCIE_LAT, IB_LAT = 1e-6, 2e-6, 5e-6
CROSS_LAT = PCIE_LAT + IB_LAT + PCIE_LAT  # GPU -> NIC -> NIC -> GPU


def _two_machines() -> DeviceTopology:
    """Two machines of two GPUs: NVLink inside a machine, each GPU on its machine's NIC by PCIe, the
    two NICs joined by InfiniBand (the narrowest link, so every cross-machine route's bottleneck)."""
    devices = [Device(f"g{i}", "test-gpu", f"m{i // 2}", 1e12, 2**34, 1e12) for i in range(4)]
    links = [
        Link("g0", "g1", NVLINK_BW, NVLINK_LAT, "nvlink"),  # 0: directions 0 (g0 -> g1), 1 (g1 -> g0)
        Link("g2", "g3", NVLINK_BW, NVLINK_LAT, "nvlink"),  # 1: 2, 3
        Link("g0", "nic0", PCIE_BW, PCIE_LAT, "pcie"),  # 2: 4 (g0 -> nic0), 5
        Link("g1", "nic0", PCIE_BW, PCIE_LAT, "pcie"),  # 3: 6, 7
        Link("g2", "nic1", PCIE_BW, PCIE_LAT, "pcie"),  # 4: 8 (g2 -> nic1), 9 (nic1 -> g2)
        Link("g3", "nic1", PCIE_BW, PCIE_LAT, "pcie"),  # 5: 10, 11
        Link("nic0", "nic1", IB_BW, IB_LAT, "infiniband"),  # 6: 12 (nic0 -> nic1), 13 (nic1 -> nic0)
    ]
    return DeviceTopology("two-machines", devices, links, ["nic0", "nic1"])


def _tied_star() -> DeviceTopology:
    """Three devices on one switch; a's PCIe and b's Ethernet link are equally narrow."""
    devices = [Device(name, "test-gpu", "m0", 1e12, 2**34, 1e12) for name in ("a", "b", "c")]
    links = [
        Link("a", "sw", 4e9, 1e-6, "pcie"),
        Link("b", "sw", 4e9, 3e-6, "ethernet"),
        Link("c", "sw", 100e9, 1e-6, "nvlink"),
    ]
    return DeviceTopology("tied-star", devices, links, ["sw"])


def test_routes_are_link_directions_in_path_order() -> None:
    net = Network(_two_machines())
    assert net.route_dirs_of(0, 2).tolist() == [4, 12, 9]  # g0 -> nic0 -> nic1 -> g2
    assert net.route_dirs_of(2, 0).tolist() == [8, 13, 5]
    assert net.route_dirs_of(0, 1).tolist() == [0]  # NVLink, not through the NIC
    assert net.route_dirs_of(1, 0).tolist() == [1]
    pair = 0 * 4 + 2
    assert net.route_bw[pair] == IB_BW
    assert net.route_lat[pair] == pytest.approx(CROSS_LAT)
    assert net.route_kind[pair] == "infiniband"
    assert net.route_kind[0 * 4 + 1] == "nvlink"
    assert net.kind_names == ("infiniband", "nvlink")
    assert net.route_kind_id[pair] == 0 and net.route_kind_id[1] == 1


def test_route_arrays_are_consistent_csr() -> None:
    net = Network(_two_machines())
    D = net.num_devices
    for a in range(D):
        pair = a * D + a
        assert (net.route_bw[pair], net.route_lat[pair], net.route_kind[pair]) == (np.inf, 0.0, "")
        assert net.route_len[pair] == 0 and net.route_kind_id[pair] == -1
    for pair in range(D * D):
        segment = net.route_dirs[net.route_ptr[pair] : net.route_ptr[pair + 1]]
        assert segment.tolist() == net.route_dirs_of(pair // D, pair % D).tolist()
        assert len(segment) == net.route_len[pair]
    # 4 same-machine pairs cross one NVLink; 8 cross-machine pairs cross three links
    assert int(net.route_len.sum()) == 4 * 1 + 8 * 3
    dirs, lengths = net.gather(np.array([2, 1, 5]))  # g0 -> g2, g0 -> g1, g1 -> g1
    assert dirs.tolist() == [4, 12, 9, 0] and lengths.tolist() == [3, 1, 0]
    with pytest.raises(ValueError):
        net.route_bw[0] = 1.0  # read-only: shared by every simulator context and FT run


def test_ring_over_all_four_in_machine_order_shares_nothing() -> None:
    ring = Network(_two_machines()).rings([[0, 1, 2, 3]])
    # hops g0 -> g1 (NVLink), g1 -> nic0 -> nic1 -> g2, g2 -> g3 (NVLink), g3 -> nic1 -> nic0 -> g0
    assert ring.dirs.tolist() == [0, 2, 5, 6, 9, 10, 12, 13]
    assert ring.bandwidth_bytes_per_s == IB_BW
    assert ring.latency_s == pytest.approx(CROSS_LAT)
    assert ring.kind == "infiniband"


def test_ring_crossing_machines_twice_halves_the_nic_link() -> None:
    # hops g0 -> g2, g2 -> g1, g1 -> g3, g3 -> g0: each direction of the InfiniBand link carries two
    ring = Network(_two_machines()).rings([[0, 2, 1, 3]])
    assert ring.bandwidth_bytes_per_s == IB_BW / 2
    assert ring.kind == "infiniband"
    assert ring.dirs.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_concurrent_rings_share_links() -> None:
    net = Network(_two_machines())
    across = net.rings([[0, 2], [1, 3]])  # two cross-machine rings at once: both use both IB directions
    assert across.bandwidth_bytes_per_s == IB_BW / 2
    assert across.latency_s == pytest.approx(CROSS_LAT)
    alone = net.rings([[0, 2]])
    assert alone.bandwidth_bytes_per_s == IB_BW
    inside = net.rings([[0, 1], [2, 3]])  # one ring per machine: NVLink each, nothing shared
    assert (inside.bandwidth_bytes_per_s, inside.latency_s, inside.kind) == (NVLINK_BW, NVLINK_LAT, "nvlink")
    assert inside.dirs.tolist() == [0, 1, 2, 3]
    assert net.rings([[0, 2], [1, 3]]) is across  # cached


def test_ring_bottleneck_kind_is_the_first_slowest_hop() -> None:
    net = Network(_tied_star())
    assert net.route_kind[0 * 3 + 1] == "pcie"  # a -> b: a's link comes first on the path
    assert net.route_kind[1 * 3 + 0] == "ethernet"
    assert net.rings([[0, 1]]).kind == "pcie"
    assert net.rings([[1, 0]]).kind == "ethernet"
    ring = net.rings([[0, 1]])
    assert ring.bandwidth_bytes_per_s == 4e9
    assert ring.latency_s == pytest.approx(4e-6)


def test_degenerate_rings_cross_nothing() -> None:
    ring = Network(_two_machines()).rings([[3]])
    assert ring.dirs.size == 0 and ring.bandwidth_bytes_per_s == np.inf and ring.latency_s == 0.0


def test_network_is_shared_per_topology() -> None:
    topo = _two_machines()
    assert network(topo) is network(topo)
    assert network(_two_machines()) is network(topo)  # equal topologies route alike
    assert network(_tied_star()) is not network(topo)


def test_submatrices_follow_the_given_device_order() -> None:
    bw, lat, ptr, dirs = Network(_two_machines()).submatrices([2, 0])
    assert bw.tolist() == [[np.inf, IB_BW], [IB_BW, np.inf]]
    assert lat[0, 1] == pytest.approx(CROSS_LAT) and lat[0, 0] == 0.0
    assert ptr.tolist() == [0, 0, 3, 6, 6]
    assert dirs[ptr[1] : ptr[2]].tolist() == [8, 13, 5]  # g2 -> g0


def _one_layer(param_bytes: int) -> OpGraph:
    op = Op(
        "fc",
        "linear",
        ((8, 16),),
        forward_flops=4e9,
        backward_flops=8e9,
        param_bytes=param_bytes,
        bytes_written=8 * 16 * 4,
        parallel_dims=(ParallelDim("sample", "sample", 0, 8), ParallelDim("channel", "parameter", 1, 16)),
    )
    return OpGraph("fc", [op], [])


@pytest.mark.parametrize(
    ("order", "bandwidth"), [(("g0", "g1", "g2", "g3"), IB_BW), (("g0", "g2", "g1", "g3"), IB_BW / 2)]
)
def test_simulator_all_reduce_uses_the_ring_bandwidth(order: tuple[str, ...], bandwidth: float) -> None:
    param_bytes = 10**6
    graph, topo = _one_layer(param_bytes), _two_machines()
    plan = Plan("fc", {"fc": OpConfig.make(order, {"sample": 4})})
    result = simulate(graph, topo, plan)
    sync = np.flatnonzero(result.tasks.kind == TASK_KINDS.index("all_reduce"))
    assert len(sync) == 1
    duration = result.tasks.end_s[sync[0]] - result.tasks.start_s[sync[0]]
    assert duration == pytest.approx(2 * 3 * (CROSS_LAT + param_bytes / 4 / bandwidth), rel=1e-12)
    assert SimContext(graph, topo).network is network(topo)


@pytest.mark.parametrize(
    ("names", "bandwidth"), [(["g0", "g1", "g2", "g3"], IB_BW), (["g0", "g2", "g1", "g3"], IB_BW / 2)]
)
def test_ft_groups_map_flat_indices_to_topology_devices(names: list[str], bandwidth: float) -> None:
    comm = _Comm(_two_machines(), names, CostModel())
    assert comm.group(((1, 4),)) == (bandwidth, pytest.approx(CROSS_LAT), "infiniband")  # one ring, flat order
    # the minor digit of size 2: rings {flat 0, 1} and {flat 2, 3}
    pairs = comm.group(((1, 2),))
    expected = (NVLINK_BW, NVLINK_LAT, "nvlink") if names[1] == "g1" else (IB_BW / 2, CROSS_LAT, "infiniband")
    assert pairs == (expected[0], pytest.approx(expected[1]), expected[2])
