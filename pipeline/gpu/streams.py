"""CUDA streams lent to one task at a time, each with the nvCOMP codec bound to it."""

from __future__ import annotations

from .. import state


class Context:
    """A CUDA stream and the nvCOMP codec bound to it, with the objects that in-flight work on the
    stream still reads. Contexts are pooled for the life of the process and lent to one task at a
    time: tied to threads instead, they would be destroyed when Dask retires its worker threads,
    and nvCOMP's codec does not survive destruction on a thread that is being torn down (seen as a
    crash when a threads scheduler shut down)."""

    def __init__(self):
        import cupy as cp

        self.device = cp.cuda.Device().id
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.codec = None
        self.codecs = {}  # codecs of other algorithms (LZ4, Deflate for Blosc chunks), by name
        self.configs = {}  # decompression configs of the codec, by batch length and frame size
        self.keep = []
        # pinned memory nvCOMP freed (pipeline.gpu.nvcomp.PinnedAllocation): back to CuPy's pool
        # once this stream has been synchronized
        self.retired = []


class context:
    """Lend this thread a pooled :class:`Context` of the current device for the ``with`` block;
    the stream is synchronized before the context goes back."""

    def __enter__(self) -> Context:
        import cupy as cp

        device = cp.cuda.Device().id
        with state.streams.lock:
            pool = state.streams.free.setdefault(device, [])
            ctx = pool.pop() if pool else None
        self.ctx = ctx or Context()
        self.outer = getattr(state.streams.local, "ctx", None)
        state.streams.local.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        try:
            self.ctx.stream.synchronize()
        finally:
            self.ctx.keep.clear()
            # what nvCOMP freed, the batches just cleared among it, read by work of this stream only
            self.ctx.retired.clear()
            state.streams.local.ctx = self.outer
            with state.streams.lock:
                state.streams.free.setdefault(self.ctx.device, []).append(self.ctx)


def current() -> Context:
    """The context lent to the task running on this thread."""
    return state.streams.local.ctx


def lent() -> Context | None:
    """The context lent to this thread, or None."""
    return getattr(state.streams.local, "ctx", None)


def copy_stream():
    """A CUDA stream of this thread and the current device for plain copies (an I/O thread's copy
    of what it decoded), made once. Not a pooled :class:`Context`: those carry nvCOMP codecs, whose
    scratch for large frames is large, and a context lent to an I/O thread makes a task thread
    build another (seen as the GPU running out of memory)."""
    import cupy as cp

    device = cp.cuda.Device().id
    streams = state.streams.local.__dict__.setdefault("copy_streams", {})
    if device not in streams:
        streams[device] = cp.cuda.Stream(non_blocking=True)
    return streams[device]
