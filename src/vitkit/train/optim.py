"""Optimiser, schedule and weight average: AdamW parameter groups, warmup + cosine, EMA.

DeiT's recipe (Touvron et al. 2021, Table 9): AdamW with weight decay 0.05, none on biases,
norms, tokens and positions; the learning rate rises linearly, then follows half a cosine,
per optimiser step; optionally an exponential moving average of the weights.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

BETAS = (0.9, 0.999)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decayed weights, and no decay for every parameter with ndim <= 1
    (biases, norms, LayerScale) and the names in `model.no_weight_decay()`."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int,
    lr: float,
    min_lr: float = 0.0,
    warmup_lr: float = 0.0,
) -> float:
    """The learning rate at optimiser step `step`: linear from `warmup_lr` to `lr` over
    `warmup_steps`, then half a cosine from `lr` down to `min_lr` at `total_steps`."""
    if step < warmup_steps:
        return warmup_lr + (lr - warmup_lr) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class ModelEma:
    """Exponential moving average of a model's parameters and buffers (float32 copies)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.state = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for key, value in model.state_dict().items():
            if value.is_floating_point():
                self.state[key].lerp_(value.detach().float(), 1.0 - self.decay)
            else:
                self.state[key].copy_(value)

    def copy_to(self, model: nn.Module) -> None:
        own = model.state_dict()
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in self.state.items()})


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over `param_groups(model, weight_decay)` (betas 0.9, 0.999)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=BETAS)


@contextlib.contextmanager
def swapped_weights(model: nn.Module, ema: ModelEma) -> Iterator[None]:
    """Run the block with the EMA weights in `model`, then put its own weights back."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ema.copy_to(model)
    try:
        yield
    finally:
        model.load_state_dict(saved)
