"""Polynomial trends along one axis: the partial normal equations of a block (``polyfit``), the
trend's subtraction (``polyval_subtract``), and both at once where a block holds the whole axis
(``detrend_block``).

A least-squares polynomial per grid point, as normal equations: over the valid samples,
S_k = sum u^k (k = 0..2 deg) and T_k = sum u^k x (k = 0..deg); the (deg + 1)^2 system solved per
point gives the coefficients (NaN where fewer than deg + 1 samples are valid). Sums run in float64
so that float32 data come out within float32 rounding of a float64 reference.

- CPU: array formulas (:func:`polyfit_cpu`, :func:`polyfit_finalize`, :func:`polyval_subtract_cpu`,
  :func:`detrend_block_cpu`), written against the array module of their input; they are also the
  twins of the GPU kernels.
- GPU: the per-point loops of :func:`make_trend_columns` under Numba CUDA, one thread per grid
  point (:func:`trend_kernels`): ``sums`` for ``polyfit``, ``subtract`` for ``polyval_subtract``,
  and ``detrend`` (fit, solve, subtract) for blocks the tile kernel does not take; and the CUDA C
  tile kernel (``cuda/detrend.cu``, :func:`detrend_tile`), which detrends a block holding the whole
  axis in one read.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..backend import xp_of
from . import launch
from .slabs import map_slabs, temporaries

ACC = np.float64

# numba.cuda, set on first GPU use by trend_kernels: a global of the module that defines the
# @cuda.jit kernels, as Numba's CUDA simulator requires (see launch.numba_cuda)
cuda = None


# --- CPU: array formulas -------------------------------------------------------------------------


@temporaries(9)
def polyfit_cpu(x, u, axis, deg: int):
    """Partial sums of the normal equations over one block: S_k = sum u^k and T_k = sum u^k x over
    the valid samples, k = 0..2 deg and 0..deg, with ``axis`` kept at length 1 (``u`` is the
    coordinate broadcast to the block). Array formulas, on the array module of ``x``, slab by slab
    along an axis not reduced (:func:`pipeline.kernels.slabs.map_slabs`)."""
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return map_slabs(_polyfit_formula, x, u, axis, deg, whole=axis)


def _polyfit_formula(x, u, axis, deg: int) -> dict:
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
    """Coefficients c_0..c_deg of sum c_k u^k, stacked along ``axis``; NaN where fewer than deg + 1
    samples are valid (the normal matrix is singular there). On the array module of ``p``."""
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


@temporaries(6.5)
def polyval_subtract_cpu(x, u, *coefficients, out_dtype, axis=None):
    """x - sum c_k u^k, by Horner's rule in float64 (``axis``, that of u, is for the GPU kernel),
    slab by slab."""
    return map_slabs(_polyval_subtract_formula, x, u, *coefficients, out_dtype=out_dtype)


def _polyval_subtract_formula(x, u, *coefficients, out_dtype):
    u = u.astype(ACC, copy=False)
    trend = coefficients[-1]
    for c in coefficients[-2::-1]:
        trend = trend * u + c
    return (x.astype(ACC, copy=False) - trend).astype(out_dtype, copy=False)


def detrend_block_cpu(x, u, *, axis: int, deg: int, out_dtype):
    """x minus its least-squares polynomial along ``axis``, which the block holds whole, by the
    formulas above (the twin of :func:`detrend_block_gpu`)."""
    xp = xp_of(x)
    u = xp.broadcast_to(u, x.shape)
    p = polyfit_cpu(x, u, axis, deg)
    c = polyfit_finalize(p, axis, deg)
    coefs = [c[tuple(slice(k, k + 1) if i == axis else slice(None) for i in range(x.ndim))] for k in range(deg + 1)]
    return polyval_subtract_cpu(x, u, *coefs, out_dtype=out_dtype)


# --- GPU: one thread per grid point, Numba CUDA ------------------------------------------------------
#
# The formulas above make a float64 temporary the size of the block per power of u and per product
# (about ten passes over memory for deg 1). On the GPU, Numba CUDA kernels walk each point's steps
# instead (a warp reads 32 neighbouring points of one step, coalesced; four steps loaded ahead):
#
# - ``sums``: the partial normal equations of a block, S_k and T_k, in one read (chunked axis);
# - ``subtract``: x - sum c_k u^k by Horner's rule, one read and one write;
# - ``detrend``: where the block holds the whole axis, both in one kernel, with the (deg + 1)^2
#   normal equations solved per point in between (Gaussian elimination with partial pivoting, as
#   LAPACK's getrf; NaN where fewer than deg + 1 samples are valid). It reads the block twice
#   (the fit needs every step before the first subtraction) and writes it once; the tile kernel
#   below reads it once, where a tile of its series fits in shared memory.


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


@functools.cache
def trend_kernels(deg: int) -> dict:
    """The Numba CUDA kernels for polynomials of degree ``deg``, one thread per grid point ``p`` of
    a 2-D ``x[t, p]``, ``u[t]`` the coordinate: ``sums`` (normal equations), ``subtract`` (given the
    coefficients ``c[k, p]``) and ``detrend`` (both, with the solve between)."""
    global cuda
    cuda = launch.numba_cuda()
    m, n = deg + 1, 2 * deg + 1
    sums, solve, subtract = make_trend_columns(cuda.jit(device=True), deg)

    @launch.cuda_kernel
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

    @launch.cuda_kernel
    def subtract_kernel(x, u, c_in, out):
        p = cuda.grid(1)
        if p < x.shape[1]:
            c = cuda.local.array(m, np.float64)
            for k in range(m):
                c[k] = c_in[k, p]
            subtract(x, u, c, out, p)

    @launch.cuda_kernel
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


def _axis_values(u, axis: int, n: int):
    """The coordinate along ``axis`` of a block of ``u`` (broadcast, or of length 1 elsewhere)."""
    import cupy

    u = cupy.moveaxis(u, axis, 0)
    return cupy.ascontiguousarray(u[(slice(None), *(0,) * (u.ndim - 1))], dtype=ACC).reshape(n)


def polyfit_gpu(x, u, axis, deg: int):
    """:func:`polyfit_cpu` on a CuPy block, by the ``sums`` kernel."""
    import cupy

    axis = axis[0] if isinstance(axis, tuple) else axis
    x2, moved = launch.to_2d(x, axis, cupy)
    s = cupy.empty((2 * deg + 1, x2.shape[1]), dtype=ACC)
    b = cupy.empty((deg + 1, x2.shape[1]), dtype=ACC)
    launch.launch_numba(trend_kernels(deg)["sums"], x2.shape[1], x2, _axis_values(u, axis, x2.shape[0]), s, b)
    kept = lambda v: launch.reduced_from_2d(v, moved, axis, cupy)  # noqa: E731
    return {**{f"s{k}": kept(s[k]) for k in range(2 * deg + 1)}, **{f"t{k}": kept(b[k]) for k in range(deg + 1)}}


def polyval_subtract_gpu(x, u, *coefficients, out_dtype, axis: int):
    """:func:`polyval_subtract_cpu` on a CuPy block, by the ``subtract`` kernel."""
    import cupy

    x2, moved = launch.to_2d(x, axis, cupy)
    npts = x2.shape[1]
    c = cupy.stack([cupy.moveaxis(ck, axis, 0).reshape(npts) for ck in coefficients]).astype(ACC, copy=False)
    out = cupy.empty(x2.shape, dtype=out_dtype)
    launch.launch_numba(trend_kernels(len(coefficients) - 1)["subtract"], npts, x2, _axis_values(u, axis, x2.shape[0]), c, out)
    return launch.from_2d(out, moved, axis, cupy)


def detrend_block_gpu(x, u, *, axis: int, deg: int, out_dtype):
    """:func:`detrend_block_cpu` on a CuPy block: the CUDA C tile kernel, which reads the block
    once, where a tile of its series fits in shared memory (:func:`plan`); otherwise the Numba
    ``detrend`` kernel, which reads it twice."""
    import cupy

    x2, moved = launch.to_2d(x, axis, cupy)
    u1 = _axis_values(u, axis, x2.shape[0])
    out = cupy.empty(x2.shape, dtype=out_dtype)
    if not detrend_tile(x2, u1, out, deg):
        launch.launch_numba(trend_kernels(deg)["detrend"], x2.shape[1], x2, u1, out)
    return launch.from_2d(out, moved, axis, cupy)


# --- GPU: the tile kernel, CUDA C, reading the block once ---------------------------------------------
#
# Detrending a block that holds the whole axis, on the GPU, reading it once: CUDA C.
#
# The Numba ``detrend`` kernel above (one thread per grid point: fit, solve,
# subtract) reads each point's series twice, as the fit needs every step before the first
# subtraction: 43-50% of the copy bandwidth on an H200 (benchmarks/ops_bandwidth.py, counting one
# read and one write). This kernel holds a tile of ``P`` neighbouring points over all the steps in
# shared memory, filled by asynchronous copies (``cp.async``: the whole tile's loads in flight at
# once, no registers held), with the steps' coordinates beside it. Where the tile and its
# coordinates fit 100 KB (730 float32 steps of 32 points), one block holds the whole tile; longer
# series, on GPUs of compute capability 9.0, split the tile along the steps over a cluster of ``C``
# blocks (one slab of steps each), whose sums meet through distributed shared memory:
#
# 1. thread (q, g) sums the data's normal equations of point q (sums of u^k x, and the count) over
#    steps g, g + G, ... of its block's slab (G = TILE_THREADS / P groups of steps), from shared memory;
#    the sums of u^k alone are the same for every group without NaN, so they are made once per
#    launch (``pipeline_detrend_whole``), and a group with NaNs makes its own in a second look;
# 2. each block adds its groups in order g = 0, 1, ...; then every block of the tile adds the
#    blocks' totals in order (block 0's first), so all hold the same sums, and one thread per point
#    solves the (deg + 1)^2 system (Gaussian elimination with partial pivoting, as the Numba kernel);
# 3. thread (q, g) writes x - trend over its steps of the slab, again from shared memory.
#
# What bounds it (730 x 1038240 float32 with a masked region, H200, share of the copy bandwidth):
# the width of a tile's rows, and the float64 work. Copying tiles through shared memory without
# any arithmetic reached 66% with rows of 16 points (64 bytes), 82-84% with 32 and 86-96% with 64
# to 512. Conversions to and from float64 issue at a quarter of the rate of float64 additions (16
# against 64 a clock per multiprocessor, in the CUDA programming guide's table), and the coordinate
# was read from global memory at every step. With the coordinates in shared memory and NaN tested
# on the stored value, before any conversion, one block a tile of 32 points went from 58-67% to 81.5-81.8% (two
# blocks a multiprocessor), and of 16 points from 65-66% to 72.4-74.2%. Clusters gain less: 32
# points over 2 blocks 70.6-70.7%, over 3 blocks 66-68% (both before and after); for 1460 steps,
# 32 points over 4 or 5 blocks 69.4-69.9%, 16 points over 2 to 4 blocks 62.5-65.3%. Not kept: 64
# points over 3 to 8 blocks (51-64%), 128 over 8 (45-49%); a persistent grid of blocks looping
# over tiles with two tile buffers each, the next tile's copies in flight during this one's sums
# (22-55%); reading each tile twice, the second time from L2, with no tile in shared memory
# (40-53%); series held in registers (35-60%).
#
# Rows of a tile are ``P`` consecutive points: whole 32-byte sectors, and 16-byte copies where the
# addresses allow. Blocks whose series do not fit (``plan`` returns None) use the Numba kernel. The
# twin (:func:`detrend_tile_twin`, Numba on the CPU) does the same float64 operations in the same
# order; without fused multiply-adds (``--fmad=false``) the two agree bit for bit.

TILE_THREADS = 256  # threads per block of the tile kernel: TILE_THREADS / P groups of steps per point
TILE_BYTES = 40 * 1024  # a block's share of a tile at most: four blocks fit a multiprocessor
ONE_BLOCK_BYTES = 100 * 1024  # a whole tile and its coordinates in one block: two blocks fit a multiprocessor
MAX_CLUSTER = 8  # the largest cluster that every GPU of compute capability 9.0 schedules
ROW_BYTES = (128, 64)  # widths of a tile's rows, widest first (256 measured slower, see above)


def _params(in_dtype, out_dtype, deg: int, points: int, threads: int, cluster: int) -> dict:
    return dict(in_t=launch.c_type(in_dtype), out_t=launch.c_type(out_dtype), points=points, threads=threads,
                m=deg + 1, cluster=cluster)


def source(in_dtype, out_dtype, deg: int, points: int = 64, threads: int = TILE_THREADS, cluster: int = 1) -> str:
    """The CUDA source of the kernel (the tests compile it with nvcc too)."""
    return launch.cuda_source("detrend.cu", **_params(in_dtype, out_dtype, deg, points, threads, cluster))


def _raw_kernel(in_dtype, out_dtype, deg: int, points: int, threads: int, cluster: int, name: str):
    # both kernels of one source (pipeline_detrend_whole, pipeline_detrend_tile): compiled once
    return launch.raw_kernel("detrend.cu", name, launch.FMAD_CXX17, **_params(in_dtype, out_dtype, deg, points, threads, cluster))


def slab(nt: int, cluster: int) -> int:
    """Steps of the series that each block of a tile holds (the last block may hold fewer)."""
    return -(-nt // cluster)


@functools.cache
def _clusters_ok() -> bool:
    """Blocks in clusters need compute capability 9.0 (Hopper) or later."""
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 90  # "90", "100": compare as numbers


def plan(nt: int, itemsize: int, dtype_ok: bool = True, clusters: bool = True) -> tuple[int, int] | None:
    """(points a tile, blocks a tile) for series of ``nt`` steps: one block a tile where the tile
    and its coordinates fit ``ONE_BLOCK_BYTES``, with rows of 128 or 64 bytes (64 or 32 before
    compute capability 9.0); otherwise (from 9.0) the widest rows of ``ROW_BYTES`` whose tile,
    split over at most ``MAX_CLUSTER`` blocks, keeps each block's share within ``TILE_BYTES``.
    None where none fits (the Numba kernel reads the block twice instead)."""
    if not dtype_ok or nt < 1:
        return None
    for row in (128, 64) if clusters else (64, 32):
        if nt * (row + 8) <= ONE_BLOCK_BYTES:  # the tile's rows and the steps' float64 coordinates
            return row // itemsize, 1
    if clusters:
        for row in ROW_BYTES:
            cluster = -(-nt * row // TILE_BYTES)
            if cluster <= MAX_CLUSTER:
                return row // itemsize, cluster
    return None


def supported(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))


def detrend_tile(x2d, u1d, out2d, deg: int, *, points: int | None = None, cluster: int | None = None,
                 threads: int = TILE_THREADS) -> bool:
    """Detrend the C-contiguous (steps, points) CuPy array ``x2d`` into ``out2d`` by the tile
    kernel (``u1d`` the float64 coordinate of the steps); False, doing nothing, where
    :func:`plan` finds no tile. ``points`` and ``cluster`` are the plan's unless both are given."""
    nt, npts = x2d.shape
    if (points is None) != (cluster is None):
        raise ValueError("detrend_tile: give both points and cluster, or neither")
    if points is None:
        chosen = plan(nt, x2d.dtype.itemsize, supported(x2d.dtype), _clusters_ok())
        if chosen is None:
            return False
        points, cluster = chosen
    if npts == 0:
        return True
    import cupy

    types = (np.dtype(x2d.dtype), np.dtype(out2d.dtype), deg, points, threads, cluster)
    groups, n, steps = threads // points, 2 * deg + 1, slab(nt, cluster)
    whole = cupy.empty(cluster * groups * n, dtype=np.float64)
    _raw_kernel(*types, "pipeline_detrend_whole")((-(-whole.size // 128),), (128,), (u1d, whole, np.int32(nt), np.int32(steps)))
    kernel = _raw_kernel(*types, "pipeline_detrend_tile")
    smem = -(-steps * points * x2d.dtype.itemsize // 8) * 8 + steps * 8  # the tile, then the slab's coordinates
    # with its static arrays a block may need more than the default 48 KB: ask for it each time
    kernel.max_dynamic_shared_size_bytes = smem
    # 16-byte copies need 16-byte aligned rows: the array's start and its row length
    vectors = int(x2d.data.ptr % 16 == 0 and (npts * x2d.dtype.itemsize) % 16 == 0)
    grid = (-(-npts // points) * cluster,)
    kernel(grid, (threads,), (x2d, u1d, whole, out2d, np.int32(nt), np.int64(npts), np.int32(steps), np.int32(vectors)),
           shared_mem=smem)
    return True


# --- the same algorithm on the CPU: the twin of the CUDA C kernel -------------------------------------


@launch.once
def _twin(deg: int, groups: int, cluster: int):
    m, n = deg + 1, 2 * deg + 1
    _, solve, _ = make_trend_columns(launch.cpu_jit, deg)

    @launch.cpu_jit
    def run(x, u, out, steps):
        nt, npts = x.shape
        red = np.zeros((cluster * groups, n + m))
        s = np.zeros(n)
        b = np.zeros(m)
        a = np.zeros((m, m))
        for p in range(npts):
            for r in range(cluster):
                end = min(nt, (r + 1) * steps)
                for g in range(groups):
                    row = r * groups + g
                    for k in range(n + m):
                        red[row, k] = 0.0
                    for t in range(r * steps + g, end, groups):
                        v = float(x[t, p])
                        if v == v:
                            pw = 1.0
                            for k in range(n):
                                red[row, k] += pw
                                if k < m:
                                    red[row, n + k] += pw * v
                                pw *= u[t]
            for k in range(n + m):
                total = 0.0
                for r in range(cluster):  # each block's groups in order, then the blocks in order
                    acc = 0.0
                    for g in range(groups):
                        acc += red[r * groups + g, k]
                    total += acc
                if k < n:
                    s[k] = total
                else:
                    b[k - n] = total
            solve(s, b, a)
            for t in range(nt):
                r = b[m - 1]
                for k in range(m - 2, -1, -1):
                    r = r * u[t] + b[k]
                out[t, p] = float(x[t, p]) - r

    return run


def detrend_tile_twin(x2d, u1d, deg: int, out_dtype, *, points: int, threads: int = TILE_THREADS, cluster: int = 1):
    """What :func:`detrend_tile` computes, on the CPU, in the kernel's order of operations."""
    out = np.empty(x2d.shape, dtype=out_dtype)
    steps = slab(x2d.shape[0], cluster)
    _twin(deg, threads // points, cluster)(np.ascontiguousarray(x2d), np.ascontiguousarray(u1d, dtype=np.float64), out, steps)
    return out
