"""Fixtures of the server tests: a tiny checkpoint, and its model served on a free port."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._serve import running, tiny_checkpoint

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("serve") / "tiny.safetensors")


def service_of(checkpoint: Path, precision: str = "fp32"):
    """The service of `checkpoint`, loaded as `vitkit serve` loads it."""
    from vitkit.inference import load_for_inference
    from vitkit.serve.service import Service

    predictor = load_for_inference(checkpoint, precision=precision, explanations=True)
    return Service(predictor, name=checkpoint.name)


@pytest.fixture(scope="module")
def url(checkpoint) -> str:
    """A server of the tiny checkpoint with the default settings and small limits."""
    from vitkit.serve.app import create_app
    from vitkit.serve.batcher import Batching
    from vitkit.serve.limits import MB, Limits

    limits = Limits(max_upload_mb=300_000 / MB, max_pixels=250_000, max_files=8, body_timeout_s=1)
    app = create_app(service_of(checkpoint), batching=Batching(max_wait_ms=2), limits=limits)
    with running(app) as base:
        yield base
