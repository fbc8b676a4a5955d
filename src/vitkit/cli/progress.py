"""Progress a user can see while a command works: a tqdm bar when stderr is a terminal, else
(a log file, a pipe, a notebook cell) a plain line every so often; nothing with `--quiet` or
on a torchrun rank other than 0. The library takes it as a `progress(iterable, total,
description)` callable and never prints itself."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from .errors import UserError

if TYPE_CHECKING:
    from ..train.fit import Progress

EVERY_S_VARIABLE = "VITKIT_PROGRESS_EVERY_S"
EVERY_S = 30.0  # seconds between two lines in a log; the first comes after a third of it


def progress(
    quiet: bool = False,
    *,
    batch_size: int | None = None,
    unit: str = "batches",
    stream: TextIO | None = None,
    every_s: float | None = None,
) -> Progress:
    """The progress of a command's loops: called as `progress(iterable, total, description)`,
    it returns the iterable wrapped in a tqdm bar when `stream` (default stderr) is a
    terminal, in `Lines` otherwise, and as it is with `quiet` or on a rank other than 0.
    `batch_size` gives images/s where the loop does not report it; `unit` names the items
    (batches, steps); `every_s` (default: $VITKIT_PROGRESS_EVERY_S, else 30) spaces the
    lines."""
    every = every_seconds() if every_s is None else every_s
    if quiet or _rank() != 0:
        quiet_datasets()

    def show(iterable: Iterable, total: int, description: str) -> Any:
        out = stream or sys.stderr
        if quiet or _rank() != 0:
            return iterable
        if _is_terminal(out):
            from tqdm import tqdm

            return tqdm(
                iterable,
                total=total,
                desc=description,
                leave=False,
                dynamic_ncols=True,
                file=out,
            )
        return Lines(
            iterable,
            total,
            description,
            stream=out,
            every_s=every,
            batch_size=batch_size,
            unit=unit,
        )

    return show


def quiet_datasets() -> None:
    """Hugging Face datasets draws bars of its own ('Generating train split', 'Loading dataset
    shards'): silence them too, whether `datasets` is imported yet or later."""
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # read when datasets is imported
    datasets = sys.modules.get("datasets")
    if datasets is not None and hasattr(datasets, "disable_progress_bars"):
        datasets.disable_progress_bars()


def every_seconds() -> float:
    """The seconds between two progress lines: $VITKIT_PROGRESS_EVERY_S, else `EVERY_S`."""
    text = os.environ.get(EVERY_S_VARIABLE, "").strip()
    if not text:
        return EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:  # NaN too
        raise UserError(
            f"{EVERY_S_VARIABLE}={text!r} is not a number of seconds >= 0; set it to e.g. 30, "
            "or unset it"
        )
    return value


class Lines:
    """`iterable` that writes a line to `stream` while it is consumed: after a third of
    `every_s`, then every `every_s` seconds (time-based, so a fast loop does not flood a log):
    `epoch 3/10: 120/400 batches, loss 0.4123, 14.2 img/s, about 3 min left`. It reads only
    the clock (no random state, no change to the order of the items)."""

    def __init__(
        self,
        iterable: Iterable,
        total: int,
        description: str,
        *,
        stream: TextIO,
        every_s: float = EVERY_S,
        batch_size: int | None = None,
        unit: str = "batches",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.iterable, self.total, self.description = iterable, total, description
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self.batch_size, self.unit = batch_size, unit
        self.done = 0
        self.values: dict[str, Any] = {}

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[Any]:
        start, self.done = self.clock(), 0  # iterated again (a second pass): counted again
        due = start + self.every_s / 3
        for item in self.iterable:
            yield item
            self.done += 1  # the consumer asked for the next item: this one is done
            now = self.clock()
            if now >= due:
                self.stream.write(self.line(now - start) + "\n")
                self.stream.flush()
                due = now + self.every_s

    def set_postfix(self, **values: Any) -> None:
        """The loop's own numbers (tqdm's name): shown in the next line; `img_s` as img/s."""
        self.values = values

    def close(self) -> None:
        """Nothing to clear (tqdm's name)."""

    def line(self, elapsed: float) -> str:
        """The line after `elapsed` seconds with `done` of `total` items."""
        values = dict(self.values)
        speed = values.pop("img_s", None)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if speed is None and self.batch_size:
            speed = f"{rate * self.batch_size:.1f}"
        parts = [f"{self.done}/{self.total} {self.unit}"]
        parts += [f"{key} {value}" for key, value in values.items()]
        if speed is not None:
            parts.append(f"{speed} img/s")
        if rate > 0 and self.done < self.total:
            parts.append(f"about {duration((self.total - self.done) / rate)} left")
        return f"{self.description}: {', '.join(parts)}"


def duration(seconds: float) -> str:
    """A time left as a person says it: '40 s', '3 min', '2 h 5 min'."""
    if seconds < 60:
        return f"{max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _rank() -> int:
    """This process's torchrun rank: the process group's, else $RANK (set by torchrun before
    the group is joined), else 0."""
    from ..train.distributed import world

    rank, size = world()
    if size > 1:
        return rank
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0
