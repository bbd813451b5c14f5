"""Pinned host memory: the buffers that chunk files are read into and that held blocks wait in.

Not CuPy's pinned pool. Measured on the H200 machine (benchmarks/RESULTS.md), pinning fresh memory
took 1.5 GB/s through ``cupyx.empty_pinned`` and 3.1 GB/s through ``cudaHostAlloc``; the kernel
faults in an anonymous mapping at about 8 GB/s a thread, and ``cudaHostRegister`` pins memory
already faulted in at 40-50 GB/s. Copies between the device and either kind reach 55 GB/s. CuPy's
pool also reuses a freed buffer only for a request of exactly its size, so blocks whose compressed
sizes all differ pinned new memory for every one of them in a process's first run (4.6 GB at
1.5 GB/s: three seconds before a 0.3 s read).

Here a buffer is an anonymous mapping, faulted in by the I/O threads in parallel, then registered;
a request takes the smallest free buffer that holds it (up to twice its size), so a few buffers
serve every block of a run. Free buffers are kept for the next request until :func:`release`.
"""

from __future__ import annotations

import contextlib
import mmap
import threading

import numpy as np

TOUCH = 16 << 20  # pieces in which new buffers are faulted in
GRAIN = 2 << 20  # sizes are rounded up to this (a huge page)

_lock = threading.Lock()
_free: list[Buffer] = []


class Buffer:
    """``nbytes`` of host memory pinned by ``cudaHostRegister`` over an anonymous mapping of its own;
    ``bytes`` is a NumPy view of it."""

    def __init__(self, nbytes: int):
        import ctypes

        import cupy as cp

        from .gpu_zarr import _pool

        self.nbytes = nbytes
        self.closed = False
        self.map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(AttributeError, OSError):
            self.map.madvise(mmap.MADV_HUGEPAGE)  # fewer pages to fault in and pin
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.ptr = self.bytes.ctypes.data
        # the pages are faulted in (zeroed by the kernel) by the I/O threads in pieces, in parallel
        # (ctypes calls release the GIL), rather than by one thread inside cudaHostRegister
        pool = _pool()
        ticket = pool.ticket()
        jobs = [pool.submit(ctypes.memset, self.ptr + at, 0, min(TOUCH, nbytes - at), ticket=ticket)
                for at in range(0, nbytes, TOUCH)]
        for job in jobs:
            job.result()
        cp.cuda.runtime.hostRegister(self.ptr, nbytes, 0)

    def close(self) -> None:
        if self.closed:
            return
        import cupy as cp

        self.closed = True
        cp.cuda.runtime.hostUnregister(self.ptr)
        del self.bytes
        with contextlib.suppress(BufferError):  # an array still exports it: the mapping goes with it
            self.map.close()

    def __del__(self):
        # a buffer dropped without close() (a read that failed before giving it back) must not
        # leave its range registered once the mapping goes: a later mapping at the same address
        # would fail to register (cudaErrorAlreadyMapped)
        with contextlib.suppress(Exception):
            self.close()


def take(nbytes: int) -> Buffer:
    """A pinned buffer of at least ``nbytes``: a free one that holds it without wasting more than
    its size, else a new one. Hand it back with :func:`give` once nothing reads or writes it."""
    with _lock:
        fits = [b for b in _free if nbytes <= b.nbytes <= 2 * max(nbytes, GRAIN)]
        if fits:
            buf = min(fits, key=lambda b: b.nbytes)
            _free.remove(buf)
            return buf
    return Buffer(-(-max(nbytes, 1) // GRAIN) * GRAIN)


def give(buf: Buffer) -> None:
    """``buf`` back for reuse."""
    with _lock:
        _free.append(buf)


def release() -> int:
    """Unpin and unmap the free buffers kept for reuse; returns their bytes."""
    with _lock:
        bufs = list(_free)
        _free.clear()
    for b in bufs:
        b.close()
    return sum(b.nbytes for b in bufs)
