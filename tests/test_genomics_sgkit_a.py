"""sgkit's datasets, conversions, ploidy, frequencies, heterozygosity, ``window_by_interval`` and
``variables`` module in pipeline.genomics, against sgkit's results (``sgkit_a.npz``, made by
``tests/fixtures/genomics/sgkit_a.py`` with sgkit 0.10 on the shared data: fill values -2, calls
missing whole and half, multi-allelic sites, a mixed-ploidy set). Counts and indexes are equal,
floats within 1e-10; on the GPU the same comparisons, the results CuPy until computed."""

from __future__ import annotations

import os
import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline.errors import InputError, NotImplementedInputError

from .conftest import BACKENDS, raise_if_dask_computes
from .genomics_data import FIXTURES, dataset, sgkit
from .test_genomics_stats import triploid

REF = sgkit("a")
CHUNKS = {"variants": 37, "samples": 25}
FREQUENCIES = ("call_allele_frequencies", "cohort_allele_frequencies", "individual_heterozygosity",
               "observed_heterozygosity")


def values(x) -> np.ndarray:
    """Computed, on the host; a CuPy result must stay CuPy until then."""
    return np.asarray(B.to_numpy(x.data))


def assert_same(actual: xr.DataArray, expected: np.ndarray, backend: str = "cpu"):
    assert B.backend_of(actual.data) == backend
    a = values(actual)
    assert a.dtype == expected.dtype and a.shape == expected.shape
    if a.dtype.kind == "f":
        np.testing.assert_allclose(a, expected, rtol=0, atol=1e-10)
    else:
        np.testing.assert_array_equal(a, expected)


def nofill(ds: xr.Dataset) -> xr.Dataset:
    # on the dataset's backend block by block: xarray's ``where`` with a Python scalar gives Dask
    # arrays of CuPy blocks a NumPy meta, unless pipeline's patches are on (open_dataset's)
    g = ds["call_genotype"]
    return ds.assign(call_genotype=g.copy(data=g.data.map_blocks(lambda b: b.clip(-1, None), dtype=g.dtype)))


def mixed(g: np.ndarray) -> np.ndarray:
    """As the fixture's: every third sample haploid, and the first 20 variants haploid in all."""
    g = g.copy()
    g[:, ::3, 1] = -2
    g[:20, :, 1] = -2
    return g


def with_genotypes(ds: xr.Dataset, g: np.ndarray, backend: str, **attrs) -> xr.Dataset:
    data = B.to_backend(da.from_array(g, chunks=(37, 25, -1)), backend)
    return ds.drop_vars("call_genotype_mask").assign(call_genotype=(("variants", "samples", "ploidy"), data, attrs))


# --- variables and DIM_* -----------------------------------------------------------------------------


def test_specs_are_sgkits():
    def text(x):
        if isinstance(x, set):
            return "{" + ", ".join(sorted(map(str, x))) + "}"
        if isinstance(x, tuple):
            return "(" + ", ".join(map(text, x)) + ")"
        return str(x)

    reg = sg.variables.SgkitVariables.registered_variables
    assert list(reg) == list(REF["specs_name"])
    assert [text(s.kind) for s in reg.values()] == list(REF["specs_kind"])
    assert [text(s.dims) for s in reg.values()] == list(REF["specs_dims"])
    assert [text(s.ndim) for s in reg.values()] == list(REF["specs_ndim"])
    assert [s.__doc__.strip() for s in reg.values()] == list(REF["specs_doc"])
    assert sg.variables.call_genotype == "call_genotype"
    assert sg.variables.call_genotype_spec.dims == ("variants", "samples", "ploidy")
    assert (sg.DIM_VARIANT, sg.DIM_SAMPLE, sg.DIM_PLOIDY, sg.DIM_ALLELE) == ("variants", "samples", "ploidy", "alleles")


def test_validate_as_sgkit():
    v = sg.variables
    ds = dataset("bi")
    assert v.validate(ds, "call_genotype", {"variant_position": v.variant_position_spec}, v.call_genotype_mask_spec) is ds
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v.validate(ds.drop_vars(["sample_trait", "sample_covariate"]))  # every variable, by its name
    with pytest.raises(InputError, match="no spec is registered for variable 'sample_trait'"):
        v.validate(ds)  # as sgkit: a variable of no spec is an error
    bad = ds.assign(call_genotype=ds.call_genotype.astype("float32"))
    with pytest.raises(ValueError, match=r"'call_genotype' does not match its spec: values of type float32.*kind 'i'") as e:
        v.validate(bad, "call_genotype")
    assert isinstance(e.value, InputError)
    with pytest.raises(InputError, match=r"'call_genotype' does not match its spec: 2 dimensions"):
        v.validate(ds.isel(ploidy=0), "call_genotype")
    with pytest.raises(InputError, match="no variable 'call_dosage'"):
        v.validate(ds, "call_dosage")
    with pytest.raises(InputError, match="no spec is registered for variable 'mine'"):
        v.validate(ds.assign(mine=ds.sample_cohort), "mine")
    with pytest.warns(v.DimensionWarning, match=r"Dimensions \('variants', 's', 'ploidy'\) of 'call_genotype' do not match"):
        v.validate(ds.rename(samples="s"), "call_genotype")
    # the alternative name of a variable, checked against a spec
    v.validate(ds.rename(call_genotype="gt"), {"gt": v.call_genotype_spec})


# --- frequencies and heterozygosity -------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("windows", ["none", "v50"])
@pytest.mark.parametrize("kind", ["bi", "multi"])
@pytest.mark.parametrize("op", FREQUENCIES)
def test_frequencies_are_sgkits(op, kind, windows, backend):
    ds = dataset(kind, CHUNKS, backend)
    ds = ds.assign(sample_cohort=ds.sample_cohort.compute())  # read when called, as sgkit reads it
    src = ds if windows == "none" else sg.window_by_variant(ds, size=50)
    for merge in (True, False):
        with raise_if_dask_computes():  # lazy, as sgkit's
            out = getattr(sg, op)(src, merge=merge)
        added = set(map(str, out.data_vars)) - (set(map(str, src.data_vars)) if merge else set())
        assert added == set(REF[f"{op}_{kind}_{merge}_{windows}_added"])
        assert {B.backend_of(out[v].data) for v in added} == {backend}
    for name in out.data_vars:
        key = f"{op}_{kind}_{windows}_{name}"
        if key in REF:
            assert_same(out[name], REF[key], backend)
            assert out[name].attrs["comment"] == str(REF[f"{key}_comment"])


def test_frequencies_refuse_bad_input():
    ds = dataset("bi", CHUNKS)
    counts = sg.count_call_alleles(ds)
    with pytest.raises(InputError, match="call_allele_frequencies: variable 'call_allele_count' has values of type float64"):
        sg.call_allele_frequencies(counts.assign(call_allele_count=counts.call_allele_count.astype(float)))
    with pytest.raises(InputError, match="individual_heterozygosity: the dataset has no variable 'ac'"):
        sg.individual_heterozygosity(ds, call_allele_count="ac")
    with pytest.raises(InputError, match="observed_heterozygosity: the dataset has no variable 'sample_cohort'"):
        sg.observed_heterozygosity(ds.drop_vars("sample_cohort"))
    with pytest.raises(InputError, match="cohort_allele_frequencies: the dataset has no variable 'cac'"):
        sg.cohort_allele_frequencies(ds, cohort_allele_count="cac")


# --- conversion and ploidy ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_convert_call_to_index_is_sgkits(backend):
    bi, multi = dataset("bi", CHUNKS, backend), dataset("multi", CHUNKS, backend)
    tri = with_genotypes(multi, triploid(values(multi.call_genotype)), backend)
    for name, ds in (("bi_nofill", nofill(bi)), ("multi_nofill", nofill(multi)), ("tri_nofill", nofill(tri))):
        out = sg.convert_call_to_index(ds, merge=False)
        assert_same(out.call_genotype_index, REF[f"convert_call_to_index_{name}_call_genotype_index"], backend)
        np.testing.assert_array_equal(values(out.call_genotype_index_mask), REF[f"convert_call_to_index_{name}_call_genotype_index"] < 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_convert_call_to_index_refuses_what_sgkit_refuses(backend):
    bi, multi = dataset("bi", CHUNKS, backend), dataset("multi", CHUNKS, backend)
    assert "ValueError: Mixed-ploidy" in str(REF["convert_call_to_index_bi_error"])
    for ds in (bi, multi):  # calls with fill (-2): the computation raises
        with pytest.raises(InputError, match="call_genotype holds a fill value"):
            sg.convert_call_to_index(ds).compute()
    assert "ValueError: Allele value > 1" in str(REF["convert_call_to_index_big_error"])
    g = nofill(bi).call_genotype
    # on the blocks' backend (the meta says which kernel runs)
    two = g.copy(data=g.data.map_blocks(lambda b: b + (b == 1), dtype=g.dtype, meta=g.data._meta))  # every 1 made 2
    with pytest.raises(InputError, match="holds an allele above 1 where the alleles dimension has length 2"):
        sg.convert_call_to_index(nofill(bi).assign(call_genotype=two)).compute()
    # a missing first allele ends the call: sgkit does not look at what follows it (an allele of
    # 5, or a fill value)
    for after in (5, -2):
        cut = g.copy(data=g.data.map_blocks(_missing_then, after, dtype=g.dtype, meta=g.data._meta))
        out = sg.convert_call_to_index(nofill(bi).assign(call_genotype=cut), merge=False)
        assert (values(out.call_genotype_index) == -1).all()
    assert "ValueError: Mixed-ploidy dataset" in str(REF["convert_call_to_index_mixed_error"])
    with pytest.raises(InputError, match="'call_genotype' is mixed-ploidy"):
        sg.convert_call_to_index(with_genotypes(multi, mixed(values(multi.call_genotype)), backend, mixed_ploidy=True))


def _missing_then(block, after: int):
    """Diploid calls (-1, ``after``), on the block's backend."""
    out = block.copy()
    out[..., 0] = -1
    out[..., 1] = after
    return out


def dosage_dataset(backend: str = "cpu") -> xr.Dataset:
    gp = REF["gp"]
    ds = sg.create_genotype_dosage_dataset(
        variant_contig_names=["chr1"], variant_contig=np.zeros(40, np.int64), variant_position=np.arange(40),
        variant_allele=np.full((40, 2), b"A", dtype="S1"), sample_id=np.array([f"S{i}" for i in range(9)]),
        call_dosage=gp[..., 1] + 2 * gp[..., 2], call_genotype_probability=gp,
    ).chunk({"variants": 7, "samples": 4})
    return ds.assign(call_genotype_probability=ds.call_genotype_probability.copy(
        data=B.to_backend(ds.call_genotype_probability.data, backend)))


def test_create_genotype_dosage_dataset_is_sgkits():
    ds = dosage_dataset()
    for name in ds.data_vars:
        assert str(ds[name].dtype) == str(REF[f"dosage_dataset_{name}_dtype"]), name
        assert ds[name].attrs.get("comment", "") == str(REF[f"dosage_dataset_{name}_comment"]), name
    np.testing.assert_array_equal(ds.call_genotype_probability_mask.values, np.isnan(REF["gp"]))
    assert ds.attrs["contigs"] == ["chr1"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threshold", [0.9, 0.5, 0.0])
def test_convert_probability_to_call_is_sgkits(threshold, backend):
    out = sg.convert_probability_to_call(dosage_dataset(backend), threshold=threshold, merge=False)
    assert_same(out.call_genotype, REF[f"convert_probability_to_call_{threshold}_call_genotype"], backend)
    assert out.call_genotype.dims == ("variants", "samples", "ploidy")


def test_convert_probability_to_call_refuses_bad_input():
    ds = dosage_dataset()
    with pytest.raises(InputError, match=r"threshold must be a number in \[0, 1\], not 1.5"):
        sg.convert_probability_to_call(ds, threshold=1.5)
    with pytest.raises(NotImplementedError, match="diploid, biallelic.*'call_genotype_probability' has 4 genotypes") as e:
        sg.convert_probability_to_call(ds.isel(genotypes=[0, 1, 2, 0]))
    assert isinstance(e.value, NotImplementedInputError)
    with pytest.raises(InputError, match="'call_genotype_probability' has values of type int64"):
        sg.convert_probability_to_call(ds.assign(call_genotype_probability=ds.call_genotype_probability.astype(int)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["bi", "mixed"])
def test_filter_partial_calls_and_ploidy_are_sgkits(name, backend):
    ds = dataset("bi" if name == "bi" else "multi", CHUNKS, backend)
    if name == "mixed":
        ds = with_genotypes(ds, mixed(values(ds.call_genotype)), backend, mixed_ploidy=True)
    out = sg.filter_partial_calls(ds, merge=False)
    assert_same(out.call_genotype_complete, REF[f"filter_partial_calls_{name}_call_genotype_complete"], backend)
    assert out.call_genotype_complete.attrs["mixed_ploidy"] == bool(REF[f"filter_partial_calls_{name}_mixed_ploidy"])
    np.testing.assert_array_equal(values(out.call_genotype_complete_mask),
                                  REF[f"filter_partial_calls_{name}_call_genotype_complete"] < 0)
    for op, var in (("infer_call_ploidy", "call_ploidy"), ("infer_sample_ploidy", "sample_ploidy"),
                    ("infer_variant_ploidy", "variant_ploidy")):
        with raise_if_dask_computes():
            out = getattr(sg, op)(ds)
        added = set(map(str, out.data_vars)) - set(map(str, ds.data_vars))
        assert added == set(REF[f"{op}_{name}_added"]), op
        assert {B.backend_of(out[v].data) for v in added} == {backend}, op
        assert_same(out[var], REF[f"{op}_{name}_{var}"], backend)


def test_conversions_refuse_a_missing_or_wrong_variable():
    ds = dataset("bi", CHUNKS)
    for op in ("convert_call_to_index", "filter_partial_calls", "infer_call_ploidy", "infer_sample_ploidy",
               "infer_variant_ploidy"):
        with pytest.raises(InputError, match=f"{op}: the dataset has no variable 'gt'"):
            getattr(sg, op)(ds, call_genotype="gt")
        with pytest.raises(InputError, match=f"{op}: variable 'call_genotype' has values of type float64"):
            getattr(sg, op)(ds.assign(call_genotype=ds.call_genotype.astype(float)))
    with pytest.raises(InputError, match="infer_sample_ploidy: the dataset has no variable 'cp'"):
        sg.infer_sample_ploidy(ds, call_ploidy="cp")


# --- window_by_interval -------------------------------------------------------------------------------


def intervals(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign(interval_contig_name=("intervals", REF["intervals_name"]),
                     interval_start=("intervals", REF["intervals_start"]),
                     interval_stop=("intervals", REF["intervals_stop"]))


def test_window_by_interval_is_sgkits():
    ds = intervals(dataset("bi", CHUNKS))
    out = sg.window_by_interval(ds, merge=False)
    for name in ("window_contig", "window_start", "window_stop"):
        assert_same(out[name], REF[f"window_by_interval_{name}"])
    # contig names as bytes, as sgkit's S arrays
    out = sg.window_by_interval(ds.assign(interval_contig_name=ds.interval_contig_name.astype("S")), merge=False)
    assert_same(out["window_start"], REF["window_by_interval_window_start"])
    # sorted windows feed the windowed statistics: the same sums as windows of the same bounds
    keep = [0, 1, 2, 3, 5]  # intervals whose windows start in order: windows 0, 1, 2, 4, 5
    windowed = sg.observed_heterozygosity(sg.window_by_interval(ds.isel(intervals=keep)), merge=False)
    ho = sg.observed_heterozygosity(ds, merge=False).stat_observed_heterozygosity.values
    w = [0, 1, 2, 4, 5]
    bounds = zip(REF["window_by_interval_window_start"][w], REF["window_by_interval_window_stop"][w])
    np.testing.assert_allclose(windowed.stat_observed_heterozygosity.values, [ho[a:b].sum(axis=0) for a, b in bounds],
                               rtol=1e-12)


def test_window_by_interval_refuses_bad_intervals():
    ds = intervals(dataset("bi", CHUNKS))
    with pytest.raises(InputError, match="'interval_contig_name' names contigs the dataset does not have: chrX"):
        sg.window_by_interval(ds.assign(interval_contig_name=ds.interval_contig_name.where(
            ds.interval_contig_name != "chr2", "chrX")))
    with pytest.raises(InputError, match="the dataset has no variable 'interval_stop'"):
        sg.window_by_interval(ds.drop_vars("interval_stop"))
    with pytest.raises(InputError, match="variable 'interval_start' has values of type float64"):
        sg.window_by_interval(ds.assign(interval_start=ds.interval_start.astype(float)))


# --- datasets -----------------------------------------------------------------------------------------

SIMULATIONS = {
    "plain": dict(n_variant=10, n_sample=7),
    "full": dict(n_variant=20, n_sample=9, n_ploidy=3, n_allele=4, n_contig=3, seed=7, missing_pct=0.1, phased=True,
                 additional_variant_fields={"f": np.float32, "i": np.int16, "b": bool, "s": str}),
    "seedless": dict(n_variant=5, n_sample=3, seed=123, phased=False),
}


@pytest.mark.parametrize("run", SIMULATIONS)
def test_simulate_genotype_call_dataset_is_sgkits(run):
    ds = sg.simulate_genotype_call_dataset(**SIMULATIONS[run])
    assert sorted(map(str, ds.variables)) == list(REF[f"simulate_{run}_variables"])
    for name in ds.variables:
        expected = REF[f"simulate_{run}_{name}"]
        assert ds[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(ds[name].values, expected)
        assert ds[name].attrs.get("comment", "") == str(REF[f"simulate_{run}_{name}_comment"]), name
    assert ds.attrs["contigs"] == list(REF[f"simulate_{run}_contigs"])
    assert ds.call_genotype.attrs["mixed_ploidy"] is False


def test_simulate_refuses_bad_arguments():
    with pytest.raises(InputError, match=r"missing_pct must be within \[0.0, 1.0\]"):
        sg.simulate_genotype_call_dataset(5, 3, missing_pct=1.5)
    with pytest.raises(InputError, match="n_contig \\(4\\) cannot be greater than n_variant \\(3\\)"):
        sg.simulate_genotype_call_dataset(3, 3, n_contig=4)
    with pytest.raises(InputError, match="additional_variant_fields\\['x'\\]: unrecognized type"):
        sg.simulate_genotype_call_dataset(3, 3, additional_variant_fields={"x": complex})


def display_data():
    ds = sg.simulate_genotype_call_dataset(n_variant=30, n_sample=15, n_allele=3, missing_pct=0.1, seed=2)
    g = ds.call_genotype.values.copy()
    g[:, ::4, 1] = -2
    phased = np.random.default_rng(1).random((30, 15)) < 0.5
    mixed_ = ds.assign(call_genotype=(("variants", "samples", "ploidy"), g, {"mixed_ploidy": True}),
                       call_genotype_phased=(("variants", "samples"), phased),
                       variant_id=("variants", np.array([f"rs{i % 20}" for i in range(30)])))
    return ds, mixed_, mixed_.assign(variant_id=("variants", np.array([f"rs{i}" for i in range(30)])))


@pytest.mark.parametrize("backend", BACKENDS)
def test_display_genotypes_is_sgkits(backend):
    ds, mixed_, ids = (d.assign(call_genotype=d.call_genotype.copy(data=B.to_backend(
        da.from_array(d.call_genotype.values, chunks=(10, 5, 2)), backend))) for d in display_data())
    assert str(sg.display_genotypes(ds)) == str(REF["display_default"])
    assert str(sg.display_genotypes(ds, max_variants=10, max_samples=6)) == str(REF["display_small"])
    assert sg.display_genotypes(ds, max_variants=10, max_samples=6)._repr_html_() == str(REF["display_small_html"])
    assert str(sg.display_genotypes(mixed_, max_variants=8, max_samples=5)) == str(REF["display_mixed"])
    assert str(sg.display_genotypes(ids, max_variants=40, max_samples=20)) == str(REF["display_ids"])
    with pytest.raises(InputError, match="display_genotypes: the dataset has no variable 'sample_id'"):
        sg.display_genotypes(ds.drop_vars("sample_id"))


def saved(tmp_path, backend: str = "cpu") -> xr.Dataset:
    ds = sg.simulate_genotype_call_dataset(n_variant=30, n_sample=15, n_allele=3, missing_pct=0.1, seed=2, phased=True)
    ds = ds.chunk({"variants": 10})
    return ds.assign(call_genotype=ds.call_genotype.copy(data=B.to_backend(ds.call_genotype.data, backend)))


def assert_round_trip(ds: xr.Dataset, path):
    back = sg.load_dataset(path, backend="cpu")
    assert set(back.variables) == set(ds.variables)
    for name in ds.variables:
        a = values(ds[name]) if hasattr(ds[name].data, "__dask_graph__") else np.asarray(ds[name].values)
        np.testing.assert_array_equal(back[name].values.astype(a.dtype), a, err_msg=name)
    assert back.call_genotype.dtype == np.int8 and back.attrs["contigs"] == ds.attrs["contigs"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_dataset_round_trips_through_load_dataset(tmp_path, backend):
    ds = saved(tmp_path, backend)
    path = tmp_path / "ds.zarr"
    assert sg.save_dataset(ds, path) is None
    assert_round_trip(ds, path)
    assert B.backend_of(ds.call_genotype.data) == backend  # the caller's data stays where it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.zarr"]  # nothing left beside it


def test_save_dataset_never_replaces_what_exists(tmp_path):
    ds = saved(tmp_path)
    path = tmp_path / "ds.zarr"
    sg.save_dataset(ds, path)
    before = sorted(os.listdir(path))
    with pytest.raises(InputError, match="ds.zarr: already exists; save_dataset writes a new store"):
        sg.save_dataset(ds.isel(variants=slice(0, 20)), path)
    assert sorted(os.listdir(path)) == before and sg.load_dataset(path).sizes["variants"] == 30
    # mode="w" (sgkit's) replaces a dataset pipeline saved, all at once
    sg.save_dataset(ds.isel(variants=slice(0, 20)), path, mode="w")
    assert sg.load_dataset(path).sizes["variants"] == 20
    # but not a store pipeline did not write
    other = tmp_path / "other.zarr"
    xr.Dataset({"a": ("x", np.arange(3))}).to_zarr(other, zarr_format=2)
    with pytest.raises(InputError, match="other.zarr: exists and is a Zarr store pipeline did not write"):
        sg.save_dataset(ds, other, mode="w")
    np.testing.assert_array_equal(xr.open_zarr(other)["a"].values, np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.zarr", "other.zarr"]


def test_save_dataset_that_fails_writes_nothing(tmp_path):
    """A block that fails mid-write: the error is the caller's, and neither the store nor any
    part of it is left."""
    ds = saved(tmp_path)

    def fail(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 2:
            raise RuntimeError("disk on fire")
        return block

    ds["call_genotype"] = ds.call_genotype.copy(data=ds.call_genotype.data.map_blocks(fail, dtype=np.int8))
    with pytest.raises(RuntimeError, match="disk on fire"):
        sg.save_dataset(ds, tmp_path / "ds.zarr")
    assert list(tmp_path.iterdir()) == []


SAVE_UNTIL_SIGNALLED = """
import os, signal, sys, time
import dask
import pipeline.genomics as sg

# Ctrl-C as in a terminal: a runner that starts the tests in the background without job control
# has SIGINT ignored, and the process would inherit that
signal.signal(signal.SIGINT, signal.default_int_handler)

out, started = sys.argv[1], sys.argv[2]
ds = sg.simulate_genotype_call_dataset(n_variant=40, n_sample=6).chunk({"variants": 10})

def wait(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 2:  # mid-write: tell the test, then wait for its signal
        open(started, "w").close()
        while True:
            time.sleep(0.01)
    return block

ds["call_genotype"] = ds.call_genotype.copy(data=ds.call_genotype.data.map_blocks(wait, dtype="int8"))
with dask.config.set(scheduler="synchronous"):  # the block runs in the thread the signal reaches
    sg.save_dataset(ds, out)
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_save_dataset_interrupted_leaves_no_store(tmp_path, sig):
    """Interrupted mid-write (Ctrl-C), a save removes what it wrote; killed, it cannot, and the next
    save to the same path clears what the killed one left and writes the store."""
    import signal
    import subprocess
    import sys
    import time

    out, started = tmp_path / "out" / "ds.zarr", tmp_path / "started"
    out.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SAVE_UNTIL_SIGNALLED, str(out), str(started)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    deadline = time.monotonic() + 60
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists(), proc.stderr.read() if proc.poll() is not None else "the write never started"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not out.exists() or list(out.iterdir()) == []  # no store: at most the empty reservation of its path
    if sig == "SIGINT":
        assert "KeyboardInterrupt" in err
        assert [p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")] == []
    ds = saved(tmp_path)
    sg.save_dataset(ds, out)
    assert_round_trip(ds, out)
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")) == ["ds.zarr"]


def test_save_dataset_uneven_chunks_write_nothing(tmp_path):
    ds = saved(tmp_path).chunk({"variants": (5, 10, 15)})
    with pytest.raises(InputError, match="Zarr requires uniform chunk sizes. Use the `auto_rechunk` argument"):
        sg.save_dataset(ds, tmp_path / "ds.zarr")
    assert list(tmp_path.iterdir()) == []
    sg.save_dataset(ds, tmp_path / "ds.zarr", auto_rechunk=True)
    assert_round_trip(ds, tmp_path / "ds.zarr")
    with pytest.raises(InputError, match="zarr_format must be 2 or 3"):
        sg.save_dataset(ds, tmp_path / "x.zarr", zarr_format=4)


def test_save_dataset_changes_the_zarr_format_of_what_it_read(tmp_path):
    """A dataset read from a store of one Zarr format holds that format's codecs in its encodings;
    written in the other format, zarr's default codecs take their place."""
    ds = saved(tmp_path)
    sg.save_dataset(ds, tmp_path / "v3.zarr", zarr_format=3)
    sg.save_dataset(sg.load_dataset(tmp_path / "v3.zarr"), tmp_path / "v2.zarr")  # sgkit's default, format 2
    assert (tmp_path / "v2.zarr" / ".zgroup").exists() and (tmp_path / "v3.zarr" / "zarr.json").exists()
    assert_round_trip(ds, tmp_path / "v2.zarr")
    sgkits = xr.open_zarr(FIXTURES / "sgkit_store.zarr")  # written by sgkit, format 2
    sg.save_dataset(sgkits, tmp_path / "from_sgkit.zarr", zarr_format=3)
    back = sg.load_dataset(tmp_path / "from_sgkit.zarr")
    np.testing.assert_array_equal(back.call_genotype.values, sgkits.call_genotype.values)
    assert xr.open_zarr(tmp_path / "from_sgkit.zarr").call_genotype.encoding["compressors"][0].__class__.__module__.startswith("zarr")
