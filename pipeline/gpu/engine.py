"""The chunk engine that the GPU's readers share: each format plans, this module reads and decodes.

The common model, for Zarr (:mod:`pipeline.gpu.reader`) and HDF5/NetCDF4 (:mod:`pipeline.gpu.hdf5`):

- a **chunk reference** says where one stored chunk's bytes lie and how they decode: its file (a
  Zarr chunk or shard file; the HDF5 file), its offset and size there (a whole Zarr file; an HDF5
  chunk's place in HDF5's chunk index), its codec chain (Zarr: zstd, Blosc or none, a trailing
  crc32c, the frames of a shard found from its index; HDF5: shuffle, deflate and fletcher32, less
  the filters its mask skipped) and its place in the block (:func:`block_chunks`), cut where the
  array's edge cuts the chunk;
- a **block plan** is one Dask task's work: the block's shape and the chunk references of its
  whole chunks in C order of the chunk grid; chunks never written (a missing Zarr file, an
  unallocated HDF5 chunk) hold the fill value.

A format's module turns its metadata into these (:func:`pipeline.gpu.reader.layout` and
:func:`~pipeline.gpu.reader.frames` from zarr-python's metadata and the shard index,
:func:`pipeline.gpu.hdf5.layout` and :func:`~pipeline.gpu.hdf5.plan_block` from h5py's chunk
index) and keeps what only its format does (pinned page-cache files and the split of zstd frames
between the GPU and the CPU for Zarr; coalesced reads, checksums and the shuffle for HDF5). What
both do with a plan is here:

- the chunks of a block and their places (:func:`block_chunks`), and whether Dask's blocks are
  made of whole stored chunks (:func:`aligned`);
- reads into pinned host memory (:func:`pread_into`, in pieces of ``PIECE`` bytes on the I/O
  pool, :mod:`pipeline.gpu.iopool`);
- the block's device work on a pooled CUDA stream that first waits for the default stream
  (:func:`block_stream`);
- one batched decode a block, dispatched by codec (:func:`decode_frames`): nvCOMP for zstd and
  deflate, :mod:`pipeline.gpu.blosc` for Blosc, device copies for stored bytes;
- the fallback: a block the device path cannot decode is read by the format's own library into
  pinned memory and copied to the device (:func:`staged_read`), with one warning
  (:class:`BlockSource`);
- the Dask array over a source of blocks (:func:`dask_array`).
"""

from __future__ import annotations

import itertools
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..backend import use_device_memory_limit
from ..errors import DecodeError
from . import blosc, pinned
from .blosc import _warn_once
from .nvcomp import _copy_frames, _decode_frames, decode_batch
from .streams import context

PIECE = 16 << 20  # reads above this are split in pieces of this size, which the I/O pool runs in parallel


# --- the chunks of a block ------------------------------------------------------------------------


class BlockChunks(NamedTuple):
    """The stored chunks that make up a block: ``first`` and ``counts`` of the chunk grid along each
    axis; ``coords`` each chunk's place in the grid and ``places`` its region of the block, both in
    C order of the grid."""

    shape: tuple[int, ...]
    first: list[int]
    counts: list[int]
    coords: list[tuple[int, ...]]
    places: list[tuple[slice, ...]]


def block_chunks(region: tuple[slice, ...], chunk: tuple[int, ...]) -> BlockChunks:
    """The chunks of ``region`` (whole chunks of shape ``chunk``; the last may be cut by the edge)."""
    starts = [s.start for s in region]
    shape = tuple(s.stop - s.start for s in region)
    first = [st // c for st, c in zip(starts, chunk)]
    counts = [-(-n // c) for n, c in zip(shape, chunk)]
    coords = list(itertools.product(*(range(f, f + k) for f, k in zip(first, counts))))
    places = [tuple(slice(c * n - s0, min((c + 1) * n - s0, ln)) for c, n, s0, ln in zip(coord, chunk, starts, shape))
              for coord in coords]
    return BlockChunks(shape, first, counts, coords, places)


def aligned(chunks: tuple[tuple[int, ...], ...], chunk: tuple[int, ...]) -> bool:
    """True when every block boundary of ``chunks`` falls on a boundary of the store's chunks."""
    for sizes, c in zip(chunks, chunk):
        edges = list(itertools.accumulate(sizes))[:-1]
        if any(e % c for e in edges):
            return False
    return True


# --- reading, staging, decoding -------------------------------------------------------------------


def pread_into(path: str, offset: int, views: list) -> None:
    """One ``preadv`` from ``offset`` of ``path`` into ``views``; OSError on a short read (a file
    cut since it was planned), which sends the block to the fallback."""
    want = sum(len(v) for v in views)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = os.preadv(fd, views, offset)
    finally:
        os.close(fd)
    if got != want:
        raise OSError(f"{path}: short read at {offset} ({got} of {want} bytes)")


@contextmanager
def block_stream():
    """This thread's pooled CUDA stream (:mod:`pipeline.gpu.streams`), current for the ``with``
    block and synchronized at its end. The block's device buffers, allocated before, come from the
    pool's default-stream arena, as every task's arrays do: CuPy keeps freed memory per stream, and
    buffers allocated on the pooled streams would fragment a capped pool (seen as out-of-memory
    under a 4 GB limit with a third of it in use). The pool may hand them memory that kernels queued
    earlier on the default stream still read, so the stream waits for those kernels first."""
    import cupy as cp

    ready = cp.cuda.Stream.null.record()
    with context() as ctx, ctx.stream:
        ctx.stream.wait_event(ready)
        yield ctx.stream


def decode_frames(codec: str, dev, src_off, src_size, dst, dst_off, nbytes: int, hosts=None, root: str = "") -> None:
    """Every frame of a block in one batch on this thread's stream: frame ``k`` (``src_size[k]``
    bytes at ``src_off[k]`` of the device bytes ``dev``) decodes to ``nbytes`` bytes at byte
    ``dst_off[k]`` of ``dst``. ``codec``: "zstd" or "deflate" (raw deflate: nvCOMP), "blosc"
    (whose headers are read from the frames' host bytes, ``hosts()``) or "none" (copies)."""
    if codec == "blosc":
        blosc.decode_frames(root, hosts(), dev, src_off, dst, dst_off, nbytes)
    elif codec == "zstd":
        _decode_frames(dev, src_off, src_size, dst, dst_off, nbytes)
    elif codec == "deflate":
        decode_batch("Deflate", dev, src_off, src_size, dst, dst_off, [nbytes] * len(src_off))
    else:
        _copy_frames(dev, src_off, src_size, dst, dst_off)


def staged_read(shape: tuple[int, ...], dtype: np.dtype, fill):
    """A block read by a format's own library on the CPU: ``fill(host)`` writes it into pinned
    memory, which one asynchronous copy moves to the device. The path for what the device path
    does not decode."""
    import cupy as cp

    nbytes = math.prod(shape) * dtype.itemsize
    staging = pinned.take(nbytes)
    try:
        host = staging.bytes[:nbytes].view(dtype).reshape(shape)
        fill(host)
        out = cp.empty(shape, dtype=dtype)
        with block_stream() as stream:  # its exit synchronizes the copy
            out.set(host, stream=stream)
        return out
    finally:
        pinned.give(staging)


# --- Dask arrays ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockSource:
    """A stored array as a source for ``dask.array.from_array``: ``source[region]`` is a CuPy array
    read by the format's :meth:`read`; a block that does not decode there (a frame nvCOMP refuses,
    a checksum that does not hold, a file cut short) is read by :meth:`staged` instead, which names
    the chunk if it cannot read it either, with one warning (:meth:`fallback_warning`)."""

    lay: object
    ndim: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, region):
        use_device_memory_limit()
        try:
            return self.read(region)
        except (DecodeError, OSError) as e:
            _warn_once(self.fallback_warning(e))
            return self.staged()[region]

    def read(self, region):
        raise NotImplementedError

    def fallback_warning(self, error: Exception) -> str:
        raise NotImplementedError

    def staged(self):
        raise NotImplementedError


def dask_array(source, chunks: tuple[tuple[int, ...], ...], dtype: np.dtype, name: str):
    """A Dask array of CuPy chunks whose blocks are ``source[region]``, named for the variable
    ``name`` and tokenized by the source (which names its file's version) and the chunks."""
    import cupy as cp
    import dask.array as da

    meta = cp.empty((0,) * len(chunks), dtype=dtype)
    return da.from_array(source, chunks=chunks, asarray=False, fancy=False, meta=meta,
                         name=f"read-{name}-{da.core.tokenize(source, chunks)}")
