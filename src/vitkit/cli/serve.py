"""`vitkit serve`: a checkpoint behind HTTP (the `serve` package), loaded once, concurrent
requests batched."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..options.flags import add_flags, given_options
from ..serve.batcher import Batching
from ..serve.limits import Limits
from ..serve.server import Address
from . import options
from .commands import add_command
from .errors import UserError
from .status import ExitCode

log = logging.getLogger("vitkit")


def register(subparsers: Any) -> argparse.ArgumentParser:
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
    add_flags(p, Address, check_ranges=True)
    add_flags(p, Batching, check_ranges=True)
    add_flags(p, Limits, exclude=Limits.FLAGLESS, check_ranges=True)
    options.model_run(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..serve.app import create_app  # the serve extra, only when serving
    from ..serve.server import address, bind, server
    from ..serve.service import Service

    args.checkpoint = _weights(args)
    at = Address(**given_options(args, Address))
    batching = Batching(**given_options(args, Batching))
    limits = Limits(**given_options(args, Limits))
    sock = bind(at.host, at.port)  # a port in use is said before the model is read
    with sock:
        predictor = options.load_predictor(args, purpose="serve", explanations=True)
        log.info("serving %s at %s (open it in a browser; Ctrl-C to stop)", args.checkpoint,
                 address(sock))  # fmt: skip
        app = create_app(Service(predictor), batching=batching, limits=limits)
        server(app).run(sockets=[sock])
    return ExitCode.OK


def _weights(args: argparse.Namespace) -> str:
    """What to serve: RUN_OR_CHECKPOINT or --checkpoint, one of them."""
    if args.source is None and args.checkpoint is None:
        raise UserError("give the weights to serve: vitkit serve RUN_OR_CHECKPOINT")
    if args.source is not None and args.checkpoint is not None:
        raise UserError(f"{args.source} and --checkpoint {args.checkpoint}: give the weights once")
    return args.source if args.source is not None else args.checkpoint
