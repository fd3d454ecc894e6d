"""The simulator against hand-computed makespans, an independent list scheduler, and properties."""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, data_parallel, expert, single_device
from placement_rl.sim.cost import CostModel
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link, load_preset

TFLOPS = 1e12
# Efficiency 1 and no memory traffic: an op of F FLOPs takes exactly F / 1e12 seconds.
EXACT = CostModel(efficiency={}, default_efficiency=1.0, optimizer="adam")


def _device(name: str, machine: str = "m0", memory_bytes: int = 2**34) -> Device:
    return Device(name, "test-gpu", machine, TFLOPS, memory_bytes, 1e30)


def _two_gpus(bandwidth: float = 1e9, latency: float = 1e-4) -> DeviceTopology:
    return DeviceTopology("pair", [_device("g0"), _device("g1")], [Link("g0", "g1", bandwidth, latency, "pcie")])


def _op(name: str, fwd_ms: float, bwd_ms: float, batch: int = 4, param_bytes: int = 0, out_bytes: int = 0) -> Op:
    # Activation bytes (bytes_written) are kept out of the compute time: memory bandwidth is infinite.
    return Op(
        name,
        "linear",
        ((batch, 8),),
        forward_flops=fwd_ms * 1e-3 * TFLOPS,
        backward_flops=bwd_ms * 1e-3 * TFLOPS,
        param_bytes=param_bytes,
        param_key=name if param_bytes else None,
        bytes_written=out_bytes,
        parallel_dims=(ParallelDim("sample", "sample", 0, batch),),
    )


def _chain() -> OpGraph:
    ops = [_op("a", 1, 2), _op("b", 2, 4), _op("c", 3, 6)]
    return OpGraph("chain", ops, [Tensor("a", "b", (4, 8), 10**6), Tensor("b", "c", (4, 8), 10**6)])


def _place(graph: OpGraph, where: dict[str, str]) -> Plan:
    return Plan(graph.name, {op: OpConfig.make(dev) for op, dev in where.items()})


def test_chain_on_one_device() -> None:
    g = _chain()
    r = simulate(g, _two_gpus(), _place(g, {"a": "g0", "b": "g0", "c": "g0"}), EXACT)
    assert r.makespan_s == pytest.approx((1 + 2 + 3 + 6 + 4 + 2) * 1e-3)
    assert r.comm_bytes == 0 and r.busy_s[0] == pytest.approx(r.makespan_s) and r.busy_s[1] == 0
    # Forward in order, then backward in reverse order.
    kinds = [(s.kind, s.op) for s in r.critical_path]
    assert kinds == [
        ("forward", "a"),
        ("forward", "b"),
        ("forward", "c"),
        ("backward", "c"),
        ("backward", "b"),
        ("backward", "a"),
    ]


def test_chain_on_two_devices_joined_by_one_link() -> None:
    g = _chain()
    r = simulate(g, _two_gpus(bandwidth=1e9, latency=1e-4), _place(g, {"a": "g0", "b": "g0", "c": "g1"}), EXACT)
    transfer_s = 1e-4 + 10**6 / 1e9  # latency + 1 MB at 1 GB/s, forward and again for the gradient
    assert r.makespan_s == pytest.approx(18e-3 + 2 * transfer_s)
    assert r.comm_bytes == 2 * 10**6
    assert r.link_bytes.tolist() == [2 * 10**6]
    assert [s.kind for s in r.critical_path].count("transfer") == 1


def test_diamond_runs_branches_in_parallel() -> None:
    ops = [_op("a", 1, 1), _op("b", 5, 5), _op("c", 3, 3), _op("d", 1, 1)]
    t = [
        Tensor("a", "b", (4, 8), 0),
        Tensor("a", "c", (4, 8), 0),
        Tensor("b", "d", (4, 8), 0),
        Tensor("c", "d", (4, 8), 0),
    ]
    g = OpGraph("diamond", ops, t)
    topo = _two_gpus(latency=0.0)
    apart = simulate(g, topo, _place(g, {"a": "g0", "b": "g0", "c": "g1", "d": "g0"}), EXACT)
    together = simulate(g, topo, _place(g, {"a": "g0", "b": "g0", "c": "g0", "d": "g0"}), EXACT)
    # Apart: a, max(b, c), d forward; d, max(b, c), a backward (empty tensors move in no time).
    assert apart.makespan_s == pytest.approx((1 + 5 + 1) * 2e-3)
    assert together.makespan_s == pytest.approx((1 + 5 + 3 + 1) * 2e-3)


def test_data_parallel_with_ring_all_reduce() -> None:
    param_bytes = 4 * 10**6
    g = OpGraph("one", [_op("w", 4, 8, param_bytes=param_bytes)], [])
    topo = _two_gpus(bandwidth=1e9, latency=1e-4)
    r = simulate(g, topo, data_parallel(g, topo), EXACT)
    # Each GPU computes half: 2 ms + 4 ms; then a 2-device ring all-reduce: 2 (n-1) (latency + (P/n) / bw).
    all_reduce_s = 2 * 1 * (1e-4 + param_bytes / 2 / 1e9)
    assert r.makespan_s == pytest.approx(6e-3 + all_reduce_s)
    assert r.comm_bytes == pytest.approx(2 * param_bytes)
    # Adam: weights + gradients + two moments per replica.
    assert r.peak_memory_bytes.tolist() == [4 * param_bytes, 4 * param_bytes]
    ps = Plan("one", {"w": OpConfig.make(["g0", "g1"], {"sample": 2}, "parameter_server", "g0")})
    r_ps = simulate(g, topo, ps, EXACT)
    assert r_ps.makespan_s == pytest.approx(6e-3 + 2 * (1e-4 + param_bytes / 1e9))  # push then pull
    dup = Plan("one", {"w": OpConfig.make(["g0", "g1"], {}, "duplicate")})
    assert simulate(g, topo, dup, EXACT).makespan_s == pytest.approx(12e-3)  # full work each, no sync


def test_memory_of_a_chain_by_hand() -> None:
    mib = 2**20
    ops = [
        _op("a", 1, 1, out_bytes=1 * mib),
        _op("b", 1, 1, out_bytes=2 * mib),
        _op("c", 1, 1, out_bytes=4 * mib, param_bytes=mib),
    ]
    g = OpGraph("mem", ops, [Tensor("a", "b", (4, 8), 0), Tensor("b", "c", (4, 8), 0)])
    r = simulate(g, _two_gpus(), _place(g, {"a": "g0", "b": "g0", "c": "g0"}), EXACT)
    # All activations live at c's backward, plus its 4 MiB workspace, plus Adam state of c's weights.
    assert r.peak_memory_bytes[0] == (1 + 2 + 4 + 4) * mib + 4 * mib
    assert r.peak_memory_bytes[1] == 0


def test_plan_that_does_not_fit_reports_oom(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("vgg16")  # 256 images on one 11 GiB P100
    topo = load_preset("trinity")
    r = simulate(graph, topo, single_device(graph, topo))
    assert r.oom and r.oom_devices == ("m0/gpu0",)
    assert r.peak_memory_bytes[0] > topo.devices[0].memory_bytes
    assert math.isfinite(r.makespan_s) and r.makespan_s > 0


def test_faster_links_are_never_slower(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    rng = np.random.default_rng(0)
    for factor in (2.0, 10.0):
        slow = _two_machines(1e9)
        fast = _two_machines(1e9 * factor)
        for _ in range(3):
            where = {op.name: f"g{int(rng.integers(4))}" for op in graph.ops}
            plan = _place(graph, where)
            assert simulate(graph, fast, plan).makespan_s <= simulate(graph, slow, plan).makespan_s + 1e-12
        assert (
            simulate(graph, fast, data_parallel(graph, fast)).makespan_s
            <= simulate(graph, slow, data_parallel(graph, slow)).makespan_s
        )


def _two_machines(bandwidth: float) -> DeviceTopology:
    devices = [_device(f"g{i}", f"m{i // 2}") for i in range(4)]
    links = [
        Link("g0", "g1", 5e10, 1e-6, "nvlink"),
        Link("g2", "g3", 5e10, 1e-6, "nvlink"),
        Link("g0", "sw", bandwidth, 1e-5, "ethernet"),
        Link("g2", "sw", bandwidth, 1e-5, "ethernet"),
    ]
    return DeviceTopology("two-machines", devices, links, ["sw"])


@pytest.mark.parametrize("model", ["inception_v3", "gnmt"])
def test_invariants_on_real_plans(model: str, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph(model)
    topo = load_preset("tag-testbed")
    for plan in (data_parallel(graph, topo), expert(graph, topo)):
        r = simulate(graph, topo, plan)
        again = simulate(graph, topo, plan)
        assert r.makespan_s == again.makespan_s and np.array_equal(r.tasks.start_s, again.tasks.start_s)
        assert (r.busy_s <= r.makespan_s + 1e-12).all()
        assert np.allclose(r.idle_s, r.makespan_s - r.busy_s)
        # No two tasks overlap on one device.
        for d in range(topo.num_devices):
            sel = (r.tasks.lane == d) & (r.tasks.kind <= 1)
            s, e = r.tasks.start_s[sel], r.tasks.end_s[sel]
            order = np.lexsort((e, s))  # zero-length tasks first among equal starts
            assert (s[order][1:] >= e[order][:-1] - 1e-12).all()
        assert r.critical_path[-1].end_s == pytest.approx(r.makespan_s)
        assert (r.op_end_s >= r.op_start_s).all()


def _reference_makespan(graph: OpGraph, topo: DeviceTopology, where: dict[str, str], cost: CostModel) -> float:
    """An independent list scheduler for single-device placements (no sharing of code with the simulator).

    Tasks: forward i, backward i, and for every tensor between ops on different devices one forward
    transfer and one gradient transfer, holding every link direction on the route. A task starts when
    its predecessors are done and its resources are free; tasks are taken in (ready time, id) order.
    """
    n = graph.num_ops
    ops = graph.ops
    dev = [topo.device_index(where[op.name]) for op in ops]
    durations: list[float] = []
    for i, op in enumerate(ops):
        durations.append(op.forward_flops / (topo.devices[dev[i]].peak_flops * cost.default_efficiency))
    for i, op in enumerate(ops):
        durations.append(op.backward_flops / (topo.devices[dev[i]].peak_flops * cost.default_efficiency))
    resources: list[list[tuple[str, str]]] = [[("dev", str(d))] for d in dev] * 2
    preds: list[list[int]] = [[] for _ in range(2 * n)] + []
    for i in range(n):
        preds[n + i].append(i)
    cross = [t for t in graph.tensors if dev[graph.index(t.src)] != dev[graph.index(t.dst)]]
    for t in graph.tensors:
        s, d = graph.index(t.src), graph.index(t.dst)
        if dev[s] == dev[d]:
            preds[d].append(s)
            preds[n + s].append(n + d)
    for direction in ("forward", "gradient"):
        for t in cross:
            s, d = graph.index(t.src), graph.index(t.dst)
            a, b = (s, d) if direction == "forward" else (d, s)
            route = topo.route(topo.devices[dev[a]].name, topo.devices[dev[b]].name)
            durations.append(route.latency_s + t.num_bytes / route.bandwidth_bytes_per_s if t.num_bytes else 0.0)
            resources.append([("link", f"{x}>{y}") for x, y in itertools.pairwise(route.path)])
            k = len(durations) - 1
            preds.append([a] if direction == "forward" else [n + a])
            if direction == "forward":
                preds[d].append(k)
            else:
                preds[n + s].append(k)
    total = len(durations)
    end = [0.0] * total
    done = [False] * total
    free: dict[tuple[str, str], float] = {}
    heap = [(0.0, k) for k in range(total) if not preds[k]]
    heapq.heapify(heap)
    waiting = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in range(total)]
    for k, p in enumerate(preds):
        for x in p:
            succs[x].append(k)
    while heap:
        ready, k = heapq.heappop(heap)
        start = max([ready] + [free.get(r, 0.0) for r in resources[k]])
        end[k] = start + durations[k]
        done[k] = True
        for r in resources[k]:
            free[r] = end[k]
        for s in succs[k]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (max(end[x] for x in preds[s]), s))
    assert all(done)
    return max(end)


def _random_dag(rng: np.random.Generator, n: int) -> OpGraph:
    ops = [_op(f"op{i}", float(rng.uniform(0.1, 3)), float(rng.uniform(0.1, 6))) for i in range(n)]
    tensors = []
    for j in range(1, n):
        for i in rng.choice(j, size=min(j, int(rng.integers(1, 3))), replace=False):
            tensors.append(Tensor(f"op{i}", f"op{j}", (4, 8), int(rng.integers(0, 5_000_000))))
    return OpGraph("random", ops, tensors)


def test_agrees_with_an_independent_list_scheduler() -> None:
    rng = np.random.default_rng(42)
    topo = _two_machines(2e9)
    for _ in range(40):
        g = _random_dag(rng, int(rng.integers(2, 14)))
        where = {op.name: f"g{int(rng.integers(4))}" for op in g.ops}
        expected = _reference_makespan(g, topo, where, EXACT)
        assert simulate(g, topo, _place(g, where), EXACT).makespan_s == pytest.approx(expected, rel=1e-12)


def test_bad_plans_raise_before_simulating() -> None:
    g = _chain()
    with pytest.raises(ValueError, match="unknown device"):
        simulate(g, _two_gpus(), _place(g, {"a": "g0", "b": "g7", "c": "g0"}))


def test_shared_parameters_synchronize_across_every_device_that_uses_them(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("rnnlm", steps=4)
    topo = _two_gpus()
    cells = [op for op in graph.ops if op.op_type == "lstm_cell"]
    key = cells[0].param_key
    moved = [op for op in cells if op.param_key == key][2]  # the third step of the first layer
    where = {op.name: "g0" for op in graph.ops}
    where[moved.name] = "g1"
    r = simulate(graph, topo, _place(graph, where), EXACT)
    owner = next(i for i, op in enumerate(graph.ops) if op.param_key == key)
    syncs = np.nonzero(r.tasks.kind == 4)[0]  # all_reduce tasks
    assert [int(r.tasks.op[k]) for k in syncs] == [owner]
    assert r.tasks.num_bytes[syncs[0]] == 2 * moved.param_bytes  # 2 (n - 1) * shard bytes with n = 2
    # g1 holds a replica of the layer's weights, gradients and Adam state.
    assert r.peak_memory_bytes[1] >= 4 * moved.param_bytes
    together = simulate(graph, topo, _place(graph, {op.name: "g0" for op in graph.ops}), EXACT)
    assert not (together.tasks.kind == 4).any()
