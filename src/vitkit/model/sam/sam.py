"""The SAM family's model: Segment Anything's image encoder, as timm's `VisionTransformerSAM`
(timm's `vision_transformer_sam.py`).

Kirillov et al., "Segment Anything" (ICCV 2023), Appendix A: an MAE-pretrained ViT run as
ViTDet's backbone (Li et al., ECCV 2022): 14 x 14 windows with four evenly spaced global blocks,
decomposed relative positions (MViTv2), then a neck to 256 channels.

    image (B, C, H, W)
      -> patch embedding           (B, H/p, W/p, D)   maps, no class token
      -> [+ absolute positions]    (B, H/p, W/p, D)   resampled (bicubic) at another size
      -> dropout, [norm_pre]
      -> depth x window block      (B, H/p, W/p, D)   windows, or global at global_attn_indexes
      -> neck                      (B, C', H/p, W/p)  forward_features: conv 1x1, LN2d, conv 3x3,
                                                      LN2d (C' = neck_chans), or one LN2d
      -> pool, dropout, fc         (B, num_classes)   forward_head (no fc: the pooled (B, C'))

Module and parameter names are timm's (`patch_embed.proj`, `pos_embed`, `blocks.N.attn.qkv` /
`rel_pos_h` / `rel_pos_w`, `blocks.N.mlp.fc1`, `neck.0` ... `neck.3`, `head.fc`), so timm's state
dicts load unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..intermediates import take_indices
from ..layers.norm import LayerNorm2d
from ..layers.pos_embed import resample_pos_embed
from ..layers.window import WindowBlock
from ..timm_api import TimmApi
from ..timm_cfg import IMAGENET_MEAN, IMAGENET_STD
from .config import SamConfig

NECK_EPS = 1e-6  # timm's LayerNorm2d


def build_neck(config: SamConfig) -> nn.Module:
    """SAM's neck to `neck_chans` channels, or (none) the LayerNorm2d timm puts in its place."""
    if not config.neck_chans:
        return LayerNorm2d(config.embed_dim, eps=NECK_EPS)
    chans = config.neck_chans
    return nn.Sequential(
        nn.Conv2d(config.embed_dim, chans, kernel_size=1, bias=False),
        LayerNorm2d(chans, eps=NECK_EPS),
        nn.Conv2d(chans, chans, kernel_size=3, padding=1, bias=False),
        LayerNorm2d(chans, eps=NECK_EPS),
    )


def pool_map(x: Tensor, pool_type: str) -> Tensor:
    """Maps (B, C, H, W) -> (B, C) by `pool_type` (timm's `SelectAdaptivePool2d`); 'none'
    keeps the map."""
    if pool_type == "avg":
        return x.mean(dim=(2, 3))
    if pool_type == "max":
        return x.amax(dim=(2, 3))
    if pool_type == "avgmax":
        return 0.5 * (x.mean(dim=(2, 3)) + x.amax(dim=(2, 3)))
    return x


class SamHead(nn.Module):
    """timm's `ClassifierHead` on the neck's map: pool, dropout, `fc` (none: the pooled
    features)."""

    def __init__(self, in_features: int, num_classes: int, pool_type: str, drop_rate: float):
        super().__init__()
        self.pool_type = pool_type
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(in_features, num_classes) if num_classes else nn.Identity()

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.drop(pool_map(x, self.pool_type))  # (B, C) or the map
        return x if pre_logits else self.fc(x)


class SamViT(TimmApi, nn.Module):
    """`SamViT(**options)` or `SamViT(SamConfig(...))`: timm's `VisionTransformerSAM`, with
    timm's model API (`forward_features`, `forward_head`, `forward_intermediates`,
    `pretrained_cfg`, `group_matcher`, `reset_classifier`, `prune_intermediate_layers`)."""

    TIMM_MEAN, TIMM_STD = IMAGENET_MEAN, IMAGENET_STD  # timm's SAM default

    def __init__(self, config: SamConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        if config is None:
            config = SamConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        self.config = config
        dim = self.embed_dim = config.embed_dim
        self.num_classes = config.num_classes
        self.num_features = self.head_hidden_size = config.num_features
        self.global_pool = config.global_pool
        self.grad_checkpointing = False
        self.patch_embed = self._patch_embed(bias=not config.pre_norm)
        grid = self.patch_embed.grid_size
        self.pos_embed = None
        if config.use_abs_pos:
            self.pos_embed = nn.Parameter(torch.zeros(1, grid[0], grid[1], dim))
        self.pos_drop = nn.Dropout(config.pos_drop_rate)
        self.norm_pre = nn.LayerNorm(dim, eps=config.norm_eps) if config.pre_norm else nn.Identity()
        last = max(config.depth - 1, 1)
        self.blocks = nn.Sequential(
            *(self._block(i, config.drop_path_rate * i / last) for i in range(config.depth))
        )
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": dim, "reduction": config.patch_size}
            for i in range(config.depth)
        ]
        self.neck = build_neck(config)
        self.head = SamHead(
            config.num_features, config.num_classes, config.global_pool, config.drop_rate
        )
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None

    def _patch_embed_options(self) -> dict[str, Any]:
        return {"dynamic_img_size": True}  # timm's SAM embedding is not strict about the size

    def _block(self, index: int, drop_path: float) -> WindowBlock:
        config = self.config
        return WindowBlock(
            config.embed_dim,
            window_size=config.block_window(index),
            rel_pos=self.patch_embed.grid_size if config.use_rel_pos else None,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            qk_norm=config.qk_norm,
            init_values=config.init_values,
            norm_eps=config.norm_eps,
            proj_drop=config.proj_drop_rate,
            attn_drop=config.attn_drop_rate,
            drop_path=drop_path,
        )

    # -- timm's model API ---------------------------------------------------------------------

    @property
    def timm_classifier(self) -> str:
        return "head.fc"

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups: the embedding stem, then each block."""
        return {
            "stem": r"^pos_embed|patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"} if self.pos_embed is not None else set()

    def _reset_pool(self, global_pool: str) -> None:
        self.global_pool = global_pool
        self.config = self.config.replace(global_pool=global_pool)

    def _new_head(self, num_classes: int) -> nn.Module:
        return SamHead(self.num_features, num_classes, self.global_pool, self.config.drop_rate)

    def _prune_norm(self) -> None:
        """Drop the neck, which timm counts as the final norm; the head then reads the blocks'
        channels, so it is rebuilt too."""
        self.neck = nn.Identity()
        self.num_features = self.embed_dim
        self._prune_head()

    def _prune_head(self) -> None:
        self.reset_classifier(0, "none")

    def set_input_size(
        self, img_size: int | tuple[int, int], patch_size: int | None = None
    ) -> None:
        """Take another image (and patch) size as native from now on: the patch kernel
        PI-resized (FlexiViT), the position map resampled (bicubic); the relative-position
        tables are interpolated at each forward pass, as timm's."""
        self._resize_patch_embed(img_size, patch_size)
        if self.pos_embed is not None:
            table = self.position_map(self.patch_embed.grid_size).detach()
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)

    # -- forward ------------------------------------------------------------------------------

    def position_map(self, grid: tuple[int, int]) -> Tensor:
        """The absolute position map (1, h, w, D) of a patch grid, resampled (bicubic,
        antialiased: timm's `resample_abs_pos_embed_nhwc`) from the native one."""
        assert self.pos_embed is not None
        _, rows, cols, dim = self.pos_embed.shape
        if (rows, cols) == tuple(grid):
            return self.pos_embed
        flat = self.pos_embed.reshape(1, rows * cols, dim)  # (1, h * w, D)
        flat = resample_pos_embed(flat, grid, (rows, cols), num_prefix_tokens=0)
        return flat.reshape(1, grid[0], grid[1], dim)  # (1, h', w', D)

    def embed(self, x: Tensor) -> Tensor:
        """Images (B, C, H, W) -> maps (B, H/p, W/p, D) through `norm_pre`."""
        tokens, grid = self.patch_embed(x)  # (B, N, D)
        x = tokens.reshape(tokens.shape[0], grid[0], grid[1], -1)  # (B, H/p, W/p, D)
        if self.pos_embed is not None:
            x = x + self.position_map(grid)
        return self.norm_pre(self.pos_drop(x))

    def _run(self, block: nn.Module, x: Tensor) -> Tensor:
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return block(x)

    def forward_features(self, x: Tensor) -> Tensor:
        """The neck's map (B, C', H/p, W/p)."""
        x = self.embed(x)
        for block in self.blocks:
            x = self._run(block, x)  # (B, H/p, W/p, D)
        return self.neck(x.permute(0, 3, 1, 2))  # (B, C', H/p, W/p)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """The neck's map -> logits (B, num_classes), or the pooled features."""
        return self.head(x, pre_logits=pre_logits)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        stop_early: bool = False,
    ) -> tuple[Tensor, list[Tensor]] | list[Tensor]:
        """The maps (B, D, H/p, W/p) of the blocks in `indices` (None: all, n: the last n), in
        block order, as timm's; `norm` runs each through the neck (timm's final norm), so they
        have its channels. Returns `(forward_features(x), maps)`, or the maps alone."""
        if output_fmt != "NCHW":
            raise ValueError(
                f"a SAM ViT's intermediates are maps: output_fmt='NCHW', not {output_fmt!r}"
            )
        take = set(take_indices(len(self.blocks), indices))
        blocks = list(self.blocks)
        if stop_early:
            blocks = blocks[: max(take) + 1]
        x = self.embed(x)
        maps = []
        for i, block in enumerate(blocks):
            x = self._run(block, x)  # (B, H/p, W/p, D)
            if i in take:
                out = x.permute(0, 3, 1, 2)  # (B, D, H/p, W/p)
                maps.append(self.neck(out) if norm else out)
        if intermediates_only:
            return maps
        return self.neck(x.permute(0, 3, 1, 2)), maps
