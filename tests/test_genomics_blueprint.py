"""The genomics counts run through the reduction blueprint (pipeline.reduce.aggregation), as the
climate reductions do: their graphs declare the bytes of their partials, the memory plan reads
those declarations, and the results equal NumPy formulas of sgkit's rules on odd chunks (13
variants x 7 samples of 61 x 23), with missing calls, partly missing calls, fill values of mixed
ploidy (-2) and alleles beyond the alleles dimension."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.exec import memory
from pipeline.kernels import genotypes as K
from pipeline.reduce import aggregation as agg
from pipeline.reduce.declare import declared

from .conftest import requires_gpu

SHAPE = (61, 23)
CHUNKS = (13, 7)


def calls(ploidy: int, n_alleles: int, *, fill: bool, seed: int = 0, shape: tuple[int, int] = SHAPE) -> np.ndarray:
    """Random calls: whole and partly missing, and (``fill``) calls of one allele fewer (-2 last)
    and alleles past the alleles dimension."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, n_alleles, size=(*shape, ploidy)).astype(np.int8)
    u = rng.random(shape)
    g[u < 0.1] = -1
    g[(u >= 0.1) & (u < 0.15), 0] = -1
    if fill:
        g[(u >= 0.15) & (u < 0.25), -1] = -2
        g[(u >= 0.25) & (u < 0.28), 0] = n_alleles
    return g


def dataset(g: np.ndarray, n_alleles: int, backend: str = "cpu", chunks: tuple[int, int] = CHUNKS) -> xr.Dataset:
    import dask.array as da

    nv, ns, _ = g.shape
    G = B.to_backend(da.from_array(g, chunks=(*chunks, -1)), backend)
    ds = xr.Dataset(
        {
            "call_genotype": (("variants", "samples", "ploidy"), G),
            "variant_allele": (("variants", "alleles"), np.full((nv, n_alleles), "A", dtype=object)),
            "variant_contig": ("variants", np.repeat([0, 1], [nv // 2, nv - nv // 2])),
            "variant_position": ("variants", np.arange(nv) * 10),
            "contig_id": ("contigs", np.array(["chr1", "chr2"], dtype=object)),
            "sample_cohort": ("samples", np.random.default_rng(1).integers(-1, 2, ns)),
        },
        attrs={"contigs": ["chr1", "chr2"]},
    )
    ds["call_genotype"].attrs["mixed_ploidy"] = False
    return ds


def classes(g: np.ndarray) -> np.ndarray:
    """(variants, samples, 3): hom ref, hom alt, het, called calls only (every allele >= 0)."""
    called = (g >= 0).all(-1)
    hom = (g == g[..., :1]).all(-1)
    return np.stack([called & hom & (g[..., 0] == 0), called & hom & (g[..., 0] > 0), called & ~hom], -1)


def allele_counts(g: np.ndarray, n_alleles: int) -> np.ndarray:
    """(variants, samples, alleles): each allele's count in each call."""
    return np.stack([(g == a).sum(-1) for a in range(n_alleles)], -1)


def partials(arr, prefix: str) -> dict:
    """Name -> declaration of the layers of ``arr``'s graph, named from ``prefix``, that declare partials."""
    layers = arr.__dask_graph__().layers
    return {n: declared(l) for n, l in layers.items() if str(n).startswith(prefix) and "partial_bytes" in declared(l)}


def assert_equal(actual, expected, name: str):
    values = np.asarray(B.to_numpy(actual.data if isinstance(actual, xr.DataArray) else actual))
    assert values.dtype == expected.dtype, (name, values.dtype, expected.dtype)
    np.testing.assert_array_equal(values, expected, err_msg=name)


# --- graphs: the blueprint's declarations, read by the memory plan ----------------------------------


def test_count_graphs_declare_their_partials_to_the_memory_plan():
    n = 3
    ds = dataset(calls(3, n, fill=True), n)
    G = ds["call_genotype"].data
    v, s = CHUNKS
    cases = [  # op's result, the blueprint's layers, the bytes of a partial: int64 counts of a block
        (sg.count_variant_alleles(ds, merge=False)["variant_allele_count"], "pipeline-variant-call-counts", v * (3 + n) * 8),
        (sg.variant_stats(ds, merge=False)["variant_n_called"], "pipeline-variant-call-counts", v * (3 + n) * 8),
        (sg.sample_stats(ds, merge=False)["sample_n_het"], "pipeline-sample-call-counts", s * 3 * 8),
    ]
    for result, prefix, size in cases:
        found = partials(result.data, prefix)
        # the tree's steps: each block's counts, the merges and the last step
        assert len(found) >= 2 and {d["partial_bytes"] for d in found.values()} == {size}, (prefix, found)
        assert memory.graph_partial_bytes(result.data) == size
        plan = memory.plan(G, result.data)
        assert plan.partial_bytes == size


def test_hwe_and_windowed_diversity_graphs_declare_their_partials():
    g = calls(2, 2, fill=False)
    ds = dataset(g, 2)
    p = sg.hardy_weinberg_test(ds, merge=False)["variant_hwe_p_value"].data
    genotypes = K.n_genotypes(2, 2) + 1  # the genotypes, and the calls sgkit refuses
    assert {d["partial_bytes"] for d in partials(p, "pipeline-variant-genotype-counts").values()} == {13 * genotypes * 8}
    assert memory.plan(ds["call_genotype"].data, p).partial_bytes == 13 * genotypes * 8

    w = sg.window_by_variant(ds, size=7, step=5)  # overlapping windows, across blocks
    pi = sg.diversity(w, merge=False)["stat_diversity"].data
    cohort_counts = partials(pi, "pipeline-cohort-allele-count")
    assert {d["partial_bytes"] for d in cohort_counts.values()} == {13 * 2 * 2 * 8}  # uint64 (cohorts, alleles)
    window_parts = partials(pi, "window-sum")  # the window sums' own partials, declared too
    assert window_parts
    assert memory.graph_partial_bytes(pi) == max(13 * 2 * 2 * 8, *(d["partial_bytes"] for d in window_parts.values()))
    assert memory.plan(ds["call_genotype"].data, pi).partial_bytes == memory.graph_partial_bytes(pi)


# observed heterozygosity and Weir & Goudet's beta: 333 variants x 77 samples in odd blocks, a cohort
# of one sample (its missing calls make NaN means) and NaN identities by state

ODD = (333, 77)
ODD_CHUNKS = (61, 23)


def heterozygosity_dataset(backend: str = "cpu") -> xr.Dataset:
    ds = dataset(calls(3, 3, fill=True, seed=11, shape=ODD), 3, backend, chunks=ODD_CHUNKS)
    cohort = np.random.default_rng(2).integers(-1, 2, ODD[1])
    cohort[5] = 2  # a cohort of one sample
    return ds.assign(sample_cohort=("samples", cohort))


def ibs_dataset(backend: str = "cpu") -> xr.Dataset:
    """Identity by state of the 77 samples, NaN at random pairs (both halves), in tiles of 23 x 11."""
    ibs = B.to_numpy(sg.identity_by_state(heterozygosity_dataset(), merge=False)["stat_identity_by_state"].data)
    ibs = np.array(ibs, dtype=np.float64)
    nan = np.random.default_rng(3).random(ibs.shape) < 0.1
    ibs[nan | nan.T] = np.nan
    import dask.array as da

    data = B.to_backend(da.from_array(ibs, chunks=(23, 11)), backend)
    return xr.Dataset({"stat_identity_by_state": (("samples_0", "samples_1"), data)})


def former_observed_heterozygosity(h, cohort: np.ndarray, n_cohorts: int):
    """The graph observed_heterozygosity built before it went through the blueprint: each block's
    float64 sums and counts by cohort (matrix products), added by dask's sum over the blocks."""
    import dask.array as da

    def sums(block, c):
        members = (c[:, None] == np.arange(n_cohorts)[None, :]).astype(block.dtype)
        ok = ~np.isnan(block)
        return np.stack([np.where(ok, block, 0) @ members, ok.astype(block.dtype) @ members], -1)[:, None]

    coh = da.from_array(cohort, chunks=(h.chunks[1],))
    parts = da.blockwise(sums, "vsck", h, "vs", coh, "s", new_axes={"c": n_cohorts, "k": 2}, adjust_chunks={"s": 1},
                         dtype=np.float64).sum(axis=1).compute()
    with np.errstate(divide="ignore", invalid="ignore"):
        return parts[..., 0] / parts[..., 1]


def former_mean_ibs(ibs) -> float:
    """The mean Weir_Goudet_beta took before it went through the blueprint: each tile's float64
    sum and count below the diagonal, added by dask's sum over the tiles."""

    def lower(block, block_info=None):
        (r0, _), (c0, _) = block_info[0]["array-location"]
        below = np.arange(r0, r0 + block.shape[0])[:, None] > np.arange(c0, c0 + block.shape[1])[None, :]
        keep = below & ~np.isnan(block)
        return np.stack([np.where(keep, block, 0).sum(dtype=np.float64), keep.sum(dtype=np.float64)]).reshape(1, 1, 2)

    sums = ibs.map_blocks(lower, chunks=((1,) * ibs.numblocks[0], (1,) * ibs.numblocks[1], (2,)), new_axis=2,
                          dtype=np.float64).sum(axis=(0, 1)).compute()
    return sums[0] / sums[1]


def test_observed_heterozygosity_and_weir_goudet_beta_declare_their_partials():
    ds = heterozygosity_dataset()
    ho = sg.observed_heterozygosity(ds, merge=False)["stat_observed_heterozygosity"].data
    found = partials(ho, "pipeline-cohort-heterozygosity")
    # each block's float64 sums and int64 counts of 3 cohorts, the merges and the last step
    assert len(found) >= 2 and {d["partial_bytes"] for d in found.values()} == {61 * 3 * 16}, found
    assert memory.graph_partial_bytes(ho) == 61 * 3 * 16
    assert memory.plan(ds["call_genotype"].data, ho).partial_bytes == 61 * 3 * 16

    ibs = ibs_dataset()
    beta = sg.Weir_Goudet_beta(ibs, merge=False)["stat_Weir_Goudet_beta"].data
    found = partials(beta, "pipeline-pairs-mean")
    assert len(found) >= 2 and {d["partial_bytes"] for d in found.values()} == {16}, found  # a sum and a count
    assert memory.plan(ibs["stat_identity_by_state"].data, beta).partial_bytes == 16


# --- results: NumPy formulas of sgkit's rules --------------------------------------------------------


@pytest.mark.parametrize("ploidy,n_alleles", [(3, 3), (2, 2)])
def test_counts_equal_numpy_on_odd_chunks(ploidy, n_alleles):
    g = calls(ploidy, n_alleles, fill=True, seed=ploidy)
    ds = dataset(g, n_alleles)
    c = classes(g)
    ac = allele_counts(g, n_alleles)
    per_variant, per_sample = c.sum(1), c.sum(0)

    cva = sg.count_variant_alleles(ds, merge=False)
    assert_equal(cva["variant_allele_count"], ac.sum(1).astype(np.uint64), "variant_allele_count")
    vs = sg.variant_stats(ds, merge=False)
    expected = {
        "variant_n_hom_ref": per_variant[:, 0], "variant_n_hom_alt": per_variant[:, 1],
        "variant_n_het": per_variant[:, 2], "variant_n_called": per_variant.sum(1),
        "variant_n_non_ref": per_variant[:, 1] + per_variant[:, 2],
        "variant_allele_count": ac.sum(1).astype(np.uint64), "variant_allele_total": ac.sum((1, 2)),
        "variant_call_rate": per_variant.sum(1) / SHAPE[1],
    }
    for name, value in expected.items():
        assert_equal(vs[name], value.astype(vs[name].dtype) if name != "variant_allele_count" else value, name)
    assert vs["variant_n_called"].dtype == np.int64 and vs["variant_call_rate"].dtype == np.float64
    with np.errstate(invalid="ignore", divide="ignore"):
        af = ac.sum(1) / ac.sum((1, 2))[:, None].astype(np.float64)
    assert_equal(vs["variant_allele_frequency"], af, "variant_allele_frequency")
    ss = sg.sample_stats(ds, merge=False)
    for k, name in enumerate(("sample_n_hom_ref", "sample_n_hom_alt", "sample_n_het")):
        assert_equal(ss[name], per_sample[:, k].astype(np.int64), name)
    assert_equal(ss["sample_n_called"], per_sample.sum(1).astype(np.int64), "sample_n_called")
    assert_equal(ss["sample_call_rate"], per_sample.sum(1) / SHAPE[0], "sample_call_rate")

    cohort = ds["sample_cohort"].values
    cc = sg.count_cohort_alleles(ds, merge=False)["cohort_allele_count"]
    expected = np.stack([ac[:, cohort == k].sum(1) for k in range(2)], 1).astype(np.uint64)
    assert_equal(cc, expected, "cohort_allele_count")


def test_hwe_and_windowed_diversity_equal_numpy_on_odd_chunks():
    g = calls(2, 2, fill=False, seed=5)
    ds = dataset(g, 2)
    called = (g >= 0).all(-1)
    alt = g.sum(-1)
    n = [(called & (alt == k)).sum(1) for k in range(3)]  # 0/0, 0/1, 1/1
    out = sg.hardy_weinberg_test(ds, merge=False)
    assert_equal(out["variant_hwe_p_value"], K.hwe_exact_cpu(n[1], n[0], n[2]), "variant_hwe_p_value")
    counts = sg.count_variant_genotypes(ds, merge=False)["variant_genotype_count"]
    assert_equal(counts, np.stack(n, 1).astype(np.uint64), "variant_genotype_count")

    w = sg.window_by_variant(ds, size=7, step=5)
    pi = sg.diversity(w, merge=False)["stat_diversity"]
    cohort = ds["sample_cohort"].values
    ac = np.stack([allele_counts(g, 2)[:, cohort == k].sum(1) for k in range(2)], 1).astype(np.float64)
    an = ac.sum(2)
    pairs = an * (an - 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = (pairs - (ac * (ac - 1) / 2).sum(2)) / np.where(pairs != 0, pairs, np.nan)
    starts, stops = w["window_start"].values, w["window_stop"].values
    expected = np.stack([terms[a:b].sum(0) for a, b in zip(starts, stops)])
    values = B.to_numpy(pi.data)
    assert values.shape == (len(starts), 2) and values.dtype == np.float64
    np.testing.assert_allclose(values, expected, rtol=1e-13, equal_nan=True)


def test_observed_heterozygosity_and_weir_goudet_beta_equal_their_former_graphs_on_odd_chunks():
    out = sg.observed_heterozygosity(heterozygosity_dataset())
    h, cohort = out["call_heterozygosity"].data, out["sample_cohort"].values
    ho = np.asarray(out["stat_observed_heterozygosity"].values)
    assert ho.shape == (333, 3) and ho.dtype == np.float64
    np.testing.assert_array_equal(ho, former_observed_heterozygosity(h, cohort, 3))  # bit for bit, NaN where NaN
    hi = h.compute()
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of a cohort with no value at a variant
        expected = np.stack([np.nanmean(hi[:, cohort == k], axis=1) for k in range(3)], 1)
    assert np.isnan(ho[:, 2]).any() and not np.isnan(ho[:, 2]).all()  # the cohort of one sample, its missing calls
    np.testing.assert_allclose(ho, expected, rtol=1e-13, equal_nan=True)

    ds = ibs_dataset()
    ibs = ds["stat_identity_by_state"].data
    beta = np.asarray(sg.Weir_Goudet_beta(ds, merge=False)["stat_Weir_Goudet_beta"].values)
    avg = former_mean_ibs(ibs)
    m = ibs.compute()
    np.testing.assert_array_equal(beta, (m - avg) / (1 - avg))
    below = np.tril(np.ones(m.shape, dtype=bool), -1) & ~np.isnan(m)
    np.testing.assert_allclose(avg, m[below].mean(), rtol=1e-13)
    assert np.isnan(beta).any()


def test_integer_partials_are_exact_past_float64():
    """int64 partials add exactly where float64 accumulators would round: counts past 2**53."""
    import dask.array as da

    big = 2**53 + 1
    x = da.from_array(np.zeros((4, 6, 1), np.int8), chunks=(2, 1, 1))
    kernel = kernels.Kernel("big_counts", "cpu", lambda b: np.full((b.shape[0], 1, 2), big, np.int64))
    total = agg.reduce(x, agg.integer_sum("pipeline-big", "big_counts"), (1,), kernel=agg.FieldKernel(kernel, "total"),
                       dtype=np.int64, width=2, on="cpu")
    assert total.shape == (4, 2) and total.chunks == ((2, 2), (2,))
    np.testing.assert_array_equal(total.compute(), np.full((4, 2), 6 * big, np.int64))


def test_width_needs_the_last_axis_whole_and_kept():
    import dask.array as da

    x = da.zeros((4, 6, 2), np.int8, chunks=(2, 3, 1))
    kernel = agg.FieldKernel(kernels.get("variant_call_counts", "cpu"), "total")
    with pytest.raises(ValueError, match="last axis"):
        agg.reduce(x, agg.integer_sum("pipeline-variant-call-counts", "variant_call_counts", n_alleles=2), (1,),
                   kernel=kernel, dtype=np.int64, width=5)


# --- the GPU kernels through the blueprint: in Numba's CUDA simulator here, on the GPU there ------------


@pytest.mark.cudasim
def test_cuda_count_kernels_through_the_blueprint_equal_numpy():
    import dask.array as da

    g = calls(3, 3, fill=True, seed=7)[:7, :11]  # generic (Numba CUDA) kernels: not int8 diploid biallelic
    x = da.from_array(g, chunks=(3, 4, -1))
    c, ac = classes(g), allele_counts(g, 3)
    # small thread shapes: rows over several tiles, threads with tails
    variant = kernels.Kernel("variant_call_counts", "gpu", functools.wraps(K.variant_call_counts_gpu)(
        lambda b, n_alleles: K.variant_call_counts_gpu(b, n_alleles, tx=4, ty=2, unroll=2, tile=8)))
    sample = kernels.Kernel("sample_call_counts", "gpu", functools.wraps(K.sample_call_counts_gpu)(
        lambda b: K.sample_call_counts_gpu(b, threads=8, unroll=2, vtile=3)))
    per_variant = agg.reduce(x, agg.integer_sum("pipeline-variant-call-counts", "variant_call_counts", n_alleles=3), (1,),
                             kernel=agg.FieldKernel(variant, "total"), dtype=np.int64, width=6, on="cpu")
    per_sample = agg.reduce(x, agg.integer_sum("pipeline-sample-call-counts", "sample_call_counts"), (0,),
                            kernel=agg.FieldKernel(sample, "total"), dtype=np.int64, width=3, on="cpu")
    # one task at a time: the simulator runs one kernel at once
    np.testing.assert_array_equal(per_variant.compute(scheduler="sync"), np.concatenate([c.sum(1), ac.sum(1)], -1))
    np.testing.assert_array_equal(per_sample.compute(scheduler="sync"), c.sum(0))


@pytest.mark.gpu
@requires_gpu
def test_gpu_counts_through_the_blueprint_equal_numpy():
    import cupy

    g = calls(3, 3, fill=True, seed=3)
    ds = dataset(g, 3, backend="gpu")
    c, ac = classes(g), allele_counts(g, 3)
    vs, ss = sg.variant_stats(ds, merge=False), sg.sample_stats(ds, merge=False)
    cc = sg.count_cohort_alleles(ds, merge=False)["cohort_allele_count"]
    for out in (vs["variant_n_het"], ss["sample_n_called"], cc):
        assert isinstance(out.data._meta, cupy.ndarray)  # on the device, as the genotypes
    assert_equal(vs["variant_n_het"], c.sum(1)[:, 2].astype(np.int64), "variant_n_het")
    assert_equal(vs["variant_allele_count"], ac.sum(1).astype(np.uint64), "variant_allele_count")
    assert_equal(ss["sample_n_called"], c.sum((0, 2)).astype(np.int64), "sample_n_called")
    cohort = ds["sample_cohort"].values
    assert_equal(cc, np.stack([ac[:, cohort == k].sum(1) for k in range(2)], 1).astype(np.uint64), "cohort_allele_count")
    assert memory.graph_partial_bytes(vs["variant_n_het"].data) == 13 * 6 * 8


@pytest.mark.gpu
@requires_gpu
def test_gpu_observed_heterozygosity_and_weir_goudet_beta_through_the_blueprint():
    import cupy

    ho = sg.observed_heterozygosity(heterozygosity_dataset("gpu"), merge=False)["stat_observed_heterozygosity"]
    beta = sg.Weir_Goudet_beta(ibs_dataset("gpu"), merge=False)["stat_Weir_Goudet_beta"]
    for out in (ho, beta):
        assert isinstance(out.data._meta, cupy.ndarray)  # on the device, as their input
    assert partials(ho.data, "pipeline-cohort-heterozygosity") and partials(beta.data, "pipeline-pairs-mean")
    cpu_ho = sg.observed_heterozygosity(heterozygosity_dataset(), merge=False)["stat_observed_heterozygosity"].values
    cpu_beta = sg.Weir_Goudet_beta(ibs_dataset(), merge=False)["stat_Weir_Goudet_beta"].values
    # the same sums, in cuBLAS's order within a block
    np.testing.assert_allclose(B.to_numpy(ho.data.compute()), cpu_ho, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(B.to_numpy(beta.data.compute()), cpu_beta, rtol=1e-12, equal_nan=True)
