"""Trinity's policy (seed 004, sec. 4) as an RLlib new-API-stack ``TorchRLModule`` with a value head.

It acts in ``placement_rl/Placement-v0`` with ``mode="one_shot"``: one action assigns each of the
``N`` op slots to one of ``k`` groups and each group to a device (``MultiDiscrete([k] * N + [D] * k)``).

* **Partition network** ``N_g``: a feed-forward net (hidden 64 and 128, dropout 0.3) over each op's
  features: Z-scored runtime, a Node2vec structure embedding (the env's ``node_structure`` field when
  ``node2vec_dim > 0``), an op-type embedding (a linear map of the op-type histogram; one-hot for
  raw ops), and log output and parameter sizes. It gives ``(N, k)`` group logits.
* **Group embeddings** from the sampled partition: the mean op-type embedding of the group's ops,
  its summed output size, and its rows and columns of the group adjacency (tensor MiB between groups).
* **Schedule network** ``N_s``: a sequence-to-sequence LSTM (hidden 256) with attention. The encoder
  reads the ``k`` group embeddings; the decoder emits one device per group. The embedding of the
  device it chose (a trainable per-index embedding plus a projection of the device's features, so
  unseen topologies still have meaningful devices) is fed back as the next input.
* **Sampling** ``softmax(C * tanh(u / T))`` with C = 5, T = 10 for both networks; the env's action
  mask is added as a log-mask (``log 0`` clamped to -1e9), without touching the batch.
* **Hard memory mask** (our extension; the env's ``memory_mask="hard"``, when the observation has
  ``node_memory_gib``): while decoding, group ``t`` may take only the devices whose memory, after
  the groups ``0 .. t-1`` placed on them, still holds it (every real device when none does), the
  rule of :func:`placement_rl.envs.placement.env.one_shot_memory_mask`. Without the field the
  module is the paper's (MDPE's soft penalty only). For the
  first ``noise_steps`` (500) actions an EnvRunner samples, uniform noise up to ``logit_noise``
  (0.1) is added to the logits (Trinity sec. 5.2).

Sampling is autoregressive (devices depend on the sampled partition and on earlier devices), so
exploration and inference sample inside the module and return ``actions`` and their log-probability;
training recomputes the logits with the taken actions fed back (teacher forcing), so
``action_dist_inputs`` and the log-probabilities agree with what was sampled. The action
distribution is :class:`GroupedCategorical`: ``N`` categoricals over groups and ``k`` over devices.

Dropout is active only in the training forward pass, so sampling is deterministic given the
weights and the seed.

Shapes: ``B`` batch, ``N`` op slots, ``k`` groups, ``D`` device slots, ``F`` node features.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core import Columns
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from torch import nn
from torch.nn import functional as F

from placement_rl.envs.observation import (
    COL_COMPUTE_MS,
    COL_OUTPUT_MIB,
    COL_PARAM_MIB,
    COLS_OP_TYPE,
    DEV_COL_MEMORY_GIB,
    OP_FAMILIES,
)

MASK_LOGIT = -1e9
HIDDEN = 256
TYPE_DIM = 16


def masked_logits(raw: torch.Tensor, mask: torch.Tensor, c: float, temperature: float) -> torch.Tensor:
    """``C * tanh(raw / T)`` plus the log of ``mask`` (0 or 1), with ``log 0`` clamped to -1e9."""
    return c * torch.tanh(raw / temperature) + torch.clamp(torch.log(mask.float()), min=MASK_LOGIT)


class GroupedCategorical(Distribution):
    """``N`` categoricals over ``k`` groups, then ``k`` categoricals over ``D`` devices.

    Built from flat logits ``(B, N * k + k * D)``; samples and log-probabilities are over actions
    ``(B, N + k)``. Subclasses set ``shape = (N, k, D)`` (see :meth:`with_shape`).
    """

    shape: tuple[int, int, int] = (0, 0, 0)

    def __init__(self, group_logits: torch.Tensor, device_logits: torch.Tensor) -> None:
        super().__init__()
        self.groups = torch.distributions.Categorical(logits=group_logits)  # batch (B, N), k classes
        self.devices = torch.distributions.Categorical(logits=device_logits)  # batch (B, k), D classes

    @classmethod
    def with_shape(cls, num_ops: int, num_groups: int, num_devices: int) -> type[GroupedCategorical]:
        return type("GroupedCategoricalPartial", (cls,), {"shape": (num_ops, num_groups, num_devices)})

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> GroupedCategorical:
        N, k, D = cls.shape
        group_logits = logits[..., : N * k].reshape(*logits.shape[:-1], N, k)
        device_logits = logits[..., N * k :].reshape(*logits.shape[:-1], k, D)
        return cls(group_logits, device_logits)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        return int(np.sum(space.nvec))  # type: ignore[attr-defined]

    def _split(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        N = self.groups.logits.shape[-2]
        return value[..., :N].long(), value[..., N:].long()

    def logp(self, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        a, d = self._split(value)
        return self.groups.log_prob(a).sum(-1) + self.devices.log_prob(d).sum(-1)

    def entropy(self, **kwargs: Any) -> torch.Tensor:
        return self.groups.entropy().sum(-1) + self.devices.entropy().sum(-1)

    def kl(self, other: Distribution, **kwargs: Any) -> torch.Tensor:
        assert isinstance(other, GroupedCategorical)
        kl_g = torch.distributions.kl_divergence(self.groups, other.groups).sum(-1)
        return kl_g + torch.distributions.kl_divergence(self.devices, other.devices).sum(-1)

    def sample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: Any) -> torch.Tensor:
        return torch.cat([self.groups.sample(sample_shape), self.devices.sample(sample_shape)], dim=-1)

    def rsample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError("categorical actions have no reparameterized sample")

    def to_deterministic(self) -> _ArgmaxGrouped:
        return _ArgmaxGrouped(self)


class _ArgmaxGrouped(Distribution):
    def __init__(self, dist: GroupedCategorical) -> None:
        super().__init__()
        self.dist = dist

    def sample(self, **kwargs: Any) -> torch.Tensor:
        return torch.cat([self.dist.groups.logits.argmax(-1), self.dist.devices.logits.argmax(-1)], dim=-1)

    def rsample(self, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def logp(self, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.dist.logp(value)

    def kl(self, other: Distribution, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(self.dist.groups.logits.shape[:-2])

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        return GroupedCategorical.required_input_dim(space)


class TrinityRLModule(TorchRLModule, ValueFunctionAPI):
    """The partition + schedule policy with a value head (see the module docstring).

    ``model_config`` keys (all optional): ``hidden_partition`` ((64, 128)), ``dropout`` (0.3),
    ``hidden`` (256, the LSTMs), ``c`` (5.0), ``temperature`` (10.0), ``logit_noise`` (0.1),
    ``noise_steps`` (500).
    """

    def setup(self) -> None:
        super().setup()
        cfg = dict(self.model_config or {})
        obs_space = self.observation_space
        if not isinstance(self.action_space, gym.spaces.MultiDiscrete) or not isinstance(obs_space, gym.spaces.Dict):
            raise ValueError(
                f"TrinityRLModule needs Placement-v0 in one_shot mode (MultiDiscrete actions, Dict observations); "
                f"got {self.action_space} and {type(obs_space).__name__}"
            )
        N, F_ = obs_space["node_features"].shape
        D = obs_space["device_features"].shape[0]
        k = len(self.action_space.nvec) - N
        self.num_ops, self.num_groups, self.num_devices = N, k, D
        self.c = float(cfg.get("c", 5.0))
        self.temperature = float(cfg.get("temperature", 10.0))
        self.dropout = float(cfg.get("dropout", 0.3))
        self.logit_noise = float(cfg.get("logit_noise", 0.1))
        self.noise_steps = int(cfg.get("noise_steps", 500))
        self.sampled_steps = 0  # per EnvRunner (not in the state dict, so weight syncs keep it)
        hidden = int(cfg.get("hidden", HIDDEN))
        h1, h2 = tuple(cfg.get("hidden_partition", (64, 128)))
        self.structure_dim = obs_space["node_structure"].shape[1] if "node_structure" in obs_space.spaces else 0
        n_types = len(OP_FAMILIES)
        self.type_embedding = nn.Linear(n_types, TYPE_DIM, bias=False)
        op_in = 1 + self.structure_dim + TYPE_DIM + 2
        self.partition = nn.ModuleList([nn.Linear(op_in, h1), nn.Linear(h1, h2), nn.Linear(h2, k)])
        group_in = TYPE_DIM + 1 + 2 * k
        self.encoder = nn.LSTM(group_in, hidden, batch_first=True)
        self.decoder = nn.LSTMCell(hidden, hidden)
        self.attention = nn.Linear(hidden, hidden, bias=False)
        self.query = nn.Linear(2 * hidden, hidden)
        self.device_embedding = nn.Embedding(D, hidden)
        self.device_projection = nn.Linear(4, hidden)
        self.start = nn.Parameter(torch.zeros(hidden))
        self.value_head = nn.Sequential(nn.Linear(op_in + hidden, 128), nn.Tanh(), nn.Linear(128, 1))
        self.action_dist_cls = GroupedCategorical.with_shape(N, k, D)

    # -------------------------------------------------------------- features
    def _op_features(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N, op_in) op features and the (B, N, TYPE_DIM) op-type embeddings."""
        x = obs["node_features"].float()
        mask = obs["node_mask"].float()
        runtime = x[..., COL_COMPUTE_MS]
        count = mask.sum(-1, keepdim=True).clamp(min=1.0)
        mean = (runtime * mask).sum(-1, keepdim=True) / count
        std = (((runtime - mean) ** 2 * mask).sum(-1, keepdim=True) / count).sqrt().clamp(min=1e-6)
        z = ((runtime - mean) / std) * mask
        types = self.type_embedding(x[..., COLS_OP_TYPE])
        parts = [z.unsqueeze(-1)]
        if self.structure_dim:
            parts.append(obs["node_structure"].float())
        output_mib, param_mib = x[..., COL_OUTPUT_MIB].unsqueeze(-1), x[..., COL_PARAM_MIB].unsqueeze(-1)
        parts += [types, torch.log1p(output_mib), torch.log1p(param_mib)]
        return torch.cat(parts, dim=-1) * mask.unsqueeze(-1), types

    def _partition_logits(self, feats: torch.Tensor, obs: dict[str, torch.Tensor], train: bool) -> torch.Tensor:
        h = feats
        for i, layer in enumerate(self.partition):
            h = layer(h)
            if i < len(self.partition) - 1:
                h = F.dropout(F.relu(h), self.dropout, training=train)
        B, N, k = h.shape
        mask = obs["action_mask"][..., : N * k].reshape(B, N, k)
        return masked_logits(h, mask, self.c, self.temperature)

    def _group_embeddings(
        self, obs: dict[str, torch.Tensor], types: torch.Tensor, groups: torch.Tensor
    ) -> torch.Tensor:
        """(B, k, TYPE_DIM + 1 + 2k) embeddings of the groups the partition ``groups`` (B, N) forms."""
        k = self.num_groups
        node_mask = obs["node_mask"].float()
        onehot = F.one_hot(groups.long(), k).float() * node_mask.unsqueeze(-1)  # (B, N, k)
        sizes = onehot.sum(1)  # (B, k)
        mean_type = onehot.transpose(1, 2) @ types / sizes.clamp(min=1.0).unsqueeze(-1)
        output = onehot.transpose(1, 2) @ obs["node_features"][..., COL_OUTPUT_MIB].unsqueeze(-1).float()
        # Group adjacency: tensor MiB from group i to group j.
        B, E = obs["edge_mask"].shape
        src, dst = obs["edge_index"][:, 0].long(), obs["edge_index"][:, 1].long()
        weight = obs["edge_features"][..., 0].float() * obs["edge_mask"].float()  # (B, E)
        g_src = torch.gather(groups.long(), 1, src)
        g_dst = torch.gather(groups.long(), 1, dst)
        adjacency = torch.zeros(B, k * k, device=weight.device)
        adjacency.scatter_add_(1, g_src * k + g_dst, weight)
        adjacency = torch.log1p(adjacency.reshape(B, k, k))
        return torch.cat([mean_type, torch.log1p(output), adjacency, adjacency.transpose(1, 2)], dim=-1)

    def _device_reps(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, D, hidden) device representations: trainable embedding + projected features."""
        feats = torch.log1p(obs["device_features"].float())
        return self.device_embedding.weight.unsqueeze(0) + self.device_projection(feats)

    def _group_need(self, obs: dict[str, torch.Tensor], groups: torch.Tensor) -> torch.Tensor | None:
        """(B, k) float64 GiB each group of the partition ``groups`` (B, N) needs on one device, or
        None when the observation has no ``node_memory_gib`` (no hard memory mask)."""
        if "node_memory_gib" not in obs:
            return None
        need = obs["node_memory_gib"].double() * obs["node_mask"].double()  # (B, N)
        out = need.new_zeros(need.shape[0], self.num_groups)
        return out.scatter_add_(1, groups.long(), need)

    def _schedule(
        self,
        obs: dict[str, torch.Tensor],
        group_emb: torch.Tensor,
        devices: torch.Tensor | None,
        mode: str,
        noise: float,
        need: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode one device per group: (B, k, D) logits and the (B, k) devices (given or chosen).

        ``need`` (B, k) (:meth:`_group_need`): also mask the devices whose remaining memory cannot
        hold the group being placed (the hard memory mask).
        """
        B, k = group_emb.shape[0], self.num_groups
        D = self.num_devices
        enc, (h, c) = self.encoder(group_emb)  # (B, k, H)
        reps = self._device_reps(obs)  # (B, D, H)
        dev_mask = obs["action_mask"][..., self.num_ops * k :].reshape(B, k, D)
        capacity = obs["device_features"][..., DEV_COL_MEMORY_GIB].double()  # (B, D)
        used = capacity.new_zeros(B, D)
        inp = self.start.expand(B, -1)
        h, c = h[0], c[0]
        logits_out, chosen = [], []
        for t in range(k):
            h, c = self.decoder(inp, (h, c))
            scores = torch.einsum("bkh,bh->bk", enc, self.attention(h))
            context = torch.einsum("bk,bkh->bh", torch.softmax(scores, -1), enc)
            q = torch.tanh(self.query(torch.cat([h, context], -1)))
            u = torch.einsum("bdh,bh->bd", reps, q) / math.sqrt(q.shape[-1])
            allowed = dev_mask[:, t] > 0
            if need is not None:
                group = need[:, t : t + 1]
                fits = allowed & ((used + group <= capacity) | (group <= 0.0))
                allowed = torch.where(fits.any(-1, keepdim=True), fits, allowed)
            logits = masked_logits(u, allowed, self.c, self.temperature)
            if noise > 0:
                logits = logits + (torch.rand_like(logits) * 2 - 1) * noise
            if devices is not None:
                d = devices[:, t].long()
            elif mode == "sample":
                d = torch.distributions.Categorical(logits=logits).sample()
            else:
                d = logits.argmax(-1)
            logits_out.append(logits)
            chosen.append(d)
            if need is not None:
                used = used.scatter_add(1, d.unsqueeze(1), need[:, t : t + 1])
            inp = reps[torch.arange(B), d]
        return torch.stack(logits_out, 1), torch.stack(chosen, 1)

    def _pi(self, batch: dict[str, Any], mode: str) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        train = mode == "train"
        noise = 0.0
        if mode == "sample" and self.sampled_steps < self.noise_steps:
            noise = self.logit_noise
        feats, types = self._op_features(obs)
        group_logits = self._partition_logits(feats, obs, train)
        if noise > 0:
            group_logits = group_logits + (torch.rand_like(group_logits) * 2 - 1) * noise
        N = self.num_ops
        if train:
            actions = batch[Columns.ACTIONS].long()
            groups = actions[:, :N]
            device_logits, devices = self._schedule(
                obs,
                self._group_embeddings(obs, types, groups),
                actions[:, N:],
                mode,
                0.0,
                self._group_need(obs, groups),
            )
        else:
            groups = (
                torch.distributions.Categorical(logits=group_logits).sample()
                if mode == "sample"
                else group_logits.argmax(-1)
            )
            device_logits, devices = self._schedule(
                obs, self._group_embeddings(obs, types, groups), None, mode, noise, self._group_need(obs, groups)
            )
        B = group_logits.shape[0]
        dist_inputs = torch.cat([group_logits.reshape(B, -1), device_logits.reshape(B, -1)], -1)
        out = {Columns.ACTION_DIST_INPUTS: dist_inputs}
        if not train:
            actions = torch.cat([groups, devices], -1)
            out[Columns.ACTIONS] = actions
            out[Columns.ACTION_LOGP] = self.action_dist_cls.from_logits(dist_inputs).logp(actions)
            if mode == "sample":
                self.sampled_steps += B
        return out

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._pi(batch, "greedy")

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._pi(batch, "sample")

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._pi(batch, "train")

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """(B,) value estimates from mean-pooled op features and device representations."""
        obs = batch[Columns.OBS]
        feats, _ = self._op_features(obs)
        mask = obs["node_mask"].float().unsqueeze(-1)
        ops = (feats * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        dmask = obs["device_mask"].float().unsqueeze(-1)
        devs = (self._device_reps(obs) * dmask).sum(1) / dmask.sum(1).clamp(min=1.0)
        return self.value_head(torch.cat([ops, devs], -1)).squeeze(-1)

    def get_inference_action_dist_cls(self) -> type[Distribution]:
        return self.action_dist_cls

    def get_exploration_action_dist_cls(self) -> type[Distribution]:
        return self.action_dist_cls

    def get_train_action_dist_cls(self) -> type[Distribution]:
        return self.action_dist_cls
