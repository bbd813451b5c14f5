"""A synthetic CF-style climate dataset of any size, deterministic from a seed.

Variables on a regular (time, lat, lon) grid of daily steps:

``tas``        float32 air temperature (K): latitude profile, seasonal cycle, trend and noise;
``sst``        float32 sea surface temperature (K), NaN over a fixed land mask;
``sst_packed`` the same field packed as int16 with ``scale_factor``/``add_offset`` and
               ``_FillValue`` over land, as many archives store it.

Each block is generated from its own seed (the dataset seed, the variable, the block's place), so
blocks are written in parallel and the same arguments always give the same values.
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from dask.utils import parse_bytes

from .errors import InputError
from .sinks.zarr import write_zarr

BYTES_PER_POINT = 4 + 4 + 2  # tas, sst, sst_packed
PACK_SCALE = 0.01
PACK_OFFSET = 273.15
PACK_FILL = np.int16(-32767)
START = "1990-01-01"


def grid_for(size_bytes: int) -> float:
    """Default resolution in degrees: coarse for small datasets, ERA5-like 0.25 for large ones."""
    return 2.5 if size_bytes < 2**30 else 0.25


def _axes(resolution: float):
    nlat = int(round(180 / resolution)) + 1
    nlon = int(round(360 / resolution))
    lat = np.linspace(90.0, -90.0, nlat)
    lon = np.arange(nlon) * resolution
    return lat, lon


def land_mask(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """A fixed, smooth 'continents' mask (True over land)."""
    la, lo = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
    field = np.sin(2 * lo + 0.5) * np.cos(1.5 * la) + 0.5 * np.sin(3 * la + lo)
    return (field > 0.45) | (lat[:, None] < -70)


def _temperature(block_info=None, *, seed: int, var_id: int, lat, lon, noise_scale: float):
    info = block_info[None]
    (t_start, t_stop), (y0, y1), (x0, x1) = info["array-location"]
    rng = np.random.default_rng([seed, var_id, *[loc[0] for loc in info["array-location"]]])
    la = lat[y0:y1][None, :, None]
    days = np.arange(t_start, t_stop, dtype=np.float64)[:, None, None]
    base = 300.0 - 45.0 * np.sin(np.deg2rad(la)) ** 2
    amplitude = 2.0 + 12.0 * np.abs(np.sin(np.deg2rad(la)))
    season = -np.sign(la + 1e-9) * amplitude * np.cos(2 * np.pi * (days - 15.0) / 365.25)
    trend = 0.03 * days / 365.25
    ripple = 1.5 * np.sin(np.deg2rad(lon[x0:x1])[None, None, :] * 3 + days / 50.0)
    noise = rng.standard_normal((t_stop - t_start, y1 - y0, x1 - x0), dtype=np.float32) * noise_scale
    return (base + season + trend + ripple).astype(np.float32) + noise


def demo_dataset(
    size: str | int = "64MB",
    *,
    seed: int = 0,
    resolution: float | None = None,
    time_chunk: int = 73,
) -> xr.Dataset:
    """The demo dataset as a lazy Dataset (nothing is generated until it is computed or written).

    ``size`` is the total of the three variables, uncompressed; the number of daily time steps
    follows from it and the grid. Chunks hold ``time_chunk`` steps of the whole grid.
    """
    size_b = nbytes_of(size)
    if size_b <= 0:
        raise InputError(f"size must be positive, got {size!r}")
    resolution = resolution or grid_for(size_b)
    lat, lon = _axes(resolution)
    npts = lat.size * lon.size
    nt = max(2, size_b // (BYTES_PER_POINT * npts))
    chunks = (max(1, min(nt, int(time_chunk))), lat.size, lon.size)
    shape = (nt, lat.size, lon.size)
    time = pd.date_range(START, periods=nt, freq="D")

    block_chunks = da.core.normalize_chunks(chunks, shape)

    def field(var_id: int, noise: float) -> da.Array:
        return da.map_blocks(
            _temperature, chunks=block_chunks, dtype=np.float32, meta=np.empty((0, 0, 0), np.float32),
            seed=seed, var_id=var_id, lat=lat, lon=lon, noise_scale=noise,
        )

    land = land_mask(lat, lon)
    tas = field(0, 2.0)
    sst = da.where(land[None], np.float32(np.nan), field(1, 0.5) * np.float32(0.4) + np.float32(180.0))
    ocean = da.where(land[None], np.float32(PACK_OFFSET), sst)  # no NaN reaches the int cast
    packed = da.where(land[None], PACK_FILL, da.round((ocean - PACK_OFFSET) / PACK_SCALE).astype(np.int16))
    coords = {
        "time": ("time", time),
        "lat": ("lat", lat, {"standard_name": "latitude", "units": "degrees_north"}),
        "lon": ("lon", lon, {"standard_name": "longitude", "units": "degrees_east"}),
    }
    dims = ("time", "lat", "lon")
    ds = xr.Dataset(
        {
            "tas": (dims, tas, {"standard_name": "air_temperature", "units": "K", "long_name": "Near-surface air temperature"}),
            "sst": (dims, sst, {"standard_name": "sea_surface_temperature", "units": "K", "long_name": "Sea surface temperature"}),
            "sst_packed": (
                dims,
                packed,
                {
                    "standard_name": "sea_surface_temperature",
                    "units": "K",
                    "long_name": "Sea surface temperature, packed as int16",
                    "scale_factor": PACK_SCALE,
                    "add_offset": PACK_OFFSET,
                    "_FillValue": PACK_FILL,
                },
            ),
        },
        coords=coords,
        attrs={
            "title": "pipeline synthetic climate demo",
            "Conventions": "CF-1.10",
            "source": f"pipeline.demo, seed={seed}",
        },
    )
    return ds


def write_demo(
    path: str | os.PathLike,
    size: str | int = "64MB",
    *,
    seed: int = 0,
    resolution: float | None = None,
    time_chunk: int = 73,
    overwrite: bool = False,
    progress: bool = False,
):
    """Generate the demo dataset and write it as a Zarr v3 store, in parallel, all or nothing.

    ``overwrite`` replaces only a demo store pipeline wrote (anything else at ``path`` is refused,
    untouched). ``progress`` says what is written where, and shows dask's progress bar (stderr).
    """
    ds = demo_dataset(size, seed=seed, resolution=resolution, time_chunk=time_chunk)
    # packing attributes are encodings for the writer: the int16 values are stored as they are
    ds["sst_packed"].attrs = {k: v for k, v in ds["sst_packed"].attrs.items() if k != "_FillValue"}
    encoding = {"sst_packed": {"_FillValue": PACK_FILL}}
    if progress:
        import sys

        from dask.utils import format_bytes

        shape = " x ".join(map(str, ds["tas"].shape))
        print(f"writing the demo dataset, {format_bytes(ds.nbytes)} ({shape} time x lat x lon), to {path}", file=sys.stderr)
    return write_zarr(ds, path, mode="overwrite" if overwrite else "fail", encoding=encoding, kind="demo", progress=progress)


def nbytes_of(size: str | int) -> int:
    return parse_bytes(size) if isinstance(size, str) else int(size)


__all__ = ["demo_dataset", "write_demo", "land_mask", "grid_for"]
