"""The ResNet of the paper's hybrid ViTs (Section 3.1): timm's `ResNetV2` as its
`vision_transformer_hybrid.py` builds it (`preact=False`, stem_type='same').

Kolesnikov et al., "Big Transfer (BiT): General Visual Representation Learning" (ECCV 2020):
weight-standardised convolutions (Qiao et al., "Weight Standardization", 2019) and
GroupNorm(32) instead of BatchNorm; TensorFlow's 'SAME' padding, computed from the input size,
because the weights come from the JAX original. The blocks are the classic (not pre-activation)
bottleneck with the downsampling stride in the 3x3 convolution. Module and parameter names are
timm's (`stem.conv`, `stem.norm`, `stages.S.blocks.B.conv1` ...), so its weights load as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# timm's hybrids standardise with this epsilon (`partial(StdConv2dSame, eps=1e-8)`).
STD_CONV_EPS = 1e-8
# Output channels of the stages (BiT's, before the width factor; the hybrids use factor 1).
STAGE_CHANNELS = (256, 512, 1024, 2048)
STEM_CHANNELS = 64


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) of one side for kernel >= stride: the output
    is ceil(size / stride), the extra pixel, when the total is odd, after. Integer arithmetic
    only, so that TorchScript compiles it and torch.fx traces it."""
    total = ((size + stride - 1) // stride - 1) * stride + kernel - size  # (out - 1) * s + k - size
    return total // 2, total - total // 2


def pad_same(
    x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], value: float = 0.0
) -> Tensor:
    """`x` (B, C, H, W) padded for a 'SAME' convolution or pooling of `kernel` and `stride`."""
    top, bottom = same_padding(x.shape[-2], kernel[0], stride[0])
    left, right = same_padding(x.shape[-1], kernel[1], stride[1])
    return F.pad(x, (left, right, top, bottom), value=value)  # (B, C, H', W')


class StdConv2dSame(nn.Conv2d):
    """A bias-free Conv2d whose kernel is standardised per output channel (zero mean, unit
    variance over its inputs, `eps` added to the variance) before every use, with 'SAME'
    padding: static where the stride is 1 (the same as symmetric padding) or the kernel 1x1
    (none), else from the input size."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1) -> None:
        static = stride == 1 or kernel_size == 1
        padding = (kernel_size - 1) // 2 if static else 0
        super().__init__(in_chans, out_chans, kernel_size, stride, padding=padding, bias=False)
        self.same_pad = not static
        self.eps = STD_CONV_EPS

    def forward(self, x: Tensor) -> Tensor:
        if self.same_pad:
            x = pad_same(x, self.kernel_size, self.stride)  # type: ignore[arg-type]
        flat = self.weight.reshape(1, self.out_channels, -1)  # (1, out, in * kh * kw)
        weight = F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=self.eps)
        weight = weight.reshape_as(self.weight)  # (out, in, kh, kw)
        return F.conv2d(x, weight, None, self.stride, self.padding)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm(32 groups, eps 1e-5), then ReLU unless `act=False` (timm's `GroupNormAct`)."""

    def __init__(self, channels: int, act: bool = True) -> None:
        super().__init__(32, channels, eps=1e-5)
        self.act = nn.ReLU(inplace=True) if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return self.act(x)


class MaxPool2dSame(nn.MaxPool2d):
    """3x3 stride-2 max pooling with 'SAME' padding (padded with -inf)."""

    def __init__(self) -> None:
        super().__init__(kernel_size=3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        x = pad_same(x, (3, 3), (2, 2), value=float("-inf"))  # (B, C, H', W')
        return F.max_pool2d(x, 3, 2)


class ResNetStem(nn.Sequential):
    """7x7 stride-2 convolution, GroupNorm + ReLU, 3x3 stride-2 max pooling: a quarter of the
    image per side (rounded up). timm's `create_resnetv2_stem(stem_type='same', preact=False)`;
    on its own it is the backbone of `vit_tiny_r_s16_p8_*`."""

    def __init__(self, in_chans: int, out_chans: int = STEM_CHANNELS) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, 7, stride=2)
        self.norm = GroupNormAct(out_chans)
        self.pool = MaxPool2dSame()
        self.out_chans = out_chans
        self.num_strides = 2

    def reset_parameters(self) -> None:
        _reset(self)


class DownsampleConv(nn.Module):
    """The shortcut of a stage's first block: a strided 1x1 convolution and GroupNorm."""

    def __init__(self, in_chans: int, out_chans: int, stride: int) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, 1, stride=stride)
        self.norm = GroupNormAct(out_chans, act=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 (to a quarter of the width), 3x3 (strided), 1x1 (back to the width), each followed
    by GroupNorm, ReLU after the first two; the sum with the shortcut, then ReLU (timm's
    non-pre-activation `Bottleneck`)."""

    def __init__(self, in_chans: int, out_chans: int, stride: int, downsample: bool) -> None:
        super().__init__()
        mid = out_chans // 4
        self.downsample = DownsampleConv(in_chans, out_chans, stride) if downsample else None
        self.conv1 = StdConv2dSame(in_chans, mid, 1)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2dSame(mid, mid, 3, stride=stride)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2dSame(mid, out_chans, 1)
        self.norm3 = GroupNormAct(out_chans, act=False)
        self.act3 = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return self.act3(x + shortcut)


class ResNetStage(nn.Module):
    """`depth` bottlenecks; the first changes the width and, unless it is the first stage,
    halves the map."""

    def __init__(self, in_chans: int, out_chans: int, stride: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *[
                Bottleneck(
                    in_chans if i == 0 else out_chans,
                    out_chans,
                    stride if i == 0 else 1,
                    downsample=i == 0,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)


class ResNetV2(nn.Module):
    """The stem, then one stage per entry of `layers` (blocks per stage): R50's are (3, 4, 9)
    (its fourth stage dropped: 16 pixels per feature), R26's (2, 2, 2, 2) (32 pixels).

    `num_strides` is the number of stride-2 steps (a feature-map side is the image side halved
    that many times, rounded up each time); `out_chans` the feature width."""

    def __init__(self, in_chans: int, layers: tuple[int, ...]) -> None:
        super().__init__()
        if not 1 <= len(layers) <= len(STAGE_CHANNELS):
            raise ValueError(f"a ResNetV2 has 1 to 4 stages, got layers={layers}")
        self.stem = ResNetStem(in_chans)
        stages, chans = [], STEM_CHANNELS
        for index, (depth, out) in enumerate(zip(layers, STAGE_CHANNELS)):
            stages.append(ResNetStage(chans, out, 1 if index == 0 else 2, depth))
            chans = out
        self.stages = nn.Sequential(*stages)
        self.out_chans = chans
        self.num_strides = self.stem.num_strides + len(layers) - 1

    def forward(self, x: Tensor) -> Tensor:
        return self.stages(self.stem(x))  # (B, out_chans, H / 2^s, W / 2^s)

    def reset_parameters(self) -> None:
        _reset(self)


def build_hybrid_backbone(kind: str, in_chans: int, layers: tuple[int, ...]) -> nn.Module:
    """The CNN of a hybrid ViT: `kind` 'resnetv2' with `layers` blocks per stage, or its stem
    alone when `layers` is empty (timm's `_resnetv2(layers=())`)."""
    if kind != "resnetv2":
        raise ValueError(f"unknown hybrid backbone {kind!r}; use 'resnetv2'")
    return ResNetV2(in_chans, layers) if layers else ResNetStem(in_chans)


@torch.no_grad()
def _reset(module: nn.Module) -> None:
    """timm's ResNetV2 init: He (fan-out) normal convolutions, unit norms."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(layer, nn.GroupNorm):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)
