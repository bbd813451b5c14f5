"""How large zstd frames (one per chunk, as zarr writes them by default) decode on the GPU, on the
CPU, and on both at once: the measurements that the reader's split between them rests on.

On a store as ``xarray.Dataset.to_zarr`` writes it (Zarr v3, zarr's default zstd, one frame per
chunk), with every frame already in memory (host, and device for nvCOMP):

- ``cpu_one``: one frame decoded by numcodecs on one thread (the latency of a frame on the CPU);
- ``cpu_all``: every frame on ``--threads`` threads;
- ``gpu_batch[k]``: nvCOMP decoding k frames in one batch;
- ``gpu_streams[k]``: k batches of one frame each, on k streams at once;
- ``split[g]``: g frames in one nvCOMP batch while the CPU threads decode the others.

    python benchmarks/zstd_split.py --shape 1460,721,1440 --workdir data/bench --json split.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make_store(path: Path, shape, chunk: int, seed: int = 0) -> Path:
    """tas as xarray writes it with its defaults (Zarr v3, zarr's default codecs)."""
    import dask.array as da
    import xarray as xr

    if (path / "zarr.json").exists():
        return path
    nt, ny, nx = shape

    def block(block_info=None):
        (t0, t1), _, _ = block_info[None]["array-location"]
        rng = np.random.default_rng(seed + t0)
        t = np.arange(t0, t1, dtype=np.float32)[:, None, None]
        lat = np.linspace(-90, 90, ny, dtype=np.float32)[None, :, None]
        lon = np.linspace(0, 360, nx, endpoint=False, dtype=np.float32)[None, None, :]
        base = 288 - 30 * np.sin(np.deg2rad(lat)) ** 2 + 5 * np.cos(np.deg2rad(lon)) * np.cos(2 * np.pi * t / 365)
        return (base + rng.standard_normal((t1 - t0, ny, nx), dtype=np.float32)).astype(np.float32)

    data = da.map_blocks(block, chunks=((chunk,) * (nt // chunk), (ny,), (nx,)), dtype=np.float32)
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), data, {"units": "K"})},
        coords={"lat": np.linspace(-90, 90, ny), "lon": np.linspace(0, 360, nx, endpoint=False)},
    )
    ds.to_zarr(path, mode="w", zarr_format=3)
    return path


def frames_of(store: Path, name: str = "tas") -> tuple[list[bytes], int]:
    files = sorted(p for p in (store / name / "c").rglob("*") if p.is_file())
    meta = json.loads((store / name / "zarr.json").read_text())
    nbytes = int(np.prod(meta["chunk_grid"]["configuration"]["chunk_shape"])) * np.dtype(meta["data_type"]).itemsize
    return [p.read_bytes() for p in files], nbytes


def timed(fn, repeat=3) -> float:
    fn()
    best = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t)
    return min(best)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1460,721,1440")
    p.add_argument("--chunk", type=int, default=73)
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--batches", default="1,2,4,8,12,16,all",
                   help="frames in one nvCOMP batch, comma-separated (all: every frame)")
    p.add_argument("--quick", action="store_true", help="only cpu_one, cpu_all and the batches")
    p.add_argument("--json")
    a = p.parse_args(argv)
    shape = tuple(int(s) for s in a.shape.split(","))
    t = time.perf_counter()
    store = make_store(Path(a.workdir) / f"split-{'x'.join(map(str, shape))}-{a.chunk}.zarr", shape, a.chunk)
    out: dict = {"store_seconds": time.perf_counter() - t}
    blobs, nbytes = frames_of(store)
    n = len(blobs)
    out.update(frames=n, frame_bytes=nbytes, compressed=sum(map(len, blobs)))

    import numcodecs

    zstd = numcodecs.Zstd()
    host_out = [np.empty(nbytes, np.uint8) for _ in range(n)]
    out["cpu_one"] = timed(lambda: zstd.decode(blobs[0], out=host_out[0]))
    with ThreadPoolExecutor(a.threads) as pool:
        out["cpu_all"] = timed(lambda: list(pool.map(lambda k: zstd.decode(blobs[k], out=host_out[k]), range(n))))

        import cupy as cp
        from nvidia import nvcomp as nv

        sizes = [len(b) for b in blobs]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
        dev = cp.asarray(np.frombuffer(b"".join(blobs), np.uint8))
        dst = cp.empty(n * nbytes, np.uint8)
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(1 if a.quick else n)]
        codecs = [nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=s.ptr) for s in streams]

        def gpu(ks, codec_index=0):
            s = streams[codec_index]
            srcs = nv.as_arrays([dev[offsets[k]:offsets[k] + sizes[k]] for k in ks], s.ptr)
            outs = nv.as_arrays([dst[k * nbytes:(k + 1) * nbytes] for k in ks], s.ptr)
            codecs[codec_index].decode(srcs, out=outs)
            return srcs, outs

        def batch(k):
            keep = gpu(list(range(k)))
            streams[0].synchronize()
            del keep

        ks = {n if k == "all" else int(k) for k in a.batches.split(",")}
        out["gpu_batch"] = {}
        for k in sorted(ks):
            if k <= n:
                try:
                    out["gpu_batch"][k] = timed(lambda k=k: batch(k))
                except Exception as e:  # such as the device's memory: the others are kept
                    out["gpu_batch"][k] = repr(e)
        out["gpu_batch_GBps"] = {k: k * nbytes / s / 1e9 for k, s in out["gpu_batch"].items() if isinstance(s, float)}
        if a.quick:
            print(json.dumps(out, indent=1))
            return out

        def concurrent(k):
            keep = [gpu([j], j) for j in range(k)]
            for s in streams[:k]:
                s.synchronize()
            del keep

        out["gpu_streams"] = {k: timed(lambda k=k: concurrent(k)) for k in sorted({1, 4, 8, n}) if k <= n}

        def split(g):
            keep = gpu(list(range(g))) if g else None
            list(pool.map(lambda k: zstd.decode(blobs[k], out=host_out[k]), range(g, n)))
            streams[0].synchronize()
            del keep

        out["split"] = {g: timed(lambda g=g: split(g)) for g in sorted({0, 2, 4, 6, 8, 10, 12, 14, 16, n}) if g <= n}
        ref = np.frombuffer(zstd.decode(blobs[n - 1]), np.uint8)
        batch(n)
        out["bit_exact"] = bool((cp.asnumpy(dst[(n - 1) * nbytes:]) == ref).all())
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
