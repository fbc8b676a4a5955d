"""`vitkit serve`: a checkpoint behind HTTP (the `serve` package), loaded once, concurrent
requests batched."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..serve.batcher import Batching
from ..serve.limits import Limits
from ..train.config import resolve_device
from . import options
from .commands import add_command
from .errors import UserError
from .loading import load_model
from .status import ExitCode

log = logging.getLogger("vitkit")

MB = 1024 * 1024


def register(subparsers: Any) -> argparse.ArgumentParser:
    batching, limits = Batching(), Limits()
    p = add_command(
        subparsers,
        "serve",
        description="Serves a checkpoint over HTTP until Ctrl-C or SIGTERM (which finish the "
        "requests in flight): POST /predict (top classes of one or several images), POST "
        "/explain (where the model looks, as a PNG or JSON), GET /health, GET /info, GET "
        "/openapi.json, and a page at / to try it in a browser. Images are prepared as "
        "`vitkit predict` prepares them; concurrent requests are batched. Needs the serve "
        "extra: pip install 'vitkit[serve]'.",
    )
    p.add_argument("source", nargs="?", metavar="RUN_OR_CHECKPOINT",
                   help="a run folder (its model.safetensors) or any weights --checkpoint "
                   "takes")  # fmt: skip
    options.checkpoint(p, required=False)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: 127.0.0.1, this machine only; "
                   "0.0.0.0 for every network)")  # fmt: skip
    p.add_argument("--port", type=options.number_in(0, 65535, integer=True), default=8000,
                   metavar="N", help="the port (default: 8000; 0: a free one)")  # fmt: skip
    group = p.add_argument_group("batching")
    group.add_argument("--max-batch", type=options.int_in(1), default=batching.max_batch,
                       metavar="N", help="images per forward pass, gathered from concurrent "
                       f"requests (default: {batching.max_batch}; 1: no batching)")  # fmt: skip
    group.add_argument("--max-wait-ms", type=options.number_in(0, 10_000),
                       default=batching.max_wait_ms, metavar="T",
                       help="how long the first image of a batch waits for "
                       f"others, in milliseconds (default: {batching.max_wait_ms:g})")  # fmt: skip
    group.add_argument("--max-queue", type=options.int_in(1), default=batching.max_queue,
                       metavar="N", help="images waiting at most; beyond, requests get 503 with "
                       f"Retry-After (default: {batching.max_queue})")  # fmt: skip
    group = p.add_argument_group("limits on each request")
    group.add_argument("--max-upload-mb", type=options.number_in(0.001), metavar="MB",
                       default=limits.max_upload_bytes / MB, help="the largest request body "
                       f"(default: {limits.max_upload_bytes / MB:g})")  # fmt: skip
    group.add_argument("--max-pixels", type=options.int_in(1), metavar="N",
                       default=limits.max_pixels, help="the most pixels (width x height) of "
                       f"an image, read from its header before decoding (default: "
                       f"{limits.max_pixels})")  # fmt: skip
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..serve.app import create_app  # the serve extra, only when serving
    from ..serve.server import address, bind, server
    from ..serve.service import Service

    args.checkpoint = _weights(args)
    device = resolve_device(args.device)
    sock = bind(args.host, args.port)  # a port in use is said before the model is read
    with sock:
        # loaded in fp32: the service sets the precision (and keeps fp32 for int8 explanations)
        model, _ = load_model(argparse.Namespace(**{**vars(args), "precision": "fp32"}), device)
        service = Service(model, name=args.checkpoint, precision=args.precision)
        batching = Batching(
            max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue
        )
        limits = Limits(max_upload_bytes=round(args.max_upload_mb * MB), max_pixels=args.max_pixels)
        log.info("serving %s at %s (open it in a browser; Ctrl-C to stop)", args.checkpoint,
                 address(sock))  # fmt: skip
        server(create_app(service, batching=batching, limits=limits)).run(sockets=[sock])
    return ExitCode.OK


def _weights(args: argparse.Namespace) -> str:
    """What to serve: RUN_OR_CHECKPOINT or --checkpoint, one of them."""
    if args.source is None and args.checkpoint is None:
        raise UserError("give the weights to serve: vitkit serve RUN_OR_CHECKPOINT")
    if args.source is not None and args.checkpoint is not None:
        raise UserError(f"{args.source} and --checkpoint {args.checkpoint}: give the weights once")
    return args.source if args.source is not None else args.checkpoint
