"""`vitkit predict`: the top classes of images, named, with the probabilities the model
gives its data-config-prepared input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from _helpers import image_folder
from vitkit import load
from vitkit.cli import ExitCode

from ._cli import (
    digit_png,
    hf_folder,
    photo,
    timm_folder,
    timm_vit,
    tiny_checkpoint,
    torchvision_pth,
)


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


def test_predict_lists_each_images_classes_most_probable_first(tmp_path, run_cli):
    """For several images, text and JSON list every class in the order of the model's own
    probabilities, most probable first (a top-k taken from the wrong end fails here)."""
    import vitkit
    from vitkit.inference import load_for_inference

    torch.manual_seed(1)
    names = ["ant", "bee", "cat", "dog", "eel"]
    model = vitkit.create_model("vit_digits", num_classes=5, in_chans=3, embed_dim=16, depth=1,
                                num_heads=2)  # fmt: skip
    with torch.no_grad():
        model.head.weight.normal_(0, 3.0)  # scores far apart: no ties to order
    checkpoint = tmp_path / "m.safetensors"
    vitkit.save(model, checkpoint, meta={"class_names": names})
    images = []
    for i, colour in enumerate([(0, 0, 0), (255, 0, 0), (90, 200, 40), (255, 255, 255)]):
        images.append(tmp_path / f"{i}.png")
        Image.new("RGB", (8, 8), colour).save(images[-1])
    predictor = load_for_inference(checkpoint)
    batch = torch.stack([predictor.prepare(Image.open(path).convert("RGB")) for path in images])
    with torch.no_grad():
        expected, order = torch.softmax(predictor.model(batch), -1).sort(-1, descending=True)
    assert len({row[0] for row in order.tolist()}) > 1  # the images' first classes differ
    code, out, _ = run_cli("predict", "--checkpoint", checkpoint, *images, "--topk", "5", "--json")
    assert code == 0
    for row, want, ranks in zip(json.loads(out), expected.tolist(), order.tolist()):
        probs = [p["probability"] for p in row["predictions"]]
        assert [p["index"] for p in row["predictions"]] == ranks
        assert probs == pytest.approx(want, abs=1e-6) and probs == sorted(probs, reverse=True)
    code, out, _ = run_cli("predict", "--checkpoint", checkpoint, *images, "--topk", "5")
    lines = out.splitlines()
    for i, (path, ranks) in enumerate(zip(images, order.tolist())):
        shown = lines[5 * i : 5 * i + 5]
        assert shown[0].startswith(f"{path}: {names[ranks[0]]} (")
        assert [line.split()[-2] for line in shown] == [names[k] for k in ranks]


def test_predict_corrupt_and_missing_images(trained, tmp_path, run_cli, caplog):
    """One bad image alone is one line, the error naming the file and the problem: no
    "skipping" line before it, and Pillow's reason without the path again."""
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    caplog.set_level(logging.INFO, logger="vitkit")
    code, out, err = run_cli("predict", "--checkpoint", trained / "model.safetensors", bad)
    assert (code, out) == (2, "") and err == (
        f"vitkit: error: cannot read the image {bad}: cannot identify image file; check that "
        "it is an image file (open it in an image viewer)\n"
    )
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    code, _, err = run_cli(
        "predict", "--checkpoint", trained / "model.safetensors", tmp_path / "nope.png"
    )
    assert (
        code == 2 and err.strip() == f"vitkit: error: image {tmp_path / 'nope.png'} does not exist"
    )


def test_predict_takes_folders_and_globs_and_skips_bad_files(trained, tmp_path, run_cli):
    """A folder is searched recursively (hidden folders and other files left out), a glob is
    expanded; an unreadable file is skipped, named with the count on stderr, listed as skipped
    in --json, and the exit status is PARTIAL (3)."""
    photos = tmp_path / "photos"
    (photos / "deep" / "deeper").mkdir(parents=True)
    (photos / ".hidden").mkdir()
    for i, where in enumerate(["", "deep", "deep/deeper", ".hidden"]):
        digit_png(photos / where / f"{i}.png", i)
    (photos / "notes.txt").write_text("not an image")
    bad = photos / "deep" / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    loose = tmp_path / "loose"
    loose.mkdir()
    for i in (4, 5):
        digit_png(loose / f"{i}.png", i)
    checkpoint = trained / "model.safetensors"
    argv = ["predict", "--checkpoint", checkpoint, photos, f"{loose}/*.png", "--topk", "2"]
    code, out, err = run_cli(*argv, "--json")
    assert code == ExitCode.PARTIAL == 3
    rows = json.loads(out)
    assert [row["image"] for row in rows] == [
        str(photos / "0.png"), str(photos / "deep" / "1.png"), str(bad),
        str(photos / "deep" / "deeper" / "2.png"), str(loose / "4.png"), str(loose / "5.png"),
    ]  # fmt: skip
    assert rows[2]["skipped"].startswith("cannot identify image file") and len(rows[2]) == 2
    assert all(len(row["predictions"]) == 2 for row in rows if row is not rows[2])
    assert err == f"vitkit: skipped 1 of 6 images, unreadable: {bad} ({rows[2]['skipped']})\n"
    code, out, _ = run_cli(*argv)
    assert code == 3 and [line.split(": ")[0] for line in out.splitlines()[::2]] == [
        row["image"] for row in rows if "predictions" in row
    ]


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


def _expected(model, image, **data) -> list[float]:
    """The source model's probabilities on `image` prepared as `data` (a data config) says."""
    from vitkit.data import eval_transform, open_image
    from vitkit.data.data_config import DataConfig

    prepare = eval_transform(DataConfig(input_size=(3, 32, 32), **data))
    with torch.no_grad():
        logits = model(prepare(open_image(image))[None])
    logits = getattr(logits, "logits", logits)
    return torch.softmax(logits, -1)[0].sort(descending=True).values.tolist()


def _probabilities(out: str) -> list[float]:
    (row,) = json.loads(out)
    return [p["probability"] for p in row["predictions"]]


TIMM_DEFAULT = dict(mean=0.5, std=0.5, interpolation="bicubic", crop_pct=0.9)


def test_predict_takes_timm_weights_as_a_folder_or_a_pth(tmp_path, run_cli, caplog):
    pytest.importorskip("timm")
    caplog.set_level(logging.INFO)
    image = photo(tmp_path / "photo.png")
    folder = timm_folder(tmp_path / "timm")
    source = timm_vit().eval()
    torch.save(source.state_dict(), tmp_path / "w.pth")
    want = _expected(source, image, **TIMM_DEFAULT)
    for weights in (folder, tmp_path / "w.pth"):
        code, out, err = run_cli("predict", "--checkpoint", weights, "--json", image)
        assert (code, err) == (0, "")
        np.testing.assert_allclose(_probabilities(out), want, atol=2e-5)
    assert (  # the .pth states no preparation: what is assumed is said
        f"{tmp_path / 'w.pth'} states no data config; assuming the timm defaults: mean 0.5 0.5 "
        "0.5, std 0.5 0.5 0.5, bicubic, centre crop 0.9" in caplog.messages
    )
    argv = ["--mean", "0.4", "--std", "0.2", "0.25", "0.3", "--interpolation", "bilinear"]
    code, out, _ = run_cli("predict", "--checkpoint", tmp_path / "w.pth", "--json", image, *argv)
    want = _expected(source, image, mean=0.4, std=(0.2, 0.25, 0.3), interpolation="bilinear",
                     crop_pct=0.9)  # fmt: skip
    assert code == 0 and np.allclose(_probabilities(out), want, atol=2e-5)


def test_predict_takes_a_hugging_face_folder_with_its_labels(tmp_path, run_cli):
    pytest.importorskip("transformers")
    import transformers

    image = photo(tmp_path / "photo.png")
    folder = hf_folder(tmp_path / "hf")
    code, out, _ = run_cli("predict", "--checkpoint", folder, image)
    named = [line.split()[-2] for line in out.splitlines()]  # 'photo.png: cat (0.4)', '  dog (..)'
    assert code == 0 and sorted(named) == ["cat", "dog", "eel"]
    source = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    want = _expected(source, image, mean=0.4, std=0.3, interpolation="bilinear",
                     crop_mode="squash")  # fmt: skip
    code, out, _ = run_cli("predict", "--checkpoint", folder, "--json", image)
    np.testing.assert_allclose(_probabilities(out), want, atol=2e-5)


def test_predict_takes_a_torchvision_state_dict(tmp_path, run_cli, caplog):
    pytest.importorskip("torchvision")
    caplog.set_level(logging.INFO)
    from vitkit.data.data_config import IMAGENET_MEAN, IMAGENET_STD

    image = photo(tmp_path / "photo.png")
    source = torchvision_pth(tmp_path / "tv.pth")
    code, out, _ = run_cli("predict", "--checkpoint", tmp_path / "tv.pth", "--json", image)
    want = _expected(source, image, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                     interpolation="bilinear", crop_pct=0.875)  # fmt: skip
    assert code == 0 and np.allclose(_probabilities(out), want, atol=2e-5)
    assert any("assuming the torchvision defaults: mean 0.485 0.456 0.406" in m
               for m in caplog.messages)  # fmt: skip
