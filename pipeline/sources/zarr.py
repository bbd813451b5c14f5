"""Zarr v2 and v3 stores: opened by xarray (CF decoding of values mostly left to :mod:`.cf`); on the GPU,
each variable's chunks are read by :mod:`pipeline.gpu.reader` straight to the device."""

from __future__ import annotations

import json
from pathlib import Path

import xarray as xr


def detect(path: Path) -> str | None:
    """"zarr3" or "zarr2" for a store directory, else None."""
    if not path.is_dir():
        return None
    if (path / "zarr.json").exists():
        return "zarr3"
    if (path / ".zgroup").exists() or (path / ".zarray").exists():
        return "zarr2"
    return None


def _consolidated(path: Path, fmt: str) -> bool:
    if fmt == "zarr2":
        return (path / ".zmetadata").exists()
    with open(path / "zarr.json") as f:
        return bool(json.load(f).get("consolidated_metadata"))



def open_store(path, fmt: str, chunks, **decoding) -> xr.Dataset:
    """The store as xarray opens it, with xarray's ``decoding`` options (``mask_and_scale``...)."""
    if fmt == "url":
        return xr.open_zarr(str(path), chunks=chunks, **decoding)
    return xr.open_zarr(path, chunks=chunks, consolidated=_consolidated(Path(path), fmt), **decoding)


def device_array(path, name: str, chunks):
    """A Dask array of CuPy chunks read by pipeline's GPU reader."""
    from ..gpu import reader

    return reader.open_array(path, name, chunks=chunks)


def _shard_chunks(path) -> dict:
    """Dask chunks of a sharded store: one block per shard (xarray would take the inner chunks,
    which can be thousands of times smaller); ``{}`` (the stored chunks) otherwise."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception:
        return {}
    chunks: dict = {}
    for _, arr in group.arrays():
        shards = getattr(arr, "shards", None)
        dims = getattr(arr.metadata, "dimension_names", None)
        if shards and dims:
            for dim, size in zip(dims, shards):
                chunks[dim] = max(chunks.get(dim, 0), size)
    return chunks
