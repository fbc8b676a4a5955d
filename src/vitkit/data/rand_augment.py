"""RandAugment as timm's `rand_augment_transform`, on PIL images.

Cubuk et al., "RandAugment: Practical automated data augmentation with a reduced search space"
(2020). DeiT (Touvron et al. 2021) trains with timm's variant, `rand-m9-mstd0.5-inc1`, so the op
list, the magnitude -> argument mapping, the per-op probability 0.5, the fill colour and the
config-string grammar here are timm's: the same string means the same augmentation (checked op
by op against timm in tests/data/test_timm_transforms.py).

Randomness: every draw comes from a `random.Random` handed in, by default one seeded from
torch's global generator (`seeded_random`), so a run seeded with `torch.manual_seed` (and a
resumed one, which restores torch's generator) draws the same augmentations.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, ImageEnhance, ImageFilter, ImageOps
from torch import Tensor

from .images import image_to_tensor, tensor_to_image

# PIL filters by the names timm and the data config use.
PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
# 'random' interpolation picks one of these per image (timm's _RANDOM_INTERPOLATION).
RANDOM_FILTERS = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
FILL = (128, 128, 128)
LEVEL_DENOM = 10.0  # magnitudes run 0..10
TRANSLATE_PCT = 0.45  # TranslateXRel / YRel move up to 45% of the side at magnitude 10


def seeded_random() -> random.Random:
    """A `random.Random` seeded from torch's global generator: one per image."""
    return random.Random(int(torch.randint(0, 2**62, ())))


# -- the ops: (image, *args, fill, resample) -> image ---------------------------------------


def _affine(img: Image.Image, matrix: tuple[float, ...], fill: Any, resample: int) -> Image.Image:
    affine = Image.Transform.AFFINE
    return img.transform(img.size, affine, matrix, resample=resample, fillcolor=fill)


def rotate(img: Image.Image, degrees: float, *, fill: Any, resample: int) -> Image.Image:
    return img.rotate(degrees, resample=resample, fillcolor=fill)


def shear_x(img: Image.Image, factor: float, *, fill: Any, resample: int) -> Image.Image:
    return _affine(img, (1, factor, 0, 0, 1, 0), fill, resample)


def shear_y(img: Image.Image, factor: float, *, fill: Any, resample: int) -> Image.Image:
    return _affine(img, (1, 0, 0, factor, 1, 0), fill, resample)


def translate_x_rel(img: Image.Image, pct: float, *, fill: Any, resample: int) -> Image.Image:
    return _affine(img, (1, 0, pct * img.size[0], 0, 1, 0), fill, resample)


def translate_y_rel(img: Image.Image, pct: float, *, fill: Any, resample: int) -> Image.Image:
    return _affine(img, (1, 0, 0, 0, 1, pct * img.size[1]), fill, resample)


def auto_contrast(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.autocontrast(img)


def equalize(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.equalize(img)


def invert(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.invert(img)


def solarize(img: Image.Image, threshold: int, **_: Any) -> Image.Image:
    return ImageOps.solarize(img, threshold)


def solarize_add(img: Image.Image, add: int, threshold: int = 128, **_: Any) -> Image.Image:
    """Add `add` to the pixels below `threshold` (clipped at 255)."""
    lut = [min(255, i + add) if i < threshold else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def posterize(img: Image.Image, bits: int, **_: Any) -> Image.Image:
    """Keep the top `bits` bits of each channel; 0 (or fewer) keeps none: a black image, as
    Pillow gave before it refused bits < 1 (timm's Posterize at m < 2.5 asks for 0)."""
    if bits >= 8:
        return img
    mask = ~(2 ** (8 - max(bits, 0)) - 1)
    return img.point([i & mask for i in range(256)] * len(img.getbands()))


def _enhancer(kind: type) -> Callable[..., Image.Image]:
    def enhance(img: Image.Image, factor: float, **_: Any) -> Image.Image:
        return kind(img).enhance(factor)

    enhance.__name__ = kind.__name__.lower()
    return enhance


def desaturate(img: Image.Image, amount: float, **_: Any) -> Image.Image:
    """Blend towards grey by `amount` (1: fully grey)."""
    return ImageEnhance.Color(img).enhance(min(1.0, max(0.0, 1.0 - amount)))


def gaussian_blur(img: Image.Image, radius: float, **_: Any) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=radius))


color = _enhancer(ImageEnhance.Color)
contrast = _enhancer(ImageEnhance.Contrast)
brightness = _enhancer(ImageEnhance.Brightness)
sharpness = _enhancer(ImageEnhance.Sharpness)


# -- magnitude (0..10) -> the op's arguments -------------------------------------------------

Level = Callable[[float, random.Random], tuple]


def _signed(value: float, rng: random.Random) -> float:
    """-value with probability 1/2 (timm's _randomly_negate)."""
    return -value if rng.random() > 0.5 else value


def _rotate_level(m: float, rng: random.Random) -> tuple:
    return (_signed(m / LEVEL_DENOM * 30.0, rng),)


def _shear_level(m: float, rng: random.Random) -> tuple:
    return (_signed(m / LEVEL_DENOM * 0.3, rng),)


def _translate_level(m: float, rng: random.Random) -> tuple:
    return (_signed(m / LEVEL_DENOM * TRANSLATE_PCT, rng),)


def _enhance_level(m: float, rng: random.Random) -> tuple:
    return (m / LEVEL_DENOM * 1.8 + 0.1,)  # 0.1..1.9: 1.0 (no change) at magnitude 5


def _enhance_increasing_level(m: float, rng: random.Random) -> tuple:
    return (max(0.1, 1.0 + _signed(m / LEVEL_DENOM * 0.9, rng)),)  # away from 1.0 as m grows


def _posterize_level(m: float, rng: random.Random) -> tuple:
    return (int(m / LEVEL_DENOM * 4),)  # bits kept: 0..4


def _posterize_increasing_level(m: float, rng: random.Random) -> tuple:
    return (4 - _posterize_level(m, rng)[0],)  # bits kept: 4..0


def _solarize_level(m: float, rng: random.Random) -> tuple:
    return (min(256, int(m / LEVEL_DENOM * 256)),)  # threshold 0..256


def _solarize_increasing_level(m: float, rng: random.Random) -> tuple:
    return (256 - _solarize_level(m, rng)[0],)  # threshold 256..0


def _solarize_add_level(m: float, rng: random.Random) -> tuple:
    return (min(128, int(m / LEVEL_DENOM * 110)),)


def _between(low: float, high: float) -> Level:
    """low..high linearly over magnitudes 0..10, clipped."""

    def level(m: float, rng: random.Random) -> tuple:
        return (max(low, min(high, low + (high - low) * m / LEVEL_DENOM)),)

    return level


def _random_blur_level(m: float, rng: random.Random) -> tuple:
    return (rng.uniform(0.1, 2.0 * _between(0.0, 1.0)(m, rng)[0]),)  # radius 0.1..2m/10


@dataclass(frozen=True)
class Op:
    """An op, how its magnitude becomes arguments, and whether it resamples (draws a filter)."""

    fn: Callable[..., Image.Image]
    level: Level | None = None
    geometric: bool = False


OPS: dict[str, Op] = {
    "AutoContrast": Op(auto_contrast),
    "Equalize": Op(equalize),
    "Invert": Op(invert),
    "Rotate": Op(rotate, _rotate_level, geometric=True),
    "Posterize": Op(posterize, _posterize_level),
    "PosterizeIncreasing": Op(posterize, _posterize_increasing_level),
    "Solarize": Op(solarize, _solarize_level),
    "SolarizeIncreasing": Op(solarize, _solarize_increasing_level),
    "SolarizeAdd": Op(solarize_add, _solarize_add_level),
    "Color": Op(color, _enhance_level),
    "ColorIncreasing": Op(color, _enhance_increasing_level),
    "Contrast": Op(contrast, _enhance_level),
    "ContrastIncreasing": Op(contrast, _enhance_increasing_level),
    "Brightness": Op(brightness, _enhance_level),
    "BrightnessIncreasing": Op(brightness, _enhance_increasing_level),
    "Sharpness": Op(sharpness, _enhance_level),
    "SharpnessIncreasing": Op(sharpness, _enhance_increasing_level),
    "ShearX": Op(shear_x, _shear_level, geometric=True),
    "ShearY": Op(shear_y, _shear_level, geometric=True),
    "TranslateXRel": Op(translate_x_rel, _translate_level, geometric=True),
    "TranslateYRel": Op(translate_y_rel, _translate_level, geometric=True),
    "Desaturate": Op(desaturate, _between(0.5, 1.0)),
    "GaussianBlur": Op(gaussian_blur, _between(0.1, 2.0)),
    "GaussianBlurRand": Op(gaussian_blur, _random_blur_level),
}
# timm's _RAND_TRANSFORMS, and _RAND_INCREASING_TRANSFORMS (`inc1`): the colour and
# posterize / solarize ops whose severity grows with the magnitude.
RAND_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel",
    "TranslateYRel",
)  # fmt: skip
RAND_INCREASING_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
    "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
    "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)  # fmt: skip
# timm's op sets picked with `t<name>`: weighted ones draw `n` distinct ops by weight.
OP_SETS: dict[str, tuple[str, ...] | dict[str, float]] = {
    "3a": ("SolarizeIncreasing", "Desaturate", "GaussianBlur"),  # DeiT III's 3-Augment
    "3aw": {
        "SolarizeIncreasing": 6, "Desaturate": 6, "GaussianBlur": 6, "Rotate": 3, "ShearX": 2,
        "ShearY": 2, "PosterizeIncreasing": 1, "AutoContrast": 1, "ColorIncreasing": 1,
        "SharpnessIncreasing": 1, "ContrastIncreasing": 1, "BrightnessIncreasing": 1,
        "Equalize": 1, "Invert": 1,
    },
    "weights": {
        "Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
        "ColorIncreasing": 0.25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
        "SolarizeIncreasing": 0.05, "SolarizeAdd": 0.05, "ContrastIncreasing": 0.05,
        "BrightnessIncreasing": 0.05, "Equalize": 0.05, "PosterizeIncreasing": 0.05,
        "Invert": 0.05,
    },
}  # fmt: skip


class RandAugment:
    """`num_ops` ops drawn uniformly with replacement (or, for weighted `ops`, distinct ops by
    weight), each applied with probability `prob`.

    Works on PIL images ('RGB' or 'L'); a float tensor (C, H, W) in [0, 1] goes through 8 bits
    and comes back a tensor.

    Args:
        num_ops: ops per image (timm's `n`).
        magnitude: 0..10 (timm's `m`).
        mstd: the magnitude is drawn from N(magnitude, mstd) per op; inf draws it uniformly
            from [0, magnitude]; 0 keeps it fixed.
        prob: probability of applying each drawn op (timm's `p`).
        magnitude_max: upper clip of the drawn magnitude (timm's `mmax`; default 10).
        increasing: use the ops whose severity increases with magnitude (timm's `inc1`).
        ops: op names (keys of `OPS`) replacing the default list, or {name: weight}.
        fill: the colour uncovered by rotations, shears and translations (0..255 per channel).
        interpolation: the filter of those ops ('bilinear', 'bicubic', ...); None picks
            bilinear or bicubic at random each time, as timm does.
    """

    random = True  # `Compose` hands it the image's random.Random

    def __init__(
        self,
        *,
        num_ops: int = 2,
        magnitude: float = 10.0,
        mstd: float = 0.0,
        prob: float = 0.5,
        magnitude_max: float | None = None,
        increasing: bool = False,
        ops: Sequence[str] | Mapping[str, float] | None = None,
        fill: Sequence[int] = FILL,
        interpolation: str | None = None,
    ) -> None:
        ops = ops or (RAND_INCREASING_OPS if increasing else RAND_OPS)
        self.weights = list(ops.values()) if isinstance(ops, Mapping) else None
        self.ops = list(ops)
        if self.weights is not None and num_ops > len(self.ops):
            raise ValueError(
                f"a weighted op set draws distinct ops: n={num_ops} is more than its "
                f"{len(self.ops)} ops"
            )
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise ValueError(f"unknown RandAugment ops {unknown}; known: {', '.join(OPS)}")
        if interpolation is not None and interpolation not in PIL_FILTERS:
            raise ValueError(
                f"unknown interpolation {interpolation!r}; use one of {', '.join(PIL_FILTERS)}"
            )
        if num_ops < 0 or not 0 <= prob <= 1 or mstd < 0 or not 0 <= magnitude:
            raise ValueError(
                f"RandAugment needs n >= 0, 0 <= p <= 1, mstd >= 0 and m >= 0; got n={num_ops}, "
                f"p={prob}, mstd={mstd}, m={magnitude}"
            )
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.mstd = mstd
        self.prob = prob
        self.magnitude_max = magnitude_max
        self.increasing = increasing
        self.fill = tuple(int(v) for v in fill)
        self.interpolation = interpolation

    def draw_magnitude(self, rng: random.Random) -> float:
        m = self.magnitude
        if self.mstd == math.inf:
            m = rng.uniform(0, m)
        elif self.mstd > 0:
            m = rng.gauss(m, self.mstd)
        return max(0.0, min(m, self.magnitude_max or LEVEL_DENOM))

    def draw_ops(self, rng: random.Random) -> list[str]:
        if self.weights is None:
            return rng.choices(self.ops, k=self.num_ops)
        ops, weights, drawn = list(self.ops), list(self.weights), []
        for _ in range(self.num_ops):  # without replacement, as numpy's choice(p=...)
            k = rng.choices(range(len(ops)), weights=weights)[0]
            drawn.append(ops.pop(k))
            weights.pop(k)
        return drawn

    def apply_op(self, img: Image.Image, name: str, rng: random.Random) -> Image.Image:
        """One drawn op: skipped with probability 1 - prob, else at a drawn magnitude."""
        if self.prob < 1.0 and rng.random() > self.prob:
            return img
        op = OPS[name]
        m = self.draw_magnitude(rng)
        args = op.level(m, rng) if op.level is not None else ()
        fill = self.fill if img.mode == "RGB" else self.fill[0]
        if not op.geometric:
            resample = Image.Resampling.NEAREST  # unused
        elif self.interpolation is None:
            resample = rng.choice(RANDOM_FILTERS)
        else:
            resample = PIL_FILTERS[self.interpolation]
        return op.fn(img, *args, fill=fill, resample=resample)

    def __call__(
        self, img: Image.Image | Tensor, rng: random.Random | None = None
    ) -> Image.Image | Tensor:
        rng = rng or seeded_random()
        pil = tensor_to_image(img) if isinstance(img, Tensor) else img
        for name in self.draw_ops(rng):
            pil = self.apply_op(pil, name, rng)
        return image_to_tensor(pil) if isinstance(img, Tensor) else pil

    def __repr__(self) -> str:
        return (
            f"RandAugment(n={self.num_ops}, m={self.magnitude}, mstd={self.mstd}, p={self.prob}, "
            f"inc={int(self.increasing)})"
        )


# -- timm's config strings ------------------------------------------------------------------

_FIELDS = {  # key -> (RandAugment argument, parser)
    "mstd": ("mstd", lambda v: math.inf if float(v) > 100 else float(v)),
    "mmax": ("magnitude_max", float),
    "inc": ("increasing", lambda v: bool(int(v))),
    "m": ("magnitude", float),
    "n": ("num_ops", int),
    "p": ("prob", float),
}


def parse_rand_augment(spec: str | None, **options: Any) -> RandAugment | None:
    """timm's RandAugment string -> RandAugment; None, '' or 'none' -> None.

    'rand' then dash-separated fields in any order: `m9` magnitude (default 10), `n2` ops per
    image, `p0.5` probability per op, `mstd0.5` magnitude noise (over 100: uniform), `mmax10`
    magnitude clip, `inc1` increasing-severity ops, `t3a` / `t3aw` / `tweights` one of timm's
    op sets (`OP_SETS`). E.g. DeiT's 'rand-m9-mstd0.5-inc1'.
    `options` (fill, interpolation) go to `RandAugment`.
    """
    if not spec or spec == "none":
        return None
    parts = spec.split("-")
    if parts[0] != "rand":
        raise ValueError(
            f"RandAugment spec {spec!r} must start with 'rand', e.g. 'rand-m9-mstd0.5-inc1'"
        )
    args: dict[str, Any] = {}
    for part in parts[1:]:
        if part.startswith("t"):
            if part[1:] not in OP_SETS:
                raise ValueError(
                    f"unknown RandAugment op set {part!r} in {spec!r}; use one of "
                    f"{', '.join('t' + name for name in OP_SETS)}, or none for the standard ops"
                )
            args["ops"] = OP_SETS[part[1:]]
            continue
        pieces = re.split(r"(\d.*)", part, maxsplit=1)  # 'mstd0.5' -> ['mstd', '0.5', '']
        key, value = pieces[0], pieces[1] if len(pieces) > 1 else ""
        if key not in _FIELDS or not value:
            raise ValueError(
                f"unknown RandAugment field {part!r} in {spec!r}; use m, n, p, mstd, mmax, inc "
                "followed by a number, e.g. rand-m9-mstd0.5-inc1"
            )
        name, cast = _FIELDS[key]
        try:
            args[name] = cast(value)
        except ValueError:
            raise ValueError(f"bad RandAugment field {part!r} in {spec!r}") from None
    return RandAugment(**args, **options)
