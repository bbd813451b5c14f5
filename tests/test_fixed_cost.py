"""The fixed cost of a distributed run: what pipeline asks the cluster once and keeps (the workers'
memory answers, the scheduler plugin), and what it no longer sends (aliases, the task that
assembles a result on a worker), with results bitwise equal to dask's threads."""

from __future__ import annotations

import time
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline
from pipeline import state
from pipeline.errors import InputError
from pipeline.exec import locality, serialize

from .conftest import climate_array

LIMIT = "4GB"  # each worker's pipeline.cpu.memory-limit


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    # the workers take the settings in force when they start
    with dask.config.set({"pipeline.cpu.memory-limit": LIMIT}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c:
        yield c


@pytest.fixture
def client(cluster):
    from distributed import Client

    # not the default client: pipeline.compute uses it only inside ``client.as_current()``
    with Client(cluster, set_as_default=False) as c, c.as_current():
        yield c


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("fixed_cost") / "s.zarr"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        climate_array(shape=(73 * 6, 9, 12), chunks={"time": 73}).to_dataset().to_zarr(path)
    return path


class Calls:
    """Counts the calls of some of a client's methods (they still run)."""

    def __init__(self, monkeypatch, client, *names):
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            monkeypatch.setattr(client, name, self._counted(name, getattr(client, name)))

    def _counted(self, name, method):
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return method(*args, **kwargs)

        return counted


def small():
    return da.ones((64, 1000), chunks=(8, 1000)).sum(axis=0)


def large():
    """Blocks of 2 GiB: three a thread do not fit a worker's budget (never computed)."""
    return da.ones((4, 2**28), chunks=(1, 2**28)).sum(axis=0)


def test_the_workers_are_asked_once_and_refused_plans_stay_refused(client, monkeypatch):
    calls = Calls(monkeypatch, client, "run")
    np.testing.assert_array_equal(pipeline.compute(small()), np.full(1000, 64.0))
    np.testing.assert_array_equal(pipeline.compute(small()), np.full(1000, 64.0))
    assert calls.counts["run"] == 1, "the second computation of the same shape asked the workers again"
    # other sizes: asked, and refused although a smaller plan passed from the cache
    for _ in range(2):
        with pytest.raises(InputError, match="pipeline.cpu.memory-limit allows"):
            pipeline.compute(large())
    assert calls.counts["run"] == 2, "the refusal was not kept"
    np.testing.assert_array_equal(pipeline.compute(small()), np.full(1000, 64.0))
    assert calls.counts["run"] == 2


def test_a_setting_that_changes_asks_the_workers_again(client, monkeypatch):
    calls = Calls(monkeypatch, client, "run")
    pipeline.compute(small())
    before = calls.counts["run"]
    with dask.config.set({"pipeline.cpu.block-size": "1MB"}):
        pipeline.compute(small())
    assert calls.counts["run"] == before + 1


def test_a_worker_that_joins_or_leaves_asks_the_workers_again(client, cluster, monkeypatch):
    calls = Calls(monkeypatch, client, "run", "register_plugin")
    pipeline.compute(small())
    asked, first = calls.counts["run"], set(client.nthreads())
    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    np.testing.assert_array_equal(pipeline.compute(small()), np.full(1000, 64.0))
    assert calls.counts["run"] == asked + 1
    # the new worker answered too: the refusal names 3 workers
    with pytest.raises(InputError, match="3 of 3 workers"):
        pipeline.compute(large())
    cluster.scale(2)
    while len(client.nthreads()) != 2:
        time.sleep(0.05)
    np.testing.assert_array_equal(pipeline.compute(small()), np.full(1000, 64.0))
    # asked again unless the two left are the two that answered first
    assert calls.counts["run"] == asked + 2 + (set(client.nthreads()) != first)
    # once for each set of workers where blocks were placed, and once a client the workers' plugin
    # (pipeline.exec.serialize.AlignedArrays), which stays for the workers that join
    assert calls.counts["register_plugin"] <= 3


def test_the_plugin_is_registered_once(client, store, monkeypatch):
    monkeypatch.setattr(state.cluster, "plugins", set())
    calls = Calls(monkeypatch, client, "register_plugin")
    tas = pipeline.open_dataset(store, backend="cpu")["tas"]
    for _ in range(3):
        pipeline.compute(pipeline.ops.standardized_anomaly(tas, dim="time").mean(["lat", "lon"]))
    assert calls.counts["register_plugin"] == 2  # the scheduler's plugin and the workers'
    assert client.run_on_scheduler(lambda dask_scheduler: locality.ReleasePins.name in dask_scheduler.plugins)
    assert all(client.run(lambda dask_worker: serialize.AlignedArrays.name in dask_worker.plugins).values())


def flows(tas):
    ops = pipeline.ops
    return {
        "standardized_anomaly": lambda: ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"], weights="coslat"),
        "monthly_anomaly": lambda: ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"], weights="coslat"),
        "anomaly_field": lambda: ops.anomaly(tas, freq="month"),  # a result of many blocks, from both workers
    }


@pytest.mark.parametrize("flow", ["standardized_anomaly", "monthly_anomaly", "anomaly_field"])
def test_results_are_bitwise_those_of_dask_threads(client, store, flow):
    from distributed import get_task_stream

    tas = pipeline.open_dataset(store, backend="cpu")["tas"]
    build = flows(tas)[flow]
    expected = build().compute(scheduler="threads")
    with get_task_stream(client) as stream:
        result = pipeline.compute(build())
    assert isinstance(result, xr.DataArray) and result.dims == expected.dims
    np.testing.assert_array_equal(result.values, expected.values)  # NaN where NaN, every bit else
    assert {w for r in stream.data for w in [r["worker"]]} == set(client.nthreads()), "the run used one worker"
    # no task of the run was an alias, nor assembled the result on a worker
    (optimized,) = dask.optimize(build().data)
    (resolved,) = locality.lean([optimized])
    if flow != "anomaly_field":  # the weighted mean's output blocks were aliases of fused tasks
        assert len(resolved.__dask_graph__()) < len(optimized.__dask_graph__())
    assert len(stream.data) == len(resolved.__dask_graph__())


def test_a_list_and_a_dataset_come_back_as_they_went(client, store):
    tas = pipeline.open_dataset(store, backend="cpu")["tas"]
    mean, field = tas.mean("time"), tas.max(["lat", "lon"])
    got = pipeline.compute([mean, {"max": field}])
    assert isinstance(got, list) and isinstance(got[1], dict)
    np.testing.assert_array_equal(got[0].values, mean.compute(scheduler="threads").values)
    np.testing.assert_array_equal(got[1]["max"].values, field.compute(scheduler="threads").values)
    ds = pipeline.compute(xr.Dataset({"mean": mean, "max": field}))
    assert isinstance(ds, xr.Dataset)
    np.testing.assert_array_equal(ds["mean"].values, got[0].values)
    assert pipeline.compute(np.arange(3)).tolist() == [0, 1, 2]  # no graph: given back as it is


def test_a_graph_of_plain_tuples_runs(client):
    """A Delayed's tasks may be written the old way, as tuples (pipeline's own writes are)."""
    import operator

    from dask.delayed import Delayed

    graph = {"a": (operator.add, 1, 2), "b": (operator.getitem, [5, 6, 7], 1), "k": (operator.mul, "a", "b")}
    assert pipeline.compute(Delayed("k", graph)) == 18


def test_lean_inlines_small_values_and_statistics_but_not_cuts_of_blocks_nor_large_values():
    import operator

    from dask._task_spec import DataNode, Task, TaskRef
    from dask.array.chunk import getitem

    n = 4
    graph = {
        "handle": DataNode("handle", np.arange(4.0)),  # small: inlined into the reads
        "large": DataNode("large", np.zeros(2**17)),  # 1 MB: stays a task
        ("stat", 0): Task(("stat", 0), np.outer, TaskRef("handle"), TaskRef("handle")),  # one block
    }
    for i in range(n):
        graph[("blk", i)] = Task(("blk", i), operator.add, TaskRef("handle"), float(i))
        graph[("cut", i)] = Task(("cut", i), getitem, TaskRef(("blk", i)), slice(0, 1))  # a block's: stays
        graph[("mean", i)] = Task(("mean", i), getitem, TaskRef(("stat", 0)), i % 2)  # the statistics': inlined
        graph[("out", i)] = Task(("out", i), lambda c, m, z: c + m[:1] + z[:1], TaskRef(("cut", i)), TaskRef(("mean", i)), TaskRef("large"))
    x = da.Array(graph, "out", chunks=((1,) * n,), dtype=float)
    (leaned,) = locality.lean([x])
    kept = dict(leaned.__dask_graph__())
    assert "handle" not in kept and not any(k[0] == "mean" for k in kept if isinstance(k, tuple))
    assert "large" in kept and all(("cut", i) in kept for i in range(n))
    np.testing.assert_array_equal(leaned.compute(scheduler="sync"), x.compute(scheduler="sync"))
