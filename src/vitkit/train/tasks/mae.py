"""Masked-autoencoder pretraining (`vitkit pretrain`; He et al., "Masked Autoencoders Are
Scalable Vision Learners", CVPR 2022): the loss of `model.mae.MaskedAutoencoder` on the
training images (labels unused), MAE's optimiser (AdamW with betas (0.9, 0.95)), and per
epoch `encoder.safetensors` (a plain vitkit ViT with its data config, what `vitkit train
--pretrained` fine-tunes) and `reconstructions.png`. Validation is the MAE loss on the
validation split with the same masks every epoch; the best epoch has the lowest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...model.vit.mae import MaskedAutoencoder
from ...plots import draw_reconstructions
from ...weights.checkpoint import save
from ..distributed import all_reduce
from ..loop import autocast
from ..optim import param_groups
from ..run_folder import ENCODER_FILE, PICTURE_FILE
from ..sharded import lockstep
from .base import Task

BETAS = (0.9, 0.95)  # MAE's pretraining optimiser


class MaeTask(Task):
    """Pretrain `mae.encoder` as a masked autoencoder.

    Args:
        mae: the MaskedAutoencoder, on its device.
        config: the run's options; this task reads `weight_decay` (its MAE options are the
            model's already).
        sample: a few validation images (B, C, H, W), normalised, for `reconstructions.png`.
        mean, std: their normalisation, to draw them.
    """

    name = "mae"
    best_metric = "val_loss"
    higher_is_better = False
    log_keys = ("train_loss", "val_loss")
    find_unused_parameters = True  # an encoder's pooling norm or head is not in MAE's loss
    files = (ENCODER_FILE, PICTURE_FILE)

    def __init__(
        self,
        mae: MaskedAutoencoder,
        config: Any,
        *,
        sample: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        self.model, self.config = mae, config
        self.sample, self.mean, self.std = sample, tuple(mean), tuple(std)

    def checkpointed(self) -> nn.Module:
        return self.model.encoder

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        groups = param_groups(self.model, self.config.weight_decay)
        return torch.optim.AdamW(groups, lr=lr, betas=BETAS)

    def loss(self, trained: nn.Module, inputs: Tensor, targets: Tensor) -> tuple[Tensor, float]:
        loss, _, _ = trained(inputs)
        return loss, 0.0

    @torch.no_grad()
    def validate(self, loader: Any, device: torch.device, amp: str) -> dict[str, float]:
        """The MAE loss on the validation split, the masks drawn from a fixed seed (the same
        every epoch, and no number drawn from the training's random stream)."""
        mae = self.model
        mae.eval()
        masks = torch.Generator(device=device).manual_seed(0)
        loss_sum = count = 0.0
        for (images, _), counted in lockstep(loader, mae):
            if len(images) == 0:
                continue
            images = images.to(device)
            with autocast(amp, device):
                loss, _, _ = mae(images, generator=masks)
            if not counted:  # a sharded model's pass to keep step with the other ranks
                continue
            loss_sum += loss.float().item() * len(images)
            count += len(images)
        loss_sum, count = all_reduce([loss_sum, count], device)
        if count == 0:
            raise ValueError("nothing to validate: the validation data is empty")
        return {"val_loss": loss_sum / count}

    def save_files(self, out: Path, row: dict[str, Any], improved: bool) -> None:
        save(self.model.encoder, out / ENCODER_FILE)  # with its data config
        draw_reconstructions(self.model, self.sample, self.mean, self.std, out / PICTURE_FILE)
