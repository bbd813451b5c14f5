"""VCF Zarr in and out: stores written by bio2zarr (from msprime through the genomics demo, and
from VCF files through ``import_vcf``, Zarr v2 and v3) and by sgkit open as zarr and sgkit read
them; the demo is deterministic, exact in its sizes, and all or nothing; the GPU reader's CPU
twin decodes bio2zarr's chunks bit for bit."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

import pipeline
import pipeline.genomics as sg
from pipeline import cli
from pipeline.demo_genomics import call_uniforms, import_vcf, set_missing, write_genomics_demo
from pipeline.errors import InputError
from pipeline.gpu import blosc, reader
from pipeline.sources import store_format

from .conftest import requires_gpu
from .genomics_data import FIXTURES

SGKIT_STORE = FIXTURES / "sgkit_store.zarr"
DEMO = dict(samples=50, variants=300, seed=3, variant_chunk=100, sample_chunk=20)


@pytest.fixture(scope="module")
def demo_stores(tmp_path_factory):
    """The genomics demo, 300 variants x 50 samples in chunks of 100 x 20, as Zarr v2 and v3."""
    root = tmp_path_factory.mktemp("demo")
    return {fmt: write_genomics_demo(root / f"demo{fmt}.vcz", zarr_format=fmt, **DEMO) for fmt in (2, 3)}


def _zarr_arrays(path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dict(zarr.open_group(str(path), mode="r").arrays())


def _dims(arr) -> tuple[str, ...]:
    return tuple(arr.metadata.dimension_names or arr.attrs["_ARRAY_DIMENSIONS"]) if arr.metadata.zarr_format == 3 \
        else tuple(arr.attrs["_ARRAY_DIMENSIONS"])


def _equal_to_zarr(ds: xr.Dataset, path) -> None:
    """Every array of the store is a variable of ``ds`` with zarr's dimensions and values, and the
    type sgkit gives it: variable-length strings as objects (zarr 2's type, not zarr 3's
    ``StringDType``), integers with a CF fill value (bio2zarr's v2 ``contig_length``) as float64."""
    arrays = _zarr_arrays(path)
    assert set(ds.data_vars) == set(arrays)
    for name, arr in arrays.items():
        var = ds[name]
        assert var.dims == _dims(arr), name
        expected = arr[...]
        if expected.dtype.kind == "T":
            expected = expected.astype(object)
        elif name == "contig_length" and arr.metadata.zarr_format == 2:
            expected = expected.astype(np.float64)
        assert var.dtype == expected.dtype, (name, var.dtype, expected.dtype)
        got = var.values
        if expected.dtype.kind in "TUSO":
            assert isinstance(var.data._meta, np.ndarray)  # strings stay on the host
            assert got.tolist() == expected.tolist(), name
        else:
            np.testing.assert_array_equal(got, expected, err_msg=name)
            assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), name  # bit for bit (NaN payloads)


# --- opening ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [2, 3])
def test_bio2zarr_demo_opens_as_zarr_reads_it(demo_stores, fmt):
    path = demo_stores[fmt]
    assert store_format(path) == "vcf-zarr"
    ds = pipeline.open_dataset(path, backend="cpu")
    _equal_to_zarr(ds, path)
    assert ds.attrs["vcf_zarr_version"] == "0.5"
    g = ds["call_genotype"]
    assert g.dims == ("variants", "samples", "ploidy") and g.dtype == np.int8  # not masked to float
    assert g.data.chunks == ((100, 100, 100), (20, 20, 10), (2,))  # the stored chunks
    assert ds["variant_position"].data.chunks == ((100, 100, 100),)
    values = g.values
    assert (values == -1).any() and values.min() == -1
    np.testing.assert_array_equal(ds["call_genotype_mask"].values, values < 0)
    assert ds["call_genotype_mask"].dtype == bool and ds["call_genotype_phased"].dtype == bool
    # sgkit 0.10's load_dataset (xarray.open_zarr, zarr 2) masks bio2zarr's Zarr v2 fill value 0
    # of contig_length, which makes it float64; a Zarr v3 fill value is no CF fill value to xarray
    # (zarr 3), so int64 there (sgkit 0.10 needs zarr<3 and cannot open v3 stores at all)
    assert ds["contig_length"].dtype == (np.float64 if fmt == 2 else np.int64)
    assert ds["sample_id"].dtype == object and ds["variant_allele"].values.astype(str)[0, 0] != ""
    assert ds["sample_id"].values[0] == "tsk_0"
    assert not {"_FillValue", "missing_value"} & set().union(*(v.attrs for v in ds.variables.values()))


def test_variables_and_chunks(demo_stores):
    path = demo_stores[2]
    ds = pipeline.open_dataset(path, backend="cpu", variables=["call_genotype", "sample_cohort"],
                               chunks={"variants": 37, "samples": 25})
    assert set(ds.data_vars) == {"call_genotype", "sample_cohort"}
    assert ds["call_genotype"].data.chunks[:2] == ((37,) * 8 + (4,), (25, 25))
    np.testing.assert_array_equal(ds["call_genotype"].values, zarr.open_array(str(path / "call_genotype"))[...])
    with pytest.raises(InputError, match="no variable 'call_AD'"):
        pipeline.open_dataset(path, backend="cpu", variables=["call_AD"])


@pytest.mark.parametrize("fmt", [2, 3])
def test_strings_read_from_their_chunk_files_as_zarr_reads_them(demo_stores, tmp_path, fmt):
    """bio2zarr's variable-length strings (Zarr v2: VLenUTF8 then Blosc; v3: vlen-utf8 then Blosc)
    are decoded from their chunk files by numcodecs (pipeline.sources.reads.chunks_of), not through
    zarr: the values and type that zarr and sgkit give, blocks across chunk boundaries, a chunk
    never written as the empty strings zarr fills it with, and a damaged chunk named."""
    import shutil

    from pipeline.sources import reads

    path = tmp_path / "s.vcz"
    shutil.copytree(demo_stores[fmt], path)
    arr = zarr.open_array(str(path / "variant_allele"), mode="r")
    key = arr.metadata.encode_chunk_key((1, 0))
    (path / "variant_allele" / key).unlink()  # variants 100-199 never written
    ds = pipeline.open_dataset(path, backend="cpu", chunks={"variants": 70})
    var = ds["variant_allele"]  # (strings with the fill value "", sample_id's, are masked by xarray: read by it)
    plan = reads.chunks_of(_store_array(var).variable)
    assert plan is not None and plan.strings
    expected = zarr.open_array(str(path / "variant_allele"), mode="r")[...]
    got = var.values
    assert got.dtype == object and got.dtype.metadata == {"element_type": str}
    assert all(type(x) is str for x in got.ravel())
    assert got.tolist() == expected.astype(object).tolist()
    assert (got[100:200] == "").all() and (got[:100, 0] != "").all()
    # a damaged chunk: an InputError naming the variable and the chunk
    (path / "variant_allele" / arr.metadata.encode_chunk_key((2, 0))).write_bytes(b"not a chunk")
    with pytest.raises(InputError, match=r"variant_allele.*chunk"):
        pipeline.open_dataset(path, backend="cpu")["variant_allele"].values


def test_strings_of_a_store_xarray_wrote_read_from_their_chunk_files(tmp_path):
    """A VCF Zarr store that xarray wrote with zarr's defaults (Zarr v3: vlen-utf8 then zstd) reads
    its strings from their chunk files too, as zarr reads them."""
    from pipeline.sources import reads

    alleles = np.array([["A", "T", ""], ["G", "", ""], ["C", "GA", "T"]] * 9, dtype=object)
    xr.Dataset({"variant_allele": (("variants", "alleles"), alleles),
                "variant_position": ("variants", np.arange(27, dtype=np.int32)),
                "sample_id": ("samples", np.array(["s0", "s1"], dtype=object))},
               attrs={"vcf_zarr_version": "0.4"}).chunk({"variants": 10}).to_zarr(tmp_path / "x.vcz", zarr_format=3)
    codecs = [c["name"] for c in json.loads((tmp_path / "x.vcz" / "variant_allele" / "zarr.json").read_text())["codecs"]]
    assert codecs == ["vlen-utf8", "zstd"]
    # a string array zarr wrote with a fill value of its own, one chunk never written
    ids = zarr.create_array(str(tmp_path / "x.vcz" / "variant_id"), shape=(27,), chunks=(10,), dtype=str, fill_value="N/A",
                            dimension_names=("variants",))
    ids[:10] = np.array([f"rs{k}" for k in range(10)])
    ids[20:] = np.array([f"rs{k}" for k in range(20, 27)])
    zarr.consolidate_metadata(str(tmp_path / "x.vcz"))  # xarray wrote consolidated metadata
    ds = pipeline.open_dataset(tmp_path / "x.vcz", backend="cpu", chunks={"variants": 7})
    for name in ("variant_allele", "variant_id"):
        assert reads.chunks_of(_store_array(ds[name]).variable) is not None, name
    assert ds["variant_allele"].values.tolist() == alleles.tolist()
    assert ds["variant_id"].values.tolist() == zarr.open_array(str(tmp_path / "x.vcz" / "variant_id"))[...].tolist()
    assert ds["variant_id"].values[10:20].tolist() == ["N/A"] * 10


def _no_strings(monkeypatch):
    """A chunk whose lengths are not proved fails the test: the alleles are to be counted from
    their lengths, not from strings."""
    from pipeline.sources import reads

    proved = reads._vlen_present

    def proving(raws, shape):
        present = proved(raws, shape)
        assert present is not None, "a chunk's strings would be decoded"
        return present

    monkeypatch.setattr(reads, "_vlen_present", proving)


@pytest.mark.parametrize("fmt", [2, 3])
def test_alleles_counted_from_their_chunk_files_as_from_their_strings(demo_stores, tmp_path, monkeypatch, fmt):
    """``filter_variants(max_alleles=...)`` counts each variant's alleles from the lengths in
    bio2zarr's chunk files, not from strings: the counts of the strings zarr reads, in blocks
    across chunk boundaries, with a chunk never written (no allele); the filter keeps the same
    variants as from the strings in memory."""
    import shutil

    from pipeline import state
    from pipeline.kernels import genotypes
    from pipeline.ops.genomics import qc

    path = tmp_path / "s.vcz"
    shutil.copytree(demo_stores[fmt], path)
    arr = zarr.open_array(str(path / "variant_allele"), mode="r")
    (path / "variant_allele" / arr.metadata.encode_chunk_key((1, 0))).unlink()
    expected = genotypes.strings_named(zarr.open_array(str(path / "variant_allele"), mode="r")[...])
    assert (expected[100:200] == 0).all() and set(expected[:100]) >= {2}
    ds = pipeline.open_dataset(path, backend="cpu", chunks={"variants": 70})
    alleles = ds["variant_allele"].data
    assert state.opened.strings.get(alleles.name) is not None
    with monkeypatch.context() as m:
        _no_strings(m)
        counted = qc._alleles_named(alleles)
        assert counted.chunks == (alleles.chunks[0],)
        np.testing.assert_array_equal(counted.compute(), expected)
        out = sg.filter_variants(ds, max_alleles=1)
    # a step on the strings (a selection) counts them from the strings, with the same numbers
    subset = ds["variant_allele"].data[5:250]
    assert state.opened.strings.get(subset.name) is None
    np.testing.assert_array_equal(qc._alleles_named(subset).compute(), expected[5:250])
    in_memory = sg.filter_variants(ds.load(), max_alleles=1)
    assert out.sizes["variants"] == in_memory.sizes["variants"] == int((expected <= 1).sum())
    np.testing.assert_array_equal(out.variant_position.values, in_memory.variant_position.values)


@pytest.mark.parametrize("fmt", [2, 3])
def test_alleles_that_their_lengths_cannot_prove_are_counted_from_their_strings(tmp_path, fmt):
    """Strings as zarr writes them with numcodecs' VLenUTF8 (v2) or its vlen-utf8 codec (v3):
    long alleles (32 bytes or more), text beyond ASCII and control characters, each in a chunk
    of its own beside plain ones. Every count is the strings'; a damaged chunk is named."""
    from pipeline.kernels import genotypes
    from pipeline.ops.genomics import qc

    rows = [["A", "T", ""], ["G", "", ""], ["C", "GA", "T"], ["", "", ""]] * 10
    rows[12] = ["A", "T" * 40, ""]  # a long insertion: its length is not below 32
    rows[25] = ["É", "\u00e9t\u00e9", ""]  # UTF-8 beyond ASCII
    rows[33] = ["A", "\t", "\x01C"]  # control characters among the bytes
    alleles = np.array(rows, dtype=object)
    store = zarr.open_group(str(tmp_path / "x.vcz"), mode="w", zarr_format=fmt)
    a = store.create_array("variant_allele", shape=alleles.shape, chunks=(10, 3), dtype=str,
                           **({"dimension_names": ("variants", "alleles")} if fmt == 3 else
                              {"attributes": {"_ARRAY_DIMENSIONS": ["variants", "alleles"]}}))
    a[...] = alleles
    p = store.create_array("variant_position", shape=(40,), chunks=(10,), dtype="i4",
                           **({"dimension_names": ("variants",)} if fmt == 3 else
                              {"attributes": {"_ARRAY_DIMENSIONS": ["variants"]}}))
    p[...] = np.arange(40)
    zarr.consolidate_metadata(str(tmp_path / "x.vcz"))
    ds = pipeline.open_dataset(tmp_path / "x.vcz", backend="cpu", chunks={"variants": 15})
    counted = qc._alleles_named(ds["variant_allele"].data).compute()
    np.testing.assert_array_equal(counted, genotypes.strings_named(alleles))
    key = a.metadata.encode_chunk_key((2, 0))
    (tmp_path / "x.vcz" / "variant_allele" / key).write_bytes(b"not a chunk")
    ds = pipeline.open_dataset(tmp_path / "x.vcz", backend="cpu", chunks={"variants": 15})
    with pytest.raises(InputError, match=r"variant_allele.*chunk"):
        qc._alleles_named(ds["variant_allele"].data).compute()


def test_lengths_of_strings_are_proved_or_refused():
    """Which strings are not empty, from numcodecs' VLenUTF8 bytes: the same as the decoded
    strings' truth wherever an answer is given, on random strings of lengths 0 to 40 with
    control characters; refused (None) for bytes that are not that encoding."""
    import numcodecs

    from pipeline.sources import reads

    rng = np.random.default_rng(7)
    printable = list("ACGTN*<>") + [""]
    control = printable + ["\t", "\x01", "\x1f"]
    for trial in range(300):
        kind = trial % 3  # long strings of every byte; short ones with control characters; short printable
        alphabet = np.array(printable if kind == 2 else control, dtype=object)
        chunks = []
        for _ in range(rng.integers(1, 4)):
            k = rng.integers(0, 40 if kind == 0 else 3, size=(6, 3))
            chunks.append(np.array(["".join(rng.choice(alphabet, size=n)) for n in k.ravel()], dtype=object).reshape(6, 3))
        got = reads._vlen_present([numcodecs.VLenUTF8().encode(c) for c in chunks], (6, 3))
        if got is not None:
            np.testing.assert_array_equal(got, np.stack([c.astype(bool) for c in chunks]))
        else:
            assert kind != 2, chunks  # strings below 32 bytes, all printable: always answered
    one = numcodecs.VLenUTF8().encode(np.array([["A", ""]], dtype=object))
    assert reads._vlen_present([one], (1, 2)).tolist() == [[[True, False]]]
    for bad in (one[:-1], one + b"A", b"\x02\x00\x00\x00", one[:4] + b"\x05\x00\x00\x00A\x00\x00\x00\x00"):
        assert reads._vlen_present([bad], (1, 2)) is None
    assert reads._vlen_present([one, one], (1, 2)).tolist() == [[[True, False]], [[True, False]]]


def _store_array(var):
    """The reads.StoreArray that a variable's Dask array reads its blocks from."""
    from pipeline.sources import reads

    found = [v for v in dict(var.data.dask).values() if isinstance(v, reads.StoreArray)]
    assert len(found) == 1, found
    return found[0]


def test_grouped_blocks_take_whole_variant_chunks_and_keep_samples(demo_stores, monkeypatch):
    """Blocks of several stored chunks (the GPU's default, here asked of the CPU) grow along
    variants only, alike for every variable of variants, and keep the stored sample chunks
    (``samples`` is also the first dimension of ``sample_trait``)."""
    import dask

    import pipeline.exec.memory

    monkeypatch.setattr(pipeline.exec.memory, "min_blocks", lambda backend: 0)  # as on the GPU
    nbytes = 100 * 20 * 2  # one stored chunk of call_genotype
    with dask.config.set({"pipeline.cpu.block-size": 2 * nbytes}):
        ds = pipeline.open_dataset(demo_stores[3], backend="cpu")
    assert ds["call_genotype"].data.chunks[:2] == ((200, 100), (20, 20, 10))
    assert ds["variant_position"].data.chunks == ((200, 100),)
    assert ds["sample_trait"].data.chunks[0] == (20, 20, 10)


def test_vcf_zarr_written_back_with_its_strings(demo_stores, tmp_path):
    """A VCF Zarr dataset (strings included) written by pipeline's sink and verified: strings are
    hashed by value (not by the pointers of their arrays), and the copy opens as VCF Zarr again."""
    from pipeline.sinks.zarr import verify, write_zarr

    names = ["sample_id", "variant_allele", "call_genotype", "call_genotype_mask"]
    ds = pipeline.open_dataset(demo_stores[2], backend="cpu", variables=names)
    written = write_zarr(ds, tmp_path / "copy.zarr")
    assert verify(written) == written.digests
    again = write_zarr(ds, tmp_path / "again.zarr")
    assert again.digests == written.digests
    back = pipeline.open_dataset(written, backend="cpu")
    assert store_format(written) == "vcf-zarr"
    for name in names:
        assert back[name].dtype == ds[name].dtype and back[name].values.tolist() == ds[name].values.tolist(), name


def test_sgkit_store_opens_as_sgkit_reads_it():
    """A store sgkit wrote (``sgkit.save_dataset``: booleans as int8, alleles as ``|S1``, fixed-width
    strings, no ``vcf_zarr_version``) equals what ``sgkit.load_dataset`` reads (sgkit_io.npz)."""
    import pipeline.genomics as sg

    assert store_format(SGKIT_STORE) == "vcf-zarr"
    ds = sg.load_dataset(SGKIT_STORE, backend="cpu")
    with np.load(FIXTURES / "sgkit_io.npz") as f:
        expected = {k: f[k] for k in f.files}
    names = {k for k in expected if "__" not in k}
    assert set(ds.variables) == names
    for name in names:
        var = ds[name]
        assert str(var.dtype) == str(expected[f"{name}__dtype"]), name
        assert var.dims == tuple(expected[f"{name}__dims"]), name
        np.testing.assert_array_equal(var.values, expected[name], err_msg=name)
    assert ds["variant_allele"].dims == ("variants", "alleles")  # characters not joined
    g = ds["call_genotype"].values
    assert g.dtype == np.int8 and (g == -1).any() and (g == -2).any()
    assert ds["call_genotype"].data.chunks[:2] == ((40, 40, 40, 30), (20, 10))


@pytest.mark.parametrize("fmt", [2, 3])
def test_genotypes_with_a_fill_value_stay_int8(tmp_path, fmt):
    """Genotypes whose Zarr fill value is -1 (with -2 for fill), and strings with a fill value:
    as stored in a VCF Zarr store. The same int8 array in a plain CF store is masked to float, as
    xarray decodes it."""
    g = np.array([[[0, 1], [-1, -1]], [[1, -2], [0, 0]], [[-1, 1], [1, 1]]], dtype=np.int8)
    for store, name in ((tmp_path / "g.vcz", "call_genotype"), (tmp_path / "plain.zarr", "x")):
        root = zarr.open_group(str(store), mode="w", zarr_format=fmt)
        dims = ["variants", "samples", "ploidy"]
        kw = {"dimension_names": dims} if fmt == 3 else {}
        arr = root.create_array(name, shape=g.shape, dtype="i1", chunks=(2, 2, 2), fill_value=-1, **kw)
        arr[...] = g
        ids = root.create_array("sample_id", shape=(2,), dtype=str, fill_value="", chunks=(2,),
                                **({"dimension_names": ["samples"]} if fmt == 3 else {}))
        ids[...] = np.array(["a", ""])
        if fmt == 2:
            arr.attrs["_ARRAY_DIMENSIONS"] = dims
            ids.attrs["_ARRAY_DIMENSIONS"] = ["samples"]
        else:  # where xarray keeps a Zarr v3 variable's fill value
            arr.attrs["_FillValue"] = -1
    root = zarr.open_group(str(tmp_path / "g.vcz"), mode="r+")
    root.attrs["vcf_zarr_version"] = "0.4"
    ds = pipeline.open_dataset(tmp_path / "g.vcz", backend="cpu")
    assert ds["call_genotype"].dtype == np.int8
    np.testing.assert_array_equal(ds["call_genotype"].values, g)
    # strings are masked as xarray.open_zarr, and so sgkit's load_dataset, mask them: a Zarr v2
    # fill value "" is a CF fill value (NaN in an object array), a Zarr v3 one is not
    ids = ds["sample_id"].values
    expected = xr.open_zarr(tmp_path / "g.vcz", concat_characters=False)["sample_id"].values
    assert ids.dtype == object and ids[0] == "a" and (ids[1] == "" if fmt == 3 else ids[1] != ids[1])
    assert [v if v == v else None for v in ids] == [v if v == v else None for v in expected]
    plain = pipeline.open_dataset(tmp_path / "plain.zarr", backend="cpu")
    assert store_format(tmp_path / "plain.zarr") == f"zarr{fmt}"
    assert plain["x"].dtype.kind == "f" and np.isnan(plain["x"].values[g == -1]).all()


def test_detection_by_the_spec_arrays(tmp_path):
    """Without ``vcf_zarr_version``, a store is VCF Zarr by its arrays: ``call_genotype``, or
    ``variant_position`` with ``sample_id``; a mask that is not boolean becomes boolean."""
    ds = xr.Dataset({"variant_position": ("variants", np.arange(3)), "sample_id": ("samples", np.array(["a", "b"])),
                     "variant_id_mask": ("variants", np.array([0, 1, 0], dtype=np.int8))})
    ds.to_zarr(tmp_path / "a.zarr", zarr_format=2, consolidated=True)
    ds[["variant_position"]].to_zarr(tmp_path / "b.zarr", zarr_format=3)
    assert store_format(tmp_path / "a.zarr") == "vcf-zarr"
    assert store_format(tmp_path / "b.zarr") == "zarr3"
    opened = pipeline.open_dataset(tmp_path / "a.zarr", backend="cpu")
    np.testing.assert_array_equal(opened["variant_id_mask"].values, [False, True, False])


# --- the GPU reader's CPU twin ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [2, 3])
def test_gpu_reader_host_twin_decodes_bio2zarr_chunks_bit_exactly(demo_stores, fmt):
    """Every chunk file of every number and boolean array bio2zarr wrote (Blosc zstd, bit shuffle
    for genotypes and booleans) decodes on the GPU reader's CPU path exactly as zarr reads it."""
    path = demo_stores[fmt]
    decoded = 0
    for name, arr in _zarr_arrays(path).items():
        if arr.dtype.kind not in "biuf":
            continue
        lay = reader.layout(path / name)
        assert lay.codec == "blosc" and lay.dtype == arr.dtype
        grid = [range(-(-n // c)) for n, c in zip(arr.shape, lay.chunk)]
        for coords in np.ndindex(*map(len, grid)):
            region = tuple(slice(c * k, min((c + 1) * k, n)) for c, k, n in zip(coords, lay.chunk, arr.shape))
            expected = arr[region]
            try:
                blob = open(lay.path(coords), "rb").read()
            except FileNotFoundError:  # not written: all fill
                assert (expected == (lay.fill_value or 0)).all(), name
                continue
            if name in ("call_genotype", "call_genotype_mask"):
                chunk = blosc.parse(blob)
                assert (chunk.compressor, chunk.shuffle) == ("zstd", "bit") or chunk.memcpyed
            got = reader.decode_chunk_host(lay, blob)[tuple(slice(0, r.stop - r.start) for r in region)]
            assert got.dtype == expected.dtype and np.array_equal(got, expected), (name, coords)
            decoded += 1
    assert decoded >= 2 * 15  # call_genotype and its mask: 3 x 3 chunks each, and more


# --- the demo ---------------------------------------------------------------------------------------------


def test_demo_store_is_exact_and_in_bio2zarr_layout(demo_stores):
    path = demo_stores[2]
    arrays = _zarr_arrays(path)
    g = arrays["call_genotype"]
    assert g.shape == (300, 50, 2) and g.chunks == (100, 20, 2)
    meta = json.loads((path / "call_genotype" / ".zarray").read_text())
    assert meta["compressor"] == {"id": "blosc", "cname": "zstd", "clevel": 7, "shuffle": 2, "blocksize": 0}
    assert json.loads((path / ".zattrs").read_text())["vcf_zarr_version"] == "0.5"
    values = g[...]
    whole = (values == -1).all(axis=2)
    half = (values == -1).sum(axis=2) == 1
    assert 0.003 < whole.mean() < 0.03 and half.any()  # 1% whole, 0.1% one allele
    np.testing.assert_array_equal(arrays["call_genotype_mask"][...], values < 0)
    assert values.max() >= 1 and np.all(np.diff(arrays["variant_position"][...]) > 0)
    assert arrays["variant_position"][0] >= 1  # VCF positions are 1-based
    assert arrays["contig_length"][0] >= arrays["variant_position"][-1]
    cohort = arrays["sample_cohort"][...]
    assert cohort.dtype == np.int64 and np.bincount(cohort).tolist() == [17, 17, 16]
    assert arrays["sample_trait"].shape == (50, 2) and arrays["sample_covariate"].shape == (50, 3)
    assert np.isfinite(arrays["sample_trait"][...]).all()
    assert "not part of the VCF Zarr specification" in arrays["sample_trait"].attrs["description"]
    with warnings.catch_warnings():  # xarray's own reading (as sgkit's load_dataset): nothing masked either
        warnings.simplefilter("ignore")
        plain = xr.open_zarr(path, concat_characters=False)
    assert plain["sample_cohort"].dtype == np.int64 and plain["call_genotype"].dtype == np.int8
    manifest = json.loads((path / ".pipeline.json").read_text())
    assert manifest["kind"] == "demo" and manifest["demo"]["kind"] == "genomics" and manifest["complete"]


def test_demo_is_deterministic_whatever_the_chunks(demo_stores, tmp_path):
    """The same seed gives the same values, the missing calls included, in other chunks; another
    seed, other values."""
    again = write_genomics_demo(tmp_path / "again.vcz", **{**DEMO, "variant_chunk": 37, "sample_chunk": 25})
    first, second = _zarr_arrays(demo_stores[2]), _zarr_arrays(again)
    assert second["call_genotype"].chunks == (37, 25, 2)
    for name in set(first) - {"region_index"}:  # bio2zarr's index of the chunks
        np.testing.assert_array_equal(first[name][...], second[name][...], err_msg=name)
    other = write_genomics_demo(tmp_path / "other.vcz", **{**DEMO, "seed": 4})
    assert not np.array_equal(_zarr_arrays(other)["call_genotype"][...], first["call_genotype"][...])


def test_missing_calls_do_not_depend_on_the_chunks():
    u = call_uniforms(5, range(10, 20), slice(0, 30))
    np.testing.assert_array_equal(call_uniforms(5, range(13, 16), slice(7, 19)), u[3:6, 7:19])
    calls = np.zeros((10, 30, 2), dtype=np.int8)
    set_missing(calls, u, 0.2)
    np.testing.assert_array_equal((calls == -1).all(axis=2), u < 0.2)
    np.testing.assert_array_equal((calls == -1).sum(axis=2) == 1, (u >= 0.2) & (u < 0.22))


def test_demo_is_all_or_nothing(tmp_path, monkeypatch):
    import pipeline.demo_genomics as dg

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(dg, "_write_arrays", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        write_genomics_demo(tmp_path / "d.vcz", **DEMO)
    assert os.listdir(tmp_path) == []  # no store, no partial store, no lock
    monkeypatch.undo()
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not a pipeline store"):
        write_genomics_demo(folder, overwrite=True, **DEMO)
    assert os.listdir(folder) == ["keep.txt"]
    first = write_genomics_demo(tmp_path / "d.vcz", **DEMO)
    with pytest.raises(InputError, match="already exists"):
        write_genomics_demo(first, **DEMO)
    write_genomics_demo(first, overwrite=True, **{**DEMO, "seed": 9})
    assert sorted(os.listdir(tmp_path)) == ["d.vcz", "mine"]


def test_without_msprime_the_demo_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "msprime", None)  # import msprime raises ImportError
    with pytest.raises(InputError, match=r"msprime not installed.*bio2zarr\[tskit,vcf\]"):
        write_genomics_demo(tmp_path / "d.vcz", **DEMO)
    assert cli.main(["demo", "--kind", "genomics", str(tmp_path / "d.vcz")]) == cli.EXIT_INPUT
    assert 'python -m pip install -e ".[genomics]"' in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_demo_command(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["demo", "--kind", "genomics", "g.vcz", "--samples", "20", "--variants", "40", "--variant-chunk", "16", "--seed", "2"]
    assert cli.main(argv) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith("wrote g.vcz")
    ds = pipeline.open_dataset(tmp_path / "g.vcz", backend="cpu")
    assert dict(ds["call_genotype"].sizes) == {"variants": 40, "samples": 20, "ploidy": 2}
    assert ds["call_genotype"].data.chunks[0] == (16, 16, 8)
    # the climate demo stays the default, and each kind refuses the other's options
    assert cli.main(["demo", str(tmp_path / "c.zarr"), "--samples", "10"]) == cli.EXIT_INPUT
    assert cli.main(["demo", "--kind", "genomics", str(tmp_path / "x.vcz"), "--size", "1MB"]) == cli.EXIT_INPUT
    assert "--size: not an option of the genomics demo" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["g.vcz"]


# --- VCF files --------------------------------------------------------------------------------------------

HEADER = """##fileformat=VCFv4.3
##contig=<ID=chr1,length=5000>
##contig=<ID=chr2,length=4000>
##FILTER=<ID=PASS,Description="All filters passed">
##FILTER=<ID=q10,Description="Quality below 10">
##INFO=<ID=DP,Number=1,Type=Integer,Description="Total depth">
##INFO=<ID=AF,Number=A,Type=Float,Description="Allele frequency">
##FORMAT=<ID=GT,Number=1,Type=String,Description="Genotype">
##FORMAT=<ID=DP,Number=1,Type=Integer,Description="Read depth">
#CHROM	POS	ID	REF	ALT	QUAL	FILTER	INFO	FORMAT	NA1	NA2	NA3
"""
RECORDS = {
    "chr1": [
        "chr1	100	rs1	A	G	50	PASS	DP=30;AF=0.5	GT:DP	0/1:10	1|1:12	./.:.",
        "chr1	250	.	C	T,G	.	q10	DP=12;AF=0.25,0.1	GT:DP	1/2:4	0/0:.	./1:3",
        "chr1	900	rs3	TA	T	99.5	PASS	.	GT:DP	0|0:20	0|1:18	1|0:25",
    ],
    "chr2": [
        "chr2	5	.	G	A	12	PASS	DP=8	GT:DP	0/0:2	0/1:3	1/1:3",
        "chr2	3000	rs5	T	C	.	.	.	GT	./.	0/0	0/1",
    ],
}


def _cyvcf2_reads(path) -> dict:
    """The VCF as cyvcf2 reads it (the reference): positions, alleles, genotypes, depths."""
    import cyvcf2

    out = {"pos": [], "alleles": [], "gt": [], "dp": [], "contig": [], "id": []}
    vcf = cyvcf2.VCF(str(path))
    out["samples"] = list(vcf.samples)
    for v in vcf:
        out["pos"].append(v.POS)
        out["contig"].append(v.CHROM)
        out["alleles"].append([v.REF, *v.ALT])
        out["id"].append(v.ID or ".")
        out["gt"].append([g[:2] for g in v.genotypes])
        dp = v.format("DP")
        out["dp"].append([-1] * 3 if dp is None else [int(d) if d >= 0 else -1 for d in dp[:, 0]])
    vcf.close()
    return out


def _check_against_cyvcf2(store, vcf) -> None:
    ref = _cyvcf2_reads(vcf)
    ds = pipeline.open_dataset(store, backend="cpu")
    assert store_format(store) == "vcf-zarr"
    assert list(ds["sample_id"].values) == ref["samples"]
    np.testing.assert_array_equal(ds["variant_position"].values, ref["pos"])
    contigs = list(ds["contig_id"].values)
    assert [contigs[i] for i in ds["variant_contig"].values] == ref["contig"]
    assert list(ds["variant_id"].values) == ref["id"]
    alleles = ds["variant_allele"].values
    for row, expected in zip(alleles, ref["alleles"]):
        assert [a for a in row if a != ""] == expected
    g = ds["call_genotype"]
    assert g.dtype == np.int8
    np.testing.assert_array_equal(g.values, np.array(ref["gt"], dtype=np.int8))
    np.testing.assert_array_equal(ds["call_genotype_mask"].values, g.values < 0)
    np.testing.assert_array_equal(ds["call_DP"].values, ref["dp"])
    assert ds["call_DP"].dtype.kind == "i" and ds["variant_quality"].dtype == np.float32
    quality = ds["variant_quality"].values
    assert quality[0] == 50 and np.isnan(quality[1])
    bits = quality.view(np.uint32)[1]
    assert bits == 0x7F800001  # the spec's missing float, kept as stored (not a CF NaN)


def test_import_plain_vcf(tmp_path):
    vcf = tmp_path / "one.vcf"
    vcf.write_text(HEADER + "\n".join(RECORDS["chr1"]) + "\n")
    out = import_vcf(vcf, tmp_path / "one.vcz", variant_chunk=2, sample_chunk=2)
    _check_against_cyvcf2(out, vcf)
    assert pipeline.open_dataset(out, backend="cpu")["call_genotype"].data.chunks[:2] == ((2, 1), (2, 1))
    assert json.loads((out / ".pipeline.json").read_text())["kind"] == "vcf-import"
    assert sorted(os.listdir(tmp_path)) == ["one.vcf", "one.vcz"]  # the intermediate copy is gone


def _bgzip_and_index(text: str, path: Path) -> Path:
    """``text`` written bgzipped by htslib (through cyvcf2's writer) and indexed by htslib's tabix
    (through the library cyvcf2 carries): what ``bgzip`` and ``tabix -p vcf`` make."""
    import cyvcf2
    import cyvcf2.cyvcf2 as ext

    lines = text.splitlines()
    header = "\n".join(line for line in lines if line.startswith("#")) + "\n"
    w = cyvcf2.Writer.from_string(str(path), header, mode="wz")
    for line in lines:
        if not line.startswith("#"):
            w.write_record(w.variant_from_string(line))
    w.close()
    lib = ctypes.CDLL(ext.__file__)
    try:
        conf = ctypes.c_int.in_dll(lib, "tbx_conf_vcf")
        build = lib.tbx_index_build
    except (AttributeError, ValueError):
        pytest.skip("this cyvcf2 does not export htslib's tabix")
    build.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
    assert build(str(path).encode(), 0, ctypes.addressof(conf)) == 0
    assert Path(f"{path}.tbi").exists()
    return path


@pytest.mark.parametrize("fmt", [2, 3])
def test_import_bgzipped_indexed_vcf_of_two_contigs(tmp_path, fmt):
    vcf = _bgzip_and_index(HEADER + "\n".join(RECORDS["chr1"] + RECORDS["chr2"]) + "\n", tmp_path / "two.vcf.gz")
    r = cli.main(["import-vcf", str(vcf), str(tmp_path / "two.vcz"), "--zarr-format", str(fmt), "--variant-chunk", "3"])
    assert r == cli.EXIT_OK
    _check_against_cyvcf2(tmp_path / "two.vcz", vcf)
    assert (tmp_path / "two.vcz" / ("zarr.json" if fmt == 3 else ".zgroup")).exists()


def test_import_vcf_errors(tmp_path, capsys):
    assert cli.main(["import-vcf", str(tmp_path / "nope.vcf"), str(tmp_path / "a.vcz")]) == cli.EXIT_INPUT
    assert "nope.vcf: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.vcf"
    bad.write_text("not a VCF\n")
    assert cli.main(["import-vcf", str(bad), str(tmp_path / "a.vcz")]) == cli.EXIT_INPUT
    assert "bad.vcf: could not be converted to VCF Zarr" in capsys.readouterr().err
    two = tmp_path / "two.vcf"  # several contigs need an index
    two.write_text(HEADER + "\n".join(RECORDS["chr1"] + RECORDS["chr2"]) + "\n")
    with pytest.raises(InputError, match="two.vcf: could not be converted.*indexed"):
        import_vcf(two, tmp_path / "a.vcz")
    assert sorted(os.listdir(tmp_path)) == ["bad.vcf", "two.vcf"]  # nothing left behind



def test_import_vcf_refuses_a_link_at_its_lock_path(tmp_path, capsys):
    """The lock beside the output is opened without following links: a link there to a user's file
    is refused (exit 2) and the file keeps its bytes; nothing is written."""
    vcf = tmp_path / "one.vcf"
    vcf.write_text(HEADER + "\n".join(RECORDS["chr1"]) + "\n")
    precious = tmp_path / "precious.txt"
    precious.write_text("do not touch")
    (tmp_path / ".one.vcz.lock").symlink_to(precious)
    assert cli.main(["import-vcf", str(vcf), str(tmp_path / "one.vcz")]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert ".one.vcz.lock" in err and "symbolic link" in err, err
    assert precious.read_text() == "do not touch"
    assert sorted(os.listdir(tmp_path)) == [".one.vcz.lock", "one.vcf", "precious.txt"]

# --- on the GPU -------------------------------------------------------------------------------------------


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("store", ["demo2", "demo3", "sgkit"])
def test_gpu_reads_vcf_zarr_as_the_cpu(demo_stores, store):
    """On the GPU, numbers and booleans are CuPy arrays equal to the CPU's, those stored as they
    are read by pipeline's reader (bio2zarr's Blosc zstd with bit shuffle decoded by nvCOMP), in
    blocks of whole stored chunks along variants; strings stay on the host."""
    import cupy as cp

    from pipeline.gpu.nvcomp import nvcomp_available

    path = SGKIT_STORE if store == "sgkit" else demo_stores[int(store[-1])]
    cpu = pipeline.open_dataset(path, backend="cpu")
    gpu = pipeline.open_dataset(path, backend="gpu")
    stored = _zarr_arrays(path)
    for name, var in cpu.data_vars.items():
        got = gpu[name]
        assert got.dtype == var.dtype and got.dims == var.dims, name
        if var.dtype.kind in "biuf":
            assert isinstance(got.data._meta, cp.ndarray), name
            np.testing.assert_array_equal(cp.asnumpy(got.data.compute()), var.values, err_msg=name)
        else:
            assert isinstance(got.data._meta, np.ndarray), name
            assert got.values.tolist() == var.values.tolist(), name
    g = gpu["call_genotype"].data
    assert all(c % stored["call_genotype"].chunks[0] == 0 for c in g.chunks[0][:-1])
    assert g.chunks[1] == cpu["call_genotype"].data.chunks[1]  # samples keep their stored chunks
    sources = [s for s in g.dask.values() if isinstance(s, (reader.GpuSource, reader.StagedSource))]
    assert sources and all(isinstance(s, reader.GpuSource) for s in sources) == nvcomp_available()


@requires_gpu
@pytest.mark.gpu
def test_opening_a_store_does_not_prepare_numba_cuda(demo_stores, monkeypatch, tmp_path):
    """Opening a store loads no numba.cuda, on either backend: the counting statistics of VCF Zarr
    on the GPU are CUDA C; the ops that run Numba CUDA kernels start loading it as they build their
    graphs (kernels.get)."""
    from pipeline.demo import write_demo
    from pipeline.kernels import launch

    prepared = []
    monkeypatch.setattr(launch, "prepare_numba_cuda", lambda: prepared.append(1))
    pipeline.open_dataset(demo_stores[2], backend="cpu")
    write_demo(tmp_path / "climate.zarr", "1MB", seed=0)
    pipeline.open_dataset(tmp_path / "climate.zarr", backend="gpu")
    assert prepared == []
    pipeline.open_dataset(demo_stores[2], backend="gpu")
    assert prepared == []
