"""Image classification (`vitkit train`): its set-up (the model: a registered ViT, pretrained
weights of any format `load_pretrained` reads, or a timm CNN; a distillation teacher), Mixup /
CutMix and label smoothing, DeiT's distillation, an EMA of the weights, layer decay, freezing
and linear probing; the best epoch is the highest validation top-1, whose weights are scored
on the test split at the end (`test.json`). Multi-label data (a file list with several labels
per image, or `multi_label`) trains one-vs-rest: a sigmoid per class with binary cross-entropy
or ASL, scored by mAP (`multi_label.py`)."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ...data import Mixup, Splits, transformed
from ...data.channels import with_channels
from ...data.data_config import DataConfig
from ...files import atomic_write
from ...model import get_config, to_2tuple
from ...model.onednn_linear import MIN_FEATURES
from ...model.onednn_support import native_bf16
from ...weights import inspect, load_pretrained, load_state_dict
from ...weights.checkpoint import save
from ...weights.cnn import create_timm_classifier, is_timm_name
from ...weights.families import check_arch
from ..config import TrainConfig
from ..distributed import barrier, make_loader, world
from ..loop import evaluate
from ..losses import distill_loss, multi_label_loss, soft_cross_entropy
from ..multi_label import THRESHOLD, evaluate_multi_label
from ..optim import ModelEma, build_optimizer, freeze_layers, swapped_weights
from ..run_folder import BEST_FILE, EMA_FILE, LAST_FILE, RUN_FILES, TEST_FILE
from ..setup import fresh_model, load_splits, require_parts, transforms
from ..sharded import load_full
from ..teacher import load_teacher
from .base import Task

if TYPE_CHECKING:
    from ..fit import FitResult

log = logging.getLogger(__name__)


@dataclass
class TrainingSetup:
    """What `vitkit train` builds before it trains: the config, the data splits, the model
    (seeded, on the CPU) and the transformed train / val / test datasets."""

    config: TrainConfig
    splits: Splits
    model: nn.Module
    train_set: Dataset
    val_set: Dataset
    test_set: Dataset


def training_setup(config: TrainConfig) -> TrainingSetup:
    """The data, model and datasets of a classification run (benchmarks and notebooks call it
    too; resolve a config with the recipes first: `recipes.resolve_config({"data":
    "fashion-mnist"})`)."""
    if config.model is None and not config.pretrained:
        raise ValueError("training_setup needs a model name; build the config with resolve_config")
    cnn = config.model is not None and is_timm_name(config.model)
    base = get_config(config.model if config.model and not cnn else "vit_base_patch16_224")
    opts = config.model_opts
    # Image files decode to the model's channels; pretrained weights and CNNs take RGB unless
    # the in_chans option says otherwise.
    default_chans = 3 if config.pretrained or cnn else base.in_chans
    splits = load_splits(
        config,
        in_chans=opts.get("in_chans", default_chans),
        img_size=opts.get("img_size", base.img_size),
    )
    require_parts(splits, config, ("test",))  # scored at the end
    if config.pretrained and opts.get("in_chans", splits.in_chans) != splits.in_chans:
        # images of fixed channels (digits, MNIST) made as --in-chans says, not the weights
        # adapted to them (the default: weights/channels.py)
        log.info("%s images converted to %d channels", splits.name, opts["in_chans"])
        splits = with_channels(splits, opts["in_chans"])
    model = build_model(config, splits)
    if config.pretrained:  # the weights' own normalisation, as they were trained with
        splits = dataclasses.replace(splits, mean=model.data_config.mean, std=model.data_config.std)
    train_tf, eval_tf = transforms(
        config, splits, model.data_config, rand_augment=config.aa, reprob=config.reprob
    )
    return TrainingSetup(
        config=config,
        splits=splits,
        model=model,
        train_set=transformed(splits.train, train_tf),
        val_set=transformed(splits.val, eval_tf),
        test_set=transformed(splits.test, eval_tf),
    )


def build_model(config: TrainConfig, splits: Splits) -> nn.Module:
    """The registered model with the config's model options, sized to the data; or, with
    `config.pretrained`, the architecture of those weights (any format `load_pretrained`
    reads), with a new head for the data's classes, the position grid resampled to the
    `img_size` option and the other model options applied; or a timm CNN.
    `model.data_config` says how its inputs are prepared."""
    options = dict(config.model_opts)
    if config.distill != "none":
        options.setdefault("distilled", True)
    if config.model is not None and is_timm_name(config.model):
        return _cnn_model(config, splits, options)
    if config.pretrained:
        return _pretrained_model(config, splits, options)
    return fresh_model(config.model, splits, options)


def _cnn_model(config: TrainConfig, splits: Splits, options: dict[str, Any]) -> nn.Module:
    """A timm CNN (`--model timm:NAME`) for the data: a distillation teacher to train. The
    `img_size` and `in_chans` options size the data; the others go to timm."""
    if config.pretrained:
        raise ValueError(
            f"--pretrained loads ViT weights; {config.model} is a CNN: train it from scratch"
        )
    if options.pop("distilled", None):
        raise ValueError(f"distillation trains a ViT student; {config.model} is a CNN")
    img_size, _ = options.pop("img_size", None), options.pop("in_chans", None)
    model = create_timm_classifier(
        config.model, num_classes=splits.num_classes, in_chans=splits.in_chans, **options
    )
    size = to_2tuple(img_size, "img_size") if img_size else splits.img_size or (224, 224)
    model.data_config = DataConfig(
        input_size=(splits.in_chans, *size),
        mean=splits.mean,
        std=splits.std,
        interpolation="bilinear",
        crop_mode="squash",
    )
    return model


def _pretrained_model(config: TrainConfig, splits: Splits, options: dict[str, Any]) -> nn.Module:
    """The weights of `config.pretrained` for the data; the `in_chans` option says how the
    images were read, and weights of another channel count have their first convolution
    adapted to the data's (timm's `adapt_input_conv`: summed over RGB for grey images,
    `weights/channels.py`). A `model` named beside them
    is their architecture: what the weights do not record comes from it, and a name whose
    sizes differ from the weights' is refused (`ArchMismatchError`), never ignored."""
    options.pop("in_chans", None)
    img_size = options.pop("img_size", None)
    if config.model is not None:
        info = inspect(config.pretrained, arch=config.model, overrides=options)
        # the reason the name does not fit comes first; a family may check it as it reads
        check_arch(info.require_config(), config.model, options)
    model = load_pretrained(
        config.pretrained,
        num_classes=splits.num_classes,
        img_size=img_size,
        pos_resample=config.pos_resample,
        arch=config.model,
        in_chans=splits.in_chans,
        **options,
    )
    return model.train()


def bf16_would_help(config: TrainConfig, model: nn.Module, device: str | torch.device) -> bool:
    """Whether to suggest `--amp bf16`: fp32 by default on a CPU with native bf16, for a model
    wide enough that its products dominate (oneDNN's MIN_FEATURES; the 64-wide digits model
    gains nothing)."""
    width = getattr(model, "num_features", 0)
    return (
        config.amp is None
        and torch.device(device).type == "cpu"
        and width >= MIN_FEATURES
        and native_bf16()
    )


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
        multi_label: one-vs-rest (sigmoid heads): targets multi-hot, the loss
            `config.multi_label_loss`, the best epoch the highest validation mAP.
    """

    name = "classification"
    best_metric = "val_acc1"
    higher_is_better = True
    log_keys = ("train_loss", "val_loss", "val_acc1", "val_acc5")
    counts_correct = True
    files = (BEST_FILE, LAST_FILE, EMA_FILE)
    run_files = RUN_FILES
    last_file = LAST_FILE

    def __init__(
        self,
        model: nn.Module,
        config: Any,
        *,
        teacher: nn.Module | None = None,
        meta: dict[str, Any] | None = None,
        multi_label: bool = False,
    ) -> None:
        if multi_label and teacher is not None:
            raise ValueError(
                "distillation trains a single-label student (softmax heads); train the "
                "multi-label model without a teacher"
            )
        _check_distillation(model, teacher, config)
        self.model, self.config, self.teacher = model, config, teacher
        self.multi_label = multi_label
        if multi_label:  # the instance's own: the class's stay those of single labels
            self.best_metric = "val_map"
            self.log_keys = ("train_loss", "val_loss", "val_map", "val_f1")
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
            multi_label=multi_label,
        )
        self.ema: ModelEma | None = None

    @classmethod
    def setup(cls, config: TrainConfig) -> ClassificationTask:
        """The task of a run: its data (`training_setup`), the model on `config.device`, the
        teacher of a distillation and the metadata its files carry."""
        if not isinstance(config, TrainConfig):
            raise TypeError(
                f"classification takes a TrainConfig, got {type(config).__name__}; build it "
                "with resolve_config(values)"
            )
        built = training_setup(config)
        splits, device = built.splits, config.device
        model = built.model.to(device)
        torch.manual_seed(config.seed + world()[0])
        teacher = None
        if config.teacher:
            teacher = load_teacher(
                config.teacher,
                weights=config.teacher_weights,
                student_mean=splits.mean,
                student_std=splits.std,
                student_size=model.data_config.img_size,
                device=device,
            )
        meta = {
            "class_names": splits.class_names,
            "mean": list(splits.mean),
            "std": list(splits.std),
            "data": config.data_spec(),
            "model_name": config.model,
            "split_seed": config.seed,
            "val_fraction": config.val_fraction,
            "test_fraction": config.test_fraction,
        }
        columns = {"image_column": config.image_column, "label_column": config.label_column}
        meta.update({key: name for key, name in columns.items() if name is not None})
        multi_label = config.multi_label or bool(splits.extra.get("multi_label"))
        if multi_label:
            meta.update(multi_label=True, threshold=config.threshold)
        elif config.threshold != THRESHOLD:
            log.warning(
                "--threshold %g applies to multi-label models; this data has one label per "
                "image (--multi-label trains one-vs-rest)",
                config.threshold,
            )
        task = cls(model, config, teacher=teacher, meta=meta, multi_label=multi_label)
        task.splits = splits
        task.train_set, task.val_set, task.test_set = (
            built.train_set,
            built.val_set,
            built.test_set,
        )
        return task

    def log_start(self, out: Path) -> None:
        config, splits = self.config, self.splits
        log.info(
            "training %s on %s: %d train / %d val / %d test images, %d classes, %s, %s, "
            "lr %.2e, %d %s -> %s",
            f"{config.pretrained} (fine-tuned)" if config.pretrained else config.model,
            splits.name,
            len(splits.train),
            len(splits.val),
            len(splits.test),
            splits.num_classes,
            f"recipe {config.recipe}" if config.recipe else "no recipe",
            config.device,
            config.peak_lr(world()[1]),
            config.epochs,
            "epoch" if config.epochs == 1 else "epochs",
            out,
        )
        if bf16_would_help(config, self.model, config.device):
            log.info(
                "this CPU multiplies bf16 natively (AMX / AVX-512 BF16): --amp bf16 trained "
                "ViT-S/16 3x and ViT-B/16 5x faster than fp32 here (docs/results.md)"
            )

    def finish(self, out: Path, result: FitResult) -> dict[str, Any]:
        """The best epoch's weights on the test split, written to `test.json` (rank 0)."""
        config, model = self.config, self.model
        barrier()
        if (out / BEST_FILE).is_file():
            load_full(model, load_state_dict(out / BEST_FILE))
        loader = make_loader(self.test_set, config.batch_size, train=False)
        test = self._scores(loader, config.device, config.amp_on(config.device))
        if world()[0] == 0:
            if self.multi_label:
                keys = {"test_loss": "loss", "test_map": "map", "test_f1": "f1", "test_ap": "ap"}
            else:
                keys = {"test_loss": "loss", "test_acc1": "acc1", "test_acc5": "acc5"}
            row = {**{name: test[key] for name, key in keys.items()}}
            row["best_epoch"] = result.best_epoch
            text = json.dumps(row) + "\n"
            atomic_write(out / TEST_FILE, lambda f: f.write(text), mode="w")
        return test

    def prepare(self, config: Any) -> None:
        """Freeze what the config freezes (frozen parameters stay out of the optimiser), then
        gradient checkpointing; the EMA starts from the weights as they are."""
        if config.freeze is not None or config.linear_probe:
            frozen = freeze_layers(
                self.model, blocks=config.freeze, linear_probe=config.linear_probe
            )
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
        if self.multi_label:
            logits = trained(inputs)
            loss = multi_label_loss(self.config.multi_label_loss, logits, targets)
            # correct: the top-scoring class is one of the image's (mixed) labels
            top = targets.gather(1, logits.argmax(-1, keepdim=True))
            return loss, (top >= 0.5).sum().item()
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
        """Loss, top-1 and top-5 on the validation split (multi-label: loss, mAP and F1 at the
        threshold); with an EMA also its top-1 (mAP)."""
        val = self._scores(loader, device, amp)
        if self.multi_label:
            row = {"val_loss": val["loss"], "val_map": val["map"], "val_f1": val["f1"]}
        else:
            row = {"val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"]}
        if self.ema is not None:
            key = "map" if self.multi_label else "acc1"
            with swapped_weights(self.model, self.ema):
                row[f"ema_val_{key}"] = self._scores(loader, device, amp)[key]
        return row

    def _scores(self, loader: Any, device: torch.device | str, amp: str) -> dict[str, Any]:
        """`evaluate`, or for a multi-label model `evaluate_multi_label` at the threshold."""
        if self.multi_label:
            return evaluate_multi_label(
                self.model, loader, device=device, amp=amp, threshold=self.config.threshold
            )
        return evaluate(self.model, loader, device=device, amp=amp)

    def save_files(self, out: Path, row: dict[str, Any], improved: bool) -> None:
        score = "val_map" if self.multi_label else "val_acc1"
        file_meta = {**self.meta, "epoch": row["epoch"], score: row[score]}
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
