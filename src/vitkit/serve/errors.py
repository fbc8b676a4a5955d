"""The one error a request can end in: an HTTP status and a message that says what to do."""

from __future__ import annotations

from collections.abc import Mapping


class RequestError(Exception):
    """A request the server refuses: answered `status` with `{"error": message}` (and
    `headers`, e.g. Retry-After on a 503); the server goes on serving."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
