"""Kind ``slurm``: workers as SLURM batch jobs through dask-jobqueue. The job script is checked
without SLURM; where ``sbatch`` is installed a one-node SLURM (with munge) is started on localhost
and a flow runs through it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr
from dask.utils import parse_bytes

from pipeline.errors import InputError
from pipeline.exec.cluster import ClusterProfile, load_profile, open_cluster, slurm_cluster

from .test_security import FLOW, cli, expected_anomaly


def _job_script(profile: ClusterProfile) -> str:
    cluster = slurm_cluster(profile)
    try:
        return cluster.job_script()
    finally:
        cluster.close()


def _directive(script: str, flag: str) -> str:
    found = re.findall(rf"^#SBATCH {re.escape(flag)}(?:=| )(\S+)$", script, re.M)
    assert len(found) == 1, (flag, script)
    return found[0]


def _worker_option(command: str, option: str) -> str:
    found = re.findall(rf" {re.escape(option)} (\S+)", command)
    assert len(found) == 1, (option, command)
    return found[0]


def test_the_gpu_profile_asks_for_gpus_and_starts_dask_cuda_workers_with_their_limits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the log directory is made where the profile says, relative to here
    profile = load_profile("slurm-gpu")
    assert profile.kind == "slurm" and profile.gpus_per_job == 4
    script = _job_script(profile)
    assert _directive(script, "--gres") == "gpu:4"
    assert int(_directive(script, "--cpus-per-task")) == 32
    mem = _directive(script, "--mem")  # SLURM's units are binary: 480 GB is 447.03 GiB, rounded up
    assert parse_bytes(mem.replace("G", "GiB")) >= parse_bytes("480GB") > parse_bytes(mem.replace("G", "GiB")) - 2**30
    assert _directive(script, "-t") == "02:00:00"
    assert _directive(script, "-o").startswith("logs/dask-jobs/") and (tmp_path / "logs" / "dask-jobs").is_dir()
    command = script.strip().splitlines()[-1]
    assert command.startswith(f"{sys.executable} -m dask cuda worker tcp://")
    # each of the job's four workers (one a GPU) takes a quarter of its cores and host memory
    assert int(_worker_option(command, "--nthreads")) == 8
    assert abs(parse_bytes(_worker_option(command, "--memory-limit")) - parse_bytes("120GB")) < 0.01 * parse_bytes("120GB")
    assert _worker_option(command, "--device-memory-limit") == "0.8"
    # each job spills to a directory of its own that it makes on its node (mktemp -d: mode 0700, a
    # name no other user can have made first) and removes when it ends
    assert _worker_option(command, "--local-directory") == '"$PIPELINE_SPILL"'
    assert 'PIPELINE_SPILL=$(mktemp -d "${TMPDIR:-/tmp}/pipeline-spill.XXXXXXXX") || exit 1\n' in script
    assert """\ntrap 'rm -rf "$PIPELINE_SPILL"' EXIT\n""" in script
    assert _worker_option(command, "--preload") == "pipeline.exec.worker"  # the workers log as the run does
    assert "--nanny" not in command and "--nworkers" not in command  # dask cuda worker has neither


def test_optional_slurm_keys_reach_the_script(tmp_path):
    profile = ClusterProfile(kind="slurm", gpus_per_job=1, cores=4, memory="16GB", queue="gpu", account="proj",
                             rmm_pool_size="10GB", job_extra_directives=["--constraint=h100"],
                             job_script_prologue=["module load cuda"], log_directory=str(tmp_path / "logs"))
    script = _job_script(profile)
    assert _directive(script, "-p") == "gpu" and _directive(script, "-A") == "proj"
    assert _directive(script, "--gres") == "gpu:1" and _directive(script, "--constraint") == "h100"
    assert "\nmodule load cuda\n" in script
    command = script.strip().splitlines()[-1]
    assert _worker_option(command, "--rmm-pool-size") == "10GB" and int(_worker_option(command, "--nthreads")) == 4
    assert "--device-memory-limit" not in command  # dask-cuda's own default
    cpu = _job_script(ClusterProfile(kind="slurm", cores=2, memory="4GB"))
    assert "--gres" not in cpu and " -m distributed.cli.dask_worker tcp://" in cpu and " --nanny" in cpu


# --- a one-node SLURM on localhost ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(root: Path, munge_socket: Path) -> str:
    """One node (this machine, at 127.0.0.1) in one partition; daemons as root, no cgroups."""
    node = socket.gethostname()
    memory_mb = psutil.virtual_memory().total // 2**20 // 2
    return "\n".join([
        "ClusterName=pipeline-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none", "ReturnToService=2",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
    ]) + "\n"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd in the foreground, configured in a temporary directory
    (SLURM_CONF), until the module's tests are done; the commands of docs/scheduled-jobs.md."""
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        pytest.skip("SLURM is not installed (sbatch, slurmctld: Debian's slurm-wlm and munge)")
    if os.geteuid() != 0:
        pytest.skip("a one-node SLURM for tests runs its daemons as root")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "munge"):
        (root / d).mkdir()
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = root / "munge" / "munge.socket"
    (root / "slurm.conf").write_text(_slurm_conf(root, sock))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    log = open(root / "daemons.log", "w")  # noqa: SIM115 (closed below)
    environ = pytest.MonkeyPatch()
    daemons = [subprocess.Popen(["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                                 f"--log-file={root / 'munge' / 'munged.log'}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                                 f"--seed-file={root / 'munge' / 'munged.seed'}"], stdout=log, stderr=log)]
    try:
        _wait(lambda: sock.exists(), "munged's socket", daemons)
        daemons.append(subprocess.Popen(["slurmctld", "-D"], env=env, stdout=log, stderr=log))
        daemons.append(subprocess.Popen(["slurmd", "-D"], env=env, stdout=log, stderr=log))
        idle = lambda: subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout.strip() == "idle"  # noqa: E731
        _wait(idle, "an idle SLURM node", daemons)
        environ.setenv("SLURM_CONF", env["SLURM_CONF"])  # for this process's sbatch and the CLI's
        yield root
    finally:
        environ.undo()
        for p in reversed(daemons):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def _wait(ready, what: str, procs, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while not ready():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}")
        if time.time() > deadline:
            raise TimeoutError(f"no {what} after {seconds} s")
        time.sleep(0.2)


def _queue() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True).stdout.strip()


def test_a_flow_runs_on_workers_started_as_slurm_jobs_and_the_jobs_end_with_it(tmp_path, slurm):
    """The CPU variant of slurm-gpu.yaml (no GPUs: a plain `dask worker` a job) through a real
    sbatch: the run waits for its job's worker, computes, and cancels the job."""
    store = tmp_path / "small.zarr"
    assert cli("demo", store, "--size", "1MB", "--seed", "2", cwd=tmp_path).returncode == 0
    profile = tmp_path / "slurm-cpu.yaml"
    profile.write_text(f"kind: slurm\njobs: 1\ncores: 1\nmemory: 2GB\nwalltime: '00:10:00'\ninterface: lo\n"
                       f"local_directory: {tmp_path / 'spill'}\nlog_directory: {tmp_path / 'logs'}\ntimeout: 60s\n")
    r = cli("run", FLOW, "--cluster", profile, "--input", store, "--output", "out/slurm.zarr", "--report", "rep.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(tmp_path / "out" / "slurm.zarr")["weighted_mean"].values
    np.testing.assert_allclose(got, expected_anomaly(store), rtol=1e-5, atol=1e-6)
    report = json.loads((tmp_path / "rep.json").read_text())
    assert report["cluster"]["workers"] == 1 and report["cluster"]["scheduler"].startswith("tcp://127.0.0.1:")
    assert list((tmp_path / "logs").glob("pipeline-worker-*.err"))  # the job wrote its log where the profile says
    _wait(lambda: "pipeline-worker" not in _queue(), "end of the worker's job", [])


def test_jobs_that_never_connect_fail_within_the_timeout_and_are_cancelled(tmp_path, slurm):
    """A job whose worker cannot start (here: a prologue that fails) is reported after the
    profile's timeout, naming the log directory, and cancelled."""
    profile = ClusterProfile(kind="slurm", cores=1, memory="1GB", timeout="5s", interface="lo",
                             job_script_prologue=["exit 3"], log_directory=str(tmp_path / "logs"))
    with pytest.raises(InputError, match=r"0 of the 1 workers of 1 SLURM job\(s\) connected to tcp://127.0.0.1:\d+ within 5 s") as e:
        with open_cluster(profile):
            pass
    assert str(tmp_path / "logs") in str(e.value)
    _wait(lambda: "pipeline-worker" not in _queue(), "end of the worker's job", [])
