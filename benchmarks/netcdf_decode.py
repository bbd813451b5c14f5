"""A NetCDF4 file as climate models write it (float32 tas, zlib level 4 + shuffle), read whole.

Writes (or reuses) one file per chunking, ``(1, ny, nx)`` and ``(73, ny, nx)`` by default, through
xarray's h5netcdf engine, then times in one process, each a median of ``--repeat`` runs after a
first (cold-process) run that is reported apart:

- ``gpu``: :func:`pipeline.gpu.hdf5.device_array` over blocks of whole chunks as
  ``pipeline.open_dataset`` takes them on the GPU (``pipeline.gpu.block-size``): chunks read from
  their byte ranges, inflated by nvCOMP, unshuffled on the device;
- ``open_dataset-gpu``: the same through ``pipeline.open_dataset(backend="gpu")`` (with CF decoding);
- ``xarray-cpu``: ``xr.open_dataset(chunks=...)`` computed by dask's threads, with the stored
  chunks and with the GPU's blocks (the fastest is the CPU peer);
- ``h5py-threads``: h5py reading the stored chunks from a pool of threads.

Each computes one value per block (no block is kept), so the time is the read and the decode.
GB/s counts the decoded bytes.

    python benchmarks/netcdf_decode.py --steps 1460 --workdir data/bench --json netcdf.json
    python benchmarks/netcdf_decode.py --steps 6 --ny 20 --nx 30 --repeat 1     # a quick try
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def ensure_file(workdir: Path, shape: tuple[int, int, int], chunk_steps: int) -> Path:
    """The NetCDF4 file of ``shape`` in chunks of ``chunk_steps`` whole grids, written once."""
    import xarray as xr

    nt, ny, nx = shape
    path = workdir / f"tas_{nt}x{ny}x{nx}_c{chunk_steps}.nc"
    if path.exists():
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    lat = np.linspace(-90, 90, ny, dtype=np.float32)
    lon = np.linspace(0, 360, nx, endpoint=False, dtype=np.float32)
    base = (288 - 40 * np.sin(np.deg2rad(lat))[:, None] ** 2 + 3 * np.cos(np.deg2rad(lon))[None, :]).astype(np.float32)
    rng = np.random.default_rng(0)
    steps = max(1, min(nt, (256 << 20) // (ny * nx * 4)))  # written a slab at a time
    tmp = path.with_suffix(".tmp.nc")
    enc = {"tas": {"zlib": True, "complevel": 4, "shuffle": True, "chunksizes": (chunk_steps, ny, nx)}}
    for t0 in range(0, nt, steps):
        k = min(steps, nt - t0)
        season = 10 * np.sin(2 * np.pi * (t0 + np.arange(k)) / 365.25)[:, None, None]
        noise = rng.standard_normal((k, ny, nx), dtype=np.float32)
        slab = np.round(base + season + noise, 2).astype(np.float32)  # model output: a few digits
        if t0 == 0:
            first = xr.Dataset({"tas": (("time", "lat", "lon"), slab, {"units": "K"})},
                               coords={"time": np.arange(k), "lat": lat, "lon": lon})
            first.to_netcdf(tmp, engine="h5netcdf", encoding=enc, unlimited_dims=["time"])
        else:
            _append(tmp, slab)
    os.replace(tmp, path)
    return path


def _append(path: Path, slab: np.ndarray) -> None:
    """Steps appended along the unlimited time dimension, as a model writes its output."""
    import h5netcdf

    with h5netcdf.File(path, "a") as f:
        var = f["tas"]
        t0 = var.shape[0]
        f.resize_dimension("time", t0 + len(slab))
        var[t0:] = slab
        f["time"][t0:] = np.arange(t0, t0 + len(slab))


def one_value_per_block(arr):
    """A Dask array of one value per block: computing it reads every block and keeps none."""
    return arr.map_blocks(lambda b: b[:1, :1, :1], chunks=tuple((1,) * len(c) for c in arr.chunks))


def timed(fn, repeat: int) -> dict:
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"first_s": first, "median_s": statistics.median(times) if times else first}


def h5py_threads(path: Path, threads: int) -> None:
    import h5py

    with h5py.File(path, "r") as f:
        dset = f["tas"]
        c0 = dset.chunks[0]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda t: dset[t:t + c0].ravel()[:1], range(0, dset.shape[0], c0)))


def measure(path: Path, repeat: int, threads: int, gpu: bool) -> dict:
    import dask
    import xarray as xr

    from pipeline.exec.memory import block_target
    from pipeline.sources import netcdf

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        nbytes, stored = ds["tas"].nbytes, ds["tas"].encoding["chunksizes"][0]
    blocks = netcdf.block_chunks(path, block_target("gpu")).get("time", stored) if gpu else stored * 8
    rows: dict = {}

    def xarray_cpu(steps):
        with xr.open_dataset(path, engine="h5netcdf", chunks={"time": steps}) as ds:
            one_value_per_block(ds["tas"].data).compute(scheduler="threads", num_workers=threads)

    rows[f"xarray-cpu (chunks {stored})"] = timed(lambda: xarray_cpu(stored), repeat)
    rows[f"xarray-cpu (chunks {blocks})"] = timed(lambda: xarray_cpu(blocks), repeat)
    rows["h5py-threads"] = timed(lambda: h5py_threads(path, threads), repeat)
    if gpu:
        import pipeline
        from pipeline.gpu import hdf5

        def gpu_read():
            arr = hdf5.device_array(path, "tas", chunks=(blocks, -1, -1))
            one_value_per_block(arr).compute(scheduler="threads", num_workers=threads)

        def open_dataset_gpu():
            ds = pipeline.open_dataset(path, backend="gpu")
            one_value_per_block(ds["tas"].data).compute(scheduler="threads", num_workers=threads)

        with dask.config.set({"pipeline.gpu.threads": threads}):
            rows[f"gpu (blocks {blocks})"] = timed(gpu_read, repeat)
            rows["open_dataset-gpu"] = timed(open_dataset_gpu, repeat)
    for row in rows.values():
        row["GB/s"] = nbytes / row["median_s"] / 1e9
    cpu_best = max(r["GB/s"] for k, r in rows.items() if "cpu" in k or "h5py" in k)
    for k, row in rows.items():
        row["x_cpu_peer"] = row["GB/s"] / cpu_best
    return {"file": str(path), "bytes": int(nbytes), "file_bytes": path.stat().st_size, "rows": rows}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1460)
    p.add_argument("--ny", type=int, default=721)
    p.add_argument("--nx", type=int, default=1440)
    p.add_argument("--chunk-steps", default="1,73", help="comma-separated steps a chunk, one file each")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--json")
    args = p.parse_args(argv)

    from pipeline import backend as B

    gpu = B.gpu_available()
    shape = (args.steps, args.ny, args.nx)
    out = {"shape": shape, "threads": args.threads, "gpu": gpu, "files": []}
    for c in (int(s) for s in args.chunk_steps.split(",")):
        path = ensure_file(Path(args.workdir), shape, min(c, args.steps))
        result = measure(path, args.repeat, args.threads, gpu)
        out["files"].append(result)
        print(f"--- {path.name}: {result['bytes'] / 1e9:.2f} GB decoded, {result['file_bytes'] / 1e9:.2f} GB stored")
        for name, row in result["rows"].items():
            print(f"{name:32s} first {row['first_s']:7.3f} s  median {row['median_s']:7.3f} s  "
                  f"{row['GB/s']:7.2f} GB/s  x{row['x_cpu_peer']:.1f} of the CPU peer")
    if not gpu:
        print("(no GPU visible: GPU rows skipped)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
