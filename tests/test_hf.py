"""Hugging Face models as model strings: shrunk configs imported through torch.export, checked against
the modules' own parameters and FlopCounterMode over forward and backward."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from placement_rl.errors import UnknownNameError
from placement_rl.models import build_hf, load_model, parse_overrides
from placement_rl.ops import op_kind

pytest.importorskip("transformers")

#: Shrunk configs (two layers, hidden 64): each imports in a second or two.
SHRUNK = {
    "gpt2": "GPT2LMHeadModel:n_layer=2,n_embd=64,n_head=4,vocab_size=1000,n_positions=128",
    "bert": "BertForMaskedLM:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,"
    "vocab_size=1000",
    "t5": "T5ForConditionalGeneration:d_model=64,d_ff=128,num_layers=2,num_heads=4,d_kv=16,vocab_size=1000",
    "llama_gqa": "LlamaForCausalLM:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=1000",
    "mixtral": "MixtralForCausalLM:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=1000,num_local_experts=4,num_experts_per_tok=2",
    "vit": "ViTForImageClassification:hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=128,"
    "image_size=32,patch_size=8",
    "whisper": "WhisperForConditionalGeneration:d_model=64,encoder_layers=2,decoder_layers=2,encoder_attention_heads=4,"
    "decoder_attention_heads=4,encoder_ffn_dim=128,decoder_ffn_dim=128,num_mel_bins=16,max_source_positions=32,"
    "max_target_positions=64,vocab_size=1000",
}

# Op families every test model's ops must fall in: nothing in "other".
_FAMILIES = {"conv", "matmul", "attention", "norm", "activation", "embedding", "routing", "elementwise", "reduction"}


def measured(spec: str, batch: int, seq_len: int) -> tuple[int, int, int]:
    """Parameter bytes, and FlopCounterMode's forward and backward FLOPs of the model run on CPU.

    The reference runs eager attention and eager experts: on CPU, FlopCounterMode has no formula for
    the fused attention kernel or the grouped expert product, and would miss those FLOPs.
    """
    extra = ",attn_implementation=eager" + (",experts_implementation=eager" if "Mixtral" in spec else "")
    module, args, kwargs = build_hf(spec + extra, batch, seq_len, device="cpu")
    module.eval()
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with FlopCounterMode(display=False) as forward:
        loss = module(*args, **kwargs).loss
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return params, forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize("key", list(SHRUNK))
def test_shrunk_hf_models_have_exact_parameters_and_flops(key: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = load_model(f"hf:{SHRUNK[key]}", batch_size=2, seq_len=16)
        params, fwd, bwd = measured(SHRUNK[key], 2, 16)
    assert graph.param_bytes == params
    assert sum(op.forward_flops for op in graph.ops) == pytest.approx(fwd, rel=0.02)
    assert sum(op.backward_flops for op in graph.ops) == pytest.approx(bwd, rel=0.05)
    families = {op_kind(op.op_type).family for op in graph.ops} - {"input", "view", "copy", "loss"}
    assert families <= _FAMILIES, families
    assert graph.metadata["unknown_aten_ops"] == []
    assert graph.batch_size == 2


def test_mixtral_routes_tokens_through_routing_ops() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = load_model(f"hf:{SHRUNK['mixtral']}", batch_size=2, seq_len=16)
    types = {op.op_type for op in graph.ops}
    assert {"topk", "grouped_mm"} <= types
    assert {op_kind(t).family for t in ("topk", "gather", "scatter")} == {"routing"}


def test_local_config_json(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 500,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = load_model(f"hf:{path}:num_hidden_layers=2", batch_size=1, seq_len=8)
    assert sum(op.op_type == "rms_norm" for op in graph.ops) == 2 * 2 + 1


def test_bad_hf_strings() -> None:
    with pytest.raises(UnknownNameError, match="LlamaForCausalLM"):
        load_model("hf:LlamaForCausalLMM")
    with pytest.raises(ValueError, match="seq-len = 4096 exceeds the model's max_position_embeddings = 128"):
        load_model("hf:LlamaForCausalLM:num_hidden_layers=1,max_position_embeddings=128", seq_len=4096)
    with pytest.raises(UnknownNameError, match="unknown option of LlamaConfig 'num_layerz'.*num_hidden_layers"):
        load_model("hf:LlamaForCausalLM:num_layerz=1")
    with pytest.raises(ValueError, match="expected key=value"):
        parse_overrides("num_hidden_layers")
    with pytest.raises(ValueError, match="--seq-len = 8 applies to hf: models"):
        load_model("lenet", seq_len=8)
    assert parse_overrides("a=1,b=true,c=silu,d=[1,2]") == {"a": 1, "b": True, "c": "silu", "d": [1, 2]}


def make_mlp(batch_size: int = 3) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A factory for the ``package.module:factory`` form (this test module is importable as ``test_hf``)."""
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return module, (torch.empty(batch_size, 8, device="meta"),)


def test_factory_string() -> None:
    graph = load_model("test_hf:make_mlp", batch_size=5)
    assert graph.batch_size == 5
    assert [op.op_type for op in graph.ops] == ["input", "linear", "relu", "linear"]
    with pytest.raises(ValueError, match="has no callable 'nothing'"):
        load_model("test_hf:nothing")


def test_experiment_entries_take_model_strings() -> None:
    from placement_rl.errors import SchemaError
    from placement_rl.experiments import ModelEntry
    from placement_rl.experiments import load_model as load_entry
    from placement_rl.topology import resolve_topology

    spec = "hf:LlamaForCausalLM:num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4"
    topology = resolve_topology("tensoropt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = load_entry(ModelEntry(spec, batch_per_device=1, options={"seq_len": 8}), topology)
    assert graph.batch_size == topology.num_devices
    assert max(op.output_shapes[0][1] for op in graph.ops if op.op_type == "linear") == 8
    with pytest.raises(SchemaError, match="expected only seq_len"):
        load_entry(ModelEntry(spec, options={"steps": 2}), topology)
