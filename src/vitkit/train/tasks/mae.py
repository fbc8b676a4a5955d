"""Masked-autoencoder pretraining (`vitkit pretrain`; He et al., "Masked Autoencoders Are
Scalable Vision Learners", CVPR 2022): its set-up (a fresh ViT encoder sized to the data, from
the pieces in `setup.py`: no pretrained weights, no CNN), the loss of the model family's masked
autoencoder (its record's `masked_autoencoder`: the ViT's `MaskedAutoencoder`) on the training
images (labels unused), MAE's optimiser (AdamW with betas (0.9, 0.95)), and per epoch
`encoder.safetensors` (a plain vitkit ViT with its data config, what `vitkit train
--pretrained` fine-tunes) and `reconstructions.png`. Validation is the MAE loss on the
validation split with the same masks every epoch; the best epoch has the lowest."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...data import first_items, transformed
from ...model import architecture_of, get_config
from ...plots import draw_reconstructions
from ...weights.checkpoint import save
from ...weights.cnn import is_timm_name
from ..config import PretrainConfig
from ..distributed import all_reduce, world
from ..loop import autocast
from ..optim import param_groups
from ..run_folder import ENCODER_FILE, PICTURE_FILE, PRETRAIN_FILES
from ..setup import fresh_model, load_splits, transforms
from ..sharded import lockstep
from .base import Task

log = logging.getLogger(__name__)

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
    run_files = PRETRAIN_FILES
    last_file = ENCODER_FILE

    def __init__(
        self,
        mae: nn.Module,
        config: Any,
        *,
        sample: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        self.model, self.config = mae, config
        self.sample, self.mean, self.std = sample, tuple(mean), tuple(std)
        self.meta: dict[str, Any] = {}

    @classmethod
    def setup(cls, config: PretrainConfig) -> MaeTask:
        """The task of a pretraining run: the config's model sized to the data as the encoder
        (its head removed) inside the MAE, on `config.device`; the augmentation random resized
        crops (`crop_scale`) and flips (`hflip`) only."""
        if not isinstance(config, PretrainConfig):
            raise TypeError(
                f"MAE pretraining takes a PretrainConfig, got {type(config).__name__}; build "
                "it with resolve_config(values, job=PretrainConfig)"
            )
        if config.model is None:
            raise ValueError(
                "MAE pretraining needs a model name; build the config with resolve_config"
            )
        if is_timm_name(config.model):
            raise ValueError(f"MAE pretrains a ViT encoder; {config.model} is a CNN")
        base = get_config(config.model)
        build_mae = architecture_of(base).masked_autoencoder
        if build_mae is None:
            title = architecture_of(base).title
            raise ValueError(f"MAE pretrains a ViT encoder; {config.model} is a {title}")
        splits = load_splits(
            config,
            in_chans=config.model_opts.get("in_chans", base.in_chans),
            img_size=config.model_opts.get("img_size", base.img_size),
        )
        encoder = fresh_model(config.model, splits, config.model_opts)
        train_tf, eval_tf = transforms(config, splits, encoder.data_config)
        encoder.reset_classifier(0)
        mae = build_mae(
            encoder,
            mask_ratio=config.mask_ratio,
            decoder_dim=config.decoder_dim,
            decoder_depth=config.decoder_depth,
            decoder_heads=config.decoder_heads,
            norm_pix_loss=config.norm_pix,
        ).to(config.device)
        torch.manual_seed(config.seed + world()[0])  # each rank draws its own masks
        val_set = transformed(splits.val, eval_tf)
        sample = torch.stack([image for image, _ in first_items(val_set, 4)])
        task = cls(mae, config, sample=sample, mean=splits.mean, std=splits.std)
        task.splits, task.train_set, task.val_set = (
            splits,
            transformed(splits.train, train_tf),
            val_set,
        )
        task.meta = {
            "data": config.data_spec(),
            "model_name": config.model,
            "mean": list(splits.mean),
            "std": list(splits.std),
        }
        return task

    def recorded_model(self) -> nn.Module:
        return self.model.encoder

    def log_start(self, out: Path) -> None:
        config = self.config
        log.info(
            "MAE pretraining of %s on %s: %d images, mask ratio %.2f, %d %s -> %s",
            config.model,
            self.splits.name,
            len(self.train_set),
            config.mask_ratio,
            config.epochs,
            "epoch" if config.epochs == 1 else "epochs",
            out,
        )

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
