"""Out of core: two-pass ops read their input again instead of holding it, with equal results;
the reader's parallel piecewise file reads return the files' bytes."""

from __future__ import annotations

import os

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline.gpu import reader
from pipeline.exec.spill import second_pass

from .conftest import climate_array, requires_gpu


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
    monkeypatch.setattr(reader, "PIECE", 1000)  # every file in several pieces
    rng = np.random.default_rng(0)
    blobs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 999, 1000, 1001, 4567)]
    paths = []
    for k, b in enumerate(blobs):
        p = tmp_path / f"f{k}"
        p.write_bytes(b)
        paths.append(str(p))
    sizes = [len(b) for b in blobs]
    buf = np.zeros(sum(sizes), dtype=np.uint8)
    starts = reader.read_files(paths, sizes, buf)
    for b, s in zip(blobs, starts):
        assert buf[s:s + len(b)].tobytes() == b


def test_small_files_are_read_several_to_a_job(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "PIECE", 1000)  # larger files in pieces of their own
    monkeypatch.setattr(reader, "GROUP", 300)
    rng = np.random.default_rng(1)
    sizes = [120] * 10 + [0, 2500] + [90] * 7
    paths = []
    for k, n in enumerate(sizes):
        p = tmp_path / f"f{k}"
        p.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        paths.append(str(p))
    buf = np.zeros(sum(sizes), dtype=np.uint8)
    files = reader.submit_reads(paths, sizes, buf)
    jobs = {id(j) for _, waits in files for j in waits}
    small = [waits for (_, waits), n in zip(files, sizes) if n <= 1000]
    assert all(len(w) == 1 for w in small) and len({id(w[0]) for w in small}) < len(small)
    assert len([w for (_, w), n in zip(files, sizes) if n > 1000][0]) == 3  # 2500 bytes in pieces of 1000
    assert len(jobs) < len(sizes)
    for (start, waits), path, n in zip(files, paths, sizes):
        for j in waits:
            j.result()
        assert buf[start:start + n].tobytes() == open(path, "rb").read()

@pytest.mark.parametrize("compiled", [True, False])
def test_a_group_of_files_names_the_file_it_could_not_read(tmp_path, monkeypatch, compiled):
    from pipeline.gpu import files

    if not compiled:  # without the compiled loop: Python's calls, a file at a time
        monkeypatch.setattr(files, "_built", [None])
    else:
        assert files.file_loop() is not None
    paths = []
    for k, n in enumerate((120, 130, 140)):
        (tmp_path / f"f{k}").write_bytes(bytes((k * 7 + i) % 256 for i in range(n)))
        paths.append(str(tmp_path / f"f{k}"))
    buf = np.zeros(1000, dtype=np.uint8)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    files.read_whole_files(paths, buf, [0, 120, 250], [120, 130, 140])
    assert buf[:390].tobytes() == b"".join(open(p, "rb").read() for p in paths)
    if fds is not None:  # every file it opened, closed
        assert len(os.listdir("/proc/self/fd")) == fds
    with pytest.raises(OSError, match="f1: short read"):  # a file cut since its size was taken
        files.read_whole_files(paths, buf, [0, 120, 400], [120, 200, 140])
    with pytest.raises(FileNotFoundError):  # or gone
        files.read_whole_files([paths[0], str(tmp_path / "gone")], buf, [0, 120], [120, 10])
    with pytest.raises(OSError):  # a read that fails each time (a folder's): tried again, then said
        files.read_whole_files([str(tmp_path)], buf, [0], [10])


def test_memory_limits_are_bytes_or_fractions():
    from pipeline.backend import _bytes_or_fraction

    assert _bytes_or_fraction("16GB", 10**12) == 16 * 10**9
    assert _bytes_or_fraction("1B", 10**12) == 1
    assert _bytes_or_fraction(0.5, 1000) == 500
    assert _bytes_or_fraction("0.25", 1000) == 250
    assert _bytes_or_fraction(2e9, 1000) == 2 * 10**9
    assert _bytes_or_fraction(None, 1000) == 1000


def test_the_device_memory_peak_counts_what_the_pool_held():
    from pipeline import backend

    class Pool:  # CuPy's pool as far as the count goes: freed blocks stay held, for reuse
        held = used = 0

        def malloc(self, size):
            self.held += size
            self.used += size
            return size

        def free(self, size):
            self.used -= size

        def total_bytes(self):
            return self.held

        def used_bytes(self):
            return self.used

    backend.device_memory_peak(reset=True)
    pool = Pool()
    malloc = backend._counting_malloc(pool)
    assert [malloc(n) for n in (30, 50)] == [30, 50]
    pool.free(50)
    assert malloc(20) == 20  # in use: 50 at most; held: 100
    assert backend.device_memory_peak(used=True) == 80
    assert backend.device_memory_peak(reset=True) == 100 and backend.device_memory_peak() == 0
    assert backend.device_memory_peak(used=True) == 0


@pytest.mark.gpu
@requires_gpu
def test_the_device_memory_limit_caps_the_pool_and_counts_its_peak():
    import cupy as cp

    from pipeline import backend

    pool = cp.get_default_memory_pool()
    before_limit, before_allocator = pool.get_limit(), cp.cuda.get_allocator()
    try:
        with dask.config.set({"pipeline.gpu.memory-limit": "1GB"}):
            backend.use_device_memory_limit()
        assert pool.get_limit() == 10**9
        pool.free_all_blocks()
        backend.device_memory_peak(reset=True)
        x = cp.ones(300_000_000 // 4, dtype="f4")
        assert backend.device_memory_peak() >= 300_000_000
        assert backend.device_memory_peak(used=True) >= 300_000_000
        del x
        with pytest.raises(cp.cuda.memory.OutOfMemoryError):
            cp.empty(1_100_000_000 // 4, dtype="f4")
    finally:
        pool.set_limit(size=before_limit)
        cp.cuda.set_allocator(before_allocator)
        backend.state.device.limits.clear()


def test_partials_are_sized_from_the_reductions_result_not_their_input():
    """dask annotates a tree reduction's first step with its input's chunks (in the result's
    dtype, float64 for pipeline's partials): counted as a block, it halved the threads of the
    standardized anomaly under a device budget. Group means' partials hold a row per group."""
    import dask.array as da

    from pipeline import kernels
    from pipeline.exec import memory
    from pipeline.reduce import aggregation

    x = da.ones((40, 10, 20), chunks=(8, 10, 20), dtype="f4")
    block = 8 * 10 * 20 * 4
    moments = pipeline.ops.standardized_anomaly(xr.DataArray(x, dims=("time", "lat", "lon")), dim="time").data
    assert memory.graph_block_bytes(moments) == block
    assert memory.graph_partial_bytes(moments) == 3 * 8 * 10 * 20  # float64 count, mean and M2 a value
    labels = np.arange(40) % 12
    means = aggregation.group_reduce(x, aggregation.GROUP_MEAN, labels, 0, np.float32, kernel=kernels.get("group_sum", "cpu"))
    assert memory.graph_block_bytes(means) == 12 * 10 * 20 * 4  # the result: one row a group
    # a block's partial: a float64 sum and count a value, for the 8 months among its 8 steps (the
    # merges, of more months, are graph_merges')
    assert memory.graph_partial_bytes(means) == 2 * 8 * 8 * 10 * 20


def _moments_partials(rng, shape, k):
    parts = []
    for _ in range(k):
        n = rng.integers(0, 5, shape).astype("f8")  # no value at some points
        parts.append({"n": n, "mean": np.where(n > 0, rng.normal(280, 5, shape), 0.0), "m2": n * rng.random(shape)})
    return parts


@pytest.mark.parametrize("axis, shape, k", [((0,), (1, 37, 53), 1), ((0,), (1, 37, 53), 2), ((0,), (1, 2049, 3), 4),
                                            ((0,), (1, 37, 53), 9), ((1,), (5, 1, 301), 4), ((2,), (3, 7, 1), 3)])
def test_a_merge_of_the_moments_on_the_host_takes_its_partials_as_they_are_bit_for_bit(axis, shape, k):
    """Laid side by side, the partials of a merge make a copy of all of them, and the formula
    temporaries of that size; the host's merge of a list of partials is the formula's, bit for
    bit, points with no value included, across the loop's tiles of points."""
    from pipeline import kernels
    from pipeline.kernels.moments import moments_merge_cpu

    parts = _moments_partials(np.random.default_rng(k), shape, k)
    whole = moments_merge_cpu({f: np.concatenate([p[f] for p in parts], axis=axis[0]) for f in ("n", "mean", "m2")}, axis)
    got = kernels.get("moments_merge_parts", "cpu")(parts, axis)
    assert set(got) == set(whole)
    for f in whole:
        assert got[f].shape == whole[f].shape and got[f].dtype == whole[f].dtype
        np.testing.assert_array_equal(got[f], whole[f])


def test_a_merge_of_large_partials_holds_its_output():
    """Four partials of the moments of a 0.25-degree grid (25 MB each): the merge allocates its
    output (24.9 MB) and a tile of points, not a copy of its inputs (100 MB) and temporaries of
    that size."""
    import tracemalloc

    from pipeline import kernels

    parts = _moments_partials(np.random.default_rng(0), (1, 721, 1440), 4)
    merge = kernels.get("moments_merge_parts", "cpu")
    merge(parts[:2], (0,))  # compiled or loaded before it is measured
    tracemalloc.start()
    try:
        got = merge(parts, (0,))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got["n"].shape == (1, 721, 1440)
    assert peak < 3 * 8 * 721 * 1440 + 2**20, peak


def test_the_plan_counts_the_partials_of_a_reductions_tree():
    """A tree merges k partials at a time, level by level. A merge on the host holds its inputs
    and its output; dask's own (xarray's std, on dask arrays) its inputs, their copy
    laid side by side and its formulas' temporaries; at each level, up to k - 1 partials wait for
    their siblings. Group means hold, at each level, the rows of the groups their blocks span."""
    import dask.array as da

    from pipeline.exec import memory
    from pipeline.reduce import aggregation

    grid = 10 * 20
    x = xr.DataArray(da.ones((64, 10, 20), chunks=(2, 10, 20), dtype="f4"), dims=("time", "lat", "lon"))  # 32 blocks
    with dask.config.set({"split_every": 4}):
        ours = pipeline.ops.standardized_anomaly(x, dim="time").data
        theirs = x.std("time").data
    # 32 partials -> 8 -> 2 -> 1: three levels of merges of up to 4
    part = 24 * grid
    (tree,) = memory.graph_trees(ours)
    waits = (3 * part, 3 * part, 1 * part)  # at each level, a merge's inputs less one: of 4, 4 and 2
    assert tree == memory.Tree(part, ((5 * part, 8), (5 * part, 2), (3 * part, 1)), 3 * 3 * part, 0, "pipeline-moments", waits)
    assert memory.graph_tree_bytes(ours) == 9 * part
    # the waiting partials are held: one merge a level adds only its last input and its output
    assert memory.graph_merges(ours) == ((5 * part, 8), (2 * part, 3))
    # ... and makes float64 copies of its float32 block as it makes a partial (the deviations from
    # the block's mean, their squares, the squares with NaN replaced): six blocks' worth
    (tree,) = memory.graph_trees(theirs)
    assert tree == memory.Tree(part, ((13 * part, 8), (13 * part, 2), (7 * part, 1)), 3 * 3 * part, 6, "moment_chunk", waits)
    assert memory.graph_blocks_per_thread(theirs) == memory.BLOCKS_PER_THREAD + 6
    assert memory.graph_blocks_per_thread(ours) == memory.BLOCKS_PER_THREAD
    # a tree of each reduction: the seasons' standard deviations over parts of the data progress one
    # after another, the yearly maximum over the same blocks together with them
    days = x.assign_coords(time=pd.date_range("2001-01-01", periods=64))
    seasons = days.groupby("time.season").std().data
    both = [seasons, days.max("time").data]
    assert len(memory.graph_trees(seasons)) == 2  # 64 days from January: winter and spring
    assert memory.graph_tree_bytes(seasons) == max(t.waiting_bytes for t in memory.graph_trees(seasons))
    assert memory.graph_tree_bytes(*both) == memory.graph_tree_bytes(seasons) + memory.graph_tree_bytes(both[1])
    # twelve months of two steps, in blocks of two: 12 partials of one row -> 3 of four -> 12 rows
    merges, waits, leaf = aggregation._group_tree_rows(np.repeat(np.arange(12), 2), np.arange(12), (2,) * 12, 4)
    assert merges == [(4 * 1 + 4 + 1, 3), (3 * 4 + 12 + 4, 1)] and waits == [3 * 1, 2 * 4] and leaf == 1
    # a few threads may run the few large merges at the top of a tree; the rest hold blocks
    merges = ((100, 1), (60, 2), (10, 50))
    assert memory.threads_bytes(4, 50, merges) == 100 + 2 * 60 + 50
    assert memory.threads_bytes(4, 5, merges) == 100 + 2 * 60 + 10  # every thread merging
    assert memory.threads_bytes(2, 80, merges) == 100 + 80
    for t in range(6):  # the most over how many threads merge at once
        for per in (0, 5, 50, 80, 200):
            best = 0
            for m in range(t + 1):
                sizes = [size for size, n in merges for _ in range(n)][:m]
                best = max(best, (t - m) * per + sum(sizes))
            assert memory.threads_bytes(t, per, merges) == best


@pytest.mark.parametrize("threads", [1, 4])
def test_the_plan_counts_the_pieces_that_wait_in_dasks_takes(threads):
    """xarray's groupby without flox takes each group's steps (dask's take): each input block is
    cut into pieces, one for each output block it feeds, and a piece waits for its siblings. The
    pieces alive at once, measured as dask's threaded scheduler keeps them, grow with the years
    of data (a block across two seasons is cut for both, and the later season's piece waits),
    and stay within what the plan counts: the pieces held, and a block a thread."""
    import dask.array as da
    from dask.callbacks import Callback
    from dask.utils import key_split

    from pipeline.exec import memory

    days = 8 * 365
    x = xr.DataArray(da.random.random((days, 10, 20), chunks=(36, 10, 20)).astype("f4"), dims=("time", "lat", "lon"),
                     coords={"time": pd.date_range("2001-01-01", periods=days)})
    with xr.set_options(use_flox=False):
        seasons = x.groupby("time.season").std().data
    gathers = memory.graph_gathers(seasons)
    assert len(gathers.chunks) == 4  # a take for each season
    block = memory.graph_block_bytes(seasons)
    assert max(gathers.chunks) <= block
    assert memory.graph_gather_bytes(seasons) == gathers.shared_bytes + sum(gathers.chunks[1:])
    assert memory.graph_blocks_per_thread(seasons) == memory.graph_blocks_per_thread(x.std("time").data) + memory.GATHER_BLOCKS
    # 32 season boundaries in 8 years, most inside a block: the smaller pieces of those blocks
    assert 20 * 2 * 10 * 20 * 4 < gathers.shared_bytes < 32 * 36 * 10 * 20 * 4

    peak = [0]

    class Live(Callback):
        def _start_state(self, dsk, state):
            self.cache = state["cache"]

        def _posttask(self, key, result, dsk, state, id):
            held = sum(v.nbytes for k, v in list(self.cache.items()) if key_split(k) == "shuffle-split")
            peak[0] = max(peak[0], held)

    with Live(), dask.config.set(scheduler="threads", num_workers=threads):
        seasons.compute()
    bound = memory.graph_gather_bytes(seasons) + threads * memory.GATHER_BLOCKS * block
    assert sum(gathers.chunks[1:]) < peak[0] <= bound, (peak[0], bound)


def test_threads_under_a_budget_match_what_ran_on_the_gpu(monkeypatch):
    """The plan's rules against the runs they were measured on (18.2 GB in blocks of 303 MB, a
    4 GB device limit): monthly means ran with three threads and the standardized anomaly with
    five, but the rolling maximum ran out of memory with three; moving-window ops hold two blocks
    more a thread, found from their halo layers."""
    import dask.array as da

    from pipeline.exec import memory

    # the device's rules on the host's budget: no process baseline, no CPU kernel temporaries
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)
    monkeypatch.setattr(memory, "work_bytes", lambda backend, block_bytes: 0)
    x = xr.DataArray(da.ones((40, 10, 20), chunks=(8, 10, 20), dtype="f4"), dims=("time", "lat", "lon"))
    assert memory.graph_blocks_per_thread(pipeline.ops.rolling_mean(x, window=5, dim="time").data) == 5
    assert memory.graph_blocks_per_thread(pipeline.ops.standardized_anomaly(x, dim="time").data) == 3
    block, grid = 73 * 721 * 1440 * 4, 721 * 1440
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": 4_000_000_000}):
        assert memory.threads_for("cpu", block, 12 * grid * 16, 3) == 3  # monthly means
        assert memory.threads_for("cpu", block, grid * 24, 3) == 4  # moments
        assert memory.threads_for("cpu", block, grid * 24, 5) == 2  # rolling


def test_threads_are_fewer_when_their_blocks_would_exceed_the_memory_limit(monkeypatch):
    import dask.array as da

    from pipeline.exec import memory
    from pipeline import kernels
    from pipeline.exec.compute import compute_threads
    from pipeline.reduce.aggregation import nanmean_std

    x = da.ones((40, 100, 100), chunks=(10, 100, 100), dtype="f4")  # 400 kB blocks
    mean, _ = nanmean_std(x, 0, kernel=kernels.get("moments", "cpu"))
    total = ((x - mean.astype("f4")) ** 2).sum(axis=(1, 2))  # a tiny result of large blocks
    assert memory.graph_block_bytes(total) == 400_000
    # the mean's partials, as it declares them: float64 count, mean and M2 for each of its 100 x 100 values
    assert memory.graph_partial_bytes(total) == 3 * 8 * 100 * 100
    # a merge of its 4 partials on the host holds them and its output; at most three wait for
    # their siblings in its one level, held: the merge adds its last input and its output
    assert memory.graph_tree_bytes(total) == 3 * memory.graph_partial_bytes(total)
    assert memory.graph_merges(total)[0] == (2 * memory.graph_partial_bytes(total), 1)
    # its blocks, its kernels' temporaries and its partials (more than the merge holds)
    per_thread = (memory.BLOCKS_PER_THREAD * 400_000 + memory.work_bytes("cpu", 400_000)
                  + memory.PARTIALS_PER_THREAD * memory.graph_partial_bytes(total))
    assert per_thread > 5 * memory.graph_partial_bytes(total)
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 300_000_000)
    # the process itself, the input that it holds in core, and the partials waiting in the tree
    base = 300_000_000 + x.nbytes + memory.graph_tree_bytes(total)
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": base + 8 * per_thread}):
        assert compute_threads(total) == 8
    # (and a few bytes for the partials of the whole sums below)
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": base + 2 * per_thread + 1000}):
        assert compute_threads(total) == 2
        assert memory.plan(x, total).threads == 2
        # several results at once (as dask.compute takes them): the largest block of any
        for several in ([total, x.sum()], (total,), {"a": total}, [xr.DataArray(total), xr.Dataset({"v": ("t", total)})]):
            assert compute_threads(several) == 2, several
    with dask.config.set({"num_workers": 8, "pipeline.cpu.memory-limit": "1B"}):
        assert compute_threads(total) == 1  # never none: the plan check refuses what cannot fit
    np.testing.assert_allclose(pipeline.compute(total), np.zeros(40))


def _thread_of_block(block, *, seen):
    import threading

    seen.add(threading.get_ident())
    return block


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, requires_gpu])])
def test_to_numpy_runs_as_many_threads_as_the_memory_plan_allows(monkeypatch, backend):
    """``pipeline.to_numpy`` (a filter's statistics, an op's eager step) computes on the threads
    of the memory plan, not dask's thread per core: a filter's statistics over 50 GB of genotypes
    read all 20 blocks at once on a 32-core GPU machine, and ran out of device memory. Planned
    on the device's budget where the blocks are on the device and only the result comes to the
    host."""
    import dask.array as da

    from pipeline import backend as B
    from pipeline.exec import compute, memory

    assert B._planned_compute is compute.compute  # set as pipeline.exec.compute is imported
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)
    seen: set = set()
    x = B.to_backend(da.arange(20 * 1000, chunks=1000, dtype="f8"), backend)
    stats = x.map_blocks(_thread_of_block, seen=seen, dtype=x.dtype, meta=x._meta) * 2
    assert memory.graph_backend(stats.map_blocks(B.to_numpy, meta=np.empty(0))) == backend
    limits = {"num_workers": 8, "pipeline.gpu.threads": 8, f"pipeline.{backend}.memory-limit": "1B"}
    with dask.config.set(limits):
        got = pipeline.to_numpy(stats)
    assert len(seen) == 1, seen
    np.testing.assert_array_equal(got, np.arange(20 * 1000) * 2.0)


def _buffers_bytes(values) -> int:
    """Bytes of the memory behind ``values`` (arrays, dicts of them), each buffer counted once: a
    view counts as the whole array it is a view of, which it keeps alive."""
    seen = {}

    def visit(v):
        if isinstance(v, dict):
            for item in v.values():
                visit(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                visit(item)
        elif isinstance(v, np.ndarray):
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[id(base)] = base.nbytes

    visit(list(values))
    return sum(seen.values())


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("flow", ["standardized_anomaly", "monthly_anomaly", "rolling"])
def test_a_flow_holds_a_few_blocks_not_its_input(tmp_path, flow, threads):
    """The largest set of results Dask's scheduler holds at once, in blocks of the input: a few
    per thread. Weights that were a Dask array of their own once made it hold the whole input,
    and rolling windows' halos, as views, their neighbouring blocks."""
    import threading

    from dask.callbacks import Callback

    x = climate_array(shape=(1460, 4, 8), chunks={"time": 73})
    x.to_dataset().to_zarr(tmp_path / "s.zarr")
    with dask.config.set({"pipeline.cpu.block-size": None}):  # the store's 20 chunks, 20 blocks
        tas = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu")["tas"]
    block = tas.data.blocks[0].nbytes

    class Held(Callback):
        peak = 0
        lock = threading.Lock()

        def _posttask(self, key, result, dsk, state, id):
            with self.lock:
                Held.peak = max(Held.peak, _buffers_bytes(state["cache"].values()))

    ops = pipeline.ops

    def build():
        if flow == "standardized_anomaly":
            return ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"])
        if flow == "rolling":
            return ops.rolling_mean(tas, window=5, dim="time", center=True).max("time")
        return ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"])

    in_core = pipeline.compute(build())
    with dask.config.set({"pipeline.cpu.memory-limit": int(tas.nbytes // 4)}):  # out of core
        with Held():
            got = pipeline.compute(build(), threads=threads)
    assert tas.data.numblocks[0] == 20
    # monthly: each block's partial sums of 12 months, float64, are 2/3 of a block
    assert Held.peak <= (3 * threads + 3) * block, f"held {Held.peak / block:.1f} blocks"
    np.testing.assert_allclose(np.asarray(got), np.asarray(in_core), rtol=1e-6)


@pytest.mark.parametrize("depth", [(2, 1), (4, 0), (0, 3), (0, 0)])
@pytest.mark.parametrize("chunks", [7, 1, 50, (20, 1, 29), (3, 4, 43)])
def test_map_halo_equals_map_overlap(chunks, depth):
    """Blocks with copied halos give map_overlap's results (boundary "none"), blocks shorter than
    the halo included."""
    import dask.array as da

    from pipeline.reduce.overlap import map_halo

    before, after = depth

    def window_sums(x, axis):  # sum over [t - before, t + after], cut at the block's ends
        xm = np.moveaxis(x, axis, 0)
        return np.moveaxis(np.stack([xm[max(0, t - before):t + after + 1].sum(0) for t in range(len(xm))]), 0, axis)

    a = np.random.default_rng(1).random((3, 50, 4))
    x = da.from_array(a, chunks={0: 2, 1: chunks, 2: 4})
    got = map_halo(window_sums, x, 1, depth, dtype=a.dtype, meta=np.empty((0, 0, 0)))
    ref = x.map_overlap(window_sums, depth={1: depth}, boundary="none", trim=True, axis=1)
    np.testing.assert_allclose(got.compute(), window_sums(a, 1))
    np.testing.assert_allclose(got.compute(), ref.compute())
    assert got.chunks[0] == x.chunks[0] and got.chunks[2] == x.chunks[2]


def test_blocks_smaller_than_the_stored_chunks_count_as_the_chunk_they_decode(tmp_path):
    """Reading a block of 5 steps from a stored chunk of 20 decodes all 20: the plan counts that."""
    from pipeline.exec import memory
    from pipeline.sinks.zarr import write_zarr

    from .conftest import climate_array

    x = climate_array((40, 9, 12), chunks={"time": 20})
    write_zarr(x, tmp_path / "s.zarr")
    stored = 20 * 9 * 12 * x.dtype.itemsize
    whole = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu")["tas"].data
    split = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu", chunks={"time": 5})["tas"].data
    assert memory.plan(whole, whole * 2, backend="cpu").block_bytes == stored
    assert split.chunksize[0] == 5
    assert memory.plan(split, split * 2, backend="cpu").block_bytes == stored
