"""Settings, cluster profiles, spill directories, kernel caches and log lines: a misspelt or
invalid setting is refused naming it; profiles are found by name from any folder; workers spill to
a directory only this user may enter, removed with the run; kernels are cached where
``pipeline.cache-dir`` says, in the workers too; distributed's lines follow ``--log-format`` and
``--log-level``."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline
from pipeline import config
from pipeline.errors import InputError
from pipeline.exec import cluster
from pipeline.exec.cluster import ClusterProfile, find_profile, open_cluster, private_directory

from .cluster_runs import FLOW, REPO, cli, expected_anomaly

PACKAGE = Path(pipeline.__file__).resolve().parent


# --- settings ------------------------------------------------------------------------------------


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in tree.items():
        out |= _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return out


def test_every_shipped_setting_has_a_rule_and_the_defaults_pass():
    shipped = _leaves(yaml.safe_load((PACKAGE / "pipeline.yaml").read_text())["pipeline"])
    assert shipped == set(config.RULES)
    config.check()


@pytest.mark.parametrize("key,named,suggestion", [
    ("pipeline.cpu.memory_limt", None, "pipeline.cpu.memory-limit"),  # as DASK_PIPELINE__CPU__MEMORY_LIMT gives it
    ("pipeline.gpu.treads", None, "pipeline.gpu.threads"),
    ("pipeline.backnd", None, "pipeline.backend"),
    ("pipeline.gpu.decode-rates.gpu-frames", None, "pipeline.gpu.decode-rates.gpu-frame"),
    ("pipeline.cpus.memory-limit", "pipeline.cpus", "pipeline.cpu"),
])
def test_an_unknown_setting_is_refused_naming_it_and_the_nearest_one(key, named, suggestion):
    with dask.config.set({key: "1MB"}), pytest.raises(InputError) as e:
        config.check()
    assert str(e.value) == f"{named or key}: no such setting; did you mean {suggestion}?"


@pytest.mark.parametrize("key,value", [
    ("cpu.memory-limit", "abc"), ("cpu.memory-limit", "nan"), ("cpu.memory-limit", "inf"), ("cpu.memory-limit", float("nan")),
    ("cpu.memory-limit", 0), ("cpu.memory-limit", -0.5), ("cpu.memory-limit", -3e9), ("cpu.memory-limit", "-5MB"),
    ("cpu.memory-limit", ""), ("cpu.memory-limit", True), ("cpu.memory-limit", None), ("gpu.memory-limit", "0B"),
    ("cpu.block-size", -5), ("cpu.block-size", "huge"), ("gpu.block-size", 0), ("demo.size", "0"),
    ("gpu.threads", 0), ("gpu.threads", 2.5), ("gpu.threads", True), ("gpu.io-threads", -1),
    ("backend", "GPU"), ("backend", None), ("gpu.nvcomp", "yes"), ("cluster.locality", 1), ("gpu.pin-files", "always"),
    ("cluster.connect-timeout", "soon"), ("cluster.connect-timeout", 0), ("cluster.connect-timeout", float("inf")),
    ("gpu.host-spill", -1), ("gpu.pinned-files", "lots"), ("gpu.pin-min-file", -1),
    ("gpu.decode-rates.gpu-frame", 0), ("cache-dir", ""), ("log.format", "xml"), ("log.level", "loud"),
    ("gpu", 4), ("gpu.decode-rates", "fast"), ("gpu.hardware-queues", 0), ("gpu.hardware-queues", 33),
    ("gpu.hardware-queues", "32"), ("gpu.hardware-queues", True), ("gpu.hardware-queues", "AUTO"),
])
def test_an_invalid_value_is_refused_naming_the_key_the_value_and_what_is_expected(key, value):
    with dask.config.set({f"pipeline.{key}": value}), pytest.raises(InputError) as e:
        config.check()
    message = str(e.value)
    assert message.startswith(f"pipeline.{key}: expected ") and message.endswith(f", got {value!r}"), message
    assert "\n" not in message


@pytest.mark.parametrize("key,value", [
    ("cpu.memory_limit", "16GB"), ("cpu.memory-limit", 0.3), ("cpu.memory-limit", 1), ("cpu.memory-limit", 2e9),
    ("cpu.memory-limit", "0.25"), ("cpu.memory-limit", 2.5e9 + 0.5), ("gpu.memory-limit", "40 GiB"), ("cpu.block-size", None), ("cpu.block-size", 128 * 2**20),
    ("gpu.block-size", "4GiB"), ("gpu.host-spill", 0), ("gpu.pinned-files", "0B"), ("gpu.pin-min-file", 0),
    ("gpu.io_threads", None), ("gpu.io-threads", 4), ("backend", "cpu"), ("gpu.nvcomp", False),
    ("cluster.connect-timeout", 5), ("cluster.connect-timeout", "2m"), ("cache-dir", "~/kernels"),
    ("log.level", "WARNING"), ("gpu.decode-rates.cpu_frame", "1GB"), ("gpu.hardware-queues", None),
    ("gpu.hardware_queues", 1), ("gpu.hardware-queues", 32), ("gpu.hardware-queues", "auto"),
])
def test_valid_values_in_either_spelling_of_their_key_are_accepted(key, value):
    with dask.config.set({f"pipeline.{key}": value}):
        config.check()


_CHECK_ENV = """
import json, os, sys
import dask.config
import pipeline.config as c
from pipeline.errors import InputError
out = []
for name, value in json.loads(sys.argv[1]):
    os.environ[name] = value
    dask.config.refresh()  # dask reads the environment at its import, and here again
    try:
        c.check()
        out.append(None)
    except InputError as e:
        out.append(str(e))
    del os.environ[name]
print(json.dumps(out))
"""


def test_settings_from_environment_variables_and_files_name_where_they_were_set(tmp_path):
    """``DASK_PIPELINE__CPU__MEMORY_LIMT=1MB`` (a misspelt memory limit, once ignored in silence)
    and ``...MEMORY_LIMIT=abc``, ``nan``, ``inf`` (once a 41-line traceback) and
    ``...BLOCK_SIZE=-5`` (once accepted) are each one InputError naming the variable; a key of a
    YAML file in dask's config paths is named with the file."""
    cases = [("DASK_PIPELINE__CPU__MEMORY_LIMT", "1MB"), ("DASK_PIPELINE__CPU__MEMORY_LIMIT", "abc"),
             ("DASK_PIPELINE__CPU__MEMORY_LIMIT", "nan"), ("DASK_PIPELINE__CPU__MEMORY_LIMIT", "inf"),
             ("DASK_PIPELINE__CPU__BLOCK_SIZE", "-5"), ("DASK_PIPELINE__GPU__NVCOMP", "false")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    r = subprocess.run([sys.executable, "-c", _CHECK_ENV, json.dumps(cases)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    limt, abc, nan, inf, block, nvcomp = json.loads(r.stdout)
    assert limt == ("pipeline.cpu.memory_limt: no such setting (environment variable DASK_PIPELINE__CPU__MEMORY_LIMT); "
                    "did you mean pipeline.cpu.memory-limit?")
    expected = "a size in bytes such as 16GB, or a fraction of the memory above 0 and up to 1"
    for message, value in ((abc, "abc"), (nan, "nan"), (inf, "inf")):
        assert message == f"pipeline.cpu.memory-limit: expected {expected}, got {value!r} (environment variable DASK_PIPELINE__CPU__MEMORY_LIMIT)"
    assert block == ("pipeline.cpu.block-size: expected a size in bytes above 0, such as 64MB or 2GiB, or null, got -5 "
                     "(environment variable DASK_PIPELINE__CPU__BLOCK_SIZE)")
    assert nvcomp is None

    (tmp_path / "mine.yaml").write_text("pipeline:\n  gpu:\n    treads: 4\n")
    r = subprocess.run([sys.executable, "-c", "import pipeline.config as c; c.check()"], capture_output=True, text=True,
                       timeout=120, env={**env, "DASK_CONFIG": str(tmp_path)})
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        f"pipeline.errors.InputError: pipeline.gpu.treads: no such setting (in {tmp_path / 'mine.yaml'}); did you mean pipeline.gpu.threads?")


def test_the_memory_budget_of_a_bad_setting_is_an_input_error_naming_it():
    from pipeline import backend

    for value in ("abc", "nan", "-1GB"):
        with dask.config.set({"pipeline.cpu.memory-limit": value}), pytest.raises(InputError, match=r"^pipeline.cpu.memory-limit: expected"):
            backend.memory_budget("cpu")
    with dask.config.set({"pipeline.cpu.memory-limit": "1GB"}):
        assert backend.memory_budget("cpu") == 10**9
    with dask.config.set({"pipeline.cpu.memory-limit": 0.5}):
        assert backend._bytes_or_fraction(0.5, 1000) == 500 and backend._bytes_or_fraction("2kB", 10) == 2000


def test_a_cluster_does_not_start_with_a_misspelt_setting():
    with dask.config.set({"pipeline.cpu.memory_limt": "1MB"}), pytest.raises(InputError, match="did you mean pipeline.cpu.memory-limit"):
        with open_cluster(ClusterProfile(kind="local", n_workers=1, processes=False, dashboard_address=None)):
            pass


# --- cluster profiles ----------------------------------------------------------------------------


def test_profiles_ship_with_the_package_once_and_are_found_by_name():
    shipped = {p.stem for p in (PACKAGE / "profiles").glob("*.yaml")}
    assert shipped == {"local-cpu", "local-gpu", "slurm-gpu", "attach"}
    assert not list(REPO.glob("configs/*.y*ml")), "a second copy of a profile"
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pipeline"]
    assert "profiles/*.yaml" in package_data
    for name in shipped:
        assert find_profile(name) == PACKAGE / "profiles" / f"{name}.yaml"
    with pytest.raises(InputError, match=r"cluster profile 'local-cpus' not found: give one of attach, local-cpu, local-gpu, slurm-gpu"):
        find_profile("local-cpus")
    with pytest.raises(InputError, match=r"^nowhere/local-cpu.yaml: cluster profile not found \(no such file\)$"):
        find_profile("nowhere/local-cpu.yaml")


# --- spill directories ---------------------------------------------------------------------------


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    """``tempfile.gettempdir()`` is ``tmp_path``."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_private_directory_is_made_0700_and_kept(tmpdir_here):
    path = private_directory()
    assert path == tmpdir_here / f"pipeline-{os.getuid()}"
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    (path / "kept").write_text("")
    assert private_directory() == path and (path / "kept").exists()


@pytest.mark.parametrize("made,reason", [
    ("other-user", r"it belongs to another user \(uid 54321, not \d+\)"),
    ("open", r"other users may enter it \(mode 777, expected 700\)"),
    ("group", r"other users may enter it \(mode 750, expected 700\)"),
    ("link", "it is a symbolic link"),
    ("file", "it is not a directory"),
])
def test_a_directory_made_by_someone_else_or_open_to_others_is_refused(tmpdir_here, made, reason):
    path = tmpdir_here / f"pipeline-{os.getuid()}"
    if made == "other-user":
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user takes root")
        path.mkdir(mode=0o700)
        os.chown(path, 54321, 54321)
    elif made in ("open", "group"):
        path.mkdir()
        path.chmod(0o777 if made == "open" else 0o750)
    elif made == "link":
        (tmpdir_here / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmpdir_here / "elsewhere")
    else:
        path.write_text("")
    before = os.lstat(path)
    with pytest.raises(InputError, match=rf"^{path}: refusing to spill there: {reason}\n"):
        private_directory()
    after = os.lstat(path)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # left as it was


def test_a_local_cluster_spills_to_a_directory_of_its_own_removed_at_the_end(tmpdir_here):
    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    with open_cluster(profile) as client:
        (worker_dir,) = client.run(lambda dask_worker: dask_worker.local_directory).values()
        run = Path(worker_dir).parents[1]
        assert run.parent == tmpdir_here / f"pipeline-{os.getuid()}" and run.name.startswith("run-")
        assert stat.S_IMODE(run.stat().st_mode) == 0o700 and Path(worker_dir).is_dir()
    assert not run.exists() and os.listdir(run.parent) == []
    assert sorted(os.listdir(tmpdir_here)) == [f"pipeline-{os.getuid()}"]  # not even the scheduler's scratch space


def test_a_run_exits_2_where_the_spill_directory_is_someone_elses(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user takes root")
    hostile = tmp_path / "tmp" / f"pipeline-{os.getuid()}"
    hostile.mkdir(parents=True, mode=0o777)
    hostile.chmod(0o777)
    os.chown(hostile, 54321, 54321)
    work = tmp_path / "work"
    work.mkdir()
    r = cli("run", FLOW, "--cluster", "local-cpu", cwd=work, env={"TMPDIR": str(tmp_path / "tmp")})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"pipeline: error: {hostile}: refusing to spill there: it belongs to another user (uid 54321, not {os.getuid()})",
        "  remove it, or name a directory of your own as the cluster profile's local_directory"]
    assert os.listdir(work) == [] and os.listdir(hostile) == []  # nothing written, the source's demo included


# --- a run on local-cpu from another folder: caches, spill, logs ---------------------------------


def _kernel_caches(root: Path) -> set[Path]:
    return {*root.rglob("*.nbi"), *root.rglob("*.nbc")}


@pytest.mark.parametrize("fmt,level", [("text", "warning"), ("json", "info")])
def test_a_local_cpu_run_from_any_folder_caches_spills_and_logs_where_it_should(tmp_path, fmt, level):
    """``--cluster local-cpu`` once worked only from the repository's root; its workers wrote
    Numba's caches into the package's source tree, left /tmp/pipeline-spill/dask-scratch-space
    behind, and printed distributed's INFO lines (31 at --log-level warning) in their own format."""
    from pipeline.demo import write_demo

    work, cache, tmp = tmp_path / "work", tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    write_demo(work / "data" / "demo.zarr", "1MB", seed=4)
    before = _kernel_caches(PACKAGE)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "CUPY_CACHE_DIR")}  # set by this process
    r = subprocess.run([sys.executable, "-m", "pipeline", "--log-format", fmt, "--log-level", level, "run", str(FLOW),
                        "--cluster", "local-cpu"], cwd=work, capture_output=True, text=True, timeout=300,
                       env={**env, "DASK_PIPELINE__BACKEND": "cpu", "DASK_PIPELINE__CACHE_DIR": str(cache), "TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr
    got = xr.open_zarr(work / "out" / "climate_anomaly.zarr")["weighted_mean"].values
    np.testing.assert_allclose(got, expected_anomaly(work / "data" / "demo.zarr"), rtol=1e-5, atol=1e-6)

    assert _kernel_caches(PACKAGE) - before == set()  # the workers compiled into the cache dir instead
    assert {p.name.split(".")[0] for p in _kernel_caches(cache / "numba")} >= {"moments", "elementwise"}
    private = tmp / f"pipeline-{os.getuid()}"
    assert os.listdir(tmp) == [private.name] and os.listdir(private) == []  # the run's directory removed
    assert stat.S_IMODE(private.stat().st_mode) == 0o700

    lines = r.stderr.splitlines()
    assert "killed by signal" not in r.stderr and "killing" not in r.stderr, r.stderr
    if fmt == "text":
        assert lines == [], r.stderr  # a run without problems says nothing at warning
    else:
        records = [json.loads(line) for line in lines]  # every line is JSON
        assert {r["logger"] for r in records} >= {"pipeline.flows"}
        assert not [r for r in records if not r["logger"].startswith("pipeline") and r["level"] in ("DEBUG", "INFO")], records


_WORKER_LOGS = """
import logging, sys

def emit():
    for name in ("pipeline.test", "distributed.worker"):
        logging.getLogger(name).warning("%s warns from a worker", name)
        logging.getLogger(name).info("%s informs from a worker", name)

if __name__ == "__main__":
    from pipeline import log
    log.configure(sys.argv[1], sys.argv[2])
    from pipeline.exec.cluster import ClusterProfile, open_cluster

    with open_cluster(ClusterProfile(kind="local", n_workers=1, threads_per_worker=1)) as client:
        client.run(emit)
"""


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_workers_log_in_the_format_and_level_of_the_process_that_started_them(tmp_path, fmt):
    """A worker is a process of its own: its lines, pipeline's and distributed's, come in the run's
    format (every stderr line JSON with ``--log-format json``), distributed's at WARNING or above."""
    (tmp_path / "emit.py").write_text(_WORKER_LOGS)
    r = subprocess.run([sys.executable, "emit.py", fmt, "info"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    if fmt == "json":
        records = [json.loads(line) for line in r.stderr.splitlines()]
        assert [(r["logger"], r["level"], r["message"]) for r in records] == [
            ("pipeline.test", "WARNING", "pipeline.test warns from a worker"),
            ("pipeline.test", "INFO", "pipeline.test informs from a worker"),
            ("distributed.worker", "WARNING", "distributed.worker warns from a worker")]
    else:
        warns, informs, distributed = r.stderr.splitlines()
        assert warns == "pipeline: warning: pipeline.test warns from a worker"
        assert re.fullmatch(r"\d\d:\d\d:\d\d pipeline.test informs from a worker", informs), informs
        assert distributed == "pipeline: warning: distributed.worker warns from a worker"


def _busy(seconds: float) -> None:
    from distributed import Event

    Event("busy").set()
    import time

    time.sleep(seconds)


def test_workers_slow_to_stop_are_not_killed(caplog):
    """distributed's nannies kill a worker that has not stopped 4 s after they asked ("killed by
    signal 9" at the end of a run, where a loaded machine's workers were slow); a cluster started
    here gives them CLOSE_TIMEOUT. The worker here is busy for 5 s more when the run ends."""
    from distributed import Event

    profile = ClusterProfile(kind="local", n_workers=1, threads_per_worker=1, dashboard_address=None)
    caplog.set_level(logging.INFO, logger="distributed.nanny")
    with open_cluster(profile) as client:
        busy = client.submit(_busy, 5, pure=False)
        assert Event("busy").wait(timeout=60)
    assert busy.status in ("finished", "cancelled")
    stopped = [r.getMessage() for r in caplog.records if r.name == "distributed.nanny"]
    assert not [m for m in stopped if "killed by signal" in m or "killing" in m], stopped
    assert cluster.CLOSE_TIMEOUT > 5
