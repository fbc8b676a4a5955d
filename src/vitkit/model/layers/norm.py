"""The norm layers of `ViTConfig.norm_layer`.

LayerNorm is Ba et al., "Layer Normalization" (2016), as the ViT paper places it before each
residual branch (Dosovitskiy et al., ICLR 2021, Eq. 2-3); RMSNorm (scale, no bias, no mean) is
Zhang & Sennrich, "Root Mean Square Layer Normalization" (NeurIPS 2019). `LayerNorm2d` is the
LayerNorm of convolutional maps over their channels (ConvNeXt's, detectron2's "LN").
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ...options import check_choice

NORM_LAYERS = ("layernorm", "rmsnorm")


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """The norm module of `ViTConfig.norm_layer`: LayerNorm, or RMSNorm (scale, no bias)."""
    check_choice("norm_layer", kind, NORM_LAYERS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    return nn.LayerNorm(dim, eps=eps)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of maps (B, C, H, W), at every position (detectron2's "LN"
    norm of convolutions, ConvNeXt's channels-first LayerNorm)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)  # (B, C, H, W)
