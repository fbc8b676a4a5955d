"""`load_pretrained`: a ready model from timm, Hugging Face, torchvision, JAX or vitkit weights.

Fine-tuning at another resolution resamples the learned position grid (Dosovitskiy et al.
2021, Section 3.2; bicubic, class token kept apart, as timm's `resample_abs_pos_embed`), and a
new number of classes gets a freshly initialised head.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..model import VisionTransformer, ViTConfig, list_models
from ..model.config import to_2tuple
from ..model.pos_embed import resample_patch_embed, resample_pos_embed
from ..model.torch_encoder import native_to_torch_state_dict, torch_to_native_state_dict
from .checkpoint import (
    CheckpointError,
    is_npz_file,
    load_into,
    load_npz,
    load_state_dict,
    read_metadata,
    saved_config,
)
from .detect import CONVERTERS, FORMATS, detect_format, weights_file
from .folders import timm_folder_options
from .preprocessing import read_json_object, source_data_config

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")


def load_pretrained(
    source: str | os.PathLike | Mapping[str, Any],
    model: VisionTransformer | None = None,
    format: str = "auto",
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    pos_resample: str = "timm",
    **convert_options: Any,
) -> VisionTransformer:
    """A `VisionTransformer` in eval mode holding the weights of `source`.

    Args:
        source: a file (`.safetensors`, `.pth`, `.bin`, `.npz`), a Hugging Face model folder
            (`config.json` + weights) or an in-memory state dict.
        model: load into this model (e.g. one just built for fine-tuning); None builds one
            from the config inferred from the weights. A checkpoint head of another class
            count is dropped and the model keeps its own; `encoder='torch'` keys are matched.
        format: 'auto' (detected from the file and key names) or one of 'vitkit', 'timm',
            'hf', 'torchvision', 'jax'.
        num_classes: a new head size; a head of another size is re-initialised for fine-tuning.
        img_size: a new input size; the position grid is resampled (bicubic) to fit. A given
            `model` is resampled to its own size instead, and to its patch size (PI-resize).
        pos_resample: whose grid resampling to follow: 'timm' (antialiased), 'hf' or
            'torchvision' (`POS_RESAMPLE_MODES`).
        convert_options: passed to the converter, e.g. `num_heads=` or `config=` (HF);
            `ViTConfig` fields among them (e.g. `drop_path_rate=0.1`) also set the built
            model's config, and `patch_size=` builds it with another patch size (the patch
            embedding PI-resized).

    Missing, unexpected and mis-shaped weights are reported in one readable CheckpointError.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected 'auto' or one of {FORMATS}")
    if model is not None and img_size is not None:
        raise ValueError(
            "img_size= applies when load_pretrained builds the model (model=None); build the "
            "given model at the size you want and its position grid is resampled to it"
        )
    patch_size = convert_options.pop("patch_size", None)  # the new model's, not the weights'
    # A distillation token is the new model's; the weights may hold one or not (added below).
    distilled = convert_options.pop("distilled", None)
    state_dict, format, source_config, meta = _read(source, format)
    _folder_options(source, format, convert_options)
    if format == "hf" and (num_classes is not None or model is not None):
        convert_options.setdefault("new_head", True)  # DINOv2's classifier gives way to it
    if model is not None and format != "jax":  # the given model knows its head count
        convert_options.setdefault("num_heads", model.config.num_heads)
    if source_config is None:
        state_dict, source_config = CONVERTERS[format](state_dict, **convert_options)
    elif source_config.encoder == "torch":  # a vitkit file of an encoder='torch' model
        state_dict = torch_to_native_state_dict(state_dict)
    if model is not None:
        target = model.config
    else:  # the options that are config fields (e.g. drop_path_rate) shape the new model
        fields = {f.name for f in dataclasses.fields(ViTConfig)} - {"num_heads"}
        target = source_config.replace(**{k: v for k, v in convert_options.items() if k in fields})
    if num_classes is not None:
        target = target.replace(num_classes=num_classes)
    if img_size is not None:
        target = target.replace(img_size=img_size)
    if patch_size is not None and model is None:
        target = target.replace(patch_size=patch_size)
    if distilled is not None and model is None:
        target = target.replace(distilled=distilled)
    state_dict = adapt_state_dict(state_dict, source_config, target, pos_resample)
    if model is None:
        model = VisionTransformer(target)
    elif model.config.num_classes != target.num_classes:
        model.reset_classifier(target.num_classes)
    if target.num_classes != source_config.num_classes:
        log.info(
            "new %d-class head (the checkpoint has %d classes): fine-tune it",
            target.num_classes,
            source_config.num_classes,
        )
        own = model.state_dict()  # the model's freshly initialised head
        state_dict.update({k: own[k] for k in _HEAD_KEYS if k in own})
    elif target.distilled and not source_config.distilled:  # the new token's own head
        own = model.state_dict()
        state_dict.update({k: own[k] for k in _HEAD_KEYS if k.startswith("head_dist")})
    if model.config.encoder == "torch":
        state_dict = _torch_layout(state_dict)
    load_into(model, state_dict, source=f"{format} checkpoint")
    data_config = source_data_config(source, format, source_config, meta)
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    model.data_config = data_config.replace(input_size=(chans, height, width))
    return model.eval()


def _folder_options(
    source: str | os.PathLike | Mapping[str, Any], format: str, convert_options: dict[str, Any]
) -> None:
    """What a model folder's config.json tells the converter, unless given: a Hugging Face
    folder's config itself; a timm Hub folder's `model_args` (over its architecture's) and its
    `architecture` (what the weights cannot show)."""
    if isinstance(source, Mapping):
        return
    folder_config = Path(source) / "config.json"
    if not folder_config.is_file():
        return
    if format == "hf":
        convert_options.setdefault("config", folder_config)
    elif format == "timm":
        hub = read_json_object(folder_config)
        model_args = hub.get("model_args")
        if isinstance(model_args, Mapping):  # over the architecture's (a vitkit export's)
            for name, value in timm_folder_options(model_args).items():
                convert_options.setdefault(name, value)
        if hub.get("architecture") in list_models():
            convert_options.setdefault("arch", hub["architecture"])


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
            "none (global_pool='token' models only); train without --distill"
        )
    log.info("adding a distillation token (a copy of the class token and its position)")
    state_dict["dist_token"] = state_dict["cls_token"].clone()
    pos = state_dict.get("pos_embed")
    if pos is not None and not source.no_embed_class and source.pos_prefix_tokens:
        # (1, P + N, D) -> (1, P + 1 + N, D): the token after the class token's position
        state_dict["pos_embed"] = torch.cat([pos[:, :1], pos[:, :1], pos[:, 1:]], dim=1)


def _read(
    source: str | os.PathLike | Mapping[str, Any], format: str
) -> tuple[dict[str, Any], str, ViTConfig | None, dict[str, Any]]:
    """(weights, format, config and metadata when the file carries them) of a source."""
    if isinstance(source, Mapping):
        weights = dict(source)
        return weights, _detect(weights) if format == "auto" else format, None, {}
    path = weights_file(source)
    is_npz = path.suffix == ".npz" or (path.is_file() and is_npz_file(path))
    if format == "jax" or (format == "auto" and is_npz):
        return load_npz(path), "jax", None, {}
    weights = load_state_dict(path)
    config = saved_config(path) if format in ("auto", "vitkit") else None
    if config is not None:
        return weights, "vitkit", config, read_metadata(path)[1]
    return weights, _detect(weights) if format == "auto" else format, None, {}


def _torch_layout(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Native block keys renamed for an `encoder='torch'` model."""
    try:
        return native_to_torch_state_dict(state_dict)
    except KeyError as err:
        raise CheckpointError(
            f"the checkpoint has {err.args[0].split()[-1]}, which the model's encoder='torch' "
            "(nn.TransformerEncoderLayer) cannot hold; load it into an encoder='native' model"
        ) from None


def _detect(weights: Mapping[str, Any]) -> str:
    found = detect_format(weights)
    log.info("detected %s weights", found)
    return found
