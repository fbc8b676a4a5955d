"""`vitkit train / eval / predict / explain` end to end on a tiny run, and every user error."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import cli, load
from vitkit.model import precision as precision_lib

TINY = [
    "--model-opt",
    "embed_dim=16",
    "--model-opt",
    "depth=1",
    "--model-opt",
    "num_heads=2",
    "--lr",
    "5e-3",
    "--batch-size",
    "128",
    "--warmup-epochs",
    "0.5",
    "--no-progress",
]
PNG = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "digits"
    code = cli.main(["train", "--out", str(out), "--epochs", "2", *TINY])
    assert code == 0
    return out


def _digit_png(path: Path, index: int, scale: int = 1) -> int:
    from sklearn.datasets import load_digits

    digits = load_digits()
    array = (digits.images[index] * 255 / 16).round().astype(np.uint8)
    image = Image.fromarray(array, mode="L")
    if scale > 1:
        image = image.resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)
    image.save(path)
    return int(digits.target[index])


def test_train_writes_the_run_and_prints_test_accuracy(trained, tmp_path, capsys):
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
    code, out, _ = run(capsys, "train", "--out", trained, "--resume", "--no-progress")
    test = json.loads((trained / "test.json").read_text())
    assert code == 0
    assert out.splitlines()[-1] == f"test accuracy: {test['test_acc1']:.4f}"
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", out.splitlines()[-1])


def test_existing_run_is_never_overwritten_silently(trained, capsys):
    code, _, err = run(capsys, "train", "--out", trained, "--epochs", "1", *TINY)
    assert code == 2
    assert err.startswith(f"vitkit: error: {trained} already holds a run (")
    assert "pass --resume to continue it or --overwrite to replace it" in err
    before = (trained / "model.safetensors").read_bytes()
    assert before == (trained / "model.safetensors").read_bytes()


def test_eval_json_and_confusion(trained, tmp_path, capsys):
    png = tmp_path / "confusion.png"
    code, out, _ = run(
        capsys, "eval", "--checkpoint", trained / "model.safetensors", "--json", "--confusion", png
    )
    assert code == 0
    row = json.loads(out)
    test = json.loads((trained / "test.json").read_text())
    assert row["acc1"] == pytest.approx(test["test_acc1"]) and row["count"] == 359
    assert row["loss"] == pytest.approx(test["test_loss"], rel=1e-5)
    assert sum(map(sum, row["confusion"])) == 359
    assert np.trace(np.array(row["confusion"])) == round(row["acc1"] * 359)
    assert png.read_bytes()[:8] == PNG
    code, out, _ = run(
        capsys,
        "eval",
        "--checkpoint",
        trained / "model.safetensors",
        "--split",
        "val",
        "--confusion",
        png,
    )
    assert code == 0 and out.startswith("val: 179 images  loss ")


def test_eval_and_predict_in_int8_and_bf16(trained, tmp_path, capsys, monkeypatch, caplog):
    """--precision int8 quantises every Linear (accuracy within 3 points of float32 on the
    digits); bf16 on a CPU without native bf16 runs float32, says so, and matches exactly."""
    checkpoint = trained / "model.safetensors"
    results = {}
    for precision in ("fp32", "int8"):
        code, out, _ = run(capsys, "eval", "--checkpoint", checkpoint, "--json",
                           "--precision", precision, "--confusion", tmp_path / "c.png")  # fmt: skip
        assert code == 0
        results[precision] = json.loads(out)
    assert abs(results["int8"]["acc1"] - results["fp32"]["acc1"]) <= 0.03
    image = tmp_path / "d.png"
    _digit_png(image, 0)
    code, out, _ = run(capsys, "predict", "--checkpoint", checkpoint, "--precision", "int8",
                       "--json", image)  # fmt: skip
    assert code == 0 and len(json.loads(out)[0]["predictions"]) == 5
    monkeypatch.setattr(precision_lib, "native_bf16", lambda: False)
    code, out, _ = run(capsys, "eval", "--checkpoint", checkpoint, "--json",
                       "--precision", "bf16", "--confusion", tmp_path / "c.png")  # fmt: skip
    assert code == 0 and json.loads(out)["loss"] == results["fp32"]["loss"]
    assert "no native bf16" in caplog.text


def test_predict_names_classes_and_resizes(trained, tmp_path, capsys):
    label = _digit_png(tmp_path / "a.png", 5)
    _digit_png(tmp_path / "big.png", 5, scale=4)  # 32x32: resized to the model's 8x8
    code, out, _ = run(
        capsys,
        "predict",
        "--checkpoint",
        trained / "model.safetensors",
        tmp_path / "a.png",
        tmp_path / "big.png",
        "--topk",
        "3",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert [Path(r["image"]).name for r in rows] == ["a.png", "big.png"]
    for row in rows:
        probs = [p["probability"] for p in row["predictions"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True)
        assert all(p["class"] == str(p["index"]) for p in row["predictions"])
    assert rows[0]["predictions"][0]["class"] == rows[1]["predictions"][0]["class"]
    model = load(trained / "model.safetensors")
    mean, std = torch.tensor(model.meta["mean"]), torch.tensor(model.meta["std"])
    x = torch.from_numpy(np.array(Image.open(tmp_path / "a.png"))).float()[None, None] / 255
    probs = torch.softmax(model((x - mean) / std), -1)[0]
    assert rows[0]["predictions"][0]["probability"] == pytest.approx(probs.max().item(), abs=1e-5)
    assert label in range(10)
    code, out, _ = run(
        capsys, "predict", "--checkpoint", trained / "model.safetensors", tmp_path / "a.png"
    )
    assert code == 0 and out.startswith(f"{tmp_path / 'a.png'}: ")
    assert len(out.splitlines()) == 5


def test_predict_corrupt_and_missing_images(trained, tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    code, _, err = run(capsys, "predict", "--checkpoint", trained / "model.safetensors", bad)
    assert code == 2 and err.startswith(f"vitkit: error: cannot read image {bad}")
    code, _, err = run(
        capsys, "predict", "--checkpoint", trained / "model.safetensors", tmp_path / "nope.png"
    )
    assert (
        code == 2 and err.strip() == f"vitkit: error: image {tmp_path / 'nope.png'} does not exist"
    )


def test_explain_draws_png(trained, tmp_path, capsys):
    _digit_png(tmp_path / "a.png", 3)
    out_png = tmp_path / "explain.png"
    code, out, _ = run(
        capsys,
        "explain",
        "--checkpoint",
        trained / "model.safetensors",
        tmp_path / "a.png",
        "--out",
        out_png,
        "--per-head",
    )
    assert code == 0 and out_png.read_bytes()[:8] == PNG
    assert f"attention maps in {out_png}" in out


def _folder(root: Path, classes=("a", "b"), per_class: int = 6, size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            array = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(array).save(root / name / f"{i}.png")
    return root


def test_mismatched_checkpoint_and_data(trained, tmp_path, capsys):
    folder = _folder(tmp_path / "two")
    code, _, err = run(
        capsys, "eval", "--checkpoint", trained / "model.safetensors", "--data", folder
    )
    assert code == 2
    assert re.match(r"vitkit: error: .*two has 2 classes .* but .* was trained on 10", err)
    other = tmp_path / "other"
    code = cli.main(
        [
            "train",
            "--out",
            str(other),
            "--epochs",
            "1",
            *TINY[:-7],
            "--model-opt",
            "embed_dim=32",
            "--pretrained",
            str(trained / "model.safetensors"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "does not match the model" in err and "wrong shape" in err


def test_training_on_a_folder_skips_corrupt_images(tmp_path, capsys, caplog):
    folder = _folder(tmp_path / "imgs", per_class=8)
    (folder / "a" / "zz_broken.png").write_bytes(b"nope")
    code, out, _ = run(
        capsys,
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
        (["--resume", "--overwrite"], "vitkit: error: {out} holds no run settings (config.json)"),
    ],
)
def test_user_errors(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", "--out", out, "--no-progress", *argv)
    assert code == 2
    assert err.startswith(message.format(out=out)), err
    assert len(err.strip().splitlines()) == 1


def test_empty_data_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "train", "--data", tmp_path / "empty", "--out", tmp_path / "r")
    assert code == 2 and "has no class sub-folders" in err


def test_out_not_writable(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(capsys, "train", "--out", blocker / "run", "--epochs", "1", *TINY)
    assert code == 2 and err.startswith(f"vitkit: error: --out {blocker / 'run'} is not writable")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, _, err = run(capsys, "train", "--out", locked / "run", "--epochs", "1", *TINY)
        assert code == 2 and "is not writable" in err


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


def test_training_setup_builds_what_train_would_train():
    from vitkit.train import resolve_config, training_setup

    setup = training_setup(resolve_config({"data": "digits", "model_opts": {"depth": 1}}))
    assert setup.config.model == "vit_digits" and setup.config.epochs == 120
    assert setup.config.recipe == "small"
    assert (len(setup.train_set), len(setup.val_set), len(setup.test_set)) == (1259, 179, 359)
    assert setup.model.config.depth == 1 and tuple(setup.model.patch_embed.img_size) == (8, 8)
    image, label = setup.train_set[0]
    assert image.shape == (1, 8, 8) and 0 <= label < 10


def test_the_in_chans_option_is_how_image_files_are_read(tmp_path, capsys):
    """Images are read with 1 or 3 channels (refused before anything is written); a built-in
    source has its own, which the option may not contradict."""
    from vitkit.train import resolve_config, training_setup

    code = cli.main(["train", "--in-chans", "2", "--out", str(tmp_path / "run")])
    assert code == 2 and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (
        "vitkit: error: in_chans 2: training reads images with 1 or 3 channels; choose one of "
        "them\n"
    )
    with pytest.raises(ValueError, match=r"^digits holds 1-channel images; the in_chans option"):
        training_setup(resolve_config({"model_opts": {"in_chans": 3}}))


def test_train_limit_takes_a_seeded_subset_of_the_training_images():
    from vitkit.train import resolve_config, training_setup

    full = training_setup(resolve_config({}))
    small = training_setup(resolve_config({"train_limit": 50}))
    again = training_setup(resolve_config({"train_limit": 50}))
    assert len(small.train_set) == 50 < len(full.train_set)
    assert (len(small.val_set), len(small.test_set)) == (len(full.val_set), len(full.test_set))
    labels = [small.train_set[i][1] for i in range(50)]
    assert labels == [again.train_set[i][1] for i in range(50)] and len(set(labels)) > 5
