"""zstd frames compressed by nvCOMP, the frames of many blocks in one batch (``pipeline convert``).

nvCOMP's zstd encoder gives each frame few of the GPU's units, so a call takes about as long for
32 frames as for 511, and it pays only with thousands of frames at once. Measured on one H200
(``benchmarks/nvcomp_encode.py``, 593 KB frames of a rounded float32 field, frames on the
device): 32 frames 0.26 GB/s, 511 (one 303 MB block) 3.4 GB/s, 2044 9.5 GB/s, 4088 8.9 GB/s; the
execution policy changes nothing. One block's frames alone cannot keep up with the CPU's cores,
so the tasks that write shards each copy their block to the device and hand its frames to one
thread per device, which encodes in one call whatever has gathered while its last call ran, up to
:data:`BATCH` bytes. The frames are standard zstd (any zstd reader, numcodecs included, decodes
them; tested against numcodecs) at a ratio about a tenth below zstd level 2 on the CPU.

Each task copies its block to the device through a pinned buffer of :mod:`pipeline.gpu.pinned`
(:func:`_to_device`), and its frames back, each by its own copy, packed into another, which the
caller writes to the shard file and hands back.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .. import state
from ..errors import EncodeError
from . import pinned
from .nvcomp import _nvcomp
from .streams import context

BATCH = 1_250_000_000  # bytes of frames per nvCOMP call at most: 2044 x 593 KB reached 9.5 GB/s
IN_FLIGHT = 4 * BATCH  # bytes of blocks on the device, waiting or being encoded, at most
SLOT_ALIGN = 256  # each frame's room in the batch's output buffer starts at a multiple of this
ALIGN = 16  # the most any nvCOMP format asks of a compression buffer's address (its documentation)


def accepts(size: int) -> bool:
    """Whether frames of ``size`` bytes laid end to end in a block start where nvCOMP's encoder
    requires (inner chunks of whole rows of 4-byte values usually do; others go to the CPU)."""
    return size > 0 and size % ALIGN == 0


class _Job:
    __slots__ = ("views", "nbytes", "done", "out", "slots", "sizes", "error")

    def __init__(self, views: list, nbytes: int):
        self.views, self.nbytes = views, nbytes
        self.done = threading.Event()
        self.out = self.slots = self.sizes = self.error = None


class Encoder:
    """The thread of one device that encodes the frames tasks hand it, in batches."""

    def __init__(self, device: int):
        self.device = device
        self.cond = threading.Condition()
        self.queue: deque[_Job] = deque()
        self.in_flight = 0  # bytes of blocks tasks hold on the device for this encoder
        self.bounds: dict[int, int] = {}  # frame size -> the most bytes nvCOMP may write for it
        threading.Thread(target=self._run, name=f"pipeline-gpu-encode-{device}", daemon=True).start()

    # --- the tasks' side

    def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more of blocks may be held on the device (one block always may)."""
        with self.cond:
            self.cond.wait_for(lambda: self.in_flight == 0 or self.in_flight + nbytes <= IN_FLIGHT)
            self.in_flight += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self.cond:
            self.in_flight -= nbytes
            self.cond.notify_all()

    def encode(self, views: list) -> _Job:
        """Encode ``views`` (device byte arrays) in the next batch; return the finished job:
        ``out`` the batch's output buffer, each frame ``sizes[k]`` bytes at ``slots[k]``."""
        job = _Job(views, sum(int(v.size) for v in views))
        with self.cond:
            self.queue.append(job)
            self.cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job

    # --- the encoding thread

    def _run(self) -> None:
        import cupy as cp

        with cp.cuda.Device(self.device):
            nv = _nvcomp()
            try:
                stream = cp.cuda.Stream(non_blocking=True)
                codec = nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW, cuda_stream=stream.ptr)
                broken = None
            except Exception as e:  # no codec: every job hears why, none waits forever
                broken = e
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.queue)
                    batch, nbytes = [], 0
                    while self.queue and (not batch or nbytes + self.queue[0].nbytes <= BATCH):
                        job = self.queue.popleft()
                        batch.append(job)
                        nbytes += job.nbytes
                try:
                    if broken is not None:
                        raise broken
                    self._encode(cp, nv, codec, stream, batch)
                except Exception as e:  # every task of the batch hears of it
                    for job in batch:
                        job.error = EncodeError(f"nvCOMP zstd encode: {type(e).__name__}: {e}")
                for job in batch:
                    job.done.set()

    def _bound(self, cp, nv, codec, size: int) -> int:
        """The room a frame of ``size`` bytes gets in the output: nvCOMP's bound, and at least an
        eighth more than the frame (frames of a few hundred bytes have needed more than nvCOMP's
        bound, and more than zstd's)."""
        if size not in self.bounds:
            probe = cp.empty(size, dtype=np.uint8)
            bound = max(int(codec.get_max_comp_buffer_size(nv.as_array(probe))), size + size // 8 + 1024)
            self.bounds[size] = -(-bound // SLOT_ALIGN) * SLOT_ALIGN
        return self.bounds[size]

    def _encode(self, cp, nv, codec, stream, batch: list[_Job]) -> None:
        views = [v for job in batch for v in job.views]
        rooms = [self._bound(cp, nv, codec, int(v.size)) for v in views]
        slots = np.concatenate([[0], np.cumsum(rooms)[:-1]]).astype(np.int64)
        out = cp.empty(int(slots[-1]) + rooms[-1], dtype=np.uint8)
        srcs = nv.as_arrays(views, stream.ptr)
        outs = nv.as_arrays(out, [int(s) for s in slots], rooms, stream.ptr)
        done = codec.encode(srcs, out=outs)
        stream.synchronize()  # CuPy waits without the GIL; reading the sizes then waits for nothing
        sizes = np.asarray(done.buffer_sizes, dtype=np.int64)
        at = 0
        for job in batch:
            n = len(job.views)
            job.out, job.slots, job.sizes = out, slots[at:at + n], sizes[at:at + n]
            at += n


def encoder() -> Encoder:
    """The encoding thread of the current device, started on first use."""
    import cupy as cp

    device = cp.cuda.Device().id
    with state.encode.lock:
        enc = state.encode.gpu.get(device)
        if enc is None:
            enc = state.encode.gpu[device] = Encoder(device)
        return enc


def _to_device(cp, flat: np.ndarray, stream):
    """``flat`` (host bytes) on the device, through a pinned buffer of :mod:`pipeline.gpu.pinned`.
    Measured on one H200 (``benchmarks/nvcomp_encode.py --feed 16``), 16 threads each moving
    303 MB of NumPy memory at once: copied into pinned buffers and from there 34 GB/s in all,
    pinned where it lies (``cudaHostRegister``) 17-20 GB/s, a pageable copy 7.8 GB/s."""
    dev = cp.empty(flat.size, dtype=np.uint8)
    buf = pinned.take(flat.size)
    try:
        host = buf.bytes[:flat.size]
        np.copyto(host, flat)  # NumPy copies without the GIL
        dev.set(host, stream)
        stream.synchronize()
    finally:
        pinned.give(buf)
    return dev


def compress(flat: np.ndarray, size: int, numbers) -> tuple[list[np.ndarray], pinned.Buffer]:
    """The zstd frames of the ``size``-byte runs of ``flat`` (C-contiguous host bytes) numbered
    ``numbers``, compressed by nvCOMP: views of one pinned buffer, in order, and that buffer, to
    hand back (:func:`pipeline.gpu.pinned.give`) once they are written (None for no frames).
    Raises :class:`~pipeline.errors.EncodeError` where nvCOMP fails."""
    numbers = [int(n) for n in numbers]
    if not numbers:
        return [], None
    try:
        import cupy as cp

        enc = encoder()
    except Exception as e:  # no CuPy or no GPU here (a worker of another kind)
        raise EncodeError(f"frames not compressed on the GPU: {type(e).__name__}: {e}") from e
    enc.reserve(flat.size)
    try:
        with context() as ctx:
            stream = ctx.stream
            dev = _to_device(cp, flat, stream)
            job = enc.encode([dev[n * size:(n + 1) * size] for n in numbers])
            del dev
            # each frame straight from its room on the device to its place in one pinned buffer
            ends = np.cumsum(job.sizes)
            buf = pinned.take(int(ends[-1]))
            host = buf.bytes[:int(ends[-1])]
            base, out = host.ctypes.data, job.out.data.ptr
            for slot, end, n in zip(job.slots.tolist(), ends.tolist(), job.sizes.tolist()):
                cp.cuda.runtime.memcpyAsync(base + end - n, out + slot, n, cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
            stream.synchronize()
            job.out = None
    except EncodeError:
        raise
    except Exception as e:  # out of device memory, a failed copy: the caller compresses on the CPU
        raise EncodeError(f"frames not compressed on the GPU: {type(e).__name__}: {e}") from e
    finally:
        enc.unreserve(flat.size)
    return [host[e - n:e] for e, n in zip(ends.tolist(), job.sizes.tolist())], buf
