"""The Swin Transformer: a hierarchical ViT whose attention runs inside local windows.

Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows" (ICCV
2021); version 2 is Liu et al., "Swin Transformer V2: Scaling Up Capacity and Resolution"
(CVPR 2022). Semantics, names and layouts are timm's (`swin_transformer.py`,
`swin_transformer_v2.py`), so timm's state dicts load key for key.

    image (B, C, H, W)
      -> patch embedding + LayerNorm   (B, H/4, W/4, D)      the ViT's PatchEmbed, as a map
      -> stage 0: blocks               (B, H/4, W/4, D)      windows of w x w tokens, every
      -> stage 1: merge 2x2, blocks    (B, H/8, W/8, 2D)     second block shifted by w/2
      -> stage 2: merge 2x2, blocks    (B, H/16, W/16, 4D)
      -> stage 3: merge 2x2, blocks    (B, H/32, W/32, 8D)
      -> LayerNorm                     (B, H/32, W/32, 8D)   forward_features (NHWC, as timm)
      -> pool over H, W, head          (B, num_classes)      forward_head
"""

# No `from __future__ import annotations` here: torch.fx copies `forward`'s annotations into the
# code it generates, where TorchScript cannot read them as strings (fx, then torch.jit.script).
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..intermediates import take_indices
from ..layers import PatchEmbed
from ..layers.patch_embed import to_2tuple
from ..layers.weight_init import trunc_normal_
from ..stages import FlowSpec
from ..timm_cfg import IMAGENET_MEAN, IMAGENET_STD, TimmPretrainedCfg
from .attention import CosineWindowAttention, WindowAttention
from .config import SwinConfig
from .flow import describe_swin
from .stage import PatchMerging, SwinBlock, SwinStage
from .window import (
    clamp_window,
    log_spaced_offsets,
    relative_position_index,
    resize_rel_pos_bias_table,
    shift_mask,
)


class SwinHead(nn.Module):
    """Pooling over the map (B, H, W, C) -> (B, C), dropout and the classifier `fc` (timm's
    `ClassifierHead` with NHWC input); with global_pool='none' the classifier sees every
    position, (B, H, W, num_classes)."""

    def __init__(self, dim: int, num_classes: int, *, global_pool: str, drop: float) -> None:
        super().__init__()
        self.global_pool = global_pool
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def pool(self, x: Tensor) -> Tensor:
        if self.global_pool == "avg":
            return x.mean(dim=(1, 2))
        if self.global_pool == "max":
            return x.amax(dim=(1, 2))
        if self.global_pool == "avgmax":
            return 0.5 * (x.mean(dim=(1, 2)) + x.amax(dim=(1, 2)))
        return x

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.drop(self.pool(x))
        return x if pre_logits else self.fc(x)


class SwinTransformer(TimmPretrainedCfg, nn.Module):
    """Swin V1 or V2: `SwinTransformer(**options)` or `SwinTransformer(SwinConfig(...))`.

    Keys follow timm's (`patch_embed.proj`, `layers.N.downsample`, `layers.N.blocks.M.attn`,
    `norm`, `head.fc`); `forward_features` returns the normed last map in NHWC, as timm's.
    """

    # Python-side only (it reads `config`): TorchScript compiles properties otherwise.
    __jit_unused_properties__ = ["pretrained_cfg", "default_cfg", "timm_classifier"]
    TIMM_MEAN, TIMM_STD = IMAGENET_MEAN, IMAGENET_STD

    def __init__(self, config: SwinConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        if config is None:
            config = SwinConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        self.config = config
        self.num_classes = config.num_classes
        self.global_pool = config.global_pool
        self.embed_dim = config.embed_dim
        self.num_features = self.head_hidden_size = config.num_features
        self.img_pad = config.patch_size if config.dynamic_img_pad else 0
        self.patch_embed = swin_patch_embed(config, config.img_size)
        self.layers = nn.Sequential(*[_build_stage(config, i) for i in range(config.num_stages)])
        self.norm = nn.LayerNorm(config.num_features, eps=config.norm_eps)
        self.head = SwinHead(
            config.num_features,
            config.num_classes,
            global_pool=config.global_pool,
            drop=config.drop_rate,
        )
        self.feature_info = [
            {"num_chs": dim, "reduction": config.patch_size * 2**i, "module": f"layers.{i}"}
            for i, dim in enumerate(config.stage_dims)
        ]
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self.output_fmt = "NHWC"  # of forward_features, as timm's (its tests read it)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's init: trunc-normal(0.02) Linear weights and the V1 bias tables, zero biases,
        unit LayerNorms; V2's logit scale log(10) and zero q / v biases; V2's block norms
        start at zero (timm's `_init_respostnorm`), so each block starts as the identity."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, CosineWindowAttention):
                module.logit_scale.fill_(math.log(10.0))
                for bias in (module.q_bias, module.v_bias):
                    if bias is not None:
                        bias.zero_()
            elif isinstance(module, WindowAttention):
                trunc_normal_(module.relative_position_bias_table)
        for module in self.modules():  # after the LayerNorms' ones, which visit later
            if isinstance(module, SwinBlock) and module.res_post_norm:
                for norm in (module.norm1, module.norm2):
                    nn.init.zeros_(norm.weight)
                    nn.init.zeros_(norm.bias)

    # -- timm's model API -------------------------------------------------------------------

    @property
    def timm_classifier(self) -> str:
        return "head.fc"

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups: the patch embedding, each stage's patch merging with the block
        before it, each block, the final norm last."""
        if coarse:
            return {"stem": r"^patch_embed", "blocks": r"^layers\.(\d+)"}
        return {
            "stem": r"^patch_embed",
            "blocks": [
                (r"^layers\.(\d+).downsample", (0,)),
                (r"^layers\.(\d+)\.\w+\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        }

    def no_weight_decay(self) -> set[str]:
        """timm's: the V1 bias tables; V2's position-bias MLP and logit scales."""
        keys = ("relative_position_bias_table", "cpb_mlp", "logit_scale")
        return {name for name, _ in self.named_parameters() if any(k in name for k in keys)}

    def prune_intermediate_layers(
        self,
        indices: int | list[int] | tuple[int, ...] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the stages after the last of `indices` for a backbone that only reads stage
        maps, as timm's: the final norm goes with them (it is sized for the last stage) or
        when `prune_norm`, the head when `prune_head` or with them; returns the kept stage
        indices. `config` keeps the stages left (depths, heads, windows)."""
        take = take_indices(len(self.layers), indices)
        kept = max(take) + 1
        cut = kept < len(self.layers)
        self.layers = self.layers[:kept]
        if prune_norm or cut:
            self.norm = nn.Identity()  # type: ignore[assignment]
        if cut:
            self.num_features = self.head_hidden_size = self.feature_info[kept - 1]["num_chs"]
            per_stage = {}
            for name in ("window_size", "pretrained_window_sizes"):
                value = getattr(self.config, name)
                if isinstance(value, tuple) and len(value) > 1:
                    per_stage[name] = value[:kept]
            self.config = self.config.replace(
                depths=self.config.depths[:kept],
                num_heads=self.config.num_heads[:kept],
                **per_stage,
            )
        if prune_head or cut:
            self.reset_classifier(0, "none")
        return take

    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        window_size: int | tuple[int, ...] | None = None,
        always_partition: bool | None = None,
    ) -> None:
        """Take another image size and / or window size from now on, as timm's: without
        `window_size` each stage's window scales with the patch grid (keeping its window to
        map ratio; the same size is a no-op); windows no smaller than a map are clamped and
        not shifted as at construction; V1 bias tables are resized (`resize_rel_pos_bias_table`),
        V2's coordinate tables recomputed, the shift masks rebuilt. `window_size` is one side
        for every stage or one per stage; vitkit's windows are square, so a scaled window that
        is not (another aspect ratio) is refused: pass `window_size`."""
        config = self.config
        size = config.img_size if img_size is None else img_size
        new = config.replace(
            img_size=size,
            always_partition=config.always_partition
            if always_partition is None
            else always_partition,
        )
        windows = self._scaled_windows(new.grid_size, window_size)
        new = new.replace(window_size=windows[0] if len(set(windows)) == 1 else windows)
        if window_size is not None or not hasattr(self, "_window_reference"):
            reference = (config.windows, config.grid_size) if window_size is None else None
            self._window_reference = reference or (windows, new.grid_size)
        old = self.patch_embed
        self.patch_embed = swin_patch_embed(config, size)
        self.patch_embed.load_state_dict(old.state_dict())
        self.patch_embed.to(old.proj.weight.device).train(old.training)
        for index, stage in enumerate(self.layers):
            for position, block in enumerate(stage.blocks):
                _resize_block(
                    block,
                    new.stage_resolution(index),
                    new.windows[index],
                    shift=position % 2 == 1,
                    always=new.always_partition,
                    rule=new.windows_like,
                )
        self.config = new

    def _scaled_windows(
        self, grid: tuple[int, int], window_size: int | tuple[int, ...] | None
    ) -> tuple[int, ...]:
        """The window side of each stage for a new patch grid: `window_size` as given (timm
        reads a pair as (h, w) for every stage), else the reference windows scaled by
        the grid, as timm's `calc_stage_window_sizes`."""
        stages = self.config.num_stages
        if window_size is not None:
            if isinstance(window_size, int):
                return (window_size,) * stages
            if len(window_size) == 2 and stages != 2 or len(window_size) == 1:
                window_size = (window_size[0],) * stages if len(set(window_size)) == 1 else ()
            if len(window_size) != stages:
                raise ValueError(
                    f"window_size {window_size!r}: give one side for every stage or one per "
                    f"stage ({stages}); vitkit's windows are square"
                )
            return tuple(window_size)
        windows, ref_grid = getattr(
            self, "_window_reference", (self.config.windows, self.config.grid_size)
        )
        scaled = []
        for window in windows:
            sides = {max(1, window * g // r) for g, r in zip(grid, ref_grid)}
            if len(sides) > 1:
                raise ValueError(
                    f"an image of {grid[0]}x{grid[1]} patches scales the {window}-wide windows "
                    f"to {sorted(sides)} per side, and vitkit's windows are square; pass "
                    "window_size=N"
                )
            scaled.append(sides.pop())
        return tuple(scaled)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass: less activation memory, same gradients."""
        for stage in self.layers:
            stage.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier for `num_classes` (0: none), and another pooling if given (timm's
        '' is 'none')."""
        if global_pool == "":
            global_pool = "none"
        pool = self.global_pool if global_pool is None else global_pool
        self.config = self.config.replace(num_classes=num_classes, global_pool=pool)
        self.num_classes, self.global_pool = num_classes, pool
        device = self.patch_embed.proj.weight.device
        head = SwinHead(
            self.num_features, num_classes, global_pool=pool, drop=self.config.drop_rate
        )
        if isinstance(head.fc, nn.Linear):
            trunc_normal_(head.fc.weight)
            nn.init.zeros_(head.fc.bias)
        self.head = head.to(device).train(self.training)

    def describe_flow(self, input_size: tuple[int, ...]) -> FlowSpec:
        """The forward pass for an input of `input_size` (B, C, H, W), stage by stage, for
        `vitkit.summary.flow` to measure (flow.py)."""
        return describe_swin(self, input_size)

    # -- forward ----------------------------------------------------------------------------

    def embed(self, x: Tensor) -> Tensor:
        """Images (B, C, H, W) -> the patch map (B, H/p, W/p, D), normed; with
        `dynamic_img_pad` the image is first padded right and bottom to whole patches (HF's
        `maybe_pad`)."""
        if self.img_pad:
            pad = self.img_pad
            x = F.pad(x, (0, -x.shape[-1] % pad, 0, -x.shape[-2] % pad))  # (B, C, Hp, Wp)
        tokens, grid = self.patch_embed(x)  # (B, N, D)
        return tokens.reshape(tokens.shape[0], grid[0], grid[1], -1)  # (B, H/p, W/p, D)

    def forward_features(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[list[Tensor]]]:
        """The last stage's map after the final norm, (B, H/32, W/32, 8D) (NHWC, as timm); with
        `return_attention`, also the attention weights (`features_with_attention`)."""
        if not torch.jit.is_scripting():  # TorchScript compiles the plain path only
            if return_attention:
                return self.features_with_attention(x)
        elif return_attention:
            raise ValueError("return_attention=True needs the eager model, not TorchScript")
        return self.norm(self.layers(self.embed(x)))

    def features_with_attention(self, x: Tensor) -> tuple[Tensor, list[list[Tensor]]]:
        """`forward_features` and the attention weights of every block, per stage a list
        per block of (B * nW, heads, N, N): nW the windows of the stage's map padded to whole
        windows, in timm's order (row-major, of the shifted map in odd blocks), N the tokens
        of a window. Hugging Face's `output_attentions=True` returns the last block of each
        stage: `[stage[-1] for stage in attentions]`. Written out, not fused."""
        x = self.embed(x)
        attentions: list[list[Tensor]] = []
        for stage in self.layers:
            x = stage.downsample(x)
            weights: list[Tensor] = []
            for block in stage.blocks:
                x, block_weights = block.forward_with_weights(x)
                weights.append(block_weights)
            attentions.append(weights)
        return self.norm(x), attentions

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """A map (B, h, w, C) -> logits (B, num_classes), or the pooled (B, C) features."""
        return self.head(x, pre_logits=pre_logits)

    def forward(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[list[Tensor]]]:
        """Logits (B, num_classes); with `return_attention`, also every block's attention
        weights, per stage (`features_with_attention`)."""
        if not torch.jit.is_scripting():  # TorchScript compiles the plain path only
            if isinstance(return_attention, torch.fx.Proxy):
                return_attention = False  # torch.fx makes every argument a proxy: trace logits
            if return_attention:
                features, attentions = self.features_with_attention(x)
                return self.forward_head(features), attentions
        elif return_attention:
            raise ValueError("return_attention=True needs the eager model, not TorchScript")
        return self.forward_head(self.norm(self.layers(self.embed(x))))

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
        """The output maps of chosen stages, as timm's: `indices` None (all), an int n (the
        last n) or stage indices; `norm` applies the final norm to the last stage's map only
        (it is sized for it). Maps are (B, C_i, H_i, W_i) for 'NCHW', (B, H_i, W_i, C_i) for
        'NHWC', in the order asked. Returns `(forward_features(x), maps)`, or only the maps."""
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        if stop_early and not intermediates_only:
            raise ValueError("stop_early=True needs intermediates_only=True (no final features)")
        stages = list(self.layers)
        take = take_indices(len(stages), indices)
        if stop_early:
            stages = stages[: max(take) + 1]
        x = self.embed(x)
        outputs: dict[int, Tensor] = {}
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take:
                outputs[i] = self.norm(x) if norm and i == len(self.layers) - 1 else x
        maps = [outputs[i] for i in take]
        if output_fmt == "NCHW":
            maps = [m.permute(0, 3, 1, 2).contiguous() for m in maps]  # (B, C_i, H_i, W_i)
        if intermediates_only:
            return maps
        return self.norm(x), maps


def _build_stage(config: SwinConfig, index: int) -> SwinStage:
    """Stage `index`: patch merging from the previous width (none for stage 0), then its
    blocks, the stochastic depth rising linearly over all blocks of the model (timm's)."""
    dims = config.stage_dims
    first = sum(config.depths[:index])
    total = max(sum(config.depths) - 1, 1)
    downsample: nn.Module = nn.Identity()
    if index > 0:
        downsample = PatchMerging(
            dims[index - 1], dims[index], post_norm=config.version == 2, eps=config.norm_eps
        )
    blocks = [
        SwinBlock(
            dims[index],
            num_heads=config.num_heads[index],
            resolution=config.stage_resolution(index),
            window=config.windows[index],
            shift=depth % 2 == 1,
            version=config.version,
            dynamic_mask=config.dynamic_img_size,
            pretrained_window=config.pretrained_windows[index],
            mlp_ratio=config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            proj_drop=config.proj_drop_rate,
            attn_drop=config.attn_drop_rate,
            drop_path=config.drop_path_rate * (first + depth) / total,
            act_layer=config.act_layer,
            norm_eps=config.norm_eps,
            always_partition=config.always_partition,
            windows_like=config.windows_like,
        )
        for depth in range(config.depths[index])
    ]
    return SwinStage(downsample, blocks)


def swin_patch_embed(config: SwinConfig, img_size: int | tuple[int, int]) -> PatchEmbed:
    """The patch embedding (the ViT's convolution, then a LayerNorm; V2-cr's too) at
    `img_size`; with `dynamic_img_pad`, at the size padded to whole patches (`embed` pads the
    image first)."""
    patch, sides = config.patch_size, to_2tuple(img_size, "img_size")
    if config.dynamic_img_pad:
        img_size = tuple(-(-side // patch) * patch for side in sides)
    elif any(side % patch for side in sides):
        raise ValueError(
            f"img_size {img_size} is not a multiple of the patch size {patch}; use a multiple "
            f"of {patch}, or pass dynamic_img_pad=True to pad the image to whole patches (as "
            "Hugging Face's Swin does)"
        )
    return PatchEmbed(
        img_size=img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        embed_dim=config.embed_dim,
        norm=True,
        norm_eps=config.norm_eps,
        dynamic_img_size=config.dynamic_img_size,
    )


@torch.no_grad()
def _resize_block(
    block: SwinBlock,
    resolution: tuple[int, int],
    window: int,
    *,
    shift: bool,
    always: bool,
    rule: str = "timm",
) -> None:
    """A block for another map and window, as timm's `set_input_size`: the window clamped to
    the map, the V1 bias table resized (V2's coordinates recomputed for the pre-training
    window), the index and the shift mask rebuilt."""
    half = (window // 2, window // 2) if shift else (0, 0)
    used, shifts = clamp_window(resolution, (window, window), half, always, rule)
    block.input_resolution = resolution
    block.shift_size = shifts
    if block.per_input_shift is not None:
        block.per_input_shift = half
    attn = block.attn
    if used != block.window_size:
        device = attn.proj.weight.device
        if isinstance(attn, CosineWindowAttention):
            table = log_spaced_offsets(used, attn.pretrained_window_size)
            attn.relative_coords_table = table.to(device)
        else:
            old = attn.relative_position_bias_table
            attn.relative_position_bias_table = nn.Parameter(
                resize_rel_pos_bias_table(old.detach(), used), requires_grad=old.requires_grad
            )
        attn.relative_position_index = relative_position_index(used, device=device)
        attn.window_size = block.window_size = used
    mask = None
    if any(shifts) and not block.dynamic_mask:
        padded = [-(-side // w) * w for side, w in zip(resolution, used)]
        mask = shift_mask(*padded, used, shifts, device=block.norm1.weight.device)
    block.attn_mask = mask
