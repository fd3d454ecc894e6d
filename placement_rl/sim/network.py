"""Routes, rings, collectives and the network models of the simulator (and FT's cost tables).

**Link directions.** Links are full duplex: link ``k`` of ``topology.links`` is two independent
directions, ``2k`` from ``link.a`` to ``link.b`` and ``2k + 1`` from ``link.b`` to ``link.a``. These
are the canonical ids everything counts traffic on. The simulator's resources are devices first,
so its resource for direction ``d`` is ``num_devices + d``.

**Routes.** For every ordered pair of devices (topology device indices ``a``, ``b``; flat pair id
``a * D + b``), the route :meth:`DeviceTopology.route` chooses, as the link directions it crosses in
path order, its bottleneck bandwidth, its latency (sum over its links) and the kind of its
bottleneck link (the first narrowest link along the path). A device's route to itself crosses
nothing: bandwidth ``inf``, latency 0, kind ``""``. Routes are built lazily, all routes from one
source device at once, the first time a plan needs one (the routing rule compiled,
:func:`~placement_rl.sim.kernels.routes_from`), so a plan on 16 devices of a 4,096-device cluster
builds 16 sources' routes, not ``4096**2``; queries take flat pair ids and return arrays
(:meth:`Network.gather` gives the directions of many routes at once, for vectorized code).

**Rings** (the ``circuit`` and ``pairwise`` models, and FT). A ring collective over devices
``r_0 .. r_{f-1}`` sends along the hops ``r_k -> r_{k+1 mod f}``, all at once. Several rings may run
concurrently (FT's collectives over a mesh dimension run one ring per group) and share links: a
link direction crossed by ``u`` hops of all the rings gives each of them ``1 / u`` of its bandwidth.
A hop's bandwidth is its route's bottleneck divided by the largest ``u`` among the directions it
crosses; the rings' bandwidth is the slowest hop's (the first such hop, rings in the order given,
hops in ring order, which also gives the bottleneck kind), their latency the largest hop latency.

**Network models** (:data:`NETWORK_MODELS`, chosen by name: ``CostModel(network="flow")``):

* ``flow`` (the default): every transfer is a flow along its route. At every moment the flows in
  flight share each link direction max-min fairly (progressive filling, :func:`max_min_rates`);
  rates are recomputed whenever a flow starts or ends. A transfer pays its route's latency once,
  after its last byte has left. Collectives are flows too (:meth:`Network.all_reduce_algorithms`).
* ``circuit`` (the simulator's model before flows): a transfer holds every link direction of its route for
  ``latency + bytes / bottleneck``; transfers through one link direction queue FIFO. A ring
  all-reduce holds every direction of its ring (:meth:`Network.rings`).
* ``pairwise`` (FlexFlow's assumption A2): each device pair has its own connection at its route's
  bottleneck bandwidth; a transfer queues only behind transfers between the same two devices.

**All-reduce as flows** (:meth:`Network.all_reduce_algorithms`, the ``flow`` model). A gradient of
``S`` bytes over ``n`` devices is all-reduced by one of these algorithms, each a sequence of
*phases*; a phase is a set of flows that start together, and the next phase starts once they all
drained plus the phase's latency (its ring steps times the slowest hop's latency):

* ``ring``: one ring in the group's order; each of its ``n`` hops carries ``2 (n - 1) / n * S``;
  latency ``2 (n - 1)`` hop latencies. Alone on dedicated links of bandwidth ``B`` it takes
  ``2 (n - 1) / n * S / B + 2 (n - 1) * latency``.
* ``ring xk`` (devices on several machines): ``k`` rings at once, each carrying ``S / k`` (NCCL's
  channels). Ring ``j`` visits each machine's devices rotated by ``j * g / k`` (``g`` the machine's
  devices in the group), so the rings leave and enter machines through different devices and, where
  each GPU has its own NIC, different NICs. ``k`` runs from 2 to the fewest devices of a machine.
* ``hierarchical`` (devices on several machines, some machine with two or more): reduce within each
  machine, all-reduce across machines, broadcast within each machine. When every machine holds the
  same number ``g`` of the group's devices, this is the bandwidth-optimal form (NCCL/Horovod): a
  reduce-scatter ring per machine (each hop ``(g - 1) / g * S``), then ``g`` concurrent cross-machine
  rings, one per local rank, each all-reducing ``S / g``, then an all-gather ring per machine.
  Otherwise each machine reduces to its first device along a pipelined chain (each hop ``S``), the
  first devices all-reduce ``S`` in a ring, and each machine broadcasts back along the chain.

**The rule that picks one:** the algorithm whose time alone on the network is the least for this
message size: ``latency + S * seconds_per_byte``, with ``seconds_per_byte`` the drain time of its
phases' flows under the same max-min sharing (ties: the order above). This is what NCCL's tuner
does with its own cost model; while other traffic is in flight the chosen algorithm's flows share
links with it like any others.

Routes depend only on the topology, so one :class:`Network` per topology is shared
(:func:`network`), as :func:`~placement_rl.topology.load_preset` shares topologies.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from placement_rl.errors import UnknownNameError
from placement_rl.sim import kernels as _kernels
from placement_rl.topology import DeviceTopology, Link


# ------------------------------------------------------------------------------------ network models
@dataclass(frozen=True)
class NetworkModel:
    """How the simulator moves bytes (see the module docstring).

    Attributes:
        name: how a cost model names it (``CostModel(network=name)``).
        description: one line for listings and errors.
        shares_links: transfers and collectives are flows sharing link directions max-min fairly;
            when false, each takes a fixed time and queues FIFO on what it ``holds``.
        holds: for fixed-time models, what a transfer occupies: ``"route"`` (every link direction of
            its route) or ``"pair"`` (its device pair's dedicated connection); ``""`` for flows.
    """

    name: str
    description: str
    shares_links: bool
    holds: Literal["route", "pair", ""]


#: The network models by name (:func:`register_network_model` adds one).
NETWORK_MODELS: dict[str, NetworkModel] = {}


def register_network_model(model: NetworkModel) -> NetworkModel:
    """Make ``model`` known by its name (the simulator reads only its attributes)."""
    NETWORK_MODELS[model.name] = model
    return model


def network_model(name: str) -> NetworkModel:
    """The model called ``name``; :class:`UnknownNameError` listing the valid names otherwise."""
    if name not in NETWORK_MODELS:
        raise UnknownNameError("network model", name, NETWORK_MODELS)
    return NETWORK_MODELS[name]


register_network_model(NetworkModel("flow", "flows share every link direction max-min fairly (default)", True, ""))
register_network_model(
    NetworkModel("circuit", "a transfer holds every link direction of its route (the earlier default)", False, "route")
)
register_network_model(NetworkModel("pairwise", "a dedicated connection per device pair (FlexFlow A2)", False, "pair"))

#: The most devices a topology may have under a model that ``holds`` a ``"pair"`` connection: the
#: simulator keeps one resource per ordered device pair (``D**2``; 2,048 devices: 4.2 million, about
#: 170 MB of scheduler state), where the other models' cost follows the devices a plan uses.
PAIR_MODEL_MAX_DEVICES = 2048


# ------------------------------------------------------------------------------------ max-min sharing
def max_min_rates(
    flow_dirs: Sequence[Sequence[int]], capacity: np.ndarray, flow_caps: Sequence[float] | None = None
) -> np.ndarray:
    """Max-min fair rates of flows sharing link directions (progressive filling, in bottleneck order).

    Repeatedly the direction with the smallest fair share (remaining capacity over its unfrozen
    flows) fixes the rate of all its unfrozen flows at that share; a flow's own cap, when smaller
    than every share, fixes it at the cap. This pure-Python version serves the algorithm choice
    (:meth:`Network.all_reduce_algorithms`) and the tests; the scheduler has its own kernel.

    Args:
        flow_dirs: each flow's link directions.
        capacity: ``(2L,)`` bytes/s per direction.
        flow_caps: optional per-flow rate caps (``inf``: none).

    Returns:
        ``(F,)`` bytes/s (``inf`` for a flow that crosses nothing and has no cap).
    """
    n = len(flow_dirs)
    rates = np.full(n, math.inf)
    caps = [math.inf] * n if flow_caps is None else [float(c) for c in flow_caps]
    remaining: dict[int, float] = {}
    users: dict[int, list[int]] = {}
    for f, dirs in enumerate(flow_dirs):
        for d in dirs:
            remaining.setdefault(int(d), float(capacity[int(d)]))
            users.setdefault(int(d), []).append(f)
    count = {d: len(u) for d, u in users.items()}
    frozen = [False] * n
    left = n

    def freeze(f: int, rate: float) -> None:
        rates[f] = rate
        frozen[f] = True
        for d in flow_dirs[f]:
            remaining[int(d)] -= rate
            count[int(d)] -= 1

    while left:
        share, bottleneck = math.inf, -1
        for d, k in count.items():
            if k > 0 and remaining[d] / k < share:
                share, bottleneck = remaining[d] / k, d
        capped = min((f for f in range(n) if not frozen[f]), key=lambda f: caps[f])
        if caps[capped] < share or bottleneck < 0:
            freeze(capped, caps[capped])
            left -= 1
            continue
        for f in users[bottleneck]:
            if not frozen[f]:
                freeze(f, share)
                left -= 1
    return rates


def drain_time_s(sizes: Sequence[float], flow_dirs: Sequence[Sequence[int]], capacity: np.ndarray) -> float:
    """Time for flows of ``sizes`` bytes, all starting at once, to drain under max-min sharing.

    Rates are recomputed each time a flow finishes (the simulator's rule).
    """
    remaining = [float(s) for s in sizes]
    active = [f for f, s in enumerate(remaining) if s > 0]
    now = 0.0
    while active:
        rates = max_min_rates([flow_dirs[f] for f in active], capacity)
        if not np.isfinite(rates).all():
            raise ValueError("drain_time_s: a flow crosses no link direction")
        step = min(remaining[f] / r for f, r in zip(active, rates, strict=True))
        now += step
        still = []
        for f, r in zip(active, rates, strict=True):
            remaining[f] -= r * step
            if remaining[f] > 1e-9 * sizes[f]:
                still.append(f)
        active = still
    return now


@dataclass(frozen=True)
class Collective:
    """One all-reduce algorithm over one device group, per byte of the message (see the module docstring).

    Shapes: ``P`` phases, ``F`` flows. Phase ``p``'s flows are ``phase_ptr[p] : phase_ptr[p + 1]``;
    flow ``f`` carries ``flow_fraction[f] * S`` bytes of an ``S``-byte message over the directions
    ``flow_dirs[flow_ptr[f] : flow_ptr[f + 1]]``.

    Attributes:
        name: ``"ring"``, ``"ring x<k>"`` or ``"hierarchical"``.
        phase_latency_s: ``(P,)`` the latency paid after each phase's flows drain.
        phase_ptr: ``(P + 1,)`` int64.
        flow_fraction: ``(F,)`` bytes per message byte.
        flow_ptr: ``(F + 1,)`` int64.
        flow_dirs: link directions of all flows, in path order.
        latency_s: the sum of the phase latencies.
        seconds_per_byte: the phases' drain time alone on the network, per message byte.
    """

    name: str
    phase_latency_s: np.ndarray
    phase_ptr: np.ndarray
    flow_fraction: np.ndarray
    flow_ptr: np.ndarray
    flow_dirs: np.ndarray
    latency_s: float
    seconds_per_byte: float

    def time_s(self, num_bytes: float) -> float:
        """Time alone on the network for a message of ``num_bytes``."""
        return self.latency_s + num_bytes * self.seconds_per_byte


class Rings(NamedTuple):
    """What a set of concurrent rings occupies and how fast it runs (see the module docstring).

    Attributes:
        dirs: ``(U,)`` int64 link directions any hop crosses, sorted ascending.
        bandwidth_bytes_per_s: effective bandwidth of the slowest hop (``inf`` when no hop crosses a link).
        latency_s: the largest hop latency.
        kind: link kind of the slowest hop's bottleneck (``""`` when no hop crosses a link).
    """

    dirs: np.ndarray
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: str


_Hop = tuple[int, int, float]  # (source device, destination device, bytes per message byte)
_Phase = tuple[float, list[_Hop]]  # (latency after the hops drain, the hops)


class Network:
    """The device-to-device routes of one topology, and the bandwidth of concurrent rings.

    Build it with :func:`network` (shared per topology). Routes are built lazily, all routes from one
    source device at a time (:func:`~placement_rl.sim.kernels.routes_from`, the topology's routing
    rule compiled), the first time a pair with that source is asked for: the cost follows the devices
    a plan uses, not ``D**2``. Route queries take flat pair ids ``a * D + b`` (topology device indices)
    as ``(P,)`` int64 arrays and return ``(P,)`` arrays. A network is not safe to share between threads.

    Attributes:
        num_devices: ``D``, the topology's devices (route pairs are ``a * D + b``).
        links: the topology's links (direction ``d`` is ``links[d // 2]``).
        kind_names: the kinds of the topology's links, sorted (:meth:`kind_ids` indexes them).
        capacity: ``(2L,)`` bandwidth of each link direction in bytes/s.
        direction_names: ``2L`` names ``"link <a> -> <b>"`` (the simulator's link lanes).
        device_machine: ``(D,)`` int64 index of each device's machine (machines in order of first appearance).
    """

    def __init__(self, topology: DeviceTopology) -> None:
        links = topology.links
        names = [d.name for d in topology.devices] + list(topology.switches)
        D = topology.num_devices
        self.num_devices = D
        self.links: tuple[Link, ...] = links
        # the topology's adjacency in its own order (devices are nodes 0 .. D-1, then the switches)
        node = {name: i for i, name in enumerate(names)}
        link_a = np.array([node[link.a] for link in links], dtype=np.int64)
        link_b = np.array([node[link.b] for link in links], dtype=np.int64)
        ends = np.concatenate([link_a, link_b])
        other = np.concatenate([link_b, link_a])
        which = np.concatenate([np.arange(len(links)), np.arange(len(links))]).astype(np.int64)
        order = np.lexsort((which, ends), axis=0)  # by node, then link index (the order links list them)
        self._adj_ptr = np.concatenate(([0], np.cumsum(np.bincount(ends, minlength=len(names))))).astype(np.int64)
        self._adj_node = other[order]
        self._adj_link = which[order]
        link_bw = np.array([link.bandwidth_bytes_per_s for link in links], dtype=np.float64)
        link_lat = np.array([link.latency_s for link in links], dtype=np.float64)
        self._adj_bw = link_bw[self._adj_link]
        self._adj_lat = link_lat[self._adj_link]
        rank = np.empty(len(names), np.int64)
        rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        self._rank = rank
        self._link_a = link_a
        self._link_bw = link_bw
        self.kind_names: tuple[str, ...] = tuple(sorted({link.kind for link in links}))
        kind_id = {k: i for i, k in enumerate(self.kind_names)}
        self._link_kind_id = np.array([kind_id[link.kind] for link in links], dtype=np.int64)
        self.capacity = np.repeat(link_bw, 2).astype(np.float64)
        self.direction_names: tuple[str, ...] = tuple(
            name for link in links for name in (f"link {link.a} -> {link.b}", f"link {link.b} -> {link.a}")
        )
        machine_ids: dict[str, int] = {}
        self.device_machine = np.array(
            [machine_ids.setdefault(d.machine, len(machine_ids)) for d in topology.devices], dtype=np.int64
        )
        for arr in (self.capacity, self.device_machine):
            arr.setflags(write=False)
        # routes built so far: source device a's routes are row _row[a] (-1: not yet); pair (a, b) is
        # slot _row[a] * D + b of the per-slot arrays, whose capacity grows by doubling
        # (lengths, kinds and directions stored narrow: a 4,096-GPU cluster's routes from every device are
        # 16.8 million entries; queries return int64 as documented)
        self._row = np.full(D, -1, np.int64)
        self._rows = 0
        self._bw = np.zeros(0)
        self._lat = np.zeros(0)
        self._len = np.zeros(0, np.int32)
        self._kind = np.zeros(0, np.int16)
        self._start = np.zeros(0, np.int64)
        self._dirs = np.zeros(0, np.int32)
        self._dirs_used = 0
        self._rings: dict[tuple[tuple[int, ...], ...], Rings] = {}
        self._algorithms: dict[tuple[int, ...], tuple[Collective, ...]] = {}

    # ------------------------------------------------------------------------------ routes
    @property
    def sources_built(self) -> int:
        """How many source devices have their routes built."""
        return self._rows

    def unbuilt_route_bytes(self, devices: np.ndarray) -> int:
        """About the bytes the routes from the devices among ``devices`` (topology indices, repeats allowed)
        whose routes are not built yet will take (:data:`ROUTE_BYTES_PER_PAIR` for each of ``D`` destinations)."""
        D = self.num_devices
        if self._rows == D or devices.shape[0] == 0:
            return 0
        missing = np.count_nonzero((np.bincount(devices, minlength=D) > 0) & (self._row < 0))
        return int(missing) * D * ROUTE_BYTES_PER_PAIR

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` sources' routes (at least double the current room when growing)."""
        D = self.num_devices
        if rows * D > self._bw.shape[0]:
            size = min(max(rows, 2 * self._bw.shape[0] // D), D) * D  # never more than every source
            self._bw, self._lat, self._len, self._kind, self._start = (
                _grown(arr, size) for arr in (self._bw, self._lat, self._len, self._kind, self._start)
            )

    def _build_source(self, a: int) -> None:
        """Build every route from device ``a`` into a new row."""
        D = self.num_devices
        bw, lat, length, dirs, narrow = _kernels.routes_from(
            a,
            D,
            self._adj_ptr,
            self._adj_node,
            self._adj_link,
            self._adj_bw,
            self._adj_lat,
            self._rank,
            self._link_a,
            self._link_bw,
        )
        row = self._rows
        self._reserve(row + 1)
        if self._dirs_used + dirs.shape[0] > self._dirs.shape[0]:
            self._dirs = _grown(self._dirs, max(2 * self._dirs.shape[0], self._dirs_used + dirs.shape[0]))
        at = slice(row * D, (row + 1) * D)
        self._bw[at] = bw
        self._lat[at] = lat
        self._len[at] = length
        self._kind[at] = np.where(narrow >= 0, self._link_kind_id[np.maximum(narrow, 0)], -1)
        self._start[at] = self._dirs_used + np.cumsum(length) - length
        self._dirs[self._dirs_used : self._dirs_used + dirs.shape[0]] = dirs
        self._dirs_used += dirs.shape[0]
        self._row[a] = row
        self._rows += 1

    def _slots(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` slots of flat pair ids ``pairs``, building the routes of sources not built yet."""
        pairs = np.asarray(pairs, dtype=np.int64)
        D = self.num_devices
        src = pairs // D
        missing = src[self._row[src] < 0]
        if missing.size:
            missing = np.unique(missing)
            self._reserve(self._rows + missing.shape[0])
            for a in missing.tolist():
                self._build_source(a)
        return self._row[src] * D + pairs % D

    def lengths(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` int64 number of links of each route (0 from a device to itself)."""
        slots = self._slots(pairs)  # first: building routes may replace the arrays
        return self._len[slots].astype(np.int64)

    def bandwidths(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` float64 bottleneck bandwidth of each route in bytes/s (``inf`` from a device to itself)."""
        slots = self._slots(pairs)  # first: building routes may replace the arrays
        return self._bw[slots]

    def latencies(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` float64 latency of each route in seconds (0 from a device to itself)."""
        slots = self._slots(pairs)  # first: building routes may replace the arrays
        return self._lat[slots]

    def kind_ids(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` int64 index in :attr:`kind_names` of each route's bottleneck kind (-1 to itself)."""
        slots = self._slots(pairs)  # first: building routes may replace the arrays
        return self._kind[slots].astype(np.int64)

    def kind(self, pair: int) -> str:
        """The kind of the first narrowest link of route ``pair`` (``""`` from a device to itself)."""
        k = int(self.kind_ids([pair])[0])
        return self.kind_names[k] if k >= 0 else ""

    def first_dirs(self, pairs: np.ndarray | Sequence[int]) -> np.ndarray:
        """``(P,)`` int64 the first link direction of each route (every route must cross a link)."""
        slots = self._slots(pairs)
        if np.any(self._len[slots] == 0):
            raise ValueError("first_dirs: a route from a device to itself crosses no link")
        return self._dirs[self._start[slots]].astype(np.int64)

    def route_dirs_of(self, a: int, b: int) -> np.ndarray:
        """The link directions of the route from device ``a`` to ``b`` (topology indices), in path order."""
        slot = int(self._slots([a * self.num_devices + b])[0])
        start = int(self._start[slot])
        found = self._dirs[start : start + int(self._len[slot])].astype(np.int64)
        found.flags.writeable = False
        return found

    def transfer_routes(
        self, pairs: np.ndarray, moving: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What point-to-point transfers need of their routes, in one pass.

        Args:
            pairs: (P,) flat pair ids of the transfers.
            moving: (M,) the positions in ``pairs`` of the transfers that carry bytes.

        Returns:
            ``(dirs, dir_ptr, latency_s, first_dir)``: the moving transfers' link directions
            concatenated ``(sum of lengths,)`` with offsets ``(M + 1,)``, their route latencies ``(M,)``,
            and every transfer's first direction ``(P,)`` (as :meth:`first_dirs`, which it equals).

        Raises:
            ValueError: a route from a device to itself (it crosses no link).
        """
        slots = self._slots(pairs)  # first: building routes may replace the arrays
        dirs, ptr, latency, first = _kernels.route_arrays(
            slots, np.asarray(moving, np.int64), self._start, self._len, self._dirs, self._lat
        )
        if first.size and first.min() < 0:
            raise ValueError("transfer_routes: a route from a device to itself crosses no link")
        return dirs, ptr, latency, first

    def gather(self, pairs: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The directions of the routes ``pairs`` (flat pair ids), concatenated, and each route's length.

        Shapes: ``pairs`` ``(P,)`` -> ``(sum of lengths,)``, ``(P,)``.
        """
        slots = self._slots(pairs)
        lengths = self._len[slots].astype(np.int64)
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, np.int64), lengths
        # position k of route p is start[p] + k: offsets repeated per hop plus a running index
        starts = np.repeat(self._start[slots] - (np.cumsum(lengths) - lengths), lengths)
        return self._dirs[starts + np.arange(total)].astype(np.int64), lengths

    def rings(self, rings: Sequence[Sequence[int]]) -> Rings:
        """Link directions, bandwidth, latency and bottleneck kind of concurrent rings (module docstring).

        Args:
            rings: each ring's devices (topology indices) in ring order. A device repeated next to
                itself adds a hop that crosses nothing.

        Returns:
            The :class:`Rings` (cached per ``rings``).
        """
        key = tuple(tuple(int(d) for d in ring) for ring in rings)
        found = self._rings.get(key)
        if found is not None:
            return found
        D = self.num_devices
        hops = np.array(
            [ring[k] * D + ring[(k + 1) % len(ring)] for ring in key for k in range(len(ring))], dtype=np.int64
        )
        hops = hops[self.lengths(hops) > 0] if hops.size else hops
        if hops.size == 0:
            found = Rings(np.zeros(0, np.int64), math.inf, 0.0, "")
        else:
            dirs, lengths = self.gather(hops)
            uses = np.bincount(dirs)
            share = np.maximum.reduceat(uses[dirs], np.cumsum(lengths) - lengths)
            bandwidth = self.bandwidths(hops) / share
            slowest = int(np.argmin(bandwidth))  # the first of equally slow hops
            found = Rings(
                np.flatnonzero(uses),
                float(bandwidth[slowest]),
                float(self.latencies(hops).max()),
                self.kind(int(hops[slowest])),
            )
            found.dirs.setflags(write=False)
        self._rings[key] = found
        return found

    # ------------------------------------------------------------------------------ collectives
    def all_reduce_algorithms(self, group: Sequence[int]) -> tuple[Collective, ...]:
        """The all-reduce algorithms over ``group`` (topology device indices, ring order), cached.

        ``ring`` first, then ``ring x2 ..`` and ``hierarchical`` where the group spans machines (module
        docstring). Empty for fewer than two devices.
        """
        key = tuple(int(d) for d in group)
        found = self._algorithms.get(key)
        if found is not None:
            return found
        found = () if len(key) < 2 else tuple(self._build(name, phases) for name, phases in self._candidates(key))
        self._algorithms[key] = found
        return found

    def all_reduce(self, group: Sequence[int], num_bytes: float) -> Collective:
        """The algorithm the ``flow`` model uses for ``num_bytes`` over ``group``: the least time alone."""
        options = self.all_reduce_algorithms(group)
        if not options:
            raise ValueError(f"all_reduce: group {tuple(group)} has fewer than two devices")
        return min(options, key=lambda c: c.time_s(num_bytes))  # the first of equal times

    def _candidates(self, group: tuple[int, ...]) -> list[tuple[str, list[_Phase]]]:
        """Each algorithm as phases of ``(latency, [(src, dst, fraction), ...])`` hops."""
        n = len(group)
        machines: dict[int, list[int]] = {}
        for d in group:
            machines.setdefault(int(self.device_machine[d]), []).append(d)
        per = list(machines.values())

        def ring_hops(ring: Sequence[int], fraction: float) -> list[_Hop]:
            return [(ring[k], ring[(k + 1) % len(ring)], fraction) for k in range(len(ring)) if len(ring) > 1]

        def phase(hops: list[_Hop], steps: int) -> _Phase:
            """The hops and their latency: ``steps`` times the slowest hop's route latency."""
            pairs = [a * self.num_devices + b for a, b, _ in hops]
            slowest = float(self.latencies(pairs).max()) if pairs else 0.0
            return steps * slowest, hops

        out = [("ring", [phase(ring_hops(group, 2.0 * (n - 1) / n), 2 * (n - 1))])]
        if len(per) < 2:
            return out
        fewest = min(len(m) for m in per)
        for k in range(2, fewest + 1):
            rings = [[d for m in per for d in _rotate(m, j * len(m) // k)] for j in range(k)]
            hops = [h for r in rings for h in ring_hops(r, 2.0 * (n - 1) / n / k)]
            out.append((f"ring x{k}", [phase(hops, 2 * (n - 1))]))
        if max(len(m) for m in per) < 2:
            return out
        m = len(per)
        if all(len(x) == len(per[0]) for x in per):
            g = len(per[0])
            within = [h for x in per for h in ring_hops(x, (g - 1) / g)]
            across = [h for j in range(g) for h in ring_hops([x[j] for x in per], 2.0 * (m - 1) / m / g)]
            phases = [phase(within, g - 1), phase(across, 2 * (m - 1)), phase(within, g - 1)]
        else:
            longest = max(len(x) for x in per)
            up = [(x[k + 1], x[k], 1.0) for x in per for k in range(len(x) - 1)]
            down = [(x[k], x[k + 1], 1.0) for x in per for k in range(len(x) - 1)]
            leaders = ring_hops([x[0] for x in per], 2.0 * (m - 1) / m)
            phases = [phase(up, longest - 1), phase(leaders, 2 * (m - 1)), phase(down, longest - 1)]
        out.append(("hierarchical", phases))
        return out

    def _build(self, name: str, phases: list[_Phase]) -> Collective:
        D = self.num_devices
        latency: list[float] = []
        ptr, flow_ptr = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        fractions: list[np.ndarray] = []
        dirs: list[np.ndarray] = []
        flows = used = 0
        seconds_per_byte = 0.0
        for lat, hops in phases:
            pairs = np.array([a * D + b for a, b, _ in hops], dtype=np.int64)
            fraction = np.array([f for _, _, f in hops], dtype=np.float64)
            if pairs.size:
                crosses = self.lengths(pairs) > 0
                pairs, fraction = pairs[crosses], fraction[crosses]
            route_dirs, lengths = self.gather(pairs)
            latency.append(lat)
            flows += pairs.shape[0]
            ptr.append(np.array([flows], dtype=np.int64))
            fractions.append(fraction)
            dirs.append(route_dirs)
            flow_ptr.append(used + np.cumsum(lengths))
            used += route_dirs.shape[0]
            if pairs.size:
                seconds_per_byte += float(
                    _kernels.drain(
                        fraction,
                        np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                        route_dirs.astype(np.int64),
                        self.capacity,
                    )
                )
        found = Collective(
            name,
            np.array(latency, dtype=np.float64),
            np.concatenate(ptr).astype(np.int64),
            np.concatenate(fractions).astype(np.float64) if fractions else np.zeros(0),
            np.concatenate(flow_ptr).astype(np.int64),
            np.concatenate(dirs).astype(np.int64) if dirs else np.zeros(0, np.int64),
            float(sum(latency)),
            seconds_per_byte,
        )
        for arr in (found.phase_latency_s, found.phase_ptr, found.flow_fraction, found.flow_ptr, found.flow_dirs):
            arr.setflags(write=False)
        return found

    def submatrices(self, devices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Routes among a subset of devices, indexed by position in ``devices`` (FT's flat indices).

        Args:
            devices: ``n`` topology device indices.

        Returns:
            ``(bw, lat, ptr, dirs)``: ``(n, n)`` bottleneck bandwidth and latency from ``devices[i]``
            to ``devices[j]``; the directions of that route are ``dirs[ptr[i * n + j] : ptr[i * n + j + 1]]``
            (``ptr`` of shape ``(n * n + 1,)``).
        """
        index = np.asarray(devices, dtype=np.int64)
        n = index.shape[0]
        pairs = (index[:, None] * self.num_devices + index[None, :]).reshape(-1)
        dirs, lengths = self.gather(pairs)
        ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        return self.bandwidths(pairs).reshape(n, n), self.latencies(pairs).reshape(n, n), ptr, dirs


def _rotate(items: Sequence[int], k: int) -> list[int]:
    return [*items[k:], *items[:k]]


#: Bytes one stored route takes (bandwidth, latency, length, kind, offset and about four link directions).
ROUTE_BYTES_PER_PAIR = 8 + 8 + 4 + 2 + 8 + 4 * 4

_NETWORKS: weakref.WeakKeyDictionary[DeviceTopology, Network] = weakref.WeakKeyDictionary()


def network(topology: DeviceTopology) -> Network:
    """The :class:`Network` of ``topology``, built on first use and kept while the topology lives.

    Equal topologies (same devices, links and name) share one: their routes are the same.
    """
    found = _NETWORKS.get(topology)
    if found is None:
        found = _NETWORKS[topology] = Network(topology)
    return found


__all__ = [
    "NETWORK_MODELS",
    "PAIR_MODEL_MAX_DEVICES",
    "ROUTE_BYTES_PER_PAIR",
    "Collective",
    "Network",
    "NetworkModel",
    "Rings",
    "drain_time_s",
    "max_min_rates",
    "network",
    "network_model",
    "register_network_model",
]


def _grown(arr: np.ndarray, size: int) -> np.ndarray:
    """A copy of ``arr`` with room for ``size`` elements (the first ``len(arr)`` kept)."""
    out = np.zeros(size, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out
