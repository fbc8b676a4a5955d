"""Uploads, read with limits: the body (size, time), its images (multipart parts or raw bytes)
and each image decoded by vitkit's own decoder (`data.open_image`, as `vitkit predict` reads
files), its size checked from the header before any pixel is decoded. Everything stays in
memory: nothing from a request is written to disk."""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from PIL import Image
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request

from ..data.images import DataError, open_image
from .errors import RequestError
from .limits import Limits

RAW_TYPES = ("application/octet-stream",)  # and every image/* type
_IN_MEMORY = re.compile(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>")
HOW_TO_SEND = (
    "send the image as multipart/form-data (curl -F file=@cat.jpg) or as raw bytes with "
    "Content-Type image/jpeg, image/png or application/octet-stream"
)


@dataclass(frozen=True)
class Upload:
    """One uploaded file: its name (the multipart filename, else 'image') and bytes."""

    name: str
    data: bytes


async def read_body(request: Request, limits: Limits) -> bytes:
    """The whole body, refused (413) as soon as it passes `max_upload_bytes` and (408) when it
    takes longer than `body_timeout_s`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_upload_bytes:
        raise _too_large(int(declared), limits)
    chunks, size = [], 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_upload_bytes:
                    raise _too_large(size, limits)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            408, f"the upload took over {limits.body_timeout_s:g} s; send the whole body at once"
        ) from None
    except ClientDisconnect:
        raise RequestError(400, "the client closed the connection before the body ended") from None
    return b"".join(chunks)


def _too_large(size: int, limits: Limits) -> RequestError:
    return RequestError(
        413,
        f"the upload is over {limits.max_upload_bytes} bytes (got at least {size}); send a "
        "smaller image or start the server with a larger --max-upload-mb",
    )


async def uploads_of(request: Request, limits: Limits) -> list[Upload]:
    """The images of a request: the file parts of a multipart form (any field name), or the
    raw body when its Content-Type is an image type or application/octet-stream."""
    content_type = request.headers.get("content-type", "application/octet-stream")
    kind = content_type.split(";")[0].strip().lower()
    if kind != "multipart/form-data" and not (kind.startswith("image/") or kind in RAW_TYPES):
        raise RequestError(415, f"unsupported Content-Type {kind!r}; {HOW_TO_SEND}")
    body = await read_body(request, limits)
    if kind != "multipart/form-data":
        uploads = [Upload("image", body)] if body else []
    else:
        uploads = await _form_files(request, body, limits)
    if not uploads:
        raise RequestError(400, f"the request holds no image; {HOW_TO_SEND}")
    if len(uploads) > limits.max_files:
        raise RequestError(
            413, f"{len(uploads)} images in one request, over the limit of {limits.max_files}"
        )
    return uploads


async def _form_files(request: Request, body: bytes, limits: Limits) -> list[Upload]:
    """The file parts of a multipart body already read, parsed by Starlette's parser (python-
    multipart) with its spooled files kept in memory."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    parser = MultiPartParser(request.headers, stream(), max_files=limits.max_files + 1)
    parser.spool_max_size = limits.max_upload_bytes + 1  # never rolled over to a disk file
    try:
        form = await parser.parse()
    except (MultiPartException, ValueError) as err:
        raise RequestError(400, f"a malformed multipart body: {err}; {HOW_TO_SEND}") from None
    uploads = []
    try:
        for _, value in form.multi_items():
            if isinstance(value, str):
                continue  # a text field (e.g. topk sent as a form field is read from the URL)
            uploads.append(Upload(value.filename or "image", await value.read()))
    finally:
        await form.close()
    return uploads


def decode_image(upload: Upload, limits: Limits, *, in_chans: int) -> Image.Image:
    """`upload` as the PIL image `vitkit predict` would make of the same file (`open_image`):
    413 over `max_pixels`, 422 for what is no image, a truncated or corrupt one, or one under
    `min_side`."""
    width, height = _header_size(upload, limits)
    if width * height > limits.max_pixels:
        raise RequestError(
            413,
            f"{upload.name} is {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_pixels}; resize it or start the server with a larger --max-pixels",
        )
    if min(width, height) < limits.min_side:
        raise RequestError(
            422,
            f"{upload.name} is {width}x{height}; images need at least {limits.min_side} pixels "
            "on each side",
        )
    data = io.BytesIO(upload.data)
    try:
        return open_image(data, in_chans=in_chans)
    except DataError as err:
        reason = str(err).removeprefix(f"cannot read image {data}: ")
        raise RequestError(422, f"cannot read {upload.name}: {reason}") from None
    except Exception as err:  # Pillow's plugins raise more kinds on malformed files
        raise RequestError(422, f"cannot read {upload.name}: {_reason(err, upload)}") from None


def _header_size(upload: Upload, limits: Limits) -> tuple[int, int]:
    """(width, height) from the image's header, without decoding its pixels."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(upload.data)) as img:
                return img.size
    except Image.DecompressionBombError as err:  # over twice Pillow's own limit
        raise RequestError(
            413, f"{upload.name} is over the limit of {limits.max_pixels} pixels ({err})"
        ) from None
    except Exception as err:  # Pillow raises many kinds for what is not an image
        raise RequestError(
            422, f"{upload.name} is not an image Pillow can read ({_reason(err, upload)})"
        ) from None


def _reason(err: Exception, upload: Upload) -> str:
    """A decoder's error, the in-memory file it names (`<_io.BytesIO object at 0x...>`)
    replaced by the upload's name."""
    return f"{type(err).__name__}: {_IN_MEMORY.sub(repr(upload.name), str(err))}"
