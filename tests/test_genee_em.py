"""``genee``'s variance of the null effects (``_genee_em``) where the best mixture has a single
component, against scikit-learn's own fit: sgkit raises ``IndexError`` there (it indexes a 0-d
array), pipeline returns that component's variance."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline.ops.genomics.association import _genee_em


def one_component_betas() -> np.ndarray:
    # normal effects: the mixture of one component has the lowest BIC
    return np.random.default_rng(0).normal(0, 0.05, (4000, 1))


def test_genee_em_one_component_is_its_variance():
    mixture = pytest.importorskip("sklearn.mixture")
    betas = one_component_betas()
    bics = [mixture.GaussianMixture(n_components=k, reg_covar=1e-6, random_state=0).fit(betas).bic(betas)
            for k in range(1, 10)]
    assert int(np.argmin(bics)) == 0  # the case under test
    one = mixture.GaussianMixture(n_components=1, reg_covar=1e-6, random_state=0).fit(betas)
    assert _genee_em(betas, 1e-6) == one.covariances_.item()
    # the variance of the effects, up to the regularization
    assert abs(_genee_em(betas, 1e-6) - betas.var()) < 1e-5


def test_genee_with_one_component():
    pytest.importorskip("sklearn")
    betas = one_component_betas()[:200, 0]
    n = betas.size
    ds = xr.Dataset({"beta": ("variants", betas), "window_start": ("windows", [0, 50]),
                     "window_stop": ("windows", [50, 200])})
    df = sg.genee(ds, np.eye(n)).compute()
    epsilon = _genee_em(betas[:, None], 1e-6)
    # with the identity as LD, a window's q is its sum of squared effects, and its variance that
    # of as many chi-squares of weight epsilon
    np.testing.assert_allclose(df["test_q"].values, [np.sum(betas[:50] ** 2), np.sum(betas[50:] ** 2)], rtol=1e-6)
    np.testing.assert_allclose(df["q_var"].values, [50 * epsilon**2, 150 * epsilon**2], rtol=1e-6)
    assert np.all((df["pval"].values > 0) & (df["pval"].values <= 1))
