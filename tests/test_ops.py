"""Every op against xarray in float64, on both backends, with NaNs and chunks that do not divide the axes."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import assert_close, chunk_types, climate_array, on_backend

CHUNKINGS = [{"time": 7, "lat": 4, "lon": 5}, {"time": 13}, {"time": 50}, {"time": 1, "lat": 2}]


def ref64(x: xr.DataArray) -> xr.DataArray:
    return x.astype(np.float64).compute()


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_standardized_anomaly(backend, chunks):
    x = climate_array(chunks=chunks)
    out = pipeline.ops.standardized_anomaly(on_backend(x, backend), dim="time")
    r = ref64(x)
    expected = (r - r.mean("time")) / r.std("time")
    assert out.dtype == np.float32 and out.dims == x.dims
    assert_close(out, expected, atol=2e-6 * 4)
    assert B.backend_of(out) == backend


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_weighted_mean_coslat(backend, chunks):
    x = climate_array(chunks=chunks)
    out = pipeline.ops.weighted_mean(on_backend(x, backend), dims=("lat", "lon"), weights="coslat")
    r = ref64(x)
    expected = r.weighted(np.cos(np.deg2rad(r.lat))).mean(("lat", "lon"))
    assert out.dims == ("time",)
    assert_close(out, expected)
    assert B.backend_of(out) == backend


def test_weighted_mean_other_weights_and_dims(backend):
    x = climate_array(chunks={"time": 11, "lon": 5})
    w = xr.DataArray(np.linspace(1, 2, x.sizes["lon"]), dims="lon")
    got = pipeline.ops.weighted_mean(on_backend(x, backend), dims="lon", weights=w)
    assert_close(got, ref64(x).weighted(w).mean("lon"))
    plain = pipeline.ops.weighted_mean(on_backend(x, backend), dims=("time", "lat"), weights=None)
    assert_close(plain, ref64(x).mean(("time", "lat")))


def test_weighted_mean_all_missing_gives_nan(backend):
    x = climate_array(chunks={"time": 5})
    x = x.where(x.time != x.time[3])  # one step entirely missing
    out = pipeline.ops.weighted_mean(on_backend(x, backend))
    assert np.isnan(B.to_numpy(out.data)[3])


@pytest.mark.parametrize(
    "window,center,min_periods",
    [(1, False, None), (3, False, None), (8, False, None), (8, False, 3), (5, True, None), (4, True, 2), (12, True, 1)],
)
@pytest.mark.parametrize("chunks", [{"time": 7, "lat": 4}, {"time": 3}])
def test_rolling_mean(backend, window, center, min_periods, chunks):
    x = climate_array(chunks=chunks)
    out = pipeline.ops.rolling_mean(
        on_backend(x, backend), dim="time", window=window, center=center, min_periods=min_periods
    )
    expected = ref64(x).rolling(time=window, center=center, min_periods=min_periods).mean()
    assert out.dtype == np.float32
    assert_close(out, expected)


def test_rolling_mean_other_axis(backend):
    x = climate_array(chunks={"lon": 5})
    out = pipeline.ops.rolling_mean(on_backend(x, backend), dim="lon", window=4, center=True, min_periods=1)
    assert_close(out, ref64(x).rolling(lon=4, center=True, min_periods=1).mean())


def test_float64_and_int_inputs(backend):
    x = climate_array(chunks={"time": 9}, dtype=np.float64)
    out = pipeline.ops.rolling_mean(on_backend(x, backend), window=3)
    assert out.dtype == np.float64
    xi = (climate_array(nan_fraction=0.0, chunks={"time": 9}).fillna(0) * 10).astype(np.int32)
    zi = pipeline.ops.standardized_anomaly(on_backend(xi, backend))
    r = ref64(xi)
    assert zi.dtype == np.float64
    assert_close(zi, (r - r.mean("time")) / r.std("time"), atol=1e-9)


def test_gpu_results_stay_on_gpu():
    pytest.importorskip("cupy")
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    x = on_backend(climate_array(chunks={"time": 7}), "gpu")
    for out in (
        pipeline.ops.standardized_anomaly(x),
        pipeline.ops.rolling_mean(x, window=5),
        pipeline.ops.weighted_mean(x),
    ):
        assert isinstance(out.data._meta, cupy.ndarray)
        assert chunk_types(out) == {cupy.ndarray}


test_gpu_results_stay_on_gpu = pytest.mark.gpu(test_gpu_results_stay_on_gpu)


def test_eager_input_gives_eager_output():
    x = climate_array()
    out = pipeline.ops.rolling_mean(x, window=3)
    assert isinstance(out.data, np.ndarray)
    assert_close(out, ref64(x).rolling(time=3).mean())


def test_bad_parameters_name_what_is_wrong():
    x = climate_array(chunks={"time": 10})
    with pytest.raises(InputError, match="no dimension 'tim'"):
        pipeline.ops.standardized_anomaly(x, dim="tim")
    with pytest.raises(InputError, match="window must be a positive integer"):
        pipeline.ops.rolling_mean(x, window=0)
    with pytest.raises(InputError, match="min_periods"):
        pipeline.ops.rolling_mean(x, window=3, min_periods=4)
    with pytest.raises(InputError, match="weights"):
        pipeline.ops.weighted_mean(x, weights="nonsense")
    with pytest.raises(InputError, match="latitude"):
        no_lat = x.rename(lat="y").assign_coords(y=np.arange(x.sizes["lat"]))
        pipeline.ops.weighted_mean(no_lat, dims=("y", "lon"))


def test_registry_lists_backends_and_names_missing_ones():
    op = pipeline.ops.get("rolling_mean")
    assert op.backends == ("cpu", "gpu")
    assert op.parameters()["window"]["required"]
    with pytest.raises(KeyError, match="unknown op 'nope'"):
        pipeline.ops.get("nope")
    assert op.kernels == {"cpu": ("rolling_mean",), "gpu": ("rolling_mean",)}
    assert op.kernel("rolling_mean", "cpu").name == "rolling_mean"
    with pytest.raises(NotImplementedError, match="'rolling_mean' has no cpu kernel 'moments'"):
        op.kernel("moments", "cpu")  # a kernel the op does not declare
    bare = pipeline.ops.Op("bare", lambda x: x, "", op.params, {"cpu": ("rolling_mean",)})
    assert bare.backends == ("cpu",)
    with pytest.raises(NotImplementedError, match="'bare' has no gpu kernel 'rolling_mean'"):
        bare.kernel("rolling_mean", "gpu")
    missing = pipeline.ops.Op("missing", lambda x: x, "", op.params, {"cpu": ("nope",), "gpu": ("rolling_mean",)})
    assert missing.backends == ("gpu",)  # a backend counts only where every kernel the op declares exists


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nt=st.integers(2, 40),
    tchunk=st.integers(1, 40),
    ychunk=st.integers(1, 5),
    window=st.integers(1, 9),
    center=st.booleans(),
    nan_fraction=st.sampled_from([0.0, 0.3, 0.9]),
)
def test_any_chunking_equals_eager_numpy(nt, tchunk, ychunk, window, center, nan_fraction):
    """flox's central property: the chunked result equals the eager result for any chunking."""
    x = climate_array(shape=(nt, 5, 3), nan_fraction=nan_fraction, seed=nt)
    xc = x.chunk({"time": tchunk, "lat": ychunk})
    r = ref64(x)
    window = min(window, nt)
    assert_close(
        pipeline.ops.rolling_mean(xc, window=window, center=center, min_periods=1),
        r.rolling(time=window, center=center, min_periods=1).mean(),
    )
    with np.errstate(all="ignore"):
        expected = (r - r.mean("time")) / r.std("time")
    assert_close(pipeline.ops.standardized_anomaly(xc), expected, atol=1e-5)
    assert_close(pipeline.ops.weighted_mean(xc), r.weighted(np.cos(np.deg2rad(r.lat))).mean(("lat", "lon")))


def test_weighted_means_with_different_weights_computed_together_stay_apart():
    # weights that travel with each task are part of the task's identity: two weighted means of
    # the same data must not share keys
    import dask

    x = climate_array(shape=(40, 6, 8), chunks={"time": 7})
    w1 = xr.DataArray(np.linspace(1, 2, 6), dims="lat")
    w2 = xr.DataArray(np.linspace(3, 1, 6), dims="lat")
    a, b = (pipeline.ops.weighted_mean(x, dims=["lat", "lon"], weights=w) for w in (w1, w2))
    assert a.data.name != b.data.name
    got_a, got_b = dask.compute(a, b)
    for got, w in ((got_a, w1), (got_b, w2)):
        ref = x.astype(np.float64).weighted(w).mean(["lat", "lon"])
        np.testing.assert_allclose(got.values, ref.values, rtol=1e-6)
