"""Weighted sums over the trailing axes of a block, per leading index, in one pass on the GPU.

For each row ``t`` of a (rows, points) block, ``sum(w[p] * x[t, p])`` and ``sum(w[p])`` over the
valid (non-NaN) ``x``. A grid of (slices of a row, rows) blocks: each thread keeps four loads of
``x`` (and of ``w``) in flight, each block adds its slice in shared memory and writes one pair of
partial sums, and the partials of a row are added by a second, small reduction, so the result
does not depend on the order blocks finish in (no atomics). CuPy's ``ReductionKernel`` gives such
a reduction one block per row and reaches about a fifth of the memory bandwidth.
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


def weighted_sums_gpu(x2d, w1d):
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
