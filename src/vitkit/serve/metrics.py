"""What the server has done, for Prometheus (`GET /metrics`, its text format, written by the
`prometheus-client` library): requests by route, method and status, their latency, the batch
sizes and the model's time per batch, the images waiting, images through the model (a counter,
and a gauge of the last seconds' rate), the model's load and warm-up time, readiness, and (one
process) the process's memory and CPU time.

Each app has its own registry (two apps in one process count apart). Under `--workers N` every
worker writes its values to files in one folder (`PROMETHEUS_MULTIPROC_DIR`, prometheus-client's
multiprocess mode, as gunicorn servers do), so a scrape answered by any worker adds up all of
them; a gauge of a dead worker is dropped (`forget_worker`)."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what every Prometheus scrapes
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RATE_WINDOW_S = 10.0  # images_per_second: images of the batches that ended in this window

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


def multiprocess_dir() -> str | None:
    """The folder of the workers' values, where the server runs several (else None)."""
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """The server's metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "vitkit_requests",
            "HTTP requests answered, by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "vitkit_request_duration_seconds",
            "time from a request's arrival to its answer, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "vitkit_batch_size", "images per forward pass", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_time = Histogram(
            "vitkit_batch_duration_seconds",
            "the model's time per forward pass",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.images = Counter("vitkit_images", "images through the model", registry=r)
        self.rate = Gauge(
            "vitkit_images_per_second",
            f"images through the model per second over the last {RATE_WINDOW_S:g} s",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.queue = Gauge(
            "vitkit_queue_depth",
            "images waiting for the model",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.load_time = Gauge(
            "vitkit_model_load_seconds",
            "time to load the model",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.warmup_time = Gauge(
            "vitkit_warmup_seconds",
            "time to warm the model up (one batch of each served size)",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.ready = Gauge(
            "vitkit_ready",
            "1 once the model is warmed up (every worker)",
            multiprocess_mode="livemin",
            registry=r,
        )
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        if multiprocess_dir() is None:  # one process: its memory, CPU time and open files too
            ProcessCollector(registry=r)

    def batch(self, size: int, seconds: float) -> None:
        """A forward pass of `size` images ended after `seconds`."""
        self.batch_size.observe(size)
        self.batch_time.observe(seconds)
        self.images.inc(size)
        self._recent.append((time.monotonic(), size))
        self._update_rate()

    def _update_rate(self) -> None:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()
        self.rate.set(sum(n for _, n in self._recent) / RATE_WINDOW_S)

    def exposition(self) -> bytes:
        """The text a scrape reads: this app's metrics, or every worker's."""
        self._update_rate()
        folder = multiprocess_dir()
        if folder is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=folder)
        return generate_latest(registry)


def forget_worker(pid: int) -> None:
    """Drop the live gauges of a worker that ended (its counters stay in the sums)."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(pid)


class MetricsMiddleware:
    """Counts and times every HTTP request by its route's template (`/v2/models/{name}/infer`),
    'unmatched' for a path no route has."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what an app that ends without answering amounts to

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
