"""pipeline against its peers: the same flows, the same store, one machine, one run.

Peers, each timed over the same Zarr store of ``tas`` (float32, daily, chunks of whole grids):

- ``cpu-peer``: xarray + dask on NumPy over a ``distributed.LocalCluster`` (dask's default workers
  and threads), reading ``xr.open_zarr(store, chunks={})``: what an analyst writes without pipeline;
- ``naive-gpu-peer``: the same xarray code over a dask-cuda ``LocalCUDACluster`` (one worker per
  GPU), on ``da.from_zarr(store, component="tas").map_blocks(cupy.asarray)``; out of core it gets
  ``device_memory_limit=<budget>``;
- ``pipeline-cpu`` and ``pipeline-gpu``: ``pipeline.open_dataset(store, backend=...)`` and
  ``pipeline.ops``, computed as pipeline does by default (threads in this process, no cluster);
  out of core the GPU budget is set as ``pipeline.gpu.memory-limit``;
- ``pipeline-gpu-sharded``: pipeline on the GPU over a copy of the store in the layout that
  ``pipeline convert`` writes (shards of the same chunks, ~1 MB zstd frames inside), converted once,
  outside the timed region;
- ``pipeline-gpu-unlimited`` (out of core only): the sharded run again with no device budget, the
  run that the budgeted one is compared with;
- ``pipeline-gpu-raw`` (only when named in ``--peers``): pipeline on the GPU over an uncompressed
  copy (``pipeline convert --compression none``): a third more bytes to read, nothing to decode.

Flows, each ending in a small result: ``standardized_anomaly`` (z over time, then the cos(lat)
weighted global mean per step), ``monthly_anomaly`` (monthly climatology map and the weighted
global mean of the anomaly per step), ``rolling`` (centred 5-step rolling mean, whole windows
only, then the maximum over time per grid point).

Sizes: ``fit`` (default 1460 x 721 x 1440 = 6.1 GB, fits on one GPU) and ``ooc`` (default
4380 x 721 x 1440 = 18.2 GB, at least three times the device budget ``--device-budget``). Stores
are generated once with :mod:`pipeline.demo` under ``--workdir`` and reused while their shape and
chunks match.

Each peer gets one untimed warm-up per flow (cluster start, JIT compilation), then ``--repeat``
timed runs; the timed region is the compute of the whole result and its copy to host NumPy. The
page cache is never dropped: every run reads a warm store, so the store-read ceiling measured here
is the page cache's, not the disk's. Ceilings measured in the same run: reading all chunk files
with a thread pool, and on a GPU the pinned host -> device copy and the device copy bandwidth.
``floor_seconds`` is the slower of reading the compressed input at the store-read bandwidth and
(GPU peers) moving the uncompressed input over the bus from pinned memory. pipeline's GPU peers
over the converted store, with ``pipeline.gpu.pinned-files`` on, read no file in a warm run (the
files are pinned in the page cache by the warm-up): their floor is moving the converted store's
compressed bytes over the bus.

The xarray peers run the same code on NumPy and CuPy. xarray 2026.9 cannot compute
``x.weighted(w).mean()`` or ``x.rolling(...).mean()`` on Dask arrays of CuPy chunks (its ``where``
hands ``cupy.where`` a NumPy fill value), so both peers write them in equivalent forms that it can:
the weighted sums divided out, and the mean over a ``construct``-ed window.

Every result is checked against the first peer that ran (the cpu-peer when selected): relative
L2 error in float64 over non-NaN values below ``--rtol`` (1e-5) and identical NaN masks; a
disagreement or a failed run makes the exit code 1. On a GPU machine:

    python benchmarks/peers.py --json peers.json

and anywhere, tiny, on the CPU peers (what the test suite does):

    python benchmarks/peers.py --sizes fit --fit-shape 40,9,16 --repeat 1 --peers cpu-peer,pipeline-cpu \\
        --cpu-workers 1 --cpu-threads 2 --no-processes --workdir /tmp/bench
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.utils import format_bytes, parse_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pipeline  # noqa: E402
from pipeline import backend as B  # noqa: E402
from pipeline.exec import spill  # noqa: E402
from pipeline.exec.cluster import ClusterProfile, open_cluster  # noqa: E402
from pipeline.demo import BYTES_PER_POINT, demo_dataset  # noqa: E402
from pipeline.exec.compute import compute as pipeline_compute  # noqa: E402
from pipeline.gpu.pinned import pinned_files_limit  # noqa: E402

PEERS = ("cpu-peer", "naive-gpu-peer", "pipeline-cpu", "pipeline-gpu", "pipeline-gpu-sharded", "pipeline-gpu-unlimited")
OPTIONAL_PEERS = ("pipeline-gpu-raw",)  # run only when named in --peers
GPU_PEERS = ("naive-gpu-peer", "pipeline-gpu", "pipeline-gpu-sharded", "pipeline-gpu-unlimited", "pipeline-gpu-raw")
FLOWS = ("standardized_anomaly", "monthly_anomaly", "rolling")
SIZES = {"fit": "1460,721,1440", "ooc": "4380,721,1440"}
WINDOW = 5


# --- the flows, as an analyst writes them in xarray, and with pipeline's ops ----------------------


def coslat_mean(x: xr.DataArray) -> xr.DataArray:
    """x.weighted(cos(lat)).mean(("lat", "lon")), weights of missing values left out, written out
    (the weights live where the data live: CuPy data with NumPy weights would fail)."""
    w = np.cos(np.deg2rad(x["lat"].values.astype(np.float64)))
    w = xr.DataArray(B.xp_of(getattr(x.data, "_meta", x.data)).asarray(w), dims="lat")
    return (x * w).sum(("lat", "lon")) / (x.notnull() * w).sum(("lat", "lon"))


def xr_standardized_anomaly(x):
    return (coslat_mean((x - x.mean("time")) / x.std("time")),)


def xr_monthly_anomaly(x):
    clim = x.groupby("time.month").mean("time")
    return coslat_mean(x.groupby("time.month") - clim), clim


def xr_rolling(x):
    # x.rolling(time=WINDOW, center=True).mean() (min_periods: the whole window): a window with a
    # missing value, or past either end, gives NaN
    return (x.rolling(time=WINDOW, center=True).construct("window").mean("window", skipna=False).max("time"),)


def pl_standardized_anomaly(x):
    z = pipeline.ops.standardized_anomaly(x, dim="time")
    return (pipeline.ops.weighted_mean(z, dims=["lat", "lon"], weights="coslat"),)


def pl_monthly_anomaly(x):
    anom = pipeline.ops.anomaly(x, freq="month")
    return pipeline.ops.weighted_mean(anom, dims=["lat", "lon"], weights="coslat"), pipeline.ops.climatology(x, freq="month")


def pl_rolling(x):  # min_periods=None: the whole window, as xarray's default
    return (pipeline.ops.rolling_mean(x, window=WINDOW, dim="time", center=True).max("time"),)


XARRAY_FLOWS = {"standardized_anomaly": xr_standardized_anomaly, "monthly_anomaly": xr_monthly_anomaly, "rolling": xr_rolling}
PIPELINE_FLOWS = {"standardized_anomaly": pl_standardized_anomaly, "monthly_anomaly": pl_monthly_anomaly, "rolling": pl_rolling}


def dask_compute(outs):
    return dask.compute(*outs)  # on the cluster of the peer (the default client)


def to_host(a) -> np.ndarray:
    return B.module("gpu").asnumpy(a) if B.is_cupy(a) else np.asarray(a)


@contextlib.contextmanager
def peer_session(peer: str, store: Path, budget: int | None, args):
    """Yield (tas, flows, compute) of one peer over one store; a cluster started here is closed on exit."""
    if peer == "cpu-peer":
        profile = ClusterProfile(
            kind="local", n_workers=args.cpu_workers, threads_per_worker=args.cpu_threads, processes=not args.no_processes
        )
        with open_cluster(profile):
            yield xr.open_zarr(store, chunks={})["tas"], XARRAY_FLOWS, dask_compute
    elif peer == "naive-gpu-peer":
        import cupy

        profile = ClusterProfile(kind="local-cuda", threads_per_worker=args.gpu_threads, device_memory_limit=budget)
        # flox (which xclim installs) reduces groups with NumPy's engines, which CuPy blocks refuse:
        # a user of plain xarray on CuPy turns it off
        with open_cluster(profile), xr.set_options(use_flox=False):
            ref = xr.open_zarr(store)["tas"]  # coordinates and attributes only
            data = da.from_zarr(str(store), component="tas").map_blocks(cupy.asarray)
            yield xr.DataArray(data, coords=ref.coords, dims=ref.dims, name="tas", attrs=ref.attrs), XARRAY_FLOWS, dask_compute
    else:
        backend = "gpu" if peer.startswith("pipeline-gpu") else "cpu"
        sharded_layout = peer in ("pipeline-gpu-sharded", "pipeline-gpu-unlimited")
        if sharded_layout:  # the same data in the layout `pipeline convert` writes, once
            sharded = store.with_name(store.stem + "_sharded.zarr")
            if not sharded.exists():
                pipeline.convert(store, sharded)
            store = sharded
        elif peer == "pipeline-gpu-raw":
            raw = store.with_name(store.stem + "_raw.zarr")
            if not raw.exists():
                pipeline.convert(store, raw, compression="none")
            store = raw
        limited = budget and backend == "gpu" and peer != "pipeline-gpu-unlimited"
        settings = {"pipeline.gpu.memory-limit": budget} if limited else {}
        if sharded_layout:
            settings["pipeline.gpu.nvcomp"] = True  # the layout exists for nvCOMP
        with dask.config.set(settings):
            chunks = {"time": args.pipeline_time_chunk} if args.pipeline_time_chunk else None
            yield pipeline.open_dataset(store, backend=backend, chunks=chunks)["tas"], PIPELINE_FLOWS, pipeline_compute


# --- data and ceilings ----------------------------------------------------------------------------


def ensure_store(workdir: Path, shape: tuple[int, int, int], time_chunk: int, seed: int) -> tuple[Path, bool]:
    """The demo ``tas`` store of this shape and chunking under ``workdir``: reused, or generated."""
    nt, ny, nx = shape
    if ny < 2 or nx != 2 * (ny - 1):
        raise SystemExit(f"shape {shape}: the demo grid is regular, so lon must be 2 * (lat - 1) (e.g. 721,1440 or 9,16)")
    chunks = (min(time_chunk, nt), ny, nx)
    path = workdir / f"tas_{nt}x{ny}x{nx}_t{chunks[0]}.zarr"
    if path.exists():
        import zarr

        try:
            arr = zarr.open_group(str(path), mode="r")["tas"]
            if tuple(arr.shape) == shape and tuple(arr.chunks) == chunks:
                return path, False
        except Exception:  # not a store we can read: regenerate it
            pass
    # the demo sizes three variables of 10 bytes a point in all; this size gives exactly nt steps
    size = nt * ny * nx * BYTES_PER_POINT
    ds = demo_dataset(size, seed=seed, resolution=180 / (ny - 1), time_chunk=time_chunk)[["tas"]]
    assert ds["tas"].shape == shape, ds["tas"].shape
    pipeline.write_zarr(ds, path, mode="overwrite")
    return path, True


def chunk_files(store: Path) -> list[Path]:
    meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
    return [p for p in sorted((store / "tas").rglob("*")) if p.is_file() and p.name not in meta]


def _read_file(path: Path, bufsize: int = 1 << 24) -> int:
    buf, n = bytearray(bufsize), 0
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            n += k
    return n


def store_read(files: list[Path], nbytes: int, repeat: int) -> dict:
    """Bandwidth of reading every chunk file (warm page cache), 16 threads at most."""
    threads = min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool:
        compressed = sum(pool.map(_read_file, files))  # warm-up
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            list(pool.map(_read_file, files))
            times.append(time.perf_counter() - t)
    s = statistics.median(times)
    return {"threads": threads, "files": len(files), "seconds": s, "compressed_bytes": compressed,
            "GBps_compressed": compressed / s / 1e9, "GBps_uncompressed": nbytes / s / 1e9}


def gpu_ceilings(nbytes: int = 1 << 30, repeat: int = 5) -> dict:
    """Host -> device from pinned memory and the device copy (bytes read + written), CUDA events."""
    import cupy
    import cupyx

    src = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
    src[:] = 1
    dst, dst2 = cupy.empty(nbytes, np.uint8), cupy.empty(nbytes, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def median_seconds(fn):
        times = []
        for _ in range(repeat + 1):  # the first is a warm-up
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            fn()
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        return statistics.median(times[1:])

    h2d = median_seconds(lambda: dst.set(src, stream=stream))
    with stream:
        copy = median_seconds(lambda: cupy.copyto(dst2, dst))
    del src, dst, dst2
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return {"bytes": nbytes, "h2d_pinned_GBps": nbytes / h2d / 1e9, "device_copy_GBps": 2 * nbytes / copy / 1e9}


def reset_peak_rss() -> bool:
    """Reset the process's resident-set high-water mark (Linux); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def machine_info() -> dict:
    versions = {"pipeline": pipeline.__version__}  # installed as array-pipeline
    for name in ("numpy", "xarray", "dask", "distributed", "dask-cuda", "zarr", "numcodecs", "numba"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["cupy"] = None
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "gpus": B.gpu_count(), "gpu_name": None, "gpu_memory_bytes": None, "versions": versions}
    if B.gpu_available():
        cp = B.module("gpu")
        props = cp.cuda.runtime.getDeviceProperties(0)
        info.update(gpu_name=props["name"].decode(), gpu_memory_bytes=int(props["totalGlobalMem"]))
        versions["cupy"] = cp.__version__
    return info


# --- running and checking -------------------------------------------------------------------------


def agreement(out: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, bool]:
    """Worst relative L2 error over the outputs (float64, non-NaN values), and whether NaN masks match."""
    worst, masks_equal = 0.0, True
    for o, r in zip(out, ref, strict=True):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if o.shape != r.shape:
            return float("inf"), False
        masks_equal &= bool(np.array_equal(np.isnan(o), np.isnan(r)))
        valid = ~np.isnan(o) & ~np.isnan(r)
        diff, norm = np.linalg.norm(o[valid] - r[valid]), np.linalg.norm(r[valid])
        worst = max(worst, float(diff / norm) if norm else float(diff))
    return worst, masks_equal


def run_flow(build, compute, repeat: int, max_seconds: float | None = None) -> tuple[list[float], list[np.ndarray], bool, float]:
    """One warm-up, then ``repeat`` timed runs of compute + copy to host; the last results, whether
    the warm-up alone was timed (it took over ``max_seconds``: a slow peer gets one run), and the
    warm-up's seconds."""
    times, first = [], float("nan")
    for i in range(repeat + 1):
        outs = build()
        t = time.perf_counter()
        host = [to_host(r.data) for r in compute(outs)]
        elapsed = time.perf_counter() - t
        if i:
            times.append(elapsed)
        else:
            first = elapsed
            if max_seconds is not None and elapsed > max_seconds:
                return [elapsed], host, True, first
    return times, host, False, first


def run_peer(peer, size, store, budget, args, info, runs, references):
    """All flows of one peer over one store, appended to ``runs``."""
    gpu = peer in GPU_PEERS
    in_process = peer.startswith("pipeline-") or (peer == "cpu-peer" and args.no_processes)
    floor = info["store_read"]["seconds"]
    if gpu:
        floor = max(floor, info["input_bytes"] / (args.ceilings["h2d_pinned_GBps"] * 1e9))
    with contextlib.ExitStack() as stack:
        try:
            tas, flows, compute = stack.enter_context(peer_session(peer, store, budget, args))
        except Exception as e:  # the cluster or the input could not be set up: every flow fails
            runs.extend({"size": size, "flow": f, "peer": peer, "error": f"{type(e).__name__}: {e}"} for f in args.flows)
            print(f"  {peer}: could not start: {type(e).__name__}: {e}", flush=True)
            return
        if peer in ("pipeline-gpu-sharded", "pipeline-gpu-unlimited") and pinned_files_limit() > 0:
            sharded = store.with_name(store.stem + "_sharded.zarr") / "tas"
            compressed = sum(f.stat().st_size for f in sharded.rglob("*") if f.is_file() and f.name != "zarr.json")
            floor = compressed / (args.ceilings["h2d_pinned_GBps"] * 1e9)
        for flow in args.flows:
            row = {"size": size, "flow": flow, "peer": peer}
            runs.append(row)
            if peer.startswith("pipeline-gpu"):
                B.module("gpu").get_default_memory_pool().free_all_blocks()
                B.device_memory_peak(reset=True)
                spill.spilled_bytes(reset=True)
            rss_reset = in_process and reset_peak_rss()
            try:
                times, host, warm_up_only, warm_up_s = run_flow(lambda: flows[flow](tas), compute, args.repeat, args.max_seconds)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"  {size}/{flow}/{peer}: failed: {row['error']}", flush=True)
                continue
            med = statistics.median(times)
            row.update(seconds=med, seconds_all=times, warm_up_only=warm_up_only, warm_up_seconds=warm_up_s, GBps=info["input_bytes"] / med / 1e9,
                       floor_seconds=floor, fraction_of_floor=floor / med)
            if peer.startswith("pipeline-gpu"):
                row["gpu_pool_bytes"] = int(B.module("gpu").get_default_memory_pool().total_bytes())
                row["gpu_pool_peak_bytes"] = B.device_memory_peak()
                row["host_held_bytes_per_run"] = spill.spilled_bytes() // (1 if warm_up_only else len(times) + 1)  # runs and warm-up
            if in_process:
                row["host_peak_rss_bytes"] = peak_rss()
                row["host_peak_rss_scope"] = "this flow" if rss_reset else "process lifetime"
            ref_peer, ref = references.setdefault(flow, (peer, host))
            err, masks = agreement(host, ref)
            row.update(reference=ref_peer, rel_error=err, nan_masks_equal=masks, agrees=err < args.rtol and masks)
            print(f"  {size}/{flow}/{peer}: {med:.3f} s, {row['GBps']:.2f} GB/s"
                  + (f", GPU pool peak {format_bytes(row['gpu_pool_peak_bytes'])}" if "gpu_pool_peak_bytes" in row else "")
                  + (f", held in host memory {format_bytes(row['host_held_bytes_per_run'])} a run"
                     if row.get("host_held_bytes_per_run") else "")
                  + ("" if ref_peer == peer else f", vs {ref_peer}: rel error {err:.1e}, NaN masks {'equal' if masks else 'DIFFER'}"),
                  flush=True)


def add_speedups(runs: list[dict]) -> None:
    medians = {(r["size"], r["flow"], r["peer"]): r.get("seconds") for r in runs}
    for r in runs:
        for key, peer in (("x_cpu_peer", "cpu-peer"), ("x_naive_gpu", "naive-gpu-peer")):
            other = medians.get((r["size"], r["flow"], peer))
            r[key] = other / r["seconds"] if other and r.get("seconds") else None
        unlimited = medians.get((r["size"], r["flow"], "pipeline-gpu-unlimited"))
        if r["peer"] == "pipeline-gpu-sharded" and unlimited and r.get("seconds"):
            r["x_slower_than_unlimited"] = r["seconds"] / unlimited


def print_table(runs: list[dict]) -> None:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    head = f"{'size':5s} {'flow':21s} {'peer':20s} {'seconds':>9s} {'GB/s':>7s} {'x cpu':>7s} {'x naive':>8s} {'floor':>6s}  agrees"
    print("\n" + head + "\n" + "-" * len(head))
    for r in runs:
        agrees = "ERROR" if "error" in r else ("yes" if r["agrees"] else f"NO ({r['rel_error']:.1e})")
        star = "*" if r.get("warm_up_only") else " "
        print(f"{r['size']:5s} {r['flow']:21s} {r['peer']:20s} {num(r.get('seconds'), '8.3f')}{star} {num(r.get('GBps'), '7.2f')} "
              f"{num(r.get('x_cpu_peer'), '7.2f')} {num(r.get('x_naive_gpu'), '8.2f')} "
              f"{num(r.get('fraction_of_floor') and 100 * r['fraction_of_floor'], '5.0f')}%  {agrees}")
    if any(r.get("warm_up_only") for r in runs):
        print("* the warm-up alone, over --max-seconds")
    for r in runs:
        if r.get("x_slower_than_unlimited"):
            print(f"{r['size']}/{r['flow']}: under the device budget {r['x_slower_than_unlimited']:.2f}x the time with no limit")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="fit,ooc", help="fit and/or ooc (default both)")
    p.add_argument("--flows", default=",".join(FLOWS), help=f"subset of {','.join(FLOWS)}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS + OPTIONAL_PEERS)}")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per peer and flow, after one warm-up")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="a flow whose warm-up takes longer than this is timed by its warm-up alone (marked * in the table)")
    p.add_argument("--fit-shape", default=SIZES["fit"], help="time,lat,lon of the in-memory size")
    p.add_argument("--ooc-shape", default=SIZES["ooc"], help="time,lat,lon of the out-of-core size")
    p.add_argument("--time-chunk", type=int, default=73, help="time steps per stored chunk")
    p.add_argument("--device-budget", default="4GB", help="GPU memory budget of the out-of-core size")
    p.add_argument("--workdir", default="data/bench", help="where the stores are generated and reused")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-workers", type=int, default=None, help="cpu-peer workers (default: dask's)")
    p.add_argument("--cpu-threads", type=int, default=None, help="cpu-peer threads per worker (default: dask's)")
    p.add_argument("--no-processes", action="store_true", help="cpu-peer workers as threads of this process")
    p.add_argument("--gpu-threads", type=int, default=8, help="naive-gpu-peer threads per GPU worker")
    p.add_argument("--pipeline-time-chunk", type=int, default=0,
                   help="pipeline peers: Dask blocks of this many steps (a multiple of the store's chunks; 0: the store's)")
    p.add_argument("--rtol", type=float, default=1e-5, help="largest relative L2 error that counts as agreement")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    for name, allowed in (("sizes", tuple(SIZES)), ("flows", FLOWS), ("peers", PEERS + OPTIONAL_PEERS)):
        chosen = [s for s in getattr(args, name).split(",") if s]
        bad = [s for s in chosen if s not in allowed]
        if bad or not chosen:
            p.error(f"--{name}: unknown {bad or 'empty'}; choose from {','.join(allowed)}")
        setattr(args, name, [s for s in allowed if s in chosen])  # run in the canonical order
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    budget = parse_bytes(args.device_budget)
    peers = list(args.peers)
    skipped = []
    if not B.gpu_available():
        for peer in [p for p in peers if p in GPU_PEERS]:
            peers.remove(peer)
            skipped.append({"peer": peer, "reason": "no CUDA GPU visible to CuPy"})
            print(f"skipping {peer}: no CUDA GPU visible to CuPy")
    info = machine_info()
    args.ceilings = gpu_ceilings() if any(p in GPU_PEERS for p in peers) else None
    if args.ceilings:
        print(f"GPU {info['gpu_name']}: host -> device (pinned) {args.ceilings['h2d_pinned_GBps']:.1f} GB/s, "
              f"device copy {args.ceilings['device_copy_GBps']:.0f} GB/s (read + write)")
    result = {"machine": info, "ceilings": args.ceilings, "skipped": skipped, "sizes": {}, "runs": [],
              "config": {k: v for k, v in vars(args).items() if k not in ("ceilings", "json")}}
    for size in args.sizes:
        shape = tuple(int(s) for s in getattr(args, f"{size}_shape").split(","))
        store, generated = ensure_store(Path(args.workdir), shape, args.time_chunk, args.seed)
        files = chunk_files(store)
        nbytes = int(np.prod(shape)) * 4
        limit = budget if size == "ooc" else None
        if limit and nbytes < 3 * limit:
            print(f"note: the ooc input ({format_bytes(nbytes)}) is less than 3x the device budget ({format_bytes(limit)})")
        sinfo = {"shape": shape, "chunks": (min(args.time_chunk, shape[0]), *shape[1:]), "store": str(store),
                 "generated": generated, "input_bytes": nbytes, "device_memory_limit": limit}
        sinfo["store_read"] = store_read(files, nbytes, args.repeat)
        result["sizes"][size] = sinfo
        sr = sinfo["store_read"]
        print(f"\n{size}: tas {shape} float32 = {format_bytes(nbytes)}, stored {format_bytes(sr['compressed_bytes'])} "
              f"in {sr['files']} chunks ({'generated' if generated else 'reused'}: {store}); store read "
              f"{sr['GBps_compressed']:.2f} GB/s compressed = {sr['GBps_uncompressed']:.2f} GB/s uncompressed", flush=True)
        references = {}
        for peer in peers:
            if peer == "pipeline-gpu-unlimited" and not limit:
                continue  # the same run as pipeline-gpu-sharded
            run_peer(peer, size, store, limit, args, sinfo, result["runs"], references)
            write_json(args.json, result)  # what has run so far, should a later peer not finish
    add_speedups(result["runs"])
    print_table(result["runs"])
    failed = [r for r in result["runs"] if "error" in r or not r["agrees"]]
    result["ok"] = not failed
    for r in failed:
        why = r.get("error") or (f"rel error {r['rel_error']:.2e} (tolerance {args.rtol:.0e}), NaN masks "
                                 f"{'equal' if r['nan_masks_equal'] else 'differ'}, vs {r['reference']}")
        print(f"FAILED {r['size']}/{r['flow']}/{r['peer']}: {why}")
    write_json(args.json, result)
    return result


def write_json(path: str | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
