"""Coarsening on the GPU: the mean of every window in one read, CUDA C.

The CPU kernel (:func:`pipeline.kernels.fields.coarsen_mean`) is array formulas: a mask of the
valid values, a masked copy, and two sums over the window axes of a reshaped view. On CuPy those
are several passes over the block and reductions over strided axes: 2-3% of the copy bandwidth
for the whole op on an H200 (benchmarks/ops_bandwidth.py). Here one thread makes one output
value: it loads its whole window (the window's factors are compiled in, and windows of up to 64
values are loaded whole before they are added), adds the valid values in float64 and writes
their mean, so the block is read once and the output written once.

The block may be any strided view (the op trims each coarsened axis to a multiple of its
factor, which slices the block). :func:`axis_groups` describes it as at most four (length,
factor, stride) axes, merging neighbouring axes that are not coarsened where their strides
allow; the kernel's output is C-ordered over those axes, which is the block's own order.
:func:`coarsen_groups_cpu` does the same indexing with NumPy strides, so that the grouping is
checked on every CI run.
"""

from __future__ import annotations

import functools

import numpy as np

THREADS = 256
MAX_GROUPS = 4

_SOURCE = r"""
typedef {in_t} in_t;
typedef {out_t} out_t;
typedef {idx_t} idx_t;
#define F0 {f0}
#define F1 {f1}
#define F2 {f2}
#define F3 {f3}
extern "C" __global__ void __launch_bounds__({threads}) pipeline_coarsen_mean(
        const in_t* __restrict__ x, out_t* __restrict__ out, idx_t m1, idx_t m2, idx_t m3,
        long long s0, long long s1, long long s2, long long s3, idx_t total) {{
    const idx_t o = (idx_t)blockIdx.x * {threads} + threadIdx.x;
    if (o >= total) return;
    // output (o0, o1, o2, o3), C order; its window starts at (o0 F0, o1 F1, o2 F2, o3 F3)
    idx_t r = o;
    const idx_t o3 = r % m3; r /= m3;
    const idx_t o2 = r % m2; r /= m2;
    const idx_t o1 = r % m1;
    const idx_t o0 = r / m1;
    const in_t* w = x + (long long)o0 * F0 * s0 + (long long)o1 * F1 * s1 + (long long)o2 * F2 * s2 + (long long)o3 * F3 * s3;
    double acc = 0.0;
    int n = 0;
#if F0 * F1 * F2 * F3 <= 64
    // every load of the window first, then the sums: the whole window's loads in flight
    in_t v[F0 * F1 * F2 * F3];
#pragma unroll
    for (int i0 = 0; i0 < F0; ++i0)
#pragma unroll
        for (int i1 = 0; i1 < F1; ++i1)
#pragma unroll
            for (int i2 = 0; i2 < F2; ++i2)
#pragma unroll
                for (int i3 = 0; i3 < F3; ++i3)
                    v[((i0 * F1 + i1) * F2 + i2) * F3 + i3] = w[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
#pragma unroll
    for (int i = 0; i < F0 * F1 * F2 * F3; ++i) {{
        const bool ok = v[i] == v[i];  // NaN is skipped (always true for integers)
        acc += ok ? (double)v[i] : 0.0;
        n += ok;
    }}
#else
    // a larger window: added as it is loaded, the innermost loop unrolled by 8
    for (int i0 = 0; i0 < F0; ++i0)
        for (int i1 = 0; i1 < F1; ++i1)
            for (int i2 = 0; i2 < F2; ++i2) {{
                const in_t* row = w + i0 * s0 + i1 * s1 + i2 * s2;
#pragma unroll 8
                for (int i3 = 0; i3 < F3; ++i3) {{
                    const in_t vi = row[i3 * s3];
                    const bool ok = vi == vi;
                    acc += ok ? (double)vi : 0.0;
                    n += ok;
                }}
            }}
#endif
    out[o] = n > 0 ? (out_t)(acc / n) : (out_t)__longlong_as_double(0x7ff8000000000000LL);
}}
"""

def axis_groups(shape, strides, factors: dict[int, int]):
    """The block as (length, factor, stride) axes, strides in elements: axes of length 1 dropped,
    and runs of axes that are not coarsened merged where one stride follows from the next. None
    if more than :data:`MAX_GROUPS` remain."""
    groups: list[tuple[int, int, int]] = []
    for axis, (n, s) in enumerate(zip(shape, strides)):
        f = int(factors.get(axis, 1))
        if n == 1 and f == 1:
            continue
        if f == 1 and groups and groups[-1][1] == 1 and groups[-1][2] == n * s:
            n0, _, _ = groups[-1]
            groups[-1] = (n0 * n, 1, s)
            continue
        groups.append((int(n), f, int(s)))
    if len(groups) > MAX_GROUPS:
        return None
    return [(1, 1, 0)] * (MAX_GROUPS - len(groups)) + groups


def source(in_dtype, out_dtype, window: tuple[int, int, int, int], wide: bool, threads: int = THREADS) -> str:
    from .streaming import C_TYPES

    f0, f1, f2, f3 = window
    return _SOURCE.format(in_t=C_TYPES[np.dtype(in_dtype)], out_t=C_TYPES[np.dtype(out_dtype)],
                          idx_t="long long" if wide else "unsigned int", f0=f0, f1=f1, f2=f2, f3=f3, threads=threads)


@functools.cache
def _raw(in_dtype, out_dtype, window, wide: bool):
    import cupy

    return cupy.RawKernel(source(in_dtype, out_dtype, window, wide), "pipeline_coarsen_mean")


def _plan(block, factors: dict[int, int]):
    """The groups of ``block`` for the kernel, or None where the kernel does not take it."""
    from .streaming import C_TYPES

    if np.dtype(block.dtype) not in C_TYPES or any(s % block.itemsize for s in block.strides):
        return None
    return axis_groups(block.shape, [s // block.itemsize for s in block.strides], factors)


def out_shape(shape, factors: dict[int, int]) -> tuple[int, ...]:
    return tuple(n // int(factors.get(axis, 1)) for axis, n in enumerate(shape))


def coarsen_mean_gpu(block, factors: dict[int, int], out_dtype):
    """:func:`pipeline.kernels.fields.coarsen_mean` on a CuPy block, by the kernel above (blocks
    of types or windows it does not take: by the array formulas)."""
    import cupy

    from .fields import coarsen_mean

    groups = _plan(block, factors)
    if groups is None:
        contiguous = cupy.ascontiguousarray(block)
        groups = _plan(contiguous, factors)
        if groups is None:
            return coarsen_mean(block, factors, out_dtype)
        block = contiguous
    out = cupy.empty(out_shape(block.shape, factors), dtype=out_dtype)
    total = out.size
    if total == 0:
        return out
    (_, f0, s0), (m1n, f1, s1), (m2n, f2, s2), (m3n, f3, s3) = groups
    m1, m2, m3 = m1n // f1, m2n // f2, m3n // f3
    wide = total >= 2**31
    idx = np.int64 if wide else np.uint32
    kernel = _raw(np.dtype(block.dtype), np.dtype(out_dtype), (f0, f1, f2, f3), wide)
    kernel((-(-total // THREADS),), (THREADS,), (block, out, idx(m1), idx(m2), idx(m3), np.int64(s0), np.int64(s1),
                                                  np.int64(s2), np.int64(s3), idx(total)))
    return out


def coarsen_groups_cpu(block: np.ndarray, factors: dict[int, int], out_dtype) -> np.ndarray:
    """The kernel's indexing with NumPy: the block seen through its groups' lengths and strides
    (four axes), coarsened by the CPU kernel, in the block's own shape."""
    from .fields import coarsen_mean

    groups = axis_groups(block.shape, [s // block.itemsize for s in block.strides], factors)
    assert groups is not None, "more groups than the kernel takes"
    view = np.lib.stride_tricks.as_strided(block, shape=[n for n, _, _ in groups],
                                           strides=[s * block.itemsize for _, _, s in groups], writeable=False)
    out = coarsen_mean(view, {i: f for i, (_, f, _) in enumerate(groups) if f > 1}, out_dtype)
    return out.reshape(out_shape(block.shape, factors))


def coarsen_mean_cpu(block, factors: dict[int, int], out_dtype):
    from .fields import coarsen_mean

    return coarsen_mean(block, factors, out_dtype)

