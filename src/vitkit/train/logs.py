"""Where a run's numbers go: one row per epoch in `metrics.jsonl` and `metrics.csv` (for a
spreadsheet), optionally TensorBoard (the `loggers` option, `--log tensorboard`, through
`torch.utils.tensorboard` when the `tensorboard` package is installed: every number of the row
as a scalar per epoch), and a log line."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..files import atomic_write
from .config import LOGGERS
from .run_folder import CSV_FILE, METRICS_FILE, TENSORBOARD_DIR

log = logging.getLogger(__name__)


class LoggerUnavailableError(ValueError):
    """A logger was asked for whose package is not installed."""


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse an unknown logger, or one whose package is missing, before anything runs."""
    for name in loggers:
        if name not in LOGGERS:
            raise ValueError(f"unknown logger {name!r}; expected one of {', '.join(LOGGERS)}")
    if "tensorboard" in loggers:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise LoggerUnavailableError(
                "logging to tensorboard needs the tensorboard package, which is not installed: "
                "pip install tensorboard (or pip install 'vitkit[tensorboard]')"
            ) from None


class EpochLog:
    """The epoch rows of a run folder: `metrics.jsonl` and `metrics.csv` rewritten whole
    (atomically) after each epoch, and each new row to TensorBoard when asked."""

    def __init__(self, out: Path, loggers: Sequence[str] = ()) -> None:
        check_loggers(loggers)
        self.out = out
        self.writer = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(out / TENSORBOARD_DIR))

    def write(self, history: list[dict[str, Any]]) -> None:
        write_metrics(self.out / METRICS_FILE, history)
        write_csv(self.out / CSV_FILE, history)
        if self.writer is not None and history:
            row = history[-1]
            for key, value in row.items():
                if key != "epoch" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, row["epoch"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_metrics(path: Path, history: list[dict[str, Any]]) -> None:
    """`metrics.jsonl`: one JSON object per epoch."""
    text = "".join(json.dumps(row) + "\n" for row in history)
    atomic_write(path, lambda f: f.write(text), mode="w")


def write_csv(path: Path, history: list[dict[str, Any]]) -> None:
    """`metrics.csv`: a header of every metric any epoch has (in order of appearance), one line
    per epoch, empty where an epoch lacks a metric."""
    columns = list(dict.fromkeys(key for row in history for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    text = buffer.getvalue()
    atomic_write(path, lambda f: f.write(text), mode="w")


def log_epoch(row: dict[str, Any], epochs: int, keys: tuple[str, ...]) -> None:
    """One line per epoch: `keys` of the row (the task's), the learning rate and the time."""
    values = "  ".join(f"{key} {row[key]:.4f}" for key in keys if key in row)
    log.info(
        "epoch %d/%d  %s  lr %.2e  %.1fs", row["epoch"], epochs, values, row["lr"], row["seconds"]
    )
