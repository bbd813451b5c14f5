"""xarray's ``rolling_exp`` on device data (pipeline/patches.py, pipeline/kernels/ewm.py).

xarray computes ``rolling_exp`` by numbagg's NumPy-only gufuncs, and refuses any data without
numbagg. On device data pipeline's kernel runs instead (numbagg or not). Here the kernel runs on
NumPy arrays in Numba's CUDA simulator, and the device path with NumPy standing in for CuPy,
against :func:`reference` (numbagg's definitions, written again in NumPy, float64), and against
numbagg and xarray themselves where numbagg is installed (CI has no numbagg).
"""

from __future__ import annotations

import importlib.util

import dask
import numpy as np
import pytest
import xarray as xr
from xarray.computation import rolling_exp as rx

import pipeline
from pipeline import backend as B
from pipeline import patches
from pipeline.kernels import ewm

HAS_NUMBAGG = importlib.util.find_spec("numbagg") is not None
WINDOWS = {"span": 5, "alpha": 0.3, "com": 2.0, "halflife": 3}


def reference(a, alpha: float, min_weight: float, how: str, b=None):
    """numbagg's ``move_exp_nan{how}`` along the first axis, every column at once: decayed sums
    of the values that are not NaN (of the pairs, for cov and corr), their decayed count and
    the count's square's decay (the bias of the variance), and the decayed weight that
    ``min_weight`` bounds."""
    a = np.asarray(a, dtype=np.float64)
    b = a if b is None else np.asarray(b, dtype=np.float64)
    decay = 1.0 - alpha
    zeros = np.zeros(a.shape[1:])
    s1, s2, sxx, syy, sxy, n, n2, weight = (zeros.copy() for _ in range(8))
    seen = np.zeros(a.shape[1:], dtype=bool)
    out = np.full(a.shape, np.nan)
    for t in range(a.shape[0]):
        ok = ~np.isnan(a[t]) & (~np.isnan(b[t]) if how in ("cov", "corr") else True)
        x, y = np.where(ok, a[t], 0.0), np.where(ok, b[t], 0.0)
        s1, s2 = s1 * decay + x, s2 * decay + y
        sxx, syy, sxy = sxx * decay + x * x, syy * decay + y * y, sxy * decay + x * y
        n, n2 = n * decay + ok, n2 * decay**2 + ok
        weight = weight * decay + np.where(ok, alpha, 0.0)
        seen |= ok
        with np.errstate(invalid="ignore", divide="ignore"):
            bias = 1 - n2 / n**2
            var = (sxx / n - (s1 / n) ** 2) / bias
            cov = (sxy - s1 * s2 / n) / n / bias
            both = (sxx - s1**2 / n) * (syy - s2**2 / n)
            value = {
                "mean": s1 / n,
                "sum": np.where(seen, s1, np.nan),
                "var": np.where(bias > 0, var, np.nan),
                "std": np.where((bias > 0) & (var >= 0), np.sqrt(np.abs(var)), np.nan),
                "cov": np.where(bias > 0, cov, np.nan),
                "corr": np.where((bias > 0) & (both > 0), (sxy - s1 * s2 / n) / np.sqrt(np.abs(both)), np.nan),
            }[how]
        out[t] = np.where(weight >= min_weight, value, np.nan)
    return out


def sample(shape=(40, 9), dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 10 + 280).astype(dtype)
    if a.dtype.kind == "f":
        a[rng.random(shape) < 0.25] = np.nan
        a[:, 2] = np.nan  # no value
        a[:12, 3] = np.nan  # a long gap first
        a[1:, 4] = np.nan  # one value
    return a


@pytest.mark.cudasim
@pytest.mark.parametrize("how", ewm.HOWS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_kernel_is_numbaggs_definition(how, dtype):
    a, b = sample(dtype=dtype), sample(seed=1, dtype="float64")
    other = b if how in ewm.TWO else None
    for alpha, min_weight in ((0.3, 0.0), (0.1, 0.5), (1.0, 0.0)):
        got = ewm.move_exp(a.T, alpha, min_weight, how, None if other is None else other.T)  # time last, as xarray
        want = reference(a, alpha, min_weight, how, other).T
        assert got.dtype == np.float64 and got.shape == a.T.shape
        assert (np.isnan(got) == np.isnan(want)).all(), (alpha, min_weight)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, equal_nan=True)
        if HAS_NUMBAGG:
            import numbagg

            kwargs = {"min_weight": min_weight} if min_weight else {}
            args = (a.T,) if other is None else (a.T, other.T)
            np.testing.assert_array_equal(got, getattr(numbagg, f"move_exp_nan{how}")(*args, alpha=alpha, **kwargs))


@pytest.mark.cudasim
def test_kernel_takes_any_axis_and_refuses_complex():
    a = sample(shape=(6, 11, 4))
    got = ewm.move_exp(a, 0.4, 0.0, "mean", axis=1)
    want = np.moveaxis(reference(np.moveaxis(a, 1, 0).reshape(11, -1), 0.4, 0.0, "mean").reshape(11, 6, 4), 0, 1)
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    assert ewm.move_exp(np.empty((0, 3)), 0.5, 0.0, "sum", axis=0).shape == (0, 3)
    with pytest.raises(TypeError, match="complex"):
        ewm.move_exp(np.ones(3, dtype=complex), 0.5)


@pytest.fixture
def on_device(monkeypatch):
    """xarray's RollingExp with pipeline's changes, and NumPy standing in for CuPy (a Dask array
    of NumPy blocks is then device data); one task at a time, as the simulator runs kernels."""
    monkeypatch.setattr(patches, "_cupy", lambda: np)
    for name, patch in patches.PATCHES.items():
        if name.startswith("xarray-rolling-exp"):
            attribute = patch.attribute.split(".")[1]
            monkeypatch.setattr(rx.RollingExp, attribute, patch.make(getattr(rx.RollingExp, attribute)))
    with dask.config.set(scheduler="synchronous"):
        yield


def _array(chunks=None):
    a = sample(shape=(30, 5, 3), seed=3)
    x = xr.DataArray(a, dims=("time", "y", "x"), coords={"time": np.arange(30.0), "y": np.arange(5)},
                     attrs={"units": "K"}, name="tas")
    return x.chunk(chunks or {"time": -1, "y": 2})


def _alpha(window_type, window):
    return rx._get_alpha(**{window_type: window})


@pytest.mark.cudasim
@pytest.mark.parametrize("window_type", sorted(WINDOWS))
def test_device_rolling_exp_is_numbaggs_definition_without_numbagg(on_device, window_type):
    x = _array()
    window = WINDOWS[window_type]
    alpha = _alpha(window_type, window)
    host = x.values.reshape(30, -1)
    for how in ewm.HOWS:
        r = x.rolling_exp(time=window, window_type=window_type)
        got = getattr(r, how)(x.shift(time=1)) if how in ewm.TWO else getattr(r, how)()
        assert got.chunks is not None and got.dims == x.dims  # lazy, xarray's order of dimensions
        got = got.compute()
        other = x.shift(time=1).values.reshape(30, -1) if how in ewm.TWO else None
        want = reference(host, alpha, 0.0, how, other).reshape(x.shape)
        assert got.dtype == np.float64 and got.attrs == {"units": "K"}
        np.testing.assert_allclose(got.values, want, rtol=1e-9, atol=1e-9, equal_nan=True)
    got = rx.RollingExp(x, {"time": window}, window_type, min_weight=0.7).mean().compute()
    np.testing.assert_allclose(got.values, reference(host, alpha, 0.7, "mean").reshape(x.shape), rtol=1e-12,
                               equal_nan=True)
    assert np.isnan(got.values[0]).all() and not np.isnan(got.values).all()
    assert x.rolling_exp(time=window, window_type=window_type).mean(keep_attrs=False).compute().attrs == {}


@pytest.mark.cudasim
@pytest.mark.skipif(not HAS_NUMBAGG, reason="numbagg is not installed")
def test_device_rolling_exp_is_xarrays_with_numbagg(on_device, monkeypatch):
    x = _array()
    ds = x.to_dataset().assign(other=x * 2)
    got = {how: getattr(x.rolling_exp(time=5), how)(*((x.shift(time=1),) if how in ewm.TWO else ())).compute()
           for how in ewm.HOWS}
    got["dataset"] = ds.rolling_exp(time=0.2, window_type="alpha").sum().compute()
    got["min_weight"] = rx.RollingExp(x, {"time": 4}, "com", min_weight=0.5).std().compute()
    monkeypatch.setattr(patches, "_cupy", lambda: None)  # NumPy data: xarray's own functions
    x = x.compute()
    for how in ewm.HOWS:
        want = getattr(x.rolling_exp(time=5), how)(*((x.shift(time=1),) if how in ewm.TWO else ()))
        xr.testing.assert_identical(got[how], want)
    xr.testing.assert_identical(got["dataset"], ds.compute().rolling_exp(time=0.2, window_type="alpha").sum())
    xr.testing.assert_identical(got["min_weight"], rx.RollingExp(x, {"time": 4}, "com", min_weight=0.5).std())


def test_device_rolling_exp_refuses_what_xarray_refuses(on_device):
    with pytest.raises(ValueError, match="consists of multiple chunks"):
        _array({"time": 7}).rolling_exp(time=3).mean()
    with pytest.raises(ValueError, match="span must satisfy"):
        _array().rolling_exp(time=0.5).mean()
    with pytest.raises(TypeError, match="spam"):
        _array().rolling_exp(time=3, window_type="spam")


def test_numpy_data_keeps_xarrays_behaviour(monkeypatch):
    """With NumPy data the wrappers call xarray's RollingExp: without numbagg it refuses, as xarray."""
    for name, patch in patches.PATCHES.items():
        if name.startswith("xarray-rolling-exp"):
            attribute = patch.attribute.split(".")[1]
            monkeypatch.setattr(rx.RollingExp, attribute, patch.make(getattr(rx.RollingExp, attribute)))
    x = _array().compute()
    if not HAS_NUMBAGG:
        with pytest.raises(ImportError, match="numbagg"):
            x.rolling_exp(time=5)
        with pytest.raises(ImportError, match="numbagg"):
            x.chunk(time=-1).rolling_exp(time=5)
        return
    got = x.chunk(time=-1).rolling_exp(time=5).mean()
    assert got.chunks is not None
    np.testing.assert_array_equal(got.values, x.rolling_exp(time=5).mean().values)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ewm.HOWS)
def test_rolling_exp_on_the_gpu_is_numbaggs_definition_and_stays_there(tmp_path, how):
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    x = _array().compute()
    x.to_dataset().chunk(time=-1, y=2).to_zarr(tmp_path / "t.zarr")
    g = pipeline.open_dataset(tmp_path / "t.zarr", backend="gpu", chunks={"time": -1, "y": 2})["tas"]
    r = g.rolling_exp(time=3.5, window_type="halflife")
    got = getattr(r, how)(g.shift(time=1)) if how in ewm.TWO else getattr(r, how)()
    assert isinstance(got.data._meta, cupy.ndarray)
    got = got.compute()
    assert isinstance(got.data, cupy.ndarray)
    other = x.shift(time=1).values.reshape(30, -1) if how in ewm.TWO else None
    want = reference(x.values.reshape(30, -1), _alpha("halflife", 3.5), 0.0, how, other).reshape(x.shape)
    np.testing.assert_allclose(got.data.get(), want, rtol=1e-9, atol=1e-9, equal_nan=True)
