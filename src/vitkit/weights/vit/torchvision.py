"""Weights from torchvision's ViT (`torchvision/models/vision_transformer.py`: `vit_b_16` and
the other `VisionTransformer`s), and the constructor arguments of the same architecture.

torchvision keeps the patch projection in `conv_proj`, the blocks in
`encoder.layers.encoder_layer_N` (attention as `nn.MultiheadAttention`, whose packed
`in_proj_weight` is vitkit's `qkv`), the final norm in `encoder.ln` and the classifier in
`heads.head`. Its LayerNorms use eps 1e-6 and exact GELU, as vitkit's do; the head count is not
in the weights (see `layout.py`).

A conv stem (`conv_stem_configs`, the convolutional stem of Xiao et al., "Early Convolutions
Help Transformers See Better", 2021) is `conv_proj.conv_bn_relu_N` (`Conv2dNormActivation`:
a convolution without bias, BatchNorm, activation) then the 1x1 `conv_proj.conv_last`. It is
vitkit's `conv_stem` (`patch_embed.backbone`) followed by a patch projection of patch size 1
when every layer is a 3x3 convolution with BatchNorm. The weights show the channels, the kernel
size and the norm's parameters, not the stride, the BatchNorm eps or the activation: eps 1e-5
and ReLU are taken (`ConvStemConfig`'s defaults), and the strides (1 or 2 per layer,
`conv_stem_strides`) are given, or taken to be 2 where that makes no larger patch than a
torchvision builder's (32 pixels); a deeper stem (Xiao et al.'s larger ones have stride-1
layers) without its strides is refused (`_stem_geometry`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model import ViTConfig
from ...model.layers.patch_embed import to_2tuple
from ..checkpoint import CheckpointError
from .layout import check_state_dict, infer_config

_TV_TOP = {
    "class_token": "cls_token",
    "conv_proj.weight": "patch_embed.proj.weight",
    "conv_proj.bias": "patch_embed.proj.bias",
    "encoder.pos_embedding": "pos_embed",
    "encoder.ln.weight": "norm.weight",
    "encoder.ln.bias": "norm.bias",
    "heads.head.weight": "head.weight",
    "heads.head.bias": "head.bias",
}
_TV_BLOCK = {
    "ln_1": "norm1",
    "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj": "attn.proj",
    "ln_2": "norm2",
    "mlp.0": "mlp.fc1",
    "mlp.linear_1": "mlp.fc1",  # torchvision < 0.13 names
    "mlp.3": "mlp.fc2",
    "mlp.linear_2": "mlp.fc2",
}


# `conv_proj.conv_bn_relu_{layer}.{module}.{name}`: module 0 the convolution, 1 the norm.
_TV_STEM = re.compile(r"conv_proj\.conv_bn_relu_(\d+)\.(\d+)\.(.+)")
_TV_STEM_LAST = {
    "conv_proj.conv_last.weight": "patch_embed.proj.weight",
    "conv_proj.conv_last.bias": "patch_embed.proj.bias",
}
# vitkit's `ConvStem` holds conv, BatchNorm, ReLU per layer: conv `3 * layer`, norm `3 * layer + 1`.
_STEM_NORM_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _tv_block_name(name: str) -> str | None:
    for theirs, ours in _TV_BLOCK.items():
        if name == theirs or name.startswith(theirs + "."):
            return ours + name[len(theirs) :]
    return None


def from_torchvision(
    state_dict: Mapping[str, Tensor], *, num_heads: int | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A torchvision `vit_b_16`-style state dict (`conv_proj`, `encoder.layers.encoder_layer_N`,
    `heads.head`), with or without a conv stem (`conv_proj.conv_bn_relu_N`, see the module
    doc). torchvision's LayerNorms use eps 1e-6 and exact GELU, as vitkit's do; heads are
    guessed as described in the module doc unless given."""
    out: dict[str, Tensor] = {}
    stem: dict[str, Tensor] = {}
    rest = {}
    block = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\.(.+)")
    for key, value in state_dict.items():
        if key in _TV_TOP:
            out[_TV_TOP[key]] = value
        elif key in _TV_STEM_LAST:
            out[_TV_STEM_LAST[key]] = value
        elif _TV_STEM.fullmatch(key):
            stem[key] = value
        elif (match := block.fullmatch(key)) and (name := _tv_block_name(match[2])):
            out[f"blocks.{match[1]}.{name}"] = value
        else:
            rest[key] = value
    if rest:
        hint = (
            " (heads.pre_logits: the representation layer is not supported)"
            if any(k.startswith("heads.pre_logits") for k in rest)
            else ""
        )
        raise CheckpointError(
            f"torchvision weights not understood: {', '.join(sorted(rest)[:5])}{hint}"
        )
    options: dict[str, Any] = {"norm_eps": 1e-6}
    if stem or any(key in state_dict for key in _TV_STEM_LAST):
        channels, in_chans = _convert_stem(stem, out)
        options.update(conv_stem=channels, in_chans=in_chans)
        options.update(_stem_geometry(len(channels), _square_grid(out), overrides))
    config = infer_config(out, num_heads=num_heads, **{**options, **overrides})
    check_state_dict(out, config, "torchvision")
    return out, config


def _convert_stem(
    stem: Mapping[str, Tensor], out: dict[str, Tensor]
) -> tuple[tuple[int, ...], int]:
    """Move the conv stem's weights into `out` (vitkit's `patch_embed.backbone`); (channels,
    input channels). Refuses, naming the difference, a stem vitkit's 3x3 conv + BatchNorm + ReLU
    layers cannot hold."""
    fix = "vitkit's conv_stem is 3x3 stride-2 convolutions without bias, BatchNorm and ReLU"
    layers = sorted({int(_TV_STEM.fullmatch(k)[1]) for k in stem})
    if not layers:
        raise CheckpointError(
            "torchvision weights have a 1x1 conv_proj.conv_last but no conv_proj.conv_bn_relu_N "
            f"layers; {fix}, at least one"
        )
    if layers != list(range(len(layers))):
        raise CheckpointError(
            f"torchvision conv stem layers {layers} are not numbered 0 to {len(layers) - 1}; "
            "pass the whole state dict"
        )
    channels: list[int] = []
    in_chans = 0
    for layer in layers:
        prefix = f"conv_proj.conv_bn_relu_{layer}."
        weight = stem.get(prefix + "0.weight")
        if weight is None or weight.ndim != 4:
            raise CheckpointError(f"torchvision conv stem layer {layer} has no convolution; {fix}")
        kernel = tuple(weight.shape[2:])
        if kernel != (3, 3):
            raise CheckpointError(
                f"torchvision conv stem layer {layer} has a {kernel[0]}x{kernel[1]} kernel; {fix}"
            )
        if prefix + "0.bias" in stem:
            raise CheckpointError(
                f"torchvision conv stem layer {layer} has a convolution bias and no norm "
                f"(norm_layer=None); {fix}"
            )
        norm = {
            name: stem[prefix + "1." + name]
            for name in _STEM_NORM_KEYS
            if prefix + "1." + name in stem
        }
        if "running_var" not in norm or "weight" not in norm:
            what = "a norm without running statistics (not BatchNorm)" if norm else "no norm"
            raise CheckpointError(f"torchvision conv stem layer {layer} has {what}; {fix}")
        known = {prefix + "0.weight"} | {prefix + "1." + name for name in norm}
        if other := sorted(set(k for k in stem if k.startswith(prefix)) - known):
            raise CheckpointError(
                f"torchvision conv stem layer {layer} has weights vitkit's stem lacks "
                f"({', '.join(other)}: an activation or norm with parameters?); {fix}"
            )
        if layer and weight.shape[1] != channels[-1]:
            raise CheckpointError(
                f"torchvision conv stem layer {layer} takes {weight.shape[1]} channels but "
                f"layer {layer - 1} gives {channels[-1]}; the weights are not one model"
            )
        in_chans = in_chans or weight.shape[1]
        out[f"patch_embed.backbone.{3 * layer}.weight"] = weight
        for name, value in norm.items():
            out[f"patch_embed.backbone.{3 * layer + 1}.{name}"] = value
        channels.append(weight.shape[0])
    last = out.get("patch_embed.proj.weight")
    if last is None or tuple(last.shape[2:]) != (1, 1):
        raise CheckpointError(
            "torchvision conv stem without a 1x1 conv_proj.conv_last; pass the whole state dict"
        )
    return tuple(channels), in_chans


# The largest patch of torchvision's ViT builders (vit_b_32, vit_l_32): a conv stem of more
# stride-2 layers is more likely one with stride-1 layers (Xiao et al.'s larger stems).
_MAX_TV_PATCH = 32


def _stem_geometry(layers: int, side: int | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`conv_stem_strides` and `img_size` of a torchvision conv stem of `layers` layers on a
    square grid of `side` tokens: the image is the grid times the stem's total stride
    (torchvision's patch_size). The weights do not show the strides: given, or told by a given
    img_size when that is all stride 2, or taken to be all 2 when that makes no larger patch
    than torchvision's; else refused, never guessed."""
    strides = tuple(overrides.get("conv_stem_strides") or ())
    if not strides:
        size = overrides.get("img_size")
        total = None if size is None or not side else to_2tuple(size, "img_size")[0] // side
        if total == 2**layers or (total is None and 2**layers <= _MAX_TV_PATCH):
            strides = (2,) * layers
        else:
            given = f"img_size {size} on {side} x {side} tokens" if total else "the weights"
            raise CheckpointError(
                f"torchvision's conv stem of {layers} layers: {given} do not show which "
                f"layers have stride 1 (all stride 2 would make {2**layers}-pixel patches); "
                "pass conv_stem_strides= (Xiao et al.'s 6-layer stem: (2, 2, 1, 2, 1, 2))"
            )
    out: dict[str, Any] = {"conv_stem_strides": strides}
    if "img_size" not in overrides and side is not None:
        out["img_size"] = side * 2 ** sum(stride == 2 for stride in strides)
    return out


def _square_grid(out: Mapping[str, Tensor]) -> int | None:
    """The side of the square token grid of the position embedding (after the class token)."""
    if "pos_embed" not in out:
        return None
    tokens = out["pos_embed"].shape[1] - 1
    side = math.isqrt(max(tokens, 0))
    return side if side * side == tokens else None


# torchvision's ViT builders (`torchvision.models.vit_b_16`, ...): name -> (patch_size,
# num_layers, num_heads, hidden_dim, mlp_dim). The weights show all but the head count.
TORCHVISION_BUILDERS: dict[str, tuple[int, int, int, int, int]] = {
    "vit_b_16": (16, 12, 12, 768, 3072),
    "vit_b_32": (32, 12, 12, 768, 3072),
    "vit_l_16": (16, 24, 16, 1024, 4096),
    "vit_l_32": (32, 24, 16, 1024, 4096),
    "vit_h_14": (14, 32, 16, 1280, 5120),
}


def torchvision_builder(config: ViTConfig) -> str | None:
    """The torchvision builder of `config`'s sizes (patch, depth, width, MLP width), whose
    head count is then torchvision's; None for other sizes or a conv stem."""
    if config.conv_stem or config.mlp_layer != "mlp":
        return None
    sizes = (
        config.patch_size,
        config.depth,
        config.embed_dim,
        int(config.embed_dim * config.mlp_ratio),
    )
    for name, (patch, layers, _, hidden, mlp) in TORCHVISION_BUILDERS.items():
        if sizes == (patch, layers, hidden, mlp):
            return name
    return None


def torchvision_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments for torchvision's `VisionTransformer` of the same architecture (square
    images and patches, class token, token pooling, eps 1e-6 only). A conv stem becomes
    `conv_stem_configs` (3x3, stride 2, BatchNorm, ReLU; torchvision is imported for its
    `ConvStemConfig`), whose 1x1 `conv_last` is vitkit's projection of patch size 1."""
    size, patch = config.img_size, config.patch_size
    if not isinstance(size, int) or not isinstance(patch, int):
        raise ValueError("torchvision's ViT needs int img_size and patch_size")
    if config.in_chans != 3:
        raise ValueError(
            f"torchvision's ViT takes 3-channel images; it needs in_chans=3, not {config.in_chans}"
        )
    kwargs: dict[str, Any] = {}
    if config.conv_stem:
        if patch != 1:
            raise ValueError(
                f"torchvision's ViT has no conv stem followed by {patch}x{patch} patches (its "
                "stem ends in a 1x1 convolution); it needs patch_size=1 or conv_stem=()"
            )
        reduction = 2**config.stem_strides
        if size % reduction:
            raise ValueError(
                f"torchvision's conv stem needs img_size divisible by {reduction} (its total "
                f"stride), not {size}; use img_size={size // reduction * reduction or reduction}"
            )
        from torchvision.models.vision_transformer import ConvStemConfig

        patch = reduction  # torchvision's patch_size is the stem's total stride
        kwargs["conv_stem_configs"] = [
            ConvStemConfig(out_channels=channels, kernel_size=3, stride=stride)
            for channels, stride in zip(config.conv_stem, config.conv_stem_layer_strides)
        ]
    return {
        "image_size": size,
        "patch_size": patch,
        "num_layers": config.depth,
        "num_heads": config.num_heads,
        "hidden_dim": config.embed_dim,
        "mlp_dim": int(config.embed_dim * config.mlp_ratio),
        "num_classes": config.num_classes,
        **kwargs,
    }
