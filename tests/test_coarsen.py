"""METIS coarsening: a partition into at most max_groups acyclic groups that keeps every op once."""

from __future__ import annotations

import pytest

from placement_rl.graph import OpGraph
from placement_rl.graph.coarsen import coarsen


@pytest.mark.parametrize(
    ("name", "max_groups"), [("inception_v3", 60), ("gnmt", 60), ("bert_small", 20), ("resnet50", 7)]
)
def test_every_op_in_exactly_one_group(name: str, max_groups: int, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph: OpGraph = zoo_graph(name)
    coarse = coarsen(graph, max_groups)
    members = [m for group in coarse.ops for m in group.members]
    assert sorted(members) == sorted(op.name for op in graph.ops)
    assert coarse.num_ops <= max_groups
    assert coarse.num_ops == max_groups  # these graphs are big enough to fill every group
    # Totals are preserved; OpGraph's constructor already proved the group graph acyclic.
    assert coarse.param_bytes == graph.param_bytes
    assert coarse.forward_flops == pytest.approx(graph.forward_flops)
    assert coarse.metadata["coarsened_from"] == graph.name
    # Every cut tensor of the original graph appears between the two groups that hold its ends.
    group_of = {m: g.name for g in coarse.ops for m in g.members}
    pairs = {(t.src, t.dst) for t in coarse.tensors}
    for t in graph.tensors:
        if group_of[t.src] != group_of[t.dst]:
            assert (group_of[t.src], group_of[t.dst]) in pairs


def test_same_seed_same_groups(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    assert coarsen(graph, 30, seed=3) == coarsen(graph, 30, seed=3)


def test_small_graph_keeps_one_op_per_group(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    coarse = coarsen(graph, 60)
    assert [g.members for g in coarse.ops] == [(op.name,) for op in graph.ops]


def test_bad_arguments() -> None:
    graph = OpGraph("g", [], [])
    with pytest.raises(ValueError, match="max_groups = 0"):
        coarsen(graph, 0)
    with pytest.raises(ValueError, match="balance_factor = 0.5"):
        coarsen(graph, 4, balance_factor=0.5)
