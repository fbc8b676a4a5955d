"""`vitkit serve`: a checkpoint or an exported ONNX file behind HTTP (the `serve` package),
loaded once per worker, concurrent requests batched."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from typing import Any

from ..options.flags import add_flags, given_options
from ..serve.batcher import Batching, warm_up_sizes
from ..serve.limits import Limits
from ..serve.server import Address, Processes
from . import options
from .commands import add_command
from .errors import UserError, describe
from .status import ExitCode

log = logging.getLogger("vitkit")


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = add_command(
        subparsers,
        "serve",
        description="Serves a checkpoint, or an ONNX file written by `vitkit export`, over HTTP "
        "until Ctrl-C or SIGTERM (which answer the requests in flight, then exit 0): POST "
        "/predict (top classes of one or several images), POST /explain (where the model "
        "looks, as a PNG or JSON), GET /health, /health/live, /health/ready (503 until the "
        "model is warmed up), GET /metrics (Prometheus), GET /info, GET /openapi.json, the Open "
        "Inference Protocol's /v2 routes (KServe, Triton clients), and a page at / to try it "
        "in a browser. Images are prepared as `vitkit predict` prepares them; concurrent "
        "requests are batched. Needs the serve extra: pip install 'vitkit[serve]'.",
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="RUN_OR_CHECKPOINT",
        help="a run folder (its model.safetensors), any weights --checkpoint "
        "takes, or an .onnx file (onnxruntime; no /explain)",
    )
    options.checkpoint(p, required=False)
    add_flags(p, Address, check_ranges=True)
    add_flags(p, Processes, check_ranges=True)
    add_flags(p, Batching, check_ranges=True)
    add_flags(p, Limits, exclude=Limits.FLAGLESS, check_ranges=True)
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..serve.server import address, bind
    from ..serve.workers import run_workers, threads_per_worker

    args.checkpoint = _weights(args)
    at = Address(**given_options(args, Address))
    processes = Processes(**given_options(args, Processes))
    batching = Batching(**given_options(args, Batching))
    limits = Limits(**given_options(args, Limits))
    threads = threads_per_worker(processes.workers, processes.threads)
    sock = bind(at.host, at.port)  # a port in use is said before the model is read
    with sock:
        if processes.workers == 1:
            _set_threads(threads)
            app = _app(args, batching, limits, processes)
            _announce(args, address(sock), app.state.api.service, batching, processes, threads)
            return _serve_until_stopped(app, sock)
        with tempfile.TemporaryDirectory(prefix="vitkit-metrics-") as metrics_dir:

            def worker(index: int, loaded: Any) -> int:
                return _worker(args, sock, (batching, limits, processes), threads, loaded)

            _announce(args, address(sock), None, batching, processes, threads)
            return run_workers(worker, processes.workers, metrics_dir)


def _worker(args: argparse.Namespace, sock: Any, settings: tuple, threads: int, loaded: Any) -> int:
    """One worker's process (`serve.workers`): its threads, its model, the listening socket it
    inherited; a failure to load is one line, as in one process."""
    from ..serve.server import server

    _set_threads(threads)
    try:
        app = _app(args, *settings)
    except Exception as err:
        code, message = describe(err, options.option_flags(args), "serve")
        print(f"vitkit: error: {message}", file=sys.stderr)
        return int(code)
    loaded.set()
    log.info("worker pid %d: %s loaded", os.getpid(), app.state.api.service.name)
    server(app, access_log=False).run(sockets=[sock])
    return ExitCode.OK


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _app(args: argparse.Namespace, batching: Batching, limits: Limits, processes: Processes):
    """The app of the weights (a checkpoint, or an ONNX file), its load time measured."""
    from ..serve.app import create_app  # the serve extra, only when serving
    from ..serve.service import Service

    started = time.perf_counter()
    predictor = _load(args)
    load_s = time.perf_counter() - started
    return create_app(
        Service(predictor),
        batching=batching,
        limits=limits,
        load_s=load_s,
        access_log=processes.access_log,
    )


def _load(args: argparse.Namespace) -> Any:
    """The predictor of `--checkpoint`: onnxruntime for an .onnx file, else torch."""
    if not str(args.checkpoint).endswith(".onnx"):
        return options.load_predictor(args, purpose="serve", explanations=True)
    from ..inference import OnnxPredictor

    ignored = [
        flag
        for flag, given in (
            ("--arch", args.arch),
            ("--num-heads", args.num_heads),
            ("--device", args.device),
        )
        if given
    ]
    if args.precision != "fp32" or ignored:
        given = ignored + ([f"--precision {args.precision}"] if args.precision != "fp32" else [])
        raise UserError(
            f"{', '.join(given)}: an ONNX file runs as it was exported (onnxruntime, "
            "CPU); export it with vitkit export --precision int8 for int8"
        )
    return OnnxPredictor(args.checkpoint, data_overrides=options.preparation_given(args))


def _announce(
    args: argparse.Namespace,
    url: str,
    service: Any,
    batching: Batching,
    processes: Processes,
    threads: int,
) -> None:
    """The startup line: the model, the URL, the batch sizes, the workers and threads."""
    how = f" ({service.precision}, {service.platform})" if service is not None else ""
    workers = processes.workers
    sizes = ", ".join(map(str, warm_up_sizes(batching.max_batch)))
    log.info(
        "serving %s at %s%s: batches of up to %d images (warm-up %s), %d worker%s x %d "
        "thread%s; Ctrl-C to stop",
        args.checkpoint,
        url,
        how,
        batching.max_batch,
        sizes,
        workers,
        "s" if workers > 1 else "",
        threads,
        "s" if threads > 1 else "",
    )


def _serve_until_stopped(app: Any, sock: Any) -> int:
    """Serve until SIGTERM or SIGINT, which answer the requests in flight, then 0."""
    from ..serve.server import server
    from ..serve.workers import stop_requests

    with stop_requests() as stopped:
        server(app, access_log=False).run(sockets=[sock])
    if stopped:
        log.info("stopped: the requests in flight were answered")
    return ExitCode.OK


def _weights(args: argparse.Namespace) -> str:
    """What to serve: RUN_OR_CHECKPOINT or --checkpoint, one of them."""
    if args.source is None and args.checkpoint is None:
        raise UserError("give the weights to serve: vitkit serve RUN_OR_CHECKPOINT")
    if args.source is not None and args.checkpoint is not None:
        raise UserError(f"{args.source} and --checkpoint {args.checkpoint}: give the weights once")
    return args.source if args.source is not None else args.checkpoint
