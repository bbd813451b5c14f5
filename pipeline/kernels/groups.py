"""Reductions by group along the first axis of a 2-D block ``x[t, p]``, one pass, all groups.

``labels[t]`` in ``0..k-1`` says which group step ``t`` belongs to. Each kernel walks the steps of
one grid point ``p`` and accumulates into per-group rows of its outputs, so one launch covers
every group present in the block (no task per group), each thread owns one column of the outputs
(no atomics), and on the GPU a warp reads 32 neighbouring points of one step (coalesced).

- ``group_sum``: sum and count of the valid values (mode 0), or the count of values above a
  threshold (mode 1, ``x > threshold``, NaN counting as not above).
- ``group_spells``: for runs of ``x > threshold``, the longest run beginning in each group, and
  the state that joins runs across blocks (see :mod:`pipeline.groupby`).

On the GPU both are CUDA C kernels in the manner of :mod:`pipeline.kernels.streaming` (CuPy
launches them on its stream, with no host synchronisation): see "GPU kernels" below for what
they do differently from the previous Numba CUDA loops, which are kept (``*_previous``) for the
benchmarks. Each CUDA C kernel has a twin, its loop step for step in Numba, which is the CPU
kernel: CPU and GPU results are the same bit for bit, and the CPU tests check the kernels' logic.
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


# --- GPU kernels ----------------------------------------------------------------------------------
#
# The previous loops (above, compiled by ``numba.cuda``) reached 65% (sums) and 47% (spells) of the
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

_SUM_SOURCE = r"""
typedef {in_t} in_t;
typedef {cmp_t} cmp_t;
#define THREADS {threads}
#define U {unroll}
#define MODE {mode}
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_group_sum(
        const in_t* __restrict__ x, const long long* __restrict__ order, const long long* __restrict__ ends,
        cmp_t threshold, double* __restrict__ sums, double* __restrict__ counts, long long nt, long long npts, int k) {{
    const long long p = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (p >= npts) return;
    const in_t* xp = x + p;
    double acc = 0.0, n = 0.0;
    int g = 0;
    long long end = k > 0 ? ends[0] : -1;
    // write out the groups that end at position j of ``order`` (a group with no steps ends where the one before does)
#define SETTLE(j) while (g < k && end == (j)) {{ sums[g * npts + p] = acc; counts[g * npts + p] = n; acc = 0.0; n = 0.0; \
                                                if (++g < k) end = ends[g]; }}
#if MODE == 0
#define ADD(v) {{ const double d = (double)(v); if (d == d) {{ acc += d; n += 1.0; }} }}
#else
#define ADD(v) {{ if ((cmp_t)(v) > threshold) acc += 1.0; }}
#endif
    SETTLE(0)
    // the next U steps are loaded while these are added up (as in the spells kernel)
    long long j = 0;
    in_t v[U];
    if (U <= nt) {{
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = xp[order[i] * npts];
    }}
    for (; j + U <= nt; j += U) {{
        in_t nv[U];
        if (j + 2 * U <= nt) {{
#pragma unroll
            for (int i = 0; i < U; ++i) nv[i] = xp[order[j + U + i] * npts];
        }}
#pragma unroll
        for (int i = 0; i < U; ++i) {{ ADD(v[i]) SETTLE(j + i + 1) }}
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = nv[i];
    }}
    for (; j < nt; ++j) {{ ADD(xp[order[j] * npts]) SETTLE(j + 1) }}
}}
"""

_SPELLS_SOURCE = r"""
typedef {in_t} in_t;
typedef {cmp_t} cmp_t;
#define THREADS {threads}
#define U {unroll}
#define SORTED {sorted}
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_group_spells(
        const in_t* __restrict__ x, const long long* __restrict__ seg_end, const long long* __restrict__ seg_label,
        cmp_t threshold, int* __restrict__ best, int* __restrict__ lead, int* __restrict__ tail,
        int* __restrict__ tail_group, int nt, long long npts, int k) {{
    const long long p = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (p >= npts) return;
    const in_t* xp = x + p;
    // Steps come in stretches of equal labels (stretch si ends before step seg_end[si]). ``run`` is
    // the open run's length. While ``fresh`` (it began in this stretch) it raises hb, the best run
    // begun in the stretch, as a running maximum: a run's longest length is its last. Otherwise it
    // was carried in from an earlier stretch (begun in og; the block's leading run while
    // ``is_lead``), and cl follows its length; once it has ended, it is settled at the end of its
    // stretch: into hb if og is this stretch's label, else into its row, whose value (pv) was
    // written when the carry began. A step is thus five selects (three once the warp has no
    // carried run), and the stretch's end is looked for only in the batches of U steps that hold one.
    int run = 0, hb = 0, cl = 0, si = 0, cur = (int)seg_label[0], og = cur, pv = 0, n_lead = 0;
    int next = (int)seg_end[0];
    bool fresh = false, pend = true, is_lead = true;
#if SORTED
    // each row is written once when its stretch ends (rows of groups with no steps as 0; no
    // zeroing by the caller), and raised again only by a carried run
    int written = 0;
#define OPEN()
#define SHUT(w) {{ for (; written < cur; ++written) best[written * npts + p] = 0; w = hb; best[cur * npts + p] = w; written = cur + 1; }}
#else
    // a group may come back: its row (zeroed by the caller) is read when a stretch opens and
    // raised when it ends
    int hv = 0;
#define OPEN() {{ hv = best[cur * npts + p]; }}
#define SHUT(w) {{ w = max(hv, hb); best[cur * npts + p] = w; }}
#endif
#define SETTLE() {{ if (is_lead) n_lead = cl; else if (og == cur) hb = max(hb, cl); else best[og * npts + p] = max(pv, cl); \
                    pend = false; is_lead = false; }}
#define BOUNDARY() {{ if (pend && fresh) SETTLE() \
        int w; SHUT(w) \
        if (fresh && run > 0) {{ pend = true; og = cur; pv = w; fresh = false; cl = run; }} \
        hb = 0; ++si; next = (int)seg_end[si]; cur = (int)seg_label[si]; OPEN() }}
#define STEP(v) {{ const bool above = (cmp_t)(v) > threshold; fresh = fresh || !above; run = above ? run + 1 : 0; \
                   cl = fresh ? cl : run; hb = fresh ? max(hb, run) : hb; }}
    // once every point of the warp is past its carried run (most batches), a step is three selects
#define STEP_FRESH(v) {{ const bool above = (cmp_t)(v) > threshold; run = above ? run + 1 : 0; hb = max(hb, run); }}
    OPEN()
    // the next batch of U steps is loaded while this one is worked through, so that a warp has
    // loads in flight through its arithmetic too
    int t = 0;
    in_t v[U];
    if (U <= nt) {{
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = xp[(long long)i * npts];
    }}
    for (; t + U <= nt; t += U) {{
        in_t nv[U];
        if (t + 2 * U <= nt) {{
#pragma unroll
            for (int i = 0; i < U; ++i) nv[i] = xp[(long long)(t + U + i) * npts];
        }}
        if (t + U <= next) {{
            if (__all_sync(__activemask(), fresh)) {{
#pragma unroll
                for (int i = 0; i < U; ++i) STEP_FRESH(v[i])
            }} else {{
#pragma unroll
                for (int i = 0; i < U; ++i) STEP(v[i])
            }}
        }} else {{
#pragma unroll
            for (int i = 0; i < U; ++i) {{ if (t + i == next) BOUNDARY() STEP(v[i]) }}
        }}
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = nv[i];
    }}
    for (; t < nt; ++t) {{ if (t == next) BOUNDARY() STEP(xp[(long long)t * npts]) }}
    if (pend) SETTLE()  // a carried run that has ended, or is open (counted with its length so far)
    int w;
    SHUT(w)
#if SORTED
    for (; written < k; ++written) best[written * npts + p] = 0;
#endif
    lead[p] = n_lead;
    tail[p] = run;
    tail_group[p] = run > 0 ? (fresh ? cur : og) : -1;
}}
"""


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


def sum_source(in_dtype, mode: int, threads: int = GROUP_THREADS, unroll: int = GROUP_UNROLL) -> str:
    from .streaming import C_TYPES

    return _SUM_SOURCE.format(in_t=C_TYPES[np.dtype(in_dtype)], cmp_t=_cmp_type(in_dtype), threads=threads,
                              unroll=unroll, mode=int(mode))


def spells_source(in_dtype, sorted_labels: bool, threads: int = GROUP_THREADS, unroll: int = SPELLS_UNROLL) -> str:
    from .streaming import C_TYPES

    return _SPELLS_SOURCE.format(in_t=C_TYPES[np.dtype(in_dtype)], cmp_t=_cmp_type(in_dtype), threads=threads,
                                 unroll=unroll, sorted=int(sorted_labels))


@functools.cache
def _raw(kind: str, in_dtype, variant: int, threads: int, unroll: int):
    """``sum`` (variant: mode) or ``spells`` (variant: labels sorted) compiled by CuPy."""
    import cupy

    if kind == "sum":
        return cupy.RawKernel(sum_source(in_dtype, variant, threads, unroll), "pipeline_group_sum", options=("--fmad=false",))
    return cupy.RawKernel(spells_source(in_dtype, variant, threads, unroll), "pipeline_group_spells", options=("--fmad=false",))


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


_FACTORIES = {
    "sum": make_group_sum_twin, "spells": make_group_spells_twin,
    "sum_previous": make_group_sum_column, "spells_previous": make_group_spells_column,
}


@functools.cache
def _cpu(name):
    """A CPU kernel over all points: ``sum``, ``spells`` (the twins of the CUDA C kernels), their
    ``*_previous`` loops, or ``runs``."""
    import numba

    jit = numba.njit(nogil=True)
    body = _FACTORIES[name](jit) if name in _FACTORIES else jit(_group_runs_column)

    if name == "sum_previous":

        @numba.njit(nogil=True)
        def five(x, a, b, c, d, e):
            for p in range(x.shape[1]):
                body(x, a, b, c, d, e, p)

        return five

    if name == "spells":

        @numba.njit(nogil=True)
        def nine(x, a, b, c, d, e, f, g, h):
            for p in range(x.shape[1]):
                body(x, a, b, c, d, e, f, g, h, p)

        return nine

    @numba.njit(nogil=True)
    def six(x, a, b, c, d, e, f):
        for p in range(x.shape[1]):
            body(x, a, b, c, d, e, f, p)

    return six


def _launch(kernel, npts, *args):
    from ._numba_cuda import launch

    launch(kernel, npts, THREADS_PER_BLOCK, *args)


def _raw_input(x2d):
    """A C-contiguous CuPy block of a type the CUDA C kernels are compiled for."""
    import cupy

    from .streaming import C_TYPES

    return cupy.ascontiguousarray(x2d if np.dtype(x2d.dtype) in C_TYPES else x2d.astype(np.float64))


def group_sum(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0, *, threads: int = GROUP_THREADS,
              unroll: int = GROUP_UNROLL) -> dict:
    """Per-group sums and counts of a (steps, points) block; CPU or GPU by the block's type.
    (``counts`` stays 0 in mode 1.)"""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    nt, npts = x2d.shape
    sums = xp.empty((k, npts), dtype=np.float64)  # every row is written
    counts = xp.empty((k, npts), dtype=np.float64)
    if is_cupy(x2d):
        x2d = _raw_input(x2d)
        steps, _ = _device_labels("sum", labels, k)  # order, then ends
        kernel = _raw("sum", np.dtype(x2d.dtype), int(mode != 0), threads, unroll)
        kernel((max(1, -(-npts // threads)),), (threads,), (
            x2d, steps[:nt], steps[nt:], threshold_for(x2d.dtype, threshold), sums, counts, np.int64(nt), np.int64(npts),
            np.int32(k)))
    else:
        _cpu("sum")(x2d, *group_order(labels, k), np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def group_spells(x2d, labels, k: int, threshold: float, *, threads: int = GROUP_THREADS,
                 unroll: int = SPELLS_UNROLL) -> dict:
    """Run-length state of a (steps, points) block: per group the longest run that begins there
    (leading run excluded), and per point the leading run, the open run and its group."""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    nt, npts = x2d.shape
    seg_end, seg_label, sorted_labels = label_segments(labels)
    # with sorted labels every row of best is written; otherwise rows are raised from zero
    out = {"best": (xp.empty if sorted_labels else xp.zeros)((k, npts), dtype=np.int32)}
    state = xp.empty((3, npts), dtype=np.int32)  # every point's are written
    out.update(lead=state[0], tail=state[1], tail_group=state[2])
    outs = (out["best"], out["lead"], out["tail"], out["tail_group"])
    if nt == 0 or k == 0:  # no steps: no runs
        out["best"][...] = 0
        state[:2] = 0
        state[2] = -1
    elif is_cupy(x2d):
        x2d = _raw_input(x2d)
        segs, _ = _device_labels("spells", labels, k)  # ends, then labels, of the stretches
        kernel = _raw("spells", np.dtype(x2d.dtype), int(sorted_labels), threads, unroll)
        kernel((max(1, -(-npts // threads)),), (threads,), (
            x2d, segs[: seg_end.size], segs[seg_end.size :], threshold_for(x2d.dtype, threshold), *outs,
            np.int32(nt), np.int64(npts), np.int32(k)))
    else:
        _cpu("spells")(x2d, seg_end, seg_label, np.float64(threshold), *outs, sorted_labels)
    return out


def group_sum_previous(x2d, labels, k: int, threshold: float = 0.0, mode: int = 0) -> dict:
    """:func:`group_sum` by the previous loops (Numba CUDA on the GPU), for the benchmarks."""
    from ..backend import is_cupy, xp_of

    xp = xp_of(x2d)
    npts = x2d.shape[1]
    sums = xp.zeros((k, npts), dtype=np.float64)
    counts = xp.zeros((k, npts), dtype=np.float64)
    if is_cupy(x2d):
        from .groups_cuda import group_sum as kernel

        _launch(kernel, npts, x2d, xp.asarray(labels), np.float64(threshold), np.int32(mode), sums, counts)
    else:
        _cpu("sum_previous")(x2d, labels, np.float64(threshold), np.int32(mode), sums, counts)
    return {"sum": sums, "count": counts}


def group_spells_previous(x2d, labels, k: int, threshold: float) -> dict:
    """:func:`group_spells` by the previous loops (Numba CUDA on the GPU), for the benchmarks."""
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
        _cpu("spells_previous")(x2d, labels, *args)
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


# --- the names the registry looks up (pipeline.kernels.FAMILIES) ----------------------------------

group_sum_cpu = group_sum_gpu = group_sum
group_spells_cpu = group_spells_gpu = group_spells
group_runs_cpu = group_runs_gpu = group_runs

