"""`load_pretrained` for SAM ViT weights: the model they go into, holding them.

Fine-tuning at another resolution resamples the absolute position map (bicubic, antialiased:
timm's `resample_abs_pos_embed_nhwc`) and linearly interpolates the global blocks'
relative-position tables to the new grid (2 * grid - 1 rows, as timm's `get_rel_pos` reads a
table at another size; window blocks' tables keep the window's). A new patch size PI-resizes
the patch kernel (FlexiViT); a new number of classes gets a fresh head.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...data.data_config import DataConfig
from ...model import build_model
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import resample_patch_embed, resample_pos_embed
from ...model.layers.window import resize_rel_pos
from ...model.sam import SamConfig, SamViT
from ..checkpoint import CheckpointError, load_into
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.fc.weight", "head.fc.bias")


def fill_sam(
    weights: SourceWeights, model: SamViT | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> SamViT:
    """`model` (or a new one of the weights' config with `overrides` and the fitting's image
    size, patch size and classes) holding the weights; eval mode, with the data config the
    source states (else timm's SAM default) at the model's input size."""
    if fitting.distilled:
        raise CheckpointError("a SAM ViT has no distillation token; load it with distilled=None")
    if fitting.pos_resample != "timm":
        raise CheckpointError(
            f"SAM ViT weights are resampled as timm's; pos_resample={fitting.pos_resample!r} is "
            "for ViT weights: drop it"
        )
    source: SamConfig = weights.config
    if model is None:
        target = source.replace(**overrides)
        for name in ("img_size", "patch_size", "num_classes"):
            if getattr(fitting, name) is not None:
                target = target.replace(**{name: getattr(fitting, name)})
        model = build_model(target)
    elif fitting.num_classes is not None and fitting.num_classes != model.num_classes:
        model.reset_classifier(fitting.num_classes)
    state_dict = fitted_state_dict(dict(weights.state_dict), source, model)
    load_into(model, state_dict, source=f"{weights.format} SAM ViT checkpoint")
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    data_config = weights.data_config or _timm_default(model, weights.name)
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: SamConfig, model: SamViT
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: a fresh head for another class count, the
    patch kernel PI-resized, the position map resampled and the global relative-position
    tables interpolated to its grid."""
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
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if old_grid == new_grid:
        return state_dict
    log.info("resampling the positions from grid %s to %s", old_grid, new_grid)
    if "pos_embed" in state_dict:
        dim = state_dict["pos_embed"].shape[-1]
        flat = state_dict["pos_embed"].reshape(1, -1, dim)  # (1, h * w, D)
        flat = resample_pos_embed(flat, new_grid, old_grid, num_prefix_tokens=0)
        state_dict["pos_embed"] = flat.reshape(1, *new_grid, dim)  # (1, h', w', D)
    for key, table in list(state_dict.items()):
        if key.endswith((".rel_pos_h", ".rel_pos_w")):
            state_dict[key] = resize_rel_pos(table, own[key].shape[0])
    return state_dict


def _timm_default(model: SamViT, source: str) -> DataConfig:
    """timm's SAM data config (ImageNet mean and std, bicubic, centre crop 0.9), said in one
    log line."""
    cfg = model.pretrained_cfg
    log.info(
        "%s states no data config; assuming timm's SAM ViT defaults: mean %s, std %s, "
        "bicubic, centre crop 0.9",
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
