"""The training engine `fit`: set up a `RunState` for a task, then epochs of train, validate,
save, as DeiT's `engine.py` reads. It knows nothing of any task (`tasks/`).

The loop is written once for every task (`tasks/`: classification, MAE); a run folder gets
the task's files, `metrics.jsonl`, `curves.png` and `state.pt` (`state.py`): everything to
continue, written atomically after every epoch, on a stop and every `save_every` steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import corrupt_count
from ..files import DiskFullError
from ..model.precision import model_device
from ..plots import plot_curves
from .distributed import agreed_stop, all_reduce, make_loader, set_epoch, world
from .logs import EpochLog, check_loggers, log_epoch
from .loop import NonFiniteLossError, steps_per_epoch, train_one_epoch
from .optim import Schedule
from .run_folder import CURVES_FILE, STATE_FILE
from .sharded import is_sharded, shard, whole_model
from .signals import StopFlag, stop_on_signals
from .state import EpochState, RunState, load_state, restore, save_state
from .tasks.base import Task

log = logging.getLogger(__name__)

Progress = Callable[[Iterable, int, str], Any]


@dataclass
class FitResult:
    """How `fit` ended: the epoch rows, the best epoch by the task's `best_metric` and its
    value, whether a stop cut the run short, and how many training images were unreadable."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    best_metric: str = "val_acc1"
    best_epoch: int = 0
    interrupted: bool = False
    corrupt_images: int = 0


def fit(
    task: Task,
    train_set: Dataset,
    val_set: Dataset,
    config: Any,
    *,
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    stop: StopFlag | None = None,
    progress: Progress | None = None,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
    loggers: Sequence[str] = (),
) -> FitResult:
    """Train `task` for `config.epochs`, validating after each epoch.

    Rank 0 writes the run files into `out_dir` (when given); `resume=True` continues from its
    `state.pt`. The engine reads only the options every job shares (seed, epochs, batch size,
    learning rates and warmup, weight decay, clipping, accumulation, AMP, compile, grad_ckpt,
    save_every, device, workers); the task reads its own.

    Args:
        task: a `Task` (e.g. `ClassificationTask(model, config)`), its model on
            `config.device` (default: where it is).
        train_set, val_set: datasets yielding transformed (image, label): map-style, or
            streams (IterableDatasets with a length hint).
        config: the run's options.
        out_dir: where the files go; None writes nothing (and cannot resume).
        resume: continue from `out_dir/state.pt`.
        stop: set it to stop cleanly; SIGINT / SIGTERM set it too.
        progress: `progress(iterable, total, description)` -> an iterable with an optional
            `set_postfix(**values)` (e.g. tqdm), for each epoch's training and validation
            batches; None shows nothing.
        on_epoch_end: called with each epoch's metrics row.
        loggers: where the rows go besides `metrics.jsonl` and `metrics.csv`:
            'tensorboard' (`out_dir/tensorboard`).
    """
    out = _checked_arguments(task, out_dir, resume, loggers)
    state, train_loader, val_loader = _start(task, train_set, val_set, config, out, resume, stop)
    writes = out is not None and world()[0] == 0
    with (
        stop_on_signals(state.stop),
        _explained_failures(state),
        _epoch_log(out, writes, loggers) as rows,
    ):
        if out is not None and not resume:
            save_state(state)  # a stop during the first epoch can still resume
        while state.epoch < config.epochs:
            row = run_epoch(state, train_loader, val_loader, progress)
            if row is None:  # stopped in the middle of the epoch
                break
            _record_epoch(state, row, corrupt_count(train_set), rows if writes else None)
            if on_epoch_end is not None:
                on_epoch_end(row)
            if agreed_stop(state.stop, state.device):
                _stopped_between_epochs(state)
                break
        if writes and state.history:
            plot_curves(state.history, out / CURVES_FILE)
    return FitResult(
        history=state.history,
        best=state.best,
        best_metric=task.best_metric,
        best_epoch=state.best_epoch,
        interrupted=state.epoch < config.epochs,
        corrupt_images=corrupt_count(train_set),
    )


def _checked_arguments(
    task: Task, out_dir: str | os.PathLike | None, resume: bool, loggers: Sequence[str]
) -> Path | None:
    """The run folder, once `fit`'s arguments are known good (before any loader starts)."""
    if not isinstance(task, Task):
        raise TypeError(
            f"fit trains a Task, got {type(task).__name__}; wrap a classifier as "
            "ClassificationTask(model, config)"
        )
    check_loggers(loggers)
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise ValueError("resume=True needs out_dir")
    return out


def _record_epoch(
    state: RunState, row: dict[str, Any], skipped: int, rows: EpochLog | None
) -> None:
    """A finished epoch kept: the images skipped so far in its row, the rows written (rank 0,
    `rows`), the state saved (every rank: a sharded state is written by all), the row
    logged."""
    if skipped:
        row["skipped_images"] = skipped
    if rows is not None:
        rows.write(state.history)
    if state.out is not None:
        save_state(state)
    log_epoch(row, state.config.epochs, state.task.log_keys)


def _start(
    task: Task,
    train_set: Dataset,
    val_set: Dataset,
    config: Any,
    out: Path | None,
    resume: bool,
    stop: StopFlag | None,
) -> tuple[RunState, Any, Any]:
    """The loaders and the run's state (restored from `state.pt` on `resume`), its task's
    module wrapped for DDP / torch.compile."""
    train_loader = make_loader(
        train_set, config.batch_size, train=True, seed=config.seed, num_workers=config.workers
    )
    val_loader = make_loader(val_set, config.batch_size, train=False, num_workers=config.workers)
    state = new_run_state(task, config, batches_per_epoch=len(train_loader), out=out, stop=stop)
    if resume:
        restore(state, load_state(out / STATE_FILE))
    state.trained = _wrapped(state)
    return state, train_loader, val_loader


@contextlib.contextmanager
def _epoch_log(out: Path | None, writes: bool, loggers: Sequence[str]) -> Iterator[EpochLog]:
    """The run's `EpochLog` (rank 0 with a folder), closed at the end; else one that writes
    nothing."""
    if not writes:
        yield _NoLog()
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = EpochLog(out, loggers)
    try:
        yield rows
    finally:
        rows.close()


class _NoLog:
    def write(self, history: list[dict[str, Any]]) -> None:
        pass


def new_run_state(
    task: Task,
    config: Any,
    *,
    batches_per_epoch: int,
    out: Path | None = None,
    stop: StopFlag | None = None,
) -> RunState:
    """A run at its start: the task prepared (freezing, checkpointing), its model sharded
    with `fsdp`, its optimiser, the schedule and the AMP scaler."""
    device = torch.device(config.device) if config.device else model_device(task.model)
    amp = config.amp_on(device)
    lr = config.peak_lr(world()[1])
    steps = steps_per_epoch(batches_per_epoch, config.accum_steps)
    task.prepare(config)
    if getattr(config, "fsdp", False):
        shard(task.model, amp=amp, device=device)
    return RunState(
        config=config,
        task=task,
        trained=task.trained_module(),
        optimizer=task.build_optimizer(lr),
        schedule=Schedule.of(config, lr, steps),
        device=device,
        amp=amp,
        scaler=torch.amp.GradScaler("cuda") if amp == "fp16" else None,
        out=out,
        stop=stop if stop is not None else StopFlag(),
    )


def run_epoch(
    state: RunState, train_loader: Any, val_loader: Any, progress: Progress | None = None
) -> dict[str, Any] | None:
    """Train one epoch (or its rest, when resumed), validate, and save the task's files;
    returns the metrics row, or None when a stop came in the middle of the epoch (the state
    is then saved)."""
    config, start = state.config, time.perf_counter()
    done = state.running.batches if state.running else 0
    set_epoch(train_loader, state.epoch, start=done * config.batch_size)
    full = done + len(train_loader)  # batches in the whole epoch (the loader has the rest)
    description = f"epoch {state.epoch + 1}/{config.epochs}"
    bar = progress(train_loader, len(train_loader), description) if progress else train_loader
    postfix = _postfix(getattr(bar, "set_postfix", None), state.task.counts_correct)
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
    if progress is not None:
        val_loader = progress(val_loader, len(val_loader), f"{description} validation")
    return finish_epoch(state, val_loader, seconds=time.perf_counter() - start)


def finish_epoch(state: RunState, val_loader: Any, *, seconds: float) -> dict[str, Any]:
    """Validate, record the epoch and write the task's files of it."""
    task, sums = state.task, state.running or EpochState()
    loss_sum, samples, correct = all_reduce(
        [sums.loss_sum, sums.samples, sums.correct], state.device
    )
    row: dict[str, Any] = {"epoch": state.epoch + 1, "train_loss": loss_sum / max(samples, 1)}
    if task.counts_correct:
        row["train_acc1"] = correct / max(samples, 1)
    row.update(task.validate(val_loader, state.device, state.amp))
    row["lr"] = state.schedule(max(state.step - 1, 0))
    row["seconds"] = round(seconds, 3)
    state.history.append(row)
    state.epoch += 1
    state.running = None
    value = row[task.best_metric]
    improved = state.best is None or (  # ties: the later epoch
        value >= state.best if task.higher_is_better else value <= state.best
    )
    if improved:
        state.best, state.best_epoch = value, state.epoch
    if state.out is not None:
        with whole_model(task):  # every rank gathers a sharded model's weights
            if world()[0] == 0:
                task.save_files(state.out, row, improved)
    return row


def _wrapped(state: RunState) -> nn.Module:
    """What the loop calls: the task's module, in DDP (unless sharded) and torch.compile as
    configured."""
    trained = state.task.trained_module()
    if world()[1] > 1 and not is_sharded(trained):
        device = state.device
        trained = nn.parallel.DistributedDataParallel(
            trained,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=state.task.find_unused_parameters,
        )
    if state.config.compile:
        trained = torch.compile(trained)
    return trained


def _postfix(
    set_postfix: Callable[..., Any] | None, accuracy: bool
) -> Callable[[EpochState, float], None] | None:
    """A progress bar's per-step update: running loss (and accuracy) and images/second."""
    if set_postfix is None:
        return None

    def show(sums: EpochState, speed: float) -> None:
        values = {"loss": f"{sums.loss_sum / max(sums.samples, 1):.4f}"}
        if accuracy:
            values["acc"] = f"{sums.correct / max(sums.samples, 1):.3f}"
        set_postfix(**values, img_s=f"{speed:.0f}")

    return show


def _stopped_between_epochs(state: RunState) -> None:
    if state.epoch < state.config.epochs:
        log.warning(
            "stopped (%s) after epoch %d; state saved to %s",
            state.stop.signal_name,
            state.epoch,
            state.out / STATE_FILE if state.out else "nowhere",
        )


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
    last = state.task.last_file
    if state.history and last is not None:
        files.append(f"{state.out / last} (epoch {state.history[-1]['epoch']})")
    return ", ".join(files)
