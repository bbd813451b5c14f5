"""Pinned host memory: the buffers that chunk files are read into and that held blocks wait in,
and chunk files pinned where they lie in the page cache (:func:`pin_file`).

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
import functools
import mmap
import os
import sys
import time

import numpy as np

from .. import state
from .iopool import io_pool

TOUCH = 16 << 20  # pieces in which new buffers are faulted in
GRAIN = 2 << 20  # sizes are rounded up to this (a huge page)



class Buffer:
    """``nbytes`` of host memory pinned by ``cudaHostRegister`` over an anonymous mapping of its own;
    ``bytes`` is a NumPy view of it."""

    def __init__(self, nbytes: int, inline: bool = False):
        import ctypes

        import cupy as cp

        self.nbytes = nbytes
        self.closed = False
        self.map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(AttributeError, OSError):
            self.map.madvise(mmap.MADV_HUGEPAGE)  # fewer pages to fault in and pin
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.ptr = self.bytes.ctypes.data
        # the pages are faulted in (zeroed by the kernel) by the I/O threads in pieces, in parallel
        # (ctypes calls release the GIL), rather than by one thread inside cudaHostRegister; by
        # this thread where it is one of them (``inline``: waiting on the pool could wait for ever)
        if inline:
            ctypes.memset(self.ptr, 0, nbytes)
        else:
            pool = io_pool()
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
        # would fail to register (cudaErrorAlreadyMapped). A plain try, not contextlib: at the
        # interpreter's exit this module's globals may be gone before the buffers held in
        # pipeline.state are dropped
        try:
            self.close()
        except Exception:
            pass


def _fits(buf: Buffer, nbytes: int) -> bool:
    return nbytes <= buf.nbytes <= 2 * max(nbytes, GRAIN)


def take(nbytes: int, inline: bool = False) -> Buffer:
    """A pinned buffer of at least ``nbytes``: a free one that holds it without wasting more than
    its size, else a new one (whose pages this thread faults in itself where ``inline``: an I/O
    thread). Hand it back with :func:`give` once nothing reads or writes it."""
    with state.pinned.lock:
        fits = [b for b in state.pinned.buffers if _fits(b, nbytes)]
        if fits:
            buf = min(fits, key=lambda b: b.nbytes)
            state.pinned.buffers.remove(buf)
            return buf
    return Buffer(-(-max(nbytes, 1) // GRAIN) * GRAIN, inline)


def free_for(nbytes: int) -> int:
    """How many free buffers :func:`take` would lend for a request of ``nbytes``."""
    with state.pinned.lock:
        return sum(_fits(b, nbytes) for b in state.pinned.buffers)


def give(buf: Buffer) -> None:
    """``buf`` back for reuse."""
    with state.pinned.lock:
        state.pinned.buffers.append(buf)


def release() -> int:
    """Unpin and unmap the free buffers kept for reuse, and the pinned chunk files
    (:func:`release_files`); returns their bytes."""
    with state.pinned.lock:
        bufs = list(state.pinned.buffers)
        state.pinned.buffers.clear()
    for b in bufs:
        b.close()
    return sum(b.nbytes for b in bufs) + release_files()


# --- chunk files pinned in the page cache ------------------------------------------------------------
#
# Reading a file into a pinned buffer copies it from the page cache: host memory is read and written
# once more before the device reads it. Measured on the 4-GPU H200 machine (benchmarks/host_read.py,
# 13.7 GB of compressed shards, processes at once), that copy bounds the host: 44 GB/s in one process,
# 79 GB/s in four, as plain memory copies (46 and 79 GB/s); the same files mapped, pinned where they
# lie (cudaHostRegister, read-only) and copied to the device from there moved 55 GB/s in one process,
# 105 in two and 168 in four. Pinning costs about as much as one read (49 GB/s), so a pinned file is
# kept for the next read of it: the second and later runs over a store skip the host copy.
#
# A file stays pinned until it changes (its inode, size or modification time, checked at every
# read), or until release(). At most ``pipeline.gpu.pinned-files`` bytes are pinned (bytes, or a
# fraction of the host memory: of the worker's memory limit in a distributed worker, whose memory
# monitor counts the mapped pages). Once full, the files least recently read are unpinned if no read
# has used them for IDLE seconds or their file changed or went away (a store deleted or rewritten
# under a long-lived worker); otherwise further files are read into buffers as before, which keeps
# the files pinned first, rather than replacing them all in each scan over a larger store.

REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the device only reads the mapping
IDLE = 60.0  # seconds after its last read that a pinned file may make room for another

# When a file is pinned (``pipeline.gpu.pin-files``). Pinning costs about one read and is undone at
# the process's exit, so it pays only where the process reads the file again: "first-read" pins a
# file the first time it is read (a notebook, a warm benchmark or a worker reads the same store
# again), "reread" only when it is read a second time (a one-shot run reads a file again only when
# its plan makes several passes over the input). "auto", the default, is "reread" in `pipeline run`
# (the command sets it) and "first-read" in any other process.
POLICIES = ("auto", "first-read", "reread")
_read_once: set[tuple] = set()  # the files read once so far, under "reread" (under state.pinned.lock)


def _register(ptr: int, nbytes: int) -> None:
    import cupy as cp

    cp.cuda.runtime.hostRegister(ptr, nbytes, REGISTER_READ_ONLY)


def _unregister(ptr: int) -> None:
    import cupy as cp

    cp.cuda.runtime.hostUnregister(ptr)


class PinnedFile:
    """One whole file, mapped read-only and pinned; ``bytes`` is a NumPy view of it. Lent by
    :func:`pin_file` and handed back by :func:`unpin_file` once nothing reads it."""

    def __init__(self, path: str, key: tuple, nbytes: int):
        self.path, self.key, self.nbytes = path, key, nbytes
        self.users = 0
        self.last_used = time.monotonic()
        self.cached = True  # False once replaced (its file changed) or released: closed when unused
        self.closed = False
        fd = os.open(path, os.O_RDONLY)
        try:
            self.map = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                 prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.ptr = self.bytes.ctypes.data
        try:
            _register(self.ptr, nbytes)
        except BaseException:
            del self.bytes
            self.map.close()
            raise

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _unregister(self.ptr)
        del self.bytes
        with contextlib.suppress(BufferError):  # a view still exported: the mapping goes with it
            self.map.close()

    def __del__(self):
        try:  # as Buffer's: no range may stay registered unmapped
            self.close()
        except Exception:
            pass


def file_key(st: os.stat_result) -> tuple:
    """What identifies a file's contents: a file rewritten or replaced gets another key."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def pinned_files_limit() -> int:
    """Bytes of chunk files that may stay pinned in this process (``pipeline.gpu.pinned-files``)."""
    from .. import config
    from ..backend import _bytes_or_fraction

    total = _host_memory()
    if "distributed" in sys.modules:  # on a worker (never imported here: a second's import on a first run)
        with contextlib.suppress(ImportError, ValueError):
            from distributed import get_worker

            limit = getattr(getattr(get_worker(), "memory_manager", None), "memory_limit", None)
            if limit:
                total = int(limit)
    return _bytes_or_fraction(config.get("gpu.pinned-files", 0), total)


@functools.cache
def _host_memory() -> int:
    """The host's memory (read once: it is asked at every pin)."""
    import psutil

    return psutil.virtual_memory().total


def lookup(path: str, st: os.stat_result) -> PinnedFile | None:
    """The file at ``path`` (whose ``os.stat`` is ``st``) if it is pinned with these contents, lent
    until :func:`unpin_file`; None if not (a pinned copy of other contents is dropped)."""
    key = file_key(st)
    with state.pinned.lock:
        f = state.pinned.files.get(path)
        if f is not None and f.key == key:
            f.users += 1
            f.last_used = time.monotonic()
            state.pinned.files.move_to_end(path)
            return f
        stale = _drop(path) if f is not None else None  # the file changed: its pages are not what it holds
    if stale is not None:
        stale.close()
    return None


def pin_policy() -> str:
    """``pipeline.gpu.pin-files``: when a file read is pinned (see :data:`POLICIES`)."""
    from .. import config
    from ..errors import InputError

    policy = config.get("gpu.pin-files", "auto")
    if policy not in POLICIES:
        raise InputError(f"pipeline.gpu.pin-files: expected one of {', '.join(POLICIES)}, got {policy!r}")
    return "first-read" if policy == "auto" else policy


def read_before(path: str, st: os.stat_result) -> bool:
    """Whether the policy lets this read pin the file: always under "first-read"; under "reread"
    from its second read in this process on (each read is counted here)."""
    if pin_policy() == "first-read":
        return True
    with state.pinned.lock:
        return _read_again(path, st)


def _read_again(path: str, st: os.stat_result) -> bool:
    """Under the lock: whether this file, with these contents, was read before in this process
    (this read is counted)."""
    seen = (path, file_key(st))
    if seen in _read_once:
        return True
    _read_once.add(seen)
    return False


def pin_min_file() -> int:
    """``pipeline.gpu.pin-min-file``: the bytes below which a file is never pinned."""
    from dask.utils import parse_bytes

    from .. import config
    from ..errors import InputError

    value = config.get("gpu.pin-min-file", 0)
    try:
        nbytes = int(parse_bytes(value)) if isinstance(value, str) else int(value or 0)
    except (TypeError, ValueError):
        nbytes = -1
    if nbytes < 0:
        raise InputError(f"pipeline.gpu.pin-min-file: expected bytes such as 2MiB or 0, got {value!r}")
    return nbytes


def may_pin(nbytes: int) -> bool:
    """Whether a file of ``nbytes`` would be pinned now (large enough, room under the limit, no
    failure)."""
    floor = pin_min_file()
    unused: list[PinnedFile] = []
    limit = pinned_files_limit()  # reads settings and the host's memory: not under the lock
    with state.pinned.lock:
        room = _admits(nbytes, floor, limit, unused)
    for f in unused:
        f.close()
    return room


def _admits(nbytes: int, floor: int, limit: int, unused: list[PinnedFile]) -> bool:
    """Under the lock: whether a file of ``nbytes`` is at least ``floor`` and has room (:func:`_room`)."""
    return nbytes >= floor and _room(nbytes, limit, unused)


def will_pin(path: str, st: os.stat_result) -> bool:
    """Whether a read of this file (not pinned yet) would pin it now: large enough, room under the
    limit, and the policy lets this read pin it (under "reread", this read is counted).
    :func:`pin_file` can still return None where the room went to other files meanwhile."""
    return will_pin_files([path], [st])[0]


def will_pin_files(paths: list[str], stats: list) -> list[bool]:
    """:func:`will_pin` of each of a block's files, the settings read once: read for each file,
    they took 16 us a file under the GIL, and all the blocks of a run start together (4,380 files
    of 18.2 GB of Zarr v2 Blosc) before any of their reads."""
    if not paths:
        return []
    floor, limit, first_read = pin_min_file(), pinned_files_limit(), pin_policy() == "first-read"
    out, unused = [], []
    with state.pinned.lock:
        for path, st in zip(paths, stats):
            out.append(_admits(st.st_size, floor, limit, unused) and (first_read or _read_again(path, st)))
    for f in unused:
        f.close()
    return out


def _room(nbytes: int, limit: int, unused: list[PinnedFile]) -> bool:
    """Under the lock: whether ``nbytes`` more fit the limit, after unpinning the least recently
    read files that are idle or changed (appended to ``unused``, to close outside the lock)."""
    if state.pinned.failure or not 0 < nbytes <= limit:
        return False
    now = time.monotonic()
    while state.pinned.files_bytes + nbytes > limit and state.pinned.files:
        path, f = next(iter(state.pinned.files.items()))
        if f.users or (now - f.last_used < IDLE and not _changed(f)):
            return False
        unused.append(_drop(path))
    return state.pinned.files_bytes + nbytes <= limit


def _changed(f: PinnedFile) -> bool:
    try:
        return file_key(os.stat(f.path)) != f.key
    except OSError:
        return True


def pin_file(path: str, st: os.stat_result) -> PinnedFile | None:
    """The file at ``path`` (whose ``os.stat`` is ``st``), pinned, or None where it is not: the
    limit is reached, the file is empty, or pinning a mapping failed here once (then it is never
    tried again in this process, and the reason is kept in :func:`pin_failure`), or the policy waits
    for a second read (:func:`read_before`). Lent until
    :func:`unpin_file`."""
    f = lookup(path, st)
    if f is not None:
        return f
    if not read_before(path, st):
        return None
    unused: list[PinnedFile] = []
    limit = pinned_files_limit()
    with state.pinned.lock:
        room = _room(st.st_size, limit, unused)
        if room:
            state.pinned.files_bytes += st.st_size  # reserved before pinning, which runs outside the lock
    for old in unused:
        old.close()
    if not room:
        return None
    key = file_key(st)
    try:
        f = PinnedFile(path, key, st.st_size)
    except Exception as e:  # e.g. a driver that refuses read-only registration of file pages
        try:
            changed = file_key(os.stat(path)) != key
        except OSError:
            changed = True
        with state.pinned.lock:
            state.pinned.files_bytes -= st.st_size
            if not changed and not state.pinned.failure:  # a file that changed meanwhile is no reason to stop
                state.pinned.failure = f"{type(e).__name__}: {e}"
        return None
    with state.pinned.lock:
        other = state.pinned.files.get(path)
        if other is not None and other.key == key:  # another thread pinned it meanwhile: use that one
            state.pinned.files_bytes -= st.st_size
            other.users += 1
            spare, f = f, other
        else:
            spare = _drop(path) if other is not None else None  # changed again meanwhile
            f.users = 1
            state.pinned.files[path] = f
    if spare is not None:
        spare.close()
    return f


def _drop(path: str) -> PinnedFile | None:
    """Take ``path``'s file out of the cache (under the lock); the file to close now, if unused."""
    f = state.pinned.files.pop(path)
    state.pinned.files_bytes -= f.nbytes
    f.cached = False
    return f if f.users == 0 else None


def unpin_file(f: PinnedFile) -> None:
    """``f`` back from :func:`pin_file`: nothing reads its pages any more."""
    with state.pinned.lock:
        f.users -= 1
        f.last_used = time.monotonic()
        close = f.users == 0 and not f.cached
    if close:
        f.close()


def pinned_files_bytes() -> int:
    """Bytes of chunk files pinned now."""
    with state.pinned.lock:
        return state.pinned.files_bytes


def pin_failure() -> str | None:
    """Why pinning files failed in this process, if it did (then every file is read into buffers)."""
    return state.pinned.failure


def release_files() -> int:
    """Unpin every pinned file (those in use once given back); returns their bytes."""
    with state.pinned.lock:
        total = state.pinned.files_bytes
        unused = [_drop(p) for p in list(state.pinned.files)]
    for f in unused:
        if f is not None:
            f.close()
    return total
