"""Per-image transforms as timm's `create_transform` builds them (no torchvision needed).

Train (DeiT, Touvron et al. 2021, Table 9): RandomResizedCrop of the full-resolution image
(Szegedy et al. 2015), horizontal flip, RandAugment (`rand_augment.py`), to tensor, normalise,
Random Erasing (Zhong et al. 2020). Eval: resize to `img_size / crop_pct` (the shorter side, or
both sides with crop_mode 'squash'), centre crop `img_size`, to tensor, normalise. The
semantics, random draws included, are timm's; tests/data/test_timm_transforms.py runs timm's
transforms beside these.

Every step takes a PIL image (image files: `ImageFiles` hands them over at full resolution) or
a float tensor (C, H, W) in [0, 1] (in-memory data sets, kept as tensors): resizing goes
through Pillow's 8-bit filters either way, so both give the same pixels. The first, geometric
step (the crop or resize) also takes a `ReducedImage`, a large JPEG decoded at 1/2..1/8 scale:
`decode_size` says how small it may be decoded (`draft=False` turns that off). Random steps draw
from one `random.Random` per image, seeded from torch's global generator (`seeded_random`),
so a run seeded with `torch.manual_seed` repeats its augmentations.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from .data_config import CROP_MODES, DataConfig
from .images import ReducedImage, image_to_tensor
from .rand_augment import PIL_FILTERS, RANDOM_FILTERS, parse_rand_augment, seeded_random

ImageLike = Image.Image | Tensor


def image_size(x: ImageLike | ReducedImage) -> tuple[int, int]:
    """(height, width) of a PIL image, a (C, H, W) tensor or a reduced image's full size."""
    if isinstance(x, Tensor):
        return x.shape[-2], x.shape[-1]
    if isinstance(x, ReducedImage):
        return x.size
    return x.size[1], x.size[0]


def resize_region(
    x: ReducedImage,
    region: tuple[float, float, float, float],
    size: tuple[int, int],
    resample: int,
    *,
    clip: bool,
) -> Image.Image:
    """The full image's `region` (top, left, h, w) of a reduced image resized to `size`
    (h, w): Pillow's resize of the matching box, in fractions of the reduced image's pixels.
    `clip` cuts the covering pixels out first, so the filter sees no pixel outside the region
    (as crop-then-resize); without, it reads the neighbours (as resize-then-crop)."""
    left, top, right, bottom = x.region(*region)
    image = x.image
    if clip:
        x0, y0 = math.floor(left), math.floor(top)
        x1, y1 = min(math.ceil(right), image.width), min(math.ceil(bottom), image.height)
        image = image.crop((x0, y0, x1, y1))
        left, top, right, bottom = left - x0, top - y0, right - x0, bottom - y0
    return image.resize((size[1], size[0]), resample, box=(left, top, right, bottom))


def resize(x: ImageLike, size: tuple[int, int], resample: int) -> ImageLike:
    """Resize to (h, w) with a Pillow filter; a tensor is resized channel by channel through
    8 bits, so that in-memory 8-bit data gives the pixels the same image file would."""
    height, width = size
    if image_size(x) == (height, width):
        return x
    if not isinstance(x, Tensor):
        return x.resize((width, height), resample)
    levels = (x.detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    channels = [np.asarray(Image.fromarray(c).resize((width, height), resample)) for c in levels]
    return torch.from_numpy(np.stack(channels)).float().div(255)  # (C, h, w)


def crop(x: ImageLike, top: int, left: int, height: int, width: int) -> ImageLike:
    if isinstance(x, Tensor):
        return x[..., top : top + height, left : left + width]
    return x.crop((left, top, left + width, top + height))


def _filter(interpolation: str) -> int:
    if interpolation not in PIL_FILTERS:
        raise ValueError(
            f"unknown interpolation {interpolation!r}; use one of {', '.join(PIL_FILTERS)}"
        )
    return PIL_FILTERS[interpolation]


class Compose:
    """Apply steps in order, handing the random ones one `random.Random` per image.

    `full_resolution`: `Transformed` gives image files to it decoded at full size (it sizes
    them itself)."""

    full_resolution = True

    def __init__(self, steps: Sequence[Callable]) -> None:
        self.steps = list(steps)
        self._random = [getattr(step, "random", False) for step in self.steps]
        self.random = any(self._random)

    def decode_size(self, height: int, width: int) -> tuple[int, int] | None:
        """The least (h, w) a `height` x `width` image may be decoded at for these steps (the
        first step's `decode_size`), or None: at full size."""
        first = getattr(self.steps[0], "decode_size", None) if self.steps else None
        return None if first is None else first(height, width)

    def __call__(self, x: ImageLike, rng: random.Random | None = None) -> Any:
        if rng is None and self.random:
            rng = seeded_random()
        for step, takes_rng in zip(self.steps, self._random):
            x = step(x, rng) if takes_rng else step(x)
        return x

    def __repr__(self) -> str:
        return f"Compose({', '.join(type(t).__name__ for t in self.steps)})"


class RandomResizedCrop:
    """A crop of random area (`scale` of the image) and aspect ratio (`ratio`, drawn in log
    space), resized to `size` (h, w); timm's RandomResizedCropAndInterpolation.

    `interpolation` 'random' picks bilinear or bicubic per image. With `draft` a large JPEG
    is decoded reduced as far as the smallest crop it can draw allows (`decode_size`).
    """

    random = True

    def __init__(
        self,
        size: tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: str = "bilinear",
        *,
        draft: bool = False,
    ) -> None:
        self.size = tuple(size)
        self.scale = tuple(scale)
        self.ratio = tuple(ratio)
        self.interpolation = interpolation
        self.resample = None if interpolation == "random" else _filter(interpolation)
        self.draft = draft

    def decode_size(self, height: int, width: int) -> tuple[int, int] | None:
        """The least (h, w) a `height` x `width` image may be decoded at: one at which every
        crop `box` can draw still has at least `size` pixels on each side.

        The crop is random, so the bound is the smallest crop: its height is at least
        sqrt(scale_min * area / ratio_max) and its width sqrt(scale_min * area * ratio_min)
        (the 10 tries), or the fallback's centred crop when that is smaller. A crop of h rows
        decoded at 1/s keeps h / s rows, so s <= min_h / out_h: the whole image needs
        height * out_h / min_h rows (and likewise columns). Resizing the reduced crop is then
        never an upscaling that the full-size crop would not have been. With the default
        scale (0.08, 1) the smallest crop of a 4:3 photo is 0.28 of its sides, so at 224 the
        image needs 792 x 1056 pixels whatever its size: 1/2 from 2112 x 1584 up, 1/4 from
        4224 x 3168; a 2000 x 1500 photo is decoded whole.
        """
        if not self.draft:
            return None
        low = self.scale[0] * height * width
        fallback_h, fallback_w = self._fallback(height, width)
        min_h = min(math.floor(math.sqrt(low / self.ratio[1])) - 1, fallback_h)
        min_w = min(math.floor(math.sqrt(low * self.ratio[0])) - 1, fallback_w)
        if min_h < 1 or min_w < 1:
            return None
        return (
            math.ceil(height * self.size[0] / min_h),
            math.ceil(width * self.size[1] / min_w),
        )

    def _fallback(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) of the largest centred crop of an allowed aspect ratio."""
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            return int(round(width / min(self.ratio))), width
        if in_ratio > max(self.ratio):
            return height, int(round(height * max(self.ratio)))
        return height, width

    def box(self, height: int, width: int, rng: random.Random) -> tuple[int, int, int, int]:
        """(top, left, h, w): 10 tries, then the largest centred crop of an allowed ratio."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = rng.uniform(*self.scale) * area
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if w <= width and h <= height:
                return rng.randint(0, height - h), rng.randint(0, width - w), h, w
        h, w = self._fallback(height, width)
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, x: ImageLike | ReducedImage, rng: random.Random | None = None) -> ImageLike:
        rng = rng or seeded_random()
        top, left, h, w = self.box(*image_size(x), rng)
        resample = rng.choice(RANDOM_FILTERS) if self.resample is None else self.resample
        if isinstance(x, ReducedImage):
            return resize_region(x, (top, left, h, w), self.size, resample, clip=True)
        return resize(crop(x, top, left, h, w), self.size, resample)


class RandomHorizontalFlip:
    random = True

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: ImageLike, rng: random.Random | None = None) -> ImageLike:
        if (rng or seeded_random()).random() >= self.p:
            return x
        return x.flip(-1) if isinstance(x, Tensor) else x.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


class ResizeCenterCrop:
    """Evaluation: resize to floor(`size` / `crop_pct`), then crop the centre `size` (h, w).

    crop_mode 'center' resizes keeping the aspect ratio (the shorter side to the scaled size),
    'squash' resizes both sides (with crop_pct 1, straight to `size`): timm's eval transform.
    With `draft` a large JPEG is decoded reduced down to the resized size (`decode_size`).
    """

    def __init__(
        self,
        size: tuple[int, int],
        *,
        crop_pct: float = 1.0,
        crop_mode: str = "center",
        interpolation: str = "bilinear",
        draft: bool = False,
    ) -> None:
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        if crop_mode not in CROP_MODES:
            raise ValueError(f"unknown crop_mode {crop_mode!r}; use one of {', '.join(CROP_MODES)}")
        self.size = tuple(size)
        self.crop_pct = crop_pct
        self.crop_mode = crop_mode
        self.resample = _filter(interpolation)
        self.scale_size = tuple(math.floor(s / crop_pct) for s in self.size)
        self.draft = draft

    def decode_size(self, height: int, width: int) -> tuple[int, int] | None:
        """The least (h, w) a `height` x `width` image may be decoded at: the size the whole
        image is resized to, so the reduced image is still resized down (or kept)."""
        return self.resized_size(height, width) if self.draft else None

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) the image is resized to before the crop."""
        scale_h, scale_w = self.scale_size
        if self.crop_mode == "squash":
            return scale_h, scale_w
        if scale_h == scale_w:  # the shorter side to the size, the longer in proportion
            short, long = sorted((height, width))
            new_long = int(scale_h * long / short)
            return (new_long, scale_h) if width <= height else (scale_h, new_long)
        ratio = min(height / scale_h, width / scale_w)
        return round(height / ratio), round(width / ratio)

    def crop_box(self, height: int, width: int) -> tuple[tuple[int, int], int, int]:
        """((h, w) an image of `height` x `width` is resized to, then the top and left of the
        centre crop in it): torchvision's CenterCrop rounding, as timm's eval transform."""
        resized = self.resized_size(height, width)
        top = int(round((resized[0] - self.size[0]) / 2.0))
        left = int(round((resized[1] - self.size[1]) / 2.0))
        return resized, top, left

    def region(self, height: int, width: int) -> tuple[float, float, float, float]:
        """(top, left, bottom, right) of the pixels the crop keeps, in the coordinates of the
        `height` x `width` image before resizing."""
        (resized_h, resized_w), top, left = self.crop_box(height, width)
        scale_h, scale_w = height / resized_h, width / resized_w
        bottom, right = top + self.size[0], left + self.size[1]
        return top * scale_h, left * scale_w, bottom * scale_h, right * scale_w

    def describe(self, height: int, width: int) -> str:
        """How the view of a `height` x `width` image is made, e.g. 'the 600x400 image resized
        to 336x224, its centre 224x224' (sizes width x height)."""
        resized = self.resized_size(height, width)
        image, crop = f"the {width}x{height} image", f"{self.size[1]}x{self.size[0]}"
        how = "squashed" if self.crop_mode == "squash" else "resized"
        if resized == (height, width):
            return f"{image} as it is" if resized == self.size else f"the centre {crop} of {image}"
        if resized == self.size:
            return f"{image} {how} to {crop}"
        return f"{image} {how} to {resized[1]}x{resized[0]}, its centre {crop}"

    def __call__(self, x: ImageLike | ReducedImage) -> ImageLike:
        size = image_size(x)
        if isinstance(x, ReducedImage):
            top, left, bottom, right = self.region(*size)
            region = (top, left, bottom - top, right - left)
            return resize_region(x, region, self.size, self.resample, clip=False)
        resized, top, left = self.crop_box(*size)
        if resized == size == self.size:  # already the model's size: nothing to do
            return x
        return crop(resize(x, resized, self.resample), top, left, *self.size)


class ToTensor:
    """PIL image -> float tensor (C, H, W) in [0, 1]; tensors pass through."""

    def __call__(self, x: ImageLike) -> Tensor:
        return x if isinstance(x, Tensor) else image_to_tensor(x)


class Normalize:
    """(x - mean) / std per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


class RandomErasing:
    """With probability `p`, replace a rectangle of 2%..1/3 of the area, aspect ratio in
    [`min_aspect`, 1 / `min_aspect`], by per-pixel normal noise ('pixel', DeiT's), one normal
    colour ('rand') or zeros ('const'); applied to the normalised tensor, as timm's."""

    random = True
    MODES = ("pixel", "rand", "const")

    def __init__(
        self,
        p: float = 0.25,
        *,
        scale: tuple[float, float] = (0.02, 1 / 3),
        min_aspect: float = 0.3,
        mode: str = "pixel",
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown erasing mode {mode!r}; use one of {', '.join(self.MODES)}")
        self.p = p
        self.scale = tuple(scale)
        self.log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
        self.mode = mode

    def __call__(self, x: Tensor, rng: random.Random | None = None) -> Tensor:
        rng = rng or seeded_random()
        if rng.random() > self.p:
            return x
        channels, height, width = x.shape
        for _ in range(10):
            target = rng.uniform(*self.scale) * height * width
            aspect = math.exp(rng.uniform(*self.log_aspect))
            h = int(round(math.sqrt(target * aspect)))
            w = int(round(math.sqrt(target / aspect)))
            if w < width and h < height:
                top, left = rng.randint(0, height - h), rng.randint(0, width - w)
                shape = (channels, h, w) if self.mode == "pixel" else (channels, 1, 1)
                fill = torch.empty(shape, dtype=x.dtype).normal_()
                x = x.clone()
                x[:, top : top + h, left : left + w] = 0.0 if self.mode == "const" else fill
                return x
        return x


# -- pipelines ------------------------------------------------------------------------------


def build_transform(
    train: bool,
    *,
    img_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    crop_scale: tuple[float, float] | None = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    rand_augment: str | None = "rand-m9-mstd0.5-inc1",
    reprob: float = 0.25,
    remode: str = "pixel",
    interpolation: str = "bilinear",
    crop_pct: float = 1.0,
    crop_mode: str = "squash",
    draft: bool = False,
) -> Compose:
    """timm's `create_transform`: train = crop, flip, RandAugment, to tensor, normalise, erase;
    eval = resize, centre crop, to tensor, normalise.

    Args:
        train: build the training pipeline (random) or the evaluation one.
        img_size: output (h, w).
        mean, std: per-channel normalisation (RandAugment fills with the mean colour).
        crop_scale: RandomResizedCrop's area range; None resizes (squashes) instead.
        crop_ratio: RandomResizedCrop's aspect-ratio range.
        hflip: horizontal flip probability.
        rand_augment: timm's RandAugment string ('rand-m9-mstd0.5-inc1') or None.
        reprob: Random Erasing probability; `remode` its fill ('pixel', 'rand', 'const').
        interpolation: the resize filter ('bilinear', 'bicubic', ...; 'random' in training
            picks bilinear or bicubic per image).
        crop_pct, crop_mode: evaluation resizes to img_size / crop_pct ('center': the
            shorter side; 'squash': both sides), then crops the centre img_size.
        draft: let a large JPEG be decoded at 1/2, 1/4 or 1/8 scale where the crop or resize
            still gets at least the pixels it needs (`Compose.decode_size`): 2x faster decoding
            of a 2000x1500 photo for evaluation at 224. Off by default, as the pixels differ
            by more than the resize's own error (mean 0.38, max 12 levels of 255, where
            Pillow and torchvision's resizes differ by 0.002 and 1; docs/guides/images.md).
    """
    img_size = tuple(img_size)
    if crop_scale is not None and not 0 < crop_scale[0] <= crop_scale[1] <= 1:
        raise ValueError(
            f"crop_scale (MIN, MAX) needs 0 < MIN <= MAX <= 1, got {tuple(crop_scale)}"
        )
    if not 0 < crop_ratio[0] <= crop_ratio[1]:
        raise ValueError(f"crop_ratio (MIN, MAX) needs 0 < MIN <= MAX, got {tuple(crop_ratio)}")
    for name, p in (("hflip", hflip), ("reprob", reprob)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} is a probability in [0, 1], got {p}")
    fixed = "bilinear" if interpolation == "random" else interpolation  # where one is needed
    _filter(fixed)
    final = [ToTensor(), Normalize(mean, std)]
    if not train:
        resize_crop = ResizeCenterCrop(
            img_size, crop_pct=crop_pct, crop_mode=crop_mode, interpolation=fixed, draft=draft
        )
        return Compose([resize_crop, *final])
    if crop_scale:
        steps: list[Callable] = [
            RandomResizedCrop(img_size, crop_scale, crop_ratio, interpolation, draft=draft)
        ]
    else:
        steps = [ResizeCenterCrop(img_size, crop_mode="squash", interpolation=fixed, draft=draft)]
    if hflip > 0:
        steps.append(RandomHorizontalFlip(hflip))
    fill = tuple(min(255, round(255 * m)) for m in mean)
    augment = parse_rand_augment(
        rand_augment,
        fill=fill * 3 if len(fill) == 1 else fill,
        interpolation=None if interpolation == "random" else interpolation,
    )
    if augment is not None:
        steps.append(augment)
    steps += final
    if reprob > 0:
        steps.append(RandomErasing(reprob, mode=remode))
    return Compose(steps)


def eval_resize_crop(data_config: DataConfig) -> ResizeCenterCrop:
    """The geometric part of a model's evaluation pipeline: the resize and centre crop that
    make the pixels it sees (`eval_transform` then converts and normalises them)."""
    return ResizeCenterCrop(
        data_config.img_size,
        crop_pct=data_config.crop_pct,
        crop_mode=data_config.crop_mode,
        interpolation=data_config.interpolation,
    )


def eval_transform(data_config: DataConfig, *, draft: bool = False) -> Compose:
    """The evaluation pipeline of a model's data config (size, crop, filter, normalisation);
    `draft` as in `build_transform`."""
    return build_transform(
        False,
        draft=draft,
        img_size=data_config.img_size,
        mean=data_config.mean,
        std=data_config.std,
        interpolation=data_config.interpolation,
        crop_pct=data_config.crop_pct,
        crop_mode=data_config.crop_mode,
    )
