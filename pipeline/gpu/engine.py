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
  pool, :mod:`pipeline.gpu.iopool`; small files several to a job, :mod:`pipeline.gpu.files`);
- the block's device work on a pooled CUDA stream that first waits for the default stream
  (:func:`block_stream`);
- one batched decode a block, dispatched by codec (:func:`decode_frames`): nvCOMP for zstd and
  deflate, :mod:`pipeline.gpu.blosc` for Blosc, device copies for stored bytes;
- the fallback: a block the device path cannot decode is read by the format's own library into
  pinned memory and copied to the device (:func:`staged_read`), with one warning
  (:class:`BlockSource`);
- the Dask array over a source of blocks (:func:`dask_array`).

The CPU backend reads Zarr's plans with the host's twin of this (:func:`read_block_host`): chunk
files mapped from the page cache (:func:`map_file`), frames decoded by numcodecs in Dask's threads
straight into their places in the block (:func:`decode_host`).
"""

from __future__ import annotations

import functools
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


def frame_headers(codec: str, buffer: np.ndarray, offsets: np.ndarray, sizes: np.ndarray):
    """What :func:`decode_frames` reads on the host of the frames of ``sizes[k]`` bytes at
    ``offsets[k]`` of ``buffer``, taken while their bytes are there (a reader may give their
    memory to other reads before the block's batch): Blosc's headers, parsed at once
    (:func:`pipeline.gpu.blosc.parse_many`: a :class:`~pipeline.gpu.blosc.Batch`) or one by one
    where that declines (a list, a :func:`pipeline.gpu.blosc.header` a frame); nothing for the
    other codecs."""
    if codec != "blosc":
        return None
    batch = blosc.parse_many(buffer, offsets, sizes)
    if batch is not None:
        return batch
    return [blosc.header(buffer[o:o + n]) for o, n in zip(offsets.tolist(), sizes.tolist())]


def decode_frames(codec: str, dev, src_off, src_size, dst, dst_off, nbytes: int, hosts=None, root: str = "") -> None:
    """Every frame of a block in one batch on this thread's stream: frame ``k`` (``src_size[k]``
    bytes at ``src_off[k]`` of the device bytes ``dev``) decodes to ``nbytes`` bytes at byte
    ``dst_off[k]`` of ``dst``. ``codec``: "zstd" or "deflate" (raw deflate: nvCOMP), "blosc"
    (whose headers are read from the frames' host bytes, or taken before by :func:`frame_headers`:
    ``hosts()``, as :func:`pipeline.gpu.blosc.decode_frames` takes them) or "none" (copies)."""
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
    nbytes = math.prod(shape) * dtype.itemsize
    staging = pinned.take(nbytes)
    try:
        host = staging.bytes[:nbytes].view(dtype).reshape(shape)
        fill(host)
        return to_device(host)
    finally:
        pinned.give(staging)


def to_device(host: np.ndarray):
    """A block in pinned host memory copied to the device by one asynchronous copy on the block's
    stream, done when this returns."""
    import cupy as cp

    out = cp.empty(host.shape, dtype=host.dtype)
    with block_stream() as stream:  # its exit synchronizes the copy
        out.set(host, stream=stream)
    return out


# --- Dask arrays ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockSource:
    """A stored array as a source for ``dask.array.from_array``: ``source[region]`` is a CuPy array
    read by the format's :meth:`read`, or, out of core, decoded on the host ahead of its task by
    :meth:`read_host` where the source :attr:`reads_ahead` (:mod:`pipeline.gpu.ahead`); a block
    that does not decode there (a frame nvCOMP refuses, a checksum that does not hold, a file cut
    short) is read by :meth:`staged` instead, which names the chunk if it cannot read it either,
    with one warning (:meth:`fallback_warning`). ``chunks``: the Dask array's blocks, whose order
    reading ahead follows."""

    lay: object
    ndim: int
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[tuple[int, ...], ...] = ()

    def __getitem__(self, region):
        from . import ahead

        use_device_memory_limit()
        try:
            if ahead.takes(self, region):
                return ahead.read(self, region, to_device)
            return self.read(region)
        except (DecodeError, OSError) as e:
            _warn_once(self.fallback_warning(e))
            return self.staged()[region]

    @property
    def reads_ahead(self) -> bool:
        """Whether, out of core, this source's blocks are decoded on the host ahead of their tasks:
        where each stored chunk is one frame, a block under a device budget is too few frames for
        the GPU's decoders (:mod:`pipeline.gpu.ahead`)."""
        return False

    def read(self, region):
        raise NotImplementedError

    def read_host(self, region, out: np.ndarray):
        """Decode ``region`` on this thread into ``out`` (host memory); what it leaves for the
        device to do once ``out`` is there (None: nothing), for :meth:`finish_device`."""
        raise NotImplementedError

    def finish_device(self, block, left) -> None:
        """What :meth:`read_host` left (``left``, not None) done on ``block``, ``out``'s copy on
        the device."""
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


# --- the host's twin: blocks decoded by the CPU ---------------------------------------------------
# The CPU backend reads the same plans with these (pipeline.sources.reads): no CuPy, no pinned
# memory; numcodecs' zstd and Blosc release the GIL, so Dask's threads decode their blocks at once.


SMALL_FILE = 1 << 20  # bytes: a chunk file below it is read, not mapped


def map_file(path: str) -> np.ndarray | None:
    """A file's bytes, mapped read-only from the page cache and populated up front (one call into
    the kernel, no copy of the compressed bytes); None where there is no file (a chunk never
    written). The mapping goes when the last view of it does.

    A file below :data:`SMALL_FILE` is read instead: for small files, a mapping and its end cost
    more than a copy of the bytes. On the 2-core machine, four threads reading four blocks of a
    VCF Zarr store (150 chunk files each): positions 87 ms read against 101 ms mapped, genotypes
    71 against 101 ms (medians of six)."""
    import mmap

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.empty(0, dtype=np.uint8)
            if size < SMALL_FILE:
                return np.frombuffer(f.read(), dtype=np.uint8)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return np.frombuffer(mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ), dtype=np.uint8)
    except FileNotFoundError:
        return None


def zstd_content_size(frame) -> int | None:
    """The decoded size a zstd frame's header declares (RFC 8878, 3.1.1.1), or None."""
    head = bytes(frame[:18])
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = head[4]
    single, flag = (fhd >> 5) & 1, fhd >> 6
    fcs_size = (1 if single else 0) if flag == 0 else (2, 4, 8)[flag - 1]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if fcs_size == 0 or len(head) < at + fcs_size:
        return None
    value = int.from_bytes(head[at:at + fcs_size], "little")
    return value + 256 if fcs_size == 2 else value


def declared_size(codec: str, frame) -> int | None:
    """The decoded size of one compressed frame, as its own header says (zstd, Blosc), or None."""
    if codec == "zstd":
        return zstd_content_size(frame)
    if codec == "blosc" and len(frame) >= 16:  # a 16-byte header: version, flags, typesize, nbytes, ...
        return int.from_bytes(bytes(frame[4:8]), "little")
    return None


@functools.lru_cache(maxsize=None)
def _host_codec(codec: str):
    import numcodecs

    return numcodecs.Zstd() if codec == "zstd" else numcodecs.Blosc()  # Blosc's settings are in each header


def decode_host(codec: str, frame, out: np.ndarray) -> None:
    """One frame (``codec``: "zstd", "blosc" or "none") decoded on this thread into ``out``, bytes
    of exactly its decoded size: straight there where the frame's header declares that size (a
    codec decoding into a larger buffer would leave the rest as it was), else through a buffer of
    its own. DecodeError where the frame decodes to another size."""
    if codec == "none":
        data = frame
    elif declared_size(codec, frame) == len(out):
        _host_codec(codec).decode(frame, out=out)
        return
    else:
        data = np.frombuffer(_host_codec(codec).decode(frame), dtype=np.uint8)
    if len(data) != len(out):
        raise DecodeError(f"a frame decodes to {len(data)} bytes, not {len(out)}")
    out[:] = data


def read_block_host(lay, region: tuple[slice, ...], frames, out: np.ndarray | None = None) -> np.ndarray:
    """The values of ``region`` (slices with starts and stops, anywhere in the array) as a NumPy
    array, read by the CPU from a Zarr layout (:class:`pipeline.gpu.reader.Layout`) whose chunk
    files ``frames(lay, blob)`` splits into frames (:func:`pipeline.gpu.reader.frames`). A chunk
    whole and contiguous in the block decodes its frames straight into place; any other (cut by
    the block or the array's edge, inner chunks that are not contiguous runs of it) decodes each
    frame it needs into a scratch inner chunk and copies the part that lies in the block. Chunks
    and inner chunks never written hold the fill value, as zarr reads them. ``out``: where to
    decode (C-contiguous, of the region's shape and the array's dtype), else a new array."""
    starts = [s.start for s in region]
    if out is None:
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=lay.dtype)
    nb, count = lay.inner_nbytes, math.prod(lay.grid)
    scratch = None
    ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(region, lay.chunk)]
    for coords in itertools.product(*ranges):
        lo = [i * c for i, c in zip(coords, lay.chunk)]
        inside = [(max(a, s.start), min(a + c, s.stop)) for a, c, s in zip(lo, lay.chunk, region)]
        dest = out[tuple(slice(a - s0, b - s0) for (a, b), s0 in zip(inside, starts))]
        blob = map_file(lay.path(coords))
        if blob is None:
            dest[...] = lay.fill_value
            continue
        offsets, sizes, present = frames(lay, blob)
        if len(present) < count:  # inner chunks absent from the shard
            dest[...] = lay.fill_value
        todo = zip(offsets.tolist(), sizes.tolist(), present.tolist())
        if dest.shape == lay.chunk and dest.flags.c_contiguous and lay.contiguous_inner:
            flat = dest.reshape(-1).view(np.uint8)
            for o, s, p in todo:
                decode_host(lay.codec, blob[o:o + s], flat[p * nb:(p + 1) * nb])
            continue
        if scratch is None:
            scratch = np.empty(lay.inner, dtype=lay.dtype)
        for o, s, p in todo:
            at = [a + g * n for a, g, n in zip(lo, np.unravel_index(p, lay.grid), lay.inner)]
            cut = [(max(a, i0), min(a + n, i1)) for a, n, (i0, i1) in zip(at, lay.inner, inside)]
            if any(a >= b for a, b in cut):
                continue  # an inner chunk of the shard outside the block
            decode_host(lay.codec, blob[o:o + s], scratch.reshape(-1).view(np.uint8))
            dest[tuple(slice(a - i0, b - i0) for (a, b), (i0, _) in zip(cut, inside))] = \
                scratch[tuple(slice(a - x, b - x) for (a, b), x in zip(cut, at))]
    return out
