"""``pipeline.genomics.load_dataset`` as sgkit 0.10's: its arguments (``storage_options``,
``consolidated``, zarr Store objects, fsspec mappings), and every variable of the type sgkit
gives it on stores written by bio2zarr (the genomics demo and ``pipeline import-vcf``, Zarr v2
and v3) and by sgkit.

sgkit's ``load_dataset`` is ``xarray.open_zarr(store, concat_characters=False)`` with its
``*_mask`` variables made boolean; sgkit 0.10 runs on zarr 2, which reads variable-length strings
as object arrays (zarr 3 reads them as NumPy's ``StringDType``, in which ``.astype(str)`` fails).
Measured with sgkit 0.10.0 (xarray 2025.3, zarr 2.18) on the v2 stores: strings ``object``,
``contig_length`` float64 (bio2zarr's v2 fill value 0 is a CF fill value); sgkit 0.10 cannot open
Zarr v3 stores, where xarray gives ``contig_length`` int64."""

from __future__ import annotations

import subprocess
import sys

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr

import pipeline.genomics as sg
from pipeline.demo_genomics import write_genomics_demo

from .conftest import requires_gpu
from .genomics_data import FIXTURES
from .test_genomics_io import HEADER, RECORDS

DEMO = dict(samples=12, variants=40, seed=3, variant_chunk=20, sample_chunk=5)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The demo (bio2zarr), an imported VCF (``pipeline import-vcf``), each as Zarr v2 and v3,
    and sgkit's store."""
    pytest.importorskip("cyvcf2")  # pipeline import-vcf reads the VCF with it
    root = tmp_path_factory.mktemp("compat")
    vcf = root / "one.vcf"
    vcf.write_text(HEADER + "\n".join(RECORDS["chr1"]) + "\n")
    out = {"sgkit": FIXTURES / "sgkit_store.zarr"}
    for fmt in (2, 3):
        out[f"demo{fmt}"] = write_genomics_demo(root / f"demo{fmt}.vcz", zarr_format=fmt, **DEMO)
        path = root / f"vcf{fmt}.vcz"
        r = subprocess.run([sys.executable, "-m", "pipeline", "import-vcf", str(vcf), str(path),
                            "--zarr-format", str(fmt), "--no-progress"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out[f"vcf{fmt}"] = path
    return out


def _sgkit_reads(store) -> xr.Dataset:
    """sgkit's ``load_dataset`` on this xarray, with zarr 2's type for variable-length strings."""
    ds = xr.open_zarr(store, concat_characters=False)
    for name in ds.data_vars:
        if name.endswith("_mask"):
            ds[name] = ds[name].astype(bool)
    return ds.map(lambda v: v.astype(object) if v.dtype.kind == "T" else v)


@pytest.mark.parametrize("store", ["demo2", "demo3", "vcf2", "vcf3", "sgkit"])
def test_every_variable_has_sgkit_type(stores, store):
    path = stores[store]
    ds = sg.load_dataset(path, backend="cpu")
    expected = _sgkit_reads(path)
    assert set(ds.variables) == set(expected.variables)
    for name, ref in expected.variables.items():
        var = ds[name]
        assert var.dtype == ref.dtype and var.dims == ref.dims, (name, var.dtype, ref.dtype)
        if ref.dtype.kind in "OUS":
            assert isinstance(var.data._meta, np.ndarray), name
            assert var.values.astype(str).tolist() == ref.values.astype(str).tolist(), name
        else:
            np.testing.assert_array_equal(var.values, ref.values, err_msg=name)
    assert ds["variant_allele"].values.astype(str)[0, 0] != ""
    assert ds["sample_id"].values.astype(str).dtype.kind == "U"
    if store in ("demo2", "vcf2"):
        assert ds["contig_length"].dtype == np.float64  # as sgkit 0.10 gives it
    elif store in ("demo3", "vcf3"):
        assert ds["contig_length"].dtype == np.int64


def test_sgkit_store_types_as_sgkit_gave_them(stores):
    """sgkit's own store, against what sgkit 0.10 read from it (sgkit_io.npz)."""
    ds = sg.load_dataset(stores["sgkit"], backend="cpu")
    with np.load(FIXTURES / "sgkit_io.npz") as f:
        for name in ds.variables:
            assert str(ds[name].dtype) == str(f[f"{name}__dtype"]), name


@pytest.mark.parametrize("fmt", [2, 3])
def test_sgkit_arguments_and_stores(stores, fmt):
    """sgkit's arguments and the stores it takes open the store alike, strings as objects."""
    path = stores[f"demo{fmt}"]
    base = sg.load_dataset(path, backend="cpu")
    for ds in (sg.load_dataset(path, consolidated=True, backend="cpu"),
               sg.load_dataset(str(path), storage_options={}, backend="cpu"),
               sg.load_dataset(zarr.storage.LocalStore(str(path), read_only=True), backend="cpu"),
               sg.load_dataset(fsspec.get_mapper(str(path)), backend="cpu"),
               sg.load_dataset(path, False)):
        assert set(ds.variables) == set(base.variables)
        for name, var in base.variables.items():
            assert ds[name].dtype == var.dtype, name
            assert ds[name].values.astype(str).tolist() == var.values.astype(str).tolist(), name
        assert ds["call_genotype"].chunks is not None


def test_variables_and_chunks_with_any_store(stores):
    store = zarr.storage.LocalStore(str(stores["demo3"]), read_only=True)
    ds = sg.load_dataset(store, backend="cpu", variables=["call_genotype", "sample_id"], chunks={"variants": 40})
    assert set(ds.data_vars) == {"call_genotype", "sample_id"}
    assert ds["call_genotype"].data.chunks[0] == (40,)
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="no variable 'call_AD'"):
        sg.load_dataset(store, variables=["call_AD"])


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("store", ["demo2", "demo3", "vcf2", "sgkit"])
def test_gpu_gives_the_cpu_types(stores, store):
    """On the GPU, every variable has the CPU's type; strings stay on the host as objects."""
    import cupy as cp

    cpu = sg.load_dataset(stores[store], backend="cpu")
    for gpu in (sg.load_dataset(stores[store], backend="gpu"),
                sg.load_dataset(fsspec.get_mapper(str(stores[store])), backend="gpu")):
        for name, var in cpu.data_vars.items():
            assert gpu[name].dtype == var.dtype, name
            meta = gpu[name].data._meta
            assert isinstance(meta, cp.ndarray if var.dtype.kind in "biuf" else np.ndarray), name
