"""Swin V2-cr: timm's `swin_transformer_v2_cr.py` (Christoph Reich's re-implementation of Liu
et al., "Swin Transformer V2: Scaling Up Capacity and Resolution", CVPR 2022), beside vitkit's
Swin V1 / V2, with timm's names so its state dicts load key for key.

What differs from timm's V2 (`swin.py` with version 2):
- the position bias is a meta network (2 -> 384 -> heads, ReLU, dropout 0.125) over the
  offsets sign(d) * ln(1 + |d|) of every pair of tokens, unscaled and without 16 * sigmoid;
- the logit scale is one per head, `(heads,)`; the qkv projection has a full bias;
- the patch merging normalises before its projection (as V1); there is no final norm: the
  last block of the last stage (and of every stage for 'ns', every 6th for huge / giant)
  ends with a main-branch norm, `norm3`;
- each stage's window is the patch grid divided by `window_ratio` (8) unless given;
- the stages are `stages.N`, `forward_features` returns NCHW (B, 8D, H/32, W/32).
The windows, shift mask, patch merging, stage, MLP and stochastic depth are vitkit's Swin's.
"""

# No `from __future__ import annotations` here: torch.fx copies `forward`'s annotations into the
# code it generates, where TorchScript cannot read them as strings (fx, then torch.jit.script).
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import DropPath, Mlp
from ..layers.patch_embed import to_2tuple
from .attention import WindowAttention
from .cr_config import SwinCrConfig
from .stage import PatchMerging, SwinBlock, SwinStage
from .swin import SwinHead, SwinTransformer, swin_patch_embed
from .window import clamp_window, shift_mask

META_HIDDEN = 384  # timm's width of the position-bias meta network
META_DROP = 0.125  # timm's dropout after its activation


def log_relative_coords(window: tuple[int, int]) -> Tensor:
    """(N * N, 2) offsets (dy, dx) of every pair of tokens of a window, N = wh * ww, as
    sign(d) * ln(1 + |d|) (timm's `relative_coordinates_log`)."""
    rows, cols = torch.meshgrid(
        torch.arange(window[0], dtype=torch.float32),
        torch.arange(window[1], dtype=torch.float32),
        indexing="ij",
    )
    coords = torch.stack((rows.flatten(), cols.flatten()))  # (2, N)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    offsets = offsets.permute(1, 2, 0).reshape(-1, 2)  # (N * N, 2)
    return torch.sign(offsets) * torch.log1p(offsets.abs())


class MetaMlp(nn.Module):
    """The position-bias meta network: Linear(2, hidden) -> ReLU -> Dropout -> Linear(hidden,
    heads). The ViT's `Mlp` maps a width to itself; this one changes it, so it is its own."""

    def __init__(self, heads: int, *, hidden: int = META_HIDDEN, drop: float = META_DROP):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.act = nn.ReLU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, heads)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop1(self.act(self.fc1(x))))


class CrWindowAttention(WindowAttention):
    """Cosine attention in windows with a per-head logit scale (clamped at log 100) and the
    meta network's position bias; q, k and v come from one biased projection (the ViT's)."""

    fused_attn = False  # written out, as version 2 (`CosineWindowAttention`): a per-head scale

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        window: tuple[int, int],
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.window_size = window
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.meta_mlp = MetaMlp(num_heads)
        self.logit_scale = nn.Parameter(torch.full((num_heads,), math.log(10.0)))
        coords = log_relative_coords(window)
        self.register_buffer("relative_coordinates_log", coords, persistent=False)

    def position_bias(self) -> Tensor:
        """The meta network's bias of every pair of tokens, (1, heads, N, N)."""
        area = self.window_size[0] * self.window_size[1]
        bias = self.meta_mlp(self.relative_coordinates_log)  # (N * N, heads)
        return bias.transpose(1, 0).reshape(self.num_heads, area, area).unsqueeze(0)

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """Cosine similarity times the per-head scale, clamped at 100, (B * nW, heads, N, N)."""
        cosine = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        scale = self.logit_scale.reshape(1, -1, 1, 1)  # (1, heads, 1, 1)
        return cosine * torch.clamp(scale, max=self.logit_scale_max).exp()


class CrBlock(SwinBlock):
    """x + norm1(attention(x)), x + norm2(MLP(x)), then `norm3` on the main branch where the
    config puts one (else the identity). The windows, shift and mask are `SwinBlock`'s.

    Args:
        dim: channels C.
        num_heads: attention heads.
        resolution: the map (H, W) at the model's img_size (clamps the window).
        window: the configured (h, w) window.
        shift: whether this block shifts its windows (by half a window).
        extra_norm: end with the main-branch norm `norm3`.
        config: the model's `SwinCrConfig` (ratios, drops, eps, init_values, ...).
        drop_path: this block's stochastic depth.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        resolution: tuple[int, int],
        window: tuple[int, int],
        shift: bool,
        extra_norm: bool,
        config: SwinCrConfig,
        drop_path: float = 0.0,
    ) -> None:
        nn.Module.__init__(self)
        self.input_resolution = resolution
        self.res_post_norm = True
        self.dynamic_mask = config.dynamic_img_size
        self.pad_first, self.per_input_shift = False, None  # timm's windowing only
        half = (window[0] // 2, window[1] // 2) if shift else (0, 0)
        self.window_size, self.shift_size = clamp_window(
            resolution, window, half, config.always_partition
        )
        eps = config.norm_eps
        self.attn = CrWindowAttention(
            dim,
            num_heads=num_heads,
            window=self.window_size,
            attn_drop=config.attn_drop_rate,
            proj_drop=config.proj_drop_rate,
        )
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.drop_path1 = DropPath(drop_path)
        self.mlp = Mlp(
            dim, int(dim * config.mlp_ratio), drop=config.proj_drop_rate, act_layer=config.act_layer
        )
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.drop_path2 = DropPath(drop_path)
        self.norm3 = nn.LayerNorm(dim, eps=eps) if extra_norm else nn.Identity()
        mask = None
        if any(self.shift_size) and not self.dynamic_mask:
            padded = [-(-side // w) * w for side, w in zip(resolution, self.window_size)]
            mask = shift_mask(*padded, self.window_size, self.shift_size)
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.norm1(self.window_attention(x)))
        x = x + self.drop_path2(self.norm2(self.mlp(x)))
        return self.norm3(x)


class SwinTransformerV2Cr(SwinTransformer):
    """timm's `SwinTransformerV2Cr`: `SwinTransformerV2Cr(**options)` or
    `SwinTransformerV2Cr(SwinCrConfig(...))`. A `SwinTransformer` for every path that takes
    one; what differs (no final norm, `stages`, NCHW features) is overridden here.

    Keys follow timm's (`patch_embed.proj`, `stages.N.downsample`, `stages.N.blocks.M.attn`,
    `...attn.meta_mlp`, `...norm3`, `head.fc`).
    """

    # Python-side only: TorchScript compiles properties otherwise (`layers` is `stages`).
    __jit_unused_properties__ = ["pretrained_cfg", "default_cfg", "timm_classifier", "layers"]
    describe_flow = None  # no stage walk: the Swin's does not know the meta-MLP bias or norm3

    def __init__(self, config: SwinCrConfig | None = None, /, **options: Any) -> None:
        nn.Module.__init__(self)
        if config is None:
            config = SwinCrConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        if config.dynamic_img_pad or config.windows_like != "timm":
            raise ValueError(
                "the Swin V2-cr embeds and windows as timm's only; drop dynamic_img_pad and "
                "windows_like"
            )
        self.config = config
        self.img_pad = 0  # `embed` pads nothing
        self.num_classes = config.num_classes
        self.global_pool = config.global_pool
        self.embed_dim = config.embed_dim
        self.num_features = self.head_hidden_size = config.num_features
        self.patch_embed = swin_patch_embed(config, config.img_size)
        self.stages = nn.Sequential(*[_build_stage(config, i) for i in range(config.num_stages)])
        self.norm = nn.Identity()  # none in cr: the identity, for the methods that apply one
        self.head = SwinHead(
            config.num_features,
            config.num_classes,
            global_pool=config.global_pool,
            drop=config.drop_rate,
        )
        self.feature_info = [
            {"num_chs": dim, "reduction": config.patch_size * 2**i, "module": f"stages.{i}"}
            for i, dim in enumerate(config.stage_dims)
        ]
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self.output_fmt = "NCHW"  # of forward_features, as timm's cr
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's default ('reset'): PyTorch's own init of Linear and LayerNorm, logit scales
        log(10), and each block's res-post norm scales at `init_values` (0: every block starts
        as the identity)."""
        for module in self.modules():
            if isinstance(module, CrWindowAttention):
                module.logit_scale.fill_(math.log(10.0))
            elif isinstance(module, CrBlock) and self.config.init_values is not None:
                module.norm1.weight.fill_(self.config.init_values)
                module.norm2.weight.fill_(self.config.init_values)

    @property
    def layers(self) -> nn.Sequential:
        """The stages, under the name `SwinTransformer`'s methods read."""
        return self.stages

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups: the patch embedding, each stage's patch merging with the block
        before it, each block (no final norm)."""
        if coarse:
            return {"stem": r"^patch_embed", "blocks": r"^stages\.(\d+)"}
        return {
            "stem": r"^patch_embed",
            "blocks": [(r"^stages\.(\d+).downsample", (0,)), (r"^stages\.(\d+)\.\w+\.(\d+)", None)],
        }

    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        window_size: int | tuple[int, ...] | None = None,
        window_ratio: int | tuple[int, ...] | None = None,
        always_partition: bool | None = None,
    ) -> None:
        """Take another image size, windows (one side for every stage or one per stage, or
        the grid divided by `window_ratio`) and / or `always_partition` from now on, as timm's
        cr: the parameters stay (the meta network reads any window), the windows, shifts,
        masks and offsets follow. Without windows, windows from the grid stay so (timm scales
        them with the grid: the same where the grid was a multiple of the ratio, as at every
        preset's size); given windows must be given again."""
        config = self.config
        new_size = (
            img_size is not None and to_2tuple(img_size, "img_size") != self.patch_embed.img_size
        )
        if new_size and window_size is None and window_ratio is None and config.window_size != 0:
            raise ValueError(
                f"this model has the windows {config.window_size!r}; pass window_size= (or "
                "window_ratio=) with a new img_size"
            )
        changes: dict[str, Any] = {}
        if img_size is not None:
            changes["img_size"] = img_size
        if window_size is not None:
            changes["window_size"] = window_size
        elif window_ratio is not None:
            changes.update(window_size=0, window_ratio=window_ratio)
        if always_partition is not None:
            changes["always_partition"] = always_partition
        config = config.replace(**changes)
        stem = swin_patch_embed(config, config.img_size)
        stages = nn.Sequential(*[_build_stage(config, i) for i in range(config.num_stages)])
        # the same Parameter objects move over (an optimizer holding them keeps them)
        stem.load_state_dict(self.patch_embed.state_dict(keep_vars=True), assign=True)
        stages.load_state_dict(self.stages.state_dict(keep_vars=True), assign=True)
        device = self.patch_embed.proj.weight.device
        self.patch_embed = stem.to(device).train(self.training)
        self.stages = stages.to(device).train(self.training)
        self.config = config

    def no_weight_decay(self) -> set[str]:
        """timm's cr names none (its optimizer factory still skips 1-d parameters)."""
        return set()

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier for `num_classes` (0: none), and another pooling if given."""
        if global_pool == "":
            global_pool = "none"
        pool = self.global_pool if global_pool is None else global_pool
        self.config = self.config.replace(num_classes=num_classes, global_pool=pool)
        self.num_classes, self.global_pool = num_classes, pool
        device = self.patch_embed.proj.weight.device
        head = SwinHead(
            self.num_features, num_classes, global_pool=pool, drop=self.config.drop_rate
        )
        self.head = head.to(device).train(self.training)

    def forward_features(self, x: Tensor) -> Tensor:
        """The last stage's map, (B, 8D, H/32, W/32) (NCHW, as timm's cr)."""
        return self.stages(self.embed(x)).permute(0, 3, 1, 2)  # (B, C, h, w)

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        """Logits (B, num_classes); the V2-cr's blocks return no attention weights."""
        return self.forward_head(self.forward_features(x))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """A map (B, C, h, w) -> logits (B, num_classes), or the pooled (B, C) features; with
        global_pool 'none' the map stays NCHW."""
        out = self.head(x.permute(0, 2, 3, 1), pre_logits=pre_logits)  # from (B, h, w, C)
        # asked of the head, not of `out`: torch.fx cannot branch on a traced tensor's ndim
        if self.head.global_pool == "none":
            return out.permute(0, 3, 1, 2)  # (B, C', h, w)
        return out

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
        """`SwinTransformer.forward_intermediates`, the final features NCHW as
        `forward_features`' (`norm` applies the identity: cr has no final norm, as timm's)."""
        out = super().forward_intermediates(
            x,
            indices,
            norm=norm,
            output_fmt=output_fmt,
            intermediates_only=intermediates_only,
            stop_early=stop_early,
        )
        if intermediates_only:
            return out
        final, maps = out
        return final.permute(0, 3, 1, 2), maps  # (B, C, h, w)


def _build_stage(config: SwinCrConfig, index: int) -> SwinStage:
    """Stage `index`: the pre-norm patch merging (none for stage 0), then its blocks, the
    stochastic depth rising linearly over all blocks of the model (timm's)."""
    dims = config.stage_dims
    first = sum(config.depths[:index])
    total = max(sum(config.depths) - 1, 1)
    downsample: nn.Module = nn.Identity()
    if index > 0:
        downsample = PatchMerging(dims[index - 1], dims[index], eps=config.norm_eps)
    blocks = [
        CrBlock(
            dims[index],
            num_heads=config.num_heads[index],
            resolution=config.stage_resolution(index),
            window=config.stage_windows[index],
            shift=depth % 2 == 1,
            extra_norm=config.extra_norm(index, depth),
            config=config,
            drop_path=config.drop_path_rate * (first + depth) / total,
        )
        for depth in range(config.depths[index])
    ]
    return SwinStage(downsample, blocks)
