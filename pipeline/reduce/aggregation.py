"""Reductions across chunks and GPUs as chunk / combine / finalize.

Each reduction is declared as an :class:`Aggregation`, in the manner of flox and cubed: ``chunk``
reduces one block to a *partial* (a dict of small arrays, reduced axes kept with length 1),
``combine`` merges partials concatenated along the reduced axes (dask builds a tree of them,
``split_every`` wide, so partials from many chunks and many GPUs merge pairwise rather than all on
one worker), and ``finalize`` turns the last partial into the result. :func:`reduce` hands the
three to :func:`dask.array.reduction`, dask's own tree reduction.

All functions here are written against the array module of their input, so the same code runs
on NumPy and CuPy chunks. Partials accumulate in float64 so that float32 data reduce to within
float32 rounding of a float64 reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

import dask.array as da
import numpy as np

from ..backend import backend_of, is_cupy, xp_of
from ..backend import meta as backend_meta

Partial = Mapping[str, object]
ACC = np.float64  # accumulator type of every partial


@dataclass(frozen=True)
class Aggregation:
    """Blueprint of a reduction.

    Parameters
    ----------
    name
        Prefix of the dask task names.
    chunk
        ``chunk(x, weights, axis) -> Partial``: one block (and its weights block, or None) to a
        partial with the reduced ``axis`` kept at length 1.
    combine
        ``combine(partial, axis) -> Partial``: a partial whose fields were concatenated along
        ``axis`` (one entry per input) to one partial with those axes at length 1.
    finalize
        ``finalize(partial) -> array``: the result, reduced axes still kept.
    """

    name: str
    chunk: Callable[..., Partial]
    combine: Callable[[Partial, tuple[int, ...]], Partial]
    finalize: Callable[[Partial], object]


def _concat_nested(parts, axes: tuple[int, ...]):
    """Concatenate dask's nested lists of blocks (one list level per reduced axis)."""
    if not axes:
        return parts
    blocks = [_concat_nested(p, axes[1:]) for p in parts]
    return blocks[0] if len(blocks) == 1 else xp_of(blocks[0]).concatenate(blocks, axis=axes[0])


def _field(parts, key):
    if isinstance(parts, list):
        return [_field(p, key) for p in parts]
    return parts[key]


def _first_leaf(parts):
    while isinstance(parts, list):
        parts = parts[0]
    return parts


def _gather(parts, axis) -> dict:
    """Nested lists of partials -> one partial with each field concatenated along ``axis``."""
    if isinstance(parts, dict):
        return parts
    axes = tuple(sorted(axis))
    return {k: _concat_nested(_field(parts, k), axes) for k in _first_leaf(parts)}


def reduce(
    x: da.Array,
    agg: Aggregation,
    axis: tuple[int, ...],
    *,
    dtype,
    weights: da.Array | None = None,
    weights_const: np.ndarray | None = None,
    keepdims: bool = False,
    split_every: int | None = None,
    output_size: int = 1,
) -> da.Array:
    """Reduce ``x`` over ``axis`` with the blueprint ``agg``; the result keeps ``x``'s backend.

    Weights come as a Dask array chunked as ``x`` (``weights``), or as one small NumPy array that
    broadcasts to every block of ``x`` (``weights_const``), moved to the block's backend in the task.
    """
    axis = tuple(sorted(a % x.ndim for a in axis))

    def chunk(block, weights_block=None, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:
            return block
        if weights_const is not None:
            weights_block = xp_of(block).broadcast_to(xp_of(block).asarray(weights_const), block.shape)
        return agg.chunk(block, weights_block, axis)

    def combine(parts, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:
            return parts
        return agg.combine(_gather(parts, axis), axis)

    def aggregate(parts, axis=None, keepdims=False, computing_meta=False):
        if computing_meta:
            return parts
        partial = agg.combine(_gather(parts, axis), axis)
        out = agg.finalize(partial)
        if not keepdims:
            out = out.squeeze(axis=axis)
        return out.astype(dtype, copy=False)

    out_ndim = x.ndim if keepdims else x.ndim - len(axis)
    # dask's reduction would call the functions on empty arrays to find the output type: give it.
    return da.reduction(
        x,
        chunk,
        aggregate,
        combine=combine,
        axis=axis,
        keepdims=keepdims,
        dtype=dtype,
        split_every=split_every,
        concatenate=False,
        name=agg.name,
        meta=backend_meta(backend_of(x), dtype, out_ndim),
        weights=weights,
        output_size=output_size,
    )


# --- mean and variance: count, mean and sum of squared deviations, merged stably ----------------


def _moments_chunk(x, weights, axis):
    if is_cupy(x) and len(axis) == 1:
        from ..kernels.moments import moments_gpu

        return moments_gpu(x, axis[0])
    xp = xp_of(x)
    valid = ~xp.isnan(x)
    n = valid.sum(axis=axis, keepdims=True, dtype=ACC)
    total = xp.nansum(x, axis=axis, keepdims=True, dtype=ACC)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = xp.where(n > 0, total / xp.where(n > 0, n, 1), 0.0)
    # deviations from the chunk's own mean: the two-pass formula inside a chunk
    dev = xp.where(valid, x.astype(ACC, copy=False) - mean, 0.0)
    m2 = (dev * dev).sum(axis=axis, keepdims=True)
    return {"n": n, "mean": mean, "m2": m2}


def _moments_combine(p, axis):
    """Chan, Golub and LeVeque's pairwise merge of (n, mean, M2), over any number of partials."""
    xp = xp_of(p["n"])
    n_i, mean_i, m2_i = p["n"], p["mean"], p["m2"]
    n = n_i.sum(axis=axis, keepdims=True)
    safe_n = xp.where(n > 0, n, 1)
    mean = (n_i * mean_i).sum(axis=axis, keepdims=True) / safe_n
    delta = mean_i - mean
    m2 = m2_i.sum(axis=axis, keepdims=True) + (n_i * delta * delta).sum(axis=axis, keepdims=True)
    return {"n": n, "mean": mean, "m2": m2}


def _nan_where_empty(p, value):
    xp = xp_of(value)
    return xp.where(p["n"] > 0, value, xp.nan)


def _mean_finalize(p):
    return _nan_where_empty(p, p["mean"])


def _var_finalize(p, ddof: int = 0):
    xp = xp_of(p["n"])
    dof = p["n"] - ddof
    return xp.where(dof > 0, p["m2"] / xp.where(dof > 0, dof, 1), xp.nan)


def _std_finalize(p):
    return xp_of(p["n"]).sqrt(_var_finalize(p))




def nanmean_std(x: da.Array, axis: int, dtype=ACC) -> tuple[da.Array, da.Array]:
    """Mean and (ddof=0) standard deviation along one axis, NaN-skipping, that axis kept.

    One pass over ``x``: both statistics come out of one tree of moment partials, whose
    finalize stacks them along the reduced axis (``output_size=2``).
    """
    axis = axis % x.ndim

    def finalize(p):
        xp = xp_of(p["n"])
        return xp.concatenate([_mean_finalize(p), _std_finalize(p)], axis=axis)

    agg = Aggregation("pipeline-moments", _moments_chunk, _moments_combine, finalize)
    stats = reduce(x, agg, (axis,), dtype=dtype, keepdims=True, output_size=2)
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, 1)
    mean = stats[tuple(index)]
    index[axis] = slice(1, 2)
    return mean, stats[tuple(index)]


# --- weighted mean: sum(w * x) / sum(w where x is valid) ----------------------------------------


def _weighted_chunk(x, w, axis):
    if is_cupy(x):
        return _weighted_chunk_gpu(x, w, axis)
    xp = xp_of(x)
    valid = ~xp.isnan(x)
    wx = xp.where(valid, x.astype(ACC, copy=False) * w, 0.0)
    wsum = xp.where(valid, w, 0).astype(ACC, copy=False)
    return {"wx": wx.sum(axis=axis, keepdims=True), "w": wsum.sum(axis=axis, keepdims=True)}


@functools.cache
def _weighted_sum_kernel():
    import cupy

    # One pass for both sums: each element maps to the complex number (w*x, w), zero where x is
    # NaN, and complex addition adds the two parts independently. Two real reductions would read
    # the block twice.
    return cupy.ReductionKernel(
        "T x, float64 w",
        "complex128 y",
        "x == x ? complex<double>((double)x * w, w) : complex<double>(0.0, 0.0)",
        "a + b",
        "y = a",
        "complex<double>(0.0, 0.0)",
        "pipeline_weighted_sums",
        options=("--fmad=false",),
    )


def _weighted_chunk_gpu(x, w, axis):
    import cupy

    w = cupy.asarray(w)
    lead = x.ndim - len(axis)
    trailing = tuple(axis) == tuple(range(lead, x.ndim))
    if trailing and x.flags.c_contiguous and w.shape == x.shape and all(st == 0 for st in w.strides[:lead]):
        # the usual case: weights that vary only along the reduced axes (cos(lat)), and a block
        # laid out with those axes last: one pass of the two-stage kernel
        from ..kernels.weighted import weighted_rows_gpu as weighted_sums_gpu

        rows = int(np.prod(x.shape[:lead], dtype=np.int64))
        wx, ws = weighted_sums_gpu(x.reshape(rows, -1), w[(0,) * lead].reshape(-1))
        shape = (*x.shape[:lead], *(1,) * len(axis))
        return {"wx": wx.reshape(shape), "w": ws.reshape(shape)}
    sums = _weighted_sum_kernel()(x, w.astype(np.float64, copy=False), axis=axis, keepdims=True)
    return {"wx": sums.real.copy(), "w": sums.imag.copy()}


def _sum_fields(p, axis):
    return {k: v.sum(axis=axis, keepdims=True) for k, v in p.items()}


def _weighted_finalize(p):
    xp = xp_of(p["w"])
    return xp.where(p["w"] != 0, p["wx"] / xp.where(p["w"] != 0, p["w"], 1), xp.nan)


weighted_mean = Aggregation("pipeline-weighted-mean", _weighted_chunk, _sum_fields, _weighted_finalize)
