"""Association tests: sgkit's ``gwas_linear_regression`` (``sgkit.stats.association``, 0.10).

One ordinary least squares regression of each trait on each variant's dosage and the covariates,
reporting the dosage's coefficient, its t statistic and its p-value. As in sgkit, the covariates
(with a column of ones, the intercept, unless ``add_intercept=False``) are projected out once:
Q, an orthonormal basis of them, comes from a QR factorization (``dask.array.linalg.qr``, in
the covariates' dtype as sgkit's), and the traits' residuals Y_P = Y - Q (Q^T Y) are computed
once. Then each block of variants (all samples) is one matrix product with [Q | Y_P] and one
sum of squares (:func:`pipeline.kernels.gwas.linreg_block`, NumPy or CuPy, float64), and the
p-values follow from the t statistics (SciPy's Student t, on the host: the statistics are small).
The covariates' matrices and the statistics stay on the host on either backend; the results go
to the dosage's backend.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ...backend import c_aligned, meta, to_backend
from ...deferred import module as _deferred
from ...errors import InputError
from ...reduce.declare import declare
from ..registry import register
from . import specs
from ._dataset import as_dask, backend_of_dataset, merge as merge_datasets, variable
from .variables import DOSAGE, SAMPLE_COLUMNS, V, Add, Declared, Read, add

da = _deferred("dask.array")  # imported when the first graph is built


def _columns(ds: xr.Dataset, names: list[str], what: str, op: str, backend: str) -> list:
    """The variables ``names`` as Dask arrays (samples, columns) on ``backend`` (the dosage's; a
    flow's source keeps small per-sample variables on the host): a 1-D variable is one column, a
    2-D one its columns, as sgkit's ``concat_2d``. (sgkit leaves out, silently, a variable whose
    first dimension is not ``samples``; here that is an error.)"""
    out = []
    for name in names:
        x = variable(ds, name, None, "iufb", op=op)
        if x.ndim not in (1, 2) or x.dims[0] != "samples":
            raise InputError(
                f"{op}: {what} variable {name!r} has dimensions {tuple(map(str, x.dims))}, "
                "expected ('samples',) or ('samples', <one more>)"
            )
        a = to_backend(as_dask(x), backend)
        out.append(a[:, None] if a.ndim == 1 else a)
    return out


def _names(value, what: str, op: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(n, str) for n in names):
        raise InputError(f"{op}: {what} must be a variable name or a list of them, got {value!r}")
    return names


def _linreg_task(kernel, g, w, gram, qyp, yps, dof: int):
    return kernel(g, w=w, gram=gram, qyp=qyp, yps=yps, dof=dof)


@register(kernels=("linreg_block", "linreg_p_value"), dataset=True, variables=Declared(
    needs=(Read("{dosage}", DOSAGE, "iuf"), Read("{covariates}", SAMPLE_COLUMNS, "iufb"),
           Read("{traits}", SAMPLE_COLUMNS, "iufb")),
    # sgkit's specs give the beta and t values no kind of values
    adds=(Add("variant_linreg_beta", (V, "traits"), "f"), Add("variant_linreg_t_value", (V, "traits"), "f"),
          add(specs.variant_linreg_p_value_spec)),
))
def gwas_linear_regression(
    ds: xr.Dataset,
    *,
    dosage: str,
    covariates: str | list[str],
    traits: str | list[str],
    add_intercept: bool = True,
    call_genotype: str = "call_genotype",
    merge: bool = True,
) -> xr.Dataset:
    """Linear regression of each trait on each variant's dosage, covariates projected out, as
    sgkit's ``gwas_linear_regression``.

    ``dosage`` (variants, samples; integers or floats, no missing values: sgkit's regression
    has none); ``covariates`` and ``traits``: names of 1-D (samples) or 2-D (samples, *)
    variables, concatenated as columns in the order given. ``add_intercept`` adds a column of
    ones before the covariates (float32 where there are no covariates, as in sgkit; the results
    are valid only with an intercept, as sgkit warns). ``call_genotype`` is accepted for sgkit's
    signature; sgkit 0.10 requires ``dosage`` and reads only it.

    Returns ``variant_linreg_beta``, ``variant_linreg_t_value`` and ``variant_linreg_p_value``
    (variants, traits): float64 (float32 where the dosage, the covariates and the traits all
    are), p-values float64 from the t distribution with n_samples - n_covariates - 1 degrees of
    freedom (the intercept counts as a covariate). NaN for a variant that does not vary once the
    covariates are projected out (0 / 0, as in sgkit). Lazy: nothing is computed.
    """
    op = gwas_linear_regression.op
    covariates = _names(covariates, "covariates", op.name)
    traits = _names(traits, "traits", op.name)
    if not traits:
        raise InputError(f"{op.name}: no traits given")
    g = variable(ds, dosage, ("variants", "samples"), "iuf", op=op.name)
    backend = backend_of_dataset(g)
    n = ds.sizes["samples"]

    # the covariates and traits, and every (samples, columns) matrix made of them, on the host
    # whatever the backend: they are small, and on the GPU each of CuPy's formulas compiled a
    # kernel on a fresh machine; the block kernel moves what it needs to the device
    columns = _columns(ds, covariates, "covariate", op.name, "cpu")
    if not columns and not add_intercept:
        raise InputError(f"{op.name}: add_intercept must be True if no covariates are given")
    if columns:
        x = da.concatenate([c.rechunk((-1, -1)) for c in columns], axis=1)
    if add_intercept:
        dtype = x.dtype if columns else np.float32  # sgkit: a float32 intercept alone
        ones = da.ones((n, 1), dtype=dtype, chunks=-1)
        x = da.concatenate([ones, x], axis=1) if columns else ones
    x = x.rechunk((-1, -1))
    p = x.shape[1]
    dof = n - p - 1
    if dof < 1:
        raise InputError(
            f"{op.name}: too few samples for the regression's statistics: the samples ({n}) must "
            f"outnumber the covariates, intercept included ({p}), by at least two"
        )
    # in the covariates' dtype, as sgkit's (float32 for the lone intercept), by LAPACK (sgkit's):
    # cuSOLVER's float32 Q differs in the last places, which moved GPU betas by 2e-5 relative
    q = x.map_blocks(_qr_on_host, dtype=x.dtype, meta=meta("cpu", x.dtype, 2))
    y = da.concatenate([c.rechunk((-1, -1)) for c in _columns(ds, traits, "trait", op.name, "cpu")], axis=1)
    y = y.rechunk((-1, -1))
    out_dtype = np.result_type(g.dtype, q.dtype, y.dtype)
    out_dtype = out_dtype if out_dtype.kind == "f" and out_dtype.itemsize >= 4 else np.dtype(np.float64)
    # sgkit's products promote Q and Y to float64 against float64 operands: the same values
    yp = da.map_blocks(_residuals, q, y, dtype=np.float64, chunks=y.chunks, meta=meta("cpu", np.float64, 2))
    w, gram, qyp, yps = regression_terms(q, yp)

    gd = as_dask(g)
    sample_chunks = len(gd.chunks[1])
    # blocks of variants split first (views of the blocks read), then every sample of a block of
    # variants in one task
    gd = gd.rechunk({0: _split_rows(gd.chunks[0], n, backend)}).rechunk({1: -1})
    stats = da.blockwise(
        _linreg_task, "vtk",
        op.kernel("linreg_block", backend), None, gd, "vs", w, "sc", gram, "pq", qyp, "pt", yps, "t", dof, None,
        new_axes={"k": 2}, concatenate=True, dtype=np.float64, meta=meta("cpu", np.float64, 3),
    )  # on the host on either backend (linreg_block_gpu finishes there)
    if sample_chunks > 1:
        # a block of all samples is cut from a block of each chunk of samples, which stay alive
        # until every cut of them is made: that many more blocks a thread, for the memory plan
        # (10 GB of float64 dosages in 3 chunks of samples overran a 3.3 GB device budget at 5
        # threads, planned with two blocks a thread)
        declare(stats, extra_blocks=sample_chunks)
    beta = stats[..., 0].astype(out_dtype)
    t = stats[..., 1].astype(out_dtype)
    pval = t.map_blocks(op.kernel("linreg_p_value", backend), dof, dtype=np.float64, meta=meta("cpu", np.float64, 2))
    new = xr.Dataset(
        {
            "variant_linreg_beta": (("variants", "traits"), to_backend(beta, backend)),
            "variant_linreg_t_value": (("variants", "traits"), to_backend(t, backend)),
            "variant_linreg_p_value": (("variants", "traits"), to_backend(pval, backend)),
        }
    )
    return merge_datasets(ds, new, merge)


__all__ = ["gwas_linear_regression"]


def _split_rows(chunks: tuple[int, ...], n_samples: int, backend: str) -> tuple[int, ...]:
    """Blocks of variants whose float64 copy (the kernel's working block) fits the block size the
    backend reads (:func:`pipeline.exec.memory.block_target`): on the GPU a block reads several
    stored chunks of int8 calls, and its float64 copy is eight times larger (30,000 variants x
    25,000 samples: 6 GB a block, which eight threads overran 120 GB of device memory with).
    Stored blocks are split, never merged (a split is a view of the block read). The CPU's
    kernel works in slabs of its own (``pipeline.kernels.gwas.linreg_block_cpu``)."""
    from ...exec.memory import block_target
    from ._dataset import even_chunks

    target = block_target(backend) if backend == "gpu" else 0
    if not target:
        return chunks
    rows = max(1, target // (max(1, n_samples) * np.dtype(np.float64).itemsize))
    return tuple(c for chunk in chunks for c in even_chunks(chunk, rows))


def _qr_on_host(block):
    """The reduced QR's Q of one (samples, covariates) block, computed by NumPy (LAPACK, as
    sgkit's ``dask.array.linalg.qr`` of one block)."""
    return np.linalg.qr(c_aligned(block))[0]


# The covariates' and traits' matrices (samples x a few columns) are made on the host, one task
# for each, from C-ordered, aligned float64 copies of their inputs (``backend.c_aligned``). A
# product's last bits depend on its operands' memory order (BLAS takes another path for a
# transposed operand) and alignment, and both depend on where a task ran. Made in dask's graph of
# transposes and products, these matrices differed in the last bits between runs on a cluster,
# and so did the betas.
F8 = np.float64


def _residuals(q, y):
    """Y_P = Y - Q (Q^T Y): the traits ``y`` with the covariates' basis ``q`` projected out, float64."""
    q, y = c_aligned(q, F8), c_aligned(y, F8)
    return y - q @ (q.T @ y)


def _with_residuals(q, yp):
    """W = [Q | Y_P], float64."""
    return np.concatenate([c_aligned(q, F8), c_aligned(yp, F8)], axis=1)


def _gram(w, p: int):
    q = c_aligned(w[:, :p], F8)
    return q.T @ q


def _q_yp(w, p: int):
    return c_aligned(w[:, :p], F8).T @ c_aligned(w[:, p:], F8)


def _sum_squares(w, p: int):
    yp = c_aligned(w[:, p:], F8)
    return (yp * yp).sum(axis=0)


def regression_terms(q, yp):
    """The regression kernel's covariate terms (:func:`pipeline.kernels.gwas.linreg_block`) from
    the covariates' basis ``q`` (samples, p) and the traits' residuals ``yp`` (samples, traits),
    each one chunk: W = [Q | Y_P], Q^T Q, Q^T Y_P and |Y_P|^2, float64 Dask arrays of one chunk,
    each made by one host task (above: the same bits wherever it runs)."""
    p, t = q.shape[1], yp.shape[1]
    w = da.map_blocks(_with_residuals, q.rechunk((-1, -1)), yp.rechunk((-1, -1)), dtype=F8,
                      chunks=((q.shape[0],), (p + t,)), meta=meta("cpu", F8, 2))
    gram = w.map_blocks(_gram, p, dtype=F8, chunks=((p,), (p,)), meta=meta("cpu", F8, 2))
    qyp = w.map_blocks(_q_yp, p, dtype=F8, chunks=((p,), (t,)), meta=meta("cpu", F8, 2))
    yps = w.map_blocks(_sum_squares, p, dtype=F8, chunks=((t,),), drop_axis=0, meta=meta("cpu", F8, 1))
    return w, gram, qyp, yps
