"""Population genetics per chunk of variants: allele counts by cohort, the per-variant terms of
diversity and divergence, sums over windows of variants, Fst and Tajima's D.

- ``cohort_allele_count``: a (variants, samples, ploidy) int8 block of genotype calls and the
  cohort of each sample -> counts (variants, cohorts, alleles), uint64, in one pass over the
  block. Negative alleles (missing, -1, or fill, -2) and samples of a negative cohort are not
  counted; neither are allele numbers past the alleles dimension (sgkit's loop would write past
  its row). On the CPU Numba loops that compile to SIMD comparisons where the samples' layout
  allows (:func:`cohort_allele_count_cpu`); on the GPU a CUDA C kernel counting into shared
  memory (``pipeline_cohort_counts``). Counts are integers, the same whatever the order of the
  additions, so these CPU loops are not the GPU kernel's loop step for step; the GPU tests hold
  the kernel equal to them. A Dask task gets the samples of one sample
  chunk: counts over several chunks of samples add up.
- ``cohort_sum``: per-sample allele counts (variants, samples, alleles) summed by cohort, for a
  dataset that already holds ``call_allele_count`` (sgkit then uses it): one array formula,
  slab by slab on the CPU.
- ``diversity_terms``, ``divergence_terms``: sgkit's per-variant diversity (variants, cohorts)
  and divergence (variants, cohorts, cohorts) from cohort allele counts, as array formulas on the
  array module of their input (a product of small matrices per variant for the divergence). The
  counts are integers, exact in float64, so the numerators and denominators are those sgkit
  computes in uint64 and each ratio is the same correctly rounded value.
- ``window_sum``: the sums of a (variants, columns) block's rows over windows ``[start, stop)``
  (relative to the block): one loop per (window, column), adding the rows in order as NumPy's
  ``sum(axis=0)`` does in sgkit's ``window_statistic``, so a window inside one block gets the
  same value bit for bit. A Numba loop on the CPU, the same loop in CUDA C on the GPU (one
  thread per window and column).
- ``segregating_sites``, ``fst``, ``tajimas_d``: array formulas, the same operations in the same
  order as sgkit's.
- ``hash_prefix``: the prefix sums over variants of each haplotype's terms of sgkit's haplotype
  hash (Garud's H), modulo 2^64, at given rows of a block: a NumPy cumulative sum on the CPU; on
  the GPU a thread a haplotype adding the block's variants in order.

On the GPU every kernel is CUDA C in one module (``cuda/popgen.cu``: a thread an output value for
the terms, Fst and the window sums, the formulas' operations in their order), compiled once on a
fresh machine, where the formulas on CuPy compiled a kernel for each of their operations (3.4 s
of popgen's first run there) and the counts and sums under Numba CUDA loaded numba.cuda and
compiled two kernels (1.2 s).
"""

from __future__ import annotations

import numpy as np

from ..backend import xp_of
from . import launch
from .slabs import map_slabs, temporaries

COUNT = np.uint64  # sgkit's type of allele counts summed over samples


# --- allele counts by cohort ------------------------------------------------------------------------


def _cohort_counts_loop(g, cohort, n_alleles, out):
    """``out[v, c, a]`` += calls of allele ``a`` in the samples of cohort ``c`` (``out`` zeroed):
    one sample at a time, each genotype read once. Compiled by :func:`launch.cpu_loop`."""
    n_cohorts = out.shape[1]
    one = np.uint64(1)  # (uint64 + int64 would be a float64 sum in Numba)
    for v in range(g.shape[0]):
        for s in range(g.shape[1]):
            c = cohort[s]
            if c < 0 or c >= n_cohorts:
                continue
            for p in range(g.shape[2]):
                a = g[v, s, p]
                if a >= 0 and a < n_alleles:
                    out[v, c, a] += one


def _cohort_runs_loop(rows, run_start, run_stop, run_cohort, n_alleles, out):
    """The same counts where the samples of a cohort lie in runs: per variant, run and allele,
    the calls equal to the allele in the run's span of the row (``rows``: (variants, samples x
    ploidy); ``run_start``/``run_stop`` in row positions). Each comparison loop compiles to SIMD
    instructions: ~12 GB/s on a row held in cache, one such loop per allele."""
    for v in range(rows.shape[0]):
        row = rows[v]
        for r in range(run_start.shape[0]):
            c = run_cohort[r]
            span = row[run_start[r] : run_stop[r]]
            for a in range(n_alleles):
                code = np.int8(a)
                acc = 0
                for i in range(span.shape[0]):
                    acc += span[i] == code
                out[v, c, a] += np.uint64(acc)


def _cohort_masked_loop(rows, position_cohort, n_alleles, out):
    """The same counts for any order of the samples: per variant, cohort and allele, one loop over
    the row counting the calls equal to the allele at positions of the cohort
    (``position_cohort``, int8, -1 outside every cohort). SIMD again (~8 GB/s a loop on a row in
    cache), so it pays while cohorts x alleles loops are few."""
    for v in range(rows.shape[0]):
        row = rows[v]
        for c in range(out.shape[1]):
            cc = np.int8(c)
            for a in range(n_alleles):
                code = np.int8(a)
                acc = 0
                for i in range(row.shape[0]):
                    acc += (row[i] == code) & (position_cohort[i] == cc)
                out[v, c, a] = acc


MASKED_LOOPS = 16  # cohorts x alleles up to which the masked loops beat the per-sample loop
RUN_SAMPLES = 16  # mean samples of a run from which the run loops are used


def _genotypes(g, xp):
    """The block as C-contiguous signed integers (VCF Zarr stores int8)."""
    if g.dtype.kind != "i":
        g = g.astype(np.int8 if g.dtype.itemsize == 1 else np.int64)
    return xp.ascontiguousarray(g)


def cohort_allele_count_cpu(g, cohort, n_cohorts: int, n_alleles: int):
    """Counts (variants, ``n_cohorts``, ``n_alleles``), uint64, of the alleles called in a
    (variants, samples, ploidy) block, by the cohort of each sample (``cohort``, one per sample
    of the block; negative: in no cohort).

    Three loops, all reading the block once, by how the samples lie: where the cohorts come in
    runs of samples (samples ordered by population), vectorized counts over each run's span
    (:func:`_cohort_runs_loop`); otherwise, for few cohorts x alleles, vectorized counts masked by
    cohort (:func:`_cohort_masked_loop`); else one sample at a time (:func:`_cohort_counts_loop`,
    a byte every ~3 ns on random calls, where branches mispredict)."""
    g = _genotypes(g, np)
    cohort = np.asarray(cohort, dtype=np.int64).ravel()
    n_cohorts, n_alleles = int(n_cohorts), int(n_alleles)
    out = np.zeros((g.shape[0], n_cohorts, n_alleles), dtype=COUNT)
    if not (out.size and g.size):
        return out
    v, n_samples, ploidy = g.shape
    counted = (cohort >= 0) & (cohort < n_cohorts)
    edges = np.flatnonzero(np.diff(cohort)) + 1
    starts, stops = np.r_[0, edges], np.r_[edges, n_samples]
    keep = counted[starts]
    if g.dtype == np.int8 and keep.sum() * RUN_SAMPLES <= n_samples:
        launch.cpu_loop(_cohort_runs_loop)(g.reshape(v, -1), starts[keep] * ploidy, stops[keep] * ploidy,
                                           cohort[starts[keep]], np.int64(n_alleles), out)
    elif g.dtype == np.int8 and n_cohorts * n_alleles <= MASKED_LOOPS:
        position_cohort = np.repeat(np.where(counted, cohort, -1).astype(np.int8), ploidy)
        launch.cpu_loop(_cohort_masked_loop)(g.reshape(v, -1), position_cohort, np.int64(n_alleles), out)
    else:
        launch.cpu_loop(_cohort_counts_loop)(g, cohort, np.int64(n_alleles), out)
    return out


# The GPU kernel (``pipeline_cohort_counts`` in ``cuda/popgen.cu``): a block of THREADS threads
# counts one variant's calls in a tile of samples, into a histogram in shared memory of BINS
# (cohort, allele) bins, a column per thread. With more cohorts than BINS // alleles, the kernel
# runs once per range of cohorts (:func:`cohort_passes`), each run reading the block again.
THREADS = 128  # COHORT_THREADS in the kernel
UNROLL = 4  # COHORT_UNROLL: samples a thread has in flight
BINS = 48  # COHORT_BINS: 48 x 128 int32, 24 KiB of shared memory a block
TILE_ROUNDS = 8  # a block covers THREADS * UNROLL * TILE_ROUNDS samples of a variant


def _kernel(name: str, count_dtype=COUNT, call_dtype=np.int8):
    """A kernel of ``cuda/popgen.cu``. One module for all of popgen (one compilation on a fresh
    machine): its per-variant terms for uint64 counts and its cohort counts for int8 calls, the
    types of VCF Zarr's genotypes and of the counts summed from them, compile the same source."""
    return launch.raw_kernel("popgen.cu", name, launch.FMAD, count_t=launch.c_type(count_dtype),
                             call_t=launch.c_type(call_dtype))


def cohort_passes(n_cohorts: int, n_alleles: int) -> list[int]:
    """The first cohort of each run of the GPU kernel (its histogram holds ``BINS`` bins)."""
    if n_alleles > BINS:
        raise ValueError(f"the GPU kernel counts up to {BINS} alleles, not {n_alleles}")
    return list(range(0, max(int(n_cohorts), 1), BINS // int(n_alleles)))


def cohort_allele_count_gpu(g, cohort, n_cohorts: int, n_alleles: int, rounds: int = TILE_ROUNDS):
    """:func:`cohort_allele_count_cpu` on a CuPy block, by the CUDA C kernel, once per range of
    cohorts (:func:`cohort_passes`), a block of threads counting ``rounds`` rounds of
    ``THREADS * UNROLL`` samples of a variant (the tests pick 1, for several tiles a variant)."""
    import cupy

    g = _genotypes(g, cupy)
    cohort = cupy.ascontiguousarray(cupy.asarray(cohort), dtype=np.int64)
    n_cohorts, n_alleles = int(n_cohorts), int(n_alleles)
    out = cupy.zeros((g.shape[0], n_cohorts, n_alleles), dtype=COUNT)
    if not (out.size and g.size):
        return out
    v, n_samples, ploidy = g.shape
    kernel = _kernel("pipeline_cohort_counts", call_dtype=g.dtype)
    per_tile = THREADS * UNROLL * int(rounds)
    tiles = max(1, -(-n_samples // per_tile))
    for c0 in cohort_passes(n_cohorts, n_alleles):
        kernel((v * tiles,), (THREADS,), (g, cohort, out, np.int64(n_samples), np.int32(ploidy), np.int32(n_cohorts),
                                          np.int32(n_alleles), np.int32(c0), np.int64(tiles), np.int64(per_tile)))
    return out


@temporaries(8)
def cohort_sum_cpu(ac, cohort, n_cohorts: int):
    """Per-sample allele counts ``ac`` (variants, samples, alleles) summed over the samples of
    each cohort -> (variants, ``n_cohorts``, alleles), uint64; negative cohorts are left out.
    A matrix product of each allele's counts with the samples' cohort indicators, in float64
    (exact for counts below 2**53), slab by slab of variants: the float64 copy of one allele's
    counts is the largest temporary (8 slabs of uint8 counts)."""
    return map_slabs(_cohort_sum, ac, cohort, int(n_cohorts), whole=(1, 2))


def cohort_sum_gpu(ac, cohort, n_cohorts: int):
    """:func:`cohort_sum_cpu` on a CuPy block: the same formula on the whole block."""
    return _cohort_sum(ac, cohort, int(n_cohorts))


def _cohort_sum(ac, cohort, n_cohorts: int):
    xp = xp_of(ac)
    cohort = xp.asarray(cohort)
    member = (cohort[:, None] == xp.arange(n_cohorts)[None, :]).astype(np.float64)  # (samples, cohorts)
    out = xp.empty((ac.shape[0], n_cohorts, ac.shape[2]), dtype=COUNT)
    for a in range(ac.shape[2]):
        out[:, :, a] = xp.matmul(ac[:, :, a].astype(np.float64), member)
    return out


# --- per-variant terms --------------------------------------------------------------------------


def diversity_terms(ac):
    """sgkit's per-variant diversity of each cohort from counts (variants, cohorts, alleles):
    the share of differing pairs among the pairs of called alleles, NaN where a cohort has
    fewer than two calls."""
    xp = xp_of(ac)
    ac = ac.astype(np.float64)
    an = ac.sum(axis=2)
    n_pairs = an * (an - 1) / 2
    n_same = (ac * (ac - 1) / 2).sum(axis=2)
    n_diff = n_pairs - n_same
    with np.errstate(invalid="ignore", divide="ignore"):
        return n_diff / xp.where(n_pairs != 0, n_pairs, xp.nan)


def divergence_terms(ac):
    """sgkit's per-variant divergence (variants, cohorts, cohorts): between cohorts i != j the
    share of differing pairs among the an_i * an_j pairs (NaN where there are none), the cohort's
    diversity on the diagonal."""
    xp = xp_of(ac)
    ac = ac.astype(np.float64)
    an = ac.sum(axis=2)
    n_pairs = an[:, :, None] * an[:, None, :]
    n_same = xp.matmul(ac, xp.swapaxes(ac, 1, 2))  # sum over alleles of ac_i * ac_j
    c = ac.shape[1]
    diag = xp.arange(c)
    n_pairs[:, diag, diag] = an * (an - 1)
    n_same[:, diag, diag] = (ac * (ac - 1)).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (n_pairs - n_same) / xp.where(n_pairs != 0, n_pairs, xp.nan)


def diversity_terms_gpu(ac):
    """:func:`diversity_terms` on a CuPy block, by the CUDA C kernel (``cuda/popgen.cu``): the
    same values, bit for bit."""
    import cupy

    ac = cupy.ascontiguousarray(ac)
    out = cupy.empty(ac.shape[:2], np.float64)
    if out.size:
        _kernel("pipeline_diversity_terms", ac.dtype)(
            (launch.blocks(out.size),), (launch.THREADS,), (ac, out, np.int64(out.size), np.int32(ac.shape[2])))
    return out


def divergence_terms_gpu(ac):
    """:func:`divergence_terms` on a CuPy block, by the CUDA C kernel: the same values, bit for bit."""
    import cupy

    ac = cupy.ascontiguousarray(ac)
    v, c, a = ac.shape
    out = cupy.empty((v, c, c), np.float64)
    if out.size:
        _kernel("pipeline_divergence_terms", ac.dtype)(
            (launch.blocks(out.size),), (launch.THREADS,), (ac, out, np.int64(v), np.int32(c), np.int32(a)))
    return out


def segregating_sites(ac):
    """sgkit's (tskit's) segregating sites of each variant from counts (variants, alleles): the
    alleles seen, less one (so -1 where no allele was called), as float64."""
    return ((ac > 0).sum(axis=1) - 1).astype(np.float64)


# --- sums over windows ------------------------------------------------------------------------------


def _window_sum_loop(x, starts, stops, out):
    """``out[w, j] = sum(x[starts[w]:stops[w], j])``, the rows added in order. Compiled by
    :func:`launch.cpu_loop`."""
    for w in range(starts.shape[0]):
        for j in range(x.shape[1]):
            acc = 0.0
            for i in range(starts[w], stops[w]):
                acc += x[i, j]
            out[w, j] = acc


def _window_inputs(x2d, starts, stops, xp):
    x2d = xp.ascontiguousarray(x2d, dtype=np.float64)
    rows = x2d.shape[0]  # windows are cut to the block's rows: the loops index without bounds checks
    starts = np.clip(np.asarray(starts, dtype=np.int64), 0, rows)
    stops = np.clip(np.asarray(stops, dtype=np.int64), starts, rows)
    return x2d, starts, stops


def window_sum_cpu(x2d, starts, stops):
    """Sums of the rows of a (rows, columns) block over each window ``[starts[w], stops[w])``
    (row numbers of the block) -> (windows, columns), float64."""
    x2d, starts, stops = _window_inputs(x2d, starts, stops, np)
    out = np.empty((starts.size, x2d.shape[1]), dtype=np.float64)
    launch.cpu_loop(_window_sum_loop)(x2d, starts, stops, out)
    return out


def window_sum_gpu(x2d, starts, stops):
    """:func:`window_sum_cpu` on a CuPy block, by the CUDA C kernel (one thread a window and
    column, its rows added in order: the same values, bit for bit)."""
    import cupy

    x2d, starts, stops = _window_inputs(x2d, starts, stops, cupy)
    out = cupy.empty((starts.size, x2d.shape[1]), dtype=np.float64)
    if out.size:
        _kernel("pipeline_window_sum")((launch.blocks(out.size),), (launch.THREADS,),
                                       (x2d, cupy.asarray(starts), cupy.asarray(stops), out,
                                        np.int64(starts.size), np.int64(x2d.shape[1])))
    return out


# --- Garud's H: prefix sums of the haplotypes' hash terms ----------------------------------------------


def hash_prefix_cpu(g, weights, rels):
    """The prefix sums over variants of ``uint64(int64(call)) * weights[variant]`` of each
    haplotype of a (variants, samples, ploidy) block, modulo 2^64, at the block's row numbers
    ``rels`` (increasing, 0 to its length) -> (rels, haplotypes) uint64: the terms of sgkit's
    haplotype hash (``ops/genomics/popgen.py``)."""
    g = _genotypes(g, np)
    v = g.shape[0]
    t = g.reshape(v, -1).astype(np.int64).astype(np.uint64) * np.asarray(weights, dtype=np.uint64)[:, None]
    c = np.concatenate([np.zeros((1, t.shape[1]), dtype=np.uint64), np.cumsum(t, axis=0, dtype=np.uint64)])
    return c[np.asarray(rels, dtype=np.int64)]


def hash_prefix_gpu(g, weights, rels):
    """:func:`hash_prefix_cpu` on a CuPy block, by the CUDA C kernel (a thread a haplotype, adding
    the block's variants in order: the same sums, bit for bit). The array formulas compiled nine
    CuPy kernels on a fresh machine (casts, product, scans, gathers) and held the block three times
    as 64-bit integers; the kernel reads it once."""
    import cupy

    g = _genotypes(g, cupy)
    v = g.shape[0]
    haplotypes = g.size // v if v else g.shape[1] * g.shape[2]
    rels = np.asarray(rels, dtype=np.int64)
    out = cupy.empty((rels.size, haplotypes), dtype=np.uint64)
    if out.size:
        w = cupy.asarray(np.ascontiguousarray(weights, dtype=np.uint64))
        _kernel("pipeline_hash_prefix", call_dtype=g.dtype)(
            (launch.blocks(haplotypes),), (launch.THREADS,),
            (g, w, cupy.asarray(rels), out, np.int64(haplotypes), np.int32(rels.size)))
    return out


# --- statistics of the sums ---------------------------------------------------------------------------


def fst(d, estimator: str = "Hudson"):
    """Fst between each pair of cohorts from divergence (..., cohorts, cohorts) with the
    diversities on the diagonal: Hudson's estimator (Bhatia et al. 2013, as scikit-allel),
    ``1 - (d_ii + d_jj) / 2 / d_ij``, NaN where d_ij is 0, or Nei's (as tskit),
    ``1 - 2 (d_ii + d_jj) / (d_ii + 2 d_ij + d_jj)``, NaN where that denominator is 0; NaN on
    the diagonal. As sgkit, each pair (i < j) is computed from d_ij and given to (j, i) too."""
    xp = xp_of(d)
    d = d.astype(np.float64)
    diag = xp.diagonal(d, axis1=-2, axis2=-1)
    d_ii, d_jj = diag[..., :, None], diag[..., None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        if estimator == "Hudson":
            out = 1 - ((d_ii + d_jj) / 2) / xp.where(d != 0, d, xp.nan)
        elif estimator == "Nei":
            den = d_ii + 2 * d + d_jj
            out = 1 - (2 * (d_ii + d_jj) / xp.where(den != 0, den, xp.nan))
        else:
            raise ValueError(f"unknown Fst estimator {estimator!r}")
    c = d.shape[-1]
    upper = xp.arange(c)[:, None] < xp.arange(c)[None, :]
    return xp.where(upper, out, xp.where(upper.T, xp.swapaxes(out, -1, -2), xp.nan))


def fst_gpu(d, estimator: str = "Hudson"):
    """:func:`fst` on a CuPy block, by the CUDA C kernel: the same values, bit for bit."""
    import cupy

    if estimator not in ("Hudson", "Nei"):
        raise ValueError(f"unknown Fst estimator {estimator!r}")
    d = cupy.ascontiguousarray(d, dtype=np.float64)
    c = d.shape[-1]
    out = cupy.empty(d.shape, np.float64)
    if out.size:
        _kernel("pipeline_fst")(
            (launch.blocks(out.size),), (launch.THREADS,),
            (d, out, np.int64(out.size // (c * c)), np.int32(c), np.int32(estimator == "Nei")))
    return out


def tajimas_d(div, S, n):
    """Tajima's D of each cohort (rows, cohorts) from diversity ``div`` (rows, cohorts), the
    segregating sites ``S`` (rows) and ``n``, the most alleles called at a variant (a 0-d array):
    sgkit's formula, operation for operation (inf or NaN where the deviation is 0)."""
    xp = xp_of(div)
    n = xp.asarray(n, dtype=np.float64).reshape(())
    S = S.astype(np.float64)
    k = xp.arange(1, float(n))  # sgkit: da.arange(1, n)
    a1 = (1 / k).sum()
    theta = S / a1
    d = div - theta[:, None]
    a2 = (1 / (k**2)).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        b1 = (n + 1) / (3 * (n - 1))
        b2 = 2 * (n**2 + n + 3) / (9 * n * (n - 1))
        c1 = b1 - (1 / a1)
        c2 = b2 - ((n + 2) / (a1 * n)) + (a2 / (a1**2))
        e1 = c1 / a1
        e2 = c2 / (a1**2 + a2)
        d_stdev = xp.sqrt((e1 * S) + (e2 * S * (S - 1)))
        return d / d_stdev[:, None]
