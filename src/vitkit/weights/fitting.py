"""What every family's `fill` (`WeightsFamily.fill`) does alike, stated once: the checks of
the fitting options a family of timm's layout does not take, the model built (or its head
reset) for the fitting's size and classes, the weights fitted (a fresh head for another class
count, the patch kernel PI-resized: FlexiViT) and loaded, the data config the source states
(else the family's timm default, said in one line) and the class names where they fit.

A family's room keeps what is its own: how its position tables follow a new grid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ..data.data_config import DataConfig, channel_stats
from ..model import build_model
from ..model.layers.patch_embed import to_2tuple
from ..model.layers.pos_embed import resample_patch_embed
from .checkpoint import CheckpointError, load_into
from .source import Fitting, SourceWeights

log = logging.getLogger(__name__)

# (state dict, the weights' config, the model) -> the state dict fitted to the model
Fit = Callable[[dict[str, Tensor], Any, nn.Module], dict[str, Tensor]]


def fill_model(
    weights: SourceWeights,
    model: nn.Module | None,
    fitting: Fitting,
    overrides: Mapping[str, Any],
    *,
    title: str,
    fit: Fit,
) -> nn.Module:
    """`model` (or a new one of the weights' config with `overrides` and the fitting's image
    size, patch size and classes) holding the weights fitted by `fit`; eval mode, with the data
    config the source states (else the family's timm default) at the model's input size, and
    its class names where they fit the head. `title` names the family in messages ('EVA')."""
    if fitting.distilled:
        raise CheckpointError(
            f"{title} weights have no distillation token; load them with distilled=None"
        )
    if fitting.pos_resample != "timm":
        raise CheckpointError(
            f"{title} weights are fitted as timm's; pos_resample={fitting.pos_resample!r} is "
            "for ViT weights: drop it"
        )
    source = weights.config
    if model is None:
        target = source.replace(**overrides)
        for name in ("img_size", "patch_size", "num_classes"):
            if getattr(fitting, name) is not None:
                target = target.replace(**{name: getattr(fitting, name)})
        model = build_model(target)
    elif fitting.num_classes is not None and fitting.num_classes != model.num_classes:
        model.reset_classifier(fitting.num_classes)
    state_dict = fit(dict(weights.state_dict), source, model)
    load_into(model, state_dict, source=f"{weights.format} {title} checkpoint")
    chans, (height, width) = model.config.in_chans, to_2tuple(model.config.img_size, "img_size")
    data_config = weights.data_config or timm_default_data_config(model, weights.name, title)
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def fresh_head(
    state_dict: dict[str, Tensor],
    own: Mapping[str, Tensor],
    classes: tuple[int, int],
    head_keys: Sequence[str],
) -> None:
    """The model's own (freshly initialised) head in place of the weights' where the class
    counts (model's, weights') differ."""
    ours, theirs = classes
    if ours == theirs:
        return
    log.info("new %d-class head (the checkpoint has %d): fine-tune it", ours, theirs)
    for key in head_keys:
        state_dict.pop(key, None)
        if key in own:
            state_dict[key] = own[key]


def fit_patch_kernel(state_dict: dict[str, Tensor], own: Mapping[str, Tensor]) -> None:
    """The patch kernel (D, C, p, p) PI-resized to the model's patch size (FlexiViT)."""
    key = "patch_embed.proj.weight"
    old, new = tuple(state_dict[key].shape[-2:]), tuple(own[key].shape[-2:])
    if old != new:
        log.info("resampling the patch embedding from %s to %s (PI-resize)", old, new)
        state_dict[key] = resample_patch_embed(state_dict[key], new)


def timm_default_data_config(model: nn.Module, source: str, title: str) -> DataConfig:
    """The data config of the model's timm `pretrained_cfg` (its family's default: mean, std,
    bicubic, centre crop 0.9), for weights that state none, said in one log line; the mean and
    std mapped to the model's channels (grey weights adapted from RGB: their average)."""
    cfg, chans = model.pretrained_cfg, model.config.in_chans
    log.info(
        "%s states no data config; assuming timm's %s defaults: mean %s, std %s, "
        "%s, centre crop %s",
        source,
        title,
        cfg["mean"],
        cfg["std"],
        cfg["interpolation"],
        cfg["crop_pct"],
    )
    height, width = to_2tuple(model.config.img_size, "img_size")
    return DataConfig(
        input_size=(chans, height, width),
        mean=channel_stats(cfg["mean"], chans),
        std=channel_stats(cfg["std"], chans),
        interpolation=cfg["interpolation"],
        crop_pct=cfg["crop_pct"],
    )
