"""What the host's cores give to the codecs of the users' stores: decode rates by thread count.

Each of N threads decodes the same compressed chunk again and again into a buffer of its own for
``--seconds``; the rate is the decoded bytes of all threads over that time. Where the rate stops
growing with threads, the host, not the GPUs, bounds a read that decodes there, however many GPUs
share the node. The chunks are those the users' tools write (``benchmarks/user_stores.py``'s
values):

- ``zstd``: zarr's default codec (numcodecs Zstd, level 0), one frame of ``--zstd-steps`` steps;
- ``blosc-lz4``: numcodecs Blosc lz4 level 5 with byte shuffle, one step (ERA5-style Zarr v2);
- ``zlib``: HDF5's shuffle then zlib level 4, one step (NetCDF4), inflated as pipeline's I/O threads
  inflate it (zlib's ``uncompress`` through ctypes, with no GIL);
- ``zlib-module``: the same stream through CPython's ``zlib.decompress``, which holds the GIL while
  it grows its output;
- ``pread``: a file of one zstd frame read from the page cache into the thread's buffer;
- ``memcpy``: one step copied by NumPy: what the host's memory gives to copies.

    python benchmarks/host_codecs.py --threads 1,2,4,8,16,32
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

CODECS = ("zstd", "blosc-lz4", "zlib", "zlib-module", "pread", "memcpy")


def _chunks(steps: int, ny: int, nx: int) -> dict:
    """Each codec's (decode(into), decoded bytes): a function filling a thread's buffer."""
    import numcodecs

    from user_stores import field

    from pipeline.gpu.hdf5 import _inflate

    one = field(0, 1, ny, nx, seed=0)
    many = field(0, steps, ny, nx, seed=0)
    zstd = numcodecs.Zstd(level=0).encode(many)
    blosc = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE).encode(one)
    shuffled = one.view(np.uint8).reshape(-1, 4).T.copy()  # HDF5's shuffle filter
    deflated = zlib.compress(shuffled.tobytes(), 4)
    fd, path = tempfile.mkstemp(suffix=".zst")
    os.write(fd, zstd)
    os.close(fd)
    zcodec, bcodec = numcodecs.Zstd(), numcodecs.Blosc()

    def read(out):
        with open(path, "rb", buffering=0) as f:
            f.readinto(out[:len(zstd)])

    return {
        "zstd": (lambda out: zcodec.decode(zstd, out=out), many.nbytes),
        "blosc-lz4": (lambda out: bcodec.decode(blosc, out=out), one.nbytes),
        "zlib": (lambda out: _inflate(deflated, out[:one.nbytes], "zlib"), one.nbytes),
        "zlib-module": (lambda out: zlib.decompress(deflated), one.nbytes),
        "pread": (read, len(zstd)),
        "memcpy": (lambda out: np.copyto(out[:one.nbytes], one.view(np.uint8).ravel()), one.nbytes),
    }, path


def rate(decode, nbytes: int, threads: int, seconds: float) -> float:
    """Decoded bytes a second of ``threads`` threads, each decoding into its own buffer."""
    start, stop = threading.Barrier(threads + 1), threading.Event()
    done = [0] * threads

    def work(k):
        out = np.empty(max(nbytes, 1), dtype=np.uint8)
        decode(out)  # pages of the buffer touched before the clock starts
        start.wait()
        n = 0
        while not stop.is_set():
            decode(out)
            n += 1
        done[k] = n

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(done) * nbytes / (time.perf_counter() - t0)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2,4,8,16,32")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--zstd-steps", type=int, default=73)
    ap.add_argument("--grid", default="721,1440")
    args = ap.parse_args(argv)
    ny, nx = (int(v) for v in args.grid.split(","))
    codecs, path = _chunks(args.zstd_steps, ny, nx)
    rows = []
    try:
        print(f"cores: {os.cpu_count()}, affinity: {len(os.sched_getaffinity(0))}", flush=True)
        for name in args.codecs.split(","):
            decode, nbytes = codecs[name]
            line = []
            for n in (int(k) for k in args.threads.split(",")):
                r = rate(decode, nbytes, n, args.seconds)
                rows.append({"codec": name, "threads": n, "GBps": r / 1e9})
                line.append(f"{n}: {r / 1e9:.2f}")
            print(f"{name:10s} GB/s by threads  " + "  ".join(line), flush=True)
    finally:
        os.unlink(path)
    return rows


if __name__ == "__main__":
    main()
