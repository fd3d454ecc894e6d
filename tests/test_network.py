"""Routes, rings, flows and collectives of placement_rl.sim.network on hand-built topologies with
hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan
from placement_rl.search.ft.rescheduling import _Comm
from placement_rl.sim.cost import CostModel
from placement_rl.sim.network import (
    NETWORK_MODELS,
    PAIR_MODEL_MAX_DEVICES,
    Network,
    drain_time_s,
    max_min_rates,
    network,
)
from placement_rl.sim.result import TASK_KINDS, SimResult
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import Device, DeviceTopology, Link, preset_names, resolve_topology

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
    assert net.bandwidths([pair]).tolist() == [IB_BW]
    assert net.latencies([pair])[0] == pytest.approx(CROSS_LAT)
    assert net.kind(pair) == "infiniband"
    assert net.kind(0 * 4 + 1) == "nvlink"
    assert net.kind_names == ("infiniband", "nvlink", "pcie")  # the kinds of the topology's links
    assert net.kind_ids([pair, 1]).tolist() == [0, 1]


def test_route_queries_are_consistent() -> None:
    net = Network(_two_machines())
    D = net.num_devices
    diagonal = np.arange(D) * (D + 1)
    assert net.bandwidths(diagonal).tolist() == [np.inf] * D and net.latencies(diagonal).tolist() == [0.0] * D
    assert net.lengths(diagonal).tolist() == [0] * D and net.kind_ids(diagonal).tolist() == [-1] * D
    assert net.kind(0) == ""
    every = np.arange(D * D)
    dirs, lengths = net.gather(every)
    ptr = np.concatenate(([0], np.cumsum(lengths)))
    for pair in range(D * D):
        segment = dirs[ptr[pair] : ptr[pair + 1]]
        assert segment.tolist() == net.route_dirs_of(pair // D, pair % D).tolist()
    assert lengths.tolist() == net.lengths(every).tolist()
    # 4 same-machine pairs cross one NVLink; 8 cross-machine pairs cross three links
    assert int(lengths.sum()) == 4 * 1 + 8 * 3
    dirs, lengths = net.gather(np.array([2, 1, 5]))  # g0 -> g2, g0 -> g1, g1 -> g1
    assert dirs.tolist() == [4, 12, 9, 0] and lengths.tolist() == [3, 1, 0]
    assert net.first_dirs([2, 1]).tolist() == [4, 0]
    with pytest.raises(ValueError):
        net.route_dirs_of(0, 2)[0] = 1  # read-only: shared by every simulator context and FT run


def test_transfer_routes_equal_the_route_queries() -> None:
    net = Network(_two_machines())
    D = net.num_devices
    pairs = np.array([p for p in range(D * D) if p // D != p % D] * 2)  # every route twice, none to itself
    moving = np.flatnonzero(np.arange(pairs.shape[0]) % 3 != 1)  # some carry no bytes
    dirs, dir_ptr, latency, first = net.transfer_routes(pairs, moving)
    expected_dirs, lengths = net.gather(pairs[moving])
    assert dirs.tolist() == expected_dirs.tolist()
    assert dir_ptr.tolist() == np.concatenate(([0], np.cumsum(lengths))).tolist()
    assert latency.tolist() == net.latencies(pairs[moving]).tolist()
    assert first.tolist() == net.first_dirs(pairs).tolist()
    with pytest.raises(ValueError, match="crosses no link"):
        net.transfer_routes(np.array([1, D + 1]), np.array([0]))  # g1 -> g1


def test_routes_are_built_only_from_the_sources_asked_for() -> None:
    net = Network(_two_machines())
    assert net.sources_built == 0
    net.bandwidths([2 * 4 + 3, 2 * 4 + 0])  # two routes from g2
    assert net.sources_built == 1
    net.gather([2 * 4 + 1, 3 * 4 + 0])
    assert net.sources_built == 2


def _eager_routes(topology: DeviceTopology) -> list[tuple[list[int], float, float, str]]:
    """Every device pair's route straight from :meth:`DeviceTopology.route` (the rule in Python):
    directions in path order, bottleneck bandwidth, latency, first narrowest link's kind; pairs
    ``a * D + b``."""
    links, names = topology.links, [d.name for d in topology.devices]
    out = []
    for a in names:
        for b in names:
            if a == b:
                out.append(([], np.inf, 0.0, ""))
                continue
            route = topology.route(a, b)
            dirs = [2 * k + (0 if links[k].a == x else 1) for x, k in zip(route.path, route.links, strict=False)]
            narrow = min(route.links, key=lambda k: links[k].bandwidth_bytes_per_s)
            out.append((dirs, route.bandwidth_bytes_per_s, route.latency_s, links[narrow].kind))
    return out


def _tied_mesh(seed: int) -> DeviceTopology:
    """Devices on a ring of switches with chords, few distinct bandwidths and one latency: many routes
    tie on bandwidth, latency and hops, so the name order decides (names shuffled against the order
    of the nodes)."""
    rng = np.random.default_rng(seed)
    switches = [f"s{k}" for k in rng.permutation(12)]
    devices = [Device(f"d{k}", "test-gpu", f"m{k % 3}", 1e12, 2**34, 1e12) for k in rng.permutation(8)]
    links = [Link(switches[k], switches[(k + 1) % 12], 10e9, 1e-6, "infiniband") for k in range(12)]
    for _ in range(8):
        u, v = rng.choice(12, 2, replace=False)
        links.append(Link(switches[u], switches[v], float(rng.choice([5e9, 10e9])), 1e-6, "ethernet"))
    links += [Link(d.name, switches[int(rng.integers(12))], 10e9, 1e-6, "pcie") for d in devices]
    return DeviceTopology(f"tied-mesh-{seed}", devices, links, switches)


_ROUTE_CASES = [*preset_names(), "random:0", "random:7", "random:1000003", "tied-mesh:0", "tied-mesh:1"]


@pytest.mark.parametrize("spec", _ROUTE_CASES)
def test_lazy_routes_equal_the_topology_routes(spec: str) -> None:
    topology = _tied_mesh(int(spec.split(":")[1])) if spec.startswith("tied-mesh") else resolve_topology(spec)
    net = Network(topology)
    D = topology.num_devices
    pairs = np.random.default_rng(0).permutation(D * D)  # any order of first use builds the same routes
    dirs, lengths = net.gather(pairs)
    ptr = np.concatenate(([0], np.cumsum(lengths)))
    bw, lat = net.bandwidths(pairs), net.latencies(pairs)
    expected = _eager_routes(topology)
    for k, pair in enumerate(pairs.tolist()):
        want_dirs, want_bw, want_lat, want_kind = expected[pair]
        assert dirs[ptr[k] : ptr[k + 1]].tolist() == want_dirs, pair
        assert (bw[k], lat[k], net.kind(pair)) == (want_bw, want_lat, want_kind), pair  # bit for bit
    assert net.sources_built == D


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
    assert net.kind(0 * 3 + 1) == "pcie"  # a -> b: a's link comes first on the path
    assert net.kind(1 * 3 + 0) == "ethernet"
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
    result = simulate(graph, topo, plan, CostModel(network="circuit"))  # the ring of Network.rings
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


# ------------------------------------------------------------------------------------------------ flows
# Closed forms of the flow model, each computed by hand from the topology's figures.
S = 10**8  # bytes per transfer
LAT = 1e-5  # per link: a route through the switch crosses two links


def _star(bandwidths: dict[str, float]) -> DeviceTopology:
    """Devices on one switch, each by its own link (bandwidth per direction) of latency ``LAT``."""
    devices = [Device(name, "test-gpu", "m0", 1e12, 2**34, 1e12) for name in bandwidths]
    links = [Link(name, "sw", bw, LAT, "pcie") for name, bw in bandwidths.items()]
    return DeviceTopology("star", devices, links, ["sw"])


def _fan_out(consumers: list[str], num_bytes: int = S) -> tuple[OpGraph, Plan]:
    """``src`` on g0 (no compute) sends ``num_bytes`` to one consumer on each of ``consumers``."""
    dims = (ParallelDim("sample", "sample", 0, 8),)
    ops = [Op("src", "relu", ((8, 16),), parallel_dims=dims)]
    ops += [Op(f"c{k}", "relu", ((8, 16),), parallel_dims=dims) for k in range(len(consumers))]
    tensors = [Tensor("src", f"c{k}", (8, 16), num_bytes) for k in range(len(consumers))]
    where = {"src": "g0", **{f"c{k}": device for k, device in enumerate(consumers)}}
    return OpGraph("fan", ops, tensors), Plan("fan", {op: OpConfig.make(dev) for op, dev in where.items()})


def _transfer_ends(result: SimResult) -> list[float]:
    """End times of the forward transfers, in task order (one per consumer)."""
    t = result.tasks
    return t.end_s[t.kind == TASK_KINDS.index("transfer")].tolist()


# Hand-computed under the papers' flat roofline (calibration=None): ops without work take no time, no host lane.
FLOW = CostModel(network="flow", calibration=None)


def test_one_flow_takes_latency_plus_bytes_over_bandwidth() -> None:
    graph, plan = _fan_out(["g1"])
    result = simulate(graph, _star({"g0": 10e9, "g1": 10e9}), plan, FLOW)
    assert _transfer_ends(result) == [pytest.approx(2 * LAT + S / 10e9, rel=1e-12)]


def test_two_flows_sharing_a_link_take_twice_as_long() -> None:
    graph, plan = _fan_out(["g1", "g2"])  # both leave g0 through its one link
    result = simulate(graph, _star({"g0": 10e9, "g1": 10e9, "g2": 10e9}), plan, FLOW)
    assert _transfer_ends(result) == [pytest.approx(2 * LAT + 2 * S / 10e9, rel=1e-12)] * 2
    # the same under circuit: the second waits for the first
    circuit_cost = CostModel(network="circuit", calibration=None)  # the flat roofline, as FLOW
    circuit = simulate(graph, _star({"g0": 10e9, "g1": 10e9, "g2": 10e9}), plan, circuit_cost)
    assert sorted(_transfer_ends(circuit)) == [
        pytest.approx(2 * LAT + S / 10e9, rel=1e-12),
        pytest.approx(2 * (2 * LAT + S / 10e9), rel=1e-12),
    ]


def test_flows_on_disjoint_links_run_in_parallel() -> None:
    dims = (ParallelDim("sample", "sample", 0, 8),)
    ops = [Op(name, "relu", ((8, 16),), parallel_dims=dims) for name in ("a", "b", "c", "d")]
    graph = OpGraph("pairs", ops, [Tensor("a", "b", (8, 16), S), Tensor("c", "d", (8, 16), S)])
    plan = Plan(
        "pairs",
        {"a": OpConfig.make("g0"), "b": OpConfig.make("g1"), "c": OpConfig.make("g2"), "d": OpConfig.make("g3")},
    )
    topo = _star({f"g{k}": 10e9 for k in range(4)})
    result = simulate(graph, topo, plan, FLOW)
    assert _transfer_ends(result) == [pytest.approx(2 * LAT + S / 10e9, rel=1e-12)] * 2


def test_max_min_a_flow_held_back_elsewhere_leaves_the_rest_to_the_others() -> None:
    # Three flows leave g0 (10 GB/s); the one to g1 is held to g1's 2 GB/s, so the other two share
    # the remaining 8 GB/s: 4 GB/s each. They drain at S / 4e9; the first goes on at 2 GB/s.
    graph, plan = _fan_out(["g1", "g2", "g3"])
    topo = _star({"g0": 10e9, "g1": 2e9, "g2": 10e9, "g3": 10e9})
    ends = _transfer_ends(simulate(graph, topo, plan, FLOW))
    assert ends == [
        pytest.approx(2 * LAT + S / 2e9, rel=1e-12),
        pytest.approx(2 * LAT + S / 4e9, rel=1e-12),
        pytest.approx(2 * LAT + S / 4e9, rel=1e-12),
    ]
    net = network(topo)
    rates = max_min_rates([net.route_dirs_of(0, k) for k in (1, 2, 3)], net.capacity)
    assert rates.tolist() == [2e9, 4e9, 4e9]


def test_max_min_rates_by_hand() -> None:
    capacity = np.array([10.0, 6.0, 4.0, 100.0])
    # flows 0, 1 share direction 0 (10); flow 1 also crosses 2 (4); flow 2 crosses 1 and 3
    rates = max_min_rates([[0], [0, 2], [1, 3]], capacity)
    assert rates.tolist() == [6.0, 4.0, 6.0]
    assert max_min_rates([[0], [0]], capacity, flow_caps=[1.0, np.inf]).tolist() == [1.0, 9.0]
    assert drain_time_s([10.0, 20.0], [[0], [0]], capacity) == pytest.approx(3.0)  # 5 each until 2, then 10


def _ring_machine(n: int, bandwidth: float, latency: float) -> DeviceTopology:
    """One machine of ``n`` GPUs, every pair joined directly: the ring's hops share nothing."""
    devices = [Device(f"g{k}", "test-gpu", "m0", 1e12, 2**34, 1e12) for k in range(n)]
    links = [Link(f"g{a}", f"g{b}", bandwidth, latency, "nvlink") for a in range(n) for b in range(a + 1, n)]
    return DeviceTopology("ring", devices, links)


@pytest.mark.parametrize("model", ["flow", "circuit", "pairwise"])
@pytest.mark.parametrize("n", [2, 4])
def test_ring_all_reduce_time(model: str, n: int) -> None:
    param_bytes, bandwidth, latency = 8 * 10**6, 20e9, 3e-6
    graph, topo = _one_layer(param_bytes), _ring_machine(n, bandwidth, latency)
    plan = Plan("fc", {"fc": OpConfig.make([f"g{k}" for k in range(n)], {"sample": n})})
    result = simulate(graph, topo, plan, CostModel(network=model))
    sync = np.flatnonzero(result.tasks.kind == TASK_KINDS.index("all_reduce"))
    assert len(sync) == 1
    duration = result.tasks.end_s[sync[0]] - result.tasks.start_s[sync[0]]
    assert duration == pytest.approx(2 * (n - 1) / n * param_bytes / bandwidth + 2 * (n - 1) * latency, rel=1e-12)
    assert result.tasks.num_bytes[sync[0]] == 2 * (n - 1) * param_bytes
    # each direction of each hop carries 2 (n - 1) / n of the gradient; the others nothing
    carried = np.sort(result.link_direction_bytes)[::-1]
    hops = n if n > 2 else 2
    assert carried[:hops] == pytest.approx([2 * (n - 1) / n * param_bytes] * hops)
    assert not carried[hops:].any()


def _machines(k: int, g: int, nic_bandwidth: float) -> DeviceTopology:
    """``k`` machines of ``g`` GPUs; each GPU on its machine's NIC switch (wide), each NIC on a core switch."""
    devices = [Device(f"m{m}/g{j}", "test-gpu", f"m{m}", 1e12, 2**34, 1e12) for m in range(k) for j in range(g)]
    links = [Link(f"m{m}/g{j}", f"m{m}/nic", 100e9, LAT, "pcie") for m in range(k) for j in range(g)]
    links += [Link(f"m{m}/nic", "core", nic_bandwidth, LAT, "infiniband") for m in range(k)]
    return DeviceTopology("machines", devices, links, [f"m{m}/nic" for m in range(k)] + ["core"])


@pytest.mark.parametrize("machines", [2, 3])
def test_all_to_all_is_limited_by_the_bytes_through_each_nic(machines: int) -> None:
    # A sample-split op feeds an attribute-split op over all n devices: every device sends 1/n^2 of
    # the tensor to every other. Each NIC sends g (n - g) of those pieces at its bandwidth (and
    # receives as many), so every cross-machine flow gets 1 / (g (n - g)) of a NIC.
    g, nic = 2, 1e9
    n = machines * g
    topo = _machines(machines, g, nic)
    names = [d.name for d in topo.devices]
    tensor = 64 * n * n * 10**4
    ops = [
        Op("a", "relu", ((n * 8, n * 8),), parallel_dims=(ParallelDim("sample", "sample", 0, n * 8),)),
        Op(
            "b",
            "relu",
            ((n * 8, n * 8),),
            parallel_dims=(ParallelDim("sample", "sample", 0, n * 8), ParallelDim("attr", "attribute", 1, n * 8)),
        ),
    ]
    graph = OpGraph("a2a", ops, [Tensor("a", "b", (n * 8, n * 8), tensor)])
    plan = Plan("a2a", {"a": OpConfig.make(names, {"sample": n}), "b": OpConfig.make(names, {"attr": n})})
    result = simulate(graph, topo, plan, FLOW)
    transfers = result.tasks.kind == TASK_KINDS.index("transfer")
    assert np.count_nonzero(transfers) == n * (n - 1)
    through_nic = g * (n - g) * tensor / n**2
    assert result.tasks.end_s[transfers].max() == pytest.approx(through_nic / nic + 4 * LAT, rel=1e-9)
    # machine 0's NIC sends that forward and again for the gradients; every direction fits in the makespan
    nic_up = [k for k, name in enumerate(result.link_direction_names) if name == "link m0/nic -> core"]
    assert result.link_direction_bytes[nic_up] == pytest.approx([2 * through_nic])
    assert (result.link_direction_bytes <= result.link_direction_capacity_bytes_per_s * result.makespan_s).all()


def test_all_reduce_algorithm_choice_on_h100_2x8() -> None:
    from placement_rl.topology import load_preset

    topo = load_preset("h100-2x8")
    net = network(topo)
    group = list(range(16))
    algorithms = {c.name: c for c in net.all_reduce_algorithms(group)}
    assert list(algorithms) == ["ring", *(f"ring x{k}" for k in range(2, 9)), "hierarchical"]
    nic = 400e9 / 8
    # one ring crosses each machine boundary once per direction: 2 (n - 1) / n bytes per message byte at one NIC
    assert algorithms["ring"].seconds_per_byte == pytest.approx(2 * 15 / 16 / nic)
    assert algorithms["ring x8"].seconds_per_byte == pytest.approx(2 * 15 / 16 / nic / 8)  # eight NICs
    # hierarchical: reduce-scatter and all-gather over NVSwitch, then 8 rings of 1/8 across, one per NIC
    nvswitch = 450e9
    within = 7 / 8 / nvswitch
    assert algorithms["hierarchical"].seconds_per_byte == pytest.approx(2 * within + 1 / 8 / nic)
    cross_lat, intra_lat = 2 * 5e-6, 2 * 2e-6
    assert algorithms["ring x8"].latency_s == pytest.approx(30 * cross_lat)
    assert algorithms["hierarchical"].latency_s == pytest.approx(2 * 7 * intra_lat + 2 * cross_lat)
    # the rule: least time alone, per message size
    assert net.all_reduce(group, 2**20).name == "hierarchical"
    assert net.all_reduce(group, 2**30).name == "ring x8"
    assert net.all_reduce(list(range(8)), 2**30).name == "ring"  # one machine: one ring


def test_flow_all_reduce_uses_every_nic_where_each_gpu_has_one() -> None:
    from placement_rl.topology import load_preset

    topo = load_preset("h100-2x8")
    graph = _one_layer(2**30)  # 1 GiB: eight rings, one leaving and entering each machine through each NIC
    plan = Plan("fc", {"fc": OpConfig.make([d.name for d in topo.devices], {"sample": 8})})
    result = simulate(graph, topo, plan)
    nic_up = [k for k, name in enumerate(result.link_direction_names) if name.endswith("-> ib-switch")]
    expected = 2 * 15 / 16 * 2**30 / 8  # each of the 16 NICs sends one ring's cross-machine hop
    assert len(nic_up) == 16 and result.link_direction_bytes[nic_up] == pytest.approx([expected] * 16)


def test_unknown_network_model_and_negative_bucket_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown network model 'fluid'; expected one of: circuit, flow, pairwise"):
        CostModel(network="fluid")
    with pytest.raises(ValueError, match=r"bucket_bytes = -1; expected an integer number of bytes >= 0"):
        CostModel(bucket_bytes=-1)
    with pytest.raises(ValueError, match=r"bucket_bytes = 2.5"):
        CostModel(bucket_bytes=2.5)  # type: ignore[arg-type]
    assert set(NETWORK_MODELS) == {"flow", "circuit", "pairwise"}


def test_pairwise_model_refuses_topologies_past_its_limit() -> None:
    n = PAIR_MODEL_MAX_DEVICES + 1
    devices = [Device(f"g{k}", "test-gpu", f"m{k // 8}", 1e12, 2**34, 1e12) for k in range(n)]
    topo = DeviceTopology("big", devices, [Link(d.name, "sw", PCIE_BW, PCIE_LAT, "pcie") for d in devices], ["sw"])
    graph = _one_layer(10**6)
    with pytest.raises(ValueError, match=r"'pairwise' keeps a connection per device pair: topology 'big' has 2,049"):
        SimContext(graph, topo, CostModel(network="pairwise"))
    # the other models build routes only from the devices the plan uses
    ctx = SimContext(graph, topo, CostModel(network="flow"))
    result = ctx.simulate(Plan("fc", {"fc": OpConfig.make(["g0", "g9"], {"sample": 2})}))
    assert result.makespan_s > 0 and ctx.network.sources_built == 2


def test_a_measured_all_reduce_curve_caps_the_ring_under_flow() -> None:
    """A comm table's ``all_reduce/<kind>`` bandwidth ``B`` makes a ring over 2 devices alone take
    ``2 (n - 1) (S / n) / B = S / B`` (no latency here), as the circuit model's formula says."""
    from placement_rl.execute.fidelity import cpu_cluster
    from placement_rl.plan import constructors
    from placement_rl.sim.cost import CommTable
    from placement_rl.zoo import load

    graph = load("lenet", batch_size=8)
    topology = cpu_cluster(1, 2, intra_bytes_per_s=1e12)
    measured = 50e6  # far below the links' 1e12 B/s
    cost = CostModel(comm_table=CommTable({"all_reduce/pcie": [(1.0, measured), (1e9, measured)]}))
    result = simulate(graph, topology, constructors.data_parallel(graph, topology), cost)
    table = result.tasks
    rings = np.flatnonzero(table.kind == TASK_KINDS.index("all_reduce"))
    assert rings.size == 1  # lenet's gradients fill one bucket
    gradient_bytes = sum(op.param_bytes for op in graph.ops)
    duration = float(table.end_s[rings[0]] - table.start_s[rings[0]])
    assert duration == pytest.approx(gradient_bytes / measured, rel=1e-6)
    free = simulate(graph, topology, constructors.data_parallel(graph, topology), CostModel())
    ring = np.flatnonzero(free.tasks.kind == TASK_KINDS.index("all_reduce"))[0]
    assert free.tasks.end_s[ring] - free.tasks.start_s[ring] < duration / 100
