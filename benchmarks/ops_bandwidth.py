"""How fast each op runs over data already in memory on its backend, against the copy bandwidth.

For every op two figures, each the median of ``--repeat`` timed runs after one warm-up:

- ``kernel``: the op's chunk kernel on one block holding the whole array (no dask), timed with
  CUDA events on the GPU; bytes moved are the input read plus the output written (a kernel that
  reads its input twice, as detrend's, is still counted once); on the GPU, rows named
  ``<name>_previous`` time the kernels that the current ones replaced, for comparison (they are
  in ``kernels_previous.py``, beside this file). Each
  kernel is timed twice: one call alone (its host-side preparation, during which the GPU waits,
  included), and ``IN_A_ROW`` calls issued back to back (time per call), where each call's
  preparation overlaps the kernel before it, as the tasks of a pipeline do;
- ``op``: the whole op through dask on chunks persisted on the backend (threads scheduler), the
  result persisted too, GB/s counted over the op's input.

The device copy bandwidth is measured in the same run (bytes read + written). Run on a GPU as

    python benchmarks/ops_bandwidth.py --backend gpu --shape 730,721,1440 --json bw.json

and anywhere, small, as ``--backend cpu --shape 40,9,16`` (what the test suite does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pipeline  # noqa: E402
from pipeline import backend as B  # noqa: E402
from pipeline.sources import cf as cf_decoding  # noqa: E402


def timer(backend):
    if backend == "gpu":
        import cupy

        def run(fn, calls=1):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.Device().synchronize()
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            cupy.cuda.Device().synchronize()
            return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / calls

    else:

        def run(fn, calls=1):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t) / calls

    return run


IN_A_ROW = 5  # kernel calls issued back to back, for the second timing of each kernel


def median_time(run, fn, repeat, calls=1):
    run(fn)  # warm-up: compilation, memory pool
    return statistics.median(run(fn, calls) for _ in range(repeat))


def synthetic(shape, backend, seed=0):
    xp = B.module(backend)
    nt, ny, nx = shape
    rng = xp.random.default_rng(seed) if backend == "cpu" else xp.random.RandomState(seed)
    data = rng.standard_normal(shape, dtype=xp.float32) * 3 + 285
    data[:, : max(1, ny // 10), : max(1, nx // 10)] = xp.nan  # a masked region
    time_ = pd.date_range("2000-01-01", periods=nt, freq="D")
    lat = np.linspace(90, -90, ny)
    return xr.DataArray(
        data, dims=("time", "lat", "lon"), name="tas", attrs={"units": "K"},
        coords={"time": time_, "lat": ("lat", lat, {"units": "degrees_north"}), "lon": np.linspace(0, 360, nx, endpoint=False)},
    )


OPS = [
    ("standardized_anomaly", {}),
    ("weighted_mean", {}),
    ("rolling_mean", {"window": 30}),
    ("climatology", {"freq": "month"}),
    ("anomaly", {"freq": "month"}),
    ("resample_mean", {"freq": "MS"}),
    ("count_above", {"threshold": 290.0, "freq": "YS"}),
    ("max_spell_length", {"threshold": 290.0, "freq": "YS"}),
    ("coarsen_mean", {"factors": {"lat": 4, "lon": 4}}),
    ("detrend", {"deg": 1}),
    ("quantile", {"q": 0.9}),
    ("saturation_vapor_pressure", {}),
]


def kernel_cases(x, backend):
    """(name, function, bytes moved) for the chunk kernels, on the whole array as one block."""
    from pipeline import kernels
    from pipeline.kernels import coarsen, elementwise, fields, groups, rolling, trend

    xp = B.module(backend)
    data = x.data
    nt = data.shape[0]
    npts = data[0].size
    f32 = np.dtype(np.float32)
    x2 = data.reshape(nt, npts)
    labels = np.asarray(x.time.dt.month.values - 1, dtype=np.int64)
    years = np.asarray(x.time.dt.year.values - x.time.dt.year.values[0], dtype=np.int64)  # sorted, as resampling's bins
    nyears = int(years.max()) + 1
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the masked region: all-NaN columns
        mean = xp.nanmean(data.astype(xp.float64), axis=0, keepdims=True)
        std = xp.nanstd(data.astype(xp.float64), axis=0, keepdims=True)
    w = xp.broadcast_to(xp.cos(xp.deg2rad(xp.asarray(x.lat.values)))[None, :, None], data.shape)
    packed = (xp.nan_to_num(data - 285) * 100).astype(xp.int16)
    values = xp.zeros((12, npts))
    side = "gpu" if backend == "gpu" else "cpu"
    cf = getattr(elementwise, f"cf_decode_{side}")
    cf_plan = cf_decoding.plan("packed", np.int16, {"_FillValue": np.int16(-32767), "scale_factor": np.float32(0.01), "add_offset": np.float32(0.0)})
    std_k = getattr(elementwise, f"standardize_{side}")
    roll = getattr(rolling, f"rolling_mean_{side}")
    sub = getattr(groups, f"subtract_groups_{side}")
    group_sum = getattr(groups, f"group_sum_{side}")
    group_spells = getattr(groups, f"group_spells_{side}")
    n, small = data.nbytes, npts * 8
    svp = getattr(fields, f"saturation_vapor_pressure_{side}")
    u = xp.linspace(-1.0, 1.0, nt)[:, None, None]
    trimmed = data[:, : data.shape[1] // 4 * 4, : data.shape[2] // 4 * 4]  # as the op trims it: a view
    coarse = getattr(coarsen, f"coarsen_mean_{side}")
    detrend = getattr(trend, f"detrend_block_{side}")
    cases = []
    if backend == "gpu":  # the same formula as a plain cupy.ElementwiseKernel, for comparison
        cases.append(("standardize, ElementwiseKernel", lambda: elementwise._gpu_kernel("standardize")(data, mean, std, xp.empty_like(data)), 2 * n))
    cases += [
        ("cf_decode (int16 -> float32)", lambda: cf(packed, cf_plan), packed.nbytes + n),
        ("standardize", lambda: std_k(data, mean, std, f32), 2 * n),
        ("moments (time)", lambda: kernels.get("moments", side)(data, (0,)), n + 3 * small),
        ("weighted sums (lat, lon)", lambda: kernels.get("weighted_sums", side)(data, w, (1, 2)), n + 16 * nt),
        ("rolling mean (30 steps)", lambda: roll(data, 0, 29, 0, 30, f32), 2 * n),
        ("group sums (12 months)", lambda: group_sum(x2, labels, 12), n + 24 * small),
        ("group spells (12 months)", lambda: group_spells(x2, labels, 12, 290.0), n + 15 * npts * 4),
        ("group spells (years, sorted)", lambda: group_spells(x2, years, nyears, 290.0), n + (nyears + 3) * npts * 4),
        ("subtract groups (anomaly)", lambda: sub(x2, labels, values, f32), 2 * n),
        ("saturation vapour pressure", lambda: svp(data, 0.0, "sonntag90", f32), 2 * n),
        ("coarsen mean (4 x 4, lat and lon)", lambda: coarse(trimmed, {1: 4, 2: 4}, f32), trimmed.nbytes + trimmed.nbytes // 16),
        # input read once and output written once, as the other rows; the kernel reads twice
        ("detrend (deg 1, whole axis)", lambda: detrend(data, u, axis=0, deg=1, out_dtype=f32), 2 * n),
    ]
    if backend == "gpu":  # the kernels these replace, for comparison: <name>_previous
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import kernels_previous as prev

        from pipeline.kernels import moments

        cases += [  # the weights taken as the weighted_sums kernel takes them, for the same work around the kernel
            ("weighted sums_previous", lambda: prev.weighted_sums_gpu_previous(x2, w[0].reshape(-1)), n + 16 * nt),
            ("rolling mean_previous", lambda: prev.rolling_mean_gpu_previous(data, 0, 29, 0, 30, f32), 2 * n),
            ("group sums_previous", lambda: prev.group_sum_previous_gpu(x2, labels, 12), n + 24 * small),
            ("group spells_previous", lambda: prev.group_spells_previous_gpu(x2, labels, 12, 290.0), n + 15 * npts * 4),
            ("group spells_previous (years)", lambda: prev.group_spells_previous_gpu(x2, years, nyears, 290.0), n + (nyears + 3) * npts * 4),
            ("detrend_previous (formulas)", lambda: trend.detrend_block_cpu(data, u, axis=0, deg=1, out_dtype=f32), 2 * n),
            ("detrend_previous (Numba, reads twice)", lambda: prev.detrend_numba_gpu(data, u, axis=0, deg=1, out_dtype=f32), 2 * n),
            ("coarsen mean_previous (formulas)", lambda: coarsen.coarsen_mean_formulas(trimmed, {1: 4, 2: 4}, f32), trimmed.nbytes + trimmed.nbytes // 16),
            ("moments_previous (Numba)", lambda: prev.moments_gpu_previous(data, 0), n + 3 * small),
        ]
        # the other shapes of the one-read kernels, for choosing their defaults: [threads x points a thread]
        # for moments, [points a tile, blocks a tile] for detrend
        u1 = xp.linspace(-1.0, 1.0, nt)
        out2 = xp.empty(x2.shape, dtype=f32)
        for threads, unroll in ((256, 2), (128, 8), (256, 4)):
            cases.append((f"moments [{threads} x {unroll}]", lambda t=threads, k=unroll: moments.moments_raw(x2, threads=t, unroll=k), n + 3 * small))
        for points, cluster in ((32, 1), (16, 1), (32, 2), (32, 3), (32, 5), (64, 3)):
            if trend.slab(nt, cluster) * points * 4 <= 200 * 1024:
                cases.append((f"detrend [{points} points, {cluster} blocks]",
                              lambda p=points, c=cluster: trend.detrend_tile(x2, u1, out2, 1, points=p, cluster=c), 2 * n))
    return cases


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto")
    p.add_argument("--shape", default="730,721,1440")
    p.add_argument("--chunk-time", type=int, default=73)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--ops", default=",".join(name for name, _ in OPS))
    p.add_argument("--json")
    args = p.parse_args(argv)
    backend = B.resolve(args.backend)
    shape = tuple(int(s) for s in args.shape.split(","))
    run = timer(backend)
    x = synthetic(shape, backend)
    xp = B.module(backend)

    buf = xp.empty_like(x.data)
    copy_s = median_time(run, lambda: xp.copyto(buf, x.data), args.repeat)
    copy_bw = 2 * x.data.nbytes / copy_s / 1e9
    del buf
    results = {"backend": backend, "shape": shape, "bytes": int(x.data.nbytes), "copy_GBps": round(copy_bw, 1), "kernels": [], "ops": []}
    print(f"backend {backend}, input {shape} float32 = {x.data.nbytes / 1e9:.2f} GB, copy {copy_bw:.1f} GB/s (read + write)")

    print(f"\n{'kernel (one block, no dask)':32s} {'ms':>9s} {'GB/s in':>9s} {'GB/s r+w':>9s} {'% copy':>7s} "
          f"{'ms, ' + str(IN_A_ROW) + ' in a row':>14s} {'% copy':>7s}")
    for name, fn, moved in kernel_cases(x, backend):
        s = median_time(run, fn, args.repeat)
        s_row = median_time(run, fn, args.repeat, IN_A_ROW)
        row = {"kernel": name, "seconds": s, "GBps_input": x.data.nbytes / s / 1e9, "GBps_moved": moved / s / 1e9,
               "seconds_in_a_row": s_row}
        row["fraction_of_copy"] = row["GBps_moved"] / copy_bw
        row["fraction_of_copy_in_a_row"] = moved / s_row / 1e9 / copy_bw
        results["kernels"].append(row)
        print(f"{name:32s} {s * 1e3:9.2f} {row['GBps_input']:9.1f} {row['GBps_moved']:9.1f} {100 * row['fraction_of_copy']:6.0f}% "
              f"{s_row * 1e3:14.2f} {100 * row['fraction_of_copy_in_a_row']:6.0f}%")

    import dask

    chunked = x.chunk({"time": args.chunk_time})
    chunked = chunked.copy(data=chunked.data.persist(scheduler="threads"))
    print(f"\n{'op (dask, chunks of ' + str(args.chunk_time) + ' steps)':32s} {'ms':>9s} {'GB/s in':>9s} {'% copy':>7s}")
    wanted = args.ops.split(",")
    for name, params in OPS:
        if name not in wanted:
            continue
        op = getattr(pipeline.ops, name)

        def once():
            out = op(chunked, **params)
            kept = out.data.persist(scheduler="threads")
            del kept

        with dask.config.set(scheduler="threads"):
            s = median_time(run, once, args.repeat)
        row = {"op": name, "params": params, "seconds": s, "GBps_input": x.data.nbytes / s / 1e9}
        row["fraction_of_copy"] = row["GBps_input"] / copy_bw
        results["ops"].append(row)
        print(f"{name:32s} {s * 1e3:9.2f} {row['GBps_input']:9.1f} {100 * row['fraction_of_copy']:6.0f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
