"""What pinning a chunk file where it lies in the page cache costs, against reading it, by file size.

For each size, ``--total`` bytes of files of that size (at least 32 files) are written to a
temporary folder and read once (so they are in the page cache). Then, by the I/O pool's threads, as
the GPU reader does it (:func:`pipeline.gpu.reader.submit_reads`):

- ``read``: every file read into one pinned buffer (the copy that a pinned file saves each later
  read);
- ``pin``: every file mapped and pinned (:class:`pipeline.gpu.pinned.PinnedFile`: ``mmap`` with
  ``MAP_POPULATE``, ``cudaHostRegister``), then unpinned (not timed).

Each the median of ``--repeat`` runs. ``pin / read`` is how many reads a pin costs: under
``pipeline.gpu.pin-files: first-read`` a file pinned on its first read pays that much instead of one
read, and gains a read at each later one.

    python benchmarks/pin_cost.py --sizes 256K,640K,1M,2M,4M,16M,64M --total 1G --json pin.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def one_size(folder: Path, size: int, total: int, repeat: int) -> dict:
    import numpy as np

    from pipeline.gpu import pinned
    from pipeline.gpu.iopool import io_pool
    from pipeline.gpu.reader import submit_reads

    n = max(32, total // size)
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    paths = []
    for i in range(n):
        p = folder / f"{size}_{i}"
        p.write_bytes(block)
        paths.append(str(p))
    for p in paths:  # into the page cache
        Path(p).read_bytes()
    buf = pinned.take(n * size)
    pool = io_pool()
    reads, pins = [], []
    try:
        for _ in range(repeat + 1):
            t = time.perf_counter()
            for _, jobs in submit_reads(paths, [size] * n, buf.bytes):
                for j in jobs:
                    j.result()
            reads.append(time.perf_counter() - t)
            stats = [os.stat(p) for p in paths]
            t = time.perf_counter()
            jobs = [pool.submit(pinned.PinnedFile, p, pinned.file_key(st), size) for p, st in zip(paths, stats)]
            files = [j.result() for j in jobs]
            pins.append(time.perf_counter() - t)
            for f in files:
                f.close()
    finally:
        pinned.give(buf)
        for p in paths:
            os.unlink(p)
    read, pin = statistics.median(reads[1:]), statistics.median(pins[1:])
    return {"file_bytes": size, "files": n, "read_seconds": read, "pin_seconds": pin,
            "read_us_per_file": read / n * 1e6, "pin_us_per_file": pin / n * 1e6,
            "read_gb_per_s": n * size / read / 1e9, "pin_gb_per_s": n * size / pin / 1e9, "pin_over_read": pin / read}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256K,640K,1M,2M,4M,16M,64M")
    p.add_argument("--total", default="1G", help="bytes of files of each size")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", help="where to write the files (default: a temporary folder)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for s in a.sizes.split(","):
            r = one_size(Path(tmp), _bytes(s), _bytes(a.total), a.repeat)
            rows.append(r)
            print(f"{s:>6} x {r['files']:5d}: read {r['read_us_per_file']:8.1f} us a file ({r['read_gb_per_s']:5.1f} GB/s), "
                  f"pin {r['pin_us_per_file']:8.1f} us ({r['pin_gb_per_s']:5.1f} GB/s), pin / read {r['pin_over_read']:5.1f}",
                  flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
