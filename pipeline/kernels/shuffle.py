"""Unshuffling bytes and bits: the filters of Blosc chunks and of HDF5's shuffle filter.

Shuffling stores a buffer of ``n`` elements of ``typesize`` bytes as planes: byte shuffle writes
byte ``j`` of every element together (plane ``j``), bit shuffle writes bit ``k`` of byte ``j`` of
every element together (a row of ``n / 8`` bytes); either compresses better than the elements
themselves. Undoing it is a transpose, done here over a batch of *units* at once: one unit is one
Blosc block (or one whole HDF5 chunk), a row ``(src offset, dst offset, nbytes, typesize)`` of
an int64 table, offsets in bytes from the source and destination buffers. So a Dask block of
thousands of small chunks costs one kernel launch, not one per chunk.

The rules are c-blosc 1.x's (format version 2), which every Zarr v2 Blosc chunk follows:

- byte shuffle: ``nbytes // typesize`` elements are unshuffled; the ``nbytes % typesize`` bytes
  left over are stored after the planes, as they are;
- bit shuffle: only when ``n = nbytes // typesize`` is a multiple of 8; the bytes left over are
  copied; a unit whose ``n`` is not a multiple of 8 was stored as it is.

The GPU kernels are CUDA C (``cuda/unshuffle.cu``); the CPU versions are their NumPy twins, the
same transposes on whole units (the bit twin runs the kernel's 8 x 8 bit transpose on uint64
words), tested bit for bit against numcodecs' Blosc on every machine.
"""

from __future__ import annotations

import numpy as np

from . import launch

UNIT_COLUMNS = 4  # src offset, dst offset, nbytes, typesize
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y: more units are walked by a loop


# --- NumPy twins --------------------------------------------------------------------------------


def _byte_unshuffle_loop(src, out, n, typesize):
    for k in range(typesize):  # plane by plane: reads in order, writes a stride apart
        for i in range(n):
            out[i * typesize + k] = src[k * n + i]


def byte_unshuffle_into(src: np.ndarray, out: np.ndarray, typesize: int) -> None:
    """``src`` (uint8 planes) byte-unshuffled into ``out`` on the host, in one pass by a Numba loop
    that releases the GIL (:func:`pipeline.kernels.launch.cpu_loop`): the host's NetCDF4 decode,
    one chunk at a time on many threads. numcodecs' loop (the same) holds the GIL from Python;
    NumPy's transposed copy, or words shifted and or-ed, are many calls a chunk, each taking the
    GIL: with 16 threads inflating beside them on the H200 machine, words a cache-sized step at
    a time took 34 s of the threads' time for 6 GB, where this loop runs at 6-7 GB/s on a core."""
    n = len(src) // typesize
    launch.cpu_loop(_byte_unshuffle_loop)(src, out, n, typesize)
    out[n * typesize:] = src[n * typesize:]


def byte_unshuffle_unit(src: np.ndarray, typesize: int) -> np.ndarray:
    """One unit (uint8) byte-unshuffled: planes of ``n`` bytes back to ``n`` elements."""
    n = len(src) // typesize
    out = np.empty_like(src)
    out[:n * typesize] = src[:n * typesize].reshape(typesize, n).T.reshape(-1)
    out[n * typesize:] = src[n * typesize:]
    return out


def _transpose_8x8(x: np.ndarray) -> np.ndarray:
    """The 8 x 8 bit matrix of each uint64 (byte r, bit c) transposed to (byte c, bit r), as the
    CUDA kernel (and bitshuffle) does it."""
    x = x.copy()
    for shift, mask in ((7, 0x00AA00AA00AA00AA), (14, 0x0000CCCC0000CCCC), (28, 0x00000000F0F0F0F0)):
        t = (x ^ (x >> np.uint64(shift))) & np.uint64(mask)
        x ^= t ^ (t << np.uint64(shift))
    return x


def bit_unshuffle_unit(src: np.ndarray, typesize: int) -> np.ndarray:
    """One unit (uint8) bit-unshuffled: byte ``j`` of 8 elements from one byte of each of the 8
    rows of byte ``j``, by an 8 x 8 bit transpose."""
    n = len(src) // typesize
    if n % 8:
        return src.copy()
    rows = n // 8
    out = np.empty_like(src)
    # rows (j, k) of ``rows`` bytes -> for each (j, g), the 8 bytes of rows (j, 0..7) at g as a word
    planes = src[:n * typesize].reshape(typesize, 8, rows).transpose(0, 2, 1)
    words = np.ascontiguousarray(planes).view("<u8").reshape(typesize, rows)
    elems = _transpose_8x8(words).view(np.uint8).reshape(typesize, rows, 8)  # (j, g, m)
    out[:n * typesize] = elems.transpose(1, 2, 0).reshape(-1)  # element g * 8 + m, byte j
    out[n * typesize:] = src[n * typesize:]
    return out


def _each_unit(unit_fn, src: np.ndarray, dst: np.ndarray, units: np.ndarray) -> np.ndarray:
    for s, d, nbytes, typesize in np.asarray(units, dtype=np.int64).reshape(-1, UNIT_COLUMNS).tolist():
        dst[d:d + nbytes] = unit_fn(src[s:s + nbytes], typesize)
    return dst


def byte_unshuffle_cpu(src: np.ndarray, dst: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Byte-unshuffle every unit of ``units`` from the uint8 buffer ``src`` into ``dst``."""
    return _each_unit(byte_unshuffle_unit, src, dst, units)


def bit_unshuffle_cpu(src: np.ndarray, dst: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Bit-unshuffle every unit of ``units`` from the uint8 buffer ``src`` into ``dst``."""
    return _each_unit(bit_unshuffle_unit, src, dst, units)


def copy_units_cpu(src: np.ndarray, dst: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Copy every unit of ``units`` (typesize unused) from ``src`` into ``dst``."""
    return _each_unit(lambda s, _: s, src, dst, units)


def unshuffle_bytes_cpu(src: np.ndarray, typesize: int) -> np.ndarray:
    """A whole buffer byte-unshuffled (HDF5's shuffle filter: one unit per chunk)."""
    return byte_unshuffle_unit(np.ascontiguousarray(src).reshape(-1).view(np.uint8), typesize)


# --- CUDA C ---------------------------------------------------------------------------------------


def _launch(kernel_name: str, src, dst, units, max_nbytes: int | None, per_thread: int):
    """Launch ``kernel_name`` of ``cuda/unshuffle.cu`` on CuPy's current stream over the units
    (a CuPy int64 array of rows); ``max_nbytes``, the largest unit, sizes the grid (read from
    the device, which waits for it, when not given)."""
    units = units.reshape(-1, UNIT_COLUMNS)
    count = units.shape[0]
    if count == 0:
        return dst
    if max_nbytes is None:
        max_nbytes = int(units[:, 2].max())
    kernel = launch.raw_kernel("unshuffle.cu", kernel_name, ("-std=c++17",))
    work = launch.blocks(max(1, max_nbytes // per_thread))
    grid = (min(work, launch.sm_count() * 8), min(count, MAX_GRID_Y))
    kernel(grid, (launch.THREADS,), (src, dst, units, np.int32(count)))
    return dst


def byte_unshuffle_gpu(src, dst, units, max_nbytes: int | None = None):
    """Byte-unshuffle every unit from the CuPy uint8 buffer ``src`` into ``dst`` (one launch)."""
    return _launch("pipeline_byte_unshuffle", src, dst, units, max_nbytes, 1)


def bit_unshuffle_gpu(src, dst, units, max_nbytes: int | None = None):
    """Bit-unshuffle every unit from the CuPy uint8 buffer ``src`` into ``dst`` (one launch)."""
    return _launch("pipeline_bit_unshuffle", src, dst, units, max_nbytes, 8)


def copy_units_gpu(src, dst, units, max_nbytes: int | None = None):
    """Copy every unit from the CuPy uint8 buffer ``src`` into ``dst`` (one launch for many
    small copies, such as the stored-raw streams of a batch of Blosc chunks)."""
    return _launch("pipeline_copy_units", src, dst, units, max_nbytes, 1)


def unshuffle_bytes_gpu(src, typesize: int):
    """A whole CuPy buffer byte-unshuffled into a new one (HDF5's shuffle filter)."""
    import cupy as cp

    flat = cp.ascontiguousarray(src).reshape(-1).view(cp.uint8)
    out = cp.empty_like(flat)
    units = cp.asarray(np.array([[0, 0, flat.size, typesize]], dtype=np.int64))
    return byte_unshuffle_gpu(flat, out, units, flat.size)
