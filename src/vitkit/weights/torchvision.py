"""Weights from torchvision's ViT (`torchvision/models/vision_transformer.py`: `vit_b_16` and
the other `VisionTransformer`s), and the constructor arguments of the same architecture.

torchvision keeps the patch projection in `conv_proj`, the blocks in
`encoder.layers.encoder_layer_N` (attention as `nn.MultiheadAttention`, whose packed
`in_proj_weight` is vitkit's `qkv`), the final norm in `encoder.ln` and the classifier in
`heads.head`. Its LayerNorms use eps 1e-6 and exact GELU, as vitkit's do; the head count is not
in the weights (see `layout.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..model import ViTConfig
from .checkpoint import CheckpointError
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


def _tv_block_name(name: str) -> str | None:
    for theirs, ours in _TV_BLOCK.items():
        if name == theirs or name.startswith(theirs + "."):
            return ours + name[len(theirs) :]
    return None


def from_torchvision(
    state_dict: Mapping[str, Tensor], *, num_heads: int | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A torchvision `vit_b_16`-style state dict (`conv_proj`, `encoder.layers.encoder_layer_N`,
    `heads.head`). torchvision's LayerNorms use eps 1e-6 and exact GELU, as vitkit's do;
    heads are guessed as described in the module doc unless given."""
    out: dict[str, Tensor] = {}
    rest = {}
    block = re.compile(r"encoder\.layers\.encoder_layer_(\d+)\.(.+)")
    for key, value in state_dict.items():
        if key in _TV_TOP:
            out[_TV_TOP[key]] = value
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
    config = infer_config(out, num_heads=num_heads, **{"norm_eps": 1e-6, **overrides})
    check_state_dict(out, config, "torchvision")
    return out, config


def torchvision_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Arguments for torchvision's `VisionTransformer` of the same architecture (square
    images and patches, class token, token pooling, eps 1e-6 only)."""
    size, patch = config.img_size, config.patch_size
    if not isinstance(size, int) or not isinstance(patch, int):
        raise ValueError("torchvision's ViT needs int img_size and patch_size")
    if config.conv_stem:
        raise ValueError("torchvision's ViT has no conv stem; it needs conv_stem=()")
    return {
        "image_size": size,
        "patch_size": patch,
        "num_layers": config.depth,
        "num_heads": config.num_heads,
        "hidden_dim": config.embed_dim,
        "mlp_dim": int(config.embed_dim * config.mlp_ratio),
        "num_classes": config.num_classes,
    }
