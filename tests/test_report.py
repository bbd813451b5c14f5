"""The run report as an audit trail, the output's name and global attributes, and the log lines."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from pipeline.demo import write_demo
from pipeline.exec.report import TaskTimes, attribute, write_report
from pipeline.flows import fingerprint, load_flow, parse_flow, run_flow

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"


@pytest.fixture
def demo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_demo("data/demo.zarr", "1MB", seed=4)
    return tmp_path


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})


def test_report_is_an_audit_trail(demo):
    r = cli("--log-format", "json", "run", FLOW, "--report", "logs/report.json", cwd=demo)
    assert r.returncode == 0, r.stderr
    rep = json.loads((demo / "logs" / "report.json").read_text())
    assert not list((demo / "logs").glob(".*"))  # the temporary file was renamed into place

    raw = FLOW.read_bytes()
    assert rep["flow_sha256"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert rep["flow_content"] == __import__("yaml").safe_load(raw)
    assert rep["status"] == "ok" and rep["exit_status"] == 0
    assert rep["host"] == socket.gethostname() and rep["user"] == getpass.getuser()
    assert rep["command"] == f"pipeline --log-format json run {FLOW} --report logs/report.json"
    import dask
    import zarr

    assert rep["versions"]["dask"] == dask.__version__ and rep["versions"]["zarr"] == zarr.__version__
    assert {"pipeline", "distributed", "xarray", "numpy", "numba"} <= set(rep["versions"])
    started, finished = (datetime.fromisoformat(rep[k].replace("Z", "+00:00")) for k in ("started_utc", "finished_utc"))
    assert started <= finished and 0 < rep["wall_seconds"] <= rep["total_seconds"]

    (inp,) = rep["inputs"]
    store = demo / "data" / "demo.zarr"
    read = [*(f for f in store.iterdir() if f.is_file()), *[f for a in ("tas", "time", "lat", "lon") for f in (store / a).rglob("*") if f.is_file()]]
    assert inp["path"] == "data/demo.zarr" and set(inp["arrays"]) == {"tas", "time", "lat", "lon"}
    assert inp["files"] >= len(read) and inp["bytes"] >= sum(f.stat().st_size for f in read)
    assert inp["bytes"] < sum(f.stat().st_size for f in store.rglob("*") if f.is_file())  # sst is not read
    assert inp["mtime_max_ns"] == max(f.stat().st_mtime_ns for f in read)
    assert rep["fingerprint"] == fingerprint(load_flow(FLOW))
    assert rep["sink"]["variables"] == ["weighted_mean"]
    assert isinstance(rep["sink"]["digests"], dict)

    lines = [json.loads(line) for line in r.stderr.splitlines()]  # every line on stderr is JSON
    assert lines and all({"time", "level", "message"} <= set(x) for x in lines)
    done = [x for x in lines if x.get("wall_seconds") is not None]
    assert done and done[-1]["sink"] == "out/climate_anomaly.zarr" and done[-1]["flow"] == "climate_anomaly"
    assert "climate_anomaly: wrote out/climate_anomaly.zarr on cpu" in r.stdout  # the summary for people


def test_fingerprint_follows_the_flow_and_the_arrays_read(demo):
    flow = parse_flow(json.loads(json.dumps({**_flow(), "name": "f"})), "f.yaml")
    first = fingerprint(flow)
    assert fingerprint(flow) == first
    sst = next(f for f in Path("data/demo.zarr/sst").rglob("*") if f.is_file())
    os.utime(sst, ns=(1, 1))  # an array the flow does not read
    assert fingerprint(flow) == first
    tas = next(f for f in Path("data/demo.zarr/tas/c").rglob("*") if f.is_file())
    st = tas.stat()
    os.utime(tas, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert fingerprint(flow) != first
    other = parse_flow({**_flow(), "name": "g"}, "g.yaml")  # another flow on the same data
    assert fingerprint(other) != fingerprint(flow)


def _flow(**sink):
    return {"name": "t", "source": {"path": "data/demo.zarr", "variable": "tas"},
            "steps": [{"op": "standardized_anomaly", "params": {"dim": "time"}},
                      {"op": "weighted_mean", "params": {"dims": ["lat", "lon"]}}],
            "sink": {"path": "out/t.zarr", **sink}}


def test_output_is_named_after_the_last_step_and_carries_global_attributes(demo):
    src = xr.open_zarr("data/demo.zarr")
    src.attrs["history"] = "2020-01-01T00:00:00Z: made by hand"
    src.attrs["institution"] = "Somewhere"
    src.to_zarr("data/hist.zarr", zarr_format=3, consolidated=True)
    flow = parse_flow({**_flow(), "source": {"path": "data/hist.zarr", "variable": "tas"}}, "f.yaml")
    rep = run_flow(flow, backend="cpu", command="pipeline run f.yaml")
    out = xr.open_zarr("out/t.zarr")
    assert list(out.data_vars) == ["weighted_mean"]
    tas = src["tas"].astype("float64")
    z = (tas - tas.mean("time")) / tas.std("time")
    np.testing.assert_allclose(out["weighted_mean"], z.weighted(np.cos(np.deg2rad(tas.lat))).mean(("lat", "lon")),
                               rtol=1e-5, atol=1e-6)
    history = out.attrs["history"].splitlines()
    assert history[0] == "2020-01-01T00:00:00Z: made by hand"
    assert history[1].endswith("Z: pipeline run f.yaml") and datetime.fromisoformat(history[1].split("Z:")[0])
    assert out.attrs["source"] == "data/hist.zarr" and out.attrs["pipeline_flow"] == "t"
    assert "sha256:" + out.attrs["pipeline_flow_sha256"] == rep["flow_sha256"]
    assert out.attrs["Conventions"] == "CF-1.10" and out.attrs["institution"] == "Somewhere"
    assert out.attrs["title"] == src.attrs["title"]

    run_flow(parse_flow(_flow(name="gm"), "f.yaml"), backend="cpu")  # sink.name overrides
    assert list(xr.open_zarr("out/t.zarr").data_vars) == ["gm"]


def test_a_result_named_like_its_coordinate_asks_for_a_name(demo):
    from pipeline.errors import FlowError

    flow = {**_flow(), "steps": [{"op": "quantile", "params": {"q": 0.9, "dim": "time"}}]}
    with pytest.raises(FlowError, match=r"f.yaml: steps\[0\].name: the result is named 'quantile'.*set sink.name"):
        run_flow(parse_flow(flow, "f.yaml"), backend="cpu")
    run_flow(parse_flow({**flow, "sink": {"path": "out/t.zarr", "name": "p90"}}, "f.yaml"), backend="cpu")
    got = xr.open_zarr("out/t.zarr")["p90"]
    ref = xr.open_zarr("data/demo.zarr")["tas"].quantile(0.9, dim="time")
    np.testing.assert_allclose(got, ref.transpose(*got.dims), rtol=1e-5)


def test_a_failed_run_still_reports_its_status(demo):
    flow = parse_flow({**_flow(), "source": {"path": "data/demo.zarr", "variable": "pr"}}, "f.yaml")
    with pytest.raises(Exception, match="no variable 'pr'"):
        run_flow(flow, backend="cpu", report="r.json")
    rep = json.loads(Path("r.json").read_text())
    assert rep["status"] == "failed" and rep["exit_status"] == 2 and "no variable 'pr'" in rep["error"]
    assert rep["flow"] == "t" and rep["finished_utc"] >= rep["started_utc"]
    assert not Path("out").exists()


def test_steps_fused_into_the_write_say_so(demo):
    """A step whose tasks dask fused into the write shows where its time went, not 0.00 s."""
    rep = run_flow(parse_flow(_flow(), "f.yaml"), backend="cpu")
    by_name = {s["name"]: s for s in rep["steps"]}
    for s in rep["steps"]:
        assert s["tasks"] > 0 or s.get("fused_into") in (*by_name, "write"), s
    assert sum(s["tasks"] for s in rep["steps"]) + rep["write"]["tasks"] > 0
    from pipeline.flows import step_times

    text = step_times(rep["steps"])
    for s in rep["steps"]:
        assert (f"{s['name']} fused into {s['fused_into']}" if "fused_into" in s else f"{s['name']} {s['task_seconds']:.2f}s") in text


def test_attribute_finds_fused_layers():
    times = TaskTimes()
    times.add(("read-aaaa1111", 0), 0.5)
    times.add(("mean-bbbb2222", 0), 1.0)
    times.add("scale-mean-agg-store-map-finalize-hlgfinalizecompute-cccc3333", 2.0)
    parts = {"read": {"read-aaaa1111"}, "0:mean": {"mean-bbbb2222"}, "1:scale": {"scale-dddd4444"},
             "2:agg": {"agg-eeee5555"}}
    out = attribute(times, parts)
    assert out["read"] == {"task_seconds": 0.5, "tasks": 1}
    assert out["0:mean"] == {"task_seconds": 1.0, "tasks": 1}
    assert out["1:scale"] == {"task_seconds": 0.0, "tasks": 0, "fused_into": "write"}
    assert out["2:agg"]["fused_into"] == "write" and out["write"] == {"task_seconds": 2.0, "tasks": 1}


def test_write_report_replaces_atomically(tmp_path):
    path = tmp_path / "r.json"
    write_report({"a": 1}, path)
    write_report({"a": 2}, path)
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_text_logs_name_the_flow_and_where_it_writes(demo):
    r = cli("run", FLOW, "--no-progress", cwd=demo)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert any("flow climate_anomaly" in x and "-> out/climate_anomaly.zarr" in x and "on cpu" in x for x in lines)
    assert any("wrote out/climate_anomaly.zarr in" in x and "task time:" in x for x in lines)
    assert all(x[:8].count(":") == 2 for x in lines)  # each starts with HH:MM:SS
