"""The run folder: the names of the files a run writes, taking a folder for a run (refusing
to overwrite one silently), clearing a previous run's files, and the record `config.json`.

One writer per folder: `prepare_out` checks and creates it, then the caller takes the run lock
(`lock.py`) and calls `clear_out`, which removes only what vitkit wrote there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from .. import __version__
from ..files import atomic_write, remove_stale_temp_files
from .config import TrainConfig
from .distributed import world

if TYPE_CHECKING:
    from .state import RunState

STATE_FILE = "state.pt"
BEST_FILE = "model.safetensors"
LAST_FILE = "last.safetensors"
EMA_FILE = "ema.safetensors"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
TEST_FILE = "test.json"
CONFIG_FILE = "config.json"
RUN_FILES = (
    STATE_FILE, BEST_FILE, LAST_FILE, EMA_FILE, METRICS_FILE, CONFIG_FILE, CURVES_FILE, TEST_FILE,
)  # fmt: skip


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked (exists, missing, not writable)."""


def default_out(data: str, model: str, name: str | None = None) -> Path:
    """`runs/<name>`, by default `runs/<data>-<model>`."""
    return Path("runs") / (name or f"{Path(data).name}-{model}")


def prepare_out(
    out: Path,
    *,
    resume: bool,
    overwrite: bool,
    files: tuple[str, ...] = RUN_FILES,
    state: str = STATE_FILE,
) -> None:
    """Refuse to overwrite a run silently; check that `out` is writable and create it. Nothing
    is removed here: `clear_out` does that under the run lock. `files` are what the run
    writes, `state` the file `--resume` continues from (`vitkit pretrain` has its own)."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    held = [name for name in files if (out / name).exists()]
    if resume:
        if not (out / state).is_file():
            raise RunFolderError(
                f"--resume: {out} holds no training state ({state}), the run stopped "
                "before it began; start it again with --overwrite"
            )
        return
    if held and not overwrite:
        raise RunFolderError(
            f"{out} already holds a run ({', '.join(held)}); pass --resume to continue it or "
            "--overwrite to replace it"
        )
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".vitkit-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise RunFolderError(f"--out {out} is not writable ({err.strerror or err})") from None


def clear_out(out: Path, *, overwrite: bool, files: tuple[str, ...] = RUN_FILES) -> None:
    """Remove what a killed write left (temporary files) and, with `overwrite`, the previous
    run's `files` (nothing else of the folder's). Call it holding the run lock."""
    if overwrite:
        for name in files:
            (out / name).unlink(missing_ok=True)
    remove_stale_temp_files(out)


def write_record(
    out: Path, config: TrainConfig, model: nn.Module, meta: dict, world_size: int
) -> None:
    """`config.json`: the settings (what `--config` and `--resume` read back), the model's
    config, the metadata and the versions."""
    record = {
        "settings": {k: v for k, v in config.to_dict().items() if k != "device"},
        "model": model.config.to_dict() if hasattr(model, "config") else model.vitkit_timm,
        "meta": meta,
        "world_size": world_size,
        "vitkit_version": __version__,
        "torch_version": torch.__version__,
    }
    text = json.dumps(record, indent=2) + "\n"
    atomic_write(out / CONFIG_FILE, lambda f: f.write(text), mode="w")


def kept_files(state: RunState) -> str:
    """The files a failed run leaves, and the point of training each holds."""
    if state.out is None or world()[0] != 0:
        return "none (no out_dir)"
    done, batches = state.saved_at
    if batches:
        when = f"epoch {done + 1} after batch {batches}"
    else:
        when = f"end of epoch {done}" if done else "before the first epoch"
    files = [f"{state.out / STATE_FILE} ({when})"]
    if state.history:
        files.append(f"{state.out / LAST_FILE} (epoch {state.history[-1]['epoch']})")
    return ", ".join(files)
