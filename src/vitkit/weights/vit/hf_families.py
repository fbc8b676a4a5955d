"""Weights from Hugging Face transformers' vision towers beyond ViT: DINOv2 (Oquab et al.,
2023; `models/dinov2`, `models/dinov2_with_registers`), CLIP (Radford et al., 2021;
`models/clip`) and SigLIP (Zhai et al., 2023; `models/siglip`).

Each is one of vitkit's ViT families, so the converters only rename keys (table-driven, every
key mapped or refused by name), fuse q, k and v into one `qkv`, and read from the `config.json`
what the weights do not show (heads, activation, norm epsilon, image size):

- DINOv2: LayerScale (`layer_scale1.lambda1` -> `ls1.gamma`), the final `layernorm` as `norm`;
  the SwiGLU MLP (`use_swiglu_ffn`) packed (`weights_in`, Hub files) or split (`gate_proj` /
  `up_proj`, transformers 5 modules); the masked-modelling token dropped. With registers the
  class token's position is folded into the class token and the positions cover the patches
  only (`no_embed_class`, as timm's DINOv2-reg models): the same sum, computed once.
- CLIP: no patch bias, the class and position embeddings as parameters, `pre_layrnorm` as
  `norm_pre`, `post_layernorm` as `fc_norm` on the class token (`pooler_output`); the visual
  projection, when present, as a head without bias (`image_embeds`).
- SigLIP: no class token, `post_layernorm` as the final `norm`, the attention-pooling head
  (`SiglipMultiheadAttentionPoolingHead`) as `global_pool='map'`.

A two-tower CLIP / SigLIP checkpoint loads its vision tower: the text tower, its projection and
the logit scale and bias are dropped (logged). `from_hf_any` picks the family from the keys and
is what `load_pretrained` uses for the 'hf' format.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...model import ViTConfig
from ...model.layers import mlp_hidden_width
from ...model.layers.patch_embed import to_2tuple
from ..checkpoint import CheckpointError
from ..hub import HF_ACTIVATIONS, hf_config_dict, unknown_weights_error
from .hf import from_hf
from .layout import check_state_dict, infer_config
from .vitdet import from_hf_vitdet, is_vitdet

log = logging.getLogger(__name__)

# family -> (the models read, prefixes of their wrapped state dicts, HF's config defaults).
_FAMILIES: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "dinov2": (
        "Dinov2Model / Dinov2WithRegistersModel (and their ForImageClassification backbones)",
        ("dinov2_with_registers.", "dinov2."),
        {"hidden_act": "gelu", "layer_norm_eps": 1e-6},
    ),
    "clip": (
        "CLIPVisionModel / CLIPVisionModelWithProjection / CLIPForImageClassification / "
        "CLIPModel (vision tower)",
        ("vision_model.",),
        {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-5},
    ),
    "siglip": (
        "SiglipVisionModel / SiglipForImageClassification / SiglipModel (vision tower)",
        ("vision_model.",),
        {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
    ),
}

# Renaming rules (regex on the key without its prefix -> vitkit key); q, k and v go to
# temporary `attn.q` / `attn.k` / `attn.v` keys, fused afterwards.
_B = r"encoder\.layers?\.(\d+)\."
_DINOV2_RULES = (
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (_B + r"norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (_B + r"attention\.attention\.query\.(weight|bias)", r"blocks.\1.attn.q.\2"),
    (_B + r"attention\.attention\.key\.(weight|bias)", r"blocks.\1.attn.k.\2"),
    (_B + r"attention\.attention\.value\.(weight|bias)", r"blocks.\1.attn.v.\2"),
    (_B + r"attention\.([qkv])_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (_B + r"attention\.(?:output\.dense|o_proj)\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (_B + r"layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (_B + r"mlp\.(fc[12])\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (_B + r"mlp\.weights_in\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),  # packed, gate first
    (_B + r"mlp\.weights_out\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (_B + r"mlp\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
    (_B + r"mlp\.up_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_x.\2"),
    (_B + r"mlp\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"classifier\.(weight|bias)", r"head.\1"),
)
# CLIP's and SigLIP's encoder layers are the same modules.
_TOWER_BLOCK_RULES = (
    (_B + r"layer_norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (_B + r"self_attn\.([qkv])_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (_B + r"self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (_B + r"mlp\.(fc[12])\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
)
_CLIP_RULES = (
    (r"embeddings\.class_embedding", "cls_token"),
    (r"embeddings\.patch_embedding\.weight", "patch_embed.proj.weight"),
    (r"embeddings\.position_embedding\.weight", "pos_embed"),
    (r"pre_layrnorm\.(weight|bias)", r"norm_pre.\1"),
    (r"post_layernorm\.(weight|bias)", r"fc_norm.\1"),
    (r"visual_projection\.weight", "head.weight"),
    (r"classifier\.(weight|bias)", r"head.\1"),
    *_TOWER_BLOCK_RULES,
)
_SIGLIP_RULES = (
    (r"embeddings\.patch_embedding\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.position_embedding\.weight", "pos_embed"),
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
    (r"head\.probe", "attn_pool.latent"),
    (r"head\.attention\.in_proj_(weight|bias)", r"attn_pool.in_proj.\1"),
    (r"head\.attention\.out_proj\.(weight|bias)", r"attn_pool.proj.\1"),
    (r"head\.layernorm\.(weight|bias)", r"attn_pool.norm.\1"),
    (r"head\.mlp\.(fc[12])\.(weight|bias)", r"attn_pool.mlp.\1.\2"),
    (r"classifier\.(weight|bias)", r"head.\1"),
    *_TOWER_BLOCK_RULES,
)
_RULES = {"dinov2": _DINOV2_RULES, "clip": _CLIP_RULES, "siglip": _SIGLIP_RULES}

# Weights with no vitkit counterpart that the image features do not use.
_DROPPED = (
    r"embeddings\.mask_token",  # DINOv2's masked-modelling token
    r"embeddings\.position_ids",  # a buffer older CLIP / SigLIP files saved
)
# A two-tower checkpoint's text side.
_TEXT_TOWER = (r"text_model\..*", r"text_projection\.weight", r"logit_scale", r"logit_bias")


def hf_family(state_dict: Mapping[str, Any]) -> str:
    """'vit', 'dinov2', 'clip', 'siglip' or 'vitdet': the Hugging Face model family of the
    weights, from their keys (DINOv2's LayerScale, CLIP's class embedding, SigLIP's and
    VitDet's patch embeddings)."""
    if is_vitdet(state_dict):
        return "vitdet"
    keys = list(state_dict)
    if any(".layer_scale1.lambda1" in k for k in keys):
        return "dinov2"
    if any(k.endswith("embeddings.class_embedding") for k in keys):
        return "clip"
    if any(k.endswith("embeddings.patch_embedding.weight") for k in keys):
        return "siglip"
    return "vit"


def from_hf_any(
    state_dict: Mapping[str, Tensor],
    *,
    config: Any = None,
    num_heads: int | None = None,
    new_head: bool = False,
    **overrides: Any,
) -> tuple[dict[str, Tensor], ViTConfig]:
    """Hugging Face weights of any family vitkit reads (`hf_family`): ViT (`hf.from_hf`),
    DINOv2, CLIP, SigLIP or VitDet (`vitdet.from_hf_vitdet`). The arguments are
    `from_hf_family`'s."""
    family = hf_family(state_dict)
    if family == "vit":
        return from_hf(state_dict, config=config, num_heads=num_heads, **overrides)
    if family == "vitdet":  # vitdet.py
        heads = {} if num_heads is None else {"num_heads": num_heads}
        return from_hf_vitdet(state_dict, config=config, **heads, **overrides)
    return from_hf_family(
        state_dict, family, config=config, num_heads=num_heads, new_head=new_head, **overrides
    )


def from_hf_family(
    state_dict: Mapping[str, Tensor],
    family: str,
    *,
    config: Any = None,
    num_heads: int | None = None,
    new_head: bool = False,
    **overrides: Any,
) -> tuple[dict[str, Tensor], ViTConfig]:
    """A Hugging Face DINOv2, CLIP or SigLIP vision state dict in vitkit's layout, and its config.

    Args:
        state_dict: the weights, in the Hub file layout or transformers 5's module layout,
            with or without their wrapper's prefix (`dinov2.`, `vision_model.`).
        family: 'dinov2', 'clip' or 'siglip' (`hf_family` tells it from the keys).
        config: the `config.json` (a path, a dict or a transformers config; a two-tower
            config's `vision_config` is used). It gives the heads, `hidden_act`,
            `layer_norm_eps` and the image size; without it HF's defaults for the family hold
            and the heads are the standard count of the width.
        num_heads: the head count, overriding the config.
        new_head: the caller fits a new head, so a classifier vitkit cannot hold (DINOv2's,
            on the class token and the mean patch token together) is dropped, not refused.
        overrides: other `ViTConfig` fields.
    """
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(_FAMILIES)}")
    models, prefixes, defaults = _FAMILIES[family]
    hf = hf_config_dict(config)
    if isinstance(hf.get("vision_config"), Mapping):  # a two-tower CLIPConfig / SiglipConfig
        hf = dict(hf["vision_config"])
    hf = {**defaults, **hf}
    sd = _drop_text_tower(state_dict)
    sd, unknown = _rename(sd, prefixes, _RULES[family])
    if unknown:
        raise unknown_weights_error(unknown, models)
    _fuse_qkv(sd)
    cfg: dict[str, Any] = {"norm_eps": hf["layer_norm_eps"]}
    cfg.update(_FAMILY_LAYOUT[family](sd, new_head))
    if "act_layer" not in cfg:  # DINOv2's SwiGLU is SiLU whatever hidden_act says
        cfg["act_layer"] = _activation(hf["hidden_act"], family)
    if "num_attention_heads" in hf:
        cfg["num_heads"] = hf["num_attention_heads"]
    if "image_size" in hf:
        size = hf["image_size"]
        cfg["img_size"] = size if isinstance(size, int) else tuple(size)
    if config is None:
        log.info(
            "Hugging Face %s weights without config.json: assuming hidden_act %r and "
            "layer_norm_eps %s (HF's defaults); pass config= if the model differs",
            family,
            hf["hidden_act"],
            hf["layer_norm_eps"],
        )
    if num_heads is not None:
        cfg["num_heads"] = num_heads
    cfg.update(overrides)
    config_out = infer_config(sd, **cfg)
    check_state_dict(sd, config_out, f"Hugging Face {family}")
    return sd, config_out


# -- the families' own layouts ----------------------------------------------------------------


def _dinov2_layout(sd: dict[str, Tensor], new_head: bool) -> dict[str, Any]:
    """Registers: the class position folded into the class token, positions for the patches
    only. The classifier reads [class token, mean patch token] (2 x D inputs): no vitkit head."""
    options: dict[str, Any] = {}
    if "reg_token" in sd:
        pos = sd["pos_embed"]  # (1, 1 + N, D)
        sd["cls_token"] = sd["cls_token"] + pos[:, :1]  # (1, 1, D)
        sd["pos_embed"] = pos[:, 1:]  # (1, N, D)
        options["no_embed_class"] = True
    fc1, fc2 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.fc2.weight")
    packed = fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]
    if packed or "blocks.0.mlp.fc1_g.weight" in sd:  # use_swiglu_ffn: Hub files / transformers 5
        options["act_layer"] = "silu"
    head = sd.get("head.weight")
    if head is not None:
        if not new_head:
            raise CheckpointError(
                f"Dinov2ForImageClassification's classifier reads the class token and the mean "
                f"patch token together ({head.shape[1]} inputs), which vitkit's head cannot "
                "hold; pass num_classes=N to load_pretrained (new_head=True to the converter) "
                "to load the backbone under a new head"
            )
        log.info("dropped the Dinov2ForImageClassification classifier: a new head replaces it")
        sd.pop("head.weight")
        sd.pop("head.bias", None)
    return options


def _clip_layout(sd: dict[str, Tensor], new_head: bool) -> dict[str, Any]:
    """The class embedding (D,) and the position table (1 + N, D) as vitkit's parameters;
    `post_layernorm` normalises the pooled class token (`fc_norm`), except under
    CLIPForImageClassification's classifier, which averages the un-normalised patch tokens."""
    if "cls_token" in sd:
        sd["cls_token"] = sd["cls_token"].reshape(1, 1, -1)  # (1, 1, D)
    if "pos_embed" in sd:
        sd["pos_embed"] = sd["pos_embed"].unsqueeze(0)  # (1, 1 + N, D)
    if "head.weight" in sd and "head.bias" not in sd:  # the visual projection: no bias
        sd["head.bias"] = torch.zeros(sd["head.weight"].shape[0], dtype=sd["head.weight"].dtype)
        return {"global_pool": "token", "fc_norm": True}
    if "head.weight" in sd:  # CLIPForImageClassification: mean of the patch tokens
        dropped = [k for k in ("fc_norm.weight", "fc_norm.bias") if sd.pop(k, None) is not None]
        if dropped:
            log.info("dropped post_layernorm: CLIPForImageClassification's classifier skips it")
        return {"global_pool": "avg", "fc_norm": False}
    return {"global_pool": "token", "fc_norm": True}


def _siglip_layout(sd: dict[str, Tensor], new_head: bool) -> dict[str, Any]:
    """The position table (N, D) as a parameter; the attention pool's packed q / k / v
    (nn.MultiheadAttention's `in_proj`) split into vitkit's `q` and `kv`. Without the pooling
    head (`vision_use_head=False`), or under SiglipForImageClassification's classifier, the
    tokens are averaged after `post_layernorm`."""
    if "pos_embed" in sd:
        sd["pos_embed"] = sd["pos_embed"].unsqueeze(0)  # (1, N, D)
    for kind in ("weight", "bias"):
        packed = sd.pop(f"attn_pool.in_proj.{kind}", None)
        if packed is not None:
            dim = packed.shape[0] // 3
            sd[f"attn_pool.q.{kind}"] = packed[:dim]  # (D, ...)
            sd[f"attn_pool.kv.{kind}"] = packed[dim:]  # (2 * D, ...): keys, then values
    if "head.weight" in sd:  # SiglipForImageClassification: the mean of all tokens
        pool = [k for k in sd if k.startswith("attn_pool.")]
        for key in pool:
            del sd[key]
        if pool:
            log.info("dropped the attention-pool head: SiglipForImageClassification skips it")
    if "attn_pool.latent" in sd:
        return {"global_pool": "map"}
    return {"global_pool": "avg", "fc_norm": False}


_FAMILY_LAYOUT = {"dinov2": _dinov2_layout, "clip": _clip_layout, "siglip": _siglip_layout}


# -- transformers' own model, for parity checks ----------------------------------------------


def hf_family_model(config: ViTConfig, weights: Mapping[str, Tensor]) -> nn.Module:
    """transformers' model of the DINOv2 / CLIP / SigLIP `weights` converted to `config`,
    holding those weights (read by `from_pretrained`, which knows both key layouts), in eval
    mode. Its forward returns what vitkit's model does with a head (logits, `image_embeds`),
    else the final tokens (`last_hidden_state`). Raises ImportError without transformers."""
    import transformers
    from safetensors.torch import save_file

    class_name, hf_config = _hf_model_config(hf_family(weights), config, transformers)
    with tempfile.TemporaryDirectory() as folder:
        hf_config.save_pretrained(folder)
        tensors = {k: v.contiguous() for k, v in weights.items()}
        save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
        model = getattr(transformers, class_name).from_pretrained(folder)
    return _HFOutput(model, head=config.num_classes > 0).eval()


def _hf_model_config(family: str, config: ViTConfig, transformers: Any) -> tuple[str, Any]:
    """(transformers class name, its config) of the model `config` was converted from."""
    height, width = to_2tuple(config.img_size, "img_size")
    patch_h, patch_w = to_2tuple(config.patch_size, "patch_size")
    if height != width or patch_h != patch_w:
        raise ValueError(f"Hugging Face's {family} models take square images and patches")
    hidden = mlp_hidden_width(config.mlp_layer, config.embed_dim, config.mlp_ratio)
    act = {v: k for k, v in reversed(HF_ACTIVATIONS.items())}[config.act_layer]
    common = {
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads,
        "image_size": height,
        "patch_size": patch_h,
        "layer_norm_eps": config.norm_eps,
        "hidden_act": act,
    }
    if family == "dinov2":
        swiglu = config.mlp_layer != "mlp"
        dim = config.embed_dim
        # HF's config holds an int mlp_ratio; its SwiGLU width is 2/3 of the MLP's, rounded up
        # to a multiple of 8.
        ratios = [
            r
            for r in range(1, 65)
            if hidden == ((int(dim * r * 2 / 3) + 7) // 8 * 8 if swiglu else dim * r)
        ]
        if not ratios:
            raise ValueError(f"no Hugging Face DINOv2 config has an MLP of width {hidden}")
        ratio = ratios[0]
        common.update(mlp_ratio=ratio, use_swiglu_ffn=swiglu, qkv_bias=config.qkv_bias)
        if config.reg_tokens:
            hf = transformers.Dinov2WithRegistersConfig(
                **common, num_register_tokens=config.reg_tokens
            )
            return "Dinov2WithRegistersModel", hf
        return "Dinov2Model", transformers.Dinov2Config(**common)
    if family == "clip":
        vision = transformers.CLIPVisionConfig(
            **common, intermediate_size=hidden, projection_dim=config.num_classes or 512
        )
        if config.num_classes and config.global_pool == "avg":
            hf = transformers.CLIPConfig(
                vision_config=vision.to_dict(), num_labels=config.num_classes
            )
            return "CLIPForImageClassification", hf
        return (
            "CLIPVisionModelWithProjection" if config.num_classes else "CLIPVisionModel"
        ), vision
    vision = transformers.SiglipVisionConfig(
        **common, intermediate_size=hidden, vision_use_head=config.global_pool == "map"
    )
    if config.num_classes:
        hf = transformers.SiglipConfig(
            vision_config=vision.to_dict(), num_labels=config.num_classes
        )
        return "SiglipForImageClassification", hf
    return "SiglipVisionModel", vision


class _HFOutput(nn.Module):
    """A transformers vision model whose forward returns one tensor, as vitkit's model."""

    def __init__(self, inner: nn.Module, head: bool) -> None:
        super().__init__()
        self.inner = inner
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(pixel_values=x)
        if not self.head:
            return out.last_hidden_state
        return out.logits if getattr(out, "logits", None) is not None else out.image_embeds


# -- helpers ----------------------------------------------------------------------------------


def _activation(name: Any, family: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"the Hugging Face {family} model uses hidden_act={name!r}, which vitkit's MLP does "
            f"not have; it has {', '.join(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def _drop_text_tower(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The weights without a two-tower checkpoint's text side (logged)."""
    text = [k for k in state_dict if any(re.fullmatch(p, k) for p in _TEXT_TOWER)]
    if text:
        log.info(
            "two-tower checkpoint: loading the vision tower, dropped %d text weights", len(text)
        )
    return {k: v for k, v in state_dict.items() if k not in set(text)}


def _rename(
    state_dict: Mapping[str, Tensor], prefixes: tuple[str, ...], rules: tuple[tuple[str, str], ...]
) -> tuple[dict[str, Tensor], list[str]]:
    """(renamed weights, keys no rule maps); a wrapper's prefix is removed first and the
    weights in `_DROPPED` are left out."""
    out: dict[str, Tensor] = {}
    unknown: list[str] = []
    dropped: list[str] = []
    for key, value in state_dict.items():
        name = next((key[len(p) :] for p in prefixes if key.startswith(p)), key)
        if any(re.fullmatch(p, name) for p in _DROPPED):
            dropped.append(key)
            continue
        for pattern, target in rules:
            match = re.fullmatch(pattern, name)
            if match:
                out[match.expand(target)] = value
                break
        else:
            unknown.append(key)
    if dropped:
        log.info("dropped Hugging Face weights the features do not use: %s", ", ".join(dropped))
    return out, unknown


def _fuse_qkv(sd: dict[str, Tensor]) -> None:
    """Each block's separate q, k and v projections as vitkit's one `qkv` (3 x D rows)."""
    for key in [k for k in sd if re.fullmatch(r"blocks\.\d+\.attn\.q\.(weight|bias)", k)]:
        parts = [key, key.replace(".attn.q.", ".attn.k."), key.replace(".attn.q.", ".attn.v.")]
        missing = [p for p in parts if p not in sd]
        if missing:
            raise CheckpointError(f"the Hugging Face weights lack {missing[0]} beside {key}")
        sd[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat([sd.pop(p) for p in parts], dim=0)
    orphans = [k for k in sd if re.fullmatch(r"blocks\.\d+\.attn\.[kv]\.(weight|bias)", k)]
    if orphans:
        raise CheckpointError(f"the Hugging Face weights have {orphans[0]} without its query")
