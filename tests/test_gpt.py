"""The GPT zoo models of Megatron-LM's family: the paper's parameter and FLOP formulas, sample dims, options."""

from __future__ import annotations

from fractions import Fraction

import pytest

from placement_rl import zoo
from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.zoo.gpt import (
    GPT_175B,
    MEGATRON_SEQ_LEN,
    MEGATRON_TABLE1,
    MEGATRON_VOCAB_SIZE,
    paper_flops,
    paper_param_count,
    table1_row,
)

#: Small enough to import in well under a second; seq 1024 > 6h makes attention's s^2 term dominate.
_ATTENTION_HEAVY = {"num_layers": 2, "hidden": 256, "heads": 4, "seq_len": 1024, "vocab_size": 1000}


def _shapes(name: str, **overrides: object) -> dict[str, int]:
    """``num_layers``, ``hidden``, ``vocab_size``, ``seq_len`` of a zoo model with ``overrides``."""
    options = {**zoo.spec(name).options, **overrides}
    return {k: int(options[k]) for k in ("num_layers", "hidden", "vocab_size", "seq_len")}  # type: ignore[call-overload]


def _train_flops(graph: OpGraph, op_types: tuple[str, ...] | None = None) -> float:
    """Forward plus backward FLOPs of the graph's ops (of ``op_types`` only, when given)."""
    return sum(op.forward_flops + op.backward_flops for op in graph.ops if op_types is None or op.op_type in op_types)


def test_paper_formulas_are_transcribed_exactly() -> None:
    # The closed forms of Eq. 2 and Eq. 3 as printed, in exact rational arithmetic.
    for b, layers, h, v, s in [(512, 24, 2304, 51200, 2048), (3, 5, 96, 1000, 64), (1, 128, 25600, 51200, 2048)]:
        params = 12 * layers * h**2 * (1 + Fraction(13, 12 * h) + Fraction(v + s, 12 * layers * h))
        assert paper_param_count(num_layers=layers, hidden=h, vocab_size=v, seq_len=s) == params
        shapes = {"batch_size": b, "num_layers": layers, "hidden": h, "vocab_size": v, "seq_len": s}
        with_recompute = 96 * b * s * layers * h**2 * (1 + Fraction(s, 6 * h) + Fraction(v, 16 * layers * h))
        without = 72 * b * s * layers * h**2 * (1 + Fraction(s, 6 * h) + Fraction(v, 12 * layers * h))
        assert paper_flops(**shapes, recompute=True) == with_recompute
        assert paper_flops(**shapes, recompute=False) == without


def test_table1_rows_agree_with_the_formula() -> None:
    assert len(MEGATRON_TABLE1) == 10
    for row in MEGATRON_TABLE1:
        shapes = {"num_layers": row.num_layers, "hidden": row.hidden, "vocab_size": 51200, "seq_len": 2048}
        assert round(paper_param_count(**shapes) / 1e9, 1) == row.params_b
        assert row.hidden % row.heads == 0
        assert row.num_gpus % (row.tensor_parallel * row.pipeline_parallel) == 0
    assert table1_row(39.1).num_layers == 48
    with pytest.raises(UnknownNameError, match=r"unknown Table 1 size .* 2.0; expected one of: .*1008.0"):
        table1_row(2.0)


@pytest.mark.parametrize("name", ["gpt", "gpt_1.7b", "gpt_175b", "gpt_1t"])
def test_module_parameters_are_the_papers_plus_the_final_norm(name: str) -> None:
    # The paper's P leaves out the final LayerNorm's weight and bias (2h); the tied LM head adds none.
    module, _ = zoo.build_module(name, batch_size=1)
    shapes = _shapes(name)
    count = sum(p.numel() for p in module.parameters())
    assert count == paper_param_count(**shapes) + 2 * shapes["hidden"]


def test_named_models_are_the_papers_configurations() -> None:
    for name, params_b in [("gpt_1.7b", 1.7), ("gpt_1t", 1008.0)]:
        row = table1_row(params_b)
        assert zoo.spec(name).options == row.options()
        assert zoo.spec(name).default_batch_size == row.batch_size
    assert zoo.spec("gpt_175b").options == GPT_175B
    assert round(paper_param_count(**_shapes("gpt_175b")) / 1e9, 1) == 174.6  # the paper's Table 2
    assert {zoo.spec(n).options["vocab_size"] for n in ("gpt_1.7b", "gpt_175b", "gpt_1t")} == {MEGATRON_VOCAB_SIZE}
    assert {zoo.spec(n).options["seq_len"] for n in ("gpt_1.7b", "gpt_175b", "gpt_1t")} == {MEGATRON_SEQ_LEN}


@pytest.mark.parametrize("overrides", [{}, _ATTENTION_HEAVY], ids=["default", "attention_heavy"])
def test_graph_parameters_and_flops_match_the_paper(overrides: dict[str, object], zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("gpt", batch_size=2, **overrides)
    shapes = _shapes("gpt", **overrides)
    assert graph.param_bytes == 4 * (paper_param_count(**shapes) + 2 * shapes["hidden"])
    # The graph counts forward and backward, no recomputation: the paper's 72 form. Linear and attention
    # ops add biases and the softmax on top of the paper's matrix products; the element-wise ops
    # (LayerNorm, GELU, residuals, the loss) the rest. Within 2% at these sizes (1.2% attention-heavy).
    paper = paper_flops(batch_size=2, recompute=False, **shapes)
    assert 1.0 <= _train_flops(graph, ("linear", "attention")) / paper < 1.01
    assert 1.0 <= _train_flops(graph) / paper < 1.02


def test_ops_carry_the_sample_dimension(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("gpt", batch_size=2)
    heavy = [op for op in graph.ops if op.op_type in ("linear", "attention", "layer_norm", "gelu")]
    assert len(heavy) == 4 * 8 + 1 + 1  # 4 linear, attention, 2 norms, GELU per block; final norm; LM head
    for op in heavy:
        assert op.sample_dim is not None and op.sample_dim.axis == 0 and op.sample_dim.size == 2, op.name
        assert op.split == "concat", op.name
    attention = next(op for op in graph.ops if op.op_type == "attention")
    assert attention.output_shapes[0] == (2, 8, 256, 64)
    loss = graph.ops[-1]
    assert loss.op_type == "cross_entropy" and loss.sample_dim is not None and loss.sample_dim.size == 2 * 256
    lm_head = next(op for op in graph.ops if op.name == "lm_head")
    assert lm_head.output_shapes[0] == (2, 256, MEGATRON_VOCAB_SIZE) and lm_head.param_bytes == 0  # tied
    # Only the position embedding (one table for every sample) has no sample dimension among costed ops.
    unsplit = {op.name for op in graph.ops if op.sample_dim is None and op.forward_flops + op.param_bytes > 0}
    assert unsplit == {"position_embedding"}


def test_unknown_and_bad_options_are_refused() -> None:
    with pytest.raises(UnknownNameError, match="unknown option of model 'gpt' 'ffn'; expected one of: .*hidden"):
        zoo.load("gpt", ffn=1024)
    with pytest.raises(UnknownNameError, match="unknown model 'gpt_2t'"):
        zoo.load("gpt_2t")
    with pytest.raises(ValueError, match="hidden size 512 is not divisible by the number of heads 7"):
        zoo.build_module("gpt", heads=7)


@pytest.mark.slow
def test_one_trillion_imports_on_the_meta_device() -> None:
    graph = zoo.load("gpt_1t", batch_size=1)
    shapes = _shapes("gpt_1t")
    assert graph.param_bytes == 4 * (paper_param_count(**shapes) + 2 * shapes["hidden"])
    assert graph.num_ops == 6 + 15 * 128 + 5  # inputs and embeddings, 15 ops a block, norm, head and loss
    assert 1.0 <= _train_flops(graph) / paper_flops(batch_size=1, recompute=False, **shapes) < 1.001
    qkv = next(op for op in graph.ops if op.name.endswith("attention_qkv"))
    assert qkv.sample_dim is not None and qkv.sample_dim.size == 1
    assert qkv.output_shapes[0] == (1, 2048, 3 * 25600)
