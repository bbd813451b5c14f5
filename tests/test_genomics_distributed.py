"""The functions added for sgkit's API, on a distributed cluster of two worker processes, give
sgkit's results as they do on dask's threads: their graphs pickle, their tasks hold no state of
the process that built them, and the partial sums of their blocks meet across the workers (what
the GPUs of a node do). Each case runs a test of ``test_genomics_sgkit_a/b/c`` (against sgkit
0.10's recorded results, on blocks of 37 variants and 25 samples where the test takes chunks)
with a client active, and checks that both workers ran its tasks; on the GPU, on dask-cuda's
workers, one a GPU, as ``--cluster local-gpu`` starts them (both GPUs' workers where there are
two or more)."""

from __future__ import annotations

import pytest

from . import test_genomics_sgkit_a as A, test_genomics_sgkit_b as B, test_genomics_sgkit_c as C
from .conftest import requires_gpu

SMALL = (37, 25)
CASES = {
    "frequencies": (A.test_frequencies_are_sgkits, dict(op="cohort_allele_frequencies", kind="multi", windows="v50",
                                                        backend="cpu")),
    "heterozygosity": (A.test_frequencies_are_sgkits, dict(op="observed_heterozygosity", kind="bi", windows="v50",
                                                           backend="cpu")),
    "garud_h": (B.test_garud_h_is_sgkits, dict(backend="cpu", chunks=SMALL, kind="multi", how="some", wname="v37s20")),
    "pbs": (B.test_pbs_is_sgkits, dict(backend="cpu", chunks=SMALL)),
    "identity_by_state": (B.test_identity_by_state_is_sgkits, dict(backend="cpu", chunks=SMALL, kind="multi")),
    "genomic_relationship": (B.test_genomic_relationship_is_sgkits, dict(backend="cpu", chunks=SMALL, kind="bi")),
    "pc_relate": (B.test_pc_relate_is_sgkits, dict(backend="cpu", chunks=SMALL)),
    "regenie": (C.test_regenie_as_sgkits, dict(run="blocks")),
    "regenie_loco_regression": (C.test_regenie_loco_regression_as_sgkits, dict(intercept=True)),
    "pedigree_kinship": (C.test_kinship_and_relationship, dict(chunked=True)),
    "simulate_genedrop": (C.test_genedrop_as_sgkits_for_the_same_seed, dict(backend="cpu")),
}


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as c:
        yield c


@pytest.mark.parametrize("case", list(CASES))
def test_on_two_worker_processes_as_sgkits(client, case):
    from distributed import get_task_stream

    test, kwargs = CASES[case]
    with get_task_stream(client) as stream:
        test(**kwargs)
    workers = {t["worker"] for t in stream.data}
    assert len(workers) == 2, f"{case}: tasks ran on {len(workers)} worker(s), {len(stream.data)} tasks"


# --- on the GPU: dask-cuda workers, one a GPU, as `--cluster local-gpu` starts them ----------------

# the CPU cases that run on the GPU too, with the GPU's backend; REGENIE through its GPU test
GPU_CASES = {name: (CASES[name][0], {**CASES[name][1], "backend": "gpu"})
             for name in ("frequencies", "garud_h", "pbs", "identity_by_state", "genomic_relationship", "pc_relate",
                          "simulate_genedrop")}
GPU_CASES["regenie"] = (C.test_gpu_regenie_as_sgkits, {})


@pytest.mark.gpu
@requires_gpu
def test_on_the_gpus_workers_as_sgkits():
    """One test over every case: one dask-cuda cluster in a test process, however the tests are
    spread over processes (``pytest -n``)."""
    from distributed import get_task_stream

    from pipeline.backend import gpu_count
    from pipeline.exec.cluster import ClusterProfile, open_cluster

    profile = ClusterProfile(kind="local-cuda", threads_per_worker=1, dashboard_address=None)
    with open_cluster(profile) as client:
        for case, (test, kwargs) in GPU_CASES.items():
            with get_task_stream(client) as stream:
                test(**kwargs)
            workers = {t["worker"] for t in stream.data}
            assert len(workers) == min(2, gpu_count()), f"{case}: tasks ran on {len(workers)} worker(s)"
