"""Out of core on the GPU, two-pass ops hold their first pass's blocks in host memory, up to
``pipeline.gpu.host-spill``, instead of reading them again (pipeline/exec/spill.py).

On the CPU the same graphs run with NumPy blocks (``hold_budget`` patched, as the CPU backend
never holds): each block read once, or twice beyond the bound, and the same values."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import numpy as np
import pytest

import pipeline
from pipeline import state
from pipeline.exec import spill
from pipeline.gpu import pinned
from pipeline.exec.spill import second_pass

from .conftest import climate_array, requires_gpu


class CountingSource:
    """An array source that counts the reads of each block along the first axis."""

    def __init__(self, values, step):
        self.values, self.step = values, step
        self.shape, self.dtype, self.ndim = values.shape, values.dtype, values.ndim
        self.reads = {}
        self.lock = threading.Lock()

    def __getitem__(self, key):
        out = self.values[key]
        if out.size:  # not dask's look at an empty slice for the array's type
            with self.lock:
                row = key[0].start // self.step
                self.reads[row] = self.reads.get(row, 0) + 1
        return out


def _two_pass(x):
    mean = x.mean(axis=0)
    return second_pass(x, mean) - mean


@pytest.mark.parametrize("budget_rows", [0, 1, 3, 7])
def test_held_blocks_are_read_once_and_the_rest_twice(monkeypatch, budget_rows):
    values = np.random.default_rng(0).standard_normal((45, 6, 5)).astype("f4")  # 7 rows, the last of 3 steps
    src = CountingSource(values, 7)
    x = da.from_array(src, chunks=(7, 6, 5))
    row = 7 * 6 * 5 * 4
    monkeypatch.setattr(spill, "hold_budget", lambda backend: budget_rows * row)
    spill.spilled_bytes(reset=True)
    with dask.config.set({"pipeline.cpu.memory-limit": "1B"}):  # out of core
        out = _two_pass(x)
        got = out.compute(scheduler="threads")
    plain = da.from_array(values, chunks=(7, 6, 5))
    np.testing.assert_array_equal(got, (plain - plain.mean(axis=0)).compute())
    held = min(budget_rows, 7)
    assert src.reads == {r: 1 if r < held else 2 for r in range(7)}
    held_bytes = sum(values[7 * r:7 * r + 7].nbytes for r in range(held))
    assert spill.spilled_bytes() == held_bytes


@pytest.mark.parametrize("dtype, held", [("f4", True), ("f8", True), ("i2", True), ("i1", False)])
def test_an_input_widened_from_what_it_reads_is_read_again(monkeypatch, dtype, held):
    """Held where its values are at most HOLD_WIDENING times as wide as those of the largest array
    it is computed from (float32 from float32 or int16), read again where wider (float64 from
    int8, as PCA's dosage from genotypes): each block then read twice, and nothing held."""
    values = np.random.default_rng(1).integers(0, 3, size=(45, 6, 5)).astype(dtype)
    src = CountingSource(values, 7)
    x = da.from_array(src, chunks=(7, 6, 5)).astype("f8" if dtype in ("f8", "i1") else "f4")
    assert spill.read_itemsize(x) == np.dtype(dtype).itemsize
    monkeypatch.setattr(spill, "hold_budget", lambda backend: 10**9)
    spill.spilled_bytes(reset=True)
    with dask.config.set({"pipeline.cpu.memory-limit": "1B"}):  # out of core
        got = _two_pass(x).compute(scheduler="threads")
    np.testing.assert_allclose(got, values - values.mean(axis=0, dtype="f8"), rtol=1e-6, atol=1e-6)
    assert src.reads == {r: 1 if held else 2 for r in range(7)}
    assert (spill.spilled_bytes() > 0) == held


def test_the_widest_read_is_the_largest_arrays():
    small = da.ones(10, chunks=5, dtype="f8")  # a mask or a coordinate: not what the graph reads most
    big = da.ones((1000, 10), chunks=(100, 10), dtype="i1")
    assert spill.read_itemsize(big.astype("f8") * small) == 1
    assert spill.read_itemsize((big.astype("f8") * small).rechunk((50, 10))) == 1


def test_rows_held_stop_at_the_budget():
    x = da.zeros((20, 4), chunks=((3, 7, 5, 5), 4), dtype="f8")
    per_step = 4 * 8
    assert spill._held_rows(x, 0) == 0
    assert spill._held_rows(x, 3 * per_step) == 1
    assert spill._held_rows(x, 10 * per_step - 1) == 1  # a row is held whole or not at all
    assert spill._held_rows(x, 10 * per_step) == 2
    assert spill._held_rows(x, 10**9) == 4


def test_the_cpu_backend_holds_nothing():
    assert spill.hold_budget("cpu") == 0


def test_nothing_is_held_on_a_cluster(monkeypatch):
    import distributed

    with dask.config.set({"pipeline.gpu.host-spill": "3GB"}):
        assert spill.hold_budget("gpu") == 3 * 10**9
        monkeypatch.setattr(distributed, "default_client", lambda: object())  # a client is active
        assert spill.hold_budget("gpu") == 0


def test_host_spill_is_bytes_or_a_fraction_of_host_memory():
    import psutil

    total = psutil.virtual_memory().total
    with dask.config.set({"pipeline.gpu.host-spill": "3GB"}):
        assert spill.hold_budget("gpu") == 3 * 10**9
    with dask.config.set({"pipeline.gpu.host-spill": 0.25}):
        assert spill.hold_budget("gpu") == int(0.25 * total)
    with dask.config.set({"pipeline.gpu.host-spill": 0}):
        assert spill.hold_budget("gpu") == 0


@pytest.mark.parametrize("name", ["standardized_anomaly", "anomaly", "detrend"])
def test_two_pass_ops_with_held_blocks_equal_in_core(monkeypatch, name):
    ops = pipeline.ops
    op = {
        "standardized_anomaly": lambda x: ops.standardized_anomaly(x, dim="time"),
        "anomaly": lambda x: ops.anomaly(x, freq="month"),
        "detrend": lambda x: ops.detrend(x, dim="time", deg=1),
    }[name]
    x = climate_array(shape=(50, 9, 12), chunks={"time": 7})
    in_core = op(x).values
    monkeypatch.setattr(spill, "hold_budget", lambda backend: 10**9)
    spill.spilled_bytes(reset=True)
    with dask.config.set({"pipeline.cpu.memory-limit": "1B"}):
        held = op(x)
    assert any(str(k).startswith("pipeline-to-host") for k in held.data.dask.layers)
    np.testing.assert_array_equal(held.values, in_core)
    assert spill.spilled_bytes() == x.data.nbytes


class HostCopy(np.ndarray):
    """A block held for the second pass, told apart from the blocks being worked on."""


@pytest.mark.parametrize("threads", [1, 3])
def test_a_flow_holds_its_working_blocks_and_the_host_copies_only(tmp_path, monkeypatch, threads):
    """What the scheduler holds, other than the host copies: a few blocks a thread, as when the
    input is read twice; each block's copy is made as soon as the block is read, not kept
    waiting on the device."""
    from dask.callbacks import Callback

    from .test_outofcore import _buffers_bytes

    x = climate_array(shape=(1460, 4, 8), chunks={"time": 73})
    x.to_dataset().to_zarr(tmp_path / "s.zarr")
    tas = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu")["tas"]
    block = tas.data.blocks[0].nbytes
    ops = pipeline.ops

    def build():
        return ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"])

    in_core = pipeline.compute(build())
    to_host = spill.to_host
    monkeypatch.setattr(spill, "to_host", lambda b: to_host(b).view(HostCopy))
    monkeypatch.setattr(spill, "hold_budget", lambda backend: 10**9)
    spill.spilled_bytes(reset=True)

    class Held(Callback):
        working = copies = 0
        lock = threading.Lock()

        def _posttask(self, key, result, dsk, state, id):
            values = list(state["cache"].values())
            with self.lock:
                Held.working = max(Held.working, _buffers_bytes([v for v in values if not isinstance(v, HostCopy)]))
                Held.copies = max(Held.copies, sum(v.nbytes for v in values if isinstance(v, HostCopy)))

    with dask.config.set({"pipeline.cpu.memory-limit": int(tas.nbytes // 4)}):
        with Held():
            got = pipeline.compute(build(), threads=threads)
    np.testing.assert_allclose(np.asarray(got), np.asarray(in_core), rtol=1e-6)
    # every block copied once; the copies go as the second pass takes them back
    assert spill.spilled_bytes() == tas.nbytes
    assert tas.nbytes / 2 < Held.copies <= tas.nbytes
    assert Held.working <= (3 * threads + 3) * block, f"held {Held.working / block:.1f} blocks"


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("budget", ["none", "all", "half"])
def test_gpu_two_pass_flow_holds_its_blocks_in_pinned_memory(tmp_path, budget):
    """On the GPU, under a device limit the input does not fit: the same values as in core,
    CuPy chunks, the held bytes counted, the pool under its limit."""
    import cupy as cp

    from pipeline import backend

    x = climate_array(shape=(365, 120, 160), chunks={"time": 30})
    x.to_dataset().to_zarr(tmp_path / "s.zarr")
    spills = {"none": 0, "all": "1GB", "half": int(x.data.nbytes // 2)}[budget]

    def run():
        tas = pipeline.open_dataset(tmp_path / "s.zarr", backend="gpu")["tas"]
        z = pipeline.ops.standardized_anomaly(tas, dim="time")
        assert isinstance(z.data._meta, cp.ndarray)
        # a small result, as flows end in: the whole z would not fit the limit
        got = pipeline.compute(pipeline.ops.weighted_mean(z, dims=["lat", "lon"]))
        assert isinstance(got.data, cp.ndarray)  # the result stays on the device
        return cp.asnumpy(got.data)

    in_core = run()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()  # the in-core run's cached blocks are not this run's
    limit_before = pool.get_limit()
    limit = int(x.data.nbytes // 2)  # out of core: the input is over half of it
    try:
        spill.spilled_bytes(reset=True)
        with dask.config.set({"pipeline.gpu.memory-limit": limit, "pipeline.gpu.host-spill": spills}):
            got = run()
        assert pool.get_limit() == limit
    finally:
        pool.set_limit(size=limit_before)
        backend.state.device.limits.clear()
    held = spill.spilled_bytes()
    rows = spill._held_rows(x.data, spill.B._bytes_or_fraction(spills, 1))
    assert held == sum(x.data.chunks[0][:rows]) * 120 * 160 * 4
    assert (held > 0) == (budget != "none")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(in_core))
    # a held block comes back as the CuPy block it was, from pinned memory
    block = cp.arange(12, dtype="f4").reshape(3, 4)
    host = spill.to_host(block)
    assert isinstance(host, np.ndarray)
    assert cp.cuda.runtime.pointerGetAttributes(host.ctypes.data).type == getattr(cp.cuda.runtime, "memoryTypeHost", 1)
    back = spill.to_device(host, True)
    assert isinstance(back, cp.ndarray)
    cp.testing.assert_array_equal(back, block)
    # its buffer went back for reuse: the next block takes a free buffer, and release() frees it
    free = {b.ptr for b in state.pinned.buffers}
    assert host.ctypes.data in free
    again = spill.to_host(block + 1)
    assert again.ctypes.data in free
    spill.to_device(again, True)
    assert spill.release() >= block.nbytes
    assert not state.held.lent
