"""The GPU kernels that the package's current ones replaced, kept for comparison in
``ops_bandwidth.py`` (rows named ``<name>_previous``), and the CPU loops of the previous group
kernels, which the tests use as a second reference for the current ones.

- weighted sums: one block per slice of a row, the weights read with every value, a tree of
  ``__syncthreads`` per block (CUDA C);
- moments, rolling means, group sums and spells: the per-point loops under Numba CUDA, one thread
  per grid point (the moments and rolling loops are those of the package, whose CPU kernels and
  twins they remain; the group loops are here);
- detrend: the Numba ``detrend`` kernel alone, which reads each series twice (the package still
  uses it where the tile kernel does not fit).

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
