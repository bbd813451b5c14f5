"""A user's cluster, as on several nodes: `dask scheduler` and one worker process a GPU (`dask cuda
worker`), here two worker processes on one machine. pipeline attaches to it by its scheduler file,
spreads the blocks over both workers, gets the same values as on dask's threads, and leaves the
cluster running."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

from .cluster_runs import FLOW, cli, expected_anomaly

WORKERS = 2


# Run on the workers by ``client.run``. Lambdas, so that cloudpickle sends them by value: a
# worker cannot import this test module.
# the tasks a worker has run in its lifetime (``client.run`` calls are not tasks)
_executed = lambda dask_worker: dask_worker.state.executed_count  # noqa: E731
# the GPUs a worker's process sees, its own first (dask-cuda's order)
_visible_devices = lambda: os.environ.get("CUDA_VISIBLE_DEVICES", "")  # noqa: E731


def _wait_for_file(path: Path, procs, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {seconds} s")
        time.sleep(0.1)


def _stop(procs) -> None:
    """Terminate ``procs`` and what they started (a worker's nanny starts the worker), then kill
    whatever is left after a timeout, so that no process outlives the test."""
    family = []
    for p in procs:
        try:
            family += psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    _, alive = psutil.wait_procs(family, timeout=10)
    for child in alive:
        child.kill()
    psutil.wait_procs(alive, timeout=10)


class Cluster:
    """A `dask scheduler` and worker processes started as a user starts them on their nodes."""

    def __init__(self, root: Path, env: dict):
        self.root = root
        self.env = env
        self.file = root / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.log = open(root / "dask.log", "w")  # noqa: SIM115 (closed in stop); a pipe could fill and block them

    def _start(self, args, env=None) -> None:
        self.procs.append(subprocess.Popen([sys.executable, "-m", "dask", *map(str, args)], cwd=self.root,
                                           env={**self.env, **(env or {})}, stdout=self.log, stderr=self.log))

    def start_scheduler(self) -> None:
        # the setting docs/configuration.md asks for where the scheduler runs: one read a thread
        self._start(["scheduler", "--scheduler-file", self.file, "--host", "127.0.0.1", "--port", "0", "--no-dashboard"],
                    env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"})
        _wait_for_file(self.file, self.procs)
        time.sleep(0.2)  # the file is written in one go, but give the writer its close

    def start_worker(self, command: list[str], name: str, env=None) -> None:
        """One worker process (`dask worker` or `dask cuda worker`), with its own name and spill directory."""
        local = self.root / name
        local.mkdir()
        self._start([*command, "--scheduler-file", self.file, "--host", "127.0.0.1", "--nthreads", "1",
                     "--name", name, "--local-directory", local, "--no-dashboard"], env=env)

    def client(self):
        from distributed import Client

        return Client(scheduler_file=str(self.file), timeout=30)

    def wait_for_workers(self, n: int, seconds: float = 90) -> None:
        with self.client() as client:
            try:
                client.wait_for_workers(n, timeout=seconds)
            except TimeoutError:
                self.log.flush()
                raise RuntimeError(f"{n} workers did not connect in {seconds} s:\n{(self.root / 'dask.log').read_text()[-4000:]}") from None

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """The workers first: a worker whose scheduler is gone waits for it before closing (8 s)."""
        try:
            _stop(self.procs[1:])
            _stop(self.procs[:1])
        finally:
            self.log.close()


@contextlib.contextmanager
def _cluster(root: Path, env: dict, worker_command: list[str], worker_envs: list[dict]):
    """A scheduler and one worker process for each of ``worker_envs``, stopped on exit."""
    cluster = Cluster(root, env)
    try:
        cluster.start_scheduler()
        for i, worker_env in enumerate(worker_envs):
            cluster.start_worker(worker_command, f"worker-{i}", env=worker_env)
        cluster.wait_for_workers(len(worker_envs))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A demo store of 9 blocks along time, and the flow's output on dask's threads in this
    machine's one process (no cluster), the reference for every cluster run."""
    root = tmp_path_factory.mktemp("store")
    r = cli("demo", "small.zarr", "--size", "2MB", "--seed", "5", "--time-chunk", "2", cwd=root)
    assert r.returncode == 0, r.stderr
    assert len(xr.open_zarr(root / "small.zarr")["tas"].chunks[0]) >= 2 * WORKERS
    r = cli("run", FLOW, "--input", "small.zarr", "--output", "threads.zarr", cwd=root)
    assert r.returncode == 0, r.stderr
    threads = xr.open_zarr(root / "threads.zarr")["weighted_mean"].values
    np.testing.assert_allclose(threads, expected_anomaly(root / "small.zarr"), rtol=1e-5, atol=1e-6)
    return {"path": root / "small.zarr", "threads": threads}


@pytest.fixture(scope="module")
def cpu_cluster(tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes of one thread each, as subprocesses."""
    env = {**os.environ, "DASK_PIPELINE__BACKEND": "cpu"}
    with _cluster(tmp_path_factory.mktemp("cluster"), env, ["worker"], [{}] * WORKERS) as cluster:
        yield cluster


def _run_attached(cluster: Cluster, tmp_path: Path, attach_args: list, store: Path, env=None) -> tuple[dict, np.ndarray, dict]:
    """Run the flow on ``cluster`` as a user does; return its report, its values and the tasks
    each worker ran for it. Checks that it exits 0 and leaves the cluster as it found it."""
    with cluster.client() as client:
        before = client.run(_executed)
    r = cli("run", FLOW, *attach_args, "--input", store, "--output", "out.zarr", "--report", "report.json",
            cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert cluster.running(), "pipeline stopped a cluster it attached to"
    with cluster.client() as client:
        after = client.run(_executed)
    assert set(after) == set(before), "the workers changed during the run"
    report = json.loads((tmp_path / "report.json").read_text())
    values = xr.open_zarr(tmp_path / "out.zarr")["weighted_mean"].values
    return report, values, {w: after[w] - before[w] for w in after}


def _check(cluster: Cluster, report: dict, ran: dict) -> None:
    address = json.loads(cluster.file.read_text())["address"]
    assert report["cluster"]["scheduler"] == address and report["cluster"]["workers"] == WORKERS, report["cluster"]
    assert len(ran) == WORKERS and all(n > 0 for n in ran.values()), f"tasks per worker: {ran}"


def test_a_flow_runs_on_two_worker_processes_by_their_scheduler_file(tmp_path, cpu_cluster, store):
    report, values, ran = _run_attached(cpu_cluster, tmp_path, ["--scheduler-file", cpu_cluster.file], store["path"])
    _check(cpu_cluster, report, ran)
    assert np.array_equal(values, store["threads"], equal_nan=True)


def test_an_attach_profile_reaches_the_same_workers(tmp_path, cpu_cluster, store):
    profile = tmp_path / "attach-profile.yaml"
    profile.write_text(f"kind: scheduler\nscheduler_file: {cpu_cluster.file}\ntimeout: 30s\n")
    report, values, ran = _run_attached(cpu_cluster, tmp_path, ["--cluster", profile], store["path"])
    _check(cpu_cluster, report, ran)
    assert np.array_equal(values, store["threads"], equal_nan=True)


@pytest.mark.gpu
def test_a_flow_runs_on_two_dask_cuda_workers(tmp_path_factory, tmp_path, store):
    """Two `dask cuda worker` processes, one a GPU: GPUs 0 and 1 where there are two, else both
    on GPU 0 (each spilling to host past 40% of its memory)."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    gpus = cupy.cuda.runtime.getDeviceCount()
    devices = ["0", "1"] if gpus >= 2 else ["0", "0"]
    limit = [] if gpus >= 2 else ["--device-memory-limit", "0.4"]
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    with _cluster(tmp_path_factory.mktemp("cuda-cluster"), env, ["cuda", "worker", *limit],
                  [{"CUDA_VISIBLE_DEVICES": d} for d in devices]) as cluster:
        with cluster.client() as client:
            seen = sorted(v.split(",")[0] for v in client.run(_visible_devices).values())
        assert seen == sorted(devices)
        report, values, ran = _run_attached(cluster, tmp_path, ["--scheduler-file", cluster.file, "--backend", "gpu"],
                                            store["path"], env={"NCCL_NVLS_ENABLE": "0"})
        address = json.loads(cluster.file.read_text())["address"]
        assert report["cluster"]["scheduler"] == address and report["cluster"]["workers"] == WORKERS, report["cluster"]
        # the tasks ran on these workers; on the GPU machine the scheduler gave all 9 tasks of this
        # tiny flow to one of the two, so that each worker computing is asserted on the CPU only
        assert len(ran) == WORKERS and sum(ran.values()) > 0, f"tasks per worker: {ran}"
        assert report["backend"] == "gpu"
        np.testing.assert_allclose(values, store["threads"], rtol=1e-5, atol=1e-6)
