"""Training and evaluation: `train_one_epoch`, `evaluate`, `predict` and the loop `fit`.

The recipe is DeiT's (Touvron et al. 2021, Table 9), itself the ViT paper's fine-tuning setup
with stronger regularisation: AdamW (weight decay 0.05, none on biases, norms, tokens and
positions), linear warmup then cosine decay per step, label smoothing, Mixup/CutMix, optional
EMA of the weights, and knowledge distillation through the distillation token (hard or soft).
All functions take explicit arguments; the command line only parses and calls them.

Distributed runs (torchrun) shard the data with `ShardSampler`, average gradients with
DistributedDataParallel, reduce metrics across ranks and write files on rank 0 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
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
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Sampler

from .. import files
from ..data import Mixup, collate, corrupt_count
from ..weights import checkpoint

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
BEST_FILE = "model.safetensors"
LAST_FILE = "last.safetensors"
EMA_FILE = "ema.safetensors"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
AMP_MODES = ("none", "bf16", "fp16")
DISTILL_MODES = ("none", "hard", "soft")


@dataclass
class TrainConfig:
    """Every optimisation choice of a run (saved in config.json and the state file).

    `batch_size` is per process; `lr` is the absolute peak learning rate (the CLI scales a
    base rate by the effective batch / 512, as DeiT does). Epoch counts may be fractional for
    warmup. `save_every` > 0 also saves the state every that many optimiser steps, so that a
    crash in a long epoch loses at most that many steps.
    """

    epochs: int = 100
    batch_size: int = 64
    lr: float = 5e-4
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    warmup_epochs: float = 5.0
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    clip_grad: float | None = None
    accum_steps: int = 1
    label_smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    ema_decay: float | None = None
    amp: str = "none"
    compile: bool = False
    distill: str = "none"
    distill_alpha: float = 0.5
    distill_tau: float = 1.0
    seed: int = 0
    num_workers: int = 0
    device: str = "cpu"
    save_every: int = 0

    def __post_init__(self) -> None:
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp {self.amp!r}; expected one of {', '.join(AMP_MODES)}")
        if self.distill not in DISTILL_MODES:
            raise ValueError(
                f"unknown distill {self.distill!r}; expected one of {', '.join(DISTILL_MODES)}"
            )
        for name in ("epochs", "batch_size", "accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("mixup", "cutmix", "weight_decay", "warmup_epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        for name in ("mix_prob", "switch_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a probability in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.save_every < 0:
            raise ValueError(
                f"save_every must be >= 0 (0: at epoch ends only), got {self.save_every}"
            )
        if self.amp == "fp16" and not self.device.startswith("cuda"):
            raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
        self.betas = tuple(self.betas)

    def to_dict(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }


# -- optimiser and schedule -----------------------------------------------------------------


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decayed weights, and no decay for every parameter with ndim <= 1
    (biases, norms, LayerScale) and the names in `model.no_weight_decay()`."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(
    step: int,
    *,
    total_steps: int,
    warmup_steps: int,
    lr: float,
    min_lr: float = 0.0,
    warmup_lr: float = 0.0,
) -> float:
    """The learning rate at optimiser step `step`: linear from `warmup_lr` to `lr` over
    `warmup_steps`, then half a cosine from `lr` down to `min_lr` at `total_steps`."""
    if step < warmup_steps:
        return warmup_lr + (lr - warmup_lr) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class ModelEma:
    """Exponential moving average of a model's parameters and buffers (float32 copies)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.state = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for key, value in model.state_dict().items():
            if value.is_floating_point():
                self.state[key].lerp_(value.detach().float(), 1.0 - self.decay)
            else:
                self.state[key].copy_(value)

    def copy_to(self, model: nn.Module) -> None:
        own = model.state_dict()
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in self.state.items()})


# -- distributed helpers --------------------------------------------------------------------


def world() -> tuple[int, int]:
    """(rank, world_size); (0, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def _all_reduce(values: list[float], device: torch.device) -> list[float]:
    if world()[1] == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


class ShardSampler(Sampler[int]):
    """This rank's share of a (per-epoch shuffled) index order, DistributedSampler-style.

    `pad=True` repeats indices so every rank gets the same count (training: equal steps);
    `start` skips that many of this rank's indices (resuming in the middle of an epoch).
    """

    def __init__(
        self,
        size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
    ) -> None:
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def indices(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        if self.pad and self.size % self.world_size:
            extra = self.world_size - self.size % self.world_size
            order += (order * math.ceil(extra / max(self.size, 1)))[:extra]
        return order[self.rank :: self.world_size][self.start :]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        per_rank = (
            math.ceil(self.size / self.world_size)
            if self.pad
            else len(range(self.rank, self.size, self.world_size))
        )
        return max(per_rank - self.start, 0)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    train: bool,
    seed: int = 0,
    num_workers: int = 0,
) -> DataLoader:
    """A loader over this rank's shard: shuffled and padded for training, in order for eval."""
    rank, size = world()
    sampler = ShardSampler(
        len(dataset), shuffle=train, seed=seed, rank=rank, world_size=size, pad=train
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        drop_last=False,
        # its own generator: creating an iterator then draws no number from the global one,
        # so a run resumed in mid-epoch sees the same random stream
        generator=torch.Generator().manual_seed(seed),
    )


# -- losses ---------------------------------------------------------------------------------


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against soft targets (B, K), e.g. mixed and smoothed labels."""
    return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def distill_loss(
    student_dist: Tensor, teacher_logits: Tensor, mode: str, tau: float = 1.0
) -> Tensor:
    """DeiT's distillation term on the distillation-token logits: 'hard' is cross-entropy with
    the teacher's argmax, 'soft' the KL divergence at temperature `tau` (times tau^2)."""
    if mode == "hard":
        return F.cross_entropy(student_dist.float(), teacher_logits.argmax(dim=-1))
    if mode == "soft":
        log_p = F.log_softmax(student_dist.float() / tau, dim=-1)
        log_q = F.log_softmax(teacher_logits.float() / tau, dim=-1)
        return F.kl_div(log_p, log_q, reduction="batchmean", log_target=True) * tau * tau
    raise ValueError(f"unknown distillation mode {mode!r}; expected 'hard' or 'soft'")


class _DistillForward(nn.Module):
    """Wraps a distilled ViT so that `forward` returns (class logits, distillation logits):
    DistributedDataParallel and torch.compile only see `forward`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.forward_distill(x)


def _autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# -- one epoch ------------------------------------------------------------------------------


class StopFlag:
    """Set by a signal handler (or a test); the loop stops after the current optimiser step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def set(self, name: str = "stop") -> None:
        self.signal_name = name
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite (the run cannot continue as it is)."""

    def __init__(self, message: str, *, step: int, batch: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.batch, self.loss = step, batch, loss


@dataclass
class EpochState:
    """Running sums of the current epoch (saved with a mid-epoch stop)."""

    batches: int = 0
    samples: float = 0.0
    loss_sum: float = 0.0
    correct: float = 0.0


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    *,
    lr_fn: Callable[[int], float],
    step: int,
    mixup: Mixup,
    device: torch.device,
    amp: str = "none",
    scaler: torch.amp.GradScaler | None = None,
    clip_grad: float | None = None,
    accum_steps: int = 1,
    ema: ModelEma | None = None,
    ema_source: nn.Module | None = None,
    teacher: nn.Module | None = None,
    distill: str = "none",
    distill_alpha: float = 0.5,
    distill_tau: float = 1.0,
    state: EpochState | None = None,
    stop: StopFlag | None = None,
    on_step: Callable[[EpochState, float], None] | None = None,
    save_every: int = 0,
    save: Callable[[EpochState, int], None] | None = None,
) -> tuple[EpochState, int]:
    """Train over `loader` once; returns the epoch's running sums and the new step count.

    Args:
        model: the module to call (possibly DDP- or compile-wrapped; distilled models wrapped
            so that forward returns (class, distillation) logits).
        loader: yields (images, labels) batches.
        optimizer: AdamW; its learning rate is set from `lr_fn(step)` before each step.
        lr_fn: optimiser step -> learning rate.
        step: optimiser steps taken so far.
        mixup: batch mixing and label smoothing (targets are always soft).
        device: where the batches go.
        amp: 'none', 'bf16' (autocast) or 'fp16' (autocast and `scaler`).
        scaler: the fp16 gradient scaler.
        clip_grad: max gradient norm, or None.
        accum_steps: batches per optimiser step.
        ema: an EMA of `ema_source`'s weights, updated each step.
        ema_source: the unwrapped model whose weights the EMA tracks.
        teacher: a model giving the distillation targets.
        distill: 'none', 'hard' or 'soft'.
        distill_alpha: weight of the distillation term.
        distill_tau: soft distillation temperature.
        state: running sums to continue (resume in mid-epoch).
        stop: checked after each optimiser step.
        on_step: called with the running sums and images/second (progress bars).
        save_every: call `save(state, step)` after every that many optimiser steps (0: never).
        save: writes the mid-epoch state (no gradient accumulation is pending when called).
    """
    model.train()
    state = state or EpochState()
    optimizer.zero_grad(set_to_none=True)
    pending = 0
    start = time.perf_counter()
    seen = 0
    for images, labels in loader:
        if len(labels) == 0:  # every file of the batch was unreadable
            state.batches += 1
            continue
        images, labels = images.to(device), labels.to(device)
        mixed, targets = mixup(images, labels)
        sync = pending + 1 == accum_steps
        no_sync = getattr(model, "no_sync", None)
        context = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
        with context:
            with _autocast(amp, device):
                if teacher is not None:
                    cls_logits, dist_logits = model(mixed)
                    with torch.no_grad():
                        teacher_in = mixed
                        size = getattr(getattr(teacher, "patch_embed", None), "img_size", None)
                        if size is not None and tuple(mixed.shape[-2:]) != tuple(size):
                            teacher_in = F.interpolate(mixed, size=size, mode="bilinear")
                        teacher_logits = teacher(teacher_in)
                    base = soft_cross_entropy(cls_logits, targets)
                    extra = distill_loss(dist_logits, teacher_logits, distill, distill_tau)
                    loss = base * (1 - distill_alpha) + extra * distill_alpha
                    logits = (cls_logits + dist_logits) / 2
                else:
                    logits = model(mixed)
                    loss = soft_cross_entropy(logits, targets)
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"training loss is {loss.item()} at step {step} (batch {state.batches + 1} "
                    "of the epoch); lower the learning rate or clip gradients (clip_grad)",
                    step=step,
                    batch=state.batches + 1,
                    loss=loss.item(),
                )
            scaled = loss / accum_steps
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        pending += 1
        batch = len(labels)
        state.batches += 1
        state.samples += batch
        state.loss_sum += loss.item() * batch
        state.correct += (logits.argmax(-1) == targets.argmax(-1)).sum().item()
        seen += batch
        if sync:
            _optimizer_step(optimizer, scaler, clip_grad, lr_fn(step), model)
            step += 1
            pending = 0
            if ema is not None:
                ema.update(ema_source if ema_source is not None else model)
            if save is not None and save_every and step % save_every == 0:
                save(state, step)
        if on_step is not None:
            on_step(state, seen / max(time.perf_counter() - start, 1e-9))
        if stop and pending == 0:
            break
    if pending:  # a last, partial accumulation
        _optimizer_step(optimizer, scaler, clip_grad, lr_fn(step), model)
        step += 1
        if ema is not None:
            ema.update(ema_source if ema_source is not None else model)
    return state, step


def _optimizer_step(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    clip_grad: float | None,
    lr: float,
    model: nn.Module,
) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_grad:
        nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# -- evaluation and prediction --------------------------------------------------------------


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

    With `num_classes` also the confusion matrix, rows = true class, columns = predicted.
    """
    device = torch.device(device)
    model.eval()
    loss_sum = correct1 = correct5 = count = 0.0
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long) if num_classes else None
    for images, labels in loader:
        if len(labels) == 0:
            continue
        images, labels = images.to(device), labels.to(device)
        with _autocast(amp, device):
            logits = model(images)
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
    loss_sum, correct1, correct5, count = _all_reduce([loss_sum, correct1, correct5, count], device)
    if confusion is not None and world()[1] > 1:
        confusion = confusion.to(device)
        dist.all_reduce(confusion)
        confusion = confusion.cpu()
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
    return result


@torch.no_grad()
def predict(model: nn.Module, images: Tensor, topk: int = 5) -> tuple[Tensor, Tensor]:
    """Top-k class probabilities and indices for a batch (B, C, H, W) of normalised images."""
    model.eval()
    probs = F.softmax(model(images).float(), dim=-1)
    k = min(topk, probs.shape[-1])
    values, indices = probs.topk(k, dim=-1)  # (B, k)
    return values, indices


# -- the loop -------------------------------------------------------------------------------


@dataclass
class FitResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    best_acc1: float = -1.0
    best_epoch: int = 0
    interrupted: bool = False
    corrupt_images: int = 0


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


def save_state(path: Path, payload: dict[str, Any]) -> None:
    """Write the full training state atomically (plain tensors, dicts and numbers, so that
    `torch.load(weights_only=True)` reads it back)."""
    files.atomic_write(path, lambda f: torch.save(payload, f))


def load_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no training state {path} to resume from; start without --resume")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure: the file is unusable
        raise checkpoint.CheckpointError(
            f"cannot read the training state {path} ({type(err).__name__}: {err}); "
            "start again with --overwrite"
        ) from None


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
    progress: Callable[[Iterable, int, str], Any] | None = None,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
) -> FitResult:
    """Train `model` for `config.epochs`, validating after each epoch.

    Rank 0 writes into `out_dir` (when given): `model.safetensors` (best val top-1),
    `last.safetensors`, `metrics.jsonl`, `curves.png` and `state.pt` (the full state that
    `resume=True` continues from, written after every epoch and on a stop).

    Args:
        model: an unwrapped VisionTransformer on `config.device`.
        train_set, val_set: datasets yielding transformed (image, label).
        config: the optimisation recipe.
        out_dir: where the files go; None writes nothing (and cannot resume).
        meta: saved with each model file (class names, normalisation, ...).
        resume: continue from `out_dir/state.pt`.
        teacher: distillation teacher (with `config.distill` 'hard' or 'soft').
        stop: set it to stop cleanly; SIGINT / SIGTERM set it too.
        progress: `progress(iterable, total, description)` -> an iterable with an optional
            `set_postfix(**values)` (e.g. tqdm); None shows nothing.
        on_epoch_end: called with each epoch's metrics row.
    """
    device = torch.device(config.device)
    rank, world_size = world()
    main = rank == 0
    out = Path(out_dir) if out_dir is not None else None
    meta = dict(meta or {})
    num_classes = model.num_classes
    stop = stop if stop is not None else StopFlag()
    if config.distill != "none" and teacher is None:
        raise ValueError(f"distill={config.distill!r} needs a teacher model")
    if teacher is not None and config.distill == "none":
        raise ValueError("a teacher was given but distill='none'; choose 'hard' or 'soft'")
    if teacher is not None and getattr(model, "head_dist", None) is None:
        raise ValueError("distillation needs a student built with distilled=True")

    optimizer = torch.optim.AdamW(
        param_groups(model, config.weight_decay), lr=config.lr, betas=config.betas
    )
    scaler = torch.amp.GradScaler("cuda") if config.amp == "fp16" else None
    ema = ModelEma(model, config.ema_decay) if config.ema_decay else None
    train_loader = make_loader(
        train_set, config.batch_size, train=True, seed=config.seed, num_workers=config.num_workers
    )
    val_loader = make_loader(
        val_set, config.batch_size, train=False, num_workers=config.num_workers
    )
    sampler: ShardSampler = train_loader.sampler  # type: ignore[assignment]
    batches_per_epoch = math.ceil(len(sampler) / config.batch_size)
    steps_per_epoch = math.ceil(batches_per_epoch / config.accum_steps)
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = round(config.warmup_epochs * steps_per_epoch)

    def lr_fn(step: int) -> float:
        return lr_at(
            step,
            total_steps=total_steps,
            warmup_steps=warmup_steps,
            lr=config.lr,
            min_lr=config.min_lr,
            warmup_lr=config.warmup_lr,
        )

    result = FitResult()
    epoch, step = 0, 0
    epoch_state: EpochState | None = None
    if resume:
        if out is None:
            raise ValueError("resume=True needs out_dir")
        state = load_state(out / STATE_FILE)
        checkpoint.load_into(model, state["model"], source=str(out / STATE_FILE))
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        if ema is not None and "ema" in state:
            ema.state = {k: v.to(device) for k, v in state["ema"].items()}
        epoch, step = int(state["epoch"]), int(state["step"])
        if state.get("epoch_state"):
            epoch_state = EpochState(**state["epoch_state"])
        result.history = [json.loads(row) for row in state.get("history", [])]
        result.best_acc1 = float(state.get("best_acc1", -1.0))
        result.best_epoch = int(state.get("best_epoch", 0))
        _set_rng_state(state["rng"])
        log.info(
            "resuming from %s at epoch %d%s",
            out / STATE_FILE,
            epoch + 1,
            f", batch {epoch_state.batches + 1}" if epoch_state else "",
        )

    trained: nn.Module = _DistillForward(model) if teacher is not None else model
    if world_size > 1:
        trained = nn.parallel.DistributedDataParallel(
            trained, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        trained = torch.compile(trained)
    if teacher is not None:
        teacher.eval().requires_grad_(False)

    saved_at = (epoch, epoch_state.batches if epoch_state else 0)  # what state.pt holds

    def write_state() -> None:
        nonlocal saved_at
        if out is None or not main:
            return
        payload: dict[str, Any] = {
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "step": step,
            "epoch_state": dataclasses.asdict(epoch_state) if epoch_state else None,
            "best_acc1": result.best_acc1,
            "best_epoch": result.best_epoch,
            "history": [json.dumps(row) for row in result.history],
            "rng": _rng_state(),
            "train_config": json.dumps(config.to_dict()),
        }
        if scaler is not None:
            payload["scaler"] = scaler.state_dict()
        if ema is not None:
            payload["ema"] = {k: v.cpu() for k, v in ema.state.items()}
        save_state(out / STATE_FILE, payload)
        saved_at = (epoch, epoch_state.batches if epoch_state else 0)

    def save_mid_epoch(running: EpochState, at_step: int) -> None:
        nonlocal epoch_state, step
        epoch_state, step = running, at_step
        write_state()

    def kept() -> str:
        """The files a failed run leaves, and the point of training each holds."""
        if out is None or not main:
            return "none (no out_dir)"
        done, batches = saved_at
        if batches:
            when = f"epoch {done + 1} after batch {batches}"
        else:
            when = f"end of epoch {done}" if done else "before the first epoch"
        files = [f"{out / STATE_FILE} ({when})"]
        if result.history:
            files.append(f"{out / LAST_FILE} (epoch {result.history[-1]['epoch']})")
        return ", ".join(files)

    with _stop_on_signals(stop), _explained_failures(kept, lambda: epoch, config.lr):
        if out is not None and main:
            out.mkdir(parents=True, exist_ok=True)
            if not resume:
                write_state()  # a stop during the first epoch can still resume
        while epoch < config.epochs:
            start = time.perf_counter()
            skip = epoch_state.batches * config.batch_size if epoch_state else 0
            sampler.set_epoch(epoch, start=skip)
            bar = (
                progress(train_loader, len(train_loader), f"epoch {epoch + 1}/{config.epochs}")
                if progress
                else train_loader
            )
            postfix = getattr(bar, "set_postfix", None)

            def on_step(s: EpochState, speed: float, postfix: Any = postfix) -> None:
                if postfix is not None:
                    postfix(
                        loss=f"{s.loss_sum / max(s.samples, 1):.4f}",
                        acc=f"{s.correct / max(s.samples, 1):.3f}",
                        img_s=f"{speed:.0f}",
                    )

            epoch_state, step = train_one_epoch(
                trained,
                bar,
                optimizer,
                lr_fn=lr_fn,
                step=step,
                mixup=Mixup(
                    mixup_alpha=config.mixup,
                    cutmix_alpha=config.cutmix,
                    prob=config.mix_prob,
                    switch_prob=config.switch_prob,
                    label_smoothing=config.label_smoothing,
                    num_classes=num_classes,
                ),
                device=device,
                amp=config.amp,
                scaler=scaler,
                clip_grad=config.clip_grad,
                accum_steps=config.accum_steps,
                ema=ema,
                ema_source=model,
                teacher=teacher,
                distill=config.distill,
                distill_alpha=config.distill_alpha,
                distill_tau=config.distill_tau,
                state=epoch_state,
                stop=stop,
                on_step=on_step,
                save_every=config.save_every,
                save=save_mid_epoch,
            )
            if hasattr(bar, "close"):
                bar.close()
            if stop and epoch_state.batches < batches_per_epoch:
                result.interrupted = True
                write_state()
                log.warning(
                    "stopped (%s) in epoch %d after %d of %d batches; state saved to %s",
                    stop.signal_name,
                    epoch + 1,
                    epoch_state.batches,
                    batches_per_epoch,
                    out / STATE_FILE if out else "nowhere (no out_dir)",
                )
                break
            sums = _all_reduce(
                [epoch_state.loss_sum, epoch_state.samples, epoch_state.correct], device
            )
            val = evaluate(model, val_loader, device=device, amp=config.amp)
            row: dict[str, Any] = {
                "epoch": epoch + 1,
                "train_loss": sums[0] / max(sums[1], 1),
                "train_acc1": sums[2] / max(sums[1], 1),
                "val_loss": val["loss"],
                "val_acc1": val["acc1"],
                "val_acc5": val["acc5"],
                "lr": lr_fn(max(step - 1, 0)),
                "seconds": round(time.perf_counter() - start, 3),
            }
            if ema is not None:
                with _swapped_weights(model, ema):
                    ema_val = evaluate(model, val_loader, device=device, amp=config.amp)
                row["ema_val_acc1"] = ema_val["acc1"]
            skipped = corrupt_count(train_set)
            if skipped:
                row["skipped_images"] = skipped
            result.corrupt_images = skipped
            result.history.append(row)
            epoch += 1
            epoch_state = None
            improved = val["acc1"] >= result.best_acc1  # ties: the later epoch
            if improved:
                result.best_acc1, result.best_epoch = val["acc1"], epoch
            if out is not None and main:
                file_meta = {**meta, "epoch": epoch, "val_acc1": val["acc1"]}
                checkpoint.save(model, out / LAST_FILE, meta=file_meta)
                if improved:
                    checkpoint.save(model, out / BEST_FILE, meta=file_meta)
                if ema is not None:
                    with _swapped_weights(model, ema):
                        checkpoint.save(model, out / EMA_FILE, meta={**file_meta, "ema": True})
                _write_metrics(out / METRICS_FILE, result.history)
                write_state()
            log.info(
                "epoch %d/%d  train_loss %.4f  val_loss %.4f  val_acc1 %.4f  val_acc5 %.4f  "
                "lr %.2e  %.1fs",
                epoch,
                config.epochs,
                row["train_loss"],
                row["val_loss"],
                row["val_acc1"],
                row["val_acc5"],
                row["lr"],
                row["seconds"],
            )
            if on_epoch_end is not None:
                on_epoch_end(row)
            if stop:
                result.interrupted = epoch < config.epochs
                if result.interrupted:
                    log.warning(
                        "stopped (%s) after epoch %d; state saved to %s",
                        stop.signal_name,
                        epoch,
                        out / STATE_FILE if out else "nowhere",
                    )
                break
        if out is not None and main and result.history:
            from ..explain import plot_curves

            plot_curves(result.history, out / CURVES_FILE)
    return result


@contextlib.contextmanager
def _explained_failures(
    kept: Callable[[], str], epoch: Callable[[], int], lr: float
) -> Iterator[None]:
    """Turn a NaN loss or a full disk during `fit` into one line that says which files the
    run kept and what to do next."""
    try:
        yield
    except NonFiniteLossError as err:
        raise NonFiniteLossError(
            f"training loss is {err.loss} at step {err.step} (epoch {epoch() + 1}, batch "
            f"{err.batch}); the run stopped and kept its last good files: {kept()}. Lower the "
            f"learning rate (e.g. --lr {lr / 10:.3g}, a tenth of this run's {lr:.3g}) or clip "
            "gradients (--clip-grad 1.0), and start a new run",
            step=err.step,
            batch=err.batch,
            loss=err.loss,
        ) from err
    except files.DiskFullError as err:
        raise files.DiskFullError(err.path, err.existed, "continue with --resume") from err


@contextlib.contextmanager
def _swapped_weights(model: nn.Module, ema: ModelEma) -> Iterator[None]:
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ema.copy_to(model)
    try:
        yield
    finally:
        model.load_state_dict(saved)


def _write_metrics(path: Path, history: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(row) + "\n" for row in history)
    files.atomic_write(path, lambda f: f.write(text), mode="w")
