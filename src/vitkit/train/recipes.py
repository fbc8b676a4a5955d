"""Recipe presets: named sets of `TrainConfig` overrides, and the one each kind of data gets;
the model a run gets when none is named (`default_choice`: the source's own, else one sized
to a look at its images). What a source was measured with is its own fact (`data.Source`'s
`model` and `recipe`), not a table here.

`deit` is the `TrainConfig` defaults (DeiT, Touvron et al. 2021, Table 9, with a CPU-sized
batch) with DeiT's stochastic depth 0.1, a model option; the others were chosen by measurement
on 2 CPU cores (README, "A real run"). A recipe's `model_opts` are merged key by key under
those of a settings file and the command line; `vitkit pretrain` takes the options of a recipe
that `PretrainConfig` has.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import SOURCES, detect_source, source_named
from ..data.survey import ImageSurvey, survey_images
from ..model import get_config, to_2tuple
from ..model.schema import check_model_options
from ..options import option_names
from ..weights.cnn import is_timm_name
from .config import JobConfig, TrainConfig, data_spec

log = logging.getLogger(__name__)

# DeiT's stochastic depth (Table 9), kept by every recipe but the 28x28 ones.
_DROP_PATH = {"drop_path_rate": 0.1}

# Tiny images (<= 16 px, e.g. the 8x8 digits): crops, flips and RandAugment destroy the few
# pixels there are (measured on digits, 40 epochs: no augmentation 0.967 test top-1,
# rand-m3-n1 0.967, Mixup/CutMix + drop-path 0.1 0.975; 120 epochs 0.98), so Mixup/CutMix,
# label smoothing and stochastic depth regularise; lr 2e-3 at batch 64; one thread, as a model
# this small gains nothing from more and slows down a lot on a busy CPU.
_SMALL: dict[str, Any] = {
    "epochs": 120,
    "blr": 1.6e-2,
    "warmup_epochs": 3.0,
    "aa": "none",
    "crop_scale": None,
    "hflip": 0.0,
    "reprob": 0.0,
    "threads": 1,
    "model_opts": _DROP_PATH,
}
# 28x28 grey images, 60,000 of them (Fashion-MNIST): chosen within a 15-minute budget.
_FASHION: dict[str, Any] = {
    "epochs": 12,
    "batch_size": 128,
    "blr": 1e-3 * 512 / 128,
    "warmup_epochs": 1.0,
    "mixup": 0.0,
    "cutmix": 0.0,
    "aa": "none",
    "crop_scale": None,
    "reprob": 0.0,
}
# Handwritten digits are not mirrored (a flipped 2 is no digit).
_MNIST: dict[str, Any] = {**_FASHION, "hflip": 0.0}
# 3,500 training images overfit without regularising (measured, 100 epochs: 0.891 test top-1
# with the recipe above, 0.971 with mild crops, Mixup / CutMix and stochastic depth).
_MNIST_5K: dict[str, Any] = {
    **_MNIST,
    "epochs": 100,
    "crop_scale": (0.7, 1.0),
    "mixup": 0.8,
    "cutmix": 1.0,
    "model_opts": _DROP_PATH,
}
# Fine-tuning pretrained weights (`--pretrained`) on a small labelled set, after MAE's
# fine-tuning of ViT-B (He et al. 2022, the settings of its code): blr 5e-4 per 256 images
# (1e-3 per the 512 here) with layer decay 0.65, so the head and the top blocks adapt while
# the first of 12 blocks moves at 0.65 ** 12 = 0.6% of that rate and the pretrained features
# stay; the cosine ends at 1e-6. The weights are already trained, so a short warmup (3 epochs, not
# DeiT's 5) only protects them from the fresh head's first large gradients, and 50 epochs
# suffice. Label smoothing 0.1, drop-path 0.1, Mixup / CutMix, RandAugment and random erasing
# stay at the defaults, which are MAE's fine-tuning values too.
_FINETUNE: dict[str, Any] = {
    "epochs": 50,
    "blr": 1e-3,
    "min_lr": 1e-6,
    "warmup_epochs": 3.0,
    "layer_decay": 0.65,
    "model_opts": _DROP_PATH,
}

RECIPES: dict[str, dict[str, Any]] = {
    "deit": {"model_opts": _DROP_PATH},
    "small": _SMALL,
    "fashion-mnist": _FASHION,
    "mnist": _MNIST,
    "mnist-5k": _MNIST_5K,
    "finetune": _FINETUNE,
}

# Every option some recipe sets, model options among them (marked so in `--help`).
RECIPE_OPTIONS = frozenset(
    key
    for recipe in RECIPES.values()
    for key in (*recipe, *recipe.get("model_opts", {}))
    if key != "model_opts"
)


# The default model of data without a preset, by the short side S of its images (the median;
# `data.survey`). Token counts and CPU cost draw the bands (multiply-adds an image as
# `vitkit summary` counts them, half its FLOPs):
# - S <= 16, tiny: vit_digits (4 blocks of width 64, 2x2 patches), the model the small recipe
#   was measured with: 16 tokens at 8 px, 64 at 16 px; 2.4M and 10.7M. ViT-Ti there would be
#   5.4M parameters and 12 blocks for a few hundred pixels.
# - 16 < S < 128, small: ViT-Ti's width and depth on an 8x8 grid of patches, 64 tokens, as
#   DeiT-Ti on CIFAR (patch 4 at 32): the images resized to the nearest multiple of 8 (28 px to
#   32, patch 4; 64 px, patch 8); 0.37G.
# - S >= 128, photos: ViT-Ti/16 at 224, DeiT's input and that of the pretrained ViTs: 196
#   tokens, 1.25G (3.4x the small grid). At 128 px the small grid's patches are already 16 px,
#   the photo model's; above it the 14x14 grid sees detail the images hold, and 224 enlarges
#   them at most 1.75x.
TINY_MAX = 16
PHOTO_MIN = 128
SMALL_GRID = 8


@dataclass(frozen=True)
class ModelChoice:
    """The model a run gets when none is named: a registered name, the model options that
    size it to the data, and what was seen of the data (None for a source's preset, which
    goes without saying)."""

    model: str
    model_opts: dict[str, Any] = field(default_factory=dict)
    seen: str | None = None

    def message(self, data: str, opts: dict[str, Any]) -> str:
        """The log line saying what was chosen for `data`, why, and how to choose otherwise;
        `opts` are the model options the run takes (given ones over the choice's)."""
        shown = ", ".join(f"{key} {opts[key]}" for key in self.model_opts)
        what = f"{self.model} ({shown})" if shown else self.model
        return f"no model given: {what} for {data}: {self.seen}; set model to choose another"


def default_choice(data: str, data_dir: str | None = None) -> ModelChoice:
    """The model `vitkit train --data DATA` trains when no model is given: the source's own
    (`Source.model`); for an image folder or CIFAR, a model sized to its images (the bands
    above, the channels theirs: all greyscale 1, else 3); `vit_digits` when its images cannot
    be looked at (an in-memory source, or not one opens: the loader then names them). The
    same data gives the same choice (the folder's sample is fixed), so a resumed run finds
    its folder."""
    source = SOURCES.get(data.partition(":")[0])
    if source is not None and source.model:
        return ModelChoice(source.model)
    survey = survey_images(*detect_source(data_spec(data, data_dir)))
    if survey is None:
        return ModelChoice("vit_digits", seen="nothing of its images to go by")
    return _sized(survey)


def _sized(survey: ImageSurvey) -> ModelChoice:
    """The model for images as `survey` saw them (the bands above)."""
    side, chans = survey.short_side, survey.in_chans
    if side <= TINY_MAX:  # vit_digits' 2x2 patches: an even size, 4 tokens at least
        opts = {"img_size": max(4, side + side % 2), "in_chans": chans}
        return ModelChoice("vit_digits", opts, survey.describe())
    if side < PHOTO_MIN:
        patch = max(2, int(side / SMALL_GRID + 0.5))
        opts = {"img_size": patch * SMALL_GRID, "patch_size": patch, "in_chans": chans}
        return ModelChoice("vit_tiny_patch16_224", opts, survey.describe())
    opts = {"img_size": 224, "in_chans": chans}
    return ModelChoice("vit_tiny_patch16_224", opts, survey.describe())


def default_model(data: str, data_dir: str | None = None) -> str:
    """The name of the model `vitkit train --data DATA` trains when none is given
    (`default_choice`): what a run folder's default name holds."""
    return default_choice(data, data_dir).model


def recipe_for(
    data: str, model: str, img_size: int | tuple[int, int] | None, pretrained: bool = False
) -> str:
    """The recipe a run gets by default. Pretrained weights are fine-tuned: the fine-tune
    recipe, or the small one for weights the size of the tiny models it was measured with.
    From scratch: the source's own (`Source.recipe`), else by input size (tiny images the
    small one, larger ones DeiT's)."""
    source = source_named(data)
    if source.recipe and not pretrained:
        return source.recipe
    size = to_2tuple(img_size, "img_size") if img_size else None
    size = size or source.native_size or _model_size(model)
    if max(size) <= TINY_MAX:
        return "small"
    return "finetune" if pretrained else "deit"


def _weights_size(pretrained: str) -> tuple[int, int]:
    """The input size of pretrained weights (read from their header; 224 when they do not
    say), which their fine-tuning's recipe follows."""
    from ..weights import inspect

    config = inspect(pretrained).config
    return to_2tuple(config.img_size, "img_size") if config is not None else (224, 224)


def _model_size(model: str) -> tuple[int, int]:
    """A model's input size: a registered ViT's, or 224 for a timm CNN (it takes any)."""
    return (224, 224) if is_timm_name(model) else to_2tuple(get_config(model).img_size, "")


def resolve_config(
    given: dict[str, Any],
    file: dict[str, Any] | None = None,
    job: type[JobConfig] = TrainConfig,
) -> JobConfig:
    """A new run's config: `given` (the command line) over `file` (a --config file) over the
    recipe over the defaults, the model options merged key by key in the same order. The
    model and the recipe are resolved to names.

    Args:
        given: the options the command line set.
        file: the settings of a --config file.
        job: `TrainConfig` or `PretrainConfig` (which takes the recipe's options it has).
    """
    file = file or {}
    values = {**file, **given}
    data = values.get("data", job.data)
    spec = data_spec(data, values.get("data_dir"))
    opts = {**file.get("model_opts", {}), **given.get("model_opts", {})}
    model = values.get("model")
    pretrained = values.get("pretrained")
    if not model and not pretrained:
        choice = default_choice(data, values.get("data_dir"))
        model, opts = choice.model, {**choice.model_opts, **opts}
        if choice.seen:
            log.info(choice.message(str(Path(detect_source(spec)[1] or data)), opts))
    if model and not is_timm_name(model):
        get_config(model)  # an unknown name fails here, with the close ones
    if not (model and is_timm_name(model)):
        opts = check_model_options(model, opts)  # before the size is read
    size = opts.get("img_size") or (_weights_size(pretrained) if pretrained and not model else None)
    recipe = values.get("recipe") or recipe_for(spec, model, size, pretrained=bool(pretrained))
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}")
    preset = {k: v for k, v in RECIPES[recipe].items() if k in option_names(job)}
    opts = {**preset.get("model_opts", {}), **opts}
    config = job(**{**preset, **values, "model": model, "recipe": recipe, "model_opts": opts})
    if pretrained and not values.get("recipe"):
        log.info("recipe %s for fine-tuning %s (--recipe chooses another)", recipe, pretrained)
    return config
