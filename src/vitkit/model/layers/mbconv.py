"""ViTamin's convolutional stem (Chen et al., "ViTamin: Designing Scalable Vision Models in the
Vision-Language Era", CVPR 2024), as timm's `vitamin.py` builds it: a 3x3 stem, stages of
MobileNetV2 inverted bottlenecks (Sandler et al., CVPR 2018) with a LayerNorm before each
(`MbConvLNBlock`), and a strided 3x3 convolution to the transformer's width.

Every convolution but the stem's first has stride 1 except one per stage and the last, so the
feature map is the image halved 2 + stages times (16 pixels per token for ViTamin's two
stages). Module and parameter names are timm's (`stem.conv1`, `stages.S.B.conv2_kxk`,
`pool.proj`), so its weights load as they are.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .norm import LayerNorm2d

# ViTamin's norms of convolutional maps, and its inverted bottlenecks' expansion.
_EPS = 1e-6
_EXPAND = 4


def _conv3x3(in_chans: int, out_chans: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_chans, out_chans, 3, stride=stride, padding=1, groups=groups)


class MbConvStem(nn.Module):
    """conv 3x3 (stride 2) -> LayerNorm2d -> GELU -> conv 3x3 (timm's vitamin `Stem`)."""

    def __init__(self, in_chans: int, out_chans: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_chans, out_chans, stride=2)
        self.norm1 = LayerNorm2d(out_chans, eps=_EPS)
        self.act = nn.GELU()
        self.conv2 = _conv3x3(out_chans, out_chans)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.act(self.norm1(self.conv1(x))))


class Downsample(nn.Module):
    """The shortcut of a stage's first block: 3x3 average pooling (stride 2, padding not
    counted), then a 1x1 convolution where the width changes (timm's `Downsample2d`)."""

    def __init__(self, in_chans: int, out_chans: int) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=3, stride=2, padding=1, count_include_pad=False)
        self.expand = nn.Conv2d(in_chans, out_chans, 1) if in_chans != out_chans else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.expand(self.pool(x))


class MbConvLNBlock(nn.Module):
    """x + conv1x1(GELU(dwconv3x3(GELU(conv1x1(LN(x)))))): an inverted bottleneck 4x as wide
    as its output, pre-normed; the first of a stage halves the map in the depthwise
    convolution and its shortcut."""

    def __init__(self, in_chans: int, out_chans: int, stride: int) -> None:
        super().__init__()
        mid = out_chans * _EXPAND
        if stride == 2:
            self.shortcut: nn.Module = Downsample(in_chans, out_chans)
        elif in_chans != out_chans:
            self.shortcut = nn.Conv2d(in_chans, out_chans, 1)
        else:
            self.shortcut = nn.Identity()
        self.pre_norm = LayerNorm2d(in_chans, eps=_EPS)
        self.conv1_1x1 = nn.Conv2d(in_chans, mid, 1)
        self.act1 = nn.GELU()
        self.conv2_kxk = _conv3x3(mid, mid, stride=stride, groups=mid)
        self.act2 = nn.GELU()
        self.conv3_1x1 = nn.Conv2d(mid, out_chans, 1)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.act1(self.conv1_1x1(self.pre_norm(x)))  # (B, 4 C', H, W)
        hidden = self.act2(self.conv2_kxk(hidden))  # (B, 4 C', H / s, W / s)
        return self.conv3_1x1(hidden) + self.shortcut(x)  # (B, C', H / s, W / s)


class StridedConv(nn.Module):
    """LayerNorm2d, then a 3x3 stride-2 convolution to the transformer's width."""

    def __init__(self, in_chans: int, out_chans: int) -> None:
        super().__init__()
        self.proj = _conv3x3(in_chans, out_chans, stride=2)  # timm's order of the keys
        self.norm = LayerNorm2d(in_chans, eps=_EPS)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))


class MbConvStages(nn.Module):
    """The stem (as wide as the first stage), one stage of `layers[s]` blocks of `widths[s]`
    channels per stage, and the strided convolution to `embed_dim` (timm's `MbConvStages`).

    `num_strides` is the number of stride-2 steps; `out_chans` the feature width."""

    def __init__(
        self, in_chans: int, layers: tuple[int, ...], widths: tuple[int, ...], embed_dim: int
    ) -> None:
        super().__init__()
        if len(layers) != len(widths) or not layers:
            raise ValueError(
                f"an MbConv stem needs a width per stage, got layers={layers}, widths={widths}; "
                "pass as many hybrid_widths as hybrid_layers"
            )
        self.stem = MbConvStem(in_chans, widths[0])
        stages, chans = [], widths[0]
        for depth, width in zip(layers, widths):
            first = MbConvLNBlock(chans, width, stride=2)  # halves the map
            rest = [MbConvLNBlock(width, width, stride=1) for _ in range(depth - 1)]
            stages.append(nn.Sequential(first, *rest))
            chans = width
        self.stages = nn.Sequential(*stages)
        self.pool = StridedConv(chans, embed_dim)
        self.out_chans = embed_dim
        self.num_strides = len(layers) + 2

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.stages(self.stem(x)))  # (B, D, H / 2^s, W / 2^s)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """timm's vitamin init: normal(0, sqrt(2 / fan-out)) convolutions, zero biases, unit
        norms."""
        for layer in self.modules():
            if isinstance(layer, nn.Conv2d):
                fan_out = layer.kernel_size[0] * layer.kernel_size[1] * layer.out_channels
                nn.init.normal_(layer.weight, 0.0, math.sqrt(2.0 / (fan_out // layer.groups)))
                nn.init.zeros_(layer.bias)
            elif isinstance(layer, LayerNorm2d):
                nn.init.ones_(layer.weight)
                nn.init.zeros_(layer.bias)
