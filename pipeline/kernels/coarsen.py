"""Coarsening: the mean of the valid values of every window of ``factors[axis]`` steps.

The CPU kernel (:func:`coarsen_mean_formulas`) is array formulas: a mask of the
valid values, a masked copy, and two sums over the window axes of a reshaped view. On CuPy those
are several passes over the block and reductions over strided axes: 2-3% of the copy bandwidth
for the whole op on an H200 (benchmarks/ops_bandwidth.py). The GPU kernel (``cuda/coarsen.cu``)
makes one output value a thread: it loads its whole window (the window's factors are compiled in, and windows of up to 64
values are loaded whole before they are added), adds the valid values in float64 and writes
their mean, so the block is read once and the output written once.

The block may be any strided view (the op trims each coarsened axis to a multiple of its
factor, which slices the block). :func:`axis_groups` describes it as at most four (length,
factor, stride) axes, merging neighbouring axes that are not coarsened where their strides
allow; the kernel's output is C-ordered over those axes, which is the block's own order.
:func:`coarsen_groups_cpu` does the same indexing with NumPy strides, so that the grouping is
checked on every CI run.
"""

from __future__ import annotations


import numpy as np

from . import launch
from .slabs import map_slabs, temporaries

MAX_GROUPS = 4  # axes the kernel takes


def coarsen_mean_formulas(block, factors: dict[int, int], out_dtype):
    """Mean of the valid values of each window of ``factors[axis]`` steps along each axis, by
    array formulas on the array module of ``block`` (the CPU kernel, and the GPU kernel's
    fallback for blocks it does not take).

    Every coarsened axis of ``block`` is a multiple of its factor (the op rechunks so), so the
    windows are a reshape (n, ...) -> (n / f, f, ...) and a sum over the new ``f`` axes.
    """
    from ..backend import xp_of

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
    total = xp.where(valid, x, 0).sum(axis=axes, dtype=np.float64)
    n = valid.sum(axis=axes, dtype=np.float64)
    return xp.where(n > 0, total / xp.where(n > 0, n, 1), xp.nan).astype(out_dtype, copy=False)


@temporaries(3.5)
def coarsen_mean_cpu(block, factors: dict[int, int], out_dtype):
    """:func:`coarsen_mean_formulas`, slab by slab along an axis that is not coarsened (the whole
    block at once where every axis is)."""
    return map_slabs(coarsen_mean_formulas, block, factors, out_dtype, whole=tuple(factors))


def axis_groups(shape, strides, factors: dict[int, int]):
    """The block as (length, factor, stride) axes, strides in elements: axes of length 1 dropped,
    and runs of axes that are not coarsened merged where one stride follows from the next. None
    if more than :data:`MAX_GROUPS` remain."""
    groups: list[tuple[int, int, int]] = []
    for axis, (n, s) in enumerate(zip(shape, strides)):
        f = int(factors.get(axis, 1))
        if n == 1 and f == 1:
            continue
        if f == 1 and groups and groups[-1][1] == 1 and groups[-1][2] == n * s:
            n0, _, _ = groups[-1]
            groups[-1] = (n0 * n, 1, s)
            continue
        groups.append((int(n), f, int(s)))
    if len(groups) > MAX_GROUPS:
        return None
    return [(1, 1, 0)] * (MAX_GROUPS - len(groups)) + groups


def _params(in_dtype, out_dtype, window, wide: bool, threads: int) -> dict:
    f0, f1, f2, f3 = window
    return dict(in_t=launch.c_type(in_dtype), out_t=launch.c_type(out_dtype), idx_t="long long" if wide else "unsigned int",
                f0=f0, f1=f1, f2=f2, f3=f3, threads=threads)


def source(in_dtype, out_dtype, window: tuple[int, int, int, int], wide: bool, threads: int = launch.THREADS) -> str:
    return launch.cuda_source("coarsen.cu", **_params(in_dtype, out_dtype, window, wide, threads))


def _raw(in_dtype, out_dtype, window, wide: bool):
    # compiled with CuPy's default options (this kernel never had --fmad=false: it only adds)
    return launch.raw_kernel("coarsen.cu", "pipeline_coarsen_mean", (),
                             **_params(in_dtype, out_dtype, window, wide, launch.THREADS))


def _plan(block, factors: dict[int, int]):
    """The groups of ``block`` for the kernel, or None where the kernel does not take it."""
    if np.dtype(block.dtype) not in launch.C_TYPES or any(s % block.itemsize for s in block.strides):
        return None
    return axis_groups(block.shape, [s // block.itemsize for s in block.strides], factors)


def out_shape(shape, factors: dict[int, int]) -> tuple[int, ...]:
    return tuple(n // int(factors.get(axis, 1)) for axis, n in enumerate(shape))


def coarsen_mean_gpu(block, factors: dict[int, int], out_dtype):
    """:func:`coarsen_mean_cpu` on a CuPy block, by the CUDA C kernel (blocks of types or windows
    it does not take: by the array formulas)."""
    import cupy

    groups = _plan(block, factors)
    if groups is None:
        contiguous = cupy.ascontiguousarray(block)
        groups = _plan(contiguous, factors)
        if groups is None:
            return coarsen_mean_formulas(block, factors, out_dtype)
        block = contiguous
    out = cupy.empty(out_shape(block.shape, factors), dtype=out_dtype)
    total = out.size
    if total == 0:
        return out
    (_, f0, s0), (m1n, f1, s1), (m2n, f2, s2), (m3n, f3, s3) = groups
    m1, m2, m3 = m1n // f1, m2n // f2, m3n // f3
    wide = total >= 2**31
    idx = np.int64 if wide else np.uint32
    kernel = _raw(np.dtype(block.dtype), np.dtype(out_dtype), (f0, f1, f2, f3), wide)
    kernel((-(-total // launch.THREADS),), (launch.THREADS,), (block, out, idx(m1), idx(m2), idx(m3), np.int64(s0), np.int64(s1),
                                                  np.int64(s2), np.int64(s3), idx(total)))
    return out


def coarsen_groups_cpu(block: np.ndarray, factors: dict[int, int], out_dtype) -> np.ndarray:
    """The kernel's indexing with NumPy: the block seen through its groups' lengths and strides
    (four axes), coarsened by the CPU kernel, in the block's own shape."""
    groups = axis_groups(block.shape, [s // block.itemsize for s in block.strides], factors)
    assert groups is not None, "more groups than the kernel takes"
    view = np.lib.stride_tricks.as_strided(block, shape=[n for n, _, _ in groups],
                                           strides=[s * block.itemsize for _, _, s in groups], writeable=False)
    out = coarsen_mean_formulas(view, {i: f for i, (_, f, _) in enumerate(groups) if f > 1}, out_dtype)
    return out.reshape(out_shape(block.shape, factors))
