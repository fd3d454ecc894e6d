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


def rail_fat_tree(
    b: TopologyBuilder,
    device_type: str,
    nodes: int,
    gpus_per_node: int,
    nvswitch_bytes_per_s: float,
    nic_bytes_per_s: float,
    nodes_per_leaf: int,
) -> None:
    """``nodes`` NVSwitch machines on a rail-optimized, non-blocking two-level fat tree (DGX SuperPOD style).

    Each machine ``m{i}`` has an NVSwitch node ``m{i}/nvswitch`` joined to each of its GPUs at
    ``nvswitch_bytes_per_s`` (kind ``nvswitch``) and one NIC per GPU. Machines are grouped in scalable
    units of ``nodes_per_leaf``: unit ``s`` has one leaf switch per rail, ``su{s}/leaf{r}``, and GPU ``r``
    of each of its machines is joined to ``su{s}/leaf{r}`` at ``nic_bytes_per_s`` (kind ``infiniband``;
    the NIC sits on the GPU's PCIe switch and is modelled as the GPU's own link). Every leaf joins the
    node ``spine`` by one link of ``nodes_per_leaf * nic_bytes_per_s``, as much as its downlinks carry
    (full bisection; a partial last unit is cabled for a full one, as the SuperPOD designs require).

    ``spine`` stands for the whole spine layer: routes here are single paths, so separate spine switches
    of equal links would all lose to the same one by the routing's name tie-break, where ECMP spreads
    flows over them; one node whose links carry the sum keeps the bisection bandwidth. Same-rail traffic
    of one unit crosses one leaf; other traffic between machines crosses a leaf, ``spine`` and a leaf, or
    forwards over the NVSwitch to the GPU on the destination's rail first where that is faster (as NCCL's
    PXN does).

    Size: ``nodes * gpus_per_node`` devices, ``nodes * (gpus_per_node * 2) + leaves`` links; building
    costs time linear in that.

    Raises:
        ValueError: if ``nodes``, ``gpus_per_node`` or ``nodes_per_leaf`` is below 1.
    """
    for what, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("nodes_per_leaf", nodes_per_leaf)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rail_fat_tree: {what} = {value!r}; expected an integer >= 1")
    spine = b.switch("spine")
    leaves: list[str] = []
    for i in range(nodes):
        unit, first = divmod(i, nodes_per_leaf)
        if first == 0:
            leaves = [b.switch(f"su{unit}/leaf{r}") for r in range(gpus_per_node)]
            for leaf in leaves:
                b.link(leaf, spine, nodes_per_leaf * nic_bytes_per_s, "infiniband")
        machine, gpus = b.machine(device_type, gpus_per_node)
        b.star(b.switch(f"{machine}/nvswitch"), gpus, nvswitch_bytes_per_s, "nvswitch")
        for gpu, leaf in zip(gpus, leaves, strict=True):
            b.link(gpu, leaf, nic_bytes_per_s, "infiniband")
