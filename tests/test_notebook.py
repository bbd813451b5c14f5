"""The quickstart notebook runs top to bottom on a small demo dataset and agrees with xarray."""

from __future__ import annotations

from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"


def _texts(nb):
    """All text a notebook's cells printed or displayed."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                yield out["text"]
            for key in ("text/plain", "text/html"):
                if key in out.get("data", {}):
                    yield out["data"][key]


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_DEMO_SIZE", "8MB")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    assert (tmp_path / "data" / "demo.zarr").is_dir()
    assert (tmp_path / "out" / "quickstart_global_mean.png").is_file()
    assert any("matches xarray" in text for text in _texts(nb))
