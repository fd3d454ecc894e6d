"""Routes and rings over one topology: the one network model of the simulator and of FT's cost tables.

**Link directions.** Links are full duplex: link ``k`` of ``topology.links`` is two independent
directions, ``2k`` from ``link.a`` to ``link.b`` and ``2k + 1`` from ``link.b`` to ``link.a``. These
are the canonical ids everything counts traffic on. The simulator's resources are devices first,
so its resource for direction ``d`` is ``num_devices + d``.

**Routes.** For every ordered pair of devices (topology device indices ``a``, ``b``; flat pair id
``a * D + b``), the route :meth:`DeviceTopology.route` chooses, as the link directions it crosses in
path order, its bottleneck bandwidth, its latency (sum over its links) and the kind of its
bottleneck link (the first narrowest link along the path). A device's route to itself crosses
nothing: bandwidth ``inf``, latency 0, kind ``""``. The directions of all routes are stored flat in
CSR form (``route_dirs[route_ptr[p] : route_ptr[p + 1]]``) for vectorized code.

**Rings.** A ring collective over devices ``r_0 .. r_{f-1}`` sends along the hops
``r_k -> r_{k+1 mod f}``, all at once. Several rings may run concurrently (FT's collectives over a
mesh dimension run one ring per group) and share links: a link direction crossed by ``u`` hops of
all the rings gives each of them ``1 / u`` of its bandwidth. A hop's bandwidth is its route's
bottleneck divided by the largest ``u`` among the directions it crosses; the rings' bandwidth is the
slowest hop's (the first such hop, rings in the order given, hops in ring order, which also gives
the bottleneck kind), their latency the largest hop latency. One ring over the devices holding a
parameter shard is the simulator's ring all-reduce.

Routes depend only on the topology, so one :class:`Network` per topology is shared
(:func:`network`), as :func:`~placement_rl.topology.load_preset` shares topologies.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from placement_rl.topology import DeviceTopology, Link


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


class Network:
    """Every device-to-device route of one topology, and the bandwidth of concurrent rings.

    Build it with :func:`network` (shared per topology). All arrays are read-only.

    Attributes:
        num_devices: ``D``, the topology's devices (route pairs are ``a * D + b``).
        links: the topology's links (direction ``d`` is ``links[d // 2]``).
        route_ptr: ``(D * D + 1,)`` int64 offsets of each pair's directions in ``route_dirs``.
        route_dirs: ``(sum of route lengths,)`` int64 link directions of every route, in path order.
        route_len: ``(D * D,)`` int64 number of links of each route.
        route_bw: ``(D * D,)`` float64 bottleneck bandwidth in bytes/s (``inf`` on the diagonal).
        route_lat: ``(D * D,)`` float64 latency in seconds (0 on the diagonal).
        route_kind: ``D * D`` bottleneck link kinds (``""`` on the diagonal).
        kind_names: the distinct bottleneck kinds of all routes, sorted.
        route_kind_id: ``(D * D,)`` int64 index of ``route_kind`` in ``kind_names`` (-1 on the diagonal).
    """

    def __init__(self, topology: DeviceTopology) -> None:
        links = topology.links
        names = [d.name for d in topology.devices]
        D = len(names)
        self.num_devices = D
        self.links: tuple[Link, ...] = links
        lengths = np.zeros(D * D, np.int64)
        dirs: list[int] = []
        route_bw = np.full(D * D, np.inf)
        route_lat = np.zeros(D * D)
        route_kind = [""] * (D * D)
        for a in range(D):
            for b in range(D):
                if a == b:
                    continue
                route = topology.route(names[a], names[b])
                # the route's own link indices, not a lookup by end points: parallel links stay apart;
                # each link is entered from the node before it (the path is one node longer)
                for x, k in zip(route.path, route.links, strict=False):
                    dirs.append(2 * k + (0 if links[k].a == x else 1))
                pair = a * D + b
                lengths[pair] = len(route.links)
                route_bw[pair] = route.bandwidth_bytes_per_s
                route_lat[pair] = route.latency_s
                narrow = min(route.links, key=lambda k: links[k].bandwidth_bytes_per_s)
                route_kind[pair] = links[narrow].kind
        self.route_ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        self.route_dirs = np.array(dirs, dtype=np.int64)
        self.route_len = lengths
        self.route_bw = route_bw
        self.route_lat = route_lat
        self.route_kind: tuple[str, ...] = tuple(route_kind)
        self.kind_names: tuple[str, ...] = tuple(sorted(set(route_kind) - {""}))
        kind_id = {k: i for i, k in enumerate(self.kind_names)}
        self.route_kind_id = np.array([kind_id.get(k, -1) for k in route_kind], dtype=np.int64)
        for arr in (self.route_ptr, self.route_dirs, self.route_len, self.route_bw, self.route_lat, self.route_kind_id):
            arr.setflags(write=False)
        self._rings: dict[tuple[tuple[int, ...], ...], Rings] = {}

    def route_dirs_of(self, a: int, b: int) -> np.ndarray:
        """The link directions of the route from device ``a`` to ``b`` (topology indices), in path order."""
        pair = a * self.num_devices + b
        return self.route_dirs[self.route_ptr[pair] : self.route_ptr[pair + 1]]

    def gather(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The directions of the routes ``pairs`` (flat pair ids), concatenated, and each route's length.

        Shapes: ``pairs`` ``(P,)`` -> ``(sum of lengths,)``, ``(P,)``.
        """
        lengths = self.route_len[pairs]
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, np.int64), lengths
        # position k of route p is route_ptr[p] + k: offsets repeated per hop plus a running index
        starts = np.repeat(self.route_ptr[pairs] - (np.cumsum(lengths) - lengths), lengths)
        return self.route_dirs[starts + np.arange(total)], lengths

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
        hops = hops[self.route_len[hops] > 0] if hops.size else hops
        if hops.size == 0:
            found = Rings(np.zeros(0, np.int64), math.inf, 0.0, "")
        else:
            dirs, lengths = self.gather(hops)
            uses = np.bincount(dirs)
            share = np.maximum.reduceat(uses[dirs], np.cumsum(lengths) - lengths)
            bandwidth = self.route_bw[hops] / share
            slowest = int(np.argmin(bandwidth))  # the first of equally slow hops
            found = Rings(
                np.flatnonzero(uses),
                float(bandwidth[slowest]),
                float(self.route_lat[hops].max()),
                self.route_kind[int(hops[slowest])],
            )
            found.dirs.setflags(write=False)
        self._rings[key] = found
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
        return self.route_bw[pairs].reshape(n, n), self.route_lat[pairs].reshape(n, n), ptr, dirs


_NETWORKS: weakref.WeakKeyDictionary[DeviceTopology, Network] = weakref.WeakKeyDictionary()


def network(topology: DeviceTopology) -> Network:
    """The :class:`Network` of ``topology``, built on first use and kept while the topology lives.

    Equal topologies (same devices, links and name) share one: their routes are the same.
    """
    found = _NETWORKS.get(topology)
    if found is None:
        found = _NETWORKS[topology] = Network(topology)
    return found


__all__ = ["Network", "Rings", "network"]
