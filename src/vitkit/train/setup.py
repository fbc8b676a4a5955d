"""The pieces every task's set-up shares (`Task.setup`): the data splits of a config, seeded
and limited, a fresh ViT sized to them, and the transform pipelines for a model's data
config. A task takes what it needs and adds its own (classification: pretrained weights, a
timm CNN, a teacher; MAE: the autoencoder around its encoder)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..data import DataError, Splits, build_transform, limited, load_data
from ..data.data_config import DataConfig
from ..model import create_model, to_2tuple
from .config import JobConfig


def load_splits(config: JobConfig, *, in_chans: int, img_size: Any) -> Splits:
    """The config's data split with its seed (the global torch generator seeded with it
    first, for what is built next), its training split cut to `train_limit`. `in_chans` and
    `img_size` say how image files are read."""
    torch.manual_seed(config.seed)
    splits = load_data(
        config.data_spec(),
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        seed=config.seed,
        in_chans=in_chans,
        img_size=to_2tuple(img_size, "img_size"),
        skip_corrupt=not config.strict,
        image_column=config.image_column,
        label_column=config.label_column,
    )
    if config.train_limit:
        splits = dataclasses.replace(
            splits, train=limited(splits.train, config.train_limit, config.seed)
        )
    require_parts(splits, config, ("train", "val"))
    return splits


def require_parts(splits: Splits, config: JobConfig, parts: tuple[str, ...]) -> None:
    """A DataError before any training when one of `parts` of the split holds no image (a
    fraction that rounds to none of few images, or 0): the run would fail at its end."""
    for part in parts:
        if len(getattr(splits, part)) == 0:
            field = f"{part}_fraction"
            fix = (
                f"raise --{part}-fraction (now {getattr(config, field):g}) or add images"
                if hasattr(config, field)
                else "add images"
            )
            raise DataError(f"the {part} split of {splits.name} holds no images; {fix}")


def fresh_model(name: str, splits: Splits, options: dict[str, Any]) -> nn.Module:
    """The registered model `name` with the model `options`, sized to the data (its channels,
    classes and native size unless the options say otherwise); `model.data_config` says how
    its inputs are prepared."""
    options = dict(options)
    if options.setdefault("in_chans", splits.in_chans) != splits.in_chans:
        raise ValueError(
            f"{splits.name} holds {splits.in_chans}-channel images; the in_chans option "
            f"({options['in_chans']}) says how image files are read: drop it for this data"
        )
    options.setdefault("num_classes", splits.num_classes)
    if splits.img_size is not None:
        options.setdefault("img_size", tuple(splits.img_size))
    model = create_model(name, **options)
    height, width = model.patch_embed.img_size
    model.data_config = DataConfig(
        input_size=(model.config.in_chans, height, width),
        mean=splits.mean,
        std=splits.std,
        interpolation="bilinear",
        crop_mode="squash",
    )
    return model


def transforms(
    config: JobConfig,
    splits: Splits,
    data_config: DataConfig,
    *,
    rand_augment: str = "none",
    reprob: float = 0.0,
) -> tuple[Any, Any]:
    """The training and evaluation pipelines of the config for the model's data config: its
    input size and filter; evaluation also its crop (`crop_pct`, `crop_mode`), as timm's
    `create_transform` from a model's data config. Normalised with the splits' mean and std.
    Training has the config's crops and flips, and the task's RandAugment and random
    erasing."""
    common = {
        "img_size": data_config.img_size,
        "mean": splits.mean,
        "std": splits.std,
        "interpolation": data_config.interpolation,
    }
    train = build_transform(
        True,
        crop_scale=config.crop_scale,
        hflip=config.hflip,
        rand_augment=rand_augment,
        reprob=reprob,
        **common,
    )
    eval_tf = build_transform(
        False, crop_pct=data_config.crop_pct, crop_mode=data_config.crop_mode, **common
    )
    return train, eval_tf
