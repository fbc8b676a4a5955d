"""BEiT weights from Hugging Face transformers (`models/beit`: `BeitModel`,
`BeitForImageClassification`; `models/data2vec`: `Data2VecVisionModel`,
`Data2VecVisionForImageClassification`, the same model).

The keys are renamed to timm's (`timm.py` then reads them): query, key and value fused into one
`qkv` weight with the query and value biases apart (`q_bias`, `v_bias`; keys have none), the
layer scales (`lambda_1`, `lambda_2`) to `gamma_1`, `gamma_2`, the tables to the blocks' and the
shared `rel_pos_bias`, the pooler's norm to `fc_norm`, the classifier to `head`. Two key layouts
are read: the Hub file layout (`encoder.layer.N.attention.attention.query`,
`intermediate.dense`) and transformers 5's module layout of `Beit*` (`layers.N.attention.q_proj`,
`mlp.fc1`, `shared_position_bias`). The folder's `config.json` gives what the tensors do not
show: the image size of an oblong grid, `layer_norm_eps` (without it, transformers' default
1e-12) and `hidden_act` (GELU only: timm's `Beit` has no other), and the pooling
(`use_mean_pooling`). The mask token of a pre-training checkpoint is dropped.

The inverse (`to_hf_beit`, `to_hf_beit_config`) writes a timm BEiT under the Hub file names;
what Hugging Face's Beit cannot express is named by `hf_beit_problems`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ...model.beit import BeitConfig
from ..checkpoint import CheckpointError
from ..hub import hf_config_dict, unknown_weights_error
from .timm import beit_config

log = logging.getLogger(__name__)

_MODELS = (
    "BeitModel / BeitForImageClassification / Data2VecVisionModel / "
    "Data2VecVisionForImageClassification"
)
_PREFIXES = ("beit.", "data2vec_vision.")
HF_EPS = 1e-12  # transformers' BeitConfig / Data2VecVisionConfig default layer_norm_eps
_TABLE = "relative_position_bias_table"

# (regex of a block module, timm's module) under `encoder.layer.N.` / `layers.N.`; query, key
# and value go to `attn.q` / `attn.k` / `attn.v`, fused afterwards.
_BLOCK_RULES = (
    (r"layernorm_before", "norm1"),
    (r"layernorm_after", "norm2"),
    (r"intermediate\.dense|mlp\.fc1", "mlp.fc1"),
    (r"output\.dense|mlp\.fc2", "mlp.fc2"),
    (r"attention\.output\.dense|attention\.o_proj", "attn.proj"),
    (r"attention\.attention\.query|attention\.q_proj", "attn.q"),
    (r"attention\.attention\.key|attention\.k_proj", "attn.k"),
    (r"attention\.attention\.value|attention\.v_proj", "attn.v"),
)
_LAYER = r"(?:encoder\.layer|layers)\.(\d+)"
# (regex on the unprefixed key, timm key)
_RULES = (
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (rf"(?:encoder\.relative_position_bias|shared_position_bias)\.{_TABLE}",
     f"rel_pos_bias.{_TABLE}"),
    (rf"{_LAYER}\.(?:attention\.attention\.)?relative_position_bias\.{_TABLE}",
     rf"blocks.\1.attn.{_TABLE}"),
    (rf"{_LAYER}\.lambda_([12])", r"blocks.\1.gamma_\2"),
    *((rf"{_LAYER}\.(?:{module})\.(weight|bias)", rf"blocks.\1.{timm}.\2")
      for module, timm in _BLOCK_RULES),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (r"pooler\.layernorm\.(weight|bias)", r"fc_norm.\1"),
    (r"classifier\.(weight|bias)", r"head.\1"),
)  # fmt: skip
# The first block's query and key in either layout (a BEiT's query has a bias, its key none).
_FIRST_ATTENTION = (
    ("encoder.layer.0.attention.attention", "query", "key"),
    ("layers.0.attention", "q_proj", "k_proj"),
)
_DROPPED = re.compile(r".*relative_position_index|embeddings\.mask_token")


def is_hf_beit(keys: Sequence[str]) -> bool:
    """Whether Hugging Face keys are a BEiT's (or Data2Vec vision's), not a ViT's nor a Swin's:
    their prefix, a relative position table, a layer scale, the pooler's norm, or a query bias
    without a key bias (a ViT's query, key and value all have one or none)."""
    keys = list(keys)
    if not any(k.endswith("embeddings.cls_token") for k in keys):
        return False
    if any(k.startswith(_PREFIXES) for k in keys):
        return True
    names = {next((k[len(p) :] for p in _PREFIXES if k.startswith(p)), k) for k in keys}
    return (
        any(_TABLE in k or k.endswith(".lambda_1") for k in names)
        or "pooler.layernorm.weight" in names
        or any(
            f"{layer}.{q}.bias" in names and f"{layer}.{k}.bias" not in names
            for layer, q, k in _FIRST_ATTENTION
        )
    )


def hf_to_timm_beit(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """HF BEiT keys (either layout, with or without the `beit.` / `data2vec_vision.` prefix)
    renamed to timm's, q / k / v fused; a key no rule maps is refused in one line."""
    out: dict[str, Tensor] = {}
    unknown = {}
    for key, value in state_dict.items():
        name = next((key[len(p) :] for p in _PREFIXES if key.startswith(p)), key)
        if _DROPPED.fullmatch(name):
            continue
        for pattern, target in _RULES:
            new, count = re.subn(f"^{pattern}$", target, name)
            if count:
                out[new] = value
                break
        else:
            unknown[key] = value
    if unknown:
        raise unknown_weights_error(unknown, _MODELS)
    _fuse_qkv(out)
    return out


def _fuse_qkv(sd: dict[str, Tensor]) -> None:
    """`attn.q` / `attn.k` / `attn.v` -> `attn.qkv.weight` (3D rows), the query and value
    biases as `q_bias` / `v_bias` (BEiT's keys are never biased)."""
    for key in [k for k in sd if k.endswith(".attn.q.weight")]:
        attn = key[: -len("q.weight")]
        sd[attn + "qkv.weight"] = torch.cat([sd.pop(f"{attn}{n}.weight") for n in "qkv"])
        if f"{attn}k.bias" in sd:
            raise CheckpointError(
                f"{attn}k has a bias, which BEiT's attention never has; these are not BEiT weights"
            )
        for name in "qv":
            if f"{attn}{name}.bias" in sd:
                sd[f"{attn}{name}_bias"] = sd.pop(f"{attn}{name}.bias")


def config_options(hf: Mapping[str, Any], sd: Mapping[str, Tensor]) -> dict[str, Any]:
    """The `BeitConfig` options a `config.json` states (beside the tensors'): image size,
    epsilon, pooling; an activation timm's `Beit` lacks is refused in one line."""
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(
            f"hidden_act {act!r}: timm's and vitkit's BEiT have GELU only; no faithful copy"
        )
    options: dict[str, Any] = {"norm_eps": hf.get("layer_norm_eps", HF_EPS)}
    if "image_size" in hf:
        size = hf["image_size"]
        options["img_size"] = size if isinstance(size, int) else tuple(size)
    if "use_mean_pooling" in hf:
        mean = bool(hf["use_mean_pooling"])
        options.update(global_pool="avg" if mean else "token", use_fc_norm=mean)
    if "layer_scale_init_value" in hf and "blocks.0.gamma_1" in sd:
        options["init_values"] = hf["layer_scale_init_value"]
    return options


def from_hf_beit(
    state_dict: Mapping[str, Tensor],
    *,
    config: Any = None,
    arch: str | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], BeitConfig]:
    """A Hugging Face BEiT / Data2Vec vision state dict in timm's layout and its `BeitConfig`.

    Args:
        state_dict: the weights, Hub file or transformers 5 module layout.
        config: the `config.json` (path, dict or transformers config): image size,
            `layer_norm_eps`, `hidden_act`, `use_mean_pooling`.
        arch: a BEiT name of `vitkit.list_models()` for LayerScale's start.
        overrides: `BeitConfig` fields over both.
    """
    hf = hf_config_dict(config)
    sd = hf_to_timm_beit(state_dict)
    options = config_options(hf, sd)
    if not hf:
        log.info("no config.json: assuming transformers' layer_norm_eps %g", HF_EPS)
    fields = BeitConfig.__dataclass_fields__
    options.update({k: v for k, v in overrides.items() if k in fields and v is not None})
    return sd, beit_config(sd, arch, options)


def hf_beit_problems(config: BeitConfig) -> list[str]:
    """What of `config` Hugging Face's Beit cannot express, each naming the difference."""
    problems = []
    if config.global_pool == "avg" and not config.fc_norm:
        problems.append("global_pool='avg' without fc_norm (HF's mean pooling norms the mean)")
    if config.global_pool == "token" and config.fc_norm:
        problems.append("global_pool='token' with fc_norm (HF norms the tokens, then pools)")
    if config.global_pool == "none":
        problems.append("global_pool='none' (HF pools the mean or the class token)")
    if not config.qkv_bias:
        problems.append("qkv_bias=False (HF's query and value always have a bias)")
    if config.swiglu_mlp or config.scale_mlp:
        problems.append("a SwiGLU or scaled MLP (HF's is Linear-GELU-Linear)")
    rows, cols = config.grid_size
    if rows != cols:
        problems.append(
            f"an oblong patch grid {rows}x{cols} (HF resamples its position tables as square)"
        )
    return problems


def to_hf_beit_config(config: BeitConfig, intermediate_size: int) -> dict[str, Any]:
    """The Hugging Face `BeitConfig` fields (`config.json`) of the same model; a ValueError
    names what Hugging Face's Beit cannot express."""
    problems = hf_beit_problems(config)
    if problems:
        raise ValueError(f"Hugging Face's Beit cannot express {', '.join(problems)}")
    return {
        "model_type": "beit",
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "intermediate_size": intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.proj_drop_rate,
        "attention_probs_dropout_prob": config.attn_drop_rate,
        "drop_path_rate": config.drop_path_rate,
        "layer_norm_eps": config.norm_eps,
        "image_size": config.grid_size[0] * config.patch_size,
        "patch_size": config.patch_size,
        "num_channels": config.in_chans,
        "use_mask_token": False,
        "use_absolute_position_embeddings": config.use_abs_pos_emb,
        "use_relative_position_bias": config.use_rel_pos_bias,
        "use_shared_relative_position_bias": config.use_shared_rel_pos_bias,
        "layer_scale_init_value": config.init_values or 0.0,
        "use_mean_pooling": config.global_pool == "avg",
        "num_labels": config.num_classes,
    }


# timm's modules -> the Hub file's: top level, then under `blocks.N.` -> `encoder.layer.N.`.
_HF_TOP = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj": "embeddings.patch_embeddings.projection",
    "rel_pos_bias": "encoder.relative_position_bias",
    "norm": "layernorm",
    "fc_norm": "pooler.layernorm",
}
_HF_BLOCK = {
    "norm1": "layernorm_before",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
    "attn.proj": "attention.output.dense",
    "attn": "attention.attention.relative_position_bias",  # its table
    "gamma_1": "lambda_1",
    "gamma_2": "lambda_2",
    "attn.q_bias": "attention.attention.query.bias",
    "attn.v_bias": "attention.attention.value.bias",
}


def to_hf_beit(state_dict: Mapping[str, Tensor], head: bool) -> dict[str, Tensor]:
    """A timm BEiT state dict under the Hub file names `hf_to_timm_beit` reads: `qkv` split
    into query / key / value; `beit.`-prefixed with a head (`BeitForImageClassification`),
    unprefixed without (`BeitModel`)."""
    prefix = "beit." if head else ""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        value = value.detach().contiguous().cpu()
        block = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
        if key.startswith("head."):
            out["classifier." + key[len("head.") :]] = value
        elif block and block[2] == "attn.qkv.weight":
            self_attn = f"{prefix}encoder.layer.{block[1]}.attention.attention."
            parts = value.chunk(3)  # (3 D, D) -> query, key, value (D, D)
            for name, part in zip(("query", "key", "value"), parts, strict=True):
                out[f"{self_attn}{name}.weight"] = part
        elif block:
            out[f"{prefix}encoder.layer.{block[1]}.{_hf_name(_HF_BLOCK, block[2])}"] = value
        else:
            out[prefix + _hf_name(_HF_TOP, key)] = value
    return out


def _hf_name(names: Mapping[str, str], key: str) -> str:
    """`key` with its longest module path that `names` maps renamed (a parameter maps whole)."""
    if key in names:
        return names[key]
    module, leaf = key.rsplit(".", 1)
    return f"{_hf_name(names, module)}.{leaf}"
