"""xarray's own computation API on pipeline's arrays, on both backends, against xarray on NumPy.

Every expression of tests/xarray_expressions.py runs on ``pipeline.open_dataset``'s arrays of a
store written by ``xarray.to_zarr``: NaNs, chunks that divide no axis (groups, windows and bins
across chunk boundaries), on the standard calendar and on cftime's ``noleap`` and ``360_day``.
"""

from __future__ import annotations

import importlib.util
import warnings

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline import backend as B

from .xarray_expressions import EXPRESSIONS, context

CALENDARS = ("standard", "noleap", "360_day")
CHUNKS = {"time": 37, "lat": 5, "lon": 4}


# where the calendar matters: dates grouped, binned, fitted or found (every expression runs on
# the standard calendar)
ON_CFTIME = (
    "groupby_month_mean", "groupby_month_first", "groupby_month_quantile", "groupby_season_std",
    "groupby_dayofyear_max", "groupby_anomaly", "resample_YS_max", "resample_MS_mean", "resample_MS_last",
    "resample_MS_median", "resample_QSDEC_quantile", "polyfit", "idxmin_time", "rolling_mean_center", "ffill",
    "coarsen_time_trim", "interpolate_na_max_gap", "interpolate_na_nearest_limit_max_gap", "rolling_exp_mean",
)
CASES = [("standard", n) for n in sorted(EXPRESSIONS)] + [(c, n) for c in CALENDARS[1:] for n in ON_CFTIME]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    made = {}

    def store(calendar):
        if calendar not in made:
            made[calendar] = _write(calendar, tmp_path_factory)
        return calendar, made[calendar]

    return store


@pytest.fixture(scope="module", params=CALENDARS)
def store(request, stores):
    return stores(request.param)


def _write(calendar, tmp_path_factory):
    n, ny, nx = 800, 9, 11  # two years and more, so that years and seasons cross chunks
    if calendar == "standard":
        time = pd.date_range("2001-01-01", periods=n, freq="D")
    else:
        time = xr.date_range("2001-01-01", periods=n, freq="D", calendar=calendar, use_cftime=True)
    rng = np.random.default_rng(7)
    seasonal = 10 * np.sin(2 * np.pi * np.arange(n) / 365.0)[:, None, None]
    tas = (285 + seasonal + 4 * rng.standard_normal((n, ny, nx))).astype("float32")
    tas[rng.random(tas.shape) < 0.03] = np.nan
    tas[:, 3, 4] = np.nan  # a cell with no value at all
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), tas, {"units": "K", "standard_name": "air_temperature"})},
        coords={"time": time, "lat": np.linspace(-80, 80, ny), "lon": np.arange(nx) * 30.0},
    )
    path = tmp_path_factory.mktemp(f"xr-{calendar}") / "tas.zarr"
    ds.chunk(CHUNKS).to_zarr(path)
    return path


def _reference(path, options):
    ds = xr.open_zarr(path)
    return ds if options.get("reference") == "dask" else ds.load()


def _host(values):
    return values.get() if B.is_cupy(values) else np.asarray(values)


def _compare(got: xr.DataArray, ref: xr.DataArray):
    assert got.dims == ref.dims and got.shape == ref.shape
    for name, coord in ref.coords.items():
        np.testing.assert_array_equal(_host(got.coords[name].values), np.asarray(coord.values))
    a, b = _host(got.data), np.asarray(ref.values)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    if b.dtype.kind in "fc":
        # float32 sums in another order: a few units in the last place (3e-5) of inputs near 300 K
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=3e-4, equal_nan=True)
    elif b.dtype.kind == "O":  # cftime dates, NaN where a cell has no value
        assert (pd.isnull(a) == pd.isnull(b)).all() and (a[~pd.isnull(b)] == b[~pd.isnull(b)]).all()
    else:
        np.testing.assert_array_equal(a, b)


def _skip_without_what_it_needs(options):
    for module in options.get("needs", ()):
        pytest.importorskip(module)


def _run(expr, x, ctx):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices, as on NumPy
        return expr(x, ctx)


@pytest.mark.parametrize("calendar, name", CASES)
def test_expression_on_the_cpu_is_xarrays(stores, calendar, name):
    calendar, path = stores(calendar)
    expr, options = EXPRESSIONS[name]
    _skip_without_what_it_needs(options)
    x = pipeline.open_dataset(path, backend="cpu", chunks=CHUNKS)["tas"]
    got = _run(expr, x, context(x))
    assert got.chunks is not None  # lazy: a Dask array
    ref_x = _reference(path, options)["tas"]
    ref = _run(expr, ref_x, context(ref_x))
    _compare(got.compute(), ref.compute())


def test_the_table_covers_what_the_issue_asks():
    assert len(EXPRESSIONS) >= 40
    for how in ("mean", "sum", "min", "max", "std", "var", "median", "count", "prod", "any", "all", "first", "last",
                "quantile"):
        assert f"groupby_month_{how}" in EXPRESSIONS
        assert any(n.startswith("resample_") and n.endswith(f"_{how}") for n in EXPRESSIONS), how


def test_building_a_graph_computes_nothing(store):
    """Every expression only builds its graph: no task runs until the result is asked for."""
    calendar, path = store
    x = pipeline.open_dataset(path, backend="cpu", chunks=CHUNKS)["tas"]
    ctx = context(x)
    ran = []

    class Count(dask.callbacks.Callback):
        def _pretask(self, key, dsk, state):
            ran.append(key)

    with Count():
        for name, (expr, options) in EXPRESSIONS.items():
            if name == "polyval":  # xarray computes polyfit's coefficients' degree coordinate
                continue
            if not all(importlib.util.find_spec(m) for m in options.get("needs", ())):
                continue
            _run(expr, x, ctx)
    assert ran == []


# --- on the GPU ---------------------------------------------------------------------------------

GPU_RUNS = [(c, n) for c, n in CASES if EXPRESSIONS[n][1].get("gpu") is None]
GPU_GAPS = sorted(n for n, (_, o) in EXPRESSIONS.items() if o.get("gpu") is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("calendar, name", GPU_RUNS)
def test_expression_on_the_gpu_is_xarrays_and_stays_there(stores, calendar, name):
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    calendar, path = stores(calendar)
    expr, options = EXPRESSIONS[name]
    _skip_without_what_it_needs(options)  # for the reference (the GPU's path needs none)
    x = pipeline.open_dataset(path, backend="gpu", chunks=CHUNKS)["tas"]
    got = _run(expr, x, context(x))
    assert got.chunks is not None
    if got.dtype.kind not in "MO":  # what a later step sees: its blocks are CuPy's
        assert isinstance(got.data._meta, cupy.ndarray), type(got.data._meta)
    got = got.compute()
    if got.dtype.kind not in "MO":  # dates (idxmin over time) have no device type
        assert isinstance(got.data, cupy.ndarray), type(got.data)  # as xarray's test_check_data_stays_on_gpu
    ref_x = _reference(path, options)["tas"]
    _compare(got, _run(expr, ref_x, context(ref_x)).compute())


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_GAPS)
def test_what_does_not_run_on_the_gpu_fails_and_never_computes_on_the_host(stores, name):
    if not B.gpu_available():
        pytest.skip("no GPU")
    calendar, path = stores("standard")
    expr, _ = EXPRESSIONS[name]
    x = pipeline.open_dataset(path, backend="gpu", chunks=CHUNKS)["tas"]
    with pytest.raises(NotImplementedError, match="not available on the GPU backend"):
        _run(expr, x, context(x)).compute()
