"""The clusters of the papers and the DGX clusters people rent and build as presets, and the one
function that turns a command-line string (a preset, ``random:SEED`` or a JSON file) into a topology.

The DGX presets are families sized in their name: ``dgx-a100-xN`` and ``dgx-h100-xN`` are ``N`` DGX
nodes of 8 GPUs (``N`` from 1 to :data:`DGX_MAX_NODES`), so ``dgx-h100-x384`` is a 3,072-GPU cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from placement_rl.errors import UnknownNameError
from placement_rl.topology.builder import TopologyBuilder, Uplink, rail_fat_tree, switched_machine
from placement_rl.topology.core import DeviceTopology
from placement_rl.topology.devices import GIB, PCIE3_X16_BYTES_PER_S, gbit_to_bytes_per_s
from placement_rl.topology.random_topologies import random_topology


# ----------------------------------------------------------------------------------------- presets
def _flexflow_p100() -> DeviceTopology:
    """FlexFlow's P100 cluster: 4 machines x 4 P100-SXM2-16GB.

    Inside a machine every GPU pair is joined directly by NVLink at 20 GB/s per direction. Each
    machine has a NIC node ``m{i}/nic`` joined to every GPU by PCIe 3.0 x16 (12e9 B/s); the NICs join
    a central ``ib-switch`` by 100 Gb/s InfiniBand.
    """
    b = TopologyBuilder()
    ib = b.switch("ib-switch")
    for _ in range(4):
        uplink: Uplink = (ib, gbit_to_bytes_per_s(100), "infiniband")
        switched_machine(b, "P100-SXM2-16GB", 4, uplink, nvlink_bytes_per_s=20e9, switch_suffix="nic")
    return b.build("flexflow-p100")


def _flexflow_k80() -> DeviceTopology:
    """FlexFlow's K80 cluster: 16 machines x 4 K80 GPUs (64 devices).

    Per machine, two PCIe switches ``m{i}/pcie0`` (gpu0, gpu1) and ``m{i}/pcie1`` (gpu2, gpu3) with
    12e9 B/s per GPU link, both joined at 12e9 B/s to a host switch ``m{i}/host``, which joins the
    central ``ib-switch`` by 56 Gb/s InfiniBand (FDR). GPUs on different PCIe switches of one machine
    therefore share the host switch.
    """
    b = TopologyBuilder()
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
    b = TopologyBuilder()
    eth: Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(100), "ethernet")
    switched_machine(b, "V100-SXM2-32GB", 4, eth, nvlink_bytes_per_s=25e9)
    for device_type in ["GTX-1080Ti"] * 4 + ["P100-PCIE-12GB"] * 2:
        switched_machine(b, device_type, 2, eth)
    return b.build("tag-testbed")


def _tag_cloud() -> DeviceTopology:
    """TAG's cloud setting: 6 machines, 32 GPUs, slow 10 Gb/s Ethernet between machines.

    ``m0``-``m1`` have 8 V100-SXM2-16GB with all-pairs NVLink at 25 GB/s (simplifying the hybrid cube
    mesh) plus a PCIe switch ``m{i}/pcie`` (12e9 B/s per GPU) to the network; ``m2``-``m5`` have 4 T4
    on a PCIe switch at 12e9 B/s. Every PCIe switch joins ``eth-switch`` at 10 Gb/s.
    """
    b = TopologyBuilder()
    eth: Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    for _ in range(2):
        switched_machine(b, "V100-SXM2-16GB", 8, eth, nvlink_bytes_per_s=25e9)
    for _ in range(4):
        switched_machine(b, "T4", 4, eth)
    return b.build("tag-cloud")


def _tensoropt() -> DeviceTopology:
    """TensorOpt's cluster: 2 machines x 8 V100-SXM2-16GB.

    All GPU pairs of a machine are joined by NVLink at 25 GB/s (simplified hybrid cube mesh); each
    machine's GPUs sit on a PCIe switch ``m{i}/pcie`` (12e9 B/s) joined to ``ib-switch`` by
    100 Gb/s EDR InfiniBand. Cross-machine transfers are therefore bounded by PCIe (12e9 B/s).
    """
    b = TopologyBuilder()
    ib = b.switch("ib-switch")
    for _ in range(2):
        switched_machine(b, "V100-SXM2-16GB", 8, (ib, gbit_to_bytes_per_s(100), "infiniband"), nvlink_bytes_per_s=25e9)
    return b.build("tensoropt")


def _trinity() -> DeviceTopology:
    """Trinity's machine: 1 machine x 4 P100-PCIE-12GB on one PCIe switch ``m0/pcie`` (12e9 B/s).

    The device memory is 11 GiB rather than the datasheet's 12 GiB, as Trinity sec. 5 reports
    (usable memory); the device type name is kept as ``P100-PCIE-12GB``.
    """
    b = TopologyBuilder()
    switched_machine(b, "P100-PCIE-12GB", 4, None, memory_bytes=11 * GIB)
    return b.build("trinity")


def _h100_2x8() -> DeviceTopology:
    """Two DGX-H100-like machines: 2 x 8 H100-SXM5-80GB.

    Each machine has an NVSwitch node ``m{i}/nvswitch`` joined to each GPU at 450 GB/s per direction
    (kind ``nvswitch``; 900 GB/s is the bidirectional figure). Each GPU has its own 400 Gb/s NIC into
    a rail-optimized fabric, modelled as one central ``ib-switch``: a link GPU <-> ``ib-switch`` of
    kind ``infiniband`` at 50e9 B/s. Routing uses the NVSwitch inside a machine because it is wider.
    """
    b = TopologyBuilder()
    ib = b.switch("ib-switch")
    for _ in range(2):
        machine, gpus = b.machine("H100-SXM5-80GB", 8)
        b.star(b.switch(f"{machine}/nvswitch"), gpus, 450e9, "nvswitch")
        b.star(ib, gpus, gbit_to_bytes_per_s(400), "infiniband")
    return b.build("h100-2x8")


# ------------------------------------------------------------------------------------ DGX clusters
@dataclass(frozen=True)
class DgxSystem:
    """One DGX model as its clusters are built: 8 GPUs on NVSwitch, one InfiniBand NIC per GPU.

    Attributes:
        title: the product, e.g. ``"DGX H100"``.
        device_type: catalogue name of its GPUs.
        nvswitch_bytes_per_s: NVLink bandwidth of a GPU into the NVSwitch, per direction.
        nic_gbit_per_s: each GPU's NIC rate in Gb/s (one direction).
        nodes_per_leaf: nodes of a scalable unit (SU) of its SuperPOD design, whose GPUs of one rail
            share a leaf switch (half the leaf's ports face the nodes, half the spine).
        source: where the figures come from.
    """

    title: str
    device_type: str
    nvswitch_bytes_per_s: float
    nic_gbit_per_s: float
    nodes_per_leaf: int
    source: str

    gpus_per_node: ClassVar[int] = 8


#: The DGX families by name prefix: ``{prefix}-x{N}`` is ``N`` nodes on a rail-optimized fat tree.
#:
#: * DGX A100 (DGX A100 datasheet): 8 A100-SXM4-80GB (the 640 GB system; the first DGX A100 had the 40 GB
#:   GPU) on six NVSwitches, 600 GB/s of NVLink per GPU, i.e. 300 GB/s per direction; 8 ConnectX-6 HDR
#:   InfiniBand NICs at 200 Gb/s, one per GPU. SuperPOD (DGX A100 reference architecture): SUs of 20
#:   nodes on 40-port HDR leaf switches (QM8790), 20 ports down and 20 up.
#: * DGX H100 (DGX H100 datasheet): 8 H100-SXM5-80GB on NVSwitch, 900 GB/s of NVLink per GPU, i.e.
#:   450 GB/s per direction (as the ``h100-2x8`` preset); 8 ConnectX-7 NDR NICs at 400 Gb/s, one per
#:   GPU. SuperPOD (DGX H100 reference architecture): SUs of 32 nodes on 64-port NDR leaf switches
#:   (QM9700), 32 ports down and 32 up.
#:
#: Beyond what one spine layer of those switches reaches, the SuperPOD adds a core layer; the model
#: keeps two levels at every size (the bisection is full either way; the core would add a hop's latency).
DGX_SYSTEMS: dict[str, DgxSystem] = {
    "dgx-a100": DgxSystem("DGX A100", "A100-SXM4-80GB", 300e9, 200, 20, "DGX A100 datasheet, DGX SuperPOD A100 RA"),
    "dgx-h100": DgxSystem("DGX H100", "H100-SXM5-80GB", 450e9, 400, 32, "DGX H100 datasheet, DGX SuperPOD H100 RA"),
}

#: The most DGX nodes a ``dgx-*-xN`` preset may have (4,096 GPUs).
DGX_MAX_NODES = 512

#: The size of each DGX family listed by :func:`preset_names` (any size from 1 to DGX_MAX_NODES loads).
_DGX_LISTED_NODES = 2


def dgx_cluster(family: str, nodes: int) -> DeviceTopology:
    """``nodes`` DGX nodes of ``family`` (a key of :data:`DGX_SYSTEMS`) on a rail-optimized fat tree.

    The topology is named ``{family}-x{nodes}``; its machines ``m0`` .. ``m{nodes-1}`` have GPUs
    ``m{i}/gpu0`` .. ``m{i}/gpu7`` and an NVSwitch ``m{i}/nvswitch``; GPU ``r`` of every node of scalable
    unit ``s`` is on leaf switch ``su{s}/leaf{r}``, and every leaf on ``spine``
    (:func:`~placement_rl.topology.builder.rail_fat_tree` has the details). Build time is linear in
    ``nodes``; routes are computed later, per source, when asked for.

    Raises:
        UnknownNameError: if ``family`` is not a DGX family.
        ValueError: if ``nodes`` is not an integer from 1 to :data:`DGX_MAX_NODES`.
    """
    if family not in DGX_SYSTEMS:
        raise UnknownNameError("DGX family", family, DGX_SYSTEMS)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= DGX_MAX_NODES:
        raise ValueError(
            f"{family} cluster of {nodes!r} nodes: expected an integer number of nodes from 1 to {DGX_MAX_NODES}"
        )
    system = DGX_SYSTEMS[family]
    b = TopologyBuilder()
    rail_fat_tree(
        b,
        system.device_type,
        nodes,
        system.gpus_per_node,
        system.nvswitch_bytes_per_s,
        gbit_to_bytes_per_s(system.nic_gbit_per_s),
        system.nodes_per_leaf,
    )
    return b.build(f"{family}-x{nodes}")


def _dgx_family(name: str) -> tuple[str, str] | None:
    """``"dgx-h100-x384"`` -> ``("dgx-h100", "384")``: the DGX family ``name`` starts with and the size
    text after its ``-x``; ``None`` when it names no DGX family."""
    for family in DGX_SYSTEMS:
        if name.startswith(f"{family}-x"):
            return family, name[len(family) + 2 :]
    return None


def _dgx_nodes(name: str, family: str, text: str) -> int:
    """The node count ``text`` of preset ``name`` of ``family``.

    Raises:
        ValueError: naming the value and the accepted range when ``text`` is not an integer from 1 to
            :data:`DGX_MAX_NODES` (``dgx-h100-x0``, ``-x513``, ``-x1.5``, ``-x``).
    """
    nodes = int(text) if text.isascii() and text.isdigit() else None
    if nodes is None or not 1 <= nodes <= DGX_MAX_NODES:
        what = f"{nodes} nodes is out of range" if nodes is not None else f"node count {text!r} is not an integer"
        raise ValueError(
            f"topology preset {name!r}: {what}; expected {family}-xN with N an integer from 1 to {DGX_MAX_NODES} "
            f"({DGX_SYSTEMS[family].title} nodes of {DgxSystem.gpus_per_node} GPUs)"
        )
    return nodes


def _dgx_forms() -> list[str]:
    """How the DGX families are named, for error messages: ``dgx-h100-xN (N = 1..512)``."""
    return [f"{family}-xN (N = 1..{DGX_MAX_NODES})" for family in DGX_SYSTEMS]


_PRESETS: dict[str, Callable[[], DeviceTopology]] = {
    "flexflow-p100": _flexflow_p100,
    "flexflow-k80": _flexflow_k80,
    "tag-testbed": _tag_testbed,
    "tag-cloud": _tag_cloud,
    "tensoropt": _tensoropt,
    "trinity": _trinity,
    "h100-2x8": _h100_2x8,
    **{
        f"{family}-x{_DGX_LISTED_NODES}": functools.partial(dgx_cluster, family, _DGX_LISTED_NODES)
        for family in DGX_SYSTEMS
    },
}


#: What each preset is, in words: (interconnect per direction, source).
PRESET_INFO: dict[str, tuple[str, str]] = {
    "flexflow-p100": ("NVLink 20 GB/s, PCIe 12 GB/s to the NIC, 100 Gb/s InfiniBand", "FlexFlow sec. 8"),
    "flexflow-k80": ("PCIe switch per GPU pair, shared host switch, 56 Gb/s InfiniBand", "FlexFlow sec. 8"),
    "tag-testbed": ("NVLink 25 GB/s on the V100 machine, PCIe elsewhere, 100 Gb/s switch", "TAG sec. 5.2"),
    "tag-cloud": ("NVLink on V100 machines, 10 Gb/s between machines", "TAG sec. 5.2"),
    "tensoropt": ("NVLink 25 GB/s, 100 Gb/s EDR InfiniBand", "TensorOpt sec. 5"),
    "trinity": ("PCIe, 11 GiB per GPU as reported", "Trinity sec. 5"),
    "h100-2x8": ("NVSwitch 450 GB/s, one 400 Gb/s NIC per GPU", "a modern cluster"),
    **{
        f"{family}-x{_DGX_LISTED_NODES}": (
            f"NVSwitch {system.nvswitch_bytes_per_s / 1e9:g} GB/s, one {system.nic_gbit_per_s:g} Gb/s InfiniBand NIC "
            f"per GPU, rail-optimized fat tree, full bisection; any size {family}-xN, N = 1..{DGX_MAX_NODES}",
            system.source,
        )
        for family, system in DGX_SYSTEMS.items()
    },
}
assert set(PRESET_INFO) == set(_PRESETS)


def machines_by_type(topology: DeviceTopology) -> str:
    """``"1 x 4 V100-SXM2-32GB + 4 x 2 GTX-1080Ti"``: runs of machines with the same GPUs, in machine order."""
    runs: list[list[object]] = []
    for devices in topology.machines().values():
        shape = (len(devices), devices[0].device_type if len({d.device_type for d in devices}) == 1 else "mixed")
        if runs and runs[-1][1] == shape:
            runs[-1][0] = int(runs[-1][0]) + 1  # type: ignore[call-overload]
        else:
            runs.append([1, shape])
    return " + ".join(f"{count} x {shape[0]} {shape[1]}" for count, shape in runs)  # type: ignore[index]


def preset_names() -> list[str]:
    """Names of the cluster presets, in documentation order.

    Each DGX family is listed at one size (``dgx-h100-x2``); :func:`load_preset` takes every size
    ``dgx-h100-xN``, ``N`` from 1 to :data:`DGX_MAX_NODES`.
    """
    return list(_PRESETS)


@functools.lru_cache(maxsize=32)
def load_preset(name: str) -> DeviceTopology:
    """The preset cluster called ``name`` (built once while it is among the 32 last asked for;
    topologies are immutable, so it is shared).

    Args:
        name: a name of :func:`preset_names`, or ``dgx-a100-xN`` / ``dgx-h100-xN`` with ``N`` DGX nodes,
            1 to :data:`DGX_MAX_NODES` (:func:`dgx_cluster`).

    Raises:
        UnknownNameError: (kind ``"topology preset"``) listing :func:`preset_names` and the DGX forms if
            unknown.
        ValueError: for a DGX family with a size that is not an integer from 1 to :data:`DGX_MAX_NODES`,
            naming the value and the range.
    """
    if not isinstance(name, str):
        raise ValueError(f"topology preset {name!r}: expected a string")
    if name in _PRESETS:
        return _PRESETS[name]()
    sized = _dgx_family(name)
    if sized is None:
        raise UnknownNameError("topology preset", name, [*preset_names(), *_dgx_forms()])
    family, text = sized
    return dgx_cluster(family, _dgx_nodes(name, family, text))


def resolve_topology(spec: str) -> DeviceTopology:
    """Turn a command-line string into a topology.

    Args:
        spec: a preset name (:func:`preset_names`, or a DGX cluster of any size such as
            ``dgx-h100-x384``), ``"random:SEED"`` with a non-negative integer seed, or a path to a
            ``.json`` topology file.

    Raises:
        UnknownNameError: (a ``ValueError``) listing the accepted forms when ``spec`` is none of them.
        ValueError: for a malformed ``random:`` seed, a DGX size out of range or an invalid topology file.
        FileNotFoundError: for a ``.json`` path that does not exist.
    """
    if not isinstance(spec, str):
        raise ValueError(f"topology spec {spec!r}: expected a string")
    sized = _dgx_family(spec)
    if spec in _PRESETS or (sized is not None and sized[1].isascii() and sized[1].isdigit()):
        return load_preset(spec)  # a DGX size out of range: the error names the value and the range
    if spec.startswith("random:"):
        text = spec[len("random:") :]
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"topology spec {spec!r}: expected 'random:SEED' with a non-negative integer SEED")
        return random_topology(int(text))
    if spec.endswith(".json") or Path(spec).is_file():
        return DeviceTopology.from_json(spec)
    if sized is not None:
        return load_preset(spec)  # raises: the size is not an integer
    raise UnknownNameError("topology", spec, [*preset_names(), *_dgx_forms(), "random:SEED", "PATH.json"])
