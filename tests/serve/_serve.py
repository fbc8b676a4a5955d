"""Helpers of the server tests: a tiny checkpoint, images, and a real server on a free
loopback port in a thread."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CLASSES = ("cat", "dog", "eel", "fox")


def tiny_checkpoint(path: Path) -> Path:
    """A random one-block RGB ViT of 16x16 inputs (four classes, distinct scores), saved with
    its class names and a centre-crop data config, so that images are resized and cropped."""
    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_digits", num_classes=len(CLASSES), in_chans=3, img_size=16, patch_size=4,
        embed_dim=16, depth=1, num_heads=2,
    )  # fmt: skip
    with torch.no_grad():
        model.head.weight.normal_(0, 2.0)  # scores far apart: the top-k is not a near tie
    from vitkit.data.data_config import DataConfig

    model.data_config = DataConfig(
        input_size=(3, 16, 16), mean=0.5, std=0.25, interpolation="bicubic", crop_pct=0.875
    )
    vitkit.save(model, path, meta={"class_names": list(CLASSES)})
    return path


def image_bytes(seed: int, size=(37, 29), mode: str = "RGB", fmt: str = "PNG") -> bytes:
    """A random image of `size` (w, h) in `mode`, encoded as `fmt`."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    image = Image.fromarray(array[..., 0] if channels == 1 else array, mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@contextlib.contextmanager
def running(app, *, ready: bool = True) -> Iterator[str]:
    """`app` served by uvicorn in a thread on 127.0.0.1 and a free port: its base URL, once
    warmed up (`ready`); the server is stopped (gracefully) on exit."""
    from vitkit.serve.server import address, bind, server

    sock = bind("127.0.0.1", 0)
    uvicorn_server = server(app, log_level="warning", access_log=False)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvicorn_server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    while ready and not app.state.api.ready.is_set():
        assert time.monotonic() < deadline, "the server did not warm up"
        time.sleep(0.01)
    try:
        yield address(sock)
    finally:
        uvicorn_server.should_exit = True
        thread.join(30)
        sock.close()


SRC = Path(__file__).resolve().parents[2] / "src"


class Served:
    """`vitkit serve` in a process of its own: its URL, and its stderr lines so far."""

    def __init__(self, process, url: str, lines) -> None:
        self.process, self.url, self._lines = process, url, lines
        self.seen: list[str] = []

    def lines(self) -> list[str]:
        """Every stderr line the command has written so far."""
        while not self._lines.empty():
            self.seen.append(self._lines.get())
        return self.seen


@contextlib.contextmanager
def serving(*argv: str, wait_ready: bool = True) -> Iterator[Served]:
    """`python -m vitkit serve *argv --port 0` on this checkout, once its startup line has
    said its URL (and, with `wait_ready`, /health/ready answers 200); killed on exit if still
    running."""
    import os
    import queue
    import re
    import subprocess
    import sys

    import httpx

    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "vitkit", "serve", *argv, "--port", "0"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in process.stderr:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        served, deadline = None, time.monotonic() + 60
        while served is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            found = re.search(r"serving \S+ at (http://127\.0\.0\.1:\d+)", line)
            if found:
                served = Served(process, found.group(1), lines)
                served.seen.append(line)
        while wait_ready and not _ready(httpx, served.url):
            assert process.poll() is None, "".join(served.lines())
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.05)
        yield served
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ready(httpx, url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
