"""The data config of converted weights, read from their source: timm's `pretrained_cfg` (a
Hub folder's `config.json`), Hugging Face's `preprocessor_config.json`, a vitkit checkpoint's
metadata, else the documented defaults of the weights' family.

The family defaults are those of the published weights: torchvision's ViTs resize to 256 and
crop 224 with bilinear filtering and ImageNet statistics (`ViT_B_16_Weights.IMAGENET1K_V1`
transforms); the JAX / big_vision ViTs and timm state dicts without a config get timm's ViT
default (`vision_transformer._cfg`: mean = std = 0.5, bicubic, crop_pct 0.9; DeiT and other
ImageNet-statistics weights say so in their `pretrained_cfg`); a Hugging Face state dict
without its processor file gets `ViTImageProcessor`'s defaults (0.5 statistics, bilinear,
resized to the input size without a crop).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.data_config import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    INCEPTION_MEAN,
    INCEPTION_STD,
    DataConfig,
)
from ..model.layers.patch_embed import to_2tuple
from .checkpoint import CheckpointError, saved_data_config

log = logging.getLogger(__name__)

# How messages name each source.
LIBRARIES = {"timm": "timm", "hf": "Hugging Face", "torchvision": "torchvision", "jax": "JAX"}

# PIL's resample codes, as Hugging Face image processors store them.
_PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}

# format -> (mean, std, interpolation, crop_pct) of weights that carry no data config.
FAMILY_DEFAULTS: dict[str, tuple[tuple[float, ...], tuple[float, ...], str, float]] = {
    "torchvision": (IMAGENET_MEAN, IMAGENET_STD, "bilinear", 224 / 256),
    "jax": (INCEPTION_MEAN, INCEPTION_STD, "bicubic", 0.9),
    "timm": (INCEPTION_MEAN, INCEPTION_STD, "bicubic", 0.9),
    "hf": (INCEPTION_MEAN, INCEPTION_STD, "bilinear", 1.0),
}


def default_data_config(format: str, config: Any) -> DataConfig:
    """The documented data config of `format`'s weights at `config`'s input size."""
    mean, std, interpolation, crop_pct = FAMILY_DEFAULTS[format]
    height, width = to_2tuple(config.img_size, "img_size")
    chans = config.in_chans
    return DataConfig(
        input_size=(chans, height, width),
        mean=mean if chans == 3 else (sum(mean) / 3,) * chans,
        std=std if chans == 3 else (sum(std) / 3,) * chans,
        interpolation=interpolation,
        crop_pct=crop_pct,
        crop_mode="squash" if format == "hf" else "center",
    )


def timm_data_config(pretrained_cfg: Mapping[str, Any], source: str) -> DataConfig:
    """timm's `pretrained_cfg` (a Hub folder's `config.json`), its data keys."""
    values = dict(pretrained_cfg)
    values.setdefault("crop_pct", 0.875)  # timm's DEFAULT_CROP_PCT
    values.setdefault("interpolation", "bicubic")
    return DataConfig.from_dict(values, source)


def hf_data_config(processor: Mapping[str, Any], config: Any, source: str) -> DataConfig:
    """A Hugging Face image processor's settings (`preprocessor_config.json`): timm's
    `pretrained_cfg` (`TimmWrapperImageProcessor`, as vitkit writes them), else resize to
    `size` (both sides: 'squash'; the shortest edge: then the centre `crop_size`), rescale to
    [0, 1], normalise with `image_mean` / `image_std`."""
    if not isinstance(processor, Mapping):
        raise CheckpointError(f"{source} must be a JSON object")
    if isinstance(processor.get("pretrained_cfg"), Mapping):  # TimmWrapperImageProcessor
        return timm_data_config(processor["pretrained_cfg"], f"{source}: pretrained_cfg")
    chans = config.in_chans
    try:
        mean = processor.get("image_mean", INCEPTION_MEAN)
        std = processor.get("image_std", INCEPTION_STD)
        if processor.get("do_normalize", True) is False:
            mean, std = (0.0,) * chans, (1.0,) * chans
        resample = processor.get("resample", 2)
        if resample not in _PIL_FILTERS:
            raise ValueError(f"resample {resample!r} is not a filter vitkit has")
        size = processor.get("size") or {}
        crop = processor.get("crop_size") or {}
        if isinstance(size, int):
            size = {"shortest_edge": size}
        if "height" in size and "width" in size:
            height, width, crop_pct, mode = size["height"], size["width"], 1.0, "squash"
            if processor.get("do_center_crop") and crop:
                raise ValueError("a fixed resize followed by a centre crop is not supported")
        elif "shortest_edge" in size:
            edge = size["shortest_edge"]
            if processor.get("do_center_crop", True) and crop:
                height, width = crop["height"], crop["width"]
            else:
                height = width = edge
            crop_pct, mode = min(height, width) / edge, "center"
        else:
            height, width = to_2tuple(config.img_size, "img_size")
            crop_pct, mode = 1.0, "squash"
        return DataConfig(
            input_size=(chans, height, width),
            mean=mean,
            std=std,
            interpolation=_PIL_FILTERS[resample],
            crop_pct=crop_pct,
            crop_mode=mode,
        )
    except (TypeError, ValueError, KeyError) as err:
        raise CheckpointError(f"{source}: unusable image-processor settings ({err})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object, or one CheckpointError naming it."""
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"cannot read {path} ({err})") from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{path} must hold a JSON object, not {type(values).__name__}")
    return values


def source_data_config(
    source: str | os.PathLike | Mapping[str, Any],
    format: str,
    config: Any,
    meta: Mapping[str, Any] | None = None,
) -> DataConfig:
    """The data config of weights read from `source` in `format`, for a model of `config`.

    In order: a vitkit checkpoint's own (`meta['data_config']`, or the mean / std of older
    files, which resized without cropping), timm's `pretrained_cfg` in a folder's
    `config.json`, a folder's `preprocessor_config.json`, else `default_data_config`.
    """
    saved = saved_data_config(meta or {}, config, str(source))
    if saved is not None:
        return saved
    folder = None if isinstance(source, Mapping) else Path(source)
    if folder is not None and folder.is_file():
        folder = folder.parent if (folder.parent / "config.json").is_file() else None
    if folder is not None and folder.is_dir():
        hub = folder / "config.json"
        values = read_json_object(hub) if hub.is_file() else {}
        if isinstance(values.get("pretrained_cfg"), Mapping):
            return timm_data_config(values["pretrained_cfg"], f"{hub}: pretrained_cfg")
        processor = folder / "preprocessor_config.json"
        if processor.is_file():
            return hf_data_config(read_json_object(processor), config, str(processor))
    if format == "vitkit":
        format = "timm"
    log.info("no data config beside the weights; using the %s defaults", format)
    return default_data_config(format, config)


def assumed_data_config(format: str, config: Any, source: str) -> DataConfig:
    """The preparation assumed for weights that state none, said in one log line: a vitkit
    checkpoint's is vitkit's before checkpoints recorded it (resized, 0.5 / 0.5), a timm
    CNN's timm's default for CNNs (ImageNet statistics, bicubic, crop 0.875), other weights
    their family's documented default (`preprocessing.FAMILY_DEFAULTS`)."""
    if format == "vitkit" and config is not None:
        height, width = to_2tuple(config.img_size, "img_size")
        assumed = DataConfig(
            input_size=(config.in_chans, height, width),
            mean=0.5,
            std=0.5,
            interpolation="bilinear",
            crop_mode="squash",
        )
        whose = "vitkit's"
    elif config is None:  # a timm CNN: timm's `_cfg` of its CNNs
        assumed = DataConfig(
            input_size=(3, 224, 224),
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            interpolation="bicubic",
            crop_pct=0.875,
        )
        whose = "timm's CNN"
    else:
        assumed = default_data_config(format, config)
        whose = f"the {LIBRARIES.get(format, format)}"
    log.info(
        "%s states no data config; assuming %s defaults: mean %s, std %s, %s, %s",
        source,
        whose,
        _numbers(assumed.mean),
        _numbers(assumed.std),
        assumed.interpolation,
        "resized to the input size"
        if assumed.crop_mode == "squash"
        else f"centre crop {assumed.crop_pct:g}",
    )
    return assumed


def _numbers(values: tuple[float, ...]) -> str:
    return " ".join(f"{v:.4g}" for v in values)
