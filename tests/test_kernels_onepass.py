"""The CUDA C moments and detrend kernels: their twins (CPU, every run) against the reference
formulas, and on a GPU the kernels against their twins, bit for bit (their sources are compiled
with the others' in tests/test_kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import moments, trend

from .conftest import requires_gpu


def sample(nt, npts, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((nt, npts)) * 4 + 285 + np.linspace(0, 3, nt)[:, None]).astype(dtype)
    x[rng.random(x.shape) < 0.15] = np.nan
    x[:, 3] = np.nan  # no valid value
    x[2:, 5] = np.nan  # two valid values
    x[1:, 6] = np.nan  # one
    return x


# --- moments --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tile", [131, 64, 40, 7, 1])
def test_moments_twin_matches_two_pass_formula(tile):
    x = sample(131, 77)
    ref = moments.moments_formula(x, 0)
    n, mean, m2 = moments.moments_twin(x, tile=tile)
    np.testing.assert_array_equal(n, ref["n"][0])
    np.testing.assert_allclose(mean, ref["mean"][0], rtol=1e-13)
    np.testing.assert_allclose(m2, ref["m2"][0], rtol=1e-10, atol=1e-9)
    assert n[3] == 0 and mean[3] == 0 and m2[3] == 0
    assert n[6] == 1 and m2[6] == 0


def test_moments_plan_tiles_only_when_points_are_few():
    assert moments.plan(730, 721 * 1440, sms=132) == 730
    tile = moments.plan(730, 3000, sms=132)
    assert 64 <= tile < 730
    assert moments.plan(50, 10, sms=132) == 50  # never under 64 steps a tile


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,tile", [((131, 77), None), ((131, 77), 40), ((730, 1037), None), ((5, 7), None), ((300, 4100), 64)])
def test_moments_kernel_equals_its_twin(dtype, shape, tile):
    import cupy

    x = sample(*shape, dtype=dtype)
    chosen = moments.plan(*shape, sms=cupy.cuda.Device().attributes["MultiProcessorCount"]) if tile is None else tile
    got = moments.moments_raw(cupy.asarray(x), tile=tile)
    want = moments.moments_twin(x, tile=chosen)
    for g, w in zip(got, want):
        assert isinstance(g, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(g), w)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("threads,unroll", [(128, 4), (256, 2), (128, 8)])
def test_moments_kernel_variants_agree(threads, unroll):
    import cupy

    x = cupy.asarray(sample(97, 3001))
    ref = moments.moments_raw(x, tile=97)
    got = moments.moments_raw(x, tile=97, threads=threads, unroll=unroll)
    for g, w in zip(got, ref):
        np.testing.assert_array_equal(cupy.asnumpy(g), cupy.asnumpy(w))


# --- detrend --------------------------------------------------------------------------------------


@pytest.mark.parametrize("deg", [0, 1, 2, 3])
@pytest.mark.parametrize("points,cluster", [(32, 1), (16, 1), (8, 1), (64, 3), (16, 5), (32, 8)])
def test_detrend_twin_matches_formulas(deg, points, cluster):
    x = sample(97, 45, seed=2)
    u = np.linspace(-1, 1, 97)
    ref = trend.detrend_block_cpu(x, u[:, None], axis=0, deg=deg, out_dtype=np.float64)
    got = trend.detrend_tile_twin(x, u, deg, np.float64, points=points, cluster=cluster)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    # the normal equations of degree 3 lose a few digits; still far inside float32 rounding of 285
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 if deg < 3 else 1e-4, equal_nan=True)
    assert np.isnan(got[:, 6]).all() == (deg >= 1)
    assert np.isnan(got[:, 5]).all() == (deg >= 2)


def test_detrend_plan():
    # one block a tile, rows of 128 bytes, where the tile and its coordinates fit 100 KB
    assert trend.plan(730, 4) == (32, 1)
    assert trend.plan(730, 8) == (16, 1)
    assert trend.plan(100, 4) == (32, 1)
    assert trend.plan(1000, 4) == (16, 1)  # rows of 64 bytes
    # else rows of 128 bytes where the tile fits 8 blocks of 40 KB, else 64
    assert trend.plan(1460, 4) == (32, 5)
    assert trend.plan(4380, 4) == (16, 7)
    assert trend.plan(6000, 4) is None  # the Numba kernel, reading twice
    # before compute capability 9.0: one block a tile of up to 100 KB, rows of 64 or 32 bytes
    assert trend.plan(730, 4, clusters=False) == (16, 1)
    assert trend.plan(730, 8, clusters=False) == (8, 1)
    assert trend.plan(2500, 4, clusters=False) == (8, 1)
    assert trend.plan(3200, 4, clusters=False) is None
    assert trend.plan(730, 2, dtype_ok=trend.supported(np.int16)) is None
    assert [trend.slab(97, c) for c in (1, 5, 8)] == [97, 20, 13]
    with pytest.raises(ValueError, match="both points and cluster"):
        trend.detrend_tile(np.zeros((10, 4), "f4"), np.zeros(10), np.zeros((10, 4), "f4"), 1, points=16)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("in_t,out_t", [(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)])
@pytest.mark.parametrize("deg", [0, 1, 2, 3])
@pytest.mark.parametrize("points,threads,cluster", [(32, 256, 1), (16, 256, 1), (8, 64, 1), (64, 256, 5), (32, 256, 8),
                                                    (16, 128, 2)])
def test_detrend_kernel_equals_its_twin(in_t, out_t, deg, points, threads, cluster):
    import cupy

    nt, npts = 97, 101  # a partial tile at the end; rows of 101 values: no 16-byte copies
    x = sample(nt, npts, seed=3, dtype=in_t)
    u = np.linspace(-1, 1, nt)
    for cut in (npts, 96):  # 96 points: rows of whole 16-byte pieces
        want = trend.detrend_tile_twin(x[:, :cut], u, deg, out_t, points=points, threads=threads, cluster=cluster)
        xg = cupy.asarray(x[:, :cut])
        out = cupy.empty(xg.shape, dtype=out_t)
        assert trend.detrend_tile(xg, cupy.asarray(u), out, deg, points=points, threads=threads, cluster=cluster)
        np.testing.assert_array_equal(cupy.asnumpy(out), want)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("nt,cluster", [(5, 4), (3, 8), (41, 8)])
def test_detrend_kernel_slabs_short_or_empty(nt, cluster):
    """Series shorter than the cluster: the last blocks of a tile hold few steps, or none."""
    import cupy

    x = sample(nt, 300, seed=7)
    u = np.linspace(-1, 1, nt)
    want = trend.detrend_tile_twin(x, u, 1, np.float32, points=64, cluster=cluster)
    out = cupy.empty(x.shape, dtype=np.float32)
    assert trend.detrend_tile(cupy.asarray(x), cupy.asarray(u), out, 1, points=64, cluster=cluster)
    np.testing.assert_array_equal(cupy.asnumpy(out), want)


@pytest.mark.gpu
@requires_gpu
def test_detrend_kernel_many_tiles():
    """Thousands of tiles, the last partial; points with and without NaNs side by side."""
    import cupy

    nt, npts = 41, 16 * 132 * 8 * 3 + 5
    x = sample(nt, npts, seed=6)
    u = np.linspace(-1, 1, nt)
    for points, cluster in ((32, 1), (16, 1), (64, 3)):
        want = trend.detrend_tile_twin(x, u, 1, np.float32, points=points, cluster=cluster)
        out = cupy.empty(x.shape, dtype=np.float32)
        assert trend.detrend_tile(cupy.asarray(x), cupy.asarray(u), out, 1, points=points, cluster=cluster)
        np.testing.assert_array_equal(cupy.asnumpy(out), want)


@pytest.mark.gpu
@requires_gpu
def test_detrend_block_gpu_takes_the_tile_kernel_or_falls_back():
    import cupy

    u = np.linspace(-1, 1, 200)[:, None, None]
    x = sample(200, 60, seed=4).reshape(200, 6, 10)
    for block in (x, np.moveaxis(x, 0, 2)):  # axis 0, and the time axis last
        axis = 0 if block is x else 2
        uu = np.moveaxis(u, 0, axis)
        got = trend.detrend_block_gpu(cupy.asarray(block), cupy.asarray(uu), axis=axis, deg=1, out_dtype=np.float32)
        assert isinstance(got, cupy.ndarray)
        ref = trend.detrend_block_cpu(block, uu, axis=axis, deg=1, out_dtype=np.float32)
        np.testing.assert_allclose(cupy.asnumpy(got), ref, rtol=1e-6, atol=1e-5, equal_nan=True)
    long = sample(6000, 40, seed=5)  # too long for a tile: the Numba kernel
    ul = np.linspace(-1, 1, 6000)[:, None]
    got = trend.detrend_block_gpu(cupy.asarray(long), cupy.asarray(ul), axis=0, deg=1, out_dtype=np.float32)
    np.testing.assert_allclose(cupy.asnumpy(got), trend.detrend_block_cpu(long, ul, axis=0, deg=1, out_dtype=np.float32),
                               rtol=1e-6, atol=1e-5, equal_nan=True)
