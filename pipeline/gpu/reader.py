"""Zarr chunks straight onto the GPU: compressed bytes cross the bus, nvCOMP decodes them there.

Why our own reader and not zarr's GPU mode (``zarr.config.enable_gpu()``): zarr 3.1 still decodes
on the CPU, one chunk per call through its event loop, then copies pageable buffers to the device.
On the GPU machine that path is bounded by the CPU's zstd (5 GB/s on 16 threads) and by pageable
copies (6 GB/s); nvCOMP decodes the same zstd frames on the GPU at 15-40 GB/s and copies from pinned
memory run at 55 GB/s (benchmarks/RESULTS.md). The stores stay ordinary Zarr: this module only
reads the layouts that the Zarr v3 (and v2) specifications define, and anything it does not handle
(other codecs, big-endian data, transposes) goes through zarr itself, staged through pinned memory.

One Dask task reads one block of whole chunks (or shards):

1. the chunk files are looked up by one call (:func:`pipeline.gpu.files.stat_files`) and read into
   pinned host buffers (:mod:`pipeline.gpu.pinned`), a few segments of the block at a time
   (:class:`_Staging`), large files in pieces and small ones several to a job
   (:mod:`pipeline.gpu.files`, one call that holds no GIL a group), by a pool of I/O threads that
   serves the earliest read first; or, where
   ``pipeline.gpu.pinned-files`` leaves room, each file is pinned where it lies in the page cache,
   once, and later reads of it skip the copy to a buffer;
2. each file's compressed bytes cross to the device by an asynchronous copy once the file is read
   (files next to each other in the buffer together), on the task thread's own CUDA stream, and
   what the decode needs of its host bytes (its frames and checksums, Blosc's headers) is taken
   then, before its buffer is read into again;
3. one nvCOMP batch decodes every zstd frame of the block (a chunk, or every inner chunk of a
   shard) into its place in the output, or into a scratch buffer that one copy rearranges; the
   decode is queued without reading the frames' sizes back. Files of one large frame (zarr's
   default: a frame a chunk) that the CPU would finish sooner are decoded by the I/O threads
   instead, straight from the page cache into pinned memory, at the same time, and copied into
   place (:mod:`pipeline.gpu.split` decides, from measured speeds); the GPU's files go first, and
   new pinned memory for the CPU's decodes is taken only once no block's GPU files are being
   pinned or read (:class:`_GpuFiles`);
4. the task waits for its stream only at the end, so threads overlap reading, copying and
   decoding.

The layout logic (:class:`Layout`, :func:`frames`) is plain Python and NumPy, tested on every
machine against zarr itself through :func:`decode_chunk_host`, the CPU twin of step 3. What this
module shares with :mod:`pipeline.gpu.hdf5` (a block's chunks and places, reads, the block's stream,
the batched decode by codec, the fallback and the Dask array) is in :mod:`pipeline.gpu.engine`.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import os
import threading
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import config, state
from ..backend import use_device_memory_limit
from ..errors import DecodeError, UnsupportedLayout, chunk_error
from ..kernels.copies import copy_into
from . import pinned, split
from .engine import (PIECE, BlockSource, aligned, block_chunks, block_stream, dask_array, decode_frames,
                     decode_host, frame_headers, map_file, pread_into, read_block_host, staged_read)
from .files import build_soon, read_whole_files, stat_files
from .iopool import io_pool
from .nvcomp import nvcomp_available
from .streams import copy_stream

MISSING = np.uint64(2**64 - 1)
GROUP = 1 << 20  # the least bytes of small files that one I/O job reads (submit_reads)
COPY = 64 << 20  # the most bytes of staged files that cross to the device in one copy
SEGMENT = 64 << 20  # a block's staged files are read through buffers of about this many bytes, ...
DEPTH = 2  # ... this many at a time (_Staging)


# --- layout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How one Zarr array lays its values out in files.

    ``chunk`` is the shape of one file (a chunk, or a shard); ``inner`` the shape of one
    compressed frame inside it (the chunk itself without sharding).
    """

    root: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk: tuple[int, ...]
    inner: tuple[int, ...]
    codec: str  # "zstd", "blosc" or "none"
    frame_crc: bool  # a crc32c trails each frame
    sharded: bool
    index_at_end: bool = True
    index_crc: bool = False
    fill_value: object = 0
    key_prefix: str = ""
    separator: str = "/"

    @property
    def grid(self) -> tuple[int, ...]:
        """Inner chunks per file along each axis."""
        return tuple(c // i for c, i in zip(self.chunk, self.inner))

    @property
    def inner_nbytes(self) -> int:
        return math.prod(self.inner) * self.dtype.itemsize

    @property
    def contiguous_inner(self) -> bool:
        """True when each inner chunk is one contiguous run of the C-ordered chunk, so frames can
        decode straight into place: the inner shape is (1, .., 1, k, full, .., full)."""
        cut = [a for a, (c, i) in enumerate(zip(self.chunk, self.inner)) if i != c]
        return not cut or all(self.inner[a] == 1 for a in range(cut[-1]))

    def key(self, coords: tuple[int, ...]) -> str:
        if not coords:
            return self.key_prefix or "0"
        parts = [self.key_prefix] if self.key_prefix else []
        return self.separator.join(parts + [str(c) for c in coords])

    def path(self, coords: tuple[int, ...]) -> str:
        return os.path.join(self.root, *self.key(coords).split("/"))


def _names(codecs) -> list[str]:
    return [c.to_dict()["name"] for c in codecs]


def _little_endian(codec, dtype: np.dtype, what: str) -> None:
    """Refuse a bytes codec that stores multi-byte values big-endian."""
    endian = codec.endian.value if codec.endian is not None else "little"
    if dtype.itemsize > 1 and endian != "little":
        raise UnsupportedLayout(f"{endian}-endian {what}")


def _chain(codecs, dtype: np.dtype) -> tuple[str, bool]:
    """(codec, trailing crc32c) of a plain chain: bytes, then zstd or blosc, and/or crc32c."""
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

    codecs = list(codecs)
    if not codecs or not isinstance(codecs[0], BytesCodec):
        raise UnsupportedLayout(f"codecs {_names(codecs)}")
    _little_endian(codecs[0], dtype, "values")
    rest = codecs[1:]
    crc = bool(rest) and isinstance(rest[-1], Crc32cCodec)
    if crc:
        rest = rest[:-1]
    if len(rest) > 1 or (rest and not isinstance(rest[0], (ZstdCodec, BloscCodec))):
        raise UnsupportedLayout(f"codecs {_names(codecs)}")
    if not rest:
        return "none", crc
    return ("zstd" if isinstance(rest[0], ZstdCodec) else "blosc"), crc


def _v3_layout(root: Path, meta) -> Layout:
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
    from zarr.core.chunk_grids import RegularChunkGrid
    from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding, V2ChunkKeyEncoding

    if meta.storage_transformers:
        raise UnsupportedLayout("storage transformers")
    dtype = meta.dtype.to_native_dtype()
    if dtype.kind not in "biufc":
        raise UnsupportedLayout(f"data type {meta.dtype.to_json(zarr_format=3)!r}")
    if not isinstance(meta.chunk_grid, RegularChunkGrid):
        raise UnsupportedLayout(f"chunk grid {type(meta.chunk_grid).__name__}")
    chunk = tuple(meta.chunk_grid.chunk_shape)
    cke = meta.chunk_key_encoding
    if isinstance(cke, DefaultChunkKeyEncoding):
        prefix = "c"
    elif isinstance(cke, V2ChunkKeyEncoding):
        prefix = ""
    else:
        raise UnsupportedLayout(f"chunk key encoding {cke.to_dict()['name']!r}")
    common = dict(  # zarr's fill value is a scalar of the array's dtype: its exact bits
        root=str(root), shape=tuple(meta.shape), dtype=dtype, chunk=chunk, fill_value=meta.fill_value,
        key_prefix=prefix, separator=cke.separator,
    )
    codecs = meta.codecs
    if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
        shard = codecs[0]
        inner = tuple(shard.chunk_shape)
        if any(c % i for c, i in zip(chunk, inner)):
            raise UnsupportedLayout("inner chunks that do not divide the shard")
        codec, crc = _chain(shard.codecs, dtype)
        index = list(shard.index_codecs)
        index_crc = len(index) == 2 and isinstance(index[1], Crc32cCodec)
        if not index or not isinstance(index[0], BytesCodec) or len(index) != 1 + index_crc:
            raise UnsupportedLayout(f"shard index codecs {_names(index)}")
        _little_endian(index[0], np.dtype("u8"), "shard index")
        return Layout(
            **common, inner=inner, codec=codec, frame_crc=crc, sharded=True,
            index_at_end=shard.index_location.value == "end", index_crc=index_crc,
        )
    codec, crc = _chain(codecs, dtype)
    return Layout(**common, inner=chunk, codec=codec, frame_crc=crc, sharded=False)


def _v2_layout(root: Path, meta) -> Layout:
    dtype = meta.dtype.to_native_dtype()
    if dtype.byteorder == ">" or meta.order != "C" or meta.filters:
        raise UnsupportedLayout("big-endian, Fortran-ordered or filtered v2 data")
    comp = meta.compressor
    if comp is not None and comp.codec_id not in ("zstd", "blosc"):
        raise UnsupportedLayout(f"compressor {comp.codec_id!r}")
    chunk = tuple(meta.chunks)
    return Layout(
        root=str(root), shape=tuple(meta.shape), dtype=dtype.newbyteorder("="), chunk=chunk, inner=chunk,
        codec=comp.codec_id if comp is not None else "none", frame_crc=False, sharded=False,
        fill_value=0 if meta.fill_value is None else meta.fill_value, separator=meta.dimension_separator,
    )


def layout(array_dir: str | os.PathLike) -> Layout:
    """The layout of the Zarr array stored in ``array_dir`` (v3 ``zarr.json`` or v2 ``.zarray``).

    The metadata is zarr-python's own, as it opens the array: one parser for the stores' metadata
    (zarr's), so defaults, fill values and codec configurations mean here what they mean to zarr,
    and each codec is recognised, or refused, by what zarr makes of it. The open is cached for each
    version of the metadata file, which :func:`open_array` opens anyway.

    Raises :class:`UnsupportedLayout` when the array uses something the GPU reader does not decode
    (metadata zarr itself does not read included: unknown codecs, data types or chunk grids).
    """
    from zarr.core.metadata import ArrayV3Metadata

    root = Path(array_dir)
    if not ((root / "zarr.json").exists() or (root / ".zarray").exists()):
        raise UnsupportedLayout(f"{root}: no zarr.json or .zarray")
    try:
        meta = _open_zarr_array(str(root)).metadata
    except (ValueError, TypeError, KeyError) as e:  # zarr's errors of metadata are ValueErrors
        raise UnsupportedLayout(f"{root}: {e}") from e
    return _v3_layout(root, meta) if isinstance(meta, ArrayV3Metadata) else _v2_layout(root, meta)


# --- frames of one file -------------------------------------------------------------------------


def frames(lay: Layout, blob) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compressed frames of one chunk file: (offsets, sizes, inner-chunk indices), in bytes
    from the start of the file and C-order inner index; inner chunks absent from a shard are left
    out (they hold the fill value)."""
    n = len(blob)
    if not lay.sharded:
        offsets, sizes, present = np.array([0]), np.array([n - 4 * lay.frame_crc]), np.array([0])
        _check_crc(lay, blob, offsets, sizes)
        return offsets, sizes, present
    count = math.prod(lay.grid)
    size = 16 * count + 4 * lay.index_crc
    raw = bytes(blob[n - size:] if lay.index_at_end else blob[:size])
    if lay.index_crc:
        import google_crc32c

        stored = int.from_bytes(raw[-4:], "little")
        if google_crc32c.value(raw[:-4]) != stored:
            raise OSError("shard index checksum mismatch")
    index = np.frombuffer(raw, dtype="<u8", count=2 * count).reshape(count, 2)
    present = np.flatnonzero(index[:, 0] != MISSING)
    offsets = index[present, 0].astype(np.int64)
    sizes = index[present, 1].astype(np.int64) - 4 * lay.frame_crc
    if len(offsets) and (offsets.min() < 0 or (offsets + sizes).max() > n):
        raise OSError("shard index points outside the file")
    _check_crc(lay, blob, offsets, sizes)
    return offsets, sizes, present


def _check_crc(lay: Layout, blob, offsets, sizes) -> None:
    """Each frame's trailing crc32c (codecs bytes -> zstd -> crc32c, as pipeline writes its outputs)
    checked on the host before the frame goes to nvCOMP, as zarr checks it; a mismatch raises
    DecodeError, so zarr reads the block and names the chunk (:class:`GpuSource`)."""
    if not lay.frame_crc:
        return
    import google_crc32c

    view = np.frombuffer(blob, dtype=np.uint8)  # google_crc32c takes arrays, not memoryviews
    for o, s in zip(offsets.tolist(), sizes.tolist()):
        stored = int.from_bytes(view[o + s:o + s + 4].tobytes(), "little")
        if google_crc32c.value(view[o:o + s]) != stored:
            raise DecodeError(f"{lay.root}: crc32c checksum mismatch in a frame")


def assemble(xp, lay: Layout, decoded, present=None):
    """A whole chunk from its decoded inner chunks, stacked in C order of the inner grid (shape
    (n_present, *inner)); absent inner chunks take the fill value."""
    count = math.prod(lay.grid)
    if present is not None and len(present) < count:
        full = xp.full((count, *lay.inner), lay.fill_value, dtype=lay.dtype)
        full[xp.asarray(present)] = decoded
        decoded = full
    nd = len(lay.chunk)
    tiles = decoded.reshape(*lay.grid, *lay.inner)
    order = [a for pair in zip(range(nd), range(nd, 2 * nd)) for a in pair]
    return tiles.transpose(order).reshape(lay.chunk)


def decode_chunk_host(lay: Layout, blob: bytes) -> np.ndarray:
    """The CPU twin of the GPU decode: one chunk file -> the chunk's (padded) values, each frame
    decoded as the CPU backend decodes it (:func:`pipeline.gpu.engine.decode_host`)."""
    blob = np.frombuffer(blob, dtype=np.uint8)
    offsets, sizes, present = frames(lay, blob)
    out = np.empty((len(present), lay.inner_nbytes), dtype=np.uint8)
    for k, (o, s) in enumerate(zip(offsets.tolist(), sizes.tolist())):
        decode_host(lay.codec, blob[o:o + s], out[k])
    values = out.view(lay.dtype).reshape(len(present), *lay.inner)
    return assemble(np, lay, values, present)


# --- reading a block on the GPU -----------------------------------------------------------------


def _pin_or_own(path: str, st: os.stat_result):
    """The file pinned in the page cache (:func:`pipeline.gpu.pinned.pin_file`), or, where the room
    went to other files meanwhile (or pinning failed), read into host memory of its own: pageable,
    since a new pinned buffer is faulted in by the I/O threads, one of which this is."""
    f = pinned.pin_file(path, st)
    if f is None:
        own = np.empty(st.st_size, dtype=np.uint8)
        pread_into(path, 0, [memoryview(own)])
        return own
    return f


def submit_pins(paths: list[str], stats: list[os.stat_result]) -> list[Future]:
    """Start pinning files where they lie in the page cache, one job a file, all at one place in
    the I/O pool's order; each job's result is the pinned file, or the file's bytes in memory of
    their own where it could not be pinned (:func:`_pin_or_own`)."""
    pool = io_pool()
    ticket = pool.ticket()
    return [pool.submit(_pin_or_own, path, st, ticket=ticket) for path, st in zip(paths, stats)]


def group_bytes(total: int) -> int:
    """Bytes of small files that one I/O job reads, of ``total`` bytes read: about ``PIECE``, less
    (down to ``GROUP``) where that would leave I/O threads without a job."""
    return min(PIECE, max(GROUP, total // (2 * io_pool().threads)))


def submit_reads(paths: list[str], sizes: list[int], buffer: np.ndarray,
                 per_job: int | None = None) -> list[tuple[int, list[Future]]]:
    """Start reading whole files one after another into ``buffer``: (start, jobs) for each file,
    in order. Large files are split into pieces that the I/O pool reads in parallel; consecutive
    small files are read several to a job (:func:`pipeline.gpu.files.read_whole_files`), ``per_job``
    bytes a job (:func:`group_bytes` of these files by default). All the jobs share one place in
    the pool's order."""
    starts = list(itertools.accumulate([0] + sizes[:-1]))
    mv = memoryview(buffer)
    pool = io_pool()
    ticket = pool.ticket()
    per_job = per_job or group_bytes(sum(sizes))
    files: list[tuple[int, list[Future]]] = []
    group: list[int] = []  # the small files of the job being gathered (their places in ``files``)

    def submit_group():
        if group:
            job = pool.submit(read_whole_files, [paths[k] for k in group], buffer, [starts[k] for k in group],
                              [sizes[k] for k in group], ticket=ticket)
            for k in group:
                files[k][1].append(job)
            group.clear()

    gathered = 0
    for k, (path, size, start) in enumerate(zip(paths, sizes, starts)):
        if size <= PIECE:
            files.append((start, []))
            group.append(k)
            gathered += size
            if gathered >= per_job:
                submit_group()
                gathered = 0
        else:
            files.append((start, [pool.submit(pread_into, path, off, [mv[start + off:start + off + min(PIECE, size - off)]],
                                              ticket=ticket) for off in range(0, size, PIECE)]))
    submit_group()
    return files


def read_files(paths: list[str], sizes: list[int], buffer: np.ndarray) -> list[int]:
    """Read whole files one after another into ``buffer``; returns each file's start."""
    files = submit_reads(paths, sizes, buffer)
    for _, jobs in files:
        for j in jobs:
            j.result()
    return [start for start, _ in files]


def read_block(lay: Layout, region: tuple[slice, ...]):
    """The values of ``region`` (whole chunks of ``lay``; the last may be cut by the array's edge)
    as a CuPy array, read, moved and decoded as the module docstring describes."""
    block = block_chunks(region, lay.chunk)
    paths = [lay.path(c) for c in block.coords]
    stats = stat_files(paths)
    sizes = [st.st_size if st else 0 for st in stats]

    with split.reading() as blocks:
        # files pinned in the page cache cross from there (pipeline.gpu.pinned)
        held = [pinned.lookup(p, st) if st and st.st_size else None for p, st in zip(paths, stats)]
        host = _on_host(lay, sizes, held, blocks)
        # The GPU's files first: pinned by the I/O threads where the policy and the room let them,
        # the rest read into pinned buffers a few at a time (:class:`_Staging`). The CPU's files are decoded by
        # the I/O threads, each into a pinned buffer of one chunk, once the GPU's batch is queued
        # (:class:`_HostDecodes`), or at once in a block the CPU decodes whole. In a first run on
        # zarr's default store, taking the buffers of both first held the GPU's batch back by
        # 0.33 s: the CPU's (2.4 GB, new) took 0.24 s, and one for files that were then pinned
        # (1.4 GB) 0.08 s more; taken beside the pinning, on a thread of its own, the CPU's buffer
        # slowed the pinning as much (both register memory with the driver).
        decodes = _HostDecodes(lay, paths, held, host)
        unread = [k for k, size in enumerate(sizes) if size and held[k] is None and not host[k]]
        fetching = _GpuFiles(bool(unread))
        to_pin = [k for k, pin in zip(unread, pinned.will_pin_files([paths[k] for k in unread], [stats[k] for k in unread])) if pin]
        pins = dict(zip(to_pin, submit_pins([paths[k] for k in to_pin], [stats[k] for k in to_pin])))
        to_read = [k for k in unread if k not in pins]
        staging = None
        try:
            if to_read:
                staging = _Staging([paths[k] for k in to_read], [sizes[k] for k in to_read])
            files, it = [], itertools.count()
            for k, size in enumerate(sizes):
                if host[k]:
                    files.append(_HostDecode(decodes, k))
                elif held[k] is not None:
                    files.append(functools.partial(getattr, held[k], "bytes"))
                elif k in pins:
                    files.append(functools.partial(_pinned_or_own, pins[k]))
                elif size:
                    files.append(_StagedFile(staging, next(it)))
                else:
                    files.append(None)
            def queued(out, ready):  # the GPU's files are on their way: the CPU's decodes start
                fetching.done()
                decodes.start(out, block.places, ready)

            return _move_and_decode(lay, block, files, [0 if h else n for h, n in zip(host, sizes)], queued)
        finally:
            # whatever happened (the block's stream was synchronized on the way out), no read or
            # decode may still be writing into a buffer, nor a copy reading a pinned file, when
            # they go back
            fetching.done()
            futures_wait(list(pins.values()))
            if staging is not None:
                staging.close()
            decodes.close()
            for f in held + [_pinned_by([job]) for job in pins.values()]:
                if f is not None:
                    pinned.unpin_file(f)


def _on_host(lay: Layout, sizes: list[int], held: list, blocks: int) -> list[bool]:
    """For each file of a block, True where the CPU decodes it (:mod:`pipeline.gpu.split`): files of
    one large zstd frame, where the I/O threads would finish them sooner than nvCOMP. Files that
    hold many frames (shards) and files already pinned for the GPU stay on the GPU."""
    if lay.codec != "zstd" or lay.sharded:
        return [False] * len(sizes)
    threads = max(1, io_pool().threads // max(1, blocks))
    frames_of = [[lay.inner_nbytes] if size and held[k] is None else [] for k, size in enumerate(sizes)]
    return split.plan(frames_of, threads)


class _GpuFiles:
    """While a block's GPU files are being pinned or read (until :meth:`done`), new pinned buffers
    for the CPU's decodes wait (:func:`_gpu_files_fetched`): both register memory with the driver,
    and a block's 2.4 GB buffer taken beside the pinning of another block's files slowed the
    pinning from 0.02-0.05 s to 0.27 s a file, holding back that block's GPU batch, the longest
    part of the run."""

    def __init__(self, active: bool):
        self.active = active
        if active:
            with state.decode.gpu_files_done:
                state.decode.gpu_files += 1

    def done(self) -> None:
        if self.active:
            self.active = False
            with state.decode.gpu_files_done:
                state.decode.gpu_files -= 1
                state.decode.gpu_files_done.notify_all()


def _gpu_files_fetched(timeout: float = 1.0) -> None:
    """Wait (at most ``timeout`` seconds) until no block's GPU files are being pinned or read."""
    with state.decode.gpu_files_done:
        state.decode.gpu_files_done.wait_for(lambda: state.decode.gpu_files == 0, timeout)


class _HostDecodes:
    """The files of a block that the CPU decodes, once :meth:`start` is called: each file's decode
    is submitted to the I/O threads, which decode it into a pinned buffer of one chunk and copy it
    to its place on the device themselves (:func:`_decode_to_device`). :meth:`close` waits for
    every decode and gives back the buffers of chunks that the task places itself (those cut by
    the array's edge).

    One chunk's buffer a decode, given back as soon as its copy is done, rather than one buffer
    for all the block's host files: those were 0.9-2.7 GB each, new in each block's first use (the
    share of a block decoded on the host varies), and took 0.27-0.93 s each to fault in (4.2 s of
    a 2-GPU worker's threads on zarr's default store, with most of its I/O threads touching pages
    instead of decoding; benchmarks/RESULTS.md). Chunk-sized buffers all serve one another, so a
    process faults in at most one per I/O thread, once."""

    def __init__(self, lay: Layout, paths: list[str], held: list, host: list[bool]):
        self.lay, self.paths, self.held, self.host = lay, paths, held, host
        self.jobs: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.started = not any(host)

    def start(self, out, places, ready) -> None:
        """Submit the decodes; each whole chunk is copied into ``out[place]`` on the device once
        the event ``ready`` is done (the block's device memory free of earlier readers)."""
        import cupy as cp

        with self.lock:
            if self.started:
                return
            self.started = True
            lay = self.lay
            if pinned.free_for(lay.inner_nbytes) < sum(self.host):
                _gpu_files_fetched()  # new pinned memory is taken: not beside the GPU's files
            device = cp.cuda.Device().id
            pool = io_pool()
            ticket = pool.ticket()
            for k, on_host in enumerate(self.host):
                if on_host:
                    local = places[k]
                    target = out[local]
                    whole = tuple(sl.stop - sl.start for sl in local) == lay.chunk
                    to = target if whole and target.flags.c_contiguous else None
                    self.jobs[k] = pool.submit(_decode_to_device, lay, self.paths[k], self.held[k], to, device,
                                               ready, ticket=ticket)

    def get(self, k: int):
        """File ``k``, once its decode is done: None where it is in place on the device, else its
        decoded bytes (a pinned buffer that :meth:`close` gives back)."""
        return self.jobs[k].result()

    def close(self) -> None:
        with self.lock:
            futures_wait(list(self.jobs.values()))
            for job in self.jobs.values():
                if job.exception() is None and job.result() is not None:
                    pinned.give(job.result())
            self.jobs.clear()


class _HostDecode:
    """File ``k`` of a block, decoded by the CPU (:class:`_HostDecodes`): calling it waits for
    that; ``out`` is then None (the chunk is in place on the device) or its decoded bytes."""

    def __init__(self, group: _HostDecodes, k: int):
        self.group, self.k = group, k
        self.out = None

    def __call__(self):
        buf = self.group.get(self.k)
        self.out = None if buf is None else buf.bytes[:self.group.lay.inner_nbytes]
        return self


def _decode_to_device(lay: Layout, path: str, held, target, device: int, ready):
    """Run by an I/O thread: one chunk file decoded into a pinned buffer of one chunk
    (:func:`_decode_file`), then, where ``target`` (its place on the device, whole and contiguous)
    is given, copied there on a stream of this thread once ``ready`` is done, and the buffer given
    back (None returned); else the buffer, for the task to place."""
    import cupy as cp

    nbytes = lay.inner_nbytes
    buf = pinned.take(nbytes, inline=True)
    try:
        _decode_file(lay, path, held, buf.bytes[:nbytes])
        if target is None:
            return buf
        with cp.cuda.Device(device):
            stream = copy_stream()
            stream.wait_event(ready)
            target.reshape(-1).view(np.uint8).set(buf.bytes[:nbytes], stream=stream)
            stream.synchronize()
    except BaseException:
        pinned.give(buf)
        raise
    pinned.give(buf)
    return None


def _decode_file(lay: Layout, path: str, held, out: np.ndarray) -> None:
    """One chunk file of one zstd frame decoded on this thread into ``out``, straight from the page
    cache (a read-only mapping: no copy of the compressed bytes), timed for :mod:`.split`."""
    import time

    import numcodecs

    blob = _mapped(path, held)
    offsets, sizes, _ = frames(lay, blob)
    t = time.perf_counter()
    try:
        numcodecs.Zstd().decode(blob[int(offsets[0]):int(offsets[0] + sizes[0])], out=out)
    except Exception as e:  # a corrupt frame: zarr reads the block again and names the chunk
        raise DecodeError(f"{path}: {e}") from e
    split.observe_cpu(len(out), time.perf_counter() - t)


def _mapped(path: str, held) -> np.ndarray:
    """A file's bytes as a NumPy array: its pinned mapping where it has one, else a read-only
    mapping, populated up front (:func:`pipeline.gpu.engine.map_file`)."""
    if held is not None:
        return held.bytes
    blob = map_file(path)
    if blob is None:  # gone since the block was planned: zarr reads the block
        raise FileNotFoundError(path)
    return blob


class _Staging:
    """The files of one block read into pinned buffers (neither pinned where they lie nor decoded by
    the CPU), in the block's order, through at most ``DEPTH`` buffers of about ``SEGMENT`` bytes at
    a time. A buffer goes back for the next files once its files have crossed to the device and
    what the decode needs of their host bytes was taken (:func:`_arrived`).

    One buffer for all of a block's files (1.7 GB of Blosc files for a block of 2.8 GB) made a
    fresh process pin one of them a thread before its first reads could start: new pinned memory
    is faulted in and registered before a read can go into it. Traced, the user's command on 18.2
    GB of Zarr v2 Blosc on one H200 spent 2.1-2.4 s of its task threads' time making 8 of them
    (13.6 GB); through segments of 64 MB, two at a time, 0.2 s making 12, and the run took
    1.34-1.40 s against 1.68-1.76 s (benchmarks/RESULTS.md, "A block's files looked up and
    staged"). Buffers of one size serve every segment: a process pins at most ``DEPTH`` of them a
    thread, once."""

    def __init__(self, paths: list[str], sizes: list[int]):
        self.paths, self.sizes = paths, sizes
        self.segments = _segments(sizes, SEGMENT)
        self.segment_of = [s for s, (a, b) in enumerate(self.segments) for _ in range(a, b)]
        self.group = group_bytes(sum(sizes))  # the block's, not a segment's: as few jobs as before
        self.files: list[tuple[np.ndarray, int, list[Future]] | None] = [None] * len(paths)
        self.buffers: dict[int, pinned.Buffer] = {}
        self.crossing: collections.deque = collections.deque()  # (segment, event once its copies are done)
        self.jobs: list[Future] = []
        self.next = 0
        for _ in range(DEPTH):
            self._submit()

    def _submit(self) -> None:
        s = self.next
        if s == len(self.segments):
            return
        self.next += 1
        a, b = self.segments[s]
        # buffers of one size, SEGMENT (or the whole block, or one larger file), serve every
        # segment: sized to each segment's files, one a few bytes larger than the buffer given
        # back took a new one (32 new buffers for 24 in use, in a fresh process on one H200)
        nbytes = sum(self.sizes[a:b])
        buf = self.buffers[s] = pinned.take(max(nbytes, SEGMENT) if len(self.segments) > 1 else nbytes)
        for i, (start, waits) in zip(range(a, b), submit_reads(self.paths[a:b], self.sizes[a:b], buf.bytes, self.group)):
            self.files[i] = (buf.bytes, start, waits)
            self.jobs += waits

    def wait(self, i: int) -> tuple[np.ndarray, int]:
        """File ``i``'s buffer and start there, once it is read."""
        while self.files[i] is None:  # its segment waits for a buffer (files are taken in order)
            if self.crossing:
                self._recycle()
            else:
                self._submit()
        buffer, start, waits = self.files[i]
        for job in waits:
            job.result()
        return buffer, start

    def last_of_segment(self, i: int) -> bool:
        return i == self.segments[self.segment_of[i]][1] - 1

    def crossed(self, i: int, stream) -> None:
        """The copies of file ``i``'s segment (``i`` its last file) are queued on ``stream``: its
        buffer goes to the next segment once they are done."""
        self.crossing.append((self.segment_of[i], stream.record()))
        if self.next < len(self.segments):
            self._recycle()

    def _recycle(self) -> None:
        s, done = self.crossing.popleft()
        done.synchronize()
        pinned.give(self.buffers.pop(s))
        self._submit()

    def close(self) -> None:
        """Once no copy reads the buffers (the block's stream synchronized): every read waited for,
        the buffers given back."""
        futures_wait(self.jobs)
        for buf in self.buffers.values():
            pinned.give(buf)
        self.buffers.clear()


def _segments(sizes: list[int], nbytes: int) -> list[tuple[int, int]]:
    """Consecutive files in runs of at most ``nbytes`` (a larger file alone): (first, end) each."""
    out, first, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > first and total + size > nbytes:
            out.append((first, i))
            first, total = i, 0
        total += size
    if sizes:
        out.append((first, len(sizes)))
    return out


class _StagedFile:
    """File ``index`` of a block's :class:`_Staging`: calling it waits for it and returns its bytes;
    ``buffer`` and ``start`` then say where they are. Files next to each other in one buffer and in
    the device buffer cross the bus in one copy (:func:`_move_and_decode`)."""

    __slots__ = ("staging", "index", "buffer", "start", "size")

    def __init__(self, staging: _Staging, index: int):
        self.staging, self.index = staging, index
        self.size = staging.sizes[index]

    def __call__(self) -> np.ndarray:
        self.buffer, self.start = self.staging.wait(self.index)
        return self.buffer[self.start:self.start + self.size]


def _pinned_or_own(job: Future) -> np.ndarray:
    """A file's bytes once :func:`_pin_or_own` is done: the pinned file's, or its own copy's."""
    result = job.result()
    return result.bytes if isinstance(result, pinned.PinnedFile) else result


def _pinned_by(waits: list[Future]):
    """The file that a pinning job pinned, if it did (None otherwise, or where it failed)."""
    if len(waits) == 1 and waits[0].done() and not waits[0].exception():
        result = waits[0].result()
        if isinstance(result, pinned.PinnedFile):
            return result
    return None


def _move_and_decode(lay: Layout, block, files, sizes, start_host=None):
    """``files``: for each chunk of ``block`` (:func:`pipeline.gpu.engine.block_chunks`), a function
    that waits for its file's bytes in pinned host memory and returns them (None for a chunk with no
    file); ``sizes``: the files' sizes; ``start_host(out, ready)``: called once the GPU's work is
    queued, to start the CPU's decodes into ``out`` once the event ``ready`` is done."""
    import cupy as cp

    file_starts = list(itertools.accumulate([0] + sizes[:-1]))  # places in the device buffer

    # The device buffers are taken once the block's first file is there, so that a task waiting
    # for its turn in the I/O pool holds no device memory (under a 4 GB budget, three threads
    # holding them while they waited ran out of memory). A block that the CPU decodes whole takes
    # them first: its decodes copy into them.
    present = [f for f, size in zip(files, sizes) if f and size]
    if present:
        present[0]()
    # both device buffers come from the default stream's arena (pipeline.gpu.engine.block_stream)
    out = cp.empty(block.shape, dtype=lay.dtype)
    dev = cp.empty(max(1, sum(sizes)), dtype=np.uint8)

    with block_stream() as stream:
        ready = stream.record()  # done once the block's memory is free of earlier readers
        # each file crosses the bus once it is there, while the block's later files are read; files
        # read one after another into one buffer cross together, up to COPY bytes a copy (12,410
        # copies of 2.6 MB, one a file, took 3.3 s of a worker's task threads' time on the 2-GPU
        # H200 machine, most of it waiting for the GIL among the I/O threads)
        blobs = []  # each file's frames (_arrived), or what it is if it has no bytes here
        run = None  # staged files not copied yet: [buffer, start there, start in dev, bytes]
        segment = []  # the staged files of the segment being read: (place in blobs, start, size)
        for f, start, size in zip(files, file_starts, sizes):
            if not (f and size):
                blobs.append(f)
                continue
            blob = f()
            staged = isinstance(f, _StagedFile)
            if segment and not (staged and run is not None and run[0] is f.buffer):
                _arrived_segment(lay, blobs, segment, run[0])  # (a segment's files share a buffer)
            if (staged and run is not None and run[0] is f.buffer and run[1] + run[3] == f.start
                    and run[2] + run[3] == start and run[3] < COPY):
                run[3] += size
            else:
                _copy_run(run, dev, stream)
                run = [f.buffer, f.start, start, size] if staged else None
                if run is None:
                    dev[start:start + size].set(blob, stream=stream)
            if staged:  # its frames are read with its segment's, before the buffer is read into again
                segment.append((len(blobs), f.start, size))
                blobs.append(None)
            else:
                blobs.append(_arrived(lay, blob))
            if staged and f.staging.last_of_segment(f.index):
                _arrived_segment(lay, blobs, segment, f.buffer)
                _copy_run(run, dev, stream)
                run = None
                f.staging.crossed(f.index, stream)
        if segment:
            _arrived_segment(lay, blobs, segment, run[0])
        _copy_run(run, dev, stream)
        # The block's frames decode in one batch, once all are across. Decoding each file as soon
        # as it is across, while the next is read, was slower for zstd shards (0.25 s against
        # 0.19-0.21 s for 6.1 GB in blocks of 3-5 shards), and so was decoding each segment of
        # Blosc files as it crossed (ERA5-style Blosc, one H200: 1.67-1.69 s against 1.34-1.40 s
        # for 18.2 GB), since nvCOMP's speed comes from the frames it decodes at once.
        timing = _GpuTiming(lay, sum(isinstance(b, _Arrived) for b in blobs), stream)
        on_host = _decode(lay, block.places, file_starts, blobs, dev, out)
        timing.stop(stream)
        if start_host is not None:
            start_host(out, ready)
        _place_host_decoded(lay, on_host, out, stream)
    timing.observe()
    return out


def _decode(lay: Layout, places, starts, blobs, dev, out) -> list:
    """Queue the decode of a block's files (their places in ``out``, starts in ``dev``, and
    :func:`_arrived` frames, or None where the chunk has no file, or a :class:`_HostDecode`):
    each chunk decodes straight into ``out`` when its place there is one contiguous run and whole,
    else into a scratch chunk that one copy puts in place; absent chunks take the fill value.
    Returns the CPU's files, (place, decode), for the caller to place."""
    direct, scratch, on_host = [], [], []
    for local, start, blob in zip(places, starts, blobs):
        target = out[local]
        whole = tuple(sl.stop - sl.start for sl in local) == lay.chunk
        if blob is None:
            target.fill(lay.fill_value)
        elif isinstance(blob, _HostDecode):
            on_host.append((local, blob))
        elif whole and target.flags.c_contiguous and lay.contiguous_inner:
            direct.append((target, start, blob))
        else:
            scratch.append((local, start, blob))
    _decode_into_place(lay, direct, dev, out)
    _decode_scratch(lay, scratch, dev, out)
    return on_host


def _copy_run(run, dev, stream) -> None:
    """Staged files next to each other (``run``: [buffer, start there, start in ``dev``, bytes])
    to the device in one asynchronous copy."""
    if run is not None:
        buffer, start, at, nbytes = run
        dev[at:at + nbytes].set(buffer[start:start + nbytes], stream=stream)


@dataclass(frozen=True)
class _Arrived:
    """What a block's decode needs of a file's host bytes, taken as soon as the file is read: its
    frames (:func:`frames`, which also checks their checksums) and what the codec reads of each on
    the host (:func:`pipeline.gpu.engine.frame_headers`; Blosc's headers): None, a list (one a
    frame), or (batch, first, end), the rows of the file's frames in a :class:`blosc.Batch`
    parsed with the other files of its segment."""

    offsets: np.ndarray
    sizes: np.ndarray
    present: np.ndarray
    headers: object


def _arrived(lay: Layout, blob) -> _Arrived:
    return _arrived_many(lay, blob, [(0, len(blob))])[0]


def _arrived_many(lay: Layout, buffer, files) -> list[_Arrived]:
    """:class:`_Arrived` for each of ``files`` ((start, size) in ``buffer``), their headers read at
    once: Blosc's parsed one by one took 60 us a chunk, under the GIL of the threads that also keep
    the reads going (4,380 chunks for 18.2 GB of ERA5-style Blosc), and 7-30 us a chunk in a
    segment's batch."""
    found = [frames(lay, buffer[s:s + n]) for s, n in files]
    if lay.codec != "blosc":
        return [_Arrived(o, z, p, None) for o, z, p in found]
    counts = [len(o) for o, _, _ in found]
    offsets = np.concatenate([o + s for (o, _, _), (s, _) in zip(found, files)])
    headers = frame_headers(lay.codec, buffer, offsets, np.concatenate([z for _, z, _ in found]))
    firsts = itertools.accumulate([0] + counts[:-1])
    if isinstance(headers, list):
        return [_Arrived(o, z, p, headers[a:a + n]) for (o, z, p), a, n in zip(found, firsts, counts)]
    return [_Arrived(o, z, p, (headers, a, a + n)) for (o, z, p), a, n in zip(found, firsts, counts)]


def _arrived_segment(lay: Layout, blobs: list, segment: list, buffer) -> None:
    """The staged files of a segment (``segment``: (place in ``blobs``, start, size), in
    ``buffer``), their frames read at once into their places in ``blobs``; ``segment`` emptied."""
    for (place, _, _), arrived in zip(segment, _arrived_many(lay, buffer, [(s, n) for _, s, n in segment])):
        blobs[place] = arrived
    segment.clear()


def _frame_lists(lay: Layout, items, base_of):
    src_off, src_size, dst_off, present_all = [], [], [], []
    for k, (target, start, arrived) in enumerate(items):
        offsets, sizes, present = arrived.offsets, arrived.sizes, arrived.present
        src_off.extend((offsets + start).tolist())
        src_size.extend(sizes.tolist())
        dst_off.extend((base_of(k, target) + present * lay.inner_nbytes).tolist())
        present_all.append(present)
    return src_off, src_size, dst_off, present_all


def _run_frames(lay, dev, src_off, src_size, dst, dst_off, items):
    decode_frames(lay.codec, dev, src_off, src_size, dst, dst_off, lay.inner_nbytes,
                  hosts=functools.partial(_frame_hosts, lay, items), root=lay.root)


def _frame_hosts(lay: Layout, items) -> list:
    """What the codec read of every frame of ``items`` on the host (Blosc's headers), as
    :func:`pipeline.gpu.blosc.decode_frames` takes it: the rows of files that follow one another
    in one batch taken from it at once."""
    hosts, span = [], None  # span: [batch, first, end] of such files, not yet taken
    for _, _, arrived in items:
        h = arrived.headers
        if span is not None and not isinstance(h, list) and span[0] is h[0] and span[2] == h[1]:
            span[2] = h[2]
            continue
        if span is not None:
            hosts.append(span[0].take(span[1], span[2]))
        span = None if isinstance(h, list) else list(h)
        if span is None:
            hosts += h
    if span is not None:
        hosts.append(span[0].take(span[1], span[2]))
    return hosts


class _GpuTiming:
    """CUDA events around a block's nvCOMP batch, read once the stream is synchronized, for the
    rates of :mod:`.split`."""

    def __init__(self, lay: Layout, frames: int, stream):
        import cupy as cp

        self.frames = frames if lay.codec == "zstd" else 0
        self.nbytes = lay.inner_nbytes * (math.prod(lay.grid) if lay.sharded else 1)
        self.lay = lay
        self.start = cp.cuda.Event() if self.frames else None
        if self.start is not None:
            self.start.record(stream)

    def stop(self, stream) -> None:
        import cupy as cp

        if self.start is not None:
            self.end = cp.cuda.Event()
            self.end.record(stream)

    def observe(self) -> None:
        import cupy as cp

        if self.start is not None:
            seconds = cp.cuda.get_elapsed_time(self.start, self.end) / 1e3
            split.observe_gpu(self.lay.inner_nbytes, self.frames * self.nbytes, seconds)


def _place_host_decoded(lay: Layout, items, out, stream) -> None:
    """Chunks decoded by the CPU: waits for each; those the I/O threads did not copy into place
    (cut by the array's edge) go to the device whole, then their part into place."""
    import cupy as cp

    for local, decode in items:
        decode()
        if decode.out is not None:
            chunk = cp.empty(lay.chunk, dtype=lay.dtype)
            chunk.reshape(-1).view(np.uint8).set(decode.out, stream=stream)
            copy_into(out[local], chunk[tuple(slice(0, sl.stop - sl.start) for sl in local)])


def _decode_into_place(lay: Layout, direct, dev, out) -> None:
    """Decode whole chunks straight into their (contiguous) places in ``out``."""
    if not direct:
        return
    import cupy as cp

    src_off, src_size, dst_off, present_all = _frame_lists(lay, direct, lambda k, t: t.data.ptr - out.data.ptr)
    _run_frames(lay, dev, src_off, src_size, out, dst_off, direct)
    count = math.prod(lay.grid)
    for (target, _, _), present in zip(direct, present_all):
        if len(present) < count:  # inner chunks absent from the shard hold the fill value
            missing = np.setdiff1d(np.arange(count), present)
            target.reshape(count, -1)[cp.asarray(missing)] = lay.fill_value


def _decode_scratch(lay: Layout, scratch, dev, out) -> None:
    if not scratch:
        return
    import cupy as cp

    count = math.prod(lay.grid)
    buf = cp.empty((len(scratch), count, *lay.inner), dtype=lay.dtype)
    per_chunk = count * lay.inner_nbytes
    src_off, src_size, dst_off, present_all = _frame_lists(lay, scratch, lambda k, t: k * per_chunk)
    _run_frames(lay, dev, src_off, src_size, buf, dst_off, scratch)
    for k, ((local, _, _), present) in enumerate(zip(scratch, present_all)):
        chunk = assemble(cp, lay, buf[k][cp.asarray(present)] if len(present) < count else buf[k], present)
        copy_into(out[local], chunk[tuple(slice(0, sl.stop - sl.start) for sl in local)])


# --- Dask arrays ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSource(BlockSource):
    """A Zarr array as a source for ``dask.array.from_array``: ``source[region]`` is a CuPy array
    read by :func:`read_block`."""

    lay: Layout

    @property
    def reads_ahead(self) -> bool:
        return not self.lay.sharded  # a chunk file is one frame; a shard's frames batch well

    def read(self, region):
        return read_block(self.lay, region)

    def read_host(self, region, out):
        read_block_host(self.lay, region, frames, out)

    def fallback_warning(self, e: Exception) -> str:
        # a frame nvCOMP refuses (or a shard index that does not hold): zarr decodes this block
        # instead, and names the chunk if it cannot either
        return f"{self.lay.root}: nvCOMP could not decode a block ({e}); zarr decodes it on the CPU"

    def staged(self):
        return StagedSource(self.lay.root, self.ndim, self.shape, self.dtype)

    def __dask_tokenize__(self):
        return ("pipeline.gpu.reader.GpuSource", self.lay, _metadata_stamp(self.lay.root))


@dataclass(frozen=True)
class StagedSource:
    """Any Zarr array, decoded by zarr on the CPU straight into pinned memory and copied to the
    device asynchronously: the path for codecs that nvCOMP does not decode."""

    root: str  # the array's directory
    ndim: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, region):
        from zarr.core.buffer.cpu import NDBuffer

        use_device_memory_limit()
        arr = _open_zarr_array(self.root)

        def fill(host):
            try:
                arr.get_basic_selection(region, out=NDBuffer.from_numpy_array(host))
            except Exception as e:  # a chunk zarr cannot decode: an InputError that names it
                root = Path(self.root)
                raise chunk_error(root.parent, root.name, tuple(region), e, arr) from None

        return staged_read(tuple(s.stop - s.start for s in region), self.dtype, fill)


def _metadata_stamp(root: str | os.PathLike) -> tuple[int, int, int]:
    """Identity of an array's metadata file: a store rewritten at the same path has another."""
    meta = Path(root) / ("zarr.json" if (Path(root) / "zarr.json").exists() else ".zarray")
    st = os.stat(meta)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _open_zarr_array(root: str):
    """The zarr array at ``root``, opened once for each version of its metadata (a cache by path
    alone would read a store rewritten in place with its predecessor's shape and dtype)."""
    return _open_zarr_array_at(root, _metadata_stamp(root))


@functools.lru_cache(maxsize=64)
def _open_zarr_array_at(root: str, stamp: tuple[int, int, int]):
    import zarr

    return zarr.open_array(root, mode="r")


def open_array(store: str | os.PathLike, name: str, chunks=None, *, nvcomp: bool | None = None):
    """A Dask array of CuPy chunks for the Zarr array ``name`` of ``store``.

    ``chunks`` defaults to the store's chunks (or shards); other chunks must be whole multiples
    of them for the nvCOMP path. nvCOMP decodes where the layout allows (``nvcomp`` overrides the
    ``pipeline.gpu.nvcomp`` setting); everything else is decoded by zarr into pinned memory.
    """
    import dask.array as da

    root = str(Path(store) / name)
    arr = _open_zarr_array(root)
    chunks = da.core.normalize_chunks(chunks if chunks is not None else arr.shards or arr.chunks, arr.shape, dtype=arr.dtype)
    use_nvcomp = config.get("gpu.nvcomp", False) if nvcomp is None else nvcomp
    source = None
    if use_nvcomp and nvcomp_available():
        try:
            lay = layout(root)
            if aligned(chunks, lay.chunk):
                source = GpuSource(lay, arr.ndim, arr.shape, lay.dtype, chunks)
                build_soon()
        except UnsupportedLayout:
            pass
    if source is None:
        source = StagedSource(root, arr.ndim, arr.shape, np.dtype(arr.dtype))
    return dask_array(source, chunks, arr.dtype, name)
