"""Grouped binary operations (``x.groupby("time.month") - clim``) in the grouped array's chunks
(pipeline/patches.py, ``xarray-groupby-binary-op``): the expansion of ``clim`` along time is built
block by block in ``x``'s chunks, where xarray's gives one time step a chunk and rechunks ``x`` to
match. The fast path runs here on Dask arrays of NumPy blocks against xarray's own result."""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline import backend as B
from pipeline import patches

N, NY, NX = 400, 9, 4
CHUNKS = {"time": 37, "lat": 5}  # chunks that divide no axis


def _tas(calendar="standard"):
    if calendar == "standard":
        time = pd.date_range("2001-01-01", periods=N, freq="D")
    else:
        time = xr.date_range("2001-01-01", periods=N, freq="D", calendar=calendar, use_cftime=True)
    rng = np.random.default_rng(11)
    tas = (285 + 4 * rng.standard_normal((N, NY, NX))).astype("float32")
    tas[rng.random(tas.shape) < 0.05] = np.nan
    tas[:, 2, 1] = np.nan  # a cell with no value at all
    return xr.DataArray(
        tas, dims=("time", "lat", "lon"), name="tas", attrs={"units": "K"},
        coords={"time": time, "lat": np.linspace(-80, 80, NY), "lon": np.arange(NX) * 90.0},
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    made = {}

    def store(calendar):
        if calendar not in made:
            made[calendar] = tmp_path_factory.mktemp(f"gb-{calendar}") / "tas.zarr"
            _tas(calendar).to_dataset().chunk(CHUNKS).to_zarr(made[calendar])
        return made[calendar]

    return store


def _open(stores, calendar="standard", backend="cpu"):
    return pipeline.open_dataset(stores(calendar), backend=backend, chunks=CHUNKS)["tas"]


def _fast(gb, other, f=operator.sub, reflexive=False):
    assert patches._aligned_applies(gb, other)
    return patches._aligned_groupby_binary_op(gb, other, f, reflexive)


def _check(got, want, obj):
    """xarray's result, in the grouped array's chunks along time, by a graph of a few tasks per
    block (xarray's has one task per time step at least)."""
    assert got.chunks is not None
    assert got.chunksizes["time"] == obj.chunksizes["time"]
    for d in ("lat", "lon"):
        if d in obj.dims and d in got.dims:
            assert got.chunksizes[d] == obj.chunksizes[d]
    assert len(got.data.__dask_graph__()) < obj.sizes["time"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xr.testing.assert_identical(got.compute(), want.compute())


def _clim(x, key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the cell with no value
        return x.groupby(key).mean().compute()  # its own graph is not the subject here


@pytest.mark.parametrize("calendar", ["standard", "noleap"])
@pytest.mark.parametrize("key", ["time.month", "time.season", "time.dayofyear"])
def test_anomaly_is_xarrays_in_the_arrays_chunks(stores, calendar, key):
    x = _open(stores, calendar)
    clim = _clim(x, key)
    got = _fast(x.groupby(key), clim)
    assert got.chunksizes["time"] == (37,) * 10 + (30,)
    _check(got, x.groupby(key) - clim, x)


def test_the_original_makes_one_step_chunks_here(stores):
    """The defect the fast path mends, as xarray and dask make it on these arrays."""
    x = _open(stores)
    clim = _clim(x, "time.month").chunk(month=1)
    want = x.groupby("time.month") - clim
    assert set(want.chunksizes["time"]) == {1}
    got = _fast(x.groupby("time.month"), clim)
    assert len(got.data.__dask_graph__()) * 10 < len(want.data.__dask_graph__())
    _check(got, want, x)


@pytest.mark.parametrize("chunked", ["numpy", "months", "lat"])
def test_other_numpy_or_dask_in_any_chunks(stores, chunked):
    x = _open(stores)
    clim = _clim(x, "time.month")
    clim = {"numpy": clim, "months": clim.chunk(month=1), "lat": clim.chunk(month=5, lat=2, lon=3)}[chunked]
    _check(_fast(x.groupby("time.month"), clim), x.groupby("time.month") - clim, x)


@pytest.mark.parametrize("op", [operator.sub, operator.truediv, operator.add])
def test_reflexive(stores, op):
    x = _open(stores)
    clim = _clim(x, "time.month")
    got = _fast(x.groupby("time.month"), clim, op, reflexive=True)
    _check(got, op(clim, x.groupby("time.month")), x)


def test_labels_dataarray_grouper():
    x = _tas().chunk(CHUNKS)
    labels = xr.DataArray(np.arange(N) % 7 // 2, dims="time", coords={"time": x.time}, name="labels")
    clim = x.groupby(labels).mean().compute()
    _check(_fast(x.groupby(labels), clim), x.groupby(labels) - clim, x)


def test_other_with_an_extra_dimension_and_coordinates():
    x = _tas().chunk(CHUNKS)
    clim = x.groupby("time.month").mean().compute()
    other = xr.concat([clim, 2 * clim], dim="member").assign_coords(
        member=["a", "b"], height=2.0, month_name=("month", [f"m{m}" for m in range(1, 13)]))
    other = other.transpose("lat", "member", "month", "lon")  # the groups in the middle
    got = _fast(x.groupby("time.month"), other)
    want = x.groupby("time.month") - other
    assert got.dims == want.dims and "height" in got.coords and got["month_name"].dims == ("time",)
    _check(got, want, x)


def test_other_missing_a_group_is_nan_there():
    x = _tas().chunk(CHUNKS)
    clim = x.groupby("time.month").mean().compute().sel(month=[1, 2, 3, 5, 7, 8, 9, 10, 11, 12])
    got = _fast(x.groupby("time.month"), clim)
    assert bool(got.sel(time=got.time.dt.month == 4).isnull().all())
    _check(got, x.groupby("time.month") - clim, x)


def test_bins_take_the_fast_path_when_every_element_is_in_a_bin():
    x = _tas().chunk(CHUNKS)
    gb = x.groupby_bins("lat", [-90, 0, 90])
    means = gb.mean().compute()
    got = _fast(gb, means)
    assert got.chunksizes["lat"] == x.chunksizes["lat"]
    xr.testing.assert_identical(got.compute(), (gb - means).compute())


def test_bins_with_elements_outside_them_go_to_xarray():
    x = _tas().chunk(CHUNKS)
    gb = x.groupby_bins("lat", [-90, -30, 0, 30])  # 80 is in none
    means = gb.mean().compute()
    assert not patches._aligned_applies(gb, means)
    wrapped = patches._groupby_binary_op(type(gb)._binary_op)
    xr.testing.assert_identical(wrapped(gb, means, operator.sub).compute(), (gb - means).compute())


def test_what_the_fast_path_does_not_take():
    x = _tas().chunk(CHUNKS)
    clim = x.groupby("time.month").mean().compute()
    gb = x.groupby("time.month")
    assert patches._aligned_applies(gb, clim)
    assert not patches._aligned_applies(gb, clim.to_dataset())  # a Dataset
    assert not patches._aligned_applies(x.to_dataset().groupby("time.month"), clim)
    assert not patches._aligned_applies(gb, clim.isel(lat=slice(0, 4)))  # lat not x's: xarray aligns
    assert not patches._aligned_applies(x.compute().groupby("time.month"), clim)  # no Dask array
    assert not patches._aligned_applies(x.groupby("lat"), x.groupby("lat").mean())  # grouped by a dim
    assert not patches._aligned_applies(x.resample(time="MS"), x.resample(time="MS").mean())
    x2 = x.assign_coords(box=(("lat", "lon"), np.arange(NY * NX).reshape(NY, NX) % 3))
    assert not patches._aligned_applies(x2.groupby("box"), x2.groupby("box").mean())  # a 2-D group


def test_numpy_data_reach_xarray_through_the_wrapper():
    from xarray.core.groupby import GroupBy

    x = _tas().chunk(CHUNKS)
    clim = x.groupby("time.month").mean()
    wrapped = patches._groupby_binary_op(GroupBy._binary_op)
    got = wrapped(x.groupby("time.month"), clim, operator.sub)
    assert set(got.chunksizes["time"]) == {1}  # xarray's own, unchanged
    xr.testing.assert_identical(got.compute(), (x.groupby("time.month") - clim).compute())
    ds = x.to_dataset()  # a Dataset, which has no .data, goes there too
    got = wrapped(ds.groupby("time.month"), clim, operator.sub)
    xr.testing.assert_identical(got.compute(), (ds.groupby("time.month") - clim).compute())


@pytest.mark.gpu
def test_anomaly_on_the_gpu_is_xarrays_in_the_arrays_chunks(stores):
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    x = _open(stores, backend="gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = x.groupby("time.month") - x.groupby("time.month").mean()
        assert isinstance(got.data._meta, cupy.ndarray)
        assert got.chunksizes["time"] == x.chunksizes["time"]
        assert "xarray-groupby-binary-op" in patches._applied
        got = got.compute()
        assert isinstance(got.data, cupy.ndarray)
        ref_x = xr.open_zarr(stores("standard"))["tas"].load()
        want = ref_x.groupby("time.month") - ref_x.groupby("time.month").mean()
    np.testing.assert_array_equal(got.time.values, want.time.values)
    np.testing.assert_array_equal(got.month.values, want.month.values)
    np.testing.assert_allclose(got.data.get(), want.values, rtol=2e-5, atol=3e-4, equal_nan=True)


def test_the_wrapper_takes_the_fast_path_for_device_arrays(monkeypatch):
    """Which way the wrapper goes, with Dask arrays of NumPy blocks standing in for the device's."""
    from xarray.core.groupby import GroupBy

    monkeypatch.setattr(patches, "on_device", lambda a: hasattr(a, "__dask_graph__"))
    monkeypatch.setattr(patches, "to_device", lambda a: a)
    x = _tas().chunk(CHUNKS)
    clim = _clim(x, "time.month")
    wrapped = patches._groupby_binary_op(GroupBy._binary_op)
    got = wrapped(x.groupby("time.month"), clim, operator.sub)
    _check(got, x.groupby("time.month") - clim, x)
    gb = x.groupby_bins("lat", [-90, -30, 0, 30])  # 80 is in no bin: xarray's way
    means = gb.mean().compute()
    assert set(wrapped(gb, means, operator.sub).chunksizes["lat"]) == {1}


# --- flox: where it is installed, xarray gives it grouped reductions of Dask arrays, whose
# engines are NumPy's (pipeline/patches.py, ``xarray-no-flox-on-device``) ---------------------------


def test_flox_keeps_numpy_blocks_and_is_kept_from_device_ones(monkeypatch):
    from xarray.core import _aggregations

    original = _aggregations.contains_only_chunked_or_numpy
    original = getattr(original, "__pipeline_original__", original)
    wrapped = patches._without_flox_on_device(original)
    x = _tas()
    assert wrapped(x) is True and wrapped(x.chunk(CHUNKS)) is True
    monkeypatch.setattr(patches, "on_device", lambda a: hasattr(a, "__dask_graph__"))
    assert wrapped(x) is True  # no Dask array: nothing on the device
    assert wrapped(x.chunk(CHUNKS)) is False
    assert wrapped(x.to_dataset().chunk(CHUNKS)) is False


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["groupby_month_mean", "groupby_season_std", "resample_YS_max", "resample_MS_mean"])
def test_grouped_reductions_on_the_gpu_with_flox_installed(stores, how):
    pytest.importorskip("flox")
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    run = {
        "groupby_month_mean": lambda a: a.groupby("time.month").mean(),
        "groupby_season_std": lambda a: a.groupby("time.season").std(),
        "resample_YS_max": lambda a: a.resample(time="YS").max(),
        "resample_MS_mean": lambda a: a.resample(time="MS").mean(),
    }[how]
    x = _open(stores, backend="gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = run(x).compute()
        want = run(xr.open_zarr(stores("standard"))["tas"].load())  # flox on NumPy
    assert "xarray-no-flox-on-device" in patches._applied
    assert isinstance(got.data, cupy.ndarray)
    np.testing.assert_allclose(got.data.get(), want.values, rtol=2e-5, atol=3e-4, equal_nan=True)
