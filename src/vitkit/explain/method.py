"""Which explanation a model gets, decided here and nowhere else: a ViT's attention maps
(rollout, class-specific relevance, the last block's class-token attention), or Grad-CAM on
the last stage's map of a hierarchical model such as the Swin, whose windows, shifts and patch
merging leave no attention over the whole image; a model with neither (a timm CNN) gets none."""

from __future__ import annotations

from typing import Literal

from torch import nn

from ..model import SwinTransformer, VisionTransformer

Method = Literal["attention", "gradcam"]

# The maps each explanation gives, by the names `explain_image` returns them under.
MAPS: dict[str, tuple[str, ...]] = {
    "attention": ("relevance", "rollout", "cls_attention"),
    "gradcam": ("relevance",),
}


def explanation_method(model: nn.Module) -> Method | None:
    """'attention' for a ViT, 'gradcam' for a Swin, None for a model that has no explanation."""
    if isinstance(model, SwinTransformer):
        return "gradcam"
    if isinstance(model, VisionTransformer):
        return "attention"
    return None
