"""What a simulation returns: :class:`SimResult` (summary figures) and :class:`TaskTable` (every task)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Task kinds, indexed by ``TaskTable.kind``.
TASK_KINDS: tuple[str, ...] = (
    "forward",  # compute: forward pass of one partition of an op
    "backward",  # compute: backward pass of one partition
    "transfer",  # activation sent from a producer partition to a consumer partition
    "gradient_transfer",  # the activation gradient sent back during backward
    "all_reduce",  # all-reduce of a bucket of replicated parameter shards' gradients
    "ps_push",  # gradient pushed to a parameter server
    "ps_pull",  # updated parameters pulled from a parameter server
    "sfb_broadcast",  # one replica's sufficient factors sent to another replica (sync ``sfb``)
    "sfb_gradient",  # compute: a replica rebuilding the whole gradient from every replica's factors
    "host",  # a device's host issuing one compute task's kernels (eager execution)
    "partial_all_reduce",  # all-reduce of partial sums of a tensor-parallel layer (forward) or of its input gradient
)
COMPUTE_KINDS = (0, 1, 8)


@dataclass(frozen=True)
class TaskTable:
    """Every simulated task, as parallel arrays of length ``T``.

    Attributes:
        kind: ``(T,)`` int8, index into :data:`TASK_KINDS`.
        op: ``(T,)`` int32, index of the op in ``SimResult.op_names`` (for synchronization tasks, the
            op owning the parameters); never -1.
        lane: ``(T,)`` int32, index into ``lanes``: the device a compute task runs on, or the first
            link direction a communication task occupies.
        start_s: ``(T,)`` float64 start time.
        end_s: ``(T,)`` float64 end time.
        num_bytes: ``(T,)`` float64 bytes moved (0 for compute tasks).
        lanes: lane names: the devices first (same order as ``SimResult.device_names``), then the
            link directions as ``"link <a> -> <b>"``, then (eager execution) each device's host lane
            as ``"<device> host"``.
        micro_batch: ``(T,)`` int32, the micro-batch a task belongs to, -1 for a synchronization
            task of the whole iteration; empty for a plan of one micro-batch.
    """

    kind: np.ndarray
    op: np.ndarray
    lane: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    num_bytes: np.ndarray
    lanes: tuple[str, ...]
    micro_batch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __len__(self) -> int:
        return int(self.kind.shape[0])


def _empty(dtype: Any = np.float64) -> Any:
    return field(default_factory=lambda: np.zeros(0, dtype))


@dataclass(frozen=True)
class LinkRates:
    """Each link direction's rate over time: from ``time_s[k]`` on, direction ``direction[k]`` carries
    ``bytes_per_s[k]``, until the next entry for that direction (0 before its first). Entries are
    sorted by time under the ``flow`` model and by direction, then time, under the others.

    Shapes: ``(K,)`` each.
    """

    time_s: np.ndarray = _empty()
    direction: np.ndarray = _empty(np.int64)
    bytes_per_s: np.ndarray = _empty()

    def __len__(self) -> int:
        return int(self.time_s.shape[0])

    def of(self, direction: int) -> tuple[np.ndarray, np.ndarray]:
        """``(time_s, bytes_per_s)`` of one direction's steps, in time order."""
        sel = self.direction == direction
        return self.time_s[sel], self.bytes_per_s[sel]


@dataclass(frozen=True)
class CriticalStep:
    """One task on the critical path."""

    kind: str
    op: str
    lane: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    """The simulated cost of one training iteration of a plan.

    Shapes: ``D`` devices, ``L`` links, ``N`` ops. Link direction ``2k`` runs from link ``k``'s end
    ``a`` to ``b``, ``2k + 1`` back (:mod:`placement_rl.sim.network`).

    Attributes:
        makespan_s: time of one training iteration (forward, backward, gradient synchronization).
        device_names: ``D`` device names.
        busy_s: ``(D,)`` seconds each device spends computing.
        idle_s: ``(D,)`` ``makespan_s - busy_s``.
        peak_memory_bytes: ``(D,)`` peak memory per device (parameters, gradients, optimizer state,
            live activations).
        memory_capacity_bytes: ``(D,)`` each device's memory.
        oom: whether any device's peak exceeds its memory.
        oom_devices: the devices that do not fit.
        comm_bytes: total bytes moved between devices (activations, gradients, synchronization).
        comm_time_s: summed duration of all communication tasks.
        link_names: ``L`` link names ``"<a> <-> <b>"`` (topology link order).
        link_bytes: ``(L,)`` bytes crossing each link (both directions).
        link_busy_s: ``(L,)`` seconds each link is busy (the busier direction).
        op_names: ``N`` op names (graph order).
        op_start_s: ``(N,)`` when the op's first forward task starts.
        op_forward_end_s: ``(N,)`` when its last forward task ends.
        op_backward_start_s: ``(N,)`` when its first backward task starts.
        op_end_s: ``(N,)`` when its last backward task ends.
        critical_tasks: ``(K,)`` int64 task ids (into ``tasks``) of the critical path, first to last:
            the chain of tasks, each started by the end of the previous one (a dependency or the
            previous task on its resource), that ends at the makespan.
        tasks: every task with its times (for traces and Gantt charts).
        network: the cost model's network model (``flow``, ``circuit``, ``pairwise``).
        link_direction_names: ``2L`` names ``"link <a> -> <b>"`` (the task table's link lanes).
        link_direction_bytes: ``(2L,)`` bytes each direction carries.
        link_direction_busy_s: ``(2L,)`` seconds each direction carries anything.
        link_direction_capacity_bytes_per_s: ``(2L,)`` each direction's bandwidth.
        link_direction_rates: each direction's rate over time (:class:`LinkRates`).
        micro_batches: micro-batches per iteration of the simulated plan (``tasks.micro_batch``
            says which one each task computes).
    """

    makespan_s: float
    device_names: tuple[str, ...]
    busy_s: np.ndarray
    idle_s: np.ndarray
    peak_memory_bytes: np.ndarray
    memory_capacity_bytes: np.ndarray
    oom: bool
    oom_devices: tuple[str, ...]
    comm_bytes: float
    comm_time_s: float
    link_names: tuple[str, ...]
    link_bytes: np.ndarray
    link_busy_s: np.ndarray
    op_names: tuple[str, ...]
    op_start_s: np.ndarray
    op_forward_end_s: np.ndarray
    op_backward_start_s: np.ndarray
    op_end_s: np.ndarray
    critical_tasks: np.ndarray
    tasks: TaskTable
    network: str = ""
    link_direction_names: tuple[str, ...] = ()
    link_direction_bytes: np.ndarray = _empty()
    link_direction_busy_s: np.ndarray = _empty()
    link_direction_capacity_bytes_per_s: np.ndarray = _empty()
    link_direction_rates: LinkRates = field(default_factory=LinkRates)
    micro_batches: int = 1

    @property
    def link_direction_utilization(self) -> np.ndarray:
        """``(2L,)`` bytes over what the direction could carry in the makespan (1 = busy at full rate throughout)."""
        capacity = self.link_direction_capacity_bytes_per_s * self.makespan_s
        return np.divide(
            self.link_direction_bytes, capacity, out=np.zeros_like(self.link_direction_bytes), where=capacity > 0
        )

    @property
    def critical_path(self) -> tuple[CriticalStep, ...]:
        """The critical path as readable steps (built on demand from ``critical_tasks``)."""
        t = self.tasks
        return tuple(
            CriticalStep(
                TASK_KINDS[t.kind[k]],
                self.op_names[t.op[k]],
                t.lanes[t.lane[k]],
                float(t.start_s[k]),
                float(t.end_s[k]),
            )
            for k in self.critical_tasks.tolist()
        )

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def samples_per_s(self, batch_size: int) -> float:
        """Training throughput for a global batch of ``batch_size`` samples."""
        return batch_size / self.makespan_s if self.makespan_s > 0 else float("inf")

    def summary(self) -> dict[str, Any]:
        """JSON-friendly headline figures."""
        return {
            "makespan_s": self.makespan_s,
            "oom": self.oom,
            "oom_devices": list(self.oom_devices),
            "max_peak_memory_bytes": int(self.peak_memory_bytes.max()) if self.peak_memory_bytes.size else 0,
            "peak_memory_bytes": {d: int(m) for d, m in zip(self.device_names, self.peak_memory_bytes, strict=True)},
            "comm_bytes": self.comm_bytes,
            "comm_time_s": self.comm_time_s,
            "busy_s": {d: float(b) for d, b in zip(self.device_names, self.busy_s, strict=True)},
            "num_tasks": self.num_tasks,
            "network": self.network,
            "max_link_direction_utilization": float(self.link_direction_utilization.max())
            if self.link_direction_bytes.size
            else 0.0,
            "critical_path_length": int(self.critical_tasks.shape[0]),
        }
