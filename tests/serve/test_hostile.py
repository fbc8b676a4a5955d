"""Hostile and careless requests: each gets its 4xx JSON error saying what is wrong, nothing
is written to disk, and the next request is answered."""

from __future__ import annotations

import struct
import tempfile
import time
import zlib
from pathlib import Path

import httpx
import pytest

from ._serve import image_bytes

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")

GOOD = image_bytes(0, (24, 24))
PNG = {"Content-Type": "image/png"}


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` (a decompression bomb needs no more to be
    refused: the size is read before any pixel)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _multipart(boundary: str, parts: list[tuple[str, bytes]]) -> bytes:
    body = b""
    for name, data in parts:
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                 f"filename=\"{name}\"\r\nContent-Type: image/png\r\n\r\n").encode()  # fmt: skip
        body += data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


CASES = {
    # name: (request kwargs, status, words of the message)
    "not an image": (
        {"content": b"hello, this is text" * 10, "headers": PNG}, 422, "not an image"),
    "truncated": ({"content": GOOD[: len(GOOD) // 2], "headers": PNG}, 422, "cannot read image"),
    "corrupt": ({"content": GOOD[:60] + bytes(range(256)) * 4, "headers": PNG}, 422,
                "cannot read image"),
    "decompression bomb": (
        {"content": _png_header(20000, 20000), "headers": PNG}, 413, "(400000000 pixels)"),
    "over the pixel limit": (
        {"content": _png_header(600, 500), "headers": PNG}, 413,
        "600x500 = 300000 pixels, over the limit of 250000"),
    "1x1": ({"content": image_bytes(2, (1, 1)), "headers": PNG}, 422, "at least 2 pixels"),
    "over the upload limit": (
        {"content": b"\0" * 400_000, "headers": PNG}, 413, "over 300000 bytes"),
    "wrong content type": (
        {"content": GOOD, "headers": {"Content-Type": "text/plain"}}, 415, "multipart/form-data"),
    "form-urlencoded (curl --data-binary)": ({"content": GOOD}, 415, "Content-Type"),
    "empty body": ({"content": b"", "headers": PNG}, 400, "holds no image"),
    "a form without a file": ({"data": {"topk": "3"}, "files": {}}, 415, "urlencoded"),
    "malformed multipart": (
        {"content": b"--x\r\nnonsense", "headers": {"Content-Type": "multipart/form-data"}},
        400, "multipart"),
    "too many files": (
        {"files": [("file", (f"{i}.png", GOOD)) for i in range(9)]}, 413, "9 images"),
    "bad topk": ({"content": GOOD, "headers": PNG, "params": {"topk": "0"}}, 400, "topk"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_refused_with_a_clear_4xx_then_serving_goes_on(url, case):
    request, status, words = CASES[case]
    if "content" in request and request["content"] and "headers" not in request:
        request = {**request, "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
    answer = httpx.post(f"{url}/predict", timeout=30, **request)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert words in answer.json()["error"]
    after = httpx.post(f"{url}/predict", content=GOOD, headers=PNG, timeout=30)
    assert after.status_code == 200, after.text


def test_a_multipart_file_is_named_in_its_error(url):
    boundary = "b0undary"
    body = _multipart(boundary, [("fine.png", GOOD), ("broken.png", b"GIF89a not really")])
    answer = httpx.post(
        f"{url}/predict",
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert answer.status_code == 422  # fmt: skip
    assert answer.json()["error"].startswith("broken.png")
    assert "BytesIO" not in answer.json()["error"]  # the decoder's message names the file too


def test_an_upload_streamed_past_the_limit_is_cut_short(url):
    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(40):
            yield b"\0" * 10_000

    answer = httpx.post(f"{url}/predict", content=chunks(), headers=PNG, timeout=30)
    assert answer.status_code == 413 and "over 300000 bytes" in answer.json()["error"]


def test_a_slow_client_times_out(url):
    def slow():
        yield GOOD[:100]
        time.sleep(2.5)  # the server waits 1 s for the whole body
        yield GOOD[100:]

    started = time.monotonic()
    answer = httpx.post(f"{url}/predict", content=slow(), headers=PNG, timeout=30)
    assert answer.status_code == 408 and "took over 1 s" in answer.json()["error"]
    assert time.monotonic() - started < 10
    assert httpx.post(f"{url}/predict", content=GOOD, headers=PNG).status_code == 200


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"class": "zebra"}, "class 'zebra' is not a class of this checkpoint"),
        ({"class": "7"}, "index 0 to 3"),
        ({"map": "saliency"}, "choose one of relevance, rollout, cls_attention"),
        ({"format": "gif"}, "choose one of png, json"),
    ],
)
def test_explain_refuses_an_unknown_class_map_or_format(url, params, words):
    answer = httpx.post(f"{url}/explain", params=params, content=GOOD, headers=PNG)
    assert answer.status_code == 400 and words in answer.json()["error"]
    assert httpx.post(f"{url}/explain", content=GOOD, headers=PNG).status_code == 200


def test_explain_takes_one_image(url):
    files = [("file", ("a.png", GOOD)), ("file", ("b.png", GOOD))]
    answer = httpx.post(f"{url}/explain", files=files)
    assert answer.status_code == 400 and "one image, got 2" in answer.json()["error"]


def test_unknown_routes_and_methods_answer_json(url):
    assert httpx.get(f"{url}/nowhere").json() == {"error": "Not Found"}
    wrong = httpx.get(f"{url}/predict")
    assert wrong.status_code == 405 and wrong.json() == {"error": "Method Not Allowed"}


def test_nothing_is_written_to_disk(url):
    before = set(Path(tempfile.gettempdir()).iterdir())
    files = [("file", (f"{i}.png", image_bytes(i, (200, 200)))) for i in range(2)]
    assert httpx.post(f"{url}/predict", files=files).status_code == 200
    assert set(Path(tempfile.gettempdir()).iterdir()) == before


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's notes on mangled TIFF tags
def test_mangled_files_of_every_format_are_decoded_or_refused_with_422():
    import io

    import numpy as np
    from PIL import Image

    from vitkit.serve.errors import RequestError
    from vitkit.serve.limits import Limits
    from vitkit.serve.uploads import Upload, decode_image

    rng = np.random.default_rng(0)
    originals = []
    for fmt in ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP"):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(out, format=fmt)
        originals.append(out.getvalue())
    outcomes = set()
    for trial in range(300):
        data = bytearray(originals[trial % len(originals)])
        for at in rng.integers(0, len(data), size=int(rng.integers(1, 8))):
            data[at] = int(rng.integers(0, 256))  # a few bytes flipped
        if trial % 3 == 0:
            data = data[: int(rng.integers(1, len(data)))]  # and cut short
        try:
            decode_image(Upload("m", bytes(data)), Limits(), in_chans=3)
            outcomes.add(200)
        except RequestError as err:
            assert err.status in (413, 422), err.message
            outcomes.add(err.status)
    assert 422 in outcomes  # no other exception escaped: no 500


def test_a_decoder_error_of_another_kind_is_a_422_not_a_500(monkeypatch):
    import struct as struct_module

    from vitkit.serve import uploads
    from vitkit.serve.errors import RequestError

    def broken(*args, **kwargs):
        raise struct_module.error("unpack requires a buffer of 4 bytes")

    monkeypatch.setattr(uploads, "open_image", broken)
    with pytest.raises(RequestError) as raised:
        uploads.decode_image(uploads.Upload("odd.tga", GOOD), uploads.Limits(), in_chans=3)
    assert raised.value.status == 422
    assert raised.value.message == "cannot read odd.tga: error: unpack requires a buffer of 4 bytes"
