"""The GPU reader's layout of a Zarr array, from zarr-python's metadata: for stores written by
zarr, numcodecs and xarray, equal field by field to what the reader's former hand parser of
zarr.json / .zarray gave (copied below as the reference), and refused in the same cases."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from numcodecs import blosc as nc_blosc
from zarr.codecs import (BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec,
                         ZstdCodec)

from pipeline.errors import UnsupportedLayout
from pipeline.gpu import reader
from pipeline.gpu.reader import Layout

from .conftest import requires_gpu

# --- the former hand parser, the reference ---------------------------------------------------------------


def _fill(value, dtype: np.dtype):
    if value is None:
        return 0
    if isinstance(value, str):
        named = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
        if value in named and dtype.kind == "f":
            return named[value]
        raise UnsupportedLayout(f"fill value {value!r}")
    return value


def _bytes_codec_ok(codec: dict, dtype: np.dtype) -> None:
    endian = (codec.get("configuration") or {}).get("endian", "little")
    if dtype.itemsize > 1 and endian != "little":
        raise UnsupportedLayout(f"{endian}-endian values")


def _chain(codecs: list[dict], dtype: np.dtype) -> tuple[str, bool]:
    """(codec, trailing crc32c) of a plain chain: bytes, then zstd or blosc, and/or crc32c."""
    names = [c["name"] for c in codecs]
    if not names or names[0] != "bytes":
        raise UnsupportedLayout(f"codecs {names}")
    _bytes_codec_ok(codecs[0], dtype)
    rest = names[1:]
    crc = bool(rest) and rest[-1] == "crc32c"
    if crc:
        rest = rest[:-1]
    if rest not in ([], ["zstd"], ["blosc"]):
        raise UnsupportedLayout(f"codecs {names}")
    return (rest[0] if rest else "none"), crc


def _layout_by_hand(array_dir) -> Layout:
    """The layout as the reader parsed it before, from the JSON of zarr.json / .zarray."""
    root = Path(array_dir)
    if (root / "zarr.json").exists():
        meta = json.loads((root / "zarr.json").read_text())
        if meta.get("node_type") != "array":
            raise UnsupportedLayout(f"{root} is not an array")
        if meta.get("storage_transformers"):
            raise UnsupportedLayout("storage transformers")
        try:
            dtype = np.dtype(meta["data_type"])
        except TypeError as e:
            raise UnsupportedLayout(f"data type {meta['data_type']!r}") from e
        grid = meta["chunk_grid"]
        if grid.get("name") != "regular":
            raise UnsupportedLayout(f"chunk grid {grid.get('name')!r}")
        chunk = tuple(grid["configuration"]["chunk_shape"])
        cke = meta.get("chunk_key_encoding", {"name": "default"})
        sep = (cke.get("configuration") or {}).get("separator")
        prefix, sep = ("c", sep or "/") if cke["name"] == "default" else ("", sep or ".")
        codecs = meta["codecs"]
        common = dict(
            root=str(root), shape=tuple(meta["shape"]), dtype=dtype, chunk=chunk,
            fill_value=_fill(meta.get("fill_value"), dtype), key_prefix=prefix, separator=sep,
        )
        if len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
            cfg = codecs[0]["configuration"]
            inner = tuple(cfg["chunk_shape"])
            if any(c % i for c, i in zip(chunk, inner)):
                raise UnsupportedLayout("inner chunks that do not divide the shard")
            codec, crc = _chain(cfg["codecs"], dtype)
            index_codecs = [c["name"] for c in cfg.get("index_codecs", [{"name": "bytes"}, {"name": "crc32c"}])]
            if index_codecs not in (["bytes"], ["bytes", "crc32c"]):
                raise UnsupportedLayout(f"shard index codecs {index_codecs}")
            return Layout(
                **common, inner=inner, codec=codec, frame_crc=crc, sharded=True,
                index_at_end=cfg.get("index_location", "end") == "end", index_crc=len(index_codecs) == 2,
            )
        codec, crc = _chain(codecs, dtype)
        return Layout(**common, inner=chunk, codec=codec, frame_crc=crc, sharded=False)
    if (root / ".zarray").exists():
        meta = json.loads((root / ".zarray").read_text())
        dtype = np.dtype(meta["dtype"])
        if dtype.byteorder == ">" or meta.get("order", "C") != "C" or meta.get("filters"):
            raise UnsupportedLayout("big-endian, Fortran-ordered or filtered v2 data")
        comp = meta.get("compressor")
        if comp is not None and comp.get("id") not in ("zstd", "blosc"):
            raise UnsupportedLayout(f"compressor {comp.get('id')!r}")
        chunk = tuple(meta["chunks"])
        return Layout(
            root=str(root), shape=tuple(meta["shape"]), dtype=dtype.newbyteorder("="), chunk=chunk, inner=chunk,
            codec=comp["id"] if comp else "none", frame_crc=False, sharded=False,
            fill_value=_fill(meta.get("fill_value"), dtype), separator=meta.get("dimension_separator", "."),
        )
    raise UnsupportedLayout(f"{root}: no zarr.json or .zarray")


# --- stores -----------------------------------------------------------------------------------------------

SHAPE = (5, 6)


def _zarr(kind: str, dtype="float32", fill=np.nan, **kwargs):
    return kind, dict(dtype=dtype, fill_value=fill, **kwargs)


def _blosc2(cname, shuffle):
    return dict(zarr_format=2, compressors=numcodecs.Blosc(cname, 5, shuffle))


def _sharded(index_codecs, index_location="end", codecs=(BytesCodec(), ZstdCodec())):
    return dict(chunks=(4, 6), serializer=ShardingCodec(chunk_shape=(2, 3), codecs=list(codecs), index_codecs=index_codecs,
                                                       index_location=index_location), compressors=None)


# name -> create_array arguments (chunks (2, 3) unless given); each read by both parsers
STORES = {
    "v3-zstd-nan": dict(),
    "v3-raw-f8-zero": dict(dtype="float64", fill_value=0.0, compressors=None),
    "v3-zstd-crc": dict(compressors=[ZstdCodec(level=3), Crc32cCodec()]),
    "v3-crc-only": dict(compressors=[Crc32cCodec()]),
    "v3-blosc": dict(compressors=BloscCodec(cname="lz4", shuffle="bitshuffle")),
    "v3-blosc-i1": dict(dtype="int8", fill_value=-1, compressors=BloscCodec(cname="zstd", shuffle="shuffle")),
    "v3-sharded": dict(shards=(4, 6)),
    "v3-sharded-frame-crc": dict(shards=(4, 6), compressors=[ZstdCodec(), Crc32cCodec()]),
    "v3-sharded-index-plain": _sharded([BytesCodec()]),
    "v3-sharded-index-start": _sharded([BytesCodec(), Crc32cCodec()], "start"),
    "v3-sharded-raw-u2": dict(shards=(4, 6), compressors=None, dtype="uint16", fill_value=65535),
    "v3-key-v2-dot": dict(chunk_key_encoding={"name": "v2", "separator": "."}),
    "v3-key-v2-slash": dict(chunk_key_encoding={"name": "v2", "separator": "/"}),
    "v3-key-default-dot": dict(chunk_key_encoding={"name": "default", "separator": "."}),
    "v3-bool": dict(dtype="bool", fill_value=True),
    "v3-i1-big-endian-bytes": dict(dtype="int8", fill_value=3, serializer=BytesCodec(endian="big")),
    "v2-zstd": dict(zarr_format=2, compressors=numcodecs.Zstd(level=1)),
    "v2-raw-none-fill": dict(zarr_format=2, compressors=None, fill_value=None),
    "v2-i1-none-fill": dict(zarr_format=2, dtype="int8", fill_value=None),
    "v2-u2-slash": dict(zarr_format=2, dtype="uint16", fill_value=7, chunk_key_encoding={"name": "v2", "separator": "/"}),
    "v2-bool": dict(zarr_format=2, dtype="bool", fill_value=False, compressors=None),
    "v2-f8-zero": dict(zarr_format=2, dtype="float64", fill_value=0),
    "v2-blosc-lz4-shuffle": _blosc2("lz4", nc_blosc.SHUFFLE),
    "v2-blosc-lz4-bitshuffle": _blosc2("lz4", nc_blosc.BITSHUFFLE),
    "v2-blosc-zstd-shuffle": _blosc2("zstd", nc_blosc.SHUFFLE),
    "v2-blosc-zstd-bitshuffle": _blosc2("zstd", nc_blosc.BITSHUFFLE),
}


def _create(tmp_path, **kwargs) -> Path:
    kwargs = {"dtype": "float32", "fill_value": np.nan, "chunks": (2, 3), **kwargs}
    arr = zarr.create_array(tmp_path / "s.zarr", name="x", shape=SHAPE, **kwargs)
    arr[:3] = np.arange(18).reshape(3, 6).astype(kwargs["dtype"])  # a chunk row left unwritten
    return tmp_path / "s.zarr" / "x"


def assert_same(new: Layout, old: Layout) -> None:
    for field in dataclasses.fields(Layout):
        a, b = getattr(new, field.name), getattr(old, field.name)
        if field.name == "fill_value":  # the same value once in the array's dtype (NaN bits included)
            assert np.array(a, new.dtype).tobytes() == np.array(b, old.dtype).tobytes(), (a, b)
        else:
            assert a == b and type(a) is type(b), (field.name, a, b)
    assert new.dtype.str == old.dtype.str


def _decodes_as_zarr(path: Path, lay: Layout) -> None:
    """The first chunk file, decoded with the layout, equals zarr's read of its values."""
    want = zarr.open_array(path, mode="r")[tuple(slice(0, c) for c in lay.chunk)]
    got = reader.decode_chunk_host(lay, (Path(lay.path((0,) * len(lay.shape)))).read_bytes())
    np.testing.assert_array_equal(got[tuple(slice(0, n) for n in want.shape)], want)


@pytest.mark.parametrize("name", list(STORES))
def test_layout_of_zarr_written_stores_equals_the_hand_parser(tmp_path, name):
    path = _create(tmp_path, **STORES[name])
    lay = reader.layout(path)
    assert_same(lay, _layout_by_hand(path))
    _decodes_as_zarr(path, lay)


@pytest.mark.parametrize("fmt", [2, 3])
def test_layout_of_xarray_written_stores_equals_the_hand_parser(tmp_path, fmt):
    ds = xr.Dataset({
        "tas": (("time", "lat"), np.linspace(250, 300, 30, dtype="float32").reshape(5, 6)),
        "count": (("time", "lat"), np.arange(30, dtype="uint16").reshape(5, 6)),
        "flag": (("time", "lat"), np.arange(30).reshape(5, 6) % 3 == 0),
        "z": (("time", "lat"), np.arange(30, dtype="float64").reshape(5, 6)),
    })
    enc = {"tas": {"chunks": (2, 3), "_FillValue": np.float32(np.nan)}, "count": {"chunks": (2, 6), "_FillValue": 9},
           "z": {"_FillValue": None}}
    store = tmp_path / "xr.zarr"
    ds.to_zarr(store, zarr_format=fmt, encoding=enc)
    for name in ("tas", "count", "flag", "z"):
        path = store / name
        lay = reader.layout(path)
        assert_same(lay, _layout_by_hand(path))
        _decodes_as_zarr(path, lay)


# --- refused --------------------------------------------------------------------------------------------


def _edit(path: Path, change) -> Path:
    """The array's zarr.json (or .zarray) as ``change`` leaves it: metadata zarr does not write."""
    meta_file = path / ("zarr.json" if (path / "zarr.json").exists() else ".zarray")
    meta = json.loads(meta_file.read_text())
    change(meta)
    meta_file.write_text(json.dumps(meta))
    return path


def _shard_cfg(meta) -> dict:
    return meta["codecs"][0]["configuration"]


REFUSED = {
    "v3-gzip": dict(compressors=GzipCodec()),
    "v3-blosc-then-zstd": dict(compressors=[BloscCodec(), ZstdCodec()]),
    "v3-zstd-crc-zstd": dict(compressors=[ZstdCodec(), Crc32cCodec(), ZstdCodec()]),
    "v3-transpose": dict(filters=[TransposeCodec(order=(1, 0))]),
    "v3-big-endian": dict(serializer=BytesCodec(endian="big")),
    "v3-big-endian-u2": dict(dtype="uint16", fill_value=0, serializer=BytesCodec(endian="big"), compressors=None),
    "v3-sharded-big-endian": dict(shards=(4, 6), serializer=BytesCodec(endian="big")),
    "v3-sharded-gzip": dict(shards=(4, 6), compressors=GzipCodec()),
    "v3-sharded-then-zstd": _sharded([BytesCodec(), Crc32cCodec()]) | dict(compressors=ZstdCodec()),
    "v3-sharded-transposed": dict(shards=(4, 6), filters=[TransposeCodec(order=(1, 0))]),
    "v3-nested-shards": dict(chunks=(4, 6), compressors=None, serializer=ShardingCodec(
        chunk_shape=(2, 6), codecs=[ShardingCodec(chunk_shape=(2, 3))])),
    "v2-big-endian": dict(zarr_format=2, dtype=">f4"),
    "v2-fortran": dict(zarr_format=2, order="F"),
    "v2-filters": dict(zarr_format=2, filters=[numcodecs.Delta(dtype="f4")]),
    "v2-gzip": dict(zarr_format=2, compressors=numcodecs.GZip()),
    "v2-lz4": dict(zarr_format=2, compressors=numcodecs.LZ4()),
}
EDITED = {  # metadata that zarr-python does not write, edited in: zarr refuses it, or the reader does
    "v3-rectilinear-grid": (dict(), lambda m: m.update(chunk_grid={"name": "rectilinear", "configuration": {
        "kind": "inline", "chunk_shapes": [[2, 2, 1], [3, 3]]}})),
    "v3-storage-transformer": (dict(), lambda m: m.update(storage_transformers=[{"name": "some_transformer"}])),
    "v3-unknown-codec": (dict(), lambda m: m["codecs"].append({"name": "some_codec"})),
    "v3-unknown-data-type": (dict(), lambda m: m.update(data_type="some_type")),
    "v3-string-fill": (dict(), lambda m: m.update(fill_value="some_string")),
    "v3-inner-not-dividing": (dict(shards=(4, 6)), lambda m: _shard_cfg(m).update(chunk_shape=[3, 3])),
    "v3-index-gzip": (dict(shards=(4, 6)), lambda m: _shard_cfg(m).update(
        index_codecs=[{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}])),
    "v3-index-crc-only": (dict(shards=(4, 6)), lambda m: _shard_cfg(m).update(index_codecs=[{"name": "crc32c"}])),
    "v3-group": (dict(), lambda m: m.update(node_type="group")),
    "v2-unknown-compressor": (dict(zarr_format=2), lambda m: m.update(compressor={"id": "some_compressor"})),
}


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
@pytest.mark.parametrize("name", list(REFUSED) + list(EDITED))
def test_refused_where_the_hand_parser_refused(tmp_path, name):
    if name in REFUSED:
        path = _create(tmp_path, **REFUSED[name])
    else:
        kwargs, change = EDITED[name]
        path = _edit(_create(tmp_path, **kwargs), change)
    with pytest.raises(UnsupportedLayout):
        _layout_by_hand(path)
    with pytest.raises(UnsupportedLayout):
        reader.layout(path)


def test_no_metadata_is_refused(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(UnsupportedLayout, match="no zarr.json or .zarray"):
        reader.layout(tmp_path / "x")


# --- where zarr's metadata corrects the hand parser ------------------------------------------------------


def test_big_endian_shard_index_is_refused(tmp_path):
    """The hand parser took a big-endian shard index for a little-endian one (wrong offsets)."""
    path = _create(tmp_path, **_sharded([BytesCodec(endian="big"), Crc32cCodec()]))
    assert _layout_by_hand(path).sharded
    with pytest.raises(UnsupportedLayout, match="big-endian shard index"):
        reader.layout(path)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:3], np.arange(18).reshape(3, 6))


def test_v3_datetime_data_type_is_refused(tmp_path):
    """The hand parser failed on zarr's structured data type names with a ValueError."""
    path = _create(tmp_path, dtype="datetime64[ns]", fill_value=np.datetime64("NaT"))
    with pytest.raises(ValueError):
        _layout_by_hand(path)
    with pytest.raises(UnsupportedLayout, match="numpy.datetime64"):
        reader.layout(path)


@pytest.mark.parametrize("dtype, fill", [("float32", "0x3f800000"), ("complex64", [1.0, 2.0]), ("float64", "-Infinity")])
def test_fill_value_is_zarrs(tmp_path, dtype, fill):
    """Fill values as zarr reads them where no chunk is stored: the hand parser refused a float's
    hexadecimal fill value and kept a complex one as a list."""
    path = _edit(_create(tmp_path, dtype=dtype, fill_value=0), lambda m: m.update(fill_value=fill))
    lay = reader.layout(path)
    unwritten = zarr.open_array(path, mode="r")[4:, :3]
    assert not (path / "c" / "2" / "0").exists()
    np.testing.assert_array_equal(np.full(unwritten.shape, lay.fill_value, dtype=lay.dtype), unwritten)
    assert np.asarray(lay.fill_value).dtype == np.dtype(dtype)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v3-sharded", "v3-blosc-i1", "v3-sharded-raw-u2", "v2-i1-none-fill", "v2-blosc-zstd-bitshuffle"])
def test_gpu_read_with_zarrs_layout_equals_zarr(tmp_path, name):
    """On the device, nvCOMP's read through the layout (a chunk row left unwritten: the fill value,
    now a NumPy scalar, fills it) equals zarr's own read."""
    import cupy as cp

    path = _create(tmp_path, **STORES[name])
    x = reader.open_array(path.parent, "x", nvcomp=True)
    assert reader.nvcomp_available(), "nvCOMP is not installed (the gpu extra installs it)"
    sources = [v for v in x.dask.values() if isinstance(v, (reader.GpuSource, reader.StagedSource))]
    assert sources and all(isinstance(s, reader.GpuSource) for s in sources)
    np.testing.assert_array_equal(cp.asnumpy(x.compute()), zarr.open_array(path, mode="r")[...])
