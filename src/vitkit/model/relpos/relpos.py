"""The relative-position ViT family's model: timm's `VisionTransformerRelPos`
(`vision_transformer_relpos.py`): a ViT without absolute positions whose attention adds a
log-coordinate relative position bias (layers/rel_pos_mlp.py), per block or shared.

    image (B, C, H, W)
      -> patch embedding          (B, N, D)          no absolute positions
      -> [class token]            (B, P + N, D)
      -> depth x block            (B, P + N, D)      scores + the bias (1, heads, P + N, P + N)
      -> norm (or none: fc_norm)  (B, P + N, D)      forward_features
      -> pool, [fc_norm], head    (B, num_classes)   mean of the patches or the class token

Module and parameter names are timm's (`patch_embed.proj`, `cls_token`,
`blocks.N.attn.rel_pos.mlp.fc1`, `shared_rel_pos.mlp.fc1`, `blocks.N.ls1.gamma`, `norm`,
`fc_norm`, `head`), so timm's state dicts load unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..intermediates import take_indices
from ..layers.attention import Attention, exporting
from ..layers.block import Block, ResPostBlock
from ..layers.patch_embed import PatchEmbed
from ..layers.pool import pool_tokens
from ..layers.rel_pos_mlp import RelPosMlp
from ..timm_api import TimmApi
from .config import RelPosConfig


def build_rel_pos(config: RelPosConfig) -> RelPosMlp:
    return RelPosMlp(
        config.grid_size,
        num_heads=config.num_heads,
        hidden_dim=config.rel_pos_dim,
        prefix_tokens=config.num_prefix_tokens,
        mode="swin" if config.rel_pos_type == "mlp_swin" else "cr",
    )


class BiasedAttention(Attention):
    """`Attention` with an additive bias on the scores: its own `rel_pos` (a block's), else the
    shared one it is given."""

    def __init__(self, dim: int, **options: Any) -> None:
        super().__init__(dim, **options)
        self.rel_pos: RelPosMlp | None = None  # a block's own; set by the model

    def bias(self, shared: Tensor | None) -> Tensor | None:
        """The bias added to the scores, (1, heads, N, N): the block's own, else `shared`."""
        return self.rel_pos.get_bias() if self.rel_pos is not None else shared

    def forward(self, x: Tensor, shared: Tensor | None = None) -> Tensor:  # type: ignore[override]
        q, k, v = self._qkv(x)  # each (B, heads, N, head_dim)
        bias = self.bias(shared)
        if self.fused_attn and not (bias is not None and exporting()):
            dropout_p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=self.scale
            )
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
            if bias is not None:
                scores = scores + bias
            x = self.attn_drop(scores.softmax(dim=-1)) @ v  # (B, heads, N, head_dim)
        return self._out(x)

    def forward_with_weights(  # type: ignore[override]
        self, x: Tensor, shared: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The explicit path, also returning the weights v is multiplied by (B, heads, N, N):
        the softmax of the biased scores, so attention maps read them as a ViT's."""
        q, k, v = self._qkv(x)
        scores = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.bias(shared)
        if bias is not None:
            scores = scores + bias
        weights = scores.float().softmax(dim=-1).to(q.dtype)
        return self._out(self.attn_drop(weights) @ v), weights


class RelPosBlock(Block):
    """The pre-norm block of timm's `RelPosBlock`: attention with the relative bias."""

    def forward(self, x: Tensor, shared: Tensor | None = None) -> Tensor:  # type: ignore[override]
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), shared)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def forward_with_weights(  # type: ignore[override]
        self, x: Tensor, shared: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        out, weights = self.attn.forward_with_weights(self.norm1(x), shared)
        x = x + self.drop_path1(self.ls1(out))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x)))), weights


class ResPostRelPosBlock(ResPostBlock):
    """timm's `ResPostRelPosBlock`: x + norm(f(x)), the norms' weights starting at
    `init_values`."""

    def forward(self, x: Tensor, shared: Tensor | None = None) -> Tensor:  # type: ignore[override]
        x = x + self.drop_path1(self.norm1(self.attn(x, shared)))
        return x + self.drop_path2(self.norm2(self.mlp(x)))

    def forward_with_weights(  # type: ignore[override]
        self, x: Tensor, shared: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        out, weights = self.attn.forward_with_weights(x, shared)
        x = x + self.drop_path1(self.norm1(out))
        return x + self.drop_path2(self.norm2(self.mlp(x))), weights


class RelPosViT(TimmApi, nn.Module):
    """`RelPosViT(**options)` or `RelPosViT(RelPosConfig(...))`: timm's
    `VisionTransformerRelPos`, with timm's model API."""

    def __init__(self, config: RelPosConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        if config is None:
            config = RelPosConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        self.config = config
        dim = self.embed_dim = self.num_features = self.head_hidden_size = config.embed_dim
        self.num_classes, self.global_pool = config.num_classes, config.global_pool
        self.num_prefix_tokens = config.num_prefix_tokens
        self.grad_checkpointing = False
        self.patch_embed = PatchEmbed(
            img_size=config.img_size,
            patch_size=config.patch_size,
            in_chans=config.in_chans,
            embed_dim=dim,
        )
        self.shared_rel_pos = build_rel_pos(config) if config.shared_rel_pos else None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        last = max(config.depth - 1, 1)
        self.blocks = nn.ModuleList(
            self._block(config.drop_path_rate * i / last) for i in range(config.depth)
        )
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": dim, "reduction": config.patch_size}
            for i in range(config.depth)
        ]
        self.norm = nn.Identity() if config.fc_norm else nn.LayerNorm(dim, eps=1e-6)
        self.fc_norm = nn.LayerNorm(dim, eps=1e-6) if config.fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(dim, config.num_classes) if config.num_classes else nn.Identity()
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None

    def _block(self, drop_path: float) -> nn.Module:
        config = self.config
        post = config.res_post_norm
        block = (ResPostRelPosBlock if post else RelPosBlock)(
            config.embed_dim,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            qk_norm=config.qk_norm,
            init_values=None if post else config.init_values,
            proj_drop=config.proj_drop_rate,
            attn_drop=config.attn_drop_rate,
            drop_path=drop_path,
            attn_layer=BiasedAttention,
        )
        if not config.shared_rel_pos:
            block.attn.rel_pos = build_rel_pos(config)
        if post and config.init_values is not None:
            nn.init.constant_(block.norm1.weight, config.init_values)
            nn.init.constant_(block.norm2.weight, config.init_values)
        return block

    # -- timm's model API ---------------------------------------------------------------------

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return {"stem": r"^cls_token|patch_embed", "blocks": [(r"^blocks\.(\d+)", None)]}

    def no_weight_decay(self) -> set[str]:
        return {"cls_token"} if self.cls_token is not None else set()

    def _reset_pool(self, global_pool: str) -> None:
        self.global_pool = global_pool
        self.config = self.config.replace(global_pool=global_pool)

    def _new_head(self, num_classes: int) -> nn.Module:
        """A head for `reset_classifier`, with torch's default init (timm's)."""
        return nn.Linear(self.embed_dim, num_classes) if num_classes else nn.Identity()

    # -- forward ------------------------------------------------------------------------------

    def embed(self, x: Tensor) -> Tensor:
        """Images (B, C, H, W) -> tokens (B, P + N, D)."""
        x, _ = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return x

    def _run(self, x: Tensor, blocks: list[nn.Module], take: set[int]) -> tuple[Tensor, list]:
        shared = self.shared_rel_pos.get_bias() if self.shared_rel_pos is not None else None
        kept = []
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(blocks):
            if checkpointing:
                x = torch.utils.checkpoint.checkpoint(block, x, shared, use_reentrant=False)
            else:
                x = block(x, shared)
            if i in take:
                kept.append(x)
        return x, kept

    def forward_features(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """All tokens after the final norm, (B, P + N, D); with `return_attention`, also each
        block's attention weights (B, heads, P + N, P + N)."""
        if return_attention:
            return self._features_and_attention(self.embed(x))
        x, _ = self._run(self.embed(x), list(self.blocks), set())
        return self.norm(x)

    def _features_and_attention(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        shared = self.shared_rel_pos.get_bias() if self.shared_rel_pos is not None else None
        attentions = []
        for block in self.blocks:
            x, weights = block.forward_with_weights(x, shared)
            attentions.append(weights)
        return self.norm(x), attentions

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        if self.global_pool != "none":
            x = pool_tokens(x, self.global_pool, self.num_prefix_tokens)  # (B, D)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        *,
        norm: bool = False,
        output_fmt: str = "NCHW",
        return_prefix_tokens: bool = False,
        intermediates_only: bool = False,
        stop_early: bool = False,
    ) -> tuple[Tensor, list[Any]] | list[Any]:
        """The outputs of the blocks in `indices`, in block order, as timm's: maps
        (B, D, h, w) ('NCHW') or patch tokens (B, N, D) ('NLC'), the prefix tokens apart."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = set(take_indices(len(self.blocks), indices))
        blocks = list(self.blocks)[: max(take) + 1] if stop_early else list(self.blocks)
        x, kept = self._run(self.embed(x), blocks, take)
        grid = self.patch_embed.grid_size
        out = []
        for tokens in kept:
            tokens = self.norm(tokens) if norm else tokens
            prefix, patches = (
                tokens[:, : self.num_prefix_tokens],
                tokens[:, self.num_prefix_tokens :],
            )
            if output_fmt == "NCHW":
                patches = patches.reshape(patches.shape[0], *grid, -1).permute(0, 3, 1, 2)
            out.append((patches, prefix) if return_prefix_tokens else patches)
        if intermediates_only:
            return out
        return self.norm(x), out
