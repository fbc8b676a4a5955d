"""The run folder from the Python API: the resume policy (`resumed_config`), the record of the
job, what `--overwrite` removes, and the special files it never touches."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat

import pytest

from vitkit.files import SpecialFileError
from vitkit.train import MaeTask, TrainConfig, run_job, run_training
from vitkit.train.lock import LOCK_FILE, run_lock
from vitkit.train.run_folder import (
    RunFolderError,
    clear_out,
    prepare_out,
    read_run_config,
)

TINY = {"embed_dim": 16, "depth": 1, "num_heads": 2}


def tiny_config(**options) -> TrainConfig:
    base = dict(model="vit_digits", model_opts=TINY, epochs=1, batch_size=64, lr=5e-3,
                warmup_epochs=0.0, mixup=0.0, cutmix=0.0, reprob=0.0, threads=1)  # fmt: skip
    return TrainConfig(**{**base, **options})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    run_training(tiny_config(epochs=2), out)
    return out


def test_resume_from_python_refuses_changed_settings(finished):
    given = tiny_config(lr=0.1, seed=3, clip_grad=1.0, epochs=3)
    with pytest.raises(RunFolderError) as err:
        run_training(given, finished, resume=True)
    assert str(err.value) == (
        f"resuming {finished} continues its saved settings; it cannot change seed (saved 0, "
        "given 3), lr (saved 0.005, given 0.1), clip_grad (saved unset, given 1.0): keep the "
        f"saved values, or start a new run from {finished / 'config.json'} with the new ones"
    )
    with pytest.raises(RunFolderError) as err:
        run_training(read_run_config(finished).replace(epochs=1), finished, resume=True)
    assert str(err.value).startswith(
        f"resuming {finished} continues its saved settings; it cannot change epochs (saved 2, "
        "given 1); epochs may only grow: keep the saved values"
    )


def test_resume_from_python_takes_runtime_options_and_more_epochs(tmp_path, caplog):
    out = tmp_path / "run"
    run_training(tiny_config(), out)
    saved = read_run_config(out)
    assert saved == tiny_config()
    caplog.set_level(logging.INFO, logger="vitkit")
    outcome = run_training(saved.replace(epochs=2, save_every=3, workers=0), out, resume=True)
    assert [row["epoch"] for row in outcome.result.history] == [1, 2]
    assert "resume: taking epochs 2 (saved 1)" in caplog.messages
    assert "resume: taking save_every 3 (saved 0)" in caplog.messages
    record = json.loads((out / "config.json").read_text())
    assert record["task"] == "classification" and record["settings"]["epochs"] == 2


def test_a_run_resumes_only_with_its_own_job(finished):
    with pytest.raises(RunFolderError) as err:
        run_job(MaeTask, read_run_config(finished), finished, resume=True)
    assert str(err.value) == (
        f"{finished} holds a classification run, not a mae run; resume it with its own command"
    )


def test_overwrite_removes_every_file_vitkit_wrote_and_nothing_else(tmp_path):
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    ours = ["config.json", "state.pt", "metrics.csv", "encoder.safetensors", "mae_state.pt",
            "confusion_test.png", "confusion_all.png", "per_class_val.png", "eval.json",
            "eval_test.json", "tensorboard/events.out.tfevents.1.host.2.0"]  # fmt: skip
    theirs = ["notes.txt", "confusion.jpg", "my_eval.json", "test.png", "tensorboard/notes.md"]
    for name in ours + theirs:
        (out / name).write_text("old")
    prepare_out(out, resume=False, overwrite=True)
    clear_out(out, overwrite=True)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == sorted(theirs)


def _special(path, kind):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        target = path.parent / "elsewhere.txt"
        target.write_text("the user's")
        path.symlink_to(target)
    elif kind == "device":  # a /dev/null twin (the tests run as root)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        return server
    return None


WHAT = {"fifo": "a FIFO (named pipe)", "folder": "a folder", "link": "a symbolic link",
        "device": "a character device", "socket": "a socket"}  # fmt: skip


@pytest.mark.parametrize("kind", list(WHAT))
@pytest.mark.parametrize("name", ["metrics.csv", "confusion_test.png"])
def test_overwrite_refuses_a_special_file_with_a_run_files_name(tmp_path, kind, name):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    out = tmp_path / "run"
    out.mkdir()
    (out / "state.pt").write_text("old")
    keep = _special(out / name, kind)
    with pytest.raises(SpecialFileError) as err:
        prepare_out(out, resume=False, overwrite=True)
    assert str(err.value) == (
        f"{out / name} is {WHAT[kind]}, not a file vitkit writes; vitkit never removes or "
        "replaces it: move it away or choose another folder"
    )
    with pytest.raises(SpecialFileError):
        clear_out(out, overwrite=True)  # checked before anything goes
    assert os.path.lexists(out / name) and (out / "state.pt").read_text() == "old"
    if keep is not None:
        keep.close()


def test_a_resumed_run_refuses_a_special_file_it_would_replace(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "state.pt").write_text("old")
    (out / "curves.png").mkdir()
    with pytest.raises(SpecialFileError, match=r"curves\.png is a folder, not a file vitkit"):
        prepare_out(out, resume=True, overwrite=False)


@pytest.mark.parametrize("kind", ["fifo", "folder", "link", "device"])
def test_the_lock_file_must_be_a_regular_file(tmp_path, kind):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    _special(tmp_path / LOCK_FILE, kind)
    before = os.lstat(tmp_path / LOCK_FILE)
    with pytest.raises(SpecialFileError) as err:
        with run_lock(tmp_path):
            pass
    assert str(err.value) == (
        f"{tmp_path / LOCK_FILE} is {WHAT[kind]}, not vitkit's run lock; vitkit never removes "
        "or replaces it: move it away or choose another folder"
    )
    after = os.lstat(tmp_path / LOCK_FILE)
    assert (after.st_mode, after.st_ino, after.st_size) == (
        before.st_mode,
        before.st_ino,
        before.st_size,
    )
    if kind == "link":
        assert (tmp_path / "elsewhere.txt").read_text() == "the user's"
