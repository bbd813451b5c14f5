"""Conversions of genotype calls and their ploidy, as sgkit 0.10 makes them:
``convert_call_to_index``, ``convert_probability_to_call`` (``stats/conversion.py``),
``filter_partial_calls`` (``stats/preprocessing.py``) and ``infer_call_ploidy``,
``infer_sample_ploidy``, ``infer_variant_ploidy`` (``stats/aggregation.py``).

Each is elementwise over the calls, block by block on the genotypes' backend (the kernels take
their array module from their block, NumPy or CuPy), and lazy. sgkit's rules, kept:

- a call's index is the VCF order of its genotype (``0/0, 0/1, 1/1, 0/2, ...``), -1 where any
  allele is missing; a fill value (-2) in a call is an error, and so is an allele above 1 where the
  ``alleles`` dimension has length 2; a mixed-ploidy ``call_genotype`` is refused;
- a hard call from probabilities (diploid, biallelic: three genotypes) is the most probable
  genotype where its probability is unique and at least ``threshold``, else missing (-1, -1), and
  missing wherever a probability is NaN;
- ``filter_partial_calls`` makes a call with any missing allele (-1) wholly missing, keeping fill
  values (-2) of a mixed-ploidy ``call_genotype`` as they are;
- the ploidy of a call is the number of its non-fill alleles where ``call_genotype`` is
  marked ``mixed_ploidy``, else the ploidy dimension's length; that of a sample (variant) is the
  one of its calls where they all agree, else -1.

Where sgkit raises ``ValueError`` these raise :class:`~pipeline.errors.InputError` (also a
``ValueError``); where it raises ``NotImplementedError``,
:class:`~pipeline.errors.NotImplementedInputError`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ... import kernels
from ...backend import backend_of, meta, xp_of
from ...deferred import module as _deferred
from ...errors import InputError, NotImplementedInputError
from ...kernels.genotypes import REFUSED_ABOVE_ONE, REFUSED_FILL
from ._dataset import as_dask, merge as _merge, variable
from .specs import annotate

da = _deferred("dask.array")  # imported when the first graph is built

__all__ = ["convert_call_to_index", "convert_probability_to_call", "filter_partial_calls", "infer_call_ploidy",
           "infer_sample_ploidy", "infer_variant_ploidy"]

GENOTYPE_DIMS = ("variants", "samples", "ploidy")


def _genotypes(ds: xr.Dataset, name: str, op: str) -> xr.DataArray:
    return variable(ds, name, GENOTYPE_DIMS, "i", op=op)


def _mixed_ploidy(ds: xr.Dataset, name: str) -> bool:
    return bool(ds[name].attrs.get("mixed_ploidy", False))


def _new(variables: dict) -> xr.Dataset:
    """A dataset of ``variables``, with sgkit's documentation of each as its ``comment``."""
    return annotate(xr.Dataset(variables))


# --- convert_call_to_index ----------------------------------------------------------------------------


def _call_index(block, *, biallelic: bool, kernel):
    """The VCF index of each call of a (variants, samples, ploidy) block, int64, -1 where an
    allele is missing, by the ``call_genotype_index`` kernel; sgkit's errors where it raises."""
    index, refused = kernel(block, biallelic)
    if refused & REFUSED_FILL:
        raise InputError("convert_call_to_index: call_genotype holds a fill value (-2): mixed-ploidy genotypes "
                         "are not supported")
    if refused & REFUSED_ABOVE_ONE:
        raise InputError("convert_call_to_index: call_genotype holds an allele above 1 where the alleles "
                         "dimension has length 2")
    return index


def convert_call_to_index(ds: xr.Dataset, *, call_genotype: str = "call_genotype", merge: bool = True) -> xr.Dataset:
    """Each call's genotype as its index in VCF order, ``call_genotype_index`` (variants,
    samples), int64, -1 where missing, and ``call_genotype_index_mask``."""
    op = "convert_call_to_index"
    g = _genotypes(ds, call_genotype, op)
    if _mixed_ploidy(ds, call_genotype):
        raise InputError(f"{op}: variable {call_genotype!r} is mixed-ploidy (attribute mixed_ploidy), "
                         "which has no genotype index")
    G = as_dask(g).rechunk({2: -1})
    kernel = kernels.get("call_genotype_index", backend_of(G))
    X = G.map_blocks(_call_index, biallelic=ds.sizes.get("alleles") == 2, kernel=kernel, drop_axis=2, dtype=np.int64,
                     meta=meta(backend_of(G), np.int64, 2))
    dims = ("variants", "samples")
    return _merge(ds, _new({"call_genotype_index": (dims, X), "call_genotype_index_mask": (dims, X < 0)}), merge)


# --- convert_probability_to_call --------------------------------------------------------------------


def convert_probability_to_call(ds: xr.Dataset, call_genotype_probability: str = "call_genotype_probability",
                                threshold: float = 0.9, merge: bool = True) -> xr.Dataset:
    """Hard calls from genotype probabilities (diploid, biallelic), ``call_genotype`` (variants,
    samples, ploidy) int8 and ``call_genotype_mask``: the most probable genotype where its
    probability is unique and at least ``threshold`` (in [0, 1]; 0 for no threshold), else
    missing."""
    op = "convert_probability_to_call"
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise InputError(f"{op}: threshold must be a number in [0, 1], not {threshold!r}")
    gp = variable(ds, call_genotype_probability, ("variants", "samples", "genotypes"), "f", op=op)
    if gp.sizes["genotypes"] != 3:
        raise NotImplementedInputError(
            f"{op}: hard call conversion only supported for diploid, biallelic genotypes; variable "
            f"{call_genotype_probability!r} has {gp.sizes['genotypes']} genotypes, expected 3")
    GP = as_dask(gp).rechunk({2: -1})
    kernel = kernels.get("hard_calls", backend_of(GP))
    GT = GP.map_blocks(kernel, threshold=float(threshold), chunks=GP.chunks[:2] + ((2,),), dtype=np.int8,
                       meta=meta(backend_of(GP), np.int8, 3))
    new = _new({"call_genotype": (GENOTYPE_DIMS, GT), "call_genotype_mask": (GENOTYPE_DIMS, GT < 0)})
    return _merge(ds, new, merge)


# --- filter_partial_calls -----------------------------------------------------------------------------


def filter_partial_calls(ds: xr.Dataset, *, call_genotype: str = "call_genotype", merge: bool = True) -> xr.Dataset:
    """``call_genotype_complete``: ``call_genotype`` with every call that misses an allele (-1)
    made wholly missing (fill values -2 of a mixed-ploidy dataset kept), and
    ``call_genotype_complete_mask``."""
    op = "filter_partial_calls"
    g = _genotypes(ds, call_genotype, op)
    mixed = _mixed_ploidy(ds, call_genotype)
    partial = ((g == -1).any(axis=-1) & (g >= -1)) if mixed else (g < 0).any(axis=-1)
    complete = g.where(~partial, g.dtype.type(-1)).transpose(*GENOTYPE_DIMS)
    new = _new({"call_genotype_complete": complete.variable, "call_genotype_complete_mask": (complete < 0).variable})
    new["call_genotype_complete"].attrs = {**new["call_genotype_complete"].attrs, "mixed_ploidy": mixed}
    return _merge(ds, new, merge)


# --- ploidy -------------------------------------------------------------------------------------------


def _full_like(x: xr.DataArray, value, dtype=None) -> xr.DataArray:
    """``xr.full_like(x, value)`` on ``x``'s backend: xarray's builds Dask arrays of NumPy chunks
    whatever ``x``'s chunks are."""
    data = x.data
    if isinstance(data, da.Array):
        return x.copy(data=da.full_like(data, value, dtype=dtype))
    return x.copy(data=xp_of(data).full_like(data, value, dtype=dtype))


def _call_genotype_fill(ds: xr.Dataset, call_genotype: str) -> xr.Dataset:
    """sgkit's ``infer_call_genotype_fill``, merged: where a mixed-ploidy call holds fill."""
    g = _genotypes(ds, call_genotype, "infer_call_ploidy")
    fill = g < -1 if _mixed_ploidy(ds, call_genotype) else _full_like(g, False, dtype=bool)
    return _merge(ds, _new({"call_genotype_fill": fill.variable}), True)


def infer_call_ploidy(ds: xr.Dataset, *, call_genotype: str = "call_genotype",
                      call_genotype_fill: str = "call_genotype_fill", merge: bool = True) -> xr.Dataset:
    """Each call's ploidy, ``call_ploidy`` (variants, samples): its number of non-fill alleles in
    a mixed-ploidy dataset, else the ploidy dimension's length."""
    op = "infer_call_ploidy"
    g = _genotypes(ds, call_genotype, op)
    if call_genotype_fill not in ds:
        if call_genotype_fill != "call_genotype_fill":
            raise InputError(f"{op}: the dataset has no variable {call_genotype_fill!r} "
                             "(only 'call_genotype_fill' is computed where missing)")
        ds = _call_genotype_fill(ds, call_genotype)
    if _mixed_ploidy(ds, call_genotype):
        ploidy = (~variable(ds, call_genotype_fill, GENOTYPE_DIMS, "b", op=op)).sum(axis=-1)
    else:
        ploidy = _full_like(g[..., 0], g.sizes["ploidy"])
    return _merge(ds, _new({"call_ploidy": ploidy.variable}), merge)


def _ploidy_of(ds: xr.Dataset, call_genotype: str, call_ploidy: str, along: str, op: str) -> xr.DataArray:
    """The ploidy of each sample (``along="variants"``: over its calls at all variants) or each
    variant (``along="samples"``): that of its calls where they agree, else -1."""
    g = _genotypes(ds, call_genotype, op)
    if call_ploidy not in ds:
        if call_ploidy != "call_ploidy":
            raise InputError(f"{op}: the dataset has no variable {call_ploidy!r} "
                             "(only 'call_ploidy' is computed where missing)")
        ds = infer_call_ploidy(ds, call_genotype=call_genotype)
    cp = variable(ds, call_ploidy, ("variants", "samples"), "iu", op=op)
    first = cp.isel({along: 0})
    if _mixed_ploidy(ds, call_genotype):
        fixed = (first == cp).all(dim=along)
        # -1 as an array of first's backend: with a Python scalar, xarray's where gives Dask
        # arrays of CuPy blocks a NumPy meta
        return ds, xr.where(fixed, first, _full_like(first, -1))
    return ds, _full_like(first, g.sizes["ploidy"])


def infer_sample_ploidy(ds: xr.Dataset, *, call_genotype: str = "call_genotype", call_ploidy: str = "call_ploidy",
                        merge: bool = True) -> xr.Dataset:
    """Each sample's ploidy, ``sample_ploidy`` (samples): that of its calls where all agree, else -1."""
    ds, ploidy = _ploidy_of(ds, call_genotype, call_ploidy, "variants", "infer_sample_ploidy")
    return _merge(ds, _new({"sample_ploidy": ploidy.drop_vars(list(ploidy.coords)).variable}), merge)


def infer_variant_ploidy(ds: xr.Dataset, *, call_genotype: str = "call_genotype", call_ploidy: str = "call_ploidy",
                         merge: bool = True) -> xr.Dataset:
    """Each variant's ploidy, ``variant_ploidy`` (variants): that of its calls where all agree, else -1."""
    ds, ploidy = _ploidy_of(ds, call_genotype, call_ploidy, "samples", "infer_variant_ploidy")
    return _merge(ds, _new({"variant_ploidy": ploidy.drop_vars(list(ploidy.coords)).variable}), merge)
