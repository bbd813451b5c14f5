"""`pipeline convert` writes its shard files itself, frames compressed on every core: the files
must be what zarr's sharding codec would write, read back by plain zarr and xarray, from every
kind of store users have."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import xarray as xr
import zarr
from numcodecs import Blosc, Zstd

from pipeline.errors import InputError
from pipeline.sinks import convert as C
from pipeline.sinks.zarr import read_manifest, verify

RNG = np.random.default_rng(7)


def _values(shape, dtype="f4"):
    """Smooth values plus noise, rounded: zstd finds something to compress."""
    base = np.cumsum(RNG.standard_normal(shape), axis=-1)
    return np.round(280 + base, 2).astype(dtype)


def _frames(path: str, grid: tuple[int, ...]) -> dict:
    """A shard file read by the Zarr v3 sharding spec: each stored inner chunk's frame, by its
    place in the grid (the index at the end, (offset, nbytes) little-endian, then its crc32c)."""
    import google_crc32c

    raw = open(path, "rb").read()
    n = int(np.prod(grid))
    tail = raw[-(16 * n + 4):-4]
    assert np.frombuffer(raw[-4:], "<u4")[0] == google_crc32c.value(tail)
    index = np.frombuffer(tail, "<u8").reshape(n, 2)
    return {np.unravel_index(i, grid): raw[o:o + s] for i, (o, s) in enumerate(index) if o != C.MISSING}


# --- the shard files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, shard, inner, level",
    [
        ((7, 5, 6), (4, 3, 6), (1, 1, 6), 1),  # edges along two axes: padded and absent inner chunks
        ((9, 10), (4, 10), (2, 10), 3),  # inner chunks of several rows
        ((6, 8, 6), (4, 8, 6), (2, 4, 3), 0),  # inner chunks that are not contiguous runs
    ],
)
def test_shard_files_hold_zarrs_frames(tmp_path, shape, shard, inner, level):
    """Every shard file holds, for every inner chunk, the frame zarr's own sharding codec writes
    (frames in C order where zarr writes them in Morton order: both are the spec's), and the
    same inner chunks beyond the edge are left out."""
    values = _values(shape)
    arrays = {}
    for name in ("ours", "zarr"):
        arrays[name] = zarr.create_array(
            tmp_path / f"{name}.zarr", shape=shape, dtype="f4", shards=shard, chunks=inner, fill_value=np.nan,
            compressors=[zarr.codecs.ZstdCodec(level=level)], config={"write_empty_chunks": True},
        )
    fmt = C.ShardFormat.of(arrays["ours"])
    assert fmt is not None and fmt.level == level and C._contiguous(fmt) == (inner != (2, 4, 3))
    for origin in np.ndindex(*(-(-n // s) for n, s in zip(shape, shard))):
        region = tuple(slice(i * s, min((i + 1) * s, n)) for i, s, n in zip(origin, shard, shape))
        assert C.store_shard(values[region], region, str(tmp_path / "ours.zarr")) == C.block_sha(values[region])
        arrays["zarr"][region] = values[region]
        key = os.path.join("c", *map(str, origin))
        ours, theirs = (_frames(str(tmp_path / f"{n}.zarr" / key), fmt.grid) for n in ("ours", "zarr"))
        assert ours.keys() == theirs.keys() and ours == theirs
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "ours.zarr", mode="r")[...], values)


def test_other_codecs_go_through_zarr(tmp_path):
    """An array this writer does not lay out (no sharding, or other codecs) is written by zarr."""
    plain = zarr.create_array(tmp_path / "p.zarr", shape=(4, 3), dtype="f4", chunks=(4, 3), compressors=None)
    assert C.ShardFormat.of(plain) is None
    blosc = zarr.create_array(tmp_path / "b.zarr", shape=(4, 3), dtype="f4", shards=(4, 3), chunks=(2, 3),
                              compressors=[zarr.codecs.BloscCodec()])
    assert C.ShardFormat.of(blosc) is None
    values = _values((4, 3))
    C.store_shard(values, (slice(0, 4), slice(0, 3)), str(tmp_path / "b.zarr"))
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "b.zarr", mode="r")[...], values)


def test_frames_are_compressed_by_the_pool(tmp_path, monkeypatch):
    """The frames of one shard are compressed by the shared pool's threads, not the task's."""
    names = set()
    encode = Zstd.encode

    def spy(self, buf):
        names.add(threading.current_thread().name)
        return encode(self, buf)

    monkeypatch.setattr(Zstd, "encode", spy)
    arr = zarr.create_array(tmp_path / "s.zarr", shape=(8, 16), dtype="f4", shards=(8, 16), chunks=(1, 16))
    values = _values((8, 16))
    C.store_shard(values, (slice(0, 8), slice(0, 16)), str(tmp_path / "s.zarr"))
    assert names and all(n.startswith("pipeline-encode") for n in names)
    np.testing.assert_array_equal(arr[...], values)


# --- stores as the ecosystem writes them ----------------------------------------------------------


def _dataset() -> xr.Dataset:
    """float32 and packed int16 over (time, lat, lon), 23 x 9 x 10: chunks of 5 steps leave a
    partial last one."""
    tas = _values((23, 9, 10))
    packed = np.round((tas - 280) * 100).astype("i2")
    packed[:, 0, :3] = -32767
    return xr.Dataset(
        {
            "tas": (("time", "lat", "lon"), tas, {"units": "K"}),
            "packed": (("time", "lat", "lon"), packed, {"scale_factor": 0.01, "add_offset": 280.0}),
        },
        coords={"time": np.arange(23), "lat": np.linspace(-80, 80, 9), "lon": np.linspace(0, 324, 10)},
    )


def _write_source(tmp_path, kind: str):
    ds = _dataset()
    ds["packed"].encoding["_FillValue"] = np.int16(-32767)
    if kind == "zarr3-xarray-defaults":
        path = tmp_path / "src.zarr"
        ds.chunk({"time": 5, "lat": 4}).to_zarr(path, zarr_format=3)
    elif kind == "zarr2-blosc":
        path = tmp_path / "src.zarr"
        blosc = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)
        enc = {v: {"compressors": [blosc]} for v in ds.data_vars}
        ds.chunk({"time": 5}).to_zarr(path, zarr_format=2, encoding=enc)
    else:
        path = tmp_path / "src.nc"
        enc = {v: {"zlib": True, "shuffle": True, "complevel": 4, "chunksizes": (5, 9, 10)} for v in ds.data_vars}
        ds.to_netcdf(path, engine="h5netcdf", encoding=enc)
    return path


@pytest.mark.parametrize("kind", ["zarr3-xarray-defaults", "zarr2-blosc", "netcdf-zlib"])
def test_convert_reads_back_bit_exact(tmp_path, kind):
    src = _write_source(tmp_path, kind)
    dst = C.convert(src, tmp_path / "out.zarr", inner_bytes=80 * 4).path
    raw, decoded = xr.open_dataset(src, decode_cf=False), xr.open_dataset(src)
    out_raw = xr.open_zarr(dst, decode_cf=False)
    out = xr.open_zarr(dst)
    for v in ("tas", "packed"):
        np.testing.assert_array_equal(out_raw[v].values, raw[v].values)  # the stored values, unchanged
        assert out_raw[v].dtype == raw[v].dtype
        xr.testing.assert_identical(out[v].reset_coords(drop=True), decoded[v].reset_coords(drop=True))
        arr = zarr.open_group(dst, mode="r")[v]
        np.testing.assert_array_equal(arr[...], raw[v].values)  # plain zarr, no xarray
        assert C.ShardFormat.of(arr) is not None and arr.shards[0] == 5  # shards are the source's chunks
    manifest = read_manifest(dst)
    assert manifest["complete"] and set(manifest["digests"]) == {"tas", "packed"}
    assert verify(dst) == manifest["digests"]


def test_convert_command_and_verify(tmp_path):
    """In a fresh process: the command converts at a given level, and `pipeline verify` passes."""
    src = _write_source(tmp_path, "zarr3-xarray-defaults")
    run = lambda *a: subprocess.run([sys.executable, "-m", "pipeline", *map(str, a)], capture_output=True, text=True, timeout=120)
    r = run("convert", src, tmp_path / "out.zarr", "--level", "3", "--inner-chunk", "360")
    assert r.returncode == 0, r.stderr
    assert zarr.open_group(tmp_path / "out.zarr", mode="r")["tas"].metadata.codecs[0].codecs[1].level == 3
    r = run("verify", tmp_path / "out.zarr")
    assert r.returncode == 0 and "match their digests" in r.stdout, r.stderr
    r = run("convert", src, tmp_path / "bad.zarr", "--level", "40")
    assert r.returncode == 2 and "level" in r.stderr and not (tmp_path / "bad.zarr").exists()
    if not _has_gpu():  # the GPU asked for by name where none is: exit 2, nothing written
        r = run("convert", src, tmp_path / "nogpu.zarr", "--backend", "gpu")
        assert r.returncode == 2 and "backend 'gpu'" in r.stderr and not (tmp_path / "nogpu.zarr").exists()


def _has_gpu() -> bool:
    from pipeline.backend import gpu_available

    return gpu_available()


def test_bad_level_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="level"):
        C.convert(tmp_path / "missing.zarr", tmp_path / "out.zarr", level=23)


def test_benchmark_smoke(tmp_path):
    """benchmarks/convert_speed.py at a tiny size, so that it cannot rot."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "convert_speed.py"
    spec = importlib.util.spec_from_file_location("convert_speed", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--shape", "10,6,8", "--time-chunk", "4", "--workdir", str(tmp_path), "--paths", "api,zarr", "--backends", "cpu", "--json", str(tmp_path / "r.json")])
    assert set(out["paths"]) == {"api-cpu", "zarr"} and all(r["equal"] and r["gb_per_s"] > 0 for r in out["paths"].values())
    assert (tmp_path / "r.json").exists()


# --- where the frames are compressed --------------------------------------------------------------


def test_shard_falls_back_to_the_cpu_where_nvcomp_fails(tmp_path, monkeypatch):
    """A shard whose frames nvCOMP could not compress is compressed on the CPU, with a warning:
    its file is the one the CPU writes."""
    from pipeline.errors import EncodeError
    from pipeline.gpu import encode

    def fails(flat, size, numbers):
        raise EncodeError("frames not compressed on the GPU: out of memory")

    monkeypatch.setattr(encode, "compress", fails)
    values = _values((8, 16))
    zarr.create_array(str(tmp_path / "s.zarr"), shape=values.shape, shards=(8, 16), chunks=(2, 16), dtype="f4",
                      compressors=[zarr.codecs.ZstdCodec(level=2)], fill_value=0)
    arr = zarr.open_array(str(tmp_path / "s.zarr"), mode="r")
    fmt = C.ShardFormat.of(arr)
    with pytest.warns(RuntimeWarning, match="the CPU compresses this shard"):
        gpu, buf = C.shard_file(fmt, values, (0, 0), backend="gpu")
    cpu, _ = C.shard_file(fmt, values, (0, 0), backend="cpu")
    assert buf is None and [bytes(b) for b in gpu] == [bytes(b) for b in cpu]


def test_unaligned_frames_never_reach_nvcomp(tmp_path, monkeypatch):
    """Frames whose size nvCOMP's alignment does not admit (rows of 13 float32: 52 bytes) go to
    the CPU without a word; aligned ones go to nvCOMP."""
    from pipeline.gpu import encode

    calls = []
    monkeypatch.setattr(encode, "compress", lambda flat, size, numbers: calls.append(size) or ([b"x"] * len(numbers), None))
    for cols, expected in ((13, []), (16, [64])):
        path = tmp_path / f"c{cols}.zarr"
        zarr.create_array(str(path), shape=(4, cols), shards=(4, cols), chunks=(1, cols), dtype="f4",
                          compressors=[zarr.codecs.ZstdCodec(level=2)], fill_value=0)
        fmt = C.ShardFormat.of(zarr.open_array(str(path), mode="r"))
        calls.clear()
        C.shard_file(fmt, _values((4, cols)), (0, 0), backend="gpu")
        assert calls == expected


def test_where_frames_are_compressed(monkeypatch):
    """auto: the GPU where one is visible and nvCOMP is installed, else the CPU; gpu asked for by
    name where it cannot be: a BackendError saying why."""
    from pipeline import backend as B
    from pipeline.errors import BackendError
    from pipeline.gpu import nvcomp

    monkeypatch.setattr(B, "gpu_available", lambda: False)
    assert C._where("auto") == "cpu" and C._where("cpu") == "cpu"
    with pytest.raises(BackendError, match="no CUDA GPU"):
        C._where("gpu")
    monkeypatch.setattr(B, "gpu_available", lambda: True)
    monkeypatch.setattr(nvcomp, "nvcomp_available", lambda: False)
    assert C._where("auto") == "cpu"
    with pytest.raises(BackendError, match="nvCOMP"):
        C._where("gpu")
    monkeypatch.setattr(nvcomp, "nvcomp_available", lambda: True)
    assert C._where("auto") == "gpu"


def test_timeline_benchmark_smoke(tmp_path):
    """benchmarks/convert_timeline.py on the CPU at a tiny size, so that it cannot rot."""
    import importlib.util
    from pathlib import Path

    src = _write_source(tmp_path, "zarr3-xarray-defaults")
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "convert_timeline.py"
    spec = importlib.util.spec_from_file_location("convert_timeline", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main([str(src), "--runs", "1", "--backend", "cpu"])
    shards = [e for e in out["runs"][0]["events"] if e["kind"] == "shard"]
    assert shards and all(0 <= e["start"] <= e["end"] <= out["runs"][0]["seconds"] for e in shards)


def test_small_chunks_are_grouped_into_shards(tmp_path):
    """A store of one time step a chunk (Zarr v2 Blosc, as ERA5-style archives are) becomes shards
    of several steps, two blocks a thread at least; the values are unchanged. Chunks given, or
    ``pipeline.cpu.block-size`` set, are kept as they are."""
    import dask

    ds = _dataset()
    blosc = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)
    src = tmp_path / "steps.zarr"
    ds.chunk({"time": 1}).to_zarr(src, zarr_format=2, encoding={v: {"compressors": [blosc]} for v in ds.data_vars})
    with dask.config.set(num_workers=2):  # at least 4 blocks of the 23 steps
        dst = C.convert(src, tmp_path / "grouped.zarr", backend="cpu").path
        kept = C.convert(src, tmp_path / "kept.zarr", backend="cpu", chunks={"time": 1}).path
        with dask.config.set({"pipeline.cpu.block-size": "1B"}):
            configured = C.convert(src, tmp_path / "configured.zarr", backend="cpu").path
    grouped = zarr.open_group(dst, mode="r")["tas"].shards[0]
    assert grouped > 1 and -(-23 // grouped) >= 4
    for path, steps in ((dst, grouped), (kept, 1), (configured, 1)):
        arr = zarr.open_group(path, mode="r")["tas"]
        assert arr.shards[0] == steps
        np.testing.assert_array_equal(arr[...], ds["tas"].values)
