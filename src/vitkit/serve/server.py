"""Running the app with uvicorn on a socket bound first: a port in use is an error that says
so (uvicorn alone would exit the process), and port 0 gives a free port whose number is known
before the first request. SIGTERM and Ctrl-C stop accepting, finish the requests in flight,
then end the batcher (uvicorn's graceful shutdown, then the app's lifespan); the process then
exits 0, as uvicorn and gunicorn do. How many processes serve (`Processes`) is `workers`'."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any, ClassVar

from ..options import Options, Range, option

log = logging.getLogger(__name__)

# Each worker loads its own model: past a few per core they only compete (gunicorn advises 2-4
# per core); these bounds catch a slip such as --workers 10000 before it forks.
MAX_WORKERS, MAX_THREADS = 256, 1024
GRACEFUL_SHUTDOWN_S = 30  # what requests in flight get after SIGTERM before they are cut


@dataclass(frozen=True, kw_only=True)
class Address(Options):
    """Where the server listens (`bind`)."""

    GROUPS: ClassVar[dict[str, str]] = {"address": "where the server listens"}

    host: str = option("127.0.0.1", "the address to listen on: 127.0.0.1 is this machine "
                       "only, 0.0.0.0 every network", group="address")  # fmt: skip
    port: int = option(8000, "the port, 0 for a free one", range=Range(0, 65535), metavar="N",
                       group="address")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Processes(Options):
    """How many processes serve, their threads, and their logs."""

    GROUPS: ClassVar[dict[str, str]] = {"processes": "processes, threads and logs"}

    workers: int = option(1, "server processes sharing the port, each with its own model, "
                          "batcher and share of the cores; one that dies is replaced",
                          range=Range(1, MAX_WORKERS), metavar="N", group="processes")  # fmt: skip
    threads: int = option(0, "torch (and onnxruntime) threads of each worker; 0: the usable "
                          "cores shared out among the workers", range=Range(0, MAX_THREADS),
                          metavar="N", group="processes")  # fmt: skip
    access_log: bool = option(False, "log every request in the Common Log Format (stderr)",
                              group="processes")  # fmt: skip


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: a free port); OSError names the address
    and what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {err.strerror}; choose another --port or --host"
        ) from None
    listen(sock)
    return sock


def listen(sock: socket.socket) -> None:
    """Listen on a bound socket, its connections without Nagle's delay (TCP_NODELAY, which
    accepted connections inherit): else a response's body waits for the ACK of its headers,
    which the client delays by up to 40 ms (Linux's delayed ACK), on every request."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    sock.setblocking(False)


def address(sock: socket.socket) -> str:
    """http://HOST:PORT of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server(app: Any, *, log_level: str = "info", access_log: bool = True) -> Any:
    """A uvicorn server of `app` (start it with `.run(sockets=[bind(...)])`; set
    `.should_exit` to stop it from another thread)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return uvicorn.Server(config)
