"""Out of core on the GPU, blocks of one-frame chunks are decoded on the host ahead of their tasks
(pipeline/gpu/ahead.py).

On any machine: the order and the bound of the decodes ahead, blocks read again, selections that
are not whole blocks, failures and the buffers given back, with the device copy and pinned memory
replaced by NumPy; and each format's host decode into a given buffer, on stores that xarray, zarr
(v2 Blosc, v3 zstd) and h5netcdf wrote, through the sources' own ``read_host``. On the GPU: flows
under a device budget a quarter of their input read ahead and equal the unlimited run.
"""

from __future__ import annotations

import math
import threading

import dask
import numpy as np
import pytest

from pipeline import state
from pipeline.gpu import ahead, pinned

from .conftest import climate_array, requires_gpu


class _Buffer:
    def __init__(self, nbytes):
        self.bytes = np.empty(nbytes, dtype=np.uint8)
        self.nbytes = nbytes


class FakeSource:
    """A source of blocks cut from ``values``, counting each block's host decodes; ``fail`` is the
    region whose decode raises."""

    reads_ahead = True

    def __init__(self, values, chunks, fail=None, gate=None):
        self.values, self.chunks, self.fail, self.gate = values, chunks, fail, gate
        self.shape, self.dtype = values.shape, values.dtype
        self.decoded: list = []
        self.direct: list = []
        self.in_flight_peak = 0
        self.lock = threading.Lock()

    def read(self, region):  # the in-core path, on the device
        self.direct.append(tuple((s.start, s.stop) for s in region))
        return self.values[region].copy()

    def read_host(self, region, out):
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.decoded.append(tuple((s.start, s.stop) for s in region))
            self.in_flight_peak = max(self.in_flight_peak, state.ahead.bytes)
        if region == self.fail:
            raise OSError("a chunk file cut short")
        out[...] = self.values[region]


def read(source, region):
    """``ahead.read`` with the device copy as a NumPy copy."""
    return ahead.read(source, region, lambda host: np.array(host, copy=True))


@pytest.fixture
def host_only(monkeypatch):
    """Pinned buffers as plain NumPy; counts the buffers taken and given back."""
    taken, given = [], []

    def take(nbytes, inline=False):
        taken.append(nbytes)
        return _Buffer(nbytes)

    monkeypatch.setattr(pinned, "take", take)
    monkeypatch.setattr(pinned, "give", lambda buf: given.append(buf.nbytes))
    monkeypatch.setattr(state, "ahead", state.AheadState())
    return taken, given


def _regions(chunks):
    bounds = [np.cumsum((0,) + tuple(c)) for c in chunks]
    grid = [range(len(c)) for c in chunks]
    for idx in np.ndindex(*[len(g) for g in grid]):
        yield tuple(slice(int(b[i]), int(b[i + 1])) for b, i in zip(bounds, idx))


def test_blocks_read_in_order_are_decoded_once_ahead_and_equal(host_only, monkeypatch):
    taken, given = host_only
    values = np.arange(23 * 5 * 4, dtype="f4").reshape(23, 5, 4)
    chunks = ((4, 4, 4, 4, 4, 3), (3, 2), (4,))
    src = FakeSource(values, chunks)
    monkeypatch.setattr(ahead, "budget", lambda: 10**9)
    with ahead.reading_ahead() as on:
        assert on
        for region in _regions(chunks):
            np.testing.assert_array_equal(read(src, region), values[region])
    assert sorted(src.decoded) == sorted({tuple((s.start, s.stop) for s in r) for r in _regions(chunks)})
    assert len(src.decoded) == 12  # each block once: none decoded again, none twice ahead
    assert len(taken) == len(given) == 12 and state.ahead.bytes == 0 and not state.ahead.sources


def test_blocks_asked_for_backwards_as_dask_orders_reductions_are_decoded_ahead(host_only, monkeypatch):
    values = np.arange(12 * 3, dtype="f4").reshape(12, 3)
    chunks = ((1,) * 12, (3,))
    src = FakeSource(values, chunks)
    monkeypatch.setattr(ahead, "budget", lambda: 10**6)
    order = [11, 8, 10, 9, 7, 6, 5, 4, 3, 2, 1, 0]  # subtree by subtree, mostly backwards
    with ahead.reading_ahead():
        np.testing.assert_array_equal(read(src, (slice(11, 12), slice(0, 3))), values[11:])
        # the blocks nearest the first one asked for are on their way, not only those after it
        assert {10, 9} <= set(state.ahead.sources[id(src)].entries)
        for b in order[1:]:
            np.testing.assert_array_equal(read(src, (slice(b, b + 1), slice(0, 3))), values[b:b + 1])
    assert sorted(src.decoded) == [((b, b + 1), (0, 3)) for b in range(12)]


def test_what_is_decoded_ahead_stays_within_the_budget(host_only, monkeypatch):
    values = np.arange(40 * 10, dtype="f8").reshape(40, 10)
    chunks = ((4,) * 10, (10,))
    block = 4 * 10 * 8
    src = FakeSource(values, chunks)
    monkeypatch.setattr(ahead, "budget", lambda: 3 * block)
    with ahead.reading_ahead():
        for region in _regions(chunks):
            np.testing.assert_array_equal(read(src, region), values[region])
    # the task's own block, and at most the budget's three blocks after it
    assert src.in_flight_peak <= 4 * block
    assert len(src.decoded) == 10 and state.ahead.bytes == 0


def test_blocks_read_again_are_decoded_again_and_selections_directly(host_only, monkeypatch):
    taken, given = host_only
    values = np.arange(30, dtype="i4").reshape(30, 1)
    chunks = ((7, 7, 7, 7, 2), (1,))
    src = FakeSource(values, chunks)
    monkeypatch.setattr(ahead, "budget", lambda: 10**6)
    with ahead.reading_ahead():
        for _ in range(2):  # a second pass over the input, as two-pass ops out of core make
            for region in _regions(chunks):
                np.testing.assert_array_equal(read(src, region), values[region])
        part = (slice(3, 9), slice(0, 1))  # not one block: read as in core
        np.testing.assert_array_equal(read(src, part), values[part])
    assert len(src.decoded) == 2 * 5 and src.direct == [((3, 9), (0, 1))]
    assert len(taken) == len(given) and state.ahead.bytes == 0


def test_blocks_decoded_ahead_and_never_taken_are_given_back(host_only, monkeypatch):
    taken, given = host_only
    values = np.zeros((50, 2), dtype="f4")
    chunks = ((5,) * 10, (2,))
    gate = threading.Event()
    src = FakeSource(values, chunks, gate=gate)
    monkeypatch.setattr(ahead, "budget", lambda: 10**6)
    with ahead.reading_ahead():
        gate.set()
        read(src, (slice(0, 5), slice(0, 2)))  # only the first block is taken
    from pipeline.gpu.iopool import io_pool

    n = min(10, 1 + 2 * io_pool().threads)  # the block taken, and twice the I/O threads after it
    assert len(src.decoded) == n and len(taken) == len(given) == n
    assert state.ahead.bytes == 0 and not state.ahead.sources


def test_a_block_that_fails_raises_for_its_task_and_its_buffer_comes_back(host_only, monkeypatch):
    taken, given = host_only
    values = np.arange(12, dtype="f4").reshape(12, 1)
    chunks = ((3, 3, 3, 3), (1,))
    bad = (slice(3, 6), slice(0, 1))
    src = FakeSource(values, chunks, fail=bad)
    monkeypatch.setattr(ahead, "budget", lambda: 10**6)
    with ahead.reading_ahead():
        np.testing.assert_array_equal(read(src, (slice(0, 3), slice(0, 1))), values[:3])
        with pytest.raises(OSError, match="cut short"):
            read(src, bad)
        np.testing.assert_array_equal(read(src, (slice(6, 9), slice(0, 1))), values[6:9])
    assert len(taken) == len(given) and state.ahead.bytes == 0


def test_reading_ahead_is_off_without_a_budget_or_outside_a_computation(host_only, monkeypatch):
    src = FakeSource(np.zeros((8, 2), "f4"), ((4, 4), (2,)))
    region = (slice(0, 4), slice(0, 2))
    monkeypatch.setattr("pipeline.backend.memory_budget", lambda backend: 10)  # out of core
    assert not ahead.takes(src, region)
    with ahead.reading_ahead():
        assert ahead.takes(src, region)
    with dask.config.set({"pipeline.gpu.read-ahead": 0}), ahead.reading_ahead() as on:
        assert not on and not ahead.takes(src, region)
    monkeypatch.setattr("pipeline.backend.memory_budget", lambda backend: 10**9)  # in core
    with ahead.reading_ahead():
        assert not ahead.takes(src, region)


# --- each format's host decode into a given buffer, on stores other tools wrote ---------------------


def _finish_on_host(source, block, left):
    """``finish_device`` with NumPy as the device: the shuffle left by a NetCDF4 source's host
    decode, undone by the host's own loop."""
    from pipeline.gpu import hdf5

    hdf5.unshuffle(source.lay, block.reshape(-1).view(np.uint8), left, hdf5.unshuffle_temp(np, source.lay, len(left)))


def _check_read_host(source, values):
    shuffled_left = 0
    for region in _regions(source.chunks):
        out = np.full(tuple(s.stop - s.start for s in region), -7, dtype=source.dtype)
        left = source.read_host(region, out)
        if left:
            assert not np.array_equal(out, values[region])  # still shuffled, for the device
            _finish_on_host(source, out, left)
            shuffled_left += 1
        np.testing.assert_array_equal(out, values[region])
    return shuffled_left


@pytest.mark.parametrize("fmt", ["zarr-v3", "zarr-v2-blosc", "netcdf4"])
def test_sources_decode_blocks_on_the_host_into_a_given_buffer(tmp_path, fmt):
    import dask.array as da

    from pipeline.gpu import hdf5, reader

    x = climate_array(shape=(31, 7, 9), nan_fraction=0.1)
    ds = x.to_dataset()
    if fmt == "netcdf4":
        path = tmp_path / "tas.nc"
        ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (4, 7, 9)}})
        lay = hdf5.layout(path, "tas")
        chunks = da.core.normalize_chunks((8, 7, 9), x.shape)  # two stored chunks a block, the last cut
        source = hdf5.H5Source(lay, 3, x.shape, lay.dtype, chunks)
    else:
        path = tmp_path / "tas.zarr"
        if fmt == "zarr-v3":  # xarray's defaults: Zarr v3, zarr's default zstd
            ds.chunk({"time": 4}).to_zarr(path, zarr_format=3, consolidated=False)
        else:
            import numcodecs

            enc = {"tas": {"compressors": [numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)]}}
            ds.chunk({"time": 1}).to_zarr(path, zarr_format=2, encoding=enc, consolidated=False)
        lay = reader.layout(path / "tas")
        chunks = da.core.normalize_chunks((8, 7, 9), x.shape)
        source = reader.GpuSource(lay, 3, x.shape, lay.dtype, chunks)
    assert source.reads_ahead
    left = _check_read_host(source, x.values)
    # NetCDF4: blocks of whole chunks in place leave their shuffle to the device; the last block,
    # cut by the array's edge, is unshuffled on the host (its chunks go through a scratch buffer)
    assert left == (3 if fmt == "netcdf4" else 0)
    # and through the read-ahead path, the device copy aside
    with pytest.MonkeyPatch.context() as mp:
        if fmt == "netcdf4":
            mp.setattr(hdf5.H5Source, "finish_device", _finish_on_host)
        mp.setattr(pinned, "take", lambda n, inline=False: _Buffer(n))
        mp.setattr(pinned, "give", lambda buf: None)
        mp.setattr(state, "ahead", state.AheadState())
        got = np.empty_like(x.values)
        with ahead.reading_ahead():
            for region in _regions(chunks):
                got[region] = read(source, region)
    np.testing.assert_array_equal(got, x.values)


def test_sharded_zarr_stays_on_the_gpu_path(tmp_path):
    import zarr

    from pipeline.gpu import reader

    path = tmp_path / "s.zarr"
    arr = zarr.create_array(path, shape=(8, 6), chunks=(2, 6), shards=(4, 6), dtype="f4")
    arr[:] = np.arange(48, dtype="f4").reshape(8, 6)
    lay = reader.layout(path)
    assert lay.sharded and not reader.GpuSource(lay, 2, (8, 6), lay.dtype, ((4, 4), (6,))).reads_ahead


# --- on the GPU -----------------------------------------------------------------------------------


# the out-of-core run, in a process of its own: the budget bounds the whole process's device pool,
# which the tests run before in a test process may hold more of than a quarter of this input
OUT_OF_CORE = """
import json, sys
import dask, numpy as np
import pipeline
from pipeline import state
from pipeline.gpu import ahead
path, limit, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
decodes = []
real = ahead._decode
ahead._decode = lambda *a: decodes.append(a[1]) or real(*a)
with dask.config.set({"pipeline.gpu.memory-limit": limit}):
    tas = pipeline.open_dataset(path, backend="gpu")["tas"]
    ops = pipeline.ops
    r = pipeline.compute(ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"], weights="coslat"))
np.save(out, r.as_numpy().values)
print(json.dumps({"decodes": len(decodes), "held": state.ahead.bytes, "sources": len(state.ahead.sources)}))
"""


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("fmt", ["zarr-v3", "netcdf4"])
def test_flows_under_a_quarter_of_their_input_read_ahead_and_equal_in_core(tmp_path, fmt):
    import json
    import subprocess
    import sys

    import pipeline

    x = climate_array(shape=(365, 40, 60), nan_fraction=0.05)
    ds = x.to_dataset()
    if fmt == "netcdf4":
        path = tmp_path / "tas.nc"
        ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"zlib": True, "shuffle": True, "chunksizes": (20, 40, 60)}})
    else:
        path = tmp_path / "tas.zarr"
        ds.chunk({"time": 20}).to_zarr(path, zarr_format=3, consolidated=False)
    ops = pipeline.ops
    tas = pipeline.open_dataset(path, backend="gpu")["tas"]
    in_core = pipeline.compute(ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"], weights="coslat"))
    r = subprocess.run([sys.executable, "-c", OUT_OF_CORE, str(path), str(math.ceil(x.nbytes / 4)), str(tmp_path / "o.npy")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["decodes"] >= 19  # every block decoded on the host, ahead
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), in_core.as_numpy().values)
    assert facts["held"] == 0 and facts["sources"] == 0
