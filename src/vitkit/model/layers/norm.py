"""The norm layers of `ViTConfig.norm_layer`.

LayerNorm is Ba et al., "Layer Normalization" (2016), as the ViT paper places it before each
residual branch (Dosovitskiy et al., ICLR 2021, Eq. 2-3); RMSNorm (scale, no bias, no mean) is
Zhang & Sennrich, "Root Mean Square Layer Normalization" (NeurIPS 2019).
"""

from __future__ import annotations

from torch import nn

from ...options import check_choice
from ..config import NORM_LAYERS


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    """The norm module of `ViTConfig.norm_layer`: LayerNorm, or RMSNorm (scale, no bias)."""
    check_choice("norm_layer", kind, NORM_LAYERS)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    return nn.LayerNorm(dim, eps=eps)
