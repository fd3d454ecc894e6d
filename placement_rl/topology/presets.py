"""The clusters of the papers as presets, and the one function that turns a command-line string
(a preset, ``random:SEED`` or a JSON file) into a topology."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from placement_rl.errors import UnknownNameError
from placement_rl.topology.builder import TopologyBuilder, Uplink, switched_machine
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


_PRESETS: dict[str, Callable[[], DeviceTopology]] = {
    "flexflow-p100": _flexflow_p100,
    "flexflow-k80": _flexflow_k80,
    "tag-testbed": _tag_testbed,
    "tag-cloud": _tag_cloud,
    "tensoropt": _tensoropt,
    "trinity": _trinity,
    "h100-2x8": _h100_2x8,
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
