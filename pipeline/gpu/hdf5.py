"""NetCDF4/HDF5 chunks straight onto the GPU: deflate streams cross the bus, nvCOMP inflates them.

Most climate model output is NetCDF4: HDF5 datasets in chunks, each passed through HDF5's filter
pipeline on write (the shuffle filter, then deflate, zlib's format; sometimes a fletcher32
checksum last). Read through h5py, every chunk is inflated on the CPU under HDF5's global lock, one
at a time, whatever the number of Dask threads. This module reads the stored chunks' bytes
itself, from the byte offsets and sizes that HDF5's chunk index records (:func:`layout`), and
decodes them on the device. One Dask task reads one block of whole chunks:

1. the block's chunks are read from the file into one pinned host buffer by the I/O pool, chunks
   that lie next to each other in the file (most do) in one read, large reads in pieces;
2. each read crosses to the device by an asynchronous copy on the task's stream as it completes;
3. the zlib wrapper of every stream is checked on the host (and the fletcher32 checksum, where
   the dataset has one), and one nvCOMP Deflate batch inflates every stream of the block straight
   into its place in the output (into a scratch buffer where chunks are cut by the array's edge or
   do not lie contiguously in the block); nvCOMP checks no checksum, so each stream's adler32 is
   computed on the device from what it inflated to and compared at the end of the block, as zlib
   would (a damaged stream otherwise decodes to wrong values without an error);
4. the shuffle filter is undone on the same stream, a transpose copy per run of chunks through a
   bounded temporary: byte ``j`` of element ``i`` of a chunk of ``n`` elements was stored at
   ``j * n + i``;
5. unallocated chunks take the dataset's fill value; scratch chunks are cropped into place.

Chunks whose inflated size exceeds ``NVCOMP_MAX_FRAME`` are inflated by the I/O threads on
the CPU (zlib releases the GIL) into pinned memory instead: nvCOMP decodes one stream on few
threads, and is fast only on many streams at once. The shuffle is still undone on the device.

Datasets the path does not take (other filters such as szip or lzf, big-endian or non-numeric
types, filters in another order) raise :class:`~pipeline.errors.UnsupportedLayout`; they, and blocks
nvCOMP refuses, are read by h5py into pinned memory and copied to the device
(:class:`H5StagedSource`).

The layout, the block plan and the decode order are plain Python and NumPy, tested on every
machine against h5py itself: :func:`decode_chunk_host` decodes one chunk as HDF5 does, and
:func:`read_block_host` runs a block's plan with NumPy in place of CuPy and zlib in place of nvCOMP.
What this module shares with :mod:`pipeline.gpu.reader` (a block's chunks and places, reads, the
block's stream, the batched decode, the fallback and the Dask array) is in :mod:`pipeline.gpu.engine`.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import zlib
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, replace

import numpy as np

from .. import config
from ..backend import use_device_memory_limit
from ..errors import DecodeError, UnsupportedLayout, chunk_error
from ..kernels import checksum
from ..kernels.shuffle import byte_unshuffle_into
from . import pinned
from .blosc import _warn_once
from .engine import PIECE, BlockSource, aligned, block_chunks, block_stream, dask_array, decode_frames, pread_into, staged_read
from .iopool import io_pool
from .nvcomp import nvcomp_available

# The host inflates through CPython's zlib, which releases the GIL around each inflate: on the
# H200 machine's 16 cores, out of core, 1,460 NetCDF4 chunks inflated in 15 s of threads' time,
# the run 2.7 s. zlib-ng's binding (python-zlib-ng 1.1) inflates a chunk twice as fast on one
# thread but does not scale over threads (0.97 GB/s on one, 0.96 on two): there 61 s, and 6.9 s.
# A deflate stream inflates on few of the GPU's units, as a zstd frame does: chunks larger than this
# are inflated by the I/O threads. The cut comes from zstd's measurements (a frame of hundreds of
# MB decodes slower on the GPU than on one core); deflate's have not been made.
NVCOMP_MAX_FRAME = 64 << 20

# HDF5's filter identifiers (H5Zpublic.h) and the write order this path decodes: any subsequence
FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32"}
ORDER = ("shuffle", "deflate", "fletcher32")
GAP = 64 << 10  # chunks this close in the file are read together, the bytes between them too
# nvCOMP refuses a stream whose input or output is not aligned (Deflate: 4 bytes for the input):
# each chunk is read to a place where its deflate data, after zlib's 2-byte header, starts aligned,
# and decodes to an aligned place
ALIGN = 16
IOV_MAX = 512  # buffers a read scatters into, at most
UNSHUFFLE_BYTES = 64 << 20  # the temporary through which shuffled chunks are transposed in place


# --- layout -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class H5Layout:
    """How one HDF5 dataset lays its values out in its file.

    ``offsets``, ``sizes`` and ``masks`` have the shape of the chunk grid: each stored chunk's byte
    offset in the file (-1 where the chunk was never written: it holds ``fill_value``), its stored
    size and its filter mask (bit ``k`` set: filter ``k`` of ``filters`` was skipped for it).
    A contiguous dataset is described as chunks of one row (``(1, *shape[1:])``), unfiltered.
    """

    path: str
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk: tuple[int, ...]
    filters: tuple[str, ...]  # in write order
    fill_value: object
    offsets: np.ndarray
    sizes: np.ndarray
    masks: np.ndarray
    contiguous: bool = False

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one chunk once decoded: edge chunks are stored whole, padded."""
        return math.prod(self.chunk) * self.dtype.itemsize

    @property
    def host_inflate(self) -> bool:
        """Streams this large are inflated on the CPU (see the module docstring)."""
        return "deflate" in self.filters and self.chunk_nbytes > NVCOMP_MAX_FRAME

    def active(self, name: str, mask: int) -> bool:
        """Whether filter ``name`` was applied to a chunk stored with filter mask ``mask``."""
        return name in self.filters and not (int(mask) >> self.filters.index(name)) & 1


def file_stamp(path: str | os.PathLike) -> tuple[int, int, int]:
    """Identity of a file's contents: a file rewritten at the same path has another."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def layout(path: str | os.PathLike, variable: str) -> H5Layout:
    """The layout of dataset ``variable`` of the HDF5 (NetCDF4) file at ``path``, read once for
    each version of the file. Raises :class:`UnsupportedLayout` for what the GPU path does not
    decode."""
    path = os.fspath(path)
    return _layout_at(path, variable, file_stamp(path))


@functools.lru_cache(maxsize=64)
def _layout_at(path: str, variable: str, stamp: tuple) -> H5Layout:
    import h5py

    with h5py.File(path, "r") as f:
        dset = f.get(variable)
        if not isinstance(dset, h5py.Dataset):
            raise UnsupportedLayout(f"{path}: {variable!r} is not a dataset")
        if dset.ndim == 0:
            raise UnsupportedLayout(f"{path}: {variable!r} is a scalar")
        dtype = _dtype(dset)
        dcpl = dset.id.get_create_plist()
        kind = dcpl.get_layout()
        common = dict(path=path, name=variable, shape=tuple(dset.shape), dtype=dtype,
                      fill_value=dtype.type(dset.fillvalue))
        if kind == h5py.h5d.CONTIGUOUS and dcpl.get_external_count() == 0:
            return _contiguous(dset, common)
        if kind != h5py.h5d.CHUNKED:
            raise UnsupportedLayout(f"{path}: {variable!r} is neither chunked nor contiguous in its file")
        filters = _filters(dcpl, dtype)
        chunk = tuple(dset.chunks)
        offsets, sizes, masks = _chunk_index(dset, chunk)
        return H5Layout(**common, chunk=chunk, filters=filters, offsets=offsets, sizes=sizes, masks=masks)


def _dtype(dset) -> np.dtype:
    dtype = dset.dtype
    if dtype.kind not in "iuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise UnsupportedLayout(f"{dset.file.filename}: {dset.name!r} holds {dtype}, not numbers")
    if dtype.itemsize > 1 and dtype != dtype.newbyteorder("<"):
        raise UnsupportedLayout(f"{dset.file.filename}: {dset.name!r} is big-endian")
    return dtype.newbyteorder("=")


def _filters(dcpl, dtype: np.dtype) -> tuple[str, ...]:
    """The dataset's filters in write order; only shuffle, deflate and fletcher32, in that order."""
    names = []
    for i in range(dcpl.get_nfilters()):
        code, _, values, label = dcpl.get_filter(i)
        if code not in FILTERS:
            raise UnsupportedLayout(f"filter {label.decode(errors='replace') or code}")
        if FILTERS[code] == "shuffle" and values and values[0] != dtype.itemsize:
            raise UnsupportedLayout(f"shuffle of {values[0]}-byte elements in {dtype}")
        names.append(FILTERS[code])
    if [n for n in ORDER if n in names] != names:
        raise UnsupportedLayout(f"filters in the order {names}")
    return tuple(names)


def _chunk_index(dset, chunk: tuple[int, ...]):
    """(offsets, sizes, masks) over the chunk grid, from HDF5's chunk index."""
    grid = tuple(-(-n // c) for n, c in zip(dset.shape, chunk))
    offsets = np.full(grid, -1, dtype=np.int64)
    sizes = np.zeros(grid, dtype=np.int64)
    masks = np.zeros(grid, dtype=np.int64)

    def visit(info):
        at = tuple(o // c for o, c in zip(info.chunk_offset, chunk))
        offsets[at], sizes[at], masks[at] = info.byte_offset, info.size, info.filter_mask

    if hasattr(dset.id, "chunk_iter"):
        dset.id.chunk_iter(visit)
    else:  # h5py < 3.8
        for i in range(dset.id.get_num_chunks()):
            visit(dset.id.get_chunk_info(i))
    return offsets, sizes, masks


def _contiguous(dset, common: dict) -> H5Layout:
    """A contiguous dataset as unfiltered chunks of one row each (or the whole of a 1-D one)."""
    shape = common["shape"]
    chunk = (1, *shape[1:]) if len(shape) > 1 else shape
    grid = tuple(-(-n // c) for n, c in zip(shape, chunk))
    row = math.prod(chunk) * common["dtype"].itemsize
    base = dset.id.get_offset()
    if base is None:  # never written: all fill value
        offsets = np.full(grid, -1, dtype=np.int64)
    else:
        offsets = (base + row * np.arange(math.prod(grid), dtype=np.int64)).reshape(grid)
    return H5Layout(**common, chunk=chunk, filters=(), offsets=offsets,
                    sizes=np.full(grid, row, dtype=np.int64), masks=np.zeros(grid, dtype=np.int64),
                    contiguous=True)


# --- decoding one chunk on the host ---------------------------------------------------------------


def fletcher32(data) -> int:
    """HDF5's fletcher32 checksum (``H5_checksum_fletcher32``): 16-bit big-endian words summed in
    runs of 360, each run's sums folded to 16 bits and more."""
    raw = np.frombuffer(data, dtype=np.uint8)
    words = raw[: len(raw) // 2 * 2].view(">u2").astype(np.int64)
    if len(raw) % 2:
        words = np.append(words, np.int64(raw[-1]) << 8)
    s1 = s2 = 0
    for at in range(0, len(words), 360):
        run = words[at:at + 360]
        t = len(run)
        total, weighted = int(run.sum()), int((run * np.arange(t, 0, -1)).sum())
        s2 += t * s1 + weighted
        s1 += total
        s1 = (s1 & 0xFFFF) + (s1 >> 16)
        s2 = (s2 & 0xFFFF) + (s2 >> 16)
    s1 = (s1 & 0xFFFF) + (s1 >> 16)
    s2 = (s2 & 0xFFFF) + (s2 >> 16)
    return (s2 << 16) | s1


def check_fletcher32(stored, where: str) -> int:
    """The size of ``stored`` (a chunk's bytes ending in HDF5's fletcher32 checksum) without its
    checksum; DecodeError when it does not match (HDF5 also takes the checksum of HDF5 before
    1.6.3, whose bytes are swapped within each half)."""
    data = np.frombuffer(stored, dtype=np.uint8)
    n = len(data) - 4
    if n < 0:
        raise DecodeError(f"{where}: chunk shorter than its fletcher32 checksum")
    want = int.from_bytes(data[n:].tobytes(), "little")
    got = fletcher32(data[:n])
    swapped = ((got & 0x00FF00FF) << 8) | ((got >> 8) & 0x00FF00FF)
    if want not in (got, swapped):
        raise DecodeError(f"{where}: fletcher32 checksum mismatch")
    return n


def check_zlib_header(head, where: str) -> None:
    """A zlib stream's two-byte header, as zlib checks it: deflate, a window of at most 32 KiB,
    a valid check value, no preset dictionary."""
    if len(head) < 2:
        raise DecodeError(f"{where}: zlib stream too short")
    cmf, flg = int(head[0]), int(head[1])
    if cmf & 0x0F != 8 or cmf >> 4 > 7 or (cmf << 8 | flg) % 31 or flg & 0x20:
        raise DecodeError(f"{where}: not a zlib stream without preset dictionary")


def unshuffle_host(data, typesize: int) -> np.ndarray:
    """HDF5's shuffle filter undone: byte ``j`` of element ``i`` was stored at ``j * n + i``; the
    ``nbytes % typesize`` bytes left over were copied at the end."""
    src = np.frombuffer(data, dtype=np.uint8)
    n = len(src) // typesize
    out = src.copy()
    out[: n * typesize].reshape(n, typesize)[...] = src[: n * typesize].reshape(typesize, n).T
    return out


def decode_chunk_host(lay: H5Layout, raw, mask: int = 0) -> np.ndarray:
    """The CPU twin of the GPU decode: one stored chunk (its bytes and filter mask) -> the chunk's
    values (padded to the whole chunk), undoing the filters in reverse order as HDF5 does."""
    where = f"{lay.path}: {lay.name!r}"
    data = memoryview(raw)
    for name in reversed(lay.filters):
        if not lay.active(name, mask):
            continue
        if name == "fletcher32":
            data = data[: check_fletcher32(data, where)]
        elif name == "deflate":
            try:
                data = memoryview(zlib.decompress(data, bufsize=lay.chunk_nbytes))
            except zlib.error as e:
                raise DecodeError(f"{where}: {e}") from e
        else:
            data = memoryview(unshuffle_host(data, lay.dtype.itemsize))
    if len(data) != lay.chunk_nbytes:
        raise DecodeError(f"{where}: a chunk decodes to {len(data)} bytes, not {lay.chunk_nbytes}")
    return np.frombuffer(data, dtype=lay.dtype).reshape(lay.chunk).copy()


# --- the plan of one block ------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockPlan:
    """Where each chunk of a block comes from and goes to.

    ``places``: each chunk's region of the block, in C order of the chunks; ``present``: the
    indices of the chunks stored in the file, and for each of them (in that order) ``staged``, its
    first byte in the staging buffer, ``stored`` its stored bytes, ``masks`` its filter mask and
    ``dst`` its first byte in its destination; ``runs``: (file offset, bytes, staging offset) of
    each read; ``direct``: every present chunk decodes straight into its place in the block (else
    each into its slot of a scratch buffer, in ``present`` order)."""

    shape: tuple[int, ...]
    places: list
    present: np.ndarray
    staged: np.ndarray
    stored: np.ndarray
    masks: np.ndarray
    dst: np.ndarray
    runs: list
    direct: bool

    @property
    def total(self) -> int:
        """Bytes of the staging buffer."""
        return self.runs[-1].end if self.runs else 0

    def scratch_bytes(self, lay: H5Layout) -> int:
        """Bytes of the scratch buffer (none where chunks decode straight into the block)."""
        return 0 if self.direct else len(self.present) * _aligned(lay.chunk_nbytes)


def plan_block(lay: H5Layout, region: tuple[slice, ...]) -> BlockPlan:
    """The plan of reading ``region`` (whole chunks of ``lay``; the last may be cut by the edge)."""
    shape, first, counts, _, places = block_chunks(region, lay.chunk)
    grid = tuple(slice(f, f + k) for f, k in zip(first, counts))
    offsets = lay.offsets[grid].ravel()
    present = np.flatnonzero(offsets >= 0)
    stored = lay.sizes[grid].ravel()[present]
    masks = lay.masks[grid].ravel()[present]
    heads = np.array([2 * lay.active("deflate", m) for m in masks.tolist()], dtype=np.int64)
    runs, staged = _runs(offsets[present], stored, heads)
    strides = [math.prod(shape[a + 1:]) * lay.dtype.itemsize for a in range(len(shape))]
    dst = np.array([sum(p.start * s for p, s in zip(places[k], strides)) for k in present.tolist()], dtype=np.int64)
    direct = all(_whole_and_contiguous(places[k], lay.chunk, shape) for k in present.tolist()) and not (dst % ALIGN).any()
    if not direct:
        dst = np.arange(len(present), dtype=np.int64) * _aligned(lay.chunk_nbytes)
    return BlockPlan(shape, places, present, staged, stored, masks, dst, runs, direct)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Run:
    """One read of adjacent chunks: ``nbytes`` of the file from ``offset``, scattered as
    ``segments`` (bytes, staging offset; -1 for the bytes between chunks, thrown away) into
    ``[start, end)`` of the staging buffer."""

    offset: int
    nbytes: int
    segments: tuple
    start: int
    end: int

    def pieces(self) -> list[tuple[int, list]]:
        """(file offset, segments) of reads of at most ``PIECE`` bytes and ``IOV_MAX`` buffers
        each, which the I/O threads run in parallel."""
        pieces, current, size, at = [], [], 0, self.offset
        for n, pos in self.segments:
            done = 0
            while done < n:
                take = min(n - done, PIECE - size)
                current.append((take, pos + done if pos >= 0 else -1))
                size, done = size + take, done + take
                if size == PIECE or len(current) == IOV_MAX:
                    pieces.append((at, current))
                    at, current, size = at + size, [], 0
        if current:
            pieces.append((at, current))
        return pieces


def _runs(offsets: np.ndarray, sizes: np.ndarray, heads: np.ndarray):
    """Reads covering the chunks at ``offsets`` (``sizes`` bytes each), chunks up to ``GAP`` apart
    in one :class:`Run`, and each chunk's staging offset: chunks follow each other in file order,
    each placed so that its byte ``heads[k]`` (where its deflate data start) is aligned."""
    staged = np.empty(len(offsets), dtype=np.int64)
    runs: list[Run] = []
    segments: list = []
    first = end = pos = 0
    for k in np.argsort(offsets, kind="stable").tolist():
        o, n, h = int(offsets[k]), int(sizes[k]), int(heads[k])
        at = _aligned(pos + h) - h
        if segments and end <= o <= end + GAP:
            if o > end:
                segments.append((o - end, -1))
        else:
            if segments:
                runs.append(Run(first, end - first, tuple(segments), segments[0][1], pos))
            first, segments = o, []
        segments.append((n, at))
        staged[k], end, pos = at, o + n, at + n
    if segments:
        runs.append(Run(first, end - first, tuple(segments), segments[0][1], pos))
    return runs, staged


def _whole_and_contiguous(place: tuple[slice, ...], chunk: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """True when a chunk fills ``place`` whole and ``place`` is one contiguous run of the C-ordered
    block: every axis before the last one the chunk does not span has extent 1."""
    if tuple(p.stop - p.start for p in place) != chunk:
        return False
    cut = [a for a, (c, n) in enumerate(zip(chunk, shape)) if c != n]
    return not cut or all(chunk[a] == 1 for a in range(cut[-1]))


@dataclass(frozen=True)
class StreamOps:
    """How each present chunk of a plan decodes, found from its stored bytes: ``inflate`` and
    ``copy`` hold (start in staging, bytes, destination offset) of the chunks stored deflated (the
    whole zlib stream) and of those stored as they are; ``shuffled`` the destination offsets of the
    chunks whose shuffle is to be undone, in increasing order."""

    inflate: list
    copy: list
    shuffled: list


def stream_ops(lay: H5Layout, plan: BlockPlan, staging) -> StreamOps:
    """Check each present chunk's stored bytes on the host (its fletcher32 checksum, its zlib
    header) and say how it decodes; DecodeError for a chunk that does not hold what its filters
    say."""
    inflate, copy, shuffled = [], [], []
    for j, k in enumerate(plan.present.tolist()):
        start, size, mask, dst = int(plan.staged[j]), int(plan.stored[j]), int(plan.masks[j]), int(plan.dst[j])
        where = f"{lay.path}: {lay.name!r}, the chunk at {tuple(p.start for p in plan.places[k])} of a block"
        if lay.active("fletcher32", mask):
            size = check_fletcher32(staging[start:start + size], where)
        if lay.active("deflate", mask):
            if size < 6:
                raise DecodeError(f"{where}: zlib stream too short")
            check_zlib_header(staging[start:start + 2], where)
            inflate.append((start, size, dst))
        elif size == lay.chunk_nbytes:
            copy.append((start, size, dst))
        else:
            raise DecodeError(f"{where}: {size} bytes stored unfiltered, not {lay.chunk_nbytes}")
        if lay.active("shuffle", mask) and lay.dtype.itemsize > 1:
            shuffled.append(dst)
    return StreamOps(inflate, copy, sorted(shuffled))


def merged(copies: list) -> list:
    """(src, bytes, dst) copies with those that continue each other in both buffers joined: the
    rows of a contiguous dataset cross in one copy."""
    out: list[list[int]] = []
    for s, n, d in sorted(copies, key=lambda c: c[2]):
        if out and out[-1][0] + out[-1][1] == s and out[-1][2] + out[-1][1] == d:
            out[-1][1] += n
        else:
            out.append([s, n, d])
    return [tuple(c) for c in out]


# --- the steps after decoding, shared by the device and its host twin ----------------------------


def unshuffle_temp(xp, lay: H5Layout, chunks: int):
    """The temporary through which ``chunks`` shuffled chunks are transposed (None where none is)."""
    if "shuffle" not in lay.filters or lay.dtype.itemsize == 1 or not chunks:
        return None
    per = max(1, min(UNSHUFFLE_BYTES // lay.chunk_nbytes, chunks))
    return xp.empty(per * lay.chunk_nbytes, dtype=np.uint8)


def unshuffle(lay: H5Layout, dst, shuffled: list, tmp) -> None:
    """Undo the shuffle of the chunks at byte offsets ``shuffled`` of ``dst`` (flat bytes), in
    place: each run of consecutive chunks, as many at once as ``tmp`` holds, is copied to ``tmp``
    and transposed back, (chunks, typesize, n) -> (chunks, n, typesize)."""
    nb, ts = lay.chunk_nbytes, lay.dtype.itemsize
    n, per = nb // ts, len(tmp) // nb if tmp is not None else 0
    if isinstance(dst, np.ndarray) and tmp is not None:  # on the host, chunk by chunk, by a compiled loop
        for d in shuffled:
            tmp[:nb] = dst[d:d + nb]
            byte_unshuffle_into(tmp[:nb], dst[d:d + nb], ts)
        return
    for start, count in _consecutive(shuffled, nb):
        for i in range(0, count, per):
            m = min(per, count - i)
            seg = dst[start + i * nb:start + (i + m) * nb]
            t = tmp[:m * nb]
            t[...] = seg
            seg.reshape(m, n, ts)[...] = t.reshape(m, ts, n).transpose(0, 2, 1)


def _consecutive(offsets: list, step: int) -> list[tuple[int, int]]:
    """(start, count) of the runs of ``offsets`` (increasing) that follow each other by ``step``."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and runs[-1][0] + runs[-1][1] * step == o:
            runs[-1][1] += 1
        else:
            runs.append([o, 1])
    return [tuple(r) for r in runs]


def finish(lay: H5Layout, plan: BlockPlan, ops: StreamOps, out, dst, tmp) -> None:
    """Once every chunk of the block is decoded into ``dst`` (``out``'s own bytes, or the scratch
    slots): undo the shuffle, put scratch chunks in place (cut by the array's edge), and fill the
    chunks never written with the fill value."""
    unshuffle(lay, dst, ops.shuffled, tmp)
    nb = lay.chunk_nbytes
    if not plan.direct:
        for j, k in enumerate(plan.present.tolist()):
            place = plan.places[k]
            at = int(plan.dst[j])
            chunk = dst[at:at + nb].view(lay.dtype).reshape(lay.chunk)
            out[place] = chunk[tuple(slice(0, p.stop - p.start) for p in place)]
    present = set(plan.present.tolist())
    for k, place in enumerate(plan.places):
        if k not in present:
            out[place] = lay.fill_value


def adler32_expected(lay: H5Layout, ops: StreamOps, staging) -> np.ndarray:
    """The adler32 that trails each deflated chunk's zlib stream, in the order of ``ops.inflate``."""
    return np.array([int.from_bytes(bytes(staging[s + n - 4:s + n]), "big") for s, n, _ in ops.inflate], dtype=np.int64)


def adler_sums(xp, lay: H5Layout, plan: BlockPlan, ops: StreamOps, dst):
    """The two adler32 sums of each inflated chunk in ``dst`` (before its shuffle is undone), in
    the order the chunks lie in ``dst``, computed where ``dst`` lies
    (:mod:`pipeline.kernels.checksum`): nvCOMP inflates raw deflate data and checks no checksum,
    so a damaged stream would otherwise decode to wrong values without an error. Each run of
    chunks that follow each other in ``dst`` takes one launch. :func:`adler32_from_sums` finishes
    them on the host: a few integers a chunk, where CuPy would compile five kernels for them in
    every new process (0.4 s of a first run on the GPU machine, each compiled by every thread
    that reached it first)."""
    nb = lay.chunk_nbytes
    step = nb if plan.direct else _aligned(nb)
    sums = xp.empty((2, len(ops.inflate)), dtype=np.int64)
    at = 0
    for start, count in _consecutive(sorted(d for _, _, d in ops.inflate), step):
        if xp is np:
            rows = np.lib.stride_tricks.as_strided(dst[start:], shape=(count, nb), strides=(step, 1))
            sums[:, at:at + count] = checksum.adler_sums_cpu(rows)
        else:
            sums[:, at:at + count] = checksum.adler_sums_gpu(dst, start, step, nb, count)
        at += count
    return sums


def adler32_from_sums(sums: np.ndarray, lay: H5Layout, ops: StreamOps) -> np.ndarray:
    """The adler32 of each inflated chunk, in the order of ``ops.inflate``, from its sums in the
    order of :func:`adler_sums` (NumPy)."""
    order = sorted(range(len(ops.inflate)), key=lambda j: ops.inflate[j][2])
    out = np.empty(len(order), dtype=np.int64)
    out[np.array(order, dtype=np.int64)] = checksum.adler32(np.asarray(sums), lay.chunk_nbytes)
    return out


def check_adler32(computed, expected: np.ndarray, where: str) -> None:
    """DecodeError where a chunk's inflated bytes do not have the adler32 its stream ends with."""
    bad = np.flatnonzero(np.asarray(computed) != expected)
    if len(bad):
        raise DecodeError(f"{where}: adler32 checksum mismatch in {len(bad)} chunk(s) of a block")


def read_block_host(lay: H5Layout, region: tuple[slice, ...], out: np.ndarray | None = None) -> np.ndarray:
    """The values of ``region`` (whole chunks of ``lay``; the last may be cut by the array's
    edge) read on the CPU: the plan, reads and steps of :func:`read_block` with NumPy in place of
    CuPy, and zlib inflating each whole stream (checking its adler32 itself) in place of nvCOMP.

    It is also how the CPU backend reads NetCDF4 (:mod:`pipeline.sources.reads`): zlib releases
    the GIL, so Dask's threads inflate their blocks at once, where h5py inflates one chunk at a
    time under HDF5's global lock. ``out``: where to decode (C-contiguous, of the region's shape
    and the dataset's dtype), else a new array."""
    if out is None:
        out = np.empty(tuple(s.stop - s.start for s in region), dtype=lay.dtype)
    decode_block_host(lay, region, out, unshuffle=True)
    return out


def decode_block_host(lay: H5Layout, region: tuple[slice, ...], out: np.ndarray, *, unshuffle: bool) -> list[int]:
    """:func:`read_block_host` into ``out``; with ``unshuffle`` False, where every chunk decodes
    straight into its place (``plan.direct``), the shuffle is left for the device: the byte offsets
    of ``out`` of the chunks still shuffled are returned (:func:`unshuffle_device`), else none.

    Out of core on the GPU, the I/O threads decode blocks with it ahead of their tasks
    (:mod:`pipeline.gpu.ahead`, :meth:`H5Source.read_host`), leaving the shuffle to the device:
    on the host, undoing it was 9.8 s of the 16 threads' time for 6 GB beside 11.1 s of inflate
    (its writes a stride apart, at 0.6 GB/s a thread with every thread busy), where the GPU undoes
    a 143 MiB block in well under a millisecond."""
    plan = plan_block(lay, region)
    staging = np.empty(max(1, plan.total), dtype=np.uint8)
    for run in plan.runs:
        for offset, segments in run.pieces():
            read_segments(lay.path, offset, segments, staging)
    ops = stream_ops(lay, plan, staging)
    leave = not unshuffle and plan.direct
    nb = lay.chunk_nbytes
    dst = out.reshape(-1).view(np.uint8) if plan.direct else np.empty(max(1, plan.scratch_bytes(lay)), dtype=np.uint8)
    where = f"{lay.path}: {lay.name!r}"
    shuffled = set(ops.shuffled)
    ts = 1 if leave else lay.dtype.itemsize
    for s, n, d in ops.inflate:  # a shuffled chunk's shuffle undone as it is inflated
        _inflate_into(staging[s:s + n], dst[d:d + nb], where, ts if d in shuffled else 1)
    for s, n, d in merged(ops.copy):
        dst[d:d + n] = staging[s:s + n]
    left = ops.shuffled if leave else []
    done = set(ops.shuffled) if leave else {d for _, _, d in ops.inflate}
    ops = replace(ops, shuffled=[d for d in ops.shuffled if d not in done])
    finish(lay, plan, ops, out, dst, unshuffle_temp(np, lay, len(ops.shuffled)) if ops.shuffled else None)
    return left


def unshuffle_device(lay: H5Layout, block, left: list[int]) -> None:
    """Undo, on the device, the shuffle that :func:`decode_block_host` left in ``block`` (a CuPy
    copy of its ``out``) at the byte offsets ``left``, on the block's stream (done when this
    returns)."""
    import cupy as cp

    if not left:
        return
    with block_stream():  # its exit synchronizes
        unshuffle(lay, block.reshape(-1).view(np.uint8), left, unshuffle_temp(cp, lay, len(left)))


def whole_chunks(lay: H5Layout, region: tuple[slice, ...]) -> bool:
    """Whether ``region`` is made of whole chunks of ``lay`` (the last may end at the array's edge),
    as :func:`read_block_host` and :func:`read_block` read them."""
    return all(
        s.step in (None, 1) and s.start is not None and s.start % c == 0 and s.stop is not None
        and (s.stop % c == 0 or s.stop == n) and s.start < s.stop <= n
        for s, c, n in zip(region, lay.chunk, lay.shape)
    )


# --- reading a block on the GPU -----------------------------------------------------------------


def read_block(lay: H5Layout, region: tuple[slice, ...]):
    """The values of ``region`` (whole chunks of ``lay``; the last may be cut by the array's edge)
    as a CuPy array, read, moved and decoded as the module docstring describes."""
    plan = plan_block(lay, region)
    staging = pinned.take(plan.total)
    jobs = _submit_runs(lay.path, plan.runs, staging.bytes)
    hold: list = []  # pinned buffers that the block's copies read, given back once they are done
    try:
        return _move_and_decode(lay, plan, staging.bytes, jobs, hold)
    finally:
        # the block's stream was synchronized on the way out: once no read still writes into them,
        # the buffers go back
        futures_wait([j for waits in jobs for j in waits])
        for buf in [staging, *hold]:
            pinned.give(buf)


def _submit_runs(path: str, runs: list[Run], buffer: np.ndarray) -> list[list[Future]]:
    """Start the block's reads in the I/O pool, all in one place in the pool's order: for each
    run, its pieces' jobs."""
    pool = io_pool()
    ticket = pool.ticket()
    return [[pool.submit(read_segments, path, offset, segments, buffer, ticket=ticket) for offset, segments in run.pieces()]
            for run in runs]


def read_segments(path: str, offset: int, segments: list, buffer: np.ndarray) -> None:
    """One ``preadv`` from ``offset`` of ``path``, scattered into ``buffer`` as ``segments`` say
    (bytes, offset in ``buffer``; -1: bytes between chunks, read into a throwaway buffer)."""
    mv, junk = memoryview(buffer), None
    views = []
    for n, pos in segments:
        if pos < 0:
            junk = junk if junk is not None and len(junk) >= n else memoryview(bytearray(max(n, GAP)))
            views.append(junk[:n])
        else:
            views.append(mv[pos:pos + n])
    pread_into(path, offset, views)


def _move_and_decode(lay: H5Layout, plan: BlockPlan, staging: np.ndarray, jobs, hold: list):
    import cupy as cp

    # device memory is taken once the block's first read is in, so that a task waiting for its
    # turn in the I/O pool holds none (as in pipeline.gpu.reader); and from the default stream's
    # arena, as every task's arrays are, which this block's stream then waits for
    for job in jobs[0] if jobs else []:
        job.result()
    out = cp.empty(plan.shape, dtype=lay.dtype)
    dst = out.reshape(-1).view(np.uint8) if plan.direct else cp.empty(max(1, plan.scratch_bytes(lay)), dtype=np.uint8)
    dev = None if lay.host_inflate else cp.empty(max(1, plan.total), dtype=np.uint8)
    tmp = unshuffle_temp(cp, lay, len(plan.present))
    with block_stream() as stream:
        # each read crosses the bus as soon as it is in, while the block's later reads proceed
        for run, waits in zip(plan.runs, jobs):
            for job in waits:
                job.result()
            if dev is not None:
                dev[run.start:run.end].set(staging[run.start:run.end], stream=stream)
        ops = stream_ops(lay, plan, staging)
        sums = None
        if dev is not None:
            _decode_on_device(lay, ops, dev, dst)
            if ops.inflate:
                sums = adler_sums(cp, lay, plan, ops, dst)
        else:  # zlib checks each stream's adler32 itself
            _decode_on_host(lay, ops, staging, dst, stream, hold)
        finish(lay, plan, ops, out, dst, tmp)
        if sums is not None:  # read back once the block is done: the task waits for it then anyway
            check_adler32(adler32_from_sums(cp.asnumpy(sums, stream=stream), lay, ops), adler32_expected(lay, ops, staging),
                          f"{lay.path}: {lay.name!r}")
    return out


def _decode_on_device(lay: H5Layout, ops: StreamOps, dev, dst) -> None:
    """Every deflate stream of the block in one nvCOMP batch, each into its destination; chunks
    stored as they are by plain device copies."""
    nb = lay.chunk_nbytes
    decode_frames(
        "deflate", dev,
        [s + 2 for s, _, _ in ops.inflate], [n - 6 for _, n, _ in ops.inflate],  # zlib's header and adler32 off
        dst, [d for _, _, d in ops.inflate], nb,
    )
    for s, n, d in merged(ops.copy):
        dst[d:d + n] = dev[s:s + n]


@functools.cache
def _libz_uncompress():
    """zlib's own ``uncompress`` (the library CPython's ``zlib`` module wraps), through ctypes,
    which releases the GIL for the call; None where the library is not found.

    CPython's module can only inflate into a new bytes object: a chunk (4 MB for a climate grid)
    then costs an allocation, its pages' first touch, and a copy into place. ``uncompress``
    inflates straight into the block (or a thread's scratch buffer), checking the stream's adler32
    as the module does."""
    import ctypes
    import ctypes.util

    fn = None
    for name in ("libz.so.1", "find"):  # Linux's soname first: find_library runs ldconfig, once
        try:
            name = ctypes.util.find_library("z") if name == "find" else name
            fn = ctypes.CDLL(name).uncompress if name else None
        except (OSError, AttributeError):
            continue
        if fn is not None:
            break
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_ulong]
        fn.restype = ctypes.c_int
    return fn


_ZLIB_ERRORS = {-2: "inconsistent stream state", -3: "invalid or incomplete deflate data",
                -4: "insufficient memory", -5: "incomplete or truncated stream, or more data than the chunk holds"}
_scratch = threading.local()
SCRATCH_BYTES = 64 << 20  # the most a thread keeps for inflating shuffled chunks into (larger: a temporary)


def _inflate(stream: np.ndarray, out: np.ndarray, where: str) -> None:
    """One whole zlib stream inflated into ``out`` (uint8, C-contiguous), its adler32 checked; a
    stream that does not fill ``out`` exactly is a DecodeError."""
    import ctypes

    uncompress = _libz_uncompress()
    if uncompress is None:
        try:
            got = zlib.decompress(stream, bufsize=len(out))
        except zlib.error as e:
            raise DecodeError(f"{where}: {e}") from e
        if len(got) != len(out):
            raise DecodeError(f"{where}: a chunk inflates to {len(got)} bytes, not {len(out)}")
        out[...] = np.frombuffer(got, dtype=np.uint8)
        return
    stream = np.ascontiguousarray(stream) if isinstance(stream, np.ndarray) else np.frombuffer(stream, dtype=np.uint8)
    size = ctypes.c_ulong(len(out))
    code = uncompress(out.ctypes.data, ctypes.byref(size), stream.ctypes.data, len(stream))
    if code != 0:
        raise DecodeError(f"{where}: zlib error {code} while inflating a chunk: {_ZLIB_ERRORS.get(code, 'unknown')}")
    if size.value != len(out):
        raise DecodeError(f"{where}: a chunk inflates to {size.value} bytes, not {len(out)}")


def _inflate_into(stream, out: np.ndarray, where: str, typesize: int = 1) -> None:
    """One whole zlib stream (its adler32 checked) inflated into ``out``: in an I/O thread on the
    GPU path (:func:`_decode_on_host`, :func:`decode_block_host`), in a Dask thread on the CPU's
    (:func:`read_block_host`). ``typesize`` > 1: the chunk is shuffled, and its shuffle is undone
    on the way into ``out`` (:func:`pipeline.kernels.shuffle.byte_unshuffle_into`) from the
    thread's scratch buffer, rather than copied in and undone in place after."""
    if typesize <= 1:
        _inflate(stream, out, where)
        return
    if len(out) > SCRATCH_BYTES:  # a temporary, not kept by the thread
        buf = np.empty(len(out), dtype=np.uint8)
    else:
        buf = getattr(_scratch, "buf", None)
        if buf is None or len(buf) < len(out):
            buf = _scratch.buf = np.empty(len(out), dtype=np.uint8)
    _inflate(stream, buf[:len(out)], where)
    byte_unshuffle_into(buf[:len(out)], out, typesize)


def _decode_on_host(lay: H5Layout, ops: StreamOps, staging: np.ndarray, dst, stream, hold: list) -> None:
    """Streams too large for nvCOMP: inflated by the I/O threads into pinned memory, each copied to
    its destination as soon as it is ready; chunks stored as they are cross from the staging
    buffer. The pinned buffer goes into ``hold``, given back once the copies are done."""
    nb = lay.chunk_nbytes
    step = _aligned(nb)
    decoded = pinned.take(max(1, len(ops.inflate) * step))
    hold.append(decoded)
    pool = io_pool()
    ticket = pool.ticket()
    jobs = [pool.submit(_inflate_into, staging[s:s + n], decoded.bytes[j * step:j * step + nb], lay.path, ticket=ticket)
            for j, (s, n, _) in enumerate(ops.inflate)]
    try:
        for s, n, d in merged(ops.copy):
            dst[d:d + n].set(staging[s:s + n], stream=stream)
        for j, ((_, _, d), job) in enumerate(zip(ops.inflate, jobs)):
            job.result()
            dst[d:d + nb].set(decoded.bytes[j * step:j * step + nb], stream=stream)
    finally:
        futures_wait(jobs)


# --- Dask arrays ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class H5Source(BlockSource):
    """An HDF5 dataset as a source for ``dask.array.from_array``: ``source[region]`` is a CuPy array
    read by :func:`read_block`."""

    lay: H5Layout

    reads_ahead = True  # a chunk is one deflate stream

    def read(self, region):
        return read_block(self.lay, region)

    def read_host(self, region, out):
        return decode_block_host(self.lay, region, out, unshuffle=False)

    def finish_device(self, block, left) -> None:
        unshuffle_device(self.lay, block, left)

    def fallback_warning(self, e: Exception) -> str:
        # a chunk that does not hold what its filters say, or that nvCOMP refuses: h5py reads
        # the block instead, and names the chunk if it cannot either
        return (f"{self.lay.path}: variable {self.lay.name!r}: a block could not be decoded on the GPU "
                f"({type(e).__name__}); h5py reads such blocks on the CPU")

    def staged(self):
        return H5StagedSource(self.lay.path, self.lay.name, self.ndim, self.shape, self.dtype)

    def __dask_tokenize__(self):
        return ("pipeline.gpu.hdf5.H5Source", self.lay.path, self.lay.name, file_stamp(self.lay.path))


@dataclass(frozen=True)
class H5StagedSource:
    """Any numeric HDF5 dataset, read by h5py on the CPU straight into pinned memory and copied to
    the device asynchronously: the path for what :func:`layout` refuses."""

    path: str
    name: str
    ndim: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, region):
        use_device_memory_limit()
        region = tuple(region)

        def fill(host):
            try:
                import h5py

                # opened for this read only: a file kept open would stop anyone from rewriting
                # it in place (HDF5 refuses to truncate a file open in the same process)
                with h5py.File(self.path, "r") as f:
                    f[self.name].read_direct(host, source_sel=region)
            except Exception as e:  # a chunk h5py cannot decode: an InputError that names it
                raise chunk_error(self.path, self.name, region, e) from None

        return staged_read(tuple(s.stop - s.start for s in region), self.dtype, fill)

    def __dask_tokenize__(self):
        return ("pipeline.gpu.hdf5.H5StagedSource", self.path, self.name, file_stamp(self.path))


def device_array(path: str | os.PathLike, name: str, chunks=None, *, nvcomp: bool | None = None):
    """A Dask array of CuPy chunks for dataset ``name`` of the HDF5 (NetCDF4) file at ``path``.

    ``chunks`` defaults to the stored chunks; other chunks must be whole multiples of them for the
    GPU decode. The GPU decodes where the layout allows (``nvcomp`` overrides the
    ``pipeline.gpu.nvcomp`` setting); otherwise h5py reads into pinned memory, with one warning
    naming what the GPU path does not take.
    """
    import dask.array as da

    import h5py

    path = os.fspath(path)
    with h5py.File(path, "r") as f:
        dset = f[name]
        shape, dtype, stored = tuple(dset.shape), np.dtype(dset.dtype).newbyteorder("="), dset.chunks
    chunks = da.core.normalize_chunks(chunks if chunks is not None else (stored or shape), shape, dtype=dtype)
    source = None
    if config.get("gpu.nvcomp", False) if nvcomp is None else nvcomp:
        try:
            lay = layout(path, name)
        except UnsupportedLayout as e:
            _warn_once(f"{path}: variable {name!r}: {e}, which the GPU does not decode; h5py reads it on the CPU")
        else:
            needs_nvcomp = "deflate" in lay.filters and not lay.host_inflate
            if aligned(chunks, lay.chunk) and (nvcomp_available() or not needs_nvcomp):
                source = H5Source(lay, len(shape), shape, lay.dtype, chunks)
    if source is None:
        source = H5StagedSource(path, name, len(shape), shape, dtype)
    return dask_array(source, chunks, dtype, name)
