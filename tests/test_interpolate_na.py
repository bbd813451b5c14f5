"""xarray's ``interpolate_na`` on device data (pipeline/patches.py, pipeline/kernels/duck.py):
``method="linear"`` and ``"nearest"``, with ``limit`` and ``max_gap`` (a number, or a timedelta on
a datetime or cftime axis), equal to xarray's on NumPy, edge gaps included. The device path runs
here with NumPy standing in for CuPy, and on a GPU where there is one."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from xarray.core import missing

import pipeline
from pipeline import backend as B
from pipeline import patches
from pipeline.errors import InputError
from pipeline.kernels import duck

N = 40


def sample(dtype="float32"):
    rng = np.random.default_rng(6)
    y = rng.standard_normal((N, 4, 3)).astype(dtype)
    y[rng.random(y.shape) < 0.4] = np.nan
    y[:6, 0, 0] = np.nan  # a gap first
    y[-5:, 1, 1] = np.nan  # and last
    y[:, 2, 2] = np.nan  # no value
    y[:, 3, 0] = np.nan
    y[7, 3, 0] = 1.0  # one value
    y[:, 3, 1] = 2.0  # no gap
    return y


AXES = {
    "number": (np.sort(np.random.default_rng(1).random(N)) * 10, 1.5),
    "datetime": (pd.date_range("2000-01-01", periods=N, freq="6h"), pd.Timedelta("18h")),
    "noleap": (xr.date_range("2000-01-01", periods=N, freq="D", calendar="noleap", use_cftime=True),
               dt.timedelta(days=2)),
    "360_day": (xr.date_range("2000-01-01", periods=N, freq="D", calendar="360_day", use_cftime=True),
                np.timedelta64(3, "D")),
}


def test_nearest_is_xarrays_and_scipys_at_half_way():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 4.5, 10.0])
    y = np.array([[np.nan, 1.0, np.nan, 3.0, np.nan, np.nan, 7.0]], dtype="float32")  # 2.0 and 4.0: half way
    want = xr.DataArray(y, dims=("a", "t"), coords={"t": x}).interpolate_na("t", method="nearest").values
    got = duck.interp_na(y, x, "nearest")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [[np.nan, 1.0, 1.0, 3.0, 3.0, 3.0, 7.0]])
    assert got.dtype == np.float32


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_device_functions_are_xarrays(dtype):
    y = np.moveaxis(sample(dtype), 0, -1)
    x = AXES["number"][0]
    da = xr.DataArray(y, dims=("a", "b", "t"), coords={"t": x})
    for method in ("linear", "nearest"):
        want = da.interpolate_na("t", method=method).values
        got = duck.interp_na(y, x, method)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    lengths = duck.nan_block_lengths(y, x)
    np.testing.assert_array_equal(lengths, missing._get_nan_block_lengths(da, "t", x).values)
    assert np.isnan(lengths[2, 2]).all() and (lengths[3, 1] == 0).all()


@pytest.fixture
def interpolate(monkeypatch):
    """xarray's interp_na with pipeline's change, NumPy standing in for CuPy (a Dask array of NumPy
    blocks is then device data)."""
    wrapped = patches.PATCHES["xarray-interpolate-na"].make(missing.interp_na)

    def run(x, dim, **kwargs):
        monkeypatch.setattr(patches, "_cupy", lambda: np)
        try:
            out = wrapped(x, dim, **kwargs)
            assert out.chunks is not None  # lazy
            return out.compute()
        finally:
            monkeypatch.setattr(patches, "_cupy", lambda: None)

    return run


CASES = [
    {}, {"limit": 2}, {"method": "nearest"}, {"method": "nearest", "limit": 1},
    {"max_gap": "gap"}, {"max_gap": "gap", "limit": 1}, {"method": "nearest", "max_gap": "gap"},
    {"use_coordinate": False, "max_gap": 2}, {"use_coordinate": False, "method": "nearest"},
]


@pytest.mark.parametrize("axis", sorted(AXES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_device_interpolate_na_is_xarrays(interpolate, axis, case):
    coord, gap = AXES[axis]
    kwargs = {k: gap if v == "gap" else v for k, v in CASES[case].items()}
    x = xr.DataArray(sample(), dims=("time", "a", "b"), coords={"time": coord}, attrs={"units": "K"}, name="tas")
    x = x.chunk(time=-1, a=3)
    want = missing.interp_na(x.compute(), "time", **kwargs)
    got = interpolate(x, "time", **kwargs)
    xr.testing.assert_identical(got, want)
    if "max_gap" in kwargs:  # gaps longer than max_gap stay
        assert np.isnan(got.values).sum() > np.isnan(missing.interp_na(x.compute(), "time").values).sum()


def test_device_interpolate_na_refuses_what_xarray_refuses_and_other_methods_by_name(interpolate):
    x = xr.DataArray(sample(), dims=("time", "a", "b"), coords={"time": AXES["datetime"][0]}).chunk(time=-1)
    for method in ("cubic", "pchip", "akima"):
        with pytest.raises(NotImplementedError, match=f"method='{method}' is not available on the GPU backend") as e:
            interpolate(x, "time", method=method)
        assert isinstance(e.value, InputError)
    with pytest.raises(NotImplementedError, match="fill_value.*GPU backend"):
        interpolate(x, "time", fill_value="extrapolate")
    with pytest.raises(ValueError, match="spam is not a valid interpolator"):
        interpolate(x, "time", method="spam")
    with pytest.raises(ValueError, match="max_gap must be a scalar"):
        interpolate(x, "time", max_gap=[1, 2])
    with pytest.raises(TypeError, match="Expected integer or floating point max_gap"):
        interpolate(x, "time", max_gap=pd.Timedelta("1D"), use_coordinate=False)
    with pytest.raises(NotImplementedError, match="max_gap not implemented for unlabeled"):
        interpolate(x.drop_vars("time"), "time", max_gap=2)
    with pytest.raises(ValueError, match="consists of multiple chunks"):
        interpolate(x.chunk(time=7), "time", max_gap=pd.Timedelta("1D"))


def test_numpy_data_goes_to_xarray():
    wrapped = patches.PATCHES["xarray-interpolate-na"].make(missing.interp_na)
    x = xr.DataArray(sample("float64"), dims=("time", "a", "b"), coords={"time": AXES["number"][0]})
    for kwargs in ({"method": "cubic"}, {"method": "nearest", "max_gap": 1.0}):
        xr.testing.assert_identical(wrapped(x.chunk(time=-1), "time", **kwargs).compute(),
                                    missing.interp_na(x, "time", **kwargs))


@pytest.mark.gpu
@pytest.mark.parametrize("axis", ["datetime", "noleap"])
def test_interpolate_na_on_the_gpu_is_xarrays_and_stays_there(tmp_path, axis):
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    coord, gap = AXES[axis]
    x = xr.DataArray(sample(), dims=("time", "a", "b"), coords={"time": coord}, name="tas")
    x.to_dataset().chunk(time=-1, a=3).to_zarr(tmp_path / "t.zarr")
    g = pipeline.open_dataset(tmp_path / "t.zarr", backend="gpu", chunks={"time": -1, "a": 3})["tas"]
    for kwargs in ({"max_gap": gap}, {"method": "nearest", "limit": 2, "max_gap": gap}):
        got = g.interpolate_na("time", **kwargs)
        assert isinstance(got.data._meta, cupy.ndarray)
        got = got.compute()
        assert isinstance(got.data, cupy.ndarray)
        want = x.interpolate_na("time", **kwargs)
        np.testing.assert_array_equal(got.data.get(), want.values)
