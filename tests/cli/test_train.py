"""`vitkit train` end to end on a tiny run, and its user errors."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit import load

from ._cli import PNG, TINY, image_folder


def test_train_writes_the_run_and_prints_test_accuracy(trained, tmp_path, run_cli):
    for name in (
        "model.safetensors",
        "last.safetensors",
        "config.json",
        "metrics.jsonl",
        "curves.png",
        "state.pt",
        "test.json",
    ):
        assert (trained / name).is_file(), name
    rows = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert {"epoch", "train_loss", "val_loss", "val_acc1", "val_acc5", "lr", "seconds"} <= set(
        rows[0]
    )
    config = json.loads((trained / "config.json").read_text())
    assert config["settings"]["model"] == "vit_digits" and config["model"]["embed_dim"] == 16
    assert config["settings"]["lr"] == 5e-3 and config["settings"]["epochs"] == 2
    model = load(trained / "model.safetensors")
    assert model.meta["class_names"] == [str(d) for d in range(10)]
    assert (trained / "curves.png").read_bytes()[:8] == PNG
    state = torch.load(trained / "state.pt", weights_only=True)
    assert state["epoch"] == 2
    # --resume of a finished run trains no more and prints the same test accuracy
    code, out, _ = run_cli("train", "--out", trained, "--resume", "--no-progress")
    test = json.loads((trained / "test.json").read_text())
    assert code == 0
    assert out.splitlines()[-1] == f"test accuracy: {test['test_acc1']:.4f}"
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", out.splitlines()[-1])


def test_existing_run_is_never_overwritten_silently(trained, run_cli):
    files = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    code, _, err = run_cli("train", "--out", trained, "--epochs", "1", "--seed", "7", *TINY)
    assert code == 2
    assert err.startswith(f"vitkit: error: {trained} already holds a run (")
    assert "pass --resume to continue it or --overwrite to replace it" in err
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == files


def test_training_on_a_folder_skips_corrupt_images(tmp_path, run_cli, caplog):
    folder = image_folder(tmp_path / "imgs", per_class=8)
    (folder / "a" / "zz_broken.png").write_bytes(b"nope")
    code, out, _ = run_cli(
        "train",
        "--data",
        folder,
        "--out",
        tmp_path / "run",
        "--epochs",
        "1",
        "--img-size",
        "8",
        "--val-fraction",
        "0.25",
        "--test-fraction",
        "0.25",
        "--aa",
        "rand-m9-mstd0.5",
        "--in-chans",
        "3",
        *TINY,
    )
    assert code == 0 and out.splitlines()[-1].startswith("test accuracy: ")
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "zz_broken.png" in m and m.startswith("skipping cannot read image") for m in messages
    )
    model = load(tmp_path / "run" / "model.safetensors")
    assert model.meta["class_names"] == ["a", "b"] and model.config.in_chans == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--data", "/nonexistent/data"],
            "vitkit: error: data '/nonexistent/data' is neither a built-in",
        ),
        (["--resume"], "vitkit: error: {out} holds no run settings (config.json)"),
        (["--model", "vit_nope"], "vitkit: error: unknown model"),
        (["--model-opt", "depth"], "vitkit: error: --model-opt takes KEY=VALUE"),
        (["--resume", "--overwrite"], "vitkit: error: --resume and --overwrite exclude each other"),
    ],
)
def test_user_errors(tmp_path, run_cli, argv, message):
    out = tmp_path / "run"
    code, _, err = run_cli("train", "--out", out, "--no-progress", *argv)
    assert code == 2
    assert err.startswith(message.format(out=out)), err
    assert len(err.strip().splitlines()) == 1


def test_empty_data_folder(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("train", "--data", tmp_path / "empty", "--out", tmp_path / "r")
    assert code == 2 and "has no class sub-folders" in err


def test_out_not_writable(tmp_path, run_cli):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli("train", "--out", blocker / "run", "--epochs", "1", *TINY)
    assert code == 2 and err.startswith(f"vitkit: error: --out {blocker / 'run'} is not writable")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, err = run_cli("train", "--out", locked / "run", "--epochs", "1", *TINY)
        assert code == 2 and "is not writable" in err


def test_pretrained_weights_of_another_shape_are_refused(trained, tmp_path, run_cli):
    code, _, err = run_cli(
        "train", "--out", tmp_path / "other", "--epochs", "1", *TINY[:-7],
        "--model-opt", "embed_dim=32", "--pretrained", trained / "model.safetensors",
        "--no-progress",
    )  # fmt: skip
    assert code == 2 and "does not match the model" in err and "wrong shape" in err


@pytest.mark.slow
def test_default_train_meets_the_acceptance_bar(tmp_path):
    """`vitkit train` with no arguments reaches test top-1 >= 0.97 (its time on 2 cores is
    measured and reported in the README, never asserted: tests do not time)."""
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.run(
        [sys.executable, "-m", "vitkit", "train"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(src)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.splitlines()[-1]
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", last)
    assert float(last.split()[-1]) >= 0.97
    assert (tmp_path / "runs" / "digits-vit_digits" / "model.safetensors").is_file()


def test_a_resume_refusal_names_unset_settings_as_such(trained, run_cli):
    argv = ["--pretrained", "w.pth", "--seed", "3", "--model-opt", "depth=2"]
    code, _, err = run_cli("train", "--out", trained, "--resume", *argv)
    assert code == 2 and "None" not in err
    assert (
        "it cannot change seed (saved 0, given 3), model_opts.depth (saved 1, given 2), "
        'pretrained (saved unset, given "w.pth"): keep the saved values' in err
    )


def test_model_beside_pretrained_is_the_architecture_or_refused(tmp_path, run_cli):
    """`--model NAME --pretrained W` names W's architecture: a state dict of vit_digits
    (width 64: no standard head count) trains with `--model vit_digits`, which gives its
    heads; a model of other sizes is refused, naming them; never silently ignored."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_digits", depth=1)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    argv = ["train", "--pretrained", tmp_path / "w.pth", "--epochs", "1", "--no-progress"]
    code, _, err = run_cli(*argv, "--out", tmp_path / "a")
    assert (code, err.endswith("; pass --model-opt num_heads=N\n")) == (2, True)
    code, _, err = run_cli(*argv, "--out", tmp_path / "b", "--model", "vit_mnist")
    assert (code, err) == (
        2,
        "vitkit: error: --model vit_mnist does not match the weights: they have embed_dim 64 "
        "(vit_mnist: 128), depth 1 (vit_mnist: 6), patch_size (2, 2) (vit_mnist: (7, 7)), MLP "
        "width 128 (vit_mnist: 256); give their architecture, or drop --model\n",
    )
    code, _, err = run_cli(*argv, "--out", tmp_path / "c", "--model", "vit_digits",
                           "--model-opt", "depth=1")  # fmt: skip
    assert code == 0, err
    trained = vitkit.load(tmp_path / "c" / "model.safetensors").config
    assert (trained.num_heads, trained.depth, trained.embed_dim) == (4, 1, 64)


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_resume_and_overwrite_together_are_refused_as_such(command, tmp_path, run_cli):
    """Not as a folder without saved settings, which is what it said before checking."""
    code, _, err = run_cli(command, "--out", tmp_path / "none", "--resume", "--overwrite")
    assert (code, err) == (
        2,
        "vitkit: error: --resume and --overwrite exclude each other: drop one\n",
    )
    assert not (tmp_path / "none").exists()


def test_a_fine_tuning_run_is_named_after_its_weights(tmp_path, run_cli, monkeypatch):
    """Without --out or --model, a run from --pretrained weights goes to
    runs/<data>-<the weights' name>, not to the folder of the data's default model."""
    torch.manual_seed(0)
    vitkit.save(vitkit.create_model("vit_digits", depth=1), tmp_path / "digits-w.safetensors")
    monkeypatch.chdir(tmp_path)
    argv = ["--pretrained", "digits-w.safetensors", "--epochs", "1", "--no-progress"]
    code, _, err = run_cli("train", *argv)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["digits-digits-w"]
    code, _, err = run_cli("train", *argv, "--epochs", "2", "--resume")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["digits-digits-w"]


def test_json_prints_the_run_summary_alone_and_log_tensorboard_writes_events(
    tmp_path, run_cli, caplog
):
    """`--json`: stdout is one JSON object, the run's summary; `--log tensorboard` writes
    event files, and a resume may turn it off (how the run executes, not what it computes);
    the log line counts '1 epoch'."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    caplog.set_level("INFO", logger="vitkit")
    code, printed, _ = run_cli("train", "--out", out, "--epochs", "1", *TINY, "--json",
                               "--log", "tensorboard")  # fmt: skip
    summary = json.loads(printed)  # the whole of stdout
    test = json.loads((out / "test.json").read_text())
    assert code == 0 and summary["out"] == str(out) and summary["epochs"] == 1
    assert (summary["task"], summary["interrupted"]) == ("classification", False)
    assert summary["test"]["acc1"] == test["test_acc1"] and summary["test"]["count"] == 359
    assert summary["files"] == sorted(
        ["config.json", "curves.png", "last.safetensors", "metrics.csv", "metrics.jsonl",
         "model.safetensors", "state.pt", "test.json"]
    )  # fmt: skip
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert json.loads((out / "config.json").read_text())["settings"]["loggers"] == ["tensorboard"]
    assert any(m.endswith(f", 1 epoch -> {out}") for m in caplog.messages)
    code, printed, _ = run_cli("train", "--out", out, "--resume", "--epochs", "2", "--log",
                               "--json", "--no-progress")  # fmt: skip
    assert code == 0 and json.loads(printed)["epochs"] == 2
    assert 'resume: taking loggers [] (saved ["tensorboard"])' in caplog.messages
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_a_logger_that_is_not_installed_is_one_line_before_any_work(tmp_path, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    out = tmp_path / "run"
    code, printed, err = run_cli("train", "--out", out, *TINY, "--log", "tensorboard")
    assert (code, printed) == (2, "") and err == (
        "vitkit: error: logging to tensorboard needs the tensorboard package, which is not "
        "installed: pip install tensorboard (or pip install 'vitkit[tensorboard]')\n"
    )
    assert not out.exists()
    code, _, err = run_cli("train", "--out", out, *TINY, "--log", "wandb")
    assert (code, err) == (2, "vitkit: error: unknown loggers 'wandb'; expected one of "
                              "'tensorboard'\n")  # fmt: skip


def test_pretrain_json_prints_the_run_summary_alone(tmp_path, run_cli):
    out = tmp_path / "mae"
    code, printed, _ = run_cli("pretrain", "--out", out, "--epochs", "1", *TINY, "--json",
                               "--decoder-dim", "8", "--decoder-depth", "1")  # fmt: skip
    summary = json.loads(printed)
    assert code == 0 and (summary["task"], summary["epochs"], summary["test"]) == ("mae", 1, None)
    assert "encoder.safetensors" in summary["files"]
