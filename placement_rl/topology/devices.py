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
#: arithmetic mixed-precision training runs (cuBLAS / cuDNN with an fp32 compute type):
#:
#: * H100 SXM5 (H100 whitepaper, SXM5 column): tf32 494.7, bf16 and fp16 989.4 TFLOP/s
#:   (the datasheet's 989 / 1,979 are with 2:4 sparsity).
#: * V100 SXM2 (V100 datasheet): fp16 tensor cores 125 TFLOP/s; no tf32 or bf16 (Ampere and later).
#: * T4 (T4 datasheet): mixed fp16/fp32 tensor cores 65 TFLOP/s; no tf32 or bf16.
#: * P100 (P100 datasheet): no tensor cores; native half precision at 2x fp32: 21.2 (SXM2) and
#:   18.7 (PCIe) TFLOP/s; no bf16.
#: * GTX 1080Ti (GP102) and K80 (GK210): no fast fp16. GP102 runs native fp16 arithmetic at 1/64 of
#:   fp32 (0.18 TFLOP/s) and GK210 has none, so fp16 training math is computed by the fp32 units:
#:   the fp16 peak recorded is the fp32 rate (mixed precision there saves memory, not time).
#:
#: bf16 needs Ampere or later: of these, only the H100 has it.
DEVICE_TYPES: dict[str, DeviceSpec] = {
    "P100-SXM2-16GB": DeviceSpec(10.6e12, 16 * GIB, 732e9, _peaks(fp16=21.2e12), nvlink=True),
    "P100-PCIE-12GB": DeviceSpec(9.3e12, 12 * GIB, 549e9, _peaks(fp16=18.7e12)),
    "K80": DeviceSpec(4.37e12, 12 * GIB, 240e9, _peaks(fp16=4.37e12)),  # one of the board's two GPUs, boost clock
    "V100-SXM2-16GB": DeviceSpec(15.7e12, 16 * GIB, 900e9, _peaks(fp16=125e12), nvlink=True),
    "V100-SXM2-32GB": DeviceSpec(15.7e12, 32 * GIB, 900e9, _peaks(fp16=125e12), nvlink=True),
    "GTX-1080Ti": DeviceSpec(11.3e12, 11 * GIB, 484e9, _peaks(fp16=11.3e12)),
    "T4": DeviceSpec(8.1e12, 16 * GIB, 320e9, _peaks(fp16=65e12)),
    "H100-SXM5-80GB": DeviceSpec(
        67e12, 80 * GIB, 3.35e12, _peaks(tf32=494.7e12, bf16=989.4e12, fp16=989.4e12), nvlink=True
    ),
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
        peak_flops_by_dtype=spec.peak_flops_by_dtype,
    )
