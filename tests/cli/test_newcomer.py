"""The newcomer's path through the command line (issue 28, "Done when"): fine-tune a pretrained
ViT on an image folder, evaluate it on a held-out folder, predict a folder, explain an image and
export to ONNX, which onnxruntime runs to the same answers as `vitkit predict`."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

from _helpers import image_folder
from vitkit.cli import ExitCode

from ._cli import PNG, timm_folder


def test_fine_tune_evaluate_predict_explain_and_export_a_folder(
    tmp_path, run_cli, caplog, monkeypatch
):
    pytest.importorskip("timm")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from vitkit.data import eval_transform, open_image
    from vitkit.data.data_config import DataConfig

    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    pets = tmp_path / "pets"  # train/ and valid/ of small RGB photos, as downloaded
    image_folder(pets / "train", classes=("cat", "dog"), per_class=8, size=40)
    image_folder(pets / "valid", classes=("cat", "dog"), per_class=3, size=40)
    heldout = image_folder(tmp_path / "heldout", classes=("cat", "dog"), per_class=4, size=48)
    weights = timm_folder(tmp_path / "vit")  # a pretrained ViT-Ti (32x32) as timm saves it
    run = tmp_path / "run"

    code, out, _ = run_cli("train", "--data", pets, "--pretrained", weights, "--epochs", "1",
                           "--out", run, "--no-progress")  # fmt: skip
    assert code == ExitCode.OK and re.fullmatch(r"test accuracy: [01]\.\d{4}", out.splitlines()[-1])
    assert (
        f"data folder {pets}: train train/ (12 images), val valid/ (6 images), test cut from "
        "train/ (4 images); 2 classes; split seed 0" in caplog.messages
    )
    training = f"training {weights} (fine-tuned) on {pets}: 12 train / 6 val / 4 test images"
    assert any(
        m.startswith(f"{training}, 2 classes, recipe finetune, cpu, lr ")
        and m.endswith(f", 1 epoch -> {run}")
        for m in caplog.messages
    )
    checkpoint = run / "model.safetensors"

    code, out, err = run_cli("eval", "--checkpoint", checkpoint, "--data", heldout)
    lines = out.splitlines()
    assert (code, err, lines[0]) == (ExitCode.OK, "", f"scored all of {heldout}/ (8 images)")
    assert lines[1].startswith("8 images  loss ") and lines[1].endswith("top-2 1.0000")
    assert [line.split()[::4] for line in lines[3:5]] == [["cat", "4"], ["dog", "4"]]
    assert lines[-2] == f"confusion matrix: {run / 'confusion_heldout_all.png'}"

    broken = pets / "valid" / "cat" / "zz_broken.png"
    broken.write_bytes(PNG + b"cut short")
    code, out, err = run_cli("predict", "--checkpoint", checkpoint, pets, "--json")
    rows = json.loads(out)
    assert code == ExitCode.PARTIAL and len(rows) == 23
    assert err.startswith(f"vitkit: skipped 1 of 23 images, unreadable: {broken} (")
    predicted = {
        row["image"]: row["predictions"][0]["class"] for row in rows if "predictions" in row
    }
    assert len(predicted) == 22 and [row["image"] for row in rows if "skipped" in row] == [
        str(broken)
    ]

    image = heldout / "dog" / "0.png"
    code, out, _ = run_cli("explain", "--checkpoint", checkpoint, image)
    assert code == ExitCode.OK and out.endswith(
        "maps over the model's 32x32 view: the 48x48 image resized to 35x35, its centre 32x32; "
        "attention maps in 0_explain.png\n"
    )
    assert (tmp_path / "0_explain.png").read_bytes()[:8] == PNG

    onnx_file = tmp_path / "pets.onnx"
    code, out, _ = run_cli("export", "--checkpoint", checkpoint, onnx_file)
    assert (code, out) == (
        ExitCode.OK,
        f"wrote {onnx_file} (onnx; batch dynamic, image size 32x32; carries the class names and "
        "the data config)\n",
    )
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    names = json.loads(meta["vitkit_class_names"])
    prepare = eval_transform(DataConfig.from_dict(json.loads(meta["vitkit_data_config"])))
    paths = sorted(predicted)
    batch = np.stack([prepare(open_image(path)).numpy() for path in paths])
    (logits,) = session.run(None, {"image": batch})
    assert {p: names[k] for p, k in zip(paths, logits.argmax(-1))} == predicted
