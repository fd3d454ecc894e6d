"""Device topologies: the GPU clusters that training graphs are placed on.

A :class:`DeviceTopology` is an undirected graph whose nodes are compute devices (:class:`Device`)
and non-compute network nodes ("switches": PCIe switches, NICs, NVSwitches, InfiniBand/Ethernet
switches), joined by full-duplex :class:`Link` objects whose bandwidth is per direction.

Routing (:meth:`DeviceTopology.route`) picks, for every pair of nodes, the *widest* path (maximum
bottleneck bandwidth); ties are broken by lowest total latency, then fewest hops, then the
lexicographically smallest sequence of node names, so routes are deterministic. Routes may pass
through devices as well as switches (e.g. NVLink forwarding through a peer GPU) when that is the best
path. A transfer of ``n`` bytes along a route takes ``latency_s + n / bandwidth_bytes_per_s``.

Units are in the names: ``*_bytes_per_s``, ``*_s``, ``*_bytes``; ``peak_flops`` is FLOP/s. Network
figures quoted in Gb/s are converted with ``Gb * 1e9 / 8`` bytes/s; memory uses GiB = 2**30 bytes.

The module provides the device catalogue (:data:`DEVICE_TYPES`), the cluster presets of the papers
(:func:`load_preset`), TAG's random topology distribution (:func:`random_topology`, with disjoint
train/test seed ranges: "unseen topologies" are those drawn from :data:`TEST_SEEDS`) and
:func:`resolve_topology`, which turns a command-line string into a topology.

The JSON document (``format: placement_rl.topology``, ``schema_version: 1``)::

    {"format": "placement_rl.topology", "schema_version": 1, "name": "...",
     "devices": [{"name", "device_type", "machine", "peak_flops", "memory_bytes",
                  "memory_bandwidth_bytes_per_s"}, ...],
     "switches": ["...", ...],
     "links": [{"a", "b", "bandwidth_bytes_per_s", "latency_s", "kind"}, ...]}
"""

from __future__ import annotations

import functools
import heapq
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.io import as_float, as_int, as_list, as_str, check_header, check_keys, read_json, write_json

LinkKind = Literal["nvlink", "nvswitch", "pcie", "infiniband", "ethernet"]
LINK_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "infiniband", "ethernet")

TOPOLOGY_FORMAT = "placement_rl.topology"
TOPOLOGY_SCHEMA_VERSION = 1

GIB = 2**30

#: Per-link latency used by the presets and random topologies, by link kind (seconds).
LINK_LATENCY_S: dict[str, float] = {
    "nvlink": 2e-6,
    "nvswitch": 2e-6,
    "pcie": 5e-6,
    "infiniband": 5e-6,  # NIC to switch
    "ethernet": 25e-6,
}

#: PCIe 3.0 x16, effective bandwidth per direction used throughout (bytes/s).
PCIE3_X16_BYTES_PER_S = 12e9


def gbit_to_bytes_per_s(gbit_per_s: float) -> float:
    """Convert a network rate in Gb/s to bytes/s (``Gb * 1e9 / 8``)."""
    return gbit_per_s * 1e9 / 8


# ------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class Device:
    """One compute device (a GPU).

    Attributes:
        name: unique among the topology's nodes, e.g. ``"m0/gpu0"``.
        device_type: a catalogue name such as ``"V100-SXM2-32GB"`` (custom names are allowed).
        machine: the machine (host) holding the device, e.g. ``"m0"``.
        peak_flops: fp32 (non tensor-core) peak, FLOP/s.
        memory_bytes: device memory in bytes.
        memory_bandwidth_bytes_per_s: device memory bandwidth in bytes/s.
    """

    name: str
    device_type: str
    machine: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class Link:
    """An undirected, full-duplex link between two nodes (devices or switches).

    Attributes:
        a: one endpoint's node name.
        b: the other endpoint's node name.
        bandwidth_bytes_per_s: bandwidth per direction.
        latency_s: one-way latency.
        kind: the interconnect technology, one of :data:`LINK_KINDS`.
    """

    a: str
    b: str
    bandwidth_bytes_per_s: float
    latency_s: float
    kind: LinkKind


@dataclass(frozen=True)
class Route:
    """The chosen path between two nodes (see the module docstring for the routing rule).

    Attributes:
        src: the source node name.
        dst: the destination node name.
        path: node names along the path, ``src`` first and ``dst`` last (``(src,)`` when equal).
        links: indices into ``DeviceTopology.links`` along the path (empty when ``src == dst``).
        bandwidth_bytes_per_s: the bottleneck (minimum) bandwidth; ``math.inf`` when ``src == dst``.
        latency_s: total latency of the links; 0 when ``src == dst``.
    """

    src: str
    dst: str
    path: tuple[str, ...]
    links: tuple[int, ...]
    bandwidth_bytes_per_s: float
    latency_s: float

    def transfer_time_s(self, num_bytes: float) -> float:
        """Seconds to move ``num_bytes`` along the route: latency + bytes / bottleneck bandwidth.

        Args:
            num_bytes: the payload size in bytes (non-negative).

        Returns:
            The transfer time in seconds; 0 when ``src == dst``.
        """
        if num_bytes < 0:
            raise ValueError(f"num_bytes = {num_bytes!r}; expected a non-negative number of bytes")
        if self.src == self.dst:
            return 0.0
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class DeviceSpec:
    """Catalogue figures of one device type.

    Attributes:
        peak_flops: fp32 (non tensor-core) peak, FLOP/s.
        memory_bytes: device memory in bytes (GiB = 2**30).
        memory_bandwidth_bytes_per_s: device memory bandwidth in bytes/s.
        source: where the figures come from.
    """

    peak_flops: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    source: str = "vendor datasheet"


#: Device catalogue; every figure is from the vendor datasheet (NVIDIA).
DEVICE_TYPES: dict[str, DeviceSpec] = {
    "P100-SXM2-16GB": DeviceSpec(10.6e12, 16 * GIB, 732e9),
    "P100-PCIE-12GB": DeviceSpec(9.3e12, 12 * GIB, 549e9),
    "K80": DeviceSpec(4.37e12, 12 * GIB, 240e9),  # one of the board's two GPUs, boost clock
    "V100-SXM2-16GB": DeviceSpec(15.7e12, 16 * GIB, 900e9),
    "V100-SXM2-32GB": DeviceSpec(15.7e12, 32 * GIB, 900e9),
    "GTX-1080Ti": DeviceSpec(11.3e12, 11 * GIB, 484e9),
    "T4": DeviceSpec(8.1e12, 16 * GIB, 320e9),
    "H100-SXM5-80GB": DeviceSpec(67e12, 80 * GIB, 3.35e12),
}


def make_device(name: str, device_type: str, machine: str, memory_bytes: int | None = None) -> Device:
    """A :class:`Device` with the catalogue figures of ``device_type``.

    Args:
        name: the device's node name.
        device_type: a key of :data:`DEVICE_TYPES`.
        machine: the machine name.
        memory_bytes: overrides the catalogue memory size when given.

    Raises:
        UnknownNameError: if ``device_type`` is not in the catalogue.
    """
    if device_type not in DEVICE_TYPES:
        raise UnknownNameError("device type", device_type, DEVICE_TYPES)
    spec = DEVICE_TYPES[device_type]
    return Device(
        name=name,
        device_type=device_type,
        machine=machine,
        peak_flops=spec.peak_flops,
        memory_bytes=spec.memory_bytes if memory_bytes is None else memory_bytes,
        memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
    )


# ----------------------------------------------------------------------------------------- topology
# A route in node indices: (bottleneck bandwidth, latency, node path, link path).
_Label = tuple[float, float, tuple[int, ...], tuple[int, ...]]


class DeviceTopology:
    """A validated, immutable cluster description with cached routing.

    Args:
        name: a label, e.g. the preset name.
        devices: the compute devices; node names must be unique across devices and switches.
        links: the links; both endpoints must be devices or switches.
        switches: the non-compute network nodes (PCIe switch, NIC, NVSwitch, IB/Ethernet switch).

    Raises:
        ValueError: naming the offending device, link or value when there is no device, names repeat,
            a link endpoint does not exist, a bandwidth is not a finite positive number, a latency is
            negative, a device's memory / peak FLOP/s / memory bandwidth is not positive, or some
            devices cannot reach each other.
    """

    def __init__(
        self, name: str, devices: Sequence[Device], links: Sequence[Link], switches: Sequence[str] = ()
    ) -> None:
        if not isinstance(name, str):
            raise ValueError(f"topology name {name!r}: expected a string")
        devices, links, switches = tuple(devices), tuple(links), tuple(switches)
        if not devices:
            raise ValueError(f"topology {name!r} has no device; expected at least one")
        for device in devices:
            _validate_device(device)
        nodes: dict[str, int] = {}
        for i, node in enumerate([d.name for d in devices] + list(switches)):
            if not isinstance(node, str) or not node:
                raise ValueError(f"switch name {node!r}: expected a non-empty string")
            if node in nodes:
                raise ValueError(
                    f"duplicate node name {node!r}: device and switch names must be unique across the topology"
                )
            nodes[node] = i
        for i, link in enumerate(links):
            _validate_link(i, link, nodes)

        self._name = name
        self._devices = devices
        self._links = links
        self._switches = switches
        self._node_index = nodes
        self._node_names: tuple[str, ...] = tuple(nodes)
        # adjacency: node -> [(neighbour, link index, bandwidth, latency)]
        self._adjacency: list[list[tuple[int, int, float, float]]] = [[] for _ in nodes]
        for i, link in enumerate(links):
            a, b = nodes[link.a], nodes[link.b]
            self._adjacency[a].append((b, i, link.bandwidth_bytes_per_s, link.latency_s))
            self._adjacency[b].append((a, i, link.bandwidth_bytes_per_s, link.latency_s))
        # rank of each node in name order: comparing rank tuples == comparing name tuples
        by_name = sorted(range(len(nodes)), key=lambda n: self._node_names[n])
        self._rank = [0] * len(nodes)
        for rank, node in enumerate(by_name):
            self._rank[node] = rank
        self._check_connected()

        self._key = (name, devices, links, switches)
        self._hash = hash(self._key)
        self._labels: dict[int, dict[int, _Label]] = {}
        self._routes: dict[tuple[int, int], Route] = {}
        self._matrices: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ data
    @property
    def name(self) -> str:
        return self._name

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    @property
    def links(self) -> tuple[Link, ...]:
        return self._links

    @property
    def switches(self) -> tuple[str, ...]:
        return self._switches

    @property
    def num_devices(self) -> int:
        return len(self._devices)

    def device(self, name: str) -> Device:
        """The device called ``name``.

        Raises:
            UnknownNameError: (kind ``"device"``) listing the device names if there is none.
        """
        index = self._node_index.get(name)
        if index is None or index >= len(self._devices):
            raise UnknownNameError("device", name, [d.name for d in self._devices])
        return self._devices[index]

    def device_index(self, name: str) -> int:
        """Position of device ``name`` in :attr:`devices` (rows/columns of the matrices)."""
        self.device(name)
        return self._node_index[name]

    def machines(self) -> dict[str, tuple[Device, ...]]:
        """Machine name -> its devices in device order; machines in order of first appearance."""
        groups: dict[str, list[Device]] = {}
        for device in self._devices:
            groups.setdefault(device.machine, []).append(device)
        return {machine: tuple(group) for machine, group in groups.items()}

    # --------------------------------------------------------------- routing
    def route(self, src: str, dst: str) -> Route:
        """The route between two nodes (devices or switches); computed per source on first use, cached.

        Raises:
            UnknownNameError: if ``src`` or ``dst`` is not a node of the topology.
            ValueError: if ``dst`` cannot be reached from ``src`` (only possible for a dangling switch).
        """
        s, t = self._node(src), self._node(dst)
        route = self._routes.get((s, t))
        if route is None:
            label = self._labels_from(s).get(t)
            if label is None:
                raise ValueError(f"topology {self._name!r}: no route from {src!r} to {dst!r}; they are not connected")
            bandwidth, latency, path, links = label
            names = self._node_names
            route = self._routes[s, t] = Route(src, dst, tuple(names[n] for n in path), links, bandwidth, latency)
        return route

    def bandwidth_matrix(self) -> np.ndarray:
        """(num_devices, num_devices) float64 route bottleneck bandwidths in bytes/s; diagonal ``inf``.

        The array is cached and read-only; copy it to modify.
        """
        return self._device_matrices()[0]

    def latency_matrix(self) -> np.ndarray:
        """(num_devices, num_devices) float64 route latencies in seconds; diagonal 0 (read-only, cached)."""
        return self._device_matrices()[1]

    def _node(self, name: str) -> int:
        index = self._node_index.get(name)
        if index is None:
            raise UnknownNameError(f"node of topology {self._name!r}", name, self._node_names)
        return index

    def _device_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        if self._matrices is None:
            n = self.num_devices
            bandwidth = np.empty((n, n), dtype=np.float64)
            latency = np.empty((n, n), dtype=np.float64)
            for i in range(n):
                labels = self._labels_from(i)  # devices are nodes 0 .. n-1
                for j in range(n):
                    bandwidth[i, j], latency[i, j] = labels[j][:2]
            bandwidth.setflags(write=False)
            latency.setflags(write=False)
            self._matrices = (bandwidth, latency)
        return self._matrices

    def _labels_from(self, s: int) -> dict[int, _Label]:
        """Best path from node ``s`` to every reachable node, as (bandwidth, latency, nodes, links); cached.

        The widest-path bandwidth ``W(t)`` of every node is found first (max-min Dijkstra). Then, for
        each distinct value ``w`` of ``W``, a Dijkstra on (latency, hops, name path) restricted to
        links of bandwidth >= ``w`` settles the nodes with ``W(t) == w``: their best path in that
        subgraph has bottleneck exactly ``w`` and the lowest latency, hop count and name path among
        the widest paths. (Ranking the combined label in a single Dijkstra would be wrong: a prefix
        that is wider but slower can lose its advantage after a narrow link.)
        """
        labels = self._labels.get(s)
        if labels is None:
            targets: dict[float, set[int]] = {}
            for t, w in enumerate(self._widest_bandwidths(s)):
                if t != s and w > 0:
                    targets.setdefault(w, set()).add(t)
            labels = {s: (math.inf, 0.0, (s,), ())}
            for w, nodes in targets.items():
                for t, (latency, path, links) in self._shortest_paths(s, w, nodes).items():
                    labels[t] = (w, latency, path, links)
            self._labels[s] = labels
        return labels

    def _widest_bandwidths(self, s: int) -> list[float]:
        """Maximum bottleneck bandwidth from ``s`` to each node (0 when unreachable, inf for ``s``)."""
        best = [0.0] * len(self._node_names)
        best[s] = math.inf
        heap = [(-math.inf, s)]
        while heap:
            neg, u = heapq.heappop(heap)
            if -neg < best[u]:
                continue
            for v, _, bandwidth, _ in self._adjacency[u]:
                width = min(-neg, bandwidth)
                if width > best[v]:
                    best[v] = width
                    heapq.heappush(heap, (-width, v))
        return best

    def _shortest_paths(
        self, s: int, min_bandwidth: float, targets: set[int]
    ) -> dict[int, tuple[float, tuple[int, ...], tuple[int, ...]]]:
        """Best (latency, hops, name path) paths from ``s`` over links >= ``min_bandwidth``.

        Returns:
            target -> (latency, node path, link path) for each node of ``targets``.
        """
        rank = self._rank
        remaining = set(targets)
        best: dict[int, tuple[float, int, tuple[int, ...]]] = {s: (0.0, 0, (rank[s],))}
        heap: list[tuple[float, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = [
            (0.0, 0, (rank[s],), (s,), ())
        ]
        settled: set[int] = set()
        found: dict[int, tuple[float, tuple[int, ...], tuple[int, ...]]] = {}
        while heap and remaining:
            latency, hops, ranks, path, links = heapq.heappop(heap)
            u = path[-1]
            if u in settled:
                continue
            settled.add(u)
            if u in remaining:
                remaining.discard(u)
                found[u] = (latency, path, links)
            for v, link, bandwidth, link_latency in self._adjacency[u]:
                if bandwidth < min_bandwidth or v in settled:
                    continue
                label = (latency + link_latency, hops + 1, ranks + (rank[v],))
                if v not in best or label < best[v]:
                    best[v] = label
                    heapq.heappush(heap, (*label, path + (v,), links + (link,)))
        return found

    def _check_connected(self) -> None:
        seen = {0}
        stack = [0]
        while stack:
            for v, *_ in self._adjacency[stack.pop()]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        unreachable = [d.name for i, d in enumerate(self._devices) if i not in seen]
        if unreachable:
            raise ValueError(
                f"topology {self._name!r} is disconnected: devices {unreachable} cannot be reached from "
                f"{self._devices[0].name!r}; every device must be reachable from every other device"
            )

    # ------------------------------------------------------------ reporting
    def summary(self) -> str:
        """A few human-readable lines: machines, device types, links by kind with GB/s."""
        machines = self.machines()
        lines = [
            f"topology {self._name}: {self.num_devices} devices on {len(machines)} machines, "
            f"{len(self._switches)} switches, {len(self._links)} links"
        ]
        for machine, devices in machines.items():
            counts: dict[str, int] = {}
            for d in devices:
                counts[d.device_type] = counts.get(d.device_type, 0) + 1
            lines.append(f"  {machine}: " + ", ".join(f"{n} x {t}" for t, n in counts.items()))
        types: dict[str, Device] = {}
        for d in self._devices:
            types.setdefault(d.device_type, d)
        for t, d in types.items():
            lines.append(
                f"  {t}: {d.peak_flops / 1e12:g} TFLOP/s fp32, {d.memory_bytes / GIB:g} GiB, "
                f"{d.memory_bandwidth_bytes_per_s / 1e9:g} GB/s memory"
            )
        by_kind: dict[str, list[float]] = {}
        for link in self._links:
            by_kind.setdefault(link.kind, []).append(link.bandwidth_bytes_per_s)
        for kind, bandwidths in by_kind.items():
            low, high = min(bandwidths) / 1e9, max(bandwidths) / 1e9
            speed = f"{low:g} GB/s" if low == high else f"{low:.3g}-{high:.3g} GB/s"
            lines.append(f"  {kind} links: {len(bandwidths)} at {speed} per direction")
        return "\n".join(lines)

    # -------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceTopology) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (
            f"DeviceTopology({self._name!r}, devices={self.num_devices}, "
            f"switches={len(self._switches)}, links={len(self._links)})"
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON document (format ``placement_rl.topology``, schema version 1)."""
        return {
            "format": TOPOLOGY_FORMAT,
            "schema_version": TOPOLOGY_SCHEMA_VERSION,
            "name": self._name,
            "devices": [
                {
                    "name": d.name,
                    "device_type": d.device_type,
                    "machine": d.machine,
                    "peak_flops": float(d.peak_flops),
                    "memory_bytes": int(d.memory_bytes),
                    "memory_bandwidth_bytes_per_s": float(d.memory_bandwidth_bytes_per_s),
                }
                for d in self._devices
            ],
            "switches": list(self._switches),
            "links": [
                {
                    "a": link.a,
                    "b": link.b,
                    "bandwidth_bytes_per_s": float(link.bandwidth_bytes_per_s),
                    "latency_s": float(link.latency_s),
                    "kind": link.kind,
                }
                for link in self._links
            ],
        }

    @classmethod
    def from_dict(cls, document: Any) -> DeviceTopology:
        """Rebuild a topology from :meth:`to_dict` output, validating the schema and the topology.

        Raises:
            SchemaError: for a wrong header, unknown or missing keys, or values of the wrong type,
                naming the field (e.g. ``topology.devices[2].memory_bytes``).
            ValueError: if the values do not form a valid topology (see :class:`DeviceTopology`).
        """
        check_header(document, TOPOLOGY_FORMAT, (TOPOLOGY_SCHEMA_VERSION,))
        check_keys(document, "topology", {"format", "schema_version", "name", "devices", "links"}, {"switches"})
        devices = []
        for i, d in enumerate(as_list(document["devices"], "topology.devices")):
            where = f"topology.devices[{i}]"
            check_keys(d, where, _DEVICE_FIELDS)
            devices.append(
                Device(
                    name=as_str(d["name"], f"{where}.name"),
                    device_type=as_str(d["device_type"], f"{where}.device_type"),
                    machine=as_str(d["machine"], f"{where}.machine"),
                    peak_flops=as_float(d["peak_flops"], f"{where}.peak_flops"),
                    memory_bytes=as_int(d["memory_bytes"], f"{where}.memory_bytes"),
                    memory_bandwidth_bytes_per_s=as_float(
                        d["memory_bandwidth_bytes_per_s"], f"{where}.memory_bandwidth_bytes_per_s"
                    ),
                )
            )
        switches = [
            as_str(s, f"topology.switches[{i}]")
            for i, s in enumerate(as_list(document.get("switches", []), "topology.switches"))
        ]
        links = []
        for i, d in enumerate(as_list(document["links"], "topology.links")):
            where = f"topology.links[{i}]"
            check_keys(d, where, _LINK_FIELDS)
            kind = as_str(d["kind"], f"{where}.kind")
            if kind not in LINK_KINDS:
                raise SchemaError(f"{where}.kind: {kind!r}; expected one of {list(LINK_KINDS)}")
            links.append(
                Link(
                    a=as_str(d["a"], f"{where}.a"),
                    b=as_str(d["b"], f"{where}.b"),
                    bandwidth_bytes_per_s=as_float(d["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s"),
                    latency_s=as_float(d["latency_s"], f"{where}.latency_s"),
                    kind=kind,  # type: ignore[arg-type]
                )
            )
        return cls(as_str(document["name"], "topology.name"), devices, links, switches)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON document to ``path`` (atomically)."""
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> DeviceTopology:
        """Read a topology JSON file (see :meth:`from_dict` for the errors)."""
        return cls.from_dict(read_json(path))


_DEVICE_FIELDS = {"name", "device_type", "machine", "peak_flops", "memory_bytes", "memory_bandwidth_bytes_per_s"}
_LINK_FIELDS = {"a", "b", "bandwidth_bytes_per_s", "latency_s", "kind"}


# ------------------------------------------------------------------------------------- validation
def _validate_device(d: Device) -> None:
    if not isinstance(d, Device):
        raise ValueError(f"{d!r}: expected a Device")
    for attr in ("name", "device_type", "machine"):
        value = getattr(d, attr)
        if not isinstance(value, str) or not value:
            raise ValueError(f"device {d.name!r}: {attr} = {value!r}; expected a non-empty string")
    if isinstance(d.memory_bytes, bool) or not isinstance(d.memory_bytes, int) or d.memory_bytes <= 0:
        raise ValueError(f"device {d.name!r}: memory_bytes = {d.memory_bytes!r}; expected a positive integer")
    for attr in ("peak_flops", "memory_bandwidth_bytes_per_s"):
        _check_number(getattr(d, attr), f"device {d.name!r}: {attr}", positive=True)


def _validate_link(i: int, link: Link, nodes: dict[str, int]) -> None:
    if not isinstance(link, Link):
        raise ValueError(f"links[{i}] = {link!r}: expected a Link")
    where = f"link {i} ({link.a!r} <-> {link.b!r})"
    for end in (link.a, link.b):
        if end not in nodes:
            raise ValueError(f"{where}: endpoint {end!r} is not a device or switch of the topology")
    if link.a == link.b:
        raise ValueError(f"{where}: joins {link.a!r} to itself; expected two different nodes")
    _check_number(link.bandwidth_bytes_per_s, f"{where}: bandwidth_bytes_per_s", positive=True)
    _check_number(link.latency_s, f"{where}: latency_s", positive=False)
    if link.kind not in LINK_KINDS:
        raise ValueError(f"{where}: kind {link.kind!r}; expected one of {list(LINK_KINDS)}")


def _check_number(value: Any, where: str, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        expected = "a finite number > 0" if positive else "a finite number >= 0"
        raise ValueError(f"{where} = {value!r}; expected {expected}")


# ---------------------------------------------------------------------------------------- builders
class _Builder:
    """Accumulates machines, switches and links; machines are named ``m0``, ``m1``, ... in order."""

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.links: list[Link] = []
        self.switches: list[str] = []
        self.num_machines = 0

    def machine(self, device_type: str, count: int, memory_bytes: int | None = None) -> tuple[str, list[str]]:
        """Add machine ``m{i}`` with ``count`` devices ``m{i}/gpu{j}``; returns (machine, device names)."""
        machine = f"m{self.num_machines}"
        self.num_machines += 1
        names = [f"{machine}/gpu{j}" for j in range(count)]
        self.devices += [make_device(n, device_type, machine, memory_bytes) for n in names]
        return machine, names

    def switch(self, name: str) -> str:
        self.switches.append(name)
        return name

    def link(self, a: str, b: str, bandwidth_bytes_per_s: float, kind: LinkKind) -> None:
        self.links.append(Link(a, b, bandwidth_bytes_per_s, LINK_LATENCY_S[kind], kind))

    def star(self, hub: str, members: Sequence[str], bandwidth_bytes_per_s: float, kind: LinkKind) -> None:
        """Join ``hub`` to every member."""
        for member in members:
            self.link(member, hub, bandwidth_bytes_per_s, kind)

    def fully_connected(self, members: Sequence[str], bandwidth_bytes_per_s: float, kind: LinkKind) -> None:
        """Join every pair of members directly."""
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                self.link(a, b, bandwidth_bytes_per_s, kind)

    def build(self, name: str) -> DeviceTopology:
        return DeviceTopology(name, self.devices, self.links, self.switches)


_Uplink = tuple[str, float, LinkKind]  # (central switch, bandwidth bytes/s, link kind)


def _switched_machine(
    b: _Builder,
    device_type: str,
    count: int,
    uplink: _Uplink | None,
    nvlink_bytes_per_s: float | None = None,
    switch_suffix: str = "pcie",
    memory_bytes: int | None = None,
) -> None:
    """A machine whose GPUs sit on one PCIe switch ``m{i}/{switch_suffix}`` (12e9 B/s per GPU).

    Args:
        b: the builder to add to.
        device_type: catalogue name of the GPUs.
        count: number of GPUs.
        uplink: (central switch, bandwidth, kind) joining the PCIe switch to the network, or None.
        nvlink_bytes_per_s: when given, every GPU pair is also joined directly by NVLink.
        switch_suffix: name of the machine's switch node after ``m{i}/``.
        memory_bytes: overrides the catalogue memory.
    """
    machine, gpus = b.machine(device_type, count, memory_bytes)
    if nvlink_bytes_per_s is not None:
        b.fully_connected(gpus, nvlink_bytes_per_s, "nvlink")
    hub = b.switch(f"{machine}/{switch_suffix}")
    b.star(hub, gpus, PCIE3_X16_BYTES_PER_S, "pcie")
    if uplink is not None:
        central, bandwidth, kind = uplink
        b.link(hub, central, bandwidth, kind)


# ----------------------------------------------------------------------------------------- presets
def _flexflow_p100() -> DeviceTopology:
    """FlexFlow's P100 cluster: 4 machines x 4 P100-SXM2-16GB.

    Inside a machine every GPU pair is joined directly by NVLink at 20 GB/s per direction. Each
    machine has a NIC node ``m{i}/nic`` joined to every GPU by PCIe 3.0 x16 (12e9 B/s); the NICs join
    a central ``ib-switch`` by 100 Gb/s InfiniBand.
    """
    b = _Builder()
    ib = b.switch("ib-switch")
    for _ in range(4):
        uplink: _Uplink = (ib, gbit_to_bytes_per_s(100), "infiniband")
        _switched_machine(b, "P100-SXM2-16GB", 4, uplink, nvlink_bytes_per_s=20e9, switch_suffix="nic")
    return b.build("flexflow-p100")


def _flexflow_k80() -> DeviceTopology:
    """FlexFlow's K80 cluster: 16 machines x 4 K80 GPUs (64 devices).

    Per machine, two PCIe switches ``m{i}/pcie0`` (gpu0, gpu1) and ``m{i}/pcie1`` (gpu2, gpu3) with
    12e9 B/s per GPU link, both joined at 12e9 B/s to a host switch ``m{i}/host``, which joins the
    central ``ib-switch`` by 56 Gb/s InfiniBand (FDR). GPUs on different PCIe switches of one machine
    therefore share the host switch.
    """
    b = _Builder()
    ib = b.switch("ib-switch")
    for _ in range(16):
        machine, gpus = b.machine("K80", 4)
        host = b.switch(f"{machine}/host")
        for k, pair in enumerate((gpus[:2], gpus[2:])):
            pcie = b.switch(f"{machine}/pcie{k}")
            b.star(pcie, pair, PCIE3_X16_BYTES_PER_S, "pcie")
            b.link(pcie, host, PCIE3_X16_BYTES_PER_S, "pcie")
        b.link(host, ib, gbit_to_bytes_per_s(56), "infiniband")
    return b.build("flexflow-k80")


def _tag_testbed() -> DeviceTopology:
    """TAG's heterogeneous testbed: 7 machines, 16 GPUs.

    ``m0`` has 4 V100-SXM2-32GB with all-pairs NVLink at 25 GB/s (NVLink 2.0, per link per direction;
    the real machine's hybrid cube mesh is simplified to all pairs) and reaches the network through a
    PCIe switch ``m0/pcie`` (12e9 B/s per GPU). ``m1``-``m4`` have 2 GTX-1080Ti and ``m5``-``m6`` 2
    P100-PCIE-12GB, each on a PCIe switch ``m{i}/pcie`` at 12e9 B/s per GPU. Every machine's PCIe
    switch joins a central ``eth-switch`` at 100 Gb/s (kind ``ethernet``).
    """
    b = _Builder()
    eth: _Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(100), "ethernet")
    _switched_machine(b, "V100-SXM2-32GB", 4, eth, nvlink_bytes_per_s=25e9)
    for device_type in ["GTX-1080Ti"] * 4 + ["P100-PCIE-12GB"] * 2:
        _switched_machine(b, device_type, 2, eth)
    return b.build("tag-testbed")


def _tag_cloud() -> DeviceTopology:
    """TAG's cloud setting: 6 machines, 32 GPUs, slow 10 Gb/s Ethernet between machines.

    ``m0``-``m1`` have 8 V100-SXM2-16GB with all-pairs NVLink at 25 GB/s (simplifying the hybrid cube
    mesh) plus a PCIe switch ``m{i}/pcie`` (12e9 B/s per GPU) to the network; ``m2``-``m5`` have 4 T4
    on a PCIe switch at 12e9 B/s. Every PCIe switch joins ``eth-switch`` at 10 Gb/s.
    """
    b = _Builder()
    eth: _Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    for _ in range(2):
        _switched_machine(b, "V100-SXM2-16GB", 8, eth, nvlink_bytes_per_s=25e9)
    for _ in range(4):
        _switched_machine(b, "T4", 4, eth)
    return b.build("tag-cloud")


def _tensoropt() -> DeviceTopology:
    """TensorOpt's cluster: 2 machines x 8 V100-SXM2-16GB.

    All GPU pairs of a machine are joined by NVLink at 25 GB/s (simplified hybrid cube mesh); each
    machine's GPUs sit on a PCIe switch ``m{i}/pcie`` (12e9 B/s) joined to ``ib-switch`` by
    100 Gb/s EDR InfiniBand. Cross-machine transfers are therefore bounded by PCIe (12e9 B/s).
    """
    b = _Builder()
    ib = b.switch("ib-switch")
    for _ in range(2):
        _switched_machine(b, "V100-SXM2-16GB", 8, (ib, gbit_to_bytes_per_s(100), "infiniband"), nvlink_bytes_per_s=25e9)
    return b.build("tensoropt")


def _trinity() -> DeviceTopology:
    """Trinity's machine: 1 machine x 4 P100-PCIE-12GB on one PCIe switch ``m0/pcie`` (12e9 B/s).

    The device memory is 11 GiB rather than the datasheet's 12 GiB, as Trinity sec. 5 reports
    (usable memory); the device type name is kept as ``P100-PCIE-12GB``.
    """
    b = _Builder()
    _switched_machine(b, "P100-PCIE-12GB", 4, None, memory_bytes=11 * GIB)
    return b.build("trinity")


def _h100_2x8() -> DeviceTopology:
    """Two DGX-H100-like machines: 2 x 8 H100-SXM5-80GB.

    Each machine has an NVSwitch node ``m{i}/nvswitch`` joined to each GPU at 450 GB/s per direction
    (kind ``nvswitch``; 900 GB/s is the bidirectional figure). Each GPU has its own 400 Gb/s NIC into
    a rail-optimized fabric, modelled as one central ``ib-switch``: a link GPU <-> ``ib-switch`` of
    kind ``infiniband`` at 50e9 B/s. Routing uses the NVSwitch inside a machine because it is wider.
    """
    b = _Builder()
    ib = b.switch("ib-switch")
    for _ in range(2):
        machine, gpus = b.machine("H100-SXM5-80GB", 8)
        b.star(b.switch(f"{machine}/nvswitch"), gpus, 450e9, "nvswitch")
        b.star(ib, gpus, gbit_to_bytes_per_s(400), "infiniband")
    return b.build("h100-2x8")


_PRESETS: dict[str, Callable[[], DeviceTopology]] = {
    "flexflow-p100": _flexflow_p100,
    "flexflow-k80": _flexflow_k80,
    "tag-testbed": _tag_testbed,
    "tag-cloud": _tag_cloud,
    "tensoropt": _tensoropt,
    "trinity": _trinity,
    "h100-2x8": _h100_2x8,
}


def preset_names() -> list[str]:
    """Names of the cluster presets, in documentation order."""
    return list(_PRESETS)


@functools.cache
def load_preset(name: str) -> DeviceTopology:
    """The preset cluster called ``name`` (built once; topologies are immutable, so it is shared).

    Raises:
        UnknownNameError: (kind ``"topology preset"``) listing :func:`preset_names` if unknown.
    """
    if name not in _PRESETS:
        raise UnknownNameError("topology preset", name, preset_names())
    return _PRESETS[name]()


# ------------------------------------------------------------------------------ random topologies
#: Seeds of the training distribution.
TRAIN_SEEDS: range = range(0, 1_000_000)
#: Seeds of "unseen topologies": disjoint from :data:`TRAIN_SEEDS`.
TEST_SEEDS: range = range(1_000_000, 2_000_000)

RANDOM_DEVICE_TYPES: tuple[str, ...] = ("V100-SXM2-32GB", "GTX-1080Ti", "P100-PCIE-12GB")
RANDOM_MACHINES = (1, 6)  # inclusive
RANDOM_GPUS_PER_MACHINE = (1, 8)  # inclusive
RANDOM_INTRA_GBIT_PER_S = (64.0, 160.0)
RANDOM_INTER_GBIT_PER_S = (20.0, 50.0)
RANDOM_NVLINK_MIN_GBIT_PER_S = 100.0


def random_topology(seed: int) -> DeviceTopology:
    """A random cluster from TAG's distribution (TAG sec. 5.2), named ``f"random-{seed}"``.

    Draws, with ``np.random.default_rng(seed)`` only: 1-6 machines; per machine one device type among
    :data:`RANDOM_DEVICE_TYPES` and 1-8 GPUs of it; an intra-machine bandwidth uniform in
    [64, 160] Gb/s, realised as a switch ``m{i}/switch`` joined to each GPU (kind ``nvlink`` when
    >= 100 Gb/s, else ``pcie``: faster than PCIe 3.0 x16 implies NVLink); and an inter-machine
    bandwidth uniform in [20, 50] Gb/s joining the switch to a central ``net-switch`` (kind
    ``ethernet``). The central switch exists even for a single machine. Latencies follow
    :data:`LINK_LATENCY_S` by kind.

    Args:
        seed: a non-negative integer; the same seed gives an identical (``==``) topology.

    Raises:
        ValueError: if ``seed`` is not a non-negative integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"random topology seed {seed!r}: expected a non-negative integer")
    seed = int(seed)
    rng = np.random.default_rng(seed)
    b = _Builder()
    net = b.switch("net-switch")
    for _ in range(int(rng.integers(RANDOM_MACHINES[0], RANDOM_MACHINES[1] + 1))):
        device_type = RANDOM_DEVICE_TYPES[int(rng.integers(len(RANDOM_DEVICE_TYPES)))]
        count = int(rng.integers(RANDOM_GPUS_PER_MACHINE[0], RANDOM_GPUS_PER_MACHINE[1] + 1))
        intra_gbit = float(rng.uniform(*RANDOM_INTRA_GBIT_PER_S))
        inter_gbit = float(rng.uniform(*RANDOM_INTER_GBIT_PER_S))
        machine, gpus = b.machine(device_type, count)
        hub = b.switch(f"{machine}/switch")
        kind: LinkKind = "nvlink" if intra_gbit >= RANDOM_NVLINK_MIN_GBIT_PER_S else "pcie"
        b.star(hub, gpus, gbit_to_bytes_per_s(intra_gbit), kind)
        b.link(hub, net, gbit_to_bytes_per_s(inter_gbit), "ethernet")
    return b.build(f"random-{seed}")


def topology_seeds(split: Literal["train", "test"], count: int, start: int = 0) -> list[int]:
    """``count`` consecutive seeds of a split, from offset ``start`` within it.

    Args:
        split: ``"train"`` (:data:`TRAIN_SEEDS`) or ``"test"`` (:data:`TEST_SEEDS`, unseen topologies).
        count: how many seeds (>= 0).
        start: offset of the first seed within the split's range (>= 0).

    Raises:
        UnknownNameError: for another split.
        ValueError: if ``count`` or ``start`` is negative or the seeds would leave the split's range.
    """
    ranges = {"train": TRAIN_SEEDS, "test": TEST_SEEDS}
    if split not in ranges:
        raise UnknownNameError("seed split", split, ranges)
    seeds = ranges[split]
    for label, value in (("count", count), ("start", start)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"topology_seeds {label} = {value!r}; expected a non-negative integer")
    if start + count > len(seeds):
        raise ValueError(f"topology_seeds({split!r}, count={count}, start={start}) leaves the {split} range {seeds}")
    return list(seeds[start : start + count])


def resolve_topology(spec: str) -> DeviceTopology:
    """Turn a command-line string into a topology.

    Args:
        spec: a preset name (:func:`preset_names`), ``"random:SEED"`` with a non-negative integer
            seed, or a path to a ``.json`` topology file.

    Raises:
        UnknownNameError: (a ``ValueError``) listing the accepted forms when ``spec`` is none of them.
        ValueError: for a malformed ``random:`` seed or an invalid topology file.
        FileNotFoundError: for a ``.json`` path that does not exist.
    """
    if not isinstance(spec, str):
        raise ValueError(f"topology spec {spec!r}: expected a string")
    if spec in _PRESETS:
        return load_preset(spec)
    if spec.startswith("random:"):
        text = spec[len("random:") :]
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"topology spec {spec!r}: expected 'random:SEED' with a non-negative integer SEED")
        return random_topology(int(text))
    if spec.endswith(".json") or Path(spec).is_file():
        return DeviceTopology.from_json(spec)
    raise UnknownNameError("topology", spec, [*preset_names(), "random:SEED", "PATH.json"])
