"""Op grouping: coarsen a graph into at most ``max_groups`` op groups with METIS (TAG sec. 4.1).

TAG groups ops with METIS using tensor sizes as edge weights and computation time as the balanced
vertex weight (at most 60 groups, balance factor 2). A METIS partition of a DAG can make the group
graph cyclic (group A feeds B and B feeds A), which no schedule can execute; this module repairs
that before returning, so the coarse graph is a valid :class:`~placement_rl.graph.OpGraph`:

1. METIS (``pymetis``) partitions the undirected op graph into ``max_groups`` parts. Vertex weight:
   forward + backward FLOPs (at least 1); edge weight: tensor bytes in KiB (at least 1);
   ``ufactor = (balance_factor - 1) * 1000``.
2. Acyclic repair: ops are visited in topological order and join the open sub-group of their METIS
   part unless that would close a cycle in the group graph (the sub-group already reaches one of
   the op's producer groups); then a new sub-group of that part is opened. Reachability between
   groups is kept as bitsets, so this is linear in edges times groups / 64.
3. While there are more than ``max_groups`` groups, two groups adjacent in a topological order of
   the group graph are merged (merging such a pair never creates a cycle); the pair joined by a
   tensor with the smallest combined FLOPs goes first.
4. While there are fewer than ``max_groups`` groups (METIS leaves parts empty when single ops
   outweigh the average part, as the largest convolutions of inception_v3 do), the heaviest group
   with two or more members is split at its weighted median in topological order. A prefix/suffix
   split never creates a cycle: a path from the suffix back to the prefix would contradict the order.

Group ops (``op_type == "group"``) carry: the sum of their members' FLOPs and bytes; the parameter
bytes of the parameter keys they hold (a key shared by members of several groups is counted in the
group of its first user, so ``coarse.param_bytes == graph.param_bytes``); one output per distinct
member output consumed outside the group; the sample dimension of the member producing their first
output; and a split class that is ``none`` if any costed member is ``none``, else ``sum`` if any is
``sum``, else ``concat``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import pymetis

from placement_rl.graph import Op, OpGraph, SplitClass, Tensor
from placement_rl.graph.ir import topological_order


def coarsen(graph: OpGraph, max_groups: int = 60, *, balance_factor: float = 2.0, seed: int = 0) -> OpGraph:
    """Group the ops of ``graph`` into at most ``max_groups`` groups.

    Args:
        graph: the op graph.
        max_groups: the largest number of groups (TAG uses 60).
        balance_factor: METIS's allowed ratio between the heaviest part and the average (TAG: 2).
        seed: METIS's random seed; the same seed gives the same grouping.

    Returns:
        An acyclic ``OpGraph`` of group ops named ``group0``, ``group1``, ... whose ``members`` list
        the original op names; every op is in exactly one group. Its metadata records the source graph.

    Raises:
        ValueError: if ``max_groups < 1`` or ``balance_factor < 1``.
    """
    if max_groups < 1:
        raise ValueError(f"max_groups = {max_groups}; expected at least 1")
    if balance_factor < 1.0:
        raise ValueError(f"balance_factor = {balance_factor}; expected at least 1.0")
    n = graph.num_ops
    weights = _op_weights(graph)
    if n <= max_groups:
        assignment = list(range(n))
    else:
        parts = metis_parts(graph, max_groups, balance_factor=balance_factor, seed=seed)
        assignment = _acyclic_split(graph, parts)
        assignment = _merge_to(graph, assignment, max_groups, weights)
        assignment = _split_to(assignment, max_groups, weights)
    return _build_coarse(graph, assignment, max_groups, balance_factor, seed)


def _op_weights(graph: OpGraph) -> np.ndarray:
    """METIS vertex weights: forward + backward FLOPs, at least 1. Shape ``(N,)``."""
    return np.maximum(graph.arrays.forward_flops + graph.arrays.backward_flops, 1.0)


def metis_parts(graph: OpGraph, nparts: int, *, balance_factor: float = 2.0, seed: int = 0) -> list[int]:
    """A METIS partition of ``graph``'s ops into at most ``nparts`` parts (may be cyclic between parts).

    Vertex weights are compute (FLOPs), edge weights tensor KiB; returns the part of each op, in
    ``graph.ops`` order.
    """
    n = graph.num_ops
    if n <= nparts:
        return list(range(n))
    weights = _op_weights(graph)
    arr = graph.arrays
    # Undirected, deduplicated adjacency with summed tensor bytes.
    pair_bytes: dict[tuple[int, int], int] = {}
    for s, d, b in zip(arr.edge_src.tolist(), arr.edge_dst.tolist(), arr.edge_bytes.tolist(), strict=True):
        key = (s, d) if s < d else (d, s)
        pair_bytes[key] = pair_bytes.get(key, 0) + b
    neighbours: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for (a, b), nbytes in pair_bytes.items():
        w = max(1, nbytes // 1024)
        neighbours[a].append((b, w))
        neighbours[b].append((a, w))
    xadj = [0]
    adjncy: list[int] = []
    eweights: list[int] = []
    for lst in neighbours:
        for j, w in lst:
            adjncy.append(j)
            eweights.append(min(w, 2**30))
        xadj.append(len(adjncy))
    # METIS wants integer vertex weights; scale so the heaviest op is about 1e6.
    vweights = np.maximum(1, np.round(weights / weights.max() * 1e6)).astype(np.int64).tolist()
    options = pymetis.Options(ufactor=int(round((balance_factor - 1.0) * 1000)), seed=seed)
    with _quiet_stdout():  # METIS prints "Cannot bisect a graph with 0 vertices" for empty parts
        _, parts = pymetis.part_graph(
            nparts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights, eweights=eweights, options=options
        )
    return list(parts)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence C-level writes to stdout (file descriptor 1) for the duration of the block."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _acyclic_split(graph: OpGraph, parts: Sequence[int]) -> list[int]:
    """Assign ops (topological order) to sub-groups of their METIS part without closing a cycle."""
    preds = graph.predecessors
    open_group: dict[int, int] = {}  # METIS part -> its open sub-group id
    reach: list[int] = []  # group -> bitset of groups reachable from it (itself included)
    reached_by: list[int] = []  # group -> bitset of groups that reach it (itself included)
    assignment: list[int] = []
    for i in range(graph.num_ops):
        pred_groups = {assignment[p] for p in preds[i]}
        g = open_group.get(parts[i])
        if g is None or any(h != g and reach[g] >> h & 1 for h in pred_groups):
            g = len(reach)
            reach.append(1 << g)
            reached_by.append(1 << g)
            open_group[parts[i]] = g
        assignment.append(g)
        for h in pred_groups:
            if h == g or reach[h] >> g & 1:
                continue
            # New edge h -> g: everything reaching h now reaches everything g reaches.
            sources, targets = reached_by[h], reach[g]
            for x in _bits(sources):
                reach[x] |= targets
            for y in _bits(targets):
                reached_by[y] |= sources
    return assignment


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _merge_to(graph: OpGraph, assignment: list[int], max_groups: int, weights: np.ndarray) -> list[int]:
    """Merge topologically adjacent groups until at most ``max_groups`` remain."""
    group_weight: dict[int, float] = {}
    for i, g in enumerate(assignment):
        group_weight[g] = group_weight.get(g, 0.0) + float(weights[i])
    edges = {
        (assignment[s], assignment[d])
        for s, d in zip(graph.arrays.edge_src.tolist(), graph.arrays.edge_dst.tolist(), strict=True)
    }
    edges = {(a, b) for a, b in edges if a != b}
    parent = {g: g for g in group_weight}
    while len(group_weight) > max_groups:
        order = _group_topo_order(group_weight, edges)
        pairs = list(itertools.pairwise(order))
        joined = [p for p in pairs if p in edges]
        a, b = min(joined or pairs, key=lambda p: (group_weight[p[0]] + group_weight[p[1]], p))
        # Merge b into a.
        group_weight[a] += group_weight.pop(b)
        parent[b] = a
        edges = {(a if x == b else x, a if y == b else y) for x, y in edges}
        edges = {(x, y) for x, y in edges if x != y}

    def root(g: int) -> int:
        while parent[g] != g:
            g = parent[g]
        return g

    return [root(g) for g in assignment]


def _split_to(assignment: list[int], max_groups: int, weights: np.ndarray) -> list[int]:
    """Split the heaviest multi-op group at its weighted median until ``max_groups`` groups exist."""
    assignment = list(assignment)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(assignment):
        members.setdefault(g, []).append(i)  # ascending = topological order
    next_id = max(members) + 1
    while len(members) < max_groups:
        splittable = [g for g, idx in members.items() if len(idx) > 1]
        if not splittable:
            break
        g = max(splittable, key=lambda k: (float(weights[members[k]].sum()), -k))
        idx = members[g]
        cumulative = np.cumsum(weights[idx])
        cut = int(np.searchsorted(cumulative, cumulative[-1] / 2.0)) + 1
        cut = min(max(cut, 1), len(idx) - 1)
        members[g], members[next_id] = idx[:cut], idx[cut:]
        for i in idx[cut:]:
            assignment[i] = next_id
        next_id += 1
    return assignment


def _group_topo_order(groups: dict[int, float], edges: set[tuple[int, int]]) -> list[int]:
    """The group ids in stable topological order (smallest id first among ready groups)."""
    ids = sorted(groups)
    position = {g: i for i, g in enumerate(ids)}
    return [ids[i] for i in topological_order(len(ids), ((position[a], position[b]) for a, b in edges))]


def _build_coarse(graph: OpGraph, assignment: list[int], max_groups: int, balance_factor: float, seed: int) -> OpGraph:
    # Number groups by the topological position of their first member.
    first_seen: dict[int, int] = {}
    for g in assignment:
        first_seen.setdefault(g, len(first_seen))
    group_of = [first_seen[g] for g in assignment]
    num_groups = len(first_seen)
    members: list[list[int]] = [[] for _ in range(num_groups)]
    for i, g in enumerate(group_of):
        members[g].append(i)

    # Distinct member outputs consumed outside the group become the group's outputs.
    out_index: dict[tuple[int, int], int] = {}
    group_outputs: list[list[tuple[int, int]]] = [[] for _ in range(num_groups)]
    cut: dict[tuple[int, int, int], Tensor] = {}
    for t in graph.tensors:
        s, d = graph.index(t.src), graph.index(t.dst)
        gs, gd = group_of[s], group_of[d]
        if gs == gd:
            continue
        key = (s, t.src_output)
        if key not in out_index:
            out_index[key] = len(group_outputs[gs])
            group_outputs[gs].append(key)
        if (s, t.src_output, gd) not in cut:
            cut[(s, t.src_output, gd)] = Tensor(f"group{gs}", f"group{gd}", t.shape, t.num_bytes, out_index[key])

    key_owner: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        if op.param_key is not None:
            key_owner.setdefault(op.param_key, group_of[i])

    groups = []
    for g, idx in enumerate(members):
        ops = [graph.ops[i] for i in idx]
        outputs = group_outputs[g] or [(idx[-1], 0)]
        producer = graph.ops[outputs[0][0]]
        keys = {op.param_key: op.param_bytes for op in ops if op.param_key is not None and key_owner[op.param_key] == g}
        param_bytes = sum(keys.values()) + sum(op.param_bytes for op in ops if op.param_key is None)
        costed = [op.split for op in ops if op.parallel_dims or op.forward_flops > 0]
        split: SplitClass = "none" if "none" in costed else "sum" if "sum" in costed else "concat"
        sample = producer.sample_dim
        groups.append(
            Op(
                name=f"group{g}",
                op_type="group",
                output_shapes=tuple(graph.ops[s].output_shapes[o] for s, o in outputs),
                dtype_bytes=producer.dtype_bytes,
                forward_flops=float(sum(op.forward_flops for op in ops)),
                backward_flops=float(sum(op.backward_flops for op in ops)),
                param_bytes=int(param_bytes),
                param_key=f"group{g}" if param_bytes else None,
                bytes_read=int(sum(op.bytes_read for op in ops)),
                bytes_written=int(sum(op.bytes_written for op in ops)),
                parallel_dims=(sample,) if sample is not None and outputs[0][1] == 0 and split != "none" else (),
                split=split,
                members=tuple(op.name for op in ops),
            )
        )
    metadata = {
        "coarsened_from": graph.name,
        "max_groups": max_groups,
        "balance_factor": balance_factor,
        "seed": seed,
    }
    return OpGraph(
        f"{graph.name}/coarse{max_groups}", groups, list(cut.values()), batch_size=graph.batch_size, metadata=metadata
    )
