"""Dynamic batching: images of concurrent requests wait in one bounded queue and go through
the model together, up to `max_batch` at a time, the first waiting at most `max_wait_ms` for
others (as TorchServe's `batch_size` / `max_batch_delay` and Triton's dynamic batcher do), and
only while another request is on its way (`arriving`: its body being read, its images
decoded): a client alone never waits for company that is not coming.
Each image gets its own result back; a full queue refuses new work at once (`QueueFull`)
instead of growing memory. The model runs on one thread of its own, so the event loop keeps
accepting and decoding while a batch computes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from ..options import AT_LEAST_ONE, Options, Range, option

log = logging.getLogger(__name__)

T = TypeVar("T")


# The largest batch: the warm-up runs every power of two up to it, so a slip such as
# --max-batch 1000000000000 would allocate that many images before the first request.
MAX_BATCH = 4096


@dataclass(frozen=True, kw_only=True)
class Batching(Options):
    """How requests are batched (each value checked when built, as every `Options`)."""

    GROUPS: ClassVar[dict[str, str]] = {"batching": "batching"}

    max_batch: int = option(16, "images per forward pass, gathered from concurrent requests; "
                            "1 turns batching off", range=Range(1, MAX_BATCH), metavar="N",
                            group="batching")  # fmt: skip
    max_wait_ms: float = option(5.0, "how long the first image of a batch waits for others, "
                                "in milliseconds", range=Range(0, 10_000), metavar="T",
                                group="batching")  # fmt: skip
    max_queue: int = option(256, "images waiting at most; beyond, requests get 503 with "
                            "Retry-After", range=AT_LEAST_ONE, metavar="N",
                            group="batching")  # fmt: skip


class QueueFull(Exception):
    """The queue has no room for a request's images."""


class Arrival:
    """A request on its way to the queue (`Batcher.arriving`), until it submits or fails."""

    def __init__(self) -> None:
        self.counted = True


@dataclass
class _Item:
    image: Tensor  # (C, H, W)
    topk: int
    done: asyncio.Future


class Batcher:
    """Runs `run(images (B, C, H, W), topk per image) -> one result per image` on batches of
    queued images. `start` and `stop` in the event loop that serves the requests."""

    def __init__(
        self,
        run: Callable[[Tensor, list[int]], Sequence[Any]],
        batching: Batching,
        *,
        on_batch: Callable[[int, float], None] | None = None,
        on_queue: Callable[[int], None] | None = None,
    ) -> None:
        self.run = run
        self.batching = batching
        self.on_batch = on_batch  # (images, seconds) after each forward pass, e.g. metrics
        self.on_queue = on_queue or (lambda waiting: None)  # images waiting, when it changes
        self.batch_sizes: Counter[int] = Counter()  # batch size -> forward passes
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task | None = None
        self._arriving = 0  # requests on their way to submit (`arriving`)
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="vitkit-model")

    async def start(self) -> None:
        self._queue = asyncio.Queue(self.batching.max_queue)
        self._task = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        """End the batching loop (after the server has answered its requests in flight)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._model_thread.shutdown(wait=True)

    @property
    def waiting(self) -> int:
        """Images in the queue now."""
        return self._queue.qsize() if self._queue is not None else 0

    @contextlib.contextmanager
    def arriving(self) -> Iterator[Arrival]:
        """A request on its way: the batch being gathered waits for it (up to `max_wait_ms`)
        until it submits (pass the arrival to `submit`) or leaves the block."""
        arrival = Arrival()
        self._arriving += 1
        try:
            yield arrival
        finally:
            self._arrived(arrival)

    def _arrived(self, arrival: Arrival) -> None:
        if arrival.counted:
            arrival.counted = False
            self._arriving -= 1

    async def submit(
        self, images: Sequence[Tensor], topk: int, arrival: Arrival | None = None
    ) -> list[Any]:
        """The results of `images`, each computed in whatever batch it joined; `QueueFull`
        (nothing queued) when the queue cannot take them all."""
        if arrival is not None:
            self._arrived(arrival)
        if self._queue is None:
            raise RuntimeError("the batcher is not started; call start() in the serving loop")
        if self.waiting + len(images) > self.batching.max_queue:
            raise QueueFull(
                f"{self.waiting} images are waiting (the queue holds at most "
                f"{self.batching.max_queue})"
            )
        loop = asyncio.get_running_loop()
        items = [_Item(image, topk, loop.create_future()) for image in images]
        for item in items:
            self._queue.put_nowait(item)
        self.on_queue(self.waiting)
        return list(await asyncio.gather(*(item.done for item in items)))

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the model's thread (e.g. an explanation), between batches."""
        return await asyncio.get_running_loop().run_in_executor(self._model_thread, function, *args)

    async def _serve(self) -> None:
        assert self._queue is not None
        while True:
            batch = await self._gather(self._queue)
            self.on_queue(self.waiting)
            if not batch:  # every request of it gave up (timed out, client gone)
                continue
            self.batch_sizes[len(batch)] += 1
            started = time.perf_counter()
            try:
                images = torch.stack([item.image for item in batch])  # (B, C, H, W)
                results = await self.call(self.run, images, [item.topk for item in batch])
            except Exception as err:  # each request answers the error; the loop goes on
                log.exception("a batch of %d failed", len(batch))
                for item in batch:
                    if not item.done.done():
                        item.done.set_exception(err)
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - started)
            for item, result in zip(batch, results):
                if not item.done.done():  # its client may have gone
                    item.done.set_result(result)

    async def _gather(self, queue: asyncio.Queue[_Item]) -> list[_Item]:
        """The next batch: the first image, then others until `max_batch`, or `max_wait_ms`,
        or none is queued and no request is on its way."""
        batch = [await queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batching.max_wait_ms / 1000
        while len(batch) < self.batching.max_batch:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            if self._arriving == 0:  # nobody else is coming: no use waiting
                break
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), left))
            except (TimeoutError, asyncio.TimeoutError):
                break
        return [item for item in batch if not item.done.done()]  # not those that gave up

    async def warm_up(self, image: Tensor, sizes: Sequence[int]) -> None:
        """One forward pass of each batch size in `sizes`, of copies of `image` (C, H, W), so
        that no request pays for the first passes (allocations, kernels chosen per shape)."""
        for size in sizes:
            images = image.expand(size, *image.shape).contiguous()  # (B, C, H, W)
            await self.call(self.run, images, [1] * size)


def warm_up_sizes(max_batch: int) -> list[int]:
    """The batch sizes warmed up before the server is ready: the powers of two up to
    `max_batch`, and `max_batch` itself."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    return sizes if sizes[-1] == max_batch else [*sizes, max_batch]
