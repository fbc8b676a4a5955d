"""A run that fails part way: a NaN loss, a full disk, a crash between periodic saves. The last
good files stay whole, the error says which they are and what to do, and resuming ends where
an uninterrupted run ends."""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _run import TINY, tiny_model
from torch.utils.data import Dataset

import vitkit
from vitkit.files import DiskFullError, atomic_write
from vitkit.train import (
    BEST_FILE,
    LAST_FILE,
    METRICS_FILE,
    STATE_FILE,
    NonFiniteLossError,
    TrainConfig,
    fit,
    load_state,
)
from vitkit.train.tasks import ClassificationTask

RUN_FILES = (STATE_FILE, LAST_FILE, BEST_FILE, METRICS_FILE)


class FaultyAfter(Dataset):
    """The items of `base` until `reads` have been read; after that `fault(image)` for each."""

    def __init__(self, base: Dataset, reads: int, fault: Callable) -> None:
        self.base, self.reads, self.fault = base, reads, fault

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        image, label = self.base[index]
        self.reads -= 1
        return (self.fault(image) if self.reads < 0 else image), label


def nan_image(image):
    return image * float("nan")


def crash(image):
    raise RuntimeError("the machine went away")


def config(**options) -> TrainConfig:
    base = dict(epochs=3, batch_size=32, lr=2e-3, warmup_epochs=1, mixup=0.8, cutmix=1.0)
    return TrainConfig(**{**base, **options})


def snapshot(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in RUN_FILES}


def weights(path: Path) -> dict[str, torch.Tensor]:
    return vitkit.load(path).state_dict()


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ"


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits) -> Path:
    """An uninterrupted run of `config()` (EMA on, to check that it resumes too)."""
    out = tmp_path_factory.mktemp("reference")
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config(ema=0.9)),
        *digits,
        config(ema=0.9),
        out_dir=out,
    )
    return out


# -- NaN loss -------------------------------------------------------------------------------


def test_nan_loss_stops_and_keeps_the_last_good_files(tmp_path, digits):
    train, val = digits
    saved = {}

    def on_epoch_end(row):
        saved.update(snapshot(tmp_path))

    with pytest.raises(NonFiniteLossError) as err:
        fit(
            ClassificationTask(tiny_model(), config()),
            FaultyAfter(train, len(train), nan_image),  # NaN images from epoch 2 on
            val,
            config(),
            out_dir=tmp_path,
            on_epoch_end=on_epoch_end,
        )
    assert str(err.value) == (
        f"training loss is nan at step 5 (epoch 2, batch 1); the run stopped and kept its last "
        f"good files: {tmp_path / STATE_FILE} (end of epoch 1), {tmp_path / LAST_FILE} (epoch "
        "1). Lower the learning rate (e.g. --lr 0.0002, a tenth of this run's 0.002) or clip "
        "gradients (--clip-grad 1.0), and start a new run"
    )
    assert snapshot(tmp_path) == saved  # nothing was written after epoch 1
    state = load_state(tmp_path / STATE_FILE)
    assert (state["epoch"], state["step"], state["epoch_state"]) == (1, 5, None)
    last = vitkit.load(tmp_path / LAST_FILE)
    assert last.meta["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in last.state_dict().values())
    assert temp_files(tmp_path) == []


def test_nan_loss_from_the_command_line(tmp_path, run_cli):
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        "train", "--out", out, "--epochs", "2", *TINY, "--lr", "1e10", "--warmup-epochs", "0"
    )
    assert code == 1 and stdout == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("vitkit: error: training loss is nan at step ")
    assert f"kept its last good files: {out / STATE_FILE} (" in err
    assert "(e.g. --lr 1e+09, a tenth of this run's 1e+10) or clip gradients (--clip-grad" in err
    assert load_state(out / STATE_FILE)["epoch"] == 0


# -- a full disk ----------------------------------------------------------------------------


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["write", "fsync", "mkstemp"])
def test_a_full_disk_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch, where):
    path = tmp_path / "state.pt"
    path.write_bytes(b"the previous state")

    def write(f):
        f.write(b"half a new st")
        if where == "write":
            disk_full()

    if where == "fsync":
        monkeypatch.setattr(os, "fsync", disk_full)
    if where == "mkstemp":  # no room even for the temporary file's directory entry
        monkeypatch.setattr(tempfile, "mkstemp", disk_full)
    with pytest.raises(DiskFullError) as err:
        atomic_write(path, write)
    assert str(err.value) == (
        f"no space left on device while writing {path}; free space and try again; the previous "
        "file is intact"
    )
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert path.read_bytes() == b"the previous state"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_save_on_a_full_disk(tmp_path, monkeypatch):
    """The failed save was of other weights, so the file on disk can only be the old one."""
    model = tiny_model()
    path = tmp_path / "model.safetensors"
    vitkit.save(model, path)
    before = path.read_bytes()
    with torch.no_grad():
        model.head.bias.add_(1.0)
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(
        vitkit.DiskFullError, match=r"while writing .*model\.safetensors; free space and"
    ):
        vitkit.save(model, path)
    with pytest.raises(DiskFullError, match=r"new\.safetensors; free .* nothing was written$"):
        vitkit.save(model, tmp_path / "new.safetensors")
    assert path.read_bytes() == before
    assert not torch.equal(vitkit.load(path).head.bias, model.head.bias)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_a_full_disk_during_training_then_resume(tmp_path, monkeypatch, digits, reference):
    real_fsync = os.fsync
    full = {"disk": False}
    saved = {}

    def fsync(fd):
        (disk_full if full["disk"] else real_fsync)(fd)

    def on_epoch_end(row):  # the disk fills up after epoch 1 was saved
        saved.update(snapshot(tmp_path))
        full["disk"] = True

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DiskFullError) as err:
        fit(
            ClassificationTask(tiny_model(drop_path_rate=0.1), config(ema=0.9)),
            *digits,
            config(ema=0.9),
            out_dir=tmp_path,
            on_epoch_end=on_epoch_end,
        )
    assert str(err.value) == (
        f"no space left on device while writing {tmp_path / LAST_FILE}; free space and continue "
        "with --resume; the previous file is intact"
    )
    assert snapshot(tmp_path) == saved and temp_files(tmp_path) == []
    full["disk"] = False
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config(ema=0.9)),
        *digits,
        config(ema=0.9),
        out_dir=tmp_path,
        resume=True,
    )
    for name in (LAST_FILE, BEST_FILE, "ema.safetensors"):
        assert_same_weights(tmp_path / name, reference / name)


def test_a_full_disk_from_the_command_line(tmp_path, monkeypatch, run_cli):
    """The first write of last.safetensors fails: exit code 1, one line, and --resume
    finishes once there is space."""
    made: list[str] = []
    real_mkstemp, real_fsync = tempfile.mkstemp, os.fsync

    def mkstemp(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        made.append(name)
        return fd, name

    def fsync(fd):
        if Path(made[-1]).name.startswith(f".{LAST_FILE}."):
            disk_full()
        real_fsync(fd)

    out = tmp_path / "run"
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "fsync", fsync)
    code, stdout, err = run_cli("train", "--out", out, "--epochs", "2", *TINY)
    assert (code, stdout) == (1, "")
    assert err == (
        f"vitkit: error: no space left on device while writing {out / LAST_FILE}; free space and "
        "continue with --resume; nothing was written\n"
    )
    assert temp_files(out) == [] and load_state(out / STATE_FILE)["epoch"] == 0
    monkeypatch.undo()
    code, stdout, _ = run_cli("train", "--out", out, "--resume", "--no-progress")
    assert code == 0 and stdout.splitlines()[-1].startswith("test accuracy: ")


# -- periodic saves and stale temporary files -----------------------------------------------


def test_a_crash_loses_at_most_save_every_steps(tmp_path, digits, reference):
    """save_every=2 over 5 steps an epoch: a crash in step 10 (epoch 2, batch 5) resumes from
    step 8 (epoch 2 after batch 3) and ends with the weights of the uninterrupted run."""
    train, val = digits
    run = config(ema=0.9, save_every=2)
    with pytest.raises(RuntimeError, match="the machine went away"):
        fit(
            ClassificationTask(tiny_model(drop_path_rate=0.1), run),
            FaultyAfter(train, len(train) + 4 * 32, crash),
            val,
            run,
            out_dir=tmp_path,
        )
    state = load_state(tmp_path / STATE_FILE)
    assert (state["epoch"], state["step"], state["epoch_state"]["batches"]) == (1, 8, 3)
    torch.manual_seed(123)  # the resumed run must not depend on the global seed
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), run),
        train,
        val,
        run,
        out_dir=tmp_path,
        resume=True,
    )
    for name in (LAST_FILE, BEST_FILE, "ema.safetensors"):
        assert_same_weights(tmp_path / name, reference / name)


def test_save_every_must_not_be_negative(tmp_path, run_cli):
    with pytest.raises(ValueError, match=r"save_every must be >= 0 \(0: at epoch ends only\)"):
        TrainConfig(save_every=-1)
    code, _, err = run_cli("train", "--out", tmp_path / "run", "--save-every", "-1", *TINY)
    assert (
        code == 2
        and err == "vitkit: error: save_every must be >= 0 (0: at epoch ends only), got -1\n"
    )


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_stale_temporary_files_are_removed(tmp_path, run_cli, caplog, flag):
    caplog.set_level(logging.INFO, logger="vitkit")
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--epochs", "1", *TINY)[0] == 0
    stale = [out / ".state.pt.vitkit-k2j4_x7q.tmp", out / ".last.safetensors.vitkit-abc123de.tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    mine = ("notes.tmp", ".notes.tmp", ".my.notes.tmp", ".my.abcdefgh.tmp")  # not vitkit's
    for name in mine:
        (out / name).write_text("keep me")
    argv = ["--resume", "--no-progress"] if flag == "--resume" else ["--overwrite", *TINY]
    code, _, _ = run_cli("train", "--out", out, "--epochs", "1", *argv)
    assert code == 0
    assert not any(path.exists() for path in stale)
    assert all((out / name).read_text() == "keep me" for name in mine)
    assert (
        "removed 2 stale temporary file(s) of an interrupted write: "
        ".last.safetensors.vitkit-abc123de.tmp, .state.pt.vitkit-k2j4_x7q.tmp" in caplog.messages
    )


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_run_files_follow_the_umask(tmp_path, run_cli, umask):
    """Files a run writes get 0666 less the umask, as `open` gives, not a temp file's 0600."""
    previous = os.umask(umask)
    try:
        out = tmp_path / "run"
        assert run_cli("train", "--out", out, "--epochs", "1", *TINY)[0] == 0
    finally:
        os.umask(previous)
    written = [p for p in out.iterdir() if p.is_file()]
    assert {p.name for p in written} >= {"config.json", "model.safetensors", "state.pt"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in written} == {
        p.name: 0o666 & ~umask for p in written
    }


def test_a_permission_error_names_the_path_and_keeps_the_state(tmp_path, monkeypatch, run_cli):
    """A write refused by the file system (here: the rename of last.safetensors) is exit code
    1 and one line naming the path; the state saved before it stays, and --resume finishes."""
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == LAST_FILE:
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        real_replace(src, dst)

    out = tmp_path / "run"
    monkeypatch.setattr(os, "replace", replace)
    code, stdout, err = run_cli("train", "--out", out, "--epochs", "2", *TINY)
    assert (code, stdout) == (1, "")
    assert err == (
        f"vitkit: error: permission denied: {out / LAST_FILE}; check the permissions of that "
        "path or choose another location\n"
    )
    assert temp_files(out) == [] and load_state(out / STATE_FILE)["epoch"] == 0
    monkeypatch.undo()
    code, _, _ = run_cli("train", "--out", out, "--resume", "--no-progress")
    assert code == 0 and load_state(out / STATE_FILE)["epoch"] == 2


class _FullAfter(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, raw, room: int) -> None:
        self.raw, self.room = raw, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.raw.write(data)

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()
        super().close()


def test_a_full_disk_inside_torch_save_is_one_line(tmp_path, monkeypatch, digits):
    """The disk fills while torch.save writes state.pt (after epoch 1; a model whose tensors
    exceed the file's buffer, so torch's own writer meets the error): DiskFullError's line
    naming the state file kept, not torch's 'enforce fail ... unexpected pos'."""
    real_fdopen, full = os.fdopen, {"disk": False}

    def fdopen(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        name = os.readlink(f"/proc/self/fd/{fd}")
        if full["disk"] and f".{STATE_FILE}." in name and "b" in mode:
            return io.BufferedWriter(_FullAfter(f.detach(), room=1000))
        return f

    def on_epoch_end(row):
        full["disk"] = True

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(DiskFullError) as err:
        model = vitkit.create_model("vit_digits", embed_dim=64, depth=1, num_heads=2)
        fit(
            ClassificationTask(model, config()),
            *digits,
            config(),
            out_dir=tmp_path,
            on_epoch_end=on_epoch_end,
        )
    assert str(err.value) == (
        f"no space left on device while writing {tmp_path / STATE_FILE}; free space and continue "
        "with --resume; the previous file is intact"
    )
    assert load_state(tmp_path / STATE_FILE)["epoch"] == 1 and temp_files(tmp_path) == []
