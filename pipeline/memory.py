"""Memory: what a computation will hold, checked against the configured budget before it starts,
and what it did hold, for the report.

The plan is deliberately simple, and errs high: each of the scheduler's threads holds at most a
few blocks at a time (its input block, its output, one temporary), and an input larger than half of
the budget is never held whole on the device, because two-pass ops hold it in pinned host memory
or read it again (:func:`pipeline.reductions.second_pass`). A plan over budget is an error that names the setting to
change, raised before any task runs, rather than an out-of-memory failure an hour in.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import dask.array as da

from . import backend as B
from . import config
from .errors import InputError

# a thread's reading task holds its block and the block's compressed bytes, the op that follows one
# output block, and partial results wait for their tree; measured under a 4 GB GPU limit, three
# blocks a thread ran out of memory
BLOCKS_PER_THREAD = 4


@dataclass(frozen=True)
class Plan:
    backend: str
    threads: int
    block_bytes: int  # the largest block of the input or the result
    input_bytes: int
    budget_bytes: int
    out_of_core: bool

    @property
    def peak_bytes(self) -> int:
        return self.threads * self.block_bytes * BLOCKS_PER_THREAD

    def as_dict(self) -> dict:
        return {**asdict(self), "peak_bytes": self.peak_bytes}


def block_target(backend: str) -> int:
    """Bytes that the blocks read from a sharded store aim for on ``backend`` (0: one shard a
    block): ``pipeline.gpu.block-size`` on the GPU, less where ``pipeline.gpu.threads`` threads of
    such blocks would not fit the device budget."""
    if backend != "gpu":
        return 0
    from dask.utils import parse_bytes

    size = config.get("gpu.block-size", None)
    if not size:
        return 0
    threads = int(config.get("gpu.threads", 8))
    return min(parse_bytes(size), int(B.memory_budget("gpu") // (threads * BLOCKS_PER_THREAD)))


def largest_block(*arrays: da.Array) -> int:
    sizes = [math.prod(max(c) if c else 1 for c in a.chunks) * a.dtype.itemsize for a in arrays if isinstance(a, da.Array)]
    return max(sizes, default=0)


def graph_block_bytes(*arrays: da.Array) -> int:
    """The largest block of any array in the graphs of ``arrays``: their inputs and intermediates
    too, as dask records them on each layer, not only the (often tiny) results. Broadcasts are
    left out: their blocks are views of a smaller array."""
    import numpy as np

    best = largest_block(*arrays)
    for a in arrays:
        for name, layer in getattr(a.__dask_graph__(), "layers", {}).items():
            if str(name).startswith("broadcast_to-"):
                continue
            ann = getattr(layer, "collection_annotations", None) or {}
            size, dtype = ann.get("chunksize"), ann.get("dtype")
            try:
                best = max(best, math.prod(size) * np.dtype(dtype).itemsize)
            except TypeError:  # a layer that is not an array's
                continue
    return best


def threads_for(backend: str, block_bytes: int = 0) -> int:
    """Threads for a computation of ``block_bytes`` blocks: the configured number
    (``pipeline.gpu.threads``, or dask's ``num_workers`` / one per core), fewer when that many
    threads would hold more than the backend's memory budget, at least one."""
    import dask
    from dask.system import CPU_COUNT

    if backend == "gpu":
        threads = int(config.get("gpu.threads", 8))
    else:
        threads = int(dask.config.get("num_workers", None) or CPU_COUNT)
    if block_bytes:
        threads = min(threads, int(B.memory_budget(backend) // (BLOCKS_PER_THREAD * block_bytes)))
    return max(1, threads)


def plan(source: da.Array, *results: da.Array, backend: str | None = None) -> Plan:
    backend = backend or B.backend_of(source)
    budget = B.memory_budget(backend)
    block = max(largest_block(source, *results), graph_block_bytes(*results))
    return Plan(
        backend=backend,
        threads=threads_for(backend, block),
        block_bytes=block,
        input_bytes=int(source.nbytes),
        budget_bytes=int(budget),
        out_of_core=source.nbytes > budget / 2,
    )


def check(p: Plan, where: str = "") -> None:
    """Raise InputError when the plan cannot fit its budget."""
    if p.peak_bytes <= p.budget_bytes:
        return
    from dask.utils import format_bytes

    setting = "pipeline.gpu.threads" if p.backend == "gpu" else "dask's num_workers"
    raise InputError(
        f"{where}the plan needs about {format_bytes(p.peak_bytes)} of {p.backend.upper()} memory "
        f"({p.threads} threads x {BLOCKS_PER_THREAD} blocks of up to {format_bytes(p.block_bytes)}) but "
        f"pipeline.{p.backend}.memory-limit allows {format_bytes(p.budget_bytes)}: raise the limit, "
        f"lower {setting}, or read smaller chunks (source.chunks)"
    )


def usage(backend: str) -> dict:
    """What this process holds now: host peak RSS, and on the GPU the bytes of CuPy's pool (now, and
    at most since :func:`pipeline.backend.device_memory_peak` was last reset)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"host_peak_rss_bytes": int(peak if sys.platform == "darwin" else peak * 1024)}
    if backend == "gpu":
        cp = B.module("gpu")
        pool = cp.get_default_memory_pool()
        out["gpu_pool_bytes"] = int(pool.total_bytes())
        out["gpu_pool_peak_bytes"] = B.device_memory_peak()
        out["gpu_pool_limit_bytes"] = int(pool.get_limit())
        from .spill import spilled_bytes

        out["host_held_bytes"] = spilled_bytes()  # copied to pinned memory between passes
    return out


def _worker_usage(dask_worker) -> dict:
    """Run on each worker: bytes held, and bytes spilled so far (distributed's SpillBuffer; dask-cuda's
    device buffers report what they hold on the device and on the host)."""
    data = dask_worker.data
    manager = getattr(dask_worker, "memory_manager", dask_worker)
    out = {"memory_limit_bytes": getattr(manager, "memory_limit", None)}
    spilled = getattr(data, "spilled_total", None)
    if spilled is not None:
        out["spilled_to_disk_bytes"] = int(getattr(spilled, "disk", 0))
    for name in ("device_buffer", "host_buffer", "disk"):
        buf = getattr(data, name, None)
        total = getattr(buf, "total_weight", None) if buf is not None else None
        if total is not None:
            out[f"{name}_bytes"] = int(getattr(total, "memory", total) if not isinstance(total, int) else total)
    return out


def cluster_usage(client) -> dict:
    """Per worker of a distributed cluster: its limit and what it spilled (best effort: the fields a
    worker's storage exposes)."""
    try:
        return client.run(_worker_usage)
    except Exception as e:  # never fail a finished run over its report
        return {"error": f"{type(e).__name__}: {e}"}
