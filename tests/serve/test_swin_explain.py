"""/explain of a Swin checkpoint: its Grad-CAM, as `vitkit explain` computes it; the ViT's
attention maps are refused with the map it has."""

from __future__ import annotations

import httpx
import pytest
import torch

from ._serve import CLASSES, image_bytes, running

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")


@pytest.fixture(scope="module")
def swin_checkpoint(tmp_path_factory):
    import vitkit
    from vitkit.data.data_config import DataConfig

    torch.manual_seed(0)
    model = vitkit.SwinTransformer(
        img_size=32, embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4,
        num_classes=len(CLASSES),
    )  # fmt: skip
    model.data_config = DataConfig(input_size=(3, 32, 32), mean=0.5, std=0.25, crop_pct=1.0)
    path = tmp_path_factory.mktemp("swin") / "swin.safetensors"
    vitkit.save(model, path, meta={"class_names": list(CLASSES)})
    return path


def test_explain_gives_the_grad_cam_and_refuses_attention_maps(swin_checkpoint):
    from vitkit.serve.app import create_app

    from .conftest import service_of

    service = service_of(swin_checkpoint)
    assert service.info()["explain"] is True
    image = {"content": image_bytes(7, (32, 32)), "headers": {"Content-Type": "image/png"}}
    with running(create_app(service)) as url:
        answer = httpx.post(f"{url}/explain", params={"format": "json", "class": "dog"}, **image)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["map"] == "relevance" and body["grid"] == [4, 4]
        assert body["target"]["class"] == "dog"
        expected = service.explain(image["content"], "x.png", CLASSES.index("dog"))
        values = torch.tensor(body["values"])
        torch.testing.assert_close(values, expected.maps["relevance"], atol=1e-6, rtol=0)
        png = httpx.post(f"{url}/explain", **image)
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        refused = httpx.post(f"{url}/explain", params={"map": "rollout"}, **image)
        assert refused.status_code == 400
        assert "its map is Grad-CAM, map=relevance" in refused.text
