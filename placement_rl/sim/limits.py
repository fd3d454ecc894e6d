"""How large a simulation may grow: the simulator's memory bound and its refusal.

A simulation holds its whole task graph at once: per task its duration, resources, successors and
kind, the scheduler's state and the result's task table; per flow of the ``flow`` network model its
bytes, cap and link directions; and the routes from every device a plan uses, ``D`` entries per
source. Data parallelism of a 1,931-op model over 3,072 GPUs is 23.7 million tasks (two compute
and, in eager execution, two host tasks per op and device), several gigabytes. Rather than fail
somewhere inside with ``MemoryError``, :meth:`~placement_rl.sim.simulator.SimContext.assemble`
estimates what the task graph will need before it allocates it (:class:`SizeEstimate`) and raises
:class:`SimulationTooLarge` (a ``ValueError``, so the command line prints one ``error:`` line) when
that is more than :func:`memory_bound_bytes`.

**The bound.** ``PLACEMENT_RL_SIM_MAX_BYTES`` (bytes, or with a unit: ``16GiB``, ``500MB``) when
set; else :data:`MAX_SIMULATION_BYTES` when a program sets it; else half of the memory this process
can still allocate (:func:`available_memory_bytes`: the least of the machine's available memory,
the room left under the address-space limit ``ulimit -v`` / ``prlimit --as`` and the room left in
the process's cgroup), so that the estimate's error and everything else the process holds fit in
the other half.

**The estimate** (:class:`SizeEstimate`) counts the tasks exactly where the plan fixes them
(compute tasks: the ops' tasks, micro-batch copies included; host tasks; transfers once known;
parameter-server tasks) and bounds the all-reduce buckets from their bytes; flows are one per
transfer and, per bucket of ``n`` devices, what the largest all-reduce algorithm has
(``n`` times the rings it runs at once). Bytes per task, per flow and per route entry were measured
with ``tracemalloc`` over data-parallel, expert and layer-wise plans (peak of the assembly and the
schedule together: 234-393 bytes per task, a flow with its directions 290-420 bytes) and rounded up.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

try:
    import resource
except ImportError:  # not on Windows: no address-space limit to read
    resource = None  # type: ignore[assignment]

#: Bytes a task costs at the simulation's peak (its arrays, successors, scheduler state, task table).
BYTES_PER_TASK = 256
#: Bytes a flow costs (bytes, cap, offsets, task, the recorded link timeline), its directions apart.
BYTES_PER_FLOW = 160
#: Bytes per link direction a flow crosses (the direction id in the flow table and the kernel's lists).
BYTES_PER_FLOW_DIRECTION = 64
#: Link directions of an average route, for flows whose routes are not built yet (DGX clusters: 2-6).
DIRECTIONS_PER_FLOW = 4
#: Estimates below this are not checked against the available memory (reading the process's limits costs
#: more than they do); a bound set by the environment or a program (below it) is always checked.
CHECK_ABOVE_BYTES = 64 * 2**20
#: The environment variable that sets the bound (bytes, or with a unit).
BOUND_VARIABLE = "PLACEMENT_RL_SIM_MAX_BYTES"
#: A program's bound in bytes (``None``: the environment variable, else half of the available memory).
MAX_SIMULATION_BYTES: int | None = None
#: Without a way to read the available memory (no ``/proc``): assume this much.
FALLBACK_AVAILABLE_BYTES = 8 * 2**30

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class SimulationTooLarge(ValueError):
    """A simulation whose task graph would need more memory than :func:`memory_bound_bytes` allows.

    Attributes:
        estimate: what it would need.
        bound_bytes: the bound it exceeds.
    """

    def __init__(self, message: str, estimate: SizeEstimate, bound_bytes: int) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.bound_bytes = bound_bytes


@dataclass(frozen=True)
class SizeEstimate:
    """What one simulation's task graph will need (module docstring).

    Attributes:
        tasks: tasks of the task graph (compute, host, transfer, synchronization).
        flows: flows of its communication (one per transfer, the all-reduce algorithms' per bucket).
        route_bytes: routes still to be built (sources the plan uses times ``D`` entries).
        directions: link directions the flows cross in all, where known (else
            :data:`DIRECTIONS_PER_FLOW` per flow).
    """

    tasks: int
    flows: int
    route_bytes: int = 0
    directions: int | None = None

    @property
    def num_bytes(self) -> int:
        """The memory the simulation needs, in bytes."""
        directions = self.flows * DIRECTIONS_PER_FLOW if self.directions is None else self.directions
        return (
            self.tasks * BYTES_PER_TASK
            + self.flows * BYTES_PER_FLOW
            + directions * BYTES_PER_FLOW_DIRECTION
            + self.route_bytes
        )


def parse_bytes(text: str, what: str = BOUND_VARIABLE) -> int:
    """``"16GiB"``, ``"500 MB"``, ``"2e9"`` -> bytes.

    Raises:
        ValueError: naming ``what`` for anything but a positive size.
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        value = float(match.group(1)) if match else math.nan
    except ValueError:
        value = math.nan
    if not match or unit not in _UNITS or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} = {text!r}; expected a positive size in bytes, e.g. 8GiB, 500MB or 2000000000")
    return int(value * _UNITS[unit])


def _read_kib(path: str, key: str) -> int | None:
    """The ``key:  N kB`` entry of a ``/proc`` file, in bytes (None where unreadable)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory_bytes() -> int:
    """The memory this process can still allocate: the least of the machine's available memory
    (``MemAvailable``), the room under its address-space limit (``RLIMIT_AS`` less its current size)
    and the room left in its cgroup (``memory.max`` less ``memory.current``), where each is known."""
    room: list[int] = []
    available = _read_kib("/proc/meminfo", "MemAvailable")
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = None
    if available is not None:
        room.append(available)
    soft = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else -1
    if resource is not None and soft != resource.RLIM_INFINITY:
        size = _read_kib("/proc/self/status", "VmSize") or 0
        room.append(max(0, soft - size))
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        room.append(max(0, limit - used))
    return min(room) if room else FALLBACK_AVAILABLE_BYTES


def memory_bound_bytes() -> tuple[int, str]:
    """The most bytes one simulation may need, and where that bound comes from (for messages).

    Raises:
        ValueError: for a ``PLACEMENT_RL_SIM_MAX_BYTES`` that is not a size.
    """
    text = os.environ.get(BOUND_VARIABLE)
    if text:
        return parse_bytes(text), f"{BOUND_VARIABLE}={text}"
    if MAX_SIMULATION_BYTES is not None:
        return int(MAX_SIMULATION_BYTES), "placement_rl.sim.limits.MAX_SIMULATION_BYTES"
    available = available_memory_bytes()
    return available // 2, f"half of the {format_gib(available)} this process can still allocate"


def check_above_bytes() -> int:
    """Estimates up to this many bytes pass without a check: :data:`CHECK_ABOVE_BYTES`, or a lower bound
    set by ``PLACEMENT_RL_SIM_MAX_BYTES`` or :data:`MAX_SIMULATION_BYTES`."""
    if os.environ.get(BOUND_VARIABLE) or MAX_SIMULATION_BYTES is not None:
        return min(CHECK_ABOVE_BYTES, memory_bound_bytes()[0])
    return CHECK_ABOVE_BYTES


def format_gib(num_bytes: float) -> str:
    """``12.3 GiB`` (``MiB`` below one GiB, ``KiB`` below one MiB)."""
    if num_bytes < 2**20:
        return f"{num_bytes / 2**10:,.0f} KiB"
    if num_bytes < 2**30:
        return f"{num_bytes / 2**20:,.0f} MiB"
    return f"{num_bytes / 2**30:,.1f} GiB"


def check_size(estimate: SizeEstimate, what: Callable[[], str], *, at_least: bool = False) -> None:
    """Raise :class:`SimulationTooLarge` when ``estimate`` is over the bound; ``what()`` says what is
    simulated (e.g. ``"plan 'data_parallel' of gpt_1t on 3,072 of dgx-h100-x384's 3,072 devices"``),
    called only then; ``at_least``: the estimate is a lower bound (the compute tasks alone).

    Raises:
        SimulationTooLarge: naming the tasks, flows and bytes needed, the bound and what to do.
    """
    needed = estimate.num_bytes
    if needed <= check_above_bytes():
        return
    bound, source = memory_bound_bytes()
    if needed <= bound:
        return
    flows = f" and {estimate.flows:,} flows" if estimate.flows else ""
    about = "at least" if at_least else "about"
    raise SimulationTooLarge(
        f"simulating {what()} needs {about} {estimate.tasks:,} tasks{flows}, {about} {format_gib(needed)}, more "
        f"than the simulator's bound of {format_gib(bound)} ({source}); use fewer "
        f"devices (a smaller topology or cluster preset), or a coarser plan (fewer devices per op, fewer "
        f"micro-batches), or set {BOUND_VARIABLE} higher if the machine has the memory",
        estimate,
        bound,
    )


__all__ = [
    "BOUND_VARIABLE",
    "BYTES_PER_FLOW",
    "BYTES_PER_FLOW_DIRECTION",
    "BYTES_PER_TASK",
    "MAX_SIMULATION_BYTES",
    "SimulationTooLarge",
    "SizeEstimate",
    "available_memory_bytes",
    "check_above_bytes",
    "check_size",
    "memory_bound_bytes",
    "parse_bytes",
]
