"""Principal component analysis of genotypes (sgkit's ``pca``), and the alternate allele counts it
runs on (sgkit's ``count_call_alternate_alleles``).

sgkit 0.10's ``pca`` scales the alternate allele counts ``X`` (samples x variants) as Patterson,
Price and Reich (``PattersonScaler``: per variant, ``p`` = mean count / ploidy over the samples,
``X = (X - ploidy p) / sqrt(p (1 - p))``), then takes a truncated SVD ``X = U S V^T``: the
projection is ``X V`` (``U S``), the components ``V``, the explained variance ``var(U S)`` over the
samples, its ratio to the total variance of ``X``, and the loadings ``V sqrt(variance)``. Data
with missing values are refused (an :class:`~pipeline.errors.InputError` naming the variable,
raised when the result is computed: the op computes nothing when called), as are variants with no
variation (their scale is 0; sgkit fails there with ``LinAlgError: SVD did not converge``, and so
the error here is a :class:`~pipeline.errors.LinAlgInputError`, a ``LinAlgError`` too).

As sgkit 0.10, ``scaler`` may be a scikit-learn estimator, which sgkit takes and does not apply
(its pipeline always scales as Patterson's): the results are Patterson's, with a warning here.

How the SVD is computed, so that it gives sgkit's results within rounding and scales to 200,000
variants x 25,000 samples (10 GB of int8 genotypes) on one GPU in bounded memory:

- ``algorithm="tsqr"`` (exact; sgkit runs dask's tall-skinny QR and an SVD of its R factor): here
  the samples x samples Gram matrix ``G = X X^T``, summed over blocks of variants, and its
  eigendecomposition ``G = U S^2 U^T``; then ``V = X^T U / S`` in one more pass, and the projection
  ``U S`` (which is ``X V``) with no pass at all. Every block's part of ``G`` is float64 matrix
  products (cuBLAS on the GPU; H100 and H200 run float64 products on their tensor cores), at most
  M N^2 multiply-adds in all and about half of that past one tile, as ``G`` is symmetric and only
  its tiles on and above the diagonal are computed (1.4e14 flops at 200,000 x 25,000: seconds);
  the data are read once before the eigendecomposition (the scaler's statistics and ``G`` from
  the same blocks). Memory depends on the samples only: ``G`` is N^2 float64 (5 GB at 25,000
  samples), summed in tiles of at most ``TILE`` samples a side by a few chains, each holding the
  tiles on and above the diagonal (``CHAIN_BYTES`` in all: 8 chains at 10,000 samples, one at
  25,000), and the
  eigendecomposition (LAPACK's or cuSOLVER's syevd, O(N^3): the step that grows fastest, tens of
  seconds at 25,000 samples on one GPU) holds about six N^2 arrays on the GPU (cuSOLVER's workspace
  is four of them), three on the CPU: on the GPU, a device budget below that (30 GB at 25,000
  samples) is refused when the op is called, naming the randomized
  algorithm, whose memory does not grow with N^2. In float64 the squared
  condition number costs nothing that matters: a singular value ``s_i`` comes out within about
  1e-16 (s_1 / s_i)^2 relative, far below float32 rounding for the leading components PCA keeps.
  dask's tsqr on the same data would need blocks of more variants than samples (25,000 x 25,000,
  2.5 GB of float32 each, several at once in a QR), stack an N x N R factor per block, make twice
  the flops of the Gram products (Householder QR) and hold the samples in one chunk, as sgkit
  requires; a randomized SVD would not give tsqr's results. Measured on a 2-core host (shared,
  so roughly), 40,000 variants x 2,000 samples, 10 components: 13 s, against 120 s for sgkit's
  tsqr in float32.
- ``algorithm="randomized"`` (approximate): dask's ``svd_compressed``, as sgkit calls it, step by
  step on the scaled data in float64, with the same random matrix (dask's
  ``default_rng(random_state)``, chunked as the variants and rounded to the data's float type as
  dask does), so that it makes the same approximation as sgkit for the same variant chunks. Its
  passes are products of the blocks with thin matrices (samples or variants x ``c``, ``c =
  max(20, n_components + n_oversamples)``, dask's subspace, ``n_oversamples`` 10 unless given)
  and dask's tsqr of those thin matrices: memory O((N + M) c) besides a block's float64 copy,
  4 + 2 ``n_iter`` passes over the data (the first for the scaler's statistics). On the CPU the
  float64 copies cost time: 7 s where sgkit's float32 takes 2 s on the data above. Past the
  components that carry the structure (the populations' axes), genotype PCA's eigenvalues are a
  noise floor of nearly equal values, where a subspace of 20 converges slowly (Halko, Martinsson
  and Tropp 2011): at 25,000 samples x 200,000 variants, ``n_iter=8`` left eigenvalues 3-10
  1.6-3.6 % below PLINK 2's. A wider subspace (``n_oversamples``) takes the same passes over the
  data, each a product with more columns (cheap on the GPU, where the passes cost the time), and
  brings those eigenvalues close to the exact ones.

Arithmetic is float64 throughout (sgkit computes in float32 when the counts are integers); the
outputs have sgkit's float type: the variable's when it holds floats, float32 otherwise. Signs are
sgkit's (dask's ``svd_flip``: each component's loadings sum to a non-negative number).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Literal

import numpy as np
import xarray as xr
from dask.base import tokenize

from ... import backend as B
from ...deferred import module as _deferred
from ...errors import InputError, LinAlgInputError
from ...exec import spill
from ..registry import register
from . import specs
from ._dataset import _transposed, as_dask, backend_of_dataset, even_chunks
from ._dataset import merge as _merge
from ._dataset import variable as _variable
from .variables import ALT_COUNTED, DOSAGE, P, S, V, Add, Declared, Dim, Read, add

da = _deferred("dask.array")  # imported when the first graph is built

ACC = np.float64
ALT = "call_alternate_allele_count"
# samples a side of the Gram matrix's tiles: a tile's partial is TILE^2 float64 (134 MB), however
# many samples there are; blocks of variants are the input's
TILE = 4096
# independent chains of the Gram fold (:func:`_gram_folded`), each holding a sum of every tile on
# and above the diagonal (a little over half a Gram matrix): at most CHAINS, fewer where they would
# hold more than CHAIN_BYTES in all (10,000 samples: 8 chains of 533 MB; 25,000 samples: one of
# 2.9 GB, whose products of 3,572-sample tiles keep a GPU or a host's BLAS busy on their own)
CHAINS = 8
CHAIN_BYTES = 4 * 2**30
# device memory the exact algorithm holds at its peak, in Gram matrices (N^2 float64): the matrix,
# CuPy's copy of it that becomes the eigenvectors, and cuSOLVER syevd's workspace (3.21 GB asked
# for 10,000 samples on the GPU machine: four matrices)
EIGH_MATRICES = 6
# dask's svd_compressed: the sampled subspace is max(MIN_SUBSPACE, n_components + n_oversamples),
# n_oversamples OVERSAMPLES by default
OVERSAMPLES = 10
MIN_SUBSPACE = 20


# --- count_call_alternate_alleles ----------------------------------------------------------------


@register(kernels=("alternate_allele_count",), dataset=True, variables=Declared(
    # unsigned genotypes too, where sgkit's spec says signed
    needs=(Read("{call_genotype}", (V, S, P), "iu"),),
    adds=(Add(ALT, DOSAGE, "i"),),  # a variable sgkit's specs do not name
))
def count_call_alternate_alleles(ds: xr.Dataset, merge: bool = True, *, call_genotype: str = "call_genotype") -> xr.Dataset:
    """Number of alternate alleles in each call: sgkit's ``count_call_alternate_alleles``.

    ``call_alternate_allele_count`` (variants, samples), int16: for each call, the alleles that
    are not the reference (``1 <= a < alleles``), or -1 where any allele of the call is missing
    (-1, or -2 for fill): ``call_genotype_mask`` as VCF Zarr and sgkit define it, ``call_genotype
    < 0``, read from the genotypes in the same pass. One pass over the genotypes, one kernel a
    block (:mod:`pipeline.kernels.alternate`).
    """
    op = count_call_alternate_alleles.op
    g = _variable(ds, call_genotype, ("variants", "samples", "ploidy"), "iu", op="count_call_alternate_alleles")
    backend = backend_of_dataset(g)
    kernel = op.kernel("alternate_allele_count", backend)
    data = as_dask(g).rechunk({2: -1})
    ac = data.map_blocks(kernel, ds.sizes.get("alleles"), drop_axis=2, dtype=np.int16, meta=B.meta(backend, np.int16, 2))
    return _merge(ds, xr.Dataset({ALT: (("variants", "samples"), ac)}), merge)


# --- pca -----------------------------------------------------------------------------------------


@register(kernels=("alternate_allele_count", "patterson_moments", "patterson_standardize", "patterson_gram",
                  "sum_parts", "top_eigenpairs"), dataset=True, variables=Declared(
    needs=(ALT_COUNTED, Read("{variable}", DOSAGE, "iuf"), Dim(P, unless="ploidy")),
    adds=(
        add(specs.sample_pca_projection_spec), add(specs.sample_pca_component_spec),
        add(specs.sample_pca_explained_variance_spec), add(specs.sample_pca_explained_variance_ratio_spec),
        add(specs.sample_pca_loading_spec),
    ),
))
def pca(
    ds: xr.Dataset,
    n_components: int = 10,
    *,
    ploidy: int | None = None,
    scaler: Any = "patterson",
    algorithm: Literal["tsqr", "randomized"] | None = "tsqr",
    n_iter: int = 0,
    random_state: Any = 0,
    n_oversamples: int | None = None,
    variable: str = ALT,
    check_missing: bool = True,
    merge: bool = True,
) -> xr.Dataset:
    """Principal component analysis of the Patterson-scaled alternate allele counts: sgkit's ``pca``.

    ``variable`` (variants, samples) holds the counts; where the dataset has no such variable and
    it is ``call_alternate_allele_count``, it is counted from ``call_genotype``
    (:func:`count_call_alternate_alleles`) and merged into the result as sgkit does. Counts must
    be complete (no negative or NaN value; ``check_missing=False`` leaves the check out, as
    sgkit's, and missing values then spoil the result) and vary across samples for every variant.
    ``ploidy`` defaults to the ``ploidy`` dimension's length. ``scaler``: "patterson" (or None), or
    a scikit-learn estimator, taken as sgkit 0.10 takes it: not applied, the counts scaled as
    Patterson's all the same (with a warning). ``algorithm``: "tsqr" (exact) or "randomized" (sgkit's
    ``svd_compressed`` with ``n_iter`` power iterations, its random matrix drawn as dask draws it
    from ``random_state``: an int, None, a NumPy or Dask Generator, or a Dask RandomState; a NumPy
    RandomState is refused, as dask refuses it); see the module docstring for how each is
    computed. ``n_oversamples`` (a pipeline extension, dask's ``svd_compressed`` argument of that
    name): the randomized SVD samples a subspace of ``max(20, n_components + n_oversamples)``
    columns (at most the samples or variants); None is dask's and sgkit's 10. A wider subspace
    gives eigenvalues past the populations' axes closer to the exact ones for the same passes
    over the data (10 components of three populations' genotypes, 8 iterations: within 0.1 % of
    the exact ones with 50, up to 4 % below them with 10). It has no effect with
    ``algorithm="tsqr"``, which is exact (the value is checked all the same). Unlike sgkit's tsqr,
    the counts may be chunked along the samples too.

    Returns ``sample_pca_projection`` (samples, components), ``sample_pca_component`` (variants,
    components), ``sample_pca_explained_variance`` and ``sample_pca_explained_variance_ratio``
    (components), ``sample_pca_loading`` (variants, components), in the variable's float type
    (float32 for integer counts), merged into ``ds`` when ``merge``.
    """
    name = "pca"
    op = pca.op
    if variable not in ds.variables and variable == ALT:
        ds = count_call_alternate_alleles(ds)
    ac = _variable(ds, variable, ("variants", "samples"), "iuf", op=name)
    if ploidy is None:
        if "ploidy" not in ds.sizes:
            raise InputError(f"{name}: `ploidy` must be given when the dataset has no ploidy dimension")
        ploidy = int(ds.sizes["ploidy"])
    if not isinstance(ploidy, (int, np.integer)) or ploidy < 1:
        raise InputError(f"{name}: `ploidy` must be a positive integer, got {ploidy!r}")
    _check_scaler(scaler, name)
    algorithm = algorithm or "tsqr"
    if algorithm not in ("tsqr", "randomized"):
        raise InputError(f"{name}: `algorithm` must be 'tsqr' or 'randomized', not {algorithm!r}")
    n_variants, n_samples = ac.shape
    k = n_components
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= n_samples or k >= n_variants:
        raise InputError(
            f"{name}: `n_components` must be an integer from 1 to the number of samples ({n_samples}) and below "
            f"the number of variants ({n_variants}), got {k!r}"
        )
    if not isinstance(n_iter, (int, np.integer)) or n_iter < 0:
        raise InputError(f"{name}: `n_iter` must be a non-negative integer, got {n_iter!r}")
    if n_oversamples is None:
        n_oversamples = OVERSAMPLES
    if not isinstance(n_oversamples, (int, np.integer)) or isinstance(n_oversamples, bool) or n_oversamples < 0:
        raise InputError(f"{name}: `n_oversamples` must be a non-negative integer or None, got {n_oversamples!r}")
    k = int(k)
    out_dtype = ac.dtype if ac.dtype.kind == "f" else np.dtype(np.float32)  # sgkit's _allele_counts
    backend = backend_of_dataset(ac)
    x = as_dask(ac).rechunk({1: even_chunks(n_samples, TILE)})
    stats = _patterson(x, ploidy, _moments_kernel(op.kernel("patterson_moments", backend)), backend)
    check = dict(n_missing=stats["n_missing"], n_flat=stats["n_flat"], variable=variable,
                 check_missing=check_missing)
    standardize = op.kernel("patterson_standardize", backend)

    def scaled(*after):
        """The scaled counts (variants, samples) in float64 for one pass over the data, read after
        ``after`` are computed (out of core, read again rather than held:
        :func:`pipeline.exec.spill.second_pass`). Each pass has blocks of its own, made as the pass
        uses them: blocks shared between passes would be held between them, in float64."""
        data = spill.second_pass(x, *after) if after else x
        token = "patterson-scaled-" + tokenize(*(a.name for a in after))
        return da.blockwise(standardize, "ki", data, "ki", stats["mean"], "k", stats["scale"], "k", dtype=ACC,
                            meta=B.meta(backend, ACC, 2), token=token)

    if algorithm == "tsqr":
        _check_fits(n_samples, backend, name)
        u, s, components = _tsqr(x, stats, check, k, scaled, op, backend)
        projection = u * s
    else:
        u, s, components = _randomized(x, check, k, n_iter, int(n_oversamples), _rng(random_state, name), out_dtype,
                                       scaled)
        projection = _xt_product(scaled(components), components)  # sgkit's transform: X @ components_.T
    explained = (u * s).var(axis=0)
    ratio = explained / stats["total_variance"]
    loading = components * da.sqrt(explained)
    outputs = {
        "sample_pca_projection": (("samples", "components"), projection),
        "sample_pca_component": (("variants", "components"), components),
        "sample_pca_explained_variance": (("components",), explained),
        "sample_pca_explained_variance_ratio": (("components",), ratio),
        "sample_pca_loading": (("variants", "components"), loading),
    }
    new = xr.Dataset({n: (dims, B.to_backend(a.astype(out_dtype), backend)) for n, (dims, a) in outputs.items()})
    return _merge(ds, new, merge)


def _check_scaler(scaler, name: str) -> None:
    """sgkit 0.10's ``pca_est``: a string must be "patterson" (None or "" stand for it); an
    estimator is taken and not applied, its pipeline being Patterson's scaler whatever is passed."""
    if scaler is None or isinstance(scaler, str):
        if (scaler or "patterson") != "patterson":
            raise InputError(f"{name}: only the 'patterson' scaler is supported, not {scaler!r}")
        return
    # an estimator's class imported scikit-learn's base: where it is not loaded, this is none
    base = sys.modules.get("sklearn.base")
    if base is None or not isinstance(scaler, base.BaseEstimator):
        raise InputError(f"{name}: `scaler` must be 'patterson' or a scikit-learn estimator, got {type(scaler).__name__}")
    if type(scaler).__name__ != "PattersonScaler":
        warnings.warn(f"{name}: the scaler {scaler!r} is not applied: the counts are scaled as Patterson's "
                      "(PattersonScaler), as sgkit 0.10 scales them whatever estimator it is given", UserWarning,
                      stacklevel=4)


def _rng(random_state, name: str):
    """What dask's ``svd_compressed`` draws its random matrix from for seed ``random_state``: a
    Dask RandomState as it is, anything else through dask's ``default_rng`` (an int, None, a
    Generator); what that refuses is an InputError."""
    if isinstance(random_state, da.random.RandomState):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        raise InputError(f"{name}: `random_state` cannot be a numpy.random.RandomState (dask's randomized SVD does not "
                         "draw from one, and sgkit fails on it): give an int, a numpy.random.Generator, or a "
                         "dask.array.random.RandomState")
    try:
        return da.random.default_rng(random_state)
    except (TypeError, ValueError) as e:
        raise InputError(f"{name}: `random_state` must be an int, None, a Generator or a dask.array.random.RandomState, "
                         f"got {type(random_state).__name__} ({e})") from None


def _patterson(x, ploidy: int, kernel, backend) -> dict:
    """Per variant: the mean count over the samples present (NaN-skipping, as sgkit's scaler) and
    Patterson's scale ``sqrt(p (1 - p))`` with ``p = mean / ploidy``; the total variance of the
    scaled data (the sum over variants of their variance over the samples, ddof 0, as sgkit's
    ``da.var(X, axis=0).sum()``: the sum of squared deviations, ``S2 - S1 mean``, exact for
    integer counts, over count x scale^2); and, for the checks, the count of missing values and
    of variants whose scale is not above 0. One kernel a block, summed over tiles of samples."""
    parts = da.blockwise(kernel, "kis", x, "ki", new_axes={"s": 3}, adjust_chunks={"i": 1}, dtype=ACC,
                         meta=B.meta(backend, ACC, 3))
    parts = B.to_backend(parts, "cpu")  # the thin end on the host (see _xt_product)
    moments = parts.sum(axis=1) if parts.numblocks[1] > 1 else parts[:, 0]
    count, total, squares = moments[:, 0], moments[:, 1], moments[:, 2]
    mean = da.where(count > 0, total / da.maximum(count, 1), np.nan)
    p = mean / ploidy
    scale = da.sqrt(da.maximum(p * (1 - p), 0.0))
    m2 = da.maximum(squares - total * mean, 0.0)
    return {
        "mean": mean,
        "scale": scale,
        "total_variance": (m2 / da.where(scale > 0, da.maximum(count, 1) * scale**2, 1.0)).sum(),
        "n_missing": (x.shape[1] - count).sum(),
        "n_flat": (~(scale > 0)).sum(),
    }


def _moments_kernel(kernel):
    return lambda block: kernel(block)[:, None, :]


def _checked(block, n_missing, n_flat, *, variable: str, check_missing: bool):
    """``block``, once the data have passed the checks (run in the graph, on small results)."""
    if check_missing and int(n_missing) > 0:
        raise InputError(
            f"pca: variable {variable!r} has {int(n_missing)} missing values (negative or NaN); PCA needs complete "
            "data: impute them or filter those variants out first"
        )
    if int(n_flat) > 0:  # where sgkit's SVD fails: LinAlgError
        raise LinAlgInputError(
            f"pca: variable {variable!r} has {int(n_flat)} variants with no variation across samples (Patterson's "
            "scale sqrt(p (1 - p)) is 0, p = mean count / ploidy): filter them out first"
        )
    return block


def _tsqr(x, stats, check, k: int, scaled, op, backend):
    """The exact truncated SVD from the Gram matrix (see the module docstring): ``U`` (samples, k),
    ``S`` (k,) and the components ``V`` (variants, k), signs as dask's ``svd_flip``."""
    n = x.shape[1]
    # a block's mean and scale are its own variants' (over the samples): the Gram matrix is summed
    # from the blocks that the statistics are read from, in the same pass
    gram = _gram_folded(x, stats["mean"], stats["scale"], op.kernel("patterson_gram", backend),
                        op.kernel("sum_parts", backend), backend).rechunk((n, n))
    eig = da.map_blocks(
        _eigenpairs, gram, check["n_missing"], check["n_flat"], kernel=op.kernel("top_eigenpairs", backend), k=k,
        variable=check["variable"], check_missing=check["check_missing"],
        chunks=((n + 1,), (k,)), dtype=ACC, meta=B.meta(backend, ACC, 2),
    )
    eig_host = B.to_backend(eig, "cpu")
    u, s = eig_host[:n], eig_host[n]
    u_tiles = u.rechunk((x.chunks[1], (k,)))
    # V = X^T U / S, by blocks of variants; read once U's tiles are on the host: read after the
    # eigendecomposition only, the blocks waited for U there, all of them (dask ordered U's steps last)
    v = _x_product(scaled(u_tiles), u_tiles) / s
    signs = da.where(v.sum(axis=0) >= 0, 1.0, -1.0)
    return u * signs, s, v * signs


def _gram_folded(x, mean, scale, kernel, sum_kernel, backend) -> "da.Array":
    """``X^T X`` by tiles of samples, folded along the blocks of variants in a few chains
    (:func:`gram_chains`): the task of block ``k`` adds that block's part of every tile on and
    above the diagonal (``patterson_gram``) to what the chain's task of block ``k - 1`` passed it,
    and the chains' sums are added at the end, two by two. The tiles below the diagonal are the
    transposes of those above (the matrix is symmetric: half the work).

    One task a block, for all of its tiles: with a task a block and tile pair, dask's ordering
    ran each pair's chain over all the blocks before the next pair's, and every tile of every
    block waited in memory for its last pair (the whole input: 3 tiles of samples, measured on
    a 1-worker cluster). A tree sum over the blocks (``parts.sum(axis=...)``) held, for every
    tile, a few partials on each of its levels and the blocks' parts waiting for their siblings;
    a chain holds one sum of each tile. Keys lead with the block of variants, so that on a cluster
    each task runs where its block is read (:mod:`pipeline.exec.locality`)."""
    import functools
    import operator

    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    from ...kernels.linalg import upper_pairs

    tiles = x.chunks[1]
    nk, nt = x.numblocks
    token = tokenize(x.name, mean.name, scale.name, "gram-fold")
    fold, total = f"patterson-gram-fold-{token}", f"patterson-gram-{token}"
    step = functools.partial(_gram_step, kernel=kernel)
    edges = np.linspace(0, nk, gram_chains(tiles, nk) + 1).round().astype(int)
    dsk, ends = {}, []
    for a, b in zip(edges[:-1], edges[1:]):
        prev = None
        for k in range(a, b):
            dsk[(fold, k)] = (step, prev, [(x.name, k, i) for i in range(nt)], (mean.name, k), (scale.name, k))
            prev = (fold, k)
        ends.append(prev)
    # the chains' sums added two by two, neighbours first: on a cluster neighbouring chains read
    # neighbouring blocks, on one worker, and only the last additions move a sum between workers
    # (each tile's task taking every chain's sums moved all of them: 4.3 GB at 10,000 samples on
    # two GPUs, 3.5 s over TCP)
    level, depth = ends, 0
    while len(level) > 1:
        depth += 1
        level = [
            pair[0] if len(pair) == 1 else _add_states(dsk, f"patterson-gram-sum-{token}-{depth}-{a}", pair, sum_kernel)
            for a, pair in enumerate(level[i : i + 2] for i in range(0, len(level), 2))
        ]
    for p, (i, j) in enumerate(upper_pairs(nt)):
        dsk[(total, i, j)] = (operator.getitem, level[0], p)
        if i != j:
            dsk[(total, j, i)] = (_transposed, (total, i, j))
    graph = HighLevelGraph.from_collections(total, dsk, dependencies=[x, mean, scale])
    return da.Array(graph, total, (tiles, tiles), meta=B.meta(backend, ACC, 2))


def _add_states(dsk: dict, key: str, states: list, kernel) -> str:
    """Add to ``dsk`` the task ``key`` that sums the chains' sums ``states`` tile by tile; returns
    ``key``. Its key names no block (:func:`pipeline.exec.locality.block_index`): the scheduler runs
    it where its inputs are."""
    dsk[key] = (_sum_states, states, kernel)
    return key


def _sum_states(states: list, kernel) -> list:
    return [kernel(list(tiles)) for tiles in zip(*states)]


def gram_chains(tiles: tuple[int, ...], n_blocks: int) -> int:
    """Chains the Gram matrix of tiles of ``tiles`` samples is folded in: ``CHAINS``, fewer where
    their sums (each of the tiles on and above the diagonal) would hold more than ``CHAIN_BYTES``,
    and at most one a block of variants."""
    from ...kernels.linalg import upper_pairs

    state = sum(tiles[i] * tiles[j] for i, j in upper_pairs(len(tiles))) * np.dtype(ACC).itemsize
    return max(1, min(CHAINS, n_blocks, CHAIN_BYTES // max(1, state)))


def tsqr_device_bytes(n_samples: int) -> int:
    """Device bytes the exact algorithm holds at its peak: the eigendecomposition of the
    ``n_samples``-square Gram matrix (``EIGH_MATRICES`` of them), which is not done by blocks."""
    return EIGH_MATRICES * n_samples * n_samples * np.dtype(ACC).itemsize


def _check_fits(n_samples: int, backend, name: str) -> None:
    """Refuse, when the op is called, an exact PCA whose eigendecomposition cannot fit the device
    budget (``pipeline.gpu.memory-limit``) rather than fail with CuPy's out-of-memory error far into
    the run. Only where this process sees the GPU (a distributed client may not)."""
    if backend != "gpu" or not B.gpu_available():
        return
    need, budget = tsqr_device_bytes(n_samples), B.memory_budget("gpu")
    if need > budget:
        from dask.utils import format_bytes

        raise InputError(
            f"{name}: algorithm='tsqr' on {n_samples:,} samples decomposes a {n_samples:,}-square float64 Gram matrix "
            f"on the GPU, about {format_bytes(need)}, above the device budget of {format_bytes(budget)} "
            "(pipeline.gpu.memory-limit): raise the budget, or use algorithm='randomized', whose memory grows with "
            "the samples times the components"
        )


def _gram_step(prev, tiles, mean, scale, *, kernel):
    return kernel(tiles, mean, scale, prev)  # new arrays: the sums so far plus this block's parts



def _eigenpairs(gram, n_missing, n_flat, *, kernel, k: int, variable: str, check_missing: bool):
    _checked(None, n_missing, n_flat, variable=variable, check_missing=check_missing)
    return kernel(gram, k)


def _randomized(x, check, k: int, n_iter: int, n_oversamples: int, rng, out_dtype, scaled):
    """dask's ``svd_compressed(X, k, n_power_iter=n_iter, n_oversamples=n_oversamples,
    seed=random_state)`` on the scaled data (samples x variants), in float64, step for step, with
    dask's random matrix drawn from ``rng`` (:func:`_rng`): ``U`` (samples, k), ``S`` (k,),
    components ``V`` (variants, k), signs by ``svd_flip``."""
    m, n = x.shape  # variants, samples
    c = min(max(MIN_SUBSPACE, k + n_oversamples), min(m, n))
    # the random matrix as dask draws it for data of the output's float type (float32 values
    # when the data are float32), chunked as the data's variants
    omega_type = np.float32 if out_dtype == np.float32 else np.float64
    omega = rng.standard_normal(size=(m, c), chunks=(x.chunks[0], (c,)))
    omega = omega.astype(omega_type).astype(ACC)
    h = _xt_product(scaled(), omega)  # (samples, c)
    h = h.map_blocks(_checked, check["n_missing"], check["n_flat"], variable=check["variable"],
                     check_missing=check["check_missing"], dtype=ACC, meta=B.meta("cpu", ACC, 2))
    for _ in range(n_iter):
        t = _x_product(scaled(h), h)  # X^T h: (variants, c)
        h = _xt_product(scaled(t), t)
    q, _ = da.linalg.tsqr(h)
    bt = _x_product(scaled(q), q)  # (Q^T X)^T: (variants, c)
    v, s, ut = da.linalg.tsqr(bt, compute_svd=True)
    u = (q @ ut.T)[:, :k]
    s, v = s[:k], v[:, :k]
    signs = da.where(v.sum(axis=0) >= 0, 1.0, -1.0)
    return u * signs, s, v * signs


# --- products with thin matrices, the thin end on the host -------------------------------------------
#
# The data's passes are products of the scaled blocks (variants x samples, float64) with matrices of
# c columns (max(20, k + n_oversamples): 20 by default): each block's product is cuBLAS on the GPU,
# and its result (a few MB) comes to the host, where the blocks' results are summed and everything
# of the thin size (the scaler's statistics, dask's tsqr and SVD of the thin matrices, signs,
# variances) is NumPy. That work is milliseconds on either side; on CuPy it compiled a kernel for
# each of its operations and dtypes on a fresh machine (about 45, among them CUB reductions at 1.7 s
# each: 10.8 s of a 11.7 s first run of the randomized algorithm at 200,000 variants x 25,000
# samples, where the warm run took 0.9 s).


def _xt_block(x, m):
    """``x^T m`` of one block, on the host."""
    return B.to_numpy(x.T @ B.xp_of(x).asarray(m))[None]


def _x_block(x, m):
    """``x m`` of one block, on the host."""
    return B.to_numpy(x @ B.xp_of(x).asarray(m))[:, None]


def _xt_product(xs, m) -> "da.Array":
    """``X^T M`` (samples, c), NumPy: ``xs`` the scaled data (variants, samples) on either backend,
    ``m`` (variants, c) on the host, chunked as ``xs``'s variants, in one chunk of columns."""
    m = m.rechunk((xs.chunks[0], -1))
    parts = da.blockwise(_xt_block, "kic", xs, "ki", m, "kc", adjust_chunks={"k": 1}, dtype=ACC,
                         meta=B.meta("cpu", ACC, 3))
    return parts.sum(axis=0)


def _x_product(xs, m) -> "da.Array":
    """``X M`` (variants, c), NumPy: ``m`` (samples, c) on the host."""
    m = m.rechunk((xs.chunks[1], -1))
    parts = da.blockwise(_x_block, "kic", xs, "ki", m, "ic", adjust_chunks={"i": 1}, dtype=ACC,
                         meta=B.meta("cpu", ACC, 3))
    return parts.sum(axis=1)


__all__ = ["count_call_alternate_alleles", "pca"]
