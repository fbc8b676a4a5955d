"""The transformer encoder block: attention and MLP, each a residual branch.

Pre-norm, as the ViT paper writes it (Dosovitskiy et al., ICLR 2021, Eq. 2-3); the residual
post-norm block is Swin Transformer V2's (Liu et al., CVPR 2022).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ...options import check_choice
from .attention import Attention
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import MLP_CLASSES, MLP_LAYERS, mlp_hidden_width
from .norm import make_norm


class Block(nn.Module):
    """Pre-norm encoder block: x + MSA(LN(x)), then x + MLP(LN(x)) (paper Eqs. 2-3).

    Args:
        dim: token width.
        num_heads, qkv_bias, qk_scale, qk_norm, scale_attn_norm: the `Attention`'s options.
        mlp_ratio, mlp_layer, act_layer, scale_mlp_norm: the MLP's width, kind
            ('mlp', 'swiglu', 'swiglu_packed'), activation and hidden-layer norm.
        proj_bias: biases of the attention output and MLP layers.
        proj_drop, attn_drop, drop_path: dropout rates and stochastic depth.
        init_values: LayerScale init; None disables it.
        norm_layer, norm_eps: 'layernorm' or 'rmsnorm', and its epsilon, for every norm.
        linear_layer: the class of the attention's and the MLP's Linear layers.
        attn_layer: what builds the attention from `Attention`'s arguments (a subclass, e.g.
            ViTDet's `RelPosAttention`).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
        norm_layer: str = "layernorm",
        act_layer: str = "gelu",
        mlp_layer: str = "mlp",
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        linear_layer: type[nn.Linear] = nn.Linear,
        attn_layer: Callable[..., Attention] = Attention,
    ) -> None:
        super().__init__()
        check_choice("mlp_layer", mlp_layer, MLP_LAYERS)
        self.norm1 = make_norm(norm_layer, dim, norm_eps)
        self.attn = attn_layer(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_scale=qk_scale,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            qk_norm=qk_norm,
            scale_norm=scale_attn_norm,
            proj_bias=proj_bias,
            norm_layer=norm_layer,
            norm_eps=norm_eps,
            linear_layer=linear_layer,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = make_norm(norm_layer, dim, norm_eps)
        hidden = int(dim * mlp_ratio)
        mlp_norm = None
        if scale_mlp_norm:
            mlp_norm = make_norm(norm_layer, mlp_hidden_width(mlp_layer, dim, mlp_ratio), norm_eps)
        self.mlp = MLP_CLASSES[mlp_layer](
            dim,
            hidden,
            drop=proj_drop,
            act_layer=act_layer,
            bias=proj_bias,
            norm=mlp_norm,
            linear_layer=linear_layer,
        )
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights (B, heads, N, N)."""
        attn_out, weights = self.attn.forward_with_weights(self.norm1(x))
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, weights


class ResPostBlock(Block):
    """Residual post-norm block: x + norm(MSA(x)), then x + norm(MLP(x)) (Liu et al., "Swin
    Transformer V2", 2022; timm's `ResPostBlock`). Same layers and keys as `Block`; no
    LayerScale (timm sets the norms' scale to `init_values` instead, at initialisation only)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x)))
        x = x + self.drop_path2(self.norm2(self.mlp(x)))
        return x

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        attn_out, weights = self.attn.forward_with_weights(x)
        x = x + self.drop_path1(self.norm1(attn_out))
        x = x + self.drop_path2(self.norm2(self.mlp(x)))
        return x, weights
