"""Flows: validation names the file and the key; building computes nothing; results equal xarray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

from pipeline.demo import write_demo
from pipeline.flows import FlowError, build_flow, load_flow, parse_flow, run_flow

from .conftest import raise_if_dask_computes

REPO = Path(__file__).resolve().parent.parent

GOOD = {
    "name": "t",
    "source": {"path": "data/demo.zarr", "variable": "tas"},
    "steps": [{"op": "standardized_anomaly", "params": {"dim": "time"}}, {"op": "weighted_mean"}],
    "sink": {"path": "out/t.zarr"},
}


def with_changes(**changes):
    flow = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        node = flow
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        last = keys[-1]
        if value is _DELETE:
            del node[last]
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return flow


_DELETE = object()


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"steps__0__op": "standardised_anomaly"}, r"f.yaml: steps\[0\].op: unknown op 'standardised_anomaly'; did you mean 'standardized_anomaly'\?"),
        ({"source__variable": _DELETE}, r"f.yaml: source.variable: required key is missing"),
        ({"sink": _DELETE}, r"f.yaml: sink: required key is missing"),
        ({"steps__1__params": {"dims": ["lat"], "weight": "coslat"}}, r"steps\[1\].params.weight: unknown key; did you mean 'weights'\?"),
        ({"steps__0__params": {"dim": 3}}, r"steps\[0\].params.dim: Input should be a valid string \(got 3\)"),
        ({"steps": []}, r"f.yaml: steps: List should have at least 1 item"),
        ({"sink__mode": "append"}, r"f.yaml: sink.mode: Input should be 'overwrite' or 'fail'"),
        ({"source__chunks": {"time": "many"}}, r"source.chunks.time: Input should be a valid integer"),
        ({"colour": "blue"}, r"f.yaml: colour: unknown key \(keys: name, description, backend, source, steps, sink\)"),
        ({"source__demo": {"size": "huge"}}, r"source.demo.size: .*expected a size such as '64MB'"),
    ],
)
def test_validation_names_file_key_and_expectation(changes, message):
    with pytest.raises(FlowError, match=message):
        parse_flow(with_changes(**changes), "f.yaml")


def test_rolling_mean_window_is_required():
    flow = with_changes(steps__1={"op": "rolling_mean", "params": {"center": True}})
    with pytest.raises(FlowError, match=r"steps\[1\].params.window: required key is missing"):
        parse_flow(flow, "f.yaml")


def test_load_flow_file_errors(tmp_path):
    with pytest.raises(FlowError, match="missing.yaml: no such flow file"):
        load_flow(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(FlowError, match="bad.yaml: not valid YAML"):
        load_flow(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(FlowError, match="scalar.yaml: expected a mapping"):
        load_flow(scalar)


def test_shipped_flows_are_valid():
    flows = sorted((REPO / "flows").glob("*.yaml"))
    assert flows
    for f in flows:
        load_flow(f)


@pytest.fixture
def demo_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_demo("data/demo.zarr", "2MB", seed=1, time_chunk=17)
    return tmp_path


def test_building_a_flow_computes_nothing(demo_dir):
    flow = parse_flow(with_changes(steps__1={"op": "rolling_mean", "params": {"window": 5}}))
    with raise_if_dask_computes():
        built = build_flow(flow, backend="cpu")
    assert set(built.parts) == {"read", "0:standardized_anomaly", "1:rolling_mean"}


def test_build_errors_name_the_key(demo_dir):
    with pytest.raises(FlowError, match=r"f.yaml: source.variable: .*no variable 'pr'"):
        build_flow(parse_flow(with_changes(source__variable="pr"), "f.yaml"))
    with pytest.raises(FlowError, match=r"steps\[0\] \(standardized_anomaly\): .*no dimension 'day'"):
        build_flow(parse_flow(with_changes(steps__0__params={"dim": "day"}), "f.yaml"))
    with pytest.raises(FlowError, match=r"source.path: data/none.zarr: no such file or directory \(add a 'demo'"):
        build_flow(parse_flow(with_changes(source__path="data/none.zarr"), "f.yaml"))


def test_run_flow_equals_xarray_and_reports(demo_dir):
    flow = parse_flow(with_changes(), "f.yaml")
    report = run_flow(flow, backend="cpu", report="report.json")
    got = xr.open_zarr("out/t.zarr")["weighted_mean"].values
    tas = xr.open_zarr("data/demo.zarr")["tas"].astype(np.float64)
    z = (tas - tas.mean("time")) / tas.std("time")
    expected = z.weighted(np.cos(np.deg2rad(tas.lat))).mean(("lat", "lon")).values
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    on_disk = json.loads(Path("report.json").read_text())
    assert on_disk["flow"] == "t" and on_disk["backend"] == "cpu"
    assert [s["op"] for s in on_disk["steps"]] == ["standardized_anomaly", "weighted_mean"]
    assert report["bytes_read"] == tas.size * 4 and report["wall_seconds"] > 0
    assert sum(s["tasks"] for s in report["steps"]) > 0


def test_run_generates_missing_demo_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flow = parse_flow(with_changes(source__demo={"size": "1MB", "seed": 3}))
    report = run_flow(flow, backend="cpu")
    assert report["source"]["generated"] is True
    assert Path("data/demo.zarr/zarr.json").exists() and Path("out/t.zarr/zarr.json").exists()
    again = run_flow(flow, backend="cpu")  # reruns are safe: same output, demo not regenerated
    assert again["source"]["generated"] is False


def test_gpu_flow_equals_cpu_flow(demo_dir):
    pytest.importorskip("cupy")
    flow = parse_flow(with_changes(steps__1={"op": "weighted_mean"}))
    run_flow(flow, backend="cpu", output="out/cpu.zarr")
    run_flow(flow, backend="gpu", output="out/gpu.zarr")
    cpu = xr.open_zarr("out/cpu.zarr")["weighted_mean"].values
    gpu = xr.open_zarr("out/gpu.zarr")["weighted_mean"].values
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)


test_gpu_flow_equals_cpu_flow = pytest.mark.gpu(test_gpu_flow_equals_cpu_flow)


def test_flow_yaml_round_trip_through_file(tmp_path):
    f = tmp_path / "flow.yaml"
    f.write_text(yaml.safe_dump(GOOD))
    assert load_flow(f).name == "t"


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"steps__1__input": "nowhere"}, r"steps\[1\].input: expected 'source' or an earlier step \(standardized_anomaly\), got 'nowhere'"),
        ({"steps__1__name": "standardized_anomaly"}, r"steps\[1\].name: 'standardized_anomaly' names an earlier step"),
        ({"steps__0__name": "has space"}, r"steps\[0\].name: expected a name matching the pattern \^\[A-Za-z_\]\[A-Za-z0-9_\]\*\$, got 'has space'"),
        ({"sink__variables": ["weighted_mean", "zzz"]}, r"sink.variables: 'zzz' is not a step"),
    ],
)
def test_step_names_inputs_and_sink_variables_are_checked(changes, message):
    with pytest.raises(FlowError, match=message):
        parse_flow(with_changes(**changes), "f.yaml")


def test_branches_write_several_variables(demo_dir):
    flow = parse_flow(
        {
            "name": "branches",
            "source": {"path": "data/demo.zarr", "variable": "tas"},
            "steps": [
                {"op": "climatology", "name": "clim", "params": {"freq": "month"}},
                {"op": "anomaly", "name": "anom", "input": "source", "params": {"freq": "month"}},
                {"op": "weighted_mean", "name": "global_anom"},
            ],
            "sink": {"path": "out/b.zarr", "variables": ["clim", "global_anom"]},
        }
    )
    report = run_flow(flow, backend="cpu")
    out = xr.open_zarr("out/b.zarr")
    assert set(out.data_vars) == {"clim", "global_anom"}
    tas = xr.open_zarr("data/demo.zarr")["tas"].astype(np.float64)
    clim = tas.groupby("time.month").mean("time")
    np.testing.assert_allclose(out["clim"].values, clim.values, rtol=2e-6)
    anom = tas.groupby("time.month") - clim
    expected = anom.weighted(np.cos(np.deg2rad(tas.lat))).mean(("lat", "lon"))
    np.testing.assert_allclose(out["global_anom"].values, expected.values, atol=1e-5)
    assert [s["name"] for s in report["steps"]] == ["clim", "anom", "global_anom"]


def test_a_plan_over_the_memory_limit_is_refused_before_it_starts(demo_dir):
    import dask

    from pipeline.errors import InputError

    flow = parse_flow(with_changes(), "f.yaml")
    with dask.config.set({"pipeline.cpu.memory-limit": "10kB"}), pytest.raises(InputError) as e:
        run_flow(flow, backend="cpu")
    msg = str(e.value)
    assert msg.startswith("f.yaml: ") and "pipeline.cpu.memory-limit" in msg and "the process itself" in msg
    assert not Path("out/t.zarr").exists()


def test_out_of_core_flow_equals_in_core_and_reports_memory(demo_dir, monkeypatch):
    import dask

    from pipeline.exec import memory

    # a limit of a few MB, for the blocks alone: neither the process nor its kernels counted
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)
    monkeypatch.setattr(memory, "work_bytes", lambda backend, block_bytes: 0)

    write_demo("data/small.zarr", "8MB", seed=1, time_chunk=4)  # small stored chunks, a small plan
    flow = parse_flow(with_changes(source__path="data/small.zarr"), "f.yaml")
    in_core = run_flow(flow, backend="cpu", output="out/in.zarr")
    assert in_core["memory"]["plan"]["out_of_core"] is False
    # a limit between the input's size and twice it: the input is read twice instead of held
    limit = int(in_core["bytes_read"] * 1.5)
    with dask.config.set({"pipeline.cpu.memory-limit": limit, "num_workers": 2}):
        ooc = run_flow(flow, backend="cpu", output="out/ooc.zarr")
    plan = ooc["memory"]["plan"]
    assert plan["out_of_core"] is True and plan["peak_bytes"] <= plan["budget_bytes"]
    assert ooc["memory"]["host_peak_rss_bytes"] > 0
    a, b = (xr.open_zarr(f"out/{n}.zarr")["weighted_mean"].values for n in ("in", "ooc"))
    np.testing.assert_array_equal(a, b)
