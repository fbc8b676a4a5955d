"""EVA weights from timm (`eva.py`): a state dict, a file or a Hub folder. vitkit's `Eva` has
timm's module and parameter names, so timm's keys are kept (original layouts are moved to them
as timm moves them, `original.py`): the keys are told from a ViT's, the sizes read from the
tensors over the config of the timm name they were made for, and every key and shape checked
before anything loads.

EVA's keys are told by what timm's `VisionTransformer` never has: EVA's attention biases
(`blocks.0.attn.q_bias` beside a `qkv.weight` without `qkv.bias`) or its unfused projections
(`attn.q_proj`), EVA's LayerScale (`blocks.0.gamma_1`, where the ViT has `ls1.gamma`),
RoPE-Mixed's learned frequencies (`rope.freqs`), and a Perception Encoder's attention pool
after a pre-norm (`attn_pool.latent` with `norm_pre`). `attn.norm`, `mlp.norm` and `mlp.fc1_g`
are no sign: timm's ViT has them too (`scale_attn_norm`, `scale_mlp_norm`, AIMv2's SwiGLU).
BEiT shares `q_bias` and `gamma_1` but has relative position tables; its weights are not
EVA's. Weights with none of these signs (a Perception Encoder without LayerScale, say) are an
EVA's only by their name: `arch=` or a timm folder's `architecture`.

The weights show the sizes (width, depth, patch, channels, classes, MLP width, register
tokens, the position grid, grouped key / value heads); they do not show the rotary embedding,
the head count (except through `q_norm` or RoPE-Mixed's frequencies), the norm epsilon or the
block order. The name gives those: without one the load is refused in one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ...model import build_model, find_architecture, get_config, list_models
from ...model.eva import EvaConfig
from ..checkpoint import (
    ArchMismatchError,
    CheckpointError,
    MissingOptionError,
    mismatch_report,
    strip_prefix,
)
from .original import original_keys, timm_eva_layout

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def is_eva_state_dict(keys: Sequence[str]) -> bool:
    """Whether the keys (timm / vitkit layout, or an original one `original.py` moves) are an
    EVA's, not a ViT's nor a BEiT's."""
    keys = {k.removeprefix("module.") for k in keys}
    if any(k.startswith("patch_embed.backbone.") for k in keys):  # a hybrid ViT's CNN stem
        return False
    if original_keys(keys):
        return True
    if any("relative_position_bias_table" in k for k in keys):  # BEiT (or a Swin)
        return False
    eva_bias = "blocks.0.attn.q_bias" in keys and "blocks.0.attn.qkv.bias" not in keys
    return (
        eva_bias
        or "blocks.0.attn.q_proj.weight" in keys
        or "blocks.0.gamma_1" in keys
        or "rope.freqs" in keys
        or ("attn_pool.latent" in keys and "norm_pre.weight" in keys)
    )


def eva_layout(state_dict: Mapping[str, Tensor], arch: str | None = None) -> dict[str, Tensor]:
    """timm's keys: without a DDP `module.` prefix, an original layout moved as timm's
    `checkpoint_filter_fn` moves it (`original.py`; DINOv3's biases as `arch` has them)."""
    sd = strip_prefix(state_dict, "module.")
    if not original_keys(sd):
        return sd
    named = get_config(arch) if arch in list_models() else None
    return timm_eva_layout(sd, qkv_bias=named.qkv_bias if isinstance(named, EvaConfig) else True)


def _depth(sd: Mapping[str, Tensor]) -> int:
    blocks = {int(m[1]) for m in map(_BLOCK.match, sd) if m}
    return max(blocks) + 1 if blocks else 0


def _head_count(sd: Mapping[str, Tensor], dim: int) -> int | None:
    """The heads the tensors show: `q_norm` has one head's width, RoPE-Mixed's frequencies
    are (2, depth, heads, head_dim / 2)."""
    if "blocks.0.attn.q_norm.weight" in sd:
        return dim // sd["blocks.0.attn.q_norm.weight"].shape[0]
    if "rope.freqs" in sd:
        return sd["rope.freqs"].shape[2]
    return None


def _mlp_ratio(named: EvaConfig, dim: int, hidden: int) -> float:
    """The ratio that gives the hidden width `hidden` at width `dim` (timm: `int(dim *
    ratio)`, rounded up to `swiglu_align_to` where SwiGLU is aligned): the name's where it
    does."""
    width, align = int(dim * named.mlp_ratio), named.swiglu_align_to
    if hidden in (width, width + (-width % align if align else 0)):
        return named.mlp_ratio
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else (hidden + 0.5) / dim


def _grid_size(named: EvaConfig, sd: Mapping[str, Tensor], prefix: int, patch: int) -> Any:
    """The image size of the position table's grid: the name's when the grids agree, else
    the square the table holds."""
    if "pos_embed" not in sd:
        return named.img_size
    patches = sd["pos_embed"].shape[1] - (0 if named.no_embed_class else prefix)
    rows, cols = named.grid_size
    if patches == rows * cols and patch == named.patch_size:
        return named.img_size
    side = math.isqrt(patches)
    if side * side != patches:
        raise CheckpointError(
            f"the position table holds {patches} patches, no square grid; pass the img_size=(h, w) "
            "the weights were made for"
        )
    return side * patch


def shown_options(sd: Mapping[str, Tensor], named: EvaConfig) -> dict[str, Any]:
    """The `EvaConfig` sizes the tensors show, with the name's where they cannot tell."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    dim = proj.shape[0]
    heads = _head_count(sd, dim) or named.num_heads
    regs = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    prefix = int("cls_token" in sd) + regs
    shown: dict[str, Any] = {
        "embed_dim": dim,
        "in_chans": proj.shape[1],
        "patch_size": proj.shape[2],
        "depth": _depth(sd),
        "num_heads": heads,
        "num_classes": sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        "class_token": "cls_token" in sd,
        "num_reg_tokens": regs,
        "use_abs_pos_emb": "pos_embed" in sd,
        "mlp_ratio": _mlp_ratio(named, dim, sd["blocks.0.mlp.fc2.weight"].shape[1]),
        "img_size": _grid_size(named, sd, prefix, proj.shape[2]),
    }
    if "blocks.0.attn.k_proj.weight" in sd and dim % heads == 0:
        head_dim = dim // heads
        kv = tuple(
            sd[f"blocks.{i}.attn.k_proj.weight"].shape[0] // head_dim for i in range(shown["depth"])
        )
        shown["num_kv_heads"] = () if set(kv) == {heads} else kv
    return shown


def eva_config(
    sd: Mapping[str, Tensor], arch: str | None, overrides: Mapping[str, Any]
) -> EvaConfig:
    """The config of timm EVA weights: what they show over the config of `arch` (an EVA
    name of `vitkit.list_models()`) and the `overrides` (`EvaConfig` fields)."""
    if arch is None:
        raise MissingOptionError(
            "timm EVA weights do not record their rotary embedding, head count nor norm epsilon",
            ("arch",),
        )
    named = get_config(arch)
    if not isinstance(named, EvaConfig):
        title = find_architecture(named).title
        raise ArchMismatchError(arch, f"the keys of timm's eva.py, and it is a {title} name")
    shown = shown_options(sd, named.replace(**overrides))
    if "num_heads" in overrides:
        shown["num_heads"] = overrides["num_heads"]
    try:
        config = named.replace(**{**shown, **overrides})
    except ValueError as err:
        raise CheckpointError(f"timm EVA weights read as {arch}: {err}") from None
    with torch.device("meta"):
        expected = {k: v.shape for k, v in build_model(config).state_dict().items()}
    report = mismatch_report(expected, sd)
    if report:
        raise CheckpointError(
            f"timm EVA weights do not match {arch} at their sizes ({report}); pass the arch= "
            "they were made for"
        )
    return config


def from_timm_eva(
    state_dict: Mapping[str, Tensor],
    *,
    arch: str | None = None,
    num_heads: int | None = None,
    **overrides: Any,
) -> tuple[dict[str, Tensor], EvaConfig]:
    """A timm EVA state dict in timm's layout and its `EvaConfig`.

    Args:
        state_dict: the weights (timm's keys, optionally DDP's `module.` prefix).
        arch: the timm name they were made for ('eva02_small_patch14_224'): it gives what
            the weights do not show (rotary embedding, heads, norm epsilon, block order).
        num_heads: the head count, over the name's.
        overrides: `EvaConfig` fields over both (a timm folder's `model_args`).
    """
    sd = eva_layout(state_dict, arch)
    fields = EvaConfig.__dataclass_fields__
    options = {k: v for k, v in overrides.items() if k in fields}
    if num_heads is not None:
        options["num_heads"] = num_heads
    return sd, eva_config(sd, arch, options)
