"""Weights from timm, Hugging Face transformers, torchvision and the original JAX ViT, and back.

Each `from_*` function is pure: a state dict (or an `.npz` file) in, a vitkit state dict and the
matching `ViTConfig` out. Every source key is mapped or reported, and the result is checked
against the shapes of the model the config builds, so a wrong guess fails here with a readable
message rather than later inside `load_state_dict`.

The config is inferred from the weights: embed_dim, depth, MLP width, patch size, input
channels, class / distillation token, final norm vs `fc_norm`, LayerScale, number of classes,
and the resolution from the position-embedding grid (assumed square; pass `img_size` for a
non-square grid). The number of attention heads leaves no trace in timm, Hugging Face or
torchvision weights (q, k and v are stored as full D x D matrices), so it comes from, in order:
the `num_heads` argument, a Hugging Face `config.json` when one is given, the standard head
count for the width (192 -> 3, 384 -> 6, 768 -> 12, 1024 -> 16, 1280 -> 16; ViT paper Table 1
and DeiT), else `embed_dim // 64`. The JAX layout stores heads explicitly, so there it is exact.

Sources: timm `vision_transformer.py` (whose keys vitkit uses), Hugging Face `modeling_vit.py`
(both the Hub file layout, `encoder.layer.N.attention.attention.query`, and the in-memory
layout of transformers >= 5, `layers.N.attention.q_proj`), torchvision `vision_transformer.py`,
and the npz checkpoints of google-research/vision_transformer.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..model import VisionTransformer, ViTConfig
from ..model.config import patch_grid, to_2tuple
from ..model.pos_embed import fixed_pos_embed
from ..model.torch_encoder import torch_to_native_state_dict
from .checkpoint import CheckpointError, load_npz, mismatch_report

log = logging.getLogger(__name__)

FORMATS = ("vitkit", "timm", "hf", "torchvision", "jax")

# embed_dim -> heads of the standard sizes (ViT paper Table 1; Ti and S from DeiT).
STANDARD_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}

# Placeholder LayerScale init for converted models: the loaded gammas replace it.
_LAYER_SCALE_INIT = 1e-5


# timm layers vitkit does not have, named in the error message.
_UNSUPPORTED = {
    "reg_token": "register tokens (reg_token)",
    "norm_pre.weight": "a norm before the encoder (norm_pre, as CLIP)",
    "attn_pool.latent": "attention pooling (attn_pool)",
    "blocks.0.attn.q_norm.weight": "q/k normalisation (attn.q_norm)",
    "blocks.0.attn.norm.weight": "an attention output norm (attn.norm)",
    "blocks.0.mlp.norm.weight": "an MLP norm (mlp.norm)",
}


def default_num_heads(embed_dim: int) -> int:
    """The head count assumed for a width when the weights do not say: the standard sizes'
    count, else one head per 64 channels."""
    if embed_dim in STANDARD_HEADS:
        return STANDARD_HEADS[embed_dim]
    heads = max(1, embed_dim // 64)
    return heads if embed_dim % heads == 0 else 1


# -- config inference (timm layout) -------------------------------------------------------


def infer_config(state_dict: Mapping[str, Tensor], **overrides: Any) -> ViTConfig:
    """The `ViTConfig` of a state dict in vitkit / timm layout; `overrides` win.

    Besides `ViTConfig` fields, `overrides` may hold `num_heads=None` (use the default).
    """
    sd = state_dict
    if "patch_embed.proj.weight" not in sd:
        raise CheckpointError(
            "no 'patch_embed.proj.weight' in the state dict; it is not a ViT in timm / vitkit "
            f"layout (first keys: {', '.join(list(sd)[:5])})"
        )
    unsupported = [what for key, what in _UNSUPPORTED.items() if key in sd]
    if unsupported:
        raise CheckpointError(
            f"the weights have {', '.join(unsupported)}, which vitkit's ViT does not support"
        )
    proj = sd["patch_embed.proj.weight"]
    embed_dim = proj.shape[0]
    cfg: dict[str, Any] = {"embed_dim": embed_dim}
    if proj.ndim == 4:  # (D, C, ph, pw)
        cfg["in_chans"] = proj.shape[1]
        cfg["patch_size"] = _int_if_square(tuple(proj.shape[2:]))
    elif proj.ndim == 2:  # (D, C*ph*pw): patch_embed='unfold'
        cfg["patch_embed"] = "unfold"
        in_chans = overrides.get("in_chans", 3)
        patch = overrides.get("patch_size") or math.isqrt(proj.shape[1] // in_chans)
        ph, pw = (patch, patch) if isinstance(patch, int) else patch
        if in_chans * ph * pw != proj.shape[1]:
            raise CheckpointError(
                f"cannot tell the patch size of a linear patch embedding of width "
                f"{proj.shape[1]}; pass in_chans= and patch_size="
            )
        cfg["in_chans"], cfg["patch_size"] = in_chans, _int_if_square((ph, pw))
    else:
        raise CheckpointError(f"patch_embed.proj.weight has unexpected shape {tuple(proj.shape)}")

    block_ids = {int(m[1]) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))}
    if not block_ids:
        raise CheckpointError("no 'blocks.N.' weights in the state dict; it has no encoder blocks")
    cfg["depth"] = max(block_ids) + 1
    cfg["mlp_ratio"] = sd["blocks.0.mlp.fc1.weight"].shape[0] / embed_dim
    cfg["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd
    cfg["init_values"] = _LAYER_SCALE_INIT if "blocks.0.ls1.gamma" in sd else None
    cfg["embed_norm"] = "patch_embed.norm.weight" in sd
    cfg["class_token"] = "cls_token" in sd
    cfg["distilled"] = "dist_token" in sd
    cfg["num_classes"] = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    has_fc_norm = "fc_norm.weight" in sd
    cfg["global_pool"] = "token" if cfg["class_token"] and not has_fc_norm else "avg"
    cfg["pos_embed"] = "learn" if "pos_embed" in sd else "none"

    num_heads = overrides.pop("num_heads", None)
    cfg["num_heads"] = num_heads or default_num_heads(embed_dim)
    cfg.update(overrides)
    if "img_size" not in overrides:
        cfg["img_size"] = _img_size_from_pos_embed(sd, cfg)
    if cfg["global_pool"] == "token" and not cfg["class_token"]:
        cfg["global_pool"] = "avg"
    if "fc_norm" not in overrides:  # None: the default rule (fc_norm exactly for 'avg') holds
        default_rule = has_fc_norm == (cfg["global_pool"] == "avg")
        cfg["fc_norm"] = None if default_rule else has_fc_norm
    return ViTConfig.from_dict(cfg)


def _img_size_from_pos_embed(
    sd: Mapping[str, Tensor], cfg: dict[str, Any]
) -> int | tuple[int, int]:
    patch = cfg["patch_size"]
    ph, pw = (patch, patch) if isinstance(patch, int) else patch
    if "pos_embed" not in sd:
        return _int_if_square((224 // ph * ph, 224 // pw * pw))
    prefix = int(cfg["class_token"]) + int(cfg["distilled"])
    num_grid = sd["pos_embed"].shape[1] - prefix
    side = math.isqrt(num_grid)
    if side * side != num_grid:
        raise CheckpointError(
            f"the position embedding has {num_grid} patch positions, not a square grid; pass "
            "img_size=(h, w), the resolution the weights were trained at"
        )
    return _int_if_square((side * ph, side * pw))


def _int_if_square(pair: tuple[int, int]) -> int | tuple[int, int]:
    return pair[0] if pair[0] == pair[1] else pair


def expected_shapes(config: ViTConfig) -> dict[str, torch.Size]:
    """Key -> shape of `VisionTransformer(config).state_dict()`, from a one-block probe model
    whose block keys are repeated `depth` times (cheap even for ViT-H)."""
    probe = VisionTransformer(config.replace(depth=1, drop_path_rate=0.0))
    shapes = {}
    for key, value in probe.state_dict().items():
        match = re.fullmatch(r"blocks\.(layers\.)?0\.(.+)", key)
        if match is None:
            shapes[key] = value.shape
            continue
        for i in range(config.depth):
            shapes[f"blocks.{match[1] or ''}{i}.{match[2]}"] = value.shape
    return shapes


def check_state_dict(state_dict: Mapping[str, Tensor], config: ViTConfig, source: str) -> None:
    """Raise a CheckpointError unless `state_dict` has exactly the keys and shapes of
    `VisionTransformer(config)`."""
    report = mismatch_report(expected_shapes(config), dict(state_dict))
    if report:
        raise CheckpointError(
            f"{source} weights do not fit the inferred config ({report}); pass the options "
            "that differ (e.g. num_heads=, img_size=) or report the unsupported layers"
        )


def grid_size(config: ViTConfig) -> tuple[int, int]:
    """The patch grid (h, w) of a config's native resolution."""
    patch_size = to_2tuple(config.patch_size, "patch_size")
    height, width = to_2tuple(config.img_size, "img_size")
    return patch_grid(height, width, patch_size, len(config.conv_stem), what="img_size")


def _strip_prefix(sd: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    if sd and all(k.startswith(prefix) for k in sd):
        return {k[len(prefix) :]: v for k, v in sd.items()}
    return dict(sd)


# -- timm ---------------------------------------------------------------------------------


def from_timm(
    state_dict: Mapping[str, Tensor], *, num_heads: int | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A timm `vit_*` / `deit_*` state dict: the keys are vitkit's, so this infers the config
    and checks every key and shape. `overrides` are `ViTConfig` fields the weights cannot show
    (e.g. `global_pool`, `img_size` for a non-square grid, `norm_eps`)."""
    sd = _strip_prefix(state_dict, "module.")
    if any(k.startswith("blocks.layers.") for k in sd):  # vitkit encoder='torch' weights
        sd = torch_to_native_state_dict(sd)
    config = infer_config(sd, num_heads=num_heads, **overrides)
    check_state_dict(sd, config, "timm")
    return sd, config


def to_timm(model_or_state_dict: Any, config: ViTConfig | None = None) -> dict[str, Tensor]:
    """A state dict that timm's `VisionTransformer(**timm_kwargs(config))` loads strictly.

    A fixed (sinusoid / sincos2d) position table is written as timm's learned `pos_embed`,
    and an unfold patch embedding as timm's convolution: the same function either way.
    """
    sd, config = _vitkit_state(model_or_state_dict, config)
    _check_no_conv_stem(config)
    if config.pos_embed in ("sinusoid", "sincos2d"):
        sd["pos_embed"] = fixed_pos_embed(
            config.pos_embed, grid_size(config), config.embed_dim, config.num_prefix_tokens
        )
    return sd


def _check_no_conv_stem(config: ViTConfig) -> None:
    if config.conv_stem:
        raise ValueError(
            "timm's VisionTransformer has no conv stem like vitkit's conv_stem (its hybrids use "
            "ResNet backbones); only models with conv_stem=() convert to timm"
        )


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


def _vitkit_state(model_or_state_dict: Any, config: ViTConfig | None) -> tuple[dict, ViTConfig]:
    """(native-layout state dict, config) of a model, or of a state dict with its config."""
    if isinstance(model_or_state_dict, nn.Module):
        config = config or model_or_state_dict.config
        sd = dict(model_or_state_dict.state_dict())
    elif config is None:
        raise ValueError("pass the model, or the state dict together with its ViTConfig")
    else:
        sd = dict(model_or_state_dict)
    sd = {k: v.detach().clone() for k, v in sd.items()}
    if config.encoder == "torch":
        sd = torch_to_native_state_dict(sd)
    if config.patch_embed == "unfold":
        weight = sd["patch_embed.proj.weight"]  # (D, C*ph*pw) -> (D, C, ph, pw)
        ph, pw = to_2tuple(config.patch_size, "patch_size")
        sd["patch_embed.proj.weight"] = weight.reshape(weight.shape[0], config.in_chans, ph, pw)
    return sd, config


# -- Hugging Face transformers -------------------------------------------------------------

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
            epsilon is HF's default 1e-12 and the heads are guessed (see the module doc).
        num_heads: the head count, overriding the config and the guess.
        overrides: other `ViTConfig` fields.

    The pooler (`ViTModel`'s tanh layer on the class token) and the masked-modelling token are
    dropped: classification does not use them.
    """
    hf = _hf_config_dict(config)
    sd = dict(state_dict)
    head = {}
    for key in ("classifier.weight", "classifier.bias"):
        if key in sd:
            head[key.replace("classifier", "head")] = sd.pop(key)
    sd = _strip_prefix(sd, "vit.")
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
        raise CheckpointError(
            f"Hugging Face weights not understood: {', '.join(sorted(sd)[:5])}"
            + (f", ... ({len(sd)} in all)" if len(sd) > 5 else "")
            + "; only ViTModel / ViTForImageClassification weights are supported"
        )
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


def _hf_config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        return json.loads(Path(config).read_text())
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def to_hf(
    model_or_state_dict: Any, config: ViTConfig | None = None, layout: str = "legacy"
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
    sd, config = _vitkit_state(model_or_state_dict, config)
    _check_hf_compatible(config)
    if "pos_embed" not in sd:  # a fixed table or none: HF only has a learned one
        if config.pos_embed == "none":
            grid = grid_size(config)
            sd["pos_embed"] = torch.zeros(1, 1 + grid[0] * grid[1], config.embed_dim)
        else:
            sd["pos_embed"] = fixed_pos_embed(
                config.pos_embed, grid_size(config), config.embed_dim, config.num_prefix_tokens
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
    if problems:
        raise ValueError(
            "Hugging Face's ViT cannot express this model; it needs " + ", ".join(problems)
        )


# -- torchvision ---------------------------------------------------------------------------

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


# -- JAX / Flax npz (google-research/vision_transformer) -----------------------------------

_JAX_PREFIXES = ("opt/target/",)  # older checkpoints nest the weights here


def from_jax(
    source: str | os.PathLike | Mapping[str, np.ndarray], **overrides: Any
) -> tuple[dict[str, Tensor], ViTConfig]:
    """An `.npz` checkpoint of the original ViT code (or its arrays as a dict).

    Layout: `embedding/kernel` (ph, pw, C, D); `cls`; `Transformer/posembed_input/pos_embedding`;
    per block `Transformer/encoderblock_N/` with `LayerNorm_0`, `MultiHeadDotProductAttention_1/
    {query,key,value}` kernels (D, heads, head_dim) and `out` (heads, head_dim, D),
    `LayerNorm_2`, `MlpBlock_3/Dense_{0,1}`; `Transformer/encoder_norm`; `head`. Kernels are
    (in, out) and are transposed to PyTorch's (out, in). The head count is read from the
    query kernel. Without `cls` the model pools by mean after the final norm (the paper's
    'gap' classifier). A `pre_logits` representation layer is not supported: it is dropped
    together with the head it feeds (num_classes becomes 0), with a warning.
    """
    arrays = load_npz(source) if isinstance(source, (str, os.PathLike)) else dict(source)
    for prefix in _JAX_PREFIXES:
        if f"{prefix}embedding/kernel" in arrays:
            arrays = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    if "embedding/kernel" not in w:
        raise CheckpointError(
            "no 'embedding/kernel' array: not a ViT checkpoint in the original JAX layout "
            f"(first keys: {', '.join(list(w)[:5])}); big_vision checkpoints are not supported"
        )
    out: dict[str, Tensor] = {}

    def take(key: str) -> Tensor:
        return w.pop(key)

    def dense(ours: str, theirs: str) -> None:  # Flax kernel (in, out) -> weight (out, in)
        out[f"{ours}.weight"] = take(f"{theirs}/kernel").T.contiguous()
        out[f"{ours}.bias"] = take(f"{theirs}/bias")

    def norm(ours: str, theirs: str) -> None:
        out[f"{ours}.weight"] = take(f"{theirs}/scale")
        out[f"{ours}.bias"] = take(f"{theirs}/bias")

    kernel = take("embedding/kernel")
    if kernel.ndim != 4:
        raise CheckpointError(f"embedding/kernel has shape {tuple(kernel.shape)}, not 4-D")
    out["patch_embed.proj.weight"] = kernel.permute(3, 2, 0, 1).contiguous()  # (D, C, ph, pw)
    out["patch_embed.proj.bias"] = take("embedding/bias")
    if "cls" in w:
        out["cls_token"] = take("cls")
    if "Transformer/posembed_input/pos_embedding" in w:
        out["pos_embed"] = take("Transformer/posembed_input/pos_embedding")
    depth = len({k.split("/")[1] for k in w if k.startswith("Transformer/encoderblock_")})
    num_heads = None
    for i in range(depth):
        pre, ours = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = pre + "MultiHeadDotProductAttention_1/"
        norm(ours + "norm1", pre + "LayerNorm_0")
        q, k, v = (take(f"{mha}{n}/kernel") for n in ("query", "key", "value"))  # (D, H, hd)
        num_heads = q.shape[1]
        out[ours + "attn.qkv.weight"] = torch.cat([t.flatten(1).T for t in (q, k, v)])  # (3D, D)
        biases = [f"{mha}{n}/bias" for n in ("query", "key", "value")]
        if all(b in w for b in biases):
            out[ours + "attn.qkv.bias"] = torch.cat([take(b).flatten() for b in biases])  # (3D,)
        out[ours + "attn.proj.weight"] = take(mha + "out/kernel").flatten(0, 1).T.contiguous()
        out[ours + "attn.proj.bias"] = take(mha + "out/bias")
        norm(ours + "norm2", pre + "LayerNorm_2")
        dense(ours + "mlp.fc1", pre + "MlpBlock_3/Dense_0")
        dense(ours + "mlp.fc2", pre + "MlpBlock_3/Dense_1")
    norm("norm", "Transformer/encoder_norm")
    if "pre_logits/kernel" in w:
        log.warning(
            "the checkpoint has a pre_logits representation layer, which vitkit does not "
            "support; it is dropped with the head (num_classes=0): fine-tune a new head"
        )
        for key in ("pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"):
            w.pop(key, None)
    elif "head/kernel" in w:
        dense("head", "head")
    if w:
        raise CheckpointError(
            f"JAX arrays not understood: {', '.join(sorted(w)[:5])}"
            + (f", ... ({len(w)} in all)" if len(w) > 5 else "")
        )
    cfg: dict[str, Any] = {"num_heads": num_heads, "norm_eps": 1e-6}
    if "cls_token" not in out:  # 'gap': final norm, then the mean of the patch tokens
        cfg.update(global_pool="avg", fc_norm=False)
    cfg.update(overrides)
    config = infer_config(out, **cfg)
    check_state_dict(out, config, "JAX")
    return out, config


# -- format detection ----------------------------------------------------------------------


def detect_format(state_dict: Mapping[str, Any]) -> str:
    """'timm' (also vitkit's own keys), 'hf', 'torchvision' or 'jax', from the key names."""
    keys = list(state_dict)
    if any(k.endswith("embedding/kernel") for k in keys):
        return "jax"
    if any(
        k in ("conv_proj.weight", "class_token") or k.startswith("encoder.layers.encoder_layer_")
        for k in keys
    ):
        return "torchvision"
    if any("embeddings.patch_embeddings.projection" in k for k in keys):
        return "hf"
    if any(k.removeprefix("module.") == "patch_embed.proj.weight" for k in keys):
        return "timm"
    raise CheckpointError(
        f"cannot tell the checkpoint format from its keys ({', '.join(keys[:4])}, ...); it is "
        f"none of {', '.join(FORMATS)}: pass format= if it is one of them"
    )


CONVERTERS: dict[str, Callable[..., tuple[dict[str, Tensor], ViTConfig]]] = {
    "timm": from_timm,
    "vitkit": from_timm,
    "hf": from_hf,
    "torchvision": from_torchvision,
    "jax": from_jax,
}


# -- the source library's own model, for parity checks -------------------------------------


def source_model(format: str, config: ViTConfig, weights: Any) -> nn.Module:
    """The source library's model of `config` holding the original `weights` (a state dict,
    or the `.npz` path for 'jax', read by timm's own npz loader), in eval mode.

    Raises ImportError when the library is not installed. The model's `forward` returns
    logits (Hugging Face's output is unwrapped).
    """
    if format in ("timm", "vitkit", "jax"):
        from timm.models import deit, vision_transformer

        cls = deit.VisionTransformerDistilled if config.distilled else None
        cls = cls or vision_transformer.VisionTransformer
        model = cls(**timm_kwargs(config))
        if format == "jax":
            vision_transformer._load_weights(model, str(weights))
        else:
            model.load_state_dict(_strip_prefix(weights, "module."), strict=True)
        return model.eval()
    if format == "torchvision":
        from torchvision.models.vision_transformer import VisionTransformer as TVViT

        model = TVViT(**torchvision_kwargs(config))
        model.load_state_dict(weights, strict=True)
        return model.eval()
    if format == "hf":
        import transformers

        hf_config = transformers.ViTConfig(**to_hf_config(config))
        if config.num_classes:
            inner = transformers.ViTForImageClassification(hf_config)
        else:
            inner = transformers.ViTModel(hf_config, add_pooling_layer=False)
        own = set(inner.state_dict())
        kept = {k: v for k, v in weights.items() if k in own}  # drops the unused pooler
        if set(kept) != own:  # the other naming (Hub files vs transformers 5 modules)
            converted = from_hf(weights, config=to_hf_config(config))
            for layout in _HF_LAYER:
                kept = to_hf(*converted, layout=layout)
                if set(kept) == own:
                    break
        inner.load_state_dict(kept, strict=True)
        return _HFLogits(inner).eval()
    raise ValueError(f"unknown format {format!r}; expected one of {FORMATS}")


class _HFLogits(nn.Module):
    """A Hugging Face ViT whose forward returns a tensor: logits, or the final tokens."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(pixel_values=x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
