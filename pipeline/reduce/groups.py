"""Reductions by group along one axis, as chunk / merge / finalize.

A block's *partial* holds, for each group present in the block, a row of fields per grid point
(sums and counts, or run-length state), plus the sorted ids of those groups. Partials merge in
order (``merge(earlier, later)``, after aligning both to the union of their groups with each
field's identity), and ``finalize`` turns merged fields into results. The kernels that make the
partials are in :mod:`pipeline.kernels.groups`: one pass per block over all its groups.

Two ways to combine partials, by the shape of the groups:

- :func:`tree_reduce`, for groups that recur all along the axis (months of a climatology): dask's
  tree reduction merges partials ``split_every`` at a time, across chunks and workers.
- :func:`binned_reduce`, for consecutive bins (resampling into days, months, years): each output
  block holds the bins that start in one input block and merges only the partials of the input
  blocks those bins span, so memory stays bounded by the bins of one block, however long the axis.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ..backend import backend_of, meta, xp_of


@dataclass(frozen=True)
class GroupReduction:
    name: str
    chunk: Callable[..., dict]  # (x2d, labels, k, **params) -> {field: (k, points)}
    identity: dict[str, float]
    merge: Callable[[dict, dict], dict]  # (earlier, later) partial fields -> merged fields
    finalize: Callable[[dict], object]  # fields -> (k, points) result
    params: dict = field(default_factory=dict)
    # For reductions whose result in one bin can depend on data past the bins' own blocks (runs
    # that go on): ``continuation(partial, next) -> per-point state`` is scanned backwards over
    # the blocks, and ``close(merged, before, after)`` settles a merged partial given the partial
    # of the block before it and the continuation after it.
    continuation: Callable | None = None
    close: Callable | None = None
    # ``merge`` adds the fields: partials are then summed into one accumulator in place, rather
    # than each aligned to the union of the groups first (a copy of every partial at full size)
    additive: bool = False


def _to_2d(block, axis):
    xp = xp_of(block)
    moved = xp.moveaxis(block, axis, 0)
    return xp.ascontiguousarray(moved).reshape(moved.shape[0], -1), moved.shape[1:]


def _from_2d(res2d, rest, axis):
    xp = xp_of(res2d)
    return xp.moveaxis(res2d.reshape((res2d.shape[0], *rest)), 0, axis)


def chunk_partial(block, labels, red: GroupReduction, axis: int) -> dict:
    x2, rest = _to_2d(block, axis)
    labels = np.asarray(labels)
    groups, local = np.unique(labels, return_inverse=True)
    fields = red.chunk(x2, local.astype(np.int64).ravel(), len(groups), **red.params)
    if "tail_group" in fields:  # block-local group numbers -> the axis' group ids
        xp = xp_of(x2)
        ids = xp.asarray(groups)
        tg = fields["tail_group"]
        fields["tail_group"] = xp.where(tg >= 0, ids[xp.maximum(tg, 0)], -1)
    return {"groups": groups, "rest": rest, "length": int(labels.size), "first_group": int(labels[0]), **fields}


def _align(p: dict, union: np.ndarray, red: GroupReduction) -> dict:
    """``p`` on the groups ``union``: its rows where present, the identity elsewhere; rows of
    groups not in ``union`` are dropped."""
    if np.array_equal(p["groups"], union):
        return p
    keep = np.isin(p["groups"], union)
    pos = np.searchsorted(union, p["groups"][keep])
    out = {k: v for k, v in p.items() if k not in red.identity}
    out["groups"] = union
    for f, ident in red.identity.items():
        src = p[f]
        xp = xp_of(src)
        a = xp.full((len(union), *src.shape[1:]), ident, dtype=src.dtype)
        if keep.any():
            a[xp.asarray(pos)] = src[xp.asarray(np.flatnonzero(keep))]
        out[f] = a
    return out


def merge_partials(parts: list[dict], red: GroupReduction, groups: np.ndarray | None = None) -> dict:
    """Merge partials given in axis order; on ``groups`` when given, else on the union of theirs.

    One partial at a time is aligned to ``groups`` (or, for additive reductions, none is: each is
    added into the rows of its groups), so a merge holds its result and one aligned copy at most,
    not one for every partial: merging four partials of a few months each into twelve months held
    four copies at full size."""
    if groups is None:
        groups = np.unique(np.concatenate([p["groups"] for p in parts]))
    if red.additive:
        return _sum_partials(parts, red, groups)
    acc = _align(parts[0], groups, red)
    for p in parts[1:]:
        p = _align(p, groups, red)
        acc = {**acc, "length": acc.get("length", 0) + p.get("length", 0), **red.merge(acc, p)}
    return acc


def _sum_partials(parts: list[dict], red: GroupReduction, groups: np.ndarray) -> dict:
    """The sum of additive partials on ``groups``, added in order into one accumulator per field
    (the same additions, in the same order, as merging them one by one)."""
    out = {k: v for k, v in parts[0].items() if k not in red.identity}
    out["groups"] = groups
    out["length"] = sum(p.get("length", 0) for p in parts)
    for f, ident in red.identity.items():
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


def _finish(parts, red: GroupReduction, groups: np.ndarray, axis: int, out_dtype, before=None, after=None):
    merged = merge_partials(parts, red, groups)
    if red.close is not None:
        merged = red.close(merged, before, after)
    return _from_2d(red.finalize(merged), merged["rest"], axis).astype(out_dtype, copy=False)


def _flatten(parts):
    if isinstance(parts, dict):
        return [parts]
    return list(itertools.chain.from_iterable(_flatten(p) for p in parts))


def _labels_array(labels: np.ndarray, x: da.Array, axis: int) -> da.Array:
    return da.from_array(np.asarray(labels, dtype=np.int64), chunks=(x.chunks[axis],))


def _partials(x: da.Array, labels: np.ndarray, red: GroupReduction, axis: int) -> da.Array:
    inds = tuple(range(x.ndim))
    return da.blockwise(
        chunk_partial, inds, x, inds, _labels_array(labels, x, axis), (axis,),
        red=red, axis=axis, dtype=np.float64, meta=np.empty((0,) * x.ndim),
        name=f"{red.name}-chunk-{tokenize(x, labels, red.name, red.params)}",
    )


def tree_reduce(x: da.Array, red: GroupReduction, labels: np.ndarray, axis: int, out_dtype, split_every=None) -> da.Array:
    """Reduce ``x`` by ``labels`` (one per step along ``axis``, any order); the result has one row
    per distinct label, sorted, along ``axis``."""
    groups = np.unique(labels)
    parts = _partials(x, labels, red, axis)

    def combine(p, axis=None, keepdims=True, computing_meta=False):
        return p if computing_meta else merge_partials(_flatten(p), red)

    def aggregate(p, axis=None, keepdims=True, computing_meta=False):
        return p if computing_meta else _finish(_flatten(p), red, groups, axis[0], out_dtype)

    out = da.reduction(
        parts, lambda p, axis=None, keepdims=True, computing_meta=False: p, aggregate,
        combine=combine, axis=(axis,), keepdims=True, dtype=out_dtype, split_every=split_every,
        concatenate=False, output_size=len(groups), name=red.name,
        meta=meta(backend_of(x), out_dtype, x.ndim),
    )
    # dask annotates the aggregate layer with one row along ``axis``; it has one per group, and
    # pipeline.memory sizes the partials (the fields, float64, of each group) from it
    from ..exec.memory import PARTIAL_BYTES_KEY

    ann = getattr(out.dask.layers.get(out.name), "collection_annotations", None)
    if ann is not None:
        ann.update(shape=out.shape, chunks=out.chunks, chunksize=out.chunksize)
        ann[PARTIAL_BYTES_KEY] = 8 * len(red.identity)
    return out


def binned_reduce(x: da.Array, red: GroupReduction, bins: np.ndarray, nbins: int, axis: int, out_dtype) -> da.Array:
    """Reduce ``x`` into consecutive bins: ``bins`` (one per step, non-decreasing, in
    ``0..nbins-1``; bins with no step are allowed) -> ``nbins`` rows along ``axis``."""
    bins = np.asarray(bins, dtype=np.int64)
    if np.any(np.diff(bins) < 0):
        raise ValueError("bins must be non-decreasing along the axis")
    parts = _partials(x, bins, red, axis)
    bounds = np.cumsum((0, *x.chunks[axis]))
    block_of_step = np.searchsorted(bounds, np.arange(bins.size), side="right") - 1
    first_step = np.searchsorted(bins, np.arange(nbins), side="left")
    home = block_of_step[np.minimum(first_step, bins.size - 1)]  # the block where each bin starts
    outputs = []  # (first bin, end bin, first block, last block) of each output block
    for blk in np.unique(home):
        b0, b1 = np.flatnonzero(home == blk)[[0, -1]] + (0, 1)
        last = block_of_step[max(np.searchsorted(bins, b1, side="left") - 1, 0)]
        outputs.append((int(b0), int(b1), int(blk), int(last)))

    name = f"{red.name}-{tokenize(parts.name, nbins)}"
    cont = f"{red.name}-continuation-{tokenize(parts.name)}"
    nblocks = x.numblocks[axis]
    dsk = {}
    for idx in itertools.product(*[range(n) for i, n in enumerate(x.numblocks) if i != axis]):
        key = lambda n, i: (n, *idx[:axis], i, *idx[axis:])  # noqa: E731
        if red.continuation is not None:  # scanned from the last block backwards
            for i in reversed(range(nblocks)):
                nxt = key(cont, i + 1) if i + 1 < nblocks else None
                dsk[key(cont, i)] = (red.continuation, key(parts.name, i), nxt)
        for j, (b0, b1, blk, last) in enumerate(outputs):
            span = [key(parts.name, i) for i in range(blk, last + 1)]
            task = (_finish, span, red, np.arange(b0, b1), axis, out_dtype)
            if red.close is not None:
                before = key(parts.name, blk - 1) if blk > 0 else None
                after = key(cont, last + 1) if last + 1 < nblocks else None
                task = (*task, before, after)
            dsk[key(name, j)] = task
    out_chunks = tuple(b1 - b0 for b0, b1, _, _ in outputs)
    chunks = tuple(out_chunks if i == axis else c for i, c in enumerate(x.chunks))
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[parts])
    return da.Array(graph, name, chunks, meta=meta(backend_of(x), out_dtype, x.ndim))


# --- the reductions ---------------------------------------------------------------------------------


def _add(a, b):
    return {"sum": a["sum"] + b["sum"], "count": a["count"] + b["count"]}


def _mean(p):
    xp = xp_of(p["sum"])
    return xp.where(p["count"] > 0, p["sum"] / xp.where(p["count"] > 0, p["count"], 1), xp.nan)


def _group_sum(x2d, labels, k, **params):
    from ..kernels.groups import group_sum

    return group_sum(x2d, labels, k, **params)


def _group_spells(x2d, labels, k, threshold):
    from ..kernels.groups import group_spells

    return group_spells(x2d, labels, k, threshold)


def _group_runs(x2d, labels, k, threshold):
    from ..kernels.groups import group_runs

    return group_runs(x2d, labels, k, threshold)


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
    """Join the runs of ``a`` and of the block ``b`` that follows it (see groups.group_spells)."""
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


MEAN = GroupReduction("pipeline-group-mean", _group_sum, {"sum": 0.0, "count": 0.0}, _add, _mean, additive=True)


def count_above(threshold: float) -> GroupReduction:
    return GroupReduction(
        "pipeline-count-above", _group_sum, {"sum": 0.0, "count": 0.0}, _add, lambda p: p["sum"],
        params={"threshold": float(threshold), "mode": 1}, additive=True,
    )


def longest_spell(threshold: float, cut_at_bins: bool = False) -> GroupReduction:
    """Longest run above ``threshold`` per bin: a run counts whole for the bin where it begins
    (xclim's ``run_length.longest_run``), or, with ``cut_at_bins``, only its part in each bin."""
    if cut_at_bins:
        return GroupReduction(
            "pipeline-longest-run-in-bin", _group_runs, dict.fromkeys(("length", "prefix", "current", "longest"), 0),
            _runs_merge, lambda p: p["longest"], params={"threshold": float(threshold)},
        )
    return GroupReduction(
        "pipeline-longest-spell", _group_spells, {"best": 0}, _spells_merge, lambda p: p["best"],
        params={"threshold": float(threshold)}, continuation=_spells_continuation, close=_spells_close,
    )
