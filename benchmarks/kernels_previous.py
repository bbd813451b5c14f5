"""The GPU kernels that the package's current ones replaced, kept for comparison in
``ops_bandwidth.py`` (rows named ``<name>_previous``), and the CPU loops of the previous group
kernels, which the tests use as a second reference for the current ones.

- weighted sums: one block per slice of a row, the weights read with every value, a tree of
  ``__syncthreads`` per block (CUDA C);
- moments, rolling means, group sums and spells: the per-point loops under Numba CUDA, one thread
  per grid point (the moments and rolling loops are those of the package, whose CPU kernels and
  twins they remain; the group loops are here);
- detrend: the Numba ``detrend`` kernel alone, which reads each series twice (the package still
  uses it where the tile kernel does not fit);
- genotype counts of int8 diploid biallelic calls (per variant, per sample, per call): the Numba
  CUDA word kernels, uint64 words of four calls (``genotype_counts.py --previous``); the per-call
  counts of other calls, a Numba CUDA kernel a thread a call.

Nothing here is imported by the package.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from string import Template

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.kernels import launch  # noqa: E402
from pipeline.kernels.moments import make_moments_column  # noqa: E402
from pipeline.kernels.rolling import make_rolling_column  # noqa: E402

cuda = launch.numba_cuda()  # a global of this module, as Numba's CUDA simulator requires

THREADS_PER_BLOCK = launch.THREADS


# --- weighted sums: the previous CUDA C kernel --------------------------------------------------------

WEIGHTED_THREADS = 256
PER_BLOCK = WEIGHTED_THREADS * 4 * 8  # elements of a row per block

WEIGHTED_SOURCE = Template(r"""
typedef ${in_t} in_t;
extern "C" __global__ void pipeline_weighted_sums(const in_t* __restrict__ x, const double* __restrict__ w,
                                                  double* __restrict__ partial, long long npts, long long per_block) {
    const long long t = blockIdx.y;
    const long long start = (long long)blockIdx.x * per_block;
    const long long end = min(npts, start + per_block);
    const in_t* row = x + t * npts;
    double sx = 0.0, sw = 0.0;
    long long i = start + threadIdx.x;
    const long long B = blockDim.x;
    for (; i + 3 * B < end; i += 4 * B) {
        const double a = (double)row[i], b = (double)row[i + B], c = (double)row[i + 2 * B], d = (double)row[i + 3 * B];
        const double wa = w[i], wb = w[i + B], wc = w[i + 2 * B], wd = w[i + 3 * B];
        if (a == a) { sx += a * wa; sw += wa; }
        if (b == b) { sx += b * wb; sw += wb; }
        if (c == c) { sx += c * wc; sw += wc; }
        if (d == d) { sx += d * wd; sw += wd; }
    }
    for (; i < end; i += B) {
        const double a = (double)row[i];
        if (a == a) { sx += a * w[i]; sw += w[i]; }
    }
    __shared__ double shx[${threads}], shw[${threads}];
    shx[threadIdx.x] = sx;
    shw[threadIdx.x] = sw;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            shx[threadIdx.x] += shx[threadIdx.x + s];
            shw[threadIdx.x] += shw[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const long long k = (t * gridDim.x + blockIdx.x) * 2;
        partial[k] = shx[0];
        partial[k + 1] = shw[0];
    }
}
""")


def weighted_source(in_dtype) -> str:
    return WEIGHTED_SOURCE.substitute(in_t=launch.c_type(in_dtype), threads=WEIGHTED_THREADS)


@functools.cache
def _weighted_kernel(in_dtype):
    import cupy

    return cupy.RawKernel(weighted_source(in_dtype), "pipeline_weighted_sums", options=launch.FMAD)


def weighted_sums_gpu_previous(x2d, w1d):
    """(sum of w * x, sum of w) over the valid values of each row of a C-contiguous (rows, points)
    CuPy array, with one weight per point; two float64 arrays of length rows."""
    import cupy

    rows, npts = x2d.shape
    nblocks = max(1, (npts + PER_BLOCK - 1) // PER_BLOCK)
    partial = cupy.empty((rows, nblocks, 2), dtype=np.float64)
    w1d = cupy.ascontiguousarray(w1d, dtype=np.float64)
    _weighted_kernel(np.dtype(x2d.dtype))((nblocks, rows), (WEIGHTED_THREADS,),
                                          (x2d, w1d, partial, np.int64(npts), np.int64(PER_BLOCK)))
    sums = partial.sum(axis=1)
    return sums[:, 0], sums[:, 1]


# --- moments: the per-point loop under Numba CUDA -------------------------------------------------------

_moments_column = make_moments_column(cuda.jit(device=True))


@cuda.jit
def moments_kernel(x, n, mean, m2):
    """One thread per grid point; a warp reads 32 neighbouring points of one step (coalesced)."""
    p = cuda.grid(1)
    if p < x.shape[1]:
        _moments_column(x, n, mean, m2, p)


def moments_gpu_previous(block, axis: int) -> dict:
    """{n, mean, m2} of a CuPy block over ``axis`` (kept with length 1), by the Numba kernel."""
    import cupy

    x2, moved = launch.to_2d(block, axis, cupy)
    n, mean, m2 = (cupy.empty(x2.shape[1], dtype=np.float64) for _ in range(3))
    launch.launch_numba(moments_kernel, x2.shape[1], x2, n, mean, m2)
    return {k: launch.reduced_from_2d(v, moved, axis, cupy) for k, v in {"n": n, "mean": mean, "m2": m2}.items()}


# --- rolling means: the per-point loop under Numba CUDA, two reads per value ----------------------------

_rolling_column = make_rolling_column(cuda.jit(device=True))


@cuda.jit
def rolling_kernel(x, out, before, after, min_periods):
    """One thread per grid point; a warp reads 32 neighbouring points of one time step, so every
    load is coalesced."""
    p = cuda.grid(1)
    if p < x.shape[1]:
        _rolling_column(x, out, before, after, min_periods, p)


def rolling_launch(x2d, out2d, before: int, after: int, min_periods: int, stream=0):
    """Launch the kernel on 2-D device arrays (CuPy, Numba, or NumPy under the simulator)."""
    blocks = launch.blocks(x2d.shape[1], THREADS_PER_BLOCK)
    rolling_kernel[blocks, THREADS_PER_BLOCK, stream](x2d, out2d, before, after, min_periods)


def rolling_mean_gpu_previous(block, axis: int, before: int, after: int, min_periods: int, out_dtype):
    import cupy

    x2, moved = launch.to_2d(block, axis, cupy)
    out = cupy.empty(x2.shape, dtype=out_dtype)
    # launch on CuPy's current stream, so the kernel is ordered with the CuPy work around it
    stream = cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    rolling_launch(x2, out, before, after, min_periods, stream=stream)
    return launch.from_2d(out, moved, axis, cupy)


# --- group sums and spells: the previous per-point loops ------------------------------------------------


def make_group_sum_column(jit):
    """The per-point loop of ``group_sum``, compiled by ``jit`` (``numba.njit`` or
    ``cuda.jit(device=True)``). A group's running sum stays in registers while consecutive steps
    belong to it and is added to ``sums`` when the group changes; four steps are loaded ahead."""

    @jit
    def step(x, labels, threshold, mode, sums, counts, p, t, v, group, acc, n):
        g = labels[t]
        if g != group:
            if group >= 0:
                sums[group, p] += acc
                counts[group, p] += n
            group, acc, n = g, 0.0, 0.0
        if mode == 0:
            if v == v:
                acc += v
                n += 1.0
        elif v > threshold:
            acc += 1.0
        return group, acc, n

    @jit
    def column(x, labels, threshold, mode, sums, counts, p):
        group, acc, n = -1, 0.0, 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t, v0, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 1, v1, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 2, v2, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 3, v3, group, acc, n)
            t += 4
        while t < nt:
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t, float(x[t, p]), group, acc, n)
            t += 1
        if group >= 0:
            sums[group, p] += acc
            counts[group, p] += n

    return column


def make_group_spells_column(jit):
    """The per-point loop of ``group_spells``, compiled by ``jit``.

    A run counts, with its whole length, for the group of its first step (xclim's "first"
    index). The run that opens the block may have begun in an earlier block: it is kept apart in
    ``lead``. The run still open at the end (``tail``, begun in group ``tail_group``) may go on
    in the next block: it is counted with its length so far and lengthened on merge. A run is
    written to ``best`` once, when it ends, and four steps are loaded ahead.
    """

    @jit
    def step(labels, threshold, best, p, t, v, run, group, in_lead, n_lead):
        if v > threshold:
            if run == 0:
                group = labels[t]
            run += 1
            if in_lead:
                n_lead += 1
        else:
            if run > 0 and not in_lead and run > best[group, p]:
                best[group, p] = run
            run = 0
            in_lead = False
        return run, group, in_lead, n_lead

    @jit
    def column(x, labels, threshold, best, lead, tail, tail_group, p):
        run, group, in_lead, n_lead = 0, -1, True, 0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = x[t, p], x[t + 1, p], x[t + 2, p], x[t + 3, p]
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t, v0, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 1, v1, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 2, v2, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 3, v3, run, group, in_lead, n_lead)
            t += 4
        while t < nt:
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t, x[t, p], run, group, in_lead, n_lead)
            t += 1
        if run > 0 and not in_lead and run > best[group, p]:
            best[group, p] = run
        lead[p] = n_lead
        tail[p] = run
        tail_group[p] = group if run > 0 else -1

    return column


_group_sum_column = make_group_sum_column(cuda.jit(device=True))
_group_spells_column = make_group_spells_column(cuda.jit(device=True))


@cuda.jit
def group_sum_kernel(x, labels, threshold, mode, sums, counts):
    p = cuda.grid(1)
    if p < x.shape[1]:
        _group_sum_column(x, labels, threshold, mode, sums, counts, p)


@cuda.jit
def group_spells_kernel(x, labels, threshold, best, lead, tail, tail_group):
    p = cuda.grid(1)
    if p < x.shape[1]:
        _group_spells_column(x, labels, threshold, best, lead, tail, tail_group, p)


@functools.cache
def _cpu_columns(name: str):
    column = {"sum": make_group_sum_column, "spells": make_group_spells_column}[name](launch.cpu_jit)

    if name == "sum":

        @launch.cpu_jit
        def columns(x, labels, threshold, mode, sums, counts):
            for p in range(x.shape[1]):
                column(x, labels, threshold, mode, sums, counts, p)

    else:

        @launch.cpu_jit
        def columns(x, labels, threshold, best, lead, tail, tail_group):
            for p in range(x.shape[1]):
                column(x, labels, threshold, best, lead, tail, tail_group, p)

    return columns


def group_sum_previous_cpu(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0) -> dict:
    npts = x2d.shape[1]
    sums, counts = np.zeros((k, npts)), np.zeros((k, npts))
    _cpu_columns("sum")(x2d, labels, np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def group_sum_previous_gpu(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0) -> dict:
    import cupy

    npts = x2d.shape[1]
    sums = cupy.zeros((k, npts), dtype=np.float64)
    counts = cupy.zeros((k, npts), dtype=np.float64)
    launch.launch_numba(group_sum_kernel, npts, x2d, cupy.asarray(labels), np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def _spells_outputs(xp, k: int, npts: int) -> dict:
    out = {"best": xp.zeros((k, npts), dtype=np.int32)}
    out.update({f: xp.zeros(npts, dtype=np.int32) for f in ("lead", "tail", "tail_group")})
    return out


def group_spells_previous_cpu(x2d, labels, k: int, threshold: float) -> dict:
    out = _spells_outputs(np, k, x2d.shape[1])
    _cpu_columns("spells")(x2d, labels, np.float64(threshold), out["best"], out["lead"], out["tail"], out["tail_group"])
    return out


def group_spells_previous_gpu(x2d, labels, k: int, threshold: float) -> dict:
    import cupy

    out = _spells_outputs(cupy, k, x2d.shape[1])
    launch.launch_numba(group_spells_kernel, x2d.shape[1], x2d, cupy.asarray(labels), np.float64(threshold),
                        out["best"], out["lead"], out["tail"], out["tail_group"])
    return out


# --- detrend: the Numba kernel alone, reading each series twice -----------------------------------------


def detrend_numba_gpu(x, u, *, axis: int, deg: int, out_dtype):
    """:func:`pipeline.kernels.trend.detrend_block_gpu` without the tile kernel."""
    import cupy

    from pipeline.kernels import trend

    x2, moved = launch.to_2d(x, axis, cupy)
    u1 = trend._axis_values(u, axis, x2.shape[0])
    out = cupy.empty(x2.shape, dtype=out_dtype)
    launch.launch_numba(trend.trend_kernels(deg)["detrend"], x2.shape[1], x2, u1, out)
    return launch.from_2d(out, moved, axis, cupy)


# --- genotype counts: the Numba CUDA word kernels (uint64 words, four calls) ---------------------------
#
# The package counts int8 diploid biallelic calls with CUDA C (pipeline/kernels/cuda/genotypes.cu,
# 32-bit words and 16-byte loads); these were its kernels before, over the same per-call rules.

from pipeline.kernels.genotypes import CLASSES, _call_alleles, _tally_genotype, make_call_counters, n_genotypes  # noqa: E402

INNER = np.uint64(0x7E7E7E7E7E7E7E7E)  # bits 1 to 6 of each byte
LOWS = np.uint64(0x0101010101010101)  # bit 0 of each byte
CALLS = np.uint64(0x0001000100010001)  # bit 0 of each call's first byte
LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)  # each call's first byte
HALF = np.uint64(0xFFFFFFFF)
LANES = np.uint32(0x00FF00FF)
ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
BAD_WORD = np.uint64(0x0202020202020202)  # a word _word_bytes refuses: its calls are counted one by one
WORD_CALLS = 4  # diploid int8 calls in a word
_S1, _S8, _S32, _S64 = (np.uint64(n) for n in (1, 8, 32, 64))
_H8, _H16 = np.uint32(8), np.uint32(16)


def _words_of(g):
    """The whole uint64 words of C-contiguous ``g``'s bytes (a view)."""
    flat = g.reshape(-1)
    return flat[: flat.size // 8 * 8].view(np.uint64)


def _word_bytes(x):
    """``(bad, neg, low)`` of word ``x``: ``bad`` is non-zero where a byte is not 0, 1, -1 or -2
    (where its bits 1 to 7 are not all equal: bit k against bit k + 1 of the same byte); ``neg``
    has bit 0 of each byte set where the byte is negative (its bit 1), ``low`` where its bit 0 is
    (allele 1, or -1)."""
    y = x >> _S1
    return (x ^ y) & INNER, y & LOWS, x & LOWS


def _word_classes(neg, low):
    """Flags at bit 0 of each call's first byte (``CALLS``) of a word of 0, 1, -1 and -2: the
    calls homozygous reference, homozygous alternate and heterozygous, as ``classify``."""
    neg2 = neg >> _S8  # the second allele's bits, at the first's place
    low2 = low >> _S8
    called = ~(neg | neg2) & CALLS
    return called & ~(low | low2), called & low & low2, called & (low ^ low2)


def _word_refused(neg, low):
    """Flags at ``CALLS`` of the calls whose biallelic genotype sgkit refuses (``_tally_genotype``
    with two alleles): a first allele of -2, or a first allele of 0 or 1 and a second of -2."""
    neg2 = neg >> _S8
    low2 = low >> _S8
    return CALLS & ((neg & ~low) | (~neg & neg2 & ~low2))


def _word_alleles(neg, low):
    """Flags at bit 0 of each byte: the alleles 0, and the alleles 1."""
    return ~(neg | low) & LOWS, low & ~neg


def _word_call_alleles(neg, low):
    """The word of per-call allele counts, as ``call_allele_counts`` writes them with two alleles:
    each call's count of allele 0 in its first byte, of allele 1 in its second (the same bytes as
    the calls: a word of counts for each word of calls)."""
    zeros, ones = ~(neg | low) & LOWS, low & ~neg  # as _word_alleles (each compiles alone)
    return ((zeros + (zeros >> _S8)) & LOW_BYTES) | (((ones + (ones >> _S8)) & LOW_BYTES) << _S8)


def _halves(x):
    """The two 32-bit halves of word ``x`` added (uint32): where ``x`` holds flags at bytes, four
    byte lanes of counts, so that a count of a word takes one 32-bit addition (three-input)."""
    return np.uint32(x & HALF) + np.uint32(x >> _S32)


def _lane_sum(x):
    """The sum of the four bytes of the uint32 ``x`` (int64), by halves: no multiplication that
    could overflow."""
    x = (x & LANES) + ((x >> _H8) & LANES)
    return np.int64((x & np.uint32(0xFFFF)) + (x >> _H16))


def _load_word(words, n_words, o, nbytes):
    """The ``nbytes`` (1 to 8) bytes of the block at byte ``o`` as a word, from ``words`` (the
    block's whole words): two words joined where ``o`` is not a multiple of 8 (a row of a number
    of samples not a multiple of 4), bytes past ``nbytes`` set to 0xFF (-1, missing, which counts
    nowhere); ``BAD_WORD`` where a byte lies past the last whole word (the end of the block)."""
    q = o >> 3
    last = (o + nbytes - 1) >> 3
    if last >= n_words:
        return BAD_WORD
    x = words[np.uint64(q)]  # (an unsigned index: no test for a negative one)
    r = o & 7
    if r != 0:
        shift = np.uint64(8 * r)
        x >>= shift
        if last > q:
            x |= words[np.uint64(last)] << (_S64 - shift)
    if nbytes < 8:
        x |= ONES << np.uint64(8 * nbytes)
    return x


WORD_LANE_MAX = 127  # words a thread counts in 8-bit lanes, two a word, before it sums them (per-variant)
SAMPLE_LANE_MAX = 0xFFFF  # variants a thread counts in 16-bit lanes (per-sample)
WORD_THREADS = 1 << 18  # threads the per-sample word kernel aims for (an H200 holds 270,336)


def _warp_sum(width: int, threads: int):
    """A device function: the sum of a value over each ``width`` lanes (a power of two up to 32)
    of a warp, in the first of them, by shuffles down. Every thread of the block calls it. Numba's
    CUDA simulator has no shuffles: there the same steps go through shared memory (a shuffle from
    past the warp returns the lane's own value, as CUDA's does)."""
    if hasattr(cuda, "shfl_down_sync"):

        @cuda.jit(device=True)
        def warp_sum(value):
            step = width // 2
            while step > 0:
                value += cuda.shfl_down_sync(0xFFFFFFFF, value, step)
                step //= 2
            return value

    else:

        @cuda.jit(device=True)
        def warp_sum(value):
            shared = cuda.shared.array(threads, np.int64)
            t = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
            step = width // 2
            while step > 0:
                shared[t] = value
                cuda.syncthreads()
                value += shared[t + step] if t % 32 + step < 32 else value
                cuda.syncthreads()
                step //= 2
            return value

    return warp_sum


@launch.once
def _word_functions():
    """The word functions above as Numba CUDA device functions."""
    return tuple(cuda.jit(device=True)(f) for f in (_word_bytes, _word_classes, _word_refused, _word_alleles,
                                                    _word_call_alleles, _halves, _lane_sum, _load_word))


@launch.once
def _word_row_kernel(kind: str, tx: int, ty: int, unroll: int):
    """The per-variant word kernel ``(g, words, tile, out)``: ``kind`` "calls" (hom ref, hom alt,
    het, alleles 0 and 1) or "genotypes" (0/0, 0/1, 1/1, refused), rows of ``tx`` threads over
    tiles of ``tile`` words (an argument, not a constant: it follows the block's samples, and each
    constant is a compilation).
    ``count_word`` counts a word by bit operations, or says it cannot; those words are counted
    call by call after the step's others, in a loop the compiler keeps rolled: with the per-call
    path unrolled beside each word of the step, ptxas kept the step's values live for it (the
    genotype counts took 80 registers, 40 now)."""
    word_bytes, word_classes, word_refused, word_alleles, _, halves, lane_sum, load_word = _word_functions()
    warp_sum = _warp_sum(tx, tx * ty)
    if kind == "calls":
        tally = make_call_counters(cuda.jit(device=True))[1]
        n_counts = CLASSES + 2

        @cuda.jit(device=True)
        def count_word(x, lanes):
            bad, neg, low = word_bytes(x)
            if bad != 0:
                return False
            hom_ref, hom_alt, het = word_classes(neg, low)
            zeros, ones = word_alleles(neg, low)
            lanes[0] += halves(hom_ref)
            lanes[1] += halves(hom_alt)
            lanes[2] += halves(het)
            lanes[3] += halves(zeros)
            lanes[4] += halves(ones)
            return True
    else:
        tally = cuda.jit(device=True)(_tally_genotype)
        n_counts = n_genotypes(2, 2) + 1

        @cuda.jit(device=True)
        def count_word(x, lanes):
            bad, neg, low = word_bytes(x)
            if bad != 0:
                return False
            hom_ref, hom_alt, het = word_classes(neg, low)
            lanes[0] += halves(hom_ref)
            lanes[1] += halves(het)
            lanes[2] += halves(hom_alt)
            lanes[3] += halves(word_refused(neg, low))
            return True

    @cuda.jit(device=True)
    def count_calls(row, s0, ns, extra):
        for j in range(WORD_CALLS):
            if s0 + j < ns:
                tally(row, s0 + j, 2, 2, extra)

    @launch.cuda_kernel
    def word_row_counts(g, words, tile, out):
        x = cuda.threadIdx.x
        v = cuda.blockIdx.x * ty + cuda.threadIdx.y
        nv, ns, nw = g.shape[0], g.shape[1], words.shape[0]
        row_bytes = 2 * ns
        lanes = cuda.local.array(n_counts, np.uint32)  # 8-bit lanes: at most WORD_LANE_MAX words
        extra = cuda.local.array(n_counts, np.int64)  # the calls of words counted one by one
        for c in range(n_counts):
            lanes[c] = 0
            extra[c] = 0
        if v < nv:
            row = g[v]
            base = v * row_bytes
            aligned = (base & 7) == 0  # the row starts at a word: its whole words are words of the block
            k = cuda.blockIdx.y * tile + x
            end = min((row_bytes + 7) // 8, (cuda.blockIdx.y + 1) * tile)
            whole = min(row_bytes // 8, end)
            buf = cuda.local.array(unroll, np.uint64)
            while k + (unroll - 1) * tx < whole:
                for u in range(unroll):  # every load of the step first
                    if aligned:
                        buf[u] = words[np.uint64((base >> 3) + k + u * tx)]
                    else:
                        buf[u] = load_word(words, nw, base + 8 * (k + u * tx), 8)
                odd = 0  # the words of other values, counted call by call after the others
                for u in range(unroll):
                    if not count_word(buf[u], lanes):
                        odd |= 1 << u
                u = 0
                while odd != 0:  # (a loop the compiler does not unroll: one copy of the rare path)
                    if odd & 1:
                        count_calls(row, WORD_CALLS * (k + u * tx), ns, extra)
                    odd >>= 1
                    u += 1
                k += unroll * tx
            while k < end:  # the rest, and a row's last bytes short of a word
                if not count_word(load_word(words, nw, base + 8 * k, min(8, row_bytes - 8 * k)), lanes):
                    count_calls(row, WORD_CALLS * k, ns, extra)
                k += tx
        for c in range(n_counts):
            total = warp_sum(lane_sum(lanes[c]) + extra[c])
            if x == 0 and v < nv and total != 0:
                cuda.atomic.add(out, (v, c), total)

    return word_row_counts


@launch.once
def _word_sample_kernel(unroll: int):
    """The per-sample word kernel ``(g, words, vtile, out)``: a thread a word (four samples) and a
    tile of ``vtile`` variants (an argument: it follows the block's shape)."""
    word_bytes, word_classes, _, _, _, _, _, load_word = _word_functions()
    tally = make_call_counters(cuda.jit(device=True))[1]

    @cuda.jit(device=True)
    def count_word(x, lanes):
        bad, neg, low = word_bytes(x)
        if bad != 0:
            return False
        hom_ref, hom_alt, het = word_classes(neg, low)
        lanes[0] += hom_ref
        lanes[1] += hom_alt
        lanes[2] += het
        return True

    @cuda.jit(device=True)
    def count_calls(row, s0, ns, lanes, calls):
        for j in range(WORD_CALLS):
            if s0 + j < ns:
                for c in range(CLASSES):
                    calls[c] = 0
                tally(row, s0 + j, 2, 0, calls)
                for c in range(CLASSES):  # into the sample's 16-bit lane
                    lanes[c] += np.uint64(calls[c]) << np.uint64(16 * j)

    @launch.cuda_kernel
    def word_sample_counts(g, words, vtile, out):
        k = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        nv, ns, nw = g.shape[0], g.shape[1], words.shape[0]
        row_bytes = 2 * ns
        if k < (row_bytes + 7) // 8:
            s0 = WORD_CALLS * k
            nbytes = min(8, row_bytes - 8 * k)
            lanes = cuda.local.array(CLASSES, np.uint64)  # a 16-bit lane a sample
            calls = cuda.local.array(CLASSES, np.int64)
            for c in range(CLASSES):
                lanes[c] = 0
            buf = cuda.local.array(unroll, np.uint64)
            v = cuda.blockIdx.y * vtile
            v1 = min(nv, v + vtile)
            while v + unroll <= v1:
                for u in range(unroll):
                    o = (v + u) * row_bytes + 8 * k
                    if nbytes == 8 and (o & 7) == 0:  # a whole word of the block
                        buf[u] = words[np.uint64(o >> 3)]
                    else:
                        buf[u] = load_word(words, nw, o, nbytes)
                odd = 0  # the words of other values, counted call by call after the others
                for u in range(unroll):
                    if not count_word(buf[u], lanes):
                        odd |= 1 << u
                u = 0
                while odd != 0:  # (a loop the compiler does not unroll: one copy of the rare path)
                    if odd & 1:
                        count_calls(g[v + u], s0, ns, lanes, calls)
                    odd >>= 1
                    u += 1
                v += unroll
            while v < v1:
                if not count_word(load_word(words, nw, v * row_bytes + 8 * k, nbytes), lanes):
                    count_calls(g[v], s0, ns, lanes, calls)
                v += 1
            for j in range(WORD_CALLS):
                if s0 + j < ns:
                    for c in range(CLASSES):
                        n = np.int64((lanes[c] >> np.uint64(16 * j)) & np.uint64(0xFFFF))
                        if n != 0:
                            cuda.atomic.add(out, (s0 + j, c), n)

    return word_sample_counts


def word_row_shape(n_samples: int, tx: int | None = None, ty: int | None = None, unroll: int = 4,
                   tile: int | None = None):
    """(tx, ty, tile) of the per-variant word kernels, ``tile`` in words: a warp a row where a row
    has more than 256 words (1,024 samples), else the fewest threads that leave each 16 words or
    fewer (a thread a row of 64 samples or fewer), rows of a warp summed by shuffles. A row is cut
    into tiles of at most ``WORD_LANE_MAX`` words a thread (its counts' byte lanes must not
    overflow), of equal lengths in whole unrolled steps, so no block gets a short remainder.
    ``tile`` given in samples is rounded up to words."""
    n_words = -(-n_samples // WORD_CALLS)
    if tx is None:
        tx = 1
        while tx < 32 and 16 * tx < n_words:
            tx *= 2
    ty = ty or THREADS_PER_BLOCK // tx
    if tile:
        words = -(-tile // WORD_CALLS)
    else:
        step = tx * unroll
        steps = -(-n_words // step)
        words = step * -(-steps // -(-steps // max(1, WORD_LANE_MAX // unroll)))
    if tx & (tx - 1) or tx > 32 or tx * ty % 32:
        raise ValueError(f"word kernels: tx must be a power of two up to 32 and tx * ty a multiple of 32, "
                         f"not {tx}, {ty}")
    if -(-words // tx) > WORD_LANE_MAX:
        raise ValueError(f"word kernels: at most {WORD_LANE_MAX} words a thread a tile, not {-(-words // tx)}")
    return tx, ty, words


def word_sample_tile(n_variants: int, n_samples: int) -> int:
    """Variants a thread of the per-sample word kernel walks: enough tiles for ``WORD_THREADS``
    threads, at least 64 variants a tile (each tile adds its counts to the output: three atomic
    adds a sample), at most ``SAMPLE_LANE_MAX`` (16-bit lanes) and few enough tiles for the grid."""
    tiles = max(1, WORD_THREADS // -(-n_samples // WORD_CALLS))
    vtile = max(64, -(-n_variants // tiles), -(-n_variants // 65535))
    return min(SAMPLE_LANE_MAX, vtile)


def _word_row_counts(kind: str, g, n_counts: int, tx, ty, unroll, tile):
    import cupy as xp
    nv, ns, _ = g.shape
    out = xp.zeros((nv, n_counts), np.int64)
    tx, ty, tile = word_row_shape(ns, tx, ty, unroll, tile)
    kernel = _word_row_kernel(kind, tx, ty, unroll)
    grid = (-(-nv // ty), -(-(-(-ns // WORD_CALLS)) // tile))
    launch.launch_numba(kernel, 0, g, _words_of(g), np.int64(tile), out, threads=(tx, ty), grid=grid)
    return out[:, None, :]


def variant_call_counts_gpu_previous(g, n_alleles: int = 2, *, tx=None, ty=None, unroll: int = 4, tile=None):
    return _word_row_counts("calls", g, CLASSES + 2, tx, ty, unroll, tile)


def variant_genotype_counts_gpu_previous(g, n_alleles: int = 2, *, tx=None, ty=None, unroll: int = 4, tile=None):
    return _word_row_counts("genotypes", g, 4, tx, ty, unroll, tile)


def sample_call_counts_gpu_previous(g, *, threads: int = THREADS_PER_BLOCK, unroll: int = 4, vtile: int | None = None):
    """The per-sample word kernel: a thread a word (four samples) and a tile of ``vtile``
    variants (int8 diploid biallelic calls, C-contiguous, at an address that is a multiple of 8)."""
    import cupy

    g = cupy.ascontiguousarray(g)
    nv, ns, _ = g.shape
    out = cupy.zeros((ns, CLASSES), np.int64)
    vtile = vtile or word_sample_tile(nv, ns)
    grid = (-(-(-(-ns // WORD_CALLS)) // threads), -(-nv // vtile))
    launch.launch_numba(_word_sample_kernel(unroll), 0, g, _words_of(g), np.int64(vtile), out, threads=threads, grid=grid)
    return out[None]


# --- per-call allele counts: the Numba CUDA kernels (the package's are CUDA C, cuda/calls.cu) -------


@launch.once
def _call_kernel(ploidy: int, n_alleles: int):
    call_alleles = cuda.jit(device=True)(_call_alleles)

    @launch.cuda_kernel
    def call_counts(g, out):
        i = cuda.grid(1)
        ns = g.shape[1]
        if i < g.shape[0] * ns:
            call_alleles(g, i // ns, i % ns, ploidy, n_alleles, out)

    return call_counts


@launch.once
def _word_call_kernel(unroll: int):
    """The per-call word kernel: a word of counts written for each whole word of calls,
    grid-stride. A word with other values than 0, 1, -1 and -2 has its calls counted one by one
    (``_call_alleles``) from its own bytes, so that the kernel writes the counts through one array
    only (the simulator copies each argument apart, and two views of the output would not see
    each other's writes)."""
    word_bytes, word_call_alleles = (cuda.jit(device=True)(f) for f in (_word_bytes, _word_call_alleles))
    call_alleles = cuda.jit(device=True)(_call_alleles)

    @cuda.jit(device=True)
    def count_word(x, calls, counts):
        bad, neg, low = word_bytes(x)
        if bad == 0:
            return word_call_alleles(neg, low)
        for b in range(2 * WORD_CALLS):
            byte = np.int64((x >> np.uint64(8 * b)) & np.uint64(0xFF))
            calls[0, b // 2, b % 2] = byte - 256 * (byte >> 7)  # its int8 value
        y = np.uint64(0)
        for j in range(WORD_CALLS):
            call_alleles(calls, 0, j, 2, 2, counts)
            for a in range(2):
                y |= np.uint64(counts[0, j, a]) << np.uint64(16 * j + 8 * a)
        return y

    @launch.cuda_kernel
    def word_call_counts(words, out_words):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        nw = words.shape[0]
        calls = cuda.local.array((1, WORD_CALLS, 2), np.int8)
        counts = cuda.local.array((1, WORD_CALLS, 2), np.uint8)
        buf = cuda.local.array(unroll, np.uint64)
        q = i
        while q + (unroll - 1) * stride < nw:
            for u in range(unroll):
                buf[u] = words[q + u * stride]
            for u in range(unroll):
                out_words[q + u * stride] = count_word(buf[u], calls, counts)
            q += unroll * stride
        while q < nw:
            out_words[q] = count_word(words[q], calls, counts)
            q += stride

    return word_call_counts


def call_allele_counts_gpu_previous(g, n_alleles: int = 2, *, threads: int = THREADS_PER_BLOCK, unroll: int = 4):
    """The per-call counts: a word of calls a step (the word kernel, grid-stride) for int8 diploid
    biallelic calls at an address that is a multiple of 8, the calls past the last whole word (and
    any other calls) a thread a call."""
    import cupy

    g = cupy.ascontiguousarray(g)
    out = cupy.empty(g.shape[:2] + (n_alleles,), np.uint8)
    words = g.dtype == np.int8 and g.shape[2] == 2 and n_alleles == 2 and g.data.ptr % 8 == 0
    if words:
        w = _words_of(g)
        grid = max(1, -(-w.size // (threads * unroll)))
        launch.launch_numba(_word_call_kernel(unroll), 0, w, _words_of(out), threads=threads, grid=(grid,))
        v = WORD_CALLS * w.size // g.shape[1]  # the rows of the calls past the last whole word
        if v < g.shape[0]:
            launch.launch_numba(_call_kernel(2, 2), (g.shape[0] - v) * g.shape[1], g[v:], out[v:], threads=threads)
    elif g.size and n_alleles:
        launch.launch_numba(_call_kernel(g.shape[2], n_alleles), g.shape[0] * g.shape[1], g, out, threads=threads)
    return out
