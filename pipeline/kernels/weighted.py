"""Weighted sums over the trailing axes of a block, per leading index, in one pass on the GPU.

For each row ``t`` of a (rows, points) block, ``sum(w[p] * x[t, p])`` and ``sum(w[p])`` over the
valid (non-NaN) ``x``. The kernel (``cuda/weighted.cu``, :func:`weighted_rows_gpu`) gives each
block a slice of points over a tile of rows: a thread loads the weights of its ``U`` points once,
into registers, and walks the tile's rows, loading the next row's values before adding the
current row's; each row's sums are added across the warp by shuffles and across warps once per
tile, in a fixed order, so the result does not depend on the order blocks finish in (no atomics).
Partial sums go to ``partial[row, field, slice]``, added per row by CuPy. CuPy's
``ReductionKernel`` gives such a reduction one block per row and reaches about a fifth of the
memory bandwidth; it serves the layouts the kernel does not take.

The kernel it replaced (in ``benchmarks/kernels_previous.py``) reached 68% of the copy bandwidth
on an H200: for every 4-byte value it also read its 8-byte weight (weights that stay in L2, but
that then carries three times the traffic of the data), and each block of 8192 values ended in a
tree of 8 ``__syncthreads``.
"""

from __future__ import annotations

import functools

import numpy as np

from . import launch
from .slabs import map_slabs, temporaries

# --- the kernel: weights in registers over a tile of rows --------------------------------------------

# measured on an H200 (730 x 1038240 float32): 128 threads, 8 points each, 64 rows: 87% of the
# copy bandwidth; 256 x 8 x 32: 84%; 128 x 4 x 64: 82%; 128 x 16 x 32: 88% (twice the registers)
TILE_THREADS = 128
TILE_U = 8  # points per thread in a slice (and loads in flight per row)
TILE_ROWS = 64  # rows per block

def tiled_source(in_dtype, threads: int = TILE_THREADS, unroll: int = TILE_U, rows: int = TILE_ROWS) -> str:
    return launch.cuda_source("weighted.cu", in_t=launch.c_type(in_dtype), threads=threads, unroll=unroll, rows=rows)


def _tiled(in_dtype, threads: int, unroll: int, rows: int):
    return launch.raw_kernel("weighted.cu", "pipeline_weighted_sums_tiled", launch.FMAD, in_t=launch.c_type(in_dtype),
                             threads=threads, unroll=unroll, rows=rows)


def weighted_partials_gpu(x2d, w1d, threads: int = TILE_THREADS, unroll: int = TILE_U, rows: int = TILE_ROWS):
    """The kernel's partial sums, float64 (rows, 2, slices): [:, 0] of w * x, [:, 1] of w."""
    import cupy

    nrows, npts = x2d.shape
    span = threads * unroll
    nslices = max(1, -(-npts // span))
    partial = cupy.empty((nrows, 2, nslices), dtype=np.float64)
    if nrows == 0:
        return partial
    w, layout = _weights_layout(w1d, npts)
    kernel = _tiled(np.dtype(x2d.dtype), threads, unroll, rows)
    kernel((nslices, -(-nrows // rows)), (threads,), (cupy.ascontiguousarray(x2d), w, partial, np.int64(nrows), np.int64(npts), *layout))
    return partial


def _weights_layout(w, npts: int):
    """The weights of the points, float64, as the kernel reads them: the array and (columns, row
    stride, column stride) in elements, point p's weight at ``(p // columns) * row + (p % columns)
    * column``. A 1-D or 2-D view is read in place, zero strides included (on a fresh machine the
    copy that made it contiguous compiled a CuPy kernel); other layouts are copied."""
    import cupy

    if w.dtype == np.float64 and w.size == npts and w.ndim in (1, 2) and all(s % 8 == 0 for s in w.strides):
        strides = [s // 8 for s in w.strides]
        if w.ndim == 1:
            return w, (np.int64(max(npts, 1)), np.int64(0), np.int64(strides[0]))
        return w, (np.int64(max(w.shape[1], 1)), np.int64(strides[0]), np.int64(strides[1]))
    w = cupy.ascontiguousarray(w, dtype=np.float64).reshape(-1)
    return w, (np.int64(max(npts, 1)), np.int64(0), np.int64(1))


def weighted_partials_twin(x2d, w1d, threads: int = TILE_THREADS, unroll: int = TILE_U):
    """What :func:`weighted_partials_gpu` computes, on the CPU, in the kernel's order of additions:
    per lane over its ``U`` points, then the shuffle tree of each warp, then the warps in order."""
    nrows, npts = x2d.shape
    span = threads * unroll
    nslices = max(1, -(-npts // span))
    x = np.zeros((nrows, nslices * span), dtype=np.float64)
    x[:, :npts] = x2d
    w = np.zeros(nslices * span)
    w[:npts] = w1d
    valid = np.zeros(x.shape, dtype=bool)
    valid[:, :npts] = ~np.isnan(x[:, :npts])
    # point slice * span + i * threads + warp * 32 + lane
    shape = (nrows, nslices, unroll, threads // 32, 32)
    x, valid, w = x.reshape(shape), valid.reshape(shape), np.broadcast_to(w.reshape(shape[1:]), shape)
    out = np.empty((nrows, 2, nslices))
    for f, term in enumerate((np.where(valid, x * w, 0.0), np.where(valid, w, 0.0))):
        lanes = np.zeros(shape[:2] + shape[3:])
        for i in range(unroll):
            lanes = lanes + term[:, :, i]
        for o in (16, 8, 4, 2, 1):  # lane l adds lane l + o
            lanes = lanes[..., :o] + lanes[..., o : 2 * o]
        s = np.zeros(shape[:2])
        for k in range(threads // 32):
            s = s + lanes[:, :, k, 0]
        out[:, f] = s
    return out


def weighted_rows_gpu(x2d, w):
    """(sum of w * x, sum of w) over the valid values of each row of a (rows, points) CuPy array,
    with one weight per point (``w`` of ``points`` values, or a (a, b) grid of them, a view with
    zero strides included); two float64 NumPy arrays of length rows.

    The slices' sums (a few KB a row) are added on the host: they are the start of a small partial
    that the reduction finishes there (on CuPy the sum compiled a kernel on a fresh machine)."""
    sums = weighted_partials_gpu(x2d, w).get().sum(axis=2)
    return sums[:, 0], sums[:, 1]


# --- the kernels of the weighted-mean reduction: one block to its partial {wx, w} ------------------

ACC = np.float64


def _weighted_loop(x, w, wx, ws):
    """sum(w * x) and sum(w) over the valid values of each row of an (rows, a, b) array, with
    weights ``w`` of shape (a, b) (often a view with zero strides: cos(lat) along b): one read of
    the row, four independent sums a field (the additions of one sum wait for each other), added
    pairwise at the end. Compiled by :func:`launch.cpu_loop`."""
    rows, na, nb = x.shape
    for r in range(rows):
        a0 = a1 = a2 = a3 = 0.0
        b0 = b1 = b2 = b3 = 0.0
        for i in range(na):
            j = 0
            while j + 4 <= nb:
                v0, v1, v2, v3 = float(x[r, i, j]), float(x[r, i, j + 1]), float(x[r, i, j + 2]), float(x[r, i, j + 3])
                w0, w1, w2, w3 = float(w[i, j]), float(w[i, j + 1]), float(w[i, j + 2]), float(w[i, j + 3])
                if v0 == v0:
                    a0 += v0 * w0
                    b0 += w0
                if v1 == v1:
                    a1 += v1 * w1
                    b1 += w1
                if v2 == v2:
                    a2 += v2 * w2
                    b2 += w2
                if v3 == v3:
                    a3 += v3 * w3
                    b3 += w3
                j += 4
            while j < nb:
                v0, w0 = float(x[r, i, j]), float(w[i, j])
                if v0 == v0:
                    a0 += v0 * w0
                    b0 += w0
                j += 1
        wx[r] = (a0 + a1) + (a2 + a3)
        ws[r] = (b0 + b1) + (b2 + b3)


def _trailing_weights(x, w, axis):
    """The weights of ``x``'s rows as an (a, b) array where the loop applies (``axis`` the trailing
    axes of a C-contiguous float block, weights that vary only along them), else None."""
    lead = x.ndim - len(axis)
    if (tuple(axis) != tuple(range(lead, x.ndim)) or lead == 0 or x.dtype.kind != "f" or not x.flags.c_contiguous
            or x.size == 0 or getattr(w, "shape", None) != x.shape or any(st != 0 for st in w.strides[:lead])):
        return None
    return w[(0,) * lead].reshape(int(np.prod(x.shape[lead:-1])), x.shape[-1])


@temporaries(5)
def weighted_sums_cpu(x, w, axis) -> dict:
    """Partial of a weighted mean over ``axis`` (kept with length 1): sum(w * x) and sum(w) over
    the valid values of ``x``, float64.

    Over the trailing axes of a C-contiguous float block, with weights that vary only along them
    (cos(lat)), the loop :func:`_weighted_loop`, compiled by Numba, releasing the GIL: one read of
    the block and no temporaries. Otherwise array formulas, on the array module of ``x``, slab by
    slab along an axis not reduced (:func:`pipeline.kernels.slabs.map_slabs`)."""
    w2 = _trailing_weights(x, w, axis)
    if w2 is None:
        return weighted_formula(x, w, axis)
    lead = x.ndim - len(axis)
    rows = int(np.prod(x.shape[:lead]))
    shape = (*x.shape[:lead], *(1,) * len(axis))
    out = {"wx": np.empty(shape), "w": np.empty(shape)}
    launch.cpu_loop(_weighted_loop)(x.reshape(rows, *w2.shape), w2, out["wx"].reshape(-1), out["w"].reshape(-1))
    return out


def weighted_formula(x, w, axis) -> dict:
    """The partial by array formulas, on the array module of ``x``, slab by slab along an axis not
    reduced (:func:`pipeline.kernels.slabs.map_slabs`): any axes, any weights."""
    return map_slabs(_weighted_formula, x, w, axis, whole=axis)


def _weighted_formula(x, w, axis) -> dict:
    from ..backend import xp_of

    xp = xp_of(x)
    valid = ~xp.isnan(x)
    wx = xp.where(valid, x.astype(ACC, copy=False) * w, 0.0)
    wsum = xp.where(valid, w, 0).astype(ACC, copy=False)
    return {"wx": wx.sum(axis=axis, keepdims=True), "w": wsum.sum(axis=axis, keepdims=True)}


@functools.cache
def _weighted_sum_reduction():
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
        options=launch.FMAD,
    )


def weighted_sums_gpu(x, w, axis) -> dict:
    """:func:`weighted_sums_cpu` on a CuPy block; the partial (a value a row) on the host, where
    the reduction finishes it."""
    import cupy

    w = cupy.asarray(w)
    lead = x.ndim - len(axis)
    trailing = tuple(axis) == tuple(range(lead, x.ndim))
    if trailing and x.flags.c_contiguous and w.shape == x.shape and all(st == 0 for st in w.strides[:lead]):
        # the usual case: weights that vary only along the reduced axes (cos(lat)), and a block
        # laid out with those axes last: one pass of the two-stage kernel
        rows = int(np.prod(x.shape[:lead], dtype=np.int64))
        wx, ws = weighted_rows_gpu(x.reshape(rows, -1), w[(0,) * lead])
        shape = (*x.shape[:lead], *(1,) * len(axis))
        return {"wx": wx.reshape(shape), "w": ws.reshape(shape)}
    sums = _weighted_sum_reduction()(x, w.astype(np.float64, copy=False), axis=axis, keepdims=True).get()
    return {"wx": sums.real.copy(), "w": sums.imag.copy()}

