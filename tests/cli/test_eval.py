"""`vitkit eval`: the numbers and the confusion matrix of a checkpoint on data."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from vitkit.model import precision as precision_lib

from ._cli import PNG, digit_png, image_folder, timm_folder, tiny_checkpoint


def test_eval_json_and_confusion(trained, tmp_path, run_cli):
    png = tmp_path / "confusion.png"
    code, out, _ = run_cli(
        "eval", "--checkpoint", trained / "model.safetensors", "--json", "--confusion", png
    )
    assert code == 0
    row = json.loads(out)
    test = json.loads((trained / "test.json").read_text())
    assert row["acc1"] == pytest.approx(test["test_acc1"]) and row["count"] == 359
    assert row["loss"] == pytest.approx(test["test_loss"], rel=1e-5)
    assert sum(map(sum, row["confusion"])) == 359
    assert np.trace(np.array(row["confusion"])) == round(row["acc1"] * 359)
    assert png.read_bytes()[:8] == PNG
    code, out, _ = run_cli(
        "eval",
        "--checkpoint",
        trained / "model.safetensors",
        "--split",
        "val",
        "--confusion",
        png,
    )
    assert code == 0 and out.startswith("val: 179 images  loss ")


def test_eval_and_predict_in_int8_and_bf16(trained, tmp_path, run_cli, monkeypatch, caplog):
    """--precision int8 quantises every Linear (accuracy within 3 points of float32 on the
    digits); bf16 on a CPU without native bf16 runs float32, says so, and matches exactly."""
    checkpoint = trained / "model.safetensors"
    results = {}
    for precision in ("fp32", "int8"):
        code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--json",
                           "--precision", precision, "--confusion", tmp_path / "c.png")  # fmt: skip
        assert code == 0
        results[precision] = json.loads(out)
    assert abs(results["int8"]["acc1"] - results["fp32"]["acc1"]) <= 0.03
    image = tmp_path / "d.png"
    digit_png(image, 0)
    code, out, _ = run_cli("predict", "--checkpoint", checkpoint, "--precision", "int8",
                       "--json", image)  # fmt: skip
    assert code == 0 and len(json.loads(out)[0]["predictions"]) == 5
    monkeypatch.setattr(precision_lib, "native_bf16", lambda: False)
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--json",
                       "--precision", "bf16", "--confusion", tmp_path / "c.png")  # fmt: skip
    assert code == 0 and json.loads(out)["loss"] == results["fp32"]["loss"]
    assert "no native bf16" in caplog.text


def test_mismatched_checkpoint_and_data(trained, tmp_path, run_cli):
    folder = image_folder(tmp_path / "two")
    code, _, err = run_cli("eval", "--checkpoint", trained / "model.safetensors", "--data", folder)
    assert code == 2
    assert re.match(r"vitkit: error: .*two has 2 classes .* but .* was trained on 10", err)


def test_counts_and_top_k_are_said_right(tmp_path, run_cli):
    """One image is '1 image'; with 4 classes the top-5 is a top-4 and says so."""
    folder = image_folder(tmp_path / "data", classes=("b", "c", "d"), per_class=2)
    image_folder(folder, classes=("a",), per_class=5)  # a's fifth of 5 is the test split
    meta = {"data": str(folder), "val_fraction": 0.1, "test_fraction": 0.2, "split_seed": 0}
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["a", "b", "c", "d"], **meta)
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--confusion", tmp_path / "c.png")
    assert code == 0 and re.fullmatch(
        r"test: 1 image  loss \d+\.\d{4}  top-1 [01]\.0000  top-4 1\.0000", out.splitlines()[0]
    )


def test_eval_takes_a_timm_folder_and_scores_a_folder(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    data = image_folder(tmp_path / "data", classes=("a", "b", "c"), per_class=4, size=40)
    argv = ["--data", data, "--split", "all", "--confusion", tmp_path / "c.png", "--json"]
    code, out, err = run_cli("eval", "--checkpoint", folder, *argv)
    assert (code, err) == (0, "") and json.loads(out)["count"] == 12


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: timm_folder(p / "headless", num_classes=0),
         "{p}/headless is a timm folder without a classifier head; eval needs class scores: "
         "fine-tune it first (vitkit train --pretrained {p}/headless)"),
        (lambda p: p.joinpath("empty").mkdir() or p / "empty",
         "{p}/empty is a folder without model.safetensors or pytorch_model.bin; pass a "
         "weights file"),
        (lambda p: p.joinpath("w.pth").write_bytes(b"hello, this is text") and p / "w.pth",
         "{p}/w.pth is not a readable PyTorch checkpoint ("),
    ],
    ids=["headless", "empty-folder", "not-a-pickle"],
)  # fmt: skip
def test_weights_it_cannot_score_are_named_for_what_they_are(tmp_path, run_cli, make, message):
    pytest.importorskip("timm")
    code, out, err = run_cli("eval", "--checkpoint", make(tmp_path), "--data", "digits")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("vitkit: error: " + message.format(p=tmp_path))
    assert "does not exist or is not a file" not in err and "header too large" not in err


def test_an_architecture_of_other_sizes_is_refused(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    code, _, err = run_cli("eval", "--checkpoint", folder, "--arch", "vit_small_patch16_224")
    assert code == 2 and err.startswith(
        "vitkit: error: --arch vit_small_patch16_224 does not match the weights: they have "
        "embed_dim 192 (vit_small_patch16_224: 384), depth 2 (vit_small_patch16_224: 12)"
    )
