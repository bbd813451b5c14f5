"""`pipeline bench`: every shipped flow on a small demo store, beside its plain xarray + dask peer."""

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

from pipeline import bench, cli, ops
from pipeline.demo import write_demo
from pipeline.flows import load_flow, with_source

from .conftest import HAS_GPU

REPO = Path(__file__).resolve().parent.parent
FLOWS = sorted((REPO / "flows").glob("*.yaml"))
FLOWS = [f for f in FLOWS if "variables:" not in f.read_text().split("steps:")[0]]  # climate flows: one variable

# the peers' xarray warns on a grid point whose values are all missing
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A demo store of 438 daily steps (two calendar years) on a 10 degree grid, in chunks of 73."""
    path = tmp_path_factory.mktemp("data") / "demo.zarr"
    write_demo(path, "3MB", resolution=10.0)
    return path


def flow_file(tmp_path: Path, steps: list[dict], sink: dict) -> Path:
    """A flow whose source and sink lie under ``tmp_path`` (neither is expected to be written)."""
    flow = {"name": "probe", "source": {"path": str(tmp_path / "never.zarr"), "variable": "tas"},
            "steps": steps, "sink": {"path": str(tmp_path / "sink.zarr"), **sink}}
    path = tmp_path / "flow.yaml"
    path.write_text(yaml.safe_dump(flow))
    return path


def test_every_op_has_an_xarray_peer():
    assert set(bench.PEERS) == {op.name for op in ops.all_ops() if not op.dataset}  # Dataset ops: sgkit's fixtures


@pytest.mark.parametrize("flow", FLOWS, ids=lambda p: p.stem)
def test_shipped_flows_agree_with_their_xarray_peer(flow, store):
    result = bench.run(flow, input=store, repeat=1, fresh_process=False)
    assert result.ok, result.table()
    cpu, gpu, peer = result.row("pipeline-cpu"), result.row("pipeline-gpu"), result.row("xarray+dask")
    for row in (cpu, peer):
        assert row.first_seconds > 0 and row.warm_seconds > 0 and row.process_seconds is None
    assert cpu.in_process.agrees and cpu.in_process.nan_masks_equal and cpu.in_process.rel_error < 1e-5
    if HAS_GPU:
        assert gpu.in_process.agrees
    else:
        assert gpu.skipped == "no GPU"
        assert "pipeline-gpu  no GPU" in result.table()


@pytest.mark.parametrize("variables", [["coarse"], ["monthly", "cut"], ["esat"]], ids="+".join)
def test_every_peer_agrees_with_its_op(tmp_path, store, variables):
    """The ops that no shipped flow uses, each against its peer through a flow of its own steps
    (a flow writes results on one grid: those of each grid in turn)."""
    steps = [
        {"op": "rolling_mean", "name": "smooth", "params": {"window": 5, "center": True}},
        {"op": "coarsen_mean", "name": "coarse", "params": {"factors": {"time": 7, "lat": 2}}},
        {"op": "resample_mean", "name": "monthly", "input": "source", "params": {"freq": "MS"}},
        {"op": "saturation_vapor_pressure", "name": "esat", "input": "source"},
        {"op": "max_spell_length", "name": "cut", "input": "source",
         "params": {"threshold": 290.0, "freq": "MS", "resample_before_rl": True}},
    ]
    flow = flow_file(tmp_path, steps, {"variables": variables})
    result = bench.run(flow, input=store, backends=("cpu",), repeat=1, fresh_process=False)
    assert result.ok, result.table()
    assert [r.peer for r in result.rows] == ["pipeline-cpu", "xarray+dask"]
    assert "resample({dim: freq}).mean()" in result.script and "xclim" in result.script


def wrong_quantile(x, q, dim="time"):
    """x.quantile(q, dim), one percent too high."""
    return x.chunk({dim: -1}).quantile(q, dim) * 1.01


def test_a_disagreeing_result_exits_1(monkeypatch, store, capsys):
    monkeypatch.setitem(bench.PEERS, "quantile", wrong_quantile)
    flow = REPO / "flows" / "detrended_quantiles.yaml"
    assert cli.main(["bench", str(flow), "--input", str(store), "--repeat", "1", "--no-fresh"]) == cli.EXIT_FAILURE
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pipeline-cpu"))
    assert "NO: rel. error 9.9e-03" in line  # 1 - 1/1.01


def test_an_op_without_a_peer_says_so(monkeypatch, store):
    monkeypatch.delitem(bench.PEERS, "quantile")
    result = bench.run(REPO / "flows" / "detrended_quantiles.yaml", input=store, repeat=1, fresh_process=False)
    table = result.table()
    assert "xarray+dask   no xarray peer for op quantile" in table
    assert "not checked: no xarray peer for op quantile" in table
    assert result.script is None and result.ok
    assert result.row("pipeline-cpu").warm_seconds > 0


def test_a_missing_input_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "missing.zarr"
    assert cli.main(["bench", str(FLOWS[0]), "--input", str(missing)]) == cli.EXIT_INPUT
    assert f"source {missing} (given for source.path): no such file or directory" in capsys.readouterr().err


def test_agreement_is_relative_l2_with_equal_nan_masks():
    ref = xr.DataArray(np.array([[3.0, 4.0], [np.nan, 0.0]]), dims=("y", "x"))
    off = ref.copy(data=ref.values + [[1e-3, 0.0], [0.0, 0.0]])
    a = bench.agreement({"v": off}, {"v": ref}, rtol=1e-5)
    assert a.rel_error == pytest.approx(1e-3 / 5.0) and a.nan_masks_equal and not a.agrees
    assert bench.agreement({"v": ref.T}, {"v": ref}, rtol=1e-5).agrees  # the peer's dimensions reordered
    holes = ref.copy(data=np.where(ref.values == 0.0, np.nan, ref.values))
    assert not bench.agreement({"v": holes}, {"v": ref}, rtol=1e-5).nan_masks_equal
    assert "variables" in bench.agreement({"w": ref}, {"v": ref}, rtol=1e-5).problem


def test_the_cli_in_fresh_processes_prints_the_table_and_leaves_nothing(tmp_path, store):
    """Fresh processes of pipeline and of the peer script; nothing is written beside the store or
    the flow's sink, and the temporary directory is removed."""
    steps = [{"op": "climatology", "params": {"freq": "month"}}]
    flow = flow_file(tmp_path, steps, {"name": "clim"})
    before = sorted(p.name for p in store.parent.iterdir())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "bench", str(flow), "--input", str(store), "--repeat", "1",
         "--json", str(tmp_path / "bench.json")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stderr
    assert r.stdout.startswith(f"pipeline bench: flow probe ({flow}) on {store}")
    cpu = next(ln for ln in r.stdout.splitlines() if ln.startswith("pipeline-cpu"))
    assert cpu.count("s ") >= 3 and cpu.count("x ") == 3 and "yes (rel. error" in cpu and " / " in cpu
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {row["peer"]: row for row in report["rows"]}
    assert report["ok"] and rows["pipeline-cpu"]["process"]["agrees"]
    if HAS_GPU:
        assert rows["pipeline-gpu"]["process"]["agrees"] and rows["pipeline-gpu"]["in_process"]["agrees"]
    else:
        assert "pipeline-gpu  no GPU" in r.stdout
    assert rows["pipeline-cpu"]["process_seconds"] > 0 and rows["xarray+dask"]["process_seconds"] > 0
    assert "groupby(f\"{dim}.{freq}\").mean(dim)" in report["script"]
    assert sorted(p.name for p in store.parent.iterdir()) == before
    assert not (tmp_path / "sink.zarr").exists() and not (tmp_path / "never.zarr").exists()
    assert list(scratch.iterdir()) == []


def test_the_distributed_peer_script_computes_inside_a_client(store):
    """--peer-scheduler distributed: the script computes inside a distributed Client of its own
    (a LocalCluster; run for real only on machines with cores to spare)."""
    flow = with_source(load_flow(FLOWS[0]), store)
    script = bench.peer_script(flow, "distributed")
    compile(script, "xarray_peer.py", "exec")
    assert "    from dask.distributed import Client\n\n    with Client():" in script
    assert "with Client" not in bench.peer_script(flow, "threads")
