"""Field ops against xarray (and xclim) in float64, on both backends, with NaNs and chunks that do not divide
the axes."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import assert_close, chunk_types, climate_array, on_backend, raise_if_dask_computes

# the xarray reference warns on the always-missing grid point
pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")

CHUNKINGS = [{"time": 7, "lat": 4, "lon": 5}, {"time": 13}, {"time": 50}, {"time": 1, "lat": 2}]


def ref64(x: xr.DataArray) -> xr.DataArray:
    return x.astype(np.float64).compute()


def assert_same_coords(actual: xr.DataArray, expected: xr.DataArray):
    assert actual.dims == expected.dims
    xr.testing.assert_identical(actual.coords.to_dataset(), expected.coords.to_dataset())


# --- coarsen_mean --------------------------------------------------------------------------------


@pytest.mark.parametrize("factors", [{"time": 4}, {"time": 7, "lat": 2, "lon": 5}, {"lat": 3, "lon": 12}, {"time": 50}])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_coarsen_mean(backend, chunks, factors):
    x = climate_array(chunks=chunks).assign_coords(aux=("lat", np.arange(9.0) ** 2))
    out = pipeline.ops.coarsen_mean(on_backend(x, backend), factors=factors)
    expected = ref64(x).coarsen(factors, boundary="trim").mean()
    assert out.dtype == np.float32 and out.name == x.name and out.attrs["units"] == x.attrs["units"]
    assert out.attrs["cell_methods"] == " ".join(f"{d}:" for d in factors) + " mean"
    assert_same_coords(out, expected)
    assert_close(out, expected)
    assert B.backend_of(out) == backend
    for dim, f in factors.items():  # no window straddles two chunks
        axis = x.dims.index(dim)
        assert sum(out.data.chunks[axis]) == x.sizes[dim] // f


def test_coarsen_mean_all_missing_window_gives_nan(backend):
    x = climate_array(chunks={"time": 6})
    x[3:6] = np.nan
    out = pipeline.ops.coarsen_mean(on_backend(x, backend), factors={"time": 3})
    assert np.isnan(B.to_numpy(out.data)[1]).all()
    assert_close(out, ref64(x).coarsen(time=3, boundary="trim").mean())


# --- detrend -------------------------------------------------------------------------------------


@pytest.mark.parametrize("deg", [1, 2])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_detrend(backend, chunks, deg):
    x = climate_array(chunks=chunks)
    r = ref64(x)
    assert (r.count("time").values[1:, 1:] >= deg + 1).all()  # every point but the land one has a fit
    out = pipeline.ops.detrend(on_backend(x, backend), dim="time", deg=deg)
    expected = r - xr.polyval(r.time, r.polyfit("time", deg).polyfit_coefficients)
    assert out.dtype == np.float32 and out.dims == x.dims
    assert_close(out, expected)
    assert np.isnan(B.to_numpy(out.data)[:, 0, 0]).all()  # the always-missing point stays missing
    assert B.backend_of(out) == backend


def test_detrend_numeric_coordinate_and_degree_zero(backend):
    x = climate_array(chunks={"time": 9, "lon": 5})
    r = ref64(x)
    out = pipeline.ops.detrend(on_backend(x, backend), dim="lon", deg=1)
    assert_close(out, r - xr.polyval(r.lon, r.polyfit("lon", 1).polyfit_coefficients))
    anomaly = pipeline.ops.detrend(on_backend(x, backend), deg=0)
    assert_close(anomaly, r - r.mean("time"))


def test_detrend_too_few_valid_samples_gives_nan(backend):
    x = climate_array(chunks={"time": 7})
    x[:, 1, 1] = np.nan
    x[4, 1, 1] = 280.0  # one valid sample: no unique line through it
    got = B.to_numpy(pipeline.ops.detrend(on_backend(x, backend), deg=1).data)
    assert np.isnan(got[:, 1, 1]).all()
    assert np.isfinite(got[:, 2, 2][~np.isnan(x.values[:, 2, 2])]).all()


# --- quantile ------------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0.5, 0.0, 1.0, 0.37, [0.1, 0.5, 0.9], [0.25]])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_quantile(backend, chunks, q):
    x = climate_array(chunks=chunks)
    out = pipeline.ops.quantile(on_backend(x, backend), q=q, dim="time")
    expected = ref64(x).quantile(q, "time")
    assert out.dtype == np.float32 and out.name == x.name
    assert_same_coords(out, expected)
    assert_close(out, expected)
    assert B.backend_of(out) == backend


def test_quantile_other_dim(backend):
    x = climate_array(chunks={"time": 11, "lat": 4})
    out = pipeline.ops.quantile(on_backend(x, backend), q=[0.05, 0.95], dim="lat")
    expected = ref64(x).quantile([0.05, 0.95], "lat")
    assert_same_coords(out, expected)
    assert_close(out, expected)


# --- saturation_vapor_pressure -------------------------------------------------------------------


def xclim_esat(x: xr.DataArray, method: str) -> xr.DataArray:
    xclim_indices = pytest.importorskip("xclim.indices")
    return xclim_indices.saturation_vapor_pressure(ref64(x), method=method)


@pytest.mark.parametrize("method", ["sonntag90", "tetens30"])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_saturation_vapor_pressure(backend, chunks, method):
    x = climate_array(chunks=chunks)
    out = pipeline.ops.saturation_vapor_pressure(on_backend(x, backend), method=method)
    expected = xclim_esat(x, method)
    assert out.dtype == np.float32 and out.dims == x.dims and out.attrs["units"] == "Pa"
    assert_close(out, expected)
    assert B.backend_of(out) == backend


@pytest.mark.parametrize("units", ["degC", "°C"])
def test_saturation_vapor_pressure_from_celsius(backend, units):
    x = (climate_array(chunks={"time": 13}) - 273.15).astype(np.float32).assign_attrs(units=units)
    out = pipeline.ops.saturation_vapor_pressure(on_backend(x, backend), method="tetens30")
    assert_close(out, xclim_esat(x, "tetens30"))


# --- all ops: dtypes, eager input, GPU residency, errors, properties ------------------------------


def _all_ops(x):
    return {
        "coarsen_mean": pipeline.ops.coarsen_mean(x, factors={"time": 4, "lon": 3}),
        "detrend": pipeline.ops.detrend(x, deg=1),
        "quantile": pipeline.ops.quantile(x, q=[0.2, 0.8]),
        "saturation_vapor_pressure": pipeline.ops.saturation_vapor_pressure(x),
    }


def test_float64_input_gives_float64_and_int_input_float64(backend):
    x = climate_array(chunks={"time": 9}, dtype=np.float64)
    for name, out in _all_ops(on_backend(x, backend)).items():
        assert out.dtype == np.float64, name
    xi = (climate_array(nan_fraction=0.0, chunks={"time": 9}).fillna(0)).astype(np.int32)
    out = pipeline.ops.coarsen_mean(on_backend(xi, backend), factors={"time": 4})
    assert out.dtype == np.float64
    assert_close(out, ref64(xi).coarsen(time=4, boundary="trim").mean(), atol=1e-9)
    q = pipeline.ops.quantile(on_backend(xi, backend), q=0.3)
    assert q.dtype == np.float64
    assert_close(q, ref64(xi).quantile(0.3, "time"), atol=1e-9)


def test_eager_input_gives_eager_output():
    x = climate_array()
    lazy = _all_ops(x.chunk({"time": 7}))
    for name, out in _all_ops(x).items():
        assert isinstance(out.data, np.ndarray), name
        assert_close(out, lazy[name].compute())


def test_ops_only_build_the_graph(backend):
    x = on_backend(climate_array(chunks={"time": 7}), backend)
    with raise_if_dask_computes():
        _all_ops(x)


def test_quantile_zero_dim_array_is_a_scalar_q():
    x = climate_array(chunks={"time": 7})
    out = pipeline.ops.quantile(x, q=np.float64(0.5))
    assert out.dims == ("lat", "lon") and float(out["quantile"]) == 0.5


def test_gpu_results_stay_on_gpu():
    pytest.importorskip("cupy")
    if not B.gpu_available():
        pytest.skip("no GPU")
    import cupy

    x = on_backend(climate_array(chunks={"time": 7, "lat": 4}), "gpu")
    outs = {
        **_all_ops(x),
        "quantile_scalar": pipeline.ops.quantile(x, q=0.5),
        "tetens30": pipeline.ops.saturation_vapor_pressure(x, method="tetens30"),
        "detrend_2": pipeline.ops.detrend(x, deg=2),
    }
    for name, out in outs.items():
        assert isinstance(out.data._meta, cupy.ndarray), name
        assert chunk_types(out) == {cupy.ndarray}, name


test_gpu_results_stay_on_gpu = pytest.mark.gpu(test_gpu_results_stay_on_gpu)


def test_bad_parameters_name_what_is_wrong():
    x = climate_array(chunks={"time": 10})
    with pytest.raises(InputError, match="no dimension 'tim'"):
        pipeline.ops.coarsen_mean(x, factors={"tim": 2})
    with pytest.raises(InputError, match="factor of dimension 'lat' must be a positive integer, got 0"):
        pipeline.ops.coarsen_mean(x, factors={"lat": 0})
    with pytest.raises(InputError, match="factor of dimension 'lat' must be a positive integer, got 2.5"):
        pipeline.ops.coarsen_mean(x, factors={"lat": 2.5})
    with pytest.raises(InputError, match=r"factor of dimension 'lat' \(10\) exceeds its size \(9\)"):
        pipeline.ops.coarsen_mean(x, factors={"lat": 10})
    with pytest.raises(InputError, match="non-empty mapping"):
        pipeline.ops.coarsen_mean(x, factors={})
    with pytest.raises(InputError, match="no dimension 'tim'"):
        pipeline.ops.detrend(x, dim="tim")
    with pytest.raises(InputError, match="deg must be a non-negative integer"):
        pipeline.ops.detrend(x, deg=-1)
    with pytest.raises(InputError, match="no dimension 'tim'"):
        pipeline.ops.quantile(x, q=0.5, dim="tim")
    for q in (1.5, -0.1, [0.5, 2.0], []):
        with pytest.raises(InputError, match=r"q must lie in \[0, 1\]"):
            pipeline.ops.quantile(x, q=q)
    with pytest.raises(InputError, match="has units 'hPa'"):
        pipeline.ops.saturation_vapor_pressure(x.assign_attrs(units="hPa"))
    with pytest.raises(InputError, match="has units None"):
        pipeline.ops.saturation_vapor_pressure(x.drop_attrs())
    with pytest.raises(InputError, match="method must be one of sonntag90, tetens30"):
        pipeline.ops.saturation_vapor_pressure(x, method="goffgratch46")


def test_registry_lists_the_field_ops():
    for name in ("coarsen_mean", "detrend", "quantile", "saturation_vapor_pressure"):
        op = pipeline.ops.get(name)
        assert op.backends == ("cpu", "gpu")
        assert all(op.kernel(k, "cpu") is not None for k in op.kernels["cpu"])
    assert pipeline.ops.get("coarsen_mean").params(factors={"time": 4}).factors == {"time": 4}
    assert pipeline.ops.get("quantile").params(q=[0.1, 0.9]).q == [0.1, 0.9]
    assert pipeline.ops.get("detrend").parameters()["deg"]["default"] == 1
    assert pipeline.ops.get("coarsen_mean").description.startswith("Mean over non-overlapping blocks")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nt=st.integers(2, 30),
    tchunk=st.integers(1, 30),
    ychunk=st.integers(1, 5),
    tfactor=st.integers(1, 6),
    yfactor=st.integers(1, 5),
    q=st.one_of(st.floats(0, 1), st.lists(st.floats(0, 1), min_size=1, max_size=3)),
    nan_fraction=st.sampled_from([0.0, 0.3, 0.9]),
)
def test_any_chunking_equals_eager_numpy(nt, tchunk, ychunk, tfactor, yfactor, q, nan_fraction):
    """The chunked result equals xarray's eager float64 result for any chunking."""
    x = climate_array(shape=(nt, 5, 3), nan_fraction=nan_fraction, seed=nt)
    xc = x.chunk({"time": tchunk, "lat": ychunk})
    r = ref64(x)
    factors = {"time": min(tfactor, nt), "lat": yfactor}
    out = pipeline.ops.coarsen_mean(xc, factors=factors)
    expected = r.coarsen(factors, boundary="trim").mean()
    assert_same_coords(out, expected)
    assert_close(out, expected)
    out = pipeline.ops.quantile(xc, q=q)
    expected = r.quantile(q, "time")
    assert_same_coords(out, expected)
    assert_close(out, expected)
