"""`load_pretrained`: a ready model from timm, Hugging Face, torchvision, JAX or vitkit weights.

Fine-tuning at another resolution resamples the learned position grid (Dosovitskiy et al.
2021, Section 3.2; bicubic, class token kept apart, as timm's `resample_abs_pos_embed`), and a
new number of classes gets a freshly initialised head.

Its arguments are of three kinds: how to read the source (`format`, `num_heads`, `arch`,
`hf_config`: what the weights do not record), how to fit the weights to the model they go into
(`num_classes`, `img_size`, `patch_size`, `distilled`, `pos_resample`: `Fitting`), and
`ViTConfig` fields of that model (`**overrides`, e.g. `drop_path_rate=0.1`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.data_config import DataConfig
from ..model import SwinConfig, SwinCrConfig, SwinTransformer, VisionTransformer, ViTConfig
from ..model.layers.patch_embed import to_2tuple
from ..model.layers.pos_embed import resample_patch_embed, resample_pos_embed
from ..model.vit.torch_encoder import native_to_torch_state_dict, torch_to_native_state_dict
from .checkpoint import CheckpointError, load_into, load_npz, load_state_dict
from .detect import CONVERTERS, FORMATS, detect_format
from .info import (
    WeightsInfo,
    assumed_data_config,
    converter_options,
    inspect,
    processor_data_config,
)
from .swin import fill_swin

log = logging.getLogger(__name__)

_HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")
# SwinCrConfig's fields: SwinConfig's and V2-cr's own
_CONFIG_FIELDS = frozenset(
    f.name for cls in (ViTConfig, SwinCrConfig) for f in dataclasses.fields(cls)
)


@dataclass(frozen=True, kw_only=True)
class Fitting:
    """How weights are fitted to the model they go into (None: as the weights are).

    Args:
        num_classes: a new head size; a head of another size is re-initialised.
        img_size: a new input size; the position grid is resampled to it.
        patch_size: a new patch size; the patch embedding is PI-resized (FlexiViT).
        distilled: add (or keep) a distillation token.
        pos_resample: whose grid resampling to follow (`POS_RESAMPLE_MODES`).
    """

    num_classes: int | None = None
    img_size: int | tuple[int, int] | None = None
    patch_size: int | tuple[int, int] | None = None
    distilled: bool | None = None
    pos_resample: str = "timm"


@dataclass(frozen=True)
class SourceWeights:
    """Weights read and converted to vitkit's layout: the state dict, its config, its format,
    the data config and the class names its source states (None: none)."""

    state_dict: dict[str, Tensor]
    config: ViTConfig
    format: str
    data_config: DataConfig | None
    name: str
    class_names: tuple[str, ...] | None = None


def load_pretrained(
    source: str | os.PathLike | Mapping[str, Any] | WeightsInfo,
    model: VisionTransformer | SwinTransformer | None = None,
    format: str = "auto",
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    pos_resample: str = "timm",
    *,
    patch_size: int | tuple[int, int] | None = None,
    distilled: bool | None = None,
    num_heads: int | None = None,
    arch: str | None = None,
    hf_config: Any = None,
    **overrides: Any,
) -> VisionTransformer | SwinTransformer:
    """A `VisionTransformer` (or, for Swin weights, a `SwinTransformer`: `swin.py`) in eval
    mode holding the weights of `source`.

    Args:
        source: a file (`.safetensors`, `.pth`, `.bin`, `.npz`), a Hugging Face or timm
            model folder, what `inspect` said of one, or an in-memory state dict.
        model: load into this model (e.g. one just built for fine-tuning); None builds one
            from the config inferred from the weights. A checkpoint head of another class
            count is dropped and the model keeps its own; `encoder='torch'` keys are matched.
        format: 'auto' (detected from the file and key names) or one of 'vitkit', 'timm',
            'hf', 'torchvision', 'jax'.
        num_classes, img_size, pos_resample, patch_size, distilled: how the weights are
            fitted to the model (`Fitting`). A given `model` is resampled to its own size and
            patch size instead of `img_size` / `patch_size`.
        num_heads: the head count, which most weights do not record.
        arch: a timm model name (`vitkit.list_models()`) whose options the weights do not
            record (activation, norm epsilon, pooling, heads) are theirs; the sizes come from
            the weights (`timm.check_arch` refuses a name of other sizes, as `load_any` does).
        hf_config: a Hugging Face `config.json` (a path, a dict or a transformers config);
            by default the one in the source's folder.
        overrides: `ViTConfig` fields, of the weights and of the model built (e.g.
            `drop_path_rate=0.1`, or `act_layer='gelu_tanh'` for JAX weights).

    Missing, unexpected and mis-shaped weights are reported in one readable CheckpointError.
    """
    _check_call(format, model, img_size, overrides)
    fitting = Fitting(num_classes=num_classes, img_size=img_size, patch_size=patch_size,
                      distilled=distilled, pos_resample=pos_resample)  # fmt: skip
    reading = {"num_heads": num_heads, "arch": arch, "config": hf_config}
    reading = {k: v for k, v in reading.items() if v is not None}
    if img_size is not None:  # what a Swin's weights do not record (swin.py)
        reading["fit_img_size"] = img_size
    if isinstance(model, VisionTransformer) and format != "jax":  # it knows its head count
        reading.setdefault("num_heads", model.config.num_heads)
    new_head = num_classes is not None or model is not None  # DINOv2's classifier gives way
    weights = read_source(source, format, {**reading, **overrides}, new_head=new_head)
    if isinstance(weights.config, SwinConfig):
        return fill_swin(weights, model, num_classes, img_size, overrides)
    target = _target_config(weights.config, model, fitting, overrides)
    state_dict = adapt_state_dict(weights.state_dict, weights.config, target, pos_resample)
    model = _fill(model, target, state_dict, weights)
    data_config = weights.data_config or assumed_data_config(
        weights.format, weights.config, weights.name
    )
    chans, (height, width) = model.config.in_chans, model.patch_embed.img_size
    model.data_config = data_config.replace(input_size=(chans, height, width))
    if weights.class_names and len(weights.class_names) == model.config.num_classes:
        model.meta = {**getattr(model, "meta", {}), "class_names": list(weights.class_names)}
    return model.eval()


def _check_call(
    format: str,
    model: VisionTransformer | None,
    img_size: Any,
    overrides: Mapping[str, Any],
) -> None:
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected 'auto' or one of {FORMATS}")
    if model is not None and img_size is not None:
        raise ValueError(
            "img_size= applies when load_pretrained builds the model (model=None); build the "
            "given model at the size you want and its position grid is resampled to it"
        )
    unknown = sorted(set(overrides) - _CONFIG_FIELDS)
    if unknown:
        raise TypeError(
            f"load_pretrained() got unknown option(s) {', '.join(unknown)}; it takes the "
            "reading options num_heads, arch, hf_config, the fitting options num_classes, "
            "img_size, patch_size, distilled, pos_resample, and ViTConfig fields"
        )


def read_source(
    source: str | os.PathLike | Mapping[str, Any] | WeightsInfo,
    format: str,
    options: Mapping[str, Any],
    *,
    new_head: bool = False,
) -> SourceWeights:
    """The weights of `source` in vitkit's layout and their config: a vitkit checkpoint as
    saved; other weights through their converter, with `options` (reading options and
    `ViTConfig` fields) over what the source's folder states."""
    if isinstance(source, Mapping):
        state_dict = dict(source)
        found = _detect(state_dict) if format == "auto" else format
        name, stated, data_config, names = "the state dict", {}, None, None
    else:
        info = source if isinstance(source, WeightsInfo) else inspect(source, format=format)
        if info.format in ("onnx", "timm-cnn"):
            raise CheckpointError(f"{info.path} is {info.kind}; load_pretrained reads ViT weights")
        state_dict, found, name = _tensors(info), info.format, str(info.path)
        stated, data_config, names = info.source_options, info.data_config, info.class_names
        if found == "vitkit":
            config = info.require_config()
            if getattr(config, "encoder", None) == "torch":  # a ViT saved with encoder="torch"
                state_dict = torch_to_native_state_dict(state_dict)
            return SourceWeights(state_dict, config, "vitkit", data_config, name, names)
        log.info("reading %s as %s", info.path, info.kind)
    options = {**stated, **options}
    if found == "hf" and new_head:
        options["new_head"] = True
    state_dict, config = CONVERTERS[found](state_dict, **converter_options(found, options))
    if data_config is None and isinstance(source, WeightsInfo | str | os.PathLike):
        # what `inspect` could not infer (e.g. under a classifier a new head replaces) is
        # known now: a Hugging Face processor's sizes are the model's
        data_config = processor_data_config(Path(name), config)
    return SourceWeights(state_dict, config, found, data_config, name, names)


def _tensors(info: WeightsInfo) -> dict[str, Any]:
    """The weights `inspect` found, read (the ones it mapped already, as they are)."""
    if info.tensors is not None:
        return dict(info.tensors)
    if info.format == "jax":
        return load_npz(info.weights_file)
    return load_state_dict(info.weights_file)


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


def _detect(weights: Mapping[str, Any]) -> str:
    found = detect_format(weights)
    log.info("detected %s weights", found)
    return found
