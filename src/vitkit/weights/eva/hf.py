"""Hugging Face DINOv3 (`DINOv3ViTModel`: `embeddings.register_tokens`, `layer.N` in its files
(`model.layer.N` in transformers 5's modules),
`attention.q_proj`, `layer_scale1.lambda1`) read as timm's DINOv3 EVA, whose outputs are
transformers': the keys moved to timm's (q / k / v packed into one `qkv`, the query and value
biases as EVA's `q_bias` / `v_bias`), the config from the folder's `config.json`.

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

from ...model.eva import EvaConfig
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
    arch = "vit_small_patch16_dinov3_qkvb" if options["qkv_bias"] else "vit_small_patch16_dinov3"
    return sd, eva_config(sd, arch, options)
