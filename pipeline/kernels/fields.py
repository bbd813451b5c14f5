"""Kernels of the field ops (:mod:`pipeline.ops.fields`): block means, polynomial trends,
quantiles along one axis, and saturation vapour pressure.

Block means and quantiles are written against the array module of their input (:func:`xp_of`),
so the same code runs on NumPy and CuPy chunks; saturation vapour pressure is one NumPy
expression on the CPU and one fused CuPy kernel on the GPU, as in
:mod:`pipeline.kernels.elementwise`. Trends are NumPy formulas on the CPU (the twins of the GPU
kernels); on the GPU, Numba CUDA kernels, one thread per grid point, and a CUDA C kernel that
detrends a block holding the whole axis in one read (:mod:`pipeline.kernels.detrend`). Sums run
in float64 so that float32 data come out within float32 rounding of a float64 reference.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..backend import is_cupy, xp_of
from ..reduce.aggregation import Aggregation, _sum_fields
from .streaming import Spec

ACC = np.float64


# --- coarsen: mean of non-overlapping windows ----------------------------------------------------


def coarsen_mean(block, factors: dict[int, int], out_dtype):
    """Mean of the valid values of each window of ``factors[axis]`` steps along each axis.

    Every coarsened axis of ``block`` is a multiple of its factor (the op rechunks so), so the
    windows are a reshape (n, ...) -> (n / f, f, ...) and a sum over the new ``f`` axes.
    """
    xp = xp_of(block)
    shape, window_axes = [], []
    for axis, n in enumerate(block.shape):
        f = factors.get(axis)
        if f is None:
            shape.append(n)
        else:
            shape += [n // f, f]
            window_axes.append(len(shape) - 1)
    x = block.reshape(shape)
    valid = ~xp.isnan(x)
    axes = tuple(window_axes)
    total = xp.where(valid, x, 0).sum(axis=axes, dtype=ACC)
    n = valid.sum(axis=axes, dtype=ACC)
    return xp.where(n > 0, total / xp.where(n > 0, n, 1), xp.nan).astype(out_dtype, copy=False)


# --- detrend: least-squares polynomial per grid point, as normal equations ----------------------


def polyfit_chunk(x, u, axis, deg: int):
    """Partial sums of the normal equations over one block: S_k = Σ u^k and T_k = Σ u^k x over
    the valid samples, k = 0..2 deg and 0..deg, with ``axis`` kept at length 1. (``u`` is the
    coordinate broadcast to the block; on the GPU a Numba CUDA kernel makes the sums.)"""
    if is_cupy(x):
        return polyfit_chunk_gpu(x, u, axis, deg)
    return polyfit_chunk_xp(x, u, axis, deg)


def polyfit_chunk_xp(x, u, axis, deg: int):
    """:func:`polyfit_chunk` by array formulas (NumPy or CuPy): the CPU kernel, and the previous GPU one."""
    xp = xp_of(x)
    valid = ~xp.isnan(x)
    uk = xp.where(valid, u.astype(ACC, copy=False), 0.0)
    xv = xp.where(valid, x, 0).astype(ACC, copy=False)
    power = valid.astype(ACC)  # u^0 on valid samples
    out = {}
    for k in range(2 * deg + 1):
        out[f"s{k}"] = power.sum(axis=axis, keepdims=True)
        if k <= deg:
            out[f"t{k}"] = (power * xv).sum(axis=axis, keepdims=True)
        power = power * uk
    return out


def polyfit_finalize(p, axis: int, deg: int):
    """Coefficients c_0..c_deg of Σ c_k u^k, stacked along ``axis``; NaN where fewer than deg + 1
    samples are valid (the normal matrix is singular there)."""
    xp = xp_of(p["s0"])
    m = deg + 1
    a = xp.stack([xp.stack([p[f"s{i + j}"] for j in range(m)], axis=-1) for i in range(m)], axis=-2)
    b = xp.stack([p[f"t{i}"] for i in range(m)], axis=-1)[..., None]
    enough = p["s0"] >= m
    # NumPy's solve raises on one singular matrix in the batch: solve the identity there instead
    a = xp.where(enough[..., None, None], a, xp.eye(m, dtype=ACC))
    c = xp.linalg.solve(a, b)[..., 0]
    c = xp.where(enough[..., None], c, xp.nan)
    return xp.concatenate([c[..., k] for k in range(m)], axis=axis)


def polyfit(axis: int, deg: int) -> Aggregation:
    """Blueprint of the reduction to coefficients along ``axis`` (the weights are u)."""
    return Aggregation(
        "pipeline-polyfit",
        functools.partial(polyfit_chunk, deg=deg),
        _sum_fields,
        functools.partial(polyfit_finalize, axis=axis, deg=deg),
    )


def polyval_subtract(x, u, *coefficients, out_dtype, axis=None):
    """x - Σ c_k u^k, by Horner's rule in float64 (``axis``, that of u, is for the GPU kernel)."""
    u = u.astype(ACC, copy=False)
    trend = coefficients[-1]
    for c in coefficients[-2::-1]:
        trend = trend * u + c
    return (x.astype(ACC, copy=False) - trend).astype(out_dtype, copy=False)


# --- detrend on the GPU: one thread per grid point ------------------------------------------------
#
# The formulas above make a float64 temporary the size of the block per power of u and per product
# (about ten passes over memory for deg 1). On the GPU, Numba CUDA kernels walk each point's steps
# instead (a warp reads 32 neighbouring points of one step, coalesced; four steps loaded ahead):
#
# - ``sums``: the partial normal equations of a block, S_k and T_k, in one read (chunked axis);
# - ``subtract``: x - Σ c_k u^k by Horner's rule, one read and one write;
# - ``detrend``: where the block holds the whole axis, both in one kernel, with the (deg + 1)^2
#   normal equations solved per point in between (Gaussian elimination with partial pivoting, as
#   LAPACK's getrf; NaN where fewer than deg + 1 samples are valid). It reads the block twice
#   (the fit needs every step before the first subtraction) and writes it once.


def make_trend_columns(jit, deg: int):
    """The per-point device functions for polynomials of degree ``deg`` (a compile-time constant,
    so that the loops over powers unroll and the sums stay in registers), compiled by ``jit``.
    ``s`` (2 deg + 1), ``b`` (deg + 1) and ``a`` ((deg + 1)^2) are the caller's scratch arrays."""
    m, n = deg + 1, 2 * deg + 1

    @jit
    def add(s, b, uu, v):
        if v == v:
            pw = 1.0
            for k in range(n):
                s[k] += pw
                if k < m:
                    b[k] += pw * v
                pw *= uu

    @jit
    def sums(x, u, p, s, b):
        for k in range(n):
            s[k] = 0.0
        for k in range(m):
            b[k] = 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            add(s, b, u[t], v0)
            add(s, b, u[t + 1], v1)
            add(s, b, u[t + 2], v2)
            add(s, b, u[t + 3], v3)
            t += 4
        while t < nt:
            add(s, b, u[t], float(x[t, p]))
            t += 1

    @jit
    def solve(s, b, a):
        """Overwrite ``b`` with the coefficients c_0..c_deg, or NaN where fewer than deg + 1
        samples are valid."""
        if s[0] < m:
            for k in range(m):
                b[k] = math.nan
            return
        for i in range(m):
            for j in range(m):
                a[i, j] = s[i + j]
        for c in range(m):
            piv = c
            for r in range(c + 1, m):
                if abs(a[r, c]) > abs(a[piv, c]):
                    piv = r
            if piv != c:
                for j in range(m):
                    a[c, j], a[piv, j] = a[piv, j], a[c, j]
                b[c], b[piv] = b[piv], b[c]
            for r in range(c + 1, m):
                f = a[r, c] / a[c, c]
                for j in range(c, m):
                    a[r, j] -= f * a[c, j]
                b[r] -= f * b[c]
        for i in range(m - 1, -1, -1):
            v = b[i]
            for j in range(i + 1, m):
                v -= a[i, j] * b[j]
            b[i] = v / a[i, i]

    @jit
    def trend(c, uu):
        r = c[m - 1]
        for k in range(m - 2, -1, -1):
            r = r * uu + c[k]
        return r

    @jit
    def subtract(x, u, c, out, p):
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            out[t, p] = v0 - trend(c, u[t])
            out[t + 1, p] = v1 - trend(c, u[t + 1])
            out[t + 2, p] = v2 - trend(c, u[t + 2])
            out[t + 3, p] = v3 - trend(c, u[t + 3])
            t += 4
        while t < nt:
            out[t, p] = float(x[t, p]) - trend(c, u[t])
            t += 1

    return sums, solve, subtract


THREADS_PER_BLOCK = 256


def _to_2d(x, axis: int):
    import cupy

    moved = cupy.moveaxis(x, axis, 0)
    return cupy.ascontiguousarray(moved).reshape(moved.shape[0], -1), moved.shape[1:]


def _axis_values(u, axis: int, n: int):
    """The coordinate along ``axis`` of a block of ``u`` (broadcast, or of length 1 elsewhere)."""
    import cupy

    u = cupy.moveaxis(u, axis, 0)
    return cupy.ascontiguousarray(u[(slice(None), *(0,) * (u.ndim - 1))], dtype=ACC).reshape(n)


def _launch(kernel, npts, *args):
    from ._numba_cuda import launch

    launch(kernel, npts, THREADS_PER_BLOCK, *args)


def polyfit_chunk_gpu(x, u, axis, deg: int):
    import cupy

    from .fields_cuda import trend_kernels

    axis = axis[0] if isinstance(axis, tuple) else axis
    x2, rest = _to_2d(x, axis)
    s = cupy.empty((2 * deg + 1, x2.shape[1]), dtype=ACC)
    b = cupy.empty((deg + 1, x2.shape[1]), dtype=ACC)
    _launch(trend_kernels(deg)["sums"], x2.shape[1], x2, _axis_values(u, axis, x2.shape[0]), s, b)
    kept = lambda v: cupy.expand_dims(v.reshape(rest), axis)  # noqa: E731
    return {**{f"s{k}": kept(s[k]) for k in range(2 * deg + 1)}, **{f"t{k}": kept(b[k]) for k in range(deg + 1)}}


def polyval_subtract_gpu(x, u, *coefficients, out_dtype, axis: int):
    """:func:`polyval_subtract` by a Numba CUDA kernel."""
    import cupy

    from .fields_cuda import trend_kernels

    x2, rest = _to_2d(x, axis)
    npts = x2.shape[1]
    c = cupy.stack([cupy.moveaxis(ck, axis, 0).reshape(npts) for ck in coefficients]).astype(ACC, copy=False)
    out = cupy.empty(x2.shape, dtype=out_dtype)
    _launch(trend_kernels(len(coefficients) - 1)["subtract"], npts, x2, _axis_values(u, axis, x2.shape[0]), c, out)
    return cupy.moveaxis(out.reshape(x2.shape[:1] + rest), 0, axis)


def detrend_block_gpu(x, u, *, axis: int, deg: int, out_dtype, tile: bool = True):
    """x minus its least-squares polynomial along ``axis``, which the block holds whole: the CUDA C
    tile kernel of :mod:`pipeline.kernels.detrend`, which reads the block once, where a tile of
    its series fits in shared memory; otherwise (or with ``tile`` False, for the benchmarks) one
    Numba CUDA kernel (fit, solve, subtract per point), which reads it twice."""
    import cupy

    from .detrend import detrend_tile
    from .fields_cuda import trend_kernels

    x2, rest = _to_2d(x, axis)
    u1 = _axis_values(u, axis, x2.shape[0])
    out = cupy.empty(x2.shape, dtype=out_dtype)
    if not (tile and detrend_tile(x2, u1, out, deg)):
        _launch(trend_kernels(deg)["detrend"], x2.shape[1], x2, u1, out)
    return cupy.moveaxis(out.reshape(x2.shape[:1] + rest), 0, axis)


def detrend_block(x, u, *, axis: int, deg: int, out_dtype):
    """What :func:`detrend_block_gpu` computes, by the CPU formulas (its twin)."""
    xp = xp_of(x)
    u = xp.broadcast_to(u, x.shape)
    p = polyfit_chunk_xp(x, u, axis, deg)
    c = polyfit_finalize(p, axis, deg)
    coefs = [c[tuple(slice(k, k + 1) if i == axis else slice(None) for i in range(x.ndim))] for k in range(deg + 1)]
    return polyval_subtract(x, u, *coefs, out_dtype=out_dtype)


# --- quantile: sort along the axis, interpolate linearly between order statistics ---------------


def quantile(block, q: tuple[float, ...], axis: int, out_dtype):
    """Quantiles ``q`` along ``axis`` (NumPy's "linear" method), NaN-skipping.

    Returns an array of shape ``(len(q), *block.shape without axis)``. NaN sorts last on NumPy
    and CuPy, so the ``n`` valid values of a point are the first ``n`` of its sorted column.
    """
    xp = xp_of(block)
    s = xp.sort(block, axis=axis)
    n = (~xp.isnan(block)).sum(axis=axis, keepdims=True)
    last = xp.maximum(n - 1, 0)
    out = []
    for qi in q:
        h = (n - 1) * qi
        lo = xp.maximum(xp.floor(h), 0).astype(np.intp)
        hi = xp.minimum(lo + 1, last)
        a = xp.take_along_axis(s, lo, axis=axis).astype(ACC, copy=False)
        b = xp.take_along_axis(s, hi, axis=axis).astype(ACC, copy=False)
        v = a + (b - a) * (h - lo)
        out.append(xp.where(n > 0, v, xp.nan).squeeze(axis))
    return xp.stack(out).astype(out_dtype, copy=False)


# --- saturation vapour pressure over water, Pa, from temperature in K ----------------------------

# Each formula is written once per backend, in the same order of operations, as xclim's
# _saturation_vapor_pressure_over_water (xclim.indices.converters); t = x + offset is in K.
_SVP_C = {
    "sonntag90": "100.0 * exp(-6096.9385 / t + 16.635794 + -2.711193e-2 * t + 1.673952e-5 * (t * t)"
    " + 2.433502 * log(t))",
    "tetens30": "610.78 * exp(17.269388 * (t - 273.16) / (t + -35.86))",
}


# on the GPU, one streaming kernel per formula (see pipeline.kernels.streaming)
SVP = {
    method: Spec(
        "flat", f"pipeline_svp_{method}", (("double", "offset"),),
        body=f"double t = (double)x + offset; return (out_t)({formula});",
    )
    for method, formula in _SVP_C.items()
}


def _svp_numpy(t, method: str):
    if method == "sonntag90":
        return 100.0 * np.exp(
            -6096.9385 / t + 16.635794 + -2.711193e-2 * t + 1.673952e-5 * (t * t) + 2.433502 * np.log(t)
        )
    return 610.78 * np.exp(17.269388 * (t - 273.16) / (t + -35.86))


def saturation_vapor_pressure_cpu(x, offset: float, method: str, out_dtype):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = x.astype(np.float64) + offset
        return _svp_numpy(t, method).astype(out_dtype, copy=False)


def saturation_vapor_pressure_gpu(x, offset: float, method: str, out_dtype):
    import cupy

    from . import streaming

    x = cupy.ascontiguousarray(x)
    e = cupy.empty(x.shape, dtype=out_dtype)
    return streaming.run(SVP[method], x, e, np.float64(offset))


# --- the names the registry looks up (pipeline.kernels.FAMILIES) ----------------------------------

polyfit_cpu = polyfit_chunk_xp
polyfit_gpu = polyfit_chunk_gpu
polyval_subtract_cpu = polyval_subtract
coarsen_mean_cpu = coarsen_mean

