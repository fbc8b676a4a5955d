"""`load_pretrained` for EVA weights: the model they go into, holding them.

Fine-tuning at another resolution resamples the absolute position table where the model has
one (bicubic, antialiased, prefix tokens kept apart: timm's `resample_abs_pos_embed`, as its
`checkpoint_filter_fn` does); the rotary embedding follows the new patch grid by itself, scaled
to the pre-training grid (`ref_feat_shape`) as timm's. A new patch size PI-resizes the patch
kernel (FlexiViT); a new number of classes gets a freshly initialised head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...data.data_config import DataConfig, channel_stats
from ...model import build_model
from ...model.eva import Eva, EvaConfig
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import resample_patch_embed, resample_pos_embed
from ..checkpoint import CheckpointError, load_into
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias")


def fill_eva(
    weights: SourceWeights, model: Eva | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> Eva:
    """`model` (or a new one of the weights' config with `overrides` and the fitting's image
    size, patch size and classes) holding the weights; eval mode, with the data config the
    source states (else timm's EVA default) at the model's input size, and its class names
    where they fit the head."""
    if fitting.distilled:
        raise CheckpointError("an EVA has no distillation token; load it with distilled=None")
    if fitting.pos_resample != "timm":
        raise CheckpointError(
            f"EVA weights are resampled as timm's; pos_resample={fitting.pos_resample!r} is for "
            "ViT weights: drop it"
        )
    source: EvaConfig = weights.config
    if model is None:
        target = source.replace(**overrides)
        for name in ("img_size", "patch_size", "num_classes"):
            if getattr(fitting, name) is not None:
                target = target.replace(**{name: getattr(fitting, name)})
        model = build_model(target)
    elif fitting.num_classes is not None and fitting.num_classes != model.num_classes:
        model.reset_classifier(fitting.num_classes)
    state_dict = fitted_state_dict(dict(weights.state_dict), source, model)
    load_into(model, state_dict, source=f"{weights.format} EVA checkpoint")
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    data_config = weights.data_config or _timm_default(model, weights.name)
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: EvaConfig, model: Eva
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: its own fresh head for another class count,
    the patch kernel PI-resized to its patch size, the position table resampled to its grid."""
    own = model.state_dict()
    if model.num_classes != source.num_classes:
        log.info(
            "new %d-class head (the checkpoint has %d): fine-tune it",
            model.num_classes,
            source.num_classes,
        )
        for key in _HEAD_KEYS:
            state_dict.pop(key, None)
            if key in own:
                state_dict[key] = own[key]
    kernel = state_dict["patch_embed.proj.weight"]  # (D, C, p, p)
    new_patch = tuple(own["patch_embed.proj.weight"].shape[-2:])
    if tuple(kernel.shape[-2:]) != new_patch:
        log.info(
            "resampling the patch embedding from %s to %s (PI-resize)",
            tuple(kernel.shape[-2:]),
            new_patch,
        )
        state_dict["patch_embed.proj.weight"] = resample_patch_embed(kernel, new_patch)
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if "pos_embed" in state_dict and old_grid != new_grid:
        log.info("resampling the position embedding from grid %s to %s", old_grid, new_grid)
        state_dict["pos_embed"] = resample_pos_embed(
            state_dict["pos_embed"],
            new_size=new_grid,
            old_size=old_grid,
            num_prefix_tokens=0 if source.no_embed_class else source.num_prefix_tokens,
        )
    return state_dict


def _timm_default(model: Eva, source: str) -> DataConfig:
    """timm's EVA data config (OpenAI CLIP mean and std, bicubic, centre crop 0.9), said in
    one log line."""
    cfg = model.pretrained_cfg
    log.info(
        "%s states no data config; assuming timm's EVA defaults: mean %s, std %s, "
        "bicubic, centre crop 0.9",
        source,
        cfg["mean"],
        cfg["std"],
    )
    height, width = to_2tuple(model.config.img_size, "img_size")
    return DataConfig(
        input_size=(model.config.in_chans, height, width),
        mean=channel_stats(cfg["mean"], model.config.in_chans),  # adapted weights: their map
        std=channel_stats(cfg["std"], model.config.in_chans),
        interpolation=cfg["interpolation"],
        crop_pct=cfg["crop_pct"],
    )
