"""What the tests that run flows on real clusters share: the CLI as a subprocess on the CPU
backend, and the reference value of the climate_anomaly flow computed by xarray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import xarray as xr

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"


def cli(*args, cwd, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu", **(env or {})},
    )


def expected_anomaly(store: Path) -> np.ndarray:
    """The climate_anomaly flow computed by xarray: standardized anomaly over time, then the
    cos(lat)-weighted mean over (lat, lon)."""
    src = xr.open_zarr(store)["tas"]
    x = src.astype("float64")
    z = (x - x.mean("time")) / x.std("time")
    return z.weighted(np.cos(np.deg2rad(src.lat))).mean(("lat", "lon")).values
