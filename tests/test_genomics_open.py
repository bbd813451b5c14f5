"""Opening a VCF Zarr store fast: ``load_dataset`` and a sample table give the values xarray and
the table hold, the table's numbers are Python's ``float`` of its cells (read in one pass), and the
open imports nothing the computation does not need (distributed, to look for a client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from pipeline.errors import InputError
from pipeline.sources import samples

from .conftest import BACKENDS

pytest.importorskip("bio2zarr")
pytest.importorskip("cyvcf2")

REPO = Path(__file__).resolve().parent.parent
IDS = [f"S{i:02d}" for i in range(12)]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small biallelic store imported by bio2zarr, with ``samples.tsv`` beside it (rows in
    another order than the store's samples)."""
    from pipeline.demo_genomics import import_vcf

    root = tmp_path_factory.mktemp("open")
    rng = np.random.default_rng(3)
    lines = ["##fileformat=VCFv4.3", "##contig=<ID=chr1,length=100000>",
             '##FORMAT=<ID=GT,Number=1,Type=String,Description="Genotype">',
             "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\tFORMAT\t" + "\t".join(IDS)]
    for v in range(40):
        calls = ["./." if rng.random() < 0.05 else f"{rng.integers(2)}/{rng.integers(2)}" for _ in IDS]
        lines.append(f"chr1\t{100 * (v + 1)}\tv{v}\tA\tG\t.\tPASS\t.\tGT\t" + "\t".join(calls))
    (root / "x.vcf").write_text("\n".join(lines) + "\n")
    out = import_vcf(root / "x.vcf", root / "x.vcz", variant_chunk=16, sample_chunk=5)
    rows = ["sample_id\ttrait\tcohort"] + [f"{s}\t{i / 4}\t{'AB'[i % 2]}" for i, s in reversed(list(enumerate(IDS)))]
    (root / "samples.tsv").write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_table_and_counts_in_a_fresh_process_leave_distributed_unimported(store, backend):
    """A whole process as a user's: open, attach the table, count alleles, compute. The sample IDs
    the table is matched against are read without dask's compute, which imports distributed (a
    quarter of a second) only to find no client."""
    script = textwrap.dedent("""
        import json, sys
        import pipeline, pipeline.genomics as sg
        from pipeline.sources import samples
        ds = sg.load_dataset(sys.argv[1], backend=sys.argv[3])
        ds = samples.attach(ds, samples.read_table(sys.argv[2]))
        counts, trait, cohort = map(pipeline.to_numpy, pipeline.compute(
            [sg.count_variant_alleles(ds)["variant_allele_count"].data, ds["sample_trait"].data, ds["sample_cohort"].data]))
        print(json.dumps({"counts": counts.tolist(), "trait": trait.tolist(), "cohort": cohort.tolist(),
                          "distributed": "distributed" in sys.modules,
                          "sinks": sorted(m for m in sys.modules if m.startswith("pipeline.sinks."))}))
    """)
    env = {**os.environ, "DASK_PIPELINE__BACKEND": backend}
    r = subprocess.run([sys.executable, "-c", script, str(store), str(store.parent / "samples.tsv"), backend],
                       capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["distributed"] is False
    assert out["sinks"] == []  # save_dataset's writer is imported when asked for, not by an open
    g = xr.open_zarr(store)["call_genotype"].values
    expected = np.stack([(g == a).sum(axis=(1, 2)) for a in (0, 1)], axis=1)
    np.testing.assert_array_equal(out["counts"], expected)
    assert out["trait"] == [i / 4 for i in range(len(IDS))]  # in the store's order, not the table's
    labels = ["AB"[i % 2] for i in reversed(range(len(IDS)))]  # numbered in order of first appearance
    assert out["cohort"] == [list(dict.fromkeys(labels)).index("AB"[i % 2]) for i in range(len(IDS))]


def test_save_dataset_is_imported_when_asked_for():
    import pipeline.genomics as sg
    from pipeline.sinks import sgkit

    assert sg.save_dataset is sgkit.save_dataset
    assert "save_dataset" in sg.__all__
    with pytest.raises(AttributeError, match="no attribute 'save_datasets'"):
        sg.save_datasets


CELLS = ["1_000", " 2 ", "inf", "-Infinity", "NA", ".", "", "1e400", "-0", "+.5", "\u0661\u0662", "nan", "N/A"]


def test_table_numbers_are_pythons_float_of_each_cell(tmp_path):
    """The cells are converted in one pass, each as Python's ``float`` reads it (missing values NaN)."""
    ids = [f"S{i}" for i in range(len(CELLS))]
    path = tmp_path / "s.tsv"
    path.write_text("sample_id\tx\n" + "".join(f"{i}\t{c}\n" for i, c in zip(ids, CELLS)))
    table = samples.read_table(path)
    expected = np.array([np.nan if c.strip() in samples.MISSING else float(c) for c in CELLS])
    values, _ = samples.variables(table, ids[::-1])["sample_x"]
    np.testing.assert_array_equal(values, expected[::-1])
    assert np.signbit(values[len(CELLS) - 1 - CELLS.index("-0")])


def test_the_first_cell_that_is_no_number_is_named(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("sample_id,x\nA,1\nB,0x10\nC,2\nD,abc\n")
    with pytest.raises(InputError, match=r"s\.csv: column 'x', sample 'B': '0x10' is not a number") as e:
        samples.read_table(path)
    assert "abc" not in str(e.value)


def test_genomics_open_benchmark_smoke(store, tmp_path):
    """``benchmarks/genomics_open.py`` times each phase in a fresh process, the table found beside the store."""
    out = tmp_path / "open.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "genomics_open.py"), str(store), "--repeat", "1",
                        "--compute", "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    phases = ["open", "table", "graph", "compute"]
    assert set(result["seconds"]) == {"import", *phases, *(f"warm_{p}" for p in phases)}
    assert all(s > 0 for s in result["seconds"].values())
    assert result["whole"] > sum(result["seconds"][p] for p in ["import", *phases])
    assert "distributed" not in sum(result["imported"].values(), [])
    assert "import" in r.stdout and "warm" in r.stdout and str(store) in r.stdout
