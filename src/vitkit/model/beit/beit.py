"""The BEiT family's model: a ViT with relative position biases, q / v biases and LayerScale, as
timm's `Beit` (timm's `beit.py`).

Bao et al., "BEiT: BERT Pre-Training of Image Transformers" (ICLR 2022); Peng et al., "BEiT v2:
Masked Image Modeling with Vector-Quantized Visual Tokenizers" (2022).

    image (B, C, H, W)
      -> patch embedding            (B, N, D)        N = (H / p) * (W / p)
      -> [class]                    (B, 1 + N, D)
      -> [+ absolute positions], dropout
      -> depth x block              (B, 1 + N, D)    each adds its relative position bias
      -> [final norm]               (B, 1 + N, D)    forward_features
      -> pool, [fc_norm]            (B, D)           mean of the patches, or the class token
      -> head                       (B, num_classes) forward_head

Module and parameter names are timm's (`patch_embed.proj`, `cls_token`, `pos_embed`,
`rel_pos_bias.relative_position_bias_table`, `blocks.N.attn.qkv` / `q_bias` / `v_bias` /
`relative_position_bias_table`, `blocks.N.gamma_1`, `norm`, `fc_norm`, `head`), so timm's state
dicts load unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..intermediates import IntermediateFeatures
from ..layers.pool import pool_tokens
from ..layers.pos_embed import resample_pos_embed
from ..layers.rel_pos_bias import RelativePositionBias
from ..layers.weight_init import trunc_normal_
from ..stages import FlowSpec
from ..timm_api import TimmApi  # timm's BEiT default: mean = std = 0.5
from .block import BeitBlock
from .config import BeitConfig
from .flow import describe_beit


class Beit(TimmApi, IntermediateFeatures, nn.Module):
    """`Beit(**options)` or `Beit(BeitConfig(...))`: timm's `Beit`, with timm's model API
    (`forward_features`, `forward_head`, `forward_intermediates`, `pretrained_cfg`,
    `group_matcher`, `reset_classifier`, `prune_intermediate_layers`, `set_input_size`)."""

    def __init__(self, config: BeitConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        if config is None:
            config = BeitConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        self.config = config
        dim = config.embed_dim
        self.num_classes = config.num_classes
        self.num_features = self.head_hidden_size = self.embed_dim = dim
        self.global_pool = config.global_pool
        self.num_prefix_tokens = 1
        self.grad_checkpointing = False
        self.patch_embed = self._patch_embed(bias=True)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = None
        if config.use_abs_pos_emb:
            self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, dim))
        self.pos_drop = nn.Dropout(config.pos_drop_rate)
        self.rel_pos_bias = None
        if config.use_shared_rel_pos_bias:
            self.rel_pos_bias = RelativePositionBias(config.grid_size, config.num_heads)
        last = max(config.depth - 1, 1)
        rates = [config.drop_path_rate * i / last for i in range(config.depth)]
        self.blocks = nn.ModuleList(BeitBlock(config, drop_path=rate) for rate in rates)
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": dim, "reduction": config.patch_size}
            for i in range(config.depth)
        ]
        self.norm = nn.Identity() if config.fc_norm else self._norm()
        self.fc_norm = self._norm() if config.fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(dim, config.num_classes) if config.num_classes else nn.Identity()
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None
        self.init_weights()

    def _norm(self) -> nn.Module:
        return nn.LayerNorm(self.embed_dim, eps=self.config.norm_eps)

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: trunc-normal(0.02) Linear weights and zero biases, each block's output
        projections divided by sqrt(2 (i + 1)), tokens and positions trunc-normal(0.02), the
        head's weights and biases scaled by `head_init_scale`; bias tables start at zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for param in (self.pos_embed, self.cls_token):
            if param is not None:
                trunc_normal_(param)
        for i, block in enumerate(self.blocks):
            block.attn.proj.weight.div_(math.sqrt(2.0 * (i + 1)))
            block.mlp.fc2.weight.div_(math.sqrt(2.0 * (i + 1)))
        if isinstance(self.head, nn.Linear) and self.config.head_init_scale:
            self.head.weight.mul_(self.config.head_init_scale)
            self.head.bias.mul_(self.config.head_init_scale)

    # -- timm's model API ---------------------------------------------------------------------

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups: the embedding stem (with the shared table), each block, the
        final norm last."""
        return {
            "stem": r"^cls_token|pos_embed|patch_embed|rel_pos_bias",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def no_weight_decay(self) -> set[str]:
        """timm's: the tokens, positions and every relative position bias table."""
        names = {
            name for name, _ in self.named_parameters() if "relative_position_bias_table" in name
        }
        return names | {n for n, _ in self.named_parameters() if n in ("pos_embed", "cls_token")}

    def set_input_size(
        self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None
    ) -> None:
        """Take another image and / or patch size from now on, as timm's: the patch kernel
        PI-resized to a new patch size (FlexiViT), the absolute positions resampled (bicubic),
        every relative position bias table resized to the new grid (BEiT's resize)."""
        old_grid = self._resize_patch_embed(img_size, patch_size)
        for entry in self.feature_info:
            entry["reduction"] = self.config.patch_size
        grid = self.patch_embed.grid_size
        if grid == old_grid:
            return
        if self.pos_embed is not None:
            table = resample_pos_embed(
                self.pos_embed.detach(), new_size=grid, old_size=old_grid, num_prefix_tokens=1
            )
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        if self.rel_pos_bias is not None:
            self.rel_pos_bias.set_window_size(grid)
        for block in self.blocks:
            block.attn.set_window_size(grid)

    def describe_flow(self, input_size: tuple[int, ...]) -> FlowSpec:
        """This model's forward pass for an input of `input_size` (B, C, H, W), stage by
        stage, for `vitkit.summary.flow` to measure (flow.py)."""
        return describe_beit(self, input_size)

    # -- forward ------------------------------------------------------------------------------

    def block_list(self) -> list[nn.Module]:
        return list(self.blocks)

    def embed(self, x: Tensor) -> Tensor:
        """Image (B, C, H, W) -> tokens (B, 1 + N, D) with the class token and positions."""
        x, _ = self.patch_embed(x)  # (B, N, D); checks the input size
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)  # (B, 1 + N, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.pos_drop(x)

    def shared_bias(self) -> Tensor | None:
        """The shared table's bias (heads, 1 + N, 1 + N), or None."""
        return None if self.rel_pos_bias is None else self.rel_pos_bias()

    def _run_blocks(
        self,
        tokens: Tensor,
        blocks: list[nn.Module],
        take: list[int],
        norm: bool,
        grid: tuple[int, int],
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """Tokens (B, 1 + N, D) through `blocks` with the shared bias, keeping the outputs of
        the blocks in `take` (normalised with `norm`); for `forward_intermediates`."""
        shared = self.shared_bias()
        outputs: dict[int, Tensor] = {}
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(blocks):
            if checkpointing:
                tokens = torch.utils.checkpoint.checkpoint(
                    block, tokens, shared, use_reentrant=False
                )
            else:
                tokens = block(tokens, shared)
            if i in take:
                outputs[i] = self.norm(tokens) if norm else tokens
        return tokens, outputs

    def forward_features(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """All tokens after the final norm, (B, 1 + N, D); with `return_attention`, also each
        block's attention weights (B, heads, 1 + N, 1 + N)."""
        tokens = self.embed(x)
        if return_attention:
            shared = self.shared_bias()
            attentions = []
            for block in self.blocks:
                tokens, weights = block.forward_with_weights(tokens, shared)
                attentions.append(weights)
            return self.norm(tokens), attentions
        grid = self.patch_embed.grid_size
        tokens, _ = self._run_blocks(tokens, self.block_list(), [], False, grid)
        return self.norm(tokens)

    def pool(self, x: Tensor) -> Tensor:
        """Tokens (B, 1 + N, D) -> (B, D) after `fc_norm`: the mean of the patch tokens, the
        class token, or ('none') every token."""
        if self.global_pool != "none":
            x = pool_tokens(x, self.global_pool, self.num_prefix_tokens)
        return self.fc_norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens (B, 1 + N, D) -> logits (B, num_classes), or the pooled features."""
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)
