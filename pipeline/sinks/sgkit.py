"""sgkit's ``save_dataset`` (``io/dataset.py``), exposed as ``pipeline.genomics.save_dataset``.

It writes what sgkit writes (``Dataset.to_zarr``, Zarr format 2 by default), but all or nothing
and never over what pipeline did not write: a local path is written beside its target and renamed
into place once complete (:func:`pipeline.sinks.zarr.staged`). An existing path is refused unless
sgkit's own ``mode="w"`` is given, and then replaced only where it is a dataset pipeline saved.
Other stores (a mapping, a URL) and other modes (``"a"``, ``"r+"``, ``append_dim``, ``region``)
go to ``to_zarr`` as in sgkit. Data on the GPU goes to the host block by block as it is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xarray as xr

from ..backend import backend_of, to_backend, to_numpy
from ..errors import InputError
from ..sources import is_url
from .zarr import _stale_reservation, staged

KIND = "genomics-dataset"  # the kind of store save_dataset writes (what it may replace)


def _on_host(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with every variable's data in host memory: Dask arrays of CuPy chunks move block by
    block when written, CuPy arrays now."""
    for name, var in ds.variables.items():
        if backend_of(var.data) == "gpu":
            data = to_backend(var.data, "cpu") if hasattr(var.data, "__dask_graph__") else to_numpy(var.data)
            ds[name] = var.copy(data=data)
    return ds


CODEC_KEYS = ("compressor", "compressors", "filters", "serializer")


def _codec_format(codec) -> int | None:
    """The Zarr format a codec object is written in (2: numcodecs', 3: zarr's), None if unknown."""
    from numcodecs.abc import Codec
    from zarr.abc.codec import BaseCodec

    return 3 if isinstance(codec, BaseCodec) else 2 if isinstance(codec, Codec) else None


def _codecs_of_format(encoding: dict, zarr_format: int) -> None:
    """Drop from ``encoding`` the codecs of the other Zarr format (a dataset read from a store of
    format 3 written as format 2, the default, or the reverse), which zarr refuses; zarr's
    default compression then applies."""
    if zarr_format == 2:
        encoding.pop("serializer", None)  # format 3's own
    for key in CODEC_KEYS:
        value = encoding.get(key)
        codecs = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        if any(_codec_format(c) not in (None, zarr_format) for c in codecs):
            encoding.pop(key)


def _uneven(ds: xr.Dataset) -> bool:
    """Whether ``ds``'s chunks are ones Zarr cannot take (xarray's test, as sgkit uses it)."""
    return any(len(set(c[:-1])) > 1 or c[0] < c[-1] for c in ds.chunks.values())


def _to_zarr(ds: xr.Dataset, store, storage_options, kwargs) -> None:
    if storage_options is not None:
        kwargs["storage_options"] = storage_options
    try:
        ds.to_zarr(store, **kwargs)
    except ValueError as e:
        if "Zarr requires uniform chunk sizes" in str(e) or "Final chunk of Zarr array must be the same size" in str(e):
            raise InputError("save_dataset: Zarr requires uniform chunk sizes. Use the `auto_rechunk` argument to "
                             "`save_dataset` to automatically rechunk the dataset.") from e
        raise


def save_dataset(ds: xr.Dataset, store, storage_options: dict | None = None, auto_rechunk: bool | None = None,
                 zarr_format: int = 2, **kwargs: Any) -> None:
    """Write ``ds`` to a Zarr store, as sgkit's ``save_dataset``: ``Dataset.to_zarr(store,
    storage_options=..., zarr_format=..., **kwargs)``, chunks first made even where
    ``auto_rechunk``. A local path is written all or nothing: it must not exist, unless
    ``mode="w"``, which replaces only a dataset pipeline saved there."""
    if not isinstance(ds, xr.Dataset):
        raise InputError(f"save_dataset: expected an xarray.Dataset, got {type(ds).__name__}")
    if zarr_format not in (2, 3):
        raise InputError(f"save_dataset: zarr_format must be 2 or 3, got {zarr_format!r}")
    ds = ds.copy()
    for name in ds.variables:
        encoding = ds[name].encoding
        encoding.pop("chunks", None)  # xarray's issue 4380, as sgkit
        filters = encoding.get("filters")
        if filters:  # VLenUTF8 twice fails (xarray's issue 3476), as sgkit
            encoding["filters"] = [f for f in filters if getattr(f, "codec_id", None) != "vlen-utf8"]
        _codecs_of_format(encoding, zarr_format)
    if auto_rechunk and _uneven(ds):
        ds = ds.chunk({dim: max(chunks) for dim, chunks in ds.chunks.items()})
    ds = _on_host(ds)
    kwargs["zarr_format"] = zarr_format
    mode = kwargs.get("mode")
    local = isinstance(store, (str, os.PathLike)) and not is_url(store)
    if not local or mode not in (None, "w", "w-") or "append_dim" in kwargs or "region" in kwargs:
        return _to_zarr(ds, store, storage_options, kwargs)
    if mode != "w" and os.path.lexists(store) and not _stale_reservation(Path(store)):
        raise InputError(f"{store}: already exists; save_dataset writes a new store (mode='w' replaces a dataset "
                         "pipeline saved there, nothing else)")
    kwargs["mode"] = "w-"
    with staged(store, mode="overwrite" if mode == "w" else "fail", kind=KIND) as partial:
        _to_zarr(ds, partial, storage_options, kwargs)
