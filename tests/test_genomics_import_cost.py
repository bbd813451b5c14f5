"""The fixed cost of a genomics process, guarded without timing: what ``import pipeline.genomics``
and an open with a sample table import (not the libraries only a computation, a GPU, a cluster
or a writer needs), Python's garbage collector left on, and what the process holds frozen at its
exit, so that the interpreter's last collections do not walk it. Each case is a fresh process,
as a user's script is."""

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

from .conftest import BACKENDS

REPO = Path(__file__).resolve().parent.parent
IDS = ["s3", "s0", "s2", "s1", "s4"]
# imported by a computation (numba), a cluster (distributed), the GPU (cupy), pca (sklearn) or a
# writer (pipeline.sinks), never by an import or an open on the CPU
NOT_BY_AN_OPEN = ("numba", "distributed", "cupy", "sklearn", "pipeline.sinks")
# imported by the first open, not by the import
NOT_BY_THE_IMPORT = (*NOT_BY_AN_OPEN, "dask.array", "zarr", "scipy")


def _run(script: str, *args, backend: str = "cpu", env: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                       text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "DASK_PIPELINE__BACKEND": backend, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A VCF Zarr store written by xarray (4 variants x 5 samples, diploid, one missing call),
    and ``samples.tsv`` beside it, its rows in another order than the store's samples."""
    root = tmp_path_factory.mktemp("cost")
    g = np.array([[[0, 1], [1, 1], [0, 0], [-1, -1], [0, 1]],
                  [[1, 1], [0, 0], [0, 1], [1, 0], [0, 0]],
                  [[0, 0], [0, 0], [0, 0], [0, 0], [0, 0]],
                  [[1, 1], [1, 1], [0, 1], [1, 1], [1, 0]]], dtype=np.int8)
    ds = xr.Dataset({
        "call_genotype": (("variants", "samples", "ploidy"), g),
        "variant_position": ("variants", np.array([10, 20, 30, 40], np.int32)),
        "variant_allele": (("variants", "alleles"), np.array([["A", "G"]] * 4, dtype=object)),
        "sample_id": ("samples", np.array(IDS, dtype=object)),
    }, attrs={"vcf_zarr_version": "0.4"})
    ds.to_zarr(root / "g.vcz", zarr_format=2, encoding={"call_genotype": {"chunks": (2, 3, 2)}})
    rows = ["sample_id\ttrait\tcohort"] + [f"{s}\t{i / 2}\t{'AB'[i % 2]}" for i, s in reversed(list(enumerate(sorted(IDS))))]
    (root / "samples.tsv").write_text("\n".join(rows) + "\n")
    return root / "g.vcz"


def test_import_leaves_what_an_open_or_a_computation_needs_unimported():
    out = _run("""
        import gc, json, sys
        import pipeline.genomics as sg
        from pipeline.sources import samples
        print(json.dumps({"imported": [m for m in sys.modules if m.split(".")[0] in ("numba", "distributed", "cupy",
                          "sklearn", "dask", "zarr", "scipy") or m.startswith("pipeline.sinks")],
                          "collecting": gc.isenabled(), "frozen": gc.get_freeze_count(), "ops": len(sg.__all__)}))
    """)
    assert not [m for m in out["imported"] if m.startswith(NOT_BY_THE_IMPORT)], out["imported"]
    assert out["collecting"] is True
    assert out["frozen"] == 0  # a process that goes on keeps its collector whole
    assert out["ops"] > 50


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_with_a_table_imports_nothing_a_computation_needs_and_the_counts_hold(store, backend):
    """Open, attach the table, build the counts' graph: numba (until the graph, whose Numba CUDA
    kernels start its import in the background on the GPU), distributed, sklearn and the sinks
    stay unimported (cupy too on the CPU), and the collector is on, as the user left it: dask.array's
    slicing takes the collector's state once, when dask.array is imported (``dask.utils.disable_gc``),
    and the graph slices, so an import of dask.array with the collector held off (to save its
    collections) would leave it off for good. The counts computed are the genotypes', the
    table's values in the store's sample order."""
    out = _run("""
        import gc, json, sys
        import pipeline, pipeline.genomics as sg
        from pipeline.sources import samples
        ds = sg.load_dataset(sys.argv[1], backend=sys.argv[3])
        ds = samples.attach(ds, samples.read_table(sys.argv[2]))
        # on the GPU, building a graph of Numba CUDA kernels starts numba.cuda's import on a thread
        # of its own (kernels.launch.prepare_numba_cuda): numba is looked for before
        opened = [m for m in sys.modules if m.split(".")[0] == "numba"]
        counts = sg.count_variant_alleles(ds)["variant_allele_count"]
        later = ("distributed", "cupy", "sklearn") + (("numba",) if sys.argv[3] == "cpu" else ())
        imported = opened + [m for m in sys.modules if m.split(".")[0] in later or m.startswith("pipeline.sinks")]
        collecting = gc.isenabled()
        gc.disable()  # a user's choice, which an open keeps
        sg.load_dataset(sys.argv[1], backend=sys.argv[3])
        kept = not gc.isenabled()
        gc.enable()
        counts, trait = map(pipeline.to_numpy, pipeline.compute([counts.data, ds["sample_trait"].data]))
        print(json.dumps({"imported": imported, "collecting": collecting, "kept": kept,
                          "counts": counts.tolist(), "trait": trait.tolist()}))
    """, store, store.parent / "samples.tsv", backend, backend=backend)
    unimported = NOT_BY_AN_OPEN if backend == "cpu" else tuple(m for m in NOT_BY_AN_OPEN if m != "cupy")
    assert not [m for m in out["imported"] if m.startswith(unimported)], out["imported"]
    assert out["collecting"] is True and out["kept"] is True
    g = xr.open_zarr(store)["call_genotype"].values
    assert out["counts"] == np.stack([(g == a).sum(axis=(1, 2)) for a in (0, 1)], axis=1).tolist()
    assert out["trait"] == [sorted(IDS).index(s) / 2 for s in IDS]


def test_a_process_exits_with_what_it_holds_frozen(store, tmp_path):
    """At exit, after the functions registered later (atexit runs them last in, first out), what
    the process holds is frozen, out of the last collections' walk. A function registered before
    the import runs after the freeze and sees it; the store's values were read whole before."""
    seen = tmp_path / "seen.json"
    out = _run(script := """
        import atexit, gc, json, sys
        atexit.register(lambda: open(sys.argv[2], "w").write(json.dumps({"frozen": gc.get_freeze_count()})))
        import pipeline.genomics as sg
        ds = sg.load_dataset(sys.argv[1], backend="cpu")
        print(json.dumps({"frozen": gc.get_freeze_count(), "positions": ds["variant_position"].values.tolist()}))
    """, store, seen)
    assert out == {"frozen": 0, "positions": [10, 20, 30, 40]}
    assert json.loads(seen.read_text())["frozen"] > 10_000
    # the setting leaves the exit to Python
    _run(script, store, seen, env={"DASK_PIPELINE__FREEZE_AT_EXIT": "false"})
    assert json.loads(seen.read_text())["frozen"] == 0


def test_the_open_benchmark_times_the_exit(store, tmp_path):
    """``benchmarks/genomics_open.py`` reports the interpreter's exit after the last phase, within
    the whole process's wall time."""
    out = tmp_path / "open.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "genomics_open.py"), str(store), "--repeat", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert 0 < result["exit"] < result["whole"]
    assert result["whole"] > sum(result["seconds"][p] for p in ("import", "open", "table", "graph")) + result["exit"]
    assert "exit" in r.stdout.splitlines()[1].split()
