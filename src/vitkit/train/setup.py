"""What a run builds before it trains, and the whole run: `training_setup` and `run_training`.

`training_setup(config)` loads and splits the data, builds the model (seeded; pretrained
weights through `load_pretrained`, the same code as the API) and the transforms.
`run_training` adds the run folder (`prepare_out`, then `clear_out` under the folder's run
lock: one writer per folder), the record of the run (`config.json`), `fit`, and the test of
the best weights (`test.json`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import Splits, Subset, Transformed, build_transform, load_data
from ..data.data_config import DataConfig
from ..files import atomic_write
from ..model import VisionTransformer, ViTConfig, create_model, get_config, to_2tuple
from ..model.onednn_support import native_bf16
from ..model.vit.onednn import MIN_FEATURES
from ..weights import inspect, load_pretrained, load_state_dict
from ..weights.cnn import create_timm_classifier, is_timm_name
from ..weights.families import check_arch
from .config import JobConfig, TrainConfig
from .distributed import barrier, make_loader, world
from .fit import Progress, fit
from .logs import check_loggers
from .loop import evaluate
from .run_folder import BEST_FILE, RUN_FILES, TEST_FILE, RunOutcome, open_run, write_record
from .sharded import load_full
from .tasks import ClassificationTask
from .teacher import load_teacher

log = logging.getLogger(__name__)


@dataclass
class TrainingSetup:
    """What `vitkit train` builds before it trains: the config, the data splits, the model
    (seeded, on the CPU) and the transformed train / val / test datasets."""

    config: JobConfig
    splits: Splits
    model: VisionTransformer
    train_set: Dataset
    val_set: Dataset
    test_set: Dataset


def training_setup(config: JobConfig) -> TrainingSetup:
    """The data, model and datasets of a run (benchmarks and notebooks call it too; resolve a
    config with the recipes first: `recipes.resolve_config({"data": "fashion-mnist"})`)."""
    if config.model is None and not _pretrained(config):
        raise ValueError("training_setup needs a model name; build the config with resolve_config")
    torch.manual_seed(config.seed)
    cnn = config.model is not None and is_timm_name(config.model)
    base = get_config(config.model if config.model and not cnn else "vit_base_patch16_224")
    opts = config.model_opts
    # Image files decode to the model's channels; pretrained weights and CNNs take RGB unless
    # the in_chans option says otherwise.
    default_chans = 3 if _pretrained(config) or cnn else base.in_chans
    splits = load_data(
        config.data_spec(),
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        seed=config.seed,
        in_chans=opts.get("in_chans", default_chans),
        img_size=to_2tuple(opts.get("img_size", base.img_size), "img_size"),
        skip_corrupt=not config.strict,
    )
    if config.train_limit and config.train_limit < len(splits.train):
        order = torch.randperm(
            len(splits.train), generator=torch.Generator().manual_seed(config.seed)
        )
        keep = sorted(order[: config.train_limit].tolist())
        splits = dataclasses.replace(splits, train=Subset(splits.train, keep))
    model = build_model(config, splits)
    if _pretrained(config):  # the weights' own normalisation, as they were trained with
        splits = dataclasses.replace(splits, mean=model.data_config.mean, std=model.data_config.std)
    train_tf, eval_tf = transforms(config, splits, model.data_config)
    return TrainingSetup(
        config=config,
        splits=splits,
        model=model,
        train_set=Transformed(splits.train, train_tf),
        val_set=Transformed(splits.val, eval_tf),
        test_set=Transformed(splits.test, eval_tf),
    )


def _pretrained(config: JobConfig) -> str | None:
    """The weights a classifier's run fine-tunes (`TrainConfig.pretrained`); MAE starts anew."""
    return config.pretrained if isinstance(config, TrainConfig) else None


def build_model(config: JobConfig, splits: Splits) -> VisionTransformer:
    """The registered model with the config's model options, sized to the data; or, with
    `config.pretrained`, the architecture of those weights (any format `load_pretrained`
    reads), with a new head for the data's classes, the position grid resampled to the
    `img_size` option and the other model options applied. `model.data_config` says how its
    inputs are prepared."""
    options = dict(config.model_opts)
    if isinstance(config, TrainConfig) and config.distill != "none":
        options.setdefault("distilled", True)
    if config.model is not None and is_timm_name(config.model):
        return _cnn_model(config, splits, options)
    if _pretrained(config):
        return _pretrained_model(config, splits, options)
    if options.setdefault("in_chans", splits.in_chans) != splits.in_chans:
        raise ValueError(
            f"{splits.name} holds {splits.in_chans}-channel images; the in_chans option "
            f"({options['in_chans']}) says how image files are read: drop it for this data"
        )
    options.setdefault("num_classes", splits.num_classes)
    if splits.img_size is not None:
        options.setdefault("img_size", tuple(splits.img_size))
    model = create_model(config.model, **options)
    height, width = model.patch_embed.img_size
    model.data_config = DataConfig(
        input_size=(model.config.in_chans, height, width),
        mean=splits.mean,
        std=splits.std,
        interpolation="bilinear",
        crop_mode="squash",
    )
    return model


def _cnn_model(config: JobConfig, splits: Splits, options: dict[str, Any]) -> nn.Module:
    """A timm CNN (`--model timm:NAME`) for the data: a distillation teacher to train. The
    `img_size` and `in_chans` options size the data; the others go to timm."""
    if _pretrained(config):
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
        input_size=(splits.in_chans, *size), mean=splits.mean, std=splits.std,
        interpolation="bilinear", crop_mode="squash",
    )  # fmt: skip
    return model


def _pretrained_model(
    config: TrainConfig, splits: Splits, options: dict[str, Any]
) -> VisionTransformer:
    """The weights of `config.pretrained` for the data; the `in_chans` option says how the
    images were read (the weights decide the model's channels). A `model` named beside them
    is their architecture: what the weights do not record comes from it, and a name whose
    sizes differ from the weights' is refused (`ArchMismatchError`), never ignored."""
    options.pop("in_chans", None)
    img_size = options.pop("img_size", None)
    if config.model is not None:
        info = inspect(config.pretrained, arch=config.model, overrides=options)
        if isinstance(info.config, ViTConfig):  # a Swin's arch is checked when read
            check_arch(info.config, config.model, options)
    model = load_pretrained(
        config.pretrained,
        num_classes=splits.num_classes,
        img_size=img_size,
        pos_resample=config.pos_resample,
        arch=config.model,
        **options,
    )
    if model.config.in_chans != splits.in_chans:
        raise ValueError(
            f"{config.pretrained} takes {model.config.in_chans}-channel images but the data has "
            f"{splits.in_chans}; use data with {model.config.in_chans} channels"
            + (" (--in-chans for image folders)" if splits.img_size is None else "")
        )
    return model.train()


def transforms(config: JobConfig, splits: Splits, data_config: DataConfig) -> tuple[Any, Any]:
    """The training and evaluation pipelines of the config for the model's data config: its
    input size and filter; evaluation also its crop (`crop_pct`, `crop_mode`), as timm's
    `create_transform` from a model's data config. Normalised with the splits' mean and std.
    A classifier's training adds RandAugment and random erasing; MAE's has crops and flips
    only."""
    common = {
        "img_size": data_config.img_size,
        "mean": splits.mean,
        "std": splits.std,
        "interpolation": data_config.interpolation,
    }
    classifier = isinstance(config, TrainConfig)
    train = build_transform(
        True,
        crop_scale=config.crop_scale,
        hflip=config.hflip,
        rand_augment=config.aa if classifier else "none",
        reprob=config.reprob if classifier else 0.0,
        **common,
    )
    eval_tf = build_transform(
        False, crop_pct=data_config.crop_pct, crop_mode=data_config.crop_mode, **common
    )
    return train, eval_tf


def run_training(
    config: TrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunOutcome:
    """A whole run: the folder, the set-up, `fit`, then the best weights on the test split;
    `RunOutcome.summary()` is its machine-readable summary. The epoch rows go to
    metrics.jsonl, metrics.csv and the config's `loggers` (TensorBoard).

    Args:
        config: the resolved config (`recipes.resolve_config`); on `resume` the run's saved
            one (`run_folder.read_run_config`) with the options to change, which must be
            those a resume may change (`run_folder.resumed_config`).
        out: the run folder.
        resume: continue the run in `out`.
        overwrite: replace the run in `out`.
        progress: a progress-bar factory for `fit`.
    """
    check_loggers(config.loggers)  # a missing package is said before anything runs
    with open_run(
        config, out, resume=resume, overwrite=overwrite, task=ClassificationTask.name,
        files=RUN_FILES,
    ) as config:  # fmt: skip
        return _train_and_test(config, out, resume=resume, progress=progress)


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


def _train_and_test(
    config: TrainConfig,
    out: Path,
    *,
    resume: bool,
    progress: Progress | None,
) -> RunOutcome:
    device = config.device
    rank, world_size = world()
    if config.threads:
        torch.set_num_threads(config.threads)
    setup = training_setup(config)
    splits = setup.splits
    model = setup.model.to(device)
    torch.manual_seed(config.seed + rank)
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
    if rank == 0:  # on --resume too: the settings it took (more epochs) are the run's now
        write_record(out, config, model, meta, world_size, task=ClassificationTask.name)
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
        device,
        config.peak_lr(world_size),
        config.epochs,
        "epoch" if config.epochs == 1 else "epochs",
        out,
    )
    if bf16_would_help(config, model, device):
        log.info(
            "this CPU multiplies bf16 natively (AMX / AVX-512 BF16): --amp bf16 trained "
            "ViT-S/16 3x and ViT-B/16 5x faster than fp32 here (docs/results.md)"
        )
    task = ClassificationTask(model, config, teacher=teacher, meta=meta)
    result = fit(task, setup.train_set, setup.val_set, config, out_dir=out, resume=resume,
                 progress=progress, loggers=config.loggers)  # fmt: skip
    if result.corrupt_images:
        log.warning("skipped %d unreadable training image(s)", result.corrupt_images)
    if result.interrupted:
        return RunOutcome(result=result, test=None, out=out, rank=rank, task=task.name)
    barrier()
    if (out / BEST_FILE).is_file():
        load_full(model, load_state_dict(out / BEST_FILE))
    loader = make_loader(setup.test_set, config.batch_size, train=False)
    test = evaluate(model, loader, device=device, amp=config.amp_on(device))
    if rank == 0:
        row = {
            "test_loss": test["loss"],
            "test_acc1": test["acc1"],
            "test_acc5": test["acc5"],
            "best_epoch": result.best_epoch,
        }
        text = json.dumps(row) + "\n"
        atomic_write(out / TEST_FILE, lambda f: f.write(text), mode="w")
    return RunOutcome(result=result, test=test, out=out, rank=rank, task=task.name)
