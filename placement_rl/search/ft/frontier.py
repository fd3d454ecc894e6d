"""Cost frontiers and TensorOpt's Frontier-Tracking (FT) algorithm over an additive cost graph.

TensorOpt (seed 000, sec. 4) tracks, instead of one best strategy, the *cost frontier*: the
Pareto-minimal set of (memory, time) pairs over all strategies (Def. 1). This module implements
the algorithm on an abstract cost graph (:class:`placement_rl.search.ft.costs.CostGraph`: ``K_v``
configurations per node with a cost each, per-edge cost tables over configuration pairs with a few
options each); :mod:`placement_rl.search.ft` builds that graph from an op graph and a topology.

**Tables.** Every intermediate result is a :class:`Table`: a frontier per *cell*, where a cell is one
configuration of each of the table's variables (ops). A node's table has one variable, an edge's
two, the final result none. All frontiers of a table live in flat arrays (``ptr`` marks where each
cell's points start), so products, unions and reductions are vectorized over all cells at once.

**Algebra** (sec. 4.2). ``reduce`` (Algorithm 1): sort a cell's points by memory (then time) and
keep those that lower the best time so far. ``product``: all sums of one point from each frontier.
``union``: concatenation. Both are followed by ``reduce``. One primitive, :func:`combine`, does
them together: the product of several tables over the union of their variables, then the union
over the variables that are not kept, reduced per kept cell. Reducing the intermediate products
early is exact (a dominated summand only yields dominated sums).

**Eliminations** (Eq. 4-7), each one :func:`combine` call:

* node (Eq. 4): a node ``v`` with exactly two neighbours ``u`` and ``w``:
  ``F(u,w)[s_u, s_w] = U_{s_v} F(u,v) x F(v) x F(v,w)``;
* edge (Eq. 5): two tables over the same pair of nodes are multiplied cell by cell;
* branch (Eq. 6): a node ``u`` with one neighbour ``v`` merges into it:
  ``F(v)[s_v] = F(v)[s_v] x U_{s_u} F(u) x F(u,v)``;
* heuristic (Eq. 7, inexact): fix a node's configuration (the least-time or the least-memory one) and fold
  its edges into its neighbours' tables; used only when nothing exact applies.

Edges are undirected here (their costs already account for direction). The *linear backbone* is
the longest path of the DAG; eliminations remove the nodes off it first and backbone nodes only
where a remaining edge skips over them, until the graph is a path. **Linear DP** (Algorithm 3)
then runs along the path with cumulative frontiers
``CF(o_{i+1}, s) = F(o_{i+1})[s] x U_{s'} CF(o_i, s') x F(o_i, o_{i+1})[s', s]``, which costs
``K^2`` products per step where eliminating the same node costs ``K^3`` (FT-Elimination, which
keeps eliminating down to two nodes, is the paper's slower comparison point).

**Unrolling.** Every point keeps the index of the point it came from in each of its parent tables,
so a final point is unrolled to a configuration per node and an option per edge by walking these
references down to the leaf tables.

**Parallelism.** The cells of one :func:`combine` are independent (TensorOpt's multithreading over
the configurations of one op). ``combine`` splits large ones into chunks of kept cells and hands
them to ``map_chunks``, a :class:`placement_rl.parallel.TaskMap` (serial by default;
:class:`placement_rl.rl.parallel.RayMap` runs them as Ray tasks). This module does not import Ray.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from placement_rl.graph.ir import CycleError, topological_order
from placement_rl.parallel import TaskMap, serial_map

MapChunks = TaskMap

#: candidate points of one combine chunk (bounds the working memory to a few hundred MB).
CHUNK_POINTS = 4_000_000


@dataclass(eq=False)
class Table:
    """Frontiers of (memory, time) points, one per cell of ``shape`` (row-major over ``variables``).

    Attributes:
        variables: the node indices the cells range over (``()`` for a single frontier).
        shape: configurations per variable.
        ptr: (C + 1,) int64, points of cell ``c`` are ``ptr[c]:ptr[c + 1]``; ``C = prod(shape)``.
        memory_bytes: (N,) float64, sorted ascending within each cell.
        time_s: (N,) float64, strictly descending within each cell (a reduced frontier).
        parents: the tables the points were built from (empty for a leaf).
        refs: (N, len(parents)) int64, the point of each parent a point came from.
        leaf: for a leaf, ``("node", v)`` or ``("edge", e)``; ``None`` otherwise.
        labels: for a leaf, (N,) int64 per point: the configuration (node) or the option (edge).
    """

    variables: tuple[int, ...]
    shape: tuple[int, ...]
    ptr: np.ndarray
    memory_bytes: np.ndarray
    time_s: np.ndarray
    parents: tuple[Table, ...] = ()
    refs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    leaf: tuple[str, int] | None = None
    labels: np.ndarray | None = None

    @property
    def num_cells(self) -> int:
        return math.prod(self.shape)

    @property
    def sizes(self) -> np.ndarray:
        """(C,) points per cell."""
        return np.diff(self.ptr)

    def cell(self, index: Sequence[int] | int) -> tuple[np.ndarray, np.ndarray]:
        """(memory_bytes, time_s) of one cell's frontier."""
        c = int(np.ravel_multi_index(tuple(np.atleast_1d(index)), self.shape)) if self.shape else 0
        lo, hi = self.ptr[c], self.ptr[c + 1]
        return self.memory_bytes[lo:hi], self.time_s[lo:hi]

    def cell_of(self, points: np.ndarray) -> np.ndarray:
        """(M,) cell index of each point."""
        return np.searchsorted(self.ptr, points, side="right") - 1


# ----------------------------------------------------------------------------------------- leaves
def node_table(v: int, memory_bytes: np.ndarray, time_s: np.ndarray) -> Table:
    """Leaf table of node ``v``: one point per configuration (``memory_bytes``, ``time_s``: (K,))."""
    K = len(memory_bytes)
    return Table(
        (v,),
        (K,),
        np.arange(K + 1, dtype=np.int64),
        np.asarray(memory_bytes, np.float64),
        np.asarray(time_s, np.float64),
        leaf=("node", v),
        labels=np.arange(K, dtype=np.int64),
    )


def edge_table(e: int, u: int, v: int, memory_bytes: np.ndarray, time_s: np.ndarray) -> Table:
    """Leaf table of edge ``e`` between nodes ``u`` and ``v`` from (K_u, K_v, R) option costs.

    Options with an infinite cost do not apply; each cell keeps the reduced frontier of its options
    (the points' labels are option indices). Every cell must have at least one finite option.
    """
    memory_bytes = np.asarray(memory_bytes, np.float64)
    time_s = np.asarray(time_s, np.float64)
    Ku, Kv, R = memory_bytes.shape
    ok = np.isfinite(memory_bytes) & np.isfinite(time_s)
    if not ok.any(axis=2).all():
        bad = np.argwhere(~ok.any(axis=2))[0]
        raise ValueError(f"edge {e} ({u}, {v}): configurations {tuple(int(x) for x in bad)} have no finite option")
    cells = np.repeat(np.arange(Ku * Kv), R)[ok.ravel()]
    options = np.tile(np.arange(R), Ku * Kv)[ok.ravel()]
    ptr, keep = _reduce(cells, memory_bytes.ravel()[ok.ravel()], time_s.ravel()[ok.ravel()], Ku * Kv)
    return Table(
        (u, v),
        (Ku, Kv),
        ptr,
        memory_bytes.ravel()[ok.ravel()][keep],
        time_s.ravel()[ok.ravel()][keep],
        leaf=("edge", e),
        labels=options[keep],
    )


def select(table: Table, variable: int, value: int) -> Table:
    """The sub-table with ``variable`` fixed to configuration ``value`` (for heuristic elimination)."""
    axis = table.variables.index(variable)
    grid = np.indices(table.shape).reshape(len(table.shape), -1)
    cells = np.flatnonzero(grid[axis] == value)
    sizes = table.sizes[cells]
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    points = _ranges(table.ptr[cells], sizes)
    shape = table.shape[:axis] + table.shape[axis + 1 :]
    return Table(
        table.variables[:axis] + table.variables[axis + 1 :],
        shape,
        ptr,
        table.memory_bytes[points],
        table.time_s[points],
        (table,),
        points[:, None],
    )


# ---------------------------------------------------------------------------------------- algebra
def combine(
    tables: Sequence[Table],
    keep: Sequence[int],
    sizes: dict[int, int],
    *,
    map_chunks: MapChunks | None = None,
    chunk_points: int = CHUNK_POINTS,
    tolerance: float = 0.0,
) -> Table:
    """Reduced union over the non-kept variables of the product of ``tables`` (see module doc).

    Args:
        tables: tables whose variables together cover ``keep``.
        keep: the variables of the result, in this order.
        sizes: configurations per variable.
        map_chunks: runs independent chunks of kept cells (default: serially). ``frontier_of`` uses
            its ``chunk_points`` attribute, if it has one, as the chunk size.
        chunk_points: the most candidate points one chunk may enumerate.
        tolerance: relative time resolution of the reduce (0: exact; see :func:`frontier_of`).

    Returns:
        a table over ``keep`` whose parents are ``tables`` (one ref per table per point).
    """
    if not tables:
        raise ValueError("combine needs at least one table")
    keep = tuple(keep)
    tables = list(tables)
    while len(tables) > 2:
        # multiply the pair with the fewest joint cells first and reduce it before going on: the
        # reduced partial product is usually far smaller than the raw one
        pairs = [(i, j) for i in range(len(tables)) for j in range(i + 1, len(tables))]

        def joint(pair: tuple[int, int], tables: list[Table] = tables) -> tuple[int, ...]:
            a, b = tables[pair[0]], tables[pair[1]]
            return a.variables + tuple(v for v in b.variables if v not in a.variables)

        i, j = min(pairs, key=lambda pair: math.prod(sizes[v] for v in joint(pair)))
        merged = combine(
            [tables[i], tables[j]],
            joint((i, j)),
            sizes,
            map_chunks=map_chunks,
            chunk_points=chunk_points,
            tolerance=tolerance,
        )
        tables = [t for k, t in enumerate(tables) if k not in (i, j)] + [merged]
    allvars = list(keep)
    for t in tables:
        allvars.extend(v for v in t.variables if v not in allvars)
    summed = tuple(v for v in allvars if v not in keep)
    full = keep + summed
    full_shape = tuple(sizes[v] for v in full)
    keep_cells = math.prod(sizes[v] for v in keep)
    sum_cells = math.prod(sizes[v] for v in summed)
    # every table's cell index for every full cell, and the candidate count per full cell
    grid = np.indices(full_shape).reshape(len(full), -1) if full else np.zeros((0, 1), np.int64)
    cell_idx = []
    count = np.ones(grid.shape[1], np.int64)
    for t in tables:
        axes = [full.index(v) for v in t.variables]
        c = np.ravel_multi_index(tuple(grid[a] for a in axes), t.shape) if axes else np.zeros(grid.shape[1], np.int64)
        cell_idx.append(c)
        count *= t.sizes[c]
    per_keep = count.reshape(keep_cells, sum_cells).sum(axis=1)
    # contiguous chunks of kept cells with at most chunk_points candidates each
    bounds = [0]
    running = 0
    for k, n in enumerate(per_keep.tolist()):
        if running and running + n > chunk_points:
            bounds.append(k)
            running = 0
        running += n
    bounds.append(keep_cells)
    parts = [_slim(t) for t in tables]
    args = [
        (parts, [c.reshape(keep_cells, sum_cells)[lo:hi].ravel() for c in cell_idx], hi - lo, sum_cells, tolerance)
        for lo, hi in itertools.pairwise(bounds)
    ]
    results = (map_chunks or serial_map)(_combine_chunk, args)
    ptrs, mems, times, refs = [np.zeros(1, np.int64)], [], [], []
    offset = 0
    for ptr, mem, time_s, ref in results:
        ptrs.append(ptr[1:] + offset)
        offset += len(mem)
        mems.append(mem)
        times.append(time_s)
        refs.append(ref)
    return Table(
        keep,
        tuple(sizes[v] for v in keep),
        np.concatenate(ptrs),
        np.concatenate(mems) if mems else np.zeros(0),
        np.concatenate(times) if times else np.zeros(0),
        tuple(tables),
        np.concatenate(refs) if refs else np.zeros((0, len(tables)), np.int64),
    )


def _slim(t: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a chunk worker needs of a table (no parents: cheap to ship to a Ray task)."""
    return t.ptr, t.memory_bytes, t.time_s


def _combine_chunk(
    parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    cells: Sequence[np.ndarray],
    keep_cells: int,
    sum_cells: int,
    tolerance: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Product over ``keep_cells * sum_cells`` full cells, then the union per kept cell, reduced."""
    full_cells = keep_cells * sum_cells
    # enumerate candidates: for each full cell, the cartesian product of its tables' points
    count = np.ones(full_cells, np.int64)
    for (ptr, _, _), c in zip(parts, cells, strict=True):
        count *= np.diff(ptr)[c]
    total = int(count.sum())
    owner = np.repeat(np.arange(full_cells), count)
    local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    mem = np.zeros(total)
    time = np.zeros(total)
    refs = np.empty((total, len(parts)), np.int64)
    stride = count.copy()
    for k, ((ptr, m, t), c) in enumerate(zip(parts, cells, strict=True)):
        n = np.diff(ptr)[c]
        stride //= np.maximum(n, 1)
        pick = ptr[c][owner] + (local // stride[owner]) % n[owner] if total else np.zeros(0, np.int64)
        refs[:, k] = pick
        mem += m[pick]
        time += t[pick]
    ptr_out, keep = _reduce(owner // sum_cells, mem, time, keep_cells, tolerance)
    return ptr_out, mem[keep], time[keep], refs[keep]


def _reduce(
    cells: np.ndarray, memory: np.ndarray, time: np.ndarray, num_cells: int, tolerance: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 per cell: (ptr (num_cells + 1,), indices of the kept points in cell order).

    ``cells`` must be non-decreasing (every caller generates points cell by cell), so each cell's
    points are one contiguous segment and are sorted on their own, not all together.
    With ``tolerance > 0`` a point is kept only when it is faster than the best point with less
    memory by more than that fraction (an epsilon-Pareto set; 0 keeps every Pareto point).
    """
    if len(cells) > 1 and (np.diff(cells) < 0).any():
        raise ValueError("_reduce needs points grouped by cell (non-decreasing cell indices)")
    seg = np.zeros(num_cells + 1, np.int64)
    np.cumsum(np.bincount(cells, minlength=num_cells), out=seg[1:])
    kept, counts = _reduce_segments(seg, memory, time, 1.0 - tolerance)
    ptr = np.zeros(num_cells + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, kept


@njit(cache=True)
def _reduce_segments(seg, memory, time, factor):  # type: ignore[no-untyped-def]
    """Per segment ``seg[c]:seg[c + 1]``: sort by (memory, time) and keep the points whose time is
    below ``factor`` x every earlier kept time. Returns (kept indices in cell order, count per cell)."""
    num_cells = len(seg) - 1
    kept = np.empty(seg[-1], np.int64)
    counts = np.zeros(num_cells, np.int64)
    k = 0
    for c in range(num_cells):
        lo, hi = seg[c], seg[c + 1]
        if hi - lo == 1:
            kept[k] = lo
            k += 1
            counts[c] = 1
            continue
        by_time = np.argsort(time[lo:hi], kind="mergesort")
        order = by_time[np.argsort(memory[lo:hi][by_time], kind="mergesort")]
        best = np.inf
        for j in order:
            if time[lo + j] < best:
                kept[k] = lo + j
                k += 1
                counts[c] += 1
                best = time[lo + j] * factor
    return kept[:k], counts


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for each start and length."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return (np.repeat(starts, lengths) + np.arange(total) - offsets).astype(np.int64)


# ------------------------------------------------------------------------------------ elimination
@dataclass
class Elimination:
    """What FT did to one graph (for reports and tests)."""

    node: int = 0
    edge: int = 0
    branch: int = 0
    heuristic: int = 0
    ldp_steps: int = 0
    backbone: tuple[int, ...] = ()
    #: seconds spent reducing the graph to a path (the same for FT-LDP and FT-Elimination)
    to_path_s: float = 0.0
    #: seconds spent on the path: Linear DP, or FT-Elimination's eliminations down to two nodes
    path_s: float = 0.0
    path_length: int = 0

    @property
    def exact(self) -> bool:
        """Whether the frontier is exact (no heuristic elimination was needed)."""
        return self.heuristic == 0


@dataclass(frozen=True)
class FrontierResult:
    """The final frontier and how to unroll it.

    Attributes:
        table: the 0-variable table holding the frontier (points sorted by memory).
        num_nodes: nodes of the cost graph.
        num_edges: edges of the cost graph.
        stats: the eliminations performed.
    """

    table: Table
    num_nodes: int
    num_edges: int
    stats: Elimination

    @property
    def memory_bytes(self) -> np.ndarray:
        return self.table.memory_bytes

    @property
    def time_s(self) -> np.ndarray:
        return self.table.time_s

    def unroll(self, point: int) -> tuple[np.ndarray, np.ndarray]:
        """(configs (num_nodes,), options (num_edges,)) of frontier point ``point``.

        Walks the parent references down to the leaves (iteratively: the DP chain is deep).
        """
        configs = np.full(self.num_nodes, -1, np.int64)
        options = np.full(self.num_edges, -1, np.int64)
        stack: list[tuple[Table, int]] = [(self.table, int(self.table.ptr[0]) + point)]
        while stack:
            table, p = stack.pop()
            if table.leaf is not None:
                kind, index = table.leaf
                assert table.labels is not None
                (configs if kind == "node" else options)[index] = table.labels[p]
                continue
            for parent, ref in zip(table.parents, table.refs[p], strict=True):
                stack.append((parent, int(ref)))
        return configs, options


def frontier_of(
    num_configs: Sequence[int] | np.ndarray,
    node_memory_bytes: Sequence[np.ndarray],
    node_time_s: Sequence[np.ndarray],
    edges: Sequence[tuple[int, int]],
    edge_memory_bytes: Sequence[np.ndarray],
    edge_time_s: Sequence[np.ndarray],
    *,
    method: str = "ldp",
    map_chunks: MapChunks | None = None,
    progress: Callable[[int, int], None] | None = None,
    tolerance: float = 0.0,
    heuristic: str = "time",
) -> FrontierResult:
    """FT over an additive cost graph (arguments as in :class:`~placement_rl.search.ft.costs.CostGraph`).

    Args:
        method: ``ldp`` (eliminate to a path, then Linear DP: FT-LDP) or ``elimination`` (eliminate
            down to two nodes: FT-Elimination).
        map_chunks: maps independent chunks of one combine (see :func:`combine`).
        progress: called with (nodes processed, total nodes) after every step.
        tolerance: relative time resolution of every reduce. 0 tracks the exact frontier. Large
            graphs with many parallel paths can have thousands of Pareto points per cell, mostly
            differing by fractions of a percent; a tolerance of 0.01 keeps a point only when it is
            at least 1% faster than a point with less memory, which bounds a cell's frontier to
            about ``ln(t_max / t_min) / 0.01`` points. The error can compound across reduces.
        heuristic: which configuration heuristic elimination fixes: ``time`` or ``memory`` (see
            ``_Graph.eliminate_heuristic``).

    Returns:
        the frontier over all strategies: configurations per node and options per edge.
    """
    if heuristic not in ("time", "memory"):
        raise ValueError(f"heuristic {heuristic!r}; expected 'time' or 'memory'")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance = {tolerance}; expected a fraction in [0, 1)")
    if method not in ("ldp", "elimination"):
        raise ValueError(f"method {method!r}; expected 'ldp' or 'elimination'")
    n = len(num_configs)
    if n == 0:
        raise ValueError("the cost graph has no nodes")
    sizes = {v: int(k) for v, k in enumerate(num_configs)}
    for v, k in sizes.items():
        if k < 1:
            raise ValueError(f"node {v} has {k} configurations; expected at least 1")
    state = _Graph(sizes, map_chunks, tolerance, heuristic)
    for v in range(n):
        state.nodes[v] = node_table(v, node_memory_bytes[v], node_time_s[v])
        state.adj[v] = set()
    for e, (u, v) in enumerate(edges):
        if u == v:
            raise ValueError(f"edge {e} is a self-loop on node {u}")
        table = edge_table(e, u, v, edge_memory_bytes[e], edge_time_s[e])
        state.add_edge(u, v, table)
    state.stats.backbone = tuple(_longest_path(n, edges))
    backbone = list(state.stats.backbone)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, n)

    start = time.perf_counter()
    path = state.eliminate_to_path(backbone, tick)
    state.stats.path_length = len(path)
    middle = time.perf_counter()
    if method == "elimination":
        while len(path) > 2:
            v = path.pop(len(path) // 2)
            state.eliminate_node(v)
            tick()
    final = state.linear_dp(path, tick)
    state.stats.to_path_s = middle - start
    state.stats.path_s = time.perf_counter() - middle
    return FrontierResult(final, n, len(edges), state.stats)


class _Graph:
    """The shrinking cost graph: a table per remaining node and per remaining node pair."""

    def __init__(self, sizes: dict[int, int], map_chunks: MapChunks | None, tolerance: float, heuristic: str) -> None:
        self.sizes = sizes
        self.tolerance = tolerance
        self.heuristic = heuristic
        self.map_chunks = map_chunks
        self.nodes: dict[int, Table] = {}
        self.edges: dict[tuple[int, int], Table] = {}
        self.adj: dict[int, set[int]] = {}
        self.constants: list[Table] = []
        self.stats = Elimination()

    def combine(self, tables: Sequence[Table], keep: Sequence[int]) -> Table:
        chunk = getattr(self.map_chunks, "chunk_points", CHUNK_POINTS)
        return combine(
            tables, keep, self.sizes, map_chunks=self.map_chunks, chunk_points=chunk, tolerance=self.tolerance
        )

    def edge(self, u: int, v: int) -> Table:
        return self.edges[(min(u, v), max(u, v))]

    def add_edge(self, u: int, v: int, table: Table) -> None:
        """Add a table between ``u`` and ``v``; a parallel one is merged (edge elimination, Eq. 5)."""
        key = (min(u, v), max(u, v))
        found = self.edges.get(key)
        if found is not None:
            table = self.combine([found, table], key)
            self.stats.edge += 1
        elif table.variables != key:
            table = self.combine([table], key)
        self.edges[key] = table
        self.adj[u].add(v)
        self.adj[v].add(u)

    def remove(self, v: int) -> None:
        for u in self.adj.pop(v):
            self.adj[u].discard(v)
            self.edges.pop((min(u, v), max(u, v)))
        del self.nodes[v]

    def eliminate_node(self, v: int) -> None:
        """Eq. 4: ``v`` has neighbours ``u`` and ``w``; it becomes an edge between them."""
        u, w = sorted(self.adj[v])
        table = self.combine([self.edge(u, v), self.nodes[v], self.edge(v, w)], (u, w))
        self.remove(v)
        self.stats.node += 1
        self.add_edge(u, w, table)

    def eliminate_branch(self, u: int) -> None:
        """Eq. 6: ``u`` has the single neighbour ``v`` and merges into it."""
        (v,) = self.adj[u]
        self.nodes[v] = self.combine([self.nodes[v], self.nodes[u], self.edge(u, v)], (v,))
        self.remove(u)
        self.stats.branch += 1

    def eliminate_isolated(self, v: int) -> None:
        self.constants.append(self.combine([self.nodes[v]], ()))
        self.remove(v)

    def eliminate_heuristic(self, v: int) -> None:
        """Eq. 7: fix ``v`` to one configuration and fold its edges into its neighbours; inexact.

        ``heuristic="memory"`` fixes the configuration with the least memory (TensorOpt's example);
        ``"time"`` (the default) the one with the least time counting ``v``'s own frontier and the
        cheapest cell of each incident edge, which keeps fast strategies such as data parallelism
        reachable when a memory-hungry op is fixed.
        """
        node = self.nodes[v]
        K = self.sizes[v]
        cells = node.cell_of(np.arange(len(node.memory_bytes)))
        if self.heuristic == "memory":
            best = int(cells[np.lexsort((node.time_s, node.memory_bytes))[0]])
        else:
            score = np.full(K, np.inf)
            np.minimum.at(score, cells, node.time_s)
            for u in self.adj[v]:
                edge = self.edge(u, v)
                axis = edge.variables.index(v)
                edge_cells = np.unravel_index(edge.cell_of(np.arange(len(edge.time_s))), edge.shape)[axis]
                cheapest = np.full(K, np.inf)
                np.minimum.at(cheapest, edge_cells, edge.time_s)
                score += cheapest
            best = int(np.argmin(score))
        self.constants.append(self.combine([select(node, v, best)], ()))
        for u in list(self.adj[v]):
            self.nodes[u] = self.combine([self.nodes[u], select(self.edge(u, v), v, best)], (u,))
        self.remove(v)
        self.stats.heuristic += 1

    def eliminate_to_path(self, backbone: list[int], tick: Callable[[], None]) -> list[int]:
        """Eliminate until the remaining graph is a simple path; returns it in order."""
        on_backbone = set(backbone)
        while True:
            path = self._as_path()
            if path is not None:
                return path
            v = self._pick(on_backbone, backbone)
            degree = len(self.adj[v])
            if degree == 0:
                self.eliminate_isolated(v)
            elif degree == 1:
                self.eliminate_branch(v)
            elif degree == 2:
                self.eliminate_node(v)
            else:
                self.eliminate_heuristic(v)
            if v in on_backbone:
                on_backbone.discard(v)
                backbone.remove(v)
            tick()

    def _pick(self, on_backbone: set[int], backbone: list[int]) -> int:
        """The next node to eliminate: exact eliminations off the backbone first."""
        off = [v for v in self.adj if v not in on_backbone]
        for degree in (0, 1, 2):
            for v in off:
                if len(self.adj[v]) == degree:
                    return v
        # a backbone node that a remaining edge skips over
        position = {v: i for i, v in enumerate(backbone)}
        for v in backbone:
            if len(self.adj[v]) == 2 and 0 < position[v] < len(backbone) - 1 and self._skipped(v, position):
                return v
        # then any exact elimination: leaves and isolated nodes (backbone ends last), then degree 2
        ends = {backbone[0], backbone[-1]} if backbone else set()
        for degree in (0, 1, 2):
            found = [v for v in self.adj if len(self.adj[v]) == degree]
            if found:
                return min(found, key=lambda x: (x in ends, x))
        candidates = off or list(self.adj)
        return max(candidates, key=lambda x: (len(self.adj[x]), -x))

    def _skipped(self, v: int, position: dict[int, int]) -> bool:
        i = position[v]
        for a, b in self.edges:
            if a in position and b in position:
                lo, hi = sorted((position[a], position[b]))
                if lo < i < hi:
                    return True
        return False

    def _as_path(self) -> list[int] | None:
        """The remaining nodes in path order, if they form a simple path (a lone node counts)."""
        nodes = list(self.adj)
        if len(nodes) <= 1:
            return nodes
        if len(self.edges) != len(nodes) - 1 or any(len(a) > 2 for a in self.adj.values()):
            return None
        ends = [v for v in nodes if len(self.adj[v]) == 1]
        if len(ends) != 2:
            return None
        path = [min(ends)]
        prev = -1
        while len(path) < len(nodes):
            nxt = [u for u in self.adj[path[-1]] if u != prev]
            if not nxt:
                return None
            prev = path[-1]
            path.append(nxt[0])
        return path

    def linear_dp(self, path: list[int], tick: Callable[[], None]) -> Table:
        """Algorithm 3 along ``path``, then the union over the last node's configurations."""
        cumulative = self.nodes[path[0]]
        for prev, v in itertools.pairwise(path):
            cumulative = self.combine([self.nodes[v], cumulative, self.edge(prev, v)], (v,))
            self.stats.ldp_steps += 1
            tick()
        tick()
        return self.combine([cumulative, *self.constants], ())


def _longest_path(n: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """The longest path (in nodes) of the DAG ``u -> v`` (edges go forward in node order)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    pairs = list(edges)
    for u, v in pairs:
        succ[u].append(v)
    try:
        order = topological_order(n, pairs)
    except CycleError:
        raise ValueError("the cost graph has a cycle; FT needs a DAG") from None
    length = np.ones(n, np.int64)
    nxt = np.full(n, -1, np.int64)
    for v in reversed(order):
        for w in succ[v]:
            if length[w] + 1 > length[v]:
                length[v] = length[w] + 1
                nxt[v] = w
    v = int(np.argmax(length))
    path = [v]
    while nxt[path[-1]] >= 0:
        path.append(int(nxt[path[-1]]))
    return path
