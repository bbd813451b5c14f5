"""One dispatch path: every op runs the kernels it declares, reached through the registry, and no
op or reduction picks code by the type of its blocks."""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline import kernels

from .conftest import on_backend

ROOT = pathlib.Path(pipeline.__file__).parent


def data(nt=47, shape=(5, 7), seed=0) -> xr.DataArray:
    """Daily data with NaNs (a point always missing), chunks that divide no axis."""
    rng = np.random.default_rng(seed)
    x = (285 + rng.standard_normal((nt, *shape)) * 5).astype(np.float32)
    x[rng.random(x.shape) < 0.15] = np.nan
    x[:, 0, 0] = np.nan
    return xr.DataArray(
        x,
        dims=("time", "lat", "lon"),
        coords={"time": pd.date_range("2001-01-20", periods=nt, freq="D"), "lat": np.linspace(-60, 60, shape[0]),
                "lon": np.arange(shape[1], dtype=float)},
        name="tas",
        attrs={"units": "K"},
    )


ODD = {"time": 13, "lat": 2}  # chunks that divide no axis
ONE = {"time": -1, "lat": 2}  # the time axis in one chunk

# each op, in every condition that changes which of its kernels run: (parameters, chunks)
CASES = {
    "standardized_anomaly": [({}, ODD)],
    "weighted_mean": [({}, ODD), ({}, {"time": 13}), ({"weights": None, "dims": ("lat",)}, ODD)],
    "rolling_mean": [({"window": 5}, ODD), ({"window": 4, "center": True, "min_periods": 2}, ODD)],
    "climatology": [({}, ODD), ({"freq": "dayofyear"}, ODD)],
    "anomaly": [({}, ODD)],
    "resample_mean": [({"freq": "7D"}, ODD)],
    "count_above": [({"threshold": 286.0, "freq": "MS"}, ODD)],
    "max_spell_length": [({"threshold": 284.0, "freq": "MS"}, ODD),
                         ({"threshold": 284.0, "freq": "MS", "resample_before_rl": True}, ODD)],
    "coarsen_mean": [({"factors": {"lat": 2, "lon": 3}}, ODD)],
    "detrend": [({}, ODD), ({"deg": 2}, ONE)],
    "quantile": [({"q": [0.1, 0.5]}, ODD)],
    "saturation_vapor_pressure": [({}, ODD)],
}


# kernels that merge and finish a reduction's partials (pipeline.reduce.aggregation.HOST_FINISH_BYTES)
FINISHING = {"moments_merge", "mean_std"}


def test_every_op_has_its_cases():
    # the Dataset ops (genomics) run their kernels in their own tests (tests/test_genomics_*.py)
    # the generic steps run xarray's own methods: they declare no kernel
    assert sorted(CASES) == [n for n in pipeline.ops.names()
                             if not pipeline.ops.get(n).dataset and any(pipeline.ops.get(n).kernels.values())]


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_op_runs_the_kernels_it_declares(backend, name):
    """Under every condition, an op calls only kernels it declares for the backend, and over all
    conditions, every one of them."""
    op = pipeline.ops.get(name)
    assert backend in op.backends
    declared = set(op.kernels[backend])
    ran = set()
    for params, chunks in CASES[name]:
        x = on_backend(data().chunk(chunks), backend)
        with kernels.recording() as calls:
            out = op.func(x, **params)
            pipeline.compute(out)
        names = {k for k, b in calls}
        # a reduction's small partials are merged and finished on the host, by the CPU's kernels
        assert {b for k, b in calls if k not in FINISHING} == {backend}, calls
        assert {b for k, b in calls if k in FINISHING} <= {backend, "cpu"}, calls
        assert names and names <= declared, (params, chunks, names, declared)
        ran |= names
    assert ran == declared


def test_every_declared_kernel_exists():
    for op in pipeline.ops.all_ops():
        assert op.kernels, op.name
        for backend, names in op.kernels.items():
            assert backend in kernels.BACKENDS
            for k in names:
                assert k in kernels.FAMILIES, (op.name, k)
                assert kernels.has(k, backend), (op.name, k, backend)
        assert op.backends == ("cpu", "gpu"), op.name


def test_an_op_gets_no_kernel_it_does_not_declare():
    op = pipeline.ops.get("standardized_anomaly")
    assert op.kernel("moments", "cpu") is kernels.get("moments", "cpu")
    with pytest.raises(NotImplementedError, match="declares: moments, moments_merge_parts, mean_std, standardize"):
        op.kernel("rolling_mean", "cpu")


def test_no_op_or_reduction_picks_code_by_the_type_of_its_blocks():
    for folder in ("ops", "reduce"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "is_cupy" not in path.read_text(), path


def test_a_reduction_refuses_a_kernel_other_than_its_blueprints():
    import dask.array as da

    from pipeline.reduce import aggregation

    x = da.ones((10, 4), chunks=5)
    with pytest.raises(ValueError, match="with the kernel 'moments', not 'weighted_sums'"):
        aggregation.nanmean_std(x, 0, kernel=kernels.get("weighted_sums", "cpu"))
