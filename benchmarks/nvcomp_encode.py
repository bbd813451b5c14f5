"""How fast nvCOMP writes standard zstd frames, by frame size, batch length and execution policy.

`pipeline convert` writes shards of ~1 MB zstd frames. On the CPU, compressing them is most of its
work. This measures nvCOMP's batched zstd encoder on frames already on the device (a smooth field
plus noise, rounded to 0.01 K, as `convert_speed.py` builds it), so that the batching of
`sinks/convert.py` can be chosen from figures:

- the encode alone, frames on the device, stream synchronized: GB/s of uncompressed bytes;
- the ratio, against numcodecs' zstd at ``--level`` on the same frames;
- a sample of frames decoded by numcodecs and compared with the input (standard zstd).

    python benchmarks/nvcomp_encode.py --frames-kb 128,593,2048 --batches 32,511,2044
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


_KEEP: list = []


def _field(cp, steps: int, ny: int, nx: int, t0: int):
    t = cp.arange(t0, t0 + steps, dtype="f4")[:, None, None]
    y = cp.linspace(-1, 1, ny, dtype="f4")[None, :, None]
    x = cp.linspace(0, 2 * np.pi, nx, dtype="f4")[None, None, :]
    noise = cp.random.default_rng(t0).standard_normal((steps, ny, nx), dtype="f4")
    return cp.round(280 + 30 * cp.cos(np.pi * y / 2) + 5 * cp.sin(x + t / 58) + noise, 2)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames-kb", default="128,593,2048", help="frame sizes, KB (593: 1 x 103 x 1440 float32)")
    p.add_argument("--batches", default="32,511,2044,4088", help="frames per encode call")
    p.add_argument("--policies", default="CONCURRENCY,LATENCY")
    p.add_argument("--level", type=int, default=2, help="numcodecs zstd level for the ratio beside")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-gb", type=float, default=2.5, help="device bytes of frames at most")
    p.add_argument("--feed", type=int, default=0, help="also: N threads at once copying their own 303 MB block to the device, three ways")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import cupy as cp
    from numcodecs import Zstd
    from nvidia import nvcomp as nv

    nmax = max(int(b) for b in args.batches.split(","))
    sizes_kb = [int(s) for s in args.frames_kb.split(",")]
    total = int(min(nmax * max(sizes_kb) * 1000, args.max_gb * 1e9))
    steps = 73
    block = steps * 721 * 1440 * 4
    blocks = [_field(cp, steps, 721, 1440, t0).reshape(-1).view("u1") for t0 in range(0, steps * -(-total // block), steps)]
    data = cp.concatenate(blocks)[:total]
    del blocks
    stream = cp.cuda.Stream(non_blocking=True)
    _KEEP.append(stream)  # lives as long as the process: a codec destroyed after its stream crashed
    host = cp.asnumpy(data)
    out = {"rows": []}
    for policy in filter(None, args.policies.split(",")):
        codec = nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=stream.ptr,
                         execution_policy=getattr(nv.ExecutionPolicy, policy))
        for kb in sizes_kb:
            size = kb * 1000
            for n in (int(b) for b in args.batches.split(",")):
                if n * size > data.size:
                    continue
                offsets = [k * size for k in range(n)]
                srcs = nv.as_arrays(data, offsets, [size] * n, stream.ptr)
                times, frames = [], None
                try:
                    codec.encode(srcs)  # warm-up: workspace, kernels
                    stream.synchronize()
                    for _ in range(args.repeat):
                        t = time.perf_counter()
                        frames = codec.encode(srcs)
                        stream.synchronize()
                        times.append(time.perf_counter() - t)
                except Exception as e:  # noqa: BLE001 - a configuration nvCOMP refuses is a row
                    print(f"{policy:11s} {kb:5d} KB x {n:5d}: {type(e).__name__}: {e}", flush=True)
                    continue
                stored = sum(int(cp.asarray(f).nbytes) for f in frames)
                t = time.perf_counter()
                back = [cp.asnumpy(cp.asarray(f)) for f in frames]
                d2h = time.perf_counter() - t
                cpu = Zstd(level=args.level)
                sample = sorted({0, n // 2, n - 1})
                exact = all(bytes(cpu.decode(back[k].tobytes())) == host[k * size:(k + 1) * size].tobytes() for k in sample)
                cpu_stored = sum(len(cpu.encode(host[k * size:(k + 1) * size])) for k in sample)
                row = {
                    "policy": policy, "frame_kb": kb, "frames": n, "seconds": statistics.median(times),
                    "gb_per_s": n * size / statistics.median(times) / 1e9, "ratio": n * size / stored,
                    "cpu_ratio_sample": len(sample) * size / cpu_stored, "d2h_each_seconds": d2h, "exact": exact,
                }
                out["rows"].append(row)
                del frames, srcs  # nvCOMP's objects go before the stream they were made on
                print(f"{policy:11s} {kb:5d} KB x {n:5d}: {row['seconds'] * 1e3:8.1f} ms  {row['gb_per_s']:6.2f} GB/s  "
                      f"ratio {row['ratio']:.3f} (numcodecs L{args.level} {row['cpu_ratio_sample']:.3f})  "
                      f"frames back one by one {d2h * 1e3:.0f} ms  exact={exact}", flush=True)
        stream.synchronize()
        del codec
    if args.feed:
        out["feed"] = _feed(cp, args.feed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


def _feed(cp, k: int) -> list[dict]:
    """``k`` threads at once, each copying its own 303 MB block (NumPy memory, faulted in) to the
    device: registered where it lies, pageable, or through a pinned buffer of its own."""
    import threading

    from pipeline.gpu import pinned

    nbytes = 73 * 721 * 1440 * 4
    blocks = [np.full(nbytes, j, dtype=np.uint8) for j in range(k)]
    devs = [cp.empty(nbytes, dtype=np.uint8) for _ in range(k)]
    staging = [pinned.take(nbytes) for _ in range(k)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(k)]

    device = cp.cuda.Device().id

    def registered(j):
        ptr = blocks[j].ctypes.data
        cp.cuda.runtime.hostRegister(ptr, nbytes, 0)
        devs[j].set(blocks[j], streams[j])
        streams[j].synchronize()
        cp.cuda.runtime.hostUnregister(ptr)

    def pageable(j):
        devs[j].set(blocks[j], streams[j])
        streams[j].synchronize()

    def staged(j):
        host = staging[j].bytes[:nbytes]
        np.copyto(host, blocks[j])
        devs[j].set(host, streams[j])
        streams[j].synchronize()

    rows = []
    for name, fn in (("registered", registered), ("pageable", pageable), ("staged", staged)) * 2:
        each = [0.0] * k
        start = threading.Barrier(k)

        def work(j):
            cp.cuda.Device(device).use()
            start.wait()
            t = time.perf_counter()
            fn(j)
            each[j] = time.perf_counter() - t

        ts = [threading.Thread(target=work, args=(j,)) for j in range(k)]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        seconds = time.perf_counter() - t
        rows.append({"way": name, "threads": k, "seconds": seconds, "each_median": statistics.median(each), "gb_per_s": k * nbytes / seconds / 1e9})
        print(f"feed {name:10s} {k} threads x 303 MB: {seconds * 1e3:.0f} ms in all ({rows[-1]['gb_per_s']:.1f} GB/s), "
              f"each {min(each) * 1e3:.0f}-{max(each) * 1e3:.0f} ms", flush=True)
    for b in staging:
        pinned.give(b)
    return rows


if __name__ == "__main__":
    main()
