"""Blocks with a halo of their neighbours' rows along one axis, for moving-window ops.

``map_halo(fn, data, axis, (before, after))`` is ``data.map_overlap(fn, depth={axis: (before,
after)}, boundary="none", trim=True)`` with one difference that matters out of core: the halo
rows are copied out of each block by small tasks of their own. Dask's ``map_overlap`` cuts them
as slices, which are views: each view keeps its whole parent block in memory until the
neighbour that needs it has run. Measured on the GPU, a rolling mean over 303 MB blocks with three
threads under a 4 GB device budget held 1.5 GB of such views, and ran out of memory. Here a
block is released as soon as its own task and its two halo copies have run. Nor is a block
copied into a larger one with its halos: the few rows that a halo changes are computed apart.
"""

from __future__ import annotations

from typing import Callable


from ..backend import xp_of
from ..deferred import module as _deferred
from .declare import declare

da = _deferred("dask.array")  # imported when the first graph is built

# a thread running a moving-window op holds this many blocks more than other ops' threads (pipeline.exec.memory's
# BLOCKS_PER_THREAD): measured under a 4 GB GPU limit, the rolling maximum peaked at 3.68 GiB with three
# threads, ran out of memory with three in a later run, and with four
HALO_BLOCKS = 2


def _rows(axis: int, ndim: int, start: int | None, stop: int | None) -> tuple:
    return tuple(slice(start, stop) if i == axis else slice(None) for i in range(ndim))


def _take(block, axis: int, start: int | None, stop: int | None):
    """A copy of rows ``start:stop`` of ``block`` along ``axis`` (a copy, so that ``block`` can be
    freed)."""
    return block[_rows(axis, block.ndim, start, stop)].copy()


def _with_halo(block, ahead, behind, *, fn: Callable, axis: int, depth: tuple[int, int], last: int, block_id=None, **kwargs):
    """``fn`` over ``block`` as if its halos were attached, without attaching them: ``fn`` runs on
    the block alone, and its first ``before`` and last ``after`` rows, the only ones a halo
    changes, are computed again from a few rows of the block with the halo. So a task holds its
    block and the result, not a third array of both with the halo; and the block is not copied."""
    before, after = depth
    k, n = block_id[axis], block.shape[axis]
    ahead = ahead if k > 0 and before else None
    behind = behind if k < last and after else None
    xp = xp_of(block)
    if n < before + after and (ahead is not None or behind is not None):  # a short block: attached
        parts = [p for p in (ahead, block, behind) if p is not None]
        start = ahead.shape[axis] if ahead is not None else 0
        return fn(xp.concatenate(parts, axis=axis), axis=axis, **kwargs)[_rows(axis, block.ndim, start, start + n)]
    out = fn(block, axis=axis, **kwargs)
    span = before + after
    if ahead is not None:  # rows 0 .. before - 1 see the halo ahead; rows up to span - 1 serve them
        a = ahead.shape[axis]
        head = fn(xp.concatenate([ahead, block[_rows(axis, block.ndim, 0, span)]], axis=axis), axis=axis, **kwargs)
        out[_rows(axis, block.ndim, 0, before)] = head[_rows(axis, block.ndim, a, a + before)]
    if behind is not None:  # rows n - after .. n - 1 see the halo behind
        tail = fn(xp.concatenate([block[_rows(axis, block.ndim, n - span, n)], behind], axis=axis), axis=axis, **kwargs)
        out[_rows(axis, block.ndim, n - after, n)] = tail[_rows(axis, block.ndim, span - after, span)]
    return out


def _blocks(x: da.Array, axis: int, ks) -> list[da.Array]:
    return [x.blocks[_rows(axis, x.ndim, k, k + 1)] for k in ks]


def map_halo(fn: Callable, data: da.Array, axis: int, depth: tuple[int, int], *, dtype, meta, **kwargs) -> da.Array:
    """``fn(x, axis=axis, **kwargs)`` on each block of ``data`` extended by ``depth[0]`` rows of the
    preceding data and ``depth[1]`` rows of the following data along ``axis`` (fewer at the ends of
    the array, as map_overlap's ``boundary="none"``), trimmed back to the block.

    ``fn`` keeps the shape of its input, and its row ``t`` depends only on rows ``t - depth[0]``
    to ``t + depth[1]`` (rows past the ends of its input counting as missing), as a moving window
    does. Blocks shorter than the halo are first merged, as map_overlap does. Where halos are cut,
    the result declares the blocks a thread holds besides its own (:data:`HALO_BLOCKS`)."""
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
        start, stop = (-rows, None) if side == 0 else (0, rows)
        chunks = tuple(tuple(min(rows, c) for c in cs) if i == axis else cs for i, cs in enumerate(data.chunks))
        cut = data.map_blocks(_take, axis, start, stop, chunks=chunks, dtype=data.dtype, meta=data._meta,
                              token=f"halo-{('ahead', 'behind')[side]}")
        # block k gets the rows of block k - 1 ahead of it and of block k + 1 behind it; the ends
        # get a neighbour's rows as a stand-in that _with_halo leaves out
        order = [0, *range(n - 1)] if side == 0 else [*range(1, n), n - 1]
        halos[side] = da.concatenate(_blocks(cut, axis, order), axis=axis)
    out = da.map_blocks(
        _with_halo, data, *halos, dtype=dtype, meta=meta,
        token=getattr(fn, "__name__", "map-halo"), fn=fn, axis=axis, depth=(before, after), last=n - 1, **kwargs,
    )
    if any(h is not None for h in halos):
        # a thread holds the halos it takes besides its block, and the rows it computes again
        declare(out, extra_blocks=HALO_BLOCKS)
    return out
