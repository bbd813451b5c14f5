"""The same ``tas`` in the three layouts users have, each written by the tool that writes it:

- ``v3-default.zarr``: ``xarray.Dataset.to_zarr`` with its defaults (Zarr v3, zarr's default zstd,
  one frame per chunk of ``--chunk`` steps);
- ``v2-blosc.zarr``: Zarr v2 as public ERA5-style archives hold it: numcodecs Blosc lz4 with byte
  shuffle, one time step a chunk;
- ``zlib.nc``: NetCDF4 as climate models write it: zlib level 4 with the shuffle filter, one time
  step a chunk. The file is laid out by h5netcdf; the chunks are compressed in parallel (zlib and
  NumPy's shuffle) and written with h5py's ``write_direct_chunk``, bytes identical to what HDF5's
  own filters write, so that a 6 GB file takes seconds rather than minutes.

Values: a smooth field with a seasonal cycle plus noise, float32, deterministic from ``--seed``;
daily time from 2000-01-01. Stores are reused while they exist.

    python benchmarks/user_stores.py --shape 1460,721,1440 --workdir data/bench
"""

from __future__ import annotations

import argparse
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def field(t0: int, t1: int, ny: int, nx: int, seed: int) -> np.ndarray:
    t = np.arange(t0, t1, dtype=np.float32)[:, None, None]
    lat = np.linspace(-90, 90, ny, dtype=np.float32)[None, :, None]
    lon = np.linspace(0, 360, nx, endpoint=False, dtype=np.float32)[None, None, :]
    base = 288 - 30 * np.sin(np.deg2rad(lat)) ** 2 + 5 * np.cos(np.deg2rad(lon)) * np.cos(2 * np.pi * t / 365)
    # the noise of each step from its own seed: the same values whatever the chunks
    noise = np.stack([np.random.default_rng(seed + k).standard_normal((ny, nx), dtype=np.float32) for k in range(t0, t1)])
    return (base + noise).astype(np.float32)


def dataset(shape, chunk: int, seed: int):
    import dask.array as da
    import pandas as pd
    import xarray as xr

    nt, ny, nx = shape
    sizes = (chunk,) * (nt // chunk) + ((nt % chunk,) if nt % chunk else ())

    def block(block_info=None):
        (t0, t1), _, _ = block_info[None]["array-location"]
        return field(t0, t1, ny, nx, seed)

    data = da.map_blocks(block, chunks=(sizes, (ny,), (nx,)), dtype=np.float32)
    return xr.Dataset(
        {"tas": (("time", "lat", "lon"), data, {"units": "K", "standard_name": "air_temperature"})},
        coords={
            "time": pd.date_range("2000-01-01", periods=nt, freq="D"),
            "lat": ("lat", np.linspace(-90, 90, ny), {"units": "degrees_north"}),
            "lon": ("lon", np.linspace(0, 360, nx, endpoint=False), {"units": "degrees_east"}),
        },
    )


def v3_default(path: Path, shape, chunk: int, seed: int) -> None:
    dataset(shape, chunk, seed).to_zarr(path, mode="w", zarr_format=3)


def v2_blosc(path: Path, shape, seed: int) -> None:
    import numcodecs

    ds = dataset(shape, 1, seed)
    enc = {"tas": {"compressors": [numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)], "chunks": (1, *shape[1:])}}
    ds.to_zarr(path, mode="w", zarr_format=2, encoding=enc)


def netcdf_zlib(path: Path, shape, seed: int, level: int = 4) -> None:
    import h5netcdf

    nt, ny, nx = shape
    tmp = path.with_suffix(".partial.nc")
    with h5netcdf.File(tmp, "w") as f:
        f.dimensions = {"time": nt, "lat": ny, "lon": nx}
        days = f.create_variable("time", ("time",), "f8")
        days[:] = np.arange(nt, dtype="f8")
        days.attrs.update(units="days since 2000-01-01", calendar="proleptic_gregorian")
        for name, n, lo, hi, units in (("lat", ny, -90, 90, "degrees_north"), ("lon", nx, 0, 360, "degrees_east")):
            v = f.create_variable(name, (name,), "f8")
            v[:] = np.linspace(lo, hi, n, endpoint=name == "lat")
            v.attrs["units"] = units
        tas = f.create_variable("tas", ("time", "lat", "lon"), "f4", chunks=(1, ny, nx),
                                compression="gzip", compression_opts=level, shuffle=True)
        tas.attrs.update(units="K", standard_name="air_temperature")
        dset = tas._h5ds

        def encode(t):
            raw = field(t, t + 1, ny, nx, seed).view(np.uint8).reshape(-1, 4)
            return t, zlib.compress(np.ascontiguousarray(raw.T).tobytes(), level)  # shuffle, then deflate

        with ThreadPoolExecutor() as pool:
            for t, blob in pool.map(encode, range(nt)):
                dset.id.write_direct_chunk((t, 0, 0), blob)
    tmp.rename(path)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1460,721,1440")
    p.add_argument("--chunk", type=int, default=73)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--only", default="v3-default,v2-blosc,zlib")
    a = p.parse_args(argv)
    shape = tuple(int(s) for s in a.shape.split(","))
    root = Path(a.workdir) / "x".join(map(str, shape))
    root.mkdir(parents=True, exist_ok=True)
    makers = {
        "v3-default": (root / "v3-default.zarr", lambda path: v3_default(path, shape, a.chunk, a.seed)),
        "v2-blosc": (root / "v2-blosc.zarr", lambda path: v2_blosc(path, shape, a.seed)),
        "zlib": (root / "zlib.nc", lambda path: netcdf_zlib(path, shape, a.seed)),
    }
    out = {}
    for name in filter(None, a.only.split(",")):  # "": none (a genomics store alone)
        path, make = makers[name]
        t = time.perf_counter()
        if not path.exists():
            make(path)
        out[name] = str(path)
        print(f"{name}: {path} ({time.perf_counter() - t:.1f} s)", flush=True)
    return out


if __name__ == "__main__":
    main()
