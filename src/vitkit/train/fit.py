"""The training loop `fit`: set up a `RunState`, then epochs of train, evaluate, save.

A run folder holds `model.safetensors` (best validation top-1), `last.safetensors`,
`ema.safetensors` (with an EMA), `metrics.jsonl`, `curves.png` and `state.pt`: everything to
continue (weights, optimiser, scaler, EMA, counters, history, RNG states), written atomically
after every epoch, on a stop and every `save_every` steps, and read with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import Mixup, corrupt_count
from ..files import DiskFullError, atomic_write
from ..model.precision import model_device
from ..weights.checkpoint import CheckpointError, load_into, save
from .config import TrainConfig
from .distributed import ShardSampler, all_reduce, make_loader, world
from .loop import (
    DistillForward,
    EpochState,
    NonFiniteLossError,
    RunState,
    Schedule,
    StopFlag,
    evaluate,
    steps_per_epoch,
    train_one_epoch,
)
from .optim import ModelEma, build_optimizer, freeze_layers, swapped_weights

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
BEST_FILE = "model.safetensors"
LAST_FILE = "last.safetensors"
EMA_FILE = "ema.safetensors"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
TEST_FILE = "test.json"
RUN_FILES = (
    STATE_FILE, BEST_FILE, LAST_FILE, EMA_FILE, METRICS_FILE, "config.json", CURVES_FILE, TEST_FILE,
)  # fmt: skip

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
    with _stop_on_signals(state.stop), _explained_failures(state):
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
                _write_metrics(out / METRICS_FILE, state.history)
                save_state(state)
            _log_epoch(row, config.epochs)
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
            from ..explain import plot_curves

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


# -- the state file -------------------------------------------------------------------------


def save_state(state: RunState) -> None:
    """Write `state.pt` atomically on rank 0 (plain tensors, dicts and numbers, so that
    `torch.load(weights_only=True)` reads it back)."""
    if state.out is None or world()[0] != 0:
        return
    payload: dict[str, Any] = {
        "model": {k: v.detach().cpu() for k, v in state.model.state_dict().items()},
        "optimizer": state.optimizer.state_dict(),
        "epoch": state.epoch,
        "step": state.step,
        "epoch_state": dataclasses.asdict(state.running) if state.running else None,
        "best_acc1": state.best_acc1,
        "best_epoch": state.best_epoch,
        "history": [json.dumps(row) for row in state.history],
        "rng": _rng_state(),
        "train_config": json.dumps(state.config.to_dict()),
    }
    if state.scaler is not None:
        payload["scaler"] = state.scaler.state_dict()
    if state.ema is not None:
        payload["ema"] = {k: v.cpu() for k, v in state.ema.state.items()}
    atomic_write(state.out / STATE_FILE, lambda f: torch.save(payload, f))
    state.saved_at = (state.epoch, state.running.batches if state.running else 0)


def load_state(path: Path) -> dict[str, Any]:
    """The contents of a `state.pt`, or one error that says to start again."""
    if not path.is_file():
        raise FileNotFoundError(f"no training state {path} to resume from; start without --resume")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure: the file is unusable
        raise CheckpointError(
            f"cannot read the training state {path} ({type(err).__name__}: {err}); "
            "start again with --overwrite"
        ) from None


def restore(state: RunState, saved: dict[str, Any]) -> None:
    """Put a `state.pt`'s contents back into a fresh `state` (before the model is wrapped)."""
    source = str(state.out / STATE_FILE) if state.out else STATE_FILE
    load_into(state.model, saved["model"], source=source)
    state.optimizer.load_state_dict(saved["optimizer"])
    if state.scaler is not None and "scaler" in saved:
        state.scaler.load_state_dict(saved["scaler"])
    if state.ema is not None and "ema" in saved:
        state.ema.state = {k: v.to(state.device) for k, v in saved["ema"].items()}
    state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
    if saved.get("epoch_state"):
        state.running = EpochState(**saved["epoch_state"])
    state.history = [json.loads(row) for row in saved.get("history", [])]
    state.best_acc1 = float(saved.get("best_acc1", -1.0))
    state.best_epoch = int(saved.get("best_epoch", 0))
    state.saved_at = (state.epoch, state.running.batches if state.running else 0)
    _set_rng_state(saved["rng"])
    log.info(
        "resuming from %s at epoch %d%s",
        source,
        state.epoch + 1,
        f", batch {state.running.batches + 1}" if state.running else "",
    )


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


def _log_epoch(row: dict[str, Any], epochs: int) -> None:
    log.info(
        "epoch %d/%d  train_loss %.4f  val_loss %.4f  val_acc1 %.4f  val_acc5 %.4f  lr %.2e  %.1fs",
        row["epoch"],
        epochs,
        row["train_loss"],
        row["val_loss"],
        row["val_acc1"],
        row["val_acc5"],
        row["lr"],
        row["seconds"],
    )


def _write_metrics(path: Path, history: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(row) + "\n" for row in history)
    atomic_write(path, lambda f: f.write(text), mode="w")


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor([x for x in random.getstate()[1]], dtype=torch.int64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version = random.getstate()[0]
    random.setstate((version, tuple(int(x) for x in state["python"].tolist()), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _stop_on_signals(stop: StopFlag) -> Iterator[None]:
    """SIGINT / SIGTERM set `stop` (a second SIGINT interrupts at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning("%s received: stopping after this step and saving the state", name)
        stop.set(name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def kept_files(state: RunState) -> str:
    """The files a failed run leaves, and the point of training each holds."""
    if state.out is None or world()[0] != 0:
        return "none (no out_dir)"
    done, batches = state.saved_at
    if batches:
        when = f"epoch {done + 1} after batch {batches}"
    else:
        when = f"end of epoch {done}" if done else "before the first epoch"
    files = [f"{state.out / STATE_FILE} ({when})"]
    if state.history:
        files.append(f"{state.out / LAST_FILE} (epoch {state.history[-1]['epoch']})")
    return ", ".join(files)


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
