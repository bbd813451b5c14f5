"""Copies, joins and gathers of blocks without the kernels CuPy generates for them.

CuPy copies an array that is not laid out as asked for (``a.copy()``, ``a.get()`` of a strided
view, ``dst[...] = src``), joins arrays (``cupy.concatenate``) and gathers (``a[index]``,
``cupy.take``) with kernels it generates for each dtype, which a fresh machine compiles on their
first use: 0.1-0.4 s each, one after another along a graph (a genomics QC flow met a dozen).
Here:

- :func:`copy_into`, :func:`copy_of`, :func:`concatenate`: the copy engine (a 2-D memory copy)
  where both sides are rows of contiguous bytes at even pitches, else one kernel of
  ``cuda/copies.cu`` (shipped compiled) for any layout of up to four dimensions after merging
  those that step evenly, else CuPy;
- :func:`to_host`: a block in host memory as a NumPy array, made contiguous on the device first;
- ``take`` (``take_cpu``, ``take_gpu``): a gather along one axis, by ``cuda/copies.cu`` on the GPU;
- :func:`prepare_cupy`: where GPU work begins, dask joins and gathers CuPy blocks with these
  (``concatenate_lookup``, ``take_lookup``, dask's own dispatch), and CuPy's compilations are
  shared between threads.

Elements move as words of 1, 2, 4, 8 or 16 bytes, the widest that the layout's sizes, strides and
addresses allow, whatever their dtype: five instantiations cover every type.
"""

from __future__ import annotations

import sys

import numpy as np

from . import launch

MAX_DIMS = 4  # dimensions of pipeline_copy_strided, after merging those that step evenly
WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long", 16: "uint4"}


def _kernel(name: str, width: int):
    return launch.raw_kernel("copies.cu", name, (), width=width, word=WORDS[width])


def _width(nbytes: int, *numbers: int) -> int:
    """The widest word that divides ``nbytes`` and every one of ``numbers`` (strides, addresses)."""
    for w in (16, 8, 4, 2, 1):
        if nbytes % w == 0 and all(n % w == 0 for n in numbers):
            return w
    return 1


def _runs(shape, *strides_of):
    """The dimensions of arrays of ``shape`` with the given strides (bytes), each run of dimensions
    that steps evenly in all of them merged into one: [(length, strides...)], innermost last, the
    dimensions of length 1 dropped."""
    dims = [(n, *st) for n, *st in zip(shape, *strides_of) if n != 1]
    merged = []
    for n, *st in reversed(dims):
        if merged and all(s == ms * merged[-1][0] for s, ms in zip(st, merged[-1][1:])):
            merged[-1] = (merged[-1][0] * n, *merged[-1][1:])
        else:
            merged.append((n, *st))
    return merged[::-1]


def copy_into(dst, src) -> None:
    """``dst[...] = src`` for two CuPy arrays of one shape and dtype: by the copy engine where both
    are rows of contiguous bytes at even pitches (a chunk cut by the array's edge put in its place:
    one 2-D memory copy), else by ``pipeline_copy_strided`` (up to four dimensions once merged),
    else by CuPy."""
    import cupy

    if dst.shape != src.shape or dst.dtype != src.dtype:
        dst[...] = src
        return
    if dst.size == 0:
        return
    item = dst.itemsize
    runs = _runs(dst.shape, dst.strides, src.strides)
    if runs and runs[-1][1] == runs[-1][2] == item:
        width = runs[-1][0] * item
        rows = runs[:-1]
    else:
        width, rows = item, runs
    if len(rows) <= 1 and all(r[1] >= width and r[2] >= width for r in rows) and (width > item or not rows):
        height, dpitch, spitch = (rows[0] if rows else (1, width, width))
        cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr, dpitch, src.data.ptr, spitch, width, height,
                                        getattr(cupy.cuda.runtime, "memcpyDeviceToDevice", 3), cupy.cuda.get_current_stream().ptr)
        return
    if not runs or len(runs) > MAX_DIMS or item not in WORDS:
        dst[...] = src
        return
    _copy_strided(dst, src, runs, item)


def _copy_strided(dst, src, runs, item: int) -> None:
    """``pipeline_copy_strided`` over ``runs`` [(length, dst stride, src stride)] in bytes."""
    inner_contiguous = runs[-1][1] == runs[-1][2] == item
    if inner_contiguous:  # the innermost run as words as wide as its bytes, strides and addresses allow
        w = _width(runs[-1][0] * item, *(s for r in runs[:-1] for s in r[1:]), dst.data.ptr, src.data.ptr)
        runs = runs[:-1] + [(runs[-1][0] * item // w, w, w)]
    else:
        w = item
        if dst.data.ptr % w or src.data.ptr % w or any(s % w for r in runs for s in r[1:]):
            dst[...] = src
            return
    runs = [(1, 0, 0)] * (MAX_DIMS - len(runs)) + runs
    n = [r[0] for r in runs]
    d = [np.int64(r[1] // w) for r in runs]
    s = [np.int64(r[2] // w) for r in runs]
    rows = n[0] * n[1] * n[2]
    _kernel("pipeline_copy_strided", w)(
        launch.row_grid(n[3], rows), (launch.THREADS,),
        (src, dst, np.int64(n[1]), np.int64(n[2]), np.int64(n[3]), np.int64(rows), *s, *d),
    )


def copy_of(a):
    """``a.copy()``, C-contiguous: a CuPy array by the copy engine or ``pipeline_copy_strided``
    (CuPy's copy is a kernel that a fresh machine compiles for each dtype)."""
    import cupy

    if not isinstance(a, cupy.ndarray) or a.size == 0:
        return a.copy()
    out = cupy.empty(a.shape, dtype=a.dtype)
    if a.flags.c_contiguous:
        out.data.copy_from_device_async(a.data, a.nbytes, cupy.cuda.get_current_stream())
    else:
        copy_into(out, a)
    return out


def contiguous(a):
    """``a`` itself where C-contiguous, else :func:`copy_of` it."""
    return a if a.flags.c_contiguous else copy_of(a)


def to_host(a) -> np.ndarray:
    """A CuPy array as a NumPy array (made C-contiguous on the device first, where CuPy's ``get``
    would compile its copy kernel); anything else through ``numpy.asarray``."""
    get = getattr(a, "get", None)
    if get is None:
        return np.asarray(a)
    return contiguous(a).get() if a.size else np.empty(a.shape, dtype=a.dtype)


def concatenate(arrays, axis: int, xp):
    """``xp.concatenate(arrays, axis)``; on CuPy, for arrays of one dtype, each array copied into
    its place by :func:`copy_into`: CuPy's concatenation is a kernel that a fresh machine compiles
    for each dtype (0.1-0.4 s)."""
    first = arrays[0]
    if xp is np or first.ndim == 0 or not all(isinstance(a, xp.ndarray) for a in arrays):
        return xp.concatenate(arrays, axis=axis)
    if len(arrays) == 1:
        return copy_of(first)
    axis %= first.ndim
    rest = first.shape[:axis] + first.shape[axis + 1 :]
    if any(a.dtype != first.dtype or a.ndim != first.ndim or a.shape[:axis] + a.shape[axis + 1 :] != rest for a in arrays):
        return xp.concatenate(arrays, axis=axis)
    out = xp.empty(first.shape[:axis] + (sum(a.shape[axis] for a in arrays),) + first.shape[axis + 1 :], dtype=first.dtype)
    lead, offset = (slice(None),) * axis, 0
    for a in arrays:
        copy_into(out[lead + (slice(offset, offset + a.shape[axis]),)], a)
        offset += a.shape[axis]
    return out


def join_blocks(grid):
    """``numpy.block`` of a 2-D list of blocks (rows of blocks, each row's blocks side by side),
    on their array module, by :func:`concatenate`: the blocks of a Dask array's region handed to
    a task whole (a Dask array handed to ``dask.delayed`` is joined and then copied by dask, on
    CuPy by a kernel that a fresh machine compiles)."""
    from ..backend import xp_of

    xp = xp_of(grid[0][0])
    rows = [row[0] if len(row) == 1 else concatenate(list(row), 1, xp) for row in grid]
    return rows[0] if len(rows) == 1 else concatenate(rows, 0, xp)


# --- gathers along one axis: the registered kernel ``take`` -----------------------------------------


def take_cpu(block, index, axis: int = 0):
    """``numpy.take(block, index, axis)``: the positions ``index`` (integers, negative from the end)
    of ``block`` along ``axis``."""
    return np.take(block, np.asarray(index), axis=axis)


def take_gpu(block, index, axis: int = 0):
    """:func:`take_cpu` of a CuPy block, by ``pipeline_take`` (CuPy's gather is a kernel that a
    fresh machine compiles for each dtype). ``index``: host or device integers."""
    import cupy

    axis %= max(block.ndim, 1)
    if block.ndim == 0 or block.itemsize not in WORDS:
        return cupy.take(block, cupy.asarray(index), axis=axis)
    n = block.shape[axis]
    host = np.asarray(index.get() if hasattr(index, "get") else index)
    if host.dtype.kind not in "iu" or host.ndim != 1:
        return cupy.take(block, cupy.asarray(index), axis=axis)
    if host.size and (host.max() >= n or host.min() < -n):
        raise IndexError(f"index {int(host.max()) if host.max() >= n else int(host.min())} is out of bounds for axis {axis} with size {n}")
    src = contiguous(block)
    out = cupy.empty(block.shape[:axis] + (host.size,) + block.shape[axis + 1 :], dtype=block.dtype)
    if out.size == 0:
        return out
    outer = int(np.prod(block.shape[:axis], dtype=np.int64))
    inner_bytes = int(np.prod(block.shape[axis + 1 :], dtype=np.int64)) * block.itemsize
    w = _width(inner_bytes, src.data.ptr, out.data.ptr)
    idx = cupy.asarray(np.ascontiguousarray(host, dtype=np.int64))
    rows = outer * host.size
    _kernel("pipeline_take", w)(
        launch.row_grid(inner_bytes // w, rows), (launch.THREADS,),
        (src, idx, out, np.int64(n), np.int64(host.size), np.int64(inner_bytes // w), np.int64(rows)),
    )
    return out


# --- where GPU work begins: dask's joins and gathers of CuPy blocks --------------------------------


def prepare_cupy() -> None:
    """Where GPU work begins (a source opened on the GPU, a computation on threads once CuPy is
    imported, a GPU kernel looked up): CuPy's compilations shared between threads
    (``launch.share_cupy_compiles``), and dask's joins and gathers of CuPy blocks by these
    functions."""
    launch.share_cupy_compiles()
    register_with_dask()


@launch.once
def register_with_dask() -> bool:
    """Make dask concatenate CuPy blocks with :func:`concatenate` and gather them (the merges of its
    shuffle, which an ``isel`` by an index array makes) with :func:`take_gpu`: a computed result
    of several blocks, or an array moved to the host, was joined by CuPy's copy kernel, which a
    fresh machine compiled for each dtype (0.1-0.2 s each; four of them in a population-genetics
    run). Registered through dask's own dispatch (``concatenate_lookup``, ``take_lookup``), after
    dask's registrations for CuPy, which it makes now."""
    try:
        import cupy
        from dask.array.dispatch import concatenate_lookup, take_lookup
    except ImportError:
        return False
    concatenate_lookup.dispatch(cupy.ndarray)  # dask's lazy registrations for CuPy, all of them, now

    def concatenate_blocks(arrays, axis=0):
        arrays = list(arrays)
        return concatenate(arrays, axis, cupy) if arrays else cupy.concatenate(arrays, axis=axis)

    def take_blocks(a, indices, axis=None):
        return cupy.take(a, indices) if axis is None else take_gpu(a, indices, axis)

    concatenate_lookup.register(cupy.ndarray, concatenate_blocks)
    take_lookup.register(cupy.ndarray, take_blocks)
    # the gathers of dask's shuffle (an ``isel`` by an index array): a task function of dask's own,
    # with no dispatch to register with; replaced where it is the one this was written against
    from dask.array import _shuffle

    from .. import config

    if (
        config.patched("dask-shuffle-getitem")
        and getattr(_shuffle, "_getitem", None) is not None
        and _shuffle._getitem.__code__.co_varnames[:2] == ("obj", "index")
    ):
        _shuffle._getitem = shuffle_getitem
    return True


def shuffle_getitem(obj, index):
    """dask's ``_shuffle._getitem``, ``obj[index[1]]`` (by ``dask.array.chunk.getitem``): a CuPy
    block indexed by one integer array along one axis is gathered by :func:`take_gpu` (CuPy's
    gather and copy are kernels that a fresh machine compiles for each dtype, 0.1-0.3 s each)."""
    from dask.array.chunk import getitem

    where = index[1]
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray) and isinstance(where, tuple) and len(where) == obj.ndim:
        arrays = [a for a, w in enumerate(where) if isinstance(w, np.ndarray)]
        rest = all(w == slice(None) for a, w in enumerate(where) if a not in arrays)
        if len(arrays) == 1 and rest and where[arrays[0]].ndim == 1 and where[arrays[0]].dtype.kind in "iu":
            return take_gpu(obj, where[arrays[0]], arrays[0])
    return getitem(obj, where)
