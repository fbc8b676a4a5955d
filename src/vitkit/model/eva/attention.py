"""Self-attention with rotary positions on queries and keys, EVA's and timm's `AttentionRope`
parameter layouts, and grouped-query attention.

EVA's layout (Fang et al. 2023, 2024; from BEiT) is one qkv weight without bias and separate
`q_bias` / `v_bias` (keys are never biased); 'rope' is timm's `AttentionRope` (plain biases,
Sapiens2's grouped key / value heads). RoPE is Su et al. (2021), layers/rope.py; the prefix
tokens (class, registers) are not rotated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.norm import make_norm
from ..layers.rope import apply_rope


class EvaAttention(nn.Module):
    """Multi-head self-attention; `rope` (N, 2 * head_dim) or (heads, N, 2 * head_dim)
    rotates the patch tokens' queries and keys.

    The rotation acts on q and k before the scores, so the weights `forward_with_weights`
    returns are the softmax the forward pass uses: attention maps read them as for a ViT.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        qkv_bias: bool = True,
        qkv_fused: bool = True,
        eva_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        num_prefix_tokens: int = 1,
        rotate_half: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.num_prefix_tokens = num_prefix_tokens
        self.rotate_half = rotate_half
        kv_dim = self.head_dim * self.num_kv_heads
        self.qkv = self.q_proj = self.k_proj = self.v_proj = None
        self.q_bias = self.v_bias = None
        if qkv_fused:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias and not eva_bias)
            if qkv_bias and eva_bias:
                self.q_bias = nn.Parameter(torch.zeros(dim))
                self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_proj = nn.Linear(dim, dim, bias=qkv_bias)
            self.k_proj = nn.Linear(dim, kv_dim, bias=qkv_bias and not eva_bias)
            self.v_proj = nn.Linear(dim, kv_dim, bias=qkv_bias)
        self.q_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = make_norm(norm_layer, dim, norm_eps) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused_attn = True  # timm's flag: False writes the attention out (`summary --flow`)

    def qkv_bias(self) -> Tensor | None:
        """The fused qkv product's bias: EVA's [q_bias | 0 | v_bias] (keys unbiased), else
        `qkv.bias`."""
        if self.q_bias is None:
            return self.qkv.bias
        return torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias))

    def _qkv(self, x: Tensor, rope: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Tokens (B, N, D) -> q (B, heads, N, hd), k and v (B, heads, N, hd) after norm,
        rotation and the repetition of grouped key / value heads (the steps `summary --flow`
        walks: the qkv product, its reshape + permute into heads)."""
        batch, tokens, _ = x.shape
        if self.qkv is not None:
            qkv = F.linear(x, self.qkv.weight, self.qkv_bias())  # (B, N, 3 * D)
            qkv = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim)  # (B, N, 3, h, hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, hd)
        else:
            q, k, v = self.split_heads(self.q_proj(x), self.k_proj(x), self.v_proj(x))
        return self._position_heads(q, k, v, rope)

    def split_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Projected q (B, N, D), k and v (B, N, kv_heads * hd) -> q (B, heads, N, hd), k and v
        (B, kv_heads, N, hd)."""
        batch, tokens, _ = q.shape
        q = q.reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(batch, tokens, -1, self.head_dim).transpose(1, 2)
        v = v.reshape(batch, tokens, -1, self.head_dim).transpose(1, 2)
        return q, k, v

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, rope: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Projected q (B, N, D), k and v (B, N, kv_heads * hd) -> q, k, v (B, heads, N, hd)
        as `_qkv` gives them; the fused CPU path (`eva/onednn.py`) calls it on its own
        products."""
        return self._position_heads(*self.split_heads(q, k, v), rope)

    def _position_heads(
        self, q: Tensor, k: Tensor, v: Tensor, rope: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v in heads -> after the q / k norms, the rotation and the repetition of
        grouped key / value heads: each (B, heads, N, hd)."""
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self._rotate(q, rope).type_as(v), self._rotate(k, rope).type_as(v)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:  # kv head j serves query heads j * groups ... (j + 1) * groups - 1
            k = k.repeat_interleave(groups, dim=1)  # (B, heads, N, hd)
            v = v.repeat_interleave(groups, dim=1)  # (B, heads, N, hd)
        return q, k, v

    def _rotate(self, x: Tensor, rope: Tensor) -> Tensor:
        """RoPE on the patch tokens of x (B, heads, N, hd); prefix tokens as they are."""
        npt = self.num_prefix_tokens
        rotated = apply_rope(x[:, :, npt:], rope, self.rotate_half)  # (B, heads, N - P, hd)
        return torch.cat([x[:, :, :npt], rotated], dim=2)  # (B, heads, N, hd)

    def _out(self, x: Tensor) -> Tensor:
        x = x.transpose(1, 2).flatten(2)  # (B, N, D)
        return self.proj_drop(self.proj(self.norm(x)))

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        if not self.fused_attn:
            return self.forward_with_weights(x, rope)[0]
        q, k, v = self._qkv(x, rope)
        dropout_p = self.attn_drop.p if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (B, heads, N, hd)
        return self._out(x)

    def forward_with_weights(self, x: Tensor, rope: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the attention weights (B, heads, N, N)."""
        q, k, v = self._qkv(x, rope)
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        return self._out(self.attn_drop(weights) @ v), weights
