"""The Vision Transformer.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale" (ICLR 2021). The distillation token is Touvron et al., "Training data-efficient image
transformers & distillation through attention" (DeiT, 2021).

    image (B, C, H, W)
      [-> conv stem (hybrid)        (B, C', H', W')  H' = H / 2^layers, rounded up]
      -> patch embedding            (B, N, D)        N = (H / ph) * (W / pw)
      -> [class, dist | registers]  (B, P + N, D)    P prefix tokens
      -> + position embedding, dropout (patches only with no_embed_class: added before the
                                        prefix tokens are joined)
      [-> norm_pre (CLIP)]
      -> depth x block              (B, P + N, D)    pre-norm, or res-post-norm
      -> final norm                 (B, P + N, D)    forward_features
      -> pool                       (B, D)           class token / mean / max / attention
      -> [fc_norm], head            (B, num_classes) forward_head

Register tokens are Darcet et al., "Vision Transformers Need Registers" (ICLR 2024); the
attention-pooling head is SigLIP's (Zhai et al., 2023).
"""

# No `from __future__ import annotations` here: torch.fx copies `forward`'s annotations into the
# code it generates, where TorchScript cannot read them as strings (fx, then torch.jit.script).
import logging
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..intermediates import IntermediateFeatures, take_indices
from ..layers import AttentionPool, LayerScale, PatchEmbed, ResPostBlock, WindowBlock, make_norm
from ..layers.parallel import build_block_variant
from ..layers.pool import pool_tokens
from ..layers.pos_embed import fixed_pos_embed, resample_pos_embed
from ..layers.weight_init import trunc_normal_
from ..stages import FlowSpec
from . import onednn
from .config import ViTConfig
from .flow import describe_vit
from .timm_api import TimmModelApi, block_feature_info
from .torch_encoder import build_torch_encoder, check_torch_encoder_options

# `take_indices` and `trunc_normal_` live in intermediates.py / weight_init.py; importable here.
__all__ = ["VisionTransformer", "take_indices", "trunc_normal_"]


class VisionTransformer(TimmModelApi, IntermediateFeatures, nn.Module):
    """ViT: `VisionTransformer(**options)` or `VisionTransformer(ViTConfig(...))`.

    The options are `ViTConfig`'s fields (names as in timm); state-dict keys follow timm's
    (`patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.N.attn.qkv`, `norm`, `head`, ...).
    timm's model API comes from `TimmModelApi` (timm_api.py), `forward_intermediates` and
    `get_intermediate_layers` from `IntermediateFeatures` (intermediates.py).
    """

    # Python-side only (they read `config`): TorchScript compiles properties otherwise.
    __jit_unused_properties__ = [
        "learned_pos_embed",
        "pretrained_cfg",
        "default_cfg",
        "timm_classifier",
    ]

    def __init__(self, config: ViTConfig | None = None, /, **options: Any) -> None:
        super().__init__()
        self.config = config = _resolve_config(config, options)
        dim = config.embed_dim
        self.num_classes = config.num_classes
        self.num_features = self.head_hidden_size = self.embed_dim = dim
        self.global_pool = config.global_pool
        self.num_prefix_tokens = config.num_prefix_tokens
        self.num_reg_tokens = config.reg_tokens
        self.grad_checkpointing = False
        # Plain attributes for the forward pass: TorchScript cannot read `config`.
        self.no_embed_class = config.no_embed_class
        self.pos_prefix_tokens = config.pos_prefix_tokens
        self.pos_embed_kind = config.pos_embed
        self.pool_include_prefix = config.pool_include_prefix
        self.pos_embed_antialias = config.pos_embed_antialias
        # ViTDet's blocks (window attention, relative positions) take maps (B, H, W, D).
        self.spatial_blocks = config.window_size > 0 or config.use_rel_pos

        self.patch_embed = self._build_patch_embed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distilled else None
        self.reg_token = None
        if config.reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, dim))
        self._add_pos_embed(config)
        self.pos_drop = nn.Dropout(config.drop_rate)
        self.norm_pre = _norm(config) if config.pre_norm else nn.Identity()
        self.blocks = _build_blocks(config)
        self._add_pool_and_heads(config)
        self.feature_info = block_feature_info(config, self.patch_embed)
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None
        self.init_weights()
        onednn.log_fast_path(self, level=logging.INFO)

    # -- construction -----------------------------------------------------------------------

    def _build_patch_embed(self, config: ViTConfig) -> PatchEmbed:
        """The patch embedding `config` describes (also rebuilt by `set_input_size`)."""
        return PatchEmbed(
            img_size=config.img_size,
            patch_size=config.patch_size,
            in_chans=config.in_chans,
            embed_dim=config.embed_dim,
            kind=config.patch_embed,
            norm=config.embed_norm,
            norm_eps=config.norm_eps,
            norm_layer=config.norm_layer,
            dynamic_img_size=config.dynamic_img_size,
            dynamic_img_pad=config.dynamic_img_pad,
            conv_stem=config.conv_stem,
            conv_stem_strides=config.conv_stem_strides,
            hybrid=config.hybrid,
            hybrid_layers=config.hybrid_layers,
            hybrid_widths=config.hybrid_widths,
            floor_grid=config.floor_grid,
            bias=config.patch_bias,
        )

    def _add_pos_embed(self, config: ViTConfig) -> None:
        """`pos_embed`: learned positions are a parameter; a fixed table is a buffer, not
        trained, not saved; with pos_embed='none', None."""
        num_positions = config.pos_prefix_tokens + self.patch_embed.num_patches
        if config.pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_positions, config.embed_dim))
        elif config.pos_embed == "none":
            self.pos_embed = None
        else:
            grid = self.patch_embed.grid_size
            table = fixed_pos_embed(
                config.pos_embed, grid, config.embed_dim, config.pos_prefix_tokens
            )
            self.register_buffer("pos_embed", table, persistent=False)

    def _add_pool_and_heads(self, config: ViTConfig) -> None:
        """The final norm, the attention pool (global_pool='map'), `fc_norm` and the heads."""
        has_norm = config.final_norm and not config.use_fc_norm
        self.norm = _norm(config) if has_norm else nn.Identity()
        self.attn_pool = None
        if config.global_pool == "map":
            self.attn_pool = AttentionPool(
                config.embed_dim,
                num_heads=config.num_heads,
                mlp_ratio=config.mlp_ratio,
                act_layer=config.act_layer,
                norm_layer=config.norm_layer,
                norm_eps=config.norm_eps,
                linear_layer=onednn.layer_classes()[1],
            )
        has_fc_norm = config.final_norm and config.use_fc_norm
        self.fc_norm = _norm(config) if has_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = self._build_head(config.num_classes)
        self.head_dist = self._build_head(config.num_classes) if config.distilled else None

    def _build_head(self, num_classes: int) -> nn.Module:
        """A linear classifier of the D features (also rebuilt by `reset_classifier`); the
        identity for num_classes=0."""
        return nn.Linear(self.embed_dim, num_classes) if num_classes else nn.Identity()

    # -- initialisation ---------------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self) -> None:
        """trunc-normal(0.02) weights and zero biases for Linear layers and the patch
        projection, LayerNorm ones/zeros; class token and learned positions per `token_init`;
        a conv stem gets the ResNet init (`ConvStem.reset_parameters`)."""
        for module in self.modules():
            _init_module(module)
        tokens = (self.cls_token, self.dist_token, self.reg_token, self.learned_pos_embed)
        for param in tokens:
            if param is None:
                continue
            if self.config.token_init == "zeros":
                nn.init.zeros_(param)
            else:
                trunc_normal_(param)
        if self.attn_pool is not None:
            trunc_normal_(self.attn_pool.latent, std=self.embed_dim**-0.5)
        if self.patch_embed.backbone is not None:
            self.patch_embed.backbone.reset_parameters()
        if self.config.res_post_norm and self.config.init_values is not None:
            for block in self.blocks:  # timm's ResPostBlock: the norms' scale starts there
                block.norm1.weight.fill_(self.config.init_values)
                block.norm2.weight.fill_(self.config.init_values)

    @property
    def learned_pos_embed(self) -> nn.Parameter | None:
        return self.pos_embed if self.config.pos_embed == "learn" else None

    def no_weight_decay(self) -> set[str]:
        """Parameter names AdamW must not decay (biases and norms are left to the optimiser's
        grouping, which skips every 1-D parameter)."""
        names = {"pos_embed", "cls_token", "dist_token", "reg_token"}
        return {name for name, _ in self.named_parameters() if name in names}

    def set_fast_path(self, enable: bool = True) -> bool:
        """Switch the CPU fast path on (the default) or off; returns whether it is on. It is
        `onednn.enable_fast_path`: a flag on the fast layers the model was built with
        (`OneDNNBlock`, `OneDNNLinear`, where torch has the kernels they call): oneDNN products
        in the blocks' Linear layers (training too) and a fused inference path (see
        `OneDNNBlock.fast_path_blocker` for when it runs); switching it off also frees the
        packed weight copies it keeps. `encoder='torch'` layers follow
        `torch.backends.mha.set_fastpath_enabled` instead."""
        return onednn.enable_fast_path(self, enable)

    def fast_path_in_use(self) -> bool:
        """Whether any layer would take the CPU fast path's kernels (`set_fast_path`)."""
        return onednn.fast_path_in_use(self)

    def describe_flow(self, input_size: tuple[int, ...]) -> FlowSpec:
        """This model's forward pass for an input of `input_size` (B, C, H, W), stage by
        stage, for `vitkit.summary.flow` to measure (flow.py)."""
        return describe_vit(self, input_size)

    # -- forward ----------------------------------------------------------------------------

    def position_embedding(self, grid: tuple[int, int]) -> Tensor | None:
        """The position embedding for a patch grid: the stored one at the native grid, else
        the learned grid resampled (bicubic) or the fixed table recomputed.

        A model without `dynamic_img_size` only takes its native size (the patch embedding
        checks it), so it uses the stored table as it is: no comparison for TorchScript or
        torch.fx to trip on. A symbolic grid (torch.export / ONNX export with dynamic sizes)
        is never compared with the native one, which would bake the native size into the
        graph; resampling to the native grid is the identity."""
        if self.pos_embed is None or not self.patch_embed.dynamic_img_size:
            return self.pos_embed
        if torch.jit.is_scripting():  # resampling is Python-side; a scripted model stays native
            if grid != self.patch_embed.grid_size:
                raise ValueError(
                    "a TorchScript model takes its img_size only; resize the input, or script "
                    "a model built at this size"
                )
            return self.pos_embed
        else:
            symbolic = not all(isinstance(side, int) for side in grid)
            if not symbolic and grid == self.patch_embed.grid_size:
                return self.pos_embed
            if self.pos_embed_kind == "learn":
                return resample_pos_embed(
                    self.pos_embed,
                    new_size=grid,
                    old_size=self.patch_embed.grid_size,
                    num_prefix_tokens=self.pos_prefix_tokens,
                    antialias=self.pos_embed_antialias,
                )
            kind, prefix = self.pos_embed_kind, self.pos_prefix_tokens
            return fixed_pos_embed(kind, grid, self.embed_dim, prefix).to(self.pos_embed)

    def embed(self, x: Tensor) -> Tensor:
        """Image (B, C, H, W) -> tokens with positions (B, P + N, D), through `norm_pre`: what
        the first block receives."""
        x, grid = self.patch_embed(x)  # (B, N, D)
        batch = x.shape[0]
        prefix: list[Tensor] = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(batch, -1, -1))
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(batch, -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(batch, -1, -1))
        pos_embed = self.position_embedding(grid)
        if pos_embed is not None and self.no_embed_class:
            x = x + pos_embed  # (B, N, D): positions for the patches only
        if len(prefix) > 0:
            x = torch.cat(prefix + [x], dim=1)  # (B, P + N, D)
        if pos_embed is not None and not self.no_embed_class:
            x = x + pos_embed
        return self.norm_pre(self.pos_drop(x))

    def encode(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Tokens (B, P + N, D) through every block, checkpointed when that is on and
        training. ViTDet's blocks (`spatial_blocks`) need the patch `grid` of the input: they
        run on the tokens as maps (B, H, W, D)."""
        shape = x.shape
        if self.spatial_blocks:
            if grid is None:
                raise ValueError(
                    "window attention and relative positions need the patch grid: call "
                    "encode(tokens, grid); they cannot run on a subset of the patches (MAE)"
                )
            x = x.reshape(shape[0], grid[0], grid[1], shape[2])  # (B, H/ph, W/pw, D)
        if not torch.jit.is_scripting():  # TorchScript has no activation checkpointing
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                for block in self.block_list():
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                return x.reshape(shape)
        x = self.blocks(x)
        return x.reshape(shape) if self.spatial_blocks else x

    def spatial_grid(self, x: Tensor) -> tuple[int, int] | None:
        """The patch grid of images `x` where the blocks need it (`spatial_blocks`), else
        None: the plain path computes nothing more."""
        if not self.spatial_blocks:
            return None
        if torch.jit.is_scripting():
            raise ValueError("window attention and relative positions need the eager model")
        else:
            return self.patch_embed.grid_for(x.shape[-2], x.shape[-1])

    def block_list(self) -> list[nn.Module]:
        """The encoder blocks in order (native blocks, or `nn.TransformerEncoderLayer`s)."""
        return list(self.blocks.layers if self.config.encoder == "torch" else self.blocks)

    def forward_features(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """All tokens after the final norm, (B, P + N, D); with `return_attention`, also each
        block's attention weights, a list of (B, heads, P + N, P + N)."""
        if not torch.jit.is_scripting():  # TorchScript compiles the plain path only
            if return_attention:
                return self.features_with_attention(x)
        elif return_attention:
            raise ValueError("return_attention=True needs the eager model, not TorchScript")
        return self.norm(self.encode(self.embed(x), self.spatial_grid(x)))

    def features_with_attention(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """`forward_features` and each block's attention weights (B, heads, P + N, P + N)."""
        if self.config.encoder != "native":
            raise ValueError(
                "return_attention=True needs encoder='native'; nn.TransformerEncoderLayer "
                "does not expose its attention weights"
            )
        grid = self.spatial_grid(x)
        x = self.embed(x)
        shape = x.shape
        if grid is not None:
            x = x.reshape(shape[0], grid[0], grid[1], shape[2])  # (B, H/ph, W/pw, D)
        attentions: list[Tensor] = []
        for block in self.blocks:
            x, weights = block.forward_with_weights(x)
            attentions.append(weights)
        return self.norm(x.reshape(shape)), attentions

    def pool(self, x: Tensor) -> Tensor:
        """Tokens (B, P + N, D) -> one vector per image (B, D), after `fc_norm`; with
        global_pool='none', every token (B, P + N, D)."""
        if self.global_pool == "none":
            return self.fc_norm(x)
        if self.attn_pool is None or self.global_pool == "token":
            return self.fc_norm(
                pool_tokens(x, self.global_pool, self.num_prefix_tokens, self.pool_include_prefix)
            )
        if not self.pool_include_prefix:
            x = x[:, self.num_prefix_tokens :]  # (B, N, D)
        return self.fc_norm(self.attn_pool(x))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens (B, P + N, D) -> logits (B, num_classes), or the pooled (B, D) features.

        A distilled model averages its class and distillation heads, as DeiT does at test time.
        """
        pooled = self.head_drop(self.pool(x))
        if pre_logits:
            return pooled
        logits = self.head(pooled)
        if self.head_dist is not None:
            logits = (logits + self.head_dist(self.head_drop(self.fc_norm(x[:, 1])))) / 2
        return logits

    def forward_distill(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """DeiT training: logits of the class head and of the distillation head, separately."""
        if self.head_dist is None:
            raise ValueError("forward_distill needs a model built with distilled=True")
        x = self.norm(self.encode(self.embed(x), self.spatial_grid(x)))
        cls_logits = self.head(self.head_drop(self.pool(x)))
        dist_logits = self.head_dist(self.head_drop(self.fc_norm(x[:, 1])))
        return cls_logits, dist_logits

    def forward(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, num_classes); with `return_attention`, also every block's weights."""
        if not torch.jit.is_scripting():  # TorchScript compiles the plain path only
            if isinstance(return_attention, torch.fx.Proxy):
                return_attention = False  # torch.fx makes every argument a proxy: trace logits
            if return_attention:
                feats, attentions = self.features_with_attention(x)
                return self.forward_head(feats), attentions
        elif return_attention:
            raise ValueError("return_attention=True needs the eager model, not TorchScript")
        return self.forward_head(self.norm(self.encode(self.embed(x), self.spatial_grid(x))))


def _resolve_config(config: ViTConfig | None, options: dict[str, Any]) -> ViTConfig:
    """The config from `VisionTransformer`'s arguments (a config, options, or a config with
    overrides), checked for what `encoder='torch'` cannot build."""
    if config is None:
        config = ViTConfig.from_dict(options)
    elif options:
        config = config.replace(**options)
    if config.encoder == "torch":
        check_torch_encoder_options(
            attn_drop_rate=config.attn_drop_rate,
            drop_rate=config.drop_rate,
            drop_path_rate=config.drop_path_rate,
            init_values=config.init_values,
            qk_scale=config.qk_scale,
            qkv_bias=config.qkv_bias,
        )
    return config


def _norm(config: ViTConfig) -> nn.Module:
    """A norm layer of `config`'s kind over the D features."""
    return make_norm(config.norm_layer, config.embed_dim, config.norm_eps)


def _build_blocks(config: ViTConfig) -> nn.Module:
    """`depth` encoder blocks, the stochastic depth rate rising linearly to `drop_path_rate`;
    with encoder='torch', an `nn.TransformerEncoder`."""
    if config.encoder != "native":
        return build_torch_encoder(
            dim=config.embed_dim,
            depth=config.depth,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            dropout=config.drop_rate,
            norm_eps=config.norm_eps,
        )
    last = max(config.depth - 1, 1)
    drop_path = [config.drop_path_rate * i / last for i in range(config.depth)]
    return nn.Sequential(*[_build_block(config, rate, i) for i, rate in enumerate(drop_path)])


def _build_block(config: ViTConfig, drop_path: float, index: int) -> nn.Module:
    """One pre-norm block, or a `ResPostBlock` (norm after each branch) with res_post_norm.
    The CPU fast path's classes (`onednn.layer_classes`: `OneDNNBlock`, `OneDNNLinear`) where
    this torch can run them, else the plain `Block` and `nn.Linear`; ViTDet's `WindowBlock`
    (global attention in `global_blocks`) with window attention or relative positions."""
    block_class, linear_layer = onednn.layer_classes()
    if config.block != "plain" or config.attn_layer != "attn":  # layers/parallel.py
        return build_block_variant(config, drop_path, index, linear_layer)
    spatial: dict[str, Any] = {}
    if config.res_post_norm:
        block_class = ResPostBlock
    elif config.window_size or config.use_rel_pos:
        block_class = WindowBlock
        spatial["window_size"] = 0 if index in config.global_blocks else config.window_size
        spatial["rel_pos"] = config.rel_pos_grid if config.use_rel_pos else None
    return block_class(
        config.embed_dim,
        **spatial,
        num_heads=config.num_heads,
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        qk_scale=config.qk_scale,
        proj_drop=config.drop_rate,
        attn_drop=config.attn_drop_rate,
        drop_path=drop_path,
        init_values=None if config.res_post_norm else config.init_values,
        norm_eps=config.norm_eps,
        norm_layer=config.norm_layer,
        act_layer=config.act_layer,
        mlp_layer=config.mlp_layer,
        qk_norm=config.qk_norm,
        scale_attn_norm=config.scale_attn_norm,
        scale_mlp_norm=config.scale_mlp_norm,
        proj_bias=config.proj_bias,
        linear_layer=linear_layer,
    )


def _init_module(module: nn.Module) -> None:
    """The paper's init of one layer (timm's `init_weights_vit_timm`): trunc-normal(0.02)
    weights, zero biases, unit norms, LayerScale at its `init_values`."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        trunc_normal_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.RMSNorm):
        nn.init.ones_(module.weight)
    elif isinstance(module, LayerScale):
        module.gamma.fill_(module.init_values)
    elif isinstance(module, nn.MultiheadAttention):
        trunc_normal_(module.in_proj_weight)
        nn.init.zeros_(module.in_proj_bias)
