"""pipeline's CPU backend against the best hand-written dask, in one process each.

The store is what ``xarray.Dataset.to_zarr`` writes with its defaults (Zarr v3, zarr's default
zstd): float32 ``tas`` (time, lat, lon) with ``time``, ``lat`` and ``lon`` coordinates, one chunk
of ``--time-chunk`` steps by the whole grid. It is generated once under ``--workdir`` and reused.

Sides, each run in a fresh child process (so that the first run pays for what a user's first run
pays: zarr's codecs, Numba's compilation, dask's thread pool):

- ``dask``: the hand-written peer, ``a = da.from_zarr(store, component="tas")``,
  ``z = (a - a.mean(0)) / a.std(0)``, then the cos(lat)-weighted mean over (lat, lon), computed
  on dask's threaded scheduler;
- ``pipeline``: ``pipeline.open_dataset(store, backend="cpu")`` then ``pipeline.ops``
  ``standardized_anomaly`` and ``weighted_mean``, computed as ``pipeline run`` computes them: the
  memory plan (:func:`pipeline.exec.memory.plan`, refused if over budget) and
  :func:`pipeline.exec.compute.compute` with the plan's threads.

With ``--flows`` also ``monthly_anomaly`` and ``rolling`` (benchmarks/peers.py's xarray forms over
``da.from_zarr`` for the peer). Each side times its first run (graph building included) and then
``--repeat`` warm runs; results are checked against the peer (relative L2 error under ``--rtol``).

Here, small:   python benchmarks/cpu_peer.py --shape 146,90,180
Real shape:    python benchmarks/cpu_peer.py --shape 1460,721,1440 --workdir /tmp/cpu_peer
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FLOWS = ("standardized_anomaly", "monthly_anomaly", "rolling")


# --- the store, as xarray writes it -------------------------------------------------------------


def _field(block_info=None, *, lat, seed):
    """One block of a smooth temperature field with noise, seeded by the block's place."""
    (t0, t1), (y0, y1), (x0, x1) = block_info[None]["array-location"]
    rng = np.random.default_rng([seed, t0, y0, x0])
    days = np.arange(t0, t1, dtype=np.float64)[:, None, None]
    la = np.deg2rad(lat[y0:y1])[None, :, None]
    lo = np.linspace(0, 2 * np.pi, x1 - x0, endpoint=False)[None, None, :]
    base = 300.0 - 45.0 * np.sin(la) ** 2 + 12.0 * np.cos(la) * np.cos(2 * np.pi * days / 365.25) + 2 * np.sin(lo)
    return (base + rng.normal(0.0, 1.5, (t1 - t0, y1 - y0, x1 - x0))).astype(np.float32)


def ensure_store(workdir: Path, shape: tuple[int, int, int], time_chunk: int, seed: int = 0) -> Path:
    """The store of ``shape`` under ``workdir``, written by ``to_zarr`` with its defaults."""
    import dask.array as da
    import pandas as pd
    import xarray as xr

    nt, ny, nx = shape
    path = workdir / f"tas_{nt}x{ny}x{nx}_t{time_chunk}.zarr"
    if (path / "zarr.json").exists():
        return path
    lat = np.linspace(90.0, -90.0, ny)
    data = da.map_blocks(_field, lat=lat, seed=seed, chunks=((time_chunk,) * (nt // time_chunk) + ((nt % time_chunk,) if nt % time_chunk else ()), (ny,), (nx,)),
                         dtype=np.float32)
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), data, {"units": "K", "standard_name": "air_temperature"})},
        coords={"time": pd.date_range("1990-01-01", periods=nt, freq="D"),
                "lat": ("lat", lat, {"units": "degrees_north", "standard_name": "latitude"}),
                "lon": ("lon", np.arange(nx) * 360.0 / nx, {"units": "degrees_east", "standard_name": "longitude"})},
    )
    workdir.mkdir(parents=True, exist_ok=True)
    ds.to_zarr(path)
    return path


# --- the two sides --------------------------------------------------------------------------------


def peer_flow(flow: str, store: Path):
    """The hand-written peer's graph of ``flow``: dask arrays over ``da.from_zarr``."""
    import dask.array as da
    import zarr

    a = da.from_zarr(str(store), component="tas")
    if flow == "standardized_anomaly":
        lat = zarr.open_array(str(store), path="lat", mode="r")[:]
        w = np.cos(np.deg2rad(lat.astype(np.float64)))[None, :, None]
        z = (a - a.mean(axis=0)) / a.std(axis=0)
        return ((z * w).sum(axis=(1, 2)) / (w.sum() * a.shape[2]),)
    import xarray as xr

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peers import XARRAY_FLOWS

    ref = xr.open_zarr(store)["tas"]  # coordinates only
    x = xr.DataArray(a, coords=ref.coords, dims=ref.dims, name="tas")
    return tuple(o.data for o in XARRAY_FLOWS[flow](x))


def pipeline_flow(flow: str, store: Path):
    """pipeline's graph of ``flow`` on the CPU backend, as a flow builds it: the source array
    (for the memory plan) and the results."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pipeline
    from peers import PIPELINE_FLOWS

    x = pipeline.open_dataset(store, backend="cpu", variables=["tas"])["tas"]
    return x.data, tuple(o.data for o in PIPELINE_FLOWS[flow](x))


def run_side(side: str, flow: str, store: Path, repeat: int) -> dict:
    """Time one side in this process: its first run (graph building included), then warm runs."""
    import dask

    out: dict = {"side": side, "flow": flow}
    times = []
    for i in range(1 + repeat):
        t0 = time.perf_counter()
        if side == "dask":
            results = dask.compute(*peer_flow(flow, store), scheduler="threads")
        else:
            from pipeline.exec import memory
            from pipeline.exec.compute import compute

            source, arrays = pipeline_flow(flow, store)
            p = memory.plan(source, *arrays, backend="cpu")
            memory.check(p)
            results = compute(list(arrays), threads=p.threads)
            if i == 0:
                out["plan_threads"] = p.threads
                out["tasks"] = sum(len(a.__dask_graph__()) for a in arrays)
        times.append(time.perf_counter() - t0)
        if i == 0:
            out["first_s"] = round(times[0], 4)
            out["results"] = [np.asarray(r, dtype=np.float64).tolist() for r in results]
    if side == "dask":
        out["tasks"] = sum(len(a.__dask_graph__()) for a in peer_flow(flow, store))
    out["warm_s"] = [round(t, 4) for t in times[1:]]
    out["warm_best_s"] = round(min(times[1:]), 4) if repeat else None
    return out


def agreement(out: list, ref: list) -> float:
    """The largest relative L2 error (float64, over values not NaN in either) of ``out`` against ``ref``."""
    worst = 0.0
    for a, b in zip(out, ref):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        ok = ~(np.isnan(a) | np.isnan(b))
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            return float("inf")
        worst = max(worst, float(np.linalg.norm(a[ok] - b[ok]) / max(np.linalg.norm(b[ok]), 1e-300)))
    return worst


def child(side: str, flow: str, store: Path, repeat: int, threads: int | None) -> dict:
    """``run_side`` in a fresh process (the first run as a user's)."""
    cmd = [sys.executable, __file__, "--child", side, "--flow", flow, "--store", str(store), "--repeat", str(repeat)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if threads:
        env["DASK_NUM_WORKERS"] = str(threads)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{side} {flow} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="146,90,180", help="time,lat,lon (real: 1460,721,1440)")
    p.add_argument("--time-chunk", type=int, default=73)
    p.add_argument("--workdir", default="/tmp/cpu_peer")
    p.add_argument("--repeat", type=int, default=3, help="warm runs after the first")
    p.add_argument("--flows", default="standardized_anomaly", help=f"comma-separated, of {', '.join(FLOWS)}")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=None, help="DASK_NUM_WORKERS for both sides (default: the cores)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--flow", default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_side(args.child, args.flow, Path(args.store), args.repeat)))
        return 0
    shape = tuple(int(n) for n in args.shape.split(","))
    store = ensure_store(Path(args.workdir), shape, args.time_chunk)
    rows, failed = [], False
    for flow in args.flows.split(","):
        peer = child("dask", flow, store, args.repeat, args.threads)
        ours = child("pipeline", flow, store, args.repeat, args.threads)
        err = agreement(ours.pop("results"), peer.pop("results"))
        ratio_first = ours["first_s"] / peer["first_s"]
        ratio_warm = (ours["warm_best_s"] / peer["warm_best_s"]) if args.repeat else None
        row = {"flow": flow, "shape": list(shape), "time_chunk": args.time_chunk, "cores": os.cpu_count(),
               "dask": peer, "pipeline": ours, "ratio_first": round(ratio_first, 3),
               "ratio_warm": None if ratio_warm is None else round(ratio_warm, 3), "rel_err": err, "agree": err <= args.rtol}
        failed |= not row["agree"]
        rows.append(row)
        print(f"{flow:22s} dask first {peer['first_s']:7.3f} s warm {peer['warm_best_s'] or float('nan'):7.3f} s "
              f"({peer['tasks']} tasks) | pipeline first {ours['first_s']:7.3f} s warm {ours['warm_best_s'] or float('nan'):7.3f} s "
              f"({ours['tasks']} tasks, {ours['plan_threads']} threads) | x{ratio_first:.2f} first, "
              f"x{ratio_warm or float('nan'):.2f} warm | rel err {err:.1e}", flush=True)
    print(json.dumps(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
