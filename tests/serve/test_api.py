"""The API over real HTTP: /predict answers what `vitkit predict` prints for the same files,
/explain draws a PNG or gives the map, /health, /info, /openapi.json and the page."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from PIL import Image

from vitkit import cli

from ._serve import CLASSES, image_bytes

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")

# Images of several sizes, modes and formats: each is resized and cropped differently.
IMAGES = {
    "wide.png": image_bytes(1, (61, 23)),
    "tall.jpg": image_bytes(2, (20, 48), fmt="JPEG"),
    "grey.png": image_bytes(3, (16, 16), mode="L"),
    "alpha.png": image_bytes(4, (33, 33), mode="RGBA"),
    "tiny.bmp": image_bytes(5, (3, 2), fmt="BMP"),
}


def _vitkit_predict(checkpoint, folder, capsys, topk: int) -> dict[str, list]:
    """`vitkit predict --json` on the files of `folder`: file name -> predictions."""
    capsys.readouterr()
    code = cli.main(["predict", "--checkpoint", str(checkpoint), "--json", "--topk", str(topk),
                     str(folder)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    return {row["image"].rsplit("/", 1)[-1]: row["predictions"] for row in json.loads(out)}


@pytest.mark.parametrize("topk", [1, 3])
def test_predict_answers_what_vitkit_predict_prints(url, checkpoint, tmp_path, capsys, topk):
    for name, data in IMAGES.items():
        (tmp_path / name).write_bytes(data)
    expected = _vitkit_predict(checkpoint, tmp_path, capsys, topk)
    files = [("file", (name, data)) for name, data in IMAGES.items()]
    answer = httpx.post(f"{url}/predict", params={"topk": topk}, files=files, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "tiny.safetensors" and body["precision"] == "fp32"
    assert [r["image"] for r in body["results"]] == list(IMAGES)  # in the order sent
    for result in body["results"]:
        want = expected[result["image"]]
        got = result["predictions"]
        assert [p["class"] for p in got] == [p["class"] for p in want]  # identical top-k
        assert [p["index"] for p in got] == [p["index"] for p in want]
        for g, w in zip(got, want):  # batches of other sizes: the last float bits may differ
            assert g["probability"] == pytest.approx(w["probability"], abs=2e-6)


def test_predict_takes_raw_bytes_and_defaults_to_top_5_capped_at_the_classes(url):
    for content_type in ("image/png", "application/octet-stream"):
        answer = httpx.post(f"{url}/predict", content=IMAGES["wide.png"],
                            headers={"Content-Type": content_type})  # fmt: skip
        assert answer.status_code == 200, answer.text
        (result,) = answer.json()["results"]
        assert result["image"] == "image"
        assert len(result["predictions"]) == len(CLASSES)  # 5 asked, 4 classes
        assert sorted(p["class"] for p in result["predictions"]) == sorted(CLASSES)
    many = httpx.post(f"{url}/predict?topk=50", content=IMAGES["wide.png"],
                      headers={"Content-Type": "image/png"})  # fmt: skip
    assert len(many.json()["results"][0]["predictions"]) == len(CLASSES)


def test_explain_png_decodes_and_names_the_classes(url):
    answer = httpx.post(f"{url}/explain", files={"file": ("wide.png", IMAGES["wide.png"])})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(answer.content))
    image.load()
    assert min(image.size) > 224  # the 16x16 view enlarged to 224, its colour bar and caption
    predicted = answer.headers["X-Predicted-Class"]
    assert predicted in CLASSES and answer.headers["X-Explained-Class"] == predicted
    top = httpx.post(f"{url}/predict?topk=1", files={"file": ("wide.png", IMAGES["wide.png"])})
    assert top.json()["results"][0]["predictions"][0]["class"] == predicted


def test_the_explain_picture_is_captioned_with_a_colour_bar(monkeypatch):
    """/explain's PNG says what is predicted, with what probability, which map by which method
    and over which view, and has a colour bar: as `vitkit explain` draws its panels."""
    import torch

    import vitkit.explain.image as drawing
    import vitkit.serve.service as service
    from vitkit.explain import Explanation

    drawn = []
    monkeypatch.setattr(drawing, "figure_png", lambda fig: drawn.append(fig) or b"png")
    explained = Explanation(
        image=torch.rand(3, 16, 16), original=torch.rand(3, 16, 16), region=(0, 0, 16, 16),
        caption="maps over the model's 16x16 view", probabilities=torch.tensor([0.1, 0.7, 0.2]),
        predicted=1, target=2, maps={"relevance": torch.rand(4, 4)},
    )  # fmt: skip
    names = ["ant", "bee", "cat"]
    assert service.overlay_png(explained, "relevance", names, "attention") == b"png"
    assert service.overlay_png(explained, "relevance", names, "gradcam") == b"png"
    titles = [fig._suptitle.get_text() for fig in drawn]
    assert titles == [
        "predicted bee (0.700); attention relevance for class cat\nmaps over the model's 16x16 "
        "view",
        "predicted bee (0.700); Grad-CAM (last stage) for class cat\nmaps over the model's 16x16 "
        "view",
    ]
    assert all(len(fig.axes) == 2 and fig.axes[1].collections for fig in drawn)  # + colour bar


def test_explain_json_gives_the_map_of_the_class_asked(url):
    params = {"format": "json", "class": "eel", "map": "rollout"}
    answer = httpx.post(f"{url}/explain", params=params, content=IMAGES["tall.jpg"],
                        headers={"Content-Type": "image/jpeg"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["target"]["class"] == "eel" and body["target"]["index"] == 2
    assert body["map"] == "rollout" and body["grid"] == [4, 4]  # 16 px / patch 4
    values = [v for row in body["values"] for v in row]
    assert len(values) == 16 and all(v >= 0 for v in values)
    assert 0 < sum(values) <= 1 + 1e-5  # rollout from the class token: at most 1 in all
    assert "16x16 view" in body["caption"]
    by_index = httpx.post(
        f"{url}/explain",
        params={**params, "class": "2"},
        content=IMAGES["tall.jpg"],
        headers={"Content-Type": "image/jpeg"},
    )
    assert by_index.json()["values"] == body["values"]  # fmt: skip


def test_health_info_and_openapi(url):
    assert httpx.get(f"{url}/health").json() == {"status": "ready"}
    info = httpx.get(f"{url}/info").json()
    assert info["model"] == "tiny.safetensors" and info["classes"] == list(CLASSES)
    assert info["data_config"]["input_size"] == [3, 16, 16]
    assert info["data_config"]["crop_pct"] == 0.875
    assert info["precision"] == "fp32" and info["version"] == __import__("vitkit").__version__
    assert info["batching"] == {"max_batch": 16, "max_wait_ms": 2.0, "max_queue": 256}
    assert info["limits"]["max_upload_bytes"] == 300_000
    spec = httpx.get(f"{url}/openapi.json").json()
    assert spec["openapi"].startswith("3.") and {"/predict", "/explain", "/info"} <= set(
        spec["paths"]
    )


def test_openapi_describes_every_route(checkpoint):
    from vitkit.serve.app import create_app

    from .conftest import service_of

    app = create_app(service_of(checkpoint))
    from vitkit.serve.openapi import openapi

    assert {route.path for route in app.routes} - {"/openapi.json"} == set(openapi("0")["paths"])


def test_page_calls_the_api(url):
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for call in ('fetch("info")', 'fetch("predict?topk=5"', 'fetch("explain"'):
        assert call in page.text


def test_int8_predicts_and_explains_with_an_fp32_copy(checkpoint):
    from vitkit.serve.app import create_app

    from ._serve import running
    from .conftest import service_of

    service = service_of(checkpoint, "int8")
    predictor = service.predictor
    assert service.precision == "int8" and predictor.explainer is not predictor.model
    with running(create_app(service)) as url:
        image = {"content": IMAGES["wide.png"], "headers": {"Content-Type": "image/png"}}
        predicted = httpx.post(f"{url}/predict", **image).json()
        assert predicted["precision"] == "int8"
        explained = httpx.post(f"{url}/explain", params={"format": "json"}, **image)
        assert explained.status_code == 200, explained.text
        assert sum(map(sum, explained.json()["values"])) > 0
