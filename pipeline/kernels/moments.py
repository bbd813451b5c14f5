"""Count, mean and sum of squared deviations along one axis of a block, in one pass.

On the GPU each thread walks a few grid points' steps (the CUDA C kernel ``cuda/moments.cu``),
so a block of data is read once (CuPy's NaN-skipping reductions would read it once per statistic
and once more for the deviations). On the CPU the same per-point loop runs, compiled by Numba, over
a tile of points at a time (:func:`moments_cpu`); the two-pass NumPy formula serves several axes.

The kernel's twin (:func:`moments_twin`) is the per-point loop :func:`make_moments_column`,
compiled for the CPU by Numba: within a tile of steps both do the same float64 operations in the
same order, so they agree bit for bit. (That loop under ``numba.cuda`` was the previous GPU kernel;
it is in ``benchmarks/kernels_previous.py``.)
"""

from __future__ import annotations


import numpy as np

from ..backend import xp_of
from . import launch
from .slabs import map_slabs, temporaries


def make_moments_column(jit):
    """The per-point loop, compiled by ``jit`` (``numba.njit`` or ``cuda.jit(device=True)``).

    Sums of deviations from a shift (the point's first valid value) give the mean and M2 with
    no division per element, which would make the loop compute-bound in float64; with the shift
    inside the data's range the cancellation in ``M2 = S2 - S1^2 / n`` stays at float64 rounding.
    Four steps are loaded before any is used: a thread then has four loads in flight, not one,
    which the GPU needs to approach its memory bandwidth (see the streaming kernels of :mod:`pipeline.kernels.launch`).
    """

    @jit
    def update(count, shift, s1, s2, v):
        if v == v:
            if count == 0:
                shift = v
            d = v - shift
            count += 1
            s1 += d
            s2 += d * d
        return count, shift, s1, s2

    @jit
    def column(x, n, mean, m2, p):
        count, shift, s1, s2 = 0, 0.0, 0.0, 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            # float(): accumulate in float64, compiled or in the CUDA simulator alike
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            count, shift, s1, s2 = update(count, shift, s1, s2, v0)
            count, shift, s1, s2 = update(count, shift, s1, s2, v1)
            count, shift, s1, s2 = update(count, shift, s1, s2, v2)
            count, shift, s1, s2 = update(count, shift, s1, s2, v3)
            t += 4
        while t < nt:
            count, shift, s1, s2 = update(count, shift, s1, s2, float(x[t, p]))
            t += 1
        n[p] = count
        if count > 0:
            mean[p] = shift + s1 / count
            m2[p] = max(s2 - s1 * s1 / count, 0.0)
        else:
            mean[p] = 0.0
            m2[p] = 0.0

    return column


# --- GPU kernel: CUDA C, U points a thread ------------------------------------------------------------
#
# The Numba kernel gives each thread one point and four loads in flight, and measured 56-70% of
# the copy bandwidth on an H200 (benchmarks/ops_bandwidth.py), the spread being its tail: one
# thread per point, all steps, 1M points make 4 uneven waves. Here a thread keeps U points, one
# load of each in flight while the previous step is summed (as pipeline.kernels.weighted's tiled
# kernel, 87%), and the steps are cut into tiles, merged afterwards, only where the points alone
# are too few to fill the GPU.

THREADS = 128  # threads per block
UNROLL = 4  # points per thread, loads in flight per thread

def source(in_dtype, threads: int = THREADS, unroll: int = UNROLL) -> str:
    """The CUDA source of the kernel (the tests compile it with nvcc too)."""
    return launch.cuda_source("moments.cu", in_t=launch.c_type(in_dtype), threads=threads, unroll=unroll)


def _raw_kernel(in_dtype, threads: int, unroll: int):
    return launch.raw_kernel("moments.cu", "pipeline_moments", launch.FMAD, in_t=launch.c_type(in_dtype),
                             threads=threads, unroll=unroll)


def plan(nt: int, npts: int, sms: int = 132, threads: int = THREADS, unroll: int = UNROLL) -> int:
    """Steps per tile: all of them, unless the points alone make fewer than 8 blocks per
    multiprocessor; then tiles of at least 64 steps, enough of them to make 8."""
    point_blocks = max(1, -(-npts // (threads * unroll)))
    tiles = 1
    if point_blocks < 8 * sms:
        tiles = max(1, min(-(-8 * sms // point_blocks), nt // 64))
    return max(1, -(-nt // tiles))


def merge_tiles(parts, xp):
    """(n, mean, m2) of the tiles of ``parts`` (tiles, 3, points), merged by Chan's formula: on
    CuPy by the merge kernel, on NumPy by its formula (:func:`moments_merge_cpu`), bit for bit."""
    if parts.shape[0] == 1:
        return parts[0, 0], parts[0, 1], parts[0, 2]
    if xp is np:
        merged = moments_merge_cpu({"n": parts[:, 0], "mean": parts[:, 1], "m2": parts[:, 2]}, 0)
        return tuple(merged[f][0] for f in ("n", "mean", "m2"))
    out = [xp.empty(parts.shape[2], dtype=np.float64) for _ in range(3)]
    _merge([parts[:, f] for f in range(3)], 3 * parts.shape[2], out)
    return tuple(out)


def moments_raw(x2d, *, tile: int | None = None, threads: int = THREADS, unroll: int = UNROLL):
    """(n, mean, m2), float64 arrays of length ``points``, of a C-contiguous (steps, points) CuPy
    array, by the CUDA C kernel; ``tile`` (steps per tile) defaults to :func:`plan`'s choice."""
    import cupy

    nt, npts = x2d.shape
    tile = plan(nt, npts, launch.sm_count(), threads, unroll) if tile is None else max(1, int(tile))
    tiles = max(1, -(-nt // tile))
    parts = cupy.empty((tiles, 3, npts), dtype=np.float64)
    if npts:
        grid = (launch.blocks(npts, threads * unroll), tiles)
        _raw_kernel(np.dtype(x2d.dtype), threads, unroll)(grid, (threads,), (x2d, parts, np.int64(nt), np.int64(npts), np.int64(tile)))
    return merge_tiles(parts, cupy)


@launch.once
def _twin_columns():
    column = make_moments_column(launch.cpu_jit)

    @launch.cpu_jit
    def columns(x, n, mean, m2):
        for p in range(x.shape[1]):
            column(x, n, mean, m2, p)

    return columns


def moments_twin(x2d, *, tile: int):
    """What :func:`moments_raw` computes with tiles of ``tile`` steps, on the CPU: the per-point
    loop (Numba) over each tile, then the same merge."""
    nt, npts = x2d.shape
    tiles = max(1, -(-nt // tile))
    parts = np.empty((tiles, 3, npts))
    columns = _twin_columns()
    for k in range(tiles):
        columns(np.ascontiguousarray(x2d[k * tile : (k + 1) * tile]), parts[k, 0], parts[k, 1], parts[k, 2])
    return merge_tiles(parts, np)


# points a thread's loop keeps accumulators for at a time: four float64 values each, 64 kB, within
# the core's L2 cache, while each step's run of points is read from memory once
POINT_TILE = 2048


def _moments_loop(x, n, mean, m2, tile):
    """The per-point loop of :func:`make_moments_column` over an (outer, steps, points) array, the
    steps walked in order for a tile of points at a time (each step's points are contiguous):
    per point the same float64 operations in the same order as the column loop, so the results
    are bit for bit :func:`moments_twin`'s with one tile. Compiled by :func:`launch.cpu_loop`."""
    outer, nt, npts = x.shape
    count = np.zeros(tile, np.int64)
    shift = np.zeros(tile)
    s1 = np.zeros(tile)
    s2 = np.zeros(tile)
    for o in range(outer):
        for p0 in range(0, npts, tile):
            width = min(npts - p0, tile)
            for q in range(width):
                count[q] = 0
                shift[q] = 0.0
                s1[q] = 0.0
                s2[q] = 0.0
            for t in range(nt):
                for q in range(width):
                    v = float(x[o, t, p0 + q])
                    if v == v:
                        if count[q] == 0:
                            shift[q] = v
                        d = v - shift[q]
                        count[q] += 1
                        s1[q] += d
                        s2[q] += d * d
            for q in range(width):
                c = count[q]
                n[o, p0 + q] = c
                if c > 0:
                    mean[o, p0 + q] = shift[q] + s1[q] / c
                    m2[o, p0 + q] = max(s2[q] - s1[q] * s1[q] / c, 0.0)
                else:
                    mean[o, p0 + q] = 0.0
                    m2[o, p0 + q] = 0.0


def three_axes(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, along, inner): the shape of a C-ordered block of ``shape`` seen around ``axis``,
    a view of it with no copy."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, shape[axis], inner


@temporaries(5)
def moments_cpu(block, axis) -> dict:
    """{n, mean, m2} of a block over ``axis`` (an int or a tuple, kept with length 1), float64,
    NaN-skipping: count, mean, and the sum of squared deviations from the mean.

    Along one axis of a C-contiguous float block, the per-point loop (:func:`_moments_loop`,
    compiled by Numba, releasing the GIL): one read of the block and no temporaries. The array
    formulas of :func:`moments_formula` made ten passes over float64 temporaries (slab by slab),
    and on 16 threads the page faults of allocating them scaled 4x where NumPy's own reductions
    scaled 11x (docs/performance.md). Over several axes, the formulas."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(axes) != 1 or block.dtype.kind != "f" or not block.flags.c_contiguous or block.size == 0:
        return moments_formula(block, axes)
    a = axes[0] % block.ndim
    shape = block.shape[:a] + (1,) + block.shape[a + 1 :]
    outer, steps, inner = three_axes(block.shape, a)
    out = {k: np.empty(shape) for k in ("n", "mean", "m2")}
    launch.cpu_loop(_moments_loop)(block.reshape(outer, steps, inner), *(v.reshape(outer, inner) for v in out.values()), POINT_TILE)
    return out


def moments_formula(block, axis) -> dict:
    """{n, mean, m2} by array formulas, on the array module of ``block``, slab by slab along an
    axis not reduced (:func:`pipeline.kernels.slabs.map_slabs`): the two-pass formula inside a
    block, any axes."""
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return map_slabs(_moments_formula, block, axis, whole=axis)


def _moments_formula(block, axis: tuple[int, ...]) -> dict:
    xp = xp_of(block)
    valid = ~xp.isnan(block)
    n = valid.sum(axis=axis, keepdims=True, dtype=np.float64)
    total = xp.nansum(block, axis=axis, keepdims=True, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = xp.where(n > 0, total / xp.where(n > 0, n, 1), 0.0)
    dev = xp.where(valid, block.astype(np.float64, copy=False) - mean, 0.0)
    m2 = (dev * dev).sum(axis=axis, keepdims=True)
    return {"n": n, "mean": mean, "m2": m2}


def moments_gpu(block, axis) -> dict:
    """{n, mean, m2} of a CuPy block over ``axis`` (kept with length 1), float64: the CUDA C
    kernel over one axis (the array formulas of :func:`moments_formula` over several)."""
    import cupy

    if not isinstance(axis, int):
        if len(axis) != 1:
            return moments_formula(block, axis)
        axis = axis[0]
    x2, moved = launch.to_2d(block, axis, cupy)
    n, mean, m2 = moments_raw(x2)
    return {k: launch.reduced_from_2d(v, moved, axis, cupy) for k, v in {"n": n, "mean": mean, "m2": m2}.items()}


# --- merging partials: the reduction's combine and finalize -----------------------------------------
#
# On CuPy the array formulas below compiled a kernel for each operation on a fresh machine (a sum,
# where, multiply, divide, subtract, add, sqrt: ten of them, 0.1 s each, one after another, the
# largest part of the climate flow's first run once pipeline's own kernels shipped compiled). The
# CUDA C kernels of cuda/moments_merge.cu do the same operations in the same order, in one pass.

MERGE_THREADS = 256


def _merge_kernel(name: str):
    return launch.raw_kernel("moments_merge.cu", name, launch.FMAD)


def _rows(a, axis: tuple[int, ...]):
    """``a`` as (parts, points) without a copy, where the partials lie side by side along one axis
    with no other axis of length > 1 before it (dask's tree along the first axis); else None."""
    if len(axis) != 1 or not a.flags.c_contiguous or a.dtype != np.float64 or int(np.prod(a.shape[: axis[0]], dtype=np.int64)) != 1:
        return None
    return a.reshape(a.shape[axis[0]], -1)


def moments_merge_cpu(p, axis) -> dict:
    """Chan, Golub and LeVeque's merge of (n, mean, M2) partials laid side by side along ``axis``
    (an int or a tuple), to one partial with those axes at length 1. Written against the array
    module of the partials: the GPU's fallback for layouts its kernel does not take."""
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    xp = xp_of(p["n"])
    n_i, mean_i, m2_i = p["n"], p["mean"], p["m2"]
    n = n_i.sum(axis=axis, keepdims=True)
    safe_n = xp.where(n > 0, n, 1)
    mean = (n_i * mean_i).sum(axis=axis, keepdims=True) / safe_n
    delta = mean_i - mean
    m2 = m2_i.sum(axis=axis, keepdims=True) + (n_i * delta * delta).sum(axis=axis, keepdims=True)
    return {"n": n, "mean": mean, "m2": m2}


# points a tile of the host's merge of partials: its sums stay in the first-level cache
MERGE_TILE = 2048


def moments_merge_parts_cpu(parts, axis) -> dict:
    """:func:`moments_merge_cpu` of ``parts``, a list of partials in axis order along one axis,
    each of length 1 there, without laying them side by side: the loop :func:`_merge_parts_loop`,
    the CUDA merge kernel's twin, adds each point's parts in order, tile by tile of points, bit for
    bit. The formula on the partials laid side by side held a copy of them and temporaries of that
    size; on 16 threads, the same formula slab by slab took twice as long (its temporaries' pages)."""
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    fields = ("n", "mean", "m2")
    shape = parts[0]["n"].shape
    if len(axis) != 1 or shape[axis[0]] != 1 or any(
        p[f].shape != shape or p[f].dtype != np.float64 or not p[f].flags.c_contiguous for p in parts for f in fields
    ):
        return moments_merge_cpu({f: np.concatenate([p[f] for p in parts], axis=axis[0]) for f in fields}, axis)
    out = {f: np.empty(shape) for f in fields}
    # tuples of the parts' arrays: the loop is compiled (and cached on disk) for each number of
    # parts, where Numba's typed lists compiled their own methods in every process (0.6 s)
    rows = [tuple(p[f].reshape(-1) for p in parts) for f in fields]
    launch.cpu_loop(_merge_parts_loop)(*rows, *(v.reshape(-1) for v in out.values()), MERGE_TILE)
    return out


def _merge_parts_loop(ns, means, m2s, n_out, mean_out, m2_out, tile):
    """Chan's merge of the parts (tuples of equal 1-D arrays, in order), the operations of
    cuda/moments_merge.cu in its order, for a tile of points at a time."""
    npts = n_out.shape[0]
    k = len(ns)
    e = np.empty(tile)
    for t0 in range(0, npts, tile):
        t1 = min(npts, t0 + tile)
        a, b, c = ns[0], means[0], m2s[0]
        for p in range(t0, t1):
            n_out[p] = a[p]
            mean_out[p] = a[p] * b[p]
            m2_out[p] = c[p]
        for r in range(1, k):
            a, b, c = ns[r], means[r], m2s[r]
            for p in range(t0, t1):
                n_out[p] += a[p]
                mean_out[p] += a[p] * b[p]
                m2_out[p] += c[p]
        for p in range(t0, t1):
            n = n_out[p]
            mean_out[p] = mean_out[p] / (n if n > 0.0 else 1.0)
        a, b = ns[0], means[0]
        for p in range(t0, t1):
            d = b[p] - mean_out[p]
            e[p - t0] = a[p] * d * d
        for r in range(1, k):
            a, b = ns[r], means[r]
            for p in range(t0, t1):
                d = b[p] - mean_out[p]
                e[p - t0] += a[p] * d * d
        for p in range(t0, t1):
            m2_out[p] += e[p - t0]


def moments_merge_gpu(p, axis) -> dict:
    """:func:`moments_merge_cpu` on CuPy partials, by one CUDA C kernel, bit for bit."""
    import cupy

    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    rows = [_rows(p[k], axis) for k in ("n", "mean", "m2")]
    if any(r is None for r in rows) or len({r.shape for r in rows}) != 1:
        return moments_merge_cpu(p, axis)
    shape = tuple(1 if a in axis else s for a, s in enumerate(p["n"].shape))
    out = {f: cupy.empty(shape, dtype=np.float64) for f in ("n", "mean", "m2")}
    _merge(rows, rows[0].shape[1], [v.reshape(-1) for v in out.values()])
    return out


def _merge(fields, stride: int, out) -> None:
    """The merge kernel over ``fields`` (n, mean, m2: (parts, points) views whose parts are
    ``stride`` values apart) into ``out`` (three arrays of ``points``)."""
    k, npts = fields[0].shape
    if npts:
        _merge_kernel("pipeline_moments_merge")(
            (launch.blocks(npts, MERGE_THREADS),), (MERGE_THREADS,), (*fields, np.int64(stride), *out, np.int64(k), np.int64(npts))
        )


def mean_std_cpu(p, axis: int):
    """The mean and the (ddof=0) standard deviation of a merged partial, stacked along ``axis``
    (where it has length 1), NaN where there is no value. Written against the array module of
    the partial: the GPU's fallback."""
    if isinstance(axis, tuple):
        (axis,) = axis
    xp = xp_of(p["n"])
    n = p["n"]
    has = n > 0
    mean = xp.where(has, p["mean"], xp.nan)
    std = xp.sqrt(xp.where(has, p["m2"] / xp.where(has, n, 1), xp.nan))
    return xp.concatenate([mean, std], axis=axis)


def mean_std_gpu(p, axis: int):
    """:func:`mean_std_cpu` on a CuPy partial, by one CUDA C kernel, bit for bit."""
    import cupy

    if isinstance(axis, tuple):
        (axis,) = axis
    n = p["n"]
    if any(_rows(p[k], (axis,)) is None for k in ("n", "mean", "m2")):
        return mean_std_cpu(p, axis)
    out = cupy.empty(n.shape[:axis] + (2,) + n.shape[axis + 1 :], dtype=np.float64)
    if n.size:
        _merge_kernel("pipeline_mean_std")(
            (launch.blocks(n.size, MERGE_THREADS),), (MERGE_THREADS,), (n, p["mean"], p["m2"], out, np.int64(n.size))
        )
    return out
