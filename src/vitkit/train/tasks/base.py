"""The task interface of the training engine: what `fit` asks of the job it runs, and what
`run_job` asks to set one up and finish it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ...data import Splits

log = logging.getLogger(__name__)


class Task:
    """A job the engine trains. The engine owns the loop (loaders, schedule, AMP, gradient
    accumulation, clipping, DDP, torch.compile, the state file, stops and resumes); a task
    owns what differs between jobs: its set-up (`setup(config)`: model, data, loss, metadata),
    its steps, and the files it writes.

    Attributes:
        name: how the run folder's `config.json` records the job ('classification', 'mae').
        model: the module whose weights `state.pt` holds and the optimiser trains.
        best_metric: the metric of the epoch row that says which epoch is best.
        higher_is_better: whether a larger `best_metric` is better.
        log_keys: the metrics of the one-line epoch log.
        counts_correct: whether `loss` counts correct predictions (a `train_acc1` metric).
        find_unused_parameters: DistributedDataParallel's flag (parameters the loss skips).
        files: the file names the task writes into the run folder.
        run_files: every file of its run folder (the engine's among them): what a new run
            refuses to overwrite and `--overwrite` clears.
        last_file: the file of the last finished epoch's weights, if any (named after a
            failure).
        splits, train_set, val_set: its data (set by `setup`).
        meta: the metadata its files and `config.json` carry.
    """

    name = "task"
    best_metric = "val_loss"
    higher_is_better = False
    log_keys: tuple[str, ...] = ("train_loss", "val_loss")
    counts_correct = False
    find_unused_parameters = False
    files: tuple[str, ...] = ()
    run_files: tuple[str, ...] = ()
    last_file: str | None = None
    model: nn.Module
    splits: Splits
    train_set: Dataset
    val_set: Dataset
    meta: dict[str, Any]

    @classmethod
    def setup(cls, config: Any) -> Task:
        """The task of a run of `config`: its model (seeded, on `config.device`), its data and
        everything its loss needs; called inside the run (in its process group)."""
        raise NotImplementedError

    def recorded_model(self) -> nn.Module:
        """The model `config.json` describes."""
        return self.model

    def log_start(self, out: Path) -> None:
        """Log what the run trains, into `out`."""

    def finish(self, out: Path, result: Any) -> dict[str, Any] | None:
        """After a run that was not cut short (`result`, the `fit.FitResult`; the engine is
        above the tasks): the test metrics, if the task has them."""
        return None

    def prepare(self, config: Any) -> None:
        """Before the optimiser takes the parameters and DDP wraps them: gradient
        checkpointing (the shared `grad_ckpt` option); tasks add freezing and the like."""
        if config.grad_ckpt:
            target = self.checkpointed()
            if not hasattr(target, "set_grad_checkpointing"):
                raise ValueError(
                    f"grad_ckpt: {type(target).__name__} has no set_grad_checkpointing; train "
                    "it without grad_ckpt"
                )
            target.set_grad_checkpointing(True)

    def checkpointed(self) -> nn.Module:
        """The network whose blocks `grad_ckpt` recomputes."""
        return self.model

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        raise NotImplementedError

    def trained_module(self) -> nn.Module:
        """What the loop calls, and DDP / torch.compile wrap."""
        return self.model

    def train_mode(self, trained: nn.Module) -> None:
        trained.train()

    def batch(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs, targets) of a batch on the device, before autocast (e.g. mixing)."""
        return images, labels

    def loss(self, trained: nn.Module, inputs: Tensor, targets: Tensor) -> tuple[Tensor, float]:
        """(loss, correct predictions) of a batch, under autocast."""
        raise NotImplementedError

    def after_step(self) -> None:
        """After each optimiser step (e.g. the EMA update)."""

    def validate(self, loader: Any, device: torch.device, amp: str) -> dict[str, float]:
        """The validation metrics of the epoch row (reduced across ranks)."""
        raise NotImplementedError

    def save_files(self, out: Path, row: dict[str, Any], improved: bool) -> None:
        """The files of a finished epoch, on rank 0."""

    def extra_state(self) -> dict[str, Any]:
        """What `state.pt` holds besides the model and optimiser (plain tensors and numbers)."""
        return {}

    def load_extra_state(self, saved: dict[str, Any], device: torch.device) -> None:
        """Take `extra_state` back from a `state.pt`."""

    def summary(self) -> dict[str, Any]:
        """A few words on the task for the final summary."""
        return {"task": self.name}
