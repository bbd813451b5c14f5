"""Op parameters are refused at validation, before any data is read, naming the key; what only the
data can tell (a window longer than the series) is refused when the graph is built."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
import yaml
from pydantic import ValidationError

import pipeline
from pipeline.errors import FlowError, InputError
from pipeline.flows import build_flow, parse_flow

from .conftest import climate_array, raise_if_dask_computes

# (op, params, the key that is wrong, what the message says)
BAD = [
    ("rolling_mean", {"window": -3}, "window", "greater than 0"),
    ("rolling_mean", {"window": 0}, "window", "greater than 0"),
    ("rolling_mean", {"window": True}, "window", "valid integer"),
    ("rolling_mean", {"window": 2.5}, "window", "valid integer"),
    ("rolling_mean", {"window": "3"}, "window", "valid integer"),
    ("rolling_mean", {"window": 5, "min_periods": 9}, "min_periods", "at most window (5)"),
    ("rolling_mean", {"window": 5, "min_periods": 0}, "min_periods", "greater than 0"),
    ("rolling_mean", {"window": 5, "center": "yes"}, "center", "valid boolean"),
    ("rolling_mean", {"window": 5, "dim": ""}, "dim", "name of a dimension"),
    ("standardized_anomaly", {"dim": "  "}, "dim", "name of a dimension"),
    ("quantile", {"q": 1.5}, "q", "quantile in [0, 1]"),
    ("quantile", {"q": -0.1}, "q", "quantile in [0, 1]"),
    ("quantile", {"q": [0.1, 1.5]}, "q", "quantile in [0, 1]"),
    ("quantile", {"q": []}, "q", "non-empty list"),
    ("quantile", {"q": True}, "q", "quantile in [0, 1]"),
    ("quantile", {"q": 0.9, "dim": ""}, "dim", "name of a dimension"),
    ("count_above", {"threshold": "1.2.3 degC"}, "threshold", "'25 degC'"),
    ("count_above", {"threshold": "25 furlongs"}, "threshold", "'25 degC'"),
    ("count_above", {"threshold": True}, "threshold", "finite number"),
    ("count_above", {"threshold": 25, "freq": "foo"}, "freq", "pandas frequency"),
    ("count_above", {"threshold": 25, "freq": "0D"}, "freq", "positive frequency"),
    ("max_spell_length", {"threshold": "hot"}, "threshold", "'25 degC'"),
    ("max_spell_length", {"threshold": 300, "resample_before_rl": "no"}, "resample_before_rl", "valid boolean"),
    ("resample_mean", {"freq": "-1D"}, "freq", "positive frequency"),
    ("climatology", {"freq": "year"}, "freq", "'month', 'dayofyear' or 'season'"),
    ("anomaly", {"dim": ""}, "dim", "name of a dimension"),
    ("weighted_mean", {"dims": []}, "dims", "non-empty list"),
    ("weighted_mean", {"dims": ["lat", "lat"]}, "dims", "distinct"),
    ("weighted_mean", {"dims": ["lat", ""]}, "dims", "dimension name"),
    ("weighted_mean", {"weights": ""}, "weights", "'coslat'"),
    ("coarsen_mean", {"factors": {}}, "factors", "at least 1 item"),
    ("coarsen_mean", {"factors": {"lat": 0}}, "factors", "greater than 0"),
    ("coarsen_mean", {"factors": {"lat": True}}, "factors", "valid integer"),
    ("coarsen_mean", {"factors": {"": 2}}, "factors", "name of a dimension"),
    ("detrend", {"deg": -1}, "deg", "greater than or equal to 0"),
    ("detrend", {"deg": 1.0}, "deg", "valid integer"),
    ("saturation_vapor_pressure", {"method": "magnus"}, "method", "'sonntag90' or 'tetens30'"),
]

GOOD = [
    ("rolling_mean", {"window": 3, "min_periods": 3, "center": True}),
    ("rolling_mean", {"window": np.int64(3)}),
    ("quantile", {"q": 0}),
    ("quantile", {"q": [0.1, 0.5, 0.9]}),
    ("count_above", {"threshold": "-5.5 degC", "freq": "QS-DEC"}),
    ("count_above", {"threshold": 300}),
    ("max_spell_length", {"threshold": "77 degF", "freq": "MS", "resample_before_rl": True}),
    ("weighted_mean", {"dims": "lat", "weights": None}),
    ("coarsen_mean", {"factors": {"lat": 3, "lon": np.int32(2)}}),
    ("detrend", {"deg": 0}),
]


def one_step(op, params, **step):
    return {
        "name": "f",
        "source": {"path": "data/x.zarr", "variable": "tas"},
        "steps": [{"op": op, "params": params, **step}],
        "sink": {"path": "out/f.zarr"},
    }


@pytest.mark.parametrize("op,params,key,message", BAD)
def test_bad_parameters_are_refused_by_the_op_model(op, params, key, message):
    with pytest.raises(ValidationError) as e:
        pipeline.ops.get(op).params(**params)
    named = [err for err in e.value.errors() if err["loc"][0] == key]
    assert named, e.value.errors()
    assert any(message in err["msg"] for err in named), named


@pytest.mark.parametrize("op,params,key,message", BAD)
def test_bad_parameters_fail_flow_validation_naming_the_key(op, params, key, message):
    with pytest.raises(FlowError) as e:
        parse_flow(one_step(op, params), "f.yaml")
    prefix = f"f.yaml: steps[0].params.{key}"
    line = next(line for line in str(e.value).splitlines() if line.startswith(prefix) and line[len(prefix)] in ":.")
    assert message in line and "function-" not in line  # one message per key, no pydantic internals


@pytest.mark.parametrize("op,params", GOOD)
def test_good_parameters_validate(op, params):
    validated = pipeline.ops.get(op).params(**params).model_dump()
    assert set(validated) >= set(params)


def test_validate_command_lists_every_bad_parameter(tmp_path):
    flow = one_step("standardized_anomaly", {})
    flow["steps"] = [{"op": op, "name": f"s{i}", "input": "source", "params": p} for i, (op, p, _, _) in enumerate(BAD)]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(flow, allow_unicode=True))
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", str(path)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"},
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for i, (_, _, key, message) in enumerate(BAD):
        assert f"{path}: steps[{i}].params.{key}" in r.stderr, (i, key, r.stderr)


# --- what only the data can tell -------------------------------------------------------------------


def test_window_longer_than_the_series_names_parameter_dimension_length_and_variable():
    x = climate_array(shape=(10, 3, 4), chunks={"time": 5})
    with raise_if_dask_computes(), pytest.raises(InputError) as e:
        pipeline.ops.rolling_mean(x, window=11)
    text = str(e.value)
    assert "window" in text and "'time'" in text and "10 steps" in text and "'tas'" in text
    assert pipeline.ops.rolling_mean(x, window=10).sizes == x.sizes  # the whole series is a window


def test_degree_beyond_the_series_is_refused():
    x = climate_array(shape=(3, 2, 2), chunks={"time": 2})
    with raise_if_dask_computes(), pytest.raises(InputError, match=r"deg: .*degree 3 needs at least 4 steps along dimension 'time'; variable 'tas' has 3"):
        pipeline.ops.detrend(x, deg=3)


def test_python_callers_get_input_errors_too():
    x = climate_array(shape=(20, 3, 4))
    with pytest.raises(InputError, match="window must be a positive integer"):
        pipeline.ops.rolling_mean(x, window=True)
    with pytest.raises(InputError, match="threshold must be a number or a temperature"):
        pipeline.ops.count_above(x, threshold="1.2.3 degC")
    with pytest.raises(InputError, match="threshold must be a number or a temperature"):
        pipeline.ops.count_above(x, threshold=True)


@pytest.fixture
def small_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = climate_array(shape=(10, 3, 4)).assign_attrs(standard_name="air_temperature")
    x.to_dataset().chunk({"time": 5}).to_zarr("data/x.zarr", zarr_format=3, consolidated=False)
    return tmp_path


def test_window_longer_than_the_series_fails_the_build_naming_the_step(small_source):
    flow = parse_flow(one_step("rolling_mean", {"window": 30}), "f.yaml")
    with pytest.raises(FlowError, match=r"f.yaml: steps\[0\] \(rolling_mean\): window: 30 steps is longer than dimension 'time' of variable 'tas' \(10 steps\)"):
        build_flow(flow, backend="cpu")


def test_run_command_exits_2_for_a_window_longer_than_the_series(small_source):
    path = small_source / "flow.yaml"
    path.write_text(yaml.safe_dump(one_step("rolling_mean", {"window": 30})))
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(path), "--no-progress"], capture_output=True, text=True,
        timeout=120, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"},
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "window: 30 steps is longer than dimension 'time' of variable 'tas' (10 steps)" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 4
    assert not (small_source / "out").exists()
    xr.open_zarr("data/x.zarr", consolidated=False)  # the source is untouched


@pytest.mark.parametrize(
    "op_name, params",
    [
        ("rolling_mean", {"window": 11}),
        ("coarsen_mean", {"factors": {"lat": 4}}),
        ("weighted_mean", {"dims": "height"}),
        ("climatology", {"dim": "lat"}),
    ],
)
def test_ops_refuse_bad_data_with_the_checks_that_validate_runs(monkeypatch, op_name, params):
    """Building a graph runs the data checks of :mod:`pipeline.ops.shapes` on the input's
    metadata, those that ``pipeline validate`` runs: the same error with the same message, raised
    by that check itself (replaced, the replacement is what the op runs)."""
    from pipeline.ops import get, shapes

    x = climate_array(shape=(10, 3, 4), chunks={"time": 5})
    op = get(op_name)
    full = op.params(**params).model_dump()
    with pytest.raises(InputError) as from_metadata:
        shapes.check(op, shapes.meta_of(x), full)
    with raise_if_dask_computes(), pytest.raises(InputError) as from_graph:
        op.func(x, **full)
    assert str(from_graph.value) == str(from_metadata.value)

    class Checked(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Checked

    monkeypatch.setitem(shapes.CHECKS, op_name, refuse)
    with pytest.raises(Checked):
        op.func(x, **full)
