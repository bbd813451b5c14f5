"""What every op does around its graph: take the data as Dask, find an axis, wrap the result."""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..backend import backend_of, meta
from ..deferred import module as _deferred
from ..errors import InputError
from . import shapes

da = _deferred("dask.array")  # imported when the first graph is built


def _as_dask(x: xr.DataArray) -> tuple[da.Array, bool]:
    """``x``'s data as a Dask array, and whether it was in memory (the result is then computed)."""
    if not isinstance(x, xr.DataArray):
        raise InputError(f"expected an xarray.DataArray, got {type(x).__name__}")
    if isinstance(x.data, da.Array):
        return x.data, False
    return da.from_array(x.data, chunks=-1, meta=meta(backend_of(x.data), x.dtype, x.ndim)), True


def _finish(template: xr.DataArray, data: da.Array, eager: bool, **kwargs) -> xr.DataArray:
    """``data`` as a DataArray (``template``'s dims and coords, or those in ``kwargs``), computed
    when the op's input was in memory."""
    out = xr.DataArray(data, **kwargs) if kwargs else template.copy(data=data)
    return out.compute() if eager else out


def _check(op, x: xr.DataArray, **params) -> None:
    """``op``'s data checks on ``x``'s metadata, the very ones ``pipeline validate`` runs
    (:mod:`pipeline.ops.shapes`), so that each check and its message live in one place."""
    shapes.check(op, shapes.meta_of(x), params)


def _is_int(v) -> bool:
    """An integer, NumPy's included, and not a bool (``True`` is no window of 1)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def float_dtype(dtype) -> np.dtype:
    """Result type of a mean of ``dtype`` data: float32 stays float32, the rest become float64."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind == "f" and dtype.itemsize >= 4 else np.dtype(np.float64)
