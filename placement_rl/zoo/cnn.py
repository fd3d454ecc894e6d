"""Convolutional benchmark models of the papers: LeNet, AlexNet, VGG, ResNet, Inception-v3, Wide ResNet.

Every model is an :class:`ImageClassifier`: ``features`` (ending in its pooling) -> flatten -> ``head``
-> mean cross-entropy against the target, so ``forward(images, target)`` returns the training loss and
``torch.fx.symbolic_trace`` sees the whole forward pass of a training step. Layers are plain ``torch.nn``
leaf modules (one graph node each); branches are concatenated with ``torch.cat``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from placement_rl.zoo.spec import ZooModel

#: Output channels of a bottleneck block are ``4 * planes`` (independent of the width factor).
_BOTTLENECK_EXPANSION = 4
#: Blocks per stage of the bottleneck ResNets, by depth.
_RESNET_BLOCKS: dict[int, tuple[int, int, int, int]] = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
#: Default bottleneck width multiplier of ``wideresnet`` (inner widths 784/1568/3136/6272): 1.818e9
#: parameters = 7.27 GB (1e9 bytes) in fp32, near the 7.3 GB of parameters of TensorOpt Table 1.
WIDE_RESNET_WIDTH_FACTOR = 12.25

# --------------------------------------------------------------------------------------------------
# Shared building blocks
# --------------------------------------------------------------------------------------------------


class ImageClassifier(nn.Module):
    """``head(flatten(features(images)))`` followed by the mean cross-entropy loss against ``target``."""

    def __init__(self, features: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, images: Tensor, target: Tensor) -> Tensor:
        logits = self.head(torch.flatten(self.features(images), 1))
        return self.criterion(logits, target)


class Concat(nn.ModuleList):
    """Parallel branches applied to the same input, concatenated along the channel dimension."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([branch(x) for branch in self], 1)


def conv_bn(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int],
    *,
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
    eps: float = 1e-5,
    relu: bool = True,
) -> nn.Sequential:
    """Bias-free convolution, batch norm and (unless ``relu=False``) ReLU, as three separate layers."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(
        conv=nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False),
        bn=nn.BatchNorm2d(out_channels, eps=eps),
    )
    if relu:
        layers["relu"] = nn.ReLU(inplace=False)
    return nn.Sequential(layers)


def mlp_head(in_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> nn.Sequential:
    """The AlexNet/VGG classifier: two hidden fully-connected layers with ReLU and dropout, then logits."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(inplace=False),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=False),
        nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )


def image_batch(batch_size: int, channels: int, image_size: int) -> tuple[Tensor, Tensor]:
    """Meta tensors ``(images [N, C, H, W] float32, target [N] int64)``."""
    images = torch.empty(batch_size, channels, image_size, image_size, device="meta")
    target = torch.empty(batch_size, dtype=torch.int64, device="meta")
    return images, target


# --------------------------------------------------------------------------------------------------
# LeNet
# --------------------------------------------------------------------------------------------------


def build_lenet(*, num_classes: int = 10, image_size: int = 28) -> nn.Module:
    """LeNet-5 style: conv5x5(6, pad 2)-pool-conv5x5(16)-pool-fc120-fc84-fc(num_classes), ReLU, max pool."""
    features = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2),
        nn.ReLU(inplace=False),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(inplace=False),
        nn.MaxPool2d(2),
    )
    side = (image_size // 2 - 4) // 2
    head = nn.Sequential(
        nn.Linear(16 * side * side, 120),
        nn.ReLU(inplace=False),
        nn.Linear(120, 84),
        nn.ReLU(inplace=False),
        nn.Linear(84, num_classes),
    )
    return ImageClassifier(features, head)


def lenet_inputs(batch_size: int, *, num_classes: int = 10, image_size: int = 28) -> tuple[Tensor, Tensor]:
    """Grey-scale ``1 x image_size x image_size`` images and their labels."""
    del num_classes  # the inputs do not depend on it
    return image_batch(batch_size, 1, image_size)


# --------------------------------------------------------------------------------------------------
# AlexNet
# --------------------------------------------------------------------------------------------------


def build_alexnet(*, num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """Single-GPU AlexNet (64-192-384-256-256 conv channels, no LRN), fc 4096-4096 with dropout."""
    del image_size  # the adaptive pooling accepts any size
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, stride=4, padding=2),
        nn.ReLU(inplace=False),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(64, 192, 5, padding=2),
        nn.ReLU(inplace=False),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(inplace=False),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(inplace=False),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(inplace=False),
        nn.MaxPool2d(3, stride=2),
        nn.AdaptiveAvgPool2d(6),
    )
    return ImageClassifier(features, mlp_head(256 * 6 * 6, 4096, num_classes))


def rgb_inputs(batch_size: int, *, num_classes: int = 1000, image_size: int = 224) -> tuple[Tensor, Tensor]:
    """RGB ``3 x image_size x image_size`` images and their labels (AlexNet, VGG, ResNet)."""
    del num_classes  # the inputs do not depend on it
    return image_batch(batch_size, 3, image_size)


# --------------------------------------------------------------------------------------------------
# VGG
# --------------------------------------------------------------------------------------------------

#: Per stage, the output channels of its 3x3 convolutions; every stage ends in a 2x2 max pool.
VGG16_STAGES: tuple[tuple[int, ...], ...] = ((64, 64), (128, 128), (256,) * 3, (512,) * 3, (512,) * 3)
VGG19_STAGES: tuple[tuple[int, ...], ...] = ((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4)


def build_vgg(stages: Sequence[Sequence[int]], num_classes: int = 1000) -> nn.Module:
    """VGG without batch norm from its per-stage conv widths, with the 4096-4096 dropout classifier."""
    layers: list[nn.Module] = []
    in_channels = 3
    for widths in stages:
        for width in widths:
            layers += [nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(inplace=False)]
            in_channels = width
        layers.append(nn.MaxPool2d(2))
    layers.append(nn.AdaptiveAvgPool2d(7))
    return ImageClassifier(nn.Sequential(*layers), mlp_head(in_channels * 7 * 7, 4096, num_classes))


def build_vgg16(*, num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """VGG-16 (configuration D)."""
    del image_size  # the adaptive pooling accepts any size
    return build_vgg(VGG16_STAGES, num_classes)


def build_vgg19(*, num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """VGG-19 (configuration E)."""
    del image_size  # the adaptive pooling accepts any size
    return build_vgg(VGG19_STAGES, num_classes)


# --------------------------------------------------------------------------------------------------
# Bottleneck ResNets (ResNet-50/101, Wide ResNet)
# --------------------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 (width) -> 3x3 (width, carries the stride) -> 1x1 (out), plus shortcut."""

    def __init__(self, in_channels: int, width: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            conv_bn(in_channels, width, 1),
            conv_bn(width, width, 3, stride=stride, padding=1),
            conv_bn(width, out_channels, 1, relu=False),
        )
        self.downsample: nn.Sequential | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = conv_bn(in_channels, out_channels, 1, stride=stride, relu=False)
        self.relu = nn.ReLU(inplace=False)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(self.residual(x) + shortcut)


def build_resnet(depth: int, num_classes: int = 1000, width_factor: float = 1.0) -> nn.Module:
    """Bottleneck ResNet of ``depth`` 50 or 101 whose inner (1x1 and 3x3) width is scaled by ``width_factor``.

    ``width_factor=1`` is the standard ResNet; 2 is torchvision's ``wide_resnet50_2`` layout.
    """
    if depth not in _RESNET_BLOCKS:
        raise ValueError(f"depth must be one of {sorted(_RESNET_BLOCKS)}, got {depth!r}")
    if width_factor <= 0:
        raise ValueError(f"width_factor must be positive, got {width_factor!r}")
    stages: OrderedDict[str, nn.Module] = OrderedDict(
        stem=conv_bn(3, 64, 7, stride=2, padding=3),
        maxpool=nn.MaxPool2d(3, stride=2, padding=1),
    )
    in_channels = 64
    for index, blocks in enumerate(_RESNET_BLOCKS[depth]):
        planes = 64 * 2**index
        width = round(planes * width_factor)
        out_channels = planes * _BOTTLENECK_EXPANSION
        stage = []
        for block in range(blocks):
            stride = 2 if index > 0 and block == 0 else 1
            stage.append(Bottleneck(in_channels, width, out_channels, stride))
            in_channels = out_channels
        stages[f"layer{index + 1}"] = nn.Sequential(*stage)
    stages["avgpool"] = nn.AdaptiveAvgPool2d(1)
    return ImageClassifier(nn.Sequential(stages), nn.Linear(in_channels, num_classes))


def build_resnet50(*, num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """ResNet-50 v1.5."""
    del image_size  # the adaptive pooling accepts any size
    return build_resnet(50, num_classes)


def build_resnet101(*, num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """ResNet-101 v1.5."""
    del image_size  # the adaptive pooling accepts any size
    return build_resnet(101, num_classes)


def build_wideresnet(
    *,
    width_factor: float = WIDE_RESNET_WIDTH_FACTOR,
    depth: int = 50,
    num_classes: int = 1000,
    image_size: int = 224,
) -> nn.Module:
    """Bottleneck ResNet-``depth`` with the bottleneck width multiplied by ``width_factor``."""
    del image_size  # the adaptive pooling accepts any size
    return build_resnet(depth, num_classes, width_factor)


def wideresnet_inputs(
    batch_size: int,
    *,
    width_factor: float = WIDE_RESNET_WIDTH_FACTOR,
    depth: int = 50,
    num_classes: int = 1000,
    image_size: int = 224,
) -> tuple[Tensor, Tensor]:
    """RGB ``3 x image_size x image_size`` images and their labels."""
    del width_factor, depth, num_classes  # the inputs do not depend on them
    return image_batch(batch_size, 3, image_size)


# --------------------------------------------------------------------------------------------------
# Inception-v3
# --------------------------------------------------------------------------------------------------

_INCEPTION_IMAGE_SIZE = 299


def _basic_conv(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int],
    *,
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
) -> nn.Sequential:
    """Inception's BasicConv2d: bias-free conv, batch norm (eps 0.001), ReLU."""
    return conv_bn(in_channels, out_channels, kernel_size, stride=stride, padding=padding, eps=0.001)


def _avg_pool_branch(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 stride-1 average pool followed by a 1x1 projection."""
    return nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), _basic_conv(in_channels, out_channels, 1))


def _inception_a(in_channels: int, pool_features: int) -> Concat:
    """35x35 block: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1; ``224 + pool_features`` channels out."""
    return Concat(
        [
            _basic_conv(in_channels, 64, 1),
            nn.Sequential(_basic_conv(in_channels, 48, 1), _basic_conv(48, 64, 5, padding=2)),
            nn.Sequential(
                _basic_conv(in_channels, 64, 1),
                _basic_conv(64, 96, 3, padding=1),
                _basic_conv(96, 96, 3, padding=1),
            ),
            _avg_pool_branch(in_channels, pool_features),
        ]
    )


def _inception_b(in_channels: int) -> Concat:
    """35x35 -> 17x17 reduction: 3x3/2 | 1x1-3x3-3x3/2 | maxpool/2; ``480 + in_channels`` channels out."""
    return Concat(
        [
            _basic_conv(in_channels, 384, 3, stride=2),
            nn.Sequential(
                _basic_conv(in_channels, 64, 1),
                _basic_conv(64, 96, 3, padding=1),
                _basic_conv(96, 96, 3, stride=2),
            ),
            nn.MaxPool2d(3, stride=2),
        ]
    )


def _inception_c(in_channels: int, mid: int) -> Concat:
    """17x17 block with factorised 7x7 convolutions (``mid`` inner channels); 768 channels out."""
    return Concat(
        [
            _basic_conv(in_channels, 192, 1),
            nn.Sequential(
                _basic_conv(in_channels, mid, 1),
                _basic_conv(mid, mid, (1, 7), padding=(0, 3)),
                _basic_conv(mid, 192, (7, 1), padding=(3, 0)),
            ),
            nn.Sequential(
                _basic_conv(in_channels, mid, 1),
                _basic_conv(mid, mid, (7, 1), padding=(3, 0)),
                _basic_conv(mid, mid, (1, 7), padding=(0, 3)),
                _basic_conv(mid, mid, (7, 1), padding=(3, 0)),
                _basic_conv(mid, 192, (1, 7), padding=(0, 3)),
            ),
            _avg_pool_branch(in_channels, 192),
        ]
    )


def _inception_d(in_channels: int) -> Concat:
    """17x17 -> 8x8 reduction: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | maxpool/2; ``512 + in_channels`` out."""
    return Concat(
        [
            nn.Sequential(_basic_conv(in_channels, 192, 1), _basic_conv(192, 320, 3, stride=2)),
            nn.Sequential(
                _basic_conv(in_channels, 192, 1),
                _basic_conv(192, 192, (1, 7), padding=(0, 3)),
                _basic_conv(192, 192, (7, 1), padding=(3, 0)),
                _basic_conv(192, 192, 3, stride=2),
            ),
            nn.MaxPool2d(3, stride=2),
        ]
    )


def _split_1x3_3x1(channels: int) -> Concat:
    """The parallel 1x3 and 3x1 convolutions that end Inception-E's 3x3 branches (2 x 384 channels)."""
    return Concat(
        [
            _basic_conv(channels, 384, (1, 3), padding=(0, 1)),
            _basic_conv(channels, 384, (3, 1), padding=(1, 0)),
        ]
    )


def _inception_e(in_channels: int) -> Concat:
    """8x8 block with expanded filter banks: 1x1 | 1x1-split | 1x1-3x3-split | avgpool-1x1; 2048 out."""
    return Concat(
        [
            _basic_conv(in_channels, 320, 1),
            nn.Sequential(_basic_conv(in_channels, 384, 1), _split_1x3_3x1(384)),
            nn.Sequential(
                _basic_conv(in_channels, 448, 1),
                _basic_conv(448, 384, 3, padding=1),
                _split_1x3_3x1(384),
            ),
            _avg_pool_branch(in_channels, 192),
        ]
    )


def build_inception_v3(*, num_classes: int = 1000, dropout: float = 0.5) -> nn.Module:
    """Inception-v3 for 3x299x299 images, without the auxiliary classifier."""
    features = nn.Sequential(
        OrderedDict(
            conv1a=_basic_conv(3, 32, 3, stride=2),
            conv2a=_basic_conv(32, 32, 3),
            conv2b=_basic_conv(32, 64, 3, padding=1),
            maxpool1=nn.MaxPool2d(3, stride=2),
            conv3b=_basic_conv(64, 80, 1),
            conv4a=_basic_conv(80, 192, 3),
            maxpool2=nn.MaxPool2d(3, stride=2),
            mixed5b=_inception_a(192, 32),
            mixed5c=_inception_a(256, 64),
            mixed5d=_inception_a(288, 64),
            mixed6a=_inception_b(288),
            mixed6b=_inception_c(768, 128),
            mixed6c=_inception_c(768, 160),
            mixed6d=_inception_c(768, 160),
            mixed6e=_inception_c(768, 192),
            mixed7a=_inception_d(768),
            mixed7b=_inception_e(1280),
            mixed7c=_inception_e(2048),
            avgpool=nn.AdaptiveAvgPool2d(1),
        )
    )
    return ImageClassifier(features, nn.Sequential(nn.Dropout(dropout), nn.Linear(2048, num_classes)))


def inception_v3_inputs(batch_size: int, *, num_classes: int = 1000, dropout: float = 0.5) -> tuple[Tensor, Tensor]:
    """RGB ``3 x 299 x 299`` images and their labels."""
    del num_classes, dropout  # the inputs do not depend on them
    return image_batch(batch_size, 3, _INCEPTION_IMAGE_SIZE)


# --------------------------------------------------------------------------------------------------
# Registry records
# --------------------------------------------------------------------------------------------------

_RGB_OPTIONS: dict[str, object] = {"num_classes": 1000, "image_size": 224}

MODELS: tuple[ZooModel, ...] = (
    ZooModel(
        name="lenet",
        build=build_lenet,
        example_inputs=lenet_inputs,
        default_batch_size=64,
        source="FlexFlow sec. 8.3 (6-layer CNN)",
        description=(
            "LeNet-5 style CNN on 1x28x28 images: conv5x5(6, pad 2)-maxpool-conv5x5(16)-maxpool-fc120-fc84-"
            "fc10 with ReLU (61.7K params); the paper gives no layer sizes, so these are an assumption"
        ),
        options={"num_classes": 10, "image_size": 28},
    ),
    ZooModel(
        name="alexnet",
        build=build_alexnet,
        example_inputs=rgb_inputs,
        default_batch_size=256,
        source="FlexFlow Table 4 (per-GPU batch 256)",
        description=(
            "single-GPU AlexNet (conv 64-192-384-256-256, fc 4096-4096-1000 with dropout, 61.1M params) on "
            "3x224x224; no local response normalisation, unlike the original two-GPU AlexNet"
        ),
        options=dict(_RGB_OPTIONS),
    ),
    ZooModel(
        name="vgg16",
        build=build_vgg16,
        example_inputs=rgb_inputs,
        default_batch_size=256,
        source="TensorOpt Table 1",
        description="VGG-16 (configuration D, no batch norm, fc 4096-4096-1000, 138.4M params) on 3x224x224",
        options=dict(_RGB_OPTIONS),
    ),
    ZooModel(
        name="vgg19",
        build=build_vgg19,
        example_inputs=rgb_inputs,
        default_batch_size=96,
        source="TAG Table 3",
        description="VGG-19 (configuration E, no batch norm, fc 4096-4096-1000, 143.7M params) on 3x224x224",
        options=dict(_RGB_OPTIONS),
    ),
    ZooModel(
        name="resnet50",
        build=build_resnet50,
        example_inputs=rgb_inputs,
        default_batch_size=64,
        source="FlexFlow (per-GPU batch 64) / standard ResNet-50",
        description="ResNet-50 v1.5 (bottleneck, stride on the 3x3 conv, 25.6M params) on 3x224x224",
        options=dict(_RGB_OPTIONS),
    ),
    ZooModel(
        name="resnet101",
        build=build_resnet101,
        example_inputs=rgb_inputs,
        default_batch_size=96,
        source="TAG Table 3 / FlexFlow Table 4",
        description="ResNet-101 v1.5 (bottleneck, stride on the 3x3 conv, 44.5M params) on 3x224x224",
        options=dict(_RGB_OPTIONS),
    ),
    ZooModel(
        name="inception_v3",
        build=build_inception_v3,
        example_inputs=inception_v3_inputs,
        default_batch_size=96,
        source="TAG Table 3 / FlexFlow Table 4 / Trinity",
        description=(
            "Inception-v3 (stem, 3xA, B, 4xC, D, 2xE, avgpool, dropout, fc, 23.8M params) on 3x299x299; "
            "without the auxiliary classifier"
        ),
        options={"num_classes": 1000, "dropout": 0.5},
    ),
    ZooModel(
        name="wideresnet",
        build=build_wideresnet,
        example_inputs=wideresnet_inputs,
        default_batch_size=256,
        source="TensorOpt Table 1 (7.3 GB of parameters)",
        description=(
            f"ResNet-50 v1.5 layout with the bottleneck width x{WIDE_RESNET_WIDTH_FACTOR} (1.82B params, "
            "7.27 GB fp32) on 3x224x224; the paper gives only the parameter size, which the width is chosen "
            "to match"
        ),
        options={
            "width_factor": WIDE_RESNET_WIDTH_FACTOR,
            "depth": 50,
            "num_classes": 1000,
            "image_size": 224,
        },
    ),
)
