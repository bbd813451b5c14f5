"""Computations on dask's threads, several at once on threads of the caller's (a notebook's
threads, a service's requests), leave dask's config as they found it: the threaded scheduler
and a pool are named in it only while one runs (``pipeline.exec.compute._threads_config``)."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import pytest

from pipeline.exec.compute import compute


def _held(started: threading.Event, go: threading.Event, seen: list):
    """A task that says it has started, waits for ``go``, then computes with dask itself (on the
    pool that dask's config names) and keeps the result in ``seen``."""
    def block(x):
        started.set()
        assert go.wait(30)
        seen.append(float(da.ones(4, chunks=2).sum().compute()))
        return x
    return da.ones((2,), chunks=2).map_blocks(block, dtype=float)


@pytest.mark.parametrize("first_to_end", ["first", "second"])
def test_two_computations_on_two_threads_leave_dasks_config_as_it_was(first_to_end):
    """The second starts while the first runs; either ends first. Before, the first to end
    removed the setting and the last to end put back the other's: the scheduler and a pool shut
    down stayed in dask's config, and every later dask computation failed."""
    before = (dask.config.get("scheduler", None), dask.config.get("pool", None))
    events = [(threading.Event(), threading.Event()) for _ in range(2)]
    seen: list = []
    threads = [threading.Thread(target=compute, args=(_held(s, g, seen),)) for s, g in events]
    threads[0].start()
    assert events[0][0].wait(30)
    threads[1].start()
    assert events[1][0].wait(30)
    order = (0, 1) if first_to_end == "first" else (1, 0)
    for i in order:
        events[i][1].set()
        threads[i].join(30)
        assert not threads[i].is_alive()
    assert seen == [4.0, 4.0]  # each task's own computation, on a pool still running
    assert (dask.config.get("scheduler", None), dask.config.get("pool", None)) == before
    assert float(da.ones(6, chunks=3).sum().compute()) == 6.0
