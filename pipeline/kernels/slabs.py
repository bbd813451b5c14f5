"""Working through a block in slabs, so that a CPU kernel's temporaries do not grow with the block.

The CPU kernels are NumPy array formulas, and a formula makes temporaries the size of its
operands: on a whole 303 MB float32 block (73 x 721 x 1440) the float64 copies, masks and
products of ``moments`` or ``polyfit`` took 4 to 8 blocks (1.3 to 2.5 GB). :func:`map_slabs`
applies the same formula to slabs of the block, cut along an axis the formula does not reduce
over (for a reduction along time, rows of the grid; for sums over the grid, time steps), and
writes each slab's result into outputs allocated once: the extra memory is a few slabs, the
same for any block. Every value is computed from the same values in the same order as on the
whole block (slabs cut only along axes that are not reduced), so results are bit for bit those
of the whole-block formula.

Slabs of SLAB_BYTES of input keep a formula's float64 temporaries (a few times a slab) within the
last-level cache and reuse the same memory from slab to slab, where a whole block's temporaries
are fresh pages each time: on one 303 MB block every kernel ran faster in slabs (docs/performance.md).
"""

from __future__ import annotations

import math
from typing import Callable

# bytes of the input block in one slab. Measured on a 2-core host (32 MB of L3), 73 x 721 x 1440
# float32, best of 4: slabs of 1 to 4 MB ran within noise of each other and fastest (moments 0.26
# to 0.36 s, polyfit 0.42 to 0.61 s), 8 to 16 MB up to 1.8x slower, 32 MB and whole blocks 2 to
# 7x slower (moments 0.77 s and 2.1 s, polyfit 1.4 s and 4.1 s)
SLAB_BYTES = 2 * 2**20
# a slab holds at least one index of the axis it is cut along, which may hold more than
# SLAB_BYTES (a time step of a fine grid, for sums over the grid): the plan counts a slab as
# SLAB_BYTES or 1 / MIN_CUT of the block, whichever is more
MIN_CUT = 64


def temporaries(slabs: float):
    """Declare on a CPU kernel the most its temporaries hold at once, in slabs of its input
    (measured with tracemalloc on one block); the memory plan reads it through
    :func:`pipeline.kernels.work_slabs`."""

    def mark(fn):
        fn.work_slabs = slabs
        return fn

    return mark


def slab_bytes(block_bytes: int) -> int:
    """Bytes of input in the largest slab of a block of ``block_bytes``, as the plan counts it."""
    return int(min(block_bytes, max(SLAB_BYTES, block_bytes // MIN_CUT)))


def slab_axis(shape: tuple[int, ...], whole=()) -> int | None:
    """The outermost axis of a block of ``shape``, longer than 1 and not in ``whole``, or None:
    slabs of a C-ordered block along it are few, large, contiguous runs of memory."""
    whole = {a % len(shape) for a in whole} if shape else set()
    return next((a for a, n in enumerate(shape) if a not in whole and n > 1), None)


def slab_slices(shape: tuple[int, ...], itemsize: int, axis: int, nbytes: int | None = None) -> list[slice]:
    """Slices along ``axis`` that cut a block of ``shape`` into slabs of at most ``nbytes``
    (SLAB_BYTES by default; at least one index each)."""
    nbytes = SLAB_BYTES if nbytes is None else nbytes
    per_index = itemsize * math.prod(n for a, n in enumerate(shape) if a != axis)
    step = max(1, nbytes // max(1, per_index))
    n = shape[axis]
    return [slice(i, min(n, i + step)) for i in range(0, n, step)] or [slice(0, 0)]


def _cut(a, axis: int, ndim: int, length: int, s: slice):
    """``a``'s part for slab ``s``: arrays of the block's rank that span ``axis`` are cut; anything
    else (broadcast operands of length 1 there, labels, scalars) is passed whole."""
    if getattr(a, "ndim", None) == ndim and a.shape[axis] == length and length != 1:
        return a[(slice(None),) * axis + (s,)]
    return a


def map_slabs(fn: Callable, x, *args, whole=(), out_axis: int | None = None, nbytes: int | None = None, **kwargs):
    """``fn(x, *args, **kwargs)`` (an array, or a dict of arrays), computed slab by slab.

    ``whole`` are the axes that every slab must hold whole: those ``fn`` reduces over, or that
    index a table. ``x`` is cut along the outermost other axis into slabs of at most ``nbytes``
    (SLAB_BYTES), and so is every array of ``args`` of the same rank that spans that axis; the
    results of each slab are written into outputs allocated at the first slab, where the slab
    axis is ``out_axis`` (by default the same axis: ``fn`` keeps it in place). Where no axis may
    be cut, or the block is one slab, ``fn`` runs once on the whole block.
    """
    nbytes = SLAB_BYTES if nbytes is None else nbytes
    axis = slab_axis(x.shape, whole)
    if axis is None or x.nbytes <= nbytes:
        return fn(x, *args, **kwargs)
    at = axis if out_axis is None else out_axis
    n = x.shape[axis]
    out = None
    for s in slab_slices(x.shape, x.dtype.itemsize, axis, nbytes):
        part = fn(x[(slice(None),) * axis + (s,)], *(_cut(a, axis, x.ndim, n, s) for a in args), **kwargs)
        if out is None:
            out = _allocate(part, x, at, n)
        _write(out, part, at, s)
    return out


def _allocate(part, x, axis: int, n: int):
    """Outputs shaped as ``part`` with ``n`` along ``axis``, on the array module of ``x``."""
    from ..backend import xp_of

    xp = xp_of(x)
    new = lambda p: xp.empty(p.shape[:axis] + (n,) + p.shape[axis + 1 :], dtype=p.dtype)  # noqa: E731
    return {k: new(v) for k, v in part.items()} if isinstance(part, dict) else new(part)


def _write(out, part, axis: int, s: slice) -> None:
    at = (slice(None),) * axis + (s,)
    if isinstance(out, dict):
        for k, v in part.items():
            out[k][at] = v
    else:
        out[at] = part
