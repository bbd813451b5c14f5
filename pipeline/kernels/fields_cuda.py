"""Numba CUDA kernels of :mod:`pipeline.kernels.fields` (imported on first GPU use; ``cuda`` must
be a global of this module for Numba's CUDA simulator)."""

import functools

import numpy as np

from ._numba_cuda import cuda

from .fields import make_trend_columns


@functools.cache
def trend_kernels(deg: int) -> dict:
    """The kernels for polynomials of degree ``deg``, one thread per grid point ``p`` of a 2-D
    ``x[t, p]``, ``u[t]`` the coordinate: ``sums`` (normal equations), ``subtract`` (given the
    coefficients ``c[k, p]``) and ``detrend`` (both, with the solve between)."""
    m, n = deg + 1, 2 * deg + 1
    sums, solve, subtract = make_trend_columns(cuda.jit(device=True), deg)

    @cuda.jit
    def sums_kernel(x, u, s_out, b_out):
        p = cuda.grid(1)
        if p < x.shape[1]:
            s = cuda.local.array(n, np.float64)
            b = cuda.local.array(m, np.float64)
            sums(x, u, p, s, b)
            for k in range(n):
                s_out[k, p] = s[k]
            for k in range(m):
                b_out[k, p] = b[k]

    @cuda.jit
    def subtract_kernel(x, u, c_in, out):
        p = cuda.grid(1)
        if p < x.shape[1]:
            c = cuda.local.array(m, np.float64)
            for k in range(m):
                c[k] = c_in[k, p]
            subtract(x, u, c, out, p)

    @cuda.jit
    def detrend_kernel(x, u, out):
        p = cuda.grid(1)
        if p < x.shape[1]:
            s = cuda.local.array(n, np.float64)
            b = cuda.local.array(m, np.float64)
            a = cuda.local.array((m, m), np.float64)
            sums(x, u, p, s, b)
            solve(s, b, a)
            subtract(x, u, b, out, p)

    return {"sums": sums_kernel, "subtract": subtract_kernel, "detrend": detrend_kernel}
