"""Quality control filters: drop variants and samples by call rate, minor allele frequency and
Hardy-Weinberg p-value, the first steps of most analyses (sgkit leaves them to ``ds.isel``; a flow
needs them as steps).

A filter needs its statistics before it can say which variants remain, so it computes them (one
pass over the genotypes, on the dataset's backend) when it is called: the variants dimension of
what follows has known sizes, which windows, LD pruning and PCA need. Statistics already in the
dataset (from ``variant_stats``, ``sample_stats``, ``hardy_weinberg_test``) are used as they are.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ...backend import to_numpy
from ...errors import InputError
from ..registry import register
from ._dataset import as_dask, keep_in_blocks, variable
from ._dataset import variable as _variable

__all__ = ["filter_samples", "filter_variants", "impute_mean"]


def _computed(x: xr.DataArray) -> np.ndarray:
    return np.asarray(to_numpy(x.data))


def _keep(ds: xr.Dataset, dim: str, keep: np.ndarray, what: str) -> xr.Dataset:
    if not keep.any():
        raise InputError(f"{what}: no {dim} remain after the filters (all {keep.size} removed)")
    blocks = keep_in_blocks(ds, dim, keep)
    if blocks is not None:  # each block keeps its own: no task gathers from two blocks
        return blocks
    out = ds.isel({dim: np.flatnonzero(keep)})
    # keep blocks of the input's size along the filtered dimension, not shrunken pieces of them
    chunks = {}
    for v in ds.data_vars.values():
        if dim in v.dims and v.chunks is not None:
            chunks[dim] = max(v.chunksizes[dim])
    return out.chunk(chunks) if chunks else out


@register(kernels=(), dataset=True)
def filter_variants(
    ds: xr.Dataset,
    max_alleles: int | None = None,
    min_call_rate: float | None = None,
    min_maf: float | None = None,
    min_hwe_p: float | None = None,
) -> xr.Dataset:
    """Keep the variants with at most ``max_alleles`` alleles (PLINK's ``--max-alleles``: 2 keeps
    the biallelic variants, and the ``alleles`` dimension is cut to 2, as the HWE test needs), and
    whose call rate, minor allele frequency and Hardy-Weinberg exact-test p-value are each at least
    the given bound (a bound of None is no filter). Alleles are counted from ``variant_allele``
    (its non-empty strings), before the other filters.

    The minor allele frequency is PLINK 2's: one minus the frequency of the most common allele
    (for a biallelic variant, the smaller of the two). A variant with no called allele has none,
    and is removed by ``min_maf``. Statistics missing from ``ds`` are computed by
    ``variant_stats`` and ``hardy_weinberg_test``.
    """
    from . import stats

    name = "filter_variants"
    for key, v, hi in (("min_call_rate", min_call_rate, 1), ("min_maf", min_maf, 0.5), ("min_hwe_p", min_hwe_p, 1)):
        if v is not None and not 0 <= v <= hi:
            raise InputError(f"{name}: {key} must be between 0 and {hi}, got {v}")
    if max_alleles is not None:
        if max_alleles < 1:
            raise InputError(f"{name}: max_alleles must be 1 or more, got {max_alleles}")
        alleles = variable(ds, "variant_allele", ("variants", "alleles"), "OUST", op=name)
        # VCF Zarr pads with empty strings (bytes, str, object or NumPy's StringDType alike)
        n_alleles = np.vectorize(bool, otypes=[bool])(np.asarray(alleles.values)).sum(axis=1)
        ds = _keep(ds, "variants", n_alleles <= max_alleles, name)
        if ds.sizes["alleles"] > max_alleles:
            ds = ds.isel(alleles=slice(0, max_alleles))
    keep = np.ones(ds.sizes.get("variants", 0), dtype=bool)
    if min_call_rate is not None or min_maf is not None:
        if not {"variant_call_rate", "variant_allele_frequency"} <= set(ds.variables):
            ds = stats.variant_stats(ds)
    if min_hwe_p is not None and "variant_hwe_p_value" not in ds.variables:
        ds = stats.hardy_weinberg_test(ds)
    if min_call_rate is not None:
        keep &= _computed(variable(ds, "variant_call_rate", ("variants",), "f", op=name)) >= min_call_rate
    if min_maf is not None:
        af = _computed(variable(ds, "variant_allele_frequency", ("variants", "alleles"), "f", op=name))
        with np.errstate(invalid="ignore"):
            maf = 1.0 - np.nanmax(np.where(np.isnan(af), -np.inf, af), axis=1)
        keep &= np.isfinite(maf) & (maf >= min_maf)
    if min_hwe_p is not None:
        p = _computed(variable(ds, "variant_hwe_p_value", ("variants",), "f", op=name))
        keep &= ~(p < min_hwe_p)  # NaN (no called genotype) is kept, as PLINK keeps it
    return _keep(ds, "variants", keep, name)


@register(kernels=(), dataset=True)
def filter_samples(ds: xr.Dataset, min_call_rate: float | None = None) -> xr.Dataset:
    """Keep the samples whose call rate (``sample_call_rate``, from ``sample_stats`` when absent)
    is at least ``min_call_rate``."""
    from . import stats

    name = "filter_samples"
    if min_call_rate is not None and not 0 <= min_call_rate <= 1:
        raise InputError(f"{name}: min_call_rate must be between 0 and 1, got {min_call_rate}")
    keep = np.ones(ds.sizes.get("samples", 0), dtype=bool)
    if min_call_rate is not None:
        if "sample_call_rate" not in ds.variables:
            ds = stats.sample_stats(ds)
        keep &= _computed(variable(ds, "sample_call_rate", ("samples",), "f", op=name)) >= min_call_rate
    return _keep(ds, "samples", keep, name)


@register(kernels=(), dataset=True)
def impute_mean(ds: xr.Dataset, variable: str = "call_alternate_allele_count") -> xr.Dataset:
    """``variable`` (variants, samples) as float64 with each missing value (negative or NaN)
    replaced by its variant's mean over the called samples (NaN where none is called): the mean
    imputation PLINK's ``--pca`` makes, for ``pca`` and ``gwas_linear_regression``, which take
    complete data only (sgkit refuses missing values and leaves imputation to the user).
    Array formulas on the dataset's backend; nothing is computed."""
    import dask.array as da

    x = _variable(ds, variable, ("variants", "samples"), "iuf", op="impute_mean")
    # dask's where, not xarray's: xarray makes a scalar fill a NumPy array, which CuPy blocks refuse
    values = as_dask(x).astype(np.float64)
    missing = (values < 0) | da.isnan(values)
    called = (~missing).sum(axis=1)
    mean = da.where(missing, 0.0, values).sum(axis=1) / da.where(called > 0, called, np.nan)
    out = xr.DataArray(da.where(missing, mean[:, None], values), dims=x.dims, coords=x.coords,
                       attrs={**x.attrs, "comment": f"{variable} with missing values replaced by the variant's mean over called samples"})
    return ds.assign({variable: out})
