"""Garud's H, PBS, Weir and Goudet's beta (pipeline.ops.genomics.popgen) and the relatedness
matrices (pipeline.ops.genomics.relatedness) against sgkit 0.10's results on the shared data
(``tests/fixtures/genomics/sgkit_b.py`` made ``sgkit_b.npz``).

The data have missing calls (whole, one allele, fill), multi-allelic sites and 60 samples; our
side runs on blocks of 100 variants and all samples, and of 37 variants and 25 samples (blocks
boundaries inside windows, tiles of samples whose products add up). Every result is float64 on
both sides: rtol 1e-10.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline.errors import InputError, NotImplementedInputError

from .conftest import BACKENDS, raise_if_dask_computes, requires_gpu
from .genomics_data import dataset, sgkit

RTOL, ATOL = 1e-10, 1e-12
REF = sgkit("b")
CHUNKINGS = [(100, -1), (37, 25)]
WINDOWS = {"v50": ("window_by_variant", {"size": 50}), "v37s20": ("window_by_variant", {"size": 37, "step": 20})}


def data(kind: str, how: str = "pop", chunks=(100, -1), backend: str = "cpu") -> xr.Dataset:
    ds = dataset(kind, {"variants": chunks[0], "samples": chunks[1]}, backend)
    # cohorts in memory: sgkit's Garud_H reads them when called (so here too)
    cohort = B.to_numpy(ds["sample_cohort"].data.compute()) if how == "pop" else np.arange(ds.sizes["samples"]) % 5 - 1
    return ds.assign(sample_cohort=("samples", cohort))


def windowed(ds, kind: str, wname: str) -> xr.Dataset:
    if wname == "p":
        return sg.window_by_position(ds, size=10_000 if kind == "bi" else 500)
    fn, params = WINDOWS[wname]
    return getattr(sg, fn)(ds, **params)


def check(got: xr.DataArray, ref_name: str, backend: str, dims: tuple[str, ...]) -> None:
    assert got.dims == dims
    assert got.dtype == np.float64
    assert B.backend_of(got.data) == backend
    values = B.to_numpy(got.data.compute() if hasattr(got.data, "compute") else got.data)
    ref = REF[ref_name]
    assert values.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(values), np.isnan(ref), err_msg=ref_name)
    np.testing.assert_allclose(values, ref, rtol=RTOL, atol=ATOL, equal_nan=True, err_msg=ref_name)


def dosages(ds: xr.Dataset, chunks) -> xr.Dataset:
    """The fixture's dosages: allele 1 counted in complete calls (NaN in the others), in every call
    (uint8), and their ancestral frequency."""
    g = B.to_numpy(ds["call_genotype"].data.compute())
    alt = (g == 1).sum(axis=2)
    dosage = np.where((g >= 0).all(axis=2), alt, np.nan)
    out = ds.assign(call_dosage=(("variants", "samples"), dosage), dosage_int=(("variants", "samples"), alt.astype(np.uint8)),
                    af=("variants", np.nanmean(dosage, axis=1) / 2))
    return out.chunk({"variants": chunks[0], "samples": chunks[1]})


# --- Garud's H and PBS ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("kind,how", [("bi", "pop"), ("multi", "some")])
@pytest.mark.parametrize("wname", ["v50", "v37s20", "p"])
def test_garud_h_is_sgkits(backend, chunks, kind, how, wname):
    ds = windowed(data(kind, how, chunks, backend), kind, wname)
    with raise_if_dask_computes():  # lazy, as sgkit's
        out = sg.Garud_H(ds)
    for stat in ("h1", "h12", "h123", "h2_h1"):
        check(out[f"stat_Garud_{stat}"], f"{kind}_{how}_{wname}_garud_{stat}", backend, ("windows", "cohorts"))
        assert out[f"stat_Garud_{stat}"].attrs["comment"]
    assert "call_genotype" in out  # merged
    if wname == "v50":
        one = sg.Garud_H(ds, cohorts=[1], merge=False)
        assert set(one.data_vars) == {"stat_Garud_h1", "stat_Garud_h12", "stat_Garud_h123", "stat_Garud_h2_h1"}
        check(one["stat_Garud_h12"], f"{kind}_{how}_{wname}_garud_c1_h12", backend, ("windows", "cohorts"))


def test_garud_h_takes_cohort_labels_and_refuses_bad_input():
    ds = windowed(data("bi"), "bi", "v50").assign_coords(cohorts=["A", "B", "C"])
    out = sg.Garud_H(ds, cohorts=["B"], merge=False)
    np.testing.assert_allclose(out["stat_Garud_h12"].values, REF["bi_pop_v50_garud_c1_h12"], rtol=RTOL, equal_nan=True)
    with pytest.raises(InputError, match="Garud_H: the dataset has no windows"):
        sg.Garud_H(data("bi"))
    with pytest.raises(InputError, match="cohort 'D' is not one of the dataset's cohort labels"):
        sg.Garud_H(ds, cohorts=["D"])
    with pytest.raises(InputError, match="cohort 7 is not a cohort number from 0 to 2"):
        sg.Garud_H(ds, cohorts=[7])
    haploid = windowed(data("bi").isel(ploidy=[0]), "bi", "v50")
    with pytest.raises(NotImplementedError, match="diploid genotypes only, not ploidy 1") as e:
        sg.Garud_H(haploid)
    assert isinstance(e.value, NotImplementedInputError)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_pbs_is_sgkits(backend, chunks):
    dims = ("windows", "cohorts_0", "cohorts_1", "cohorts_2")
    out = sg.pbs(data("bi", "pop", chunks, backend))
    check(out["stat_pbs"], "bi_pop_none_pbs", backend, dims)
    assert {"stat_Fst", "stat_divergence", "cohort_allele_count", "call_allele_count"} <= set(out.data_vars)
    for kind, how in (("bi", "pop"), ("multi", "some")):
        ds = data(kind, how, chunks, backend)
        check(sg.pbs(windowed(ds, kind, "v50"))["stat_pbs"], f"{kind}_{how}_v50_pbs", backend, dims)
    some = windowed(data("multi", "some", chunks, backend), "multi", "v37s20")
    check(sg.pbs(some, cohorts=[(0, 1, 2), (3, 1, 0)], merge=False)["stat_pbs"], "multi_some_v37s20_pbs_some", backend, dims)


def test_pbs_takes_cohort_labels_and_refuses_bad_triples():
    ds = data("multi", "some").assign_coords(cohorts_0=["a", "b", "c", "d"])
    w = windowed(ds, "multi", "v37s20")
    got = sg.pbs(w, cohorts=[("a", "b", "c"), ("d", "b", "a")], merge=False)["stat_pbs"].values
    np.testing.assert_allclose(got, REF["multi_some_v37s20_pbs_some"], rtol=RTOL, equal_nan=True)
    # sgkit's loop writes out of its array for a cohort past the last (a crash): here an error
    with pytest.raises(InputError, match="pbs: cohort 3 is not a cohort number from 0 to 2"):
        sg.pbs(data("bi"), cohorts=[(0, 1, 3)])
    with pytest.raises(InputError, match="pbs: cohorts must be tuples of 3 cohorts"):
        sg.pbs(data("bi"), cohorts=[(0, 1)])
    with pytest.raises(InputError, match="pbs: the dataset has no variable 'fst'"):
        sg.pbs(data("bi"), stat_Fst="fst")


# --- identity by state, Weir and Goudet's beta ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("kind", ["bi", "multi"])
def test_identity_by_state_is_sgkits(backend, chunks, kind):
    ds = data(kind, chunks=chunks, backend=backend)
    dims = ("samples_0", "samples_1")
    with raise_if_dask_computes():
        out = sg.identity_by_state(ds)
    check(out["stat_identity_by_state"], f"{kind}_ibs", backend, dims)
    # merged as sgkit's: the call allele counts and frequencies it defines on its way
    assert out["call_allele_frequency"].dims == ("variants", "samples", "alleles")
    assert out["call_allele_count"].dtype == np.uint8 and out["call_allele_frequency"].dtype == np.float64
    again = sg.identity_by_state(out.drop_vars("stat_identity_by_state"), merge=False)  # from the frequencies
    check(again["stat_identity_by_state"], f"{kind}_ibs", backend, dims)
    check(sg.identity_by_state(ds, skipna=False, merge=False)["stat_identity_by_state"], f"{kind}_ibs_nan", backend, dims)
    if kind == "multi":
        check(sg.identity_by_state(ds, method="matching", merge=False)["stat_identity_by_state"],
              f"{kind}_ibs_matching", backend, dims)
    with raise_if_dask_computes():
        beta = sg.Weir_Goudet_beta(ds)
    check(beta["stat_Weir_Goudet_beta"], f"{kind}_wgb", backend, dims)
    assert "stat_identity_by_state" in beta


def test_identity_by_state_refuses_bad_input():
    ds = data("bi")
    with pytest.raises(InputError, match="identity_by_state: unknown method 'nope'"):
        sg.identity_by_state(ds, method="nope")
    with pytest.raises(InputError, match="identity_by_state: the dataset has no variable 'af'"):
        sg.identity_by_state(ds, call_allele_frequency="af")
    with pytest.raises(InputError, match="variable 'call_genotype' has values of type float64"):
        sg.identity_by_state(ds.assign(call_genotype=ds["call_genotype"].astype(float)), method="matching")
    with pytest.raises(InputError, match="Weir_Goudet_beta: the dataset has no variable 'ibs'"):
        sg.Weir_Goudet_beta(ds, stat_identity_by_state="ibs")


# --- genomic relationship -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("kind", ["bi", "multi"])
def test_genomic_relationship_is_sgkits(backend, chunks, kind):
    ds = dosages(data(kind, chunks=chunks), chunks)
    if backend != "cpu":
        ds = ds.assign({n: (ds[n].dims, B.to_backend(ds[n].data, backend)) for n in ("call_dosage", "dosage_int", "af")})
    dims = ("samples_0", "samples_1")
    grm = "stat_genomic_relationship"
    with raise_if_dask_computes():
        out = sg.genomic_relationship(ds, ancestral_frequency="af", skipna=True)
    check(out[grm], f"{kind}_grm_vr_skipna", backend, dims)
    ej = sg.genomic_relationship(ds, call_dosage="dosage_int", ancestral_frequency="af", estimator="Endelman-Jannink")
    check(ej[grm], f"{kind}_grm_ej", backend, dims)
    if kind == "bi":
        check(sg.genomic_relationship(ds, call_dosage="dosage_int", ancestral_frequency="af")[grm],
              f"{kind}_grm_vr", backend, dims)
        check(sg.genomic_relationship(ds, call_dosage="dosage_int", ancestral_frequency="af", ploidy=4)[grm],
              f"{kind}_grm_vr_p4", backend, dims)


def test_genomic_relationship_refuses_bad_input():
    ds = dosages(data("bi"), (100, -1))
    with pytest.raises(InputError, match="requires the 'ancestral_frequency' argument"):
        sg.genomic_relationship(ds)
    with pytest.raises(InputError, match="unknown estimator 'Martini'"):
        sg.genomic_relationship(ds, ancestral_frequency="af", estimator="Martini")
    with pytest.raises(InputError, match=r"variable 'sample_cohort' has shape \(60,\), expected one value per variant"):
        sg.genomic_relationship(ds, ancestral_frequency="sample_cohort")
    with pytest.raises(NotImplementedError, match="skipna is not implemented for the 'Endelman-Jannink'"):
        sg.genomic_relationship(ds, ancestral_frequency="af", estimator="Endelman-Jannink", skipna=True)
    with pytest.raises(InputError, match="ploidy must be given"):
        sg.genomic_relationship(ds.drop_dims("ploidy"), ancestral_frequency="af")
    with pytest.raises(InputError, match="the dataset has no variable 'dosage'"):
        sg.genomic_relationship(ds, call_dosage="dosage", ancestral_frequency="af")


def test_relatedness_products_are_summed_in_tiles():
    """Tiles of samples (``TILE``) smaller than the samples: the products add up, below the
    diagonal mirrored from above, to the matrix of one tile."""
    from pipeline.ops.genomics import relatedness

    ds = data("multi", chunks=(37, 25))
    whole = sg.identity_by_state(ds, merge=False)["stat_identity_by_state"].values
    old = relatedness.TILE
    relatedness.TILE = 16
    try:
        tiled = sg.identity_by_state(ds, merge=False)["stat_identity_by_state"]
        assert tiled.data.numblocks == (4, 4)
        (values,) = dask.compute(tiled.data)
    finally:
        relatedness.TILE = old
    np.testing.assert_allclose(values, whole, rtol=1e-13)
    np.testing.assert_allclose(values, REF["multi_ibs"], rtol=RTOL)


# --- PC-Relate ----------------------------------------------------------------------------------------


def with_pcs(ds: xr.Dataset) -> xr.Dataset:
    """The fixture's sample PCs: three normal columns (float64 on both sides)."""
    return ds.assign(sample_pca_projection=(("samples", "components"), np.random.default_rng(7).normal(size=(60, 3))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_pc_relate_is_sgkits(backend, chunks):
    ds = with_pcs(data("bi", chunks=chunks, backend=backend))
    for maf in (0.01, 0.2):
        with raise_if_dask_computes():
            out = sg.pc_relate(ds, maf=maf)
        check(out["pc_relate_phi"], f"pc_relate_{maf}", backend, ("samples_0", "samples_1"))
        assert out["pc_relate_phi"].attrs["comment"] == "PC Relate kinship coefficient matrix."
        assert "call_genotype" in out


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_pc_relate_values_kernels_equal_the_formulas(dtype):
    """The CUDA C kernels of PC-Relate's per-call values (``cuda/relatedness.cu``) against the CPU's
    formulas: masked calls (a variant with all of them masked: its mean is NaN), values of mu near
    the ``maf`` bounds, more samples than a block's threads. The products with the basis are
    cuBLAS's against BLAS's, so the values agree to rounding, and the zeros are the same."""
    import cupy

    from pipeline.kernels import relatedness as K

    rng = np.random.default_rng(9)
    for v, s in ((37, 13), (300, 1001)):
        g = rng.integers(0, 2, size=(v, s, 2)).astype(dtype)
        mask = rng.random((v, s, 2)) < 0.05
        mask[3] = True  # a variant with no call
        g[mask] = -1
        pcs = np.c_[np.ones(s), rng.normal(size=(s, 3))]
        q = np.linalg.qr(pcs)[0]
        for maf in (0.01, 0.3):
            want = K.pc_relate_values_cpu(g, mask, q, maf=maf)
            got = cupy.asnumpy(K.pc_relate_values_gpu(cupy.asarray(g), cupy.asarray(mask), cupy.asarray(q), maf=maf))
            assert got.shape == want.shape == (v, s, 2)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, equal_nan=True)
            assert ((got == 0) == (want == 0)).mean() > 0.999


def test_pc_relate_refuses_bad_input():
    ds = with_pcs(data("bi"))
    with pytest.raises(InputError, match="pc_relate: maf must be between 0 and 1"):
        sg.pc_relate(ds, maf=0)
    with pytest.raises(InputError, match="biallelic genotypes only, not 3 alleles"):
        sg.pc_relate(with_pcs(data("multi")))
    with pytest.raises(InputError, match="diploid genotypes only, not ploidy 1"):
        sg.pc_relate(ds.isel(ploidy=[0]))
    with pytest.raises(InputError, match="pc_relate: the dataset has no variable 'sample_pca_projection'"):
        sg.pc_relate(data("bi"))
    with pytest.raises(InputError, match="variable 'call_genotype_mask' has values of type int8, expected booleans"):
        sg.pc_relate(ds.assign(call_genotype_mask=ds["call_genotype"]))


# --- inverse and hybrid relationship matrices -------------------------------------------------------------

PED = np.array([
    [1.0, 0.0, 0.0, 0.5, 0.0, 0.25],
    [0.0, 1.0, 0.0, 0.5, 0.5, 0.5],
    [0.0, 0.0, 1.0, 0.0, 0.5, 0.25],
    [0.5, 0.5, 0.0, 1.0, 0.25, 0.625],
    [0.0, 0.5, 0.5, 0.25, 1.0, 0.625],
    [0.25, 0.5, 0.25, 0.625, 0.625, 1.125],
])
GENOMIC = {"last": [False, False, False, True, True, True], "first": [True, True, True, False, False, False],
           "mixed": [True, False, True, False, True, True]}
SCALES = [(1.0, 1.0), (1.5, 1.0), (1.2, 0.7)]


def matrices(backend: str, **arrays) -> xr.Dataset:
    import dask.array as da

    return xr.Dataset({k: (("samples_0", "samples_1"), B.to_backend(da.from_array(v, chunks=3), backend))
                       for k, v in arrays.items()})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", [*GENOMIC, "all"])
def test_hybrid_and_inverse_matrices_are_sgkits(backend, where):
    dims = ("samples_0", "samples_1")
    m = matrices(backend, ped=PED, grm=REF["grm6"])
    subset = {}
    if where != "all":
        m["genomic_sample"] = ("samples", np.array(GENOMIC[where]))
        subset = {"genomic_sample": "genomic_sample"}
        check(sg.invert_relationship_matrix(m, relationship="ped", subset_sample="genomic_sample")[
            "stat_inverse_relationship"], f"ped_inv_{where}", backend, dims)
        check(sg.invert_relationship_matrix(m, relationship="grm", subset_sample="genomic_sample")[
            "stat_inverse_relationship"], f"grm_inv_{where}", backend, dims)
    inverse = sg.invert_relationship_matrix(m, relationship="ped")
    check(inverse["stat_inverse_relationship"], "ped_inv", backend, dims)
    assert {"ped", "grm"} <= set(inverse.data_vars)
    grm_inv = np.linalg.inv(REF["grm6"]) if where == "all" else REF[f"grm_inv_{where}"]
    inv = matrices(backend, ped_inv=REF["ped_inv"], grm_inv=grm_inv,
                   ped_sub_inv=REF["ped_inv" if where == "all" else f"ped_inv_{where}"])
    m = m.merge(inv)
    for tau, omega in SCALES:
        h = sg.hybrid_relationship(m, genomic_relationship="grm", pedigree_relationship="ped", tau=tau, omega=omega,
                                   **subset)
        check(h["stat_hybrid_relationship"], f"hybrid_{where}_{tau}_{omega}", backend, dims)
        hi = sg.hybrid_inverse_relationship(m, genomic_inverse_relationship="grm_inv",
                                            pedigree_inverse_relationship="ped_inv",
                                            pedigree_subset_inverse_relationship="ped_sub_inv",
                                            tau=tau, omega=omega, merge=False, **subset)
        assert list(hi.data_vars) == ["stat_hybrid_inverse_relationship"]
        check(hi["stat_hybrid_inverse_relationship"], f"hybrid_inv_{where}_{tau}_{omega}", backend, dims)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_singular_matrix_is_refused_on_both_backends(backend):
    """A relationship matrix without full rank: NumPy's LU meets a zero pivot and raises; CuPy's
    would give NaN without a word, unless asked to raise (``backend.linalg_raises``)."""
    singular = np.ones((6, 6))
    singular[2:, 2:] += np.eye(4)  # rank 5: rows 0 and 1 equal
    m = matrices(backend, singular=singular)
    with pytest.raises(np.linalg.LinAlgError, match="invert_relationship_matrix: the relationship matrix cannot"):
        sg.invert_relationship_matrix(m, relationship="singular")["stat_inverse_relationship"].compute()


def test_relationship_matrices_refuse_bad_input():
    m = matrices("cpu", ped=PED, grm=REF["grm6"], singular=np.ones((6, 6)))
    m["small"] = (("samples_2", "samples_3"), np.eye(5))
    # a singular matrix: numpy's LinAlgError, as sgkit's, and an InputError (exit 2)
    with pytest.raises(np.linalg.LinAlgError, match="invert_relationship_matrix: the relationship matrix cannot be inverted"):
        sg.invert_relationship_matrix(m, relationship="singular")["stat_inverse_relationship"].compute()
    with pytest.raises(InputError, match="cannot be inverted"):
        sg.invert_relationship_matrix(m, relationship="singular")["stat_inverse_relationship"].compute()
    with pytest.raises(InputError, match=r"variable 'small' has dimensions \('samples_2', 'samples_3'\)"):
        sg.invert_relationship_matrix(m, relationship="small")
    with pytest.raises(InputError, match="hybrid_relationship: unknown estimator 'VanRaden'"):
        sg.hybrid_relationship(m, genomic_relationship="grm", pedigree_relationship="ped", estimator="VanRaden")
    with pytest.raises(InputError, match="pedigree_relationship must name"):
        sg.hybrid_relationship(m, genomic_relationship="grm")
    m["genomic_sample"] = ("samples", np.array(GENOMIC["mixed"]))
    with pytest.raises(InputError, match="pedigree_subset_inverse_relationship is required"):
        sg.hybrid_inverse_relationship(m, genomic_inverse_relationship="grm", pedigree_inverse_relationship="ped",
                                       genomic_sample="genomic_sample")
    m["short"] = ("few", np.ones(4, dtype=bool))
    with pytest.raises(InputError, match=r"variable 'short' has shape \(4,\), expected one boolean per sample \(6,\)"):
        sg.invert_relationship_matrix(m, relationship="ped", subset_sample="short")
