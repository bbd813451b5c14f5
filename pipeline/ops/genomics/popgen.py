"""Population genetics by cohort: sgkit's ``count_cohort_alleles``, ``diversity``,
``divergence``, ``Fst`` and ``Tajimas_D``.

Every statistic starts from the allele counts of each cohort at each variant
(``cohort_allele_count``, variants x cohorts x alleles), counted in one pass over the int8
genotype calls: a task counts one block of (variants, samples) for all cohorts at once, and the
counts of the blocks of samples add up (the reduction blueprint's
:func:`~pipeline.reduce.aggregation.integer_sum`, as the counts of :mod:`.stats`), so no (variants, samples, alleles) array of
per-call counts is made for them (sgkit counts from one, ``call_allele_count``, and keeps it in
its result: merged results hold it here too, as a graph of its own that costs nothing unless it
is computed; where the dataset already holds it, it is summed by cohort instead, as sgkit does).

The statistics are per variant, or, where the dataset has windows (:mod:`.window`), summed over
each window: per-variant terms are computed block by block, and each block adds its part of
every window that overlaps it (:func:`pipeline.reduce.windows.window_sums`), so window bounds
fall anywhere in the blocks and blocks anywhere in the windows. NaN terms (a cohort with fewer
than two calls at a variant) make their windows NaN, as sgkit's sums do.

As sgkit, an op computes the variables it needs where the dataset lacks them (``diversity`` the
cohort allele counts, ``Fst`` the divergence, ``Tajimas_D`` the variant allele counts and the
diversity) and keeps them in its result when merging; a variable given under another name than
the default must be in the dataset. ``Tajimas_D`` on a dataset with neither count gets both the
cohort and the variant allele counts from one read of the genotypes (the samples of no cohort
counted as one cohort more). The mathematics is in :mod:`pipeline.kernels.popgen`.

Where sgkit is surprising, these ops do as it does:

- ``stat_Fst`` has dimensions ``(windows, cohorts_0, cohorts_1)`` even without windows (its
  first dimension then has one entry per variant);
- ``Tajimas_D`` counts segregating sites over all samples (those in no cohort too), as alleles
  seen less one, so -1 at a variant without calls, and takes the number of alleles sampled, n, as
  the most called at any variant;
- a window sum is NaN where any of its variants' terms is NaN.
"""

from __future__ import annotations

import itertools
from typing import Callable, Literal, Sequence

import numpy as np
import xarray as xr

from ... import kernels
from ...backend import backend_of, meta as backend_meta, to_backend, to_numpy, xp_of
from ...deferred import module as _deferred
from ...errors import InputError, NotImplementedInputError
from ...reduce import aggregation as agg
from ...reduce.windows import window_sums
from ..registry import register
from . import specs
from ._dataset import as_dask, merge as _merge, variable
from .stats import count_call_alleles
from .variables import A, ANY, S, V, W, Add, Declared, Dim, Ensure, Read, absent, add, present, read
from .window import has_windows

da = _deferred("dask.array")  # imported when the first graph is built

COMMENTS = {  # sgkit's documentation of its variables, which it sets as their "comment"
    "cohort_allele_count": "Cohort allele counts.",
    "variant_allele_count": "Variant allele counts. With shape (variants, alleles) and values\n"
    "corresponding to the number of non-missing occurrences of each allele.",
    "stat_diversity": "Genetic diversity (also known as \"Tajima\u2019s pi\") for cohorts.",
    "stat_divergence": "Genetic divergence between pairs of cohorts.",
    "stat_Fst": "Fixation index (Fst) between pairs of cohorts.",
    "stat_Tajimas_D": "Tajima\u2019s D for cohorts.",
    "stat_pbs": "Population branching statistic for cohort triples.",
    "stat_Garud_h1": "Garud H1 statistic for cohorts.",
    "stat_Garud_h12": "Garud H12 statistic for cohorts.",
    "stat_Garud_h123": "Garud H123 statistic for cohorts.",
    "stat_Garud_h2_h1": "Garud H2/H1 statistic for cohorts.",
    "stat_Weir_Goudet_beta": "Pairwise Weir Goudet beta statistic among all samples.",
}
COUNT = np.uint64
F8 = np.float64
COUNTING = ("cohort_allele_count", "cohort_sum")  # the kernels that make cohort allele counts


def _new(name: str, dims: tuple[str, ...], data) -> xr.Dataset:
    return xr.Dataset({name: (dims, data, {"comment": COMMENTS[name]})})


def _if_absent(ds: xr.Dataset, default: str, name: str, compute: Callable[[xr.Dataset], xr.Dataset],
               op: str) -> xr.Dataset:
    """sgkit's ``define_variable_if_absent``: ``ds``, with ``default`` computed (and merged) where
    it is missing; a variable of another name must be there."""
    if name in ds:
        return ds
    if name != default:
        raise InputError(f"{op}: the dataset has no variable {name!r} (only {default!r} is computed where missing)")
    return compute(ds)


def _whole(x, axes) -> "da.Array":
    """``x`` as a Dask array with ``axes`` in one chunk each (cohorts, alleles: small)."""
    return as_dask(x).rechunk({a: -1 for a in axes})


# --- allele counts ----------------------------------------------------------------------------------


def _with_call_counts(ds: xr.Dataset, call_genotype: str = "call_genotype") -> xr.Dataset:
    """``ds`` with sgkit's ``call_allele_count`` where it lacks it: sgkit counts the cohorts' and
    the variants' alleles from it, defining it first and merging into that dataset, so its merged
    results hold it. Here it is a graph of its own (the counts are read from the genotypes), which
    costs nothing unless it is computed."""
    return ds if "call_allele_count" in ds else count_call_alleles(ds, call_genotype=call_genotype)


class _CohortKernel:
    """A cohort kernel (``cohort_allele_count``, ``cohort_sum``) called as the reduction blueprint
    calls a weighted chunk kernel: the samples' cohorts come as the weights (broadcast over the
    block, a view), and the block's counts (variants, cohorts, alleles) are the partial's one
    field, cohorts and alleles in one last axis (the blueprint's ``width``). Keeps the kernel's
    name; module-level, so that tasks holding it pickle by reference."""

    def __init__(self, kernel):
        self.kernel, self.name = kernel, kernel.name

    def __call__(self, block, cohorts, axis, **params):
        counts = self.kernel(block, cohorts[0, :, 0], **params)
        return {"total": counts.reshape(counts.shape[0], 1, -1)}


def _by_cohort(x: "da.Array", cohort: np.ndarray, kernel, n_cohorts: int, width: int, **params) -> "da.Array":
    """Counts (variants, cohorts, ``width`` alleles) of a (variants, samples, k) array: ``kernel``
    makes each block's counts, and those of the blocks along the samples are added up by the
    reduction blueprint (uint64 partials, declared to the memory plan; merged on the host where
    small: on CuPy the sum and its copy compiled kernels of their own on a fresh machine)."""
    backend = backend_of(x)
    x = x.rechunk({2: -1})
    coh = to_backend(da.from_array(cohort[:, None], chunks=(x.chunks[1], 1)), backend)
    counts = agg.integer_sum(f"pipeline-{kernel.name.replace('_', '-')}", kernel.name, dtype=COUNT,
                             n_cohorts=n_cohorts, **params)
    flat = agg.reduce(x, counts, (1,), kernel=_CohortKernel(kernel), dtype=COUNT, width=n_cohorts * width,
                      weights=agg.broadcast_view(coh, x.shape, chunks=x.chunks))
    return flat.reshape(flat.shape[0], n_cohorts, width)


def _cohorts(ds: xr.Dataset, sample_cohort: str, op: str) -> tuple[np.ndarray, int]:
    """Each sample's cohort (negative: none), and the number of cohorts (the largest + 1)."""
    c = variable(ds, sample_cohort, ("samples",), "iu", op=op)
    cohort = np.asarray(to_numpy(c.data)).astype(np.int64, copy=False)
    return cohort, max(int(cohort.max()) + 1, 0) if cohort.size else 0


def _n_alleles(ds: xr.Dataset, op: str) -> int:
    if "alleles" not in ds.sizes:
        raise InputError(f"{op}: the dataset has no alleles dimension "
                         "(variant_allele, of dimensions (variants, alleles), gives it)")
    return int(ds.sizes["alleles"])


def _genotype_counts(ds: xr.Dataset, cohort: np.ndarray, n_cohorts: int, kernel, op: str,
                     call_genotype: str = "call_genotype") -> "da.Array":
    g = variable(ds, call_genotype, ("variants", "samples", "ploidy"), "i", op=op)
    n_alleles = _n_alleles(ds, op)
    return _by_cohort(as_dask(g), cohort, kernel, n_cohorts, n_alleles, n_alleles=n_alleles)


@register(kernels=COUNTING, dataset=True, variables=Declared(
    needs=(
        # unsigned cohorts and counts too, where sgkit's specs say one kind
        Read("{sample_cohort}", (S,), "iu"),
        Ensure("{call_allele_count}", None),  # summed by cohort where there; else the genotypes are counted
        Read("{call_allele_count}", (V, S, A), "iu", when=present("{call_allele_count}")),
        read(specs.call_genotype_spec, "{call_genotype}", when=absent("{call_allele_count}")),
        Dim(A, when=absent("{call_allele_count}")),
    ),
    # merged, with call_allele_count where counted from the genotypes, as sgkit defines it first
    adds=(add(specs.cohort_allele_count_spec),
          add(specs.call_allele_count_spec, when=lambda p, ds: p.get("merge", True) is not False
              and absent("{call_allele_count}")(p, ds))),
))
def count_cohort_alleles(
    ds: xr.Dataset,
    *,
    call_allele_count: str = "call_allele_count",
    sample_cohort: str = "sample_cohort",
    call_genotype: str = "call_genotype",
    merge: bool = True,
) -> xr.Dataset:
    """Allele counts of each cohort at each variant, ``cohort_allele_count`` (variants, cohorts,
    alleles), uint64: the called alleles (missing and fill calls left out) of the samples of each
    cohort (``sample_cohort``: 0, 1, ...; a negative cohort counts in none).

    Counted from ``call_genotype`` in one pass; where the dataset holds per-sample counts
    (``call_allele_count``, variants x samples x alleles), those are summed by cohort, as sgkit
    does.
    """
    name = "count_cohort_alleles"
    op = count_cohort_alleles.op
    cohort, n_cohorts = _cohorts(ds, sample_cohort, name)
    if call_allele_count in ds:
        ac = variable(ds, call_allele_count, ("variants", "samples", "alleles"), "iu", op=name)
        backend = backend_of(ac)
        counts = _by_cohort(as_dask(ac), cohort, op.kernel("cohort_sum", backend), n_cohorts, ac.sizes["alleles"])
    else:
        if call_allele_count != "call_allele_count":
            raise InputError(f"{name}: the dataset has no variable {call_allele_count!r}")
        backend = backend_of(variable(ds, call_genotype, op=name))
        counts = _genotype_counts(ds, cohort, n_cohorts, op.kernel("cohort_allele_count", backend), name, call_genotype)
        if merge:
            ds = _with_call_counts(ds, call_genotype)
    return _merge(ds, _new("cohort_allele_count", ("variants", "cohorts", "alleles"), counts), merge)


def _count_variant_alleles(ds: xr.Dataset, kernel_of) -> xr.Dataset:
    """``variant_allele_count`` (variants, alleles), uint64, over all samples (sgkit's
    ``count_variant_alleles(ds, using="call_genotype")``), merged: the cohort kernel with every
    sample in one cohort."""
    g = variable(ds, "call_genotype", ("variants", "samples", "ploidy"), "i", op="Tajimas_D")
    cohort = np.zeros(g.sizes["samples"], dtype=np.int64)
    counts = _genotype_counts(ds, cohort, 1, kernel_of("cohort_allele_count", backend_of(g)), "Tajimas_D")
    return _merge(_with_call_counts(ds), _new("variant_allele_count", ("variants", "alleles"), counts[:, 0]), True)


def _cohort_and_variant_counts(ds: xr.Dataset, kernel_of) -> xr.Dataset:
    """``cohort_allele_count`` and ``variant_allele_count`` from one pass over the genotypes,
    merged: the samples of no cohort counted as one cohort more, which the variant counts add in
    and the cohort counts leave out."""
    cohort, n_cohorts = _cohorts(ds, "sample_cohort", "Tajimas_D")
    g = variable(ds, "call_genotype", ("variants", "samples", "ploidy"), "i", op="Tajimas_D")
    extended = np.where((cohort >= 0) & (cohort < n_cohorts), cohort, n_cohorts)
    counts = _genotype_counts(ds, extended, n_cohorts + 1, kernel_of("cohort_allele_count", backend_of(g)), "Tajimas_D")
    new = xr.merge([_new("cohort_allele_count", ("variants", "cohorts", "alleles"), counts[:, :n_cohorts]),
                    _new("variant_allele_count", ("variants", "alleles"), counts.sum(axis=1, dtype=COUNT))])
    return _merge(_with_call_counts(ds), new, True)


# --- statistics -----------------------------------------------------------------------------------


def _windowed(ds: xr.Dataset, x: "da.Array", kernel) -> "da.Array":
    """``x`` (variants, ...) summed over the dataset's windows.

    Not the blueprint's ``binned_reduce``, which puts each step in one bin: sgkit's windows may
    overlap (``window_by_variant`` with a step below the size, ``window_by_position``) and leave
    variants out, so :func:`~pipeline.reduce.windows.window_sums` adds each block's pieces of every
    window it overlaps, and declares those partials to the memory plan itself."""
    starts = np.asarray(to_numpy(ds["window_start"].data)).astype(np.int64, copy=False)
    stops = np.asarray(to_numpy(ds["window_stop"].data)).astype(np.int64, copy=False)
    return window_sums(x, starts, stops, kernel=kernel)


def _cohort_counts(ds: xr.Dataset, cohort_allele_count: str, op: str) -> tuple[xr.Dataset, "da.Array"]:
    ds = _if_absent(ds, "cohort_allele_count", cohort_allele_count, count_cohort_alleles, op)
    ac = variable(ds, cohort_allele_count, ("variants", "cohorts", "alleles"), "iu", op=op)
    return ds, _whole(ac, (1, 2))


@register(kernels=(*COUNTING, "diversity_terms", "window_sum"), dataset=True, variables=Declared(
    needs=(Ensure("{cohort_allele_count}", "count_cohort_alleles"),
           Read("{cohort_allele_count}", (V, "cohorts", A), "iu")),
    adds=(add(specs.stat_diversity_spec),),
))
def diversity(ds: xr.Dataset, *, cohort_allele_count: str = "cohort_allele_count", merge: bool = True) -> xr.Dataset:
    """Genetic diversity (Tajima's pi) of each cohort, ``stat_diversity``: per variant the
    probability that two alleles drawn without replacement from the cohort's calls differ (NaN
    with fewer than two calls), float64, (variants, cohorts); or its sum over each window
    (windows, cohorts) where the dataset has windows."""
    name = "diversity"
    op = diversity.op
    ds, ac = _cohort_counts(ds, cohort_allele_count, name)
    backend = backend_of(ac)
    pi = ac.map_blocks(op.kernel("diversity_terms", backend), drop_axis=2, dtype=F8, meta=backend_meta(backend, F8, 2))
    if has_windows(ds):
        new = _new("stat_diversity", ("windows", "cohorts"), _windowed(ds, pi, op.kernel("window_sum", backend)))
    else:
        new = _new("stat_diversity", ("variants", "cohorts"), pi)
    return _merge(ds, new, merge)


@register(kernels=(*COUNTING, "divergence_terms", "window_sum"), dataset=True, variables=Declared(
    needs=(Ensure("{cohort_allele_count}", "count_cohort_alleles"),
           Read("{cohort_allele_count}", (V, "cohorts", A), "iu")),
    adds=(add(specs.stat_divergence_spec),),
))
def divergence(ds: xr.Dataset, *, cohort_allele_count: str = "cohort_allele_count", merge: bool = True) -> xr.Dataset:
    """Genetic divergence between each pair of cohorts, ``stat_divergence``: per variant the
    probability that an allele of cohort i and one of cohort j differ, and each cohort's
    diversity on the diagonal, float64, (variants, cohorts_0, cohorts_1); or its sum over each
    window (windows, cohorts_0, cohorts_1) where the dataset has windows."""
    name = "divergence"
    op = divergence.op
    ds, ac = _cohort_counts(ds, cohort_allele_count, name)
    backend = backend_of(ac)
    c = ac.shape[1]
    d = ac.map_blocks(op.kernel("divergence_terms", backend), chunks=(ac.chunks[0], (c,), (c,)), dtype=F8,
                      meta=backend_meta(backend, F8, 3))
    if has_windows(ds):
        d = _windowed(ds, d, op.kernel("window_sum", backend))
        new = _new("stat_divergence", ("windows", "cohorts_0", "cohorts_1"), d)
    else:
        new = _new("stat_divergence", ("variants", "cohorts_0", "cohorts_1"), d)
    return _merge(ds, new, merge)


@register(kernels=(*COUNTING, "divergence_terms", "window_sum", "fst"), dataset=True, variables=Declared(
    needs=(Ensure("{stat_divergence}", "divergence"), Read("{stat_divergence}", (ANY, "cohorts_0", "cohorts_1"), "f")),
    adds=(Add("stat_Fst", (W, "cohorts_0", "cohorts_1"), "f"),),  # "windows" even per variant, as sgkit
))
def Fst(
    ds: xr.Dataset,
    *,
    estimator: Literal["Hudson", "Nei"] | None = None,
    stat_divergence: str = "stat_divergence",
    merge: bool = True,
) -> xr.Dataset:
    """Fixation index between each pair of cohorts, ``stat_Fst``, from the divergence (and the
    diversities on its diagonal), per variant or per window as the divergence is: Hudson's
    estimator (Bhatia et al. 2013, as scikit-allel; the default) or Nei's (as tskit), float64,
    NaN on the diagonal. Its dimensions are (windows, cohorts_0, cohorts_1) in both cases, as
    sgkit names them."""
    name = "Fst"
    op = Fst.op
    if estimator is not None and estimator not in ("Hudson", "Nei"):
        raise InputError(f"{name}: estimator must be 'Hudson' or 'Nei' (or None: Hudson), got {estimator!r}")
    ds = _if_absent(ds, "stat_divergence", stat_divergence, divergence, name)
    d = variable(ds, stat_divergence, kind="f", op=name)
    if d.ndim != 3 or tuple(d.dims[1:]) != ("cohorts_0", "cohorts_1"):
        raise InputError(f"{name}: variable {stat_divergence!r} has dimensions {tuple(map(str, d.dims))}, "
                         "expected (windows or variants, cohorts_0, cohorts_1)")
    dd = _whole(d, (1, 2))
    backend = backend_of(dd)
    f = dd.map_blocks(op.kernel("fst", backend), estimator=estimator or "Hudson", dtype=F8,
                      meta=backend_meta(backend, F8, 3))
    # sgkit names the first dimension "windows" whether or not the divergence is windowed
    return _merge(ds, _new("stat_Fst", ("windows", "cohorts_0", "cohorts_1"), f), merge)


def _tajimas_block(div, S, n, *, kernel):
    return kernel(div, S.reshape(-1), n)


@register(kernels=(*COUNTING, "diversity_terms", "segregating_sites", "window_sum", "tajimas_d"), dataset=True,
          variables=Declared(
    needs=(
        # sgkit counts the variants' alleles from call_allele_count, which it defines first
        Ensure("call_allele_count", "count_call_alleles", when=absent("{variant_allele_count}")),
        Ensure("{variant_allele_count}", "count_variant_alleles", {"using": "call_genotype"}),
        Ensure("{stat_diversity}", "diversity"),
        Read("{variant_allele_count}", (V, A), "iu"),
        read(specs.stat_diversity_spec, "{stat_diversity}"),
    ),
    adds=(add(specs.stat_Tajimas_D_spec),),
))
def Tajimas_D(
    ds: xr.Dataset,
    *,
    variant_allele_count: str = "variant_allele_count",
    stat_diversity: str = "stat_diversity",
    merge: bool = True,
) -> xr.Dataset:
    """Tajima's D of each cohort, ``stat_Tajimas_D``, per variant or per window as the diversity
    is: the diversity less Watterson's theta (the segregating sites over all samples divided by
    the harmonic number a1 of n - 1, n the most alleles called at a variant), over its standard
    deviation; float64, inf or NaN where that deviation is 0."""
    name = "Tajimas_D"
    op = Tajimas_D.op
    absent = ("variant_allele_count", "cohort_allele_count", "call_allele_count", "stat_diversity")
    if variant_allele_count == "variant_allele_count" and not any(v in ds for v in absent):
        ds = _cohort_and_variant_counts(ds, op.kernel)  # both counts in one read of the genotypes
    ds = _if_absent(ds, "variant_allele_count", variant_allele_count,
                    lambda d: _count_variant_alleles(d, op.kernel), name)
    ds = _if_absent(ds, "stat_diversity", stat_diversity, diversity, name)
    ac = _whole(variable(ds, variant_allele_count, ("variants", "alleles"), "iu", op=name), (1,))
    div = variable(ds, stat_diversity, kind="f", op=name)
    rows = "windows" if has_windows(ds) else "variants"
    if tuple(div.dims) != (rows, "cohorts"):
        raise InputError(f"{name}: variable {stat_diversity!r} has dimensions {tuple(map(str, div.dims))}, "
                         f"expected {(rows, 'cohorts')}")
    backend = backend_of(ac)
    S = ac.map_blocks(op.kernel("segregating_sites", backend), drop_axis=1, dtype=F8, meta=backend_meta(backend, F8, 1))
    if rows == "windows":
        S = _windowed(ds, S, op.kernel("window_sum", backend))
    n = ac.sum(axis=1, dtype=F8).max()  # as sgkit: the number of alleles sampled is the most called
    D = da.map_blocks(_tajimas_block, _whole(div, (1,)), S[:, None], n, kernel=op.kernel("tajimas_d", backend),
                      dtype=F8, meta=backend_meta(backend, F8, 2))
    return _merge(ds, _new("stat_Tajimas_D", (rows, "cohorts"), D), merge)


# --- cohort triples, haplotype statistics, kinship ------------------------------------------------


def _cohorts_to_array(cohorts, index, width: int, n_cohorts: int, op: str) -> np.ndarray:
    """sgkit's ``_cohorts_to_array``: cohorts (or tuples of ``width`` cohorts) given by index or by
    their label in ``index`` (the dataset's cohort coordinates) -> int array (len, width)."""
    rows = []
    for c in cohorts:
        t = (c,) if width == 1 and not isinstance(c, (tuple, list)) else tuple(c)
        if len(t) != width:
            raise InputError(f"{op}: cohorts must be {'single cohorts' if width == 1 else f'tuples of {width} cohorts'}, "
                             f"got {c!r}")
        ids = []
        for x in t:
            if isinstance(x, str):
                if index is None or x not in index:
                    raise InputError(f"{op}: cohort {x!r} is not one of the dataset's cohort labels "
                                     f"({', '.join(map(str, index)) if index is not None else 'none: give cohort numbers'})")
                x = index.get_loc(x)
            if not isinstance(x, (int, np.integer)) or not 0 <= int(x) < n_cohorts:
                raise InputError(f"{op}: cohort {x!r} is not a cohort number from 0 to {n_cohorts - 1}")
            ids.append(int(x))
        rows.append(ids)
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), width)


# Garud's H, the PBS and Weir and Goudet's beta finish on the host where their inputs are small:
# the windows' hashes (their sorts and run counts), the windows' Fst, the identity by state's mean.
# On CuPy each of their array formulas compiled a kernel of its own on a fresh machine (about 40 for
# Garud's H and the PBS, 3-4 s of a first run on the H200 machine; the mean's sums were two CUB
# reductions, 1.7 s each), where NumPy sorts 80 MB of hashes, 200 windows of 50,000 haplotypes, in
# 0.21 s on one core. The results go back to the GPU.
FINISH_ON_HOST_BYTES = 64 << 20


def _finishing_backend(backend: str, nbytes: int) -> str:
    """Where a statistic of ``nbytes`` of input finishes: on the host up to :data:`FINISH_ON_HOST_BYTES`."""
    return "cpu" if nbytes <= FINISH_ON_HOST_BYTES else backend


def _pbs_block(fst, *, triples: np.ndarray):
    """sgkit's ``_pbs_cohorts`` on a block of Fst (rows, c, c): NaN but at the triples."""
    xp = xp_of(fst)
    t = -xp.log(1 - xp.clip(fst, 0, 1 - np.finfo(float).epsneg))
    c = fst.shape[1]
    out = xp.full((fst.shape[0], c, c, c), np.nan, dtype=F8)
    for i, j, k in triples:
        ret = (t[:, i, j] + t[:, i, k] - t[:, j, k]) / 2
        out[:, i, j, k] = ret / (1 + (t[:, i, j] + t[:, i, k] + t[:, j, k]) / 2)
    return out


def pbs(
    ds: xr.Dataset,
    *,
    stat_Fst: str = "stat_Fst",
    cohorts: Sequence[tuple[int, int, int] | tuple[str, str, str]] | None = None,
    merge: bool = True,
) -> xr.Dataset:
    """Population branching statistic of cohort triples, sgkit's ``pbs``: ``stat_pbs`` (windows,
    cohorts_0, cohorts_1, cohorts_2), float64, from the Fst (computed by :func:`Fst` where the
    dataset lacks it), per variant or per window as the Fst is; NaN but at the triples
    ``cohorts`` (numbers, or labels of the ``cohorts_0`` coordinates; default: every increasing
    triple)."""
    name = "pbs"
    ds = _if_absent(ds, "stat_Fst", stat_Fst, Fst, name)
    fst = variable(ds, stat_Fst, kind="f", op=name)
    if fst.ndim != 3 or tuple(fst.dims[1:]) != ("cohorts_0", "cohorts_1") or fst.shape[1] != fst.shape[2]:
        raise InputError(f"{name}: variable {stat_Fst!r} has dimensions {tuple(map(str, fst.dims))}, "
                         "expected (windows, cohorts_0, cohorts_1)")
    n = int(fst.shape[1])
    triples = _cohorts_to_array(list(cohorts or itertools.combinations(range(n), 3)),
                                ds.indexes.get("cohorts_0"), 3, n, name)
    f = _whole(fst, (1, 2))
    backend = backend_of(f)
    finish = _finishing_backend(backend, f.shape[0] * n**3 * 8)  # the output's size
    p = to_backend(f, finish).map_blocks(_pbs_block, triples=triples, chunks=(f.chunks[0], (n,), (n,), (n,)),
                                         new_axis=3, dtype=F8, meta=backend_meta(finish, F8, 4))
    dims = ("windows", "cohorts_0", "cohorts_1", "cohorts_2")
    return _merge(ds, _new("stat_pbs", dims, to_backend(p, backend)), merge)


# Garud's H counts the distinct haplotypes of a window, which sgkit tells apart by a hash of each
# haplotype's alleles over the window's variants (DJBX33A: h = 33 h + a from 5381, in int64 that
# wraps). That hash is linear: for a window [start, stop) it is 5381 * 33^n + 33^(stop - 1)
# sum_i a_i 33^-i modulo 2^64 (33 is odd, so invertible modulo 2^64). So each variant adds its
# term a_i 33^-i, a block of variants gives its prefix sums, and the windows' hashes come from
# the prefix sums at their bounds: one pass over the genotypes, blocks of variants and samples
# anywhere, only (windows, haplotypes) hashes kept, the same hashes as sgkit's.
U8 = np.uint64
_MOD = 1 << 64
_INV33 = pow(33, -1, _MOD)


def _powers(base: int, first: int, n: int) -> np.ndarray:
    """``base^(first + i) mod 2^64`` for i < n, uint64."""
    out = np.empty(n, dtype=U8)
    x = pow(base, first, _MOD)
    for i in range(n):
        out[i] = x
        x = x * base % _MOD
    return out


def _hash_prefix(g, *, firsts, rels, kernel, block_id=None):
    """Prefix sums of the hash terms of a (variants, samples, ploidy) block at the block's
    relative bounds ``rels[k]`` (0 to the block's length) -> (bounds, haplotypes) uint64, by the
    ``hash_prefix`` kernel."""
    k = block_id[0]
    return kernel(g, _powers(_INV33, int(firsts[k]), g.shape[0]), rels[k])


def _window_hashes(q, *, row, block, totals, lo, hi, scale, const):
    """The windows' hashes (windows, haplotypes) from the blocks' prefix sums ``q``."""
    xp = xp_of(q)
    offsets = xp.cumsum(q[xp.asarray(totals)], axis=0, dtype=U8)
    offsets = xp.concatenate([xp.zeros((1, q.shape[1]), dtype=U8), offsets[:-1]])
    p = q[xp.asarray(row)] + offsets[xp.asarray(block)]  # the prefix sum at each bound
    d = p[xp.asarray(hi)] - p[xp.asarray(lo)]
    return xp.asarray(const)[:, None] + xp.asarray(scale)[:, None] * d


def _garud_block(h, *, haplotype_cohort: np.ndarray, wanted: np.ndarray, n_cohorts: int):
    """sgkit's H1, H12, H123 and H2/H1 of each window (row of hashes) and cohort -> (windows,
    cohorts, 4), NaN for the cohorts not wanted: the haplotypes' counts, largest first."""
    xp = xp_of(h)
    out = xp.full((h.shape[0], n_cohorts, 4), np.nan, dtype=F8)
    for c in wanted:
        cols = np.flatnonzero(haplotype_cohort == c)
        n = cols.size
        if n == 0:
            continue
        s = xp.sort(h[:, xp.asarray(cols)], axis=1)
        first = xp.concatenate([xp.ones((s.shape[0], 1), dtype=bool), s[:, 1:] != s[:, :-1]], axis=1)
        at = xp.sort(xp.where(first, xp.arange(n)[None, :], n), axis=1)  # where each run starts
        nxt = xp.concatenate([at[:, 1:], xp.full((s.shape[0], 1), n, dtype=at.dtype)], axis=1)
        counts = -xp.sort(-xp.where(at < n, nxt - at, 0), axis=1)
        f = counts / n
        h1 = xp.sum(f**2, axis=1)
        out[:, c, 0] = h1
        out[:, c, 1] = xp.sum(f[:, :2], axis=1) ** 2 + xp.sum(f[:, 2:] ** 2, axis=1)
        out[:, c, 2] = xp.sum(f[:, :3], axis=1) ** 2 + xp.sum(f[:, 3:] ** 2, axis=1)
        out[:, c, 3] = (h1 - f[:, 0] ** 2) / h1
    return out


def Garud_H(
    ds: xr.Dataset,
    *,
    call_genotype: str = "call_genotype",
    sample_cohort: str = "sample_cohort",
    cohorts: Sequence[int | str] | None = None,
    merge: bool = True,
) -> xr.Dataset:
    """Garud et al.'s (2015) H1, H12, H123 and H2/H1 of each window and cohort, sgkit's
    ``Garud_H``: ``stat_Garud_h1``, ``stat_Garud_h12``, ``stat_Garud_h123`` and
    ``stat_Garud_h2_h1`` (windows, cohorts), float64, from the frequencies of the distinct
    haplotypes (missing and fill alleles are alleles of their own, as in sgkit) among each
    cohort's haplotypes in the window. Diploid, windowed datasets only; NaN for the cohorts not in
    ``cohorts`` (numbers or labels of the ``cohorts`` coordinates; default: all)."""
    name = "Garud_H"
    if "ploidy" not in ds.sizes or ds.sizes["ploidy"] != 2:
        raise NotImplementedInputError(f"{name}: Garud H is implemented for diploid genotypes only, "
                                       f"not ploidy {ds.sizes.get('ploidy')}")
    if not has_windows(ds):
        raise InputError(f"{name}: the dataset has no windows (window_start, window_stop): "
                         "call window_by_variant or window_by_position first")
    g = as_dask(variable(ds, call_genotype, ("variants", "samples", "ploidy"), "i", op=name)).rechunk({2: -1})
    cohort, n_cohorts = _cohorts(ds, sample_cohort, name)
    wanted = _cohorts_to_array(list(cohorts) if cohorts is not None else list(range(n_cohorts)),
                               ds.indexes.get("cohorts"), 1, n_cohorts, name)[:, 0]
    n = g.shape[0]
    starts = np.clip(np.asarray(to_numpy(ds["window_start"].data), dtype=np.int64).ravel(), 0, n)
    stops = np.clip(np.asarray(to_numpy(ds["window_stop"].data), dtype=np.int64).ravel(), 0, n)
    stops = np.maximum(stops, starts)
    bounds = np.unique(np.r_[starts, stops])
    # each bound's prefix sum, taken in the block it ends (bound 0: block 0, relative 0)
    edges = np.cumsum((0, *g.chunks[0]))
    owner = np.clip(np.searchsorted(edges, bounds, side="left") - 1, 0, len(g.chunks[0]) - 1)
    firsts, rels, row, totals = edges[:-1], [], np.empty(bounds.size, np.int64), []
    for k, size in enumerate(g.chunks[0]):
        mine = np.flatnonzero(owner == k)
        rel = np.unique(np.r_[bounds[mine] - edges[k], size])
        row[mine] = sum(map(len, rels)) + np.searchsorted(rel, bounds[mine] - edges[k])
        totals.append(sum(map(len, rels)) + rel.size - 1)
        rels.append(rel)
    backend = backend_of(g)
    hap = tuple(c * 2 for c in g.chunks[1])
    q = g.map_blocks(_hash_prefix, firsts=firsts, rels=rels, kernel=kernels.get("hash_prefix", backend),
                     chunks=(tuple(map(len, rels)), hap), drop_axis=2, dtype=U8, meta=backend_meta(backend, U8, 2))
    # the windows' hashes and their counts, where they are few, on the host (_finishing_backend)
    finish = _finishing_backend(backend, starts.size * q.shape[1] * 8)
    q = to_backend(q, finish)
    length = stops - starts
    const = np.array([5381 * pow(33, int(m), _MOD) % _MOD for m in length], dtype=U8)
    scale = np.array([pow(33, int(max(b - 1, 0)), _MOD) for b in stops], dtype=U8)
    h = q.rechunk({0: -1}).map_blocks(
        _window_hashes, row=row, block=owner, totals=np.asarray(totals), lo=np.searchsorted(bounds, starts),
        hi=np.searchsorted(bounds, stops), scale=scale, const=const, chunks=((starts.size,), q.chunks[1]),
        dtype=U8, meta=backend_meta(finish, U8, 2))
    h = h.rechunk((max(1, 2**24 // max(1, h.shape[1])), -1))
    gh = h.map_blocks(_garud_block, haplotype_cohort=np.repeat(cohort, 2), wanted=wanted, n_cohorts=n_cohorts,
                      chunks=(h.chunks[0], (n_cohorts,), (4,)), new_axis=2, dtype=F8,
                      meta=backend_meta(finish, F8, 3))
    names = ("stat_Garud_h1", "stat_Garud_h12", "stat_Garud_h123", "stat_Garud_h2_h1")
    new = xr.merge([_new(v, ("windows", "cohorts"), to_backend(gh[:, :, i], backend)) for i, v in enumerate(names)])
    return _merge(ds, new, merge)


def _lower_sums(block, below, axis) -> dict:
    """The partial of a tile of the identity by state for :func:`~pipeline.reduce.aggregation.nan_mean`:
    the sum and the number of its values below the diagonal (``below``, the blueprint's weights)
    that are not NaN."""
    xp = xp_of(block)
    keep = below & ~xp.isnan(block)
    return {"sum": xp.where(keep, block, 0).sum(dtype=F8).reshape(1, 1),
            "count": keep.sum(dtype=np.int64).reshape(1, 1)}


def Weir_Goudet_beta(
    ds: xr.Dataset,
    *,
    stat_identity_by_state: str = "stat_identity_by_state",
    merge: bool = True,
) -> xr.Dataset:
    """Weir and Goudet's (2017) beta between all pairs of samples, sgkit's ``Weir_Goudet_beta``:
    ``stat_Weir_Goudet_beta`` (samples_0, samples_1), float64, the identity by state (computed by
    :func:`~.relatedness.identity_by_state` where the dataset lacks it) relative to its mean over
    the pairs of distinct samples (NaN pairs left out): ``(ibs - mean) / (1 - mean)``."""
    from .relatedness import identity_by_state

    name = "Weir_Goudet_beta"
    ds = _if_absent(ds, "stat_identity_by_state", stat_identity_by_state, identity_by_state, name)
    ibs = as_dask(variable(ds, stat_identity_by_state, ("samples_0", "samples_1"), "f", op=name))
    backend = backend_of(ibs)
    finish = _finishing_backend(backend, ibs.nbytes)
    # the pairs below the diagonal, made tile by tile where the tiles are reduced
    rows, cols = (to_backend(da.arange(n, chunks=(c,)), finish) for n, c in zip(ibs.shape, ibs.chunks))
    below = rows[:, None] > cols[None, :]
    mean = agg.nan_mean("pipeline-pairs-mean", "_lower_sums")
    avg = agg.reduce(to_backend(ibs, finish), mean, (0, 1), kernel=_lower_sums, dtype=F8, weights=below)
    avg = to_backend(avg, backend)
    beta = (ibs - avg) / (1 - avg)
    return _merge(ds, _new("stat_Weir_Goudet_beta", ("samples_0", "samples_1"), beta), merge)


__all__ = ["Fst", "Garud_H", "Tajimas_D", "Weir_Goudet_beta", "count_cohort_alleles", "divergence", "diversity", "pbs"]
