"""Relative position bias: a learned bias per head for each offset (dy, dx) between two tokens of
a grid, added to the attention scores, and its table resized to another grid.

Shaw et al., "Self-Attention with Relative Position Representations" (NAACL 2018); the 2-D table
of Liu et al., "Swin Transformer" (ICCV 2021, Section 3.2), and BEiT's with three extra rows for
the class token (Bao et al., "BEiT: BERT Pre-Training of Image Transformers", ICLR 2022): class
to patch, patch to class, class to class. The resize spreads the old offsets geometrically over
the new range, then interpolates linearly, as BEiT's fine-tuning code and timm's
`resize_rel_pos_bias_table`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

CLASS_ROWS = 3  # BEiT's rows for class -> patch, patch -> class, class -> class


def table_rows(grid: tuple[int, int], class_token: bool = False) -> int:
    """The rows of a table for `grid`: (2 h - 1)(2 w - 1) offsets, and BEiT's three with a class
    token."""
    return (2 * grid[0] - 1) * (2 * grid[1] - 1) + (CLASS_ROWS if class_token else 0)


def relative_position_index(
    window: tuple[int, int], device: torch.device | None = None, class_token: bool = False
) -> Tensor:
    """(N, N) indices, N = h * w: for each pair of tokens of a grid, the row of their offset
    (dy, dx) in a (2 h - 1) * (2 w - 1) table, offsets counted from (-h+1, -w+1). With
    `class_token`, (N + 1, N + 1): the class token's row and column point at BEiT's three extra
    rows (timm's `gen_relative_position_index`)."""
    wh, ww = window
    rows, cols = torch.meshgrid(
        torch.arange(wh, device=device), torch.arange(ww, device=device), indexing="ij"
    )
    coords = torch.stack((rows.flatten(), cols.flatten()))  # (2, N)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    index = (offsets[0] + wh - 1) * (2 * ww - 1) + (offsets[1] + ww - 1)  # (N, N)
    if not class_token:
        return index
    first = table_rows(window)
    out = torch.zeros(wh * ww + 1, wh * ww + 1, dtype=index.dtype, device=device)
    out[1:, 1:] = index  # (N + 1, N + 1)
    out[0, :] = first  # class -> patch
    out[:, 0] = first + 1  # patch -> class
    out[0, 0] = first + 2  # class -> class
    return out


def gather_bias(table: Tensor, index: Tensor) -> Tensor:
    """The bias of every pair of tokens: table (rows, heads), index (N, N) -> (heads, N, N)."""
    tokens = index.shape[0]
    bias = table[index.view(-1)].view(tokens, tokens, -1)  # (N, N, heads)
    return bias.permute(2, 0, 1).contiguous()  # (heads, N, N)


def _progression_offsets(src: int, dst: int) -> Tensor:
    """The source offsets of BEiT's table resize: the `src` offsets placed symmetrically with
    geometrically growing gaps 1, q, q^2, ... so that they span about the `dst` offsets (q
    found by bisection in [1.01, 1.5], as the original code)."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    gaps, position = [], 1.0
    for i in range(src // 2):
        gaps.append(position)
        position += q ** (i + 1)
    return torch.tensor([-g for g in reversed(gaps)] + [0.0] + gaps)


def _linear_weights(points: Tensor, targets: Tensor) -> Tensor:
    """(len(targets), len(points)) weights of linear interpolation on an uneven grid, the
    ends held constant beyond it (timm's `RegularGridInterpolator` along one axis)."""
    right = torch.bucketize(targets, points).clamp(max=len(points) - 1)
    left = (right - 1).clamp(min=0)
    to_left = (targets - points[left]).clamp(min=0)
    to_right = (points[right] - targets).clamp(min=0)
    both_zero = (to_left == 0) & (to_right == 0)
    to_left[both_zero] = to_right[both_zero] = 1.0
    total = to_left + to_right
    weights = torch.zeros(len(targets), len(points))
    rows = torch.arange(len(targets))
    weights.index_put_((rows, left), to_right / total, accumulate=True)
    weights.index_put_((rows, right), to_left / total, accumulate=True)
    return weights


def _source_sides(rows: int, dst: tuple[int, int], old_window: tuple[int, int] | None) -> tuple:
    """The (2h - 1, 2w - 1) sides of a table of `rows` offsets: the old window's, else a
    square, else (a table the size of the new one) the new sides."""
    if old_window is not None:
        return (2 * old_window[0] - 1, 2 * old_window[1] - 1)
    side = math.isqrt(rows)
    if side * side == rows:
        return (side, side)
    if rows == dst[0] * dst[1]:
        return dst
    raise ValueError(
        f"a bias table of {rows} offsets is not that of a square grid; pass the old_window it "
        "was made for"
    )


def resize_rel_pos_bias_table(
    table: Tensor,
    new_window: tuple[int, int],
    old_window: tuple[int, int] | None = None,
    extra_rows: int = 0,
) -> Tensor:
    """A bias table (rows, heads) for another grid: each head's (2h - 1) x (2w - 1) grid of
    offsets resampled as timm's `resize_rel_pos_bias_table` (BEiT's: the old offsets spread
    geometrically over the new range, then linear interpolation); the last `extra_rows` (BEiT's
    class-token rows) kept as they are. The old grid is `old_window`, else square."""
    offsets, extra = table[: table.shape[0] - extra_rows], table[table.shape[0] - extra_rows :]
    heads = table.shape[1]
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    src = _source_sides(offsets.shape[0], dst, old_window)
    if src == dst:
        return table
    if table.is_meta:
        return table.new_empty(dst[0] * dst[1] + extra_rows, heads)
    grids = offsets.float().cpu().t().reshape(heads, *src)  # (heads, 2h-1, 2w-1)
    weights = []
    for old, size in zip(src, dst):
        half = size // 2
        targets = torch.arange(-half, half + 0.1, 1.0)
        weights.append(_linear_weights(_progression_offsets(old, size), targets))
    resized = weights[0] @ grids @ weights[1].t()  # (heads, 2h'-1, 2w'-1)
    resized = resized.reshape(heads, -1).t().to(table)  # ((2h'-1)(2w'-1), heads)
    return torch.cat((resized, extra), dim=0)


def regrid(module: nn.Module, grid: tuple[int, int]) -> None:
    """A module holding BEiT's table, its index and its grid (timm's names:
    `relative_position_bias_table`, `relative_position_index`, `window_size`) made for another
    grid: the table resized (`resize_rel_pos_bias_table`), the index rebuilt."""
    grid = tuple(grid)
    old = module.relative_position_bias_table
    if old is None or grid == module.window_size:
        return
    with torch.no_grad():
        table = resize_rel_pos_bias_table(old, grid, module.window_size, CLASS_ROWS)
    module.relative_position_bias_table = nn.Parameter(table, requires_grad=old.requires_grad)
    device = module.relative_position_index.device
    module.relative_position_index = relative_position_index(grid, device, class_token=True)
    module.window_size = grid


class RelativePositionBias(nn.Module):
    """A table shared by every block (BEiT's `use_shared_rel_pos_bias`): `forward()` gives the
    bias (heads, N + 1, N + 1) of a grid with a class token, which each block adds to its own.
    Parameter names are timm's (`relative_position_bias_table`)."""

    def __init__(self, grid: tuple[int, int], num_heads: int) -> None:
        super().__init__()
        self.window_size = tuple(grid)
        rows = table_rows(self.window_size, class_token=True)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
        index = relative_position_index(self.window_size, class_token=True)
        self.register_buffer("relative_position_index", index, persistent=False)

    def set_window_size(self, grid: tuple[int, int]) -> None:
        regrid(self, grid)

    def forward(self) -> Tensor:
        return gather_bias(self.relative_position_bias_table, self.relative_position_index)
