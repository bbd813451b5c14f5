"""Zarr v2 and v3 stores: opened by xarray (CF decoding of values mostly left to :mod:`.cf`); on the GPU,
each variable's chunks are read by :mod:`pipeline.gpu.reader` straight to the device."""

from __future__ import annotations

import json
import math
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


def _shard_chunks(path, target_bytes: int = 0) -> dict:
    """Dask chunks of a sharded store: one block per shard (xarray would take the inner chunks,
    which can be thousands of times smaller); ``{}`` (the stored chunks) otherwise.

    With ``target_bytes``, blocks take as many whole shards along each array's first dimension
    as fit in it. On the GPU, larger blocks give nvCOMP larger batches: measured on the H200
    machine, 6.1 GB in blocks of 1, 2, 3 and 5 shards of 303 MB took 0.30, 0.23, 0.21 and 0.19 s
    (benchmarks/RESULTS.md)."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception:
        return {}
    chunks: dict = {}
    grow: dict = {}  # first dimension -> shards a block, the fewest any array there allows
    for _, arr in group.arrays():
        shards = getattr(arr, "shards", None)
        dims = getattr(arr.metadata, "dimension_names", None)
        if shards and dims:
            for dim, size in zip(dims, shards):
                chunks[dim] = max(chunks.get(dim, 0), size)
            if target_bytes:
                shard_bytes = math.prod(shards) * arr.dtype.itemsize
                fits = max(1, min(target_bytes // shard_bytes, math.ceil(arr.shape[0] / shards[0])))
                grow[dims[0]] = min(grow.get(dims[0], fits), fits)
    for dim, k in grow.items():
        chunks[dim] *= k
    return chunks
