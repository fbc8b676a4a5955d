"""Parallel encoder blocks, as timm's `ParallelScalingBlock` and `ParallelThingsBlock`.

`ParallelScalingBlock` is ViT-22B's (Dehghani et al., "Scaling Vision Transformers to 22 Billion
Parameters", ICML 2023): attention and MLP read the same normed input, their input
projections fused in one Linear (`in_proj`: MLP hidden, q, k, v), and the two branches are
summed into one residual, x + attn(LN(x)) + mlp(LN(x)). With differential attention
(diff_attention.py) it is timm's `DiffParallelScalingBlock`, whose two output projections are
one `out_proj` over the concatenated branches. `ParallelThingsBlock` is Touvron et al., "Three
things everyone should know about Vision Transformers" (ECCV 2022): two attention branches
summed into one residual, then two MLP branches. Parameter names are timm's.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention
from .block import Block
from .diff_attention import DiffAttention, DiffHeads
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import MLP_CLASSES, make_act
from .norm import make_norm

# timm's ParallelThingsBlock default (the `_18x2_` names: 18 blocks of 2 branches).
PARALLEL_BRANCHES = 2


class ParallelScalingBlock(nn.Module):
    """x + LayerScale(attn(y) + mlp(y)), y = norm(x), one fused input projection (ViT-22B).

    Args:
        dim: token width.
        num_heads, mlp_ratio: heads and the MLP's hidden width as a multiple of `dim`.
        qkv_bias: bias of `in_proj`; without it the MLP's input bias is `mlp_bias` (timm).
        qk_norm, proj_bias, act_layer, norm_layer, norm_eps: as `Block`'s.
        proj_drop, attn_drop, drop_path, init_values: dropouts, stochastic depth, LayerScale.
        linear_layer: the class of the Linear layers.
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: str = "gelu",
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads // self.head_split
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        hidden = int(mlp_ratio * dim)
        self.in_split = [hidden, dim, dim, dim]
        self.mlp_bias = None if qkv_bias else nn.Parameter(torch.zeros(hidden))
        self._add_lambdas()
        self.in_norm = make_norm(norm_layer, dim, norm_eps)
        self.in_proj = linear_layer(dim, hidden + 3 * dim, bias=qkv_bias)
        self.q_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = make_norm(norm_layer, self.head_dim, norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self._add_head_norm()
        self.mlp_drop = nn.Dropout(proj_drop)
        self.mlp_act = make_act(act_layer)
        fused = self.fused_out_proj
        self.out_proj = linear_layer(dim + hidden, dim, bias=proj_bias) if fused else None
        self.attn_out_proj = None if fused else linear_layer(dim, dim, bias=proj_bias)
        self.mlp_out_proj = None if fused else linear_layer(hidden, dim, bias=proj_bias)
        self.ls = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    # What the differential block changes (`DiffParallelScalingBlock`).
    head_split = 1
    fused_out_proj = False

    def _add_lambdas(self) -> None:
        pass

    def _add_head_norm(self) -> None:
        pass

    def split_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, N, D) -> each (B, heads, N, head_dim)."""
        batch, tokens, _ = q.shape
        q = q.reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        return q, k, v  # each (B, heads, N, head_dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Heads -> the attention output (B, N, D) before its projection."""
        dropout_p = self.attn_drop.p if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        return x.transpose(1, 2).flatten(2)  # (B, N, D)

    def attend_with_weights(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """`attend` written out, also returning the weights (B, heads, N, N)."""
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        x = (self.attn_drop(weights) @ v).transpose(1, 2).flatten(2)  # (B, N, D)
        return x, weights

    def _branches(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The MLP's hidden layer (B, N, hidden) and q, k, v split into heads."""
        x_mlp, q, k, v = torch.split(self.in_proj(self.in_norm(x)), self.in_split, dim=-1)
        if self.mlp_bias is not None:
            x_mlp = x_mlp + self.mlp_bias
        q, k, v = self.split_heads(q, k, v)
        return x_mlp, self.q_norm(q), self.k_norm(k), v

    def _merge(self, x: Tensor, x_attn: Tensor, x_mlp: Tensor) -> Tensor:
        """The residual of the attention output (B, N, D) and the MLP hidden layer."""
        x_mlp = self.mlp_drop(self.mlp_act(x_mlp))
        if self.out_proj is not None:
            y = self.out_proj(torch.cat((x_attn, x_mlp), dim=-1))
        else:
            assert self.attn_out_proj is not None and self.mlp_out_proj is not None
            y = self.attn_out_proj(x_attn) + self.mlp_out_proj(x_mlp)
        return x + self.drop_path(self.ls(y))

    def forward(self, x: Tensor) -> Tensor:
        x_mlp, q, k, v = self._branches(x)
        return self._merge(x, self.attend(q, k, v), x_mlp)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its attention weights (B, heads, N, N)."""
        x_mlp, q, k, v = self._branches(x)
        x_attn, weights = self.attend_with_weights(q, k, v)
        return self._merge(x, x_attn, x_mlp), weights


class DiffParallelScalingBlock(DiffHeads, ParallelScalingBlock):
    """The parallel block with differential attention heads and one output projection over
    the concatenated branches (timm's `DiffParallelScalingBlock`); `depth`, the block index,
    sets lambda_init."""

    head_split = 2
    fused_out_proj = True

    def __init__(self, dim: int, *, depth: int = 0, **options: Any) -> None:
        self._depth = depth
        super().__init__(dim, **options)

    def _add_lambdas(self) -> None:
        self._init_diff(self._depth)

    def _add_head_norm(self) -> None:
        self.sub_norm = self.diff_norm(self.head_dim)

    def split_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.split_diff_heads(q, k, v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.diff_attend(q, k, v)

    def attend_with_weights(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        weights = self.diff_weights(q, k)
        return self.finish_heads(self.attn_drop(weights) @ v), weights


def _branch(
    name: str, layer: nn.Module, dim: int, init_values: float | None, drop_path: float, **norm: Any
) -> nn.Sequential:
    """norm -> layer (`name`: 'attn' or 'mlp') -> LayerScale -> stochastic depth, under timm's
    names."""
    layers = OrderedDict(
        norm=make_norm(norm["norm_layer"], dim, norm["norm_eps"]),
        **{name: layer},
        ls=LayerScale(dim, init_values) if init_values else nn.Identity(),
        drop_path=DropPath(drop_path) if drop_path > 0.0 else nn.Identity(),
    )
    return nn.Sequential(layers)


class ParallelThingsBlock(nn.Module):
    """x + sum of `num_parallel` attention branches, then x + sum of as many MLP branches
    (Touvron et al. 2022; timm's `ParallelThingsBlock`). Options as `Block`'s."""

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        num_parallel: int = PARALLEL_BRANCHES,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: str = "gelu",
        mlp_layer: str = "mlp",
        norm_layer: str = "layernorm",
        norm_eps: float = 1e-6,
        linear_layer: type[nn.Linear] = nn.Linear,
    ) -> None:
        super().__init__()
        norm = dict(norm_layer=norm_layer, norm_eps=norm_eps)
        hidden = int(dim * mlp_ratio)
        self.attns = nn.ModuleList()
        self.ffns = nn.ModuleList()
        for _ in range(num_parallel):
            attn = Attention(
                dim,
                num_heads=num_heads,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop,
                proj_drop=proj_drop,
                qk_norm=qk_norm,
                scale_norm=scale_attn_norm,
                proj_bias=proj_bias,
                linear_layer=linear_layer,
                **norm,
            )
            mlp_norm = make_norm(norm_layer, hidden, norm_eps) if scale_mlp_norm else None
            mlp = MLP_CLASSES[mlp_layer](
                dim,
                hidden,
                drop=proj_drop,
                act_layer=act_layer,
                bias=proj_bias,
                norm=mlp_norm,
                linear_layer=linear_layer,
            )
            self.attns.append(_branch("attn", attn, dim, init_values, drop_path, **norm))
            self.ffns.append(_branch("mlp", mlp, dim, init_values, drop_path, **norm))

    def forward(self, x: Tensor) -> Tensor:
        x = x + torch.stack([attn(x) for attn in self.attns]).sum(dim=0)
        return x + torch.stack([ffn(x) for ffn in self.ffns]).sum(dim=0)

    def forward_with_weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The same block, also returning its branches' attention weights averaged
        (B, heads, N, N): the map of the summed attention output."""
        outs, maps = [], []
        for branch in self.attns:
            out, weights = branch.attn.forward_with_weights(branch.norm(x))
            outs.append(branch.drop_path(branch.ls(out)))
            maps.append(weights)
        x = x + torch.stack(outs).sum(dim=0)
        x = x + torch.stack([ffn(x) for ffn in self.ffns]).sum(dim=0)
        return x, torch.stack(maps).mean(dim=0)


def build_block_variant(config: Any, drop_path: float, index: int, linear_layer: type) -> nn.Module:
    """Block `index` of a `ViTConfig` whose `block` or `attn_layer` is not the plain one: a
    parallel block, or a `Block` with differential attention (timm builds them the same way,
    passing the block index as `depth`)."""
    common = dict(
        num_heads=config.num_heads,
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        proj_bias=config.proj_bias,
        proj_drop=config.drop_rate,
        attn_drop=config.attn_drop_rate,
        drop_path=drop_path,
        init_values=config.init_values,
        act_layer=config.act_layer,
        norm_layer=config.norm_layer,
        norm_eps=config.norm_eps,
        linear_layer=linear_layer,
    )
    diff = config.attn_layer == "diff"
    if config.block == "parallel_scaling" and diff:
        return DiffParallelScalingBlock(config.embed_dim, depth=index, **common)
    if config.block == "parallel_scaling":
        return ParallelScalingBlock(config.embed_dim, **common)
    extra = dict(
        scale_attn_norm=config.scale_attn_norm,
        scale_mlp_norm=config.scale_mlp_norm,
        mlp_layer=config.mlp_layer,
    )
    if config.block == "parallel_things":
        return ParallelThingsBlock(config.embed_dim, **common, **extra)
    attn_layer = partial(DiffAttention, depth=index)
    return Block(
        config.embed_dim, qk_scale=config.qk_scale, attn_layer=attn_layer, **common, **extra
    )
