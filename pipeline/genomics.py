"""sgkit's API on pipeline's backends: ``import pipeline.genomics as sg`` in place of ``import
sgkit as sg``. The ops live in :mod:`pipeline.ops.genomics`; this module only names them, and
``load_dataset``, sgkit's way to open a store."""

from __future__ import annotations

import atexit as _atexit
import gc as _gc

from .exec.compute import skip_client_lookup as _skip_client_lookup
from .ops.genomics import *  # noqa: F401,F403
from .ops.genomics import __all__ as _ops
from .ops.genomics import specs as variables
from .ops.genomics.specs import *  # noqa: F401,F403  (sgkit's DIM_* names)

# A script's process ends soon after its computation; as it exits, the interpreter's last
# collections walk the 200,000 objects its imports left (0.3-0.6 s of a 2 s sgkit-style script).
# Frozen (as the ``pipeline`` command freezes them at its end), they are freed without being
# walked; only objects left in reference cycles at exit miss their finalizers, which Python does
# not promise then either. This runs after the atexit functions registered later (last in, first
# out), and a process that goes on is not touched. The setting ``pipeline.freeze-at-exit: false``
# leaves the exit to Python.


def _freeze_at_exit() -> None:
    import sys

    from . import config

    # Not where CuPy is loaded: on the H200 machine a GPU process frozen here printed its result
    # and then hung in the interpreter's exit
    if config.get("freeze-at-exit", True) and "cupy" not in sys.modules:
        _gc.freeze()


_atexit.register(_freeze_at_exit)

# Every result of these functions is a Dask array of pipeline's: a script's first .values chooses
# dask's scheduler without importing distributed where no client can exist (as pipeline.open_dataset
# arranges; pipeline.exec.compute.skip_client_lookup).
_skip_client_lookup()


def load_dataset(store, storage_options=None, *, backend: str | None = None, chunks=None, variables=None,
                 **kwargs):
    """sgkit's ``load_dataset``: a VCF Zarr store (bio2zarr's or sgkit's, Zarr v2 or v3) as a
    Dataset of Dask arrays on ``backend``, each variable of the type sgkit gives it.

    ``store``, ``storage_options`` and ``kwargs`` are sgkit's: a local path is read by
    :func:`pipeline.open_dataset` (:mod:`pipeline.sources.vcf`; on the GPU, through pipeline's
    reader), ``consolidated`` changing nothing there but how the metadata is found. Any other store
    (a zarr Store object, an fsspec mapping, a URL, ``storage_options``, or other arguments of
    ``xarray.open_zarr``) is opened as sgkit opens it, by ``xarray.open_zarr(store,
    storage_options=..., concat_characters=False, **kwargs)`` with its ``*_mask`` variables made
    boolean, and its numbers then moved to ``backend``. ``backend``, ``chunks`` and ``variables``
    are pipeline's (:func:`pipeline.open_dataset`). Strings stay on the host as object arrays."""
    import os

    from .sources import open_dataset

    local = isinstance(store, (str, os.PathLike)) and "://" not in str(store)
    if local and not storage_options and set(kwargs) <= {"consolidated"}:
        return open_dataset(store, backend=backend, chunks=chunks, variables=variables)
    return _open_zarr(store, storage_options, backend, chunks, variables, kwargs)


def _open_zarr(store, storage_options, backend, chunks, variables, kwargs):
    """sgkit's reading of a store pipeline's own reader does not take (:func:`load_dataset`)."""
    import xarray as xr

    from . import backend as B
    from .errors import InputError
    from .sources import _strings_as_objects

    if chunks is not None:
        kwargs["chunks"] = chunks
    try:
        ds = xr.open_zarr(store, storage_options=storage_options, concat_characters=False, **kwargs)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{store}: could not be opened as VCF Zarr: {e}") from e
    if variables is not None:
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise InputError(f"{store}: no variable {', '.join(map(repr, missing))} "
                             f"(variables: {', '.join(map(str, ds.data_vars))})")
        ds = ds[list(variables)]
    for name in ds.data_vars:
        if str(name).endswith("_mask"):  # as sgkit does (xarray's issue 4386)
            ds[name] = ds[name].astype(bool)
    ds = _strings_as_objects(ds)
    target = B.resolve(backend)
    if target == "gpu":
        from . import patches

        patches.apply()
    for name, var in ds.data_vars.items():
        if var.dtype.kind in "biuf" and var.chunks is not None:
            ds[name] = var.copy(data=B.to_backend(var.data, target))
    return ds


def __getattr__(name: str):
    # the writer, and the sinks it imports, only when asked for: an open needs neither
    if name == "save_dataset":
        from .sinks.sgkit import save_dataset

        return save_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_ops, *variables.__all__, "load_dataset", "variables", "save_dataset"]
