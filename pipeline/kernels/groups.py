"""Reductions by group along the first axis of a 2-D block ``x[t, p]``, one pass, all groups.

``labels[t]`` in ``0..k-1`` says which group step ``t`` belongs to. Each kernel walks the steps of
one grid point ``p`` and accumulates into per-group rows of its outputs, so one launch covers
every group present in the block (no task per group), each thread owns one column of the outputs
(no atomics), and on the GPU a warp reads 32 neighbouring points of one step (coalesced).

- ``group_sum``: sum and count of the valid values (mode 0), or the count of values above a
  threshold (mode 1, ``x > threshold``, NaN counting as not above).
- ``group_spells``: for runs of ``x > threshold``, the longest run beginning in each group, and
  the state that joins runs across blocks (see :mod:`pipeline.reduce.aggregation`).

- ``group_runs``: per group, runs of ``x > threshold`` cut at the group's bounds.

On the GPU ``group_sum`` and ``group_spells`` are CUDA C kernels (``cuda/group_sum.cu``,
``cuda/group_spells.cu``; CuPy launches them on its stream, with no host synchronisation): see
"GPU kernels" below for what they do differently from the previous Numba CUDA loops (in
``benchmarks/kernels_previous.py``). Each CUDA C kernel has a twin, its loop step for step in
Numba, which is the CPU kernel: CPU and GPU results are the same bit for bit, and the CPU tests
check the kernels' logic. ``group_runs`` is one per-point loop, compiled by Numba for the CPU and
by Numba CUDA for the GPU.
"""

from __future__ import annotations

import functools

import numpy as np

from . import launch
from .launch import Spec
from .slabs import map_slabs, temporaries

# numba.cuda, set on first GPU use by _runs_kernel: a global of the module that defines the
# @cuda.jit kernel, as Numba's CUDA simulator requires (see launch.numba_cuda)
cuda = None


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


# --- GPU kernels ----------------------------------------------------------------------------------
#
# The previous loops (Numba CUDA, one thread per point, in benchmarks/kernels_previous.py) reached 65% (sums) and 47% (spells) of the
# copy bandwidth on an H200. What held them back, and what these kernels do instead:
#
# - spells: at the end of every run the loop read ``best[group, p]`` from global memory to compare
#   the run with it, a load whose result the next instruction needs; with runs ending on ~5% of
#   steps, a warp of 32 points meets one on most steps, so the warp waited a memory round trip per
#   step. Here the best run begun in the current stretch of equal labels is a running maximum in a
#   register, written when the stretch ends: with sorted labels (the bins of a resampling) once
#   per row, zeros included, on an output that needs no zeroing; otherwise as a maximum with what
#   is there. A run carried in from an earlier stretch is settled once, at the end of the stretch
#   where it ends. A step is five selects, with no branch and no test for the stretch's end, which
#   is looked for only in the batches of steps that hold one (an earlier version, which closed
#   each run when it ended and tested every step for the stretch's end, took about 22 instructions
#   a step, against about 10 now: 64-75% of the copy bandwidth, against 78-86%); labels come by
#   stretches (no load per step), and float32 data are compared with a float32 threshold
#   (:func:`threshold_for`).
# - sums: each change of group added the register sum into ``sums[group, p]`` (read, add, write,
#   on zeroed outputs: three passes over them) and the step's label was compared per element.
#   Here the steps are visited group by group (``order``: the steps sorted by group, stably;
#   ``ends[g]``: where group g ends in it), so each output is written once, when its group ends,
#   with no zeroing; the inner loop is loads and adds, ``U`` loads in flight.
# - both: launched by CuPy, with no per-launch typing of arguments and no host synchronisation
#   on each argument's stream (numba-cuda synchronises on the stream a CuPy array names).

# Measured on an H200 (730 x 1038240 float32), kernels timed in turn in one process:
# - sums, 256 threads, the next 8 steps loaded while these are added up: 84-86% of the copy
#   bandwidth, against 81-84% for 8 steps loaded and then added up (the previous Numba loop
#   62-65%); the next 4 while these: 78-81%;
# - spells, 256 threads x 4 steps, the next 4 loaded while these are worked through (32
#   registers, every thread slot of a multiprocessor filled): 86-88% with 12 months' labels and
#   97-99% with years', against 85-87% and 95-97% for 8 steps loaded and then worked through
#   (34 registers, three quarters of the slots);
# - 128 or 512 threads, 16 steps: no better.
# These are the kernels alone. Through group_spells the host's preparation of each call (labels,
# outputs, launch) is also timed when calls are timed one by one, and varied between 70% and 80%
# from one round to the next; two full runs of benchmarks/ops_bandwidth.py on another machine
# gave 69% for the 8-step kernel that way.
GROUP_THREADS = 256
GROUP_UNROLL = 8
SPELLS_UNROLL = 4

def _cmp_type(in_dtype) -> str:
    """The C type of the comparison with the threshold: float for float32 data (see
    :func:`threshold_for`), double otherwise."""
    return "float" if np.dtype(in_dtype) == np.float32 else "double"


def threshold_for(in_dtype, threshold: float):
    """The threshold in the comparison type: for float32 data the largest float32 not above it,
    so that ``v > t`` in float32 is ``v > threshold`` in float64 for every float32 ``v`` (NaN
    included), without converting each value to float64."""
    if _cmp_type(in_dtype) == "double":
        return np.float64(threshold)
    with np.errstate(over="ignore"):
        t = np.float32(threshold)
    return np.nextafter(t, np.float32(-np.inf)) if float(t) > float(threshold) else t


def _sum_params(in_dtype, mode: int, threads: int, unroll: int) -> dict:
    return dict(in_t=launch.c_type(in_dtype), cmp_t=_cmp_type(in_dtype), threads=threads, unroll=unroll, mode=int(mode))


def _spells_params(in_dtype, sorted_labels: bool, threads: int, unroll: int) -> dict:
    return dict(in_t=launch.c_type(in_dtype), cmp_t=_cmp_type(in_dtype), threads=threads, unroll=unroll,
                sorted=int(sorted_labels))


def sum_source(in_dtype, mode: int, threads: int = GROUP_THREADS, unroll: int = GROUP_UNROLL) -> str:
    return launch.cuda_source("group_sum.cu", **_sum_params(in_dtype, mode, threads, unroll))


def spells_source(in_dtype, sorted_labels: bool, threads: int = GROUP_THREADS, unroll: int = SPELLS_UNROLL) -> str:
    return launch.cuda_source("group_spells.cu", **_spells_params(in_dtype, sorted_labels, threads, unroll))


def _raw(kind: str, in_dtype, variant: int, threads: int, unroll: int):
    """``sum`` (variant: mode) or ``spells`` (variant: labels sorted) compiled by CuPy."""
    if kind == "sum":
        return launch.raw_kernel("group_sum.cu", "pipeline_group_sum", launch.FMAD,
                                 **_sum_params(in_dtype, variant, threads, unroll))
    return launch.raw_kernel("group_spells.cu", "pipeline_group_spells", launch.FMAD,
                             **_spells_params(in_dtype, variant, threads, unroll))


def label_segments(labels):
    """(end, label) of each stretch of equal labels, and whether the labels never decrease."""
    labels = np.asarray(labels, dtype=np.int64).ravel()
    if labels.size == 0:
        return np.zeros(1, np.int64), np.zeros(1, np.int64), True
    change = np.flatnonzero(np.diff(labels)) + 1
    ends = np.append(change, labels.size).astype(np.int64)
    return ends, labels[np.concatenate([[0], change])], bool(np.all(np.diff(labels) >= 0))


def group_order(labels, k: int):
    """The steps sorted by group, stably, and the end of each group ``0..k-1`` in that order."""
    labels = np.asarray(labels, dtype=np.int64).ravel()
    order = np.argsort(labels, kind="stable")
    ends = np.searchsorted(labels[order], np.arange(k), side="right")
    return order.astype(np.int64), ends.astype(np.int64)


@functools.lru_cache(maxsize=64)
def _on_device(kind: str, key: bytes, k: int, device: int):
    """The label arrays a kernel reads, on the GPU: one copy per block's labels and device, so
    that blocks with the same labels (all the spatial blocks of a time block) pay for it once."""
    import cupy

    labels = np.frombuffer(key, dtype=np.int64)
    if kind == "sum":
        order, ends = group_order(labels, k)
        return cupy.asarray(np.concatenate([order, ends])), None
    seg_end, seg_label, sorted_labels = label_segments(labels)
    return cupy.asarray(np.concatenate([seg_end, seg_label])), sorted_labels


def _device_labels(kind: str, labels, k: int):
    import cupy

    key = np.ascontiguousarray(labels, dtype=np.int64).ravel().tobytes()
    return _on_device(kind, key, k, cupy.cuda.Device().id)


# --- their twins: each thread's loop, step for step, in Numba ---------------------------------------


def make_group_sum_twin(jit):
    @jit
    def column(x, order, ends, threshold, mode, sums, counts, p):
        k = ends.shape[0]
        acc, n, g = 0.0, 0.0, 0
        end = ends[0] if k > 0 else -1
        for j in range(x.shape[0] + 1):
            if j > 0:
                v = float(x[order[j - 1], p])
                if mode == 0:
                    if v == v:
                        acc += v
                        n += 1.0
                elif v > threshold:
                    acc += 1.0
            while g < k and end == j:
                sums[g, p] = acc
                counts[g, p] = n
                acc, n = 0.0, 0.0
                g += 1
                if g < k:
                    end = ends[g]

    return column


def make_group_spells_twin(jit):
    """The spells kernel's loop: stretches of equal labels, the running best of the runs begun in
    the current stretch, the run carried in from an earlier one (settled once it has ended), and
    the writes of ``best`` (once per row with sorted labels; else raised from zero)."""

    @jit
    def column(x, seg_end, seg_label, threshold, best, lead, tail, tail_group, sorted_labels, p):
        k, nt = best.shape[0], x.shape[0]
        run, hb, cl, si, cur, pv, n_lead = 0, 0, 0, 0, seg_label[0], 0, 0
        og, nxt = cur, seg_end[0]
        fresh, pend, is_lead = False, True, True
        written, hv = 0, 0
        if not sorted_labels:
            hv = best[cur, p]
        for t in range(nt + 1):
            if t == nxt or t == nt:  # the stretch ends
                if pend and (fresh or t == nt):  # settle the carried run
                    if is_lead:
                        n_lead = cl
                    elif og == cur:
                        hb = max(hb, cl)
                    else:
                        best[og, p] = max(pv, cl)
                    pend, is_lead = False, False
                if sorted_labels:  # write the row
                    while written < cur:
                        best[written, p] = 0
                        written += 1
                    w = hb
                    written = cur + 1
                else:
                    w = max(hv, hb)
                best[cur, p] = w
                if t == nt:
                    break
                if fresh and run > 0:  # the open run is carried into the next stretch
                    pend, og, pv, fresh, cl = True, cur, w, False, run
                hb = 0
                si += 1
                nxt, cur = seg_end[si], seg_label[si]
                if not sorted_labels:
                    hv = best[cur, p]
            above = x[t, p] > threshold
            fresh = fresh or not above
            run = run + 1 if above else 0
            if not fresh:
                cl = run
            else:
                hb = max(hb, run)
        if sorted_labels:
            for g in range(cur + 1, k):
                best[g, p] = 0
        lead[p] = n_lead
        tail[p] = run
        tail_group[p] = (cur if fresh else og) if run > 0 else -1

    return column


# --- the CPU kernels: the twins, and the runs loop, over all points ---------------------------------


@launch.once
def _sum_cpu():
    column = make_group_sum_twin(launch.cpu_jit)

    @launch.cpu_jit
    def columns(x, order, ends, threshold, mode, sums, counts):
        for p in range(x.shape[1]):
            column(x, order, ends, threshold, mode, sums, counts, p)

    return columns


@launch.once
def _spells_cpu():
    column = make_group_spells_twin(launch.cpu_jit)

    @launch.cpu_jit
    def columns(x, seg_end, seg_label, threshold, best, lead, tail, tail_group, sorted_labels):
        for p in range(x.shape[1]):
            column(x, seg_end, seg_label, threshold, best, lead, tail, tail_group, sorted_labels, p)

    return columns


@launch.once
def _runs_cpu():
    column = launch.cpu_jit(_group_runs_column)

    @launch.cpu_jit
    def columns(x, labels, threshold, length, prefix, current, longest):
        for p in range(x.shape[1]):
            column(x, labels, threshold, length, prefix, current, longest, p)

    return columns


@functools.cache
def runs_kernel():
    """The runs loop under Numba CUDA, ``(x2d, labels, threshold, length, prefix, current,
    longest)``: one thread per grid point; a warp reads 32 neighbouring points of one step
    (coalesced). (The tests launch it on NumPy arrays under Numba's CUDA simulator.)"""
    global cuda
    cuda = launch.numba_cuda()
    column = cuda.jit(device=True)(_group_runs_column)

    @launch.cuda_kernel
    def group_runs(x, labels, threshold, length, prefix, current, longest):
        p = cuda.grid(1)
        if p < x.shape[1]:
            column(x, labels, threshold, length, prefix, current, longest, p)

    return group_runs


def _raw_input(x2d):
    """A C-contiguous CuPy block of a type the CUDA C kernels are compiled for."""
    import cupy

    return cupy.ascontiguousarray(x2d if np.dtype(x2d.dtype) in launch.C_TYPES else x2d.astype(np.float64))


# --- the kernels ------------------------------------------------------------------------------------


def group_sum_cpu(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0) -> dict:
    """Per-group sums and counts of a (steps, points) block (``counts`` stays 0 in mode 1): the
    twin of the CUDA C kernel."""
    npts = x2d.shape[1]
    sums = np.empty((k, npts), dtype=np.float64)  # every row is written
    counts = np.empty((k, npts), dtype=np.float64)
    _sum_cpu()(x2d, *group_order(labels, k), np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def group_sum_gpu(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0, *, threads: int = GROUP_THREADS,
                  unroll: int = GROUP_UNROLL) -> dict:
    """:func:`group_sum_cpu` on a CuPy block, by the CUDA C kernel."""
    import cupy

    nt, npts = x2d.shape
    sums = cupy.empty((k, npts), dtype=np.float64)  # every row is written
    counts = cupy.empty((k, npts), dtype=np.float64)
    x2d = _raw_input(x2d)
    steps, _ = _device_labels("sum", labels, k)  # order, then ends
    kernel = _raw("sum", np.dtype(x2d.dtype), int(mode != 0), threads, unroll)
    kernel((launch.blocks(npts, threads),), (threads,), (
        x2d, steps[:nt], steps[nt:], threshold_for(x2d.dtype, threshold), sums, counts, np.int64(nt), np.int64(npts),
        np.int32(k)))
    return {"sum": sums, "count": counts}


def _spells_outputs(xp, sorted_labels: bool, k: int, npts: int):
    """The outputs, and the array of the three per-point ones: with sorted labels every row of
    best is written; otherwise rows are raised from zero. Every point's state is written."""
    out = {"best": (xp.empty if sorted_labels else xp.zeros)((k, npts), dtype=np.int32)}
    state = xp.empty((3, npts), dtype=np.int32)
    out.update(lead=state[0], tail=state[1], tail_group=state[2])
    return out, state


def _no_spells(out, state):
    """No steps or no groups: no runs."""
    out["best"][...] = 0
    state[:2] = 0
    state[2] = -1
    return out


def group_spells_cpu(x2d, labels, k: int, threshold: float) -> dict:
    """Run-length state of a (steps, points) block: per group the longest run that begins there
    (leading run excluded), and per point the leading run, the open run and its group (the twin of
    the CUDA C kernel)."""
    nt, npts = x2d.shape
    seg_end, seg_label, sorted_labels = label_segments(labels)
    out, state = _spells_outputs(np, sorted_labels, k, npts)
    if nt == 0 or k == 0:
        return _no_spells(out, state)
    outs = (out["best"], out["lead"], out["tail"], out["tail_group"])
    _spells_cpu()(x2d, seg_end, seg_label, np.float64(threshold), *outs, sorted_labels)
    return out


def group_spells_gpu(x2d, labels, k: int, threshold: float, *, threads: int = GROUP_THREADS,
                     unroll: int = SPELLS_UNROLL) -> dict:
    """:func:`group_spells_cpu` on a CuPy block, by the CUDA C kernel."""
    import cupy

    nt, npts = x2d.shape
    seg_end, _, sorted_labels = label_segments(labels)
    out, state = _spells_outputs(cupy, sorted_labels, k, npts)
    if nt == 0 or k == 0:
        return _no_spells(out, state)
    outs = (out["best"], out["lead"], out["tail"], out["tail_group"])
    x2d = _raw_input(x2d)
    segs, _ = _device_labels("spells", labels, k)  # ends, then labels, of the stretches
    kernel = _raw("spells", np.dtype(x2d.dtype), int(sorted_labels), threads, unroll)
    kernel((launch.blocks(npts, threads),), (threads,), (
        x2d, segs[: seg_end.size], segs[seg_end.size :], threshold_for(x2d.dtype, threshold), *outs,
        np.int32(nt), np.int64(npts), np.int32(k)))
    return out


def group_runs_cpu(x2d, labels, k: int, threshold: float) -> dict:
    """Per group, runs of ``x > threshold`` cut at the group's bounds: length, prefix, current, longest."""
    npts = x2d.shape[1]
    out = {f: np.zeros((k, npts), dtype=np.int32) for f in ("length", "prefix", "current", "longest")}
    _runs_cpu()(x2d, labels, np.float64(threshold), out["length"], out["prefix"], out["current"], out["longest"])
    return out


def group_runs_gpu(x2d, labels, k: int, threshold: float) -> dict:
    """:func:`group_runs_cpu` on a CuPy block, by the same loop under Numba CUDA."""
    import cupy

    npts = x2d.shape[1]
    out = {f: cupy.zeros((k, npts), dtype=np.int32) for f in ("length", "prefix", "current", "longest")}
    args = (np.float64(threshold), out["length"], out["prefix"], out["current"], out["longest"])
    launch.launch_numba(runs_kernel(), npts, x2d, cupy.asarray(labels), *args)
    return out



# --- anomaly: subtract each step's group value ----------------------------------------------------


@temporaries(5.5)
def subtract_groups_cpu(x2d, labels, values2d, out_dtype):
    """x[t, p] - values[labels[t], p] in float64, written in ``out_dtype``, slab by slab across
    the points (each slab holds every step, as ``labels`` index them)."""
    return map_slabs(_subtract_groups_formula, x2d, labels, values2d, out_dtype, whole=(0,))


def _subtract_groups_formula(x2d, labels, values2d, out_dtype):
    return (x2d.astype(np.float64, copy=False) - values2d[labels]).astype(out_dtype, copy=False)


# one pass: out[t, p] = x[t, p] - values[labels[t], p], the group's row gathered in-kernel
SUBTRACT_GROUPS = Spec(
    "column", "pipeline_subtract_groups", (("const long long*", "labels"), ("const double*", "values")),
    body="(out_t)((double)v - values[labels[r] * cols + p])",
)


def subtract_groups_gpu(x2d, labels, values2d, out_dtype):
    import cupy

    x2d = cupy.ascontiguousarray(x2d)
    out = cupy.empty(x2d.shape, dtype=out_dtype)
    labels = cupy.asarray(labels, dtype=np.int64)
    return launch.stream(SUBTRACT_GROUPS, x2d, out, labels, cupy.ascontiguousarray(values2d, dtype=np.float64))
