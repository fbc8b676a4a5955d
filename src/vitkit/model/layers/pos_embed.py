"""Position embeddings: fixed tables and the one resampler used everywhere.

- 1-D sinusoid: Vaswani et al., "Attention Is All You Need" (2017), Section 3.5.
- 2-D sin-cos: Beyer et al., "Better plain ViT baselines for ImageNet-1k" (2022), as in
  big_vision's `posemb_sincos_2d`.
- Resampling a learned grid to another resolution: Dosovitskiy et al. (2021), Section 3.2,
  "2D interpolation of the pre-trained position embeddings".
- Resampling the patch embedding's kernel to another patch size: FlexiViT's PI-resize.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

POS_EMBED_KINDS = ("learn", "sinusoid", "sincos2d", "none")


def sinusoid_1d(num_positions: int, dim: int, temperature: float = 10000.0) -> Tensor:
    """PE[pos, 2i] = sin(pos / T^(2i/dim)), PE[pos, 2i+1] = cos(pos / T^(2i/dim)): (N, dim)."""
    if dim % 2:
        raise ValueError(f"pos_embed='sinusoid' needs an even embed_dim, got {dim}")
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (N, 1)
    inv_freq = temperature ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = position * inv_freq  # (N, dim/2)
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()
    return table.float()


def sincos_2d(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """big_vision's 2-D table: [sin(x w), cos(x w), sin(y w), cos(y w)] per patch: (h*w, dim).

    w_k = 1 / T^(k / (dim/4 - 1)) for k < dim/4; rows run over the grid in row-major order.
    """
    if dim % 4:
        raise ValueError(f"pos_embed='sincos2d' needs embed_dim divisible by 4, got {dim}")
    quarter = dim // 4
    y, x = torch.meshgrid(
        torch.arange(grid_size[0], dtype=torch.float64),
        torch.arange(grid_size[1], dtype=torch.float64),
        indexing="ij",
    )  # each (h, w)
    omega = torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1)
    omega = 1.0 / temperature**omega  # (dim/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (h*w, dim/4)
    x = x.flatten()[:, None] * omega[None, :]  # (h*w, dim/4)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()


def fixed_pos_embed(
    kind: str, grid_size: tuple[int, int], dim: int, num_prefix_tokens: int
) -> Tensor:
    """The fixed table for `kind` over prefix tokens + the patch grid: (1, prefix + h*w, dim).

    The sinusoid counts positions over the whole sequence (prefix tokens first); the 2-D table
    covers the patches and gives prefix tokens a zero embedding (as MAE does).
    """
    num_patches = grid_size[0] * grid_size[1]
    if kind == "sinusoid":
        table = sinusoid_1d(num_prefix_tokens + num_patches, dim)
    elif kind == "sincos2d":
        table = torch.cat([torch.zeros(num_prefix_tokens, dim), sincos_2d(grid_size, dim)])
    else:
        raise ValueError(
            f"no fixed table for pos_embed {kind!r}; expected 'sinusoid' or 'sincos2d'"
        )
    return table.unsqueeze(0)


def resample_pos_embed(
    pos_embed: Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
    align_corners: bool = False,
) -> Tensor:
    """Resample a (1, prefix + h*w, D) position embedding to a new patch grid.

    The grid part is interpolated in 2-D (bicubic by default, as timm's
    `resample_abs_pos_embed`); the class / distillation token embeddings are kept as they are.
    `old_size` defaults to a square grid.

    Args:
        pos_embed: the embedding, (1, prefix + old_h*old_w, D).
        new_size: the target grid (h, w).
        old_size: the source grid; inferred as square when None.
        num_prefix_tokens: leading tokens that are not on the grid.
        interpolation: a `F.interpolate` mode.
        antialias: antialias when shrinking.
        align_corners: `F.interpolate`'s corner alignment (torchvision's resampling sets it).
    """
    num_grid = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = math.isqrt(num_grid)
        if side * side != num_grid:
            raise ValueError(
                f"cannot infer the grid of a position embedding with {num_grid} patch positions; "
                "pass old_size=(h, w)"
            )
        old_size = (side, side)
    if old_size[0] * old_size[1] != num_grid:
        raise ValueError(
            f"position embedding has {num_grid} patch positions, not {old_size[0]}x{old_size[1]}; "
            "check old_size and num_prefix_tokens"
        )
    static = all(isinstance(side, int) for side in new_size)  # not symbolic (torch.export)
    if static and tuple(old_size) == tuple(new_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = pos_embed.shape[-1]
    grid = grid.float().reshape(1, old_size[0], old_size[1], dim)  # (1, h, w, D)
    grid = grid.permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(
        grid,
        size=tuple(new_size),
        mode=interpolation,
        antialias=antialias,
        align_corners=align_corners if interpolation in ("bilinear", "bicubic") else None,
    )
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos_embed.dtype)  # (1, h'*w', D)
    return torch.cat([prefix, grid], dim=1)


def resample_patch_embed(
    weight: Tensor, new_size: tuple[int, int], interpolation: str = "bicubic"
) -> Tensor:
    """A patch-embedding kernel (D, C, h, w) for another patch size: FlexiViT's PI-resize
    (Beyer et al. 2023, Section 3.4), as timm's `resample_patch_embed`.

    With B the linear map that resizes an h x w patch to the new size, the new kernel is
    pinv(B^T) applied to the old one, so that <resize(x), new kernel> = <x, old kernel>: the
    token of a resized patch equals the old token of the original patch (exactly when
    upsampling).
    """
    old_size = tuple(weight.shape[-2:])
    if old_size == tuple(new_size):
        return weight
    old_area = old_size[0] * old_size[1]
    basis = torch.eye(old_area, dtype=torch.float32)  # row i: the patch e_i, flattened
    basis = basis.reshape(old_area, 1, *old_size)  # (h*w, 1, h, w)
    resized = F.interpolate(basis, size=tuple(new_size), mode=interpolation, antialias=True)
    resize = resized.reshape(old_area, -1).double()  # (h*w, h'*w'): row i = resize(e_i)
    inverse = torch.linalg.pinv(resize)  # (h'*w', h*w): pinv(B^T)
    kernels = weight.double().reshape(-1, old_area)  # (D*C, h*w)
    new = kernels @ inverse.T  # (D*C, h'*w')
    return new.reshape(*weight.shape[:2], *new_size).to(weight.dtype)  # (D, C, h', w')
