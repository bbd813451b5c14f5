"""The seconds before any genomics work: opening a VCF Zarr store, phase by phase.

For a store (and a sample table: ``--samples-table``, by default ``samples.tsv`` beside the store,
as ``benchmarks/plink2.py`` writes it), each of ``--repeat`` fresh processes times:

- ``import``: ``import pipeline.genomics`` and :mod:`pipeline.sources.samples`;
- ``open``: ``sg.load_dataset(store, backend=...)``;
- ``table``: :func:`pipeline.sources.samples.read_table` and ``attach``;
- ``graph``: ``sg.count_variant_alleles(ds)`` built, not computed;
- with ``--compute``, ``compute``: its counts computed (``pipeline.compute``), the first run;

then the same phases but the import again in that process (``warm``: the modules they import are
imported, only their own work is left). The table gives the median of each phase over the
processes, the interpreter's exit after the last phase (``exit``), the median wall time of a
whole process (``whole``: the interpreter's start and exit included, the warm phases left out),
and the libraries each phase imported first (of those that cost most: zarr, dask.array, scipy,
distributed, cupy...).

    python benchmarks/genomics_open.py /tmp/plink2-bench/data.vcz --backend gpu --repeat 5

Measured on 2 cores (CPU backend), bio2zarr's ``plink2zarr`` stores made by ``plink2.py
--prepare-only`` (variants x samples, the table beside them), medians of 5 processes:

    store            import   open  table  graph  whole   warm: open  table  graph
    200,000 x 2,000    0.58   0.25   0.18  0.010   1.36         0.016  0.017  0.004  (before)
                       0.59   0.25   0.04  0.004   1.19         0.015  0.010  0.003
    10,000 x 25,000    0.58   0.24   0.32  0.009   1.50         0.017  0.142  0.004  (before)
                       0.56   0.25   0.11  0.005   1.23         0.017  0.064  0.004

Before, the table's phase imported distributed (dask's compute of the sample IDs looks for a
client first) and read its cells one by one, twice. What is left is imports: ``import`` is
xarray (with pandas and pyarrow), dask, pydantic and pipeline's ops; the open (0.015 s warm) is
dask.array (0.15 s, of which 0.085 s is scipy.sparse and scipy.fftpack, imported by dask.array's
chunk types and fft) and zarr (0.065 s). With ``--compute``, the first computation imports numba
(0.13 s, and 0.11 s more for cffi's C parser, which numba imports where cffi is installed).

Then the exit, with ``--compute`` (the same host, shared, so the imports vary by 0.05-0.1 s from
run to run; 10,000 x 10,000 and 20,000 x 2,000 stores):

    store            import   open  table  compute  exit   whole
    10,000 x 10,000    0.56   0.31   0.04     0.62  0.60    2.19  (before)
                       0.52   0.29   0.04     0.63  0.05    1.62
    20,000 x 2,000     0.48   0.31   0.02     0.49  0.34    1.68  (before)
                       0.55   0.29   0.02     0.51  0.05    1.53

As a process ends, Python's last garbage collections walk every object still alive, 200,000
after these imports (dask, xarray, zarr, numba): 0.3-0.6 s. ``pipeline.genomics`` freezes them
at exit (``gc.freeze``, as the ``pipeline`` command does at its end), and they are freed unwalked.
Holding the collector off during the imports instead saved nothing: the collections it skipped
came back in the open.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("import", "open", "table", "graph", "compute")
# the libraries whose first import costs a phase most (a tenth of a second or more each)
WATCHED = ("xarray", "pyarrow", "dask.array", "zarr", "scipy", "distributed", "sklearn", "numba", "cffi", "cupy")


def _table_path(store: Path, table: str | None) -> Path | None:
    if table:
        return Path(table)
    beside = store.parent / "samples.tsv"
    return beside if beside.exists() else None


def one(store: str, backend: str, table: str | None, compute: bool = False) -> dict:
    """The phases in this process: first (each phase importing what it needs), then warm."""
    seconds, imported = {}, {}

    def timed(phase, fn):
        before = set(sys.modules)
        t = time.perf_counter()
        out = fn()
        seconds[phase] = time.perf_counter() - t
        imported[phase] = [m for m in WATCHED if m in sys.modules and m not in before]
        return out

    def modules():
        import pipeline.genomics as sg
        from pipeline.sources import samples

        return sg, samples

    sg, samples = timed("import", modules)
    path = _table_path(Path(store), table)

    def phases(prefix=""):
        ds = timed(f"{prefix}open", lambda: sg.load_dataset(store, backend=backend))
        if path is not None:
            ds = timed(f"{prefix}table", lambda: samples.attach(ds, samples.read_table(path)))
        counts = timed(f"{prefix}graph", lambda: sg.count_variant_alleles(ds))["variant_allele_count"]
        if compute:
            import pipeline

            timed(f"{prefix}compute", lambda: pipeline.compute(counts.data))

    phases()
    phases("warm_")
    return {"seconds": seconds, "imported": imported, "ended": time.time()}


def run(store: str, backend: str, table: str | None, repeat: int, compute: bool = False) -> dict:
    """``repeat`` fresh processes of :func:`one`: the median of each phase, and of the whole process."""
    runs, walls, exits = [], [], []
    for _ in range(repeat):
        cmd = [sys.executable, __file__, store, "--one", "--backend", backend]
        if table:
            cmd += ["--samples-table", table]
        if compute:
            cmd.append("--compute")
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DASK_PIPELINE__BACKEND": backend})
        wall = time.perf_counter() - t
        ended = time.time()
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        exits.append(ended - runs[-1]["ended"])  # the interpreter's exit, after the last phase
        # the process as a user's, which opens once: its wall time less the warm phases
        walls.append(wall - sum(v for k, v in runs[-1]["seconds"].items() if k.startswith("warm_")))
    names = list(runs[0]["seconds"])
    return {
        "store": store, "backend": backend, "processes": repeat,
        "seconds": {n: statistics.median(r["seconds"][n] for r in runs) for n in names},
        "whole": statistics.median(walls),
        "exit": statistics.median(exits),
        "imported": runs[0]["imported"],
    }


def show(result: dict) -> str:
    s = result["seconds"]
    columns = [p for p in PHASES if p in s] + ["exit", "whole"] + [f"warm_{p}" for p in PHASES[1:] if f"warm_{p}" in s]
    values = {**s, "exit": result["exit"], "whole": result["whole"]}
    width = {c: max(7, len(c)) for c in columns}
    lines = [
        f"{result['store']} ({result['backend']}, median of {result['processes']} fresh processes)",
        "  ".join(f"{c:>{width[c]}}" for c in columns),
        "  ".join(f"{values[c]:{width[c]}.3f}" for c in columns),
    ]
    lines += [f"  {p} imported: {', '.join(m) or '-'}" for p, m in result["imported"].items() if not p.startswith("warm_")]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", help="a VCF Zarr store")
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--samples-table", help="a sample table (default: samples.tsv beside the store, if there)")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes")
    ap.add_argument("--compute", action="store_true", help="also time the first computation of the counts")
    ap.add_argument("--json", help="write the result here too")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one process's phases, as JSON
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.store, a.backend, a.samples_table, a.compute)))
        return {}
    result = run(a.store, a.backend, a.samples_table, a.repeat, a.compute)
    print(show(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
