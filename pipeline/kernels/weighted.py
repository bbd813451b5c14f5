"""Weighted sums over the trailing axes of a block, per leading index, in one pass on the GPU.

For each row ``t`` of a (rows, points) block, ``sum(w[p] * x[t, p])`` and ``sum(w[p])`` over the
valid (non-NaN) ``x``. A grid of (slices of a row, rows) blocks: each thread keeps four loads of
``x`` (and of ``w``) in flight, each block adds its slice in shared memory and writes one pair of
partial sums, and the partials of a row are added by a second, small reduction, so the result
does not depend on the order blocks finish in (no atomics). CuPy's ``ReductionKernel`` gives such
a reduction one block per row and reaches about a fifth of the memory bandwidth.

That kernel (kept as ``weighted_sums_gpu_previous``) reached 68% of the copy bandwidth on an H200.
For every 4-byte value it also read its 8-byte weight: weights that stay in L2, but that then
carries three times the traffic of the data, and each block of 8192 values ended in a tree of 8
``__syncthreads``. The kernel below (``weighted_rows_gpu``) gives each block a slice of points
over a tile of rows: a thread loads the weights of its ``U`` points once, into registers, and
walks the tile's rows, loading the next row's values before adding the current row's; each
row's sums are added across the warp by shuffles and across warps once per tile, in a fixed
order. Partial sums go to ``partial[row, field, slice]``, added per row by CuPy.
"""

from __future__ import annotations

import functools

import numpy as np

from .streaming import C_TYPES

THREADS = 256
PER_BLOCK = THREADS * 4 * 8  # elements of a row per block

_SOURCE = r"""
typedef {in_t} in_t;
extern "C" __global__ void pipeline_weighted_sums(const in_t* __restrict__ x, const double* __restrict__ w,
                                                  double* __restrict__ partial, long long npts, long long per_block) {{
    const long long t = blockIdx.y;
    const long long start = (long long)blockIdx.x * per_block;
    const long long end = min(npts, start + per_block);
    const in_t* row = x + t * npts;
    double sx = 0.0, sw = 0.0;
    long long i = start + threadIdx.x;
    const long long B = blockDim.x;
    for (; i + 3 * B < end; i += 4 * B) {{
        const double a = (double)row[i], b = (double)row[i + B], c = (double)row[i + 2 * B], d = (double)row[i + 3 * B];
        const double wa = w[i], wb = w[i + B], wc = w[i + 2 * B], wd = w[i + 3 * B];
        if (a == a) {{ sx += a * wa; sw += wa; }}
        if (b == b) {{ sx += b * wb; sw += wb; }}
        if (c == c) {{ sx += c * wc; sw += wc; }}
        if (d == d) {{ sx += d * wd; sw += wd; }}
    }}
    for (; i < end; i += B) {{
        const double a = (double)row[i];
        if (a == a) {{ sx += a * w[i]; sw += w[i]; }}
    }}
    __shared__ double shx[{threads}], shw[{threads}];
    shx[threadIdx.x] = sx;
    shw[threadIdx.x] = sw;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{
            shx[threadIdx.x] += shx[threadIdx.x + s];
            shw[threadIdx.x] += shw[threadIdx.x + s];
        }}
        __syncthreads();
    }}
    if (threadIdx.x == 0) {{
        const long long k = (t * gridDim.x + blockIdx.x) * 2;
        partial[k] = shx[0];
        partial[k + 1] = shw[0];
    }}
}}
"""


def source(in_dtype) -> str:
    return _SOURCE.format(in_t=C_TYPES[np.dtype(in_dtype)], threads=THREADS)


@functools.cache
def _kernel(in_dtype):
    import cupy

    return cupy.RawKernel(source(in_dtype), "pipeline_weighted_sums", options=("--fmad=false",))


def weighted_sums_gpu_previous(x2d, w1d):
    """(sum of w * x, sum of w) over the valid values of each row of a C-contiguous (rows, points)
    CuPy array, with one weight per point; two float64 arrays of length rows."""
    import cupy

    rows, npts = x2d.shape
    nblocks = max(1, (npts + PER_BLOCK - 1) // PER_BLOCK)
    partial = cupy.empty((rows, nblocks, 2), dtype=np.float64)
    w1d = cupy.ascontiguousarray(w1d, dtype=np.float64)
    _kernel(np.dtype(x2d.dtype))((nblocks, rows), (THREADS,), (x2d, w1d, partial, np.int64(npts), np.int64(PER_BLOCK)))
    sums = partial.sum(axis=1)
    return sums[:, 0], sums[:, 1]


# --- the kernel: weights in registers over a tile of rows --------------------------------------------

# measured on an H200 (730 x 1038240 float32): 128 threads, 8 points each, 64 rows: 87% of the
# copy bandwidth; 256 x 8 x 32: 84%; 128 x 4 x 64: 82%; 128 x 16 x 32: 88% (twice the registers)
TILE_THREADS = 128
TILE_U = 8  # points per thread in a slice (and loads in flight per row)
TILE_ROWS = 64  # rows per block

_TILED = r"""
typedef {in_t} in_t;
#define THREADS {threads}
#define U {unroll}
#define ROWS {rows}
#define WARPS (THREADS / 32)
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_weighted_sums_tiled(
        const in_t* __restrict__ x, const double* __restrict__ w, double* __restrict__ partial, long long nrows,
        long long npts) {{
    // block (slice, tile): points slice * THREADS * U + i * THREADS + threadIdx.x, i < U (coalesced for each i),
    // rows tile * ROWS .. + ROWS
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long base = (long long)blockIdx.x * THREADS * U + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * ROWS;
    const int nr = (int)min((long long)ROWS, nrows - r0);
    double wr[U];
    bool in[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {{
        in[i] = base + i * THREADS < npts;
        wr[i] = in[i] ? w[base + i * THREADS] : 0.0;
    }}
    __shared__ double sh[ROWS][WARPS][2];
    const in_t* row = x + r0 * npts + base;
    in_t cur[U], nxt[U];
#pragma unroll
    for (int i = 0; i < U; ++i) cur[i] = in[i] ? row[i * THREADS] : (in_t)0;
    for (int r = 0; r < nr; ++r) {{
        row += npts;
#pragma unroll
        for (int i = 0; i < U; ++i) nxt[i] = (in[i] && r + 1 < nr) ? row[i * THREADS] : (in_t)0;
        double sx = 0.0, sw = 0.0;
#pragma unroll
        for (int i = 0; i < U; ++i) {{
            const double v = (double)cur[i];
            if (in[i] && v == v) {{ sx += v * wr[i]; sw += wr[i]; }}
        }}
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {{
            sx += __shfl_down_sync(0xffffffffu, sx, o);
            sw += __shfl_down_sync(0xffffffffu, sw, o);
        }}
        if (lane == 0) {{ sh[r][warp][0] = sx; sh[r][warp][1] = sw; }}
#pragma unroll
        for (int i = 0; i < U; ++i) cur[i] = nxt[i];
    }}
    __syncthreads();
    for (int q = threadIdx.x; q < 2 * nr; q += THREADS) {{  // q = 2 * row + field
        double s = 0.0;
        for (int k = 0; k < WARPS; ++k) s += sh[q >> 1][k][q & 1];
        partial[((r0 + (q >> 1)) * 2 + (q & 1)) * gridDim.x + blockIdx.x] = s;
    }}
}}
"""


def tiled_source(in_dtype, threads: int = TILE_THREADS, unroll: int = TILE_U, rows: int = TILE_ROWS) -> str:
    return _TILED.format(in_t=C_TYPES[np.dtype(in_dtype)], threads=threads, unroll=unroll, rows=rows)


@functools.cache
def _tiled(in_dtype, threads: int, unroll: int, rows: int):
    import cupy

    src = tiled_source(in_dtype, threads, unroll, rows)
    return cupy.RawKernel(src, "pipeline_weighted_sums_tiled", options=("--fmad=false",))


def weighted_partials_gpu(x2d, w1d, threads: int = TILE_THREADS, unroll: int = TILE_U, rows: int = TILE_ROWS):
    """The kernel's partial sums, float64 (rows, 2, slices): [:, 0] of w * x, [:, 1] of w."""
    import cupy

    nrows, npts = x2d.shape
    span = threads * unroll
    nslices = max(1, -(-npts // span))
    partial = cupy.empty((nrows, 2, nslices), dtype=np.float64)
    if nrows == 0:
        return partial
    w1d = cupy.ascontiguousarray(w1d, dtype=np.float64)
    kernel = _tiled(np.dtype(x2d.dtype), threads, unroll, rows)
    kernel((nslices, -(-nrows // rows)), (threads,), (cupy.ascontiguousarray(x2d), w1d, partial, np.int64(nrows), np.int64(npts)))
    return partial


def weighted_partials_twin(x2d, w1d, threads: int = TILE_THREADS, unroll: int = TILE_U):
    """What :func:`weighted_partials_gpu` computes, on the CPU, in the kernel's order of additions:
    per lane over its ``U`` points, then the shuffle tree of each warp, then the warps in order."""
    nrows, npts = x2d.shape
    span = threads * unroll
    nslices = max(1, -(-npts // span))
    x = np.zeros((nrows, nslices * span), dtype=np.float64)
    x[:, :npts] = x2d
    w = np.zeros(nslices * span)
    w[:npts] = w1d
    valid = np.zeros(x.shape, dtype=bool)
    valid[:, :npts] = ~np.isnan(x[:, :npts])
    # point slice * span + i * threads + warp * 32 + lane
    shape = (nrows, nslices, unroll, threads // 32, 32)
    x, valid, w = x.reshape(shape), valid.reshape(shape), np.broadcast_to(w.reshape(shape[1:]), shape)
    out = np.empty((nrows, 2, nslices))
    for f, term in enumerate((np.where(valid, x * w, 0.0), np.where(valid, w, 0.0))):
        lanes = np.zeros(shape[:2] + shape[3:])
        for i in range(unroll):
            lanes = lanes + term[:, :, i]
        for o in (16, 8, 4, 2, 1):  # lane l adds lane l + o
            lanes = lanes[..., :o] + lanes[..., o : 2 * o]
        s = np.zeros(shape[:2])
        for k in range(threads // 32):
            s = s + lanes[:, :, k, 0]
        out[:, f] = s
    return out


def weighted_rows_gpu(x2d, w1d):
    """(sum of w * x, sum of w) over the valid values of each row of a (rows, points) CuPy array,
    with one weight per point; two float64 arrays of length rows."""
    sums = weighted_partials_gpu(x2d, w1d).sum(axis=2)
    return sums[:, 0], sums[:, 1]


# --- the kernels of the weighted-mean reduction: one block to its partial {wx, w} ------------------

ACC = np.float64


def weighted_sums_cpu(x, w, axis) -> dict:
    """Partial of a weighted mean over ``axis`` (kept with length 1): sum(w * x) and sum(w) over
    the valid values of ``x``, float64. Array formulas, on the array module of ``x``."""
    from ..backend import xp_of

    xp = xp_of(x)
    valid = ~xp.isnan(x)
    wx = xp.where(valid, x.astype(ACC, copy=False) * w, 0.0)
    wsum = xp.where(valid, w, 0).astype(ACC, copy=False)
    return {"wx": wx.sum(axis=axis, keepdims=True), "w": wsum.sum(axis=axis, keepdims=True)}


@functools.cache
def _weighted_sum_reduction():
    import cupy

    # One pass for both sums: each element maps to the complex number (w*x, w), zero where x is
    # NaN, and complex addition adds the two parts independently. Two real reductions would read
    # the block twice.
    return cupy.ReductionKernel(
        "T x, float64 w",
        "complex128 y",
        "x == x ? complex<double>((double)x * w, w) : complex<double>(0.0, 0.0)",
        "a + b",
        "y = a",
        "complex<double>(0.0, 0.0)",
        "pipeline_weighted_sums",
        options=("--fmad=false",),
    )


def weighted_sums_gpu(x, w, axis) -> dict:
    """:func:`weighted_sums_cpu` on a CuPy block."""
    import cupy

    w = cupy.asarray(w)
    lead = x.ndim - len(axis)
    trailing = tuple(axis) == tuple(range(lead, x.ndim))
    if trailing and x.flags.c_contiguous and w.shape == x.shape and all(st == 0 for st in w.strides[:lead]):
        # the usual case: weights that vary only along the reduced axes (cos(lat)), and a block
        # laid out with those axes last: one pass of the two-stage kernel
        rows = int(np.prod(x.shape[:lead], dtype=np.int64))
        wx, ws = weighted_rows_gpu(x.reshape(rows, -1), w[(0,) * lead].reshape(-1))
        shape = (*x.shape[:lead], *(1,) * len(axis))
        return {"wx": wx.reshape(shape), "w": ws.reshape(shape)}
    sums = _weighted_sum_reduction()(x, w.astype(np.float64, copy=False), axis=axis, keepdims=True)
    return {"wx": sums.real.copy(), "w": sums.imag.copy()}

