"""Relative-position ViT weights from timm (`vision_transformer_relpos.py`): a state dict, a file
or a Hub folder. vitkit's `RelPosViT` has timm's module and parameter names, so timm's keys are
kept.

The keys are told by the bias MLP (`blocks.0.attn.rel_pos.mlp.fc1`, or `shared_rel_pos.mlp.fc1`
for one shared by every block), which no other family has. The tensors show the sizes, the heads
(the MLP's outputs), the MLP's width and mode (Swin V2's has no output bias), a class token,
`fc_norm` and LayerScale; they do not show the image size (the bias is computed for any grid),
the pooling of a class-token model, nor whether blocks without LayerScale are post-norm: those
come from the name (`arch=`), else timm's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...model import build_model, find_architecture, get_config, list_models
from ...model.relpos import RelPosConfig
from ..checkpoint import ArchMismatchError, CheckpointError, mismatch_report, strip_prefix


def _bias_mlp(keys: Any) -> str | None:
    """The key prefix of the first bias MLP, or None."""
    for prefix in ("blocks.0.attn.rel_pos.mlp.", "shared_rel_pos.mlp."):
        if f"{prefix}fc1.weight" in keys:
            return prefix
    return None


def is_relpos_state_dict(keys: Any) -> bool:
    """Whether the keys are a relative-position ViT's."""
    keys = {k.removeprefix("module.") for k in keys}
    return _bias_mlp(keys) is not None and "patch_embed.proj.weight" in keys


def shown_options(sd: Mapping[str, Tensor], named: RelPosConfig) -> dict[str, Any]:
    """The `RelPosConfig` options the tensors show."""
    proj = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    dim, mlp = proj.shape[0], _bias_mlp(sd)
    assert mlp is not None
    layerscale = "blocks.0.ls1.gamma" in sd
    shown: dict[str, Any] = {
        "embed_dim": dim,
        "in_chans": proj.shape[1],
        "patch_size": proj.shape[2],
        "depth": len({k.split(".")[1] for k in sd if k.startswith("blocks.")}),
        "num_heads": sd[f"{mlp}fc2.weight"].shape[0],
        "mlp_ratio": sd["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd,
        "qk_norm": "blocks.0.attn.q_norm.weight" in sd,
        "class_token": "cls_token" in sd,
        "fc_norm": "fc_norm.weight" in sd,
        "rel_pos_dim": sd[f"{mlp}fc1.weight"].shape[0],
        "rel_pos_type": "mlp" if f"{mlp}fc2.bias" in sd else "mlp_swin",
        "shared_rel_pos": mlp.startswith("shared"),
        "num_classes": sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        "res_post_norm": named.res_post_norm and not layerscale,
    }
    if not shown["res_post_norm"]:
        shown["init_values"] = (named.init_values or 1e-6) if layerscale else None
    if not shown["class_token"] and named.global_pool == "token":
        shown["global_pool"] = "avg"
    return shown


def relpos_config(
    sd: Mapping[str, Tensor], arch: str | None, overrides: Mapping[str, Any]
) -> RelPosConfig:
    """The config of timm relative-position ViT weights: what they show over the config of
    `arch` (timm's defaults without one) and the `overrides`, checked key by key."""
    named = get_config(arch) if arch is not None else RelPosConfig()
    if not isinstance(named, RelPosConfig):
        title = find_architecture(named).title
        what = f"the keys of timm's vision_transformer_relpos.py, not a {title}'s"
        raise ArchMismatchError(arch, what)
    try:
        config = named.replace(**{**shown_options(sd, named), **overrides})
    except ValueError as err:
        raise CheckpointError(f"timm relative-position ViT weights: {err}") from None
    with torch.device("meta"):
        expected = {k: v.shape for k, v in build_model(config).state_dict().items()}
    report = mismatch_report(expected, sd)
    if report:
        raise CheckpointError(
            f"timm relative-position ViT weights do not match their sizes ({report}); pass the "
            "arch= they were made for"
        )
    return config


def from_timm_relpos(
    state_dict: Mapping[str, Tensor], *, arch: str | None = None, **overrides: Any
) -> tuple[dict[str, Tensor], RelPosConfig]:
    """A timm relative-position ViT state dict and its `RelPosConfig`.

    Args:
        state_dict: the weights (timm's keys, optionally DDP's `module.` prefix).
        arch: the timm name they were made for; it gives what the weights do not show.
        overrides: `RelPosConfig` fields over both (a timm folder's `model_args`).
    """
    sd = strip_prefix(state_dict, "module.")
    if arch is not None and arch not in list_models():
        raise CheckpointError(f"unknown model name {arch!r}; see vitkit.list_models('*relpos*')")
    fields = RelPosConfig.__dataclass_fields__
    options = {k: v for k, v in overrides.items() if k in fields and v is not None}
    return sd, relpos_config(sd, arch, options)
