"""TAG's heterogeneous GNN prior (seed 001, sec. 4.2.1, Table 1, Fig. 2) as a torch module and an RLModule.

It scores the actions of ``placement_rl/Placement-v0`` with ``action_space="tag"``: action
``a = s * O + o`` puts the group being decided (the node with ``current == 1``) on device-group
subset ``s`` with replication option ``o`` of the env's ``tag_options`` (``O = 4``,
:data:`placement_rl.plan.TAG_OPTIONS` order, by default; ``O = 7`` with ``extended``). The module
reads ``O`` from the observation space (the columns of ``node_option``); with 4 its parameters are
those of the 4-option prior. The tree search takes the softmax over the valid actions as its prior
``G(s, a)``.

**Graph.** Two node types and five relations, built per sample from the padded observation
(:mod:`placement_rl.envs.observation`; padding rows, edges and groups are dropped):

=============== ================================ ================================= =========
relation        edges                            edge feature                      gamma
=============== ================================ ================================= =========
``op_fwd``      producer -> consumer group       log1p(tensor MiB)                 1
``op_bwd``      consumer -> producer group       log1p(tensor MiB)                 1
``dev_dev``     every ordered pair of real       log1p(bandwidth GB/s)             1
                device groups
``op_dev``      op group -> each device group    the op group's option one-hot     0.1
                its plan uses (``node_placement``)
``dev_op``      the reverse of ``op_dev``        the op group's option one-hot     0.1
=============== ================================ ================================= =========

**Node features** (Table 1; magnitudes enter as ``log1p``, negative inputs are clamped to 0). Op
groups: every column of ``node_features`` (``log1p`` of compute ms, parameter MiB, output MiB,
finish ms and idle ms; the op-type histogram, ``decided`` and ``current`` as they are), compute ms
and finish ms over the sample's largest, the option one-hot, the search progress. Device groups:
every column of ``group_features`` (``log1p`` but for ``idle_fraction``), 1 when the peak memory
fraction is over 1, the group's share of the cluster's TFLOP/s, the progress. Node features are
encoded to ``hidden`` by ``Linear -> LayerNorm -> tanh`` per node type (the paper's
"fully-connected layers ... to length f"); tensor sizes and bandwidths likewise to ``edge_hidden``,
the option one-hot of a placement edge by a learned embedding.

**Layers** (``layers`` of them, :class:`HeteroEdgeGATLayer`). Per relation ``r``, with its own
weights, a GATv2-style attention in which the edge feature enters the message, as the paper's
``sigma(W_r (h_v o e_uv) + b_r)`` (PyG's ``GATv2Conv`` uses edge features only in the attention
logits): with ``m_uv = W_r [h_v || e_uv] + b_r`` in ``heads`` heads, destination ``u`` attends over
its in-edges of ``r`` with ``softmax_v(a_r . LeakyReLU(m_uv + Q_r h_u))`` and receives
``sum_v alpha_uv * LeakyReLU(m_uv)`` (heads concatenated; ``sigma`` is LeakyReLU(0.2), which costs
a fifth of an ELU or tanh per edge on CPU). A node type's relation outputs are combined with
``gamma`` (1 within a node type, 0.1 across; the paper) or a plain mean (``relation_aggr:
"mean"``, TAG's public code), then ``h <- LayerNorm(h + combined)``.

**Decoder.** For each subset ``s`` and option ``o``: an MLP over ``[E_op[current],
sum_k P[s, k] E_dev[k] / |P_s|, embedding(o), readout]`` gives one logit, where the readout is the
mean op-group embedding and the mean device-group embedding. The paper's decoder feeds
``sum_j E_dev[j] P_ij o E_op[i] o O_i``; we average rather than sum over the subset (so subsets of
different sizes are comparable) and add the readout. Invalid actions (``action_mask == 0``) get the
logit :data:`MASK_LOGIT` (-1e9, as :mod:`placement_rl.policies.trinity`): its softmax weight is
exactly 0 and RLlib's ``Categorical`` stays finite (RLlib's masking example adds
``clamp(log(mask), FLOAT_MIN)``, to the same effect). **Value head** (our extension, not in TAG):
an MLP from the readout to one scalar per sample.

Sizes come from :class:`TagGNNConfig`; :data:`PRESETS` holds ``default`` (hidden 64, 2 heads,
4 layers; CPU training and search) and ``paper`` (hidden 256, 4 heads, 4 layers). ``python -m
placement_rl.policies.tag`` prints their parameter counts and the ms per call.

Shapes: ``B`` batch, ``N`` op-group slots, ``E`` edge slots, ``K`` device-group slots, ``S``
subset slots, ``O`` options, ``H`` hidden; ``A = O * S`` actions.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn
from torch.nn import functional as F
from torch_geometric.utils import softmax as segment_softmax

from placement_rl.config import choice, integer, number, option, parse
from placement_rl.envs.observation import (
    COL_COMPUTE_MS,
    COL_CURRENT,
    COL_DECIDED,
    COL_FINISH_MS,
    COL_IDLE_MS,
    COL_OUTPUT_MIB,
    COL_PARAM_MIB,
    COLS_OP_TYPE,
    GROUP_COL,
    GROUP_DIM,
    GROUP_FEATURES,
    NODE_DIM,
    NUM_TAG_OPTIONS,
    OP_FAMILIES,
)
from placement_rl.errors import SchemaError
from placement_rl.plan import TAG_OPTIONS

#: Logit of an invalid action: exp(-1e9 - max) is exactly 0 in float32, and nothing overflows.
MASK_LOGIT = -1e9
#: The relations, as (name, source node type, destination node type).
RELATIONS: tuple[tuple[str, str, str], ...] = (
    ("op_fwd", "op", "op"),
    ("op_bwd", "op", "op"),
    ("dev_dev", "dev", "dev"),
    ("op_dev", "op", "dev"),
    ("dev_op", "dev", "op"),
)
#: The edge encoder of each relation (op_fwd and op_bwd share the tensor encoder).
EDGE_KINDS: dict[str, str] = {
    "op_fwd": "tensor",
    "op_bwd": "tensor",
    "dev_dev": "link",
    "op_dev": "placement",
    "dev_op": "placement",
}
NODE_TYPES: tuple[str, ...] = ("op", "dev")
#: Per node type, the relations (indices into :data:`RELATIONS`) it is the source / destination of.
SRC_RELATIONS: dict[str, tuple[int, ...]] = {
    t: tuple(r for r, (_, s, _) in enumerate(RELATIONS) if s == t) for t in NODE_TYPES
}
DST_RELATIONS: dict[str, tuple[int, ...]] = {
    t: tuple(r for r, (_, _, d) in enumerate(RELATIONS) if d == t) for t in NODE_TYPES
}
#: The observation fields the GNN reads.
OBS_KEYS: tuple[str, ...] = (
    "node_features",
    "node_mask",
    "edge_index",
    "edge_features",
    "edge_mask",
    "node_option",
    "node_placement",
    "group_features",
    "group_mask",
    "group_bandwidth",
    "slice_placement",
    "slice_mask",
    "progress",
    "action_mask",
)
#: Node-feature and device-group-feature columns that enter as ``log1p`` (magnitudes; the rest are fractions).
_OP_LOG_COLS = torch.tensor(
    [c in (COL_COMPUTE_MS, COL_PARAM_MIB, COL_OUTPUT_MIB, COL_FINISH_MS, COL_IDLE_MS) for c in range(NODE_DIM)]
)
_DEV_LOG_COLS = torch.tensor([name != "idle_fraction" for name in GROUP_FEATURES])
_GPU_COUNT, _PEAK_TFLOPS = GROUP_COL["gpu_count"], GROUP_COL["peak_tflops"]
_PEAK_MEMORY = GROUP_COL["peak_memory_fraction"]
#: The option column masked on one-GPU subsets by :func:`synthetic_observation`.
_MODEL_PARALLEL = TAG_OPTIONS.index("model_parallel")


def op_in(num_options: int = NUM_TAG_OPTIONS) -> int:
    """Op-group input width: the node features, compute and finish over the sample's latest, the
    ``num_options`` option one-hot, progress."""
    return NODE_DIM + 2 + num_options + 1


#: Op-group input width with TAG's four options.
OP_IN = op_in()
#: Device-group input width: the group features, over memory, share of the cluster's TFLOP/s, progress.
DEV_IN = GROUP_DIM + 3
#: RLlib puts these into every ``model_config`` (``DefaultModelConfig`` and algorithms' auto-includes).
_RLLIB_KEYS = frozenset(f.name for f in dataclasses.fields(DefaultModelConfig)) | {"vf_share_layers", "twin_q"}


@dataclass(frozen=True)
class TagGNNConfig:
    """Sizes of :class:`TagGNN` (the ``model_config`` keys of :class:`TagRLModule`, plus ``preset``).

    Attributes:
        hidden: embedding width ``H`` of the node embeddings, messages and the decoder (the paper's ``f``).
        heads: attention heads; ``hidden`` must be a multiple.
        layers: message-passing layers (the paper: 4).
        relation_aggr: ``gamma`` (sum of relation outputs weighted by ``gamma_same`` within a node
            type and ``gamma_cross`` across; the paper) or ``mean`` (TAG's public code).
        gamma_same: weight of op->op and device->device relations.
        gamma_cross: weight of op<->device relations.
        edge_hidden: width of the encoded edge features (the edge half of each ``W_r`` maps it to
            ``hidden``); 0: ``hidden``, as the paper.
        decoder_hidden: width of the decoder's and the value head's hidden layer; 0: ``hidden``.
        dropout: dropout on relation outputs during training.
        value_head: build the value head (``compute_values``); off, values are 0.
    """

    hidden: int = option(64, rule=integer(low=4))
    heads: int = option(2, rule=integer(low=1))
    layers: int = option(4, rule=integer(low=0))
    relation_aggr: str = option("gamma", rule=choice(("gamma", "mean")))
    gamma_same: float = option(1.0, rule=number(low=0.0))
    gamma_cross: float = option(0.1, rule=number(low=0.0))
    edge_hidden: int = option(16, rule=integer(low=0))
    decoder_hidden: int = option(0, rule=integer(low=0))
    dropout: float = option(0.0, rule=number(low=0.0, high=0.9))
    value_head: bool = option(True, rule=choice((True, False)))

    def validate(self, where: str) -> None:
        if self.hidden % self.heads:
            raise SchemaError(f"{where}: hidden = {self.hidden} is not a multiple of heads = {self.heads}")

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any] | None) -> TagGNNConfig:
        """The config of an RLModule's ``model_config``: ``preset`` (``default`` | ``paper``) then overrides.

        RLlib's own keys (``DefaultModelConfig`` fields, ``vf_share_layers``) are ignored; any other
        unknown key is a :class:`~placement_rl.errors.SchemaError`.
        """
        data = {k: v for k, v in dict(model_config or {}).items() if k not in _RLLIB_KEYS}
        preset = data.pop("preset", "default")
        if preset not in PRESETS:
            raise SchemaError(f"TagGNNConfig: preset = {preset!r}; expected one of {sorted(PRESETS)}")
        return parse(cls, {**dataclasses.asdict(PRESETS[preset]), **data})


#: Named sizes: ``default`` for CPU training and search, ``paper`` as TAG (hidden 256, 4 heads, 4 layers).
PRESETS: dict[str, TagGNNConfig] = {
    "default": TagGNNConfig(),
    "paper": TagGNNConfig(hidden=256, heads=4, layers=4, edge_hidden=0),
}


def _encoder(n_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.LayerNorm(hidden), nn.Tanh())


@dataclass
class HeteroBatch:
    """A padded batch as one heterogeneous graph: real nodes only, node indices offset per sample.

    The edges of all relations are concatenated in :data:`RELATIONS` order (``sizes[r]`` of
    relation ``r``), each addressed by rows of the fused tables of :class:`HeteroEdgeGATLayer`.

    Attributes:
        x_op: (n_op, op_in(O)) op-group inputs.
        x_dev: (n_dev, DEV_IN) device-group inputs.
        op_rows: (B * N,) bool, the real slots of ``node_mask`` in flat order (so ``x_op`` is
            ``padded.reshape(B * N, -1)[op_rows]``); ``dev_rows`` (B * K,) likewise for groups.
        edge_attr: per edge kind (:data:`EDGE_KINDS`), (M_r, F) edge inputs in the order of each
            relation of that kind: ``tensor`` (log1p MiB), ``link`` (log1p GB/s), ``placement``
            (the op group's option one-hot, ``O`` wide).
        sizes: per relation, its edge count ``M_r``; ``M = sum(sizes)``.
        src_row: (M,) row of each edge's source in the layer's source table.
        dst_row: (M,) row of each edge's (relation, destination) pair in the query table: the
            attention's softmax segment.
        out_row: (M,) destination node: op groups ``0 .. n_op - 1``, device groups from ``n_op``.
        rel_id: (M,) relation index of each edge.
    """

    x_op: torch.Tensor
    x_dev: torch.Tensor
    op_rows: torch.Tensor
    dev_rows: torch.Tensor
    edge_attr: dict[str, torch.Tensor]
    sizes: list[int]
    src_row: torch.Tensor
    dst_row: torch.Tensor
    out_row: torch.Tensor
    rel_id: torch.Tensor

    @property
    def num_segments(self) -> int:
        return self.x_op.shape[0] * len(DST_RELATIONS["op"]) + self.x_dev.shape[0] * len(DST_RELATIONS["dev"])


def build_graph(obs: Mapping[str, torch.Tensor]) -> HeteroBatch:
    """The heterogeneous graph of a padded batch (see the module docstring), vectorized over the batch.

    Edges whose endpoints are padding (or out of range) are dropped, so any padded observation,
    RLlib's random dummy batches included, is a valid input.
    """
    nf = obs["node_features"].float()
    B, N, _ = nf.shape
    node_mask = obs["node_mask"] > 0
    group_mask = obs["group_mask"] > 0
    K = group_mask.shape[1]
    progress = obs["progress"].float().reshape(B, 1, 1)
    op_rows, dev_rows = node_mask.reshape(-1), group_mask.reshape(-1)

    # Op-group inputs, padded (B, N, op_in(O)), then the real rows.
    nf = nf.clamp(min=0.0) * node_mask.unsqueeze(-1)
    times = nf[..., [COL_COMPUTE_MS, COL_FINISH_MS]]
    op_in = torch.cat(
        [
            torch.where(_OP_LOG_COLS.to(nf.device), torch.log1p(nf), nf),
            times / times.amax(1, keepdim=True).clamp(min=1e-9),
            obs["node_option"].float(),
            progress.expand(B, N, 1),
        ],
        dim=-1,
    )
    # Device-group inputs, padded (B, K, DEV_IN).
    gf = obs["group_features"].float().clamp(min=0.0) * group_mask.unsqueeze(-1)
    tflops = gf[..., _GPU_COUNT] * gf[..., _PEAK_TFLOPS]
    dev_in = torch.cat(
        [
            torch.where(_DEV_LOG_COLS.to(gf.device), torch.log1p(gf), gf),
            (gf[..., _PEAK_MEMORY : _PEAK_MEMORY + 1] > 1.0).float(),
            (tflops / tflops.sum(1, keepdim=True).clamp(min=1e-9)).unsqueeze(-1),
            progress.expand(B, K, 1),
        ],
        dim=-1,
    )
    x_op, x_dev = op_in.reshape(B * N, -1)[op_rows], dev_in.reshape(B * K, -1)[dev_rows]
    op_flat = torch.cumsum(op_rows, 0) - 1  # padded slot -> real row (meaningful where op_rows)
    dev_flat = torch.cumsum(dev_rows, 0) - 1

    # op -> op along tensors (and back).
    ei = obs["edge_index"].long()
    ok = (obs["edge_mask"] > 0) & (ei >= 0).all(1) & (ei < N).all(1)
    ei = ei.clamp(0, N - 1) + (torch.arange(B, device=ei.device) * N).view(B, 1, 1)
    ok &= op_rows[ei].all(1)
    e_src, e_dst = op_flat[ei[:, 0][ok]], op_flat[ei[:, 1][ok]]
    tensor_attr = torch.log1p(obs["edge_features"].float()[..., :1][ok].clamp(min=0.0))
    # device group -> device group: every ordered pair of distinct real groups.
    pair = group_mask.unsqueeze(2) & group_mask.unsqueeze(1) & ~torch.eye(K, dtype=torch.bool, device=ei.device)
    link_attr = torch.log1p(obs["group_bandwidth"].float()[pair].clamp(min=0.0)).unsqueeze(-1)
    pb, pi, pj = pair.nonzero(as_tuple=True)
    d_src, d_dst = dev_flat[pb * K + pj], dev_flat[pb * K + pi]
    # op group <-> device group along the op group's placement.
    placed = (obs["node_placement"] > 0) & node_mask.unsqueeze(2) & group_mask.unsqueeze(1)
    qb, qn, qk = placed.nonzero(as_tuple=True)
    q_op, q_dev = op_flat[qb * N + qn], dev_flat[qb * K + qk]
    option_attr = obs["node_option"].float()[qb, qn]

    n_op = x_op.shape[0]
    ends = {"op_fwd": (e_src, e_dst), "op_bwd": (e_dst, e_src), "dev_dev": (d_src, d_dst)}
    ends |= {"op_dev": (q_op, q_dev), "dev_op": (q_dev, q_op)}
    src_rows, dst_rows, out_rows, rel_ids = [], [], [], []
    for r, (name, s, d) in enumerate(RELATIONS):
        src, dst = ends[name]
        n_src_rel, n_dst_rel = len(SRC_RELATIONS[s]), len(DST_RELATIONS[d])
        src_base = 0 if s == "op" else n_op * len(SRC_RELATIONS["op"])
        dst_base = 0 if d == "op" else n_op * len(DST_RELATIONS["op"])
        src_rows.append(src_base + src * n_src_rel + SRC_RELATIONS[s].index(r))
        dst_rows.append(dst_base + dst * n_dst_rel + DST_RELATIONS[d].index(r))
        out_rows.append(dst if d == "op" else dst + n_op)
        rel_ids.append(torch.full_like(src, r))
    return HeteroBatch(
        x_op=x_op,
        x_dev=x_dev,
        op_rows=op_rows,
        dev_rows=dev_rows,
        edge_attr={"tensor": tensor_attr, "link": link_attr, "placement": option_attr},
        sizes=[len(ends[name][0]) for name, _, _ in RELATIONS],
        src_row=torch.cat(src_rows),
        dst_row=torch.cat(dst_rows),
        out_row=torch.cat(out_rows),
        rel_id=torch.cat(rel_ids),
    )


class HeteroEdgeGATLayer(nn.Module):
    """One layer: every relation's GATv2-style convolution with edge features in the message, fused.

    For relation ``r`` and an edge from ``v`` to ``u`` with encoded feature ``e_uv``:
    ``m_uv = W_r [h_v || e_uv] + b_r`` (``heads`` heads of ``C = H / heads`` channels),
    ``alpha_uv = softmax over u's in-edges of r of a_r . LeakyReLU(m_uv + Q_r h_u)``, and relation
    ``r``'s output at ``u`` is ``sum_v alpha_uv * ELU(m_uv)`` (heads concatenated; 0 without
    in-edges). A node type's relation outputs are summed with per-relation weights ``w_r`` (gamma,
    or ``1 / #relations`` for a mean), then ``h <- LayerNorm(h + sum_r w_r out_r)``.

    All relations run as one set of tensor ops (the node halves of ``W_r`` and ``Q_r`` of one node
    type are one ``Linear``; one gather, one segment softmax and one scatter for all edges), which is
    what makes small batches fast (a per-relation ``MessagePassing.propagate`` is 5 calls of about
    20 small ops each, per layer).
    The edge half of ``W_r`` (:attr:`edge_weight`) is applied by :class:`TagGNN` to all layers at once.

    Shapes:
        - input: ``h`` {"op": (n_op, H), "dev": (n_dev, H)}, ``edge_term`` (M, H) (``e_uv`` through
          the edge half of ``W_r``), ``edge_scale`` (M,) (``w_r`` of each edge), the graph
        - output: {"op": (n_op, H), "dev": (n_dev, H)}
    """

    def __init__(self, hidden: int, heads: int, edge_hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.hidden, self.heads, self.channels, self.dropout = hidden, heads, hidden // heads, dropout
        self.src_lin = nn.ModuleDict({t: nn.Linear(hidden, len(SRC_RELATIONS[t]) * hidden) for t in NODE_TYPES})
        self.dst_lin = nn.ModuleDict(
            {t: nn.Linear(hidden, len(DST_RELATIONS[t]) * hidden, bias=False) for t in NODE_TYPES}
        )
        bound = 1.0 / math.sqrt(hidden + edge_hidden)
        self.edge_weight = nn.Parameter(torch.empty(len(RELATIONS), edge_hidden, hidden).uniform_(-bound, bound))
        self.att = nn.Parameter(torch.empty(len(RELATIONS), heads, self.channels))
        nn.init.xavier_uniform_(self.att)
        self.norm = nn.ModuleDict({t: nn.LayerNorm(hidden) for t in NODE_TYPES})

    def forward(
        self, h: dict[str, torch.Tensor], g: HeteroBatch, edge_term: torch.Tensor, edge_scale: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        H, heads, C = self.hidden, self.heads, self.channels
        source = torch.cat([self.src_lin[t](h[t]).reshape(-1, H) for t in NODE_TYPES])
        query = torch.cat([self.dst_lin[t](h[t]).reshape(-1, H) for t in NODE_TYPES])
        # In place where autograd allows: the per-edge tensors (M, H) are the bulk of the work.
        m = source.index_select(0, g.src_row).add_(edge_term).view(-1, heads, C)
        act = F.leaky_relu_(query.index_select(0, g.dst_row).view(-1, heads, C).add_(m), 0.2)
        logits = (act * self.att.index_select(0, g.rel_id)).sum(-1)  # (M, heads)
        alpha = segment_softmax(logits, g.dst_row, num_nodes=g.num_segments) * edge_scale.unsqueeze(-1)
        values = (F.leaky_relu(m, 0.2) * alpha.unsqueeze(-1)).view(-1, H)
        n_op = h["op"].shape[0]
        out = values.new_zeros(n_op + h["dev"].shape[0], H).index_add_(0, g.out_row, values)
        out = F.dropout(out, self.dropout, training=self.training)
        return {"op": self.norm["op"](h["op"] + out[:n_op]), "dev": self.norm["dev"](h["dev"] + out[n_op:])}


class TagGNN(nn.Module):
    """TAG's heterogeneous GNN with the slice decoder and a value head (see the module docstring).

    Args:
        config: the sizes.
        num_options: ``O``, the replication options per subset (the env's ``tag_options``: 4 or 7);
            it sizes the op-group encoder's input, the placement-edge encoder and the option
            embedding. With 4, the parameters are exactly the 4-option prior's (its checkpoints load).

    Shapes:
        - input: a padded observation batch, the :data:`OBS_KEYS` fields with a leading ``B``
          (``node_features`` (B, N, NODE_DIM), ``node_option`` (B, N, O), ``action_mask`` (B, O * S), ...)
        - output: ``(logits (B, O * S), values (B,))``; invalid actions have logit :data:`MASK_LOGIT`
    """

    def __init__(self, config: TagGNNConfig | None = None, num_options: int = NUM_TAG_OPTIONS) -> None:
        super().__init__()
        if isinstance(num_options, bool) or not isinstance(num_options, int) or num_options < 1:
            raise ValueError(f"TagGNN: num_options = {num_options!r}; expected an integer >= 1")
        self.config = cfg = config or TagGNNConfig()
        self.num_options = num_options
        H = cfg.hidden
        self.op_encoder = _encoder(op_in(num_options), H)
        self.dev_encoder = _encoder(DEV_IN, H)
        Fe = cfg.edge_hidden or H
        self.edge_encoders = nn.ModuleDict(
            {
                "tensor": _encoder(1, Fe),
                "link": _encoder(1, Fe),
                "placement": nn.Linear(num_options, Fe, bias=False),  # an embedding of the option
            }
        )
        self.layers = nn.ModuleList([HeteroEdgeGATLayer(H, cfg.heads, Fe, cfg.dropout) for _ in range(cfg.layers)])
        if cfg.relation_aggr == "gamma":
            scale = [cfg.gamma_same if s == d else cfg.gamma_cross for _, s, d in RELATIONS]
        else:
            scale = [1.0 / len(DST_RELATIONS[d]) for _, _, d in RELATIONS]
        self.register_buffer("relation_scale", torch.tensor(scale, dtype=torch.float32), persistent=False)
        D = cfg.decoder_hidden or H
        self.dec_current = nn.Linear(H, D)
        self.dec_subset = nn.Linear(H, D, bias=False)
        self.dec_readout = nn.Linear(2 * H, D, bias=False)
        self.option_embedding = nn.Parameter(torch.randn(num_options, D) * 0.1)
        self.dec_out = nn.Sequential(nn.ReLU(), nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 1))
        self.value_mlp = nn.Sequential(nn.Linear(2 * H, D), nn.ReLU(), nn.Linear(D, 1)) if cfg.value_head else None

    def embed(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, HeteroBatch]:
        """Final op-group and device-group embeddings ``(n_op, H)``, ``(n_dev, H)`` and the graph.

        Raises:
            ValueError: when ``node_option`` has another width than :attr:`num_options`.
        """
        width = obs["node_option"].shape[-1]
        if width != self.num_options:
            raise ValueError(
                f"TagGNN built for {self.num_options} TAG options got observations with {width} (node_option "
                "columns); the env's tag_options must be the one the module was built for"
            )
        g = build_graph(obs)
        h = {"op": self.op_encoder(g.x_op), "dev": self.dev_encoder(g.x_dev)}
        if not self.layers:
            return h["op"], h["dev"], g
        H, L = self.config.hidden, len(self.layers)
        # The edge half of every layer's W_r, one matmul per relation for all layers: (M, L, H).
        encoded = {kind: self.edge_encoders[kind](attr) for kind, attr in g.edge_attr.items()}
        terms = []
        for r, (name, _, _) in enumerate(RELATIONS):
            e = encoded[EDGE_KINDS[name]]
            weight = torch.cat([layer.edge_weight[r] for layer in self.layers], dim=1)  # type: ignore[index]
            terms.append(e @ weight)
        edge_terms = torch.cat(terms).view(-1, L, H)
        edge_scale = self.relation_scale.index_select(0, g.rel_id)  # type: ignore[operator]
        for i, layer in enumerate(self.layers):
            h = layer(h, g, edge_terms[:, i], edge_scale)
        return h["op"], h["dev"], g

    def forward(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked logits (B, O * S) and values (B,) (zeros without the value head)."""
        logits, readout = self.logits_and_readout(obs)
        return logits, self.value(readout)

    def value(self, readout: torch.Tensor) -> torch.Tensor:
        """(B,) values from the (B, 2H) readout; zeros without the value head."""
        if self.value_mlp is None:
            return readout.new_zeros(readout.shape[0])
        return self.value_mlp(readout).squeeze(-1)

    def logits_and_readout(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked logits (B, O * S) and the graph readout (B, 2H): mean op-group ++ mean device-group embedding."""
        h_op, h_dev, g = self.embed(obs)
        node_mask = obs["node_mask"] > 0
        B, N = node_mask.shape
        K = obs["group_mask"].shape[1]
        H = h_op.shape[-1]
        op_pad = h_op.new_zeros(B * N, H).index_copy(0, g.op_rows.nonzero().squeeze(1), h_op).view(B, N, H)
        dev_pad = h_dev.new_zeros(B * K, H).index_copy(0, g.dev_rows.nonzero().squeeze(1), h_dev).view(B, K, H)
        op_w = node_mask.float()
        dev_w = (obs["group_mask"] > 0).float()
        readout = torch.cat(
            [
                (op_pad * op_w.unsqueeze(-1)).sum(1) / op_w.sum(1, keepdim=True).clamp(min=1.0),
                (dev_pad * dev_w.unsqueeze(-1)).sum(1) / dev_w.sum(1, keepdim=True).clamp(min=1.0),
            ],
            dim=-1,
        )  # (B, 2H)
        current = obs["node_features"][..., COL_CURRENT].float() * op_w  # (B, N)
        h_cur = (current.unsqueeze(-1) * op_pad).sum(1) / current.sum(1, keepdim=True).clamp(min=1.0)
        subsets = obs["slice_placement"].float().clamp(min=0.0) * dev_w.unsqueeze(1)  # (B, S, K)
        mix = subsets @ dev_pad / subsets.sum(-1, keepdim=True).clamp(min=1.0)  # (B, S, H)
        z = (
            (self.dec_current(h_cur) + self.dec_readout(readout))[:, None, None, :]
            + self.dec_subset(mix).unsqueeze(2)
            + self.option_embedding[None, None]
        )  # (B, S, O, D)
        raw = self.dec_out(z).reshape(B, -1)
        return torch.where(obs["action_mask"] > 0, raw, torch.full_like(raw, MASK_LOGIT)), readout


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class TagRLModule(TorchRLModule, ValueFunctionAPI):
    """TAG's GNN prior as an RLlib new-API-stack module, with a value head (:class:`ValueFunctionAPI`).

    Observations: Placement-v0's ``Dict`` with the TAG fields; actions ``Discrete(O * S)``, with ``O``
    the columns of the observation's ``node_option`` (the env's ``tag_options``: 4 or 7) and ``S``
    the rows of ``slice_placement``.
    ``model_config`` keys: ``preset`` (``default`` | ``paper``) and the fields of
    :class:`TagGNNConfig` (``hidden``, ``heads``, ``layers``, ``relation_aggr``, ``gamma_same``,
    ``gamma_cross``, ``decoder_hidden``, ``dropout``, ``value_head``). The action distribution is
    RLlib's default ``TorchCategorical`` over the masked logits.
    """

    def setup(self) -> None:
        super().setup()
        obs_space, action_space = self.observation_space, self.action_space
        if not isinstance(obs_space, gym.spaces.Dict) or "slice_placement" not in obs_space.spaces:
            raise ValueError(
                f"TagRLModule needs Placement-v0 observations with the TAG fields (action_space='tag'); got {obs_space}"
            )
        num_subsets = obs_space["slice_placement"].shape[0]  # type: ignore[index]
        num_options = obs_space["node_option"].shape[-1]  # type: ignore[index]
        if not isinstance(action_space, gym.spaces.Discrete) or int(action_space.n) != num_options * num_subsets:
            raise ValueError(
                f"TagRLModule needs Discrete({num_options} * {num_subsets}) actions (option x subset); got "
                f"{action_space}"
            )
        model_config: Any = self.model_config
        if isinstance(model_config, DefaultModelConfig):
            model_config = dataclasses.asdict(model_config)
        self.gnn_config = TagGNNConfig.from_model_config(model_config)
        self.gnn = TagGNN(self.gnn_config, num_options=int(num_options))

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        logits, _ = self.gnn.logits_and_readout(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        logits, readout = self.gnn.logits_and_readout(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits, Columns.EMBEDDINGS: readout}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """(B,) value estimates; ``embeddings`` is the training pass's (B, 2H) readout, else it is recomputed."""
        if embeddings is None:
            embeddings = self.gnn.logits_and_readout(batch[Columns.OBS])[1]
        return self.gnn.value(embeddings)


def _gnn(module: nn.Module) -> TagGNN:
    gnn = getattr(module, "gnn", module)
    if not isinstance(gnn, TagGNN):
        raise TypeError(f"expected a TagRLModule or TagGNN, got {type(module).__name__}")
    return gnn


def stack_observations(observations: Sequence[Mapping[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """A list of single observations (numpy, one layout) as a batch of tensors with a leading ``B``."""
    return {key: torch.from_numpy(np.stack([np.asarray(o[key]) for o in observations])) for key in OBS_KEYS}


def prior_probs(module: nn.Module, observations: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """(B, O * S) float32 prior: the softmax over each observation's valid actions (0 elsewhere).

    ``module`` is a :class:`TagRLModule` or :class:`TagGNN`; ``observations`` are single Placement-v0
    observations (numpy). Runs without gradients, in eval mode, as one batch.
    """
    gnn = _gnn(module)
    was_training = gnn.training
    gnn.eval()
    try:
        with torch.no_grad():
            logits, _ = gnn(stack_observations(observations))
            probs = torch.softmax(logits, dim=-1)
    finally:
        gnn.train(was_training)
    return probs.numpy().astype(np.float32, copy=False)


def cross_entropy(
    module: nn.Module, batch_obs: Mapping[str, torch.Tensor | np.ndarray], pi: torch.Tensor | np.ndarray
) -> torch.Tensor:
    """Mean over the batch of ``-sum_a pi[a] log softmax(logits)[a]`` over valid actions (TAG's loss).

    Args:
        module: a :class:`TagRLModule` or :class:`TagGNN`.
        batch_obs: the :data:`OBS_KEYS` fields, each with a leading ``B`` (tensors or numpy).
        pi: (B, O * S) search targets (visit distributions); entries on invalid actions are ignored.

    Returns:
        A scalar tensor with gradients.
    """
    obs = {k: torch.as_tensor(batch_obs[k]) for k in OBS_KEYS}
    logits, _ = _gnn(module)(obs)
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.as_tensor(pi, dtype=logp.dtype)
    terms = torch.where(obs["action_mask"] > 0, target * logp, torch.zeros_like(logp))
    return -terms.sum(-1).mean()


# ------------------------------------------------------------------ synthetic inputs and the benchmark
def synthetic_observation(
    rng: np.random.Generator,
    *,
    groups: int = 60,
    edges: int = 120,
    device_groups: int = 16,
    subsets: int = 64,
    decided: int = 20,
    pad: tuple[int, int, int, int] = (0, 0, 0, 0),
    num_options: int = NUM_TAG_OPTIONS,
) -> dict[str, np.ndarray]:
    """A random TAG observation in the layout of :mod:`placement_rl.envs.observation` (tests, benchmark).

    ``pad`` adds padding slots to (N, E, K, S). ``num_options`` is ``O`` (4: TAG's options; 7: the
    ``extended`` set; option ``o`` is ``TAG_EXTENDED_OPTIONS[o]``). Group ``decided`` is the current
    one; the first ``decided`` groups are decided; every real subset has all its options valid except
    model parallel on one-GPU subsets. With 4 options the draws are those of the 4-option layout.
    """
    n, e, k, s = groups + pad[0], edges + pad[1], device_groups + pad[2], subsets + pad[3]
    nf = np.zeros((n, NODE_DIM), np.float32)
    nf[:groups, COL_COMPUTE_MS] = rng.lognormal(1.0, 1.5, groups)
    nf[:groups, COL_PARAM_MIB] = rng.lognormal(2.0, 2.0, groups) * (rng.random(groups) < 0.7)
    nf[:groups, COL_OUTPUT_MIB] = rng.lognormal(1.0, 1.5, groups)
    hist = rng.random((groups, len(OP_FAMILIES))) ** 3
    nf[:groups, COLS_OP_TYPE] = hist / hist.sum(1, keepdims=True)
    nf[:decided, COL_DECIDED] = 1.0
    nf[min(decided, groups - 1), COL_CURRENT] = 1.0
    nf[:groups, COL_FINISH_MS] = np.cumsum(rng.random(groups) * 5)
    nf[:groups, COL_IDLE_MS] = rng.random(groups) * 2
    node_mask = np.zeros(n, np.int8)
    node_mask[:groups] = 1
    # A chain plus random forward edges, so the graph is a connected DAG.
    src = np.concatenate([np.arange(groups - 1), rng.integers(0, groups - 1, max(edges - groups + 1, 0))])[:edges]
    dst = np.concatenate([np.arange(1, groups), src[groups - 1 :] + 1 + rng.integers(0, 3, max(edges - groups + 1, 0))])
    dst = np.minimum(dst[:edges], groups - 1)
    m = len(src)
    edge_index = np.zeros((2, e), np.int64)
    edge_index[:, :m] = src, dst
    edge_features = np.zeros((e, 1), np.float32)
    edge_features[:m, 0] = rng.lognormal(1.0, 2.0, m)
    edge_mask = np.zeros(e, np.int8)
    edge_mask[:m] = 1
    option = np.zeros((n, num_options), np.float32)
    option[np.arange(groups), rng.integers(0, num_options, groups)] = 1.0
    placement = np.zeros((n, k), np.float32)
    placement[:groups, :device_groups] = rng.random((groups, device_groups)) < 0.3
    placement[np.arange(groups), rng.integers(0, device_groups, groups)] = 1.0
    gf = np.zeros((k, GROUP_DIM), np.float32)
    gpus = rng.integers(1, 9, device_groups)
    gf[:device_groups, GROUP_COL["gpu_count"]] = gpus
    gf[:device_groups, GROUP_COL["memory_per_gpu_gib"]] = rng.choice([16.0, 32.0, 80.0], device_groups)
    gf[:device_groups, GROUP_COL["intra_bandwidth_gbs"]] = np.where(gpus > 1, rng.uniform(8, 20, device_groups), 0.0)
    gf[:device_groups, GROUP_COL["peak_tflops"]] = rng.choice([15.7, 125.0, 312.0], device_groups)
    gf[:device_groups, GROUP_COL["peak_memory_fraction"]] = rng.random(device_groups) * 1.2
    gf[:device_groups, GROUP_COL["idle_fraction"]] = rng.random(device_groups)
    group_mask = np.zeros(k, np.int8)
    group_mask[:device_groups] = 1
    bandwidth = np.zeros((k, k), np.float32)
    bw = rng.uniform(2.5, 6.0, (device_groups, device_groups))
    bw = np.minimum(bw, bw.T)
    np.fill_diagonal(bw, 0.0)
    bandwidth[:device_groups, :device_groups] = bw
    slices = np.zeros((s, k), np.float32)
    slices[:subsets, :device_groups] = rng.random((subsets, device_groups)) < 0.25
    slices[np.arange(subsets), np.arange(subsets) % device_groups] = 1.0
    slice_mask = np.zeros(s, np.int8)
    slice_mask[:subsets] = 1
    action_mask = np.zeros((s, num_options), np.int8)
    action_mask[:subsets] = 1
    one_gpu = (slices[:subsets, :device_groups] @ gpus) <= 1
    if _MODEL_PARALLEL < num_options:
        action_mask[:subsets, _MODEL_PARALLEL] = ~one_gpu
    return {
        "node_features": nf,
        "node_mask": node_mask,
        "edge_index": edge_index,
        "edge_features": edge_features,
        "edge_mask": edge_mask,
        "node_option": option,
        "node_placement": placement,
        "group_features": gf,
        "group_mask": group_mask,
        "group_bandwidth": bandwidth,
        "slice_placement": slices,
        "slice_mask": slice_mask,
        "progress": np.array([decided / groups], np.float32),
        "action_mask": action_mask.reshape(-1),
    }


def benchmark(
    presets: Sequence[str] = ("default", "paper"),
    batches: Sequence[int] = (1, 8, 16),
    repeats: int = 20,
    backward: bool = False,
) -> list[dict[str, Any]]:
    """Parameter counts and ms per call on 60 op groups x 16 device groups x 64 subsets (synthetic).

    Each row: ``preset``, ``params``, ``mb_float32``, ``batch``, ``edges`` (graph edges of all
    relations in the batch), ``wall_ms`` / ``cpu_ms`` (median wall and this thread's CPU time of a
    no-grad call; on a shared machine ``cpu_ms`` is the steadier) and ``wall_min_ms``; with
    ``backward``, ``train_ms`` (median wall of ``cross_entropy`` forward + backward).
    """
    rng = np.random.default_rng(0)
    pool = [synthetic_observation(rng) for _ in range(max(batches))]
    rows = []
    for preset in presets:
        torch.manual_seed(0)
        gnn = TagGNN(PRESETS[preset]).eval()
        params = count_parameters(gnn)
        for b in batches:
            obs = stack_observations(pool[:b])
            wall, cpu = [], []
            with torch.no_grad():
                for _ in range(repeats + 3):
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    gnn(obs)
                    cpu.append(time.thread_time() - start_cpu)
                    wall.append(time.perf_counter() - start)
            row = {
                "preset": preset,
                "params": params,
                "mb_float32": params * 4 / 2**20,
                "batch": b,
                "edges": int(sum(build_graph(obs).sizes)),
                "wall_ms": float(np.median(wall[3:])) * 1e3,
                "wall_min_ms": float(np.min(wall[3:])) * 1e3,
                "cpu_ms": float(np.median(cpu[3:])) * 1e3,
            }
            if backward:
                pi = obs["action_mask"].float() / obs["action_mask"].float().sum(-1, keepdim=True)
                train = []
                for _ in range(max(repeats // 4, 3)):
                    start = time.perf_counter()
                    cross_entropy(gnn, obs, pi).backward()
                    train.append(time.perf_counter() - start)
                row["train_ms"] = float(np.median(train)) * 1e3
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m placement_rl.policies.tag``: the benchmark of :func:`benchmark`, one line per row."""
    parser = argparse.ArgumentParser(description="Parameter counts and ms per call of TAG's GNN prior.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--presets", nargs="+", default=["default", "paper"], choices=sorted(PRESETS))
    parser.add_argument("--backward", action="store_true", help="also time cross_entropy forward + backward")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for row in benchmark(args.presets, args.batches, args.repeats, args.backward):
        train = f"  train {row['train_ms']:7.1f} ms" if "train_ms" in row else ""
        print(
            f"{row['preset']:>8}  params {row['params']:>10,d} ({row['mb_float32']:5.2f} MB float32)  "
            f"B={row['batch']:<3d} edges {row['edges']:>6d}  wall {row['wall_ms']:7.1f} ms "
            f"(min {row['wall_min_ms']:6.1f})  cpu {row['cpu_ms']:7.1f} ms{train}"
        )


if __name__ == "__main__":
    main()
