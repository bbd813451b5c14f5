"""Kernels of the field ops (:mod:`pipeline.ops.fields`): block means, polynomial trends,
quantiles along one axis, and saturation vapour pressure.

All but the last are written against the array module of their input (:func:`xp_of`), so the
same code runs on NumPy and CuPy chunks; saturation vapour pressure is one NumPy expression on
the CPU and one fused CuPy kernel on the GPU, as in :mod:`pipeline.kernels.elementwise`. Sums
run in float64 so that float32 data come out within float32 rounding of a float64 reference.
"""

from __future__ import annotations

import functools

import numpy as np

from ..backend import xp_of
from ..reductions import Aggregation, _sum_fields
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
    the valid samples, k = 0..2 deg and 0..deg, with ``axis`` kept at length 1."""
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


def polyval_subtract(x, u, *coefficients, out_dtype):
    """x - Σ c_k u^k, by Horner's rule in float64."""
    u = u.astype(ACC, copy=False)
    trend = coefficients[-1]
    for c in coefficients[-2::-1]:
        trend = trend * u + c
    return (x.astype(ACC, copy=False) - trend).astype(out_dtype, copy=False)


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
