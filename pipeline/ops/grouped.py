"""Ops by group along time: climatologies, anomalies, resampling into periods, counts and spells.

Groups come from the time coordinate on the host (``time.month``, ``time.dayofyear``, or the bins
of a pandas frequency such as ``"1D"``, ``"MS"``, ``"YS"``); the data never leave their backend.
Each block is reduced over all its groups by one kernel (:mod:`pipeline.kernels.groups`) and the
partials are merged across blocks and workers (:mod:`pipeline.groupby`).
"""

from __future__ import annotations

import re
from typing import Literal

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from ..exec import spill
from ..reduce import groups as groupby
from ..backend import backend_of, meta
from ..errors import InputError
from .climate import _as_dask, _axis, _finish, float_dtype
from .registry import register

Freq = Literal["month", "dayofyear"]
GROUP_KERNELS = "pipeline.kernels.groups:group_sum"  # one function, CUDA or Numba-CPU by the block's type
SPELL_KERNELS = "pipeline.kernels.groups:group_spells"


def _time(x: xr.DataArray, dim: str = "time") -> xr.DataArray:
    _axis(x, dim)
    t = x[dim]
    if not (np.issubdtype(t.dtype, np.datetime64) or t.dtype == object):
        raise InputError(f"dimension {dim!r} of {x.name!r} must hold dates (datetime64 or cftime), got {t.dtype}")
    return t


def _group_labels(x: xr.DataArray, freq: str) -> np.ndarray:
    if freq not in ("month", "dayofyear"):
        raise InputError(f"freq must be 'month' or 'dayofyear', got {freq!r}")
    return np.asarray(getattr(_time(x).dt, freq).values, dtype=np.int64)


def _bins(x: xr.DataArray, freq: str) -> tuple[np.ndarray, pd.Index]:
    """Bin number of every step and the label of every bin (empty bins included), as xarray's
    ``resample(time=freq)`` makes them."""
    t = _time(x)
    try:
        index = t.to_index()
        grouped = pd.Series(np.arange(index.size), index=index).groupby(pd.Grouper(freq=freq))
        return grouped.ngroup().to_numpy(np.int64), grouped.size().index
    except (ValueError, TypeError) as e:
        raise InputError(f"freq {freq!r} is not a pandas frequency for the time axis of {x.name!r}: {e}") from None


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
    dims = list(x.dims)
    dims[axis] = name
    coords = {k: v for k, v in x.coords.items() if "time" not in v.dims}
    coords[name] = labels
    return _finish(x, data, eager, dims=dims, coords=coords, name=x.name, attrs=attrs)


# --- climatology and anomalies ----------------------------------------------------------------------


def _climatology_data(x: xr.DataArray, freq: str):
    data, eager = _as_dask(x)
    axis = _axis(x, "time")
    labels = _group_labels(x, freq)
    clim = groupby.tree_reduce(data, groupby.MEAN, labels, axis, np.float64)
    return data, eager, axis, labels, clim


@register(kernels=GROUP_KERNELS)
def climatology(x: xr.DataArray, freq: Freq = "month") -> xr.DataArray:
    """Mean for each month or day of year over all years, NaN-skipping, as x.groupby(f"time.{freq}").mean().

    Each chunk is reduced over all the groups it holds by one kernel; partial sums and counts
    merge across chunks and GPUs as a tree.
    """
    data, eager, axis, labels, clim = _climatology_data(x, freq)
    out_dtype = float_dtype(x.dtype)
    return _new_time_dim(x, clim.astype(out_dtype), axis, freq, np.unique(labels), eager, dict(x.attrs))


@register(kernels={"cpu": "pipeline.kernels.groups:subtract_groups_cpu", "gpu": "pipeline.kernels.groups:subtract_groups_gpu"})
def anomaly(x: xr.DataArray, freq: Freq = "month") -> xr.DataArray:
    """Departure from the climatology of each step's month or day of year, as x.groupby(...) - climatology."""
    data, eager, axis, labels, clim = _climatology_data(x, freq)
    position = np.searchsorted(np.unique(labels), labels)
    out_dtype = float_dtype(x.dtype)
    backend = backend_of(data)
    kernel = anomaly.op.kernel(backend)
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
    x2, rest = groupby._to_2d(block, axis)
    c2, _ = groupby._to_2d(clim, axis)
    return groupby._from_2d(kernel(x2, np.asarray(position), c2, out_dtype), rest, axis)


# --- resampling into periods ------------------------------------------------------------------------


def _binned(x: xr.DataArray, red, freq: str, out_dtype, attrs) -> xr.DataArray:
    data, eager = _as_dask(x)
    axis = _axis(x, "time")
    bins, labels = _bins(x, freq)
    out = groupby.binned_reduce(data, red, bins, len(labels), axis, out_dtype)
    return _new_time_dim(x, out, axis, "time", labels.values, eager, attrs)


@register(kernels=GROUP_KERNELS)
def resample_mean(x: xr.DataArray, freq: str = "1D") -> xr.DataArray:
    """Mean over each period of a pandas frequency, NaN-skipping, as x.resample(time=freq).mean().

    Periods with no valid value are NaN. Periods may span chunks: each output chunk merges the
    partials of the input chunks its periods cover.
    """
    return _binned(x, groupby.MEAN, freq, float_dtype(x.dtype), dict(x.attrs))


@register(kernels=GROUP_KERNELS)
def count_above(x: xr.DataArray, threshold: float | str, freq: str = "YS") -> xr.DataArray:
    """Number of steps with x > threshold in each period, as xclim's tx_days_above.

    Same as ``(x > threshold).resample(time=freq).sum()``: missing values count as not above.
    ``threshold`` is in the data's units, or a temperature with units such as ``"25 degC"``.
    """
    thr = threshold_in_units_of(x, threshold)
    return _binned(x, groupby.count_above(thr), freq, np.dtype(np.int64), {"units": "1", "threshold": thr})


@register(kernels=SPELL_KERNELS)
def max_spell_length(
    x: xr.DataArray, threshold: float | str, freq: str = "YS", resample_before_rl: bool = False
) -> xr.DataArray:
    """Longest run of consecutive steps with x > threshold in each period, as xclim's run_length.longest_run.

    By default a run counts, with its whole length, for the period in which it begins, even when
    it goes on into the next periods: xclim's ``run_length.longest_run(x > threshold, freq=...)``.
    With ``resample_before_rl=True`` runs are cut at period bounds and each period counts only
    its own steps, as xclim's indicators such as ``hot_spell_max_length`` do by default.

    A run-length scan per grid point (one CUDA thread each); runs that cross chunk boundaries are
    joined by merging each chunk's run-length state.
    """
    thr = threshold_in_units_of(x, threshold)
    red = groupby.longest_spell(thr, cut_at_bins=resample_before_rl)
    return _binned(x, red, freq, np.dtype(np.int64), {"units": "1", "threshold": thr})
