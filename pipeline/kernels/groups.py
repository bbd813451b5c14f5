"""Reductions by group along the first axis of a 2-D block ``x[t, p]``, one pass, all groups.

``labels[t]`` in ``0..k-1`` says which group step ``t`` belongs to. Each kernel walks the steps of
one grid point ``p`` in order and accumulates into per-group rows of its outputs, so one launch
covers every group present in the block (no task per group), each thread owns one column of the
outputs (no atomics), and on the GPU a warp reads 32 neighbouring points of one step (coalesced).

- ``group_sum``: sum and count of the valid values (mode 0), or the count of values above a
  threshold (mode 1, ``x > threshold``, NaN counting as not above).
- ``group_spells``: for runs of ``x > threshold``, the longest run beginning in each group, and
  the state that joins runs across blocks (see :mod:`pipeline.groupby`).
"""

from __future__ import annotations

import functools

import numpy as np

from .streaming import Spec

THREADS_PER_BLOCK = 256


def make_group_sum_column(jit):
    """The per-point loop of ``group_sum``, compiled by ``jit`` (``numba.njit`` or
    ``cuda.jit(device=True)``). A group's running sum stays in registers while consecutive steps
    belong to it and is added to ``sums`` when the group changes; four steps are loaded ahead."""

    @jit
    def step(x, labels, threshold, mode, sums, counts, p, t, v, group, acc, n):
        g = labels[t]
        if g != group:
            if group >= 0:
                sums[group, p] += acc
                counts[group, p] += n
            group, acc, n = g, 0.0, 0.0
        if mode == 0:
            if v == v:
                acc += v
                n += 1.0
        elif v > threshold:
            acc += 1.0
        return group, acc, n

    @jit
    def column(x, labels, threshold, mode, sums, counts, p):
        group, acc, n = -1, 0.0, 0.0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = float(x[t, p]), float(x[t + 1, p]), float(x[t + 2, p]), float(x[t + 3, p])
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t, v0, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 1, v1, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 2, v2, group, acc, n)
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t + 3, v3, group, acc, n)
            t += 4
        while t < nt:
            group, acc, n = step(x, labels, threshold, mode, sums, counts, p, t, float(x[t, p]), group, acc, n)
            t += 1
        if group >= 0:
            sums[group, p] += acc
            counts[group, p] += n

    return column


def make_group_spells_column(jit):
    """The per-point loop of ``group_spells``, compiled by ``jit``.

    A run counts, with its whole length, for the group of its first step (xclim's "first"
    index). The run that opens the block may have begun in an earlier block: it is kept apart in
    ``lead``. The run still open at the end (``tail``, begun in group ``tail_group``) may go on
    in the next block: it is counted with its length so far and lengthened on merge. A run is
    written to ``best`` once, when it ends, and four steps are loaded ahead.
    """

    @jit
    def step(labels, threshold, best, p, t, v, run, group, in_lead, n_lead):
        if v > threshold:
            if run == 0:
                group = labels[t]
            run += 1
            if in_lead:
                n_lead += 1
        else:
            if run > 0 and not in_lead and run > best[group, p]:
                best[group, p] = run
            run = 0
            in_lead = False
        return run, group, in_lead, n_lead

    @jit
    def column(x, labels, threshold, best, lead, tail, tail_group, p):
        run, group, in_lead, n_lead = 0, -1, True, 0
        nt = x.shape[0]
        t = 0
        while t + 4 <= nt:
            v0, v1, v2, v3 = x[t, p], x[t + 1, p], x[t + 2, p], x[t + 3, p]
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t, v0, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 1, v1, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 2, v2, run, group, in_lead, n_lead)
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t + 3, v3, run, group, in_lead, n_lead)
            t += 4
        while t < nt:
            run, group, in_lead, n_lead = step(labels, threshold, best, p, t, x[t, p], run, group, in_lead, n_lead)
            t += 1
        if run > 0 and not in_lead and run > best[group, p]:
            best[group, p] = run
        lead[p] = n_lead
        tail[p] = run
        tail_group[p] = group if run > 0 else -1

    return column


def _group_runs_column(x, labels, threshold, length, prefix, current, longest, p):
    # Runs cut at group boundaries: per group, the steps seen, the run that opens the group, the
    # run open at its end and the longest run; these merge across blocks without neighbours.
    for t in range(x.shape[0]):
        g = labels[t]
        length[g, p] += 1
        if x[t, p] > threshold:
            current[g, p] += 1
            if current[g, p] > longest[g, p]:
                longest[g, p] = current[g, p]
            if prefix[g, p] == length[g, p] - 1:
                prefix[g, p] += 1
        else:
            current[g, p] = 0


_FACTORIES = {"sum": make_group_sum_column, "spells": make_group_spells_column}


@functools.cache
def _cpu(name):
    import numba

    jit = numba.njit(nogil=True)
    body = _FACTORIES[name](jit) if name in _FACTORIES else jit(_group_runs_column)

    if name == "sum":

        @numba.njit(nogil=True)
        def group_sum(x, labels, threshold, mode, sums, counts):
            for p in range(x.shape[1]):
                body(x, labels, threshold, mode, sums, counts, p)

        return group_sum

    @numba.njit(nogil=True)
    def over_points(x, labels, threshold, a, b, c, d):
        for p in range(x.shape[1]):
            body(x, labels, threshold, a, b, c, d, p)

    return over_points


def _launch(kernel, npts, *args):
    blocks = max(1, (npts + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)
    kernel[blocks, THREADS_PER_BLOCK](*args)


def group_sum(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0) -> dict:
    """Per-group sums and counts of a (steps, points) block; CPU or GPU by the block's type."""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    npts = x2d.shape[1]
    sums = xp.zeros((k, npts), dtype=np.float64)
    counts = xp.zeros((k, npts), dtype=np.float64)
    if is_cupy(x2d):
        from .groups_cuda import group_sum as kernel

        _launch(kernel, npts, x2d, xp.asarray(labels), np.float64(threshold), np.int32(mode), sums, counts)
    else:
        _cpu("sum")(x2d, labels, np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def group_spells(x2d, labels, k: int, threshold: float) -> dict:
    """Run-length state of a (steps, points) block: per group the longest run that begins there
    (leading run excluded), and per point the leading run, the open run and its group."""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    npts = x2d.shape[1]
    out = {"best": xp.zeros((k, npts), dtype=np.int32)}
    out.update({f: xp.zeros(npts, dtype=np.int32) for f in ("lead", "tail", "tail_group")})
    args = (np.float64(threshold), out["best"], out["lead"], out["tail"], out["tail_group"])
    if is_cupy(x2d):
        from .groups_cuda import group_spells as kernel

        _launch(kernel, npts, x2d, xp.asarray(labels), *args)
    else:
        _cpu("spells")(x2d, labels, *args)
    return out


def group_runs(x2d, labels, k: int, threshold: float) -> dict:
    """Per group, runs of ``x > threshold`` cut at the group's bounds: length, prefix, current, longest."""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    npts = x2d.shape[1]
    out = {f: xp.zeros((k, npts), dtype=np.int32) for f in ("length", "prefix", "current", "longest")}
    args = (np.float64(threshold), out["length"], out["prefix"], out["current"], out["longest"])
    if is_cupy(x2d):
        from .groups_cuda import group_runs as kernel

        _launch(kernel, npts, x2d, xp.asarray(labels), *args)
    else:
        _cpu("runs")(x2d, labels, *args)
    return out


def launch_gpu(name: str, x2d, labels, *args):
    """Launch a CUDA kernel on 2-D arrays (CuPy, or NumPy under Numba's CUDA simulator)."""
    from . import groups_cuda

    _launch(getattr(groups_cuda, name), x2d.shape[1], x2d, labels, *args)


# --- anomaly: subtract each step's group value ----------------------------------------------------


def subtract_groups_cpu(x2d, labels, values2d, out_dtype):
    return (x2d.astype(np.float64, copy=False) - values2d[labels]).astype(out_dtype, copy=False)


# one pass: out[t, p] = x[t, p] - values[labels[t], p], the group's row gathered in-kernel
SUBTRACT_GROUPS = Spec(
    "column", "pipeline_subtract_groups", (("const long long*", "labels"), ("const double*", "values")),
    body="(out_t)((double)v - values[labels[r] * cols + p])",
)


def subtract_groups_gpu(x2d, labels, values2d, out_dtype):
    import cupy

    from . import streaming

    x2d = cupy.ascontiguousarray(x2d)
    out = cupy.empty(x2d.shape, dtype=out_dtype)
    labels = cupy.asarray(labels, dtype=np.int64)
    return streaming.run(SUBTRACT_GROUPS, x2d, out, labels, cupy.ascontiguousarray(values2d, dtype=np.float64))
