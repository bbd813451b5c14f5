"""Out of core on the GPU: the first pass's blocks held in pinned host memory for the second pass.

A two-pass op (statistics first, then an elementwise pass that uses them) on an input too large
for the device budget cannot keep its blocks on the GPU between the passes. Reading them again
from the store costs a second read and decode: on the H200 machine, about 1 s for 18.2 GB of zstd
shards (benchmarks/RESULTS.md, "Out of core"). Copied to pinned host memory as the first pass
reads them, they come back over the bus at 55 GB/s (0.33 s for the same 18.2 GB), and the copies
out run on the device -> host engine while the first pass reads on the other direction.

That is what dask-cuda's spilling does with a whole task output under ``device_memory_limit``,
but through pageable memory (6 GB/s) and only once a worker is already over its limit; here the
blocks that the second pass needs go to pinned memory as soon as they are read, and the device
keeps only the blocks being worked on.

The host memory this takes is bounded by ``pipeline.gpu.host-spill`` (bytes, or a fraction of the
host's memory; 0 turns it off). When the input is larger, the leading blocks along the first axis
are held, up to the bound, and the rest are read again from storage after the statistics, as
before: memory stays bounded either way.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import backend as B
from .. import config, state
from ..deferred import module as _deferred
from ..gpu import pinned

da = _deferred("dask.array")  # imported when the first graph is built


# An input whose values are more than this many times as wide as those of the largest array its
# graph reads (its type widened: PCA's float64 dosage from int8 genotypes, 8 times) is read again
# rather than held: copying it to pinned memory and back, and pinning that memory in a fresh
# process, cost more than computing it again from the store. On the 2-GPU H200 machine, PCA of
# 50 GB of genotypes without a cluster: holding the first pass (64 GB pinned) took 7.9-9.6 s of
# compute in six runs, and 17.6 s in the first run after the store was written (the host freed
# its page cache for the pinned buffers), against 5.9-6.7 s in three runs reading it again. A
# climate variable is held as before: read as float32, or float32 decoded from int16 (twice as
# wide).
HOLD_WIDENING = 2


def hold_budget(backend: str) -> int:
    """Bytes of host memory that two-pass ops on ``backend`` may hold between their passes:
    ``pipeline.gpu.host-spill`` on the GPU; none on the CPU, whose blocks are in host memory
    already and do not fit it (else they would be in core), nor while a distributed client is
    active: a cluster's workers keep their own memory limits and spill through dask-cuda, and a
    held block that a worker spilled to disk would come back as pageable memory."""
    from .compute import active_client

    if backend != "gpu" or active_client() is not None:
        return 0
    import psutil

    return B._bytes_or_fraction(config.get("gpu.host-spill", 0), psutil.virtual_memory().total)


def spilled_bytes(reset: bool = False) -> int:
    """Bytes held in host memory by :func:`to_host` since the last reset."""
    with state.held.lock:
        value = state.held.bytes
        if reset:
            state.held.bytes = 0
    return value


# Buffers are lent by to_host and given back by to_device, which is the one task that reads a held
# block, once its copy to the device is done; free ones are kept for the next run (release()).


def _lend(nbytes: int) -> pinned.Buffer:
    buf = pinned.take(nbytes)
    with state.held.lock:
        state.held.lent[buf.ptr] = buf
    return buf


def _give_back(block) -> None:
    with state.held.lock:
        buf = state.held.lent.pop(block.ctypes.data, None)
    if buf is not None:
        pinned.give(buf)


def release() -> int:
    """Unpin and unmap the free pinned buffers kept for reuse (:func:`pipeline.gpu.pinned.release`);
    returns their bytes."""
    return pinned.release()


def to_host(block):
    """A copy of ``block`` in host memory: pinned (:mod:`pipeline.gpu.pinned`), by one asynchronous copy on a
    stream of its own, for a CuPy block; a plain copy for a NumPy one."""
    if not B.is_cupy(block):
        out = np.array(block, copy=True)
    elif block.size == 0:
        out = np.empty(block.shape, dtype=block.dtype)
    else:
        import cupy as cp

        from ..gpu.streams import context

        block = cp.ascontiguousarray(block)
        buf = _lend(block.nbytes)
        out = buf.bytes[: block.nbytes].view(block.dtype).reshape(block.shape)
        ready = cp.cuda.Stream.null.record()  # kernels that made the block may still be running
        with context() as ctx:  # synchronizes its stream on exit
            ctx.stream.wait_event(ready)
            block.get(stream=ctx.stream, out=out)
    with state.held.lock:
        state.held.bytes += out.nbytes
    return out


def to_device(block, gpu: bool, *after):
    """``block`` (from :func:`to_host`) back on the GPU when ``gpu``; ``after``: the tasks it waits
    for, unused."""
    if not gpu:
        return block
    import cupy as cp

    from ..gpu.streams import context

    out = cp.empty(block.shape, dtype=block.dtype)
    ready = cp.cuda.Stream.null.record()  # the pool may hand out memory that queued kernels still use
    with context() as ctx:  # synchronizes its stream on exit
        ctx.stream.wait_event(ready)
        out.set(block, stream=ctx.stream)
    if block.size:
        _give_back(block)  # this task was the block's one reader
    return out


def _held_rows(data, budget: int) -> int:
    """How many leading block rows (along the first axis) of ``data`` fit ``budget`` bytes."""
    row_bytes = [n * data.nbytes // max(1, data.shape[0]) for n in data.chunks[0]]
    total, rows = 0, 0
    for b in row_bytes:
        if total + b > budget:
            break
        total += b
        rows += 1
    return rows


def held_second_pass(data, stats, budget: int):
    """The second pass's input: the leading blocks of ``data`` that fit ``budget`` bytes copied to
    host memory as the first pass computes them and copied back once ``stats`` are done; the rest
    read again (its graph bound to ``stats``)."""
    from .clone import bind

    rows = _held_rows(data, budget) if data.ndim else 0
    if rows == 0:
        return bind(data, stats)
    from dask._task_spec import Task, TaskRef
    from dask.base import tokenize
    from dask.graph_manipulation import checkpoint
    from dask.highlevelgraph import HighLevelGraph

    host = np.empty((0,) * data.ndim, dtype=data.dtype)
    held = data.map_blocks(to_host, dtype=data.dtype, meta=host, token="pipeline-to-host")
    # The copies back are a layer of plain tasks, each waiting for the statistics: as a blockwise
    # layer, dask's optimizer would fuse it with the copy out (to_device(to_host(block))), and each
    # block would stay on the device until the statistics are known.
    done = checkpoint(*stats)
    gpu = B.is_cupy(data._meta)
    name = "pipeline-to-device-" + tokenize(held, done)
    layer = {
        (name, *idx): Task((name, *idx), to_device, TaskRef((held.name, *idx)), gpu, TaskRef(done.key))
        for idx in itertools.product(*(range(n) for n in data.numblocks))
    }
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[held, done])
    back = da.Array(graph, name, data.chunks, meta=data._meta)
    if rows == data.numblocks[0]:
        return back
    cut = sum(data.chunks[0][:rows])
    return da.concatenate([back[:cut], bind(data, stats)[cut:]], axis=0)


def second_pass(data: da.Array, *stats: da.Array) -> da.Array:
    """The input of a two-pass op (statistics first, then an elementwise pass that uses them),
    for its second pass.

    In core the same array: Dask keeps its chunks in memory between the passes. Out of core
    (the input is larger than half of its backend's memory budget, ``pipeline.gpu.memory-limit``
    or ``pipeline.cpu.memory-limit``):

    - on the GPU, the first pass copies its blocks to pinned host memory as it reads them, up to
      ``pipeline.gpu.host-spill`` bytes, and the second pass copies them back once ``stats`` are
      done (:func:`held_second_pass`): a trip over the bus instead of a second read and decode;
    - blocks beyond that bound, and every block on the CPU, come from a copy of the input's graph
      that starts only once ``stats`` are done: read again from storage, streaming, instead of
      being held in memory that is not there;
    - so do all the blocks of an input whose values are more than ``HOLD_WIDENING`` times as wide
      as those its graph reads (:func:`read_itemsize`): computing it again is then cheaper than
      pinning it and copying it over the bus.
    """
    backend = B.backend_of(data)
    if not B.out_of_core(data.nbytes, backend):
        return data
    read = read_itemsize(data)
    worth = read is None or data.dtype.itemsize <= HOLD_WIDENING * read
    return held_second_pass(data, list(stats), hold_budget(backend) if worth else 0)


def read_itemsize(data) -> int | None:
    """The bytes a value of the largest array that ``data``'s graph starts from (of its array layers
    that take no other array: a store's variables as read, arrays made in memory), as dask records
    them on each layer; None where none is known."""
    graph = data.__dask_graph__()
    layers = getattr(graph, "layers", None)
    if layers is None:
        return None

    def array(name):
        annotations = layers[name].collection_annotations or {}
        return annotations if annotations.get("shape") is not None and annotations.get("dtype") is not None else None

    largest, itemsize = -1.0, None
    for name in layers:
        annotations = array(name)
        if annotations is None or any(array(dep) for dep in graph.dependencies.get(name, ()) if dep in layers):
            continue
        dtype = np.dtype(annotations["dtype"])
        size = float(np.prod(annotations["shape"])) * dtype.itemsize
        if not np.isfinite(size):  # unknown chunks
            return None
        if size > largest:
            largest, itemsize = size, dtype.itemsize
    return itemsize
