"""The sums behind adler32, zlib's checksum, for many equal rows of bytes at once.

nvCOMP inflates raw deflate data and checks no checksum, so the NetCDF reader
(:mod:`pipeline.gpu.hdf5`) checks each inflated chunk against the adler32 its zlib stream ends
with. adler32 of n bytes d_i is ``((B + n) % 65521) << 16 | (A + 1) % 65521`` with
``A = sum(d_i)`` and ``B = sum((n - i) d_i)``: :func:`adler_sums_gpu` gives ``A`` and ``B`` (mod
65521) of every row in one launch of a CUDA C kernel (``cuda/adler32.cu``). CuPy's own
reductions did it before, at a cost on a fresh machine: the CUB sum and the weighted-sum
reduction took 2-9 s each to compile, against about 0.2 s for this kernel.
"""

from __future__ import annotations

import numpy as np

from . import launch

MOD = 65521
THREADS = 256  # the kernel's shared arrays are this long


def adler_sums_cpu(rows: np.ndarray) -> np.ndarray:
    """(2, rows): A and B mod 65521 of each row of a (rows, n) uint8 array."""
    n = rows.shape[1]
    weights = np.arange(n, 0, -1, dtype=np.int64) % MOD
    a = rows.sum(axis=1, dtype=np.int64) % MOD
    b = (rows.astype(np.int64) * weights).sum(axis=1) % MOD
    return np.stack([a, b])


def adler_sums_gpu(buffer, start: int, step: int, nbytes: int, count: int):
    """(2, count) int64 on the device: A and B mod 65521 of the ``count`` rows of ``nbytes`` bytes
    at ``start + r * step`` of the CuPy uint8 ``buffer``, on CuPy's current stream."""
    import cupy as cp

    sums = cp.empty((2, count), dtype=np.int64)
    if count:
        kernel = launch.raw_kernel("adler32.cu", "pipeline_adler_sums", ("-std=c++17",))
        grid = (min(count, launch.sm_count() * 16),)
        kernel(grid, (THREADS,), (buffer[start:], np.int64(step), np.int64(nbytes), np.int64(count), sums))
    return sums


def adler32(sums: np.ndarray, nbytes: int) -> np.ndarray:
    """adler32 of each row from its sums (NumPy or CuPy)."""
    return (((sums[1] + nbytes) % MOD) << 16) | ((sums[0] + 1) % MOD)
