"""The Open Inference Protocol (KServe v2) routes, called by Triton's own HTTP client
(`tritonclient.http`): the same top classes as `vitkit predict`, from image files (BYTES) or
from the prepared tensor (FP32); and its refusals as one JSON line."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from vitkit import cli

from ._serve import CLASSES, image_bytes

pytestmark = pytest.mark.requires(
    "starlette", "uvicorn", "multipart", "httpx", "tritonclient", extra="serve"
)

FILES = {"a.png": image_bytes(11, (40, 30)), "b.png": image_bytes(12, (25, 50))}


@pytest.fixture(scope="module")
def expected(checkpoint, tmp_path_factory) -> dict[str, list[dict]]:
    """`vitkit predict --json --topk 4` of FILES: name -> the four classes."""
    folder = tmp_path_factory.mktemp("oip")
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["predict", "--checkpoint", str(checkpoint), "--json", "--topk", "4",
                         str(folder)])  # fmt: skip
    assert code == 0
    return {
        row["image"].rsplit("/", 1)[-1]: row["predictions"] for row in json.loads(out.getvalue())
    }


def _text(element) -> str:
    """A BYTES element as the client gives it from JSON (str) or binary data (bytes)."""
    return element if isinstance(element, str) else element.decode()


@pytest.fixture(scope="module")
def client(url):
    import tritonclient.http as triton

    with_client = triton.InferenceServerClient(url.removeprefix("http://"))
    yield with_client
    with_client.close()


def test_server_and_model_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny")
    meta = client.get_model_metadata("tiny")
    assert meta["name"] == "tiny" and meta["platform"] == "pytorch_libtorch"
    assert meta["inputs"][0] == {"name": "image", "datatype": "FP32", "shape": [-1, 3, 16, 16]}
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]}
    assert client.get_server_metadata()["name"] == "vitkit"


def test_image_files_as_bytes_give_vitkit_predicts_classes(client, expected):
    import tritonclient.http as triton

    tensor = triton.InferInput("image_bytes", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(list(FILES.values()), dtype=np.object_))
    outputs = [triton.InferRequestedOutput("probabilities", binary_data=False),
               triton.InferRequestedOutput("top_classes", binary_data=False)]  # fmt: skip
    result = client.infer("tiny", [tensor], outputs=outputs, parameters={"topk": 2})
    probs = result.as_numpy("probabilities")
    top = result.as_numpy("top_classes")
    assert probs.shape == (2, 4) and top.shape == (2, 2)
    for row, tops, name in zip(probs, top, FILES):
        want = expected[name]
        assert [CLASSES[i] for i in np.argsort(-row)] == [p["class"] for p in want]
        assert row.sum() == pytest.approx(1, abs=1e-5)
        for p in want:
            assert row[p["index"]] == pytest.approx(p["probability"], abs=2e-6)
        assert [_text(t).split(":", 2)[2] for t in tops] == [p["class"] for p in want[:2]]


def test_the_prepared_tensor_as_fp32_gives_the_same_classes(client, checkpoint, expected):
    import tritonclient.http as triton

    from vitkit.inference import load_for_inference

    predictor = load_for_inference(checkpoint)
    images = np.stack(
        [
            predictor.prepare(Image.open(io.BytesIO(d)).convert("RGB")).numpy()
            for d in FILES.values()
        ]
    )  # fmt: skip  (2, 3, 16, 16)
    tensor = triton.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images.astype(np.float32))  # sent as binary data
    asked = triton.InferRequestedOutput("probabilities", binary_data=False, class_count=1)
    result = client.infer("tiny", [tensor], outputs=[asked])
    top = result.as_numpy("probabilities")  # Triton's classification: "score:index:label"
    assert [_text(t[0]).split(":", 2)[2] for t in top] == [
        expected[name][0]["class"] for name in FILES
    ]


def test_json_bodies_with_base64_files(url, expected):
    body = {
        "id": "42",
        "inputs": [
            {
                "name": "image_bytes",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode(FILES["a.png"]).decode()],
            }
        ],  # fmt: skip
        "outputs": [{"name": "top_classes"}],
    }
    answer = httpx.post(f"{url}/v2/models/tiny/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["id"] == "42" and got["model_name"] == "tiny"
    (output,) = got["outputs"]
    assert output["shape"] == [1, 4] and output["datatype"] == "BYTES"
    assert [s.split(":", 2)[2] for s in output["data"]] == [p["class"] for p in expected["a.png"]]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/models/other/infer", {}, 404, "no model named 'other'; this server serves 'tiny'"),
        ("/v2/models/tiny/infer", {"inputs": []}, 400, "an inference request holds one input"),
        ("/v2/models/tiny/infer",
         {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": [0]}]},
         400, "the input's shape is [1, 3, 8, 8]; the model takes [1..8, 3, 16, 16]"),
        ("/v2/models/tiny/infer",
         {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 16, 16], "data": [0]}]},
         400, "the input holds 1 values; shape [1, 3, 16, 16] needs 768"),
        ("/v2/models/tiny/infer",
         {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["@@"]}]},
         400, "a BYTES input's data must be base64"),
        ("/v2/models/tiny/infer",
         {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1],
                      "data": [base64.b64encode(b"not an image").decode()]}]},
         422, "image_bytes[0] is not an image Pillow can read"),
    ],
)  # fmt: skip
def test_refusals_are_one_json_line(url, path, body, status, message):
    answer = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]


@pytest.mark.parametrize(
    "weights, name",
    [
        ("runs/photos/model.safetensors", "photos"),
        ("exports/tiny.onnx", "tiny"),
        ("vit3.pth", "vit3"),
        (
            "timm/vit_small_patch16_224.augreg_in21k_ft_in1k",
            "vit_small_patch16_224.augreg_in21k_ft_in1k",
        ),
        ("hf-hub:facebook/dinov3-vits16-pretrain-lvd1689m", "dinov3-vits16-pretrain-lvd1689m"),
        ("local-dir:/data/my model", "my_model"),
    ],
)
def test_the_models_name_in_urls_keeps_a_hub_ids_tag(weights, name):
    """/v2/models/{name}: a file's name without its suffix, a run's folder name, a Hub id's
    name with its tag (not cut at its dot as a suffix)."""
    from types import SimpleNamespace

    from vitkit.serve.service import Service

    fields = dict(
        class_names=[], data_config=None, precision="fp32", platform="pytorch_torchscript"
    )
    assert Service(SimpleNamespace(name=weights, **fields)).short_name == name
