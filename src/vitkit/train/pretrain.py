"""`vitkit pretrain`: MAE self-supervised pretraining on the training images (labels unused),
the small-data remedy the MAE paper (He et al. 2022) offers when there are no pretrained
weights. The loop is the training engine's (`fit` with `tasks.MaeTask`): AMP, gradient
accumulation, DDP under torchrun, `save_every`, the stop on SIGINT / SIGTERM, the run lock and
`state.pt` work as they do for `vitkit train`.

The run folder holds `config.json` (the settings), `metrics.jsonl` (train and validation MAE
loss per epoch), `state.pt` (`--resume` continues from it), `encoder.safetensors` (a plain
vitkit ViT with its data config, what `vitkit train --pretrained` fine-tunes),
`reconstructions.png` (originals, what the encoder saw, and the reconstruction, redrawn every
epoch) and `curves.png`. The augmentation is MAE's: random resized crops and flips only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..data import Splits, Subset, Transformed, build_transform, load_data
from ..data.data_config import DataConfig
from ..model import create_model, get_config, to_2tuple
from ..model.mae import MaskedAutoencoder
from ..weights.cnn import is_timm_name
from .distributed import world
from .fit import Progress, fit
from .logs import check_loggers
from .run_folder import PRETRAIN_FILES, RunOutcome, open_run, write_record
from .tasks.mae import MaeTask

log = logging.getLogger(__name__)

_FINE_TUNING = ("layer_decay", "freeze", "linear_probe", "distill", "teacher", "pretrained")


@dataclass
class PretrainingSetup:
    """What `vitkit pretrain` builds before it trains: the splits, the MAE around a fresh
    encoder (seeded, on the CPU) and the train / val datasets with MAE's augmentation."""

    splits: Splits
    mae: MaskedAutoencoder
    train_set: Dataset
    val_set: Dataset


def run_pretraining(
    config: Any,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    loggers: Sequence[str] = (),
) -> RunOutcome:
    """Pretrain `config`'s model as an MAE encoder on its training images; returns how the
    run ended (`result.history`: the rows of `metrics.jsonl`; `summary()`).

    Args:
        config: the run's settings (the MAE options `mask_ratio`, `decoder_*`, `norm_pix`).
        out: the run folder.
        resume: continue from `out/state.pt`.
        overwrite: replace a run in `out` (its files only).
        progress: wraps the batch loop (a progress bar), or None.
        loggers: where the epoch rows go besides metrics.jsonl and metrics.csv
            ('tensorboard').
    """
    _refuse_fine_tuning(config)
    check_loggers(loggers)
    with open_run(
        config, out, resume=resume, overwrite=overwrite, task=MaeTask.name, files=PRETRAIN_FILES
    ) as config:
        return _pretrain(config, out, resume=resume, progress=progress, loggers=loggers)


def _pretrain(
    config: Any, out: Path, *, resume: bool, progress: Progress | None, loggers: Sequence[str]
) -> RunOutcome:
    rank, world_size = world()
    if config.threads:
        torch.set_num_threads(config.threads)
    setup = pretraining_setup(config)
    mae = setup.mae.to(config.device)
    torch.manual_seed(config.seed + rank)  # each rank draws its own masks
    splits = setup.splits
    meta = {"data": config.data_spec(), "model_name": config.model, "mean": list(splits.mean),
            "std": list(splits.std)}  # fmt: skip
    if rank == 0:
        write_record(out, config, mae.encoder, meta, world_size, task=MaeTask.name)
    log.info(
        "MAE pretraining of %s on %s: %d images, mask ratio %.2f, %d epochs -> %s",
        config.model, splits.name, len(setup.train_set), config.mask_ratio, config.epochs, out,
    )  # fmt: skip
    sample = torch.stack([setup.val_set[i][0] for i in range(min(4, len(setup.val_set)))])
    task = MaeTask(mae, config, sample=sample, mean=splits.mean, std=splits.std)
    result = fit(task, setup.train_set, setup.val_set, config, out_dir=out, resume=resume,
                 progress=progress, loggers=loggers)  # fmt: skip
    if world_size > 1:
        torch.distributed.destroy_process_group()
    return RunOutcome(result=result, test=None, out=out, rank=rank, task=task.name)


def pretraining_setup(config: Any) -> PretrainingSetup:
    """The data, the MAE and the datasets of a pretraining run: the encoder is the config's
    model sized to the data (its head removed), the augmentation random resized crops
    (`crop_scale`) and flips (`hflip`) only."""
    torch.manual_seed(config.seed)
    if is_timm_name(config.model):
        raise ValueError(f"MAE pretrains a ViT encoder; {config.model} is a CNN")
    base = get_config(config.model)
    in_chans = config.in_chans or config.model_opts.get("in_chans", base.in_chans)
    splits = load_data(
        config.data_spec(),
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        seed=config.seed,
        in_chans=in_chans,
        img_size=config.img_size or to_2tuple(base.img_size, "img_size"),
        skip_corrupt=not config.strict,
    )
    if config.train_limit and config.train_limit < len(splits.train):
        order = torch.randperm(
            len(splits.train), generator=torch.Generator().manual_seed(config.seed)
        )
        keep = sorted(order[: config.train_limit].tolist())
        splits = dataclasses.replace(splits, train=Subset(splits.train, keep))
    encoder = _encoder(config, splits)
    mae = MaskedAutoencoder(
        encoder,
        mask_ratio=config.mask_ratio,
        decoder_dim=config.decoder_dim,
        decoder_depth=config.decoder_depth,
        decoder_heads=config.decoder_heads,
        norm_pix_loss=config.norm_pix,
    )
    common = {"img_size": encoder.data_config.img_size, "mean": splits.mean, "std": splits.std,
              "interpolation": encoder.data_config.interpolation}  # fmt: skip
    train_tf = build_transform(True, crop_scale=config.crop_scale, hflip=config.hflip,
                               rand_augment="none", reprob=0.0, **common)  # fmt: skip
    eval_tf = build_transform(False, **common)
    return PretrainingSetup(
        splits=splits,
        mae=mae,
        train_set=Transformed(splits.train, train_tf),
        val_set=Transformed(splits.val, eval_tf),
    )


def _encoder(config: Any, splits: Splits):
    """The config's model for the data's channels and size, with drop-path, without a head;
    its data config says how its inputs are prepared (as `setup.build_model`'s)."""
    options = dict(config.model_opts)
    if config.drop_path:
        options.setdefault("drop_path_rate", config.drop_path)
    options.setdefault("num_classes", splits.num_classes)
    options.setdefault("in_chans", splits.in_chans)
    size = config.img_size or splits.img_size
    if size is not None:
        options.setdefault("img_size", tuple(size))
    encoder = create_model(config.model, **options)
    encoder.reset_classifier(0)
    height, width = encoder.patch_embed.img_size
    encoder.data_config = DataConfig(
        input_size=(encoder.config.in_chans, height, width),
        mean=splits.mean,
        std=splits.std,
        interpolation="bilinear",
        crop_mode="squash",
    )
    return encoder


def _refuse_fine_tuning(config: Any) -> None:
    """Options that tune or distil a classifier have no meaning here (a config that has
    them: the one schema of both jobs)."""
    given = [
        name for name in _FINE_TUNING if getattr(config, name, None) not in (None, False, "none")
    ]
    if given:
        raise ValueError(
            f"{', '.join(given)} tune or distil a classifier; MAE pretraining trains the whole "
            "encoder without labels: drop them here and use them in fine-tuning "
            "(vitkit train --pretrained)"
        )
