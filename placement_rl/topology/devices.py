"""The device catalogue and the physical constants the presets and random topologies use."""

from __future__ import annotations

from dataclasses import dataclass

from placement_rl.errors import UnknownNameError
from placement_rl.topology.core import Device

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


@dataclass(frozen=True)
class DeviceSpec:
    """Catalogue figures of one device type.

    Attributes:
        peak_flops: fp32 (non tensor-core) peak, FLOP/s.
        memory_bytes: device memory in bytes (GiB = 2**30).
        memory_bandwidth_bytes_per_s: device memory bandwidth in bytes/s.
        peak_flops_by_dtype: dense peaks of the other compute dtypes, FLOP/s, as sorted
            ``(dtype, flops)`` pairs (see :attr:`placement_rl.topology.Device.peak_flops_by_dtype`).
        source: where the figures come from.
        nvlink: the GPU has NVLink ports (SXM modules); PCIe cards do not.
    """

    peak_flops: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops_by_dtype: tuple[tuple[str, float], ...] = ()
    source: str = "vendor datasheet"
    nvlink: bool = False


def _peaks(**flops: float) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(flops.items()))


#: Device catalogue; every figure is from the vendor datasheet (NVIDIA), dense (no sparsity).
#: Mixed-precision peaks are the rates of fp16/bf16 matrix math with fp32 accumulation, the
#: arithmetic mixed-precision training runs (cuBLAS / cuDNN with an fp32 compute type). Memory is
#: the datasheet's GB figure taken as GiB (2**30 bytes), as for every entry; bandwidths are bytes/s.
#: Datasheets that quote tensor-core rates "with sparsity" (2:4) are halved here:
#:
#: * H100 SXM5 (H100 whitepaper, SXM5 column): tf32 494.7, bf16 and fp16 989.4 TFLOP/s
#:   (the datasheet's 989 / 1,979 are with 2:4 sparsity).
#: * H200 SXM 141 GB (H200 datasheet, H200 SXM column): fp32 67 TFLOP/s, 141 GB HBM3e at 4.8 TB/s;
#:   tensor cores as the H100 SXM5 (same GH100 compute): tf32 494.7, bf16 and fp16 989.4 TFLOP/s (the
#:   datasheet's 989 / 1,979 are with sparsity). Also listed as ``H200``, the label of the measured data
#:   in benchmarks/data/h200 (its topology_h200x1.json has these peaks).
#: * B200 (NVIDIA HGX B200 specifications, per GPU): fp32 75 TFLOP/s; tf32 1.1 and bf16 / fp16 2.25
#:   PFLOP/s (the page's 2.2 and 4.5 PFLOP/s are with sparsity); 180 GB HBM3e at 7.7 TB/s.
#: * A100 SXM4 and PCIe, 40 GB and 80 GB (A100 datasheet, r4): fp32 19.5; tf32 156, bf16 and fp16 312
#:   TFLOP/s (312 / 624 with sparsity), the same for all four; memory bandwidth 1,555 GB/s (40 GB
#:   SXM4 and PCIe, HBM2), 2,039 GB/s (80 GB SXM4, HBM2e), 1,935 GB/s (80 GB PCIe, HBM2e). The PCIe
#:   cards' optional NVLink bridge joins two cards only, so they are not marked ``nvlink``.
#: * L40S (L40S datasheet): fp32 91.6; tf32 183, bf16 and fp16 362.05 TFLOP/s (366 / 733 with
#:   sparsity); 48 GB GDDR6 at 864 GB/s; PCIe only, no NVLink.
#: * L4 (L4 datasheet): fp32 30.3; tf32 60, bf16 and fp16 121 TFLOP/s (the datasheet gives only the
#:   sparse 120 / 242); 24 GB GDDR6 at 300 GB/s; PCIe only, no NVLink.
#: * V100 SXM2 (V100 datasheet): fp16 tensor cores 125 TFLOP/s; no tf32 or bf16 (Ampere and later).
#: * T4 (T4 datasheet): mixed fp16/fp32 tensor cores 65 TFLOP/s; no tf32 or bf16.
#: * P100 (P100 datasheet): no tensor cores; native half precision at 2x fp32: 21.2 (SXM2) and
#:   18.7 (PCIe) TFLOP/s; no bf16.
#: * GTX 1080Ti (GP102) and K80 (GK210): no fast fp16. GP102 runs native fp16 arithmetic at 1/64 of
#:   fp32 (0.18 TFLOP/s) and GK210 has none, so fp16 training math is computed by the fp32 units:
#:   the fp16 peak recorded is the fp32 rate (mixed precision there saves memory, not time).
#:
#: The Ada (L4, L40S) datasheets give one fp16 tensor rate; it is taken as the fp32-accumulate rate.
#: bf16 and tf32 need Ampere or later: the A100, L4, L40S, H100, H200 and B200 have them.
_H200_SXM = DeviceSpec(67e12, 141 * GIB, 4.8e12, _peaks(tf32=494.7e12, bf16=989.4e12, fp16=989.4e12), nvlink=True)
_A100_PEAKS = _peaks(tf32=156e12, bf16=312e12, fp16=312e12)

DEVICE_TYPES: dict[str, DeviceSpec] = {
    "P100-SXM2-16GB": DeviceSpec(10.6e12, 16 * GIB, 732e9, _peaks(fp16=21.2e12), nvlink=True),
    "P100-PCIE-12GB": DeviceSpec(9.3e12, 12 * GIB, 549e9, _peaks(fp16=18.7e12)),
    "K80": DeviceSpec(4.37e12, 12 * GIB, 240e9, _peaks(fp16=4.37e12)),  # one of the board's two GPUs, boost clock
    "V100-SXM2-16GB": DeviceSpec(15.7e12, 16 * GIB, 900e9, _peaks(fp16=125e12), nvlink=True),
    "V100-SXM2-32GB": DeviceSpec(15.7e12, 32 * GIB, 900e9, _peaks(fp16=125e12), nvlink=True),
    "GTX-1080Ti": DeviceSpec(11.3e12, 11 * GIB, 484e9, _peaks(fp16=11.3e12)),
    "T4": DeviceSpec(8.1e12, 16 * GIB, 320e9, _peaks(fp16=65e12)),
    "A100-SXM4-40GB": DeviceSpec(19.5e12, 40 * GIB, 1555e9, _A100_PEAKS, nvlink=True),
    "A100-SXM4-80GB": DeviceSpec(19.5e12, 80 * GIB, 2039e9, _A100_PEAKS, nvlink=True),
    "A100-PCIE-40GB": DeviceSpec(19.5e12, 40 * GIB, 1555e9, _A100_PEAKS),
    "A100-PCIE-80GB": DeviceSpec(19.5e12, 80 * GIB, 1935e9, _A100_PEAKS),
    "L4": DeviceSpec(30.3e12, 24 * GIB, 300e9, _peaks(tf32=60e12, bf16=121e12, fp16=121e12)),
    "L40S": DeviceSpec(91.6e12, 48 * GIB, 864e9, _peaks(tf32=183e12, bf16=362.05e12, fp16=362.05e12)),
    "H100-SXM5-80GB": DeviceSpec(
        67e12, 80 * GIB, 3.35e12, _peaks(tf32=494.7e12, bf16=989.4e12, fp16=989.4e12), nvlink=True
    ),
    "H200-SXM-141GB": _H200_SXM,
    "H200": _H200_SXM,  # the same GPU under the label of the measured data (DEVICE_TYPE_ALIASES)
    "B200": DeviceSpec(75e12, 180 * GIB, 7.7e12, _peaks(tf32=1.1e15, bf16=2.25e15, fp16=2.25e15), nvlink=True),
}

#: Catalogue names that are a second label of another entry (the same figures): alias -> canonical name.
#: ``H200`` is what ``placement-rl profile --device-type H200`` and benchmarks/data/h200 call the H200 SXM.
DEVICE_TYPE_ALIASES: dict[str, str] = {"H200": "H200-SXM-141GB"}
assert all(DEVICE_TYPES[alias] is DEVICE_TYPES[name] for alias, name in DEVICE_TYPE_ALIASES.items())


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
        peak_flops_by_dtype=spec.peak_flops_by_dtype,
    )
