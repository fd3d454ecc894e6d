"""The training graph around one gradient, for sufficient factor broadcasting (TAG sec. 4.2.3).

The op graph holds forward ops only; backward is implicit. SFB reasons about the *training* graph,
so this module names its nodes and tensors, for the simulator (what an ``sfb`` configuration
broadcasts and recomputes) and for the SFB program (:mod:`placement_rl.search.sfb`):

* ``forward:<o>``: op ``o``'s forward pass. Reads ``forward:<p>`` through each tensor ``p -> o``.
* ``backward:<o>``: op ``o``'s backward pass. Reads the gradient of each output tensor ``o -> c``
  from ``backward:<c>`` and the saved input activations from ``forward:<p>`` (tensor ``p -> o``).
* ``weight_gradient:<g>``: the gradient of ``g``'s parameters. Reads ``g``'s input activations
  (``forward:<p>``, tensor ``p -> g``) and its output gradient (``backward:<c>``, tensor ``g -> c``):
  for a linear layer ``dW = x^T grad_y``, whose two factors are the *sufficient factors*.

A gradient of the same shape as a tensor has its size, so each training-graph tensor is a graph
tensor (by index) and weighs what the simulator gives that tensor (``SimContext.e_bytes``). Under a
sample split over ``P`` devices each replica holds ``1 / P`` of it.

SFB with duplicated nodes ``S`` (a set of ``forward:``/``backward:`` nodes): every replica computes
the weight gradient and the nodes of ``S`` for the whole batch; it receives from every other replica
the *cut*: every distinct (producer node, tensor) read by the weight gradient or by a node of ``S``
whose producer is not in ``S``. Each replica broadcasts its share of the cut. A tensor read by
several duplicated nodes is broadcast once.

The weight gradient of a parameter op costs its forward pass (``x^T grad_y`` has the FLOPs of
``x W``; a convolution's filter gradient those of the convolution).
"""

from __future__ import annotations

from collections.abc import Iterable

from placement_rl.graph import OpGraph
from placement_rl.sim.cost import CostModel
from placement_rl.topology import Device

FORWARD = "forward"
BACKWARD = "backward"
WEIGHT_GRADIENT = "weight_gradient"


def node_name(kind: str, op: str) -> str:
    """``"forward:conv1"`` for ``(FORWARD, "conv1")``."""
    return f"{kind}:{op}"


def parse_node(graph: OpGraph, name: str) -> tuple[str, str]:
    """``(kind, op name)`` of a training-graph node name.

    Raises:
        ValueError: naming the node when it is not ``forward:<op>``, ``backward:<op>`` or
            ``weight_gradient:<op>`` of an op of ``graph``.
    """
    kind, _, op = name.partition(":")
    if kind not in (FORWARD, BACKWARD, WEIGHT_GRADIENT) or op not in graph:
        raise ValueError(
            f"training-graph node {name!r}; expected 'forward:<op>', 'backward:<op>' or 'weight_gradient:<op>' "
            f"naming an op of graph {graph.name!r}"
        )
    return kind, op


def node_inputs(graph: OpGraph, node: str) -> list[tuple[str, int]]:
    """What a training-graph node reads: ``(producer node, graph tensor index)`` pairs (module docstring)."""
    kind, op = parse_node(graph, node)
    i = graph.index(op)
    tensors = graph.tensors
    activations = [(node_name(FORWARD, tensors[e].src), e) for e in graph.in_tensors[i]]
    gradients = [(node_name(BACKWARD, tensors[e].dst), e) for e in graph.out_tensors[i]]
    if kind == FORWARD:
        return activations
    return gradients + activations  # backward and weight gradient read the same kinds of tensor


def sfb_cut(graph: OpGraph, op: str, duplicated: Iterable[str] = ()) -> list[tuple[str, int]]:
    """The tensors an ``sfb`` configuration of ``op`` broadcasts: distinct ``(producer node, tensor)``
    pairs read by ``weight_gradient:<op>`` or a node of ``duplicated`` from outside ``duplicated``."""
    dup = set(duplicated)
    cut: dict[tuple[str, int], None] = {}
    for node in [node_name(WEIGHT_GRADIENT, op), *dup]:
        for src, e in node_inputs(graph, node):
            if src not in dup:
                cut[(src, e)] = None
    return list(cut)


def node_seconds(cost: CostModel, graph: OpGraph, node: str, partitions: int, device: Device) -> float:
    """Seconds of one replica's share (``1 / partitions`` of the batch) of a training-graph node on ``device``.

    ``forward:`` and ``weight_gradient:`` nodes cost the op's forward task, ``backward:`` its backward
    task (the cost model's :meth:`~placement_rl.sim.cost.CostModel.task_times_s`).
    """
    kind, name = parse_node(graph, node)
    op = graph.op(name)
    shape = list(op.output_shapes[0])
    dim = op.sample_dim
    if dim is not None and not dim.reduction and partitions > 1 and shape[dim.axis] % partitions == 0:
        shape[dim.axis] //= partitions
    fwd, bwd = cost.task_times_s(
        op,
        1.0 / partitions,
        tuple(shape),
        op.param_bytes,
        device.device_type,
        cost.peak_flops(device),
        device.memory_bandwidth_bytes_per_s,
    )
    return bwd if kind == BACKWARD else fwd
