"""The shared execution simulator and everything it is made of.

* :mod:`.simulator`: :func:`simulate` and :class:`SimContext` (the task graph, scheduling, memory).
* :mod:`.delta`: :class:`DeltaSimulator`, re-simulation after one op's configuration changes.
* :mod:`.cost`: the cost model (compute, communication, memory) and its profile/bandwidth tables.
* :mod:`.result`: :class:`SimResult` and the task table.
* :mod:`.kernels`: the numba inner loops.
* :mod:`.trace`: Chrome traces and Gantt charts of a result.
"""

from placement_rl.sim.cost import CommTable, CostModel, ProfileTable
from placement_rl.sim.delta import DeltaSimulator, oom_cost
from placement_rl.sim.result import TASK_KINDS, SimResult, TaskTable
from placement_rl.sim.simulator import DEFAULT_COST_MODEL, SimContext, context, simulate

__all__ = [
    "DEFAULT_COST_MODEL",
    "TASK_KINDS",
    "CommTable",
    "CostModel",
    "DeltaSimulator",
    "ProfileTable",
    "SimContext",
    "SimResult",
    "TaskTable",
    "context",
    "oom_cost",
    "simulate",
]
