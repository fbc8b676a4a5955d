"""Which explanation a model gets, asked of its family's record (`Architecture.explanation`)
here and nowhere else: a ViT's attention maps (rollout, class-specific relevance, the last
block's class-token attention), or Grad-CAM on the last stage's map of a hierarchical model
such as the Swin, whose windows, shifts and patch merging leave no attention over the whole
image; a model of no vitkit family (a timm CNN) gets none."""

from __future__ import annotations

from typing import Literal

from torch import nn

from ..model import find_architecture

Method = Literal["attention", "gradcam"]

# The maps each explanation gives, by the names `explain_image` returns them under.
MAPS: dict[str, tuple[str, ...]] = {
    "attention": ("relevance", "rollout", "cls_attention"),
    "gradcam": ("relevance",),
}


def explanation_method(model: nn.Module) -> Method | None:
    """'attention' for a ViT, 'gradcam' for a Swin: its family's explanation; None for a
    model of no family or a family without one."""
    arch = find_architecture(model)
    return None if arch is None else arch.explanation
