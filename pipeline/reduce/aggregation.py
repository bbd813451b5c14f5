"""Reductions as one blueprint, chunk / combine / finalize, and the graphs that run it.

A reduction is declared once, as an :class:`Aggregation`, in the manner of flox and cubed:

- ``chunk`` names the kernel (:func:`pipeline.kernels.get`) that reduces one block to a *partial*:
  a dict of small arrays, its ``fields``, accumulated in float64 (or, for counts, in int64, added
  exactly: :func:`integer_sum`, the genomics counts);
- ``combine`` merges partials, and ``identity`` is each field's value where there is no data;
- ``finalize`` turns the last partial into the result;
- ``scan``, for reductions whose result in one bin depends on data past the bin's own blocks
  (runs that go on), carries a state across blocks (flox's ``Scan``).

The op that runs a reduction resolves the chunk kernel through the registry for its backend and
hands it to one of three graph builders:

- :func:`reduce`, over axes: dask's tree reduction (``dask.array.reduction``) merges partials
  ``split_every`` at a time across chunks and GPUs, the partials laid side by side along the
  reduced axes (``combine(partial, axis)``, e.g. Chan's merge of moments);
- :func:`group_reduce`, by groups that recur all along an axis (months of a climatology): the same
  tree, over partials that hold a row per group present in their block;
- :func:`binned_reduce`, into consecutive bins (days, months, years): each output block merges
  only the partials of the input blocks its bins span, so memory stays bounded by the bins of one
  block however long the axis; with a ``scan``, each block also sees the state after it.

Partials by group merge in axis order, ``combine(earlier, later)``, after aligning both on the union
of their groups with ``identity`` (or, for ``additive`` reductions, by adding each into the rows of
its groups).

Every builder declares, on the layers it creates, the bytes of the partials they hold
(:func:`pipeline.reduce.declare.declare`): the memory plan reads them rather than guess.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ..backend import backend_of, meta as backend_meta, module as backend_module, to_numpy, xp_of
from ..deferred import module as _deferred
from ..kernels.copies import concatenate
from ..kernels.launch import from_2d, to_2d
from .declare import declare

da = _deferred("dask.array")  # imported when the first graph is built

Partial = Mapping[str, object]
ACC = np.float64  # accumulator type of every float partial


@dataclass(frozen=True)
class Scan:
    """State carried across the blocks of a binned reduction, as flox's ``Scan``.

    ``continuation(carried, after) -> state`` is scanned from the last block backwards (``after``
    is the state of the block after, or None at the end); ``close(merged, before, after)`` settles
    a merged partial given the block before it (or None) and the state after it (or None).

    The scan reaches the first blocks only once the last one is made, so what it keeps of each
    block is not the partial but the few fields it reads, copied out: ``carried``, those the
    continuation reads, and ``before``, those ``close`` reads of the block before. Each maps a
    field to its dtype (a value per point), or to None for a number of the block; ``state`` is
    the dtype of the continuation's state, a value per point."""

    continuation: Callable
    close: Callable
    carried: Mapping[str, str | None]
    before: Mapping[str, str | None]
    state: str

    def bytes_per_point(self, fields: Mapping[str, str | None]) -> int:
        """Bytes a point of the fields ``fields`` (``carried`` or ``before``) hold."""
        return sum(np.dtype(d).itemsize for d in fields.values() if d is not None)


@dataclass(frozen=True)
class Aggregation:
    """Blueprint of a reduction.

    Parameters
    ----------
    name
        Prefix of the dask task names.
    chunk
        Name of the kernel that makes a block's partial: over axes, ``kernel(block, axis, **params)``
        or, with weights, ``kernel(block, weights, axis, **params)``, reduced axes kept at length 1;
        by groups, ``kernel(x2d, labels, k, **params)`` -> fields of ``k`` rows.
    combine
        Over axes: ``combine(partial, axis)``, the fields of several partials side by side along
        ``axis``, to one partial with those axes at length 1. By groups (``pairwise``):
        ``combine(earlier, later)`` of two partials on the same groups. Over axes it may be the
        name of a kernel pair (``{name}_cpu`` and ``{name}_gpu``, :func:`pipeline.kernels.get`),
        called as the function: the one of the backend where the partials lie (small partials
        are finished on the host, :data:`HOST_FINISH_BYTES`).
    finalize
        ``finalize(partial) -> array``; over axes, or a kernel's name: ``kernel(partial, axis)``.
    fields
        Name -> dtype of each field of a partial: their bytes a value are what a partial declares.
    identity
        Value of each field where a group has no data (by groups).
    params
        Keyword arguments of the chunk kernel.
    combine_parts
        A kernel that merges partials given as a list in axis order, along one axis, as ``combine``
        merges them laid side by side, bit for bit, without that copy: on the host, a merge then
        holds its inputs and its output (on a 0.25-degree grid in blocks of 3 steps, a partial of
        the moments is twice its block, and the copy and the formula's temporaries held 8 partials
        more a thread).
    pairwise
        ``combine`` merges two partials in axis order (by groups) rather than many side by side.
    additive
        ``combine`` adds the fields: partials by group are then summed into one accumulator in
        place, rather than each aligned to the union of the groups first.
    scan
        State carried across blocks (binned reductions whose runs go on past their bins).
    """

    name: str
    chunk: str
    combine: Callable | str
    finalize: Callable | str
    fields: Mapping[str, str] = field(default_factory=dict)
    identity: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, object] = field(default_factory=dict)
    combine_parts: str | None = None
    pairwise: bool = False
    additive: bool = False
    scan: Scan | None = None

    @property
    def bytes_per_value(self) -> int:
        """Bytes of a partial for each value of the result."""
        return sum(np.dtype(d).itemsize for d in self.fields.values())


def _check_kernel(agg: Aggregation, kernel: Callable) -> Callable:
    """``kernel``, which must be the blueprint's chunk kernel (ops pass the one they declare, from
    :meth:`pipeline.ops.Op.kernel`)."""
    name = getattr(kernel, "name", agg.chunk)
    if name != agg.chunk:
        raise ValueError(f"{agg.name} reduces blocks with the kernel {agg.chunk!r}, not {name!r}")
    return kernel


def _declare_partials(out: da.Array, agg: Aggregation, x: da.Array, **more) -> da.Array:
    """Declare the steps of ``out``'s reduction (the layers added to ``x``'s graph under the
    blueprint's name) as partials, sized from the blocks of its last step, a value each at the
    blueprint's bytes a value; ``more``: other keys of the declaration."""
    ann = out.__dask_graph__().layers[out.name].collection_annotations or {}
    size = int(np.prod(ann.get("chunksize", out.chunksize))) * agg.bytes_per_value
    before, prefix = x.__dask_graph__().layers, agg.name + "-"
    steps = [n for n in out.__dask_graph__().layers if n not in before and str(n).startswith(prefix)]
    return declare(out, steps, partial_bytes=size, **more)


# --- reductions over axes ---------------------------------------------------------------------------


def _concat_nested(parts, axes: tuple[int, ...]):
    """Concatenate dask's nested lists of blocks (one list level per reduced axis)."""
    if not axes:
        return parts
    blocks = [_concat_nested(p, axes[1:]) for p in parts]
    return blocks[0] if len(blocks) == 1 else concatenate(blocks, axes[0], xp_of(blocks[0]))


def _field(parts, key):
    if isinstance(parts, list):
        return [_field(p, key) for p in parts]
    return parts[key]


def _first_leaf(parts):
    while isinstance(parts, list):
        parts = parts[0]
    return parts


# Partials of at most this many bytes in all are merged and finished on the host by the CPU's
# kernels, and the result moved to the device: a transfer of a few KB, where on the GPU each
# operation of the small formulas that finish a reduction (a where, a divide, a cast) compiled a
# CuPy kernel on a fresh machine, 0.1 s each, one after another at the end of the run.
HOST_FINISH_BYTES = 4 << 20


def _leaves(parts):
    if isinstance(parts, list):
        for p in parts:
            yield from _leaves(p)
    else:
        yield parts


def _map_leaves(parts, fn):
    return [_map_leaves(p, fn) for p in parts] if isinstance(parts, list) else fn(parts)


def _small(parts) -> bool:
    """Whether dask's nested lists of partials hold at most :data:`HOST_FINISH_BYTES`."""
    return sum(getattr(v, "nbytes", 0) for leaf in _leaves(parts) for v in leaf.values()) <= HOST_FINISH_BYTES


def _step(fn, backend: str) -> Callable:
    """A blueprint's combine or finalize: the function itself, or the kernel it names for
    ``backend`` (:func:`pipeline.kernels.get`)."""
    if not isinstance(fn, str):
        return fn
    from ..kernels import get

    return get(fn, backend)


def _gather(parts, axis) -> dict:
    """Nested lists of partials -> one partial with each field concatenated along ``axis``."""
    if isinstance(parts, dict):
        return parts
    axes = tuple(sorted(axis))
    return {k: _concat_nested(_field(parts, k), axes) for k in _first_leaf(parts)}


def broadcast_view(w: da.Array, shape: tuple[int, ...], chunks=None) -> da.Array:
    """``da.broadcast_to(w, shape, chunks)``, declared a view: its blocks are ``w``'s with zero
    strides, not arrays of their own."""
    out = da.broadcast_to(w, shape, chunks=chunks)
    return out if out is w else declare(out, view=True)


def reduce(
    x: da.Array,
    agg: Aggregation,
    axis: tuple[int, ...],
    *,
    kernel: Callable,
    dtype,
    weights: da.Array | None = None,
    weights_const: np.ndarray | None = None,
    keepdims: bool = False,
    split_every: int | None = None,
    output_size: int = 1,
    width: int | None = None,
    on: str | None = None,
) -> da.Array:
    """Reduce ``x`` over ``axis`` with the blueprint ``agg``, blocks reduced by ``kernel`` (the
    blueprint's chunk kernel for ``x``'s backend); the result keeps ``x``'s backend.

    Weights come as a Dask array that broadcasts to ``x`` (``weights``), or as one small NumPy
    array that broadcasts to every block of ``x`` (``weights_const``), moved to the block's
    backend in the task.

    ``width``: the chunk kernel turns the last axis of ``x`` (in one chunk, not reduced) into
    ``width`` columns (the genotype counts: a call's ploidy into its counts), and so does the
    result. ``on``: the result's backend, where not ``x``'s (the genotype counts finish on the
    host, where their statistics are derived: a few integers a variant or sample).
    """
    if agg.pairwise:
        raise ValueError(f"{agg.name} merges partials by group: use group_reduce or binned_reduce")
    kernel = _check_kernel(agg, kernel)
    axis = tuple(sorted(a % x.ndim for a in axis))
    params = dict(agg.params)
    backend = backend_of(x)
    on = on or backend
    xp_out = backend_module(on)  # the result's array module
    if width is not None and (x.numblocks[-1] != 1 or x.ndim - 1 in axis):
        raise ValueError(f"{agg.name}: the last axis becomes the counts: it must be in one chunk, not reduced")
    weighted = weights is not None or weights_const is not None

    def chunk(block, weights_block=None, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:
            return block
        if weights_const is not None:
            weights_block = xp_of(block).broadcast_to(xp_of(block).asarray(weights_const), block.shape)
        if weighted:
            return kernel(block, weights_block, axis, **params)
        return kernel(block, axis, **params)

    def merged(parts, axis):
        where = "cpu" if backend == "cpu" or _small(parts) else backend
        if where != backend:
            parts = _map_leaves(parts, lambda leaf: {k: to_numpy(v) for k, v in leaf.items()})
        if backend == "cpu" and agg.combine_parts and len(axis) == 1 and isinstance(parts, list):
            return _step(agg.combine_parts, where)(parts, axis), where
        return _step(agg.combine, where)(_gather(parts, axis), axis), where

    def combine(parts, axis=None, keepdims=True, computing_meta=False):
        if computing_meta:
            return parts
        return merged(parts, axis)[0]

    def aggregate(parts, axis=None, keepdims=False, computing_meta=False):
        if computing_meta:
            return parts
        partial, where = merged(parts, axis)
        finalize = agg.finalize
        out = _step(finalize, where)(partial, axis) if isinstance(finalize, str) else finalize(partial)
        if not keepdims:
            out = out.squeeze(axis=axis)
        out = out.astype(dtype, copy=False)
        if on == "cpu" and where != "cpu":  # large partials merged on the device, the result wanted on the host
            return to_numpy(out)
        return xp_out.asarray(out)  # finished on the host: to the device

    if weights is not None:
        weights = broadcast_view(weights, x.shape)  # as dask's reduction would, declared a view
    out_ndim = x.ndim if keepdims else x.ndim - len(axis)
    # dask's reduction would call the functions on empty arrays to find the output type: give it.
    out = da.reduction(
        x,
        chunk,
        aggregate,
        combine=combine,
        axis=axis,
        keepdims=keepdims,
        dtype=dtype,
        split_every=split_every,
        concatenate=False,
        name=agg.name,
        meta=backend_meta(on, dtype, out_ndim),
        weights=weights,
        output_size=output_size,
    )
    if width is not None:  # dask takes the last axis for the input's; it holds the counts
        out._chunks = (*out.chunks[:-1], (width,))
        ann = out.__dask_graph__().layers[out.name].collection_annotations
        if ann is not None:
            ann.update(shape=out.shape, chunks=out.chunks, chunksize=out.chunksize)
    # on the host, a blueprint's combine_parts merges without laying the partials side by side
    return _declare_partials(out, agg, x, merge_copies=1 if backend == "cpu" and agg.combine_parts else 2)


class FieldKernel:
    """A kernel that reduces a block over the axis it was written for (each genotype count kernel
    knows the axis it counts over) to one array, called as the blueprint calls a chunk kernel,
    ``kernel(block, axis, **params)``: the array is the partial's one field ``field``. Keeps the
    kernel's name, which :func:`reduce` checks. (A module-level class, so that tasks holding it
    pickle by reference.)"""

    def __init__(self, kernel: Callable, field: str):
        self.kernel, self.field = kernel, field
        if hasattr(kernel, "name"):
            self.name = kernel.name

    def __call__(self, block, axis, **params):
        return {self.field: self.kernel(block, **params)}


# --- reductions by group along one axis ---------------------------------------------------------


def chunk_partial(block, labels, agg: Aggregation, axis: int, kernel: Callable) -> dict:
    """The partial of one block by group: ``kernel`` (the blueprint's chunk kernel) over the
    block's groups, and the ids of those groups."""
    x2, moved = to_2d(block, axis, xp_of(block))
    rest = moved[1:]
    labels = np.asarray(labels)
    groups, local = np.unique(labels, return_inverse=True)
    fields = kernel(x2, local.astype(np.int64).ravel(), len(groups), **agg.params)
    if "tail_group" in fields:  # block-local group numbers -> the axis' group ids
        xp = xp_of(x2)
        ids = xp.asarray(groups)
        tg = fields["tail_group"]
        fields["tail_group"] = xp.where(tg >= 0, ids[xp.maximum(tg, 0)], -1)
    return {"groups": groups, "rest": rest, "length": int(labels.size), "first_group": int(labels[0]), **fields}


def _align(p: dict, union: np.ndarray, agg: Aggregation) -> dict:
    """``p`` on the groups ``union``: its rows where present, the identity elsewhere; rows of
    groups not in ``union`` are dropped."""
    if np.array_equal(p["groups"], union):
        return p
    keep = np.isin(p["groups"], union)
    pos = np.searchsorted(union, p["groups"][keep])
    out = {k: v for k, v in p.items() if k not in agg.identity}
    out["groups"] = union
    for f, ident in agg.identity.items():
        src = p[f]
        xp = xp_of(src)
        a = xp.full((len(union), *src.shape[1:]), ident, dtype=src.dtype)
        if keep.any():
            a[xp.asarray(pos)] = src[xp.asarray(np.flatnonzero(keep))]
        out[f] = a
    return out


def merge_partials(parts: list[dict], agg: Aggregation, groups: np.ndarray | None = None) -> dict:
    """Merge partials by group given in axis order; on ``groups`` when given, else on the union
    of theirs.

    One partial at a time is aligned to ``groups`` (or, for additive reductions, none is: each is
    added into the rows of its groups), so a merge holds its result and one aligned copy at most,
    not one for every partial: merging four partials of a few months each into twelve months held
    four copies at full size."""
    if groups is None:
        groups = np.unique(np.concatenate([p["groups"] for p in parts]))
    if agg.additive:
        return _sum_partials(parts, agg, groups)
    acc = _align(parts[0], groups, agg)
    for p in parts[1:]:
        p = _align(p, groups, agg)
        acc = {**acc, "length": acc.get("length", 0) + p.get("length", 0), **agg.combine(acc, p)}
    return acc


def _sum_partials(parts: list[dict], agg: Aggregation, groups: np.ndarray) -> dict:
    """The sum of additive partials on ``groups``, added in order into one accumulator per field
    (the same additions, in the same order, as merging them one by one)."""
    out = {k: v for k, v in parts[0].items() if k not in agg.identity}
    out["groups"] = groups
    out["length"] = sum(p.get("length", 0) for p in parts)
    for f, ident in agg.identity.items():
        first = parts[0][f]
        xp = xp_of(first)
        acc = xp.full((len(groups), *first.shape[1:]), ident, dtype=np.result_type(*(p[f].dtype for p in parts)))
        for p in parts:
            keep = np.isin(p["groups"], groups)
            rows = np.searchsorted(groups, p["groups"][keep])
            src = p[f] if keep.all() else p[f][xp.asarray(np.flatnonzero(keep))]
            if np.array_equal(rows, np.arange(len(groups))):
                acc += src
            elif rows.size:
                acc[xp.asarray(rows)] += src
        out[f] = acc
    return out


def _finish(parts, agg: Aggregation, groups: np.ndarray, axis: int, out_dtype):
    return _settle(merge_partials(parts, agg, groups), agg, axis, out_dtype)


def _settle(merged: dict, agg: Aggregation, axis: int, out_dtype, before=None, after=None):
    """The result of a merged partial, closed first by the blueprint's scan given what it reads of
    the block before (``before``) and its state after (``after``)."""
    if agg.scan is not None:
        merged = agg.scan.close(merged, before, after)
    res = agg.finalize(merged)  # a row per group
    return from_2d(res, (res.shape[0], *merged["rest"]), axis, xp_of(res)).astype(out_dtype, copy=False)


def _extract(partial: dict, fields: tuple[str, ...]) -> dict:
    """The fields ``fields`` of a block's partial, copied: a view (the spells kernel's per-point
    state is one array) would keep the partial's arrays alive."""
    return {f: partial[f].copy() if hasattr(partial[f], "copy") else partial[f] for f in fields}


def _flatten(parts):
    if isinstance(parts, dict):
        return [parts]
    return list(itertools.chain.from_iterable(_flatten(p) for p in parts))


def _labels_array(labels: np.ndarray, x: da.Array, axis: int) -> da.Array:
    return da.from_array(np.asarray(labels, dtype=np.int64), chunks=(x.chunks[axis],))


def _partials(x: da.Array, labels: np.ndarray, agg: Aggregation, axis: int, kernel: Callable) -> da.Array:
    if not agg.pairwise:
        raise ValueError(f"{agg.name} merges partials over axes: use reduce")
    kernel = _check_kernel(agg, kernel)
    inds = tuple(range(x.ndim))
    return da.blockwise(
        chunk_partial, inds, x, inds, _labels_array(labels, x, axis), (axis,),
        agg=agg, axis=axis, kernel=kernel, dtype=np.float64, meta=np.empty((0,) * x.ndim),
        name=f"{agg.name}-chunk-{tokenize(x, labels, agg.name, agg.params, kernel)}",
    )


def group_reduce(x: da.Array, agg: Aggregation, labels: np.ndarray, axis: int, out_dtype, *,
                 kernel: Callable, split_every=None, groups: np.ndarray | None = None) -> da.Array:
    """Reduce ``x`` by ``labels`` (one per step along ``axis``, any order), blocks reduced by
    ``kernel``; the result has one row per distinct label, sorted, along ``axis``. ``groups``
    (sorted) gives the rows instead: steps of labels not among them are left out, and a group
    with no step gets the reduction of nothing (a mean: NaN)."""
    groups = np.unique(labels) if groups is None else np.asarray(groups)
    parts = _partials(x, labels, agg, axis, kernel)

    def combine(p, axis=None, keepdims=True, computing_meta=False):
        return p if computing_meta else merge_partials(_flatten(p), agg)

    def aggregate(p, axis=None, keepdims=True, computing_meta=False):
        return p if computing_meta else _finish(_flatten(p), agg, groups, axis[0], out_dtype)

    out = da.reduction(
        parts, lambda p, axis=None, keepdims=True, computing_meta=False: p, aggregate,
        combine=combine, axis=(axis,), keepdims=True, dtype=out_dtype, split_every=split_every,
        concatenate=False, output_size=len(groups), name=agg.name,
        meta=backend_meta(backend_of(x), out_dtype, x.ndim),
    )
    # dask annotates the last step with one row along ``axis``; it has one per group, and so do
    # the merged partials
    ann = out.__dask_graph__().layers[out.name].collection_annotations
    if ann is not None:
        ann.update(shape=out.shape, chunks=out.chunks, chunksize=out.chunksize)
    row = int(np.prod([max(c) for i, c in enumerate(x.chunks) if i != axis], dtype=np.int64)) * agg.bytes_per_value
    trees = int(np.prod([n for i, n in enumerate(x.numblocks) if i != axis], dtype=np.int64))  # one an output block
    merges, waits, leaf = _group_tree_rows(labels, groups, x.chunks[axis], _fan_in(split_every, axis))
    return _declare_partials(out, agg, x, merges=[(rows * row, n * trees) for rows, n in merges], waiting_bytes=sum(waits) * row,
                             level_waits=[w * row for w in waits], leaf_bytes=leaf * row)


def _fan_in(split_every, axis: int) -> int:
    """Partials that dask's tree merges at a time along ``axis`` alone (its normalization of
    ``split_every``, dask.array.reductions._tree_reduce)."""
    import dask

    split_every = split_every or dask.config.get("split_every", 4)
    if isinstance(split_every, dict):
        return max(int(split_every.get(axis, 2)), 2)
    return max(int(split_every), 2)


def _group_tree_rows(labels: np.ndarray, groups: np.ndarray, chunks: tuple[int, ...], fan_in: int) -> tuple[list, list, int]:
    """([(rows a merge holds, merges) a level], [rows that may wait at once, a level], rows of a
    block's partial) in dask's tree over blocks of ``chunks`` steps, merging ``fan_in``
    consecutive partials at a time, where a partial holds a row for each group among its steps'
    ``labels``, and the last merge one for each of ``groups``. A merge holds its inputs, the rows
    it aligns them on (its output) and one input's aligned copy; at each level, a merge's inputs
    less one may wait for their siblings. Over a year of 0.25-degree days in blocks of 3, the
    monthly means' partials hold 2, 2, 3 and 7 months at the four levels: counted as 12 at every
    level, the waiting partials came to 2.2 GB, where they hold 0.47."""
    edges = np.cumsum((0, *chunks))
    level = [np.intersect1d(labels[a:b], groups) for a, b in zip(edges[:-1], edges[1:])]
    leaf = max((len(s) for s in level), default=0)
    merges, waits = [], []
    while True:
        rows = max((len(s) for s in level), default=0)
        taken = min(fan_in, len(level))
        level = [np.unique(np.concatenate(level[i:i + fan_in])) for i in range(0, len(level), fan_in)]
        out = len(groups) if len(level) == 1 else max(len(s) for s in level)
        merges.append((taken * rows + out + rows, len(level)))
        waits.append((taken - 1) * rows)
        if len(level) == 1:
            return merges, waits, leaf


def binned_reduce(x: da.Array, agg: Aggregation, bins: np.ndarray, nbins: int, axis: int, out_dtype, *,
                  kernel: Callable) -> da.Array:
    """Reduce ``x`` into consecutive bins, blocks reduced by ``kernel``: ``bins`` (one per step,
    non-decreasing, in ``0..nbins-1``; bins with no step are allowed) -> ``nbins`` rows along
    ``axis``.

    Each block's partial is merged into its output's as soon as it is made, one at a time in axis
    order, so that memory holds an output's merged partial, not every partial of its blocks. With a
    scan, what waits for the scan, which runs from the last block back, is that merged partial,
    and only the few fields of each block that the scan reads (:class:`Scan`)."""
    bins = np.asarray(bins, dtype=np.int64)
    if np.any(np.diff(bins) < 0):
        raise ValueError("bins must be non-decreasing along the axis")
    parts = _partials(x, bins, agg, axis, kernel)
    # a block's partial holds a row of fields for each bin it touches, and a point's state (a
    # scan's runs): counted as one row more, at no less than 16 bytes a value
    edges = np.cumsum((0, *x.chunks[axis]))
    rows = max((len(np.unique(bins[a:b])) for a, b in zip(edges[:-1], edges[1:])), default=0) + 1
    row_bytes = max(agg.bytes_per_value, 16)
    size = rows * int(np.prod([max(c) for i, c in enumerate(x.chunks) if i != axis])) * row_bytes
    declare(parts, partial_bytes=size)
    bounds = np.cumsum((0, *x.chunks[axis]))
    block_of_step = np.searchsorted(bounds, np.arange(bins.size), side="right") - 1
    first_step = np.searchsorted(bins, np.arange(nbins), side="left")
    home = block_of_step[np.minimum(first_step, bins.size - 1)]  # the block where each bin starts
    outputs = []  # (first bin, end bin, first block, last block) of each output block
    for blk in np.unique(home):
        b0, b1 = np.flatnonzero(home == blk)[[0, -1]] + (0, 1)
        last = block_of_step[max(np.searchsorted(bins, b1, side="left") - 1, 0)]
        outputs.append((int(b0), int(b1), int(blk), int(last)))

    name = f"{agg.name}-{tokenize(parts.name, nbins)}"
    # the merges' and the scan's tasks, in the layer ``name`` and named after it (a report counts
    # them to its step)
    merged, carried, before, cont = (f"{name}-{k}" for k in ("merged", "carried", "before", "continuation"))
    nblocks = x.numblocks[axis]
    scan = agg.scan
    # (bins, block after) of the outputs that wait for a state from after their blocks: the scan
    # runs back to the first block such a state comes from
    waiting = [(b1 - b0, last + 1) for b0, b1, _, last in outputs if last + 1 < nblocks]
    start = min((i for _, i in waiting), default=nblocks)
    dsk = {}
    for idx in itertools.product(*[range(n) for i, n in enumerate(x.numblocks) if i != axis]):
        key = lambda n, i: (n, *idx[:axis], i, *idx[axis:])  # noqa: E731
        if scan is not None:  # scanned from the last block backwards, over the fields it reads
            for i in range(start, nblocks):
                dsk[key(carried, i)] = (_extract, key(parts.name, i), tuple(scan.carried))
            for i in reversed(range(start, nblocks)):
                nxt = key(cont, i + 1) if i + 1 < nblocks else None
                dsk[key(cont, i)] = (scan.continuation, key(carried, i), nxt)
        for j, (b0, b1, blk, last) in enumerate(outputs):
            # the output's partials merged one at a time, in axis order, each as soon as its block
            # is made: the same merges as merge_partials of them all, but a block's partial is
            # released once merged rather than held until the output's last block is made
            acc = None
            for k, i in enumerate(range(blk, last + 1)):
                step = (merged, *idx[:axis], j, *idx[axis:], k)
                dsk[step] = (merge_partials, [key(parts.name, i)] if acc is None else [acc, key(parts.name, i)], agg,
                             np.arange(b0, b1))
                acc = step
            if scan is None:
                dsk[key(name, j)] = (_settle, acc, agg, axis, out_dtype)
                continue
            prior = None
            if blk > 0:
                prior = key(before, blk - 1)
                dsk[prior] = (_extract, key(parts.name, blk - 1), tuple(scan.before))
            after = key(cont, last + 1) if last + 1 < nblocks else None
            dsk[key(name, j)] = (_settle, acc, agg, axis, out_dtype, prior, after)
    out_chunks = tuple(b1 - b0 for b0, b1, _, _ in outputs)
    chunks = tuple(out_chunks if i == axis else c for i, c in enumerate(x.chunks))
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[parts])
    out = da.Array(graph, name, chunks, meta=backend_meta(backend_of(x), out_dtype, x.ndim))
    if scan is None:
        return out
    # kept until the scan has come back to them: the fields it reads of the blocks it runs over,
    # what the outputs read of the block before theirs, and the merged partials of the outputs
    # that wait (their bins' rows and one more), with the states they wait for and the scan's own
    point = ((nblocks - start) * scan.bytes_per_point(scan.carried)
             + sum(blk > 0 for _, _, blk, _ in outputs) * scan.bytes_per_point(scan.before)
             + sum(n + 1 for n, _ in waiting) * row_bytes
             + (len(waiting) + 1 if waiting else 0) * np.dtype(scan.state).itemsize)
    points = int(np.prod([n for i, n in enumerate(x.shape) if i != axis]))
    return declare(out, held_bytes=points * point)


# --- the reductions ---------------------------------------------------------------------------------
#
# Each blueprint below names its chunk kernel; the merges and finalizers are array formulas on the
# array module of their input, so the same code runs on NumPy and CuPy partials.

F8 = "float64"
I4 = "int32"
I8 = "int64"


def _sum_fields(p, axis):
    return {k: v.sum(axis=axis, keepdims=True) for k, v in p.items()}


# integer counts: int64 partials (not float64 accumulators), added exactly in any order


def _total(p):
    return p["total"]


def integer_sum(name: str, chunk: str, dtype=I8, **params) -> Aggregation:
    """Sum over axes of the integer counts (int64, or ``dtype``) that the kernel ``chunk`` makes of
    each block, its partial's one field ``total`` (the genotype counts of
    :mod:`pipeline.ops.genomics.stats`, their kernels wrapped in :class:`FieldKernel`; the cohort
    allele counts of :mod:`pipeline.ops.genomics.popgen`): the partials stay integers, so any
    chunking and any order of the tree gives the same counts."""
    return Aggregation(name, chunk, _sum_fields, _total, fields={"total": np.dtype(dtype).name}, identity={"total": 0},
                       params=params)


# mean of the values that are not NaN: a float64 sum and an int64 count


def nan_mean(name: str, chunk: str, **params) -> Aggregation:
    """Mean over axes of the values that are not NaN (NaN where there are none), from the float64
    sum and the int64 number of those values that the kernel ``chunk`` makes of each block, its
    partial's fields ``sum`` and ``count`` (the observed heterozygosity of each cohort in
    :mod:`pipeline.ops.genomics.frequencies`, the mean identity by state of
    :func:`pipeline.ops.genomics.popgen.Weir_Goudet_beta`): the counts stay exact, only the sums
    round."""
    return Aggregation(name, chunk, _sum_fields, _mean, fields={"sum": F8, "count": I8},
                       identity={"sum": 0.0, "count": 0}, params=params)


# mean and variance: count, mean and sum of squared deviations, merged stably


def mean_std(axis: int) -> Aggregation:
    """Mean and (ddof=0) standard deviation, stacked along ``axis``."""
    return Aggregation(
        "pipeline-moments", "moments", "moments_merge", "mean_std",
        fields={"n": F8, "mean": F8, "m2": F8}, identity={"n": 0.0, "mean": 0.0, "m2": 0.0},
        combine_parts="moments_merge_parts",
    )


def nanmean_std(x: da.Array, axis: int, *, kernel: Callable, dtype=ACC) -> tuple[da.Array, da.Array]:
    """Mean and (ddof=0) standard deviation along one axis, NaN-skipping, that axis kept; blocks
    reduced by ``kernel`` (the ``moments`` kernel of ``x``'s backend).

    One pass over ``x``: both statistics come out of one tree of moment partials, whose
    finalize stacks them along the reduced axis (``output_size=2``).
    """
    axis = axis % x.ndim
    stats = reduce(x, mean_std(axis), (axis,), kernel=kernel, dtype=dtype, keepdims=True, output_size=2)
    chunks = stats.chunks[:axis] + ((1,),) + stats.chunks[axis + 1 :]
    # each a view of the stacked block: dask's own indexing copies a view of half a block or less
    # (dask.array.chunk.getitem), and on CuPy that copy compiled a kernel on a fresh machine
    return tuple(stats.map_blocks(_stacked, axis=axis, k=k, chunks=chunks, dtype=stats.dtype, meta=stats._meta) for k in (0, 1))


def _stacked(block, axis: int, k: int):
    """Statistic ``k`` of a block that stacks them along ``axis``, a view."""
    return block[(slice(None),) * axis + (slice(k, k + 1),)]


# weighted mean: sum(w * x) / sum(w where x is valid)


def _weighted_finalize(p):
    xp = xp_of(p["w"])
    return xp.where(p["w"] != 0, p["wx"] / xp.where(p["w"] != 0, p["w"], 1), xp.nan)


WEIGHTED_MEAN = Aggregation(
    "pipeline-weighted-mean", "weighted_sums", _sum_fields, _weighted_finalize,
    fields={"wx": F8, "w": F8}, identity={"wx": 0.0, "w": 0.0},
)


# polynomial fit: the normal equations' sums S_k = Σ u^k (k = 0..2 deg) and T_k = Σ u^k x (k = 0..deg)


def _polyfit_finalize(p, axis: int, deg: int):
    """Coefficients c_0..c_deg, stacked along ``axis`` (:func:`pipeline.kernels.trend.polyfit_finalize`)."""
    from ..kernels.trend import polyfit_finalize

    return polyfit_finalize(p, axis, deg)


def polyfit(axis: int, deg: int) -> Aggregation:
    """Coefficients of the least-squares polynomial of degree ``deg`` along ``axis``, stacked
    along it (the weights are the abscissa u)."""
    fields = {**{f"s{k}": F8 for k in range(2 * deg + 1)}, **{f"t{k}": F8 for k in range(deg + 1)}}
    return Aggregation(
        "pipeline-polyfit", "polyfit", _sum_fields, functools.partial(_polyfit_finalize, axis=axis, deg=deg),
        fields=fields, identity=dict.fromkeys(fields, 0.0), params={"deg": deg},
        )


# by group: sums and counts


def _add(a, b):
    return {"sum": a["sum"] + b["sum"], "count": a["count"] + b["count"]}


def _mean(p):
    xp = xp_of(p["sum"])
    return xp.where(p["count"] > 0, p["sum"] / xp.where(p["count"] > 0, p["count"], 1), xp.nan)


def _sums(p):
    return p["sum"]


GROUP_MEAN = Aggregation(
    "pipeline-group-mean", "group_sum", _add, _mean, fields={"sum": F8, "count": F8},
    identity={"sum": 0.0, "count": 0.0}, pairwise=True, additive=True,
)


def count_above(threshold: float) -> Aggregation:
    """Number of steps above ``threshold`` by group (missing values count as not above)."""
    return Aggregation(
        "pipeline-count-above", "group_sum", _add, _sums, fields={"sum": F8, "count": F8},
        identity={"sum": 0.0, "count": 0.0}, params={"threshold": float(threshold), "mode": 1},
        pairwise=True, additive=True,
    )


# by group: longest runs above a threshold


def _runs_merge(a, b):
    """Runs cut at group bounds: join ``a``'s open run to ``b``'s opening run, group by group."""
    xp = xp_of(a["length"])
    a_full = a["prefix"] == a["length"]
    b_full = b["prefix"] == b["length"]
    return {
        "length": a["length"] + b["length"],
        "prefix": xp.where(a_full, a["length"] + b["prefix"], a["prefix"]),
        "current": xp.where(b_full, b["length"] + a["current"], b["current"]),
        "longest": xp.maximum(xp.maximum(a["longest"], b["longest"]), a["current"] + b["prefix"]),
    }


def _raise_rows(best, groups, group_of_point, value):
    """``best[row of group_of_point[p], p] = max(.., value[p])`` where that group is a row of ``best``."""
    xp = xp_of(best)
    ids = xp.asarray(groups)
    rows = xp.clip(xp.searchsorted(ids, group_of_point), 0, len(groups) - 1)
    cols = xp.arange(best.shape[1])
    hit = (ids[rows] == group_of_point) & (value > 0)
    rows, cols, value = rows[hit], cols[hit], value[hit].astype(best.dtype)
    best[rows, cols] = xp.maximum(best[rows, cols], value)


def _spells_merge(a, b):
    """Join the runs of ``a`` and of the block ``b`` that follows it (see kernels.groups.group_spells)."""
    xp = xp_of(a["best"])
    best = xp.maximum(a["best"], b["best"])
    a_whole = a["lead"] == a["length"]  # ``a`` is one run from end to end
    b_whole = b["lead"] == b["length"]
    # the run across the junction begins in a's open run, or else at b's first step
    start = xp.where(a["tail"] > 0, a["tail_group"], b["first_group"])
    joined = a["tail"] + b["lead"]
    _raise_rows(best, a["groups"], start, xp.where(a_whole, 0, joined))
    return {
        "best": best,
        "lead": xp.where(a_whole, a["length"] + b["lead"], a["lead"]),
        "tail": xp.where(b_whole, xp.where(a["tail"] > 0, a["tail"] + b["length"], b["length"]), b["tail"]),
        "tail_group": xp.where(b_whole, start, b["tail_group"]),
        "first_group": a["first_group"],
    }


def _spells_continuation(p, after):
    """Length of the run of steps above the threshold from the start of block ``p`` on."""
    return p["lead"] if after is None else p["lead"] + (p["lead"] == p["length"]) * after


def _spells_close(m, before, after):
    """Settle the runs at both ends of merged blocks: the leading run counts here only if it
    begins here (the block before ends below the threshold), and both it and the open run go on
    into the blocks after as far as the continuation says."""
    xp = xp_of(m["best"])
    after = xp.zeros_like(m["lead"]) if after is None else after
    whole = m["lead"] == m["length"]
    begins_here = xp.ones(m["lead"].shape, dtype=bool) if before is None else before["tail"] == 0
    lead = xp.where(begins_here, m["lead"] + xp.where(whole, after, 0), 0)
    _raise_rows(m["best"], m["groups"], xp.full_like(m["lead"], m["first_group"]), lead)
    _raise_rows(m["best"], m["groups"], m["tail_group"], xp.where(whole, 0, m["tail"] + after))
    return m


def _longest(p):
    return p["longest"]


def _best(p):
    return p["best"]


SPELLS = Scan(_spells_continuation, _spells_close, carried={"lead": I4, "length": None}, before={"tail": I4}, state=I4)


def longest_spell(threshold: float, cut_at_bins: bool = False) -> Aggregation:
    """Longest run above ``threshold`` per bin: a run counts whole for the bin where it begins
    (xclim's ``run_length.longest_run``), or, with ``cut_at_bins``, only its part in each bin."""
    if cut_at_bins:
        fields = dict.fromkeys(("length", "prefix", "current", "longest"), I4)
        return Aggregation(
            "pipeline-longest-run-in-bin", "group_runs", _runs_merge, _longest, fields=fields,
            identity=dict.fromkeys(fields, 0), params={"threshold": float(threshold)}, pairwise=True,
        )
    return Aggregation(
        "pipeline-longest-spell", "group_spells", _spells_merge, _best, fields={"best": I4}, identity={"best": 0},
        params={"threshold": float(threshold)}, pairwise=True, scan=SPELLS,
    )
