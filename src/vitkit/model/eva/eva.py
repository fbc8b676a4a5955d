"""The EVA family's model: a ViT with rotary positions, as timm's `Eva` (timm's `eva.py`).

EVA is Fang et al., "EVA: Exploring the Limits of Masked Visual Representation Learning at
Scale" (CVPR 2023); EVA-02 Fang et al., "EVA-02: A Visual Representation for Neon Genesis"
(2024); RoPE-ViT Heo et al., "Rotary Position Embedding for Vision Transformer" (ECCV 2024);
Perception Encoder Bolya et al., "Perception Encoder: The best visual embeddings are not at the
output of the network" (2025); DINOv3 Simeoni et al., "DINOv3" (2025). RoPE is Su et al.,
"RoFormer" (2021).

    image (B, C, H, W)
      -> patch embedding            (B, N, D)        N = (H / p) * (W / p)
      -> [class | registers]        (B, P + N, D)    P prefix tokens
      -> [+ absolute positions], dropout, [norm_pre]
      -> depth x block              (B, P + N, D)    RoPE rotates the patch tokens' q and k
      -> [final norm]               (B, P + N, D)    forward_features
      -> pool, [fc_norm]            (B, D)           mean / max / class token / attention pool
      -> head                       (B, num_classes) forward_head

Module and parameter names are timm's (`patch_embed.proj`, `cls_token`, `reg_token`,
`pos_embed`, `rope.freqs`, `blocks.N.attn.qkv` / `q_bias` / `q_proj`, `blocks.N.gamma_1`,
`norm`, `attn_pool`, `fc_norm`, `head`), so timm's state dicts load unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..intermediates import IntermediateFeatures
from ..layers.attention import AttentionPool
from ..layers.norm import make_norm
from ..layers.pool import pool_tokens
from ..layers.pos_embed import resample_pos_embed
from ..layers.rope import AxialRope, CenteredRope, MixedRope
from ..layers.weight_init import trunc_normal_
from ..onednn_fused import FastPathSwitch
from ..stages import FlowSpec
from ..timm_api import TimmApi
from ..timm_cfg import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from .config import EvaConfig
from .flow import describe_eva
from .onednn import eva_block_class


def build_rope(config: EvaConfig) -> nn.Module | None:
    """The rotary embedding `config` asks for (layers/rope.py), or None."""
    if not config.use_rot_pos_emb:
        return None
    common = dict(temperature=config.rope_temperature, indexing=config.rope_grid_indexing)
    if config.rope_type == "mixed":
        return MixedRope(config.head_dim, depth=config.depth, num_heads=config.num_heads, **common)
    if config.rope_type == "dinov3":
        return CenteredRope(
            config.head_dim,
            offset=config.rope_grid_offset,
            rotate_half=config.rope_rotate_half,
            shift=config.rope_shift_coords,
            jitter=config.rope_jitter_coords,
            rescale=config.rope_rescale_coords,
            **common,
        )
    return AxialRope(
        config.head_dim,
        offset=config.rope_grid_offset,
        ref_grid=config.ref_grid,
        rotate_half=config.rope_rotate_half,
        **common,
    )


class Eva(TimmApi, IntermediateFeatures, FastPathSwitch, nn.Module):
    """`Eva(**options)` or `Eva(EvaConfig(...))`: timm's `Eva`, with timm's model API
    (`forward_features`, `forward_head`, `forward_intermediates`, `pretrained_cfg`,
    `group_matcher`, `reset_classifier`, `prune_intermediate_layers`)."""

    TIMM_MEAN, TIMM_STD = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD  # timm's EVA default

    def __init__(self, config: EvaConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        if config is None:
            config = EvaConfig.from_dict(options)
        elif options:
            config = config.replace(**options)
        self.config = config
        dim = config.embed_dim
        self.num_classes = config.num_classes
        self.num_features = self.head_hidden_size = self.embed_dim = dim
        self.global_pool = config.global_pool
        self.num_prefix_tokens = config.num_prefix_tokens
        self.no_embed_class = config.no_embed_class
        self.grad_checkpointing = False
        self.patch_embed = self._patch_embed(bias=not config.use_pre_transformer_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.reg_token = None
        if config.num_reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, config.num_reg_tokens, dim))
        self.pos_embed = None
        if config.use_abs_pos_emb:
            prefix = 0 if config.no_embed_class else config.num_prefix_tokens
            positions = prefix + self.patch_embed.num_patches
            self.pos_embed = nn.Parameter(torch.zeros(1, positions, dim))
        self.pos_drop = nn.Dropout(config.pos_drop_rate)
        self.rope = build_rope(config)
        self.norm_pre = self._norm() if config.use_pre_transformer_norm else nn.Identity()
        last = max(config.depth - 1, 1)
        rates = [config.drop_path_rate * i / last for i in range(config.depth)]
        block = eva_block_class()  # the CPU fast path's block where torch can run it
        self.blocks = nn.ModuleList(
            block(config, drop_path=rate, index=i) for i, rate in enumerate(rates)
        )
        reduction = config.patch_size
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": dim, "reduction": reduction}
            for i in range(config.depth)
        ]
        self.norm = self._norm() if config.final_norm else nn.Identity()
        self.attn_pool = None
        if config.global_pool == "map":
            self.attn_pool = AttentionPool(
                dim,
                num_heads=config.attn_pool_num_heads or config.num_heads,
                mlp_ratio=config.attn_pool_mlp_ratio or config.mlp_ratio,
                norm_layer=config.norm_layer,
                norm_eps=config.norm_eps,
            )
        self.fc_norm = self._norm() if config.fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(dim, config.num_classes) if config.num_classes else nn.Identity()
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None
        self.init_weights()

    def _norm(self) -> nn.Module:
        return make_norm(self.config.norm_layer, self.config.embed_dim, self.config.norm_eps)

    def _patch_embed_options(self) -> dict[str, Any]:
        return {
            "dynamic_img_size": self.config.dynamic_img_size,
            "dynamic_img_pad": self.config.dynamic_img_pad,
        }

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: trunc-normal(0.02) Linear weights and zero biases, each block's output
        projections divided by sqrt(2 (i + 1)), tokens and positions trunc-normal(0.02), the
        head scaled by 0.001."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for param in (self.pos_embed, self.cls_token, self.reg_token):
            if param is not None:
                trunc_normal_(param)
        if self.attn_pool is not None:
            trunc_normal_(self.attn_pool.latent, std=self.embed_dim**-0.5)
        for i, block in enumerate(self.blocks):
            block.attn.proj.weight.div_(math.sqrt(2.0 * (i + 1)))
            block.mlp.fc2.weight.div_(math.sqrt(2.0 * (i + 1)))
        if isinstance(self.head, nn.Linear):
            self.head.weight.mul_(0.001)

    # -- timm's model API ---------------------------------------------------------------------

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's layer groups: the embedding stem, each block, the final norm last."""
        return {
            "stem": r"^cls_token|reg_token|pos_embed|patch_embed|norm_pre",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def no_weight_decay(self) -> set[str]:
        names = {"pos_embed", "cls_token", "reg_token", "rope.freqs"}
        return {name for name, _ in self.named_parameters() if name in names}

    def _reset_pool(self, global_pool: str) -> None:
        """Another pooling: the attention pool can be dropped, not added."""
        if global_pool == "map" and self.attn_pool is None:
            raise ValueError(
                "reset_classifier cannot add an attention pool; build with global_pool='map'"
            )
        if global_pool != "map":
            self.attn_pool = None
        super()._reset_pool(global_pool)

    def set_input_size(
        self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None
    ) -> None:
        """Take another image and / or patch size from now on, as timm's: the patch kernel
        PI-resized to a new patch size (FlexiViT, `resample_patch_embed`), the absolute
        positions resampled (bicubic); RoPE follows the grid of each input (its reference grid,
        `ref_feat_shape`, stays)."""
        old_grid = self._resize_patch_embed(img_size, patch_size)
        for entry in self.feature_info:
            entry["reduction"] = self.config.patch_size
        grid = self.patch_embed.grid_size
        if self.pos_embed is not None and grid != old_grid:
            table = resample_pos_embed(
                self.pos_embed.detach(),
                new_size=grid,
                old_size=old_grid,
                num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens,
            )
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)

    def describe_flow(self, input_size: tuple[int, ...]) -> FlowSpec:
        """This model's forward pass for an input of `input_size` (B, C, H, W), stage by
        stage, for `vitkit.summary.flow` to measure (flow.py)."""
        return describe_eva(self, input_size)

    # -- forward ------------------------------------------------------------------------------

    def block_list(self) -> list[nn.Module]:
        return list(self.blocks)

    def rope_embed(self, grid: tuple[int, int], device: torch.device) -> Tensor | None:
        """The rotary embedding of a patch grid: (N, 2 * head_dim), or for RoPE-Mixed
        (depth, heads, N, 2 * head_dim); None without RoPE."""
        return None if self.rope is None else self.rope(grid, device)

    def position_embedding(self, grid: tuple[int, int]) -> Tensor | None:
        """The absolute positions for a patch grid, resampled (bicubic, antialiased, as timm)
        from the native grid for another input size."""
        if self.pos_embed is None or grid == self.patch_embed.grid_size:
            return self.pos_embed
        return resample_pos_embed(
            self.pos_embed,
            new_size=grid,
            old_size=self.patch_embed.grid_size,
            num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens,
        )

    def embed(self, x: Tensor) -> Tensor:
        """Image (B, C, H, W) -> tokens (B, P + N, D) through `norm_pre`."""
        x, grid = self.patch_embed(x)  # (B, N, D)
        batch = x.shape[0]
        prefix = [
            t.expand(batch, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None
        ]
        pos_embed = self.position_embedding(grid)
        if pos_embed is not None and self.no_embed_class:
            x = x + pos_embed  # (B, N, D): positions for the patches only
        if prefix:
            x = torch.cat(prefix + [x], dim=1)  # (B, P + N, D)
        if pos_embed is not None and not self.no_embed_class:
            x = x + pos_embed
        return self.norm_pre(self.pos_drop(x))

    def _block_rope(self, rope: Tensor | None, index: int) -> Tensor | None:
        mixed = rope is not None and rope.ndim == 4  # RoPE-Mixed: one embedding per block
        return rope[index] if mixed else rope

    def _run_blocks(
        self,
        tokens: Tensor,
        blocks: list[nn.Module],
        take: list[int],
        norm: bool,
        grid: tuple[int, int],
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """Tokens (B, P + N, D) through `blocks` with the grid's RoPE, keeping the outputs of
        the blocks in `take` (normalised with `norm`); for `forward_intermediates`."""
        rope = self.rope_embed(grid, tokens.device)
        outputs: dict[int, Tensor] = {}
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(blocks):
            block_rope = self._block_rope(rope, i)
            if checkpointing:
                tokens = torch.utils.checkpoint.checkpoint(
                    block, tokens, block_rope, use_reentrant=False
                )
            else:
                tokens = block(tokens, block_rope)
            if i in take:
                outputs[i] = self.norm(tokens) if norm else tokens
        return tokens, outputs

    def forward_features(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """All tokens after the final norm, (B, P + N, D); with `return_attention`, also each
        block's attention weights (B, heads, P + N, P + N)."""
        tokens = self.embed(x)  # checks the input first
        grid = self.patch_embed.grid_for(*x.shape[-2:])
        if return_attention:
            rope = self.rope_embed(grid, tokens.device)
            attentions = []
            for i, block in enumerate(self.blocks):
                tokens, weights = block.forward_with_weights(tokens, self._block_rope(rope, i))
                attentions.append(weights)
            return self.norm(tokens), attentions
        tokens, _ = self._run_blocks(tokens, self.block_list(), [], False, grid)
        return self.norm(tokens)

    def pool(self, x: Tensor) -> Tensor:
        """Tokens (B, P + N, D) -> (B, D) after `fc_norm`: the attention pool over every token,
        the class token, or mean / max / their average over the patch tokens; 'none': all."""
        if self.attn_pool is not None:
            x = self.attn_pool(x)
        elif self.global_pool != "none":
            x = pool_tokens(x, self.global_pool, self.num_prefix_tokens)
        return self.fc_norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens (B, P + N, D) -> logits (B, num_classes), or the pooled features."""
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)
