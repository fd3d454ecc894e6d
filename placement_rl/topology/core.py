"""The cluster data model: devices, switches and links, with deterministic widest-path routing.

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

The JSON document (``format: placement_rl.topology``, ``schema_version: 1``)::

    {"format": "placement_rl.topology", "schema_version": 1, "name": "...",
     "devices": [{"name", "device_type", "machine", "peak_flops", "memory_bytes",
                  "memory_bandwidth_bytes_per_s", "peak_flops_by_dtype" (optional)}, ...],
     "switches": ["...", ...],
     "links": [{"a", "b", "bandwidth_bytes_per_s", "latency_s", "kind"}, ...]}
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.io import as_float, as_int, as_list, as_str, check_header, check_keys, read_json, write_json

LinkKind = Literal["nvlink", "nvswitch", "pcie", "infiniband", "ethernet"]
LINK_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "infiniband", "ethernet")

TOPOLOGY_FORMAT = "placement_rl.topology"
TOPOLOGY_SCHEMA_VERSION = 1

#: The most devices a topology may have: every command routes between all of them (an ``NxM`` string or
#: a file with more is refused before anything is built). The largest preset, ``dgx-h100-x512``, has 4,096.
MAX_TOPOLOGY_DEVICES = 100_000

#: Bounds of a device's and a link's figures (a topology beyond them is refused, naming the value): rates
#: from 1 per second up to 1e18 FLOP/s per device (a GB200's sparse fp4 is 2e16) and 1e15 bytes/s per link
#: or memory (NVLink 5 is 1.8e12), memory up to 1e15 bytes, latencies up to an hour. Within them every
#: simulated time stays a finite float.
MAX_PEAK_FLOPS = 1e18
MAX_BANDWIDTH_BYTES_PER_S = 1e15
MAX_MEMORY_BYTES = 10**15
MAX_LATENCY_S = 3600.0
MIN_RATE = 1.0

#: Compute dtypes a device may have a peak for. ``fp32`` is :attr:`Device.peak_flops`; the others are
#: optional entries of :attr:`Device.peak_flops_by_dtype` (tensor-core rates where the GPU has them).
COMPUTE_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")


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
        peak_flops_by_dtype: dense peak FLOP/s of the other compute dtypes the device has, as
            ``(dtype, flops)`` pairs sorted by dtype, dtypes from :data:`COMPUTE_DTYPES` other than
            ``fp32`` (e.g. ``(("bf16", 989e12), ("fp16", 989e12), ("tf32", 494.7e12))``). Empty: fp32
            only; a precision computing in a dtype the device lacks is refused by the cost model.
    """

    name: str
    device_type: str
    machine: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops_by_dtype: tuple[tuple[str, float], ...] = ()

    def peak_flops_for(self, dtype: str) -> float | None:
        """Peak FLOP/s computing in ``dtype`` (``fp32``: :attr:`peak_flops`), ``None`` if the device lacks it.

        Raises:
            UnknownNameError: if ``dtype`` is not in :data:`COMPUTE_DTYPES`.
        """
        if dtype not in COMPUTE_DTYPES:
            raise UnknownNameError("compute dtype", dtype, COMPUTE_DTYPES)
        if dtype == "fp32":
            return self.peak_flops
        return dict(self.peak_flops_by_dtype).get(dtype)


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
        ValueError: naming the offending device, link or value when there is no device or more than
            :data:`MAX_TOPOLOGY_DEVICES`, names repeat, a link endpoint does not exist or a link joins a
            node to itself, a bandwidth, peak FLOP/s or memory is not a number within its bounds
            (:data:`MIN_RATE`, :data:`MAX_BANDWIDTH_BYTES_PER_S`, :data:`MAX_PEAK_FLOPS`,
            :data:`MAX_MEMORY_BYTES`), a latency is negative or over :data:`MAX_LATENCY_S`, or some
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
        if len(devices) > MAX_TOPOLOGY_DEVICES:
            raise ValueError(
                f"topology {name!r} has {len(devices):,} devices; expected at most {MAX_TOPOLOGY_DEVICES:,}"
            )
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
        for position, index in enumerate(by_name):
            self._rank[index] = position
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
            f"topology {self._name}: {_count(self.num_devices, 'device')} on {_count(len(machines), 'machine')}, "
            f"{_count(len(self._switches), 'switch', 'switches')}, {_count(len(self._links), 'link')}"
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
            by_dtype = sorted(d.peak_flops_by_dtype, key=lambda pair: COMPUTE_DTYPES.index(pair[0]))
            others = "".join(f", {f / 1e12:g} {dtype}" for dtype, f in by_dtype)
            lines.append(
                f"  {t}: {d.peak_flops / 1e12:g} TFLOP/s fp32{others}, {d.memory_bytes / 2**30:g} GiB, "
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
            "devices": [_device_dict(d) for d in self._devices],
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
            check_keys(d, where, _DEVICE_FIELDS, {"peak_flops_by_dtype"})
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
                    peak_flops_by_dtype=_dtype_peaks(d.get("peak_flops_by_dtype", {}), f"{where}.peak_flops_by_dtype"),
                )
            )
            try:
                _validate_device(devices[-1])
            except ValueError as exc:
                raise SchemaError(f"{where}: {exc}") from None
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
            bandwidth = as_float(d["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s")
            _check_number(d["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s", True, MAX_BANDWIDTH_BYTES_PER_S)
            latency = as_float(d["latency_s"], f"{where}.latency_s")
            _check_number(d["latency_s"], f"{where}.latency_s", False, MAX_LATENCY_S)
            links.append(
                Link(
                    a=as_str(d["a"], f"{where}.a"),
                    b=as_str(d["b"], f"{where}.b"),
                    bandwidth_bytes_per_s=bandwidth,
                    latency_s=latency,
                    kind=kind,  # type: ignore[arg-type]
                )
            )
        return cls(as_str(document["name"], "topology.name"), devices, links, switches)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON document to ``path`` (atomically)."""
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> DeviceTopology:
        """Read a topology JSON file (see :meth:`from_dict` for the errors; each names the file)."""
        document = read_json(path)
        try:
            return cls.from_dict(document)
        except ValueError as exc:
            raise SchemaError(f"{path}: {exc}") from None


_DEVICE_FIELDS = {"name", "device_type", "machine", "peak_flops", "memory_bytes", "memory_bandwidth_bytes_per_s"}


def _device_dict(d: Device) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": d.name,
        "device_type": d.device_type,
        "machine": d.machine,
        "peak_flops": float(d.peak_flops),
        "memory_bytes": int(d.memory_bytes),
        "memory_bandwidth_bytes_per_s": float(d.memory_bandwidth_bytes_per_s),
    }
    if d.peak_flops_by_dtype:  # optional: a device without it writes the schema's original fields only
        document["peak_flops_by_dtype"] = {dtype: float(f) for dtype, f in d.peak_flops_by_dtype}
    return document


def _dtype_peaks(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``{"bf16": 9.9e14, ...}`` as the sorted pairs of :attr:`Device.peak_flops_by_dtype`."""
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: expected an object of dtype -> FLOP/s, got {type(value).__name__}")
    return tuple(sorted((dtype, as_float(f, f"{where}.{dtype}")) for dtype, f in value.items()))


_LINK_FIELDS = {"a", "b", "bandwidth_bytes_per_s", "latency_s", "kind"}


# ------------------------------------------------------------------------------------- validation
def _validate_device(d: Device) -> None:
    if not isinstance(d, Device):
        raise ValueError(f"{d!r}: expected a Device")
    for attr in ("name", "device_type", "machine"):
        value = getattr(d, attr)
        if not isinstance(value, str) or not value:
            raise ValueError(f"device {d.name!r}: {attr} = {value!r}; expected a non-empty string")
    memory = d.memory_bytes
    if isinstance(memory, bool) or not isinstance(memory, int) or not 0 < memory <= MAX_MEMORY_BYTES:
        shown = repr(memory) if len(repr(memory)) <= 40 else f"{repr(memory)[:20]}... ({len(repr(memory))} digits)"
        raise ValueError(
            f"device {d.name!r}: memory_bytes = {shown}; expected a positive integer of at most {MAX_MEMORY_BYTES:.0e}"
        )
    _check_number(d.peak_flops, f"device {d.name!r}: peak_flops", positive=True, maximum=MAX_PEAK_FLOPS)
    _check_number(
        d.memory_bandwidth_bytes_per_s,
        f"device {d.name!r}: memory_bandwidth_bytes_per_s",
        positive=True,
        maximum=MAX_BANDWIDTH_BYTES_PER_S,
    )
    peaks = d.peak_flops_by_dtype
    if not isinstance(peaks, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in peaks):
        raise ValueError(f"device {d.name!r}: peak_flops_by_dtype = {peaks!r}; expected sorted (dtype, FLOP/s) pairs")
    dtypes = [dtype for dtype, _ in peaks]
    others = COMPUTE_DTYPES[1:]
    for dtype, flops in peaks:
        if dtype not in others:
            raise ValueError(
                f"device {d.name!r}: peak_flops_by_dtype has {dtype!r}; expected dtypes among {list(others)} "
                f"(fp32 is peak_flops)"
            )
        _check_number(
            flops, f"device {d.name!r}: peak_flops_by_dtype[{dtype!r}]", positive=True, maximum=MAX_PEAK_FLOPS
        )
    if dtypes != sorted(set(dtypes)):
        raise ValueError(f"device {d.name!r}: peak_flops_by_dtype dtypes {dtypes} must be sorted and distinct")


def _validate_link(i: int, link: Link, nodes: dict[str, int]) -> None:
    if not isinstance(link, Link):
        raise ValueError(f"links[{i}] = {link!r}: expected a Link")
    where = f"link {i} ({link.a!r} <-> {link.b!r})"
    for end in (link.a, link.b):
        if end not in nodes:
            raise ValueError(f"{where}: endpoint {end!r} is not a device or switch of the topology")
    if link.a == link.b:
        raise ValueError(f"{where}: joins {link.a!r} to itself; expected two different nodes")
    _check_number(
        link.bandwidth_bytes_per_s, f"{where}: bandwidth_bytes_per_s", positive=True, maximum=MAX_BANDWIDTH_BYTES_PER_S
    )
    _check_number(link.latency_s, f"{where}: latency_s", positive=False, maximum=MAX_LATENCY_S)
    if link.kind not in LINK_KINDS:
        raise ValueError(f"{where}: kind {link.kind!r}; expected one of {list(LINK_KINDS)}")


def _check_number(value: Any, where: str, positive: bool, maximum: float) -> None:
    """A rate (``positive``: from :data:`MIN_RATE`) or a latency (from 0) of at most ``maximum``; an integer
    too large for a float is refused, not an ``OverflowError``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))
    low = MIN_RATE if positive else 0.0
    if not ok or not low <= value <= maximum:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} digits)"
        expected = (
            f"a finite number > 0, from {MIN_RATE:g} to {maximum:.0e}"
            if positive
            else f"a finite number >= 0, at most {maximum:g}"
        )
        raise ValueError(f"{where} = {shown}; expected {expected}")


def _count(n: int, one: str, many: str | None = None) -> str:
    """``"1 machine"``, ``"2 machines"``."""
    return f"{n} {one if n == 1 else many or one + 's'}"
