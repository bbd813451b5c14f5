"""The counting statistics (pipeline.ops.genomics.stats) against sgkit's results.

References: ``tests/fixtures/genomics/sgkit_stats.npz``, made by ``sgkit_stats.py`` beside it with
sgkit 0.10 on the shared msprime data (missing calls whole and half, and fill values -2): the
``bi`` and ``multi`` sets, and ``tri``, a triploid set made from ``multi`` (:func:`triploid`, as
the script makes it). Counts are integers and must be equal; the ratios derived from them are the
same float64 operations on the same integers as sgkit's, so they are equal too. HWE p-values
agree within a few units of float64 rounding: sgkit compiles its test with ``fastmath``, which
lets LLVM reorder its sums (its own test without fastmath differs from it as much).

Chunkings put boundaries inside the data: 37 and 100 variants (641 and 556 variants), one block of
1000, and blocks of 25 samples (60 samples), so per-variant counts sum partials over blocks of
samples and per-sample counts over blocks of variants.

The CUDA kernels run in Numba's CUDA simulator here (tiny data, small thread shapes so that rows
span several tiles and threads have tails), and on a GPU against the CPU kernels, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pipeline
import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.errors import InputError
from pipeline.kernels import genotypes as K

from .conftest import raise_if_dask_computes, requires_gpu
from .genomics_data import dataset, inputs, sgkit

REF = sgkit("stats")

CHUNKINGS = [
    {"variants": 100, "samples": -1},
    {"variants": 37, "samples": 25},
    {"variants": 1000, "samples": 25},
]
KINDS = ["bi", "multi", "tri"]

VARIANT_STATS = ("variant_n_called", "variant_call_rate", "variant_n_het", "variant_n_hom_ref", "variant_n_hom_alt",
                 "variant_n_non_ref", "variant_allele_count", "variant_allele_total", "variant_allele_frequency")
SAMPLE_STATS = ("sample_n_called", "sample_call_rate", "sample_n_het", "sample_n_hom_ref", "sample_n_hom_alt",
                "sample_n_non_ref")


def triploid(g: np.ndarray) -> np.ndarray:
    """The ``tri`` set's genotypes, as ``sgkit_stats.py`` makes them: a third allele a call, the
    first allele of the previous sample's call."""
    return np.concatenate([g, np.roll(g[..., :1], 1, axis=1)], axis=2)


def data(kind: str, chunks: dict | None = None, backend: str = "cpu", fill: bool = True) -> xr.Dataset:
    """Data set ``kind`` ("bi", "multi", "tri"); ``fill=False``: every -2 turned into -1, as the
    fixture's ``*_nofill`` references."""
    ds = dataset("multi" if kind == "tri" else kind, chunks, backend)
    g = inputs()[f"{'multi' if kind == 'tri' else kind}_call_genotype"]
    if kind == "tri":
        g = triploid(g)
    if kind == "tri" or not fill:
        import dask.array as da

        g = g if fill else np.where(g == -2, -1, g).astype(g.dtype)
        c = {"variants": 100, "samples": -1, **(chunks or {})}
        arr = B.to_backend(da.from_array(g, chunks=(c["variants"], c["samples"], -1)), backend)
        ds = ds.drop_vars(["call_genotype", "call_genotype_mask"])
        ds["call_genotype"] = (("variants", "samples", "ploidy"), arr)
        ds["call_genotype"].attrs["mixed_ploidy"] = False
    return ds


def ref(kind: str, name: str) -> np.ndarray:
    return REF[f"{kind}_{name}"]


def assert_same(actual: xr.DataArray, expected: np.ndarray, name: str):
    """Equal values (NaN where sgkit has NaN) and the same dtype."""
    values = B.to_numpy(actual.data)
    assert values.dtype == expected.dtype, (name, values.dtype, expected.dtype)
    np.testing.assert_array_equal(values, expected, err_msg=name)


# --- against sgkit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=lambda c: f"v{c['variants']}s{c['samples']}")
@pytest.mark.parametrize("kind", KINDS)
def test_variant_and_sample_stats_equal_sgkit(kind, chunks):
    ds = data(kind, chunks)
    with raise_if_dask_computes():  # building the graphs computes nothing
        vs = sg.variant_stats(ds, merge=False)
        ss = sg.sample_stats(ds, merge=False)
    assert list(vs.data_vars) == list(VARIANT_STATS)
    assert list(ss.data_vars) == list(SAMPLE_STATS)
    vs, ss = vs.compute(), ss.compute()
    for name in VARIANT_STATS:
        assert vs[name].dims == (("variants", "alleles") if name in ("variant_allele_count", "variant_allele_frequency")
                                 else ("variants",))
        assert_same(vs[name], ref(kind, name), name)
    for name in SAMPLE_STATS:
        assert ss[name].dims == ("samples",)
        assert_same(ss[name], ref(kind, name), name)
    # the data hold what the counts must handle: partly missing calls, fill values, non-called
    g = ds["call_genotype"].values
    assert ((g == -1).any(-1) & (g >= 0).any(-1)).any() and (g == -2).any()
    assert (vs["variant_n_called"] < g.shape[1]).mean() > 0.5


@pytest.mark.parametrize("chunks", CHUNKINGS[1:], ids=lambda c: f"v{c['variants']}s{c['samples']}")
@pytest.mark.parametrize("kind", KINDS)
def test_allele_counts_equal_sgkit(kind, chunks):
    ds = data(kind, chunks)
    cac = sg.count_call_alleles(ds, merge=False)
    assert cac["call_allele_count"].dims == ("variants", "samples", "alleles")
    assert cac["call_allele_count"].data.chunks[:2] == ds["call_genotype"].data.chunks[:2]
    assert_same(cac["call_allele_count"], ref(kind, "call_allele_count"), "call_allele_count")
    for using in ("call_allele_count", "call_genotype"):
        vac = sg.count_variant_alleles(ds, using=using, merge=False)
        assert list(vac.data_vars) == ["variant_allele_count"]
        assert_same(vac["variant_allele_count"], ref(kind, "variant_allele_count"), using)
    # from call_allele_count where the dataset has it: its values, summed
    ds2 = sg.count_call_alleles(ds)
    ds2["call_allele_count"] = ds2["call_allele_count"] * np.uint8(2)
    vac = sg.count_variant_alleles(ds2, merge=False)["variant_allele_count"]
    assert_same(vac, 2 * ref(kind, "variant_allele_count"), "from call_allele_count")


def test_merge_as_sgkit():
    ds = data("bi")
    # sgkit defines call_allele_count first (counting from it, the default), and merges into that
    out = sg.count_variant_alleles(ds)
    assert {"variant_allele_count", "call_allele_count"} <= set(out.data_vars)
    assert "call_allele_count" not in sg.count_variant_alleles(ds, using="call_genotype")
    assert set(ds.data_vars) < set(sg.variant_stats(ds).data_vars)
    # variant_stats takes the dataset's allele counts, and keeps them as they are when merging
    ac = xr.DataArray(np.full((ds.sizes["variants"], 2), 3, np.uint64), dims=("variants", "alleles"))
    out = sg.variant_stats(ds.assign(variant_allele_count=ac))
    np.testing.assert_array_equal(out["variant_allele_count"].values, ac.values)
    np.testing.assert_array_equal(out["variant_allele_total"].values, 6)
    np.testing.assert_array_equal(out["variant_allele_frequency"].values, 0.5)
    assert_same(out["variant_n_het"], ref("bi", "variant_n_het"), "variant_n_het")
    # a copy under another name is used, and returned as variant_allele_count
    out = sg.variant_stats(ds.assign(my_ac=ac), variant_allele_count="my_ac")
    np.testing.assert_array_equal(out["variant_allele_count"].values, ac.values)


@pytest.mark.parametrize("kind", KINDS)
def test_genotype_counts_equal_sgkit(kind):
    ds = data(kind, {"variants": 37, "samples": 25}, fill=False)
    out = sg.count_variant_genotypes(ds)
    assert_same(out["variant_genotype_count"], ref(kind, "variant_genotype_count_nofill"), "variant_genotype_count")
    np.testing.assert_array_equal(out["genotype_id"].values, ref(kind, "genotype_id"))
    np.testing.assert_array_equal(out.coords["genotypes"].values, ref(kind, "genotype_id"))
    alone = sg.count_variant_genotypes(ds, merge=False)
    assert list(alone.data_vars) == ["variant_genotype_count"] and "genotypes" in alone.coords
    assert "genotypes" not in sg.count_variant_genotypes(ds, merge=False, assign_coords=False).coords


@pytest.mark.parametrize("kind", KINDS)
def test_genotype_counts_refuse_fill_values_as_sgkit(kind):
    assert str(ref(kind, "genotype_count_error")).startswith("ValueError: Mixed-ploidy genotype indicated by allele < -1")
    out = sg.count_variant_genotypes(data(kind), merge=False)  # lazy: raises when computed
    with pytest.raises(InputError, match="'call_genotype' holds .* calls .* fill value"):
        out.compute()
    assert str(REF["bi_hwe_error"]).startswith("ValueError: Mixed-ploidy")
    if kind == "bi":
        with pytest.raises(InputError, match="fill value"):
            sg.hardy_weinberg_test(data(kind)).compute()


def test_genotype_counts_biallelic_rules():
    """sgkit's biallelic rule walks a call's alleles in order: (-1, -2) is missing, (0, -2) and
    (-2, -1) are refused; with more alleles any -2 is refused."""
    g = np.array([[[-1, -2], [0, 1], [1, 1], [-1, 0]]], np.int8)
    np.testing.assert_array_equal(K.variant_genotype_counts_cpu(g, 2)[0, 0], [0, 1, 1, 0])
    for bad in ([0, -2], [-2, -1], [0, 2]):
        assert K.variant_genotype_counts_cpu(np.array([[bad]], np.int8), 2)[0, 0, -1] == 1
    assert K.variant_genotype_counts_cpu(np.array([[[-1, -2]]], np.int8), 3)[0, 0, -1] == 1
    assert K.variant_genotype_counts_cpu(np.array([[[0, 3]]], np.int8), 3)[0, 0, -1] == 1


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=lambda c: f"v{c['variants']}s{c['samples']}")
def test_hardy_weinberg_test_equals_sgkit(chunks):
    ds = data("bi", chunks, fill=False)
    with raise_if_dask_computes():
        out = sg.hardy_weinberg_test(ds)
    assert {"variant_hwe_p_value", "variant_genotype_count", "genotype_id"} <= set(out.data_vars)
    p = out["variant_hwe_p_value"]
    assert p.dims == ("variants",) and p.dtype == np.float64
    expected = ref("bi", "variant_hwe_p_value_nofill")
    np.testing.assert_allclose(p.values, expected, rtol=1e-14, atol=0)
    assert (expected < 1).sum() > 50 and expected.min() < 0.01  # not only trivial p-values


def test_hardy_weinberg_test_on_given_counts():
    """The ``genotype_count`` path: counts given with their coordinates, ploidy and alleles given
    where the dataset has no such dimensions; edge cases (no calls: NaN) and counts in thousands."""
    counts = REF["hwe_counts"]
    expected = REF["hwe_counts_p_value"]
    ds = xr.Dataset({"gc": (("variants", "genotypes"), counts)}, coords={"genotypes": ["0/0", "0/1", "1/1"]})
    p = sg.hardy_weinberg_test(ds.chunk({"variants": 50}), genotype_count="gc", ploidy=2, alleles=2, merge=False)
    p = p["variant_hwe_p_value"].values
    assert np.isnan(expected[0]) and np.isnan(p[0])  # no calls
    np.testing.assert_allclose(p, expected, rtol=1e-13, atol=0, equal_nan=True)
    assert np.nanmin(expected) == 0 and expected[expected > 0].min() < 1e-100  # tails that underflow
    # the same counts in another column order: read by coordinates, not by position
    swapped = ds.isel(genotypes=[2, 0, 1])
    p2 = sg.hardy_weinberg_test(swapped, genotype_count="gc", ploidy=2, alleles=2)["variant_hwe_p_value"].values
    np.testing.assert_array_equal(p2, p)


def test_hardy_weinberg_test_refuses():
    ds = data("bi", fill=False)
    with pytest.raises(InputError, match="biallelic"):
        sg.hardy_weinberg_test(data("multi"))
    with pytest.raises(InputError, match="diploid"):
        sg.hardy_weinberg_test(data("tri"))
    counts = xr.Dataset({"variant_genotype_count": (("variants", "genotypes"), REF["hwe_counts"][:5])})
    with pytest.raises(InputError, match="ploidy must be given"):
        sg.hardy_weinberg_test(counts)
    with pytest.raises(InputError, match="no coordinates for dimension 'genotypes'"):
        sg.hardy_weinberg_test(counts, ploidy=2, alleles=2)
    wrong = counts.assign_coords(genotypes=["0/0", "0/1", "0/2"])
    with pytest.raises(InputError, match="no counts for genotype '1/1'"):
        sg.hardy_weinberg_test(wrong, ploidy=2, alleles=2)
    negative = counts.assign_coords(genotypes=["0/0", "0/1", "1/1"])
    negative["variant_genotype_count"] = negative["variant_genotype_count"].astype(np.int64) - 10
    with pytest.raises(InputError, match="negative genotype counts"):
        sg.hardy_weinberg_test(negative, ploidy=2, alleles=2).compute()
    with pytest.raises(InputError, match="'my_counts'"):
        sg.hardy_weinberg_test(ds, genotype_count="my_counts")


# --- bad input ---------------------------------------------------------------------------------------

OPS = ["count_call_alleles", "count_variant_alleles", "variant_stats", "sample_stats", "count_variant_genotypes"]


@pytest.mark.parametrize("name", OPS)
def test_bad_genotypes_name_the_variable(name):
    op = getattr(sg, name)
    ds = data("bi")
    kwargs = {"using": "call_genotype"} if name == "count_variant_alleles" else {}
    with pytest.raises(InputError, match=f"{name}: the dataset has no variable 'call_genotype'"):
        op(ds.drop_vars("call_genotype"), **kwargs)
    with pytest.raises(InputError, match=r"variable 'call_genotype' has dimensions \('samples', 'variants', 'ploidy'\)"):
        op(ds.assign(call_genotype=ds["call_genotype"].transpose("samples", "variants", "ploidy")), **kwargs)
    with pytest.raises(InputError, match="variable 'call_genotype' has values of type float32, expected signed integers"):
        op(ds.assign(call_genotype=ds["call_genotype"].astype(np.float32)), **kwargs)
    with pytest.raises(InputError, match="expected an xarray.Dataset"):
        op(ds["call_genotype"], **kwargs)
    if name != "sample_stats":
        with pytest.raises(InputError, match="no 'alleles' dimension"):
            op(ds.drop_vars("variant_allele"), **kwargs)


def test_other_bad_input():
    ds = data("bi")
    mixed = ds.copy()
    mixed["call_genotype"] = mixed["call_genotype"].assign_attrs(mixed_ploidy=True)
    for op in (sg.variant_stats, sg.sample_stats, sg.count_variant_genotypes):
        with pytest.raises(InputError, match="mixed-ploidy"):
            op(mixed)
    with pytest.raises(InputError, match="using must be"):
        sg.count_variant_alleles(ds, using="genotypes")
    with pytest.raises(InputError, match="no variable 'my_cac'"):
        sg.count_variant_alleles(ds, call_allele_count="my_cac")
    with pytest.raises(InputError, match="no variable 'my_ac'"):
        sg.variant_stats(ds, variant_allele_count="my_ac")
    with pytest.raises(InputError, match="'call_allele_count' has values of type int64, expected unsigned"):
        sg.count_variant_alleles(ds.assign(call_allele_count=sg.count_call_alleles(ds)["call_allele_count"].astype(np.int64)))


# --- the registry and the kernels ---------------------------------------------------------------------


def test_ops_are_registered_dataset_ops():
    from pipeline.ops.genomics import stats

    assert sorted(stats.__all__) == ["count_call_alleles", "count_variant_alleles", "count_variant_genotypes",
                                     "hardy_weinberg_test", "sample_stats", "variant_stats"]
    for name in ("count_call_alleles", "count_variant_alleles", "count_variant_genotypes", "variant_stats",
                 "sample_stats", "hardy_weinberg_test"):
        op = pipeline.ops.get(name)
        assert op.dataset and op.backends == ("cpu", "gpu") and name in sg.__all__


def test_each_op_runs_the_kernels_it_declares():
    ds = data("bi", {"variants": 100, "samples": 25}, fill=False)
    cases = {
        "count_call_alleles": ("call_allele_count",),
        "count_variant_alleles": ("variant_allele_count",),
        "variant_stats": VARIANT_STATS,
        "sample_stats": SAMPLE_STATS,
        "count_variant_genotypes": ("variant_genotype_count",),
    }
    for name, outputs in cases.items():
        op = pipeline.ops.get(name)
        with kernels.recording() as calls:
            out = op.func(ds, merge=False)
            pipeline.compute(out[list(outputs)])
        assert {k for k, _ in calls} == set(op.kernels["cpu"]), (name, calls)
    counts = sg.count_variant_genotypes(ds).persist()  # the test alone, from given counts
    with kernels.recording() as calls:
        sg.hardy_weinberg_test(counts, merge=False)["variant_hwe_p_value"].compute()
    assert {k for k, _ in calls} == {"hwe_exact"}


def test_genotype_ids():
    from pipeline.ops.genomics.stats import genotype_ids

    assert list(genotype_ids(2, 2)) == ["0/0", "0/1", "1/1"]
    assert list(genotype_ids(3, 2)) == ["0/0", "0/1", "1/1", "0/2", "1/2", "2/2"]
    assert len(genotype_ids(11, 2)) == K.n_genotypes(11, 2) == 66 and genotype_ids(11, 2).dtype == "<U5"


def random_calls(shape, n_alleles, seed=0, dtype=np.int8):
    """Random calls with whole and partial missing calls and fill values."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, n_alleles, size=shape).astype(dtype)
    u = rng.random(shape[:2])
    g[u < 0.1] = -1
    g[(u >= 0.1) & (u < 0.15), 0] = -1
    g[(u >= 0.15) & (u < 0.18), -1] = -2
    g[(u >= 0.18) & (u < 0.2), 0] = n_alleles  # beyond the alleles dimension: not counted
    return g


def reference_counts(g, n_alleles):
    """sgkit's rules as NumPy formulas: (variants, 3 + alleles) and (samples, 3)."""
    called = (g >= 0).all(-1)
    hom = (g == g[..., :1]).all(-1)
    classes = np.stack([called & hom & (g[..., 0] == 0), called & hom & (g[..., 0] > 0), called & ~hom], -1)
    alleles = np.stack([(g == a).sum(-1) for a in range(n_alleles)], -1)
    return np.concatenate([classes.sum(1), alleles.sum(1)], -1), classes.sum(0)


@pytest.mark.parametrize("ploidy,n_alleles,dtype", [(2, 2, np.int8), (3, 4, np.int16), (2, 10, np.int8)])
def test_cpu_kernels_against_formulas(ploidy, n_alleles, dtype):
    g = random_calls((23, 41, ploidy), n_alleles, seed=ploidy, dtype=dtype)
    per_variant, per_sample = reference_counts(g, n_alleles)
    np.testing.assert_array_equal(K.variant_call_counts_cpu(g, n_alleles)[:, 0], per_variant)
    # the GPU kernel's per-call function (counts in registers, alleles by comparisons), on the CPU
    np.testing.assert_array_equal(K.call_counts_twin(g, n_alleles), per_variant)
    np.testing.assert_array_equal(K.sample_call_counts_cpu(g)[0], per_sample)
    expected = np.stack([(g == a).sum(-1) for a in range(n_alleles)], -1).astype(np.uint8)
    np.testing.assert_array_equal(K.call_allele_counts_cpu(g, n_alleles), expected)
    # genotype counts of the calls with no fill or out-of-range allele: their sorted alleles' index
    gc = K.variant_genotype_counts_cpu(g, n_alleles)[:, 0]
    ok = (g >= 0).all(-1) & (g < n_alleles).all(-1)
    refused = ((g == -2).any(-1) & (n_alleles > 2)) | (g >= n_alleles).any(-1)
    if n_alleles > 2:
        np.testing.assert_array_equal(gc[:, -1], refused.sum(1))
    from math import comb

    index = np.zeros(g.shape[:2], np.int64)
    s = np.sort(g, axis=-1).astype(np.int64)
    for i in range(ploidy):
        index += np.vectorize(lambda a, i=i: comb(a + i, i + 1) if a >= 0 else 0)(s[..., i])
    expected = np.stack([((index == k) & ok).sum(1) for k in range(gc.shape[1] - 1)], -1)
    np.testing.assert_array_equal(gc[:, :-1], expected)


# --- the CUDA kernels: in the simulator here, on the GPU there ------------------------------------------


@pytest.mark.cudasim
@pytest.mark.parametrize("ploidy,n_alleles", [(2, 3), (3, 2)])
def test_cuda_kernels_equal_the_cpu_kernels(ploidy, n_alleles):
    g = random_calls((5, 13, ploidy), n_alleles, seed=ploidy)
    # rows of 13 samples over 4-thread rows in tiles of 8 samples: two tiles, a partial step, tails;
    # 5 variants in blocks of 2 rows: a block with a row past the end
    shape = dict(tx=4, ty=2, unroll=2, tile=8)
    np.testing.assert_array_equal(K.variant_call_counts_gpu(g, n_alleles, **shape), K.variant_call_counts_cpu(g, n_alleles))
    np.testing.assert_array_equal(K.variant_genotype_counts_gpu(g, n_alleles, **shape),
                                  K.variant_genotype_counts_cpu(g, n_alleles))
    np.testing.assert_array_equal(K.sample_call_counts_gpu(g, threads=8, unroll=2, vtile=3), K.sample_call_counts_cpu(g))


# --- the word kernels: int8, diploid, biallelic --------------------------------------------------------


def word_calls(shape, seed=0):
    """Diploid biallelic int8 calls, a kind of row in turn: only 0 and 1 (every word counted by
    bit operations); 0, 1, -1 and -2 anywhere in a call (still by bit operations); and other values
    too (alleles 2 and 3, -3, -128, 127: those words call by call)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 2, size=shape, dtype=np.int8)
    u = rng.random(shape)
    kind = (np.arange(shape[0]) % 3)[:, None, None]
    g = np.where((kind >= 1) & (u < 0.25), rng.choice(np.array([-1, -2], np.int8), size=shape), g)
    return np.where((kind == 2) & (u > 0.95), rng.choice(np.array([2, 3, -3, -128, 127], np.int8), size=shape), g)


def test_word_flags_count_as_the_call_functions():
    """Every word of two calls of 0, 1, -1 and -2 (4**4 words), counted by the bit operations of
    the CUDA kernels (``word_flags``), against the CPU kernels on the same calls; every byte value
    in every place, for the test that sends a word to the per-call rules; and the per-call allele
    counts' 64-bit words (4**8)."""
    values = np.array([0, 1, -1, -2], np.int8)
    choice = np.arange(4**4)[:, None] >> 2 * np.arange(4) & 3  # every choice of a value for each byte
    calls = values[choice].reshape(-1, 2, 2)  # a variant a word
    flags = K.word_flags(calls.reshape(-1, 4).view(np.uint32).ravel())
    assert not flags["odd"].any()
    bits = {k: bit_counts(v) for k, v in flags.items()}
    het = bits["called"] - bits["hom_ref"] - bits["hom_alt"]
    counts = np.stack([bits["hom_ref"], bits["hom_alt"], het, bits["zeros"], bits["ones"]], -1)
    np.testing.assert_array_equal(counts, K.variant_call_counts_cpu(calls, 2)[:, 0])
    genotypes = np.stack([bits["hom_ref"], het, bits["hom_alt"], bits["refused"]], -1)
    np.testing.assert_array_equal(genotypes, K.variant_genotype_counts_cpu(calls, 2)[:, 0])
    for at in (0, 8):  # the per-sample kernel's flags, at each call's first byte or its second
        f = K.word_flags(calls.reshape(-1, 4).view(np.uint32).ravel(), at)
        per_sample = np.stack([(f[k][:, None] >> np.uint32(at + 16 * j)) & np.uint32(1)
                               for j in range(2) for k in ("hom_ref", "hom_alt", "called")], -1).reshape(-1, 2, 3)
        per_sample[..., 2] -= per_sample[..., 0] + per_sample[..., 1]
        np.testing.assert_array_equal(per_sample, K.sample_call_counts_cpu(calls.reshape(1, -1, 2))[0].reshape(-1, 2, 3))
    for place in range(4):
        b = np.zeros((256, 4), np.uint8)
        b[:, place] = np.arange(256)
        odd = K.word_flags(b.view(np.uint32).ravel())["odd"]
        np.testing.assert_array_equal(odd != 0, ~np.isin(b[:, place].view(np.int8), values))
    # the per-call allele counts' 64-bit words (four calls): every word of 0, 1, -1 and -2 (4**8)
    choice = np.arange(4**8)[:, None] >> 2 * np.arange(8) & 3
    calls = values[choice].reshape(-1, 4, 2)
    fast, counts = K.word_call_alleles(calls.reshape(-1, 8).view(np.uint64).ravel())
    assert fast.all()
    np.testing.assert_array_equal(counts, K.call_allele_counts_cpu(calls, 2).reshape(-1, 8).view(np.uint64).ravel())
    for place in range(8):  # any other byte, in any place, sends the word call by call
        b = np.zeros((256, 8), np.uint8)
        b[:, place] = np.arange(256)
        fast, _ = K.word_call_alleles(b.view(np.uint64).ravel())
        np.testing.assert_array_equal(fast, np.isin(b[:, place].view(np.int8), values))


def bit_counts(words):
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8).reshape(words.size, -1), axis=1).sum(1)


def test_word_path():
    g = word_calls((7, 23, 2))
    assert K.word_path(g) and K.word_path(g, 2)
    assert not K.word_path(g, 3)
    assert not K.word_path(g.astype(np.int16))
    assert not K.word_path(np.zeros((7, 23, 3), np.int8))
    assert not K.word_path(g[:, ::2])  # not C-contiguous (the kernels copy it first)
    assert not K.word_path(g[:1, :3])  # fewer than four calls
    shifted = np.empty(g.size + 8, np.int8)[2 : 2 + g.size].reshape(g.shape)  # an address not a multiple of 8
    assert K.word_path(shifted)
    assert not K._use_words(g, 2, None)  # the CUDA C kernels: on the GPU
    with pytest.raises(ValueError, match="word kernels"):
        K.variant_call_counts_gpu(g, 3, words=True)
    with pytest.raises(ValueError, match="on the GPU"):
        K.variant_call_counts_gpu(g, 2, words=True)
    with pytest.raises(ValueError, match="word kernels"):
        K.word_row_shape(7, 23, tx=4, ty=2)  # 8 threads: not whole warps
    assert K.word_row_shape(7, 37)[0] == 1  # a thread a row of 37 samples (4 whole units)
    assert K.word_row_shape(100_000, 25_000)[:2] == (32, 4)


@pytest.mark.cudasim
@pytest.mark.parametrize("n_samples", [24, 23, 22, 3])
def test_numba_kernels_on_word_calls_equal_the_cpu_kernels(n_samples):
    # under the simulator the counts of int8 diploid biallelic calls (NumPy arrays) take the
    # generic Numba kernels: rows of 24 samples are 6 whole words; of 22 and 23, 5 words and part
    # of one, rows starting at every byte offset of a word; of 3, part of a word
    g = word_calls((7, n_samples, 2), seed=n_samples)
    assert K.word_path(g)
    shape = dict(tx=4, ty=8, unroll=2, tile=20)
    np.testing.assert_array_equal(K.variant_call_counts_gpu(g, 2, **shape), K.variant_call_counts_cpu(g, 2))
    np.testing.assert_array_equal(K.variant_genotype_counts_gpu(g, 2, **shape), K.variant_genotype_counts_cpu(g, 2))
    np.testing.assert_array_equal(K.sample_call_counts_gpu(g, threads=32, unroll=2, vtile=3), K.sample_call_counts_cpu(g))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("n_samples", [24, 23, 22, 3, 8, 9, 16, 37, 1001])
def test_cuda_c_word_kernels_equal_the_cpu_kernels(n_samples):
    """The CUDA C kernels in small shapes: rows of 4 threads in tiles of 2 units (16 bytes), a
    step of 2 units, rows starting and ending mid-unit (the calls outside whole units by the
    per-call rules), 7 variants in blocks of 8 rows (one past the end), a third of the variants
    with words counted call by call; per sample, tiles of 3 variants; at the array's own address
    and at one 2 bytes past a multiple of 16 (a view), and in the kernels' own shapes."""
    import cupy

    g = word_calls((7, n_samples, 2), seed=n_samples)
    base = cupy.zeros(g.size + 16, np.int8)
    for d in (cupy.asarray(g), base[2 : 2 + g.size].reshape(g.shape)):
        d[...] = cupy.asarray(g)
        for shape in (dict(tx=4, ty=8, unroll=2, tile=2), {}):
            for name in ("variant_call_counts", "variant_genotype_counts"):
                got = getattr(K, f"{name}_gpu")(d, 2, words=True, **shape)
                np.testing.assert_array_equal(cupy.asnumpy(got), getattr(K, f"{name}_cpu")(g, 2), err_msg=f"{name} {shape}")
        for shape in (dict(threads=32, unroll=2, vtile=3), {}):
            np.testing.assert_array_equal(cupy.asnumpy(K.sample_call_counts_gpu(d, words=True, **shape)),
                                          K.sample_call_counts_cpu(g), err_msg=str(shape))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("ploidy,n_alleles,dtype", [(2, 2, np.int8), (2, 4, np.int8), (3, 3, np.int16), (4, 6, np.int8), (2, 12, np.int8)])
def test_gpu_kernels_equal_the_cpu_kernels(ploidy, n_alleles, dtype):
    import cupy

    # generic kernels: 128 threads a row in tiles; 32 threads a row. Word kernels (int8, diploid,
    # biallelic): rows of whole words (5000 samples), rows starting mid-word (4998: every other row;
    # 4999 and 20001: three rows in four; 37: a thread a row), rows of 20001 samples over two tiles
    words = ploidy == 2 and n_alleles == 2 and dtype == np.int8
    for shape in [(300, 5000, ploidy), (300, 4999, ploidy), (257, 4998, ploidy), (100, 20001, ploidy),
                  (1000, 37, ploidy)]:
        g = random_calls(shape, n_alleles, seed=shape[1], dtype=dtype)
        d = cupy.asarray(g)
        assert K.word_path(d, n_alleles) == words
        for name, args in [("variant_call_counts", (n_alleles,)), ("variant_genotype_counts", (n_alleles,)),
                           ("sample_call_counts", ()), ("call_allele_counts", (n_alleles,))]:
            expected = kernels.get(name, "cpu")(g, *args)
            gpu = kernels.get(name, "gpu")(d, *args)
            np.testing.assert_array_equal(cupy.asnumpy(gpu), expected, err_msg=name)
            if words and name != "call_allele_counts":  # the generic kernel on the same data (one kernel per call)
                gpu = kernels.get(name, "gpu")(d, *args, words=False)
                np.testing.assert_array_equal(cupy.asnumpy(gpu), expected, err_msg=f"{name}, generic")
    if words:  # only 0 and 1 (every word by bit operations), and a block at an address not a multiple of 8
        g = np.random.default_rng(2).integers(0, 2, size=(500, 3001, 2), dtype=np.int8)
        d = cupy.asarray(g)
        np.testing.assert_array_equal(cupy.asnumpy(K.variant_call_counts_gpu(d, 2)), K.variant_call_counts_cpu(g, 2))
        np.testing.assert_array_equal(cupy.asnumpy(K.sample_call_counts_gpu(d)), K.sample_call_counts_cpu(g))
        shifted = cupy.empty(d.size + 8, np.int8)[2 : 2 + d.size].reshape(d.shape)
        shifted[...] = d
        assert K.word_path(shifted)  # the CUDA C kernels at any address
        np.testing.assert_array_equal(cupy.asnumpy(K.variant_call_counts_gpu(shifted, 2)),
                                      K.variant_call_counts_cpu(g, 2))
        np.testing.assert_array_equal(cupy.asnumpy(K.sample_call_counts_gpu(shifted)), K.sample_call_counts_cpu(g))
    counts = np.random.default_rng(1).integers(0, 3000, size=(5000, 3))
    gpu = K.hwe_exact_gpu(*(cupy.asarray(counts[:, k]) for k in (1, 0, 2)))
    # no multiply-add in the test's arithmetic for the compiler to fuse: the same bits
    np.testing.assert_array_equal(cupy.asnumpy(gpu), K.hwe_exact_cpu(counts[:, 1], counts[:, 0], counts[:, 2]))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("ploidy,n_alleles,dtype", [(2, 2, np.int8), (1, 3, np.int32), (3, 4, np.int64), (2, 7, np.int16)])
def test_call_allele_counts_kernel_equals_the_cpu_kernel(ploidy, n_alleles, dtype):
    """The per-call CUDA C kernels (``cuda/calls.cu``): 1,001 calls (the unrolled loop and its
    tail; with words, a call past the last word), 6 million (several unrolled steps a thread), a
    view that is not C-contiguous, no alleles at all, and int8 diploid biallelic calls at an
    address that is not a multiple of 8 (call by call)."""
    import cupy

    for shape in [(77, 13, ploidy), (3000, 2001, ploidy)]:
        g = random_calls(shape, n_alleles, seed=shape[0], dtype=dtype)
        got = K.call_allele_counts_gpu(cupy.asarray(g), n_alleles)
        assert got.dtype == np.uint8 and got.shape == shape[:2] + (n_alleles,)
        np.testing.assert_array_equal(cupy.asnumpy(got), K.call_allele_counts_cpu(g, n_alleles))
    g = random_calls((40, 30, ploidy), n_alleles, dtype=dtype)
    got = K.call_allele_counts_gpu(cupy.asarray(g)[:, 1::3], n_alleles)
    np.testing.assert_array_equal(cupy.asnumpy(got), K.call_allele_counts_cpu(np.ascontiguousarray(g[:, 1::3]), n_alleles))
    assert K.call_allele_counts_gpu(cupy.asarray(g), 0).shape == (40, 30, 0)
    if K.word_path(g, n_alleles):  # int8 diploid biallelic: by words at a multiple of 8, else call by call
        only = np.clip(g, -2, 1)  # every word by bit operations
        d = cupy.asarray(only)
        shifted = cupy.zeros(only.size + 8, np.int8)[2 : 2 + only.size].reshape(only.shape)
        shifted[...] = d
        for x in (d, shifted):
            np.testing.assert_array_equal(cupy.asnumpy(K.call_allele_counts_gpu(x, 2)), K.call_allele_counts_cpu(only, 2))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("ploidy,n_alleles,dtype",
                         [(2, 2, np.int8), (2, 4, np.int8), (3, 3, np.int16), (1, 2, np.int64)])
def test_genotype_allele_frequencies_kernel_equals_the_formulas(ploidy, n_alleles, dtype):
    """The CUDA C call allele frequencies (``cuda/calls.cu``) against the CPU's formulas, bit for bit:
    missing and fill alleles, alleles at and past ``n_alleles`` (not counted), calls with none
    counted (NaN), a view that is not C-contiguous."""
    import cupy

    rng = np.random.default_rng(ploidy * 10 + n_alleles)
    for shape in [(77, 13, ploidy), (2000, 1001, ploidy)]:
        g = rng.integers(-2, n_alleles + 2, size=shape).astype(dtype)
        got = cupy.asnumpy(K.genotype_allele_frequencies_gpu(cupy.asarray(g), n_alleles))
        want = K.genotype_allele_frequencies_cpu(g, n_alleles)
        assert np.isnan(want).any()
        np.testing.assert_array_equal(got, want)
    view = cupy.asarray(g)[:, 1::3]
    np.testing.assert_array_equal(cupy.asnumpy(K.genotype_allele_frequencies_gpu(view, n_alleles)),
                                  K.genotype_allele_frequencies_cpu(g[:, 1::3], n_alleles))


def _probabilities(rng, shape, dtype):
    """Genotype probabilities with NaN, ties for the largest (and for a smaller one), values equal
    to the thresholds tested, and float32 values just below 0.9 in float64."""
    gp = rng.dirichlet([1, 1, 1], size=shape).astype(dtype)
    flat = gp.reshape(-1, 3)
    n = flat.shape[0]
    flat[::11, 1] = np.nan
    flat[3::13] = np.array([0.4, 0.4, 0.2], dtype=dtype)  # tie for the largest: no call
    flat[5::17] = np.array([0.6, 0.2, 0.2], dtype=dtype)  # tie below it: a call
    flat[7::19] = np.array([0.05, 0.05, 0.9], dtype=dtype)  # at 0.9 (float32: just below in float64)
    flat[9::23] = np.array([0.25, 0.5, 0.25], dtype=dtype)  # exactly 0.5
    flat[n // 2] = np.nan
    return gp


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hard_calls_equal_sgkits_rule_call_by_call(dtype):
    """The CPU kernel of ``convert_probability_to_call`` against sgkit's loop, written out here
    call by call, at thresholds 0, 0.5 and 0.9."""
    gp = _probabilities(np.random.default_rng(4), (60, 7), dtype)
    for threshold in (0.0, 0.5, 0.9):
        want = np.full(gp.shape[:2] + (2,), -1, np.int8)
        for v, s in np.ndindex(gp.shape[:2]):
            p = gp[v, s]
            if np.isnan(p).any():
                continue
            i = int(np.argmax(p))
            if (threshold > 0 and float(p[i]) < threshold) or (p[i] == p).sum() > 1:  # sgkit: a float64 threshold
                continue
            want[v, s] = [(0, 0), (1, 0), (1, 1)][i]
        np.testing.assert_array_equal(K.hard_calls_cpu(gp, threshold), want, err_msg=f"{threshold}")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hard_calls_kernel_equals_the_cpu_kernel(dtype):
    """The CUDA C hard calls (``cuda/probabilities.cu``) against the CPU's array formulas: small
    and 3 million calls, a view that is not C-contiguous, thresholds 0, 0.5 and 0.9."""
    import cupy

    rng = np.random.default_rng(5)
    for shape in [(77, 13), (1500, 2001)]:
        gp = _probabilities(rng, shape, dtype)
        for threshold in (0.0, 0.5, 0.9):
            got = K.hard_calls_gpu(cupy.asarray(gp), threshold)
            assert got.dtype == np.int8
            np.testing.assert_array_equal(cupy.asnumpy(got), K.hard_calls_cpu(gp, threshold),
                                          err_msg=f"{shape} {threshold}")
    gp = _probabilities(rng, (40, 30), dtype)
    np.testing.assert_array_equal(cupy.asnumpy(K.hard_calls_gpu(cupy.asarray(gp)[:, 1::3], 0.9)),
                                  K.hard_calls_cpu(gp[:, 1::3], 0.9))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("ploidy,biallelic,dtype", [(2, True, np.int8), (2, False, np.int8), (3, False, np.int16),
                                                    (1, True, np.int32), (4, False, np.int64)])
def test_call_genotype_index_kernel_equals_the_cpu_kernel(ploidy, biallelic, dtype):
    """The CUDA C genotype index (``cuda/calls.cu``) against the CPU's array formulas: on 1,001
    and 6 million calls, a view that is not C-contiguous, and the flags of the calls sgkit raises
    on (a fill value anywhere; an allele above 1 with two alleles)."""
    import cupy

    top = 2 if biallelic else 6  # alleles 0 to top - 1, and -1
    rng = np.random.default_rng(ploidy)
    for shape in [(77, 13, ploidy), (3000, 2001, ploidy)]:
        g = rng.integers(-1, top, size=shape).astype(dtype)
        index, refused = K.call_genotype_index_gpu(cupy.asarray(g), biallelic)
        expected, expected_refused = K.call_genotype_index_cpu(g, biallelic)
        assert refused == expected_refused == 0
        assert index.dtype == np.int64
        np.testing.assert_array_equal(cupy.asnumpy(index), expected)
    g = rng.integers(-1, top, size=(40, 30, ploidy)).astype(dtype)
    np.testing.assert_array_equal(cupy.asnumpy(K.call_genotype_index_gpu(cupy.asarray(g)[:, 1::3], biallelic)[0]),
                                  K.call_genotype_index_cpu(g[:, 1::3], biallelic)[0])
    g[7, 11, 0] = 0
    for value, flag in ((-2, K.REFUSED_FILL), (2, K.REFUSED_ABOVE_ONE if biallelic else 0)):
        bad = g.copy()
        bad[7, 11, 0] = value
        assert K.call_genotype_index_gpu(cupy.asarray(bad), biallelic)[1] == K.call_genotype_index_cpu(bad, biallelic)[1] == flag


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_ops_equal_cpu_ops(kind):
    import cupy

    chunks = {"variants": 37, "samples": 25}
    runs = {}
    for backend in ("cpu", "gpu"):
        ds = data(kind, chunks, backend, fill=kind != "bi")
        parts = [sg.variant_stats(ds, merge=False), sg.sample_stats(ds, merge=False),
                 sg.count_call_alleles(ds, merge=False), sg.count_variant_alleles(ds, using="call_genotype", merge=False)]
        if kind == "bi":
            parts.append(sg.hardy_weinberg_test(ds, merge=False))
        out = xr.merge(parts, compat="override")  # variables two ops both give are compared below, not by xarray
        if backend == "gpu":
            assert all(isinstance(b, cupy.ndarray) for v in out.data_vars for b in [out[v].data._meta])
        runs[backend] = B.to_numpy(out.compute())
    for name in runs["cpu"].data_vars:
        np.testing.assert_array_equal(runs["gpu"][name].values, runs["cpu"][name].values, err_msg=name)


def test_whole_results_compute_through_pipeline():
    """Every op's merged result computes as one Dataset through pipeline.compute (Dask 2026.8
    loses blocks of an output that another output of the same Dataset derives from)."""
    from pipeline.ops.genomics import stats

    ds = data("bi", {"variants": 100, "samples": 25}, fill=False)
    for name in stats.__all__:
        out = pipeline.compute(getattr(sg, name)(ds))
        assert set(ds.data_vars) < set(out.data_vars), name
    stats = pipeline.compute(sg.variant_stats(ds))
    assert_same(stats["variant_n_non_ref"], ref("bi", "variant_n_non_ref"), "variant_n_non_ref")


def test_benchmark_runs_tiny(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "genotype_counts.py"
    spec = importlib.util.spec_from_file_location("genotype_counts", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--variants", "30", "--samples", "40", "--backend", "cpu", "--threads", "2", "--repeat", "1",
                      "--json", str(tmp_path / "counts.json")])
    assert {r["kernel"] for r in out["rows"]} == set(bench.KERNELS)
    assert all(r["seconds"] > 0 and r["gb_per_s"] > 0 for r in out["rows"])
    assert (tmp_path / "counts.json").exists()
