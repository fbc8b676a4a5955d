"""`load_pretrained` for BEiT weights: the model they go into, holding them, fitted as timm's
`checkpoint_filter_fn` fits them.

Fine-tuning at another resolution resamples the absolute position table where the model has
one (bicubic, antialiased, the class token kept apart: timm's `resample_abs_pos_embed`) and
resizes every relative position table to the new grid (BEiT's geometric resize:
layers/rel_pos_bias.py); a new patch size PI-resizes the patch kernel (FlexiViT); a new number
of classes gets a freshly initialised head. Weights with one shared table going into a model
with a table per block (an original pre-training checkpoint fine-tuned, as BEiT's fine-tuning
code does it) give each block a copy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ...data.data_config import DataConfig
from ...model import build_model
from ...model.beit import Beit, BeitConfig
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import resample_patch_embed, resample_pos_embed
from ...model.layers.rel_pos_bias import CLASS_ROWS, resize_rel_pos_bias_table
from ..checkpoint import CheckpointError, load_into
from ..source import Fitting, SourceWeights
from .timm import SHARED_TABLE

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias")
_TABLE = "relative_position_bias_table"


def fill_beit(
    weights: SourceWeights, model: Beit | None, fitting: Fitting, overrides: Mapping[str, Any]
) -> Beit:
    """`model` (or a new one of the weights' config with `overrides` and the fitting's image
    size, patch size and classes) holding the weights; eval mode, with the data config the
    source states (else timm's BEiT default) at the model's input size, and its class names
    where they fit the head."""
    if fitting.distilled:
        raise CheckpointError("a BEiT has no distillation token; load it with distilled=None")
    if fitting.pos_resample != "timm":
        raise CheckpointError(
            f"BEiT weights are resampled as timm's; pos_resample={fitting.pos_resample!r} is for "
            "ViT weights: drop it"
        )
    source: BeitConfig = weights.config
    if model is None:
        target = source.replace(**overrides)
        for name in ("img_size", "patch_size", "num_classes"):
            if getattr(fitting, name) is not None:
                target = target.replace(**{name: getattr(fitting, name)})
        model = build_model(target)
    elif fitting.num_classes is not None and fitting.num_classes != model.num_classes:
        model.reset_classifier(fitting.num_classes)
    state_dict = fitted_state_dict(dict(weights.state_dict), source, model)
    load_into(model, state_dict, source=f"{weights.format} BEiT checkpoint")
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    data_config = weights.data_config or _timm_default(model, weights.name)
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def fitted_state_dict(
    state_dict: dict[str, Tensor], source: BeitConfig, model: Beit
) -> dict[str, Tensor]:
    """The weights of `source` fitted to `model`: its own fresh head for another class count,
    the patch kernel PI-resized to its patch size, the position table resampled to its grid,
    a shared table copied to each block that has its own, every table resized to its grid."""
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
        old_patch = tuple(kernel.shape[-2:])
        log.info("resampling the patch embedding from %s to %s (PI-resize)", old_patch, new_patch)
        state_dict["patch_embed.proj.weight"] = resample_patch_embed(kernel, new_patch)
    old_grid, new_grid = source.grid_size, model.patch_embed.grid_size
    if "pos_embed" in state_dict and old_grid != new_grid:
        log.info("resampling the position embedding from grid %s to %s", old_grid, new_grid)
        state_dict["pos_embed"] = resample_pos_embed(
            state_dict["pos_embed"], new_size=new_grid, old_size=old_grid, num_prefix_tokens=1
        )
    _share_out(state_dict, own)
    for key in [k for k in state_dict if k.endswith(_TABLE)]:
        if key in own and state_dict[key].shape != own[key].shape:
            state_dict[key] = resize_rel_pos_bias_table(
                state_dict[key], new_grid, old_grid, extra_rows=CLASS_ROWS
            )
    return state_dict


def _share_out(state_dict: dict[str, Tensor], own: Mapping[str, Tensor]) -> None:
    """A shared table, where the model has a table per block and none shared, copied to each
    block (BEiT's fine-tuning of a pre-trained checkpoint)."""
    if SHARED_TABLE not in state_dict or SHARED_TABLE in own:
        return
    blocks = [k for k in own if k.startswith("blocks.") and k.endswith(_TABLE)]
    if not blocks:
        return
    log.info("copying the shared relative position table to each of %d blocks", len(blocks))
    shared = state_dict.pop(SHARED_TABLE)
    for key in blocks:
        state_dict[key] = shared.clone()


def _timm_default(model: Beit, source: str) -> DataConfig:
    """timm's BEiT data config (mean and std 0.5, bicubic, centre crop 0.9), said in one log
    line."""
    cfg = model.pretrained_cfg
    log.info(
        "%s states no data config; assuming timm's BEiT defaults: mean %s, std %s, "
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
