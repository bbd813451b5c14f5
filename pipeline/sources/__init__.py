"""Sources: stores opened as xarray Datasets of Dask arrays on a backend.

One :class:`Format` per kind of store, found by :func:`store_format`. Each opens its store with
xarray, values still packed; :func:`open_dataset` then moves every variable to the backend (on the
GPU, a format may read its chunks straight to the device) and CF-decodes its values there
(:mod:`.cf`). A new kind of store is one more entry in ``FORMATS``: VCF Zarr (:mod:`.vcf`) is one,
a Zarr store whose values are data as stored (no CF masking, characters not joined).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import xarray as xr

from .. import backend as B
from .. import patches, state
from ..deferred import module as _deferred
from ..errors import InputError
from ..reduce.declare import declare
from . import cf, netcdf, reads, vcf, zarr
from .cf import decode

da = _deferred("dask.array")  # imported when the first graph is built


@dataclass(frozen=True)
class Format:
    """How to open one kind of store.

    ``detect(path) -> name | None`` recognises it; ``open(path, name, chunks, **decoding)`` opens it with xarray
    (``decoding``: xarray's ``decode_cf``, ``mask_and_scale``); ``shard_chunks(path)`` gives the Dask chunks of its
    shards (or ``{}``); ``device_array(path, variable, chunks)``, where given, reads a variable's
    chunks straight to the GPU. ``is_zarr``: a Zarr store (a chunk that cannot be read is named by
    zarr). ``stored_values``: values are data as stored (VCF Zarr's -1 and -2 in integers), not
    CF-packed: nothing is masked or scaled, characters are not joined, booleans also go to the
    backend, and every variable xarray leaves as stored takes ``device_array`` on the GPU.
    """

    detect: Callable[[Path], str | None]
    open: Callable
    shard_chunks: Callable[..., dict] | None = None
    device_array: Callable | None = None
    is_zarr: bool = False
    stored_values: bool = False


ZARR = Format(zarr.detect, zarr.open_store, zarr._shard_chunks, zarr.device_array, is_zarr=True)
VCF_ZARR = Format(
    vcf.detect, vcf.open_store, zarr._shard_chunks, zarr.device_array, is_zarr=True, stored_values=True,
)
# in the order formats are tried: a VCF Zarr store is also a Zarr store
FORMATS: dict[str, Format] = {
    vcf.NAME: VCF_ZARR, "zarr3": ZARR, "zarr2": ZARR,
    "netcdf": Format(netcdf.detect, netcdf.open_store, device_array=netcdf.device_array),
}


def is_url(path) -> bool:
    return "://" in str(path)


def store_format(path: str | os.PathLike) -> str:
    """The name of the format of a local store ("vcf-zarr", "zarr3", "zarr2", "netcdf"); raises
    InputError naming the path otherwise."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file or directory")
    for fmt in dict.fromkeys(FORMATS.values()):
        name = fmt.detect(p)
        if name is not None:
            return name
    if p.is_dir():
        raise InputError(f"{path}: a directory but not a Zarr store (no zarr.json, .zgroup or .zarray)")
    raise InputError(
        f"{path}: not a Zarr store or a NetCDF file (expected a directory or one of {netcdf.SUFFIXES})"
    )


def open_dataset(
    path: str | os.PathLike,
    *,
    backend: str | None = None,
    chunks: Mapping[str, int] | str | None = None,
    variables: Iterable[str] | None = None,
    decode_cf: bool = True,
) -> xr.Dataset:
    """Open a Zarr store or NetCDF file as a Dataset of Dask arrays on ``backend``.

    Parameters
    ----------
    path
        A Zarr v2/v3 store (directory, or URL) or a NetCDF file. A local VCF Zarr store (as
        bio2zarr and sgkit write them) is read as sgkit's ``load_dataset`` reads it
        (:mod:`.vcf`): values as stored, whatever ``decode_cf`` says.
    backend
        "auto" (the GPU when one is visible), "cpu" or "gpu"; None reads ``pipeline.backend``.
    chunks
        Dask chunks per dimension (positive sizes of the store's dimensions, or -1 for a whole
        dimension); None keeps the store's own chunks (whole shards of a sharded store, as many
        along the first dimension as fit ``pipeline.gpu.block-size`` on the GPU).
    variables
        Data variables to keep (all by default); a missing name raises InputError.
    decode_cf
        Decode CF values as ``xarray.decode_cf`` does (:mod:`.cf`): numbers are unpacked on the
        backend; values that are not numbers (strings) pass through unchanged, on the host.

    A chunk that cannot be read raises InputError naming the store, the variable and the chunk
    (:mod:`.reads`).

    Examples
    --------
    >>> ds = pipeline.open_dataset("data/demo.zarr", backend="cpu")  # doctest: +SKIP
    >>> ds["tas"].data._meta  # doctest: +SKIP
    array([], shape=(0, 0, 0), dtype=float32)
    """
    target = B.resolve(backend)
    name = "zarr3" if is_url(path) else store_format(path)
    fmt = FORMATS[name]
    if target == "gpu":
        from ..kernels.copies import prepare_cupy

        prepare_cupy()  # CuPy's kernels compiled once, not by every thread at once; blocks joined by copies
        patches.apply()  # xarray's own methods on these arrays (pipeline/patches.py)
    local = not is_url(path)
    kind = name if local else "url"
    raw = _open(fmt, path, kind, name, decode_cf=False)  # metadata: storage types and attributes
    _check_chunks(path, chunks, raw.sizes)
    if isinstance(chunks, Mapping):  # -1, as in xarray and dask: the whole dimension in one chunk
        chunks = {d: raw.sizes[d] if n == -1 else n for d, n in chunks.items()}
    stored = fmt.shard_chunks(path) if fmt.shard_chunks is not None and local else {}
    if chunks is None and local:
        from ..exec.memory import block_limits, min_blocks

        size, hold, threads = block_limits(target)
        chunks = blocks_along_first(raw, stored, size, min_blocks(target), hold_bytes=hold, threads=threads,
                                    balance_for=BALANCED_FOR if target == "gpu" else ())
    elif isinstance(chunks, Mapping):
        # dimensions left out take one block per shard, not xarray's choice (the inner chunks)
        chunks = {**stored, **chunks}
    by_xarray = cf.xarray_masks(raw)  # the variables xarray decodes itself (times, booleans as integers)
    masks = vcf_masks(raw) if fmt.stored_values else by_xarray if decode_cf else False
    # xarray decodes what pipeline leaves to it (times, booleans, and the masks of ``masks``) on the
    # store already open: its decode_cf takes mask_and_scale per variable, as open_dataset does
    ds = _decode(raw, path, name, masks, concat_characters=not fmt.stored_values)
    if fmt.stored_values:
        ds = _strings_as_objects(ds)
    if variables is not None:
        variables = list(variables)
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise InputError(
                f"{path}: no variable {', '.join(map(repr, missing))} (variables: {', '.join(map(str, ds.data_vars))})"
            )
        ds = ds[variables]
    ds = _chunked(ds, path, chunks or {}, zarr_path=str(path) if fmt.is_zarr else None)
    from ..exec.compute import skip_client_lookup

    # the user's own .values, .compute() and rechunks (dask.array is imported by now) import no
    # distributed only to find no client
    skip_client_lookup()
    direct = target == "gpu" and local and fmt.device_array is not None
    for var_name, var in ds.variables.items():
        if var_name in ds.indexes or not isinstance(var.data, da.Array):
            continue
        if fmt.stored_values:
            unpack = False
            on_device = var.dtype.kind in "biuf"  # numbers and booleans; strings stay on the host
            # values as the chunks hold them
            read_direct = on_device and not (by_xarray.get(str(var_name)) or masks.get(str(var_name)))
        else:
            unpack = decode_cf and not (masks or {}).get(str(var_name), False)
            on_device, read_direct = cf.is_numeric(var.dtype), unpack
        data = var.data
        if var_name in ds.data_vars and on_device:
            if direct and read_direct:  # compressed chunks go to the GPU and decode there (pipeline.gpu.reader)
                data = fmt.device_array(path, str(var_name), data.chunks)
            else:
                data = B.to_backend(data, target)
        attrs, encoding = dict(var.attrs), dict(var.encoding)
        if unpack:
            data, attrs, encoding = cf.decode(data, attrs, encoding, str(var_name))
        elif fmt.stored_values:
            if var.dtype == bool and data.dtype != bool:  # booleans stored as int8 (sgkit's), read raw on the GPU
                data = data.astype(bool)
            data, attrs, encoding = _as_stored(data, attrs, encoding, str(var_name))
        ds[var_name] = xr.Variable(var.dims, data, attrs, encoding)
    return ds


def open_metadata(path: str | os.PathLike, *, decode_cf: bool = True) -> xr.Dataset:
    """The store as :func:`open_dataset` presents it (names, dimensions, sizes, dtypes and
    attributes: a VCF Zarr store's values as stored, CF-packed numbers decoded as xarray decodes
    them), opened lazily by xarray: nothing is read and no Dask array is made, so dask.array is not
    imported (``pipeline validate``). InputError naming the store where it cannot be opened."""
    name = "zarr3" if is_url(path) else store_format(path)
    fmt = FORMATS[name]
    raw = _open(fmt, path, name if not is_url(path) else "url", name, decode_cf=False)
    if fmt.stored_values:
        return _strings_as_objects(_decode(raw, path, name, vcf_masks(raw), concat_characters=False))
    return _decode(raw, path, name, decode_cf)


def vcf_masks(raw: xr.Dataset) -> dict[str, bool]:
    """xarray's ``mask_and_scale`` for each variable of a VCF Zarr store (:mod:`.vcf`) opened
    undecoded: on where the variable has a fill value other than the spec's sentinels (-1 and -2
    in integers; NaN in floats, whose masking would only rewrite the NaN payloads), so that its
    type is the one ``xarray.open_zarr``, and so sgkit's ``load_dataset``, give it: bio2zarr's
    Zarr v2 ``contig_length`` (int64, fill value 0) is float64, its strings with the fill value
    ``""`` are objects with NaN for ``""``. Zarr v3 fill values are not CF fill values to xarray."""
    masks = {}
    for key, var in raw.variables.items():
        _, fills = cf._fill_values(var.dtype, var.attrs)
        sentinels = vcf.SENTINELS if var.dtype.kind in "iu" else set()
        masks[str(key)] = bool(fills - sentinels) or any(k in var.attrs for k in ("scale_factor", "add_offset"))
    return masks


def _strings_as_objects(ds: xr.Dataset) -> xr.Dataset:
    """Variable-length strings (NumPy's ``StringDType``, as zarr 3 reads them) as object arrays,
    lazily: the type sgkit's ``load_dataset`` gives them (zarr 2's), in which ``.astype(str)``
    works, and xarray's type of such strings, which it writes as they are."""
    from xarray.coding.common import lazy_elemwise_func

    out = ds.copy()
    for key, var in ds.variables.items():
        if var.dtype.kind in "OT":  # objects: strings xarray masked (zarr 3 reads them as StringDType)
            data = lazy_elemwise_func(var._data, reads.as_objects, reads.vlen_str())
            out[key] = xr.Variable(var.dims, data, var.attrs, var.encoding)
    return out


def _as_stored(data, attrs: dict, encoding: dict, name: str):
    """A variable of a store whose values are data (:mod:`.vcf`): its CF attributes move to the
    encoding, its values stay as stored; a ``*_mask`` that is not boolean becomes boolean, as
    sgkit's ``load_dataset`` makes it."""
    moved = {k: attrs[k] for k in cf.PACKING_ATTRS if k in attrs}
    attrs = {k: v for k, v in attrs.items() if k not in moved}
    if name.endswith("_mask") and data.dtype.kind in "biuf" and data.dtype != bool:
        data = data.astype(bool)
    return data, attrs, {**encoding, **moved}


def blocks_along_first(
    raw: xr.Dataset, stored: Mapping, target_bytes: int, min_blocks: int = 0, *, hold_bytes: int = 0, threads: int = 0,
    balance_for: tuple[int, ...] = (),
) -> dict:
    """Dask chunks of whole stored chunks (``stored``: the shards of a sharded store; else each
    variable's own chunks), as many along each variable's first dimension as fit in
    ``target_bytes`` (0: one stored chunk a block; ``stored`` itself), leaving at least
    ``min_blocks`` blocks where the variable has that many chunks.

    On the GPU, a block's chunks decode in one batch, and nvCOMP's speed comes from the frames in
    a batch: a store of one time step a chunk (4 MB for a 721 x 1440 grid) decodes as fast as one
    of large chunks only when many go to one block. Measured on the H200 machine, 6.1 GB in blocks
    of 1, 2, 3 and 5 shards of 303 MB took 0.30, 0.23, 0.21 and 0.19 s (benchmarks/RESULTS.md). On
    the CPU, a task per 4 MB chunk costs more than reading it: on 2 cores, 365 steps of 181 x 360
    in one-step chunks took 1.36 s (Zarr v2 Blosc) and 2.77 s (NetCDF4 zlib) one chunk a block,
    0.23 s and 0.46 s in grouped blocks.

    A dimension that is not the first of every variable it belongs to keeps its stored chunks: in
    a VCF Zarr store, ``samples`` is the first dimension of ``sample_trait`` (a few bytes a sample)
    but the second of ``call_genotype``, whose blocks would grow by what fits ``sample_trait``.

    With ``hold_bytes`` (what the blocks of ``threads`` threads may take together), blocks are
    also as large as leaves the blocks that the threads hold at once within it: ``hold_bytes /
    threads`` for a variable of at least as many blocks as threads, more for one of fewer (10 GB
    of genotypes in 3 blocks of 4 GB, one per chunk of samples, rather than 9 of 1.3 GB). Measured
    on the H200 machine (sgkit's counting statistics, warm, 200,000 variants x 25,000 samples):
    0.36 s in 9 blocks, 0.30 s in 6, 0.25 s in 3; nvCOMP decodes each block's Blosc streams in one
    batch, and fewer blocks leave fewer block boundaries for a selection of variants to cut.

    With ``balance_for`` (numbers of workers), blocks are also small enough for that many workers'
    slabs (:mod:`pipeline.exec.locality`) to share the stored chunks evenly (:func:`balanced_fits`)."""
    if not target_bytes:
        return dict(stored)
    chunks: dict = {}
    grow: dict = {}  # first dimension -> stored chunks a block, the fewest any variable there allows
    later = {d for var in raw.data_vars.values() for d in var.dims[1:]}
    for var in raw.data_vars.values():
        if var.ndim == 0:
            continue
        preferred = var.encoding.get("preferred_chunks") or {var.dims[0]: 1}  # contiguous: a step a chunk
        shape = [stored.get(d, preferred.get(d, n)) for d, n in zip(var.dims, var.shape)]
        for dim, size in zip(var.dims, shape):
            chunks[dim] = max(chunks.get(dim, 0), size)
        nbytes = math.prod(shape) * var.dtype.itemsize
        count = math.ceil(var.shape[0] / shape[0])  # stored chunks along the first dimension
        fits = max(1, min(target_bytes // max(1, nbytes), count, count // min_blocks if min_blocks else count))
        if hold_bytes and threads:
            across = math.prod(math.ceil(n / s) for n, s in zip(var.shape[1:], shape[1:]))
            while fits > 1 and min(threads, math.ceil(count / fits) * across) * fits * nbytes > hold_bytes:
                fits -= 1
        if balance_for:
            fits = balanced_fits(count, fits, balance_for)
        grow[var.dims[0]] = 1 if var.dims[0] in later else min(grow.get(var.dims[0], fits), fits)
    for dim, k in grow.items():
        chunks[dim] *= k
    return chunks


BALANCE = 1.05  # the most chunks a worker's slab may hold, over an even share (rounded up)
# The GPU's blocks share evenly between 2 and 4 workers (GPUs), whatever the cluster: a result is
# the same, bit for bit, on any number of GPUs only where the blocks, and so the order in which
# partial sums meet, are the same. Blocks planned for the cluster at hand gave 2 GPUs another
# digest than 1 (12 GB of Zarr v3: blocks of 10 chunks against 13).
BALANCED_FOR = (2, 4)


def balanced_fits(count: int, fits: int, workers: tuple[int, ...]) -> int:
    """Stored chunks a block, at most ``fits``, such that ``count`` chunks in blocks of that many,
    in slabs of whole blocks on each number of ``workers``, leave no slab more than
    :data:`BALANCE` times an even share: the most that does.

    Each worker reads its own slab, so the run takes as long as the largest. On the 2-GPU H200
    machine, 40 chunks of 303 MB (12 GB of Zarr v3 as xarray writes it) in blocks of 13 made 3
    blocks, one worker's slab 1 of them and the other's 2: the second read 27 chunks while the
    first read 13, and the run took 2.81 s against one GPU's 1.78 s. In blocks of 10, each of 2
    (or 4) workers reads 20 (10) chunks."""
    from ..exec.slabs import slab_ends  # the slabs that placing makes (before it moves ends to spare trees)

    def largest(k, w):  # the most chunks in one of w slabs
        n = math.ceil(count / k)
        ends = slab_ends(n, [1] * w, [0] * (n + 1))
        return max(min(b * k, count) - a * k for a, b in zip([0, *ends[:-1]], ends))

    def even(k):
        return all(largest(k, w) <= BALANCE * math.ceil(count / w) for w in workers)

    return next((k for k in range(max(1, fits), 1, -1) if even(k)), 1)


def _open(fmt: Format, path, kind: str, name: str, **decoding) -> xr.Dataset:
    """The store opened lazily by xarray (no Dask yet); InputError naming it where it cannot be."""
    try:
        return fmt.open(path, kind, None, **decoding)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{path}: could not be opened as {name}: {e}") from e


def _decode(raw: xr.Dataset, path, name: str, masks, concat_characters: bool = True) -> xr.Dataset:
    try:
        return xr.decode_cf(raw, mask_and_scale=masks, concat_characters=concat_characters)
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: could not be decoded as {name}: {e}") from e


def _check_chunks(path, chunks, sizes: Mapping) -> None:
    """Chunk sizes must be positive (or -1, the whole dimension) and name dimensions of the store
    (xarray would ignore both)."""
    if not isinstance(chunks, Mapping):
        return
    dims = ", ".join(f"{d} ({n})" for d, n in sizes.items()) or "none"
    for dim, size in chunks.items():
        if dim not in sizes:
            raise InputError(f"{path}: chunks name dimension {dim!r}, which the store does not have (dimensions: {dims})")
        if size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or (size <= 0 and size != -1)):
            raise InputError(f"{path}: chunks of {dim!r} must be a positive number of steps or -1 (the whole "
                             f"dimension), got {size!r} (dimensions: {dims})")


def _chunked(ds: xr.Dataset, path, chunks: Mapping, zarr_path: str | None) -> xr.Dataset:
    """Each lazy variable of ``ds`` as a Dask array of ``chunks`` (the store's chunks along the
    dimensions not named), read block by block through :class:`.reads.StoreArray`."""
    from dask.base import tokenize

    token = tokenize(str(path), _mtime(path), dict(chunks))
    out = ds.copy()
    for var_name, var in ds.variables.items():
        if var_name in ds.indexes or var.ndim == 0:
            continue
        preferred = var.encoding.get("preferred_chunks", {})
        wanted = tuple(chunks.get(d, preferred.get(d, n)) for d, n in zip(var.dims, var.shape))
        blocks = da.core.normalize_chunks(wanted, var.shape, dtype=var.dtype)
        source = reads.StoreArray(var, str(path), str(var_name), zarr_path)
        data = da.from_array(source, chunks=blocks, name=f"open_dataset-{var_name}-{token}",
                             meta=np.empty((0,) * var.ndim, dtype=var.dtype))
        stored = math.prod(preferred.get(d, n) for d, n in zip(var.dims, var.shape)) * var.dtype.itemsize
        if stored > math.prod(max(c) for c in blocks) * var.dtype.itemsize:
            # a block smaller than the stored chunk it comes from still decodes that whole chunk
            declare(data, block_bytes=int(stored))
        if var.dtype.kind == "O":  # strings: a filter counts them from their chunk files
            state.opened.strings[data.name] = source
        out[var_name] = xr.Variable(var.dims, data, var.attrs, var.encoding)
    return out


def _mtime(path) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


__all__ = ["FORMATS", "Format", "VCF_ZARR", "decode", "is_url", "open_dataset", "open_metadata", "store_format"]
