"""Linkage disequilibrium within windows of variants: sgkit's ``ld_matrix``, ``ld_prune`` and
``maximal_independent_set`` (``sgkit.stats.ld``, 0.10).

The dataset must be windowed first (``window_start``, ``window_stop`` over the ``windows``
dimension, as ``window_by_variant`` and ``window_by_position`` make them). Within each window,
r^2 (Rogers and Huff) between dosages, pairwise over the samples where both are present, is
computed for the pairs (i, j), i <= j, with i before the next window's start, so that
overlapping windows give each pair once (:func:`pipeline.kernels.ld.ld_r2_cpu`, ``ld_r2_gpu``: matrix products of
each window's rows, on NumPy or CuPy).

The graph has one task per chunk of variants: the windows that start in the chunk, over the
dosages from the chunk's start to the farthest of their stops, which may lie in later chunks (the
lookahead: a window is computed whole wherever chunk boundaries fall in it). The result is sgkit's
sparse table, a Dask DataFrame of one partition per chunk with columns ``i``, ``j`` (int32),
``value`` (float32) and ``cmp`` (int8, with ``variant_score``), in pandas on either backend: on
the GPU each task moves its windows' r^2 to the host in one copy, and the pairs are kept there.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from ...backend import to_backend, to_numpy
from ...deferred import module as _deferred
from ...errors import InputError
from ..registry import register
from . import specs
from ._dataset import as_dask, backend_of_dataset, keep_positions, variable
from .variables import DOSAGE, WINDOWS, Declared, Read, read

da = _deferred("dask.array")  # imported when the first graph is built
dd = _deferred("dask.dataframe")

INDEX = np.int32  # sgkit's dtypes of the table's columns
VALUE = np.float32


def _windows(ds: xr.Dataset, op: str) -> tuple[np.ndarray, np.ndarray]:
    """``window_start`` and ``window_stop`` as NumPy int64, checked: InputError where the dataset
    is not windowed or the windows are not intervals of the variants in order."""
    if not isinstance(ds, xr.Dataset):
        raise InputError(f"{op}: expected an xarray.Dataset, got {type(ds).__name__}")
    if "window_start" not in ds.variables or "window_stop" not in ds.variables:
        raise InputError(
            f"{op}: the dataset must be windowed (variables window_start and window_stop, as "
            "window_by_variant or window_by_position add them)"
        )
    starts = to_numpy(variable(ds, "window_start", ("windows",), "iu", op=op).data).astype(np.int64)
    stops = to_numpy(variable(ds, "window_stop", ("windows",), "iu", op=op).data).astype(np.int64)
    n = ds.sizes.get("variants", 0)
    if len(starts) and ((starts < 0).any() or (stops < starts).any() or (stops > n).any() or (np.diff(starts) < 0).any()):
        raise InputError(
            f"{op}: window_start and window_stop must be intervals of the {n} variants "
            "(0 <= start <= stop <= variants), with the starts in increasing order"
        )
    return starts, stops


def _limits(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Where the rows i of each window end: its stop, or the next window's start if sooner (the
    pairs of rows from there belong to the next window), as sgkit's ``_ld_matrix_jit``."""
    nxt = np.append(starts[1:], stops[-1:]) if len(starts) else starts
    limits = np.minimum(stops, nxt)
    if len(limits):
        limits[-1] = stops[-1]
    return limits


def _table(kernel, block, scores, starts, stops, limits, first: int, threshold: float):
    """The pandas table of one task: its windows' pairs (rows ``first`` on of the variants)."""
    import pandas as pd

    i, j, value, cmp = kernel(block, starts, stops, limits, threshold, scores)
    cols = {"i": (to_numpy(i) + first).astype(INDEX), "j": (to_numpy(j) + first).astype(INDEX), "value": to_numpy(value)}
    if cmp is not None:
        cols["cmp"] = to_numpy(cmp)
    return pd.DataFrame(cols)


def _meta(scores: bool):
    import pandas as pd

    cols = {"i": np.zeros(0, INDEX), "j": np.zeros(0, INDEX), "value": np.zeros(0, VALUE)}
    if scores:
        cols["cmp"] = np.zeros(0, np.int8)
    return pd.DataFrame(cols)


def _ld_matrix(ds: xr.Dataset, dosage: str, threshold: float | None, variant_score: str | None, op):
    starts, stops = _windows(ds, op.name)
    x = variable(ds, dosage, ("variants", "samples"), "iuf", op=op.name)
    data = as_dask(x)
    backend = backend_of_dataset(x)
    kernel = op.kernel("ld_r2", backend)
    scores = None
    if variant_score is not None:  # on the host, where the kernels keep the pairs
        score = variable(ds, variant_score, ("variants",), "f", op=op.name)
        scores = to_backend(as_dask(score, chunks=data.chunks[0]), "cpu")
    # sgkit: ``threshold or np.nan``, so a threshold of 0 keeps every pair, NaN r^2 included
    threshold = float(threshold or math.nan)
    limits = _limits(starts, stops)
    bounds = np.cumsum([0, *data.chunks[0]])
    chunk = np.searchsorted(bounds, starts, side="right") - 1  # the chunk each window starts in
    import dask

    parts = []
    grid = data.to_delayed()  # (chunks of variants, chunks of samples)
    for c in range(len(data.chunks[0])):
        w = np.flatnonzero(chunk == c)
        if not len(w):
            continue
        first, last = int(bounds[c]), int(stops[w].max())
        # the chunks to the farthest stop of its windows (later chunks' rows too), whole: the
        # kernel joins them (a Dask array passed here would be joined and copied by dask)
        end = max(c + 1, int(np.searchsorted(bounds, last, side="left")))
        blocks = [list(row) for row in grid[c:end]]
        sc = None if scores is None else scores[first:last]
        parts.append(
            dask.delayed(_table, pure=True)(
                kernel, blocks, sc, starts[w] - first, stops[w] - first, limits[w] - first, first, threshold
            )
        )
    meta = _meta(scores is not None)
    if not parts:
        return dd.from_pandas(meta, npartitions=1)
    return dd.from_delayed(parts, meta=meta, verify_meta=False)


@register(kernels=("ld_r2",), dataset=True, variables=Declared(
    needs=(*WINDOWS, Read("{dosage}", DOSAGE, "iuf"), read(specs.variant_score_spec, "{variant_score}")),
    table=True,
))
def ld_matrix(
    ds: xr.Dataset, *, dosage: str = "call_dosage", threshold: float | None = None, variant_score: str | None = None
):
    """Sparse LD matrix: r^2 (Rogers and Huff) of each pair of variants within a window, as
    sgkit's ``ld_matrix``.

    ``ds`` must be windowed (``window_by_variant``, ``window_by_position``). ``dosage``
    (variants, samples): integer or float dosages, missing where negative or NaN; each pair's r^2
    is over the samples where both are present. Pairs whose r^2 is below ``threshold`` or not
    finite are left out; without a threshold (None, or 0 as in sgkit) every pair is kept, NaN
    included. ``variant_score`` (variants, float) adds the column ``cmp``: 1, -1 or 0 as the
    score of ``i`` is greater than, less than or neither that of ``j``.

    Returns the upper triangle (diagonal included, r^2 = 1 there) as a lazy Dask DataFrame
    (pandas partitions, one per chunk of variants) with columns ``i``, ``j`` (int32), ``value``
    (float32) and ``cmp`` (int8, with ``variant_score``), sorted by ``i`` then ``j``. The windows
    are read when the graph is built; nothing else is computed.
    """
    return _ld_matrix(ds, dosage, threshold, variant_score, ld_matrix.op)


def maximal_independent_set(df) -> xr.Dataset:
    """The variants to drop so that no two kept variants share an edge of ``df`` (sgkit's
    ``maximal_independent_set``): PLINK's sequential greedy pass over the edges, sorted by ``i``
    then ``j``, dropping ``j`` (or ``i`` where ``cmp`` is -1) unless ``i`` was dropped already.

    ``df``: the table of :func:`ld_matrix` (pandas or Dask; a Dask table is computed). Returns a
    Dataset with ``ld_prune_index_to_drop`` (``variant_indexes``), sorted (sgkit gives the same
    indexes in the order of its set). InputError where the edges are not sorted.
    """
    return _maximal_independent_set(df, "cpu")


def _maximal_independent_set(df, backend: str) -> xr.Dataset:
    if hasattr(df, "__dask_graph__"):
        from ...exec.compute import compute

        df = compute(df)
    for col in ("i", "j"):
        if col not in df:
            raise InputError(f"maximal_independent_set: the table has no column {col!r} (columns: {', '.join(df.columns)})")
    kernel = ld_prune.op.kernel("maximal_independent_set", backend)
    cmp = np.asarray(df["cmp"]) if "cmp" in df else None
    try:
        drop = kernel(np.asarray(df["i"]), np.asarray(df["j"]), cmp)
    except ValueError as e:
        raise InputError(f"maximal_independent_set: {e}") from None
    return xr.Dataset({"ld_prune_index_to_drop": ("variant_indexes", drop)})


@register(kernels=("ld_r2", "maximal_independent_set", "take"), dataset=True, variables=Declared(
    needs=(*WINDOWS, Read("{dosage}", DOSAGE, "iuf"), read(specs.variant_score_spec, "{variant_score}")),
))
def ld_prune(
    ds: xr.Dataset, *, dosage: str = "call_dosage", threshold: float = 0.2, variant_score: str | None = None
) -> xr.Dataset:
    """The dataset without the variants in LD: sgkit's ``ld_prune``.

    :func:`ld_matrix` at ``threshold`` (default 0.2), then :func:`maximal_independent_set` of its
    pairs, whose dropped variants are removed from every variable along ``variants``. Unlike the
    other ops, this computes the LD table when called, as sgkit does: the variants kept, and so
    the result's shape, depend on it. With ``variant_score``, of two variants in LD the one of
    higher score is kept (not a true maximal independent set, as sgkit notes).
    """
    op = ld_prune.op
    table = _ld_matrix(ds, dosage, threshold, variant_score, op)
    drop = _maximal_independent_set(table, backend_of_dataset(ds[dosage]))["ld_prune_index_to_drop"].values
    keep = np.ones(ds.sizes["variants"], dtype=bool)
    keep[drop] = False
    # by position along ``variants``; sgkit's ``ds.sel(variants=~ds.variants.isin(drop))`` is the
    # same where ``variants`` has no coordinate (as in VCF Zarr), and would compare a coordinate's
    # values with the indexes otherwise
    return keep_positions(ds, "variants", keep, op)


__all__ = ["ld_matrix", "ld_prune", "maximal_independent_set"]
