"""Weights from and to Hugging Face transformers' ViT (`models/vit/modeling_vit.py`:
`ViTModel`, `ViTForImageClassification`, and their `ViTConfig` / `config.json`).

Two key layouts are read and written: the Hub file layout of transformers 4 (and of every
`save_pretrained` folder), `vit.encoder.layer.N.attention.attention.query`, and the in-memory
module layout of transformers >= 5, `vit.layers.N.attention.q_proj`. Hugging Face stores q, k
and v as separate matrices; vitkit (as timm) stores them as one `qkv` of 3 x D rows. The head
count and `layer_norm_eps` come from the `config.json` when one is given (see `layout.py`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ...model import ViTConfig
from ...model.layers.pos_embed import fixed_pos_embed
from ..checkpoint import CheckpointError, strip_prefix
from ..hub import hf_config_dict, unknown_weights_error
from .layout import check_state_dict, infer_config, native_state_dict

log = logging.getLogger(__name__)

# vitkit block suffix -> (Hub / transformers 4 name, transformers >= 5 name).
_HF_BLOCK = {
    "norm1": ("layernorm_before", "layernorm_before"),
    "attn.proj": ("attention.output.dense", "attention.o_proj"),
    "norm2": ("layernorm_after", "layernorm_after"),
    "mlp.fc1": ("intermediate.dense", "mlp.fc1"),
    "mlp.fc2": ("output.dense", "mlp.fc2"),
}
_HF_QKV = {
    "legacy": ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    "v5": ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
}
_HF_LAYER = {"legacy": "encoder.layer.{}.", "v5": "layers.{}."}
# The key layouts `to_hf` writes: Hub files / transformers 4, and transformers 5's modules.
LAYOUTS = tuple(_HF_LAYER)
_HF_TOP = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
}
# Weights with no vitkit counterpart that are not needed for classification.
_HF_DROPPED = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.mask_token")


def from_hf(
    state_dict: Mapping[str, Tensor],
    *,
    config: Any = None,
    num_heads: int | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A Hugging Face `ViTForImageClassification` or `ViTModel` state dict, in the Hub file
    layout or transformers 5's module layout.

    Args:
        state_dict: the weights (`vit.`-prefixed or not).
        config: the model's `config.json` as a path, a dict or a transformers `ViTConfig`;
            it gives the head count, `layer_norm_eps` and the image size. Without it the
            epsilon is HF's default 1e-12 and the heads are the standard count of the width,
            or must be given (see `layout.py`).
        num_heads: the head count, overriding the config.
        overrides: other `ViTConfig` fields.

    The pooler (`ViTModel`'s tanh layer on the class token) and the masked-modelling token are
    dropped: classification does not use them.
    """
    hf = hf_config_dict(config)
    sd = dict(state_dict)
    head = {}
    for key in ("classifier.weight", "classifier.bias"):
        if key in sd:
            head[key.replace("classifier", "head")] = sd.pop(key)
    sd = strip_prefix(sd, "vit.")
    out: dict[str, Tensor] = {}
    for ours, theirs in _HF_TOP.items():
        if theirs in sd:
            out[ours] = sd.pop(theirs)
    layout = "v5" if any(k.startswith("layers.") for k in sd) else "legacy"
    layer_ids = sorted(
        {int(m[1]) for k in sd if (m := re.match(r"(?:encoder\.layer|layers)\.(\d+)\.", k))}
    )
    for i in layer_ids:
        pre = _HF_LAYER[layout].format(i)
        for ours, names in _HF_BLOCK.items():
            for kind in ("weight", "bias"):
                key = f"{pre}{names[layout == 'v5']}.{kind}"
                if key in sd:
                    out[f"blocks.{i}.{ours}.{kind}"] = sd.pop(key)
        for kind in ("weight", "bias"):
            keys = [f"{pre}{name}.{kind}" for name in _HF_QKV[layout]]
            if all(k in sd for k in keys):
                out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([sd.pop(k) for k in keys], dim=0)
    dropped = [k for k in _HF_DROPPED if sd.pop(k, None) is not None]
    if dropped:
        log.info("dropped Hugging Face weights with no vitkit counterpart: %s", ", ".join(dropped))
    if sd:
        raise unknown_weights_error(sd, "ViTModel / ViTForImageClassification")
    out.update(head)
    cfg: dict[str, Any] = {"norm_eps": hf.get("layer_norm_eps", 1e-12)}
    if "num_attention_heads" in hf:
        cfg["num_heads"] = hf["num_attention_heads"]
    if "image_size" in hf:
        size = hf["image_size"]
        cfg["img_size"] = size if isinstance(size, int) else tuple(size)
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(
            f"the Hugging Face model uses hidden_act={act!r}; vitkit's MLP uses the exact GELU "
            "('gelu') only, so the outputs would differ"
        )
    if num_heads is not None:
        cfg["num_heads"] = num_heads
    cfg.update(overrides)
    config_out = infer_config(out, **cfg)
    check_state_dict(out, config_out, "Hugging Face")
    return out, config_out


def to_hf(
    model_or_state_dict: nn.Module | Mapping[str, Tensor],
    config: ViTConfig | None = None,
    layout: str = "legacy",
) -> dict[str, Tensor]:
    """A Hugging Face ViT state dict: `ViTForImageClassification` keys (`vit.` prefix and
    `classifier`) when the model has a head, `ViTModel` keys otherwise.

    `layout='legacy'` gives the names of Hub files (`encoder.layer.N.attention.attention.query`,
    read by `from_pretrained` in transformers 4 and 5); `layout='v5'` gives transformers 5's
    module names (`layers.N.attention.q_proj`) for `model.load_state_dict`. Build the model
    from `to_hf_config(config)`.
    """
    if layout not in _HF_LAYER:
        raise ValueError(f"unknown layout {layout!r}; expected 'legacy' or 'v5'")
    sd, config = native_state_dict(model_or_state_dict, config)
    _check_hf_compatible(config)
    if "pos_embed" not in sd:  # a fixed table or none: HF only has a learned one
        if config.pos_embed == "none":
            rows, cols = config.grid_size
            sd["pos_embed"] = torch.zeros(1, 1 + rows * cols, config.embed_dim)
        else:
            sd["pos_embed"] = fixed_pos_embed(
                config.pos_embed, config.grid_size, config.embed_dim, config.num_prefix_tokens
            )
    prefix = "vit." if config.num_classes else ""
    out = {prefix + theirs: sd.pop(ours) for ours, theirs in _HF_TOP.items()}
    for i in range(config.depth):
        pre = prefix + _HF_LAYER[layout].format(i)
        for ours, names in _HF_BLOCK.items():
            for kind in ("weight", "bias"):
                out[f"{pre}{names[layout == 'v5']}.{kind}"] = sd.pop(f"blocks.{i}.{ours}.{kind}")
        for kind in ("weight", "bias") if config.qkv_bias else ("weight",):
            qkv = sd.pop(f"blocks.{i}.attn.qkv.{kind}").chunk(3, dim=0)
            for name, part in zip(_HF_QKV[layout], qkv):
                out[f"{pre}{name}.{kind}"] = part.contiguous()
    if config.num_classes:
        out["classifier.weight"] = sd.pop("head.weight")
        out["classifier.bias"] = sd.pop("head.bias")
    if sd:
        raise ValueError(f"no Hugging Face counterpart for {', '.join(sorted(sd))}")
    return out


def to_hf_config(config: ViTConfig) -> dict[str, Any]:
    """The Hugging Face `ViTConfig` fields (`config.json`) of the same architecture."""
    _check_hf_compatible(config)
    size = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    patch = config.patch_size
    if not isinstance(patch, int):
        if patch[0] != patch[1]:
            raise ValueError("Hugging Face ViT needs a square patch_size")
        patch = patch[0]
    return {
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": int(config.embed_dim * config.mlp_ratio),
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "layer_norm_eps": config.norm_eps,
        "image_size": size,
        "patch_size": patch,
        "num_channels": config.in_chans,
        "qkv_bias": config.qkv_bias,
        "num_labels": config.num_classes,
    }


def _check_hf_compatible(config: ViTConfig) -> None:
    problems = []
    if not config.class_token or config.global_pool != "token":
        problems.append("a class token with global_pool='token'")
    if config.fc_norm:
        problems.append("fc_norm off")
    if config.distilled:
        problems.append("distilled=False")
    if config.init_values:
        problems.append("no LayerScale (init_values=None)")
    if config.embed_norm:
        problems.append("embed_norm=False")
    if config.qk_scale is not None:
        problems.append("qk_scale=None")
    if config.conv_stem:
        problems.append("no conv_stem")
    if config.family_options():
        problems.append("the paper's layers (not " + ", ".join(config.family_options()) + ")")
    if problems:
        raise ValueError(
            "Hugging Face's ViT cannot express this model; it needs " + ", ".join(problems)
        )
