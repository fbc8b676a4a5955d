"""A model as a dense-prediction backbone: feature maps from chosen blocks or stages.

A plain ViT has one scale (stride = patch size); detection and segmentation necks take maps from
several of its blocks. ViTDet (Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection", 2022) reads the last block; DPT (Ranftl et al., "Vision Transformers for
Dense Prediction", 2021) reads four blocks spread over the depth, the default here. A
hierarchical family's backbone (the Swin's) subclasses `ViTBackbone` in its own room.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .intermediates import take_indices


def default_out_indices(depth: int) -> list[int]:
    """Four blocks spread evenly over the depth and ending at the last (12 -> 2, 5, 8, 11);
    every block when there are fewer than four."""
    count = min(4, depth)
    return [depth * (k + 1) // count - 1 for k in range(count)]


class FeatureInfo:
    """timm's `FeatureInfo`: every block's description (`info`, dicts of num_chs, reduction,
    module and index) and the chosen `out_indices`; the accessors answer for those."""

    def __init__(self, info: list[dict[str, Any]], out_indices: int | Sequence[int]) -> None:
        self.info = [{**entry, "index": i} for i, entry in enumerate(info)]
        if isinstance(out_indices, int):
            out_indices = range(-out_indices, 0)
        self.out_indices = tuple(out_indices)

    def get(self, key: str, idx: int | Sequence[int] | None = None) -> Any:
        """`key` of each chosen block (idx None), of block `idx`, or of each block in `idx`."""
        if idx is None:
            return [self.info[i][key] for i in self.out_indices]
        if isinstance(idx, int):
            return self.info[idx][key]
        return [self.info[i][key] for i in idx]

    def get_dicts(
        self, keys: Sequence[str] | None = None, idx: int | Sequence[int] | None = None
    ) -> Any:
        """The description dicts (only `keys` when given) at `idx`, as `get`."""
        chosen = self.out_indices if idx is None else idx
        if isinstance(chosen, int):
            entry = self.info[chosen]
            return entry if keys is None else {k: entry[k] for k in keys}
        return [
            self.info[i] if keys is None else {k: self.info[i][k] for k in keys} for i in chosen
        ]

    def channels(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("module", idx)

    def __getitem__(self, item: int) -> dict[str, Any]:
        return self.info[item]

    def __len__(self) -> int:
        return len(self.info)


class ViTBackbone(nn.Module):
    """`features_only` wrapper: images (B, C, H, W) -> a list of maps (B, D, H/ph, W/pw), as
    timm's `FeatureGetterNet`.

    `feature_info` (timm's `FeatureInfo`), `channels` and `reductions` describe the maps for a
    neck. Without `prune`, the classifier head and the blocks after the last index stay in
    `model` but are not run; with it they are removed, as `create_model(features_only=True)`
    and timm do. Build the model with `dynamic_img_size=True` to take images of any size that
    is a multiple of the patch size.

    Args:
        model: the ViT to read from (used as it is, not copied).
        out_indices: block indices (negative from the end), or an int n for the last n blocks;
            None: `default_out_indices(depth)`.
        norm: apply the model's final norm to each map.
        output_fmt: 'NCHW' maps, or 'NLC' patch tokens (B, N, D).
        prune: drop what the maps do not need (`model.prune_intermediate_layers`).
    """

    OUTPUT_FMTS = ("NCHW", "NLC")

    def __init__(
        self,
        model: nn.Module,
        out_indices: int | Sequence[int] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NCHW",
        prune: bool = False,
    ) -> None:
        super().__init__()
        if output_fmt not in self.OUTPUT_FMTS:
            choices = " or ".join(repr(f) for f in self.OUTPUT_FMTS)
            raise ValueError(f"output_fmt must be {choices}, got {output_fmt!r}")
        depth = len(model.feature_info)
        if out_indices is None:
            out_indices = self.default_out_indices(depth)
        if prune:
            self.out_indices = model.prune_intermediate_layers(out_indices, prune_norm=not norm)
        else:
            self.out_indices = take_indices(depth, out_indices)
        self.model = model
        self.norm = norm
        self.output_fmt = output_fmt
        self.feature_info = FeatureInfo(model.feature_info, self.out_indices)
        self.channels: list[int] = self.feature_info.channels()
        self.reductions: list[int | tuple[int, int]] = self.feature_info.reduction()

    @staticmethod
    def default_out_indices(depth: int) -> list[int]:
        return default_out_indices(depth)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """The model's `pretrained_cfg` without the classifier's keys, as timm's backbones."""
        drop = ("num_classes", "classifier", "global_pool")
        return {k: v for k, v in self.model.pretrained_cfg.items() if k not in drop}

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.model.forward_intermediates(
            x,
            self.out_indices,
            norm=self.norm,
            output_fmt=self.output_fmt,
            intermediates_only=True,
            stop_early=True,
        )

    def extra_repr(self) -> str:
        return f"out_indices={self.out_indices}, norm={self.norm}, output_fmt={self.output_fmt}"
