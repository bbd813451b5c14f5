"""A copy of a store in the layout the GPU reads fastest: Zarr v3 shards of small zstd frames.

Written through zarr's own sharding codec at zarr's default zstd level (3), every frame of every
shard passed through zarr's one event-loop thread, and each digest hashed a copy of its block:
6 GB took 16.5 s on 16 cores. Here the task that writes a shard hands its ~1 MB frames to a pool
of threads, one per core, shared by all tasks (zstd releases the GIL), hashes the block where it
lies meanwhile, and writes the shard file itself: the frames in C order, then the index of
(offset, nbytes) pairs, little-endian uint64, and its crc32c, as the Zarr v3 sharding codec lays
it out. Each frame is the one zarr would write, and any zarr reader opens the file. Everything
else, the staging directory renamed into place, the manifest, the digests and resuming, is
:func:`pipeline.sinks.zarr.write_zarr`'s. zstd level 2 by default: on float32 fields it keeps
level 3's ratio at about half its CPU time; level 1 costs as much in all (its encoding is faster,
but it writes up to a third more bytes).

That still left the CPU the bound (11-13.5 CPU seconds a GB, 8 of them compressing). Where a GPU is
visible, nvCOMP compresses the frames instead, many blocks' frames in one batch
(:mod:`pipeline.gpu.encode`), and the cores only decode the source, hash and write: 4.6 CPU
seconds a GB, 6.1 GB in 1.9-2.3 s in a process on one H200 against 5.1 s on its 16 cores.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .. import config, state
from ..errors import InputError
from ..sources import open_dataset
from .zarr import block_sha, store_with_zarr, write_zarr

MISSING = np.uint64(2**64 - 1)  # an inner chunk not stored (outside the array)
SHARD_BYTES = "128MiB"  # shards group a store's small chunks up to this (:func:`_grouped`)
# the smallest shard whose frames nvCOMP compresses unless asked for by name: with twice as many
# tasks as cores in flight, one nvCOMP batch then holds at least ~1,700 frames of 593 KB (9 GB/s);
# shards of 4 MB (7 frames) were slower on the GPU than on the cores (benchmarks/RESULTS.md)
GPU_MIN_SHARD = 32 << 20


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


# --- the shard file -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardFormat:
    """What one shard file of an array holds, read from the array's metadata: inner chunks of
    ``inner`` values of ``dtype`` (little-endian), each compressed by zstd at ``level`` with no
    checksum, the index at the end. Only arrays whose codecs are exactly these get one
    (:meth:`of`); the rest are written by zarr."""

    shape: tuple[int, ...]  # of the array
    shard: tuple[int, ...]
    inner: tuple[int, ...]
    dtype: np.dtype
    fill: object
    level: int

    @classmethod
    def of(cls, arr) -> ShardFormat | None:
        """The format of a zarr array's shard files, or None where it is not this one."""
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ShardingCodecIndexLocation, ZstdCodec

        codecs = arr.metadata.codecs if arr.metadata.zarr_format == 3 else ()
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
            return None
        sharding = codecs[0]
        little = BytesCodec(endian="little")
        inner_codecs = tuple(sharding.codecs)
        if (
            len(inner_codecs) != 2 or inner_codecs[0] != little or not isinstance(inner_codecs[1], ZstdCodec)
            or inner_codecs[1].checksum or tuple(sharding.index_codecs) != (little, Crc32cCodec())
            or sharding.index_location != ShardingCodecIndexLocation.end or arr.dtype.kind not in "biuf"
        ):
            return None
        return cls(
            shape=tuple(arr.shape), shard=tuple(arr.shards), inner=tuple(sharding.chunk_shape),
            dtype=arr.dtype.newbyteorder("<"), fill=arr.metadata.fill_value, level=inner_codecs[1].level,
        )

    @property
    def grid(self) -> tuple[int, ...]:
        """Inner chunks per shard along each axis."""
        return tuple(s // i for s, i in zip(self.shard, self.inner))


def _encoder() -> ThreadPoolExecutor:
    """The process's frame-compressing threads, one per core this process may use (dask's count:
    affinity and cgroup quotas), started on first use."""
    from dask.system import CPU_COUNT

    with state.encode.lock:
        if state.encode.pool is None:
            state.encode.pool = ThreadPoolExecutor(CPU_COUNT, thread_name_prefix="pipeline-encode")
        return state.encode.pool


def _padded(fmt: ShardFormat, block: np.ndarray) -> np.ndarray:
    """The block as its whole shard, C-ordered little-endian values; the part beyond the array's
    edge holds the fill value, as zarr stores an edge chunk."""
    block = np.ascontiguousarray(block, dtype=fmt.dtype)
    if block.shape == fmt.shard:
        return block
    whole = np.full(fmt.shard, fmt.fill, dtype=fmt.dtype)
    whole[tuple(slice(0, n) for n in block.shape)] = block
    return whole


def _stored(fmt: ShardFormat, origin: tuple[int, ...]) -> np.ndarray:
    """Which inner chunks of the shard at ``origin`` are stored: those that begin inside the
    array (zarr leaves out the ones wholly beyond its edge), as a boolean grid."""
    inside = np.ones(fmt.grid, dtype=bool)
    for axis, (o, i, n) in enumerate(zip(origin, fmt.inner, fmt.shape)):
        shape = [1] * len(fmt.grid)
        shape[axis] = fmt.grid[axis]
        inside &= (o + np.arange(fmt.grid[axis]) * i < n).reshape(shape)
    return inside


def _contiguous(fmt: ShardFormat) -> bool:
    """Whether each inner chunk is one contiguous run of the C-ordered shard, (1, .., 1, k, full,
    .., full), as :func:`inner_chunk` makes them: then its bytes are a slice, not a copy."""
    split = [a for a, (i, s) in enumerate(zip(fmt.inner, fmt.shard)) if i != s]
    return not split or all(i == 1 for i in fmt.inner[:split[-1]])


def _inner_bytes(fmt: ShardFormat, values: np.ndarray, numbers):
    """The C-ordered bytes of each inner chunk in ``numbers`` (C order of the shard's grid of
    inner chunks): slices of ``values`` where they are contiguous runs, else copies."""
    if _contiguous(fmt):
        flat, size = values.reshape(-1).view(np.uint8), math.prod(fmt.inner) * fmt.dtype.itemsize
        for n in numbers:
            yield flat[n * size:(n + 1) * size]
        return
    for n in numbers:
        region = tuple(slice(j * i, (j + 1) * i) for j, i in zip(np.unravel_index(n, fmt.grid), fmt.inner))
        yield np.ascontiguousarray(values[region]).reshape(-1).view(np.uint8)


def _compressed(fmt: ShardFormat, values: np.ndarray, numbers, backend: str):
    """The zstd frames of the inner chunks ``numbers`` of ``values`` (the padded shard), and the
    pinned buffer they lie in where the GPU compressed them (None otherwise), to hand back once
    they are written. On the GPU (:mod:`pipeline.gpu.encode`) only where each inner chunk is a
    contiguous run of the shard, as :func:`inner_chunk` makes them, of a size nvCOMP's alignment
    admits; where nvCOMP fails, the CPU compresses the shard, and says so."""
    size = math.prod(fmt.inner) * fmt.dtype.itemsize
    if backend == "gpu" and _contiguous(fmt) and len(numbers):
        from ..errors import EncodeError
        from ..gpu import encode

        try:
            if encode.accepts(size):
                return encode.compress(values.reshape(-1).view(np.uint8), size, numbers)
        except EncodeError as e:
            warnings.warn(f"{e}; the CPU compresses this shard", RuntimeWarning, stacklevel=2)
    from numcodecs import Zstd

    return list(_encoder().map(Zstd(level=fmt.level).encode, _inner_bytes(fmt, values, numbers))), None


def shard_file(fmt: ShardFormat, block: np.ndarray, origin: tuple[int, ...], backend: str = "cpu") -> tuple[list, object]:
    """The buffers of the shard file for ``block`` (its values, starting at ``origin`` in the
    array), in order: the zstd frames of its stored inner chunks in C order, then the index and
    its crc32c; and the pinned buffer the frames lie in, to hand back once written (None when
    the CPU's pool compressed them). ``backend`` "gpu": nvCOMP compresses them."""
    import google_crc32c

    values = _padded(fmt, block)
    stored = _stored(fmt, origin).reshape(-1)
    frames, buf = _compressed(fmt, values, np.flatnonzero(stored), backend)
    sizes = np.array([len(f) for f in frames], dtype="<u8")
    index = np.full((stored.size, 2), MISSING, dtype="<u8")
    index[stored, 0] = np.cumsum(sizes) - sizes
    index[stored, 1] = sizes
    tail = index.tobytes()
    return [*frames, tail, np.array([google_crc32c.value(tail)], dtype="<u4").tobytes()], buf


def _array_format(array_dir: str):
    """The :class:`ShardFormat` of the Zarr v3 array at ``array_dir`` (None where this writer does
    not produce its codecs) and its metadata, kept while its ``zarr.json`` is unchanged: opening
    the array goes through zarr's one event-loop thread, and a store of one time step a shard
    (1460 of them at 0.25 degrees) opened it once per shard from every thread."""
    try:
        st = os.stat(os.path.join(array_dir, "zarr.json"))
    except OSError:
        st = None
    stamp = None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)
    return _opened(os.path.abspath(array_dir), stamp) if stamp else _open_format(array_dir)


@functools.lru_cache(maxsize=32)
def _opened(array_dir: str, stamp: tuple):
    return _open_format(array_dir)


def _open_format(array_dir: str):
    import zarr

    arr = zarr.open_array(array_dir, mode="r")
    return ShardFormat.of(arr), arr.metadata


def store_shard(block: np.ndarray, region: tuple[slice, ...], array_dir: str, backend: str = "cpu") -> str:
    """Store one block as its shard file, its frames compressed on every core (or, ``backend``
    "gpu", by nvCOMP with other blocks' frames), and return its digest (hashed by the pool
    meanwhile); an array whose codecs this writer does not produce goes through zarr
    (:func:`pipeline.sinks.zarr.store_with_zarr`)."""
    fmt, metadata = _array_format(array_dir)
    if fmt is None:
        return store_with_zarr(block, region, array_dir)
    digest = _encoder().submit(block_sha, block)
    origin = tuple(r.start for r in region)
    buffers, buf = shard_file(fmt, block, origin, backend)
    path = os.path.join(array_dir, *metadata.encode_chunk_key(tuple(o // s for o, s in zip(origin, fmt.shard))).split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, "wb") as f:  # buffered: writes every byte, large frames straight through
            for b in buffers:
                f.write(b)
    finally:
        if buf is not None:
            from ..gpu.pinned import give

            del buffers
            give(buf)
    return digest.result()


# --- convert --------------------------------------------------------------------------------------


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    inner_bytes: int | str = "1MB",
    chunks: Mapping[str, int] | None = None,
    compression: str = "zstd",
    level: int = 2,
    mode: str = "overwrite",
    progress: bool = False,
    backend: str | None = None,
):
    """Copy a Zarr store or NetCDF file into a Zarr v3 store that the GPU reads fastest.

    With ``compression="zstd"`` (the default) each shard holds one Dask block of the source (its
    chunks, small ones grouped along the first dimension up to 128 MiB, or ``chunks``); inside,
    values are zstd frames of about ``inner_bytes``, each a contiguous run of the shard, which
    nvCOMP decodes many at a time straight into place. zstd's ``level`` 2 compresses about twice
    as fast as zarr's default (3), to about the same size; any level is standard zstd. With ``compression="none"`` each chunk is one
    such block, uncompressed: nothing to decode, a third more bytes to read (for stores read from
    memory or fast disks, where decoding is the slowest step). Values, attributes and CF encodings
    are copied unchanged (packed integers stay packed), and any Zarr v3 reader opens the result.
    The inner frames carry no crc32c (the GPU reader would skip it unchecked); each shard's index
    keeps zarr's crc32c. ``src`` is protected: the copy may not be, contain or lie inside it.

    ``backend`` says where the frames are compressed ("auto", "cpu", "gpu"; None: the
    ``pipeline.backend`` setting): on the GPU, nvCOMP compresses the frames of many blocks in one
    batch (:mod:`pipeline.gpu.encode`). Its frames are standard zstd, a tenth larger than level
    2's; nvCOMP has no levels, and ``level`` is then only what the metadata records.
    """
    from dask.utils import parse_bytes
    from zarr.codecs import ZstdCodec

    if compression not in ("zstd", "none"):
        raise InputError(f"compression must be 'zstd' or 'none', got {compression!r}")
    if not isinstance(level, int) or not -7 <= level <= 22:
        raise InputError(f"level: zstd levels run from -7 to 22, got {level!r}")
    target = parse_bytes(inner_bytes) if isinstance(inner_bytes, str) else int(inner_bytes)
    asked = backend or config.get("backend", "auto")
    where = _where(asked) if compression == "zstd" else "cpu"
    with _threads(where), _grouped(chunks):
        ds = open_dataset(src, backend="cpu", chunks=chunks, decode_cf=False)
    largest = max((math.prod(c[0] for c in v.data.chunks) * v.dtype.itemsize for v in ds.data_vars.values()), default=0)
    if where == "gpu" and largest < GPU_MIN_SHARD and asked == "auto":
        where = "cpu"  # nvCOMP's batches would hold too few frames to beat the cores
    encoding = {}
    for name, var in ds.data_vars.items():
        shard = tuple(c[0] for c in var.data.chunks)
        if compression == "none":
            enc = {"chunks": shard, "compressors": None}
        else:
            enc = {"shards": shard, "chunks": inner_chunk(shard, var.dtype.itemsize, target), "compressors": [ZstdCodec(level=level)]}
        fill = var.attrs.pop("_FillValue", var.encoding.get("_FillValue"))
        if fill is not None:
            enc["_FillValue"] = fill
        encoding[name] = enc
    with _threads(where):
        return write_zarr(ds, dst, mode=mode, encoding=encoding, progress=progress, protect=(src,), kind="convert",
                          store_block=functools.partial(store_shard, backend=where))


def _grouped(chunks):
    """Without ``chunks``, blocks (and so shards) of as many whole stored chunks along the first
    dimension as fit :data:`SHARD_BYTES`, at least two blocks a thread (:func:`pipeline.sources.
    blocks_along_first`; ``pipeline.cpu.block-size`` where it is set to other than its default): a store of one time step a
    chunk (4 MB at 0.25 degrees) otherwise cost a task, a shard file and an nvCOMP job per step.
    Measured on one H200, 16 cores, 6.1 GB in 1460 chunks of 4 MB (Zarr v2, Blosc lz4): 4.9 s on
    the cores and 6.1 s with nvCOMP in shards of one step."""
    import contextlib

    import dask

    if chunks is not None or config.get("cpu.block-size", None) != config.defaults["pipeline"]["cpu"]["block-size"]:
        return contextlib.nullcontext()  # the user's blocks
    return dask.config.set({"pipeline.cpu.block-size": SHARD_BYTES})


def _threads(where: str):
    """Twice as many threads as cores where the GPU compresses (unless ``num_workers`` is set):
    each task waits for the GPU about as long as it decodes its source block, and the blocks the
    other threads decode meanwhile fill nvCOMP's batches. The memory plan still caps them
    (:func:`pipeline.exec.compute.compute_threads`). Measured on one H200 with 16 cores, 6.1 GB
    in 20 blocks (benchmarks/RESULTS.md): 3.00 s with 16 threads, 2.57 s with 24, 2.21-2.39 s
    with 32, no better with 48."""
    import contextlib

    import dask
    from dask.system import CPU_COUNT

    if where != "gpu" or dask.config.get("num_workers", None):
        return contextlib.nullcontext()
    return dask.config.set(num_workers=2 * CPU_COUNT)


def _where(backend: str | None) -> str:
    """Where the frames are compressed: the backend asked for (:func:`pipeline.backend.resolve`),
    the CPU where nvCOMP is not installed unless the GPU was asked for by name."""
    from .. import backend as B
    from ..errors import BackendError
    from ..gpu.nvcomp import nvcomp_available

    where = B.resolve(backend)
    if where == "gpu" and not nvcomp_available():
        if (backend or config.get("backend", "auto")) == "gpu":  # asked for by name
            raise BackendError("compressing on the GPU needs nvCOMP: install the 'gpu' extra (nvidia-nvcomp)")
        return "cpu"
    return where
