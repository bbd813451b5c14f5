"""Count, mean and sum of squared deviations along the first axis of ``x[t, p]``, in one pass.

On the GPU one thread walks one grid point's steps with Welford's update, so a block of data is
read once (CuPy's NaN-skipping reductions would read it once per statistic and once more for the
deviations). On the CPU the two-pass NumPy formula of :mod:`pipeline.reductions` is used: NumPy's
reductions are vectorized along the points and need no compilation.
"""

from __future__ import annotations

import numpy as np

THREADS_PER_BLOCK = 256


def make_welford_column(jit):
    """The per-point loop, compiled by ``jit`` (``numba.njit`` or ``cuda.jit(device=True)``).

    Four steps are loaded before any is used: a thread then has four loads in flight, not one,
    which the GPU needs to approach its memory bandwidth (see :mod:`pipeline.kernels.streaming`).
    """

    @jit
    def update(count, mu, s, v):
        if v == v:
            count += 1
            d = v - mu
            mu += d / count
            s += d * (v - mu)
        return count, mu, s

    @jit
    def column(x, n, mean, m2, p):
        count = 0
        mu = 0.0
        s = 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            # float(): accumulate in float64, compiled or in the CUDA simulator alike
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            count, mu, s = update(count, mu, s, v0)
            count, mu, s = update(count, mu, s, v1)
            count, mu, s = update(count, mu, s, v2)
            count, mu, s = update(count, mu, s, v3)
            t += 4
        while t < nt:
            count, mu, s = update(count, mu, s, float(x[t, p]))
            t += 1
        n[p] = count
        mean[p] = mu
        m2[p] = s

    return column


def launch_gpu(x2d, n, mean, m2):
    from .moments_cuda import welford

    blocks = max(1, (x2d.shape[1] + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)
    welford[blocks, THREADS_PER_BLOCK](x2d, n, mean, m2)


def moments_gpu(block, axis: int) -> dict:
    """{n, mean, m2} of a CuPy block over ``axis`` (kept with length 1), float64."""
    import cupy

    moved = cupy.moveaxis(block, axis, 0)
    rest = moved.shape[1:]
    x2 = cupy.ascontiguousarray(moved).reshape(moved.shape[0], -1)
    out = {k: cupy.empty(x2.shape[1], dtype=np.float64) for k in ("n", "mean", "m2")}
    launch_gpu(x2, out["n"], out["mean"], out["m2"])
    return {k: cupy.expand_dims(v.reshape(rest), axis) for k, v in out.items()}
