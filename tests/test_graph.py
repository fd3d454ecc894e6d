"""The OpGraph IR: validation, topological order, JSON round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor


def _op(name: str, flops: float = 1.0, shape: tuple[int, ...] = (4, 8), **kw: object) -> Op:
    return Op(
        name=name,
        op_type="linear",
        output_shapes=(shape,),
        forward_flops=flops,
        backward_flops=2 * flops,
        parallel_dims=(ParallelDim("sample", "sample", 0, shape[0]),),
        **kw,
    )  # type: ignore[arg-type]


def _t(src: str, dst: str) -> Tensor:
    return Tensor(src, dst, (4, 8), 128)


def test_ops_are_reordered_topologically_and_stably() -> None:
    g = OpGraph("g", [_op("c"), _op("a"), _op("b")], [_t("a", "b"), _t("b", "c")])
    assert [op.name for op in g.ops] == ["a", "b", "c"]
    assert g.predecessors == ((), (0,), (1,))
    assert g.successors == ((1,), (2,), ())
    # Independent ops keep the given order.
    g2 = OpGraph("g", [_op("z"), _op("y")], [])
    assert [op.name for op in g2.ops] == ["z", "y"]


def test_cycle_is_rejected_naming_ops() -> None:
    with pytest.raises(ValueError, match="cycle through op\\(s\\) 'a', 'b'"):
        OpGraph("g", [_op("a"), _op("b"), _op("c")], [_t("a", "b"), _t("b", "a"), _t("b", "c")])
    with pytest.raises(ValueError, match="self-loop"):
        OpGraph("g", [_op("a")], [_t("a", "a")])


@pytest.mark.parametrize(
    ("ops", "tensors", "message"),
    [
        ([_op("a"), _op("a")], [], "duplicate op name 'a'"),
        ([_op("a")], [_t("a", "ghost")], "references op 'ghost'"),
        ([_op("a", flops=-1.0)], [], "forward_flops = -1.0"),
        ([_op("a", param_bytes=-8)], [], "param_bytes = -8"),
        ([_op("a"), _op("b")], [Tensor("a", "b", (4,), -1)], r"num_bytes = -1; expected an integer from 0"),
        ([_op("a"), _op("b")], [Tensor("a", "b", (4,), 16, src_output=1)], "src_output 1 but op 'a' has 1 output"),
        ([Op("a", "relu", ((2, -3),))], [], "negative dimension"),
        (
            [Op("a", "relu", ((4, 8),), parallel_dims=(ParallelDim("s", "sample", 0, 5),))],
            [],
            "size 5 != output extent 4",
        ),
        ([Op("a", "relu", ((4, 8),), parallel_dims=(ParallelDim("s", "sample", 2, 4),))], [], "axis 2 outside"),
        ([Op("a", "relu", ((4, 8),), parallel_dims=(ParallelDim("s", "batch", 0, 4),))], [], "kind 'batch'"),  # type: ignore[arg-type]
        ([Op("a", "relu", ((4, 8),), split="split")], [], "split class 'split'"),  # type: ignore[arg-type]
    ],
)
def test_bad_graphs_raise_naming_the_culprit(ops: list[Op], tensors: list[Tensor], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpGraph("g", ops, tensors)


def test_shared_parameters_are_counted_once() -> None:
    ops = [
        _op("x"),
        _op("s1", param_bytes=100, param_key="cell"),
        _op("s2", param_bytes=100, param_key="cell"),
        _op("fc", param_bytes=40, param_key="fc"),
        _op("free", param_bytes=8),
    ]
    g = OpGraph("g", ops, [_t("x", "s1"), _t("s1", "s2"), _t("s2", "fc")])
    assert g.param_bytes == 100 + 40 + 8


def test_lookup_errors_list_valid_names() -> None:
    g = OpGraph("g", [_op("a")], [])
    with pytest.raises(UnknownNameError, match="unknown op of graph 'g' 'b'; expected one of: a"):
        g.op("b")


def test_json_round_trip_is_lossless_for_a_zoo_graph(tmp_path, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    g = zoo_graph("rnnlm", steps=2)
    path = tmp_path / "g.json"
    g.to_json(path)
    back = OpGraph.from_json(path)
    assert back == g
    assert back.to_dict() == g.to_dict()
    # Shared LSTM parameters and reduction dims survive.
    assert back.param_bytes == g.param_bytes
    loss = back.ops[-1]
    assert loss.split == "sum" and loss.parallel_dims[0].reduction


def test_from_dict_rejects_bad_documents(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = OpGraph("g", [_op("a"), _op("b")], [_t("a", "b")]).to_dict()
    with pytest.raises(SchemaError, match="format 'placement_rl.graph'"):
        OpGraph.from_dict({**good, "format": "something"})
    with pytest.raises(SchemaError, match="schema_version 99"):
        OpGraph.from_dict({**good, "schema_version": 99})
    with pytest.raises(SchemaError, match=r"unknown key\(s\) \['colour'\]"):
        OpGraph.from_dict({**good, "colour": "red"})
    bad_op = json.loads(json.dumps(good))
    bad_op["ops"][0]["forward_flops"] = "lots"
    with pytest.raises(SchemaError, match=r"graph.ops\[0\].forward_flops: expected a number, got 'lots'"):
        OpGraph.from_dict(bad_op)
    cyclic = json.loads(json.dumps(good))
    cyclic["tensors"].append({"src": "b", "dst": "a", "shape": [1], "num_bytes": 4})
    with pytest.raises(ValueError, match="cycle"):
        OpGraph.from_dict(cyclic)
    path = tmp_path / "broken.json"
    path.write_text('{"format": "placement_rl.graph", "ops": [', encoding="utf-8")
    with pytest.raises(SchemaError, match="broken.json: malformed JSON at line 1"):
        OpGraph.from_json(path)


def test_subgraph_keeps_internal_tensors_only() -> None:
    g = OpGraph("g", [_op("a"), _op("b"), _op("c")], [_t("a", "b"), _t("b", "c")])
    sub = g.subgraph(["b", "c"])
    assert [op.name for op in sub.ops] == ["b", "c"]
    assert [(t.src, t.dst) for t in sub.tensors] == [("b", "c")]


def _two_op_document() -> dict:
    a = Op("a", "linear", ((4, 8),), forward_flops=64.0, param_bytes=128, bytes_read=256, bytes_written=128)
    b = Op("b", "relu", ((4, 8),), forward_flops=32.0)
    return OpGraph("g", [a, b], [Tensor("a", "b", (4, 8), 128)], batch_size=4).to_dict()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("ops", 0, "forward_flops"),
            10**30,
            r"graph\.ops\[0\]\.forward_flops = 10{30}; expected a number from 0 to 1e\+18",
        ),
        (("ops", 0, "backward_flops"), 1e300, r"graph\.ops\[0\]\.backward_flops = 1e\+300; expected"),
        (
            ("ops", 0, "param_bytes"),
            10**400,
            r"graph\.ops\[0\]\.param_bytes = 1000.*\(401 characters\); expected an integer from 0 to 1e\+15",
        ),
        (("ops", 0, "bytes_read"), 10**30, r"graph\.ops\[0\]\.bytes_read = 10{30}"),
        (("ops", 1, "bytes_written"), -1, r"graph\.ops\[1\]\.bytes_written = -1; expected an integer from 0"),
        (("ops", 0, "dtype_bytes"), 0, r"graph\.ops\[0\]\.dtype_bytes = 0; expected an integer from 1 to 16"),
        (
            ("ops", 0, "output_shapes"),
            [[10**10, 10**10]],
            r"graph\.ops\[0\]\.output_shapes\[0\] \[10000000000, 10000000000\]: .* bytes; expected at most 1e\+15",
        ),
        (("tensors", 0, "num_bytes"), 10**400, r"graph\.tensors\[0\]\.num_bytes = 1000.*\(401 characters\)"),
        (("tensors", 0, "shape"), [10**20], r"graph\.tensors\[0\]\.shape \[100000000000000000000\]"),
        (("batch_size",), 0, r"graph\.batch_size = 0; expected a positive integer"),
        (("batch_size",), -5, r"graph\.batch_size = -5; expected a positive integer"),
        (("batch_size",), True, r"graph\.batch_size: expected an integer, got True"),
    ],
)
def test_graph_files_out_of_bounds_are_refused_naming_file_key_and_value(
    tmp_path: Any, path: tuple, value: Any, message: str
) -> None:
    doc = _two_op_document()
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    file = tmp_path / "graph.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(SchemaError, match=message) as info:
        OpGraph.from_json(file)
    assert str(info.value).startswith(f"{file}: ")


def test_graph_constructor_refuses_what_the_file_would() -> None:
    with pytest.raises(ValueError, match=r"op 'a': param_bytes = 1000.*; expected an integer from 0 to 1e\+15"):
        OpGraph("g", [Op("a", "relu", ((4,),), param_bytes=10**400)], [])
    with pytest.raises(ValueError, match=r"graph 'g': batch_size = 0; expected a positive integer"):
        OpGraph("g", [Op("a", "relu", ((4,),))], [], batch_size=0)
    with pytest.raises(ValueError, match=r"forward_flops = nan"):
        OpGraph("g", [Op("a", "relu", ((4,),), forward_flops=float("nan"))], [])
