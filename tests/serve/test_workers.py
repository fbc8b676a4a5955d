"""`vitkit serve --workers 2`: two processes on one port answer 64 concurrent clients, each
with its own answer; /metrics adds up both; a worker killed is replaced while the other goes
on; SIGTERM answers the request in flight and exits 0; a checkpoint that cannot load fails
once, in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from ._serve import SRC, image_bytes, serving
from .conftest import service_of

pytestmark = [
    pytest.mark.requires(
        "starlette", "uvicorn", "multipart", "httpx", "prometheus_client", extra="serve"
    ),  # fmt: skip
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: /proc, fork"),
]

PNG = {"Content-Type": "image/png"}


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether process `pid` runs (exists and is no zombie)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _expected(checkpoint, images: list[bytes]) -> list[list[dict]]:
    """Each image's four classes, computed here as the server computes them."""
    from vitkit.serve.limits import Limits
    from vitkit.serve.uploads import Upload, decode_image

    service = service_of(checkpoint)
    prepared = [service.prepare(decode_image(Upload("x", d), Limits(), in_chans=3))
                for d in images]  # fmt: skip
    return service.predict(torch.stack(prepared), [4] * len(images))


def _requests_answered(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vitkit_requests_total" and s.labels["route"] == "/predict"
    )


def test_two_workers_answer_64_clients_each_its_own_then_sigterm_exits_0(checkpoint):
    images = [image_bytes(100 + i, (20 + i % 7, 18 + i % 5)) for i in range(64)]
    expected = _expected(checkpoint, images)
    argv = [str(checkpoint), "--workers", "2", "--max-batch", "16", "--max-wait-ms", "1000"]
    with serving(*argv) as served:
        assert "2 workers x 1 thread" in served.lines()[0]
        start = threading.Barrier(64)

        def client(data: bytes) -> httpx.Response:
            start.wait(30)
            return httpx.post(f"{served.url}/predict?topk=4", content=data, headers=PNG,
                              timeout=60)  # fmt: skip

        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(client, images))
        assert [a.status_code for a in answers] == [200] * 64
        for answer, want in zip(answers, expected):
            got = answer.json()["results"][0]["predictions"]
            assert [p["index"] for p in got] == [p["index"] for p in want]
            for g, w in zip(got, want):
                assert g["probability"] == pytest.approx(w["probability"], abs=2e-6)
        pids = {httpx.get(f"{served.url}/info").json()["pid"] for _ in range(24)}
        assert pids == _children(served.process.pid)  # both workers answer
        assert _requests_answered(served.url) == 64  # the scrape adds up both workers

        in_flight: list[httpx.Response] = []
        request = threading.Thread(target=lambda: in_flight.append(httpx.post(
            f"{served.url}/predict", content=images[0], headers=PNG, timeout=30)))  # fmt: skip
        request.start()
        time.sleep(0.4)  # it waits up to 1 s in its worker's batcher for others
        served.process.send_signal(signal.SIGTERM)
        request.join(30)
        assert in_flight and in_flight[0].status_code == 200
        assert served.process.wait(60) == 0
        assert not _children(served.process.pid)
        assert not any("Traceback" in line for line in served.lines())


def test_a_killed_worker_is_replaced_and_the_server_goes_on(checkpoint):
    with serving(str(checkpoint), "--workers", "2") as served:
        parent = served.process.pid
        deadline = time.monotonic() + 30
        while len(before := _children(parent)) != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        while len(after := _children(parent) - {victim}) != 2:
            assert time.monotonic() < deadline, f"not replaced: {after}"
            time.sleep(0.05)
        (new,) = after - before
        for _ in range(8):  # served throughout, by the survivor or the new worker
            answer = httpx.post(f"{served.url}/predict", content=image_bytes(1), headers=PNG,
                                timeout=30)  # fmt: skip
            assert answer.status_code == 200
        while not any(f"pid {new}" in line for line in served.lines()):  # the new one loaded
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert any(f"(pid {victim}) ended with exit code -9; starting another" in line
                   for line in served.lines())  # fmt: skip
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(60) == 0


def test_a_request_sent_while_no_worker_is_up_waits_for_one(checkpoint):
    """The workers share the parent's listening socket: with every worker killed, a request
    sent at once waits in its queue for a replacement to load, never refused (each worker's
    own SO_REUSEPORT socket closed with it, refusing or resetting what came meanwhile)."""
    with serving(str(checkpoint), "--workers", "2") as served:
        parent = served.process.pid
        deadline = time.monotonic() + 30
        while len(workers := _children(parent)) != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        answer = httpx.post(f"{served.url}/predict", content=image_bytes(1), headers=PNG,
                            timeout=60)  # fmt: skip
        assert answer.status_code == 200
        assert not workers & _children(parent)


def test_weights_that_cannot_load_fail_once_in_one_line(tmp_path):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a checkpoint")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "vitkit", "serve", str(broken), "--workers", "2",
               "--port", "0"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vitkit: error: ") and "broken.safetensors" in last
    assert "Traceback" not in done.stderr


def test_the_workers_end_with_a_parent_killed_outright(checkpoint):
    with serving(str(checkpoint), "--workers", "2", wait_ready=False) as served:
        parent = served.process.pid
        deadline = time.monotonic() + 60
        while len(workers := _children(parent)) != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        served.process.kill()
        served.process.wait()
        alive = set(workers)
        while alive:  # they see their parent gone, and stop
            assert time.monotonic() < deadline, f"workers {alive} outlived their parent"
            time.sleep(0.1)
            alive = {pid for pid in alive if _running(pid)}


def test_a_port_another_server_shares_is_refused_in_one_line(checkpoint, capsys):
    """Another server's SO_REUSEPORT socket on the port is not joined without a word: the one
    socket `--workers` shares is bound without SO_REUSEPORT, so the port in use is said."""
    import socket

    from vitkit import cli

    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        code = cli.main(["serve", str(checkpoint), "--workers", "2", "--port", str(port)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[-1] == (
        f"vitkit: error: cannot listen on 127.0.0.1:{port}: Address already in use; choose "
        "another --port or --host"
    )
