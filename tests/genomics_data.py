"""The genomics tests' data: ``tests/fixtures/genomics/inputs.npz`` as VCF Zarr Datasets, and
sgkit's results on the same data (``sgkit_*.npz``, made by the scripts beside them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "genomics"


def inputs() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "inputs.npz") as f:
        return {k: f[k] for k in f.files}


def dataset(kind: str = "bi", chunks: dict | None = None, backend: str = "cpu") -> xr.Dataset:
    """Data set ``kind`` ("bi" or "multi") in the layout of VCF Zarr (and of sgkit's
    ``create_genotype_call_dataset``), as Dask arrays of ``chunks`` (default: 100 variants, all
    samples) on ``backend``."""
    import dask.array as da

    from pipeline import backend as B

    a = inputs()
    g = a[f"{kind}_call_genotype"]
    n_variant, n_sample, ploidy = g.shape
    n_allele = int(a[f"{kind}_n_allele"])
    chunks = {"variants": 100, "samples": -1, **(chunks or {})}

    def arr(x, dims):
        c = tuple(chunks.get(d, -1) for d in dims)
        return B.to_backend(da.from_array(x, chunks=c), backend) if x.dtype.kind in "iufb" else da.from_array(x, chunks=c)

    bases = np.array(["A", "C", "G", "T"])
    allele = np.broadcast_to(bases[:n_allele], (n_variant, n_allele)).astype(object)
    ds = xr.Dataset(
        {
            "call_genotype": (("variants", "samples", "ploidy"), arr(g, ("variants", "samples", "ploidy"))),
            "call_genotype_mask": (("variants", "samples", "ploidy"), arr(g < 0, ("variants", "samples", "ploidy"))),
            "variant_position": (("variants",), arr(a[f"{kind}_variant_position"], ("variants",))),
            "variant_contig": (("variants",), arr(a[f"{kind}_variant_contig"], ("variants",))),
            "variant_allele": (("variants", "alleles"), allele),
            "sample_id": (("samples",), np.array([f"S{i}" for i in range(n_sample)], dtype=object)),
            "contig_id": (("contigs",), np.array(["chr1", "chr2"], dtype=object)),
            "sample_cohort": (("samples",), arr(a[f"{kind}_sample_cohort"], ("samples",))),
        },
        attrs={"contigs": ["chr1", "chr2"], "vcf_zarr_version": "0.4"},
    )
    ds["call_genotype"].attrs["mixed_ploidy"] = False
    if kind == "bi":
        ds["sample_trait"] = (("samples", "traits"), arr(a["bi_sample_trait"], ("samples", "traits")))
        ds["sample_covariate"] = (("samples", "covariates"), arr(a["bi_sample_covariate"], ("samples", "covariates")))
    return ds


def sgkit(group: str) -> dict[str, np.ndarray]:
    """sgkit's results for one group of ops (``sgkit_{group}.npz``), by the names its script gives."""
    with np.load(FIXTURES / f"sgkit_{group}.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files}
