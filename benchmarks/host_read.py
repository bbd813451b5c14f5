"""What the host gives to several GPUs: N processes, one GPU each, each moving its own slab of
blocks along time at the same time, with pipeline's own threads and no distributed scheduler.
The slowest process bounds what N GPUs can do with data that comes from host memory.

Stages (``--stages``), each timed alone so that the bound shows:

- ``pipeline``: read and decode every block of the slab with pipeline's GPU reader as configured
  (files pinned in the page cache by the warm-up run, across the bus from there, nvCOMP), one
  value kept of each;
- ``pipeline-read``: the same with ``pipeline.gpu.pinned-files`` 0: every file read into a pinned
  buffer first;
- ``files``: the slab's files read from the page cache into one pinned buffer by pipeline's I/O
  threads (on the CPU backend, into ordinary memory); nothing crosses the bus;
- ``memcpy``: the same bytes copied from one host buffer to another by the same threads: what the
  host's memory gives to copies;
- ``h2d``: the same bytes copied from pinned memory to the device, in pieces of one block's files,
  on one stream: what the bus gives;
- ``mapped``: the files mapped (``mmap``), pinned where they lie in the page cache
  (``cudaHostRegister``, read-only) and copied to the device from there, with no host copy; the
  pinning is timed apart (``register``) from the copies (``mapped``).

    python benchmarks/host_read.py --store data/bench/tas_4380x721x1440_t73_sharded.zarr --gpus 1,2,4
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

STAGES = ("pipeline", "pipeline-read", "files", "memcpy", "h2d", "mapped")
GPU_ONLY = {"h2d", "mapped"}


def _first_value(block):
    return block[:1, :1, :1]


def _slab_files(store: str, lo: int, hi: int) -> tuple[list[str], list[int]]:
    """The files of ``tas`` that hold steps lo .. hi (whole files along time), and their sizes."""
    from pipeline.gpu import reader

    lay = reader.layout(Path(store) / "tas")
    ranges = [range(lo // lay.chunk[0], math.ceil(hi / lay.chunk[0]))]
    ranges += [range(math.ceil(n / c)) for n, c in zip(lay.shape[1:], lay.chunk[1:])]
    paths = [lay.path(c) for c in itertools.product(*ranges)]
    paths = [p for p in paths if os.path.exists(p)]
    return paths, [os.path.getsize(p) for p in paths]


def _timed(fn, repeat: int, barrier) -> list[float]:
    fn()  # warm-up: kernels, pinned buffers, pages
    times = []
    for _ in range(repeat):
        barrier.wait()  # all processes start each run together
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _stage_runs(stage: str, store: str, slab, blocks: int, backend: str, repeat: int, barrier) -> tuple[int, dict[str, list[float]]]:
    import numpy as np

    import pipeline
    from pipeline.gpu import reader
    from pipeline.gpu.iopool import io_pool

    lo, hi = slab
    if stage.startswith("pipeline"):
        import dask

        from pipeline.gpu import pinned

        x = pipeline.open_dataset(store, backend=backend)["tas"].data[lo:hi]
        # read and decode every block, keep one value of each: no arithmetic beyond the read
        y = x.map_blocks(_first_value, chunks=tuple((1,) * len(c) for c in x.chunks)).sum()
        settings = {"pipeline.gpu.pinned-files": 0} if stage == "pipeline-read" else {}
        if settings and backend == "gpu":
            pinned.release_files()  # pinned by an earlier stage: read them again

        def run():
            with dask.config.set(settings):
                pipeline.compute(y)

        return x.nbytes, {stage: _timed(run, repeat, barrier)}

    paths, sizes = _slab_files(store, lo, hi)
    total = sum(sizes)
    if backend == "gpu":
        from pipeline.gpu import pinned

        staging = pinned.take(total)  # held to the end: a buffer dropped is unpinned
        host = staging.bytes[:total]
    else:
        host = np.empty(total, dtype=np.uint8)
    if stage == "files":
        return total, {stage: _timed(lambda: reader.read_files(paths, sizes, host), repeat, barrier)}
    if stage == "memcpy":
        source = np.ones(total, dtype=np.uint8)
        pool, piece = io_pool(), reader.PIECE

        def copy():
            jobs = [pool.submit(np.copyto, host[a:a + piece], source[a:a + piece]) for a in range(0, total, piece)]
            for j in jobs:
                j.result()

        return total, {stage: _timed(copy, repeat, barrier)}

    import cupy as cp

    dev = cp.empty(total, dtype=np.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    per_block = -(-len(paths) // blocks)  # the files of one block
    pieces = [sum(sizes[k:k + per_block]) for k in range(0, len(sizes), per_block)]
    if stage == "h2d":
        reader.read_files(paths, sizes, host)

        def h2d():
            at = 0
            for n in pieces:
                dev[at:at + n].set(host[at:at + n], stream=stream)
                at += n
            stream.synchronize()

        return total, {stage: _timed(h2d, repeat, barrier)}

    # mapped: the page cache's own pages, pinned in place, copied to the device
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    maps = [mmap.mmap(fd, n, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
            for fd, n in zip(fds, sizes)]
    views = [np.frombuffer(m, dtype=np.uint8) for m in maps]
    starts = list(itertools.accumulate([0] + sizes[:-1]))

    from pipeline.gpu import pinned

    def register():  # as pipeline.gpu.pinned.PinnedFile does, timed apart from mapping the files
        for v in views:
            pinned._register(v.ctypes.data, v.nbytes)

    def unregister():
        for v in views:
            pinned._unregister(v.ctypes.data)

    def copy_mapped():
        for v, at in zip(views, starts):
            dev[at:at + v.nbytes].set(v, stream=stream)
        stream.synchronize()

    reg = []

    def register_timed():
        barrier.wait()
        t = time.perf_counter()
        register()
        reg.append(time.perf_counter() - t)
        unregister()

    register()
    copy_mapped()
    unregister()
    for _ in range(repeat):
        register_timed()
    register()
    try:
        runs = _timed(copy_mapped, repeat, barrier)
    finally:
        unregister()
        del views
        for m, fd in zip(maps, fds):
            with contextlib.suppress(BufferError):  # a view still held: the mapping goes with it
                m.close()
            os.close(fd)
    return total, {"register": reg, "mapped": runs}


def _worker(rank: int, n: int, store: str, stages: list[str], repeat: int, backend: str, barrier, queue, steps: int | None = None) -> None:
    if backend == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # before CuPy starts in this process
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pipeline

    chunks = pipeline.open_dataset(store, backend="cpu")["tas"].data.chunks[0]
    if steps:  # the blocks of the first ``steps`` steps only
        ends = list(itertools.accumulate(chunks))
        chunks = chunks[:next((i + 1 for i, e in enumerate(ends) if e >= steps), len(chunks))]
    per = -(-len(chunks) // n)
    slab = sum(chunks[:rank * per]), sum(chunks[:(rank + 1) * per])
    blocks = len(chunks[rank * per:(rank + 1) * per])
    for stage in stages:
        try:
            nbytes, runs = _stage_runs(stage, store, slab, blocks, backend, repeat, barrier)
        except Exception as e:  # reported; the other processes stop at the broken barrier, and so do the later stages
            barrier.abort()
            queue.put((stage, rank, 0, {stage: f"{type(e).__name__}: {e}"}))
            return
        queue.put((stage, rank, nbytes, runs))


def measure(store: str, n: int, repeat: int, backend: str = "gpu", stages=("pipeline",), steps: int | None = None) -> list[dict]:
    """One dict per timed stage: the slowest process's median time and the aggregate rate."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, n, store, list(stages), repeat, backend, barrier, queue, steps)) for r in range(n)]
    for p in procs:
        p.start()
    got = []
    while len(got) < n * len(stages) and any(p.is_alive() for p in procs) or not queue.empty():
        try:
            got.append(queue.get(timeout=1))
        except Exception:
            continue
    for p in procs:
        p.join()
    out = []
    for stage in stages:
        results = sorted((r, b, runs) for s, r, b, runs in got if s == stage)
        if len(results) < n or any(isinstance(v, str) for _, _, runs in results for v in runs.values()):
            errors = sorted({v for _, _, runs in results for v in runs.values() if isinstance(v, str)})
            out.append({"gpus": n, "stage": stage, "error": "; ".join(errors) or "a process gave no result"})
            continue
        nbytes = sum(b for _, b, _ in results)
        for name in results[0][2]:
            slowest = [max(runs[name][i] for _, _, runs in results) for i in range(repeat)]
            seconds = statistics.median(slowest)
            out.append({"gpus": n, "stage": name, "seconds": seconds, "bytes": nbytes, "GBps": nbytes / seconds / 1e9,
                        "per_process": [statistics.median(runs[name]) for _, _, runs in results]})
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a store with a tas variable (any layout pipeline reads)")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stages", default="pipeline", help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--backend", default="gpu", choices=("gpu", "cpu"), help="cpu: processes without a GPU (a smoke run)")
    ap.add_argument("--steps", type=int, default=None, help="only the blocks of the first STEPS steps (whole blocks), shared by the processes")
    args = ap.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"unknown stage(s) {bad}; expected some of {', '.join(STAGES)}")
    if args.backend == "cpu" and GPU_ONLY & set(stages):
        ap.error(f"stages {sorted(GPU_ONLY & set(stages))} need the GPU backend")
    out = []
    for n in (int(k) for k in args.gpus.split(",")):
        for r in measure(args.store, n, args.repeat, args.backend, stages, args.steps):
            out.append(r)
            if "error" in r:
                print(f"{n} process(es), {r['stage']}: failed: {r['error']}", flush=True)
            else:
                print(f"{n} process(es), {r['stage']}: slowest {r['seconds']:.3f} s, {r['bytes'] / 1e9:.2f} GB at "
                      f"{r['GBps']:.1f} GB/s; per process {[round(t, 3) for t in r['per_process']]}", flush=True)
    return out


if __name__ == "__main__":
    main()
