"""Opening stores on both backends with CF decoding, and writing Zarr all or nothing."""

from __future__ import annotations

import os
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError
from pipeline.sinks.zarr import write_zarr

from .conftest import climate_array


def packed_dataset() -> xr.Dataset:
    rng = np.random.default_rng(0)
    raw = rng.integers(-3000, 3000, size=(20, 6, 7)).astype(np.int16)
    raw[:, 0, :2] = -32767
    temp = climate_array(shape=(20, 6, 7), nan_fraction=0.2)
    ds = xr.Dataset(
        {
            "packed": (("time", "lat", "lon"), raw, {"scale_factor": 0.01, "add_offset": 273.15, "units": "K"}),
            "plain": temp.variable,
            "int_fill": (("time", "lat", "lon"), raw.astype(np.int32), {"missing_value": np.int32(-32767)}),
        },
        coords=temp.coords,
    )
    ds["packed"].encoding["_FillValue"] = np.int16(-32767)
    return ds


@pytest.fixture(params=["zarr3", "zarr2", "netcdf"])
def stored(request, tmp_path):
    ds = packed_dataset()
    if request.param == "netcdf":
        path = tmp_path / "packed.nc"
        ds.to_netcdf(path, engine="h5netcdf")
    else:
        path = tmp_path / "packed.zarr"
        ds.chunk({"time": 7}).to_zarr(path, zarr_format=int(request.param[-1]), consolidated=request.param == "zarr2")
    return path


def test_cf_decoding_matches_xarray(stored, backend):
    ds = pipeline.open_dataset(stored, backend=backend, chunks={"time": 6})
    reference = xr.open_dataset(stored, chunks={})  # xarray's own CF decoding
    for name in ("packed", "plain", "int_fill"):
        got = ds[name]
        assert B.backend_of(got) == backend
        assert got.dtype == reference[name].dtype, name
        np.testing.assert_array_equal(B.to_numpy(got.data), reference[name].values)
        assert "scale_factor" not in got.attrs and "_FillValue" not in got.attrs
    assert ds["packed"].data.chunks[0] == (6, 6, 6, 2)


def test_open_keeps_store_chunks_by_default(tmp_path):
    path = tmp_path / "a.zarr"
    climate_array(shape=(20, 4, 5)).chunk({"time": 7}).to_dataset().to_zarr(path)
    ds = pipeline.open_dataset(path, backend="cpu")
    assert ds["tas"].data.chunks[0] == (7, 7, 6)
    assert isinstance(ds["tas"].data._meta, np.ndarray)


def test_open_errors_name_the_path_and_variable(tmp_path):
    with pytest.raises(InputError, match="nope.zarr: no such file or directory"):
        pipeline.open_dataset(tmp_path / "nope.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a Zarr store"):
        pipeline.open_dataset(tmp_path / "empty")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InputError, match="not a Zarr store or a NetCDF file"):
        pipeline.open_dataset(tmp_path / "x.txt")
    path = tmp_path / "a.zarr"
    climate_array(shape=(4, 2, 3)).to_dataset().to_zarr(path)
    with pytest.raises(InputError, match=r"no variable 'pr' \(variables: tas\)"):
        pipeline.open_dataset(path, variables=["pr"])


def test_write_zarr_roundtrip_and_overwrite(tmp_path, backend):
    x = climate_array(chunks={"time": 7})
    gpu_x = x.copy(data=B.to_backend(x.data, backend))
    out = write_zarr(gpu_x, tmp_path / "o.zarr")
    back = xr.open_zarr(out)["tas"]
    np.testing.assert_array_equal(back.values, x.values)
    # overwrite with a different result: the new store replaces the old, no leftovers
    write_zarr(gpu_x * 2, tmp_path / "o.zarr", name="tas", mode="overwrite")
    np.testing.assert_array_equal(xr.open_zarr(out)["tas"].values, x.values * 2)
    assert sorted(os.listdir(tmp_path)) == ["o.zarr"]
    with pytest.raises(InputError, match="already exists"):
        write_zarr(x, tmp_path / "o.zarr", mode="fail")


def test_write_uneven_chunks(tmp_path):
    x = climate_array().chunk({"time": (3, 20, 5, 22)})
    write_zarr(x, tmp_path / "u.zarr")
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "u.zarr")["tas"].values, x.values)


def test_small_uneven_array_is_one_chunk_and_large_ones_keep_their_largest_block(tmp_path):
    """An uneven array (a filter's kept positions) within dask's array.chunk-size is stored as one
    chunk (one task joins it, one writes it); a larger one in chunks of its largest block."""
    import dask
    import zarr

    x = climate_array().chunk({"time": (3, 20, 5, 22)})
    write_zarr(x, tmp_path / "small.zarr")
    assert zarr.open_array(str(tmp_path / "small.zarr" / "tas")).chunks[0] == x.sizes["time"]
    with dask.config.set({"array.chunk-size": f"{x.nbytes // 2}B"}):
        write_zarr(x, tmp_path / "large.zarr")
    assert zarr.open_array(str(tmp_path / "large.zarr" / "tas")).chunks[0] == 22
    for name in ("small", "large"):
        np.testing.assert_array_equal(xr.open_zarr(tmp_path / f"{name}.zarr")["tas"].values, x.values)


def test_write_fuses_chains_and_computes_shared_steps_once(tmp_path, monkeypatch):
    """The arrays written are optimized together before their writes: a chain of elementwise steps
    is one task a block, and a step two variables share runs once a block."""
    import collections

    import dask.array as da

    import pipeline.sinks.zarr as sink

    runs = collections.Counter()

    def shared(block, block_info=None):
        runs[block_info[0]["chunk-location"][0]] += 1
        return block * 2.0

    base = da.map_blocks(shared, da.arange(40.0, chunks=10), dtype=float)
    a = ((base + 1) * 3 - 2) / 5
    ds = xr.Dataset({"a": ("x", a), "b": ("x", base.sum() - base)})
    tasks = []
    real = sink.compute

    def spy(obj, *args, **kwargs):
        tasks.append(dict(obj[0].__dask_graph__()))  # the graph the writes share
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(sink, "compute", spy)
    write_zarr(ds, tmp_path / "f.zarr")
    assert set(runs.values()) == {1} and len(runs) == 4, runs
    names = collections.Counter(str(k[0] if isinstance(k, tuple) else k).rsplit("-", 1)[0] for g in tasks for k in g)
    assert not {"add", "mul", "sub", "truediv"} & set(names), names  # fused into one task a block
    got = xr.open_zarr(tmp_path / "f.zarr")
    np.testing.assert_array_equal(got.a.values, ((np.arange(40.0) * 2 + 1) * 3 - 2) / 5)
    np.testing.assert_array_equal(got.b.values, (np.arange(40.0) * 2).sum() - np.arange(40.0) * 2)


def _explode(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 3:
        raise RuntimeError("disk full")
    return block


def test_failed_write_leaves_nothing_behind(tmp_path):
    x = climate_array(chunks={"time": 5})
    failing = x.copy(data=x.data.map_blocks(_explode, dtype=x.dtype))
    with pytest.raises(RuntimeError, match="disk full"):
        write_zarr(failing, tmp_path / "o.zarr")
    assert os.listdir(tmp_path) == []
    # a failed rerun over an existing good store keeps the good store
    write_zarr(x, tmp_path / "o.zarr")
    with pytest.raises(RuntimeError, match="disk full"):
        write_zarr(failing, tmp_path / "o.zarr", mode="overwrite")
    assert os.listdir(tmp_path) == ["o.zarr"]
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "o.zarr")["tas"].values, x.values)


def test_interrupted_write_leaves_nothing_behind(tmp_path):
    x = climate_array(chunks={"time": 5})

    def interrupt(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 2:
            raise KeyboardInterrupt
        return block

    with pytest.raises(KeyboardInterrupt):
        write_zarr(x.copy(data=x.data.map_blocks(interrupt, dtype=x.dtype)), tmp_path / "o.zarr")
    assert os.listdir(tmp_path) == []


def test_to_numpy_is_the_one_exit(backend):
    x = climate_array(chunks={"time": 7})
    on = x.copy(data=B.to_backend(x.data, backend))
    host = pipeline.to_numpy(on)
    assert isinstance(host.data, np.ndarray)
    np.testing.assert_array_equal(host.values, x.values)
    assert isinstance(pipeline.to_numpy(da.ones(3)), np.ndarray)
    ds = pipeline.to_numpy(on.to_dataset())
    assert isinstance(ds["tas"].data, np.ndarray)


def test_backend_resolution(monkeypatch):
    assert B.resolve("cpu") == "cpu"
    assert B.resolve("auto") == ("gpu" if B.gpu_available() else "cpu")
    with pytest.raises(InputError, match="backend must be one of auto, cpu, gpu, got 'tpu'"):
        B.resolve("tpu")  # a bad name is bad input (exit code 2 from the CLI), not a failure
    import dask

    with dask.config.set({"pipeline.backend": "cpu"}):
        assert B.resolve(None) == "cpu"
    with dask.config.set({"pipeline.backend": "tpu"}), pytest.raises(InputError, match="'tpu'"):
        B.resolve(None)  # a setting read from the environment, as DASK_PIPELINE__BACKEND=tpu
    if not B.gpu_available():
        with pytest.raises(B.BackendError, match="no CUDA GPU is visible"):
            B.resolve("gpu")


def test_mixing_host_and_device_fails_loudly():
    if not B.gpu_available():
        pytest.skip("needs a GPU to mix")
    import cupy

    with pytest.raises(B.BackendError, match="mixed"):
        B.check_same_backend(np.ones(2), cupy.ones(2))


test_mixing_host_and_device_fails_loudly = pytest.mark.gpu(test_mixing_host_and_device_fails_loudly)


# --- NetCDF4 on the CPU: chunks inflated by zlib in Dask's threads, not under HDF5's lock ---------


def _netcdf(tmp_path, chunk=(5, 4, 10), **extra):
    """tas (float32 with NaNs) and a packed int16 with a fill value, written by xarray through
    h5netcdf with zlib and the shuffle filter, in chunks that leave partial edges."""
    ds = packed_dataset()
    ds["tas"] = (("time", "lat", "lon"), np.round(280 + np.cumsum(np.random.default_rng(5).standard_normal(ds["packed"].shape), -1), 2).astype("f4"))
    ds["tas"][3, 2, :4] = np.nan
    enc = {v: {"zlib": True, "shuffle": True, "complevel": 4, "chunksizes": tuple(min(c, n) for c, n in zip(chunk, ds[v].shape)), **extra}
           for v in ds.data_vars if ds[v].ndim == 3}
    path = tmp_path / "f.nc"
    ds.to_netcdf(path, engine="h5netcdf", encoding=enc)
    return path


def _count_host_reads(monkeypatch):
    from pipeline.gpu import hdf5

    calls = []
    read = hdf5.read_block_host
    monkeypatch.setattr(hdf5, "read_block_host", lambda lay, region: calls.append(region) or read(lay, region))
    return calls


@pytest.mark.parametrize("chunks", [None, {"time": 10}])
def test_netcdf_on_the_cpu_reads_its_chunks_itself(tmp_path, monkeypatch, chunks):
    """Blocks of whole chunks are inflated by pipeline's own reader; every value equals xarray's,
    CF decoding, NaNs and partial edge chunks included."""
    path = _netcdf(tmp_path)
    calls = _count_host_reads(monkeypatch)
    ds = pipeline.open_dataset(path, backend="cpu", chunks=chunks)
    reference = xr.open_dataset(path)
    for name in ("tas", "packed", "int_fill"):
        np.testing.assert_array_equal(ds[name].values, reference[name].values)
        assert ds[name].dtype == reference[name].dtype
    assert calls


def test_netcdf_blocks_across_chunks_are_read_by_xarray(tmp_path, monkeypatch):
    """Blocks that cut stored chunks (7 steps of chunks of 5) are read through xarray, equal."""
    path = _netcdf(tmp_path)
    calls = _count_host_reads(monkeypatch)
    ds = pipeline.open_dataset(path, backend="cpu", chunks={"time": 7})
    np.testing.assert_array_equal(ds["tas"].values, xr.open_dataset(path)["tas"].values)
    assert not calls


def test_netcdf_damaged_chunk_names_file_and_variable(tmp_path):
    """A chunk whose deflate stream is damaged: an InputError naming the file and the variable,
    not a wrong value."""
    import h5py

    path = _netcdf(tmp_path)
    with h5py.File(path, "r") as f:
        info = f["tas"].id.get_chunk_info(1)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        f.write(b"\x00" * 16)
    with pytest.raises(InputError, match="tas") as e:
        pipeline.open_dataset(path, backend="cpu")["tas"].values
    assert str(path) in str(e.value)
