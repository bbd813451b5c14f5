"""What every op does around its graph: take the data as Dask, find an axis, wrap the result."""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..backend import backend_of, meta
from ..deferred import module as _deferred
from ..errors import InputError
from . import shapes
from .axes import resolve_dims

da = _deferred("dask.array")  # imported when the first graph is built


def _as_dask(x: xr.DataArray) -> tuple[da.Array, bool]:
    """``x``'s data as a Dask array, and whether it was in memory (the result is then computed).

    float16 data are computed in float32 (as NumPy's own reductions of float16 accumulate), and
    the results are float32 (:func:`float_dtype`): the kernels are compiled for float32 and float64."""
    if not isinstance(x, xr.DataArray):
        raise InputError(f"expected an xarray.DataArray, got {type(x).__name__}")
    if isinstance(x.data, da.Array):
        data, eager = x.data, False
    else:
        data, eager = da.from_array(x.data, chunks=-1, meta=meta(backend_of(x.data), x.dtype, x.ndim)), True
    if data.dtype == np.float16:
        data = data.astype(np.float32)
    return data, eager


def _finish(template: xr.DataArray, data: da.Array, eager: bool, **kwargs) -> xr.DataArray:
    """``data`` as a DataArray (``template``'s dims and coords, or those in ``kwargs``), computed
    when the op's input was in memory."""
    out = xr.DataArray(data, **kwargs) if kwargs else template.copy(data=data)
    return out.compute() if eager else out


def _axis_of(x: xr.DataArray, dim):
    """``dim``, or where it is a default axis name that ``x`` lacks, the dimension that is that
    axis by its CF attributes (:func:`pipeline.ops.axes.resolve`); a list of names, each so."""
    return resolve_dims(x, dim, "dims" if not isinstance(dim, str) else "dim")


def _check(op, x: xr.DataArray, **params) -> None:
    """``op``'s data checks on ``x``'s metadata, the very ones ``pipeline validate`` runs
    (:mod:`pipeline.ops.shapes`), so that each check and its message live in one place."""
    shapes.check(op, shapes.meta_of(x), params)


def _is_int(v) -> bool:
    """An integer, NumPy's included, and not a bool (``True`` is no window of 1)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def float_dtype(dtype) -> np.dtype:
    """Result type of a mean of ``dtype`` data: float16 and float32 give float32, the rest float64."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return np.dtype(np.float32)
    return dtype if dtype.kind == "f" else np.dtype(np.float64)
