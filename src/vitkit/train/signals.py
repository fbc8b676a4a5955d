"""Stopping a run cleanly: SIGINT / SIGTERM set a `StopFlag` that the loop reads after each
optimiser step, so the state is saved before the process ends (exit code 130 in the CLI).

DataLoader worker processes leave both signals to the main process (`QuietWorkersLoader`): a
SIGTERM sent to the whole process group (a job scheduler, `kill -- -PGID`) reaches them too, and
a worker that died of it would end the run with a traceback instead of the saved state. The
signals are held (blocked, not lost) while the workers are forked and ignored once a worker
runs, so none arrives in between, where torch's own worker handler would end it. The main
process shuts the workers down when the loop ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopFlag:
    """Set by a signal handler (or a test); the loop stops after the current optimiser step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def set(self, name: str = "stop") -> None:
        self.signal_name = name
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


@contextlib.contextmanager
def stop_on_signals(stop: StopFlag) -> Iterator[None]:
    """SIGINT / SIGTERM set `stop` (a second SIGINT interrupts at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a loader worker forked before `quiet_worker` ran in it
            return
        name = signal.Signals(signum).name
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.warning("%s received: stopping after this step and saving the state", name)
        stop.set(name)

    for sig in STOP_SIGNALS:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """SIGINT / SIGTERM held in this thread meanwhile: a process forked here starts with them
    blocked; a signal sent meanwhile waits, and this process receives it when it is over."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def quiet_worker(worker_id: int) -> None:
    """A DataLoader `worker_init_fn`: the worker ignores SIGINT and SIGTERM (the main process
    decides when the run stops, and ends its workers). Ignoring a held signal discards it;
    then the worker stops holding them."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class QuietWorkersLoader(DataLoader):
    """A DataLoader whose worker processes leave SIGINT and SIGTERM to the main process: the
    signals are held while the workers are forked (`stops_held`), then ignored by each
    worker (`quiet_worker`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers"):
            kwargs["worker_init_fn"] = quiet_worker
        super().__init__(*args, **kwargs)

    def __iter__(self) -> Any:
        with stops_held():
            return super().__iter__()
