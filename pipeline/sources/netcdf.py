"""NetCDF (HDF5) files, opened by xarray through h5netcdf; CF decoding of values is left to :mod:`.cf`.
On the GPU, each variable's chunks are read by :mod:`pipeline.gpu.hdf5` straight to the device."""

from __future__ import annotations

import math
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


def block_chunks(path, target_bytes: int = 0) -> dict:
    """Dask chunks that take as many stored chunks along the first dimension as fit in
    ``target_bytes`` (``{}``, the stored chunks, without a target).

    NetCDF files hold small chunks (often one time step: 4 MB of a 0.25 degree grid); a block of
    one chunk each would give nvCOMP batches of one stream. Where variables of a first dimension
    disagree, the largest variable's blocks are taken; a contiguous variable counts as chunks of
    one step."""
    if not target_bytes:
        return {}
    chunks: dict = {}
    largest: dict = {}  # first dimension -> bytes of the variable that set its blocks
    with xr.open_dataset(path, decode_cf=False) as ds:
        for var in ds.data_vars.values():
            if var.ndim == 0:
                continue
            dim = var.dims[0]
            stored = var.encoding.get("chunksizes") or (1, *var.shape[1:])
            chunk_bytes = math.prod(stored) * var.dtype.itemsize
            if var.nbytes <= largest.get(dim, -1):
                continue
            largest[dim] = var.nbytes
            k = max(1, min(target_bytes // chunk_bytes, math.ceil(var.shape[0] / stored[0])))
            chunks[dim] = stored[0] * k
    return chunks
