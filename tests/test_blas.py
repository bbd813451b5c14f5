"""BLAS (NumPy's matrix products) on one thread while pipeline computes on dask's threads, as on
distributed's workers (``pipeline.kernels.launch.one_blas_thread``): the threads are not
oversubscribed, and a product's last bits do not depend on whether a cluster ran it. The
eigendecomposition of an exact PCA, which runs alone, takes every core."""

from __future__ import annotations

import os
import threading

import dask.array as da
import numpy as np
import pytest
import xarray as xr

threadpoolctl = pytest.importorskip("threadpoolctl")

from pipeline.exec.compute import compute  # noqa: E402


def blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}


needs_blas = pytest.mark.skipif(not blas_threads(), reason="no BLAS library that threadpoolctl can limit")


def _seen(_block, out: list, wait: threading.Event | None = None, then: threading.Event | None = None):
    if then is not None:
        then.set()
    if wait is not None:
        assert wait.wait(60), "the other computation never ended"
    out.append(blas_threads())
    return np.zeros(1)


@needs_blas
def test_a_computation_runs_blas_on_one_thread_and_gives_the_limit_back():
    seen: list = []
    x = da.zeros(4, chunks=1).map_blocks(_seen, out=seen, chunks=(1,), meta=np.empty(0))
    with threadpoolctl.threadpool_limits(limits=3, user_api="blas"):
        compute(x, threads=2)
        assert blas_threads() == {3}
    assert seen == [{1}] * 4


@needs_blas
def test_computations_on_two_threads_share_the_limit():
    """The first computation's task still sees one thread after the second computation, which
    started and ended while it ran, has ended; the limit goes back once both have."""
    started, second_done = threading.Event(), threading.Event()
    seen_first: list = []
    first = da.zeros(1, chunks=1).map_blocks(_seen, out=seen_first, wait=second_done, then=started, meta=np.empty(0))
    with threadpoolctl.threadpool_limits(limits=3, user_api="blas"):
        t = threading.Thread(target=compute, args=(first,), kwargs={"threads": 1})
        t.start()
        try:
            assert started.wait(60)
            seen_second: list = []
            compute(da.zeros(2, chunks=1).map_blocks(_seen, out=seen_second, meta=np.empty(0)), threads=1)
        finally:
            second_done.set()
            t.join(60)
        assert seen_second == [{1}] * 2 and seen_first == [{1}]
        assert blas_threads() == {3}


@needs_blas
def test_the_eigendecomposition_runs_on_every_core(monkeypatch):
    from pipeline.kernels import linalg

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    during: list = []
    eigh = np.linalg.eigh
    monkeypatch.setattr(np.linalg, "eigh", lambda a: during.append(blas_threads()) or eigh(a))
    rng = np.random.default_rng(0)
    a = rng.normal(size=(40, 40))
    gram = da.from_array(a @ a.T, chunks=-1)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):  # the user's limit: not for this step
        got = compute(gram.map_blocks(linalg.top_eigenpairs, 3, chunks=(41, 3), meta=np.empty((0, 0))), threads=2)
        assert blas_threads() == {1}
    assert during == [{cores}]
    w, v = eigh(a @ a.T)
    np.testing.assert_allclose(got[-1], np.sqrt(w[::-1][:3]), rtol=1e-12)


def _gwas_data(n_samples=1000, n_variants=2000, chunk=1000) -> xr.Dataset:
    """Blocks large enough that OpenBLAS splits their products over its threads (1,000 x 1,000
    were; 200 variants x 1,000 samples and 1,000 x 300 were not: measured on 2 cores)."""
    rng = np.random.default_rng(7)
    dosage = da.random.RandomState(7).randint(0, 3, size=(n_variants, n_samples), chunks=(chunk, -1))  # drawn by the tasks
    return xr.Dataset({
        "call_dosage": (("variants", "samples"), dosage.astype(np.float64)),
        "sample_covariate": (("samples", "covariates"), rng.normal(size=(n_samples, 2))),
        "sample_trait": (("samples",), rng.normal(size=n_samples)),
    })


@needs_blas
@pytest.mark.parametrize("processes", [True, False], ids=["worker-processes", "workers-in-this-process"])
def test_the_regression_has_the_same_bits_with_a_cluster_as_without(processes):
    """Without a cluster, BLAS would split each block's product over the threads it was allowed
    (four here); on a cluster's worker process it runs on one (distributed's nanny), and workers in
    this process share its BLAS. The statistics are the same bits either way."""
    from distributed import Client, LocalCluster

    import pipeline.genomics as sg

    def statistics():
        out = sg.gwas_linear_regression(_gwas_data(), dosage="call_dosage", covariates="sample_covariate",
                                        traits="sample_trait", merge=False)
        return compute([out[f"variant_linreg_{v}"].data for v in ("beta", "t_value", "p_value")])

    with threadpoolctl.threadpool_limits(limits=4, user_api="blas"):
        here = statistics()
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=processes, dashboard_address=None) as cluster, \
                Client(cluster):
            there = statistics()
    for a, b in zip(here, there):
        assert np.isfinite(a).all() and a.tobytes() == b.tobytes()


def test_a_worker_of_pipelines_clusters_keeps_one_blas_thread_for_its_life():
    """The worker preload (``pipeline.exec.worker.dask_setup``) limits BLAS for the worker's
    life, for a worker that no nanny's environment reached: in a process of its own, without
    OPENBLAS_NUM_THREADS and the like, with BLAS's default of two threads or more."""
    import subprocess
    import sys

    code = (
        "import gc, numpy, threadpoolctl\n"
        "threadpoolctl.threadpool_limits(2, 'blas')\n"
        "from pipeline.exec import worker\n"
        "worker.dask_setup(None)\n"
        "gc.collect()\n"
        "print(sorted({i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[1]", out.stdout
