"""The Open Inference Protocol (KServe v2, the REST API Triton, KServe, Seldon MLServer and
TorchServe speak): /v2, /v2/health/live, /v2/health/ready, /v2/models/{name},
/v2/models/{name}/ready and POST /v2/models/{name}/infer.

An inference request holds one input, either the images as the model takes them (FP32,
[batch, C, H, W], prepared as the model's data config says) or image files (BYTES, [batch]:
each element a file's bytes, base64 in JSON, or raw with Triton's binary tensor extension,
which `tritonclient` sends by default). The answer has two outputs: `probabilities` (FP32,
[batch, classes]) and `top_classes` (BYTES, [batch, k], "probability:index:class" as Triton's
classification extension writes them; `parameters.topk`, default 5); an output requested with
`parameters.classification` = k is given in that form too. Every answer is JSON."""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Any, Protocol

import numpy as np
import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from .batcher import Arrival
from .errors import RequestError, within
from .uploads import Upload, read_body

HEADER_LENGTH = "inference-header-content-length"  # Triton's binary tensor extension
DEFAULT_TOPK = 5


class Api(Protocol):
    """What the routes use of the app's API (`app._Api`): its service, limits, batcher and
    readiness, and how it prepares and classifies images."""

    service: Any
    limits: Any
    batcher: Any
    ready: Any

    def room_for(self, count: int) -> None: ...

    async def prepared(self, upload: Upload) -> torch.Tensor: ...

    async def classify(
        self, images: list[torch.Tensor], topk: int, arrival: Arrival | None = None
    ) -> list[Any]: ...


def oip_routes(api: Api) -> list[Route]:
    """The /v2 routes over the API's service and batcher."""
    v2 = _OpenInference(api)
    return [
        Route("/v2", v2.server, methods=["GET"]),
        Route("/v2/health/live", v2.live, methods=["GET"]),
        Route("/v2/health/ready", v2.ready, methods=["GET"]),
        Route("/v2/models/{name}", v2.model, methods=["GET"]),
        Route("/v2/models/{name}/ready", v2.model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", v2.infer, methods=["POST"]),
    ]


class _OpenInference:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.service = api.service

    async def server(self, request: Request) -> Response:
        return JSONResponse({"name": "vitkit", "version": __version__, "extensions": []})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        ready = self.api.ready.is_set()
        return JSONResponse({"ready": ready}, 200 if ready else 503)

    async def model(self, request: Request) -> Response:
        name = self._name(request)
        c, h, w = self.service.data_config.input_size
        return JSONResponse(
            {
                "name": name,
                "versions": ["1"],
                "platform": self.service.platform,
                "inputs": [
                    {"name": "image", "datatype": "FP32", "shape": [-1, c, h, w]},
                    {"name": "image_bytes", "datatype": "BYTES", "shape": [-1]},
                ],
                "outputs": [
                    {
                        "name": "probabilities",
                        "datatype": "FP32",
                        "shape": [-1, len(self.service.class_names)],
                    },
                    {"name": "top_classes", "datatype": "BYTES", "shape": [-1, -1]},
                ],
            }
        )

    async def model_ready(self, request: Request) -> Response:
        ready = self.api.ready.is_set()
        return JSONResponse({"name": self._name(request), "ready": ready}, 200 if ready else 503)

    async def infer(self, request: Request) -> Response:
        return await within(self.api.limits.timeout_s, self._infer(request))

    def _name(self, request: Request) -> str:
        name, served = request.path_params["name"], self.service.short_name
        if name != served:
            raise RequestError(
                404,
                f"no model named {name!r}; this server serves {served!r} (GET /v2/models/{served})",
            )
        return name

    async def _infer(self, request: Request) -> Response:
        name = self._name(request)
        with self.api.batcher.arriving() as arrival:
            return await self._answer(name, request, arrival)

    async def _answer(self, name: str, request: Request, arrival: Arrival) -> Response:
        header, binary = _split(await read_body(request, self.api.limits), request)
        inputs = header.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
            raise RequestError(
                400,
                "an inference request holds one input: 'image' (FP32, "
                "[batch, C, H, W]) or 'image_bytes' (BYTES, [batch])",
            )
        (tensor,) = inputs
        parameters = header.get("parameters") or {}
        topk = _whole(parameters.get("topk", DEFAULT_TOPK), "parameters.topk")
        classes = len(self.service.class_names)
        if tensor.get("datatype") == "BYTES":
            images = await self._decoded(_bytes_elements(tensor, binary))
        else:
            images = list(self._tensor(tensor, binary))
        self.api.room_for(len(images))
        results = await self.api.classify(images, classes, arrival)  # every class, in order
        outputs = _outputs(results, classes, min(topk, classes), header.get("outputs"))
        answer: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": outputs}
        if "id" in header:
            answer["id"] = header["id"]
        return JSONResponse(answer)

    async def _decoded(self, files: list[bytes]) -> list[torch.Tensor]:
        if len(files) > self.api.limits.max_files:
            raise RequestError(
                413,
                f"{len(files)} images in one request, over the limit of "
                f"{self.api.limits.max_files}",
            )
        return [
            await self.api.prepared(Upload(f"image_bytes[{i}]", data))
            for i, data in enumerate(files)
        ]

    def _tensor(self, tensor: dict[str, Any], binary: bytes | None) -> torch.Tensor:
        """An FP32 input as (B, C, H, W), checked against the model's input size."""
        want = tuple(self.service.data_config.input_size)
        dims, most = ", ".join(map(str, want)), self.api.limits.max_files
        shape = tensor.get("shape")
        if tensor.get("datatype") != "FP32" or not isinstance(shape, list) or len(shape) != 4:
            raise RequestError(
                400, f"the input must be FP32 images [batch, {dims}] or BYTES image files [batch]"
            )
        if tuple(shape[1:]) != want or not 1 <= shape[0] <= most:
            raise RequestError(
                400, f"the input's shape is {shape}; the model takes [1..{most}, {dims}]"
            )
        count = int(np.prod(shape))
        if binary is not None and "binary_data_size" in (tensor.get("parameters") or {}):
            data = np.frombuffer(binary, dtype="<f4")
        else:
            data = np.asarray(tensor.get("data"), dtype=np.float32).reshape(-1)
        if data.size != count:
            raise RequestError(
                400, f"the input holds {data.size} values; shape {shape} needs {count}"
            )
        images = torch.from_numpy(data.copy()).reshape(shape)  # (B, C, H, W)
        if not torch.isfinite(images).all():
            raise RequestError(422, "the input holds values that are not finite (NaN or inf)")
        return images


def _split(body: bytes, request: Request) -> tuple[dict[str, Any], bytes | None]:
    """The JSON header of a request and the binary data after it (Triton's extension)."""
    length = request.headers.get(HEADER_LENGTH)
    if length is not None and not length.isdigit():
        raise RequestError(400, f"{HEADER_LENGTH} must be a number of bytes, got {length!r}")
    cut = int(length) if length is not None else len(body)
    try:
        header = json.loads(body[:cut])
    except (ValueError, RecursionError):
        raise RequestError(400, "the body is not a JSON inference request") from None
    if not isinstance(header, dict):
        raise RequestError(400, "the body is not a JSON inference request (an object)")
    return header, (body[cut:] if length is not None else None)


def _bytes_elements(tensor: dict[str, Any], binary: bytes | None) -> list[bytes]:
    """The files of a BYTES input: raw (4-byte little-endian length, then the bytes, each)
    after the JSON header, or base64 strings in its `data`."""
    if binary is not None and "binary_data_size" in (tensor.get("parameters") or {}):
        files, at = [], 0
        while at + 4 <= len(binary):
            (size,) = struct.unpack_from("<I", binary, at)
            files.append(binary[at + 4 : at + 4 + size])
            at += 4 + size
        if at != len(binary):
            raise RequestError(400, "the binary BYTES data is cut short")
    else:
        data = tensor.get("data")
        if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
            raise RequestError(400, "a BYTES input's data is a list of base64 strings")
        try:
            files = [base64.b64decode(d, validate=True) for d in data]
        except binascii.Error:
            raise RequestError(400, "a BYTES input's data must be base64 (image files)") from None
    if not files:
        raise RequestError(400, "the input holds no image")
    return files


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(400, f"{what} must be a whole number >= 1, got {value!r}")
    return value


def _outputs(
    results: list[list[dict[str, Any]]], classes: int, topk: int, asked: Any
) -> list[dict[str, Any]]:
    """The outputs asked (default both), from each image's classes, most probable first."""
    names = ["probabilities", "top_classes"]
    wanted = [{"name": n} for n in names] if not asked else asked
    if not isinstance(wanted, list) or not all(isinstance(o, dict) for o in wanted):
        raise RequestError(400, "'outputs' is a list of objects with a 'name'")
    out = []
    for output in wanted:
        name = output.get("name")
        if name not in names:
            raise RequestError(400, f"no output {name!r}; choose {' or '.join(names)}")
        k = (output.get("parameters") or {}).get("classification")
        if name == "top_classes" or k is not None:
            k = min(_whole(k, "parameters.classification") if k is not None else topk, classes)
            rows = [
                [f"{p['probability']:f}:{p['index']}:{p['class']}" for p in r[:k]] for r in results
            ]
            out.append(
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(results), k],
                    "data": [s for row in rows for s in row],
                }
            )
            continue
        probs = np.zeros((len(results), classes), dtype=np.float32)
        for row, result in zip(probs, results):
            for p in result:
                row[p["index"]] = p["probability"]
        out.append(
            {
                "name": name,
                "datatype": "FP32",
                "shape": [len(results), classes],
                "data": probs.reshape(-1).tolist(),
            }
        )
    return out
