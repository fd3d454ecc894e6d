"""TensorOpt's per-op configurations and additive costs: the input of the FT frontier algorithm.

TensorOpt (sec. 2.1) gives every op ``v`` a set of ``K_v`` parallel configurations and every edge a
cost that depends on the configurations of its two ends; a strategy's memory and time are *sums*
(Eq. 1-3). :func:`build_cost_graph` computes those costs as a :class:`CostGraph`.

**Configurations** (:func:`op_configs`). Every op runs SPMD on all ``n`` devices arranged as a
device mesh (Mesh-TensorFlow): the 1-D mesh ``(n,)`` and every 2-D mesh ``(a, n / a)``
(:func:`mesh_shapes`). Each mesh dimension either splits one of the op's parallel dimensions (its
size divides the dimension; two mesh dimensions may split the same one when their product divides
it) or replicates (``-1`` in TensorOpt's tensor map). Device ``(i, j)`` of an ``(a, b)`` mesh is
``devices[i * b + j]`` (row-major, the flat device index). Such a configuration is an
:class:`~placement_rl.plan.OpConfig` with ``degrees[d]`` = the product of the mesh sizes splitting
``d``; its device list is ordered so that task ``t`` is partition ``t // R``, replica ``t % R``
(partitions row-major over ``op.parallel_dims``; along a dimension split by two mesh dimensions the
index is mesh-major; replicas row-major over the replicating mesh dimensions). Sync is the ring
``all_reduce``.

**Tensor layouts.** A tensor spread over the mesh is described, over the flat device index, as a
list of factors ``(size, label)`` from major to minor, the label being a tensor axis (the factor
splits it), ``R`` (replicated) or ``P`` (partial sums). Adjacent factors with the same label are
merged, so the 1-D split of axis 0 over 16 devices and the ``(4, 4)`` split of axis 0 over both
mesh dimensions are the same layout. The per-device bytes of a layout are
``B / prod(sizes of the split factors)``.

For a tensor ``u -> v`` of ``B`` bytes (rules mirrored from the simulator's ``_build_edges`` /
``_consumer_box``):

* producer layout: a mesh dimension splitting a non-reduction dimension splits the tensor at
  ``dim.axis``; one splitting a reduction dimension yields partial sums ``P``; others ``R``;
* consumer layout (forward): when the tensor's rank equals the consumer's output rank and both ops
  have the same plain sample axis, the consumer's sample and attribute splits select the slice at
  ``dim.axis``; otherwise, if the producer has a plain sample axis ``s``, the consumer's sample split
  selects the slice at ``s``; every other split (parameter splits, reductions) reads the whole axis;
* gradient (backward): the consumer's input gradient has the consumer layout, except that its
  splits that do not slice the input (parameter splits, ...) hold *partial* gradients; the producer
  needs its output gradient in its own layout with ``P`` replaced by ``R``. Ops none of whose
  ancestors (themselves included) have parameters need no gradient: their ``r_b`` is 0.

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

**Node costs** of op ``v`` under configuration ``c`` with ``P`` partitions (Eq. 1)::

    time_s   = max_{device d} sum(cost.task_times_s(op, 1 / P, task_output_shape, param_bytes // shards, d))
             + cost.all_reduce_time_s(param_bytes / shards, f_sync, beta, alpha, kind) / k
    memory   = param_bytes / shards * cost.state_bytes_per_param_byte / k
             + bytes_written / P                            (temporary / backward workspace)
             + output_bytes / P_out                         (only for ops without consumers)

``shards`` is the product of the parameter-kind degrees; ``f_sync = n / shards`` devices hold each
shard. ``k`` ops share a ``param_key`` (an unrolled RNN: one parameter set, stored and synchronized
once, as in the simulator). Each of them carries ``1/k`` of the state and of the synchronization
under its *own* configuration: the sum is exact when the ``k`` ops agree, and when they do not
(where the simulator synchronizes the whole set over every device that runs any of them) it
still charges the replicated ones. Charging only the first op would let a strategy split that
op's parameters, pay no synchronization, and run the other ``k - 1`` steps data parallel.
``P_out`` is the product of the non-reduction degrees.

**Edge costs** (Eq. 2, with TensorOpt's tensor reuse, sec. 4.2). With ``r_f`` = path(producer ->
consumer layout), ``r_b`` = path(consumer gradient -> producer gradient layout), ``r_rebuild`` =
path(consumer layout -> producer gradient layout), ``before`` / ``after`` = per-device bytes of the
producer / consumer layouts, three options ``r``::

    r = 0 keep both copies     memory = before / k + after   time = r_f + r_b
    r = 1 keep the before copy memory = before / k           time = 2 r_f + r_b        (rebuild "after")
    r = 2 keep the after copy  memory = after                time = r_f + r_rebuild + r_b

When the forward layouts are equal there is one copy and no forward re-scheduling: option 0 is
``(before / k, r_b)`` (``r_b`` is non-zero when the consumer's gradient is partial, e.g. Megatron's
column-parallel input) and options 1 and 2 are ``inf`` in both arrays. ``k`` is the number of
consumers of the producer's output: its one buffer is charged ``1 / k`` to each of their edges
(exact when all of them keep it). Parallel tensors between the same pair of ops are merged into
one edge by adding their arrays option-wise (option ``r`` of the merged edge uses option ``r`` on
every tensor; ``inf`` stays ``inf``).

Everything here is additive by construction: a strategy (a config ``s_v`` per op and an option
``r_e`` per edge) costs ``sum_v node[v][s_v] + sum_e edge[e][s_u, s_v, r_e]`` in memory and time.
The simulator overlaps computation and communication; these sums do not.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from placement_rl.graph import Op, OpGraph, ParallelDim
from placement_rl.plan import OpConfig
from placement_rl.sim.cost import CostModel
from placement_rl.sim.network import network
from placement_rl.topology import DeviceTopology

_R = -1  # layout label: replicated
_P = -2  # layout label: partial sums
_NUM_OPTIONS = 3  # tensor-reuse options: keep both, keep before, keep after
_SLICE, _ALL_GATHER, _ALL_TO_ALL, _REDUCE_SCATTER, _ALL_REDUCE = range(5)  # re-scheduling steps

_Layout = tuple[tuple[int, int], ...]  # ((size, label), ...) major -> minor over the flat device index
_DimsKey = tuple[tuple[str, str, int, int, bool], ...]
_Group = tuple[tuple[int, int], ...]  # ((stride, size), ...) of the flat-index digits a collective varies


@dataclass(frozen=True)
class CostGraph:
    """FT's additive cost graph (TensorOpt sec. 2.1, Eq. 1-3). Node ``v`` has ``K_v`` configurations.

    Arrays are read-only and may be shared between edges with identical costs.

    Attributes:
        num_configs: ``(n,)`` int64, ``K_v`` per op (graph op order).
        node_memory_bytes: ``n`` float64 arrays of shape ``(K_v,)``: per-device memory of op ``v``
            under config ``s`` (parameter state shard + temporary tensors).
        node_time_s: ``n`` float64 arrays ``(K_v,)``: compute (forward + backward) + gradient
            synchronization time.
        edges: ``(u, v)`` op-index pairs, one per graph tensor after merging parallel tensors between
            the same pair of ops (costs summed option-wise), ``u`` before ``v`` in topological order,
            in order of first appearance in ``graph.tensors``.
        edge_memory_bytes: float64 arrays of shape ``(K_u, K_v, 3)``: per-device memory of the kept
            copies under tensor-reuse option 0 (keep both), 1 (keep the producer's copy) or 2 (keep
            the consumer's copy).
        edge_time_s: same shape: re-scheduling time (forward and backward, including reconstruction
            when a copy is not kept). ``inf`` in both arrays for an option that does not apply.
    """

    num_configs: np.ndarray
    node_memory_bytes: list[np.ndarray]
    node_time_s: list[np.ndarray]
    edges: tuple[tuple[int, int], ...]
    edge_memory_bytes: list[np.ndarray]
    edge_time_s: list[np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.num_configs)
        if not (len(self.node_memory_bytes) == len(self.node_time_s) == n):
            raise ValueError(
                f"CostGraph: {n} ops but {len(self.node_memory_bytes)} / {len(self.node_time_s)} node arrays"
            )
        if not (len(self.edge_memory_bytes) == len(self.edge_time_s) == len(self.edges)):
            raise ValueError(f"CostGraph: {len(self.edges)} edges but {len(self.edge_memory_bytes)} edge arrays")
        for v, k in enumerate(self.num_configs):
            if self.node_memory_bytes[v].shape != (k,) or self.node_time_s[v].shape != (k,):
                raise ValueError(f"CostGraph: node {v} arrays do not have shape ({k},)")
        for e, (u, v) in enumerate(self.edges):
            shape = (self.num_configs[u], self.num_configs[v], _NUM_OPTIONS)
            if self.edge_memory_bytes[e].shape != shape or self.edge_time_s[e].shape != shape:
                raise ValueError(f"CostGraph: edge {e} ({u}, {v}) arrays do not have shape {shape}")


#: how layout changes are priced (see :func:`build_cost_graph`).
RESCHEDULING: tuple[str, ...] = ("collectives", "point_to_point")


# ------------------------------------------------------------------------------------ configurations
def mesh_shapes(num_devices: int) -> list[tuple[int, ...]]:
    """The device meshes TensorOpt considers for ``num_devices`` devices.

    Returns:
        The 1-D mesh ``(n,)`` then every 2-D mesh ``(a, n // a)`` with ``1 < a < n`` dividing ``n``,
        ``a`` increasing.

    Raises:
        ValueError: if ``num_devices`` is not a positive integer.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or num_devices < 1:
        raise ValueError(f"num_devices = {num_devices!r}; expected a positive integer")
    n = int(num_devices)
    return [(n,)] + [(a, n // a) for a in range(2, n) if n % a == 0]


@dataclass(frozen=True)
class _Candidate:
    """One mesh configuration of an op, independent of device names.

    Attributes:
        mesh: the mesh shape.
        assign: per mesh dimension, the index in ``op.parallel_dims`` it splits, or -1 (replicate).
        perm: task ``t`` of the OpConfig runs on flat device index ``perm[t]``.
        degrees: ``(dim name, degree)`` pairs with degree > 1, sorted by name (OpConfig's form).
    """

    mesh: tuple[int, ...]
    assign: tuple[int, ...]
    perm: tuple[int, ...]
    degrees: tuple[tuple[str, int], ...]

    def factors(self) -> tuple[tuple[int, int, int], ...]:
        """``(stride, size, dim index or -1)`` per mesh dimension of size > 1, major first."""
        out = []
        stride = math.prod(self.mesh)
        for size, dim in zip(self.mesh, self.assign):
            stride //= size
            if size > 1:
                out.append((stride, size, dim))
        return tuple(out)


def _dims_key(op: Op) -> _DimsKey:
    return tuple((d.name, d.kind, d.axis, d.size, d.reduction) for d in op.parallel_dims)


def _check_meshes(meshes: Sequence[Sequence[int]] | None, n: int) -> tuple[tuple[int, ...], ...]:
    if meshes is None:
        return tuple(mesh_shapes(n))
    out = []
    for mesh in meshes:
        shape = tuple(int(m) for m in mesh)
        if not shape or any(m < 1 for m in shape) or math.prod(shape) != n:
            raise ValueError(f"mesh {tuple(mesh)!r}: expected positive sizes whose product is the {n} device(s)")
        out.append(shape)
    if not out:
        raise ValueError("meshes is empty; expected at least one mesh shape")
    return tuple(out)


@lru_cache(maxsize=4096)
def _candidates(dims_key: _DimsKey, n: int, meshes: tuple[tuple[int, ...], ...]) -> tuple[_Candidate, ...]:
    """The deduplicated, ordered configurations of an op with parallel dims ``dims_key`` (see :func:`op_configs`)."""
    dims = [ParallelDim(name, kind, axis, size, red) for name, kind, axis, size, red in dims_key]  # type: ignore[arg-type]
    sample = next((k for k, d in enumerate(dims) if d.kind == "sample"), None)
    first: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((n,), (-1,))]
    if sample is not None and dims[sample].size % n == 0 and n > 1:
        first.append(((n,), (sample,)))
    rest = []
    for mesh in meshes:
        choices = [[-1] + [k for k, d in enumerate(dims) if m > 1 and d.size % m == 0] for m in mesh]
        for assign in itertools.product(*choices):
            rest.append((mesh, tuple(assign)))
    seen: set[tuple[tuple[int, ...], tuple[tuple[str, int], ...]]] = set()
    out = []
    for mesh, assign in first + rest:
        degree = [1] * len(dims)
        for m, k in zip(mesh, assign):
            if k >= 0:
                degree[k] *= m
        if any(dims[k].size % degree[k] for k in range(len(dims))):
            continue
        perm = _permutation(mesh, assign, degree)
        degrees = tuple(sorted((dims[k].name, degree[k]) for k in range(len(dims)) if degree[k] > 1))
        if (perm, degrees) in seen:
            continue
        seen.add((perm, degrees))
        out.append(_Candidate(mesh, assign, perm, degrees))
    return tuple(out)


def _permutation(mesh: tuple[int, ...], assign: tuple[int, ...], degree: list[int]) -> tuple[int, ...]:
    """Flat device index of each OpConfig task (partition-major over split dims in op order, then replica)."""
    n = math.prod(mesh)
    coords = np.array(np.unravel_index(np.arange(n), mesh)).reshape(len(mesh), n)
    partition = np.zeros(n, np.int64)
    for k, deg in enumerate(degree):
        if deg > 1:
            index = np.zeros(n, np.int64)
            for axis, (m, a) in enumerate(zip(mesh, assign)):
                if a == k:
                    index = index * m + coords[axis]
            partition = partition * deg + index
    replica = np.zeros(n, np.int64)
    replicas = 1
    for axis, (m, a) in enumerate(zip(mesh, assign)):
        if a < 0:
            replica = replica * m + coords[axis]
            replicas *= m
    task = partition * replicas + replica
    perm = np.empty(n, np.int64)
    perm[task] = np.arange(n)
    return tuple(perm.tolist())


def op_configs(
    op: Op,
    devices: Sequence[str],
    *,
    meshes: Sequence[Sequence[int]] | None = None,
    max_configs: int | None = None,
) -> list[OpConfig]:
    """TensorOpt's configurations of one op over exactly ``devices`` (see the module docstring).

    Order (deterministic): full replication first, then pure data parallelism (the 1-D mesh splitting
    the op's sample dimension, when ``len(devices)`` divides it), then every other configuration
    mesh by mesh (``meshes`` order, default :func:`mesh_shapes`), for each mesh the assignments in
    lexicographic order of (mesh dim 0's choice, mesh dim 1's choice, ...), each choice running
    through ``[replicate, op.parallel_dims in order]``. A configuration equal (as an OpConfig) to an
    earlier one is dropped. ``max_configs`` keeps the first ones, so any cap >= 2 keeps replication
    and data parallelism.

    Args:
        op: the op.
        devices: the device names, in mesh (row-major) order; every configuration uses all of them.
        meshes: mesh shapes whose sizes multiply to ``len(devices)`` (default :func:`mesh_shapes`).
        max_configs: keep at most this many (>= 1); ``None`` keeps all.

    Raises:
        ValueError: for no device, repeated devices, a bad mesh or ``max_configs < 1``.
    """
    names = _check_names(devices)
    return [_to_config(c, names) for c in _op_candidates(op, len(names), meshes, max_configs)]


def _op_candidates(
    op: Op, n: int, meshes: Sequence[Sequence[int]] | None, max_configs: int | None
) -> tuple[_Candidate, ...]:
    if max_configs is not None and (
        isinstance(max_configs, bool) or not isinstance(max_configs, int) or max_configs < 1
    ):
        raise ValueError(f"max_configs = {max_configs!r}; expected a positive integer or None")
    found = _candidates(_dims_key(op), n, _check_meshes(meshes, n))
    return found if max_configs is None else found[:max_configs]


def _to_config(c: _Candidate, names: Sequence[str]) -> OpConfig:
    return OpConfig(tuple(names[t] for t in c.perm), c.degrees, "all_reduce")


def _check_names(devices: Sequence[str]) -> list[str]:
    names = [devices] if isinstance(devices, str) else list(devices)
    if not names:
        raise ValueError("0 devices given; expected at least one device name")
    if len(set(names)) != len(names):
        dup = next(d for d in names if names.count(d) > 1)
        raise ValueError(f"device {dup!r} is listed more than once; expected distinct devices")
    return names


# ------------------------------------------------------------------------------------------ layouts
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
        self._move_tables: dict[tuple[object, ...], dict[tuple[int, ...], tuple[int, list]]] = {}  # type: ignore[type-arg]
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
        for size, lab in zip(sizes, goal):
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
        table: dict[tuple[int, ...], tuple[int, list]],  # type: ignore[type-arg]
        sizes: tuple[int, ...],
        state: tuple[int, ...],
        targets: tuple[int, ...],
        extents: tuple[int, ...],
    ) -> tuple[int, list]:  # type: ignore[type-arg]
        """Split degree of ``state`` and its one-collective moves, stored in ``table`` (searches share states).

        A move is ``(next state, kind, group size, bandwidth, latency, link kind, next split degree,
        goal_only)``. An axis's block index reads its factors major first, so a move may only take an
        axis's *minor-most* factors away (gather, all-to-all) and may only add factors *after* the
        axis's existing ones (slice, all-to-all, reduce-scatter); other relabellings would claim
        blocks the devices do not hold. A move that splits an axis by a degree not dividing its extent
        (``extents[i]`` = gcd(extent, n) of ``targets[i]``) carries ``goal_only = (axis, degree)``:
        it is allowed only when the goal splits that axis by a multiple of it.
        """
        extent_of = dict(zip(targets, extents))
        strides = []
        s = self.n
        for size in sizes:
            s //= size
            strides.append(s)
        last: dict[int, int] = {}  # last position of each label
        degree_of: dict[int, int] = {}
        for i, (size, lab) in enumerate(zip(sizes, state)):
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


# --------------------------------------------------------------------------------------- cost graph
def resolve_devices(topology: DeviceTopology, devices: Sequence[str] | int | None) -> list[str]:
    """The device names in use: ``None`` for all, a count ``n`` for the first ``n``, or names (checked)."""
    all_names = [d.name for d in topology.devices]
    if devices is None:
        return all_names
    if isinstance(devices, (int, np.integer)):
        if isinstance(devices, bool) or not 1 <= devices <= len(all_names):
            raise ValueError(
                f"devices = {devices!r}; expected a device count from 1 to {len(all_names)} (topology {topology.name!r})"
            )
        return all_names[: int(devices)]
    names = _check_names(devices)
    for name in names:
        topology.device(name)  # UnknownNameError (a ValueError) naming the device
    return names


def build_cost_graph(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    *,
    cost_model: CostModel | None = None,
    max_configs: int | None = None,
    rescheduling: str = "collectives",
) -> tuple[CostGraph, list[list[OpConfig]]]:
    """TensorOpt's per-op configurations and additive node and edge costs (module docstring).

    Args:
        graph: the op graph.
        topology: the cluster.
        devices: device names (mesh order), an int ``n`` for the first ``n`` devices of
            ``topology.devices``, or ``None`` for all of them.
        cost_model: compute/communication/memory costs (default ``CostModel()``, the simulator's).
        max_configs: cap on configurations per op (:func:`op_configs`).
        rescheduling: ``collectives`` (TensorOpt: the shortest path over single collectives, with
            the point-to-point redistribution as a fallback) or ``point_to_point`` (every layout
            change is the direct redistribution, which is how the shared simulator moves tensors
            between differently split ops; FT's estimate then agrees with ``simulate`` better).

    Returns:
        ``(cost_graph, configs)`` with ``configs[v][s]`` the OpConfig of op ``v``'s config ``s``: a
        plan of ``{op.name: configs[v][s_v]}`` is valid for :func:`placement_rl.simulate`.

    Raises:
        ValueError: for an unknown or repeated device name, a device count outside
            ``1..len(topology.devices)``, or ``max_configs < 1``.
    """
    names = resolve_devices(topology, devices)
    cost = cost_model or CostModel()
    n = len(names)
    comm = _Comm(topology, names, cost, rescheduling)
    cands = [_op_candidates(op, n, None, max_configs) for op in graph.ops]
    configs = [[_to_config(c, names) for c in cs] for cs in cands]

    node_memory, node_time = _node_costs(graph, topology, names, cost, comm, cands)
    edges, edge_memory, edge_time = _edge_costs(graph, comm, cands)
    cost_graph = CostGraph(
        num_configs=np.array([len(cs) for cs in cands], dtype=np.int64),
        node_memory_bytes=node_memory,
        node_time_s=node_time,
        edges=edges,
        edge_memory_bytes=edge_memory,
        edge_time_s=edge_time,
    )
    return cost_graph, configs


def _node_costs(
    graph: OpGraph,
    topology: DeviceTopology,
    names: Sequence[str],
    cost: CostModel,
    comm: _Comm,
    cands: Sequence[Sequence[_Candidate]],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    specs = sorted(
        {(d.device_type, d.peak_flops, d.memory_bandwidth_bytes_per_s) for d in (topology.device(x) for x in names)}
    )
    # ops sharing a param_key (an unrolled RNN) share one parameter set: each carries 1/k of its
    # state and synchronization under its own configuration, so the sum is exact when all k agree
    sharers: dict[str, int] = {}
    for op in graph.ops:
        if op.param_bytes > 0:
            key = op.param_key or f"\0{op.name}"
            sharers[key] = sharers.get(key, 0) + 1
    has_consumer = [bool(s) for s in graph.successors]
    state_factor = cost.state_bytes_per_param_byte
    memory, time = [], []
    for i, op in enumerate(graph.ops):
        share = 1.0 / sharers[op.param_key or f"\0{op.name}"] if op.param_bytes > 0 else 0.0
        mem = np.empty(len(cands[i]))
        tim = np.empty(len(cands[i]))
        for s, c in enumerate(cands[i]):
            degree = [1] * len(op.parallel_dims)
            for m, k in zip(c.mesh, c.assign):
                if k >= 0:
                    degree[k] *= m
            partitions = math.prod(degree)
            shards = math.prod(g for g, d in zip(degree, op.parallel_dims) if d.kind == "parameter")
            out_parts = math.prod(g for g, d in zip(degree, op.parallel_dims) if not d.reduction)
            out_shape = list(op.output_shapes[0])
            for g, d in zip(degree, op.parallel_dims):
                if not d.reduction:
                    out_shape[d.axis] //= g
            compute = max(
                sum(cost.task_times_s(op, 1.0 / partitions, tuple(out_shape), op.param_bytes // shards, *spec))
                for spec in specs
            )
            sync = 0.0
            m = op.bytes_written / partitions
            if not has_consumer[i]:
                m += op.output_bytes / out_parts
            if share:
                shard_bytes = op.param_bytes / shards
                m += shard_bytes * state_factor * share
                replicas = tuple(
                    (stride, size)
                    for stride, size, k in c.factors()
                    if k < 0 or op.parallel_dims[k].kind != "parameter"
                )
                if replicas:
                    bw, lat, kind = comm.group(replicas)
                    sync = cost.all_reduce_time_s(shard_bytes, len(names) // shards, bw, lat, kind) * share
            mem[s] = m
            tim[s] = compute + sync
        mem.setflags(write=False)
        tim.setflags(write=False)
        memory.append(mem)
        time.append(tim)
    return memory, time


def _producer_label(dims: tuple[ParallelDim, ...], box: bool) -> Callable[[int], int]:
    """Label of a mesh factor splitting ``dims[k]`` (``k = -1``: replicating) in the producer's output."""

    def label(k: int) -> int:
        if k < 0 or not box:
            return _R
        return _P if dims[k].reduction else dims[k].axis

    return label


def _consumer_label(dims: tuple[ParallelDim, ...], mode: tuple[str, int]) -> Callable[[int], int]:
    """Label of a mesh factor splitting ``dims[k]`` in the input the consumer reads (forward)."""

    def label(k: int) -> int:
        if k < 0:
            return _R
        d = dims[k]
        if mode[0] == "same" and not d.reduction and d.kind != "parameter":
            return d.axis
        if mode[0] == "sample" and d.kind == "sample":
            return mode[1]
        return _R

    return label


def _layout_ids(comm: _Comm, cands: Sequence[_Candidate], label: Callable[[int], int]) -> np.ndarray:
    """(K,) layout ids of a tensor under each candidate, ``label(dim index or -1)`` giving each factor's label."""
    return np.array(
        [comm.layout_id(_canon([(size, label(k)) for _, size, k in c.factors()])) for c in cands], dtype=np.int64
    )


def _edge_costs(
    graph: OpGraph, comm: _Comm, cands: Sequence[Sequence[_Candidate]]
) -> tuple[tuple[tuple[int, int], ...], list[np.ndarray], list[np.ndarray]]:
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    needs_grad = [False] * len(ops)
    for i, op in enumerate(ops):
        needs_grad[i] = op.param_bytes > 0 or any(needs_grad[p] for p in graph.predecessors[i])
    readers: dict[tuple[str, int], int] = {}
    for t in graph.tensors:
        readers[t.src, t.src_output] = readers.get((t.src, t.src_output), 0) + 1

    layout_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
    edge_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
    merged: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}
    for t in graph.tensors:
        u, v = index[t.src], index[t.dst]
        src, dst = ops[u], ops[v]
        box = t.src_output == 0 or len(src.output_shapes[t.src_output]) == len(src.output_shapes[0])
        s_src, s_dst = src.plain_sample_axis, dst.plain_sample_axis
        if box and len(t.shape) == len(dst.output_shapes[0]) and s_src == s_dst and s_dst >= 0:
            mode: tuple[str, int] = ("same", -1)
        elif box and s_src >= 0:
            mode = ("sample", s_src)
        else:
            mode = ("whole", -1)

        pkey = ("producer", _dims_key(src), len(cands[u]), box)
        if pkey not in layout_cache:
            fwd = _producer_label(src.parallel_dims, box)
            layout_cache[pkey] = (
                _layout_ids(comm, cands[u], fwd),
                _layout_ids(comm, cands[u], lambda k, f=fwd: _R if f(k) == _P else f(k)),
            )
        ckey = ("consumer", _dims_key(dst), len(cands[v]), mode)
        if ckey not in layout_cache:
            need = _consumer_label(dst.parallel_dims, mode)
            layout_cache[ckey] = (
                _layout_ids(comm, cands[v], need),
                _layout_ids(comm, cands[v], lambda k, f=need: _R if k < 0 else (f(k) if f(k) >= 0 else _P)),
            )
        share = readers[t.src, t.src_output]
        sig = comm.sig_id(t.num_bytes, t.shape)
        key = (pkey, ckey, sig, needs_grad[u], share)
        if key not in edge_cache:
            edge_cache[key] = _edge_arrays(comm, *layout_cache[pkey], *layout_cache[ckey], sig, needs_grad[u], share)
        merged.setdefault((u, v), []).append(edge_cache[key])

    edges = tuple(merged)
    memory, time = [], []
    for pair in edges:
        parts = merged[pair]
        mem, tim = parts[0]
        if len(parts) > 1:  # parallel tensors: option r of the edge is option r of every tensor
            mem = np.sum([p[0] for p in parts], axis=0)
            tim = np.sum([p[1] for p in parts], axis=0)
            mem.setflags(write=False)
            tim.setflags(write=False)
        memory.append(mem)
        time.append(tim)
    return edges, memory, time


def _edge_arrays(
    comm: _Comm,
    prod_fwd: np.ndarray,
    prod_grad: np.ndarray,
    cons_fwd: np.ndarray,
    cons_grad: np.ndarray,
    sig: int,
    needs_grad: bool,
    share: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(K_u, K_v, 3) memory and time of one tensor (module docstring, "Edge costs")."""
    num_bytes = comm._sig_list[sig][0]

    def table(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Path times between the unique layouts of ``rows`` and ``cols``, gathered to (len(rows), len(cols))."""
        ur, ri = np.unique(rows, return_inverse=True)
        uc, ci = np.unique(cols, return_inverse=True)
        small = np.array([[comm.path_time_s(int(a), int(b), sig) for b in uc] for a in ur]).reshape(len(ur), len(uc))
        return small[ri.reshape(-1)[:, None], ci.reshape(-1)[None, :]]

    def per_device(ids: np.ndarray) -> np.ndarray:
        return np.array([num_bytes / _split_degree(comm.layouts[i]) for i in ids.tolist()])

    r_f = table(prod_fwd, cons_fwd)
    r_b = table(cons_grad, prod_grad).T if needs_grad else np.zeros_like(r_f)
    rebuild = table(cons_fwd, prod_grad).T
    before = (per_device(prod_fwd) / share)[:, None]
    after = per_device(cons_fwd)[None, :]
    equal = prod_fwd[:, None] == cons_fwd[None, :]
    shape = r_f.shape
    memory = np.empty((*shape, _NUM_OPTIONS))
    time = np.empty((*shape, _NUM_OPTIONS))
    memory[..., 0] = np.where(equal, before, before + after)
    memory[..., 1] = np.where(equal, math.inf, np.broadcast_to(before, shape))
    memory[..., 2] = np.where(equal, math.inf, np.broadcast_to(after, shape))
    time[..., 0] = r_f + r_b
    time[..., 1] = np.where(equal, math.inf, 2 * r_f + r_b)
    time[..., 2] = np.where(equal, math.inf, r_f + rebuild + r_b)
    memory.setflags(write=False)
    time.setflags(write=False)
    return memory, time


__all__ = ["CostGraph", "build_cost_graph", "mesh_shapes", "op_configs"]
