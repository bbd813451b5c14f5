"""The I/O threads that read chunk files, serving the earliest read first."""

from __future__ import annotations

import itertools
import os
import queue
import threading
from concurrent.futures import Future

from .. import config, state


def _io_threads() -> int:
    n = config.get("gpu.io-threads", None)
    return int(n) if n else min(16, os.cpu_count() or 1)


class IOPool:
    """The I/O threads, running jobs in the order of the reads they belong to rather than in the
    order they arrive.

    Several Dask tasks read blocks at once. A FIFO pool (``ThreadPoolExecutor``) interleaves their
    pieces, so every read finishes at about the same time and the copies and decodes that follow
    all start together, with nothing left to read while they run. Here the read that asked first
    gets every thread until it is done: its bytes go to the device and decode while the next read
    proceeds."""

    def __init__(self, threads: int):
        self.threads = threads
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._tickets = itertools.count()
        self._seq = itertools.count()
        for i in range(threads):
            threading.Thread(target=self._work, name=f"pipeline-io-{i}", daemon=True).start()

    def ticket(self) -> int:
        """A place in the order: jobs submitted with it run after those of earlier tickets."""
        return next(self._tickets)

    def submit(self, fn, *args, ticket: int | None = None) -> Future:
        future: Future = Future()
        self._queue.put((self.ticket() if ticket is None else ticket, next(self._seq), future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            _, _, future, fn, args = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                future.set_exception(e)


def io_pool() -> IOPool:
    """The process's I/O pool (``pipeline.gpu.io-threads`` threads), started on first use."""
    with state.io.lock:
        if state.io.pool is None:
            state.io.pool = IOPool(_io_threads())
        return state.io.pool
