"""A run killed by SIGKILL (the OOM killer, a batch system's time limit, ``kill -9``) cannot remove
what it wrote for itself: the scratch folder of its cluster (the workers' spill files) and the
hidden partial output and scratch folder beside its sink. The next run removes them, and only
them: never a folder pipeline did not mark as its own, nor one whose run is still alive."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.exec.cluster import RUN_MARK, ClusterProfile, _job_spill, _run_directory
from pipeline.sinks.zarr import read_manifest, staged, verify

from .test_sink_safety import FLOW, cli, env, start, tree

# A run's scratch folder, made by the function a cluster run makes it with, held until killed.
HOLD_RUN_DIRECTORY = """
import signal, sys
from pathlib import Path
from pipeline.exec.cluster import ClusterProfile, _run_directory
with _run_directory(ClusterProfile(kind="local", local_directory=sys.argv[1])) as run:
    (Path(run) / "spill.bin").write_bytes(bytes(100_000))
    Path(sys.argv[2]).write_text(run)
    signal.pause()
"""

# A store written through staged() (with its scratch folder), held mid-write until killed.
HOLD_STAGED = """
import signal, sys
from pathlib import Path
import numpy as np, xarray as xr
from pipeline.sinks.zarr import staged
with staged(sys.argv[1], scratch=True) as (partial, scratch):
    (scratch / "icf").write_bytes(bytes(100_000))
    xr.Dataset({"x": ("i", np.arange(4.0))}).to_zarr(partial, zarr_format=3)
    Path(sys.argv[2]).write_text(str(partial))
    signal.pause()
"""


def hold(script: str, *args, ready: Path) -> subprocess.Popen:
    """A Python child running ``script``, once it has written ``ready`` (waited on, not timed)."""
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args), str(ready)], stderr=subprocess.PIPE, text=True,
                            env=env(ready.parent))
    wait_for(lambda: ready.exists(), proc)
    return proc


def wait_for(done, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not done() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert done(), proc.stderr.read() if proc.poll() is not None else "timed out"


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def runs(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir()}


def test_the_next_cluster_run_removes_what_a_killed_run_left_and_nothing_else(tmp_path):
    work, spill = tmp_path / "w", tmp_path / "spill"
    work.mkdir()
    assert cli("demo", "src.zarr", "--size", "1MB", "--time-chunk", "2", cwd=work).returncode == 0
    profile = work / "cluster.yaml"
    profile.write_text(f"kind: local\nn_workers: 1\nthreads_per_worker: 1\nprocesses: false\n"
                       f"dashboard_address: null\nlocal_directory: {spill}\n")
    args = ("run", FLOW, "--input", "src.zarr", "--output", "out.zarr", "--cluster", profile, "--no-progress")
    alive = hold(HOLD_RUN_DIRECTORY, spill, ready=tmp_path / "alive")  # another run, alive throughout
    alive_dir = Path((tmp_path / "alive").read_text())
    # its writes of the result after the first wait until it is killed (a file never made)
    killed = start(*args, cwd=work, hold=work / "never", hold_after="weighted_mean:1")
    wait_for(lambda: len(list(spill.glob(f"run-*/{RUN_MARK}"))) == 2 and list(work.glob(".out.zarr.partial/*/c/*")), killed)
    kill(killed)
    (dead,) = set(spill.glob("run-*")) - {alive_dir}
    assert (dead / RUN_MARK).is_file()  # left behind: nothing ran to remove it
    # the user's folders: one named like a run's without pipeline's mark, one with a mark of their own
    for name, mark in (("run-mine", None), ("run-notes", "my notes")):
        (spill / name).mkdir()
        (spill / name / "keep.txt").write_text(name)
        if mark:
            (spill / name / RUN_MARK).write_text(mark)
    mine = tree(spill / "run-mine"), tree(spill / "run-notes")
    try:
        r = cli(*args, cwd=work)
        assert r.returncode == 0, r.stderr
        assert not dead.exists()
        removed = [line for line in r.stderr.splitlines() if "the scratch folder of a run that was killed" in line]
        assert len(removed) == 1 and f"removed {dead} (" in removed[0] and f"(pid {killed.pid})" in removed[0], r.stderr
        assert runs(spill) == {"run-mine", "run-notes", alive_dir.name}  # the second run removed its own too
        assert (tree(spill / "run-mine"), tree(spill / "run-notes")) == mine
        assert (alive_dir / "spill.bin").stat().st_size == 100_000 and alive.poll() is None
        # the killed run's partial output was removed as well, and the output is whole
        assert sorted(p.name for p in work.iterdir() if p.name.startswith(".out.zarr")) == []
        assert cli("verify", "out.zarr", cwd=work).returncode == 0
    finally:
        kill(alive)
    assert alive_dir.exists()  # killed too: it stays until the next run


def test_only_this_users_dead_runs_of_this_host_are_removed(tmp_path, caplog):
    """Folders that look like dead runs' but are not provably so stay: a mark that is a link, a
    mark a run on another host left (its lock says nothing here on a file system shared between
    hosts), a folder that is a link; a killed run's is removed with a log line naming its size."""
    spill = tmp_path / "spill"
    killed = hold(HOLD_RUN_DIRECTORY, spill, ready=tmp_path / "ready")
    kill(killed)
    dead = Path((tmp_path / "ready").read_text())
    other_host = spill / "run-otherhost"
    other_host.mkdir()
    (other_host / RUN_MARK).write_text(json.dumps({"pipeline": "run", "pid": 1, "host": "another-node"}))
    linked = spill / "run-linkedmark"
    linked.mkdir()
    (linked / RUN_MARK).symlink_to(dead / RUN_MARK)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / RUN_MARK).write_text(json.dumps({"pipeline": "run", "pid": 1, "host": os.uname().nodename}))
    (spill / "run-link").symlink_to(tmp_path / "elsewhere")
    before = runs(spill)
    caplog.set_level(logging.INFO, logger="pipeline.exec.cluster")
    with _run_directory(ClusterProfile(kind="local", local_directory=str(spill))) as run:
        assert runs(spill) == before - {dead.name} | {Path(run).name}
    assert runs(spill) == before - {dead.name}
    assert (tmp_path / "elsewhere" / RUN_MARK).exists()
    (message,) = [r.getMessage() for r in caplog.records if r.name == "pipeline.exec.cluster"]
    assert message.startswith(f"removed {dead} (9") and "kiB), the scratch folder of a run that was killed" in message


def test_a_killed_staged_write_is_no_result_and_the_next_write_removes_it(tmp_path):
    out = tmp_path / "out" / "st.zarr"
    out.parent.mkdir()
    killed = hold(HOLD_STAGED, out, ready=tmp_path / "ready")
    partial, scratch = out.parent / ".st.zarr.partial", out.parent / ".st.zarr.scratch"
    try:
        # while it lives, another write to the same output is refused, and touches nothing
        with pytest.raises(InputError, match=f"another run \\(pid {killed.pid} on .*\\) is writing this output"):
            with staged(out, mode="overwrite"):
                pass
    finally:
        kill(killed)
    assert partial.is_dir() and (scratch / "icf").is_file()
    # not mistaken for a result: at the output only the empty folder the run reserved, and beside
    # it no complete store
    assert list(out.iterdir()) == [] and read_manifest(partial) is None
    with pytest.raises(InputError, match="not a store pipeline wrote"):
        verify(out)
    (out.parent / ".st.zarr.scratch-mine").mkdir()  # named like a leftover, but the user's
    with staged(out, scratch=True) as (new_partial, new_scratch):
        # the killed run's are gone; this run's are new ones of the same names
        assert new_partial == partial and not partial.exists() and new_scratch == scratch and list(scratch.iterdir()) == []
        import numpy as np
        import xarray as xr

        xr.Dataset({"x": ("i", np.arange(3.0))}).to_zarr(new_partial, zarr_format=3)
    assert sorted(p.name for p in out.parent.iterdir()) == [".st.zarr.scratch-mine", "st.zarr"]
    assert set(verify(out)) == {"x"}


@pytest.mark.skipif(shutil.which("flock") is None, reason="util-linux's flock is not installed")
def test_the_next_slurm_job_removes_the_spill_folder_of_a_killed_job_and_nothing_else(tmp_path):
    """The job script's lines that make its spill folder, run by bash as SLURM runs them: a job
    killed with SIGKILL (all its processes, as SLURM kills a job) leaves its folder; the next job on
    the node removes it, and leaves a folder without the mark and a live job's."""
    spill = tmp_path / "spill"
    prologue = "\n".join(_job_spill(str(spill)))

    def job(name: str, then: str) -> subprocess.Popen:
        script = tmp_path / f"{name}.sh"
        script.write_text(f"{prologue}\necho \"$PIPELINE_SPILL\" > {tmp_path / name}.new\nmv {tmp_path / name}.new {tmp_path / name}\n{then}\n")
        return subprocess.Popen(["bash", str(script)], stderr=subprocess.PIPE, text=True, start_new_session=True)

    def folder(proc, name) -> Path:
        wait_for(lambda: (tmp_path / name).exists(), proc)
        return Path((tmp_path / name).read_text().strip())

    killed, alive = job("killed", "sleep 600"), job("alive", "sleep 600")
    try:
        dead, alive_dir = folder(killed, "killed"), folder(alive, "alive")
        os.killpg(killed.pid, signal.SIGKILL)  # the script and its worker (sleep), as SLURM kills a job
        killed.communicate(timeout=60)
        assert (dead / RUN_MARK).is_file()
        (spill / "pipeline-spill.mine").mkdir()
        (spill / "pipeline-spill.mine" / "keep.txt").write_text("mine")
        nxt = job("next", "exit 0")
        _, err = nxt.communicate(timeout=60)
        assert nxt.returncode == 0, err
        (line,) = err.strip().splitlines()
        assert line.startswith(f"pipeline: removed {dead} (") and line.endswith("), the spill folder of a job that was killed"), err
        assert runs(spill) == {"pipeline-spill.mine", alive_dir.name}  # the next job's own removed at its end
        assert (spill / "pipeline-spill.mine" / "keep.txt").read_text() == "mine" and (alive_dir / RUN_MARK).is_file()
    finally:
        for proc in (killed, alive):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
