"""Command-line mistakes not covered by the other CLI tests: each is exit code 2 and one
`vitkit: error: ...` line that says what to do, never a traceback (`run_cli` checks that).

Elsewhere: unknown data, model and model options, --resume without a run, an existing run,
an unwritable --out (`test_cli_train.py`); settings files (`test_config_file.py`); bad images
and data folders (`test_bad_images.py`); exit code 1 for a failed run
(`test_run_failures.py`); 130 for a signal (`test_signals.py`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _run import TINY
from PIL import Image

import vitkit
from vitkit import cli
from vitkit.cli import train as train_command


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert cli.main(["train", "--out", str(out), "--epochs", "1", *TINY]) == 0
    return out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "bogus"], "device 'bogus' is not a device; use cpu, cuda or cuda:N"),
        (["--threads", "-1"], "threads must be in [1, 1024], got -1"),
        (["--threads", "100000"], "threads must be in [1, 1024], got 100000"),
        (["--img-size", "0"], "img_size must be in [1, 65536], got 0"),
        (["--img-size", "8", "0"], "img_size must be in [1, 65536], got (8, 0)"),
        (["--crop-scale", "0.5", "nan"], "crop_scale must be a finite number, got (0.5, nan)"),
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
    assert err.startswith(f"vitkit: error: {message}") and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(tmp_path, run_cli):
    code, _, err = run_cli("train", "--out", tmp_path / "run", *TINY, "--device", "cuda:1")
    assert code == 2
    assert (
        err == "vitkit: error: device cuda:1: this machine has 0 CUDA device(s); use --device cpu\n"
    )


def test_resume_of_a_run_that_never_began(tmp_path, run_cli, finished):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_bytes((finished / "config.json").read_bytes())
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert code == 2 and err == (
        f"vitkit: error: --resume: {out} holds no training state (state.pt), the run stopped "
        "before it began; start it again with --overwrite\n"
    )


def test_resume_from_a_damaged_state_file(tmp_path, run_cli, finished):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_bytes((finished / "config.json").read_bytes())
    data = (finished / "state.pt").read_bytes()
    (out / "state.pt").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli("train", "--out", out, "--resume")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"vitkit: error: cannot read the training state {out / 'state.pt'} (")
    assert err.endswith("); start again with --overwrite\n")


def test_eval_and_predict_mistakes(tmp_path, run_cli, finished):
    model = finished / "model.safetensors"
    code, _, err = run_cli("predict", "--checkpoint", model, "--topk", "0", "x.png")
    assert (code, err) == (
        2,
        "vitkit: error: --topk must be >= 1, got 0; see `vitkit predict --help`\n",
    )
    code, _, err = run_cli("eval", "--checkpoint", model, "--batch-size", "0")
    assert (code, err) == (
        2,
        "vitkit: error: --batch-size must be >= 1, got 0; see `vitkit eval --help`\n",
    )
    code, _, err = run_cli("export", "--checkpoint", model, tmp_path / "m.onnx", "--opset", "999")
    assert code == 2 and err.startswith(
        "vitkit: error: opset 999 is newer than the installed onnx knows ("
    )
    assert not (tmp_path / "m.onnx").exists()
    code, _, err = run_cli("eval", "--checkpoint", tmp_path / "nope.safetensors")
    assert (code, err) == (2, f"vitkit: error: {tmp_path / 'nope.safetensors'} does not exist\n")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(model.read_bytes()[:100])
    code, _, err = run_cli("eval", "--checkpoint", broken)
    assert code == 2 and err.startswith(f"vitkit: error: {broken} is not a valid safetensors file")
    assert err.count("\n") == 1


def _nan_checkpoint(finished: Path, tmp_path: Path) -> Path:
    model = vitkit.load(finished / "model.safetensors")
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    path = tmp_path / "nan.safetensors"
    vitkit.save(model, path, meta=model.meta)
    return path


def test_nan_outputs_fail_and_never_print_invalid_json(tmp_path, run_cli, finished):
    """Predictions and an evaluation that are NaN exit 1 with one line; stdout stays empty,
    so a `--json` reader never gets a document with NaN in it."""
    path = _nan_checkpoint(finished, tmp_path)
    image = tmp_path / "digit.png"
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(image)
    code, out, err = run_cli("predict", "--checkpoint", path, "--json", image)
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith("vitkit: error: the model's outputs are not finite (NaN or inf)")
    code, out, err = run_cli("eval", "--checkpoint", path, "--json")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "its outputs are not finite" in err


def test_sigterm_during_set_up_ends_with_a_message(tmp_path, run_cli, monkeypatch):
    """SIGTERM before training has installed its own handler (here: while the settings are
    resolved) ends with exit 130 and a message, not a silent -15."""
    real = train_command.resolve_config

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_command, "resolve_config", terminated)
    code, _, err = run_cli("train", "--out", tmp_path / "run", *TINY)
    assert (code, err) == (130, "vitkit: interrupted (SIGTERM)\n")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_missing_optional_package_names_the_extra(tmp_path, run_cli, finished, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript -> ImportError
    code, _, err = run_cli(
        "export", "--checkpoint", finished / "model.safetensors", tmp_path / "m.onnx"
    )
    assert code == 2 and err == (
        "vitkit: error: this needs the optional package onnxscript, which is not installed: "
        "pip install 'vitkit[onnx]'\n"
    )


def test_an_unexpected_error_is_one_line_unless_debug(tmp_path, run_cli, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("deep inside\n  a second line")

    monkeypatch.setattr(train_command, "resolve_config", broken)
    code, _, err = run_cli("train", "--out", tmp_path / "run", *TINY)
    assert (code, err) == (
        1,
        "vitkit: error: unexpected RuntimeError: deep inside; rerun with --debug for the "
        "traceback and report it\n",
    )
    with pytest.raises(RuntimeError, match="deep inside"):
        cli.main(["--debug", "train", "--out", str(tmp_path / "run"), *TINY])


@pytest.mark.parametrize(
    "command", ["train", "eval", "predict", "explain", "convert", "export", "models", "summary"]
)
def test_usage_errors_of_every_subcommand_are_one_line(run_cli, command):
    code, out, err = run_cli(command, "--no-such-flag")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("vitkit: error: ") and "--help" in err


def test_a_missing_head_count_names_each_commands_flag(tmp_path, run_cli):
    """Weights of a non-standard width do not tell the head count: each command asks for its
    own flag (convert, eval: --num-heads; train: --model-opt num_heads=N), the Python API for
    num_heads=N."""
    torch.manual_seed(0)
    model = vitkit.VisionTransformer(img_size=16, patch_size=8, embed_dim=40, depth=1,
                                     num_heads=4, num_classes=3)  # fmt: skip
    torch.save(model.state_dict(), tmp_path / "w.pth")
    out = tmp_path / "v.safetensors"
    what = (
        "the weights do not record the number of attention heads and width 40 is not a "
        "standard ViT size (192, 384, 768, 1024, 1280); pass "
    )
    code, _, err = run_cli("convert", "--from", "timm", tmp_path / "w.pth", out, "--no-parity")
    assert (code, err) == (2, f"vitkit: error: {what}--num-heads N\n") and not out.exists()
    code, _, err = run_cli("eval", "--checkpoint", tmp_path / "w.pth", "--data", "digits")
    assert (code, err) == (2, f"vitkit: error: {what}--num-heads N\n")
    code, _, err = run_cli("train", "--pretrained", tmp_path / "w.pth", "--out", tmp_path / "r")
    assert (code, err) == (2, f"vitkit: error: {what}--model-opt num_heads=N\n")
    assert run_cli("convert", "--from", "timm", tmp_path / "w.pth", out, "--num-heads", "4")[0] == 0
    assert vitkit.load(out).config.num_heads == 4
    with pytest.raises(vitkit.CheckpointError, match=f"^{re.escape(what)}num_heads=N$") as err:
        vitkit.load_pretrained(tmp_path / "w.pth")
    assert err.value.option == "num_heads"
