"""The access log: one line per request in the Common Log Format (Apache's, read by every log
tool: `host - - [time] "METHOD path HTTP/version" status bytes`), to the `vitkit.access`
logger; off unless `--access-log` asks for it."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("vitkit.access")


class AccessLogMiddleware:
    """Logs each HTTP request once its answer has been sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status, size = 500, 0

        async def sending(message: Any) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log.info(common_log_line(scope, status, size))


def common_log_line(scope: Any, status: int, size: int) -> str:
    """`scope`'s request answered `status` with `size` bytes, in the Common Log Format."""
    host = (scope.get("client") or ("-",))[0]
    path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    target = f"{path}?{query}" if query else path
    when = time.strftime("%d/%b/%Y:%H:%M:%S %z")
    version = scope.get("http_version", "1.1")
    return f'{host} - - [{when}] "{scope["method"]} {target} HTTP/{version}" {status} {size or "-"}'
