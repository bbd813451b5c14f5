"""Zarr out, all or nothing.

A store is written to a hidden sibling directory and renamed into place only when complete, so a
failed or interrupted run never leaves a store that looks finished.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Mapping

import dask.array as da
import xarray as xr

from .. import backend as B
from ..errors import InputError
from ..exec.compute import compute, compute_threads
from ..sources import is_url


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
    if is_url(path):
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



def _replace(new: Path, final: Path) -> None:
    """Move a complete store into place; an old store is moved aside first, then deleted."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
