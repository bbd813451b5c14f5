"""Out of core: two-pass ops read their input again instead of holding it, with equal results;
the reader's parallel piecewise file reads return the files' bytes."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import pipeline
from pipeline import gpu_zarr
from pipeline.reductions import second_pass

from .conftest import climate_array


def _ops():
    ops = pipeline.ops
    return {
        "standardized_anomaly": lambda x: ops.standardized_anomaly(x, dim="time"),
        "anomaly": lambda x: ops.anomaly(x, freq="month"),
        "detrend": lambda x: ops.detrend(x, dim="time", deg=1),
    }


@pytest.mark.parametrize("name", list(_ops()))
def test_out_of_core_two_pass_ops_equal_in_core(name):
    x = climate_array(shape=(50, 9, 12), chunks={"time": 7})
    op = _ops()[name]
    in_core = op(x)
    with dask.config.set({"pipeline.cpu.memory-limit": "1B"}):  # every input is out of core
        out_of_core = op(x)
    # the second pass reads a copy of the input's graph (new keys) that waits for the statistics
    assert len(dict(out_of_core.data.dask)) > len(dict(in_core.data.dask))
    np.testing.assert_array_equal(out_of_core.values, in_core.values)


def test_second_pass_is_the_input_in_core():
    x = climate_array(shape=(20, 9, 12), chunks={"time": 7}).data
    stats = x.mean(axis=0)
    assert second_pass(x, stats) is x
    with dask.config.set({"pipeline.cpu.memory-limit": "1B"}):
        again = second_pass(x, stats)
    assert again is not x and again.name != x.name
    np.testing.assert_array_equal(again.compute(), x.compute())


def test_read_files_in_parallel_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_zarr, "PIECE", 1000)  # every file in several pieces
    rng = np.random.default_rng(0)
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 999, 1000, 1001, 4567)]
    paths = []
    for k, b in enumerate(blobs):
        p = tmp_path / f"f{k}"
        p.write_bytes(b)
        paths.append(str(p))
    sizes = [len(b) for b in blobs]
    buf = np.zeros(sum(sizes), dtype=np.uint8)
    starts = gpu_zarr.read_files(paths, sizes, buf)
    for b, s in zip(blobs, starts):
        assert buf[s:s + len(b)].tobytes() == b


def test_memory_limits_are_bytes_or_fractions():
    from pipeline.backend import _bytes_or_fraction

    assert _bytes_or_fraction("16GB", 10**12) == 16 * 10**9
    assert _bytes_or_fraction("1B", 10**12) == 1
    assert _bytes_or_fraction(0.5, 1000) == 500
    assert _bytes_or_fraction("0.25", 1000) == 250
    assert _bytes_or_fraction(2e9, 1000) == 2 * 10**9
    assert _bytes_or_fraction(None, 1000) == 1000


def test_threads_are_fewer_when_their_blocks_would_exceed_the_memory_limit():
    import dask.array as da

    from pipeline import memory
    from pipeline.io import compute_threads

    x = da.ones((40, 100, 100), chunks=(10, 100, 100), dtype="f4")  # 400 kB blocks
    total = ((x - x.mean(axis=0)) ** 2).sum(axis=(1, 2))  # a tiny result of large blocks
    assert memory.graph_block_bytes(total) == 400_000
    per_thread = memory.BLOCKS_PER_THREAD * 400_000
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": 8 * per_thread}):
        assert compute_threads(total) == 8
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": 2 * per_thread + 1}):
        assert compute_threads(total) == 2
        assert memory.plan(x, total).threads == 2
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": "1B"}):
        assert compute_threads(total) == 1  # never none: the plan check refuses what cannot fit
    np.testing.assert_allclose(pipeline.compute(total), np.zeros(40))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("flow", ["standardized_anomaly", "monthly_anomaly"])
def test_a_flow_holds_a_few_blocks_not_its_input(tmp_path, flow, threads):
    """The largest set of results Dask's scheduler holds at once, in blocks of the input: a few
    per thread. Weights that were a Dask array of their own once made it hold the whole input."""
    import threading

    from dask.callbacks import Callback
    from dask.sizeof import sizeof

    x = climate_array(shape=(1460, 4, 8), chunks={"time": 73})
    x.to_dataset().to_zarr(tmp_path / "s.zarr")
    tas = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu")["tas"]
    block = tas.data.blocks[0].nbytes

    class Held(Callback):
        peak = 0
        lock = threading.Lock()

        def _posttask(self, key, result, dsk, state, id):
            with self.lock:
                Held.peak = max(Held.peak, sum(sizeof(v) for v in state["cache"].values()))

    ops = pipeline.ops

    def build():
        if flow == "standardized_anomaly":
            return ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"])
        return ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"])

    in_core = pipeline.compute(build())
    with dask.config.set({"pipeline.cpu.memory-limit": int(tas.nbytes // 4)}):  # out of core
        with Held():
            got = pipeline.compute(build(), threads=threads)
    assert tas.data.numblocks[0] == 20
    # monthly: each block's partial sums of 12 months, float64, are 2/3 of a block
    assert Held.peak <= (3 * threads + 3) * block, f"held {Held.peak / block:.1f} blocks"
    np.testing.assert_allclose(np.asarray(got), np.asarray(in_core), rtol=1e-6)
