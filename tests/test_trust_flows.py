"""Trust in flows: a report never overwrites what a run reads or writes, a flow's values never
become code, results on different grids are never joined into one store, validate and run give
one message, and a mistyped name says what was meant."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dask.callbacks import Callback
import xarray as xr
import yaml

from pipeline.demo import write_demo
from pipeline.errors import InputError
from pipeline.flows import FlowError, check_data, load_flow, parse_flow, run_flow

from .conftest import climate_array

ATTACK = 'x"""; import os; os.system("touch PWNED"); """'


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})


def refused(r, *expected):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr
    return r.stderr


def write_flow(path: Path, steps: list[dict], sink: dict | None = None, **top) -> Path:
    flow = {"name": "t", "source": {"path": "data/demo.zarr", "variable": "tas"}, "steps": steps,
            "sink": sink or {"path": "out/t.zarr"}, **top}
    path.write_text(yaml.safe_dump(flow, sort_keys=False))
    return path


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A demo store at data/demo.zarr (38 days) under the test's folder, its working directory."""
    monkeypatch.chdir(tmp_path)
    write_demo("data/demo.zarr", "4MB", seed=1)
    return tmp_path


def snapshot(*paths: Path) -> dict:
    """Every file under ``paths``: its bytes."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()]
    return {str(f): f.read_bytes() for f in files}


# --- a report never overwrites the flow, an input or the output -----------------------------------


@pytest.mark.parametrize("report,message", [
    ("data/demo.zarr/zarr.json", "lies inside the input data/demo.zarr"),
    ("tas-link/report.json", "lies inside the input data/demo.zarr"),  # a link to a folder of the store
    ("meta-link.json", "lies inside the input data/demo.zarr"),  # a link to the store's zarr.json
    ("flow.yaml", "is the flow file flow.yaml"),
    ("flow-link.yaml", "is the flow file flow.yaml"),
    ("out/t.zarr", "is the output out/t.zarr"),
    ("out/t.zarr/report.json", "lies inside the output out/t.zarr"),
])
def test_a_report_over_the_flow_an_input_or_the_output_is_refused(demo, report, message):
    flow = write_flow(demo / "flow.yaml", [{"op": "climatology"}])
    (demo / "tas-link").symlink_to(demo / "data" / "demo.zarr" / "tas")
    (demo / "meta-link.json").symlink_to(demo / "data" / "demo.zarr" / "zarr.json")
    (demo / "flow-link.yaml").symlink_to(flow)
    before = snapshot(demo)
    r = cli("run", "flow.yaml", "--report", report, cwd=demo)
    refused(r, f"--report {report}: {message}; write the report elsewhere")
    assert snapshot(demo) == before  # nothing written, nothing changed
    assert not (demo / "out").exists()
    with pytest.raises(InputError, match="lies inside the input"):  # the Python API refuses it too
        run_flow(load_flow(flow), backend="cpu", report="data/demo.zarr/zarr.json")
    assert snapshot(demo) == before


def test_bench_json_over_the_flow_or_the_source_is_refused(demo, capsys):
    from pipeline import cli as cli_module

    flow = write_flow(demo / "flow.yaml", [{"op": "climatology"}])
    before = snapshot(demo)
    for json_path, message in (("flow.yaml", "is the flow file"), ("data/demo.zarr/zarr.json", "lies inside the input")):
        assert cli_module.main(["bench", str(flow), "--json", json_path, "--no-fresh"]) == cli_module.EXIT_INPUT
        assert f"--json {json_path}: {message}" in capsys.readouterr().err
    assert snapshot(demo) == before


# --- a flow's values never become code --------------------------------------------------------------


def test_a_flow_name_that_is_code_is_refused_and_never_runs(demo):
    write_flow(demo / "name.yaml", [{"op": "climatology"}], name=ATTACK)
    write_flow(demo / "step.yaml", [{"op": "climatology", "name": ATTACK}])
    write_flow(demo / "sink.yaml", [{"op": "climatology"}], {"path": "out/t.zarr", "variables": [ATTACK]})
    r = cli("validate", "name.yaml", "step.yaml", "sink.yaml", cwd=demo)
    err = refused(r, "name.yaml: name: expected a name matching the pattern ^[A-Za-z_][A-Za-z0-9_.-]*$, got 'x\"\"\"; import",
                  "step.yaml: steps[0].name: expected a name matching the pattern ^[A-Za-z_][A-Za-z0-9_]*$",
                  "sink.yaml: sink.variables[0]: expected a name matching the pattern ^[A-Za-z_][A-Za-z0-9_]*$")
    assert len(err.splitlines()) == 3, err
    for command in ("bench", "run"):
        refused(cli(command, "name.yaml", cwd=demo), "name.yaml: name: expected a name matching the pattern")
    assert not (demo / "PWNED").exists()
    assert sorted(p.name for p in demo.iterdir()) == ["data", "name.yaml", "sink.yaml", "step.yaml"]


def _code(script: str) -> str:
    """The script's code without its FLOW literal (the flow's values, as data)."""
    tree = ast.parse(script)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.Assign) and n.targets[0].id == "FLOW")]
    return ast.dump(tree)


def test_odd_values_reach_the_peer_script_as_data_only(tmp_path, monkeypatch):
    """A store's variable and a flow file named with quotes and code: legal, and only data."""
    from pipeline import bench

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "odd.zarr"
    climate_array(shape=(40, 4, 6), chunks={"time": 20}).rename(ATTACK).to_dataset().to_zarr(store)
    steps = [{"op": "climatology", "name": "clim"}, {"op": "weighted_mean", "name": "gm", "params": {"weights": "lat"}}]
    flow = {"name": "odd", "source": {"path": str(store), "variable": ATTACK}, "steps": steps,
            "sink": {"path": str(tmp_path / "out.zarr")}}
    flow_file = tmp_path / f"{ATTACK}.yaml"
    flow_file.write_text(yaml.safe_dump(flow))

    result = bench.run(flow_file, backends=("cpu",), repeat=1, fresh_process=False)
    assert result.ok, result.table()
    plain = bench.peer_script(parse_flow({**flow, "source": {"path": str(store), "variable": "tas"}}, "f.yaml"))
    assert _code(result.script) == _code(plain)  # the flow's values changed nothing but the data
    namespace = {}
    exec(compile(result.script, "xarray_peer.py", "exec"), namespace)
    assert namespace["FLOW"]["source"]["variable"] == ATTACK and namespace["FLOW"]["file"] == str(flow_file)

    script = tmp_path / "xarray_peer.py"
    script.write_text(result.script)
    r = subprocess.run([sys.executable, str(script), str(store), "peer.zarr"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    src = xr.open_zarr(store)[ATTACK]
    expected = src.groupby("time.month").mean("time").weighted(src.lat).mean(("lat", "lon"))
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "peer.zarr")["gm"].values, expected.values, rtol=1e-5)
    assert not (tmp_path / "PWNED").exists()


# --- results on different grids are refused ------------------------------------------------------------


def test_results_on_different_grids_are_refused_before_anything_is_written(demo):
    steps = [
        {"op": "count_above", "name": "hot_days", "input": "source", "params": {"threshold": 290.0, "freq": "YS"}},
        {"op": "climatology", "name": "clim", "input": "source"},
        {"op": "weighted_mean", "name": "gmean", "input": "source"},
    ]
    write_flow(demo / "mix.yaml", steps, {"path": "out/mix.zarr", "variables": ["hot_days", "clim", "gmean"]})
    message = ("mix.yaml: sink.variables: 'hot_days' (count_above) and 'gmean' (weighted_mean) are on different grids: "
               "along dimension 'time', hot_days has 1 coordinate (1990-01-01) and gmean has 38 coordinates "
               "(1990-01-01 to 1990-02-07)")
    for command in ("validate", "run"):
        refused(cli(command, "mix.yaml", cwd=demo), message, "write these in separate flows")
    assert not (demo / "out").exists()

    coarse = [{"op": "climatology", "name": "clim"}, {"op": "coarsen_mean", "name": "coarse", "input": "source",
                                                       "params": {"factors": {"lon": 4}}}]
    flow = load_flow(write_flow(demo / "coarse.yaml", coarse, {"path": "out/c.zarr", "variables": ["clim", "coarse"]}))
    with pytest.raises(FlowError, match=r"'clim' \(climatology\) and 'coarse' \(coarsen_mean\) are on different grids: "
                                        r"along dimension 'lon', clim has 144 coordinates \(0.0 to 357.5\) and coarse has 36"):
        check_data(flow)  # validate: from the metadata
    with pytest.raises(FlowError, match=r"along dimension 'lon', clim has 144 coordinates \(0.0 to 357.5\) and coarse "
                                        r"has 36 coordinates \(3.75 to 353.75\)"):
        run_flow(flow, backend="cpu")
    assert not (demo / "out").exists()

    # results on one grid still go into one store, as computed
    steps[2] = {"op": "max_spell_length", "name": "spell", "input": "source", "params": {"threshold": 290.0}}
    flow = load_flow(write_flow(demo / "one.yaml", steps[::2], {"path": "out/one.zarr", "variables": ["hot_days", "spell"]}))
    check_data(flow)
    run_flow(flow, backend="cpu")
    out = xr.open_zarr(demo / "out" / "one.zarr")
    tas = xr.open_zarr(demo / "data" / "demo.zarr")["tas"]
    assert out.sizes == {"time": 1, "lat": 73, "lon": 144}
    np.testing.assert_array_equal(out["hot_days"].values, (tas > 290.0).sum("time").values[None])


# --- validate and run: one message for a source that is not a store ----------------------------------------


def test_a_source_that_is_not_a_store_gets_one_message_from_validate_and_run(tmp_path):
    (tmp_path / "empty.zarr").mkdir()
    (tmp_path / "notes.txt").write_text("not data\n")
    for name, path in (("dir.yaml", "empty.zarr"), ("txt.yaml", "notes.txt")):
        flow = write_flow(tmp_path / name, [{"op": "climatology"}])
        flow.write_text(flow.read_text().replace("data/demo.zarr", path))
    validate = refused(cli("validate", "dir.yaml", "txt.yaml", cwd=tmp_path)).splitlines()
    run = [line for name in ("dir.yaml", "txt.yaml") for line in refused(cli("run", name, cwd=tmp_path)).splitlines()]
    assert validate == run == [
        "pipeline: error: dir.yaml: source.path: empty.zarr: a directory but not a Zarr store (no zarr.json, .zgroup or .zarray)",
        "pipeline: error: txt.yaml: source.path: notes.txt: not a Zarr store or a NetCDF file (expected a directory or one "
        "of ('.nc', '.nc4', '.netcdf', '.h5', '.hdf5', '.cdf'))",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.yaml", "empty.zarr", "notes.txt", "txt.yaml"]


# --- a mistyped name says what was meant -----------------------------------------------------------------------


def test_unknown_ops_and_keys_say_what_was_meant(tmp_path):
    write_flow(tmp_path / "op.yaml", [{"op": "climatolgy"}])
    write_flow(tmp_path / "nothing.yaml", [{"op": "frobnicate"}])
    write_flow(tmp_path / "step.yaml", [{"op": "climatology", "parms": {"freq": "month"}}])
    write_flow(tmp_path / "source.yaml", [{"op": "climatology"}])
    (tmp_path / "source.yaml").write_text((tmp_path / "source.yaml").read_text().replace("variable:", "varible:"))
    write_flow(tmp_path / "sink.yaml", [{"op": "climatology"}], {"path": "out/t.zarr", "mdoe": "fail"})
    write_flow(tmp_path / "top.yaml", [{"op": "climatology"}], descripton="monthly means")
    names = ["op.yaml", "nothing.yaml", "step.yaml", "source.yaml", "sink.yaml", "top.yaml"]
    err = refused(cli("validate", *names, cwd=tmp_path),
                  "op.yaml: steps[0].op: unknown op 'climatolgy'; did you mean 'climatology'?",
                  "nothing.yaml: steps[0].op: unknown op 'frobnicate'\n  ops of one variable (source.variable): anomaly,",
                  "ops of datasets (source.variables): 23 more; `pipeline ops` describes each op and its parameters",
                  "step.yaml: steps[0].parms: unknown key; did you mean 'params'?",
                  "source.yaml: source.varible: unknown key; did you mean 'variable'?",
                  "sink.yaml: sink.mdoe: unknown key; did you mean 'mode'?",
                  "top.yaml: descripton: unknown key; did you mean 'description'?")
    unknown_op = err[err.index("pipeline: error: nothing.yaml"):err.index("pipeline: error: step.yaml")].splitlines()
    assert len(unknown_op) <= 5 and all(len(line) <= 120 for line in unknown_op), unknown_op
    assert "weighted_mean" in err and "hardy_weinberg_test" not in err  # a flow of one variable lists those ops


# --- a source changed during the run fails it ---------------------------------------------------------------


class _AfterFirstTask(Callback):
    """Calls ``change`` once, when the run's first task has finished (the source is being read)."""

    def __init__(self, change):
        super().__init__()
        self.change = change
        self.done = False

    def _posttask(self, key, result, dsk, state, id):
        if not self.done:
            self.done = True
            self.change()


@pytest.mark.parametrize("how", ["deleted", "rewritten"])
def test_a_source_changed_during_the_run_fails_it_and_writes_nothing(tmp_path, monkeypatch, capsys, how):
    from pipeline import cli as cli_module

    monkeypatch.chdir(tmp_path)
    climate_array(shape=(40, 4, 6), chunks={"time": 10}).to_dataset().to_zarr("src.zarr")
    chunks = sorted(p for p in Path("src.zarr/tas").rglob("*") if p.is_file() and p.name != "zarr.json")
    assert len(chunks) == 4

    def change():
        for chunk in chunks[1:]:
            if how == "deleted":
                chunk.unlink()
            else:  # the same bytes written again, a second later
                st = chunk.stat()
                chunk.write_bytes(chunk.read_bytes())
                os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    write_flow(tmp_path / "f.yaml", [{"op": "climatology"}])
    (tmp_path / "f.yaml").write_text((tmp_path / "f.yaml").read_text().replace("data/demo.zarr", "src.zarr"))
    with _AfterFirstTask(change) as changed:
        code = cli_module.main(["run", "f.yaml", "--report", "r.json", "--no-progress"])
    assert changed.done
    assert code == cli_module.EXIT_INPUT
    err = capsys.readouterr().err
    assert "f.yaml: source.path: src.zarr: changed during the run (files rewritten, added or removed: 12 files" in err
    assert "nothing was written: run again once the source no longer changes" in err and "Traceback" not in err
    assert not Path("out/t.zarr").exists() and not [p for p in Path("out").iterdir() if "partial" in p.name]
    rep = json.loads(Path("r.json").read_text())
    assert rep["status"] == "failed" and rep["exit_status"] == 2 and "changed during the run" in rep["error"]
