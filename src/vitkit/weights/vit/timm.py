"""Weights from and to timm's `VisionTransformer` (timm `models/vision_transformer.py`, and
`models/deit.py` for the distilled DeiT).

timm's keys are vitkit's own (`patch_embed.proj`, `blocks.N.attn.qkv`, `head`, ...), so
`from_timm` renames nothing: it strips a DDP `module.` prefix, renames `encoder='torch'` blocks,
infers the config and checks every key and shape (`layout.py`). `to_timm` writes what vitkit
can hold but timm cannot as timm's equivalent: a fixed position table as a learned one, an
unfold patch embedding as the convolution.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import Tensor, nn

from ...model import ViTConfig, get_config
from ...model.layers import mlp_hidden_width
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import fixed_pos_embed
from ...model.vit.torch_encoder import torch_to_native_state_dict
from ..checkpoint import ArchMismatchError, strip_prefix
from .layout import check_state_dict, infer_config, native_state_dict

log = logging.getLogger(__name__)

# What a timm model name tells and its weights do not: the `ViTConfig` fields `arch=` supplies.
ARCH_FIELDS = (
    "num_heads",
    "act_layer",
    "res_post_norm",
    "norm_eps",
    "global_pool",
    "fc_norm",
    "pool_include_prefix",
    "no_embed_class",
    "dynamic_img_size",
    "dynamic_img_pad",
)


def arch_options(arch: str) -> dict[str, Any]:
    """The options of timm model `arch` (a name of `vitkit.list_models()`) its weights cannot
    show; a ValueError naming the problem for another name."""
    config = get_config(arch)
    return {name: getattr(config, name) for name in ARCH_FIELDS}


# The sizes a timm model name fixes and the weights show: an `arch=` that differs in one of
# them names another model.
_ARCH_SIZES: dict[str, Any] = {
    "embed_dim": lambda c: c.embed_dim,
    "depth": lambda c: c.depth,
    "patch_size": lambda c: to_2tuple(c.patch_size, "patch_size"),
    "MLP width": lambda c: mlp_hidden_width(c.mlp_layer, c.embed_dim, c.mlp_ratio),
    "mlp_layer": lambda c: c.mlp_layer,
    "reg_tokens": lambda c: c.reg_tokens,
}


def check_arch(config: ViTConfig, arch: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Refuse `arch` (a timm model name, with `overrides` of its `ViTConfig` fields) for
    weights of `config` when its sizes differ: an `ArchMismatchError` naming them."""
    fields = set(ViTConfig.__dataclass_fields__)
    named = get_config(arch).replace(**{k: v for k, v in (overrides or {}).items() if k in fields})
    differences = [
        f"{name} {size(config)} ({arch}: {size(named)})"
        for name, size in _ARCH_SIZES.items()
        if size(config) != size(named)
    ]
    if differences:
        raise ArchMismatchError(arch, ", ".join(differences))


def from_timm(
    state_dict: Mapping[str, Tensor],
    *,
    num_heads: int | None = None,
    arch: str | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A timm `VisionTransformer` state dict: the keys are vitkit's, so this infers the config
    and checks every key and shape.

    Args:
        state_dict: the weights.
        num_heads: the head count, which timm's weights do not record.
        arch: the timm model name the weights belong to (e.g.
            'vit_base_patch16_siglip_gap_224'): it supplies what the weights cannot show
            (`ARCH_FIELDS`: heads, activation, pre- or post-norm blocks, norm epsilon, pooling).
        overrides: `ViTConfig` fields, over both (e.g. `img_size` for a non-square grid).
    """
    sd = strip_prefix(state_dict, "module.")
    if any(k.startswith("blocks.layers.") for k in sd):  # vitkit encoder='torch' weights
        sd = torch_to_native_state_dict(sd)
    options = arch_options(arch) if arch is not None else {}
    if arch is None:
        log.info(
            "timm weights without their model name (arch): assuming exact GELU, pre-norm "
            "blocks and the norm epsilon %s, which the weights do not record",
            overrides.get("norm_eps", 1e-6),
        )
    if num_heads is not None:
        options["num_heads"] = num_heads
    if arch is not None and "img_size" not in overrides:
        options.update(_named_img_size(sd, get_config(arch)))
    config = infer_config(sd, **{**options, **overrides})
    check_state_dict(sd, config, "timm")
    return sd, config


def _named_img_size(sd: Mapping[str, Tensor], named: ViTConfig) -> dict[str, Any]:
    """The size of a named model where the weights cannot tell it: without a position
    embedding (ViTamin-XL), or with the grid of a model whose grid drops pixels (`floor_grid`:
    384 in patches of 14), which alone would give 378; else nothing."""
    size = {"img_size": named.img_size, **({"floor_grid": True} if named.floor_grid else {})}
    if "pos_embed" not in sd:
        return size
    if not named.floor_grid:
        return {}
    patches = named.grid_size[0] * named.grid_size[1]
    if sd["pos_embed"].shape[1] not in (patches, patches + named.num_prefix_tokens):
        return {}
    return size


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
    from timm import layers as timm_layers  # timm is needed only to build its model
    from timm.models import vision_transformer as timm_vit

    norm = timm_layers.RmsNorm if config.norm_layer == "rmsnorm" else nn.LayerNorm
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
        "norm_layer": partial(norm, eps=config.norm_eps),
    }
    if config.global_pool == "none":
        kwargs["global_pool"] = ""
    if config.embed_norm:
        kwargs["embed_norm_layer"] = partial(norm, eps=config.norm_eps)
    if config.qk_scale is not None:
        raise ValueError("timm's ViT has no qk_scale option; use qk_scale=None")
    if not config.patch_bias and not config.pre_norm:
        raise ValueError("timm's ViT drops the patch bias only with pre_norm=True (CLIP)")
    if config.pre_norm and config.patch_bias:
        raise ValueError("timm's ViT with pre_norm=True has no patch bias; use patch_bias=False")
    extra = {
        "reg_tokens": config.reg_tokens,
        "no_embed_class": config.no_embed_class,
        "pre_norm": config.pre_norm,
        "final_norm": config.final_norm,
        "dynamic_img_pad": config.dynamic_img_pad,
        "pool_include_prefix": config.pool_include_prefix,
        "qk_norm": config.qk_norm,
        "scale_attn_norm": config.scale_attn_norm,
        "scale_mlp_norm": config.scale_mlp_norm,
        "proj_bias": config.proj_bias,
    }
    kwargs.update(
        {k: v for k, v in extra.items() if v != ViTConfig.__dataclass_fields__[k].default}
    )
    if config.act_layer != "gelu":
        kwargs["act_layer"] = config.act_layer
    if config.mlp_layer == "swiglu":
        kwargs["mlp_layer"] = timm_layers.SwiGLU
    elif config.mlp_layer == "swiglu_packed":
        kwargs["mlp_layer"] = partial(timm_layers.GluMlp, gate_last=False)
    elif config.mlp_layer == "geglu":
        from timm.models.vitamin import GeGluMlp

        kwargs["mlp_layer"] = GeGluMlp
    if config.res_post_norm:
        kwargs["block_fn"] = timm_vit.ResPostBlock
    if config.block == "parallel_things":
        kwargs["block_fn"] = timm_vit.ParallelThingsBlock
    elif config.block == "parallel_scaling":
        diff = config.attn_layer == "diff"
        kwargs["block_fn"] = (
            timm_vit.DiffParallelScalingBlock if diff else timm_vit.ParallelScalingBlock
        )
    elif config.attn_layer == "diff":
        kwargs["attn_layer"] = "diff"
    if config.hybrid == "mbconv":
        kwargs["embed_layer"] = _timm_mbconv_embed(config)
    elif config.hybrid != "none":  # timm's HybridEmbed over its ResNetV2, as its hybrids build it
        from timm.models.vision_transformer_hybrid import _resnetv2

        backbone = _resnetv2(layers=config.hybrid_layers, in_chans=config.in_chans)
        kwargs["embed_layer"] = partial(timm_layers.HybridEmbed, backbone=backbone)
    return kwargs


def _timm_mbconv_embed(config: ViTConfig) -> Any:
    """timm's HybridEmbed over ViTamin's `MbConvStages`, as its `_create_vitamin` builds it."""
    from timm import layers as timm_layers
    from timm.models import vitamin

    cfg = vitamin.VitCfg(
        embed_dim=(*config.hybrid_widths, config.embed_dim),
        depths=(*config.hybrid_layers, 1),
        stem_width=config.hybrid_widths[0],
        conv_cfg=vitamin.VitConvCfg(norm_layer="layernorm2d", norm_eps=1e-6),
        head_type="1d",
    )
    backbone = vitamin.MbConvStages(cfg=cfg, in_chans=config.in_chans)
    return partial(timm_layers.HybridEmbed, backbone=backbone, proj=False)


def _check_no_conv_stem(config: ViTConfig) -> None:
    if config.conv_stem:
        raise ValueError(
            "timm's VisionTransformer has no conv stem like vitkit's conv_stem (its hybrids use "
            "ResNetV2, vitkit's hybrid='resnetv2'); only models with conv_stem=() convert to timm"
        )
