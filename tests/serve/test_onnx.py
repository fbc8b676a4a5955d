"""`vitkit serve model.onnx`: the file `vitkit export` writes, served through onnxruntime with
the class names and data config of its metadata, answers `vitkit predict`'s top-k for the same
images; /explain is refused in one line (a graph has no gradients)."""

from __future__ import annotations

import httpx
import pytest

from vitkit import cli

from ._serve import running
from .test_api import IMAGES, _vitkit_predict

pytestmark = [
    pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve"),
    pytest.mark.requires("onnx", "onnxscript", "onnxruntime", extra="onnx"),
]


@pytest.fixture(scope="module")
def onnx_file(checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    assert cli.main(["export", "--checkpoint", str(checkpoint), str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def onnx_url(onnx_file):
    from vitkit.inference import OnnxPredictor
    from vitkit.serve.app import create_app
    from vitkit.serve.service import Service

    with running(create_app(Service(OnnxPredictor(onnx_file)))) as base:
        yield base


def test_the_onnx_file_answers_vitkit_predicts_top_k(onnx_url, checkpoint, tmp_path, capsys):
    for name, data in IMAGES.items():
        (tmp_path / name).write_bytes(data)
    expected = _vitkit_predict(checkpoint, tmp_path, capsys, 3)  # the torch checkpoint
    files = [("file", (name, data)) for name, data in IMAGES.items()]
    answer = httpx.post(f"{onnx_url}/predict", params={"topk": 3}, files=files, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"].endswith("tiny.onnx") and body["precision"] == "fp32"
    for result in body["results"]:
        want = expected[result["image"]]
        assert [p["class"] for p in result["predictions"]] == [p["class"] for p in want]
        for got, w in zip(result["predictions"], want):
            assert got["probability"] == pytest.approx(w["probability"], abs=1e-4)


def test_the_onnx_model_says_what_it_is_and_refuses_to_explain(onnx_url):
    info = httpx.get(f"{onnx_url}/info").json()
    assert info["classes"] == ["cat", "dog", "eel", "fox"] and info["explain"] is False
    assert info["data_config"]["crop_pct"] == 0.875  # from the file's metadata
    meta = httpx.get(f"{onnx_url}/v2/models/tiny").json()
    assert meta["platform"] == "onnxruntime_onnx"
    refused = httpx.post(f"{onnx_url}/explain", files=[("file", ("a.png", IMAGES["wide.png"]))])
    assert refused.status_code == 400
    assert refused.json() == {"error": f"{info['model']} is an ONNX graph, which has no "
                              "gradients to explain with; serve the checkpoint it was exported "
                              "from to explain"}  # fmt: skip


def test_torch_only_flags_are_refused_for_an_onnx_file(onnx_file, capsys):
    code = cli.main(["serve", str(onnx_file), "--precision", "int8", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err == (
        "vitkit: error: --precision int8: an ONNX file runs as it was exported (onnxruntime, "
        "CPU); export it with vitkit export --precision int8 for int8\n"
    )


def test_a_file_without_vitkits_metadata_is_refused(tmp_path, onnx_file):
    import onnx

    from vitkit.inference import OnnxPredictor

    proto = onnx.load(str(onnx_file))
    del proto.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(proto, str(bare))
    with pytest.raises(ValueError, match="records no data config"):
        OnnxPredictor(bare)


def test_the_command_serves_an_onnx_file_by_its_suffix(onnx_file, monkeypatch):
    """`vitkit serve tiny.onnx` loads it through onnxruntime (the server itself stubbed;
    test_command.py runs a real one)."""
    import vitkit.serve.server as server_module

    served = {}

    class Stub:
        def __init__(self, app, **_):
            served["app"] = app

        def run(self, sockets):
            served["sockets"] = sockets

    monkeypatch.setattr(server_module, "server", Stub)
    assert cli.main(["serve", str(onnx_file), "--port", "0", "--crop-pct", "1.0"]) == 0
    service = served["app"].state.api.service
    assert service.platform == "onnxruntime_onnx" and service.short_name == "tiny"
    assert service.data_config.crop_pct == 1.0  # the preparation flags apply
