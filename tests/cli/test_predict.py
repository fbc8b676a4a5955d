"""`vitkit predict`: the top classes of images, named, with the probabilities the model
gives its data-config-prepared input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import load

from ._cli import digit_png, image_folder, tiny_checkpoint


def test_predict_names_classes_and_resizes(trained, tmp_path, run_cli):
    label = digit_png(tmp_path / "a.png", 5)
    digit_png(tmp_path / "big.png", 5, scale=4)  # 32x32: resized to the model's 8x8
    code, out, _ = run_cli(
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
    code, out, _ = run_cli(
        "predict", "--checkpoint", trained / "model.safetensors", tmp_path / "a.png"
    )
    assert code == 0 and out.startswith(f"{tmp_path / 'a.png'}: ")
    assert len(out.splitlines()) == 5


def test_predict_corrupt_and_missing_images(trained, tmp_path, run_cli):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    code, _, err = run_cli("predict", "--checkpoint", trained / "model.safetensors", bad)
    assert code == 2 and err.startswith(f"vitkit: error: cannot read image {bad}")
    code, _, err = run_cli(
        "predict", "--checkpoint", trained / "model.safetensors", tmp_path / "nope.png"
    )
    assert (
        code == 2 and err.strip() == f"vitkit: error: image {tmp_path / 'nope.png'} does not exist"
    )


def test_topk_is_capped_at_the_classes_and_said_once(tmp_path, run_cli, caplog):
    checkpoint = tiny_checkpoint(tmp_path / "m.safetensors", ["a", "b", "c", "d"])
    folder = image_folder(tmp_path / "imgs", classes=("x",), per_class=2)
    images = [folder / "x" / "0.png", folder / "x" / "1.png"]
    code, out, err = run_cli("predict", "--checkpoint", checkpoint, "--topk", "5", "--json",
                             *images)  # fmt: skip
    assert code == 0 and [len(row["predictions"]) for row in json.loads(out)] == [4, 4]
    said = [r.getMessage() for r in caplog.records if "--topk" in r.getMessage()]
    assert said == ["--topk 5: the checkpoint has 4 classes; listing all of them"]
    caplog.clear()
    code, out, _ = run_cli("predict", "--checkpoint", checkpoint, images[0])
    assert code == 0 and len(out.splitlines()) == 4 and "--topk" not in caplog.text
