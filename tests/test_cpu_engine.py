"""The CPU backend reads Zarr through the chunk engine's host decoders
(:func:`pipeline.gpu.engine.read_block_host`): stores written by zarr-python itself, v2 and v3,
sharded or not, zstd, Blosc, crc32c, chunks never written, fill values and chunks cut by the
array's edge, read bit for bit as zarr reads them; a corrupt chunk is still named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

import pipeline
from pipeline.errors import InputError
from pipeline.gpu import engine

from .conftest import BACKENDS

REPO = Path(__file__).resolve().parent.parent
DIMS = ("t", "y", "x")
SHAPE = (23, 9, 14)  # no chunk size below divides it: the last chunks are cut by the edge


def _values(dtype) -> np.ndarray:
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        v = rng.normal(280, 10, SHAPE).astype(dtype)
        v[3, 2, :4] = np.nan
        return v
    return rng.integers(-100, 100, SHAPE).astype(dtype)


# name -> keyword arguments of zarr.create_array; each writes every chunk but those ``holes``
# leaves out (whole chunks, or inner chunks of a shard, never written: the fill value)
STORES = {
    "v3-default": dict(zarr_format=3, chunks=(5, 4, 6)),
    "v3-zstd-crc32c": dict(zarr_format=3, chunks=(6, 9, 14), serializer=BytesCodec(),
                           compressors=[ZstdCodec(level=1, checksum=True), Crc32cCodec()]),
    "v3-blosc": dict(zarr_format=3, chunks=(4, 5, 5), compressors=[BloscCodec(cname="lz4", shuffle="bitshuffle")]),
    "v3-none": dict(zarr_format=3, chunks=(7, 9, 3), compressors=None),
    "v3-sharded": dict(zarr_format=3, chunks=(2, 9, 14), shards=(6, 9, 14)),
    "v3-sharded-tiles": dict(zarr_format=3, chunks=(3, 3, 7), shards=(6, 9, 14),
                             compressors=[BloscCodec(cname="zstd", shuffle="shuffle")]),
    "v3-sharded-index-first": dict(zarr_format=3, chunks=(3, 3, 7), shards=(6, 9, 14)),
    "v2-zstd": dict(zarr_format=2, chunks=(5, 4, 6), compressors=numcodecs.Zstd(level=3)),
    "v2-blosc": dict(zarr_format=2, chunks=(4, 9, 5), compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)),
    "v2-none": dict(zarr_format=2, chunks=(6, 5, 14), compressors=None),
}


def write_store(path: Path, name: str, dtype="float32", fill_value=None, holes=True) -> np.ndarray:
    """A store of one variable ``v`` written by zarr-python (``STORES[name]``), with a block of
    time steps never written where ``holes``; returns the values zarr reads back."""
    kw = dict(STORES[name])
    fmt = kw.pop("zarr_format")
    if name == "v3-sharded-index-first":
        kw.pop("chunks"), kw.pop("shards")
        kw.update(chunks=(6, 9, 14), serializer=ShardingCodec(chunk_shape=(3, 3, 7), index_location="start"),
                  compressors=None)
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    extra = {"dimension_names": DIMS} if fmt == 3 else {"attributes": {"_ARRAY_DIMENSIONS": list(DIMS)}}
    arr = group.create_array("v", shape=SHAPE, dtype=dtype, fill_value=fill_value, **kw, **extra)
    values = _values(dtype)
    if holes:  # steps 12-17 never written: whole chunks or shards, and inner chunks of a shard
        arr[:12] = values[:12]
        arr[18:] = values[18:]
        arr[13, :3, :7] = values[13, :3, :7]
    else:
        arr[...] = values
    return zarr.open_array(str(path / "v"), mode="r")[...]


def read_with_engine(monkeypatch, path: Path, **kw) -> np.ndarray:
    """The variable read by the CPU backend; asserts that the engine read every block."""
    calls = []
    real = engine.read_block_host

    def spy(lay, region, frames):
        out = real(lay, region, frames)
        calls.append(region)
        return out

    monkeypatch.setattr(engine, "read_block_host", spy)
    ds = pipeline.open_dataset(path, backend="cpu", decode_cf=False, **kw)
    got = ds["v"].values
    assert calls and len(calls) == ds["v"].data.npartitions
    return got


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))


@pytest.mark.parametrize("name", list(STORES))
def test_zarr_written_stores_read_bit_for_bit(tmp_path, monkeypatch, name):
    path = tmp_path / "s.zarr"
    want = write_store(path, name, fill_value=np.float32(-9.5) if name.startswith("v2") else None)
    same_bits(read_with_engine(monkeypatch, path), want)
    # blocks that cut stored chunks and shards anywhere
    same_bits(read_with_engine(monkeypatch, path, chunks={"t": 5, "y": 4, "x": 9}), want)


@pytest.mark.parametrize("dtype,fill", [("float32", np.float32(np.nan)), ("float64", -1.25), ("int16", -7),
                                        ("uint8", 3), ("int64", 2**40)])
@pytest.mark.parametrize("name", ["v3-sharded-tiles", "v2-zstd"])
def test_fill_values_of_chunks_never_written(tmp_path, monkeypatch, name, dtype, fill):
    path = tmp_path / "s.zarr"
    want = write_store(path, name, dtype=dtype, fill_value=fill)
    got = read_with_engine(monkeypatch, path)
    same_bits(got, want)
    held = np.asarray(fill, dtype=dtype)
    assert np.array_equal(got[15], np.full(SHAPE[1:], held), equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decoded_values_match_xarray(tmp_path, backend):
    path = tmp_path / "s.zarr"
    write_store(path, "v3-sharded")
    ds = pipeline.open_dataset(path, backend=backend)
    got = pipeline.backend.to_numpy(ds["v"].data.compute())
    np.testing.assert_array_equal(got, xr.open_zarr(path, consolidated=False)["v"].values)


def _corrupt_inner_chunk(path: Path) -> None:
    """Flip the bytes of the first frame of shard (1, 0, 0) of ``v`` (after its first 16)."""
    shard = path / "v" / "c" / "1" / "0" / "0"
    blob = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(blob[-(16 * 9 + 4):-4]), dtype="<u8").reshape(-1, 2)
    start, size = int(index[0, 0]), int(index[0, 1])
    for i in range(start + 16, start + size):
        blob[i] ^= 0x5A
    shard.write_bytes(bytes(blob))


def test_corrupt_frame_in_a_shard_names_the_shard(tmp_path):
    path = tmp_path / "s.zarr"
    want = write_store(path, "v3-sharded-tiles", holes=False)
    _corrupt_inner_chunk(path)
    ds = pipeline.open_dataset(path, backend="cpu", decode_cf=False)
    with pytest.raises(InputError) as info:
        ds["v"].compute()
    message = str(info.value)
    assert f"{path}: variable 'v': chunk (1, 0, 0) (file c/1/0/0) could not be read" in message
    assert len(message.splitlines()) <= 3
    # the other shards still read, bit for bit
    same_bits(ds["v"][:6].values, want[:6])
    same_bits(ds["v"][12:].values, want[12:])


def test_cli_on_corrupt_shard_exits_2_and_writes_nothing(tmp_path):
    path = tmp_path / "s.zarr"
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), _values("float32"))},
                    coords={"time": np.arange(SHAPE[0]), "lat": np.linspace(-80, 80, SHAPE[1]),
                            "lon": np.linspace(0, 350, SHAPE[2])})
    ds.chunk({"time": 6}).to_zarr(path, zarr_format=3, consolidated=False,
                                  encoding={"tas": {"chunks": (3, 3, 7), "shards": (6, 9, 14)}})
    blob = bytearray((path / "tas" / "c" / "1" / "0" / "0").read_bytes())
    blob[20:60] = bytes(40)
    (path / "tas" / "c" / "1" / "0" / "0").write_bytes(bytes(blob))
    out = tmp_path / "out.zarr"
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(REPO / "flows" / "climate_anomaly.yaml"),
                        "--input", str(path), "--output", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 2, r.stderr
    assert f"{path}: variable 'tas': chunk (1, 0, 0) (file c/1/0/0) could not be read" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_shard_cut_short_names_the_shard(tmp_path):
    path = tmp_path / "s.zarr"
    want = write_store(path, "v3-sharded", holes=False)
    shard = path / "v" / "c" / "2" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[:-40])  # its index now points past the end
    ds = pipeline.open_dataset(path, backend="cpu", decode_cf=False)
    with pytest.raises(InputError) as info:
        ds["v"].compute()
    assert f"{path}: variable 'v': chunk (2, 0, 0) (file c/2/0/0) could not be read" in str(info.value)
    same_bits(ds["v"][:12].values, want[:12])


@pytest.mark.parametrize("kw", [dict(compressors=numcodecs.Zlib(level=1)),
                                dict(compressors=numcodecs.Zstd(), filters=[numcodecs.Delta(dtype="<f4")])])
def test_layouts_the_engine_does_not_plan_are_read_as_before(tmp_path, monkeypatch, kw):
    """zlib (read straight into the block by pipeline.sources.reads) and a filter (read by zarr):
    the engine is not asked, the values are zarr's."""
    path = tmp_path / "s.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    arr = group.create_array("v", shape=SHAPE, dtype="float32", chunks=(5, 4, 6),
                             attributes={"_ARRAY_DIMENSIONS": list(DIMS)}, **kw)
    arr[...] = _values("float32")
    monkeypatch.setattr(engine, "read_block_host", lambda *a: pytest.fail("the engine read a block"))
    got = pipeline.open_dataset(path, backend="cpu", decode_cf=False)["v"].values
    same_bits(got, zarr.open_array(str(path / "v"), mode="r")[...])


def test_chunk_files_are_mapped_or_read_by_their_size(tmp_path):
    """``map_file``: a file below ``SMALL_FILE`` is read, a larger one mapped; both give its
    bytes; an empty file gives no bytes and a missing one None (a chunk never written)."""
    rng = np.random.default_rng(0)
    for size in (1, engine.SMALL_FILE - 1, engine.SMALL_FILE, engine.SMALL_FILE + 4097):
        path = tmp_path / f"c{size}"
        data = rng.integers(0, 256, size, dtype=np.uint8)
        path.write_bytes(data.tobytes())
        got = engine.map_file(str(path))
        assert got.dtype == np.uint8 and not got.flags.writeable
        np.testing.assert_array_equal(got, data)
    (tmp_path / "empty").write_bytes(b"")
    assert engine.map_file(str(tmp_path / "empty")).size == 0
    assert engine.map_file(str(tmp_path / "missing")) is None
