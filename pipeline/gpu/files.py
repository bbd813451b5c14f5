"""Many small chunk files read by one call that holds no GIL.

A store of one time step a chunk (Zarr v2 Blosc, as ERA5-style archives hold it) is thousands of
files of a few MB. Read through Python's ``os.open``, ``os.preadv`` and ``os.close``, each file
releases the GIL three times and takes it back three times, and the I/O threads then wait for it
in turn behind each other and behind the task threads: on the 2-GPU H200 machine, one worker's 16
I/O threads spent 26 s in ``preadv``, 5.7 s in ``open`` and 3.9 s in ``close`` reading 12,410
files (31 GB) at 7 GB/s. There (benchmarks/small_files.py, 4,000 of those files in groups of
16 MB), 16 threads read 42-46 GB/s either way while nothing else ran; beside two threads running
Python, a call a file read 1.3 GB/s, and a group a call through the same loop (compiled by Numba
then) 18.5 GB/s. In the user's command on that store, one GPU's run took 3.9 s against 4.7 s
(medians of three, fresh processes; benchmarks/RESULTS.md, "Small chunk files").

The loop over a group of files is a few lines of LLVM IR over libc's ``open``, ``pread`` and
``close``, compiled once a process by llvmlite (Numba's own compiler back end, installed with it)
and called through ctypes, which releases the GIL for the whole call. Not a Numba function: a
fresh process took 0.4 s to import Numba and 0.75 s more to build the function from Numba's
cache, on the read path's first block; llvmlite imports and compiles this in 0.03 s. Where
llvmlite is missing or fails, the files are read by Python's calls, one at a time.

A block's files are looked up the same way (:func:`stat_files`): one call that ``statx``-es them
all, rather than an ``os.stat`` a file, each of which waits for the GIL on its way back. In the
user's command on 18.2 GB of Zarr v2 Blosc (4,380 files) on one H200, those ``os.stat`` calls took
1.1 s of the task threads' time, 260 us each, before each block's first read could start
(benchmarks/RESULTS.md, "A block's files looked up and staged").
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import NamedTuple

import numpy as np

log = logging.getLogger(__name__)

# read_files(n, names, dests, sizes, got, flags): for each k < n, open the NUL-terminated path
# names[k] with ``flags`` (read-only, closed on exec, as Python's os.open) and pread sizes[k] bytes
# from its start into dests[k], in as many calls as it takes; got[k] is the bytes read (fewer at
# the end of a file that is too short) or -1 where open failed. A call that fails is tried again,
# up to 8 times in a row: on a network file system a signal can interrupt it (EINTR), which
# Python's own calls retry (PEP 475); a lasting error fails each time and ends as a short read.
LOOP_IR = r"""
declare i32 @open(ptr, i32, ...)
declare i64 @pread(i32, ptr, i64, i64)
declare i32 @close(i32)

define void @read_files(i64 %n, ptr %names, ptr %dests, ptr %sizes, ptr %got, i32 %flags) {
entry:
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %next]
  %more = icmp slt i64 %k, %n
  br i1 %more, label %body, label %done
body:
  %np = getelementptr ptr, ptr %names, i64 %k
  %name = load ptr, ptr %np
  %gp = getelementptr i64, ptr %got, i64 %k
  br label %open
open:
  %opens = phi i32 [0, %body], [%opens1, %reopen]
  %fd = call i32 (ptr, i32, ...) @open(ptr %name, i32 %flags)
  %bad = icmp slt i32 %fd, 0
  br i1 %bad, label %reopen, label %opened
reopen:
  %opens1 = add i32 %opens, 1
  %again = icmp slt i32 %opens1, TRIES
  br i1 %again, label %open, label %fail
fail:
  store i64 -1, ptr %gp
  br label %next
opened:
  %dp = getelementptr ptr, ptr %dests, i64 %k
  %dest = load ptr, ptr %dp
  %sp = getelementptr i64, ptr %sizes, i64 %k
  %size = load i64, ptr %sp
  br label %read
read:
  %have = phi i64 [0, %opened], [%have1, %advance], [%have, %retry]
  %tries = phi i32 [0, %opened], [0, %advance], [%tries1, %retry]
  %want = icmp slt i64 %have, %size
  br i1 %want, label %call, label %closed
call:
  %at = getelementptr i8, ptr %dest, i64 %have
  %left = sub i64 %size, %have
  %r = call i64 @pread(i32 %fd, ptr %at, i64 %left, i64 %have)
  %ok = icmp sgt i64 %r, 0
  br i1 %ok, label %advance, label %failed
advance:
  %have1 = add i64 %have, %r
  br label %read
failed:
  %error = icmp slt i64 %r, 0
  %tries1 = add i32 %tries, 1
  %retries = icmp slt i32 %tries1, TRIES
  %retry_it = and i1 %error, %retries
  br i1 %retry_it, label %retry, label %closed
retry:
  br label %read
closed:
  store i64 %have, ptr %gp
  %c = call i32 @close(i32 %fd)
  br label %next
next:
  %k1 = add i64 %k, 1
  br label %loop
done:
  ret void
}

; stat_files(n, names, out, rc, statx): for each k < n, rc[k] = statx(AT_FDCWD, names[k], 0,
; STATX_BASIC_STATS, out + 256 k): the file's struct statx (256 bytes), or -1. libc's statx is
; passed in by address, not linked by name: a libc without it (glibc before 2.28) leaves this
; function uncalled rather than the module unbuilt.
define void @stat_files(i64 %n, ptr %names, ptr %out, ptr %rc, ptr %statx) {
entry:
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %body]
  %more = icmp slt i64 %k, %n
  br i1 %more, label %body, label %done
body:
  %np = getelementptr ptr, ptr %names, i64 %k
  %name = load ptr, ptr %np
  %at = mul i64 %k, 256
  %buf = getelementptr i8, ptr %out, i64 %at
  %r = call i32 %statx(i32 -100, ptr %name, i32 0, i32 2047, ptr %buf)
  %rp = getelementptr i32, ptr %rc, i64 %k
  store i32 %r, ptr %rp
  %k1 = add i64 %k, 1
  br label %loop
done:
  ret void
}
""".replace("TRIES", "8")

_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int32)
_STAT_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p)
_lock = threading.Lock()
_built: list = []  # [the read loop, the stat loop, libc's statx, the engine] once built; [None] * 3 where it cannot be

# struct statx (linux/stat.h; the same on every architecture): the fields that identify a file's
# contents (pipeline.gpu.pinned.file_key), and its mask of the fields the kernel filled in
STATX = np.dtype({"names": ["mask", "ino", "size", "mtime_sec", "mtime_nsec", "dev_major", "dev_minor"],
                  "formats": ["=u4", "=u8", "=u8", "=i8", "=u4", "=u4", "=u4"],
                  "offsets": [0, 32, 40, 112, 120, 136, 140], "itemsize": 256})
STATX_NEEDED = 0x40 | 0x100 | 0x200  # STATX_MTIME | STATX_INO | STATX_SIZE


def _loops() -> list:
    with _lock:
        if not _built:
            try:
                _built.extend(_build())
            except Exception as e:  # any failure: Python's calls read the files
                log.debug("the file loop could not be built (%s): files are read by Python's calls", e)
                _built.extend([None] * 3)
        return _built


def build_soon() -> None:
    """Build the compiled loops now on a thread of their own, unless built: a fresh process's
    first blocks otherwise wait for them at once (60 ms of every task thread, at the start of an
    18.2 GB run of 1.2 s on one H200), where the build can run while the graph is made (llvmlite
    compiles without the GIL)."""
    if not _built and not _lock.locked():
        threading.Thread(target=_loops, name="pipeline-file-loops", daemon=True).start()


def file_loop():
    """The compiled read loop (a ctypes function), built on first use; None where it cannot be."""
    return _loops()[0]


def stat_loop():
    """The compiled stat loop and libc's ``statx`` (its address), built on first use; None where
    either is missing."""
    loop, statx = _loops()[1:3]
    return (loop, statx) if loop is not None and statx else None


def _build():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(LOOP_IR)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    try:
        statx = ctypes.cast(ctypes.CDLL(None).statx, ctypes.c_void_p).value
    except (AttributeError, OSError):  # a libc without statx: os.stat a file
        statx = None
    return [_SIGNATURE(engine.get_function_address("read_files")),
            _STAT_SIGNATURE(engine.get_function_address("stat_files")), statx, engine]  # the engine holds the code


class FileStat(NamedTuple):
    """What :func:`stat_files` gives of a file: the fields of ``os.stat_result`` that the reader
    uses, the same values."""

    st_dev: int
    st_ino: int
    st_size: int
    st_mtime_ns: int


def _os_stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:  # a missing chunk holds the fill value
        return None


def stat_files(paths: list[str]) -> list:
    """``os.stat`` of each path (None where the file does not exist: a chunk never written), in one
    call that holds no GIL (:data:`STATX`) where the compiled loop was built; a file it could not
    look up is asked again of ``os.stat``, which raises what Python raises."""
    compiled = stat_loop() if paths else None
    if compiled is None:
        return [_os_stat(p) for p in paths]
    loop, statx = compiled
    names = (ctypes.c_char_p * len(paths))(*[os.fsencode(p) for p in paths])  # alive until return
    out = np.zeros(len(paths), dtype=STATX)
    rc = np.zeros(len(paths), dtype=np.int32)
    loop(len(paths), ctypes.cast(names, ctypes.c_void_p), out.ctypes.data, rc.ctypes.data, statx)
    ok = (rc == 0) & ((out["mask"] & STATX_NEEDED) == STATX_NEEDED)
    mtime = out["mtime_sec"].astype(object) * 10**9 + out["mtime_nsec"].astype(object)  # Python ints: no overflow
    columns = (out[name].tolist() for name in ("dev_major", "dev_minor", "ino", "size"))
    return [FileStat(os.makedev(dmaj, dmin), ino, size, mt) if good else _os_stat(p)
            for p, good, dmaj, dmin, ino, size, mt in zip(paths, ok.tolist(), *columns, mtime.tolist())]


def read_whole_files(paths: list[str], buffer: np.ndarray, starts: list[int], sizes: list[int]) -> None:
    """Whole files, one after another, file ``k`` into ``buffer[starts[k]:starts[k] + sizes[k]]``
    (one I/O job for several small chunk files), by the compiled loop where it was built. OSError
    on a file that cannot be opened or is shorter than planned (cut since), which sends the block
    to the fallback."""
    loop = file_loop()
    if loop is None:
        from .engine import pread_into

        view = memoryview(buffer)
        for path, start, size in zip(paths, starts, sizes):
            pread_into(path, 0, [view[start:start + size]])
        return
    names = (ctypes.c_char_p * len(paths))(*[os.fsencode(p) for p in paths])  # NUL-terminated, alive until return
    dests = buffer.ctypes.data + np.asarray(starts, dtype=np.int64)
    want = np.asarray(sizes, dtype=np.int64)
    got = np.zeros(len(paths), dtype=np.int64)
    loop(len(paths), ctypes.cast(names, ctypes.c_void_p), dests.ctypes.data, want.ctypes.data, got.ctypes.data,
         os.O_RDONLY | os.O_CLOEXEC)
    for k in np.flatnonzero(got != want).tolist()[:1]:
        if got[k] < 0:
            os.stat(paths[k])  # FileNotFoundError, PermissionError, ... as Python names them
            raise OSError(f"{paths[k]}: could not be opened")
        raise OSError(f"{paths[k]}: short read ({got[k]} of {want[k]} bytes)")
