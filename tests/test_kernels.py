"""Kernels on one chunk, against NumPy references.

The Numba CUDA kernels run on the GPU where there is one and in Numba's CUDA simulator
elsewhere (tests/conftest.py sets NUMBA_ENABLE_CUDASIM), so their logic is checked on every run.
(The previous kernels, in benchmarks/kernels_previous.py, are tested in tests/test_benchmarks.py.)
"""

from __future__ import annotations

import functools
import sys
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pipeline.kernels import elementwise, launch, rolling

from .conftest import requires_gpu


@functools.cache
def kernels_previous():
    """benchmarks/kernels_previous.py: the previous kernels, a second reference for the current ones."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "kernels_previous.py"
    spec = importlib.util.spec_from_file_location("kernels_previous", path)
    module = importlib.util.module_from_spec(spec)
    # registered before it runs: Numba's disk cache finds a compiled loop's module by its name
    sys.modules["kernels_previous"] = module
    spec.loader.exec_module(module)
    return module


def rolling_reference(x, before, after, min_periods):
    nt = x.shape[0]
    out = np.full(x.shape, np.nan)
    for t in range(nt):
        w = x[max(0, t - before) : t + after + 1].astype(np.float64)
        n = (~np.isnan(w)).sum(axis=0)
        with np.errstate(all="ignore"):
            m = np.nansum(w, axis=0) / n
        out[t] = np.where(n >= max(min_periods, 1), m, np.nan)
    return out


def sample(nt=23, npts=37, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((nt, npts)) * 5 + 280).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:, 3] = np.nan
    return x


@pytest.mark.parametrize("before,after,min_periods", [(0, 0, 1), (6, 0, 7), (3, 3, 2), (1, 2, 1)])
def test_cpu_rolling_kernel_any_axis(before, after, min_periods):
    x = sample().reshape(23, 37, 1)
    for axis in (0, 1):
        block = np.moveaxis(x, 0, axis)
        got = rolling.rolling_mean_cpu(block, axis, before, after, min_periods, np.dtype(np.float32))
        ref = np.moveaxis(rolling_reference(x, before, after, min_periods), 0, axis)
        np.testing.assert_allclose(got, ref, rtol=1e-6, equal_nan=True)


def test_standardize_cpu():
    x = sample()
    mean = np.nanmean(x.astype(np.float64), axis=0, keepdims=True)
    std = np.nanstd(x.astype(np.float64), axis=0, keepdims=True)
    with np.errstate(all="ignore"):
        expected = (x - mean) / std
    got = elementwise.standardize_cpu(x, mean, std, np.dtype(np.float32))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)


def _cf_plan(fills, out_dtype):
    from pipeline.sources.cf import plan

    attrs = {"scale_factor": out_dtype.type(0.01), "add_offset": out_dtype.type(273.15)}
    return plan("x", np.int16, {**attrs, "missing_value": np.array(fills, dtype=np.int16)} if fills else attrs)


@pytest.mark.parametrize("fills", [(), (-32767,), (-32767, 32767)])
def test_cf_decode_cpu(fills):
    raw = np.array([[-32767, 0, 100], [32767, -5, 12000]], dtype=np.int16)
    got = elementwise.cf_decode_cpu(raw, _cf_plan(fills, np.dtype(np.float64)))
    expected = raw * 0.01 + 273.15
    for f in fills:
        expected[raw == f] = np.nan
    np.testing.assert_allclose(got, expected, equal_nan=True)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("fills", [(), (-32767,), (-32767, 32767), (-32767, 32767, 0)])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64])
def test_cf_decode_gpu_matches_cpu(fills, out_dtype):
    import cupy

    rng = np.random.default_rng(0)
    raw = rng.integers(-32767, 32768, size=(64, 33)).astype(np.int16)
    raw[::7] = -32767
    raw[::5, ::3] = 32767
    raw[1, 1] = 0
    dtype = np.dtype(out_dtype)
    plan = _cf_plan(fills, dtype)
    cpu = elementwise.cf_decode_cpu(raw, plan)
    gpu = elementwise.cf_decode_gpu(cupy.asarray(raw), plan)
    assert gpu.dtype == dtype
    np.testing.assert_array_equal(cupy.asnumpy(gpu), cpu)


@pytest.mark.gpu
@requires_gpu
def test_standardize_gpu_matches_cpu():
    import cupy

    x = sample()
    mean = np.nanmean(x.astype(np.float64), axis=0, keepdims=True)
    std = np.nanstd(x.astype(np.float64), axis=0, keepdims=True)
    cpu = elementwise.standardize_cpu(x, mean, std, np.dtype(np.float32))
    gpu = elementwise.standardize_gpu(cupy.asarray(x), cupy.asarray(mean), cupy.asarray(std), np.dtype(np.float32))
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-6, atol=1e-7, equal_nan=True)


@pytest.mark.gpu
@requires_gpu
def test_rolling_gpu_wrapper_matches_cpu():
    import cupy

    x = sample().reshape(23, 37, 1)
    for axis, (b, a, mp) in [(0, (4, 0, 5)), (1, (2, 2, 1))]:
        block = np.moveaxis(x, 0, axis)
        cpu = rolling.rolling_mean_cpu(block, axis, b, a, mp, np.dtype(np.float32))
        gpu = rolling.rolling_mean_gpu(cupy.asarray(block), axis, b, a, mp, np.dtype(np.float32))
        assert isinstance(gpu, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-6, equal_nan=True)


ROLLING_CASES = [(0, 0, 1), (4, 0, 5), (4, 0, 2), (2, 2, 3), (1, 2, 1), (30, 0, 1), (3, 7, 2)]


@pytest.mark.parametrize("before,after,min_periods", ROLLING_CASES)
@pytest.mark.parametrize("tile", [None, 1, 5, 16])
@pytest.mark.parametrize("ring", [True, False])
def test_rolling_twin_of_the_cuda_c_kernel(before, after, min_periods, tile, ring):
    """The CUDA C kernel's loop (ring slots, tiles primed with the window before them, blocks of
    ``threads`` points, one of them partial) against the reference; untiled, bit for bit against
    the CPU kernel (the same additions in the same order)."""
    x = sample(nt=23, npts=37)
    ref = rolling_reference(x, before, after, min_periods)
    got = rolling.rolling_twin(x, before, after, min_periods, np.float32, tile=tile, ring=ring, threads=16)
    np.testing.assert_allclose(got, ref, rtol=1e-6, equal_nan=True)
    if tile is None:
        cpu = rolling.rolling_mean_cpu(x, 0, before, after, min_periods, np.dtype(np.float32))
        np.testing.assert_array_equal(got, cpu)


def test_rolling_twin_short_blocks_and_int_input():
    for nt in (1, 2, 3):
        x = sample(nt=nt, npts=5, seed=nt)
        got = rolling.rolling_twin(x, 2, 1, 1, np.float64, tile=1, threads=4)
        np.testing.assert_allclose(got, rolling_reference(x, 2, 1, 1), rtol=1e-12, equal_nan=True)
    xi = np.arange(60, dtype=np.int16).reshape(12, 5) * 7 - 100
    got = rolling.rolling_twin(xi, 3, 0, 4, np.float64, tile=5, threads=4)
    np.testing.assert_allclose(got, rolling_reference(xi, 3, 0, 4), rtol=1e-12, equal_nan=True)


def test_rolling_plan():
    # a 30-day window of float32 fits the ring; a year does not; few points cut the steps into tiles
    assert rolling.plan(730, 721 * 1440, 29, 0, 4) == (True, 30 * rolling.THREADS * 4, 730)
    assert rolling.plan(730, 721 * 1440, 364, 0, 4)[:2] == (False, 0)
    ring, _, tile = rolling.plan(730, 1000, 6, 0, 4)
    assert ring and 28 <= tile < 730


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("before,after,min_periods", ROLLING_CASES)
def test_rolling_cuda_c_kernel_matches_its_twin(before, after, min_periods):
    import cupy

    x = sample(nt=41, npts=300, seed=5)
    for in_t, out_t in [(np.float32, np.float32), (np.float64, np.float64), (np.int16, np.float64)]:
        xi = np.nan_to_num(x, nan=-1).astype(in_t) if in_t == np.int16 else x.astype(in_t)
        for ring in (True, False):
            for tile in (None, 7):
                want = rolling.rolling_twin(xi, before, after, min_periods, out_t, tile=tile, ring=ring)
                got = cupy.empty(xi.shape, dtype=out_t)
                rolling.launch_raw(cupy.asarray(xi), got, before, after, min_periods, ring=ring, tile=tile or xi.shape[0])
                np.testing.assert_array_equal(cupy.asnumpy(got), want)


# --- group kernels --------------------------------------------------------------------------------

from pipeline.kernels import groups  # noqa: E402


def group_inputs(seed=0):
    x = sample(nt=29, npts=41, seed=seed)
    labels = np.sort(np.random.default_rng(seed).integers(0, 4, size=29)).astype(np.int64)
    labels[5] = 3  # groups need not be consecutive for group_sum
    return x, labels


def spells_reference(above, labels, k):
    """Longest run per group of its first step, whole runs; leading run apart (see the kernel)."""
    best = np.zeros(k, dtype=np.int32)
    run, group, lead, in_lead = 0, -1, 0, True
    for t, a in enumerate(above):
        if a:
            group = labels[t] if run == 0 else group
            run += 1
            if in_lead:
                lead += 1
            else:
                best[group] = max(best[group], run)
        else:
            run, in_lead = 0, False
    return best, lead, run, (group if run else -1)


def sequential_group_sums(x, labels, k):
    """Sums of each group's valid values, added one step after another in time order."""
    sums, counts = np.zeros((k, x.shape[1])), np.zeros((k, x.shape[1]))
    for t, g in enumerate(labels):
        v = x[t].astype(np.float64)
        sums[g] = np.where(np.isnan(v), sums[g], sums[g] + np.nan_to_num(v))
        counts[g] += ~np.isnan(v)
    return sums, counts


def awkward_labels(nt, k, seed):
    """Labels that recur (two "years"), skip a group, and leave the last group empty."""
    rng = np.random.default_rng(seed)
    labels = np.sort(rng.integers(0, k - 1, size=nt))
    labels = np.concatenate([labels[: nt // 2], labels[: nt - nt // 2]])
    labels[labels == 1] = 0
    return labels


@pytest.mark.parametrize("seed", range(4))
def test_group_sum_twin_of_the_cuda_c_kernel(seed):
    x = sample(nt=29 + seed, npts=41, seed=seed)
    labels = awkward_labels(x.shape[0], 5, seed)
    for mode in (0, 1):
        got = groups.group_sum_cpu(x, labels, 5, threshold=280.0, mode=mode)  # the CPU kernel: the twin
        prev = kernels_previous().group_sum_previous_cpu(x, labels, 5, threshold=280.0, mode=mode)
        np.testing.assert_allclose(got["sum"], prev["sum"], rtol=1e-12)
        np.testing.assert_array_equal(got["count"], prev["count"])
    sums, counts = sequential_group_sums(x, labels, 5)
    got = groups.group_sum_cpu(x, labels, 5)
    np.testing.assert_array_equal(got["sum"], sums)  # each group's values in time order, bit for bit
    np.testing.assert_array_equal(got["count"], counts)
    assert (got["sum"][[1, 4]] == 0).all() and (got["count"][[1, 4]] == 0).all()
    empty = groups.group_sum_cpu(x[:0], labels[:0], 3)
    assert (empty["sum"] == 0).all() and empty["sum"].shape == (3, 41)


def test_threshold_for_float32_compares_as_float64():
    """The kernels compare float32 data with a float32 threshold: the largest float32 not above
    the float64 one, which decides every float32 value as the float64 comparison does."""
    rng = np.random.default_rng(0)
    v = np.concatenate([(rng.standard_normal(5000) * 300).astype(np.float32),
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45], np.float32)])
    for threshold in [280.0, 280.1, 0.1, -0.0, 5e-46, 1e40, -1e40, float(np.nextafter(np.float32(3), np.float32(5)))]:
        t = groups.threshold_for(np.float32, threshold)
        with np.errstate(over="ignore"):
            near = np.nextafter(t, np.array([np.inf, -np.inf], np.float32))
        w = np.concatenate([v, near, [t]])
        assert t.dtype == np.float32
        np.testing.assert_array_equal(w > t, w.astype(np.float64) > threshold, err_msg=str(threshold))
    assert groups.threshold_for(np.float64, 0.1) == 0.1


def test_group_order():
    order, ends = groups.group_order(np.array([2, 0, 2, 1, 0]), 4)
    assert order.tolist() == [1, 4, 3, 0, 2] and ends.tolist() == [2, 3, 5, 5]


@pytest.mark.parametrize("seed", range(4))
def test_group_spells_twin_of_the_cuda_c_kernel(seed):
    x = sample(nt=37, npts=41, seed=seed)
    x[:, 7] = 400  # one run over the whole block
    x[::3, 8] = 400  # short runs
    for labels in (np.sort(awkward_labels(37, 4, seed)), awkward_labels(37, 4, seed)):
        got = groups.group_spells_cpu(x, labels, 4, 280.0)  # the CPU kernel: the twin
        prev = kernels_previous().group_spells_previous_cpu(x, labels, 4, 280.0)
        for name in got:
            np.testing.assert_array_equal(got[name], prev[name], err_msg=name)
        for p in range(x.shape[1]):
            b, ld, t, tg = spells_reference(x[:, p] > 280.0, labels, 4)
            np.testing.assert_array_equal(got["best"][:, p], b)
            assert (got["lead"][p], got["tail"][p], got["tail_group"][p]) == (ld, t, tg)


def runs_and_stretches(nt, npts, k, seed):
    """Runs from one step to the whole block, over stretches of 1 to 5 steps whose labels come
    back in any order: runs carried across several stretches, ending in a stretch of their own
    label or of another."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(rng.integers(0, k, size=nt), rng.integers(1, 6, size=nt))[:nt]
    p_above = np.linspace(0.2, 0.99, npts)
    x = np.where(rng.random((nt, npts)) < p_above, 400.0, 200.0)
    x[:, 0], x[:, 1] = 400.0, 200.0  # above, or below, throughout
    x[rng.random((nt, npts)) < 0.02] = np.nan  # NaN is not above
    return x, labels


@pytest.mark.parametrize("seed", range(6))
def test_group_spells_twin_carried_runs(seed):
    x, labels = runs_and_stretches(61, 80, 5, seed)
    for lab in (labels, np.sort(labels)):
        got = groups.group_spells_cpu(x, lab, 5, 280.0)
        for p in range(x.shape[1]):
            b, ld, t, tg = spells_reference(x[:, p] > 280.0, lab, 5)
            np.testing.assert_array_equal(got["best"][:, p], b, err_msg=f"point {p}")
            assert (got["lead"][p], got["tail"][p], got["tail_group"][p]) == (ld, t, tg), p


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("threads,unroll", [(256, 8), (256, 4), (128, 4), (64, 3)])
def test_group_spells_kernel_carried_runs(threads, unroll):
    import cupy

    # lengths below one batch, of whole batches, and with a remainder, for the batch loaded ahead
    for seed, nt in enumerate((2, 3, 16, 24, 61, 62, 63, 64)):
        x, labels = runs_and_stretches(nt, 300, 5, seed)
        for lab in (labels, np.sort(labels)):
            cpu = groups.group_spells_cpu(x, lab, 5, 280.0)
            gpu = groups.group_spells_gpu(cupy.asarray(x), lab, 5, 280.0, threads=threads, unroll=unroll)
            for f in cpu:
                np.testing.assert_array_equal(cupy.asnumpy(gpu[f]), cpu[f], err_msg=f)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_group_cuda_c_kernels_match_their_twins(dtype):
    import cupy

    x = sample(nt=43, npts=300, seed=7)
    x = np.nan_to_num(x, nan=0).astype(dtype) if dtype == np.int16 else x.astype(dtype)
    for labels in (np.sort(awkward_labels(43, 5, 1)), awkward_labels(43, 5, 2)):
        for mode in (0, 1):
            cpu = groups.group_sum_cpu(x, labels, 5, threshold=280.0, mode=mode)
            gpu = groups.group_sum_gpu(cupy.asarray(x), labels, 5, threshold=280.0, mode=mode)
            for f in cpu:
                np.testing.assert_array_equal(cupy.asnumpy(gpu[f]), cpu[f], err_msg=f)
        cpu = groups.group_spells_cpu(x, labels, 5, 280.0)
        gpu = groups.group_spells_gpu(cupy.asarray(x), labels, 5, 280.0)
        for f in cpu:
            np.testing.assert_array_equal(cupy.asnumpy(gpu[f]), cpu[f], err_msg=f)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("unroll", [8, 4])
def test_group_sum_kernel_lengths(unroll):
    """Lengths below one batch of loads, of whole batches, and with a remainder: the batch loaded
    ahead is used exactly when it exists."""
    import cupy

    for nt in (1, 3, 4, 8, 12, 16, 17, 23, 24):
        x = sample(nt=nt, npts=300, seed=nt)
        labels = awkward_labels(nt, 5, nt)
        for mode in (0, 1):
            cpu = groups.group_sum_cpu(x, labels, 5, threshold=280.0, mode=mode)
            gpu = groups.group_sum_gpu(cupy.asarray(x), labels, 5, threshold=280.0, mode=mode, unroll=unroll)
            for f in cpu:
                np.testing.assert_array_equal(cupy.asnumpy(gpu[f]), cpu[f], err_msg=f"{f}, {nt} steps")


def test_subtract_groups_cpu():
    x, labels = group_inputs()
    values = np.random.default_rng(2).standard_normal((4, x.shape[1]))
    got = groups.subtract_groups_cpu(x, labels, values, np.dtype(np.float32))
    np.testing.assert_allclose(got, (x - values[labels]).astype(np.float32), rtol=1e-6, equal_nan=True)


@pytest.mark.gpu
@requires_gpu
def test_group_kernels_gpu_match_cpu():
    import cupy

    x, labels = group_inputs()
    for mode in (0, 1):
        cpu = groups.group_sum_cpu(x, labels, 4, threshold=280.0, mode=mode)
        gpu = groups.group_sum_gpu(cupy.asarray(x), labels, 4, threshold=280.0, mode=mode)
        for f in cpu:
            np.testing.assert_allclose(cupy.asnumpy(gpu[f]), cpu[f], rtol=1e-12)
    cpu = groups.group_spells_cpu(x, np.sort(labels), 4, 280.0)
    gpu = groups.group_spells_gpu(cupy.asarray(x), np.sort(labels), 4, 280.0)
    for f in cpu:
        np.testing.assert_array_equal(cupy.asnumpy(gpu[f]), cpu[f])
    values = np.random.default_rng(2).standard_normal((4, x.shape[1]))
    got = groups.subtract_groups_gpu(cupy.asarray(x), labels, cupy.asarray(values), np.dtype(np.float32))
    np.testing.assert_array_equal(cupy.asnumpy(got), groups.subtract_groups_cpu(x, labels, values, np.dtype(np.float32)))


# --- moments ---------------------------------------------------------------------------------------

from pipeline.kernels import moments  # noqa: E402
from pipeline.kernels import weighted  # noqa: E402


def test_moments_cpu_any_axes():
    x = sample(nt=31, npts=40, seed=4).reshape(31, 8, 5)
    x[:, 1] = np.nan  # no valid value
    x64, valid = x.astype(np.float64), ~np.isnan(x)
    for axis in (0, 2, (0, 2), (1, 2)):
        got = moments.moments_cpu(x, axis)
        ax = (axis,) if isinstance(axis, int) else axis
        n = valid.sum(axis=ax, keepdims=True)
        mean = np.where(valid, x64, 0).sum(axis=ax, keepdims=True) / np.maximum(n, 1)
        np.testing.assert_array_equal(got["n"], n)
        np.testing.assert_allclose(got["mean"], mean, rtol=1e-12)
        np.testing.assert_allclose(got["m2"], (np.where(valid, x64 - mean, 0) ** 2).sum(axis=ax, keepdims=True), rtol=1e-9)


@pytest.mark.gpu
@requires_gpu
def test_gpu_partials_match_cpu_partials():
    import cupy

    x = sample(nt=31, npts=40, seed=4).reshape(31, 8, 5)
    for axis in (0, 2, (0, 2)):
        cpu, gpu = moments.moments_cpu(x, axis), moments.moments_gpu(cupy.asarray(x), axis)
        for k in cpu:
            np.testing.assert_allclose(cupy.asnumpy(gpu[k]), cpu[k], rtol=1e-9, atol=1e-9)
    w1 = np.linspace(0.1, 1, 8)[None, :, None]
    w = np.broadcast_to(w1, x.shape)
    cpu = weighted.weighted_sums_cpu(x, w, (1, 2))
    fast = weighted.weighted_sums_gpu(cupy.asarray(x), cupy.broadcast_to(cupy.asarray(w1), x.shape), (1, 2))  # two-stage kernel
    general = weighted.weighted_sums_gpu(cupy.asarray(x), cupy.asarray(w), (1, 2))  # weights not broadcast: ReductionKernel
    for gpu in (fast, general):
        for k in cpu:
            np.testing.assert_allclose(cupy.asnumpy(gpu[k]), cpu[k], rtol=1e-12)


@pytest.mark.cudasim
def test_cuda_group_runs_kernel():
    x, labels = group_inputs(seed=2)
    labels = np.sort(labels)
    npts = x.shape[1]
    gpu = {f: np.zeros((4, npts), np.int32) for f in ("length", "prefix", "current", "longest")}
    launch.launch_numba(groups.runs_kernel(), npts, x, labels, np.float64(280.0), *gpu.values())
    cpu = groups.group_runs_cpu(x, labels, 4, 280.0)
    for f in gpu:
        np.testing.assert_array_equal(gpu[f], cpu[f], err_msg=f)
    for p in range(npts):
        for g in range(4):
            above = x[labels == g, p] > 280.0
            longest = run = 0
            for a in above:
                run = run + 1 if a else 0
                longest = max(longest, run)
            assert cpu["longest"][g, p] == longest
            assert cpu["length"][g, p] == above.size


# --- weighted sums: the tiled kernel's twin ------------------------------------------------------------


@pytest.mark.parametrize("rows,npts,threads,unroll", [(1, 4, 32, 1), (3, 37, 32, 2), (5, 2049, 256, 8), (2, 5000, 64, 4)])
def test_weighted_partials_twin(rows, npts, threads, unroll):
    x = sample(nt=rows, npts=max(npts, 4), seed=npts)[:, :npts]
    w = np.linspace(0.1, 1, npts)
    part = weighted.weighted_partials_twin(x, w, threads, unroll)
    assert part.shape == (rows, 2, -(-npts // (threads * unroll)))
    valid = ~np.isnan(x)
    np.testing.assert_allclose(part[:, 0].sum(-1), np.where(valid, x.astype(np.float64) * w, 0).sum(1), rtol=1e-12)
    np.testing.assert_allclose(part[:, 1].sum(-1), np.where(valid, w, 0).sum(1), rtol=1e-12)


@pytest.mark.gpu
@requires_gpu
def test_weighted_partials_gpu_match_the_twin():
    import cupy

    for rows, npts in [(1, 5), (33, 2049), (70, 4099)]:
        x = sample(nt=rows, npts=npts, seed=rows)
        w = np.linspace(0.1, 1, npts)
        for dtype in (np.float32, np.float64):
            got = weighted.weighted_partials_gpu(cupy.asarray(x.astype(dtype)), cupy.asarray(w))
            np.testing.assert_array_equal(cupy.asnumpy(got), weighted.weighted_partials_twin(x.astype(dtype), w))


@pytest.mark.gpu
@requires_gpu
def test_weighted_partials_gpu_read_a_grid_of_weights_in_place():
    """cos(lat) weights as a (lat, lon) view with zero strides along lon, and a transposed grid:
    read in place, the same sums as their contiguous copy."""
    import cupy

    nlat, nlon = 37, 70
    x = sample(nt=9, npts=nlat * nlon, seed=3)
    coslat = np.cos(np.deg2rad(np.linspace(-90, 90, nlat)))
    grids = [
        cupy.broadcast_to(cupy.asarray(coslat)[:, None], (nlat, nlon)),
        cupy.asarray(np.random.default_rng(0).uniform(0.1, 1, (nlon, nlat))).T,
    ]
    for grid in grids:
        assert not grid.flags.c_contiguous
        got = weighted.weighted_partials_gpu(cupy.asarray(x), grid)
        np.testing.assert_array_equal(cupy.asnumpy(got), weighted.weighted_partials_twin(x, cupy.asnumpy(grid).ravel()))
        wx, ws = weighted.weighted_rows_gpu(cupy.asarray(x), grid)
        valid = ~np.isnan(x)
        w = cupy.asnumpy(grid).ravel()
        np.testing.assert_allclose(wx, np.where(valid, x * w, 0).sum(1), rtol=1e-12)
        np.testing.assert_allclose(ws, np.where(valid, w, 0).sum(1), rtol=1e-12)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("k", [1, 2, 5])
def test_moment_partials_merge_on_the_gpu_as_the_formula(k):
    """The merge and the mean/std of moment partials by the CUDA C kernels equal NumPy's formulas
    bit for bit: points with no value, one part with values, and parts of unequal counts."""
    import cupy

    from pipeline.kernels import moments

    rng = np.random.default_rng(k)
    shape = (k, 6, 7)
    n = rng.integers(0, 5, shape).astype(np.float64)
    n[:, 0, 0] = 0  # no value anywhere
    n[1:, 1, 1] = 0  # values in one part only
    p = {"n": n, "mean": np.where(n > 0, rng.normal(280, 20, shape), 0.0), "m2": np.where(n > 1, rng.uniform(0, 50, shape), 0.0)}
    want = moments.moments_merge_cpu(p, (0,))
    got = moments.moments_merge_gpu({f: cupy.asarray(v) for f, v in p.items()}, (0,))
    for f in ("n", "mean", "m2"):
        assert isinstance(got[f], cupy.ndarray) and got[f].shape == (1, 6, 7)
        np.testing.assert_array_equal(cupy.asnumpy(got[f]), want[f])
    stats = moments.mean_std_gpu(got, 0)
    np.testing.assert_array_equal(cupy.asnumpy(stats), moments.mean_std_cpu(want, 0))
    assert np.isnan(cupy.asnumpy(stats)[:, 0, 0]).all()
    # against float64 NumPy from the counts: the merge is Chan's formula, not an approximation
    total = n.sum(0)
    mean = (n * p["mean"]).sum(0) / np.where(total > 0, total, 1)
    np.testing.assert_allclose(want["mean"][0][total > 0], mean[total > 0], rtol=1e-14)


@pytest.mark.gpu
@requires_gpu
def test_concatenate_on_the_gpu_copies_bytes_into_place():
    import cupy

    from pipeline.kernels.copies import concatenate

    parts = [cupy.arange(k * 12, dtype=np.float64).reshape(k, 3, 4) + 100 * k for k in (1, 3, 2)]
    np.testing.assert_array_equal(cupy.asnumpy(concatenate(parts, 0, cupy)), cupy.asnumpy(cupy.concatenate(parts, 0)))
    lead = [p[None] for p in parts]  # an axis of length 1 before the one concatenated
    np.testing.assert_array_equal(cupy.asnumpy(concatenate(lead, 1, cupy)), cupy.asnumpy(cupy.concatenate(lead, 1)))
    columns = [cupy.arange(5 * k * 2, dtype=np.int8).reshape(5, k, 2) - k for k in (4, 1, 3)]  # rows at two pitches
    np.testing.assert_array_equal(cupy.asnumpy(concatenate(columns, 1, cupy)), cupy.asnumpy(cupy.concatenate(columns, 1)))
    np.testing.assert_array_equal(cupy.asnumpy(concatenate(columns, -1 - 1, cupy)), cupy.asnumpy(cupy.concatenate(columns, 1)))
    one = concatenate(parts[:1], 0, cupy)
    assert one is not parts[0]
    np.testing.assert_array_equal(cupy.asnumpy(one), cupy.asnumpy(parts[0]))
    across = [p[:, :2] for p in parts]  # not contiguous: by rows
    np.testing.assert_array_equal(cupy.asnumpy(concatenate(across, 0, cupy)), cupy.asnumpy(cupy.concatenate(across, 0)))


@pytest.mark.gpu
@requires_gpu
def test_dask_joins_cupy_blocks_by_copies():
    """Once GPU work begins, dask concatenates CuPy blocks (a computed result of several blocks,
    chunked along one axis or two) with pipeline's copies, and the values are NumPy's."""
    import cupy
    import dask.array as da
    from dask.array.dispatch import concatenate_lookup

    from pipeline.kernels import copies

    copies.prepare_cupy()
    assert concatenate_lookup.dispatch(cupy.ndarray).__name__ == "concatenate_blocks"
    x = np.random.default_rng(1).integers(-1, 3, (50, 31, 2)).astype(np.int8)
    for chunks in ((7, 31, 2), (7, 10, 2), (50, 4, 1)):
        d = da.from_array(x, chunks=chunks).map_blocks(cupy.asarray)
        got = d.compute(scheduler="threads")
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(got), x)

    from pipeline.exec.compute import compute

    lone = cupy.arange(12, dtype=np.float64).reshape(3, 4)
    got = compute([da.from_array(lone, chunks=-1, asarray=False), da.from_array(cupy.asarray(x), chunks=(9, 31, 2))])
    assert got[0] is not lone and isinstance(got[0], cupy.ndarray)  # the graph's buffer is not handed out
    np.testing.assert_array_equal(cupy.asnumpy(got[0]), cupy.asnumpy(lone))
    np.testing.assert_array_equal(cupy.asnumpy(got[1]), x)


# --- detrend: the Numba CUDA kernels against the CPU formulas --------------------------------------------

from pipeline.kernels import fields as field_kernels  # noqa: E402
from pipeline.kernels import trend  # noqa: E402


def trend_sample():
    x = sample(nt=23, npts=37, seed=5)
    x[3:, 6] = np.nan  # at most three valid samples
    x[1:, 9] = np.nan  # one valid sample: no line through it
    return x, np.linspace(-1, 1, 23)


@pytest.mark.cudasim
@pytest.mark.parametrize("deg", [0, 1, 2, 3])
def test_cuda_trend_kernels(deg):
    x, u = trend_sample()
    kernels = trend.trend_kernels(deg)
    blocks = (2, 32)  # 64 threads for 37 points: a partial block
    ref = trend.detrend_block_cpu(x, u[:, None], axis=0, deg=deg, out_dtype=np.float64)
    out = np.empty(x.shape)
    kernels["detrend"][blocks](x, u, out)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-9, equal_nan=True)
    assert np.isnan(out[:, 9]).all() == (deg >= 1)

    s, b = np.empty((2 * deg + 1, 37)), np.empty((deg + 1, 37))
    kernels["sums"][blocks](x, u, s, b)
    partial = trend.polyfit_cpu(x, np.broadcast_to(u[:, None], x.shape), (0,), deg)
    for k in range(2 * deg + 1):
        np.testing.assert_allclose(s[k], partial[f"s{k}"][0], rtol=1e-12)
    for k in range(deg + 1):
        np.testing.assert_allclose(b[k], partial[f"t{k}"][0], rtol=1e-12)

    c = trend.polyfit_finalize(partial, 0, deg)
    out32 = np.empty(x.shape, dtype=np.float32)
    kernels["subtract"][blocks](x, u, np.ascontiguousarray(c), out32)
    coefs = [c[k : k + 1] for k in range(deg + 1)]
    expected = trend.polyval_subtract_cpu(x, u[:, None], *coefs, out_dtype=np.float32)
    np.testing.assert_array_equal(out32, expected)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("axis", [0, 1])
def test_detrend_gpu_kernels_match_cpu(axis):
    import cupy

    x, u = trend_sample()
    x3 = np.moveaxis(x.reshape(23, 37, 1), 0, axis)
    uu = np.moveaxis(u.reshape(23, 1, 1), 0, axis)
    for deg in (0, 1, 2):
        cpu = trend.detrend_block_cpu(x3, uu, axis=axis, deg=deg, out_dtype=np.float32)
        gpu = trend.detrend_block_gpu(cupy.asarray(x3), cupy.asarray(uu), axis=axis, deg=deg, out_dtype=np.float32)
        np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-5, atol=1e-4, equal_nan=True)
        ub = np.broadcast_to(uu, x3.shape)
        cpu_p = trend.polyfit_cpu(x3, ub, (axis,), deg)
        gpu_p = trend.polyfit_gpu(cupy.asarray(x3), cupy.asarray(ub), (axis,), deg)
        for k in cpu_p:
            np.testing.assert_allclose(cupy.asnumpy(gpu_p[k]), cpu_p[k], rtol=1e-12, err_msg=k)


# --- streaming kernels: their CUDA sources compile ---------------------------------------------------

import shutil  # noqa: E402
import subprocess  # noqa: E402

from pipeline.kernels.launch import Spec  # noqa: E402

STREAMING = [
    (elementwise.STANDARDIZE, np.float32, np.float32),
    (elementwise.STANDARDIZE, np.float64, np.float64),
    (elementwise.cf_spec(_cf_plan((-32767, 32767), np.dtype(np.float32)), np.dtype(np.int16)), np.int16, np.float32),
    (elementwise.cf_spec(_cf_plan((), np.dtype(np.float64)), np.dtype(np.int16)), np.int16, np.float64),
    (groups.SUBTRACT_GROUPS, np.float32, np.float32),
    *[(spec, np.float32, np.float32) for spec in field_kernels.SVP.values()],
]

RAW_SOURCES = {
    "rolling_ring_f32": rolling.source(np.float32, np.float32, True),
    "rolling_reread_f32": rolling.source(np.float32, np.float32, False),
    "rolling_ring_i16_f64": rolling.source(np.int16, np.float64, True),
    "group_sum_f32": groups.sum_source(np.float32, 0),
    "count_above_f64": groups.sum_source(np.float64, 1),
    "group_spells_sorted_f32": groups.spells_source(np.float32, True),
    "group_spells_any_f32": groups.spells_source(np.float32, False),
    "group_spells_any_i16": groups.spells_source(np.int16, False),
    "weighted_tiled_f32": weighted.tiled_source(np.float32),
    "weighted_tiled_f64": weighted.tiled_source(np.float64),
    "moments_f32": moments.source(np.float32),
    "moments_f64_256x2": moments.source(np.float64, 256, 2),
    "detrend_f32_deg1_p16": trend.source(np.float32, np.float32, 1, 16),
    "detrend_f32_deg1_p64_c5": trend.source(np.float32, np.float32, 1, 64, 256, 5),
    "detrend_f64_deg3_p32_c8": trend.source(np.float64, np.float64, 3, 32, 256, 8),
    "detrend_f64_deg2_p16": trend.source(np.float64, np.float64, 2, 16),
    "detrend_f32_f64_deg0_p8": trend.source(np.float32, np.float64, 0, 8, 128),
}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("name", sorted(RAW_SOURCES))
def test_raw_kernel_sources_compile(tmp_path, name):
    src = tmp_path / f"{name}.cu"
    src.write_text(RAW_SOURCES[name])
    r = subprocess.run(
        ["nvcc", "-c", "-arch=sm_90", "--fmad=false", "-std=c++17", str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("spec,in_t,out_t", STREAMING, ids=lambda v: getattr(v, "name", getattr(v, "__name__", str(v))))
def test_streaming_kernel_sources_compile(tmp_path, spec: Spec, in_t, out_t):
    """What runs on the GPU compiles, checked on machines with the CUDA compiler but no GPU."""
    src = tmp_path / f"{spec.name}.cu"
    src.write_text(spec.source(in_t, out_t))
    r = subprocess.run(
        ["nvcc", "-c", "-arch=sm_90", "--fmad=false", "-std=c++17", str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr


# --- the disk cache's keys of kernels built by factories -------------------------------------------

OFFSET = 2  # a constant a cached function names


def _offset(x):
    return x + OFFSET


def _make(k, inner):
    def kernel(x):
        return inner(x) + k

    return kernel


class _Codegen:
    def magic_tuple(self):
        return ("target", "cpu", "")


def _key(fn):
    return launch._cpu_cache()(fn)._index_key(("int64",), _Codegen())


def test_cache_keys_follow_code_closure_and_constants(monkeypatch, tmp_path):
    """A kernel built twice by its factory (its compiled inner function a new object each time)
    has one key, as a later process builds it; another constant in the closure, or another value
    of a global constant that a function in it names, gives another key."""
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    first = _key(_make(1, numba.njit(_offset)))
    assert _key(_make(1, numba.njit(_offset))) == first
    assert _key(_make(3, numba.njit(_offset))) != first
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 5)
    assert _key(_make(1, numba.njit(_offset))) != first


def test_cache_entries_of_one_function_never_share_a_file(tmp_path):
    """Two processes that save two entries of one function's cache at once, each having read the
    index before the other wrote it (two specializations of a factory's kernel, compiled by two
    workers): each entry's data file is its key's own, so loading a key gives its own code or
    nothing, never the other's (Numba numbers the files by the index it read: both took file 1,
    and the index could send one key to the other's code). An index entry that names a numbered
    file, as Numba wrote it, is a miss."""
    from numba.core.caching import IndexDataCacheFile

    files = launch._keyed_files(IndexDataCacheFile)

    def process():
        return files(str(tmp_path), "kernel-1.py312", ("stamp", 1))

    for first, second in ((("a",), ("b",)), (("c",), ("d",))):
        p, q = process(), process()
        q._load_index = lambda: {}  # q read the index before p wrote its entry
        p.save(first, {"code": first})
        q.save(second, {"code": second})
        reader = process()
        assert reader.load(first) in (None, {"code": first})
        assert reader.load(second) == {"code": second}
    assert process()._keyed_name(("a",)) != process()._keyed_name(("b",))
    numbered = process()
    numbered._save_data("kernel-1.py312.1.nbc", {"code": ("e",)})
    numbered._save_index({("f",): "kernel-1.py312.1.nbc"})
    assert process().load(("f",)) is None
    assert launch._cpu_cache()(_offset)._cache_file.__class__.__name__ == "KeyedIndexDataCacheFile"
    assert launch.cpu_loop(_offset)._cache._cache_file.__class__.__name__ == "KeyedIndexDataCacheFile"


@pytest.mark.gpu
def test_numba_cuda_kernels_cache_entries_by_key_too():
    """numba-cuda's cache of a kernel takes the same files (its IndexDataCacheFile is Numba's)."""
    pytest.importorskip("numba.cuda")
    assert launch._cuda_cache()(_offset)._cache_file.__class__.__name__.startswith("Keyed")


# --- numba.cuda loaded in the background when a graph that runs its kernels is built ----------------


def test_numba_cuda_families_are_those_with_numba_cuda_kernels():
    from pipeline import kernels

    root = Path(kernels.__file__).parent
    users = {f.stem for f in root.glob("*.py") if "@launch.cuda_kernel" in f.read_text()}
    # the genotypes family is left out: CUDA C counts the calls of VCF Zarr as bio2zarr writes them
    # (its generic per-variant and per-sample kernels import numba.cuda at their first launch)
    assert users == kernels.NUMBA_CUDA_FAMILIES | {"genotypes"}
    assert "genotypes" not in kernels.NUMBA_CUDA_FAMILIES and "alternate" not in kernels.NUMBA_CUDA_FAMILIES


def test_only_asking_for_a_numba_cuda_kernel_to_run_prepares_numba_cuda(monkeypatch):
    """An op building its graph on the GPU (``kernels.get``) starts loading numba.cuda; listing
    backends, checking for a kernel, the memory plan and the CPU do not."""
    from pipeline import kernels

    prepared = []
    monkeypatch.setattr(launch, "prepare_numba_cuda", lambda: prepared.append(1))
    kernels.has("variant_call_counts", "gpu")
    kernels.work_slabs("gpu")
    kernels.get("variant_call_counts", "cpu")
    kernels.get("moments", "gpu")  # CUDA C
    kernels.get("variant_call_counts", "gpu")  # CUDA C for int8 diploid biallelic calls
    kernels.get("call_allele_counts", "gpu")  # CUDA C (cuda/calls.cu)
    kernels.get("alternate_allele_count", "gpu")
    assert prepared == []
    kernels.get("polyfit", "gpu")
    kernels.get("group_sum", "gpu")
    assert prepared == [1, 1]


def test_no_preparing_under_the_simulator(monkeypatch):
    started = []
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setattr(launch, "_start_preparing", lambda: started.append(1))
    launch.prepare_numba_cuda()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    launch.prepare_numba_cuda()
    assert started == [1]


@pytest.mark.gpu
@requires_gpu
def test_numba_cuda_prepared_in_the_background():
    """The background preparation imports numba.cuda and loads its registries, and a kernel launched
    meanwhile from other threads waits for it and gives the CPU's counts."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import cupy

    from pipeline.kernels import genotypes

    launch.prepare_numba_cuda()
    g = np.random.default_rng(1).integers(-1, 3, (257, 33, 2)).astype(np.int8)
    d = cupy.asarray(g)
    with ThreadPoolExecutor(4) as pool:  # three alleles: the generic (Numba CUDA) kernel
        results = list(pool.map(lambda _: genotypes.variant_call_counts_gpu(d, 3).get(), range(4)))
    for r in results:
        np.testing.assert_array_equal(r, genotypes.variant_call_counts_cpu(g, 3))
    preparing = [t for t in threading.enumerate() if t.name == "pipeline-numba-cuda"]
    for t in preparing:
        t.join(60)
    assert "numba.cuda" in sys.modules and not any(t.is_alive() for t in preparing)


# --- CuPy's own compilations, once each however many threads ask ---------------------------------


def test_equal_compilations_run_one_at_a_time_others_beside():
    """Calls of a shared compiling function with equal arguments never overlap; calls with other
    arguments do; each is counted in compile_seconds; wrapping twice changes nothing."""
    import threading
    import time
    import types

    running, most, overlap_other = {}, {}, []
    lock = threading.Lock()

    def compile_(source, options=()):
        with lock:
            running[source] = running.get(source, 0) + 1
            most[source] = max(most.get(source, 0), running[source])
            if len([k for k, v in running.items() if v]) > 1:
                overlap_other.append(source)
        time.sleep(0.05)
        with lock:
            running[source] -= 1
        return f"module of {source}"

    fake = types.SimpleNamespace(_compile=compile_)
    assert launch.share_compiles(fake, "_compile") and launch.share_compiles(fake, "_compile")
    before = launch.compile_seconds()
    results = []
    threads = [threading.Thread(target=lambda s=s: results.append(fake._compile(s, options=("-O3",))))
               for s in ["a"] * 4 + ["b"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["module of a"] * 4 + ["module of b"] * 4
    assert most == {"a": 1, "b": 1} and overlap_other  # a and b compiled beside each other
    assert launch.compile_seconds() - before >= 8 * 0.05 * 0.9
    assert not launch.share_compiles(types.SimpleNamespace(), "_compile")


_ONE_COMPILE = """
import sys, threading
import cupy as cp
import cupy.cuda.compiler as cc
import pipeline
pipeline.open_dataset(sys.argv[1], backend="gpu")  # where GPU work begins: CuPy's compilations shared
xs = {t: cp.arange(1000, dtype=t) for t in (cp.int16, cp.int32)}
calls = []
inner = cc._compile_using_nvrtc_no_warning
cc._compile_using_nvrtc_no_warning = lambda *a, **k: calls.append(1) or inner(*a, **k)
work = lambda x: int(((x * 3) % 7).sum())
one = work(xs[cp.int32])  # alone: the kernels these operations need, once each
alone = len(calls)
barrier = threading.Barrier(8)
out = []
def each():
    barrier.wait()
    out.append(work(xs[cp.int16]))
ts = [threading.Thread(target=each) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(alone, len(calls) - alone, len(set(out)), out[0], one)
"""


@requires_gpu
@pytest.mark.gpu
def test_cupy_compiles_once_for_eight_threads(tmp_path):
    """In a new process with an empty kernel cache, once a store is opened on the GPU, 8 threads
    asking CuPy for the same new kernels at once compile as many as one thread alone does for the same operations on another
    dtype (NVRTC runs once a kernel), with the right result."""
    import os
    import subprocess

    import xarray as xr

    store = tmp_path / "tiny.zarr"
    xr.Dataset({"tas": (("time", "x"), np.ones((4, 3), "f4"))}).to_zarr(store, zarr_format=3)
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy")}
    r = subprocess.run([sys.executable, "-c", _ONE_COMPILE, str(store)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    alone, threaded, distinct, value, one = map(int, r.stdout.split())
    assert distinct == 1 and value == one == int(((np.arange(1000) * 3) % 7).sum())
    assert alone >= 1 and threaded == alone  # once each, not once a thread


@pytest.mark.gpu
@requires_gpu
def test_copy_into_puts_cut_chunks_in_place():
    """A chunk cut by the array's edge copied into its place in a block (rows of bytes at two
    pitches), and layouts the copy engine does not take, equal NumPy's assignment."""
    import cupy

    from pipeline.kernels.copies import copy_into

    rng = np.random.default_rng(2)
    cases = [
        ((6, 25, 2), (slice(0, 4), slice(20, 25)), (4, 10, 2), np.int8),  # variants x samples x ploidy
        ((9, 7, 11), (slice(3, 9), slice(0, 7)), (6, 7, 11), np.float32),  # whole rows: one run
        ((5, 8), (slice(0, 5), slice(2, 3)), (5, 4), np.float64),  # one column: the strided kernel
    ]
    for shape, place, chunk_shape, dtype in cases:
        out = rng.integers(-2, 100, shape).astype(dtype)
        chunk = rng.integers(-2, 100, chunk_shape).astype(dtype)
        cut = tuple(slice(0, sl.stop - sl.start) for sl in place)
        want = out.copy()
        want[place] = chunk[cut]
        got = cupy.asarray(out)
        copy_into(got[place], cupy.asarray(chunk)[cut])
        np.testing.assert_array_equal(cupy.asnumpy(got), want)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.float32, np.float64, np.complex128, np.bool_])
def test_strided_copies_equal_numpy(dtype):
    """``pipeline_copy_strided``: transposed, reversed, stepped and broadcast sources, strided
    destinations, and a layout of more dimensions than the kernel takes (CuPy's copy), each equal
    to NumPy's; ``copy_of`` and ``to_host`` give C-contiguous copies."""
    import cupy

    from pipeline.kernels.copies import copy_into, copy_of, to_host

    rng = np.random.default_rng(5)
    base = (rng.normal(0, 50, (6, 10, 12, 4)) * (1 + 1j if np.dtype(dtype).kind == "c" else 1)).astype(dtype)
    g = cupy.asarray(base)
    views = [
        lambda a: a.transpose(2, 0, 3, 1),
        lambda a: a[::-1, :, ::2],
        lambda a: a[1:5, 3:9, 1:11:3, 1:3],
        lambda a: a[:, 0].T,
        lambda a: a[2, :, :, 0],
        lambda a: cupy.broadcast_to(a[:1, :1], (3, 10, 12, 4)) if isinstance(a, cupy.ndarray) else np.broadcast_to(a[:1, :1], (3, 10, 12, 4)),
        lambda a: a.reshape(6, 10, 3, 4, 4)[:, ::3, :, ::2, 1:],  # five dimensions: CuPy's copy
    ]
    for view in views:
        want = np.ascontiguousarray(view(base))
        got = copy_of(view(g))
        assert got.flags.c_contiguous and got.dtype == want.dtype
        np.testing.assert_array_equal(cupy.asnumpy(got), want)
        np.testing.assert_array_equal(to_host(view(g)), want)
        dst = cupy.zeros((want.shape[0] * 2,) + want.shape[1:], dtype=dtype)[::2]  # a strided destination
        copy_into(dst, view(g))
        np.testing.assert_array_equal(cupy.asnumpy(dst), want)
    assert to_host(g[:0]).shape == (0, 10, 12, 4)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.float32, np.float64, np.bool_])
def test_take_on_the_gpu_equals_numpy(dtype):
    """The kernel ``take``: every axis, repeated and negative indexes, an empty selection, strided
    blocks and widths that are not a multiple of a wide word; out-of-bounds indexes refused."""
    import cupy

    from pipeline.kernels import get

    take = get("take", "gpu")
    rng = np.random.default_rng(6)
    base = rng.integers(-3, 100, (7, 9, 5)).astype(dtype)
    for view in (lambda a: a, lambda a: a[:, ::2], lambda a: a.transpose(1, 2, 0)):
        block, g = view(base), view(cupy.asarray(base))
        for axis in range(3):
            n = block.shape[axis]
            for index in (np.array([0, n - 1, 1, 1, -1, -n]), np.arange(n)[::-1], np.zeros(0, dtype=np.int64), np.array([2], dtype=np.uint8)):
                got = take(g, index, axis)
                np.testing.assert_array_equal(cupy.asnumpy(got), np.take(block, index, axis=axis))
                np.testing.assert_array_equal(get("take", "cpu")(block, index, axis), np.take(block, index, axis=axis))
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 7"):
        take(cupy.asarray(base), np.array([7]), 0)


@pytest.mark.gpu
@requires_gpu
def test_dask_gathers_cupy_blocks_by_the_take_kernel():
    """An ``isel`` by an index array on CuPy blocks (dask's shuffle: its gathers, joins and
    ``take``, all pipeline's once GPU work began) equals NumPy's, along either axis."""
    import cupy
    import dask.array as da
    from dask.array.dispatch import take_lookup

    from pipeline.kernels import copies

    from dask.array import _shuffle

    copies.prepare_cupy()
    assert take_lookup.dispatch(cupy.ndarray).__name__ == "take_blocks"
    assert _shuffle._getitem is copies.shuffle_getitem
    x = np.random.default_rng(3).integers(-1, 3, (50, 31, 2)).astype(np.int8)
    d = da.from_array(x, chunks=(7, 10, 2)).map_blocks(cupy.asarray)
    for index, axis in ((np.array([40, 3, 3, 17, 49, 0, 22, 8]), 0), (np.arange(0, 31, 3)[::-1], 1), (np.array([8, 9]), 0)):
        selected = d[(slice(None),) * axis + (index,)]
        tasks = [t for t in dict(selected.__dask_graph__()).values() if getattr(t, "func", None) is copies.shuffle_getitem]
        assert tasks, "the shuffle's gathers are pipeline's"
        got = selected.compute(scheduler="threads")
        np.testing.assert_array_equal(cupy.asnumpy(got), np.take(x, index, axis=axis))
    # on the host, the same function is dask's getitem
    np.testing.assert_array_equal(copies.shuffle_getitem(x, (1, (slice(None), np.array([3, 1]), slice(0, 1)))), x[:, [3, 1], 0:1])
