"""TAG's SFB solver (sec. 4.2.3, Table 2): where to broadcast sufficient factors instead of gradients.

For every replicated gradient (an op with its own parameters whose configuration splits the batch
over ``D >= 2`` devices, one share each, synchronized by all-reduce or a parameter server) a small
integer program decides which subgraph of the training graph around the gradient to duplicate, so
that the tensors entering it (the sufficient factors) are broadcast instead of the gradient being
synchronized. The training graph's nodes are :mod:`placement_rl.sim.sfb`'s: ``weight_gradient:<g>``
(the paper's ``g``), ``forward:<o>`` and ``backward:<o>``; ``l`` is the optimizer op applying
``g``'s gradient. The program is the paper's, solved with :func:`scipy.optimize.milp` (HiGHS; the
paper used Cbc)::

    min  (D-1) sum_i a_i T_i + D (D-1) sum_(j,i) b_ji L_ji / tau - a_g c_sync L_gl / tau
    s.t. a_k <= sum_{(k,i) in E} a_i      for every k in V except l
         b_ji >= a_i - a_j                 for every (j, i) in E
         a, b binary

with ``T_i`` one replica's seconds of node ``i``, ``L_ji`` one replica's bytes of tensor ``(j, i)``,
``L_gl`` the gradient's bytes, ``tau`` the bottleneck bandwidth between the ``D`` devices and
``c_sync`` the synchronization the gradient would otherwise use: ``2 (D-1) / D`` for a ring
all-reduce (the paper's third term) and ``2 (D-1)`` for a parameter server (``D - 1`` pushes and
pulls through the server's link).

Where the paper is vague, this module chooses:

* ``V``: the paper's op group is replaced by a neighbourhood: ``g``, ``l`` and the ancestors of
  ``g`` in the training graph up to ``radius`` hops (default 2) whose ops are configured exactly
  like ``g``'s (same devices, same split), the only ones that can be duplicated on its replicas.
  Producers outside ``V`` are fixed at ``a = 0``, so what a duplicated node reads from them is cut.
  The forward pass of a graph source (an op reading no tensor: the input batch) is never in ``V``:
  each device reads its own share of the data, so the input is broadcast, not re-read.
* ``l`` (the update) costs nothing: every replica updates its own parameter copy under any sync.
* A tensor read by several duplicated nodes is broadcast once: one ``b`` per (producer, tensor),
  constrained by each of its consumers (the paper has one per edge).
* ``T_i`` is taken on the slowest of the ``D`` devices; latency is ignored, as in the paper.
* A tiny cost (1 ns) per duplicated node breaks ties toward the smallest subgraph.

SFB pays where the optimum duplicates ``g`` at a negative objective; :func:`apply_sfb` turns those
ops to sync ``sfb`` with ``sfb_duplicate`` the other duplicated nodes. The simulator then prices the
choice with its own network model (:mod:`placement_rl.sim.simulator`), which may disagree with the
program's single-bottleneck estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from placement_rl.graph import OpGraph
from placement_rl.plan.core import OpConfig, Plan
from placement_rl.sim import sfb as _sfb
from placement_rl.sim import simulator as _simulator
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology

#: The sync modes whose gradients the solver considers (``sfb`` ones are decided again).
SFB_FROM_SYNCS: tuple[str, ...] = ("all_reduce", "all_reduce_per_tensor", "parameter_server", "sfb")
_TIE_S = 1e-9
_APPLY = "apply"


@dataclass(frozen=True)
class SfbChoice:
    """The SFB decision for one replicated gradient.

    Attributes:
        op: the parameter op (the paper's ``g``).
        replicas: ``D``, the devices holding a replica.
        uses_sfb: whether the program duplicates the gradient (SFB pays).
        duplicated: the other training-graph nodes duplicated with it (``forward:<op>``, ``backward:<op>``).
        factor_bytes: what one replica broadcasts to each other replica under the chosen cut (with
            ``uses_sfb`` false: under the smallest cut, the op's own input and output gradient).
        broadcast_bytes: all SFB traffic, ``D (D - 1) factor_bytes``.
        gradient_bytes: the gradient's bytes.
        sync_bytes: what the current synchronization moves: ``2 (D - 1) gradient_bytes`` (ring
            all-reduce or parameter server).
        objective_s: the program's optimum (negative: SFB saves that much).
        candidates: the nodes of ``V`` besides ``g`` and ``l``.
        status: the solver's status message.
    """

    op: str
    replicas: int
    uses_sfb: bool
    duplicated: tuple[str, ...]
    factor_bytes: float
    broadcast_bytes: float
    gradient_bytes: float
    sync_bytes: float
    objective_s: float
    candidates: int
    status: str


def _eligible(graph: OpGraph, plan: Plan, op_name: str) -> bool:
    op = graph.op(op_name)
    cfg = plan[op_name]
    if op.param_bytes <= 0 or cfg.sync not in SFB_FROM_SYNCS or len(cfg.devices) < 2:
        return False
    if op.param_key is not None and sum(o.param_key == op.param_key for o in graph.ops) > 1:
        return False
    kinds = {d.name: d.kind for d in op.parallel_dims}
    sample_only = all(kinds.get(name) == "sample" for name, _ in cfg.degrees)
    return sample_only and cfg.replicas == 1 and len(set(cfg.devices)) == len(cfg.devices)


def _bottleneck_bytes_per_s(ctx: _simulator.SimContext, devices: tuple[str, ...]) -> float:
    idx = [ctx._device_index[d] for d in devices]
    pairs = np.array([a * ctx.num_devices + b for a in idx for b in idx if a != b], dtype=np.int64)
    return float(ctx.network.bandwidths(pairs).min())


def solve_sfb(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    op_name: str,
    cost_model: CostModel | None = None,
    *,
    radius: int = 2,
) -> SfbChoice:
    """The SFB program (module docstring) for the gradient of ``op_name`` under ``plan``.

    Raises:
        ValueError: naming the op when its gradient is not a replicated one the program applies to
            (own parameters, a sample split over ``D >= 2`` devices, one share each, sync one of
            :data:`SFB_FROM_SYNCS`), or when ``radius`` is negative.
    """
    if radius < 0:
        raise ValueError(f"radius {radius}; expected a non-negative number of hops")
    if not _eligible(graph, plan, op_name):
        cfg = plan[op_name]
        raise ValueError(
            f"op {op_name!r}: no replicated gradient for SFB (parameter bytes {graph.op(op_name).param_bytes}, "
            f"sync {cfg.sync!r}, {len(cfg.devices)} device(s), degrees {cfg.degree_map}); SFB needs own "
            f"parameters split along the batch over >= 2 devices, one share each, sync one of {list(SFB_FROM_SYNCS)}"
        )
    ctx = _simulator.context(graph, topology, cost_model)
    cfg = plan[op_name]
    D = len(cfg.devices)
    devices = [topology.devices[ctx._device_index[d]] for d in cfg.devices]
    tau = _bottleneck_bytes_per_s(ctx, cfg.devices)
    gradient_bytes = ctx.cost.gradient_bytes(graph.op(op_name))
    c_sync = 2.0 * (D - 1) if cfg.sync == "parameter_server" else 2.0 * (D - 1) / D

    # V: g, l and g's ancestors within ``radius`` hops whose ops are configured like g's.
    g = _sfb.node_name(_sfb.WEIGHT_GRADIENT, op_name)
    nodes = [_APPLY, g]
    frontier = [g]
    for _ in range(radius):
        grown = []
        for node in frontier:
            for src, _e in _sfb.node_inputs(graph, node):
                other = plan[src.partition(":")[2]]
                source = not graph.in_tensors[graph.index(src.partition(":")[2])] and src.startswith("forward:")
                if src not in nodes and not source and other.devices == cfg.devices and other.degrees == cfg.degrees:
                    nodes.append(src)
                    grown.append(src)
        frontier = grown
    index = {n: k for k, n in enumerate(nodes)}
    seconds = np.array([0.0] + [max(_sfb.node_seconds(ctx.cost, graph, n, D, d) for d in devices) for n in nodes[1:]])
    # Tensors: one b per (producer, tensor) read by a node of V, and the gradient (g, l).
    tensors: dict[tuple[str, int], list[int]] = {}
    for node in nodes[1:]:
        for key in _sfb.node_inputs(graph, node):
            tensors.setdefault(key, []).append(index[node])
    keys = list(tensors)
    N, M = len(nodes), len(keys) + 1
    tensor_bytes = np.array([ctx.e_bytes[e] / D for _, e in keys] + [gradient_bytes])
    c = np.concatenate([(D - 1) * seconds + _TIE_S, D * (D - 1) * tensor_bytes / tau])
    c[index[g]] -= c_sync * gradient_bytes / tau
    rows: list[np.ndarray] = []
    upper: list[float] = []
    # a_k <= sum of its consumers' a (k in V \ {l}); g's only consumer is l
    consumers: dict[int, set[int]] = {index[g]: {index[_APPLY]}}
    for (src, _e), readers in tensors.items():
        if src in index:
            consumers.setdefault(index[src], set()).update(readers)
    for k in range(1, N):
        row = np.zeros(N + M)
        row[k] = 1.0
        for i in consumers.get(k, ()):
            row[i] -= 1.0
        rows.append(row)
        upper.append(0.0)
    # b >= a_i - a_j for every reader i of a tensor of producer j (a_j = 0 outside V)
    for m, key in enumerate(keys):
        for i in tensors[key]:
            row = np.zeros(N + M)
            row[i] = 1.0
            row[N + m] = -1.0
            if key[0] in index:
                row[index[key[0]]] -= 1.0
            rows.append(row)
            upper.append(0.0)
    row = np.zeros(N + M)  # the gradient itself: cut when l is duplicated and g is not
    row[index[_APPLY]], row[index[g]], row[N + M - 1] = 1.0, -1.0, -1.0
    rows.append(row)
    upper.append(0.0)
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), -np.inf, np.array(upper)),
        integrality=np.ones(N + M),
        bounds=Bounds(0, 1),
    )
    if res.x is None:
        raise RuntimeError(f"op {op_name!r}: the SFB program has no solution ({res.message})")
    alpha = np.round(res.x[:N]).astype(bool)
    uses = bool(alpha[index[g]]) and float(res.fun) < 0.0
    duplicated = tuple(n for n, a in zip(nodes, alpha, strict=True) if a and n not in (g, _APPLY)) if uses else ()
    cut = _sfb.sfb_cut(graph, op_name, duplicated)
    factor_bytes = float(sum(ctx.e_bytes[e] for _, e in cut)) / D
    return SfbChoice(
        op=op_name,
        replicas=D,
        uses_sfb=uses,
        duplicated=duplicated,
        factor_bytes=factor_bytes,
        broadcast_bytes=D * (D - 1) * factor_bytes,
        gradient_bytes=gradient_bytes,
        sync_bytes=2.0 * (D - 1) * gradient_bytes,
        objective_s=float(res.fun),
        candidates=N - 2,
        status=str(res.message),
    )


def sfb_decisions(
    graph: OpGraph, topology: DeviceTopology, plan: Plan, cost_model: CostModel | None = None, *, radius: int = 2
) -> list[SfbChoice]:
    """:func:`solve_sfb` for every replicated gradient of ``plan`` (graph order); other ops are skipped."""
    plan.validate(graph, topology)
    return [
        solve_sfb(graph, topology, plan, op.name, cost_model, radius=radius)
        for op in graph.ops
        if _eligible(graph, plan, op.name)
    ]


def apply_sfb(
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    cost_model: CostModel | None = None,
    *,
    radius: int = 2,
    choices: list[SfbChoice] | None = None,
) -> Plan:
    """``plan`` with every gradient where SFB pays synchronized by ``sfb`` (others as they were; an
    ``sfb`` op where it no longer pays goes back to ``all_reduce``). ``choices`` reuses
    :func:`sfb_decisions`' output. The plan is named ``<name>+sfb``; its metadata lists the SFB ops."""
    if choices is None:
        choices = sfb_decisions(graph, topology, plan, cost_model, radius=radius)
    configs = dict(plan.configs)
    for ch in choices:
        cfg = configs[ch.op]
        sync = "sfb" if ch.uses_sfb else ("all_reduce" if cfg.sync == "sfb" else cfg.sync)
        configs[ch.op] = OpConfig(
            cfg.devices, cfg.degrees, sync, cfg.ps_device if sync == "parameter_server" else None, ch.duplicated
        )
    sfb_ops = [ch.op for ch in choices if ch.uses_sfb]
    out = Plan(graph.name, configs, name=f"{plan.name}+sfb", metadata={**plan.metadata, "sfb_ops": sfb_ops})
    out.validate(graph, topology)
    return out
