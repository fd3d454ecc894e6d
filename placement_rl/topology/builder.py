"""Building topologies by machines: the helper the presets and random topologies share."""

from __future__ import annotations

from collections.abc import Sequence

from placement_rl.topology.core import Device, DeviceTopology, Link, LinkKind
from placement_rl.topology.devices import LINK_LATENCY_S, PCIE3_X16_BYTES_PER_S, make_device


# ---------------------------------------------------------------------------------------- builders
class TopologyBuilder:
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


Uplink = tuple[str, float, LinkKind]  # (central switch, bandwidth bytes/s, link kind)


def switched_machine(
    b: TopologyBuilder,
    device_type: str,
    count: int,
    uplink: Uplink | None,
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
