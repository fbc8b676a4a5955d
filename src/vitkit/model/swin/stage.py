"""A Swin stage: patch merging (at the start of every stage but the first, as timm), then
blocks that alternate regular and shifted windows.

Liu et al., "Swin Transformer" (ICCV 2021), Section 3.1-3.2 and Fig. 3: a block is the ViT's
pre-norm block with window attention; every second block shifts the windows by half a window
(a cyclic roll, undone afterwards). Swin V2 (CVPR 2022, Section 3.1) moves each norm after its
branch (res-post-norm) and the patch merging's norm after its projection. The MLP, stochastic
depth and the norms are vitkit's ViT layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from ..layers import DropPath, Mlp
from .attention import CosineWindowAttention, WindowAttention
from .window import (
    clamp_window,
    shift_mask,
    torchvision_shift,
    window_partition,
    window_reverse,
)


class SwinBlock(nn.Module):
    """Window attention and MLP on a map (B, H, W, C), each in a residual branch; pre-norm
    (version 1) or res-post-norm (version 2).

    Args:
        dim: channels C.
        num_heads: attention heads.
        resolution: the map (H, W) at the model's img_size: a window no smaller than it is
            clamped and not shifted (unless `always_partition`).
        window: the configured window side.
        shift: whether this block shifts its windows (by half a window).
        version: 1 or 2 (`SwinConfig.version`).
        dynamic_mask: build the shift mask per input (other input sizes) instead of once.
        pretrained_window: version 2's pre-training window (0: none).
        options: `mlp_ratio`, `qkv_bias`, `proj_drop`, `attn_drop`, `drop_path`,
            `act_layer`, `norm_eps`, `always_partition`, `windows_like`.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        resolution: tuple[int, int],
        window: int,
        shift: bool,
        version: int = 1,
        dynamic_mask: bool = False,
        pretrained_window: int = 0,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: str = "gelu",
        norm_eps: float = 1e-5,
        always_partition: bool = False,
        windows_like: str = "timm",
    ) -> None:
        super().__init__()
        self.input_resolution = resolution
        self.res_post_norm = version == 2
        self.dynamic_mask = dynamic_mask
        self.pad_first = windows_like != "timm"  # HF, torchvision: pad, then roll
        half = (window // 2, window // 2) if shift else (0, 0)
        # torchvision decides the shift per input (a dynamic model's maps change)
        self.per_input_shift = half if windows_like == "torchvision" and dynamic_mask else None
        self.window_size, self.shift_size = clamp_window(
            resolution, (window, window), half, always_partition, windows_like
        )
        attention = dict(
            num_heads=num_heads,
            window=self.window_size,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
        )
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        if version == 2:
            pretrained = (pretrained_window, pretrained_window)
            self.attn = CosineWindowAttention(dim, pretrained_window=pretrained, **attention)
        else:
            self.attn = WindowAttention(dim, **attention)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, act_layer=act_layer)
        self.drop_path2 = DropPath(drop_path)
        mask = None
        if any(self.shift_size) and not dynamic_mask:
            padded = [-(-side // w) * w for side, w in zip(resolution, self.window_size)]
            mask = shift_mask(*padded, self.window_size, self.shift_size)
        self.register_buffer("attn_mask", mask, persistent=False)

    def window_attention(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, H, W, C): roll by the shift, pad to whole windows, attend within
        each window, then put the windows back, crop and roll back (`pad_first`: pad, then
        roll; roll back, then crop)."""
        return self.attend(x, False)[0]

    def attend(self, x: Tensor, with_weights: bool) -> tuple[Tensor, Tensor | None]:
        """`window_attention`, and with `with_weights` the attention weights of its windows
        (B * nW, heads, N, N), written out (the fused path returns none)."""
        _, height, width, chans = x.shape
        wh, ww = self.window_size
        shift = self.shift_size
        if self.per_input_shift is not None:
            shift = torchvision_shift((height, width), self.window_size, self.per_input_shift)
        shifted = shift[0] > 0 or shift[1] > 0
        if shifted and not self.pad_first:
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        x = F.pad(x, (0, 0, 0, -width % ww, 0, -height % wh))  # (B, Hp, Wp, C)
        if shifted and self.pad_first:
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        padded_h, padded_w = x.shape[1], x.shape[2]
        mask = self.attn_mask
        if torch.jit.is_scripting():  # the mask is Python-side: a scripted Swin needs it built
            if shifted and self.dynamic_mask:
                raise ValueError(
                    "a TorchScript Swin needs its shift masks built: script a model built "
                    "without dynamic_img_size"
                )
        elif shifted and self.dynamic_mask:
            mask = shift_mask(
                padded_h, padded_w, self.window_size, shift, device=x.device, dtype=x.dtype
            )
        windows = window_partition(x, self.window_size)  # (B * nW, wh * ww, C)
        weights: Tensor | None = None
        if with_weights:
            windows, weights = self.attn.forward_with_weights(windows, mask)
        else:
            windows = self.attn(windows, mask)  # (B * nW, wh * ww, C)
        x = window_reverse(windows, self.window_size, padded_h, padded_w)  # (B, Hp, Wp, C)
        if shifted and self.pad_first:
            x = torch.roll(x, shifts=shift, dims=(1, 2))
        x = x[:, :height, :width, :]  # (B, H, W, C)
        if shifted and not self.pad_first:
            x = torch.roll(x, shifts=shift, dims=(1, 2))
        return x, weights

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x, False)[0]

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights (B * nW, heads, N, N)."""
        x, weights = self.run(x, True)
        assert weights is not None
        return x, weights

    def run(self, x: Tensor, with_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The block on a map (B, H, W, C), and its attention weights if `with_weights`."""
        if self.res_post_norm:
            attended, weights = self.attend(x, with_weights)
            x = x + self.drop_path1(self.norm1(attended))
            return x + self.drop_path2(self.norm2(self.mlp(x))), weights
        attended, weights = self.attend(self.norm1(x), with_weights)
        x = x + self.drop_path1(attended)
        return x + self.drop_path2(self.mlp(self.norm2(x))), weights


class PatchMerging(nn.Module):
    """Each 2x2 group of neighbours concatenated (4C) and projected to `out_dim` (2C): halves
    the map (padding an odd side), as a strided convolution would. Norm before the projection
    (version 1) or after it (version 2)."""

    def __init__(self, dim: int, out_dim: int, *, post_norm: bool = False, eps: float = 1e-5):
        super().__init__()
        self.post_norm = post_norm
        self.norm = nn.LayerNorm(out_dim if post_norm else 4 * dim, eps=eps)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), out_dim)."""
        batch, height, width, chans = x.shape
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))  # (B, H', W', C), even sides
        height, width = x.shape[1], x.shape[2]
        x = x.reshape(batch, height // 2, 2, width // 2, 2, chans)  # (B, H/2, 2, W/2, 2, C)
        # (B, H/2, W/2, 2 cols, 2 rows, C) -> (B, H/2, W/2, 4C): timm's order x0, x1, x2, x3
        x = x.permute(0, 1, 3, 4, 2, 5).flatten(3)
        if self.post_norm:
            return self.norm(self.reduction(x))
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """Patch merging (or none, for the first stage) then `blocks`, even ones regular and odd
    ones shifted; checkpointed block by block when `grad_checkpointing` and training."""

    def __init__(self, downsample: nn.Module, blocks: list[SwinBlock]) -> None:
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.Sequential(*blocks)
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        x = self.downsample(x)
        if not torch.jit.is_scripting():  # TorchScript has no activation checkpointing
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                for block in self.blocks:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                return x
        return self.blocks(x)
