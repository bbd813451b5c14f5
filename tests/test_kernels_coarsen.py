"""The coarsening kernel: its grouping of a block's axes (CPU, every run) and the CUDA C kernel
against the CPU kernel (GPU), on views, NaNs, integers and windows of every size."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import coarsen

from .conftest import requires_gpu


def test_axis_groups_merge_only_what_strides_allow():
    # (time, lat, lon) coarsened over lat and lon: time stays one axis of its own
    assert coarsen.axis_groups((730, 720, 1440), (720 * 1440, 1440, 1), {1: 4, 2: 4}) == [
        (1, 1, 0), (730, 1, 720 * 1440), (720, 4, 1440), (1440, 4, 1)]
    # two leading axes not coarsened, contiguous: one axis
    assert coarsen.axis_groups((4, 5, 6), (30, 6, 1), {2: 3}) == [(1, 1, 0), (1, 1, 0), (20, 1, 6), (6, 3, 1)]
    # a slice along axis 1: its stride no longer follows from axis 0's, so no merge
    assert coarsen.axis_groups((4, 4, 6), (30, 6, 1), {2: 3}) == [(1, 1, 0), (4, 1, 30), (4, 1, 6), (6, 3, 1)]
    # axes of length 1 are dropped
    assert coarsen.axis_groups((1, 8, 1), (8, 1, 1), {1: 2}) == [(1, 1, 0)] * 3 + [(8, 2, 1)]
    # five groups: more than the kernel takes
    assert coarsen.axis_groups((2, 3, 2, 3, 2), (36, 12, 6, 2, 1), {0: 2, 2: 2, 4: 2}) is None


def float_dtype(dtype) -> np.dtype:
    """The op's output type: float32 stays float32, the rest become float64."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind == "f" and dtype.itemsize >= 4 else np.dtype(np.float64)


def blocks(xp=np, seed=0):
    """(block, factors) pairs: contiguous and sliced views, reversed axes, NaNs, integers, windows
    from 1 to over 64 values, lengths that are multiples of their factors (as the op makes them)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((26, 13, 36)) * 5 + 280
    base[rng.random(base.shape) < 0.2] = np.nan
    base[:, :3, :6] = np.nan  # windows with no valid value
    out = []
    for dtype in (np.float32, np.float64):
        x = xp.asarray(base.astype(dtype))
        out += [
            (x[:, :12, :], {1: 4, 2: 4}),
            (x[:24, :12, :], {0: 3, 1: 2, 2: 2}),
            (x[:, :12, :][:, ::-1, :], {1: 3}),  # a reversed axis: negative stride
            (x[:24], {0: 24}),
            (x[:24, :12, :], {0: 8, 2: 12}),  # 96 values a window: added as loaded
            (x[:, 1:13, 2:34], {2: 8}),
            (x, {0: 1}),
            (x[:, :12, :].transpose(2, 1, 0)[:, :, :24], {0: 2, 2: 4}),
        ]
    xi = xp.asarray(np.nan_to_num(base, nan=0).astype(np.int16))
    out += [(xi[:, :12, :], {1: 4, 2: 4}), (xi[:24], {0: 6})]
    return out


@pytest.mark.parametrize("case", range(18))
def test_coarsen_groups_cpu_matches_the_formulas(case):
    block, factors = blocks()[case]
    out_dtype = float_dtype(block.dtype)
    got = coarsen.coarsen_groups_cpu(block, factors, out_dtype)
    expected = coarsen.coarsen_mean_cpu(block, factors, out_dtype)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6 if out_dtype == np.float32 else 1e-12, equal_nan=True)


@pytest.mark.gpu
@requires_gpu
def test_coarsen_kernel_matches_the_cpu_kernel():
    import cupy

    cpu_cases = blocks()
    for (gb, factors), (cb, _) in zip(blocks(cupy), cpu_cases, strict=True):
        out_dtype = float_dtype(cb.dtype)
        got = coarsen.coarsen_mean_gpu(gb, factors, out_dtype)
        assert isinstance(got, cupy.ndarray) and got.dtype == out_dtype
        expected = coarsen.coarsen_mean_cpu(cb, factors, out_dtype)
        np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=1e-6 if out_dtype == np.float32 else 1e-12,
                                   equal_nan=True, err_msg=f"{gb.shape} {gb.strides} {factors}")
