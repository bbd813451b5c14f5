"""Reading a variable's blocks from its store, with errors that say where.

A chunk that its codec cannot decode (a corrupt file, a checksum that does not match) surfaces in
zarr or h5py as an exception naming neither the store, the variable nor the chunk, under a long
traceback from inside a Dask task. :class:`StoreArray`, the array Dask reads each block from,
turns any such error into an :class:`~pipeline.errors.InputError` that names them; for Zarr it
reads the block again one stored chunk (or shard) at a time to name the one that fails. The error
is an ordinary picklable exception, so it reaches the caller from Dask's local and distributed
schedulers alike.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, PipelineError


def chunk_error(path, variable: str, region: tuple[slice, ...], error: Exception, zarr_array=None) -> InputError:
    """The InputError for a block of ``variable`` that could not be read: the store, the variable,
    the stored chunk (located within ``region`` where ``zarr_array`` is given) and the decoder's
    message."""
    where = "values " + ", ".join(f"{s.start}:{s.stop}" for s in region)
    if zarr_array is not None:
        where = _failing_chunk(zarr_array, region) or where
    return InputError(
        f"{path}: variable {variable!r}: {where} could not be read (corrupt or unreadable data)\n"
        f"  {type(error).__name__}: {error}"
    )


def _failing_chunk(arr, region: tuple[slice, ...]) -> str | None:
    """``chunk (i, j, ..) (file KEY)`` of the first stored chunk (or shard) of ``region`` that zarr
    fails to read, or None where each reads on its own."""
    grid = tuple(arr.shards or arr.chunks)
    ranges = [range(s.start // c, math.ceil(s.stop / c)) for s, c in zip(region, grid)]
    for coords in itertools.product(*ranges):
        sel = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, grid, arr.shape))
        try:
            arr[sel]
        except Exception:
            return f"chunk {coords} (file {arr.metadata.encode_chunk_key(coords)})"
    return None


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

    def __getitem__(self, key):
        try:
            return np.asarray(self.variable[key].values)
        except PipelineError:
            raise
        except Exception as e:
            zarr_array = None
            if self.zarr_path is not None:
                import zarr

                zarr_array = zarr.open_array(self.zarr_path, path=self.name, mode="r")
            raise chunk_error(self.path, self.name, _region(key, self.shape), e, zarr_array) from None
