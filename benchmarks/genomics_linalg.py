"""PCA and pairwise distances of genotypes on the GPU and the CPU backends.

The data: alternate allele counts (int8, 0 to 2) of ``--variants`` x ``--samples``, chunked by
``--variant-chunk`` variants, made by a counter-based hash on the backend where they are used, so
that both backends see the same values; held in memory (``persist``) before anything is timed.
The samples fall in three populations whose allele frequencies differ a little, so that the two
leading components stand apart from the rest, as in real data; every variant varies.

Timed, each the median of ``--repeat`` runs after one warm-up (which compiles the kernels):

- ``pca`` with ``algorithm="tsqr"`` (the Gram matrix and its eigendecomposition) and
  ``"randomized"``, ``--components`` components, every output computed;
- ``pairwise_distance`` (euclidean and correlation) between the first ``--distance-samples``
  samples over all variants (its cost grows with the square of the samples), left on the device.

Each row gives the seconds, the int8 input read per second, and the nominal rate of the matrix
products (the Gram matrix's upper tiles: M N^2 multiply-adds; euclidean 3 and correlation 6 times
M N^2 / 2); on the GPU, the bytes CuPy's pool holds after the run. Where both backends run, their
results are compared: explained variances, the two leading projections (up to sign) and the
distances, each as the largest difference relative to the largest value.

    python benchmarks/genomics_linalg.py --variants 200000 --samples 25000 --backends gpu --json linalg_gpu.json
    python benchmarks/genomics_linalg.py --variants 20000 --samples 2000 --backends gpu,cpu --json linalg.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

POPULATIONS = 3
SLAB = 2048  # variants generated at a time: bounds the hash's uint64 temporaries


def _mix(x, xp):
    """murmur3's 64-bit finalizer: a well-mixed uint64 from a counter (wraps alike on NumPy and CuPy)."""
    x = x ^ (x >> xp.uint64(33))
    x = x * xp.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> xp.uint64(33))
    x = x * xp.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> xp.uint64(33))


def _unit(x, xp):
    """A uniform float64 in [0, 1) from the top 53 bits."""
    return (x >> xp.uint64(11)).astype(np.float64) * 2.0**-53


def counts_block(xp, v0: int, nv: int, n_samples: int, seed: int):
    """Counts of variants ``v0 .. v0 + nv`` (nv, n_samples), int8, on the array module ``xp``."""
    out = xp.empty((nv, n_samples), dtype=np.int8)
    s = xp.arange(n_samples, dtype=np.uint64)[None, :]
    pop = s % xp.uint64(POPULATIONS)
    key = xp.uint64(seed) * xp.uint64(0x9E3779B97F4A7C15)
    for a in range(0, nv, SLAB):
        v = xp.arange(v0 + a, v0 + min(a + SLAB, nv), dtype=np.uint64)[:, None]
        p = 0.05 + 0.9 * _unit(_mix(v * xp.uint64(7) + key, xp), xp)
        shift = 0.3 * _unit(_mix(v * xp.uint64(POPULATIONS) + pop + key + xp.uint64(1), xp), xp) - 0.15
        p = xp.clip(p + shift, 0.01, 0.99)
        h = _mix(v * xp.uint64(n_samples) + s + key + xp.uint64(2), xp)
        u1 = (h & xp.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0**-32
        u2 = (h >> xp.uint64(32)).astype(np.float64) * 2.0**-32
        block = (u1 < p).astype(np.int8) + (u2 < p).astype(np.int8)
        block[:, 0], block[:, 1] = 0, 1  # every variant varies
        out[a : a + block.shape[0]] = block
    return out


def make_counts(n_variants: int, n_samples: int, chunk: int, backend: str, seed: int):
    """The counts as a Dask array of ``backend``'s blocks, persisted."""
    import dask.array as da

    from pipeline import backend as B

    xp = B.module(backend)
    chunks = (tuple(min(chunk, n_variants - a) for a in range(0, n_variants, chunk)), (n_samples,))

    def block(block_info=None):
        (v0, v1), _ = block_info[None]["array-location"]
        return counts_block(xp, v0, v1 - v0, n_samples, seed)

    x = da.map_blocks(block, chunks=chunks, dtype=np.int8, meta=B.meta(backend, np.int8, 2))
    return x.persist()


def sync(backend: str) -> None:
    if backend == "gpu":
        import cupy

        cupy.cuda.Device().synchronize()


def pool_bytes(backend: str) -> int | None:
    if backend != "gpu":
        return None
    import cupy

    return int(cupy.get_default_memory_pool().total_bytes())


def timed(fn, repeat: int, backend: str):
    """(median seconds of ``repeat`` runs after a warm-up, the last result)."""
    result = fn()
    sync(backend)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        sync(backend)
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def run_backend(backend: str, args) -> tuple[list[dict], dict]:
    import dask
    import xarray as xr

    import pipeline.genomics as sg
    from pipeline import backend as B

    rows, results = [], {}
    with dask.config.set(scheduler="threads", num_workers=args.threads or (2 if backend == "gpu" else os.cpu_count())):
        t = time.perf_counter()
        x = make_counts(args.variants, args.samples, args.variant_chunk, backend, args.seed)
        sync(backend)
        made = time.perf_counter() - t
        m, n = x.shape
        ds = xr.Dataset({"call_alternate_allele_count": (("variants", "samples"), x)})
        for algorithm in args.algorithms:
            def pca():
                out = sg.pca(ds, n_components=args.components, ploidy=2, algorithm=algorithm, merge=False)
                return dict(zip(out.data_vars, dask.compute(*[v.data for v in out.data_vars.values()])))

            seconds, out = timed(pca, args.repeat, backend)
            # multiply-adds of the products: the Gram matrix (upper tiles; all of it in one tile) and the
            # components; or the randomized passes, each the data times a thin matrix
            madds = m * n * (n + args.components) if algorithm == "tsqr" else (
                m * n * (3 + 2 * args.n_iter) * min(max(20, args.components + 10), m, n))
            rows.append(dict(backend=backend, op=f"pca[{algorithm}]", seconds=seconds, input_gb_per_s=x.nbytes / seconds / 1e9,
                             gflops=2 * madds / seconds / 1e9, pool_bytes=pool_bytes(backend)))
            results[f"pca[{algorithm}]"] = {k: B.to_numpy(v) for k, v in out.items()}
        nd = min(args.distance_samples, n)
        xd = x[:, :nd].T
        for metric in args.metrics:
            seconds, d = timed(lambda: sg.pairwise_distance(xd, metric).persist(), args.repeat, backend)
            madds = (3 if metric == "euclidean" else 6) * m * nd * nd / 2  # products of the upper tiles
            rows.append(dict(backend=backend, op=f"pairwise_distance[{metric}]", samples=nd, seconds=seconds,
                             input_gb_per_s=m * nd / seconds / 1e9, gflops=2 * madds / seconds / 1e9,
                             pool_bytes=pool_bytes(backend)))
            results[f"distance[{metric}]"] = B.to_numpy(d.compute())
            del d
    for r in rows:
        r["data_seconds"] = made
    return rows, results


def _relative(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.nanmax(np.abs(b)) or 1.0
    same_nan = np.array_equal(np.isnan(a), np.isnan(b))
    return float(np.nanmax(np.abs(a - b)) / scale) if same_nan else float("inf")


def compare(gpu: dict, cpu: dict) -> dict:
    """Largest differences between the backends' results, relative to the largest value."""
    out = {}
    for key in gpu:
        if key.startswith("pca"):
            a, b = gpu[key], cpu[key]
            out[f"{key} explained_variance"] = _relative(a["sample_pca_explained_variance"], b["sample_pca_explained_variance"])
            pa, pb = a["sample_pca_projection"][:, :2], b["sample_pca_projection"][:, :2]
            pa = pa * np.where((pa * pb).sum(axis=0) < 0, -1, 1)
            out[f"{key} projection[:2]"] = _relative(pa, pb)
        else:
            out[key] = _relative(gpu[key], cpu[key])
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", type=int, default=20_000)
    p.add_argument("--samples", type=int, default=2_000)
    p.add_argument("--variant-chunk", type=int, default=10_000)
    p.add_argument("--distance-samples", type=int, default=10_000, help="samples compared by pairwise_distance")
    p.add_argument("--components", type=int, default=10)
    p.add_argument("--n-iter", type=int, default=0, help="power iterations of the randomized PCA")
    p.add_argument("--algorithms", default="tsqr,randomized")
    p.add_argument("--metrics", default="euclidean,correlation")
    p.add_argument("--backends", default="gpu,cpu")
    p.add_argument("--threads", type=int, default=0, help="Dask threads (default: 2 on the GPU, every core on the CPU)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative difference between backends")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    args.metrics = [m for m in args.metrics.split(",") if m]

    rows, results = [], {}
    for backend in [b for b in args.backends.split(",") if b]:
        r, results[backend] = run_backend(backend, args)
        rows += r
        for row in r:
            print(f"{row['backend']:4} {row['op']:32} {row['seconds']:9.3f} s  {row['input_gb_per_s']:8.2f} GB/s in  "
                  f"{row['gflops']:10.1f} GFLOP/s" + (f"  pool {row['pool_bytes'] / 1e9:.1f} GB" if row["pool_bytes"] else ""))
    out = {"variants": args.variants, "samples": args.samples, "variant_chunk": args.variant_chunk, "rows": rows}
    if "gpu" in results and "cpu" in results:
        out["differences"] = compare(results["gpu"], results["cpu"])
        out["ok"] = all(v <= args.tolerance for v in out["differences"].values())
        for k, v in out["differences"].items():
            print(f"gpu vs cpu  {k:40} {v:.2e}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
