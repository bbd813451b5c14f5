"""Every climate op on the calendars of climate-model output (cftime's noleap, 360_day, all_leap,
julian, proleptic_gregorian, and the standard one), against xarray on NumPy in float64: from a
store written by ``xarray.to_zarr`` with cftime dates and opened by ``pipeline.open_dataset``, and
in memory; with NaNs and chunks that divide no axis. ``pipeline validate`` takes and refuses the
same frequencies as the ops."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import assert_close, on_backend
from .test_trust_climate import assert_refused, cli, write_flow

CALENDARS = ["standard", "noleap", "360_day", "all_leap", "julian", "proleptic_gregorian"]
CHUNKS = {"time": 37, "lat": 2}  # divide neither axis


def tas(calendar: str, nt: int = 430, seed: int = 0) -> xr.DataArray:
    """Daily (time, lat, lon) data from December 1999 on ``calendar`` (cftime dates), around 283 K
    with a season, a trend, NaNs, an always-missing point and a point always above 283 K."""
    rng = np.random.default_rng(seed)
    time = xr.date_range("1999-12-01", periods=nt, freq="D", calendar=calendar, use_cftime=True)
    t = np.arange(nt)[:, None, None]
    x = 283 + 8 * np.sin(2 * np.pi * t / 360) + 0.01 * t + rng.standard_normal((nt, 3, 4)) * 2
    x[rng.random(x.shape) < 0.1] = np.nan
    x[:, 0, 0] = np.nan
    x[:, 1, 1] = 400.0
    return xr.DataArray(
        x, dims=("time", "lat", "lon"), name="tas", attrs={"units": "K"},
        coords={"time": time, "lat": ("lat", [-30.0, 0.0, 30.0], {"units": "degrees_north"}),
                "lon": ("lon", [0.0, 90.0, 180.0, 270.0], {"units": "degrees_east"})},
    )


def _longest_run(x, freq):
    run_length = pytest.importorskip("xclim.indices.run_length")
    return run_length.longest_run(x > 283.0, freq=freq)


def _detrended(r):
    return r - xr.polyval(r.time, r.polyfit("time", 1).polyfit_coefficients)


# each op with its parameters and xarray's (or xclim's) answer on NumPy in float64
OPS = {
    "climatology-month": ("climatology", {}, lambda r: r.groupby("time.month").mean()),
    "climatology-dayofyear": ("climatology", {"freq": "dayofyear"}, lambda r: r.groupby("time.dayofyear").mean()),
    "climatology-season": ("climatology", {"freq": "season"}, lambda r: r.groupby("time.season").mean()),
    "anomaly-month": ("anomaly", {}, lambda r: r.groupby("time.month") - r.groupby("time.month").mean()),
    "anomaly-season": ("anomaly", {"freq": "season"}, lambda r: r.groupby("time.season") - r.groupby("time.season").mean()),
    "resample_mean-MS": ("resample_mean", {"freq": "MS"}, lambda r: r.resample(time="MS").mean()),
    "resample_mean-ME": ("resample_mean", {"freq": "ME"}, lambda r: r.resample(time="ME").mean()),
    "resample_mean-QS-DEC": ("resample_mean", {"freq": "QS-DEC"}, lambda r: r.resample(time="QS-DEC").mean()),
    "resample_mean-7D": ("resample_mean", {"freq": "7D"}, lambda r: r.resample(time="7D").mean()),
    "count_above-MS": ("count_above", {"threshold": 283.0, "freq": "MS"}, lambda r: (r > 283.0).resample(time="MS").sum()),
    "count_above-YS": ("count_above", {"threshold": "10 degC", "freq": "YS"}, lambda r: (r > 283.15).resample(time="YS").sum()),
    "max_spell_length-MS": ("max_spell_length", {"threshold": 283.0, "freq": "MS"}, lambda r: _longest_run(r, "MS")),
    "max_spell_length-cut": (
        "max_spell_length", {"threshold": 283.0, "freq": "MS", "resample_before_rl": True},
        lambda r: (r > 283.0).resample(time="MS").map(pytest.importorskip("xclim.indices.run_length").longest_run, dim="time"),
    ),
    "detrend": ("detrend", {}, _detrended),
    "standardized_anomaly": ("standardized_anomaly", {}, lambda r: (r - r.mean("time")) / r.std("time")),
    "rolling_mean": ("rolling_mean", {"window": 5, "center": True}, lambda r: r.rolling(time=5, center=True).mean()),
    "quantile": ("quantile", {"q": [0.1, 0.9]}, lambda r: r.quantile([0.1, 0.9], "time")),
    "weighted_mean": ("weighted_mean", {}, lambda r: r.weighted(np.cos(np.deg2rad(r.lat))).mean(("lat", "lon"))),
    "coarsen_mean": ("coarsen_mean", {"factors": {"time": 30}}, lambda r: r.coarsen(time=30, boundary="trim").mean()),
}


def test_every_climate_op_is_here():
    modules = ("pipeline.ops.climate", "pipeline.ops.grouped", "pipeline.ops.fields")
    climate = {o.name for o in pipeline.ops.all_ops() if o.func.__module__ in modules}
    assert {op for op, _, _ in OPS.values()} == climate - {"saturation_vapor_pressure"}  # it has no time axis


def _compare(got, expected, op):
    dims = got.dims
    expected = expected.transpose(*dims)
    for d in dims:
        if d in expected.coords and d in got.coords:
            np.testing.assert_array_equal(got[d].values, expected[d].values)
    if op in ("count_above", "max_spell_length"):
        np.testing.assert_array_equal(B.to_numpy(got.data), expected.values)
    else:
        assert_close(got, expected, atol=1e-9 * 400)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One store per calendar, written by xarray.to_zarr with cftime dates, and its xarray data."""
    root = tmp_path_factory.mktemp("calendars")
    out = {}
    for calendar in CALENDARS:
        path = root / f"{calendar}.zarr"
        tas(calendar).to_dataset().to_zarr(path, encoding={"tas": {"chunks": (37, 2, 4)}})
        out[calendar] = path
    return out


@pytest.mark.parametrize("case", sorted(OPS))
@pytest.mark.parametrize("calendar", CALENDARS)
def test_op_on_a_store_of_each_calendar_equals_xarray(stores, calendar, case):
    op, params, reference = OPS[case]
    x = pipeline.open_dataset(stores[calendar], backend="cpu")["tas"]
    expected_x = xr.open_zarr(stores[calendar])["tas"].load()  # xarray's own decoding of the same store
    assert type(x.indexes["time"]) is type(expected_x.indexes["time"])
    got = getattr(pipeline.ops, op)(x, **params)
    _compare(got.compute(), reference(expected_x), op)


@pytest.mark.parametrize("case", ["climatology-season", "anomaly-season", "resample_mean-MS", "count_above-MS",
                                  "max_spell_length-MS", "detrend"])
@pytest.mark.parametrize("calendar", ["noleap", "360_day"])
def test_op_in_memory_and_chunked_equals_xarray(backend, calendar, case):
    op, params, reference = OPS[case]
    x = tas(calendar, nt=200, seed=1)
    expected = reference(x)
    got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), backend), **params)
    assert B.backend_of(got) == backend
    _compare(got.compute(), expected, op)
    in_memory = getattr(pipeline.ops, op)(x, **params)  # an in-memory input gives an in-memory result
    assert not hasattr(in_memory.data, "dask")
    _compare(in_memory, expected, op)


def test_resampling_by_a_frequency_cftime_has_not_is_refused_naming_it():
    x = tas("noleap", nt=40).chunk(CHUNKS)
    with pytest.raises(ValueError):  # xarray refuses business days on cftime dates too
        x.resample(time="B").mean()
    with pytest.raises(InputError, match="freq 'B' is not a pandas frequency for dimension 'time' of 'tas' "
                                         r"\(dates of the noleap calendar\)"):
        pipeline.ops.resample_mean(x, freq="B")


def test_seasons_in_xarray_order_with_cf_attributes():
    x = tas("360_day", nt=400).chunk(CHUNKS)
    got = pipeline.ops.climatology(x, freq="season")
    assert list(got.season.values) == ["DJF", "JJA", "MAM", "SON"] == list(x.groupby("time.season").mean().season.values)
    assert got.dims == ("season", "lat", "lon")
    assert got.attrs["long_name"] == "seasonal climatology of tas"
    assert got.attrs["cell_methods"] == "time: mean within years time: mean over years"
    anomaly = pipeline.ops.anomaly(x, freq="season")
    assert anomaly.attrs["long_name"] == "anomaly of tas from its seasonal climatology"


def test_counts_on_daily_cftime_dates_are_days():
    x = tas("360_day", nt=60).chunk(CHUNKS).assign_attrs(standard_name="air_temperature")
    got = pipeline.ops.count_above(x, threshold=283.0, freq="MS")
    assert got.attrs["units"] == "days" and got.attrs["cell_methods"] == "time: sum over days"
    assert got.attrs["standard_name"] == "number_of_days_with_air_temperature_above_threshold"
    assert pipeline.ops.max_spell_length(x, threshold=283.0, freq="MS").attrs["long_name"] == (
        "monthly longest run of consecutive days with tas above 283 K")


def test_cli_validates_and_runs_cftime_flows(tmp_path):
    calendar = "360_day"
    tas(calendar, nt=100).to_dataset().to_zarr(tmp_path / "s.zarr", encoding={"tas": {"chunks": (37, 2, 4)}})
    flow = write_flow(tmp_path, "s.zarr", "count_above", {"threshold": "10 degC", "freq": "MS"})
    r = cli("validate", flow, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("run", flow, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "count_above.zarr")["count_above"].load()
    ref = xr.open_zarr(tmp_path / "s.zarr")["tas"].load()
    expected = (ref > 283.15).resample(time="MS").sum()
    assert got.time.values.tolist() == expected.time.values.tolist()
    np.testing.assert_array_equal(got.values, expected.values)

    seasons = write_flow(tmp_path, "s.zarr", "climatology", {"freq": "season"}, name="seasons")
    r = cli("run", seasons, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "seasons.zarr")["climatology"].load()
    assert_close(got, ref.groupby("time.season").mean(), atol=1e-9 * 400)

    bad = write_flow(tmp_path, "s.zarr", "resample_mean", {"freq": "B"}, name="bad")
    for command in ("validate", "run"):
        assert_refused(cli(command, bad, cwd=tmp_path), "bad.yaml", "freq 'B'", f"dates of the {calendar} calendar")
    assert not (tmp_path / "out" / "bad.zarr").exists()
