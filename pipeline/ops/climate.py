"""Climate ops on (time, lat, lon) data: the xarray-level API of each op.

Each op takes an ``xarray.DataArray`` whose data is a Dask array of NumPy or CuPy chunks (an
in-memory array is accepted too, and then an in-memory result comes back) and returns a
``DataArray`` on the same backend. The mathematics lives in the kernels and in the reduction
blueprints of :mod:`pipeline.reduce.aggregation`; here are the axis bookkeeping and the graph.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from pydantic import StrictBool

from ..backend import backend_of, meta, to_backend, to_numpy
from ..deferred import module as _deferred
from ..errors import InputError
from ..exec import spill
from ..reduce import aggregation as agg
from ..reduce.overlap import map_halo
from ._common import _as_dask, _axis_of, _check, _finish, _is_int, float_dtype  # noqa: F401  (float_dtype: for callers of this module)
from .metadata import Produces, cell_names, input_name
from .params import Count, Dim, Dims, MinPeriods, Weights
from .registry import register
from .shapes import _is_latitude, latitude_radians

da = _deferred("dask.array")  # imported when the first graph is built


# --- standardized anomaly ------------------------------------------------------------------------


@register(
    kernels={"cpu": ("moments", "moments_merge_parts", "mean_std", "standardize"),
             "gpu": ("moments", "moments_merge", "mean_std", "standardize")},
    produces=Produces("standardized anomaly of {name} along {dim}", units="1", standard_name=None),
)
def standardized_anomaly(x: xr.DataArray, dim: Dim = "time") -> xr.DataArray:
    """Standardized anomaly (x - mean) / std along a dimension, NaN-skipping.

    The mean and the standard deviation (ddof=0, as ``xarray.DataArray.std``) come from one
    tree reduction of (count, mean, M2) partials; the division is one fused kernel per chunk.

    Examples
    --------
    >>> z = pipeline.ops.standardized_anomaly(ds["tas"], dim="time")  # doctest: +SKIP
    """
    op = standardized_anomaly.op
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(op, x, dim=dim)
    axis = x.get_axis_num(dim)
    backend = backend_of(data)
    mean, std = agg.nanmean_std(data, axis, kernel=op.kernel("moments", backend))
    out_dtype = float_dtype(x.dtype)
    kernel = op.kernel("standardize", backend)
    z = da.map_blocks(
        kernel, spill.second_pass(data, mean, std), mean, std, out_dtype=out_dtype, dtype=out_dtype, meta=meta(backend, out_dtype, x.ndim)
    )
    return _finish(x, z, eager).rename(x.name)


# --- weighted mean -------------------------------------------------------------------------------


def _latitude(x: xr.DataArray) -> xr.DataArray:
    """The latitude coordinate of ``x``, which the op's checks have found there."""
    return next(coord for name, coord in x.coords.items() if _is_latitude(name, coord.attrs))


def _is_longitude(x: xr.DataArray, name: str) -> bool:
    coord = x.coords.get(name)
    attrs = coord.attrs if coord is not None else {}
    return name in ("lon", "longitude") or attrs.get("standard_name") == "longitude" or attrs.get("units") in (
        "degrees_east", "degree_east"
    )


def _is_area_mean(x: xr.DataArray, dims, weights) -> bool:
    """Whether the mean is over latitude and longitude, weighted by cos(latitude): CF's "area: mean"."""
    if not (isinstance(weights, str) and weights == "coslat") or isinstance(dims, str) or len(dims) != 2:
        return False
    lat = _latitude(x).name
    return lat in dims and _is_longitude(x, next(d for d in dims if d != lat))


def _weights_comment(weights) -> str:
    if weights is None:
        return ""
    if isinstance(weights, str):
        return " (comment: weighted by cos(latitude))" if weights == "coslat" else f" (comment: weighted by {weights})"
    return f" (comment: weighted by {weights.name or 'the given weights'})"


def _weighted_long_name(x: xr.DataArray, p: dict) -> str:
    if _is_area_mean(x, p["dims"], p["weights"]):
        return f"area-weighted mean of {input_name(x)}"
    dims = [p["dims"]] if isinstance(p["dims"], str) else p["dims"]
    return f"{'weighted ' if p['weights'] is not None else ''}mean of {input_name(x)} over {', '.join(dims)}"


def _weighted_cell_methods(x: xr.DataArray, p: dict) -> str:
    if _is_area_mean(x, p["dims"], p["weights"]):
        return "area: mean"
    return f"{cell_names(p['dims'])} mean{_weights_comment(p['weights'])}"


def _weights(x: xr.DataArray, weights) -> xr.DataArray | None:
    if weights is None:
        return None
    if isinstance(weights, str) and weights == "coslat":  # the op's checks have found the latitude
        lat = _latitude(x)
        radians = latitude_radians(x.name, lat.name, lat.attrs, to_numpy(lat.data))
        # at a pole, cos gives a hair below zero where the latitude was rounded past it (float32)
        return xr.DataArray(np.maximum(np.cos(radians), 0.0), dims=lat.dims)
    if isinstance(weights, str):  # the coordinate the op's checks have found
        return x.coords[weights]
    if isinstance(weights, xr.DataArray):
        return weights
    raise InputError(f"weights must be 'coslat', a coordinate name, a DataArray or None; got {type(weights).__name__}")


@register(
    kernels=("weighted_sums",),
    produces=Produces(_weighted_long_name, cell_methods=_weighted_cell_methods),
)
def weighted_mean(
    x: xr.DataArray,
    dims: Dims = ("lat", "lon"),
    weights: Weights = "coslat",
) -> xr.DataArray:
    """Weighted mean over dimensions, NaN-skipping, as x.weighted(w).mean(dims).

    ``weights="coslat"`` weighs by the cosine of latitude; a coordinate name or a DataArray
    gives other weights; None gives the plain mean. Weights of missing values are left out of
    the denominator, as xarray does.
    """
    if isinstance(dims, str):
        dims = (dims,)
    data, eager = _as_dask(x)
    dims = _axis_of(x, tuple(dims))
    _check(weighted_mean.op, x, dims=dims, weights=weights)
    axes = tuple(x.get_axis_num(d) for d in dims)
    w = _weights(x, weights)
    if w is None:
        w = xr.DataArray(np.ones(()), name="weights")
    extra = [d for d in w.dims if d not in x.dims]
    if extra:
        raise InputError(f"weights have dimensions {extra} that {x.name!r} lacks (its dimensions: {list(x.dims)})")
    w_host = np.asarray(to_numpy(w.data), dtype=np.float64)  # weights are small: decide on the host
    if np.isnan(w_host).any():
        raise InputError("weights contain missing values (NaN); fill them first, as xarray requires")
    # lay the weights out along x's axes, size 1 where they do not vary, chunked as x
    w_full = xr.DataArray(w_host, dims=w.dims).transpose(*[d for d in x.dims if d in w.dims])
    shape = tuple(x.sizes[d] if d in w.dims else 1 for d in x.dims)
    w_np = w_full.values.reshape(shape)
    out_dtype = float_dtype(x.dtype)
    kernel = weighted_mean.op.kernel("weighted_sums", backend_of(data))
    if all(len(c) == 1 for c, n in zip(data.chunks, shape) if n > 1):
        # the weights vary only along axes that x does not split (the usual case: chunks along
        # time): every block takes the same small array, broadcast inside the task. As a Dask
        # array of their own, the weights would be a second root of the graph that Dask's
        # ordering can leave for late, holding every data block until then (seen with one or two
        # threads: the whole input held).
        result = agg.reduce(data, agg.WEIGHTED_MEAN, axes, kernel=kernel, dtype=out_dtype, weights_const=w_np)
    else:
        chunks = tuple(c if d in w.dims else (1,) for d, c in zip(x.dims, data.chunks))
        w_da = to_backend(da.from_array(w_np, chunks=chunks), backend_of(data))
        # broadcast to x's blocks here, block by block, so that each weights block is a view with
        # zero strides; left to dask's reduction, the weights are rechunked into a float64 array
        # the size of each data block
        w_da = agg.broadcast_view(w_da, data.shape, chunks=data.chunks)
        result = agg.reduce(data, agg.WEIGHTED_MEAN, axes, kernel=kernel, dtype=out_dtype, weights=w_da)
    keep = [d for d in x.dims if d not in dims]
    coords = {k: v for k, v in x.coords.items() if not set(v.dims) & set(dims)}
    return _finish(x, result, eager, dims=keep, coords=coords, name=x.name)


# --- rolling mean --------------------------------------------------------------------------------


@register(
    kernels=("rolling_mean",),
    produces=Produces(
        "{window}-step moving mean of {name} along {dim}",
        cell_methods=lambda x, p: f"{p['dim']}: mean (comment: moving window of {p['window']} steps, "
        f"{'centred' if p['center'] else 'ending at each step'})",
    ),
)
def rolling_mean(
    x: xr.DataArray, window: Count, dim: Dim = "time", center: StrictBool = False, min_periods: MinPeriods = None
) -> xr.DataArray:
    """Moving-window mean along a dimension, NaN-skipping, as x.rolling({dim: window}).mean().

    The window ends at each label (``center=False``) or is centred on it; a result needs at
    least ``min_periods`` valid values (default: the whole window). Windows cross chunk
    boundaries through :func:`pipeline.reduce.overlap.map_halo`: each chunk gets the neighbouring rows
    it needs as halo, copied, so that out of core no chunk is held for its neighbour's sake.
    """
    if not _is_int(window) or window < 1:
        raise InputError(f"window must be a positive integer, got {window!r}")
    if min_periods is None:
        min_periods = window
    if not _is_int(min_periods) or not 1 <= min_periods <= window:
        raise InputError(f"min_periods must be an integer between 1 and window={window}, got {min_periods!r}")
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(rolling_mean.op, x, dim=dim, window=window)
    axis = x.get_axis_num(dim)
    before, after = (window // 2, window - 1 - window // 2) if center else (window - 1, 0)
    out_dtype = float_dtype(x.dtype)
    backend = backend_of(data)
    kernel = rolling_mean.op.kernel("rolling_mean", backend)
    result = map_halo(
        kernel,
        data,
        axis,
        (before, after),
        before=before,
        after=after,
        min_periods=int(min_periods),
        out_dtype=out_dtype,
        dtype=out_dtype,
        meta=meta(backend, out_dtype, x.ndim),
    )
    return _finish(x, result, eager)
