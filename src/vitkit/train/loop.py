"""One epoch of training and evaluation: plain functions over a `RunState`.

As in DeiT's `engine.py`: `train_one_epoch(state, loader)` takes each batch through the task
(mixing, the loss), accumulates gradients, steps the optimiser on the schedule and counts;
`evaluate` gives a classifier's loss, top-1 and top-5 (and a confusion matrix).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .distributed import agreed_stop, all_reduce, all_reduce_tensor, world
from .optim import set_lr
from .sharded import is_sharded, lockstep
from .state import EpochState, RunState


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite (the run cannot continue as it is)."""

    def __init__(self, message: str, *, step: int, batch: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.batch, self.loss = step, batch, loss


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision for 'bf16' / 'fp16'; nothing for 'none'."""
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_one_epoch(
    state: RunState,
    loader: Iterable,
    *,
    on_step: Callable[[EpochState, float], None] | None = None,
    on_save: Callable[[RunState], None] | None = None,
) -> EpochState:
    """Train over `loader` once, continuing `state.running` (a resumed epoch); returns the
    epoch's running sums. `state.step` counts optimiser steps; after every `save_every` of
    them (with no gradient accumulation pending) `on_save(state)` writes the state.

    Args:
        state: the run; its task, `trained` module, optimiser and schedule.
        loader: yields (images, labels) batches.
        on_step: called with the running sums and images/second (progress bars).
        on_save: writes the mid-epoch state.
    """
    config = state.config
    state.task.train_mode(state.trained)
    sums = state.running = state.running or EpochState()
    state.optimizer.zero_grad(set_to_none=True)
    pending = 0
    start = time.perf_counter()
    seen = 0
    for images, labels in loader:
        if len(labels) == 0:  # every file of the batch was unreadable
            sums.batches += 1
            continue
        sync = pending + 1 == config.accum_steps
        _backward(state, images, labels, sync=sync)
        pending += 1
        seen += len(labels)
        if sync:
            _optimizer_step(state)
            pending = 0
            if on_save is not None and config.save_every and state.step % config.save_every == 0:
                on_save(state)
        if on_step is not None:
            on_step(sums, seen / max(time.perf_counter() - start, 1e-9))
        if pending == 0 and agreed_stop(state.stop, state.device):
            break
    if pending:  # a last, partial accumulation
        _optimizer_step(state)
    return sums


def _backward(state: RunState, images: Tensor, labels: Tensor, *, sync: bool) -> None:
    """The task's loss of one batch, its gradient (accumulated; DDP synchronises the last of
    an accumulation only) and the running sums."""
    device, sums = state.device, state.running
    images, labels = images.to(device), labels.to(device)
    inputs, targets = state.task.batch(images, labels)
    no_sync = getattr(state.trained, "no_sync", None)
    context = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
    if is_sharded(state.trained):  # FSDP reduce-scatters the last of an accumulation only
        state.trained.set_requires_gradient_sync(sync)
    with context:
        with autocast(state.amp, device):
            loss, correct = state.task.loss(state.trained, inputs, targets)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at step {state.step} (batch "
                f"{sums.batches + 1} of the epoch); lower the learning rate or clip "
                "gradients (clip_grad)",
                step=state.step,
                batch=sums.batches + 1,
                loss=loss.item(),
            )
        scaled = loss / state.config.accum_steps
        (state.scaler.scale(scaled) if state.scaler is not None else scaled).backward()
    batch = len(labels)
    sums.batches += 1
    sums.samples += batch
    sums.loss_sum += loss.item() * batch
    sums.correct += correct


def _optimizer_step(state: RunState) -> None:
    """One optimiser step at the schedule's rate (unscaled, clipped), then the task's own
    (the EMA)."""
    optimizer, scaler = state.optimizer, state.scaler
    set_lr(optimizer, state.schedule(state.step))  # times each group's layer-decay scale
    if scaler is not None:
        scaler.unscale_(optimizer)
    if state.config.clip_grad:
        nn.utils.clip_grad_norm_(state.trained.parameters(), state.config.clip_grad)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state.step += 1
    state.task.after_step()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    *,
    device: torch.device | str = "cpu",
    amp: str = "none",
    num_classes: int | None = None,
) -> dict[str, Any]:
    """Mean cross-entropy, top-1 and top-5 accuracy over `loader` (reduced across ranks).

    With `num_classes` also the confusion matrix, rows = true class, columns = predicted, and
    each class's precision, recall, F1 and support (`per_class`).
    """
    device = torch.device(device)
    model.eval()
    loss_sum = correct1 = correct5 = count = 0.0
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long) if num_classes else None
    for (images, labels), counted in lockstep(loader, model):
        if len(labels) == 0:
            continue
        images, labels = images.to(device), labels.to(device)
        with autocast(amp, device):
            logits = model(images)
        if not counted:  # a sharded model's pass to keep step with the other ranks
            continue
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        k = min(5, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices  # (B, k)
        hits = top == labels[:, None]
        correct1 += hits[:, 0].sum().item()
        correct5 += hits.any(dim=-1).sum().item()
        count += len(labels)
        if confusion is not None:
            pairs = labels.cpu() * num_classes + top[:, 0].cpu()
            confusion += torch.bincount(pairs, minlength=num_classes**2).view_as(confusion)
    loss_sum, correct1, correct5, count = all_reduce([loss_sum, correct1, correct5, count], device)
    if confusion is not None and world()[1] > 1:
        confusion = all_reduce_tensor(confusion.to(device)).cpu()
    if count == 0:
        raise ValueError("nothing to evaluate: the evaluation data is empty")
    result: dict[str, Any] = {
        "loss": loss_sum / count,
        "acc1": correct1 / count,
        "acc5": correct5 / count,
        "count": int(count),
    }
    if confusion is not None:
        result["confusion"] = confusion
        result["per_class"] = per_class_scores(confusion)
    return result


def per_class_scores(confusion: Tensor) -> dict[str, list[float] | list[int]]:
    """Precision, recall and F1 per class from a confusion matrix (rows true, columns
    predicted), and each class's support; 0 where a ratio has nothing to divide by, as
    scikit-learn's `precision_recall_fscore_support(zero_division=0)`."""
    matrix = confusion.double()
    hits = matrix.diagonal()
    predicted, actual = matrix.sum(0), matrix.sum(1)
    precision = torch.where(predicted > 0, hits / predicted.clamp(min=1), 0.0)
    recall = torch.where(actual > 0, hits / actual.clamp(min=1), 0.0)
    both = precision + recall
    f1 = torch.where(both > 0, 2 * precision * recall / both.clamp(min=1e-300), 0.0)
    return {
        "precision": precision.tolist(),
        "recall": recall.tolist(),
        "f1": f1.tolist(),
        "support": actual.long().tolist(),
    }


def steps_per_epoch(batches: int, accum_steps: int) -> int:
    """Optimiser steps in an epoch of `batches` batches (a partial accumulation steps too)."""
    return math.ceil(batches / accum_steps)
