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

# The bias tables' index and resize are shared with BEiT's (layers/rel_pos_bias.py).
from ..layers.rel_pos_bias import relative_position_index, resize_rel_pos_bias_table

__all__ = [
    "MASK_VALUE",
    "clamp_window",
    "log_spaced_offsets",
    "relative_position_index",
    "resize_rel_pos_bias_table",
    "shift_mask",
    "window_partition",
    "window_reverse",
]

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
