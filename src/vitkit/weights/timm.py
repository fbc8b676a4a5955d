"""Weights from and to timm's `VisionTransformer` (timm `models/vision_transformer.py`, and
`models/deit.py` for the distilled DeiT).

timm's keys are vitkit's own (`patch_embed.proj`, `blocks.N.attn.qkv`, `head`, ...), so
`from_timm` renames nothing: it strips a DDP `module.` prefix, renames `encoder='torch'` blocks,
infers the config and checks every key and shape (`layout.py`). `to_timm` writes what vitkit
can hold but timm cannot as timm's equivalent: a fixed position table as a learned one, an
unfold patch embedding as the convolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import Tensor, nn

from ..model import ViTConfig
from ..model.pos_embed import fixed_pos_embed
from ..model.torch_encoder import torch_to_native_state_dict
from .layout import check_state_dict, infer_config, native_state_dict, strip_prefix


def from_timm(
    state_dict: Mapping[str, Tensor], *, num_heads: int | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A timm `vit_*` / `deit_*` state dict: the keys are vitkit's, so this infers the config
    and checks every key and shape. `overrides` are `ViTConfig` fields the weights cannot show
    (e.g. `global_pool`, `img_size` for a non-square grid, `norm_eps`)."""
    sd = strip_prefix(state_dict, "module.")
    if any(k.startswith("blocks.layers.") for k in sd):  # vitkit encoder='torch' weights
        sd = torch_to_native_state_dict(sd)
    config = infer_config(sd, num_heads=num_heads, **overrides)
    check_state_dict(sd, config, "timm")
    return sd, config


def to_timm(
    model_or_state_dict: nn.Module | Mapping[str, Tensor], config: ViTConfig | None = None
) -> dict[str, Tensor]:
    """A state dict that timm's `VisionTransformer(**timm_kwargs(config))` loads strictly.

    A fixed (sinusoid / sincos2d) position table is written as timm's learned `pos_embed`,
    and an unfold patch embedding as timm's convolution: the same function either way.
    """
    sd, config = native_state_dict(model_or_state_dict, config)
    _check_no_conv_stem(config)
    if config.pos_embed in ("sinusoid", "sincos2d"):
        sd["pos_embed"] = fixed_pos_embed(
            config.pos_embed, config.grid_size, config.embed_dim, config.num_prefix_tokens
        )
    return sd


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments for timm's `VisionTransformer` (or `VisionTransformerDistilled` when
    `config.distilled`) that build the same architecture as `config`."""
    _check_no_conv_stem(config)
    kwargs: dict[str, Any] = {
        "img_size": config.img_size,
        "patch_size": config.patch_size,
        "in_chans": config.in_chans,
        "num_classes": config.num_classes,
        "global_pool": config.global_pool,
        "embed_dim": config.embed_dim,
        "depth": config.depth,
        "num_heads": config.num_heads,
        "mlp_ratio": config.mlp_ratio,
        "qkv_bias": config.qkv_bias,
        "init_values": config.init_values,
        "class_token": config.class_token,
        "fc_norm": config.fc_norm,
        "pos_embed": "none" if config.pos_embed == "none" else "learn",
        "dynamic_img_size": config.dynamic_img_size,
        "norm_layer": partial(nn.LayerNorm, eps=config.norm_eps),
    }
    if config.embed_norm:
        kwargs["embed_norm_layer"] = partial(nn.LayerNorm, eps=config.norm_eps)
    if config.qk_scale is not None:
        raise ValueError("timm's ViT has no qk_scale option; use qk_scale=None")
    return kwargs


def _check_no_conv_stem(config: ViTConfig) -> None:
    if config.conv_stem:
        raise ValueError(
            "timm's VisionTransformer has no conv stem like vitkit's conv_stem (its hybrids use "
            "ResNet backbones); only models with conv_stem=() convert to timm"
        )
