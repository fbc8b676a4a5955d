"""EVA's block: pre-norm with LayerScale (`gamma_1`, `gamma_2`, as BEiT names them) or post-norm
(EVA-02-E: x + norm(f(x))), and its MLP (Linear-GELU-Linear, or SwiGLU, with EVA-02's norm on
the hidden layer).

Fang et al., "EVA-02: A Visual Representation for Neon Genesis" (2024); SwiGLU is Shazeer
(2020), LayerScale Touvron et al. (CaiT, 2021), the hidden norm NormFormer's (Shleifer et al.,
2021). The MLP classes are the shared ones (layers/mlp.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..layers.drop import DropPath
from ..layers.mlp import Mlp, SwiGLU, SwiGLUPacked
from ..layers.norm import make_norm
from .attention import EvaAttention
from .config import EvaConfig


def build_mlp(config: EvaConfig) -> nn.Module:
    """timm's choice: SwiGLU with separate gate and value (`fc1_g`, `fc1_x`) where a hidden norm
    or an aligned width asks for it (post-norm blocks: the norm only), else packed in one
    `fc1`; otherwise the GELU MLP. With `scale_mlp`, a norm on the hidden layer."""
    dim, hidden = config.embed_dim, int(config.embed_dim * config.mlp_ratio)
    drop = config.proj_drop_rate
    separate = config.scale_mlp or (config.swiglu_align_to and not config.use_post_norm)
    if config.swiglu_mlp and separate and config.swiglu_align_to:
        hidden += -hidden % config.swiglu_align_to
    norm = make_norm(config.norm_layer, hidden, config.norm_eps) if config.scale_mlp else None
    if not config.swiglu_mlp:
        return Mlp(dim, hidden, drop=drop, act_layer="gelu", norm=norm)
    if separate:
        return SwiGLU(dim, hidden, drop=drop, norm=norm)
    return SwiGLUPacked(dim, hidden * 2, drop=drop, norm=norm)


class EvaBlock(nn.Module):
    """One block; `rope` goes to the attention. Pre-norm: x + gamma_1 * attn(norm1(x)), then
    x + gamma_2 * mlp(norm2(x)) (each gamma only with init_values); post-norm: x +
    norm1(attn(x)), then x + norm2(mlp(x))."""

    def __init__(self, config: EvaConfig, *, drop_path: float = 0.0, index: int = 0) -> None:
        super().__init__()
        dim = config.embed_dim
        self.post_norm = config.use_post_norm
        self.norm1 = make_norm(config.norm_layer, dim, config.norm_eps)
        self.attn = EvaAttention(
            dim,
            num_heads=config.num_heads,
            num_kv_heads=config.kv_heads(index),
            qkv_bias=config.qkv_bias,
            qkv_fused=config.qkv_fused,
            eva_bias=config.attn_type == "eva",
            qk_norm=config.qk_norm,
            scale_norm=config.scale_attn_inner,
            norm_layer=config.norm_layer,
            norm_eps=config.norm_eps,
            attn_drop=config.attn_drop_rate,
            proj_drop=config.proj_drop_rate,
            num_prefix_tokens=config.num_prefix_tokens,
            rotate_half=config.rope_rotate_half,
        )
        scaled = config.init_values is not None and not self.post_norm
        init = config.init_values or 0.0
        self.gamma_1 = nn.Parameter(torch.full((dim,), init)) if scaled else None
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = make_norm(config.norm_layer, dim, config.norm_eps)
        self.mlp = build_mlp(config)
        mlp_scaled = scaled and not config.attn_only_layer_scale
        self.gamma_2 = nn.Parameter(torch.full((dim,), init)) if mlp_scaled else None
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _attend(
        self, x: Tensor, rope: Tensor | None, weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        source = x if self.post_norm else self.norm1(x)
        if weights:
            out, attn = self.attn.forward_with_weights(source, rope)
        else:
            out, attn = self.attn(source, rope), None
        if self.post_norm:
            return self.norm1(out), attn
        return (out if self.gamma_1 is None else self.gamma_1 * out), attn

    def _feed(self, x: Tensor) -> Tensor:
        if self.post_norm:
            return self.norm2(self.mlp(x))
        out = self.mlp(self.norm2(x))
        return out if self.gamma_2 is None else self.gamma_2 * out

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        x = x + self.drop_path1(self._attend(x, rope, False)[0])
        return x + self.drop_path2(self._feed(x))

    def forward_with_weights(self, x: Tensor, rope: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The block and its attention weights (B, heads, N, N)."""
        out, weights = self._attend(x, rope, True)
        x = x + self.drop_path1(out)
        return x + self.drop_path2(self._feed(x)), weights
