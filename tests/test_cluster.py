"""Cluster profiles: validated before anything starts; clusters started are always closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cluster import ClusterProfile, load_profile, open_cluster, profile_from_args
from pipeline.errors import InputError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["local-cpu", "local-gpu", "attach"])
def test_shipped_profiles_are_valid(name):
    profile = load_profile(str(REPO / "configs" / f"{name}.yaml"))
    assert profile.kind in ("local", "local-cuda", "scheduler")


def test_local_gpu_profile_spills_to_host_and_disk():
    p = load_profile(str(REPO / "configs" / "local-gpu.yaml"))
    assert p.kind == "local-cuda" and p.device_memory_limit and p.memory_limit and p.local_directory


@pytest.mark.parametrize(
    "text,message",
    [
        ("kind: local\nthreads: 4\n", "threads: Extra inputs are not permitted"),
        ("kind: cloud\n", "kind: Input should be"),
        ("kind: scheduler\n", "needs 'address' or 'scheduler_file'"),
        ("kind: local\ndevice_memory_limit: 1GB\n", "belong to kind 'local-cuda'"),
        ("- a list\n", "expected a mapping"),
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
