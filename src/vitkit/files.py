"""Files that are whole or absent: atomic writes, and a full disk reported as one error.

Every file vitkit writes (checkpoints, training state, metrics, pictures) goes through
`atomic_write`: a temporary file in the same folder, fsynced, then renamed over the target, so a
crash mid-write leaves the previous file intact. Only a regular file (or a new path) is ever
replaced: a character device such as /dev/null is written through, and a FIFO, socket, block
device or folder is refused, so that no command, even run as root, replaces a special file.
Imports nothing from the rest of vitkit.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
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

    A regular file or a new path: the data goes to a temporary file beside it
    (`.<name>.vitkit-<random>.tmp`, the name shortened to fit the file system's limit), is
    flushed to disk, then renamed over it; the file gets the permissions `open` would give it
    (0666 less the umask), not a temporary file's 0600. A symbolic link is followed: the link
    stays and its target is written by these rules. A character device (/dev/null) is opened
    and written, never replaced; any other kind of file (FIFO, socket, block device, folder)
    is refused with `SpecialFileError`. On any failure the temporary file is removed; a full
    disk raises `DiskFullError`.
    """
    path = Path(path)
    kind = check_output(path)
    if kind == _CHAR_DEVICE:
        _write_through(path, write, mode)
        return
    target = Path(os.path.realpath(path))  # the link's target; the link itself stays
    existed = kind == _REGULAR
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target), suffix=".tmp")
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check_output(target) == _CHAR_DEVICE:  # it became one while we wrote (the others
            raise SpecialFileError(target, "a character device")  # raise in _file_kind)
        os.replace(tmp, target)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(path, existed) from None
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class SpecialFileError(OSError):
    """A path vitkit would write or remove that names something other than a regular file (a
    FIFO, socket, device, folder or, for removal, a symbolic link): vitkit neither replaces,
    removes nor writes into it."""

    def __init__(
        self, path: str | os.PathLike, what: str, *, removing: bool = False, role: str = ""
    ):
        if removing:
            message = (
                f"{path} is {what}, not {role or 'a file vitkit writes'}; vitkit never removes "
                "or replaces it: move it away or choose another folder"
            )
        else:
            message = (
                f"cannot write {path}: it is {what}, not a regular file; name a new or regular "
                "file instead"
            )
        super().__init__(errno.EEXIST, message, str(path))
        self.path, self.what = Path(path), what

    def __str__(self) -> str:
        return self.strerror


_REGULAR, _CHAR_DEVICE = "regular", "character device"
_KINDS = (  # (test of an lstat / stat mode, description)
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a `stat` / `lstat` mode names, as a phrase ('a regular file', 'a FIFO (named
    pipe)', ...)."""
    return next((name for test, name in _KINDS if test(mode)), f"a file of mode {mode:o}")


def require_regular(path: str | os.PathLike, role: str = "") -> bool:
    """Whether `path` holds a file vitkit may remove or replace in place: True for a regular
    file, False for nothing there; anything else (a link included, which is not followed)
    raises `SpecialFileError` naming `role` (what vitkit expected there)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise SpecialFileError(path, file_kind(mode), removing=True, role=role)
    return True


def check_output(path: str | os.PathLike) -> str | None:
    """What an output path names, symbolic links followed: None (nothing yet, or a dangling
    link), 'regular' or 'character device' (both writable by `atomic_write`); anything else
    raises `SpecialFileError`. Call it before long work whose result goes to `path`."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise SpecialFileError(path, "a loop of symbolic links") from None
        raise
    if stat.S_ISREG(mode):
        return _REGULAR
    if stat.S_ISCHR(mode):
        return _CHAR_DEVICE
    raise SpecialFileError(path, file_kind(mode))


def _write_through(path: Path, write: Callable[[Any], None], mode: str) -> None:
    """Write into a character device (/dev/null, a terminal) as `open` would, without
    truncating or replacing it."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, mode) as f:
        write(f)
        f.flush()


def _temp_prefix(target: Path) -> str:
    """`.<name>.vitkit-`, the name cut so that the whole temporary name (8 random characters
    and `.tmp` follow) stays within the folder's NAME_MAX bytes."""
    try:
        limit = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    room = limit - len(f"..{_TEMP_MARK}") - 8 - len(".tmp")
    name = target.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}.{_TEMP_MARK}"


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
