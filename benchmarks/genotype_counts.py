"""How fast the genotype-counting kernels read ``call_genotype``: GB/s of int8 calls read.

A synthetic (variants, samples, ploidy) int8 array (random alleles, whole and partly missing
calls, a few fill values) is counted by each kernel of :mod:`pipeline.kernels.genotypes` on one
block holding it all (no dask), the median of ``--repeat`` runs after one warm-up (which
compiles):

- GPU: the arrays on the device, timed with CUDA events; a device-to-device copy of the array is
  timed in the same run for comparison (``gb_per_s``: bytes read + written; ``copy_read_gb_per_s``:
  read only). A counting kernel reads the array once and writes little: the copy's total is the
  ceiling for its GB/s read. ``path`` says which kernel counted: ``words`` (int8, ploidy 2, two
  alleles: the word kernels) or ``generic``; where the word kernels run, the generic kernel is
  timed too, on the same array, for comparison;
- CPU: the Numba loops, on one thread over the whole array, and on ``--threads`` threads over
  slabs of variants (the loops release the GIL, as Dask's threads run them).

``call_allele_counts`` writes ``alleles`` bytes a call: its GB/s counts what it reads only. It is
one CUDA C kernel for every call (path ``calls``).

    python benchmarks/genotype_counts.py --variants 20000 --samples 20000 --backend gpu --json counts.json
    python benchmarks/genotype_counts.py --variants 200 --samples 300 --backend cpu   # tiny, anywhere

``--sweep`` times the word kernels over their launch shapes instead (unroll, rows a block,
threads a block), each beside the default, to choose the defaults on a GPU. ``--previous`` also
times the word kernels the CUDA C ones replaced (Numba CUDA, ``kernels_previous.py``; path
``previous``) on the same arrays, and checks that they agree.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import backend as B  # noqa: E402
from pipeline import kernels  # noqa: E402
from pipeline.kernels import genotypes  # noqa: E402

KERNELS = ("variant_call_counts", "sample_call_counts", "variant_genotype_counts", "call_allele_counts")


def calls(variants: int, samples: int, ploidy: int, alleles: int, missing: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.integers(0, alleles, size=(variants, samples, ploidy), dtype=np.int8)
    u = rng.random((variants, samples))
    g[u < missing] = -1
    g[(u >= missing) & (u < 1.3 * missing), 0] = -1
    g[(u >= 1.3 * missing) & (u < 1.35 * missing), -1] = -2
    return g


def args_of(name: str, alleles: int) -> tuple:
    return () if name == "sample_call_counts" else (alleles,)


def median_seconds(run, repeat: int) -> float:
    run()  # warm-up: compiles
    return statistics.median(run() for _ in range(repeat))


def gpu_timed(fn, batch: int):
    """A function timing ``batch`` calls of ``fn`` in a row on the GPU (CUDA events), per call: the
    GPU's queue stays full, so the host's launch overhead (a Numba launch, the output's
    allocation) is hidden as it is when Dask's threads launch blocks one after another."""
    import cupy

    def run():
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.Device().synchronize()
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / batch

    return run


def previous_kernel(name: str):
    """The Numba CUDA word kernel ``name`` replaced (``kernels_previous.py``), or None."""
    import kernels_previous

    return getattr(kernels_previous, f"{name}_gpu_previous", None)


def gpu_rows(g: np.ndarray, alleles: int, repeat: int, names=KERNELS, batch: int = 1,
             previous: bool = False) -> list[dict]:
    import cupy

    d = cupy.asarray(g)

    timed = functools.partial(gpu_timed, batch=batch)

    rows = []
    copy = cupy.empty_like(d)
    seconds = median_seconds(timed(lambda: copy.__setitem__(Ellipsis, d)), repeat)
    rows.append({"backend": "gpu", "kernel": "copy", "seconds": seconds, "gb_per_s": 2 * g.nbytes / seconds / 1e9,
                 "copy_read_gb_per_s": g.nbytes / seconds / 1e9})
    for name in names:
        kernel = kernels.get(name, "gpu")
        args = args_of(name, alleles)
        words = genotypes.word_path(d, *args[:1])
        one_kernel = name == "call_allele_counts"  # one CUDA C kernel for every call (cuda/calls.cu)
        paths = ["calls"] if one_kernel else ["words", "generic"] if words else ["generic"]
        old = previous_kernel(name) if previous and words and d.data.ptr % 8 == 0 else None
        if old is not None:
            if not (old(d, *args) == kernel(d, *args)).all():
                raise SystemExit(f"{name}: the previous word kernel disagrees with the current one")
            paths.append("previous")
        for path in paths:
            run = timed(lambda k=kernel, a=args, w=path == "words": k(d, *a) if one_kernel else k(d, *a, words=w))
            if path == "previous":
                run = timed(lambda a=args: old(d, *a))
            seconds = median_seconds(run, repeat)
            rows.append({"backend": "gpu", "kernel": name, "path": path, "seconds": seconds,
                         "gb_per_s": g.nbytes / seconds / 1e9})
    return rows


SWEEP = {
    "variant_call_counts": [dict(unroll=u, ty=ty) for u in (2, 4, 8) for ty in (4, 8, 16)],
    "variant_genotype_counts": [dict(unroll=u, ty=ty) for u in (2, 4, 8) for ty in (8,)],
    "sample_call_counts": [dict(unroll=u, threads=t) for u in (2, 4, 8) for t in (128, 256, 512)],
}


def sweep_rows(g: np.ndarray, alleles: int, repeat: int, batch: int = 1) -> list[dict]:
    """The word kernels over their launch shapes (GB/s read, as :func:`gpu_rows`)."""
    import cupy

    d = cupy.asarray(g)
    rows = []
    for name, shapes in SWEEP.items():
        kernel = kernels.get(name, "gpu")
        args = args_of(name, alleles)
        for shape in [{}] + shapes:
            run = gpu_timed(lambda shape=shape: kernel(d, *args, words=True, **shape), batch)
            seconds = median_seconds(run, repeat)
            rows.append({"backend": "gpu", "kernel": name, "path": "words " + (",".join(f"{k}={v}" for k, v in shape.items()) or "default"),
                         "seconds": seconds, "gb_per_s": g.nbytes / seconds / 1e9})
    return rows


def cpu_rows(g: np.ndarray, alleles: int, repeat: int, threads: int) -> list[dict]:
    rows = []
    slabs = np.array_split(np.arange(g.shape[0]), threads)
    pool = ThreadPoolExecutor(threads)
    for name in KERNELS:
        kernel = kernels.get(name, "cpu")
        args = args_of(name, alleles)

        def one():
            t = time.perf_counter()
            kernel(g, *args)
            return time.perf_counter() - t

        def many():
            t = time.perf_counter()
            list(pool.map(lambda idx: kernel(g[idx[0] : idx[-1] + 1], *args), [s for s in slabs if s.size]))
            return time.perf_counter() - t

        for label, run in (("1 thread", one), (f"{threads} threads", many)):
            seconds = median_seconds(run, repeat)
            rows.append({"backend": "cpu", "kernel": name, "threads": label, "seconds": seconds,
                         "gb_per_s": g.nbytes / seconds / 1e9})
    pool.shutdown()
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", type=int, default=20_000)
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--ploidy", type=int, default=2)
    p.add_argument("--alleles", type=int, default=2)
    p.add_argument("--missing", type=float, default=0.05, help="fraction of calls missing whole")
    p.add_argument("--backend", choices=("cpu", "gpu", "all"), default="all")
    p.add_argument("--threads", type=int, default=4, help="CPU threads over slabs of variants")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--sweep", action="store_true", help="the word kernels over their launch shapes (GPU)")
    p.add_argument("--batch", type=int, default=1, help="GPU: calls timed in a row, per call (launch overhead hidden)")
    p.add_argument("--previous", action="store_true", help="GPU: the word kernels the current ones replaced, too")
    a = p.parse_args(argv)
    g = calls(a.variants, a.samples, a.ploidy, a.alleles, a.missing)
    rows = []
    if a.sweep:
        rows += gpu_rows(g, a.alleles, a.repeat, names=(), batch=a.batch) + sweep_rows(g, a.alleles, a.repeat, a.batch)
    elif a.backend in ("gpu", "all") and B.gpu_available():
        rows += gpu_rows(g, a.alleles, a.repeat, batch=a.batch, previous=a.previous)
    elif a.backend == "gpu":
        raise SystemExit("no CUDA GPU visible to CuPy")
    if a.backend in ("cpu", "all") and not a.sweep:
        rows += cpu_rows(g, a.alleles, a.repeat, a.threads)
    out = {"shape": list(g.shape), "alleles": a.alleles, "bytes": int(g.nbytes), "rows": rows}
    print(f"call_genotype {g.shape} int8, {g.nbytes / 1e9:.3f} GB, {a.alleles} alleles")
    for r in rows:
        where = r["backend"] + (f" ({r['threads']})" if "threads" in r else "")
        print(f"  {where:<18} {r['kernel']:<26} {r.get('path', ''):<20} {r['seconds'] * 1e3:9.3f} ms"
              f"  {r['gb_per_s']:8.2f} GB/s read")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
