"""Concurrent requests share forward passes, each answered with its own result; a full queue
answers 503 with Retry-After at once, and the server goes on."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from torch import nn

from ._serve import image_bytes, running
from .conftest import service_of

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")

PNG = {"Content-Type": "image/png"}


def _app(service, warm_up: bool = True, **batching):
    from vitkit.serve.app import create_app
    from vitkit.serve.batcher import Batching

    return create_app(service, batching=Batching(**batching), warm_up=warm_up)


def test_concurrent_clients_are_batched_and_each_gets_its_own_answer(checkpoint):
    service = service_of(checkpoint)
    images = [image_bytes(seed, (20 + seed, 30)) for seed in range(24)]
    pool_limits = httpx.Limits(max_connections=32)
    with (
        running(_app(service, max_batch=8, max_wait_ms=100)) as url,
        httpx.Client(base_url=url, limits=pool_limits, timeout=60) as client,
    ):

        def ask(data: bytes) -> dict:
            answer = client.post("/predict?topk=4", content=data, headers=PNG)
            assert answer.status_code == 200, answer.text
            return answer.json()["results"][0]["predictions"]

        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(ask, images))
        info = httpx.get(f"{url}/info").json()
    sizes = {int(k): n for k, n in info["batch_sizes"].items()}
    assert sum(k * n for k, n in sizes.items()) == 24  # every image went through once
    assert max(sizes) > 1 and max(sizes) <= 8  # batched, never past --max-batch
    for data, answer in zip(images, answers):  # each answer is that image's, alone
        (alone,) = httpx_free_predict(service, data)
        assert [p["class"] for p in answer] == [p["class"] for p in alone]
        assert [p["probability"] for p in answer] == pytest.approx(
            [p["probability"] for p in alone], abs=2e-6
        )


def httpx_free_predict(service, data: bytes) -> list:
    """`data` through the service directly, in a batch of its own."""
    from vitkit.serve.limits import Limits
    from vitkit.serve.uploads import Upload, decode_image

    image = decode_image(Upload("x", data), Limits(), in_chans=3)
    return service.predict(service.prepare(image)[None], [4])


class Gated(nn.Module):
    """The tiny model, held at each forward pass until the test releases it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.data_config, self.meta, self.num_classes = inner.data_config, inner.meta, 4
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        assert self.release.wait(30)
        return self.inner(x)


def test_a_full_queue_answers_503_with_retry_after_then_serves(checkpoint):
    import vitkit
    from vitkit.inference import Predictor
    from vitkit.serve.service import Service

    model = Gated(vitkit.load(checkpoint))
    service = Service(Predictor(model, name="gated"))
    good = image_bytes(0)
    # no warm-up: the gate holds every forward pass, the test's first request's included
    with running(_app(service, False, max_batch=1, max_wait_ms=0, max_queue=2)) as url:

        def ask() -> int:
            return httpx.post(f"{url}/predict", content=good, headers=PNG, timeout=60).status_code

        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(ask)
            assert model.entered.wait(30)  # the model holds the first image
            queued = [pool.submit(ask) for _ in range(2)]
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/info").json()["waiting"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            refused = httpx.post(f"{url}/predict", content=good, headers=PNG)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            assert "the queue holds at most 2" in refused.json()["error"]
            too_many = httpx.post(f"{url}/predict", files=[("file", ("a.png", good))] * 3)
            assert too_many.status_code == 413 and "3 images" in too_many.json()["error"]
            model.release.set()
            assert [first.result(), *(q.result() for q in queued)] == [200, 200, 200]
        assert ask() == 200
        assert httpx.get(f"{url}/info").json()["batch_sizes"] == {"1": 4}


def test_the_settings_are_checked_once_by_their_schema():
    """`Batching` and `Limits` are option schemas: a value out of range is refused when built,
    in one line naming it (the batcher takes them as checked); the upload limit is in MiB."""
    from vitkit.serve.batcher import Batching
    from vitkit.serve.limits import Limits

    for wrong, message in (
        (dict(max_batch=0), "max_batch must be in [1, 4096], got 0"),
        (dict(max_wait_ms=10_001), "max_wait_ms must be in [0, 10000], got 10001"),
        (dict(max_queue=-3), "max_queue must be >= 1, got -3"),
    ):
        with pytest.raises(ValueError) as err:
            Batching(**wrong)
        assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        Limits(max_upload_mb=0)
    assert str(err.value) == "max_upload_mb must be >= 0.001, got 0"
    assert Limits(max_upload_mb=2).max_upload_bytes == 2 * 1024 * 1024
    assert Limits().max_upload_bytes == 20 * 1024 * 1024


def test_a_client_alone_does_not_wait_for_company_that_is_not_coming(checkpoint):
    """The first image of a batch waits for others only while another request is on its way:
    one client's request runs at once, however long --max-wait-ms is."""
    service = service_of(checkpoint)
    with running(_app(service, max_batch=8, max_wait_ms=10_000)) as url:
        for seed in range(3):
            started = time.monotonic()
            answer = httpx.post(f"{url}/predict", content=image_bytes(seed), headers=PNG,
                                timeout=60)  # fmt: skip
            assert answer.status_code == 200
            assert time.monotonic() - started < 5  # not the 10 s a batch may wait
        assert httpx.get(f"{url}/info").json()["batch_sizes"] == {"1": 3}
