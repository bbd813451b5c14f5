"""Elementwise formulas: one NumPy expression for the CPU, one fused kernel for the GPU.

On the GPU each formula is a single kernel: one read of every input and one write of the output,
where the same expression in separate CuPy calls would make a temporary array, and a pass over
memory, per operator (measured ``sin(2x+1)``: three kernels 15.4 ms, one fused 5.1 ms). The
kernels are the unrolled streaming kernels of :mod:`pipeline.kernels.launch` (2-3x faster than
a ``cupy.ElementwiseKernel`` on large blocks); a ``cupy.ElementwiseKernel`` with the same
arithmetic serves layouts they do not cover (broadcasting along other axes, strided blocks).
Explicit C types make the float64 arithmetic and the cast back to the output type visible.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import launch
from .launch import Spec
from .slabs import map_slabs, temporaries


@functools.cache
def _gpu_kernel(name: str):
    import cupy

    return cupy.ElementwiseKernel(*_SOURCES[name], name=f"pipeline_{name}", options=launch.FMAD)


_SOURCES = {
    # z = (x - mean) / std in double precision, written back in the output type
    "standardize": (
        "T x, float64 mean, float64 std",
        "O z",
        "z = (O)(((double)x - mean) / std)",
    ),
}


# --- standardize ---------------------------------------------------------------------------------

# z = (x - mean) / std in double precision, per point p of a (steps, points) block
STANDARDIZE = Spec(
    "column", "pipeline_standardize", (("const double*", "mean"), ("const double*", "std")),
    body="(out_t)(((double)v - m) / s)", prelude="const double m = mean[p], s = std[p];",
)


def _standardize_loop(x, mean, std, out):
    """out = (x - mean) / std in float64, cast to ``out``'s type, over an (outer, steps, points)
    array with one mean and std per (outer, point): the formula's operations, element by element.
    Compiled by :func:`launch.cpu_loop`."""
    outer, nt, npts = x.shape
    for o in range(outer):
        for t in range(nt):
            for p in range(npts):
                out[o, t, p] = (float(x[o, t, p]) - mean[o, p]) / std[o, p]


def _stats_axis(x, mean, std) -> int | None:
    """The one axis along which ``mean`` and ``std`` (float64, C-contiguous) hold one value for
    ``x``'s values, where the loop applies to a C-contiguous float ``x``; else None."""
    if x.dtype.kind != "f" or not x.flags.c_contiguous or x.size == 0 or x.ndim == 0:
        return None
    shapes = {getattr(mean, "shape", None), getattr(std, "shape", None)}
    for a in range(x.ndim):
        if shapes == {x.shape[:a] + (1,) + x.shape[a + 1 :]}:
            return a
    return None


@temporaries(4.5)
def standardize_cpu(x, mean, std, out_dtype):
    """(x - mean) / std in float64, written in ``out_dtype``: with statistics along one axis of a
    C-contiguous float block, one pass of :func:`_standardize_loop` (Numba, releasing the GIL),
    bit for bit the formula's result with no temporaries; otherwise the formula slab by slab."""
    from .moments import three_axes

    a = _stats_axis(x, mean, std)
    if a is None:
        return map_slabs(_standardize_formula, x, mean, std, out_dtype)
    outer, steps, inner = three_axes(x.shape, a)
    z = np.empty(x.shape, dtype=out_dtype)
    stats = (np.ascontiguousarray(v, dtype=np.float64).reshape(outer, inner) for v in (mean, std))
    launch.cpu_loop(_standardize_loop)(x.reshape(outer, steps, inner), *stats, z.reshape(outer, steps, inner))
    return z


def _standardize_formula(x, mean, std, out_dtype):
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((x.astype(np.float64, copy=False) - mean) / std).astype(out_dtype, copy=False)


def standardize_gpu(x, mean, std, out_dtype):
    import cupy

    mean = cupy.ascontiguousarray(mean, dtype=np.float64)
    std = cupy.ascontiguousarray(std, dtype=np.float64)
    z = cupy.empty(x.shape, dtype=out_dtype)
    if x.ndim and x.flags.c_contiguous and mean.shape == (1, *x.shape[1:]) == std.shape:
        cols = int(np.prod(x.shape[1:], dtype=np.int64))
        launch.stream(STANDARDIZE, x.reshape(x.shape[0], cols), z.reshape(x.shape[0], cols), mean, std)
        return z
    return _gpu_kernel("standardize")(x, mean, std, z)


# --- CF decoding ---------------------------------------------------------------------------------

# A variable's decoding is a CFPlan (built by pipeline.sources.cf from xarray's own rules): every
# value below is already in the type that NumPy's promotion gives the operation in xarray's coders,
# so the CPU (NumPy), the GPU fallback (CuPy) and the fused GPU kernel do the same arithmetic with
# no promotion left to either library, and all three equal ``xarray.decode_cf`` bit for bit.


@dataclass(frozen=True)
class CFPlan:
    """One variable's CF decoding, in xarray's order.

    ``values``: the storage type after ``_Unsigned`` (the raw values are cast to it);
    ``mask``: the type the values are cast to before masking (None: no fill values);
    ``fills``: each fill value already in the type it is compared in (NumPy's promotion of
    ``mask`` and the attribute's type); masked values become NaN;
    ``scale``/``offset``: ``scale_factor``/``add_offset`` in the type of that operation (None:
    absent), whose result is cast back to ``out``.
    """

    values: np.dtype
    mask: np.dtype | None
    fills: tuple
    scale: object
    offset: object
    out: np.dtype


def _decode_with(xp, raw, plan: CFPlan):
    """The plan as array operations with explicit types: NumPy on the CPU, CuPy on the GPU."""
    data = raw.astype(plan.values, copy=False)
    if plan.mask is not None:
        data = data.astype(plan.mask, copy=True)
        masked = xp.zeros(data.shape, dtype=bool)
        for fill in plan.fills:
            masked |= data.astype(fill.dtype, copy=False) == fill
        data[masked] = np.nan
    data = data.astype(plan.out, copy=False)
    for value, op in ((plan.scale, xp.multiply), (plan.offset, xp.add)):
        if value is not None:
            data = op(data.astype(value.dtype, copy=False), value).astype(plan.out, copy=False)
    return data


def cf_decode_cpu(raw, plan: CFPlan):
    with np.errstate(over="ignore", invalid="ignore"):
        return _decode_with(np, raw, plan)


def cf_spec(plan: CFPlan, in_dtype) -> Spec | None:
    """The fused kernel of a plan: one read, one write per value. None where a type has no C
    equivalent here (float16, bool), which CuPy's array operations then decode."""
    types = [in_dtype, plan.values, plan.out, *(f.dtype for f in plan.fills)]
    types += [v.dtype for v in (plan.scale, plan.offset) if v is not None]
    if plan.mask is not None:
        types.append(plan.mask)
    if any(np.dtype(t) not in launch.C_TYPES for t in types):
        return None
    c = launch.c_type
    params, lines = [], []
    if plan.mask is not None:
        lines.append(f"const {c(plan.mask)} m = ({c(plan.mask)})({c(plan.values)})x;")
        tests = []
        for k, fill in enumerate(plan.fills):
            params.append((c(fill.dtype), f"fill{k}"))
            tests.append(f"({c(fill.dtype)})m == fill{k}")
        params.append(("out_t", "nanv"))
        lines.append(f"if ({' || '.join(tests)}) return nanv;")
        lines.append("out_t v = (out_t)m;")
    else:
        lines.append(f"out_t v = (out_t)({c(plan.values)})x;")
    for value, name, op in ((plan.scale, "scale", "*"), (plan.offset, "offset", "+")):
        if value is not None:
            params.append((c(value.dtype), name))
            lines.append(f"v = (out_t)(({c(value.dtype)})v {op} {name});")
    lines.append("return v;")
    return Spec("flat", "pipeline_cf_decode", tuple(params), body=" ".join(lines))


def cf_decode_gpu(raw, plan: CFPlan):
    import cupy

    spec = cf_spec(plan, raw.dtype)
    if spec is None:
        return _decode_with(cupy, raw, plan)
    raw = cupy.ascontiguousarray(raw)
    out = cupy.empty(raw.shape, dtype=plan.out)
    args = list(plan.fills) + ([plan.out.type(np.nan)] if plan.mask is not None else [])
    args += [v for v in (plan.scale, plan.offset) if v is not None]
    launch.stream(spec, raw, out, *args)
    return out
