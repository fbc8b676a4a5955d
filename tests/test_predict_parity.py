"""`vitkit predict` on converted weights gives the probabilities of the source library's own
pipeline on the same image file: timm's `resolve_data_config` + `create_transform`, and a
Hugging Face image processor."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import cli


def _photo(path, size=(300, 200)) -> str:
    """A smooth, photo-like image of another size and aspect than the model's input."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    noise = np.random.default_rng(0).normal(0, 12, rgb.shape)
    Image.fromarray(np.clip(rgb + noise, 0, 255).astype(np.uint8)).save(path)
    return str(path)


def _predict(checkpoint, image, capsys) -> dict[int, float]:
    capsys.readouterr()
    argv = ["predict", "--checkpoint", str(checkpoint), "--topk", "5", "--json", image]
    assert cli.main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    return {p["index"]: p["probability"] for p in row["predictions"]}


def _top5(probs: torch.Tensor) -> dict[int, float]:
    values, indices = probs.topk(5)
    return dict(zip(indices.tolist(), values.tolist()))


def _assert_same(ours: dict[int, float], theirs: dict[int, float]) -> None:
    assert list(ours) == list(theirs)
    np.testing.assert_allclose(list(ours.values()), list(theirs.values()), atol=2e-5)


def test_predict_equals_timms_pipeline(tmp_path, capsys):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    source = timm.create_model("deit_tiny_patch16_224.fb_in1k", pretrained=False, depth=2)
    with torch.no_grad():
        source.head.weight.mul_(50)  # spread the probabilities so a wrong pixel shows
    save_for_hf(source.eval(), str(tmp_path / "hub"), safe_serialization=True)
    converted = tmp_path / "deit.safetensors"
    assert cli.main(["convert", "--from", "timm", str(tmp_path / "hub"), str(converted)]) == 0
    image = _photo(tmp_path / "photo.png")
    transform = timm.data.create_transform(
        **timm.data.resolve_data_config({}, model=source), is_training=False
    )
    with torch.no_grad():
        probs = source(transform(Image.open(image).convert("RGB"))[None]).softmax(-1)[0]
    _assert_same(_predict(converted, image, capsys), _top5(probs))


def test_predict_equals_hugging_faces_pipeline(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=64, patch_size=16,
                                    num_labels=20)  # fmt: skip
    torch.manual_seed(0)
    source = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        source.classifier.weight.mul_(50)
    source.save_pretrained(tmp_path / "hf")
    processor = transformers.ViTImageProcessor(
        size={"height": 64, "width": 64}, image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225], resample=3,
    )  # fmt: skip
    processor.save_pretrained(tmp_path / "hf")
    converted = tmp_path / "vit.safetensors"
    assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), str(converted)]) == 0
    image = _photo(tmp_path / "photo.png")
    inputs = processor(images=Image.open(image).convert("RGB"), return_tensors="pt")
    with torch.no_grad():
        probs = source(**inputs).logits.softmax(-1)[0]
    _assert_same(_predict(converted, image, capsys), _top5(probs))
