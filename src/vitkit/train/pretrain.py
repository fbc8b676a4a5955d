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

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..data import Splits
from ..model.vit.mae import MaskedAutoencoder
from ..weights.cnn import is_timm_name
from .config import PretrainConfig
from .distributed import world
from .fit import Progress, fit
from .logs import check_loggers
from .run_folder import PRETRAIN_FILES, RunOutcome, open_run, write_record
from .setup import training_setup
from .tasks.mae import MaeTask

log = logging.getLogger(__name__)


@dataclass
class PretrainingSetup:
    """What `vitkit pretrain` builds before it trains: the splits, the MAE around a fresh
    encoder (seeded, on the CPU) and the train / val datasets with MAE's augmentation."""

    splits: Splits
    mae: MaskedAutoencoder
    train_set: Dataset
    val_set: Dataset


def run_pretraining(
    config: PretrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunOutcome:
    """Pretrain `config`'s model as an MAE encoder on its training images; returns how the
    run ended (`result.history`: the rows of `metrics.jsonl`; `summary()`).

    Args:
        config: the run's settings (the MAE options `mask_ratio`, `decoder_*`, `norm_pix`).
        out: the run folder.
        resume: continue from `out/state.pt`.
        overwrite: replace a run in `out` (its files only).
        progress: wraps the batch loop (a progress bar), or None.
    """
    check_loggers(config.loggers)  # a missing package is said before anything runs
    with open_run(
        config, out, resume=resume, overwrite=overwrite, task=MaeTask.name, files=PRETRAIN_FILES
    ) as config:
        return _pretrain(config, out, resume=resume, progress=progress)


def _pretrain(
    config: PretrainConfig,
    out: Path,
    *,
    resume: bool,
    progress: Progress | None,
) -> RunOutcome:
    if not isinstance(config, PretrainConfig):
        raise TypeError(
            f"run_pretraining takes a PretrainConfig, got {type(config).__name__}; build it "
            "with resolve_config(values, job=PretrainConfig)"
        )
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
        "MAE pretraining of %s on %s: %d images, mask ratio %.2f, %d %s -> %s",
        config.model, splits.name, len(setup.train_set), config.mask_ratio, config.epochs,
        "epoch" if config.epochs == 1 else "epochs", out,
    )  # fmt: skip
    sample = torch.stack([setup.val_set[i][0] for i in range(min(4, len(setup.val_set)))])
    task = MaeTask(mae, config, sample=sample, mean=splits.mean, std=splits.std)
    result = fit(task, setup.train_set, setup.val_set, config, out_dir=out, resume=resume,
                 progress=progress, loggers=config.loggers)  # fmt: skip
    return RunOutcome(result=result, test=None, out=out, rank=rank, task=task.name)


def pretraining_setup(config: PretrainConfig) -> PretrainingSetup:
    """The data, the MAE and the datasets of a pretraining run: the encoder is the config's
    model sized to the data (`training_setup`, its head removed), the augmentation random
    resized crops (`crop_scale`) and flips (`hflip`) only."""
    if is_timm_name(config.model):
        raise ValueError(f"MAE pretrains a ViT encoder; {config.model} is a CNN")
    setup = training_setup(config)
    encoder = setup.model
    encoder.reset_classifier(0)
    mae = MaskedAutoencoder(
        encoder,
        mask_ratio=config.mask_ratio,
        decoder_dim=config.decoder_dim,
        decoder_depth=config.decoder_depth,
        decoder_heads=config.decoder_heads,
        norm_pix_loss=config.norm_pix,
    )
    return PretrainingSetup(
        splits=setup.splits, mae=mae, train_set=setup.train_set, val_set=setup.val_set
    )
