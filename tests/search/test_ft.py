"""TensorOpt's FT on real graphs: exactness against brute force, plans the simulator accepts, modes, CLI, Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from placement_rl import simulate
from placement_rl.cli import main
from placement_rl.graph import OpGraph
from placement_rl.search.ft import (
    best_over_device_counts,
    default_device_counts,
    frontier,
    mini_parallelism,
    mini_time,
    profiling,
    run_ft,
    simulated_best,
)
from placement_rl.search.ft.costs import build_cost_graph
from placement_rl.topology import load_preset


@pytest.fixture(scope="module")
def small_graph(zoo_graph) -> OpGraph:  # type: ignore[no-untyped-def]
    """lenet's classifier head (flatten, three linear layers, the loss): 7 ops, 6 tensors."""
    names = ["flatten", "head_0", "head_1", "head_2", "head_3", "head_4", "criterion"]
    return zoo_graph("lenet").subgraph(names, name="lenet_head")


def brute_force_pareto(graph: OpGraph, devices: int, max_configs: int) -> list[tuple[float, float]]:
    """Every configuration of every op x every reuse option of every tensor, enumerated with numpy."""
    costs, _ = build_cost_graph(graph, load_preset("tensoropt"), devices, max_configs=max_configs)
    K = [int(k) for k in costs.num_configs]
    R = 3
    configs = np.indices(K).reshape(len(K), -1)  # (n, A)
    options = np.indices((R,) * len(costs.edges)).reshape(len(costs.edges), -1)  # (E, O)
    mem = np.zeros((configs.shape[1], options.shape[1]))
    time = np.zeros_like(mem)
    for v in range(len(K)):
        mem += costs.node_memory_bytes[v][configs[v]][:, None]
        time += costs.node_time_s[v][configs[v]][:, None]
    for e, (u, v) in enumerate(costs.edges):
        mem += costs.edge_memory_bytes[e][configs[u][:, None], configs[v][:, None], options[e][None, :]]
        time += costs.edge_time_s[e][configs[u][:, None], configs[v][:, None], options[e][None, :]]
    ok = np.isfinite(mem) & np.isfinite(time)
    mem, time = mem[ok], time[ok]
    order = np.lexsort((time, mem))
    out, best = [], np.inf
    for m, t in zip(mem[order].tolist(), time[order].tolist(), strict=True):
        if t < best:
            out.append((m, t))
            best = t
    return out


@pytest.mark.parametrize("method", ["ldp", "elimination"])
def test_frontier_equals_brute_force_on_a_small_graph(small_graph: OpGraph, method: str) -> None:
    result = run_ft(small_graph, load_preset("tensoropt"), 4, method=method, max_configs=3, tolerance=0.0)
    assert result.stats.exact
    found = [(p.memory_bytes, p.time_s) for p in result.points]
    expected = brute_force_pareto(small_graph, 4, 3)
    assert len(found) == len(expected) > 5
    np.testing.assert_allclose(np.array(found), np.array(expected), rtol=1e-9)


def test_frontier_points_are_sorted_plans_the_simulator_accepts(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = zoo_graph("lenet"), load_preset("tensoropt")
    points = frontier(graph, topo, 4, tolerance=0.0)  # the exact frontier (the default keeps 1%-apart points)
    mem = np.array([p.memory_bytes for p in points])
    time = np.array([p.time_s for p in points])
    assert len(points) > 2 and (np.diff(mem) > 0).all() and (np.diff(time) < 0).all()
    devices = {d.name for d in topo.devices[:4]}
    for p in points[:: max(1, len(points) // 5)]:
        assert set(p.plan.configs) == {op.name for op in graph.ops}
        assert all(set(c.devices) == devices for c in p.plan.configs.values())
        assert simulate(graph, topo, p.plan).makespan_s > 0
    # the fastest point is at least as fast (in FT's estimate) as data parallelism over the same devices
    costs, configs = build_cost_graph(graph, topo, 4)
    dp = [1 if len(c) > 1 else 0 for c in configs]  # op_configs puts data parallel second
    assert all(c[1].degree_map.get("sample") == 4 for c in configs if len(c) > 1 and graph.ops[0].sample_dim)
    assert points[-1].time_s <= sum(costs.node_time_s[v][s] for v, s in enumerate(dp)) + sum(
        costs.edge_time_s[e][dp[u], dp[v]].min() for e, (u, v) in enumerate(costs.edges)
    )


def test_modes(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = zoo_graph("lenet"), load_preset("tensoropt")
    best, result = mini_time(graph, topo, 4)
    assert best is not None and best is result.points[-1]  # lenet fits easily: the fastest point
    verified = simulated_best(result, graph, topo)
    assert verified is not None and verified[0] in result.points and not verified[1].oom
    assert verified[1].makespan_s <= simulate(graph, topo, best.plan).makespan_s
    assert verified[1].makespan_s == min(simulate(graph, topo, p.plan).makespan_s for p in result.points)
    limit = (result.points[0].memory_bytes + result.points[1].memory_bytes) / 2
    tight, _ = mini_time(graph, topo, 4, memory_limit_bytes=limit)
    assert tight is not None and (tight.memory_bytes, tight.time_s) == (
        result.points[0].memory_bytes,
        result.points[0].time_s,
    )
    none, _ = mini_time(graph, topo, 4, memory_limit_bytes=result.points[0].memory_bytes / 2)
    assert none is None
    rows = profiling(graph, topo, [1, 2, 4])
    assert [n for n, _, _ in rows] == [1, 2, 4] and all(p is not None for _, p, _ in rows)
    assert rows[0][1].num_devices == 1 and rows[2][1].num_devices == 4
    found = mini_parallelism(graph, topo, [4, 2, 1])
    assert found is not None and found[0] == 1
    assert default_device_counts(16) == [1, 2, 4, 8, 16] and default_device_counts(12) == [1, 2, 4, 8, 12]
    n, point, sim = best_over_device_counts(graph, topo, [1, 2, 4])  # type: ignore[misc]
    per_count = {k: simulated_best(r, graph, topo)[1].makespan_s for k, _, r in rows}  # type: ignore[index]
    assert sim.makespan_s == min(per_count.values()) == per_count[n] and point.num_devices == n


def test_cli_frontier_and_profiling(zoo_graph, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ft"
    assert (
        main(
            [
                "frontier",
                "--model",
                "lenet",
                "--topology",
                "tensoropt",
                "--devices",
                "4",
                "--mcmc-budget",
                "none",
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "FT-ldp frontier for lenet" in text and "mini-time under" in text
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["format"] == "placement_rl.frontier" and doc["devices"] == 4 and doc["exact"]
    assert len(doc["points"]) > 2 and all(p["simulated_makespan_s"] > 0 for p in doc["points"])
    assert set(doc["baselines"]) == {"data parallel", "expert"}
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "mini_time_plan.json").read_text())["format"] == "placement_rl.plan"
    assert (
        main(
            [
                "frontier",
                "--model",
                "lenet",
                "--topology",
                "tensoropt",
                "--mode",
                "profiling",
                "--device-counts",
                "1,2",
                "--out-dir",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [r["devices"] for r in doc["rows"]] == [1, 2] and all(r["time_s"] > 0 for r in doc["rows"])
    assert (out / "profiling.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "99"], "--devices 99"),
        (["--memory-limit", "lots"], "argument --memory-limit: 'lots': expected GiB as a number or with a unit"),
        (["--memory-limit", "nan"], "argument --memory-limit: 'nan': expected a positive amount"),
        (
            ["--mode", "profiling", "--device-counts", "0,2"],
            "argument --device-counts: '0': expected a positive integer",
        ),
        (["--mode", "profiling", "--device-counts", "1,99"], "--device-counts [99]"),
        (["--model", "nosuchmodel"], "nosuchmodel"),
    ],
)
def test_cli_frontier_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["frontier", "--model", "lenet", "--topology", "tensoropt", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_ray_chunks_give_the_serial_frontier(ray_local, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.rl.parallel import RayMap

    graph, topo = zoo_graph("lenet"), load_preset("tensoropt")
    serial = run_ft(graph, topo, 8)
    chunks = RayMap(chunk_points=2_000)
    parallel = run_ft(graph, topo, 8, map_chunks=chunks)
    assert chunks.tasks > 1
    assert [(p.memory_bytes, p.time_s) for p in parallel.points] == [(p.memory_bytes, p.time_s) for p in serial.points]
    assert [p.plan.configs for p in parallel.points] == [p.plan.configs for p in serial.points]
