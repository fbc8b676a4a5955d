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


def log_epoch(row: dict[str, Any], epochs: int, keys: tuple[str, ...]) -> None:
    """One line per epoch: `keys` of the row (the task's), the learning rate and the time."""
    values = "  ".join(f"{key} {row[key]:.4f}" for key in keys if key in row)
    log.info("epoch %d/%d  %s  lr %.2e  %.1fs", row["epoch"], epochs, values, row["lr"],
             row["seconds"])  # fmt: skip
