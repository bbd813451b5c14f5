"""pca's ``n_oversamples``: the width of the randomized SVD's subspace (dask's ``svd_compressed``
argument of that name), against the exact eigenvalues of the Patterson-scaled counts, on
genotypes of three populations whose eigenvalues past the first two are a flat noise floor."""

from __future__ import annotations

import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import raise_if_dask_computes, requires_gpu

K = 10
N_ITER = 8


def structured_counts(n_samples=300, n_variants=1000, fst=0.1, seed=0) -> np.ndarray:
    """Alternate allele counts (variants, samples), int8, of three populations drawn by
    Balding and Nichols's model from one ancestral frequency a variant; the variants that do not
    vary dropped (Patterson's scale is 0 there)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, n_variants)
    freqs = rng.beta(p * (1 - fst) / fst, (1 - p) * (1 - fst) / fst, size=(3, n_variants)).T
    counts = rng.binomial(2, freqs[:, np.arange(n_samples) % 3]).astype(np.int8)
    return counts[counts.min(axis=1) < counts.max(axis=1)]


COUNTS = structured_counts()


def counts_dataset(backend="cpu") -> xr.Dataset:
    ac = B.to_backend(da.from_array(COUNTS, chunks=(250, -1)), backend)
    return xr.Dataset({"call_alternate_allele_count": (("variants", "samples"), ac)})


def exact_explained_variance() -> np.ndarray:
    """NumPy's eigenvalues of the Patterson-scaled counts' Gram matrix over the samples: the
    explained variance of each component is ``s^2 / n`` (the projections have mean 0)."""
    x = COUNTS.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    p = mean / 2
    scaled = (x - mean) / np.sqrt(p * (1 - p))
    eig = np.linalg.eigvalsh(scaled.T @ scaled)[::-1][:K]
    return eig / x.shape[1]


def explained(**params) -> np.ndarray:
    out = sg.pca(counts_dataset(), n_components=K, ploidy=2, algorithm="randomized", n_iter=N_ITER, merge=False,
                 **params)
    return out["sample_pca_explained_variance"].values.astype(np.float64)


def test_a_wider_subspace_gives_the_exact_eigenvalues():
    """With 8 power iterations, dask's subspace of 20 leaves the noise eigenvalues (3 to 10) up to
    4 % below the exact ones here (measured); one of 60 brings all ten within 0.1 %."""
    exact = exact_explained_variance()
    assert exact[1] > 5 * exact[2]  # two axes of population structure, then the noise floor
    assert exact[2] < 1.15 * exact[K - 1]
    default = np.abs(explained() - exact) / exact
    wide = np.abs(explained(n_oversamples=50) - exact) / exact
    assert default[:2].max() < 1e-3 and default.max() > 0.01
    assert wide.max() < 0.005
    assert wide[2:].max() < default[2:].max() / 10


def test_none_is_dasks_subspace_bit_for_bit():
    """None and 10 are dask's and sgkit's subspace (max(20, k + 10)): the very results of a call
    without the argument, which the sgkit-equality tests of test_genomics_pca.py hold."""
    without = sg.pca(counts_dataset(), n_components=3, ploidy=2, algorithm="randomized", n_iter=2).compute()
    for n_oversamples in (None, 10):
        got = sg.pca(counts_dataset(), n_components=3, ploidy=2, algorithm="randomized", n_iter=2,
                     n_oversamples=n_oversamples).compute()
        xr.testing.assert_identical(got, without)


def test_the_subspace_is_at_most_the_data():
    """A subspace wider than the samples is cut to them, as dask cuts it: the exact eigenvalues,
    and the same results for any width above."""
    exact = exact_explained_variance()
    with raise_if_dask_computes():
        out = sg.pca(counts_dataset(), n_components=K, ploidy=2, algorithm="randomized", n_oversamples=1000,
                     merge=False)
    got = out["sample_pca_explained_variance"].values.astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=1e-5)
    again = explained(n_oversamples=5000)
    np.testing.assert_allclose(again, got, rtol=1e-5)


def test_tsqr_takes_it_with_no_effect():
    """The exact algorithm has no subspace: the argument changes nothing there."""
    base = sg.pca(counts_dataset(), n_components=4, ploidy=2).compute()
    got = sg.pca(counts_dataset(), n_components=4, ploidy=2, n_oversamples=50).compute()
    xr.testing.assert_identical(got, base)


@pytest.mark.parametrize("algorithm", ["randomized", "tsqr"])
@pytest.mark.parametrize("value", [-1, 2.5, True, "50"])
def test_invalid_values_are_refused(algorithm, value):
    with pytest.raises(InputError, match=r"`n_oversamples` must be a non-negative integer or None, got"):
        sg.pca(counts_dataset(), n_components=3, ploidy=2, algorithm=algorithm, n_oversamples=value)


def test_a_flow_takes_it(tmp_path):
    """``n_oversamples`` in a flow's pca step: the same eigenvalues as the Python call; a negative
    value is exit code 2 naming the argument, and no output is written."""
    store = tmp_path / "counts.zarr"
    counts_dataset().to_zarr(store)

    def run(n_oversamples, out):
        flow = {
            "name": "pca-wide",
            "source": {"path": str(store), "variables": ["call_alternate_allele_count"]},
            "steps": [{"op": "pca", "params": {"n_components": K, "ploidy": 2, "algorithm": "randomized",
                                               "n_iter": N_ITER, "n_oversamples": n_oversamples}}],
            "sink": {"path": str(out), "variables": ["sample_pca_explained_variance"]},
        }
        path = tmp_path / f"flow-{n_oversamples}.yaml"
        path.write_text(yaml.safe_dump(flow))
        return subprocess.run([sys.executable, "-m", "pipeline", "run", str(path), "--backend", "cpu"],
                              capture_output=True, text=True, timeout=120)

    proc = run(50, tmp_path / "wide.zarr")
    assert proc.returncode == 0, proc.stderr
    got = xr.open_zarr(tmp_path / "wide.zarr")["sample_pca_explained_variance"].values
    np.testing.assert_allclose(got, explained(n_oversamples=50), rtol=1e-6)
    proc = run(-1, tmp_path / "bad.zarr")
    assert proc.returncode == 2
    assert "`n_oversamples` must be a non-negative integer or None, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "bad.zarr").exists()


@pytest.mark.gpu
@requires_gpu
def test_a_wider_subspace_on_the_gpu_equals_the_cpu():
    params = dict(n_components=K, ploidy=2, algorithm="randomized", n_iter=2, n_oversamples=50)
    gpu = sg.pca(counts_dataset("gpu"), **params)
    assert B.backend_of(gpu["sample_pca_explained_variance"].data) == "gpu"
    cpu = sg.pca(counts_dataset("cpu"), **params).compute()
    np.testing.assert_allclose(B.to_numpy(gpu["sample_pca_explained_variance"].data),
                               cpu["sample_pca_explained_variance"].values, rtol=1e-5)
