"""Blosc chunks: parsed and decoded bit for bit as numcodecs' Blosc (c-blosc) decodes them, on
every machine through the CPU twin; on a GPU, stores written by zarr, numcodecs and xarray read
through nvCOMP equal to xarray's own read."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import warnings

import dask
import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs import blosc as nc_blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec

from pipeline.errors import DecodeError, UnsupportedLayout
from pipeline.gpu import blosc, reader
from pipeline.kernels import shuffle

from .conftest import requires_gpu

CNAMES = ["lz4", "lz4hc", "zstd", "blosclz", "zlib"]
SHUFFLES = {"none": nc_blosc.NOSHUFFLE, "byte": nc_blosc.SHUFFLE, "bit": nc_blosc.BITSHUFFLE}


def _values(dtype, size, seed=0):
    """A random walk in steps of 1/8: compressible with or without shuffle, its low bytes less so
    than its high ones (some streams are stored raw)."""
    rng = np.random.default_rng(seed)
    x = np.round(np.cumsum(rng.standard_normal(size)) * 400) / 8
    return x.astype(dtype)


def _reference(enc) -> np.ndarray:
    return np.frombuffer(numcodecs.Blosc().decode(enc), dtype=np.uint8)


# --- the CPU twin, against numcodecs ----------------------------------------------------------------


@pytest.mark.parametrize("shuffle_name", list(SHUFFLES))
@pytest.mark.parametrize("cname", CNAMES)
def test_host_decode_is_bit_exact(cname, shuffle_name):
    """Every dtype, odd sizes (not multiples of the block size, of the type size, of 8 elements
    for bit shuffle), tiny (memcpyed) buffers, several block sizes, clevel 0 and 5."""
    seen = set()
    for dtype, size, blocksize, clevel in itertools.product(
        ["i1", "i2", "f4", "f8"], [1, 7, 31, 1000, 4099, 40001], [0, 256, 4096, 20000], [0, 5]
    ):
        x = _values(dtype, size, seed=size)
        enc = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=SHUFFLES[shuffle_name], blocksize=blocksize).encode(x)
        got = blosc.decode_chunk_host(enc)
        np.testing.assert_array_equal(got, _reference(enc), err_msg=f"{dtype} {size} {blocksize} {clevel}")
        chunk = blosc.parse(enc)
        seen.add(("memcpyed", chunk.memcpyed))
        seen.add(("raw", bool(chunk.streams[:, 4].any())))
        seen.add(("split", len(chunk.streams) > len(chunk.blocks)))
        seen.add(("leftover", chunk.blocks[-1, 1] != chunk.blocksize))
    # the cases that matter were all met; c-blosc splits blocks into streams for all but zstd
    assert {("memcpyed", True), ("memcpyed", False), ("leftover", True), ("raw", True)} <= seen
    if cname != "zstd":
        assert ("split", True) in seen


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=6000),
    repeat=st.integers(1, 8),
    typesize=st.sampled_from([1, 2, 3, 4, 8, 16, 17, 24]),
    cname=st.sampled_from(CNAMES),
    shuffle_mode=st.sampled_from(list(SHUFFLES.values())),
    blocksize=st.sampled_from([0, 128, 1000, 4096]),
    clevel=st.integers(0, 9),
)
def test_host_decode_any_bytes(data, repeat, typesize, cname, shuffle_mode, blocksize, clevel):
    buf = np.frombuffer(data * repeat, dtype=np.uint8)
    enc = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle_mode, blocksize=blocksize, typesize=typesize).encode(buf)
    np.testing.assert_array_equal(blosc.decode_chunk_host(enc), _reference(enc))


def test_parse_reads_the_header_as_c_blosc_does():
    x = _values("f4", 100_000)
    enc = numcodecs.Blosc().encode(x)  # numcodecs' defaults: lz4, clevel 5, byte shuffle
    chunk = blosc.parse(enc)
    nbytes, cbytes, blocksize = nc_blosc._cbuffer_sizes(enc)
    typesize, shuffle_flag, memcpyed = nc_blosc._cbuffer_metainfo(enc)
    assert (chunk.nbytes, chunk.blocksize, chunk.typesize) == (nbytes, blocksize, typesize) == (x.nbytes, blocksize, 4)
    assert chunk.compressor == nc_blosc.cbuffer_complib(enc).lower() == "lz4"
    assert chunk.shuffle == "byte" and shuffle_flag == nc_blosc.SHUFFLE and not chunk.memcpyed and not memcpyed
    # the streams tile the values' bytes and lie inside the chunk
    s = chunk.streams
    order = np.argsort(s[:, 2])
    assert s[order[0], 2] == 0 and (s[order[1:], 2] == (s[order, 2] + s[order, 3])[:-1]).all()
    assert s[:, 3].sum() == chunk.nbytes and (s[:, 0] + s[:, 1]).max() <= cbytes
    tiny = blosc.parse(numcodecs.Blosc().encode(np.arange(10, dtype="i2")))  # under 128 bytes: stored as is
    assert tiny.memcpyed and tiny.shuffle == "none" and tiny.streams.tolist() == [[16, 20, 0, 20, 1]]
    bits = blosc.parse(numcodecs.Blosc(cname="zstd", clevel=7, shuffle=nc_blosc.BITSHUFFLE).encode(np.zeros(5000, "i1")))
    assert (bits.compressor, bits.shuffle, bits.typesize) == ("zstd", "bit", 1)


def _mixed_chunks():
    """Chunks of every compressor, shuffle, dtype and several sizes (odd ones, leftover blocks,
    tiny memcpyed ones), as numcodecs writes them."""
    encs = []
    for dtype, size in [("f4", 40001), ("f8", 4099), ("i2", 1000), ("i1", 20000), ("f4", 7)]:
        x = _values(dtype, size, seed=size)
        for cname, name, clevel, blocksize in itertools.product(CNAMES, SHUFFLES, [0, 5], [0, 4096]):
            encs.append(numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=SHUFFLES[name], blocksize=blocksize).encode(x))
    return encs


def _laid_out(encs, gap=3):
    """The chunks one after another in one buffer, ``gap`` bytes apart: (buffer, offsets, sizes)."""
    sizes = np.array([len(e) for e in encs])
    offsets = np.cumsum(np.concatenate([[gap], sizes[:-1] + gap]))
    buffer = np.zeros(int(offsets[-1] + sizes[-1] + gap), np.uint8)
    for o, e in zip(offsets, encs):
        buffer[o:o + len(e)] = np.frombuffer(e, np.uint8)
    return buffer, offsets, sizes


def test_parse_many_equals_parse_chunk_by_chunk():
    """The batch parse gives :func:`blosc.parse`'s tables for every chunk it takes, and declines
    (None) a batch holding a chunk it does not take: memcpyed, or of a compressor nvCOMP lacks."""
    encs = _mixed_chunks()
    chunks = [blosc.parse(e) for e in encs]
    plain = [k for k, c in enumerate(chunks) if c.gpu and not c.memcpyed]
    assert 0 < len(plain) < len(encs)
    buffer, offsets, sizes = _laid_out([encs[k] for k in plain])
    got, want = blosc.parse_many(buffer, offsets, sizes), blosc.Batch.of([chunks[k] for k in plain])
    for field in ("nbytes", "typesize", "shuffle", "compressor", "streams", "blocks"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    # rows taken and put back together are the batch's
    parts = [got.take(0, 7), got.take(7, 8), got.take(8, len(got))]
    again = blosc.Batch.concat(parts)
    for field in ("nbytes", "streams", "blocks"):
        np.testing.assert_array_equal(getattr(again, field), getattr(got, field))
    for k in [k for k, c in enumerate(chunks) if not (c.gpu and not c.memcpyed)][:5]:
        assert blosc.parse_many(*_laid_out([encs[plain[0]], encs[k]])) is None


def test_parse_many_declines_what_parse_refuses():
    enc = bytearray(numcodecs.Blosc().encode(_values("f4", 5000)))
    buffer, offsets, sizes = _laid_out([bytes(enc)])
    assert blosc.parse_many(buffer, offsets, sizes) is not None
    for cut in (len(enc) - 1, 20):  # truncated: the header's size, or a stream, past the frame
        assert blosc.parse_many(buffer, offsets, np.array([cut])) is None
    bad = bytearray(enc)
    bad[16 + 4 * 0:16 + 4 * 1] = (len(enc) + 10).to_bytes(4, "little")  # a block starts past the end
    assert blosc.parse_many(*_laid_out([bytes(bad)])) is None
    with pytest.raises(DecodeError):
        blosc.parse(bytes(bad))


def test_device_plan_decodes_as_numcodecs():
    """The device's tables for a batch (:func:`blosc.device_plan`: every stream's place in the
    compressed bytes and in the output or the scratch buffer, the unshuffle units), followed on the
    host stream by stream with the CPU twins of nvCOMP and the kernels, give numcodecs' bytes for
    every chunk, whether parsed at once or one by one, in any order of places."""
    encs = [e for e in _mixed_chunks() if blosc.parse(e).gpu]
    by_size: dict = {}
    for e in encs:
        by_size.setdefault(blosc.parse(e).nbytes, []).append(e)
    for nbytes, group in by_size.items():
        buffer, offsets, sizes = _laid_out(group)
        batch = blosc.parse_many(buffer, offsets, sizes) or blosc.Batch.of([blosc.parse(e) for e in group])
        places = np.random.default_rng(nbytes).permutation(len(group))
        plan = blosc.device_plan(batch, offsets, places * nbytes, nbytes)
        flat = np.zeros(len(group) * nbytes, np.uint8)
        scratch = np.zeros(max(1, plan.scratch), np.uint8)
        for row, into, code in zip(plan.streams, plan.into_scratch, plan.algorithm):
            src, csize, dst, dsize, raw = row.tolist()
            piece = buffer[src:src + csize]
            target = scratch if into else flat
            target[dst:dst + dsize] = piece if raw else blosc._decompress(blosc.COMPRESSORS[code], piece, dsize)
        for mode, fn in (("byte", shuffle.byte_unshuffle_cpu), ("bit", shuffle.bit_unshuffle_cpu)):
            if mode in plan.units:
                fn(scratch, flat, plan.units[mode])
        for k, e in enumerate(group):
            np.testing.assert_array_equal(flat[places[k] * nbytes:(places[k] + 1) * nbytes], _reference(e), err_msg=str(blosc.parse(e)))


def test_malformed_chunks_raise_decode_error():
    enc = bytearray(numcodecs.Blosc(cname="lz4").encode(_values("f4", 5000)))
    cases = {
        "shorter than its 16-byte header": bytes(enc[:10]),
        "truncated": bytes(enc[:-7]),
        "format version 9": bytes([9]) + bytes(enc[1:]),
        "reserved flag": bytes(enc[:2]) + bytes([enc[2] | 0x08]) + bytes(enc[3:]),
        "unknown compressor": bytes(enc[:2]) + bytes([(enc[2] & 0x1F) | (6 << 5)]) + bytes(enc[3:]),
    }
    for message, blob in cases.items():
        with pytest.raises(DecodeError, match=message):
            blosc.decode_chunk_host(blob)
    # a stream size pointing beyond the chunk
    first = int.from_bytes(enc[16:20], "little")
    bad = enc.copy()
    bad[first:first + 4] = (len(enc) * 2).to_bytes(4, "little")
    with pytest.raises(DecodeError, match="stream"):
        blosc.parse(bytes(bad))
    # a corrupt stream body: the decoder's size check (or the library) refuses it
    body = enc.copy()
    body[first + 4:first + 40] = b"\xff" * 36
    with pytest.raises((DecodeError, RuntimeError)):
        blosc.decode_chunk_host(bytes(body))


# --- the NumPy unshuffles, against independent formulations ------------------------------------------


@pytest.mark.parametrize("typesize", [1, 2, 3, 4, 8, 17])
@pytest.mark.parametrize("nbytes", [0, 5, 64, 1000, 4103])
def test_numpy_unshuffles(typesize, nbytes):
    rng = np.random.default_rng(nbytes + typesize)
    x = rng.integers(0, 256, nbytes, dtype=np.uint8)
    # byte shuffle as numcodecs' Shuffle filter (HDF5's) writes the whole elements, then the
    # bytes left over as they are
    n = nbytes // typesize
    whole = np.frombuffer(numcodecs.Shuffle(elementsize=typesize).encode(x[:n * typesize]), dtype=np.uint8)
    shuffled = np.concatenate([whole, x[n * typesize:]])
    np.testing.assert_array_equal(shuffle.unshuffle_bytes_cpu(shuffled, typesize), x)
    # bit shuffle by its definition: row 8 j + k holds bit k of byte j of each element
    if n % 8 == 0:
        bits = np.unpackbits(x[:n * typesize].reshape(n, typesize, 1), axis=2, bitorder="little")  # (n, j, k)
        rows = np.packbits(bits.reshape(n, 8 * typesize).T, axis=1, bitorder="little").reshape(-1)
        packed = np.concatenate([rows, x[n * typesize:]])
    else:
        packed = x
    np.testing.assert_array_equal(shuffle.bit_unshuffle_unit(packed, typesize), x)


def test_unit_batches_place_each_unit():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 3000, dtype=np.uint8)
    units = np.array([[0, 2000, 1000, 4], [1000, 0, 800, 2], [1800, 1000, 1000, 8]], dtype=np.int64)
    dst = np.zeros(3000, dtype=np.uint8)
    shuffle.byte_unshuffle_cpu(src, dst, units)
    for s, d, n, t in units.tolist():
        np.testing.assert_array_equal(dst[d:d + n], shuffle.unshuffle_bytes_cpu(src[s:s + n], t))
    copied = shuffle.copy_units_cpu(src, np.zeros(3000, np.uint8), units)
    np.testing.assert_array_equal(copied[2000:3000], src[:1000])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_unshuffle_kernels_compile(tmp_path):
    from pipeline.kernels import launch

    src = tmp_path / "unshuffle.cu"
    src.write_text(launch.cuda_source("unshuffle.cu"))
    r = subprocess.run(["nvcc", "-c", "-arch=sm_90", "-std=c++17", str(src), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --- stores as the ecosystem writes them: layouts and the host twin ---------------------------------


SHAPE = (7, 36, 72)


def _climate(dtype="float32", seed=1):
    rng = np.random.default_rng(seed)
    t = np.arange(SHAPE[0])[:, None, None]
    values = 280 + 10 * np.sin(t / 3.0) + rng.standard_normal(SHAPE) * 3
    values[rng.random(SHAPE) < 0.05] = np.nan
    return values.astype(dtype)


def _genotypes(seed=2):
    rng = np.random.default_rng(seed)
    g = rng.choice(np.array([0, 1, -1], dtype=np.int8), size=SHAPE, p=[0.8, 0.18, 0.02])
    return g


# name -> (zarr_format, values, create_array keyword arguments)
STORES = {
    "v2-numcodecs-defaults": (2, _climate, dict(chunks=(2, 16, 40), compressors=numcodecs.Blosc())),
    "v2-era5-lz4-shuffle": (2, _climate, dict(chunks=(1, 36, 72), compressors=numcodecs.Blosc("lz4", 5, nc_blosc.SHUFFLE))),
    "v2-lz4hc": (2, _climate, dict(chunks=(3, 36, 72), compressors=numcodecs.Blosc("lz4hc", 9, nc_blosc.SHUFFLE))),
    "v2-zlib-bitshuffle": (2, _climate, dict(chunks=(3, 20, 72), compressors=numcodecs.Blosc("zlib", 4, nc_blosc.BITSHUFFLE))),
    "v2-genotypes-zstd-bitshuffle": (2, _genotypes, dict(chunks=(4, 10, 72), compressors=numcodecs.Blosc("zstd", 7, nc_blosc.BITSHUFFLE))),
    "v2-blosclz": (2, _climate, dict(chunks=(2, 36, 72), compressors=numcodecs.Blosc("blosclz", 5, nc_blosc.SHUFFLE))),
    "v3-defaults": (3, _climate, dict(chunks=(2, 16, 40), compressors=BloscCodec())),
    "v3-genotypes-zstd-bitshuffle": (3, _genotypes, dict(chunks=(4, 10, 72), compressors=BloscCodec(cname="zstd", clevel=7, shuffle="bitshuffle"))),
    "v3-blosc-crc": (3, _climate, dict(chunks=(2, 16, 40), compressors=[BloscCodec(), Crc32cCodec()])),
    "v3-sharded": (3, _climate, dict(shards=(2, 36, 72), chunks=(1, 12, 72), compressors=BloscCodec(cname="lz4"))),
}


def make_store(tmp_path, name):
    """The store ``name`` written by zarr itself, with a chunk of fill values left unwritten."""
    fmt, values_fn, kwargs = STORES[name]
    values = values_fn()
    fill = np.nan if values.dtype.kind == "f" else -2
    values[tuple(slice(0, c) for c in kwargs["chunks"])] = fill  # a whole (inner) chunk of fill: not written
    store = tmp_path / f"{name}.zarr"
    arr = zarr.create_array(store, name="x", shape=SHAPE, dtype=values.dtype, fill_value=fill, zarr_format=fmt,
                            dimension_names=None if fmt == 2 else ("time", "lat", "lon"), **kwargs)
    arr[...] = values
    if fmt == 2:
        arr.attrs["_ARRAY_DIMENSIONS"] = ["time", "lat", "lon"]
    zarr.consolidate_metadata(store)
    return store, values


@pytest.mark.parametrize("name", list(STORES))
def test_layout_and_host_decode_match_zarr(tmp_path, name):
    store, values = make_store(tmp_path, name)
    lay = reader.layout(store / "x")
    assert lay.codec == "blosc"
    arr = zarr.open_array(store, path="x", mode="r")
    missing = 0
    for coords in np.ndindex(*[-(-n // c) for n, c in zip(SHAPE, lay.chunk)]):
        region = tuple(slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, lay.chunk, SHAPE))
        try:
            blob = open(lay.path(coords), "rb").read()
        except FileNotFoundError:
            missing += 1
            continue
        chunk = reader.decode_chunk_host(lay, blob)
        np.testing.assert_array_equal(chunk[tuple(slice(0, r.stop - r.start) for r in region)], arr[region])
    assert missing >= 1 or lay.sharded


@pytest.mark.parametrize("name", ["v2-era5-lz4-shuffle", "v3-sharded", "v3-blosc-crc", "v2-blosclz"])
def test_files_headers_read_at_once_as_one_by_one(tmp_path, name):
    """The reader's headers of a segment of files read at once (``_arrived_many``), handed to the
    decode for any choice and order of files (``_frame_hosts``), are each frame's own header."""
    store, _ = make_store(tmp_path, name)
    lay = reader.layout(store / "x")
    paths = sorted(p for p in (store / "x").rglob("*") if p.is_file() and not p.name.startswith((".", "zarr.json")))
    blobs = [p.read_bytes() for p in paths]
    buffer, offsets, sizes = _laid_out(blobs, gap=5)
    arrived = reader._arrived_many(lay, buffer, list(zip(offsets.tolist(), sizes.tolist())))
    one_by_one = [reader._arrived(lay, np.frombuffer(b, np.uint8)) for b in blobs]
    rng = np.random.default_rng(0)
    for order in (np.arange(len(blobs)), rng.permutation(len(blobs)), np.arange(len(blobs))[::3]):
        got = reader._frame_hosts(lay, [(None, None, arrived[k]) for k in order])
        want = reader._frame_hosts(lay, [(None, None, one_by_one[k]) for k in order])
        as_batch = [blosc.Batch.of([h]) if isinstance(h, blosc.BloscChunk) else h for h in got + want]
        got_b, want_b = blosc.Batch.concat(as_batch[:len(got)]), blosc.Batch.concat(as_batch[len(got):])
        for field in ("nbytes", "typesize", "shuffle", "compressor", "streams", "blocks"):
            np.testing.assert_array_equal(getattr(got_b, field), getattr(want_b, field), err_msg=field)
    for a, b in zip(arrived, one_by_one):
        np.testing.assert_array_equal(a.offsets, b.offsets)
        np.testing.assert_array_equal(a.present, b.present)


def test_xarray_written_store(tmp_path):
    """A store written by xarray (Zarr v2, Blosc zstd with bit shuffle, and numcodecs' defaults)."""
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), _climate()), "gt": (("time", "lat", "lon"), _genotypes())})
    enc = {"tas": {"compressors": (numcodecs.Blosc(),), "chunks": (1, 36, 72)},
           "gt": {"compressors": (numcodecs.Blosc("zstd", 7, nc_blosc.BITSHUFFLE),), "chunks": (4, 18, 72)}}
    store = tmp_path / "xr.zarr"
    ds.to_zarr(store, zarr_format=2, encoding=enc)
    ref = xr.open_zarr(store).compute()
    for name in ("tas", "gt"):
        lay = reader.layout(store / name)
        assert lay.codec == "blosc"
        blob = open(lay.path((0, 0, 0)), "rb").read()
        c = lay.chunk
        np.testing.assert_array_equal(reader.decode_chunk_host(lay, blob), ref[name].values[:c[0], :c[1], :c[2]])


def test_blosc_with_filters_or_other_chains_goes_to_zarr(tmp_path):
    store = tmp_path / "f.zarr"
    zarr.create_array(store, name="x", shape=(4, 4), chunks=(2, 2), dtype="f4", zarr_format=2,
                      filters=[numcodecs.Delta(dtype="f4")], compressors=numcodecs.Blosc())
    with pytest.raises(UnsupportedLayout):
        reader.layout(store / "x")
    zarr.create_array(tmp_path / "b.zarr", name="x", shape=(4, 4), chunks=(2, 2), dtype="f4",
                      serializer=BytesCodec(endian="big"), compressors=BloscCodec())
    with pytest.raises(UnsupportedLayout):
        reader.layout(tmp_path / "b.zarr" / "x")


# --- on the GPU -----------------------------------------------------------------------------------------


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(STORES))
def test_gpu_reads_blosc_stores_as_xarray(tmp_path, name):
    """open_dataset on the GPU equals xarray.open_zarr exactly, through nvCOMP (not zarr), with
    the store's chunks and with blocks of several chunks (cut by the array's edges)."""
    from pipeline.sources import open_dataset

    store, _ = make_store(tmp_path, name)
    expected = xr.open_zarr(store)["x"].values
    lay = reader.layout(store / "x")
    x = reader.open_array(store, "x", nvcomp=True)
    assert all(isinstance(s, reader.GpuSource) for s in x.dask.values() if isinstance(s, (reader.GpuSource, reader.StagedSource)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for chunks in (None, {"time": 3 * lay.chunk[0], "lat": 2 * lay.chunk[1]}):
            got = open_dataset(store, backend="gpu", chunks=chunks)["x"]
            np.testing.assert_array_equal(got.data.compute().get(), expected)
    said = [w for w in caught if "nvCOMP does not decode" in str(w.message)]
    assert len(said) == (1 if name == "v2-blosclz" else 0), [str(w.message) for w in caught]
    assert not [w for w in caught if "could not decode a block" in str(w.message)]


@requires_gpu
@pytest.mark.gpu
def test_gpu_kernels_equal_their_numpy_twins():
    import cupy as cp

    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, 400_000, dtype=np.uint8)
    units, d = [], 0
    for k, (n, t) in enumerate([(4096, 4), (4093, 4), (1000, 3), (8 * 17 * 5 + 3, 17), (24, 8), (16, 1), (5, 8), (65536, 8), (777, 2)]):
        units.append([k * 40_000 + 3, d, n, t])  # odd source offsets: unaligned loads
        d += n + (k % 3)  # and destinations of any alignment
    units = np.array(units, dtype=np.int64)
    for gpu_fn, cpu_fn in ((shuffle.byte_unshuffle_gpu, shuffle.byte_unshuffle_cpu),
                           (shuffle.bit_unshuffle_gpu, shuffle.bit_unshuffle_cpu),
                           (shuffle.copy_units_gpu, shuffle.copy_units_cpu)):
        want = cpu_fn(src, np.zeros(d, np.uint8), units)
        got = gpu_fn(cp.asarray(src), cp.zeros(d, np.uint8), cp.asarray(units))
        np.testing.assert_array_equal(got.get(), want, err_msg=gpu_fn.__name__)
    x = rng.integers(0, 256, 4 * 1001 + 3, dtype=np.uint8)
    np.testing.assert_array_equal(shuffle.unshuffle_bytes_gpu(cp.asarray(x), 4).get(), shuffle.unshuffle_bytes_cpu(x, 4))


@requires_gpu
@pytest.mark.gpu
def test_gpu_batch_decode_of_mixed_chunks():
    """One batch of chunks of every compressor and shuffle (memcpyed, raw streams, leftovers)
    decodes bit for bit as numcodecs."""
    import cupy as cp

    from pipeline.gpu.streams import context

    x = _values("f4", 30_001, seed=9)
    encs = [numcodecs.Blosc(cname=c, clevel=lv, shuffle=s, blocksize=b).encode(x)
            for c, s, lv, b in itertools.product(["lz4", "lz4hc", "zstd", "zlib", "blosclz"], SHUFFLES.values(), [0, 5], [0, 4096])]
    starts = np.cumsum([0] + [len(e) for e in encs[:-1]])
    host = np.frombuffer(b"".join(encs), dtype=np.uint8)
    out = cp.zeros((len(encs), x.nbytes), dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with context() as ctx, ctx.stream:
            dev = cp.asarray(host)
            blosc.decode_frames("mixed", [host[s:s + len(e)] for s, e in zip(starts, encs)], dev, starts, out,
                                np.arange(len(encs)) * x.nbytes, x.nbytes)
    for k, e in enumerate(encs):
        np.testing.assert_array_equal(out[k].get(), _reference(e), err_msg=str(blosc.parse(e)))


def test_benchmark_smoke(tmp_path):
    """benchmarks/blosc_decode.py at a tiny size on the CPU, so that it cannot rot."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "blosc_decode.py"
    spec = importlib.util.spec_from_file_location("blosc_decode", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--steps", "3", "--grid", "20,30", "--threads", "1,2", "--repeat", "1", "--no-gpu",
                      "--workdir", str(tmp_path), "--json", str(tmp_path / "b.json")])
    assert out["chunks"] == 3 and out["decoded_bytes"] == 3 * 20 * 30 * 4
    assert all(s > 0 for s in out["cpu"].values()) and (tmp_path / "b.json").exists()
    lay = reader.layout(Path(out["store"]) / "t2m")
    assert lay.codec == "blosc" and blosc.parse(open(lay.path((0, 0, 0)), "rb").read()).compressor == "lz4"


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v2-era5-lz4-shuffle", "v2-blosclz", "v3-sharded", "v3-blosc-crc"])
def test_gpu_read_through_few_staging_buffers_equals_zarr(tmp_path, monkeypatch, name):
    """Files staged through two buffers of one file each, reused block after block: Blosc's
    headers (and a blosclz chunk's bytes, which the host decodes) are taken before a buffer is read
    into again."""
    store, _ = make_store(tmp_path, name)
    expected = xr.open_zarr(store)["x"].values
    monkeypatch.setattr(reader, "SEGMENT", 1)
    monkeypatch.setattr(reader, "DEPTH", 2)
    lay = reader.layout(store / "x")
    with dask.config.set({"pipeline.gpu.pinned-files": 0}), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # blosclz: decoded on the CPU, said once
        for chunks in (None, tuple(4 * c for c in lay.chunk)):
            got = reader.open_array(store, "x", chunks=chunks, nvcomp=True).compute()
            np.testing.assert_array_equal(got.get(), expected)
