"""How fast threads of one process read a store's small chunk files from the page cache, by the
way a file is read: each file through Python's ``os.open``/``os.preadv``/``os.close`` (three
releases of the GIL a file; pipeline's I/O jobs), or a group of files in one call of a
Numba-compiled loop over libc's ``open``/``pread``/``close`` that holds no GIL. Files are read in
groups of about 16 MB, as pipeline's I/O jobs do, into one buffer whose pages are touched first;
``--busy`` threads run Python meanwhile, as a run's task threads do.

    python benchmarks/small_files.py STORE.zarr/tas --threads 4,8,16 --seconds 3
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _loop():
    import numba
    from numba.core import types

    c_open = types.ExternalFunction("open", types.int32(types.intp, types.int32))
    c_pread = types.ExternalFunction("pread", types.intp(types.int32, types.intp, types.uintp, types.intp))
    c_close = types.ExternalFunction("close", types.int32(types.int32))

    @numba.njit(nogil=True)
    def loop(names, name_at, dests, sizes, got):
        base = names.ctypes.data
        for k in range(len(sizes)):
            fd = c_open(base + name_at[k], 0)
            if fd < 0:
                got[k] = -1
                continue
            done = 0
            while done < sizes[k]:
                n = c_pread(fd, dests[k] + done, sizes[k] - done, done)
                if n <= 0:
                    break
                done += n
            got[k] = done
            c_close(fd)

    return loop


def python_group(paths, views):
    for path, view in zip(paths, views):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [view], 0)
        finally:
            os.close(fd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("array", help="a folder of chunk files (a Zarr v2 array)")
    ap.add_argument("--threads", default="4,8,16")
    ap.add_argument("--group", type=int, default=16 << 20)
    ap.add_argument("--limit", type=int, default=4000, help="files read, at most")
    ap.add_argument("--busy", type=int, default=0, help="threads running Python meanwhile, as a run's task threads do")
    args = ap.parse_args(argv)
    names = sorted(n for n in os.listdir(args.array) if not n.startswith("."))[:args.limit]
    paths = [os.path.join(args.array, n) for n in names]
    sizes = [os.path.getsize(p) for p in paths]
    buf = np.ones(sum(sizes), dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    groups, cur, acc = [], [], 0
    for k, s in enumerate(sizes):
        cur.append(k)
        acc += s
        if acc >= args.group:
            groups.append(cur)
            cur, acc = [], 0
    if cur:
        groups.append(cur)
    mv = memoryview(buf)
    t = time.perf_counter()
    loop = _loop()
    enc = [p.encode() + b"\0" for p in paths]
    name_at = np.concatenate([[0], np.cumsum([len(e) for e in enc])[:-1]]).astype(np.int64)
    packed = np.frombuffer(b"".join(enc), dtype=np.uint8).copy()
    dests = (buf.ctypes.data + starts).astype(np.int64)
    sz = np.array(sizes, dtype=np.int64)
    got = np.zeros(len(sizes), dtype=np.int64)
    loop(packed[:1].copy(), name_at[:0], dests[:0], sz[:0], got[:0])
    print(f"numba loop ready in {time.perf_counter() - t:.3f} s; {len(paths)} files, {sum(sizes) / 1e9:.2f} GB, {len(groups)} groups")

    def numba_group(g):
        lo, hi = g[0], g[-1] + 1
        loop(packed, name_at[lo:hi], dests[lo:hi], sz[lo:hi], got[lo:hi])

    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(2000))

    for _ in range(args.busy):
        threading.Thread(target=busy, daemon=True).start()
    ways = {
        "python": lambda g: python_group([paths[k] for k in g], [mv[starts[k]:starts[k] + sizes[k]] for k in g]),
        "numba": numba_group,
    }
    for n in [int(x) for x in args.threads.split(",")]:
        with ThreadPoolExecutor(n) as pool:
            for name, fn in ways.items():
                best = 0.0
                for _ in range(3):
                    t = time.perf_counter()
                    list(pool.map(fn, groups))
                    best = max(best, sum(sizes) / (time.perf_counter() - t) / 1e9)
                print(f"{name:7} {n:3} threads {best:7.2f} GB/s")
    assert (got == sz).all()
    stop.set()


if __name__ == "__main__":
    main()
