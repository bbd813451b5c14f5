"""The longest spell's scan across blocks keeps little: a NumPy reference of xclim's longest_run
on awkward chunkings, the bytes its graph declares held (against a whole partial a block, as it
declared before), the plan and a flow run under a budget those would have exceeded, and which
tasks read the blocks' partials."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipeline
from pipeline.errors import InputError
from pipeline.exec import memory

FLOW = Path(__file__).resolve().parent.parent / "flows" / "heatwave_days.yaml"
SPELLS = "pipeline-longest-spell"


def longest_runs(hot: np.ndarray, bins: np.ndarray, nbins: int, cut: bool) -> np.ndarray:
    """Longest run of True along the first axis of ``hot`` (steps, points) per bin: a run counts
    whole for the bin of its first step (xclim's ``run_length.longest_run``), or, ``cut``, each
    bin counts its own steps of it (``resample_before_rl``)."""
    out = np.zeros((nbins, hot.shape[1]), dtype=np.int64)
    for p in range(hot.shape[1]):
        t = 0
        while t < len(hot):
            if not hot[t, p]:
                t += 1
                continue
            start = t
            while t < len(hot) and hot[t, p] and not (cut and bins[t] != bins[start]):
                t += 1
            out[bins[start], p] = max(out[bins[start], p], t - start)
    return out


def periods(time: pd.DatetimeIndex, freq: str) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """The period of each date (0 for the first) and the periods' first days, for YS and MS."""
    months = time.year * 12 + time.month - 1 if freq == "MS" else time.year * 12
    step = 1 if freq == "MS" else 12
    bins = (months - months[0]) // step
    first = pd.Timestamp(year=time[0].year, month=time[0].month if freq == "MS" else 1, day=1)
    return np.asarray(bins), pd.date_range(first, periods=int(bins[-1]) + 1, freq=freq)


def series(nt=800, start="1999-11-20", seed=0) -> xr.DataArray:
    """Noise around the threshold 0.3 with NaNs (runs of a few steps), and points whose spells
    are known: always above, always below, all NaN, one spell across the new year and many
    blocks, one longer than a year, one broken by a NaN."""
    rng = np.random.default_rng(seed)
    time = pd.date_range(start, periods=nt, freq="D")
    x = rng.standard_normal((nt, 3, 4)).astype(np.float32)
    x[rng.random(x.shape) < 0.08] = np.nan
    day = {d: time.get_loc(pd.Timestamp(d)) for d in ("1999-12-20", "2000-02-11", "2000-06-01", "2001-09-01",
                                                       "2001-03-05", "2001-03-30", "2001-03-17")}
    x[:, 0, 0] = 5.0
    x[:, 0, 1] = -5.0
    x[:, 0, 2] = np.nan
    x[:, 0, 3] = -5.0
    x[day["1999-12-20"]:day["2000-02-11"], 0, 3] = 5.0
    x[day["2000-06-01"]:day["2001-09-01"], 1, 0] = 5.0
    x[day["2001-03-05"] - 1:day["2001-03-30"] + 1, 1, 1] = -5.0
    x[day["2001-03-05"]:day["2001-03-30"], 1, 1] = 5.0
    x[day["2001-03-17"], 1, 1] = np.nan
    return xr.DataArray(x, dims=("time", "lat", "lon"), coords={"time": time}, name="tas", attrs={"units": "K"})


def odd_chunks(nt: int) -> tuple[int, ...]:
    """Sizes 7, 13, 1, 5, 40, 2, ... in turn, summing to ``nt``."""
    sizes, cycle = [], [7, 13, 1, 5, 40, 2, 1, 29]
    while sum(sizes) < nt:
        sizes.append(min(cycle[len(sizes) % len(cycle)], nt - sum(sizes)))
    return tuple(sizes)


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "resample_before_rl"])
@pytest.mark.parametrize("freq", ["YS", "MS"])
@pytest.mark.parametrize("chunks", [{"time": 7}, {"time": 13}, {"time": 1}, {"time": odd_chunks(800)},
                                    {"time": 13, "lat": 2, "lon": 3}, {"time": -1}],
                         ids=["7", "13", "1", "odd", "13-tiles", "whole"])
def test_max_spell_length_against_numpy(chunks, freq, cut):
    x = series()
    got = pipeline.ops.max_spell_length(x.chunk(chunks), threshold=0.3, freq=freq, resample_before_rl=cut)
    bins, labels = periods(x.indexes["time"], freq)
    hot = (x.values > 0.3).reshape(x.shape[0], -1)  # NaN is not above
    expected = longest_runs(hot, bins, len(labels), cut).reshape(len(labels), *x.shape[1:])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.time.values, labels.values)
    np.testing.assert_array_equal(got.values, expected)
    assert not got.values[:, 0, 1:3].any()  # below, and NaN
    if freq == "YS":  # the known spells: whole for the year where they begin, or each year's part
        days = np.bincount(bins)
        assert got.values[:, 0, 0].tolist() == (days.tolist() if cut else [800, 0, 0, 0])
        assert got.values[:, 0, 3].tolist() == ([12, 41, 0, 0] if cut else [53, 0, 0, 0])
        assert got.values[1, 1, 0] == (214 if cut else 457)
        assert got.values[2, 1, 1] == 12  # 24 days but for a NaN


def _lazy(shape, chunks):
    time = pd.date_range("1990-01-01", periods=shape[0], freq="D")  # the demo's dates
    return xr.DataArray(da.zeros(shape, chunks=chunks, dtype="f4"), dims=("time", "lat", "lon"),
                        coords={"time": time}, name="tas", attrs={"units": "K"})


@pytest.mark.parametrize("chunks", [(36, 721, 1440), (36, 361, 1440)], ids=["grid", "two-tiles"])
def test_held_bytes_are_the_extracts_and_the_merged_partials_that_wait(chunks):
    """6 GB of float32 tas, 1460 days in blocks of 36 days: 41 blocks, a year of 10 or 11 of
    them. The scan, from the last block back to the one after 1990's last, keeps each block's
    leading run (int32 a point); the outputs keep the open run of the block before their year
    (int32), and the merged partials of the years that wait for the scan (all but the last: a
    row of their year and one of state, 16 bytes a value) with their states. Not every block's
    partial."""
    x = _lazy((1460, 721, 1440), chunks)
    out = pipeline.ops.max_spell_length(x, threshold="25 degC", freq="YS").data
    points, nblocks = 721 * 1440, 41
    partial = 3 * chunks[1] * 1440 * 16  # 36 days touch two years at most, and a row of state
    assert memory.graph_partial_bytes(out) == partial
    tiles = -(-721 // chunks[1])
    before = nblocks * tiles * partial  # what it declared held: every block's whole partial
    years = 4  # begin in blocks 0, 10, 20 and 30; the last ends in the last block: it waits for nothing
    scanned = nblocks - (364 // 36 + 1)
    expected = points * (scanned * 4 + (years - 1) * 4 + (years - 1) * 2 * 16 + years * 4)
    assert memory.graph_held_bytes(out) == expected
    assert expected < before / 8
    if chunks[1] == 721:
        assert (before, expected) == (2_043_256_320, 253_330_560)


def test_a_budget_that_the_whole_partials_exceeded_is_planned(monkeypatch):
    """The heatwave run that the GPU's plan refused, on the host's rules: 1.5 GB for 6 GB of
    input, one thread, no process baseline (the device has none). Every block's whole partial
    (1.90 GiB) did not fit; what the scan keeps now (242 MiB) does."""
    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)
    x = _lazy((1460, 721, 1440), (36, 721, 1440))
    hot = pipeline.ops.count_above(x, threshold="25 degC", freq="YS").data
    spell = pipeline.ops.max_spell_length(x, threshold="25 degC", freq="YS").data
    with dask.config.set({"pipeline.cpu.memory-limit": "1.5GB", "num_workers": 1}):
        plan = memory.plan(x.data, hot, spell, backend="cpu")
        assert plan.out_of_core and plan.threads == 1
        assert plan.held_bytes == memory.graph_held_bytes(spell) == 253_330_560
        memory.check(plan)
        whole_partials = 41 * memory.graph_partial_bytes(spell)
        with pytest.raises(InputError, match="pipeline.cpu.memory-limit allows"):
            memory.check(dataclasses.replace(plan, held_bytes=whole_partials))


def _kind(key, result: str) -> str:
    """What a task of the spells' graph of ``result`` does: "chunk" (a block's partial), "carried",
    "continuation", "before", "merged" (the scan's tasks, named after the result), or "other"."""
    if key[0].startswith(f"{SPELLS}-chunk-"):
        return "chunk"
    return key[0][len(result) + 1:] if key[0].startswith(f"{result}-") else "other"


def test_only_the_extracts_and_the_merges_read_the_blocks_partials():
    """Each block's partial is read by the extract of what the scan carries, by the merge of each
    output's span, and (for the block before an output) by the extract of what ``close`` reads:
    never by the continuation or the output tasks, which would keep it alive until the scan
    came back."""
    from dask.core import get_deps
    from dask.local import get_sync

    x = _lazy((400, 4, 6), (7, 2, 6))
    for freq in ("YS", "MS"):
        out = pipeline.ops.max_spell_length(x, threshold=0.5, freq=freq).data
        graph = dict(out.__dask_graph__())
        deps, dependents = get_deps(graph)
        kind = functools.partial(_kind, result=out.name)
        parts = [k for k in graph if kind(k) == "chunk"]
        assert len(parts) == 58 * 2
        for k in parts:
            readers = {kind(d) for d in dependents[k]}
            assert readers <= {"carried", "before", "merged"} and "merged" in readers
        # the scan reads the blocks it runs over, from the first that an output needs a state from
        scanned = {k[1:] for k in graph if kind(k) == "continuation"}
        assert {k[1:] for k in parts if "carried" in {kind(d) for d in dependents[k]}} == scanned
        last_day = 364 if freq == "YS" else 30  # of the first year, or month
        assert min(i for i, _, _ in scanned) == last_day // 7 + 1 and len(scanned) > 2
        for k in graph:
            if kind(k) == "continuation":
                assert {kind(d) for d in deps[k]} <= {"carried", "continuation"}
            elif k[0] == out.name:
                assert {kind(d) for d in deps[k]} <= {"merged", "before", "continuation"}
        # the extracts are a value a point, copied out of the partial's arrays
        for name, fields in (("carried", ("lead", "length")), ("before", ("tail",))):
            extract = get_sync(graph, next(k for k in graph if kind(k) == name))
            assert sorted(extract) == sorted(fields)
            assert extract[fields[0]].shape == (12,) and extract[fields[0]].base is None


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """tas of the demo dataset on a 4-degree grid, 1100 days (1990 to 1993) in stored chunks of 7."""
    from pipeline.demo import demo_dataset
    from pipeline.sinks.zarr import write_zarr

    path = tmp_path_factory.mktemp("spells") / "tas.zarr"
    npts = 46 * 90
    write_zarr(demo_dataset(1100 * 10 * npts, resolution=4.0, time_chunk=7)[["tas"]], path)
    return path


def test_heatwave_flow_under_a_budget_that_the_whole_partials_exceeded(store, tmp_path, monkeypatch):
    """heatwave_days on blocks of 7 days under a budget below what every block's whole partial
    was declared to hold: planned, run, and the same output as without the budget (and as NumPy's
    count and longest runs)."""
    from pipeline.flows import run_flow

    monkeypatch.setattr(memory, "process_baseline", lambda backend, worker=None: 0)
    src = xr.open_zarr(store)["tas"]
    nblocks, points = src.data.numblocks[0], src.shape[1] * src.shape[2]
    assert nblocks == 158
    settings = {"pipeline.cpu.block-size": None, "num_workers": 1}
    with dask.config.set(settings):
        free = run_flow(FLOW, backend="cpu", source=store, output=str(tmp_path / "free.zarr"))["memory"]["plan"]
        spell = pipeline.ops.max_spell_length(src, threshold="25 degC", freq="YS").data
        held = memory.graph_held_bytes(spell)
        whole_partials = nblocks * memory.graph_partial_bytes(spell)
        assert held < whole_partials / 8
        budget = held + free["thread_bytes"] + (whole_partials - held) // 2
        assert whole_partials > budget and src.nbytes > budget / 2  # out of core
        with dask.config.set({"pipeline.cpu.memory-limit": budget}):
            plan = run_flow(FLOW, backend="cpu", source=store, output=str(tmp_path / "tight.zarr"))["memory"]["plan"]
    assert plan["out_of_core"] and plan["held_bytes"] == held and plan["peak_bytes"] <= budget
    years = len(set(src.indexes["time"].year))  # 4: the last ends in the last block, and waits for nothing
    scanned = nblocks - (364 // 7 + 1)  # from the block after 1990's last
    assert held == points * (scanned * 4 + (years - 1) * 4 + (years - 1) * 2 * 16 + years * 4)
    free_out, tight = xr.open_zarr(tmp_path / "free.zarr").load(), xr.open_zarr(tmp_path / "tight.zarr").load()
    for v in ("hot_days", "longest_hot_spell"):
        np.testing.assert_array_equal(tight[v].values, free_out[v].values)
    x = src.values
    bins, labels = periods(src.indexes["time"], "YS")
    hot = (x > 298.15).reshape(len(x), -1)
    spells = longest_runs(hot, bins, len(labels), cut=False).reshape(len(labels), *x.shape[1:])
    assert spells.max() > 7  # spells across blocks
    np.testing.assert_array_equal(tight["longest_hot_spell"].values, spells)
    counts = np.stack([hot[bins == b].sum(axis=0) for b in range(len(labels))]).reshape(spells.shape)
    np.testing.assert_array_equal(tight["hot_days"].values, counts)


@pytest.mark.parametrize("op", ["count_above", "max_spell_length"])
def test_each_block_partial_is_merged_into_its_output_as_it_is_made(op):
    """An output's merges are a chain in axis order, each step reading one block's partial and the
    step before: no task reads the partials of several blocks, which would hold them all until
    the output's last block is made."""
    from dask.core import get_deps

    x = _lazy((400, 4, 6), (7, 2, 6))
    out = getattr(pipeline.ops, op)(x, threshold=0.5, freq="YS").data
    graph = dict(out.__dask_graph__())
    deps, _ = get_deps(graph)
    kind = functools.partial(_kind, result=out.name)
    steps = [k for k in graph if kind(k) == "merged"]
    assert steps
    for k in steps:
        read = [d for d in deps[k] if "-chunk-" in d[0]]  # the blocks' partials
        earlier = [d for d in deps[k] if kind(d) == "merged"]
        assert len(read) == 1 and len(earlier) == (k[-1] > 0)
        if earlier:
            assert earlier[0][:-1] == k[:-1] and earlier[0][-1] == k[-1] - 1
    for k in graph:
        if "-chunk-" not in k[0] and kind(k) not in ("merged", "carried", "before"):
            assert not any("-chunk-" in d[0] for d in deps[k]), k
