"""Matrix products of genotype blocks: PCA's Patterson-scaled Gram matrix and eigenvectors, and the
sums of pairwise distances that leave missing values out pair by pair.

Each kernel is written once against the array module of its input (NumPy or CuPy: the same code
runs on both backends, and the CPU tests check the GPU's formulas), and does its products in
float64 with the BLAS of that module (cuBLAS on the GPU, where float64 products run on the tensor
cores of an H100 or H200). They work through a block ``SLAB`` variants at a time, so their
float64 temporaries stay a few slabs whatever the block's size.

- ``patterson_moments``: per variant, the count, sum and sum of squares of the values present
  (the scaler's mean and scale, and the data's total variance, follow).
- ``patterson_standardize``: alternate allele counts (variants, samples) -> (x - mean) / scale in
  float64, missing values (negative or NaN) as NaN: sgkit's ``PattersonScaler.transform``.
- ``patterson_gram``: the Gram matrices ``Xi^T Xj`` of the tiles of samples of one block of
  variants, for each pair of tiles on and above the diagonal, each tile standardized as above: the
  block's part of ``X^T X``, summed over blocks by the op.
- ``top_eigenpairs``: the ``k`` leading eigenvectors and the square roots of the eigenvalues of a
  symmetric matrix (the Gram matrix: the left singular vectors and singular values of ``X``).
- ``distance_sums``: per pair of rows of two tiles, the sums over the columns where both are
  present that a distance needs (euclidean: the sum of squared differences; correlation: n,
  sums, sums of squares and of products), as matrix products of the values with missing ones set
  to 0 and of the masks of present values.
- ``distance_from_sums``: the distances from those sums, as sgkit's reduce functions compute them.

On the GPU the scaler's moments and standardization are CUDA C (``cuda/patterson.cu``, one module
compiled once on a fresh machine, where these formulas on CuPy compiled a kernel for each of their
operations, CUB reductions among them at 1.7 s each).
"""

from __future__ import annotations

import numpy as np

from ..backend import xp_of

ACC = np.float64
SLAB = 4096  # variants (columns of the products) a slab: bounds the float64 temporaries

# number of sums a pair of rows needs, as sgkit's N_MAP_PARAM
DISTANCE_SUMS = {"euclidean": 1, "correlation": 6}


# --- PCA ------------------------------------------------------------------------------------------


def patterson_moments(ac):
    """(variants, 3) float64 for a (variants, samples) block: per variant, over the samples
    present (not negative, not NaN), their number, the sum of their values and of their squares.
    One kernel a block (the dask formulas took a pass over the block for each of them); exact
    sums for integer counts."""
    xp = xp_of(ac)
    out = xp.empty((ac.shape[0], 3), dtype=ACC)
    for v in range(0, ac.shape[0], SLAB):
        a = ac[v : v + SLAB]
        present = a >= 0  # False for NaN too
        x = xp.where(present, a, 0).astype(ACC)
        out[v : v + SLAB, 0] = present.sum(axis=1)
        out[v : v + SLAB, 1] = x.sum(axis=1)
        out[v : v + SLAB, 2] = (x * x).sum(axis=1)
    return out


def patterson_standardize(ac, mean, scale):
    """``(ac - mean) / scale`` in float64 for a (variants, samples) block, ``mean`` and ``scale`` of
    shape (variants,); missing values (negative, or NaN) become NaN, as in sgkit's scaler."""
    xp = xp_of(ac)
    x = ac.astype(ACC)
    x = xp.where(x < 0, xp.nan, x)
    x -= mean[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):  # a scale of 0 is the op's to report
        x /= scale[:, None]
    return x


def upper_pairs(n_tiles: int) -> list[tuple[int, int]]:
    """The tiles ``(i, j)`` on and above the diagonal of a matrix of ``n_tiles`` a side, row by row:
    the order of :func:`patterson_gram`'s results."""
    return [(i, j) for i in range(n_tiles) for j in range(i, n_tiles)]


def patterson_gram(tiles, mean, scale, start=None):
    """One block of variants' part of the Gram matrix's tiles on and above the diagonal: ``[Xi^T
    Xj for i <= j]`` (:func:`upper_pairs`' order), float64, where ``Xi`` is the standardized
    (variants, samples) tile ``tiles[i]``, standardized once a slab of variants for all of its
    pairs; each plus its tile of ``start`` (the sums so far, a list in the same order) if given."""
    return _gram_tiles(tiles, mean, scale, start, patterson_standardize, np.copy, _add_cpu)


def _add_cpu(out, x) -> None:
    out += x


def _gram_tiles(tiles, mean, scale, start, standardize, copy, add):
    """:func:`patterson_gram` with the backend's standardization, copy and addition; the sums so far
    are copied, not added to in place: they are the inputs of a task."""
    xp = xp_of(tiles[0])
    pairs = upper_pairs(len(tiles))
    if start is None:
        out = [xp.zeros((tiles[i].shape[1], tiles[j].shape[1]), dtype=ACC) for i, j in pairs]
    else:
        out = [copy(part) for part in start]
    for v in range(0, tiles[0].shape[0], SLAB):
        s = slice(v, v + SLAB)
        xs = [standardize(t[s], mean[s], scale[s]) for t in tiles]
        for part, (i, j) in zip(out, pairs):
            add(part, xs[i].T @ xs[j])
    return out


def sum_parts_cpu(parts):
    """The sum of the arrays ``parts``, added in their order, in a new array."""
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    return out


def fill_missing_cpu(ac, fill):
    """``ac`` (variants, samples) as float64 with each missing value (negative or NaN) replaced by
    its variant's ``fill``."""
    x = ac.astype(ACC)
    with np.errstate(invalid="ignore"):
        return np.where(x >= 0, x, np.asarray(fill, dtype=ACC)[:, None])


def _patterson_kernel(name: str, dtype):
    from . import launch

    return launch.raw_kernel("patterson.cu", name, launch.FMAD, value_t=launch.c_type(dtype))


def patterson_moments_gpu(ac):
    """:func:`patterson_moments` on a CuPy block, by the CUDA C kernel (``cuda/patterson.cu``, a
    block of threads a variant): the same values for integer counts (exact sums); for floats the
    sums are added in another order."""
    import cupy

    from .copies import contiguous

    ac = contiguous(ac)
    out = cupy.zeros((ac.shape[0], 3), dtype=ACC)
    if ac.shape[0] and ac.shape[1]:
        _patterson_kernel("pipeline_patterson_moments", ac.dtype)((ac.shape[0],), (256,), (ac, out, np.int64(ac.shape[1])))
    return out


def patterson_standardize_gpu(ac, mean, scale):
    """:func:`patterson_standardize` on a CuPy block, by the CUDA C kernel: the same values, bit
    for bit. ``mean`` and ``scale`` may be NumPy arrays (the op computes them on the host)."""
    import cupy

    from . import launch
    from .copies import contiguous

    ac = contiguous(ac)
    mean, scale = _device_column(mean), _device_column(scale)
    out = cupy.empty(ac.shape, dtype=ACC)
    if out.size:
        grid = min(launch.blocks(out.size), launch.sm_count() * 32)
        _patterson_kernel("pipeline_patterson_standardize", ac.dtype)(
            (grid,), (launch.THREADS,), (ac, mean, scale, out, np.int64(ac.shape[0]), np.int64(ac.shape[1])))
    return out


def _device_column(values):
    """Per-variant float64 values on the device, contiguous (from the host, or from the device)."""
    import cupy

    from .copies import contiguous

    if isinstance(values, cupy.ndarray):
        return contiguous(values) if values.dtype == ACC else cupy.asarray(values.get().astype(ACC))
    return cupy.asarray(np.ascontiguousarray(values, dtype=ACC))


def _add_into(out, x) -> None:
    """``out += x`` for two C-contiguous float64 CuPy arrays of one shape, by ``pipeline_add_into``."""
    from . import launch

    if out.size:
        grid = min(launch.blocks(out.size), launch.sm_count() * 32)
        _patterson_kernel("pipeline_add_into", np.float64)((grid,), (launch.THREADS,), (out, x, np.int64(out.size)))


def patterson_gram_gpu(tiles, mean, scale, start=None):
    """:func:`patterson_gram` on CuPy tiles: standardized by the CUDA C kernel, each slab's
    products by cuBLAS, added by ``pipeline_add_into`` (CuPy's ``+=`` is a kernel that a fresh
    machine compiles)."""
    from .copies import copy_of

    return _gram_tiles(tiles, _device_column(mean), _device_column(scale), start, patterson_standardize_gpu, copy_of,
                       _add_into)


def sum_parts_gpu(parts):
    """:func:`sum_parts_cpu` of float64 CuPy arrays, by ``pipeline_add_into``."""
    from .copies import contiguous, copy_of

    out = copy_of(parts[0])
    for p in parts[1:]:
        _add_into(out, contiguous(p))
    return out


def fill_missing_gpu(ac, fill):
    """:func:`fill_missing_cpu` of a CuPy block (``fill`` on the host or the device), by
    ``pipeline_fill_missing``."""
    import cupy

    from . import launch

    rows, cols = ac.shape
    out = cupy.empty((rows, cols), dtype=ACC)
    if out.size:
        if ac.dtype not in launch.C_TYPES or ac.strides[1] != ac.itemsize or ac.strides[0] % ac.itemsize:
            from .copies import contiguous

            ac = contiguous(ac if ac.dtype in launch.C_TYPES else ac.astype(ACC))
        _patterson_kernel("pipeline_fill_missing", ac.dtype)(
            launch.row_grid(cols, rows), (launch.THREADS,), (ac, np.int64(ac.strides[0] // ac.itemsize), _device_column(fill), out, np.int64(rows), np.int64(cols)))
    return out


def top_eigenpairs(gram, k: int):
    """The ``k`` leading eigenvectors of the symmetric ``gram`` (n, n) and the square roots of their
    eigenvalues (clamped at 0), as one (n + 1, k) float64 array: the vectors in its first n rows,
    in order of decreasing eigenvalue, the roots in its last row. LAPACK's syevd computes every
    pair in O(n^3); exact where an iterative method's accuracy would depend on the gaps between
    eigenvalues. It runs alone, once every block of the Gram matrix is summed: on every core
    (:func:`pipeline.kernels.launch.blas_on_every_core`), where the blocks' products had one BLAS
    thread each."""
    from . import launch

    with launch.blas_on_every_core():
        w, v = np.linalg.eigh(gram)
    n = w.shape[0]
    return _leading(w[n - k :], v[:, n - k :])


def _leading(w, v):
    """:func:`top_eigenpairs`' array from the ``k`` largest eigenvalues ``w`` (ascending) and their
    vectors ``v`` (n, k), on the host."""
    out = np.empty((v.shape[0] + 1, v.shape[1]), dtype=ACC)
    out[:-1] = v[:, ::-1]
    out[-1] = np.sqrt(np.maximum(w[::-1], 0.0))
    return out


def solver_handle():
    """This thread's cuSOLVER handle on the current device, made if it is not yet: where making it
    fails (``cusolverDnCreate`` allocates device memory of its own, outside CuPy's pool), the
    pool's cached blocks are given back to the device and it is made again. After a pass over
    the data the pool may hold nearly all of the device: on the 2-GPU H200 machine, an exact PCA
    of 10,000 samples failed there with CUSOLVER_STATUS_INTERNAL_ERROR in one run of two."""
    import cupy
    from cupy_backends.cuda.libs import cusolver

    try:
        return cupy.cuda.Device().cusolver_handle
    except cusolver.CUSOLVERError:
        cupy.get_default_memory_pool().free_all_blocks()
        return cupy.cuda.Device().cusolver_handle


def top_eigenpairs_gpu(gram, k: int):
    """:func:`top_eigenpairs` of a CuPy matrix by cuSOLVER's syevd (``cupy.linalg.eigh``), on a
    copy of ``gram`` made by the copy engine and handed to it in the column order it works in (the
    matrix is symmetric), so that CuPy makes no copy of its own (a kernel that a fresh machine
    compiles); the ``k`` leading pairs, n x k values, are ordered on the host. Returns CuPy."""
    import cupy

    from .copies import copy_of, to_host

    solver_handle()
    try:
        from cupy.linalg._eigenvalue import _syevd

        w, v = _syevd(copy_of(gram).T, "L", True, overwrite_a=True)
    except (ImportError, TypeError):  # a CuPy without this entry point
        w, v = cupy.linalg.eigh(gram)
    n = w.shape[0]
    return cupy.asarray(_leading(to_host(w[n - k :]), to_host(v[:, n - k :])))


# --- pairwise distances ---------------------------------------------------------------------------


def _present(x, xp):
    """Values with the missing ones (negative or NaN, as sgkit's metrics test ``x >= 0``) set to 0,
    and the mask of present values, both float64."""
    w = x >= 0
    return xp.where(w, x, 0).astype(ACC), w.astype(ACC)


def distance_sums(x_i, x_j, metric: str):
    """(rows_i, rows_j, S) float64: for each pair of a row of ``x_i`` and a row of ``x_j`` (tiles of
    rows over the same columns), the sums over the columns where both are present:

    - euclidean (S = 1): sum (x - y)^2 = (X^2) M_j^T + M_i (Y^2)^T - 2 X Y^T;
    - correlation (S = 6, in sgkit's order): sum x, sum y, sum x^2, sum y^2, sum x y, n,

    with ``X``, ``Y`` the values (0 where missing) and ``M`` the masks of present values. Exact
    for integer counts (every product and sum is an integer below 2^53)."""
    xp = xp_of(x_i)
    out = xp.zeros((DISTANCE_SUMS[metric], x_i.shape[0], x_j.shape[0]), dtype=ACC)  # each sum contiguous
    for c in range(0, x_i.shape[1], SLAB):
        s = slice(c, c + SLAB)
        xi, mi = _present(x_i[:, s], xp)
        xj, mj = (xi, mi) if x_j is x_i else _present(x_j[:, s], xp)
        xxi = xi * xi
        xxj = xxi if xj is xi else xj * xj
        xy = xi @ xj.T
        if metric == "euclidean":
            out[0] += xxi @ mj.T + mi @ xxj.T - 2.0 * xy
        else:
            out[0] += xi @ mj.T
            out[1] += mi @ xj.T
            out[2] += xxi @ mj.T
            out[3] += mi @ xxj.T
            out[4] += xy
            out[5] += mi @ mj.T
    return xp.moveaxis(out, 0, -1)


def distance_from_sums(sums, metric: str, diagonal: bool, dtype):
    """Distances (rows_i, rows_j) in ``dtype`` from :func:`distance_sums`' sums over all columns.

    Euclidean: the square root of the sum of squared differences (a sum that rounding left below 0
    counts as 0). Correlation: ``1 - (n sxy - sx sy) / (sqrt(n sxx - sx^2) sqrt(n syy - sy^2))``,
    NaN where that denominator is not above 0 (a row constant over the columns both rows have, or
    fewer than two of them), as sgkit's ``correlation_reduce_cpu``.

    A ``diagonal`` tile (rows_i are rows_j) is made symmetric as sgkit makes its whole result,
    ``triu(d) + triu(d).T``: its lower triangle mirrors the upper, and its diagonal is doubled
    (a row's euclidean distance to itself is 0 first, as sgkit's ``(x - x)^2`` gives)."""
    xp = xp_of(sums)
    if metric == "euclidean":
        d = xp.sqrt(xp.maximum(sums[..., 0], 0.0))
        if diagonal:
            xp.fill_diagonal(d, 0.0)
    else:
        sx, sy, sxx, syy, sxy, n = (sums[..., i] for i in range(6))
        with np.errstate(invalid="ignore", divide="ignore"):
            num = n * sxy - sx * sy
            denom = xp.sqrt(n * sxx - sx * sx) * xp.sqrt(n * syy - sy * sy)
            d = xp.where(denom > 0, 1.0 - num / xp.where(denom > 0, denom, 1.0), xp.nan)
    d = d.astype(dtype)
    if diagonal:
        d = xp.triu(d)
        d = d + d.T
    return d
