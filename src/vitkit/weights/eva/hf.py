"""Hugging Face DINOv3 (`DINOv3ViTModel`: `embeddings.register_tokens`, `layer.N` in its files
(`model.layer.N` in transformers 5's modules),
`attention.q_proj`, `layer_scale1.lambda1`) read as timm's DINOv3 EVA, whose outputs are
transformers': the keys moved to timm's (q / k / v packed into one `qkv`, the query and value
biases as EVA's `q_bias` / `v_bias`), the config from the folder's `config.json`.

The inverse (`to_hf_dinov3`, `to_hf_dinov3_config`) writes a timm DINOv3 backbone under the Hub
file names; what DINOv3ViTModel cannot express is named by `hf_dinov3_problems`.

What timm's EVA cannot be is refused in one line: a key bias (EVA's is zero), attention or MLP
projections without biases, an activation other than GELU (SiLU for the gated MLP). The rotary
coordinates' shift / jitter / rescale are training-time augmentations in transformers (off in
eval mode), so they do not change what the model computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ...model import get_config
from ...model.eva import EvaConfig
from ...options import option_fields
from ..checkpoint import CheckpointError, MissingOptionError
from ..hub import hf_config_dict
from .timm import eva_config

# transformers' DINOv3ViTConfig defaults, for a state dict given without its config.json.
_HF_DEFAULTS = {
    "layer_norm_eps": 1e-5,
    "rope_theta": 100.0,
    "hidden_act": "gelu",
    "query_bias": True,
    "key_bias": False,
    "value_bias": True,
    "proj_bias": True,
    "mlp_bias": True,
    "use_gated_mlp": False,
    "layerscale_value": 1.0,
    "image_size": 224,
}
# Per block: transformers' names -> timm's (after `model.layer.N.` -> `blocks.N.`).
_BLOCK_SWAPS = (
    ("attention.o_proj.", "attn.proj."),
    ("layer_scale1.lambda1", "gamma_1"),
    ("layer_scale2.lambda1", "gamma_2"),
    ("mlp.gate_proj.", "mlp.fc1_g."),
    ("mlp.down_proj.", "mlp.fc2."),
)


# timm's top-level keys -> the Hub file's (the blocks' are `_BLOCK_SWAPS` reversed)
_HF_TOP = {
    "cls_token": "embeddings.cls_token",
    "reg_token": "embeddings.register_tokens",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.bias",
}


def _file_key(key: str) -> str:
    """A key as the Hub files have it (transformers 5's modules add `model.`)."""
    key = key.removeprefix("dinov3.")
    return "layer." + key[len("model.layer.") :] if key.startswith("model.layer.") else key


def is_hf_dinov3(keys: Sequence[str]) -> bool:
    keys = {_file_key(k) for k in keys}
    return "embeddings.patch_embeddings.weight" in keys and "layer.0.layer_scale1.lambda1" in keys


def hf_dinov3_layout(state_dict: Mapping[str, Tensor], gated: bool) -> dict[str, Tensor]:
    """transformers' DINOv3 keys as timm's EVA has them."""
    sd = {_file_key(k): v for k, v in state_dict.items()}
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if key == "embeddings.mask_token":
            continue  # masked-image pre-training only
        if key == "embeddings.register_tokens":
            if value.shape[1]:
                out["reg_token"] = value
            continue
        key = key.replace("embeddings.cls_token", "cls_token")
        key = key.replace("embeddings.patch_embeddings.", "patch_embed.proj.")
        if key.startswith("layer."):
            key = "blocks." + key[len("layer.") :]
            if ".attention.q_proj." in key or ".attention.k_proj." in key:
                continue  # packed with v below
            if ".attention.v_proj." in key:
                out.update(_packed_attention(sd, key, value))
                continue
            for old, new in _BLOCK_SWAPS:
                key = key.replace(old, new)
            key = key.replace("mlp.up_proj.", "mlp.fc1_x." if gated else "mlp.fc1.")
        out[key] = value
    return out


def _packed_attention(sd: Mapping[str, Tensor], v_key: str, value: Tensor) -> dict[str, Tensor]:
    """q, k and v of one block as EVA's `attn.qkv.weight` (3 D, D), `q_bias` and `v_bias`."""
    layer = "layer." + v_key[len("blocks.") :].split(".", 1)[0]
    block = v_key.split(".attention.", 1)[0]
    if v_key.endswith(".bias"):
        query = sd.get(f"{layer}.attention.q_proj.bias")
        if query is None:
            raise CheckpointError(
                "a value bias without a query bias: timm's EVA has both or neither"
            )
        return {f"{block}.attn.q_bias": query, f"{block}.attn.v_bias": value}
    q, k = (sd[f"{layer}.attention.{n}_proj.weight"] for n in "qk")
    return {f"{block}.attn.qkv.weight": torch.cat([q, k, value])}


def _check(hf: Mapping[str, Any]) -> None:
    """What timm's EVA cannot hold, refused by name."""
    if hf["key_bias"]:
        raise CheckpointError("key_bias=True: timm's and vitkit's EVA keep the key bias zero")
    if hf["query_bias"] != hf["value_bias"]:
        raise CheckpointError(
            "query_bias and value_bias differ: timm's and vitkit's EVA have both or neither"
        )
    for name in ("proj_bias", "mlp_bias"):
        if not hf[name]:
            raise CheckpointError(f"{name}=False: timm's and vitkit's EVA have these biases")
    act = "silu" if hf["use_gated_mlp"] else "gelu"
    if hf["hidden_act"] != act:
        raise CheckpointError(
            f"hidden_act {hf['hidden_act']!r}: timm's EVA runs {act} in "
            f"{'its gated' if hf['use_gated_mlp'] else 'its'} MLP"
        )


def from_hf_dinov3(
    state_dict: Mapping[str, Tensor],
    *,
    config: Any = None,
    num_heads: int | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], EvaConfig]:
    """A Hugging Face DINOv3 state dict in timm's EVA layout and its `EvaConfig`.

    Args:
        state_dict: the weights (`DINOv3ViTModel`'s keys).
        config: the `config.json` (path, dict or transformers config); without it,
            transformers' defaults and `num_heads`.
        num_heads: the head count, over the config's.
        overrides: `EvaConfig` fields over both.
    """
    given = hf_config_dict(config)
    hf = {**_HF_DEFAULTS, **given}
    heads = num_heads or given.get("num_attention_heads")
    if heads is None:
        raise MissingOptionError(
            "Hugging Face DINOv3 weights without their config.json do not record their head count",
            ("hf_config",),
            ("num_heads",),
        )
    _check(hf)
    gated = bool(hf["use_gated_mlp"])
    sd = hf_dinov3_layout(state_dict, gated)
    hidden = sd["blocks.0.mlp.fc2.weight"].shape[1]
    size = hf["image_size"]
    options = {
        "num_heads": heads,
        "norm_eps": hf["layer_norm_eps"],
        "rope_temperature": float(hf["rope_theta"]),
        "init_values": hf["layerscale_value"],
        "qkv_bias": bool(hf["query_bias"]),
        "swiglu_mlp": gated,
        # gate and value apart (`fc1_g`, `fc1_x`) as timm's DINOv3 H+ has them, aligned to 8
        "swiglu_align_to": (8 if hidden % 8 == 0 else 1) if gated else 0,
        "img_size": size if isinstance(size, int) else tuple(size),
        "global_pool": "token",  # transformers' pooler_output: the normed class token
        **{k: v for k, v in overrides.items() if k in EvaConfig.__dataclass_fields__},
    }
    return sd, eva_config(sd, _dinov3_arch(options["qkv_bias"]), options)


def _dinov3_arch(qkv_bias: bool) -> str:
    """The timm DINOv3 whose fixed options a Hugging Face DINOv3 has (sizes aside)."""
    return "vit_small_patch16_dinov3_qkvb" if qkv_bias else "vit_small_patch16_dinov3"


# What a DINOv3ViTConfig states of an EvaConfig: sizes, the options `from_hf_dinov3` reads, and
# training-time ones that do not change what the model computes (a stochastic depth, dropouts,
# the rotary coordinates' augmentations, which size of input it accepts).
_HF_STATES = (
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_ratio", "num_reg_tokens", "qkv_bias", "swiglu_mlp", "swiglu_align_to", "norm_eps",
    "rope_temperature", "init_values", "dynamic_img_size",
)  # fmt: skip


def hf_dinov3_problems(config: EvaConfig) -> list[str]:
    """What of `config` Hugging Face's DINOv3ViTModel cannot express, each as
    `name=value (DINOv3ViTModel: value)`: the fields where it differs from timm's DINOv3 of its
    sizes, pooling the class token as transformers' `pooler_output` does."""
    stated = {name: getattr(config, name) for name in _HF_STATES}
    stated.update({n: getattr(config, n) for n in _training_options()})
    faithful = get_config(_dinov3_arch(config.qkv_bias)).replace(**stated, global_pool="token")
    problems = [
        f"{name}={getattr(config, name)!r} (DINOv3ViTModel: {getattr(faithful, name)!r})"
        for name in EvaConfig.__dataclass_fields__
        if getattr(config, name) != getattr(faithful, name)
    ]
    if config.init_values is None:
        problems.insert(0, "init_values=None (DINOv3ViTModel always has LayerScale)")
    return problems


def _training_options() -> list[str]:
    """The EvaConfig options of training only (dropouts, stochastic depth, augmentations)."""
    return [
        name
        for name, field in option_fields(EvaConfig).items()
        if field.metadata.get("group") == "regularisation"
    ]


def to_hf_dinov3_config(config: EvaConfig, intermediate_size: int) -> dict[str, Any]:
    """The `DINOv3ViTConfig` fields (`config.json`) of the same model; a ValueError names what
    DINOv3ViTModel cannot express."""
    if config.num_classes:
        raise ValueError(
            f"transformers has no DINOv3 classifier (DINOv3ViTModel is the backbone), this model "
            f"has a {config.num_classes}-class head; drop it first "
            "(model.reset_classifier(0, global_pool='token'))"
        )
    problems = hf_dinov3_problems(config)
    if problems:
        raise ValueError(f"Hugging Face's DINOv3ViTModel cannot express {', '.join(problems)}")
    size = config.img_size if isinstance(config.img_size, int) else list(config.img_size)
    return {
        "model_type": "dinov3_vit",
        "architectures": ["DINOv3ViTModel"],
        "hidden_size": config.embed_dim,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "hidden_act": "silu" if config.swiglu_mlp else "gelu",
        "attention_dropout": config.attn_drop_rate,
        "layer_norm_eps": config.norm_eps,
        "rope_theta": config.rope_temperature,
        "image_size": size,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "query_bias": config.qkv_bias,
        "key_bias": False,
        "value_bias": config.qkv_bias,
        "proj_bias": True,
        "mlp_bias": True,
        "layerscale_value": config.init_values,
        "drop_path_rate": config.drop_path_rate,
        "use_gated_mlp": config.swiglu_mlp,
        "num_register_tokens": config.num_reg_tokens,
        "pos_embed_shift": config.rope_shift_coords,
        "pos_embed_jitter": config.rope_jitter_coords,
        "pos_embed_rescale": config.rope_rescale_coords,
    }


def to_hf_dinov3(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A timm DINOv3 EVA's state dict under the Hub file names `hf_dinov3_layout` reads (`qkv`
    split into `q_proj` / `k_proj` / `v_proj`), with the mask token and an empty register
    token row DINOv3ViTModel holds."""
    cls_token = state_dict["cls_token"].detach().cpu()  # (1, 1, D)
    out = {
        "embeddings.mask_token": torch.zeros_like(cls_token),
        "embeddings.register_tokens": cls_token[:, :0],  # (1, 0, D)
    }
    swaps = [(new, old) for old, new in _BLOCK_SWAPS]
    swaps += [("mlp.fc1_x.", "mlp.up_proj."), ("mlp.fc1.", "mlp.up_proj.")]
    for key, value in state_dict.items():
        value = value.detach().contiguous().cpu()
        if key.startswith("blocks."):
            key = "layer." + key[len("blocks.") :]
            if key.endswith(".attn.qkv.weight"):
                layer = key[: -len("attn.qkv.weight")]
                parts = value.chunk(3)  # (3 D, D) -> q, k, v (D, D)
                for name, part in zip("qkv", parts, strict=True):
                    out[f"{layer}attention.{name}_proj.weight"] = part
                continue
            key = key.replace(".attn.q_bias", ".attention.q_proj.bias")
            key = key.replace(".attn.v_bias", ".attention.v_proj.bias")
            for old, new in swaps:
                key = key.replace(old, new)
        key = _HF_TOP.get(key, key)
        out[key] = value
    return out
