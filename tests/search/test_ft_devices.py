"""FT's device sets: chosen without regard to the order a topology lists its devices, and a mesh per stage."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from placement_rl import simulate, zoo
from placement_rl.methods import compare_methods, get_method
from placement_rl.search.ft import pick_over_device_counts, run_ft, simulated_best
from placement_rl.search.ft.costs import build_cost_graph
from placement_rl.search.ft.devices import (
    MAX_DEVICE_SETS,
    DeviceSet,
    candidate_device_sets,
    default_device_counts,
    fastest_devices,
    machine_meshes,
    natural_key,
)
from placement_rl.search.ft.rescheduling import _R, _Comm, _CrossComm
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology, load_preset
from placement_rl.topology.builder import TopologyBuilder, switched_machine
from placement_rl.topology.devices import gbit_to_bytes_per_s


def mixed_cluster(fast_last: bool = False) -> DeviceTopology:
    """One machine of 4 V100s (NVLink) and three of 4 K80s, every machine on 10 Gbit/s Ethernet; with
    ``fast_last`` the V100 machine is built (and named, ``m3``) last."""
    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    kinds = ["V100-SXM2-32GB", "K80", "K80", "K80"]
    for device_type in kinds[1:] + kinds[:1] if fast_last else kinds:
        switched_machine(b, device_type, 4, eth, nvlink_bytes_per_s=25e9 if device_type.startswith("V100") else None)
    return b.build("mixed-10g")


def single_gpu_machines(n: int = 8) -> DeviceTopology:
    """``n`` machines of one V100 each on 10 Gbit/s Ethernet."""
    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    for _ in range(n):
        switched_machine(b, "V100-SXM2-16GB", 1, eth)
    return b.build(f"{n}x1-10g")


def permuted(topology: DeviceTopology, seed: int) -> DeviceTopology:
    """The same cluster with its device list shuffled."""
    devices = list(topology.devices)
    random.Random(seed).shuffle(devices)
    return DeviceTopology(topology.name, devices, topology.links, topology.switches)


def first_n_sets(topology: DeviceTopology, counts: list[int] | None = None) -> list[DeviceSet]:
    """The rule FT had before device sets: the first ``n`` devices as listed, for 1, 2, 4, ..., all."""
    names = [d.name for d in topology.devices]
    return [DeviceSet(tuple(names[:n]), "first", f"first {n}") for n in counts or default_device_counts(len(names))]


def test_candidate_sets_ignore_the_listing_order() -> None:
    mixed = mixed_cluster()
    sets = candidate_device_sets(mixed)
    fast = tuple(f"m0/gpu{j}" for j in range(4))
    assert [d.devices for d in sets[:3]] == [fast[:1], fast[:2], fast]  # the V100s first, whatever the listing
    assert sets[2].label == "4 devices (V100-SXM2-32GB x4; machine m0)"
    # the K80s alone only where no faster set of as many devices with as much memory exists
    assert [d.label for d in sets if d.rule == "type"] == ["12 devices (K80 x12; machines m1, m2, m3)"]
    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    switched_machine(b, "L4", 4, eth)  # faster, 24 GiB
    switched_machine(b, "V100-SXM2-32GB", 4, eth)  # slower, 32 GiB: worth trying alone
    roomy = [d.label for d in candidate_device_sets(b.build("l4-v100")) if d.rule == "type"]
    assert roomy == [f"{n} device{'s' * (n > 1)} (V100-SXM2-32GB x{n}; machine m1)" for n in (1, 2, 4)]
    for seed in range(4):
        assert candidate_device_sets(permuted(mixed, seed)) == sets
    assert fastest_devices(permuted(mixed, 0), 8) == [*fast, "m1/gpu0", "m1/gpu1", "m1/gpu2", "m1/gpu3"]
    # every set once, at most MAX_DEVICE_SETS of them; a cap keeps the first
    for name in ("tag-testbed", "tag-cloud", "flexflow-k80"):
        found = candidate_device_sets(load_preset(name))
        assert len({frozenset(d.devices) for d in found}) == len(found) <= MAX_DEVICE_SETS
    assert (
        candidate_device_sets(load_preset("tag-testbed"), max_sets=3)
        == candidate_device_sets(load_preset("tag-testbed"))[:3]
    )
    # a homogeneous preset: exactly the first 1, 2, 4, ... devices, as before
    tensoropt = load_preset("tensoropt")
    assert [d.devices for d in candidate_device_sets(tensoropt)] == [s.devices for s in first_n_sets(tensoropt)]
    assert sorted(["m10/gpu0", "m2/gpu1", "m2/gpu10", "m2/gpu9"], key=natural_key) == [
        "m2/gpu1",
        "m2/gpu9",
        "m2/gpu10",
        "m10/gpu0",
    ]
    with pytest.raises(ValueError, match="device count 17: expected an integer from 1 to 16"):
        candidate_device_sets(tensoropt, [1, 17])
    with pytest.raises(ValueError, match="max_sets = 0"):
        candidate_device_sets(tensoropt, max_sets=0)


def test_ft_on_a_mixed_cluster_is_the_same_however_it_is_listed() -> None:
    graph, counts = zoo.load("alexnet"), [4, 16]  # 5 device sets: the fast machine among them
    mixed = mixed_cluster()
    pick = pick_over_device_counts(graph, mixed, counts, max_configs=2)
    # FT picks the fast machine (the first-n rule finds it too when it is listed first)
    assert pick.fits and pick.devices == tuple(f"m0/gpu{j}" for j in range(4))
    assert pick.device_set == "4 devices (V100-SXM2-32GB x4; machine m0)"
    for topology in (permuted(mixed, 1), mixed_cluster(fast_last=True)):
        again = pick_over_device_counts(graph, topology, counts, max_configs=2)
        assert again.result.makespan_s == pick.result.makespan_s
        assert {topology.device(d).device_type for d in again.devices} == {"V100-SXM2-32GB"}
    # one FT run over all devices (or the n fastest) is the same frontier however they are listed
    for devices in (None, 8):
        frontiers = [run_ft(graph, t, devices, max_configs=2).points for t in (mixed, permuted(mixed, 2))]
        assert [(p.memory_bytes, p.time_s, p.plan.configs) for p in frontiers[0]] == [
            (p.memory_bytes, p.time_s, p.plan.configs) for p in frontiers[1]
        ]
    # listed with the fast machine last, the first-n rule never sees it alone: at least 2x slower
    last = mixed_cluster(fast_last=True)
    old = pick_over_device_counts(graph, last, max_configs=2, device_sets=first_n_sets(last, counts))
    assert old.result.makespan_s > 2 * pick.result.makespan_s


def test_ft_on_a_homogeneous_cluster_is_unchanged() -> None:
    # Before device sets (first n devices): alexnet x tensoropt at 8 configurations per op gave
    # 17.33 ms on 8 devices; lenet x h100-2x8 0.858 ms on 1.
    for model, preset, configs in (("alexnet", "tensoropt", 4), ("lenet", "h100-2x8", 8)):
        graph, topology = zoo.load(model), load_preset(preset)
        pick = pick_over_device_counts(graph, topology, max_configs=configs)
        old = pick_over_device_counts(graph, topology, max_configs=configs, device_sets=first_n_sets(topology))
        assert pick.result.makespan_s == old.result.makespan_s and pick.num_devices == old.num_devices
        assert pick.point.plan.configs == old.point.plan.configs
        assert pick.device_sets == tuple(d.label for d in candidate_device_sets(topology))


def test_each_device_set_is_a_labelled_phase() -> None:
    graph, topology = zoo.load("lenet"), load_preset("tag-testbed")
    events: list[str | tuple[int, int]] = []
    pick = pick_over_device_counts(
        graph, topology, [1, 4], max_configs=2, describe=events.append, progress=lambda d, t: events.append((d, t))
    )
    sets = candidate_device_sets(topology, [1, 4])
    labels = [e for e in events if isinstance(e, str)]
    assert labels == [f"FT {d.label}" for d in sets] and pick.device_sets == tuple(d.label for d in sets)
    assert labels[0] == "FT 1 device (V100-SXM2-32GB x1; machine m0)"
    # each label starts a phase whose steps count the ops from the start
    starts = [i for i, e in enumerate(events) if isinstance(e, str)] + [len(events)]
    for a, b in itertools.pairwise(starts):
        phase = events[a + 1 : b]
        assert phase and phase[-1] == (graph.num_ops, graph.num_ops)
    assert pick.device_set in pick.device_sets and pick.num_devices == len(pick.devices)


def test_cross_mesh_redistribution() -> None:
    topology, cost = load_preset("tensoropt"), CostModel()
    names = [d.name for d in topology.devices[:8]]
    comm = _Comm(topology, names, cost, "point_to_point")
    layouts = [((8, 0),), ((8, _R),), ((2, 0), (4, 1)), ((4, 1), (2, 0)), ((8, -2),), ((2, _R), (4, 0))]
    ids = [comm.layout_id(layout) for layout in layouts]
    same = _CrossComm(comm, comm)
    for a in ids:
        for b in ids:
            if -2 in [label for _, label in comm.layouts[b]]:
                continue  # partial sums are never a destination: consumers read whole values
            expected = 0.0 if a == b else comm._p2p_time_s(comm.layouts[a], comm.layouts[b], 1e6)
            assert same.path_time_s(a, b, 1e6) == pytest.approx(expected, rel=1e-12)
    # a replicated tensor already is on a sub-mesh's devices; the other machine has to receive it
    half = _Comm(topology, names[:4], cost)
    other = _Comm(topology, [d.name for d in topology.devices[8:12]], cost)
    rep_all, rep_half, rep_other = comm.layout_id(((8, _R),)), half.layout_id(((4, _R),)), other.layout_id(((4, _R),))
    assert _CrossComm(comm, half).path_time_s(rep_all, rep_half, 1e6) == 0.0
    assert _CrossComm(half, other).path_time_s(rep_half, rep_other, 1e6) > 4e6 / 12e9


def test_a_mesh_per_stage() -> None:
    graph, topology = zoo.load("alexnet"), single_gpu_machines()
    plain = run_ft(graph, topology, max_configs=4)
    staged = run_ft(graph, topology, max_configs=4, stage_meshes=1)
    # each op's configurations over all 8 GPUs come first, then those over the best machine (m0)
    costs, configs = build_cost_graph(graph, topology, max_configs=4)
    more, more_configs = build_cost_graph(graph, topology, max_configs=4, stage_meshes=[["m0/gpu0"]])
    for v, cs in enumerate(configs):
        k = len(cs)
        assert more_configs[v][:k] == cs and [c.devices for c in more_configs[v][k:]] == [("m0/gpu0",)]
        np.testing.assert_array_equal(more.node_time_s[v][:k], costs.node_time_s[v])
    for e in range(len(costs.edges)):
        ku, kv = costs.edge_time_s[e].shape[:2]
        np.testing.assert_array_equal(more.edge_time_s[e][:ku, :kv], costs.edge_time_s[e])
    assert machine_meshes(topology, [d.name for d in topology.devices], 2) == [("m0/gpu0",), ("m1/gpu0",)]
    assert machine_meshes(load_preset("tensoropt"), [f"m0/gpu{j}" for j in range(4)], 1) == []
    # the simulator's pick: the convolutions data parallel on 8 GPUs, the classifier on one
    before, after = simulated_best(plain, graph, topology), simulated_best(staged, graph, topology)
    assert before is not None and after is not None
    assert after[1].makespan_s < 0.97 * before[1].makespan_s
    meshes = {len(c.devices) for c in after[0].plan.configs.values()}
    assert meshes == {1, 8} and simulate(graph, topology, after[0].plan).makespan_s == after[1].makespan_s
    with pytest.raises(ValueError, match="stage mesh"):
        build_cost_graph(graph, topology, 4, stage_meshes=[["m5/gpu0"]])
    with pytest.raises(ValueError, match="stage_meshes = -1"):
        run_ft(graph, topology, stage_meshes=-1)


def test_ft_method_options() -> None:
    graph, topology = zoo.load("lenet"), single_gpu_machines(4)
    [row] = compare_methods(graph, topology, ["ft"], options={"ft": {"max_configs": 2, "stage_meshes": 1}})
    assert not row.oom and row.plan.name == "ft"
    check = get_method("ft").check
    check({"stage_meshes": 2}, graph, topology)
    with pytest.raises(ValueError, match="stage_meshes = 'x'; expected a machine count >= 0"):
        check({"stage_meshes": "x"}, graph, topology)
