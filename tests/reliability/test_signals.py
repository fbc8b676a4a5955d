"""Ctrl-C (SIGINT) and SIGTERM, as a terminal or a job scheduler sends them: the run saves its
state after the current step, says how to continue and exits with code 130; `--resume` then
finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from _run import SRC, TINY, spawn, wait_for

from vitkit.train import STATE_FILE, load_state


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_saves_the_state_and_resume_finishes(tmp_path, run_cli, sig):
    out, log = tmp_path / "run", tmp_path / "log"
    proc = spawn(["train", "--out", out, "--epochs", "8", *TINY, "--batch-size", "16"], log=log)
    wait_for(lambda: (out / "metrics.jsonl").exists() or proc.poll() is not None)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert f"{sig.name} received: stopping after this step and saving the state" in text
    assert text.endswith(f"interrupted; continue with: vitkit train --out {out} --resume\n")
    assert "Traceback" not in text
    state = load_state(out / STATE_FILE)
    done = len((out / "metrics.jsonl").read_text().splitlines())
    assert 1 <= done == state["epoch"] < 8
    code, stdout, _ = run_cli("train", "--out", out, "--resume", "--no-progress")
    assert code == 0 and stdout.splitlines()[-1].startswith("test accuracy: ")
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 8


def test_sigterm_to_the_process_group_with_loader_workers(tmp_path):
    """A scheduler's SIGTERM reaches the whole process group, DataLoader workers included:
    the workers ignore it, the run saves its state and ends with exit code 130, no
    traceback."""
    out, log = tmp_path / "run", tmp_path / "log"
    argv = ["train", "--out", out, "--epochs", "30", *TINY, "--batch-size", "16", "--workers", "2"]
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vitkit", *map(str, argv)],
            env={**os.environ, "PYTHONPATH": str(SRC)},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a job scheduler starts it
        )
    wait_for(lambda: (out / "metrics.jsonl").exists() or proc.poll() is not None)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "DataLoader worker" not in text
    assert text.count("SIGTERM received: stopping after this step and saving the state") == 1
    assert text.endswith(f"interrupted; continue with: vitkit train --out {out} --resume\n")
    state = load_state(out / STATE_FILE)
    assert state["epoch"] >= 1 and state["step"] > 0
