"""Process-wide state: everything pipeline keeps for the life of a process, in one place.

The rest of the package is functions, immutable values and caches of compiled kernels. What a
process holds between computations, each under its own lock:

- ``io``: the I/O threads that read chunk files into pinned memory (:mod:`pipeline.gpu.iopool`),
  started on first use.
- ``streams``: per device, the CUDA streams (each with its nvCOMP codec) free to be lent to a task,
  and the one lent to the task running on each thread (:mod:`pipeline.gpu.streams`).
- ``pinned``: pinned host buffers free for reuse; chunk files pinned where they lie in the page
  cache, least recently read first, and their bytes; why pinning failed, once it has
  (:mod:`pipeline.gpu.pinned`).
- ``held``: host buffers holding blocks between the passes of two-pass ops, and the bytes copied
  there since the last reset (:mod:`pipeline.exec.spill`).
- ``ahead``: out of core, the blocks that the host decodes ahead of their tasks, and the pinned
  bytes they hold (:mod:`pipeline.gpu.ahead`).
- ``device``: the most bytes CuPy's pool has held since the last reset, and the setting each
  device's pool is capped from (:mod:`pipeline.backend`).
- ``context``: the thread that creates the CUDA context while a command imports its libraries
  (:mod:`pipeline.gpu.context`).
- ``decode``: the decode speeds measured on the GPU and on the CPU, and the blocks being read at
  once, by which each block's files are split between them (:mod:`pipeline.gpu.split`); the blocks
  whose GPU files are being pinned or read, which the CPU's buffers wait for
  (:mod:`pipeline.gpu.reader`).
- ``nvcomp``: whether nvCOMP's bindings take decompression configs, learnt at the first decode
  (:mod:`pipeline.gpu.nvcomp`).
- ``encode``: the threads that compress the frames of the shards ``pipeline convert`` writes
  (:mod:`pipeline.sinks.convert`), and per device the thread that compresses them with nvCOMP
  (:mod:`pipeline.gpu.encode`), started on first use.
- ``opened``: arrays of strings as the source opened them, by their Dask name, and what reads
  their blocks (:mod:`pipeline.sources.reads`), so that a filter counts alleles from their chunk
  files (:mod:`pipeline.ops.genomics.qc`); held weakly, for as long as their graphs hold them.
- ``moved``: Dask arrays moved between the host and the device, by the Dask name of the move,
  each with the array it moved (:func:`pipeline.backend.to_backend`), so that an array moved back
  is the one it came from; held for as long as the move's array lives.
- ``computed``: the seconds this process has spent in :func:`pipeline.exec.compute.compute`, so
  that a run's report tells the computations made while its graph was built (a filter's
  statistics) from the building.
- ``threads``: the thread pools of the computations running on dask's threads in this process,
  oldest first, and the setting of dask's config that names the first (with the threaded
  scheduler) for as long as any runs (:func:`pipeline.exec.compute._threads_config`).
- ``cluster``: per distributed client, the workers' answers to the memory check
  (:mod:`pipeline.exec.memory`) and the schedulers that hold pipeline's plugin
  (:mod:`pipeline.exec.compute`), so that a second computation asks neither again.

Tests that need a clean slate replace a part with a fresh instance (``monkeypatch.setattr(
state.pinned, "files", OrderedDict())``).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class IOState:
    pool: object | None = None  # pipeline.gpu.iopool.IOPool
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ContextState:
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class StreamState:
    free: dict = field(default_factory=dict)  # device -> [pipeline.gpu.streams.Context]
    local: threading.local = field(default_factory=threading.local)  # .ctx: the context lent here
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class PinnedState:
    buffers: list = field(default_factory=list)  # free pipeline.gpu.pinned.Buffer
    files: OrderedDict = field(default_factory=OrderedDict)  # path -> pipeline.gpu.pinned.PinnedFile
    files_bytes: int = 0
    failure: str | None = None  # why pinning a file failed: not tried again in this process
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class HeldState:
    lent: dict = field(default_factory=dict)  # host address -> pinned Buffer holding a block
    bytes: int = 0  # copied to host memory since the last reset
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class AheadState:
    active: int = 0  # computations reading ahead now (pipeline.gpu.ahead.reading_ahead)
    sources: dict = field(default_factory=dict)  # id(source) -> pipeline.gpu.ahead._Grid
    bytes: int = 0  # pinned bytes of the blocks being decoded ahead or waiting for their tasks
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class DeviceState:
    pool_peak: int = 0  # the most bytes CuPy's pool has held (threads racing may miss one block)
    used_peak: int = 0  # the most bytes of CuPy's pool in use at once, at an allocation
    limits: dict = field(default_factory=dict)  # device -> the pipeline.gpu.memory-limit its pool is capped from


@dataclass
class DecodeState:
    rates: object | None = None  # pipeline.gpu.split.Rates: measured decode speeds
    reading: int = 0  # blocks being read at once
    lock: threading.Lock = field(default_factory=threading.Lock)
    gpu_files: int = 0  # blocks whose GPU files are being pinned or read (pipeline.gpu.reader)
    gpu_files_done: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class NvcompState:
    configs_supported: bool = True


@dataclass
class EncodeState:
    pool: object | None = None  # concurrent.futures.ThreadPoolExecutor
    gpu: dict = field(default_factory=dict)  # device -> pipeline.gpu.encode.Encoder
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class OpenedState:
    # Dask name -> pipeline.sources.reads.StoreArray. A name is a token of the store, its
    # modification time and the blocks: any step on an array gives it another name.
    strings: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)


@dataclass
class MovedState:
    # Dask name of a move (to the device or to the host) -> the Dask array it moved
    sources: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ComputedState:
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ThreadsState:
    pools: list = field(default_factory=list)
    setting: object = None  # the dask.config.set of the first pool, exited once none runs
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class ClusterState:
    answers: OrderedDict = field(default_factory=OrderedDict)  # (client, workers, plan) -> answers
    plugins: set = field(default_factory=set)  # (client id, scheduler id) holding the plugin
    lock: threading.Lock = field(default_factory=threading.Lock)


io = IOState()
context = ContextState()
streams = StreamState()
pinned = PinnedState()
held = HeldState()
ahead = AheadState()
device = DeviceState()
nvcomp = NvcompState()
decode = DecodeState()
encode = EncodeState()
opened = OpenedState()
moved = MovedState()
computed = ComputedState()
threads = ThreadsState()
cluster = ClusterState()
