"""Data access: open Zarr (v2, v3) and NetCDF as xarray Datasets on a backend; write Zarr safely.

Reading keeps xarray's CF decoding of times and attributes but moves the unpacking of values
(``_FillValue``/``missing_value`` -> NaN, ``scale_factor``, ``add_offset``) to the chosen backend:
on the GPU the packed integers cross the bus and are unpacked there by one fused kernel, with the
float type xarray itself would choose. Writing goes to a hidden sibling store that is renamed into
place only when complete, so a failed or interrupted run never leaves a store that looks finished.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Iterable, Mapping

import dask.array as da
import numpy as np
import xarray as xr

from . import backend as B
from . import config
from .errors import InputError
from .kernels import elementwise

NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5", ".hdf5", ".cdf")
PACKING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value")


def _is_url(path: str) -> bool:
    return "://" in str(path)


def store_format(path: str | os.PathLike) -> str:
    """"zarr3", "zarr2" or "netcdf" for a local path; raises InputError naming the path otherwise."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file or directory")
    if p.is_dir():
        if (p / "zarr.json").exists():
            return "zarr3"
        if (p / ".zgroup").exists() or (p / ".zarray").exists():
            return "zarr2"
        raise InputError(f"{path}: a directory but not a Zarr store (no zarr.json, .zgroup or .zarray)")
    if p.suffix.lower() in NETCDF_SUFFIXES:
        return "netcdf"
    raise InputError(f"{path}: not a Zarr store or a NetCDF file (expected a directory or one of {NETCDF_SUFFIXES})")


def _consolidated(path: Path, fmt: str) -> bool:
    if fmt == "zarr2":
        return (path / ".zmetadata").exists()
    with open(path / "zarr.json") as f:
        return bool(json.load(f).get("consolidated_metadata"))


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
        A Zarr v2/v3 store (directory) or a NetCDF file.
    backend
        "auto" (the GPU when one is visible), "cpu" or "gpu"; None reads ``pipeline.backend``.
    chunks
        Dask chunks per dimension; None keeps the store's own chunks.
    variables
        Data variables to keep (all by default); a missing name raises InputError.
    decode_cf
        Unpack ``scale_factor``/``add_offset`` and mask ``_FillValue``/``missing_value`` on the backend.

    Examples
    --------
    >>> ds = pipeline.open_dataset("data/demo.zarr", backend="cpu")  # doctest: +SKIP
    >>> ds["tas"].data._meta  # doctest: +SKIP
    array([], shape=(0, 0, 0), dtype=float32)
    """
    target = B.resolve(backend)
    sharded = not _is_url(path) and store_format(path) != "netcdf"
    if chunks is None:
        from .memory import block_target

        chunks = _shard_chunks(path, block_target(target)) if sharded else {}
    elif sharded and isinstance(chunks, Mapping):
        # dimensions left out take one block per shard, not xarray's choice (the inner chunks)
        chunks = {**_shard_chunks(path), **chunks}
    if _is_url(path):
        ds = xr.open_zarr(str(path), chunks=chunks, mask_and_scale=False)
    else:
        fmt = store_format(path)
        try:
            if fmt == "netcdf":
                ds = xr.open_dataset(path, chunks=chunks, mask_and_scale=False)
            else:
                ds = xr.open_zarr(path, chunks=chunks, mask_and_scale=False, consolidated=_consolidated(Path(path), fmt))
        except (ValueError, KeyError, OSError) as e:
            raise InputError(f"{path}: could not be opened as {fmt}: {e}") from e
    if variables is not None:
        variables = list(variables)
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise InputError(
                f"{path}: no variable {', '.join(map(repr, missing))} (variables: {', '.join(map(str, ds.data_vars))})"
            )
        ds = ds[variables]
    direct = target == "gpu" and not _is_url(path) and store_format(path) != "netcdf"
    for name, var in ds.data_vars.items():
        if direct:  # compressed chunks go to the GPU and decode there (pipeline.gpu_zarr)
            from . import gpu_zarr

            data = gpu_zarr.open_array(path, str(name), chunks=var.data.chunks)
        else:
            data = B.to_backend(var.data, target)
        attrs, encoding = dict(var.attrs), dict(var.encoding)
        if decode_cf:
            data, attrs, encoding = decode(data, attrs, encoding)
        ds[name] = xr.Variable(var.dims, data, attrs, encoding)
    return ds


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


def _float_dtype_like_xarray(dtype: np.dtype, attrs: Mapping) -> np.dtype:
    """The float type xarray's CF decoding gives ``dtype`` data with these attributes."""
    try:
        from xarray.coding.variables import _choose_float_dtype
    except ImportError:  # pragma: no cover - older or newer xarray without the helper
        return np.dtype(np.float64) if dtype.itemsize > 2 or "add_offset" in attrs else np.dtype(np.float32)
    return np.dtype(_choose_float_dtype(dtype, attrs))


def decode(data: da.Array, attrs: dict, encoding: dict) -> tuple[da.Array, dict, dict]:
    """CF-unpack one variable on its backend: fill values -> NaN, then ``raw * scale + offset``."""
    if not any(k in attrs for k in PACKING_ATTRS):
        return data, attrs, encoding
    fills = []
    for key in ("_FillValue", "missing_value"):
        if key in attrs:
            fills.extend(np.atleast_1d(np.asarray(attrs[key])).tolist())
    has_scale = "scale_factor" in attrs or "add_offset" in attrs
    if has_scale or data.dtype.kind in "iu":
        out_dtype = _float_dtype_like_xarray(data.dtype, attrs)
    else:
        out_dtype = data.dtype
    scale = float(np.asarray(attrs.get("scale_factor", 1.0)))
    offset = float(np.asarray(attrs.get("add_offset", 0.0)))
    backend = B.backend_of(data)
    kernel = elementwise.cf_decode_gpu if backend == "gpu" else elementwise.cf_decode_cpu
    decoded = data.map_blocks(
        kernel,
        fill_values=tuple(fills),
        scale=scale,
        offset=offset,
        out_dtype=out_dtype,
        dtype=out_dtype,
        meta=B.meta(backend, out_dtype, data.ndim),
    )
    encoding = {**encoding, **{k: attrs[k] for k in PACKING_ATTRS if k in attrs}}
    attrs = {k: v for k, v in attrs.items() if k not in PACKING_ATTRS}
    return decoded, attrs, encoding


# --- writing --------------------------------------------------------------------------------------


def _regular(data: da.Array) -> da.Array:
    """Zarr needs equal chunks (the last may be shorter): rechunk where a graph made them uneven."""
    target = []
    for c in data.chunks:
        regular = len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0])
        target.append(c if regular else max(c))
    return data if all(isinstance(t, tuple) for t in target) else data.rechunk(tuple(target))


def to_host_dataset(obj: xr.Dataset | xr.DataArray, name: str | None = None) -> xr.Dataset:
    """A Dataset whose variables are Dask arrays of NumPy chunks, ready for ``to_zarr``."""
    if isinstance(obj, xr.DataArray):
        obj = obj.to_dataset(name=name or obj.name or "result")
    out = obj.copy()
    for k, v in list(out.variables.items()):
        data = v.data
        if isinstance(data, da.Array):
            data = _regular(B.to_backend(data, "cpu"))
        elif B.is_cupy(data):
            data = B.to_numpy(data)
        out[k] = xr.Variable(v.dims, data, v.attrs)  # encodings of the source do not apply
    return out


def directory_bytes(path: str | os.PathLike) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def write_zarr(
    obj: xr.Dataset | xr.DataArray,
    path: str | os.PathLike,
    *,
    mode: str = "overwrite",
    name: str | None = None,
    zarr_format: int = 3,
    encoding: Mapping | None = None,
    progress: bool = False,
) -> Path:
    """Write ``obj`` to a Zarr store at ``path``, all or nothing.

    The store is written to a hidden sibling directory and renamed to ``path`` once every chunk
    is written; an exception or an interrupt removes the partial store. ``mode="overwrite"``
    replaces an existing store only after the new one is complete (reruns are safe);
    ``mode="fail"`` refuses to touch an existing path.
    """
    if mode not in ("overwrite", "fail"):
        raise InputError(f"mode must be 'overwrite' or 'fail', got {mode!r}")
    if _is_url(path):
        raise InputError(f"{path}: writing to URLs is not supported; write to a local or shared file system path")
    final = Path(path)
    if final.exists() and mode == "fail":
        raise InputError(f"{path}: already exists (mode 'fail')")
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{final.name}.partial-{uuid.uuid4().hex[:12]}"
    threads = compute_threads(obj)
    ds = to_host_dataset(obj, name)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
            store = ds.to_zarr(
                partial, mode="w-", zarr_format=zarr_format, consolidated=True, encoding=encoding, compute=False
            )
        compute(store, progress=progress, threads=threads)
        _replace(partial, final)
    except BaseException:
        _remove(partial)
        raise
    return final


def _remove(path: Path, settle: float = 3.0) -> None:
    """Delete a partial store for good. Zarr finishes in-flight writes on its own I/O thread even
    after the caller was interrupted, and such a write re-creates the directory it writes into;
    so delete, then watch for a moment and delete again what comes back."""
    import time

    shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + settle
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 0.5:
        time.sleep(0.05)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            quiet_since = time.monotonic()


def _arrays_of(obj):
    """The arrays of ``obj``: a DataArray, a Dataset, an array, or a list, tuple or dict of them
    (what ``dask.compute`` accepts)."""
    if isinstance(obj, xr.DataArray):
        yield obj.data
    elif isinstance(obj, xr.Dataset):
        yield from (v.data for v in obj.variables.values())
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _arrays_of(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _arrays_of(item)
    else:
        yield obj


def _graph_sizes(obj) -> tuple[str, int, int, int] | None:
    """The backend of ``obj``'s arrays, their graphs' largest block and largest reduction
    partial, and the blocks a thread may hold (:mod:`pipeline.memory`), or None without arrays."""
    from . import memory

    arrays = [a for a in _arrays_of(obj) if isinstance(a, da.Array)]
    if not arrays:
        return None
    backend = "gpu" if any(B.backend_of(a) == "gpu" for a in arrays) else "cpu"
    return backend, memory.graph_block_bytes(*arrays), memory.graph_partial_bytes(*arrays), memory.graph_blocks_per_thread(*arrays)


def compute_threads(obj) -> int | None:
    """Threads for computing ``obj`` in this process, from :func:`pipeline.memory.threads_for`:
    ``pipeline.gpu.threads`` when its data is on the GPU (a few threads keep a GPU busy, and chunk
    files are read by pipeline's own I/O pool), dask's default otherwise; fewer where that many
    threads, each holding a few blocks, would exceed the backend's memory limit."""
    from . import memory

    sizes = _graph_sizes(obj)
    return None if sizes is None else memory.threads_for(*sizes)


def _room_to_read_ahead(obj, fits: dict, nthreads: dict) -> bool:
    """Whether each worker can hold what it may read ahead once its slab is placed on it.

    Placing slabs pins each worker's reads, and the scheduler queues no pinned task: a worker
    reads ahead of its threads, up to twice the blocks that the same threads hold in one process
    (benchmarks/live_blocks.py), or at most its whole slab. Where neither fits a worker's budget
    (``fits``: threads that fit and budget, from :func:`pipeline.memory.check_workers`), the
    scheduler places the blocks instead, and its queuing bounds the reads a worker holds
    (worker-saturation)."""
    from . import memory

    if not fits:
        return True
    slab = memory.graph_array_bytes(*(a for a in _arrays_of(obj) if isinstance(a, da.Array))) / max(len(nthreads), 1)
    return all(nthreads.get(w, 0) <= fit // 2 or slab <= budget / 2 for w, (fit, budget) in fits.items())


def active_client():
    """The distributed client computations go to (``distributed.default_client()``), or None."""
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def compute(obj, progress: bool = False, threads: int | None = None):
    """Compute on the current distributed client if there is one, else on dask's threads
    (``threads`` of them; by default ``pipeline.gpu.threads`` for data on the GPU, else dask's
    ``num_workers`` or one per core).

    When the computation fails or is interrupted, this returns only once no task of it is still
    running, so that the caller can remove what the tasks wrote without a late write
    re-creating it.
    """
    import contextlib
    import sys

    import dask

    client = active_client()
    if client is not None:
        from . import memory

        sizes = _graph_sizes(obj)
        # the memory plan, with each worker's own budget and threads
        fits = memory.check_workers(client, *sizes) if sizes is not None else {}
        placed = False
        if config.get("cluster.locality", True) and _room_to_read_ahead(obj, fits, client.nthreads()):
            # each worker reads, maps and reduces a contiguous slab of blocks, in both passes of a
            # two-pass op, so that only partials and statistics cross workers (pipeline.locality)
            from .locality import ReleasePins, place

            try:
                client.register_plugin(ReleasePins())  # unpins the blocks of a worker that leaves
            except Exception as e:  # e.g. a scheduler that cannot import pipeline
                warnings.warn(f"blocks are left to the scheduler to place: {type(e).__name__}: {e}", stacklevel=2)
            else:
                obj, placed = place(obj, client.nthreads())
        future = client.compute(obj, optimize_graph=not placed)  # place() optimized it already
        try:
            if progress:
                from distributed import progress as show_progress

                show_progress(future)
            return client.gather(future)  # one future, or a list of them for a list of collections
        except BaseException:
            client.cancel(future)
            _wait_idle(client)
            raise
    if dask.config.get("scheduler", None) not in (None, "threads", "threading"):
        return dask.compute(obj)[0]  # a scheduler the user chose: leave it alone
    from concurrent.futures import ThreadPoolExecutor

    from dask.system import CPU_COUNT

    if threads is None:
        threads = compute_threads(obj)
    pool = ThreadPoolExecutor(threads or dask.config.get("num_workers", None) or CPU_COUNT)
    try:
        bar = contextlib.nullcontext()
        if progress:
            from dask.diagnostics import ProgressBar

            bar = ProgressBar(out=sys.stderr)
        with bar, dask.config.set(pool=pool, scheduler="threads"):
            return dask.compute(obj)[0]
    finally:
        # dask's own pool would leave running tasks behind after an error; this one is joined
        pool.shutdown(wait=True, cancel_futures=True)


def _wait_idle(client, timeout: float = 30.0) -> None:
    """Wait until the cluster runs no task (after a cancel, running tasks still finish)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not any(client.processing().values()):
                return
        except Exception:
            return
        time.sleep(0.1)


def _replace(new: Path, final: Path) -> None:
    """Move a complete store into place; an old store is moved aside first, then deleted."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- a GPU-fast copy of a store --------------------------------------------------------------------


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
) -> Path:
    """Copy a Zarr store or NetCDF file into a Zarr v3 store that the GPU reads fastest.

    With ``compression="zstd"`` (the default) each shard holds one Dask block of the source (its
    chunks, or ``chunks``); inside, values are zstd frames of about ``inner_bytes``, each a
    contiguous run of the shard, which nvCOMP decodes many at a time straight into place. With
    ``compression="none"`` each chunk is one such block, uncompressed: nothing to decode, a third
    more bytes to read (for stores read from memory or fast disks, where decoding is the slowest
    step). Values, attributes and CF encodings are copied unchanged (packed integers stay packed),
    and any Zarr v3 reader opens the result.
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
    return write_zarr(ds, dst, mode=mode, encoding=encoding, progress=progress)
