"""Where the time goes between a Zarr store and the GPU, stage by stage, and each read path whole.

On one store (tas float32, chunks of 73 steps of the whole grid, zarr's default zstd) and on its
GPU layout (``pipeline convert``: shards of the same chunks, ~1 MB zstd frames inside):

- ``files``: reading every chunk file into pinned host memory (pipeline's I/O thread pool);
- ``h2d``: copying those compressed bytes to the device (pinned, one copy per file);
- ``decode``: nvCOMP decoding every frame already on the device, into place;
- whole paths through Dask (``x.sum()`` computed, threads scheduler): the naive one
  (``xr.open_zarr`` + ``map_blocks(cupy.asarray)``), zarr into pinned memory (``staged``), and
  nvCOMP (``gpu``), on each layout.

Medians of ``--repeat`` runs after a warm-up; the store stays in the page cache (warm reads).

    python benchmarks/read_paths.py --shape 1460,721,1440 --workdir data/bench --json read.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def median_time(fn, repeat, values=None):
    """Median seconds of ``repeat`` calls of ``fn`` after a warm-up; its last value goes to ``values``."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    if values is not None:
        values.append(value)
    return statistics.median(times)


def make_store(workdir: Path, shape, store: str | None = None, inner: str = "1MB") -> tuple[Path, Path]:
    """The plain store (the one ``peers.py`` generates and reuses, or ``store``) and its GPU layout
    with frames of about ``inner``."""
    import xarray as xr

    from peers import ensure_store
    from pipeline.sinks.convert import convert

    plain = Path(store) if store else ensure_store(workdir, tuple(shape), 73, 0)[0]
    suffix = "" if inner == "1MB" else f"_{inner}"
    fast = plain.with_name(plain.stem + f"_sharded{suffix}.zarr")  # the name peers.py gives the 1MB one
    if not fast.exists():
        convert(plain, fast, inner_bytes=inner)
    xr.open_zarr(plain)  # metadata readable
    return plain, fast


def stages(store: Path, repeat: int) -> dict:
    """Time each stage of the nvCOMP path alone, over the whole array, one file at a time."""
    import cupy as cp
    import cupyx

    from pipeline.gpu import nvcomp, streams
    from pipeline.gpu import reader

    lay = reader.layout(store / "tas")
    files = sorted(p for p in (store / "tas").rglob("*") if p.is_file() and p.name != "zarr.json")
    sizes = [p.stat().st_size for p in files]
    hosts = [cupyx.empty_pinned(s, dtype=np.uint8) for s in sizes]
    devs = [cp.empty(s, dtype=np.uint8) for s in sizes]
    outs = [cp.empty(lay.chunk, dtype=lay.dtype) for _ in files]

    def read():
        for p, s, h in zip(files, sizes, hosts):
            reader.read_files([str(p)], [s], h)

    def h2d():
        for h, d in zip(hosts, devs):
            d.set(h)
        cp.cuda.Device().synchronize()

    def decode():
        with streams.context():  # synchronizes on exit
            for d, o, (offsets, fsizes, present) in zip(devs, outs, plans):
                nvcomp._decode_frames(d, offsets, fsizes, o, present * lay.inner_nbytes, lay.inner_nbytes)

    read()
    for p, h in zip(files, hosts):  # the bytes read are the file's
        ref = np.fromfile(p, dtype=np.uint8)
        if not np.array_equal(ref, h):
            bad = np.flatnonzero(ref != h)
            raise AssertionError(f"{p}: {bad.size} bytes read wrong, first at {bad[0]} of {ref.size}")
    plans = [reader.frames(lay, h) for h in hosts]
    h2d()
    frames = sum(len(p[0]) for p in plans)
    if max(int(s.max()) for _, s, _ in plans) > reader.NVCOMP_MAX_FRAME:  # pipeline decodes these on the CPU
        return {"compressed_bytes": sum(sizes), "frames": frames, "files_s": median_time(read, repeat),
                "h2d_s": median_time(h2d, repeat), "decode_s": float("nan")}
    decode()
    return {
        "compressed_bytes": sum(sizes),
        "frames": frames,
        "files_s": median_time(read, repeat),
        "h2d_s": median_time(h2d, repeat),
        "decode_s": median_time(decode, repeat),
    }


def paths(store: Path, repeat: int, which=("naive", "staged", "gpu"), threads=()) -> dict:
    import cupy as cp
    import xarray as xr

    from pipeline.gpu import reader
    from pipeline.exec.compute import compute

    def naive():
        x = xr.open_zarr(store)["tas"].data.map_blocks(cp.asarray)
        return float(compute(x.sum(dtype=np.float64)))

    def ours(nvcomp):
        def run():
            x = reader.open_array(store, "tas", nvcomp=nvcomp)
            return float(compute(x.sum(dtype=np.float64)))

        return run

    out = {}
    values = {}
    for name, fn in (("naive", naive), ("staged", ours(False)), ("gpu", ours(True))):
        if name not in which:
            out[f"{name}_s"] = float("nan")
            continue
        got = []
        out[f"{name}_s"] = median_time(fn, repeat, got)
        values[name] = got[0]
    import dask

    for n in threads:  # the nvCOMP path with other numbers of Dask threads
        with dask.config.set({"pipeline.gpu.threads": n}):
            got = []
            out[f"gpu_threads{n}_s"] = median_time(ours(True), repeat, got)
            values[f"gpu_threads{n}"] = got[0]
    ref = next(iter(values.values()))
    out["agree"] = all(abs(v - ref) <= 1e-9 * abs(ref) for v in values.values())
    return out


def flow_parts(store: Path, repeat: int) -> dict:
    """The standardized-anomaly flow of ``peers.py`` in growing parts, on the nvCOMP path: where
    the time goes past the read."""
    import dask

    import pipeline
    from peers import pl_monthly_anomaly, pl_standardized_anomaly
    from pipeline import kernels
    from pipeline.exec.compute import compute
    from pipeline.reduce.aggregation import nanmean_std

    with dask.config.set({"pipeline.gpu.nvcomp": True}):
        x = pipeline.open_dataset(store, backend="gpu")["tas"]
        parts = {
            "read_sum": lambda: compute(x.data.sum(dtype=np.float64)),
            "moments": lambda: compute(list(nanmean_std(x.data, 0, kernel=kernels.get("moments", "gpu")))),
            "standardized_anomaly": lambda: compute(list(pl_standardized_anomaly(x))),
            "monthly_anomaly": lambda: compute(list(pl_monthly_anomaly(x))),
        }
        return {f"{k}_s": median_time(fn, repeat) for k, fn in parts.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1460,721,1440")
    ap.add_argument("--workdir", default="data/bench")
    ap.add_argument("--store", help="an existing store with a tas variable (default: generate one of --shape)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--paths", default="naive,staged,gpu", help="whole read paths to time")
    ap.add_argument("--inner-chunks", default="1MB", help="frame sizes of the GPU layouts to compare")
    ap.add_argument("--threads", default="", help="also time the nvCOMP path with these numbers of Dask threads")
    ap.add_argument("--parts", action="store_true", help="also time the standardized-anomaly flow in parts")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    inners = args.inner_chunks.split(",")
    stores = {}
    for inner in inners:
        plain, stores[f"sharded_{inner}"] = make_store(workdir, shape, args.store, inner)
    import xarray as xr

    shape = xr.open_zarr(plain)["tas"].shape
    nbytes = int(np.prod(shape)) * 4
    result = {"shape": shape, "bytes": nbytes, "prepare_s": time.perf_counter() - t}
    print(f"stores ready in {result['prepare_s']:.1f} s", flush=True)
    threads = [int(n) for n in args.threads.split(",") if n]
    for label, store in (("plain", plain), *stores.items()):
        try:
            r = stages(store, args.repeat)
            print(f"{label} stages: {r}", flush=True)
            r.update(paths(store, args.repeat, args.paths.split(","), threads if label != "plain" else ()))
            if args.parts and label != "plain":
                r.update(flow_parts(store, args.repeat))
        except Exception as e:  # report it, and go on with the other layouts
            print(f"{label}: FAILED {type(e).__name__}: {e}", flush=True)
            result[label] = {"error": f"{type(e).__name__}: {e}"}
            continue
        result[label] = r
        print(f"{label}: {r['compressed_bytes'] / 1e9:.2f} GB compressed in {r['frames']} frames")
        for k in [k for k in r if k.endswith("_s")]:
            print(f"  {k[:-2]:>14}: {r[k]:.3f} s  {nbytes / r[k] / 1e9:7.1f} GB/s (uncompressed)")
        print(f"  results agree: {r['agree']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
