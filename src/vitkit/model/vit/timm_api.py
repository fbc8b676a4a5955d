"""timm's model API on vitkit's ViT, so timm's tools take it as one of their own models.

The methods and attributes follow timm's `VisionTransformer` (Wightman, pytorch-image-models):
`pretrained_cfg` (which `timm.data.resolve_data_config` reads), `group_matcher` (layer-wise
learning-rate decay), `prune_intermediate_layers` and `feature_info` (`features_only`
backbones), `set_input_size` (FlexiViT's PI-resize of the patch projection: Beyer et al.,
"FlexiViT: One Model for All Patch Sizes", CVPR 2023) and `get_classifier` /
`reset_classifier`. `VisionTransformer` inherits them from `TimmModelApi`, which takes
`get_classifier` and `set_grad_checkpointing` from every family's `TimmApi` and states the rest
for the ViT's own parts (the torch encoder's blocks, the distillation head, the attention
pool, FlexiViT's resize).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..intermediates import take_indices
from ..layers import PatchEmbed, conv_to_unfold_weight, unfold_to_conv_weight
from ..layers.pos_embed import fixed_pos_embed, resample_patch_embed, resample_pos_embed
from ..layers.weight_init import trunc_normal_
from ..timm_api import TimmApi
from .config import ViTConfig


def feature_reduction(patch_embed: PatchEmbed) -> int | tuple[int, int]:
    """Image pixels per token, as timm's `feature_info` states it (an int when square)."""
    red_h, red_w = patch_embed.reduction
    return red_h if red_h == red_w else (red_h, red_w)


def block_feature_info(config: ViTConfig, patch_embed: PatchEmbed) -> list[dict[str, Any]]:
    """timm's per-block feature description (`FeatureInfo` reads it)."""
    prefix = "blocks.layers" if config.encoder == "torch" else "blocks"
    reduction = feature_reduction(patch_embed)
    return [
        {"module": f"{prefix}.{i}", "num_chs": config.embed_dim, "reduction": reduction}
        for i in range(config.depth)
    ]


class TimmModelApi(TimmApi):
    """timm's model API for `VisionTransformer`: it reads and replaces the model's `config`,
    `patch_embed`, `pos_embed`, blocks, norms and heads, and builds new parts with the model's
    `_build_patch_embed` and `_build_head`."""

    @property
    def timm_classifier(self) -> str | tuple[str, ...]:
        return ("head", "head_dist") if self.head_dist is not None else "head"

    def timm_first_conv(self) -> str:
        return self.config.first_conv

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter-name patterns of timm's layer groups (the embedding stem, then each block,
        the final norm last), as timm's layer-wise learning-rate decay reads them."""
        blocks = r"^blocks\.layers\.(\d+)" if self.config.encoder == "torch" else r"^blocks\.(\d+)"
        return {
            "stem": r"^cls_token|dist_token|reg_token|pos_embed|patch_embed|norm_pre",
            "blocks": [(blocks, None), (r"^norm", (99999,))],
        }

    def prune_intermediate_layers(
        self,
        indices: int | list[int] | tuple[int, ...] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the blocks after the last of `indices` (and the final norm, and the pooling and
        head) for a backbone that only reads intermediates, as timm's; returns the kept block
        indices, counted from the start. `config` follows (depth, norms, head)."""
        blocks = self.block_list()
        take = take_indices(len(blocks), indices)
        depth = max(take) + 1
        if self.config.encoder == "torch":
            self.blocks.layers = self.blocks.layers[:depth]
            self.blocks.num_layers = depth
        else:
            self.blocks = self.blocks[:depth]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            # A distilled model's two heads read its two tokens: the pooling stays.
            self.reset_classifier(0, None if self.config.distilled else "none")
        has_norm = not isinstance(self.norm, nn.Identity)
        has_fc_norm = not isinstance(self.fc_norm, nn.Identity)
        self.config = self.config.replace(
            depth=depth, final_norm=has_norm or has_fc_norm, fc_norm=has_fc_norm
        )
        return take

    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        patch_size: int | tuple[int, int] | None = None,
    ) -> None:
        """Take another image size and / or patch size from now on, as timm's: the learned
        position grid is resampled (bicubic) and, for a new patch size, the patch projection
        too (FlexiViT's PI-resize, `resample_patch_embed`); fixed tables are recomputed."""
        old_grid = self.patch_embed.grid_size
        changes: dict[str, Any] = {}
        if self.config.use_rel_pos and self.config.rel_pos_img_size is None:
            changes["rel_pos_img_size"] = self.config.img_size  # the tables keep their size
        config = self.config.replace(
            img_size=self.config.img_size if img_size is None else img_size,
            patch_size=self.config.patch_size if patch_size is None else patch_size,
            **changes,
        )
        self.patch_embed = self._resized_patch_embed(config)
        self.config = config
        reduction = feature_reduction(self.patch_embed)
        for entry in self.feature_info:  # the maps' stride follows the patch size
            entry["reduction"] = reduction
        if self.patch_embed.grid_size != old_grid:
            self._resize_pos_embed(old_grid)

    def _resized_patch_embed(self, config: ViTConfig) -> PatchEmbed:
        """A patch embedding for `config`'s sizes holding the current one's weights, the
        projection PI-resized to a new patch size."""
        old = self.patch_embed
        new = self._build_patch_embed(config)
        state = old.state_dict()
        if new.patch_size != old.patch_size:
            proj_chans = old.backbone.out_chans if old.backbone is not None else old.in_chans
            kernel = unfold_to_conv_weight(old.proj.weight, proj_chans, old.patch_size)
            kernel = resample_patch_embed(kernel.detach(), new.patch_size)  # (D, C, ph', pw')
            state["proj.weight"] = kernel if new.kind == "conv" else conv_to_unfold_weight(kernel)
        new.load_state_dict(state)
        return new.to(next(old.parameters()).device).train(old.training)

    def _resize_pos_embed(self, old_grid: tuple[int, int]) -> None:
        """Positions for the new patch grid: the learned table resampled, a fixed one
        recomputed."""
        grid = self.patch_embed.grid_size
        if self.pos_embed_kind == "learn":
            table = resample_pos_embed(
                self.pos_embed.detach(),
                new_size=grid,
                old_size=old_grid,
                num_prefix_tokens=self.pos_prefix_tokens,
            )
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        elif self.pos_embed is not None:
            fixed = fixed_pos_embed(
                self.pos_embed_kind, grid, self.embed_dim, self.pos_prefix_tokens
            )
            self.pos_embed = fixed.to(self.pos_embed)  # a buffer: assignment keeps it one

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh head (and distillation head) for `num_classes` outputs, for fine-tuning;
        `global_pool` also changes the pooling, as timm's (the attention pool can be dropped
        by another pooling, not added; the norm stays where it is; timm's '' is 'none')."""
        if global_pool == "":
            global_pool = "none"
        if global_pool is not None and global_pool != self.global_pool:
            self._reset_pool(global_pool)
        self.config = self.config.replace(num_classes=num_classes)
        self.num_classes = num_classes
        for name in ("head", "head_dist"):
            if getattr(self, name) is None:
                continue
            head = self._build_head(num_classes)
            if isinstance(head, nn.Linear):
                trunc_normal_(head.weight)
                nn.init.zeros_(head.bias)
            setattr(self, name, head.to(next(self.patch_embed.parameters()).device))

    def _reset_pool(self, global_pool: str) -> None:
        """Another pooling for `reset_classifier`; the attention pool can only be dropped."""
        if global_pool == "map":
            raise ValueError(
                "reset_classifier cannot add an attention pool; build the model with "
                "global_pool='map'"
            )
        self.config = self.config.replace(global_pool=global_pool, fc_norm=self.config.use_fc_norm)
        self.global_pool = global_pool
        self.attn_pool = None
