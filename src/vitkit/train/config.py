"""The configs of the training jobs: `TrainConfig` (`vitkit train`) and `PretrainConfig`
(`vitkit pretrain`, MAE), both made of the options every job shares (`JobConfig`: data,
model, optimisation, how the run executes) plus their own.

Each option is a field declared once with `option()` (`vitkit/options`): its type, default,
help and allowed range or choices. From these come the flags of each command (so each
`--help` lists what that job honours), the checks of a settings file, the validation of any
value and the recipe presets (named sets of overrides, `recipes.py`). The model options are
the fields of the chosen architecture's own config (its record's `config_class`: the schema
`model_architecture` finds), gathered in `model_opts` as `--model-opt KEY=VALUE` and checked
by that schema; only the few every architecture has (`SharedModelOptions`: image size,
channels, drop-path rate) have flags of their own, so that no family's knobs crowd `--help`.

Values resolve in this order: a flag given on the command line, then a `--config` file, then
the recipe of the data (DeiT's, Touvron et al. 2021, Table 9, unless the data has its own),
then the field's default (for a model option: the preset's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..data import SOURCES, parse_rand_augment, sources_help
from ..data.datasets import TEST_FRACTION, VAL_FRACTION
from ..model.schema import SharedModelOptions, check_model_options
from ..options import (
    AT_LEAST_ONE,
    FRACTION,
    NON_NEGATIVE,
    OFF_AT_ZERO,
    POSITIVE,
    PROBABILITY,
    Options,
    Range,
    option,
    option_names,
)
from ..weights.cnn import is_timm_name
from .losses import MULTI_LABEL_LOSSES

AMP_MODES = ("none", "bf16", "fp16")
DISTILL_MODES = ("none", "hard", "soft")
LOGGERS = ("tensorboard",)  # where epoch rows go besides metrics.jsonl / metrics.csv (logs.py)


@dataclass(frozen=True, kw_only=True)
class JobConfig(Options):
    """What every training job takes: data, model, optimisation, crops and flips, and how the
    run executes.

    `batch_size` is per process. `lr` None means `blr * effective batch / 512` (DeiT's
    scaling; `peak_lr`). Epoch counts may be fractional for warmup. The defaults are DeiT's
    ImageNet recipe with a CPU-sized batch; `recipes.py` holds the other presets.
    """

    NOUN = "setting"
    GROUPS = {
        "data": "data",
        "model": "model",
        "optim": "optimisation (unset: the recipe's value)",
        "augment": "augmentation and regularisation (unset: the recipe's value)",
        "finetune": "fine-tuning (with --pretrained)",
        "distill": "distillation (DeiT)",
        "multilabel": "multi-label classification (one-vs-rest)",
        "mae": "MAE pretraining",
        "run": "how the run executes",
    }

    # -- data
    data: str = option(
        "digits",
        sources_help(),  # the registered sources
        group="data",
    )
    data_dir: str | None = option(
        None,
        "where a built-in source's files are (fashion-mnist: default "
        "/usr/share/datasets/fashion-mnist; mnist: required)",
        group="data",
        metavar="FOLDER",
        since=True,
    )
    image_column: str | None = option(
        None,
        "the image column of a Hugging Face dataset (default: its Image feature)",
        group="data",
        metavar="NAME",
        since=True,
    )
    label_column: str | None = option(
        None,
        "the label column of a Hugging Face dataset (default: its ClassLabel feature)",
        group="data",
        metavar="NAME",
        since=True,
    )
    val_fraction: float = option(
        VAL_FRACTION, "share of the data held out for validation", group="data", range=FRACTION
    )
    test_fraction: float = option(
        TEST_FRACTION, "share held out for testing (data without a test set)", group="data",
        range=FRACTION,
    )  # fmt: skip
    train_limit: int | None = option(
        None,
        "train on a seeded random subset of N training images (a small-label regime); "
        "validation and test are unchanged",
        group="data",
        metavar="N",
        range=AT_LEAST_ONE,
        since=True,
    )
    strict: bool = option(
        False,
        "stop at the first unreadable image file instead of skipping it (skipped files are "
        "counted and reported)",
        group="data",
    )
    recipe: str | None = option(
        None,
        "a named preset of the options below (default: the data's own, else 'small' for "
        "images of at most 16 px and 'deit' otherwise)",
        group="data",
        since=True,
    )
    seed: int = option(0, "seed of the split, the initialisation and the batches", group="data",
                       range=NON_NEGATIVE)  # fmt: skip

    # -- model
    model: str | None = option(
        None,
        "a registered model (`vitkit models`; default: the source's preset, else one sized to "
        "its images, logged); with pretrained weights, their architecture, checked against "
        "them (default: theirs)",
        group="model",
        metavar="NAME",
        reads_as="arch",  # the library's name where weights are read (hints name --model)
    )
    model_opts: dict[str, Any] = option(
        {},
        "an option of the model's architecture (`vitkit models NAME --options`), e.g. depth=6 "
        "or depths=2,2,6,2 (repeatable; num_classes comes from the data)",
        group="model",
        flag="model-opt",
        of=SharedModelOptions,
    )

    # -- optimisation
    epochs: int = option(
        100,
        "passes over the training data (--resume may raise it)",
        range=AT_LEAST_ONE,
        grows=True,
        group="optim",
    )
    batch_size: int = option(64, "images per step, per process", range=AT_LEAST_ONE,
                             group="optim")  # fmt: skip
    lr: float | None = option(
        None, "peak learning rate (default: blr * effective batch / 512)", range=POSITIVE,
        group="optim",
    )  # fmt: skip
    blr: float = option(5e-4, "base learning rate for a batch of 512", range=POSITIVE,
                        group="optim")  # fmt: skip
    min_lr: float = option(1e-5, "learning rate at the end of the cosine", range=NON_NEGATIVE,
                           group="optim")  # fmt: skip
    warmup_lr: float = option(
        1e-6, "learning rate at the start of the warmup", range=NON_NEGATIVE, since=True,
        group="optim",
    )  # fmt: skip
    warmup_epochs: float = option(5.0, "linear warmup length", range=OFF_AT_ZERO, group="optim")
    weight_decay: float = option(0.05, "AdamW weight decay", range=OFF_AT_ZERO, group="optim")
    clip_grad: float | None = option(None, "max gradient norm (default: no clipping)",
                                     range=POSITIVE, group="optim")  # fmt: skip
    accum_steps: int = option(1, "batches per optimiser step", range=AT_LEAST_ONE, group="optim")

    # -- augmentation
    crop_scale: tuple[float, float] | None = option(
        (0.08, 1.0),
        "RandomResizedCrop area range",
        metavar=("MIN", "MAX"),
        none_flag=("no-crop", "resize instead of random crops"),
        group="augment",
    )
    hflip: float = option(0.5, "horizontal flip probability", range=PROBABILITY, group="augment")

    # -- how the run executes
    amp: str | None = option(
        None, "mixed precision (default: bf16 on GPU, none on CPU)", choices=AMP_MODES,
        group="run",
    )  # fmt: skip
    compile: bool = option(False, "torch.compile the model", group="run")
    fsdp: bool = option(
        False,
        "shard parameters, gradients and optimiser state across processes (FSDP2: each block, "
        "then the model); the state is saved sharded and resumes on any number of processes",
        group="run",
    )
    grad_ckpt: bool = option(
        False,
        "gradient checkpointing: recompute each block in the backward pass (the same "
        "gradients, far less activation memory, about a third more compute)",
        group="run",
        runtime=True,
    )
    threads: int | None = option(
        None,
        "CPU threads for torch (the small recipe: 1, faster for a tiny model; else torch's)",
        group="run",
        range=Range(1, 1024),
        runtime=True,
    )
    save_every: int = option(
        0,
        "also save the state every STEPS optimiser steps, so that a crash loses at most that "
        "much (0: at epoch ends only)",
        group="run",
        metavar="STEPS",
        range=Range(0, note="(0: at epoch ends only)"),
        runtime=True,
    )
    device: str | None = option(
        None, "cpu, cuda, cuda:1 (default: cuda when available)", group="run", runtime=True
    )
    workers: int = option(0, "data loader processes", group="run", range=NON_NEGATIVE,
                          runtime=True)  # fmt: skip
    loggers: tuple[str, ...] = option(
        (),
        "also write each epoch's numbers there: tensorboard (scalars in <out>/tensorboard; "
        "needs the tensorboard package) (default: metrics.jsonl and metrics.csv only)",
        flag="log",
        choices=LOGGERS,
        group="run",
        runtime=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # each field's type, range and choices
        if not is_timm_name(self.model):  # a timm CNN's options are timm's to check
            opts = check_model_options(self.model, self.model_opts)
            object.__setattr__(self, "model_opts", opts)
        if self.model_opts.get("in_chans", 1) not in (1, 3):
            raise ValueError(
                f"in_chans {self.model_opts['in_chans']}: training reads images with 1 or 3 "
                "channels; choose one of them"
            )
        if self.crop_scale is not None and not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(
                f"crop_scale (MIN, MAX) needs 0 < MIN <= MAX <= 1, got {self.crop_scale}"
            )
        if self.lr is not None and self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr:g} is above lr {self.lr:g}; the cosine decays from lr down "
                "to min_lr, so choose min_lr <= lr"
            )
        if self.val_fraction + self.test_fraction > 1:
            raise ValueError(
                f"split fractions {[self.val_fraction, self.test_fraction]} add up to more than 1"
            )
        if self.data_dir and self.data not in SOURCES:
            raise ValueError(
                f"data_dir names the folder of a built-in source ({', '.join(SOURCES)}); "
                f"{self.data!r} is not one: pass the path as data instead"
            )
        self.amp_on(self.resolved_device())  # fp16 without CUDA fails here
        if self.fsdp:
            self._check_fsdp()

    def _check_fsdp(self) -> None:
        """The options sharded training cannot honour, each refused in one line; a torch
        without FSDP2 too."""
        from .sharded import require_fsdp

        require_fsdp()
        refused = {
            "compile": self.compile,
            "amp fp16": self.amp == "fp16",  # bf16 needs no loss scaler
            "a timm CNN model": is_timm_name(self.model),
            "ema": getattr(self, "ema", None),
            "a teacher": getattr(self, "teacher", None),
        }
        for what, given in refused.items():
            if given:
                raise ValueError(
                    f"fsdp cannot be combined with {what} (it shards each ViT block and trains "
                    "in fp32 or bf16 without torch.compile); drop one of them"
                )

    # -- derived values

    def resolved_device(self) -> str:
        """`device`, or cuda when available and cpu otherwise."""
        return resolve_device(self.device)

    def amp_on(self, device: str | torch.device) -> str:
        """`amp` on `device`: by default bf16 on a GPU and none on the CPU; fp16 needs CUDA."""
        on_cuda = torch.device(device).type == "cuda"
        if self.amp == "fp16" and not on_cuda:
            raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
        if self.amp is not None:
            return self.amp
        return "bf16" if on_cuda else "none"

    def peak_lr(self, world_size: int = 1) -> float:
        """The peak learning rate: `lr`, else `blr` scaled by the effective batch / 512."""
        if self.lr is not None:
            return self.lr
        return self.blr * self.batch_size * self.accum_steps * world_size / 512

    def data_spec(self) -> str:
        """The data as `load_data` takes it ('fashion-mnist:FOLDER' with `data_dir`)."""
        return data_spec(self.data, self.data_dir)

    @classmethod
    def upgrade_settings(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The settings of a run from before the model options were `ViTConfig`'s flags: its
        `drop_path`, `img_size` and `in_chans` become model options (under those it set by
        name, as the run built its model), and the other job's options are dropped (both jobs
        had one config then, and each ignored the other's options)."""
        if "drop_path" not in values or not isinstance(values.get("model_opts", {}), dict):
            return values
        values = dict(values)
        opts = dict(values.get("model_opts", {}))
        rate = values.pop("drop_path")
        if rate:  # 0 set nothing: the model's own rate
            opts.setdefault("drop_path_rate", rate)
        for name in ("img_size", "in_chans"):
            if values.get(name) is not None:
                opts.setdefault(name, values[name])
        own = option_names(cls)
        return {**{k: v for k, v in values.items() if k in own}, "model_opts": opts}


@dataclass(frozen=True, kw_only=True)
class TrainConfig(JobConfig):
    """A classifier's training run (`vitkit train`): the shared options, label-mixing
    augmentation and EMA, fine-tuning of pretrained weights and distillation."""

    # -- augmentation and regularisation
    aa: str = option(
        "rand-m9-mstd0.5-inc1",
        "RandAugment (timm grammar), e.g. rand-m9-mstd0.5-inc1 (DeiT), or none",
        group="augment",
    )
    reprob: float = option(0.25, "random erasing probability", range=PROBABILITY,
                           group="augment")  # fmt: skip
    mixup: float = option(0.8, "Mixup alpha", range=OFF_AT_ZERO, group="augment")
    cutmix: float = option(1.0, "CutMix alpha", range=OFF_AT_ZERO, group="augment")
    mix_prob: float = option(1.0, "probability of mixing a batch", range=PROBABILITY,
                             group="augment")  # fmt: skip
    switch_prob: float = option(
        0.5, "probability of CutMix rather than Mixup when both are on", range=PROBABILITY,
        since=True, group="augment",
    )  # fmt: skip
    smoothing: float = option(0.1, "label smoothing", range=FRACTION, group="augment")
    ema: float | None = option(
        None, "keep an EMA of the weights with this decay", metavar="DECAY", range=FRACTION,
        group="augment",
    )  # fmt: skip

    # -- multi-label classification
    multi_label: bool = option(
        False,
        "one-vs-rest: a sigmoid per class, for images of several classes (on for a file list "
        "with several labels per image)",
        group="multilabel",
        since=True,
    )
    multi_label_loss: str = option(
        "bce",
        "binary cross-entropy, or asymmetric loss (Ridnik et al. 2021, as timm's)",
        choices=MULTI_LABEL_LOSSES,
        group="multilabel",
        since=True,
    )
    threshold: float = option(
        0.5,
        "a class is a label when its sigmoid reaches this (recorded for eval, predict, serve)",
        range=PROBABILITY,
        group="multilabel",
        since=True,
    )

    # -- fine-tuning
    pretrained: str | None = option(
        None,
        "fine-tune these weights (any format vitkit convert reads, or a Hub id in the local "
        "Hugging Face cache: timm/NAME, hf-hub:ORG/NAME; the architecture is theirs)",
        group="finetune",
        metavar="PATH",
    )
    pos_resample: str = option(
        "timm",
        "how --pretrained resamples the position grid to another size: as timm (bicubic, "
        "antialiased), hf or torchvision do",
        group="finetune",
        choices=("timm", "hf", "torchvision"),
        since=True,
    )
    layer_decay: float | None = option(
        None,
        "layer-wise learning-rate decay (BEiT, MAE): the head learns at lr, block i of D at "
        "lr * DECAY ** (D - i), the embedding at lr * DECAY ** (D + 1), as timm's "
        "param_groups_layer_decay (default: off, one rate)",
        group="finetune",
        metavar="DECAY",
        range=Range(0, 1, low_open=True),
        since=True,
    )
    freeze: int | None = option(
        None,
        "freeze the embedding (patch projection, class / distillation token, positions) and "
        "the first N blocks: not trained, not in the optimiser; 0 freezes the embedding only",
        group="finetune",
        metavar="N",
        range=NON_NEGATIVE,
        since=True,
    )
    linear_probe: bool = option(
        False,
        "train only the head on the frozen encoder, which stays in eval mode (no dropout or "
        "drop-path), as MAE's linear probing",
        group="finetune",
        since=True,
    )

    # -- distillation
    teacher: str | None = option(
        None,
        "the classifier to distil from: weights of a ViT (any format --pretrained reads), an "
        ".onnx file, or timm:NAME / torchvision:NAME (a CNN such as timm:resnet18)",
        group="distill",
        metavar="SOURCE",
    )
    teacher_weights: str | None = option(
        None,
        "the state-dict file of a timm:NAME / torchvision:NAME teacher",
        group="distill",
        metavar="FILE",
        since=True,
    )
    distill: str = option("none", "distillation through the distillation token",
                          group="distill", choices=DISTILL_MODES)  # fmt: skip
    distill_alpha: float = option(0.5, "weight of the distillation term", group="distill",
                                  range=Range(0, 1))  # fmt: skip
    distill_tau: float = option(1.0, "soft distillation temperature", group="distill",
                                range=POSITIVE)  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.linear_probe and self.freeze is not None:
            raise ValueError(
                "linear_probe already freezes everything but the head; drop freeze, or drop "
                "linear_probe to fine-tune the blocks after the frozen ones"
            )
        if self.linear_probe and self.distill != "none":
            raise ValueError(
                "linear_probe freezes the distillation token, so distillation cannot train it; "
                "use distill='none', or fine-tune without linear_probe"
            )
        parse_rand_augment(self.aa)  # a bad spec fails here, before any work


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(JobConfig):
    """MAE self-supervised pretraining (`vitkit pretrain`, He et al. 2022): the shared
    options and the masked autoencoder's. Its augmentation is MAE's own: crops and flips."""

    mask_ratio: float = option(
        0.75,
        "share of the patches MAE hides per image",
        group="mae",
        range=Range(0, 1, low_open=True, high_open=True),
    )
    decoder_dim: int = option(128, "MAE decoder width (the paper's: 512)", group="mae",
                              range=Range(4, 65536))  # fmt: skip
    decoder_depth: int = option(2, "MAE decoder blocks (the paper's: 8)", group="mae",
                                range=Range(1, 64))  # fmt: skip
    decoder_heads: int = option(4, "MAE decoder attention heads (the paper's: 16)", group="mae",
                                range=AT_LEAST_ONE)  # fmt: skip
    norm_pix: bool = option(True, "MAE predicts pixels normalised per patch", group="mae")


def data_spec(data: str, data_dir: str | None) -> str:
    """'fashion-mnist' with a folder -> 'fashion-mnist:FOLDER', as `load_data` takes it."""
    return f"{data}:{data_dir}" if data_dir else data


def resolve_device(name: str | None) -> str:
    """`name` checked (a ValueError with the fix for a device torch does not know or this
    machine lacks), or cuda when available and cpu otherwise."""
    if not name:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    found = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and (device.index or 0) >= found:
        fix = "--device cpu" if not found else f"cuda:0 to cuda:{found - 1}"
        raise ValueError(f"device {name}: this machine has {found} CUDA device(s); use {fix}")
    return name
