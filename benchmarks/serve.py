"""`vitkit serve` under load: requests/s and p50 / p99 latency for 1, 8 and 32 concurrent
clients, batching on (--max-batch) and off (batch 1), against the model called in a plain
loop on the same images (decode, prepare, forward: one image at a time, then batches).

    python benchmarks/serve.py                                  # ViT-S/16, ~5 min on a CPU
    python benchmarks/serve.py --model vit_digits --clients 1,2 --requests 8   # a dry run
    python benchmarks/serve.py --help

The model has random weights (nothing is downloaded), saved and loaded as a checkpoint so
that the server prepares images from its data config as `vitkit serve` does. The server runs
in this process (uvicorn in a thread, on a free loopback port); the clients are threads with
one shared httpx connection pool, each sending one PNG per request, one request after the
other. Latency is a request's time from send to answer; requests/s the requests answered
over the wall time of a round. The clients share the CPU with the server: the figures are
those of one machine serving itself, the CPU and threads named in the output.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import environment, vitkit  # noqa: E402  (the sibling script's helpers)
from vitkit.serve.app import create_app  # noqa: E402
from vitkit.serve.batcher import Batching  # noqa: E402
from vitkit.serve.limits import Limits  # noqa: E402
from vitkit.serve.server import address, bind, server  # noqa: E402
from vitkit.serve.service import Service  # noqa: E402
from vitkit.serve.uploads import Upload, decode_image  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_small_patch16_224", help="a registered model name")
    p.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    p.add_argument("--requests", type=int, default=128, help="requests per round (all clients)")
    p.add_argument("--max-batch", type=int, default=16, help="--max-batch with batching on")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="--max-wait-ms, batching on")
    p.add_argument("--image-size", type=int, default=256, help="the side of the PNGs sent")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    return p.parse_args(argv)


def pngs(count: int, side: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buffer = io.BytesIO()
        array = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(array).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def plain_loop(service: Service, images: list[bytes], batch: int) -> float:
    """Images/s of decode + prepare + forward in a loop, `batch` images a pass (after one
    pass of warm-up)."""
    for warm_up in (True, False):
        started = time.perf_counter()
        _loop(service, images[:batch] if warm_up else images, batch)
    return len(images) / (time.perf_counter() - started)


def _loop(service: Service, images: list[bytes], batch: int) -> None:
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        prepared = [
            service.prepare(decode_image(Upload("x", d), Limits(), in_chans=service.in_chans))
            for d in chunk
        ]
        service.predict(torch.stack(prepared), [5] * len(chunk))  # (B, C, H, W)


def load_round(url: str, images: list[bytes], clients: int) -> dict:
    """`len(images)` requests from `clients` threads: requests/s, p50 and p99 latency (ms)."""
    import httpx

    latencies: list[float] = []
    lock = threading.Lock()
    with httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=64)) as c:

        def client(mine: list[bytes]) -> None:
            for data in mine:
                sent = time.perf_counter()
                answer = c.post("/predict", content=data, headers={"Content-Type": "image/png"})
                answer.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - sent)

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, [images[i::clients] for i in range(clients)]))
        wall = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests_per_s": len(latencies) / wall, "p50_ms": 1000 * cuts[49],
            "p99_ms": 1000 * cuts[98]}  # fmt: skip


def serve_rounds(service: Service, images: list[bytes], args: argparse.Namespace) -> list[dict]:
    rows = []
    for mode, max_batch in (("batching on", args.max_batch), ("batching off", 1)):
        batching = Batching(max_batch=max_batch, max_wait_ms=args.max_wait_ms, max_queue=4096)
        app = create_app(service, batching=batching)
        sock = bind("127.0.0.1", 0)
        uvicorn_server = server(app, log_level="warning", access_log=False)
        thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]})
        thread.start()
        while not uvicorn_server.started:
            time.sleep(0.01)
        try:
            load_round(address(sock), images[:4], 1)  # warm-up
            for clients in map(int, args.clients.split(",")):
                row = load_round(address(sock), images, clients)
                rows.append({"mode": mode, "clients": clients, **row})
                print(f"{mode}, {clients} clients: {row['requests_per_s']:.1f} req/s", flush=True)
            rows[-1]["batch_sizes"] = dict(app.state.api.batcher.batch_sizes)
        finally:
            uvicorn_server.should_exit = True
            thread.join()
            sock.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        vitkit.save(vitkit.create_model(args.model), path)
        service = Service(vitkit.load(path), name=args.model)
    images = pngs(args.requests, args.image_size)
    plain = {"batch 1": plain_loop(service, images, 1),
             f"batch {args.max_batch}": plain_loop(service, images, args.max_batch)}  # fmt: skip
    rows = serve_rounds(service, images, args)
    env = environment(torch.device("cpu"), argparse.Namespace(no_timm=True, threads=None))
    print(f"\n{args.model}, {args.image_size}x{args.image_size} PNGs, {args.requests} requests "
          f"per round; {env['cpu']} ({env['cpu_capability']}), {env['threads']} threads, "
          f"torch {env['torch']}, "
          f"{env['date']}\n")  # fmt: skip
    print(
        "| server | clients | requests/s | p50 ms | p99 ms |\n| --- | ---: | ---: | ---: | ---: |"
    )
    for row in rows:
        print(f"| {row['mode']} | {row['clients']} | {row['requests_per_s']:.1f} | "
              f"{row['p50_ms']:.0f} | {row['p99_ms']:.0f} |")  # fmt: skip
    for name, rate in plain.items():
        print(f"| plain loop, {name} | - | {rate:.1f} images/s | - | - |")
    if args.json:
        report = {"environment": env, "model": args.model, "serve": rows, "plain_loop": plain}
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
