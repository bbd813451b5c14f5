"""Pedigrees as sgkit 0.10 computes them (``parent_indices``, ``pedigree_kinship``,
``pedigree_inbreeding``, ``pedigree_inverse_kinship``, ``pedigree_contribution``, ``pedigree_sel``,
``simulate_genedrop``, ``display_pedigree``), against sgkit's results (``sgkit_c.npz``, made by
``tests/fixtures/genomics/sgkit_c.py``) on pedigrees stored out of order, with founders,
half-founders, mixed ploidy and three parent columns."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline.errors import InputError, NotImplementedInputError

from .conftest import requires_gpu
from .genomics_data import dataset as genotype_dataset, sgkit

REF = sgkit("c")
TOL = dict(rtol=1e-10, atol=1e-12)


def pedigree(prefix: str = "", chunked: bool = False) -> xr.Dataset:
    """The fixture's pedigree (``prefix`` "half_" or "three_" for the others) as sgkit reads it."""
    def arr(x):
        return da.from_array(x, chunks=7) if chunked else x
    return xr.Dataset({
        "sample_id": ("samples", REF["sample_id"].astype(object)),
        "parent_id": (("samples", "parents"), REF[f"{prefix}parent_id"].astype(object)),
        "stat_Hamilton_Kerr_tau": (("samples", "parents"), arr(REF[f"{prefix}tau"])),
        "stat_Hamilton_Kerr_lambda": (("samples", "parents"), arr(REF[f"{prefix}lambda"])),
    })


def close(x, ref):
    x = x.data if isinstance(x, xr.DataArray) else x
    assert isinstance(x, da.Array)  # lazy, as sgkit's
    np.testing.assert_allclose(B.to_numpy(x), REF[ref], **TOL)


def test_parent_indices():
    out = sg.parent_indices(pedigree())
    assert out["parent"].dims == ("samples", "parents")
    assert out["parent"].dtype == np.int64
    assert out["parent"].attrs["comment"] == str(REF["comment_parent"])
    np.testing.assert_array_equal(out["parent"].values, REF["parent"])
    assert set(sg.parent_indices(pedigree(), merge=False).data_vars) == {"parent"}


def test_parent_indices_bad_input():
    ds = pedigree()
    ds["parent_id"][3, 1] = "nobody"
    with pytest.raises(InputError, match="'nobody'.*'parent_id'.*not a known sample identifier") as e:
        sg.parent_indices(ds)
    assert isinstance(e.value, KeyError)  # as sgkit raises
    with pytest.raises(InputError, match=r"Missing value 'I03' is a known sample identifier"):
        sg.parent_indices(pedigree(), missing="I03")
    with pytest.raises(InputError, match="no variable 'parent_id'"):
        sg.parent_indices(pedigree().drop_vars("parent_id"))


@pytest.mark.parametrize("chunked", [False, True])
def test_kinship_and_relationship(chunked):
    ds = pedigree(chunked=chunked)
    out = sg.pedigree_kinship(ds, return_relationship=True)
    assert out["stat_pedigree_kinship"].dims == ("samples_0", "samples_1")
    assert out["stat_pedigree_kinship"].attrs["comment"] == str(REF["comment_stat_pedigree_kinship"])
    assert "parent" in out  # computed on the way, kept as sgkit keeps it
    close(out["stat_pedigree_kinship"], "kinship_diploid")
    close(out["stat_pedigree_relationship"], "relationship_diploid")
    out = sg.pedigree_kinship(ds, method="Hamilton-Kerr", return_relationship=True, merge=False)
    assert set(out.data_vars) == {"stat_pedigree_kinship", "stat_pedigree_relationship"}
    close(out["stat_pedigree_kinship"], "kinship_hk")
    close(out["stat_pedigree_relationship"], "relationship_hk")


def test_kinship_in_tiles():
    ds = pedigree()
    k = sg.pedigree_kinship(ds, chunks=(7, 9)).stat_pedigree_kinship
    assert k.data.chunks == ((7, 7, 7, 2), (9, 9, 5))
    close(k, "kinship_diploid_chunked")
    k = sg.pedigree_kinship(ds, method="Hamilton-Kerr", chunks=(10, 6)).stat_pedigree_kinship
    close(k, "kinship_hk_chunked")
    np.testing.assert_allclose(REF["kinship_hk_chunked"], REF["kinship_hk"], **TOL)


def test_kinship_from_founder_kinship():
    ds = pedigree().assign(founder=(("samples_0", "samples_1"), REF["founder_kinship"]))
    close(sg.pedigree_kinship(ds, founder_kinship="founder").stat_pedigree_kinship, "kinship_diploid_founder")
    close(sg.pedigree_kinship(ds, method="Hamilton-Kerr", founder_kinship="founder").stat_pedigree_kinship,
          "kinship_hk_founder")
    # given by founder_indices (deprecated): the founders' own pairs
    founders = np.flatnonzero((REF["parent"] < 0).all(axis=1))
    sub = REF["founder_kinship"][np.ix_(founders, founders)]
    old = pedigree().assign(f=(("f0", "f1"), sub), fi=("f0", founders))
    with pytest.warns(DeprecationWarning, match="founder_indices"):
        k = sg.pedigree_kinship(old, founder_kinship="f", founder_indices="fi").stat_pedigree_kinship
    close(k, "kinship_diploid_founder")
    with pytest.raises(NotImplementedInputError, match="founder_kinship"):
        sg.pedigree_kinship(ds, founder_kinship="founder", chunks=5)
    bad = pedigree().assign(founder=(("a", "b"), np.zeros((3, 3))))
    with pytest.raises(InputError, match="'founder' has shape \\(3, 3\\).*23"):
        sg.pedigree_kinship(bad, founder_kinship="founder")


def test_inbreeding():
    out = sg.pedigree_inbreeding(pedigree())
    assert out["stat_pedigree_inbreeding"].dims == ("samples",)
    assert out["stat_pedigree_inbreeding"].attrs["comment"] == str(REF["comment_stat_pedigree_inbreeding"])
    close(out["stat_pedigree_inbreeding"], "inbreeding_diploid")
    close(sg.pedigree_inbreeding(pedigree(), method="Hamilton-Kerr").stat_pedigree_inbreeding, "inbreeding_hk")


def test_half_founders_allowed_or_refused():
    ds = pedigree("half_")
    for method, key in (("diploid", "diploid"), ("Hamilton-Kerr", "hk")):
        close(sg.pedigree_kinship(ds, method=method, allow_half_founders=True).stat_pedigree_kinship, f"half_kinship_{key}")
        close(sg.pedigree_inbreeding(ds, method=method, allow_half_founders=True).stat_pedigree_inbreeding,
              f"half_inbreeding_{key}")
        lazy = sg.pedigree_inbreeding(ds, method=method)  # refused when computed, as sgkit's
        with pytest.raises(InputError, match="pedigree_inbreeding: Pedigree contains half-founders"):
            lazy.stat_pedigree_inbreeding.values


def test_three_parent_columns():
    ds = pedigree("three_")
    close(sg.pedigree_kinship(ds, method="Hamilton-Kerr").stat_pedigree_kinship, "three_kinship_hk")
    close(sg.pedigree_inbreeding(ds, method="Hamilton-Kerr").stat_pedigree_inbreeding, "three_inbreeding_hk")
    with pytest.raises(InputError, match="parents dimension must be length 2"):
        sg.pedigree_inbreeding(ds)


def test_inverse_kinship():
    for method, key in (("diploid", "diploid"), ("Hamilton-Kerr", "hk")):
        out = sg.pedigree_inverse_kinship(pedigree(), method=method, return_relationship=True, merge=False)
        assert set(out.data_vars) == {"stat_pedigree_inverse_kinship", "stat_pedigree_inverse_relationship"}
        assert out["stat_pedigree_inverse_kinship"].attrs["comment"] == str(REF["comment_stat_pedigree_inverse_kinship"])
        close(out["stat_pedigree_inverse_kinship"], f"inverse_kinship_{key}")
        close(out["stat_pedigree_inverse_relationship"], f"inverse_relationship_{key}")
    # the inverse of the kinship
    np.testing.assert_allclose(REF["inverse_kinship_hk"] @ REF["kinship_hk"], np.eye(23), atol=1e-9)


def test_contribution():
    ds = pedigree()
    out = sg.pedigree_contribution(ds)
    assert out["stat_pedigree_contribution"].dims == ("samples_0", "samples_1")
    assert out["stat_pedigree_contribution"].attrs["comment"] == str(REF["comment_stat_pedigree_contribution"])
    close(out["stat_pedigree_contribution"], "contribution_even")
    rows = sg.pedigree_contribution(ds, chunks=(7, -1)).stat_pedigree_contribution
    assert rows.data.chunks == ((7, 7, 7, 2), (23,))
    close(rows, "contribution_even_rows")
    cols = sg.pedigree_contribution(ds, chunks=(-1, 7)).stat_pedigree_contribution
    assert cols.data.chunks == ((23,), (7, 7, 7, 2))
    close(cols, "contribution_even_cols")
    close(sg.pedigree_contribution(ds, method="variable").stat_pedigree_contribution, "contribution_variable")
    with pytest.raises(NotImplementedInputError, match="single axis"):
        sg.pedigree_contribution(ds, chunks=(7, 7))
    with pytest.raises(InputError, match="unknown method 'odd'"):
        sg.pedigree_contribution(ds, method="odd")


def test_sel():
    ds = pedigree()
    out = sg.pedigree_sel(ds, samples=REF["sel_samples"], ancestor_depth=1, descendant_depth=-1)
    np.testing.assert_array_equal(out.sample_id.values.astype(str), REF["sel_sample_id"])
    np.testing.assert_array_equal(out.parent_id.values.astype(str), REF["sel_parent_id"])
    assert "parent" not in out
    out = sg.pedigree_sel(ds, samples=REF["sel_samples"], ancestor_depth=-1)
    np.testing.assert_array_equal(out.sample_id.values.astype(str), REF["sel_ancestors_sample_id"])
    with pytest.raises(InputError, match="pedigree_sel: samples"):
        sg.pedigree_sel(ds, samples=[99])


def genotypes(kind: str, backend: str = "cpu") -> xr.Dataset:
    gt = REF["genotypes"][:, :, :2].clip(-1) if kind == "diploid" else REF["genotypes"]
    data = B.to_backend(da.from_array(gt, chunks=(11, 9, -1)), backend)
    return pedigree().assign(call_genotype=(("variants", "samples", "ploidy"), data))


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, requires_gpu])])
def test_genedrop_as_sgkits_for_the_same_seed(backend):
    out = sg.simulate_genedrop(genotypes("diploid", backend), seed=7)
    gt = out["call_genotype"]
    assert B.backend_of(gt.data) == backend
    assert gt.dims == ("variants", "samples", "ploidy") and gt.dtype == np.int8
    np.testing.assert_array_equal(B.to_numpy(gt.data), REF["genedrop_diploid"])
    np.testing.assert_array_equal(B.to_numpy(out["call_genotype_mask"].data), REF["genedrop_diploid"] < 0)
    seeds = sg.simulate_genedrop(genotypes("diploid", backend), seed=REF["genedrop_seeds"])
    np.testing.assert_array_equal(B.to_numpy(seeds["call_genotype"].data), REF["genedrop_diploid_seeds"])
    hk = sg.simulate_genedrop(genotypes("mixed", backend), method="Hamilton-Kerr", seed=11)
    np.testing.assert_array_equal(B.to_numpy(hk["call_genotype"].data), REF["genedrop_hk"])
    np.testing.assert_array_equal(B.to_numpy(hk["call_genotype_fill"].data), REF["genedrop_hk"] < -1)
    assert hk["call_genotype_fill"].attrs["comment"] == str(REF["comment_call_genotype_fill"])


def test_genedrop_bad_input():
    with pytest.raises(InputError, match="Genotypes are not diploid"):
        sg.simulate_genedrop(genotypes("mixed"), seed=1).call_genotype.values
    with pytest.raises(InputError, match="seed has shape \\(3,\\)"):
        sg.simulate_genedrop(genotypes("diploid"), seed=[1, 2, 3])
    with pytest.raises(InputError, match="'call_genotype' has values of type float64"):
        sg.simulate_genedrop(genotypes("diploid").assign(call_genotype=lambda d: d.call_genotype * 1.0))


def test_bad_input_names_the_variable():
    with pytest.raises(InputError, match="pedigree_kinship: unknown method 'nope'"):
        sg.pedigree_kinship(pedigree(), method="nope")
    with pytest.raises(InputError, match="no variable 'stat_Hamilton_Kerr_tau'"):
        sg.pedigree_inbreeding(pedigree().drop_vars("stat_Hamilton_Kerr_tau"), method="Hamilton-Kerr")
    with pytest.raises(InputError, match="'parent' has values of type float64, expected signed integers"):
        sg.pedigree_kinship(pedigree().assign(parent=(("samples", "parents"), REF["parent"] * 1.0)))
    with pytest.raises(InputError, match="no variable 'mine'"):
        sg.pedigree_kinship(pedigree(), parent="mine")
    loop = pedigree()
    loop["parent_id"][:] = np.roll(REF["sample_id"], 1)[:, None]  # each sample its neighbour's child
    with pytest.raises(InputError, match="pedigree_kinship: Pedigree contains a directed loop"):
        sg.pedigree_kinship(loop).stat_pedigree_kinship.values


def test_display_pedigree():
    ds = pedigree().assign_coords(samples=REF["sample_id"])
    try:
        import graphviz  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="requires the `graphviz` python library") as e:
            sg.display_pedigree(ds)
        assert isinstance(e.value, RuntimeError)  # as sgkit raises
        return
    graph = sg.display_pedigree(ds, graph_attrs={"rankdir": "LR"}, edge_attrs={"color": "blue"})
    lines = [line.strip() for line in graph.source.splitlines()]
    assert "rankdir=LR" in lines
    assert f"0 [label={REF['sample_id'][0]}]" in lines
    edges = {line for line in lines if "->" in line}
    expected = {f"{p} -> {i} [color=blue]" for (i, j), p in np.ndenumerate(REF["parent"]) if p >= 0}
    assert edges == expected


# --- regenie -------------------------------------------------------------------------------------

REGENIE_RUNS = {  # as the fixture script's
    "default": {},
    "blocks": {"variant_block_size": (100, 287, 152, 100), "sample_block_size": (30, 29, 1), "alphas": [10.0, 1000.0]},
    "normalize": {"variant_block_size": 200, "sample_block_size": 7, "normalize": True, "add_intercept": False},
    "orthogonalize": {"variant_block_size": 150, "orthogonalize": True, "add_intercept": False},
}
REGENIE_VARS = ("regenie_base_prediction", "regenie_meta_prediction", "regenie_loco_prediction")


def regenie_dataset(backend: str = "cpu") -> xr.Dataset:
    """The "bi" genotypes with ``call_dosage`` as the fixture makes it, in blocks of 37 variants."""
    ds = genotype_dataset("bi", {"variants": 37}, backend)
    dosage = ds.call_genotype.clip(0).sum("ploidy").astype(np.float64)
    ds = ds.assign(call_dosage=dosage)
    keep = np.isin(B.to_numpy(ds.variant_position.data), REF["regenie_keep"])
    return ds.isel(variants=np.flatnonzero(keep))


@pytest.mark.parametrize("run", list(REGENIE_RUNS))
def test_regenie_as_sgkits(run):
    out = sg.regenie(regenie_dataset(), dosage="call_dosage", covariates="sample_covariate", traits="sample_trait",
                     merge=False, **REGENIE_RUNS[run])
    assert set(out.data_vars) == set(REGENIE_VARS)
    assert out["regenie_base_prediction"].dims == ("blocks", "alphas", "samples", "outcomes")
    assert out["regenie_meta_prediction"].dims == ("samples", "outcomes")
    assert out["regenie_loco_prediction"].dims == ("contigs", "samples", "outcomes")
    for name in REGENIE_VARS:
        assert out[name].attrs["comment"] == str(REF[f"comment_{name}"])
        x = out[name].data
        assert isinstance(x, da.Array) and x.dtype == np.float64
        np.testing.assert_allclose(x.compute(), REF[f"regenie_{run}_{name}"], rtol=1e-10, atol=1e-10, err_msg=name)


def test_regenie_merges_and_one_contig_has_no_loco():
    ds = regenie_dataset()
    out = sg.regenie(ds, dosage="call_dosage", covariates=["sample_covariate"], traits="sample_trait")
    assert set(REGENIE_VARS) <= set(out.data_vars) and "call_genotype" in out
    one = ds.isel(variants=np.flatnonzero(B.to_numpy(ds.variant_contig.data) == 0))
    out = sg.regenie(one, dosage="call_dosage", covariates="sample_covariate", traits="sample_trait", merge=False)
    assert set(out.data_vars) == {"regenie_base_prediction", "regenie_meta_prediction"}


def test_regenie_bad_input():
    ds = regenie_dataset()
    args = dict(dosage="call_dosage", covariates="sample_covariate", traits="sample_trait")
    with pytest.raises(InputError, match="regenie: the dataset has no variable 'dose'"):
        sg.regenie(ds, **{**args, "dosage": "dose"})
    with pytest.raises(InputError, match="covariate variable 'call_dosage' has dimensions \\('variants', 'samples'\\)"):
        sg.regenie(ds, **{**args, "covariates": "call_dosage"})
    with pytest.raises(InputError, match="variant_block_size \\(5, 5\\) must be positive integers adding up to"):
        sg.regenie(ds, **args, variant_block_size=(5, 5))
    with pytest.raises(InputError, match="sample_block_size \\(50, 5\\) does not fit 60 samples"):
        sg.regenie(ds, **args, sample_block_size=(50, 5))
    unsorted = ds.assign(variant_contig=ds.variant_contig[::-1].variable)
    with pytest.raises(InputError, match="sorted by contig"):
        sg.regenie(unsorted, **args)
    with pytest.raises(InputError, match="'variant_contig' has values of type float64"):
        sg.regenie(ds.assign(variant_contig=ds.variant_contig * 1.0), **args)


@pytest.mark.gpu
@requires_gpu
def test_gpu_regenie_as_sgkits():
    ds = regenie_dataset("gpu")
    assert B.backend_of(ds.call_dosage.data) == "gpu"
    out = sg.regenie(ds, dosage="call_dosage", covariates="sample_covariate", traits="sample_trait", merge=False,
                     **REGENIE_RUNS["blocks"])
    for name in REGENIE_VARS:
        assert B.backend_of(out[name].data) == "gpu", name
        np.testing.assert_allclose(B.to_numpy(out[name].data), REF[f"regenie_blocks_{name}"], rtol=1e-10, atol=1e-10,
                                   err_msg=name)


@pytest.mark.parametrize("intercept", [True, False])
def test_regenie_loco_regression_as_sgkits(intercept):
    args = dict(dosage="call_dosage", covariates="sample_covariate", traits="sample_trait")
    fitted = sg.regenie(regenie_dataset(), **args)
    out = sg.regenie_loco_regression(fitted, **args, add_intercept=intercept)
    assert {"regenie_loco_prediction", "call_genotype"} <= set(out.data_vars)  # merged
    for name in ("variant_linreg_beta", "variant_linreg_t_value", "variant_linreg_p_value"):
        x = out[name]
        assert x.dims == ("variants", "traits") and isinstance(x.data, da.Array) and x.dtype == np.float64
        np.testing.assert_allclose(x.values, REF[f"loco_{intercept}_{name}"], rtol=1e-10, atol=1e-13, err_msg=name)


def test_regenie_loco_regression_bad_input():
    args = dict(dosage="call_dosage", covariates="sample_covariate", traits="sample_trait")
    ds = regenie_dataset()
    with pytest.raises(InputError, match="no variable 'regenie_loco_prediction'"):
        sg.regenie_loco_regression(ds, **args)
    fitted = sg.regenie(ds, **args)
    one = fitted.assign(loco1=(("c", "samples", "outcomes"), fitted.regenie_loco_prediction.data[:1]))
    with pytest.raises(InputError, match=r"number of contigs provided \(2\) does not match .* \(1, 'loco1'\)"):
        sg.regenie_loco_regression(one, **args, regenie_loco_prediction="loco1")
    with pytest.raises(InputError, match="'regenie_loco_prediction' has shape \\(2, 60, 2\\), expected \\(contigs, 60, 1\\)"):
        sg.regenie_loco_regression(fitted.assign(t1=fitted.sample_trait[:, 0]), **{**args, "traits": "t1"})


@pytest.mark.gpu
@requires_gpu
def test_gpu_regenie_loco_regression_as_sgkits():
    args = dict(dosage="call_dosage", covariates="sample_covariate", traits="sample_trait")
    out = sg.regenie_loco_regression(sg.regenie(regenie_dataset("gpu"), **args), **args, merge=False)
    for name in ("variant_linreg_beta", "variant_linreg_t_value", "variant_linreg_p_value"):
        assert B.backend_of(out[name].data) == "gpu", name
        np.testing.assert_allclose(B.to_numpy(out[name].data), REF[f"loco_True_{name}"], rtol=1e-10, atol=1e-13,
                                   err_msg=name)


# --- genee ---------------------------------------------------------------------------------------


def genee_dataset() -> xr.Dataset:
    return xr.Dataset({"beta": ("variants", REF["genee_beta"]), "window_start": ("windows", REF["genee_window_start"]),
                       "window_stop": ("windows", REF["genee_window_stop"])})


@pytest.mark.parametrize("ld_chunks", [None, 40])
def test_genee_as_sgkits(ld_chunks):
    pytest.importorskip("sklearn")
    ld = REF["genee_ld"] if ld_chunks is None else da.from_array(REF["genee_ld"], chunks=ld_chunks)
    df = sg.genee(genee_dataset(), ld)
    assert list(df.columns) == ["test_q", "q_var", "pval"]
    df = df.compute()
    np.testing.assert_array_equal(df.index.values, REF["genee_index"])
    for c in df.columns:
        assert df[c].dtype == np.float32
        np.testing.assert_allclose(df[c].values, REF[f"genee_{c}"], rtol=1e-6, err_msg=c)  # float32, as sgkit's


def test_genee_bad_input():
    ds = genee_dataset()
    with pytest.raises(InputError, match="genee: ld has shape \\(3, 3\\), expected \\(120, 120\\)"):
        sg.genee(ds, np.eye(3))
    with pytest.raises(InputError, match="genee: the dataset has no variable 'window_start'"):
        sg.genee(ds.drop_vars("window_start"), REF["genee_ld"])
    with pytest.raises(InputError, match="non-empty ranges of the 120 variants"):
        sg.genee(ds.assign(window_stop=ds.window_stop + 200), REF["genee_ld"])


@pytest.mark.gpu
@requires_gpu
def test_gpu_genee_as_sgkits():
    pytest.importorskip("sklearn")
    ld = B.to_backend(da.from_array(REF["genee_ld"], chunks=40), "gpu")
    df = sg.genee(genee_dataset(), ld).compute()
    for c in df.columns:
        np.testing.assert_allclose(df[c].values, REF[f"genee_{c}"], rtol=1e-6, err_msg=c)
