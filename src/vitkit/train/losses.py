"""The training losses: cross-entropy on soft targets, DeiT's distillation term, and the
one-vs-rest losses of multi-label classification.

Touvron et al., "Training data-efficient image transformers & distillation through attention"
(DeiT, 2021), Section 5: hard distillation takes the teacher's argmax as a label, soft the KL
divergence to its distribution at temperature tau. Ridnik et al., "Asymmetric Loss For
Multi-Label Classification" (ICCV 2021): ASL, as timm's `AsymmetricLossMultiLabel`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against soft targets (B, K), e.g. mixed and smoothed labels."""
    return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def distill_loss(
    student_dist: Tensor, teacher_logits: Tensor, mode: str, tau: float = 1.0
) -> Tensor:
    """DeiT's distillation term on the distillation-token logits: 'hard' is cross-entropy with
    the teacher's argmax, 'soft' the KL divergence at temperature `tau` (times tau^2)."""
    if mode == "hard":
        return F.cross_entropy(student_dist.float(), teacher_logits.argmax(dim=-1))
    if mode == "soft":
        log_p = F.log_softmax(student_dist.float() / tau, dim=-1)
        log_q = F.log_softmax(teacher_logits.float() / tau, dim=-1)
        return F.kl_div(log_p, log_q, reduction="batchmean", log_target=True) * tau * tau
    raise ValueError(f"unknown distillation mode {mode!r}; expected 'hard' or 'soft'")


MULTI_LABEL_LOSSES = ("bce", "asl")


def binary_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean binary cross-entropy of each class's sigmoid against (B, K) targets in [0, 1]
    (timm's `BinaryCrossEntropy` on dense targets: smoothing is the targets', `Mixup`'s)."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets.float())


def asymmetric_loss(
    logits: Tensor,
    targets: Tensor,
    *,
    gamma_neg: float = 4.0,
    gamma_pos: float = 1.0,
    clip: float = 0.05,
    eps: float = 1e-8,
) -> Tensor:
    """ASL (Ridnik et al. 2021) summed over classes, averaged over the batch: negatives'
    probabilities shifted down by `clip` and both terms focused, (1 - p_t) ** gamma, with
    gamma_neg for negatives and gamma_pos for positives; timm's defaults."""
    x, y = logits.float(), targets.float()
    p = torch.sigmoid(x)
    p_neg = (1 - p + clip).clamp(max=1) if clip > 0 else 1 - p
    loss = y * torch.log(p.clamp(min=eps)) + (1 - y) * torch.log(p_neg.clamp(min=eps))
    p_t = p * y + p_neg * (1 - y)
    loss = loss * torch.pow(1 - p_t, gamma_pos * y + gamma_neg * (1 - y))
    return -loss.sum() / x.shape[0]


def multi_label_loss(name: str, logits: Tensor, targets: Tensor) -> Tensor:
    """The one-vs-rest loss `name` ('bce' or 'asl') of (B, K) logits and targets."""
    if name == "bce":
        return binary_cross_entropy(logits, targets)
    if name == "asl":
        return asymmetric_loss(logits, targets)
    raise ValueError(f"unknown multi-label loss {name!r}; expected one of {MULTI_LABEL_LOSSES}")
