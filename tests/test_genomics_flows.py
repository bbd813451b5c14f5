"""Flows of Dataset ops (the genomics flows), and the QC ops they use: filter_variants,
filter_samples and impute_mean against NumPy formulas on the shared test data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline.genomics as sg
from pipeline.errors import FlowError, InputError
from pipeline.flows import parse_flow, run_flow

from .genomics_data import dataset, inputs

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("msprime")
pytest.importorskip("bio2zarr")


def _alleles_called(g):
    called = (g >= 0).all(axis=2)
    return called


def test_filter_variants_against_numpy():
    a = inputs()
    g = a["bi_call_genotype"]
    ds = dataset("bi", {"variants": 37})
    out = sg.filter_variants(ds, min_call_rate=0.97, min_maf=0.05)
    rate = _alleles_called(g).mean(axis=1)
    alt = np.where(g >= 0, g == 1, 0).sum(axis=(1, 2))
    n = (g >= 0).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = alt / n
    maf = np.minimum(p, 1 - p)
    keep = (rate >= 0.97) & (maf >= 0.05)
    assert 0 < keep.sum() < keep.size
    np.testing.assert_array_equal(out.variant_position.values, a["bi_variant_position"][keep])
    np.testing.assert_array_equal(out.call_genotype.values, g[keep])


def test_filter_variants_reads_each_genotype_block_once():
    """Call rate and allele frequencies come from one computation: every block of
    the genotypes is read once, not once for each statistic."""
    import collections

    import dask.array as da

    ds = dataset("bi", {"variants": 37})
    reads = collections.Counter()

    def counted(block, block_info=None):
        reads[block_info[0]["chunk-location"][0]] += 1
        return block

    g = ds.call_genotype.data
    ds = ds.assign(call_genotype=(ds.call_genotype.dims, da.map_blocks(counted, g, dtype=g.dtype, meta=g._meta)))
    out = sg.filter_variants(ds, min_call_rate=0.97, min_maf=0.05)
    assert sorted(reads) == list(range(g.numblocks[0])) and set(reads.values()) == {1}, reads
    assert 0 < out.sizes["variants"] < ds.sizes["variants"]


def test_filter_variants_max_alleles_cuts_the_alleles_dimension():
    ds = dataset("multi", {"variants": 100})
    a = inputs()
    g = a["multi_call_genotype"]
    # the test data name every allele of the dimension: biallelic variants by their genotypes here
    ds = ds.assign(variant_allele=(("variants", "alleles"), np.where(
        np.arange(3)[None, :] <= np.maximum(g.max(axis=(1, 2)), 1)[:, None], "A", "").astype(object)))
    out = sg.filter_variants(ds, max_alleles=2)
    assert out.sizes["alleles"] == 2
    np.testing.assert_array_equal(out.call_genotype.values, g[g.max(axis=(1, 2)) <= 1])
    p = sg.hardy_weinberg_test(out.assign(call_genotype=out.call_genotype.where(out.call_genotype >= -1, -1)))
    assert np.isfinite(p.variant_hwe_p_value.values).any()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_filter_variants_counts_alleles_in_the_pass_of_its_statistics(monkeypatch, backend):
    """With ``max_alleles`` and the call rate and MAF bounds, the alleles are counted in the one
    computation that reads every genotype block once, and the variants kept are those of the
    filters one after the other on the CPU (alleles first, then the statistics of what remains):
    the statistics of variants with calls of alleles beyond the cut dimension are computed and
    dropped, on either backend."""
    import collections

    import dask.array as da

    from pipeline import backend as B
    from pipeline.ops.genomics import qc

    ds = dataset("multi", {"variants": 30}, backend=backend)
    g = inputs()["multi_call_genotype"]
    named = np.where(np.arange(3)[None, :] <= np.maximum(g.max(axis=(1, 2)), 1)[:, None], "A", "").astype(object)
    ds = ds.assign(variant_allele=(("variants", "alleles"), da.from_array(named, chunks=(30, 3))))
    assert 0 < (g.max(axis=(1, 2)) > 1).sum() < g.shape[0]
    reads = collections.Counter()

    def counted(block, block_info=None):
        reads[block_info[0]["chunk-location"][0]] += 1
        return block

    computations = []

    def computed(*xs):
        computations.append(len(xs))
        return to_numpy_all(*xs)

    gd = ds.call_genotype.data
    counting = ds.assign(call_genotype=(ds.call_genotype.dims, da.map_blocks(counted, gd, dtype=gd.dtype, meta=gd._meta)))
    to_numpy_all = qc.to_numpy_all
    with monkeypatch.context() as m:
        m.setattr(qc, "to_numpy_all", computed)
        out = sg.filter_variants(counting, max_alleles=2, min_call_rate=0.9, min_maf=0.02)
    assert computations == [3], computations  # call rate, allele frequencies and alleles at once
    assert sorted(reads) == list(range(gd.numblocks[0])) and set(reads.values()) == {1}, reads
    cpu = dataset("multi", {"variants": 30}).assign(variant_allele=(("variants", "alleles"), named))
    one_by_one = sg.filter_variants(sg.filter_variants(cpu, max_alleles=2), min_call_rate=0.9, min_maf=0.02)
    assert 0 < out.sizes["variants"] < ds.sizes["variants"] and out.sizes["alleles"] == 2
    for name in ("call_genotype", "variant_allele", "variant_call_rate", "variant_allele_frequency"):
        got = out[name].data
        np.testing.assert_array_equal(B.to_numpy(got) if name != "variant_allele" else np.asarray(got),
                                      one_by_one[name].values, err_msg=name)


def test_filter_variants_max_alleles_reads_no_string_where_the_dimension_is_within_it():
    """Where the alleles dimension is no longer than ``max_alleles``, every variant is kept
    without reading ``variant_allele`` (nothing is computed); a shorter bound counts them."""
    from .conftest import raise_if_dask_computes

    ds = dataset("bi", {"variants": 37})
    assert ds.sizes["alleles"] == 2
    with raise_if_dask_computes():
        out = sg.filter_variants(ds, max_alleles=2)
    assert out.sizes == ds.sizes
    np.testing.assert_array_equal(out.call_genotype.values, ds.call_genotype.values)
    alleles = ds.variant_allele.values.astype(object)
    alleles[::3, 1] = ""  # every third variant names one allele
    ds = ds.assign(variant_allele=(("variants", "alleles"), alleles))
    out = sg.filter_variants(ds, max_alleles=1)
    assert out.sizes["alleles"] == 1
    np.testing.assert_array_equal(out.call_genotype.values, ds.call_genotype.values[::3])


def test_a_filter_that_empties_a_block_reads_nothing_while_it_selects():
    """Where a block keeps no variant, the selection is ``isel`` then blocks of the input's size:
    made without computing anything (xarray's ``chunk`` read the first element of each array of
    objects, the alleles and IDs, to look for dates), and equal to the selection made in NumPy."""
    from pipeline.ops.genomics._dataset import keep_positions

    from .conftest import raise_if_dask_computes

    import dask.array as da

    ds = dataset("bi", {"variants": 37})
    alleles = ds["variant_allele"]  # objects, lazy as a store's (and a variable's IDs)
    ds = ds.assign(variant_allele=(alleles.dims, da.from_array(alleles.values, chunks=(37, -1))),
                   variant_id=(("variants",), da.from_array(np.array([f"v{i}" for i in range(ds.sizes["variants"])], dtype=object), chunks=37)))
    keep = np.ones(ds.sizes["variants"], dtype=bool)
    keep[37:74] = False  # the second block, whole
    keep[::5] = False
    with raise_if_dask_computes():
        out = keep_positions(ds, "variants", keep, sg.filter_variants.op)
    assert out.sizes["variants"] == keep.sum() and set(out.data_vars) == set(ds.data_vars)
    for name, v in ds.variables.items():
        if "variants" in v.dims:
            assert max(out[name].chunksizes["variants"]) == 37, name
            np.testing.assert_array_equal(np.asarray(out[name].values), np.asarray(v.values)[keep], err_msg=name)


def test_filter_samples_and_bad_bounds():
    a = inputs()
    g = a["bi_call_genotype"]
    ds = dataset("bi", {"variants": 100})
    rate = (g >= 0).all(axis=2).mean(axis=0)
    bound = float(np.quantile(rate, 0.5))
    out = sg.filter_samples(ds, min_call_rate=bound)
    np.testing.assert_array_equal(out.call_genotype.values, g[:, rate >= bound])
    with pytest.raises(InputError, match="min_call_rate must be between 0 and 1"):
        sg.filter_samples(ds, min_call_rate=1.5)
    with pytest.raises(InputError, match="no variants remain"):
        sg.filter_variants(ds, min_call_rate=1.0, min_maf=0.5)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("as_float", [False, True], ids=["counts", "floats-with-nan"])
def test_impute_mean_against_numpy(backend, as_float):
    """Per-variant means over the called samples of every chunk of samples (one of them with no
    call in some variants), and the missing values filled: NumPy's formulas, to the bit for
    integer counts; int16 counts with -1, or float32 values with NaN and negatives."""
    import dask.array as da

    from pipeline import backend as B
    from pipeline import kernels

    ds = sg.count_call_alternate_alleles(dataset("bi", {"variants": 37, "samples": 25}))
    counts = ds.call_alternate_allele_count.values  # int16, -1 where a call is missing
    ac = counts.astype(np.float64)
    if as_float:  # NaN for half the missing values, -1.5 for the others
        ac = np.where(ac < 0, np.where(np.arange(ac.shape[1]) % 2, np.nan, -1.5), ac * 0.75)
    ac[3] = -1  # a variant with no call
    stored = ac.astype(np.float32 if as_float else counts.dtype)
    ac = stored.astype(np.float64)
    ds = ds.assign(call_alternate_allele_count=(("variants", "samples"), B.to_backend(da.from_array(stored, chunks=(10, 7)), backend)))
    missing = (ac < 0) | np.isnan(ac)
    with np.errstate(invalid="ignore"):
        mean = np.where(missing, 0, ac).sum(axis=1) / np.where((~missing).sum(axis=1) > 0, (~missing).sum(axis=1), np.nan)
    want = np.where(missing, mean[:, None], ac)
    with kernels.recording() as calls:
        got = sg.impute_mean(ds).call_alternate_allele_count.data
        assert B.backend_of(got) == backend
        got = B.to_numpy(got)
    assert {b for _, b in calls} == {backend}
    assert missing.any() and np.isnan(got[3]).all()
    np.testing.assert_allclose(got, want, rtol=0 if not as_float else 1e-15, equal_nan=True)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_impute_mean_keeps_float64_blocks_within_the_block_size(backend):
    """Blocks of stored genotypes grouped up to the block size give float64 dosages 4-8 times
    larger: impute_mean splits each block along the variants (slices, nothing joined) so that a
    float64 block with every sample fits the block size, and the values are the same."""
    import dask
    import dask.array as da

    from pipeline import backend as B

    ds = sg.count_call_alternate_alleles(dataset("bi", {"variants": 37, "samples": 25}))
    counts = ds.call_alternate_allele_count.values
    ds = ds.assign(call_alternate_allele_count=(("variants", "samples"),
                                                B.to_backend(da.from_array(counts, chunks=(30, 10)), backend)))
    want = B.to_numpy(sg.impute_mean(ds).call_alternate_allele_count.data)
    side = "gpu" if backend == "gpu" else "cpu"
    n_variants, n_samples = counts.shape
    with dask.config.set({f"pipeline.{side}.block-size": 8 * n_samples * 8}):  # 8 variants, float64
        got = sg.impute_mean(ds).call_alternate_allele_count.data
    assert max(got.chunks[0]) == 8 and got.chunks[1] == ds.call_alternate_allele_count.data.chunks[1]
    # slices of the blocks of 30 variants: every boundary of theirs is one of the new blocks'
    assert set(range(30, n_variants, 30)) <= set(np.cumsum(got.chunks[0]).tolist())
    assert len(got.chunks[0]) == sum(-(-c // 8) for c in ds.call_alternate_allele_count.data.chunks[0])
    assert B.backend_of(got) == backend
    np.testing.assert_array_equal(B.to_numpy(got), want)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from pipeline.demo_genomics import write_genomics_demo

    path = tmp_path_factory.mktemp("genomics") / "g.vcz"
    write_genomics_demo(path, samples=120, variants=1500, seed=3)
    return path


def _flow(name: str, store: Path, out: Path) -> dict:
    data = yaml.safe_load((REPO / "flows" / f"{name}.yaml").read_text())
    data["source"] = {**data["source"], "path": str(store)}
    data["source"].pop("demo")
    data["sink"]["path"] = str(out)
    return data


def test_gwas_flow_equals_the_python_calls(store, tmp_path):
    rep = run_flow(parse_flow(_flow("gwas", store, tmp_path / "gwas.zarr"), "gwas.yaml"), backend="cpu")
    # the filter's statistics, computed while the graph is built, are reported apart from it
    startup = rep["startup"]
    assert 0 < startup["statistics_seconds"] and startup["build_graph_seconds"] >= 0
    got = xr.open_zarr(tmp_path / "gwas.zarr")
    ds = sg.load_dataset(store, backend="cpu")
    ds = sg.filter_variants(ds, max_alleles=2, min_call_rate=0.95, min_maf=0.01)
    ds = sg.impute_mean(sg.count_call_alternate_alleles(ds))
    want = sg.gwas_linear_regression(ds, dosage="call_alternate_allele_count", covariates=["sample_covariate"],
                                     traits=["sample_trait"]).compute()
    np.testing.assert_array_equal(got.variant_position.values, want.variant_position.values)
    np.testing.assert_allclose(got.variant_linreg_p_value.values, want.variant_linreg_p_value.values, rtol=1e-12)
    assert got.attrs["pipeline_flow"] == "gwas"


def test_the_benchmarks_pca_flow_equals_the_python_calls(store, tmp_path):
    """benchmarks/flows/pca.yaml (what benchmarks/scaling.py times as the PCA) is the GWAS flow's
    selection and imputation, then sgkit's pca."""
    data = yaml.safe_load((REPO / "benchmarks" / "flows" / "pca.yaml").read_text())
    data["source"]["path"], data["sink"]["path"] = str(store), str(tmp_path / "pca.zarr")
    run_flow(parse_flow(data, "pca.yaml"), backend="cpu")
    got = xr.open_zarr(tmp_path / "pca.zarr")
    ds = sg.load_dataset(store, backend="cpu")
    ds = sg.filter_variants(ds, max_alleles=2, min_call_rate=0.95, min_maf=0.01)
    want = sg.pca(sg.impute_mean(sg.count_call_alternate_alleles(ds)), n_components=10).compute()
    np.testing.assert_allclose(got.sample_pca_explained_variance_ratio.values,
                               want.sample_pca_explained_variance_ratio.values, rtol=1e-10)
    np.testing.assert_allclose(got.sample_pca_projection.values, want.sample_pca_projection.values, rtol=1e-8, atol=1e-10)


def test_the_gwas_command_on_threads_imports_neither_distributed_nor_scipy_stats(store, tmp_path):
    """`pipeline run flows/gwas.yaml` without a cluster imports neither distributed (dask looks for
    a client at a rechunk) nor scipy.stats (the p-values): both are seconds of a fresh process's
    imports, for nothing. Its output is the flow's."""
    import subprocess
    import sys

    out = tmp_path / "out.zarr"
    probe = ("import atexit, sys; atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules "
             "if (m.split('.')[0] == 'distributed' or m.startswith('scipy.stats')) and sys.modules[m] is not None), "
             f"file=sys.stderr)); sys.argv = ['pipeline', 'run', {str(REPO / 'flows' / 'gwas.yaml')!r}, '--input', "
             f"{str(store)!r}, '--output', {str(out)!r}, '--backend', 'cpu', '--no-progress']; "
             "import runpy; runpy.run_module('pipeline', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.split("LOADED", 1)[1].strip() == "[]", r.stderr
    run_flow(parse_flow(_flow("gwas", store, tmp_path / "ref.zarr"), "gwas.yaml"), backend="cpu")
    got, want = xr.open_zarr(out), xr.open_zarr(tmp_path / "ref.zarr")
    for name in ("variant_position", "variant_linreg_beta", "variant_linreg_p_value"):
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def test_qc_flow_writes_a_pca_of_the_samples(store, tmp_path):
    run_flow(parse_flow(_flow("genomics_qc", store, tmp_path / "qc.zarr"), "genomics_qc.yaml"), backend="cpu")
    got = xr.open_zarr(tmp_path / "qc.zarr")
    assert got.sample_pca_projection.shape == (got.sizes["samples"], 10)
    ratio = got.sample_pca_explained_variance_ratio.values
    assert np.all(np.diff(ratio) <= 0) and 0 < ratio.sum() < 1
    # three simulated populations: the first two components separate them
    pc = got.sample_pca_projection.values[:, :2]
    cohort = got.sample_cohort.values
    centres = np.array([pc[cohort == c].mean(axis=0) for c in np.unique(cohort)])
    spread = max(pc[cohort == c].std(axis=0).max() for c in np.unique(cohort))
    assert np.min([np.linalg.norm(a - b) for i, a in enumerate(centres) for b in centres[i + 1:]]) > spread


def test_dataset_flow_validation():
    data = _flow("gwas", Path("x.vcz"), Path("o.zarr"))
    data["steps"].append({"op": "standardized_anomaly"})
    with pytest.raises(FlowError, match=r"steps\[4\].op: 'standardized_anomaly' takes one variable"):
        parse_flow(data, "f.yaml")
    data = _flow("gwas", Path("x.vcz"), Path("o.zarr"))
    data["source"]["variable"] = "call_genotype"
    with pytest.raises(FlowError, match="give either variable"):
        parse_flow(data, "f.yaml")


def test_kept_variants_stay_in_their_blocks():
    """A selection along variants keeps each block's own variants in that block: the values equal
    ``isel``'s, and every block of the result reads one block of the input (no task gathers from
    two, so on a cluster no block crosses workers)."""
    import dask
    import numpy as np
    import xarray as xr

    from pipeline.ops.genomics._dataset import keep_in_blocks
    from pipeline.ops.genomics.qc import filter_variants

    op = filter_variants.op
    rng = np.random.default_rng(3)
    g = rng.integers(-1, 2, size=(103, 7, 2)).astype("int8")
    ds = xr.Dataset({"call_genotype": (("variants", "samples", "ploidy"), g),
                     "variant_position": ("variants", np.arange(103) * 10),
                     "sample_id": ("samples", np.array([f"s{i}" for i in range(7)]))}).chunk({"variants": 20})
    keep = rng.random(103) < 0.6
    out = keep_in_blocks(ds, "variants", keep, op)
    ref = ds.isel(variants=np.flatnonzero(keep))
    assert out.call_genotype.chunks[0] == tuple(int(keep[i:i + 20].sum()) for i in range(0, 103, 20))
    for name in ref.variables:
        np.testing.assert_array_equal(out[name].values, ref[name].values)
    graph = dict(out.call_genotype.data.__dask_graph__())
    dependencies = {k: v.dependencies for k, v in graph.items() if k[0].startswith("keep-")}
    assert len(dependencies) == 6 and all(sum(1 for d in deps if "genotype" in str(d) or "array" not in str(d)) <= 2 for deps in dependencies.values())
    for key, deps in dependencies.items():
        inputs = [d for d in deps if d[0] == ds.call_genotype.data.name]
        assert len(inputs) == 1 and inputs[0][1] == key[1]
    # a block with nothing kept: None, and filter_variants' other selection takes over
    assert keep_in_blocks(ds, "variants", np.r_[np.zeros(20, bool), np.ones(83, bool)], op) is None
    del dask


def _same_up_to_sign(cpu: np.ndarray, gpu: np.ndarray, name: str):
    """PCA's components are defined up to their sign: each column of ``gpu`` flipped to ``cpu``'s."""
    flat_c, flat_g = cpu.reshape(-1, cpu.shape[-1]), gpu.reshape(-1, gpu.shape[-1])
    signs = np.sign(np.sum(flat_c * flat_g, axis=0))
    np.testing.assert_allclose(flat_g * signs, flat_c, rtol=1e-6, atol=1e-6 * np.abs(flat_c).max(), err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gwas", "genomics_qc"])
def test_genomics_flows_on_the_gpu_equal_the_cpu(store, tmp_path, name):
    out = {}
    for backend in ("cpu", "gpu"):
        path = tmp_path / f"{name}-{backend}.zarr"
        run_flow(parse_flow(_flow(name, store, path), f"{name}.yaml"), backend=backend)
        out[backend] = xr.open_zarr(path).load()
    cpu, gpu = out["cpu"], out["gpu"]
    assert set(cpu.variables) == set(gpu.variables)
    assert dict(cpu.sizes) == dict(gpu.sizes)
    for var, c in cpu.variables.items():
        g = gpu[var].values
        if var in ("sample_pca_projection", "sample_pca_component", "sample_pca_loading"):
            _same_up_to_sign(c.values, g, var)
        elif c.dtype.kind == "f":
            np.testing.assert_allclose(g, c.values, rtol=1e-6, atol=1e-12, equal_nan=True, err_msg=var)
        else:
            np.testing.assert_array_equal(g, c.values, err_msg=var)


def test_genomics_flows_on_a_cluster_write_the_same_bits(store, tmp_path):
    """Both genomics flows on a distributed cluster of two worker processes write what they write
    without one, bit for bit: LD pruning's table of pairs (a dask DataFrame) is computed there too,
    and the regression's covariate terms do not depend on where their tasks ran."""
    from distributed import Client, LocalCluster

    from pipeline.sinks.zarr import verify

    want = {}
    for name in ("gwas", "genomics_qc"):
        want[name] = run_flow(parse_flow(_flow(name, store, tmp_path / f"{name}.zarr"), f"{name}.yaml"),
                              backend="cpu")["sink"]["digests"]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for name in ("gwas", "genomics_qc"):
            out = tmp_path / f"{name}-cluster.zarr"
            got = run_flow(parse_flow(_flow(name, store, out), f"{name}.yaml"), backend="cpu", client=client)
            assert got["sink"]["digests"] == want[name], name
            verify(out)
        # workers that pipeline did not start copy what they receive unaligned, from the first run on
        assert all(client.run(_receives_aligned).values())
    assert any(k.startswith("variant_linreg") for k in want["gwas"])
    assert any(k.startswith("sample_pca") for k in want["genomics_qc"])


def _receives_aligned() -> bool:
    import numpy as np
    from distributed.protocol.serialize import dask_deserialize

    return getattr(dask_deserialize.dispatch(np.ndarray), "aligned", False)
