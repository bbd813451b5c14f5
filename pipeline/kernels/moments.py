"""Count, mean and sum of squared deviations along the first axis of ``x[t, p]``, in one pass.

On the GPU one thread walks one grid point's steps with Welford's update, so a block of data is
read once (CuPy's NaN-skipping reductions would read it once per statistic and once more for the
deviations). On the CPU the two-pass NumPy formula of :mod:`pipeline.reductions` is used: NumPy's
reductions are vectorized along the points and need no compilation.
"""

from __future__ import annotations

import numpy as np

THREADS_PER_BLOCK = 256


def _welford_column(x, n, mean, m2, p):
    count = 0
    mu = 0.0
    s = 0.0
    for t in range(x.shape[0]):
        v = float(x[t, p])  # float64 in compiled code and in the simulator alike
        if v == v:
            count += 1
            d = v - mu
            mu += d / count
            s += d * (v - mu)
    n[p] = count
    mean[p] = mu
    m2[p] = s


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
