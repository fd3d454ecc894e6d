"""FT's frontier algebra and eliminations against brute-force enumeration on random cost graphs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement_rl.search.ft.frontier import combine, edge_table, frontier_of, node_table


def random_cost_graph(rng: np.random.Generator, n: int, edges: list[tuple[int, int]], k_max: int = 3, options: int = 3):  # type: ignore[no-untyped-def]
    """Integer costs (exact sums) with some options missing (infinite)."""
    K = rng.integers(1, k_max + 1, size=n)
    node_mem = [rng.integers(1, 20, size=k).astype(float) for k in K]
    node_time = [rng.integers(1, 20, size=k).astype(float) for k in K]
    edge_mem, edge_time = [], []
    for u, v in edges:
        m = rng.integers(0, 20, size=(K[u], K[v], options)).astype(float)
        t = rng.integers(0, 20, size=(K[u], K[v], options)).astype(float)
        missing = rng.random((K[u], K[v], options)) < 0.3
        missing[..., 0] = False
        m[missing] = np.inf
        t[missing] = np.inf
        edge_mem.append(m)
        edge_time.append(t)
    return K, node_mem, node_time, edge_mem, edge_time


def cost_of(configs, options, node_mem, node_time, edges, edge_mem, edge_time):  # type: ignore[no-untyped-def]
    mem = sum(node_mem[v][s] for v, s in enumerate(configs))
    time = sum(node_time[v][s] for v, s in enumerate(configs))
    for e, (u, v) in enumerate(edges):
        mem += edge_mem[e][configs[u], configs[v], options[e]]
        time += edge_time[e][configs[u], configs[v], options[e]]
    return mem, time


def brute_force(K, node_mem, node_time, edges, edge_mem, edge_time):  # type: ignore[no-untyped-def]
    points = []
    R = edge_mem[0].shape[2] if edges else 1
    for configs in itertools.product(*[range(k) for k in K]):
        for options in itertools.product(range(R), repeat=len(edges)):
            mem, time = cost_of(configs, options, node_mem, node_time, edges, edge_mem, edge_time)
            if np.isfinite(mem):
                points.append((mem, time))
    points.sort()
    frontier, best = [], np.inf
    for mem, time in points:
        if time < best:
            frontier.append((mem, time))
            best = time
    return frontier


GRAPHS = {
    "chain": (4, [(0, 1), (1, 2), (2, 3)]),
    "diamond": (4, [(0, 1), (0, 2), (1, 3), (2, 3)]),
    "residual": (5, [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4)]),
    "parallel edges": (3, [(0, 1), (0, 1), (1, 2)]),
    "side branch": (5, [(0, 1), (1, 2), (3, 1), (2, 4)]),
    "inception block": (6, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4), (4, 5)]),
    "two components": (4, [(0, 1), (2, 3)]),
    "lone node": (1, []),
    "dense (needs heuristics)": (5, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (3, 4), (1, 4)]),
}


@pytest.mark.parametrize("method", ["ldp", "elimination"])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_frontier_equals_brute_force_pareto_set(name: str, method: str) -> None:
    n, edges = GRAPHS[name]
    for seed in range(6):
        rng = np.random.default_rng(seed)
        K, nm, nt, em, et = random_cost_graph(rng, n, edges, k_max=2 if len(edges) > 5 else 3)
        result = frontier_of(K, nm, nt, edges, em, et, method=method)
        found = list(zip(result.memory_bytes.tolist(), result.time_s.tolist(), strict=True))
        expected = brute_force(K, nm, nt, edges, em, et)
        if result.stats.exact:
            assert found == expected, (name, seed)
        else:  # heuristic elimination: a subset of strategies, so never better than the true frontier
            for mem, time in found:
                assert any(m <= mem and t <= time for m, t in expected)
        # every point unrolls to a strategy with exactly that cost
        for p, (mem, time) in enumerate(found):
            configs, options = result.unroll(p)
            assert (configs >= 0).all() and (options >= 0).all()
            assert cost_of(configs, options, nm, nt, edges, em, et) == (mem, time)


def test_dense_graph_reports_heuristic_elimination() -> None:
    n, edges = GRAPHS["dense (needs heuristics)"]
    K, nm, nt, em, et = random_cost_graph(np.random.default_rng(0), n, edges)
    assert frontier_of(K, nm, nt, edges, em, et).stats.heuristic >= 1
    n, edges = GRAPHS["inception block"]
    K, nm, nt, em, et = random_cost_graph(np.random.default_rng(0), n, edges)
    stats = frontier_of(K, nm, nt, edges, em, et).stats
    assert stats.exact and stats.node >= 2 and stats.edge >= 1


def test_ldp_keeps_the_backbone_and_elimination_does_not() -> None:
    edges = [(i, i + 1) for i in range(7)]
    K, nm, nt, em, et = random_cost_graph(np.random.default_rng(1), 8, edges, k_max=4)
    ldp = frontier_of(K, nm, nt, edges, em, et, method="ldp").stats
    elim = frontier_of(K, nm, nt, edges, em, et, method="elimination").stats
    assert ldp.node == 0 and ldp.ldp_steps == 7 and ldp.backbone == tuple(range(8))
    assert elim.node == 6 and elim.ldp_steps == 1


def test_reduce_keeps_only_pareto_points_sorted_by_memory() -> None:
    table = edge_table(0, 0, 1, np.array([[[3.0, 1.0, 2.0, 5.0]]]), np.array([[[1.0, 5.0, 5.0, 0.5]]]))
    mem, time = table.cell((0, 0))
    assert mem.tolist() == [1.0, 3.0, 5.0] and time.tolist() == [5.0, 1.0, 0.5]
    assert table.labels is not None and table.labels.tolist() == [1, 0, 3]


def test_combine_chunks_give_the_same_table() -> None:
    rng = np.random.default_rng(3)
    a = edge_table(0, 0, 1, rng.integers(0, 50, (6, 5, 3)).astype(float), rng.integers(0, 50, (6, 5, 3)).astype(float))
    b = node_table(1, rng.integers(0, 50, 5).astype(float), rng.integers(0, 50, 5).astype(float))
    c = edge_table(1, 1, 2, rng.integers(0, 50, (5, 4, 3)).astype(float), rng.integers(0, 50, (5, 4, 3)).astype(float))
    sizes = {0: 6, 1: 5, 2: 4}
    whole = combine([a, b, c], (0, 2), sizes)
    calls = []

    def mapper(fn, args):  # type: ignore[no-untyped-def]
        calls.append(len(args))
        return [fn(*x) for x in args]

    chunked = combine([a, b, c], (0, 2), sizes, map_chunks=mapper, chunk_points=40)
    assert calls and max(calls) > 1
    np.testing.assert_array_equal(whole.ptr, chunked.ptr)
    np.testing.assert_array_equal(whole.memory_bytes, chunked.memory_bytes)
    np.testing.assert_array_equal(whole.time_s, chunked.time_s)


def test_bad_cost_graphs_are_rejected() -> None:
    with pytest.raises(ValueError, match="no finite option"):
        edge_table(0, 0, 1, np.full((1, 1, 2), np.inf), np.full((1, 1, 2), np.inf))
    with pytest.raises(ValueError, match="cycle"):
        frontier_of(
            [1, 1],
            [np.ones(1)] * 2,
            [np.ones(1)] * 2,
            [(0, 1), (1, 0)],
            [np.ones((1, 1, 1))] * 2,
            [np.ones((1, 1, 1))] * 2,
        )
    with pytest.raises(ValueError, match="method"):
        frontier_of([1], [np.ones(1)], [np.ones(1)], [], [], [], method="dp")
    with pytest.raises(ValueError, match="self-loop"):
        frontier_of([1], [np.ones(1)], [np.ones(1)], [(0, 0)], [np.ones((1, 1, 1))], [np.ones((1, 1, 1))])
