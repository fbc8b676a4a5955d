"""The limits on one request (apart from the rest, so that the command line reads them without
importing the web stack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..options import AT_LEAST_ONE, POSITIVE, Options, Range, option

MB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits(Options):
    """What one request may hold (each value checked when built, as every `Options`).

    Args:
        max_upload_mb: the body's size in MiB (413 beyond it; `max_upload_bytes`).
        max_pixels: width x height of one image, read from its header before decoding (413
            beyond it: decompression bombs and huge images never reach the decoder).
        min_side: the smallest width and height of an image (422 below it: a 1x1 pixel is
            no picture to classify).
        max_files: images in one request (413 beyond it).
        body_timeout_s: the time the client has to send its whole body (408 after it: a slow
            client does not hold a connection and its memory for ever).
        decoders: images decoded at once, over all requests (bounds the decoding memory).
        timeout_s: the time a request may take from its arrival to its answer (504 after it:
            a client is not kept waiting behind a queue that does not move).
    """

    GROUPS: ClassVar[dict[str, str]] = {"limits": "limits on each request"}
    FLAGLESS: ClassVar[tuple[str, ...]] = ("min_side", "max_files", "body_timeout_s", "decoders")

    max_upload_mb: float = option(20.0, "the largest request body, in MiB",
                                  range=Range(0.001), metavar="MB", group="limits")  # fmt: skip
    max_pixels: int = option(40_000_000, "the most pixels (width x height) of an image, read "
                             "from its header before decoding", range=AT_LEAST_ONE,
                             metavar="N", group="limits")  # fmt: skip
    min_side: int = option(2, "the smallest width and height of an image", range=AT_LEAST_ONE)
    max_files: int = option(64, "images in one request", range=AT_LEAST_ONE)
    body_timeout_s: float = option(30.0, "seconds to send the whole body", range=POSITIVE)
    decoders: int = option(4, "images decoded at once, over all requests", range=AT_LEAST_ONE)
    timeout_s: float = option(60.0, "seconds a request may take from its arrival to its "
                              "answer; beyond, 504", range=POSITIVE, metavar="S",
                              group="limits")  # fmt: skip

    @property
    def max_upload_bytes(self) -> int:
        """The largest request body in bytes."""
        return round(self.max_upload_mb * MB)
