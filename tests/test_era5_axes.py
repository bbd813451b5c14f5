"""ERA5's axis names (``valid_time``, ``latitude`` from 90 down to -90, ``longitude`` 0..359.75),
found by their CF attributes as cf_xarray finds them, where the ops' defaults (``dim="time"``,
weighted_mean's ``dims=("lat", "lon")``) are absent: in Python, in ``pipeline validate`` and in a
flow run by the CLI, against xarray on NumPy naming the axes. Two dimensions for one axis, or
an explicit name that is absent, are refused (exit 2) naming them."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError
from pipeline.ops import axes

from .conftest import assert_close, on_backend
from .test_trust_climate import assert_refused, assert_refused_at_validate_and_run, cli, write_flow

AREA = ("latitude", "longitude")


def era5(nt: int = 120, seed: int = 0) -> xr.DataArray:
    """2 m temperature as ERA5's NetCDF files name and describe it (a coarse grid), float32, NaNs."""
    rng = np.random.default_rng(seed)
    latitude = np.linspace(90.0, -90.0, 7)
    longitude = np.linspace(0.0, 359.75, 8)
    t = np.arange(nt)[:, None, None]
    x = 283 + 10 * np.cos(np.deg2rad(latitude))[:, None] + 5 * np.sin(2 * np.pi * t / 90) + rng.standard_normal((nt, 7, 8))
    x[rng.random(x.shape) < 0.1] = np.nan
    return xr.DataArray(
        x.astype(np.float32), dims=("valid_time", "latitude", "longitude"), name="t2m",
        attrs={"units": "K", "long_name": "2 metre temperature", "standard_name": "unknown"},
        coords={
            "valid_time": ("valid_time", np.arange(np.datetime64("2020-01-01"), np.datetime64("2020-01-01") + nt),
                           {"standard_name": "time", "long_name": "time"}),
            "latitude": ("latitude", latitude, {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude",
                                                "stored_direction": "decreasing"}),
            "longitude": ("longitude", longitude, {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude"}),
        },
    )


def _area(r):
    return r.weighted(np.cos(np.deg2rad(r.latitude))).mean(AREA)


# each op with its default axes, and xarray's answer naming ERA5's
OPS = {
    "weighted_mean": ({}, _area),
    "resample_mean": ({"freq": "MS"}, lambda r: r.resample(valid_time="MS").mean()),
    "climatology": ({}, lambda r: r.groupby("valid_time.month").mean()),
    "anomaly": ({"freq": "season"}, lambda r: r.groupby("valid_time.season") - r.groupby("valid_time.season").mean()),
    "count_above": ({"threshold": 290.0, "freq": "MS"}, lambda r: (r > 290.0).resample(valid_time="MS").sum()),
    "standardized_anomaly": ({}, lambda r: (r - r.mean("valid_time")) / r.std("valid_time")),
    "rolling_mean": ({"window": 7}, lambda r: r.rolling(valid_time=7).mean()),
    "detrend": ({}, lambda r: r - xr.polyval(r.valid_time, r.polyfit("valid_time", 1).polyfit_coefficients)),
    "quantile": ({"q": 0.9}, lambda r: r.quantile(0.9, "valid_time")),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("era5") / "era5.zarr"
    era5().to_dataset().to_zarr(path, encoding={"t2m": {"chunks": (31, 4, 8)}})
    return path


@pytest.mark.parametrize("op", sorted(OPS))
def test_ops_with_default_axes_on_an_era5_store_equal_xarray(store, op):
    params, reference = OPS[op]
    x = pipeline.open_dataset(store, backend="cpu")["t2m"]
    got = getattr(pipeline.ops, op)(x, **params).compute()
    expected = reference(xr.open_zarr(store)["t2m"].load().astype(np.float64)).transpose(*got.dims)
    for d in got.dims:
        np.testing.assert_array_equal(got[d].values, expected[d].values)
    if op == "count_above":
        np.testing.assert_array_equal(got.values, expected.values)
    else:
        assert_close(got, expected, atol=5e-6 * 300)


@pytest.mark.parametrize("op", ["weighted_mean", "resample_mean", "anomaly", "detrend"])
def test_ops_with_default_axes_on_both_backends(backend, op):
    params, reference = OPS[op]
    x = era5(nt=70, seed=2)
    got = getattr(pipeline.ops, op)(on_backend(x.chunk({"valid_time": 31, "latitude": 4}), backend), **params)
    assert B.backend_of(got) == backend
    assert_close(got, reference(x.astype(np.float64)).transpose(*got.dims), atol=5e-6 * 300)


def test_results_name_the_axes_found():
    x = era5().chunk({"valid_time": 31})
    assert pipeline.ops.resample_mean(x, freq="MS").attrs["cell_methods"] == "valid_time: mean"
    assert pipeline.ops.weighted_mean(x).attrs["cell_methods"] == "area: mean"
    assert pipeline.ops.climatology(x).dims == ("month", "latitude", "longitude")


def test_axes_are_found_by_each_cf_criterion():
    x = era5(nt=10)
    assert axes.find(x, "time") == ["valid_time"]
    assert axes.find(x, "latitude") == ["latitude"]
    bare = x.drop_vars(["valid_time", "latitude", "longitude"]).rename(valid_time="t", latitude="y", longitude="x")
    assert axes.find(bare, "time") == [] and axes.find(bare, "latitude") == []
    for attrs in ({"axis": "T"}, {"standard_name": "time"}, {"units": "days since 2000-01-01"}):
        assert axes.resolve(bare.assign_coords(t=("t", np.arange(10), attrs)), "time") == "t"
    assert axes.resolve(bare.assign_coords(y=("y", np.arange(7.0), {"axis": "Y"})), "lat", "dims") == "y"
    assert axes.resolve(bare.assign_coords(x=("x", np.arange(8.0), {"units": "degree_E"})), "lon", "dims") == "x"
    assert axes.resolve(bare, "t") == "t"  # a name the variable has is used as is
    assert axes.resolve(bare, "z") == "z"  # an explicit name: left to the op's checks to refuse


def test_two_time_axes_are_refused_naming_both():
    x = era5(nt=10).expand_dims(step=2, axis=1).assign_coords(step=("step", [0, 6], {"axis": "T"}))
    with pytest.raises(InputError) as info:
        pipeline.ops.resample_mean(x.chunk(), freq="MS")
    message = str(info.value)
    assert "variable 't2m' has no dimension 'time', and 2 dimensions are its time axis" in message
    assert "'valid_time' (standard_name 'time', long_name 'time')" in message and "'step' (axis 'T')" in message
    assert "name the one to use with 'dim'" in message
    # named, it runs
    assert pipeline.ops.resample_mean(x.chunk(), freq="MS", dim="valid_time").dims == x.dims


def test_no_time_axis_is_refused_saying_what_was_looked_for():
    x = era5(nt=10).rename(valid_time="t").drop_vars("t")
    with pytest.raises(InputError, match="variable 't2m' has no dimension 'time' \\(its dimensions: t, latitude, "
                                         "longitude\\), and no dimension coordinate is its time axis"):
        pipeline.ops.climatology(x)
    with pytest.raises(InputError, match="variable 't2m' has no dimension 'lat' .* no dimension coordinate is its "
                                         "latitude axis .*name the dimension with 'dims'"):
        pipeline.ops.weighted_mean(era5(nt=10).rename(latitude="y").drop_vars("y"), weights=None)


def test_cli_validates_and_runs_an_era5_flow_with_default_axes(tmp_path):
    era5().to_dataset().to_zarr(tmp_path / "era5.zarr", encoding={"t2m": {"chunks": (31, 4, 8)}})
    flow = {"name": "monthly_area_mean", "source": {"path": "era5.zarr", "variable": "t2m"},
            "steps": [{"op": "resample_mean", "params": {"freq": "MS"}}, {"op": "rolling_mean", "params": {"window": 2}},
                      {"op": "weighted_mean"}],
            "sink": {"path": "out/monthly.zarr", "mode": "overwrite"}}
    path = tmp_path / "monthly.yaml"
    path.write_text(yaml.safe_dump(flow))
    r = cli("validate", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("run", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "monthly.zarr")
    (name,) = got.data_vars
    got = got[name].load()
    ref = xr.open_zarr(tmp_path / "era5.zarr")["t2m"].load().astype(np.float64)
    expected = _area(ref.resample(valid_time="MS").mean().rolling(valid_time=2).mean())
    assert got.dims == ("valid_time",)
    assert_close(got, expected, atol=5e-6 * 300)
    assert got.attrs["cell_methods"] == (
        "valid_time: mean valid_time: mean (comment: moving window of 2 steps, ending at each step) area: mean")
    assert got.valid_time.attrs["standard_name"] == "time"  # kept through resampling, as xarray keeps it


def test_cli_refuses_ambiguous_and_absent_axes_naming_them(tmp_path):
    x = era5(nt=40).expand_dims(step=2, axis=1).assign_coords(step=("step", [0, 6], {"axis": "T"}))
    x.to_dataset().to_zarr(tmp_path / "two.zarr")
    flow = write_flow(tmp_path, "two.zarr", "resample_mean", {"freq": "MS"}, name="two")
    flow.write_text(flow.read_text().replace("variable: tas", "variable: t2m"))
    assert_refused_at_validate_and_run(tmp_path, flow, "'valid_time' (standard_name 'time'", "'step' (axis 'T')")

    era5(nt=40).to_dataset().to_zarr(tmp_path / "one.zarr")
    absent = write_flow(tmp_path, "one.zarr", "climatology", {"dim": "t"}, name="absent")
    absent.write_text(absent.read_text().replace("variable: tas", "variable: t2m"))
    assert_refused(cli("validate", absent, cwd=tmp_path), "absent.yaml",
                   "variable 't2m' has no dimension 't' (its dimensions: valid_time, latitude, longitude)")
