"""Several server processes on one port (`--workers N`), as gunicorn and uvicorn run workers: each
worker is a process of its own with its own model, batcher and share of the cores, accepting
connections on the one listening socket the parent opened before forking, so that decoding, the
HTTP stack and the model scale past one Python interpreter (the GIL). One socket, not one per
worker (SO_REUSEPORT): a connection waits in the shared queue until some worker takes it, so
none is refused or reset while a worker loads its model, dies or is replaced. The parent loads
no model; it forks the workers, replaces one that dies, and on SIGTERM or Ctrl-C asks each to
finish its requests in flight, then returns 0.

Processes rather than model replicas in one process: one process's decoding, preparation,
JSON and HTTP parsing hold the GIL, so replicas share one core for all of it, while workers
each have theirs (benchmarks/serve.py measures 1 and 2 workers)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the parent looks at its workers
STOP_S = 40  # what a worker gets to finish after SIGTERM (uvicorn's own grace is 30 s)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int, threads: int = 0) -> int:
    """`threads`, or (0) the usable cores shared out among the workers, at least 1."""
    return threads or max(1, usable_cores() // workers)


@contextmanager
def stop_requests() -> Iterator[list[int]]:
    """The signals (SIGTERM, SIGINT) received meanwhile, noted instead of raised."""
    received: list[int] = []

    def note(signum: int, frame: Any) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_workers(worker: Callable[[int, Any], int], count: int, metrics_dir: str) -> int:
    """Run `worker(index, loaded)` in `count` forked processes until SIGTERM or SIGINT, each
    replaced when it ends; returns 0 after a stop, or a worker's exit code when one ends before
    any has loaded its model (`loaded.set()`: a checkpoint that cannot load fails once, not in a
    loop). The workers' metrics go to `metrics_dir`."""
    # read when prometheus_client is first imported, as it is next (`metrics.MULTIPROC_ENV`)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    import uvicorn  # noqa: F401  (imported once here, not in every worker)

    from . import app  # noqa: F401
    from .metrics import forget_worker

    context = multiprocessing.get_context("fork")
    loaded = context.Event()
    with stop_requests() as stop:
        processes = [_start(context, worker, i, loaded) for i in range(count)]
        while not stop:
            for i, process in enumerate(processes):
                if process.is_alive():
                    continue
                process.join()
                forget_worker(process.pid)
                if not loaded.is_set():  # its error said; a signal's death is a failure
                    _stop(processes)
                    return process.exitcode if (process.exitcode or 0) > 0 else 1
                log.warning(
                    "worker %d (pid %s) ended with exit code %s; starting another",
                    i,
                    process.pid,
                    process.exitcode,
                )
                processes[i] = _start(context, worker, i, loaded)
            time.sleep(POLL_S)
        log.info("stopping %d workers: answering the requests in flight", count)
        _stop(processes)
    return 0


def _start(context: Any, worker: Callable[[int, Any], int], index: int, loaded: Any) -> Any:
    process = context.Process(
        target=_worker_main,
        args=(worker, index, loaded, os.getpid()),
        name=f"vitkit-worker-{index}",
        daemon=False,
    )
    process.start()
    return process


def _worker_main(worker: Callable[[int, Any], int], index: int, loaded: Any, parent: int) -> None:
    """A worker's process: SIGTERM and SIGINT end it quietly (uvicorn handles them while it
    serves), and so does its parent's end; exits with what `worker` returns."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    raise SystemExit(worker(index, loaded))


def _end_with(parent: int) -> None:
    """SIGTERM to this worker once `parent` is gone (killed with SIGKILL, say): no worker
    outlives the server, holding its port (gunicorn's workers watch their parent too)."""
    while os.getppid() == parent:
        time.sleep(POLL_S * 5)
    os.kill(os.getpid(), signal.SIGTERM)


def _stop(processes: list[Any]) -> None:
    """SIGTERM to every worker, then wait (SIGKILL past `STOP_S`)."""
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.warning("worker pid %s did not stop in %d s; killed", process.pid, STOP_S)
            process.kill()
            process.join()
