"""Genomics ops on VCF Zarr datasets, with sgkit's names, parameters and output variables.

Each op takes an ``xarray.Dataset`` in the VCF Zarr layout (``call_genotype`` of dimensions
``(variants, samples, ploidy)``, -1 for a missing allele and -2 for fill; ``variant_position``,
``variant_contig``, ``sample_id``...) and returns a Dataset, as sgkit's functions do: by default
the input merged with the new variables (``merge=True``), else the new variables alone. Nothing is
computed until the caller asks. So a user switches from sgkit by changing the import::

    import pipeline.genomics as sg        # was: import sgkit as sg
    ds = sg.variant_stats(ds)

Numeric arrays are Dask arrays of NumPy or CuPy chunks, streamed over chunks of variants; the
backend is the one of ``call_genotype``'s data (:func:`._dataset.backend_of_dataset`).
"""

from __future__ import annotations

from importlib import import_module

# the modules that register the genomics ops; each defines its public functions in __all__
MODULES = (
    "stats", "window", "popgen", "pca", "distance", "ld", "gwas", "qc",
    "datasets", "conversion", "frequencies", "relatedness", "pedigree", "association",
)

__all__: list[str] = []
for _name in MODULES:
    try:
        _module = import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:  # a module not written yet
        if _e.name != f"{__name__}.{_name}":
            raise
        continue
    for _fn in getattr(_module, "__all__", ()):
        globals()[_fn] = getattr(_module, _fn)
        __all__.append(_fn)
