"""Every op's result says what it is: CF units, long_name, cell_methods, and a standard_name only
where it still holds (as xclim's indicators set theirs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from cf_xarray.units import units as cf_units

import pipeline
from pipeline.flows import load_flow, run_flow

from .conftest import climate_array
from .test_ops_grouped import daily

TAS_ATTRS = {
    "standard_name": "air_temperature",
    "long_name": "Near-surface air temperature",
    "units": "K",
    "cell_methods": "time: mean",
    "comment": "daily means",
}

# parameters that make each op run on a small daily (time, lat, lon) series; an op missing here
# fails test_every_op_says_what_its_result_is until it is added
SAMPLE = {
    "anomaly": {},
    "climatology": {},
    "coarsen_mean": {"factors": {"lat": 2}},
    "count_above": {"threshold": "10 degC"},
    "detrend": {},
    "max_spell_length": {"threshold": 283.0},
    "quantile": {"q": 0.9},
    "resample_mean": {"freq": "MS"},
    "rolling_mean": {"window": 5},
    "saturation_vapor_pressure": {},
    "standardized_anomaly": {},
    "weighted_mean": {},
    # the generic steps (xarray's reductions by name)
    "resample": {"freq": "YS", "how": "mean"},
    "groupby": {"group": "time.month", "how": "mean"},
    "rolling": {"window": 5, "how": "mean"},
    "coarsen": {"factors": {"lat": 2}, "how": "mean", "boundary": "trim"},
    "weighted": {"how": "mean"},
    "reduce": {"dims": "time", "how": "mean"},
}

# CF standard names a result may carry: the input's, or a count or spell of days above a threshold
STANDARD_NAMES = {
    "air_temperature",
    "number_of_days_with_air_temperature_above_threshold",
    "spell_length_of_days_with_air_temperature_above_threshold",
}


def tas(nt=400, **attrs) -> xr.DataArray:
    return daily(nt=nt).chunk({"time": 100}).assign_attrs({**TAS_ATTRS, **attrs})


def test_every_op_declares_a_metadata_rule():
    missing = [op.name for op in pipeline.ops.all_ops() if op.produces is None and not op.dataset]
    assert not missing, f"ops without a Produces rule: {missing}"


@pytest.mark.parametrize("name", [n for n in pipeline.ops.names() if not pipeline.ops.get(n).dataset])
def test_every_op_says_what_its_result_is(name):
    assert name in SAMPLE, f"add sample parameters for op {name!r} to SAMPLE"
    x = tas()
    out = pipeline.ops.get(name).func(x, **SAMPLE[name])
    attrs = out.attrs
    assert out.name == x.name  # names are left to flows
    assert attrs != x.attrs and "comment" not in attrs  # not a copy of the input's
    assert attrs["long_name"] and attrs["long_name"] != x.attrs["long_name"]
    cf_units.Unit(attrs["units"])  # parses as a CF unit
    assert attrs.get("standard_name", "air_temperature") in STANDARD_NAMES
    assert attrs["cell_methods"].startswith("time: mean")  # the input's, then the op's
    assert x.attrs == TAS_ATTRS  # the input is left alone


def _dimensionality(u: str):
    return cf_units.Unit(u).dimensionality


EXPECTED = {
    "standardized_anomaly": (
        {},
        {"long_name": "standardized anomaly of Near-surface air temperature along time", "units": "1",
         "cell_methods": "time: mean"},
    ),
    "weighted_mean": (
        {"dims": ["lat", "lon"], "weights": "coslat"},
        {"standard_name": "air_temperature", "long_name": "area-weighted mean of Near-surface air temperature",
         "units": "K", "cell_methods": "time: mean area: mean"},
    ),
    "detrend": (
        {"dim": "time", "deg": 1},
        {"long_name": "Near-surface air temperature with its degree-1 polynomial trend along time removed",
         "units": "K", "cell_methods": "time: mean"},
    ),
    "quantile": (
        {"q": 0.9, "dim": "time"},
        {"standard_name": "air_temperature", "long_name": "90th percentile of Near-surface air temperature along time",
         "units": "K", "cell_methods": "time: mean time: percentile"},
    ),
    "count_above": (
        {"threshold": "25 degC", "freq": "YS"},
        {"standard_name": "number_of_days_with_air_temperature_above_threshold",
         "long_name": "yearly number of days with Near-surface air temperature above 25 degC", "units": "days",
         "cell_methods": "time: mean time: sum over days", "threshold": 298.15},
    ),
    "max_spell_length": (
        {"threshold": "25 degC", "freq": "YS"},
        {"standard_name": "spell_length_of_days_with_air_temperature_above_threshold",
         "long_name": "yearly longest run of consecutive days with Near-surface air temperature above 25 degC",
         "units": "days", "cell_methods": "time: mean time: maximum over days", "threshold": 298.15},
    ),
    "climatology": (
        {"freq": "month"},
        {"standard_name": "air_temperature", "long_name": "monthly climatology of Near-surface air temperature",
         "units": "K", "cell_methods": "time: mean time: mean within years time: mean over years"},
    ),
    "anomaly": (
        {"freq": "month"},
        {"long_name": "anomaly of Near-surface air temperature from its monthly climatology", "units": "K",
         "cell_methods": "time: mean"},
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_attributes_of_the_shipped_flows_ops(name):
    params, expected = EXPECTED[name]
    out = pipeline.ops.get(name).func(tas(), **params)
    assert out.attrs.keys() == expected.keys()
    threshold = expected.pop("threshold", None)
    assert {k: v for k, v in out.attrs.items() if k != "threshold"} == expected
    if threshold is not None:
        assert out.attrs["threshold"] == pytest.approx(threshold)


def test_units_say_what_the_values_are():
    x = tas()
    assert _dimensionality(pipeline.ops.count_above(x, threshold=290).attrs["units"]) == _dimensionality("d")
    assert _dimensionality(pipeline.ops.standardized_anomaly(x).attrs["units"]) == _dimensionality("1")
    svp = pipeline.ops.saturation_vapor_pressure(x)
    assert _dimensionality(svp.attrs["units"]) == _dimensionality("hPa")
    assert pipeline.ops.anomaly(x.assign_attrs(units="degC")).attrs["units"] == "degC"  # anomalies keep units


def test_counts_of_steps_that_are_not_days():
    """Six-hourly data: a count of steps, with no 'days' units and no 'number of days' name."""
    x = daily(nt=120, freq="6h").chunk({"time": 40}).assign_attrs(TAS_ATTRS)
    count = pipeline.ops.count_above(x, threshold=285, freq="1D")
    assert count.attrs["units"] == "1" and "standard_name" not in count.attrs
    assert count.attrs["cell_methods"] == "time: mean time: sum"
    assert count.attrs["long_name"] == "daily number of time steps with Near-surface air temperature above 285 K"
    spell = pipeline.ops.max_spell_length(x, threshold=285, freq="1D")
    assert spell.attrs["units"] == "1" and "standard_name" not in spell.attrs


def test_a_count_of_another_quantity_has_no_temperature_standard_name():
    x = tas(standard_name="surface_temperature", long_name=None)
    x.attrs.pop("long_name")
    count = pipeline.ops.count_above(x, threshold=290)
    assert "standard_name" not in count.attrs and count.attrs["units"] == "days"
    assert count.attrs["long_name"] == "yearly number of days with tas above 290 K"  # the variable's name


def test_means_name_their_dimensions_and_weights():
    x = climate_array(chunks={"time": 25}).assign_attrs(long_name="T")
    assert pipeline.ops.weighted_mean(x, dims=["lat"]).attrs["cell_methods"] == "lat: mean (comment: weighted by cos(latitude))"
    plain = pipeline.ops.weighted_mean(x, weights=None)
    assert plain.attrs["cell_methods"] == "lat: lon: mean" and plain.attrs["long_name"] == "mean of T over lat, lon"
    many = pipeline.ops.quantile(x, q=[0.1, 0.5])
    assert many.attrs["cell_methods"] == "time: percentile" and many.attrs["long_name"] == "percentiles of T along time"
    assert pipeline.ops.quantile(x, q=0.5).attrs["cell_methods"] == "time: median"
    roll = pipeline.ops.rolling_mean(x, window=3, center=True)
    assert roll.attrs["cell_methods"] == "time: mean (comment: moving window of 3 steps, centred)"
    assert pipeline.ops.resample_mean(x, freq="7D").attrs["long_name"] == "per 7D period mean of T"


def test_attributes_reach_the_store_through_a_shipped_flow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from pipeline.demo import write_demo

    write_demo("data/demo.zarr", "2MB", seed=1)
    flow = load_flow(Path(__file__).resolve().parent.parent / "flows" / "heatwave_days.yaml")
    run_flow(flow, backend="cpu", source="data/demo.zarr", output="out/h.zarr")
    ds = xr.open_zarr("out/h.zarr")
    assert ds["hot_days"].attrs["standard_name"] == "number_of_days_with_air_temperature_above_threshold"
    assert ds["hot_days"].attrs["units"] == "days"
    assert ds["longest_hot_spell"].attrs["standard_name"] == "spell_length_of_days_with_air_temperature_above_threshold"
    tas_source = xr.open_zarr("data/demo.zarr")["tas"]
    expected = (tas_source > 298.15).resample(time="YS").sum()
    np.testing.assert_array_equal(ds["hot_days"].values, expected.values)
    assert pd.Index(ds.time.values).equals(pd.Index(expected.time.values))
