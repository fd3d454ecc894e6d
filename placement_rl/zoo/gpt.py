"""GPT models of Megatron-LM's family (Narayanan et al. 2021), of any size, in plain PyTorch.

"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC '21) scales one
GPT-2/3-style decoder from 1.7 B to 1 T parameters (its Table 1): vocabulary 51,200, sequence 2,048,
and only the hidden size, the number of attention heads and the number of layers varied. The
architecture here is that decoder:

* learned token and position embeddings, added;
* ``num_layers`` pre-LayerNorm blocks: ``x + proj(attention(qkv(LayerNorm(x))))`` with a fused
  ``Linear(h, 3h)`` query/key/value projection, causal attention by
  ``F.scaled_dot_product_attention(is_causal=True)`` (one graph op) and an output ``Linear(h, h)``;
  then ``x + Linear(4h, h)(GELU(Linear(h, 4h)(LayerNorm(x))))``;
* a final LayerNorm and the LM head tied to the token embedding (no bias), as Megatron does;
* ``forward(tokens, target)`` returns the mean next-token cross-entropy, like the other zoo models.

No dropout (it has no FLOPs and no parameters). Parameters: ``12 l h^2 + 13 l h + (V + s) h`` from
the blocks and the embeddings, which is the paper's ``P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))``
(:func:`paper_param_count`), plus ``2h`` for the final LayerNorm, which the paper's formula leaves out.
The tied LM head adds none: the graph counts the shared weight once.

FLOPs of one training iteration, counting the matrix multiplications only (Eq. 3 of the paper):
``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with activation recomputation (an extra forward pass of
the blocks) and ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` without (:func:`paper_flops`). The imported
graph counts forward plus backward (no recomputation), so it matches the 72 form plus the FLOPs of the
element-wise ops (LayerNorm, GELU, residual adds, softmax inside attention, the loss), which the paper
leaves out; attention counts the whole ``s x s`` score matrix, causal or not, as the paper does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from placement_rl.errors import UnknownNameError
from placement_rl.zoo.llama import token_inputs
from placement_rl.zoo.sequence import _zoo_model as zoo_model
from placement_rl.zoo.spec import ZooModel

#: Vocabulary and sequence length of every model of the paper's Table 1.
MEGATRON_VOCAB_SIZE = 51200
MEGATRON_SEQ_LEN = 2048
NORM_EPS = 1e-5


@dataclass(frozen=True)
class MegatronRow:
    """One row of Table 1 of Narayanan et al. 2021 (weak scaling of GPT models on Selene's A100s).

    Attributes:
        params_b: the parameter count in billions, as printed (the paper's formula, rounded).
        heads: attention heads.
        hidden: hidden size ``h``.
        num_layers: transformer layers ``l``.
        tensor_parallel: tensor-model-parallel size ``t``.
        pipeline_parallel: pipeline-model-parallel size ``p``.
        num_gpus: GPUs ``n`` (data-parallel size ``n / (t p)``).
        batch_size: global batch size ``B`` in sequences.
        achieved_tflops_per_gpu: achieved teraFLOP/s per GPU (mixed precision, with recomputation's FLOPs).
    """

    params_b: float
    heads: int
    hidden: int
    num_layers: int
    tensor_parallel: int
    pipeline_parallel: int
    num_gpus: int
    batch_size: int
    achieved_tflops_per_gpu: int

    def options(self) -> dict[str, object]:
        """The ``gpt`` zoo options of this row: ``zoo.load("gpt", batch_size=row.batch_size, **row.options())``."""
        return {
            "num_layers": self.num_layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "vocab_size": MEGATRON_VOCAB_SIZE,
            "seq_len": MEGATRON_SEQ_LEN,
        }


#: Table 1 of Narayanan et al. 2021, row by row. The teraFLOP/s column is as reported in the paper's
#: Table 1 (cross-checked against a transcription of the table; the paper itself is not in this
#: repository).
MEGATRON_TABLE1: tuple[MegatronRow, ...] = (
    MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    MegatronRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    MegatronRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    MegatronRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    MegatronRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    MegatronRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    MegatronRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    MegatronRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    MegatronRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    MegatronRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)


def table1_row(params_b: float) -> MegatronRow:
    """The Table 1 row of ``params_b`` billion parameters (e.g. ``39.1``).

    Raises:
        UnknownNameError: for a size no row has, listing the rows' sizes.
    """
    for row in MEGATRON_TABLE1:
        if row.params_b == params_b:
            return row
    raise UnknownNameError(
        "Table 1 size (billions of parameters)", params_b, (str(r.params_b) for r in MEGATRON_TABLE1)
    )


#: GPT-3 175B's shapes (Brown et al. 2020), which the paper compares with ZeRO-3 in its Table 2 (174.6 B
#: parameters, global batch 1536); not a Table 1 row.
GPT_175B: dict[str, object] = {
    "num_layers": 96,
    "hidden": 12288,
    "heads": 96,
    "vocab_size": MEGATRON_VOCAB_SIZE,
    "seq_len": MEGATRON_SEQ_LEN,
}

#: The small default: the same blocks at a size that imports and simulates quickly.
GPT_SMALL: dict[str, object] = {
    "num_layers": 4,
    "hidden": 512,
    "heads": 8,
    "vocab_size": MEGATRON_VOCAB_SIZE,
    "seq_len": 256,
}


def paper_param_count(*, num_layers: int, hidden: int, vocab_size: int, seq_len: int) -> int:
    """Eq. 2 of the paper, ``12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))``, in exact integer arithmetic."""
    return 12 * num_layers * hidden**2 + 13 * num_layers * hidden + (vocab_size + seq_len) * hidden


def paper_flops(
    *, batch_size: int, num_layers: int, hidden: int, vocab_size: int, seq_len: int, recompute: bool = True
) -> int:
    """Matrix-multiplication FLOPs of one training iteration (Eq. 3 of the paper), exact.

    With ``recompute`` (the paper's runs), ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``: forward, backward
    (twice the forward) and a second forward of every block. Without, ``72 B s l h^2 (1 + s/(6h) +
    V/(12 l h))``. Per block and sample, the forward is ``24 s h^2 + 4 s^2 h``; the LM head ``2 s h V``.
    """
    passes = 4 if recompute else 3
    blocks = passes * batch_size * num_layers * (24 * seq_len * hidden**2 + 4 * seq_len**2 * hidden)
    return blocks + 3 * 2 * batch_size * seq_len * hidden * vocab_size


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused query/key/value projection, Megatron's layout.

    Shapes:
        x: ``(batch, seq, hidden)``.
        returns: ``(batch, seq, hidden)``.
    """

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by the number of heads {heads}")
        self.heads = heads
        self.hidden = hidden
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        batch = x.shape[0]
        # (batch, seq, 3h) -> (batch, heads, seq, 3 * head_dim): each head's q, k, v side by side, as
        # Megatron lays out its fused projection; the batch stays on dimension 0 throughout.
        qkv = self.qkv(x).reshape(batch, -1, self.heads, 3 * (self.hidden // self.heads)).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, -1, self.hidden))


class MLP(nn.Module):
    """``Linear(4h, h)(GELU(Linear(h, 4h)(x)))``; shapes ``(batch, seq, hidden)`` in and out."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.activation = nn.GELU()
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.activation(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``; 12h^2 + 13h parameters."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden, eps=NORM_EPS)
        self.attention = SelfAttention(hidden, heads)
        self.mlp_norm = nn.LayerNorm(hidden, eps=NORM_EPS)
        self.mlp = MLP(hidden)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Megatron-LM's GPT decoder; ``forward(tokens, target)`` is the mean next-token loss.

    Shapes:
        tokens: ``(batch, seq_len)`` int64 token ids.
        target: ``(batch, seq_len)`` int64 next-token ids.
        returns: a scalar, the mean cross-entropy over ``batch * seq_len`` positions.
    """

    def __init__(self, *, num_layers: int, hidden: int, heads: int, vocab_size: int, seq_len: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.token_embedding = nn.Embedding(vocab_size, hidden)
        self.position_embedding = nn.Embedding(seq_len, hidden)
        self.register_buffer("position_ids", torch.arange(seq_len), persistent=False)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(hidden, eps=NORM_EPS)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        x = self.token_embedding(tokens) + self.position_embedding(self.position_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), target.reshape(-1))


def _zoo_model(
    name: str, options: Mapping[str, object], *, default_batch_size: int, source: str, description: str
) -> ZooModel:
    """A ``ZooModel`` of :class:`GPT` whose ``build`` / ``example_inputs`` fill in ``options``."""
    return zoo_model(
        name,
        GPT,
        token_inputs,
        options,
        default_batch_size=default_batch_size,
        source=source,
        description=description,
    )


_ROW_1_7B = table1_row(1.7)
_ROW_1T = table1_row(1008.0)

MODELS: tuple[ZooModel, ...] = (
    _zoo_model(
        "gpt",
        GPT_SMALL,
        default_batch_size=8,
        source="Megatron-LM GPT (Narayanan et al. 2021) architecture, small configuration",
        description=(
            "GPT decoder: pre-LayerNorm, learned positions, fused QKV, causal attention by "
            "F.scaled_dot_product_attention, GELU MLP 4h, LM head tied to the token embedding; 4 layers, "
            "hidden 512, 8 heads, vocab 51200, seq 256 (39M parameters)"
        ),
    ),
    _zoo_model(
        "gpt_1.7b",
        _ROW_1_7B.options(),
        default_batch_size=_ROW_1_7B.batch_size,
        source="Narayanan et al. 2021, Table 1 (1.7B, 32 GPUs)",
        description=(
            "Megatron GPT 1.7B: 24 layers, hidden 2304, 24 heads, vocab 51200, seq 2048; 1.65B "
            "parameters; batch 512 as in the paper"
        ),
    ),
    _zoo_model(
        "gpt_175b",
        GPT_175B,
        default_batch_size=1536,
        source="GPT-3 175B as in Narayanan et al. 2021, Table 2 (174.6B)",
        description=(
            "Megatron GPT of GPT-3 175B's shapes: 96 layers, hidden 12288, 96 heads, vocab 51200, seq "
            "2048; 174.6B parameters; batch 1536 as in the paper's comparison with ZeRO-3"
        ),
    ),
    _zoo_model(
        "gpt_1t",
        _ROW_1T.options(),
        default_batch_size=_ROW_1T.batch_size,
        source="Narayanan et al. 2021, Table 1 (1T, 3072 GPUs)",
        description=(
            "Megatron GPT 1T: 128 layers, hidden 25600, 160 heads, vocab 51200, seq 2048; 1008.0B "
            "parameters; batch 3072 as in the paper"
        ),
    ),
)
