"""pairwise_distance and sample_distance against sgkit 0.10's ``pairwise_distance``
(``sgkit_distance.npz``, made by ``tests/fixtures/genomics/sgkit_distance.py``): samples' alternate
allele counts with missing calls, several chunkings; GPU against CPU where a GPU is present."""

from __future__ import annotations

import importlib

import dask.array as da
import numpy as np
import pytest

import pipeline.genomics as sg
from pipeline import backend as B
from pipeline import kernels
from pipeline.errors import InputError

from .conftest import raise_if_dask_computes, requires_gpu
from .genomics_data import dataset, sgkit

REF = sgkit("distance")
COUNTS = sgkit("pca")["bi_alt"].T  # (samples, variants), -1 for missing calls: sgkit's counts
DISTANCE = importlib.import_module("pipeline.ops.genomics.distance")
METRICS = ["euclidean", "correlation"]

# (rows, columns) chunks of the (samples, variants) matrix: boundaries inside the data
CHUNKINGS = [(-1, 100), (25, 37), (-1, 1000), (25, 100)]


def tolerance(expected: np.ndarray) -> float:
    """Absolute tolerance: a few float32 roundings of the largest distance. sgkit's float32 path
    computes in float32 (exact sums of integer counts, then a few rounded operations, and a
    correlation distance to itself doubled: 2.4e-7 at most where ours is 0); ours are float64
    rounded once to the output type."""
    return 4 * np.finfo(np.float32).eps * max(1.0, np.nanmax(np.abs(expected)))


def assert_distance(actual, expected, atol=None):
    a = B.to_numpy(actual)
    assert a.shape == expected.shape and a.dtype == expected.dtype, (a.shape, a.dtype, expected.dtype)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(expected), err_msg="NaN pattern differs")
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=tolerance(expected) if atol is None else atol,
                               equal_nan=True)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_pairwise_distance_missing_as_nan(metric, chunks):
    """Counts as float64 with NaN for missing calls: float64 results, equal to sgkit's within
    float64 rounding (every sum of counts is exact)."""
    x = da.from_array(np.where(COUNTS < 0, np.nan, COUNTS), chunks=chunks)
    with raise_if_dask_computes():
        d = sg.pairwise_distance(x, metric)
    assert_distance(d.compute(), REF[f"{metric}_nan"], atol=1e-12)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("chunks", CHUNKINGS[:2])
@pytest.mark.parametrize("split_every", [None, 2])
def test_pairwise_distance_counts(metric, chunks, split_every):
    """int16 counts with -1 for missing calls: float32 results, as sgkit's."""
    d = sg.pairwise_distance(da.from_array(COUNTS, chunks=chunks), metric, split_every=split_every)
    assert d.dtype == np.float32
    assert_distance(d.compute(), REF[f"{metric}_int16"])


@pytest.mark.parametrize("metric", METRICS)
def test_pairwise_distance_edge_rows(metric):
    """Negative values missing, NaN, a constant row (correlation NaN), rows with one value and
    with none (euclidean 0 over no common column), a NumPy input."""
    assert_distance(sg.pairwise_distance(REF["small"], metric).compute(), REF[f"small_{metric}"], atol=1e-12)


def test_result_types_are_sgkits():
    probe = np.array([[1, 0, 2], [0, 1, 1]])
    for dtype, expected in zip(REF["dtypes_in"], REF["dtypes_out"]):
        assert DISTANCE.result_dtype(dtype) == np.dtype(str(expected)), dtype
        assert sg.pairwise_distance(probe.astype(str(dtype))).compute().dtype == np.dtype(str(expected)), dtype


def test_pairwise_distance_in_tiles(monkeypatch):
    """Rows in 4 tiles of 15: only the 10 tiles on and above the diagonal are computed (for each
    of the 7 column chunks), and the result is the same."""
    monkeypatch.setattr(DISTANCE, "TILE", {"euclidean": 16, "correlation": 16})
    for metric in METRICS:
        x = da.from_array(np.where(COUNTS < 0, np.nan, COUNTS), chunks=(-1, 100))
        d = sg.pairwise_distance(x, metric)
        assert d.chunks == ((15,) * 4, (15,) * 4)
        with kernels.recording() as calls:
            out = d.compute()
        assert calls[("distance_sums", "cpu")] == 10 * 7
        assert calls[("distance_from_sums", "cpu")] == 10
        assert_distance(out, REF[f"{metric}_nan"], atol=1e-12)


@pytest.mark.parametrize(
    "args,match",
    [
        ((np.zeros((2, 3, 4)),), "2-dimensional"),
        ((np.zeros((3, 4)), "cityblock"), "metric"),
        ((np.zeros((3, 4)), "euclidean", None, "tpu"), "device"),
        ((np.array([["a", "b"]]),), "numbers"),
    ],
)
def test_pairwise_distance_bad_input(args, match):
    with pytest.raises(InputError, match=match):
        sg.pairwise_distance(*args)


# --- the Dataset form ------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("chunks", [(100, -1), (37, 25)])
def test_sample_distance(metric, chunks):
    """Counted from call_genotype (int16, -1 for missing calls) and compared between samples."""
    ds = dataset("bi", {"variants": chunks[0], "samples": chunks[1]})
    with raise_if_dask_computes():
        out = sg.sample_distance(ds, metric)
    d = out["stat_sample_distance"]
    assert d.dims == ("samples_0", "samples_1")
    assert "call_alternate_allele_count" in out and "call_genotype" in out
    assert_distance(d.values, REF[f"{metric}_int16"])


def test_sample_distance_of_a_variable():
    ds = dataset("bi")
    ac = da.from_array(np.where(COUNTS.T < 0, np.nan, COUNTS.T), chunks=(37, -1))
    ds = ds.assign(call_dosage=(("variants", "samples"), ac))
    out = sg.sample_distance(ds, "correlation", variable="call_dosage", merge=False)
    assert list(out.data_vars) == ["stat_sample_distance"]
    assert_distance(out["stat_sample_distance"].values, REF["correlation_nan"], atol=1e-12)
    with pytest.raises(InputError, match="no variable 'call_ds'"):
        sg.sample_distance(ds, variable="call_ds")


def test_sample_distance_runs_the_kernels_it_declares():
    with kernels.recording() as calls:
        sg.sample_distance(dataset("bi")).compute()
    assert {b for _, b in calls} == {"cpu"}
    assert {n for n, _ in calls} == set(sg.sample_distance.op.kernels["cpu"])


# --- GPU ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("metric", METRICS)
def test_pairwise_distance_gpu_equals_cpu(metric, monkeypatch):
    """On CuPy blocks (and in tiles, so that the triangle's mirroring runs on the device): equal
    to the CPU's within float64 rounding, and to sgkit's."""
    monkeypatch.setattr(DISTANCE, "TILE", {"euclidean": 16, "correlation": 16})
    x = da.from_array(np.where(COUNTS < 0, np.nan, COUNTS), chunks=(25, 37))
    gpu = sg.pairwise_distance(B.to_backend(x, "gpu"), metric)
    assert B.backend_of(gpu) == "gpu"
    cpu = sg.pairwise_distance(x, metric).compute()
    assert_distance(gpu.compute(), cpu, atol=1e-12)
    assert_distance(sg.pairwise_distance(x, metric, device="gpu").compute(), REF[f"{metric}_nan"], atol=1e-12)
    out = sg.sample_distance(dataset("bi", {"variants": 37}, "gpu"), metric)["stat_sample_distance"]
    assert B.backend_of(out.data) == "gpu"
    assert_distance(out.data.compute(), REF[f"{metric}_int16"])
