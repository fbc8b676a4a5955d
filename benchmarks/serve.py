"""`vitkit serve` under load, against (a) a plain Starlette endpoint that calls the model once
per request in the same harness and (b) the model alone in a batched loop: requests/s and p50 /
p99 latency at 1, 8, 32 and 64 concurrent clients, vitkit with 1 and 2 workers, and the peak
memory of each server (PSS of its processes, so the forked workers' shared pages count once).

    python benchmarks/serve.py --threads 2                     # ViT-S/16; ~10 min on 2 cores
    python benchmarks/serve.py --model vit_digits --clients 1,2 --requests 8 --workers 1  # dry
    python benchmarks/serve.py --help

The model has random weights (nothing is downloaded), saved as a checkpoint and served as
`vitkit serve CKPT` serves it, each server in a process of its own on a free loopback port
(started, measured, stopped, one at a time). The clients are asyncio tasks in this process,
one connection each, each sending one PNG per request, one request after the other; latency
is a request's time from send to answer, requests/s the requests answered over the round's
wall time. The clients share the CPU with the server: the CPU and threads are printed. The
goals (issue 45): at 32 clients, vitkit at least 2x the plain endpoint; at 64, at least 80% of
the model's batched rate; the one-client overhead (p50 less the model's time for one image)
well under the model's time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import environment, vitkit  # noqa: E402  (the sibling script's helpers)

SRC = Path(__file__).resolve().parents[1] / "src"
PNG = {"Content-Type": "image/png"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_small_patch16_224", help="a registered model name")
    p.add_argument("--clients", default="1,8,32,64", help="concurrent clients, comma-separated")
    p.add_argument("--requests", type=int, default=256, help="requests per round (all clients)")
    p.add_argument("--workers", default="1,2", help="vitkit's --workers, comma-separated")
    p.add_argument("--max-batch", type=int, default=16, help="vitkit's --max-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="vitkit's --max-wait-ms")
    p.add_argument("--image-size", type=int, default=256, help="the side of the PNGs sent")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of each server in all (vitkit: shared out among its "
                   "workers); default: torch's")  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--plain-endpoint", metavar="CKPT", help=argparse.SUPPRESS)  # (a)'s process
    return p.parse_args(argv)


def pngs(count: int, side: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


# -- (a) the plain endpoint: what one writes without a serving library --------------------------


def plain_endpoint(checkpoint: str) -> None:
    """Serve POST /predict as a plain Starlette endpoint: decode, prepare, the model on one
    image, top-5 as JSON; one request, one forward pass (in Starlette's thread pool)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from vitkit.data.images import open_image
    from vitkit.inference import load_for_inference
    from vitkit.serve.server import address, bind

    predictor = load_for_inference(checkpoint)

    def classify(data: bytes) -> list[dict]:
        image = predictor.prepare(open_image(io.BytesIO(data), in_chans=predictor.in_chans))
        probs, indices = predictor.predict(image[None], 5)  # (1, C, H, W)
        return [
            {"index": i, "probability": p} for p, i in zip(probs[0].tolist(), indices[0].tolist())
        ]

    async def predict(request):
        return JSONResponse(await run_in_threadpool(classify, await request.body()))

    async def health(request):
        return JSONResponse({"status": "ready"})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]),
                            Route("/health/ready", health)])  # fmt: skip
    sock = bind("127.0.0.1", 0)
    print(f"serving plain at {address(sock)}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


# -- a server in its own process, its memory watched ------------------------------------------


class Server:
    """A server process started by `command`, until `stop`; `url` from its startup line."""

    def __init__(self, command: list[str], threads: int | None) -> None:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        self.url = self._url()
        self.peak_mib = 0.0
        self._watching = False

    def _url(self) -> str:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            found = re.search(r"serving \S+ at (http://127\.0\.0\.1:\d+)", line)
            if found:
                threading.Thread(target=self._drain, daemon=True).start()
                return found.group(1)
        raise RuntimeError(f"the server ended (exit code {self.process.wait()})")

    def _drain(self) -> None:
        for _ in self.process.stderr or ():
            pass

    def wait_ready(self, timeout: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the server did not get ready")
            time.sleep(0.1)

    def watch(self) -> None:
        """Sample the processes' memory (PSS) every 50 ms until `unwatch`; the peak kept."""
        self._watching = True

        def sample() -> None:
            while self._watching:
                self.peak_mib = max(self.peak_mib, pss_mib(self.process.pid))
                time.sleep(0.05)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

    def unwatch(self) -> None:
        self._watching = False
        self._sampler.join()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def pss_mib(pid: int) -> float:
    """The proportional set size of `pid` and its children, in MiB (Linux; 0 elsewhere)."""
    total = 0
    for proc in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{proc}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# -- the load ----------------------------------------------------------------------------------


async def load_round(url: str, images: list[bytes], clients: int) -> dict:
    """`len(images)` requests from `clients` concurrent clients: requests/s, p50 and p99 (ms)."""
    import httpx

    latencies: list[float] = []

    async def client(mine: list[bytes]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            for data in mine:
                sent = time.perf_counter()
                answer = await c.post("/predict", content=data, headers=PNG)
                answer.raise_for_status()
                latencies.append(time.perf_counter() - sent)

    started = time.perf_counter()
    await asyncio.gather(*(client(images[i::clients]) for i in range(clients)))
    wall = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests_per_s": len(latencies) / wall, "p50_ms": 1000 * cuts[49],
            "p99_ms": 1000 * cuts[98]}  # fmt: skip


def measure(name: str, server: Server, images: list[bytes], clients: list[int]) -> list[dict]:
    rows = []
    try:
        server.wait_ready()
        asyncio.run(load_round(server.url, images[:4], 1))  # warm-up
        for count in clients:
            server.peak_mib = 0.0
            server.watch()
            try:
                row = asyncio.run(load_round(server.url, images, count))
            finally:
                server.unwatch()
            rows.append({"server": name, "clients": count, **row, "peak_mib": server.peak_mib})
            print(f"{name}, {count} clients: {row['requests_per_s']:.1f} req/s, "
                  f"{server.peak_mib:.0f} MiB", flush=True)  # fmt: skip
    finally:
        server.stop()
    return rows


# -- (b) the model alone -----------------------------------------------------------------------


def model_alone(checkpoint: str, images: list[bytes], batch: int) -> dict:
    """Images/s of the model alone on prepared images, `batch` at a time (after a warm-up
    pass), and of decode + prepare + the model; the model's time for one image (ms)."""
    from vitkit.data.images import open_image
    from vitkit.inference import load_for_inference

    predictor = load_for_inference(checkpoint)

    def decoded(data: bytes) -> Image.Image:
        return open_image(io.BytesIO(data), in_chans=predictor.in_chans)

    prepared = torch.stack([predictor.prepare(decoded(d)) for d in images])  # (N, C, H, W)

    def rate(size: int, prepare: bool) -> float:
        """The best of three passes over the images (after a warm-up batch)."""
        predictor.predict(prepared[:size], 5)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for start in range(0, len(images), size):
                chunk = (torch.stack([predictor.prepare(decoded(d))
                                      for d in images[start : start + size]])
                         if prepare else prepared[start : start + size])  # fmt: skip
                predictor.predict(chunk, 5)
            best = min(best, time.perf_counter() - started)
        return len(images) / best

    one = rate(1, False)
    return {f"batch {batch}": rate(batch, False), "batch 1": one,
            f"batch {batch}, decode + prepare": rate(batch, True),
            "one image ms": 1000 / one}  # fmt: skip


def vitkit_command(checkpoint: str, args: argparse.Namespace, workers: int) -> list[str]:
    command = [sys.executable, "-m", "vitkit", "serve", checkpoint, "--port", "0",
               "--workers", str(workers), "--max-batch", str(args.max_batch),
               "--max-wait-ms", str(args.max_wait_ms), "--max-queue", "4096"]  # fmt: skip
    if args.threads:
        command += ["--threads", str(max(1, args.threads // workers))]
    return command


def report(rows: list[dict], alone: dict, args: argparse.Namespace, env: dict) -> dict:
    """The table and the goals' ratios, printed; the ratios returned."""
    print(f"\n{args.model}, {args.image_size}x{args.image_size} PNGs, {args.requests} requests "
          f"per round, --max-batch {args.max_batch}; {env['cpu']} ({env['cpu_capability']}), "
          f"{env['threads']} threads, torch {env['torch']}, {env['date']}\n")  # fmt: skip
    print("| server | clients | requests/s | p50 ms | p99 ms | peak MiB |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    for r in rows:
        print(f"| {r['server']} | {r['clients']} | {r['requests_per_s']:.1f} | "
              f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['peak_mib']:.0f} |")  # fmt: skip
    for name, value in alone.items():
        if name != "one image ms":
            print(f"| model alone, {name} | - | {value:.1f} images/s | - | - | - |")
    rate = {(r["server"], r["clients"]): r["requests_per_s"] for r in rows}
    batched = alone[f"batch {args.max_batch}"]
    ratios = {}
    for server in sorted({r["server"] for r in rows} - {"plain endpoint"}):
        for clients, against, what in ((32, rate.get(("plain endpoint", 32)), "plain endpoint"),
                                       (64, batched, "model batched")):  # fmt: skip
            if (server, clients) in rate and against:
                key = f"{server}, {clients} clients / {what}"
                ratios[key] = rate[(server, clients)] / against
        one = [r for r in rows if r["server"] == server and r["clients"] == 1]
        if one:
            ratios[f"{server}, 1 client: request path ms"] = (
                one[0]["p50_ms"] - alone["one image ms"]
            )
    print()
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    return ratios


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plain_endpoint:
        if args.threads:
            torch.set_num_threads(args.threads)
        plain_endpoint(args.plain_endpoint)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clients = [int(c) for c in args.clients.split(",")]
    images = pngs(args.requests, args.image_size)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = str(Path(folder) / "model.safetensors")
        vitkit.save(vitkit.create_model(args.model), checkpoint)
        alone = model_alone(checkpoint, images, args.max_batch)
        plain = [sys.executable, str(Path(__file__).resolve()), "--plain-endpoint", checkpoint]
        plain += ["--threads", str(args.threads)] if args.threads else []
        rows = measure("plain endpoint", Server(plain, args.threads), images, clients)
        for workers in (int(w) for w in args.workers.split(",")):
            name = f"vitkit, {workers} worker{'s' if workers > 1 else ''}"
            server = Server(vitkit_command(checkpoint, args, workers), args.threads)
            rows += measure(name, server, images, clients)
    env = environment(torch.device("cpu"), argparse.Namespace(no_timm=True, threads=None))
    ratios = report(rows, alone, args, env)
    if args.json:
        result = {"environment": env, "model": args.model, "serve": rows, "model_alone": alone,
                  "ratios": ratios}  # fmt: skip
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
