"""A multi-label checkpoint served: /predict answers each image's labels over the checkpoint's
threshold, as `vitkit predict --json` lists them, and /info says the model is multi-label."""

from __future__ import annotations

import io
import json

import httpx
import pytest
import torch
from PIL import Image

from vitkit import cli

from ._serve import CLASSES, running
from .conftest import service_of

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")


def png_of(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (24, 20), colour).save(out, format="PNG")
    return out.getvalue()


COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (250, 250, 250))
IMAGES = {f"{i}.png": png_of(colour) for i, colour in enumerate(COLOURS)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random one-block ViT of four classes saved as multi-label with threshold 0.4."""
    import vitkit
    from vitkit.data.data_config import DataConfig

    torch.manual_seed(2)
    model = vitkit.create_model(
        "vit_digits", num_classes=len(CLASSES), in_chans=3, img_size=16, patch_size=4,
        embed_dim=16, depth=1, num_heads=2,
    )  # fmt: skip
    with torch.no_grad():
        model.head.weight.normal_(0, 2.0)  # 1 to 3 of the four sigmoids over 0.4
    model.data_config = DataConfig(input_size=(3, 16, 16), mean=0.5, std=0.25)
    path = tmp_path_factory.mktemp("multi") / "multi.safetensors"
    meta = {"class_names": list(CLASSES), "multi_label": True, "threshold": 0.4}
    vitkit.save(model, path, meta=meta)
    return path


def test_predict_answers_the_labels_over_the_threshold(checkpoint, tmp_path, capsys):
    for name, data in IMAGES.items():
        (tmp_path / name).write_bytes(data)
    capsys.readouterr()
    assert cli.main(["predict", "--checkpoint", str(checkpoint), "--json", str(tmp_path)]) == 0
    expected = {row["image"].rsplit("/", 1)[-1]: row["labels"] for row in
                json.loads(capsys.readouterr().out)}  # fmt: skip
    counts = {len(labels) for labels in expected.values()}
    assert len(counts) > 1 and counts != {len(CLASSES)}  # the threshold cuts, not the top-k
    service = service_of(checkpoint)
    assert (service.info()["multi_label"], service.info()["threshold"]) == (True, 0.4)
    from vitkit.serve.app import create_app

    with running(create_app(service)) as url:
        files = [("file", (name, data)) for name, data in IMAGES.items()]
        answer = httpx.post(f"{url}/predict", params={"topk": 1}, files=files, timeout=30)
        info = httpx.get(f"{url}/info", timeout=30).json()
    assert answer.status_code == 200, answer.text
    assert info["multi_label"] is True and info["threshold"] == 0.4
    for result in answer.json()["results"]:
        want, got = expected[result["image"]], result["predictions"]
        assert [p["class"] for p in got] == [p["class"] for p in want]
        assert all(p["probability"] >= 0.4 for p in got)
        for g, w in zip(got, want):
            assert g["probability"] == pytest.approx(w["probability"], abs=2e-6)


@pytest.mark.slow  # an ONNX export, about 10 s on 2 busy cores
@pytest.mark.requires("onnx", "onnxscript", "onnxruntime", extra="onnx")
def test_the_onnx_export_keeps_the_threshold_and_answers_the_same_labels(checkpoint, tmp_path):
    from vitkit.inference import OnnxPredictor, load_for_inference

    path = tmp_path / "multi.onnx"
    assert cli.main(["export", "--checkpoint", str(checkpoint), str(path)]) == 0
    graph, model = OnnxPredictor(path), load_for_inference(checkpoint)
    assert (graph.multi_label, graph.threshold) == (True, 0.4)
    images = torch.stack([model.prepare(Image.open(io.BytesIO(data))) for data in IMAGES.values()])
    ours, theirs = graph.labels(images), model.labels(images)
    assert [[i for _, i in row] for row in ours] == [[i for _, i in row] for row in theirs]
    for row, want in zip(ours, theirs):
        assert [q for q, _ in row] == pytest.approx([q for q, _ in want], abs=1e-5)
