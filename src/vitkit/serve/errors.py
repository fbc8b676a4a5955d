"""The one error a request can end in: an HTTP status and a message that says what to do."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TypeVar

import anyio

T = TypeVar("T")


class RequestError(Exception):
    """A request the server refuses: answered `status` with `{"error": message}` (and
    `headers`, e.g. Retry-After on a 503); the server goes on serving."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


async def within(seconds: float, work: Awaitable[T]) -> T:
    """`work`'s result, or 504 once it has taken `seconds` (`--timeout-s`)."""
    try:
        with anyio.fail_after(seconds):
            return await work
    except TimeoutError:
        raise RequestError(
            504,
            f"the request took over {seconds:g} s; retry later, or start "
            "the server with a larger --timeout-s",
        ) from None
