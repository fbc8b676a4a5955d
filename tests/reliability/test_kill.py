"""kill -9 at random moments, and in the middle of a checkpoint write: after each kill the
previous state file loads, and `--resume` until done ends with the weights of a run that was
never interrupted, bit for bit."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _run import SRC, spawn, wait_for
from safetensors.torch import load_file

from vitkit.train import BEST_FILE, LAST_FILE, STATE_FILE, load_state
from vitkit.train.lock import run_lock

# 79 steps an epoch, a state saved every 10 steps: most kills land in the middle of an epoch.
RUN = (
    "--epochs", "3", "--batch-size", "16", "--model-opt", "embed_dim=32",
    "--model-opt", "depth=1", "--seed", "1", "--no-progress",
)  # fmt: skip
STEPS = 3 * 79
SAVE_EVERY = ("--save-every", "10")
RESUMED = re.compile(r"resuming from .* at (epoch \d+(?:, batch \d+)?)")
# Runs the command line, SIGKILLing itself when it is about to rename the temporary file of
# the Nth write of one file over it (KILL_AT=state.pt:4): the write is complete, not renamed.
DRIVER = """\
import os, signal, sys
from pathlib import Path

name, nth = os.environ["KILL_AT"].split(":")
writes = 0
rename = os.replace


def replace(src, dst, *args, **kwargs):
    global writes
    if Path(dst).name == name:
        writes += 1
        if writes == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
    return rename(src, dst, *args, **kwargs)


os.replace = replace
from vitkit.cli import main

sys.exit(main(sys.argv[1:]))
"""


def training(proc: subprocess.Popen, log: Path, out: Path, resume: bool) -> None:
    """Wait until the child trains: it has resumed, or written the first state of a new run
    (or it has ended)."""
    wait_for(
        lambda: (
            ("resuming from" in log.read_text() if resume else (out / STATE_FILE).exists())
            or proc.poll() is not None
        )
    )


def finish(out: Path, log: Path) -> None:
    """Run `--resume` to the end, as a user would after a crash."""
    proc = spawn(["train", "--out", out, "--resume", "--no-progress"], log=log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]


def assert_state_loads(out: Path) -> dict:
    state = load_state(out / STATE_FILE)  # raises for a torn or half-written file
    assert 0 <= state["epoch"] <= 3 and state["step"] >= 0
    return state


def assert_same_run(out: Path, reference: Path) -> None:
    for name in (LAST_FILE, BEST_FILE):
        ours, theirs = load_file(out / name), load_file(reference / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), f"{out / name} differs"
    assert json.loads((out / "test.json").read_text()) == json.loads(
        (reference / "test.json").read_text()
    )
    assert not list(out.glob(".*.tmp"))


def val_losses(out: Path) -> list[float]:
    return [json.loads(row)["val_loss"] for row in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, float]:
    """An uninterrupted run (without periodic saves) and how long it took from its first state
    file to its end."""
    out = tmp_path_factory.mktemp("reference") / "run"
    log = out.parent / "log"
    proc = spawn(["train", "--out", out, *RUN], log=log)
    training(proc, log, out, resume=False)
    start = time.monotonic()
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    return out, time.monotonic() - start


@pytest.mark.slow
def test_kill_during_checkpoint_writes(tmp_path, reference):
    """Killed with the new state.pt complete but not renamed (the 4th write: a mid-epoch save
    at step 30), then with last.safetensors of epoch 2 likewise: the old files stay, and the
    stale temporary files go on --resume."""
    out, driver = tmp_path / "run", tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = spawn(
        ["train", "--out", out, *RUN, *SAVE_EVERY],
        log=tmp_path / "1.log",
        driver=driver,
        env={"KILL_AT": f"{STATE_FILE}:4"},
    )
    assert proc.wait(timeout=300) == -9
    assert len(list(out.glob(f".{STATE_FILE}.*.tmp"))) == 1
    state = assert_state_loads(out)
    assert (state["epoch"], state["step"], state["epoch_state"]["batches"]) == (0, 20, 20)

    proc = spawn(
        ["train", "--out", out, "--resume", "--no-progress"],
        log=tmp_path / "2.log",
        driver=driver,
        env={"KILL_AT": f"{LAST_FILE}:2"},
    )
    assert proc.wait(timeout=300) == -9
    log = (tmp_path / "2.log").read_text()
    assert "removed 1 stale temporary file(s) of an interrupted write: .state.pt." in log
    assert f"resuming from {out / STATE_FILE} at epoch 1, batch 21" in log
    assert len(list(out.glob(f".{LAST_FILE}.*.tmp"))) == 1
    assert load_file(out / LAST_FILE)  # epoch 1's, whole
    state = assert_state_loads(out)
    assert (state["epoch"], state["step"], state["epoch_state"]["batches"]) == (1, 150, 71)

    finish(out, tmp_path / "3.log")
    assert "resuming from" in (tmp_path / "3.log").read_text()
    assert_same_run(out, reference[0])
    assert val_losses(out) == val_losses(reference[0])


@pytest.mark.slow
def test_kill_9_at_random_moments(tmp_path, reference):
    """Three runs, each SIGKILLed one to three times at seeded random moments of its training
    (wherever that falls: a step, a save, the evaluation, the final test), then resumed
    until it finishes."""
    rng = random.Random(7)
    ref, train_seconds = reference
    resumed_from = []
    for trial in range(3):
        out = tmp_path / f"run{trial}"
        kills = rng.randint(1, 3)
        for launch in range(10):
            log = tmp_path / f"run{trial}-{launch}.log"
            resume = (out / STATE_FILE).exists()
            left = 1.0 - load_state(out / STATE_FILE)["step"] / STEPS if resume else 1.0
            if resume:
                argv = ["train", "--out", out, "--resume", "--no-progress"]
            else:  # killed before the run began: start it again
                argv = ["train", "--out", out, *RUN, *SAVE_EVERY, "--overwrite"]
            proc = spawn(argv, log=log)
            if launch < kills:
                training(proc, log, out, resume)
                time.sleep(rng.uniform(0.0, train_seconds * left))
                proc.kill()
            code = proc.wait(timeout=300)
            resumed_from += RESUMED.findall(log.read_text())
            if code == -9:
                if (out / STATE_FILE).exists():
                    assert_state_loads(out)
                continue
            assert code == 0, log.read_text()[-3000:]
            break
        assert_same_run(out, ref)
    print("resumed at:", "; ".join(resumed_from))
    assert any("batch" in point for point in resumed_from), "no resume in mid-epoch"


# Takes a folder's run lock, forks a child that lives on (as a DataLoader worker does for
# seconds after its run is killed), prints the child's PID and SIGKILLs itself.
LOCK_AND_FORK = """\
import os, signal, sys, time
from vitkit.train.lock import run_lock

with run_lock(sys.argv[1]):
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_lock_of_a_killed_run_dies_with_it_while_its_forked_children_live(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-c", LOCK_AND_FORK, str(tmp_path)],
            env={**os.environ, "PYTHONPATH": str(SRC)},
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    child = int(log.read_text())
    try:
        assert proc.returncode == -9
        os.kill(child, 0)  # still alive
        with run_lock(tmp_path):  # no RunLockedError: the lock went with its process
            pass
    finally:
        os.kill(child, signal.SIGKILL)


# Every per-image and per-batch random step at once, with 2 loader workers: random-resized
# crops, flips, RandAugment, random erasing, Mixup / CutMix and drop path; 6 steps an epoch.
AUGMENTED = (
    "--epochs", "2", "--batch-size", "8", "--img-size", "16", "--model-opt", "patch_size=4",
    "--in-chans", "3", "--model-opt", "embed_dim=32", "--model-opt", "depth=1",
    "--model-opt", "num_heads=2", "--lr", "5e-3", "--crop-scale", "0.3", "1.0",
    "--hflip", "0.5", "--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.5", "--mixup", "0.8",
    "--cutmix", "1.0", "--drop-path-rate", "0.2", "--workers", "2", "--seed", "1",
    "--no-progress",
)  # fmt: skip


def image_folder(root: Path) -> Path:
    """3 classes of 20 noisy 28 x 24 RGB images, one colour channel raised per class."""
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for c, name in enumerate(["red", "green", "blue"]):
        (root / name).mkdir(parents=True)
        for i in range(20):
            pixels = torch.randint(0, 120, (24, 28, 3), generator=gen, dtype=torch.uint8)
            pixels[..., c] += 120
            Image.fromarray(pixels.numpy()).save(root / name / f"{i}.png")
    return root


@pytest.mark.slow
def test_kill_9_in_mid_epoch_under_augmentation_with_workers(tmp_path):
    """Killed (SIGKILL) in epoch 2 with the state of step 10 written but not renamed, while
    the workers held augmented batches ahead: the resumed run (from step 8, batch 2 of epoch
    2) draws each image's augmentation afresh from (seed, epoch, index) and ends with the
    uninterrupted run's weights, bit for bit."""
    data = image_folder(tmp_path / "data")
    reference, out, driver = tmp_path / "reference", tmp_path / "run", tmp_path / "driver.py"
    proc = spawn(["train", "--data", data, "--out", reference, *AUGMENTED], log=tmp_path / "0.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "0.log").read_text()[-3000:]
    driver.write_text(DRIVER)
    # state.pt writes: the start, steps 2, 4, 6 (and the end of epoch 1), 8, then 10: the 7th
    argv = ["train", "--data", data, "--out", out, *AUGMENTED, "--save-every", "2"]
    proc = spawn(argv, log=tmp_path / "1.log", driver=driver, env={"KILL_AT": f"{STATE_FILE}:7"})
    assert proc.wait(timeout=300) == -9, (tmp_path / "1.log").read_text()[-3000:]
    state = assert_state_loads(out)
    assert (state["epoch"], state["step"], state["epoch_state"]["batches"]) == (1, 8, 2)
    finish(out, tmp_path / "2.log")
    assert (
        f"resuming from {out / STATE_FILE} at epoch 2, batch 3" in (tmp_path / "2.log").read_text()
    )
    assert_same_run(out, reference)
