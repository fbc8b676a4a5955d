"""One writer per run folder: a second run or a `--resume` of a live run is refused with one
line naming the live process; a killed run's lock is taken over; reading commands still work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import vitkit
from vitkit import cli
from vitkit.train.lock import LOCK_FILE, RunLockedError, run_lock

TINY = ["--model-opt", "embed_dim=16", "--model-opt", "depth=1", "--model-opt", "num_heads=2"]
SRC = Path(vitkit.__file__).resolve().parents[1]


def train(out: Path, *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--epochs", "1", *TINY, "--no-progress", *extra]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert cli.main(train(out)) == 0
    return out


def test_a_live_run_refuses_a_second_writer(finished, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    with run_lock(finished):
        for extra in (["--overwrite"], ["--resume"]):
            argv = train(finished, *extra) if extra == ["--overwrite"] else [
                "train", "--out", str(finished), "--resume", "--no-progress"]  # fmt: skip
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1
            assert err.startswith(
                f"vitkit: error: {finished} is in use by a live vitkit run "
                f"(process {os.getpid()} on "
            )
            assert f"stop it (kill {os.getpid()}) and continue with --resume" in err
        # reading commands work beside the live run
        checkpoint = str(finished / "model.safetensors")
        pictures = ["--confusion", str(tmp_path / "c.png"), "--per-class", str(tmp_path / "p.png")]
        code = cli.main(["eval", "--checkpoint", checkpoint, *pictures, "--json"])
        assert code == 0 and json.loads(capsys.readouterr().out)["count"] == 359
    after = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    assert {k: v for k, v in after.items() if k != LOCK_FILE} == {
        k: v for k, v in before.items() if k != LOCK_FILE
    }  # nothing of the live run was touched


def test_the_lock_is_exclusive_and_released(tmp_path):
    with run_lock(tmp_path):
        with pytest.raises(RunLockedError, match="is in use by a live vitkit run"):
            with run_lock(tmp_path):
                pass
    with run_lock(tmp_path):  # released on leaving the block
        owner = json.loads((tmp_path / LOCK_FILE).read_text())
        assert owner["pid"] == os.getpid() and owner["started"]
    assert not (tmp_path / LOCK_FILE).exists()  # removed with the lock


def test_a_finished_run_leaves_no_lock_file(finished):
    assert LOCK_FILE not in {p.name for p in finished.iterdir()}


def test_a_lock_file_renamed_away_while_locking_is_locked_again_by_name(tmp_path, monkeypatch):
    """A run that finishes removes its file while it holds the lock; a second run that opened
    the old file just before must not hold a lock on a file nobody else can find."""
    from vitkit.train import lock

    opened = []
    real_open = lock._open_lock_file

    def open_then_replace(path):
        fd = real_open(path)
        if not opened:  # the first file is removed and made anew under the same name
            path.unlink()
            path.write_text("")
        opened.append(os.fstat(fd).st_ino)
        return fd

    monkeypatch.setattr(lock, "_open_lock_file", open_then_replace)
    with run_lock(tmp_path) as path:
        assert len(opened) == 2 and os.stat(path).st_ino == opened[1] != opened[0]


def test_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from vitkit.train.lock import run_lock\n"
         f"with run_lock({str(out)!r}):\n    print('locked', flush=True); time.sleep(120)"],
        env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli.main(train(out)) == 2
        assert f"(process {holder.pid} on " in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_FILE).exists()  # a killed run leaves its file
    assert cli.main(train(out)) == 0  # the OS released the dead process's lock
    assert not (out / LOCK_FILE).exists()  # taken over, and removed at the end


def test_overwrite_removes_the_run_files_and_nothing_else(finished, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("config.json", "state.pt", "test.json", "notes.txt", "my.tmp"):
        (out / name).write_text("old")
    assert cli.main(train(out, "--overwrite")) == 0
    assert (out / "notes.txt").read_text() == "old" and (out / "my.tmp").read_text() == "old"
    assert json.loads((out / "test.json").read_text())["best_epoch"] == 1


def test_two_trainings_started_together_never_share_a_folder(tmp_path):
    """Two real processes on one --out: one trains, the other is refused (the live run's lock,
    or the finished run's files); the folder holds exactly the winner's run."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vitkit", *train(out, "--seed", str(seed), "--epochs", "2")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    winner = 1 + [code for code, _ in results].index(0)
    refusal = next(err for code, err in results if code == 2).strip().splitlines()[-1]
    assert refusal.startswith(f"vitkit: error: {out} ")
    assert "in use by a live vitkit run" in refusal or "already holds a run" in refusal
    settings = json.loads((out / "config.json").read_text())["settings"]
    assert settings["seed"] == winner
    epochs = [
        json.loads(line)["epoch"]
        for line in (out / "metrics.jsonl").read_text().split("\n")
        if line
    ]
    assert epochs == [1, 2]
