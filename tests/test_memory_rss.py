"""Peak resident memory of real `pipeline run` processes stays under pipeline.cpu.memory-limit,
for every shipped flow, on an input that the limit cannot hold (out of core: the limit is below
twice the input), and the results match xarray's; a limit below what the process itself needs is
refused at planning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from .conftest import requires_gpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")

FLOWS = sorted((Path(__file__).parent.parent / "flows").glob("*.yaml"))
FLOWS = [f for f in FLOWS if "variables:" not in f.read_text().split("steps:")[0]]  # climate flows: one variable
LIMIT = 800 * 10**6
INPUT_BYTES = 410 * 10**6  # over half of LIMIT: two-pass ops read it twice, the quantile gathers it by slabs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """tas alone of the demo dataset, 1-degree grid, blocks of 20 days (5 MB)."""
    from pipeline.demo import demo_dataset
    from pipeline.sinks.zarr import write_zarr

    path = tmp_path_factory.mktemp("rss") / "tas.zarr"
    write_zarr(demo_dataset(INPUT_BYTES // 4 * 10, resolution=1.0, time_chunk=20)[["tas"]], path)
    return path


def _high_water_mark(pid: int) -> int:
    """VmHWM of a live process: the peak resident set of its own address space (getrusage's
    ru_maxrss of a child would also count the parent's, which the child had before its exec)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run(flow: Path, store: Path, out: Path, limit, backend: str = "cpu", block_size: str | None = None) -> tuple[int, int, str]:
    """Exit code, peak RSS in bytes and stderr of ``pipeline run`` in a child process, under
    ``pipeline.<backend>.memory-limit`` (and ``pipeline.<backend>.block-size``, where given)."""
    env = {**os.environ, f"DASK_PIPELINE__{backend.upper()}__MEMORY_LIMIT": str(limit)}
    if block_size:
        env[f"DASK_PIPELINE__{backend.upper()}__BLOCK_SIZE"] = block_size
    cmd = [sys.executable, "-m", "pipeline", "run", str(flow), "--input", str(store), "--output", str(out),
           "--backend", backend, "--no-progress", "--report", str(out) + ".json"]
    log = Path(str(out) + ".stderr")
    peak = 0
    with open(log, "wb") as stderr:  # a file: a full pipe would stall the child
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        while p.poll() is None:
            try:
                peak = max(peak, _high_water_mark(p.pid))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass  # exited between the poll and the read
            time.sleep(0.02)
    return p.returncode, peak, log.read_text()


def _detrend(x):
    fit = x.polyfit("time", 1).polyfit_coefficients
    return x - xr.polyval(x["time"], fit)


def _longest_spells(hot: np.ndarray, year: np.ndarray) -> dict:
    """Longest run of True in ``hot`` (time first) that begins in each year, per point."""
    out = {y: np.zeros(hot.shape[1:], dtype=np.int64) for y in np.unique(year)}
    for idx in np.ndindex(hot.shape[1:]):
        t = 0
        while t < len(hot):
            if hot[(t, *idx)]:
                start = t
                while t < len(hot) and hot[(t, *idx)]:
                    t += 1
                out[year[start]][idx] = max(out[year[start]][idx], t - start)
            else:
                t += 1
    return out


def check_output(name: str, src: xr.DataArray, out: Path):
    """The flow's result against xarray on a slice of a few latitudes (the whole series)."""
    got = xr.open_zarr(out)
    only = next(iter(got.data_vars.values())) if len(got.data_vars) == 1 else None  # named by the flow's sink
    x = src.isel(lat=slice(40, 43)).load()
    if name == "climate_anomaly":  # a global mean: against the whole field
        full = src.load()
        z = (full - full.mean("time")) / full.std("time")
        ref = z.weighted(np.cos(np.deg2rad(full.lat))).mean(("lat", "lon"))
        np.testing.assert_allclose(only.values, ref.values, rtol=1e-4, atol=1e-5)
    elif name == "monthly_anomaly":
        clim = x.groupby("time.month").mean()
        np.testing.assert_allclose(got["climatology"].isel(lat=slice(40, 43)).values, clim.values, rtol=1e-5)
        anom = x.groupby("time.month") - clim
        np.testing.assert_allclose(got["anomaly"].isel(lat=slice(40, 43)).values, anom.values, atol=1e-3)
    elif name == "heatwave_days":
        hot = x > 298.15
        np.testing.assert_array_equal(got["hot_days"].isel(lat=slice(40, 43)).values, hot.resample(time="YS").sum().values)
        spells = _longest_spells(hot.values[:, :, :8], hot["time.year"].values)
        np.testing.assert_array_equal(got["longest_hot_spell"].isel(lat=slice(40, 43), lon=slice(0, 8)).values,
                                      np.stack([spells[y] for y in sorted(spells)]))
    elif name == "detrended_quantiles":  # rows across the bound of two slabs that the quantile gathers
        rows = slice(36, 52)
        ref = _detrend(src.isel(lat=rows).load()).quantile(0.9, "time")
        np.testing.assert_allclose(only.isel(lat=rows).values, ref.values, rtol=1e-5)
    elif name == "seasonal_extremes":
        np.testing.assert_allclose(got["seasonal_std"].isel(lat=slice(40, 43)).values,
                                   x.groupby("time.season").std().values, rtol=1e-4)
        np.testing.assert_allclose(got["yearly_max"].isel(lat=slice(40, 43)).values, x.resample(time="YS").max().values)
    else:
        pytest.fail(f"no reference for the flow {name}: add one here")


@pytest.mark.parametrize("flow", FLOWS, ids=[f.stem for f in FLOWS])
def test_peak_rss_stays_under_the_limit(flow, store, tmp_path):
    import json

    out = tmp_path / "out.zarr"
    assert 2 * INPUT_BYTES > LIMIT  # the limit cannot hold the input between two passes
    rc, peak, err = run(flow, store, out, LIMIT)
    assert rc == 0, err
    plan = json.loads(Path(str(out) + ".json").read_text())["memory"]["plan"]
    assert plan["out_of_core"] and plan["baseline_bytes"] > 0
    # the kernels' temporaries are a few slabs of a few MB a thread, whatever the block
    assert 0 < plan["work_bytes"] < 32 * 2**20
    assert plan["peak_bytes"] <= LIMIT
    assert peak < LIMIT, f"peak RSS {peak / 1e6:.0f} MB over the limit {LIMIT / 1e6:.0f} MB (plan {plan['peak_bytes'] / 1e6:.0f} MB)"
    check_output(flow.stem, xr.open_zarr(store)["tas"], out)


FINE_LIMIT = 1_200_000_000
FINE_STEPS = 150  # 0.25-degree days, 4.15 MB each: 623 MB, over half of FINE_LIMIT


@pytest.fixture(scope="module")
def fine_store(tmp_path_factory):
    """tas alone of the demo dataset on a 0.25-degree grid, one day a chunk (as ERA5 is stored):
    a block of the CPU's 16 MB is 3 days, and a partial of the moments (three float64 grids,
    25 MB) is twice a block."""
    from pipeline.demo import demo_dataset
    from pipeline.sinks.zarr import write_zarr

    path = tmp_path_factory.mktemp("rss-fine") / "tas.zarr"
    ds = demo_dataset(int(1e9 * FINE_STEPS / 96), resolution=0.25, time_chunk=1)[["tas"]]
    assert ds.sizes["time"] == FINE_STEPS
    write_zarr(ds, path)
    return path


@pytest.mark.parametrize("name", ["climate_anomaly", "seasonal_extremes", "monthly_anomaly"])
def test_peak_rss_stays_within_the_plan_where_partials_outweigh_blocks(name, fine_store, tmp_path):
    """Where a reduction's partials are larger than its blocks (a fine grid, few steps a block),
    what its tree holds is in the plan: the partials that wait for their siblings, and each
    thread's merge. Counted as two partials a thread, the standardized anomaly and the seasonal
    standard deviation peaked at twice their plan, over the limit."""
    import json

    flow = next(f for f in FLOWS if f.stem == name)
    out = tmp_path / "out.zarr"
    rc, peak, err = run(flow, fine_store, out, FINE_LIMIT)
    assert rc == 0, err
    plan = json.loads(Path(str(out) + ".json").read_text())["memory"]["plan"]
    assert plan["out_of_core"] and plan["tree_bytes"] > plan["partial_bytes"] > plan["block_bytes"]
    assert peak < plan["peak_bytes"] <= FINE_LIMIT, (peak, plan)
    check_output(name, xr.open_zarr(fine_store)["tas"], out)


GPU_LIMIT = 3_000_000_000


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name", ["climate_anomaly", "seasonal_extremes", "monthly_anomaly"])
def test_device_memory_in_use_stays_within_the_plan(name, fine_store, tmp_path):
    """On the GPU, under ``pipeline.gpu.memory-limit``, the most bytes of CuPy's pool in use at
    once stay within the plan, and the results match xarray's (the pool's cache, which it returns
    when the limit is reached, is not what the plan counts)."""
    import json

    flow = next(f for f in FLOWS if f.stem == name)
    out = tmp_path / "out.zarr"
    rc, _, err = run(flow, fine_store, out, GPU_LIMIT, backend="gpu")
    assert rc == 0, err
    memory = json.loads(Path(str(out) + ".json").read_text())["memory"]
    plan, used = memory["plan"], memory["gpu_pool_used_peak_bytes"]
    assert plan["backend"] == "gpu"
    assert 0 < used <= plan["peak_bytes"] <= GPU_LIMIT, (used, plan)
    check_output(name, xr.open_zarr(fine_store)["tas"], out)


@pytest.fixture(scope="module")
def years_store(tmp_path_factory):
    """tas alone of the demo dataset, 1-degree grid, 8 years of days, one day a chunk."""
    from pipeline.demo import demo_dataset
    from pipeline.sinks.zarr import write_zarr

    path = tmp_path_factory.mktemp("rss-years") / "tas.zarr"
    ds = demo_dataset(int(1e9 * 2920 / 96 / 16), resolution=1.0, time_chunk=1)[["tas"]]
    assert ds.sizes["time"] > 7 * 365
    write_zarr(ds, path)
    return path


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, requires_gpu])])
def test_memory_stays_within_the_plan_where_groups_are_taken(backend, years_store, tmp_path):
    """xarray's seasonal standard deviation without flox takes each season's days (dask's take):
    pieces of blocks wait to be joined, more of them the more years (:func:`graph_gathers`).
    Over 8 years in blocks of 16 MB, the most held (peak RSS; on the GPU, the pool in use)
    stays within the plan, which counts them, and the results match xarray's."""
    import json

    flow = next(f for f in FLOWS if f.stem == "seasonal_extremes")
    out = tmp_path / "out.zarr"
    limit = 1_000_000_000
    rc, peak, err = run(flow, years_store, out, limit, backend=backend, block_size="16MB")
    assert rc == 0, err
    memory = json.loads(Path(str(out) + ".json").read_text())["memory"]
    plan = memory["plan"]
    assert plan["gather_bytes"] > 0 and plan["peak_bytes"] <= limit
    used = memory["gpu_pool_used_peak_bytes"] if backend == "gpu" else peak
    assert 0 < used <= plan["peak_bytes"], (used, plan)
    check_output("seasonal_extremes", xr.open_zarr(years_store)["tas"], out)


def test_a_limit_below_the_process_itself_is_refused_at_planning(store, tmp_path):
    out = tmp_path / "out.zarr"
    rc, _, err = run(FLOWS[0], store, out, "100MB")
    assert rc == 2, err
    assert "the process itself" in err and "pipeline.cpu.memory-limit allows 95.37 MiB" in err and "raise the limit" in err
    assert not out.exists()


def test_out_of_core_quantile_gathers_one_slab_at_a_time(tmp_path):
    """Out of core, the quantile gathers the time axis slab by slab of the grid, each slab from
    its own copy of the input's graph, read again from the store: what is alive at once is about
    one slab (a plain rechunk keeps the whole input), the detrend's coefficients are fitted once,
    and the result is xarray's."""
    import dask
    from dask.callbacks import Callback

    import pipeline
    from pipeline.exec import memory

    rng = np.random.default_rng(0)
    values = (280 + rng.standard_normal((40, 30, 20))).astype("f4")
    values[3, 2:5] = np.nan
    ref_src = xr.DataArray(values, dims=("time", "lat", "lon"), coords={"time": np.arange(40.0)}, name="tas")
    ref_src.to_dataset().chunk({"time": 8}).to_zarr(tmp_path / "tas.zarr")
    src = xr.open_zarr(tmp_path / "tas.zarr")["tas"]
    live, runs = [], []

    class Alive(Callback):
        def _posttask(self, key, result, dsk, state, id):
            runs.append(key[0] if isinstance(key, tuple) else key)
            live.append(sum(v.nbytes for v in state["cache"].values() if isinstance(v, np.ndarray) and v.base is None))

    limit = 100_000  # the input (96 kB) is over half of it: out of core
    with dask.config.set({"pipeline.cpu.memory-limit": limit, "scheduler": "threads", "num_workers": 1}):
        out = pipeline.ops.quantile(pipeline.ops.detrend(src, "time"), 0.9, "time")
        slab = memory.graph_held_bytes(out.data)
        with Alive():
            got = out.compute()
    assert 0 < slab <= limit / 16 < values.nbytes
    # a slab's pieces and its gathered chunk, and what lives throughout: the coefficients and the result
    small = 2 * 8 * 30 * 20 + 4 * 30 * 20
    assert max(live) <= 2 * slab + small < values.nbytes / 2, (max(live), slab)
    assert sum(str(k).startswith("pipeline-polyfit-aggregate") for k in runs) == 1
    ref = _detrend(ref_src).quantile(0.9, "time")
    np.testing.assert_allclose(got.values, ref.values, rtol=1e-6)
