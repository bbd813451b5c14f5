"""Generic steps (resample, groupby, rolling, coarsen, weighted, reduce): every reduction of each
equals xarray's on NumPy, validate predicts the shape of every result, bad parameters exit 2 naming
the key through `pipeline validate` and `pipeline run`, and a flow of them writes Zarr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError
from pipeline.ops import generic, shapes

from .conftest import on_backend

REPO = Path(__file__).resolve().parent.parent
CHUNKS = {"time": 17, "lat": 4}  # chunks that divide no axis

# xarray warns on all-NaN slices (a grid point is always missing)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def data(calendar: str = "standard") -> xr.DataArray:
    """100 daily steps from 20 January (four seasons), float64 with NaNs and a point always
    missing, a coordinate along time and one along lat."""
    rng = np.random.default_rng(0)
    values = 280 + 10 * rng.standard_normal((100, 6, 5))
    values[rng.random(values.shape) < 0.1] = np.nan
    values[:, 0, 0] = np.nan
    time = xr.date_range("2001-01-20", periods=100, freq="D", calendar=calendar, use_cftime=calendar != "standard")
    return xr.DataArray(
        values, dims=("time", "lat", "lon"), name="tas",
        coords={"time": time, "lat": ("lat", np.linspace(-75, 75, 6), {"units": "degrees_north"}),
                "lon": np.arange(0.0, 360.0, 72.0), "site": ("time", np.arange(100) % 3),
                "area": ("lat", np.linspace(1.0, 2.0, 6))},
        attrs={"units": "K", "standard_name": "air_temperature", "long_name": "air temperature"},
    )


def _call(obj, how, q, **dims):
    return obj.quantile(q, **dims) if how == "quantile" else getattr(obj, how)(**dims)


def _q(how, q=0.9):
    return {"q": q} if how == "quantile" else {}


def _cases():
    """(op, params, xarray on the same array): every op with every reduction it offers, and the
    variants of its other parameters."""
    out = []
    for how in generic.REDUCTIONS:
        out.append(("resample", {"freq": "MS", "how": how, **_q(how, [0.1, 0.5])},
                    lambda x, how=how: _call(x.resample(time="MS"), how, [0.1, 0.5])))
        out.append(("groupby", {"group": "time.season", "how": how, **_q(how)},
                    lambda x, how=how: _call(x.groupby("time.season"), how, 0.9)))
    for freq in ("YS", "QS-DEC", "7D"):
        out.append(("resample", {"freq": freq, "how": "max"}, lambda x, freq=freq: x.resample(time=freq).max()))
    for group in ("time.month", "time.dayofyear", "time.year", "site", "lat"):
        out.append(("groupby", {"group": group, "how": "mean"}, lambda x, group=group: x.groupby(group).mean()))
    for how in generic.ROLLING:
        out.append(("rolling", {"window": 20, "how": how, "center": True, "min_periods": 3},  # windows past a chunk
                    lambda x, how=how: getattr(x.rolling(time=20, center=True, min_periods=3), how)()))
    out.append(("rolling", {"window": 5, "how": "max"}, lambda x: x.rolling(time=5).max()))
    out.append(("rolling", {"window": 3, "how": "sum", "dim": "lon"}, lambda x: x.rolling(lon=3).sum()))
    for how in generic.COARSEN:
        out.append(("coarsen", {"factors": {"time": 7, "lat": 4}, "how": how, "boundary": "trim"},
                    lambda x, how=how: getattr(x.coarsen(time=7, lat=4, boundary="trim"), how)()))
    out.append(("coarsen", {"factors": {"time": 7}, "how": "mean", "boundary": "pad"},
                lambda x: x.coarsen(time=7, boundary="pad").mean()))
    out.append(("coarsen", {"factors": {"lat": 3, "lon": 5}, "how": "max"}, lambda x: x.coarsen(lat=3, lon=5).max()))
    for how in generic.WEIGHTED:
        out.append(("weighted", {"how": how, **_q(how, [0.25, 0.75])},
                    lambda x, how=how: _call(x.weighted(np.cos(np.deg2rad(x.lat))), how, [0.25, 0.75], dim=("lat", "lon"))))
    out.append(("weighted", {"how": "mean", "weights": "area", "dims": "lat"}, lambda x: x.weighted(x.area).mean("lat")))
    out.append(("weighted", {"how": "std", "weights": None, "dims": ["time"]}, lambda x: x.std("time")))
    for how in generic.PLAIN:
        out.append(("reduce", {"dims": ["time", "lon"], "how": how, **_q(how, 0.3)},
                    lambda x, how=how: _call(x, how, 0.3, dim=["time", "lon"])))
    out.append(("reduce", {"dims": "lat", "how": "quantile", "q": [0.2, 0.8]}, lambda x: x.quantile([0.2, 0.8], "lat")))
    return out


CASES = _cases()


def _id(case):
    op, params, _ = case
    return f"{op}-" + "-".join(str(v) for k, v in params.items() if k != "q")


def test_every_op_and_reduction_has_a_case():
    ops = {"resample": generic.REDUCTIONS, "groupby": generic.REDUCTIONS, "rolling": generic.ROLLING,
           "coarsen": generic.COARSEN, "weighted": generic.WEIGHTED, "reduce": generic.PLAIN}
    for op, hows in ops.items():
        assert {p["how"] for o, p, _ in CASES if o == op} == set(hows), op


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_equals_xarray_on_numpy_and_validate_predicts_the_result(case):
    op_name, params, reference = case
    x = data()
    op = pipeline.ops.get(op_name)
    got = op.func(x.chunk(CHUNKS), **params)
    assert hasattr(got.data, "dask")  # a graph, computed below
    with xr.set_options(use_flox=False):  # the steps run xarray's own grouped reductions
        expected = reference(x)
    xr.testing.assert_allclose(got.compute(), expected)  # values, NaNs, dims and coordinates
    assert got.dtype == expected.dtype
    # what `pipeline validate` predicts from metadata alone
    meta = shapes.check(op, shapes.meta_of(x), op.params(**params).model_dump())
    assert meta.dims == got.dims and meta.sizes == dict(got.sizes)
    for dim, index in meta.indexes.items():
        assert list(index) == list(got.indexes[dim]), dim


def test_steps_run_xarrays_own_grouped_reductions_flox_or_not():
    """Where flox is installed xarray hands it grouped reductions, which refuses median and
    quantile unless each group lies in one chunk; a step runs xarray's own whatever is installed."""
    from pipeline.ops.generic import _reduced

    class Grouped:
        def median(self, keep_attrs):
            return xr.get_options()["use_flox"]

        def quantile(self, q, keep_attrs):
            return xr.get_options()["use_flox"]

    with xr.set_options(use_flox=True):
        assert _reduced(Grouped(), "median") is False
        assert _reduced(Grouped(), "quantile", 0.5) is False
        assert xr.get_options()["use_flox"] is True  # the user's setting, unchanged after


def test_cftime_calendars_as_xarray():
    x = data("noleap")
    for op, params, reference in [
        ("resample", {"freq": "MS", "how": "max"}, lambda v: v.resample(time="MS").max()),
        ("resample", {"freq": "QS-DEC", "how": "quantile", "q": 0.5}, lambda v: v.resample(time="QS-DEC").quantile(0.5)),
        ("groupby", {"group": "time.season", "how": "std"}, lambda v: v.groupby("time.season").std()),
        ("groupby", {"group": "time.dayofyear", "how": "count"}, lambda v: v.groupby("time.dayofyear").count()),
    ]:
        got = getattr(pipeline.ops, op)(x.chunk(CHUNKS), **params)
        xr.testing.assert_allclose(got.compute(), reference(x))
        meta = shapes.check(pipeline.ops.get(op), shapes.meta_of(x), pipeline.ops.get(op).params(**params).model_dump())
        assert meta.sizes == dict(got.sizes)
    with pytest.raises(InputError, match=r"freq: 'B' is not a frequency xarray resamples dimension 'time'"):
        pipeline.ops.resample(x, freq="B", how="mean")  # no business days on a noleap calendar


def test_results_say_what_they_are():
    x = data().chunk(CHUNKS)
    cases = {
        ("resample", "max"): ({"freq": "YS"}, "yearly maximum of air temperature", "time: maximum", "K", True),
        ("groupby", "std"): ({"group": "time.season"}, "standard deviation of air temperature by time.season",
                             "time: standard_deviation (comment: grouped by time.season)", "K", False),
        ("coarsen", "var"): ({"factors": {"lat": 2}}, "variance of air temperature over blocks of 2 lat",
                             "lat: variance", "K2", False),
        ("weighted", "mean"): ({}, "area-weighted mean of air temperature", "area: mean", "K", True),
        ("reduce", "count"): ({"dims": "time"}, "number of valid values of air temperature over time",
                              "time: count", "1", False),
        ("resample", "first"): ({"freq": "MS"}, "monthly first valid value of air temperature", "time: first", "K", True),
        ("reduce", "quantile"): ({"dims": "time", "q": 0.5}, "50th percentile of air temperature over time",
                                 "time: median", "K", True),
    }
    for (op, how), expected in cases.items():
        params, long_name, cell_methods, units, keeps = expected
        attrs = getattr(pipeline.ops, op)(x, how=how, **params).attrs
        assert attrs["long_name"] == long_name and attrs["cell_methods"] == cell_methods and attrs["units"] == units
        assert attrs.get("standard_name") == ("air_temperature" if keeps else None)
    assert "units" not in pipeline.ops.reduce(x, dims="time", how="any").attrs
    assert x.attrs["units"] == "K" and "cell_methods" not in x.attrs  # the input is left alone


def test_python_callers_get_the_flows_messages():
    x = data().chunk(CHUNKS)
    with pytest.raises(InputError, match=r"how: unknown reduction 'maximum'; did you mean 'max'\?"):
        pipeline.ops.rolling(x, window=3, how="maximum")
    with pytest.raises(InputError, match=r"window: 101 steps is longer than dimension 'time'"):
        pipeline.ops.rolling(x, window=101, how="max")
    with pytest.raises(InputError, match=r"weights: coordinate 'area' of 'tas' has missing values \(NaN\)"):
        pipeline.ops.weighted(x.assign_coords(area=x.area.where(x.lat > 0)), how="mean", weights="area", dims="lat")
    with pytest.raises(InputError, match=r"weights contain missing values \(NaN\)"):
        pipeline.ops.weighted(x, how="sum", weights=x.area.where(x.lat > 0), dims="lat")


def test_float16_is_computed_in_float32():
    x = data().astype(np.float16)
    got = pipeline.ops.resample(x.chunk(CHUNKS), freq="MS", how="std")
    assert got.dtype == np.float32
    xr.testing.assert_allclose(got.compute(), x.astype(np.float32).resample(time="MS").std())
    # weights in the data's precision: float32 data give float32 results, as weighted_mean's
    got = pipeline.ops.weighted(x.chunk(CHUNKS), how="mean")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.values, data().weighted(np.cos(np.deg2rad(data().lat))).mean(("lat", "lon")).values,
                               rtol=1e-3)


def test_building_computes_nothing():
    from .conftest import raise_if_dask_computes

    x = data().chunk(CHUNKS)
    with raise_if_dask_computes():
        for op, params, _ in CASES[::7]:
            getattr(pipeline.ops, op)(x, **params)


# --- the command line -------------------------------------------------------------------------------


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """tas as xarray writes it to Zarr, on the standard and the noleap calendar."""
    root = tmp_path_factory.mktemp("generic")
    for calendar in ("standard", "noleap"):
        data(calendar).to_dataset().to_zarr(root / f"{calendar}.zarr")
    return root


def flow(path: Path, steps: list[dict], source: str = "standard.zarr", **sink) -> Path:
    path.write_text(yaml.safe_dump({
        "name": path.stem, "source": {"path": str(path.parent / source), "variable": "tas"}, "steps": steps,
        "sink": {"path": str(path.parent / "out" / f"{path.stem}.zarr"), **sink},
    }))
    return path


BAD = {  # flow -> (steps, source store, what the message says)
    "how": ([{"op": "resample", "params": {"freq": "MS", "how": "meen"}}], "standard",
            "steps[0].params.how: unknown reduction 'meen'; did you mean 'mean'? (reductions: mean, sum, min, max, std"),
    "weighted_how": ([{"op": "weighted", "params": {"how": "max"}}], "standard",
                     "steps[0].params.how: unknown reduction 'max' (reductions: mean, sum, std, var, quantile)"),
    "q_range": ([{"op": "groupby", "params": {"group": "time.month", "how": "quantile", "q": 1.5}}], "standard",
                "steps[0].params.q: expected a quantile in [0, 1] or a non-empty list of distinct ones, got 1.5"),
    "q_unwanted": ([{"op": "reduce", "params": {"dims": "time", "how": "max", "q": 0.5}}], "standard",
                   "steps[0].params.q: q is the quantile of how: quantile, and how is 'max'"),
    "q_missing": ([{"op": "resample", "params": {"freq": "YS", "how": "quantile"}}], "standard",
                  "steps[0].params.q: required where how is 'quantile'"),
    "freq": ([{"op": "resample", "params": {"freq": "monthly", "how": "max"}}], "standard",
             "steps[0].params.freq: expected a pandas frequency such as 'YS', 'MS' or '1D', got 'monthly'"),
    "freq_calendar": ([{"op": "resample", "params": {"freq": "B", "how": "max"}}], "noleap",
                      "steps[0] (resample): freq: 'B' is not a frequency xarray resamples dimension 'time' of 'tas' by"),
    "group_part": ([{"op": "groupby", "params": {"group": "time.seasons", "how": "std"}}], "standard",
                   "steps[0] (groupby): group: 'time.seasons': dates have no part 'seasons'; did you mean time.season?"),
    "group_name": ([{"op": "groupby", "params": {"group": "height", "how": "std"}}], "standard",
                   "steps[0] (groupby): group: 'height' is neither a coordinate of 'tas' (area, lat, lon, site, time) nor a part of its dates (time.month, time.season"),
    "window": ([{"op": "rolling", "params": {"window": 101, "how": "max"}}], "standard",
               "steps[0] (rolling): window: 101 steps is longer than dimension 'time' of variable 'tas' (100 steps)"),
    "min_periods": ([{"op": "rolling", "params": {"window": 3, "how": "max", "min_periods": 4}}], "standard",
                    "steps[0].params.min_periods: expected at most window (3) valid values, got 4"),
    "factor": ([{"op": "coarsen", "params": {"factors": {"time": 7}, "how": "max"}}], "standard",
               "steps[0] (coarsen): factors.time: 7 does not divide dimension 'time' of 'tas' (100 steps)"),
    "boundary": ([{"op": "coarsen", "params": {"factors": {"time": 7}, "how": "max", "boundary": "cut"}}], "standard",
                 "steps[0].params.boundary: Input should be 'exact', 'trim' or 'pad'"),
    "dims": ([{"op": "reduce", "params": {"dims": ["time", "level"], "how": "sum"}}], "standard",
             "steps[0] (reduce): variable 'tas' has no dimension 'level'"),
    "later_step": ([{"op": "groupby", "params": {"group": "time.month", "how": "mean"}},
                    {"op": "rolling", "params": {"window": 2, "how": "mean"}}], "standard",
                   "steps[1] (rolling): variable 'tas' has no dimension 'time'"),
}


def test_validate_refuses_bad_parameters_naming_the_key(stores, tmp_path):
    (tmp_path / "standard.zarr").symlink_to(stores / "standard.zarr")
    (tmp_path / "noleap.zarr").symlink_to(stores / "noleap.zarr")
    files = [flow(tmp_path / f"{name}.yaml", steps, f"{source}.zarr") for name, (steps, source, _) in BAD.items()]
    r = cli("validate", *files, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for f, (_, _, message) in zip(files, BAD.values()):
        assert f"{f.name}: {message}" in r.stderr, (f.name, r.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["how", "freq_calendar", "window"])
def test_run_refuses_bad_parameters_and_writes_nothing(stores, tmp_path, name):
    steps, source, message = BAD[name]
    (tmp_path / f"{source}.zarr").symlink_to(stores / f"{source}.zarr")
    r = cli("run", flow(tmp_path / f"{name}.yaml", steps, f"{source}.zarr"), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 4, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{source}.zarr", f"{name}.yaml"])


def test_a_flow_of_generic_steps_writes_xarray_results(stores, tmp_path):
    steps = [
        {"op": "groupby", "name": "seasonal_std", "params": {"group": "time.season", "how": "std"}},
        {"op": "resample", "name": "monthly_p90", "input": "source",
         "params": {"freq": "MS", "how": "quantile", "q": 0.9}},
        {"op": "rolling", "name": "smooth", "input": "source", "params": {"window": 7, "how": "median", "center": True}},
        {"op": "reduce", "name": "global_max", "input": "smooth", "params": {"dims": ["lat", "lon"], "how": "max"}},
    ]
    f = flow(tmp_path / "generic.yaml", steps, str(stores / "standard.zarr"),
             variables=["seasonal_std", "monthly_p90"])
    r = cli("validate", f, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "valid flow 'generic' with 4 step(s): groupby -> resample -> rolling -> reduce" in r.stdout
    r = cli("run", f, "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = xr.open_zarr(tmp_path / "out" / "generic.zarr")
    x = xr.open_zarr(stores / "standard.zarr")["tas"].load()
    # one store: the p90's scalar coordinate "quantile" is the dataset's, as xarray merges it
    seasonal_std = out["seasonal_std"].drop_vars("quantile").load()
    xr.testing.assert_allclose(seasonal_std, x.groupby("time.season").std().rename("seasonal_std"))
    xr.testing.assert_allclose(out["monthly_p90"].load(), x.resample(time="MS").quantile(0.9).rename("monthly_p90"))
    assert out["seasonal_std"].attrs["cell_methods"] == "time: standard_deviation (comment: grouped by time.season)"
    assert out["monthly_p90"].attrs["long_name"] == "monthly 90th percentile of air temperature"


def test_the_shipped_flow_runs_end_to_end(tmp_path):
    shipped = REPO / "flows" / "seasonal_extremes.yaml"
    from pipeline.demo import write_demo

    write_demo(tmp_path / "demo.zarr", "1MB", seed=2, resolution=10.0, time_chunk=50)
    r = cli("run", shipped, "--input", tmp_path / "demo.zarr", "--output", tmp_path / "se.zarr", "--no-progress",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = xr.open_zarr(tmp_path / "se.zarr")
    tas = xr.open_zarr(tmp_path / "demo.zarr")["tas"].load()
    # float32 data: the sums of a std, taken by chunks here, differ in their last bits
    np.testing.assert_allclose(out["seasonal_std"].values, tas.groupby("time.season").std().values, rtol=1e-4)
    np.testing.assert_allclose(out["yearly_max"].values, tas.resample(time="YS").max().values, rtol=1e-6)
    assert list(out["seasonal_std"].season.values) == list(tas.groupby("time.season").std().season.values)


def test_pipeline_ops_lists_the_generic_steps(tmp_path):
    r = cli("ops", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listing = {op["name"]: op for op in json.loads(r.stdout)}
    for name in ("resample", "groupby", "rolling", "coarsen", "weighted", "reduce"):
        assert listing[name]["backends"] == ["cpu", "gpu"], name
        assert listing[name]["params"]["how"]["required"], name
    assert listing["resample"]["params"]["how"]["type"].startswith("Literal['mean', 'sum', 'min', 'max', 'std'")
    assert listing["weighted"]["params"]["how"]["type"] == "Literal['mean', 'sum', 'std', 'var', 'quantile']"
    assert listing["coarsen"]["params"]["boundary"] == {"type": "Literal['exact', 'trim', 'pad']", "required": False,
                                                        "default": "exact"}
    r = cli("ops", cwd=tmp_path)
    assert "groupby  [cpu, gpu]" in r.stdout and "A reduction over each group, as x.groupby(group).<how>()" in r.stdout


# --- the GPU --------------------------------------------------------------------------------------------


# every step and reduction, median, first/last, quantile, rolling and weighted included (through
# pipeline.patches: open_dataset's GPU arrays get them, and on_backend too)
@pytest.mark.gpu
@pytest.mark.parametrize("case", [pytest.param(c, id=_id(c)) for c in CASES])
def test_on_the_gpu_results_stay_cupy_and_equal_the_cpu(case):
    op, params, reference = case
    cp = pytest.importorskip("cupy")
    x = data()
    got = getattr(pipeline.ops, op)(on_backend(x.chunk(CHUNKS), "gpu"), **params)
    assert isinstance(got.data._meta, cp.ndarray)  # a graph of CuPy chunks
    computed = got.compute()
    assert isinstance(computed.data, cp.ndarray)  # stays on the device until asked for
    # on the device xarray's own grouped reductions run, flox or not (pipeline.patches,
    # xarray-no-flox-on-device), and where flox is installed xarray's results through it differ
    # from its own in coordinates (a non-index coordinate along the groups is dropped)
    with xr.set_options(use_flox=False):
        want = reference(x)
    xr.testing.assert_allclose(B.to_numpy(computed), want)
