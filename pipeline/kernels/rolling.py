"""Moving-window mean along one axis: a running sum per grid point, NaN-skipping.

The kernel sees a 2-D block ``x[t, p]`` (window axis first, all other axes flattened into grid
points ``p``) and writes, for every ``t``, the mean of the valid values in
``x[t - before : t + after + 1, p]``, or NaN where fewer than ``min_periods`` are valid. Indices
outside the block count as missing, which is what the edges of the whole array need; inside the
array, the caller (``map_overlap``) supplies ``before`` rows of halo ahead of each block and
``after`` rows behind it.

Sums run in float64 and add the entering value and subtract the leaving one, as bottleneck's
``move_mean`` does, so the cost per point does not grow with the window.
"""

from __future__ import annotations

import functools
import math

import numpy as np

THREADS_PER_BLOCK = 256


def make_rolling_column(jit):
    """The per-point loop, compiled by ``jit`` (``numba.njit`` or ``cuda.jit(device=True)``).

    Away from the block's edges four steps are taken at once, their eight loads (entering and
    leaving values) issued before any is used, for memory-level parallelism on the GPU.
    """

    @jit
    def step(out, min_periods, p, t, enter, leave, total, count):
        # an index outside the block arrives as NaN: it counts as missing, as a NaN value does
        if enter == enter:
            total += enter
            count += 1
        if leave == leave:
            total -= leave
            count -= 1
        if count >= min_periods and count > 0:
            out[t, p] = total / count
        else:
            out[t, p] = math.nan
        return total, count

    @jit
    def column(x, out, before, after, min_periods, p):
        nt = x.shape[0]
        total = 0.0
        count = 0
        # prime the window of t = 0 with x[0 .. after - 1]; each step adds x[t + after]
        for s in range(min(after, nt)):
            v = float(x[s, p])  # float64 sums, compiled or simulated
            if v == v:
                total += v
                count += 1
        t = 0
        while t < nt:
            if t - before - 1 >= 0 and t + after + 3 < nt:
                e0, e1, e2, e3 = float(x[t + after, p]), float(x[t + after + 1, p]), float(x[t + after + 2, p]), float(x[t + after + 3, p])
                l0, l1, l2, l3 = float(x[t - before - 1, p]), float(x[t - before, p]), float(x[t - before + 1, p]), float(x[t - before + 2, p])
                total, count = step(out, min_periods, p, t, e0, l0, total, count)
                total, count = step(out, min_periods, p, t + 1, e1, l1, total, count)
                total, count = step(out, min_periods, p, t + 2, e2, l2, total, count)
                total, count = step(out, min_periods, p, t + 3, e3, l3, total, count)
                t += 4
            else:
                enter = float(x[t + after, p]) if t + after < nt else math.nan
                leave = float(x[t - before - 1, p]) if t - before - 1 >= 0 else math.nan
                total, count = step(out, min_periods, p, t, enter, leave, total, count)
                t += 1

    return column


@functools.cache
def _cpu_kernel():
    import numba

    column = make_rolling_column(numba.njit(nogil=True))

    @numba.njit(nogil=True)
    def rolling_mean_2d(x, out, before, after, min_periods):
        for p in range(x.shape[1]):
            column(x, out, before, after, min_periods, p)

    return rolling_mean_2d


def _gpu_kernel():
    from .rolling_cuda import rolling_mean_2d

    return rolling_mean_2d


def launch_gpu(x2d, out2d, before: int, after: int, min_periods: int, stream=0):
    """Launch the CUDA kernel on 2-D device arrays (CuPy, Numba, or NumPy under the simulator)."""
    npts = x2d.shape[1]
    blocks = max(1, (npts + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)
    _gpu_kernel()[blocks, THREADS_PER_BLOCK, stream](x2d, out2d, before, after, min_periods)




def rolling_mean_cpu(block, axis: int, before: int, after: int, min_periods: int, out_dtype):
    x = np.ascontiguousarray(np.moveaxis(block, axis, 0))
    shape = x.shape
    x2 = x.reshape(shape[0], -1)
    out = np.empty(x2.shape, dtype=out_dtype)
    _cpu_kernel()(x2, out, before, after, min_periods)
    return np.moveaxis(out.reshape(shape), 0, axis)


def rolling_mean_gpu(block, axis: int, before: int, after: int, min_periods: int, out_dtype):
    import cupy
    from numba import cuda

    x = cupy.ascontiguousarray(cupy.moveaxis(block, axis, 0))
    shape = x.shape
    x2 = x.reshape(shape[0], -1)
    out = cupy.empty(x2.shape, dtype=out_dtype)
    # launch on CuPy's current stream, so the kernel is ordered with the CuPy work around it
    stream = cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    launch_gpu(x2, out, before, after, min_periods, stream=stream)
    return cupy.moveaxis(out.reshape(shape), 0, axis)
