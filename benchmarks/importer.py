"""Importer benchmark: wall time and peak memory of large imports, and FLOPs against FlopCounterMode.

    python benchmarks/importer.py                       # Llama-7B and Llama-70B configs, batch 8 x 2048 tokens
    python benchmarks/importer.py --models 7b --seq-len 128   # one model, shorter sequences
    python benchmarks/importer.py --models tiny --batch-size 2 --seq-len 16   # a quick check
    python benchmarks/importer.py --accuracy            # shrunk Hugging Face models and zoo models
    python benchmarks/importer.py --accuracy --zoo lenet,llama   # fewer zoo models

``--accuracy`` imports shrunk Hugging Face models (two layers, hidden 64, batch 2 x 16 tokens) and
zoo models (batch 4) through torch.export and prints, per model, the graph's forward and backward
FLOPs over ``FlopCounterMode``'s, measured on the module run forward and backward (Hugging Face
models on CPU with eager attention and eager experts, where FlopCounterMode has formulas for every
product; zoo models on the meta device), the parameter bytes and the fx importer's forward ratio.

Each model is imported in a fresh Python process (``python -c``), so the peak resident memory
(``ru_maxrss``) is that import's alone, interpreter and torch included; the time is the import's wall
time, model construction on the meta device included (torch and transformers already imported). The
table prints the graph's ops, parameter bytes and forward TFLOPs beside them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Model strings of the benchmark (``placement_rl.models.load_model``).
MODELS: dict[str, str] = {
    # LlamaConfig's defaults are Llama-2-7B: 32 layers, hidden 4096, 32 heads, FFN 11008, vocab 32000.
    "7b": "hf:LlamaForCausalLM",
    # Llama-2-70B: 80 layers, hidden 8192, 64 heads of which 8 key/value heads (GQA), FFN 28672.
    "70b": "hf:LlamaForCausalLM:num_hidden_layers=80,hidden_size=8192,intermediate_size=28672,"
    "num_attention_heads=64,num_key_value_heads=8",
    # a one-layer model for a quick check of the script
    "tiny": "hf:LlamaForCausalLM:num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=1000",
}

_CHILD = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import torch, transformers
from placement_rl.models import load_model
start = time.perf_counter()
graph = load_model(sys.argv[1], batch_size=int(sys.argv[2]), seq_len=int(sys.argv[3]))
seconds = time.perf_counter() - start
print(json.dumps({
    "seconds": seconds,
    "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "ops": len(graph.ops),
    "param_bytes": graph.param_bytes,
    "tflops": sum(op.forward_flops for op in graph.ops) / 1e12,
}))
"""


def measure(spec: str, batch_size: int, seq_len: int) -> dict[str, float]:
    """Import ``spec`` in a fresh process; its time, peak memory and graph figures."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, spec, str(batch_size), str(seq_len)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"importing {spec} failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


#: Shrunk Hugging Face configs of ``--accuracy`` (the same as tests/test_hf.py).
SHRUNK: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel:n_layer=2,n_embd=64,n_head=4,vocab_size=1000,n_positions=128",
    "bert": "BertForMaskedLM:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,"
    "vocab_size=1000",
    "t5": "T5ForConditionalGeneration:d_model=64,d_ff=128,num_layers=2,num_heads=4,d_kv=16,vocab_size=1000",
    "llama (GQA)": "LlamaForCausalLM:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=1000",
    "mixtral": "MixtralForCausalLM:hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=1000,num_local_experts=4,num_experts_per_tok=2",
    "vit": "ViTForImageClassification:hidden_size=64,num_hidden_layers=2,num_attention_heads=4,intermediate_size=128,"
    "image_size=32,patch_size=8",
    "whisper": "WhisperForConditionalGeneration:d_model=64,encoder_layers=2,decoder_layers=2,encoder_attention_heads=4,"
    "decoder_attention_heads=4,encoder_ffn_dim=128,decoder_ffn_dim=128,num_mel_bins=16,max_source_positions=32,"
    "max_target_positions=64,vocab_size=1000",
}


def _counted(run: Any) -> tuple[int, int]:
    """FlopCounterMode's forward and backward totals of ``run()`` (which returns the loss)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as forward:
        loss = run()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


def accuracy(zoo_models: Sequence[str]) -> None:
    """Print the ``--accuracy`` table."""
    import warnings

    warnings.simplefilter("ignore")
    from placement_rl import zoo
    from placement_rl.graph.aten import from_export
    from placement_rl.models import build_hf, load_model

    print("| model | ops | parameter bytes (graph = module) | forward / FlopCounterMode | backward / FlopCounterMode |")
    print("|---|---|---|---|---|")
    for name, spec in SHRUNK.items():
        graph = load_model(f"hf:{spec}", batch_size=2, seq_len=16)
        extra = ",attn_implementation=eager" + (",experts_implementation=eager" if "Mixtral" in spec else "")
        module, args, kwargs = build_hf(spec + extra, 2, 16, device="cpu")
        module.eval()
        fwd, bwd = _counted(lambda m=module, a=args, k=kwargs: m(*a, **k).loss)
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        _row(f"hf {name}", graph, params, fwd, bwd)
    for name in zoo_models:
        module, inputs = zoo.build_module(name, batch_size=4)
        graph = from_export(module, inputs, name=name)
        reference, ref_inputs = zoo.build_module(name, batch_size=4)
        for p in reference.parameters():
            p.requires_grad_(True)
        fwd, bwd = _counted(lambda m=reference, i=ref_inputs: m(*i))
        params = sum(p.numel() * p.element_size() for p in {id(p): p for p in reference.parameters()}.values())
        fx_graph = zoo.load(name, batch_size=4)
        fx_ratio = sum(op.forward_flops for op in fx_graph.ops) / fwd
        _row(f"zoo {name} (fx: {fx_graph.num_ops} ops, forward {fx_ratio:.4f})", graph, params, fwd, bwd)


def _row(label: str, graph: Any, params: int, fwd: int, bwd: int) -> None:
    f = sum(op.forward_flops for op in graph.ops) / fwd
    b = sum(op.backward_flops for op in graph.ops) / bwd
    same = "exact" if graph.param_bytes == params else f"{graph.param_bytes} vs {params}"
    print(f"| {label} | {graph.num_ops} | {same} | {f:.4f} | {b:.4f} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="7b,70b", help=f"comma-separated, of {sorted(MODELS)} (default both)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--accuracy", action="store_true", help="FLOPs against FlopCounterMode instead")
    parser.add_argument(
        "--zoo",
        default="lenet,resnet50,inception_v3,bert_small,llama,transformer,rnnlm",
        help="zoo models of --accuracy",
    )
    args = parser.parse_args(argv)
    if args.accuracy:
        accuracy([n.strip() for n in args.zoo.split(",") if n.strip()])
        return
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for name in names:
        if name not in MODELS:
            raise SystemExit(f"--models: unknown model {name!r}; expected some of {sorted(MODELS)}")
    print(f"batch {args.batch_size} x {args.seq_len} tokens, one fresh process per model\n")
    print("| model | ops | parameters (GB) | forward TFLOPs | import (s) | peak memory (MiB) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        r = measure(MODELS[name], args.batch_size, args.seq_len)
        print(
            f"| llama-{name} | {int(r['ops'])} | {r['param_bytes'] / 1e9:.1f} | {r['tflops']:.1f} | "
            f"{r['seconds']:.1f} | {r['peak_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
