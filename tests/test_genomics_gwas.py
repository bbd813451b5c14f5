"""gwas_linear_regression against sgkit 0.10 (``sgkit_gwas.npz``, made by
``tests/fixtures/genomics/sgkit_gwas.py``) on the ``bi`` data: covariates as three 1-D variables
or one 2-D variable, traits as one 2-D variable or two 1-D ones, a float64 or uint8 dosage, with
the intercept alone (sgkit's float32 column of ones) and without an intercept; variant chunks of
100, 37 and 1000, samples whole or in chunks of 25.

The dosage counts the called alternate alleles (a missing allele counts for nothing), as the
fixture's. Tolerance: the statistics come from other (algebraically equal) float64 formulas than
sgkit's, each rounding relative to |G|^2 and |Y_P|^2 (pipeline.kernels.gwas): measured within
2e-13 relative of sgkit's, so 1e-10 leaves room for other BLAS libraries and still fails on any
difference of formula. NaN exactly where sgkit's (the two variants with no called alternate
allele: 0 / 0).
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.errors import InputError

from .conftest import raise_if_dask_computes
from .genomics_data import dataset, sgkit

REF = sgkit("gwas")
SPLIT = [f"sample_covariate_{k}" for k in range(3)]
CASES = {  # case -> parameters, as the fixture ran them
    "split": dict(dosage="call_dosage", covariates=SPLIT, traits="sample_trait"),
    "matrix": dict(dosage="call_dosage_u8", covariates="sample_covariate", traits=["sample_trait_0", "sample_trait_1"]),
    "intercept": dict(dosage="call_dosage", covariates=[], traits="sample_trait"),
    "nointercept": dict(dosage="call_dosage", covariates=SPLIT, traits="sample_trait", add_intercept=False),
}
OUT = ("beta", "t_value", "p_value")
RTOL = 1e-10


def gwas_dataset(chunks=None, backend="cpu") -> xr.Dataset:
    """The ``bi`` data with the fixture's dosages and covariates and traits split into 1-D variables."""
    ds = dataset("bi", chunks, backend)
    alt = (ds["call_genotype"] == 1).sum("ploidy")
    ds = ds.assign(call_dosage=alt.astype(np.float64), call_dosage_u8=alt.astype(np.uint8))
    for k in range(ds.sizes["covariates"]):
        ds[f"sample_covariate_{k}"] = ds["sample_covariate"][:, k]
    for k in range(ds.sizes["traits"]):
        ds[f"sample_trait_{k}"] = ds["sample_trait"][:, k]
    return ds


def assert_sgkits(out: xr.Dataset, case: str):
    for v in OUT:
        x = out[f"variant_linreg_{v}"]
        assert x.dims == ("variants", "traits") and x.dtype == np.float64
        a, e = B.to_numpy(x.data), REF[f"{case}_{v}"]
        np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"{case} {v}: NaN pattern")
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=0, equal_nan=True, err_msg=f"{case} {v}")


def test_the_dosage_is_the_fixtures():
    np.testing.assert_array_equal(gwas_dataset()["call_dosage"].values, REF["call_dosage"])


@pytest.mark.parametrize(
    "chunks", [{"variants": 100}, {"variants": 37}, {"variants": 1000}, {"variants": 37, "samples": 25}],
    ids=["v100", "v37", "v1000", "v37-s25"],
)
def test_gwas_linear_regression_is_sgkits(chunks):
    ds = gwas_dataset(chunks)
    for case, params in CASES.items():
        out = sg.gwas_linear_regression(ds, merge=False, **params)
        assert out["variant_linreg_beta"].data.chunks[0] == ds["call_dosage"].data.chunks[0]
        assert_sgkits(out.compute(), case)


def test_lazy_merged_and_runs_its_kernels():
    ds = gwas_dataset({"variants": 37})
    with raise_if_dask_computes():
        out = sg.gwas_linear_regression(ds, **CASES["split"])
    assert set(ds.variables) < set(out.variables)  # merge=True: the input's variables too
    with kernels.recording() as calls:
        assert_sgkits(out.compute(), "split")
    assert set(calls) == {("linreg_block", "cpu"), ("linreg_p_value", "cpu")}
    assert calls[("linreg_block", "cpu")] == len(ds["call_dosage"].data.chunks[0])


def test_float32_inputs_give_float32_statistics():
    ds = gwas_dataset()
    ds = ds.assign(
        call_dosage=ds["call_dosage"].astype(np.float32), sample_trait=ds["sample_trait"].astype(np.float32)
    )
    out = sg.gwas_linear_regression(ds, dosage="call_dosage", covariates=[], traits="sample_trait", merge=False)
    assert out["variant_linreg_beta"].dtype == out["variant_linreg_t_value"].dtype == np.float32
    assert out["variant_linreg_p_value"].dtype == np.float64
    # computed in float64 and rounded to float32 (where sgkit computes in float32): within float32
    # rounding of the float64 reference, relative to the largest value for those near 0
    e = REF["intercept_beta"]
    np.testing.assert_allclose(out["variant_linreg_beta"].values, e, rtol=2e-7, atol=2e-7 * np.nanmax(np.abs(e)))


def test_errors_name_what_is_wrong():
    ds = gwas_dataset()
    run = sg.gwas_linear_regression
    with pytest.raises(InputError, match="add_intercept must be True"):
        run(ds, dosage="call_dosage", covariates=[], traits="sample_trait", add_intercept=False)
    with pytest.raises(InputError, match="covariate variable 'variant_position' has dimensions"):
        run(ds, dosage="call_dosage", covariates="variant_position", traits="sample_trait")
    with pytest.raises(InputError, match="no traits given"):
        run(ds, dosage="call_dosage", covariates=SPLIT, traits=[])
    with pytest.raises(InputError, match="no variable 'dosage'"):
        run(ds, dosage="dosage", covariates=SPLIT, traits="sample_trait")
    with pytest.raises(InputError, match="'call_genotype' has dimensions"):
        run(ds, dosage="call_genotype", covariates=SPLIT, traits="sample_trait")
    few = ds.isel(samples=slice(0, 5))
    with pytest.raises(InputError, match=r"samples \(5\) must outnumber the covariates, intercept included \(4\)"):
        run(few, dosage="call_dosage", covariates=SPLIT, traits="sample_trait")


def test_registered_as_a_dataset_op():
    import pipeline

    op = pipeline.ops.get("gwas_linear_regression")
    assert op.dataset and op.backends == ("cpu", "gpu")
    params = op.parameters()
    assert params["dosage"]["required"] and params["add_intercept"]["default"] is True


@pytest.mark.gpu
def test_gpu_equals_cpu():
    for chunks in ({"variants": 37}, {"variants": 100, "samples": 25}):
        cpu, gpu = gwas_dataset(chunks), gwas_dataset(chunks, backend="gpu")
        for case, params in CASES.items():
            with kernels.recording() as calls:
                got = sg.gwas_linear_regression(gpu, merge=False, **params)
                assert all(B.backend_of(got[v].data) == "gpu" for v in got.data_vars)
                got = B.to_numpy(got.compute())
            assert {b for _, b in calls} == {"gpu"}
            expected = sg.gwas_linear_regression(cpu, merge=False, **params).compute()
            for v in got.data_vars:  # cuBLAS sums in another order than the host's BLAS
                np.testing.assert_allclose(got[v].values, expected[v].values, rtol=RTOL, atol=0, equal_nan=True)
            assert_sgkits(got, case)


@pytest.mark.gpu
def test_gpu_statistics_go_back_to_the_host_without_a_copy_each_way(tmp_path):
    """The statistics are made on the host and handed out on the device; taken back to the host
    (as a flow's sink does), they are the host's blocks again: no task copies them to the device
    and back. A step on them in between gives a new array, copied as any."""
    import dask.array as da

    from pipeline.sinks.zarr import to_host_dataset

    got = sg.gwas_linear_regression(gwas_dataset({"variants": 37}, backend="gpu"), merge=False, **CASES["split"])
    host = to_host_dataset(got)
    for v in got.data_vars:
        device, back = got[v].data, host[v].data
        assert B.backend_of(device) == "gpu" and B.backend_of(back) == "cpu"
        # the device's array is a move of the host's, and the host's graph holds no move of it
        assert device.__dask_graph__().dependencies[device.name] == {back.name}, v
        assert device.name not in back.__dask_graph__().layers, v
        np.testing.assert_array_equal(back.compute(), B.to_numpy(device.compute()))
        moved = B.to_backend(device * 2, "cpu")  # not a move of a host array: copied
        assert moved.name.startswith("to_numpy") and device.name in moved.__dask_graph__().layers
        np.testing.assert_array_equal(moved.compute(), back.compute() * 2)
    assert_sgkits(B.to_numpy(host.compute()), "split")
    assert isinstance(host["variant_linreg_beta"].data, da.Array)


def test_an_array_moved_back_is_the_one_it_came_from_while_the_move_lives():
    """``to_backend``'s note of a move (here between two host arrays, as on a machine without a
    GPU): found by the move's Dask name, with the same blocks, and forgotten with the move."""
    import gc

    import dask.array as da

    from pipeline import state

    source = da.arange(10.0, chunks=4)
    out = source.map_blocks(np.asarray, dtype=source.dtype)
    B._remember_move(out, source)
    assert B._moved_from(out) is source
    assert B._moved_from(out.rechunk(5)) is None  # other blocks, another name
    same = source.map_blocks(np.asarray, dtype=source.dtype)  # the same move made again
    assert same.name == out.name and B._moved_from(same) is source
    name = out.name
    del out, same
    gc.collect()
    assert name not in state.moved.sources


def test_the_whole_block_formula_equals_the_cpus_slabs():
    """The formula on a block whole (the GPU's order of work), the CPU's kernel slab by slab: on a
    block of several slabs (int8 dosages, slabs of 2 MB of float64)."""
    rng = np.random.default_rng(1)
    g = rng.integers(0, 3, size=(40_000, 60), dtype=np.int8)
    q, _ = np.linalg.qr(np.column_stack([np.ones(60), rng.normal(size=(60, 2))]))
    y = rng.normal(size=(60, 2))
    yp = y - q @ (q.T @ y)
    args = dict(w=np.hstack([q, yp]), gram=q.T @ q, qyp=q.T @ yp, yps=(yp * yp).sum(axis=0), dof=60 - 3 - 1)
    from pipeline.kernels.gwas import linreg_block

    cpu = kernels.get("linreg_block", "cpu")
    whole, slabs = linreg_block(g, **args), cpu(g, **args)
    assert slabs.shape == whole.shape == (40_000, 2, 2)
    np.testing.assert_allclose(slabs, whole, rtol=1e-12, atol=0)
    # and the t statistics are those of an explicit least-squares fit, for one variant
    design = np.column_stack([q, g[7].astype(float)])
    coef, rss, *_ = np.linalg.lstsq(design, y, rcond=None)
    np.testing.assert_allclose(whole[7, :, 0], coef[-1], rtol=1e-10)
    se = np.sqrt(rss / args["dof"] * np.linalg.inv(design.T @ design)[-1, -1])
    np.testing.assert_allclose(whole[7, :, 1], coef[-1] / se, rtol=1e-10)


@pytest.mark.gpu
def test_the_gpus_block_kernel_equals_the_formula():
    """``linreg_block_gpu`` (cuBLAS product, sums of squares by its CUDA C kernel, the rest on the
    host) against the formula on NumPy, with a NaN dosage, on a block and on a strided view."""
    import cupy

    from pipeline.kernels.gwas import linreg_block

    rng = np.random.default_rng(2)
    g = rng.integers(0, 3, size=(3000, 700)).astype(np.float64)
    g[5, 3] = np.nan
    q, _ = np.linalg.qr(np.column_stack([np.ones(700), rng.normal(size=(700, 2))]))
    y = rng.normal(size=(700, 2))
    yp = y - q @ (q.T @ y)
    args = dict(w=np.hstack([q, yp]), gram=q.T @ q, qyp=q.T @ yp, yps=(yp * yp).sum(axis=0), dof=700 - 3 - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = linreg_block(g, **args)
    got = kernels.get("linreg_block", "gpu")(cupy.asarray(g), **args)
    assert isinstance(got, np.ndarray) and got.shape == (3000, 2, 2)
    assert np.isnan(got[5]).all() and not np.isnan(got[6]).any()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=0, equal_nan=True)
    strided = kernels.get("linreg_block", "gpu")(cupy.asarray(g)[::2], **args)
    np.testing.assert_allclose(strided, want[::2], rtol=1e-10, atol=0, equal_nan=True)


def test_gpu_blocks_split_to_the_block_size(monkeypatch):
    """On the GPU a block read holds several stored chunks of int8 calls; the regression's float64
    copy of it is split into blocks of the read block size (splits only, never merges)."""
    from pipeline.exec import memory
    from pipeline.ops.genomics.gwas import _split_rows

    monkeypatch.setattr(memory, "block_target", lambda backend: 400 * 25_000 * 8)
    assert _split_rows((1000, 1000, 37), 25_000, "gpu") == (334, 333, 333, 334, 333, 333, 37)
    assert _split_rows((1000, 37), 25_000, "cpu") == (1000, 37)
    monkeypatch.setattr(memory, "block_target", lambda backend: 0)
    assert _split_rows((1000, 37), 25_000, "gpu") == (1000, 37)


def test_memory_plan_counts_the_chunks_of_samples_a_block_is_cut_from():
    """A block of all samples holds a block of each chunk of samples until it is cut: the plan
    counts that many more blocks a thread."""
    from pipeline.exec import memory

    ds = gwas_dataset()
    one = sg.gwas_linear_regression(ds, **CASES["split"], merge=False)
    chunked = ds.chunk({"samples": ds.sizes["samples"] // 3 + 1})
    three = sg.gwas_linear_regression(chunked, **CASES["split"], merge=False)
    base = memory.graph_blocks_per_thread(one.variant_linreg_beta.data)
    assert memory.graph_blocks_per_thread(three.variant_linreg_beta.data) == base + 3


def _layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    """``a`` in C order, in Fortran order, as a strided view and at an odd byte: the layouts a
    block can have after a transpose in place, or received from another worker (distributed makes
    a small array where its frame lies in the message)."""
    wide = np.empty((a.shape[0], 2 * a.shape[1]), a.dtype)
    wide[:, ::2] = a
    odd = np.empty(a.nbytes + 3, np.uint8)[3:].view(a.dtype).reshape(a.shape)
    odd[...] = a
    assert not odd.flags.aligned
    return {"C": np.ascontiguousarray(a), "F": np.asfortranarray(a), "strided": wide[:, ::2], "unaligned": odd}


def test_regression_terms_have_the_same_bits_whatever_the_blocks_memory_order():
    """The covariates' terms and each block's statistics come out bit for bit the same whatever
    the memory order of their inputs. A product's last bits follow its operands' order, and a
    block's order follows where its task ran: on a cluster, the betas of one store once differed
    in the last bits between two runs."""
    from pipeline.ops.genomics import association, gwas as op

    rng = np.random.default_rng(3)
    n = 57
    x = np.c_[np.ones(n), rng.normal(size=(n, 2))]
    y = rng.normal(size=(n, 2))
    g = rng.integers(0, 3, size=(101, n)).astype(np.float64)
    g[rng.random(g.shape) < 0.05] = 0.75  # mean-imputed calls
    q = op._qr_on_host(x)
    yp = op._residuals(q, y)
    w = op._with_residuals(q, yp)
    ref = {"q": q, "yp": yp, "w": w, "gram": op._gram(w, 3), "qyp": op._q_yp(w, 3), "yps": op._sum_squares(w, 3),
           "loco": association._loco_traits(q, y, np.float64)}
    stats = kernels.get("linreg_block", "cpu")(g, w=w, gram=ref["gram"], qyp=ref["qyp"], yps=ref["yps"], dof=n - 4)
    assert np.isfinite(stats).all() and not np.array_equal(ref["gram"], np.eye(3))  # Q^T Q is I to rounding only
    for name in ("C", "F", "strided", "unaligned"):
        xs, ys, gs = _layouts(x)[name], _layouts(y)[name], _layouts(g)[name]
        qs = _layouts(q)[name]
        ws = _layouts(w)[name]
        got = {"q": op._qr_on_host(xs), "yp": op._residuals(qs, ys), "w": op._with_residuals(qs, _layouts(yp)[name]),
               "gram": op._gram(ws, 3), "qyp": op._q_yp(ws, 3), "yps": op._sum_squares(ws, 3),
               "loco": association._loco_traits(qs, ys, np.float64)}
        for key, value in got.items():
            assert value.tobytes() == ref[key].tobytes(), (name, key)
        assert kernels.get("linreg_block", "cpu")(gs, w=ws, gram=ref["gram"], qyp=ref["qyp"], yps=ref["yps"],
                                                  dof=n - 4).tobytes() == stats.tobytes(), name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_p_values_are_scipy_stats_bits(dtype):
    """The p-value kernel gives ``2 * scipy.stats.t.sf(|t|, dof)`` (sgkit's formula) bit for bit,
    NaN, infinities, zero and a degree of freedom of 0 included."""
    from scipy import stats

    rng = np.random.default_rng(5)
    t = np.concatenate([rng.normal(scale=3, size=4000), rng.normal(scale=1e3, size=100),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, 37.5, -40.0]]).astype(dtype).reshape(-1, 2)
    for dof in (0, 1, 3, 97, 9995, 10**7):
        want = 2 * stats.distributions.t.sf(np.abs(t), dof)
        got = kernels.get("linreg_p_value", "cpu")(t, dof)
        assert got.dtype == np.float64 and got.shape == t.shape
        np.testing.assert_array_equal(got.view(np.int64)[~np.isnan(want)], want.view(np.int64)[~np.isnan(want)])
        assert np.array_equal(np.isnan(got), np.isnan(want)), dof


def test_p_values_do_not_import_scipy_stats():
    """A fresh process (a worker) computes p-values without importing scipy.stats, 0.7 s of imports."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; from pipeline import kernels; "
            "p = kernels.get('linreg_p_value', 'cpu')(np.array([[1.5, -2.0]]), 10); "
            "assert 0 < p.min() < 1, p; print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
