"""Out of core against in core: the same flow over the stores users have, as fresh ``pipeline run``
processes, without a memory budget and under one a fraction of the input.

The stores are ``user_stores.py``'s (Zarr v3 as xarray writes it, Zarr v2 Blosc, NetCDF4 zlib),
made once under ``--workdir``. For each store, budget and repeat, one process runs the flow
(``--flow``, the standardized anomaly's global mean by default) with
``pipeline.<backend>.memory-limit`` at ``input / --fraction`` (4: a quarter of the input), or
without a limit; the runs alternate. The table gives the medians of the whole process and of the
run's own seconds (its report's ``wall_seconds``), the ratio of the two budgets, the threads and
blocks of the memory plan, the device pool's peak, and whether every run of a budget wrote the
same output (its report's digest; in core and out of core differ in the last bits, their blocks
and so their sums' order differ).

    python benchmarks/out_of_core.py --shape 1460,721,1440 --workdir /tmp/us --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))


def run_once(flow: Path, store: str, backend: str, limit: int | None, workdir: Path, tag: str) -> dict:
    """One fresh ``pipeline run`` process: its whole seconds and its report."""
    env = {**os.environ}
    key = f"DASK_PIPELINE__{backend.upper()}__MEMORY_LIMIT"
    env.pop(key, None)
    if limit is not None:
        env[key] = str(limit)
    report, out = workdir / f"{tag}.json", workdir / f"{tag}.zarr"
    cmd = [sys.executable, "-m", "pipeline", "run", str(flow), "--input", store, "--output", str(out), "--backend", backend,
           "--report", str(report), "--no-progress"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rep = json.loads(report.read_text())
    plan = rep["memory"]["plan"]
    return {
        "process_seconds": seconds, "run_seconds": rep["wall_seconds"], "threads": plan["threads"], "block_bytes": plan["block_bytes"],
        "out_of_core": plan["out_of_core"], "pool_peak_bytes": rep["memory"].get("gpu_pool_peak_bytes"),
        "digests": rep["sink"]["digests"], "input_bytes": plan["input_bytes"],
    }


def main(argv=None) -> dict:
    import user_stores

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1460,721,1440")
    p.add_argument("--workdir", default="data/bench")
    p.add_argument("--stores", default="v3-default,v2-blosc,zlib")
    p.add_argument("--flow", default=str(REPO / "flows" / "climate_anomaly.yaml"))
    p.add_argument("--backend", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--fraction", type=float, default=4.0, help="the budget is the input's bytes over this")
    p.add_argument("--budget", help="the budget in bytes (\"400MB\") instead of a fraction of the input: on the CPU the "
                   "process itself counts against it")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args(argv)
    stores = user_stores.main(["--shape", a.shape, "--workdir", a.workdir, "--only", a.stores])
    runs = Path(tempfile.mkdtemp(prefix="ooc-", dir=a.workdir))
    shape = [int(s) for s in a.shape.split(",")]
    if a.budget:
        from dask.utils import parse_bytes

        budget = parse_bytes(a.budget)
    else:
        budget = int(4 * shape[0] * shape[1] * shape[2] / a.fraction)  # tas is float32
    rows = []
    for name, store in stores.items():
        got: dict = {"none": [], "budget": []}
        for i in range(a.repeat):
            for label, limit in (("none", None), ("budget", budget)):
                got[label].append(run_once(Path(a.flow), store, a.backend, limit, runs, f"{name}-{label}-{i}"))
        row = {"store": name, "budget_bytes": budget}
        for label, rs in got.items():
            row[label] = {
                "process_seconds": statistics.median(r["process_seconds"] for r in rs),
                "run_seconds": statistics.median(r["run_seconds"] for r in rs),
                "threads": rs[0]["threads"], "block_bytes": rs[0]["block_bytes"], "out_of_core": rs[0]["out_of_core"],
                "pool_peak_bytes": max((r["pool_peak_bytes"] or 0) for r in rs),
                "same_output": all(r["digests"] == rs[0]["digests"] for r in rs),
                "runs": rs,
            }
        row["ratio_run"] = row["budget"]["run_seconds"] / row["none"]["run_seconds"]
        row["ratio_process"] = row["budget"]["process_seconds"] / row["none"]["process_seconds"]
        rows.append(row)
    print(f"{a.flow}: {a.backend}, budget {budget / 1e9:.2f} GB{'' if a.budget else f' (input / {a.fraction:g})'}, "
          f"medians of {a.repeat}")
    print(f"{'store':12s} {'no budget: process / run':>26s} {'budget: process / run':>24s} {'ratio (run)':>12s} "
          f"{'threads x block':>18s} {'pool peak':>10s} {'same output':>12s}")
    for r in rows:
        n, b = r["none"], r["budget"]
        print(f"{r['store']:12s} {n['process_seconds']:11.2f} / {n['run_seconds']:6.2f} s {b['process_seconds']:11.2f} / "
              f"{b['run_seconds']:6.2f} s {r['ratio_run']:11.2f}x {b['threads']:>6d} x {b['block_bytes'] / 2**20:6.0f} MiB "
              f"{b['pool_peak_bytes'] / 1e9:8.2f} GB {str(n['same_output'] and b['same_output']):>12s}")
    out = {"flow": a.flow, "backend": a.backend, "shape": shape, "fraction": a.fraction, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
