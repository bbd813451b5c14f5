"""nvCOMP's inflate of a NetCDF4 variable's chunks on the GPU, by batch length and by batches in
flight at once: how many deflate streams a batch needs before the GPU inflates faster than the
host's cores.

Every stored chunk of ``VARIABLE`` in ``FILE`` (zlib, with or without the shuffle) is copied to the
device once; then, for each batch length ``B`` of ``--batches`` and each count ``T`` of
``--threads``, ``T`` threads each decode batches of ``B`` streams on a stream of their own until
every chunk has been decoded, and the seconds and GB/s of output are printed (best of
``--repeat``). The host's rate for comparison: every chunk inflated by CPython's zlib over as many
threads as cores. ``--hold`` also runs each case with the batches' nvCOMP arrays kept until every
batch is done; ``--allocator freehost`` gives nvCOMP's pinned memory back with ``cudaFreeHost`` at
once, as nvCOMP's own allocator does (``benchmarks/nvcomp_allocator.py``), rather than through
pipeline's (``pipeline.gpu.nvcomp.PinnedAllocation``).

    python benchmarks/deflate_batch.py data/bench/zlib.nc tas --batches 9,36,72,144,all --threads 1,3
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def streams(path: str, variable: str):
    """The variable's layout and its chunks' zlib streams packed into one host buffer, each
    deflate stream (after zlib's 2-byte header) starting 16-byte aligned: (layout, buffer,
    offsets, sizes) of the raw deflate streams."""
    from pipeline.gpu import hdf5

    lay = hdf5.layout(path, variable)
    offsets = lay.offsets.reshape(-1)
    sizes = lay.sizes.reshape(-1)
    present = np.flatnonzero(offsets >= 0)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    places, pos = [], 14  # 14 + 2: the first stream aligned
    for k in present:
        places.append(pos)
        pos += int(sizes[k])
        pos += (-(pos + 2)) % 16
    buf = np.empty(pos, dtype=np.uint8)
    for p, k in zip(places, present):
        buf[p:p + int(sizes[k])] = raw[int(offsets[k]):int(offsets[k]) + int(sizes[k])]
    return lay, buf, np.array(places) + 2, sizes[present] - 6


def device_rate(lay, dev, offs, sizes, batch: int, threads: int, out, hold: bool = False, policy: str = "") -> float:
    """Seconds to inflate every stream, ``threads`` threads each taking batches of ``batch``; the
    mean seconds of each step of a batch are left in ``device_rate.steps``. ``hold``: the
    batches' nvCOMP arrays are kept until every batch is done rather than freed after each."""
    import cupy as cp

    from pipeline.gpu import nvcomp
    from pipeline.gpu.streams import context

    nb = lay.chunk_nbytes
    n = len(offs)
    batches = [range(i, min(n, i + batch)) for i in range(0, n, batch)]
    lock = threading.Lock()
    it = iter(batches)
    steps, held = [], []

    def work():
        with context() as ctx, ctx.stream:
            if policy:
                nv = nvcomp._nvcomp()
                codec = nv.Codec(algorithm="Deflate", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=ctx.stream.ptr,
                                 execution_policy=getattr(nv.ExecutionPolicy, policy.upper()))
                configs = {}
            else:
                codec, configs = nvcomp._codec_for("Deflate"), ctx.configs
            while True:
                with lock:
                    b = next(it, None)
                if b is None:
                    break
                t0 = time.perf_counter()
                srcs = nvcomp._batch(dev, [int(offs[k]) for k in b], [int(sizes[k]) for k in b], ctx.stream)
                outs = nvcomp._batch(out, [k * nb for k in b], [nb] * len(b), ctx.stream)
                t1 = time.perf_counter()
                nvcomp._decode_sized(codec, configs, srcs, outs, ("Deflate", len(b), nb), [nb] * len(b))
                t2 = time.perf_counter()
                ctx.stream.synchronize()
                t3 = time.perf_counter()
                if hold:
                    held.append((srcs, outs))
                del srcs, outs
                t4 = time.perf_counter()
                steps.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))

    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    cp.cuda.Device().synchronize()
    s = time.perf_counter() - t
    held.clear()
    device_rate.steps = [sum(x) / len(steps) for x in zip(*steps)]
    return s


def host_rate(lay, buf, offs, sizes) -> float:
    nb = lay.chunk_nbytes

    def one(k):
        s = int(offs[k])
        out = zlib.decompress(buf[s - 2:s + int(sizes[k]) + 4])
        assert len(out) == nb

    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(one, range(len(offs))))
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("variable")
    p.add_argument("--batches", default="9,36,72,144,all")
    p.add_argument("--threads", default="1,3")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--hold", action="store_true", help="also with the batches' arrays kept until the end")
    p.add_argument("--allocator", choices=["pipeline", "freehost"], default="pipeline",
                   help="nvCOMP's pinned host memory: pipeline's (pipeline.gpu.nvcomp.PinnedAllocation), or "
                        "cudaHostAlloc and cudaFreeHost at once, as nvCOMP's own allocator")
    p.add_argument("--policy", default="", help="nvCOMP's execution policy (latency, concurrency); default: the codec's")
    a = p.parse_args(argv)
    import cupy as cp

    from pipeline.gpu import nvcomp

    nv = nvcomp._nvcomp()  # installs pipeline's allocator
    if a.allocator == "freehost":
        from nvcomp_allocator import FreeHost

        nv.set_pinned_allocator(FreeHost)

    lay, buf, offs, sizes = streams(a.file, a.variable)
    n = len(offs)
    total = n * lay.chunk_nbytes
    print(f"{n} streams, {buf.nbytes / 1e9:.2f} GB stored, {total / 1e9:.2f} GB inflated, chunk {lay.chunk}")
    h = min(host_rate(lay, buf, offs, sizes) for _ in range(a.repeat))
    print(f"host, zlib over {os.cpu_count()} threads: {h:.3f} s ({total / h / 1e9:.1f} GB/s)")
    dev = cp.asarray(buf)
    out = cp.empty(total, dtype=np.uint8)
    # the first batch of each length builds its decompression config: one untimed pass of each
    for b in a.batches.split(","):
        batch = n if b == "all" else int(b)
        for threads in (int(t) for t in a.threads.split(",")):
            for hold in (False, True) if a.hold else (False,):
                device_rate(lay, dev, offs[:batch * threads], sizes[:batch * threads], batch, threads, out, hold, a.policy)
                s = min(device_rate(lay, dev, offs, sizes, batch, threads, out, hold, a.policy) for _ in range(a.repeat))
                steps = " / ".join(f"{x * 1e3:.1f}" for x in device_rate.steps)
                print(f"device, batches of {batch}, {threads} at once{', held' if hold else ''}: {s:.3f} s "
                      f"({total / s / 1e9:.1f} GB/s); ms a batch: arrays / decode call / sync / free {steps}")
    # the last decode checked against zlib's, a few chunks
    got = cp.asnumpy(out[:lay.chunk_nbytes * 3])
    for k in range(3):
        s = int(offs[k])
        ref = np.frombuffer(zlib.decompress(buf[s - 2:s + int(sizes[k]) + 4]), dtype=np.uint8)
        assert np.array_equal(got[k * lay.chunk_nbytes:(k + 1) * lay.chunk_nbytes], ref), k
    print("checked against zlib")


if __name__ == "__main__":
    main()
