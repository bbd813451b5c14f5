"""sgkit's API on pipeline's backends: ``import pipeline.genomics as sg`` in place of ``import
sgkit as sg``. The ops live in :mod:`pipeline.ops.genomics`; this module only names them, and
``load_dataset``, sgkit's way to open a store."""

from __future__ import annotations

from .ops.genomics import *  # noqa: F401,F403
from .ops.genomics import __all__ as _ops


def load_dataset(store, *, backend: str | None = None, chunks=None, variables=None):
    """sgkit's ``load_dataset``: a VCF Zarr store (bio2zarr's or sgkit's, Zarr v2 or v3) as a
    Dataset of Dask arrays on ``backend``, read as sgkit reads it (:func:`pipeline.open_dataset`,
    :mod:`pipeline.sources.vcf`)."""
    from .sources import open_dataset

    return open_dataset(store, backend=backend, chunks=chunks, variables=variables)


__all__ = [*_ops, "load_dataset"]
