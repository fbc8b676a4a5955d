"""What people who run a server look at: /metrics parsed by Prometheus' own parser and moving
with the requests, /health/live and /health/ready (503 until the warm-up ends), and a request
past --timeout-s answered 504."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time

import httpx
import pytest

from ._serve import image_bytes, running
from .conftest import service_of

pytestmark = pytest.mark.requires(
    "starlette", "uvicorn", "multipart", "httpx", "prometheus_client", extra="serve"
)


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client's parser: (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = httpx.get(f"{url}/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def _requests(samples, route: str, status: str, method: str = "POST") -> float:
    key = ("vitkit_requests_total", (("method", method), ("route", route), ("status", status)))
    return samples.get(key, 0.0)


def test_metrics_parse_and_move_with_the_requests(url):
    before = _samples(url)
    png = {"Content-Type": "image/png"}
    files = [("file", (f"{i}.png", image_bytes(i))) for i in range(3)]
    assert httpx.post(f"{url}/predict", files=files, timeout=30).status_code == 200
    assert httpx.post(f"{url}/predict", content=image_bytes(9), headers=png).status_code == 200
    assert httpx.post(f"{url}/predict", content=b"no image", headers=png).status_code == 422
    after = _samples(url)
    assert _requests(after, "/predict", "200") - _requests(before, "/predict", "200") == 2
    assert _requests(after, "/predict", "422") - _requests(before, "/predict", "422") == 1
    assert (
        _requests(after, "/metrics", "200", "GET") - _requests(before, "/metrics", "200", "GET")
        == 1
    )
    images = ("vitkit_images_total", ())
    assert after[images] - before.get(images, 0.0) == 4  # 3 + 1 images through the model
    latency = ("vitkit_request_duration_seconds_count", (("route", "/predict"),))
    assert after[latency] - before.get(latency, 0.0) == 3
    assert after[("vitkit_batch_size_count", ())] >= 2  # at least two forward passes
    assert after[("vitkit_queue_depth", ())] == 0
    assert after[("vitkit_ready", ())] == 1 and after[("vitkit_warmup_seconds", ())] > 0
    assert after[("vitkit_images_per_second", ())] > 0
    if sys.platform.startswith("linux"):  # prometheus_client reads the process's /proc
        assert after[("process_resident_memory_bytes", ())] > 10 * 2**20


def test_a_path_no_route_has_is_counted_as_unmatched(url):
    before = _samples(url)
    assert httpx.get(f"{url}/nowhere").status_code == 404
    after = _samples(url)
    assert (
        _requests(after, "unmatched", "404", "GET") - _requests(before, "unmatched", "404", "GET")
        == 1
    )


class _Gated:
    """A service whose forward passes wait until `gate` is set."""

    def __init__(self, service) -> None:
        self.gate = threading.Event()
        self._predict = service.predict
        service.predict = self.predict
        self.service = service

    def predict(self, images, topk):
        assert self.gate.wait(30)
        return self._predict(images, topk)


def test_ready_is_503_until_the_warm_up_ends_and_live_answers_throughout(checkpoint):
    from vitkit.serve.app import create_app
    from vitkit.serve.batcher import Batching

    gated = _Gated(service_of(checkpoint))
    app = create_app(gated.service, batching=Batching(max_batch=4))
    with running(app, ready=False) as base:
        assert httpx.get(f"{base}/health/live").json() == {"status": "live"}
        waiting = httpx.get(f"{base}/health/ready")
        assert waiting.status_code == 503 and waiting.json() == {"status": "warming up"}
        assert waiting.headers["retry-after"] == "1"
        assert httpx.get(f"{base}/v2/health/ready").status_code == 503
        assert httpx.get(f"{base}/health").json() == {"status": "ready"}  # as it always was
        gated.gate.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.02)
        assert httpx.get(f"{base}/health/ready").json() == {"status": "ready"}
        assert app.state.api.batcher.batch_sizes == {}  # warm-up passes are not served batches
        samples = _samples(base)
        assert samples[("vitkit_ready", ())] == 1


def test_warm_up_runs_one_batch_of_each_served_size():
    from vitkit.serve.batcher import warm_up_sizes

    assert warm_up_sizes(1) == [1]
    assert warm_up_sizes(16) == [1, 2, 4, 8, 16]
    assert warm_up_sizes(12) == [1, 2, 4, 8, 12]


def test_a_request_past_the_timeout_is_answered_504_and_the_server_goes_on(checkpoint):
    from vitkit.serve.app import create_app
    from vitkit.serve.limits import Limits

    gated = _Gated(service_of(checkpoint))
    app = create_app(gated.service, limits=Limits(timeout_s=0.3), warm_up=False)
    with running(app, ready=False) as base:
        png = {"Content-Type": "image/png"}
        started = time.monotonic()
        late = httpx.post(f"{base}/predict", content=image_bytes(0), headers=png, timeout=30)
        assert late.status_code == 504, late.text
        assert time.monotonic() - started < 5
        assert late.json() == {
            "error": "the request took over 0.3 s; retry later, or start the server with a "
            "larger --timeout-s"
        }
        gated.gate.set()
        answer = httpx.post(f"{base}/predict", content=image_bytes(0), headers=png, timeout=30)
        assert answer.status_code == 200
        samples = _samples(base)
        assert _requests(samples, "/predict", "504") == 1


CLF = re.compile(
    r"^127\.0\.0\.1 - - \[\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] "
    r'"POST /predict\?topk=2 HTTP/1\.1" 200 \d+$'
)


@pytest.mark.parametrize("access_log", [False, True])
def test_the_access_log_is_the_common_log_format_and_off_by_default(checkpoint, caplog, access_log):
    from vitkit.serve.app import create_app

    app = create_app(service_of(checkpoint), warm_up=False, access_log=access_log)
    with caplog.at_level(logging.INFO, logger="vitkit.access"), running(app) as base:
        png = {"Content-Type": "image/png"}
        answer = httpx.post(f"{base}/predict?topk=2", content=image_bytes(0), headers=png)
        assert answer.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "vitkit.access"]
    if not access_log:
        assert lines == []
        return
    (line,) = lines
    assert CLF.match(line), line
    assert line.endswith(f" {len(answer.content)}")


def test_connections_go_without_nagles_delay(url):
    """The listening sockets set TCP_NODELAY (accepted connections inherit it): without it,
    every answer's body waited for the client's delayed ACK of its headers (~40 ms)."""
    import socket

    from vitkit.serve.server import bind

    with bind("127.0.0.1", 0) as sock:  # --workers shares this one socket too
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    with httpx.Client(base_url=url) as client:  # one connection, one request after the other
        client.get("/health")
        took = []
        for _ in range(15):
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            took.append(time.perf_counter() - started)
    assert sorted(took)[7] < 0.03  # the median; 40 ms or more with Nagle's delay


def test_a_model_that_fails_its_warm_up_is_never_ready_and_says_why(checkpoint, caplog):
    from vitkit.serve.app import create_app

    service = service_of(checkpoint)

    def broken(images, topk):
        raise FloatingPointError("the model's outputs are not finite")

    service.predict = broken
    app = create_app(service)
    with caplog.at_level(logging.ERROR), running(app, ready=False) as base:
        deadline = time.monotonic() + 30
        while not any("warm-up" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert httpx.get(f"{base}/health/ready").status_code == 503
        assert httpx.get(f"{base}/health/live").status_code == 200
    (record,) = [r for r in caplog.records if "warm-up" in r.getMessage()]
    assert record.getMessage() == "the warm-up of tiny.safetensors failed; /health/ready stays 503"
