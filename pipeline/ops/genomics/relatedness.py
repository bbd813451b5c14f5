"""Relatedness between samples, as sgkit 0.10 computes it (``stats/ibs.py``, ``stats/grm.py``,
``stats/pc_relate.py``): identity by state, genomic relationship matrices and PC-Relate.

Each matrix is a sum over variants of products of per-call values of two samples (samples x
samples), as ``pca``'s Gram matrix: every block of variants adds its part, tile by tile of
samples (at most ``TILE`` a side), and only the tiles on and above the diagonal are computed (the
matrices are symmetric; those below are their transposes). The per-call values (allele
frequencies of a call, centred dosages...) are made inside the task from the block it reads, on
the block's backend (NumPy or CuPy: matrix products on cuBLAS), so no (variants, samples) array
of them is held, and the genotypes are read block by block, never whole.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import xarray as xr

from ... import kernels
from ...backend import backend_of, linalg_raises, meta as backend_meta, to_backend, xp_of
from ...deferred import module as _deferred
from ...errors import InputError, NotImplementedInputError
from ._dataset import as_dask, even_chunks, upper_mirrored, variable
from ._dataset import merge as _merge
from .stats import count_call_alleles

da = _deferred("dask.array")  # imported when the first graph is built

F8 = np.float64
TILE = 4096  # samples a side of a tile of the products (a partial of TILE^2 float64 per output)
COMMENTS = {  # sgkit's documentation of its variables, which it sets as their "comment"
    "call_allele_frequency": "Allele frequencies. With shape (variants, samples, alleles) and values\n"
    "corresponding to the frequencies of non-missing occurrences of each allele.",
    "stat_identity_by_state": "Pairwise IBS probabilities among all samples.",
    "stat_genomic_relationship": "Genomic relationship matrix (GRM).",
    "pc_relate_phi": "PC Relate kinship coefficient matrix.",
    "stat_inverse_relationship": "The inverse of a relationship matrix. This may contain the inverse of a subset of\n"
    "a relationship matrix in which nan values indicate elements outside of the subset.",
    "stat_hybrid_relationship": "The hybrid relationship matrix or \"H-matrix\".",
    "stat_hybrid_inverse_relationship": "Inverse of the hybrid relationship matrix or \"H-matrix\".",
}
PAIR_DIMS = ("samples_0", "samples_1")


def _new(name: str, data) -> xr.Dataset:
    return xr.Dataset({name: (PAIR_DIMS, data, {"comment": COMMENTS[name]} if name in COMMENTS else {})})


# --- sums over variants of products of two samples' values ------------------------------------------


def _pair_block(xi, xj, *rest, kernel):
    return kernel(xi, xj, *rest)[None]


def _pair_sums(kernel, q: int, x, per_variant=(), per_sample=()) -> list:
    """``kernel(x_i, x_j, *per_variant, *(s_i, s_j for each per_sample))`` -> (ni, nj, q) on each
    pair of tiles of samples of each block of variants of ``x`` (variants, samples, ...), summed
    over the blocks: ``q`` symmetric (samples, samples) float64 matrices, on ``x``'s backend."""
    n = x.shape[1]
    tiles = even_chunks(n, TILE)
    x = x.rechunk({1: tiles, **{a: -1 for a in range(2, x.ndim)}})
    tail = "".join("abcdefgh"[: x.ndim - 2])
    args = [x, "ki" + tail, x, "kj" + tail]
    for p in per_variant:
        args += [p.rechunk((x.chunks[0],)), "k"]
    for p in per_sample:
        p = p.rechunk((tiles,))
        args += [p, "i", p, "j"]
    backend = backend_of(x)
    parts = da.blockwise(_pair_block, "kijq", *args, kernel=kernel, new_axes={"q": q}, adjust_chunks={"k": 1},
                         concatenate=True, dtype=F8, meta=backend_meta(backend, F8, 4))
    total = parts.sum(axis=0)
    return [upper_mirrored(total[:, :, m]) for m in range(q)]


def _on_diagonal(block, value, *, sign: float, block_info=None):
    """``block`` (a tile of a square matrix) with ``sign * value`` added on the matrix's diagonal."""
    xp = xp_of(block)
    (r0, _), (c0, _) = block_info[0]["array-location"]
    diag = xp.arange(r0, r0 + block.shape[0])[:, None] == xp.arange(c0, c0 + block.shape[1])[None, :]
    return block + xp.where(diag, sign * value, 0.0)


# --- identity by state ----------------------------------------------------------------------------


def _ibs_terms(af_i, af_j, *, skipna: bool):
    """Numerator (and, skipping NaN, denominator) of the IBS of two tiles' allele frequencies."""
    xp = xp_of(af_i)
    same = af_j is af_i  # a tile of the diagonal: a symmetric product (see _van_raden_terms)
    if skipna:
        called_i = xp.nansum(af_i, axis=-1)
        called_j = called_i if same else xp.nansum(af_j, axis=-1)
        af_i = xp.where(xp.isnan(af_i), 0.0, af_i)
        af_j = af_i if same else xp.where(xp.isnan(af_j), 0.0, af_j)
    # einsum("vsa,vta->st") as one matrix product (BLAS, cuBLAS): NumPy's einsum without
    # optimize loops in C, 3.5 s against 0.05 s for 1,000 samples x 1,000 variants x 2 alleles
    v, s, a = af_i.shape
    rows_i = af_i.transpose(1, 0, 2).reshape(s, v * a)
    rows_j = rows_i if same else af_j.transpose(1, 0, 2).reshape(af_j.shape[1], v * a)
    num = rows_i @ rows_j.T
    if not skipna:
        return num[..., None]
    return xp.stack([num, called_i.T @ (called_i if same else called_j)], axis=-1)


def _ibs_of_genotypes(g_i, g_j, *, n_alleles: int | None, skipna: bool, frequencies):
    """The IBS terms of two tiles of genotypes, from each call's allele frequencies (the
    ``genotype_allele_frequencies`` kernel: 0 to ``n_alleles`` - 1; None: every allele value seen)."""
    if n_alleles is None:  # "matching": any allele value, the same width for both tiles
        n_alleles = max(int(g_i.max()) + 1 if g_i.size else 1, int(g_j.max()) + 1 if g_j.size else 1, 1)
    af_i = frequencies(g_i, n_alleles)
    return _ibs_terms(af_i, af_i if g_j is g_i else frequencies(g_j, n_alleles), skipna=skipna)


def identity_by_state(
    ds: xr.Dataset,
    *,
    call_genotype: str = "call_genotype",
    call_allele_frequency: str = "call_allele_frequency",
    method: Literal["frequencies", "matching"] = "frequencies",
    skipna: bool = True,
    merge: bool = True,
) -> xr.Dataset:
    """Identity by state between all pairs of samples, sgkit's ``identity_by_state``:
    ``stat_identity_by_state`` (samples_0, samples_1), float64, the probability that an allele
    drawn from each of two samples' calls is the same, averaged over the variants where both
    have a called allele (``skipna``; else over all variants, NaN where any call is missing).

    ``method="frequencies"`` reads the calls' allele frequencies, ``call_allele_frequency``
    (variants, samples, alleles), or, where the dataset lacks it, counts them from
    ``call_genotype`` block by block, and merges sgkit's ``call_allele_count`` and
    ``call_allele_frequency`` into the result as sgkit does; ``"matching"`` compares the alleles
    of the calls themselves (any allele value, also past the alleles dimension)."""
    name = "identity_by_state"
    if method == "frequencies":
        if call_allele_frequency in ds.variables:
            af = variable(ds, call_allele_frequency, ("variants", "samples", "alleles"), "f", op=name)
            x, kernel = as_dask(af).astype(F8), _ibs_terms
        else:
            if call_allele_frequency != "call_allele_frequency":
                raise InputError(f"{name}: the dataset has no variable {call_allele_frequency!r} "
                                 "(only 'call_allele_frequency' is computed where missing)")
            g = variable(ds, "call_genotype", ("variants", "samples", "ploidy"), "i", op=name)
            if "alleles" not in ds.sizes:
                raise InputError(f"{name}: the dataset has no 'alleles' dimension (variant_allele gives it)")
            x = as_dask(g)
            kernel = _bind(_ibs_of_genotypes, n_alleles=int(ds.sizes["alleles"]),
                           frequencies=kernels.get("genotype_allele_frequencies", backend_of(x)))
            if merge:
                ds = _with_call_allele_frequency(ds)
    elif method == "matching":
        g = variable(ds, call_genotype, ("variants", "samples", "ploidy"), "i", op=name)
        x = as_dask(g)
        kernel = _bind(_ibs_of_genotypes, n_alleles=None,
                       frequencies=kernels.get("genotype_allele_frequencies", backend_of(x)))
    else:
        raise InputError(f"{name}: unknown method {method!r} (expected 'frequencies' or 'matching')")
    sums = _pair_sums(_bind(kernel, skipna=skipna), 2 if skipna else 1, x)
    ibs = sums[0] / sums[1] if skipna else sums[0] / x.shape[0]
    return _merge(ds, _new("stat_identity_by_state", ibs), merge)


def _bind(fn, **kwargs):
    import functools

    return functools.partial(fn, **kwargs)


def _with_call_allele_frequency(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with sgkit's ``call_allele_count`` (where missing) and ``call_allele_frequency``, the
    counts over their sum (NaN where no allele is called), as sgkit's ``call_allele_frequencies``."""
    if "call_allele_count" not in ds.variables:
        ds = count_call_alleles(ds)
    ac = ds["call_allele_count"]
    af = ac / ac.sum(dim="alleles")
    af.attrs = {"comment": COMMENTS["call_allele_frequency"]}
    return ds.assign(call_allele_frequency=af)


# --- genomic relationship ----------------------------------------------------------------------------


# On a tile of the diagonal the two tiles are one block (dask passes the same object twice): its
# terms are made once and multiplied by their own transpose, which NumPy computes as a symmetric
# rank-k update (BLAS syrk, half the products of a general one: 0.09 s against 0.15 s for 1,000
# variants x 3,000 samples on 2 cores). Off the diagonal, two blocks.


def _van_raden_terms(d_i, d_j, af, *, ploidy: int, skipna: bool):
    xp = xp_of(d_i)
    ad = af * ploidy
    m_i = d_i.astype(F8) - ad[:, None]
    m_j = m_i if d_j is d_i else d_j.astype(F8) - ad[:, None]
    if not skipna:
        return (m_i.T @ m_j)[..., None]
    nan_i = xp.isnan(m_i)
    nan_j = nan_i if m_j is m_i else xp.isnan(m_j)
    w_i = xp.where(nan_i, 0.0, m_i)
    num = w_i.T @ (w_i if m_j is m_i else xp.where(nan_j, 0.0, m_j))
    den = (~nan_i * ad[:, None]).T @ (~nan_j * (1 - af)[:, None])
    return xp.stack([num, den], axis=-1)


def _endelman_jannink_terms(d_i, d_j, af, w_mean_i, w_mean_j, *, ploidy: int):
    xp = xp_of(d_i)
    x_i = d_i.astype(F8) - (af * ploidy)[:, None] - w_mean_i[None, :]
    same = d_j is d_i and w_mean_j is w_mean_i
    x_j = x_i if same else d_j.astype(F8) - (af * ploidy)[:, None] - w_mean_j[None, :]
    sq_i = x_i**2
    return xp.stack([x_i.T @ x_j, sq_i.T @ (sq_i if same else x_j**2)], axis=-1)


def _deviation_sums(d, af, *, ploidy: int):
    """A block's sums over variants of the dosages' deviations from the ancestral dosage, and the
    counts of those known, per sample (1, samples, 2)."""
    xp = xp_of(d)
    w = d.astype(F8) - (af * ploidy)[:, None]
    known = ~xp.isnan(w)
    return xp.stack([xp.where(known, w, 0.0).sum(axis=0), known.sum(axis=0).astype(F8)], axis=-1)[None]


def _sample_means(dosage, af, ploidy: int):
    """sgkit's ``W_mean``: each sample's mean deviation from the ancestral dosage over the variants
    where its dosage is known, from the blocks' sums (on the dosages' backend)."""
    parts = da.blockwise(_deviation_sums, "kso", dosage, "ks", af.rechunk((dosage.chunks[0],)), "k", ploidy=ploidy,
                         new_axes={"o": 2}, adjust_chunks={"k": 1}, dtype=F8,
                         meta=backend_meta(backend_of(dosage), F8, 3))
    sums = parts.sum(axis=0)
    return sums[:, 0] / sums[:, 1]


def genomic_relationship(
    ds: xr.Dataset,
    *,
    call_dosage: str = "call_dosage",
    estimator: Literal["VanRaden", "Endelman-Jannink"] | None = None,
    ancestral_frequency: str | None = None,
    ploidy: int | None = None,
    skipna: bool = False,
    merge: bool = True,
) -> xr.Dataset:
    """Genomic relationship matrix, sgkit's ``genomic_relationship``: ``stat_genomic_relationship``
    (samples_0, samples_1) from the dosages ``call_dosage`` (variants, samples) and the ancestral
    frequency of each variant's allele ``ancestral_frequency`` (variants): VanRaden's estimator
    (the default; ``skipna``: each pair over the variants where both dosages are known) or
    Endelman and Jannink's shrinkage estimator. ``ploidy`` defaults to the ploidy dimension's
    length. float64 (float32 where both inputs are)."""
    name = "genomic_relationship"
    d = variable(ds, call_dosage, ("variants", "samples"), "iuf", op=name)
    estimator = estimator or "VanRaden"
    if estimator not in ("VanRaden", "Endelman-Jannink"):
        raise InputError(f"{name}: unknown estimator {estimator!r} (expected 'VanRaden' or 'Endelman-Jannink')")
    ploidy = ploidy or ds.sizes.get("ploidy")
    if ploidy is None:
        raise InputError(f"{name}: ploidy must be given when the dataset has no ploidy dimension")
    if ancestral_frequency is None:
        raise InputError(f"{name}: the {estimator!r} estimator requires the 'ancestral_frequency' argument "
                         "(a variable of one frequency per variant)")
    af_var = variable(ds, ancestral_frequency, kind="iuf", op=name)
    if af_var.shape != (d.shape[0],):
        raise InputError(f"{name}: variable {ancestral_frequency!r} has shape {af_var.shape}, expected one value per "
                         f"variant ({d.shape[0]},)")
    out_dtype = np.result_type(d.dtype, af_var.dtype)
    out_dtype = out_dtype if out_dtype.kind == "f" else np.dtype(F8)
    dosage = as_dask(d)
    af = to_backend(as_dask(af_var).astype(F8), backend_of(dosage))  # where the dosages are
    if estimator == "VanRaden":
        sums = _pair_sums(_bind(_van_raden_terms, ploidy=ploidy, skipna=skipna), 2 if skipna else 1, dosage, (af,))
        G = sums[0] / (sums[1] if skipna else (af * ploidy * (1 - af)).sum())
    else:
        if skipna:
            raise NotImplementedInputError(f"{name}: skipna is not implemented for the 'Endelman-Jannink' estimator")
        m = dosage.shape[0]
        w_mean = _sample_means(dosage, af, ploidy)
        S, gamma = (s / m for s in _pair_sums(_bind(_endelman_jannink_terms, ploidy=ploidy), 2, dosage, (af,),
                                               (w_mean,)))
        t = da.diagonal(S).mean()
        delta = ((gamma - S**2).sum() / m) / (S.map_blocks(_on_diagonal, t, sign=-1.0, dtype=F8, meta=S._meta) ** 2).sum()
        delta = da.minimum(da.maximum(delta, 0.0), 1.0)
        cov = ((1 - delta) * S).map_blocks(_on_diagonal, delta * t, sign=1.0, dtype=F8, meta=S._meta)
        G = (cov + w_mean[:, None] * w_mean[None, :]) / (ploidy * (af * (1 - af)).mean())
    return _merge(ds, _new("stat_genomic_relationship", G.astype(out_dtype)), merge)


# --- PC-Relate ------------------------------------------------------------------------------------


def _pcs_basis(pcs):
    """An orthonormal basis (samples, components + 1) of the intercept and the PCs: Q of their
    QR decomposition (sgkit's ``pcsi``; its ``mu`` is their projection, whatever the QR's signs)."""
    xp = xp_of(pcs)
    pcsi = xp.concatenate([xp.ones((pcs.shape[0], 1), dtype=F8), pcs.astype(F8)], axis=1)
    return xp.linalg.qr(pcsi)[0]


def _pc_relate_terms(x_i, x_j):
    xp = xp_of(x_i)
    return xp.stack([x_i[..., 0].T @ x_j[..., 0], x_i[..., 1].T @ x_j[..., 1]], axis=-1)


def pc_relate(
    ds: xr.Dataset,
    *,
    maf: float = 0.01,
    call_genotype: str = "call_genotype",
    call_genotype_mask: str = "call_genotype_mask",
    sample_pc: str = "sample_pca_projection",
    merge: bool = True,
) -> xr.Dataset:
    """PC-Relate's kinship (Conomos et al. 2016), sgkit's ``pc_relate``: ``pc_relate_phi``
    (samples_0, samples_1), float64, from the genotypes (diploid, biallelic), their mask and the
    samples' principal components ``sample_pc`` (samples, components), leaving out for each
    sample the variants where its individual allele frequency is within ``maf`` of 0 or 1.
    Computed in float64 (sgkit computes the PCs' QR in their own type)."""
    name = "pc_relate"
    if not 0.0 < maf < 1.0:
        raise InputError(f"{name}: maf must be between 0 and 1 (exclusive), got {maf!r}")
    if "ploidy" in ds.sizes and ds.sizes["ploidy"] != 2:
        raise InputError(f"{name}: PC-Relate works on diploid genotypes only, not ploidy {ds.sizes['ploidy']}")
    if "alleles" in ds.sizes and ds.sizes["alleles"] != 2:
        raise InputError(f"{name}: PC-Relate works on biallelic genotypes only, not {ds.sizes['alleles']} alleles")
    g = variable(ds, call_genotype, ("variants", "samples", "ploidy"), "i", op=name)
    mask = variable(ds, call_genotype_mask, ("variants", "samples", "ploidy"), "b", op=name)
    pcs = variable(ds, sample_pc, kind="iuf", op=name)
    if pcs.ndim != 2 or pcs.dims[0] != "samples":
        raise InputError(f"{name}: variable {sample_pc!r} has dimensions {tuple(map(str, pcs.dims))}, "
                         "expected (samples, components)")
    backend = backend_of(as_dask(g))
    whole = {1: -1, 2: -1}
    G, M = as_dask(g).rechunk(whole), as_dask(mask).rechunk(whole)
    M = to_backend(M.rechunk({0: G.chunks[0]}), backend)
    # the basis of the PCs (a thin matrix) on the host, then where the genotypes are: on CuPy its
    # QR's copies and triangle compiled four kernels on a fresh machine (2.5 s of the H200's)
    P = to_backend(as_dask(pcs).rechunk(-1), "cpu")
    q = P.map_blocks(_pcs_basis, chunks=(P.chunks[0], (P.shape[1] + 1,)), dtype=F8, meta=backend_meta("cpu", F8, 2))
    q = to_backend(q, backend)
    values = da.blockwise(kernels.get("pc_relate_values", backend), "vsx", G, "vsp", M, "vsp", q, "sc",
                          new_axes={"x": 2}, concatenate=True, maf=maf, dtype=F8, meta=backend_meta(backend, F8, 3))
    centered, stddev = _pair_sums(_pc_relate_terms, 2, values)
    return _merge(ds, _new("pc_relate_phi", centered / stddev), merge)


# --- relationship matrices: inverse and hybrid ------------------------------------------------------
#
# Small matrix algebra on whole (samples, samples) matrices, in one task on the matrices' backend
# (NumPy or CuPy), as sgkit's dask.array.linalg calls are on one block.


def _matrix(ds: xr.Dataset, name: str, op: str, like=None):
    """A relationship matrix in one block of float64, on the backend of ``like`` where given."""
    m = as_dask(variable(ds, name, PAIR_DIMS, "iuf", op=op)).rechunk(-1).astype(F8)
    return m if like is None else to_backend(m, backend_of(like))


def _samples(ds: xr.Dataset, name: str | None, n: int, op: str) -> np.ndarray:
    """The samples a variable marks (booleans), or all of them."""
    if name is None:
        return np.ones(n, dtype=bool)
    from ...backend import to_numpy

    v = variable(ds, name, kind="b", op=op)
    if v.shape != (n,):
        raise InputError(f"{op}: variable {name!r} has shape {v.shape}, expected one boolean per sample ({n},)")
    return np.asarray(to_numpy(v.data), dtype=bool)


def _inv(a, op: str):
    from ...errors import LinAlgInputError

    xp = xp_of(a)
    try:
        with linalg_raises(xp):
            return xp.linalg.inv(a)
    except np.linalg.LinAlgError as e:
        raise LinAlgInputError(f"{op}: the relationship matrix cannot be inverted ({e})") from None


def _placed(xp, n: int, blocks, pad: float):
    """A (n, n) matrix of ``pad`` with each ``(rows, cols, values)`` of ``blocks`` put in place."""
    out = xp.full((n, n), pad, dtype=F8)
    for rows, cols, values in blocks:
        out[xp.ix_(xp.asarray(np.flatnonzero(rows)), xp.asarray(np.flatnonzero(cols)))] = values
    return out


def _sub(m, rows, cols):
    xp = xp_of(m)
    return m[xp.ix_(xp.asarray(np.flatnonzero(rows)), xp.asarray(np.flatnonzero(cols)))]


def _invert_block(a, *, subset: np.ndarray, op: str):
    if subset.all():
        return _inv(a, op)
    return _placed(xp_of(a), a.shape[0], [(subset, subset, _inv(_sub(a, subset, subset), op))], np.nan)


def invert_relationship_matrix(
    ds: xr.Dataset,
    *,
    relationship: str,
    subset_sample: str | None = None,
    subset_rechunk: int | None = None,
    merge: bool = True,
) -> xr.Dataset:
    """The inverse of a relationship matrix, sgkit's ``invert_relationship_matrix``:
    ``stat_inverse_relationship`` (samples_0, samples_1), float64; with ``subset_sample`` (a
    boolean per sample) the inverse of the sub-matrix of those samples, NaN elsewhere.
    ``subset_rechunk`` is taken for sgkit's signature: the matrix is inverted in one block."""
    name = "invert_relationship_matrix"
    a = _matrix(ds, relationship, name)
    subset = _samples(ds, subset_sample, a.shape[0], name)
    inv = a.map_blocks(_invert_block, subset=subset, op=name, dtype=F8, meta=a._meta)
    return _merge(ds, _new("stat_inverse_relationship", inv), merge)


def _hybrid_block(a, g, a22inv, *, genomic: np.ndarray, tau: float, omega: float, op: str):
    """sgkit's ``_hybrid_full_matrix_Martini`` / ``_hybrid_sub_matrix_Martini``."""
    xp = xp_of(a)
    if genomic.all():
        if tau == 1 and omega == 1:
            return g
        if omega == 1:
            return g / tau
        ainv = _inv(a, op) if a22inv is None else a22inv
        return _inv(tau * _inv(g, op) + (1 - omega) * ainv, op)
    other = ~genomic
    g22, a11, a12 = _sub(g, genomic, genomic), _sub(a, other, other), _sub(a, other, genomic)
    a21, a22 = _sub(a, genomic, other), _sub(a, genomic, genomic)
    a22inv = _inv(a22, op) if a22inv is None else _sub(a22inv, genomic, genomic)
    if tau == 1 and omega == 1:
        h22 = g22
    elif omega == 1:
        h22 = g22 / tau
    else:
        h22 = _inv(tau * _inv(g22, op) + (1 - omega) * a22inv, op)
    tmp = a12 @ a22inv @ (h22 - a22)
    h11 = a11 + tmp @ a22inv @ a21
    h12 = a12 + tmp
    return _placed(xp, a.shape[0], [(other, other, h11), (other, genomic, h12), (genomic, other, h12.T),
                                    (genomic, genomic, h22)], 0.0)


def _estimator(estimator, op: str) -> None:
    if (estimator or "Martini") != "Martini":
        raise InputError(f"{op}: unknown estimator {estimator!r} (the only one is 'Martini')")


def hybrid_relationship(
    ds: xr.Dataset,
    *,
    genomic_relationship: str,
    pedigree_relationship: str | None = None,
    pedigree_subset_inverse_relationship: str | None = None,
    genomic_sample: str | None = None,
    estimator: Literal["Martini"] | None = None,
    tau: float = 1.0,
    omega: float = 1.0,
    merge: bool = True,
) -> xr.Dataset:
    """A hybrid relationship matrix combining pedigree and genomic relationships (Martini et al.
    2018), sgkit's ``hybrid_relationship``: ``stat_hybrid_relationship`` (samples_0, samples_1),
    float64. ``genomic_sample`` (a boolean per sample) marks the samples the genomic matrix holds
    (default: all); ``pedigree_subset_inverse_relationship``, the inverse of the pedigree matrix's
    sub-matrix of those samples, is computed where not given."""
    name = "hybrid_relationship"
    _estimator(estimator, name)
    if pedigree_relationship is None:
        raise InputError(f"{name}: pedigree_relationship must name the pedigree relationship matrix")
    g = _matrix(ds, genomic_relationship, name)
    a = _matrix(ds, pedigree_relationship, name, like=g)
    if g.shape != a.shape:
        raise InputError(f"{name}: matrices {genomic_relationship!r} {g.shape} and {pedigree_relationship!r} "
                         f"{a.shape} must share dimensions")
    genomic = _samples(ds, genomic_sample, a.shape[0], name)
    a22inv = None
    if pedigree_subset_inverse_relationship is not None:
        a22inv = _matrix(ds, pedigree_subset_inverse_relationship, name, like=g)
    h = da.map_blocks(_hybrid_block, a, g, a22inv, genomic=genomic, tau=tau, omega=omega, op=name, dtype=F8,
                      meta=a._meta)
    return _merge(ds, _new("stat_hybrid_relationship", h), merge)


def _hybrid_inverse_block(ainv, ginv, a22inv, *, genomic: np.ndarray, tau: float, omega: float):
    """sgkit's ``_hybrid_inverse_full_matrix_Martini`` / ``_hybrid_inverse_sub_matrix_Martini``."""
    if genomic.all():
        return ainv + (tau * ginv) - (omega * ainv)
    z22 = (tau * _sub(ginv, genomic, genomic)) - (omega * _sub(a22inv, genomic, genomic))
    return ainv + _placed(xp_of(ainv), ainv.shape[0], [(genomic, genomic, z22)], 0.0)


def hybrid_inverse_relationship(
    ds: xr.Dataset,
    *,
    genomic_inverse_relationship: str,
    pedigree_inverse_relationship: str,
    pedigree_subset_inverse_relationship: str | None = None,
    genomic_sample: str | None = None,
    estimator: Literal["Martini"] | None = None,
    tau: float = 1.0,
    omega: float = 1.0,
    merge: bool = True,
) -> xr.Dataset:
    """The inverse of a hybrid relationship matrix (Martini et al. 2018), sgkit's
    ``hybrid_inverse_relationship``: ``stat_hybrid_inverse_relationship`` (samples_0, samples_1),
    float64, from the inverses of the genomic and pedigree matrices; where ``genomic_sample``
    marks only some samples, ``pedigree_subset_inverse_relationship`` (the inverse of the pedigree
    matrix's sub-matrix of those samples) is required."""
    name = "hybrid_inverse_relationship"
    _estimator(estimator, name)
    ginv = _matrix(ds, genomic_inverse_relationship, name)
    ainv = _matrix(ds, pedigree_inverse_relationship, name, like=ginv)
    if ginv.shape != ainv.shape:
        raise InputError(f"{name}: matrices {genomic_inverse_relationship!r} {ginv.shape} and "
                         f"{pedigree_inverse_relationship!r} {ainv.shape} must share dimensions")
    genomic = _samples(ds, genomic_sample, ainv.shape[0], name)
    a22inv = None
    if not genomic.all():
        if pedigree_subset_inverse_relationship is None:
            raise InputError(f"{name}: pedigree_subset_inverse_relationship is required where {genomic_sample!r} "
                             "marks only some samples")
        a22inv = _matrix(ds, pedigree_subset_inverse_relationship, name, like=ginv)
    h = da.map_blocks(_hybrid_inverse_block, ainv, ginv, a22inv, genomic=genomic, tau=tau, omega=omega, dtype=F8,
                      meta=ainv._meta)
    return _merge(ds, _new("stat_hybrid_inverse_relationship", h), merge)


__all__ = ["genomic_relationship", "hybrid_inverse_relationship", "hybrid_relationship", "identity_by_state",
           "invert_relationship_matrix", "pc_relate"]
