"""How fast `pipeline convert` rewrites a store as the ecosystem writes it.

The input is what ``xarray.Dataset.to_zarr`` writes with its defaults: Zarr v3, zarr's default
``ZstdCodec(level=0)``, one chunk per Dask block (73 steps of a 0.25 degree grid on the GPU
machine: 303 MB a chunk). It is built once (smooth fields plus noise, rounded to 0.01 K, so that
zstd finds what it finds in real data) and reused. Each path is timed on it, and its output read
back with plain zarr and compared with the input:

- ``api``: ``pipeline.sinks.convert.convert`` in this process (imports already paid);
- ``cli``: ``python -m pipeline convert`` in a fresh process, imports included;
- ``zarr``: the reference, xarray and dask writing the same layout through zarr's own sharding
  codec (``to_zarr`` with ``shards``), with no manifest or digests.

``--backends cpu,gpu`` times ``api`` and ``cli`` with the frames compressed on each (``api-cpu``,
``api-gpu``, ...). Figures are GB/s of uncompressed values (bytes of the array over seconds).

    python benchmarks/convert_speed.py --shape 1460,721,1440 --workdir data/bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PATHS = ("api", "cli", "zarr")


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children: on a shared host, what a path costs
    whatever the other loads."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def _field(block, block_info=None):
    """One chunk of a smooth field plus noise, deterministic from its position."""
    loc = block_info[None]["array-location"]
    shape = block_info[None]["chunk-shape"]
    t = np.arange(*loc[0], dtype="f4")[:, None, None]
    y = np.linspace(-1, 1, block_info[None]["shape"][1], dtype="f4")[slice(*loc[1])][None, :, None]
    x = np.linspace(0, 2 * np.pi, block_info[None]["shape"][2], dtype="f4")[slice(*loc[2])][None, None, :]
    rng = np.random.default_rng(loc[0][0])
    values = 280 + 30 * np.cos(np.pi * y / 2) + 5 * np.sin(x + t / 58) + rng.standard_normal(shape, dtype="f4")
    return np.round(values, 2)


def build_store(path: Path, shape: tuple[int, int, int], time_chunk: int) -> Path:
    """The input, as ``to_zarr`` writes it by default; reused when it exists with this shape."""
    import dask.array as da
    import xarray as xr
    import zarr

    if path.exists():
        try:
            if tuple(zarr.open_group(path, mode="r")["tas"].shape) == shape:
                return path
        except Exception:
            pass
        shutil.rmtree(path)
    data = da.empty(shape, dtype="f4", chunks=(time_chunk, *shape[1:])).map_blocks(_field, dtype="f4")
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), data, {"units": "K"})},
        coords={"time": np.arange(shape[0]), "lat": np.linspace(-90, 90, shape[1]), "lon": np.linspace(0, 360, shape[2], endpoint=False)},
    )
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    return path


def _same(src: Path, dst: Path) -> bool:
    """The output, read back by plain zarr, equals the input, chunk by chunk."""
    import zarr

    a, b = zarr.open_group(src, mode="r")["tas"], zarr.open_group(dst, mode="r")["tas"]
    step = a.chunks[0]
    return a.shape == b.shape and all(np.array_equal(a[i:i + step], b[i:i + step]) for i in range(0, a.shape[0], step))


def _drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def time_api(src: Path, dst: Path, level: int | None, backend: str) -> float:
    from pipeline.sinks.convert import convert

    t = time.perf_counter()
    convert(src, dst, backend=backend, **({} if level is None else {"level": level}))
    return time.perf_counter() - t


def time_cli(src: Path, dst: Path, level: int | None, backend: str) -> float:
    t = time.perf_counter()
    extra = ["--backend", backend] + ([] if level is None else ["--level", str(level)])
    # run from the store's directory: ``-m`` puts the working directory first on the path, where
    # a checkout would shadow the pipeline that PYTHONPATH names
    subprocess.run([sys.executable, "-m", "pipeline", "convert", str(src), str(dst), "--no-progress", *extra],
                   check=True, capture_output=True, cwd=src.parent)
    return time.perf_counter() - t


def time_zarr(src: Path, dst: Path, level: int | None, backend: str) -> float:
    """The same layout written by xarray and zarr's sharding codec alone."""
    import xarray as xr
    from zarr.codecs import ZstdCodec

    from pipeline.sinks.convert import inner_chunk

    t = time.perf_counter()
    ds = xr.open_zarr(src, decode_cf=False, consolidated=False)
    var = ds["tas"]
    shard = tuple(c[0] for c in var.data.chunks)
    for v in ds.variables.values():
        v.encoding = {}
    enc = {"tas": {"shards": shard, "chunks": inner_chunk(shard, 4, 1 << 20), "compressors": [ZstdCodec(level=level or 0)]}}
    ds.to_zarr(dst, mode="w", zarr_format=3, consolidated=False, encoding=enc)
    return time.perf_counter() - t


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="146,181,360", help="time,lat,lon of tas (float32)")
    p.add_argument("--time-chunk", type=int, default=73)
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--paths", default=",".join(PATHS), help=f"some of {','.join(PATHS)}")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--backends", default="auto", help="where convert compresses, each timed: some of auto,cpu,gpu")
    p.add_argument("--level", type=int, default=None, help="zstd level (default: convert's; zarr's 0 for the zarr path)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split(","))
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = build_store(work / f"tas_{'x'.join(map(str, shape))}_t{args.time_chunk}_default.zarr", shape, args.time_chunk)
    nbytes = int(np.prod(shape)) * 4
    timers = {"api": time_api, "cli": time_cli, "zarr": time_zarr}
    out = {"shape": shape, "time_chunk": args.time_chunk, "level": args.level, "bytes": nbytes, "cpus": os.cpu_count(), "paths": {}}
    runs = [(p, b) for p in args.paths.split(",") for b in (args.backends.split(",") if p != "zarr" else ["cpu"])]
    for path, backend in runs:
        name = path if path == "zarr" else f"{path}-{backend}"
        dst = work / f"convert_speed_{name}.zarr"
        seconds, cpu = [], []
        for _ in range(args.repeat):
            _drop(dst)
            c = _cpu_seconds()
            seconds.append(timers[path](src, dst, args.level, backend))
            cpu.append(_cpu_seconds() - c)
        best = min(seconds)
        stored = sum(f.stat().st_size for f in (dst / "tas").rglob("*") if f.is_file())
        out["paths"][name] = {"seconds": seconds, "cpu_seconds": cpu, "gb_per_s": nbytes / best / 1e9, "equal": _same(src, dst),
                              "ratio": nbytes / stored}
        print(f"{name:9s} {best:7.2f} s  {nbytes / best / 1e9:6.2f} GB/s  ({', '.join(f'{s:.2f}' for s in seconds)} s; "
              f"CPU {min(cpu) / (nbytes / 1e9):.1f} s/GB; ratio {out['paths'][name]['ratio']:.2f})  "
              f"equal={out['paths'][name]['equal']}", flush=True)
        _drop(dst)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
