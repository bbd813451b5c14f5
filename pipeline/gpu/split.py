"""Which chunk files of a block the GPU decodes, and which the CPU's I/O threads decode, at once.

nvCOMP's speed comes from the frames it decodes together: each frame goes to few of the GPU's
units. Many small frames (a sharded store's, or chunks of one time step) decode on the GPU far
faster than the CPU can; one large frame (zarr's default: one zstd frame per chunk, often hundreds
of MB) decodes slower on the GPU than on one CPU core. Measured on the H200 machine
(benchmarks/zstd_split.py, 20 frames of 303 MB): the GPU took 0.65 s for one frame and 0.86 s for
all 20 in one batch; one CPU thread took 0.31 s a frame, 16 threads 0.70 s for the 20. Inside a
run, with all 16 I/O threads decoding, a frame took each of them 0.47-0.53 s, and a GPU batch of
two to six of them 0.84-0.88 s: the cores decode 16 in one round, and the GPU takes the four that
would otherwise make them decode a second (the starting rates are these loaded ones).

So each block's files are split by a small cost model rather than by a fixed frame size:

- on the GPU, a batch takes ``max(largest frame / gpu_frame_rate, all frames / gpu_batch_rate)``;
- on the CPU, files are decoded whole by the I/O threads this block may count on (the pool's
  threads shared by the blocks being read at once), longest first (list scheduling);
- files go one by one, largest first, to the side that would finish them sooner.

The rates start from the figures measured on the H200 machine (``pipeline.gpu.decode-rates``) and
follow what this process measures: every host decode is timed, and every GPU batch is timed by
CUDA events, each updating a moving average.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .. import config, state

ALPHA = 0.3  # weight of a new measurement in the moving averages


@dataclass
class Rates:
    """Bytes (decoded) a second."""

    gpu_frame: float  # one frame on the GPU, however many decode beside it
    gpu_batch: float  # all the frames of a large batch together, on the GPU
    cpu_frame: float  # one frame on one CPU thread


def _defaults() -> Rates:
    from dask.utils import parse_bytes

    def rate(key, default):
        # dask's lookup by key takes either spelling ("gpu_batch" from an environment variable)
        value = config.get(f"gpu.decode-rates.{key}", default)
        return float(parse_bytes(value) if isinstance(value, str) else value)

    return Rates(rate("gpu-frame", "380MB"), rate("gpu-batch", "20GB"), rate("cpu-frame", "600MB"))


def rates() -> Rates:
    """The rates this process goes by: the configured defaults, then its own measurements."""
    with state.decode.lock:
        if state.decode.rates is None:
            state.decode.rates = _defaults()
        return state.decode.rates


def _mix(old: float, new: float) -> float:
    return (1 - ALPHA) * old + ALPHA * new


def observe_cpu(nbytes: int, seconds: float) -> None:
    """One frame of ``nbytes`` decoded on one CPU thread in ``seconds``."""
    if seconds > 0 and nbytes >= 1 << 20:
        r = rates()
        with state.decode.lock:
            r.cpu_frame = _mix(r.cpu_frame, nbytes / seconds)


def observe_gpu(largest: int, total: int, seconds: float) -> None:
    """A GPU batch of ``total`` bytes, its largest frame ``largest``, decoded in ``seconds``: the
    rate of whichever bound the model says held."""
    if seconds <= 0 or total < 1 << 20:
        return
    r = rates()
    with state.decode.lock:
        if largest / r.gpu_frame >= total / r.gpu_batch:
            r.gpu_frame = _mix(r.gpu_frame, largest / seconds)
        else:
            r.gpu_batch = _mix(r.gpu_batch, total / seconds)


def gpu_seconds(frames: list[int], r: Rates) -> float:
    """Seconds for one nvCOMP batch of frames of these decoded sizes."""
    if not frames:
        return 0.0
    return max(max(frames) / r.gpu_frame, sum(frames) / r.gpu_batch)


def plan(files: list[list[int]], threads: int, r: Rates | None = None) -> list[bool]:
    """For each file (the decoded sizes of its frames; empty for a file absent or already placed
    on the GPU), True where the CPU decodes it. ``threads``: the CPU threads this block may use."""
    r = r or rates()
    host = [False] * len(files)
    if threads < 1:
        return host
    order = sorted((k for k, f in enumerate(files) if f), key=lambda k: -sum(files[k]))
    on_gpu: list[int] = []
    lanes = [0.0] * threads  # when each CPU thread is free (a heap)
    for k in order:
        with_gpu = gpu_seconds(on_gpu + files[k], r)
        cpu_done = lanes[0] + sum(files[k]) / r.cpu_frame
        # the side that finishes everything given so far sooner takes the file
        if max(cpu_done, gpu_seconds(on_gpu, r), max(lanes)) < max(with_gpu, max(lanes)):
            heapq.heapreplace(lanes, cpu_done)
            host[k] = True
        else:
            on_gpu.extend(files[k])
    return host


class reading:
    """Counts the blocks being read at once, so that each plans with its share of the I/O
    threads: ``with reading() as n`` gives the blocks being read, this one included."""

    def __enter__(self) -> int:
        with state.decode.lock:
            state.decode.reading += 1
            return state.decode.reading

    def __exit__(self, *exc):
        with state.decode.lock:
            state.decode.reading -= 1
