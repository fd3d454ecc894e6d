"""Collapse repeated step structures (an unrolled scan) into one op each.

``torch.export`` unrolls Python loops: the CPU path of Mamba's selective scan becomes, per time step,
the same handful of ops (slice the step's inputs, multiply-add into the state, read out), so a
sequence of 512 tokens gives thousands of tiny ops that no placement would split between devices and
that make every search slow. :func:`collapse_repeats` finds such runs and replaces each by one op.

A run is accepted when all of the following hold:

- **Periodic**: ops ``start + k * L + j`` (step ``k``, position ``j`` of a unit of ``L`` ops, ops in
  the graph's topological order) have the same type, output shapes, dtype, FLOPs, bytes, parallel
  dimensions, split class and parameters for every step ``k``.
- **Same wiring**: every step reads from its own ops and from the previous step in the same way
  (same positions, outputs and tensor sizes); what it reads from outside the run may differ.
- **Chained**: each step reads something from the step before (a carried state). Identical but
  independent ops (attention heads, experts) are never merged.
- **At most one parameter key**: the steps use no parameters, or one shared parameter (an unrolled
  RNN cell). Distinct layers of a transformer carry different parameter keys and so are never
  periodic: they stay separate ops that a plan may put on different devices.
- **Long**: at least ``min_steps`` steps.

The collapsed op (``op_type`` ``"group"``, as the op groups of :mod:`placement_rl.graph.coarsen`,
with no ``members``: its parts are not ops of the returned graph) is exact on totals: its forward and
backward FLOPs, bytes read and written are the sums over the run's ops, its parameters are the run's
one parameter key (so :attr:`OpGraph.param_bytes` is unchanged) and its outputs are the members'
outputs stacked over the steps (output ``i`` has the member's shape with a last axis of ``steps``),
so its activation bytes are the members' sum. It keeps the parallel dimensions every member has (for
an unrolled scan, the batch). Tensors from outside into the run become one tensor per source tensor
(a tensor read by every step travels once); tensors out of the run become one tensor per consumer and
collapsed output, their bytes summed.

The cost model times the collapsed op as one kernel, as the fused scan kernels of GPU libraries run
it; the host's per-step kernel launches of an eager Python loop are not counted.

``graph.metadata["repeats"]`` records what was collapsed::

    {"original_ops": 4679, "runs": [{"op": "repeat0", "steps": 512, "unit_ops": 9, "ops": 4608,
                                      "first": "select", "last": "select_2047",
                                      "unit": ["slice", "mul", ...]}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.graph.ir import Op, OpGraph, ParallelDim, Shape, SplitClass, Tensor

#: The fewest steps a run needs before :func:`placement_rl.models.load_model` collapses it.
DEFAULT_MIN_STEPS = 64
#: The largest repeated unit (ops per step) searched for.
DEFAULT_MAX_UNIT_OPS = 256

# An in-edge of a step's op: (steps back: 0 same step, 1 previous; position; source output; shape; bytes),
# or (-1, -1, -1, shape, bytes) for a tensor from outside the run.
_EdgeKey = tuple[int, int, int, Shape, int]


@dataclass(frozen=True)
class Run:
    """A run of ``steps`` repeated units of ``unit_ops`` ops, from op index ``start`` (topological order).

    Attributes:
        start: the index of the run's first op in ``graph.ops``.
        unit_ops: ops per step (``L``).
        steps: how many steps (``R``); the run is ops ``start .. start + L * R - 1``.
    """

    start: int
    unit_ops: int
    steps: int

    @property
    def stop(self) -> int:
        """One past the index of the run's last op."""
        return self.start + self.unit_ops * self.steps


def find_repeats(
    graph: OpGraph, min_steps: int = DEFAULT_MIN_STEPS, max_unit_ops: int = DEFAULT_MAX_UNIT_OPS
) -> list[Run]:
    """The runs of repeated, chained step structures of ``graph`` (module docstring), disjoint, by start.

    Args:
        graph: the op graph.
        min_steps: the fewest steps a run needs (at least 2).
        max_unit_ops: the largest unit (ops per step) tried.

    Raises:
        ValueError: if ``min_steps < 2`` or ``max_unit_ops < 1``.
    """
    if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 2:
        raise ValueError(f"min_steps = {min_steps!r}; expected an integer >= 2")
    if isinstance(max_unit_ops, bool) or not isinstance(max_unit_ops, int) or max_unit_ops < 1:
        raise ValueError(f"max_unit_ops = {max_unit_ops!r}; expected an integer >= 1")
    n = graph.num_ops
    signature_ids: dict[tuple[Any, ...], int] = {}
    sig = np.array([signature_ids.setdefault(_signature(op, i), len(signature_ids)) for i, op in enumerate(graph.ops)])
    candidates: list[tuple[int, int, int, int]] = []  # (-ops covered, unit, start, steps)
    for unit in range(1, min(max_unit_ops, n // min_steps) + 1):
        same = sig[:-unit] == sig[unit:]  # same[i]: op i and op i + unit look alike
        for a, b in _true_runs(same):
            steps = (b - a + unit) // unit  # ops a .. b + unit - 1 are periodic
            if steps >= min_steps:
                candidates.append((-steps * unit, unit, a, steps))
    runs: list[Run] = []
    taken = np.zeros(n, dtype=bool)
    index = {op.name: i for i, op in enumerate(graph.ops)}
    for _, unit, a, steps in sorted(candidates):
        if taken[a : a + steps * unit].any():
            continue
        run = _check_run(graph, index, a, unit, steps, min_steps)
        if run is not None and not taken[run.start : run.stop].any():
            taken[run.start : run.stop] = True
            runs.append(run)
    return sorted(runs, key=lambda r: r.start)


def collapse_repeats(
    graph: OpGraph, min_steps: int = DEFAULT_MIN_STEPS, max_unit_ops: int = DEFAULT_MAX_UNIT_OPS
) -> OpGraph:
    """``graph`` with each run of :func:`find_repeats` replaced by one op; ``graph`` itself when there is none.

    Totals are kept exactly: forward and backward FLOPs, parameter bytes, bytes read and written, and
    activation (output) bytes. ``metadata["repeats"]`` records the runs (module docstring).
    """
    runs = find_repeats(graph, min_steps, max_unit_ops)
    if not runs:
        return graph
    ops = graph.ops
    owner: dict[int, int] = {}  # op index -> run index
    for r, run in enumerate(runs):
        owner.update(dict.fromkeys(range(run.start, run.stop), r))
    used = {op.name for op in ops}
    new_ops: dict[int, Op] = {}  # first index of a run (or the op's index) -> op
    out_index: dict[tuple[int, int], int] = {}  # (member index, member output) -> output of its run's op
    records = []
    for r, run in enumerate(runs):
        name = _fresh_name(f"repeat{r}", used)
        op, outputs = _collapsed_op(graph, run, name)
        new_ops[run.start] = op
        for (j, o), i_out in outputs.items():
            for k in range(run.steps):
                out_index[(run.start + k * run.unit_ops + j, o)] = i_out
        records.append(
            {
                "op": name,
                "steps": run.steps,
                "unit_ops": run.unit_ops,
                "ops": run.steps * run.unit_ops,
                "first": ops[run.start].name,
                "last": ops[run.stop - 1].name,
                "unit": [ops[run.start + j].op_type for j in range(run.unit_ops)],
            }
        )
    for i, op in enumerate(ops):
        if i not in owner:
            new_ops[i] = op
    index = {op.name: i for i, op in enumerate(ops)}

    def new_name(i: int) -> str:
        return new_ops[runs[owner[i]].start].name if i in owner else ops[i].name

    # Tensors touching a run merge per (source, source output, consumer) of the new graph, in the
    # order of their first occurrence; within a merge, a tensor read by several steps counts once.
    order: list[Tensor | tuple[str, int, str]] = []
    merged: dict[tuple[str, int, str], dict[tuple[str, int], Tensor]] = {}
    for t in graph.tensors:
        s, d = index[t.src], index[t.dst]
        if s not in owner and d not in owner:
            order.append(t)
        elif not (s in owner and d in owner and owner[s] == owner[d]):  # not inside one run
            key = (new_name(s), out_index[(s, t.src_output)] if s in owner else t.src_output, new_name(d))
            if key not in merged:
                merged[key] = {}
                order.append(key)
            previous = merged[key].get((t.src, t.src_output))
            if previous is None or t.num_bytes > previous.num_bytes:
                merged[key][(t.src, t.src_output)] = t
    tensors: list[Tensor] = []
    for item in order:
        if isinstance(item, Tensor):
            tensors.append(item)
            continue
        parts = list(merged[item].values())
        shape = parts[0].shape if len(parts) == 1 else (*parts[0].shape, len(parts))
        tensors.append(Tensor(item[0], item[2], shape, sum(p.num_bytes for p in parts), item[1]))
    previous_meta = graph.metadata.get("repeats") or {}
    metadata = {
        **graph.metadata,
        "repeats": {
            "original_ops": previous_meta.get("original_ops", graph.num_ops),
            "runs": [*previous_meta.get("runs", []), *records],
        },
    }
    return OpGraph(
        graph.name, [new_ops[i] for i in sorted(new_ops)], tensors, batch_size=graph.batch_size, metadata=metadata
    )


# ------------------------------------------------------------------------------------ detection
def _signature(op: Op, index: int) -> tuple[Any, ...]:
    """What two steps' ops must share; a group op with members matches nothing."""
    if op.members:
        return ("members", index)
    return (
        op.op_type,
        op.output_shapes,
        op.dtype_bytes,
        op.forward_flops,
        op.backward_flops,
        op.param_bytes,
        op.param_key,
        op.bytes_read,
        op.bytes_written,
        op.parallel_dims,
        op.split,
    )


def _true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[(a, b), ...]``: the maximal index ranges ``a <= i < b`` where ``mask[i]`` is true."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _in_edges(
    graph: OpGraph, index: dict[str, int], start: int, unit: int, steps: int, k: int
) -> tuple[tuple[_EdgeKey, ...], ...]:
    """Step ``k``'s in-edges per position, relative to the step (``_EdgeKey``), each position's sorted."""
    tensors = graph.tensors
    base = start + k * unit
    out = []
    for j in range(unit):
        keys: list[_EdgeKey] = []
        for e in graph.in_tensors[base + j]:
            t = tensors[e]
            s = index[t.src]
            if start <= s < start + steps * unit:
                ks, js = divmod(s - start, unit)
                keys.append((k - ks, js, t.src_output, t.shape, t.num_bytes))
            else:
                keys.append((-1, -1, -1, t.shape, t.num_bytes))
        out.append(tuple(sorted(keys)))
    return tuple(out)


def _as_outside(edges: tuple[tuple[_EdgeKey, ...], ...]) -> tuple[tuple[_EdgeKey, ...], ...]:
    """Edges from the previous step re-read as edges from outside (what the first step sees)."""
    return tuple(
        tuple(
            sorted((-1, -1, -1, shape, nb) if back == 1 else (back, j, o, shape, nb) for back, j, o, shape, nb in pos)
        )
        for pos in edges
    )


def _check_run(graph: OpGraph, index: dict[str, int], start: int, unit: int, steps: int, min_steps: int) -> Run | None:
    """The longest run from ``start`` (or one step later) whose steps are wired alike and chained, if long enough."""
    if steps < 2:
        return None
    reference = _in_edges(graph, index, start, unit, steps, 1)
    chained = any(key[0] == 1 for pos in reference for key in pos)
    if not chained or any(key[0] > 1 for pos in reference for key in pos):
        return None
    good = 2
    while good < steps and _in_edges(graph, index, start, unit, steps, good) == reference:
        good += 1
    first = 0 if _in_edges(graph, index, start, unit, steps, 0) == _as_outside(reference) else 1
    count = good - first
    run = Run(start + first * unit, unit, count)
    if count < min_steps or not _parameters_ok(graph.ops[run.start : run.start + unit]):
        return None
    return run


def _parameters_ok(unit: Sequence[Op]) -> bool:
    """At most one parameter key, and no unkeyed parameters beside it."""
    keys = {op.param_key for op in unit if op.param_key is not None}
    unkeyed = any(op.param_key is None and op.param_bytes > 0 for op in unit)
    return len(keys) == 0 or (len(keys) == 1 and not unkeyed)


# ------------------------------------------------------------------------------------ collapsing
def _fresh_name(base: str, used: set[str]) -> str:
    name, n = base, 0
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name


def _collapsed_op(graph: OpGraph, run: Run, name: str) -> tuple[Op, dict[tuple[int, int], int]]:
    """The op standing for ``run`` and, per (unit position, member output), its output index."""
    members = graph.ops[run.start : run.stop]
    unit = members[: run.unit_ops]
    # Outputs read outside the run come first, so output 0 (whose axes parallel dims refer to) is one of them.
    read_outside: set[tuple[int, int]] = set()
    for i in range(run.start, run.stop):
        for e in graph.out_tensors[i]:
            t = graph.tensors[e]
            if not run.start <= graph.index(t.dst) < run.stop:
                read_outside.add(((i - run.start) % run.unit_ops, t.src_output))
    slots = [(j, o) for j, op in enumerate(unit) for o in range(len(op.output_shapes))]
    slots.sort(key=lambda jo: (jo not in read_outside, jo))
    outputs = {jo: n for n, jo in enumerate(slots)}
    shapes = tuple((*unit[j].output_shapes[o], run.steps) for j, o in slots)
    first = unit[slots[0][0]]
    dims: tuple[ParallelDim, ...] = ()
    if slots[0][1] == 0:
        dims = tuple(d for d in first.parallel_dims if all(d in op.parallel_dims for op in unit))
    splits = {op.split for op in unit}
    split: SplitClass = "none" if "none" in splits else "sum" if "sum" in splits else "concat"
    keyed = [op for op in unit if op.param_key is not None]
    param_key = keyed[0].param_key if keyed else None
    param_bytes = max(op.param_bytes for op in keyed) if keyed else sum(op.param_bytes for op in members)
    # Bytes per element of the largest output, so mixed dtypes (a cast in the step) stay close in total.
    dtype_bytes = max(unit, key=lambda op: (op.output_bytes, op.dtype_bytes)).dtype_bytes
    op = Op(
        name=name,
        op_type="group",
        output_shapes=shapes,
        dtype_bytes=dtype_bytes,
        forward_flops=float(sum(op.forward_flops for op in members)),
        backward_flops=float(sum(op.backward_flops for op in members)),
        param_bytes=param_bytes,
        param_key=param_key,
        bytes_read=sum(op.bytes_read for op in members),
        bytes_written=sum(op.bytes_written for op in members),
        parallel_dims=dims,
        split=split,
    )
    return op, outputs


__all__ = ["DEFAULT_MAX_UNIT_OPS", "DEFAULT_MIN_STEPS", "Run", "collapse_repeats", "find_repeats"]
