"""Blosc chunks decoded by the GPU against numcodecs on N CPU threads.

The store is the common shape of public Zarr v2 archives (ERA5-style): float32 (T, 721, 1440),
chunks of one step (4 MB), numcodecs' Blosc lz4, clevel 5, byte shuffle, written by zarr. Timed
(medians of ``--repeat`` runs after a warm-up, files in memory or in the page cache):

- ``cpu``: numcodecs' Blosc decoding every chunk already in memory, on 1..N threads;
- ``gpu_decode``: every chunk already on the device, decoded in one batch (nvCOMP LZ4 and the
  unshuffle kernel, :func:`pipeline.gpu.blosc.decode_frames`);
- ``gpu_read``: the whole read through Dask (``reader.open_array``, blocks of ``--block-steps``
  chunks): files to pinned memory, to the device, decoded;
- ``zarr_read``: zarr's own read of the whole array to host memory, for reference.

    python benchmarks/blosc_decode.py --steps 73 --threads 1,4,16 --workdir data/bench --json blosc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def make_store(workdir: Path, steps: int, grid: tuple[int, int]) -> Path:
    """The ERA5-style store, written once by zarr with numcodecs' Blosc (lz4, byte shuffle)."""
    import numcodecs
    import zarr

    store = workdir / f"blosc_lz4_{steps}x{grid[0]}x{grid[1]}.zarr"
    if store.exists():
        return store
    arr = zarr.create_array(store, name="t2m", shape=(steps, *grid), chunks=(1, *grid), dtype="f4", zarr_format=2,
                            compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE), fill_value=np.nan)
    lat = np.linspace(-90, 90, grid[0])[:, None]
    lon = np.linspace(0, 2 * np.pi, grid[1])[None, :]
    rng = np.random.default_rng(0)
    for t in range(steps):
        field = 288 - 30 * np.abs(np.sin(np.radians(lat))) + 5 * np.sin(lon + t / 8) + rng.standard_normal(grid)
        arr[t] = field.astype("f4")
    return store


def chunk_files(store: Path) -> list[Path]:
    return sorted(p for p in (store / "t2m").iterdir() if not p.name.startswith("."))


def cpu_decode(blobs: list[bytes], nbytes: int, threads: int, repeat: int) -> float:
    import numcodecs

    outs = [np.empty(nbytes, dtype=np.uint8) for _ in blobs]
    codec = numcodecs.Blosc()

    def run():
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda k: codec.decode(blobs[k], out=outs[k]), range(len(blobs))))

    return median_time(run, repeat)


def gpu_decode(blobs: list[bytes], nbytes: int, repeat: int, check: np.ndarray) -> float:
    import cupy as cp

    from pipeline.gpu import blosc
    from pipeline.gpu.streams import context

    host = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    starts = np.cumsum([0] + [len(b) for b in blobs[:-1]])
    hosts = [host[s:s + len(b)] for s, b in zip(starts, blobs)]
    dev = cp.asarray(host)
    out = cp.empty((len(blobs), nbytes), dtype=np.uint8)

    def run():
        with context() as ctx, ctx.stream:  # leaving it synchronizes the stream
            blosc.decode_frames("bench", hosts, dev, starts, out, np.arange(len(blobs)) * nbytes, nbytes)

    seconds = median_time(run, repeat)
    np.testing.assert_array_equal(out[0].get(), check)
    return seconds


def gpu_read(store: Path, block_steps: int, repeat: int) -> float:
    from pipeline.gpu import reader

    x = reader.open_array(store, "t2m", chunks=(block_steps, -1, -1), nvcomp=True)
    return median_time(lambda: float(x.sum().compute()), repeat)


def zarr_read(store: Path, repeat: int) -> float:
    import zarr

    arr = zarr.open_array(store, path="t2m", mode="r")
    return median_time(lambda: arr[...], repeat)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=73)
    p.add_argument("--grid", default="721,1440")
    p.add_argument("--threads", default="1,4,16")
    p.add_argument("--block-steps", type=int, default=24)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--no-gpu", action="store_true", help="only the CPU timings")
    p.add_argument("--json")
    args = p.parse_args(argv)
    grid = tuple(int(v) for v in args.grid.split(","))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = make_store(workdir, args.steps, grid)
    blobs = [f.read_bytes() for f in chunk_files(store)]
    nbytes = 4 * grid[0] * grid[1]
    total = nbytes * len(blobs)
    out = {"store": str(store), "chunks": len(blobs), "decoded_bytes": total,
           "compressed_bytes": sum(len(b) for b in blobs), "cpu": {}, "zarr_read": zarr_read(store, args.repeat)}
    for n in (int(v) for v in args.threads.split(",")):
        out["cpu"][n] = cpu_decode(blobs, nbytes, n, args.repeat)
    if not args.no_gpu:
        import numcodecs

        check = np.frombuffer(numcodecs.Blosc().decode(blobs[0]), dtype=np.uint8)
        out["gpu_decode"] = gpu_decode(blobs, nbytes, args.repeat, check)
        out["gpu_read"] = gpu_read(store, args.block_steps, args.repeat)
    gbs = {k: total / v / 1e9 for k, v in [*(("cpu_%s" % n, s) for n, s in out["cpu"].items()),
                                             *((k, out[k]) for k in ("zarr_read", "gpu_decode", "gpu_read") if k in out)]}
    out["GB_per_s"] = gbs
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
