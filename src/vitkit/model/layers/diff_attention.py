"""Differential attention: Ye et al., "Differential Transformer" (ICLR 2025), as timm's
`DiffAttention` (layers/diff_attention.py) computes it.

Each head's queries and keys are split in two halves; the head attends with the difference of
the two softmax maps, softmax(q1 k1^T) - lambda softmax(q2 k2^T), which cancels attention noise
common to both. lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init is learned per layer;
lambda_init = 0.8 - 0.6 exp(-0.3 * block index). The heads' output goes through an RMSNorm
(eps 1e-5) and is scaled by (1 - lambda_init). Parameter names are timm's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention
from .norm import make_norm


class DiffHeads:
    """The differential part, shared by `DiffAttention` and the differential parallel block:
    the lambdas and the output norm as attributes of the module that mixes it in (timm's
    names: `lambda_q1` ... `sub_norm`), and the attention of split heads. The module sets
    `num_heads`, `head_dim` (half a head: the width of q1, q2, k1, k2), `scale`, `attn_drop`
    and `fused_attn` (no class annotations here: TorchScript would read them as attributes).
    """

    def _init_diff(self, depth: int) -> None:
        """The lambdas (normal, std 0.1, as timm) and lambda_init of block `depth`; the
        module then sets `sub_norm = diff_norm(head_dim)`, in timm's place among its layers."""
        assert isinstance(self, nn.Module)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            self.register_parameter(name, nn.Parameter(torch.randn(self.head_dim) * 0.1))
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)

    @staticmethod
    def diff_norm(head_dim: int) -> nn.Module:
        """The RMSNorm (eps 1e-5) of each head's output, 2 * head_dim wide."""
        return nn.RMSNorm(2 * head_dim, eps=1e-5)

    def split_diff_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, N, D) -> q, k (B, 2 * heads, N, head_dim), v (B, heads, N, 2 * head_dim)."""
        batch, tokens, _ = q.shape
        q = q.reshape(batch, tokens, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(batch, tokens, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(batch, tokens, self.num_heads, 2 * self.head_dim).transpose(1, 2)
        return q, k, v  # (B, 2h, N, hd), (B, 2h, N, hd), (B, h, N, 2hd)

    def diff_lambda(self) -> Tensor:
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1).float())
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1).float())
        return lambda_1 - lambda_2 + self.lambda_init

    def diff_weights(self, q: Tensor, k: Tensor) -> Tensor:
        """The differential attention map (B, heads, N, N) of split q, k (B, 2h, N, hd)."""
        batch, _, tokens, _ = q.shape
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, 2h, N, N)
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        weights = weights.view(batch, self.num_heads, 2, tokens, tokens)  # (B, h, 2, N, N)
        lam = self.diff_lambda().type_as(q)
        return weights[:, :, 0] - lam * weights[:, :, 1]  # (B, h, N, N)

    def diff_attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Split heads -> the normed, scaled heads merged (B, N, D)."""
        batch, _, tokens, _ = q.shape
        if self.fused_attn:
            q = q.reshape(batch, self.num_heads, 2, tokens, self.head_dim)  # (B, h, 2, N, hd)
            k = k.reshape(batch, self.num_heads, 2, tokens, self.head_dim)
            dropout_p = self.attn_drop.p if self.training else 0.0  # type: ignore[attr-defined]
            q1, q2 = q.unbind(2)  # each (B, h, N, hd)
            k1, k2 = k.unbind(2)
            attn1 = F.scaled_dot_product_attention(q1, k1, v, dropout_p=dropout_p, scale=self.scale)
            attn2 = F.scaled_dot_product_attention(q2, k2, v, dropout_p=dropout_p, scale=self.scale)
            x = attn1 - self.diff_lambda().type_as(q) * attn2  # (B, h, N, 2hd)
        else:
            x = self.attn_drop(self.diff_weights(q, k)) @ v  # (B, h, N, 2hd)
        return self.finish_heads(x)

    def finish_heads(self, x: Tensor) -> Tensor:
        x = self.sub_norm(x) * (1 - self.lambda_init)
        return x.transpose(1, 2).flatten(2)  # (B, N, D)


class DiffAttention(DiffHeads, Attention):
    """`Attention` with differential heads (timm's `DiffAttention`): the same `qkv` and
    `proj`, half-width q/k norms; `depth` is the block's index (it sets lambda_init)."""

    def __init__(self, dim: int, *, depth: int = 0, **options) -> None:
        super().__init__(dim, **options)
        self.head_dim = dim // self.num_heads // 2
        self.scale = options.get("qk_scale") or self.head_dim**-0.5
        if options.get("qk_norm"):
            norm, eps = options.get("norm_layer", "layernorm"), options.get("norm_eps", 1e-6)
            self.q_norm = make_norm(norm, self.head_dim, eps)
            self.k_norm = make_norm(norm, self.head_dim, eps)
        self._init_diff(depth)
        self.sub_norm = self.diff_norm(self.head_dim)

    def _diff_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, N, D)
        q, k, v = self.split_diff_heads(q, k, v)
        return self.q_norm(q), self.k_norm(k), v

    def _finish(self, x: Tensor) -> Tensor:
        return self.proj_drop(self.proj(self.norm(x)))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._diff_qkv(x)
        return self._finish(self.diff_attend(q, k, v))

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the differential maps (B, heads, N, N)."""
        q, k, v = self._diff_qkv(x)
        weights = self.diff_weights(q, k)
        out = self.finish_heads(self.attn_drop(weights) @ v)
        return self._finish(out), weights
