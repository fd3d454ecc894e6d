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
from placement_rl.models import HF_IMAGE_SIZE, build_hf, load_model, parse_overrides
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


# ----------------------------------------------------------------- every input, nested configs, checked classes
_TOWER = "num_hidden_layers=1,hidden_size=32,intermediate_size=64,num_attention_heads=2"


def _nested(prefix: str) -> str:
    return ",".join(f"{prefix}.{item}" for item in _TOWER.split(","))


#: One small configuration per checked class (``HF_CHECKED_CLASSES``), nested configs through ``sub.key``.
CHECKED = {
    **{spec.split(":")[0]: spec for spec in SHRUNK.values()},
    "DebertaV2ForMaskedLM": f"DebertaV2ForMaskedLM:{_TOWER},vocab_size=100,relative_attention=true,"
    'position_buckets=8,share_att_key=true,pos_att_type=["p2c","c2p"]',
    "BartForConditionalGeneration": "BartForConditionalGeneration:d_model=32,encoder_layers=1,decoder_layers=1,"
    "encoder_attention_heads=2,decoder_attention_heads=2,encoder_ffn_dim=64,decoder_ffn_dim=64,vocab_size=100,"
    "max_position_embeddings=64",
    "CLIPModel": f"CLIPModel:{_nested('text_config')},text_config.vocab_size=100,{_nested('vision_config')},"
    "vision_config.image_size=32,vision_config.patch_size=8,projection_dim=16",
    "SiglipModel": f"SiglipModel:{_nested('text_config')},text_config.vocab_size=100,{_nested('vision_config')},"
    "vision_config.image_size=32,vision_config.patch_size=8",
    "MambaForCausalLM": "MambaForCausalLM:hidden_size=32,num_hidden_layers=1,state_size=4,vocab_size=100",
}


def test_every_checked_class_has_a_small_config() -> None:
    from placement_rl.models import HF_CHECKED_CLASSES

    assert sorted(CHECKED) == sorted(HF_CHECKED_CLASSES)


def test_inputs_are_built_for_every_input_the_model_takes() -> None:
    module, args, inputs = build_hf(CHECKED["CLIPModel"], 2, 16)
    assert type(module).__name__ == "CLIPModel" and args == ()
    assert module.config.text_config.num_hidden_layers == 1 and module.config.vision_config.image_size == 32
    assert inputs["input_ids"].shape == (2, 16)
    assert inputs["pixel_values"].shape == (2, 3, 32, 32)
    assert inputs["return_loss"] is True  # the contrastive loss is part of the step
    _, _, inputs = build_hf(CHECKED["CLIPModel"], 2, None)
    assert inputs["input_ids"].shape == (2, 77)  # without --seq-len, all of CLIP's 77 positions
    _, _, inputs = build_hf(CHECKED["BartForConditionalGeneration"], 2, 16)
    assert {k: tuple(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)} == {
        "input_ids": (2, 16),
        "decoder_input_ids": (2, 16),
        "labels": (2, 16),
    }
    _, _, inputs = build_hf(SHRUNK["whisper"], 2, 16)
    assert inputs["input_features"].shape == (2, 16, 64) and inputs["decoder_input_ids"].shape == (2, 16)
    _, _, inputs = build_hf(SHRUNK["vit"], 2, 16)
    assert set(inputs) == {"pixel_values", "labels"} and inputs["labels"].shape == (2,)


def test_clip_imports_with_both_inputs() -> None:
    """CLIP's loss numbers the batch (``arange(len(logits))``): the importer either keeps the batch as a
    dimension or refuses with an error that says so; either way both towers are traced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph = load_model(f"hf:{CHECKED['CLIPModel']}", batch_size=2, seq_len=8)
        except ValueError as exc:
            assert "batch" in str(exc)
            return
    assert {"input_ids", "pixel_values"} <= {op.name for op in graph.ops}
    assert sum(op.sample_dim is not None for op in graph.ops) > graph.num_ops / 2


@pytest.mark.slow  # about 10 s: one import per checked class
@pytest.mark.parametrize("name", sorted(set(CHECKED) - {spec.split(":")[0] for spec in SHRUNK.values()}))
def test_checked_classes_import(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            graph = load_model(f"hf:{CHECKED[name]}", batch_size=2, seq_len=16)
        except ValueError as exc:
            assert name == "CLIPModel" and "batch" in str(exc)  # see test_clip_imports_with_both_inputs
            return
    assert graph.batch_size == 2 and graph.num_ops > 20
    assert graph.forward_flops > 0 and graph.param_bytes > 0
    if name != "CLIPModel":
        assert sum(op.sample_dim is not None for op in graph.ops) > graph.num_ops / 2


# ----------------------------------------------------------------- config keys and values
def test_config_keys_the_config_takes_are_accepted() -> None:
    module, _, _ = build_hf(CHECKED["DebertaV2ForMaskedLM"], 1, 8)
    assert module.config.position_buckets == 8 and module.config.share_att_key is True
    module, _, _ = build_hf(f"LlamaForCausalLM:{_TOWER},vocab_size=100,rope_theta=500000.0", 1, 8)
    assert module.config.rope_parameters["rope_theta"] == 500000.0
    with pytest.raises(UnknownNameError, match="unknown option of DebertaV2Config 'position_bucket'.*position_buckets"):
        build_hf(f"DebertaV2ForMaskedLM:{_TOWER},position_bucket=8", 1, 8)
    with pytest.raises(UnknownNameError, match=r"unknown option of CLIPTextConfig \(text_config\) 'num_layers'"):
        build_hf("CLIPModel:text_config.num_layers=1", 1, 8)
    with pytest.raises(ValueError, match="expected key or sub_config.key"):
        build_hf("CLIPModel:text_config.a.b=1", 1, 8)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("hidden_size=0", "hidden_size = 0; expected a positive integer"),
        ("num_hidden_layers=-1", "num_hidden_layers = -1; expected a positive integer"),
        ("hidden_size=NaN", "hidden_size = nan; expected a finite number"),
        ("rms_norm_eps=Infinity", "rms_norm_eps = inf; expected a finite number"),
        ("vocab_size=1e30", "vocab_size = 1e[+]30; expected a positive integer"),
        ("vocab_size=99999999999", "vocab_size = 99999999999; expected a positive integer [(]at most 16777216"),
        ("num_hidden_layers=true", "num_hidden_layers = True; expected a positive integer"),
        ("hidden_size=64.5", "hidden_size = 64.5; expected a positive integer"),
        ("hidden_size=big", "hidden_size = 'big'; expected a positive integer"),
        ("head_dim=0", "head_dim = 0; expected a positive integer"),
        ("attention_bias=3", "attention_bias = 3; expected true or false"),
    ],
)
def test_bad_config_values_are_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_hf(f"LlamaForCausalLM:{override}", 1, 8)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, float("nan"), float("inf"), 2**40])
def test_bad_batch_sizes_and_lengths_are_refused(value: object) -> None:
    spec = f"hf:LlamaForCausalLM:{_TOWER}"
    with pytest.raises(ValueError, match=r"--batch-size = .*; expected a positive integer"):
        load_model(spec, batch_size=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"--seq-len = .*; expected a positive integer"):
        load_model(spec, seq_len=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"--batch-size = .*; expected a positive integer"):
        load_model("lenet", batch_size=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size = .*; expected a positive integer"):
        build_hf(f"LlamaForCausalLM:{_TOWER}", value, 8)  # type: ignore[arg-type]


# ----------------------------------------------------------------- factories
def raises_runtime_error() -> torch.nn.Module:
    raise RuntimeError("no weights here")


def exits() -> torch.nn.Module:
    raise SystemExit(3)


builtin_len = len


def returns_bad_inputs() -> tuple[torch.nn.Module, int]:
    return torch.nn.Linear(2, 2), 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sys:exit", "'sys' is a standard-library module"),
        ("os.path:join", "'os.path' is a standard-library module"),
        ("builtins:print", "'builtins' is a standard-library module"),
        ("test_hf:builtin_len", "builtin_len is a builtin, not a Python function or class"),
        ("test_hf:warnings", "test_hf has no callable .warnings."),
        ("test_hf:Path", r"Path comes from the standard library \(pathlib\)"),
        ("test_hf:exits", r"exits\(\) raised SystemExit: 3"),
        ("test_hf:raises_runtime_error", r"raises_runtime_error\(\) raised RuntimeError: no weights here"),
        ("test_hf:returns_bad_inputs", "the example inputs are a int; expected a tuple of tensors"),
        ("no such:thing", "'no such' is not a dotted module name"),
    ],
)
def test_bad_factories_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_model(spec)
    assert spec in str(info.value)
    if "raised" in message:
        assert isinstance(info.value.__cause__, BaseException)


def test_a_slow_build_says_it_is_still_running() -> None:
    from threading import Event

    from placement_rl.models import still_running

    lines: list[str] = []
    said = Event()

    def write(line: str) -> None:
        lines.append(line)
        said.set()

    with still_running("building model m", after_s=0.0, every_s=3600.0, write=write):
        assert said.wait(60.0)  # the watcher speaks while the block is still running
    assert lines and lines[0].startswith("building model m ... still running after ")


def test_a_vision_config_without_an_image_size_gets_the_default_side() -> None:
    """ResNet's and RegNet's configs name no image size: the inputs are HF_IMAGE_SIZE square, not an error."""
    graph = load_model("hf:ResNetForImageClassification:depths=[1],hidden_sizes=[8],embedding_size=8", batch_size=2)
    assert graph.ops[0].output_shapes[0] == (2, 3, HF_IMAGE_SIZE, HF_IMAGE_SIZE)
    assert all(any(d.kind == "sample" for d in op.parallel_dims) for op in graph.ops if op.forward_flops > 0)
