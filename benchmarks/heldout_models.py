"""Held-out model suite: Hugging Face models the importer was not developed on, each imported shrunk.

    python benchmarks/heldout_models.py                 # every model, one fresh process each (~10 min)
    python benchmarks/heldout_models.py --models GPTJ,Bloom --json out.json

Every model string is imported with ``placement_rl.models.load_model`` (batch 4, 32 tokens) in its
own process with a time limit, and sorted into one outcome:

* ``ok``: the graph imported and its batch axis is right: at least 95% of its forward FLOPs are in
  ops with a sample dimension (a specialized batch would leave most ops without one);
* ``batch axis lost``: it imported, but less than 95% of its FLOPs carry a sample dimension;
* ``refused``: the import raised ``ValueError`` (or a subclass) with a one-line message;
* ``traceback``: any other exception;
* ``hang``: the time limit passed.

The suite goal is every model ``ok`` or ``refused`` with a clear message; none lost, traceback or hang.
The models are none of those the importer was developed or first tried on (see the docs page
docs/guide/own-model.md, "Model strings", for those).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

_DEC = "num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4,vocab_size=1000"
_ENC_DEC = (
    "encoder_layers=1,decoder_layers=1,d_model=64,encoder_attention_heads=4,decoder_attention_heads=4,"
    "encoder_ffn_dim=128,decoder_ffn_dim=128,vocab_size=1000"
)
_VIT = "num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4,image_size=32,patch_size=8"

#: name -> model string: 28 classes of 15 families, shrunk to import in seconds.
MODELS: dict[str, str] = {
    "GPTJ": "hf:GPTJForCausalLM:n_layer=1,n_embd=64,n_head=4,rotary_dim=8,vocab_size=1000",
    "CodeGen": "hf:CodeGenForCausalLM:n_layer=1,n_embd=64,n_head=4,rotary_dim=8,vocab_size=1000",
    "Bloom": "hf:BloomForCausalLM:n_layer=1,hidden_size=64,n_head=4,vocab_size=1000",
    "GPTBigCode": "hf:GPTBigCodeForCausalLM:n_layer=1,n_embd=64,n_head=4,vocab_size=1000",
    "GPTNeo": (
        'hf:GPTNeoForCausalLM:num_layers=1,hidden_size=64,num_heads=4,vocab_size=1000,attention_types=[[["global"],1]]'
    ),
    "XGLM": "hf:XGLMForCausalLM:num_layers=1,d_model=64,attention_heads=4,ffn_dim=128,vocab_size=1000",
    "StableLm": f"hf:StableLmForCausalLM:{_DEC},num_key_value_heads=4",
    "Phi": f"hf:PhiForCausalLM:{_DEC}",
    "Olmo": f"hf:OlmoForCausalLM:{_DEC}",
    "Cohere": f"hf:CohereForCausalLM:{_DEC}",
    "Granite": f"hf:GraniteForCausalLM:{_DEC}",
    "Albert": f"hf:AlbertForMaskedLM:{_DEC},embedding_size=32",
    "Electra": f"hf:ElectraForMaskedLM:{_DEC},embedding_size=32",
    "MPNet": f"hf:MPNetForMaskedLM:{_DEC}",
    "Nystromformer": f"hf:NystromformerForMaskedLM:{_DEC},num_landmarks=8,segment_means_seq_len=32",
    "XLMRobertaXL": f"hf:XLMRobertaXLForMaskedLM:{_DEC}",
    "Pegasus": f"hf:PegasusForConditionalGeneration:{_ENC_DEC}",
    "MBart": f"hf:MBartForConditionalGeneration:{_ENC_DEC}",
    "Marian": f"hf:MarianMTModel:{_ENC_DEC},decoder_vocab_size=1000",
    "BlenderbotSmall": f"hf:BlenderbotSmallForConditionalGeneration:{_ENC_DEC}",
    "LongT5": "hf:LongT5ForConditionalGeneration:num_layers=1,d_model=64,d_ff=128,num_heads=4,d_kv=16,vocab_size=1000",
    "BEiT": f"hf:BeitForImageClassification:{_VIT}",
    "DeiT": f"hf:DeiTForImageClassification:{_VIT}",
    "Dinov2": (
        "hf:Dinov2ForImageClassification:num_hidden_layers=1,hidden_size=64,mlp_ratio=2,num_attention_heads=4,"
        "image_size=32,patch_size=8"
    ),
    "ResNet": "hf:ResNetForImageClassification:depths=[1,1],hidden_sizes=[16,32],embedding_size=16",
    "RegNet": "hf:RegNetForImageClassification:depths=[1,1],hidden_sizes=[16,32],embedding_size=16",
    "MobileViT": (
        "hf:MobileViTForImageClassification:image_size=64,hidden_sizes=[32,48,64],"
        "neck_hidden_sizes=[8,16,24,32,40,48,160]"
    ),
    "Wav2Vec2": (
        "hf:Wav2Vec2ForCTC:num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4,vocab_size=32"
    ),
}

_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
from placement_rl.models import load_model
try:
    graph = load_model(sys.argv[1], batch_size=4, seq_len=32)
except ValueError as exc:
    print(json.dumps({"outcome": "refused", "message": str(exc)}))
    raise SystemExit(0)
total = sum(op.forward_flops for op in graph.ops) or 1.0
sampled = sum(op.forward_flops for op in graph.ops if any(d.kind == "sample" for d in op.parallel_dims))
print(json.dumps({"ops": graph.num_ops, "sample_flop_share": sampled / total,
                  "unknown_ops": graph.metadata.get("unknown_ops")}))
"""


def run_one(spec: str, timeout_s: float) -> dict[str, Any]:
    """Import ``spec`` in a fresh process; the outcome record (module docstring)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, spec], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "seconds": timeout_s}
    seconds = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"outcome": "traceback", "seconds": seconds, "message": last}
    record: dict[str, Any] = json.loads(lines[-1])
    record["seconds"] = seconds
    if "outcome" not in record:
        record["outcome"] = "ok" if record["sample_flop_share"] >= 0.95 else "batch axis lost"
    elif "\n" in record["message"].strip():
        record["outcome"] = "traceback"  # a refusal must be one line
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names of MODELS (default all)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per model (default 240)")
    parser.add_argument("--json", help="also write every record here")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; expected names from {sorted(MODELS)}")
    records: dict[str, dict[str, Any]] = {}
    print("| model | outcome | ops | FLOPs with a sample dimension | seconds | note |")
    print("|---|---|---|---|---|---|")
    for name in names:
        r = run_one(MODELS[name], args.timeout)
        records[name] = r
        share = f"{100 * r['sample_flop_share']:.1f}%" if "sample_flop_share" in r else ""
        note = r.get("message", "") or (f"unknown ops: {r['unknown_ops']}" if r.get("unknown_ops") else "")
        print(
            f"| {name} | {r['outcome']} | {r.get('ops', '')} | {share} | {r['seconds']:.1f} | {note[:160]} |",
            flush=True,
        )
    counts: dict[str, int] = {}
    for r in records.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f" (of {len(records)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
