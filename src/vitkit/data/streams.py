"""Sources read in order (streams): an `IterableDataset` with a length hint, as webdataset's
shards or Hugging Face's streaming datasets are read.

A stream source subclasses `StreamSource`: `__iter__` yields (image, label) items in the
source's own order, `__len__` says about how many (the hint that sizes an epoch), and `part`
may read one part of the source alone (a reader of shards reads only its own shards; the
default takes every `count`-th item). The engine never indexes a stream: `StreamPart` gives
each rank, and each loader worker within it, its own part of a training epoch, shuffled
through a seeded buffer, and resumes an epoch by the samples already seen.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .datasets import Subset, Transformed, item_seed, seeded
from .images import DataError

SHUFFLE_BUFFER = 1024  # items a training stream is shuffled through (webdataset's default)


class StreamSource(IterableDataset):
    """A source read in order. Subclasses give `__iter__` and `__len__` (a hint: an epoch
    of training reads `len(self)` items, wrapping around a source that ends sooner).

    The engine reads raw items through `part` and makes each it keeps an (image, label)
    with `apply` (a reader may leave decoding to it, so that what is dropped is never
    decoded); by default the raw items are those of `__iter__` and `apply` keeps them.

    Attributes:
        shuffle_buffer: how many items a training epoch is shuffled through.
    """

    shuffle_buffer = SHUFFLE_BUFFER

    def __len__(self) -> int:
        raise NotImplementedError

    def part(self, index: int, count: int) -> Iterator[Any]:
        """The raw items of part `index` of `count` (disjoint parts covering the source):
        every `count`-th item by default; a reader of shards overrides it to read its own."""
        return itertools.islice(iter(self), index, None, count)

    def apply(self, item: Any) -> Any:
        """An item as the dataset yields it, from a raw item of `part` (a transform)."""
        return item


class TransformedStream(StreamSource):
    """`stream` with `transform` applied to each image (None items, unreadable ones, pass)."""

    def __init__(self, stream: StreamSource, transform: Callable[[Any], Any] | None) -> None:
        self.dataset = stream  # the name `unreadable_files` follows
        self.transform = transform
        self.shuffle_buffer = stream.shuffle_buffer

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        return map(self.apply, self.part(0, 1))

    def part(self, index: int, count: int) -> Iterator[Any]:
        return self.dataset.part(index, count)

    def apply(self, item: Any) -> Any:
        item = self.dataset.apply(item)
        if item is None or self.transform is None:
            return item
        return self.transform(item[0]), item[1]


class LimitedStream(StreamSource):
    """The first `limit` items of `stream` (`train_limit`)."""

    def __init__(self, stream: StreamSource, limit: int) -> None:
        self.dataset, self.limit = stream, limit
        self.shuffle_buffer = stream.shuffle_buffer

    def __len__(self) -> int:
        return min(self.limit, len(self.dataset))

    def __iter__(self) -> Iterator[Any]:
        return map(self.apply, self.part(0, 1))

    def part(self, index: int, count: int) -> Iterator[Any]:
        first = itertools.islice(self.dataset.part(0, 1), self.limit)
        return itertools.islice(first, index, None, count)

    def apply(self, item: Any) -> Any:
        return self.dataset.apply(item)


def is_stream(dataset: Dataset) -> bool:
    """Whether `dataset` is read in order (an IterableDataset) rather than by index."""
    return isinstance(dataset, IterableDataset)


def transformed(dataset: Dataset, transform: Callable[[Any], Any] | None) -> Dataset:
    """`dataset` with `transform` applied to its images, map-style or a stream."""
    if is_stream(dataset):
        return TransformedStream(as_stream(dataset), transform)
    return Transformed(dataset, transform)


def limited(dataset: Dataset, limit: int, seed: int) -> Dataset:
    """At most `limit` items of `dataset`: a seeded random choice of a map-style one (kept in
    order), the first `limit` of a stream."""
    if is_stream(dataset):
        return LimitedStream(as_stream(dataset), limit)
    if limit >= len(dataset):
        return dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    return Subset(dataset, sorted(order[:limit].tolist()))


def as_stream(dataset: IterableDataset) -> StreamSource:
    """A `StreamSource` of any IterableDataset with a length hint."""
    if isinstance(dataset, StreamSource):
        return dataset
    try:
        len(dataset)
    except TypeError:
        raise TypeError(
            f"{type(dataset).__name__} is an IterableDataset without a length hint; give it "
            "__len__ (about how many items an epoch reads) or subclass data.StreamSource"
        ) from None
    return _Wrapped(dataset)


class _Wrapped(StreamSource):
    def __init__(self, dataset: IterableDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)


def first_items(dataset: Dataset, count: int) -> list[Any]:
    """The first `count` items of a map-style dataset or a stream (e.g. images to draw)."""
    if is_stream(dataset):
        return list(itertools.islice(iter(dataset), count))
    return [dataset[i] for i in range(min(count, len(dataset)))]


class StreamPart(IterableDataset):
    """What one rank's loader reads of a stream.

    Evaluation: every `world_size`-th item from the rank's on, split again between the
    loader's workers, in the stream's order.

    Training: an epoch is `ceil(len(stream) / world_size)` items on every rank (equal steps;
    a rank whose part ends sooner starts it again). The rank's part is split between its
    loader workers by batch (worker `w` of `W` makes batches `w, w + W, ...`, the loader's
    round-robin order), each worker taking the items of its batches' places in the part's
    order (every `W`-th block of a batch) through its own buffer, shuffled with (seed, epoch,
    rank, worker). Each item's augmentation is seeded from
    (seed, epoch, its place in the rank's epoch), as `SeededItems` seeds a map-style item.
    `set_epoch(epoch, start)` resumes after `start` samples: the workers' roles rotate so
    that the next batch comes first, and each reads its part again up to where it was,
    dropping (untransformed) what it had given. The order depends on the number of workers:
    a resumed run repeats the uninterrupted one bit for bit with the same `workers`.
    """

    def __init__(
        self,
        stream: StreamSource,
        *,
        train: bool,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.dataset = stream
        self.train, self.batch_size, self.seed = train, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start = 0
        self.per_rank = math.ceil(len(stream) / world_size)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch to read, after `start` samples of it (a whole number of batches)."""
        if start % self.batch_size:
            raise ValueError(f"start {start} is not a whole number of {self.batch_size}-batches")
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        if self.train:
            return max(self.per_rank - self.start, 0)
        return len(range(self.rank, len(self.dataset), self.world_size))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        stream = self.dataset
        if not self.train:
            items = itertools.islice(stream.part(self.rank, self.world_size), worker, None, workers)
            return map(stream.apply, items)
        return self._training(workers, worker)

    def _training(self, workers: int, worker: int) -> Iterator[Any]:
        stream, size = self.dataset, self.batch_size
        batches = math.ceil(self.per_rank / size)
        done = self.start // size
        lane = (worker + done) % workers  # the worker that made batch `done` goes first
        mine = range(lane, batches, workers)
        places = [k * size + j for k in mine for j in range(min(size, self.per_rank - k * size))]
        epoch = itertools.islice(_cycled(stream, self.rank, self.world_size), self.per_rank)
        raw = (item for place, item in enumerate(epoch) if (place // size) % workers == lane)
        order = random.Random(item_seed(self.seed, self.epoch, -1 - self.rank * workers - lane))
        first = self.rank * self.per_rank  # each rank's places are its own
        for place, item in zip(places, _buffered(raw, stream.shuffle_buffer, order), strict=True):
            if place < self.start:
                continue
            with seeded(item_seed(self.seed, self.epoch, first + place)):
                yield stream.apply(item)


def _cycled(stream: StreamSource, index: int, count: int) -> Iterator[Any]:
    """Part `index` of `count` of `stream`, read again from its start whenever it ends."""
    while True:
        empty = True
        for item in stream.part(index, count):
            empty = False
            yield item
        if empty:
            raise DataError(
                f"part {index} of {count} of the stream {type(stream).__name__} is empty; "
                "train on fewer processes or on more data"
            )


def _buffered(items: Iterator[Any], size: int, order: random.Random) -> Iterator[Any]:
    """`items` shuffled through a buffer of `size`: each new item takes the place of one
    drawn at random, which is given (webdataset's `shuffle`)."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = order.randrange(size)
        buffer[i], item = item, buffer[i]
        yield item
    order.shuffle(buffer)
    yield from buffer
