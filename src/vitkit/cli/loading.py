"""The model and the inputs of `eval`, `predict` and `explain`: a checkpoint at a precision,
and images prepared as its data config says."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from .. import data as data_lib
from ..data.data_config import DataConfig
from ..model import VisionTransformer
from ..model.precision import set_precision
from ..weights import load

log = logging.getLogger("vitkit")


def checkpoint_model(path: str, device: str, precision: str = "fp32") -> VisionTransformer:
    model = load(path, map_location=device)
    if not model.meta.get("class_names"):
        log.warning("%s has no class names in its metadata; printing class indices", path)
    set_precision(model, precision)
    return model


def class_names(model: torch.nn.Module) -> list[str]:
    """The checkpoint's class names, else the class indices."""
    return model.meta.get("class_names") or [str(i) for i in range(model.num_classes)]


def data_config(model: torch.nn.Module) -> DataConfig:
    """How a checkpoint's inputs are prepared: its data config, or for files written before
    data configs a squash to the model's size with 0.5 / 0.5 normalisation."""
    found = getattr(model, "data_config", None)
    if found is not None:
        return found
    height, width = model.patch_embed.img_size
    return DataConfig(input_size=(model.config.in_chans, height, width), mean=0.5, std=0.5,
                      interpolation="bilinear", crop_mode="squash")  # fmt: skip


def model_inputs(model: torch.nn.Module, paths: Sequence[str]) -> torch.Tensor:
    """Image files decoded at full resolution (EXIF orientation applied) and prepared as the
    model's data config says: (B, C, H, W), normalised."""
    config = data_config(model)
    prepare = data_lib.eval_transform(config)
    chans = config.input_size[0]
    return torch.stack([prepare(data_lib.open_image(p, in_chans=chans)) for p in paths])
