"""How fast threads of one process read a store's small chunk files from the page cache, by the
way a file is read: each file through Python's ``os.open``/``os.preadv``/``os.close`` (three
releases of the GIL a file, as pipeline's I/O jobs did), or a group of files in one call of the
compiled loop of :mod:`pipeline.gpu.files` over libc's ``open``/``pread``/``close`` that holds no
GIL. Files are read in
groups of about 16 MB, as pipeline's I/O jobs do, into one buffer whose pages are touched first;
``--busy`` threads run Python meanwhile, as a run's task threads do.

    python benchmarks/small_files.py STORE.zarr/tas --threads 4,16 --busy 2
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.gpu import files  # noqa: E402
from pipeline.gpu.engine import pread_into  # noqa: E402


def python_group(paths, views):
    for path, view in zip(paths, views):
        pread_into(path, 0, [view])  # os.open, os.preadv, os.close


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
    assert files.file_loop() is not None
    print(f"loop built in {time.perf_counter() - t:.3f} s; {len(paths)} files, {sum(sizes) / 1e9:.2f} GB, {len(groups)} groups")

    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(2000))

    for _ in range(args.busy):
        threading.Thread(target=busy, daemon=True).start()
    ways = {
        "python": lambda g: python_group([paths[k] for k in g], [mv[starts[k]:starts[k] + sizes[k]] for k in g]),
        "loop": lambda g: files.read_whole_files([paths[k] for k in g], buf, [int(starts[k]) for k in g], [sizes[k] for k in g]),
    }
    rows = []
    for n in [int(x) for x in args.threads.split(",")]:
        with ThreadPoolExecutor(n) as pool:
            for name, fn in ways.items():
                best = 0.0
                for _ in range(3):
                    buf[:] = 0
                    t = time.perf_counter()
                    list(pool.map(fn, groups))
                    best = max(best, sum(sizes) / (time.perf_counter() - t) / 1e9)
                for k in {0, len(paths) // 2, len(paths) - 1}:  # what was read is what the files hold
                    with open(paths[k], "rb") as f:
                        assert buf[starts[k]:starts[k] + sizes[k]].tobytes() == f.read(), paths[k]
                rows.append({"way": name, "threads": n, "GBps": best})
                print(f"{name:7} {n:3} threads {best:7.2f} GB/s")
    stop.set()
    return rows


if __name__ == "__main__":
    main()
