"""A copy of a store in the layout the GPU reads fastest: Zarr v3 shards of small zstd frames."""

from __future__ import annotations

import math
import os
from typing import Mapping

from ..errors import InputError
from ..sources import open_dataset
from .zarr import write_zarr


def inner_chunk(shard: tuple[int, ...], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """The inner chunk of a shard for GPU decoding: at most about ``target_bytes`` and one
    contiguous run of the C-ordered shard, i.e. of shape (1, .., 1, k, full, .., full) with k
    dividing its axis, so that every frame decodes straight into its place."""
    shard = tuple(int(n) for n in shard)
    if math.prod(shard) * itemsize <= target_bytes:
        return shard
    for axis in range(len(shard)):
        step = math.prod(shard[axis + 1:]) * itemsize  # bytes of one index along ``axis``
        if step <= target_bytes or axis == len(shard) - 1:
            k = max(d for d in range(1, shard[axis] + 1) if shard[axis] % d == 0 and (d * step <= target_bytes or d == 1))
            return (1,) * axis + (k,) + shard[axis + 1:]
    raise AssertionError("unreachable")


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    inner_bytes: int | str = "1MB",
    chunks: Mapping[str, int] | None = None,
    compression: str = "zstd",
    mode: str = "overwrite",
    progress: bool = False,
):
    """Copy a Zarr store or NetCDF file into a Zarr v3 store that the GPU reads fastest.

    With ``compression="zstd"`` (the default) each shard holds one Dask block of the source (its
    chunks, or ``chunks``); inside, values are zstd frames of about ``inner_bytes``, each a
    contiguous run of the shard, which nvCOMP decodes many at a time straight into place. With
    ``compression="none"`` each chunk is one such block, uncompressed: nothing to decode, a third
    more bytes to read (for stores read from memory or fast disks, where decoding is the slowest
    step). Values, attributes and CF encodings are copied unchanged (packed integers stay packed),
    and any Zarr v3 reader opens the result. The inner frames carry no crc32c (the GPU reader
    would skip it unchecked); each shard's index keeps zarr's crc32c. ``src`` is protected: the
    copy may not be, contain or lie inside it.
    """
    from dask.utils import parse_bytes

    if compression not in ("zstd", "none"):
        raise InputError(f"compression must be 'zstd' or 'none', got {compression!r}")
    target = parse_bytes(inner_bytes) if isinstance(inner_bytes, str) else int(inner_bytes)
    ds = open_dataset(src, backend="cpu", chunks=chunks, decode_cf=False)
    encoding = {}
    for name, var in ds.data_vars.items():
        shard = tuple(c[0] for c in var.data.chunks)
        if compression == "none":
            enc = {"chunks": shard, "compressors": None}
        else:
            enc = {"shards": shard, "chunks": inner_chunk(shard, var.dtype.itemsize, target)}
        fill = var.attrs.pop("_FillValue", var.encoding.get("_FillValue"))
        if fill is not None:
            enc["_FillValue"] = fill
        encoding[name] = enc
    return write_zarr(ds, dst, mode=mode, encoding=encoding, progress=progress, protect=(src,), kind="convert")
