"""Out of core on the GPU: blocks decoded by the host's cores ahead of the tasks that take them.

Under a device budget far smaller than the input, the memory plan gives a few threads blocks of
few stored chunks each (:mod:`pipeline.exec.memory`). Where each stored chunk is one compressed
frame (Zarr without shards, as xarray and zarr write it: one zstd frame per chunk, or Blosc; a
NetCDF4 chunk's deflate stream), such a block is a batch far too small for the GPU's decoders
(nvCOMP is fast only on many frames at once), or, for zarr's default frames of hundreds of MB, a
frame that one core decodes sooner than the GPU anyway (:mod:`pipeline.gpu.split`); and with one
block a thread, the I/O pool idles. On an H200 with 16 cores, 6.06 GB under a 1.5 GB budget ran
the standardized anomaly 9x (Zarr v3 default: one thread, 10.5 s), 4.2x (Zarr v2 Blosc, one step
a chunk) and 11x (NetCDF4 zlib) slower than without a budget.

Here, while :func:`reading_ahead` is on (:func:`pipeline.exec.compute.compute` turns it on while it
computes on the GPU), a block of such a source larger than half of the device budget (out of core,
as :func:`pipeline.exec.spill.second_pass` decides) is decoded on the host by
one I/O thread (the format's host reader: :func:`pipeline.gpu.engine.read_block_host`,
:func:`pipeline.gpu.hdf5.decode_block_host`) into pinned memory, and its task copies it to the
device, which holds nothing of it before, and does there what the host left for it (NetCDF4's
shuffle: :meth:`~pipeline.gpu.engine.BlockSource.finish_device`). A task that asks for block ``k`` of the block grid also
starts the decodes of the blocks nearest it (:func:`_ahead`), up to twice the I/O threads and
``pipeline.gpu.read-ahead`` bytes of pinned memory, so that every core decodes while the GPU
works.

Each block is counted by how many times it has been asked for: a block read again (a second pass
reading its input again) is decoded ahead again, and a block that a task already took is never
decoded ahead only to wait unused. Blocks decoded ahead and not taken (a computation that failed,
or a graph that read only part of the grid) are given back when :func:`reading_ahead` ends.
"""

from __future__ import annotations

import bisect
import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

import numpy as np

from .. import config, state
from . import pinned
from .iopool import io_pool


def budget() -> int:
    """Bytes of pinned memory that blocks decoded ahead may hold (``pipeline.gpu.read-ahead``:
    bytes, or a fraction of the host's memory; 0 turns reading ahead off)."""
    import psutil

    from ..backend import _bytes_or_fraction

    return _bytes_or_fraction(config.get("gpu.read-ahead", 0), psutil.virtual_memory().total, "gpu.read-ahead")


@contextmanager
def reading_ahead():
    """Within it, sources that read ahead (:attr:`pipeline.gpu.engine.BlockSource.reads_ahead`)
    decode their blocks on the host ahead of their tasks, unless ``pipeline.gpu.read-ahead`` is 0
    (it yields whether they do); at its end, blocks decoded and not taken are given back. Nested
    uses share one state, cleared by the last to end."""
    st = state.ahead
    on = budget() > 0
    if on:
        with st.lock:
            st.active += 1
    try:
        yield on
    finally:
        if on:
            with st.lock:
                st.active -= 1
                last = st.active == 0
                entries = [e for s in st.sources.values() for e in s.entries.values()] if last else []
                if last:
                    st.sources.clear()
            futures_wait([e.future for e in entries])
            for e in entries:
                _discard(e)


def active() -> bool:
    return state.ahead.active > 0


@dataclass
class _Entry:
    future: Future  # the pinned Buffer, the block in it and what is left for the device, once decoded
    nbytes: int


@dataclass
class _Grid:
    """One source's blocks in this computation: how often each was asked for, and those being
    decoded ahead (by their place in C order of the grid)."""

    source: object  # kept alive: its id is the key
    bounds: list  # per axis, the blocks' starts and the array's end
    counts: np.ndarray
    entries: dict = field(default_factory=dict)
    last: int | None = None  # the block asked for last

    def index(self, region) -> int | None:
        """The place of ``region`` in C order of the grid, or None where it is not one block."""
        coords = []
        for s, b in zip(region, self.bounds):
            i = bisect.bisect_left(b, s.start)
            if i >= len(b) - 1 or b[i] != s.start or b[i + 1] != s.stop:
                return None
            coords.append(i)
        return int(np.ravel_multi_index(coords, self.counts.shape)) if coords else 0

    def region(self, flat: int) -> tuple[slice, ...]:
        coords = np.unravel_index(flat, self.counts.shape)
        return tuple(slice(b[i], b[i + 1]) for b, i in zip(self.bounds, coords))


def _grid(source) -> _Grid | None:
    """The source's grid in this computation (under ``state.ahead.lock``)."""
    st = state.ahead
    g = st.sources.get(id(source))
    if g is None:
        chunks = getattr(source, "chunks", ())
        if not chunks:
            return None
        bounds = [list(itertools.accumulate(c, initial=0)) for c in chunks]
        g = st.sources[id(source)] = _Grid(source, bounds, np.zeros(tuple(len(c) for c in chunks), dtype=np.int64))
    return g


def takes(source, region) -> bool:
    """Whether ``source[region]`` is read through this module now: while :func:`reading_ahead` is
    on, for a source that :attr:`~pipeline.gpu.engine.BlockSource.reads_ahead` and is out of core
    (larger than half of the device budget, as :func:`pipeline.exec.spill.second_pass` decides)."""
    if not (active() and getattr(source, "reads_ahead", False) and len(region) == len(getattr(source, "chunks", ()))):
        return False
    from ..backend import out_of_core

    return out_of_core(math.prod(source.shape) * np.dtype(source.dtype).itemsize, "gpu")


def read(source, region, to_device):
    """``source[region]`` as a CuPy array: its block decoded on the host (ahead, or now), then
    ``to_device(host)`` (:func:`pipeline.gpu.engine.to_device`), and what the host decode left for
    the device done there (:meth:`~pipeline.gpu.engine.BlockSource.finish_device`: the shuffle
    of NetCDF4's chunks); the blocks nearest it start
    decoding. A region that is not one block of the grid is read as in core
    (:meth:`~pipeline.gpu.engine.BlockSource.read`)."""
    st = state.ahead
    region = tuple(region)
    with st.lock:
        g = _grid(source)
        flat = None if g is None else g.index(region)
        if flat is not None:
            g.counts.flat[flat] += 1
            entry = g.entries.pop(flat, None) or _submit(source, region)
            _ahead(g, flat, int(g.counts.flat[flat]))
    if flat is None:  # not one block of the grid (a selection dask fused into the read): as in core
        return source.read(region)
    try:
        buf, host, left = entry.future.result()
    finally:
        with st.lock:
            st.bytes -= entry.nbytes
    try:
        block = to_device(host)
    finally:
        pinned.give(buf)
    if left is not None:
        source.finish_device(block, left)
    return block


def _ahead(g: _Grid, flat: int, asked: int) -> None:
    """Start decoding the blocks nearest ``flat`` in the grid's C order (on the side the tasks last
    moved to first, at equal distance) that have been asked for fewer than ``asked`` times and are
    not being decoded, while the budget allows (under ``state.ahead.lock``).

    Nearest, rather than the blocks after it: Dask runs a reduction's tasks subtree by subtree,
    mostly backwards along the grid (over 170 blocks: 127, 124, 126, 125, 123, ..., 88, ...). On
    that order, with 16 blocks decoded ahead at a time, the nearest were 85% of the blocks asked
    for next, the following ones 21%."""
    st = state.ahead
    room = budget()
    depth = 2 * io_pool().threads
    step = -1 if g.last is not None and g.last > flat else 1
    g.last = flat
    for d in range(1, depth + 1):
        for k in (flat + step * d, flat - step * d):
            if not 0 <= k < g.counts.size or g.counts.flat[k] >= asked or k in g.entries:
                continue
            region = g.region(k)
            nbytes = _nbytes(g.source, region)
            if st.bytes + nbytes > room or len(g.entries) >= depth:
                return
            g.entries[k] = _submit(g.source, region)


def _nbytes(source, region) -> int:
    return math.prod(s.stop - s.start for s in region) * np.dtype(source.dtype).itemsize


def _submit(source, region) -> _Entry:
    """One block's host decode as a job of the I/O pool (under ``state.ahead.lock``)."""
    nbytes = _nbytes(source, region)
    state.ahead.bytes += nbytes
    return _Entry(io_pool().submit(_decode, source, region, nbytes), nbytes)


def _decode(source, region, nbytes: int):
    """Run by an I/O thread: the block decoded into a pinned buffer taken here (so that the thread
    asking for it does not wait on the driver's registration of new pinned memory), and what the
    decode left for the device."""
    buf = pinned.take(nbytes, inline=True)
    try:
        host = buf.bytes[:nbytes].view(source.dtype).reshape(tuple(s.stop - s.start for s in region))
        left = source.read_host(region, host)
        return buf, host, left
    except BaseException:
        pinned.give(buf)
        raise


def _discard(entry: _Entry) -> None:
    """A block decoded ahead and never taken: its buffer back to the pool."""
    with state.ahead.lock:
        state.ahead.bytes -= entry.nbytes
    if entry.future.exception() is None:
        pinned.give(entry.future.result()[0])
