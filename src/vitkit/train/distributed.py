"""Several processes (torchrun): joining the group, sharding the data, reducing metrics.

Each rank trains on its share of a per-epoch shuffled order (`ShardSampler`, as PyTorch's
DistributedSampler), DistributedDataParallel averages the gradients, metrics are summed across
ranks, and rank 0 alone writes files. Outside torchrun every function is the one-process case.

A reduction returns only once gloo's worker thread has let go of its tensor (`all_reduce_tensor`):
the worker drops its reference just after the result is ready, and if that was the last one it
frees the Python tensor, which needs the GIL; at interpreter exit that aborts the process
("terminate called without an active exception", SIGABRT). `destroy_process_group` does not
stop the workers once DistributedDataParallel has used the group, so the last reduction of a
run (the test split's) could meet the exit of a rank with nothing left to do.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from ..data import SeededItems, StreamPart, as_stream, collate, is_stream
from .signals import QuietWorkersLoader


def world() -> tuple[int, int]:
    """(rank, world_size); (0, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(values: list[float], device: torch.device) -> list[float]:
    if world()[1] == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    return all_reduce_tensor(tensor).tolist()


def all_reduce_tensor(tensor: torch.Tensor, *, wait_s: float = 1.0) -> torch.Tensor:
    """Sum `tensor` across ranks in place; with gloo, returns once its worker thread holds no
    reference to the tensor (at most `wait_s` later: it lets go microseconds after the result
    is ready), so that the tensor dies with its Python owner."""
    dist.all_reduce(tensor)
    if dist.get_backend() == "gloo":
        deadline = time.monotonic() + wait_s
        while _other_references(tensor) and time.monotonic() < deadline:
            time.sleep(1e-4)
    return tensor


def _other_references(tensor: torch.Tensor) -> bool:
    """Whether C++ code besides this Python tensor holds it. Reads the private
    `Tensor._use_count`; where a torch lacks it, False (the reduction returns at once)."""
    use_count = getattr(tensor, "_use_count", None)
    return callable(use_count) and use_count() > 1


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
    """A loader over this rank's shard: shuffled and padded for training, in order for eval.

    A training loader's items are `SeededItems`: their augmentations depend on (seed, epoch,
    index) only, not on `num_workers` or on where a resumed epoch starts; `set_epoch` moves
    the loader to an epoch. Its workers are started anew each epoch (not persistent), each
    with a copy of the dataset at that epoch. A stream (an IterableDataset with a length
    hint) is read through `StreamPart`: this rank's part, split between the workers,
    shuffled through a seeded buffer for training.
    """
    rank, size = world()
    if is_stream(dataset):
        part = StreamPart(
            as_stream(dataset),
            train=train,
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=size,
        )
        return QuietWorkersLoader(
            part,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(seed),
        )
    sampler = ShardSampler(
        len(dataset), shuffle=train, seed=seed, rank=rank, world_size=size, pad=train
    )
    return QuietWorkersLoader(
        SeededItems(dataset, seed=seed) if train else dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        drop_last=False,
        # its own generator: creating an iterator then draws no number from the global one,
        # so a run resumed in mid-epoch sees the same random stream
        generator=torch.Generator().manual_seed(seed),
    )


def set_epoch(loader: DataLoader, epoch: int, *, start: int = 0) -> None:
    """Point a training loader of `make_loader` at `epoch`: that epoch's shuffled order, after
    the `start` samples this rank has seen of it (a resumed epoch), and that epoch's
    augmentation seeds."""
    if isinstance(loader.dataset, StreamPart):
        loader.dataset.set_epoch(epoch, start=start)
        return
    loader.sampler.set_epoch(epoch, start=start)
    if isinstance(loader.dataset, SeededItems):
        loader.dataset.set_epoch(epoch)


@contextlib.contextmanager
def distributed(device: str, *, alone: bool = False) -> Iterator[str]:
    """Joined to the torchrun group for the block (`init_distributed`), left at its end, however
    it ends, when this block joined it; yields this process's device. `alone`: a group of one
    outside torchrun too (FSDP shards over a group, even of one process)."""
    joins = not (dist.is_available() and dist.is_initialized())
    formats = [(handler, handler.formatter) for handler in logging.getLogger().handlers]
    device = init_distributed(device, alone=alone)
    try:
        yield device
    finally:
        if joins and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
            for handler, formatter in formats:  # the rank's name leaves the log lines too
                handler.setFormatter(formatter)


def init_distributed(device: str, *, alone: bool = False) -> str:
    """Join the torchrun group when launched by it (with `alone`, a group of this process
    alone otherwise); returns this process's device. Under torchrun every log line then
    starts with the rank that wrote it, and ranks but 0 log warnings only."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if dist.is_initialized() or not (launched or alone):
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if not launched:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return device
    dist.init_process_group(backend=backend)
    name_rank_in_logs(dist.get_rank(), dist.get_world_size())
    if dist.get_rank() != 0:
        logging.getLogger().setLevel(logging.WARNING)
    return device


def name_rank_in_logs(rank: int, world_size: int) -> None:
    """Start each line of the root logger's handlers with `[rank R/N]` (R the global rank;
    with several machines, node K too)."""
    node = os.environ.get("GROUP_RANK")
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    where = f" node {node}" if node is not None and nodes > 1 else ""
    for handler in logging.getLogger().handlers:
        fmt = handler.formatter._fmt if handler.formatter else "%(message)s"
        if not fmt.startswith("[rank "):
            handler.setFormatter(logging.Formatter(f"[rank {rank}/{world_size}{where}] {fmt}"))


def agreed_stop(stop: Any, device: torch.device) -> bool:
    """Whether any rank was told to stop (a signal reaches each process at its own moment);
    every rank then sets its `stop`, so all stop at the same step and save together."""
    if world()[1] == 1 or not (dist.is_available() and dist.is_initialized()):
        return bool(stop)
    if all_reduce([float(bool(stop))], device)[0] > 0:
        if not stop:
            stop.set("a stop on another rank")
        return True
    return False


def barrier() -> None:
    """Wait for every rank (nothing to wait for in one process)."""
    if world()[1] > 1:
        dist.barrier()
