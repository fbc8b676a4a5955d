"""`load_pretrained` for relative-position ViT weights: the model they go into, holding them.

Fine-tuning at another resolution needs nothing of the weights: the bias MLP computes the bias of
any patch grid from its offsets (Swin V2's continuous position bias), as timm's `set_input_size`
does. A new patch size PI-resizes the patch kernel (FlexiViT); a new number of classes gets a
fresh head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...data.data_config import DataConfig
from ...model import build_model
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import resample_patch_embed
from ...model.relpos import RelPosConfig, RelPosViT
from ..checkpoint import CheckpointError, load_into
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias")


def fill_relpos(
    weights: SourceWeights, model: RelPosViT | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> RelPosViT:
    """`model` (or a new one of the weights' config with `overrides` and the fitting's image
    size, patch size and classes) holding the weights; eval mode, with the data config the
    source states (else timm's default for these models) at the model's input size."""
    if fitting.distilled:
        raise CheckpointError(
            "a relative-position ViT has no distillation token; load it with distilled=None"
        )
    if fitting.pos_resample != "timm":
        raise CheckpointError(
            f"relative-position ViT weights have no position table; "
            f"pos_resample={fitting.pos_resample!r} is for ViT weights: drop it"
        )
    source: RelPosConfig = weights.config
    if model is None:
        target = source.replace(**overrides)
        for name in ("img_size", "patch_size", "num_classes"):
            if getattr(fitting, name) is not None:
                target = target.replace(**{name: getattr(fitting, name)})
        model = build_model(target)
    elif fitting.num_classes is not None and fitting.num_classes != model.num_classes:
        model.reset_classifier(fitting.num_classes)
    state_dict = fitted_state_dict(dict(weights.state_dict), source, model)
    load_into(model, state_dict, source=f"{weights.format} relative-position ViT checkpoint")
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    data_config = weights.data_config or _timm_default(model, weights.name)
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: RelPosConfig, model: RelPosViT
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: a fresh head for another class count, the
    patch kernel PI-resized."""
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
            "resampling the patch embedding from %s to %s", tuple(kernel.shape[-2:]), new_patch
        )
        state_dict["patch_embed.proj.weight"] = resample_patch_embed(kernel, new_patch)
    return state_dict


def _timm_default(model: RelPosViT, source: str) -> DataConfig:
    """timm's data config of these models (mean and std 0.5, bicubic, centre crop 0.9), said in
    one log line."""
    cfg = model.pretrained_cfg
    log.info(
        "%s states no data config; assuming timm's relative-position ViT defaults: mean %s, "
        "std %s, bicubic, centre crop 0.9",
        source,
        cfg["mean"],
        cfg["std"],
    )
    height, width = to_2tuple(model.config.img_size, "img_size")
    return DataConfig(
        input_size=(model.config.in_chans, height, width),
        mean=cfg["mean"],
        std=cfg["std"],
        interpolation=cfg["interpolation"],
        crop_pct=cfg["crop_pct"],
    )
