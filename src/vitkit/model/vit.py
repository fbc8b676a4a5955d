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

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from . import onednn
from .config import ViTConfig
from .layers import (
    AttentionPool,
    Block,
    LayerScale,
    PatchEmbed,
    ResPostBlock,
    conv_to_unfold_weight,
    make_norm,
    unfold_to_conv_weight,
)
from .pos_embed import fixed_pos_embed, resample_patch_embed, resample_pos_embed
from .torch_encoder import build_torch_encoder, check_torch_encoder_options

_NEEDS_PLAIN = "{tool} needs the plain modules; call model.set_fast_path(False) first"


@torch.no_grad()
def trunc_normal_(tensor: Tensor, std: float = 0.02) -> Tensor:
    """Normal(0, std) truncated at two standard deviations, by inverse-CDF sampling.

    The same distribution as `nn.init.trunc_normal_`, written in place in one pass: PyTorch's
    version is an order of magnitude slower on CPU, which dominates building large models.
    """
    bound = math.erf(2 / math.sqrt(2))  # erf-space image of [-2 std, 2 std]
    tensor.uniform_(-bound, bound).erfinv_().mul_(std * math.sqrt(2.0))
    return tensor.clamp_(-2 * std, 2 * std)


class VisionTransformer(nn.Module):
    """ViT: `VisionTransformer(**options)` or `VisionTransformer(ViTConfig(...))`.

    The options are `ViTConfig`'s fields (names as in timm); state-dict keys follow timm's
    (`patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.N.attn.qkv`, `norm`, `head`, ...).
    """

    # Python-side only (they read `config`): TorchScript compiles properties otherwise.
    __jit_unused_properties__ = ["learned_pos_embed", "pretrained_cfg", "default_cfg"]

    def __init__(self, config: ViTConfig | None = None, /, **options: Any) -> None:
        super().__init__()
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
        self.config = config
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
        norm = config.norm_layer, dim, config.norm_eps

        self.patch_embed = PatchEmbed(
            img_size=config.img_size,
            patch_size=config.patch_size,
            in_chans=config.in_chans,
            embed_dim=dim,
            kind=config.patch_embed,
            norm=config.embed_norm,
            norm_eps=config.norm_eps,
            norm_layer=config.norm_layer,
            dynamic_img_size=config.dynamic_img_size,
            dynamic_img_pad=config.dynamic_img_pad,
            conv_stem=config.conv_stem,
            bias=config.patch_bias,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.distilled else None
        self.reg_token = None
        if config.reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, dim))
        num_positions = config.pos_prefix_tokens + self.patch_embed.num_patches
        if config.pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_positions, dim))
        elif config.pos_embed == "none":
            self.pos_embed = None
        else:  # a fixed table: a buffer, not trained, not saved
            table = fixed_pos_embed(
                config.pos_embed, self.patch_embed.grid_size, dim, config.pos_prefix_tokens
            )
            self.register_buffer("pos_embed", table, persistent=False)
        self.pos_drop = nn.Dropout(config.drop_rate)
        self.norm_pre = make_norm(*norm) if config.pre_norm else nn.Identity()

        if config.encoder == "native":
            last = max(config.depth - 1, 1)
            drop_path = [config.drop_path_rate * i / last for i in range(config.depth)]
            block_class = ResPostBlock if config.res_post_norm else Block
            self.blocks = nn.Sequential(
                *[
                    block_class(
                        dim,
                        num_heads=config.num_heads,
                        mlp_ratio=config.mlp_ratio,
                        qkv_bias=config.qkv_bias,
                        qk_scale=config.qk_scale,
                        proj_drop=config.drop_rate,
                        attn_drop=config.attn_drop_rate,
                        drop_path=drop_path[i],
                        init_values=None if config.res_post_norm else config.init_values,
                        norm_eps=config.norm_eps,
                        norm_layer=config.norm_layer,
                        act_layer=config.act_layer,
                        mlp_layer=config.mlp_layer,
                        qk_norm=config.qk_norm,
                        scale_attn_norm=config.scale_attn_norm,
                        scale_mlp_norm=config.scale_mlp_norm,
                        proj_bias=config.proj_bias,
                    )
                    for i in range(config.depth)
                ]
            )
        else:
            self.blocks = build_torch_encoder(
                dim=dim,
                depth=config.depth,
                num_heads=config.num_heads,
                mlp_ratio=config.mlp_ratio,
                dropout=config.drop_rate,
                norm_eps=config.norm_eps,
            )
        use_fc_norm = config.use_fc_norm
        has_norm = config.final_norm and not use_fc_norm
        self.norm = make_norm(*norm) if has_norm else nn.Identity()
        self.attn_pool = None
        if config.global_pool == "map":
            self.attn_pool = AttentionPool(
                dim,
                num_heads=config.num_heads,
                mlp_ratio=config.mlp_ratio,
                act_layer=config.act_layer,
                norm_layer=config.norm_layer,
                norm_eps=config.norm_eps,
            )
        has_fc_norm = config.final_norm and use_fc_norm
        self.fc_norm = make_norm(*norm) if has_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(dim, config.num_classes) if config.num_classes else nn.Identity()
        self.head_dist = None
        if config.distilled:
            self.head_dist = (
                nn.Linear(dim, config.num_classes) if config.num_classes else nn.Identity()
            )
        red_h, red_w = self.patch_embed.reduction  # image pixels per token
        reduction: int | tuple[int, int] = red_h if red_h == red_w else (red_h, red_w)
        prefix = "blocks.layers" if config.encoder == "torch" else "blocks"
        # timm's per-block feature description (`FeatureInfo` reads it).
        self.feature_info: list[dict[str, Any]] = [
            {"module": f"{prefix}.{i}", "num_chs": dim, "reduction": reduction}
            for i in range(config.depth)
        ]
        self.data_config: Any = None  # how inputs are prepared: set by the weight loaders
        self._pretrained_cfg: dict[str, Any] | None = None
        self.init_weights()
        self.set_fast_path(True)

    # -- initialisation ---------------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self) -> None:
        """trunc-normal(0.02) weights and zero biases for Linear layers and the patch
        projection, LayerNorm ones/zeros; class token and learned positions per `token_init`;
        a conv stem gets the ResNet init (`ConvStem.reset_parameters`)."""
        for module in self.modules():
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

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass: less activation memory, same gradients."""
        self.grad_checkpointing = enable

    def set_fast_path(self, enable: bool = True) -> bool:
        """Swap the CPU fast path into every native block (the default for a new model) or
        back out; returns whether it is in use. It is `onednn.enable_fast_path`: oneDNN
        products in the blocks' Linear layers (training too) and a fused inference path (see
        `OneDNNBlock.fast_path_blocker` for when it runs); switching it off also frees the
        packed weight copies it keeps. Where torch lacks the kernels it needs, the plain
        modules stay. `encoder='torch'` layers follow `torch.backends.mha.set_fastpath_enabled`
        instead."""
        return onednn.enable_fast_path(self, enable)

    def fast_path_in_use(self) -> bool:
        """Whether any block runs the CPU fast path (`set_fast_path`)."""
        return any(isinstance(m, onednn.OneDNNBlock) for m in self.blocks.modules())

    def __prepare_scriptable__(self) -> VisionTransformer:
        """Called by `torch.jit.script`: the fast path's modules are Python-only."""
        if self.fast_path_in_use():
            raise ValueError(_NEEDS_PLAIN.format(tool="torch.jit.script"))
        return self

    # -- timm's model API -------------------------------------------------------------------

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's `pretrained_cfg`: how inputs are prepared (the loaded weights' data config,
        else timm's ViT default: mean = std = 0.5, bicubic, crop 0.9) and where the first conv
        and the classifier are, so `timm.data.resolve_data_config(model=model)` works."""
        if self._pretrained_cfg is not None:
            return self._pretrained_cfg
        chans, (height, width) = self.config.in_chans, self.patch_embed.img_size
        data = {
            "input_size": (chans, height, width),
            "interpolation": "bicubic",
            "crop_pct": 0.9,
            "crop_mode": "center",
            "mean": (0.5,) * chans,
            "std": (0.5,) * chans,
        }
        if self.data_config is not None:
            data = {key: getattr(self.data_config, key) for key in data}
        return {
            **data,
            "fixed_input_size": not self.patch_embed.dynamic_img_size,
            "num_classes": self.num_classes,
            "pool_size": None,
            "first_conv": "patch_embed.proj",
            "classifier": ("head", "head_dist") if self.head_dist is not None else "head",
        }

    @pretrained_cfg.setter
    def pretrained_cfg(self, value: dict[str, Any]) -> None:
        self._pretrained_cfg = dict(value)

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name for `pretrained_cfg`."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, value: dict[str, Any]) -> None:
        self.pretrained_cfg = value

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter-name patterns of timm's layer groups (the embedding stem, then each block,
        the final norm last), as timm's layer-wise learning-rate decay reads them."""
        blocks = r"^blocks\.layers\.(\d+)" if self.config.encoder == "torch" else r"^blocks\.(\d+)"
        return {
            "stem": r"^cls_token|dist_token|reg_token|pos_embed|patch_embed|norm_pre",
            "blocks": [(blocks, None), (r"^norm", (99999,))],
        }

    def prune_intermediate_layers(
        self,
        indices: int | list[int] | tuple[int, ...] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the blocks after the last of `indices` (and the final norm, and the pooling and
        head) for a backbone that only reads intermediates, as timm's; returns the kept block
        indices, counted from the start. `config` follows (depth, norms, head)."""
        blocks = self.block_list()
        take = take_indices(len(blocks), indices)
        depth = max(take) + 1
        if self.config.encoder == "torch":
            self.blocks.layers = self.blocks.layers[:depth]
            self.blocks.num_layers = depth
        else:
            self.blocks = self.blocks[:depth]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "none")
        has_norm = not isinstance(self.norm, nn.Identity)
        has_fc_norm = not isinstance(self.fc_norm, nn.Identity)
        self.config = self.config.replace(
            depth=depth, final_norm=has_norm or has_fc_norm, fc_norm=has_fc_norm
        )
        return take

    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        patch_size: int | tuple[int, int] | None = None,
    ) -> None:
        """Take another image size and / or patch size from now on, as timm's: the learned
        position grid is resampled (bicubic) and, for a new patch size, the patch projection
        too (FlexiViT's PI-resize, `resample_patch_embed`); fixed tables are recomputed."""
        old_grid = self.patch_embed.grid_size
        config = self.config.replace(
            img_size=self.config.img_size if img_size is None else img_size,
            patch_size=self.config.patch_size if patch_size is None else patch_size,
        )
        old = self.patch_embed
        new = PatchEmbed(
            img_size=config.img_size,
            patch_size=config.patch_size,
            in_chans=config.in_chans,
            embed_dim=self.embed_dim,
            kind=config.patch_embed,
            norm=config.embed_norm,
            norm_eps=config.norm_eps,
            norm_layer=config.norm_layer,
            dynamic_img_size=config.dynamic_img_size,
            dynamic_img_pad=config.dynamic_img_pad,
            conv_stem=config.conv_stem,
            bias=config.patch_bias,
        )
        state = old.state_dict()
        if new.patch_size != old.patch_size:
            proj_chans = old.backbone.out_chans if old.backbone is not None else old.in_chans
            kernel = unfold_to_conv_weight(old.proj.weight, proj_chans, old.patch_size)
            kernel = resample_patch_embed(kernel.detach(), new.patch_size)  # (D, C, ph', pw')
            state["proj.weight"] = kernel if new.kind == "conv" else conv_to_unfold_weight(kernel)
        new.load_state_dict(state)
        self.patch_embed = new.to(old.proj.weight.device).train(old.training)
        self.config = config
        red_h, red_w = new.reduction
        for entry in self.feature_info:  # the maps' stride follows the patch size
            entry["reduction"] = red_h if red_h == red_w else (red_h, red_w)
        grid = new.grid_size
        if self.pos_embed_kind == "learn" and grid != old_grid:
            table = resample_pos_embed(
                self.pos_embed.detach(),
                new_size=grid,
                old_size=old_grid,
                num_prefix_tokens=self.pos_prefix_tokens,
            )
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        elif self.pos_embed is not None and grid != old_grid:
            fixed = fixed_pos_embed(
                self.pos_embed_kind, grid, self.embed_dim, self.pos_prefix_tokens
            )
            self.pos_embed = fixed.to(self.pos_embed)  # a buffer: assignment keeps it one

    def get_classifier(self) -> nn.Module:
        """The classification head (timm's API)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh head (and distillation head) for `num_classes` outputs, for fine-tuning;
        `global_pool` also changes the pooling, as timm's (the attention pool can be dropped
        by another pooling, not added; the norm stays where it is; timm's '' is 'none')."""
        if global_pool == "":
            global_pool = "none"
        if global_pool is not None and global_pool != self.global_pool:
            if global_pool == "map":
                raise ValueError(
                    "reset_classifier cannot add an attention pool; build the model with "
                    "global_pool='map'"
                )
            self.config = self.config.replace(
                global_pool=global_pool, fc_norm=self.config.use_fc_norm
            )
            self.global_pool = global_pool
            self.attn_pool = None
        self.config = self.config.replace(num_classes=num_classes)
        self.num_classes = num_classes
        for name in ("head", "head_dist"):
            if getattr(self, name) is None:
                continue
            head = nn.Linear(self.embed_dim, num_classes) if num_classes else nn.Identity()
            if isinstance(head, nn.Linear):
                trunc_normal_(head.weight)
                nn.init.zeros_(head.bias)
            setattr(self, name, head.to(self.patch_embed.proj.weight.device))

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

    def encode(self, x: Tensor) -> Tensor:
        """Tokens (B, P + N, D) through every block, checkpointed when that is on and
        training."""
        if not torch.jit.is_scripting():  # TorchScript has no activation checkpointing
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                for block in self.block_list():
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                return x
        return self.blocks(x)

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
        return self.norm(self.encode(self.embed(x)))

    def features_with_attention(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """`forward_features` and each block's attention weights (B, heads, P + N, P + N)."""
        if self.config.encoder != "native":
            raise ValueError(
                "return_attention=True needs encoder='native'; nn.TransformerEncoderLayer "
                "does not expose its attention weights"
            )
        x = self.embed(x)
        attentions: list[Tensor] = []
        for block in self.blocks:
            x, weights = block.forward_with_weights(x)
            attentions.append(weights)
        return self.norm(x), attentions

    def pool(self, x: Tensor) -> Tensor:
        """Tokens (B, P + N, D) -> one vector per image (B, D), after `fc_norm`; with
        global_pool='none', every token (B, P + N, D)."""
        if self.global_pool == "token":
            return self.fc_norm(x[:, 0])
        if self.global_pool == "none":
            return self.fc_norm(x)
        if not self.pool_include_prefix:
            x = x[:, self.num_prefix_tokens :]  # (B, N, D)
        if self.attn_pool is not None:
            x = self.attn_pool(x)
        elif self.global_pool == "avg":
            x = x.mean(dim=1)
        elif self.global_pool == "max":
            x = x.amax(dim=1)
        else:  # avgmax
            x = 0.5 * (x.amax(dim=1) + x.mean(dim=1))
        return self.fc_norm(x)

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
        x = self.norm(self.encode(self.embed(x)))
        cls_logits = self.head(self.head_drop(self.pool(x)))
        dist_logits = self.head_dist(self.head_drop(self.fc_norm(x[:, 1])))
        return cls_logits, dist_logits

    def forward(
        self, x: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, num_classes); with `return_attention`, also every block's weights."""
        if not torch.jit.is_scripting():  # TorchScript compiles the plain path only
            if isinstance(x, torch.fx.Proxy) and self.fast_path_in_use():
                raise ValueError(_NEEDS_PLAIN.format(tool="torch.fx tracing"))
            if isinstance(return_attention, torch.fx.Proxy):
                return_attention = False  # torch.fx makes every argument a proxy: trace logits
            if return_attention:
                feats, attentions = self.features_with_attention(x)
                return self.forward_head(feats), attentions
        elif return_attention:
            raise ValueError("return_attention=True needs the eager model, not TorchScript")
        return self.forward_head(self.norm(self.encode(self.embed(x))))

    # -- intermediate features --------------------------------------------------------------

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
        """The outputs of chosen blocks, as feature maps (backbones, probing, dense tasks).

        Conventions follow timm's `forward_intermediates`, except that the intermediates come
        back in the order `indices` asks for them.

        Args:
            x: images (B, C, H, W).
            indices: None for every block, an int n for the last n blocks, or a list of block
                indices (negative ones count from the end).
            norm: apply the final norm (`model.norm`) to each intermediate.
            output_fmt: 'NCHW' for maps (B, D, H/ph, W/pw) with the prefix (class /
                distillation) tokens split off, or 'NLC' for the patch tokens (B, N, D).
            return_prefix_tokens: make each intermediate a pair (features, prefix tokens
                (B, P, D)).
            intermediates_only: return only the list of intermediates.
            stop_early: skip the blocks after the last one asked for (needs
                `intermediates_only`, since there are then no final features).

        Returns:
            `(final, intermediates)`: `final` is `forward_features(x)`, (B, P + N, D); or just
            `intermediates` with `intermediates_only=True`.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        if stop_early and not intermediates_only:
            raise ValueError(
                "stop_early=True skips the last blocks, so there are no final features; "
                "pass intermediates_only=True with it"
            )
        blocks = self.block_list()
        take = take_indices(len(blocks), indices)
        if stop_early:
            blocks = blocks[: max(take) + 1]
        tokens = self.embed(x)  # (B, P + N, D); checks the input first
        batch, grid = x.shape[0], self.patch_embed.grid_for(*x.shape[-2:])
        outputs: dict[int, Tensor] = {}
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(blocks):
            if checkpointing:
                tokens = torch.utils.checkpoint.checkpoint(block, tokens, use_reentrant=False)
            else:
                tokens = block(tokens)
            if i in take:
                outputs[i] = self.norm(tokens) if norm else tokens

        intermediates: list[Any] = []
        for i in take:
            prefix = outputs[i][:, : self.num_prefix_tokens]  # (B, P, D)
            feats = outputs[i][:, self.num_prefix_tokens :]  # (B, N, D)
            if output_fmt == "NCHW":
                feats = feats.reshape(batch, grid[0], grid[1], -1)  # (B, H/ph, W/pw, D)
                feats = feats.permute(0, 3, 1, 2).contiguous()  # (B, D, H/ph, W/pw)
            intermediates.append((feats, prefix) if return_prefix_tokens else feats)
        if intermediates_only:
            return intermediates
        return self.norm(tokens), intermediates

    def get_intermediate_layers(
        self,
        x: Tensor,
        n: int | list[int] | tuple[int, ...] = 1,
        *,
        reshape: bool = False,
        norm: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[Any]:
        """DINO's interface: the last `n` blocks' patch tokens (B, N, D), or maps
        (B, D, H/ph, W/pw) with `reshape`; `n` may also be a list of block indices."""
        return self.forward_intermediates(
            x,
            n,
            norm=norm,
            output_fmt="NCHW" if reshape else "NLC",
            return_prefix_tokens=return_prefix_tokens,
            intermediates_only=True,
            stop_early=True,
        )


def take_indices(num_blocks: int, indices: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """Resolve `indices` (None: all, int n: the last n, list: those, negative from the end)
    to block positions 0..num_blocks-1, in the order asked."""
    if indices is None:
        return list(range(num_blocks))
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(
                f"indices={indices} asks for the last {indices} blocks of a model with "
                f"{num_blocks}; pass an int from 1 to {num_blocks}, or a list of block indices"
            )
        return list(range(num_blocks - indices, num_blocks))
    resolved = []
    for index in indices:
        if not -num_blocks <= index < num_blocks:
            raise ValueError(
                f"block index {index} is out of range for a model with {num_blocks} blocks; "
                f"use 0 to {num_blocks - 1}, or -{num_blocks} to -1 from the end"
            )
        resolved.append(index % num_blocks)
    if not resolved:
        raise ValueError("indices is empty; pass at least one block index")
    return resolved
