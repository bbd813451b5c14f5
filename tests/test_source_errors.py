"""Bad input in stores: corrupt chunks, chunk requests a store cannot take, values that are not
numbers. Each is an InputError (CLI exit 2) of a few lines naming the store, the variable and
where; strings pass through unchanged."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr

import pipeline
from pipeline.errors import InputError

from .conftest import climate_array

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})


def corrupt_store(tmp_path, fmt: int) -> tuple[Path, str]:
    """A store written by xarray (v3: zarr's default codecs; v2: Blosc) whose chunk (1, 0, 0) of
    ``tas`` has its bytes flipped after the header; returns the store and that chunk's file key."""
    path = tmp_path / f"s{fmt}.zarr"
    ds = climate_array(shape=(30, 6, 8)).to_dataset()
    encoding = {"tas": {"compressors": numcodecs.Blosc()}} if fmt == 2 else {}
    ds.chunk({"time": 10}).to_zarr(path, zarr_format=fmt, encoding=encoding, consolidated=fmt == 2)
    key = "c/1/0/0" if fmt == 3 else "1.0.0"
    chunk = path / "tas" / key
    blob = bytearray(chunk.read_bytes())
    for i in range(16, len(blob)):
        blob[i] ^= 0x5A
    chunk.write_bytes(bytes(blob))
    return path, key


@pytest.mark.parametrize("fmt", [3, 2])
def test_corrupt_chunk_names_store_variable_and_chunk(tmp_path, fmt):
    path, key = corrupt_store(tmp_path, fmt)
    ds = pipeline.open_dataset(path, backend="cpu")
    with pytest.raises(InputError) as info:
        ds["tas"].compute()
    message = str(info.value)
    assert f"{path}: variable 'tas': chunk (1, 0, 0) (file {key})" in message
    assert ("Zstd" if fmt == 3 else "blosc") in message and len(message.splitlines()) <= 3
    # blocks of other chunks still read
    np.testing.assert_array_equal(ds["tas"][:10].values, xr.open_zarr(path)["tas"][:10].values)
    # the error crosses process boundaries as itself (distributed workers send it pickled)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, InputError) and str(again) == message


def test_corrupt_chunk_error_survives_distributed(tmp_path):
    from distributed import Client, LocalCluster

    path, key = corrupt_store(tmp_path, 3)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster):
        with pytest.raises(InputError, match=rf"variable 'tas': chunk \(1, 0, 0\) \(file {key}\)"):
            pipeline.open_dataset(path, backend="cpu")["tas"].mean().compute()


@pytest.mark.parametrize("fmt", [3, 2])
def test_cli_run_on_corrupt_chunk_exits_2(tmp_path, fmt):
    path, key = corrupt_store(tmp_path, fmt)
    r = run_cli("run", FLOW, "--input", path, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "variable 'tas'" in r.stderr and f"chunk (1, 0, 0) (file {key})" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 5, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_run_on_damaged_netcdf_chunk_exits_2(tmp_path):
    """A NetCDF4 file (xarray, h5netcdf, zlib + shuffle) with one chunk's deflate stream damaged:
    the CPU backend's own reader fails on it, h5py reads the block again and fails too, and the
    command exits 2 with a few lines naming the file and the variable; nothing is written."""
    import h5py

    path = tmp_path / "d.nc"
    ds = climate_array(shape=(30, 6, 8)).to_dataset()
    ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (10, 6, 8)}})
    with h5py.File(path, "r") as f:
        info = f["tas"].id.get_chunk_info(1)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        f.write(b"\x00" * 16)
    r = run_cli("run", FLOW, "--input", path, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert str(path) in r.stderr and "variable 'tas'" in r.stderr and "could not be read" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 5, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_chunk_requests_are_checked(tmp_path):
    path = tmp_path / "a.zarr"
    climate_array(shape=(12, 4, 5)).to_dataset().to_zarr(path)
    for chunks, what in (({"time": 0}, "positive"), ({"time": -3}, "positive"), ({"nosuch": 5}, "'nosuch'")):
        with pytest.raises(InputError, match=what) as info:
            pipeline.open_dataset(path, backend="cpu", chunks=chunks)
        assert str(path) in str(info.value) and "time (12), lat (4), lon (5)" in str(info.value)
    assert pipeline.open_dataset(path, backend="cpu", chunks={"time": 5})["tas"].data.chunks[0] == (5, 5, 2)
    # -1, as in xarray and dask: the whole dimension in one chunk
    assert pipeline.open_dataset(path, backend="cpu", chunks={"time": -1, "lat": 3})["tas"].data.chunks[:2] == ((12,), (3, 1))
    r = run_cli("convert", path, tmp_path / "b.zarr", "--chunks", "nosuch=5", cwd=tmp_path)
    assert r.returncode == 2 and "'nosuch'" in r.stderr and "time (12)" in r.stderr, r.stderr
    assert not (tmp_path / "b.zarr").exists()


@pytest.mark.parametrize("fmt", [2, 3])
def test_strings_pass_through_unchanged(tmp_path, fmt):
    """A bio2zarr-like store: string sample ids with attributes beside packed numbers."""
    path = tmp_path / "vcf.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=fmt)
    dims = (lambda *d: {"dimension_names": d}) if fmt == 3 else (lambda *d: {})
    v2 = (lambda *d: {"_ARRAY_DIMENSIONS": list(d)}) if fmt == 2 else (lambda *d: {})
    ids = np.array(["NA001", "", "NA003"])
    sample = group.create_array("sample_id", shape=(3,), dtype=str, chunks=(2,), **dims("samples"),
                                attributes={"description": "sample names", "scale_factor": 2, **v2("samples")})
    sample[...] = ids
    codes = group.create_array("allele", shape=(3, 2), dtype="S2", chunks=(2, 2), **dims("samples", "ploidy"),
                               attributes={"description": "alleles", **v2("samples", "ploidy")})
    codes[...] = np.array([[b"A", b"CT"], [b"G", b"T"], [b"", b"A"]])
    qual = group.create_array("qual", shape=(3,), dtype="i2", chunks=(2,), **dims("samples"),
                              attributes={"scale_factor": 0.5, "_FillValue": -1, **v2("samples")})
    qual[...] = np.array([10, -1, 7], dtype="i2")
    ds = pipeline.open_dataset(path, backend="cpu")
    raw = xr.open_zarr(path, decode_cf=False, consolidated=False)
    for name in ("sample_id", "allele"):
        assert ds[name].dtype == raw[name].dtype and ds[name].dtype.kind in "OSTU"
        np.testing.assert_array_equal(ds[name].values, raw[name].values)
        assert ds[name].attrs["description"] == raw[name].attrs["description"]
    assert ds["sample_id"].values.tolist() == ids.tolist()
    expected = xr.decode_cf(raw)["qual"]
    assert ds["qual"].dtype == expected.dtype
    np.testing.assert_array_equal(ds["qual"].values, expected.values)
