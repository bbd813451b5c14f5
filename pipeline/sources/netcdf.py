"""NetCDF (HDF5) files, opened by xarray through h5netcdf; CF decoding of values is left to :mod:`.cf`.
On the GPU, each variable's chunks are read by :mod:`pipeline.gpu.hdf5` straight to the device."""

from __future__ import annotations

from pathlib import Path

import xarray as xr

SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5", ".hdf5", ".cdf")


def detect(path: Path) -> str | None:
    return "netcdf" if path.is_file() and path.suffix.lower() in SUFFIXES else None


def open_store(path, fmt: str, chunks, **decoding) -> xr.Dataset:
    """The file as xarray opens it, with xarray's ``decoding`` options (``mask_and_scale``...)."""
    return xr.open_dataset(path, chunks=chunks, **decoding)


def device_array(path, name: str, chunks):
    """A Dask array of CuPy chunks whose deflate streams are inflated on the GPU."""
    from ..gpu import hdf5

    return hdf5.device_array(path, name, chunks=chunks)
