"""sgkit 0.10's datasets: ``create_genotype_call_dataset``, ``create_genotype_dosage_dataset``
(``model.py``), ``simulate_genotype_call_dataset`` (``testing.py``) and ``display_genotypes``
(``display.py``); ``save_dataset`` (``io/dataset.py``) writes, so it is a sink
(:mod:`pipeline.sinks.sgkit`).

The datasets are built as sgkit builds them: the same variables, dimensions and types, each
variable's ``comment`` its spec's documentation (:mod:`.specs`), the arrays given kept as they are
(NumPy, CuPy or Dask). ``simulate_genotype_call_dataset`` draws from NumPy's ``RandomState`` in
sgkit's order, so a seed gives sgkit's values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Hashable

import numpy as np
import xarray as xr

from ..._version import __version__
from ...backend import backend_of, to_backend, to_numpy
from ...errors import InputError
from .specs import DIM_ALLELE, DIM_CONTIG, DIM_GENOTYPE, DIM_PLOIDY, DIM_SAMPLE, DIM_VARIANT, annotate

__all__ = ["create_genotype_call_dataset", "create_genotype_dosage_dataset", "display_genotypes",
           "simulate_genotype_call_dataset"]



def _created(data_vars: dict, variant_contig_names) -> xr.Dataset:
    attrs = {"contigs": variant_contig_names, "source": f"pipeline-{__version__}"}
    return annotate(xr.Dataset(data_vars, attrs=attrs))


def _isnan(x):
    if hasattr(x, "__dask_graph__"):
        return x != x
    from ...backend import xp_of

    return xp_of(x).isnan(x)


def create_genotype_call_dataset(*, variant_contig_names, variant_contig, variant_position, variant_allele, sample_id,
                                 call_genotype=None, call_genotype_phased=None, variant_id=None) -> xr.Dataset:
    """A dataset of genotype calls, as sgkit's: ``contig_id``, ``variant_contig``,
    ``variant_position``, ``variant_allele``, ``sample_id``, and where given ``call_genotype``
    (with ``call_genotype_mask``), ``call_genotype_phased`` and ``variant_id``."""
    data_vars: dict[Hashable, Any] = {
        "contig_id": ([DIM_CONTIG], np.array(variant_contig_names, dtype=str)),
        "variant_contig": ([DIM_VARIANT], variant_contig),
        "variant_position": ([DIM_VARIANT], variant_position),
        "variant_allele": ([DIM_VARIANT, DIM_ALLELE], variant_allele),
        "sample_id": ([DIM_SAMPLE], sample_id),
    }
    if call_genotype is not None:
        dims = [DIM_VARIANT, DIM_SAMPLE, DIM_PLOIDY]
        data_vars["call_genotype"] = (dims, call_genotype, {"mixed_ploidy": False})
        data_vars["call_genotype_mask"] = (dims, call_genotype < 0)
    if call_genotype_phased is not None:
        data_vars["call_genotype_phased"] = ([DIM_VARIANT, DIM_SAMPLE], call_genotype_phased)
    if variant_id is not None:
        data_vars["variant_id"] = ([DIM_VARIANT], variant_id)
    return _created(data_vars, variant_contig_names)


def create_genotype_dosage_dataset(*, variant_contig_names, variant_contig, variant_position, variant_allele, sample_id,
                                   call_dosage, call_genotype_probability, variant_id=None) -> xr.Dataset:
    """A dataset of genotype dosages, as sgkit's: the variables of
    :func:`create_genotype_call_dataset` without calls, ``call_dosage`` and
    ``call_genotype_probability`` with their masks (NaN is missing), and ``variant_id`` where
    given."""
    call, probability = [DIM_VARIANT, DIM_SAMPLE], [DIM_VARIANT, DIM_SAMPLE, DIM_GENOTYPE]
    data_vars: dict[Hashable, Any] = {
        "contig_id": ([DIM_CONTIG], np.array(variant_contig_names, dtype=str)),
        "variant_contig": ([DIM_VARIANT], variant_contig),
        "variant_position": ([DIM_VARIANT], variant_position),
        "variant_allele": ([DIM_VARIANT, DIM_ALLELE], variant_allele),
        "sample_id": ([DIM_SAMPLE], sample_id),
        "call_dosage": (call, call_dosage),
        "call_dosage_mask": (call, _isnan(call_dosage)),
        "call_genotype_probability": (probability, call_genotype_probability),
        "call_genotype_probability_mask": (probability, _isnan(call_genotype_probability)),
    }
    if variant_id is not None:
        data_vars["variant_id"] = ([DIM_VARIANT], variant_id)
    return _created(data_vars, variant_contig_names)


def _split(n: int, blocks: int) -> tuple[int, ...]:
    """sgkit's ``split_array_chunks``: ``n`` in ``blocks`` parts, the first ones one larger."""
    if blocks > n:
        raise InputError(f"simulate_genotype_call_dataset: n_contig ({blocks}) cannot be greater than n_variant ({n})")
    if n <= 0 or blocks <= 0:
        raise InputError(f"simulate_genotype_call_dataset: n_variant ({n}) and n_contig ({blocks}) must be positive")
    size, extra = divmod(n, blocks)
    return extra * (size + 1,) + (blocks - extra) * (size,)


def simulate_genotype_call_dataset(n_variant: int, n_sample: int, n_ploidy: int = 2, n_allele: int = 2,
                                   n_contig: int = 1, seed: int | None = 0, missing_pct: float | None = None,
                                   phased: bool | None = None,
                                   additional_variant_fields: dict | None = None) -> xr.Dataset:
    """sgkit's simulated dataset: uniform random int8 alleles (and ``missing_pct`` of them
    missing), variants split evenly over ``n_contig`` contigs, positions 0, 1, ... in each,
    random bases as alleles; the same values as sgkit's for the same arguments (NumPy's
    ``RandomState(seed)``, drawn in sgkit's order). ``additional_variant_fields``: name -> type
    (float32, float64, int8..int64, bool or str) of random variables along the variants."""
    if missing_pct and not 0.0 <= missing_pct <= 1.0:
        raise InputError(f"simulate_genotype_call_dataset: missing_pct must be within [0.0, 1.0], not {missing_pct!r}")
    rs = np.random.RandomState(seed=seed)
    call_genotype = rs.randint(0, n_allele, size=(n_variant, n_sample, n_ploidy), dtype=np.int8)
    if missing_pct:
        call_genotype = np.where(rs.rand(*call_genotype.shape) < missing_pct, -1, call_genotype)
    call_genotype_phased = None if phased is None else np.full((n_variant, n_sample), phased, dtype=bool)
    sizes = _split(n_variant, n_contig)
    contig = np.repeat(np.arange(n_contig), sizes)
    position = np.concatenate([np.arange(s) for s in sizes])
    alleles = rs.choice(["A", "C", "G", "T"], size=(n_variant, n_allele)).astype("S")
    ds = create_genotype_call_dataset(
        variant_contig_names=np.unique(contig).astype(str).tolist(), variant_contig=contig, variant_position=position,
        variant_allele=alleles, sample_id=np.array([f"S{i}" for i in range(n_sample)]), call_genotype=call_genotype,
        call_genotype_phased=call_genotype_phased,
    )
    for name, dtype in (additional_variant_fields or {}).items():
        if dtype in (np.float32, np.float64):
            field = rs.rand(n_variant).astype(dtype)
        elif dtype in (np.int8, np.int16, np.int32, np.int64):
            field = rs.randint(0, 100, n_variant, dtype=dtype)
        elif dtype is bool:
            field = rs.rand(n_variant) > 0.5
        elif dtype is str:
            field = np.arange(n_variant).astype("S")
        else:
            raise InputError(f"simulate_genotype_call_dataset: additional_variant_fields[{name!r}]: unrecognized "
                             f"type {dtype!r} (float32, float64, int8, int16, int32, int64, bool or str)")
        ds[name] = (("variants",), field)
    return ds


# --- save_dataset -------------------------------------------------------------------------------------


class GenotypeDisplay:
    """A table of genotype calls, shown as sgkit shows it (text, or HTML in a notebook)."""

    def __init__(self, df, shape: tuple[int, int], max_variants: int, max_samples: int):
        self.df, self.shape = df, shape
        self.max_variants, self.max_samples = max_variants, max_samples
        self.pd_options = ["display.max_rows", max_variants, "display.min_rows", max_variants,
                           "display.max_columns", max_samples, "display.show_dimensions", False]

    def _truncated(self) -> bool:
        return len(self.df) > self.max_variants or len(self.df.columns) > self.max_samples

    def __repr__(self) -> str:
        import pandas as pd

        with pd.option_context(*self.pd_options):
            text = self.df.__repr__()
            return text + f"\n\n[{self.shape[0]} rows x {self.shape[1]} columns]" if self._truncated() else text

    def _repr_html_(self) -> str:
        import pandas as pd

        with pd.option_context(*self.pd_options):
            html = self.df._repr_html_()
            return html.replace("</div>", f"<p>{self.shape[0]} rows x {self.shape[1]} columns</p></div>") if (
                self._truncated()) else html


def _truncate(ds: xr.Dataset, max_sizes: dict) -> xr.Dataset:
    """The first and last positions along each dimension longer than its most (one more at the
    head, where pandas puts its ellipsis), as sgkit's ``truncate``."""
    sel = {}
    for dim, size in max_sizes.items():
        if ds.sizes[dim] > size:
            n = ds.sizes[dim]
            head = size // 2 + size % 2 + 1
            sel[dim] = np.r_[np.arange(min(head, n)), np.arange(n)[-size // 2:]]
    return ds.isel(sel)


def _genotype_strings(calls: np.ndarray, phased, max_chars: int) -> np.ndarray:
    """VCF text of each call: alleles joined by "/" ("|" where phased), "." for a missing allele
    (-1), a fill value (< -1) left out with its separator (sgkit's ``genotype_as_bytes``)."""
    text = calls.astype(f"S{max_chars}").astype("U")
    phased = np.broadcast_to(np.asarray(phased, dtype=bool), calls.shape[:-1])
    out = np.empty(calls.shape[:-1], dtype=object)
    for index in np.ndindex(out.shape):
        s = ""
        for slot, a in enumerate(text[index]):
            if a.startswith("-"):
                if a[1:2] == "1":
                    a = "."
                else:
                    continue
            s += ("|" if phased[index] else "/") + a if slot else a
        out[index] = s
    return out.astype("U")


def display_genotypes(ds: xr.Dataset, max_variants: int = 60, max_samples: int = 10) -> GenotypeDisplay:
    """The genotype calls as a table, variants by samples, as sgkit's ``display_genotypes``: at
    most ``max_variants`` rows and ``max_samples`` columns (the first and last), indexed by
    ``variant_id`` (else ``variant_position``) and ``sample_id`` where those are unique. Only
    the calls shown are read (to the host)."""
    import pandas as pd

    op = "display_genotypes"
    if not isinstance(ds, xr.Dataset):
        raise InputError(f"{op}: expected an xarray.Dataset, got {type(ds).__name__}")
    names = ["call_genotype", "sample_id"]
    names += ["call_genotype_phased"] if "call_genotype_phased" in ds else []
    names += ["variant_id"] if "variant_id" in ds else ["variant_position"]
    missing = [n for n in names if n not in ds]
    if missing:
        raise InputError(f"{op}: the dataset has no variable {', '.join(map(repr, missing))}")
    calls = _truncate(ds[names], {"variants": max_variants, "samples": max_samples})
    samples = _index(calls, "samples", "sample_id")
    variants = _index(calls, "variants", "variant_id" if "variant_id" in calls else "variant_position")
    max_chars = max(2, len(str(ds.sizes.get("alleles", 2) - 1)))
    phased = np.asarray(to_numpy(calls["call_genotype_phased"].data)) if "call_genotype_phased" in calls else False
    strings = _genotype_strings(np.asarray(to_numpy(calls["call_genotype"].data)), phased, max_chars)
    df = pd.DataFrame(strings)
    df.columns = samples
    df.columns.name = "samples"
    df.index = variants
    df.index.name = "variants"
    return GenotypeDisplay(df, (ds.sizes["variants"], ds.sizes["samples"]), max_variants, max_samples)


def _index(ds: xr.Dataset, dim: str, name: str) -> np.ndarray:
    """The labels of ``dim``: its index where it has one, else ``name``'s values where unique,
    else the positions (sgkit's ``set_index_if_unique``)."""
    import pandas as pd

    index = ds.get_index(dim)
    if not isinstance(index, pd.RangeIndex):
        return index.values
    values = np.asarray(to_numpy(ds[name].data))
    return values if len(pd.unique(values)) == len(values) else index.values
