"""Where pipeline.genomics follows sgkit 0.10's small print, against sgkit's results
(``sgkit_compat_api.npz``, made by ``tests/fixtures/genomics/sgkit_compat_api.py``): the variables
the population genetics ops return, merged or not; pca's scaler and random states; the errors that
are sgkit's ``NotImplementedError`` / ``LinAlgError`` too."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline.errors import InputError, LinAlgInputError, NotImplementedInputError

from .conftest import requires_gpu
from .genomics_data import dataset, sgkit
from .test_genomics_pca import F64, OUTPUTS, complete_counts, pca_data

REF = sgkit("compat_api")
POPGEN = ("count_cohort_alleles", "diversity", "divergence", "Fst", "Tajimas_D")


def added(ds, windows: str, op: str, merge: bool) -> set[str]:
    src = ds if windows == "none" else sg.window_by_variant(ds, size=50)
    out = getattr(sg, op)(src, merge=merge)
    return set(map(str, out.data_vars)) - (set(map(str, src.data_vars)) if merge else set())


@pytest.mark.parametrize("windows", ["none", "v50"])
@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("op", POPGEN)
def test_popgen_returns_sgkits_variables(op, merge, windows):
    """Merged, sgkit's result holds every variable it computed on the way, call_allele_count
    among them; alone, the statistic only."""
    assert added(dataset("bi", {"variants": 37}), windows, op, merge) == set(REF[f"{op}_{merge}_{windows}_added"])


def test_added_call_allele_count_is_sgkits_and_costs_nothing_unless_computed():
    ds = dataset("bi", {"variants": 37, "samples": 25})
    out = sg.Tajimas_D(ds)
    # the statistic's graph does not go through the per-call counts
    assert out["call_allele_count"].data.name not in dict(out["stat_Tajimas_D"].data.__dask_graph__())
    assert out["call_allele_count"].dtype == np.uint8
    np.testing.assert_array_equal(out["call_allele_count"].values, REF["call_allele_count"])
    np.testing.assert_array_equal(out["variant_allele_count"].values, REF["variant_allele_count"])
    # given, it is the user's, not replaced
    given = ds.assign(call_allele_count=out["call_allele_count"] + np.uint8(0))
    for op in POPGEN:
        assert getattr(sg, op)(given)["call_allele_count"].data.name == given["call_allele_count"].data.name, op


# --- pca: scaler and random_state -----------------------------------------------------------------


def assert_sgkits(out, run: str):
    for name in OUTPUTS:
        a = B.to_numpy(out[f"sample_pca_{name}"].data).astype(np.float64)
        e = REF[f"pca_{run}_{name}"]
        assert a.shape == e.shape, name
        if a.ndim == 2:
            a = a * np.where((a * e).sum(axis=0) < 0, -1.0, 1.0)
        scale = np.abs(e).max(axis=0) if a.ndim == 2 else np.abs(e)
        assert (np.abs(a - e) <= F64 * scale).all(), (run, name)


def test_pca_takes_a_scikit_learn_scaler_as_sgkit():
    """sgkit 0.10 takes an estimator and scales as Patterson's all the same: so here, with a warning."""
    preprocessing = pytest.importorskip("sklearn.preprocessing")
    with pytest.warns(UserWarning, match="StandardScaler.* is not applied"):
        out = sg.pca(pca_data(np.float64), n_components=4, scaler=preprocessing.StandardScaler(), merge=False)
    assert_sgkits(out.compute(), "standard_scaler")


@pytest.mark.parametrize("scaler", ["", None, "patterson"])
def test_pca_patterson_names(scaler):
    out = sg.pca(pca_data(np.float64), n_components=4, scaler=scaler, merge=False).compute()
    np.testing.assert_allclose(out["sample_pca_component"].values, REF["pca_standard_scaler_component"], atol=1e-12)


@pytest.mark.parametrize(
    "run,make,n_iter",
    [
        ("int_state", lambda: 3, 0),
        ("numpy_generator", lambda: np.random.default_rng(3), 0),
        ("dask_generator", lambda: da.random.default_rng(3), 0),
        ("dask_random_state", lambda: da.random.RandomState(5), 1),
    ],
)
def test_pca_random_states_as_sgkits(run, make, n_iter):
    n = REF[f"pca_{run}_component"].shape[1]
    out = sg.pca(pca_data(np.float64), n_components=n, algorithm="randomized", n_iter=n_iter,
                 random_state=make(), merge=False)
    assert_sgkits(out.compute(), run)


@pytest.mark.parametrize("scaler,match", [(object(), "'patterson' or a scikit-learn estimator"),
                                          ("standard", "only the 'patterson' scaler")])
def test_pca_refuses_other_scalers(scaler, match):
    with pytest.raises(InputError, match=match):
        sg.pca(pca_data(np.float64), n_components=3, scaler=scaler)


@pytest.mark.parametrize("state,match", [(np.random.RandomState(3), "numpy.random.RandomState"),
                                         ("seed", "random_state` must be")])
def test_pca_refuses_random_states_dask_cannot_draw_from(state, match):
    """sgkit fails on a NumPy RandomState with dask's TypeError; here it is bad input, named."""
    assert str(REF["pca_numpy_random_state_error"]).startswith("TypeError")
    with pytest.raises(InputError, match=match):
        sg.pca(pca_data(np.float64), n_components=3, algorithm="randomized", random_state=state)


# --- errors that are sgkit's too ------------------------------------------------------------------


def test_flat_variants_are_a_linalg_error_as_sgkits():
    """Where sgkit's SVD fails with LinAlgError (a variant with no variation), the error is both."""
    counts, _ = complete_counts()
    counts = counts.copy()
    counts[4] = 0
    ds = pca_data(np.int16).assign(call_alternate_allele_count=(("variants", "samples"), counts))
    for algorithm in ("tsqr", "randomized"):
        out = sg.pca(ds, n_components=3, algorithm=algorithm)
        with pytest.raises(np.linalg.LinAlgError, match="1 variants with no variation"):
            out["sample_pca_projection"].compute()
        with pytest.raises(InputError, match="1 variants with no variation"):
            out["sample_pca_projection"].compute()


def test_error_classes_are_both():
    assert issubclass(NotImplementedInputError, NotImplementedError) and issubclass(NotImplementedInputError, InputError)
    assert issubclass(LinAlgInputError, np.linalg.LinAlgError) and issubclass(LinAlgInputError, InputError)
    with pytest.raises(NotImplementedError):
        raise NotImplementedInputError("x")


@pytest.mark.parametrize("error", [NotImplementedError, InputError])
def test_what_sgkit_has_not_implemented_is_both_errors(error):
    """sgkit raises NotImplementedError for the HWE test of more than two alleles or another ploidy
    (hwe.py) and for a distance metric it lacks (distance/api.py): an ``except`` of either class
    catches pipeline's, and the CLI still exits 2 (an InputError)."""
    multi = dataset("multi")
    with pytest.raises(error, match="biallelic"):
        sg.hardy_weinberg_test(multi)
    with pytest.raises(error, match="diploid"):
        sg.hardy_weinberg_test(multi, ploidy=3, alleles=2)
    with pytest.raises(error, match="metric"):
        sg.pairwise_distance(da.ones((4, 3), chunks=2), metric="chebyshev")


# --- GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
def test_gpu_popgen_returns_sgkits_variables():
    ds = dataset("bi", {"variants": 37}, "gpu")
    for op in POPGEN:
        for merge in (True, False):
            assert added(ds, "none", op, merge) == set(REF[f"{op}_{merge}_none_added"]), (op, merge)
    out = sg.Tajimas_D(ds)
    assert B.backend_of(out["call_allele_count"].data) == "gpu"
    np.testing.assert_array_equal(B.to_numpy(out["call_allele_count"].data.compute()), REF["call_allele_count"])


@pytest.mark.gpu
@requires_gpu
def test_gpu_pca_random_state_as_sgkits():
    out = sg.pca(pca_data(np.float64, backend="gpu"), n_components=3, algorithm="randomized", n_iter=1,
                 random_state=da.random.RandomState(5), merge=False)
    assert B.backend_of(out["sample_pca_component"].data) == "gpu"
    with dask.config.set(scheduler="threads"):
        assert_sgkits(out.compute(), "dask_random_state")
