"""The exit codes of `vitkit` (pip's `status_codes`): what a script or CI job reads."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """0: done; 1: the run failed (diverged, out of memory, a full disk, a parity mismatch);
    2: a mistake in the command or its inputs; 3: done, but some inputs were skipped (`eval`
    and `predict` name the unreadable images on stderr); 130: interrupted (Ctrl-C, SIGTERM),
    as a shell reports SIGINT."""

    OK = 0
    FAILED = 1
    USAGE = 2
    PARTIAL = 3
    INTERRUPTED = 130
