"""Small models for the executor's correctness tests, as ``package.module:factory`` strings.

``small_resnet``: a ResNet with two basic blocks (residual additions, a strided projection shortcut),
global average pooling and a linear classifier, returning the mean cross-entropy. Its normalization is
``GroupNorm``: per-sample statistics, so a split batch computes exactly what the whole batch does (batch
norm over a split batch uses each partition's statistics, as DistributedDataParallel does, and differs).

``inplace_mlp``: linear layers with in-place ReLUs and an in-place residual addition. ``batch_centered``:
a reduction over the batch before the loss, which micro-batches cannot split (the executor refuses it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(2, out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(2, out_channels)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )
        self.relu2 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm2(self.conv2(self.relu1(self.norm1(self.conv1(x)))))
        return self.relu2(y + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.block1 = BasicBlock(8, 8, 1)
        self.block2 = BasicBlock(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, images: Tensor, target: Tensor) -> Tensor:
        x = self.block2(self.block1(self.stem(images)))
        return self.loss(self.fc(torch.flatten(self.pool(x), 1)), target)


def small_resnet(batch_size: int = 8) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """The module and its example inputs: ``(batch, 3, 16, 16)`` images and ``(batch,)`` labels."""
    images = torch.empty(batch_size, 3, 16, 16)
    target = torch.empty(batch_size, dtype=torch.int64)
    return SmallResNet(), (images, target)


class InplaceMLP(nn.Module):
    """Linear layers with in-place ReLUs and an in-place residual addition (``h += x``), as user models
    often write them."""

    def __init__(self, width: int = 16, num_classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.act1 = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.ReLU(inplace=True)
        self.out = nn.Linear(width, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        h = self.fc1(x)
        h += x
        h = self.act1(h)
        return self.loss(self.out(self.act2(self.fc2(h))), target)


def inplace_mlp(batch_size: int = 8) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """The module and its example inputs: ``(batch, 16)`` features and ``(batch,)`` labels."""
    return InplaceMLP(), (torch.empty(batch_size, 16), torch.empty(batch_size, dtype=torch.int64))


class BatchCentered(nn.Module):
    """A linear classifier of features centred on the batch mean: a reduction over the batch before the
    loss (a sample split sums its partial means; micro-batches would each centre on their own)."""

    def __init__(self, width: int = 16, num_classes: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(width, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        return self.loss(self.fc(x - x.mean(0, keepdim=True)), target)


def batch_centered(batch_size: int = 8) -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    """The module and its example inputs: ``(batch, 16)`` features and ``(batch,)`` labels."""
    return BatchCentered(), (torch.empty(batch_size, 16), torch.empty(batch_size, dtype=torch.int64))
