"""Ctrl-C (SIGINT) and SIGTERM, as a terminal or a job scheduler sends them: the run saves its
state after the current step, says how to continue and exits with code 130; `--resume` then
finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from _run import SRC, TINY, spawn, tiny_model, wait_for
from torch.utils.data import DataLoader, Dataset

from vitkit import load
from vitkit.train import LAST_FILE, STATE_FILE, StopFlag, TrainConfig, fit, load_state, signals
from vitkit.train.signals import quiet_worker, stop_on_signals
from vitkit.train.tasks import ClassificationTask


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


def test_a_child_forked_before_it_ignores_the_signals_leaves_them_to_its_parent(caplog):
    """A SIGTERM to the process group can reach a loader worker between its fork and
    `quiet_worker`: the handler it inherited does nothing there (it once logged a second
    'SIGTERM received' and set the worker's copy of the flag)."""
    stop = StopFlag()
    with stop_on_signals(stop):
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the handler runs in the child, as in a worker not yet quiet
            os.kill(os.getpid(), signal.SIGTERM)
            os.write(write, b"set" if stop else b"clear")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 16)
        os.waitpid(child, 0)
    assert answer == b"clear" and not stop
    assert "SIGTERM received" not in caplog.text


class StopAt(Dataset):
    """`base`, setting `stop` as the `at`-th item of the run is read (in the main process:
    no workers), so the run stops after that item's step, as after a signal."""

    def __init__(self, base: Dataset, stop: StopFlag, at: int) -> None:
        self.base, self.stop, self.at, self.reads = base, stop, at, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        self.reads += 1
        if self.reads == self.at:
            self.stop.set("SIGTERM")
        return self.base[index]


class Numbers(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index


def _signalled_before_quiet(worker_id: int) -> None:
    """As the process group's SIGTERM reaching a worker just forked, before it is quiet."""
    os.kill(os.getpid(), signal.SIGTERM)
    quiet_worker(worker_id)


def test_a_worker_signalled_between_its_fork_and_its_quiet_lives(monkeypatch):
    """A SIGTERM that reaches a loader worker before it ignores the stop signals (torch's
    worker handler would end it there, and the main process would fail with 'DataLoader
    worker ... is killed by signal') waits, held, and is discarded once the worker ignores
    it: every batch arrives. A plain DataLoader's worker dies of the same signal."""
    monkeypatch.setattr(signals, "quiet_worker", _signalled_before_quiet)
    loader = signals.QuietWorkersLoader(Numbers(), batch_size=4, num_workers=2)
    for _ in range(2):  # its workers are forked anew for each pass
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    plain = DataLoader(
        Numbers(), batch_size=4, num_workers=1, worker_init_fn=_signalled_before_quiet
    )
    with pytest.raises(RuntimeError, match="^DataLoader worker"):
        list(plain)


def test_stops_in_mid_epoch_twice_in_a_row_resume_to_the_same_weights(tmp_path, digits):
    """Stopped after batch 2 of epoch 1, resumed and stopped after batch 4 of epoch 2 (later
    than the 3 batches the resumed epoch had left, which once counted as the whole of epoch
    2), then resumed to the end: each stop saves a mid-epoch state, and the end is the
    uninterrupted run's (5 batches of 32 an epoch)."""
    train, val = digits
    config = TrainConfig(epochs=3, batch_size=32, lr=2e-3, warmup_epochs=1, mixup=0.8)
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config),
        train,
        val,
        config,
        out_dir=tmp_path / "reference",
    )
    out = tmp_path / "run"
    for resume, at, where in [(False, 2 * 32, (0, 2)), (True, 3 * 32 + 4 * 32, (1, 4))]:
        stop = StopFlag()
        result = fit(
            ClassificationTask(tiny_model(drop_path_rate=0.1), config),
            StopAt(train, stop, at),
            val,
            config,
            out_dir=out,
            resume=resume,
            stop=stop,
        )
        state = load_state(out / STATE_FILE)
        assert result.interrupted and len(result.history) == where[0]
        assert (state["epoch"], state["epoch_state"]["batches"]) == where
    fit(
        ClassificationTask(tiny_model(drop_path_rate=0.1), config),
        train,
        val,
        config,
        out_dir=out,
        resume=True,
    )
    ours, theirs = load(out / LAST_FILE).state_dict(), load(tmp_path / "reference" / LAST_FILE)
    assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.items())
