"""nvCOMP batch decoding on the stream lent to the task: zstd frames of one size
(:func:`_decode_frames`), or streams of any algorithm and of sizes that differ
(:func:`decode_batch`, for Blosc chunks); large zstd frames of the blocks being read at once
in one batch of the device (:class:`Shared`)."""

from __future__ import annotations

import contextlib
import functools
import threading

from .. import state
from ..errors import DecodeError
from .streams import current


@functools.cache
def _nvcomp():
    try:
        from nvidia import nvcomp
    except Exception:
        return None
    return nvcomp


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


def _decode_frames(src, src_offsets, sizes, dst, dst_offsets, dst_size, share: bool = False):
    """Decode zstd frames of ``src`` (device bytes) into ``dst`` at ``dst_offsets``, ``dst_size``
    bytes each, on this thread's stream. With ``share``, frames large enough go in the device's
    shared batch (:func:`shares`): the function returned must then be called before the stream is
    synchronized (it makes the stream wait for the batch), error or not."""
    if not len(src_offsets):
        return
    stream = _stream()
    batches = _shared_or_none() if share and shares(len(src_offsets), dst_size) else None
    if batches is not None:
        flat_src = src.reshape(-1).view("u1")
        flat_dst = dst.reshape(-1).view("u1")
        srcs = [flat_src[int(o):int(o) + int(s)] for o, s in zip(src_offsets, sizes)]
        outs = [flat_dst[int(o):int(o) + dst_size] for o in dst_offsets]
        return functools.partial(batches.join, batches.submit(srcs, outs, dst_size, stream), stream)
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


# --- one batch a device for large frames ------------------------------------------------------------
#
# nvCOMP decodes each zstd frame on few of the GPU's units, so a batch of large frames takes about
# as long as its largest frame, however many it holds. Measured on one H200
# (benchmarks/zstd_split.py, frames of 303 MB as zarr writes them by default): 0.64 s for one frame,
# 0.84 s for 10, 0.87 s for 60 (20.9 GB/s). Batches queued on several streams at once overlap
# little (20 batches of one frame on 20 streams: 2.17 s, against 0.86 s as one batch). So the
# blocks read at once put their large frames in one batch of the device: a thread of the device
# launches the first at once, and the frames that arrive while it decodes go together in the next.

SHARE_FRAME = 32 << 20  # decoded bytes a frame from which a block's frames go in the shared batch
SHARE_FRAMES = 256  # at most this many frames a block (a block of many frames fills a batch alone)


def shares(count: int, size: int) -> bool:
    """Whether a block's ``count`` zstd frames of ``size`` decoded bytes go in the shared batch."""
    return size >= SHARE_FRAME and 0 < count <= SHARE_FRAMES


class _Request:
    def __init__(self, srcs, outs, size, ready):
        self.srcs, self.outs, self.size, self.ready = srcs, outs, size, ready
        self.done = None  # the event recorded after its batch, once launched
        self.error: BaseException | None = None


class _Batch:
    """A launched batch: what its decode reads until it is done, and its events."""

    def __init__(self, stream):
        import cupy as cp

        self.start = cp.cuda.Event()
        self.start.record(stream)
        self.keep: list | None = []
        self.largest = self.total = 0
        self.seconds = None

    def finish(self, stream) -> None:
        import cupy as cp

        self.done = cp.cuda.Event()
        self.done.record(stream)

    def wait(self) -> None:
        """Until the GPU is done with it; its time goes to the split's rates."""
        import cupy as cp

        from . import split

        self.done.synchronize()
        self.seconds = cp.cuda.get_elapsed_time(self.start, self.done) / 1e3
        split.observe_gpu(self.largest, self.total, self.seconds)
        self.keep = None


class Shared:
    """The shared batch of one device. :meth:`submit` puts a block's frames in the next batch;
    :meth:`join` waits until that batch is launched and makes the block's stream wait for it. A
    thread of its own launches each batch once the GPU is done with the one before, on a stream
    and codec of its own (nvCOMP's codecs are for one thread at a time)."""

    def __init__(self, device: int):
        self.device = device
        self.cond = threading.Condition()
        self.pending: list[_Request] = []
        self.last: _Batch | None = None  # the batch the GPU may still be decoding
        self.started = threading.Event()
        self.failed: BaseException | None = None
        threading.Thread(target=self._run, name=f"pipeline-nvcomp-{device}", daemon=True).start()
        self.started.wait()
        if self.failed is not None:
            raise self.failed

    def submit(self, srcs, outs, size: int, stream) -> _Request:
        """Decode the frames ``srcs`` (device views) into ``outs`` (``size`` bytes each) once the
        work queued on ``stream`` so far is done."""
        import cupy as cp

        req = _Request(srcs, outs, size, cp.cuda.Event())
        req.ready.record(stream)
        with self.cond:
            self.pending.append(req)
            self.cond.notify_all()
        return req

    def join(self, req: _Request, stream) -> None:
        """``stream`` waits for the decode of ``req``; DecodeError where nvCOMP refused its batch."""
        with self.cond:
            self.cond.wait_for(lambda: req.done is not None or req.error is not None)
        if isinstance(req.error, (RuntimeError, ValueError)):
            raise DecodeError(str(req.error)) from req.error
        if req.error is not None:
            raise req.error
        stream.wait_event(req.done)

    def _run(self) -> None:
        import cupy as cp

        try:
            cp.cuda.Device(self.device).use()
            nv = _nvcomp()
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.codec = nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=self.stream.ptr)
            self.configs: dict = {}
        except BaseException as e:
            self.failed = e
            return
        finally:
            self.started.set()
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.pending)
            batch = []
            try:
                if self.last is not None:  # the frames that arrive meanwhile go in the next batch
                    last, self.last = self.last, None
                    last.wait()
                with self.cond:
                    batch, self.pending = self.pending, []
                self.last = self._launch(batch)
                done = self.last.done
            except BaseException as e:
                # every request of the batch gets the error; the GPU may still read the frames of
                # the part already queued, so their buffers wait for it
                with contextlib.suppress(BaseException):
                    self.stream.synchronize()
                done, error = None, e
            with self.cond:
                for req in batch:
                    if done is not None:
                        req.done = done
                    else:
                        req.error = error
                self.cond.notify_all()

    def _launch(self, batch: list[_Request]) -> _Batch:
        for req in batch:
            self.stream.wait_event(req.ready)
        launched = _Batch(self.stream)
        for size in sorted({r.size for r in batch}):
            reqs = [r for r in batch if r.size == size]
            frames_out = [v for r in reqs for v in r.outs]
            srcs = _views([v for r in reqs for v in r.srcs], self.stream)
            outs = _views(frames_out, self.stream)
            launched.keep.append((srcs, outs, reqs))
            _decode(self.codec, self.configs, srcs, outs, len(frames_out), size)
            launched.largest = max(launched.largest, size)
            launched.total += len(frames_out) * size
        launched.finish(self.stream)
        return launched


def _views(views: list, stream):
    return _nvcomp().as_arrays(views, stream.ptr)


def _shared_or_none() -> Shared | None:
    """:func:`shared`, or None where its thread could not start (each block then decodes alone)."""
    try:
        return shared()
    except Exception:
        return None


def shared() -> Shared:
    """The shared batch of the current device, made on first use."""
    import cupy as cp

    device = cp.cuda.Device().id
    with state.nvcomp.lock:
        got = state.nvcomp.shared.get(device)
        if got is None:
            got = state.nvcomp.shared[device] = Shared(device)
        return got
