"""BEiT's block: pre-norm attention and MLP, each scaled by LayerScale (`gamma_1`, `gamma_2`,
BEiT's names) where `init_values` is set, with stochastic depth on both branches.

Bao et al., "BEiT" (ICLR 2022); LayerScale is Touvron et al. (CaiT, ICCV 2021). The MLP is the
shared one (layers/mlp.py): Linear-GELU-Linear or SwiGLU, with an optional hidden norm.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..layers.drop import DropPath
from ..layers.mlp import Mlp, SwiGLU
from .attention import BeitAttention
from .config import BeitConfig


def build_mlp(config: BeitConfig) -> nn.Module:
    """timm's: SwiGLU (`fc1_g`, `fc1_x`) or the GELU MLP, `int(dim * mlp_ratio)` wide, with a
    LayerNorm on the hidden layer for `scale_mlp`."""
    dim, hidden = config.embed_dim, int(config.embed_dim * config.mlp_ratio)
    norm = nn.LayerNorm(hidden, eps=config.norm_eps) if config.scale_mlp else None
    kind = SwiGLU if config.swiglu_mlp else Mlp
    return kind(dim, hidden, drop=config.proj_drop_rate, norm=norm)


class BeitBlock(nn.Module):
    """x + gamma_1 * attn(norm1(x), shared bias), then x + gamma_2 * mlp(norm2(x)) (each gamma
    only with LayerScale)."""

    def __init__(self, config: BeitConfig, *, drop_path: float = 0.0) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn = BeitAttention(
            dim,
            num_heads=config.num_heads,
            qkv_bias=config.qkv_bias,
            grid=config.grid_size if config.use_rel_pos_bias else None,
            attn_drop=config.attn_drop_rate,
            proj_drop=config.proj_drop_rate,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.mlp = build_mlp(config)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.gamma_1 = self.gamma_2 = None
        if config.layer_scale:
            self.gamma_1 = nn.Parameter(torch.full((dim,), float(config.init_values)))
            self.gamma_2 = nn.Parameter(torch.full((dim,), float(config.init_values)))

    def _feed(self, x: Tensor) -> Tensor:
        out = self.mlp(self.norm2(x))
        return out if self.gamma_2 is None else self.gamma_2 * out

    def _scaled(self, out: Tensor) -> Tensor:
        return out if self.gamma_1 is None else self.gamma_1 * out

    def forward(self, x: Tensor, shared_bias: Tensor | None = None) -> Tensor:
        x = x + self.drop_path1(self._scaled(self.attn(self.norm1(x), shared_bias)))
        return x + self.drop_path2(self._feed(x))

    def forward_with_weights(
        self, x: Tensor, shared_bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The block and its attention weights (B, heads, N, N)."""
        out, weights = self.attn.forward_with_weights(self.norm1(x), shared_bias)
        x = x + self.drop_path1(self._scaled(out))
        return x + self.drop_path2(self._feed(x)), weights
