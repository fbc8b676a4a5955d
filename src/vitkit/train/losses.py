"""The training losses: cross-entropy on soft targets, and DeiT's distillation term.

Touvron et al., "Training data-efficient image transformers & distillation through attention"
(DeiT, 2021), Section 5: hard distillation takes the teacher's argmax as a label, soft the KL
divergence to its distribution at temperature tau.
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
