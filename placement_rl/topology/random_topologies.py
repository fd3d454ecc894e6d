"""TAG's distribution of random clusters (sec. 5.2), with disjoint train and test seed ranges."""

from __future__ import annotations

from typing import Literal

import numpy as np

from placement_rl.errors import UnknownNameError
from placement_rl.topology.builder import TopologyBuilder
from placement_rl.topology.core import DeviceTopology, LinkKind
from placement_rl.topology.devices import DEVICE_TYPES, gbit_to_bytes_per_s

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
    >= 100 Gb/s and the GPU type has NVLink ports, else ``pcie``: a PCIe card such as the GTX
    1080Ti gets TAG's bandwidth over a link of its own kind); and an inter-machine
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
    b = TopologyBuilder()
    net = b.switch("net-switch")
    for _ in range(int(rng.integers(RANDOM_MACHINES[0], RANDOM_MACHINES[1] + 1))):
        device_type = RANDOM_DEVICE_TYPES[int(rng.integers(len(RANDOM_DEVICE_TYPES)))]
        count = int(rng.integers(RANDOM_GPUS_PER_MACHINE[0], RANDOM_GPUS_PER_MACHINE[1] + 1))
        intra_gbit = float(rng.uniform(*RANDOM_INTRA_GBIT_PER_S))
        inter_gbit = float(rng.uniform(*RANDOM_INTER_GBIT_PER_S))
        machine, gpus = b.machine(device_type, count)
        hub = b.switch(f"{machine}/switch")
        fast = intra_gbit >= RANDOM_NVLINK_MIN_GBIT_PER_S and DEVICE_TYPES[device_type].nvlink
        kind: LinkKind = "nvlink" if fast else "pcie"
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
