"""The Llama zoo models: Llama-shaped (RMSNorm, rotary, grouped-query attention, SiLU-gated MLP), 7B's size."""

from __future__ import annotations

import pytest

from placement_rl import zoo
from placement_rl.zoo.llama import LLAMA_7B


def test_llama_models_are_llama_shaped() -> None:
    module, _ = zoo.build_module("llama_7b")
    assert sum(p.numel() for p in module.parameters()) == 6_738_415_616  # Llama-7B's parameter count
    small = zoo.load("llama")
    types = {op.op_type for op in small.ops}
    assert {"rms_norm", "attention", "silu", "embedding", "cross_entropy"} <= types
    attention = next(op for op in small.ops if op.op_type == "attention")
    assert attention.output_shapes[0] == (8, 8, 256, 64)  # 8 query heads over 4 key/value heads
    k_proj = next(op for op in small.ops if op.name.endswith("k_proj"))
    assert k_proj.param_bytes == 512 * 4 * 64 * 4  # 4 key/value heads of 64


def test_seven_b_is_an_option_set_of_the_one_model() -> None:
    assert zoo.spec("llama_7b").options == LLAMA_7B
    assert set(zoo.spec("llama").options) == set(LLAMA_7B)
    with pytest.raises(ValueError, match="heads 8 is not a multiple of kv_heads 3"):
        zoo.load("llama", kv_heads=3)
    with pytest.raises(ValueError, match="hidden size 512 is not divisible by the number of heads 7"):
        zoo.load("llama", heads=7)
