"""The CLI as a user runs it: a subprocess, its exit code, what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"


def cli(*args, cwd, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu", **(env or {})},
    )


def test_run_main_flow_out_of_the_box(tmp_path):
    """The README's main command on a fresh machine: the demo source is generated first."""
    r = cli("run", FLOW, "--report", "report.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "climate_anomaly: wrote out/climate_anomaly.zarr on cpu" in r.stdout
    out = xr.open_zarr(tmp_path / "out" / "climate_anomaly.zarr")["weighted_mean"]
    assert out.dims == ("time",) and np.isfinite(out.values).all()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["source"]["generated"] is True
    assert {"wall_seconds", "bytes_read", "throughput_GBps", "steps", "sink"} <= set(report)
    for step in report["steps"]:
        assert {"op", "task_seconds", "tasks"} <= set(step)


def write_flow(tmp_path, mutate) -> Path:
    flow = yaml.safe_load(FLOW.read_text())
    mutate(flow)
    path = tmp_path / "flow.yaml"
    path.write_text(yaml.safe_dump(flow))
    return path


def _set(path, value):
    def mutate(flow):
        node = flow
        for k in path[:-1]:
            node = node[k]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    "mutate,message",
    [
        (_set(("steps", 0, "op"), "anomaly_of_doom"), "steps[0].op: unknown op 'anomaly_of_doom'"),
        (_set(("source", "path"), None), "source.path: required key is missing"),
        (_set(("steps", 1, "params", "dims"), 5), "steps[1].params.dims"),
        (_set(("source", "variable"), "precip"), "source.variable: data/demo.zarr: no variable 'precip'"),
        (_set(("source", "demo"), None), None),  # with the path pointing nowhere: see below
    ],
)
def test_bad_flows_exit_2_and_say_what_is_wrong(tmp_path, mutate, message):
    flow = write_flow(tmp_path, mutate)
    if message is None:
        flow = write_flow(tmp_path, lambda f: (mutate(f), f["source"].__setitem__("path", "data/absent.zarr")))
        message = "source.path: data/absent.zarr: no such file or directory"
    r = cli("run", flow, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert str(flow) in r.stderr or "flow.yaml" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_missing_flow_file_and_bad_profile_exit_2(tmp_path):
    r = cli("run", "nowhere.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "nowhere.yaml: no such flow file" in r.stderr
    r = cli("validate", "nowhere.yaml", cwd=tmp_path)
    assert r.returncode == 2
    r = cli("run", FLOW, "--cluster", "no-such-profile", cwd=tmp_path)
    assert r.returncode == 2 and "cluster profile 'no-such-profile' not found" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: local\nworkers: 3\n")
    r = cli("run", FLOW, "--cluster", bad, cwd=tmp_path)
    assert r.returncode == 2 and "bad.yaml: workers: Extra inputs are not permitted" in r.stderr


def test_gpu_backend_without_gpu_exits_2(tmp_path):
    from pipeline.backend import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    r = cli("run", FLOW, "--backend", "gpu", cwd=tmp_path)
    assert r.returncode == 2 and "no CUDA GPU is visible" in r.stderr
    assert list(tmp_path.iterdir()) == []  # refused before the demo source was written


@pytest.mark.parametrize("setting,value", [("PIN_MIN_FILE", "two megabytes"), ("PIN_FILES", "sometimes")])
def test_bad_pinning_settings_exit_2_and_write_nothing(tmp_path, setting, value):
    """Checked before the run starts, on any backend (they matter only on the GPU)."""
    r = cli("run", FLOW, cwd=tmp_path, env={f"DASK_PIPELINE__GPU__{setting}": value})
    assert r.returncode == 2, r.stderr
    key = setting.lower().replace("_", "-")
    assert f"pipeline.gpu.{key}:" in r.stderr and repr(value) in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the demo source


def test_bad_backend_setting_exits_2_and_writes_nothing(tmp_path):
    r = cli("run", FLOW, cwd=tmp_path, env={"DASK_PIPELINE__BACKEND": "tpu"})
    assert r.returncode == 2
    assert r.stderr.strip() == ("pipeline: error: pipeline.backend: expected one of auto, cpu, gpu, got 'tpu' "
                                "(environment variable DASK_PIPELINE__BACKEND)")
    assert list(tmp_path.iterdir()) == []  # not even the demo source


def test_python_dash_m_pipeline_runs_the_main_flow(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", FLOW, "--no-progress"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "climate_anomaly.zarr").is_dir()


def test_validate_ops_info(tmp_path):
    r = cli("validate", FLOW, cwd=tmp_path)
    assert r.returncode == 0 and "standardized_anomaly -> weighted_mean" in r.stdout
    r = cli("ops", "--json", cwd=tmp_path)
    ops = {o["name"]: o for o in json.loads(r.stdout)}
    assert {"standardized_anomaly", "weighted_mean", "rolling_mean"} <= set(ops)
    assert ops["rolling_mean"]["backends"] == ["cpu", "gpu"]
    r = cli("info", "--json", cwd=tmp_path)
    info = json.loads(r.stdout)
    assert r.returncode == 0 and "dask" in info["versions"] and "cpu" in info["backends"]
    r = cli("ops", cwd=tmp_path)
    assert "window: int (required)" in r.stdout


def test_demo_command_is_deterministic(tmp_path):
    r1 = cli("demo", "a.zarr", "--size", "1MB", "--seed", "7", cwd=tmp_path)
    r2 = cli("demo", "b.zarr", "--size", "1MB", "--seed", "7", cwd=tmp_path)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr
    a, b = xr.open_zarr(tmp_path / "a.zarr"), xr.open_zarr(tmp_path / "b.zarr")
    for v in ("tas", "sst", "sst_packed"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    r3 = cli("demo", "a.zarr", "--size", "1MB", cwd=tmp_path)
    assert r3.returncode == 2 and "already exists" in r3.stderr


def test_run_with_input_reads_that_store(tmp_path):
    """--input replaces the flow's source.path: that store is read, and no demo is generated."""
    assert cli("demo", "other.zarr", "--size", "1MB", "--seed", "3", cwd=tmp_path).returncode == 0
    r = cli("run", FLOW, "--input", "other.zarr", "--output", "out/other.zarr", "--report", "rep.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "data").exists()  # the flow's own source (a demo entry) was not written
    rep = json.loads((tmp_path / "rep.json").read_text())
    src = xr.open_zarr(tmp_path / "other.zarr")["tas"]
    assert rep["source"]["path"] == "other.zarr" and rep["source"]["generated"] is False
    assert rep["source"]["shape"] == list(src.shape)
    # the flow: standardized anomaly over time, then the cos(lat)-weighted mean over (lat, lon)
    x = src.astype("float64")
    z = (x - x.mean("time")) / x.std("time")
    expected = z.weighted(np.cos(np.deg2rad(src.lat))).mean(("lat", "lon"))
    got = xr.open_zarr(tmp_path / "out" / "other.zarr")["weighted_mean"]
    np.testing.assert_allclose(got.values, expected.values, rtol=1e-5, atol=1e-6)

    r = cli("run", FLOW, "--input", "missing.zarr", cwd=tmp_path)
    assert r.returncode == 2 and "missing.zarr" in r.stderr and "no such file" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "climate_anomaly.zarr").exists()


def test_run_on_a_local_cluster_profile(tmp_path):
    """The local-cpu profile starts a LocalCluster and closes it; output equals the threaded run."""
    profile = tmp_path / "small.yaml"
    profile.write_text("kind: local\nn_workers: 2\nthreads_per_worker: 1\nmemory_limit: 2GB\n"
                       f"local_directory: {tmp_path / 'spill'}\ndashboard_address: null\n")
    r = cli("run", FLOW, "--cluster", profile, "--output", "out/cluster.zarr", "--report", "rep.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r2 = cli("run", FLOW, "--output", "out/threads.zarr", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    a = xr.open_zarr(tmp_path / "out/cluster.zarr")["weighted_mean"].values
    b = xr.open_zarr(tmp_path / "out/threads.zarr")["weighted_mean"].values
    np.testing.assert_allclose(a, b, rtol=1e-6)
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["cluster"]["kind"] == "distributed" and rep["cluster"]["workers"] == 2
    assert sum(s["tasks"] for s in rep["steps"]) > 0
    workers = rep["memory"]["workers"]
    assert len(workers) == 2 and all(w["memory_limit_bytes"] == 2 * 10**9 and w["spilled_to_disk_bytes"] >= 0 for w in workers.values())


def test_sigterm_leaves_no_partial_output(tmp_path):
    """A cancelled batch job (SIGTERM) exits 1 and leaves neither a store nor a partial one."""
    import signal
    import time

    cli("demo", "data/demo.zarr", "--size", "96MB", cwd=tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "run", str(FLOW), "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"},
    )
    deadline = time.time() + 60
    while time.time() < deadline and not any((tmp_path / "out").glob(".climate_anomaly.zarr.partial*")):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    out = tmp_path / "out"
    if proc.returncode == 0:  # the run finished before the signal landed
        pytest.skip("the run was faster than the signal")
    assert proc.returncode == 1, err
    assert "interrupted" in err
    assert not out.exists() or os.listdir(out) == []


def test_convert_command(tmp_path):
    assert cli("demo", "a.zarr", "--size", "4MB", cwd=tmp_path).returncode == 0  # 38 days
    r = cli("convert", "a.zarr", "gpu.zarr", "--inner-chunk", "16KB", "--chunks", "time=20", cwd=tmp_path)
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    a, b = xr.open_zarr(tmp_path / "a.zarr"), xr.open_zarr(tmp_path / "gpu.zarr")
    for v in ("tas", "sst", "sst_packed"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    assert b["tas"].encoding["shards"][0] == 20
    r = cli("convert", "a.zarr", "raw.zarr", "--chunks", "time=20", "--compression", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    raw = xr.open_zarr(tmp_path / "raw.zarr")
    for v in ("tas", "sst", "sst_packed"):
        np.testing.assert_array_equal(a[v].values, raw[v].values)
    assert raw["tas"].encoding["chunks"][0] == 20 and not raw["tas"].encoding.get("compressors")
    r = cli("convert", "a.zarr", "gpu.zarr", cwd=tmp_path)
    assert r.returncode == 2 and "already exists" in r.stderr
    r = cli("convert", "missing.zarr", "x.zarr", cwd=tmp_path)
    assert r.returncode == 2 and "missing.zarr" in r.stderr
    r = cli("convert", "a.zarr", "y.zarr", "--chunks", "time:40", cwd=tmp_path)
    assert r.returncode == 2 and "--chunks" in r.stderr
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()


def test_a_failure_out_of_memory_says_what_to_change(monkeypatch, capsys):
    import argparse

    from pipeline import cli as cli_module

    OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})

    def fail(args):
        raise OutOfMemoryError("Out of memory allocating 303,166,464 bytes")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(func=fail)

    monkeypatch.setattr(cli_module, "parser", Parser)
    assert cli_module.main(["run", "f.yaml"]) == cli_module.EXIT_FAILURE
    err = capsys.readouterr().err
    assert "Out of memory allocating" in err and "pipeline.gpu.threads" in err and "pipeline.gpu.memory-limit" in err
    assert "num_workers" in cli_module._hint(MemoryError()) and cli_module._hint(ValueError("x")) == ""
