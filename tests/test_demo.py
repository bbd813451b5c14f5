"""The demo dataset: CF-style, deterministic from a seed, packed variable consistent with sst."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import pipeline
from pipeline.demo import demo_dataset, land_mask, write_demo


def test_demo_is_deterministic_and_seeded():
    a = demo_dataset("1MB", seed=1)["tas"].values
    b = demo_dataset("1MB", seed=1)["tas"].values
    c = demo_dataset("1MB", seed=2)["tas"].values
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_demo_store_layout_and_decoding(tmp_path):
    path = write_demo(tmp_path / "d.zarr", "3MB", seed=0, time_chunk=10)
    raw = xr.open_zarr(path, mask_and_scale=False)
    assert raw["sst_packed"].dtype == np.int16
    assert {"scale_factor", "add_offset", "_FillValue"} <= set(raw["sst_packed"].attrs) | set(raw["sst_packed"].encoding)
    ds = pipeline.open_dataset(path, backend="cpu")
    assert ds["tas"].dtype == np.float32 and ds["tas"].data.chunks[0][0] == 10
    land = land_mask(ds.lat.values, ds.lon.values)
    sst, packed = ds["sst"].values, ds["sst_packed"].values
    assert np.isnan(sst[:, land]).all() and not np.isnan(sst[:, ~land]).any()
    np.testing.assert_array_equal(np.isnan(packed), np.isnan(sst))
    assert np.nanmax(np.abs(packed - sst)) <= 0.005 + 1e-4  # half a packing step
    tas = ds["tas"].values
    assert 200 < np.nanmin(tas) and np.nanmax(tas) < 340
    assert ds.time.dtype.kind == "M" and ds.lat.attrs["units"] == "degrees_north"


def _demo(args, cwd, tty: bool) -> str:
    """Run `pipeline demo` with stdout and stderr on a terminal (a pty) or on pipes; all it printed."""
    import os
    import pty
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pipeline", "demo", *args]
    if not tty:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=120) == 0, out
    os.close(master)
    return out.decode(errors="replace")


def test_demo_says_what_it_writes_and_shows_progress_on_a_terminal(tmp_path):
    out = _demo(["a.zarr", "--size", "2MB"], tmp_path, tty=True)
    assert "writing the demo dataset, 1.91 MiB" in out and "a.zarr" in out
    assert "[####" in out and "100%" in out  # dask's progress bar
    quiet = _demo(["b.zarr", "--size", "2MB"], tmp_path, tty=False)
    assert len(quiet.strip().splitlines()) == 1 and quiet.startswith("wrote b.zarr")


def test_demo_overwrite_replaces_only_a_demo_store(tmp_path):
    from pipeline.errors import InputError

    first = write_demo(tmp_path / "d.zarr", "1MB", seed=1)
    assert set(first.digests) == {"tas", "sst", "sst_packed"}
    again = write_demo(tmp_path / "d.zarr", "1MB", seed=2, overwrite=True)
    np.testing.assert_array_equal(xr.open_zarr(again)["tas"].values, demo_dataset("1MB", seed=2)["tas"].values)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not a pipeline store"):
        write_demo(folder, "1MB", overwrite=True)
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]
