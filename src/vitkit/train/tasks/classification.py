"""Image classification (`vitkit train`): Mixup / CutMix and label smoothing, DeiT's
distillation through a teacher, an EMA of the weights, layer decay, freezing and linear
probing; the best epoch is the highest validation top-1."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...data import Mixup
from ...weights.checkpoint import save
from ..loop import evaluate
from ..losses import distill_loss, soft_cross_entropy
from ..optim import ModelEma, build_optimizer, freeze_layers, swapped_weights
from ..run_folder import BEST_FILE, EMA_FILE, LAST_FILE
from .base import Task

log = logging.getLogger(__name__)


class DistillForward(nn.Module):
    """Wraps a distilled ViT so that `forward` returns (class logits, distillation logits):
    DistributedDataParallel and torch.compile only see `forward`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.forward_distill(x)


class ClassificationTask(Task):
    """Train a classifier; each epoch writes `last.safetensors`, `model.safetensors` (the best
    validation top-1) and, with an EMA, `ema.safetensors`, each with `meta`.

    Args:
        model: an unwrapped classifier (a vitkit ViT or a timm CNN) on its device.
        config: the run's options; this task reads the classification ones (mixing,
            smoothing, EMA, distillation, layer decay, freezing, linear probing).
        teacher: distillation teacher (with `config.distill` 'hard' or 'soft'), called on
            the student's batch as it is; `teacher.Teacher` prepares it for another model.
        meta: saved with each model file (class names, normalisation, ...).
    """

    name = "classification"
    best_metric = "val_acc1"
    higher_is_better = True
    log_keys = ("train_loss", "val_loss", "val_acc1", "val_acc5")
    counts_correct = True
    files = (BEST_FILE, LAST_FILE, EMA_FILE)

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        *,
        teacher: nn.Module | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        _check_distillation(model, teacher, config)
        self.model, self.config, self.teacher = model, config, teacher
        self.meta = dict(meta or {})
        if teacher is not None:
            teacher.eval().requires_grad_(False)
        self.mixup = Mixup(
            mixup_alpha=config.mixup,
            cutmix_alpha=config.cutmix,
            prob=config.mix_prob,
            switch_prob=config.switch_prob,
            label_smoothing=config.smoothing,
            num_classes=model.num_classes,
        )
        self.ema: ModelEma | None = None

    def prepare(self, config: Any) -> None:
        """Freeze what the config freezes (frozen parameters stay out of the optimiser), then
        gradient checkpointing; the EMA starts from the weights as they are."""
        if config.freeze is not None or config.linear_probe:
            frozen = freeze_layers(self.model, blocks=config.freeze,
                                   linear_probe=config.linear_probe)  # fmt: skip
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            log.info("froze %d parameter tensors; %d parameters train", frozen, trained)
        super().prepare(config)

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        config = self.config
        optimizer = build_optimizer(self.model, lr, config.weight_decay, config.layer_decay)
        if config.ema:
            self.ema = ModelEma(self.model, config.ema)
        return optimizer

    def trained_module(self) -> nn.Module:
        return DistillForward(self.model) if self.teacher is not None else self.model

    def train_mode(self, trained: nn.Module) -> None:
        trained.train(not self.config.linear_probe)  # a probe reads the encoder as at inference

    def batch(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        return self.mixup(images, labels)

    def loss(self, trained: nn.Module, inputs: Tensor, targets: Tensor) -> tuple[Tensor, float]:
        """The loss of a mixed batch and its correct predictions (against the largest target);
        with a teacher, DeiT's mix of the class loss and the distillation term, the mean of
        both heads as the prediction."""
        if self.teacher is None:
            logits = trained(inputs)
            loss = soft_cross_entropy(logits, targets)
        else:
            config = self.config
            cls_logits, dist_logits = trained(inputs)
            with torch.no_grad():
                teacher_logits = self.teacher(inputs)  # in its own preparation (`Teacher`)
            base = soft_cross_entropy(cls_logits, targets)
            extra = distill_loss(dist_logits, teacher_logits, config.distill, config.distill_tau)
            loss = base * (1 - config.distill_alpha) + extra * config.distill_alpha
            logits = (cls_logits + dist_logits) / 2
        return loss, (logits.argmax(-1) == targets.argmax(-1)).sum().item()

    def after_step(self) -> None:
        if self.ema is not None:
            self.ema.update(self.model)

    def validate(self, loader: Any, device: torch.device, amp: str) -> dict[str, float]:
        """Loss, top-1 and top-5 on the validation split; with an EMA also its top-1."""
        val = evaluate(self.model, loader, device=device, amp=amp)
        row = {"val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"]}
        if self.ema is not None:
            with swapped_weights(self.model, self.ema):
                row["ema_val_acc1"] = evaluate(self.model, loader, device=device, amp=amp)["acc1"]
        return row

    def save_files(self, out: Path, row: dict[str, Any], improved: bool) -> None:
        file_meta = {**self.meta, "epoch": row["epoch"], "val_acc1": row["val_acc1"]}
        save(self.model, out / LAST_FILE, meta=file_meta)
        if improved:
            save(self.model, out / BEST_FILE, meta=file_meta)
        if self.ema is not None:
            with swapped_weights(self.model, self.ema):
                save(self.model, out / EMA_FILE, meta={**file_meta, "ema": True})

    def extra_state(self) -> dict[str, Any]:
        if self.ema is None:
            return {}
        return {"ema": {k: v.cpu() for k, v in self.ema.state.items()}}

    def load_extra_state(self, saved: dict[str, Any], device: torch.device) -> None:
        if self.ema is not None and "ema" in saved:
            self.ema.state = {k: v.to(device) for k, v in saved["ema"].items()}


def _check_distillation(model: nn.Module, teacher: nn.Module | None, config: Any) -> None:
    if config.distill != "none" and teacher is None:
        raise ValueError(f"distill={config.distill!r} needs a teacher model")
    if teacher is not None and config.distill == "none":
        raise ValueError("a teacher was given but distill='none'; choose 'hard' or 'soft'")
    if teacher is not None and getattr(model, "head_dist", None) is None:
        raise ValueError("distillation needs a student built with distilled=True")
    classes = getattr(teacher, "num_classes", None)
    if teacher is not None and classes is not None and classes != model.num_classes:
        raise ValueError(
            f"the teacher predicts {classes} classes, the student {model.num_classes}; "
            "distil from a teacher trained on the same classes"
        )
