"""Climate numbers on real-world inputs, against xarray and NumPy in float64: time axes out of
order, with duplicated or missing (NaT) dates, latitudes in radians or beyond the poles, float16
data, empty dimensions. Where xarray computes an answer, the ops give the same; where it refuses,
they refuse with an InputError naming the variable, and the CLI exits 2 writing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import assert_close, climate_array, on_backend

CHUNKS = {"time": 13, "lat": 2}  # divide neither axis


def series(nt=70, shape=(5, 6), dtype=np.float64, seed=0) -> xr.DataArray:
    """Daily (time, lat, lon) data with NaNs, an always-missing point and a point always above 283 K."""
    x = climate_array(shape=(nt, *shape), dtype=dtype, seed=seed)
    x[:, 1, 1] = 400.0
    return x


def ref64(x: xr.DataArray) -> xr.DataArray:
    return x.astype(np.float64)


def values(a: xr.DataArray) -> np.ndarray:
    return B.to_numpy(a.data)


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})


def write_flow(tmp_path: Path, store: str, op: str, params: dict | None = None, name: str | None = None) -> Path:
    """A one-step flow on variable tas of ``store``, writing out/<name>.zarr."""
    name = name or op
    flow = {"name": name, "source": {"path": store, "variable": "tas"}, "steps": [{"op": op, "params": params or {}}],
            "sink": {"path": f"out/{name}.zarr", "mode": "overwrite"}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(flow))
    return path


def assert_refused(r, *expected):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr


def assert_refused_at_validate_and_run(tmp_path, flow: Path, *expected):
    assert_refused(cli("validate", flow, cwd=tmp_path), flow.name, *expected)
    assert_refused(cli("run", flow, cwd=tmp_path), flow.name, *expected)
    assert not (tmp_path / "out").exists()  # nothing written, not even the sink's folder


# --- 1. time axes out of order, duplicated dates ----------------------------------------------------------


def _xclim_longest_run(x):
    run_length = pytest.importorskip("xclim.indices.run_length")
    return run_length.longest_run(x > 283.0, freq="MS")


def _xclim_esat(x):
    xclim_indices = pytest.importorskip("xclim.indices")
    return xclim_indices.saturation_vapor_pressure(x, method="sonntag90")


RESAMPLED = {
    "resample_mean": ({"freq": "MS"}, lambda x: ref64(x).resample(time="MS").mean()),
    "count_above": ({"threshold": 283.0, "freq": "MS"}, lambda x: (x > 283.0).resample(time="MS").sum()),
    "max_spell_length": ({"threshold": 283.0, "freq": "MS"}, _xclim_longest_run),
}


@pytest.mark.parametrize("op", sorted(RESAMPLED))
def test_resampling_refuses_dates_out_of_order(op):
    x = series().isel(time=slice(None, None, -1))  # newest first
    with pytest.raises(ValueError, match="monotonic"):  # xarray refuses it too
        x.resample(time="MS").mean()
    with pytest.raises(InputError) as info:
        getattr(pipeline.ops, op)(x.chunk(CHUNKS), **RESAMPLED[op][0])
    message = str(info.value)
    assert "variable 'tas': time coordinate 'time' is not in increasing order" in message
    assert "step 1, 2000-03-09 00:00:00, comes after 2000-03-10 00:00:00" in message and "sortby('time')" in message


def test_resampling_of_sorted_dates_equals_xarray(backend):
    x = series().isel(time=slice(None, None, -1)).sortby("time")
    for op, (params, reference) in RESAMPLED.items():
        got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), backend), **params)
        assert_close(got, reference(x).transpose(*got.dims))


def unordered(seed=1) -> xr.DataArray:
    x = series()
    return x.isel(time=np.random.default_rng(seed).permutation(x.sizes["time"]))


def polyfit_residual(x: xr.DataArray) -> xr.DataArray:
    r = ref64(x)
    return r - xr.polyval(r.time, r.polyfit("time", 1).polyfit_coefficients)


@pytest.mark.parametrize(
    "op,params,reference",
    [
        ("climatology", {}, lambda r: r.groupby("time.month").mean()),
        ("climatology", {"freq": "dayofyear"}, lambda r: r.groupby("time.dayofyear").mean()),
        ("anomaly", {}, lambda r: r.groupby("time.month") - r.groupby("time.month").mean()),
        ("rolling_mean", {"window": 5}, lambda r: r.rolling(time=5).mean()),  # by position, as xarray's
        ("detrend", {}, polyfit_residual),  # against the dates, wherever they are
        ("standardized_anomaly", {}, lambda r: (r - r.mean("time")) / r.std("time")),
    ],
)
def test_ops_on_dates_out_of_order_equal_xarray(backend, op, params, reference):
    x = unordered()
    got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), backend), **params)
    expected = reference(ref64(x)).transpose(*got.dims)
    for d in got.dims:
        np.testing.assert_array_equal(got[d].values, expected[d].values)
    assert_close(got, expected, atol=1e-9 * 300)


def duplicated() -> xr.DataArray:
    x = series()
    t = x.time.values.copy()
    t[[6, 7, 40]] = t[[5, 5, 39]]  # three steps repeat the date before them
    return x.assign_coords(time=t)


@pytest.mark.parametrize(
    "op,params,reference",
    [
        ("climatology", {}, lambda r: r.groupby("time.month").mean()),
        ("anomaly", {}, lambda r: r.groupby("time.month") - r.groupby("time.month").mean()),
        *[(op, p, ref) for op, (p, ref) in RESAMPLED.items()],
    ],
)
def test_duplicated_dates_as_xarray(backend, op, params, reference):
    x = duplicated()
    got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), backend), **params)
    expected = reference(x).transpose(*got.dims)
    assert got.sizes == expected.sizes
    assert_close(got, expected, atol=1e-9 * 300)


@pytest.fixture
def reversed_store(tmp_path):
    series().isel(time=slice(None, None, -1)).to_dataset().to_zarr(tmp_path / "rev.zarr")
    return tmp_path


@pytest.mark.parametrize("op", sorted(RESAMPLED))
def test_cli_refuses_to_resample_a_store_written_newest_first(reversed_store, op):
    flow = write_flow(reversed_store, "rev.zarr", op, RESAMPLED[op][0])
    assert_refused_at_validate_and_run(
        reversed_store, flow, f"steps[0] ({op}): variable 'tas': time coordinate 'time' is not in increasing order",
    )


def test_cli_climatology_of_a_store_written_newest_first_equals_xarray(reversed_store):
    r = cli("run", write_flow(reversed_store, "rev.zarr", "climatology"), cwd=reversed_store)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(reversed_store / "out" / "climatology.zarr")["climatology"]
    expected = ref64(xr.open_zarr(reversed_store / "rev.zarr")["tas"]).groupby("time.month").mean()
    np.testing.assert_array_equal(got.month.values, expected.month.values)
    assert_close(got.load(), expected)


# --- 2. missing dates (NaT) --------------------------------------------------------------------------------


def undated(positions=(0, 5, 33)) -> xr.DataArray:
    x = series()
    t = x.time.values.copy()
    t[list(positions)] = np.datetime64("NaT")
    return x.assign_coords(time=t)


@pytest.mark.parametrize("freq", ["month", "dayofyear"])
def test_climatology_and_anomaly_leave_missing_dates_out_as_xarray(backend, freq):
    x = undated()
    r = ref64(x)
    clim = pipeline.ops.climatology(on_backend(x.chunk(CHUNKS), backend), freq=freq)
    expected = r.groupby(f"time.{freq}").mean()  # NaT in no group
    np.testing.assert_array_equal(clim[freq].values, expected[freq].values)
    assert clim[freq].values.min() >= 1
    assert_close(clim, expected)
    anom = pipeline.ops.anomaly(on_backend(x.chunk(CHUNKS), backend), freq=freq)
    # xarray's groupby arithmetic leaves the undated steps out of its result; here they stay, NaN,
    # so that the anomaly keeps its input's grid
    expected = (r.groupby(f"time.{freq}") - r.groupby(f"time.{freq}").mean()).transpose(*anom.dims)
    assert anom.sizes == x.sizes and expected.sizes["time"] == x.sizes["time"] - 3
    assert np.isnan(values(anom)[[0, 5, 33]]).all()
    assert_close(anom.isel(time=anom.time.notnull().values), expected, atol=1e-9 * 300)


def test_all_dates_missing_is_refused():
    x = undated(positions=range(70))
    with pytest.raises(InputError, match="time coordinate 'time' has no dates"):
        pipeline.ops.climatology(x.chunk(CHUNKS))


@pytest.mark.parametrize("op", sorted(RESAMPLED))
def test_resampling_refuses_missing_dates(op):
    x = undated()
    with pytest.raises(ValueError, match="monotonic"):  # xarray's resample refuses NaT
        x.resample(time="MS").mean()
    with pytest.raises(InputError, match=r"variable 'tas': time coordinate 'time' has missing dates \(NaT\) at steps 0, 5, 33"):
        getattr(pipeline.ops, op)(x.chunk(CHUNKS), **RESAMPLED[op][0])


def test_detrend_refuses_missing_dates():
    x = undated(positions=(5,))
    with pytest.raises(InputError, match="variable 'tas': coordinate 'time' has missing values at step 5"):
        pipeline.ops.detrend(x.chunk(CHUNKS))


@pytest.fixture
def undated_store(tmp_path):
    undated().to_dataset().to_zarr(tmp_path / "nat.zarr")
    assert np.isnat(xr.open_zarr(tmp_path / "nat.zarr").time.values[[0, 5, 33]]).all()
    return tmp_path


def test_cli_refuses_to_resample_missing_dates(undated_store):
    flow = write_flow(undated_store, "nat.zarr", "count_above", {"threshold": "10 degC", "freq": "MS"})
    assert_refused_at_validate_and_run(undated_store, flow, "variable 'tas'", "'time' has missing dates (NaT) at steps 0, 5, 33")


def test_cli_anomaly_with_missing_dates_equals_xarray(undated_store):
    r = cli("run", write_flow(undated_store, "nat.zarr", "anomaly"), cwd=undated_store)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(undated_store / "out" / "anomaly.zarr")["anomaly"].load()
    x = ref64(xr.open_zarr(undated_store / "nat.zarr")["tas"])
    assert np.isnan(got.values[[0, 5, 33]]).all()
    expected = x.groupby("time.month") - x.groupby("time.month").mean()  # the dated steps
    assert_close(got.isel(time=got.time.notnull().values), expected, atol=1e-9 * 300)


# --- 3. latitudes: units and values ------------------------------------------------------------------------


def coslat_mean(x: xr.DataArray, degrees: np.ndarray) -> np.ndarray:
    """The area mean of each step, by NumPy in float64 (weights of missing values left out)."""
    v = ref64(x).values
    w = np.broadcast_to(np.cos(np.deg2rad(np.asarray(degrees, dtype=np.float64)))[None, :, None], v.shape)
    valid = ~np.isnan(v)
    return np.where(valid, v * w, 0).sum((1, 2)) / np.where(valid, w, 0).sum((1, 2))


@pytest.mark.parametrize(
    "units,to_units,dtype",
    [
        ("radians", np.deg2rad, np.float64),
        ("rad", np.deg2rad, np.float32),  # float32 radians: the poles round a hair past pi/2
        ("degrees_N", lambda d: d, np.float64),
        (None, lambda d: d, np.float32),  # no units: degrees, as CF's default reading
    ],
)
def test_coslat_reads_the_latitude_units(backend, units, to_units, dtype):
    x = series(shape=(7, 6))
    degrees = np.linspace(-90, 90, 7)
    attrs = {} if units is None else {"units": units}
    y = x.assign_coords(lat=("lat", to_units(degrees).astype(dtype), attrs))
    got = pipeline.ops.weighted_mean(on_backend(y.chunk(CHUNKS), backend), dims=["lat", "lon"], weights="coslat")
    np.testing.assert_allclose(values(got), coslat_mean(x, degrees), rtol=1e-6)


@pytest.mark.parametrize(
    "lat,attrs,shown",
    [
        ([-100.0, 0.0, 95.0], {"units": "degrees_north"}, "within [-90, 90] degrees_north): -100.0, 95.0"),
        ([-1.0, 0.0, 1.7], {"units": "radians"}, "within [-pi/2, pi/2] radians): 1.7"),
        ([-30.0, np.nan, 30.0], {}, "): nan"),
        ([-30.0, np.inf, 30.0], {"units": "degree_north"}, "): inf"),
    ],
)
def test_coslat_refuses_values_that_are_not_latitudes(lat, attrs, shown):
    x = series(shape=(3, 4)).assign_coords(lat=("lat", np.array(lat), attrs))
    with pytest.raises(InputError) as info:
        pipeline.ops.weighted_mean(x.chunk(CHUNKS))
    assert "latitude coordinate 'lat' of 'tas' holds values that are not latitudes (finite" in str(info.value)
    assert shown in str(info.value)


def test_coslat_refuses_units_that_are_not_of_a_latitude():
    x = series(shape=(3, 4)).assign_coords(lat=("lat", [0.0, 1e5, 2e5], {"units": "m"}))
    with pytest.raises(InputError, match="latitude coordinate 'lat' of 'tas' has units 'm'; weights='coslat' expects"):
        pipeline.ops.weighted_mean(x.chunk(CHUNKS))


def test_coslat_on_a_two_dimensional_latitude_in_radians():
    x = series(shape=(4, 5)).rename(lat="y", lon="x").drop_vars(["y", "x"])
    degrees = np.linspace(-60, 60, 4)[:, None] + np.zeros(5)
    y = x.assign_coords(lat=(("y", "x"), np.deg2rad(degrees), {"units": "radians", "standard_name": "latitude"}))
    got = pipeline.ops.weighted_mean(y.chunk({"time": 13, "y": 3}), dims=["y", "x"], weights="coslat")
    expected = ref64(x).weighted(xr.DataArray(np.cos(np.deg2rad(degrees)), dims=("y", "x"))).mean(("y", "x"))
    assert_close(got, expected, atol=1e-9 * 300)


def test_cli_refuses_latitudes_beyond_the_poles(tmp_path):
    x = series(shape=(4, 5))
    x.assign_coords(lat=("lat", [-80.0, 0.0, 80.0, 120.0], {"units": "degrees_north"})).to_dataset().to_zarr(tmp_path / "s.zarr")
    flow = write_flow(tmp_path, "s.zarr", "weighted_mean", {"dims": ["lat", "lon"], "weights": "coslat"})
    assert_refused_at_validate_and_run(tmp_path, flow, "steps[0] (weighted_mean): latitude coordinate 'lat' of 'tas'",
                                       "within [-90, 90] degrees_north): 120.0")


def test_cli_area_mean_of_latitudes_in_radians_equals_numpy(tmp_path):
    x = series(shape=(7, 6))
    degrees = np.linspace(-90, 90, 7)
    x.assign_coords(lat=("lat", np.deg2rad(degrees), {"units": "radians"})).to_dataset().to_zarr(tmp_path / "s.zarr")
    r = cli("run", write_flow(tmp_path, "s.zarr", "weighted_mean", {"weights": "coslat"}), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "weighted_mean.zarr")["weighted_mean"].values
    np.testing.assert_allclose(got, coslat_mean(x, degrees), rtol=1e-12)


# --- 4. float16 data ---------------------------------------------------------------------------------------


# each op of the registry on a DataArray: its parameters here and its reference in float64
FLOAT16 = {
    "standardized_anomaly": ({}, lambda r: (r - r.mean("time")) / r.std("time")),
    "weighted_mean": ({}, lambda r: r.weighted(np.cos(np.deg2rad(r.lat))).mean(("lat", "lon"))),
    "rolling_mean": ({"window": 3}, lambda r: r.rolling(time=3).mean()),
    "climatology": ({}, lambda r: r.groupby("time.month").mean()),
    "anomaly": ({}, lambda r: r.groupby("time.month") - r.groupby("time.month").mean()),
    "resample_mean": ({"freq": "MS"}, lambda r: r.resample(time="MS").mean()),
    "coarsen_mean": ({"factors": {"time": 4, "lon": 2}}, lambda r: r.coarsen(time=4, lon=2, boundary="trim").mean()),
    "detrend": ({}, polyfit_residual),
    "quantile": ({"q": [0.1, 0.5]}, lambda r: r.quantile([0.1, 0.5], "time")),
    "count_above": ({"threshold": 283.0, "freq": "MS"}, lambda r: (r > 283.0).resample(time="MS").sum()),
    "max_spell_length": ({"threshold": 283.0, "freq": "MS"}, _xclim_longest_run),
    "saturation_vapor_pressure": ({}, _xclim_esat),
    # the generic steps (xarray's reductions by name)
    "resample": ({"freq": "MS", "how": "mean"}, lambda r: r.resample(time="MS").mean()),
    "groupby": ({"group": "time.month", "how": "mean"}, lambda r: r.groupby("time.month").mean()),
    "rolling": ({"window": 3, "how": "mean"}, lambda r: r.rolling(time=3).mean()),
    "coarsen": ({"factors": {"time": 7}, "how": "mean"}, lambda r: r.coarsen(time=7).mean()),
    "weighted": ({"how": "mean"}, lambda r: r.weighted(np.cos(np.deg2rad(r.lat))).mean(("lat", "lon"))),
    "reduce": ({"dims": "time", "how": "mean"}, lambda r: r.mean("time")),
}
ARRAY_OPS = sorted(op.name for op in pipeline.ops.all_ops() if not op.dataset)


def test_every_array_op_is_covered_here():
    assert sorted(FLOAT16) == ARRAY_OPS


@pytest.mark.parametrize("op", ARRAY_OPS)
def test_float16_data_are_computed_in_float32(backend, op):
    x = series(dtype=np.float16)
    params, reference = FLOAT16[op]
    got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), backend), **params)
    expected = reference(ref64(x))  # the same float16 values, in float64
    counts = op in ("count_above", "max_spell_length")
    assert got.dtype == (np.int64 if counts else np.float32)
    if counts:
        np.testing.assert_array_equal(values(got), expected.transpose(*got.dims).values)
    else:  # float16 values are exact in float32: what differs is float32's rounding of the result
        assert_close(got, expected.transpose(*got.dims), atol=8 * np.finfo(np.float32).eps * float(np.nanmax(abs(expected))))


def test_cli_runs_a_float16_store(tmp_path):
    x = series(dtype=np.float16)
    x.to_dataset().to_zarr(tmp_path / "f16.zarr")
    r = cli("run", write_flow(tmp_path, "f16.zarr", "standardized_anomaly"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "standardized_anomaly.zarr")["standardized_anomaly"].load()
    assert got.dtype == np.float32
    r64 = ref64(x)
    assert_close(got, (r64 - r64.mean("time")) / r64.std("time"), atol=1e-5)


# --- 5. empty dimensions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", ["time", "lat", "lon"])
@pytest.mark.parametrize("op", ARRAY_OPS)
def test_every_op_refuses_an_empty_dimension(op, dim):
    x = series().isel({dim: slice(0, 0)})
    with pytest.raises(InputError, match=rf"variable 'tas' is empty: its dimension '{dim}' has size 0"):
        getattr(pipeline.ops, op)(x.chunk(CHUNKS), **FLOAT16[op][0])


@pytest.fixture(scope="module")
def empty_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("empty")
    with warnings.catch_warnings():  # module-scoped: before conftest's filter of zarr's note on consolidation
        warnings.filterwarnings("ignore", message=".*consolidated metadata.*")
        for dim in ("time", "lat", "lon"):
            series().isel({dim: slice(0, 0)}).to_dataset().to_zarr(root / f"{dim}.zarr")
    return root


def _flows_on(root: Path, tmp_path: Path, dim: str, ops) -> list[Path]:
    return [write_flow(tmp_path, str(root / f"{dim}.zarr"), op, FLOAT16[op][0], name=f"{op}-{dim}") for op in ops]


@pytest.mark.parametrize("dim", ["time", "lat", "lon"])
def test_cli_validate_refuses_an_empty_dimension_for_every_op(empty_stores, tmp_path, dim):
    flows = _flows_on(empty_stores, tmp_path, dim, ARRAY_OPS)
    r = cli("validate", *flows, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for flow, op in zip(flows, ARRAY_OPS):
        assert f"{flow.name}: steps[0] ({op}): variable 'tas' is empty: its dimension '{dim}' has size 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == len(flows), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in flows)


@pytest.mark.parametrize("op", ARRAY_OPS)
def test_cli_run_refuses_an_empty_time_dimension(empty_stores, tmp_path, op):
    (flow,) = _flows_on(empty_stores, tmp_path, "time", [op])
    r = cli("run", flow, cwd=tmp_path)
    assert_refused(r, f"{flow.name}: steps[0] ({op}): variable 'tas' is empty: its dimension 'time' has size 0")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dim", ["lat", "lon"])
def test_cli_run_refuses_an_empty_grid(empty_stores, tmp_path, dim):
    (flow,) = _flows_on(empty_stores, tmp_path, dim, ["climatology"])
    assert_refused(cli("run", flow, cwd=tmp_path), f"variable 'tas' is empty: its dimension '{dim}' has size 0")
    assert not (tmp_path / "out").exists()
