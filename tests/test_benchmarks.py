"""The benchmarks run as tests, at a tiny size, so they cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "ops_bandwidth.py"


def test_ops_bandwidth_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("ops_bandwidth", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--backend", "cpu", "--shape", "40,9,16", "--chunk-time", "13", "--repeat", "1", "--json", str(tmp_path / "bw.json")])
    assert {r["op"] for r in out["ops"]} == {name for name, _ in bench.OPS}
    assert all(r["seconds"] > 0 for r in out["ops"] + out["kernels"])
    assert (tmp_path / "bw.json").exists()
