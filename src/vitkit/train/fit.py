"""The training loop `fit`: set up a `RunState`, then epochs of train, evaluate, save.

A run folder holds `model.safetensors` (best validation top-1), `last.safetensors`,
`ema.safetensors` (with an EMA), `metrics.jsonl`, `curves.png` and `state.pt`: everything to
continue (weights, optimiser, scaler, EMA, counters, history, RNG states), written atomically
after every epoch, on a stop and every `save_every` steps, and read with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import Mixup, corrupt_count
from ..files import DiskFullError
from ..model.precision import model_device
from ..plots import plot_curves
from ..weights.checkpoint import save
from .config import TrainConfig
from .distributed import ShardSampler, all_reduce, make_loader, world
from .logs import log_epoch, write_metrics
from .loop import (
    DistillForward,
    NonFiniteLossError,
    evaluate,
    steps_per_epoch,
    train_one_epoch,
)
from .optim import ModelEma, Schedule, build_optimizer, freeze_layers, swapped_weights
from .run_folder import (
    BEST_FILE,
    CURVES_FILE,
    EMA_FILE,
    LAST_FILE,
    METRICS_FILE,
    STATE_FILE,
    kept_files,
)
from .signals import StopFlag, stop_on_signals
from .state import EpochState, RunState, load_state, restore, save_state

log = logging.getLogger(__name__)

Progress = Callable[[Iterable, int, str], Any]


@dataclass
class FitResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    best_acc1: float = -1.0
    best_epoch: int = 0
    interrupted: bool = False
    corrupt_images: int = 0


def fit(
    model: nn.Module,
    train_set: Dataset,
    val_set: Dataset,
    config: TrainConfig,
    *,
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    resume: bool = False,
    teacher: nn.Module | None = None,
    stop: StopFlag | None = None,
    progress: Progress | None = None,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
) -> FitResult:
    """Train `model` for `config.epochs`, validating after each epoch.

    Rank 0 writes the run files into `out_dir` (when given); `resume=True` continues from its
    `state.pt`.

    Args:
        model: an unwrapped VisionTransformer on `config.device` (default: where it is).
        train_set, val_set: datasets yielding transformed (image, label).
        config: the optimisation recipe.
        out_dir: where the files go; None writes nothing (and cannot resume).
        meta: saved with each model file (class names, normalisation, ...).
        resume: continue from `out_dir/state.pt`.
        teacher: distillation teacher (with `config.distill` 'hard' or 'soft'), called on
            the student's batch as it is; `teacher.Teacher` prepares it for another model.
        stop: set it to stop cleanly; SIGINT / SIGTERM set it too.
        progress: `progress(iterable, total, description)` -> an iterable with an optional
            `set_postfix(**values)` (e.g. tqdm); None shows nothing.
        on_epoch_end: called with each epoch's metrics row.
    """
    _check_distillation(model, teacher, config)
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise ValueError("resume=True needs out_dir")
    train_loader = make_loader(
        train_set, config.batch_size, train=True, seed=config.seed, num_workers=config.workers
    )
    val_loader = make_loader(val_set, config.batch_size, train=False, num_workers=config.workers)
    state = new_run_state(
        model,
        config,
        batches_per_epoch=len(train_loader),
        teacher=teacher,
        out=out,
        meta=meta,
        stop=stop,
    )
    if resume:
        restore(state, load_state(out / STATE_FILE))
    state.trained = _wrapped(state)
    main = world()[0] == 0
    with stop_on_signals(state.stop), _explained_failures(state):
        if out is not None and main and not resume:
            out.mkdir(parents=True, exist_ok=True)
            save_state(state)  # a stop during the first epoch can still resume
        while state.epoch < config.epochs:
            row = run_epoch(state, train_loader, val_loader, progress)
            if row is None:  # stopped in the middle of the epoch
                break
            skipped = corrupt_count(train_set)
            if skipped:
                row["skipped_images"] = skipped
            if out is not None and main:
                write_metrics(out / METRICS_FILE, state.history)
                save_state(state)
            log_epoch(row, config.epochs)
            if on_epoch_end is not None:
                on_epoch_end(row)
            if state.stop:
                if state.epoch < config.epochs:
                    log.warning(
                        "stopped (%s) after epoch %d; state saved to %s",
                        state.stop.signal_name,
                        state.epoch,
                        out / STATE_FILE if out else "nowhere",
                    )
                break
        if out is not None and main and state.history:
            plot_curves(state.history, out / CURVES_FILE)
    return FitResult(
        history=state.history,
        best_acc1=state.best_acc1,
        best_epoch=state.best_epoch,
        interrupted=state.epoch < config.epochs,
        corrupt_images=corrupt_count(train_set),
    )


def new_run_state(
    model: nn.Module,
    config: TrainConfig,
    *,
    batches_per_epoch: int,
    teacher: nn.Module | None = None,
    out: Path | None = None,
    meta: dict[str, Any] | None = None,
    stop: StopFlag | None = None,
) -> RunState:
    """A run at its start: optimiser, schedule, mixing, scaler and EMA for `model`."""
    device = torch.device(config.device) if config.device else model_device(model)
    amp = config.amp_on(device)
    lr = config.peak_lr(world()[1])
    steps = steps_per_epoch(batches_per_epoch, config.accum_steps)
    if teacher is not None:
        teacher.eval().requires_grad_(False)
    _prepare_model(model, config)
    return RunState(
        config=config,
        model=model,
        trained=model,
        optimizer=build_optimizer(model, lr, config.weight_decay, config.layer_decay),
        schedule=Schedule.of(config, lr, steps),
        mixup=Mixup(
            mixup_alpha=config.mixup,
            cutmix_alpha=config.cutmix,
            prob=config.mix_prob,
            switch_prob=config.switch_prob,
            label_smoothing=config.smoothing,
            num_classes=model.num_classes,
        ),
        device=device,
        amp=amp,
        scaler=torch.amp.GradScaler("cuda") if amp == "fp16" else None,
        ema=ModelEma(model, config.ema) if config.ema else None,
        teacher=teacher,
        out=out,
        meta=dict(meta or {}),
        stop=stop if stop is not None else StopFlag(),
    )


def run_epoch(
    state: RunState, train_loader: Any, val_loader: Any, progress: Progress | None = None
) -> dict[str, Any] | None:
    """Train one epoch (or its rest, when resumed), validate, and save the model files;
    returns the metrics row, or None when a stop came in the middle of the epoch (the state
    is then saved)."""
    config, start = state.config, time.perf_counter()
    sampler: ShardSampler = train_loader.sampler
    sampler.set_epoch(state.epoch)
    full = len(train_loader)  # batches in a whole epoch
    done = state.running.batches if state.running else 0
    sampler.set_epoch(state.epoch, start=done * config.batch_size)
    description = f"epoch {state.epoch + 1}/{config.epochs}"
    bar = progress(train_loader, len(train_loader), description) if progress else train_loader
    postfix = _postfix(getattr(bar, "set_postfix", None))
    sums = train_one_epoch(state, bar, on_step=postfix, on_save=save_state)
    if hasattr(bar, "close"):
        bar.close()
    if state.stop and sums.batches < full:
        save_state(state)
        log.warning(
            "stopped (%s) in epoch %d after %d of %d batches; state saved to %s",
            state.stop.signal_name,
            state.epoch + 1,
            sums.batches,
            full,
            state.out / STATE_FILE if state.out else "nowhere (no out_dir)",
        )
        return None
    return finish_epoch(state, val_loader, seconds=time.perf_counter() - start)


def finish_epoch(state: RunState, val_loader: Any, *, seconds: float) -> dict[str, Any]:
    """Validate (also the EMA weights), record the epoch and write the model files."""
    sums = state.running or EpochState()
    model, device, amp = state.model, state.device, state.amp
    totals = all_reduce([sums.loss_sum, sums.samples, sums.correct], device)
    val = evaluate(model, val_loader, device=device, amp=amp)
    row: dict[str, Any] = {
        "epoch": state.epoch + 1,
        "train_loss": totals[0] / max(totals[1], 1),
        "train_acc1": totals[2] / max(totals[1], 1),
        "val_loss": val["loss"],
        "val_acc1": val["acc1"],
        "val_acc5": val["acc5"],
        "lr": state.schedule(max(state.step - 1, 0)),
        "seconds": round(seconds, 3),
    }
    if state.ema is not None:
        with swapped_weights(model, state.ema):
            row["ema_val_acc1"] = evaluate(model, val_loader, device=device, amp=amp)["acc1"]
    state.history.append(row)
    state.epoch += 1
    state.running = None
    improved = val["acc1"] >= state.best_acc1  # ties: the later epoch
    if improved:
        state.best_acc1, state.best_epoch = val["acc1"], state.epoch
    if state.out is not None and world()[0] == 0:
        file_meta = {**state.meta, "epoch": state.epoch, "val_acc1": val["acc1"]}
        save(model, state.out / LAST_FILE, meta=file_meta)
        if improved:
            save(model, state.out / BEST_FILE, meta=file_meta)
        if state.ema is not None:
            with swapped_weights(model, state.ema):
                save(model, state.out / EMA_FILE, meta={**file_meta, "ema": True})
    return row


# -- helpers --------------------------------------------------------------------------------


def _check_distillation(model: nn.Module, teacher: nn.Module | None, config: TrainConfig) -> None:
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


def _prepare_model(model: nn.Module, config: TrainConfig) -> None:
    """Freeze what the config freezes and switch on gradient checkpointing: before the
    optimiser takes the parameters (frozen ones stay out of it) and before DDP wraps them."""
    if config.freeze is not None or config.linear_probe:
        frozen = freeze_layers(model, blocks=config.freeze, linear_probe=config.linear_probe)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("froze %d parameter tensors; %d parameters train", frozen, trained)
    if config.grad_ckpt:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ValueError(
                f"grad_ckpt: {type(model).__name__} has no set_grad_checkpointing; train it "
                "without grad_ckpt"
            )
        model.set_grad_checkpointing(True)


def _wrapped(state: RunState) -> nn.Module:
    """What the loop calls: the distillation wrapper, DDP and torch.compile as configured."""
    trained: nn.Module = DistillForward(state.model) if state.teacher is not None else state.model
    if world()[1] > 1:
        device = state.device
        trained = nn.parallel.DistributedDataParallel(
            trained, device_ids=[device.index] if device.type == "cuda" else None
        )
    if state.config.compile:
        trained = torch.compile(trained)
    return trained


def _postfix(set_postfix: Callable[..., Any] | None) -> Callable[[EpochState, float], None] | None:
    """A progress bar's per-step update: running loss, accuracy and images/second."""
    if set_postfix is None:
        return None

    def show(sums: EpochState, speed: float) -> None:
        set_postfix(
            loss=f"{sums.loss_sum / max(sums.samples, 1):.4f}",
            acc=f"{sums.correct / max(sums.samples, 1):.3f}",
            img_s=f"{speed:.0f}",
        )

    return show


@contextlib.contextmanager
def _explained_failures(state: RunState) -> Iterator[None]:
    """Turn a NaN loss or a full disk during `fit` into one line that says which files the
    run kept and what to do next."""
    try:
        yield
    except NonFiniteLossError as err:
        lr = state.schedule.lr
        raise NonFiniteLossError(
            f"training loss is {err.loss} at step {err.step} (epoch {state.epoch + 1}, batch "
            f"{err.batch}); the run stopped and kept its last good files: {kept_files(state)}. "
            f"Lower the learning rate (e.g. --lr {lr / 10:.3g}, a tenth of this run's "
            f"{lr:.3g}) or clip gradients (--clip-grad 1.0), and start a new run",
            step=err.step,
            batch=err.batch,
            loss=err.loss,
        ) from err
    except DiskFullError as err:
        raise DiskFullError(err.path, err.existed, "continue with --resume") from err
