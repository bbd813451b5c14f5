"""The notebooks run top to bottom in CI, on small demo datasets, and agree with xarray (each ends
with a cell that checks its results against plain xarray and prints that they match)."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_notebook(name: str, workdir: Path, monkeypatch, **env) -> str:
    """Execute a notebook in ``workdir`` with ``env`` set; all the text its cells printed."""
    for key, value in {"MPLBACKEND": "Agg", **env}.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            texts.append(out.get("text", ""))
            texts.extend(out.get("data", {}).get(k, "") for k in ("text/plain", "text/html"))
    return "\n".join(texts)


def test_quickstart(tmp_path, monkeypatch):
    text = run_notebook("quickstart.ipynb", tmp_path, monkeypatch, PIPELINE_DEMO_SIZE="8MB")
    assert (tmp_path / "data" / "quickstart-8MB-seed0.zarr").is_dir()
    assert (tmp_path / "out" / "quickstart_global_mean.png").is_file()
    assert "matches xarray" in text


def test_climate_analysis_after_quickstart(tmp_path, monkeypatch):
    """Run in the same folder after the quickstart, it uses a demo of its own size, not that one."""
    run_notebook("quickstart.ipynb", tmp_path, monkeypatch, PIPELINE_DEMO_SIZE="4MB")
    # 8 MB on a 10 degree grid (19 x 36) is 1169 days: more than three years, for yearly counts,
    # spells and a trend, in a few seconds
    text = run_notebook(
        "climate_analysis.ipynb", tmp_path, monkeypatch, PIPELINE_DEMO_SIZE="8MB", PIPELINE_DEMO_RESOLUTION="10"
    )
    store = tmp_path / "data" / "climate-8MB-10.0deg-seed0.zarr"
    ds = pipeline.open_dataset(store, backend="cpu")
    assert ds.sizes["time"] >= 3 * 365 and ds.sizes["lat"] == 19
    years = ds.sizes["time"] / 365.25
    assert f"{store.relative_to(tmp_path)}: {ds.sizes['time']} days ({years:.1f} years) on a 10° grid (19 x 36)" in text
    assert "trend of the global-mean anomaly:" in text
    figures = ["climatology_cycle", "climatology_jul_minus_jan", "global_mean_anomaly", "detrended_p90",
               "heat_first_year", "sst_monthly_coarse"]
    for name in figures:
        assert (tmp_path / "out" / f"{name}.png").is_file(), name
    assert "all checks match xarray" in text


def test_genomics(tmp_path, monkeypatch):
    pytest.importorskip("msprime")
    text = run_notebook("genomics.ipynb", tmp_path, monkeypatch, PIPELINE_GENOMICS_SAMPLES="150",
                        PIPELINE_GENOMICS_VARIANTS="2000")
    for name in ("genomics_qc", "genomics_pca", "genomics_manhattan"):
        assert (tmp_path / "out" / f"{name}.png").is_file(), name
    assert "variants after QC and LD pruning" in text
    assert "all checks match NumPy" in text
