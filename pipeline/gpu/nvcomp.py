"""nvCOMP batch decoding on the stream lent to the task: zstd frames of one size
(:func:`_decode_frames`), or streams of any algorithm and of sizes that differ
(:func:`decode_batch`, for Blosc chunks and NetCDF4's deflate streams).

nvCOMP's pinned host memory (the tables of a batch's pointers and sizes, each batch's own) comes
from :class:`PinnedAllocation`, not from nvCOMP's default allocator, whose ``cudaFreeHost``
synchronizes the whole device: every task that freed its batches waited for the decodes of every
other task's stream, and the tasks' decodes ran one at a time (measured below).
"""

from __future__ import annotations

import functools

from .. import state
from ..errors import DecodeError
from .streams import current


@functools.cache
def _nvcomp():
    try:
        from nvidia import nvcomp
    except Exception:
        return None
    try:
        nvcomp.set_pinned_allocator(PinnedAllocation)
    except AttributeError:  # bindings without allocators: nvCOMP's own
        pass
    return nvcomp


class PinnedAllocation:
    """Pinned host memory that nvCOMP asked for (``nvcomp.set_pinned_allocator``), given back
    without synchronizing the device.

    nvCOMP's own allocator frees with ``cudaFreeHost``, which waits for all the device's work. On
    an H200, 1,460 NetCDF4 chunks inflated in batches of 36 by 3 threads, each on its stream: 3.2
    GB/s with nvCOMP's allocator, 8.8 GB/s with this one (6 threads: 5.5 and 17.4 GB/s;
    ``benchmarks/deflate_batch.py``); one thread alone, 2.9-3.0 GB/s either way. Each thread's
    free waited 45 ms, the other threads' decodes. Whole flows, where a block's batch holds
    hundreds of frames, ran no faster measurably (``benchmarks/nvcomp_allocator.py``).

    Memory asked for on a thread that holds a lent stream (:class:`pipeline.gpu.streams.Context`,
    whose stream every nvCOMP call of pipeline is bound to) comes from CuPy's pinned pool. Freed,
    it waits in the context until the context's stream has been synchronized
    (:meth:`~pipeline.gpu.streams.context.__exit__`): the work queued on that stream that read it
    has run, and only then can the pool hand it out again. Elsewhere (the GPU encoder's thread),
    it is allocated and freed as nvCOMP's own allocator does."""

    __slots__ = ("mem", "ptr", "ctx")

    def __init__(self, nbytes: int, stream=None):
        import cupy as cp

        from .streams import lent

        self.ctx = lent()
        if self.ctx is not None:
            self.mem = cp.cuda.alloc_pinned_memory(max(1, int(nbytes)))
            self.ptr = self.mem.ptr
        else:
            self.mem = None
            self.ptr = cp.cuda.runtime.hostAlloc(max(1, int(nbytes)), 0)

    def __del__(self):
        try:
            if self.ctx is not None:
                self.ctx.retired.append(self.mem)
            elif self.ptr:
                import cupy as cp

                cp.cuda.runtime.freeHost(self.ptr)
        except Exception:  # the interpreter exiting
            pass


def nvcomp_available() -> bool:
    return _nvcomp() is not None


def _stream():
    return current().stream


def _codec():
    ctx = current()
    if ctx.codec is None:
        nv = _nvcomp()
        ctx.codec = nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=ctx.stream.ptr)
    return ctx.codec


def _codec_for(algorithm: str):
    """The codec of ``algorithm`` ("Zstd", "LZ4", "Deflate") bound to this task's stream, made once
    per stream."""
    if algorithm == "Zstd":
        return _codec()
    ctx = current()
    codec = ctx.codecs.get(algorithm)
    if codec is None:
        nv = _nvcomp()
        codec = ctx.codecs[algorithm] = nv.Codec(algorithm=algorithm, bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=ctx.stream.ptr)
    return codec


def _batch(buffer, offsets, sizes, stream):
    """nvCOMP batch of byte ranges of one device buffer."""
    nv = _nvcomp()
    offsets = [int(o) for o in offsets]
    sizes = [int(s) for s in sizes]
    try:
        return nv.as_arrays(buffer, offsets, sizes, stream.ptr)
    except TypeError:  # older bindings: a list of views
        flat = buffer.reshape(-1).view("u1")
        return nv.as_arrays([flat[o:o + s] for o, s in zip(offsets, sizes)], stream.ptr)


def _decode_frames(src, src_offsets, sizes, dst, dst_offsets, dst_size):
    """Decode zstd frames of ``src`` (device bytes) into ``dst`` at ``dst_offsets``, ``dst_size``
    bytes each, on this thread's stream."""
    if not len(src_offsets):
        return
    stream = _stream()
    srcs = _batch(src, src_offsets, sizes, stream)
    outs = _batch(dst.reshape(-1).view("u1"), dst_offsets, [dst_size] * len(dst_offsets), stream)
    try:
        _decode(_codec(), current().configs, srcs, outs, len(dst_offsets), dst_size)
    except (RuntimeError, ValueError) as e:
        raise DecodeError(str(e)) from e
    # the batches hold the device arrays of frame pointers and sizes that the decode, still
    # running, reads: they must live until the stream is synchronized
    current().keep.append((srcs, outs))


def decode_batch(algorithm: str, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes) -> None:
    """Decode raw ``algorithm`` streams of ``src`` (device bytes) into ``dst`` at ``dst_offsets``,
    ``dst_sizes[k]`` bytes each, in one nvCOMP batch on this thread's stream. As for zstd frames,
    the decode is queued with a decompression config built from the known sizes, so no size is
    read back."""
    if not len(src_offsets):
        return
    stream = _stream()
    srcs = _batch(src, src_offsets, src_sizes, stream)
    outs = _batch(dst.reshape(-1).view("u1"), dst_offsets, dst_sizes, stream)
    sizes = [int(s) for s in dst_sizes]
    key = (algorithm, len(sizes), sizes[0]) if len(set(sizes)) == 1 else (algorithm, tuple(sizes))
    try:
        _decode_sized(_codec_for(algorithm), current().configs, srcs, outs, key, sizes)
    except (RuntimeError, ValueError) as e:
        raise DecodeError(f"nvCOMP {algorithm}: {e}") from e
    current().keep.append((srcs, outs))  # read by the decode still running, as in _decode_frames


def _decode_sized(codec, configs: dict, srcs, outs, key, sizes: list[int]) -> None:
    """``codec.decode`` of streams that decode to ``sizes``, with a decompression config kept per
    codec and ``key`` where the bindings take one. A config the algorithm refuses (its
    compression settings may not admit streams this large) leaves the decode to read the sizes
    itself."""
    if state.nvcomp.configs_supported:
        if key not in configs:
            if len(configs) >= 64:
                configs.clear()
            try:
                configs[key] = codec.decompression_config(codec.compression_config(sizes))
            except (AttributeError, TypeError):  # bindings without decompression configs
                state.nvcomp.configs_supported = False
                configs[key] = None
            except (RuntimeError, ValueError):  # remembered: not asked again for these sizes
                configs[key] = None
        if configs[key] is not None:
            codec.decode(srcs, out=outs, decompression_config=configs[key])
            return
    codec.decode(srcs, out=outs)


def _decode(codec, configs: dict, srcs, outs, count: int, size: int) -> None:
    """``codec.decode`` of ``count`` frames that decode to ``size`` bytes each, without reading
    their sizes back.

    Without a decompression config, nvCOMP's decode parses the frames' headers first and
    synchronizes its stream to read the sizes back, so the calling thread waits for the block's
    copy to the device before the decode is even queued. The sizes are known here (every frame is
    one whole inner chunk): a config built from them, kept per codec and batch length, makes the
    decode asynchronous. Measured on the H200 machine, 6.1 GB in blocks of one shard: 0.30 s
    instead of 0.34 s (benchmarks/RESULTS.md)."""
    _decode_sized(codec, configs, srcs, outs, (count, size), [size] * count)


def _copy_frames(src, src_offsets, sizes, dst, dst_offsets):
    """Uncompressed frames: plain device copies."""
    flat = dst.reshape(-1).view("u1")
    for so, s, do in zip(src_offsets, sizes, dst_offsets):
        flat[int(do):int(do) + int(s)] = src[int(so):int(so) + int(s)]
