"""Sums over windows of rows: ``out[w] = x[start[w]:stop[w]].sum(axis=0)`` for windows that
may overlap, leave gaps, be empty, and begin or end anywhere within the blocks of ``x``.

The genomics statistics sum per-variant values over windows of variants (sgkit's
``window_statistic``). sgkit gives each block halos as deep as the longest window (``map_overlap``)
and sums each window inside the block where it starts, which copies the halos, fails where a block
is shorter than the longest window, and holds whole neighbouring blocks alive. Here, in one pass:

1. each block of ``x`` makes a partial: for every window that overlaps it, the sum of the window's
   rows inside the block (the ``window_sum`` kernel, handed in by the op for its backend);
2. each output block holds the windows that start in one input block (the windows are ordered by
   start), and adds up, in the order of the blocks, the partials of the blocks its windows reach.

A window inside one block is summed there alone, its rows in order; one that crosses blocks is
the sum of its pieces. Memory: a partial holds a row per window overlapping its block, and an
output block waits only for the few blocks its windows reach.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from ..backend import backend_of, meta as backend_meta, module as backend_module, to_numpy
from ..deferred import module as _deferred
from .declare import declare

da = _deferred("dask.array")  # imported when the first graph is built

KERNEL = "window_sum"


def _partial(block, starts, stops, kernel: Callable):
    """The sums of one block's rows over its windows' pieces (rows relative to the block)."""
    return kernel(block.reshape(block.shape[0], -1), starts, stops)


def _assemble(parts, spans, rows: int, rest: tuple[int, ...], backend: str):
    """One output block: the pieces ``parts[k][r0:r1]`` added, in order, into the windows
    ``pos`` of the block (``spans[k] = (r0, r1, pos)``). Added on the host, then moved to
    ``backend``: the pieces are a row a window, and on CuPy these few additions and copies
    compiled kernels of their own on a fresh machine (0.1-0.2 s each, in the first run's path)."""
    cols = int(np.prod(rest, dtype=np.int64))
    out = np.zeros((rows, cols), dtype=np.float64)
    for part, (r0, r1, pos) in zip(parts, spans):
        piece = to_numpy(part[r0:r1])
        if pos.size and pos[-1] - pos[0] + 1 == pos.size:  # consecutive windows: a slice
            out[int(pos[0]) : int(pos[-1]) + 1] += piece
        else:
            out[pos] += piece
    return backend_module(backend).asarray(out.reshape(rows, *rest))


def window_sums(x: "da.Array", starts, stops, *, kernel: Callable, name: str = "window-sum") -> "da.Array":
    """Sums of the rows of ``x`` (rows, ...) over each window ``[starts[w], stops[w])`` ->
    (windows, ...) float64, on ``x``'s backend, lazily. ``starts`` must not decrease; a window
    with ``stop <= start`` sums to 0. NaN in a window's rows gives NaN, as NumPy's sum.
    ``kernel`` is the ``window_sum`` kernel of ``x``'s backend."""
    if getattr(kernel, "name", KERNEL) != KERNEL:
        raise ValueError(f"window sums take the kernel {KERNEL!r}, not {kernel.name!r}")
    n = x.shape[0]
    starts = np.clip(np.asarray(starts, dtype=np.int64).ravel(), 0, n)
    stops = np.clip(np.asarray(stops, dtype=np.int64).ravel(), 0, n)
    if starts.shape != stops.shape:
        raise ValueError(f"{starts.size} window starts and {stops.size} stops")
    if np.any(np.diff(starts) < 0):
        raise ValueError("window starts must not decrease")
    stops = np.maximum(stops, starts)
    if x.ndim > 1:
        x = x.rechunk({i: -1 for i in range(1, x.ndim)})
    rest = tuple(int(s) for s in x.shape[1:])
    backend = backend_of(x)
    meta = backend_meta(backend, np.float64, x.ndim)
    token = tokenize(x.name, starts, stops, kernel, name)
    pname, oname = f"{name}-partial-{token}", f"{name}-{token}"
    tail = (0,) * (x.ndim - 1)

    bounds = np.cumsum((0, *x.chunks[0]))
    nb = len(x.chunks[0])
    reach = np.maximum.accumulate(stops) if starts.size else stops  # the furthest stop so far
    nonempty = stops > starts
    parts: dict[int, np.ndarray] = {}  # block -> the windows it holds a piece of, in order
    dsk_p = {}
    for m in range(nb):
        a, b = int(bounds[m]), int(bounds[m + 1])
        if a == b:
            continue
        # the windows that start before the block's end and may stop after its start
        lo, hi = int(np.searchsorted(reach, a, side="right")), int(np.searchsorted(starts, b, side="left"))
        idx = lo + np.flatnonzero((stops[lo:hi] > a) & nonempty[lo:hi])
        if idx.size == 0:
            continue
        parts[m] = idx
        rel_starts = np.maximum(starts[idx] - a, 0)
        rel_stops = np.minimum(stops[idx], b) - a
        dsk_p[(pname, m)] = (_partial, (x.name, m, *tail), rel_starts, rel_stops, kernel)

    home = np.clip(np.searchsorted(bounds, starts, side="right") - 1, 0, max(nb - 1, 0))
    groups = np.flatnonzero(np.r_[True, np.diff(home) != 0]) if starts.size else np.zeros(0, np.int64)
    ends = np.r_[groups[1:], starts.size].astype(np.int64)
    dsk_o = {}
    out_chunks = []
    for j, (p, q) in enumerate(zip(groups, ends)):
        last = int(np.searchsorted(bounds, max(int(reach[q - 1]) - 1, 0), side="right") - 1)
        keys, spans = [], []
        for m in range(int(home[p]), min(last, nb - 1) + 1):
            idx = parts.get(m)
            if idx is None:
                continue
            r0, r1 = np.searchsorted(idx, p), np.searchsorted(idx, q)
            if r1 > r0:
                keys.append((pname, m))
                spans.append((int(r0), int(r1), idx[r0:r1] - p))
        dsk_o[(oname, j, *tail)] = (_assemble, keys, spans, int(q - p), rest, backend)
        out_chunks.append(int(q - p))
    if not out_chunks:  # no windows
        return x[:0].astype(np.float64)

    layers = dict(x.__dask_graph__().layers)
    deps = dict(x.__dask_graph__().dependencies)
    layers[pname], deps[pname] = MaterializedLayer(dsk_p), {x.name}
    layers[oname], deps[oname] = MaterializedLayer(dsk_o), {pname}
    graph = HighLevelGraph(layers, deps)
    out = da.Array(graph, oname, (tuple(out_chunks), *[(r,) for r in rest]), meta=meta)
    widest = max((idx.size for idx in parts.values()), default=0)
    return declare(out, [pname], partial_bytes=widest * int(np.prod(rest, dtype=np.int64)) * 8)

