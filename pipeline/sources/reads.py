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

from dataclasses import dataclass

import numpy as np

from ..errors import PipelineError, chunk_error


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
