"""Exponentially weighted moving statistics along one axis, as numbagg's ``move_exp_nan*``
compute them for xarray's ``rolling_exp``: mean, sum, var, std, and cov, corr of two arrays.

numbagg's gufuncs are NumPy-only; on a CuPy block xarray's ``rolling_exp`` reaches
:func:`move_exp` through :mod:`pipeline.patches`. One thread per grid point scans its series in
order (the statistic at step ``t`` depends on every step before it), a warp reading 32
neighbouring points of one step (coalesced). Each step is numbagg's, in its order, in float64 as
numbagg computes them for xarray (its ``alpha``, a float64 array, chooses the float64 loop for
any real data), so results are numbagg's to a unit or two in the last place. (The tests run the kernel on NumPy arrays under Numba's CUDA
simulator, against a NumPy reference of numbagg's definitions.)
"""

from __future__ import annotations

import math
import operator

import numpy as np

from ..backend import xp_of
from . import launch

# numba.cuda, set on first use by _kernel: a global of the module that defines the @cuda.jit
# kernel, as Numba's CUDA simulator requires (see launch.numba_cuda)
cuda = None
# a product rounded on its own, never fused with an addition (libdevice's dmul_rn on the GPU),
# set by _kernel
mul = None

HOWS = ("mean", "sum", "var", "std", "cov", "corr")
TWO = ("cov", "corr")  # statistics of two arrays


def _column(x, y, out, alpha, min_weight, how, p):
    # numbagg's loops (moving_exp.py), one of them chosen by ``how``; a division whose divisor
    # is zero is NaN there (0 / 0), here a test, as CUDA and the simulator differ on it. Every
    # product goes through mul, rounded on its own as on the CPU: NVVM fuses a product and the
    # sum after it (FMA) by default, and var's bias (1 - count2 / count**2, zero in exact
    # arithmetic after one value) and its difference of squares then cancel differently from
    # numbagg's: measured on the H200, std 60 where numbagg gives 0, and 8% off beside it
    nan = math.nan
    decay = 1.0 - alpha
    s1 = 0.0  # decayed sum of the values (of x where two)
    s2 = 0.0  # of y, where two
    sxx = 0.0  # of the squares of x (var, std, corr)
    syy = 0.0  # of the squares of y (corr)
    sxy = 0.0  # of the products (cov, corr)
    count = 0.0  # decayed count of the values
    count2 = 0.0  # decayed, twice a step, for the bias of var, std and cov
    weight = 0.0
    seen = False  # a value so far (sum)
    for t in range(x.shape[0]):
        a = x[t, p]
        b = y[t, p]
        s1 = mul(s1, decay)
        s2 = mul(s2, decay)
        sxx = mul(sxx, decay)
        syy = mul(syy, decay)
        sxy = mul(sxy, decay)
        count = mul(count, decay)
        count2 = mul(count2, mul(decay, decay))
        weight = mul(weight, decay)
        if not (math.isnan(a) or (how >= 4 and math.isnan(b))):
            seen = True
            s1 += a
            count += 1.0
            count2 += 1.0
            weight += alpha
            if how >= 2:
                sxx += mul(a, a)
            if how >= 4:
                s2 += b
                sxy += mul(a, b)
                syy += mul(b, b)
        value = nan
        if weight >= min_weight:
            if how == 0:
                if count > 0:
                    value = s1 / count
            elif how == 1:
                if seen:
                    value = s1
            elif count * count > 0:
                bias = 1.0 - count2 / mul(count, count)
                if bias > 0:
                    if how == 2 or how == 3:
                        var = (sxx / count - mul(s1 / count, s1 / count)) / bias
                        if how == 2:
                            value = var
                        elif var >= 0:
                            value = math.sqrt(var)
                    elif how == 4:
                        value = (sxy - mul(s1, s2) / count) / count / bias
                    else:
                        both = mul(sxx - mul(s1, s1) / count, syy - mul(s2, s2) / count)
                        if both > 0:
                            value = (sxy - mul(s1, s2) / count) / math.sqrt(both)
        out[t, p] = value


@launch.once  # Dask's threads ask for it together: one builds it
def _kernel(how: int):
    global cuda, mul
    cuda = launch.numba_cuda()
    if mul is None:
        import numba

        if numba.config.ENABLE_CUDASIM:
            mul = operator.mul  # Python's floats: each product rounded on its own
        else:
            from numba.cuda import libdevice

            mul = libdevice.dmul_rn
    column = cuda.jit(device=True)(_column)

    def move_exp(x, y, out, alpha, min_weight):
        p = cuda.grid(1)
        if p < x.shape[1]:
            column(x, y, out, alpha, min_weight, how, p)

    # reached through pipeline.patches (xarray's rolling_exp on CuPy blocks), not kernels.get:
    # not one of kernels.NUMBA_CUDA_FAMILIES, whose loading begins when an op builds its graph
    return launch.cuda_kernel(move_exp)


def move_exp(values, alpha: float, min_weight: float = 0.0, how: str = "mean", other=None, axis: int = -1):
    """numbagg's ``move_exp_nan{how}(values[, other], alpha=alpha, min_weight=min_weight, axis=axis)``
    on a block of any array module with a CUDA kernel launcher (CuPy; NumPy under the simulator)."""
    xp = xp_of(values)
    for a in (values, values if other is None else other):
        if a.dtype.kind not in "biuf":
            raise TypeError(f"rolling_exp takes real numbers, not {a.dtype}")
    dtype = np.dtype(np.float64)
    if values.size == 0:
        return xp.empty(values.shape, dtype=dtype)
    alpha, min_weight = np.float64(alpha), np.float64(min_weight)
    x2, moved = launch.to_2d(values.astype(dtype, copy=False), axis, xp)
    x2 = x2 if getattr(x2.flags, "writeable", True) else x2.copy()  # the simulator writes its arguments back
    y2 = x2 if other is None else launch.to_2d(xp.broadcast_to(other, values.shape).astype(dtype), axis, xp)[0]
    out = xp.empty(x2.shape, dtype=dtype)
    launch.launch_numba(_kernel(HOWS.index(how)), x2.shape[1], x2, y2, out, alpha, min_weight)
    return launch.from_2d(out, moved, axis, xp)
