"""An analyst's own xarray expressions on pipeline's GPU arrays against xarray + dask on the CPU.

The store is what ``xarray.Dataset.to_zarr`` writes with its defaults (Zarr v3, zarr's default
zstd): float32 ``tas`` (time, lat, lon), daily, chunks of ``--time-chunk`` steps by the whole grid,
made once under ``--workdir``. The expressions are those of tests/xarray_expressions.py (the
table the tests run), ``--only`` choosing some.

For each expression, in one process:

- the libraries both sides use (dask.array, zarr, CuPy) are imported before any clock, so that
  neither side's first run pays the other's imports (``--processes`` times whole processes);
- ``gpu first``: ``pipeline.open_dataset(store, backend="gpu")``, the expression, ``.compute()``
  (the result stays on the device; synchronized before the clock is read) — the first time in the
  process this expression runs, so CuPy's compilations of its kernels are in it;
- ``gpu warm``: the median of ``--repeat`` more runs;
- ``cpu warm``: ``xarray.open_zarr(store)`` (dask's threads, one per core; flox where installed),
  the expression, ``.compute()``, the median of ``--repeat`` runs after one unmeasured;
- the results are compared (relative L2 error, NaN where both are NaN).

Here, small:  python benchmarks/xarray_gpu.py --shape 365,45,90 --only groupby_month_mean,quantile
GPU machine:  python benchmarks/xarray_gpu.py --shape 1460,721,1440 --workdir /tmp/xgpu
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

HERE = Path(__file__).resolve().parent
DEFAULT = (
    "groupby_month_mean,groupby_season_std,groupby_month_quantile,groupby_anomaly,resample_YS_max,"
    "resample_MS_mean,resample_MS_median,rolling_mean_center,coarsen_mean,weighted_mean,quantile,polyfit,"
    "idxmax_lat,ffill,cumsum,count_above,where_mean,std"
)


def table():
    spec = importlib.util.spec_from_file_location("xarray_expressions", HERE.parent / "tests" / "xarray_expressions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_store(path: Path, shape, time_chunk: int) -> None:
    if (path / "zarr.json").exists():
        return
    import dask.array as da

    nt, ny, nx = shape
    rng = da.random.default_rng(0)
    tas = (285 + 8 * rng.standard_normal((nt, ny, nx), chunks=(time_chunk, ny, nx))).astype("float32")
    tas = da.where(rng.random((nt, ny, nx), chunks=(time_chunk, ny, nx)) < 0.01, np.nan, tas)
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), tas, {"units": "K"})},
        coords={
            "time": pd.date_range("2001-01-01", periods=nt, freq="D"),
            "lat": np.linspace(-90, 90, ny),
            "lon": np.linspace(0, 360, nx, endpoint=False),
        },
    )
    ds.to_zarr(path, mode="w-")


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


def _compile_seconds() -> float:
    """Seconds this process spent compiling kernels (CuPy's, through pipeline's wrapper of its
    compiler, and pipeline's own) or loading them from the disk caches: how much of a first run
    a later process finds compiled."""
    from pipeline.kernels.launch import compile_seconds

    return compile_seconds()


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _error(got, ref) -> float:
    a, b = _host(got.data), np.asarray(ref.values)
    if b.dtype.kind not in "fc":
        return float(np.mean(a != b))
    both = np.isnan(a) & np.isnan(b)
    a, b = np.where(both, 0, a).astype(np.float64), np.where(both, 0, b).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def one(store: Path, name: str, backend: str) -> None:
    """``name`` on ``backend`` in this process: what a user's script does (import, open, compute)."""
    expr, _ = table().EXPRESSIONS[name]
    warnings.simplefilter("ignore")
    if backend == "gpu":
        import pipeline

        x = pipeline.open_dataset(store, backend="gpu")["tas"]
        expr(x, table().context(x)).compute()
        _sync()
    else:
        x = xr.open_zarr(store)["tas"]
        expr(x, table().context(x)).compute()


def processes_row(store: Path, shape: str, name: str) -> dict:
    import subprocess

    row = {"expression": name}
    for backend in ("gpu", "cpu"):
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--shape", shape, "--workdir", str(store.parent), "--one", name,
                        backend], check=True)
        row[f"{backend}_process"] = time.perf_counter() - t
    return row


def _write_stacks(path: str, sampler, seconds: float) -> None:
    """The sampled stacks of a first run: a timeline per thread (the innermost frames of interest)
    and the innermost frames counted, to see where the seconds before the first block go."""
    import collections

    inner = collections.Counter(chain[0] for chain, n in sampler.chains.items() for _ in range(n))
    Path(path).write_text(json.dumps({"seconds": seconds, "inner": inner.most_common(80),
                                      "threads": sampler.threads.most_common(), "timeline": sampler.timeline,
                                      "chains": [[n, list(c)] for c, n in sampler.chains.most_common(300)]}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1460,721,1440")
    p.add_argument("--time-chunk", type=int, default=73)
    p.add_argument("--workdir", default="/tmp/xarray_gpu")
    p.add_argument("--only", default=DEFAULT)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--processes", default="", help="expressions also timed as whole fresh processes, GPU and CPU")
    p.add_argument("--prepare-only", action="store_true", help="make the store, time nothing")
    p.add_argument("--gpu-only", default="", help="expressions run on the GPU alone (the CPU's takes minutes)")
    p.add_argument("--stacks", default=None,
                   help="sample every thread's stack during the first expression's first GPU run, into this JSON")
    p.add_argument("--one", nargs=2, metavar=("EXPRESSION", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    store = Path(args.workdir) / f"tas-{'x'.join(map(str, shape))}.zarr"
    if args.one:
        one(store, *args.one)
        return 0
    store.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    make_store(store, shape, args.time_chunk)
    print(f"store {store} ({sum(f.stat().st_size for f in store.rglob('*') if f.is_file()) / 1e9:.2f} GB on disk, "
          f"{np.prod(shape) * 4 / 1e9:.2f} GB of float32) ready in {time.perf_counter() - t:.1f} s", flush=True)
    if args.prepare_only:
        return 0

    import pipeline

    # the libraries both sides use, imported before any clock: in one process the first side to
    # open a store would otherwise pay them for both (dask.array, zarr and CuPy took 1.5 s of the
    # GPU's first run on the GPU machine); the whole-process rows (--processes) count imports
    import dask.array  # noqa: F401
    import zarr  # noqa: F401

    if importlib.util.find_spec("cupy") is not None:
        import cupy  # noqa: F401

    expressions = table()
    warnings.simplefilter("ignore")
    rows = []
    sampler = None
    if args.stacks:
        sys.path.insert(0, str(HERE))
        from first_run_stacks import Sampler

        sampler = Sampler(0.02)
    for name in args.only.split(","):
        expr, options = expressions.EXPRESSIONS[name]
        row = {"expression": name}
        # xarray on NumPy needs these for the expression (numbagg for rolling_exp): without them
        # the CPU side is not timed, as the tests skip their reference
        missing = [m for m in options.get("needs", ()) if importlib.util.find_spec(m) is None]
        try:
            compiled = _compile_seconds()
            if sampler is not None and not sampler.is_alive() and not sampler.stopped.is_set():
                sampler.start()
            t = time.perf_counter()
            x = pipeline.open_dataset(store, backend="gpu")["tas"]
            row["gpu_first_open"] = time.perf_counter() - t
            got = expr(x, expressions.context(x)).compute()
            _sync()
            row["gpu_first"] = time.perf_counter() - t
            if sampler is not None and not sampler.stopped.is_set():
                sampler.stopped.set()
                sampler.join()
                _write_stacks(args.stacks, sampler, row["gpu_first"])
            row["gpu_first_compiling"] = _compile_seconds() - compiled
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                x = pipeline.open_dataset(store, backend="gpu")["tas"]
                got = expr(x, expressions.context(x)).compute()
                _sync()
                times.append(time.perf_counter() - t)
            row["gpu_warm"] = statistics.median(times)
            row["on_device"] = type(got.data).__module__.split(".")[0]
        except Exception as e:  # noqa: BLE001 - a row says what failed
            row["gpu_error"] = f"{type(e).__name__}: {str(e)[:120]}"
            got = None
        if missing:
            row["cpu_skipped"] = f"needs {', '.join(missing)}"
        if name in args.gpu_only.split(",") or missing:
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        times = []
        for i in range(args.repeat + 1):
            t = time.perf_counter()
            c = xr.open_zarr(store)["tas"]
            ref = expr(c, expressions.context(c)).compute()
            times.append(time.perf_counter() - t)
        row["cpu_first"], row["cpu_warm"] = times[0], statistics.median(times[1:])
        if got is not None:
            row["rel_error"] = _error(got, ref)
            row["speedup_warm"] = row["cpu_warm"] / row["gpu_warm"]
            row["speedup_first"] = row["cpu_first"] / row["gpu_first"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    print("\n| expression | GPU first (s) | of it compiling | GPU warm (s) | CPU first (s) | CPU warm (s) | warm x "
          "| first x | rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    def cell(r, key, fmt):
        return format(r[key], fmt) if key in r else ""

    for r in rows:
        gpu = r.get("gpu_error") or cell(r, "gpu_first", ".2f")
        print(f"| {r['expression']} | {gpu} | {cell(r, 'gpu_first_compiling', '.2f')} | {cell(r, 'gpu_warm', '.3f')} "
              f"| {cell(r, 'cpu_first', '.2f')} | {cell(r, 'cpu_warm', '.2f')} | {cell(r, 'speedup_warm', '.1f')} "
              f"| {cell(r, 'speedup_first', '.1f')} | {cell(r, 'rel_error', '.1e')} |")
    processes = [processes_row(store, args.shape, name) for name in filter(None, args.processes.split(","))]
    if processes:
        print("\nWhole processes (python, import, open, compute, exit), after the runs above: CuPy's kernels are "
              "in its disk cache\n\n| expression | GPU process (s) | CPU process (s) | x |\n| --- | --- | --- | --- |")
        for r in processes:
            print(f"| {r['expression']} | {r['gpu_process']:.2f} | {r['cpu_process']:.2f} | "
                  f"{r['cpu_process'] / r['gpu_process']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": shape, "cores": os.cpu_count(), "rows": rows,
                                               "processes": processes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
