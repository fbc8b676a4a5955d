"""The limits on one request (apart from the rest, so that the command line reads their
defaults without importing the web stack)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one request may hold.

    Args:
        max_upload_bytes: the body's size (413 beyond it).
        max_pixels: width x height of one image, read from its header before decoding (413
            beyond it: decompression bombs and huge images never reach the decoder).
        min_side: the smallest width and height of an image (422 below it: a 1x1 pixel is
            no picture to classify).
        max_files: images in one request (413 beyond it).
        body_timeout_s: the time the client has to send its whole body (408 after it: a slow
            client does not hold a connection and its memory for ever).
        decoders: images decoded at once, over all requests (bounds the decoding memory).
    """

    max_upload_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    min_side: int = 2
    max_files: int = 64
    body_timeout_s: float = 30.0
    decoders: int = 4
