"""Sequence benchmarks of the papers: Transformer, BERT, GNMT, RNNLM and RNNTC.

Shared building blocks:

* ``MultiHeadAttention``: explicit ``q k^T / sqrt(d)``, softmax and ``@ v`` with ``torch.matmul``, so every
  matmul is a graph node of its own.
* ``TransformerLayer``: the post-LayerNorm layer used by both the encoder-only BERT and the
  encoder-decoder Transformer (the decoder adds cross-attention).
* ``UnrolledLSTM``: a stack of LSTM layers unrolled over a fixed number of steps, as FlexFlow does
  (sec. 8: 40 unrolling steps per recurrent layer); one ``nn.LSTMCell`` per layer is called once per step.

Every model takes batch-first int64 token ids, and its ``forward(*inputs, target)`` returns the mean
cross-entropy loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from placement_rl.errors import UnknownNameError
from placement_rl.zoo.spec import ZooModel

LSTMState = tuple[Tensor, Tensor]


# --------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``heads`` heads, written with explicit matmuls."""

    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by the number of heads {heads}")
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: Tensor) -> Tensor:
        """(batch, seq, hidden) -> (batch, heads, seq, head_dim)."""
        return x.reshape(x.shape[0], -1, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        """Attend from ``query`` (batch, q_len, hidden) to ``memory`` (batch, kv_len, hidden).

        ``mask`` is added to the scores (``-inf`` where attention is forbidden).
        """
        q = self._split(self.query(query))
        k = self._split(self.key(memory))
        v = self._split(self.value(memory))
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if mask is not None:
            scores = scores + mask
        weights = self.dropout(self.softmax(scores))
        context = torch.matmul(weights, v).transpose(1, 2).reshape(query.shape[0], -1, self.hidden)
        return self.output(context)


class TransformerLayer(nn.Module):
    """Post-LayerNorm Transformer layer: self-attention, optional cross-attention, feed-forward.

    Each sub-layer is ``LayerNorm(x + Dropout(sublayer(x)))``; the feed-forward width is ``ffn``.
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int,
        *,
        activation: Callable[[], nn.Module],
        cross_attention: bool = False,
        dropout: float = 0.1,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(hidden, heads, dropout)
        self.self_norm = nn.LayerNorm(hidden, eps=eps)
        self.cross_attention = MultiHeadAttention(hidden, heads, dropout) if cross_attention else None
        self.cross_norm = nn.LayerNorm(hidden, eps=eps) if cross_attention else None
        self.feed_forward = nn.Sequential(
            nn.Linear(hidden, ffn), activation(), nn.Dropout(dropout), nn.Linear(ffn, hidden)
        )
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor | None = None, self_mask: Tensor | None = None) -> Tensor:
        """``x``: (batch, seq, hidden); ``memory``: the encoder output, for layers with cross-attention."""
        x = self.self_norm(x + self.dropout(self.self_attention(x, x, self_mask)))
        if self.cross_attention is not None and self.cross_norm is not None:
            if memory is None:
                raise ValueError("a layer with cross-attention needs the encoder output as memory")
            x = self.cross_norm(x + self.dropout(self.cross_attention(x, memory)))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))


class UnrolledLSTM(nn.Module):
    """A stack of LSTM layers unrolled over the given steps.

    Each layer is one ``nn.LSTMCell`` called once per step, so all steps of a layer share its parameters
    and the traced graph holds one cell op per layer per step.
    """

    def __init__(self, input_size: int, hidden: int, num_layers: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.cells = nn.ModuleList(
            nn.LSTMCell(input_size if layer == 0 else hidden, hidden) for layer in range(num_layers)
        )

    def forward(
        self, inputs: list[Tensor], states: list[LSTMState] | None = None
    ) -> tuple[list[Tensor], list[LSTMState]]:
        """Run the stack over ``inputs`` (one (batch, features) tensor per step).

        ``states`` are the initial (h, c) of each layer, zeros when omitted. Returns the top layer's
        hidden state at every step and the final (h, c) of every layer.
        """
        zeros = inputs[0].new_zeros(inputs[0].shape[0], self.hidden)
        outputs = inputs
        final: list[LSTMState] = []
        for layer, cell in enumerate(self.cells):
            h, c = states[layer] if states is not None else (zeros, zeros)
            step_outputs = []
            for x in outputs:
                h, c = cell(x, (h, c))
                step_outputs.append(h)
            outputs = step_outputs
            final.append((h, c))
        return outputs, final


def _steps(x: Tensor, steps: int) -> list[Tensor]:
    """Slice a batch-first (batch, steps, features) tensor into one tensor per time step."""
    return [x[:, t] for t in range(steps)]


def _sinusoidal_positions(length: int, hidden: int) -> Tensor:
    """The fixed sine/cosine position encodings of "Attention Is All You Need", (length, hidden)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * (-math.log(10000.0) / hidden))
    table = torch.zeros(length, hidden)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


class Transformer(nn.Module):
    """Encoder-decoder Transformer (post-LN, ReLU) with separate source/target embeddings and output layer.

    Inputs are the source tokens, the (shifted) target tokens fed to the decoder and the target tokens to
    predict, all (batch, seq_len); the decoder self-attention is causal.
    """

    def __init__(self, *, num_layers: int, hidden: int, heads: int, seq_len: int, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed_scale = math.sqrt(hidden)
        self.source_embedding = nn.Embedding(vocab_size, hidden)
        self.target_embedding = nn.Embedding(vocab_size, hidden)
        self.register_buffer("positions", _sinusoidal_positions(seq_len, hidden), persistent=False)
        self.register_buffer("causal_mask", torch.full((seq_len, seq_len), float("-inf")).triu(1), persistent=False)
        self.dropout = nn.Dropout(0.1)
        self.encoder = nn.ModuleList(
            TransformerLayer(hidden, heads, 4 * hidden, activation=nn.ReLU) for _ in range(num_layers)
        )
        self.decoder = nn.ModuleList(
            TransformerLayer(hidden, heads, 4 * hidden, activation=nn.ReLU, cross_attention=True)
            for _ in range(num_layers)
        )
        self.output = nn.Linear(hidden, vocab_size)
        self.loss = nn.CrossEntropyLoss()

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        return self.dropout(embedding(tokens) * self.embed_scale + self.positions)

    def forward(self, source: Tensor, decoder_input: Tensor, target: Tensor) -> Tensor:
        memory = self._embed(self.source_embedding, source)
        for layer in self.encoder:
            memory = layer(memory)
        x = self._embed(self.target_embedding, decoder_input)
        for layer in self.decoder:
            x = layer(x, memory, self.causal_mask)
        logits = self.output(x)
        return self.loss(logits.reshape(-1, self.vocab_size), target.reshape(-1))


class BertForMaskedLM(nn.Module):
    """BERT encoder with the masked-LM head; the decoder to the vocabulary is tied to the word embedding.

    The loss is taken over all positions (no masking of the input is modelled), and there is no pooler
    or next-sentence head. Token types are all 0 (a buffer), positions are ``0 .. seq_len - 1``.
    """

    MAX_POSITIONS = 512
    TYPE_VOCAB = 2

    def __init__(self, *, num_layers: int, hidden: int, heads: int, seq_len: int, vocab_size: int) -> None:
        super().__init__()
        if seq_len > self.MAX_POSITIONS:
            raise ValueError(f"seq_len {seq_len} exceeds BERT's {self.MAX_POSITIONS} positions")
        self.vocab_size = vocab_size
        self.word_embedding = nn.Embedding(vocab_size, hidden)
        self.position_embedding = nn.Embedding(self.MAX_POSITIONS, hidden)
        self.type_embedding = nn.Embedding(self.TYPE_VOCAB, hidden)
        self.register_buffer("position_ids", torch.arange(seq_len), persistent=False)
        self.register_buffer("type_ids", torch.zeros(seq_len, dtype=torch.int64), persistent=False)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.layers = nn.ModuleList(
            TransformerLayer(hidden, heads, 4 * hidden, activation=nn.GELU, eps=1e-12) for _ in range(num_layers)
        )
        self.head_transform = nn.Linear(hidden, hidden)
        self.head_activation = nn.GELU()
        self.head_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder = nn.Linear(hidden, vocab_size)
        self.decoder.weight = self.word_embedding.weight
        self.loss = nn.CrossEntropyLoss()

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        x = (
            self.word_embedding(tokens)
            + self.position_embedding(self.position_ids)
            + self.type_embedding(self.type_ids)
        )
        x = self.dropout(self.embedding_norm(x))
        for layer in self.layers:
            x = layer(x)
        x = self.head_norm(self.head_activation(self.head_transform(x)))
        logits = self.decoder(x)
        return self.loss(logits.reshape(-1, self.vocab_size), target.reshape(-1))


class GNMT(nn.Module):
    """FlexFlow's NMT: embeddings, an unrolled LSTM encoder and decoder, attention and a classifier.

    The decoder starts from the encoder's final states. At every decoder step its top hidden state
    attends over the stacked encoder outputs (Luong "general" score, softmax, weighted sum), the context
    and the state are combined by ``tanh(Linear([context; state]))`` and a linear classifier over the
    target vocabulary gives that step's logits.
    """

    def __init__(self, *, num_layers: int, hidden: int, steps: int, vocab_size: int) -> None:
        super().__init__()
        self.steps = steps
        self.vocab_size = vocab_size
        self.source_embedding = nn.Embedding(vocab_size, hidden)
        self.target_embedding = nn.Embedding(vocab_size, hidden)
        self.encoder = UnrolledLSTM(hidden, hidden, num_layers)
        self.decoder = UnrolledLSTM(hidden, hidden, num_layers)
        self.attention_key = nn.Linear(hidden, hidden, bias=False)
        self.attention_softmax = nn.Softmax(dim=1)
        self.attention_combine = nn.Linear(2 * hidden, hidden)
        self.attention_activation = nn.Tanh()
        self.classifier = nn.Linear(hidden, vocab_size)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, source: Tensor, decoder_input: Tensor, target: Tensor) -> Tensor:
        encoded, encoder_states = self.encoder(_steps(self.source_embedding(source), self.steps))
        memory = torch.stack(encoded, dim=1)  # (batch, steps, hidden)
        keys = self.attention_key(memory)
        decoded, _ = self.decoder(_steps(self.target_embedding(decoder_input), self.steps), encoder_states)
        logits = []
        for state in decoded:
            scores = torch.matmul(keys, state.unsqueeze(-1))  # (batch, steps, 1)
            weights = self.attention_softmax(scores)
            context = torch.matmul(weights.transpose(1, 2), memory).squeeze(1)  # (batch, hidden)
            attended = self.attention_activation(self.attention_combine(torch.cat([context, state], dim=-1)))
            logits.append(self.classifier(attended))
        stacked = torch.stack(logits, dim=1)
        return self.loss(stacked.reshape(-1, self.vocab_size), target.reshape(-1))


class RNNLM(nn.Module):
    """FlexFlow's RNNLM: embedding, an unrolled LSTM stack and a linear softmax layer at every step."""

    def __init__(self, *, num_layers: int, hidden: int, steps: int, vocab_size: int) -> None:
        super().__init__()
        self.steps = steps
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.lstm = UnrolledLSTM(hidden, hidden, num_layers)
        self.classifier = nn.Linear(hidden, vocab_size)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        outputs, _ = self.lstm(_steps(self.embedding(tokens), self.steps))
        logits = torch.stack([self.classifier(h) for h in outputs], dim=1)
        return self.loss(logits.reshape(-1, self.vocab_size), target.reshape(-1))


class RNNTC(nn.Module):
    """FlexFlow's RNNTC: embedding, an unrolled LSTM stack and a linear softmax classifier on the last step."""

    def __init__(self, *, num_layers: int, hidden: int, steps: int, vocab_size: int, num_classes: int) -> None:
        super().__init__()
        self.steps = steps
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.lstm = UnrolledLSTM(hidden, hidden, num_layers)
        self.classifier = nn.Linear(hidden, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        outputs, _ = self.lstm(_steps(self.embedding(tokens), self.steps))
        return self.loss(self.classifier(outputs[-1]), target)


# --------------------------------------------------------------------------------------------------
# Example inputs (meta tensors, batch first, target last)
# --------------------------------------------------------------------------------------------------


def _tokens(*shape: int) -> Tensor:
    return torch.empty(*shape, dtype=torch.int64, device="meta")


def _seq2seq_inputs(batch_size: int, length: int) -> tuple[Tensor, ...]:
    """Source tokens, decoder input tokens and target tokens, each (batch, length)."""
    return _tokens(batch_size, length), _tokens(batch_size, length), _tokens(batch_size, length)


def _transformer_inputs(batch_size: int, *, seq_len: int, **_: object) -> tuple[Tensor, ...]:
    return _seq2seq_inputs(batch_size, seq_len)


def _bert_inputs(batch_size: int, *, seq_len: int, **_: object) -> tuple[Tensor, ...]:
    return _tokens(batch_size, seq_len), _tokens(batch_size, seq_len)


def _gnmt_inputs(batch_size: int, *, steps: int, **_: object) -> tuple[Tensor, ...]:
    return _seq2seq_inputs(batch_size, steps)


def _rnnlm_inputs(batch_size: int, *, steps: int, **_: object) -> tuple[Tensor, ...]:
    return _tokens(batch_size, steps), _tokens(batch_size, steps)


def _rnntc_inputs(batch_size: int, *, steps: int, **_: object) -> tuple[Tensor, ...]:
    return _tokens(batch_size, steps), _tokens(batch_size)


# --------------------------------------------------------------------------------------------------
# Registry records
# --------------------------------------------------------------------------------------------------


def _zoo_model(
    name: str,
    model: Callable[..., nn.Module],
    inputs: Callable[..., tuple[Tensor, ...]],
    options: Mapping[str, object],
    *,
    default_batch_size: int,
    source: str,
    description: str,
) -> ZooModel:
    """A ``ZooModel`` whose ``build`` / ``example_inputs`` fill in ``options`` and reject unknown ones."""
    defaults = dict(options)

    def resolve(overrides: Mapping[str, object]) -> dict[str, object]:
        for key in overrides:
            if key not in defaults:
                raise UnknownNameError(f"{name} option", key, defaults)
        return {**defaults, **overrides}

    def build(**overrides: object) -> nn.Module:
        return model(**resolve(overrides))

    def example_inputs(batch_size: int, **overrides: object) -> tuple[Tensor, ...]:
        return inputs(batch_size, **resolve(overrides))

    return ZooModel(
        name=name,
        build=build,
        example_inputs=example_inputs,
        default_batch_size=default_batch_size,
        source=source,
        description=description,
        options=defaults,
    )


MODELS: tuple[ZooModel, ...] = (
    _zoo_model(
        "transformer",
        Transformer,
        _transformer_inputs,
        {"num_layers": 6, "hidden": 512, "heads": 8, "seq_len": 64, "vocab_size": 32000},
        default_batch_size=480,
        source="TAG Table 3 (407 MB parameters); TensorOpt Table 1 uses a larger one",
        description=(
            "Transformer-base encoder-decoder (6+6 post-LN layers, d_model 512, 8 heads, FFN 2048, "
            "separate source/target embeddings and output layer, sinusoidal positions, vocab 32000, "
            "seq 64); ~93M parameters (373 MB fp32) vs TAG's 407 MB, whose vocabulary is not given"
        ),
    ),
    _zoo_model(
        "bert_small",
        BertForMaskedLM,
        _bert_inputs,
        {"num_layers": 4, "hidden": 512, "heads": 8, "seq_len": 128, "vocab_size": 30522},
        default_batch_size=96,
        source="TAG Table 3 (98 MB)",
        description=(
            "BERT L=4 H=512 A=8 FFN 2048 with the masked-LM head (decoder tied to the word embedding), "
            "loss over all positions, no pooler/NSP head; ~29M parameters (~115 MB fp32) vs TAG's 98 MB"
        ),
    ),
    _zoo_model(
        "bert_large",
        BertForMaskedLM,
        _bert_inputs,
        {"num_layers": 24, "hidden": 1024, "heads": 16, "seq_len": 128, "vocab_size": 30522},
        default_batch_size=16,
        source="TAG Table 3",
        description=(
            "BERT-large L=24 H=1024 A=16 FFN 4096 with the masked-LM head (decoder tied to the word "
            "embedding), loss over all positions, no pooler/NSP head; ~335M parameters"
        ),
    ),
    _zoo_model(
        "gnmt",
        GNMT,
        _gnmt_inputs,
        {"num_layers": 2, "hidden": 1024, "steps": 40, "vocab_size": 32000},
        default_batch_size=64,
        source="FlexFlow Table 4 (NMT) / Trinity (GNMT)",
        description=(
            "FlexFlow Fig. 13 NMT: embeddings, 2-layer LSTM encoder and decoder (hidden 1024) unrolled "
            "40 steps, Luong attention over the encoder outputs and a linear softmax classifier over the "
            "32000-token vocabulary at every decoder step; smaller than Google's 8+8-layer GNMT"
        ),
    ),
    _zoo_model(
        "rnnlm",
        RNNLM,
        _rnnlm_inputs,
        {"num_layers": 2, "hidden": 1024, "steps": 40, "vocab_size": 10000},
        default_batch_size=64,
        source="FlexFlow Table 4",
        description=(
            "FlexFlow RNNLM: embedding, 2 LSTM layers (hidden 1024) unrolled 40 steps and a linear "
            "softmax layer over the 10000-word Penn Treebank vocabulary at every step (sec. 8.3 uses 2 steps)"
        ),
    ),
    _zoo_model(
        "rnntc",
        RNNTC,
        _rnntc_inputs,
        {"num_layers": 4, "hidden": 1024, "steps": 40, "vocab_size": 20000, "num_classes": 2},
        default_batch_size=64,
        source="FlexFlow Table 4",
        description=(
            "FlexFlow RNNTC: embedding (vocab 20000), 4 LSTM layers (hidden 1024) unrolled 40 steps and "
            "a linear softmax classifier over 2 classes on the last step's hidden state"
        ),
    ),
)
