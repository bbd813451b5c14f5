"""Counting statistics of genotype calls, as sgkit 0.10 computes them (``stats/aggregation.py``,
``stats/hwe.py``): allele counts per call and per variant, the quality-control statistics of
variants and samples, genotype counts and the Hardy-Weinberg exact test.

Every count comes from one pass over ``call_genotype`` by a kernel of
:mod:`pipeline.kernels.genotypes` (Numba on the CPU; on the GPU CUDA C for int8 diploid
biallelic calls, Numba CUDA for the others), block by block: counts per variant are summed over
blocks of samples, counts per sample over blocks of variants, by the reduction blueprint
(:func:`pipeline.reduce.aggregation.integer_sum`: int64 partials, declared to the memory plan as
the climate reductions' are, merged on the host), so any chunking gives the same integers. The ratios derived from them (call rates,
allele frequencies) are sgkit's float64 formulas on those integers, on the host too; each
output goes to the dataset's backend.

sgkit's semantics, kept (the kernels' docstring has the per-call rules):

- a call counts as called only if all its alleles are 0 or more; partly missing calls are not
  called, but their called alleles are counted as alleles; -2 (fill) is missing;
- the number of alleles is the length of the ``alleles`` dimension (``variant_allele``'s); alleles
  at or beyond it are not counted;
- ``count_variant_alleles`` and ``variant_stats`` take ``call_allele_count`` /
  ``variant_allele_count`` from the dataset where present, and a non-default name that is absent
  is an error, as sgkit's ``define_variable_if_absent``;
- ``count_variant_alleles`` (counting from ``call_allele_count``, the default) merges
  ``call_allele_count`` into its result too when it had to define it, as sgkit does; the variant
  counts themselves are read straight from the genotypes (the same integers, one pass, no
  (variants, samples, alleles) array in between);
- ``count_variant_genotypes`` (and so ``hardy_weinberg_test`` without counts given) refuses calls
  holding a fill value (-2): sgkit raises ``ValueError: Mixed-ploidy genotype indicated by allele
  < -1`` from its Numba loop; here the kernel counts those calls and the computation raises
  :class:`~pipeline.errors.InputError` when there are any;
- ``variant_stats``, ``sample_stats`` and ``count_variant_genotypes`` refuse a ``call_genotype``
  marked ``mixed_ploidy``, as sgkit;
- ``hardy_weinberg_test``: diploid, biallelic only (sgkit raises ``NotImplementedError``; here
  ``InputError``), counts taken by the ``genotypes`` coordinates ``0/0``, ``0/1``, ``1/1``.

Where sgkit raises ``ValueError``/``KeyError`` on bad input these ops raise
:class:`~pipeline.errors.InputError` naming the variable (also a ``ValueError``).
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from math import comb
from typing import Literal

import numpy as np
import xarray as xr

from ...backend import backend_of, meta, to_backend
from ...deferred import module as _deferred
from ...errors import InputError, NotImplementedInputError
from ...reduce import aggregation as agg
from ..registry import register
from . import specs
from ._dataset import as_dask, backend_of_dataset, variable
from ._dataset import merge as _merge
from .variables import A, GENOTYPES, P, V, Add, Declared, Dim, Ensure, Keep, Read, add, equals, read, step

da = _deferred("dask.array")  # imported when the first graph is built

GENOTYPE_DIMS = ("variants", "samples", "ploidy")
CLASSES = 3  # hom ref, hom alt, het: the kernels' first counts (pipeline.kernels.genotypes.CLASSES)


# --- inputs ------------------------------------------------------------------------------------------


def _genotypes(ds: xr.Dataset, name: str, op: str, *, mixed_ploidy_ok: bool = True) -> xr.DataArray:
    g = variable(ds, name, GENOTYPE_DIMS, "i", op=op)
    if not mixed_ploidy_ok and g.attrs.get("mixed_ploidy", False):
        raise InputError(f"{op}: variable {name!r} is mixed-ploidy (attribute mixed_ploidy), which {op} does not support")
    return g


def _n_alleles(ds: xr.Dataset, op: str) -> int:
    """The length of the ``alleles`` dimension, as sgkit's ``ds.sizes["alleles"]``."""
    if "alleles" not in ds.sizes:
        raise InputError(
            f"{op}: the dataset has no 'alleles' dimension, which gives the number of alleles to count "
            "(VCF Zarr's variant_allele has it)"
        )
    return int(ds.sizes["alleles"])


def _blocks(g: xr.DataArray):
    """``g``'s data as a Dask array with the ploidy dimension in one chunk (a call in one block)."""
    G = as_dask(g)
    return G.rechunk({2: -1}) if G.numblocks[2] > 1 else G


def _dataset(ds, op: str) -> xr.Dataset:
    if not isinstance(ds, xr.Dataset):
        raise InputError(f"{op}: expected an xarray.Dataset, got {type(ds).__name__}")
    return ds


def _absent(ds: xr.Dataset, name: str, default: str, op: str) -> bool:
    """Whether ``name`` must be computed: absent under its default name (sgkit's
    ``define_variable_if_absent``, which refuses to define a variable of another name)."""
    if name in _dataset(ds, op).variables:
        return False
    if name != default:
        raise InputError(f"{op}: the dataset has no variable {name!r} (a non-default name: it is not computed)")
    return True


# --- the counts, through the kernels --------------------------------------------------------------


def _variant_counts(op, kernel: str, G, n_alleles: int, n_counts: int, backend: str):
    """(variants, n_counts) int64 on the host: the per-variant kernel on each block, its int64
    partials summed over blocks of samples (exactly) by the reduction blueprint, which declares
    them to the memory plan."""
    counts = agg.integer_sum(f"pipeline-{kernel.replace('_', '-')}", kernel, n_alleles=n_alleles)
    return agg.reduce(G, counts, (1,), kernel=agg.FieldKernel(op.kernel(kernel, backend), "total"),
                      dtype=np.int64, width=n_counts, on="cpu")


def _sample_counts(op, G, backend: str):
    """(samples, 3) int64 on the host: hom ref, hom alt, het per sample, summed over blocks of
    variants as :func:`_variant_counts` sums over blocks of samples."""
    counts = agg.integer_sum("pipeline-sample-call-counts", "sample_call_counts")
    return agg.reduce(G, counts, (0,), kernel=agg.FieldKernel(op.kernel("sample_call_counts", backend), "total"),
                      dtype=np.int64, width=CLASSES, on="cpu")


# --- what the statistics derive from the counts ---------------------------------------------------
#
# The kernels' counts come to the host (a few integers a variant or sample), where they are summed
# over blocks and the statistics derived from them; each output then goes to the dataset's
# backend. On CuPy these sums, divisions and type conversions compiled a kernel each on a fresh
# machine, one after another in the first run's path (about 15, 0.15-0.37 s each: 2.9 s of the
# counting statistics' first run of 5.3 s at 200,000 variants x 25,000 samples on an H100, where
# the warm run took 0.33 s).
#
# Each output variable is its own small task on each block of the counts, none computed from
# another output: Dask 2026.8 with xarray 2026.9 loses the blocks of an elementwise output that
# another output of the same Dataset is computed from when the whole Dataset goes to
# ``dask.compute`` ("Missing dependency"), as pipeline.compute passes it. sgkit's formulas, on
# the same integers: the results are the same.


def _column(c, k: int):
    return c[:, k]


def _called(c):
    return c[:, :CLASSES].sum(axis=1)


def _non_ref(c):  # n_called - n_hom_ref
    return c[:, 1] + c[:, 2]


def _call_rate(c, n: float):
    return c[:, :CLASSES].sum(axis=1).astype(np.float64) / n


def _allele_counts(c):
    return c[:, CLASSES:].astype(np.uint64)


def _allele_total(ac, first: int):
    return ac[:, first:].sum(axis=1).astype(np.int64)  # int, as sgkit ("backwards compatibility")


def _allele_frequency(ac, first: int):
    """sgkit's ``AC.astype(float) / allele_total.astype(float)``: NaN where no allele is called."""
    ac = ac[:, first:]
    total = ac.sum(axis=1).astype(np.int64).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ac.astype(np.float64) / total[:, None]


def _derive(fn, counts, *args, dims: tuple[str, ...], dtype, backend: str, columns: int | None = None):
    """``fn`` on each block of the (variants or samples, counts) array, on the array's backend: a
    variable of ``dims`` on ``backend``."""
    on = backend_of(counts)
    if len(dims) == 1:
        out = counts.map_blocks(fn, *args, drop_axis=1, dtype=dtype, meta=meta(on, dtype, 1))
    else:
        out = counts.map_blocks(fn, *args, chunks=(counts.chunks[0], (columns,)), dtype=dtype, meta=meta(on, dtype, 2))
    return xr.DataArray(to_backend(out, backend), dims=dims)


# --- the ops ------------------------------------------------------------------------------------------


@register(kernels=("call_allele_counts",), dataset=True, variables=Declared(
    needs=(GENOTYPES, Dim(A)),
    adds=(add(specs.call_allele_count_spec),),
))
def count_call_alleles(ds: xr.Dataset, call_genotype: str = "call_genotype", merge: bool = True) -> xr.Dataset:
    """Per-call allele counts, sgkit's ``count_call_alleles``: ``call_allele_count`` (variants,
    samples, alleles), uint8, the number of non-missing occurrences of each allele in each call."""
    op = "count_call_alleles"
    g = _genotypes(ds, call_genotype, op)
    n = _n_alleles(ds, op)
    G = _blocks(g)
    backend = backend_of_dataset(g)
    counts = da.map_blocks(
        count_call_alleles.op.kernel("call_allele_counts", backend), G, n,
        chunks=G.chunks[:2] + ((n,),), dtype=np.uint8, meta=meta(backend, np.uint8, 3),
    )
    new = xr.Dataset({"call_allele_count": (("variants", "samples", "alleles"), counts)})
    return _merge(ds, new, merge)


@register(kernels=("variant_call_counts",), dataset=True, variables=Declared(
    needs=(
        Ensure("{call_allele_count}", "count_call_alleles", {"call_genotype": "{call_genotype}"},
               when=equals(using="call_allele_count")),
        read(specs.call_allele_count_spec, "{call_allele_count}", when=equals(using="call_allele_count")),
        read(specs.call_genotype_spec, "{call_genotype}", when=equals(using="call_genotype")),
        Dim(A),
    ),
    adds=(add(specs.variant_allele_count_spec),),
))
def count_variant_alleles(
    ds: xr.Dataset,
    call_genotype: str = "call_genotype",
    call_allele_count: str = "call_allele_count",
    using: Literal["call_allele_count", "call_genotype"] = "call_allele_count",
    merge: bool = True,
) -> xr.Dataset:
    """Per-variant allele counts, sgkit's ``count_variant_alleles``: ``variant_allele_count``
    (variants, alleles), uint64, from ``call_allele_count`` where the dataset has it and ``using``
    names it, else straight from the genotypes."""
    op = "count_variant_alleles"
    if using not in ("call_allele_count", "call_genotype"):
        raise InputError(f"{op}: using must be 'call_allele_count' or 'call_genotype', not {using!r}")
    if using == "call_allele_count" and not _absent(ds, call_allele_count, "call_allele_count", op):
        cac = variable(ds, call_allele_count, ("variants", "samples", "alleles"), "u", op=op)
        ac = cac.sum("samples", dtype=np.uint64)  # as sgkit's sum of the uint8 counts: uint64
        return _merge(ds, xr.Dataset({"variant_allele_count": ac}), merge)
    g = _genotypes(ds, call_genotype, op)
    n = _n_alleles(ds, op)
    counts = _variant_counts(count_variant_alleles.op, "variant_call_counts", _blocks(g), n, CLASSES + n,
                             backend_of_dataset(g))
    backend = backend_of_dataset(g)
    new = xr.Dataset({"variant_allele_count": (("variants", "alleles"),
                                               to_backend(counts[:, CLASSES:].astype(np.uint64), backend))})
    if using == "call_allele_count":
        # sgkit defines call_allele_count in the dataset first, and merges into that dataset
        ds = count_call_alleles(ds, call_genotype=call_genotype)
    return _merge(ds, new, merge)


@register(kernels=("variant_call_counts",), dataset=True, variables=Declared(
    needs=(
        GENOTYPES,
        Ensure("{variant_allele_count}", "count_variant_alleles",
               {"using": "call_genotype", "call_genotype": "{call_genotype}"}),
        read(specs.variant_allele_count_spec, "{variant_allele_count}"),
    ),
    adds=(
        add(specs.variant_n_called_spec), add(specs.variant_call_rate_spec), add(specs.variant_n_het_spec),
        add(specs.variant_n_hom_ref_spec), add(specs.variant_n_hom_alt_spec), add(specs.variant_n_non_ref_spec),
        add(specs.variant_allele_count_spec), add(specs.variant_allele_total_spec),
        add(specs.variant_allele_frequency_spec),
    ),
))
def variant_stats(
    ds: xr.Dataset,
    call_genotype: str = "call_genotype",
    variant_allele_count: str = "variant_allele_count",
    merge: bool = True,
) -> xr.Dataset:
    """Quality-control statistics of each variant, sgkit's ``variant_stats``: ``variant_n_called``,
    ``variant_call_rate``, ``variant_n_het``, ``variant_n_hom_ref``, ``variant_n_hom_alt``,
    ``variant_n_non_ref``, ``variant_allele_count``, ``variant_allele_total`` and
    ``variant_allele_frequency``, from one pass over the genotypes."""
    op = "variant_stats"
    g = _genotypes(ds, call_genotype, op, mixed_ploidy_ok=False)
    have_ac = not _absent(ds, variant_allele_count, "variant_allele_count", op)
    n = 0 if have_ac else _n_alleles(ds, op)  # alleles are counted only where they are missing
    G = _blocks(g)
    backend = backend_of_dataset(g)
    counts = _variant_counts(variant_stats.op, "variant_call_counts", G, n, CLASSES + n, backend)
    one = dict(dims=("variants",), backend=backend)
    if have_ac:
        ac = variable(ds, variant_allele_count, ("variants", "alleles"), "u", op=op)
        source, first, ac_backend = as_dask(ac).rechunk({1: -1}), 0, backend_of_dataset(ac)
        n_alleles = ac.sizes["alleles"]
    else:
        ac = _derive(_allele_counts, counts, dims=("variants", "alleles"), dtype=np.uint64, backend=backend, columns=n)
        source, first, ac_backend, n_alleles = counts, CLASSES, backend, n
    new = xr.Dataset(
        {
            "variant_n_called": _derive(_called, counts, dtype=np.int64, **one),
            "variant_call_rate": _derive(_call_rate, counts, float(G.shape[1]), dtype=np.float64, **one),
            "variant_n_het": _derive(_column, counts, 2, dtype=np.int64, **one),
            "variant_n_hom_ref": _derive(_column, counts, 0, dtype=np.int64, **one),
            "variant_n_hom_alt": _derive(_column, counts, 1, dtype=np.int64, **one),
            "variant_n_non_ref": _derive(_non_ref, counts, dtype=np.int64, **one),
            "variant_allele_count": ac,
            "variant_allele_total": _derive(_allele_total, source, first, dims=("variants",), dtype=np.int64,
                                            backend=ac_backend),
            "variant_allele_frequency": _derive(_allele_frequency, source, first, dims=("variants", "alleles"),
                                                dtype=np.float64, backend=ac_backend, columns=n_alleles),
        }
    )
    if have_ac and merge and variant_allele_count == "variant_allele_count":
        # sgkit leaves the input's counts as they are (it drops the new copy; under another name
        # its drop fails, so here that copy is kept, as merge=False returns it)
        new = new.drop_vars("variant_allele_count")
    return _merge(ds, new, merge)


@register(kernels=("sample_call_counts",), dataset=True, variables=Declared(
    needs=(GENOTYPES,),
    adds=(
        add(specs.sample_n_called_spec), add(specs.sample_call_rate_spec), add(specs.sample_n_het_spec),
        add(specs.sample_n_hom_ref_spec), add(specs.sample_n_hom_alt_spec), add(specs.sample_n_non_ref_spec),
    ),
))
def sample_stats(ds: xr.Dataset, call_genotype: str = "call_genotype", merge: bool = True) -> xr.Dataset:
    """Quality-control statistics of each sample, sgkit's ``sample_stats``: ``sample_n_called``,
    ``sample_call_rate``, ``sample_n_het``, ``sample_n_hom_ref``, ``sample_n_hom_alt`` and
    ``sample_n_non_ref``, from one pass over the genotypes."""
    op = "sample_stats"
    g = _genotypes(ds, call_genotype, op, mixed_ploidy_ok=False)
    G = _blocks(g)
    backend = backend_of_dataset(g)
    counts = _sample_counts(sample_stats.op, G, backend)
    one = dict(dims=("samples",), backend=backend)
    new = xr.Dataset(
        {
            "sample_n_called": _derive(_called, counts, dtype=np.int64, **one),
            "sample_call_rate": _derive(_call_rate, counts, float(G.shape[0]), dtype=np.float64, **one),
            "sample_n_het": _derive(_column, counts, 2, dtype=np.int64, **one),
            "sample_n_hom_ref": _derive(_column, counts, 0, dtype=np.int64, **one),
            "sample_n_hom_alt": _derive(_column, counts, 1, dtype=np.int64, **one),
            "sample_n_non_ref": _derive(_non_ref, counts, dtype=np.int64, **one),
        }
    )
    return _merge(ds, new, merge)


def n_genotypes(n_alleles: int, ploidy: int) -> int:
    """Genotypes of ``ploidy`` alleles among ``n_alleles``: multisets, ``C(n_alleles + ploidy - 1,
    ploidy)`` (the kernels' count columns, before the one of refused calls)."""
    return comb(n_alleles + ploidy - 1, ploidy) if n_alleles else 0


def genotype_ids(n_alleles: int, ploidy: int) -> np.ndarray:
    """The VCF strings of every genotype (``0/0``, ``0/1``, ``1/1``, ``0/2``...), in the VCF order of
    genotype fields (sgkit's ``genotype_coords``): the sorted calls, ordered by
    ``sum_i C(a_i + i, i + 1)``."""
    def index(call):
        total = 0
        for i, a in enumerate(call):
            r = 1
            for d in range(1, i + 2):
                r = r * (a - 1 + d) // d
            total += r
        return total

    calls = sorted(combinations_with_replacement(range(n_alleles), ploidy), key=index)
    assert len(calls) == n_genotypes(n_alleles, ploidy)
    width = len(str(n_alleles - 1)) * ploidy + ploidy - 1
    return np.array(["/".join(map(str, c)) for c in calls], dtype=f"U{width}")


# sgkit's genotype_coords, run within count_variant_genotypes: genotype_id of Unicode strings alone,
# of the two kinds sgkit's spec allows
step("genotype_coords", Declared(
    needs=(Dim(P), Dim(A)),
    adds=(Add("genotype_id", ("genotypes",), "U"),
          Add("genotypes", ("genotypes",), "U", coord=True, when=equals(assign_coords=True))),
    defaults={"assign_coords": True, "merge": True},
))


def _genotype_coords(ds: xr.Dataset, assign_coords: bool = True) -> xr.Dataset:
    """``ds`` with ``genotype_id`` (and the ``genotypes`` coordinates), sgkit's ``genotype_coords``."""
    op = "count_variant_genotypes"
    if "ploidy" not in ds.sizes:
        raise InputError(f"{op}: the dataset has no 'ploidy' dimension")
    ids = genotype_ids(_n_alleles(ds, op), int(ds.sizes["ploidy"]))
    out = ds.assign(genotype_id=("genotypes", ids))
    return out.assign_coords(genotypes=ids) if assign_coords else out


def _refused(counts, op: str, name: str):
    """A block's genotype counts without the last column, the calls sgkit refuses; InputError if
    there are any (sgkit raises from its loop)."""
    refused = int(counts[:, -1].sum())
    if refused:
        raise InputError(
            f"{op}: variable {name!r} holds {refused} calls in this block with a fill value (-2, as in "
            "mixed-ploidy data) or an allele beyond the alleles dimension; genotype counts need "
            "fixed-ploidy calls of -1 (missing) or known alleles (sgkit raises: Mixed-ploidy genotype "
            "indicated by allele < -1)"
        )
    return counts[:, :-1].astype(np.uint64)


@register(kernels=("variant_genotype_counts",), dataset=True, variables=Declared(
    needs=(
        Ensure("{genotype_id}", "genotype_coords", {"assign_coords": "{assign_coords}"}),
        read(specs.genotype_id_spec, "{genotype_id}"),
        GENOTYPES,
        Dim(A),
    ),
    # unsigned counts alone, of the two kinds sgkit's spec allows
    adds=(Add("variant_genotype_count", (V, "genotypes"), "u"), Keep("genotypes", when=equals(assign_coords=True))),
))
def count_variant_genotypes(
    ds: xr.Dataset,
    call_genotype: str = "call_genotype",
    genotype_id: str = "genotype_id",
    assign_coords: bool = True,
    merge: bool = True,
) -> xr.Dataset:
    """Calls of each possible genotype at each variant, sgkit's ``count_variant_genotypes``:
    ``variant_genotype_count`` (variants, genotypes), uint64, in the VCF order of genotypes
    (``0/0``, ``0/1``, ``1/1``, ``0/2``...), with ``genotype_id`` (and the ``genotypes``
    coordinates when ``assign_coords``). Calls with a fill value (-2) make the computation raise
    InputError, as sgkit raises."""
    op = "count_variant_genotypes"
    if _absent(ds, genotype_id, "genotype_id", op):
        ds = _genotype_coords(ds, assign_coords)
    variable(ds, genotype_id, ("genotypes",), "SU", op=op)
    counts, backend = _genotype_counts(ds, call_genotype, op)
    new = xr.Dataset({"variant_genotype_count": (("variants", "genotypes"), to_backend(counts, backend))})
    if assign_coords and not merge and "genotypes" in ds.coords:
        new = new.assign_coords(genotypes=ds.coords["genotypes"])
    return _merge(ds, new, merge)


def _genotype_counts(ds: xr.Dataset, call_genotype: str, op: str):
    """The genotype counts (variants, genotypes), uint64, on the host, and the genotypes' backend."""
    g = _genotypes(ds, call_genotype, op, mixed_ploidy_ok=False)
    n = _n_alleles(ds, op)
    n_gen = n_genotypes(n, int(ds.sizes["ploidy"]))
    backend = backend_of_dataset(g)
    counts = _variant_counts(count_variant_genotypes.op, "variant_genotype_counts", _blocks(g), n, n_gen + 1, backend)
    counts = counts.map_blocks(_refused, "count_variant_genotypes", call_genotype, chunks=(counts.chunks[0], (n_gen,)),
                               dtype=np.uint64, meta=meta("cpu", np.uint64, 2))
    return counts, backend


def _hwe_p_values(kernel, het, hom1, hom2, op: str, name: str):
    if any(c.dtype.kind == "i" and bool((c < 0).any()) for c in (het, hom1, hom2)):
        raise InputError(f"{op}: variable {name!r} holds negative genotype counts")
    return kernel(het, hom1, hom2)


@register(kernels=("hwe_exact",), dataset=True, variables=Declared(
    needs=(
        Dim(P, unless="ploidy"),
        Dim(A, unless="alleles"),
        Ensure("{genotype_count}", "count_variant_genotypes"),
        read(specs.variant_genotype_count_spec, "{genotype_count}"),
        Read("genotypes", coord=True, hint="the genotype counts need their genotypes coordinate ('0/0', '0/1', '1/1')"),
    ),
    adds=(add(specs.variant_hwe_p_value_spec),),
    normalize=lambda p: {**p, "genotype_count": p["genotype_count"] or "variant_genotype_count"},
))
def hardy_weinberg_test(
    ds: xr.Dataset,
    genotype_count: str | None = "variant_genotype_count",
    ploidy: int | None = None,
    alleles: int | None = None,
    merge: bool = True,
) -> xr.Dataset:
    """Exact test of Hardy-Weinberg equilibrium (Wigginton et al. 2005) at each variant, sgkit's
    ``hardy_weinberg_test``: ``variant_hwe_p_value`` (variants), float64, from the genotype counts
    ``genotype_count`` (computed by :func:`count_variant_genotypes` when the dataset lacks them),
    read by their ``genotypes`` coordinates ``0/0``, ``0/1``, ``1/1``. Diploid, biallelic data only."""
    op = "hardy_weinberg_test"
    ploidy = ploidy or _dataset(ds, op).sizes.get("ploidy")
    if not ploidy:
        raise InputError(f"{op}: ploidy must be given where the dataset has no 'ploidy' dimension")
    if ploidy != 2:
        raise NotImplementedInputError(f"{op}: the HWE test is implemented for diploid genotypes only, not ploidy {ploidy}")
    alleles = alleles or ds.sizes.get("alleles")
    if not alleles:
        raise InputError(f"{op}: alleles must be given where the dataset has no 'alleles' dimension")
    if alleles != 2:
        raise NotImplementedInputError(f"{op}: the HWE test is implemented for biallelic genotypes only, not {alleles} alleles")
    name = genotype_count or "variant_genotype_count"
    backend = host = None
    if _absent(ds, name, "variant_genotype_count", op):
        # counted here, as count_variant_genotypes; the test takes its columns from the counts on
        # the host (on CuPy, their strided columns made int64 compiled copy kernels)
        if _absent(ds, "genotype_id", "genotype_id", op):
            ds = _genotype_coords(ds)
        host, backend = _genotype_counts(ds, "call_genotype", "count_variant_genotypes")
        ds = ds.assign(variant_genotype_count=(("variants", "genotypes"), to_backend(host, backend)))
    counts = variable(ds, name, ("variants", "genotypes"), "iu", op=op)
    if host is not None:
        counts = xr.DataArray(host, dims=counts.dims, coords=counts.coords)
    if "genotypes" not in ds.coords:
        raise InputError(f"{op}: variable {name!r} has no coordinates for dimension 'genotypes' ('0/0', '0/1', '1/1')")
    columns = {}
    for key in ("0/0", "0/1", "1/1"):
        try:
            columns[key] = as_dask(counts.sel(genotypes=key))
        except KeyError:
            raise InputError(f"{op}: variable {name!r} has no counts for genotype {key!r}") from None
    backend = backend or backend_of_dataset(counts)
    kernel = hardy_weinberg_test.op.kernel("hwe_exact", backend)
    p = da.map_blocks(_hwe_p_values, kernel, columns["0/1"], columns["0/0"], columns["1/1"], op, name,
                      dtype=np.float64, meta=meta(backend, np.float64, 1))
    new = xr.Dataset({"variant_hwe_p_value": ("variants", p)})
    return _merge(ds, new, merge)


__all__ = [
    "count_call_alleles",
    "count_variant_alleles",
    "count_variant_genotypes",
    "hardy_weinberg_test",
    "sample_stats",
    "variant_stats",
]
