"""Window geometry of the Swin Transformer: windows cut from a feature map and put back, the
relative offsets of the tokens of a window, and the mask of the shifted windows.

Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows" (ICCV
2021), Section 3.2 (shifted windows, the cyclic shift and its mask; relative position bias);
the log-spaced coordinates are Swin V2's (Liu et al., CVPR 2022, Eq. 4). Semantics are timm's:
the map is rolled, then padded to whole windows; masked pairs get -100.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MASK_VALUE = -100.0  # the original code's (and timm's) value for pairs across shifted regions


def window_partition(x: Tensor, window: tuple[int, int]) -> Tensor:
    """A map (B, H, W, C) -> windows (B * nW, wh * ww, C), row-major windows per image."""
    batch, height, width, chans = x.shape
    wh, ww = window
    x = x.view(batch, height // wh, wh, width // ww, ww, chans)  # (B, H/wh, wh, W/ww, ww, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, H/wh, W/ww, wh, ww, C)
    return x.reshape(-1, wh * ww, chans)  # (B * nW, wh * ww, C)


def window_reverse(windows: Tensor, window: tuple[int, int], height: int, width: int) -> Tensor:
    """Windows (B * nW, wh * ww, C) -> the map (B, H, W, C) they were cut from."""
    wh, ww = window
    chans = windows.shape[-1]
    x = windows.view(-1, height // wh, width // ww, wh, ww, chans)  # (B, H/wh, W/ww, wh, ww, C)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, H/wh, wh, W/ww, ww, C)
    return x.reshape(-1, height, width, chans)  # (B, H, W, C)


def relative_position_index(window: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """(N, N) indices, N = wh * ww: for each pair of tokens of a window, the row of their
    offset (dy, dx) in a (2 wh - 1) * (2 ww - 1) table, offsets counted from (-wh+1, -ww+1)."""
    wh, ww = window
    rows, cols = torch.meshgrid(
        torch.arange(wh, device=device), torch.arange(ww, device=device), indexing="ij"
    )
    coords = torch.stack((rows.flatten(), cols.flatten()))  # (2, N)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (offsets[0] + wh - 1) * (2 * ww - 1) + (offsets[1] + ww - 1)  # (N, N)


def log_spaced_offsets(
    window: tuple[int, int], pretrained: tuple[int, int], dtype: torch.dtype = torch.float32
) -> Tensor:
    """Swin V2's coordinates of every offset of a window, (1, 2 wh - 1, 2 ww - 1, 2): each
    offset divided by the pre-training window's largest (the window's own when `pretrained` is
    (0, 0)), scaled to [-8, 8], then sign(x) * log2(1 + |x|) / 3."""
    wh, ww = window
    dy = torch.arange(-(wh - 1), wh, dtype=torch.float32)
    dx = torch.arange(-(ww - 1), ww, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)  # (2wh-1, 2ww-1, 2)
    reference = pretrained if pretrained[0] > 0 else window
    table[..., 0] /= max(reference[0] - 1, 1)
    table[..., 1] /= max(reference[1] - 1, 1)
    table = table * 8
    table = torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)
    return table.unsqueeze(0).to(dtype)  # (1, 2wh-1, 2ww-1, 2)


def shift_mask(
    height: int,
    width: int,
    window: tuple[int, int],
    shift: tuple[int, int],
    *,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The mask (nW, N, N) of the shifted windows of a padded (H, W) map: 0 between tokens of
    the same region before the cyclic shift, -100 across regions (Section 3.2)."""
    regions = torch.zeros((1, height, width, 1), device=device, dtype=dtype)
    count = 0
    for rows in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for cols in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            regions[:, rows[0] : rows[1], cols[0] : cols[1], :] = count
            count += 1
    labels = window_partition(regions, window).squeeze(-1)  # (nW, N)
    diff = labels.unsqueeze(1) - labels.unsqueeze(2)  # (nW, N, N)
    return diff.masked_fill(diff != 0, MASK_VALUE).masked_fill(diff == 0, 0.0)


def clamp_window(
    resolution: tuple[int, int],
    window: tuple[int, int],
    shift: tuple[int, int],
    always: bool,
    rule: str = "timm",
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The window and shift a block uses on a map of `resolution`: a window no smaller than the
    map is clamped to the map and not shifted (unless `always` partition), per side; under
    torchvision's `rule` it is kept (the map is padded to it) and only the shift dropped."""
    if always:
        return window, shift
    if rule == "torchvision":
        return window, torchvision_shift(resolution, window, shift)
    used = tuple(r if r <= w else w for r, w in zip(resolution, window))
    shifts = tuple(0 if r <= w else s for r, w, s in zip(resolution, used, shift))
    return used, shifts  # type: ignore[return-value]


def torchvision_shift(
    resolution: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]
) -> tuple[int, int]:
    """torchvision's shift on a map of `resolution`: none on a side that one window covers."""
    return tuple(0 if r <= w else s for r, w, s in zip(resolution, window, shift))  # type: ignore[return-value]


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


def resize_rel_pos_bias_table(table: Tensor, new_window: tuple[int, int]) -> Tensor:
    """A V1 bias table ((2w - 1)^2, heads) of a square window, for another window: each head's
    (2w - 1) x (2w - 1) grid of offsets resampled as timm's `resize_rel_pos_bias_table` (BEiT's:
    the old offsets spread geometrically over the new range, then linear interpolation)."""
    rows, heads = table.shape
    side = math.isqrt(rows)
    if side * side != rows:
        raise ValueError(f"a bias table of {rows} rows is not that of a square window")
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    if (side, side) == dst:
        return table
    grids = table.float().cpu().t().reshape(heads, side, side)  # (heads, 2w-1, 2w-1)
    weights = []
    for size in dst:
        half = size // 2
        targets = torch.arange(-half, half + 0.1, 1.0)
        weights.append(_linear_weights(_progression_offsets(side, size), targets))
    resized = weights[0] @ grids @ weights[1].t()  # (heads, 2w'-1, 2w''-1)
    return resized.reshape(heads, -1).t().to(table)  # ((2w'-1)(2w''-1), heads)
