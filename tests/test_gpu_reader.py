"""The GPU Zarr reader: layouts parsed and frames found exactly as zarr writes them (on every
machine, through the CPU twin of the decode), and the GPU read equal to zarr's own (on a GPU)."""

from __future__ import annotations

import contextlib

import itertools

import dask
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from pipeline.gpu import reader
from pipeline import state
from pipeline.errors import InputError, UnsupportedLayout
from pipeline.sinks.convert import convert, inner_chunk
from pipeline.sources import open_dataset

from .conftest import requires_gpu

RNG = np.random.default_rng(7)

# name -> create_array arguments; shapes are not multiples of the chunks, so edge chunks are cut
LAYOUTS = {
    "v3-zstd": dict(chunks=(4, 5, 6)),
    "v3-raw": dict(chunks=(4, 5, 6), compressors=None),
    "v3-zstd-crc": dict(chunks=(4, 5, 6), compressors=[ZstdCodec(), Crc32cCodec()]),
    "v3-sharded-contiguous": dict(shards=(4, 10, 12), chunks=(1, 5, 12)),
    "v3-sharded-tiles": dict(shards=(4, 10, 12), chunks=(2, 5, 4)),
    "v3-sharded-crc": dict(shards=(4, 10, 12), chunks=(1, 10, 12), compressors=[ZstdCodec(level=3), Crc32cCodec()]),
    "v3-sharded-raw": dict(shards=(4, 10, 12), chunks=(2, 5, 4), compressors=None),
    "v2-zstd": dict(chunks=(4, 5, 6), zarr_format=2),
}
SHAPE = (11, 13, 14)


def make(tmp_path, name, dtype="float32", holes=False, **extra):
    kwargs = {**LAYOUTS[name], **extra}
    if kwargs.get("zarr_format") == 2:
        import numcodecs

        kwargs["compressors"] = numcodecs.Zstd(level=1)
    store = tmp_path / f"{name}.zarr"
    fill = np.nan if np.dtype(dtype).kind == "f" else np.iinfo(dtype).max
    arr = zarr.create_array(store, name="x", shape=SHAPE, dtype=dtype, fill_value=fill, **kwargs)
    values = (RNG.standard_normal(SHAPE) * 100).astype(dtype)
    if holes:  # whole chunks and inner chunks of fill value are not written at all
        values[:4] = fill
        values[5:6, :5] = fill
    arr[...] = values
    return store, values


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_and_host_decode_match_zarr(tmp_path, name):
    store, values = make(tmp_path, name, holes=True)
    lay = reader.layout(store / "x")
    arr = zarr.open_array(store, path="x", mode="r")
    assert lay.shape == SHAPE and lay.dtype == np.float32
    assert lay.chunk == tuple(arr.shards or arr.chunks)
    assert lay.inner == tuple(arr.chunks)
    checked = 0
    for coords in np.ndindex(*[-(-n // c) for n, c in zip(SHAPE, lay.chunk)]):
        path = lay.path(coords)
        region = tuple(slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, lay.chunk, SHAPE))
        try:
            blob = open(path, "rb").read()
        except FileNotFoundError:
            assert np.isnan(values[region]).all(), f"{path} missing but holds values"
            continue
        chunk = reader.decode_chunk_host(lay, blob)
        assert chunk.shape == lay.chunk
        np.testing.assert_array_equal(chunk[tuple(slice(0, r.stop - r.start) for r in region)], values[region])
        checked += 1
    assert checked > 0


def test_contiguous_inner():
    def lay(chunk, inner):
        return reader.Layout(root="", shape=chunk, dtype=np.dtype("f4"), chunk=chunk, inner=inner, codec="zstd", frame_crc=False, sharded=True)

    assert lay((4, 10, 12), (1, 5, 12)).contiguous_inner
    assert lay((4, 10, 12), (1, 10, 12)).contiguous_inner
    assert lay((4, 10, 12), (2, 10, 12)).contiguous_inner
    assert lay((4, 10, 12), (4, 10, 12)).contiguous_inner
    assert not lay((4, 10, 12), (2, 5, 12)).contiguous_inner
    assert not lay((4, 10, 12), (1, 10, 6)).contiguous_inner


@pytest.mark.parametrize(
    "codecs",
    [dict(compressors=GzipCodec()), dict(compressors=[BloscCodec(), ZstdCodec()]), dict(filters=[TransposeCodec(order=(2, 1, 0))])],
    ids=["gzip", "blosc-then-zstd", "transpose"],
)
def test_unsupported_layouts_are_named(tmp_path, codecs):
    zarr.create_array(tmp_path / "s.zarr", name="x", shape=(4, 4, 4), chunks=(2, 2, 2), dtype="f4", **codecs)
    with pytest.raises(UnsupportedLayout):
        reader.layout(tmp_path / "s.zarr" / "x")


def test_inner_chunk_is_a_contiguous_run():
    assert inner_chunk((73, 721, 1440), 4, 1 << 20) == (1, 103, 1440)
    assert inner_chunk((10, 5), 4, 1 << 20) == (10, 5)
    assert inner_chunk((73, 4000, 4000), 4, 1 << 20) == (1, 50, 4000)
    assert inner_chunk((8, 3, 5), 4, 100) == (1, 3, 5)  # 60 bytes a step: two steps would exceed 100
    for shard in [(73, 721, 1440), (12, 6, 7), (5, 1 << 20)]:
        inner = inner_chunk(shard, 4, 4096)
        assert all(s % i == 0 for s, i in zip(shard, inner))
        lay = reader.Layout(root="", shape=shard, dtype=np.dtype("f4"), chunk=shard, inner=inner, codec="zstd", frame_crc=False, sharded=True)
        assert lay.contiguous_inner


def test_convert_keeps_values_and_shards(tmp_path):
    from pipeline.demo import write_demo

    src = write_demo(tmp_path / "demo.zarr", "2MB")
    dst = convert(src, tmp_path / "gpu.zarr", inner_bytes="8KB")
    a, b = open_dataset(src, backend="cpu"), open_dataset(dst, backend="cpu")
    for v in a.data_vars:
        np.testing.assert_array_equal(a[v].values, b[v].values)
        assert a[v].dtype == b[v].dtype
    lay = reader.layout(dst / "tas")
    assert lay.sharded and lay.contiguous_inner and lay.inner_nbytes <= 8192
    assert b["tas"].data.chunks == a["tas"].data.chunks  # one block per shard, not per inner chunk
    # chunks given for some dimensions: the others still take one block per shard (xarray alone
    # takes the inner chunks, which sent blocks of several shards to zarr's CPU decoding)
    shard = b["tas"].data.chunksize
    c = open_dataset(dst, backend="cpu", chunks={"time": 2 * shard[0]})["tas"].data
    assert c.chunksize == (min(2 * shard[0], c.shape[0]), *shard[1:])
    assert reader.aligned(c.chunks, lay.chunk)


def _two_sharded_arrays(tmp_path):
    """x (float32) and y (float64) over (time, lat, lon), 5 shards of 2 steps: 160 and 320 bytes."""
    store = tmp_path / "two.zarr"
    group = zarr.open_group(store, mode="w")
    values = {}
    for name, dtype in (("x", "float32"), ("y", "float64")):
        arr = group.create_array(name, shape=(10, 4, 5), dtype=dtype, shards=(2, 4, 5), chunks=(1, 4, 5),
                                 dimension_names=("time", "lat", "lon"))
        values[name] = RNG.standard_normal((10, 4, 5)).astype(dtype)
        arr[...] = values[name]
    return store, values


def test_blocks_take_whole_shards_up_to_a_target(tmp_path):
    import xarray as xr

    from pipeline.exec.memory import block_target
    from pipeline.sources import blocks_along_first
    from pipeline.sources.zarr import _shard_chunks

    store, _ = _two_sharded_arrays(tmp_path)
    shards = _shard_chunks(store)
    assert shards == {"time": 2, "lat": 4, "lon": 5}
    raw = xr.open_zarr(store, chunks=None)
    assert blocks_along_first(raw, shards, 0) == shards
    assert blocks_along_first(raw, shards, 100)["time"] == 2  # at least one shard
    assert blocks_along_first(raw, shards, 700)["time"] == 4  # x fits 4 shards, y only 2: the fewest
    assert blocks_along_first(raw, shards, 10**9)["time"] == 10  # no more shards than the array has
    assert blocks_along_first(raw, {}, 10**9) == {"time": 10, "lat": 4, "lon": 5}  # plain chunks grow too
    assert blocks_along_first(raw, {}, 0) == {}
    assert block_target("cpu") == 16 * 10**6  # on the CPU, by default, 16MB of whole shards a block
    assert blocks_along_first(raw, {}, 10**9, min_blocks=4)["time"] == 2  # 10 chunks, at least 4 blocks
    with dask.config.set({"pipeline.cpu.block-size": None}):
        assert block_target("cpu") == 0  # null: one shard a block
        assert open_dataset(store, backend="cpu")["x"].data.chunks[0] == (2,) * 5


def test_convert_uncompressed_is_one_plain_chunk_per_block(tmp_path):
    from pipeline.demo import write_demo

    src = write_demo(tmp_path / "demo.zarr", "2MB")
    dst = convert(src, tmp_path / "raw.zarr", compression="none", chunks={"time": 10})
    lay = reader.layout(dst / "tas")
    assert (lay.codec, lay.sharded, lay.chunk[0]) == ("none", False, 10)
    a = open_dataset(src, backend="cpu")["tas"].values
    blob = (dst / "tas" / "c" / "0" / "0" / "0").read_bytes()
    np.testing.assert_array_equal(reader.decode_chunk_host(lay, blob), a[:10])
    with pytest.raises(InputError, match="compression must be"):
        convert(src, tmp_path / "bad.zarr", compression="lz4")


# --- on the GPU ----------------------------------------------------------------------------------


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nvcomp", [True, False], ids=["nvcomp", "staged"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gpu_read_equals_zarr(tmp_path, name, nvcomp):
    import cupy as cp

    store, values = make(tmp_path, name, holes=True)
    lay = reader.layout(store / "x")
    for chunks in (None, tuple(2 * c for c in lay.chunk)):
        x = reader.open_array(store, "x", chunks=chunks, nvcomp=nvcomp)
        assert isinstance(x._meta, cp.ndarray)
        out = x.compute()
        assert isinstance(out, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(out), values)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v3-sharded-tiles", "v3-zstd"])
def test_gpu_reads_pin_files_and_see_them_change(tmp_path, name):
    """Files pinned in the page cache by the first read are what later reads copy from; a store
    rewritten in place is read anew; with pipeline.gpu.pinned-files 0 nothing is pinned."""
    from pipeline.gpu import pinned

    store, values = make(tmp_path, name, holes=True)
    sizes = {str(p): p.stat().st_size for p in (store / "x").rglob("*") if p.is_file() and p.name != "zarr.json"}
    pinned.release_files()
    with dask.config.set({"pipeline.gpu.pinned-files": 0}):
        np.testing.assert_array_equal(reader.open_array(store, "x").compute().get(), values)
        assert pinned.pinned_files_bytes() == 0
    # files that the GPU decodes are pinned (those that the CPU decodes never cross the bus
    # compressed): here the split sends all to the GPU
    with dask.config.set({"pipeline.gpu.pinned-files": "1GB", "pipeline.gpu.pin-min-file": 0,
                          "pipeline.gpu.decode-rates": {"cpu-frame": 1}}), \
            _fresh_rates():
        for _ in range(2):  # the first read pins every file, the second copies from them
            np.testing.assert_array_equal(reader.open_array(store, "x").compute().get(), values)
            assert pinned.pin_failure() is None
            assert pinned.pinned_files_bytes() == sum(sizes.values())
            assert set(state.pinned.files) == set(sizes)
        arr = zarr.open_array(store, path="x", mode="r+")
        changed = values * 2 + 1
        arr[...] = changed
        np.testing.assert_array_equal(reader.open_array(store, "x").compute().get(), changed)
    assert pinned.release_files() > 0 and pinned.pinned_files_bytes() == 0


@contextlib.contextmanager
def _fresh_rates():
    """The decode speeds of pipeline.gpu.split read again from the settings, then restored."""
    saved = state.decode.rates
    state.decode.rates = None
    try:
        yield
    finally:
        state.decode.rates = saved


@requires_gpu
@pytest.mark.gpu
def test_gpu_blocks_grow_to_the_block_size(tmp_path):
    import cupy as cp

    from pipeline.exec.memory import block_target

    store, values = _two_sharded_arrays(tmp_path)
    with dask.config.set({"pipeline.gpu.block-size": 700}):
        assert block_target("gpu") == 700
        ds = open_dataset(store, backend="gpu")
    for name in ("x", "y"):
        assert ds[name].data.chunks[0] == (4, 4, 2)
        out = ds[name].data.compute()
        assert isinstance(out, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(out), values[name])
    with dask.config.set({"pipeline.gpu.block-size": None}):
        assert open_dataset(store, backend="gpu")["x"].data.chunks[0] == (2,) * 5


@requires_gpu
@pytest.mark.gpu
def test_gpu_read_uses_nvcomp_where_it_can(tmp_path):
    store, _ = make(tmp_path, "v3-sharded-contiguous")
    x = reader.open_array(store, "x", nvcomp=True)
    sources = [v for v in x.dask.values() if isinstance(v, (reader.GpuSource, reader.StagedSource))]
    assert reader.nvcomp_available(), "nvCOMP is not installed (the gpu extra installs it)"
    assert sources and all(isinstance(s, reader.GpuSource) for s in sources)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["int16", "float64", "uint8"])
def test_gpu_read_other_dtypes(tmp_path, dtype):
    import cupy as cp

    store, values = make(tmp_path, "v3-sharded-tiles", dtype=dtype)
    np.testing.assert_array_equal(cp.asnumpy(reader.open_array(store, "x", nvcomp=True).compute()), values)


@requires_gpu
@pytest.mark.gpu
def test_open_dataset_gpu_equals_cpu_on_both_layouts(tmp_path):
    from pipeline.demo import write_demo

    src = write_demo(tmp_path / "demo.zarr", "2MB")
    dst = convert(src, tmp_path / "gpu.zarr", inner_bytes="8KB")
    cpu = open_dataset(src, backend="cpu").compute()
    for store, nvcomp in itertools.product((src, dst), (True, False)):
        with dask.config.set({"pipeline.gpu.nvcomp": nvcomp}):
            gpu = open_dataset(store, backend="gpu")
        for v in cpu.data_vars:
            assert gpu[v].dtype == cpu[v].dtype
            np.testing.assert_array_equal(gpu[v].data.compute().get(), cpu[v].values)


def test_io_pool_runs_earlier_reads_first():
    """Jobs run in the order of their tickets, not of their arrival; errors reach the waiter."""
    import threading

    from pipeline.gpu.iopool import IOPool

    pool = IOPool(1)
    gate, ran = threading.Event(), []
    first = pool.submit(gate.wait)  # holds the only thread while the others queue
    early, late = pool.ticket(), pool.ticket()
    jobs = [pool.submit(ran.append, "late", ticket=late), pool.submit(ran.append, "early 1", ticket=early),
            pool.submit(ran.append, "early 2", ticket=early)]
    gate.set()
    for j in [first, *jobs]:
        j.result(timeout=10)
    assert ran == ["early 1", "early 2", "late"]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)


def test_stream_contexts_are_pooled_not_tied_to_threads(monkeypatch):
    """Contexts outlive the threads that used them and go back synchronized; nested use works."""
    import sys
    import threading
    import types

    synced = []

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = id(self)

        def synchronize(self):
            synced.append(self)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0), Stream=Stream))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    from pipeline.gpu import streams

    monkeypatch.setattr(state, "streams", state.StreamState())
    seen = []

    def task():
        with streams.context() as ctx:
            assert streams.current().stream is ctx.stream
            seen.append(ctx)

    for _ in range(3):  # one thread after another: each finds the context the last one gave back
        t = threading.Thread(target=task)
        t.start()
        t.join()
    assert len({id(c) for c in seen}) == 1 and len(synced) == 3
    with streams.context() as outer:
        with streams.context() as inner:
            assert inner is not outer and streams.current().stream is inner.stream
        assert streams.current().stream is outer.stream
    assert len(state.streams.free[0]) == 2


def test_frame_checksums_are_verified_before_decoding(tmp_path):
    """Stores whose chunks end in a crc32c (bytes -> zstd -> crc32c, as flow outputs are written):
    the layout strips the checksum and checks it; a flipped byte is a DecodeError, so the block goes
    to zarr, which names the chunk."""
    from pipeline.errors import DecodeError

    for name in ("v3-zstd-crc", "v3-sharded-crc"):
        store, values = make(tmp_path, name)
        lay = reader.layout(store / "x")
        assert lay.frame_crc and lay.codec == "zstd"
        path = lay.path((0, 0, 0))
        blob = bytearray(open(path, "rb").read())
        np.testing.assert_array_equal(reader.decode_chunk_host(lay, bytes(blob))[:4, :5, :6], values[:4, :5, :6])
        offsets, sizes, _ = reader.frames(lay, bytes(blob))
        blob[int(offsets[0]) + int(sizes[0]) - 1] ^= 0xFF  # the last byte of the first frame
        with pytest.raises(DecodeError, match="crc32c"):
            reader.decode_chunk_host(lay, bytes(blob))


@requires_gpu
@pytest.mark.gpu
def test_gpu_reads_checksummed_store_and_names_a_corrupt_chunk(tmp_path):
    import cupy as cp

    store, values = make(tmp_path, "v3-sharded-crc")
    np.testing.assert_array_equal(cp.asnumpy(reader.open_array(store, "x", nvcomp=True).compute()),
                                  zarr.open_array(store, path="x", mode="r")[...])
    lay = reader.layout(store / "x")
    path = lay.path((1, 0, 0))
    blob = bytearray(open(path, "rb").read())
    blob[10] ^= 0xFF
    open(path, "wb").write(bytes(blob))
    for nvcomp in (True, False):
        with pytest.raises(InputError, match=r"variable 'x': chunk \(1, 0, 0\) \(file c/1/0/0\)"):
            reader.open_array(store, "x", nvcomp=nvcomp).compute()


# --- the split of a block's files between the GPU and the CPU (pipeline.gpu.split) -----------------


def test_split_sends_large_single_frames_to_the_cpu_and_many_small_ones_to_the_gpu():
    from pipeline.gpu import split

    rates = split.Rates(gpu_frame=380e6, gpu_batch=7e9, cpu_frame=600e6)  # measured on an H200
    big = [[303_000_000]] * 20
    # a frame: 0.5 s on a core with 16 decoding, 0.8 s on the GPU, whose batch takes about as long
    # for one frame or six: the GPU takes the four that would make the cores decode twice
    assert split.plan(big, threads=16, r=rates) == [True] * 16 + [False] * 4
    assert split.plan(big[:16], threads=16, r=rates) == [True] * 16
    small = [[4_000_000]] * 400
    host = split.plan(small, threads=2, r=rates)
    # two threads take what they finish in the time the GPU takes for the rest, no more
    gpu_s = split.gpu_seconds([4_000_000] * host.count(False), rates)
    cpu_s = host.count(True) * 4_000_000 / rates.cpu_frame / 2
    assert 0 < host.count(True) < 200 and abs(gpu_s - cpu_s) < 0.01
    assert split.plan([[303_000_000], [], [1]], threads=0, r=rates) == [False] * 3  # no threads: all on the GPU
    assert split.plan([[], []], threads=4, r=rates) == [False, False]  # absent files


def test_split_rates_follow_measurements(monkeypatch):
    from pipeline import state
    from pipeline.gpu import split

    monkeypatch.setattr(state, "decode", state.DecodeState())
    with dask.config.set({"pipeline.gpu.decode-rates": {"cpu-frame": "100MB"}}):
        r = split.rates()
    assert r.cpu_frame == 100e6 and r.gpu_batch == 20e9
    split.observe_cpu(200_000_000, 0.5)  # 400 MB/s measured
    assert 100e6 < r.cpu_frame < 400e6
    before = r.gpu_frame
    split.observe_gpu(300_000_000, 300_000_000, 0.3)  # one large frame: its rate
    assert r.gpu_frame > before and r.gpu_batch == 20e9
    split.observe_gpu(1_000_000, 8_000_000_000, 0.2)  # many small frames: the batch rate
    assert r.gpu_batch > 20e9


def test_split_rates_read_either_spelling_of_their_keys(monkeypatch):
    """DASK_PIPELINE__GPU__DECODE_RATES__GPU_BATCH sets "gpu_batch", which dask keeps as spelt."""
    from pipeline import state
    from pipeline.gpu import split

    monkeypatch.setattr(state, "decode", state.DecodeState())
    monkeypatch.setenv("DASK_PIPELINE__GPU__DECODE_RATES__GPU_BATCH", "40GB")
    with dask.config.set(dask.config.collect_env()):
        r = split.rates()
    assert r.gpu_batch == 40e9 and r.gpu_frame == 380e6 and r.cpu_frame == 600e6


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cpu_rate", ["1GB", "1PB", "1B"])
def test_gpu_read_of_zarr_default_zstd_split_between_gpu_and_cpu(tmp_path, monkeypatch, cpu_rate):
    """A store as xarray writes it (one zstd frame a chunk), some files decoded by nvCOMP and some
    by the CPU, equals zarr's own read, the array's edge chunk included; every file is decoded by
    one of the two, as the split's rates say."""
    import cupy as cp
    import xarray as xr

    from pipeline import state
    from pipeline.gpu import nvcomp, reader

    monkeypatch.setattr(state, "decode", state.DecodeState())
    decoded = {"gpu": 0, "cpu": 0}
    gpu_decode, cpu_decode = nvcomp._decode, reader._decode_file

    def on_gpu(codec, configs, srcs, outs, count, size):
        decoded["gpu"] += count
        gpu_decode(codec, configs, srcs, outs, count, size)

    def on_cpu(*args):
        decoded["cpu"] += 1
        assert len(args[-1]) == 5 * 30 * 40 * 4  # into a pinned buffer of one chunk
        cpu_decode(*args)

    monkeypatch.setattr(nvcomp, "_decode", on_gpu)
    monkeypatch.setattr(reader, "_decode_file", on_cpu)
    values = RNG.standard_normal((23, 30, 40)).astype(np.float32)
    values[3, 4, 5] = np.nan
    xr.Dataset({"tas": (("time", "lat", "lon"), values)}).chunk({"time": 5}).to_zarr(tmp_path / "s.zarr", zarr_format=3)
    with dask.config.set({"pipeline.gpu.decode-rates": {"cpu-frame": cpu_rate}, "pipeline.gpu.block-size": "100kB"}):
        # blocks that 2 and 4 GPUs share evenly (pipeline.sources.balanced_fits): 2 files, 2, the edge's
        assert open_dataset(tmp_path / "s.zarr", backend="gpu")["tas"].data.chunks[0] == (10, 10, 3)
        ds = open_dataset(tmp_path / "s.zarr", backend="gpu", chunks={"time": 20})
        assert ds["tas"].data.chunks[0] == (20, 3)  # a block of 4 files to split, and the edge's
        out = ds["tas"].data.compute()
    assert isinstance(out, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(out), values)
    assert decoded["gpu"] + decoded["cpu"] == 5
    if cpu_rate == "1B":  # the CPU would take for ever: every file on the GPU
        assert decoded == {"gpu": 5, "cpu": 0}
    if cpu_rate == "1PB":  # the CPU at once: every file there
        assert decoded == {"gpu": 0, "cpu": 5}
    if decoded["cpu"]:  # the chunks' buffers are back, for the next decodes
        from pipeline.gpu import pinned

        assert pinned.free_for(5 * 30 * 40 * 4) >= 1


def test_nvcomp_pinned_memory_goes_back_only_once_its_stream_is_synchronized(monkeypatch):
    """nvCOMP's pinned memory (pipeline.gpu.nvcomp.PinnedAllocation): on a thread with a lent
    stream, from CuPy's pinned pool, and freed, held by the stream's context until that stream has
    been synchronized; without one, cudaHostAlloc and cudaFreeHost at once, as nvCOMP's own."""
    import sys
    import types

    events = []

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = id(self)

        def synchronize(self):
            events.append("sync")

    class Pooled:  # CuPy's PinnedMemoryPointer: back to the pool when collected
        def __init__(self, n):
            self.ptr, self.n = 4096 + n, n

        def __del__(self):
            events.append(f"pool {self.n}")

    runtime = types.SimpleNamespace(hostAlloc=lambda n, flags: 8192 + n, freeHost=lambda p: events.append(f"freeHost {p - 8192}"))
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0), Stream=Stream, alloc_pinned_memory=Pooled, runtime=runtime))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    from pipeline.gpu import nvcomp, streams

    monkeypatch.setattr(state, "streams", state.StreamState())
    with streams.context() as ctx:
        a, b = nvcomp.PinnedAllocation(100), nvcomp.PinnedAllocation(0)
        assert a.ptr == 4196 and a.ctx is ctx and b.ptr == 4097  # never a null pointer
        del a
        assert events == [] and len(ctx.retired) == 1  # the stream may still read it
    assert events == ["sync", "pool 100"] and ctx.retired == []
    del b  # freed after its context went back: it waits for the next synchronization of that stream
    assert events == ["sync", "pool 100"] and len(ctx.retired) == 1
    with streams.context() as again:
        assert again is ctx
    assert events[2:] == ["sync", "pool 1"] and ctx.retired == []
    events.clear()
    c = nvcomp.PinnedAllocation(64)  # no lent stream here
    assert c.ctx is None and c.ptr == 8256
    del c
    assert events == ["freeHost 64"]


def test_stat_files_equals_os_stat_in_one_call(tmp_path, monkeypatch):
    """A block's files looked up by one compiled call (statx): the fields the reader uses equal
    os.stat's, a missing file is None (a chunk never written), other errors raise as os.stat
    does; without the compiled loop, os.stat a file."""
    import os

    from pipeline.gpu import files, pinned

    paths = []
    for k in range(40):
        (tmp_path / f"c{k}").write_bytes(b"x" * (k * 37))
        paths.append(str(tmp_path / f"c{k}"))
    os.utime(paths[3], ns=(1, 1_700_000_000_123_456_789))  # nanoseconds survive
    paths.insert(5, str(tmp_path / "never-written"))
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(files, "_built", [None] * 3)
        elif files.stat_loop() is None:
            pytest.skip("no compiled loop here (llvmlite or libc's statx missing)")
        got = files.stat_files(paths)
        assert got[5] is None
        for p, st in zip(paths, got):
            if st is not None:
                ref = os.stat(p)
                assert pinned.file_key(st) == pinned.file_key(ref) and st.st_size == ref.st_size
        assert isinstance(got[0], files.FileStat) == compiled
        with pytest.raises(NotADirectoryError):
            files.stat_files([paths[0], paths[1] + "/inside"])
        assert files.stat_files([]) == []


def test_file_loops_begun_early_are_built_once(monkeypatch):
    """The loops' build begun on a thread of its own when a GPU source opens (``build_soon``) is
    the one the first block gets: no second build, whoever asks while it runs."""
    import threading

    from pipeline.gpu import files

    monkeypatch.setattr(files, "_built", [])
    started, go, calls = threading.Event(), threading.Event(), []
    real = files._build

    def build():
        calls.append(threading.current_thread().name)
        started.set()
        assert go.wait(30)
        return real()

    monkeypatch.setattr(files, "_build", build)
    files.build_soon()
    assert started.wait(30)
    files.build_soon()  # while it runs: no other thread
    go.set()
    loop = files.file_loop()
    assert calls == ["pipeline-file-loops"] and files.file_loop() is loop
    files.build_soon()  # once built: nothing
    assert len(calls) == 1


def test_staged_files_go_through_a_few_buffers_in_turn(tmp_path, monkeypatch):
    """A block's files read into pinned memory through at most DEPTH buffers of about SEGMENT
    bytes: each file's bytes are what it holds, and a buffer goes to later files only once the
    copies out of it are done (its event synchronized)."""
    from pipeline.gpu import pinned

    sizes = [300, 500, 200, 900, 100, 100, 700, 50, 400]
    paths = []
    for k, n in enumerate(sizes):
        (tmp_path / f"f{k}").write_bytes(bytes((k * 11 + i) % 251 for i in range(n)))
        paths.append(str(tmp_path / f"f{k}"))
    assert reader._segments(sizes, 1000) == [(0, 3), (3, 5), (5, 8), (8, 9)]
    assert reader._segments([2000, 10], 1000) == [(0, 1), (1, 2)] and reader._segments([], 1000) == []

    log, lent = [], set()

    class Buffer:
        def __init__(self, n):
            self.bytes = np.zeros(n, dtype=np.uint8)

    def take(n):
        buf = Buffer(n)
        lent.add(id(buf))
        log.append(("take", len(lent)))
        return buf

    def give(buf):
        lent.discard(id(buf))
        log.append(("give", len(lent)))

    class Event:
        def __init__(self, segment):
            self.segment, self.done = segment, False

        def synchronize(self):
            self.done = True
            log.append(("sync", self.segment))

    class Stream:
        def record(self):
            return Event(len([e for e in log if e[0] == "crossed"]))

    monkeypatch.setattr(reader, "SEGMENT", 1000)
    monkeypatch.setattr(reader, "DEPTH", 2)
    monkeypatch.setattr(pinned, "take", take)
    monkeypatch.setattr(pinned, "give", give)
    staging = reader._Staging(paths, sizes)
    assert len(lent) == 2  # DEPTH segments read at once
    stream = Stream()
    for i, path in enumerate(paths):
        f = reader._StagedFile(staging, i)
        assert f().tobytes() == open(path, "rb").read()
        assert f.buffer[f.start:f.start + f.size].tobytes() == open(path, "rb").read()
        if staging.last_of_segment(i):
            log.append(("crossed", i))
            staging.crossed(i, stream)
        assert len(lent) <= 2
    staging.close()
    assert not lent
    # every buffer given back for the next segment after the copies out of it were waited for
    for k, entry in enumerate(log):
        if entry[0] == "give" and k + 1 < len(log) and log[k + 1][0] == "take":
            assert log[k - 1][0] == "sync"
    assert [e for e in log if e[0] == "take"] and sum(e[0] == "take" for e in log) == 4


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v3-zstd", "v3-zstd-crc", "v3-sharded-tiles", "v2-zstd"])
def test_gpu_read_through_few_staging_buffers_equals_zarr(tmp_path, monkeypatch, name):
    """Files staged through two buffers of one file each, reused within a block: the frames and
    their checksums are taken from each file before its buffer is read into again."""
    import cupy as cp

    store, values = make(tmp_path, name, holes=True)
    monkeypatch.setattr(reader, "SEGMENT", 1)
    monkeypatch.setattr(reader, "DEPTH", 2)
    lay = reader.layout(store / "x")
    with dask.config.set({"pipeline.gpu.pinned-files": 0, "pipeline.gpu.decode-rates": {"cpu-frame": 1}}), _fresh_rates():
        for chunks in (None, tuple(3 * c for c in lay.chunk)):
            out = reader.open_array(store, "x", chunks=chunks, nvcomp=True).compute()
            np.testing.assert_array_equal(cp.asnumpy(out), values)
