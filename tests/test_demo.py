"""The demo dataset: CF-style, deterministic from a seed, packed variable consistent with sst."""

from __future__ import annotations

import numpy as np
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
