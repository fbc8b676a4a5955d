"""Log-coordinate relative position bias: a small MLP maps each (dy, dx) offset between two patches,
on a log scale, to one attention bias per head (timm's `RelPosMlp`).

Liu et al., "Swin Transformer V2: Scaling Up Capacity and Resolution" (CVPR 2022), Section 3.3:
continuous position bias from log-spaced coordinates, so that a grid other than the training one
needs no interpolated table. `mode='cr'` is timm's variant (natural log, no sigmoid), the one its
relative-position ViTs use; `mode='swin'` is the paper's (log2 of coordinates scaled to [-8, 8],
16 * sigmoid). Prefix tokens (a class token) get a zero bias.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

REL_POS_MLP_MODES = ("cr", "swin")


def relative_position_index(grid: tuple[int, int]) -> Tensor:
    """For every (query, key) pair of an h x w grid, the row of its (dy, dx) offset in a table of
    (2h - 1) * (2w - 1) offsets: (h * w, h * w)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    coords = torch.stack((rows.flatten(), cols.flatten()))  # (2, N)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    dy, dx = offsets[0] + grid[0] - 1, offsets[1] + grid[1] - 1
    return dy * (2 * grid[1] - 1) + dx  # (N, N)


def relative_log_coords(grid: tuple[int, int], mode: str = "cr") -> Tensor:
    """The (2h - 1, 2w - 1, 2) offsets (dy, dx) on a log scale: sign * log(1 + |d|) ('cr'), or
    the paper's sign * log2(1 + 8 |d| / (size - 1)) / 3 ('swin')."""
    dy = torch.arange(-(grid[0] - 1), grid[0], dtype=torch.float32)
    dx = torch.arange(-(grid[1] - 1), grid[1], dtype=torch.float32)
    coords = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)  # (2h - 1, 2w - 1, 2)
    if mode == "swin":
        coords = coords / torch.tensor([max(grid[0] - 1, 1), max(grid[1] - 1, 1)]) * 8
        return torch.sign(coords) * torch.log2(1.0 + coords.abs()) / math.log2(8)
    return torch.sign(coords) * torch.log(1.0 + coords.abs())


class BiasMlp(nn.Module):
    """Offsets (..., 2) -> one bias per head (..., heads): Linear, ReLU, dropout 0.125, Linear."""

    def __init__(self, hidden_dim: int, num_heads: int, out_bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, hidden_dim)
        self.act = nn.ReLU()
        self.drop1 = nn.Dropout(0.125)
        self.fc2 = nn.Linear(hidden_dim, num_heads, bias=out_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop1(self.act(self.fc1(x))))


class RelPosMlp(nn.Module):
    """The attention bias (1, heads, P + N, P + N) of an h x w patch grid after P prefix tokens,
    from log-spaced offsets through `mlp` (timm's `RelPosMlp`, keys `mlp.fc1` / `mlp.fc2`).

    Args:
        grid: the patch grid (h, w).
        num_heads: attention heads (one bias each).
        hidden_dim: the MLP's hidden width.
        prefix_tokens: tokens before the patches, whose rows and columns get zero bias.
        mode: 'cr' (timm's) or 'swin' (the paper's).
    """

    def __init__(
        self,
        grid: tuple[int, int],
        *,
        num_heads: int,
        hidden_dim: int = 128,
        prefix_tokens: int = 0,
        mode: str = "cr",
    ) -> None:
        super().__init__()
        if mode not in REL_POS_MLP_MODES:
            raise ValueError(f"RelPosMlp mode must be one of {REL_POS_MLP_MODES}, got {mode!r}")
        self.grid, self.num_heads, self.mode = grid, num_heads, mode
        self.prefix_tokens = prefix_tokens
        self.mlp = BiasMlp(hidden_dim, num_heads, out_bias=mode != "swin")
        index = relative_position_index(grid).flatten()
        self.register_buffer("relative_position_index", index, persistent=False)
        self.register_buffer("rel_coords_log", relative_log_coords(grid, mode), persistent=False)

    def get_bias(self) -> Tensor:
        tokens = self.grid[0] * self.grid[1]
        table = self.mlp(self.rel_coords_log).reshape(-1, self.num_heads)  # (offsets, heads)
        bias = table[self.relative_position_index].reshape(tokens, tokens, self.num_heads)
        bias = bias.permute(2, 0, 1)  # (heads, N, N)
        if self.mode == "swin":
            bias = 16 * torch.sigmoid(bias)
        if self.prefix_tokens:
            pad = self.prefix_tokens
            bias = F.pad(bias, [pad, 0, pad, 0])  # (heads, P + N, P + N)
        return bias.unsqueeze(0)  # (1, heads, P + N, P + N)

    def forward(self) -> Tensor:
        return self.get_bias()
