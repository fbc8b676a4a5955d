"""DeiT's batch mixing: Mixup (Zhang et al. 2018, alpha 0.8) and CutMix (Yun et al. 2019,
alpha 1.0) with label smoothing (Szegedy et al. 2016); Touvron et al. 2021, Table 9.
Multi-label targets (multi-hot) are mixed alike, each label smoothed towards 0.5, as timm's
`Mixup(multi_label=True)`.

The per-image transforms are in `transforms.py` and `rand_augment.py`. Randomness comes from
torch's global generator, so a seeded run (and a resumed one, which restores the generator)
draws the same mixing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _rand() -> float:
    return float(torch.rand(()))


def one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Labels (B,) -> smoothed one-hot targets (B, num_classes) summing to 1."""
    off = smoothing / num_classes
    targets = torch.full((len(labels), num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)


def binary_targets(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Multi-hot (B, num_classes) targets, or labels (B,) made one-hot, each moved towards 0.5
    by `smoothing` (timm's multi-label smoothing, for one-vs-rest sigmoid heads)."""
    dense = labels.float() if labels.dim() == 2 else one_hot(labels, num_classes)
    return dense * (1.0 - smoothing) + 0.5 * smoothing if smoothing else dense


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
        multi_label: targets for sigmoid heads (`binary_targets`): labels may be multi-hot.
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
        multi_label: bool = False,
    ) -> None:
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.prob = prob
        self.switch_prob = switch_prob
        self.label_smoothing = label_smoothing
        self.num_classes = num_classes
        self.multi_label = multi_label

    @property
    def active(self) -> bool:
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def _beta(self, alpha: float) -> float:
        return float(torch.distributions.Beta(alpha, alpha).sample())

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if self.multi_label:
            targets = binary_targets(labels, self.num_classes, self.label_smoothing)
        else:
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
