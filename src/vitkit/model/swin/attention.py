"""Window attention: multi-head self-attention inside each window, with a bias per head for
each relative offset of two tokens.

Version 1 (Liu et al., "Swin Transformer", ICCV 2021, Eq. 4): softmax(Q K^T / sqrt(d) + B) V,
B read from a learned ((2 wh - 1) * (2 ww - 1), heads) table. Version 2 (Liu et al., "Swin
Transformer V2", CVPR 2022, Eq. 2-4): cosine similarity times a learned per-head logit scale
(clamped at log 100), plus 16 * sigmoid of a bias that a two-layer MLP computes from the
log-spaced offsets. The QKV projection is the ViT's; the windows are the batch, and the shift
mask is added to the logits. Parameter and buffer names are timm's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.attention import bf16_cpu_training, exporting
from .window import log_spaced_offsets, relative_position_index

LOGIT_SCALE_MAX = math.log(1.0 / 0.01)  # Swin V2's clamp: a temperature of at least 0.01


class WindowAttention(nn.Module):
    """Version 1: scaled dot-product attention with a learned relative-position-bias table."""

    fused_attn = True  # one SDPA call over the windows (see `forward`)
    logit_scale_max = LOGIT_SCALE_MAX  # version 2's clamp
    # TorchScript reads these as constants (it takes no global float; it compiles no branch
    # under a False `fused_attn`)
    __constants__ = ["fused_attn", "logit_scale_max"]

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        window: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window
        self.scale = (dim // num_heads) ** -0.5
        rows = (2 * window[0] - 1) * (2 * window[1] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
        index = relative_position_index(window)
        self.register_buffer("relative_position_index", index, persistent=False)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def position_bias(self) -> Tensor:
        """The bias of every pair of tokens of a window, (1, heads, N, N)."""
        area = self.window_size[0] * self.window_size[1]
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        bias = bias.view(area, area, -1)  # (N, N, heads)
        return bias.permute(2, 0, 1).unsqueeze(0)  # (1, heads, N, N)

    def queries_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Windows (B * nW, N, C) -> q, k, v, each (B * nW, heads, N, C / heads)."""
        windows, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(windows, tokens, 3, self.num_heads, -1)  # (B*nW, N, 3, h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B*nW, h, N, d)
        return q, k, v

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """Q K^T / sqrt(d), (B * nW, heads, N, N)."""
        return (q * self.scale) @ k.transpose(-2, -1)

    def attention_bias(self, mask: Tensor | None, windows: int) -> Tensor:
        """The position bias plus the shift mask `mask` (nW, N, N) of `windows` windows:
        (1, heads, N, N) without a mask, else (B * nW, heads, N, N)."""
        bias = self.position_bias()  # (1, heads, N, N)
        if mask is None:
            return bias
        num_windows, tokens = mask.shape[0], mask.shape[-1]
        bias = bias.unsqueeze(1) + mask.unsqueeze(1).unsqueeze(0)  # (1, nW, heads, N, N)
        bias = bias.expand(windows // num_windows, -1, -1, -1, -1)  # (B, nW, heads, N, N)
        return bias.reshape(-1, self.num_heads, tokens, tokens)  # (B * nW, heads, N, N)

    def attention(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(logits + bias + mask), (B * nW, heads, N, N), written out in timm's order of
        operations, so that outputs match timm's to float rounding."""
        attn = self.logits(q, k) + self.position_bias()  # (B * nW, heads, N, N)
        if mask is not None:
            num_windows, tokens = mask.shape[0], mask.shape[-1]
            attn = attn.view(-1, num_windows, self.num_heads, tokens, tokens)  # (B, nW, h, N, N)
            attn = attn + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, tokens, tokens)  # (B * nW, heads, N, N)
        return attn.softmax(dim=-1)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Windows (B * nW, N, C) -> (B * nW, N, C); `mask` (nW, N, N) of the shifted windows.

        Version 1 runs one `scaled_dot_product_attention` over all windows of the batch, the
        position bias plus the shift mask as its additive mask (timm's fused path, equal to
        `attention` to float rounding); version 2 writes it out (`fused_attn` False, timm's
        name; `summary --flow` turns it off to show each step), and so does `torch.export`
        (`layers.attention.exporting`)."""
        q, k, v = self.queries_keys_values(x)
        if self.fused_attn:  # a constant under TorchScript: version 2 compiles no SDPA call
            # bf16 training on CPU: written out (SDPA's masked CPU backward in bf16 ran 5-7x
            # the written-out attention at Swin-T's window shapes)
            fused = not bf16_cpu_training(q)
            if not torch.jit.is_scripting():  # TorchScript compiles the fused path
                fused = fused and not exporting()
            if fused:
                bias = self.attention_bias(mask, x.shape[0]).to(q.dtype)
                drop = self.attn_drop.p if self.training else 0.0
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, dropout_p=drop, scale=self.scale
                )
                return self.project(out, x.shape)
        out = self.attn_drop(self.attention(q, k, mask)) @ v  # (B * nW, heads, N, d)
        return self.project(out, x.shape)

    def forward_with_weights(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`forward` written out, also returning the attention weights of every window,
        (B * nW, heads, N, N): what Hugging Face's Swin returns with `output_attentions`."""
        q, k, v = self.queries_keys_values(x)
        weights = self.attention(q, k, mask)  # (B * nW, heads, N, N)
        out = self.attn_drop(weights) @ v  # (B * nW, heads, N, d)
        return self.project(out, x.shape), weights

    def project(self, out: Tensor, shape: list[int]) -> Tensor:
        """Heads (B * nW, heads, N, d) -> the output projection of windows `shape` (B*nW, N, C)."""
        out = out.transpose(1, 2).reshape(shape)  # (B * nW, N, C)
        return self.proj_drop(self.proj(out))


class CosineWindowAttention(WindowAttention):
    """Version 2: cosine attention with a clamped logit scale, and a continuous position bias
    from an MLP (2 -> 512 -> heads) over log-spaced offsets; `pretrained_window` is the window
    the offsets are scaled by (Swin V2's transfer across window sizes)."""

    # Written out, as timm's V2 (which has no fused path): SDPA takes one scale, and folding
    # the per-head scale (up to 100) into q changes the rounding of the logits enough for
    # outputs to differ from timm's by ~2e-5 relative.
    fused_attn = False

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        window: tuple[int, int],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        pretrained_window: tuple[int, int] = (0, 0),
    ) -> None:
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.window_size = window
        self.pretrained_window_size = pretrained_window
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(
            nn.Linear(2, 512, bias=True),
            nn.ReLU(inplace=True),
            nn.Linear(512, num_heads, bias=False),
        )
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.register_buffer("k_bias", torch.zeros(dim) if qkv_bias else None, persistent=False)
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        table = log_spaced_offsets(window, pretrained_window)
        self.register_buffer("relative_coords_table", table, persistent=False)
        index = relative_position_index(window)
        self.register_buffer("relative_position_index", index, persistent=False)

    def position_bias(self) -> Tensor:
        """16 * sigmoid of the MLP's bias for every pair of tokens, (1, heads, N, N)."""
        area = self.window_size[0] * self.window_size[1]
        table = self.cpb_mlp(self.relative_coords_table).view(-1, self.num_heads)  # (T, heads)
        bias = table[self.relative_position_index.view(-1)].view(area, area, -1)  # (N, N, h)
        return 16 * torch.sigmoid(bias.permute(2, 0, 1)).unsqueeze(0)  # (1, heads, N, N)

    def queries_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Windows (B * nW, N, C) -> q, k, v, each (B * nW, heads, N, C / heads); the k bias
        is a zero buffer (Swin V2 has q and v biases only)."""
        windows, tokens, _ = x.shape
        bias = None
        if self.q_bias is not None and self.k_bias is not None and self.v_bias is not None:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        qkv = F.linear(x, self.qkv.weight, bias)
        qkv = qkv.reshape(windows, tokens, 3, self.num_heads, -1)  # (B*nW, N, 3, h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B*nW, h, N, d)
        return q, k, v

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """Cosine similarity times the per-head scale, clamped at 100, (B * nW, heads, N, N)."""
        cosine = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        return cosine * torch.clamp(self.logit_scale, max=self.logit_scale_max).exp()
