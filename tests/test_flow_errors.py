"""Bad flows and bad paths, as a user meets them: the CLI in a subprocess exits 2 with a few lines
that name the file, the key or the line and what was expected, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"


def cli(*args, cwd, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"},
    )


def assert_refused(r, *expected):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 6, r.stderr


def written(tmp_path: Path, *keep: str) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in keep)


def test_duplicate_keys_are_refused_naming_the_key_and_both_lines(tmp_path):
    flow = tmp_path / "dup.yaml"
    text = FLOW.read_text().replace("sink:\n", "sink:\n  path: out/first.zarr\n", 1)
    flow.write_text(text)
    lines = text.splitlines()
    first = lines.index("  path: out/first.zarr") + 1
    second = lines.index("  path: out/climate_anomaly.zarr") + 1
    for command in ("validate", "run"):
        r = cli(command, flow, cwd=tmp_path)
        assert_refused(r, "dup.yaml", "'path' appears twice", f"lines {first} and {second}")
    assert written(tmp_path, "dup.yaml") == []
    # the same key twice on one line, in a flow mapping
    flow.write_text(FLOW.read_text().replace("dim: time", "{dim: time, dim: lat}").replace("params:\n      {", "params: {"))
    assert_refused(cli("validate", flow, cwd=tmp_path), "'dim' appears twice")


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    """Ten lines of nested aliases would expand to 9**9 items: refused before any expansion."""
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        rows.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(rows) + "\n")
    t = time.perf_counter()
    r = cli("validate", bomb, cwd=tmp_path)
    elapsed = time.perf_counter() - t
    assert_refused(r, "bomb.yaml: line 2: alias *a", "anchors and aliases")
    # the interpreter's start and imports take most of it; the refusal itself is immediate
    assert elapsed < 15, elapsed
    from pipeline.flows import FlowError, load_flow

    t = time.perf_counter()
    with pytest.raises(FlowError, match="alias"):
        load_flow(bomb)
    assert time.perf_counter() - t < 0.5


def test_python_tags_never_run(tmp_path):
    """``!!python/object/apply`` would run a command creating a file: refused, and nothing ran."""
    marker = tmp_path / "ran"
    flow = tmp_path / "evil.yaml"
    flow.write_text(
        FLOW.read_text().replace("name: climate_anomaly", f"name: !!python/object/apply:os.system ['touch {marker}']")
    )
    for command in ("validate", "run"):
        assert_refused(cli(command, flow, cwd=tmp_path), "evil.yaml: line", "python/object/apply:os.system", "not allowed")
    flow.write_text(FLOW.read_text().replace("variable: tas", f"variable: !!python/name:os.system"))
    assert_refused(cli("validate", flow, cwd=tmp_path), "python/name:os.system", "not allowed")
    assert not marker.exists()
    assert written(tmp_path, "evil.yaml") == []


def test_a_folder_as_flow_or_report_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "flows.d").mkdir()
    for command in ("validate", "run"):
        assert_refused(cli(command, "flows.d", cwd=tmp_path), "flows.d: is a folder; expected a flow file")
    (tmp_path / "reports").mkdir()
    r = cli("run", FLOW, "--report", "reports", cwd=tmp_path)
    assert_refused(r, "--report reports: is a folder")
    (tmp_path / "afile").write_text("")
    r = cli("run", FLOW, "--report", "afile/sub/report.json", cwd=tmp_path)
    assert_refused(r, "--report afile/sub/report.json", "afile is a file, not a folder")
    # refused before the demo source or any output was written
    assert written(tmp_path, "flows.d", "reports", "afile") == []
    assert list((tmp_path / "reports").iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_an_unwritable_report_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert_refused(cli("run", FLOW, "--report", locked / "r.json", cwd=tmp_path), "cannot be written")
    finally:
        locked.chmod(0o700)
    assert written(tmp_path, "locked") == []


def _flow(tmp_path: Path, name: str, mutate) -> Path:
    flow = yaml.safe_load(FLOW.read_text())
    mutate(flow)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(flow))
    return path


def test_validate_takes_several_flows_and_reports_each(tmp_path):
    good = sorted((REPO / "flows").glob("*.yaml"))
    bad = _flow(tmp_path, "bad.yaml", lambda f: f["steps"][0].__setitem__("op", "nope"))
    r = cli("validate", *good, bad, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    for f in good:
        assert f"{f}: valid flow" in r.stdout
        assert "does not exist yet (a demo is generated when the flow runs): data checks skipped" in r.stdout
    assert "bad.yaml: steps[0].op: unknown op 'nope'" in r.stderr
    r = cli("validate", *good, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.count("valid flow") == len(good), r.stderr
    assert written(tmp_path, "bad.yaml") == []  # no demo source was generated


@pytest.fixture
def demo(tmp_path):
    from pipeline.demo import write_demo

    write_demo(tmp_path / "data" / "demo.zarr", "1MB", seed=2)
    return tmp_path


@pytest.mark.parametrize(
    "name,mutate,message",
    [
        ("var.yaml", lambda f: f["source"].__setitem__("variable", "pr"), "source.variable: data/demo.zarr: no variable 'pr'"),
        ("dim.yaml", lambda f: f["steps"][0]["params"].__setitem__("dim", "day"), "steps[0] (standardized_anomaly):"),
        ("nodemo.yaml", lambda f: (f["source"].pop("demo"), f["source"].__setitem__("path", "data/none.zarr")),
         "source.path: data/none.zarr: no such file or directory"),
    ],
)
def test_validate_checks_the_data_where_it_exists(demo, name, mutate, message):
    flow = _flow(demo, name, mutate)
    r = cli("validate", flow, cwd=demo)
    assert_refused(r, name, message)
    assert sorted(p.name for p in demo.iterdir()) == sorted(["data", name])  # nothing was written


def test_validate_reports_a_window_longer_than_the_series(demo):
    import xarray as xr

    from pipeline import ops
    from pipeline.errors import InputError

    n = xr.open_zarr(demo / "data" / "demo.zarr").sizes["time"]
    try:  # the op refuses it while building the graph
        ops.rolling_mean(xr.open_zarr(demo / "data" / "demo.zarr")["tas"], dim="time", window=n + 1)
    except InputError:
        pass
    else:
        pytest.skip("rolling_mean accepts a window longer than the series at graph-building time")
    flow = _flow(demo, "long.yaml", lambda f: f["steps"].__setitem__(1, {"op": "rolling_mean", "params": {"window": n + 1}}))
    assert_refused(cli("validate", flow, cwd=demo), "long.yaml: steps[1] (rolling_mean)")
    r = cli("validate", FLOW, cwd=demo)
    assert r.returncode == 0 and f"checked against data/demo.zarr: tas (time: {n}, " in r.stdout, r.stderr
