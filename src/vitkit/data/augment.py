"""The DeiT training transforms, written on torch tensors (no torchvision needed).

Touvron et al., "Training data-efficient image transformers & distillation through attention"
(DeiT, 2021), Table 9: random resized crop + flip, RandAugment (Cubuk et al. 2020, rand-m9-mstd0.5),
random erasing (Zhong et al. 2020, p=0.25), Mixup (Zhang et al. 2018, alpha 0.8) and CutMix
(Yun et al. 2019, alpha 1.0) with label smoothing (Szegedy et al. 2016).

Per-image transforms take and return a float tensor (C, H, W); images are in [0, 1] until
`Normalize`. Randomness comes from torch's global generator, so a seeded run (and a resumed
one, which restores the generator) draws the same augmentations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Transform = Callable[[Tensor], Tensor]


def _rand() -> float:
    return float(torch.rand(()))


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * _rand()


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Tensor) -> Tensor:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return f"Compose({', '.join(type(t).__name__ for t in self.transforms)})"


class Resize:
    """Bilinear resize to (h, w); a no-op at that size already."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = tuple(size)

    def __call__(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) == self.size:
            return x
        out = F.interpolate(x[None], size=self.size, mode="bilinear", align_corners=False)
        return out[0].clamp(0, 1)  # (C, h, w)


class RandomResizedCrop:
    """A crop of random area (`scale` of the image) and aspect ratio, resized to `size`."""

    def __init__(
        self,
        size: tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = tuple(size)
        self.scale = scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the crop, as torchvision draws it (10 tries, then center)."""
        area = height * width
        for _ in range(10):
            target = area * _uniform(*self.scale)
            aspect = math.exp(_uniform(*self.log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, ()))
                left = int(torch.randint(0, width - w + 1, ()))
                return top, left, h, w
        side = min(height, width)
        return (height - side) // 2, (width - side) // 2, side, side

    def __call__(self, x: Tensor) -> Tensor:
        top, left, h, w = self.box(*x.shape[-2:])
        crop = x[:, top : top + h, left : left + w]
        return Resize(self.size)(crop)


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.flip(-1) if _rand() < self.p else x


class Normalize:
    """(x - mean) / std per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


class RandomErasing:
    """With probability `p`, replace a random rectangle (2%-1/3 of the area) by normal noise
    (timm's 'pixel' mode); applied after normalisation."""

    def __init__(
        self, p: float = 0.25, scale: tuple[float, float] = (0.02, 1 / 3), ratio: float = 0.3
    ) -> None:
        self.p = p
        self.scale = scale
        self.log_ratio = (math.log(ratio), math.log(1 / ratio))

    def __call__(self, x: Tensor) -> Tensor:
        if _rand() >= self.p:
            return x
        channels, height, width = x.shape
        for _ in range(10):
            target = height * width * _uniform(*self.scale)
            aspect = math.exp(_uniform(*self.log_ratio))
            h = round(math.sqrt(target * aspect))
            w = round(math.sqrt(target / aspect))
            if 0 < h < height and 0 < w < width:
                top = int(torch.randint(0, height - h + 1, ()))
                left = int(torch.randint(0, width - w + 1, ()))
                x = x.clone()
                x[:, top : top + h, left : left + w] = torch.randn(channels, h, w)
                return x
        return x


# -- RandAugment ----------------------------------------------------------------------------


def _affine(x: Tensor, matrix: list[list[float]]) -> Tensor:
    """Warp (C, H, W) by a 2x3 matrix in normalised coordinates; outside is filled with 0."""
    theta = torch.tensor(matrix, dtype=x.dtype)[None]  # (1, 2, 3)
    grid = F.affine_grid(theta, [1, *x.shape], align_corners=False)  # (1, H, W, 2)
    return F.grid_sample(x[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[
        0
    ]


def _gray(x: Tensor) -> Tensor:
    if x.shape[0] == 1:
        return x
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(3, 1, 1)
    return (x * weights).sum(0, keepdim=True)  # (1, H, W)


def _blend(a: Tensor, b: Tensor, factor: float) -> Tensor:
    """factor 1 gives `a`, 0 gives `b` (PIL ImageEnhance's convention)."""
    return (b + factor * (a - b)).clamp(0, 1)


def _signed(value: float) -> float:
    return value if _rand() < 0.5 else -value


def _rotate(x: Tensor, level: float) -> Tensor:
    angle = math.radians(_signed(30.0 * level))
    cos, sin = math.cos(angle), math.sin(angle)
    return _affine(x, [[cos, -sin, 0.0], [sin, cos, 0.0]])


def _shear_x(x: Tensor, level: float) -> Tensor:
    return _affine(x, [[1.0, _signed(0.3 * level), 0.0], [0.0, 1.0, 0.0]])


def _shear_y(x: Tensor, level: float) -> Tensor:
    return _affine(x, [[1.0, 0.0, 0.0], [_signed(0.3 * level), 1.0, 0.0]])


def _translate_x(x: Tensor, level: float) -> Tensor:
    return _affine(x, [[1.0, 0.0, _signed(0.45 * 2 * level)], [0.0, 1.0, 0.0]])


def _translate_y(x: Tensor, level: float) -> Tensor:
    return _affine(x, [[1.0, 0.0, 0.0], [0.0, 1.0, _signed(0.45 * 2 * level)]])


def _brightness(x: Tensor, level: float) -> Tensor:
    return _blend(x, torch.zeros_like(x), 1.0 + _signed(0.9 * level))


def _color(x: Tensor, level: float) -> Tensor:
    return _blend(x, _gray(x).expand_as(x), 1.0 + _signed(0.9 * level))


def _contrast(x: Tensor, level: float) -> Tensor:
    return _blend(x, _gray(x).mean().expand_as(x), 1.0 + _signed(0.9 * level))


def _sharpness(x: Tensor, level: float) -> Tensor:
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], dtype=x.dtype) / 13
    kernel = kernel.expand(x.shape[0], 1, 3, 3)
    smooth = F.conv2d(x[None], kernel, padding=1, groups=x.shape[0])[0]  # (C, H, W)
    return _blend(x, smooth, 1.0 + _signed(0.9 * level))


def _solarize(x: Tensor, level: float) -> Tensor:
    threshold = 1.0 - level
    return torch.where(x >= threshold, 1.0 - x, x)


def _posterize(x: Tensor, level: float) -> Tensor:
    bits = max(1, 8 - int(round(4 * level)))
    step = 2 ** (8 - bits)
    return torch.floor(x * 255 / step) * step / 255


def _autocontrast(x: Tensor, level: float) -> Tensor:
    low = x.amin(dim=(1, 2), keepdim=True)
    high = x.amax(dim=(1, 2), keepdim=True)
    return torch.where(high > low, (x - low) / (high - low).clamp_min(1e-6), x)


def _equalize(x: Tensor, level: float) -> Tensor:
    """Histogram equalisation per channel on 256 levels."""
    out = []
    for channel in (x * 255).round().long().clamp(0, 255):
        hist = torch.bincount(channel.flatten(), minlength=256).float()
        cdf = hist.cumsum(0)
        nonzero = cdf[hist > 0]
        if nonzero.numel() < 2:
            out.append(channel.float() / 255)
            continue
        lut = ((cdf - nonzero[0]) / (cdf[-1] - nonzero[0]) * 255).clamp(0, 255)
        out.append(lut[channel] / 255)
    return torch.stack(out)  # (C, H, W)


def _identity(x: Tensor, level: float) -> Tensor:
    return x


RAND_AUGMENT_OPS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "Identity": _identity,
    "AutoContrast": _autocontrast,
    "Equalize": _equalize,
    "Rotate": _rotate,
    "Solarize": _solarize,
    "Color": _color,
    "Posterize": _posterize,
    "Contrast": _contrast,
    "Brightness": _brightness,
    "Sharpness": _sharpness,
    "ShearX": _shear_x,
    "ShearY": _shear_y,
    "TranslateX": _translate_x,
    "TranslateY": _translate_y,
}


class RandAugment:
    """`num_ops` operations drawn uniformly, each at magnitude ~ N(magnitude, mstd) out of 10
    (timm's rand-m9-mstd0.5 is `RandAugment(2, 9, 0.5)`). Translation is 45% of the image."""

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: float = 9.0,
        mstd: float = 0.5,
        ops: Sequence[str] | None = None,
    ) -> None:
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.mstd = mstd
        self.ops = list(ops or RAND_AUGMENT_OPS)
        unknown = [op for op in self.ops if op not in RAND_AUGMENT_OPS]
        if unknown:
            raise ValueError(f"unknown RandAugment ops {unknown}; known: {list(RAND_AUGMENT_OPS)}")

    def __call__(self, x: Tensor) -> Tensor:
        for _ in range(self.num_ops):
            op = self.ops[int(torch.randint(len(self.ops), ()))]
            m = self.magnitude + (float(torch.randn(())) * self.mstd if self.mstd > 0 else 0.0)
            level = min(max(m, 0.0), 10.0) / 10.0
            x = RAND_AUGMENT_OPS[op](x, level).clamp(0, 1)
        return x


def parse_rand_augment(spec: str | None) -> RandAugment | None:
    """'rand-m9-n2-mstd0.5' (timm's notation) -> RandAugment; None, '' or 'none' -> None."""
    if not spec or spec == "none":
        return None
    parts = spec.split("-")
    if parts[0] != "rand":
        raise ValueError(
            f"RandAugment spec {spec!r} must start with 'rand', e.g. 'rand-m9-mstd0.5'"
        )
    opts = {"num_ops": 2, "magnitude": 9.0, "mstd": 0.5}
    for part in parts[1:]:
        for key, name, cast in (
            ("mstd", "mstd", float),
            ("m", "magnitude", float),
            ("n", "num_ops", int),
        ):
            if part.startswith(key):
                try:
                    opts[name] = cast(part[len(key) :])
                except ValueError:
                    raise ValueError(f"bad RandAugment field {part!r} in {spec!r}") from None
                break
        else:
            raise ValueError(f"unknown RandAugment field {part!r} in {spec!r}; use m, n, mstd")
    return RandAugment(**opts)


# -- pipelines ------------------------------------------------------------------------------


def build_transform(
    train: bool,
    *,
    img_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    crop_scale: tuple[float, float] | None = (0.08, 1.0),
    hflip: float = 0.5,
    rand_augment: str | None = "rand-m9-mstd0.5",
    reprob: float = 0.25,
) -> Compose:
    """The per-image pipeline: train = [crop] [flip] [RandAugment] normalise [erase];
    eval = resize, normalise.

    Args:
        train: build the training pipeline (random) or the evaluation one.
        img_size: output (h, w).
        mean, std: per-channel normalisation.
        crop_scale: RandomResizedCrop's area range; None resizes instead.
        hflip: horizontal flip probability.
        rand_augment: a timm-style spec ('rand-m9-mstd0.5') or None.
        reprob: random erasing probability.
    """
    img_size = tuple(img_size)
    if crop_scale is not None and not 0 < crop_scale[0] <= crop_scale[1] <= 1:
        raise ValueError(
            f"crop_scale (MIN, MAX) needs 0 < MIN <= MAX <= 1, got {tuple(crop_scale)}"
        )
    for name, p in (("hflip", hflip), ("reprob", reprob)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} is a probability in [0, 1], got {p}")
    if not train:
        return Compose([Resize(img_size), Normalize(mean, std)])
    steps: list[Transform] = [
        RandomResizedCrop(img_size, scale=crop_scale) if crop_scale else Resize(img_size)
    ]
    if hflip > 0:
        steps.append(RandomHorizontalFlip(hflip))
    augment = parse_rand_augment(rand_augment)
    if augment is not None:
        steps.append(augment)
    steps.append(Normalize(mean, std))
    if reprob > 0:
        steps.append(RandomErasing(reprob))
    return Compose(steps)


# -- batch mixing ---------------------------------------------------------------------------


def one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Labels (B,) -> smoothed one-hot targets (B, num_classes) summing to 1."""
    off = smoothing / num_classes
    targets = torch.full((len(labels), num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)


class Mixup:
    """Mixup or CutMix on a batch (one draw per batch, as timm's default 'batch' mode).

    With both enabled each batch uses CutMix with probability `switch_prob`. Returns the mixed
    images and soft targets (B, num_classes), label smoothing included.

    Args:
        mixup_alpha: Beta(alpha, alpha) for Mixup; 0 disables it.
        cutmix_alpha: Beta(alpha, alpha) for CutMix; 0 disables it.
        prob: probability of mixing a batch at all.
        switch_prob: probability of CutMix when both are enabled.
        label_smoothing: smoothing of the targets.
        num_classes: number of classes.
    """

    def __init__(
        self,
        *,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
    ) -> None:
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.prob = prob
        self.switch_prob = switch_prob
        self.label_smoothing = label_smoothing
        self.num_classes = num_classes

    @property
    def active(self) -> bool:
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def _beta(self, alpha: float) -> float:
        return float(torch.distributions.Beta(alpha, alpha).sample())

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        targets = one_hot(labels, self.num_classes, self.label_smoothing)
        if not self.active or _rand() >= self.prob:
            return images, targets
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or _rand() < self.switch_prob)
        flipped = images.flip(0)
        if use_cutmix:
            lam = self._beta(self.cutmix_alpha)
            height, width = images.shape[-2:]
            cut = math.sqrt(1.0 - lam)
            ch, cw = int(height * cut), int(width * cut)
            cy, cx = int(torch.randint(height, ())), int(torch.randint(width, ()))
            top, bottom = max(cy - ch // 2, 0), min(cy + ch // 2, height)
            left, right = max(cx - cw // 2, 0), min(cx + cw // 2, width)
            images = images.clone()
            images[..., top:bottom, left:right] = flipped[..., top:bottom, left:right]
            lam = 1.0 - (bottom - top) * (right - left) / (height * width)
        else:
            lam = self._beta(self.mixup_alpha)
            images = images * lam + flipped * (1.0 - lam)
        return images, targets * lam + targets.flip(0) * (1.0 - lam)
