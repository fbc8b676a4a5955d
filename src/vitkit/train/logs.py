"""Where a run's numbers go: one row per epoch in `metrics.jsonl`, and a log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..files import atomic_write

log = logging.getLogger(__name__)


def write_metrics(path: Path, history: list[dict[str, Any]]) -> None:
    """`metrics.jsonl`: one JSON object per epoch, rewritten whole (atomically)."""
    text = "".join(json.dumps(row) + "\n" for row in history)
    atomic_write(path, lambda f: f.write(text), mode="w")


def log_epoch(row: dict[str, Any], epochs: int) -> None:
    log.info(
        "epoch %d/%d  train_loss %.4f  val_loss %.4f  val_acc1 %.4f  val_acc5 %.4f  lr %.2e  %.1fs",
        row["epoch"],
        epochs,
        row["train_loss"],
        row["val_loss"],
        row["val_acc1"],
        row["val_acc5"],
        row["lr"],
        row["seconds"],
    )
