"""Kernels of the field ops (:mod:`pipeline.ops.fields`) that need no module of their own:
quantiles along one axis, and saturation vapour pressure.

Quantiles are written against the array module of their input (:func:`xp_of`), so the same code
runs on NumPy and CuPy chunks; saturation vapour pressure is one NumPy expression on the CPU and
one streaming kernel on the GPU, as in :mod:`pipeline.kernels.elementwise`. (Block means are in
:mod:`pipeline.kernels.coarsen`, polynomial trends in :mod:`pipeline.kernels.trend`.)
"""

from __future__ import annotations

import numpy as np

from ..backend import xp_of
from . import launch
from .launch import Spec
from .slabs import map_slabs, slab_axis, temporaries

ACC = np.float64


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


@temporaries(2)
def quantile_cpu(block, q: tuple[float, ...], axis: int, out_dtype):
    """:func:`quantile`, slab by slab across ``axis`` (the sort's copy and the interpolation's
    float64 temporaries are then a slab's, not the block's)."""
    axis = axis % block.ndim
    cut = slab_axis(block.shape, (axis,))
    # the result drops ``axis`` and leads with the quantiles: where the cut axis lands in it
    out_axis = None if cut is None else cut + 1 if cut < axis else cut
    return map_slabs(quantile, block, q, axis, out_dtype, whole=(axis,), out_axis=out_axis)


# --- saturation vapour pressure over water, Pa, from temperature in K ----------------------------

# Each formula is written once per backend, in the same order of operations, as xclim's
# _saturation_vapor_pressure_over_water (xclim.indices.converters); t = x + offset is in K.
_SVP_C = {
    "sonntag90": "100.0 * exp(-6096.9385 / t + 16.635794 + -2.711193e-2 * t + 1.673952e-5 * (t * t)"
    " + 2.433502 * log(t))",
    "tetens30": "610.78 * exp(17.269388 * (t - 273.16) / (t + -35.86))",
}


# on the GPU, one streaming kernel per formula (see pipeline.kernels.launch)
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


@temporaries(7.5)
def saturation_vapor_pressure_cpu(x, offset: float, method: str, out_dtype):
    """The formula of ``method`` in float64, written in ``out_dtype``, slab by slab."""
    return map_slabs(_svp_formula, x, offset, method, out_dtype)


def _svp_formula(x, offset: float, method: str, out_dtype):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = x.astype(np.float64) + offset
        return _svp_numpy(t, method).astype(out_dtype, copy=False)


def saturation_vapor_pressure_gpu(x, offset: float, method: str, out_dtype):
    import cupy

    x = cupy.ascontiguousarray(x)
    e = cupy.empty(x.shape, dtype=out_dtype)
    return launch.stream(SVP[method], x, e, np.float64(offset))
