"""The everyday xarray expressions an analyst writes on ``tas`` (time x lat x lon), as one table:
tests/test_xarray_api.py runs each on pipeline's arrays on both backends against xarray on NumPy,
and benchmarks/xarray_gpu.py times each against xarray + dask on the CPU.

Each entry: name -> (function of the DataArray and a context, options). The context gives what
an expression needs besides the array (``labels``: a labels DataArray along time; ``weights``:
cos(latitude) as a DataArray of NumPy values, as an analyst makes them). Options:

- ``reference="dask"``: the reference is xarray on a Dask array of NumPy blocks of the same
  chunks, not on NumPy: dask's ``gradient`` treats NaN at chunk edges differently from NumPy's
  (both are xarray's results);
- ``gpu``: None where the expression runs on the GPU; else why it does not (the test then asserts
  that it is refused by name, and never returns a result computed on the host);
- ``needs``: modules xarray needs for it on NumPy (the reference), whose absence skips its tests
  (rolling_exp: numbagg, which pipeline's GPU path does without).
"""

from __future__ import annotations

import datetime

import numpy as np
import xarray as xr
from xarray.computation.rolling_exp import RollingExp


def _month(x, ctx):
    return x.groupby("time.month")


def _ms(x, ctx):
    return x.resample(time="MS")


def _warm(x):
    return x > 285.0


def _w(x, ctx):
    return x.weighted(ctx["weights"])


def _whole_time(x):
    """``x`` in one chunk along time, as interpolate_na and rolling_exp ask along it."""
    return x.chunk(time=-1)


_2_DAYS = datetime.timedelta(days=2)  # a lone NaN's gap, from the day before to the day after
_NUMBAGG = {"needs": ("numbagg",)}



EXPRESSIONS: dict = {
    # groupby over months: every reduction xarray offers
    "groupby_month_mean": (lambda x, c: _month(x, c).mean(), {}),
    "groupby_month_sum": (lambda x, c: _month(x, c).sum(), {}),
    "groupby_month_min": (lambda x, c: _month(x, c).min(), {}),
    "groupby_month_max": (lambda x, c: _month(x, c).max(), {}),
    "groupby_month_std": (lambda x, c: _month(x, c).std(), {}),
    "groupby_month_var": (lambda x, c: _month(x, c).var(ddof=1), {}),
    "groupby_month_median": (lambda x, c: _month(x, c).median(), {}),
    "groupby_month_count": (lambda x, c: _month(x, c).count(), {}),
    "groupby_month_prod": (lambda x, c: (x / 285.0).groupby("time.month").prod(), {}),
    "groupby_month_any": (lambda x, c: _warm(x).groupby("time.month").any(), {}),
    "groupby_month_all": (lambda x, c: _warm(x).groupby("time.month").all(), {}),
    "groupby_month_first": (lambda x, c: _month(x, c).first(), {}),
    "groupby_month_last": (lambda x, c: _month(x, c).last(), {}),
    "groupby_month_quantile": (lambda x, c: _month(x, c).quantile(0.9), {}),
    # other groupers, and groupby arithmetic
    "groupby_season_std": (lambda x, c: x.groupby("time.season").std(), {}),
    "groupby_dayofyear_max": (lambda x, c: x.groupby("time.dayofyear").max(), {}),
    "groupby_labels_sum": (lambda x, c: x.groupby(c["labels"]).sum(), {}),
    "groupby_bins_lat_mean": (lambda x, c: x.groupby_bins("lat", [-90, -30, 0, 30, 90]).mean(), {}),
    "groupby_anomaly": (lambda x, c: _month(x, c) - _month(x, c).mean(), {}),
    # resample
    "resample_YS_max": (lambda x, c: x.resample(time="YS").max(), {}),
    "resample_MS_mean": (lambda x, c: _ms(x, c).mean(), {}),
    "resample_MS_sum": (lambda x, c: _ms(x, c).sum(), {}),
    "resample_MS_min": (lambda x, c: _ms(x, c).min(), {}),
    "resample_MS_std": (lambda x, c: _ms(x, c).std(), {}),
    "resample_MS_var": (lambda x, c: _ms(x, c).var(), {}),
    "resample_MS_median": (lambda x, c: _ms(x, c).median(), {}),
    "resample_MS_count": (lambda x, c: _ms(x, c).count(), {}),
    "resample_MS_prod": (lambda x, c: (x / 285.0).resample(time="MS").prod(), {}),
    "resample_MS_any": (lambda x, c: _warm(x).resample(time="MS").any(), {}),
    "resample_MS_all": (lambda x, c: _warm(x).resample(time="MS").all(), {}),
    "resample_MS_first": (lambda x, c: _ms(x, c).first(), {}),
    "resample_MS_last": (lambda x, c: _ms(x, c).last(), {}),
    "resample_QSDEC_quantile": (lambda x, c: x.resample(time="QS-DEC").quantile([0.1, 0.9]), {}),
    # rolling windows and coarsening
    "rolling_mean_center": (lambda x, c: x.rolling(time=5, center=True).mean(), {}),
    "rolling_sum": (lambda x, c: x.rolling(time=4).sum(), {}),
    "rolling_min_periods": (lambda x, c: x.rolling(time=5, min_periods=2).min(), {}),
    "rolling_max": (lambda x, c: x.rolling(time=7, center=True).max(), {}),
    "rolling_std": (lambda x, c: x.rolling(time=5).std(), {}),
    "rolling_var": (lambda x, c: x.rolling(time=5, min_periods=3).var(), {}),
    "rolling_median": (lambda x, c: x.rolling(time=5).median(), {}),
    "rolling_count": (lambda x, c: x.rolling(time=5).count(), {}),
    "rolling_construct_mean": (lambda x, c: x.rolling(time=3).construct("window").mean("window"), {}),
    "coarsen_mean": (lambda x, c: x.coarsen(lat=2, lon=3, boundary="trim").mean(), {}),
    "coarsen_max_pad": (lambda x, c: x.coarsen(lat=2, boundary="pad").max(), {}),
    "coarsen_time_trim": (lambda x, c: x.coarsen(time=7, boundary="trim").min(), {}),
    # weighted
    "weighted_mean": (lambda x, c: _w(x, c).mean(("lat", "lon")), {}),
    "weighted_sum": (lambda x, c: _w(x, c).sum("lat"), {}),
    "weighted_std": (lambda x, c: _w(x, c).std(("lat", "lon")), {}),
    "weighted_var": (lambda x, c: _w(x, c).var("lat"), {}),
    "weighted_quantile": (
        lambda x, c: x.chunk(lat=-1).weighted(c["weights"]).quantile(0.5, dim="lat"), {}
    ),
    # quantiles, fits, positions
    "quantile": (lambda x, c: x.quantile(0.9, "time"), {}),
    "quantile_nearest": (lambda x, c: x.quantile([0.1, 0.9], "time", method="nearest"), {}),
    "quantile_midpoint_lat": (lambda x, c: x.quantile(0.5, "lat", method="midpoint"), {}),
    "quantile_hazen": (lambda x, c: x.quantile([0.05, 0.95], "time", method="hazen"), {}),
    "polyfit": (lambda x, c: x.polyfit("time", 1).polyfit_coefficients, {}),
    "polyval": (lambda x, c: xr.polyval(x.lat, x.polyfit("lat", 2).polyfit_coefficients), {}),
    "idxmax_lat": (lambda x, c: x.idxmax("lat"), {}),
    "idxmin_time": (lambda x, c: x.idxmin("time"), {}),
    "argmax": (lambda x, c: x.fillna(-1.0).argmax("time"), {}),
    "argmin": (lambda x, c: x.argmin("lat"), {}),
    # cumulative, filling, calculus
    "cumsum": (lambda x, c: x.cumsum("time"), {}),
    "cumprod": (lambda x, c: (x / 285.0).cumprod("lat"), {}),
    "ffill": (lambda x, c: x.ffill("time"), {}),
    "bfill_limit": (lambda x, c: x.bfill("time", limit=3), {}),
    "interpolate_na": (lambda x, c: x.chunk(lat=-1).interpolate_na("lat"), {}),
    "interpolate_na_limit": (lambda x, c: x.chunk(time=-1).interpolate_na("time", limit=2), {}),
    "interpolate_na_nearest": (lambda x, c: x.chunk(lat=-1).interpolate_na("lat", method="nearest"), {}),
    "interpolate_na_max_gap": (lambda x, c: _whole_time(x).interpolate_na("time", max_gap=_2_DAYS), {}),
    "interpolate_na_nearest_limit_max_gap": (
        lambda x, c: _whole_time(x).interpolate_na("time", method="nearest", limit=1, max_gap=_2_DAYS), {}
    ),
    "interpolate_na_max_gap_steps": (
        lambda x, c: x.chunk(lat=-1).interpolate_na("lat", use_coordinate=False, max_gap=2), {}
    ),
    "interpolate_na_cubic": (
        lambda x, c: x.chunk(lat=-1).interpolate_na("lat", method="cubic"),
        {"gpu": "interpolate_na by methods other than linear and nearest runs SciPy on each row"},
    ),
    # exponentially weighted windows: xarray's needs numbagg, pipeline's on the GPU does not
    "rolling_exp_mean": (lambda x, c: _whole_time(x).rolling_exp(time=10).mean(), _NUMBAGG),
    "rolling_exp_sum_alpha": (lambda x, c: _whole_time(x).rolling_exp(time=0.2, window_type="alpha").sum(), _NUMBAGG),
    "rolling_exp_std_halflife": (
        lambda x, c: _whole_time(x).rolling_exp(time=5, window_type="halflife").std(), _NUMBAGG
    ),
    "rolling_exp_com_min_weight": (
        lambda x, c: RollingExp(_whole_time(x), {"time": 3.0}, "com", min_weight=0.5).mean(), _NUMBAGG
    ),
    "rolling_exp_corr": (
        lambda x, c: _whole_time(x).rolling_exp(time=8).corr(_whole_time(x).shift(time=1)), _NUMBAGG
    ),
    "differentiate": (lambda x, c: x.differentiate("lat"), {"reference": "dask"}),
    "integrate": (lambda x, c: x.integrate("lat"), {}),
    # two arrays
    "corr": (lambda x, c: xr.corr(x, x.shift(time=1), "time"), {}),
    "cov": (lambda x, c: xr.cov(x, x.shift(time=1), "time"), {}),
    "dot": (lambda x, c: xr.dot(x.fillna(0), x.fillna(0), dim="time"), {}),
    "apply_ufunc": (
        lambda x, c: xr.apply_ufunc(
            lambda a: (a.__array_namespace__() if hasattr(a, "__array_namespace__") else np).sqrt(a),
            x, dask="parallelized", output_dtypes=[x.dtype],
        ),
        {},
    ),
    # what worked before
    "count_above": (lambda x, c: (x > 290).sum("time"), {}),
    "where_mean": (lambda x, c: x.where(x > 280).mean("time"), {}),
    "diff": (lambda x, c: x.diff("time"), {}),
    "std": (lambda x, c: x.std("time"), {}),
}


def context(x: xr.DataArray) -> dict:
    """What the expressions need besides ``x``: made on the host, as an analyst makes them."""
    n = x.sizes["time"]
    return {
        "labels": xr.DataArray(np.arange(n) % 7, dims="time", coords={"time": x["time"].values}, name="weekday"),
        "weights": np.cos(np.deg2rad(x["lat"])),
    }
