"""`load_pretrained`: a ready model from timm, Hugging Face, torchvision, JAX or vitkit weights.

The weights are read by their format's converter, which their family's keys choose, then
fitted to the model by their family (`WeightsFamily.fill`: for a ViT, `vit/pretrained.py`
resamples the position grid to another resolution; for a Swin, `swin/timm.py` resizes its
bias tables); a new number of classes gets a freshly initialised head.

Its arguments are of three kinds: how to read the source (`format`, `num_heads`, `arch`,
`hf_config`: what the weights do not record), how to fit the weights to the model they go into
(`num_classes`, `img_size`, `patch_size`, `distilled`, `pos_resample`: `Fitting`; `in_chans`
adapts the first convolution to another number of channels as timm's `adapt_input_conv`,
`channels.py`), and
config fields of that model (`**overrides`, e.g. `drop_path_rate=0.1`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..model import architectures, find_architecture
from .channels import adapt_channels
from .checkpoint import CheckpointError, load_npz, load_state_dict
from .detect import CONVERTERS, FORMATS, detect_format
from .families import weights_family
from .info import (
    WeightsInfo,
    converter_options,
    inspect,
    processor_data_config,
)
from .source import Fitting, SourceWeights

log = logging.getLogger(__name__)

# Every family's config fields (a Swin V2-cr's include the Swin's)
_CONFIG_FIELDS = frozenset(
    f.name for arch in architectures() for f in dataclasses.fields(arch.config_class)
)


def load_pretrained(
    source: str | os.PathLike | Mapping[str, Any] | WeightsInfo,
    model: nn.Module | None = None,
    format: str = "auto",
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    pos_resample: str = "timm",
    *,
    patch_size: int | tuple[int, int] | None = None,
    distilled: bool | None = None,
    in_chans: int | None = None,
    num_heads: int | None = None,
    arch: str | None = None,
    hf_config: Any = None,
    **overrides: Any,
) -> nn.Module:
    """A model of the weights' family (a `VisionTransformer`; for Swin weights a
    `SwinTransformer`) in eval mode holding the weights of `source`.

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
        in_chans: the input channels of the model built (a given model's own): weights of
            another count have their first convolution adapted as timm's `adapt_input_conv`
            (summed over RGB for grey images), said in one log line.
        num_heads: the head count, which most weights do not record.
        arch: a timm model name (`vitkit.list_models()`) whose options the weights do not
            record (activation, norm epsilon, pooling, heads) are theirs; the sizes come from
            the weights (`families.check_arch` refuses a name of other sizes, as `load_any` does).
        hf_config: a Hugging Face `config.json` (a path, a dict or a transformers config);
            by default the one in the source's folder.
        overrides: config fields, of the weights and of the model built (e.g.
            `drop_path_rate=0.1`, or `act_layer='gelu_tanh'` for JAX weights).

    Missing, unexpected and mis-shaped weights are reported in one readable CheckpointError.
    """
    _check_call(format, model, img_size, overrides)
    fitting = Fitting(
        num_classes=num_classes,
        img_size=img_size,
        patch_size=patch_size,
        distilled=distilled,
        pos_resample=pos_resample,
    )
    reading = {"num_heads": num_heads, "arch": arch, "config": hf_config}
    reading = {k: v for k, v in reading.items() if v is not None}
    if img_size is not None:  # what a Swin's weights do not record (swin/reading.py)
        reading["fit_img_size"] = img_size
    if find_architecture(getattr(model, "config", None)) is not None:  # what the model states
        reading = {**weights_family(model.config).model_reading(model, format), **reading}
    new_head = num_classes is not None or model is not None  # DINOv2's classifier gives way
    weights = read_source(source, format, {**reading, **overrides}, new_head=new_head)
    family = weights_family(weights.config)
    chans = in_chans if model is None else getattr(getattr(model, "config", None), "in_chans", None)
    if chans is not None:
        weights = adapt_channels(weights, chans, family.input_conv(weights.config))
    return family.fill(weights, model, fitting, overrides)


def _check_call(
    format: str,
    model: nn.Module | None,
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
            "img_size, patch_size, distilled, pos_resample, and config fields"
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
    config fields) over what the source's folder states."""
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
            state_dict = weights_family(config).native_keys(state_dict)  # e.g. encoder='torch'
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


def _detect(weights: Mapping[str, Any]) -> str:
    found = detect_format(weights)
    log.info("detected %s weights", found)
    return found
