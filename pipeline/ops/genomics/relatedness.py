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

from ...backend import backend_of, meta as backend_meta, xp_of
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


def _frequencies(g, n_alleles: int | None):
    """Each call's allele frequencies (variants, samples, alleles) from a genotype block: the
    count of each allele (0 to ``n_alleles`` - 1) over the alleles called, NaN where none is;
    ``n_alleles`` None: every allele value seen in the block."""
    xp = xp_of(g)
    width = n_alleles if n_alleles is not None else max(int(g.max()) + 1, 1) if g.size else 1
    counts = xp.stack([(g == a).sum(axis=-1) for a in range(width)], axis=-1).astype(F8)
    with np.errstate(divide="ignore", invalid="ignore"):
        return counts / counts.sum(axis=-1, keepdims=True)


def _ibs_terms(af_i, af_j, *, skipna: bool):
    """Numerator (and, skipping NaN, denominator) of the IBS of two tiles' allele frequencies."""
    xp = xp_of(af_i)
    if skipna:
        called_i, called_j = xp.nansum(af_i, axis=-1), xp.nansum(af_j, axis=-1)
        af_i, af_j = xp.where(xp.isnan(af_i), 0.0, af_i), xp.where(xp.isnan(af_j), 0.0, af_j)
    num = xp.einsum("vsa,vta->st", af_i, af_j)
    if not skipna:
        return num[..., None]
    return xp.stack([num, called_i.T @ called_j], axis=-1)


def _ibs_of_genotypes(g_i, g_j, *, n_alleles: int | None, skipna: bool):
    if n_alleles is None:  # "matching": any allele value, the same width for both tiles
        n_alleles = max(int(g_i.max()) + 1 if g_i.size else 1, int(g_j.max()) + 1 if g_j.size else 1, 1)
    return _ibs_terms(_frequencies(g_i, n_alleles), _frequencies(g_j, n_alleles), skipna=skipna)


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
            x, kernel = as_dask(g), _bind(_ibs_of_genotypes, n_alleles=int(ds.sizes["alleles"]))
            if merge:
                ds = _with_call_allele_frequency(ds)
    elif method == "matching":
        g = variable(ds, call_genotype, ("variants", "samples", "ploidy"), "i", op=name)
        x, kernel = as_dask(g), _bind(_ibs_of_genotypes, n_alleles=None)
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


def _van_raden_terms(d_i, d_j, af, *, ploidy: int, skipna: bool):
    xp = xp_of(d_i)
    ad = af * ploidy
    m_i, m_j = d_i.astype(F8) - ad[:, None], d_j.astype(F8) - ad[:, None]
    if not skipna:
        return (m_i.T @ m_j)[..., None]
    nan_i, nan_j = xp.isnan(m_i), xp.isnan(m_j)
    num = xp.where(nan_i, 0.0, m_i).T @ xp.where(nan_j, 0.0, m_j)
    den = (~nan_i * ad[:, None]).T @ (~nan_j * (1 - af)[:, None])
    return xp.stack([num, den], axis=-1)


def _endelman_jannink_terms(d_i, d_j, af, w_mean_i, w_mean_j, *, ploidy: int):
    xp = xp_of(d_i)
    x_i = d_i.astype(F8) - (af * ploidy)[:, None] - w_mean_i[None, :]
    x_j = d_j.astype(F8) - (af * ploidy)[:, None] - w_mean_j[None, :]
    return xp.stack([x_i.T @ x_j, (x_i**2).T @ (x_j**2)], axis=-1)


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
    dosage, af = as_dask(d), as_dask(af_var).astype(F8)
    if estimator == "VanRaden":
        sums = _pair_sums(_bind(_van_raden_terms, ploidy=ploidy, skipna=skipna), 2 if skipna else 1, dosage, (af,))
        G = sums[0] / (sums[1] if skipna else (af * ploidy * (1 - af)).sum())
    else:
        if skipna:
            raise NotImplementedInputError(f"{name}: skipna is not implemented for the 'Endelman-Jannink' estimator")
        m = dosage.shape[0]
        w_mean = da.nanmean(dosage.astype(F8) - (af * ploidy)[:, None], axis=0)
        S, gamma = (s / m for s in _pair_sums(_bind(_endelman_jannink_terms, ploidy=ploidy), 2, dosage, (af,),
                                               (w_mean,)))
        t = da.diagonal(S).mean()
        delta = ((gamma - S**2).sum() / m) / (S.map_blocks(_on_diagonal, t, sign=-1.0, dtype=F8) ** 2).sum()
        delta = da.minimum(da.maximum(delta, 0.0), 1.0)
        cov = ((1 - delta) * S).map_blocks(_on_diagonal, delta * t, sign=1.0, dtype=F8)
        G = (cov + w_mean[:, None] * w_mean[None, :]) / (ploidy * (af * (1 - af)).mean())
    return _merge(ds, _new("stat_genomic_relationship", G.astype(out_dtype)), merge)


__all__ = ["genomic_relationship", "identity_by_state"]
