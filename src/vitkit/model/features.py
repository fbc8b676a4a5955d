"""A ViT as a dense-prediction backbone: feature maps from chosen blocks.

A plain ViT has one scale (stride = patch size); detection and segmentation necks take maps from
several of its blocks. ViTDet (Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection", 2022) reads the last block; DPT (Ranftl et al., "Vision Transformers for
Dense Prediction", 2021) reads four blocks spread over the depth, the default here.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .vit import VisionTransformer, take_indices


def default_out_indices(depth: int) -> list[int]:
    """Four blocks spread evenly over the depth and ending at the last (12 -> 2, 5, 8, 11);
    every block when there are fewer than four."""
    count = min(4, depth)
    return [depth * (k + 1) // count - 1 for k in range(count)]


class ViTBackbone(nn.Module):
    """`features_only` wrapper: images (B, C, H, W) -> a list of maps (B, D, H/ph, W/pw).

    `channels`, `reductions` and timm-style `feature_info` describe the maps for a neck. The
    classifier head and the blocks after the last index stay in `model` but are not run; build
    the model with `num_classes=0` to drop the head's weights. Build it with
    `dynamic_img_size=True` to take images of any size that is a multiple of the patch size.

    Args:
        model: the ViT to read from (used as it is, not copied).
        out_indices: block indices (negative from the end), or an int n for the last n blocks;
            None: `default_out_indices(depth)`.
        norm: apply the model's final norm to each map.
    """

    def __init__(
        self,
        model: VisionTransformer,
        out_indices: int | list[int] | tuple[int, ...] | None = None,
        *,
        norm: bool = False,
    ) -> None:
        super().__init__()
        depth = model.config.depth
        if out_indices is None:
            out_indices = default_out_indices(depth)
        self.model = model
        self.out_indices = take_indices(depth, out_indices)
        self.norm = norm
        red_h, red_w = model.patch_embed.reduction  # image pixels per token
        reduction: int | tuple[int, int] = red_h if red_h == red_w else (red_h, red_w)
        self.channels: list[int] = [model.embed_dim] * len(self.out_indices)
        self.reductions: list[int | tuple[int, int]] = [reduction] * len(self.out_indices)
        blocks = "blocks.layers" if model.config.encoder == "torch" else "blocks"
        self.feature_info: list[dict[str, Any]] = [
            {"num_chs": model.embed_dim, "reduction": reduction, "module": f"{blocks}.{i}"}
            for i in self.out_indices
        ]

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.model.forward_intermediates(
            x,
            self.out_indices,
            norm=self.norm,
            output_fmt="NCHW",
            intermediates_only=True,
            stop_early=True,
        )

    def extra_repr(self) -> str:
        return f"out_indices={self.out_indices}, norm={self.norm}"
