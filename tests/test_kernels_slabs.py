"""The CPU kernels work through a block slab by slab (pipeline.kernels.slabs): the same results,
bit for bit, as their formulas on the whole block, and temporaries within the slabs they declare."""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest

from pipeline import kernels
from pipeline.kernels import coarsen, elementwise, fields, groups, moments, slabs, trend, weighted

F4 = np.dtype(np.float32)


def _block(shape=(24, 30, 40), seed=0):
    rng = np.random.default_rng(seed)
    x = (280 + 10 * rng.standard_normal(shape)).astype(np.float32)
    x[:, :2, :3] = np.nan  # points with no valid value
    x[5, 10:14] = np.nan
    return x


def _cases(x):
    """(kernel name, call of the slabbed kernel, call of its formula on the whole block)."""
    t = x.shape[0]
    u = np.linspace(-1, 1, t).reshape(t, 1, 1)
    ub = np.broadcast_to(u, x.shape)
    with warnings.catch_warnings():  # the points without a valid value: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, axis=0, keepdims=True, dtype=np.float64)
        std = np.nanstd(x, axis=0, keepdims=True, dtype=np.float64)
    w = np.broadcast_to(np.cos(np.deg2rad(np.linspace(-80, 80, x.shape[1]))).reshape(1, -1, 1), x.shape)
    x2 = x.reshape(t, -1)
    labels = np.arange(t) % 5
    values = np.random.default_rng(1).standard_normal((5, x2.shape[1]))
    k = lambda name: kernels.get(name, "cpu")  # noqa: E731
    return [
        ("moments", lambda: moments.moments_formula(x, (0,)), lambda: moments._moments_formula(x, (0,))),
        ("moments", lambda: k("moments")(x, (1, 2)), lambda: moments._moments_formula(x, (1, 2))),
        ("weighted_sums", lambda: weighted.weighted_formula(x, w, (1, 2)), lambda: weighted._weighted_formula(x, w, (1, 2))),
        ("standardize", lambda: k("standardize")(x, mean, std, F4), lambda: elementwise._standardize_formula(x, mean, std, F4)),
        ("polyfit", lambda: k("polyfit")(x, ub, (0,), 2), lambda: trend._polyfit_formula(x, ub, (0,), 2)),
        ("polyval_subtract", lambda: k("polyval_subtract")(x, u, mean, std, out_dtype=F4, axis=0),
         lambda: trend._polyval_subtract_formula(x, u, mean, std, out_dtype=F4)),
        ("subtract_groups", lambda: k("subtract_groups")(x2, labels, values, F4),
         lambda: groups._subtract_groups_formula(x2, labels, values, F4)),
        ("quantile", lambda: k("quantile")(x, (0.1, 0.9), 0, F4), lambda: fields.quantile(x, (0.1, 0.9), 0, F4)),
        ("quantile", lambda: k("quantile")(x, (0.5,), 2, F4), lambda: fields.quantile(x, (0.5,), 2, F4)),
        ("coarsen_mean", lambda: k("coarsen_mean")(x, {0: 4}, F4), lambda: coarsen.coarsen_mean_formulas(x, {0: 4}, F4)),
        ("saturation_vapor_pressure", lambda: k("saturation_vapor_pressure")(x, 0.0, "sonntag90", F4),
         lambda: fields._svp_formula(x, 0.0, "sonntag90", F4)),
    ]


def _fields(r):
    return r if isinstance(r, dict) else {"": r}


@pytest.mark.parametrize("index", range(11))
def test_slabbed_kernels_equal_their_formulas_bit_for_bit(index, monkeypatch):
    monkeypatch.setattr(slabs, "SLAB_BYTES", 2000)  # a few rows a slab: many slabs, a short last one
    x = _block()
    name, kernel, formula = _cases(x)[index]
    with np.errstate(invalid="ignore", divide="ignore"):
        got, want = _fields(kernel()), _fields(formula())
    assert got.keys() == want.keys(), name
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype, (name, key)
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")


def test_slabs_cut_an_axis_not_held_whole_and_pass_tables_whole():
    assert slabs.slab_axis((10, 20, 30), (0,)) == 1
    assert slabs.slab_axis((1, 20, 30)) == 1  # an axis of length 1 is no cut
    assert slabs.slab_axis((10, 20), (0, 1)) is None
    cuts = slabs.slab_slices((10, 20, 30), 4, 1, nbytes=10 * 30 * 4 * 3)
    assert [(s.start, s.stop) for s in cuts] == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 20)]
    assert slabs.slab_slices((10, 20, 30), 4, 1, nbytes=1) == [slice(i, i + 1) for i in range(20)]  # one index at least
    seen = []

    def fn(x, labels, table, scale):
        seen.append((x.shape, labels.shape, table.shape, scale.shape))
        return x * scale

    x, labels, table, scale = np.ones((6, 8)), np.arange(6), np.ones((3, 8)), np.full((1, 8), 2.0)
    out = slabs.map_slabs(fn, x, labels, table, scale, whole=(0,), nbytes=6 * 8 * 2)
    np.testing.assert_array_equal(out, 2 * x)
    # cut along the points: x and the table by columns, the labels and the broadcast row whole
    assert seen == [((6, 2), (6,), (3, 2), (1, 2))] * 4


@pytest.mark.parametrize("name", ["moments", "weighted_sums", "standardize", "polyfit", "polyval_subtract",
                                  "subtract_groups", "quantile", "coarsen_mean", "saturation_vapor_pressure"])
def test_temporaries_stay_within_the_slabs_a_kernel_declares(name, monkeypatch):
    """Measured as the plan counts them: the peak of what the kernel allocates (tracemalloc)
    beyond its result, against its declared slabs; a block of 16 MB, slabs of 256 kB."""
    slab = 256 * 2**10
    monkeypatch.setattr(slabs, "SLAB_BYTES", slab)
    x = _block((64, 125, 500))
    call = next(kernel for n, kernel, _ in _cases(x) if n == name)
    declared = kernels.get(name, "cpu").fn.work_slabs
    with np.errstate(invalid="ignore", divide="ignore"):
        call()  # compiled, cached
        tracemalloc.start()
        try:
            result = call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    extra = peak - sum(v.nbytes for v in _fields(result).values())
    assert extra <= declared * slab, f"{name}: {extra / slab:.2f} slabs, declares {declared}"
    assert extra < x.nbytes / 4  # not multiples of the block, as the whole-block formulas made


def test_the_plan_counts_the_most_slabs_a_kernel_declares():
    from pipeline.exec import memory

    declared = [kernels.get(n, "cpu").fn.work_slabs for n in kernels.FAMILIES if hasattr(kernels.get(n, "cpu").fn, "work_slabs")]
    assert kernels.work_slabs("cpu") == max(declared) > 0
    assert kernels.work_slabs("gpu") == 0
    block = 73 * 721 * 1440 * 4  # a time step of 4 MB: slabs of up to 1/64 of the block
    assert memory.work_bytes("cpu", block) == int(np.ceil(max(declared) * block / 64))
    assert memory.work_bytes("cpu", 10**6) == int(np.ceil(max(declared) * 10**6))  # a block smaller than a slab
    assert memory.work_bytes("cpu", 10**8) == int(np.ceil(max(declared) * slabs.SLAB_BYTES))
    assert memory.work_bytes("gpu", block) == 0
