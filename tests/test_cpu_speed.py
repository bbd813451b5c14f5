"""What keeps the CPU backend as fast as hand-written dask (benchmarks/cpu_peer.py), checked by
structure rather than by timing: every core computes, each block is read once and decoded
straight into place, the hot kernels are one-pass loops that release the GIL, and they compute
what the array formulas compute."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline.exec import memory
from pipeline.kernels import elementwise, launch, moments, weighted
from pipeline.sources.reads import StoreArray


def _write(path, zarr_format=3, encoding=None, shape=(40, 9, 16), chunks=(10, 9, 16)):
    """A store as ``Dataset.to_zarr`` writes it, with its defaults unless ``encoding`` says."""
    rng = np.random.default_rng(0)
    x = (280 + 5 * rng.standard_normal(shape)).astype(np.float32)
    x[3, 2, :4] = np.nan
    lat = np.linspace(-80, 80, shape[1])
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), da.from_array(x, chunks=chunks))},
        coords={"time": pd.date_range("2000-01-01", periods=shape[0]), "lat": ("lat", lat, {"units": "degrees_north"}),
                "lon": ("lon", np.arange(shape[2]) * 360.0 / shape[2], {"units": "degrees_east"})},
    )
    ds.to_zarr(path, zarr_format=zarr_format, encoding={"tas": encoding or {}})
    return path


def _store_arrays(x: xr.DataArray) -> list[StoreArray]:
    return [v for v in dict(x.data.__dask_graph__()).values() if isinstance(v, StoreArray)]


def _flow(path):
    x = pipeline.open_dataset(path, backend="cpu")["tas"]
    z = pipeline.ops.standardized_anomaly(x, dim="time")
    return x, pipeline.ops.weighted_mean(z, dims=["lat", "lon"], weights="coslat")


# --- the plan, the graph and the read path ---------------------------------------------------------


def test_the_plan_gives_a_small_flow_every_core(tmp_path):
    from dask.system import CPU_COUNT

    x, result = _flow(_write(tmp_path / "s.zarr"))
    plan = memory.plan(x.data, result.data, backend="cpu")
    assert plan.threads == CPU_COUNT
    assert not plan.out_of_core


def test_the_flow_reads_each_block_once_in_few_tasks(tmp_path):
    """In core, the statistics and the standardized values come from the same read of each block,
    and the graph holds fewer tasks than dask's own for the same analysis."""
    path = _write(tmp_path / "s.zarr", shape=(80, 9, 16))
    x, result = _flow(path)
    graph = dict(result.data.__dask_graph__())
    blocks = x.data.numblocks[0]
    reads = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("open_dataset-")]
    assert len(reads) == blocks  # one read a block (blocks of whole chunks, two a thread or more)
    a = da.from_zarr(str(path), component="tas")
    w = np.cos(np.deg2rad(np.linspace(-80, 80, 9)))[None, :, None]
    peer = ((a - a.mean(0)) / a.std(0) * w).sum(axis=(1, 2))
    assert len(graph) <= len(dict(peer.__dask_graph__()))
    ref = xr.open_zarr(path)["tas"].astype(np.float64)
    z = (ref - ref.mean("time")) / ref.std("time")
    want = z.weighted(np.cos(np.deg2rad(ref["lat"]))).mean(("lat", "lon"))
    np.testing.assert_allclose(result.values, want.values, rtol=1e-5)


@pytest.mark.parametrize("fmt,encoding", [
    (3, None),  # xarray's default: zstd
    (3, {"compressors": None}),
    (2, None),  # Zarr v2's default: blosc
    (2, {"compressors": [__import__("numcodecs").Zlib()]}),
])
def test_stores_as_written_are_decoded_straight_into_the_blocks(tmp_path, fmt, encoding):
    path = _write(tmp_path / "s.zarr", zarr_format=fmt, encoding=encoding, chunks=(7, 4, 16))
    want = xr.open_zarr(path)["tas"].values
    for chunks in (None, {"time": 5, "lat": 3}):  # blocks of whole chunks, and blocks cutting them
        x = pipeline.open_dataset(path, backend="cpu", chunks=chunks)["tas"]
        assert all(s._direct is not None for s in _store_arrays(x))
        np.testing.assert_array_equal(x.values, want)


def test_missing_chunks_read_as_the_fill_value_and_shards_through_zarr(tmp_path):
    path = _write(tmp_path / "s.zarr", chunks=(10, 9, 16))
    (path / "tas" / "c" / "1" / "0" / "0").unlink()
    x = pipeline.open_dataset(path, backend="cpu")["tas"]
    np.testing.assert_array_equal(x.values, xr.open_zarr(path)["tas"].values)
    assert np.isnan(x.values[10:20]).all()
    sharded = _write(tmp_path / "sh.zarr", encoding={"chunks": (5, 9, 8), "shards": (10, 9, 16)})
    y = pipeline.open_dataset(sharded, backend="cpu")["tas"]
    assert all(s._direct is None for s in _store_arrays(y))
    np.testing.assert_array_equal(y.values, xr.open_zarr(sharded)["tas"].values)


def test_a_run_on_threads_imports_no_distributed(tmp_path):
    """Asking for a distributed client imported distributed (0.3 s of a first run) for nothing."""
    path = _write(tmp_path / "s.zarr")
    code = (
        "import sys, pipeline\n"
        "from pipeline.exec.compute import compute\n"
        f"x = pipeline.open_dataset({str(path)!r}, backend='cpu')['tas']\n"
        "compute(pipeline.ops.standardized_anomaly(x).data)\n"
        "print('distributed' in sys.modules)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


# --- the one-pass kernels ---------------------------------------------------------------------------


def _block(shape=(37, 6, 11), seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = (285 + 4 * rng.standard_normal(shape)).astype(dtype)
    x[rng.random(shape) < 0.1] = np.nan
    x[:, 1, 2] = np.nan  # no valid value along time
    x[1:, 2, 3] = np.nan  # one
    return x


def test_the_hot_cpu_kernels_release_the_gil():
    for loop in (moments._moments_loop, weighted._weighted_loop, elementwise._standardize_loop):
        assert launch.cpu_loop(loop).targetoptions.get("nogil") is True


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_moments_loop_is_the_twin_and_agrees_with_the_formula(dtype):
    x = _block(dtype=dtype)
    for axis in (0, 1, 2):
        got, ref = moments.moments_cpu(x, axis), moments.moments_formula(x, axis)
        np.testing.assert_array_equal(got["n"], ref["n"])
        np.testing.assert_allclose(got["mean"], ref["mean"], rtol=1e-13)
        np.testing.assert_allclose(got["m2"], ref["m2"], rtol=1e-9, atol=1e-9)
    n, mean, m2 = moments.moments_twin(x.reshape(x.shape[0], -1), tile=x.shape[0])
    got = moments.moments_cpu(x, 0)
    for g, w in zip((got["n"], got["mean"], got["m2"]), (n, mean, m2)):
        np.testing.assert_array_equal(g.reshape(-1), w)  # bit for bit the GPU kernel's twin


def test_standardize_loop_equals_the_formula_bit_for_bit():
    x = _block()
    for axis in (0, 2):
        mean = np.nanmean(x, axis=axis, keepdims=True, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.nanstd(x, axis=axis, keepdims=True, dtype=np.float64)
            std.flat[0] = 0.0  # a constant series: inf or NaN, as NumPy gives
            got = elementwise.standardize_cpu(x, mean, std, np.dtype(np.float32))
            want = elementwise._standardize_formula(x, mean, std, np.dtype(np.float32))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_weighted_loop_agrees_with_the_formula():
    x = _block((9, 7, 13))
    w1 = np.cos(np.deg2rad(np.linspace(-80, 80, 7)))
    cases = [
        (np.broadcast_to(w1[None, :, None], x.shape), (1, 2)),  # cos(lat): the loop
        (np.broadcast_to(np.linspace(0.5, 1, 13)[None, None, :], x.shape), (2,)),  # the loop, one axis
        (np.broadcast_to(w1[None, :, None], x.shape), (0, 1)),  # not the trailing axes: the formula
    ]
    for w, axis in cases:
        got, want = weighted.weighted_sums_cpu(x, w, axis), weighted.weighted_formula(x, w, axis)
        for k in want:
            assert got[k].shape == want[k].shape
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12)


def test_the_peer_benchmark_runs_and_agrees(tmp_path):
    """benchmarks/cpu_peer.py, tiny: both sides in their own processes, results compared."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(root / "benchmarks" / "cpu_peer.py"), "--shape", "40,9,16", "--time-chunk", "10",
                    "--repeat", "1", "--workdir", str(tmp_path), "--json", str(out)], env=env, check=True, capture_output=True)
    (row,) = json.loads(out.read_text())
    assert row["agree"] and row["rel_err"] < 1e-5
    assert row["pipeline"]["plan_threads"] >= 1 and row["pipeline"]["tasks"] <= row["dask"]["tasks"]


def test_cpu_blocks_group_small_chunks_and_keep_every_core_busy(tmp_path):
    """With pipeline.cpu.block-size, a store of one time step a chunk (ERA5-style Zarr v2 Blosc,
    NetCDF4) is read on the CPU in blocks of many chunks, at least two a thread, with values equal
    to xarray's (16MB by default); null: one chunk a block."""
    import dask
    import numcodecs
    import xarray as xr

    import pipeline

    values = np.random.default_rng(2).standard_normal((40, 6, 8)).astype(np.float32)
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), values)}).chunk({"time": 1})
    ds.to_zarr(tmp_path / "v2.zarr", zarr_format=2,
               encoding={"tas": {"compressors": [numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)], "chunks": (1, 6, 8)}})
    ds.to_netcdf(tmp_path / "f.nc", engine="h5netcdf", encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (1, 6, 8)}})
    for store in (tmp_path / "v2.zarr", tmp_path / "f.nc"):
        with dask.config.set({"num_workers": 4, "pipeline.cpu.block-size": "64MB"}):
            got = pipeline.open_dataset(store, backend="cpu")["tas"]
            assert got.data.chunks[0] == (5,) * 8  # 40 chunks, at least 8 blocks
            np.testing.assert_array_equal(got.values, values)
        with dask.config.set({"num_workers": 2, "pipeline.cpu.block-size": 6 * 8 * 4 * 3}):
            assert pipeline.open_dataset(store, backend="cpu")["tas"].data.chunks[0][0] == 3  # the size caps it
        with dask.config.set({"num_workers": 4}):
            assert pipeline.open_dataset(store, backend="cpu")["tas"].data.chunks[0] == (5,) * 8  # the default
        with dask.config.set({"pipeline.cpu.block-size": None}):
            assert pipeline.open_dataset(store, backend="cpu")["tas"].data.chunks[0] == (1,) * 40


def test_netcdf4_variables_as_stored_are_read_by_the_host_decoder(tmp_path, monkeypatch):
    """A NetCDF4 variable that xarray holds as stored (through h5netcdf, or netCDF4 where it is
    installed) is read by the chunk engine's HDF5 host decoder; one xarray has sliced, or one of
    another backend, is not."""
    import importlib.util

    import xarray as xr

    import pipeline
    from pipeline.gpu import hdf5
    from pipeline.sources import reads

    values = np.random.default_rng(3).standard_normal((12, 6, 8)).astype(np.float32)
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), values)})
    path = tmp_path / "f.nc"
    ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (3, 6, 8)}})
    ds.to_zarr(tmp_path / "s.zarr")
    engines = ["h5netcdf"] + (["netcdf4"] if importlib.util.find_spec("netCDF4") else [])
    for engine in engines:
        with xr.open_dataset(path, engine=engine, mask_and_scale=False) as opened:
            assert reads.h5_layout_of(opened["tas"].variable, str(path), "tas") is not None, engine
            assert reads.h5_layout_of(opened["tas"].isel(time=slice(1, 4)).variable, str(path), "tas") is None
            assert reads.h5_layout_of(opened["tas"].variable, str(path), "other") is None
    with xr.open_zarr(tmp_path / "s.zarr") as opened:
        assert reads.h5_layout_of(opened["tas"].variable, str(path), "tas") is None
    blocks = []
    real = hdf5.read_block_host
    monkeypatch.setattr(hdf5, "read_block_host", lambda *a, **k: blocks.append(a[1]) or real(*a, **k))
    np.testing.assert_array_equal(pipeline.open_dataset(path, backend="cpu")["tas"].values, values)
    assert blocks
