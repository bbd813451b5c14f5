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

from ... import state
from ...backend import meta, to_numpy, to_numpy_all
from ...deferred import module as _deferred
from ...errors import InputError
from ...kernels import genotypes
from ..registry import register
from . import specs
from ._dataset import as_dask, backend_of_dataset, even_chunks, keep_positions, variable
from ._dataset import variable as _variable
from .variables import A, DOSAGE, STRINGS, V, Add, Declared, Ensure, Read, given, read

__all__ = ["filter_samples", "filter_variants", "impute_mean"]

da = _deferred("dask.array")  # imported when the first graph is built


def _computed(*xs: xr.DataArray) -> list[np.ndarray]:
    """The values of ``xs``, computed together: statistics of one pass (a variant's call rate and
    allele frequencies) read the genotypes once."""
    return [np.asarray(v) for v in to_numpy_all(*(x.data for x in xs))]


def _alleles_named(alleles):
    """The alleles each variant names (variants, alleles): its non-empty strings (VCF Zarr pads
    with empty strings), by blocks of variants where it is a Dask array: counted where the
    strings are read (on a cluster, by the workers), so that only one number a variant comes
    back. Fetched whole, 2.5 million variants' strings held the command of a 2-GPU run 1.7 s.
    Strings as the source opened them are counted from their chunk files' encoded lengths,
    without making the strings (:meth:`pipeline.sources.reads.StoreArray.nonempty`)."""
    if not isinstance(alleles, da.Array):
        return genotypes.strings_named(alleles)
    source = state.opened.strings.get(alleles.name)
    meta = np.empty((0,), dtype=np.int64)
    if source is not None:
        return da.map_blocks(_rows_named, chunks=(alleles.chunks[0],), dtype=np.int64, meta=meta,
                             name=f"alleles-named-{alleles.name}", source=source)
    alleles = alleles.rechunk({1: -1})
    return alleles.map_blocks(genotypes.strings_named, drop_axis=1, dtype=np.int64, meta=meta)


def _rows_named(source, block_info=None) -> np.ndarray:
    """The alleles of the block's variants, counted by ``source`` (a ``StoreArray``)."""
    start, stop = block_info[None]["array-location"][0]
    return source.nonempty(start, stop)


@register(kernels=("take",), dataset=True, variables=Declared(
    needs=(
        # strings of every kind, where sgkit's spec says objects or bytes
        Read("variant_allele", (V, A), STRINGS, when=given("max_alleles")),
        Ensure("variant_call_rate", "variant_stats", when=given("min_call_rate", "min_maf")),
        Ensure("variant_allele_frequency", "variant_stats", when=given("min_call_rate", "min_maf")),
        Ensure("variant_hwe_p_value", "hardy_weinberg_test", when=given("min_hwe_p")),
        read(specs.variant_call_rate_spec, when=given("min_call_rate")),
        read(specs.variant_allele_frequency_spec, when=given("min_maf")),
        read(specs.variant_hwe_p_value_spec, when=given("min_hwe_p")),
    ),
))
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
    (its non-empty strings) in the pass over the genotypes that computes the call rate and allele
    frequencies, or before it where the HWE test is asked (its genotype counts refuse a call of an
    allele beyond the dimension); where the ``alleles`` dimension is no longer than
    ``max_alleles``, no variant can have more and nothing is counted.

    The minor allele frequency is PLINK 2's: one minus the frequency of the most common allele
    (for a biallelic variant, the smaller of the two). A variant with no called allele has none,
    and is removed by ``min_maf``. Statistics missing from ``ds`` are computed by
    ``variant_stats`` and ``hardy_weinberg_test``.
    """
    from . import stats

    name = "filter_variants"
    named = None
    for key, v, hi in (("min_call_rate", min_call_rate, 1), ("min_maf", min_maf, 0.5), ("min_hwe_p", min_hwe_p, 1)):
        if v is not None and not 0 <= v <= hi:
            raise InputError(f"{name}: {key} must be between 0 and {hi}, got {v}")
    if max_alleles is not None:
        if max_alleles < 1:
            raise InputError(f"{name}: max_alleles must be 1 or more, got {max_alleles}")
        alleles = variable(ds, "variant_allele", ("variants", "alleles"), "OUST", op=name)
        # a variant names at most as many alleles as the dimension holds: where that is within
        # max_alleles (a store of biallelic variants, as bcftools norm -m- leaves one), every
        # variant is kept and the strings are not read (2.5 million variants' strings took about
        # a second of the GWAS flow on the GPU machine)
        if ds.sizes["alleles"] > max_alleles:
            named = _alleles_named(alleles.data)
            if min_hwe_p is not None:  # the HWE test refuses a call of an allele beyond the dimension
                (n_alleles,) = to_numpy_all(named)
                ds, named = keep_positions(ds, "variants", n_alleles <= max_alleles, filter_variants.op), None
            ds = ds.isel(alleles=slice(0, max_alleles))
    keep = np.ones(ds.sizes.get("variants", 0), dtype=bool)
    if min_call_rate is not None or min_maf is not None:
        if not {"variant_call_rate", "variant_allele_frequency"} <= set(ds.variables):
            ds = stats.variant_stats(ds)
    if min_hwe_p is not None and "variant_hwe_p_value" not in ds.variables:
        ds = stats.hardy_weinberg_test(ds)
    wanted = {}
    if min_call_rate is not None:
        wanted["call_rate"] = variable(ds, "variant_call_rate", ("variants",), "f", op=name)
    if min_maf is not None:
        wanted["af"] = variable(ds, "variant_allele_frequency", ("variants", "alleles"), "f", op=name)
    if min_hwe_p is not None:
        wanted["p"] = variable(ds, "variant_hwe_p_value", ("variants",), "f", op=name)
    # the alleles are counted in the pass that computes the call rate and allele frequencies: a
    # variant's are its own (of the alleles the dimension keeps; the kernels count no allele beyond
    # it), so those of the variants with more alleles are computed and dropped with them
    lazy = [x.data for x in wanted.values()] + ([named] if named is not None else [])
    values = to_numpy_all(*lazy)
    if named is not None:
        keep &= values.pop() <= max_alleles
    values = dict(zip(wanted, map(np.asarray, values)))
    if min_call_rate is not None:
        keep &= values["call_rate"] >= min_call_rate
    if min_maf is not None:
        with np.errstate(invalid="ignore"):
            maf = 1.0 - np.nanmax(np.where(np.isnan(values["af"]), -np.inf, values["af"]), axis=1)
        keep &= np.isfinite(maf) & (maf >= min_maf)
    if min_hwe_p is not None:
        keep &= ~(values["p"] < min_hwe_p)  # NaN (no called genotype) is kept, as PLINK keeps it
    return keep_positions(ds, "variants", keep, filter_variants.op)


@register(kernels=("take",), dataset=True, variables=Declared(
    needs=(
        Ensure("sample_call_rate", "sample_stats", when=given("min_call_rate")),
        read(specs.sample_call_rate_spec, when=given("min_call_rate")),
    ),
))
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
        (call_rate,) = _computed(variable(ds, "sample_call_rate", ("samples",), "f", op=name))
        keep &= call_rate >= min_call_rate
    return keep_positions(ds, "samples", keep, filter_samples.op)


@register(kernels=("patterson_moments", "fill_missing"), dataset=True, variables=Declared(
    needs=(Read("{variable}", DOSAGE, "iuf"),),
    adds=(Add("{variable}", DOSAGE, "f"),),
))
def impute_mean(ds: xr.Dataset, variable: str = "call_alternate_allele_count") -> xr.Dataset:
    """``variable`` (variants, samples) as float64 with each missing value (negative or NaN)
    replaced by its variant's mean over the called samples (NaN where none is called): the mean
    imputation PLINK's ``--pca`` makes, for ``pca`` and ``gwas_linear_regression``, which take
    complete data only (sgkit refuses missing values and leaves imputation to the user).

    Each block's counts and sums of called values per variant (``patterson_moments``, PCA's) come
    to the host, where the blocks of samples are added and the means taken; each block is then
    filled (``fill_missing``) on the dataset's backend. Nothing is computed."""
    import dask.array as da

    op = impute_mean.op
    x = _variable(ds, variable, ("variants", "samples"), "iuf", op=op.name)
    backend = backend_of_dataset(x)
    data = _float64_blocks(as_dask(x), backend)
    moments = da.blockwise(_host_moments, "vsk", data, "vs", kernel=op.kernel("patterson_moments", backend),
                           new_axes={"k": 3}, adjust_chunks={"s": 1}, dtype=np.float64,
                           meta=np.empty((0, 0, 0), dtype=np.float64)).sum(axis=1)
    called = moments[:, 0]
    mean = moments[:, 1] / da.where(called > 0, called, np.nan)  # on the host: NaN where none is called
    filled = da.blockwise(op.kernel("fill_missing", backend), "vs", data, "vs", mean, "v", dtype=np.float64,
                          meta=meta(backend, np.float64, 2))
    out = xr.DataArray(filled, dims=x.dims, coords=x.coords,
                       attrs={**x.attrs, "comment": f"{variable} with missing values replaced by the variant's mean over called samples"})
    return ds.assign({variable: out})


def _float64_blocks(data, backend: str):
    """``data`` with its blocks split along the variants (slices of each block, nothing joined)
    so that a block of the float64 result, with all the samples, holds at most the backend's block
    size (``pipeline.gpu.block-size``, ``pipeline.cpu.block-size``; none: unchanged).

    The stored genotypes are read in blocks of up to that size (:func:`pipeline.sources.blocks_along_first`),
    and their float64 dosages are 4-8 times larger: on the H200 at 200,000 variants x 25,000
    samples, 4 GB blocks of int8 genotypes (all the variants, a chunk of 10,000 samples) made
    16 GB blocks here, which sgkit's ``.chunk({"samples": -1})`` before ``pca`` joined into one
    of 40 GB: out of device memory."""
    from ...exec.memory import block_limits

    size = block_limits(backend)[0]
    if not size or data.ndim != 2 or not data.shape[1]:
        return data
    rows = max(1, size // (8 * data.shape[1]))
    if max(data.chunks[0], default=0) <= rows:
        return data
    return data.rechunk({0: tuple(part for c in data.chunks[0] for part in even_chunks(c, rows))})


def _host_moments(block, *, kernel):
    """A block's (variants, 1, 3) counts, sums and sums of squares of called values, on the host."""
    return to_numpy(kernel(block))[:, None, :]
