"""Repeated step structures (:mod:`placement_rl.graph.repeats`): hand-built graphs with known runs, the
totals kept exactly, distinct layers and independent branches left alone, and ``load_model`` collapsing
an unrolled scan of a factory model."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.graph.repeats import collapse_repeats, find_repeats
from placement_rl.models import load_model
from placement_rl.plan.constructors import data_parallel
from placement_rl.sim import simulate
from placement_rl.topology import resolve_topology

B, H = 8, 16  # batch, state width


def _op(name: str, op_type: str, flops: float = 0.0, key: str | None = None, param_bytes: int = 0) -> Op:
    shape = (B, H)
    return Op(
        name,
        op_type,
        (shape,),
        forward_flops=flops,
        backward_flops=2 * flops,
        param_bytes=param_bytes,
        param_key=key,
        bytes_read=2 * B * H * 4,
        bytes_written=B * H * 4,
        parallel_dims=(ParallelDim("sample", "sample", 0, B),),
    )


def _edge(src: str, dst: str) -> Tensor:
    return Tensor(src, dst, (B, H), B * H * 4)


def scan_graph(steps: int, keys: list[str | None] | None = None, chained: bool = True) -> OpGraph:
    """``x -> [slice_t -> mul_t(state) -> add_t] * steps -> stack -> loss``: a carried state ``add_t``
    feeds ``mul_{t+1}``; ``keys[t]`` is step ``t``'s parameter key of its ``mul`` (default none)."""
    ops = [_op("x", "input"), _op("h0", "fill")]
    tensors = []
    state = "h0"
    for t in range(steps):
        key = keys[t] if keys else None
        ops += [
            _op(f"slice{t}", "slice"),
            _op(f"mul{t}", "mul", 10.0, key, 64 if key else 0),
            _op(f"add{t}", "add", 5.0),
        ]
        tensors += [_edge("x", f"slice{t}"), _edge(state if chained else "h0", f"mul{t}")]
        tensors += [_edge(f"slice{t}", f"add{t}"), _edge(f"mul{t}", f"add{t}"), _edge(f"add{t}", "stack")]
        state = f"add{t}"
    ops += [_op("stack", "stack"), _op("loss", "cross_entropy")]
    tensors.append(_edge("stack", "loss"))
    return OpGraph("scan", ops, tensors, batch_size=B)


def totals(graph: OpGraph) -> tuple[float, float, int, int, int, int]:
    return (
        graph.forward_flops,
        graph.backward_flops,
        graph.param_bytes,
        sum(op.bytes_read for op in graph.ops),
        sum(op.bytes_written for op in graph.ops),
        sum(op.output_bytes for op in graph.ops),
    )


def test_an_unrolled_scan_becomes_one_op_with_the_same_totals() -> None:
    graph = scan_graph(70)
    collapsed = collapse_repeats(graph, min_steps=64)
    assert [op.name for op in collapsed.ops] == ["x", "h0", "repeat0", "stack", "loss"]
    assert totals(collapsed) == totals(graph)
    scan = collapsed.op("repeat0")
    assert scan.op_type == "group" and scan.members == ()
    assert scan.output_shapes[0] == (B, H, 70)  # the output read outside (add), stacked over the steps
    assert scan.parallel_dims == (ParallelDim("sample", "sample", 0, B),)
    edges = {(t.src, t.dst): t for t in collapsed.tensors}
    assert set(edges) == {("x", "repeat0"), ("h0", "repeat0"), ("repeat0", "stack"), ("stack", "loss")}
    assert edges[("x", "repeat0")].num_bytes == B * H * 4  # one tensor read by every step travels once
    assert edges[("repeat0", "stack")].num_bytes == 70 * B * H * 4  # every step's output, summed
    assert collapsed.metadata["repeats"] == {
        "original_ops": graph.num_ops,
        "runs": [
            {
                "op": "repeat0",
                "steps": 70,
                "unit_ops": 3,
                "ops": 210,
                "first": "slice0",
                "last": "add69",
                "unit": ["slice", "mul", "add"],
            }
        ],
    }
    assert OpGraph.from_dict(collapsed.to_dict()) == collapsed
    result = simulate(collapsed, resolve_topology("trinity"), data_parallel(collapsed, resolve_topology("trinity")))
    assert result.makespan_s > 0


def test_shared_parameters_are_kept_once() -> None:
    graph = scan_graph(8, keys=["cell"] * 8)  # an unrolled RNN cell: one parameter used by every step
    collapsed = collapse_repeats(graph, min_steps=4)
    assert collapsed.num_ops == 5
    assert collapsed.op("repeat0").param_key == "cell"
    assert totals(collapsed) == totals(graph)


def test_distinct_layers_and_independent_branches_stay_separate() -> None:
    layers = scan_graph(8, keys=[f"layer{t}" for t in range(8)])  # alike, but each its own parameters
    assert find_repeats(layers, min_steps=2) == []
    assert collapse_repeats(layers, min_steps=2) is layers
    branches = scan_graph(8, chained=False)  # alike, but no step reads the one before
    assert find_repeats(branches, min_steps=2) == []


def test_too_few_steps_are_left_alone() -> None:
    graph = scan_graph(63)
    assert collapse_repeats(graph, min_steps=64) is graph
    assert len(find_repeats(graph, min_steps=63)) == 1


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="min_steps = 1; expected an integer >= 2"):
        find_repeats(scan_graph(2), min_steps=1)
    with pytest.raises(ValueError, match="max_unit_ops = 0"):
        find_repeats(scan_graph(2), max_unit_ops=0)


class Scan(nn.Module):
    """A recurrence over 64 time steps written as a Python loop, which ``torch.export`` unrolls."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, 64, 8)
        h = torch.zeros(x.shape[0], x.shape[2], device=x.device)
        outs = []
        for t in range(x.shape[1]):
            h = h * 0.5 + x[:, t]
            outs.append(h)
        return self.proj(torch.stack(outs, 1)).mean()


def make_scan(batch_size: int = 4) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The factory of ``test_repeats:make_scan``."""
    return Scan(), (torch.empty(batch_size, 64, 8),)


@pytest.mark.slow  # torch.export unrolls 64 steps: about 5 s
def test_load_model_collapses_an_unrolled_loop(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from placement_rl.graph import repeats

    unrolled: list[OpGraph] = []
    collapse = repeats.collapse_repeats
    monkeypatch.setattr(repeats, "collapse_repeats", lambda g, **kw: unrolled.append(g) or collapse(g, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = load_model("test_repeats:make_scan", batch_size=4)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "collapsed 1 repeated structure" in captured.err
    (run,) = graph.metadata["repeats"]["runs"]
    (before,) = unrolled
    assert run["steps"] >= 63 and graph.metadata["repeats"]["original_ops"] == before.num_ops
    assert graph.num_ops == before.num_ops - run["ops"] + 1 < 20
    assert totals(graph) == totals(before)
