"""NetCDF4/HDF5 chunks decoded on the GPU: layouts and chunk indexes read, and every chunk and block
decoded, exactly as h5py (HDF5 itself) reads files written by h5py and by xarray (on every machine,
through the CPU twins); the GPU read equal to xarray's own (on a GPU)."""

from __future__ import annotations

import math
import os
import warnings
import zlib

import h5py
import numpy as np
import pytest
import xarray as xr

from pipeline import backend as B
from pipeline.errors import DecodeError, InputError, UnsupportedLayout
from pipeline.gpu import hdf5
from pipeline.sources import open_dataset

from .conftest import requires_gpu

SHAPE = (7, 9, 11)
CHUNKS = (2, 4, 5)  # edge chunks cut along every axis
# name -> (dtype, create_dataset filter arguments)
H5PY = {
    "gzip1-shuffle-f4": ("f4", dict(compression="gzip", compression_opts=1, shuffle=True)),
    "gzip9-f8": ("f8", dict(compression="gzip", compression_opts=9)),
    "gzip4-shuffle-fletcher-f4": ("f4", dict(compression="gzip", compression_opts=4, shuffle=True, fletcher32=True)),
    "gzip6-shuffle-i2": ("i2", dict(compression="gzip", compression_opts=6, shuffle=True)),
    "gzip2-shuffle-f8": ("f8", dict(compression="gzip", compression_opts=2, shuffle=True)),
    "shuffle-only-i4": ("i4", dict(shuffle=True)),
    "fletcher-only-f4": ("f4", dict(fletcher32=True)),
    "unfiltered-f4": ("f4", dict()),
}


def _values(dtype, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        v = (280 + 10 * rng.standard_normal(shape)).astype(dtype)
        v[rng.random(shape) < 0.1] = np.nan
        return v
    return rng.integers(-3000, 3000, shape).astype(dtype)


def _fill(dtype):
    return np.nan if np.dtype(dtype).kind == "f" else -999


def write_h5py(path, name, holes=True):
    """A file written by h5py; with ``holes``, steps 4: are never written (unallocated chunks)."""
    dtype, kwargs = H5PY[name]
    values = _values(dtype)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=SHAPE, chunks=CHUNKS, dtype=dtype, fillvalue=_fill(dtype), **kwargs)
        if holes:
            d[:4] = values[:4]
        else:
            d[...] = values
    return path


def h5_read(path, name="x"):
    with h5py.File(path, "r") as f:
        return f[name][...]


def chunk_regions(lay):
    for idx in np.ndindex(*lay.offsets.shape):
        yield idx, tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(idx, lay.chunk, lay.shape))


def assert_chunks_match_h5py(path, name):
    """Every stored chunk, read from the file at the index's offset and decoded by the CPU twin,
    equals h5py's read of it; every chunk not stored holds the fill value."""
    lay = hdf5.layout(path, name)
    ref = h5_read(path, name)
    raw = open(path, "rb").read()
    stored = 0
    for idx, region in chunk_regions(lay):
        offset = int(lay.offsets[idx])
        if offset < 0:
            np.testing.assert_array_equal(ref[region], np.full(ref[region].shape, lay.fill_value, dtype=lay.dtype))
            continue
        chunk = hdf5.decode_chunk_host(lay, raw[offset:offset + int(lay.sizes[idx])], int(lay.masks[idx]))
        assert chunk.shape == lay.chunk
        cut = chunk[tuple(slice(0, r.stop - r.start) for r in region)]
        np.testing.assert_array_equal(cut.view(f"u{lay.dtype.itemsize}"), ref[region].view(f"u{lay.dtype.itemsize}"))
        stored += 1
    return lay, stored


def block_regions(lay, steps):
    """Aligned blocks of ``steps`` chunks along the first axis, whole along the others, and blocks
    of single chunks."""
    for t0 in range(0, lay.shape[0], steps * lay.chunk[0]):
        yield (slice(t0, min(t0 + steps * lay.chunk[0], lay.shape[0])),) + tuple(slice(0, n) for n in lay.shape[1:])
    for _, region in chunk_regions(lay):
        yield region


def assert_blocks_match_h5py(path, name, steps=2):
    lay = hdf5.layout(path, name)
    ref = h5_read(path, name)
    for region in block_regions(lay, steps):
        got = hdf5.read_block_host(lay, region)
        np.testing.assert_array_equal(got.view(f"u{lay.dtype.itemsize}"), ref[region].view(f"u{lay.dtype.itemsize}"))


# --- host side: layouts, chunks and blocks against h5py --------------------------------------------


@pytest.mark.parametrize("name", list(H5PY))
def test_chunks_and_blocks_of_h5py_files(tmp_path, name):
    path = write_h5py(tmp_path / f"{name}.h5", name)
    lay, stored = assert_chunks_match_h5py(path, "x")
    dtype, kwargs = H5PY[name]
    assert lay.shape == SHAPE and lay.chunk == CHUNKS and lay.dtype == np.dtype(dtype)
    assert ("deflate" in lay.filters) == ("compression" in kwargs)
    assert ("shuffle" in lay.filters) == kwargs.get("shuffle", False)
    assert ("fletcher32" in lay.filters) == kwargs.get("fletcher32", False)
    assert 0 < stored < lay.offsets.size  # some chunks never written
    assert_blocks_match_h5py(path, "x")


def _write_xarray(path, chunks=(2, 5, 6), fletcher32=False):
    """tas (float32 with NaN) and a packed int16 with scale_factor, add_offset and _FillValue, as
    xarray writes them through h5netcdf with zlib and shuffle."""
    tas = xr.DataArray(_values("f4", (9, 10, 12)), dims=("time", "lat", "lon"), attrs={"units": "K"})
    packed = np.round((np.nan_to_num(tas.values, nan=280) - 280) / 0.01).astype("i2")
    packed[0, :3, :3] = -32767
    ds = xr.Dataset({"tas": tas, "packed": (tas.dims, packed, {"scale_factor": np.float32(0.01), "add_offset": np.float32(280)})})
    enc = dict(zlib=True, complevel=4, shuffle=True, chunksizes=chunks, fletcher32=fletcher32)
    ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": enc, "packed": {**enc, "_FillValue": np.int16(-32767)}})
    return path


@pytest.mark.parametrize("fletcher32", [False, True])
def test_chunks_and_blocks_of_xarray_files(tmp_path, fletcher32):
    path = _write_xarray(tmp_path / "x.nc", fletcher32=fletcher32)
    for var in ("tas", "packed"):
        lay, stored = assert_chunks_match_h5py(path, var)
        assert lay.filters == ("shuffle", "deflate") + ("fletcher32",) * fletcher32
        assert stored == lay.offsets.size
        assert_blocks_match_h5py(path, var, steps=3)
    # the raw values are those xarray reads undecoded
    with xr.open_dataset(path, engine="h5netcdf", mask_and_scale=False) as ds:
        np.testing.assert_array_equal(hdf5.read_block_host(hdf5.layout(path, "packed"), tuple(slice(0, n) for n in ds["packed"].shape)), ds["packed"].values)


def test_chunk_stored_without_deflate(tmp_path):
    """A chunk whose deflate was skipped (filter mask bit 1: HDF5 does so where deflate would not
    shrink it) is stored shuffled but not compressed."""
    path = tmp_path / "mask.h5"
    values = _values("f4", (4, 6))
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(4, 6), chunks=(2, 6), dtype="f4", compression="gzip", shuffle=True)
        d[...] = values
        shuffled = np.frombuffer(values[2:].tobytes(), np.uint8).reshape(-1, 4).T.copy()  # HDF5's shuffle
        d.id.write_direct_chunk((2, 0), shuffled.tobytes(), filter_mask=0b10)
    lay = hdf5.layout(path, "x")
    assert lay.masks.tolist() == [[0], [2]]
    np.testing.assert_array_equal(h5_read(path), values)
    assert_chunks_match_h5py(path, "x")
    plan = hdf5.plan_block(lay, (slice(0, 4), slice(0, 6)))
    ops = hdf5.stream_ops(lay, plan, _staged(lay, plan))
    assert len(ops.inflate) == 1 and len(ops.copy) == 1 and len(ops.shuffled) == 2
    np.testing.assert_array_equal(hdf5.read_block_host(lay, (slice(0, 4), slice(0, 6))), values)


def _staged(lay, plan):
    staging = np.empty(max(1, plan.total), dtype=np.uint8)
    for run in plan.runs:
        for offset, segments in run.pieces():
            hdf5.read_segments(lay.path, offset, segments, staging)
    return staging


def test_unshuffle_host_leftover_bytes():
    """HDF5's shuffle of 10 bytes of 4-byte elements: two elements transposed, 2 bytes copied."""
    original = np.arange(10, dtype=np.uint8)
    stored = np.concatenate([original[:8].reshape(2, 4).T.ravel(), original[8:]])
    np.testing.assert_array_equal(hdf5.unshuffle_host(stored.tobytes(), 4), original)


@pytest.mark.parametrize("typesize", [2, 3, 4, 8])
def test_byte_unshuffle_into_equals_numcodecs(typesize):
    """The host's compiled unshuffle gives numcodecs' Shuffle decode, and the NumPy twin's with
    bytes left over."""
    import numcodecs

    from pipeline.kernels import shuffle

    data = np.random.default_rng(typesize).integers(0, 256, typesize * 100_003 + typesize - 1, dtype=np.uint8)
    whole = data[:typesize * 100_003]
    out = np.empty_like(whole)
    shuffle.byte_unshuffle_into(whole, out, typesize)
    np.testing.assert_array_equal(out, numcodecs.Shuffle(typesize).decode(whole))
    out = np.empty_like(data)
    shuffle.byte_unshuffle_into(data, out, typesize)
    np.testing.assert_array_equal(out, shuffle.byte_unshuffle_unit(data, typesize))


def test_contiguous_dataset(tmp_path):
    path = tmp_path / "contiguous.h5"
    values = _values("f8", (6, 5, 4))
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values)
        f.create_dataset("empty", shape=(3, 2), dtype="f4", fillvalue=-1.5)
    lay = hdf5.layout(path, "x")
    assert lay.contiguous and lay.chunk == (1, 5, 4) and lay.filters == ()
    plan = hdf5.plan_block(lay, (slice(2, 5), slice(0, 5), slice(0, 4)))
    assert plan.direct and len(plan.runs) == 1
    ops = hdf5.stream_ops(lay, plan, _staged(lay, plan))
    assert len(hdf5.merged(ops.copy)) == 1  # the rows cross in one copy
    np.testing.assert_array_equal(hdf5.read_block_host(lay, (slice(2, 5), slice(0, 5), slice(0, 4))), values[2:5])
    empty = hdf5.layout(path, "empty")
    np.testing.assert_array_equal(hdf5.read_block_host(empty, (slice(0, 3), slice(0, 2))), np.full((3, 2), -1.5, "f4"))


def test_reads_coalesce_adjacent_chunks(tmp_path, monkeypatch):
    """Chunks next to each other in the file (or a small gap apart) are read by one scatter read;
    each lands where its deflate data (after a 2-byte zlib header) start aligned for nvCOMP."""
    offsets, sizes, heads = np.array([100, 0, 60, 10_000_000]), np.array([40, 60, 40, 8]), np.array([2, 2, 2, 0])
    runs, staged = hdf5._runs(offsets, sizes, heads)
    assert [(r.offset, r.nbytes) for r in runs] == [(0, 140), (10_000_000, 8)]
    assert ((staged + heads) % hdf5.ALIGN == 0).all()
    order = np.argsort(staged)
    assert (staged[order][1:] >= (staged + sizes)[order][:-1]).all()  # no overlap
    runs, _ = hdf5._runs(np.array([0, 1000]), np.array([100, 50]), np.array([0, 0]))
    assert [(r.offset, r.nbytes) for r in runs] == [(0, 1050)] and runs[0].segments[1] == (900, -1)
    # the scatter read puts every chunk's bytes in its place, in pieces of PIECE bytes at most
    blob = np.random.default_rng(1).integers(0, 256, 2000, dtype=np.uint8)
    (tmp_path / "f").write_bytes(blob.tobytes())
    monkeypatch.setattr(hdf5, "PIECE", 64)
    offsets, sizes = np.array([0, 150, 300, 1700]), np.array([150, 150, 1000, 300])
    runs, staged = hdf5._runs(offsets, sizes, np.array([2, 0, 2, 2]))
    buffer = np.zeros(runs[-1].end, dtype=np.uint8)
    for run in runs:
        pieces = run.pieces()
        assert all(sum(n for n, _ in segs) <= 64 for _, segs in pieces)
        for offset, segs in pieces:
            hdf5.read_segments(str(tmp_path / "f"), offset, segs, buffer)
    for o, n, at in zip(offsets, sizes, staged):
        np.testing.assert_array_equal(buffer[at:at + n], blob[o:o + n])


@pytest.mark.parametrize("kind", ["lzf", "scaleoffset", "big-endian", "string", "compound", "shuffle-after-deflate"])
def test_unsupported_layouts(tmp_path, kind):
    path = tmp_path / f"{kind}.h5"
    with h5py.File(path, "w") as f:
        if kind == "lzf":
            f.create_dataset("x", data=np.ones((4, 4), "f4"), chunks=(2, 2), compression="lzf")
        elif kind == "scaleoffset":
            f.create_dataset("x", data=np.ones((4, 4), "i4"), chunks=(2, 2), scaleoffset=0)
        elif kind == "big-endian":
            f.create_dataset("x", data=np.ones((4, 4), ">f4"), chunks=(2, 2), compression="gzip")
        elif kind == "string":
            f.create_dataset("x", data=np.array([b"ab", b"cd"]))
        elif kind == "compound":
            f.create_dataset("x", data=np.zeros(3, dtype=[("a", "f4"), ("b", "i2")]))
        else:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk((2, 2))
            dcpl.set_deflate(4)
            dcpl.set_shuffle()
            space = h5py.h5s.create_simple((4, 4))
            h5py.h5d.create(f.id, b"x", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
    with pytest.raises(UnsupportedLayout):
        hdf5.layout(path, "x")


def test_corrupt_chunks_raise_decode_error(tmp_path):
    path = write_h5py(tmp_path / "f.h5", "gzip4-shuffle-fletcher-f4", holes=False)
    lay = hdf5.layout(path, "x")
    offset, size = int(lay.offsets[0, 0, 0]), int(lay.sizes[0, 0, 0])
    blob = bytearray(open(path, "rb").read()[offset:offset + size])
    blob[size // 2] ^= 0xFF
    with pytest.raises(DecodeError, match="fletcher32"):
        hdf5.decode_chunk_host(lay, bytes(blob))
    with open(path, "r+b") as f:  # the same damage in the file: the block read refuses it too
        f.seek(offset + size // 2)
        f.write(bytes([blob[size // 2]]))
    hdf5._layout_at.cache_clear()
    with pytest.raises(DecodeError, match="fletcher32"):
        hdf5.read_block_host(hdf5.layout(path, "x"), (slice(0, 2), slice(0, 4), slice(0, 5)))
    with pytest.raises(DecodeError, match="zlib"):
        hdf5.check_zlib_header(b"\x78\x9d", "x")  # check bits wrong


@pytest.mark.parametrize("libz", [True, False], ids=["libz-uncompress", "zlib-module"])
def test_inflate_into_a_buffer_checks_the_stream(monkeypatch, libz):
    """A zlib stream inflated into its chunk's place, through zlib's ``uncompress`` or, where that
    library is not found, the zlib module: equal to zlib, and a damaged checksum, a stream cut
    short, and a chunk of another size are DecodeErrors naming the file."""
    if not libz:
        monkeypatch.setattr(hdf5, "_libz_uncompress", lambda: None)
    elif hdf5._libz_uncompress() is None:
        pytest.skip("zlib's library not found")
    raw = np.random.default_rng(3).integers(0, 40, 50_000, dtype=np.uint8)
    stream = np.frombuffer(zlib.compress(raw.tobytes(), 4), dtype=np.uint8)
    out = np.empty_like(raw)
    hdf5._inflate_into(stream, out, "f.nc")
    np.testing.assert_array_equal(out, raw)
    out[...] = 0
    hdf5._inflate_into(stream.tobytes(), out, "f.nc")  # bytes as well as arrays
    np.testing.assert_array_equal(out, raw)
    shuffled = raw[:50_000].reshape(4, -1).T.reshape(-1).copy()  # four bytes a value, planes stored
    plain = np.empty_like(raw)
    hdf5._inflate_into(np.frombuffer(zlib.compress(raw.tobytes()), np.uint8), plain, "f.nc", typesize=4)
    np.testing.assert_array_equal(plain, shuffled)
    monkeypatch.setattr(hdf5, "SCRATCH_BYTES", 1000)  # a chunk larger than a thread keeps: a temporary
    plain[...] = 0
    hdf5._inflate_into(np.frombuffer(zlib.compress(raw.tobytes()), np.uint8), plain, "f.nc", typesize=4)
    np.testing.assert_array_equal(plain, shuffled)
    damaged = stream.copy()
    damaged[-1] ^= 0xFF  # the adler32 trailer
    for bad, n in ((damaged, len(raw)), (stream[:len(stream) // 2], len(raw)), (stream, len(raw) - 1),
                   (stream, len(raw) + 1)):
        with pytest.raises(DecodeError, match="f.nc"):
            hdf5._inflate_into(bad, np.empty(n, np.uint8), "f.nc")


@pytest.mark.parametrize("name", ["gzip1-shuffle-f4", "gzip6-shuffle-i2"])
def test_adler32_of_the_inflated_bytes(tmp_path, name):
    """The checksum that nvCOMP does not check, computed over a block's inflated chunks (before
    their shuffle is undone) as zlib computes it; a damaged trailer is refused."""
    path = write_h5py(tmp_path / "f.h5", name, holes=False)
    lay = hdf5.layout(path, "x")
    for region in block_regions(lay, 2):
        plan = hdf5.plan_block(lay, region)
        staging = _staged(lay, plan)
        ops = hdf5.stream_ops(lay, plan, staging)
        dst = np.zeros(max(1, plan.scratch_bytes(lay)) if not plan.direct else int(np.prod(plan.shape)) * lay.dtype.itemsize, np.uint8)
        for s, n, d in ops.inflate:
            dst[d:d + lay.chunk_nbytes] = np.frombuffer(zlib.decompress(staging[s:s + n].tobytes()), np.uint8)
        want = [zlib.adler32(dst[d:d + lay.chunk_nbytes].tobytes()) for _, _, d in ops.inflate]
        got = hdf5.adler32_from_sums(hdf5.adler_sums(np, lay, plan, ops, dst), lay, ops)
        assert got.tolist() == want == hdf5.adler32_expected(lay, ops, staging).tolist()
    offset, size = int(lay.offsets[0, 0, 0]), int(lay.sizes[0, 0, 0])
    with open(path, "r+b") as f:  # the trailer damaged: the data inflate, their checksum does not match
        f.seek(offset + size - 1)
        last = f.read(1)
        f.seek(offset + size - 1)
        f.write(bytes([last[0] ^ 1]))
    hdf5._layout_at.cache_clear()
    with pytest.raises(DecodeError, match="adler32"):
        hdf5.read_block_host(hdf5.layout(path, "x"), (slice(0, 2), slice(0, 4), slice(0, 5)))


def test_layout_follows_a_rewritten_file(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((4, 4), "f4"), chunks=(2, 2), compression="gzip")
    assert hdf5.layout(path, "x").chunk == (2, 2)
    os.remove(path)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((4, 4), "f4"), chunks=(4, 1), compression="gzip")
    assert hdf5.layout(path, "x").chunk == (4, 1)


def test_block_chunks_group_steps_up_to_the_target(tmp_path):
    path = _write_xarray(tmp_path / "x.nc", chunks=(1, 10, 12))
    from pipeline.sources import blocks_along_first

    step = 10 * 12 * 4  # one chunk of tas (the largest variable)
    raw = xr.open_dataset(path, decode_cf=False)
    assert blocks_along_first(raw, {}, 0) == {}
    assert blocks_along_first(raw, {}, 3 * step + 1)["time"] == 3
    assert blocks_along_first(raw, {}, 100 * step)["time"] == 9
    assert blocks_along_first(raw, {}, 1)["time"] == 1


def test_block_chunks_grow_past_the_share_of_a_thread_where_blocks_are_fewer_than_threads(tmp_path):
    path = _write_xarray(tmp_path / "x.nc", chunks=(1, 10, 12))
    from pipeline.sources import blocks_along_first

    step = 10 * 12 * 4  # one chunk of tas; 9 steps
    raw = xr.open_dataset(path, decode_cf=False)
    # 4 threads may hold 12 steps together: 3 a thread, unless the array has fewer blocks than threads
    assert blocks_along_first(raw, {}, 100 * step, hold_bytes=12 * step, threads=4)["time"] == 9  # 1 block
    assert blocks_along_first(raw, {}, 5 * step, hold_bytes=12 * step, threads=4)["time"] == 5  # 2 blocks of 5
    # 8 steps together: blocks of 4 (3 blocks, 12 steps) or 3 (3 blocks, 9) do not fit; 5 blocks of 2 do
    assert blocks_along_first(raw, {}, 100 * step, hold_bytes=8 * step, threads=4)["time"] == 2
    # as many blocks as threads, or more: the share of a thread, as without hold_bytes
    assert blocks_along_first(raw, {}, 100 * step, hold_bytes=3 * step, threads=3)["time"] == 1
    assert blocks_along_first(raw, {}, 100 * step, hold_bytes=step, threads=4)["time"] == 1  # never less than a chunk


def test_block_chunks_share_evenly_between_the_workers_of_a_cluster(tmp_path):
    path = _write_xarray(tmp_path / "x.nc", chunks=(1, 10, 12))
    from pipeline.sources import blocks_along_first

    step = 10 * 12 * 4  # one chunk of tas; 9 steps
    raw = xr.open_dataset(path, decode_cf=False)
    assert blocks_along_first(raw, {}, 100 * step)["time"] == 9  # one worker: one block
    assert blocks_along_first(raw, {}, 100 * step, balance_for=(2,))["time"] == 5  # 5 + 4, not 9 + 0
    assert blocks_along_first(raw, {}, 100 * step, balance_for=(3,))["time"] == 3
    assert blocks_along_first(raw, {}, 100 * step, balance_for=(4,))["time"] == 3  # none reads more than 3 (5 blocks of 2: 4)
    assert blocks_along_first(raw, {}, 100 * step, balance_for=(2, 4))["time"] == 1  # 3 would leave 2 workers 6 + 3


@pytest.mark.parametrize("workers", [(2,), (3,), (4,), (2, 4)])
def test_balanced_fits_leave_the_slabs_of_locality_within_the_bound(workers):
    from pipeline.exec.locality import slab_ends
    from pipeline.sources import BALANCE, balanced_fits

    for count in range(1, 90):
        for fits in range(1, 16):
            k = balanced_fits(count, fits, workers)
            assert 1 <= k <= max(1, fits)

            def even(k):  # the most chunks in one worker's slab, as locality places the blocks
                n = math.ceil(count / k)
                sizes = [min(k, count - b * k) for b in range(n)]  # the last block may be cut short
                for w in workers:
                    ends = slab_ends(n, [1] * w, [0] * (n + 1))
                    if max(sum(sizes[a:b]) for a, b in zip([0] + ends[:-1], ends)) > BALANCE * math.ceil(count / w):
                        return False
                return True

            assert k == 1 or even(k), (count, fits, workers, k)
            assert not any(even(j) for j in range(k + 1, fits + 1)), (count, fits, workers, k)  # no larger would do


# --- on the GPU: open_dataset equal to xarray's own read -----------------------------------------


def _assert_same_as_xarray(path, **kwargs):
    ds = open_dataset(path, backend="gpu", **kwargs)
    with xr.open_dataset(path, engine="h5netcdf") as ref:
        for name, var in ds.data_vars.items():
            assert type(var.data._meta).__module__.startswith("cupy"), name
            got = B.to_numpy(var.data.compute())
            want = ref[name].values
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("fletcher32", [False, True])
@pytest.mark.parametrize("time_chunks", [None, {"time": 4}, {"time": 9}])
def test_gpu_open_dataset_of_xarray_files(tmp_path, fletcher32, time_chunks):
    path = _write_xarray(tmp_path / "x.nc", fletcher32=fletcher32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        _assert_same_as_xarray(path, chunks=time_chunks)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("name", list(H5PY))
def test_gpu_blocks_equal_their_cpu_twin(tmp_path, name):
    """read_block on the device, bit for bit the CPU twin's (h5py's) values: blocks of several
    chunks, edge chunks, unallocated chunks."""
    path = write_h5py(tmp_path / f"{name}.h5", name)
    lay = hdf5.layout(path, "x")
    ref = h5_read(path)
    for region in block_regions(lay, 2):
        got = B.to_numpy(hdf5.read_block(lay, region))
        np.testing.assert_array_equal(got.view(f"u{lay.dtype.itemsize}"), ref[region].view(f"u{lay.dtype.itemsize}"))


@pytest.mark.gpu
@requires_gpu
def test_gpu_host_inflate_of_large_chunks(tmp_path, monkeypatch):
    """Streams above the nvCOMP limit are inflated by the I/O threads; the shuffle is still undone
    on the device."""
    path = _write_xarray(tmp_path / "x.nc")
    monkeypatch.setattr(hdf5, "NVCOMP_MAX_FRAME", 16)
    assert hdf5.layout(path, "tas").host_inflate
    _assert_same_as_xarray(path, chunks={"time": 4})


@pytest.mark.gpu
@requires_gpu
def test_gpu_unsupported_filter_falls_back_with_one_warning(tmp_path):
    path = tmp_path / "lzf.nc"
    ds = xr.Dataset({"tas": (("time", "lat"), _values("f4", (8, 6)))})
    ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"compression": "lzf", "chunksizes": (2, 6)}})
    with pytest.warns(RuntimeWarning, match="lzf") as record:
        _assert_same_as_xarray(path)
    assert len([w for w in record if "GPU" in str(w.message)]) == 1


@pytest.mark.gpu
@requires_gpu
def test_gpu_contiguous_and_unallocated(tmp_path):
    path = tmp_path / "c.nc"
    ds = xr.Dataset({"tas": (("time", "lat"), _values("f4", (8, 6)))})
    ds.to_netcdf(path, engine="h5netcdf", encoding={"tas": {"contiguous": True}})
    _assert_same_as_xarray(path, chunks={"time": 3})
    path = tmp_path / "holes.nc"
    import h5netcdf

    with h5netcdf.File(path, "w") as f:  # a NetCDF4 file whose later steps were never written
        f.dimensions = dict(zip(("time", "lat", "lon"), SHAPE))
        var = f.create_variable("x", ("time", "lat", "lon"), "f4", chunks=CHUNKS, compression="gzip", shuffle=True, fillvalue=np.nan)
        var[:4] = _values("f4")[:4]
    assert (hdf5.layout(path, "x").offsets < 0).any()
    _assert_same_as_xarray(path)


@pytest.mark.gpu
@requires_gpu
def test_gpu_corrupt_chunk_names_the_variable(tmp_path):
    path = write_h5py(tmp_path / "f.h5", "gzip1-shuffle-f4", holes=False)
    lay = hdf5.layout(path, "x")
    offset, size = int(lay.offsets[1, 1, 1]), int(lay.sizes[1, 1, 1])
    with open(path, "r+b") as f:
        f.seek(offset + 2)
        f.write(b"\xff" * (size - 6))
    hdf5._layout_at.cache_clear()
    arr = hdf5.device_array(path, "x", chunks=CHUNKS)
    with pytest.warns(RuntimeWarning, match="could not be decoded on the GPU"), pytest.raises(InputError, match="'x'"):
        arr.compute()


def test_benchmark_smoke(tmp_path):
    """benchmarks/netcdf_decode.py at a tiny size: its file is written as asked and read back."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("netcdf_decode", Path(__file__).parent.parent / "benchmarks" / "netcdf_decode.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--steps", "5", "--ny", "6", "--nx", "8", "--chunk-steps", "2", "--repeat", "1", "--threads", "2",
                      "--workdir", str(tmp_path), "--json", str(tmp_path / "r.json")])
    (result,) = out["files"]
    lay = hdf5.layout(result["file"], "tas")
    assert lay.chunk == (2, 6, 8) and lay.filters == ("shuffle", "deflate") and lay.shape == (5, 6, 8)
    assert all(row["median_s"] > 0 for row in result["rows"].values())
    assert (tmp_path / "r.json").exists()


# --- adler32 sums (pipeline.kernels.checksum) ---------------------------------------------------


def test_adler_sums_give_zlibs_adler32():
    import zlib

    from pipeline.kernels import checksum

    rng = np.random.default_rng(3)
    for n in (1, 7, 5552, 70_000):
        rows = rng.integers(0, 256, (3, n), dtype=np.uint8)
        rows[1] = 255  # the largest sums
        got = checksum.adler32(checksum.adler_sums_cpu(rows), n)
        assert got.tolist() == [zlib.adler32(r.tobytes()) for r in rows]


@requires_gpu
@pytest.mark.gpu
def test_gpu_adler_sums_equal_their_twin():
    import cupy as cp

    from pipeline.kernels import checksum

    rng = np.random.default_rng(4)
    for n, step, count in ((1, 1, 3), (1000, 1003, 5), (3 << 20, 3 << 20, 2)):  # 3 MB rows pass the in-loop modulo
        buf = rng.integers(0, 256, step * count + 7, dtype=np.uint8)
        buf[7:7 + n] = 255
        rows = np.lib.stride_tricks.as_strided(buf[7:], shape=(count, n), strides=(step, 1))
        got = checksum.adler_sums_gpu(cp.asarray(buf), 7, step, n, count).get()
        np.testing.assert_array_equal(got, checksum.adler_sums_cpu(rows))
