"""How images are prepared for a model's weights: the data config that travels with them.

Weights are only right on the input distribution they were trained on, so the preparation is
part of the weights: input size, interpolation, the resize-then-centre-crop ratio `crop_pct`,
and the per-channel mean and std. The fields and their meaning are timm's
(`timm.data.resolve_data_config`): evaluation resizes to `img_size / crop_pct` and crops the
centre `img_size` (`crop_mode='center'`), or resizes straight to `img_size` (`'squash'`).

vitkit stores it in every checkpoint's metadata (`meta['data_config']`), reads it from the
source of converted weights (`weights/preprocessing.py`), and `predict`, `eval`, `explain`,
`export` and fine-tuning use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..options import POSITIVE, REQUIRED, Options, Range, option
from ..options.flags import add_flags

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
CROP_MODES = ("center", "squash")

# The normalisations of the published ViT weights (timm.data.constants).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, kw_only=True)
class DataConfig(Options):
    """The preparation of an image for one model's weights (timm's data-config fields, each
    declared with `option()`: the help says what it does). `mean` and `std` given as one
    number hold for every channel; they are stored as one float per channel."""

    NOUN = "data-config key"
    GROUPS = {"prep": "image preparation (default: the weights')"}

    input_size: tuple[int, int, int] = option(
        REQUIRED, "(channels, height, width) the model takes", range=Range(1, 65536),
        metavar=("C", "H", "W"), group="prep",
    )  # fmt: skip
    mean: float | tuple[float, ...] = option(
        REQUIRED, "per-channel mean of pixels in [0, 1]: one value, or one per channel",
        metavar="MEAN", group="prep",
    )  # fmt: skip
    std: float | tuple[float, ...] = option(
        REQUIRED, "per-channel std of pixels in [0, 1]: one value, or one per channel",
        range=POSITIVE, metavar="STD", group="prep",
    )  # fmt: skip
    interpolation: str = option("bicubic", "the resize filter", choices=INTERPOLATIONS,
                                group="prep")  # fmt: skip
    crop_pct: float = option(
        1.0,
        "evaluation resizes to size / crop_pct, then crops the centre size (1: no margin)",
        range=Range(0, 1, low_open=True),
        group="prep",
    )
    crop_mode: str = option(
        "center",
        "'center' (resize the shorter side, centre crop) or 'squash' (resize both sides to "
        "the input size, no crop)",
        choices=CROP_MODES,
        group="prep",
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # each field's type, range and choices
        channels = self.input_size[0]
        for name in ("mean", "std"):
            values = getattr(self, name)
            values = values if isinstance(values, tuple) else (values,) * channels
            if len(values) != channels:
                raise ValueError(
                    f"{name} must be {channels} finite numbers (one per channel), got "
                    f"{getattr(self, name)!r}"
                )
            object.__setattr__(self, name, tuple(float(v) for v in values))

    @property
    def img_size(self) -> tuple[int, int]:
        """(height, width) of the model's input."""
        return self.input_size[1], self.input_size[2]

    def replace(self, **changes: Any) -> DataConfig:
        """A copy with `changes` (validated); None values are ignored, so flags that were not
        given leave the config as it is."""
        return super().replace(**{k: v for k, v in changes.items() if v is not None})

    def for_channels(self, in_chans: int) -> DataConfig:
        """This preparation for a model of `in_chans` input channels whose first convolution
        was adapted from these weights' (`adapt_input_conv`): `channel_stats` of the mean and
        std."""
        if in_chans == self.input_size[0]:
            return self
        return self.replace(
            input_size=(in_chans, *self.img_size),
            mean=channel_stats(self.mean, in_chans),
            std=channel_stats(self.std, in_chans),
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "data config") -> DataConfig:
        """From `to_dict` output or timm's `pretrained_cfg` (other keys of which are ignored);
        one ValueError naming `source` when it is unusable."""
        if not isinstance(values, Mapping):
            raise ValueError(f"{source} must be a JSON object, got {type(values).__name__}")
        missing = {"input_size", "mean", "std"} - set(values)
        if missing:
            raise ValueError(f"{source} lacks {', '.join(sorted(missing))}")
        try:
            return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None


def channel_stats(values: float | tuple[float, ...], in_chans: int) -> tuple[float, ...]:
    """Per-channel statistics of weights trained on `len(values)` channels for `in_chans`
    channels, as `adapt_input_conv` maps the channels: one channel takes their mean (a grey
    value stands for the same value in R, G and B, whose kernels were summed; ImageNet's
    0.485 / 0.456 / 0.406 become 0.449), channel i takes channel i modulo their count."""
    values = values if isinstance(values, tuple) else (values,)
    if in_chans == 1:
        return (sum(values) / len(values),)
    return tuple(values[i % len(values)] for i in range(in_chans))


def data_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that override a weights' data config (--mean, --std, --interpolation,
    --crop-pct, --crop-mode), made from its fields; `options.flags.given_options(args,
    DataConfig)` reads back those given, for `DataConfig.replace`."""
    add_flags(parser, DataConfig, exclude=("input_size",), show_defaults=False)
