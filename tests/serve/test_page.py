"""The page at / in headless Chromium, driven over the DevTools protocol on a pipe (no driver
package): it describes the model, and an image picked in its file input shows the top-5
and the explanation overlay."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ._serve import image_bytes, running

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = os.environ.get("VITKIT_PAGE_SCREENSHOT")  # keep the screenshot there, to look at


class DevTools:
    """Chromium with `--remote-debugging-pipe`: commands as NUL-ended JSON on its fd 3,
    answers and events on its fd 4."""

    def __init__(self, profile: Path) -> None:
        to_read, self._to_browser = os.pipe()
        self._from_browser, to_write = os.pipe()
        os.set_inheritable(to_read, True)
        os.set_inheritable(to_write, True)
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]  # fmt: skip
        # fd 3 and 4 of the child are the two pipe ends (dup2 in the child, before exec)
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(to_read, 3), os.dup2(to_write, 4)),
        )  # fmt: skip
        os.close(to_read)
        os.close(to_write)
        self._buffer = b""
        self._id = 0
        self.session: str | None = None

    def call(self, method: str, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next()
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def _next(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            assert chunk, "chromium closed its DevTools pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)  # fmt: skip
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        guarded = f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()"
        while not (value := self.evaluate(guarded)):  # false until the page has loaded
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.05)
        return value

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt install chromium)")
def test_the_page_shows_the_top_5_and_the_overlay(checkpoint, tmp_path):
    import httpx

    from vitkit.serve.app import create_app

    from .conftest import service_of

    data = image_bytes(3, (40, 30))
    with running(create_app(service_of(checkpoint))) as url:
        expected = httpx.post(f"{url}/predict", content=data,
                              headers={"Content-Type": "image/png"}).json()  # fmt: skip
        browser = DevTools(tmp_path / "profile")
        try:
            target = browser.call("Target.createTarget", url=f"{url}/")["targetId"]
            browser.session = browser.call("Target.attachToTarget", targetId=target,
                                           flatten=True)["sessionId"]  # fmt: skip
            browser.wait_for("document.getElementById('model').dataset.ready === 'true'")
            described = browser.evaluate("document.getElementById('model').textContent")
            assert described == "tiny.safetensors: 4 classes, 16x16 input, fp32, vitkit 0.1.0"
            encoded = base64.b64encode(data).decode()
            browser.evaluate(f"""(() => {{  // pick the file in the page's own input
                const bytes = Uint8Array.from(atob("{encoded}"), (c) => c.charCodeAt(0));
                const picked = new DataTransfer();
                picked.items.add(new File([bytes], "photo.png", {{ type: "image/png" }}));
                const input = document.getElementById("file");
                input.files = picked.files;
                input.dispatchEvent(new Event("change"));
            }})()""")
            browser.wait_for("document.getElementById('overlay').naturalWidth > 0")
            rows = browser.evaluate(
                "[...document.querySelectorAll('#top tbody tr')].map((r) => "
                "[r.cells[0].textContent, r.cells[1].textContent])"
            )
            overlay = browser.evaluate(
                "[document.getElementById('overlay').naturalWidth, "
                "document.getElementById('caption').textContent, "
                "document.getElementById('error').textContent]"
            )
            shot = browser.call("Page.captureScreenshot", format="png")["data"]
        finally:
            browser.close()
    predictions = expected["results"][0]["predictions"]
    assert rows == [[p["class"], f"{p['probability']:.4f}"] for p in predictions]
    assert overlay[0] > 224  # the 224-px view, its colour bar and its caption
    assert overlay[1:] == [f"where the model looks for {predictions[0]['class']}", ""]
    png = base64.b64decode(shot)
    assert png.startswith(b"\x89PNG")
    if SCREENSHOT:
        Path(SCREENSHOT).write_bytes(png)
