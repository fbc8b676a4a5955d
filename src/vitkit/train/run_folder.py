"""The run folder: the names of the files a run writes, taking a folder for a run (refusing
to overwrite one silently), clearing a previous run's files, and the record `config.json`.

One writer per folder: `prepare_out` checks and creates it, then the caller takes the run lock
(`lock.py`) and calls `clear_out`, which removes only what vitkit wrote there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..files import (
    SpecialFileError,
    atomic_write,
    file_kind,
    remove_stale_temp_files,
    require_regular,
)
from ..options import read_settings
from .config import PretrainConfig, TrainConfig
from .distributed import barrier, distributed, world
from .lock import run_lock
from .sharded import sharded_folders

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
BEST_FILE = "model.safetensors"
LAST_FILE = "last.safetensors"
EMA_FILE = "ema.safetensors"
METRICS_FILE = "metrics.jsonl"
CSV_FILE = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
CURVES_FILE = "curves.png"
TEST_FILE = "test.json"
CONFIG_FILE = "config.json"
ENCODER_FILE = "encoder.safetensors"
PICTURE_FILE = "reconstructions.png"
# The files of a run, of each job.
RUN_FILES = (
    STATE_FILE, BEST_FILE, LAST_FILE, EMA_FILE, METRICS_FILE, CSV_FILE, CONFIG_FILE, CURVES_FILE,
    TEST_FILE,
)  # fmt: skip
PRETRAIN_FILES = (
    STATE_FILE, METRICS_FILE, CSV_FILE, CONFIG_FILE, CURVES_FILE, ENCODER_FILE, PICTURE_FILE,
)  # fmt: skip
# Everything vitkit writes into a run folder: what --overwrite removes, and nothing else. The
# files of both jobs, the state file of vitkit 0.1's pretraining, what `vitkit eval` writes
# beside a checkpoint (globs), and TensorBoard's event files in their folder.
_ALL_RUN_FILES = tuple(dict.fromkeys((*RUN_FILES, *PRETRAIN_FILES, "mae_state.pt")))
EVAL_FILES = ("confusion*.png", "per_class*.png", "eval*.json")
TENSORBOARD_FILES = "events.out.tfevents.*"


def run_files(out: Path) -> list[str]:
    """The names of the run files `out` holds, sorted."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name in _ALL_RUN_FILES)


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
    """Refuse to overwrite a run silently; check that `out` is writable and create it, and
    that whatever there has the name of a file vitkit writes is a regular file (a FIFO,
    device, socket, folder or link is refused: it is never removed or replaced). Nothing is
    removed here: `clear_out` does that under the run lock. `files` are what the run writes,
    `state` the file a resumed run continues from."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    held = [name for name in files if os.path.lexists(out / name)]
    if resume:
        if not (out / state).is_file():
            raise RunFolderError(
                f"--resume: {out} holds no training state ({state}), the run stopped "
                "before it began; start it again with --overwrite"
            )
        vitkit_files(out)  # the run replaces them
        return
    if held and not overwrite:
        raise RunFolderError(
            f"{out} already holds a run ({', '.join(held)}); pass --resume to continue it or "
            "--overwrite to replace it"
        )
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out} exists and is not a folder")
    if overwrite:
        vitkit_files(out)  # before the run lock is taken: nothing is removed yet
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".vitkit-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise RunFolderError(f"--out {out} is not writable ({err.strerror or err})") from None


def vitkit_files(out: Path) -> list[Path]:
    """The files in `out` that vitkit writes there (either job's run files, what `vitkit eval`
    writes beside a checkpoint, TensorBoard's event files), each checked to be a regular
    file: `SpecialFileError` names the first that is not."""
    if not out.is_dir():
        return []
    found = [out / name for name in _ALL_RUN_FILES if os.path.lexists(out / name)]
    for pattern in EVAL_FILES:
        found += sorted(out.glob(pattern))
    events = out / TENSORBOARD_DIR
    if os.path.lexists(events):
        mode = os.lstat(events).st_mode
        if not stat.S_ISDIR(mode):
            raise SpecialFileError(
                events, file_kind(mode), removing=True, role="the folder of TensorBoard's logs"
            )
        found += sorted(events.glob(TENSORBOARD_FILES))
    for path in found:
        require_regular(path)
    return found


def clear_out(out: Path, *, overwrite: bool) -> None:
    """Remove what a killed write left (temporary files) and, with `overwrite`, the previous
    run's files: every file vitkit writes into a run folder (`vitkit_files`: of either job, and
    an earlier `eval`'s), nothing else, and only regular files. Call it holding the run
    lock."""
    if overwrite:
        for path in vitkit_files(out):
            path.unlink(missing_ok=True)
        for folder in sharded_folders(out):  # an --fsdp run's training state
            shutil.rmtree(folder)
    remove_stale_temp_files(out)


@contextlib.contextmanager
def open_run(
    config: Any, out: Path, *, resume: bool, overwrite: bool, task: str, files: tuple[str, ...]
) -> Iterator[Any]:
    """The run folder of a job, held for the block: joins the torchrun group (left at the end
    of the block), checks the folder (`prepare_out`), on `resume` the saved settings
    (`resumed_config`), then holds the run lock and clears the previous run's `files`
    (`clear_out`); yields the config with this process's device."""
    with distributed(config.resolved_device(), alone=getattr(config, "fsdp", False)) as device:
        config = config.replace(device=device)
        prepare_out(out, resume=resume, overwrite=overwrite, files=files)
        if resume:
            config = resumed_config(out, config, task=task)
        main = world()[0] == 0
        with run_lock(out) if main else contextlib.nullcontext():  # one writer per folder
            if main:
                clear_out(out, overwrite=overwrite)
            barrier()
            yield config


def read_run_config(out: Path, config_type: type | None = None) -> Any:
    """The settings a run in `out` saved in its `config.json`, as a `config_type` (default:
    the config of the job the folder records, `TrainConfig` or `PretrainConfig`): what a
    resumed run continues with (`saved.replace(**changes)` for the options given again)."""
    path = out / CONFIG_FILE
    if not path.is_file():
        raise RunFolderError(f"{out} holds no run settings ({CONFIG_FILE}); start a new run there")
    if config_type is None:
        config_type = PretrainConfig if _saved_task(out) == "mae" else TrainConfig
    return config_type.from_dict(read_settings(path, config_type, complete=True))


def resumed_config(out: Path, config: Any, *, task: str) -> Any:
    """`config` checked against the run's saved settings: an option may differ when it says
    how the run executes (its field's `runtime` metadata: threads, save_every, device,
    workers, grad_ckpt, loggers) or when it may grow and grew (`grows`: epochs); any other change is
    one error naming the options with their saved and given values. Changes taken are
    logged. `task` must be the job the folder holds."""
    saved_task = _saved_task(out)
    if saved_task is not None and saved_task != task:
        raise RunFolderError(
            f"{out} holds a {saved_task} run, not a {task} run; resume it with its own command"
        )
    saved = read_run_config(out, type(config))
    changed, refused = {}, []
    for item in dataclasses.fields(config):
        before, after = getattr(saved, item.name), getattr(config, item.name)
        if after == before:
            continue
        grew = item.metadata.get("grows") and after > before
        if item.metadata.get("runtime") or grew:
            changed[item.name] = (before, after)
        else:
            refused += _differences(item.name, before, after)
    if refused:
        values = ", ".join(
            f"{name} (saved {_shown(before)}, given {_shown(after)})"
            for name, before, after in refused
        )
        growing = {f.name for f in dataclasses.fields(config) if f.metadata.get("grows")}
        grows = [name for name, _, _ in refused if name in growing]
        hint = f"; {', '.join(grows)} may only grow" if grows else ""
        raise RunFolderError(
            f"resuming {out} continues its saved settings; it cannot change {values}{hint}: "
            f"keep the saved values, or start a new run from {out / CONFIG_FILE} with the new "
            "ones"
        )
    for name, (before, after) in changed.items():
        if name != "device" or before is not None:  # the device is never saved
            log.info("resume: taking %s %s (saved %s)", name, _shown(after), _shown(before))
    return config


def _differences(name: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    """(name, saved, given) of an option that differs; a dict option (the model options) by
    key, e.g. ('model_opts.depth', 1, 2)."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [(name, before, after)]
    keys = sorted(before.keys() | after.keys())
    return [
        (f"{name}.{key}", before.get(key), after.get(key))
        for key in keys
        if before.get(key) != after.get(key)
    ]


def _saved_task(out: Path) -> str | None:
    try:
        return json.loads((out / CONFIG_FILE).read_text()).get("task")
    except (OSError, ValueError, AttributeError):
        return None  # read_run_config says what is wrong with the file


def _shown(value: Any) -> str:
    """A setting as a person reads it: 'unset' for None, JSON otherwise."""
    if value is None:
        return "unset"
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def write_record(
    out: Path, config: Any, model: nn.Module, meta: dict, world_size: int, *, task: str
) -> None:
    """`config.json`: the job, its settings (what `--config` and a resumed run read back), the
    model's config, the metadata and the versions."""
    record = {
        "task": task,
        "settings": {k: v for k, v in config.to_dict().items() if k != "device"},
        "model": model.config.to_dict() if hasattr(model, "config") else model.vitkit_timm,
        "meta": meta,
        "world_size": world_size,
        "vitkit_version": __version__,
        "torch_version": torch.__version__,
    }
    text = json.dumps(record, indent=2) + "\n"
    atomic_write(out / CONFIG_FILE, lambda f: f.write(text), mode="w")
