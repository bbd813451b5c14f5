"""Cluster profiles: validated before anything starts; clusters started are always closed."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.exec.cluster import ClusterProfile, load_profile, open_cluster, profile_from_args
from pipeline.errors import InputError


@pytest.mark.parametrize("name", ["local-cpu", "local-gpu", "attach", "slurm-gpu"])
def test_shipped_profiles_are_valid(name):
    profile = load_profile(name)
    assert profile.kind in ("local", "local-cuda", "scheduler", "slurm")


def test_local_gpu_profile_spills_to_host_and_disk():
    p = load_profile("local-gpu")
    # local_directory null: a directory of the run's own, in this user's private directory
    assert p.kind == "local-cuda" and p.device_memory_limit and p.memory_limit and p.local_directory is None


@pytest.mark.parametrize(
    "text,message",
    [
        ("kind: local\nthreads: 4\n", "threads: Extra inputs are not permitted"),
        ("kind: cloud\n", "kind: Input should be"),
        ("kind: scheduler\n", "needs 'address' or 'scheduler_file'"),
        ("kind: local\ndevice_memory_limit: 1GB\n", "belong to kind 'local-cuda'"),
        ("kind: scheduler\naddress: tcp://h:8786\nworker_saturation: 1.0\n", "set distributed.scheduler.worker-saturation where the scheduler runs"),
        ("- a list\n", "expected a mapping"),
        # TLS keys of attach profiles
        ("kind: scheduler\naddress: tcp://h:8786\ntls_ca_file: ca.pem\ntls_client_cert: c.pem\n", "write address: tls://h:8786"),
        ("kind: scheduler\naddress: tls://h:8786\ntls_ca_file: ca.pem\n", "TLS needs tls_ca_file and tls_client_cert"),
        ("kind: local\ntls_ca_file: ca.pem\ntls_client_cert: c.pem\n", "belong to kind 'scheduler'"),
        # batch-system profiles
        ("kind: slurm\ncores: 4\n", "needs 'cores' and 'memory'"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\ngpus: 2\n", "gpus: Extra inputs are not permitted"),
        ("kind: slurm\ncores: 2\nmemory: 8GB\ngpus_per_job: 4\n", "cannot feed 4 GPU workers"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\ndevice_memory_limit: 0.8\n", "also to kind 'slurm' with gpus_per_job"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\nn_workers: 2\n", "sizes its jobs with jobs, cores and memory"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\ngpus_per_job: 1\njob_extra_directives: ['--gres=gpu:1']\n", "writes the --gres line"),
        ("kind: slurm\ncores: 4\nmemory: 8GB\njobs: 0\n", "jobs: Input should be greater than or equal to 1"),
        ("kind: local\nqueue: gpu\n", "queue belong to kind 'slurm'"),
    ],
)
def test_bad_profiles_name_the_file_and_key(tmp_path, text, message):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match="p.yaml") as e:
        load_profile(str(f))
    assert message in str(e.value)


def test_profile_from_args():
    assert profile_from_args().kind == "threads"
    assert profile_from_args(scheduler="tcp://127.0.0.1:8786").address == "tcp://127.0.0.1:8786"
    with pytest.raises(InputError, match="at most one"):
        profile_from_args("local-cpu", "tcp://x:1")
    with pytest.raises(InputError, match="scheduler file not found"):
        profile_from_args(scheduler_file="/nonexistent/scheduler.json")


def test_local_cluster_is_closed_after_an_error(tmp_path):
    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    with pytest.raises(ZeroDivisionError):
        with open_cluster(profile) as client:
            cluster = client.cluster
            assert client.submit(lambda: 41 + 1).result() == 42
            1 / 0
    assert cluster.status.name == "closed"
    assert client.status == "closed"


def test_attach_to_a_running_scheduler_leaves_it_running(tmp_path):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as running:
        with open_cluster(ClusterProfile(kind="scheduler", address=running.scheduler_address)) as client:
            assert client.submit(lambda: 1).result() == 1
        assert running.status.name == "running"


def test_compute_on_a_cluster_takes_one_collection_or_a_list():
    import dask.array as da
    from distributed import Client, LocalCluster

    import pipeline

    x = da.arange(12, chunks=5)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, Client(cluster):
        assert int(pipeline.compute(x.sum())) == 66
        total, biggest = pipeline.compute([x.sum(), x.max()])
        assert (int(total), int(biggest)) == (66, 11)


def test_weighted_flow_on_two_workers_moves_partials_not_blocks(tmp_path):
    """Only small partial results cross between workers. Weights once built as a Dask array the
    size of the data made the scheduler move data blocks to them: twice the input crossed."""
    import dask
    from dask.utils import key_split
    from distributed import Client, LocalCluster

    import pipeline

    from .conftest import climate_array

    x = climate_array(shape=(1460, 12, 16), chunks={"time": 73})
    x.to_dataset().to_zarr(tmp_path / "s.zarr")
    ops = pipeline.ops
    # the scheduler weighs moving a block against waiting for a busy worker; with these tiny blocks
    # moving looks free unless its bandwidth estimate is as low, for them, as it is for GPU blocks
    # of hundreds of MB at its default (100 MB/s)
    slow = dask.config.set({"distributed.scheduler.bandwidth": 100_000})
    with slow, LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        tas = pipeline.open_dataset(tmp_path / "s.zarr", backend="cpu")["tas"]
        block = tas.data.blocks[0].nbytes
        flow = lambda: ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"])  # noqa: E731
        expected = pipeline.compute(flow())
        client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
        got = pipeline.compute(flow())

        def moved(dask_worker):
            return [(key_split(k), nb) for t in dask_worker.transfer_incoming_log for k, nb in t["keys"].items()]

        crossed = [item for per_worker in client.run(moved).values() for item in per_worker]
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected))
    data_keys = [name for name, _ in crossed if name.startswith(("open_dataset", "cf_decode"))]
    assert not data_keys, f"data blocks crossed between workers: {crossed}"
    assert sum(nb for _, nb in crossed) < 3 * block


def test_workers_with_more_threads_than_their_budget_holds_are_refused_before_anything_runs():
    """On a cluster the workers' threads are the cluster's: a plan that needs more memory than a
    worker's own budget allows (blocks a thread x its threads) is an error naming the threads that
    fit, raised before any task runs; with the budget raised it computes."""
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    import pipeline
    from pipeline.exec import memory

    x = da.ones((40, 1000, 100), chunks=(10, 1000, 100))  # blocks of 8 MB
    y = (x - x.mean(axis=0)).sum()
    per_thread = memory.per_thread_bytes(8_000_000, memory.graph_partial_bytes(y), memory.graph_blocks_per_thread(y),
                                         memory.work_bytes("cpu", 8_000_000))
    threads = lambda n: memory.threads_bytes(n, per_thread, memory.graph_merges(y))  # noqa: E731
    # under half the budget: the two-pass op keeps its input in core; and the mean's partials that wait in its tree
    held = x.nbytes + memory.graph_tree_bytes(y)
    with LocalCluster(n_workers=2, threads_per_worker=3, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        before = sum(len(v) for v in client.processing().values())
        with dask.config.set({"pipeline.cpu.memory-limit": held + (threads(2) + threads(3)) // 2}):  # workers in this process read it
            with pytest.raises(InputError, match=r"run 3 threads.*enough for 2: start the workers with at most 2 threads"):
                pipeline.compute(y)
            assert sum(len(v) for v in client.processing().values()) == before == 0
        with dask.config.set({"pipeline.cpu.memory-limit": held + threads(3)}):
            assert float(pipeline.compute(y)) == pytest.approx(0.0, abs=1e-6)


def test_protocol_auto_takes_ucx_for_gpu_workers_only_where_it_is_installed(monkeypatch):
    import importlib.util

    from pipeline.exec.cluster import comms_protocol

    assert comms_protocol("tcp") == "tcp" and comms_protocol(None) is None and comms_protocol("ucx", gpu=False) == "ucx"
    real = importlib.util.find_spec
    for installed in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if installed else None) if name == "distributed_ucxx" else real(name, *a))
        assert comms_protocol("auto") == ("ucx" if installed else "tcp")
        assert comms_protocol("auto", gpu=False) == "tcp"
    assert load_profile("local-gpu").protocol == "auto"


def test_a_cluster_started_here_takes_the_profiles_worker_saturation():
    """dask's default (1.1) sends a worker ceil(1.1 x threads) reads at a time: one block more than
    the memory plan counts; the shipped profiles start their scheduler with 1.0."""
    import dask

    for name in ("local-cpu", "local-gpu"):
        assert load_profile(name).worker_saturation == 1.0
    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None, worker_saturation=1.0)
    with open_cluster(profile) as client:
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.WORKER_SATURATION) == 1.0
    assert dask.config.get("distributed.scheduler.worker-saturation") != 1.0  # only while it started


def test_blocks_are_placed_on_workers_only_where_their_budget_leaves_room_to_read_ahead(monkeypatch):
    """Placed slabs let a worker read ahead of its threads (up to twice the blocks, or its whole
    slab): where neither fits the budget, the scheduler places the blocks."""
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    import pipeline
    from pipeline.exec import locality, memory

    calls = []
    real = locality.place
    monkeypatch.setattr(locality, "place", lambda obj, nthreads: calls.append(1) or real(obj, nthreads))
    x = da.ones((400, 1000, 100), chunks=(50, 1000, 100))  # blocks of 40 MB; 2 workers: slabs of 160 MB
    y = (x - x.mean(axis=0)).sum()
    per_thread = memory.per_thread_bytes(40_000_000, memory.graph_partial_bytes(y), memory.graph_blocks_per_thread(y),
                                         memory.work_bytes("cpu", 40_000_000))
    threads = lambda n: memory.threads_bytes(n, per_thread, memory.graph_merges(y))  # noqa: E731
    tree = memory.graph_tree_bytes(y)  # the mean's partials that wait in its tree, held once
    slab = memory.graph_array_bytes(y) // 2
    assert slab == 160_000_000
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)  # as for the workers in this process
    # room for twice the thread's blocks; for neither that nor a whole slab; for a slab, in half of
    # the budget, though not for two threads
    cases = ((threads(2) + tree, True), (threads(1) + tree + 1_000_000, False), (2 * slab, True))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, Client(cluster):
        for budget, placed in cases:
            with dask.config.set({"pipeline.cpu.memory-limit": budget}):
                assert memory.threads_that_fit("cpu", 40_000_000, memory.graph_partial_bytes(y), memory.graph_blocks_per_thread(y),
                                               held_bytes=tree, merges=memory.graph_merges(y)) == (2 if budget == cases[0][0] else 1)
                calls.clear()
                assert float(pipeline.compute(y)) == pytest.approx(0.0, abs=1e-6)
            assert bool(calls) == placed, budget


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_scheduler_exits_2_within_the_connect_timeout_naming_the_address(tmp_path):
    """Nothing listens at the address: after pipeline.cluster.connect-timeout (or the profile's
    timeout) the run exits 2 with one message naming the address (and the scheduler file), where
    it once waited 60 s and printed a traceback."""
    import json
    import time

    from .test_security import FLOW, cli

    address = f"tcp://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    r = cli("run", FLOW, "--scheduler", address, cwd=tmp_path, env={"DASK_PIPELINE__CLUSTER__CONNECT_TIMEOUT": "2s"})
    took = time.monotonic() - start
    assert r.returncode == 2, r.stderr
    assert f"no dask scheduler answered at {address} within 2 s" in r.stderr and "connect-timeout" in r.stderr
    assert "Traceback" not in r.stderr and took < 20, took
    assert list(tmp_path.iterdir()) == []  # nothing written: not even the demo source

    (tmp_path / "scheduler.json").write_text(json.dumps({"address": address}))
    (tmp_path / "attach.yaml").write_text("kind: scheduler\nscheduler_file: scheduler.json\ntimeout: 1s\n")
    r = cli("run", FLOW, "--cluster", tmp_path / "attach.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"at {address} (from the scheduler file scheduler.json) within 1 s" in r.stderr and "Traceback" not in r.stderr


def test_the_connect_timeout_comes_from_the_profile_else_the_setting(tmp_path):
    import dask

    from pipeline.exec.cluster import connect_timeout

    assert connect_timeout(ClusterProfile(kind="scheduler", address="tcp://h:1")) == 10
    assert connect_timeout(ClusterProfile(kind="scheduler", address="tcp://h:1", timeout="2m")) == 120
    with dask.config.set({"pipeline.cluster.connect-timeout": "3s"}):
        assert connect_timeout(ClusterProfile(kind="scheduler", address="tcp://h:1")) == 3
    with dask.config.set({"pipeline.cluster.connect-timeout": "soon"}), pytest.raises(InputError, match="pipeline.cluster.connect-timeout: expected a duration"):
        connect_timeout(ClusterProfile(kind="scheduler", address="tcp://h:1"))
    f = tmp_path / "p.yaml"
    f.write_text("kind: scheduler\naddress: tcp://h:1\ntimeout: later\n")
    with pytest.raises(InputError, match=r"p.yaml: timeout: Value error, expected a duration such as '10s' or '5m', got 'later'"):
        load_profile(str(f))
    f.write_text(f"kind: scheduler\nscheduler_file: {tmp_path / 'nothing.json'}\n")
    (tmp_path / "nothing.json").write_text("{}")
    with pytest.raises(InputError, match="nothing.json: not a scheduler file"):
        with open_cluster(load_profile(str(f))):
            pass


FIRST_TASKS_NEED = ("xarray", "zarr", "pipeline.sources", "pipeline.sinks.zarr", "pipeline.exec.compute")


def _warm_modules(names=FIRST_TASKS_NEED):
    import sys

    return sorted(m for m in names if m in sys.modules)


def test_a_cluster_started_early_has_its_workers_warm_and_is_taken_over():
    """start_early starts a local cluster on a thread; its worker processes import what their
    first tasks need before they join (pipeline.exec.worker); open_cluster takes it over and closes it."""
    from pipeline.exec.cluster import start_early

    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=1, dashboard_address=None)
    starting = start_early(profile)
    assert starting is not None
    with open_cluster(profile, starting) as client:
        cluster = client.cluster
        assert list(client.run(_warm_modules).values()) == [sorted(FIRST_TASKS_NEED)]
    assert cluster.status.name == "closed"
    assert start_early(ClusterProfile(kind="threads")) is None


def _worker_facts():
    import gc
    import os

    names = ("OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "NUMBA_CACHE_DIR", "CUPY_CACHE_DIR", "PIPELINE_TEST_NANNY")
    return {"parent": os.getppid(), "collector": gc.isenabled(), "frozen": gc.get_freeze_count(),
            **{k: os.environ.get(k) for k in names}}


def test_an_early_cluster_forks_its_workers_with_their_environment():
    """The workers of an early local cluster are forked from the fork server (not spawned by this
    process), and still get what must be in their environment: distributed's pre-spawn variables,
    the kernel caches' folders, and the nanny's own variables. Their collector is on, and what
    they inherited from the server (its imports) is frozen out of its reach."""
    import multiprocessing.forkserver
    import os

    import dask
    import distributed  # noqa: F401  (its defaults in dask's config before the set below, see there)

    from pipeline.exec.cluster import start_early

    profile = ClusterProfile(kind="local", n_workers=2, threads_per_worker=1, dashboard_address=None)
    # Had distributed first been imported inside it (by start_early), the set's exit would have
    # removed the whole "distributed" section it found missing, defaults and all, and every
    # cluster made after it in this process failed (KeyError: 'distributed', under pytest -n)
    with dask.config.set({"distributed.nanny.environ": {"PIPELINE_TEST_NANNY": "given"}}):
        starting = start_early(profile)
        assert starting.forkserver
        with open_cluster(profile, starting) as client:
            facts = list(client.run(_worker_facts).values())
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert len(facts) == 2
    for f in facts:
        assert f["parent"] == server != os.getpid()
        assert f["OMP_NUM_THREADS"] == "1" and f["MALLOC_TRIM_THRESHOLD_"] == "65536"
        assert f["NUMBA_CACHE_DIR"] == os.environ["NUMBA_CACHE_DIR"] and f["CUPY_CACHE_DIR"] == os.environ["CUPY_CACHE_DIR"]
        assert f["PIPELINE_TEST_NANNY"] == "given"
        assert f["collector"] and f["frozen"] > 10_000  # the server's imports: about 200,000 objects


def test_fork_workers_off_spawns_them():
    """``pipeline.cluster.fork-workers: false``: distributed's own spawned workers, children of
    this process."""
    import os

    import dask

    from pipeline.exec.cluster import start_early

    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=1, dashboard_address=None)
    with dask.config.set({"pipeline.cluster.fork-workers": False}):
        starting = start_early(profile)
        assert not starting.forkserver
        with open_cluster(profile, starting) as client:
            (facts,) = client.run(_worker_facts).values()
    assert facts["parent"] == os.getpid()


def test_an_invalid_flow_closes_the_early_cluster_and_leaves_no_run_directory(tmp_path):
    from .test_security import cli

    spill = tmp_path / "spill"
    profile = tmp_path / "p.yaml"
    profile.write_text(f"kind: local\nn_workers: 1\nthreads_per_worker: 1\ndashboard_address: null\nlocal_directory: {spill}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nsource: {path: nowhere.zarr, variable: tas}\nsteps: [{op: no_such_op}]\nsink: {path: out.zarr}\n")
    r = cli("run", bad, "--cluster", profile, cwd=tmp_path)
    assert r.returncode == 2 and "no_such_op" in r.stderr, r.stderr
    assert list(spill.iterdir()) == []  # the profile's local_directory is made; the run's own folder in it is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "p.yaml", "spill"]  # nothing else written or removed


def test_local_cuda_workers_make_their_context_beside_their_start():
    """dask-cuda's preload that makes the CUDA context before a worker joins is left out of each
    worker's spec (with TCP), and nothing else of the spec changes."""
    from pipeline.exec.cluster import _context_beside_start

    class Spec:  # what dask_cuda.LocalCUDACluster.new_worker_spec returns, for one worker
        def new_worker_spec(self):
            return {0: {"cls": "Nanny", "options": {"preload": ["pipeline.exec.worker", "dask_cuda.initialize"],
                                                      "preload_argv": ["--create-cuda-context"],
                                                      "env": {"CUDA_VISIBLE_DEVICES": "1,0"}}}}

    spec = _context_beside_start(Spec)().new_worker_spec()
    assert spec == {0: {"cls": "Nanny", "options": {"preload": ["pipeline.exec.worker"], "preload_argv": [],
                                                    "env": {"CUDA_VISIBLE_DEVICES": "1,0"}}}}


def _module_names():
    import sys

    return sorted(sys.modules)


def test_a_worker_that_starts_before_the_run_takes_its_first_graph_without_imports(tmp_path):
    """A worker that starts before the run (here spawned, as a SLURM job's or ``dask cuda worker
    --preload pipeline.exec.worker``'s are) runs a flow importing nothing but kernel modules: the
    op registry that the tasks' functions live in (with its parameter models), the memory plan and,
    on a CPU worker, Numba with its CPU target ready were imported before it joined. Unpickling the
    first graph had imported them while the run waited (0.17-0.2 s on one H200), and the first compiled
    kernel Numba (0.5 s). A worker forked for ``pipeline run`` leaves them to its first graph."""
    import dask

    from pipeline.demo import write_demo
    from pipeline.flows import load_flow, run_flow, with_source

    from .cluster_runs import FLOW

    store = tmp_path / "demo.zarr"
    write_demo(store, "4MB")
    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=2, dashboard_address=None)
    with dask.config.set({"pipeline.cluster.fork-workers": False}), open_cluster(profile) as client:
        (before,) = client.run(_module_names).values()
        rep = run_flow(with_source(load_flow(str(FLOW)), str(store)), backend="cpu", output=str(tmp_path / "out.zarr"),
                       client=client, progress=False)
        (after,) = client.run(_module_names).values()
    assert rep["exit_status"] == 0
    assert {"pipeline.ops", "pipeline.exec.memory", "numba"} <= set(before)
    assert "pipeline.exec.forkserver" not in before
    imported = sorted(set(after) - set(before))
    assert imported and all(m.startswith("pipeline.kernels.") for m in imported), imported


def test_the_fork_server_starts_before_the_cluster_module_is_imported(tmp_path):
    """``pipeline run --cluster local-cpu`` starts its workers' fork server first, before it imports
    the cluster module (pydantic's models): the server's imports are the longest path of the
    command's start. Here the flow's input is missing: the command reports it (exit 2) after."""
    import subprocess
    import sys

    from .cluster_runs import FLOW

    probe = (
        "import sys\n"
        "import pipeline.exec.prefork as p\n"
        "from pipeline import cli\n"
        "start = p.start\n"
        "def first(gpu):\n"
        "    print('started, cluster module imported:', 'pipeline.exec.cluster' in sys.modules, 'pydantic' in sys.modules)\n"
        "    return start(gpu)\n"
        "p.start = first\n"
        f"sys.exit(cli.main(['run', {str(FLOW)!r}, '--cluster', 'local-cpu', '--input', {str(tmp_path / 'missing.zarr')!r},"
        f" '--output', {str(tmp_path / 'out.zarr')!r}, '--no-progress']))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("started")]
    assert lines[0] == "started, cluster module imported: False False", r.stdout


def test_a_profile_whose_workers_are_not_forked_starts_no_fork_server(tmp_path, monkeypatch):
    """prefork.start_for reads only a profile's kind and processes: a local cluster whose workers
    are forked starts the server, anything else (another kind, workers in this process, forking
    turned off, a profile it cannot read, which is reported later) starts nothing."""
    import dask

    from pipeline.exec import prefork

    started = []
    monkeypatch.setattr(prefork, "start", lambda gpu: started.append(gpu) or True)
    (tmp_path / "threads.yaml").write_text("kind: local\nprocesses: false\n")
    (tmp_path / "bad.yaml").write_text("kind: [local\n")
    assert prefork.start_for("local-cpu") and prefork.start_for("local-gpu")
    assert started == [False, True]
    for name in ("attach", "slurm-gpu", str(tmp_path / "threads.yaml"), str(tmp_path / "bad.yaml"), "no-such-profile", None):
        assert not prefork.start_for(name), name
    with dask.config.set({"pipeline.cluster.fork-workers": False}):
        assert not prefork.start_for("local-cpu")
    assert started == [False, True]
