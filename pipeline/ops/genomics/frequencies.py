"""Allele frequencies and heterozygosity, as sgkit 0.10 computes them: ``call_allele_frequencies``,
``cohort_allele_frequencies`` (``stats/aggregation.py``), ``individual_heterozygosity`` and
``observed_heterozygosity`` (``stats/popgen.py``).

Each starts from allele counts, computed by pipeline's counting kernels where the dataset lacks them
(``count_call_alleles``, ``count_cohort_alleles``) and merged into the result as sgkit does. The
frequencies and the heterozygosity are sgkit's float64 formulas, block by block on the counts'
backend (NumPy or CuPy chunks): nothing is computed until the caller asks. The means over each
cohort's samples are a reduction of the blueprint (:func:`pipeline.reduce.aggregation.nan_mean`:
float64 sums and int64 counts of each block of samples, added over the blocks and declared to the
memory plan).

As sgkit:

- a frequency is NaN where a call (or cohort) has no called allele;
- ``call_heterozygosity`` is NaN where a call has fewer than two called alleles;
- ``stat_observed_heterozygosity`` is the mean over each cohort's samples of their
  ``call_heterozygosity``, NaN left out (NaN for a cohort with none), summed over each window where
  the dataset has windows (a window with a NaN term is NaN).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ... import kernels
from ...backend import backend_of, meta, to_backend, xp_of
from ...deferred import module as _deferred
from ...reduce import aggregation as agg
from ._dataset import as_dask, merge as _merge, variable
from .popgen import _cohorts, _if_absent, _windowed, count_cohort_alleles
from .specs import annotate
from .stats import count_call_alleles
from .window import has_windows

da = _deferred("dask.array")  # imported when the first graph is built

__all__ = ["call_allele_frequencies", "cohort_allele_frequencies", "individual_heterozygosity",
           "observed_heterozygosity"]

F8 = np.float64


def _new(name: str, dims: tuple[str, ...], data) -> xr.Dataset:
    """A dataset of one variable, with sgkit's documentation of it as its ``comment``."""
    return annotate(xr.Dataset({name: (dims, data)}))


def _frequencies(ac):
    """sgkit's ``AC / AC.sum(dim="alleles")`` on one block (alleles whole)."""
    xp = xp_of(ac)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ac / ac.sum(axis=-1, dtype=xp.uint64)[..., None]


def _allele_frequencies(ds: xr.Dataset, name: str, dims: tuple[str, ...], out: str, op: str) -> xr.Dataset:
    ac = variable(ds, name, dims, "u", op=op)
    AC = as_dask(ac).rechunk({2: -1})
    af = AC.map_blocks(_frequencies, dtype=F8, meta=meta(backend_of(AC), F8, 3))
    return _new(out, dims, af)


def call_allele_frequencies(ds: xr.Dataset, *, call_allele_count: str = "call_allele_count",
                            merge: bool = True) -> xr.Dataset:
    """Each call's allele frequencies, ``call_allele_frequency`` (variants, samples, alleles),
    float64: its allele counts over their sum (``call_allele_count``, counted where absent)."""
    op = "call_allele_frequencies"
    ds = _if_absent(ds, "call_allele_count", call_allele_count, count_call_alleles, op)
    new = _allele_frequencies(ds, call_allele_count, ("variants", "samples", "alleles"), "call_allele_frequency", op)
    return _merge(ds, new, merge)


def cohort_allele_frequencies(ds: xr.Dataset, *, cohort_allele_count: str = "cohort_allele_count",
                              merge: bool = True) -> xr.Dataset:
    """Each cohort's allele frequencies, ``cohort_allele_frequency`` (variants, cohorts, alleles),
    float64: its allele counts over their sum (``cohort_allele_count``, counted where absent)."""
    op = "cohort_allele_frequencies"
    ds = _if_absent(ds, "cohort_allele_count", cohort_allele_count, count_cohort_alleles, op)
    new = _allele_frequencies(ds, cohort_allele_count, ("variants", "cohorts", "alleles"), "cohort_allele_frequency",
                              op)
    return _merge(ds, new, merge)


def _heterozygosity(ac):
    """sgkit's individual heterozygosity of each call of a (variants, samples, alleles) block."""
    xp = xp_of(ac)
    k = ac.sum(axis=-1, dtype=xp.uint64)
    k2 = xp.where(k > 1, k, xp.nan)  # NaN, not a division by zero, where k - 1 would be 0
    af = ac / k2[..., None]
    return (1 - xp.sum(af**2, axis=-1)) * (k / (k2 - 1))


def individual_heterozygosity(ds: xr.Dataset, *, call_allele_count: str = "call_allele_count",
                              merge: bool = True) -> xr.Dataset:
    """Each call's heterozygosity, ``call_heterozygosity`` (variants, samples), float64: the
    probability that two of its alleles drawn without replacement differ (NaN with fewer than two
    called alleles), from ``call_allele_count`` (counted where absent)."""
    op = "individual_heterozygosity"
    ds = _if_absent(ds, "call_allele_count", call_allele_count, count_call_alleles, op)
    ac = variable(ds, call_allele_count, ("variants", "samples", "alleles"), "u", op=op)
    AC = as_dask(ac).rechunk({2: -1})
    hi = AC.map_blocks(_heterozygosity, drop_axis=2, dtype=F8, meta=meta(backend_of(AC), F8, 2))
    return _merge(ds, _new("call_heterozygosity", ("variants", "samples"), hi), merge)


def _cohort_nansums(block, cohorts, axis, *, n_cohorts: int) -> dict:
    """The partial of a (variants, samples, 1) block of ``call_heterozygosity`` for
    :func:`~pipeline.reduce.aggregation.nan_mean`: the sum and the number of the values that are
    not NaN of each cohort's samples, (variants, 1, cohorts); samples of no cohort (negative) left
    out. ``cohorts``: the samples' cohorts broadcast over the block (the blueprint's weights)."""
    xp = xp_of(block)
    x = block[..., 0]
    members = (cohorts[0, :, 0][:, None] == xp.arange(n_cohorts)[None, :]).astype(x.dtype)
    ok = ~xp.isnan(x)
    sums = xp.where(ok, x, 0) @ members
    # counted as a float64 product, exact below 2**53 samples, where BLAS (cuBLAS) does it
    counts = (ok.astype(x.dtype) @ members).astype(np.int64)
    return {"sum": sums[:, None], "count": counts[:, None]}


def observed_heterozygosity(ds: xr.Dataset, *, call_heterozygosity: str = "call_heterozygosity",
                            sample_cohort: str = "sample_cohort", merge: bool = True) -> xr.Dataset:
    """Each cohort's observed heterozygosity, ``stat_observed_heterozygosity``: the mean of its
    samples' ``call_heterozygosity`` (computed where absent), NaN left out, (variants, cohorts)
    float64; summed over each window (windows, cohorts) where the dataset has windows."""
    op = "observed_heterozygosity"
    ds = _if_absent(ds, "call_heterozygosity", call_heterozygosity, individual_heterozygosity, op)
    hi = variable(ds, call_heterozygosity, ("variants", "samples"), "f", op=op)
    cohort, n_cohorts = _cohorts(ds, sample_cohort, op)
    H = as_dask(hi).astype(F8)
    backend = backend_of(H)
    # the samples' cohorts as the blueprint's weights (broadcast, a view), the cohorts as the
    # columns of a last axis of length 1 (the blueprint's ``width``)
    x = H[:, :, None]
    coh = to_backend(da.from_array(cohort[:, None], chunks=(H.chunks[1], 1)), backend)
    mean = agg.nan_mean("pipeline-cohort-heterozygosity", "_cohort_nansums", n_cohorts=n_cohorts)
    ho = agg.reduce(x, mean, (1,), kernel=_cohort_nansums, dtype=F8, width=n_cohorts,
                    weights=agg.broadcast_view(coh, x.shape, chunks=x.chunks))
    if has_windows(ds):
        new = _new("stat_observed_heterozygosity", ("windows", "cohorts"),
                   _windowed(ds, ho, kernels.get("window_sum", backend)))
    else:
        new = _new("stat_observed_heterozygosity", ("variants", "cohorts"), ho)
    return _merge(ds, new, merge)
