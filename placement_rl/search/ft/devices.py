"""FT's candidate device sets, chosen without regard to the order the topology lists its devices in.

FT runs every op on one device mesh over a set of devices (:mod:`.configs`); which sets it tries
decides what it can find. Taking "the first ``n`` devices" makes the answer depend on how the cluster
happens to be listed: on a cluster of one fast machine and slower ones, listing the fast machine last
hides it from every count but the total. Here every set is chosen by a ranking that the listing order
does not enter:

* **speed** of a device: its peak FLOP/s in the cost model's compute dtype
  (:meth:`placement_rl.sim.cost.CostModel.peak_flops`); of a machine: the sum over its devices;
* **machines** ranked fastest first, ties by machine name in natural order (``m2`` before ``m10``);
* **devices** ranked fastest first, then by their machine's rank, then by name in natural order, so
  that equally fast devices fill the best machines first.

A set's *mesh order* (flat device ``i`` of :mod:`.configs`) is machine rank, then name: the devices
of one machine are adjacent, so a 2-D mesh's rows follow machines. On a homogeneous cluster whose
machines and devices are named in order (every preset), the ``n`` fastest devices in mesh order are
the first ``n`` devices of the topology, so FT's results there are those of the first-``n`` rule.

**Candidate sets** (:func:`candidate_device_sets`), for device counts ``C`` (default
:func:`default_device_counts`: 1, 2, 4, ..., all), in this order, each set kept once:

1. the ``n`` fastest devices, for each ``n`` in ``C``;
2. whole machines: the best ``k`` machines, for ``k`` in :func:`default_device_counts` of the
   machine count;
3. per device type (fastest type first, ties by type name): the ``n`` best-ranked devices of the
   type, for each ``n`` in ``C`` below the type's device count, and all of them; unless an earlier
   set of as many devices *dominates* it: sorted by speed its devices are each at least as fast,
   sorted by memory each has at least as much, and it spans at most as many machines (a slow type
   alone is then only worth trying when it has more memory, or more devices than any count).

With ``T`` device types and ``M`` machines that is at most ``|C| (T + 1) + floor(log2 M) + 2``
sets before deduplication; the list is then cut to ``max_sets`` (default
:data:`MAX_DEVICE_SETS`), which drops the slowest types' sets first. On a homogeneous cluster of
``N`` devices in machines of a power-of-two size only the ``|C|`` sets of rule 1 remain; on
``tag-testbed`` 7 sets remain (5 before), on ``tag-cloud`` 7 (6 before).

**At most** :data:`FT_MAX_DEVICES` **devices.** FT prices a layout change between two
configurations over every pair of the set's devices (the point-to-point redistribution of
:mod:`.rescheduling`: ``n x n`` arrays, built once per pair of layouts and tensor size) and builds
the routes between all of them, so its cost graph grows as ``n**2``: about 4 s on ``lenet`` over
128 GPUs, 9 s over 256, 21 s over 512, and without end in sight over 3,072. :func:`run_ft
<placement_rl.search.ft.run_ft>` refuses a larger set; the default counts and candidate sets stop
at it (:func:`default_device_counts` with ``limit``, :func:`candidate_device_sets`), so on a larger
cluster FT searches its ``FT_MAX_DEVICES`` fastest devices and fewer (a coarsening: the plans it
finds use at most that many devices).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from placement_rl.sim.cost import CostModel
from placement_rl.topology import Device, DeviceTopology

#: the most device sets :func:`candidate_device_sets` returns unless told otherwise (each is one FT run).
MAX_DEVICE_SETS = 16

#: the most devices one FT run takes (module docstring, "At most FT_MAX_DEVICES devices").
FT_MAX_DEVICES = 512

#: the rules a candidate set comes from (:attr:`DeviceSet.rule`), in priority order.
SET_RULES: tuple[str, ...] = ("fastest", "machines", "type")


@dataclass(frozen=True)
class DeviceSet:
    """One candidate device set of FT.

    Attributes:
        devices: the device names in mesh order (flat device ``i`` is ``devices[i]``).
        rule: which rule chose it first (:data:`SET_RULES`).
        label: ``"8 devices (V100-SXM2-32GB x4 + K80 x4; machines m0, m1)"``: the count, the device
            types (fastest first) and the machines (best first), for progress bars and reports.
    """

    devices: tuple[str, ...]
    rule: str
    label: str

    @property
    def num_devices(self) -> int:
        return len(self.devices)


def natural_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key of a name with its digit runs compared as numbers: ``m2/gpu9`` before ``m10/gpu0``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def default_device_counts(total: int, limit: int | None = None) -> list[int]:
    """1, 2, 4, ... up to ``total``, and ``total`` itself; with ``limit``, only the counts up to it
    (and ``limit`` itself when ``total`` is larger)."""
    top = total if limit is None else min(total, limit)
    counts = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    return counts if counts[-1] == top else [*counts, top]


def check_device_count(n: int, topology: DeviceTopology, max_devices: int = FT_MAX_DEVICES) -> None:
    """Refuse an FT run over more than ``max_devices`` devices (module docstring).

    Raises:
        ValueError: naming the count, the limit and what to do instead.
    """
    if n > max_devices:
        raise ValueError(
            f"FT over {n:,} devices of {topology.name!r}: its cost graph grows as the square of the device count "
            f"(it prices every layout change over every pair of devices, {n:,} x {n:,}); it runs on at most "
            f"{max_devices:,} devices: choose a device count of at most {max_devices:,} (the fastest devices) or a "
            "smaller topology"
        )


class DeviceRanking:
    """The listing-order-free ranking of a topology's machines and devices (module docstring).

    Args:
        topology: the cluster.
        cost_model: gives each device's peak in the compute dtype (default :class:`CostModel`: fp32).
    """

    def __init__(self, topology: DeviceTopology, cost_model: CostModel | None = None) -> None:
        cost = cost_model or CostModel()
        self.topology = topology
        self.speed: dict[str, float] = {d.name: float(cost.peak_flops(d)) for d in topology.devices}
        members: dict[str, list[Device]] = {}
        for d in topology.devices:
            members.setdefault(d.machine, []).append(d)
        machine_speed = {m: sum(self.speed[d.name] for d in ds) for m, ds in members.items()}
        #: machines, best first.
        self.machines: list[str] = sorted(members, key=lambda m: (-machine_speed[m], natural_key(m)))
        self.machine_rank: dict[str, int] = {m: r for r, m in enumerate(self.machines)}
        #: every machine's devices in mesh order.
        self.members: dict[str, list[str]] = {
            m: sorted((d.name for d in ds), key=natural_key) for m, ds in members.items()
        }
        #: devices, best first.
        self.devices: list[str] = sorted(
            (d.name for d in topology.devices),
            key=lambda n: (-self.speed[n], self.machine_rank[topology.device(n).machine], natural_key(n)),
        )
        type_speed: dict[str, float] = {}
        for d in topology.devices:
            type_speed[d.device_type] = max(type_speed.get(d.device_type, 0.0), self.speed[d.name])
        #: device types, fastest first (ties by name).
        self.types: list[str] = sorted(type_speed, key=lambda t: (-type_speed[t], t))

    def mesh_order(self, names: Sequence[str]) -> tuple[str, ...]:
        """``names`` in mesh order: machine rank, then name."""
        topo = self.topology
        return tuple(sorted(names, key=lambda n: (self.machine_rank[topo.device(n).machine], natural_key(n))))

    def fastest(self, n: int) -> tuple[str, ...]:
        """The ``n`` best-ranked devices, in mesh order."""
        return self.mesh_order(self.devices[:n])

    def label(self, names: Sequence[str]) -> str:
        """``"8 devices (V100-SXM2-32GB x4 + K80 x4; machines m0, m1)"`` (module docstring)."""
        topo = self.topology
        per_type: dict[str, int] = {}
        machines: set[str] = set()
        for name in names:
            d = topo.device(name)
            per_type[d.device_type] = per_type.get(d.device_type, 0) + 1
            machines.add(d.machine)
        types = " + ".join(f"{t} x{per_type[t]}" for t in self.types if t in per_type)
        ranked = sorted(machines, key=self.machine_rank.__getitem__)
        shown = ", ".join(ranked[:3]) + (f" and {len(ranked) - 3} more" if len(ranked) > 3 else "")
        where = f"machine {shown}" if len(ranked) == 1 else f"machines {shown}"
        return f"{len(names)} device{'s' if len(names) != 1 else ''} ({types}; {where})"


def machine_meshes(
    topology: DeviceTopology, names: Sequence[str], count: int, cost_model: CostModel | None = None
) -> list[tuple[str, ...]]:
    """Stage meshes of a device set: the devices of ``names`` on each of the best ``count`` machines
    among theirs (best first, each in mesh order); none when ``names`` lies on one machine."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"stage_meshes = {count!r}; expected a machine count >= 0")
    rank = DeviceRanking(topology, cost_model)
    on: dict[str, list[str]] = {}
    for name in names:
        on.setdefault(topology.device(name).machine, []).append(name)
    if len(on) < 2:
        return []
    machines = sorted(on, key=rank.machine_rank.__getitem__)[:count]
    return [rank.mesh_order(on[m]) for m in machines]


def fastest_devices(topology: DeviceTopology, n: int, cost_model: CostModel | None = None) -> list[str]:
    """The ``n`` fastest devices of ``topology`` in mesh order (module docstring), whatever order it lists them in."""
    return list(DeviceRanking(topology, cost_model).fastest(n))


def candidate_device_sets(
    topology: DeviceTopology,
    device_counts: Sequence[int] | None = None,
    cost_model: CostModel | None = None,
    max_sets: int = MAX_DEVICE_SETS,
) -> list[DeviceSet]:
    """FT's candidate device sets (module docstring): the fastest ``n`` for each count, the best whole
    machines, and per device type; deduplicated, at most ``max_sets``, the same whatever order the
    topology lists its devices in. The default counts stop at :data:`FT_MAX_DEVICES`, and so do the
    machine and type sets unless a larger count is asked for.

    Raises:
        ValueError: for a count outside ``1..topology.num_devices`` or ``max_sets < 1``.
    """
    total = topology.num_devices
    counts = list(device_counts) if device_counts is not None else default_device_counts(total, FT_MAX_DEVICES)
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
            raise ValueError(f"device count {n!r}: expected an integer from 1 to {total} (topology {topology.name!r})")
    if isinstance(max_sets, bool) or not isinstance(max_sets, int) or max_sets < 1:
        raise ValueError(f"max_sets = {max_sets!r}; expected a positive integer")
    rank = DeviceRanking(topology, cost_model)
    found: list[tuple[Sequence[str], str]] = [(rank.devices[:n], "fastest") for n in counts]
    for k in default_device_counts(len(rank.machines)):
        found.append(([d for m in rank.machines[:k] for d in rank.members[m]], "machines"))
    for device_type in rank.types:
        of_type = [n for n in rank.devices if topology.device(n).device_type == device_type]
        for n in [*(c for c in counts if c < len(of_type)), len(of_type)]:
            found.append((of_type[:n], "type"))
    largest = max(counts, default=0)  # the default sets stop at FT_MAX_DEVICES, as the default counts do
    out: list[DeviceSet] = []
    seen: set[frozenset[str]] = set()
    for names, rule in found:
        key = frozenset(names)
        if rule != "fastest" and len(names) > max(largest, FT_MAX_DEVICES):
            continue
        if key in seen or (rule == "type" and any(_dominates(rank, kept.devices, names) for kept in out)):
            continue
        seen.add(key)
        out.append(DeviceSet(rank.mesh_order(names), rule, rank.label(names)))
    return out[:max_sets]


def _dominates(rank: DeviceRanking, a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether set ``a`` has as many devices as ``b``, each (sorted) at least as fast and with at least as
    much memory, on at most as many machines."""
    if len(a) != len(b):
        return False
    topo = rank.topology

    def profile(names: Sequence[str]) -> tuple[list[float], list[int], int]:
        devices = [topo.device(n) for n in names]
        speeds = sorted(rank.speed[n] for n in names)
        return speeds, sorted(d.memory_bytes for d in devices), len({d.machine for d in devices})

    speed_a, memory_a, machines_a = profile(a)
    speed_b, memory_b, machines_b = profile(b)
    return (
        machines_a <= machines_b
        and all(x >= y for x, y in zip(speed_a, speed_b, strict=True))
        and all(x >= y for x, y in zip(memory_a, memory_b, strict=True))
    )


__all__ = [
    "MAX_DEVICE_SETS",
    "FT_MAX_DEVICES",
    "SET_RULES",
    "DeviceRanking",
    "DeviceSet",
    "candidate_device_sets",
    "check_device_count",
    "default_device_counts",
    "fastest_devices",
    "machine_meshes",
    "natural_key",
]
