"""An emulated cluster on this machine: one network namespace per device, Linux bridges and shaped veths.

**Shape.** The emulator builds what a switched cluster is: every device sits on its machine's switch
(one link, the device's PCIe or NIC port), every machine's switch has at most one uplink (its NIC)
into one core switch. That is :func:`switched_cluster`'s shape and the PCIe machines of the presets
(``trinity``). :func:`layout` checks a topology against it and refuses other shapes (a direct
GPU-GPU link such as NVLink, a second switch level) with an error naming the link.

**Namespaces.** Per run, with names that start with a unique prefix (``prlemu-<pid>-<token>-``):

* a fabric namespace (``...fab``) holding one bridge per machine (``bm<i>``, the machine's switch)
  and a core bridge (``core``, the cluster switch);
* one namespace per device (``...d<k>``, ``k`` the device's index in the topology) whose ``eth0`` is
  a veth into its machine's bridge (port ``d<k>`` in the fabric) with address ``10.213.0.<k+1>/24``;
* per machine, a veth from its bridge (port ``u<i>``) to the core bridge (port ``c<i>``): its NIC.

Nothing is created in the namespace this process runs in, so removing the run's namespaces removes
every link, bridge and qdisc it made (:meth:`EmulatedCluster.cleanup`).

**Shaping.** Every veth end shapes its egress (:func:`shaping_commands`), so each direction of each
topology link is shaped once: the device's ``eth0`` shapes device -> switch, the fabric port ``d<k>``
switch -> device, ``u<i>`` the machine's uplink and ``c<i>`` its downlink. Rates are the
topology's bandwidths times one scale factor (:attr:`Layout.scale`), chosen so that every link falls
in ``[min_mbit, max_mbit]`` (defaults 50-800 Mbit/s, rates two cores drive) with the slowest link at
``bottleneck_mbit`` where possible. A topology whose links differ by more than ``max_mbit / min_mbit``
is refused, naming the slowest and the fastest link. The kernel counts Ethernet frames (1514 bytes
carry 1448 bytes of TCP payload at MTU 1500, with timestamps), so a link is shaped
:data:`FRAME_OVERHEAD` faster than the payload rate it stands for. Latencies are scaled by
``1 / scale`` (time runs ``1 / scale`` times slower in the emulation, for compute and latency alike)
and applied with ``netem`` when the kernel has it; when it has not, latency is not shaped and the
emulated topology (:meth:`Layout.emulated_topology`) has latency 0: what remains is the stack's own,
tens of microseconds.

**TCP.** Each device namespace turns off ``net.ipv4.tcp_slow_start_after_idle`` (patterns are
separated by idle barriers, after which Linux would restart every connection from its initial
window; a GPU interconnect has no slow start) and caps a socket's send buffer at 1 MiB
(``net.ipv4.tcp_wmem``), and every shaped queue holds :data:`QUEUE_BYTES`: together they keep the
queues from overflowing when a dozen transfers meet at one port. Dropped packets made TCP time out
(200 ms at least) in all-to-all patterns; the emulated path's round trip is a fraction of a
millisecond, so 1 MiB in flight per connection keeps any link busy.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from placement_rl.topology import MAX_TOPOLOGY_DEVICES, DeviceTopology, Link, gbit_to_bytes_per_s
from placement_rl.topology.builder import TopologyBuilder, Uplink, switched_machine

#: Every namespace the emulator creates starts with this; a run adds ``<pid>-<token>-``.
EMULATOR_PREFIX = "prlemu-"

DEFAULT_MIN_MBIT = 50.0
DEFAULT_MAX_MBIT = 800.0
DEFAULT_BOTTLENECK_MBIT = 100.0
#: One process per device runs on this machine; more than this would measure the CPU, not the network.
MAX_DEVICES = 16

#: Shaped rate per payload rate: a 1514-byte frame (MTU 1500 + Ethernet header) carries 1448 bytes of
#: TCP payload (IP and TCP headers with timestamps are 52 bytes).
FRAME_OVERHEAD = 1514 / 1448

#: TCP settings of every device namespace (module docstring).
TCP_SETTINGS: dict[str, str] = {
    "net.ipv4.tcp_slow_start_after_idle": "0",
    "net.ipv4.tcp_wmem": "'4096 65536 1048576'",
}
#: The bulk queue of every shaped link direction holds at least this much (module docstring).
QUEUE_BYTES = 16 * 2**20

#: The device namespaces' subnet; device ``k`` is ``.k+1``.
SUBNET = "10.213.0"
DEVICE_IFNAME = "eth0"


class EmulatorError(ValueError):
    """The emulator cannot run here or cannot emulate this topology; the message names the reason."""


# ----------------------------------------------------------------------------------- topologies
def switched_cluster(
    machines: int, gpus_per_machine: int, nic_gbit: float = 25.0, device_type: str = "T4"
) -> DeviceTopology:
    """A cluster of the shape the emulator builds: GPUs on a PCIe switch per machine, one NIC each.

    Every GPU joins its machine's switch ``m<i>/pcie`` by PCIe 3.0 x16 (12e9 B/s per direction);
    every machine's switch joins ``eth-switch`` by ``nic_gbit`` Gb/s Ethernet.

    Args:
        machines: number of machines (>= 1).
        gpus_per_machine: GPUs per machine (>= 1).
        nic_gbit: each machine's NIC in Gb/s.
        device_type: catalogue name of the GPUs.

    Raises:
        ValueError: for a count < 1, more than :data:`~placement_rl.topology.MAX_TOPOLOGY_DEVICES` devices, or a
            NIC rate that is not positive (or not finite).
    """
    if machines < 1 or gpus_per_machine < 1:
        raise ValueError(f"switched cluster {machines}x{gpus_per_machine}: expected at least 1 machine and 1 GPU")
    if machines * gpus_per_machine > MAX_TOPOLOGY_DEVICES:
        raise ValueError(
            f"switched cluster {machines}x{gpus_per_machine}: {machines * gpus_per_machine:,} devices; expected at "
            f"most {MAX_TOPOLOGY_DEVICES:,}"
        )
    if not 0 < nic_gbit < math.inf:
        raise ValueError(f"switched cluster NIC {nic_gbit!r} Gb/s: expected a finite positive rate")
    b = TopologyBuilder()
    uplink: Uplink | None = (
        (b.switch("eth-switch"), gbit_to_bytes_per_s(nic_gbit), "ethernet") if machines > 1 else None
    )
    for _ in range(machines):
        switched_machine(b, device_type, gpus_per_machine, uplink)
    return b.build(f"{machines}x{gpus_per_machine}@{nic_gbit:g}")


def resolve_emulation_topology(spec: str) -> DeviceTopology:
    """``MxG`` or ``MxG@NIC`` (:func:`switched_cluster` with ``NIC`` Gb/s, default 25), else a preset,
    ``random:SEED`` or a topology JSON file (:func:`placement_rl.topology.resolve_topology`)."""
    from placement_rl.topology import resolve_topology

    head, _, nic = spec.partition("@")
    machines, x, gpus = head.partition("x")
    if x and machines.isascii() and machines.isdigit() and gpus.isascii() and gpus.isdigit():
        try:
            nic_gbit = float(nic) if nic else 25.0
        except ValueError:
            raise ValueError(f"topology {spec!r}: NIC rate {nic!r}; expected Gb/s, e.g. 2x2@25") from None
        return switched_cluster(int(machines), int(gpus), nic_gbit)
    return resolve_topology(spec)


# --------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Machine:
    """One emulated machine: its devices (topology order), its switch and the links to them.

    Attributes:
        name: the machine name of its devices.
        switch: the machine's switch node (its bridge).
        devices: device names.
        device_links: index in ``topology.links`` of each device's link to ``switch``.
        uplink: index of the link from ``switch`` to the core switch; ``None`` for a lone machine.
    """

    name: str
    switch: str
    devices: tuple[str, ...]
    device_links: tuple[int, ...]
    uplink: int | None


@dataclass(frozen=True)
class ShapedLink:
    """One topology link and the rate it is shaped to.

    Attributes:
        index: the link's index in ``topology.links``.
        link: the link.
        rate_bit_per_s: payload rate per direction in the emulation (``bandwidth * scale * 8``).
        latency_s: one-way latency in the emulation (``latency / scale``; shaped only with netem).
    """

    index: int
    link: Link
    rate_bit_per_s: float
    latency_s: float

    def describe(self) -> str:
        return (
            f"{self.link.a} <-> {self.link.b} ({self.link.kind}, {_rate(self.link.bandwidth_bytes_per_s * 8)}): "
            f"{self.rate_bit_per_s / 1e6:.1f} Mbit/s"
        )


@dataclass(frozen=True)
class Layout:
    """A topology checked against the emulator's shape, with its scale.

    Attributes:
        topology: the topology as given.
        machines: its machines in order of first appearance.
        core: the core switch; ``None`` with one machine.
        scale: emulated bandwidth per topology bandwidth (time runs ``1 / scale`` times slower).
        links: every link of the topology, shaped (same order as ``topology.links``).
    """

    topology: DeviceTopology
    machines: tuple[Machine, ...]
    core: str | None
    scale: float
    links: tuple[ShapedLink, ...]

    def emulated_topology(self, latency_shaped: bool) -> DeviceTopology:
        """The topology the emulation realizes: bandwidths times :attr:`scale`; latencies divided by it
        when ``latency_shaped``, else 0 (see the module docstring)."""
        links = [
            Link(
                s.link.a,
                s.link.b,
                s.rate_bit_per_s / 8,
                s.latency_s if latency_shaped else 0.0,
                s.link.kind,
            )
            for s in self.links
        ]
        return DeviceTopology(f"{self.topology.name} (emulated)", self.topology.devices, links, self.topology.switches)

    def describe(self) -> str:
        """The scale and every shaped link, one per line."""
        lines = [
            f"topology {self.topology.name}: {self.topology.num_devices} devices on {len(self.machines)} "
            f"machine{'s' if len(self.machines) != 1 else ''}; "
            f"scale 1/{1 / self.scale:,.0f} (bandwidth x{self.scale:.3g}, time x{1 / self.scale:,.0f})"
        ]
        lines += [f"  link {s.index}: {s.describe()}" for s in self.links]
        return "\n".join(lines)


def _rate(bit_per_s: float) -> str:
    return f"{bit_per_s / 1e9:g} Gbit/s" if bit_per_s >= 1e9 else f"{bit_per_s / 1e6:g} Mbit/s"


def _link_name(topology: DeviceTopology, index: int) -> str:
    link = topology.links[index]
    return f"link {index} ({link.a!r} <-> {link.b!r}, {link.kind}, {_rate(link.bandwidth_bytes_per_s * 8)})"


def layout(
    topology: DeviceTopology,
    *,
    bottleneck_mbit: float = DEFAULT_BOTTLENECK_MBIT,
    min_mbit: float = DEFAULT_MIN_MBIT,
    max_mbit: float = DEFAULT_MAX_MBIT,
    max_devices: int = MAX_DEVICES,
) -> Layout:
    """Check that the emulator can build ``topology`` and choose its scale (module docstring).

    Args:
        topology: the cluster to emulate.
        bottleneck_mbit: the rate the slowest link gets, unless the fastest would then exceed ``max_mbit``.
        min_mbit: the slowest rate a link may be shaped to.
        max_mbit: the fastest rate a link may be shaped to.
        max_devices: the most devices (processes) the emulation runs.

    Raises:
        EmulatorError: naming the link or value: a link the shape has no place for, too many devices, or
            bandwidths further apart than ``max_mbit / min_mbit``.
    """
    if not 0 < min_mbit <= bottleneck_mbit <= max_mbit:
        raise EmulatorError(
            f"rates min {min_mbit:g}, bottleneck {bottleneck_mbit:g}, max {max_mbit:g} Mbit/s: "
            "expected 0 < min <= bottleneck <= max"
        )
    if topology.num_devices > max_devices:
        raise EmulatorError(
            f"topology {topology.name!r} has {topology.num_devices} devices; the emulator runs one process per "
            f"device on this machine and takes at most {max_devices}"
        )
    machines, core = _machines(topology)
    used = [i for m in machines for i in (*m.device_links, *((m.uplink,) if m.uplink is not None else ()))]
    bandwidth = {i: topology.links[i].bandwidth_bytes_per_s * 8 for i in used}
    slowest = min(used, key=lambda i: bandwidth[i])
    fastest = max(used, key=lambda i: bandwidth[i])
    scale = bottleneck_mbit * 1e6 / bandwidth[slowest]
    if bandwidth[fastest] * scale > max_mbit * 1e6:
        scale = max_mbit * 1e6 / bandwidth[fastest]
    if bandwidth[slowest] * scale < min_mbit * 1e6 * (1 - 1e-9):
        raise EmulatorError(
            f"{_link_name(topology, fastest)} is {bandwidth[fastest] / bandwidth[slowest]:.1f}x faster than "
            f"{_link_name(topology, slowest)}; the emulator shapes every link between {min_mbit:g} and "
            f"{max_mbit:g} Mbit/s, so their bandwidths may differ by at most {max_mbit / min_mbit:g}x"
        )
    shaped = tuple(
        ShapedLink(i, link, link.bandwidth_bytes_per_s * 8 * scale, link.latency_s / scale)
        for i, link in enumerate(topology.links)
    )
    return Layout(topology, machines, core, scale, shaped)


def _machines(topology: DeviceTopology) -> tuple[tuple[Machine, ...], str | None]:
    """The machines of a switched topology and its core switch; :class:`EmulatorError` otherwise."""
    devices = {d.name: d for d in topology.devices}
    expected = (
        "the emulator builds one bridge per machine (its switch, one link per device) and one uplink per "
        "machine (its NIC) into one core switch"
    )
    device_link: dict[str, int] = {}
    switch_links: dict[str, list[int]] = {s: [] for s in topology.switches}
    for i, link in enumerate(topology.links):
        a_dev, b_dev = link.a in devices, link.b in devices
        if a_dev and b_dev:
            raise EmulatorError(f"{_link_name(topology, i)} joins two devices; {expected}")
        if a_dev or b_dev:
            device = link.a if a_dev else link.b
            if device in device_link:
                raise EmulatorError(
                    f"{_link_name(topology, i)}: device {device!r} has a second link "
                    f"({_link_name(topology, device_link[device])}); {expected}"
                )
            device_link[device] = i
        else:
            switch_links[link.a].append(i)
            switch_links[link.b].append(i)
    for device in devices:
        if device not in device_link:  # only possible with a single device
            raise EmulatorError(f"device {device!r} has no link; {expected}")
    switch_of = {d: _other(topology.links[i], d) for d, i in device_link.items()}
    machines: list[Machine] = []
    owner: dict[str, str] = {}
    for name, members in topology.machines().items():
        switches = {switch_of[d.name] for d in members}
        if len(switches) > 1:
            first, other = (
                members[0].name,
                next(d.name for d in members if switch_of[d.name] != switch_of[members[0].name]),
            )
            raise EmulatorError(
                f"{_link_name(topology, device_link[other])}: devices of machine {name!r} sit on different "
                f"switches ({switch_of[first]!r} and {switch_of[other]!r}); {expected}"
            )
        (switch,) = switches
        if switch in owner:
            raise EmulatorError(
                f"{_link_name(topology, device_link[members[0].name])}: switch {switch!r} serves machines "
                f"{owner[switch]!r} and {name!r}; {expected}"
            )
        owner[switch] = name
        machines.append(
            Machine(name, switch, tuple(d.name for d in members), tuple(device_link[d.name] for d in members), None)
        )
    cores: dict[str, int] = {}
    for m, machine in enumerate(machines):
        links = switch_links[machine.switch]
        if len(links) > 1:
            raise EmulatorError(
                f"{_link_name(topology, links[1])}: machine switch {machine.switch!r} has a second uplink; {expected}"
            )
        if links:
            above = _other(topology.links[links[0]], machine.switch)
            if above in owner:
                raise EmulatorError(f"{_link_name(topology, links[0])} joins two machine switches; {expected}")
            cores.setdefault(above, links[0])
            machines[m] = Machine(machine.name, machine.switch, machine.devices, machine.device_links, links[0])
    if len(cores) > 1:
        (first, i), (second, j) = list(cores.items())[:2]
        raise EmulatorError(
            f"{_link_name(topology, j)} leads to switch {second!r}, {_link_name(topology, i)} to {first!r}: {expected}"
        )
    core: str | None = next(iter(cores), None)
    for switch, links in switch_links.items():
        if switch in owner or switch == core:
            continue
        if links:  # a switch beyond the core: a second level of switches
            raise EmulatorError(
                f"{_link_name(topology, links[0])} reaches switch {switch!r} beyond the core; {expected}"
            )
    if core is not None:
        for i in switch_links[core]:
            if _other(topology.links[i], core) not in owner:
                raise EmulatorError(f"{_link_name(topology, i)} joins the core switch to another switch; {expected}")
    return tuple(machines), core


def _other(link: Link, end: str) -> str:
    return link.b if link.a == end else link.a


def device_address(index: int) -> str:
    """The IPv4 address of device ``index`` (topology order) inside its namespace."""
    return f"{SUBNET}.{index + 1}"


# ------------------------------------------------------------------------------------- commands
#: Packets this short (IP total length, bytes) go first: TCP acknowledgements and gloo's control messages.
PRIORITY_BELOW_BYTES = 128


def shaping_commands(namespace: str, ifname: str, shaped: ShapedLink, netem: bool) -> list[list[str]]:
    """``tc`` argument lists that shape the egress of ``ifname`` in ``namespace`` to one link direction.

    An ``htb`` tree: one class at the link's rate (times :data:`FRAME_OVERHEAD`: the kernel counts
    frames), split into a class for IPv4 packets shorter than :data:`PRIORITY_BELOW_BYTES`, served
    first, and one for everything else, queued in a ``bfifo`` of 50 ms of traffic. Without the first,
    the acknowledgements of a transfer wait behind the bulk data of a transfer going the other way: in
    the emulation's slowed-down time a queue of 50 ms is 50 ms of extra round trip, which slowed
    full-duplex patterns (ring all-reduce, all-to-all) by 10-30%; a shallower queue drops packets instead
    when several transfers meet. Bursts (``burst``, ``cburst``) are 2 ms of traffic: the kernel refills
    tokens from a timer, which other work on a busy machine can delay by a millisecond or more, and a
    shallower bucket then loses rate; a full bucket lets a transfer's first 2 ms through at once. With
    ``netem`` and a latency, each class's queue is a ``netem`` delay instead of a FIFO.
    """
    rate = shaped.rate_bit_per_s * FRAME_OVERHEAD
    burst = str(max(16 * 1024, int(rate / 8 * 0.002)))
    limit = max(QUEUE_BYTES, int(rate / 8 * 0.05))
    dev = ["-n", namespace, "class", "add", "dev", ifname]

    def htb(parent: str, classid: str, share: float, *extra: str) -> list[str]:
        return [
            *dev,
            "parent",
            parent,
            "classid",
            classid,
            "htb",
            "rate",
            f"{rate * share:.0f}bit",
            "ceil",
            f"{rate:.0f}bit",
            "burst",
            burst,
            "cburst",
            burst,
            *extra,
        ]

    qdisc = ["-n", namespace, "qdisc", "add", "dev", ifname]
    delayed = netem and shaped.latency_s > 0
    delay = ["netem", "delay", f"{max(1, round(shaped.latency_s * 1e6))}us"]
    return [
        [*qdisc, "root", "handle", "1:", "htb", "default", "20"],
        htb("1:", "1:1", 1.0),
        htb("1:1", "1:10", 0.02, "prio", "0", "quantum", "60000"),
        htb("1:1", "1:20", 0.98, "prio", "1", "quantum", "60000"),
        [*qdisc, "parent", "1:10", "handle", "10:", *(delay if delayed else ["pfifo"]), "limit", "1000"],
        [*qdisc, "parent", "1:20", "handle", "20:"]
        + ([*delay, "limit", str(limit // 1514 + 1)] if delayed else ["bfifo", "limit", str(limit)]),
        [
            "-n",
            namespace,
            "filter",
            "add",
            "dev",
            ifname,
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "u16",
            "0x0000",
            f"0x{0xFFFF & ~(PRIORITY_BELOW_BYTES - 1):04x}",
            "at",
            "2",
            "flowid",
            "1:10",
        ],
    ]


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the programs the emulator runs."""

    ip: str
    tc: str


def find_tools() -> Tools:
    """``ip`` and ``tc`` (iproute2) on ``PATH``, and root.

    Raises:
        EmulatorError: naming the missing program, or the user id when this is not root.
    """
    found = {}
    for program in ("ip", "tc"):
        path = shutil.which(program)
        if path is None:
            raise EmulatorError(
                f"the emulator needs {program!r} (iproute2) on PATH to build network namespaces and shape "
                f"links; not found in PATH={os.environ.get('PATH', '')!r}"
            )
        found[program] = path
    if os.geteuid() != 0:
        raise EmulatorError(
            f"the emulator creates network namespaces and qdiscs, which needs root; running as uid {os.geteuid()}"
        )
    return Tools(found["ip"], found["tc"])


def _run(argv: Sequence[str], what: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise EmulatorError(f"{what}: `{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def list_namespaces(tools: Tools) -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = _run([tools.ip, "netns", "list"], "listing network namespaces")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------- the cluster
class EmulatedCluster:
    """The namespaces, bridges, veths and qdiscs of one run, and the processes started in them.

    Use as a context manager: :meth:`build` on entry, :meth:`cleanup` on exit, whatever happened.
    :meth:`cleanup` is idempotent and also runs on ``SIGTERM`` / ``SIGHUP`` while the context is open
    in the main thread (they raise :class:`KeyboardInterrupt` there, as ``Ctrl-C`` does).

    Args:
        layout: the checked topology and its scale (:func:`layout`).
        tools: the programs to run (default :func:`find_tools`).
        prefix: the run's namespace prefix (default ``prlemu-<pid>-<token>-``).
    """

    def __init__(self, layout: Layout, tools: Tools | None = None, prefix: str | None = None) -> None:
        self.layout = layout
        self.tools = tools or find_tools()
        self.prefix = prefix or f"{EMULATOR_PREFIX}{os.getpid()}-{secrets.token_hex(2)}-"
        self.fabric = f"{self.prefix}fab"
        self.device_namespaces = tuple(f"{self.prefix}d{k}" for k in range(layout.topology.num_devices))
        self.netem = False
        self._created: list[str] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- context
    def __enter__(self) -> EmulatedCluster:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_signals_interrupt())
        try:
            self.build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.cleanup()
        finally:
            self._stack.close()

    # ------------------------------------------------------------------- build
    def build(self) -> None:
        """Create the namespaces, bridges and veths, address and shape them (module docstring)."""
        ip, topo = self.tools.ip, self.layout.topology
        index = {d.name: k for k, d in enumerate(topo.devices)}
        self._add_namespace(self.fabric)
        self.netem = self._probe_netem()
        cmds: list[list[str]] = []
        fab = ["-n", self.fabric]
        for m in range(len(self.layout.machines)):
            cmds += [[*fab, "link", "add", f"bm{m}", "type", "bridge"], [*fab, "link", "set", f"bm{m}", "up"]]
        if self.layout.core is not None:
            cmds += [[*fab, "link", "add", "core", "type", "bridge"], [*fab, "link", "set", "core", "up"]]
        for cmd in cmds:
            _run([ip, *cmd], "building the emulated cluster")
        for m, machine in enumerate(self.layout.machines):
            for device, link in zip(machine.devices, machine.device_links, strict=True):
                self._add_device(index[device], m, self.layout.links[link])
            if machine.uplink is not None:
                self._add_uplink(m, self.layout.links[machine.uplink])

    def _add_namespace(self, name: str) -> None:
        self._created.append(name)  # before creating: a half-made namespace is cleaned up too
        _run([self.tools.ip, "netns", "add", name], f"creating namespace {name!r}")
        _run([self.tools.ip, "-n", name, "link", "set", "lo", "up"], f"bringing up lo in {name!r}")

    def _probe_netem(self) -> bool:
        """Whether this kernel has ``netem``: try it on the fabric namespace's loopback (ours)."""
        add = [self.tools.tc, "-n", self.fabric, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"]
        if subprocess.run(add, capture_output=True, timeout=60).returncode != 0:
            return False
        _run([self.tools.tc, "-n", self.fabric, "qdisc", "del", "dev", "lo", "root"], "removing the netem probe")
        return True

    def _add_device(self, k: int, machine: int, shaped: ShapedLink) -> None:
        ip, ns = self.tools.ip, self.device_namespaces[k]
        self._add_namespace(ns)
        port = f"d{k}"
        what = f"connecting device {self.layout.topology.devices[k].name!r}"
        _run(
            [ip, "-n", self.fabric, "link", "add", port, "type", "veth", "peer", "name", DEVICE_IFNAME, "netns", ns],
            what,
        )
        _run([ip, "-n", self.fabric, "link", "set", port, "master", f"bm{machine}", "up"], what)
        _run([ip, "-n", ns, "addr", "add", f"{device_address(k)}/24", "dev", DEVICE_IFNAME], what)
        _run([ip, "-n", ns, "link", "set", DEVICE_IFNAME, "up"], what)
        for cmd in (
            *shaping_commands(ns, DEVICE_IFNAME, shaped, self.netem),
            *shaping_commands(self.fabric, port, shaped, self.netem),
        ):
            _run([self.tools.tc, *cmd], f"shaping {shaped.describe()}")
        self._tcp_settings(ns)

    def _add_uplink(self, machine: int, shaped: ShapedLink) -> None:
        ip, fab = self.tools.ip, self.fabric
        up, down = f"u{machine}", f"c{machine}"
        what = f"connecting machine {self.layout.machines[machine].name!r} to the core switch"
        _run([ip, "-n", fab, "link", "add", up, "type", "veth", "peer", "name", down], what)
        _run([ip, "-n", fab, "link", "set", up, "master", f"bm{machine}", "up"], what)
        _run([ip, "-n", fab, "link", "set", down, "master", "core", "up"], what)
        for cmd in (*shaping_commands(fab, up, shaped, self.netem), *shaping_commands(fab, down, shaped, self.netem)):
            _run([self.tools.tc, *cmd], f"shaping {shaped.describe()}")

    def _tcp_settings(self, ns: str) -> None:
        script = "; ".join(f"echo {value} > /proc/sys/{key.replace('.', '/')}" for key, value in TCP_SETTINGS.items())
        _run([self.tools.ip, "netns", "exec", ns, "sh", "-c", script], f"setting TCP options in {ns!r}")

    # --------------------------------------------------------------- processes
    def spawn(
        self, device: int, argv: Sequence[str], env: Mapping[str, str], stdout: IO[Any], stderr: IO[Any]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside device ``device``'s namespace in a session of its own; tracked for cleanup."""
        with self._lock:
            process = subprocess.Popen(
                [self.tools.ip, "netns", "exec", self.device_namespaces[device], *argv],
                env=dict(env),
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
            self._processes.append(process)
        return process

    # ----------------------------------------------------------------- cleanup
    def cleanup(self) -> None:
        """Stop every process this run started and delete its namespaces (their links and qdiscs go with
        them). Signals that would interrupt it are held off until it is done."""
        with _signals_deferred():
            _stop(self._processes)
            for ns in reversed(self._created):
                _delete_namespace(self.tools, ns)
            self._created.clear()


def _stop(processes: Sequence[subprocess.Popen[bytes]], grace_s: float = 3.0) -> None:
    """SIGTERM each live process's group (each was started as a session leader), SIGKILL after ``grace_s``."""
    live = [p for p in processes if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _delete_namespace(tools: Tools, name: str) -> None:
    """Kill what still runs inside our namespace ``name`` (only our workers can be there), then delete it."""
    pids = subprocess.run([tools.ip, "netns", "pids", name], capture_output=True, text=True, timeout=60)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run([tools.ip, "netns", "del", name], capture_output=True, timeout=60)


def cleanup_leftovers(prefix: str = EMULATOR_PREFIX, tools: Tools | None = None) -> tuple[list[str], list[str]]:
    """Delete the namespaces (and the processes in them) that crashed runs left behind.

    Only names starting with ``prefix`` (which must start with :data:`EMULATOR_PREFIX`) are touched, and
    only those of runs whose process (the pid in the name) is gone: a live run cleans up after itself.

    Returns:
        (deleted namespaces, namespaces of live runs that were kept).

    Raises:
        EmulatorError: for a prefix outside the emulator's, or when ``ip`` is missing.
    """
    if not prefix.startswith(EMULATOR_PREFIX):
        raise EmulatorError(f"cleanup prefix {prefix!r}: expected one starting with {EMULATOR_PREFIX!r}")
    tools = tools or find_tools()
    deleted, kept = [], []
    for name in list_namespaces(tools):
        if not name.startswith(prefix):
            continue
        pid_text = name[len(EMULATOR_PREFIX) :].split("-")[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            kept.append(name)
            continue
        _delete_namespace(tools, name)
        deleted.append(name)
    return deleted, kept


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}").exists()


# -------------------------------------------------------------------------------------- signals
class _Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a run: unwinds like Ctrl-C so that cleanup runs."""


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`KeyboardInterrupt` while open (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def interrupt(signum: int, _frame: object) -> None:
        received.append(signum)
        raise _Interrupted(f"signal {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:  # raised inside a finalizer (``__del__``), where Python prints and drops exceptions
        raise _Interrupted(f"signal {signal.Signals(received[0]).name}")


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while open (main thread only) and re-deliver the first one after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        received.append(signum)

    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = [signal.signal(s, hold) for s in held]
    try:
        yield
    finally:
        for s, handler in zip(held, handlers, strict=True):
            signal.signal(s, handler)
        if received:
            signal.raise_signal(received[0])
