"""Reading a variable's blocks from its store, with errors that say where.

A chunk that its codec cannot decode (a corrupt file, a checksum that does not match) surfaces in
zarr or h5py as an exception naming neither the store, the variable nor the chunk, under a long
traceback from inside a Dask task. :class:`StoreArray`, the array Dask reads each block from,
turns any such error into an :class:`~pipeline.errors.InputError` that names them; for Zarr it
reads the block again one stored chunk (or shard) at a time to name the one that fails. The error
is an ordinary picklable exception, so it reaches the caller from Dask's local and distributed
schedulers alike.

Where xarray leaves a Zarr variable's values as stored (no CF decoding of its own) in a local
store whose layout the GPU reader plans (:func:`pipeline.gpu.reader.layout`: v2 or v3, zstd, Blosc
or no compressor, crc32c, sharded or not), :class:`StoreArray` reads its blocks with the chunk
engine's host decoders (:func:`zarr_layout_of`, :func:`pipeline.gpu.engine.read_block_host`); a
block the engine cannot decode is read by zarr, which names the chunk if it cannot either. Other
plain chunk files of a local store, compressed by one codec of numcodecs (gzip, zlib), are read
and decoded straight into the block here (:func:`read_direct`). zarr's own read of a chunk goes
through its event loop thread, decodes into a buffer of its own and copies that into the array it
returns: on 16 threads, 20 chunks of 303 MB summed at 1.6-2.0 GB/s through zarr, 4.8 GB/s decoded
into the blocks (docs/performance.md). Every other store, codec or layout (filters, big-endian data,
transposes, a region with steps) is read through xarray; a block whose read fails is read again
through zarr, chunk by chunk, to name the one that fails.

A NetCDF4 variable held as stored reads its blocks of whole chunks through
:func:`pipeline.gpu.hdf5.read_block_host` (:func:`h5_layout_of`): the chunks' bytes from the
offsets HDF5's index records, inflated by zlib in Dask's threads at once, where h5py inflates one
chunk at a time under HDF5's global lock. A block that it cannot decode is read by xarray (h5py),
which names the chunk if it cannot either.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DecodeError, PipelineError, UnsupportedLayout, chunk_error
from ..kernels import genotypes


def _region(key, shape) -> tuple[slice, ...]:
    key = key if isinstance(key, tuple) else (key,)
    return tuple(k if isinstance(k, slice) else slice(int(k), int(k) + 1) for k in key) + tuple(
        slice(0, n) for n in shape[len(key):]
    )


@dataclass(frozen=True)
class StoreArray:
    """One variable of an opened store (an ``xarray.Variable`` still lazy) as Dask reads it:
    ``array[region]`` is a NumPy array, or an InputError naming the store, the variable and the
    chunk. ``zarr_path``, for Zarr stores, is where to find the array again to name its chunk."""

    variable: object
    path: str
    name: str
    zarr_path: str | None = None

    @property
    def shape(self):
        return self.variable.shape

    @property
    def dtype(self):
        return self.variable.dtype

    @property
    def ndim(self):
        return self.variable.ndim

    @functools.cached_property
    def _zarr(self):
        return zarr_layout_of(self.variable)

    @functools.cached_property
    def _direct(self) -> "Chunks | None":
        return chunks_of(self.variable)

    @functools.cached_property
    def _h5(self):
        return h5_layout_of(self.variable, self.path, self.name)

    def __getstate__(self):  # the chunk plans are found again where the array is read
        return {k: v for k, v in self.__dict__.items() if k not in ("_zarr", "_direct", "_h5")}

    def nonempty(self, start: int, stop: int) -> np.ndarray:
        """For each row ``start`` to ``stop`` of a 2-D variable of strings, how many of its
        strings are not empty (:func:`pipeline.kernels.genotypes.strings_named`), counted from
        the chunk files' encoded lengths where they can be (:func:`nonempty_direct`), without
        making the strings."""
        region = (slice(start, stop), slice(0, self.shape[1]))
        if self._direct is not None and self._direct.strings and self.ndim == 2:
            try:
                return nonempty_direct(self._direct, region)
            except (OSError, RuntimeError, ValueError):
                pass  # read as strings below, where a chunk that fails is named
        return genotypes.strings_named(self[region])

    def __getitem__(self, key):
        try:
            region = _region(key, self.shape)
            plain = all(s.step in (None, 1) and s.start is not None and s.stop is not None for s in region)
            if plain and self._zarr is not None:
                from ..gpu import engine, reader

                try:
                    return engine.read_block_host(self._zarr, region, reader.frames)
                except (DecodeError, OSError, RuntimeError, ValueError):
                    pass  # as on the GPU: zarr reads the block, and names the chunk if it cannot either
            elif plain and self._direct is not None:
                return read_direct(self._direct, region)
            if self._h5 is not None:
                from ..gpu import hdf5

                if hdf5.whole_chunks(self._h5, region):
                    try:
                        return hdf5.read_block_host(self._h5, region)
                    except (DecodeError, OSError):
                        pass  # as on the GPU: h5py reads the block, and names the chunk if it cannot either
            return np.asarray(self.variable[key].values)
        except PipelineError:
            raise
        except Exception as e:
            zarr_array = None
            if self.zarr_path is not None:
                import zarr

                zarr_array = zarr.open_array(self.zarr_path, path=self.name, mode="r")
            raise chunk_error(self.path, self.name, _region(key, self.shape), e, zarr_array) from None


# --- reading a Zarr variable's chunk files straight into the block ----------------------------------


@dataclass(frozen=True)
class Chunks:
    """Where a Zarr array's chunk files are and how each decodes: ``root`` the array's directory,
    ``metadata`` zarr's (for the chunk keys), ``codec`` a numcodecs codec or None (raw bytes)."""

    root: str
    metadata: object
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    fill_value: object
    codec: object | None
    strings: bool = False  # variable-length UTF-8 (numcodecs' VLenUTF8 after the codec), as objects


@functools.cache
def vlen_str() -> np.dtype:
    """xarray's type of variable-length strings (an object type that says it holds str): xarray
    writes them as such, where a plain object array would be loaded to find a type to store."""
    import xarray as xr

    return xr.coding.strings.create_vlen_dtype(str)


def as_objects(values: np.ndarray) -> np.ndarray:
    """Variable-length strings (NumPy's ``StringDType``, as zarr 3 reads them) as objects of
    xarray's string type (:func:`pipeline.sources._strings_as_objects`)."""
    return values.astype(vlen_str())


def _backend_array(variable):
    """The backend's array whose values ``variable`` holds as stored (wrapped only by xarray's
    lazy, caching and copy-on-write layers, none of which changes a value), or None."""
    from xarray.coding.common import _ElementwiseFunctionArray
    from xarray.core import indexing

    data = getattr(variable, "_data", None)
    while True:
        if isinstance(data, (indexing.MemoryCachedArray, indexing.CopyOnWriteArray)):
            data = data.array
        elif isinstance(data, _ElementwiseFunctionArray) and data.func is as_objects:
            data = data.array  # strings as objects: what the strings' own read gives (read_direct)
        elif isinstance(data, indexing.LazilyIndexedArray):
            whole = all(isinstance(k, slice) and k == slice(None) for k in data.key.tuple)
            if not whole:
                return None
            data = data.array
        else:
            return data


def _stored_array(variable):
    """The zarr array whose values ``variable`` holds as stored, or None."""
    from xarray.backends.zarr import ZarrArrayWrapper

    data = _backend_array(variable)
    return data.get_array() if isinstance(data, ZarrArrayWrapper) else None


def h5_layout_of(variable, path: str, name: str):
    """How to read ``variable`` of the NetCDF4 file at ``path`` chunk by chunk on the CPU
    (:func:`pipeline.gpu.hdf5.read_block_host`): its HDF5 layout, where xarray holds its values as
    stored (through h5netcdf or netCDF4, in the file's root group) and the layout is one that
    path decodes (deflate, shuffle, fletcher32); else None, and xarray reads it.

    Through h5py or netCDF4 every chunk is inflated under HDF5's global lock, one at a time
    whatever the number of Dask threads; here zlib inflates them in the threads at once. Measured
    on the H200 machine's 16 cores, 6.1 GB of tas (NetCDF4, zlib level 4 + shuffle, one step a
    chunk), the climate anomaly on the CPU backend took 25.4 s through h5netcdf and 12.4 s here
    (benchmarks/RESULTS.md)."""
    data = _backend_array(variable)
    if not isinstance(data, _netcdf_wrappers()) or getattr(data, "variable_name", None) != name:
        return None
    if getattr(getattr(data, "datastore", None), "_group", None) not in (None, "/"):
        return None
    try:
        from ..gpu import hdf5

        return hdf5.layout(path, name)
    except Exception:  # not HDF5 (a netCDF3 file), another filter, another type: xarray reads it
        return None


def _netcdf_wrappers() -> tuple[type, ...]:
    """xarray's arrays over a variable of a file opened by h5netcdf or netCDF4: the classes of the
    backends already imported (an array of one means its backend was), none imported here."""
    found = []
    for module, name in (("xarray.backends.h5netcdf_", "H5NetCDFArrayWrapper"),
                         ("xarray.backends.netCDF4_", "NetCDF4ArrayWrapper")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def zarr_layout_of(variable):
    """How to read ``variable`` of a local Zarr store on the CPU through the chunk engine
    (:func:`pipeline.gpu.engine.read_block_host`): the GPU reader's layout of its array
    (:func:`pipeline.gpu.reader.layout`: zstd, Blosc or no compressor, crc32c, sharded or not, v2
    or v3), where xarray holds its values as stored and they are numbers; else None, and
    :func:`chunks_of` or xarray reads it.

    zarr decodes a chunk at a time through its event loop, into a buffer of its own that it then
    copies: on 2 cores, the mean over time of 0.8 GB of float32 took 1.37 s from a sharded store
    that ``pipeline convert`` wrote (1 MB zstd frames) through zarr and 0.52 s here, 2.14 s and
    0.65 s from one zarr wrote with inner chunks that are not contiguous runs of the shard
    (docs/performance.md)."""

    try:
        arr = _stored_array(variable)
        if arr is None or sys.byteorder != "little" or np.dtype(arr.dtype).kind not in "biufc":
            return None
        from zarr.storage import LocalStore

        if not isinstance(arr.store, LocalStore):
            return None
        from ..gpu import reader

        lay = reader.layout(Path(arr.store.root) / arr.path)
        return lay if tuple(lay.shape) == tuple(variable.shape) else None
    except (UnsupportedLayout, OSError, ValueError, TypeError):
        return None


def _codec_v3(codecs, strings: bool = False):
    """The numcodecs codec of a Zarr v3 codec list [bytes (little-endian), at most one compressor],
    or with ``strings`` [vlen-utf8, at most one compressor]; None for no compressor, or False where
    the list is anything else."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, VLenUTF8Codec, ZstdCodec

    first, *rest = codecs
    if strings:
        if not isinstance(first, VLenUTF8Codec) or len(rest) > 1:
            return False
    elif not isinstance(first, BytesCodec) or (first.endian is not None and first.endian.value != "little") or len(rest) > 1:
        return False
    if not rest:
        return None
    c = rest[0]
    if isinstance(c, ZstdCodec):
        return numcodecs.Zstd(level=c.level, checksum=c.checksum)
    if isinstance(c, BloscCodec):
        return numcodecs.Blosc()  # every setting is in each chunk's header
    if isinstance(c, GzipCodec):
        return numcodecs.GZip(level=c.level)
    return False


def chunks_of(variable) -> Chunks | None:
    """How to read ``variable``'s chunk files straight into blocks (:func:`read_direct`), or None
    where it is read through xarray: values that xarray decodes, stores that are not local
    directories, sharding, filters, transposes, big-endian data, other codecs, and data that are
    neither numbers nor variable-length UTF-8 strings read as objects.

    Strings: a VCF Zarr store's ``variant_allele`` (bio2zarr: Zarr v2, VLenUTF8 then Blosc, 1,000
    variants a chunk) took zarr 0.79 s for 600,000 variants on 2 cores, where numcodecs decodes its
    chunk files in 0.14 s on one: zarr's cost is its own, about a millisecond a chunk."""

    try:
        arr = _stored_array(variable)
        if arr is None or sys.byteorder != "little":
            return None
        from zarr.storage import LocalStore

        md = arr.metadata
        dtype = np.dtype(arr.dtype)
        strings = dtype.kind in "OT" and np.dtype(variable.dtype).kind == "O"
        if not isinstance(arr.store, LocalStore) or not (strings or dtype.kind in "biuf") or dtype.byteorder == ">":
            return None
        if md.zarr_format == 3:
            from zarr.core.chunk_grids import RegularChunkGrid

            if not isinstance(md.chunk_grid, RegularChunkGrid):
                return None
            codec = _codec_v3(md.codecs, strings)
        else:
            import numcodecs

            codec = md.compressor
            filters = tuple(md.filters or ())
            if filters != ((numcodecs.VLenUTF8(),) if strings else ()) or md.order != "C" \
                    or not (codec is None or _numcodecs_name(codec) in ("zstd", "blosc", "gzip", "zlib")):
                return None
        if codec is False:
            return None
        root = Path(arr.store.root) / arr.path
        if strings:  # zarr fills a chunk never written with its string fill value, else empty strings
            fill = str(arr.fill_value) if isinstance(arr.fill_value, str) else ""
            return Chunks(str(root), md, tuple(arr.shape), tuple(arr.chunks), np.dtype(variable.dtype), fill, codec, True)
        return Chunks(str(root), md, tuple(arr.shape), tuple(arr.chunks), dtype, arr.fill_value, codec)
    except Exception:  # anything unexpected: xarray reads it, as before
        return None


def _numcodecs_name(codec) -> str:
    return str(getattr(codec, "codec_id", "")).lower()


def _decode_chunk(c: Chunks, data: bytes, dest: np.ndarray | None) -> np.ndarray:
    """One chunk file's values, shaped as a chunk: decoded into ``dest`` (a C-contiguous view of
    the block, of a whole chunk) where given and the codec writes there, else a new array."""
    from ..gpu.engine import declared_size

    nbytes = math.prod(c.chunks) * c.dtype.itemsize
    if c.strings:
        return _strings(data if c.codec is None else c.codec.decode(data), c.chunks)
    if c.codec is None:
        out = np.frombuffer(data, dtype=c.dtype)
    elif dest is not None and declared_size(_numcodecs_name(c.codec), data) == nbytes:
        c.codec.decode(data, out=dest.reshape(-1).view(np.uint8))
        return dest
    else:
        out = np.frombuffer(c.codec.decode(data), dtype=np.uint8).view(c.dtype)
    if out.size != math.prod(c.chunks):
        raise ValueError(f"a chunk decodes to {out.size} values, not the {math.prod(c.chunks)} of its shape {c.chunks}")
    return out.reshape(c.chunks)


def _chunk_files(c: Chunks, region: tuple[slice, ...]):
    """Each chunk that ``region`` spans: its first index along each axis, the part of ``region``
    that lies in it (slices), and its file's bytes, or None where no file was written."""
    ranges = [range(s.start // n, -(-s.stop // n)) for s, n in zip(region, c.chunks)]
    for coords in itertools.product(*ranges):
        lo = [i * n for i, n in zip(coords, c.chunks)]
        inside = tuple(slice(max(a, s.start), min(a + n, s.stop)) for a, n, s in zip(lo, c.chunks, region))
        try:
            data = (Path(c.root) / c.metadata.encode_chunk_key(coords)).read_bytes()
        except FileNotFoundError:
            data = None
        yield lo, inside, data


def nonempty_direct(c: Chunks, region: tuple[slice, slice]) -> np.ndarray:
    """:func:`pipeline.kernels.genotypes.strings_named` of ``region`` of a 2-D array of strings
    (``c.strings``), from its chunk files: each decoded by its codec only, the strings' lengths
    read from the bytes that numcodecs' VLenUTF8 writes (:func:`_vlen_present`, all the chunks of
    the region at once); where they cannot be proved, the chunks are decoded into strings. A
    missing chunk file holds the fill value, as zarr reads it.

    Why not the strings: a VCF Zarr store's ``variant_allele`` of 2,500,000 variants is 7.5 to 10
    million strings, which held ``filter_variants(max_alleles=...)`` about 1.4 s on a GPU cluster's
    worker (the GIL's, whatever the threads) before the genotypes' first read."""
    rows = region[0]
    found, raws = [], []
    out = np.zeros(rows.stop - rows.start, dtype=np.int64)
    for lo, inside, data in _chunk_files(c, region):
        if data is None:
            if c.fill_value:  # every string of the chunk is the fill value
                out[inside[0].start - rows.start:inside[0].stop - rows.start] += inside[1].stop - inside[1].start
            continue
        found.append((lo, inside))
        raws.append(data if c.codec is None else c.codec.decode(data))
    present = _vlen_present(raws, c.chunks)
    if present is None:
        present = [_vlen_present([raw], c.chunks) for raw in raws]
        present = [p[0] if p is not None else _strings(raw, c.chunks).astype(bool) for p, raw in zip(present, raws)]
    for (lo, inside), chunk in zip(found, present):
        part = chunk[tuple(slice(i.start - a, i.stop - a) for i, a in zip(inside, lo))]
        out[inside[0].start - rows.start:inside[0].stop - rows.start] += part.sum(axis=1, dtype=np.int64)
    return out


def _strings(raw, shape: tuple[int, ...]) -> np.ndarray:
    """A chunk's strings, numcodecs' VLenUTF8 decoding ``raw``, shaped as the chunk."""
    import numcodecs

    strings = numcodecs.VLenUTF8().decode(raw)
    if strings.size != math.prod(shape):
        raise ValueError(f"a chunk decodes to {strings.size} values, not the {math.prod(shape)} of its shape {shape}")
    return strings.reshape(shape)


def _vlen_present(raws: list, shape: tuple[int, ...]) -> np.ndarray | None:
    """Which strings of chunks that numcodecs' VLenUTF8 encoded (each: the count of its items,
    then each item's length and bytes, 32-bit little-endian lengths) are not empty, as an array
    of the chunks (chunk, then the chunk's shape); None where this cannot prove it, and the
    strings are to be decoded.

    Where each length is below 32 and the strings' bytes are printable (alleles: bases,
    ``<DEL>``, ``*``), the bytes below 32 of the chunks' items, end to end, are exactly the
    lengths, four to an item. That guess is then proved as a decoder reads the items one by one:
    each item's length, read where the lengths before it put it, is the guessed one, each chunk's
    first item starts where its items do, and the last item ends where the bytes do. A guess that
    does not hold (a longer string, another encoding) is refused, never used. On the 2-core
    machine, 600 chunks of 3,000 alleles: numcodecs decodes them in 0.10 s (0.14 s with the count
    from the strings), this takes 0.04 s."""
    n = math.prod(shape)
    bodies = []
    for raw in raws:
        b = np.frombuffer(raw, dtype=np.uint8)
        if b.size < 4 or int(b[:4].view("<u4")[0]) != n:
            return None
        bodies.append(b[4:])
    if not bodies:
        return np.zeros((0, *shape), dtype=bool)
    firsts = np.cumsum([0] + [b.size for b in bodies[:-1]])
    body = np.concatenate(bodies) if len(bodies) > 1 else bodies[0]
    low = body < 32
    items = n * len(bodies)
    if int(np.count_nonzero(low)) != 4 * items:
        return None
    lengths = body[low].view("<u4")
    if int(lengths.max()) >= 32:
        return None
    size = lengths.astype(np.int64)
    starts = np.zeros(items, dtype=np.int64)
    np.cumsum(4 + size[:-1], out=starts[1:])
    if int(starts[-1] + 4 + size[-1]) != body.size or not np.array_equal(starts[::n], firsts):
        return None
    if not np.array_equal(body[starts], size) or (body[starts + 1] | body[starts + 2] | body[starts + 3]).any():
        return None
    return (size > 0).reshape(len(bodies), *shape)


def read_direct(c: Chunks, region: tuple[slice, ...]) -> np.ndarray:
    """The values of ``region`` (slices with starts and stops), read from the chunk files that it
    spans, each decoded straight into the block where it lies whole and contiguous in it; a
    missing chunk file holds the fill value, as zarr reads it."""
    starts = [s.start for s in region]
    out = np.empty(tuple(s.stop - s.start for s in region), dtype=c.dtype)
    for lo, inside, data in _chunk_files(c, region):
        dest = out[tuple(slice(i.start - s0, i.stop - s0) for i, s0 in zip(inside, starts))]
        if data is None:
            dest[...] = c.fill_value if c.fill_value is not None else 0
            continue
        whole = dest.shape == c.chunks and dest.flags.c_contiguous
        chunk = _decode_chunk(c, data, dest if whole else None)
        if chunk is not dest:
            dest[...] = chunk[tuple(slice(i.start - a, i.stop - a) for i, a in zip(inside, lo))]
    return out
