"""Count, mean and sum of squared deviations along the first axis of ``x[t, p]``, in one pass.

On the GPU one thread walks one grid point's steps, so a block of data is read once (CuPy's NaN-skipping reductions would read it once per statistic and once more for the
deviations). On the CPU the two-pass NumPy formula of :mod:`pipeline.reductions` is used: NumPy's
reductions are vectorized along the points and need no compilation.
"""

from __future__ import annotations

import numpy as np

THREADS_PER_BLOCK = 256


def make_moments_column(jit):
    """The per-point loop, compiled by ``jit`` (``numba.njit`` or ``cuda.jit(device=True)``).

    Sums of deviations from a shift (the point's first valid value) give the mean and M2 with
    no division per element, which would make the loop compute-bound in float64; with the shift
    inside the data's range the cancellation in ``M2 = S2 - S1^2 / n`` stays at float64 rounding.
    Four steps are loaded before any is used: a thread then has four loads in flight, not one,
    which the GPU needs to approach its memory bandwidth (see :mod:`pipeline.kernels.streaming`).
    """

    @jit
    def update(count, shift, s1, s2, v):
        if v == v:
            if count == 0:
                shift = v
            d = v - shift
            count += 1
            s1 += d
            s2 += d * d
        return count, shift, s1, s2

    @jit
    def column(x, n, mean, m2, p):
        count, shift, s1, s2 = 0, 0.0, 0.0, 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            # float(): accumulate in float64, compiled or in the CUDA simulator alike
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            count, shift, s1, s2 = update(count, shift, s1, s2, v0)
            count, shift, s1, s2 = update(count, shift, s1, s2, v1)
            count, shift, s1, s2 = update(count, shift, s1, s2, v2)
            count, shift, s1, s2 = update(count, shift, s1, s2, v3)
            t += 4
        while t < nt:
            count, shift, s1, s2 = update(count, shift, s1, s2, float(x[t, p]))
            t += 1
        n[p] = count
        if count > 0:
            mean[p] = shift + s1 / count
            m2[p] = max(s2 - s1 * s1 / count, 0.0)
        else:
            mean[p] = 0.0
            m2[p] = 0.0

    return column


def launch_gpu(x2d, n, mean, m2):
    from ._numba_cuda import launch
    from .moments_cuda import moments

    launch(moments, x2d.shape[1], THREADS_PER_BLOCK, x2d, n, mean, m2)


def moments_gpu(block, axis: int) -> dict:
    """{n, mean, m2} of a CuPy block over ``axis`` (kept with length 1), float64."""
    import cupy

    moved = cupy.moveaxis(block, axis, 0)
    rest = moved.shape[1:]
    x2 = cupy.ascontiguousarray(moved).reshape(moved.shape[0], -1)
    out = {k: cupy.empty(x2.shape[1], dtype=np.float64) for k in ("n", "mean", "m2")}
    launch_gpu(x2, out["n"], out["mean"], out["m2"])
    return {k: cupy.expand_dims(v.reshape(rest), axis) for k, v in out.items()}
