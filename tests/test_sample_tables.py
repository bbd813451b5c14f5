"""Sample tables: a VCF's samples given cohorts, traits and covariates by a TSV or CSV file, through
``pipeline import-vcf --samples-table`` and a flow's ``source.samples``; the GWAS and QC flows run
on an imported store with its table as in Python with the variables added by hand; a bad or
partial table is exit 2 naming the file and what is wrong, and nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline
import pipeline.genomics as sg
from pipeline import cli
from pipeline.demo_genomics import import_vcf

from .conftest import requires_gpu

pytest.importorskip("bio2zarr")
pytest.importorskip("cyvcf2")

REPO = Path(__file__).resolve().parent.parent
N_SAMPLES, N_VARIANTS = 16, 60
IDS = [f"S{i:02d}" for i in range(N_SAMPLES)]
LABELS = ["EUR", "AFR", "EAS"]


def _vcf(path: Path, seed: int = 1) -> Path:
    """A small biallelic diploid VCF of N_SAMPLES samples, a few calls missing."""
    rng = np.random.default_rng(seed)
    lines = ["##fileformat=VCFv4.3", "##contig=<ID=chr1,length=100000>",
             '##FORMAT=<ID=GT,Number=1,Type=String,Description="Genotype">',
             "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\tFORMAT\t" + "\t".join(IDS)]
    for v in range(N_VARIANTS):
        g = (rng.random((N_SAMPLES, 2)) < rng.uniform(0.1, 0.9)).astype(int)
        calls = ["./." if rng.random() < 0.01 else f"{a}/{b}" for a, b in g]
        lines.append(f"chr1\t{100 * (v + 1)}\t.\tA\tG\t.\tPASS\t.\tGT\t" + "\t".join(calls))
    path.write_text("\n".join(lines) + "\n")
    return path


def _table(seed: int = 2):
    """Per-sample values: cohort labels, a trait (one missing) and a covariate."""
    rng = np.random.default_rng(seed)
    cohort = [LABELS[(i * 7) % 3] for i in range(N_SAMPLES)]
    trait, covariate = rng.normal(size=N_SAMPLES).round(6), rng.normal(size=N_SAMPLES).round(6)
    return cohort, trait, covariate


def _write_table(path: Path, rows: list[list[str]], sep: str = "\t") -> Path:
    path.write_text("\n".join(sep.join(r) for r in rows) + "\n")
    return path


def _rows(order=None, trait_missing: int | None = None):
    cohort, trait, covariate = _table()
    rows = [["sample_id", "cohort", "trait", "sample_covariate"]]
    for i in order if order is not None else range(N_SAMPLES):
        t = "NA" if i == trait_missing else repr(float(trait[i]))
        rows.append([IDS[i], cohort[i], t, repr(float(covariate[i]))])
    return rows


def _pipeline(*args, cwd=None):
    env = {**os.environ, "DASK_PIPELINE__BACKEND": "cpu"}
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store imported from the VCF without a table (the flows' source)."""
    root = tmp_path_factory.mktemp("imported")
    return import_vcf(_vcf(root / "x.vcf"), root / "x.vcz", variant_chunk=25, sample_chunk=10)


# --- import-vcf --------------------------------------------------------------------------------------------


def test_import_vcf_writes_the_table_in_the_stores_sample_order(tmp_path):
    """Rows in another order, an ID the VCF lacks (a warning), text cohorts numbered in order of
    first appearance, NA as NaN; read back by xarray as by pipeline."""
    order = list(range(N_SAMPLES))[::-1]
    rows = _rows(order, trait_missing=3) + [["NOT_IN_VCF", "EUR", "1.0", "2.0"]]
    table = _write_table(tmp_path / "samples.tsv", rows)
    r = _pipeline("import-vcf", _vcf(tmp_path / "x.vcf"), tmp_path / "x.vcz", "--samples-table", table, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "samples.tsv: 1 sample IDs of the table are not in the store" in r.stderr and "'NOT_IN_VCF'" in r.stderr
    cohort, trait, covariate = _table()
    labels = list(dict.fromkeys(cohort[i] for i in order))  # first appearance in the table's rows
    expected_trait = trait.copy()
    expected_trait[3] = np.nan
    for ds in (pipeline.open_dataset(tmp_path / "x.vcz", backend="cpu"), xr.open_zarr(tmp_path / "x.vcz")):
        assert list(ds["sample_id"].values) == IDS
        assert ds["sample_cohort"].dtype == np.int64 and ds["sample_cohort"].dims == ("samples",)
        assert ds["sample_cohort"].attrs["cohort_labels"] == labels
        np.testing.assert_array_equal(ds["sample_cohort"].values, [labels.index(c) for c in cohort])
        assert ds["sample_trait"].dtype == np.float64 and ds["sample_covariate"].dtype == np.float64
        np.testing.assert_array_equal(ds["sample_trait"].values, expected_trait)
        np.testing.assert_array_equal(ds["sample_covariate"].values, covariate)
        assert "sample_sample_covariate" not in ds


def test_import_vcf_zarr3_csv_with_cohort_numbers_and_missing(tmp_path):
    """A CSV, Zarr v3, the ID in the first column under another name; whole-number cohorts are the
    indexes themselves, a missing one -1 (sgkit's "no cohort")."""
    rows = [["IID", "sample_cohort", "age"]] + [[s, "" if i == 0 else str(i % 2), str(20 + i)] for i, s in enumerate(IDS)]
    table = _write_table(tmp_path / "samples.csv", rows, sep=",")
    out = import_vcf(_vcf(tmp_path / "x.vcf"), tmp_path / "x.vcz", zarr_format=3, samples_table=table)
    ds = pipeline.open_dataset(out, backend="cpu")
    np.testing.assert_array_equal(ds["sample_cohort"].values, [-1] + [i % 2 for i in range(1, N_SAMPLES)])
    assert "cohort_labels" not in ds["sample_cohort"].attrs
    np.testing.assert_array_equal(ds["sample_age"].values, np.arange(20, 20 + N_SAMPLES, dtype=float))


def _bad(tmp_path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _good_rows(ids=IDS):
    return [["sample_id", "trait"]] + [[s, str(i)] for i, s in enumerate(ids)]


BAD_TABLES = {
    # name: (file name, content, expected message)
    "empty": ("s.tsv", "", "s.tsv: empty file"),
    "delimiter": ("s.txt", "sample_id trait|x\nS00 1|2\nS01:2\n", "s.txt: could not tell the delimiter"),
    "one column": ("s.tsv", "sample_id,trait\nS00,1\n", "s.tsv: one column ('sample_id,trait') when read as tab-separated"),
    "duplicates": ("s.tsv", "sample_id\ttrait\nS00\t1\nS01\t2\nS00\t3\n", "sample IDs appear more than once (column 'sample_id'): 'S00'"),
    "not a number": ("s.tsv", "sample_id\tcohort\ttrait\nS00\tA\t1\nS01\tB\tabc\n",
                     "s.tsv: column 'trait', sample 'S01': 'abc' is not a number"),
    "ragged": ("s.csv", "sample_id,trait\nS00,1\nS01,2,3\n", "s.csv: not a table of comma-separated values"),
}


@pytest.mark.parametrize("case", BAD_TABLES)
def test_bad_tables_are_refused_before_anything_is_written(tmp_path, capsys, case):
    name, text, message = BAD_TABLES[case]
    table = _bad(tmp_path, name, text)
    vcf = _vcf(tmp_path / "x.vcf")
    assert cli.main(["import-vcf", str(vcf), str(tmp_path / "x.vcz"), "--samples-table", str(table)]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == sorted(["x.vcf", name])


STORE_MISMATCHES = {
    "missing samples": (IDS[:9], "s.tsv: 7 of the store's 16 samples are not in the table: 'S09', 'S10', 'S11', "
                                 "'S12', 'S13', ... (7 in all)"),
    "no sample matches": ([f"X{i}" for i in range(3)], "s.tsv: none of the store's 16 sample IDs is in the table"),
}


@pytest.mark.parametrize("case", STORE_MISMATCHES)
def test_tables_that_do_not_match_the_store_leave_no_store(tmp_path, case):
    ids, message = STORE_MISMATCHES[case]
    table = _write_table(tmp_path / "s.tsv", _good_rows(ids))
    r = _pipeline("import-vcf", _vcf(tmp_path / "x.vcf"), tmp_path / "x.vcz", "--samples-table", table, "--no-progress")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["s.tsv", "x.vcf"]  # all or nothing: no store, no scratch


def test_a_column_may_not_replace_a_store_variable(tmp_path, capsys):
    table = _write_table(tmp_path / "s.tsv", [["sample_id", "id"]] + [[s, "1"] for s in IDS])
    vcf = _vcf(tmp_path / "x.vcf")
    assert cli.main(["import-vcf", str(vcf), str(tmp_path / "x.vcz"), "--samples-table", str(table)]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert "s.tsv: column 'id' would replace the variable 'sample_id' the store already has" in err, err
    assert sorted(os.listdir(tmp_path)) == ["s.tsv", "x.vcf"]


# --- flows ------------------------------------------------------------------------------------------------


def _flow(name: str, tmp_path: Path, store: Path, table: Path, **source) -> Path:
    """A copy of a shipped flow reading ``store`` with ``table`` (paths relative to the working
    directory, as the flow's other paths), no demo, writing out.zarr."""
    doc = yaml.safe_load((REPO / "flows" / f"{name}.yaml").read_text())
    doc["source"].pop("demo")
    doc["source"] |= {"path": os.path.relpath(store, tmp_path), "samples": table.name, **source}
    doc["sink"]["path"] = "out.zarr"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _by_hand(store: Path, variables: list[str], **added) -> xr.Dataset:
    ds = pipeline.open_dataset(store, backend="cpu", variables=[*variables, "sample_id"])
    return ds.assign({k: ("samples", np.asarray(v)) for k, v in added.items()})


def test_gwas_flow_on_an_imported_store_with_a_table(tmp_path, store):
    table = _write_table(tmp_path / "samples.tsv", _rows(list(range(N_SAMPLES))[::-1]))
    flow = _flow("gwas", tmp_path, store, table)
    r = _pipeline("validate", flow.name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _pipeline("run", flow.name, "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = xr.open_zarr(tmp_path / "out.zarr")
    _, trait, covariate = _table()
    ds = _by_hand(store, ["call_genotype", "variant_allele", "variant_position", "variant_contig"],
                  sample_trait=trait, sample_covariate=covariate)
    steps = yaml.safe_load(flow.read_text())["steps"]
    for step in steps:
        ds = getattr(sg, step["op"])(ds, **step.get("params", {}))
    assert out.sizes["variants"] == ds.sizes["variants"] > 10
    for v in ("variant_position", "variant_linreg_beta", "variant_linreg_t_value", "variant_linreg_p_value"):
        np.testing.assert_allclose(out[v].values, ds[v].values, rtol=1e-12, err_msg=v)


def test_qc_flow_takes_its_cohorts_from_the_table(tmp_path, store):
    table = _write_table(tmp_path / "samples.tsv", _rows())
    flow = _flow("genomics_qc", tmp_path, store, table)
    doc = yaml.safe_load(flow.read_text())
    for step in doc["steps"]:  # a store this small: fewer components, rarer alleles kept
        step.get("params", {}).update({"n_components": 3} if step["op"] == "pca" else
                                      {"min_maf": 0.01} if step["op"] == "filter_variants" else {})
    flow.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _pipeline("run", flow.name, "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = xr.open_zarr(tmp_path / "out.zarr")
    cohort, _, _ = _table()
    labels = list(dict.fromkeys(cohort))
    ds = _by_hand(store, ["call_genotype", "variant_allele", "variant_position", "variant_contig", "contig_id"],
                  sample_cohort=np.array([labels.index(c) for c in cohort], np.int64))
    for step in doc["steps"]:
        ds = getattr(sg, step["op"])(ds, **step.get("params", {}))
    np.testing.assert_array_equal(out["sample_cohort"].values, ds["sample_cohort"].values)
    assert out["sample_cohort"].attrs["cohort_labels"] == labels
    np.testing.assert_allclose(np.abs(out["sample_pca_projection"].values), np.abs(ds["sample_pca_projection"].values),
                               rtol=1e-8, atol=1e-10)


def test_flow_errors_name_the_table(tmp_path, store):
    """validate refuses a table that does not match the store, one that would replace one of the
    store's variables, and a table on a flow of one variable."""
    table = _write_table(tmp_path / "samples.tsv", _good_rows(IDS[2:]))
    flow = _flow("gwas", tmp_path, store, table, variables=["call_genotype", "sample_trait"])
    r = _pipeline("validate", flow.name, cwd=tmp_path)
    assert r.returncode == 2
    assert ("gwas.yaml: source.samples: samples.tsv: 2 of the store's 16 samples are not in the table: 'S00', 'S01'"
            in r.stderr), r.stderr
    _write_table(tmp_path / "samples.tsv", [["sample_id", "trait", "id"]] + [[s, "1", "2"] for s in IDS])
    r = _pipeline("validate", flow.name, cwd=tmp_path)
    assert r.returncode == 2
    assert "samples.tsv: column 'id' would replace the variable 'sample_id' the store already has" in r.stderr, r.stderr
    doc = yaml.safe_load(flow.read_text())
    flow.write_text(yaml.safe_dump({**doc, "source": {**doc["source"], "samples": "nope.tsv"}}))
    r = _pipeline("validate", flow.name, cwd=tmp_path)
    assert r.returncode == 2 and "gwas.yaml: source.samples: nope.tsv: no such file" in r.stderr, r.stderr
    doc["source"] = {"path": doc["source"]["path"], "variable": "call_genotype", "samples": "samples.tsv"}
    flow.write_text(yaml.safe_dump(doc))
    r = _pipeline("validate", flow.name, cwd=tmp_path)
    assert r.returncode == 2 and "gwas.yaml: source.samples: a sample table adds variables to a dataset" in r.stderr, r.stderr
    assert not (tmp_path / "out.zarr").exists()


# --- on the GPU -------------------------------------------------------------------------------------------


@requires_gpu
@pytest.mark.gpu
def test_table_variables_live_on_the_gpu_in_the_stores_sample_chunks(tmp_path, store):
    from pipeline import backend as B
    from pipeline.flows import build_flow, load_flow

    table = _write_table(tmp_path / "samples.tsv", _rows(list(range(N_SAMPLES))[::-1]))
    flow = load_flow(_flow("gwas", tmp_path, store, table, path=str(store), samples=str(table)))
    cpu, gpu = build_flow(flow, "cpu").source, build_flow(flow, "gpu").source
    for v in ("sample_trait", "sample_covariate"):
        assert B.backend_of(gpu[v]) == "gpu" and B.backend_of(cpu[v]) == "cpu"
        assert gpu[v].data.chunks == (gpu["call_genotype"].data.chunks[1],)
        np.testing.assert_array_equal(B.to_numpy(gpu[v].data), cpu[v].values)
