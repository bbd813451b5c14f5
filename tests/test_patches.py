"""pipeline's changes to dask and xarray (pipeline/patches.py): each target is still the function
it was written against on the versions installed, the device versions of xarray's chunk functions
(pipeline/kernels/duck.py) give xarray's, NumPy's and bottleneck's results, NumPy data goes to the
originals, and the setting turns them off."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from pipeline import config, patches
from pipeline.errors import InputError
from pipeline.kernels import duck

from .conftest import requires_gpu


@pytest.fixture
def blocks():
    rng = np.random.default_rng(3)
    out = {}
    for dtype in ("float32", "float64"):
        a = rng.standard_normal((9, 13, 5)).astype(dtype)
        a[rng.random(a.shape) < 0.3] = np.nan
        a[:, 2, 1] = np.nan  # no value along the first axis
        a[4] = np.nan
        out[dtype] = a
    out["int32"] = (rng.standard_normal((9, 13, 5)) * 10).astype("int32")
    return out


@pytest.mark.parametrize("name", sorted(patches.PATCHES))
def test_each_target_is_the_function_it_was_written_for(name):
    patch = patches.PATCHES[name]
    module = importlib.import_module(patch.module)
    assert patches._matches(patches._get(module, patch.attribute), patch.params), (patch.module, patch.attribute)
    for other in patch.also:
        assert patches._get(importlib.import_module(other), patch.attribute) is patches._get(module, patch.attribute)


def test_installed_versions_are_within_those_tested():
    from packaging.version import Version

    for lib in ("dask", "xarray"):
        low, _high = patches.TESTED[lib]
        assert Version(importlib.import_module(lib).__version__) >= Version(low)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_nanfirst_nanlast_are_xarrays(blocks, axis, keepdims):
    from xarray.core import nputils

    for a in blocks.values():
        np.testing.assert_array_equal(duck.nanfirst(a, axis, keepdims), nputils.nanfirst(a, axis, keepdims))
        np.testing.assert_array_equal(duck.nanlast(a, axis, keepdims), nputils.nanlast(a, axis, keepdims))


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("n", [None, 1, 3])
def test_push_is_bottlenecks(blocks, axis, n):
    bn = pytest.importorskip("bottleneck")
    for a in blocks.values():
        limit = a.shape[axis] if n is None else n
        np.testing.assert_array_equal(duck.push(a, n, axis), bn.push(a, limit, axis))


@pytest.mark.parametrize("method", duck._METHODS)
@pytest.mark.parametrize("q", [0.9, [0.0, 0.37, 1.0]])
@pytest.mark.parametrize("axis", [0, (1, 2), -1])
def test_nanquantile_is_numpys(blocks, method, q, axis):
    for dtype, a in blocks.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanquantile(a, q, axis=axis, method=method)
            want_kept = np.nanquantile(a, q, axis=axis, method=method, keepdims=True)
        got = duck.nanquantile(a, q, axis, method=method)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 1e-6 if dtype == "float32" else 1e-13
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
        np.testing.assert_allclose(duck.nanquantile(a, q, axis, method=method, keepdims=True), want_kept,
                                   rtol=tol, atol=tol, equal_nan=True)


def test_every_numpy_quantile_method_is_here_and_another_is_refused_by_name(blocks):
    assert set(duck._METHODS) == _numpy_methods()
    with pytest.raises(NotImplementedError, match="'hazel'") as e:
        duck.nanquantile(blocks["float64"], 0.5, 0, method="hazel")
    assert isinstance(e.value, InputError)


def _numpy_methods():
    from numpy.lib import _function_base_impl

    return set(_function_base_impl._QuantileMethods)


def test_masked_lstsq_is_xarrays_column_fit():
    from xarray.core import nputils

    rng = np.random.default_rng(5)
    x = np.linspace(0, 1, 40)
    lhs = np.vander(x, 3)
    lhs /= np.sqrt((lhs * lhs).sum(axis=0))  # as xarray's polyfit scales it
    y = rng.standard_normal((40, 12))
    y[rng.random(y.shape) < 0.2] = np.nan
    y[:, 3] = np.nan
    y[:, 5] = rng.standard_normal(40)  # no NaN
    want = np.stack([nputils._nanpolyfit_1d(y[:, k], lhs) for k in range(y.shape[1])], axis=1)
    np.testing.assert_allclose(duck.masked_lstsq(lhs, y), want, rtol=1e-9, atol=1e-12, equal_nan=True)



def test_device_least_squares_fits_blocks_of_columns_as_xarray(monkeypatch):
    """polyfit's fit of a (time, lat, lon) array on the device, with NumPy standing in for CuPy:
    xarray's own fit of every column, in blocks of columns of every row whose size is bounded
    (one block of all columns held several float64 copies of the whole array)."""
    import dask.array as da
    from xarray.compat import dask_array_ops

    monkeypatch.setattr(patches, "_cupy", lambda: np)
    monkeypatch.setattr(patches, "LSTSQ_BLOCK", 40 * 8 * 7)  # 7 columns of 40 rows
    rng = np.random.default_rng(9)
    lhs = np.vander(np.linspace(0, 1, 40), 2)
    lhs /= np.sqrt((lhs * lhs).sum(axis=0))
    y = rng.standard_normal((40, 5, 6)).astype("float32")
    y[rng.random(y.shape) < 0.1] = np.nan
    y[:, 1, 2] = np.nan
    rhs = da.from_array(y, chunks=(13, 5, 6))  # time in chunks, as a store is
    coeffs, residuals = patches._device_least_squares(lhs, rhs)
    assert patches._lstsq_columns(40, 30) == 7
    want_c, want_r = dask_array_ops.least_squares(lhs, rhs.reshape(40, -1).rechunk({0: -1}), skipna=True)
    np.testing.assert_allclose(coeffs.compute().reshape(2, -1), want_c.compute(), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(residuals.compute().ravel(), want_r.compute(), rtol=1e-6, equal_nan=True)
    assert coeffs.shape == (2, 5, 6) and residuals.shape == (5, 6)
    monkeypatch.setattr(patches, "LSTSQ_BLOCK", 256 << 20)
    columns = patches._lstsq_columns(1460, 721 * 1440)
    assert 1460 * columns * 8 <= 256 << 20 and columns > 1000

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_interp_linear_is_xarrays_interpolate_na(dtype):
    import xarray as xr

    rng = np.random.default_rng(2)
    y = rng.standard_normal((6, 5, 30)).astype(dtype)
    y[rng.random(y.shape) < 0.4] = np.nan
    y[0, 0] = np.nan  # no value
    y[0, 1, :] = np.nan
    y[0, 1, 3] = 1.0  # one value
    x = np.sort(rng.random(30)) * 10  # uneven spacing
    want = xr.DataArray(y, dims=("a", "b", "t"), coords={"t": x}).interpolate_na("t").values
    got = duck.interp_na(y, x, "linear")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-14, equal_nan=True)


@pytest.mark.parametrize("q", [0.5, [0.0, 0.3, 1.0]])
@pytest.mark.parametrize("skipna", [True, False])
@pytest.mark.parametrize("dim", ["c", ("b", "c")])
def test_weighted_quantile_is_xarrays(q, skipna, dim):
    """The device path's computation and wiring, run here on Dask arrays of NumPy blocks."""
    import xarray as xr

    rng = np.random.default_rng(4)
    d = rng.standard_normal((4, 6, 9))
    d[rng.random(d.shape) < 0.2] = np.nan
    d[0, 0] = np.nan
    w = rng.random((6, 9))
    w[:, 2] = 0  # a weight of zero counts for nothing
    w[1] = 0  # nor a row of them
    x = xr.DataArray(d, dims=("a", "b", "c"), coords={"c": np.arange(9)}).chunk(a=3)
    weights = xr.DataArray(w, dims=("b", "c"))
    want = x.compute().weighted(weights).quantile(q, dim=dim, skipna=skipna)
    got = patches._device_weighted_quantile(x.weighted(weights), x, q, dim, skipna)
    assert got.chunks is not None
    xr.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-14)


def test_numpy_data_goes_to_the_originals(blocks):
    """The wrappers, made without CuPy: NumPy blocks are the originals' business."""
    for name, patch in patches.PATCHES.items():
        original = patches._get(importlib.import_module(patch.module), patch.attribute)
        wrapped = patch.make(original)
        a = blocks["float64"]
        if name in ("xarray-nanfirst", "xarray-nanlast"):
            np.testing.assert_array_equal(wrapped(a, 0), original(a, 0))
        elif name == "xarray-push":
            pytest.importorskip("bottleneck")
            np.testing.assert_array_equal(wrapped(a, None, 0), original(a, None, 0))
        elif name == "dask-nanquantile":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                np.testing.assert_array_equal(
                    wrapped(a, np.array(0.5), axis=(2,)), original(a, np.array(0.5), axis=(2,))
                )
        elif name == "dask-elemwise":
            import dask.array as da

            x = da.from_array(a, chunks=4)
            np.testing.assert_array_equal(wrapped(np.add, x, np.array(1.0)).compute(), a + 1.0)
        elif name == "xarray-idxminmax":
            import xarray as xr

            x = xr.DataArray(a, dims=("t", "y", "x"), coords={"t": np.arange(9) * 2.0}).chunk(t=4)
            for how in ("idxmin", "idxmax"):
                xr.testing.assert_identical(
                    wrapped(array=x, func=lambda arr, **k: getattr(arr, how.replace("idx", "arg"))(**k), dim="t"),
                    original(array=x, func=lambda arr, **k: getattr(arr, how.replace("idx", "arg"))(**k), dim="t"),
                )
        elif name == "xarray-interpolate-na":
            import xarray as xr

            x = xr.DataArray(a, dims=("t", "y", "x"), coords={"x": np.arange(5.0)}).chunk(t=4)
            xr.testing.assert_identical(wrapped(x, "x").compute(), original(x, "x").compute())
        elif name == "xarray-weighted-quantile":
            import xarray as xr

            x = xr.DataArray(a, dims=("t", "y", "x"))
            w = x.weighted(xr.DataArray(np.arange(1.0, 6.0), dims="x"))
            xr.testing.assert_identical(wrapped(w, x, 0.5, dim="x"), original(w, x, 0.5, dim="x"))
        elif name.endswith("-meta"):
            import dask.array as da

            x = da.from_array(a, chunks=(9, 4, 5))
            args = {"gradient": (x,), "push": (x, None, 0)}.get(patch.attribute, (x,))
            kwargs = {"axis": 0} if patch.attribute != "push" else {}
            if "quantile" in patch.attribute:
                args = (x, 0.5)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                got, want = wrapped(*args, **kwargs), original(*args, **kwargs)
                got, want = (got[0], want[0]) if isinstance(got, list) else (got, want)
                assert type(got._meta) is np.ndarray
                np.testing.assert_array_equal(got.compute(), want.compute())
        elif name == "xarray-groupby-binary-op":
            import xarray as xr

            x = xr.DataArray(a, dims=("t", "y", "x"), coords={"t": np.arange(9) % 3}).chunk(t=4)
            clim = x.groupby("t").mean()
            for reflexive in (False, True):
                xr.testing.assert_identical(wrapped(x.groupby("t"), clim, np.subtract, reflexive).compute(),
                                            original(x.groupby("t"), clim, np.subtract, reflexive).compute())
        elif name == "xarray-no-flox-on-device":
            import xarray as xr

            for x in (xr.DataArray(a, dims=("t", "y", "x")), xr.DataArray(a, dims=("t", "y", "x")).chunk(t=4)):
                assert wrapped(x) is original(x) is True
                assert wrapped(x.to_dataset(name="v")) is True
        elif name == "xarray-polyfit":
            import dask.array as da

            lhs = np.vander(np.linspace(0, 1, 9), 2)
            rhs = da.from_array(np.nan_to_num(a.reshape(9, -1)), chunks=(9, 20))
            got, _ = wrapped(lhs, rhs, skipna=True)
            want, _ = original(lhs, rhs, skipna=True)
            np.testing.assert_allclose(got.compute(), want.compute())


def test_the_setting_chooses_which_are_made(monkeypatch):
    import dask

    with dask.config.set({"pipeline.patches": False}):
        assert not any(patches.enabled(n) for n in patches.PATCHES)
        config.check()
        patches.check_setting()
    with dask.config.set({"pipeline.patches": ["xarray-push"]}):
        assert [n for n in patches.PATCHES if patches.enabled(n)] == ["xarray-push"]
        config.check()
        patches.check_setting()
    with dask.config.set({"pipeline.patches": "yes"}):
        with pytest.raises(InputError, match="patches"):
            config.check()
    with dask.config.set({"pipeline.patches": ["xarray-psuh"]}):
        with pytest.raises(InputError, match="did you mean 'xarray-push'"):
            patches.check_setting()


def test_the_cli_refuses_a_change_that_is_not_one(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "DASK_PIPELINE__PATCHES": '["dask-elemwsie"]'}
    out = subprocess.run([sys.executable, "-m", "pipeline", "ops"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert "pipeline.patches" in out.stderr and "'dask-elemwsie'" in out.stderr and "dask-elemwise" in out.stderr


def test_the_setting_governs_the_changes_made_elsewhere():
    """distributed's import, kept out of graphs that cannot need it, is let in when turned off (in
    a fresh process: this one has imported distributed)."""
    import subprocess
    import sys

    script = """
import sys, dask
from pipeline import patches
from pipeline.exec.compute import distributed_not_imported
name = "distributed.shuffle._core"
assert "distributed" not in sys.modules
with distributed_not_imported():
    assert sys.modules[name] is None
assert name not in sys.modules
with dask.config.set({"pipeline.patches": [n for n in patches.ELSEWHERE if n != "distributed-shuffle-import"]}):
    with distributed_not_imported():
        assert name not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


_SCHEDULER_LOOKUP = """
import sys
import dask, dask.base, dask.local, dask.threaded, dask.multiprocessing
import dask.array as da
import numpy as np
import xarray as xr
import pipeline
from pipeline import patches
from pipeline.exec.compute import skip_client_lookup

original = dask.base.get_scheduler
with dask.config.set({"pipeline.patches": [n for n in patches.ELSEWHERE if n != "dask-client-lookup"]}):
    skip_client_lookup()
assert dask.base.get_scheduler is original  # turned off: left alone
xr.Dataset({"t": (("x", "y"), np.arange(12.0).reshape(3, 4))}).to_zarr(sys.argv[1], zarr_format=3)
ds = pipeline.open_dataset(sys.argv[1], backend="cpu")  # installs it, once
get = dask.base.get_scheduler
assert get.__pipeline_original__ is original
skip_client_lookup()
assert dask.base.get_scheduler is get
# what dask itself answers after finding no client
x = da.ones((4, 4), chunks=2)
assert get(collections=[x]) is dask.threaded.get and get(cls=type(x)) is dask.threaded.get
assert get() is None and get(collections=[None]) is None
assert get(scheduler="sync") is dask.local.get_sync and get(scheduler="Threads") is dask.threaded.get
with dask.config.set(scheduler="processes"):
    assert get(collections=[x]) is dask.multiprocessing.get
with dask.config.set(scheduler=dask.local.get_sync):
    assert get(collections=[x]) is dask.local.get_sync
assert float(ds.t.sum().values) == 66.0 and float(x.sum().compute()) == 16.0
# a rechunk chooses its method as dask does after finding no client ("tasks"), a method set is kept
rechunk_module = sys.modules["dask.array.rechunk"]  # (dask.array.rechunk is also the function)
assert rechunk_module._choose_rechunk_method(((2, 2),), ((4,),)) == "tasks"
with dask.config.set({"array.rechunk.method": "p2p"}):
    assert rechunk_module._choose_rechunk_method(((2, 2),), ((4,),)) == "p2p"
assert float(ds.t.data.rechunk((3, 1)).sum().compute()) == 66.0
assert "distributed" not in sys.modules
with dask.config.set({"pipeline.patches": False}):  # turned off once made: dask's own lookup
    assert get(collections=[x]) is dask.threaded.get
assert "distributed" in sys.modules
# distributed imported, a client made: dask decides, and the client computes
from distributed import Client
with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0") as client:
    assert get(collections=[x]) == client.get
    assert float(ds.t.sum().values) == 66.0
assert get(collections=[x]) is dask.threaded.get  # the client closed
print("ok")
"""


def test_dask_picks_its_scheduler_without_importing_distributed(tmp_path):
    """A user's first ``.values`` on what pipeline opened imports no distributed only to look for a
    client that cannot exist (dask.base.get_scheduler, pipeline.exec.compute.skip_client_lookup):
    dask's own answers where no client exists, a client's get once one does, and the setting
    turns it off (in a fresh process: this one has imported distributed)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SCHEDULER_LOOKUP, str(tmp_path / "t.zarr")], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_a_genomics_script_imports_no_distributed():
    """``import pipeline.genomics as sg``, then sgkit-style calls and ``.values``: no distributed
    imported (the import of pipeline.genomics makes the scheduler lookup's change)."""
    import subprocess
    import sys

    code = """
import sys
import pipeline.genomics as sg
ds = sg.simulate_genotype_call_dataset(n_variant=50, n_sample=10, seed=1)
counts = sg.count_call_alleles(ds).call_allele_count.values
print(counts.shape, int(counts.sum()), "distributed" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["(50,", "10,", "2)", "1000", "False"]


def test_values_of_host_data_reach_xarrays_function_unchanged():
    import xarray.core.variable as variable

    values = patches._values_on_host(variable._as_array_or_item)
    a = np.arange(6.0).reshape(2, 3)
    assert values(a) is a  # no copy: xarray's in-place updates of .values still work
    day = np.array(np.datetime64("2000-01-02", "D"))
    assert values(day) == variable._as_array_or_item(day) and isinstance(values(day), np.datetime64)


@pytest.mark.gpu
@requires_gpu
def test_values_of_device_data_come_to_the_host():
    """sgkit's way of reading a result, ``.values``, on the GPU backend: the NumPy array that
    pipeline.to_numpy gives (CuPy refuses numpy.asarray), and np.asarray, float and int of a
    DataArray with it; a CuPy-backed DataArray too."""
    import cupy

    from pipeline import backend as B

    from .genomics_data import dataset

    import pipeline.genomics as sg

    patches.apply()
    assert "xarray-values-on-host" in patches._applied
    rate = sg.variant_stats(dataset("bi", {"variants": 37}, "gpu")).variant_call_rate
    assert B.backend_of(rate.data) == "gpu"
    host = rate.values
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, sg.variant_stats(dataset("bi", {"variants": 37}, "cpu")).variant_call_rate.values)
    np.testing.assert_array_equal(np.asarray(rate), host)
    assert float(rate.sum()) == pytest.approx(float(host.sum()))
    assert int(rate.count()) == host.size
    on_device = rate.copy(data=cupy.asarray(host))
    np.testing.assert_array_equal(on_device.values, host)
