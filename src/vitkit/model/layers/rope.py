"""Rotary position embeddings over a 2-D patch grid, applied to queries and keys.

RoPE is Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021): each
pair of channels of a query or key is rotated by an angle proportional to its position, so that
q . k depends on the positions' difference only. Over an image the position is a point of the
patch grid and the channels are split between its two axes:

- axial (EVA-02, Fang et al. 2024; timm's `RotaryEmbeddingCat`): patch indices, optionally
  rescaled to the pre-training grid (`ref_grid`, EVA's scheme for other resolutions), times
  fixed frequencies 1 / T^(i / n);
- mixed (Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024; timm's
  `RotaryEmbeddingMixed`): learnable frequencies per block and head, each a direction in the
  plane (x f_x + y f_y);
- centred (DINOv3, Simeoni et al. 2025; timm's `RotaryEmbeddingDinoV3`): patch centres
  normalised to [-1, 1], angles 2 pi c / T^(i / n), and training-time coordinate jitter.

An embedding is sin and cos concatenated, (..., N, 2 * head_dim); `apply_rope` rotates the
patch tokens of q or k (B, heads, N, head_dim) with it, in the interleaved layout (pairs
(x0, x1), (x2, x3), ...) or the half layout (pairs (x_i, x_{i + head_dim / 2})).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

ROPE_KINDS = ("cat", "mixed", "dinov3")  # timm's names: axial, mixed, centred
GRID_INDEXINGS = ("ij", "xy")


def rope_coordinates(
    grid: tuple[int, int],
    *,
    centered: bool = False,
    offset: float = 0.0,
    indexing: str = "ij",
    ref_grid: tuple[int, int] | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """The position of each patch of a (rows, columns) grid, row-major: (rows * cols, 2).

    Patch indices (+ `offset`), or with `centered` patch centres normalised to [-1, 1]
    (DINOv3). With `ref_grid`, positions are rescaled so the grid spans the reference grid's
    extent (EVA's resolution change). 'ij' gives (row, column) coordinates, 'xy' (column, row).
    """
    sides, ref = list(grid), list(ref_grid) if ref_grid is not None else None
    if indexing == "xy":  # coordinates and reference in (x, y) order
        sides = sides[::-1]
        ref = ref[::-1] if ref is not None else None
    if centered:
        axes = [(torch.arange(0.5, s, device=device) + offset) / float(s) for s in sides]
    else:
        axes = [torch.arange(s, device=device).float() + offset for s in sides]
    if ref is not None:
        axes = [t / s * r for t, s, r in zip(axes, sides, ref)]
    coords = torch.stack(torch.meshgrid(axes, indexing=indexing), dim=-1)  # (rows, cols, 2)
    if centered:
        coords = 2.0 * coords - 1.0
    return coords.flatten(0, 1)  # (N, 2)


def rope_layout(values: Tensor, rotate_half: bool) -> Tensor:
    """Per-frequency values (..., D/2) in the layout `apply_rope` reads (..., D): each value
    twice in a row (interleaved) or the whole vector twice (half)."""
    if rotate_half:
        return torch.cat([values, values], dim=-1)
    return values.repeat_interleave(2, dim=-1)


def sincos(angles: Tensor, rotate_half: bool) -> Tensor:
    """Angles (..., D/2) -> the embedding [sin | cos], (..., 2 * D)."""
    sin, cos = rope_layout(angles.sin(), rotate_half), rope_layout(angles.cos(), rotate_half)
    return torch.cat([sin, cos], dim=-1)


def apply_rope(x: Tensor, embed: Tensor, rotate_half: bool = False) -> Tensor:
    """Rotate x (..., N, D) by an embedding [sin | cos] (..., N, 2 * D); in x's dtype, computed
    in the embedding's (float32) precision."""
    sin, cos = embed.chunk(2, dim=-1)  # each (..., N, D)
    if rotate_half:
        first, second = x.chunk(2, dim=-1)  # each (..., N, D/2)
        turned = torch.cat([-second, first], dim=-1)  # (..., N, D)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1)  # (..., N, D/2, 2)
        turned = turned.reshape(x.shape)  # (..., N, D): [-x1, x0, -x3, x2, ...]
    return (x * cos + turned * sin).to(x.dtype)


class AxialRope(nn.Module):
    """EVA-02's rotary embedding: patch indices times fixed frequencies 1 / T^(i / n), n =
    head_dim / 4 per axis. `forward(grid)` -> (N, 2 * head_dim)."""

    def __init__(
        self,
        head_dim: int,
        *,
        temperature: float = 10000.0,
        offset: float = 0.0,
        indexing: str = "ij",
        ref_grid: tuple[int, int] | None = None,
        rotate_half: bool = False,
    ) -> None:
        super().__init__()
        _check_head_dim(head_dim)
        self.head_dim, self.temperature, self.offset = head_dim, temperature, offset
        self.indexing, self.ref_grid, self.rotate_half = indexing, ref_grid, rotate_half

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
        bands = self.head_dim // 4
        exponents = torch.arange(bands, device=device).float() / bands
        freqs = 1.0 / (self.temperature**exponents)  # (n,)
        coords = rope_coordinates(
            grid, offset=self.offset, indexing=self.indexing, ref_grid=self.ref_grid, device=device
        )  # (N, 2)
        angles = (coords[:, :, None] * freqs).flatten(1)  # (N, 2n) = (N, head_dim / 2)
        return sincos(angles, self.rotate_half)  # (N, 2 * head_dim)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, temperature={self.temperature}, ref_grid={self.ref_grid}"


class MixedRope(nn.Module):
    """RoPE-Mixed (Heo et al., 2024): learnable frequencies `freqs` (2, depth, heads,
    head_dim / 2), one set per block and head, each a random direction in the plane at init.
    `forward(grid)` -> (depth, heads, N, 2 * head_dim), interleaved layout."""

    def __init__(
        self,
        head_dim: int,
        *,
        depth: int,
        num_heads: int,
        temperature: float = 10.0,
        indexing: str = "xy",
    ) -> None:
        super().__init__()
        _check_head_dim(head_dim)
        self.head_dim, self.temperature, self.indexing = head_dim, temperature, indexing
        magnitude = 1.0 / (temperature ** (torch.arange(0, head_dim, 4).float() / head_dim))
        turn = torch.rand(depth, num_heads, 1) * 2 * math.pi  # (depth, heads, 1)
        fx = torch.cat([magnitude * turn.cos(), magnitude * (turn + math.pi / 2).cos()], -1)
        fy = torch.cat([magnitude * turn.sin(), magnitude * (turn + math.pi / 2).sin()], -1)
        self.freqs = nn.Parameter(torch.stack([fx, fy]))  # (2, depth, heads, head_dim / 2)

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
        coords = rope_coordinates(grid, indexing=self.indexing, device=self.freqs.device)
        freqs = self.freqs.float()
        t_x, t_y = coords[:, 0, None], coords[:, 1, None]  # each (N, 1)
        angles = t_x * freqs[0].unsqueeze(-2) + t_y * freqs[1].unsqueeze(-2)  # (depth, h, N, D/2)
        return sincos(angles, rotate_half=False).to(self.freqs.dtype)  # (depth, h, N, 2 * D)

    def no_weight_decay(self) -> set[str]:
        return {"freqs"}


class CenteredRope(nn.Module):
    """DINOv3's rotary embedding: patch centres in [-1, 1], angles 2 pi c / T^(i / n); while
    training, the coordinates are shifted by U(-shift, shift) per axis, scaled by a log-uniform
    factor in [1/jitter, jitter] per axis and one in [1/rescale, rescale] for both (each when
    set). `forward(grid)` -> (N, 2 * head_dim)."""

    def __init__(
        self,
        head_dim: int,
        *,
        temperature: float = 100.0,
        offset: float = 0.0,
        indexing: str = "ij",
        rotate_half: bool = True,
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
    ) -> None:
        super().__init__()
        _check_head_dim(head_dim)
        self.head_dim, self.temperature, self.offset = head_dim, temperature, offset
        self.indexing, self.rotate_half = indexing, rotate_half
        self.shift, self.jitter, self.rescale = shift, jitter, rescale

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
        bands = self.head_dim // 4
        exponents = 2.0 * torch.arange(bands).float() / (self.head_dim // 2)
        periods = (self.temperature**exponents).to(device)  # (n,)
        coords = rope_coordinates(
            grid, centered=True, offset=self.offset, indexing=self.indexing
        )  # (N, 2), on the CPU as timm builds it
        if self.training:
            coords = self._augment(coords)
        coords = coords.to(device)
        angles = (2 * math.pi * coords[:, :, None] / periods).flatten(1)  # (N, head_dim / 2)
        return sincos(angles, self.rotate_half)  # (N, 2 * head_dim)

    def _augment(self, coords: Tensor) -> Tensor:
        if self.shift is not None:
            coords = coords + torch.empty(2).uniform_(-self.shift, self.shift)
        if self.jitter is not None:
            limit = math.log(self.jitter)
            coords = coords * torch.empty(2).uniform_(-limit, limit).exp()
        if self.rescale is not None:
            limit = math.log(self.rescale)
            coords = coords * torch.empty(1).uniform_(-limit, limit).exp()
        return coords


def _check_head_dim(head_dim: int) -> None:
    if head_dim % 4:
        raise ValueError(
            f"rotary embeddings split each head between two axes in pairs: head_dim {head_dim} "
            "must be a multiple of 4; choose embed_dim / num_heads accordingly"
        )
