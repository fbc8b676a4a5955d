"""Progress a user can see: a bar when stderr is a terminal, a line every so often in a log,
nothing with --quiet or on a rank other than 0 (`cli.progress`)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import vitkit
from _helpers import image_folder
from vitkit import cli
from vitkit.cli.progress import EVERY_S_VARIABLE, Lines, duration, progress
from vitkit.train import distributed

from ._cli import TINY, tiny_checkpoint

TRAIN = tuple(flag for flag in TINY if flag != "--no-progress")  # the `trained` fixture's run
LINE = re.compile(
    r"epoch (\d)/2: (\d+)/10 batches, loss \d\.\d{4}, acc \d\.\d{3}, \d+ img/s"
    r"(, about \d+ s left)?$"
)


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a pty does."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock that advances `tick` seconds each time it is read."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 100.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_lines_come_by_time_with_the_loops_numbers_and_the_time_left():
    stream = io.StringIO()
    lines = Lines(range(8), 8, "epoch 3/10", stream=stream, every_s=3.0, clock=Clock(1.0))
    for step in lines:
        lines.set_postfix(loss=f"{1 / (step + 1):.4f}", img_s="16")
    # read at 101 (start), then 102, 103, ... after each item: due at 102, then every 3 s
    assert stream.getvalue().splitlines() == [
        "epoch 3/10: 1/8 batches, loss 1.0000, 16 img/s, about 7 s left",
        "epoch 3/10: 4/8 batches, loss 0.2500, 16 img/s, about 4 s left",
        "epoch 3/10: 7/8 batches, loss 0.1429, 16 img/s, about 1 s left",
    ]
    assert list(lines) == list(range(8)) and len(lines) == 8  # the items as they are
    assert lines.done == 8  # a second pass (an EMA's validation) counts from 0 again


def test_without_the_loops_speed_the_batch_size_gives_it():
    stream = io.StringIO()
    lines = Lines([0] * 4, 400, "eval", stream=stream, every_s=0.0, batch_size=32, clock=Clock(2.0))
    list(lines)
    assert stream.getvalue().splitlines()[1] == "eval: 2/400 batches, 16.0 img/s, about 13 min left"


@pytest.mark.parametrize(
    ("seconds", "said"), [(0.2, "1 s"), (40.4, "40 s"), (185, "3 min"), (7500, "2 h 5 min")]
)
def test_the_time_left_is_said_as_a_person_says_it(seconds, said):
    assert duration(seconds) == said


def test_a_terminal_gets_a_bar_a_log_lines_and_quiet_or_another_rank_nothing(monkeypatch):
    from tqdm import tqdm

    items = [1, 2, 3]
    terminal, log = Terminal(), io.StringIO()
    bar = progress(stream=terminal)(items, 3, "predict")
    assert isinstance(bar, tqdm) and list(bar) == items
    assert terminal.getvalue().startswith("\rpredict:   0%|          | 0/3 [")
    assert isinstance(progress(stream=log, every_s=0)(items, 3, "predict"), Lines)
    for stream in (terminal, log):
        stream.seek(0)
        stream.truncate()
        assert progress(quiet=True, stream=stream, every_s=0)(items, 3, "eval") is items
        monkeypatch.setenv("RANK", "1")  # torchrun's other ranks, before the group is joined
        assert progress(stream=stream, every_s=0)(items, 3, "eval") is items
        monkeypatch.delenv("RANK")
        with monkeypatch.context() as patch:  # and in it (fit asks while the group runs)
            patch.setattr(distributed, "world", lambda: (1, 2))
            assert progress(stream=stream, every_s=0)(items, 3, "eval") is items
        assert stream.getvalue() == ""


def test_a_training_run_to_a_log_prints_progress_lines_inside_each_epoch(
    trained, tmp_path, run_cli, monkeypatch, caplog
):
    """stderr captured (a file or a pipe to the run): a line after each training and
    validation batch here, the epoch's summary line as before; the run is the one `trained`
    made without progress (the lines read no random state and leave the order of the data as
    it is)."""
    monkeypatch.setenv(EVERY_S_VARIABLE, "0")
    caplog.set_level("INFO", logger="vitkit")
    code, _, err = run_cli("train", "--out", tmp_path / "run", "--epochs", "2", *TRAIN)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    shown = [LINE.match(line) for line in lines if "validation" not in line]
    assert [(int(m[1]), int(m[2])) for m in shown] == [(e, b) for e in (1, 2) for b in range(1, 11)]
    validation = [re.sub(r"\d+\.\d img/s.*", "", line) for line in lines if "validation" in line]
    assert validation == [
        f"epoch {e}/2 validation: {b}/2 batches, " for e in (1, 2) for b in (1, 2)
    ]
    epochs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert [line[:22] for line in epochs] == ["epoch 1/2  train_loss ", "epoch 2/2  train_loss "]
    rows = [(run / "metrics.jsonl").read_text().splitlines() for run in (trained, tmp_path / "run")]
    losses = [[json.loads(row)["train_loss"] for row in run] for run in rows]
    assert losses[0] == losses[1]


@pytest.fixture
def folder_and_checkpoint(tmp_path):
    data = image_folder(tmp_path / "data", classes=("a", "b"), per_class=35)  # 70: 2 batches
    return data, tiny_checkpoint(tmp_path / "m.safetensors", ["a", "b"])


@pytest.mark.parametrize(
    ("command", "flags"), [("predict", ()), ("eval", ("--data", "--batch-size", "64"))]
)
def test_predict_over_a_folder_and_eval_show_a_bar_on_a_terminal_and_lines_in_a_log(
    folder_and_checkpoint, command, flags, monkeypatch, capsys
):
    data, checkpoint = folder_and_checkpoint
    argv = [command, "--checkpoint", str(checkpoint)]
    argv += [*flags[:1], str(data), *flags[1:]]
    monkeypatch.setenv(EVERY_S_VARIABLE, "0")
    terminal = Terminal()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", terminal)
        assert cli.main(argv) == 0
    assert terminal.getvalue().startswith(f"\r{command}:   0%|          | 0/2 [")
    capsys.readouterr()
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(rf"^{command}: 1/2 batches, \d+\.\d img/s, about \d+ s left$", err, re.M), err
    assert cli.main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_bad_interval_is_one_line_naming_the_variable(
    folder_and_checkpoint, run_cli, monkeypatch
):
    data, checkpoint = folder_and_checkpoint
    monkeypatch.setenv(EVERY_S_VARIABLE, "soon")
    code, _, err = run_cli("predict", "--checkpoint", checkpoint, data)
    assert code == 2
    assert err == (
        f"vitkit: error: {EVERY_S_VARIABLE}='soon' is not a number of seconds >= 0; set it to "
        "e.g. 30, or unset it\n"
    )


def _read_all(fd: int) -> bytes:
    """What the other end of a pty writes, until it is closed (or silent for a minute)."""
    got = b""
    while select.select([fd], [], [], 60.0)[0]:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other end is closed and drained
            break
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.slow
def test_predict_in_a_real_terminal_draws_the_bar_and_erases_it(folder_and_checkpoint):
    """stderr a pty, as a user's terminal: the bar is drawn, then erased (leave=False)."""
    data, checkpoint = folder_and_checkpoint
    main_end, child_end = os.openpty()
    fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24x100
    env = {**os.environ, "PYTHONPATH": str(Path(vitkit.__file__).parents[1])}
    argv = [sys.executable, "-m", "vitkit", "predict", "--checkpoint", str(checkpoint), str(data)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=child_end, env=env) as proc:
        os.close(child_end)
        shown = _read_all(main_end).decode()
        out = proc.stdout.read().decode()
    os.close(main_end)
    assert proc.returncode == 0 and len(out.splitlines()) == 70 * 2  # 2 classes: 2 lines each
    # the bar's first frame; later frames come at most every 0.1 s (tqdm's mininterval), so
    # a fast run may go from 0% to the erase without another
    assert "\rpredict:   0%|" in shown and "| 0/2 [" in shown, shown
    assert re.search(r"\] *\r {99}\r$", shown), shown  # then the line is blanked


@pytest.mark.requires("datasets", extra="datasets")
@pytest.mark.parametrize("datasets_first", [False, True])
def test_quiet_silences_the_bars_hugging_face_datasets_draws(datasets_first):
    """`--quiet` (and a rank other than 0) silences datasets' own bars too ('Generating train
    split' printed under --quiet), whether datasets is imported before or after."""
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    env["PYTHONPATH"] = str(Path(vitkit.__file__).parents[1])
    first = "import datasets; " if datasets_first else ""
    for quiet in (False, True):
        code = (f"{first}from vitkit.cli.progress import progress; progress(quiet={quiet}); "
                "import datasets; print(datasets.is_progress_bar_enabled())")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        assert out.strip() == str(not quiet)
