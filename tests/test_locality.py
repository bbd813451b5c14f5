"""Blocks stay on one worker on a cluster: each worker reads, maps and reduces its own slab of
blocks in both passes of a two-pass op, and only partials and statistics cross workers."""

from __future__ import annotations

import time
import warnings
from collections import defaultdict

import dask
import dask.array as da
import numpy as np
import pytest

import pipeline
from pipeline.exec import locality
from pipeline.exec.spill import second_pass

from .conftest import climate_array

NBLOCKS = 10


def flows(tas):
    ops = pipeline.ops
    return {
        "standardized_anomaly": lambda: ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"]),
        "monthly_anomaly": lambda: ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"]),
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # blocks of 146 steps: a monthly partial (12 months of float64 sums and counts) is a third of one
    path = tmp_path_factory.mktemp("locality") / "s.zarr"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        climate_array(shape=(146 * NBLOCKS, 12, 16), chunks={"time": 146}).to_dataset().to_zarr(path)
    return path


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    # not the default client: pipeline.compute uses it only inside ``client.as_current()``
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def run_on_cluster(client, build):
    """The result, every task's ``(key, worker)`` and every task output a worker received from
    another one, ``(key, bytes)``."""
    from distributed import get_task_stream

    pipeline.compute(build())  # warm-up: imports and compilation on the workers
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    with get_task_stream() as stream:
        result = pipeline.compute(build())

    def received(dask_worker):
        return [item for t in dask_worker.transfer_incoming_log for item in t["keys"].items()]

    crossed = [item for items in client.run(received).values() for item in items]
    return result, [(r["key"], r["worker"]) for r in stream.data], crossed


@pytest.mark.parametrize("memory_limit", [None, "1MB"], ids=["in-core", "read-twice"])
@pytest.mark.parametrize("flow", ["standardized_anomaly", "monthly_anomaly"])
def test_blocks_stay_on_their_worker_in_both_passes(client, store, flow, memory_limit):
    # one stored chunk a block: NBLOCKS blocks along time, as the placement below counts them
    with dask.config.set({"pipeline.cpu.memory-limit": memory_limit, "pipeline.cpu.block-size": None}):
        tas = pipeline.open_dataset(store, backend="cpu")["tas"]
        if memory_limit:  # the second pass reads the store again, as on a GPU under a budget
            assert second_pass(tas.data, tas.data.sum()) is not tas.data
        build = flows(tas)[flow]
        expected = np.asarray(pipeline.compute(build()))  # in this process
        with client.as_current():
            result, ran, crossed = run_on_cluster(client, build)
    np.testing.assert_array_equal(np.asarray(result), expected)

    block = tas.data.blocks[0].nbytes
    assert crossed, "nothing crossed: the test ran on one worker"
    big = [(key, nbytes) for key, nbytes in crossed if nbytes >= block / 2]
    assert not big, f"data blocks crossed between workers: {big}"

    # block tasks: keys (name, i, ...) over all NBLOCKS blocks along time (reads, maps, the
    # block-wise partials); the first pass makes moment or group partials, the second one feeds
    # the weighted mean
    indices = defaultdict(set)
    for key, _ in ran:
        if locality.block_index(key) is not None:
            indices[key[0]].add(key[1])
    workers, names = defaultdict(set), defaultdict(set)
    for key, worker in ran:
        if locality.block_index(key) is not None and len(indices[key[0]]) == NBLOCKS:
            workers[key[1]].add(worker)
            names[key[1]].add(key[0])
    assert sorted(workers) == list(range(NBLOCKS))
    for i in range(NBLOCKS):
        assert len(workers[i]) == 1, f"block {i} ran on {workers[i]}: {names[i]}"
        first = "pipeline-moments" if flow == "standardized_anomaly" else "pipeline-group-mean"
        assert any(first in n for n in names[i]) and any("pipeline-weighted-mean" in n for n in names[i]), names[i]
    assert len(set().union(*workers.values())) == 3, "the blocks were not spread over the workers"


def test_slabs_end_where_dask_trees_do():
    """60 blocks, 4 workers: slabs of 16, 16, 16, 12, the ends of dask's groups of 4 x 4 blocks,
    rather than 4 x 15, which splits groups of every level of the tree."""
    x = da.ones((60, 8), chunks=(1, 8)).sum(axis=0, split_every=4)
    (optimized,) = dask.optimize(x)
    owner = locality.owners(dict(optimized.__dask_graph__()), {w: 1 for w in "abcd"})
    slabs = defaultdict(list)
    for key, worker in owner.items():
        slabs[worker].append(key[1])
    assert {w: (min(i), max(i)) for w, i in slabs.items()} == {"a": (0, 15), "b": (16, 31), "c": (32, 47), "d": (48, 59)}


def test_slabs_follow_threads_and_stay_contiguous():
    assert locality.slab_ends(40, [1, 2, 1], [0] * 41) == [10, 30, 40]
    assert locality.slab_ends(10, [1, 1, 1, 1], [0] * 11) == [2, 5, 7, 10]
    assert locality.slab_ends(3, [1, 1, 1, 1], [0] * 4) == [1, 2, 3, 3]  # fewer blocks than workers
    # a slab grows by at most a tenth of its share to end where fewer combines straddle
    cuts = [0] + [5] * 19 + [0] + [5] * 19 + [0]
    assert locality.slab_ends(40, [1, 1], cuts) == [20, 40]
    assert locality.slab_ends(40, [1, 1], [0] + [5] * 21 + [1] + [5] * 17 + [0]) == [22, 40]
    assert locality.slab_ends(40, [1, 1], [0] + [5] * 22 + [1] + [5] * 16 + [0]) == [20, 40]


def test_graphs_without_blocks_along_a_first_axis_are_left_alone():
    x = da.ones((1, 40), chunks=(1, 4)).sum()
    out, placed = locality.place(x, {"a": 1, "b": 1})
    assert out is x and not placed
    y = da.ones((40,), chunks=4).sum()
    out, placed = locality.place(y, {"a": 1})
    assert out is y and not placed


def _slow_copy(block):
    time.sleep(0.3)
    return block.copy()


@pytest.mark.filterwarnings("ignore:Port .* is already in use")  # the restarted worker's dashboard
def test_the_blocks_of_a_worker_that_leaves_run_elsewhere():
    """Pins are strict; without ReleasePins the tasks pinned to a worker that died (and came back
    under a new address) would wait for it for ever."""
    import os

    from distributed import Client, LocalCluster

    x = da.arange(16 * 4, dtype=float, chunks=4).reshape(16, 4).rechunk((1, 4))
    y = x.map_blocks(_slow_copy, dtype=float).sum(axis=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        workers = sorted(client.nthreads())
        placed, pinned = locality.place(y, client.nthreads())
        assert pinned
        client.register_plugin(locality.ReleasePins())
        future = client.compute(placed, optimize_graph=False)
        time.sleep(1.0)  # a few blocks done on each worker
        try:
            client.run(lambda: os._exit(1), workers=[workers[0]])
        except Exception:  # the worker's connection closes under the call
            pass
        np.testing.assert_array_equal(future.result(timeout=60), np.asarray(x).sum(axis=1))


def _scaled(block, weights):
    return block * weights.sum()


def _slow_read(block):
    time.sleep(0.05)
    return block.copy()


def test_small_inputs_of_the_blocks_are_not_queued_behind_the_pinned_blocks(client):
    """Tasks that are not placed but that the scheduler takes for roots: a group of more tasks
    than twice the cluster's threads, with few inputs (here), or a task that reads data, fused or
    not (dask marks it a data producer: a regression's traits read from the store and projected
    once the covariates are). Once ready, the scheduler queues them until a worker runs fewer tasks
    than it has threads, and the pinned reads, all sent at once, put that off until the end of
    the reads. Every task of a placed graph is restricted to workers (its slab's, else all of
    them), and none waits in the queue (without the restriction, the eight did)."""
    from distributed import get_task_stream

    covariates = da.from_array(np.arange(8.0), chunks=-1).map_blocks(_slow_copy, dtype=float)
    weights = covariates.rechunk(1) * 0.5 + 1.0  # eight tasks, each waiting on the slow one
    x = da.arange(24 * 4, dtype=float, chunks=4).reshape(24, 4).rechunk((1, 4)).map_blocks(_slow_read, dtype=float)
    y = da.blockwise(_scaled, "ij", x, "ij", weights, "k", concatenate=True, dtype=float)
    with client.as_current():
        with get_task_stream() as stream:
            got = pipeline.compute(y)
        log = client.run_on_scheduler(lambda dask_scheduler: [(str(t[0]), t[2]) for t in dask_scheduler.transition_log])
    np.testing.assert_array_equal(got, np.arange(24 * 4, dtype=float).reshape(24, 4) * 22.0)  # the sum of 0.5 i + 1, i < 8
    keys = {str(r["key"]) for r in stream.data}
    queued = [k for k, finish in log if finish == "queued" and k in keys]
    assert keys and not queued, f"queued behind the pinned blocks: {queued}"


def test_a_store_written_through_the_cluster_equals_one_written_here(client, store, tmp_path):
    import xarray as xr

    tas = pipeline.open_dataset(store, backend="cpu")["tas"]
    anomaly = pipeline.ops.anomaly(tas, freq="month")
    pipeline.write_zarr(anomaly, tmp_path / "here.zarr")
    with client.as_current():
        pipeline.write_zarr(anomaly, tmp_path / "there.zarr")
    here, there = xr.open_zarr(tmp_path / "here.zarr"), xr.open_zarr(tmp_path / "there.zarr")
    np.testing.assert_array_equal(there["tas"].values, here["tas"].values)



def _mapped(block, block_info=None, *, log=None):
    """Twice the block, each call noted in the file ``log`` (the workers are other processes)."""
    with open(log, "a") as f:
        f.write(f"{block_info[0]['chunk-location'][0]}\n")
    return block * 2.0


@pytest.mark.parametrize("placed", [True, False], ids=["slabs", "scheduler"])
def test_a_step_two_results_share_runs_once_a_block_on_a_cluster(client, placed, tmp_path):
    """Two results of one graph computed together on a cluster: the step they share runs once a
    block (``dask.optimize`` fused it into each result's chain, and each block was mapped twice)."""
    log = tmp_path / "calls.txt"
    base = da.map_blocks(_mapped, da.arange(40.0, chunks=10), dtype=float, log=str(log))
    a = ((base + 1) * 3 - 2) / 5
    b = base.sum() - base
    with client.as_current(), dask.config.set({"pipeline.cluster.locality": placed}):
        got_a, got_b = pipeline.compute([a, b])
    assert sorted(log.read_text().split()) == ["0", "1", "2", "3"]
    x = np.arange(40.0) * 2
    np.testing.assert_array_equal(got_a, ((x + 1) * 3 - 2) / 5)
    np.testing.assert_array_equal(got_b, x.sum() - x)


def test_an_array_whose_short_last_block_is_small_is_inlined_whole_or_not_at_all():
    """``lean`` inlines small values into the tasks that take them, but the blocks of one array
    all or none: a filter's mask whose short last block alone was small enough became a grid of
    one block fewer than the reads it selects, and :func:`owners` placed none of them."""
    from pipeline.exec.optimize import optimized

    chunks = (100_000,) * 3 + (1_000,)  # 100 kB of booleans a block, 1 kB the last
    mask = da.from_array(np.ones(sum(chunks), dtype=bool), chunks=chunks)
    # two selections by one mask (a genotype's, a position's), each one task a block once fused,
    # whose one input is the mask's block
    y, z = da.ones(sum(chunks), chunks=chunks) * mask, da.arange(sum(chunks), chunks=chunks) * mask
    lean_y, lean_z = locality.lean(optimized([y, z]))
    graph = {**lean_y.__dask_graph__(), **lean_z.__dask_graph__()}
    own = locality.owners(graph, {"a": 1, "b": 1})
    for out in (y, z):
        assert sorted(k[1] for k in own if k[0] == out.name) == [0, 1, 2, 3]
        assert sorted(own[k] for k in own if k[0] == out.name) == ["a", "a", "b", "b"]
    got_y, got_z = dask.compute(lean_y, lean_z, optimize_graph=False)
    np.testing.assert_array_equal(got_y, np.ones(sum(chunks)))
    np.testing.assert_array_equal(got_z, np.arange(sum(chunks)))
