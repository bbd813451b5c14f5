"""Ops by group along a dimension of dates: climatologies, anomalies, resampling into periods,
counts and spells.

Groups come from the dates of the dimension ``dim`` (``"time"`` by default) on the host
(``time.month``, ``time.dayofyear``, or the bins of a pandas frequency such as ``"1D"``, ``"MS"``,
``"YS"``); the data never leave their backend. Each block is reduced over all its groups by one
kernel (:mod:`pipeline.kernels.groups`) and the partials are merged across blocks and workers
(:func:`pipeline.reduce.aggregation.group_reduce` and ``binned_reduce``).
"""

from __future__ import annotations

import re
from typing import Literal

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from ..backend import backend_of, meta, xp_of
from ..errors import InputError
from ..exec import spill
from ..kernels.launch import from_2d, to_2d
from ..reduce import aggregation as agg
from ._common import _as_dask, _axis, _finish, float_dtype
from .registry import register

Freq = Literal["month", "dayofyear"]


def _time(x: xr.DataArray, dim: str = "time") -> xr.DataArray:
    _axis(x, dim)
    t = x[dim]
    if not (np.issubdtype(t.dtype, np.datetime64) or t.dtype == object):
        raise InputError(f"dimension {dim!r} of {x.name!r} must hold dates (datetime64 or cftime), got {t.dtype}")
    return t


def _group_labels(x: xr.DataArray, freq: str, dim: str) -> np.ndarray:
    if freq not in ("month", "dayofyear"):
        raise InputError(f"freq must be 'month' or 'dayofyear', got {freq!r}")
    return np.asarray(getattr(_time(x, dim).dt, freq).values, dtype=np.int64)


def _bins(x: xr.DataArray, freq: str, dim: str) -> tuple[np.ndarray, pd.Index]:
    """Bin number of every step and the label of every bin (empty bins included), as xarray's
    ``resample({dim: freq})`` makes them."""
    t = _time(x, dim)
    try:
        index = t.to_index()
        grouped = pd.Series(np.arange(index.size), index=index).groupby(pd.Grouper(freq=freq))
        return grouped.ngroup().to_numpy(np.int64), grouped.size().index
    except (ValueError, TypeError) as e:
        raise InputError(f"freq {freq!r} is not a pandas frequency for dimension {dim!r} of {x.name!r}: {e}") from None


# --- thresholds with units --------------------------------------------------------------------------

_TO_KELVIN = {"K": (1.0, 0.0), "degC": (1.0, 273.15), "°C": (1.0, 273.15), "C": (1.0, 273.15),
              "celsius": (1.0, 273.15), "degF": (5 / 9, 273.15 - 32 * 5 / 9), "°F": (5 / 9, 273.15 - 32 * 5 / 9)}


def threshold_in_units_of(x: xr.DataArray, threshold: float | str) -> float:
    """A threshold in the data's units: a number is taken as is; ``"25 degC"`` is converted, as
    xclim's quantities are, for temperatures in K, degC or degF."""
    if not isinstance(threshold, str):
        return float(threshold)
    m = re.fullmatch(r"\s*([-+0-9.eE]+)\s*(\S+)\s*", threshold)
    data_units = x.attrs.get("units")
    if not m or m.group(2) not in _TO_KELVIN:
        raise InputError(f"threshold must be a number or a temperature such as '25 degC', got {threshold!r}")
    if data_units not in _TO_KELVIN:
        raise InputError(f"threshold {threshold!r} has units but {x.name!r} has units {data_units!r} (expected K, degC or degF)")
    scale, offset = _TO_KELVIN[m.group(2)]
    kelvin = float(m.group(1)) * scale + offset
    scale, offset = _TO_KELVIN[data_units]
    return (kelvin - offset) / scale


def _new_time_dim(x, data, axis, name, labels, eager, attrs):
    """``data`` with the dimension of ``axis`` replaced by ``name``, labelled ``labels``."""
    dims = list(x.dims)
    old = dims[axis]
    dims[axis] = name
    coords = {k: v for k, v in x.coords.items() if old not in v.dims}
    coords[name] = labels
    return _finish(x, data, eager, dims=dims, coords=coords, name=x.name, attrs=attrs)


# --- climatology and anomalies ----------------------------------------------------------------------


def _climatology_data(op, x: xr.DataArray, freq: str, dim: str):
    data, eager = _as_dask(x)
    axis = _axis(x, dim)
    labels = _group_labels(x, freq, dim)
    kernel = op.kernel(agg.GROUP_MEAN.chunk, backend_of(data))
    clim = agg.group_reduce(data, agg.GROUP_MEAN, labels, axis, np.float64, kernel=kernel)
    return data, eager, axis, labels, clim


@register(kernels=("group_sum",))
def climatology(x: xr.DataArray, freq: Freq = "month", dim: str = "time") -> xr.DataArray:
    """Mean for each month or day of year over all years, NaN-skipping, as x.groupby(f"time.{freq}").mean().

    ``dim`` is the dimension of dates to group (``"time"``); it becomes a dimension named ``freq``.
    Each chunk is reduced over all the groups it holds by one kernel; partial sums and counts
    merge across chunks and GPUs as a tree.
    """
    data, eager, axis, labels, clim = _climatology_data(climatology.op, x, freq, dim)
    out_dtype = float_dtype(x.dtype)
    return _new_time_dim(x, clim.astype(out_dtype), axis, freq, np.unique(labels), eager, dict(x.attrs))


@register(kernels=("group_sum", "subtract_groups"))
def anomaly(x: xr.DataArray, freq: Freq = "month", dim: str = "time") -> xr.DataArray:
    """Departure from the climatology of each step's month or day of year, as x.groupby(...) - climatology.

    ``dim`` is the dimension of dates to group (``"time"``).
    """
    data, eager, axis, labels, clim = _climatology_data(anomaly.op, x, freq, dim)
    position = np.searchsorted(np.unique(labels), labels)
    out_dtype = float_dtype(x.dtype)
    backend = backend_of(data)
    kernel = anomaly.op.kernel("subtract_groups", backend)
    inds = tuple(range(x.ndim))
    group_inds = tuple(x.ndim if i == axis else i for i in inds)
    out = da.blockwise(
        _subtract_block, inds, spill.second_pass(data, clim), inds, da.from_array(position, chunks=(data.chunks[axis],)), (axis,),
        clim, group_inds, concatenate=True, kernel=kernel, axis=axis, out_dtype=out_dtype,
        dtype=out_dtype, meta=meta(backend, out_dtype, x.ndim),
    )
    result = _finish(x, out, eager)
    result.attrs = dict(x.attrs)
    return result


def _subtract_block(block, position, clim, kernel, axis, out_dtype):
    x2, moved = to_2d(block, axis, xp_of(block))
    c2, _ = to_2d(clim, axis, xp_of(clim))
    return from_2d(kernel(x2, np.asarray(position), c2, out_dtype), moved, axis, xp_of(block))


# --- resampling into periods ------------------------------------------------------------------------


def _binned(op, x: xr.DataArray, red: agg.Aggregation, freq: str, dim: str, out_dtype, attrs) -> xr.DataArray:
    data, eager = _as_dask(x)
    axis = _axis(x, dim)
    bins, labels = _bins(x, freq, dim)
    kernel = op.kernel(red.chunk, backend_of(data))
    out = agg.binned_reduce(data, red, bins, len(labels), axis, out_dtype, kernel=kernel)
    return _new_time_dim(x, out, axis, dim, labels.values, eager, attrs)


@register(kernels=("group_sum",))
def resample_mean(x: xr.DataArray, freq: str = "1D", dim: str = "time") -> xr.DataArray:
    """Mean over each period of a pandas frequency, NaN-skipping, as x.resample(time=freq).mean().

    ``dim`` is the dimension of dates to resample (``"time"``). Periods with no valid value are
    NaN. Periods may span chunks: each output chunk merges the partials of the input chunks its
    periods cover.
    """
    return _binned(resample_mean.op, x, agg.GROUP_MEAN, freq, dim, float_dtype(x.dtype), dict(x.attrs))


@register(kernels=("group_sum",))
def count_above(x: xr.DataArray, threshold: float | str, freq: str = "YS", dim: str = "time") -> xr.DataArray:
    """Number of steps with x > threshold in each period, as xclim's tx_days_above.

    Same as ``(x > threshold).resample(time=freq).sum()``: missing values count as not above.
    ``threshold`` is in the data's units, or a temperature with units such as ``"25 degC"``;
    ``dim`` is the dimension of dates (``"time"``).
    """
    thr = threshold_in_units_of(x, threshold)
    return _binned(count_above.op, x, agg.count_above(thr), freq, dim, np.dtype(np.int64), {"units": "1", "threshold": thr})


@register(kernels=("group_spells", "group_runs"))
def max_spell_length(
    x: xr.DataArray, threshold: float | str, freq: str = "YS", resample_before_rl: bool = False, dim: str = "time"
) -> xr.DataArray:
    """Longest run of consecutive steps with x > threshold in each period, as xclim's run_length.longest_run.

    By default a run counts, with its whole length, for the period in which it begins, even when
    it goes on into the next periods: xclim's ``run_length.longest_run(x > threshold, freq=...)``.
    With ``resample_before_rl=True`` runs are cut at period bounds and each period counts only
    its own steps, as xclim's indicators such as ``hot_spell_max_length`` do by default.

    A run-length scan per grid point (one CUDA thread each); runs that cross chunk boundaries are
    joined by merging each chunk's run-length state. ``dim`` is the dimension of dates (``"time"``).
    The kernel is ``group_spells``, or ``group_runs`` with ``resample_before_rl``.
    """
    thr = threshold_in_units_of(x, threshold)
    red = agg.longest_spell(thr, cut_at_bins=resample_before_rl)
    return _binned(max_spell_length.op, x, red, freq, dim, np.dtype(np.int64), {"units": "1", "threshold": thr})
