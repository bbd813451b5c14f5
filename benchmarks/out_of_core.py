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

``--cold`` adds, for each store, the disk's rate and a run on cold data: the store's files are
written back and dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs
no privilege; what stays resident, by ``mincore``, is printed), then read by as many threads as
cores (the disk's rate, the ceiling), dropped again, and run without a budget. The cold run's rate
is the stored bytes over its run's seconds, and its share of the disk's rate is printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))


def run_once(flow: Path, store: str, backend: str, limit: int | None, workdir: Path, tag: str, args: tuple = (),
             env: dict | None = None) -> dict:
    """One fresh ``pipeline run`` process (``args`` added to its command line, ``env`` to its
    environment): its whole seconds and its report."""
    env = {**os.environ, **(env or {})}
    key = f"DASK_PIPELINE__{backend.upper()}__MEMORY_LIMIT"
    env.pop(key, None)
    if limit is not None:
        env[key] = str(limit)
    report, out = workdir / f"{tag}.json", workdir / f"{tag}.zarr"
    cmd = [sys.executable, "-m", "pipeline", "run", str(flow), "--input", store, "--output", str(out), "--backend", backend,
           "--report", str(report), "--no-progress", *args]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rep = json.loads(report.read_text())
    plan = rep["memory"].get("plan") or {}  # none on a cluster: each worker plans its own
    return {
        "process_seconds": seconds, "run_seconds": rep["wall_seconds"], "threads": plan.get("threads"),
        "block_bytes": plan.get("block_bytes"), "out_of_core": plan.get("out_of_core"),
        "pool_peak_bytes": rep["memory"].get("gpu_pool_peak_bytes"), "digests": rep["sink"]["digests"],
        "input_bytes": plan.get("input_bytes", rep["bytes_read"]), "bytes_read": rep["bytes_read"],
        "startup": rep["startup"], "cluster": rep["cluster"],
    }


def _files(path: str) -> list[Path]:
    p = Path(path)
    return [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())


def evict(path: str) -> None:
    """Write ``path``'s files back and drop them from the page cache."""
    for f in _files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # a page still dirty is not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(path: str) -> float:
    """The share of ``path``'s pages in the page cache (``mincore`` over a mapping of each file)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page, total, resident = mmap.PAGESIZE, 0, 0
    for f in _files(path):
        size = f.stat().st_size
        if not size:
            continue
        n = (size + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {f} failed")
            try:
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore of {f} failed")
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        resident += sum(b & 1 for b in vec)
        total += n
    return resident / total if total else 0.0


def disk_rate(path: str, threads: int | None = None, block: int = 16 << 20) -> tuple[int, float]:
    """Bytes of ``path``'s files and the seconds to read them all, by ``threads`` threads."""
    files = _files(path)

    def read(f: Path) -> int:
        n = 0
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(block):
                n += len(chunk)
        return n

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads or os.cpu_count()) as pool:
        n = sum(pool.map(read, files))
    return n, time.perf_counter() - t


def cold_run(flow: Path, store: str, backend: str, workdir: Path, tag: str, digests) -> dict:
    """The disk's rate over ``store`` and a run without a budget on it cold: each after its files
    were dropped from the page cache."""
    evict(store)
    before_read = resident_fraction(store)
    stored, seconds = disk_rate(store)
    evict(store)
    before_run = resident_fraction(store)
    r = run_once(flow, store, backend, None, workdir, f"{tag}-cold")
    return {"stored_bytes": stored, "disk_seconds": seconds, "disk_rate": stored / seconds,
            "resident_after_drop": max(before_read, before_run), "run_seconds": r["run_seconds"],
            "process_seconds": r["process_seconds"], "run_rate": stored / r["run_seconds"],
            "share": seconds / r["run_seconds"], "same_output": r["digests"] == digests}


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
    p.add_argument("--cold", action="store_true", help="also the disk's rate and a run on cold data, per store")
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
        if a.cold:
            row["cold"] = cold_run(Path(a.flow), store, a.backend, runs, name, got["none"][0]["digests"])
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
    if a.cold:
        print(f"{'store':12s} {'stored':>9s} {'disk (threads)':>16s} {'cold run':>9s} {'cold run rate':>14s} {'of disk':>8s} "
              f"{'resident after drop':>20s} {'same output':>12s}")
        for r in rows:
            c = r["cold"]
            print(f"{r['store']:12s} {c['stored_bytes'] / 1e9:7.2f} GB {c['disk_rate'] / 1e9:11.2f} GB/s {c['run_seconds']:7.2f} s "
                  f"{c['run_rate'] / 1e9:9.2f} GB/s {c['share']:7.0%} {c['resident_after_drop']:19.1%} {str(c['same_output']):>12s}")
    out = {"flow": a.flow, "backend": a.backend, "shape": shape, "fraction": a.fraction, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
