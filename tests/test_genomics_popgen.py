"""Windows and population genetics (pipeline.ops.genomics.window, .popgen) against sgkit 0.10's
results on the shared data (``tests/fixtures/genomics/sgkit_popgen.py`` made
``sgkit_popgen.npz``), and their kernels.

The data have missing calls (whole, one allele, fill) and two contigs. Our side runs on several
chunkings: 100, 37 and 1000 variants (37 and 100 put block boundaries inside windows of 50 and
window boundaries inside blocks; 1000 is one block), all samples or 25 (60 samples: blocks of 25,
25, 10, whose cohort counts add up).

Counts and windows equal sgkit's exactly. Every statistic is float64 on both sides; a window sum
that crosses blocks adds its pieces in another order than sgkit's one sum, and Tajima's D
subtracts nearly equal numbers (diversity less theta), so floats agree within float64 rounding
amplified by that cancellation: rtol 1e-9, atol 1e-12, far inside float32 rounding.
"""

from __future__ import annotations

import importlib.util

import dask
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.errors import InputError
from pipeline.kernels import popgen as K
from pipeline.reduce.windows import window_sums

from .conftest import raise_if_dask_computes, requires_gpu
from .genomics_data import FIXTURES, dataset, sgkit

RTOL, ATOL = 1e-9, 1e-12

_spec = importlib.util.spec_from_file_location("sgkit_popgen_fixture", FIXTURES / "sgkit_popgen.py")
FIX = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(FIX)  # the fixture script's settings (it imports sgkit only when run)

REF = sgkit("popgen")
STAT_VARS = {"div": "stat_diversity", "dvg": "stat_divergence", "fst_hudson": "stat_Fst", "fst_nei": "stat_Fst",
             "tajd": "stat_Tajimas_D", "cac": "cohort_allele_count"}
CHUNKINGS = [(100, -1), (37, 25), (1000, -1)]


def data(kind: str, how: str = "pop", variants: int = 100, samples: int = -1, backend: str = "cpu") -> xr.Dataset:
    ds = dataset(kind, {"variants": variants, "samples": samples}, backend)
    if how != "pop":
        ds["sample_cohort"] = ("samples", FIX.cohorts(kind, how, ds))
    return ds


def windowed(ds: xr.Dataset, kind: str, wname: str) -> xr.Dataset:
    fn, params = FIX.WINDOWS[wname]
    return getattr(sg, fn)(ds, **{k: FIX._param(v, FIX.BP[kind]) for k, v in params.items()})


def stats(ds: xr.Dataset, keep) -> dict:
    """Our statistics ``keep`` of ``ds``, computed together (NumPy)."""
    out = {}
    if "cac" in keep:
        out["cac"] = sg.count_cohort_alleles(ds)["cohort_allele_count"]
    if "div" in keep or "tajd" in keep:
        t = sg.Tajimas_D(ds)  # computes the diversity on its way
        out["div"], out["tajd"] = t["stat_diversity"], t["stat_Tajimas_D"]
    if "dvg" in keep or "fst_hudson" in keep:
        f = sg.Fst(ds)
        out["dvg"], out["fst_hudson"] = f["stat_divergence"], f["stat_Fst"]
    if "fst_nei" in keep:
        out["fst_nei"] = sg.Fst(ds, estimator="Nei")["stat_Fst"]
    arrays = dask.compute(*[v.data for v in out.values()])
    return {k: (out[k], B.to_numpy(a)) for k, a in zip(out, arrays) if k in keep}


def check(kind: str, how: str, wname: str, got: dict) -> None:
    assert got
    for stat, (var, values) in got.items():
        ref = REF[f"{kind}_{how}_{wname}_{stat}"]
        assert values.shape == ref.shape, stat
        assert var.dtype == ref.dtype, stat
        if stat == "cac":
            np.testing.assert_array_equal(values, ref)
        else:
            np.testing.assert_array_equal(np.isnan(values), np.isnan(ref), err_msg=stat)
            np.testing.assert_allclose(values, ref, rtol=RTOL, atol=ATOL, err_msg=stat)


# --- windows ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bi", "multi"])
@pytest.mark.parametrize("wname", sorted(FIX.WINDOWS))
def test_windows_are_sgkits(kind, wname):
    w = windowed(data(kind), kind, wname)
    names = [n for n in ("window_contig", "window_start", "window_stop") if f"{kind}_{wname}_{n}" in REF]
    assert names and set(names) == {n for n in ("window_contig", "window_start", "window_stop") if n in w}
    for name in names:
        assert w[name].dims == ("windows",) and w[name].dtype == np.int64
        assert w[name].attrs["comment"]
        np.testing.assert_array_equal(w[name].values, REF[f"{kind}_{wname}_{name}"])
    assert "call_genotype" in w  # merged


def test_windows_never_span_contigs_and_step_defaults_to_size():
    ds = data("bi")
    w = sg.window_by_variant(ds, size=50, merge=False)
    assert set(w.data_vars) == {"window_contig", "window_start", "window_stop"}
    contig = ds["variant_contig"].values
    for c, a, b in zip(w.window_contig.values, w.window_start.values, w.window_stop.values):
        assert (contig[a:b] == c).all() and 0 < b - a <= 50
    np.testing.assert_array_equal(sg.window_by_variant(ds, size=50, step=50, merge=False).window_start, w.window_start)


def test_window_errors():
    ds = data("bi")
    with pytest.raises(InputError, match="only one of step or window_start_position"):
        sg.window_by_position(ds, size=10, step=5, window_start_position="variant_position")
    with pytest.raises(InputError, match="size must be a positive integer"):
        sg.window_by_variant(ds, size=0)
    with pytest.raises(InputError, match="no variable 'nope'"):
        sg.window_by_position(ds, size=10, variant_position="nope")
    shuffled = ds.assign(variant_contig=("variants", ds["variant_contig"].values[::-1]))
    with pytest.raises(InputError, match="must be sorted"):
        sg.window_by_variant(shuffled, size=10)
    backwards = ds.assign(variant_position=("variants", ds["variant_position"].values[::-1]))
    with pytest.raises(InputError, match="decreases within contig"):
        sg.window_by_position(backwards, size=10)


# --- statistics against sgkit ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bi", "multi"])
@pytest.mark.parametrize("how", ["pop", "some"])
@pytest.mark.parametrize("variants,samples", [(100, -1), (37, 25), (1000, -1), (1000, 25)])
def test_count_cohort_alleles(kind, how, variants, samples):
    out = sg.count_cohort_alleles(data(kind, how, variants, samples), merge=False)
    assert list(out.data_vars) == ["cohort_allele_count"]
    ac = out["cohort_allele_count"]
    assert ac.dims == ("variants", "cohorts", "alleles") and ac.dtype == np.uint64
    assert ac.attrs["comment"] == "Cohort allele counts."
    np.testing.assert_array_equal(ac.values, REF[f"{kind}_{how}_none_cac"])


@pytest.mark.parametrize("kind,how", sorted({(k, h) for k, h, _ in FIX.STATS}))
@pytest.mark.parametrize("variants,samples", CHUNKINGS)
def test_per_variant_statistics(kind, how, variants, samples):
    keep = FIX.STATS[(kind, how, "none")]
    check(kind, how, "none", stats(data(kind, how, variants, samples), keep))


WINDOW_CASES = [
    *[("bi", "pop", w, c) for w in ("v37s20", "pso", "p") for c in CHUNKINGS],
    *[("bi", "pop", w, (37, 25)) for w in ("v50", "v20s37", "locus", "genome")],
    *[("multi", "pop", w, c) for w in ("v50", "locus") for c in CHUNKINGS],
    *[("multi", "pop", w, (100, 25)) for w in ("v37s20", "v20s37", "p", "pso", "genome")],
    ("bi", "some", "v37s20", (37, 25)), ("bi", "some", "pso", (1000, -1)),
    ("multi", "some", "v37s20", (100, -1)), ("multi", "some", "pso", (37, 25)),
]


@pytest.mark.parametrize("kind,how,wname,chunks", WINDOW_CASES)
def test_windowed_statistics(kind, how, wname, chunks):
    ds = windowed(data(kind, how, *chunks), kind, wname)
    check(kind, how, wname, stats(ds, FIX.SMALL if wname == "locus" else FIX.WINDOWED))


def test_tajimas_d_reads_the_genotypes_once():
    """With neither count in the dataset, the cohort and variant allele counts come from one read
    of each genotype block (samples in no cohort counted apart); with the cohort counts there,
    the variant counts are counted alone. Both give sgkit's values."""
    ds = data("bi", "some", 37, 25)
    with kernels.recording() as calls:
        t = sg.Tajimas_D(ds)
        d, vac, cac = dask.compute(t["stat_Tajimas_D"].data, t["variant_allele_count"].data, t["cohort_allele_count"].data)
    assert calls[("cohort_allele_count", "cpu")] == ds["call_genotype"].data.npartitions
    np.testing.assert_allclose(d, REF["bi_some_none_tajd"], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(cac, REF["bi_some_none_cac"])
    g = ds["call_genotype"].values
    np.testing.assert_array_equal(vac, np.stack([(g == a).sum(axis=(1, 2)) for a in range(2)], axis=-1))
    apart = sg.Tajimas_D(sg.count_cohort_alleles(ds))
    np.testing.assert_array_equal(apart["variant_allele_count"].values, vac)
    np.testing.assert_allclose(apart["stat_Tajimas_D"].values, REF["bi_some_none_tajd"], rtol=RTOL, atol=ATOL)


def test_a_dataset_with_per_sample_counts_is_summed_by_cohort():
    """sgkit sums call_allele_count by cohort where the dataset holds it: the cohort_sum kernel."""
    ds = data("multi", "some", 37, 25)
    g = ds["call_genotype"].values
    per_sample = np.stack([(g == a).sum(axis=2) for a in range(ds.sizes["alleles"])], axis=-1).astype(np.uint8)
    ds["call_allele_count"] = (("variants", "samples", "alleles"), dask.array.from_array(per_sample, chunks=(37, 25, -1)))
    with kernels.recording() as calls:
        ac = sg.count_cohort_alleles(ds)["cohort_allele_count"].values
    assert {k for k, _ in calls} == {"cohort_sum"}
    np.testing.assert_array_equal(ac, REF["multi_some_none_cac"])
    with pytest.raises(InputError, match="no variable 'counts'"):
        sg.count_cohort_alleles(data("bi"), call_allele_count="counts")


# --- the Datasets: lazy, merged as sgkit's, the kernels declared -------------------------------------


def test_ops_build_graphs_and_merge_as_sgkit():
    ds = data("bi", "some", 37, 25)  # cohorts in memory: the ops read them, as sgkit does
    w = sg.window_by_variant(ds, size=37, step=20)
    with raise_if_dask_computes():
        t = sg.Tajimas_D(w)
        f = sg.Fst(w, estimator="Nei", merge=False)
        per_variant = sg.Fst(ds)
        d = sg.divergence(ds, merge=False)
    for name in ("variant_allele_count", "cohort_allele_count", "stat_diversity", "stat_Tajimas_D", "call_genotype", "window_start"):
        assert name in t, name
    assert t["stat_Tajimas_D"].dims == ("windows", "cohorts") and t["stat_Tajimas_D"].dtype == np.float64
    assert t["variant_allele_count"].dims == ("variants", "alleles") and t["variant_allele_count"].dtype == np.uint64
    assert list(f.data_vars) == ["stat_Fst"] and f["stat_Fst"].dims == ("windows", "cohorts_0", "cohorts_1")
    assert f["stat_Fst"].attrs["comment"] == "Fixation index (Fst) between pairs of cohorts."
    # as sgkit: Fst's first dimension is named windows even per variant
    assert per_variant["stat_Fst"].dims == ("windows", "cohorts_0", "cohorts_1")
    assert per_variant["stat_Fst"].shape == (ds.sizes["variants"], 4, 4)
    assert per_variant["stat_divergence"].dims == ("variants", "cohorts_0", "cohorts_1")
    assert list(d.data_vars) == ["stat_divergence"]


def test_statistics_errors():
    ds = data("bi")
    with pytest.raises(InputError, match="estimator must be 'Hudson' or 'Nei'"):
        sg.Fst(ds, estimator="Weir")
    with pytest.raises(InputError, match="no variable 'ac'"):
        sg.diversity(ds, cohort_allele_count="ac")
    with pytest.raises(InputError, match="'sample_cohort' has values of type float64"):
        sg.count_cohort_alleles(ds.assign(sample_cohort=("samples", np.zeros(60))))
    with pytest.raises(InputError, match="no variable 'sample_cohort'"):
        sg.diversity(ds.drop_vars("sample_cohort"))
    per_variant = sg.diversity(ds)
    with pytest.raises(InputError, match="expected \\('windows', 'cohorts'\\)"):
        sg.Tajimas_D(sg.window_by_variant(per_variant, size=10))


def test_each_op_runs_the_kernels_it_declares():
    """Under every condition an op calls only kernels it declares, and over all, every one."""
    plain = data("bi", "some", 37, 25)
    w = sg.window_by_variant(plain, size=50)
    g = plain["call_genotype"].values
    per_sample = np.stack([(g == a).sum(axis=2) for a in range(2)], axis=-1).astype(np.uint8)
    counted = w.assign(call_allele_count=(("variants", "samples", "alleles"), per_sample))
    runs = {"count_cohort_alleles": [{}], "diversity": [{}], "divergence": [{}], "Fst": [{}, {"estimator": "Nei"}],
            "Tajimas_D": [{}]}
    for name, params in runs.items():
        op = getattr(sg, name).op
        declared, ran = set(op.kernels["cpu"]), set()
        for ds in (plain, w, counted):
            for p in params:
                with kernels.recording() as calls:
                    out = op.func(ds, merge=False, **p)
                    dask.compute(*[v.data for v in out.data_vars.values()])
                names = {k for k, _ in calls}
                assert names and names <= declared, (name, names, declared)
                ran |= names
        assert ran == declared, (name, ran, declared)
    for name in ("window_by_variant", "window_by_position", "window_by_genome"):
        assert getattr(sg, name).op.kernels == {"cpu": (), "gpu": ()}


# --- kernels -------------------------------------------------------------------------------------


def counts_reference(g, cohort, n_cohorts, n_alleles):
    out = np.zeros((g.shape[0], n_cohorts, n_alleles), np.uint64)
    for c in range(n_cohorts):
        calls = g[:, cohort == c]
        for a in range(n_alleles):
            out[:, c, a] = (calls == a).sum(axis=(1, 2))
    return out


@pytest.mark.parametrize("layout", ["runs", "scattered", "many", "int16"])
def test_cohort_allele_count_cpu_paths(layout):
    """The three CPU loops (runs of a cohort, masked by cohort, one sample at a time) against a
    NumPy count; negative alleles, alleles past n_alleles and samples outside 0..n_cohorts-1
    are not counted."""
    rng = np.random.default_rng(3)
    g = rng.integers(-2, 5, size=(23, 97, 3)).astype(np.int8)
    n_cohorts, n_alleles = {"runs": (3, 4), "scattered": (3, 4), "many": (9, 4), "int16": (3, 4)}[layout]
    if layout == "runs":
        cohort = np.repeat([0, -1, 1, 2, 5], [30, 5, 30, 20, 12])  # 5: past n_cohorts
    else:
        cohort = rng.integers(-1, n_cohorts + 1, size=97)
    if layout == "int16":
        g = g.astype(np.int16)
    got = K.cohort_allele_count_cpu(g, cohort, n_cohorts, n_alleles)
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, counts_reference(g, cohort, n_cohorts, n_alleles))


def test_window_sum_kernel():
    rng = np.random.default_rng(4)
    x = rng.random((40, 3))
    x[7, 1] = np.nan
    starts = np.array([0, 3, 5, 10, 39, 40])
    stops = np.array([4, 12, 5, 40, 40, 40])
    got = K.window_sum_cpu(x, starts, stops)
    ref = np.stack([x[a:b].sum(axis=0) for a, b in zip(starts, stops)])
    np.testing.assert_array_equal(got, ref)  # the same additions in the same order as NumPy's


@pytest.mark.parametrize("chunks", [7, (13, 0, 7, 20, 10), 50, 1])
def test_window_sums_across_blocks(chunks):
    """Windows overlapping, with gaps, empty, past the end, and longer than blocks."""
    rng = np.random.default_rng(5)
    x = rng.random((50, 2, 2))
    x[20, 0, 1] = np.nan
    starts = np.array([0, 0, 3, 6, 6, 15, 30, 49, 50, 50])
    stops = np.array([50, 5, 9, 6, 40, 22, 31, 50, 50, 45])
    arr = dask.array.from_array(x, chunks=(chunks, 1, 2))
    got = window_sums(arr, starts, stops, kernel=kernels.get("window_sum", "cpu"))
    assert got.shape == (10, 2, 2) and got.dtype == np.float64
    ref = np.stack([x[a:b].sum(axis=0) if b > a else np.zeros((2, 2)) for a, b in zip(starts, stops)])
    np.testing.assert_allclose(got.compute(), ref, rtol=1e-14, atol=0)
    assert window_sums(arr, [], [], kernel=kernels.get("window_sum", "cpu")).shape == (0, 2, 2)
    with pytest.raises(ValueError, match="must not decrease"):
        window_sums(arr, [3, 1], [4, 4], kernel=kernels.get("window_sum", "cpu"))


def test_fst_and_diversity_formulas():
    ac = np.array([[[3, 1], [0, 0], [2, 2]], [[1, 0], [4, 0], [0, 1]]], dtype=np.uint64)
    pi = K.diversity_terms(ac)
    np.testing.assert_allclose(pi[0], [0.5, np.nan, 2 / 3])
    assert np.isnan(pi[1, 0]) and pi[1, 1] == 0
    d = K.divergence_terms(ac)
    np.testing.assert_allclose(d[0, 0, 2], (3 * 2 + 1 * 2) / 16)
    assert np.isnan(d[0, 0, 1]) and d[0, 1, 1] != d[0, 1, 1]
    np.testing.assert_array_equal(np.diagonal(d, axis1=1, axis2=2), pi)
    h = K.fst(d[:1], "Hudson")
    np.testing.assert_allclose(h[0, 0, 2], 1 - ((0.5 + 2 / 3) / 2) / d[0, 0, 2])
    assert np.isnan(np.diagonal(h, axis1=1, axis2=2)).all() and h[0, 2, 0] == h[0, 0, 2]


# --- GPU == CPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("wname", ["none", "v37s20", "pso"])
def test_gpu_equals_cpu(wname):
    results = {}
    for backend in ("cpu", "gpu"):
        ds = data("multi", "some", 37, 25, backend=backend)
        if wname != "none":
            ds = windowed(ds, "multi", wname)
        out = sg.Tajimas_D(sg.Fst(sg.count_cohort_alleles(ds)))
        nei = sg.Fst(ds, estimator="Nei", merge=False)["stat_Fst"]
        if backend == "gpu":
            for name in ("cohort_allele_count", "stat_Fst", "stat_Tajimas_D"):
                assert B.backend_of(out[name].data) == "gpu", name
        names = ("cohort_allele_count", "variant_allele_count", "stat_diversity", "stat_divergence", "stat_Fst", "stat_Tajimas_D")
        results[backend] = {n: B.to_numpy(out[n].data) for n in names} | {"nei": B.to_numpy(nei.data)}
    for name, cpu in results["cpu"].items():
        gpu = results["gpu"][name]
        if cpu.dtype.kind == "u":
            np.testing.assert_array_equal(gpu, cpu, err_msg=name)
        else:
            np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=1e-14, equal_nan=True, err_msg=name)


@pytest.mark.gpu
@requires_gpu
def test_gpu_cohort_kernel_equals_the_cpu():
    import cupy

    rng = np.random.default_rng(8)
    cases = (((50, 5000, 2), 3, 2, np.int8, 8), ((7, 9000, 3), 20, 4, np.int8, 8), ((1, 3, 2), 1, 2, np.int8, 8),
             # several tiles a variant (rounds=1), two runs over the cohorts (13 x 4 > 48 bins)
             ((2, 700, 2), 13, 4, np.int8, 1), ((3, 1100, 2), 13, 4, np.int64, 1))
    for shape, n_cohorts, n_alleles, dtype, rounds in cases:
        g = rng.integers(-2, n_alleles + 1, size=shape).astype(dtype)
        if dtype == np.int64:
            g[0, :5, 0] = 2**32 + 1  # past int32: not allele 1
        cohort = rng.integers(-1, n_cohorts + 1, size=shape[1])  # n_cohorts itself: in none
        got = K.cohort_allele_count_gpu(cupy.asarray(g), cupy.asarray(cohort), n_cohorts, n_alleles, rounds=rounds)
        np.testing.assert_array_equal(cupy.asnumpy(got), K.cohort_allele_count_cpu(g, cohort, n_cohorts, n_alleles),
                                      err_msg=f"{shape} {dtype}")
    x = rng.random((300, 9))
    x[5, 1] = np.nan
    starts = np.arange(0, 290, 7)
    stops = starts + 25
    stops[3] = starts[3]  # an empty window
    got = K.window_sum_gpu(cupy.asarray(x), starts, stops)
    np.testing.assert_array_equal(cupy.asnumpy(got), K.window_sum_cpu(x, starts, stops))


def _hash_cases(rng):
    """Blocks of calls (missing, fill and alleles above 1), weights over all 64 bits, and rows
    where the prefix sums are taken (0 and the block's length among them, and runs of variants
    shorter and longer than the kernel's unrolling)."""
    for shape, dtype in (((37, 11, 2), np.int8), ((300, 1001, 2), np.int8), ((9, 5, 3), np.int16),
                         ((20, 4, 1), np.int64), ((1, 3, 2), np.int8)):
        g = rng.integers(-2, 4, size=shape).astype(dtype)
        w = rng.integers(0, 2**64, size=shape[0], dtype=np.uint64, endpoint=False)
        rels = np.unique(np.r_[0, rng.integers(0, shape[0] + 1, size=4), shape[0]])
        yield g, w, rels


def test_hash_prefix_is_the_sum_of_the_terms_modulo_2_64():
    """The CPU kernel against the definition, in Python integers: sum over i < r of
    (call mod 2^64) * w[i], modulo 2^64, for each haplotype (sample, then ploidy)."""
    for g, w, rels in _hash_cases(np.random.default_rng(11)):
        got = K.hash_prefix_cpu(g, w, rels)
        flat = g.reshape(g.shape[0], -1)
        want = [[sum(int(flat[i, h]) % 2**64 * int(w[i]) for i in range(r)) % 2**64 for h in range(flat.shape[1])]
                for r in rels]
        np.testing.assert_array_equal(got, np.array(want, dtype=np.uint64), err_msg=f"{g.shape} {g.dtype}")


@pytest.mark.gpu
@requires_gpu
def test_gpu_hash_prefix_equals_the_cpu_kernel():
    """The CUDA C prefix sums of the haplotype hash terms, bit for bit the CPU kernel's."""
    import cupy

    for g, w, rels in _hash_cases(np.random.default_rng(12)):
        got = K.hash_prefix_gpu(cupy.asarray(g), w, rels)
        np.testing.assert_array_equal(cupy.asnumpy(got), K.hash_prefix_cpu(g, w, rels), err_msg=f"{g.shape} {g.dtype}")



@pytest.mark.gpu
@requires_gpu
def test_gpu_terms_and_fst_kernels_equal_the_formulas():
    """The CUDA C per-variant terms and Fst against the array formulas on NumPy, bit for bit: counts
    with cohorts of no calls and of one, one allele to four, uint64 and uint8 counts; Fst by both
    estimators over (windows, cohorts, cohorts), with zeros and NaN among the divergences."""
    import cupy

    rng = np.random.default_rng(3)
    for shape, dtype in (((500, 3, 2), np.uint64), ((37, 5, 4), np.uint64), ((9, 2, 1), np.uint8), ((1, 1, 3), np.uint64)):
        ac = rng.integers(0, 4, size=shape).astype(dtype)
        ac[::5, 0] = 0  # no calls
        ac[1::7, -1] = 0
        ac[1::7, -1, 0] = 1  # one call
        for name in ("diversity_terms", "divergence_terms"):
            got = cupy.asnumpy(getattr(K, f"{name}_gpu")(cupy.asarray(ac)))
            np.testing.assert_array_equal(got, getattr(K, name)(ac), err_msg=f"{name} {shape}")
    d = rng.random((6, 4, 4))
    d[0, 1, 2] = d[0, 2, 1] = 0.0
    d[1, 0, 3] = np.nan
    d[2, 1, 1] = 0.0
    for estimator in ("Hudson", "Nei"):
        got = cupy.asnumpy(K.fst_gpu(cupy.asarray(d), estimator))
        np.testing.assert_array_equal(got, K.fst(d, estimator), err_msg=estimator)
    with pytest.raises(ValueError, match="estimator"):
        K.fst_gpu(cupy.asarray(d), "Weir")
