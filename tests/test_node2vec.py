"""Node2vec walks and skip-gram embeddings (placement_rl.policies.node2vec)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement_rl.graph import node2vec
from placement_rl.graph.node2vec import node2vec_embedding, node2vec_walks


def _undirected(edge_index: np.ndarray) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in edge_index.T} | {(int(b), int(a)) for a, b in edge_index.T}


def _cycle(n: int) -> np.ndarray:
    src = np.arange(n)
    return np.stack([src, (src + 1) % n])


def _torus(side: int) -> np.ndarray:
    """A ``side x side`` torus grid: 4-regular, no triangles for ``side >= 4``."""
    node = np.arange(side * side).reshape(side, side)
    right = np.stack([node.ravel(), np.roll(node, -1, axis=1).ravel()])
    down = np.stack([node.ravel(), np.roll(node, -1, axis=0).ravel()])
    return np.concatenate([right, down], axis=1)


def _two_cliques(size: int) -> np.ndarray:
    edges = [(a, b) for a in range(size) for b in range(a + 1, size)]
    edges += [(a + size, b + size) for a, b in edges]
    edges.append((size - 1, size))  # the single bridge
    return np.array(edges, dtype=np.int64).T


def _random_graph(seed: int) -> tuple[int, np.ndarray]:
    """30 nodes, ~60 random edges among nodes 0..24 (25..29 isolated): duplicates, reversed
    duplicates and self-loops included."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, 25, size=(2, 60))
    return 30, np.concatenate([edges, edges[:, :5], edges[::-1, 5:10], [[3, 7], [3, 7]]], axis=1)


# --- walks ---------------------------------------------------------------------------------------


def test_walk_shape_dtype_and_starts() -> None:
    n, edges = _random_graph(0)
    walks = node2vec_walks(n, edges, walk_length=7, walks_per_node=3, rng=np.random.default_rng(0))
    assert walks.shape == (n * 3, 7)
    assert walks.dtype == np.int64
    np.testing.assert_array_equal(walks[:, 0], np.repeat(np.arange(n), 3))


@pytest.mark.parametrize(("p", "q"), [(1.0, 1.0), (0.1, 10.0), (10.0, 0.1), (0.5, 2.0)])
def test_walks_stay_on_edges(p: float, q: float) -> None:
    n, edges = _random_graph(1)
    walks = node2vec_walks(n, edges, walk_length=15, walks_per_node=20, p=p, q=q, rng=np.random.default_rng(1))
    allowed = _undirected(edges)
    degree = np.zeros(n, dtype=np.int64)
    np.add.at(degree, np.concatenate([edges[0], edges[1]]), 1)
    for walk in walks:
        if degree[walk[0]] == 0:
            assert (walk == walk[0]).all()  # isolated nodes walk in place
        else:
            assert all((int(a), int(b)) in allowed for a, b in itertools.pairwise(walk))
    visited = np.unique(walks[degree[walks[:, 0]] > 0])
    assert degree[visited].min() > 0


def test_graph_without_edges_walks_in_place() -> None:
    walks = node2vec_walks(
        4, np.zeros((2, 0), dtype=np.int64), walk_length=3, walks_per_node=2, p=0.5, q=2.0, rng=np.random.default_rng(0)
    )
    np.testing.assert_array_equal(walks, np.repeat(np.arange(4), 2)[:, None].repeat(3, axis=1))


def test_walks_deterministic_for_a_seed() -> None:
    n, edges = _random_graph(2)
    kw = dict(walk_length=10, walks_per_node=5, p=0.3, q=3.0)
    a = node2vec_walks(n, edges, rng=np.random.default_rng(7), **kw)
    b = node2vec_walks(n, edges, rng=np.random.default_rng(7), **kw)
    c = node2vec_walks(n, edges, rng=np.random.default_rng(8), **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def _return_fraction(walks: np.ndarray) -> float:
    """Fraction of steps (from the second on) that go back to the node visited two steps before."""
    return float((walks[:, 2:] == walks[:, :-2]).mean())


def test_small_p_makes_walks_return() -> None:
    # 4-regular, triangle-free: unbiased return probability 1/4; with p = 0.01 it is 100 / 103.
    edges = _torus(6)
    fractions = {
        p: _return_fraction(
            node2vec_walks(36, edges, walk_length=20, walks_per_node=20, p=p, q=1.0, rng=np.random.default_rng(3))
        )
        for p in (0.01, 1.0, 100.0)
    }
    assert fractions[0.01] > 0.9
    assert 0.2 < fractions[1.0] < 0.3
    assert fractions[100.0] < 0.02


def test_small_q_makes_walks_move_outward() -> None:
    # On a 100-cycle, q = 0.01 continues in the same direction with probability 100 / 101, so a
    # 20-node walk ends ~17 hops from its start (measured 17.2-17.5 over seeds; a rare reversal
    # costs many hops); an unbiased walk ends ~3.5 hops away, and q = 100 oscillates (~1 hop).
    n = 100
    edges = _cycle(n)

    def mean_distance(q: float) -> float:
        walks = node2vec_walks(n, edges, walk_length=20, walks_per_node=10, p=1.0, q=q, rng=np.random.default_rng(4))
        hop = np.abs(walks[:, -1] - walks[:, 0])
        return float(np.minimum(hop, n - hop).mean())

    outward, unbiased, inward = mean_distance(0.01), mean_distance(1.0), mean_distance(100.0)
    assert outward > 15.0
    assert 2.0 < unbiased < 6.0
    assert inward < 1.5
    assert outward > 3 * unbiased


@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize(("p", "q"), [(0.5, 2.0), (2.0, 0.5), (0.05, 1.0)])
@pytest.mark.parametrize("sampler", ["rejection", "exact", "exact_chunked"])
def test_transition_probabilities_match_node2vec(
    monkeypatch: pytest.MonkeyPatch, sampler: str, p: float, q: float, self_loops: bool
) -> None:
    """From v=1 having come from t=0: x=0 (return, 1/p), x=2 (neighbour of t, 1), x=3 (else, 1/q).

    With self-loops at 0 and 1, x=1 is a candidate too (a neighbour of t, weight 1), and t's own
    self-loop must not make t count as a common neighbour. Checked for rejection sampling (with the
    return edge proposed separately when ``1/p > max(1, 1/q)``), the exact sampler alone, and the
    exact sampler in chunks of a few walks.
    """
    if sampler != "rejection":
        monkeypatch.setattr(node2vec, "_REJECTION_ROUNDS", 0)
    if sampler == "exact_chunked":
        monkeypatch.setattr(node2vec, "_MAX_CANDIDATES", 64)
    edges = np.array([[0, 1, 0, 1], [1, 2, 2, 3]])
    candidates, weights = [0, 2, 3], [1 / p, 1.0, 1 / q]
    if self_loops:
        edges = np.concatenate([edges, [[0, 1], [0, 1]]], axis=1)
        candidates, weights = [*candidates, 1], [*weights, 1.0]
    walks = node2vec_walks(4, edges, walk_length=20, walks_per_node=1000, p=p, q=q, rng=np.random.default_rng(5))
    prev, cur, nxt = walks[:, :-2].ravel(), walks[:, 1:-1].ravel(), walks[:, 2:].ravel()
    after = nxt[(prev == 0) & (cur == 1)]
    assert after.size > 2000
    counts = np.array([(after == x).sum() for x in candidates])
    assert counts.sum() == after.size
    weights = np.array(weights)
    expected = weights / weights.sum()
    observed = counts / after.size
    sigma = np.sqrt(expected * (1 - expected) / after.size)
    assert (np.abs(observed - expected) < 5 * sigma).all(), (observed, expected)


@pytest.mark.parametrize(("p", "q"), [(0.01, 1.0), (1.0, 100.0), (0.002, 0.5)])
def test_extreme_bias_at_a_hub_is_exact_and_fast(p: float, q: float) -> None:
    """A "book": hub 0 joined to 2000 leaves, leaves joined in pairs (1-2, 3-4, ...).

    From the hub, having come from a leaf, the walk returns with weight 1/p, moves to the leaf's
    partner (a common neighbour) with weight 1 and to each of the 1998 other leaves with 1/q. Plain
    rejection sampling would accept ~1% of proposals for these p, q, and an exact scan of the hub's
    2000 neighbours per walk would be slow; both must stay fast and exact.
    """
    leaves = 2000
    leaf = np.arange(1, leaves + 1)
    edges = np.concatenate(
        [np.stack([np.zeros(leaves, dtype=np.int64), leaf]), np.stack([leaf[0::2], leaf[1::2]])], axis=1
    )
    walks = node2vec_walks(leaves + 1, edges, walk_length=10, walks_per_node=2, p=p, q=q, rng=np.random.default_rng(6))
    prev, cur, nxt = walks[:, :-2].ravel(), walks[:, 1:-1].ravel(), walks[:, 2:].ravel()
    from_leaf = (cur == 0) & (prev > 0)
    partner = np.where(prev % 2 == 1, prev + 1, prev - 1)
    weights = np.array([1 / p, 1.0, (leaves - 2) / q])
    expected = weights[:2] / weights.sum()
    observed = np.array([(nxt == prev)[from_leaf].mean(), (nxt == partner)[from_leaf].mean()])
    sigma = np.sqrt(expected * (1 - expected) / from_leaf.sum())
    assert (np.abs(observed - expected) < 5 * sigma + 1e-9).all(), (observed, expected)


# --- embedding -----------------------------------------------------------------------------------


def test_embedding_shape_dtype_and_determinism() -> None:
    n, edges = _random_graph(3)
    kw = dict(dim=8, walk_length=8, walks_per_node=4, context_size=3, epochs=2, p=0.5, q=2.0, num_negative=2)
    a = node2vec_embedding(n, edges, seed=11, **kw)
    b = node2vec_embedding(n, edges, seed=11, **kw)
    c = node2vec_embedding(n, edges, seed=12, **kw)
    assert a.shape == (n, 8)
    assert a.dtype == np.float32
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("sparse", [False, True])
def test_embedding_separates_two_cliques(monkeypatch: pytest.MonkeyPatch, sparse: bool) -> None:
    if sparse:  # the SparseAdam path used for large graphs
        monkeypatch.setattr(node2vec, "_DENSE_MAX_NODES", 0)
    size = 10
    emb = node2vec_embedding(2 * size, _two_cliques(size), seed=0)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    cos = unit @ unit.T
    cluster = np.arange(2 * size) // size
    same = cluster[:, None] == cluster[None, :]
    off_diagonal = ~np.eye(2 * size, dtype=bool)
    within = cos[same & off_diagonal].mean()
    across = cos[~same].mean()
    assert within - across > 1.0, (within, across)  # measured ~0.98 vs ~-0.98


# --- validation ----------------------------------------------------------------------------------

_EDGES = np.array([[0, 1], [1, 2]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_nodes=0), "num_nodes"),
        (dict(edge_index=np.array([0, 1, 2])), "edge_index"),
        (dict(edge_index=np.zeros((3, 2), dtype=np.int64)), "edge_index"),
        (dict(edge_index=np.array([[0, 1], [1, 3]])), "edge_index"),
        (dict(edge_index=np.array([[0, -1], [1, 2]])), "edge_index"),
        (dict(edge_index=np.array([[0.0, 1.0], [1.0, 2.0]])), "edge_index"),
        (dict(p=0.0), "p ="),
        (dict(q=-1.0), "q ="),
        (dict(walk_length=1), "walk_length"),
        (dict(walks_per_node=0), "walks_per_node"),
    ],
)
def test_walks_reject_bad_inputs(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = dict(num_nodes=3, edge_index=_EDGES, rng=np.random.default_rng(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        node2vec_walks(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_nodes=0), "num_nodes"),
        (dict(edge_index=np.zeros((2, 2, 1), dtype=np.int64)), "edge_index"),
        (dict(edge_index=np.array([[0, 5], [1, 2]])), "edge_index"),
        (dict(p=-0.5), "p ="),
        (dict(q=0.0), "q ="),
        (dict(dim=0), "dim"),
        (dict(walk_length=1), "walk_length"),
        (dict(context_size=0), "context_size"),
        (dict(walk_length=5, context_size=5), "context_size"),
        (dict(num_negative=0), "num_negative"),
        (dict(epochs=0), "epochs"),
        (dict(lr=0.0), "lr"),
    ],
)
def test_embedding_rejects_bad_inputs(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = dict(num_nodes=3, edge_index=_EDGES)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        node2vec_embedding(**args)  # type: ignore[arg-type]
