"""Moving-window mean along one axis: a running sum per grid point, NaN-skipping.

The kernels see a 2-D block ``x[t, p]`` (window axis first, all other axes flattened into grid
points ``p``) and write, for every ``t``, the mean of the valid values in
``x[t - before : t + after + 1, p]``, or NaN where fewer than ``min_periods`` are valid. Indices
outside the block count as missing, which is what the edges of the whole array need; inside the
array, the caller (``map_overlap``) supplies ``before`` rows of halo ahead of each block and
``after`` rows behind it.

Sums run in float64 and add the entering value and subtract the leaving one, as bottleneck's
``move_mean`` does, so the cost per point does not grow with the window.

The CPU kernel is that loop compiled by Numba (:func:`make_rolling_column`). On the GPU a CUDA C
kernel (``cuda/rolling.cu``) keeps each point's window in shared memory and reads every value
once; its twin, the kernel's loop step for step in Numba (:func:`rolling_twin`), lets the tests
check its logic without a GPU, and on a GPU its results against the kernel's, bit for bit. The
previous GPU kernel, :func:`make_rolling_column` under ``numba.cuda``, is in
``benchmarks/kernels_previous.py``.
"""

from __future__ import annotations

import math

import numpy as np

from . import launch


def make_rolling_column(jit):
    """The per-point loop, compiled by ``jit`` (:func:`launch.cpu_jit`, or ``cuda.jit(device=True)``
    for the previous GPU kernel).

    Away from the block's edges four steps are taken at once, their eight loads (entering and
    leaving values) issued before any is used, for memory-level parallelism on the GPU.
    """

    @jit
    def step(out, min_periods, p, t, enter, leave, total, count):
        # an index outside the block arrives as NaN: it counts as missing, as a NaN value does
        if enter == enter:
            total += enter
            count += 1
        if leave == leave:
            total -= leave
            count -= 1
        if count >= min_periods and count > 0:
            out[t, p] = total / count
        else:
            out[t, p] = math.nan
        return total, count

    @jit
    def column(x, out, before, after, min_periods, p):
        nt = x.shape[0]
        total = 0.0
        count = 0
        # prime the window of t = 0 with x[0 .. after - 1]; each step adds x[t + after]
        for s in range(min(after, nt)):
            v = float(x[s, p])  # float64 sums, compiled or simulated
            if v == v:
                total += v
                count += 1
        t = 0
        while t < nt:
            if t - before - 1 >= 0 and t + after + 3 < nt:
                e0, e1, e2, e3 = float(x[t + after, p]), float(x[t + after + 1, p]), float(x[t + after + 2, p]), float(x[t + after + 3, p])
                l0, l1, l2, l3 = float(x[t - before - 1, p]), float(x[t - before, p]), float(x[t - before + 1, p]), float(x[t - before + 2, p])
                total, count = step(out, min_periods, p, t, e0, l0, total, count)
                total, count = step(out, min_periods, p, t + 1, e1, l1, total, count)
                total, count = step(out, min_periods, p, t + 2, e2, l2, total, count)
                total, count = step(out, min_periods, p, t + 3, e3, l3, total, count)
                t += 4
            else:
                enter = float(x[t + after, p]) if t + after < nt else math.nan
                leave = float(x[t - before - 1, p]) if t - before - 1 >= 0 else math.nan
                total, count = step(out, min_periods, p, t, enter, leave, total, count)
                t += 1

    return column


# --- the GPU kernel: each value read from memory once ---------------------------------------------
#
# The loop above reads every value twice: when it enters a window and when it leaves it, ``before
# + after + 1`` steps later. In between, the whole GPU reads that many steps of all its resident
# points and writes as many results (for a 30-day window on a 0.25 degree grid, more than the
# 50 MB of L2), so the second read goes to DRAM again: three transfers per element, not two.
# This kernel keeps each thread's last ``W = before + after + 1`` values in a ring in shared
# memory (W x THREADS values per block, slot ``k`` of a thread at ``ring[k * THREADS]``, so a warp
# touches 32 consecutive words: no bank conflicts) and takes the leaving value from there. The
# sums per point are the loop's above, in the same order, and the mean is rounded as its
# division rounds (see ``quotient``): results are bit-identical to it.
#
# Where the ring would not fit (long windows: ``W * THREADS * itemsize`` over RING_BYTES, which
# would also leave too few threads per multiprocessor to keep the memory busy), the same kernel
# is compiled with RING 0 and reads the leaving value again. The steps may be cut into tiles
# (``blockIdx.y``), each primed with the window before it, when there are too few points to fill
# the GPU.

# Measured on an H200 (730 x 1038240 float32, 30 steps): 128 threads x 8 loads 72% of the copy
# bandwidth, 128 x 4 66%, 256 x 8 70% (the previous kernel 49%). With the ring against re-reading,
# 128 threads, by window: 7 steps 66% / 62%, 61: 59% / 44%, 75: 49% / 43%, 91: 42% / 44%.
THREADS = 128  # threads per block of the ring kernel (and points per block)
UNROLL = 8  # entering values loaded before any is used
RING_BYTES = 40 * 1024  # most shared memory a block's ring may take (228 KB per multiprocessor)

def source(in_dtype, out_dtype, ring: bool, threads: int = THREADS, unroll: int = UNROLL) -> str:
    """The CUDA source of the kernel (the tests compile it with nvcc too)."""
    return launch.cuda_source("rolling.cu", **_params(in_dtype, out_dtype, ring, threads, unroll))


def _params(in_dtype, out_dtype, ring: bool, threads: int, unroll: int) -> dict:
    return dict(in_t=launch.c_type(in_dtype), out_t=launch.c_type(out_dtype), threads=threads, unroll=unroll,
                ring=int(ring), name="pipeline_rolling_mean")


def _raw_kernel(in_dtype, out_dtype, ring: bool, threads: int, unroll: int):
    return launch.raw_kernel("rolling.cu", "pipeline_rolling_mean", launch.FMAD_CXX17,
                             **_params(in_dtype, out_dtype, ring, threads, unroll))


def plan(nt: int, npts: int, before: int, after: int, itemsize: int, sms: int = 132, threads: int = THREADS):
    """(ring, shared-memory bytes, steps per tile) for a (nt, npts) block.

    The ring is used where ``W * threads * itemsize`` fits in RING_BYTES. The steps are cut into
    tiles only where the points alone give fewer than 8 blocks per multiprocessor, and never into
    tiles shorter than 4 windows (each tile reads one window more to prime itself)."""
    w = before + after + 1
    smem = w * threads * itemsize
    ring = smem <= RING_BYTES
    point_blocks = max(1, -(-npts // threads))
    tiles = 1
    if point_blocks < 8 * sms:
        tiles = max(1, min(-(-8 * sms // point_blocks), nt // (4 * w)))
    tile = max(1, -(-nt // tiles))
    return ring, (smem if ring else 0), tile


def launch_raw(x2d, out2d, before: int, after: int, min_periods: int, *, ring=None, tile=None,
               threads: int = THREADS, unroll: int = UNROLL):
    """Launch the CUDA C kernel on C-contiguous 2-D CuPy arrays; ``ring`` and ``tile`` default
    to :func:`plan`'s choice (given, they let benchmarks compare the variants)."""
    nt, npts = x2d.shape
    auto_ring, smem, auto_tile = plan(nt, npts, before, after, x2d.dtype.itemsize, launch.sm_count(), threads)
    ring = auto_ring if ring is None else ring
    smem = (before + after + 1) * threads * x2d.dtype.itemsize if ring else 0
    tile = auto_tile if tile is None else tile
    kernel = _raw_kernel(np.dtype(x2d.dtype), np.dtype(out2d.dtype), bool(ring), threads, unroll)
    if smem > 48 * 1024:  # above the default, a kernel must ask for its shared memory
        kernel.max_dynamic_shared_size_bytes = smem
    grid = (launch.blocks(npts, threads), launch.blocks(nt, tile))
    kernel(grid, (threads,), (x2d, out2d, np.int64(nt), np.int64(npts), np.int64(tile), np.int32(before),
                              np.int32(after), np.int32(min_periods)), shared_mem=smem)
    return out2d


# --- the same algorithm on the CPU: the twin of the CUDA C kernel -------------------------------------


def make_rolling_ring(jit):
    """The CUDA C kernel's loop, step for step, one thread (point ``p0 + j``) after another.

    ``ring[k, j]`` is the block's shared-memory ring: the slot arithmetic, the priming of a tile
    and the order of every addition are the kernel's, so its results are too.
    """

    @jit
    def thread(x, out, before, after, min_periods, t0, t1, p, j, ring, use_ring):
        nt = x.shape[0]
        w = before + after + 1
        lo = t0 - 1 - before
        total = 0.0
        count = 0
        for s in range(max(lo, 0), min(nt, lo + w)):
            d = float(x[s, p])
            if d == d:
                total += d
                count += 1
            ring[s - lo, j] = x[s, p]
        k = 0
        for t in range(t0, t1):
            lt, e = t - before - 1, t + after
            if lt < 0:
                leave = math.nan
            elif use_ring:
                leave = float(ring[k, j])
            else:
                leave = float(x[lt, p])
            enter = math.nan
            if e < nt:  # past the block, the kernel stores a value in the slot that is never read
                ring[k, j] = x[e, p]
                enter = float(x[e, p])
            k = 0 if k + 1 == w else k + 1
            if enter == enter:
                total += enter
                count += 1
            if leave == leave:
                total -= leave
                count -= 1
            out[t, p] = total / count if count >= min_periods and count > 0 else math.nan

    @jit
    def rolling(x, out, before, after, min_periods, tile, threads, use_ring):
        nt, npts = x.shape
        ring = np.empty((before + after + 1, threads), dtype=x.dtype)
        for t0 in range(0, nt, tile):  # blockIdx.y
            for p0 in range(0, npts, threads):  # blockIdx.x
                for j in range(min(threads, npts - p0)):  # threadIdx.x
                    thread(x, out, before, after, min_periods, t0, min(nt, t0 + tile), p0 + j, j, ring, use_ring)

    return rolling


@launch.once
def _twin_kernel():
    return make_rolling_ring(launch.cpu_jit)


@launch.once
def _cpu_kernel():
    column = make_rolling_column(launch.cpu_jit)

    @launch.cpu_jit
    def rolling_mean_2d(x, out, before, after, min_periods):
        for p in range(x.shape[1]):
            column(x, out, before, after, min_periods, p)

    return rolling_mean_2d


def rolling_twin(x2d, before: int, after: int, min_periods: int, out_dtype, *, tile=None, ring=True,
                 threads: int = THREADS):
    """What the CUDA C kernel computes on a 2-D (steps, points) block, on the CPU."""
    x2d = np.ascontiguousarray(x2d)
    out = np.empty(x2d.shape, dtype=out_dtype)
    tile = x2d.shape[0] if tile is None else tile
    _twin_kernel()(x2d, out, before, after, min_periods, max(1, tile), threads, ring)
    return out


def rolling_mean_cpu(block, axis: int, before: int, after: int, min_periods: int, out_dtype):
    x2, moved = launch.to_2d(block, axis, np)
    out = np.empty(x2.shape, dtype=out_dtype)
    _cpu_kernel()(x2, out, before, after, min_periods)
    return launch.from_2d(out, moved, axis, np)


def rolling_mean_gpu(block, axis: int, before: int, after: int, min_periods: int, out_dtype):
    import cupy

    if np.dtype(block.dtype) not in launch.C_TYPES:  # bool, float16: the kernel is compiled for the others
        block = block.astype(np.float64)
    x2, moved = launch.to_2d(block, axis, cupy)
    out = cupy.empty(x2.shape, dtype=out_dtype)
    launch_raw(x2, out, before, after, min_periods)
    return launch.from_2d(out, moved, axis, cupy)
