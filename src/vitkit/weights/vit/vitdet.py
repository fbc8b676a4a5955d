"""Weights from Hugging Face transformers' ViTDet (`models/vitdet/modeling_vitdet.py`:
`VitDetModel`, `VitDetBackbone`, and their `VitDetConfig` / `config.json`).

Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection" (ECCV 2022), as
Hugging Face ports detectron2's `ViT`: no class token (the position table keeps a class
position, which is dropped: ViTDet never adds it), no final norm, window attention in the blocks
of `window_block_indices` (vitkit's `window_size` with the other blocks as `global_blocks`),
decomposed relative positions (`rel_pos_h` / `rel_pos_w`, the global blocks' made for
`image_size`, vitkit's `rel_pos_img_size`), the absolute positions made for
`pretrain_image_size` (vitkit's `img_size`) and resampled by plain bicubic interpolation
(`pos_embed_antialias=False`) to any input size (`dynamic_img_size=True`). The maps vitkit's
`forward_intermediates` gives are `VitDetBackbone`'s `feature_maps`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...model import ViTConfig
from ..checkpoint import CheckpointError, strip_prefix
from ..hub import hf_config_dict, unknown_weights_error
from .layout import check_state_dict, infer_config

log = logging.getLogger(__name__)

MODELS = "VitDetModel / VitDetBackbone"

# Hugging Face's VitDet block names -> vitkit's (one block's suffixes).
_BLOCK = {
    "norm1": "norm1",
    "attention.qkv": "attn.qkv",
    "attention.proj": "attn.proj",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_TOP = {
    "embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.projection.bias": "patch_embed.proj.bias",
}
# HF's VitDetConfig defaults for what the weights do not show.
_DEFAULTS = {"layer_norm_eps": 1e-6, "hidden_act": "gelu", "window_size": 0}


def is_vitdet(state_dict: Mapping[str, Any]) -> bool:
    """Whether the keys are Hugging Face VitDet's (its patch projection is
    `embeddings.projection`, ViT's `embeddings.patch_embeddings.projection`)."""
    return any(k.endswith("embeddings.projection.weight") for k in state_dict) and not any(
        "patch_embeddings" in k for k in state_dict
    )


def from_hf_vitdet(
    state_dict: Mapping[str, Tensor], *, config: Any = None, **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A Hugging Face `VitDetModel` / `VitDetBackbone` state dict in vitkit's layout, and its
    config: a ViT with window attention in HF's `window_block_indices` and relative positions
    when the weights have them.

    Args:
        state_dict: the weights (`vitdet.` or `backbone.`-prefixed or not).
        config: the `config.json` (a path, a dict or a transformers `VitDetConfig`): the
            heads, `window_size`, `window_block_indices`, `image_size`, `pretrain_image_size`
            and `layer_norm_eps`. Without it the heads are the standard count of the width and
            every block is global.
        overrides: other `ViTConfig` fields.
    """
    hf = {**_DEFAULTS, **hf_config_dict(config)}
    sd = strip_prefix(strip_prefix(state_dict, "backbone."), "vitdet.")
    out = _rename(sd)
    if hf["hidden_act"] != "gelu":
        raise CheckpointError(
            f"the Hugging Face VitDet uses hidden_act={hf['hidden_act']!r}; vitkit reads "
            "'gelu' (exact) VitDet weights only"
        )
    options = {**_vitdet_options(out, hf), **overrides}
    if options["use_rel_pos"] and "rel_pos_img_size" not in options:
        options["rel_pos_img_size"] = _rel_pos_img_size(out, options)
    config_out = infer_config(out, **options)
    check_state_dict(out, config_out, "Hugging Face VitDet")
    return out, config_out


def _rename(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """HF VitDet keys -> vitkit's; the position table's class entry dropped; anything else
    refused by name (the residual bottleneck blocks of `residual_block_indices` included)."""
    sd = dict(sd)
    out = {ours: sd.pop(theirs) for theirs, ours in _TOP.items() if theirs in sd}
    if "embeddings.position_embeddings" in sd:
        table = sd.pop("embeddings.position_embeddings")  # (1, 1 + N, D)
        out["pos_embed"] = table[:, 1:]  # (1, N, D): ViTDet adds no class position
        log.info("dropped the class position of HF VitDet's position table (it has no class token)")
    residual = sorted({m[1] for k in sd if (m := re.match(r"encoder\.layer\.(\d+)\.residual", k))})
    if residual:
        raise CheckpointError(
            f"the Hugging Face VitDet has residual bottleneck blocks after blocks "
            f"{', '.join(residual)} (residual_block_indices), which vitkit's ViT does not have"
        )
    for key in list(sd):
        match = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)", key)
        rel = re.fullmatch(r"encoder\.layer\.(\d+)\.attention\.(rel_pos_[hw])", key)
        if match and match[2] in _BLOCK:
            out[f"blocks.{match[1]}.{_BLOCK[match[2]]}.{match[3]}"] = sd.pop(key)
        elif rel:
            out[f"blocks.{rel[1]}.attn.{rel[2]}"] = sd.pop(key)
    if sd:
        raise unknown_weights_error(sd, MODELS)
    return out


def _vitdet_options(sd: Mapping[str, Tensor], hf: Mapping[str, Any]) -> dict[str, Any]:
    """The `ViTConfig` fields HF's VitDetConfig (and the weights) fix."""
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    window = hf["window_size"]
    windowed = set(hf.get("window_block_indices") or ()) if window else set()
    options: dict[str, Any] = {
        "class_token": False,
        "global_pool": "avg",
        "num_classes": 0,
        "final_norm": False,
        "dynamic_img_size": True,
        "pos_embed_antialias": False,
        "norm_eps": hf["layer_norm_eps"],
        "window_size": window if windowed else 0,
        "global_blocks": tuple(i for i in range(depth) if i not in windowed) if windowed else (),
        "use_rel_pos": "blocks.0.attn.rel_pos_h" in sd,
    }
    if "pos_embed" not in sd:
        options["pos_embed"] = "none"
    if "num_attention_heads" in hf:
        options["num_heads"] = hf["num_attention_heads"]
    if "pretrain_image_size" in hf:
        options["img_size"] = _size(hf["pretrain_image_size"])
    if options["use_rel_pos"] and "image_size" in hf:
        options["rel_pos_img_size"] = _size(hf["image_size"])  # the global blocks' tables
    return options


def _rel_pos_img_size(sd: Mapping[str, Tensor], options: Mapping[str, Any]) -> Any:
    """Without HF's `image_size`, the size the global blocks' relative-position tables are made
    for, read off the first global block's (2 * side - 1 rows per axis); None without one."""
    blocks = options["global_blocks"] if options.get("window_size") else (0,)
    if not blocks:
        return None
    block = blocks[0]
    patch = sd["patch_embed.proj.weight"].shape[-2:]
    rows = [sd[f"blocks.{block}.attn.rel_pos_{axis}"].shape[0] for axis in "hw"]
    height, width = ((n + 1) // 2 * p for n, p in zip(rows, patch))
    return height if height == width else (height, width)


def _size(value: Any) -> int | tuple[int, int]:
    return value if isinstance(value, int) else tuple(value)
