"""`vitkit eval`: the numbers and the confusion matrix of a checkpoint on data."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from _helpers import image_folder
from vitkit.cli import ExitCode
from vitkit.model import precision as precision_lib

from ._cli import PNG, digit_png, timm_folder, tiny_checkpoint


def test_eval_json_and_confusion(trained, tmp_path, run_cli):
    """Without --data: the test split of the data the run trained on (the test accuracy
    `train` printed), per-class scores in the JSON; --split val scores the val split."""
    png = tmp_path / "confusion.png"
    checkpoint = trained / "model.safetensors"
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--json", "--confusion", png)
    assert code == 0
    row = json.loads(out)
    test = json.loads((trained / "test.json").read_text())
    assert row["acc1"] == pytest.approx(test["test_acc1"]) and row["count"] == 359
    assert row["loss"] == pytest.approx(test["test_loss"], rel=1e-5)
    assert (row["part"], row["skipped"]) == ("test split", {})
    assert row["description"] == (
        "the test split of digits (359 images, split seed 0: images training never saw)"
    )
    confusion = np.array(row["confusion"])
    assert confusion.sum() == 359 and np.trace(confusion) == round(row["acc1"] * 359)
    assert [c["class"] for c in row["per_class"]] == [str(d) for d in range(10)]
    for k, scores in enumerate(row["per_class"]):
        assert scores["support"] == confusion[k].sum()
        assert scores["recall"] == pytest.approx(confusion[k, k] / confusion[k].sum())
        predicted = confusion[:, k].sum()
        assert scores["precision"] == pytest.approx(confusion[k, k] / predicted if predicted else 0)
    assert png.read_bytes()[:8] == PNG
    assert row["per_class_png"] == str(trained / "per_class_digits_test-split.png")
    assert (trained / "per_class_digits_test-split.png").read_bytes()[:8] == PNG
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--split", "val",
                           "--confusion", png)  # fmt: skip
    lines = out.splitlines()
    assert code == 0 and lines[0] == "scored the val split of digits (179 images, split seed 0)"
    assert lines[1].startswith("179 images  loss ")
    assert lines[2].split() == ["class", "precision", "recall", "F1", "support"]
    assert [line.split()[0] for line in lines[3:13]] == [str(d) for d in range(10)]
    assert sum(int(line.split()[-1]) for line in lines[3:13]) == 179
    assert lines[13:] == [
        f"confusion matrix: {png}",
        f"per-class scores: {trained / 'per_class_digits_val-split.png'}",
    ]


def _folder_run(tmp_path, classes=("a", "b")):
    """A checkpoint of `classes` trained (so its record says) on the folder `train_data`."""
    trained_on = image_folder(tmp_path / "train_data", classes=classes, per_class=5)
    meta = {"data": str(trained_on), "val_fraction": 0.1, "test_fraction": 0.2, "split_seed": 0}
    (tmp_path / "run").mkdir()
    return tiny_checkpoint(tmp_path / "run" / "model.safetensors", list(classes), **meta)


def test_a_held_out_folder_is_scored_whole_and_named_in_the_pictures(tmp_path, run_cli):
    """`eval --data heldout/` scores every image of it (as timm's validate), not the 20 %
    test split; each data and part gets its own pictures beside the checkpoint."""
    checkpoint = _folder_run(tmp_path)
    heldout = image_folder(tmp_path / "heldout", classes=("a", "b"), per_class=6)
    code, out, err = run_cli("eval", "--checkpoint", checkpoint, "--data", heldout)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"scored all of {heldout}/ (12 images)"
    assert out.splitlines()[1].startswith("12 images  loss ")
    run = checkpoint.parent
    assert f"confusion matrix: {run / 'confusion_heldout_all.png'}" in out.splitlines()
    other = image_folder(tmp_path / "other", classes=("b",), per_class=3)  # some classes only
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--data", other, "--json")
    row = json.loads(out)
    assert (code, row["count"], row["part"]) == (0, 3, "all")
    assert [c["support"] for c in row["per_class"]] == [0, 3]
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--json")  # its own data
    assert (code, json.loads(out)["count"], json.loads(out)["part"]) == (0, 2, "test split")
    split = image_folder(tmp_path / "pets" / "test", classes=("a", "b"), per_class=2)
    image_folder(tmp_path / "pets" / "train", classes=("a", "b"), per_class=4)
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--data", tmp_path / "pets")
    assert (code, out.splitlines()[0]) == (0, f"scored {split}/ (4 images)")
    assert sorted(p.name for p in run.glob("*.png")) == [
        "confusion_heldout_all.png", "confusion_other_all.png", "confusion_pets_test.png",
        "confusion_train_data_test-split.png", "per_class_heldout_all.png",
        "per_class_other_all.png", "per_class_pets_test.png",
        "per_class_train_data_test-split.png",
    ]  # fmt: skip


def test_a_run_folder_gets_its_pictures_inside_it(tmp_path, run_cli):
    """`--checkpoint runs/x` (a folder) puts them in runs/x, as `--checkpoint
    runs/x/model.safetensors` does; not in runs/, where every run's would meet."""
    run = _folder_run(tmp_path).parent
    heldout = image_folder(tmp_path / "heldout", classes=("a", "b"), per_class=2)
    code, out, _ = run_cli("eval", "--checkpoint", run, "--data", heldout)
    assert code == 0 and f"confusion matrix: {run / 'confusion_heldout_all.png'}" in out
    assert sorted(p.name for p in run.glob("*.png")) == [
        "confusion_heldout_all.png",
        "per_class_heldout_all.png",
    ]
    assert list(tmp_path.glob("*.png")) == []


def test_unreadable_images_are_skipped_named_and_the_exit_status_says_so(tmp_path, run_cli):
    checkpoint = _folder_run(tmp_path)
    heldout = image_folder(tmp_path / "heldout", classes=("a", "b"), per_class=3)
    bad = heldout / "b" / "broken.png"
    bad.write_bytes(PNG + b"broken")
    code, out, err = run_cli("eval", "--checkpoint", checkpoint, "--data", heldout, "--json")
    assert code == ExitCode.PARTIAL == 3
    row = json.loads(out)
    assert row["count"] == 6 and list(row["skipped"]) == [str(bad)]
    assert err.startswith(f"vitkit: skipped 1 of 7 images, unreadable: {bad} (")
    assert err.count("\n") == 1
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--data", heldout)
    assert code == 3 and out.splitlines()[1].startswith("6 images  loss ")
    for png in heldout.rglob("[0-9].png"):
        png.write_bytes(b"not an image")
    code, out, err = run_cli("eval", "--checkpoint", checkpoint, "--data", heldout)
    assert (code, out) == (2, "")
    assert err.startswith("vitkit: error: cannot read any of the 7 images: ")


def test_the_per_class_table_is_capped_with_a_note(tmp_path, run_cli):
    names = [f"c{i:02d}" for i in range(25)]
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", names)
    data = image_folder(tmp_path / "data", classes=("c00", "c24"), per_class=2)
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--data", data)
    lines = out.splitlines()
    assert code == 0 and [line.split()[0] for line in lines[3:23]] == names[:20]
    assert lines[23] == ("(the first 20 of 25 classes; --json and the per-class picture have all)")
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--data", data, "--json")
    assert len(json.loads(out)["per_class"]) == 25


def test_a_special_output_is_refused_before_the_work(tmp_path, run_cli):
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", [str(i) for i in range(10)])
    fifo = tmp_path / "per_class.png"
    os.mkfifo(fifo)
    code, out, err = run_cli("eval", "--checkpoint", checkpoint, "--data", "digits",
                             "--per-class", fifo)  # fmt: skip
    assert (code, out) == (2, "") and err == (
        f"vitkit: error: cannot write {fifo}: it is a FIFO (named pipe), not a regular file; "
        "name a new or regular file instead\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "per_class.png"]


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
    assert (code, err) == (
        2,
        f"vitkit: error: {folder} has classes not in the model's classes: a, b\n",
    )
    code, _, err = run_cli("eval", "--checkpoint", trained / "model.safetensors", "--data", folder,
                           "--split", "all")  # fmt: skip
    assert code == 2
    assert re.match(r"vitkit: error: .*two has 2 classes .* but .* was trained on 10", err)


def test_counts_and_top_k_are_said_right(tmp_path, run_cli):
    """One image is '1 image'; with 4 classes the top-5 is a top-4 and says so."""
    folder = image_folder(tmp_path / "data", classes=("b", "c", "d"), per_class=2)
    image_folder(folder, classes=("a",), per_class=5)  # a's fifth of 5 is the test split
    meta = {"data": str(folder), "val_fraction": 0.1, "test_fraction": 0.2, "split_seed": 0}
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["a", "b", "c", "d"], **meta)
    code, out, _ = run_cli("eval", "--checkpoint", checkpoint, "--confusion", tmp_path / "c.png")
    assert code == 0 and out.splitlines()[0] == (
        f"scored the test split of {folder} (1 image, split seed 0: images training never saw)"
    )
    assert re.fullmatch(
        r"1 image  loss \d+\.\d{4}  top-1 [01]\.0000  top-4 1\.0000", out.splitlines()[1]
    )


def test_eval_takes_a_timm_folder_and_scores_a_folder(tmp_path, run_cli):
    pytest.importorskip("timm")
    folder = timm_folder(tmp_path / "timm")
    data = image_folder(tmp_path / "data", classes=("a", "b", "c"), per_class=4, size=40)
    argv = ["--data", data, "--split", "all", "--confusion", tmp_path / "c.png", "--json"]
    code, out, err = run_cli("eval", "--checkpoint", folder, *argv)
    assert (code, err) == (0, "") and json.loads(out)["count"] == 12
    code, out, _ = run_cli("eval", "--checkpoint", folder, "--data", data, "--json")
    assert (code, json.loads(out)["count"], json.loads(out)["part"]) == (0, 12, "all")


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
         "{p}/w.pth is not a weights file vitkit reads: it is text; give a .safetensors, .pth "
         "or .bin file, a JAX .npz or a Hub folder"),
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


def test_threshold_on_a_single_label_model_is_said_to_not_apply(trained, run_cli, caplog):
    code, _, _ = run_cli("eval", "--checkpoint", trained / "model.safetensors", "--threshold",
                         "0.3", "--quiet")  # fmt: skip
    assert code == 0
    assert "--threshold applies to multi-label models; this one is scored by its top-k" in (
        caplog.text
    )
