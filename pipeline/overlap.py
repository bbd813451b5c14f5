"""Blocks with a halo of their neighbours' rows along one axis, for moving-window ops.

``map_halo(fn, data, axis, (before, after))`` is ``data.map_overlap(fn, depth={axis: (before,
after)}, boundary="none", trim=True)`` with one difference that matters out of core: the halo
rows are copied out of each block by small tasks of their own. Dask's ``map_overlap`` cuts them
as slices, which are views: each view keeps its whole parent block in memory until the
neighbour that needs it has run. Measured on the GPU, a rolling mean over 303 MB blocks with three
threads under a 4 GB device budget held 1.5 GB of such views, and ran out of memory. Here a
block is released as soon as its own task and its two halo copies have run.
"""

from __future__ import annotations

from typing import Callable

import dask.array as da

from .backend import xp_of


def _take(block, axis: int, rows: slice):
    """A copy of ``rows`` of ``block`` along ``axis`` (a copy, so that ``block`` can be freed)."""
    index = tuple(rows if i == axis else slice(None) for i in range(block.ndim))
    return block[index].copy()


def _with_halo(block, ahead, behind, *, fn: Callable, axis: int, last: int, block_id=None, **kwargs):
    k = block_id[axis]
    parts = [ahead if k > 0 else None, block, behind if k < last else None]
    parts = [p for p in parts if p is not None]
    x = xp_of(block).concatenate(parts, axis=axis) if len(parts) > 1 else block
    out = fn(x, axis=axis, **kwargs)
    start = ahead.shape[axis] if k > 0 and ahead is not None else 0
    return out[tuple(slice(start, start + block.shape[axis]) if i == axis else slice(None) for i in range(block.ndim))]


def _blocks(x: da.Array, axis: int, ks) -> list[da.Array]:
    return [x.blocks[tuple(slice(k, k + 1) if i == axis else slice(None) for i in range(x.ndim))] for k in ks]


def map_halo(fn: Callable, data: da.Array, axis: int, depth: tuple[int, int], *, dtype, meta, **kwargs) -> da.Array:
    """``fn(x, axis=axis, **kwargs)`` on each block of ``data`` extended by ``depth[0]`` rows of the
    preceding data and ``depth[1]`` rows of the following data along ``axis`` (fewer at the ends of
    the array, as map_overlap's ``boundary="none"``), trimmed back to the block; ``fn`` keeps the
    shape of its input. Blocks shorter than the halo are first merged, as map_overlap does."""
    from dask.array.overlap import ensure_minimum_chunksize

    axis = axis % data.ndim
    before, after = depth
    need = max(before, after, 1)
    if data.numblocks[axis] > 1 and min(data.chunks[axis]) < need:
        data = data.rechunk({axis: ensure_minimum_chunksize(need, data.chunks[axis])})
    n = data.numblocks[axis]
    halos = [None, None]
    for side, rows in enumerate((before, after)):
        if not rows or n == 1:
            continue
        sl = slice(-rows, None) if side == 0 else slice(0, rows)
        chunks = tuple(tuple(min(rows, c) for c in cs) if i == axis else cs for i, cs in enumerate(data.chunks))
        cut = data.map_blocks(_take, axis, sl, chunks=chunks, dtype=data.dtype, meta=data._meta,
                              token=f"halo-{('ahead', 'behind')[side]}")
        # block k gets the rows of block k - 1 ahead of it and of block k + 1 behind it; the ends
        # get a neighbour's rows as a stand-in that _with_halo leaves out
        order = [0, *range(n - 1)] if side == 0 else [*range(1, n), n - 1]
        halos[side] = da.concatenate(_blocks(cut, axis, order), axis=axis)
    return da.map_blocks(
        _with_halo, data, *halos, dtype=dtype, meta=meta,
        token=getattr(fn, "__name__", "map-halo"), fn=fn, axis=axis, last=n - 1, **kwargs,
    )
