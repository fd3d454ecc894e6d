"""A Llama-style decoder-only language model in plain PyTorch: the project's own reference Llama.

The architecture of Llama 1/2 (Touvron et al., 2023), written here without ``transformers``:

* token embedding, ``num_layers`` pre-norm decoder layers, a final RMSNorm and an untied LM head;
* RMSNorm (``nn.RMSNorm``, eps 1e-5) before attention and before the MLP, no biases anywhere;
* rotary position embeddings (rotate-half form, base 10000) on queries and keys, from ``cos`` / ``sin``
  tables built once per model as non-persistent buffers;
* grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads, computed by
  ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)`` (one graph op);
* SiLU-gated MLP: ``down(silu(gate(x)) * up(x))`` of width ``intermediate``.

``forward(tokens, target)`` returns the mean next-token cross-entropy over all positions, as the
other zoo models do. Two registrations: ``llama``, a small configuration (4 layers, hidden 512) that
imports in about a second, and ``llama_7b``, Llama-7B's configuration (32 layers, hidden 4096, 32
heads, MLP 11008, vocabulary 32000, sequence 2048; 6.74 B parameters), built on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from placement_rl.zoo.sequence import _zoo_model as zoo_model
from placement_rl.zoo.spec import ZooModel

ROPE_BASE = 10000.0
NORM_EPS = 1e-5

#: Llama-7B (Touvron et al. 2023, Table 2; Llama 2's 7B has the same shapes with sequence 4096).
LLAMA_7B: dict[str, object] = {
    "num_layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 32,
    "intermediate": 11008,
    "vocab_size": 32000,
    "seq_len": 2048,
}

#: Llama-3-8B (Grattafiori et al. 2024, Table 3): grouped-query attention, 8 key/value heads.
LLAMA3_8B: dict[str, object] = {
    "num_layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "intermediate": 14336,
    "vocab_size": 128256,
    "seq_len": 8192,
}

#: Llama-2-70B (Touvron et al. 2023, "Llama 2", Table 1 and the released config): 8 key/value heads.
LLAMA2_70B: dict[str, object] = {
    "num_layers": 80,
    "hidden": 8192,
    "heads": 64,
    "kv_heads": 8,
    "intermediate": 28672,
    "vocab_size": 32000,
    "seq_len": 4096,
}

#: The small default: the same layer structure at a size that imports and simulates quickly, with
#: grouped-query attention (8 query heads over 4 key/value heads) exercised.
LLAMA_SMALL: dict[str, object] = {
    "num_layers": 4,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 4,
    "intermediate": 1376,
    "vocab_size": 32000,
    "seq_len": 256,
}


def rotary_tables(seq_len: int, head_dim: int, base: float = ROPE_BASE) -> tuple[Tensor, Tensor]:
    """``(cos, sin)``, each ``(seq_len, head_dim)``: angles ``pos * base**(-2i / head_dim)``, halves repeated."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings and no biases."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by the number of heads {heads}")
        if heads % kv_heads:
            raise ValueError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)."""
        return x.reshape(x.shape[0], -1, heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(x), self.kv_heads)
        v = self._split(self.v_proj(x), self.kv_heads)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], -1, self.heads * self.head_dim))


class MLP(nn.Module):
    """SiLU-gated feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm layer: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.attention = Attention(hidden, heads, kv_heads)
        self.post_attention_norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attention(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    """Decoder-only Llama language model; ``forward(tokens, target)`` is the next-token loss.

    Shapes:
        tokens: ``(batch, seq_len)`` int64 token ids.
        target: ``(batch, seq_len)`` int64 next-token ids.
        returns: a scalar, the mean cross-entropy over ``batch * seq_len`` positions.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        hidden: int,
        heads: int,
        kv_heads: int,
        intermediate: int,
        vocab_size: int,
        seq_len: int,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads, kv_heads, intermediate) for _ in range(num_layers))
        self.norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
        cos, sin = rotary_tables(seq_len, hidden // heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), target.reshape(-1))


def token_inputs(batch_size: int, *, seq_len: int, **_: object) -> tuple[Tensor, ...]:
    """A language model's ``(tokens, target)``, each ``(batch_size, seq_len)`` int64 on the meta device."""
    tokens = torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")
    return tokens, torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")


def _zoo_model(
    name: str, options: Mapping[str, object], *, default_batch_size: int, source: str, description: str
) -> ZooModel:
    """A ``ZooModel`` of :class:`Llama` whose ``build`` / ``example_inputs`` fill in ``options``."""
    return zoo_model(
        name,
        Llama,
        token_inputs,
        options,
        default_batch_size=default_batch_size,
        source=source,
        description=description,
    )


MODELS: tuple[ZooModel, ...] = (
    _zoo_model(
        "llama3_8b",
        LLAMA3_8B,
        default_batch_size=8,
        source="Llama-3-8B (Grattafiori et al. 2024, Table 3)",
        description=(
            "Llama-3-8B: 32 layers, hidden 4096, 32 heads over 8 KV heads, SiLU-gated MLP 14336, vocab 128256, "
            "seq 8192, untied LM head; 8.03B parameters; batch 8 = one sequence per GPU of one DGX H100"
        ),
    ),
    _zoo_model(
        "llama2_70b",
        LLAMA2_70B,
        default_batch_size=64,
        source="Llama-2-70B (Touvron et al. 2023, Llama 2)",
        description=(
            "Llama-2-70B: 80 layers, hidden 8192, 64 heads over 8 KV heads, SiLU-gated MLP 28672, vocab 32000, "
            "seq 4096, untied LM head; 69.0B parameters; batch 64 = one sequence per GPU of 8 DGX H100"
        ),
    ),
    _zoo_model(
        "llama",
        LLAMA_SMALL,
        default_batch_size=8,
        source="Llama (Touvron et al. 2023) architecture, small configuration",
        description=(
            "Llama decoder: RMSNorm pre-norm, rotary embeddings, grouped-query attention (8 heads, 4 KV "
            "heads) by F.scaled_dot_product_attention, SiLU-gated MLP 1376, untied LM head; 4 layers, "
            "hidden 512, vocab 32000, seq 256 (44M parameters)"
        ),
    ),
    _zoo_model(
        "llama_7b",
        LLAMA_7B,
        default_batch_size=16,
        source="Llama-7B (Touvron et al. 2023, Table 2)",
        description=(
            "Llama-7B: 32 layers, hidden 4096, 32 heads (no GQA), SiLU-gated MLP 11008, vocab 32000, seq "
            "2048, untied LM head; 6.74B parameters (25.1 GiB fp32); batch 16 = one sequence per GPU of h100-2x8"
        ),
    ),
)
