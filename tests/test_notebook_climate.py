"""The climate analysis notebook runs top to bottom on a small, multi-year demo dataset and agrees
with xarray."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("matplotlib")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "climate_analysis.ipynb"

FIGURES = [
    "climatology_cycle.png",
    "climatology_jul_minus_jan.png",
    "global_mean_anomaly.png",
    "detrended_p90.png",
    "heat_first_year.png",
    "sst_monthly_coarse.png",
]


def _texts(nb):
    """All text a notebook's cells printed or displayed."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                yield out["text"]
            for key in ("text/plain", "text/html"):
                if key in out.get("data", {}):
                    yield out["data"][key]


def test_climate_analysis_notebook_runs(tmp_path, monkeypatch):
    # 8 MB on a 10 degree grid (19 x 36) is 1169 days: more than two years, for yearly
    # counts and spells, in a few seconds
    monkeypatch.setenv("PIPELINE_DEMO_SIZE", "8MB")
    monkeypatch.setenv("PIPELINE_DEMO_RESOLUTION", "10")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    ds = pipeline.open_dataset(tmp_path / "data" / "demo.zarr", backend="cpu")
    assert ds.sizes["time"] >= 2 * 365 and ds.sizes["lat"] == 19
    for name in FIGURES:
        assert (tmp_path / "out" / name).is_file(), name
    assert any("all checks match xarray" in text for text in _texts(nb))
