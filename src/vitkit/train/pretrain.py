"""`vitkit pretrain`: MAE self-supervised pretraining on the training images (labels unused),
the small-data remedy the MAE paper (He et al. 2022) offers when there are no pretrained
weights.

The run folder holds `config.json` (the settings), `metrics.jsonl` (loss per epoch),
`mae_state.pt` (encoder, decoder, optimiser, counters, RNG: `--resume` continues from it),
`encoder.safetensors` (a plain vitkit ViT with its data config, what `vitkit train
--pretrained` fine-tunes) and `reconstructions.png` (originals, what the encoder saw, and the
reconstruction, redrawn every epoch). One writer per folder (`lock.py`); every file is written
atomically. The optimiser is MAE's: AdamW with betas (0.9, 0.95), warmup then cosine.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write
from ..model.mae import MaskedAutoencoder, patchify, unpatchify
from ..weights import save
from .config import PretrainConfig
from .distributed import make_loader
from .fit import Progress
from .lock import run_lock
from .loop import Schedule, steps_per_epoch
from .optim import param_groups
from .setup import clear_out, prepare_out, training_setup

log = logging.getLogger(__name__)

STATE = "mae_state.pt"
ENCODER = "encoder.safetensors"
PICTURE = "reconstructions.png"
PRETRAIN_FILES = ("config.json", "metrics.jsonl", STATE, ENCODER, PICTURE)


def run_pretraining(
    config: PretrainConfig,
    out: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Pretrain `config`'s model as an MAE encoder on its training images; returns the
    per-epoch rows of `metrics.jsonl`.

    Args:
        config: the run's settings (the MAE options `mask_ratio`, `decoder_*`, `norm_pix`).
        out: the run folder.
        resume: continue from `out/mae_state.pt`.
        overwrite: replace a run in `out` (its files only).
        progress: wraps the batch loop (a progress bar), or None.
    """
    prepare_out(out, resume=resume, overwrite=overwrite, files=PRETRAIN_FILES, state=STATE)
    with run_lock(out):
        clear_out(out, overwrite=overwrite, files=PRETRAIN_FILES)
        return _pretrain(config, out, resume=resume, progress=progress)


def _pretrain(
    config: PretrainConfig, out: Path, *, resume: bool, progress: Progress | None
) -> list[dict[str, Any]]:
    if config.threads:
        torch.set_num_threads(config.threads)
    setup = training_setup(config)  # MAE's own augmentation: crops and flips, no label mixing
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
    loader = make_loader(setup.train_set, config.batch_size, train=True, seed=config.seed,
                         num_workers=config.workers)  # fmt: skip
    steps = steps_per_epoch(len(loader), 1)
    schedule = Schedule.of(config, config.peak_lr(), steps)
    optimizer = torch.optim.AdamW(
        param_groups(mae, config.weight_decay), lr=schedule(0), betas=(0.9, 0.95)
    )
    epoch, step, history = 0, 0, []
    if resume:
        saved = torch.load(out / STATE, map_location="cpu", weights_only=True)
        mae.load_state_dict(saved["mae"])
        optimizer.load_state_dict(saved["optimizer"])
        epoch, step = int(saved["epoch"]), int(saved["step"])
        history = [json.loads(row) for row in saved["history"]]
        torch.set_rng_state(saved["rng"])
        log.info("resuming the pretraining in %s at epoch %d", out, epoch + 1)
    settings = {k: v for k, v in config.to_dict().items() if k != "device"}
    _write_text(out / "config.json", json.dumps({"settings": settings}, indent=2) + "\n")
    sample = torch.stack([setup.val_set[i][0] for i in range(min(4, len(setup.val_set)))])
    log.info(
        "MAE pretraining of %s on %s: %d images, mask ratio %.2f, %d epochs -> %s",
        config.model, setup.splits.name, len(setup.train_set), config.mask_ratio,
        config.epochs, out,
    )  # fmt: skip
    while epoch < config.epochs:
        started, total, count = time.perf_counter(), 0.0, 0
        mae.train()
        batches = progress(loader, len(loader), f"epoch {epoch + 1}") if progress else loader
        for images, _ in batches:
            for group in optimizer.param_groups:
                group["lr"] = schedule(step)
            loss, _, _ = mae(images)
            if not math.isfinite(loss.item()):
                raise FloatingPointError(
                    f"MAE loss is {loss.item()} at step {step}; the state of epoch {epoch} is "
                    f"kept in {out / STATE}: use a lower --lr"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_grad:
                torch.nn.utils.clip_grad_norm_(mae.parameters(), config.clip_grad)
            optimizer.step()
            step += 1
            total += loss.item() * len(images)
            count += len(images)
        epoch += 1
        history.append({"epoch": epoch, "loss": total / max(count, 1), "lr": schedule(step),
                        "seconds": round(time.perf_counter() - started, 2)})  # fmt: skip
        log.info("epoch %d/%d  loss %.4f", epoch, config.epochs, history[-1]["loss"])
        _save(out, mae, optimizer, epoch, step, history)
        draw_reconstructions(mae, sample, setup.splits.mean, setup.splits.std, out / PICTURE)
    return history


def _save(out: Path, mae: MaskedAutoencoder, optimizer, epoch: int, step: int, history) -> None:
    save(mae.encoder, out / ENCODER)  # with its data config: what --pretrained fine-tunes
    payload = {
        "mae": mae.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "history": [json.dumps(row) for row in history],
        "rng": torch.get_rng_state(),
    }
    atomic_write(out / STATE, lambda f: torch.save(payload, f))
    _write_text(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in history))


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


@torch.no_grad()
def draw_reconstructions(
    mae: MaskedAutoencoder, images: torch.Tensor, mean, std, path: Path
) -> None:
    """A PNG: per image, the original, the visible patches, and the reconstruction (its
    visible patches pasted back, as the MAE paper's figures show)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mae.eval()
    _, pred, mask = mae(images, generator=torch.Generator().manual_seed(0))  # same masks
    patches = patchify(images, mae.patch_size)  # (B, N, pixels)
    if mae.norm_pix_loss:  # back to pixels with each patch's own statistics
        std_per_patch = (patches.var(-1, keepdim=True) + 1e-6) ** 0.5
        pred = pred * std_per_patch + patches.mean(-1, keepdim=True)
    keep = (1 - mask)[..., None]  # (B, N, 1): 1 at visible patches
    seen = unpatchify(patches * keep, mae.patch_size, mae.grid)
    rebuilt = unpatchify(patches * keep + pred * (1 - keep), mae.patch_size, mae.grid)
    to_pixels = _denormalise(mean, std)
    rows = len(images)
    figure, axes = plt.subplots(rows, 3, figsize=(6, 2 * rows), squeeze=False)
    columns = (("original", images), ("visible", seen), ("reconstruction", rebuilt))
    for i in range(rows):
        for j, (title, pictures) in enumerate(columns):
            grey = pictures.shape[1] == 1
            axes[i, j].imshow(to_pixels(pictures[i]), cmap="gray" if grey else None)
            axes[i, j].set_axis_off()
            if i == 0:
                axes[i, j].set_title(title, fontsize=9)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    plt.close(figure)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))


def _denormalise(mean, std):
    mean_t = torch.tensor(mean).view(-1, 1, 1)
    std_t = torch.tensor(std).view(-1, 1, 1)

    def convert(picture: torch.Tensor):
        pixels = (picture * std_t + mean_t).clamp(0, 1)
        return pixels.permute(1, 2, 0).squeeze(-1).numpy()

    return convert
