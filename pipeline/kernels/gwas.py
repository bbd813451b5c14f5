"""Linear regression of traits on each variant's dosage, covariates projected out: one block of
variants at a time (``linreg_block``), and the p-values of its t statistics (``linreg_p_value``).

sgkit (``sgkit.stats.association.linear_regression``) projects the covariates out of the
dosages, G_P = G - (G Q) Q^T (Q: the covariates' QR basis, samples x p), then for each variant
and trait: beta = (G_P . Y_P) / |G_P|^2, RSS = |Y_P - beta G_P|^2, t = beta / sqrt(RSS / dof /
|G_P|^2). Forming G_P and the residuals takes two (variants, samples) float64 temporaries and a
(samples, variants, traits) one. The same quantities follow from A = G Q instead:

    G [Q | Y_P]              one matrix product of the block: A and G Y_P
    |G_P|^2 = |G|^2 - 2 |A|^2 + A (Q^T Q) . A
    G_P . Y_P = G Y_P - A (Q^T Y_P)
    RSS = |Y_P|^2 - beta (G_P . Y_P)

so the block is read once, by one product and one sum of squares, in float64. Q^T Q is I for an
orthonormal Q, but not for the float32 Q that sgkit makes for a lone float32 intercept (its
columns are unit vectors to float32 rounding only): with Q^T Q kept, these are identities for
any Q, and the results agree with sgkit's to float64 rounding in every case. Rounding is
relative to |G|^2 and |Y_P|^2, so a variant that is (nearly) a combination of the covariates, or
that explains (nearly) all of a trait's variance left by them, loses digits here as in sgkit
(both are cancellations).

On the GPU, the block's product and its rows' sums of squares are made on the device, and the
rest, a few numbers per variant, on the host (``linreg_block_gpu``).

p-values: 2 * t.sf(|t|, dof) by SciPy on the host, on both backends. The (variants, traits)
statistics are a few bytes per variant against the block's samples, and SciPy's Student t is
the one sgkit uses, so the p-values are sgkit's to the bit; a device formula (an incomplete beta
function in CuPy) would differ in the last places.
"""

from __future__ import annotations

import numpy as np

from ..backend import c_aligned, to_numpy, xp_of
from . import launch
from .slabs import SLAB_BYTES, map_slabs, temporaries

ACC = np.float64


def linreg_block(g, *, w, gram, qyp, yps, dof: int):
    """beta and t (float64, (variants, traits, 2)) for a block of dosages ``g`` (variants,
    samples; any numeric type), given ``w`` = [Q | Y_P] (samples, p + traits), ``gram`` = Q^T Q
    (p, p), ``qyp`` = Q^T Y_P (p, traits), ``yps`` = |Y_P|^2 per trait and ``dof``. NaN where a
    variant does not vary once the covariates are out (0 / 0), as in sgkit. Written against the
    array module of ``g``."""
    xp = xp_of(g)
    # C-ordered, aligned float64 (such a block is used as it is): the product's last bits depend
    # on its operands' order and alignment, and those on whether a block crossed between workers
    gf, w, gram, qyp = (c_aligned(m, ACC) for m in (g, w, gram, qyp))
    return _finish(gf @ w, xp.einsum("ij,ij->i", gf, gf), gram=gram, qyp=qyp, yps=yps, dof=dof)


def _finish(gw, gg, *, gram, qyp, yps, dof: int):
    """beta and t from a block's products ``gw`` = G [Q | Y_P] and its rows' sums of squares
    ``gg`` = |G|^2 (a few numbers per variant)."""
    xp = xp_of(gw)
    p = gram.shape[0]
    a, gy = gw[:, :p], gw[:, p:]  # A = G Q, and G Y_P
    aa = xp.einsum("ij,ij->i", a, a)
    xlps = (gg - 2 * aa + xp.einsum("ij,ij->i", a @ gram, a))[:, None]
    c = gy - a @ qyp
    beta = c / xlps
    rss = yps[None, :] - beta * c
    t = beta / xp.sqrt(rss / dof / xlps)  # sgkit's order of operations
    return xp.stack([beta, t], axis=-1)


ROW_THREADS = 256


def linreg_block_gpu(g, *, w, gram, qyp, yps, dof: int):
    """:func:`linreg_block` of a CuPy block, the whole block at once: its product with ``w``
    (cuBLAS) and its rows' sums of squares (``cuda/gwas.cu``) on the device; the rest, a few
    numbers per variant, on the host with the covariates' matrices (NumPy, as the op gives them),
    where CuPy's formulas compiled eight kernels on a fresh machine. Returns NumPy."""
    import cupy

    from .copies import contiguous

    gf = contiguous(g if g.dtype == ACC else g.astype(ACC))
    rows, cols = gf.shape
    gw = gf @ cupy.asarray(np.ascontiguousarray(w, dtype=ACC))
    gg = cupy.zeros(rows, dtype=ACC)
    if rows and cols:
        launch.raw_kernel("gwas.cu", "pipeline_row_squares", launch.FMAD)(
            (min(rows, 65535 * 16),), (ROW_THREADS,), (gf, np.int64(cols), np.int64(rows), np.int64(cols), gg)
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        return _finish(gw.get(), gg.get(), gram=np.asarray(gram), qyp=np.asarray(qyp), yps=np.asarray(yps), dof=dof)


@temporaries(2)
def linreg_block_cpu(g, *, w, gram, qyp, yps, dof: int):
    """:func:`linreg_block` slab by slab along the variants (:func:`pipeline.kernels.slabs.map_slabs`),
    each slab's float64 copy ``SLAB_BYTES``: its temporaries are two such slabs, whatever the
    block's dtype. (The GPU takes the whole block: slabs would be too small for its products.)"""
    nbytes = max(1, SLAB_BYTES * g.dtype.itemsize // np.dtype(ACC).itemsize)
    with np.errstate(divide="ignore", invalid="ignore"):
        return map_slabs(linreg_block, g, whole=(1,), nbytes=nbytes, w=w, gram=gram, qyp=qyp, yps=yps, dof=dof)


def linreg_p_value_cpu(t, dof: int):
    """Two-sided p-values of t statistics with ``dof`` degrees of freedom: SciPy's Student t
    survival function, ``2 * scipy.stats.t.sf(|t|, dof)`` as sgkit computes it, called as the
    special function that it is (``stdtr(dof, -|t|)`` in float64): the same bits, NaN for
    ``dof <= 0``, without importing ``scipy.stats``, which took a fresh process (a cluster's worker,
    a ``pipeline run``) 0.7 s more than ``scipy.special`` (1.02 s against 0.28 s, 2 cores), paid
    inside its first GWAS task."""
    from scipy import special

    return 2 * special.stdtr(float(dof), -np.abs(np.asarray(t, dtype=np.float64)))


def linreg_p_value_gpu(t, dof: int):
    """:func:`linreg_p_value_cpu` of the GPU's statistics, which :func:`linreg_block_gpu` returns on
    the host: computed there, by SciPy (a CuPy block is moved there first)."""
    return linreg_p_value_cpu(to_numpy(t), dof)
