"""Files that are whole or absent: atomic writes, and a full disk reported as one error.

Every file vitkit writes (checkpoints, training state, metrics, pictures) goes through
`atomic_write`: a temporary file in the same folder, fsynced, then renamed over the target, so a
crash mid-write leaves the previous file intact. Imports nothing from the rest of vitkit.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Marks vitkit's temporary files, so that a clean-up never removes a file of the user's.
_TEMP_MARK = "vitkit-"


class DiskFullError(OSError):
    """A write that ran out of disk space; the file it replaces (if any) is untouched."""

    def __init__(self, path: str | os.PathLike, existed: bool, then: str = "try again"):
        kept = "the previous file is intact" if existed else "nothing was written"
        message = f"no space left on device while writing {path}; free space and {then}; {kept}"
        super().__init__(errno.ENOSPC, message, str(path))
        self.path, self.existed = Path(path), existed

    def __str__(self) -> str:
        return self.strerror


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write a file through `write(file)` so that readers see the old or the new file, whole.

    The data goes to a temporary file beside `path` (`.<name>.vitkit-<random>.tmp`), is
    flushed to disk, then renamed over it. On any failure the temporary file is removed; a full
    disk raises `DiskFullError`. The file gets the permissions `open` would give it (0666 less
    the umask), not the 0600 of a temporary file.
    """
    path = Path(path)
    existed = path.exists()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.{_TEMP_MARK}", suffix=".tmp"
        )
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(path, existed) from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def current_umask() -> int:
    """The process's file-mode creation mask (read without changing it where Linux allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the `.<name>.vitkit-<random>.tmp` files that a write killed before its rename
    left behind (only those: a user's own `.tmp` files stay).

    Only call it when no other process writes into `folder` (e.g. before a run resumes).
    """
    removed = []
    for tmp in sorted(Path(folder).glob(f".*.{_TEMP_MARK}*.tmp")):
        if re.fullmatch(rf"\..+\.{_TEMP_MARK}[a-z0-9_]{{8}}\.tmp", tmp.name) and tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    if removed:
        log.info(
            "removed %d stale temporary file(s) of an interrupted write: %s",
            len(removed),
            ", ".join(p.name for p in removed),
        )
    return removed
