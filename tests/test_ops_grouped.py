"""Ops by group along time, against xarray and xclim in float64, on both backends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import assert_close, chunk_types, on_backend


def daily(nt=800, shape=(4, 5), nan_fraction=0.1, seed=0, start="2000-01-01", freq="D") -> xr.DataArray:
    rng = np.random.default_rng(seed)
    t = pd.date_range(start, periods=nt, freq=freq)
    season = 10 * np.sin(2 * np.pi * np.arange(nt) / 365.25)[:, None, None]
    x = (280 + season + rng.standard_normal((nt, *shape)) * 3).astype(np.float32)
    x[rng.random(x.shape) < nan_fraction] = np.nan
    x[:, 0, 0] = np.nan  # always missing
    x[:, 1, 1] = 400.0  # always above any threshold: one run through the whole series
    return xr.DataArray(
        x,
        dims=("time", "lat", "lon"),
        coords={"time": t, "lat": np.linspace(-60, 60, shape[0]), "lon": np.arange(shape[1], dtype=float)},
        name="tas",
        attrs={"units": "K"},
    )


CHUNKS = [{"time": 73, "lat": 3}, {"time": 30}, {"time": 1000}, {"time": 7, "lon": 2}]


@pytest.mark.parametrize("freq", ["month", "dayofyear"])
@pytest.mark.parametrize("chunks", CHUNKS)
def test_climatology(backend, freq, chunks):
    x = daily()
    got = pipeline.ops.climatology(on_backend(x.chunk(chunks), backend), freq=freq)
    expected = x.astype(np.float64).groupby(f"time.{freq}").mean("time")
    assert got.dims == (freq, "lat", "lon") and got.dtype == np.float32
    np.testing.assert_array_equal(got[freq].values, expected[freq].values)
    assert_close(got, expected)
    assert B.backend_of(got) == backend


@pytest.mark.parametrize("freq", ["month", "dayofyear"])
@pytest.mark.parametrize("chunks", CHUNKS[:2])
def test_anomaly(backend, freq, chunks):
    x = daily()
    got = pipeline.ops.anomaly(on_backend(x.chunk(chunks), backend), freq=freq)
    r = x.astype(np.float64)
    expected = r.groupby(f"time.{freq}") - r.groupby(f"time.{freq}").mean("time")
    assert got.dims == x.dims and got.dtype == np.float32
    assert_close(got, expected.transpose(*x.dims), atol=4e-6 * 300)


def test_climatology_of_a_partial_year_has_only_the_months_present(backend):
    x = daily(nt=100)  # January to April
    got = pipeline.ops.climatology(on_backend(x.chunk({"time": 33}), backend))
    assert list(got.month.values) == [1, 2, 3, 4]


@pytest.mark.parametrize("freq", ["1D", "7D", "MS", "QS-DEC", "YS", "ME"])
@pytest.mark.parametrize("chunks", CHUNKS)
def test_resample_mean(backend, freq, chunks):
    x = daily()
    got = pipeline.ops.resample_mean(on_backend(x.chunk(chunks), backend), freq=freq)
    expected = x.astype(np.float64).resample(time=freq).mean()
    np.testing.assert_array_equal(got.time.values, expected.time.values)
    assert_close(got, expected)


def test_resample_mean_hourly_to_daily_with_a_gap(backend):
    x = daily(nt=24 * 20, freq="h")
    x = x.isel(time=np.r_[0:100, 160:x.sizes["time"]])  # 2.5 days missing: an empty daily bin, NaN in xarray
    got = pipeline.ops.resample_mean(on_backend(x.chunk({"time": 50}), backend), freq="1D")
    expected = x.astype(np.float64).resample(time="1D").mean()
    np.testing.assert_array_equal(got.time.values, expected.time.values)
    assert_close(got, expected)


@pytest.mark.parametrize("freq", ["YS", "MS", "7D"])
@pytest.mark.parametrize("chunks", CHUNKS)
def test_count_above_as_xclim(backend, freq, chunks):
    xclim = pytest.importorskip("xclim")
    x = daily()
    got = pipeline.ops.count_above(on_backend(x.chunk(chunks), backend), threshold="10 degC", freq=freq)
    expected = (x.astype(np.float64) > 283.15).resample(time=freq).sum()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(B.to_numpy(got.data), expected.values)
    ref = xclim.indices.tx_days_above(x.astype(np.float64), thresh="10 degC", freq=freq)
    np.testing.assert_array_equal(B.to_numpy(got.data), ref.transpose(*got.dims).values)


@pytest.mark.parametrize("freq", ["YS", "MS", "7D", "1D"])
@pytest.mark.parametrize("chunks", [*CHUNKS, {"time": 1}, {"time": 3}])
def test_max_spell_length_as_xclim(backend, freq, chunks):
    """A run counts, whole, for the period where it begins, as xclim's longest_run."""
    run_length = pytest.importorskip("xclim.indices.run_length")
    x = daily(nan_fraction=0.05)
    got = pipeline.ops.max_spell_length(on_backend(x.chunk(chunks), backend), threshold=283.0, freq=freq)
    expected = run_length.longest_run(x.astype(np.float64) > 283.0, freq=freq).transpose(*got.dims)
    np.testing.assert_array_equal(B.to_numpy(got.data), expected.values)
    assert int(B.to_numpy(got.data)[0, 1, 1]) == x.sizes["time"]  # the endless run


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nt=st.integers(1, 120),
    tchunk=st.integers(1, 40),
    threshold=st.floats(276, 284),
    freq=st.sampled_from(["5D", "MS", "YS", "1D"]),
    seed=st.integers(0, 10),
)
def test_spells_and_counts_any_chunking(nt, tchunk, threshold, freq, seed):
    run_length = pytest.importorskip("xclim.indices.run_length")
    x = daily(nt=nt, shape=(2, 3), seed=seed, nan_fraction=0.1)
    xc = x.chunk({"time": tchunk})
    got = pipeline.ops.max_spell_length(xc, threshold=threshold, freq=freq)
    expected = run_length.longest_run(x > threshold, freq=freq).transpose(*got.dims)
    np.testing.assert_array_equal(got.values, expected.values)
    counts = pipeline.ops.count_above(xc, threshold=threshold, freq=freq)
    np.testing.assert_array_equal(counts.values, (x > threshold).resample(time=freq).sum().values)
    means = pipeline.ops.resample_mean(xc, freq=freq)
    assert_close(means, x.astype(np.float64).resample(time=freq).mean())


def test_thresholds_with_units():
    x = daily(nt=50)
    a = pipeline.ops.count_above(x, threshold="10 degC", freq="YS")
    b = pipeline.ops.count_above(x, threshold=283.15, freq="YS")
    np.testing.assert_array_equal(a.values, b.values)
    c = pipeline.ops.count_above(x.assign_attrs(units="degC") - 273.15, threshold="50 degF", freq="YS")
    np.testing.assert_array_equal(c.values, b.values)
    with pytest.raises(InputError, match="threshold must be a number or a temperature"):
        pipeline.ops.count_above(x, threshold="hot", freq="YS")
    with pytest.raises(InputError, match="has units 'mm/day'"):
        pipeline.ops.count_above(x.assign_attrs(units="mm/day"), threshold="10 degC")


def test_bad_time_axis_and_freq():
    x = daily(nt=40)
    with pytest.raises(InputError, match="freq must be 'month', 'dayofyear' or 'season'"):
        pipeline.ops.climatology(x, freq="year")
    with pytest.raises(InputError, match="not a pandas frequency"):
        pipeline.ops.resample_mean(x, freq="fortnightly")
    with pytest.raises(InputError, match="must hold dates"):
        pipeline.ops.resample_mean(x.assign_coords(time=np.arange(40.0)), freq="1D")


@pytest.mark.parametrize(
    "name, params",
    [("climatology", {}), ("anomaly", {"freq": "dayofyear"}), ("resample_mean", {"freq": "MS"}),
     ("count_above", {"threshold": 285.0, "freq": "MS"}), ("max_spell_length", {"threshold": 281.0, "freq": "MS"}),
     ("max_spell_length", {"threshold": 281.0, "freq": "MS", "resample_before_rl": True})],
)
def test_grouped_ops_take_the_dimension_of_dates(backend, name, params):
    """The grouped ops reduce over the dimension ``dim`` names, here one not called "time" and not
    first, as they do over "time"; a dimension that is missing, or holds no dates, is named."""
    x = daily(nt=100).chunk({"time": 23, "lat": 3})
    op = getattr(pipeline.ops, name)
    want = op(on_backend(x, backend), **params)
    moved = x.rename(time="day").transpose("lat", "day", "lon")
    got = op(on_backend(moved, backend), dim="day", **params)
    new_dim = {"climatology": "month"}.get(name, "day")
    assert new_dim in got.dims and "time" not in got.dims
    expected = want.rename({d: new_dim for d in want.dims if d in ("time",)}).transpose(*got.dims)
    np.testing.assert_array_equal(B.to_numpy(got).values, B.to_numpy(expected).values)
    np.testing.assert_array_equal(got[new_dim].values, expected[new_dim].values)
    with pytest.raises(InputError, match="variable 'tas' has no dimension 'time'"):
        op(moved, **params)
    with pytest.raises(InputError, match="dimension 'lon' of 'tas' must hold dates"):
        op(moved, dim="lon", **params)


@pytest.mark.gpu
def test_grouped_results_stay_on_gpu():
    import cupy

    x = on_backend(daily(nt=200).chunk({"time": 30}), "gpu")
    for out in (
        pipeline.ops.climatology(x),
        pipeline.ops.anomaly(x),
        pipeline.ops.resample_mean(x, freq="MS"),
        pipeline.ops.count_above(x, threshold=283.0),
        pipeline.ops.max_spell_length(x, threshold=283.0),
    ):
        assert isinstance(out.data._meta, cupy.ndarray)
        assert chunk_types(out) == {cupy.ndarray}


@pytest.mark.parametrize("freq", ["YS", "MS", "7D"])
@pytest.mark.parametrize("chunks", [*CHUNKS, {"time": 1}, {"time": 3}])
def test_max_spell_length_cut_at_periods(backend, freq, chunks):
    """resample_before_rl=True: each period counts only its own steps (xclim's indicators)."""
    run_length = pytest.importorskip("xclim.indices.run_length")
    x = daily(nan_fraction=0.05)
    got = pipeline.ops.max_spell_length(
        on_backend(x.chunk(chunks), backend), threshold=283.0, freq=freq, resample_before_rl=True
    )
    expected = (x.astype(np.float64) > 283.0).resample(time=freq).map(run_length.longest_run, dim="time")
    np.testing.assert_array_equal(B.to_numpy(got.data), expected.transpose(*got.dims).values)


def test_a_spell_across_new_year():
    x = daily(nt=10, shape=(2, 2), nan_fraction=0.0, start="1999-12-28").isel(lat=[0], lon=[1]) * 0
    x[1:7] = 1.0  # Dec 29 to Jan 3
    whole = pipeline.ops.max_spell_length(x, threshold=0.5, freq="YS")
    cut = pipeline.ops.max_spell_length(x, threshold=0.5, freq="YS", resample_before_rl=True)
    assert whole.values.ravel().tolist() == [6, 0]
    assert cut.values.ravel().tolist() == [3, 3]


def test_additive_merge_equals_merging_one_by_one(backend):
    """Partials summed in place into one accumulator equal, bit for bit, the same partials aligned
    to the union of their groups and merged one by one, and the per-group sums and counts of the
    data; groups not asked for are dropped."""
    from dataclasses import replace

    from pipeline import kernels
    from pipeline.reduce import aggregation

    xp = B.module(backend)
    rng = np.random.default_rng(3)
    labels = [np.array([1, 1, 2, 3]), np.array([3, 4, 4, 4, 5]), np.array([12, 1, 1]), np.array([5, 6])]
    blocks = []
    for lab in labels:
        x = rng.standard_normal((lab.size, 7)).astype(np.float32)
        x[rng.random(x.shape) < 0.3] = np.nan
        blocks.append(x)
    kernel = kernels.get("group_sum", backend)
    parts = [aggregation.chunk_partial(xp.asarray(x), lab, aggregation.GROUP_MEAN, 0, kernel) for x, lab in zip(blocks, labels)]
    data, every = np.concatenate(blocks).astype(np.float64), np.concatenate(labels)
    one_by_one = replace(aggregation.GROUP_MEAN, additive=False)
    for groups in (None, np.array([1, 3, 5, 12]), np.array([2, 6])):
        summed = aggregation.merge_partials(parts, aggregation.GROUP_MEAN, groups)
        merged = aggregation.merge_partials(parts, one_by_one, groups)
        want = np.unique(every) if groups is None else groups
        assert np.array_equal(summed["groups"], want) and np.array_equal(merged["groups"], want)
        assert summed["length"] == merged["length"] == every.size
        for f in ("sum", "count"):
            assert type(summed[f]) is type(parts[0][f])
            assert np.array_equal(B.to_numpy(summed[f]), B.to_numpy(merged[f]), equal_nan=True)
        rows = [data[every == g] for g in want]
        np.testing.assert_allclose(B.to_numpy(summed["sum"]), [np.nansum(r, axis=0) for r in rows], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(B.to_numpy(summed["count"]), [np.sum(~np.isnan(r), axis=0) for r in rows])
