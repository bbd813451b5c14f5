"""The NumPy pedigree functions (``ops/genomics/_pedigree_plain.py``: diploid kinship, inbreeding,
inverse kinship, the "even" contributions) against sgkit's Numba loops that they replace up to
``PLAIN_MATRIX_SAMPLES`` samples: the same values bit for bit (the inverse within 1e-12), the same
errors, and no Numba imported by the four functions on a small pedigree."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline.errors import InputError
from pipeline.ops.genomics import _pedigree_plain as plain, pedigree as P


def loops() -> dict:
    return P._kernels()


def shuffled(parent, rng):
    """``parent`` with its samples stored in a random order (children before parents)."""
    perm = rng.permutation(len(parent))
    new = np.argsort(perm)
    return np.where(parent >= 0, new[np.maximum(parent, 0)], -1)[perm]


def random_pedigree(n, seed, founders=0.1, half=0.0, chain=False, shuffle=False):
    """``n`` samples, the first ``founders`` of them founders, each later sample's parents among the
    samples before it (the one just before, with ``chain``), one of them unknown with probability
    ``half``."""
    rng = np.random.default_rng(seed)
    parent = np.full((n, 2), -1, np.int64)
    first = max(1, int(n * founders))
    i = np.arange(first, n)
    parent[i, 0] = i - 1 if chain else rng.integers(0, i)
    parent[i, 1] = rng.integers(0, i)
    unknown = rng.random(len(i)) < half
    parent[i[unknown], rng.integers(0, 2, unknown.sum())] = -1
    return shuffled(parent, rng) if shuffle else parent


PEDIGREES = {
    "sorted": (random_pedigree(60, 0), False),
    "out of order": (random_pedigree(80, 1, shuffle=True), False),
    "many founders": (random_pedigree(50, 2, founders=0.5, shuffle=True), False),
    "half-founders": (random_pedigree(70, 3, half=0.2, shuffle=True), True),
    "deep chain": (random_pedigree(150, 4, founders=0.01, chain=True), False),
    "deep chain out of order": (random_pedigree(150, 5, founders=0.01, chain=True, shuffle=True), False),
    "selfing": (np.array([[-1, -1], [0, 0], [1, 1], [2, 0], [3, 3], [3, 4]]), False),
    "one generation": (np.full((9, 2), -1), False),
    "one sample": (np.full((1, 2), -1), False),
}


@pytest.fixture(params=list(PEDIGREES), scope="module")
def pedigree(request):
    return PEDIGREES[request.param]


def test_kinship(pedigree):
    parent, half = pedigree
    got = plain.kinship_diploid(parent, allow_half_founders=half)
    np.testing.assert_array_equal(got, loops()["kinship_diploid"](parent, allow_half_founders=half))


def hamilton_kerr(parent):
    return np.ones(parent.shape, np.uint64), np.zeros(parent.shape)


def inbreeding_by_kinship_loop(parent, half):
    """The parents' kinship from the kinship loop over the samples relabelled in
    ``topological_argsort``'s order (so sorted, visited in that order): the sums sgkit's
    inbreeding loop makes."""
    order = P.topological_argsort(parent).astype(np.int64)
    position = np.argsort(order)
    relabelled = np.where(parent >= 0, position[np.maximum(parent, 0)], -1)[order]
    kinship = loops()["kinship_diploid"](relabelled, allow_half_founders=half)
    p, q = relabelled[position].T
    return np.where((p >= 0) & (q >= 0), kinship[p, q], 0.0)


def test_inbreeding_and_inverse(pedigree):
    parent, half = pedigree
    tau, lambda_ = hamilton_kerr(parent)
    inbreeding, parent_kinship = plain.inbreeding_diploid(parent, allow_half_founders=half)
    try:
        ref = loops()["inbreeding_Hamilton_Kerr"](parent, tau, lambda_, allow_half_founders=half)
    except AssertionError:  # sgkit's stack of pending pairs underflows on some deep pedigrees
        ref = (inbreeding_by_kinship_loop(parent, half),) * 2
    np.testing.assert_array_equal(inbreeding, ref[0])
    np.testing.assert_array_equal(parent_kinship, ref[1])
    self_kinship = (1 + inbreeding) / 2
    for relationship in (False, True):
        got = plain.inverse_kinship_diploid(parent, self_kinship, parent_kinship, return_relationship=relationship)
        want = loops()["inverse_kinship_Hamilton_Kerr"](parent, tau, self_kinship, parent_kinship,
                                                         return_relationship=relationship)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["contribution_to", "contribution_from"])
def test_contribution(pedigree, name):
    parent, _ = pedigree
    n = len(parent)
    order = P.topological_argsort(parent)
    share = np.full(parent.shape, 0.5)
    some = np.random.default_rng(n).integers(0, n, 5)  # a tile's targets, a sample twice perhaps
    for targets in (np.arange(n), some, np.arange(n)[::-1][: n // 2]):
        got = getattr(plain, name)(parent, share, order, targets)
        np.testing.assert_array_equal(got, loops()[name](parent, share, order, targets))


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("parent", [
    np.array([[-1, -1], [0, -1], [0, 1]]),  # a half-founder
    np.array([[-1, -1], [2, 0], [1, 0]]),  # a directed loop
    np.array([[-1, -1], [1, 1], [0, 0]]),  # a sample its own parent
    np.array([[-1, -1, -1], [0, 0, 0]]),  # three parents
])
def test_errors_are_the_loops(parent):
    assert (message(plain.kinship_diploid, parent, allow_half_founders=False)
            == message(loops()["kinship_diploid"], parent, allow_half_founders=False))
    if parent.shape[1] == 2:
        tau, lambda_ = hamilton_kerr(parent)
        assert (message(plain.inbreeding_diploid, parent, allow_half_founders=False)
                == message(loops()["inbreeding_Hamilton_Kerr"], parent, tau, lambda_, allow_half_founders=False))


def test_directed_loop_in_the_inverse_and_contributions():
    parent = np.array([[-1, -1], [2, 0], [1, 0]])
    tau, _ = hamilton_kerr(parent)
    half = np.full(3, 0.5)
    assert (message(plain.inverse_kinship_diploid, parent, half, half, return_relationship=False)
            == message(loops()["inverse_kinship_Hamilton_Kerr"], parent, tau, half, half, return_relationship=False))
    ds = xr.Dataset({"parent": (("samples", "parents"), parent)})
    with pytest.raises(InputError, match="pedigree_contribution: Pedigree contains a directed loop"):
        sg.pedigree_contribution(ds).compute()
    with pytest.raises(InputError, match="pedigree_kinship: Pedigree contains a directed loop"):
        sg.pedigree_kinship(ds).compute()


def test_singular_inverse():
    # 60 generations of selfing: the last parents' self-kinship rounds to 1, and Henderson's term
    # divides by zero (sgkit's loop means to raise this message; Numba's handler fails instead)
    parent = np.full((60, 2), -1)
    parent[1:] = np.arange(59)[:, None]
    ds = xr.Dataset({"parent": (("samples", "parents"), parent)})
    with pytest.raises(InputError, match="pedigree_inverse_kinship: Singular kinship matrix"):
        sg.pedigree_inverse_kinship(ds).compute()


def test_ops_equal_the_loops(monkeypatch):
    """The four functions through their NumPy paths, and with the bound at 0 through the loops."""
    parent = random_pedigree(40, 6, half=0.1, shuffle=True)
    ds = xr.Dataset({"parent": (("samples", "parents"), parent)})
    calls = [
        (sg.pedigree_kinship, dict(return_relationship=True, allow_half_founders=True)),
        (sg.pedigree_inbreeding, dict(allow_half_founders=True)),
        (sg.pedigree_inverse_kinship, dict(return_relationship=True, allow_half_founders=True)),
        (sg.pedigree_contribution, {}),
        (sg.pedigree_contribution, dict(chunks=(7, -1))),
        (sg.pedigree_contribution, dict(chunks=(-1, 9))),
    ]
    fast = [fn(ds, merge=False, **kw).compute() for fn, kw in calls]
    monkeypatch.setattr(P, "PLAIN_MATRIX_SAMPLES", 0)
    slow = [fn(ds, merge=False, **kw).compute() for fn, kw in calls]
    for a, b in zip(fast, slow):
        for name in a.data_vars:
            if "inverse" in name:
                np.testing.assert_allclose(a[name].values, b[name].values, rtol=1e-12, atol=0, err_msg=name)
            else:
                np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    with pytest.raises(InputError, match="pedigree_inbreeding: Pedigree contains half-founders"):
        sg.pedigree_inbreeding(ds).compute()


def test_no_numba():
    code = """if True:
        import sys
        import numpy as np, xarray as xr
        import pipeline.genomics as sg
        parent = np.array([[-1, -1], [-1, -1], [0, 1], [0, 2], [3, 1], [4, 2]])
        ds = xr.Dataset({"parent": (("samples", "parents"), parent)})
        sg.pedigree_kinship(ds, return_relationship=True).compute()
        sg.pedigree_inbreeding(ds).compute()
        sg.pedigree_inverse_kinship(ds, return_relationship=True).compute()
        sg.pedigree_contribution(ds).compute()
        sg.pedigree_contribution(ds, chunks=(2, -1)).compute()
        assert "numba" not in sys.modules, "numba imported"
    """
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_parent_index_beyond_the_samples_is_refused_naming_the_variable():
    """sgkit's loops would read beyond their arrays; the NumPy paths would raise IndexError."""
    ds = xr.Dataset({"parent": (("samples", "parents"), np.array([[-1, -1], [-1, -1], [0, 5]]))})
    for fn in (sg.pedigree_kinship, sg.pedigree_inbreeding, sg.pedigree_inverse_kinship, sg.pedigree_contribution):
        with pytest.raises(InputError, match=r"variable 'parent' has a parent index 5, beyond the 3 samples"):
            fn(ds).compute()
