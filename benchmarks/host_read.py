"""What the host gives to several GPUs: N processes, one GPU each, each reading and decoding its
own slab of blocks along time at the same time, with pipeline's own threads and no distributed
scheduler. The slowest process bounds what N GPUs can do with data that comes from host memory.

    python benchmarks/host_read.py --store data/bench/tas_4380x721x1440_t73_sharded.zarr --gpus 1,2,4
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path


def _first_value(block):
    return block[:1, :1, :1]


def _read_slab(rank: int, n: int, store: str, repeat: int, backend: str, barrier, queue) -> None:
    if backend == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # before CuPy starts in this process
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pipeline

    tas = pipeline.open_dataset(store, backend=backend)["tas"]
    chunks = tas.data.chunks[0]
    per = -(-len(chunks) // n)
    lo, hi = sum(chunks[:rank * per]), sum(chunks[:(rank + 1) * per])
    slab = tas.data[lo:hi]
    # read and decode every block, keep one value of each: no arithmetic beyond the read
    y = slab.map_blocks(_first_value, chunks=tuple((1,) * len(c) for c in slab.chunks)).sum()
    pipeline.compute(y)  # warm-up: kernels, pinned staging buffers
    times = []
    for _ in range(repeat):
        barrier.wait()  # all processes start each run together
        t = time.perf_counter()
        pipeline.compute(y)
        times.append(time.perf_counter() - t)
    queue.put((rank, slab.nbytes, times))


def measure(store: str, n: int, repeat: int, backend: str = "gpu") -> dict:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_read_slab, args=(r, n, store, repeat, backend, barrier, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results = sorted(queue.get() for _ in procs)
    for p in procs:
        p.join()
    slowest = [max(r[2][i] for r in results) for i in range(repeat)]
    nbytes = sum(r[1] for r in results)
    seconds = statistics.median(slowest)
    return {"gpus": n, "seconds": seconds, "bytes": nbytes, "GBps": nbytes / seconds / 1e9,
            "per_process": [statistics.median(r[2]) for r in results]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a store with a tas variable, in pipeline convert's layout")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backend", default="gpu", choices=("gpu", "cpu"), help="cpu: processes without a GPU (a smoke run)")
    args = ap.parse_args(argv)
    out = []
    for n in (int(k) for k in args.gpus.split(",")):
        r = measure(args.store, n, args.repeat, args.backend)
        out.append(r)
        print(f"{n} process(es): slowest {r['seconds']:.3f} s, {r['bytes'] / 1e9:.1f} GB at {r['GBps']:.1f} GB/s; "
              f"per process {[round(t, 3) for t in r['per_process']]}", flush=True)
    return out


if __name__ == "__main__":
    main()
