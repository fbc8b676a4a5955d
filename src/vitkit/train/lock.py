"""One writer per run folder: an OS lock that a second run, or a `--resume` of a live one, meets.

The lock is `fcntl.flock` on `.vitkit.lock` in the folder, which holds the owner's PID, host and
start time for the message; anything but a regular file with its name is refused, never opened
for writing. The run removes the file when it ends; the operating system releases the lock when
the process ends, however it ends (kill -9 included), so a killed run's folder, its lock file
left behind, is taken over by the next run without any clean-up. A forked child (a DataLoader
worker, which outlives a killed run by seconds) closes its copy of the descriptor, so that the
lock dies with the run itself. Reading commands (eval, predict, explain) take no lock: every
file a run writes appears whole (`files.atomic_write`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from ..files import SpecialFileError, file_kind

LOCK_FILE = ".vitkit.lock"

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


class RunLockedError(ValueError):
    """The run folder is being written by another live process."""


_held: set[int] = set()  # this process's lock descriptors; a forked child closes its copies
_fork_hook_registered = False


def _close_in_child() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)  # the parent's lock stays: its own descriptor still holds it
    _held.clear()


def _close_held_locks_on_fork() -> None:
    global _fork_hook_registered
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_registered = True


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold the folder's run lock for the block; `RunLockedError` naming the live process when
    another one holds it. The folder must exist. The lock file is removed when the block ends
    (a run killed with SIGKILL leaves it, and the next run takes it over)."""
    path = Path(folder) / LOCK_FILE
    fd = _locked_file(path)
    try:
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        _close_held_locks_on_fork()
        _held.add(fd)
        yield path
    finally:
        _held.discard(fd)
        if _names_this_file(path, fd):  # still ours: remove it while the lock is held
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)  # releases the lock


def _locked_file(path: Path) -> int:
    """The lock file, opened and locked. A finishing run removes its file while it holds the
    lock, so a file locked after its name was removed is tried again by name."""
    while True:
        fd = _open_lock_file(path)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                owner = _read_owner(fd)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise
                raise RunLockedError(_held_message(path.parent, owner)) from None
        if _names_this_file(path, fd):
            return fd
        os.close(fd)


def _names_this_file(path: Path, fd: int) -> bool:
    """Whether `path` is still the regular file open as `fd`."""
    try:
        named = os.lstat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return stat.S_ISREG(named.st_mode) and (named.st_dev, named.st_ino) == (
        held.st_dev,
        held.st_ino,
    )


def _open_lock_file(path: Path) -> int:
    """The lock file, opened for reading and writing (created if absent); anything but a
    regular file there (a FIFO, device, folder, link) is refused before it is touched."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise SpecialFileError(path, file_kind(mode), removing=True, role="vitkit's run lock")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags, 0o666)
    found = os.fstat(fd).st_mode
    if not stat.S_ISREG(found):  # swapped in since the check
        os.close(fd)
        raise SpecialFileError(path, file_kind(found), removing=True, role="vitkit's run lock")
    return fd


def _read_owner(fd: int) -> dict:
    try:
        owner = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _held_message(folder: Path, owner: dict) -> str:
    pid = owner.get("pid", "?")
    where = f" on {owner['host']}" if owner.get("host") else ""
    since = f", started {owner['started']}" if owner.get("started") else ""
    return (
        f"{folder} is in use by a live vitkit run (process {pid}{where}{since}); wait for it "
        f"to finish, or stop it (kill {pid}) and continue with --resume, or choose another --out"
    )
