"""Multi-head self-attention, and attention pooling with a learned query.

Vaswani et al., "Attention Is All You Need" (NeurIPS 2017), as the ViT paper uses it
(Dosovitskiy et al., ICLR 2021, Eq. 2 and Appendix A). q/k norm is ViT-22B's (Dehghani et al.,
2023), the norm before the output projection BEiT-3's (Wang et al., 2022). The pool is Lee et
al., "Set Transformer" (ICML 2019), SigLIP's MAP head (Zhai et al., 2023).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .mlp import Mlp
from .norm import make_norm


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (paper Eq. 2, Appendix A).

    The default path calls `F.scaled_dot_product_attention` (fused kernels); the explicit path
    computes softmax(q k^T * scale) v itself and is the one that can hand back the weights.
    `qk_norm` normalises each head's queries and keys (ViT-22B), `scale_norm` the merged heads
    before the output projection (BEiT-3); both use `norm_layer`. `qkv` and `proj` are built
    as `linear_layer` (an `nn.Linear` subclass computing the same function).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(
                f"embed_dim {dim} is not divisible by num_heads {num_heads}; choose num_heads "
                f"among the divisors of {dim} or an embed_dim that is a multiple of {num_heads}"
            )
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale if qk_scale is not None else self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = linear_layer(dim, dim * 3, bias=qkv_bias)
        self.q_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = make_norm(norm_layer, dim, norm_eps) if scale_norm else nn.Identity()
        self.proj = linear_layer(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Packed projections (B, N, 3 * D) -> q, k, v, each (B, heads, N, head_dim)."""
        batch, tokens, _ = qkv.shape
        qkv = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim)  # (B, N, 3, h, hd)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, heads, N, head_dim)
        q, k, v = qkv.unbind(0)
        return q, k, v

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """(B, heads, N, head_dim) -> (B, N, D), contiguous for the output projection."""
        return x.transpose(1, 2).flatten(2)  # (B, N, D)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.split_heads(self.qkv(x))
        return self.q_norm(q), self.k_norm(k), v

    def _out(self, x: Tensor) -> Tensor:
        return self.proj_drop(self.proj(self.norm(self.merge_heads(x))))

    def attention_weights(self, q: Tensor, k: Tensor) -> Tensor:
        """softmax(q k^T * scale), in fp32 even under autocast: (B, heads, N, N)."""
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        return scores.float().softmax(dim=-1).to(q.dtype)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._qkv(x)  # each (B, heads, N, head_dim)
        if self.fused_attn and not bf16_cpu_training(q):
            dropout_p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        elif self.fused_attn:
            # torch's CPU softmax computes bf16 in float32 and rounds once, as the fp32 softmax
            # of `attention_weights` followed by a cast does, at half its memory traffic
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
            x = self.attn_drop(scores.softmax(dim=-1)) @ v
        else:
            x = self.attn_drop(self.attention_weights(q, k)) @ v  # (B, heads, N, head_dim)
        return self._out(x)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the attention weights (B, heads, N, N)."""
        q, k, v = self._qkv(x)
        weights = self.attention_weights(q, k)
        x = self.attn_drop(weights) @ v  # (B, heads, N, head_dim)
        return self._out(x), weights


def exporting() -> bool:
    """Under `torch.export` (pt2, ONNX): attention with an additive mask takes the written-out
    path there, as torch 2.14's ONNX decomposition of SDPA with a mask lays its output out
    otherwise than the traced strides say ("Cannot view a tensor with shape ... as ..."); a
    torch without `torch.compiler.is_exporting` takes the fused path there too."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting())


def bf16_cpu_training(q: Tensor, max_tokens: int = 640) -> bool:
    """Whether attention over `q` is bf16 on CPU with gradients, over at most `max_tokens`:
    there the written-out attention beats SDPA's flash kernel, whose CPU backward is slow in
    bf16. Forward + backward at ViT-S/16's shapes (32 x 6 heads x 197 tokens) 23-30 ms against
    54-56, ViT-B/16's 48-67 against 105-113, 257 tokens 62 against 80, 577 tokens 52-56
    against 71-79 (2-core AVX-512 / AMX Xeon): a ViT-S/16 training step 1.77 -> 1.20 s. The
    price is one (B, heads, N, N) bf16 tensor per block kept for the backward (ViT-S/16 at
    batch 32: 15 MiB a block)."""
    if not torch.jit.is_scripting():  # TorchScript compiles what follows the block
        if isinstance(q, torch.fx.Proxy):
            return False  # torch.fx records the SDPA path (no branching on traced values)
    return (
        q.requires_grad
        and q.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and q.shape[-2] <= max_tokens
    )


class AttentionPool(nn.Module):
    """Multihead attention pooling: one learned query attends over the tokens, then a residual
    MLP (Lee et al., "Set Transformer", 2019; SigLIP's MAP head, timm's
    `AttentionPoolLatent`). Tokens (B, N, D) -> (B, D). `linear_layer` builds the MLP's
    Linear layers."""

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        act_layer: str = "gelu",
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = make_norm(norm_layer, dim, norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, linear_layer=linear_layer)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        q = self.q(self.latent).reshape(1, 1, self.num_heads, self.head_dim)  # (1, 1, h, hd)
        q = q.transpose(1, 2).expand(batch, -1, -1, -1)  # (B, heads, 1, head_dim)
        kv = self.kv(x).reshape(batch, tokens, 2, self.num_heads, self.head_dim)  # (B, N, 2, h, hd)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, heads, 1, head_dim)
        x = self.proj(x.transpose(1, 2).reshape(batch, dim))  # (B, D)
        return x + self.mlp(self.norm(x))
