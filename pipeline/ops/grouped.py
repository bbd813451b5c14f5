"""Ops by group along a dimension of dates: climatologies, anomalies, resampling into periods,
counts and spells.

Groups come from the dates of the dimension ``dim`` (``"time"`` by default) on the host
(``time.month``, ``time.dayofyear``, ``time.season``, or the bins of a pandas frequency such as
``"1D"``, ``"MS"``, ``"YS"``, as xarray bins them on every calendar, cftime's included); the data
never leave their backend. Each block is reduced over all its groups by one
kernel (:mod:`pipeline.kernels.groups`) and the partials are merged across blocks and workers
(:func:`pipeline.reduce.aggregation.group_reduce` and ``binned_reduce``).

As in xarray, groups by month or day of year take the dates in any order and leave a missing date
(NaT) out of every group, while resampling into periods refuses dates out of order or missing.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import xarray as xr
from pydantic import StrictBool

from ..backend import backend_of, meta, xp_of
from ..deferred import module as _deferred
from ..exec import spill
from ..kernels.launch import from_2d, to_2d
from ..reduce import aggregation as agg
from ._common import _as_dask, _axis_of, _check, _finish, float_dtype
from .metadata import Produces, group_name, input_name as _name, is_daily, on_daily, period, steps_units
from .params import Dim, Frequency, Threshold
from .registry import register
from .shapes import group_labels, group_values, meta_of, resample_bins, threshold_in_units_of

da = _deferred("dask.array")  # imported when the first graph is built

Freq = Literal["month", "dayofyear", "season"]


def _bins(x: xr.DataArray, freq: str, dim: str) -> tuple[np.ndarray, pd.Index]:
    """Bin number of every step and the label of every bin (empty bins included), as xarray's
    ``resample({dim: freq})`` makes them, on any calendar (the op's checks have found dates)."""
    return resample_bins(meta_of(x), freq, dim)


# --- thresholds with units --------------------------------------------------------------------------


def _threshold_text(x: xr.DataArray, threshold: float | str) -> str:
    """The threshold as given, with the data's units where it was given as a number."""
    if isinstance(threshold, str):
        return threshold.strip()
    units = x.attrs.get("units")
    return f"{threshold:g} {units}" if units else f"{threshold:g}"


def _threshold_attrs(x: xr.DataArray, p: dict) -> dict:
    """The threshold in the data's units, as a number, for readers of the result."""
    return {"threshold": threshold_in_units_of(x, p["threshold"])}


def _steps(x: xr.DataArray, p: dict) -> str:
    return "days" if is_daily(x, p["dim"]) else "time steps"


def _new_time_dim(x, data, axis, name, labels, eager):
    """``data`` with the dimension of ``axis`` replaced by ``name``, labelled ``labels``."""
    dims = list(x.dims)
    old = dims[axis]
    dims[axis] = name
    coords = {k: v for k, v in x.coords.items() if old not in v.dims}
    # resampled dates keep their coordinate's attributes, as xarray's resample keeps them
    coords[name] = (name, labels, x[old].attrs) if name == old else labels
    return _finish(x, data, eager, dims=dims, coords=coords, name=x.name)


# --- climatology and anomalies ----------------------------------------------------------------------


def _climatology_data(op, x: xr.DataArray, freq: str, dim: str, missing_row: bool = False):
    """The climatology of ``x``, a row per group; steps without a date (NaT, label -1) are in no
    group, as in xarray's groupby. ``missing_row``: one more row, NaN, for those steps."""
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(op, x, freq=freq, dim=dim)
    axis = x.get_axis_num(dim)
    labels = group_labels(x.indexes[dim], freq)
    groups = np.unique(labels[labels >= 0])
    if missing_row and (labels < 0).any():  # a group no step has: its mean is NaN
        groups = np.append(groups, groups[-1] + 1)
    kernel = op.kernel(agg.GROUP_MEAN.chunk, backend_of(data))
    clim = agg.group_reduce(data, agg.GROUP_MEAN, labels, axis, np.float64, kernel=kernel, groups=groups)
    return data, eager, axis, labels, groups, clim


@register(
    kernels=("group_sum",),
    produces=Produces(
        lambda x, p: f"{group_name(p['freq'])} climatology of {_name(x)}",
        cell_methods="{dim}: mean within years {dim}: mean over years",
    ),
)
def climatology(x: xr.DataArray, freq: Freq = "month", dim: Dim = "time") -> xr.DataArray:
    """Mean for each month, day of year or season over all years, NaN-skipping, as x.groupby(f"time.{freq}").mean().

    ``dim`` is the dimension of dates to group (``"time"``); it becomes a dimension named ``freq``.
    Seasons are xarray's (DJF, MAM, JJA, SON), in the order of its groupby: DJF, JJA, MAM, SON.
    Each chunk is reduced over all the groups it holds by one kernel; partial sums and counts
    merge across chunks and GPUs as a tree.
    """
    data, eager, axis, labels, groups, clim = _climatology_data(climatology.op, x, freq, dim)
    out_dtype = float_dtype(x.dtype)
    return _new_time_dim(x, clim.astype(out_dtype), axis, freq, group_values(freq, groups), eager)


@register(
    kernels=("group_sum", "subtract_groups"),
    produces=Produces(
        lambda x, p: f"anomaly of {_name(x)} from its {group_name(p['freq'])} climatology", standard_name=None
    ),
)
def anomaly(x: xr.DataArray, freq: Freq = "month", dim: Dim = "time") -> xr.DataArray:
    """Departure from the climatology of each step's month, day of year or season, as x.groupby(...) - climatology.

    ``dim`` is the dimension of dates to group (``"time"``). A step without a date (NaT) is in no
    group: its anomaly is NaN, as xarray's groupby arithmetic gives.
    """
    data, eager, axis, labels, groups, clim = _climatology_data(anomaly.op, x, freq, dim, missing_row=True)
    position = np.where(labels >= 0, np.searchsorted(groups, labels), len(groups) - 1)
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
    return _finish(x, out, eager)


def _subtract_block(block, position, clim, kernel, axis, out_dtype):
    x2, moved = to_2d(block, axis, xp_of(block))
    c2, _ = to_2d(clim, axis, xp_of(clim))
    return from_2d(kernel(x2, np.asarray(position), c2, out_dtype), moved, axis, xp_of(block))


# --- resampling into periods ------------------------------------------------------------------------


def _binned(op, x: xr.DataArray, red: agg.Aggregation, freq: str, dim: str, out_dtype) -> xr.DataArray:
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(op, x, freq=freq, dim=dim)
    axis = x.get_axis_num(dim)
    bins, labels = _bins(x, freq, dim)
    kernel = op.kernel(red.chunk, backend_of(data))
    out = agg.binned_reduce(data, red, bins, len(labels), axis, out_dtype, kernel=kernel)
    return _new_time_dim(x, out, axis, dim, labels.values, eager)


@register(
    kernels=("group_sum",),
    produces=Produces(lambda x, p: f"{period(p['freq'])} mean of {_name(x)}", cell_methods="{dim}: mean"),
)
def resample_mean(x: xr.DataArray, freq: Frequency = "1D", dim: Dim = "time") -> xr.DataArray:
    """Mean over each period of a pandas frequency, NaN-skipping, as x.resample(time=freq).mean().

    ``dim`` is the dimension of dates to resample (``"time"``). Periods with no valid value are
    NaN. Periods may span chunks: each output chunk merges the partials of the input chunks its
    periods cover.
    """
    return _binned(resample_mean.op, x, agg.GROUP_MEAN, freq, dim, float_dtype(x.dtype))


@register(
    kernels=("group_sum",),
    produces=Produces(
        lambda x, p: f"{period(p['freq'])} number of {_steps(x, p)} with {_name(x)} above {_threshold_text(x, p['threshold'])}",
        units=steps_units(),
        cell_methods=lambda x, p: f"{p['dim']}: sum over days" if is_daily(x, p["dim"]) else f"{p['dim']}: sum",
        standard_name=on_daily({"air_temperature": "number_of_days_with_air_temperature_above_threshold"}),
        extra=_threshold_attrs,
    ),
)
def count_above(x: xr.DataArray, threshold: Threshold, freq: Frequency = "YS", dim: Dim = "time") -> xr.DataArray:
    """Number of steps with x > threshold in each period, as xclim's tx_days_above.

    Same as ``(x > threshold).resample(time=freq).sum()``: missing values count as not above.
    ``threshold`` is in the data's units, or a temperature with units such as ``"25 degC"``;
    ``dim`` is the dimension of dates (``"time"``).
    """
    thr = threshold_in_units_of(x, threshold)
    return _binned(count_above.op, x, agg.count_above(thr), freq, dim, np.dtype(np.int64))


@register(
    kernels=("group_spells", "group_runs"),
    produces=Produces(
        lambda x, p: f"{period(p['freq'])} longest run of consecutive {_steps(x, p)} with {_name(x)} above "
        f"{_threshold_text(x, p['threshold'])}",
        units=steps_units(),
        cell_methods=lambda x, p: f"{p['dim']}: maximum over days" if is_daily(x, p["dim"]) else f"{p['dim']}: maximum",
        standard_name=on_daily({"air_temperature": "spell_length_of_days_with_air_temperature_above_threshold"}),
        extra=_threshold_attrs,
    ),
)
def max_spell_length(
    x: xr.DataArray,
    threshold: Threshold,
    freq: Frequency = "YS",
    resample_before_rl: StrictBool = False,
    dim: Dim = "time",
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
    return _binned(max_spell_length.op, x, red, freq, dim, np.dtype(np.int64))
