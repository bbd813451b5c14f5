"""The chunk engine that the Zarr and HDF5 GPU readers share (pipeline.gpu.engine): a block's chunks
and their places, reads, the decode dispatched by codec and the fallback, on every machine; the
device steps on a GPU."""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest

from pipeline.errors import DecodeError, InputError
from pipeline.gpu import engine, hdf5, reader

SHAPE, CHUNK = (11, 13, 14), (4, 5, 6)
VALUES = np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE)


@pytest.mark.parametrize("region", [
    (slice(0, 11), slice(0, 13), slice(0, 14)),  # the whole array, cut by its edge on every axis
    (slice(4, 11), slice(5, 10), slice(6, 14)),  # one chunk deep on the middle axis, the edge on the others
    (slice(8, 11), slice(10, 13), slice(12, 14)),  # the corner chunk alone
])
def test_block_chunks_tile_the_block_with_their_stored_chunks(region):
    block = engine.block_chunks(region, CHUNK)
    values = VALUES[region]
    assert block.shape == values.shape
    covered = np.zeros(values.shape, dtype=np.int64)
    for coord, place in zip(block.coords, block.places):
        stored = VALUES[tuple(slice(c * n, (c + 1) * n) for c, n in zip(coord, CHUNK))]
        np.testing.assert_array_equal(values[place], stored)
        covered[place] += 1
    assert (covered == 1).all()
    # C order of the chunk grid, as both planners list their chunks
    assert block.coords == sorted(block.coords)
    assert block.first == list(block.coords[0])
    assert [f + k - 1 for f, k in zip(block.first, block.counts)] == list(block.coords[-1])


def test_aligned_blocks_fall_on_stored_chunk_boundaries():
    assert engine.aligned(((8, 3), (10, 3), (14,)), CHUNK)
    assert not engine.aligned(((6, 5), (13,), (14,)), CHUNK)
    assert reader.aligned is engine.aligned and hdf5.aligned is engine.aligned


def test_pread_into_scatters_one_read_and_refuses_a_short_one(tmp_path):
    path = tmp_path / "f"
    data = bytes(range(256)) * 4
    path.write_bytes(data)
    buf = bytearray(30)
    views = [memoryview(buf)[0:10], memoryview(buf)[10:30]]
    engine.pread_into(str(path), 100, views)
    assert bytes(buf) == data[100:130]
    with pytest.raises(OSError, match=rf"{path}: short read at 1020 \(4 of 30 bytes\)"):
        engine.pread_into(str(path), 1020, views)
    assert bytes(buf[:4]) == data[1020:]


class _Source(engine.BlockSource):
    """A block source whose device read fails with ``lay`` (an exception) or returns ``lay``."""

    def read(self, region):
        if isinstance(self.lay, Exception):
            raise self.lay
        return self.lay

    def fallback_warning(self, e):
        return f"{self.shape}: could not decode a block ({e}); read on the CPU"

    def staged(self):  # the library's read of the one block these tests ask for
        return {((0, 4), (0, 13), (0, 14)): VALUES[:4]}


@pytest.fixture
def no_device_limit(monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "use_device_memory_limit", lambda: calls.append(1))
    return calls


@pytest.mark.parametrize("error", [DecodeError("bad frame"), OSError("short read")])
def test_block_source_falls_back_to_the_staged_read_with_one_warning(no_device_limit, error, request):
    shape = (request.node.name,)  # a warning of its own for each case: the engine warns once per message
    source = _Source(error, 3, shape, np.dtype("int32"))
    region = ((0, 4), (0, 13), (0, 14))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = source[region]
        again = source[region]
    np.testing.assert_array_equal(got, VALUES[:4])
    np.testing.assert_array_equal(again, VALUES[:4])
    assert [str(w.message) for w in seen] == [f"{shape}: could not decode a block ({error}); read on the CPU"]
    assert all(w.category is RuntimeWarning for w in seen)
    assert len(no_device_limit) == 2  # the device's memory limit is in place before every read


def test_block_source_passes_other_errors_and_results_through(no_device_limit):
    with pytest.raises(InputError, match="named chunk"):
        _Source(InputError("named chunk"), 3, SHAPE, np.dtype("int32"))[()]
    out = np.ones(3)
    assert _Source(out, 1, (3,), np.dtype("float64"))[(slice(0, 3),)] is out


def test_decode_frames_dispatches_by_codec(monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "_decode_frames", lambda *a: calls.append(("zstd", a)))
    monkeypatch.setattr(engine, "decode_batch", lambda *a: calls.append(("nvcomp", a)))
    monkeypatch.setattr(engine, "_copy_frames", lambda *a: calls.append(("copy", a)))
    monkeypatch.setattr(engine.blosc, "decode_frames", lambda *a: calls.append(("blosc", a)))
    dev, dst = object(), object()
    src_off, src_size, dst_off = [0, 16], [10, 12], [0, 64]
    for codec in ("zstd", "deflate", "blosc", "none"):
        engine.decode_frames(codec, dev, src_off, src_size, dst, dst_off, 64, hosts=lambda: ["h0", "h1"], root="r")
    assert calls == [
        ("zstd", (dev, src_off, src_size, dst, dst_off, 64)),
        ("nvcomp", ("Deflate", dev, src_off, src_size, dst, dst_off, [64, 64])),
        ("blosc", ("r", ["h0", "h1"], dev, src_off, dst, dst_off, 64)),
        ("copy", (dev, src_off, src_size, dst, dst_off)),
    ]


# --- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_staged_read_moves_what_the_library_wrote():
    import cupy as cp

    def fill(host):
        host[...] = VALUES[:4, :5]

    got = engine.staged_read((4, 5, 14), np.dtype("int32"), fill)
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), VALUES[:4, :5])


@pytest.mark.gpu
def test_gpu_decode_frames_of_each_codec_into_place():
    import cupy as cp
    import numcodecs

    from pipeline.gpu.nvcomp import nvcomp_available

    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 50, 1024, dtype=np.int32).view(np.uint8) for _ in range(3)]
    nbytes = chunks[0].nbytes
    encoders = {
        "zstd": numcodecs.Zstd(level=1).encode,
        "deflate": lambda b: (lambda c: c.compress(b.tobytes()) + c.flush())(zlib.compressobj(6, zlib.DEFLATED, -15)),
        "none": lambda b: b.tobytes(),
    }
    for codec, encode in encoders.items():
        if codec != "none" and not nvcomp_available():
            continue
        frames = [encode(c) for c in chunks]
        src_off = [k * 8192 for k in range(len(frames))]  # aligned, as nvCOMP wants its inputs
        host = np.zeros(8192 * len(frames), dtype=np.uint8)
        for o, f in zip(src_off, frames):
            host[o:o + len(f)] = np.frombuffer(f, dtype=np.uint8)
        dev = cp.asarray(host)
        dst = cp.zeros(nbytes * len(frames), dtype=np.uint8)
        dst_off = [2 * nbytes, 0, nbytes]  # each frame to another place
        with engine.block_stream():
            engine.decode_frames(codec, dev, src_off, [len(f) for f in frames], dst, dst_off, nbytes)
        got = cp.asnumpy(dst)
        for c, d in zip(chunks, dst_off):
            np.testing.assert_array_equal(got[d:d + nbytes], c, err_msg=codec)


@pytest.mark.gpu
def test_gpu_dask_array_of_a_block_source(no_device_limit):
    import cupy as cp
    import dask.array as da

    class Blocks(engine.BlockSource):
        def read(self, region):
            return cp.asarray(VALUES[region])

    source = Blocks(None, 3, SHAPE, np.dtype("int32"))
    chunks = da.core.normalize_chunks((8, 5, 14), SHAPE)
    x = engine.dask_array(source, chunks, np.dtype("int32"), "v")
    assert isinstance(x._meta, cp.ndarray) and x.name.startswith("read-v-")
    np.testing.assert_array_equal(cp.asnumpy(x.compute(scheduler="sync")), VALUES)


@pytest.mark.gpu
def test_gpu_nvcomp_pinned_memory_waits_for_its_stream_and_threads_decode_at_once(monkeypatch):
    """nvCOMP's pinned memory (its batches' tables) comes from pipeline's allocator: freed, it
    waits in the lent context until that context's stream is synchronized, then goes back to
    CuPy's pool, where another batch reuses it. Eight threads decoding deflate batches at once,
    their tables reused, each gets its own chunks back."""
    import threading

    import cupy as cp

    from pipeline.gpu import nvcomp, streams

    if not nvcomp.nvcomp_available():
        pytest.skip("nvCOMP is not installed")
    with streams.context() as ctx:
        mem = nvcomp.PinnedAllocation(4096)
        assert mem.ctx is ctx and mem.ptr
        del mem
        assert len(ctx.retired) == 1  # not back in the pool while the stream may still read it
    assert ctx.retired == []
    outside = nvcomp.PinnedAllocation(64)  # no lent stream: cudaHostAlloc, freed by cudaFreeHost
    assert outside.ctx is None and outside.mem is None and outside.ptr
    del outside

    rng = np.random.default_rng(5)
    n, nbytes, threads, rounds = 12, 1 << 16, 8, 6
    chunks = [rng.integers(0, 9, nbytes // 4, dtype=np.int32).view(np.uint8) for _ in range(n * threads)]
    frames = []
    for c in chunks:
        z = zlib.compressobj(6, zlib.DEFLATED, -15)
        frames.append(z.compress(c.tobytes()) + z.flush())
    room = -(-max(len(f) for f in frames) // 16) * 16
    host = np.zeros(room * len(frames), dtype=np.uint8)
    for k, f in enumerate(frames):
        host[k * room:k * room + len(f)] = np.frombuffer(f, dtype=np.uint8)
    dev = cp.asarray(host)
    errors = []
    asked = []
    init = nvcomp.PinnedAllocation.__init__

    def counted(self, nbytes, stream=None):
        asked.append(nbytes)
        init(self, nbytes, stream)

    monkeypatch.setattr(nvcomp.PinnedAllocation, "__init__", counted)

    def work(t):
        try:
            mine = range(t * n, (t + 1) * n)
            for _ in range(rounds):
                dst = cp.zeros(n * nbytes, dtype=np.uint8)
                with engine.block_stream():
                    nvcomp.decode_batch("Deflate", dev, [k * room for k in mine], [len(frames[k]) for k in mine],
                                        dst, [i * nbytes for i in range(n)], [nbytes] * n)
                got = cp.asnumpy(dst).reshape(n, nbytes)
                for i, k in enumerate(mine):
                    np.testing.assert_array_equal(got[i], chunks[k])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    assert not errors, errors[0]
    assert asked  # nvCOMP took its pinned memory from pipeline's allocator
