"""Running the app with uvicorn on a socket bound first: a port in use is an error that says
so (uvicorn alone would exit the process), and port 0 gives a free port whose number is known
before the first request. SIGTERM and Ctrl-C stop accepting, finish the requests in flight,
then end the batcher (uvicorn's graceful shutdown, then the app's lifespan)."""

from __future__ import annotations

import logging
import socket
from typing import Any

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 30  # what requests in flight get after SIGTERM before they are cut


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
    sock.listen(2048)
    sock.setblocking(False)
    return sock


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
