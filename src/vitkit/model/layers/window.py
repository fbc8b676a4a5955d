"""ViTDet's block: window attention and decomposed relative positions on the patch grid.

Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection" (ECCV 2022),
Section 3: most blocks attend within non-overlapping windows, the grid padded to whole windows,
a few keep global attention. The decomposed relative positions are MViTv2's (Li et al.,
"MViTv2: Improved Multiscale Vision Transformers", CVPR 2022, Eq. 4), as detectron2 and
Hugging Face's `VitDet` add them: a table per axis, interpolated when the window or grid
differs from the one it was made for. The blocks take maps (B, H, W, D), as detectron2's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention, exporting
from .block import Block


def window_partition(x: Tensor, window: int) -> tuple[Tensor, tuple[int, int]]:
    """Maps (B, H, W, D) -> windows (B * nH * nW, window, window, D), the map padded with zeros
    at the bottom and right to whole windows; also the padded (H, W)."""
    batch, height, width, dim = x.shape
    pad_h, pad_w = (-height) % window, (-width) % window
    x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))  # (B, H + pad_h, W + pad_w, D)
    rows, cols = (height + pad_h) // window, (width + pad_w) // window
    x = x.reshape(batch, rows, window, cols, window, dim)  # (B, nH, ws, nW, ws, D)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, nH, nW, ws, ws, D)
    return x.reshape(-1, window, window, dim), (height + pad_h, width + pad_w)


def window_unpartition(
    windows: Tensor, window: int, padded: tuple[int, int], size: tuple[int, int]
) -> Tensor:
    """Windows (B * nH * nW, window, window, D) -> maps (B, H, W, D), the padding cut off."""
    rows, cols = padded[0] // window, padded[1] // window
    batch = windows.shape[0] // (rows * cols)
    x = windows.reshape(batch, rows, cols, window, window, -1)  # (B, nH, nW, ws, ws, D)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, nH, ws, nW, ws, D)
    x = x.reshape(batch, padded[0], padded[1], -1)  # (B, H + pad_h, W + pad_w, D)
    return x[:, : size[0], : size[1]]


def resize_rel_pos(rel_pos: Tensor, length: int) -> Tensor:
    """A relative-position table (L, C) linearly interpolated to (length, C), as detectron2's
    and SAM's `get_rel_pos` read it at another grid (and as weights are fitted to one)."""
    if rel_pos.shape[0] == length:
        return rel_pos
    table = rel_pos.t().unsqueeze(0)  # (1, C, L)
    table = F.interpolate(table, size=length, mode="linear")  # (1, C, length)
    return table.squeeze(0).t()  # (length, C)


def relative_table(q_size: int, k_size: int, rel_pos: Tensor) -> Tensor:
    """The relative-position embeddings of every (query, key) pair along one axis,
    (q_size, k_size, C), from a table (L, C), linearly interpolated to 2 * max(sizes) - 1 rows
    when L differs; shorter axes' coordinates are scaled up (detectron2's `get_rel_pos`)."""
    rel_pos = resize_rel_pos(rel_pos, 2 * max(q_size, k_size) - 1)
    q_coords = torch.arange(q_size, device=rel_pos.device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, device=rel_pos.device)[None, :] * max(q_size / k_size, 1.0)
    coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos[coords.long()]  # (q_size, k_size, C)


def decomposed_rel_pos_bias(
    q: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, size: tuple[int, int]
) -> Tensor:
    """The additive attention bias of decomposed relative positions (MViTv2 Eq. 4): for query
    (i, j) and key (k, l), q . R_h[i - k] + q . R_w[j - l]. Queries (B, heads, h * w, C) ->
    bias (B, heads, h * w, h * w)."""
    height, width = size
    table_h = relative_table(height, height, rel_pos_h)  # (h, h, C)
    table_w = relative_table(width, width, rel_pos_w)  # (w, w, C)
    batch, heads, _, channels = q.shape
    q = q.reshape(batch, heads, height, width, channels)  # (B, heads, h, w, C)
    bias_h = torch.einsum("bnhwc,hkc->bnhwk", q, table_h)  # (B, heads, h, w, h)
    bias_w = torch.einsum("bnhwc,wkc->bnhwk", q, table_w)  # (B, heads, h, w, w)
    bias = bias_h[..., :, None] + bias_w[..., None, :]  # (B, heads, h, w, h, w)
    return bias.reshape(batch, heads, height * width, height * width)


class RelPosAttention(Attention):
    """`Attention` over maps (B, H, W, D), with decomposed relative positions when `rel_pos`
    is the (h, w) the tables are made for (MViTv2, ViTDet). The bias goes to SDPA as an additive
    mask, so the fused kernel still runs; `rel_pos=None` is plain attention on the map."""

    def __init__(self, dim: int, *, rel_pos: tuple[int, int] | None = None, **options: Any):
        super().__init__(dim, **options)
        self.rel_pos_h = self.rel_pos_w = None
        if rel_pos is not None:
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos[0] - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos[1] - 1, self.head_dim))

    def _bias(self, q: Tensor, size: tuple[int, int]) -> Tensor | None:
        if self.rel_pos_h is None or self.rel_pos_w is None:
            return None
        return decomposed_rel_pos_bias(q, self.rel_pos_h, self.rel_pos_w, size)

    def forward(self, x: Tensor) -> Tensor:
        batch, height, width, dim = x.shape
        q, k, v = self._qkv(x.reshape(batch, height * width, dim))  # each (B, heads, N, hd)
        bias = self._bias(q, (height, width))  # (B, heads, N, N) or None
        if self.fused_attn and not (bias is not None and exporting()):
            dropout_p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=self.scale
            )
        else:
            x = self.attn_drop(self._weights(q, k, bias)) @ v  # (B, heads, N, head_dim)
        return self._out(x).reshape(batch, height, width, dim)

    def _weights(self, q: Tensor, k: Tensor, bias: Tensor | None) -> Tensor:
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        if bias is not None:
            scores = scores + bias
        return scores.float().softmax(dim=-1).to(q.dtype)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit path on maps (B, H, W, D), also returning the weights (B, heads, N, N)."""
        batch, height, width, dim = x.shape
        q, k, v = self._qkv(x.reshape(batch, height * width, dim))
        weights = self._weights(q, k, self._bias(q, (height, width)))
        x = self.attn_drop(weights) @ v  # (B, heads, N, head_dim)
        return self._out(x).reshape(batch, height, width, dim), weights


class WindowBlock(Block):
    """ViTDet's pre-norm block on maps (B, H, W, D): attention within `window_size` windows (0:
    over the whole map), with relative positions when `rel_pos` gives the grid its tables are
    made for (the window's size in a window block). Same layers and keys as `Block`, plus
    `attn.rel_pos_h` / `attn.rel_pos_w`.

    Args:
        dim: token width.
        window_size: window side in patches; 0 for global attention.
        rel_pos: the (h, w) of the global grid the relative-position tables are made for; None
            for no relative positions.
        block_options: `Block`'s other options.
    """

    def __init__(
        self,
        dim: int,
        *,
        window_size: int = 0,
        rel_pos: tuple[int, int] | None = None,
        **block_options: Any,
    ) -> None:
        if rel_pos is not None and window_size:
            rel_pos = (window_size, window_size)
        attn_layer = functools.partial(RelPosAttention, rel_pos=rel_pos)
        super().__init__(dim, attn_layer=attn_layer, **block_options)
        self.window_size = window_size

    def _attend(self, x: Tensor, with_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Attention over the normalised maps (B, H, W, D), window by window."""
        size = (x.shape[1], x.shape[2])
        padded = size
        if self.window_size:
            x, padded = window_partition(x, self.window_size)  # (B * nW, ws, ws, D)
        weights = None
        if with_weights:
            x, weights = self.attn.forward_with_weights(x)
        else:
            x = self.attn(x)
        if self.window_size:
            x = window_unpartition(x, self.window_size, padded, size)  # (B, H, W, D)
        return x, weights

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.ls1(self._attend(self.norm1(x), False)[0]))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights: (B, heads, N, N) for global
        attention, (B * windows, heads, ws * ws, ws * ws) for window attention."""
        attn_out, weights = self._attend(self.norm1(x), True)
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        assert weights is not None
        return x, weights
