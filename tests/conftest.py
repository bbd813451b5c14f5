"""Shared fixtures: both backends for every test, the CUDA simulator where no GPU is visible."""

from __future__ import annotations

import os
import warnings

from pipeline import backend as B

# Without a GPU, Numba's CUDA kernels run in its simulator, so their logic is tested on every
# run. This must be set before numba.cuda is first imported.
if not B.gpu_available():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# The suite's processes (pytest-xdist's workers and the commands they start) share one GPU: each
# CUDA context takes its hardware work queues from the GPU's, and with 32 a context (what a run
# over zarr's default store takes) some 28 such processes made new contexts fail. Commands
# started here keep CUDA's default; the tests of the queues set them explicitly.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("DASK_PIPELINE__GPU__HARDWARE_QUEUES", "null")

import dask  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402

HAS_GPU = B.gpu_available()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible to CuPy")

BACKENDS = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, requires_gpu])]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU visible to CuPy"))


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(autouse=True)
def _quiet_consolidated_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*consolidated metadata.*")
        yield


class _Raise:
    def __call__(self, dsk, keys, **kwargs):
        raise RuntimeError("a dask graph was computed while it should only have been built")


def raise_if_dask_computes():
    """As xarray's test helper: any compute inside the block raises."""
    return dask.config.set(scheduler=_Raise())


def climate_array(
    shape=(50, 9, 12), chunks=None, nan_fraction=0.1, seed=0, dtype=np.float32, name="tas"
) -> xr.DataArray:
    """A (time, lat, lon) array around 280 K with seasonal signal, noise and scattered NaNs."""
    rng = np.random.default_rng(seed)
    nt, ny, nx = shape
    t = np.arange(nt)[:, None, None]
    data = 280 + 10 * np.sin(2 * np.pi * t / 37.0) + rng.standard_normal(shape) * 3
    data[rng.random(shape) < nan_fraction] = np.nan
    if ny > 1 and nx > 1:
        data[:, 0, 0] = np.nan  # a grid point that is always missing (land)
    lat = np.linspace(-80, 80, ny)
    arr = xr.DataArray(
        data.astype(dtype),
        dims=("time", "lat", "lon"),
        coords={
            "time": np.arange(np.datetime64("2000-01-01"), np.datetime64("2000-01-01") + nt),
            "lat": ("lat", lat, {"units": "degrees_north"}),
            "lon": np.linspace(0, 330, nx),
        },
        name=name,
        attrs={"units": "K"},
    )
    return arr.chunk(chunks) if chunks else arr


def on_backend(arr: xr.DataArray, backend: str) -> xr.DataArray:
    return arr.copy(data=B.to_backend(arr.data, backend))


def assert_close(actual: xr.DataArray, expected: xr.DataArray, rtol=2e-6, atol=None):
    """Equal within float32 rounding, NaN where the reference is NaN."""
    a = B.to_numpy(actual.data)
    e = np.asarray(expected.values, dtype=np.float64)
    assert a.shape == e.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg="NaN pattern differs")
    scale = np.nanmax(np.abs(e)) if np.isfinite(e).any() else 1.0
    tol = atol if atol is not None else 4 * np.finfo(np.float32).eps * max(scale, 1.0)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=tol, equal_nan=True)


def chunk_types(arr: xr.DataArray) -> set[type]:
    """Types of the computed chunks: a silent copy to the host shows up here."""
    blocks = arr.data.to_delayed().ravel()
    return {type(b) for b in dask.compute(*blocks)}
