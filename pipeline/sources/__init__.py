"""Sources: stores opened as xarray Datasets of Dask arrays on a backend.

One :class:`Format` per kind of store, found by :func:`store_format`. Each opens its store with
xarray, values still packed; :func:`open_dataset` then moves every variable to the backend (on the
GPU, a format may read its chunks straight to the device) and CF-decodes its values there
(:mod:`.cf`). A new kind of store (VCF Zarr, say) is one more entry in ``FORMATS``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import xarray as xr

from .. import backend as B
from ..errors import InputError
from . import netcdf, zarr
from .cf import decode


@dataclass(frozen=True)
class Format:
    """How to open one kind of store.

    ``detect(path) -> name | None`` recognises it; ``open(path, name, chunks)`` opens it with xarray,
    values still packed; ``shard_chunks(path, target_bytes)`` gives Dask chunks that follow its
    shards (or ``{}``); ``device_array(path, variable, chunks)``, where given, reads a variable's
    chunks straight to the GPU.
    """

    detect: Callable[[Path], str | None]
    open: Callable
    shard_chunks: Callable[..., dict] | None = None
    device_array: Callable | None = None


ZARR = Format(zarr.detect, zarr.open_store, zarr._shard_chunks, zarr.device_array)
FORMATS: dict[str, Format] = {"zarr3": ZARR, "zarr2": ZARR, "netcdf": Format(netcdf.detect, netcdf.open_store)}


def is_url(path) -> bool:
    return "://" in str(path)


def store_format(path: str | os.PathLike) -> str:
    """The name of the format of a local store ("zarr3", "zarr2", "netcdf"); raises InputError
    naming the path otherwise."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file or directory")
    for fmt in dict.fromkeys(FORMATS.values()):
        name = fmt.detect(p)
        if name is not None:
            return name
    if p.is_dir():
        raise InputError(f"{path}: a directory but not a Zarr store (no zarr.json, .zgroup or .zarray)")
    raise InputError(
        f"{path}: not a Zarr store or a NetCDF file (expected a directory or one of {netcdf.SUFFIXES})"
    )


def open_dataset(
    path: str | os.PathLike,
    *,
    backend: str | None = None,
    chunks: Mapping[str, int] | str | None = None,
    variables: Iterable[str] | None = None,
    decode_cf: bool = True,
) -> xr.Dataset:
    """Open a Zarr store or NetCDF file as a Dataset of Dask arrays on ``backend``.

    Parameters
    ----------
    path
        A Zarr v2/v3 store (directory, or URL) or a NetCDF file.
    backend
        "auto" (the GPU when one is visible), "cpu" or "gpu"; None reads ``pipeline.backend``.
    chunks
        Dask chunks per dimension; None keeps the store's own chunks (whole shards of a sharded
        store, as many along the first dimension as fit ``pipeline.gpu.block-size`` on the GPU).
    variables
        Data variables to keep (all by default); a missing name raises InputError.
    decode_cf
        Unpack ``scale_factor``/``add_offset`` and mask ``_FillValue``/``missing_value`` on the backend.

    Examples
    --------
    >>> ds = pipeline.open_dataset("data/demo.zarr", backend="cpu")  # doctest: +SKIP
    >>> ds["tas"].data._meta  # doctest: +SKIP
    array([], shape=(0, 0, 0), dtype=float32)
    """
    target = B.resolve(backend)
    name = "zarr3" if is_url(path) else store_format(path)
    fmt = FORMATS[name]
    local = not is_url(path)
    if fmt.shard_chunks is not None and local:
        if chunks is None:
            from ..exec.memory import block_target

            chunks = fmt.shard_chunks(path, block_target(target))
        elif isinstance(chunks, Mapping):
            # dimensions left out take one block per shard, not xarray's choice (the inner chunks)
            chunks = {**fmt.shard_chunks(path), **chunks}
    try:
        ds = fmt.open(path, "url" if not local else name, {} if chunks is None else chunks)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{path}: could not be opened as {name}: {e}") from e
    if variables is not None:
        variables = list(variables)
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise InputError(
                f"{path}: no variable {', '.join(map(repr, missing))} (variables: {', '.join(map(str, ds.data_vars))})"
            )
        ds = ds[variables]
    direct = target == "gpu" and local and fmt.device_array is not None
    for var_name, var in ds.data_vars.items():
        if direct:  # compressed chunks go to the GPU and decode there (pipeline.gpu.reader)
            data = fmt.device_array(path, str(var_name), var.data.chunks)
        else:
            data = B.to_backend(var.data, target)
        attrs, encoding = dict(var.attrs), dict(var.encoding)
        if decode_cf:
            data, attrs, encoding = decode(data, attrs, encoding)
        ds[var_name] = xr.Variable(var.dims, data, attrs, encoding)
    return ds


__all__ = ["FORMATS", "Format", "decode", "is_url", "open_dataset", "store_format"]
