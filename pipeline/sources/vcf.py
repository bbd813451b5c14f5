"""VCF Zarr stores: Zarr v2 or v3 groups in the layout of the VCF Zarr specification, as
bio2zarr (``vcf2zarr``, ``tskit2zarr``) and sgkit's ``save_dataset`` write them, read as sgkit's
``load_dataset`` reads them.

A store is VCF Zarr when its root group's attributes hold ``vcf_zarr_version`` (bio2zarr writes
it), or when it holds the spec's arrays: ``call_genotype``, or ``variant_position`` with
``sample_id`` (sgkit's stores carry no version). Its arrays keep the spec's names (``call_*``,
``variant_*``, ``sample_*``, ``contig_*``, ``filter_*``) and dimensions (variants, samples,
ploidy, alleles, contigs, filters...), which xarray reads from ``_ARRAY_DIMENSIONS`` (v2) or the
``dimension_names`` (v3).

What differs from a CF store (:mod:`.zarr`), and why:

- **Values are data, as stored.** The spec's sentinels are values: -1 for missing and -2 for
  fill (mixed ploidy, padding) in integer fields, the NaN payloads 0x7F800001 (missing) and
  0x7F800002 (fill) in floats. CF masking would turn the int8 genotypes of a store whose Zarr
  ``fill_value`` (or ``_FillValue`` attribute) is -1 or -2 into float32 with NaN for both, losing
  the difference. So the sentinels are never masked; a variable with another CF fill value is
  masked as ``xarray.open_zarr`` (and so sgkit's ``load_dataset``) masks it, taking its type:
  bio2zarr's Zarr v2 ``contig_length`` (int64, fill value 0) is float64, as sgkit reads it.
- **Characters are not joined.** sgkit opens stores with ``concat_characters=False``: xarray's
  default joins the last dimension of a one-character array, which turns the ``|S1``
  ``variant_allele`` (variants, alleles) of sgkit's stores into one string per variant.
- **Booleans** stored as bool (bio2zarr) or as int8 with a ``dtype: bool`` attribute (xarray,
  and so sgkit's stores) are read as bool; a ``*_mask`` variable of another type becomes bool,
  as sgkit's ``load_dataset`` makes it.
- **Strings stay on the host**, never moved to the device: variable-length strings as object
  arrays, as sgkit (zarr 2) reads them, not zarr 3's ``StringDType`` (which ``.astype(str)``
  refuses); fixed-width ``U``/``S`` as stored.

Numbers and booleans are Dask arrays on the backend, one block per stored chunk (the stored
chunks of variants x samples; on the GPU several variant chunks a block, as every store's are);
on the GPU their chunks go through pipeline's reader (:mod:`pipeline.gpu.reader`), whose Blosc
path decodes bio2zarr's default codec (Blosc zstd with bit shuffle) on the device.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import zarr as _zarr

NAME = "vcf-zarr"
VERSION_ATTR = "vcf_zarr_version"
# arrays that make a Zarr group a VCF Zarr store, where its attributes do not say so
SPEC_ARRAYS = (("call_genotype",), ("variant_position", "sample_id"))
# the spec's missing and fill values of integer fields: data, never masked as CF fill values
SENTINELS = {-1, -2}


def detect(path: Path) -> str | None:
    """``"vcf-zarr"`` for a Zarr store (v2 or v3) in the VCF Zarr layout, else None."""
    version = _zarr.detect(path)
    if version is None:
        return None
    if VERSION_ATTR in root_attributes(path, version):
        return NAME
    if any(all(_is_array(path / name, version) for name in names) for names in SPEC_ARRAYS):
        return NAME
    return None


def root_attributes(path: Path, version: str) -> dict:
    """The attributes of the store's root group (``{}`` where it has none or they cannot be read)."""
    try:
        if version == "zarr3":
            return dict(json.loads((path / "zarr.json").read_text()).get("attributes") or {})
        attrs = path / ".zattrs"
        if attrs.exists():
            return dict(json.loads(attrs.read_text()))
        consolidated = path / ".zmetadata"
        if consolidated.exists():
            return dict(json.loads(consolidated.read_text()).get("metadata", {}).get(".zattrs") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return {}


def _is_array(path: Path, version: str) -> bool:
    if version == "zarr2":
        return (path / ".zarray").exists()
    try:
        return json.loads((path / "zarr.json").read_text()).get("node_type") == "array"
    except (OSError, ValueError, AttributeError):
        return False


def open_store(path, fmt: str, chunks, **decoding):
    """The store as xarray opens it (``decoding``: xarray's options), as a Zarr store of its version."""
    return _zarr.open_store(path, _zarr.detect(Path(path)) or "zarr3", chunks, **decoding)


__all__ = ["NAME", "SENTINELS", "SPEC_ARRAYS", "VERSION_ATTR", "detect", "open_store", "root_attributes"]
