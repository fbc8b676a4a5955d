"""A run in progress (`RunState`) and its file `state.pt`: everything to continue a run.

`save_state` writes the weights, optimiser, scaler, the task's own extras (an EMA), the
counters, the history and the RNG states atomically, as plain tensors, dicts and numbers, so
`torch.load(weights_only=True)` reads it back (`load_state`); `restore` puts it into a fresh
`RunState`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..files import atomic_write
from ..weights.checkpoint import CheckpointError, load_into
from .distributed import world
from .optim import Schedule
from .run_folder import STATE_FILE
from .sharded import is_sharded, load_sharded, prune_sharded, save_sharded
from .signals import StopFlag

if TYPE_CHECKING:
    from .tasks.base import Task

log = logging.getLogger(__name__)


@dataclass
class EpochState:
    """Running sums of the current epoch (saved with a mid-epoch stop)."""

    batches: int = 0
    samples: float = 0.0
    loss_sum: float = 0.0
    correct: float = 0.0


@dataclass
class RunState:
    """A run in progress: the live objects, and the counters that `state.pt` saves.

    `task.model` (`model`) is the unwrapped network (what is saved); `trained` is what the
    loop calls (the task's module wrapped for DistributedDataParallel or torch.compile).
    `best` is the task's `best_metric` at its best epoch (None before the first).
    """

    config: Any
    task: Task
    trained: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    device: torch.device
    amp: str
    scaler: torch.amp.GradScaler | None = None
    out: Path | None = None
    stop: StopFlag = field(default_factory=StopFlag)
    epoch: int = 0  # epochs finished
    step: int = 0  # optimiser steps taken
    running: EpochState | None = None  # the sums of an unfinished epoch
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    best_epoch: int = 0
    saved_at: tuple[int, int] = (0, 0)  # (epoch, batches) that state.pt holds

    @property
    def model(self) -> nn.Module:
        return self.task.model


def save_state(state: RunState) -> None:
    """Write `state.pt` atomically on rank 0 (plain tensors, dicts and numbers, so that
    `torch.load(weights_only=True)` reads it back). A sharded model's weights and optimiser
    go into a DCP folder that every rank writes its part of (call it on every rank) and that
    `state.pt` names; the previous one is removed once it does."""
    if state.out is None:
        return
    point = (state.epoch, state.running.batches if state.running else 0)
    folder = f"state-{point[0]}-{point[1]}.dcp" if is_sharded(state.model) else None
    stepped = bool(state.optimizer.state)
    if folder is not None and not _holds(state, point, folder):
        stepped = save_sharded(state.model, state.optimizer, state.out, folder)
    if world()[0] != 0:
        state.saved_at = point
        return
    if folder is not None:
        payload: dict[str, Any] = {"sharded": folder, "sharded_optimizer": stepped}
    else:
        payload = {
            "model": {k: v.detach().cpu() for k, v in state.model.state_dict().items()},
            "optimizer": state.optimizer.state_dict(),
        }
    payload |= {
        "epoch": state.epoch,
        "step": state.step,
        "epoch_state": dataclasses.asdict(state.running) if state.running else None,
        "best": state.best,
        "best_epoch": state.best_epoch,
        "history": [json.dumps(row) for row in state.history],
        "rng": rng_state(),
        "train_config": json.dumps(state.config.to_dict()),
    }
    if state.scaler is not None:
        payload["scaler"] = state.scaler.state_dict()
    payload.update(state.task.extra_state())
    atomic_write(state.out / STATE_FILE, lambda f: torch_save(payload, f))
    if folder is not None:
        prune_sharded(state.out, keep=folder)
    state.saved_at = point


def _holds(state: RunState, point: tuple[int, int], folder: str) -> bool:
    """Whether `state.pt` already names a complete DCP folder of this very point (a stop
    right after a `save_every` save): it is kept, not removed and written again."""
    return state.saved_at == point and (state.out / folder / ".metadata").is_file()


def torch_save(payload: Any, file: Any) -> None:
    """`torch.save(payload, file)`, except that a write the file refuses (a full disk) raises
    that OSError: torch's writer swallows it and reports an internal 'enforce fail ...
    unexpected pos' instead, which `atomic_write` cannot recognise as a full disk."""
    refused: list[OSError] = []

    class Recorded:
        def write(self, data: Any) -> int:
            try:
                return file.write(data)
            except OSError as err:
                refused.append(err)
                raise

        def flush(self) -> None:
            file.flush()

    try:
        torch.save(payload, Recorded())
    except RuntimeError:
        if refused:
            raise refused[0] from None
        raise


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
    sharded = is_sharded(state.model)
    if ("sharded" in saved) != sharded:
        raise CheckpointError(
            f"{source} holds a {'sharded' if 'sharded' in saved else 'whole'} training state "
            f"and this run is {'sharded (fsdp)' if sharded else 'not sharded'}; resume with the "
            "run's own fsdp setting"
        )
    if sharded:
        folder = state.out / saved["sharded"]
        load_sharded(state.model, state.optimizer, folder, stepped=saved["sharded_optimizer"])
    else:
        load_into(state.model, saved["model"], source=source)
        state.optimizer.load_state_dict(saved["optimizer"])
    if state.scaler is not None and "scaler" in saved:
        state.scaler.load_state_dict(saved["scaler"])
    state.task.load_extra_state(saved, state.device)
    state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
    if saved.get("epoch_state"):
        state.running = EpochState(**saved["epoch_state"])
    state.history = [json.loads(row) for row in saved.get("history", [])]
    best = saved.get("best", saved.get("best_acc1"))  # best_acc1: files of vitkit <= 0.1
    state.best = None if best is None else float(best)
    state.best_epoch = int(saved.get("best_epoch", 0))
    state.saved_at = (state.epoch, state.running.batches if state.running else 0)
    set_rng_state(saved["rng"])
    log.info(
        "resuming from %s at epoch %d%s",
        source,
        state.epoch + 1,
        f", batch {state.running.batches + 1}" if state.running else "",
    )


def rng_state() -> dict[str, Any]:
    """The global random states (torch, Python, CUDA) as tensors."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor([x for x in random.getstate()[1]], dtype=torch.int64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version = random.getstate()[0]
    random.setstate((version, tuple(int(x) for x in state["python"].tolist()), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
