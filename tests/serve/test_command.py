"""`vitkit serve`: flags checked in one line, a port in use refused, and the real command in
its own process answering over HTTP until SIGTERM, which lets the request in flight finish and
exits 0 (as uvicorn and gunicorn do: Kubernetes reads another code as a failure)."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from vitkit import cli

from ._serve import image_bytes

pytestmark = pytest.mark.requires("starlette", "uvicorn", "multipart", "httpx", extra="serve")

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch", "0"], "--max-batch must be in [1, 4096], got 0"),
        (["--max-batch", "1000000000000"], "--max-batch must be in [1, 4096], got 1000000000000"),
        (["--max-wait-ms", "-1"], "--max-wait-ms must be in [0, 10000], got -1"),
        (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
        (["--port", "http"], "--port must be an integer, got 'http'"),
        (["--max-queue", "0"], "--max-queue must be >= 1, got 0"),
        (["--max-upload-mb", "0"], "--max-upload-mb must be >= 0.001, got 0"),
        (["--precision", "fp8"], "--precision: unknown choice 'fp8'"),
        (["--workers", "0"], "--workers must be in [1, 256], got 0"),
        (["--workers", "10000"], "--workers must be in [1, 256], got 10000"),
        (["--threads", "100000"], "--threads must be in [0, 1024], got 100000"),
        (["--timeout-s", "nan"], "--timeout-s must be > 0, got nan"),
        (["--timeout-s", "inf"], "--timeout-s must be a finite number > 0, got inf"),
        (
            ["--max-upload-mb", "1e400"],
            "--max-upload-mb must be a finite number >= 0.001, got 1e400",
        ),
    ],
)
def test_flags_out_of_range_are_one_line(checkpoint, capsys, flags, message):
    code = cli.main(["serve", "--checkpoint", str(checkpoint), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"vitkit: error: {message}") and err.count("\n") == 1
    assert "see `vitkit serve --help`" in err


def test_a_port_in_use_is_refused_in_one_line(checkpoint, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["serve", "--checkpoint", str(checkpoint), "--port", str(port)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[-1] == (
        f"vitkit: error: cannot listen on 127.0.0.1:{port}: Address already in use; choose "
        "another --port or --host"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give the weights to serve: vitkit serve RUN_OR_CHECKPOINT"),
        (["a.safetensors", "--checkpoint", "b.safetensors"], "give the weights once"),
    ],
)
def test_the_weights_are_given_once(argv, message, capsys):
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit: error: ") and message in err and len(err.splitlines()) == 1


def test_a_run_folder_is_served_with_its_model(tmp_path, monkeypatch, capsys):
    """`vitkit serve RUN` serves the run's model.safetensors, as `predict --checkpoint RUN`
    reads it (the server itself stubbed: the subprocess test below runs a real one)."""
    import vitkit.serve.server as server_module

    run = tmp_path / "run"
    argv = ["train", "--out", str(run), "--epochs", "1", "--model-opt", "depth=1", "--no-progress"]
    assert cli.main(argv) == 0
    served = {}

    class Stub:
        def __init__(self, app, **_):
            served["app"] = app

        def run(self, sockets):
            served["sockets"] = sockets

    monkeypatch.setattr(server_module, "server", Stub)
    assert cli.main(["serve", str(run), "--port", "0"]) == 0
    service = served["app"].state.api.service
    assert service.info()["model"] == str(run)
    assert service.info()["classes"] == [str(i) for i in range(10)]


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_command_serves_until_sigterm_and_finishes_the_request_in_flight(checkpoint, stop):
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "vitkit", "serve", str(checkpoint),
               "--port", "0", "--max-wait-ms", "1500"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(process.stderr, lines), daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            found = re.search(r"serving \S+ at (http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        # the startup line: the model, the URL, the batch sizes, the workers
        startup = (
            "(fp32, pytorch_libtorch): batches of up to 16 images (warm-up 1, 2, 4, 8, 16), 1 "
        )
        assert f"{startup}worker x " in line
        assert httpx.get(f"{url}/health").json() == {"status": "ready"}
        answers: list[httpx.Response] = []
        request = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/predict", content=image_bytes(0), headers={"Content-Type": "image/png"},
            timeout=30)))  # fmt: skip
        request.start()
        time.sleep(0.5)  # the request waits 1.5 s in the batcher for others
        process.send_signal(stop)
        request.join(30)
        assert answers and answers[0].status_code == 200, answers
        assert len(answers[0].json()["results"][0]["predictions"]) == 4
        assert process.wait(30) == 0
    finally:
        process.kill()
        process.wait()
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert "stopped: the requests in flight were answered\n" in rest
    assert not any("interrupted" in line or "Traceback" in line for line in rest)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
