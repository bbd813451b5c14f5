"""pca and count_call_alternate_alleles against sgkit 0.10's results (``sgkit_pca.npz``, made by
``tests/fixtures/genomics/sgkit_pca.py``), on several chunkings; the alternate allele kernel's
CUDA C kernel against its CPU loop, and GPU against CPU, where a GPU is present."""

from __future__ import annotations

import importlib

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.errors import InputError
from pipeline.kernels import alternate
from pipeline.kernels import linalg as L

from .conftest import raise_if_dask_computes, requires_gpu
from .genomics_data import dataset, sgkit

REF = sgkit("pca")
OUTPUTS = ("projection", "component", "explained_variance", "explained_variance_ratio", "loading")
PCA_MODULE = importlib.import_module("pipeline.ops.genomics.pca")

# (variants, samples) chunks: chunk boundaries fall inside the data, samples split or whole
CHUNKINGS = [(100, -1), (37, 25), (1000, -1)]


def complete_counts():
    """sgkit's counts of ``bi`` made complete as the fixture does: missing calls count 0, and the
    variants that no longer vary dropped (``pca_keep``)."""
    keep = REF["pca_keep"]
    return np.where(REF["bi_alt"] < 0, 0, REF["bi_alt"])[keep], keep


def pca_data(dtype, chunks=(100, -1), backend="cpu") -> xr.Dataset:
    counts, keep = complete_counts()
    ds = dataset("bi", {"variants": chunks[0], "samples": chunks[1]}, backend).isel(variants=np.flatnonzero(keep))
    ac = B.to_backend(da.from_array(counts.astype(dtype), chunks=chunks), backend)
    return ds.assign(call_alternate_allele_count=(("variants", "samples"), ac))


def assert_pca(out: xr.Dataset, run: str, rtol: float):
    """Every output equal to sgkit's run ``run`` up to the sign of each component, within ``rtol``
    of the largest value of each component (or of the vector)."""
    for name in OUTPUTS:
        a = B.to_numpy(out[f"sample_pca_{name}"].data).astype(np.float64)
        e = REF[f"{run}_{name}"].astype(np.float64)
        assert a.shape == e.shape, name
        if a.ndim == 2:
            a = a * np.where((a * e).sum(axis=0) < 0, -1.0, 1.0)
        scale = np.abs(e).max(axis=0) if a.ndim == 2 else np.abs(e)
        assert (np.abs(a - e) <= rtol * scale).all(), (name, np.max(np.abs(a - e) / scale))


# float64 counts: sgkit computes in float64 too; both are exact SVDs, measured 3e-15 apart
F64 = 1e-12
# integer counts: sgkit computes in float32 (its float32 QR and SVD), and its results lie up to
# 5.3e-7 of a component's largest value from the float64 ones (measured); ours are float64 results
# rounded to float32
F32 = 2e-6


# --- count_call_alternate_alleles ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bi", "multi"])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_count_call_alternate_alleles(kind, chunks):
    ds = dataset(kind, {"variants": chunks[0], "samples": chunks[1]})
    with raise_if_dask_computes():
        out = sg.count_call_alternate_alleles(ds)
    ac = out["call_alternate_allele_count"]
    assert ac.dims == ("variants", "samples") and ac.dtype == np.int16
    assert set(ds.variables) < set(out.variables)
    np.testing.assert_array_equal(ac.values, REF[f"{kind}_alt"])
    alone = sg.count_call_alternate_alleles(ds, merge=False)
    assert list(alone.data_vars) == ["call_alternate_allele_count"]


def random_genotypes(ploidy: int) -> np.ndarray:
    """Alleles -2 to 3 (fill, missing, reference, alternates, one past a 3-allele dimension)."""
    return np.random.default_rng(ploidy).integers(-2, 4, size=(10, 15, ploidy)).astype(np.int8)


def naive_alternate_counts(g: np.ndarray, n_alleles) -> np.ndarray:
    limit = np.iinfo(np.int64).max if n_alleles is None else n_alleles
    return np.where((g < 0).any(axis=-1), -1, ((g >= 1) & (g < limit)).sum(axis=-1))


@pytest.mark.parametrize("ploidy,n_alleles", [(2, 3), (3, None), (1, 2)])
def test_alternate_allele_kernel(ploidy, n_alleles):
    """Alleles past the alleles dimension are not counted (sgkit's counts have no place for
    them); with no alleles dimension every allele above 0 is."""
    g = random_genotypes(ploidy)
    out = alternate.alternate_allele_count_cpu(g, n_alleles)
    assert out.dtype == np.int16
    np.testing.assert_array_equal(out, naive_alternate_counts(g, n_alleles))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("ploidy,n_alleles,dtype", [(2, 3, np.int8), (3, None, np.int8), (1, 2, np.int16),
                                                    (2, 2, np.int32), (4, 5, np.int64)])
def test_alternate_allele_kernel_gpu_equals_cpu(ploidy, n_alleles, dtype):
    """The CUDA C kernel (``cuda/calls.cu``) against the CPU loop, on every allele value from -3 to
    5: 1,001 calls (one block of 256 threads, four calls a thread: the unrolled loop and its tail),
    6 million (threads taking several unrolled steps), and a view that is not C-contiguous."""
    import cupy

    rng = np.random.default_rng(ploidy)
    for shape in [(77, 13, ploidy), (3000, 2001, ploidy)]:
        g = rng.integers(-3, 6, size=shape).astype(dtype)
        expected = alternate.alternate_allele_count_cpu(g, n_alleles)
        got = alternate.alternate_allele_count_gpu(cupy.asarray(g), n_alleles)
        assert got.dtype == np.int16 and got.shape == shape[:2]
        np.testing.assert_array_equal(cupy.asnumpy(got), expected)
    g = rng.integers(-3, 6, size=(40, 30, ploidy)).astype(dtype)
    got = alternate.alternate_allele_count_gpu(cupy.asarray(g)[:, ::3], n_alleles)
    np.testing.assert_array_equal(cupy.asnumpy(got), alternate.alternate_allele_count_cpu(g[:, ::3], n_alleles))


# --- pca against sgkit -----------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_pca_tsqr_float64(chunks):
    with raise_if_dask_computes():
        out = sg.pca(pca_data(np.float64, chunks), n_components=4, merge=False)
    for name in OUTPUTS:
        assert out[f"sample_pca_{name}"].dtype == np.float64
    assert_pca(out.compute(), "tsqr64", F64)


def test_pca_signs_are_sgkits():
    """The components' signs follow dask's svd_flip, as sgkit's: the same signs, not only up to sign."""
    out = sg.pca(pca_data(np.float64), n_components=4, merge=False).compute()
    np.testing.assert_allclose(out["sample_pca_component"].values, REF["tsqr64_component"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunks", [(100, -1), (37, 25)])
def test_pca_tsqr_integer_counts(chunks):
    """int16 counts: float32 outputs, as sgkit's."""
    out = sg.pca(pca_data(np.int16, chunks), n_components=4)
    for name in OUTPUTS:
        assert out[f"sample_pca_{name}"].dtype == np.float32
    assert_pca(out, "tsqr32", F32)


@pytest.mark.parametrize(
    "run,dtype,chunks,params",
    [
        ("randomized64", np.float64, (100, -1), dict(n_components=3)),
        ("randomized64", np.float64, (100, 25), dict(n_components=3)),
        ("randomized64c37", np.float64, (37, 25), dict(n_components=5, n_iter=2, random_state=7)),
        ("randomized32", np.int16, (100, -1), dict(n_components=3, n_iter=1)),
    ],
)
def test_pca_randomized(run, dtype, chunks, params):
    """sgkit's randomized SVD draws its random matrix chunked as the variants: the same variant
    chunks give the same approximation."""
    with raise_if_dask_computes():
        out = sg.pca(pca_data(dtype, chunks), algorithm="randomized", merge=False, **params)
    assert_pca(out.compute(), run, F64 if dtype == np.float64 else F32)


def test_pca_in_tiles(monkeypatch):
    """The Gram matrix summed from tiles of samples (4 tiles of 15 here; those below the diagonal
    mirrored, not computed), and the randomized SVD's QR over blocks of samples: the same results."""
    monkeypatch.setattr(PCA_MODULE, "TILE", 16)
    data = pca_data(np.float64, (37, -1))
    with kernels.recording() as calls:
        out = sg.pca(data, n_components=4, merge=False).compute()
    # one call a chunk of variants (18), for the 10 tiles on and above the diagonal
    assert calls[("patterson_gram", "cpu")] == 18
    assert len(L.upper_pairs(4)) == 10
    assert_pca(out, "tsqr64", F64)
    out = sg.pca(pca_data(np.float64, (37, -1)), n_components=5, algorithm="randomized", n_iter=2, random_state=7)
    assert_pca(out.compute(), "randomized64c37", F64)


def complete_genotypes(chunks=(100, -1), backend="cpu") -> xr.Dataset:
    """``bi``'s kept variants with genotypes that give the complete counts: a call of count c is
    (c >= 1, c >= 2)."""
    counts, keep = complete_counts()
    g = np.stack([counts >= 1, counts >= 2], axis=-1).astype(np.int8)
    ds = dataset("bi", {"variants": chunks[0], "samples": chunks[1]}, backend).isel(variants=np.flatnonzero(keep))
    data = B.to_backend(da.from_array(g, chunks=(chunks[0], chunks[1], -1)), backend)
    return ds.assign(call_genotype=(("variants", "samples", "ploidy"), data), call_genotype_mask=(
        ("variants", "samples", "ploidy"), data < 0))


def test_pca_counts_alleles_when_the_dataset_has_no_counts():
    ds = complete_genotypes((37, 25))
    with raise_if_dask_computes():
        out = sg.pca(ds, n_components=4)
    assert "call_alternate_allele_count" in out and "call_genotype" in out  # merged as sgkit's
    assert_pca(out, "tsqr32", F32)
    assert set(sg.pca(ds, n_components=4, merge=False).data_vars) == {f"sample_pca_{n}" for n in OUTPUTS}


def test_pca_output_layout():
    out = sg.pca(pca_data(np.int16), n_components=3)
    assert out["sample_pca_projection"].dims == ("samples", "components")
    assert out["sample_pca_component"].dims == ("variants", "components")
    assert out["sample_pca_loading"].dims == ("variants", "components")
    assert out["sample_pca_explained_variance"].dims == ("components",)
    assert out["sample_pca_explained_variance_ratio"].dims == ("components",)
    assert out.sizes["components"] == 3 and "call_genotype" in out


# --- bad input -------------------------------------------------------------------------------------


def test_pca_refuses_missing_values_when_computed():
    """Missing calls (-1) make the counts incomplete: refused, naming the variable, when the
    result is computed (the op itself computes nothing)."""
    ds = sg.count_call_alternate_alleles(dataset("bi"))
    with raise_if_dask_computes():
        out = sg.pca(ds, n_components=3)
    with pytest.raises(InputError, match="'call_alternate_allele_count' has 1622 missing values"):
        out["sample_pca_projection"].compute()
    with pytest.raises(InputError, match="missing values"):
        sg.pca(ds, n_components=3, algorithm="randomized")["sample_pca_component"].compute()
    nan = pca_data(np.float64)
    nan["call_alternate_allele_count"] = nan["call_alternate_allele_count"].where(
        ~((nan.variants == 3) & (nan.samples == 5)))
    with pytest.raises(InputError, match="1 missing values"):
        sg.pca(nan, n_components=3)["sample_pca_explained_variance"].compute()


def test_pca_refuses_variants_without_variation():
    counts, keep = complete_counts()
    counts = counts.copy()
    counts[4], counts[9] = 0, 2  # p = 0 and p = 1: scale 0 (a constant 1 has scale 0.5 and scales to 0)
    ds = pca_data(np.int16).assign(call_alternate_allele_count=(("variants", "samples"), counts))
    with pytest.raises(InputError, match="2 variants with no variation"):
        sg.pca(ds, n_components=3).compute()


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(n_components=0), "n_components"),
        (dict(n_components=61), "n_components"),
        (dict(n_components=2.5), "n_components"),
        (dict(scaler="standard"), "patterson"),
        (dict(algorithm="arpack"), "algorithm"),
        (dict(n_iter=-1), "n_iter"),
        (dict(ploidy=0), "ploidy"),
        (dict(variable="call_dosage"), "no variable 'call_dosage'"),
    ],
)
def test_pca_bad_parameters(params, match):
    with pytest.raises(InputError, match=match):
        sg.pca(pca_data(np.int16), **params)


def test_pca_needs_ploidy_without_its_dimension():
    ds = pca_data(np.int16).drop_vars(["call_genotype", "call_genotype_mask"])
    with pytest.raises(InputError, match="ploidy"):
        sg.pca(ds, n_components=3)
    assert_pca(sg.pca(ds, n_components=4, ploidy=2), "tsqr32", F32)


def test_pca_variable_dimensions_checked():
    ds = pca_data(np.int16)
    ds["call_alternate_allele_count"] = ds["call_alternate_allele_count"].T
    with pytest.raises(InputError, match="dimensions"):
        sg.pca(ds)


# --- dispatch: the kernels each op declares are those that run --------------------------------------


def test_pca_runs_the_kernels_it_declares():
    op = sg.pca.op
    ran = set()
    for ds, params in [
        (complete_genotypes(), dict(n_components=2)),
        (pca_data(np.int16), dict(n_components=2, algorithm="randomized")),
    ]:
        with kernels.recording() as calls:
            sg.pca(ds, **params).compute()
        assert {b for _, b in calls} == {"cpu"}
        ran |= {n for n, _ in calls}
    assert ran == set(op.kernels["cpu"])


# --- GPU ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("algorithm", ["tsqr", "randomized"])
def test_pca_gpu_equals_cpu(algorithm):
    """The same formulas on CuPy: results on the device, equal to the CPU's within float64
    rounding (cuBLAS and cuSOLVER sum in other orders), and sgkit's."""
    params = dict(n_components=4, algorithm=algorithm, n_iter=1)
    gpu = sg.pca(complete_genotypes((37, 25), "gpu"), **params)
    cpu = sg.pca(complete_genotypes((37, 25), "cpu"), **params).compute()
    assert B.backend_of(gpu["sample_pca_component"].data) == "gpu"
    gpu = gpu.compute()
    for name in OUTPUTS:
        a, e = B.to_numpy(gpu[f"sample_pca_{name}"].data), cpu[f"sample_pca_{name}"].values
        if a.ndim == 2:
            a = a * np.where((a * e).sum(axis=0) < 0, -1, 1)
        np.testing.assert_allclose(a, e, rtol=0, atol=F32 * np.abs(e).max(), err_msg=name)
    if algorithm == "tsqr":
        assert_pca(gpu, "tsqr32", F32)


@pytest.mark.gpu
@requires_gpu
def test_alternate_allele_count_gpu_equals_cpu():
    for kind in ("bi", "multi"):
        out = sg.count_call_alternate_alleles(dataset(kind, {"variants": 37}, "gpu"))["call_alternate_allele_count"]
        assert B.backend_of(out.data) == "gpu"
        np.testing.assert_array_equal(B.to_numpy(out.data), REF[f"{kind}_alt"])


def _counted(data: xr.Dataset, seen: list) -> xr.Dataset:
    """``data`` whose counts record each block they compute in ``seen``."""

    def block(b):
        if b.size:
            seen.append(b.shape)
        return b

    ac = data["call_alternate_allele_count"]
    return data.assign(call_alternate_allele_count=ac.copy(data=ac.data.map_blocks(block, dtype=ac.dtype)))


def test_pca_tsqr_out_of_core_reads_its_input_again():
    """The statistics and the Gram matrix come from one pass over the blocks (a block's mean and
    scale are its own variants'); the pass after the eigendecomposition (``V = X^T U / S``) reads
    the blocks again out of core (a budget below twice the counts) rather than holding them all
    until it starts, and takes the blocks of the first pass in core. The results are sgkit's."""
    import dask

    seen = []
    data = _counted(pca_data(np.float64, (100, -1)), seen)
    blocks = data["call_alternate_allele_count"].data.numblocks[0]
    with dask.config.set({"pipeline.cpu.memory-limit": "64kB"}):
        out = sg.pca(data, n_components=4, merge=False)
    in_core = sg.pca(data, n_components=4, merge=False)
    for ds, passes in ((in_core, 1), (out, 2)):
        seen.clear()
        with kernels.recording() as calls:
            got = ds.compute()
        assert_pca(got, "tsqr64", F64)
        assert len(seen) == passes * blocks
        assert calls[("patterson_gram", "cpu")] == calls[("patterson_moments", "cpu")] == blocks


def test_bound_copies_of_a_rechunked_input_are_computed_again():
    """The second pass's copy of its input's graph computes that input again, however it was
    made: a rechunk's tasks (dask's Task objects) pointed at the first pass's blocks in dask's own
    copy (dask/dask#12455), which held all of them between the passes."""
    import dask

    from pipeline.exec import clone

    seen = []

    def block(b):
        if b.size:  # not dask's call on an empty block for the metadata
            seen.append(b.shape)
        return b * 2

    x = da.ones((60, 12), chunks=(10, 12)).map_blocks(block, dtype=float).rechunk({1: 5})
    total = x.sum()
    again = clone.bind(x, [total])
    assert dask.compute(total, again.sum(), scheduler="sync") == (1440.0, 1440.0)
    assert len(seen) == 2 * 6
    seen.clear()
    copy = clone.clone(x, seed=1)
    assert copy.name != x.name
    np.testing.assert_array_equal(*dask.compute(x, copy, scheduler="sync"))
    assert len(seen) == 2 * 6


def test_gram_chains_are_added_two_by_two():
    """The chains' sums are added in pairs of neighbours (on a cluster, neighbouring chains are on
    one worker), and every tile comes from the one total, not from every chain's sums."""
    from dask.core import get_dependencies

    data = pca_data(np.float64, (20, -1))
    graph = dict(sg.pca(data, n_components=4, merge=False)["sample_pca_explained_variance"].data.__dask_graph__())
    folds = {k for k in graph if isinstance(k, tuple) and k[0].startswith("patterson-gram-fold")}
    sums = {k for k in graph if isinstance(k, str) and k.startswith("patterson-gram-sum")}
    ends = {f for f in folds if not any(f in get_dependencies(graph, g) for g in folds)}
    assert len(ends) == PCA_MODULE.CHAINS == len(sums) + 1  # 8 chains, 4 + 2 + 1 additions
    for key in sums:
        assert len(get_dependencies(graph, key)) == 2
    tiles = [k for k in graph if isinstance(k, tuple) and k[0].startswith("patterson-gram-") and "fold" not in k[0]
             and "sum" not in k[0]]
    assert all(len(get_dependencies(graph, k)) == 1 for k in tiles)


def test_gram_chains_fewer_where_their_sums_are_large():
    """At most CHAINS chains, one a block of variants, and fewer where their sums of the tiles on
    and above the diagonal would hold more than CHAIN_BYTES: at 25,000 samples (7 tiles) one."""
    from pipeline.ops.genomics.pca import CHAIN_BYTES, CHAINS, TILE, gram_chains, tsqr_device_bytes

    def tiles(n):
        return PCA_MODULE.even_chunks(n, TILE)

    assert gram_chains(tiles(500), 100) == CHAINS
    assert gram_chains(tiles(500), 3) == 3
    assert gram_chains(tiles(10_000), 100) == CHAINS  # 3 tiles: 6 sums of 89 MB a chain
    assert gram_chains(tiles(15_000), 100) == CHAIN_BYTES // (10 * 3750 * 3750 * 8) == 3
    assert gram_chains(tiles(25_000), 100) == 1
    assert tsqr_device_bytes(25_000) == 6 * 25_000**2 * 8


@pytest.mark.gpu
@requires_gpu
def test_pca_tsqr_refuses_a_device_budget_below_its_eigendecomposition():
    import dask

    data = pca_data(np.float64, (100, -1), backend="gpu")
    n = data.sizes["samples"]
    with dask.config.set({"pipeline.gpu.memory-limit": f"{6 * n * n * 8 - 1}B"}):
        with pytest.raises(InputError, match="algorithm='randomized'"):
            sg.pca(data, n_components=4, merge=False)
        sg.pca(data, n_components=4, algorithm="randomized", merge=False)  # no such limit


FILL_THE_DEVICE = """
import threading
import cupy
import numpy as np
from pipeline.kernels import linalg as L

blocks, size = [], 1 << 30
while size >= 1 << 20:  # every byte CuPy can take, then given back to its pool, not to the device
    try:
        blocks.append(cupy.empty(size, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        size //= 2
del blocks
g = np.cov(np.random.default_rng(0).normal(size=(40, 200)))
out = {}
thread = threading.Thread(target=lambda: out.update(v=cupy.asnumpy(L.top_eigenpairs_gpu(cupy.asarray(g), 3))))
thread.start()
thread.join()
np.testing.assert_allclose(out["v"][-1], L.top_eigenpairs(g, 3)[-1], rtol=1e-10)
print("free", cupy.cuda.runtime.memGetInfo()[0])
"""


@pytest.mark.gpu
@requires_gpu
def test_the_eigendecomposition_runs_when_the_pool_holds_the_device():
    """After a pass over the data CuPy's pool may hold nearly all of the device, and making a
    thread's cuSOLVER handle (device memory outside the pool) failed with
    CUSOLVER_STATUS_INTERNAL_ERROR: the pool's cache is given back and the handle made again. In
    a process of its own, which fills the device: not beside other tests (-n)."""
    import os
    import subprocess
    import sys

    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("fills the device: run without -n")
    run = subprocess.run([sys.executable, "-c", FILL_THE_DEVICE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("free")


@pytest.mark.gpu
@requires_gpu
def test_patterson_kernels_equal_the_formulas():
    """The CUDA C moments and standardization against the array formulas on NumPy: bit for bit
    for integer counts (exact sums) and every standardized value; floats' sums within rounding.
    Missing values (negative, NaN), a row with none present, odd shapes."""
    import cupy

    from pipeline.kernels import linalg as L

    rng = np.random.default_rng(5)
    for shape, dtype in (((37, 1001), np.int8), ((5, 3), np.int16), ((300, 257), np.float32), ((2, 70000), np.float64)):
        ac = rng.integers(-1, 3, size=shape).astype(dtype)
        ac[1] = -1  # nothing present
        if ac.dtype.kind == "f":
            ac[0, ::7] = np.nan
            ac += rng.random(shape).astype(dtype) * (ac >= 0)
        mean, scale = rng.random(shape[0]), rng.random(shape[0]) + 0.5
        scale[2 % shape[0]] = 0.0
        got = cupy.asnumpy(L.patterson_standardize_gpu(cupy.asarray(ac), mean, scale))
        np.testing.assert_array_equal(got, L.patterson_standardize(ac, mean, scale), err_msg=f"{dtype}")
        got = cupy.asnumpy(L.patterson_moments_gpu(cupy.asarray(ac)))
        want = L.patterson_moments(ac)
        if ac.dtype.kind == "i":
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype}")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{dtype}")
    ac = rng.integers(0, 3, size=(5000, 40)).astype(np.int8)  # two slabs of variants
    mean, scale = ac.mean(axis=1), np.full(5000, 0.7)
    tiles = [ac[:, :15], ac[:, 15:30], ac[:, 30:]]
    got = L.patterson_gram_gpu([cupy.asarray(t) for t in tiles], mean, scale)
    want = L.patterson_gram(tiles, mean, scale)
    x = (ac - mean[:, None]) / 0.7
    for (i, j), g, w in zip(L.upper_pairs(3), got, want):  # the tiles on and above the diagonal
        exact = x[:, 15 * i : 15 * i + 15].T @ x[:, 15 * j : 15 * j + 15]
        np.testing.assert_allclose(w, exact, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=1e-12, atol=1e-9)
    # the chain's sums so far, and the chains' sums: added by the add kernel
    start = [rng.normal(size=w.shape) for w in want]
    got = L.patterson_gram_gpu([cupy.asarray(t) for t in tiles], mean, scale, [cupy.asarray(p) for p in start])
    for g, w, p in zip(got, want, start):
        np.testing.assert_allclose(cupy.asnumpy(g), w + p, rtol=1e-12, atol=1e-9)
    parts = [rng.normal(size=(40, 30)) for _ in range(3)]
    np.testing.assert_array_equal(cupy.asnumpy(L.sum_parts_gpu([cupy.asarray(p) for p in parts])), L.sum_parts_cpu(parts))
    # the leading eigenpairs: cuSOLVER against LAPACK, vectors up to their signs
    g = np.cov(rng.normal(size=(40, 200)))
    want, got = L.top_eigenpairs(g, 5), cupy.asnumpy(L.top_eigenpairs_gpu(cupy.asarray(g), 5))
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-10)
    np.testing.assert_allclose(got[:-1] * np.sign((got[:-1] * want[:-1]).sum(0)), want[:-1], atol=1e-9)
    np.testing.assert_allclose(want[-1], np.sqrt(np.linalg.eigvalsh(g)[::-1][:5]), rtol=1e-12)
    # mean imputation's fill: the values where present, else the variant's fill, any dtype and layout
    for dtype in (np.int16, np.int8, np.float32, np.float64):
        ac = rng.integers(-1, 3, size=(30, 45)).astype(dtype)
        if ac.dtype.kind == "f":
            ac[::3, 1] = np.nan
        fill = rng.random(30)
        fill[4] = np.nan
        for view in (lambda a: a, lambda a: a[:, 3:40:2]):
            want = L.fill_missing_cpu(view(ac), fill)
            assert want.dtype == np.float64 and np.isnan(want[4][view(ac)[4] < 0]).all()
            np.testing.assert_array_equal(cupy.asnumpy(L.fill_missing_gpu(view(cupy.asarray(ac)), fill)), want)
