"""Association with polygenic effects: sgkit's ``regenie`` (its stacked ridge regressions over
blocks of variants, the whole-genome regression of REGENIE's first step) and
``regenie_loco_regression`` (the association test of each variant with its contig's LOCO
predictions taken out of the traits).

``regenie`` follows sgkit's algorithm (``sgkit.stats.regenie``) and its graph: stage 1 fits, for
each block of variants, ridge regressions of the traits on the covariates and the block's dosages
for a range of penalties (alphas), each sample block's predictions by the fit on the other sample
blocks (cross-validation); stage 2 fits ridge regressions of each trait on all stage 1
predictions and keeps the penalty of best mean R2 over the sample blocks; stage 3 drops, for each
contig, the stage 2 coefficients of the contig's own variant blocks (LOCO). Each stage is a Dask
graph over blocks of (samples, variants) of the dosages: a task holds one block, the products
over blocks are small (covariates + variants of a block squared), and the blocks are NumPy or
CuPy as the dosages are, so the heavy products run on the GPU when the dosages are there, and
out of core. Results are lazy, on the dosages' backend.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np
import xarray as xr

from ...backend import backend_of, c_aligned, linalg_raises, meta, to_backend, to_numpy, xp_of
from ...deferred import module as _deferred
from ...errors import InputError
from ._dataset import as_dask, merge as _merge, variable

da = _deferred("dask.array")  # imported when the first graph is built

DESC_BASE_PRED = "Predictions from base ridge regressors for every variant block, alpha, sample and outcome"
DESC_META_PRED = "Predictions from best meta ridge model selected through CV over sample blocks"
DESC_LOCO_PRED = ("Predictions from best meta ridge model omitting coefficients for variant blocks within individual "
                  "contigs (LOCO approximation)")
COMMENTS = {  # sgkit's documentation of its variables, which it sets as their "comment"
    "regenie_base_prediction": "REGENIE's base prediction (blocks, alphas, samples, outcomes). Stage 1\n"
    "predictions from ridge regression reduction.",
    "regenie_meta_prediction": "REGENIE's regenie_meta_prediction (samples, outcomes). Stage 2 predictions from\n"
    "the best meta estimator trained on the out-of-sample Stage 1 predictions.",
    "regenie_loco_prediction": "REGENIE's regenie_loco_prediction (contigs, samples, outcomes). LOCO predictions\n"
    "resulting from Stage 2 predictions ignoring effects for variant blocks on\n"
    "held out contigs. This will be absent if the data provided does not contain\n"
    "at least 2 contigs.",
    "variant_linreg_beta": "Beta values associated with each variant and trait.",
    "variant_linreg_t_value": "T statistics for each beta.",
    "variant_linreg_p_value": "P values as float in [0, 1].",
}
HERITABILITY = (0.99, 0.75, 0.5, 0.25, 0.01)


# --- block kernels (NumPy or CuPy, as their inputs) -----------------------------------------------


def _gram(x):
    return x.T @ x


def _cross(x, y):
    return x.T @ y


def _product(x, b):
    return x @ b


def _ridge(xtx, xty, *, alphas: tuple[float, ...], n_zero_reg: int):
    """sgkit's ``ridge_regression``: for each alpha, (XtX + alpha I)^-1 XtY, the first
    ``n_zero_reg`` diagonal terms (the covariates') 1 instead of alpha."""
    xp = xp_of(xtx)
    diags = []
    for alpha in alphas:
        diag = xp.full(xtx.shape[1], alpha, dtype=xtx.dtype)
        if n_zero_reg:
            diag[:n_zero_reg] = 1
        diags.append(xp.diag(diag))
    # solved rather than inverted then multiplied, as sgkit does: one LU factorization a matrix,
    # the same solution to rounding (3.2 s of regenie's 4.9 s went to the inverses on 2 cores)
    a = xtx + xp.stack(diags)
    with linalg_raises(xp):
        return xp.linalg.solve(a, xp.broadcast_to(xty, a.shape[:-2] + xty.shape[-2:])).astype(xtx.dtype)


def _r2(yp, yt):
    """sgkit's ``r2_score`` along the last axis: 1 - RSS / TSS, with its conventions for zeros."""
    xp = xp_of(yp)
    yp, yt = xp.broadcast_arrays(yp, yt)
    tot = ((yt - yt.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1, keepdims=True)
    res = ((yt - yp) ** 2).sum(axis=-1, keepdims=True)
    res_nz, tot_nz = res != 0, tot != 0
    alt = xp.where(res_nz & ~tot_nz, 0, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = xp.where(res_nz & tot_nz, 1 - res / tot, alt)
    return xp.squeeze(r2, axis=-1)


def _best(values, best, *, axis: int):
    """``values`` (alphas, ...) at the best alpha of each outcome (``best``: an index per outcome,
    whose axis in ``values`` is ``axis``), with the outcomes last."""
    outcomes = xp_of(values).arange(values.shape[axis])
    return (values[best, outcomes] if axis == 1 else values[best, :, outcomes]).T


# --- sgkit's stages ------------------------------------------------------------------------------


def _stack(x):
    return da.stack([x.blocks[i] for i in range(x.numblocks[0])])


def _unstack(x):
    return da.concatenate([x.blocks[i][0] for i in range(x.numblocks[0])])


def _ridge_regression_cv(X, Y, alphas: tuple[float, ...], n_zero_reg: int):
    """Ridge fits leaving out each sample block, and each block's predictions by its fit."""
    n_covar, n_outcome, n_alpha = X.shape[1], Y.shape[1], len(alphas)
    XtX = _stack(da.map_blocks(_gram, X, chunks=(n_covar,) * 2, dtype=X.dtype, meta=X._meta))
    XtY = _stack(da.map_blocks(_cross, X, Y, chunks=(n_covar, n_outcome), dtype=X.dtype, meta=X._meta))
    XtX = _unstack(XtX.sum(axis=0) - XtX)
    XtY = _unstack(XtY.sum(axis=0) - XtY)
    B = da.map_blocks(_ridge, XtX, XtY, chunks=(n_alpha, n_covar, n_outcome), new_axis=[0], alphas=alphas,
                      n_zero_reg=n_zero_reg, dtype=XtX.dtype, meta=meta(backend_of(X), XtX.dtype, 3))
    YP = da.map_blocks(_product, X, B, chunks=(n_alpha, X.chunks[0], n_outcome), dtype=X.dtype,
                       meta=meta(backend_of(X), X.dtype, 3))
    return B, YP


def _alphas(n_cols: int) -> tuple[float, ...]:
    return tuple(n_cols / h for h in HERITABILITY)


def _stage_1(G, X, Y, alphas):
    alphas = alphas or _alphas(G.shape[1])
    YP = []
    for i in range(G.numblocks[1]):
        XGB = da.concatenate((X, G.blocks[:, i]), axis=1).rechunk(chunks=(None, -1))
        YP.append(_ridge_regression_cv(XGB, Y, alphas, n_zero_reg=X.shape[1])[-1])
    return da.stack(YP, axis=0)  # (variant blocks, alphas, samples, outcomes)


def _stage_2(YP, X, Y, alphas):
    n_variant_block, n_alpha_1 = YP.shape[:2]
    n_sample_block = Y.numblocks[0]
    n_sample, n_outcome = Y.shape
    YP = (YP - YP.mean(axis=2, keepdims=True)) / YP.std(axis=2, keepdims=True)  # sgkit's normalize
    YP = YP.transpose((3, 2, 0, 1))
    alphas = alphas or _alphas(n_variant_block * n_alpha_1)
    YR, BR = [], []
    for i in range(n_outcome):
        XPB = da.concatenate((X, YP[i].reshape((n_sample, n_variant_block * n_alpha_1))), axis=1)
        BB, YPB = _ridge_regression_cv(XPB.rechunk(chunks=(None, -1)), Y[:, [i]], alphas, n_zero_reg=X.shape[1])
        BR.append(BB)
        YR.append(YPB)
    YR = da.transpose(da.concatenate(YR, axis=2), (0, 2, 1)).rechunk((-1, -1, None))  # (alphas, outcomes, samples)
    BR = da.concatenate(BR, axis=2).rechunk((-1, None, -1))  # (alphas, sample blocks x indvar, outcomes)
    YT = Y.T
    R2 = da.stack([
        da.map_blocks(_r2, YR.blocks[..., i], YT.blocks[..., i][None], drop_axis=2, dtype=YR.dtype,
                      meta=meta(backend_of(YR), YR.dtype, 2))
        if YR.chunks[-1][i] > 1 else da.full_like(YR.blocks[..., i][..., 0], np.nan)
        for i in range(n_sample_block)
    ])  # (sample blocks, alphas, outcomes)
    R2 = da.where(da.isfinite(R2), R2, np.nan)
    best = da.argmax(da.nanmean(R2, axis=0), axis=0)  # the best alpha of each outcome
    YRM = da.blockwise(_best, "so", YR, "aos", best, "o", axis=1, concatenate=True, dtype=YR.dtype,
                       meta=meta(backend_of(YR), YR.dtype, 2))
    BRM = da.blockwise(_best, "io", BR, "aio", best, "o", axis=2, concatenate=True, dtype=BR.dtype,
                       meta=meta(backend_of(BR), BR.dtype, 2))
    return BRM, YRM


def _stage_3(B, YP, X, Y, contigs: np.ndarray, variant_chunk_start: np.ndarray):
    n_covar = X.shape[1]
    n_variant_block, n_alpha_1 = YP.shape[:2]
    n_sample_block = Y.numblocks[0]
    n_sample, n_outcome = Y.shape
    unique_contigs = np.unique(contigs)
    if len(unique_contigs) <= 1:
        return None
    variant_block_contigs = contigs[variant_chunk_start]
    B = da.transpose(da.stack([B.blocks[i] for i in range(n_sample_block)], axis=0), (2, 0, 1))
    BX = B[..., :n_covar]
    BYP = B[..., n_covar:].reshape((n_outcome, n_sample_block, n_variant_block, n_alpha_1))
    YP = da.transpose(YP, (3, 2, 0, 1))  # (outcomes, samples, variant blocks, alphas)
    XYP = da.broadcast_to(X, (n_outcome, n_sample, n_covar))

    def apply(YP, BYP):
        BG = da.concatenate((BX, BYP.reshape((n_outcome, n_sample_block, -1))), axis=-1).rechunk((-1, None, -1))
        XG = da.concatenate((XYP, YP.reshape((n_outcome, n_sample, -1))), axis=-1).rechunk((-1, None, -1))
        YG = da.map_blocks(_loco_product, XG, BG, chunks=(n_outcome, Y.chunks[0], 1), dtype=XG.dtype, meta=XG._meta)
        return da.squeeze(YG, axis=-1).T

    YC = []
    for contig in unique_contigs:
        other = variant_block_contigs != contig
        YC.append(apply(YP[:, :, other, :], BYP[:, :, other, :]))
    return da.stack(YC, axis=0)


def _loco_product(x, b):
    return x @ b.transpose((0, 2, 1))


def _index_array_blocks(x: np.ndarray, size: int, op: str) -> tuple[np.ndarray, np.ndarray]:
    """sgkit's ``index_array_blocks``: blocks of at most ``size`` variants, none across contigs."""
    if x.size == 0:
        return np.empty(0, dtype=int), np.empty(0, dtype=int)
    if size <= 0:
        raise InputError(f"{op}: variant_block_size must be > 0, got {size}")
    if np.any(np.diff(x) < 0):
        raise InputError(f"{op}: the variants must be sorted by contig (variant_contig increasing)")
    breaks = np.argwhere(np.diff(x, prepend=x[0]))[:, 0]
    breaks = np.concatenate(([0], breaks, [x.size]))
    index = np.concatenate([np.arange(breaks[i], breaks[i + 1], size) for i in range(breaks.size - 1)])
    return index, np.diff(index, append=x.size)


def _variant_blocks(size, contigs: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(size, tuple):
        sizes = np.asarray(size)
        if sizes.sum() != contigs.size or np.any(sizes <= 0) or sizes.dtype.kind not in "iu":
            raise InputError(f"{op}: variant_block_size {size} must be positive integers adding up to the "
                             f"number of variants ({contigs.size})")
        return np.cumsum(np.concatenate(([0], sizes)))[:-1], sizes
    if isinstance(size, (int, np.integer)):
        return _index_array_blocks(contigs, int(size), op)
    raise InputError(f"{op}: variant_block_size must be an int or a tuple of ints, got {type(size).__name__}")


def _split(n: int, blocks: int) -> tuple[int, ...]:
    """sgkit's ``split_array_chunks``: ``n`` in ``blocks`` sizes, the larger first."""
    div, mod = divmod(n, blocks)
    return mod * (div + 1,) + (blocks - mod) * (div,)


def _columns(ds: xr.Dataset, names, what: str, op: str, backend: str):
    """sgkit's ``concat_2d``: the variables ``names`` as columns of one (samples, columns) array."""
    names = [names] if isinstance(names, Hashable) else list(names)
    out = []
    for name in names:
        x = variable(ds, name, None, "iuf", op=op)
        if x.ndim not in (1, 2) or x.dims[0] != "samples":
            raise InputError(f"{op}: {what} variable {name!r} has dimensions {tuple(map(str, x.dims))}, "
                             "expected ('samples',) or ('samples', <one more>)")
        a = to_backend(as_dask(x), backend)
        out.append(a[:, None] if a.ndim == 1 else a)
    if not out:
        raise InputError(f"{op}: no {what} variables given")
    return da.concatenate([c.rechunk((-1, -1)) for c in out], axis=1)


def regenie(ds: xr.Dataset, *, dosage: str, covariates: Hashable | Sequence[Hashable],
            traits: Hashable | Sequence[Hashable], variant_contig: Hashable = "variant_contig",
            variant_block_size: int | tuple[int, ...] | None = None,
            sample_block_size: int | tuple[int, ...] | None = None, alphas: Sequence[float] | None = None,
            add_intercept: bool = True, normalize: bool = False, orthogonalize: bool = False, merge: bool = True,
            **kwargs: Any) -> xr.Dataset:
    """sgkit's ``regenie``: ``regenie_base_prediction`` (blocks, alphas, samples, outcomes),
    ``regenie_meta_prediction`` (samples, outcomes) and, with two contigs or more,
    ``regenie_loco_prediction`` (contigs, samples, outcomes), of the ``traits`` from the
    ``dosage`` (variants, samples) and ``covariates``. ``variant_block_size``: variants per block
    (default min(1000, variants / 2)), never across contigs, or the blocks' sizes;
    ``sample_block_size``: the sample blocks of the cross-validation (default 10 blocks), or their
    sizes. ``kwargs``: sgkit's ``_glow_adj_*`` switches are not supported."""
    op = "regenie"
    if kwargs:
        raise InputError(f"{op}: unexpected arguments {', '.join(map(repr, kwargs))}")
    g = variable(ds, dosage, kind="iuf", op=op)
    if g.ndim != 2 or g.dims[0] != "variants":
        raise InputError(f"{op}: variable {dosage!r} has dimensions {tuple(map(str, g.dims))}, "
                         "expected (variants, samples)")
    contig_var = variable(ds, variant_contig, ("variants",), "iu", op=op)
    backend = backend_of(g.data)
    G = as_dask(g).T
    X = _columns(ds, covariates, "covariate", op, backend)
    Y = _columns(ds, traits, "trait", op, backend)
    n_sample, n_variant = G.shape
    if not G.shape[0] == X.shape[0] == Y.shape[0]:
        raise InputError(f"{op}: the dosage, covariates and traits differ in samples: "
                         f"{G.shape[0]}, {X.shape[0]}, {Y.shape[0]}")
    alphas = tuple(float(a) for a in alphas) if alphas is not None else None
    if variant_block_size is None:
        variant_block_size = min(1000, n_variant // 2)
    if sample_block_size is None:
        sample_block_size = _split(n_sample, min(10, n_sample))
    if normalize:
        G = (G - G.mean(axis=0)) / G.std(axis=0)
        Y = (Y - Y.mean(axis=0)) / Y.std(axis=0)
        X = (X - X.mean(axis=0)) / X.std(axis=0)
    if add_intercept:
        X = da.concatenate([da.ones_like(X, shape=(n_sample, 1), dtype=X.dtype), X], axis=1)
    if orthogonalize:
        G = G - X @ da.linalg.lstsq(X, G)[0]
        Y = Y - X @ da.linalg.lstsq(X, Y)[0]
        G = G / G.std(axis=0)
        Y = Y / Y.std(axis=0)
        X = da.zeros_like(G, shape=(n_sample, 0), dtype=G.dtype)
    contigs = to_numpy(contig_var.data)  # one number a variant: where the blocks of variants end
    starts, sizes = _variant_blocks(variant_block_size, contigs, op)
    try:
        G = G.rechunk(chunks=(sample_block_size, tuple(int(s) for s in sizes)))
        X = X.rechunk(chunks=(sample_block_size, -1))
        Y = Y.rechunk(chunks=(sample_block_size, -1))
    except ValueError as e:
        raise InputError(
            f"{op}: sample_block_size {sample_block_size!r} does not fit {n_sample} samples ({e})") from None
    YP1 = _stage_1(G, X, Y, alphas)
    B2, YP2 = _stage_2(YP1, X, Y, alphas)
    YP3 = _stage_3(B2, YP1, X, Y, contigs, starts)
    new = {
        "regenie_base_prediction": (("blocks", "alphas", "samples", "outcomes"), YP1, DESC_BASE_PRED),
        "regenie_meta_prediction": (("samples", "outcomes"), YP2, DESC_META_PRED),
    }
    if YP3 is not None:
        new["regenie_loco_prediction"] = (("contigs", "samples", "outcomes"), YP3, DESC_LOCO_PRED)
    out = xr.Dataset({name: (dims, data, {"description": desc, "comment": COMMENTS[name]})
                      for name, (dims, data, desc) in new.items()})
    return _merge(ds, out, merge)


def regenie_loco_regression(ds: xr.Dataset, *, dosage: Hashable, covariates: Hashable, traits: Hashable,
                            variant_contig: Hashable = "variant_contig",
                            regenie_loco_prediction: Hashable = "regenie_loco_prediction", add_intercept: bool = True,
                            call_genotype: Hashable = "call_genotype", merge: bool = True) -> xr.Dataset:
    """sgkit's ``regenie_loco_regression``: ``variant_linreg_beta``, ``variant_linreg_t_value``
    and ``variant_linreg_p_value`` (variants, traits), the linear regression of each variant's
    dosage on the traits, covariates projected out of both, the traits centred, scaled and less
    the LOCO predictions of the variant's contig (``regenie_loco_prediction``, from
    :func:`regenie`; contig i of the predictions is ``variant_contig`` i). As sgkit's, the results
    come contig by contig (the variants' order where they are sorted by contig). The blocks of
    dosages go through the regression kernel of ``gwas_linear_regression`` on their backend; the
    covariates' and traits' matrices, a few numbers a sample, are made on the host."""
    from ... import kernels
    from .gwas import _qr_on_host, regression_terms

    op = "regenie_loco_regression"
    g = variable(ds, dosage, kind="iuf", op=op)
    if g.ndim != 2:
        raise InputError(f"{op}: variable {dosage!r} has dimensions {tuple(map(str, g.dims))}, "
                         "expected (variants, samples)")
    contigs = to_numpy(variable(ds, variant_contig, ("variants",), "iu", op=op).data)
    loco = variable(ds, regenie_loco_prediction, kind="f", op=op)
    if loco.ndim != 3:
        raise InputError(f"{op}: variable {regenie_loco_prediction!r} has dimensions {tuple(map(str, loco.dims))}, "
                         "expected (contigs, samples, outcomes)")
    n_contig = len(np.unique(contigs))
    if n_contig != loco.shape[0]:
        raise InputError(f"{op}: The number of contigs provided ({n_contig}) does not match number of contigs in "
                         f"LOCO predictions ({loco.shape[0]}, {regenie_loco_prediction!r})")
    backend = backend_of(g.data)
    X = _columns(ds, covariates, "covariate", op, "cpu")
    if add_intercept:
        X = da.concatenate([da.ones((X.shape[0], 1), dtype=X.dtype, chunks=-1), X], axis=1)
    dof = X.shape[0] - X.shape[1] - 1
    if dof < 1:
        raise InputError(f"{op}: too few samples for the regression's statistics: the samples ({X.shape[0]}) must "
                         f"outnumber the covariates, intercept included ({X.shape[1]}), by at least two")
    Q = X.rechunk((-1, -1)).map_blocks(_qr_on_host, dtype=X.dtype, meta=meta("cpu", X.dtype, 2))
    Y = _columns(ds, traits, "trait", op, "cpu")
    if Y.shape[1] != loco.shape[2] or loco.shape[1] != Y.shape[0]:
        raise InputError(f"{op}: {regenie_loco_prediction!r} has shape {loco.shape}, expected (contigs, {Y.shape[0]}, "
                         f"{Y.shape[1]}) for the traits")
    # centred, covariates projected out and scaled, in one host task (``gwas.regression_terms``
    # says why): in the dtype that sgkit's formulas give
    dtype = np.result_type(Q.dtype, Y.dtype, np.float64 if Y.dtype.kind in "iub" else Y.dtype)
    Y = Y.rechunk((-1, -1))
    Y = da.map_blocks(_loco_traits, Q, Y, dtype, dtype=dtype, chunks=Y.chunks, meta=meta("cpu", dtype, 2))
    offsets = to_backend(as_dask(loco), "cpu")  # (contigs, samples, traits): small, to the host with Q
    linreg, p_value = kernels.get("linreg_block", backend), kernels.get("linreg_p_value", backend)
    G = as_dask(g).rechunk({1: -1})
    results = []
    for contig in range(loco.shape[0]):
        w, gram, qyp, yps = regression_terms(Q, Y - offsets[contig])
        stats = da.blockwise(_linreg, "vtk", linreg, None, G[contigs == contig], "vs", w, "sc", gram, "pq",
                             qyp, "pt", yps, "t", dof, None,
                             new_axes={"k": 2}, concatenate=True, dtype=np.float64, meta=meta("cpu", np.float64, 3))
        t = stats[..., 1]
        p = t.map_blocks(p_value, dof, dtype=np.float64, meta=meta("cpu", np.float64, 2))
        results.append((stats[..., 0], t, p))
    dims = ("variants", "traits")
    new = xr.Dataset({
        name: (dims, to_backend(da.concatenate([r[i] for r in results], axis=0), backend), {"comment": COMMENTS[name]})
        for i, name in enumerate(("variant_linreg_beta", "variant_linreg_t_value", "variant_linreg_p_value"))
    })
    return _merge(ds, new, merge)


def _linreg(kernel, g, w, gram, qyp, yps, dof: int):
    return kernel(g, w=w, gram=gram, qyp=qyp, yps=yps, dof=dof)


def _loco_traits(q, y, dtype):
    """sgkit's traits for the LOCO regression: centred (in their own dtype), the covariates'
    basis ``q`` projected out and each scaled to unit variance (in ``dtype``), from C-ordered,
    aligned copies of the blocks."""
    y = c_aligned(y)
    y = c_aligned(y - y.mean(axis=0), dtype)
    q = c_aligned(q, dtype)
    y = y - q @ (q.T @ y)
    return y / np.sqrt(np.sum(y**2, axis=0) / (y.shape[0] - q.shape[1]))[None, :]


def genee(ds: xr.Dataset, ld, *, reg_covar: float = 1e-06):
    """sgkit's ``genee``: the GENEE gene-level test of each window (``window_start``,
    ``window_stop``) from the variants' effect sizes ``beta`` and their LD matrix ``ld``
    (variants, variants; NumPy, CuPy or Dask). Returns a Dask DataFrame of ``test_q``, ``q_var``
    and ``pval`` (float32), a row a window, as sgkit's.

    As in sgkit, the variance of the null effects comes first, eagerly, from Gaussian mixtures
    fitted to ``beta`` (scikit-learn's, as sgkit's, with its seed); each window's test is then a
    small eigenvalue problem of its block of ``ld``, on the host (a block crosses there from the
    GPU), one task per group of windows."""
    op = "genee"
    beta = variable(ds, "beta", ("variants",), "f", op=op)
    starts = to_numpy(variable(ds, "window_start", ("windows",), "iu", op=op).data).astype(np.int64)
    stops = to_numpy(variable(ds, "window_stop", ("windows",), "iu", op=op).data).astype(np.int64)
    n = beta.shape[0]
    if not hasattr(ld, "shape") or tuple(ld.shape) != (n, n):
        raise InputError(
            f"{op}: ld has shape {getattr(ld, 'shape', None)}, expected ({n}, {n}) for the variants of 'beta'")
    if np.any(starts < 0) or np.any(stops > n) or np.any(stops <= starts):
        raise InputError(f"{op}: the windows (window_start, window_stop) must be non-empty ranges of the {n} variants")
    betas = to_numpy(beta.data)[:, None]  # one number a variant, as sgkit reads it
    epsilon = _genee_em(betas, reg_covar)
    ld = ld if isinstance(ld, da.Array) else da.from_array(ld, chunks=-1, asarray=False)
    import dask
    import dask.dataframe as dd
    import pandas as pd

    meta_df = pd.DataFrame({c: pd.Series(dtype=np.float32) for c in GENEE_COLUMNS})
    parts = []
    for first in range(0, len(starts), GENEE_WINDOWS_A_TASK):
        s, e = starts[first:first + GENEE_WINDOWS_A_TASK], stops[first:first + GENEE_WINDOWS_A_TASK]
        lo, hi = int(s.min()), int(e.max())
        task = dask.delayed(_genee_windows)(ld[lo:hi, lo:hi], betas[lo:hi], s - lo, e - lo, epsilon, first, op)
        parts.append(task)
    return dd.from_delayed(parts, meta=meta_df, verify_meta=False)


GENEE_COLUMNS = ("test_q", "q_var", "pval")
GENEE_WINDOWS_A_TASK = 256


def _genee_em(betas: np.ndarray, reg_covar: float) -> float:
    """sgkit's ``genee_EM``: the second largest variance of the best (by BIC) Gaussian mixture of
    1 to 9 components, or the one variance of a single component. (sgkit indexes the squeezed
    variances of a single component, a 0-d array, and raises ``IndexError`` there: its line is
    excluded from its tests' coverage. Here the one variance is returned, as its code means.)"""
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError as e:
        raise ImportError("genee fits Gaussian mixtures with scikit-learn, which is not installed") from e
    lowest_bic, best = np.inf, None
    for n_components in range(1, 10):
        gmm = GaussianMixture(n_components=n_components, reg_covar=reg_covar, random_state=0).fit(betas)
        bic = gmm.bic(betas)
        if bic < lowest_bic:
            lowest_bic, best = bic, gmm
    covars = np.atleast_1d(best.covariances_.squeeze())
    return covars[0] if best.n_components == 1 else np.sort(covars)[::-1][1]


def _genee_windows(ld, betas, starts, stops, epsilon: float, first: int, op: str):
    """sgkit's ``genee_test`` of each window: the sum of squared effects, its variance and its
    p-value (Hall-Buckley-Eagleson's approximation of a weighted sum of chi-squares, whose weights
    are the eigenvalues of the window's LD times ``epsilon``)."""
    import pandas as pd
    from scipy.stats import gamma

    ld = to_numpy(ld)
    rows = []
    for start, stop in zip(starts, stops):
        x = ld[start:stop, start:stop] * epsilon
        e_values = _positive_real(np.linalg.eigvals(x))
        b = betas[start:stop]
        q = (b.T @ b).item()
        if q <= 0:
            raise InputError(f"{op}: window {first + len(rows)} has no effect (its betas are all 0): no test")
        k1, k2, k3 = e_values.sum(), 2 * (e_values**2).sum(), 8 * (e_values**3).sum()
        nu = 8 * k2**3 / k3**2
        p = 1.0 - gamma.cdf((2 * nu / k2) ** 0.5 * (q - k1) + nu, a=nu / 2, scale=2)
        rows.append((q, np.diag(x @ x).sum(), _positive_real(np.atleast_1d(p)).item()))
    df = pd.DataFrame(rows, columns=list(GENEE_COLUMNS), index=pd.RangeIndex(first, first + len(rows)))
    return df.astype(np.float32)


def _positive_real(x):
    """sgkit's ``ensure_positive_real``: real parts (where the imaginary are negligible), and 1e-20
    for values not above 0."""
    x = np.real_if_close(x)
    x[x <= 0.0] = 1e-20
    return x


__all__ = ["genee", "regenie", "regenie_loco_regression"]
