"""Command-line mistakes not covered by the other CLI tests: each is exit code 2 and one
`error: ...` line that says what to do, never a traceback (the `run_cli` fixture checks that).

Elsewhere: unknown data, model and model options, --resume without a run, an existing run,
an unwritable --out (`test_cli_train.py`); settings files (`test_config_file.py`); bad images
and data folders (`test_bad_images.py`); exit code 1 for a failed run
(`test_run_failures.py`); 130 for a signal (`test_signals.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _run import TINY

from vitkit import cli


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert cli.main(["train", "--out", str(out), "--epochs", "1", *TINY]) == 0
    return out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "bogus"], "device 'bogus' is not a device; use cpu, cuda or cuda:N"),
        (["--threads", "-1"], "threads must be >= 1, got -1"),
        (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
        (["--epochs", "0"], "epochs must be >= 1, got 0"),
        (["--lr", "-1"], "lr must be > 0, got -1.0"),
        (["--lr", "0"], "lr must be > 0, got 0.0"),
        (["--mixup", "-0.5"], "mixup must be >= 0 (0: off), got -0.5"),
        (["--mix-prob", "1.5"], "mix_prob is a probability in [0, 1], got 1.5"),
        (["--smoothing", "1"], "smoothing must be in [0, 1), got 1.0"),
        (["--crop-scale", "1", "0.5"], "crop_scale (MIN, MAX) needs 0 < MIN <= MAX <= 1, got"),
        (["--hflip", "2"], "hflip is a probability in [0, 1], got 2.0"),
        (["--val-fraction", "0.9"], "split fractions [0.9, 0.2] add up to more than 1"),
        (["--amp", "fp16", "--device", "cpu"], "amp='fp16' needs a CUDA device; use amp='bf16'"),
        (["--distill", "hard"], "distill='hard' needs a teacher model"),
    ],
)
def test_train_mistakes(tmp_path, run_cli, argv, message):
    code, stdout, err = run_cli("train", "--out", tmp_path / "run", *TINY, "--epochs", "1", *argv)
    assert (code, stdout) == (2, "")
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(tmp_path, run_cli):
    code, _, err = run_cli("train", "--out", tmp_path / "run", *TINY, "--device", "cuda:1")
    assert code == 2
    assert err == "error: device cuda:1: this machine has 0 CUDA device(s); use --device cpu\n"


def test_resume_of_a_run_that_never_began(tmp_path, run_cli, finished):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_bytes((finished / "config.json").read_bytes())
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert code == 2 and err == (
        f"error: --resume: {out} holds no training state (state.pt), the run stopped before "
        "it began; start it again with --overwrite\n"
    )


def test_resume_from_a_damaged_state_file(tmp_path, run_cli, finished):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_bytes((finished / "config.json").read_bytes())
    data = (finished / "state.pt").read_bytes()
    (out / "state.pt").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot read the training state {out / 'state.pt'} (")
    assert err.endswith("); start again with --overwrite\n")


def test_eval_and_predict_mistakes(tmp_path, run_cli, finished):
    model = finished / "model.safetensors"
    code, _, err = run_cli("predict", "--checkpoint", model, "--topk", "0", "x.png")
    assert (code, err) == (2, "error: --topk must be >= 1, got 0\n")
    code, _, err = run_cli("eval", "--checkpoint", tmp_path / "nope.safetensors")
    assert code == 2 and err.startswith("error: checkpoint ") and "does not exist" in err
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(model.read_bytes()[:100])
    code, _, err = run_cli("eval", "--checkpoint", broken)
    assert code == 2 and err.startswith(f"error: {broken} is not a readable safetensors file")
    assert err.count("\n") == 1
