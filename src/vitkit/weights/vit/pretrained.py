"""`load_pretrained` for ViT weights: the model they go into, holding them.

Fine-tuning at another resolution resamples the learned position grid (Dosovitskiy et al.
2021, Section 3.2; bicubic, class token kept apart, as timm's `resample_abs_pos_embed`), a new
patch size PI-resizes the patch embedding (FlexiViT), a new number of classes gets a freshly
initialised head, and a distillation token can be added (DeiT).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...model import VisionTransformer, ViTConfig
from ...model.layers.patch_embed import to_2tuple
from ...model.layers.pos_embed import resample_patch_embed, resample_pos_embed
from ...model.vit.torch_encoder import native_to_torch_state_dict
from ..checkpoint import CheckpointError, load_into
from ..preprocessing import assumed_data_config
from ..source import Fitting, SourceWeights

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")


def fill_vit(
    weights: SourceWeights,
    model: VisionTransformer | None,
    fitting: Fitting,
    overrides: Mapping[str, Any],
) -> VisionTransformer:
    """`model` (or a new one of the weights' config with `overrides`) holding the weights,
    fitted as `fitting` says; eval mode, with the data config the source states (at the
    model's input size) and its class names where they fit the head."""
    target = _target_config(weights.config, model, fitting, overrides)
    state_dict = adapt_state_dict(weights.state_dict, weights.config, target, fitting.pos_resample)
    model = _fill(model, target, state_dict, weights)
    data_config = weights.data_config or assumed_data_config(
        weights.format, weights.config, weights.name
    )
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.config.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def _target_config(
    source: ViTConfig,
    model: VisionTransformer | None,
    fitting: Fitting,
    overrides: Mapping[str, Any],
) -> ViTConfig:
    """The config of the model the weights go into: the given model's, else the weights' with
    the `overrides` and the fitting's new sizes."""
    if model is not None:
        target = model.config
    else:  # the options that are config fields (e.g. drop_path_rate) shape the new model
        target = source.replace(**overrides)
        if fitting.patch_size is not None:
            target = target.replace(patch_size=fitting.patch_size)
        if fitting.distilled is not None:
            target = target.replace(distilled=fitting.distilled)
        if fitting.img_size is not None:
            target = target.replace(img_size=fitting.img_size)
    if fitting.num_classes is not None:
        target = target.replace(num_classes=fitting.num_classes)
    return target


def _fill(
    model: VisionTransformer | None,
    target: ViTConfig,
    state_dict: dict[str, Tensor],
    weights: SourceWeights,
) -> VisionTransformer:
    """`model` (or a new one of `target`) holding `state_dict`; a new head, or the new
    distillation token's head, keeps the model's fresh initialisation."""
    if model is None:
        model = VisionTransformer(target)
    elif model.config.num_classes != target.num_classes:
        model.reset_classifier(target.num_classes)
    if target.num_classes != weights.config.num_classes:
        log.info(
            "new %d-class head (the checkpoint has %d): fine-tune it",
            target.num_classes,
            weights.config.num_classes,
        )
        own = model.state_dict()  # the model's freshly initialised head
        state_dict.update({k: own[k] for k in _HEAD_KEYS if k in own})
    elif target.distilled and not weights.config.distilled:  # the new token's own head
        own = model.state_dict()
        state_dict.update({k: own[k] for k in _HEAD_KEYS if k.startswith("head_dist")})
    if model.config.encoder == "torch":
        state_dict = _torch_layout(state_dict)
    load_into(model, state_dict, source=f"{weights.format} checkpoint")
    return model


# How each library resamples a learned position grid to another resolution: timm's
# `resample_abs_pos_embed` (bicubic, antialiased), Hugging Face's `interpolate_pos_encoding`
# (bicubic) and torchvision's `interpolate_embeddings` (bicubic, corners aligned).
POS_RESAMPLE_MODES: dict[str, dict[str, bool]] = {
    "timm": {"antialias": True, "align_corners": False},
    "hf": {"antialias": False, "align_corners": False},
    "torchvision": {"antialias": False, "align_corners": True},
}


def adapt_state_dict(
    state_dict: dict[str, Tensor],
    source: ViTConfig,
    target: ViTConfig,
    pos_resample: str = "timm",
) -> dict[str, Tensor]:
    """Drop a head of another size, resample the patch embedding to `target`'s patch size
    (FlexiViT's PI-resize) and the position grid to its resolution (native-layout keys).

    Args:
        state_dict: the source weights in vitkit's layout.
        source, target: the configs of the weights and of the model they go into.
        pos_resample: whose position-grid resampling to follow: 'timm', 'hf' or
            'torchvision' (`POS_RESAMPLE_MODES`).
    """
    if pos_resample not in POS_RESAMPLE_MODES:
        raise ValueError(
            f"unknown pos_resample {pos_resample!r}; expected one of "
            f"{', '.join(POS_RESAMPLE_MODES)}"
        )
    state_dict = dict(state_dict)
    if target.num_classes != source.num_classes:
        for key in _HEAD_KEYS:
            state_dict.pop(key, None)
    old_patch = to_2tuple(source.patch_size, "patch_size")
    new_patch = to_2tuple(target.patch_size, "patch_size")
    if old_patch != new_patch:
        weight = state_dict["patch_embed.proj.weight"]
        if weight.ndim != 4:
            raise CheckpointError(
                f"the checkpoint has patch size {source.patch_size}, the model "
                f"{target.patch_size}; only a convolutional patch embedding can be resampled"
            )
        log.info("resampling the patch embedding from %s to %s (PI-resize)", old_patch, new_patch)
        state_dict["patch_embed.proj.weight"] = resample_patch_embed(weight, new_patch)
    old_grid, new_grid = source.grid_size, target.grid_size
    if "pos_embed" in state_dict and old_grid != new_grid:
        log.info("resampling the position embedding from grid %s to %s", old_grid, new_grid)
        state_dict["pos_embed"] = resample_pos_embed(
            state_dict["pos_embed"],
            new_size=new_grid,
            old_size=old_grid,
            num_prefix_tokens=source.pos_prefix_tokens,  # no_embed_class: none on the grid
            **POS_RESAMPLE_MODES[pos_resample],
        )
    if target.distilled and not source.distilled:
        _add_distillation_token(state_dict, source)
    elif source.distilled and not target.distilled:
        raise CheckpointError(
            "the checkpoint has a distillation token and the model none; load it with "
            "distilled=True (or keep the checkpoint's config)"
        )
    return state_dict


def _add_distillation_token(state_dict: dict[str, Tensor], source: ViTConfig) -> None:
    """DeiT's distillation token for weights trained without one (fine-tuning with a
    teacher): it starts as a copy of the class token, with the class token's position (a
    trained starting point rather than DeiT's random one; the attention now also sees it, so
    the features move a little); its head is new."""
    if "cls_token" not in state_dict:
        raise CheckpointError(
            "a distillation token needs a class token to start from, and these weights have "
            "none (global_pool='token' models only); load them with distilled=False"
        )
    log.info("adding a distillation token (a copy of the class token and its position)")
    state_dict["dist_token"] = state_dict["cls_token"].clone()
    pos = state_dict.get("pos_embed")
    if pos is not None and not source.no_embed_class and source.pos_prefix_tokens:
        # (1, P + N, D) -> (1, P + 1 + N, D): the token after the class token's position
        state_dict["pos_embed"] = torch.cat([pos[:, :1], pos[:, :1], pos[:, 1:]], dim=1)


def _torch_layout(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Native block keys renamed for an `encoder='torch'` model."""
    try:
        return native_to_torch_state_dict(state_dict)
    except KeyError as err:
        raise CheckpointError(
            f"the checkpoint has {err.args[0].split()[-1]}, which the model's encoder='torch' "
            "(nn.TransformerEncoderLayer) cannot hold; load it into an encoder='native' model"
        ) from None
