"""Tensor layouts over a device mesh and the time to re-schedule a tensor from one layout to another.

FT's edge costs (:mod:`.costs`) are re-scheduling times between the layout a producer's
configuration writes and the one its consumer's configuration reads (:mod:`.configs`).

**Tensor layouts.** A tensor spread over the mesh is described, over the flat device index, as a
list of factors ``(size, label)`` from major to minor, the label being a tensor axis (the factor
splits it), ``R`` (replicated) or ``P`` (partial sums). Adjacent factors with the same label are
merged, so the 1-D split of axis 0 over 16 devices and the ``(4, 4)`` split of axis 0 over both
mesh dimensions are the same layout. The per-device bytes of a layout are
``B / prod(sizes of the split factors)``.

**Re-scheduling** (TensorOpt sec. 4.2) is a shortest path (Dijkstra) from one layout to another
over layouts on the common refinement of the two factor lists, each step one collective over the
groups of devices that differ only in a subset ``S`` of factors with the same label (group size
``f = prod S``, ``s`` = bytes per device before the step, ``alpha``/``beta`` = latency and
bottleneck bandwidth of the group rings, below)::

    all-gather      split -> R      (f - 1) (alpha + s / beta)          cost.all_gather_time_s(f s, f)
    slice           R -> split      0 (local)
    all-to-all      split -> split  (f - 1) (alpha + s / f / beta)      cost.all_gather_time_s(s, f)
    reduce-scatter  P -> split      (f - 1) (alpha + s / f / beta)      cost.reduce_scatter_time_s(s, f)
    all-reduce      P -> R          2 (f - 1) (alpha + s / f / beta)    cost.all_reduce_time_s(s, f)

Moves keep every axis's block index readable major first: a collective may take away only an
axis's minor-most factors and may add factors only after the axis's existing ones. When the device
orders of the two layouts conflict -- the best collective path has to hold more bytes per device
than either end does (``(4: channel, 4: sample) -> (16: sample)``), or the two factor lists have no
common refinement (a device count that is not a prime power, meshes ``(3, 4)`` vs ``(4, 3)``; the
collective path then runs to the replicated layout and slices) -- a direct point-to-point
redistribution is priced too and the cheaper one is taken: every device fetches each piece it lacks
from the holder with the fastest route, all transfers at once, in
``max_link_direction(load / bandwidth) + max_device(sum of the latencies of its messages)``.

Collective groups: for a factor subset, all groups run at once, each as a ring in flat-index order;
a ring hop's bandwidth is its route's bottleneck divided by the number of hops (of all the rings)
that cross its most shared link direction; ``beta`` is the slowest hop, ``alpha`` the largest hop
latency (:meth:`placement_rl.sim.network.Network.rings`, the simulator's ring all-reduce being the
one-ring case). Cached per factor subset. Flat device ``i`` is topology device
``topology.device_index(names[i])``; routes come from the topology's shared
:class:`~placement_rl.sim.network.Network`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from placement_rl.sim.cost import CostModel
from placement_rl.sim.network import network
from placement_rl.topology import DeviceTopology

_R = -1  # layout label: replicated
_P = -2  # layout label: partial sums
_SLICE, _ALL_GATHER, _ALL_TO_ALL, _REDUCE_SCATTER, _ALL_REDUCE = range(5)  # re-scheduling steps

_Layout = tuple[tuple[int, int], ...]  # ((size, label), ...) major -> minor over the flat device index
_Group = tuple[tuple[int, int], ...]  # ((stride, size), ...) of the flat-index digits a collective varies

#: how layout changes are priced (see :func:`~placement_rl.search.ft.costs.build_cost_graph`).
RESCHEDULING: tuple[str, ...] = ("collectives", "point_to_point")


def _canon(pairs: Sequence[tuple[int, int]]) -> _Layout:
    """Drop size-1 factors and merge adjacent factors with the same label."""
    out: list[tuple[int, int]] = []
    for size, label in pairs:
        if size == 1:
            continue
        if out and out[-1][1] == label:
            out[-1] = (out[-1][0] * size, label)
        else:
            out.append((size, label))
    return tuple(out)


def _boundaries(layout: _Layout) -> list[int]:
    """Strides of the factors' lower ends (minor first), plus the total."""
    out = [1]
    for size, _ in reversed(layout):
        out.append(out[-1] * size)
    return out


def _refine(layout: _Layout, sizes: Sequence[int]) -> tuple[int, ...]:
    """Labels of ``layout`` on the finer factor list ``sizes`` (major first)."""
    labels = []
    stride = math.prod(sizes)
    own = []
    s = math.prod(size for size, _ in layout)
    for size, label in layout:
        s //= size
        own.append((s, size, label))
    for size in sizes:
        stride //= size
        labels.append(next(lab for st, sz, lab in own if st <= stride < st * sz))
    return tuple(labels)


def _common_refinement(a: _Layout, b: _Layout) -> tuple[int, ...] | None:
    """The coarsest factor list (major first) refining both, or ``None`` when their strides do not nest."""
    points = sorted(set(_boundaries(a)) | set(_boundaries(b)))
    if any(hi % lo for lo, hi in itertools.pairwise(points)):
        return None
    return tuple(hi // lo for lo, hi in reversed(list(itertools.pairwise(points))))


def _split_degree(layout: _Layout) -> int:
    return math.prod(size for size, label in layout if label >= 0)


# ------------------------------------------------------------------------------------ communication
class _Comm:
    """Collective and re-scheduling times over one ordered device set (all caches live here).

    Devices are FT's flat indices: flat device ``i`` is ``names[i]``, topology device ``devices[i]``.
    """

    def __init__(
        self, topology: DeviceTopology, names: Sequence[str], cost: CostModel, rescheduling: str = "collectives"
    ) -> None:
        if rescheduling not in RESCHEDULING:
            raise ValueError(f"rescheduling {rescheduling!r}; expected one of {list(RESCHEDULING)}")
        self.rescheduling = rescheduling
        self.topology = topology
        self.names = list(names)
        self.n = len(names)
        self.cost = cost
        self.network = network(topology)
        self.devices = np.array([topology.device_index(name) for name in self.names], dtype=np.int64)
        self._groups: dict[_Group, tuple[float, float, str]] = {}
        self._paths: dict[tuple[int, int, int], float] = {}
        # (factor sizes, labels, divisibility) -> state -> (split degree, moves); see _moves
        self._move_tables: dict[tuple[object, ...], dict[tuple[int, ...], tuple[int, list[Any]]]] = {}
        self._route_matrices: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._layout_ids: dict[_Layout, int] = {}
        self.layouts: list[_Layout] = []
        self._sigs: dict[tuple[float, tuple[int, ...]], int] = {}
        self._sig_list: list[tuple[float, tuple[int, ...]]] = []

    # ---- interning
    def layout_id(self, layout: _Layout) -> int:
        found = self._layout_ids.get(layout)
        if found is None:
            found = self._layout_ids[layout] = len(self.layouts)
            self.layouts.append(layout)
        return found

    def signature(self, sig: int) -> tuple[float, tuple[int, ...]]:
        """``(bytes, shape)`` of tensor signature ``sig``."""
        return self._sig_list[sig]

    def sig_id(self, num_bytes: float, shape: tuple[int, ...]) -> int:
        key = (float(num_bytes), tuple(shape))
        found = self._sigs.get(key)
        if found is None:
            found = self._sigs[key] = len(self._sig_list)
            self._sig_list.append(key)
        return found

    # ---- routes and groups
    def group(self, digits: _Group) -> tuple[float, float, str]:
        """(bandwidth, latency, link kind) of concurrent rings over the devices that differ in ``digits``."""
        found = self._groups.get(digits)
        if found is not None:
            return found
        key = _merge_digits(digits)
        found = self._groups.get(key)
        if found is not None:
            self._groups[digits] = found
            return found
        t = np.arange(self.n)
        varying = np.zeros(self.n, np.int64)
        for stride, size in key:
            varying += (t // stride) % size * stride
        f = math.prod(size for _, size in key)
        rings = self.network.rings(self.devices[t[np.lexsort((t, t - varying))]].reshape(-1, f).tolist())
        found = self._groups[key] = self._groups[digits] = (rings.bandwidth_bytes_per_s, rings.latency_s, rings.kind)
        return found

    # ---- re-scheduling
    def path_time_s(self, src: int, dst: int, sig: int) -> float:
        """Shortest re-scheduling time from layout id ``src`` to ``dst`` for tensor signature ``sig``."""
        if src == dst:
            return 0.0
        key = (src, dst, sig)
        found = self._paths.get(key)
        if found is None:
            num_bytes, shape = self._sig_list[sig]
            found = self._paths[key] = self._shortest(self.layouts[src], self.layouts[dst], num_bytes, shape)
        return found

    def _shortest(self, src: _Layout, dst: _Layout, num_bytes: float, shape: tuple[int, ...]) -> float:
        if num_bytes <= 0:
            return 0.0
        if self.rescheduling == "point_to_point":
            return self._p2p_time_s(src, dst, num_bytes)
        sizes = _common_refinement(src, dst)
        if sizes is not None:
            time_s, peak_bytes = self._dijkstra(sizes, _refine(src, sizes), _refine(dst, sizes), num_bytes, shape)
            ends_bytes = num_bytes / min(_split_degree(src), _split_degree(dst))
            if peak_bytes <= ends_bytes * (1 + 1e-9):
                return time_s
            # The collectives had to gather more than either end holds: the device orders conflict.
            return min(time_s, self._p2p_time_s(src, dst, num_bytes))
        # No common refinement: gather inside the source's factors (then slice), or redistribute directly.
        sizes = tuple(size for size, _ in src)
        time_s, _ = self._dijkstra(sizes, _refine(src, sizes), (_R,) * len(sizes), num_bytes, shape)
        return min(time_s, self._p2p_time_s(src, dst, num_bytes))

    def _dijkstra(
        self,
        sizes: tuple[int, ...],
        start: tuple[int, ...],
        goal: tuple[int, ...],
        num_bytes: float,
        shape: tuple[int, ...],
    ) -> tuple[float, float]:
        """Dijkstra over label tuples on factor list ``sizes``, each step one collective (module docstring).

        Among equally fast paths the one with the smallest peak per-device bytes wins.

        Returns:
            (time, peak per-device bytes along the chosen path); ``(inf, inf)`` if the goal is unreachable.
        """
        cost = self.cost
        targets = tuple(sorted({lab for lab in (*start, *goal) if lab >= 0} | {_R}))
        goal_degree: dict[int, int] = {}
        for size, lab in zip(sizes, goal, strict=True):
            if lab >= 0:
                goal_degree[lab] = goal_degree.get(lab, 1) * size
        # Degrees are divisors of n, so gcd(extent, n) tells which splits of an axis the tensor allows.
        extents = tuple(math.gcd(shape[a], self.n) if a >= 0 else 0 for a in targets)
        table = self._move_tables.get((sizes, targets, extents))
        if table is None:
            table = self._move_tables[sizes, targets, extents] = {}
        entry = table.get(start) or self._moves(table, sizes, start, targets, extents)
        dist = {start: 0.0}
        peaks = {start: num_bytes / entry[0]}
        heap = [(0.0, num_bytes / entry[0], start)]
        while heap:
            d, peak, state = heapq.heappop(heap)
            if state == goal:
                return d, peak
            if d != dist[state] or peak != peaks[state]:
                continue
            split, moves = table.get(state) or self._moves(table, sizes, state, targets, extents)
            local = num_bytes / split
            for nstate, kind, f, bw, lat, link, nsplit, goal_only in moves:
                if goal_only and goal_degree.get(goal_only[0], 1) % goal_only[1]:
                    continue  # only a goal that splits the axis this way may (its extent does not allow it)
                if kind == _SLICE:
                    nd = d
                elif kind == _ALL_GATHER:
                    nd = d + cost.all_gather_time_s(local * f, f, bw, lat)
                elif kind == _ALL_TO_ALL:
                    nd = d + cost.all_gather_time_s(local, f, bw, lat)
                elif kind == _REDUCE_SCATTER:
                    nd = d + cost.reduce_scatter_time_s(local, f, bw, lat)
                else:
                    nd = d + cost.all_reduce_time_s(local, f, bw, lat, link)
                old = dist.get(nstate, math.inf)
                if nd > old:
                    continue
                npeak = max(num_bytes / nsplit, peak)
                if nd == old and npeak >= peaks[nstate]:
                    continue
                dist[nstate] = nd
                peaks[nstate] = npeak
                heapq.heappush(heap, (nd, npeak, nstate))
        return math.inf, math.inf

    def _moves(
        self,
        table: dict[tuple[int, ...], tuple[int, list[Any]]],
        sizes: tuple[int, ...],
        state: tuple[int, ...],
        targets: tuple[int, ...],
        extents: tuple[int, ...],
    ) -> tuple[int, list[Any]]:
        """Split degree of ``state`` and its one-collective moves, stored in ``table`` (searches share states).

        A move is ``(next state, kind, group size, bandwidth, latency, link kind, next split degree,
        goal_only)``. An axis's block index reads its factors major first, so a move may only take an
        axis's *minor-most* factors away (gather, all-to-all) and may only add factors *after* the
        axis's existing ones (slice, all-to-all, reduce-scatter); other relabellings would claim
        blocks the devices do not hold. A move that splits an axis by a degree not dividing its extent
        (``extents[i]`` = gcd(extent, n) of ``targets[i]``) carries ``goal_only = (axis, degree)``:
        it is allowed only when the goal splits that axis by a multiple of it.
        """
        extent_of = dict(zip(targets, extents, strict=True))
        strides = []
        s = self.n
        for size in sizes:
            s //= size
            strides.append(s)
        last: dict[int, int] = {}  # last position of each label
        degree_of: dict[int, int] = {}
        for i, (size, lab) in enumerate(zip(sizes, state, strict=True)):
            last[lab] = i
            degree_of[lab] = degree_of.get(lab, 1) * size
        split = math.prod(g for lab, g in degree_of.items() if lab >= 0)
        moves = []
        for label in sorted(degree_of):
            positions = [i for i, lab in enumerate(state) if lab == label]
            if label >= 0:
                subsets = [tuple(positions[-r:]) for r in range(1, len(positions) + 1)]
            else:
                subsets = [c for r in range(1, len(positions) + 1) for c in itertools.combinations(positions, r)]
            for subset in subsets:
                f = math.prod(sizes[i] for i in subset)
                if label == _R:
                    bw, lat, link = math.inf, 0.0, ""
                else:
                    bw, lat, link = self.group(tuple((strides[i], sizes[i]) for i in subset))
                kept = split // f if label >= 0 else split
                for new in targets:
                    if new == label or (new >= 0 and last.get(new, -1) > subset[0]):
                        continue
                    goal_only: tuple[int, int] | None = None
                    if new >= 0:
                        degree = degree_of.get(new, 1) * f
                        if extent_of[new] % degree:
                            goal_only = (new, degree)
                    if label == _R:
                        kind = _SLICE
                    elif label == _P:
                        kind = _ALL_REDUCE if new == _R else _REDUCE_SCATTER
                    else:
                        kind = _ALL_GATHER if new == _R else _ALL_TO_ALL
                    nxt = list(state)
                    for i in subset:
                        nxt[i] = new
                    moves.append((tuple(nxt), kind, f, bw, lat, link, kept * f if new >= 0 else kept, goal_only))
        found = table[state] = (split, moves)
        return found

    def _route_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(n, n) route bandwidth and latency between flat devices; for route ``a * n + b``, the link
        directions it crosses are ``dirs[ptr[a * n + b] : ptr[a * n + b + 1]]`` (built once)."""
        if self._route_matrices is None:
            self._route_matrices = self.network.submatrices(self.devices)
        return self._route_matrices

    def _p2p_time_s(self, src: _Layout, dst: _Layout, num_bytes: float) -> float:
        """Direct redistribution: every device fetches each piece it lacks from its nearest holder.

        All transfers run at once: the time is the most loaded link direction's ``load / bandwidth``
        plus the largest sum of route latencies any device waits for.
        """
        n = self.n
        bw, lat, ptr, dirs = self._route_arrays()
        axes = sorted({lab for _, lab in (*src, *dst) if lab >= 0})
        src_lo, src_hi, src_part = _boxes(src, axes, n)
        dst_lo, dst_hi, _ = _boxes(dst, axes, n)
        span = np.minimum(src_hi[:, None, :], dst_hi[None, :, :]) - np.maximum(src_lo[:, None, :], dst_lo[None, :, :])
        size = np.prod(np.clip(span, 0.0, None), axis=2) * num_bytes  # (n senders, n receivers)
        _, piece = np.unique(np.concatenate([src_lo, src_part[:, None]], axis=1), axis=0, return_inverse=True)
        piece = piece.reshape(-1)
        # For every receiver, senders sorted by (piece, transfer time): the first of each piece is its holder.
        seconds = np.where(size > 0, lat + size / bw, 0.0)
        order = np.lexsort((seconds.T, np.broadcast_to(piece, (n, n))))  # (n receivers, n senders)
        first = np.searchsorted(piece[order[0]], np.arange(int(piece.max()) + 1))
        holder = order[:, first]  # (n receivers, pieces)
        receiver = np.arange(n)[:, None]
        sent = size[holder, receiver]
        sent[piece[holder] == piece[receiver]] = 0.0  # the receiver holds that piece itself
        pairs = (holder * n + receiver).reshape(-1)
        moved = sent.reshape(-1) > 0
        pairs, moved_bytes = pairs[moved], sent.reshape(-1)[moved]
        lengths = ptr[pairs + 1] - ptr[pairs]
        hops = np.repeat(ptr[pairs] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        load = np.bincount(dirs[hops], np.repeat(moved_bytes, lengths), minlength=2 * len(self.topology.links))
        wait = np.where(sent > 0, lat[holder, receiver], 0.0).sum(axis=1)
        links = self.topology.links
        busy = max(
            (
                load[d]
                / self.cost.effective_bandwidth(
                    f"p2p/{links[d // 2].kind}", links[d // 2].bandwidth_bytes_per_s, float(load[d])
                )
                for d in np.flatnonzero(load).tolist()
            ),
            default=0.0,
        )
        return busy + float(wait.max())


class _CrossComm:
    """Re-scheduling from layouts over one mesh (``src``) to layouts over another (``dst``): two device
    meshes of one FT run (a mesh per stage), which may share devices.

    No collective spans two meshes, so every change is the direct redistribution of
    :meth:`_Comm._p2p_time_s`: each ``dst`` device fetches every piece it lacks from the ``src`` device
    holding it with the fastest route (a device of both meshes that holds the piece needs no
    transfer), all transfers at once. Layout ids are those of ``src`` and ``dst``.
    """

    def __init__(self, src: _Comm, dst: _Comm) -> None:
        self.src = src
        self.dst = dst
        union = list(dict.fromkeys([*src.devices.tolist(), *dst.devices.tolist()]))
        position = {d: i for i, d in enumerate(union)}
        self.n = len(union)
        self.src_pos = np.array([position[d] for d in src.devices.tolist()], dtype=np.int64)
        self.dst_pos = np.array([position[d] for d in dst.devices.tolist()], dtype=np.int64)
        self._routes = src.network.submatrices(np.array(union, dtype=np.int64))
        self._paths: dict[tuple[int, int, float], float] = {}

    def path_time_s(self, src: int, dst: int, num_bytes: float) -> float:
        """Time to move a tensor of ``num_bytes`` from ``src``'s layout id ``src`` to ``dst``'s layout id ``dst``."""
        key = (src, dst, float(num_bytes))
        found = self._paths.get(key)
        if found is None:
            found = self._paths[key] = (
                self._time_s(self.src.layouts[src], self.dst.layouts[dst], num_bytes) if num_bytes > 0 else 0.0
            )
        return found

    def _time_s(self, src: _Layout, dst: _Layout, num_bytes: float) -> float:
        bw, lat, ptr, dirs = self._routes
        n = self.n
        axes = sorted({lab for _, lab in (*src, *dst) if lab >= 0})
        src_lo, src_hi, src_part = _boxes(src, axes, self.src.n)
        dst_lo, dst_hi, _ = _boxes(dst, axes, self.dst.n)
        span = np.minimum(src_hi[:, None, :], dst_hi[None, :, :]) - np.maximum(src_lo[:, None, :], dst_lo[None, :, :])
        size = np.prod(np.clip(span, 0.0, None), axis=2) * num_bytes  # (src senders, dst receivers)
        _, piece = np.unique(np.concatenate([src_lo, src_part[:, None]], axis=1), axis=0, return_inverse=True)
        piece = piece.reshape(-1)
        sender, receiver = self.src_pos, self.dst_pos
        seconds = np.where(
            size > 0, lat[sender[:, None], receiver[None, :]] + size / bw[sender[:, None], receiver[None, :]], 0.0
        )
        # For every receiver, senders sorted by (piece, transfer time): the first of each piece is its holder.
        order = np.lexsort((seconds.T, np.broadcast_to(piece, (len(receiver), len(sender)))))
        first = np.searchsorted(piece[order[0]], np.arange(int(piece.max()) + 1))
        holder = order[:, first]  # (receivers, pieces): index into src's devices
        column = np.arange(len(receiver))[:, None]
        sent = size[holder, column]
        # a receiver that is itself a src device already holds that device's piece
        own = {int(p): i for i, p in enumerate(sender.tolist())}
        held = np.array([piece[own[int(r)]] if int(r) in own else -1 for r in receiver.tolist()], dtype=np.int64)
        sent[piece[holder] == held[:, None]] = 0.0
        pairs = (sender[holder] * n + receiver[:, None]).reshape(-1)
        moved = sent.reshape(-1) > 0
        pairs, moved_bytes = pairs[moved], sent.reshape(-1)[moved]
        lengths = ptr[pairs + 1] - ptr[pairs]
        hops = np.repeat(ptr[pairs] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        links = self.src.topology.links
        load = np.bincount(dirs[hops], np.repeat(moved_bytes, lengths), minlength=2 * len(links))
        wait = np.where(sent > 0, lat[sender[holder], receiver[:, None]], 0.0).sum(axis=1)
        busy = max(
            (
                load[d]
                / self.src.cost.effective_bandwidth(
                    f"p2p/{links[d // 2].kind}", links[d // 2].bandwidth_bytes_per_s, float(load[d])
                )
                for d in np.flatnonzero(load).tolist()
            ),
            default=0.0,
        )
        return busy + float(wait.max(initial=0.0))


def _merge_digits(digits: _Group) -> _Group:
    """Sort digit groups major first and merge adjacent ones (same device groups, one cache key)."""
    out: list[tuple[int, int]] = []
    for stride, size in sorted(digits, reverse=True):
        if out and out[-1][0] == stride * size:
            out[-1] = (stride, out[-1][1] * size)
        else:
            out.append((stride, size))
    return tuple(out)


def _boxes(layout: _Layout, axes: Sequence[int], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per flat device, the block it holds: ``(lo, hi)`` of shape ``(n, len(axes))`` as fractions of each
    axis, and ``(n,)`` its partial-sum index."""
    t = np.arange(n)
    index = np.zeros((n, len(axes)))
    count = np.ones(len(axes))
    part = np.zeros(n, np.int64)
    stride = n
    for size, label in layout:
        stride //= size
        digit = t // stride % size
        if label >= 0:
            a = axes.index(label)
            index[:, a] = index[:, a] * size + digit
            count[a] *= size
        elif label == _P:
            part = part * size + digit
    return index / count, (index + 1) / count, part


__all__ = ["RESCHEDULING"]
