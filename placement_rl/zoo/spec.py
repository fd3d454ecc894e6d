"""The record that describes one model of the zoo."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ZooModel:
    """One benchmark model of the papers, defined in PyTorch in this repository.

    Attributes:
        name: the zoo name, e.g. ``"inception_v3"``.
        build: ``build(**options) -> nn.Module``. Called under ``torch.device("meta")`` so no weights are
            allocated. The module's ``forward(*inputs, target)`` returns the scalar training loss, so the
            traced graph covers the whole training step's forward pass (model + loss).
        example_inputs: ``example_inputs(batch_size, **options) -> tuple[Tensor, ...]``: meta tensors for
            ``forward``, the target last; dimension 0 of every input is the sample (batch) dimension.
        default_batch_size: the global batch size used in the paper this model mirrors.
        source: the paper table the model mirrors, e.g. ``"TAG Table 3"``.
        description: one line on the architecture and any difference from the paper.
        options: the keyword options ``build`` / ``example_inputs`` accept, with their defaults.
    """

    name: str
    build: Callable[..., nn.Module]
    example_inputs: Callable[..., tuple[torch.Tensor, ...]]
    default_batch_size: int
    source: str
    description: str
    options: dict[str, object]
