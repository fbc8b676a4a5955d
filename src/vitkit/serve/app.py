"""The HTTP API (Starlette): /predict, /explain, /health (and /health/live, /health/ready),
/metrics, /info, /openapi.json, the page at /, and the Open Inference Protocol's /v2 routes
(`oip`). Every refusal is a JSON `{"error": ...}` with a 4xx status (503 with Retry-After when
the queue is full, 504 past `--timeout-s`); the server goes on serving. Once started, the model
is warmed up with one batch of each served size (`batcher.warm_up_sizes`) in the background:
/health/ready answers 503 until that ends."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from torch import Tensor

from .. import __version__
from .access import AccessLogMiddleware
from .batcher import Arrival, Batcher, Batching, QueueFull, warm_up_sizes
from .errors import RequestError, within
from .limits import Limits
from .metrics import CONTENT_TYPE, Metrics, MetricsMiddleware
from .oip import oip_routes
from .openapi import openapi
from .page import PAGE
from .service import MAPS, Service, explanation_json, overlay_png
from .uploads import Upload, decode_image, uploads_of

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 503 asks the client to wait
Endpoint = Callable[[Request], Awaitable[Response]]


def _within_timeout(endpoint: Endpoint) -> Endpoint:
    """`endpoint` answering 504 once the request has taken `limits.timeout_s`."""

    @functools.wraps(endpoint)
    async def bounded(self: _Api, request: Request) -> Response:
        return await within(self.limits.timeout_s, endpoint(self, request))

    return bounded


class _Api:
    """The endpoints over one service, its batcher and the request limits."""

    def __init__(
        self,
        service: Service,
        batching: Batching,
        limits: Limits,
        *,
        warm_up: bool = True,
        load_s: float | None = None,
    ) -> None:
        self.service = service
        self.limits = limits
        self.metrics = Metrics()
        self.batcher = Batcher(
            service.predict, batching, on_batch=self.metrics.batch, on_queue=self.metrics.queue.set
        )
        self.ready = asyncio.Event()  # set once warmed up
        self.warm_up = warm_up
        self._decoders = anyio.Semaphore(limits.decoders)
        self._warming: asyncio.Task | None = None
        if load_s is not None:
            self.metrics.load_time.set(load_s)
        self.metrics.ready.set(0)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"status": "live"})

    async def health_ready(self, request: Request) -> Response:
        if not self.ready.is_set():
            return JSONResponse(
                {"status": "warming up"}, 503, headers={"Retry-After": str(RETRY_AFTER_S)}
            )
        return JSONResponse({"status": "ready"})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def info(self, request: Request) -> Response:
        batching = self.batcher.batching
        return JSONResponse(
            {
                **self.service.info(),
                "version": __version__,
                "batching": {
                    "max_batch": batching.max_batch,
                    "max_wait_ms": batching.max_wait_ms,
                    "max_queue": batching.max_queue,
                },
                "batch_sizes": {str(k): n for k, n in sorted(self.batcher.batch_sizes.items())},
                "waiting": self.batcher.waiting,
                "pid": os.getpid(),
                "limits": {
                    "max_upload_bytes": self.limits.max_upload_bytes,
                    "max_pixels": self.limits.max_pixels,
                    "min_side": self.limits.min_side,
                    "max_files": self.limits.max_files,
                },
            }
        )

    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi(__version__))

    @_within_timeout
    async def predict(self, request: Request) -> Response:
        topk = _topk(request.query_params.get("topk"), len(self.service.class_names))
        with self.batcher.arriving() as arrival:
            uploads = await uploads_of(request, self.limits)
            self.room_for(len(uploads))  # before any decoding: overload costs little
            images = [await self.prepared(upload) for upload in uploads]
            results = await self.classify(images, topk, arrival)
        return JSONResponse(
            {
                "model": self.service.name,
                "precision": self.service.precision,
                "results": [{"image": u.name, "predictions": r} for u, r in zip(uploads, results)],
            }
        )

    async def classify(
        self, images: list[Tensor], topk: int, arrival: Arrival | None = None
    ) -> list[Any]:
        """Each prepared image's top-k, through the batcher; 503 when its queue is full."""
        try:
            return await self.batcher.submit(images, topk, arrival)
        except QueueFull as err:
            raise _busy(str(err)) from None

    @_within_timeout
    async def explain(self, request: Request) -> Response:
        query = request.query_params
        map_name = _choice(query, "map", MAPS)
        form = _choice(query, "format", ("png", "json"))
        try:
            target = self.service.target(query.get("class"))
        except ValueError as err:
            raise RequestError(400, str(err)) from None
        uploads = await uploads_of(request, self.limits)
        if len(uploads) != 1:
            raise RequestError(400, f"/explain takes one image, got {len(uploads)}")
        (upload,) = uploads
        await self.prepared(upload)  # the same checks as /predict
        try:
            explained = await self.batcher.call(
                self.service.explain, upload.data, upload.name, target, map_name
            )
        except ValueError as err:
            raise RequestError(400, str(err)) from None
        names = self.service.class_names
        if form == "json":
            return JSONResponse(
                {"model": self.service.name, **explanation_json(explained, map_name, names)}
            )
        png = overlay_png(explained, map_name, names, self.service.predictor.explanation)
        headers = {
            "X-Predicted-Class": names[explained.predicted],
            "X-Explained-Class": names[explained.target],
        }
        return Response(png, media_type="image/png", headers=headers)

    async def prepared(self, upload: Upload) -> Tensor:
        """The upload decoded and prepared, off the event loop, a few at a time."""
        async with self._decoders:
            return await run_in_threadpool(self._decode_and_prepare, upload)

    def _decode_and_prepare(self, upload: Upload) -> Tensor:
        image = decode_image(upload, self.limits, in_chans=self.service.in_chans)
        return self.service.prepare(image)

    def room_for(self, count: int) -> None:
        """Refuse (413, 503) `count` images the queue cannot take, before any work on them."""
        batching = self.batcher.batching
        if count > batching.max_queue:  # would never fit: no use retrying
            raise RequestError(
                413,
                f"{count} images in one request, more than the queue holds "
                f"({batching.max_queue}); send fewer at a time",
            )
        if self.batcher.waiting + count > batching.max_queue:
            raise _busy(
                f"{self.batcher.waiting} images are waiting (the queue holds at most "
                f"{batching.max_queue})"
            )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.batcher.start()
        self._warming = asyncio.create_task(self._warm_up())
        try:
            yield
        finally:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
            await self.batcher.stop()

    async def _warm_up(self) -> None:
        """One batch of each served size, then ready (at once with `warm_up=False`)."""
        started = time.perf_counter()
        if self.warm_up:
            image = self.service.example_image()
            try:
                await self.batcher.warm_up(image, warm_up_sizes(self.batcher.batching.max_batch))
            except Exception:  # the model cannot run: never ready, and the log says why
                log.exception(
                    "the warm-up of %s failed; /health/ready stays 503", self.service.name
                )
                return
        seconds = time.perf_counter() - started
        self.metrics.warmup_time.set(seconds)
        self.metrics.ready.set(1)
        self.ready.set()
        log.debug("%s warmed up in %.2f s", self.service.name, seconds)


def _busy(why: str) -> RequestError:
    return RequestError(
        503,
        f"the server is busy: {why}; retry in {RETRY_AFTER_S} s",
        {"Retry-After": str(RETRY_AFTER_S)},
    )


def _topk(text: str | None, classes: int) -> int:
    """`topk` of the query: default 5, at most the number of classes."""
    if text is None:
        return min(5, classes)
    if not text.isdigit() or int(text) < 1:
        raise RequestError(400, f"topk must be a whole number >= 1, got {text!r}")
    return min(int(text), classes)


def _choice(query: Any, name: str, choices: tuple[str, ...]) -> str:
    value = query.get(name, choices[0])
    if value not in choices:
        raise RequestError(400, f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value


async def _refused(request: Request, err: Exception) -> Response:
    if isinstance(err, RequestError):
        return JSONResponse({"error": err.message}, err.status, headers=err.headers)
    assert isinstance(err, HTTPException)
    return JSONResponse({"error": err.detail}, err.status_code, headers=err.headers)


async def _failed(request: Request, err: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=err)
    message = f"the server failed: {type(err).__name__}: {err}"
    return JSONResponse({"error": message}, 500)


def create_app(
    service: Service,
    *,
    batching: Batching | None = None,
    limits: Limits | None = None,
    warm_up: bool = True,
    load_s: float | None = None,
    access_log: bool = False,
) -> Starlette:
    """The ASGI app serving `service` (run it with uvicorn, `server.serve`), its requests
    batched as `batching` says and bounded by `limits`; ready once warmed up (`warm_up`),
    the model's load time (`load_s`) among its metrics, each request logged in the Common Log
    Format with `access_log`."""
    api = _Api(service, batching or Batching(), limits or Limits(), warm_up=warm_up, load_s=load_s)
    routes = [
        Route("/", api.page, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/health/live", api.live, methods=["GET"]),
        Route("/health/ready", api.health_ready, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/info", api.info, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/predict", api.predict, methods=["POST"]),
        Route("/explain", api.explain, methods=["POST"]),
        *oip_routes(api),
    ]
    handlers = {RequestError: _refused, HTTPException: _refused, Exception: _failed}
    middleware = [Middleware(MetricsMiddleware, metrics=api.metrics)]
    if access_log:
        middleware.insert(0, Middleware(AccessLogMiddleware))
    app = Starlette(
        routes=routes, exception_handlers=handlers, lifespan=api.lifespan, middleware=middleware
    )
    app.state.api = api
    return app
